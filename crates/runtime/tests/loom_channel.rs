//! The bounded channels' protocol, model-checked with loom over every
//! interleaving (bounded by `LOOM_MAX_PREEMPTIONS`, 3 unless set): the
//! producer's waiting flag and the consumer's wake-up around a full or
//! empty queue, closing by dropping either end, and a pooled channel's
//! return when both ends are gone. The producer and consumer are real tasks
//! of a `Scheduler::model`, woken through its state word and queues; two
//! threads take the workers' turns. Under loom the channel's queue is a
//! locked stand-in for crossbeam's `ArrayQueue` (see `src/sync.rs`).
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p flick-runtime --release --test loom_channel`.
#![cfg(loom)]

use flick_runtime::{
    channel, ChannelPool, Receiver, Scheduler, Sender, Task, TaskStatus, Timeslice, TryRecvError,
    TrySendError,
};
use loom::sync::Arc;
use loom::thread;

fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// Sends `1..=n`, then ends (dropping, so closing, the sender). With
/// `ask_first`, it asks `has_room` before each send, as the platform's
/// readers do; otherwise it sends until the channel is full. Either way it
/// goes idle on a full channel, to be woken when room is made.
fn producer(tx: Sender<u32>, n: u32, ask_first: bool) -> Box<dyn Task> {
    let mut next = 1;
    Box::new(move |_: &mut Timeslice| loop {
        if next > n {
            return TaskStatus::Done;
        }
        if ask_first && !tx.has_room() {
            return TaskStatus::Idle;
        }
        match tx.try_send(next) {
            Ok(()) => next += 1,
            Err(TrySendError::Full(_)) => return TaskStatus::Idle,
            // The consumer ended early: nothing more to send.
            Err(TrySendError::Closed(_)) => return TaskStatus::Done,
        }
    })
}

/// Receives until the channel is closed and empty, checking that `1..=n`
/// arrive in order, then ends; with `take` fewer than `n`, it ends after
/// `take` values (dropping, so closing, the receiver).
fn consumer(rx: Receiver<u32>, n: u32, take: u32) -> Box<dyn Task> {
    let mut expected = 1;
    Box::new(move |_: &mut Timeslice| loop {
        if take < n && expected > take {
            return TaskStatus::Done;
        }
        match rx.try_recv() {
            Ok(v) => {
                assert_eq!(v, expected, "values out of order");
                expected += 1;
            }
            Err(TryRecvError::Empty) => return TaskStatus::Idle,
            Err(TryRecvError::Closed) => {
                assert_eq!(expected, n + 1, "a value was lost");
                return TaskStatus::Done;
            }
        }
    })
}

/// A producer and a consumer joined by a channel of `capacity`, run by two
/// workers at once, then by one until nothing is queued: both must have
/// ended, or a wake-up was lost and a task waits forever.
fn pair(capacity: usize, n: u32, take: u32, ask_first: bool) {
    model(move || {
        let sched = Arc::new(Scheduler::model(1, 2));
        let (p, c) = (sched.reserve().unwrap(), sched.reserve().unwrap());
        let (tx, rx) = channel(capacity, sched.waker());
        tx.bind(p);
        rx.bind(c);
        sched.start_task(p, producer(tx, n, ask_first));
        sched.start_task(c, consumer(rx, n, take));

        let worker = {
            let sched = sched.clone();
            thread::spawn(move || {
                for _ in 0..2 {
                    sched.run_next(0);
                }
            })
        };
        for _ in 0..2 {
            sched.run_next(0);
        }
        worker.join().unwrap();
        for _ in 0..8 {
            if !sched.run_next(0) {
                break;
            }
        }

        assert_eq!(
            sched.live(),
            0,
            "a wake-up was lost: producer {}, consumer {}",
            sched.task_state(p),
            sched.task_state(c)
        );
    });
}

/// Two values through a channel of one: the producer finds it full, and
/// the consumer's receive wakes it; the sender's drop wakes the consumer
/// to see the channel closed.
#[test]
fn a_full_channel_wakes_its_producer_and_loses_nothing() {
    pair(1, 2, 2, false);
}

/// As above, with the producer asking `has_room` before each send.
#[test]
fn a_producer_told_there_is_no_room_is_woken() {
    pair(1, 2, 2, true);
}

/// The consumer ends without receiving: dropping its receiver wakes the
/// producer waiting on the full channel, which then sees it closed.
#[test]
fn dropping_the_receiver_wakes_a_waiting_producer() {
    pair(1, 2, 0, false);
}

/// The producer ends without sending: dropping its sender wakes the
/// consumer waiting on the empty channel, which then sees it closed.
#[test]
fn dropping_the_sender_wakes_a_waiting_consumer() {
    pair(1, 0, 0, false);
}

/// The two ends of a pooled channel dropped at once, each after using it:
/// the channel goes back to its pool exactly once (a pool that may keep
/// two would show a double return), emptied (the loom `Arc` of a value
/// left in it would be reported leaked otherwise), and comes out reset.
#[test]
fn a_pooled_channel_returns_once_when_both_ends_drop() {
    model(|| {
        let sched = Scheduler::model(1, 1);
        let pool = ChannelPool::<Arc<u32>>::new(1, 0, 2, sched.waker());
        let (tx, rx) = pool.channel();
        let sender = thread::spawn(move || {
            let _ = tx.try_send(Arc::new(1));
        });
        let _ = rx.try_recv();
        drop(rx);
        sender.join().unwrap();
        assert_eq!(pool.available(), 1, "returned other than once");

        let (tx, rx) = pool.channel();
        assert_eq!(pool.available(), 0);
        assert!(!rx.is_finished(), "a reused channel came back closed");
        assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
        assert!(tx.try_send(Arc::new(2)).is_ok());
        assert_eq!(*rx.try_recv().unwrap(), 2);
    });
}
