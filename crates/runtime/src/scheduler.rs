//! The cooperative scheduler of the paper's section 5: a fixed set of
//! worker threads, one FIFO queue per worker, a task always queued on the
//! queue its id hashes to, idle workers scavenging the others, and a
//! timeslice after which a running task goes to the back of its queue.
//!
//! # The life of a task
//!
//! Each task has a state word. `wake` moves `IDLE` to `QUEUED` and pushes
//! the task onto its home queue; a worker pops it and moves `QUEUED` to
//! `RUNNING`. A `wake` that finds the task running marks it `NOTIFIED`, so
//! that a task that reports `Idle` just as new input arrives is queued again
//! rather than forgotten. `Yield` requeues at the back; `Done` frees the
//! slot. At most one worker runs a task at a time because only the worker
//! that won the `QUEUED -> RUNNING` exchange takes it out of its slot.

use crate::task::{Policy, Task, TaskId, TaskStatus, Timeslice};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

const IDLE: u8 = 0;
const QUEUED: u8 = 1;
const RUNNING: u8 = 2;
const NOTIFIED: u8 = 3;
const FREE: u8 = 4;
/// Taken by [`Scheduler::reserve`], not started yet: wakes are ignored.
const RESERVED: u8 = 5;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Worker threads; by default one per core.
    pub workers: usize,
    pub policy: Policy,
    /// The most tasks alive at once; their table is allocated up front.
    pub capacity: usize,
    /// Pin worker `i` to core `i`.
    pub pin: bool,
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            policy: Policy::default(),
            capacity: 4096,
            pin: true,
        }
    }
}

/// The task table is full.
#[derive(Debug, thiserror::Error)]
#[error("the scheduler already holds its capacity of {capacity} tasks")]
pub struct Full {
    pub capacity: usize,
}

struct Slot {
    state: AtomicU8,
    task: Mutex<Option<Box<dyn Task>>>,
}

struct Shared {
    policy: Policy,
    slots: Vec<Slot>,
    free: Mutex<Vec<u32>>,
    queues: Vec<Mutex<VecDeque<u32>>>,
    /// Tasks alive (spawned and not done).
    live: AtomicUsize,
    sleep: Mutex<usize>,
    wakeup: Condvar,
    stop: AtomicBool,
    /// Signalled when `live` drops to zero.
    all_done: Condvar,
}

impl Shared {
    fn home(&self, id: u32) -> usize {
        // Fibonacci hashing spreads consecutive ids over the queues.
        (id.wrapping_mul(0x9E37_79B9) as usize >> 8) % self.queues.len()
    }

    fn enqueue(&self, id: u32) {
        self.queues[self.home(id)]
            .lock()
            .expect("queue lock")
            .push_back(id);
        if *self.sleep.lock().expect("sleep lock") > 0 {
            self.wakeup.notify_one();
        }
    }

    fn wake(&self, id: u32) {
        let state = &self.slots[id as usize].state;
        let mut s = state.load(Ordering::Acquire);
        loop {
            let next = match s {
                IDLE => QUEUED,
                RUNNING => NOTIFIED,
                _ => return,
            };
            match state.compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if next == QUEUED {
                        self.enqueue(id);
                    }
                    return;
                }
                Err(actual) => s = actual,
            }
        }
    }

    /// The next task for worker `me`: its own queue first, then the others'.
    fn next(&self, me: usize) -> Option<u32> {
        if let Some(id) = self.queues[me].lock().expect("queue lock").pop_front() {
            return Some(id);
        }
        let n = self.queues.len();
        (1..n).find_map(|k| {
            self.queues[(me + k) % n]
                .lock()
                .expect("queue lock")
                .pop_front()
        })
    }

    fn run_one(&self, id: u32) {
        let slot = &self.slots[id as usize];
        if slot
            .state
            .compare_exchange(QUEUED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let mut guard = slot.task.lock().expect("task lock");
        let Some(task) = guard.as_mut() else {
            return;
        };
        let mut slice = Timeslice::start(self.policy);
        match task.run(&mut slice) {
            TaskStatus::Done => {
                *guard = None;
                drop(guard);
                slot.state.store(FREE, Ordering::Release);
                self.free.lock().expect("free lock").push(id);
                if self.live.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let _g = self.sleep.lock().expect("sleep lock");
                    self.all_done.notify_all();
                }
            }
            TaskStatus::Yield => {
                drop(guard);
                slot.state.store(QUEUED, Ordering::Release);
                self.enqueue(id);
            }
            TaskStatus::Idle => {
                drop(guard);
                if slot
                    .state
                    .compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    // Woken while running: its new input must not wait.
                    slot.state.store(QUEUED, Ordering::Release);
                    self.enqueue(id);
                }
            }
        }
    }

    fn worker(&self, me: usize) {
        while !self.stop.load(Ordering::Acquire) {
            if let Some(id) = self.next(me) {
                self.run_one(id);
                continue;
            }
            let mut sleepers = self.sleep.lock().expect("sleep lock");
            *sleepers += 1;
            // A short timeout covers a push that raced with going to sleep.
            let (g, _) = self
                .wakeup
                .wait_timeout(sleepers, Duration::from_millis(1))
                .expect("sleep lock");
            sleepers = g;
            *sleepers -= 1;
        }
    }
}

