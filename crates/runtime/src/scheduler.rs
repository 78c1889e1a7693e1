//! The cooperative scheduler of the paper's section 5: a fixed set of
//! worker threads, one FIFO queue per worker, a task always queued on the
//! queue its id hashes to, idle workers scavenging the others, and a
//! timeslice after which a running task goes to the back of its queue.
//!
//! # Groups
//!
//! Every task belongs to a group (a service sharing the workers with
//! others) with a weight; tasks not given one are in the default group,
//! of weight 1. A worker's queue is a FIFO queue per group, the groups
//! served in deficit round robin (`run_queue.rs`): each run is charged to
//! its group with the time it took (at most a few timeslices: a longer run
//! lost its core to the system), so busy groups share a worker's CPU in
//! proportion to their weights. A group that comes back to work (a light
//! service's request) runs first, for one quantum, as FQ-CoDel serves new
//! flows: its task waits for the run in progress, not for every task queued
//! before it. A group with nothing runnable banks no credit. While groups
//! share the workers a busy worker also polls its epoll every timeslice,
//! not only every 32 tasks, so that such a request is seen soon. While one
//! group alone has tasks (the default one, or one service's) nothing is
//! timed, and the queue is the FIFO queue it was.
//! A worker charges its own queue; a task an idle worker scavenges runs on
//! time nobody else wanted, and is not charged.
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
//! # Hand-off between a connection's tasks
//!
//! A request crosses several tasks (a reader, compute, a writer, a backend
//! connection's), each woken by the one before. Queued at the back of its
//! worker's queue, each hop would wait for every other connection's tasks.
//! So a task woken by the task running on worker W, whose home is W, goes
//! into W's hand-off slot instead (tokio's "LIFO slot"), and W runs the
//! slot before it pops its queue: the hops of a request run back to back,
//! while the task graph stays the model. The queue stays the fallback:
//!
//! - A wake that finds the slot taken puts the earlier occupant at the
//!   back of the queue, so the slot holds the newest hop only.
//! - At most [`MAX_HANDOFFS`] runs in a row come from the slot; after them
//!   wakes go to the queue until the worker next pops it, so a chain of
//!   tasks waking each other cannot starve the queue.
//! - A task that yields, or that was woken while running by another thread
//!   (`NOTIFIED`), goes to the queue as before; so does any wake from
//!   outside a run (epoll, timers, other threads).
//! - While groups share the workers, only a task of the running task's
//!   group is handed off, and its run is charged to the group as a queued
//!   run is.
//!
//! The slot belongs to the worker's thread (a thread-local, no lock): only
//! that thread fills it, during a run, and it runs the slot before doing
//! anything else, so a task in the slot is never left there while its
//! worker polls, scavenges or sleeps. Scavenging workers cannot see the
//! slot, but the slot's task runs next anyway. The task state word does
//! not change: a task in the slot is `QUEUED`, exactly as in a queue.
//!
//! The slot is off by default: measured on the HTTP balancer, the static
//! server and the Memcached proxy at one worker it gained no throughput and
//! cost CPU per request (docs/performance.md, "Hand-off between a
//! connection's tasks"): a writer run as soon as it is woken writes each
//! response on its own, and each write wakes a peer that went back to
//! sleep, where writers taken from the queue write in bursts. It is turned
//! on with `FLICK_HANDOFF=1` when a scheduler starts, or
//! [`Scheduler::set_handoff`]; `FLICK_HANDOFF=readers` (or
//! [`Scheduler::set_handoff_skips_writers`]) hands off every task but those
//! registered as a stream's writer (`io.rs` marks them), which measured no
//! better either.
//!
//! # Sleeping
//!
//! A worker with nothing to run polls its own epoll instance (`io.rs`)
//! and then blocks in it, for at most a tick. Socket readiness and timers
//! wake it there; so does a task queued for it from another thread, which
//! writes the worker's eventfd, but only when the worker said it was going
//! to sleep. A busy worker polls its epoll between tasks without blocking.

