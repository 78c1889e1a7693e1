//! The scheduler's task state word (`IDLE`, `QUEUED`, `RUNNING`,
//! `NOTIFIED`), its queues and the wake-up path, and a group's reference
//! count (its handle and its tasks), model-checked with loom
//! over every interleaving of the threads below (bounded by
//! `LOOM_MAX_PREEMPTIONS`, 3 unless set). Threads stand in for workers:
//! `Scheduler::model` has none, and a model's thread takes a worker's turn
//! with `run_next` (the real scheduler's `next` and `run_one`).
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p flick-runtime --release --test loom_scheduler`.
#![cfg(loom)]

use flick_runtime::{Scheduler, Task, TaskId, TaskStatus, Timeslice};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// What a probe task saw: input is counted before each wake, and each run
/// records how much input it saw, so a run after the last wake sees all.
#[derive(Clone)]
struct Probe {
    input: Arc<AtomicUsize>,
    seen: Arc<AtomicUsize>,
    runs: Arc<AtomicUsize>,
    running: Arc<AtomicBool>,
}

impl Probe {
    fn new() -> Probe {
        Probe {
            input: Arc::new(AtomicUsize::new(0)),
            seen: Arc::new(AtomicUsize::new(0)),
            runs: Arc::new(AtomicUsize::new(0)),
            running: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A task that reports `first` on its first run and `Idle` after.
    fn task(&self, first: TaskStatus) -> Box<dyn Task> {
        let probe = self.clone();
        Box::new(move |_: &mut Timeslice| {
            assert!(
                !probe.running.swap(true, Ordering::AcqRel),
                "a task ran on two workers at once"
            );
            let run = probe.runs.fetch_add(1, Ordering::AcqRel);
            probe
                .seen
                .store(probe.input.load(Ordering::Acquire), Ordering::Release);
            probe.running.store(false, Ordering::Release);
            if run == 0 {
                first
            } else {
                TaskStatus::Idle
            }
        })
    }

    /// New input, then a wake, as a channel's send does.
    fn feed(&self, waker: &flick_runtime::Waker, id: TaskId) {
        self.input.fetch_add(1, Ordering::Release);
        waker.wake(id);
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::Acquire)
    }

    fn seen(&self) -> usize {
        self.seen.load(Ordering::Acquire)
    }
}

/// Runs what is queued until every queue is empty, as the workers would.
fn drain(sched: &Scheduler) {
    for _ in 0..8 {
        if !sched.run_next(0) {
            return;
        }
    }
    panic!("the queues never emptied");
}

/// Two wakers wake an idle task at once: it is queued exactly once, runs
/// exactly once more, and that run sees both inputs.
#[test]
fn two_wakes_of_an_idle_task_queue_it_once() {
    model(|| {
        let sched = Scheduler::model(1, 1);
        let probe = Probe::new();
        let id = sched.spawn(probe.task(TaskStatus::Idle)).unwrap();
        assert!(sched.run_next(0));
        assert_eq!(sched.task_state(id), "idle");

        let wakers: Vec<_> = (0..2)
            .map(|_| {
                let (probe, waker) = (probe.clone(), sched.waker());
                thread::spawn(move || probe.feed(&waker, id))
            })
            .collect();
        for w in wakers {
            w.join().unwrap();
        }

        assert_eq!(sched.queue_lengths(), vec![1], "queued once");
        assert!(sched.run_next(0));
        assert!(!sched.run_next(0), "queued twice");
        assert_eq!(probe.runs(), 2, "ran exactly once more");
        assert_eq!(probe.seen(), 2, "a wake-up was lost");
        assert_eq!(sched.task_state(id), "idle");
    });
}

/// Two wakers race a worker that runs the task meanwhile (and a second,
/// scavenging worker): however they interleave, the task never runs on two
/// workers at once, is never queued twice, and its last run comes after
/// the last wake-up.
#[test]
fn wakes_racing_two_workers_are_never_lost() {
    model(|| {
        let sched = Arc::new(Scheduler::model(2, 1));
        let probe = Probe::new();
        let id = sched.spawn(probe.task(TaskStatus::Idle)).unwrap();
        let home = sched.waker().home_of(id);

        let wakers: Vec<_> = (0..2)
            .map(|_| {
                let (probe, waker) = (probe.clone(), sched.waker());
                thread::spawn(move || probe.feed(&waker, id))
            })
            .collect();
        let other = {
            let sched = sched.clone();
            // The other worker: finds the task only by scavenging.
            thread::spawn(move || {
                sched.run_next(1 - home);
            })
        };
        sched.run_next(home);
        for w in wakers {
            w.join().unwrap();
        }
        other.join().unwrap();
        assert!(
            sched.queue_lengths().iter().sum::<usize>() <= 1,
            "queued twice"
        );
        drain(&sched);

        assert_eq!(probe.seen(), 2, "a wake-up was lost");
        assert!((1..=3).contains(&probe.runs()), "{} runs", probe.runs());
        assert_eq!(sched.task_state(id), "idle");
    });
}

/// A wake-up while the task runs (`RUNNING` -> `NOTIFIED`) queues it again
/// when it returns, whether it returns `Idle` or `Yield`; one that comes as
/// it returns `Done` is ignored, and its slot is freed once.
fn wake_during_a_run(first: TaskStatus) {
    model(move || {
        let sched = Scheduler::model(1, 1);
        let probe = Probe::new();
        let id = sched.spawn(probe.task(first)).unwrap();

        let waker = {
            let (probe, waker) = (probe.clone(), sched.waker());
            thread::spawn(move || probe.feed(&waker, id))
        };
        assert!(sched.run_next(0));
        waker.join().unwrap();
        drain(&sched);

        if first == TaskStatus::Done {
            assert_eq!(probe.runs(), 1);
            assert_eq!(sched.task_state(id), "free");
            assert_eq!(sched.live(), 0);
            // The freed slot is taken again, once.
            let again = sched.spawn(probe.task(TaskStatus::Done)).unwrap();
            assert_eq!(again, id);
            assert!(sched.spawn(probe.task(TaskStatus::Done)).is_err());
            drain(&sched);
        } else {
            assert_eq!(probe.seen(), 1, "a wake-up during a run was lost");
            assert!((1..=3).contains(&probe.runs()), "{} runs", probe.runs());
            assert_eq!(sched.task_state(id), "idle");
            assert_eq!(sched.live(), 1);
        }
    });
}

#[test]
fn a_wake_during_a_run_that_goes_idle_runs_it_again() {
    wake_during_a_run(TaskStatus::Idle);
}

#[test]
fn a_wake_during_a_run_that_yields_runs_it_again() {
    wake_during_a_run(TaskStatus::Yield);
}

#[test]
fn a_wake_during_a_run_that_ends_is_ignored() {
    wake_during_a_run(TaskStatus::Done);
}

/// A group's handle dropped while its last task ends on a worker: the
/// group's id is freed exactly once, whichever comes last, and can be
/// taken again; the task runs from its group's queue.
#[test]
fn a_group_is_freed_once_by_its_handle_or_its_last_task() {
    model(|| {
        let sched = Arc::new(Scheduler::model(1, 1));
        let group = sched.group(2).unwrap();
        let probe = Probe::new();
        let id = sched.reserve_in(&group, None).unwrap();
        sched.start_task(id, probe.task(TaskStatus::Done));
        let dropper = thread::spawn(move || drop(group));
        assert!(sched.run_next(0));
        dropper.join().unwrap();
        assert_eq!(probe.runs(), 1);
        assert_eq!(sched.task_state(id), "free");
        assert_eq!(sched.groups(), 0, "the group outlived both");
        // Both ids (the model has two) can be taken again, and no third.
        let a = sched.group(1).unwrap();
        let b = sched.group(1).unwrap();
        assert_ne!(a.id(), b.id());
        assert!(sched.group(1).is_err(), "an id was freed twice");
    });
}

/// A task that, on its first run, feeds `probe`'s task `target` (a
/// channel's send from inside a run, so the wake goes to the hand-off
/// slot when `target`'s home is this worker) and reports `status`.
fn waking(
    probe: &Probe,
    waker: flick_runtime::Waker,
    targets: Vec<TaskId>,
    status: TaskStatus,
) -> Box<dyn Task> {
    let probe = probe.clone();
    // Dropped after the first run: a task that outlives the model holding
    // its scheduler's waker would be a reference cycle (loom: "Arc leaked").
    let mut waker = Some(waker);
    Box::new(move |_: &mut Timeslice| match waker.take() {
        Some(waker) => {
            for t in &targets {
                probe.feed(&waker, *t);
            }
            status
        }
        None => TaskStatus::Idle,
    })
}

/// Runs every queue (worker 0's and 1's) until all are empty.
fn drain_both(sched: &Scheduler) {
    for _ in 0..8 {
        if !sched.run_next(0) && !sched.run_next(1) {
            return;
        }
    }
    panic!("the queues never emptied");
}

/// A run hands task `b` off (into its worker's slot) while another thread
/// wakes `b` too, and a second worker scavenges: `b` is never queued twice
/// or run on two workers at once, and a run after both wakes sees both
/// inputs, whether the waking task goes idle or ends.
fn hand_off_racing_a_wake(first: TaskStatus) {
    model(move || {
        // Ids 0, 4 and 5 are worker 0's: six slots give two.
        let sched = Arc::new(Scheduler::model(2, 6));
        let probe = Probe::new();
        // Both on worker 0: `a`'s wake of `b` is a hand-off there.
        let b = sched.reserve_on(0).unwrap();
        let a = sched.reserve_on(0).unwrap();
        sched.start_task(b, probe.task(TaskStatus::Idle));
        assert!(sched.run_next(0));
        assert_eq!(sched.task_state(b), "idle");
        sched.start_task(a, waking(&probe, sched.waker(), vec![b], first));

        let other = {
            let (probe, waker) = (probe.clone(), sched.waker());
            thread::spawn(move || probe.feed(&waker, b))
        };
        let scavenger = {
            let sched = sched.clone();
            thread::spawn(move || {
                sched.run_next(1);
            })
        };
        sched.run_next(0);
        other.join().unwrap();
        scavenger.join().unwrap();
        assert!(
            sched.queue_lengths().iter().sum::<usize>() <= 2,
            "queued twice"
        );
        drain_both(&sched);

        assert_eq!(probe.seen(), 2, "a wake-up was lost");
        assert_eq!(sched.task_state(b), "idle");
        if first == TaskStatus::Done {
            assert_eq!(sched.task_state(a), "free");
            assert_eq!(sched.live(), 1);
        } else {
            assert_eq!(sched.task_state(a), "idle");
            assert_eq!(sched.live(), 2);
        }
    });
}

#[test]
fn a_hand_off_racing_a_wake_is_never_lost() {
    hand_off_racing_a_wake(TaskStatus::Idle);
}

#[test]
fn a_hand_off_from_a_task_that_ends_is_never_lost() {
    hand_off_racing_a_wake(TaskStatus::Done);
}

/// A run hands off `b` and then `c`: `b` is pushed out of the slot onto
/// the queue while another thread wakes it, and a second worker may
/// scavenge it from there. Both run after their wakes, once each at a
/// time, and nothing is left queued.
#[test]
fn a_task_pushed_out_of_the_slot_is_queued_once() {
    model(|| {
        // Ids 0, 4 and 5 are worker 0's.
        let sched = Arc::new(Scheduler::model(2, 6));
        let probe_b = Probe::new();
        let probe_c = Probe::new();
        let b = sched.reserve_on(0).unwrap();
        let c = sched.reserve_on(0).unwrap();
        let a = sched.reserve_on(0).unwrap();
        sched.start_task(b, probe_b.task(TaskStatus::Idle));
        sched.start_task(c, probe_c.task(TaskStatus::Idle));
        assert!(sched.run_next(0));
        assert!(sched.run_next(0));
        // `a` feeds `b`, then `c`: `c` pushes `b` out of the slot.
        let waker = sched.waker();
        let (pb, pc) = (probe_b.clone(), probe_c.clone());
        let mut first = true;
        sched.start_task(
            a,
            Box::new(move |_: &mut Timeslice| {
                if std::mem::take(&mut first) {
                    pb.feed(&waker, b);
                    pc.feed(&waker, c);
                }
                TaskStatus::Done
            }),
        );

        let other = {
            let (probe, waker) = (probe_b.clone(), sched.waker());
            thread::spawn(move || probe.feed(&waker, b))
        };
        let scavenger = {
            let sched = sched.clone();
            thread::spawn(move || {
                sched.run_next(1);
            })
        };
        sched.run_next(0);
        other.join().unwrap();
        scavenger.join().unwrap();
        drain_both(&sched);

        assert_eq!(probe_b.seen(), 2, "a wake-up of b was lost");
        assert_eq!(probe_c.seen(), 1, "the hand-off of c was lost");
        assert_eq!(sched.task_state(b), "idle");
        assert_eq!(sched.task_state(c), "idle");
        assert_eq!(sched.queue_lengths(), vec![0, 0]);
        assert_eq!(sched.live(), 2);
    });
}