/// Wakes tasks from anywhere: other tasks, I/O threads, timers.
#[derive(Clone)]
pub struct Waker {
    shared: Arc<Shared>,
}

impl Waker {
    pub fn wake(&self, id: TaskId) {
        self.shared.wake(id.0);
    }
}

pub struct Scheduler {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Scheduler {
    pub fn start(config: SchedulerConfig) -> Scheduler {
        let workers = config.workers.max(1);
        let capacity = config.capacity.max(1);
        let shared = Arc::new(Shared {
            policy: config.policy,
            slots: (0..capacity)
                .map(|_| Slot {
                    state: AtomicU8::new(FREE),
                    task: Mutex::new(None),
                })
                .collect(),
            free: Mutex::new((0..capacity as u32).rev().collect()),
            queues: (0..workers)
                .map(|_| Mutex::new(VecDeque::with_capacity(capacity)))
                .collect(),
            live: AtomicUsize::new(0),
            sleep: Mutex::new(0),
            wakeup: Condvar::new(),
            stop: AtomicBool::new(false),
            all_done: Condvar::new(),
        });
        let cores = if config.pin {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let threads = (0..workers)
            .map(|i| {
                let shared = shared.clone();
                let core = cores.get(i % cores.len().max(1)).copied();
                std::thread::Builder::new()
                    .name(format!("flick-worker-{i}"))
                    .spawn(move || {
                        if let Some(c) = core {
                            core_affinity::set_for_current(c);
                        }
                        shared.worker(i);
                    })
                    .expect("spawn a worker thread")
            })
            .collect();
        Scheduler { shared, threads }
    }

    pub fn workers(&self) -> usize {
        self.threads.len()
    }

    /// Adds a task and queues it to run once.
    pub fn spawn(&self, task: Box<dyn Task>) -> Result<TaskId, Full> {
        let id = self.reserve()?;
        self.start_task(id, task);
        Ok(id)
    }

    /// Takes a task id before the task exists, so that the channels of a
    /// graph can name both their ends before any of its tasks runs.
    pub fn reserve(&self) -> Result<TaskId, Full> {
        let id = self
            .shared
            .free
            .lock()
            .expect("free lock")
            .pop()
            .ok_or(Full {
                capacity: self.shared.slots.len(),
            })?;
        self.shared.slots[id as usize]
            .state
            .store(RESERVED, Ordering::Release);
        Ok(TaskId(id))
    }

    /// Like [`Scheduler::reserve`], for a task that runs from `worker`'s
    /// queue: tasks that work together (an instance and the backend
    /// connections it uses) share a worker and its cache.
    pub fn reserve_on(&self, worker: usize) -> Result<TaskId, Full> {
        let worker = worker % self.shared.queues.len();
        let mut free = self.shared.free.lock().expect("free lock");
        // Ids spread evenly over the queues, so one is found near the end.
        let at = free
            .iter()
            .rposition(|id| self.shared.home(*id) == worker)
            .ok_or(Full {
                capacity: self.shared.slots.len(),
            })?;
        let id = free.swap_remove(at);
        drop(free);
        self.shared.slots[id as usize]
            .state
            .store(RESERVED, Ordering::Release);
        Ok(TaskId(id))
    }

    /// The worker whose queue task `id` runs from.
    pub fn home_of(&self, id: TaskId) -> usize {
        self.shared.home(id.0)
    }

    /// Starts a task under an id from [`Scheduler::reserve`].
    pub fn start_task(&self, id: TaskId, task: Box<dyn Task>) {
        let slot = &self.shared.slots[id.0 as usize];
        assert_eq!(
            slot.state.load(Ordering::Acquire),
            RESERVED,
            "start a reserved id"
        );
        *slot.task.lock().expect("task lock") = Some(task);
        self.shared.live.fetch_add(1, Ordering::AcqRel);
        slot.state.store(IDLE, Ordering::Release);
        self.shared.wake(id.0);
    }

    pub fn waker(&self) -> Waker {
        Waker {
            shared: self.shared.clone(),
        }
    }

    /// Tasks alive now.
    pub fn live(&self) -> usize {
        self.shared.live.load(Ordering::Acquire)
    }

    /// Tasks waiting in each worker's queue now, in worker order. Each
    /// queue is locked only long enough to read its length.
    pub fn queue_lengths(&self) -> Vec<usize> {
        self.shared
            .queues
            .iter()
            .map(|q| q.lock().map_or(0, |q| q.len()))
            .collect()
    }

    /// Blocks until every task spawned so far is done, or `timeout` passes;
    /// `true` if all are done.
    pub fn wait_all_done(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut g = self.shared.sleep.lock().expect("sleep lock");
        while self.shared.live.load(Ordering::Acquire) > 0 {
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            g = self
                .shared
                .all_done
                .wait_timeout(g, (deadline - now).min(Duration::from_millis(10)))
                .expect("sleep lock")
                .0;
        }
        true
    }

    /// Stops the workers after their current task.
    pub fn shutdown(mut self) {
        self.stop_workers();
    }

    fn stop_workers(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wakeup.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop_workers();
    }
}
