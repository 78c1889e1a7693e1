//! Tasks: the schedulable units of a task graph, and what a task may ask
//! of the worker running it.

use std::cell::Cell;
use std::time::{Duration, Instant};

/// A task's index in the scheduler's table; stable while the task lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u32);

/// What a task reports when it gives the worker back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskStatus {
    /// Its input is drained: run it again when woken.
    Idle,
    /// It has more to do but its turn is over: back of its queue.
    Yield,
    /// It will never run again; its slot is freed.
    Done,
}

/// A unit of computation that processes a stream of inputs cooperatively:
/// it returns when its input is drained or [`Timeslice::expired`] says its
/// turn is over, never blocking.
pub trait Task: Send {
    fn run(&mut self, slice: &mut Timeslice) -> TaskStatus;
}

impl<F: FnMut(&mut Timeslice) -> TaskStatus + Send> Task for F {
    fn run(&mut self, slice: &mut Timeslice) -> TaskStatus {
        self(slice)
    }
}

/// How workers share time between tasks (the paper's section 6.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// A task runs until its input is drained or the timeslice is used up,
    /// then goes to the back of its queue. Flick's policy.
    Cooperative { timeslice: Duration },
    /// A task runs until its input is drained.
    RunToCompletion,
    /// A task handles one input item per turn.
    RoundRobin,
}

impl Policy {
    /// The default timeslice: within the paper's 10-100 microseconds.
    pub const DEFAULT_TIMESLICE: Duration = Duration::from_micros(50);
}

impl Default for Policy {
    fn default() -> Policy {
        Policy::Cooperative {
            timeslice: Policy::DEFAULT_TIMESLICE,
        }
    }
}

/// One turn of a task on a worker. A task calls [`Timeslice::expired`]
/// after each input item (and compiled code at loop back-edges).
#[derive(Debug)]
pub struct Timeslice {
    /// When the turn ends; unset until the task first asks, in a turn
    /// started without a clock reading (see [`Timeslice::start_lazy`]).
    deadline: Cell<Option<Instant>>,
    /// The turn's length, for a deadline set at the first question.
    length: Option<Duration>,
    items_left: Option<u32>,
    /// When the scheduler began the turn, where it read the clock for it.
    began: Option<Instant>,
    /// Whether the last item finished went without a clock reading.
    unread: bool,
}

impl Timeslice {
    /// A turn that began at `now`.
    pub(crate) fn start_at(policy: Policy, now: Instant) -> Timeslice {
        let mut slice = Timeslice::start_lazy(policy);
        slice.began = Some(now);
        if let Some(length) = slice.length {
            slice.deadline = Cell::new(Some(now + length));
        }
        slice
    }

    /// A turn whose clock starts when the task first asks whether it is
    /// over: a run that handles one item and goes idle (most runs of a
    /// request's hops) reads the clock once, not twice. The turn lasts at
    /// most the first item plus the timeslice.
    pub(crate) fn start_lazy(policy: Policy) -> Timeslice {
        match policy {
            Policy::Cooperative { timeslice } => Timeslice {
                deadline: Cell::new(None),
                length: Some(timeslice),
                items_left: None,
                began: None,
                unread: false,
            },
            Policy::RunToCompletion => Timeslice {
                deadline: Cell::new(None),
                length: None,
                items_left: None,
                began: None,
                unread: false,
            },
            Policy::RoundRobin => Timeslice {
                deadline: Cell::new(None),
                length: None,
                items_left: Some(1),
                began: None,
                unread: false,
            },
        }
    }

    /// A turn without limits, for running a task outside a scheduler.
    pub fn unlimited() -> Timeslice {
        Timeslice {
            deadline: Cell::new(None),
            length: None,
            items_left: None,
            began: None,
            unread: false,
        }
    }

    /// A turn that is already over, for testing code that yields.
    pub fn expired_now() -> Timeslice {
        Timeslice {
            deadline: Cell::new(None),
            length: None,
            items_left: Some(0),
            began: None,
            unread: false,
        }
    }

    /// When the scheduler began this turn, if it read the clock for it: a
    /// task that needs the time once a run takes this reading rather than
    /// a second one (a clock read costs tens of nanoseconds on a VM, and a
    /// proxied request takes several runs).
    pub fn began(&self) -> Option<Instant> {
        self.began
    }

    /// Records one finished input item; `true` when the task should yield.
    ///
    /// The clock is read after every other item, not after each: a
    /// proxied Memcached operation finished about seven items in five
    /// runs, each item's reading tens of nanoseconds on a VM. A turn
    /// overruns its timeslice by at most one item (an item's work is
    /// bounded, and the default slice is tens of items long).
    pub fn item_done(&mut self) -> bool {
        if let Some(n) = &mut self.items_left {
            *n = n.saturating_sub(1);
        }
        self.unread = !self.unread;
        if self.unread && self.items_left != Some(0) {
            return false;
        }
        self.expired()
    }

    /// Whether the task's turn is over.
    pub fn expired(&self) -> bool {
        if self.items_left == Some(0) {
            return true;
        }
        let Some(length) = self.length else {
            return false;
        };
        let now = Instant::now();
        match self.deadline.get() {
            Some(deadline) => now >= deadline,
            None => {
                self.deadline.set(Some(now + length));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_overruns_its_slice_by_at_most_one_item() {
        let zero = Policy::Cooperative {
            timeslice: Duration::ZERO,
        };
        let mut slice = Timeslice::start_at(zero, Instant::now());
        // The first item goes without a clock reading; the second reads
        // it and finds the slice used up.
        assert!(!slice.item_done());
        assert!(slice.item_done());
        // A long slice is not over after many items.
        let long = Policy::Cooperative {
            timeslice: Duration::from_secs(3600),
        };
        let mut slice = Timeslice::start_at(long, Instant::now());
        assert!((0..100).all(|_| !slice.item_done()));
    }

    #[test]
    fn round_robin_and_an_expired_turn_yield_after_their_item() {
        let mut slice = Timeslice::start_at(Policy::RoundRobin, Instant::now());
        assert!(slice.item_done());
        assert!(Timeslice::expired_now().item_done());
        let mut slice = Timeslice::start_at(Policy::RunToCompletion, Instant::now());
        assert!((0..100).all(|_| !slice.item_done()));
    }
}