use crate::io::IoShared;
use crate::run_queue::RunQueue;
use crate::task::{Policy, Task, TaskId, TaskStatus, Timeslice};
// loom's types under `cfg(loom)`: `tests/loom_scheduler.rs` model-checks
// the state word, the queues and the wake-up path.
use crate::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use crate::sync::{Arc, Condvar, Mutex};
use std::cell::Cell;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Tasks a busy worker runs between looks at its epoll instance.
const TASKS_PER_POLL: u32 = 32;
/// While groups share the workers (and runs are timed), a busy worker
/// also looks at its epoll once this many base quanta have passed, so a
/// light group's socket is not left unread behind 32 long runs of another
/// (an `epoll_wait` that returns at once costs about a microsecond).
const QUANTA_PER_POLL: u32 = 1;

/// Groups alive at once (each service on a platform is one), besides the
/// default group.
pub const MAX_GROUPS: usize = 4096;
/// The heaviest weight a group may have; the lightest is 1.
pub const MAX_WEIGHT: u32 = 1000;
/// The default group: tasks reserved without one.
const DEFAULT_GROUP: u32 = 0;
/// The most a run is charged, in base quanta. A cooperative task's run
/// lasts about a timeslice; one that took far longer was mostly descheduled
/// by the system (another process on the core), or ignored its timeslice.
/// Charging all of it would leave its group in debt for many turns, so a
/// light service would pay with its latency for a moment its worker lost.
const MAX_CHARGE_QUANTA: u64 = 4;
/// The most runs in a row a worker takes from its hand-off slot before it
/// pops its queue again.
const MAX_HANDOFFS: u32 = 4;

/// What a worker's thread knows of the run in progress, for the wakes that
/// run makes; the worker's hand-off slot.
struct Handoff {
    /// The scheduler whose task this thread runs now; null between runs.
    running_for: Cell<*const Shared>,
    /// The worker this thread is, while `running_for` is set.
    worker: Cell<usize>,
    /// The running task's group.
    group: Cell<u32>,
    /// The task to run next, woken by an earlier run on this worker.
    slot: Cell<Option<u32>>,
    /// Runs from the slot since the worker last took a task elsewhere.
    chain: Cell<u32>,
}

impl Handoff {
    const fn new() -> Handoff {
        Handoff {
            running_for: Cell::new(std::ptr::null()),
            worker: Cell::new(0),
            group: Cell::new(DEFAULT_GROUP),
            slot: Cell::new(None),
            chain: Cell::new(0),
        }
    }
}

#[cfg(not(loom))]
std::thread_local! {
    static HANDOFF: Handoff = const { Handoff::new() };
}
// Each model thread has its own, as each worker thread does.
#[cfg(loom)]
loom::thread_local! {
    static HANDOFF: Handoff = Handoff::new();
}

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
    /// Pin worker `i` to the `i`-th core the process may run on (off by
    /// default, as nginx's `worker_cpu_affinity`).
    pub pin: bool,
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            policy: Policy::default(),
            capacity: 4096,
            pin: false,
        }
    }
}

/// The task table is full.
#[derive(Debug, thiserror::Error)]
#[error("the scheduler already holds its capacity of {capacity} tasks")]
pub struct Full {
    pub capacity: usize,
}

/// Every group id is taken.
#[derive(Debug, thiserror::Error)]
#[error("the scheduler already has its {capacity} groups")]
pub struct GroupsFull {
    pub capacity: usize,
}

struct Slot {
    state: AtomicU8,
    /// The task's group, set when its id is reserved.
    group: AtomicU32,
    /// The task writes a socket (registered as a stream's writer): it is
    /// never handed off (see the module doc), so that writes come in bursts.
    writes: AtomicBool,
    task: Mutex<Option<Box<dyn Task>>>,
}

struct GroupSlot {
    weight: AtomicU32,
    /// Its handles and its tasks (reserved and not done); the id is free
    /// again when they are all gone.
    refs: AtomicUsize,
}

