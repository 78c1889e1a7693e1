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
//!
//! # Sleeping
//!
//! A worker with nothing to run polls its own epoll instance (`io.rs`)
//! and then blocks in it, for at most a tick. Socket readiness and timers
//! wake it there; so does a task queued for it from another thread, which
//! writes the worker's eventfd, but only when the worker said it was going
//! to sleep. A busy worker polls its epoll between tasks without blocking.

use crate::io::IoShared;
use crate::task::{Policy, Task, TaskId, TaskStatus, Timeslice};
// loom's types under `cfg(loom)`: `tests/loom_scheduler.rs` model-checks
// the state word, the queues and the wake-up path.
use crate::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use std::collections::VecDeque;
use std::thread::JoinHandle;
use std::time::Duration;

/// Tasks a busy worker runs between looks at its epoll instance.
const TASKS_PER_POLL: u32 = 32;

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
    /// Guards `all_done`.
    sleep: Mutex<usize>,
    io: IoShared,
    stop: AtomicBool,
    /// Signalled when `live` drops to zero.
    all_done: Condvar,
}

impl Shared {
    fn new(config: &SchedulerConfig) -> (Arc<Shared>, Vec<mio::Poll>) {
        let workers = config.workers.max(1);
        let capacity = config.capacity.max(1);
        let (io, polls) = IoShared::new(workers, capacity).expect("an epoll instance per worker");
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
            io,
            stop: AtomicBool::new(false),
            all_done: Condvar::new(),
        });
        (shared, polls)
    }

    fn home(&self, id: u32) -> usize {
        // Fibonacci hashing spreads consecutive ids over the queues.
        (id.wrapping_mul(0x9E37_79B9) as usize >> 8) % self.queues.len()
    }

    fn enqueue(&self, id: u32) {
        let home = self.home(id);
        let queued = {
            let mut q = self.queues[home].lock().expect("queue lock");
            q.push_back(id);
            q.len()
        };
        if self.io.is_sleeping(home) {
            self.io.interrupt(home);
        } else if queued > 1 {
            // Work is piling up on a busy worker: a sleeping one scavenges.
            if let Some(w) = (0..self.queues.len()).find(|w| *w != home && self.io.is_sleeping(*w))
            {
                self.io.interrupt(w);
            }
        }
    }

    fn wake(&self, id: u32) {
        let state = &self.slots[id as usize].state;
        let mut s = state.load(Ordering::Acquire);
        loop {
            // A task already `QUEUED` or `NOTIFIED` is written with the
            // same value rather than left alone: the write is what makes
            // the waker's own writes (a sent value, a flag) visible to the
            // run this wake promises, which begins with the worker's
            // exchange on this word. A bare load gives no such order: loom
            // found a run that missed the input of a wake that had found
            // its task queued (tests/loom_scheduler.rs).
            let next = match s {
                IDLE => QUEUED,
                RUNNING => NOTIFIED,
                QUEUED | NOTIFIED => s,
                _ => return,
            };
            match state.compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    if s == IDLE {
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
                // An exchange for loom's sake: its model lets a plain store
                // fall between the read and the write of a wake's exchange
                // (tokio-rs/loom#254), leaving a freed slot `NOTIFIED`.
                slot.state.swap(FREE, Ordering::AcqRel);
                self.free.lock().expect("free lock").push(id);
                if self.live.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let _g = self.sleep.lock().expect("sleep lock");
                    self.all_done.notify_all();
                }
            }
            TaskStatus::Yield => {
                drop(guard);
                // An exchange, not a store: it takes in the writes of any
                // wake that marked the task `NOTIFIED` while it ran.
                slot.state.swap(QUEUED, Ordering::AcqRel);
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
                    // (An exchange, as for `Yield`, so that the writes of a
                    // wake since the failed exchange are taken in too.)
                    slot.state.swap(QUEUED, Ordering::AcqRel);
                    self.enqueue(id);
                }
            }
        }
    }

    /// Worker `me`'s loop; `waker` wakes tasks of this scheduler. (Not a
    /// method of `Arc<Self>`: loom's `Arc` cannot be a receiver.)
    fn worker(&self, waker: Waker, me: usize, mut poll: mio::Poll) {
        let mut events = mio::Events::with_capacity(256);
        let mut ran = 0;
        while !self.stop.load(Ordering::Acquire) {
            if ran < TASKS_PER_POLL {
                // (The queue's lock is let go before the task runs.)
                let own = self.queues[me].lock().expect("queue lock").pop_front();
                if let Some(id) = own {
                    self.run_one(id);
                    ran += 1;
                    continue;
                }
            }
            // Between tasks, and before looking elsewhere: this worker's
            // sockets and timers, without blocking.
            ran = 0;
            self.io.fire_timers(&waker);
            if self.io.poll(&waker, &mut poll, &mut events, Duration::ZERO) > 0 {
                continue;
            }
            if let Some(id) = self.next(me) {
                self.run_one(id);
                continue;
            }
            self.io.going_to_sleep(me);
            if !self.queues[me].lock().expect("queue lock").is_empty() {
                self.io.awake(me);
                continue;
            }
            let timeout = self.io.fire_timers(&waker);
            self.io.poll(&waker, &mut poll, &mut events, timeout);
            self.io.awake(me);
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

    /// The worker whose queue task `id` runs from.
    pub fn home_of(&self, id: TaskId) -> usize {
        self.shared.home(id.0)
    }

    pub(crate) fn io(&self) -> &IoShared {
        &self.shared.io
    }
}

pub struct Scheduler {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Scheduler {
    pub fn start(config: SchedulerConfig) -> Scheduler {
        let (shared, polls) = Shared::new(&config);
        let cores = if config.pin {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let threads = polls
            .into_iter()
            .enumerate()
            .map(|(i, poll)| {
                let shared = shared.clone();
                let core = cores.get(i % cores.len().max(1)).copied();
                std::thread::Builder::new()
                    .name(format!("flick-worker-{i}"))
                    .spawn(move || {
                        if let Some(c) = core {
                            core_affinity::set_for_current(c);
                        }
                        let waker = Waker {
                            shared: shared.clone(),
                        };
                        shared.worker(waker, i, poll);
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
        self.shared.io.interrupt_all();
        // A service freed by a task's last reference to it drops its
        // scheduler on a worker: that worker ends on its own, unjoined.
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

/// What the loom models (`tests/loom_*.rs`) drive: a scheduler without
/// worker threads (a worker sleeps in epoll, which loom cannot model), its
/// workers' turns taken by the models' own threads.
#[cfg(loom)]
#[doc(hidden)]
impl Scheduler {
    pub fn model(workers: usize, capacity: usize) -> Scheduler {
        let config = SchedulerConfig {
            workers,
            policy: Policy::RunToCompletion,
            capacity,
            pin: false,
        };
        let (shared, _polls) = Shared::new(&config);
        Scheduler {
            shared,
            threads: Vec::new(),
        }
    }

    /// A turn of worker `me`: the next task, from its own queue or
    /// scavenged, run once; `false` if every queue was empty.
    pub fn run_next(&self, me: usize) -> bool {
        let Some(id) = self.shared.next(me) else {
            return false;
        };
        self.shared.run_one(id);
        true
    }

    /// Task `id`'s state word, by name.
    pub fn task_state(&self, id: TaskId) -> &'static str {
        match self.shared.slots[id.0 as usize]
            .state
            .load(Ordering::Acquire)
        {
            IDLE => "idle",
            QUEUED => "queued",
            RUNNING => "running",
            NOTIFIED => "notified",
            FREE => "free",
            RESERVED => "reserved",
            _ => "invalid",
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop_workers();
    }
}