/// A run's cost, owed to its group on the queue it came from.
#[derive(Clone, Copy)]
struct Charge {
    group: u32,
    nanos: u64,
}

struct Shared {
    policy: Policy,
    /// Whether a task woken by a run on its own worker goes to the
    /// worker's hand-off slot (see the module doc); read on every such wake.
    handoff: AtomicBool,
    /// Whether socket writers go to the queue even with the slot on
    /// (`FLICK_HANDOFF=readers`).
    handoff_skips_writers: AtomicBool,
    slots: Vec<Slot>,
    free: Mutex<Vec<u32>>,
    queues: Vec<Mutex<RunQueue>>,
    /// By group id; 0 is the default group.
    groups: Vec<GroupSlot>,
    free_groups: Mutex<Vec<u32>>,
    /// Groups alive besides the default one.
    grouped: AtomicUsize,
    /// Tasks of the default group (reserved and not done).
    default_tasks: AtomicUsize,
    /// A weight-1 group's credit per turn, in nanoseconds: the timeslice.
    base_quantum: i64,
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
    fn new(config: &SchedulerConfig, groups: usize) -> (Arc<Shared>, Vec<mio::Poll>) {
        let workers = config.workers.max(1);
        let capacity = config.capacity.max(1);
        let (io, polls) = IoShared::new(workers, capacity).expect("an epoll instance per worker");
        let base = match config.policy {
            Policy::Cooperative { timeslice } => timeslice,
            _ => Policy::DEFAULT_TIMESLICE,
        };
        let shared = Arc::new(Shared {
            policy: config.policy,
            handoff: AtomicBool::new(handoff_enabled()),
            handoff_skips_writers: AtomicBool::new(handoff_skips_writers()),
            slots: (0..capacity)
                .map(|_| Slot {
                    state: AtomicU8::new(FREE),
                    group: AtomicU32::new(DEFAULT_GROUP),
                    writes: AtomicBool::new(false),
                    task: Mutex::new(None),
                })
                .collect(),
            free: Mutex::new((0..capacity as u32).rev().collect()),
            queues: (0..workers)
                .map(|_| Mutex::new(RunQueue::with_capacity(capacity)))
                .collect(),
            groups: (0..=groups)
                .map(|_| GroupSlot {
                    weight: AtomicU32::new(1),
                    refs: AtomicUsize::new(0),
                })
                .collect(),
            free_groups: Mutex::new((1..=groups as u32).rev().collect()),
            grouped: AtomicUsize::new(0),
            default_tasks: AtomicUsize::new(0),
            base_quantum: (base.as_nanos() as i64).max(1_000),
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

    /// Whether groups share the workers now, so that runs are timed and
    /// charged: two groups with tasks or handles (the default group counts
    /// while it has tasks). A lone group, default or not, runs as one FIFO
    /// queue per worker, untimed.
    fn shared_by_groups(&self) -> bool {
        match self.grouped.load(Ordering::Relaxed) {
            0 => false,
            1 => self.default_tasks.load(Ordering::Relaxed) > 0,
            _ => true,
        }
    }

    /// Group `g`'s credit per turn, in nanoseconds.
    fn quantum(&self, g: u32) -> i64 {
        let weight = self.groups[g as usize].weight.load(Ordering::Relaxed);
        weight.clamp(1, MAX_WEIGHT) as i64 * self.base_quantum
    }

    /// Makes task `id`, just `QUEUED`, runnable: into the hand-off slot of
    /// the worker whose run woke it, if it may go there, else onto its home
    /// queue.
    fn enqueue(&self, id: u32) {
        let home = self.home(id);
        // Set before the id was started; the wake that queues it follows.
        let group = self.slots[id as usize].group.load(Ordering::Relaxed);
        if self.handoff.load(Ordering::Relaxed) && self.hand_off(id, home, group) {
            return;
        }
        self.push_queue(id, home, group);
    }

    /// Puts task `id` in the hand-off slot if this thread is running a
    /// task of this scheduler on `home` (see the module doc); `false` if it
    /// may not.
    fn hand_off(&self, id: u32, home: usize, group: u32) -> bool {
        HANDOFF.with(|h| {
            if !std::ptr::eq(h.running_for.get(), self)
                || h.worker.get() != home
                || h.chain.get() >= MAX_HANDOFFS
                || (self.handoff_skips_writers.load(Ordering::Relaxed)
                    && self.slots[id as usize].writes.load(Ordering::Relaxed))
                || (h.group.get() != group && self.shared_by_groups())
            {
                return false;
            }
            if let Some(earlier) = h.slot.replace(Some(id)) {
                let group = self.slots[earlier as usize].group.load(Ordering::Relaxed);
                self.push_queue(earlier, home, group);
            }
            true
        })
    }

    fn push_queue(&self, id: u32, home: usize, group: u32) {
        let queued = {
            let mut q = self.queues[home].lock().expect("queue lock");
            q.push(id, group, |g| self.quantum(g));
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

    /// The next task from worker `me`'s own queue, after charging it with
    /// what the previous run from it owes.
    fn pop_own(&self, me: usize, owed: &mut Option<Charge>) -> Option<u32> {
        let mut q = self.queues[me].lock().expect("queue lock");
        if let Some(c) = owed.take() {
            q.charge(c.group, c.nanos);
        }
        q.pop(|g| self.quantum(g)).map(|(id, _)| id)
    }

    /// The next task for worker `me`: its own queue first (`true`), then
    /// the others'.
    fn next(&self, me: usize, owed: &mut Option<Charge>) -> Option<(u32, bool)> {
        if let Some(id) = self.pop_own(me, owed) {
            return Some((id, true));
        }
        let n = self.queues.len();
        (1..n).find_map(|k| {
            self.queues[(me + k) % n]
                .lock()
                .expect("queue lock")
                .pop(|g| self.quantum(g))
                .map(|(id, _)| (id, false))
        })
    }

    /// The task in this thread's hand-off slot, counted as a run in a row
    /// from it.
    fn take_handoff(&self) -> Option<u32> {
        HANDOFF.with(|h| {
            let id = h.slot.take()?;
            h.chain.set(h.chain.get() + 1);
            Some(id)
        })
    }

    /// Runs task `id` once on worker `me`, `handed_off` if it came from the
    /// hand-off slot; what it cost and when it ended, if runs are timed
    /// (while groups besides the default one exist).
    fn run_one(&self, id: u32, me: usize, handed_off: bool) -> Option<(Charge, Instant)> {
        let slot = &self.slots[id as usize];
        if slot
            .state
            .compare_exchange(QUEUED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return None;
        }
        let group = slot.group.load(Ordering::Relaxed);
        let mut guard = slot.task.lock().expect("task lock");
        let task = guard.as_mut()?;
        // The clock is read where a run is charged. An untimed run's
        // timeslice starts now too: one that started at the task's first
        // look at it left an HTTP request with an empty line before it
        // unanswered (`http_lb::max_body_bytes_limits_request_bodies_and_
        // empty_lines_are_skipped`).
        let start = self.shared_by_groups().then(Instant::now);
        let mut slice = Timeslice::start_at(self.policy, start.unwrap_or_else(Instant::now));
        HANDOFF.with(|h| {
            h.running_for.set(self);
            h.worker.set(me);
            h.group.set(group);
            if !handed_off {
                h.chain.set(0);
            }
        });
        let status = task.run(&mut slice);
        // Wakes from here on (a yield, a wake seen as `NOTIFIED`) are the
        // queue's.
        HANDOFF.with(|h| h.running_for.set(std::ptr::null()));
        let cost = start.map(|start| {
            let end = Instant::now();
            let nanos = end.saturating_duration_since(start).as_nanos() as u64;
            let nanos = nanos.min(MAX_CHARGE_QUANTA * self.base_quantum as u64);
            (Charge { group, nanos }, end)
        });
        match status {
            TaskStatus::Done => {
                *guard = None;
                drop(guard);
                // An exchange for loom's sake: its model lets a plain store
                // fall between the read and the write of a wake's exchange
                // (tokio-rs/loom#254), leaving a freed slot `NOTIFIED`.
                slot.state.swap(FREE, Ordering::AcqRel);
                self.free.lock().expect("free lock").push(id);
                self.release_group(group);
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
        cost
    }

    /// Adds a run's cost to what worker `me` owes its queue: merged with
    /// the debt of the same group (a chain of hand-offs), or, for another
    /// group, the earlier debt paid at once.
    fn owe(&self, me: usize, owed: &mut Option<Charge>, charge: Charge) {
        match owed {
            Some(o) if o.group == charge.group => o.nanos += charge.nanos,
            Some(o) => {
                let earlier = *o;
                self.queues[me]
                    .lock()
                    .expect("queue lock")
                    .charge(earlier.group, earlier.nanos);
                *owed = Some(charge);
            }
            None => *owed = Some(charge),
        }
    }

    /// Drops a reference to group `g` (a handle, or a task that ended);
    /// the last frees its id.
    fn release_group(&self, g: u32) {
        if g == DEFAULT_GROUP {
            self.default_tasks.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        if self.groups[g as usize].refs.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.free_groups.lock().expect("groups lock").push(g);
            self.grouped.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Takes a group id for a new group of `weight`.
    fn new_group(&self, weight: u32) -> Result<u32, GroupsFull> {
        let g = self
            .free_groups
            .lock()
            .expect("groups lock")
            .pop()
            .ok_or(GroupsFull {
                capacity: self.groups.len() - 1,
            })?;
        let slot = &self.groups[g as usize];
        slot.weight
            .store(weight.clamp(1, MAX_WEIGHT), Ordering::Relaxed);
        slot.refs.store(1, Ordering::Release);
        // The queues may still hold an earlier group's debt under this id.
        for q in &self.queues {
            q.lock().expect("queue lock").reset(g);
        }
        self.grouped.fetch_add(1, Ordering::AcqRel);
        Ok(g)
    }

    /// Worker `me`'s loop; `waker` wakes tasks of this scheduler. (Not a
    /// method of `Arc<Self>`: loom's `Arc` cannot be a receiver.)
    fn worker(&self, waker: Waker, me: usize, mut poll: mio::Poll) {
        let mut events = mio::Events::with_capacity(256);
        let mut ran = 0;
        // What the last run from this worker's own queue cost its group,
        // charged when the queue is next locked.
        let mut owed = None;
        let poll_every = Duration::from_nanos(self.base_quantum as u64 * QUANTA_PER_POLL as u64);
        let mut polled = Instant::now();
        let mut last_end = None;
        let mut poll_due = false;
        while !self.stop.load(Ordering::Acquire) {
            // The slot first, whatever else is due: its task was woken by
            // the run just ended, and nothing else looks at the slot.
            if let Some(id) = self.take_handoff() {
                if let Some((charge, end)) = self.run_one(id, me, true) {
                    self.owe(me, &mut owed, charge);
                    last_end = Some(end);
                    poll_due = end.saturating_duration_since(polled) >= poll_every;
                }
                ran += 1;
                continue;
            }
            if ran < TASKS_PER_POLL && !poll_due {
                // (The queue's lock is let go before the task runs.)
                if let Some(id) = self.pop_own(me, &mut owed) {
                    if let Some((charge, end)) = self.run_one(id, me, false) {
                        self.owe(me, &mut owed, charge);
                        last_end = Some(end);
                        poll_due = end.saturating_duration_since(polled) >= poll_every;
                    }
                    ran += 1;
                    continue;
                }
            }
            // Between tasks, and before looking elsewhere: this worker's
            // sockets and timers, without blocking.
            ran = 0;
            poll_due = false;
            if let Some(end) = last_end.take() {
                polled = end;
            }
            self.io.fire_timers(&waker);
            if self
                .io
                .poll(&waker, &mut poll, &mut events, Duration::ZERO, None)
                > 0
            {
                continue;
            }
            if let Some((id, own)) = self.next(me, &mut owed) {
                let cost = self.run_one(id, me, false);
                if let (true, Some((charge, _))) = (own, cost) {
                    self.owe(me, &mut owed, charge);
                }
                continue;
            }
            // Timers fire before the worker says it sleeps, so that the
            // tasks they wake are queued without interrupting it; the look
            // at the queue below finds them.
            let timeout = self.io.fire_timers(&waker);
            self.io.going_to_sleep(me);
            if !self.queues[me].lock().expect("queue lock").is_empty() {
                self.io.awake(me);
                continue;
            }
            self.io
                .poll(&waker, &mut poll, &mut events, timeout, Some(me));
        }
    }
}

/// Whether the hand-off slot starts on: with `FLICK_HANDOFF=1` (off by
/// default: see the module doc); always in the loom models.
fn handoff_enabled() -> bool {
    #[cfg(loom)]
    return true;
    #[cfg(not(loom))]
    return std::env::var_os("FLICK_HANDOFF").is_some_and(|v| v == "1" || v == "readers");
}

/// Whether the slot leaves socket writers to the queue:
/// `FLICK_HANDOFF=readers`.
fn handoff_skips_writers() -> bool {
    #[cfg(loom)]
    return false;
    #[cfg(not(loom))]
    return std::env::var_os("FLICK_HANDOFF").is_some_and(|v| v == "readers");
}

/// Wakes tasks from anywhere: other tasks, I/O threads, timers.
#[derive(Clone)]
pub struct Waker {
    shared: Arc<Shared>,
}

/// A group of tasks that share the workers' time by weight with other
/// groups (see [`Scheduler::group`]).
pub struct Group {
    shared: Arc<Shared>,
    id: u32,
}

impl Group {
    /// Its number in the scheduler (never 0, the default group's).
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn weight(&self) -> u32 {
        self.shared.groups[self.id as usize]
            .weight
            .load(Ordering::Relaxed)
    }

    /// Changes its weight; each worker uses it from the group's next turn.
    pub fn set_weight(&self, weight: u32) {
        self.shared.groups[self.id as usize]
            .weight
            .store(weight.clamp(1, MAX_WEIGHT), Ordering::Relaxed);
    }

    /// The time its tasks ran from their own workers' queues, summed over
    /// the workers (runs taken by scavenging workers are not charged).
    pub fn charged(&self) -> Duration {
        let nanos: u64 = self
            .shared
            .queues
            .iter()
            .map(|q| q.lock().map_or(0, |q| q.charged(self.id)))
            .sum();
        Duration::from_nanos(nanos)
    }
}

impl Clone for Group {
    fn clone(&self) -> Group {
        self.shared.groups[self.id as usize]
            .refs
            .fetch_add(1, Ordering::AcqRel);
        Group {
            shared: self.shared.clone(),
            id: self.id,
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.shared.release_group(self.id);
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("id", &self.id)
            .field("weight", &self.weight())
            .finish()
    }
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

    /// Marks task `id` as a socket's writer, until its id is taken again.
    pub(crate) fn mark_writer(&self, id: TaskId) {
        self.shared.slots[id.0 as usize]
            .writes
            .store(true, Ordering::Relaxed);
    }
}

pub struct Scheduler {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Scheduler {
    pub fn start(config: SchedulerConfig) -> Scheduler {
        let (shared, polls) = Shared::new(&config, MAX_GROUPS);
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

    /// Adds a task of `group` and queues it to run once.
    pub fn spawn_in(&self, group: &Group, task: Box<dyn Task>) -> Result<TaskId, Full> {
        let id = self.reserve_in(group, None)?;
        self.start_task(id, task);
        Ok(id)
    }

    /// Takes a task id before the task exists, so that the channels of a
    /// graph can name both their ends before any of its tasks runs. The
    /// task is in the default group.
    pub fn reserve(&self) -> Result<TaskId, Full> {
        self.take(None, DEFAULT_GROUP)
    }

    /// Like [`Scheduler::reserve`], for a task that runs from `worker`'s
    /// queue: tasks that work together (an instance and the backend
    /// connections it uses) share a worker and its cache.
    pub fn reserve_on(&self, worker: usize) -> Result<TaskId, Full> {
        self.take(Some(worker), DEFAULT_GROUP)
    }

    /// Like [`Scheduler::reserve`] (or [`Scheduler::reserve_on`] with a
    /// worker), for a task of `group`: it shares the workers' time with
    /// other groups by the group's weight.
    pub fn reserve_in(&self, group: &Group, worker: Option<usize>) -> Result<TaskId, Full> {
        self.take(worker, group.id)
    }

    fn take(&self, worker: Option<usize>, group: u32) -> Result<TaskId, Full> {
        let full = || Full {
            capacity: self.shared.slots.len(),
        };
        let mut free = self.shared.free.lock().expect("free lock");
        let id = match worker {
            None => free.pop().ok_or_else(full)?,
            Some(worker) => {
                let worker = worker % self.shared.queues.len();
                // Ids spread evenly over the queues, so one is found near
                // the end.
                let at = free
                    .iter()
                    .rposition(|id| self.shared.home(*id) == worker)
                    .ok_or_else(full)?;
                free.swap_remove(at)
            }
        };
        drop(free);
        if group == DEFAULT_GROUP {
            self.shared.default_tasks.fetch_add(1, Ordering::Relaxed);
        } else {
            // The caller's handle keeps the group alive meanwhile.
            self.shared.groups[group as usize]
                .refs
                .fetch_add(1, Ordering::AcqRel);
        }
        let slot = &self.shared.slots[id as usize];
        slot.group.store(group, Ordering::Relaxed);
        slot.writes.store(false, Ordering::Relaxed);
        slot.state.store(RESERVED, Ordering::Release);
        Ok(TaskId(id))
    }

    /// A new group of tasks (a service's) with `weight` (1 to
    /// [`MAX_WEIGHT`]; clamped): while it has runnable tasks on a worker
    /// it gets that worker's time in proportion to its weight. Its id is
    /// free again once the handle (and its clones) and its tasks are gone.
    pub fn group(&self, weight: u32) -> Result<Group, GroupsFull> {
        let id = self.shared.new_group(weight)?;
        Ok(Group {
            shared: self.shared.clone(),
            id,
        })
    }

    /// Turns the workers' hand-off slots on or off (see the module doc);
    /// wakes from then on follow it, a task already in a slot runs there.
    pub fn set_handoff(&self, on: bool) {
        self.shared.handoff.store(on, Ordering::Relaxed);
    }

    /// Whether, with hand-off on, tasks registered as a stream's writer
    /// are left to the queue (`FLICK_HANDOFF=readers` at start).
    pub fn set_handoff_skips_writers(&self, skip: bool) {
        self.shared
            .handoff_skips_writers
            .store(skip, Ordering::Relaxed);
    }

    /// Groups alive now, besides the default one.
    pub fn groups(&self) -> usize {
        self.shared.grouped.load(Ordering::Acquire)
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
        // Few groups: each is a pair of loom's atomics.
        let (shared, _polls) = Shared::new(&config, 2);
        Scheduler {
            shared,
            threads: Vec::new(),
        }
    }

    /// A turn of worker `me`: the next task, from its own queue or
    /// scavenged, run once; `false` if every queue was empty. (Runs are
    /// not charged: the models check the protocol, not the shares.)
    pub fn run_next(&self, me: usize) -> bool {
        let Some((id, _)) = self.shared.next(me, &mut None) else {
            return false;
        };
        self.shared.run_one(id, me, false);
        // What the run handed off runs next, as on a worker.
        while let Some(id) = self.shared.take_handoff() {
            self.shared.run_one(id, me, true);
        }
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
