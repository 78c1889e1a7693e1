//! The scheduler's contract: every task runs to its end, wake-ups are
//! never lost, policies bound a task's turn, backpressure holds.

use flick_runtime::{
    channel, Policy, Scheduler, SchedulerConfig, TaskStatus, Timeslice, TryRecvError, TrySendError,
};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn scheduler(workers: usize, policy: Policy) -> Scheduler {
    Scheduler::start(SchedulerConfig {
        workers,
        policy,
        capacity: 1024,
        pin: false,
    })
}

/// A task with `items` items that counts its turns.
fn counter(
    items: u32,
    turns: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
) -> Box<dyn flick_runtime::Task> {
    let mut left = items;
    Box::new(move |slice: &mut Timeslice| {
        turns.fetch_add(1, Ordering::Relaxed);
        while left > 0 {
            left -= 1;
            std::hint::black_box(left);
            if left > 0 && slice.item_done() {
                return TaskStatus::Yield;
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
        TaskStatus::Done
    })
}

#[test]
fn every_task_runs_to_its_end() {
    for workers in [1, 2, 4] {
        let s = scheduler(workers, Policy::default());
        let turns = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..500 {
            s.spawn(counter(100, turns.clone(), done.clone())).unwrap();
        }
        assert!(s.wait_all_done(Duration::from_secs(20)));
        assert_eq!(done.load(Ordering::Relaxed), 500);
        assert_eq!(s.live(), 0);
    }
}

#[test]
fn round_robin_gives_one_item_per_turn() {
    let s = scheduler(2, Policy::RoundRobin);
    let turns = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    s.spawn(counter(10, turns.clone(), done.clone())).unwrap();
    assert!(s.wait_all_done(Duration::from_secs(5)));
    assert_eq!(turns.load(Ordering::Relaxed), 10);
}

#[test]
fn run_to_completion_takes_one_turn() {
    let s = scheduler(2, Policy::RunToCompletion);
    let turns = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    s.spawn(counter(100_000, turns.clone(), done.clone()))
        .unwrap();
    assert!(s.wait_all_done(Duration::from_secs(5)));
    assert_eq!(turns.load(Ordering::Relaxed), 1);
}

#[test]
fn a_long_task_yields_at_the_timeslice() {
    let s = scheduler(
        1,
        Policy::Cooperative {
            timeslice: Duration::from_micros(20),
        },
    );
    let turns = Arc::new(AtomicUsize::new(0));
    let mut left = 2_000u32;
    let t = turns.clone();
    s.spawn(Box::new(move |slice: &mut Timeslice| {
        t.fetch_add(1, Ordering::Relaxed);
        while left > 0 {
            left -= 1;
            std::thread::sleep(Duration::from_micros(1));
            if slice.item_done() {
                return TaskStatus::Yield;
            }
        }
        TaskStatus::Done
    }))
    .unwrap();
    assert!(s.wait_all_done(Duration::from_secs(20)));
    assert!(turns.load(Ordering::Relaxed) > 10, "it never yielded");
}

#[test]
fn the_task_table_has_a_capacity() {
    let s = Scheduler::start(SchedulerConfig {
        workers: 1,
        policy: Policy::default(),
        capacity: 2,
        pin: false,
    });
    let block =
        || -> Box<dyn flick_runtime::Task> { Box::new(|_: &mut Timeslice| TaskStatus::Idle) };
    s.spawn(block()).unwrap();
    s.spawn(block()).unwrap();
    assert!(s.spawn(block()).is_err());
}

#[test]
fn channels_apply_backpressure_and_lose_no_wakeups() {
    const N: u64 = 20_000;
    for workers in [1, 2] {
        let s = scheduler(workers, Policy::default());
        let (tx, rx) = channel::<u64>(4, s.waker());
        let consumer = s.reserve().unwrap();
        let producer = s.reserve().unwrap();
        rx.bind(consumer);
        tx.bind(producer);
        let sum = Arc::new(AtomicU64::new(0));
        let max_queued = Arc::new(AtomicUsize::new(0));
        let (sum2, maxq) = (sum.clone(), max_queued.clone());
        s.start_task(
            consumer,
            Box::new(move |slice: &mut Timeslice| loop {
                maxq.fetch_max(rx.len(), Ordering::Relaxed);
                match rx.try_recv() {
                    Ok(v) => {
                        sum2.fetch_add(v, Ordering::Relaxed);
                        if slice.item_done() {
                            return TaskStatus::Yield;
                        }
                    }
                    Err(TryRecvError::Empty) => return TaskStatus::Idle,
                    Err(TryRecvError::Closed) => return TaskStatus::Done,
                }
            }),
        );
        let mut next = 1u64;
        let mut pending: Option<u64> = None;
        let mut tx = Some(tx);
        s.start_task(
            producer,
            Box::new(move |slice: &mut Timeslice| loop {
                let v = pending.take().unwrap_or_else(|| {
                    next += 1;
                    next - 1
                });
                if v > N {
                    tx = None; // dropping the sender closes the channel
                    return TaskStatus::Done;
                }
                match tx.as_ref().unwrap().try_send(v) {
                    Ok(()) => {
                        if slice.item_done() {
                            return TaskStatus::Yield;
                        }
                    }
                    Err(TrySendError::Full(v)) => {
                        pending = Some(v);
                        return TaskStatus::Idle;
                    }
                    Err(TrySendError::Closed(_)) => return TaskStatus::Done,
                }
            }),
        );
        assert!(
            s.wait_all_done(Duration::from_secs(30)),
            "a wake-up was lost ({workers} workers)"
        );
        assert_eq!(sum.load(Ordering::Relaxed), N * (N + 1) / 2);
        assert!(max_queued.load(Ordering::Relaxed) <= 4);
    }
}

#[test]
fn queue_lengths_are_per_worker_and_drain() {
    let s = scheduler(3, Policy::default());
    assert_eq!(s.queue_lengths().len(), 3);
    let (turns, done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    for _ in 0..50 {
        s.spawn(counter(100, turns.clone(), done.clone())).unwrap();
    }
    assert!(s.wait_all_done(Duration::from_secs(10)));
    assert_eq!(done.load(Ordering::Relaxed), 50);
    assert_eq!(s.queue_lengths(), vec![0, 0, 0], "nothing left queued");
}

#[test]
fn a_pooled_channel_comes_back_empty_and_open_once_both_ends_are_gone() {
    let s = scheduler(1, Policy::default());
    let pool = flick_runtime::ChannelPool::<u32>::new(4, 2, 2, s.waker());
    assert_eq!(pool.available(), 2);
    let (tx, rx) = pool.channel();
    assert_eq!(pool.available(), 1);
    tx.try_send(7).unwrap();
    tx.try_send(8).unwrap();
    drop(tx);
    assert_eq!(pool.available(), 1, "one end still holds it");
    assert_eq!(rx.try_recv(), Ok(7));
    drop(rx);
    assert_eq!(pool.available(), 2, "back once both ends are gone");
    let (tx, rx) = pool.channel();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty), "emptied and open");
    tx.try_send(9).unwrap();
    assert_eq!(rx.try_recv(), Ok(9));
    // Beyond what the pool keeps, channels are made and then freed.
    let extra: Vec<_> = (0..3).map(|_| pool.channel()).collect();
    assert_eq!(pool.available(), 0);
    drop(extra);
    drop((tx, rx));
    assert_eq!(pool.available(), 2);
}

#[test]
fn ids_reserved_on_a_worker_run_from_its_queue() {
    let s = scheduler(2, Policy::default());
    for w in 0..2 {
        for _ in 0..50 {
            let id = s.reserve_on(w).unwrap();
            assert_eq!(s.home_of(id), w);
            s.start_task(id, Box::new(|_: &mut Timeslice| TaskStatus::Done));
        }
    }
}

/// A producer that checks for room before it sends (and waits when there
/// is none) is woken when the consumer makes room: no value is stranded.
#[test]
fn a_producer_waiting_for_room_is_woken() {
    const N: u64 = 5_000;
    for workers in [1, 2] {
        let s = scheduler(workers, Policy::default());
        let (tx, rx) = channel::<u64>(2, s.waker());
        let consumer = s.reserve().unwrap();
        let producer = s.reserve().unwrap();
        rx.bind(consumer);
        tx.bind(producer);
        let sum = Arc::new(AtomicU64::new(0));
        let sum2 = sum.clone();
        s.start_task(
            consumer,
            Box::new(move |_: &mut Timeslice| loop {
                match rx.try_recv() {
                    Ok(v) => {
                        sum2.fetch_add(v, Ordering::Relaxed);
                    }
                    Err(TryRecvError::Empty) => return TaskStatus::Idle,
                    Err(TryRecvError::Closed) => return TaskStatus::Done,
                }
            }),
        );
        let mut next = 1u64;
        let mut tx = Some(tx);
        s.start_task(
            producer,
            Box::new(move |_: &mut Timeslice| loop {
                if next > N {
                    tx = None;
                    return TaskStatus::Done;
                }
                let t = tx.as_ref().unwrap();
                if !t.has_room() {
                    return TaskStatus::Idle;
                }
                t.try_send(next).unwrap();
                next += 1;
            }),
        );
        assert!(
            s.wait_all_done(Duration::from_secs(30)),
            "a wake-up was lost ({workers} workers)"
        );
        assert_eq!(sum.load(Ordering::Relaxed), N * (N + 1) / 2);
    }
}

/// Tasks of two groups, weights 1 and 3, each run doing the same fixed
/// work and yielding, share one worker: the heavier group gets about three
/// runs (and three times the time) for each of the lighter's. Counted over
/// a window that starts once both groups run; bounded by a run count.
#[test]
fn groups_share_a_worker_by_weight() {
    use std::sync::atomic::AtomicBool;
    let s = scheduler(1, Policy::default());
    let light = s.group(1).unwrap();
    let heavy = s.group(3).unwrap();
    assert_eq!(s.groups(), 2);
    let runs = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
    let stop = Arc::new(AtomicBool::new(false));
    // Every task is queued before any runs.
    let mut ids = Vec::new();
    for (g, group) in [&light, &heavy].into_iter().enumerate() {
        for _ in 0..3 {
            ids.push((g, s.reserve_in(group, None).unwrap()));
        }
    }
    for (g, id) in ids {
        let (runs, stop) = (runs[g].clone(), stop.clone());
        s.start_task(
            id,
            Box::new(move |_: &mut Timeslice| {
                if stop.load(Ordering::Relaxed) {
                    return TaskStatus::Done;
                }
                let mut x = 0u64;
                for i in 0..20_000u64 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                }
                runs.fetch_add(1, Ordering::Relaxed);
                TaskStatus::Yield
            }),
        );
    }
    let total = || runs[0].load(Ordering::Relaxed) + runs[1].load(Ordering::Relaxed);
    let until = |n: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while total() < n && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    until(200);
    let (a0, b0) = (
        runs[0].load(Ordering::Relaxed),
        runs[1].load(Ordering::Relaxed),
    );
    let (ca0, cb0) = (light.charged(), heavy.charged());
    until(200 + 2_000);
    let (a1, b1) = (
        runs[0].load(Ordering::Relaxed),
        runs[1].load(Ordering::Relaxed),
    );
    let (ca1, cb1) = (light.charged(), heavy.charged());
    stop.store(true, Ordering::Relaxed);
    assert!(s.wait_all_done(Duration::from_secs(10)));
    let (a, b) = (a1 - a0, b1 - b0);
    assert!(a + b >= 1_500, "too few runs: {a} + {b}");
    let ratio = b as f64 / a.max(1) as f64;
    assert!((2.0..=4.5).contains(&ratio), "runs {b}:{a} = {ratio:.2}");
    let charged = (cb1 - cb0).as_secs_f64() / (ca1 - ca0).as_secs_f64().max(1e-9);
    assert!((2.0..=4.5).contains(&charged), "time {charged:.2}");
}

/// A group's id is free again once its handle and its tasks are gone, and
/// a task of a group outlives the handle.
#[test]
fn a_group_lives_while_its_handle_or_a_task_does() {
    use std::sync::atomic::AtomicBool;
    let s = scheduler(2, Policy::default());
    let group = s.group(5).unwrap();
    assert_eq!(group.weight(), 5);
    group.set_weight(0);
    assert_eq!(group.weight(), 1, "weights are at least 1");
    group.set_weight(1_000_000);
    assert_eq!(group.weight(), flick_runtime::MAX_WEIGHT);
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    let id = s
        .spawn_in(
            &group,
            Box::new(move |_: &mut Timeslice| {
                if r.load(Ordering::Acquire) {
                    TaskStatus::Done
                } else {
                    TaskStatus::Idle
                }
            }),
        )
        .unwrap();
    drop(group);
    assert_eq!(s.groups(), 1, "its task holds it");
    release.store(true, Ordering::Release);
    s.waker().wake(id);
    assert!(s.wait_all_done(Duration::from_secs(10)));
    assert_eq!(s.groups(), 0);
    // Every id can be taken, and then none.
    let all: Vec<_> = (0..flick_runtime::MAX_GROUPS)
        .map(|_| s.group(1).unwrap())
        .collect();
    assert!(s.group(1).is_err());
    drop(all);
    assert_eq!(s.groups(), 0);
}

/// One group alone (a single service on its workers) runs untimed, as the
/// default group does; runs are charged once a second group has tasks.
#[test]
fn a_lone_group_is_not_timed() {
    let s = scheduler(1, Policy::default());
    let alone = s.group(1).unwrap();
    let yielding = |n: u32| -> Box<dyn flick_runtime::Task> {
        let mut left = n;
        Box::new(move |_: &mut Timeslice| {
            left -= 1;
            if left == 0 {
                TaskStatus::Done
            } else {
                TaskStatus::Yield
            }
        })
    };
    s.spawn_in(&alone, yielding(100)).unwrap();
    assert!(s.wait_all_done(Duration::from_secs(10)));
    assert_eq!(alone.charged(), Duration::ZERO);
    let other = s.group(1).unwrap();
    s.spawn_in(&alone, yielding(100)).unwrap();
    s.spawn_in(&other, yielding(100)).unwrap();
    assert!(s.wait_all_done(Duration::from_secs(10)));
    assert!(alone.charged() > Duration::ZERO);
    assert!(other.charged() > Duration::ZERO);
}

/// Waits until `cond` holds, for at most ten seconds.
fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::yield_now();
    }
}

/// Tasks on one worker, each of which records its number when woken and
/// wakes the next in `chain[n]`; `wake_first` are woken (from this
/// thread) while the worker is held busy, so they queue in that order.
/// The order the tasks ran in (each is expected to run once).
fn hops(chain: &[Option<usize>], wake_first: &[usize], handoff: bool) -> Vec<usize> {
    let s = scheduler(1, Policy::default());
    s.set_handoff(handoff);
    let waker = s.waker();
    let ids: Vec<_> = chain.iter().map(|_| s.reserve().unwrap()).collect();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ready = Arc::new(AtomicUsize::new(0));
    for (n, next) in chain.iter().enumerate() {
        let (order, ready, waker) = (order.clone(), ready.clone(), waker.clone());
        let next = next.map(|k| ids[k]);
        let mut first = true;
        let task = move |_: &mut Timeslice| {
            if std::mem::take(&mut first) {
                ready.fetch_add(1, Ordering::AcqRel);
                return TaskStatus::Idle;
            }
            order.lock().unwrap().push(n);
            if let Some(next) = next {
                waker.wake(next);
            }
            TaskStatus::Idle
        };
        s.start_task(ids[n], Box::new(task));
    }
    wait_for("every task ran once", || {
        ready.load(Ordering::Acquire) == chain.len()
    });
    // Hold the worker while the first wakes queue up behind the gate.
    let holding = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(AtomicUsize::new(0));
    let (h, g) = (holding.clone(), go.clone());
    s.spawn(Box::new(move |_: &mut Timeslice| {
        h.store(1, Ordering::Release);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while g.load(Ordering::Acquire) == 0 && std::time::Instant::now() < deadline {
            std::hint::spin_loop();
        }
        TaskStatus::Done
    }))
    .unwrap();
    wait_for("the gate runs", || holding.load(Ordering::Acquire) == 1);
    for n in wake_first {
        waker.wake(ids[*n]);
    }
    go.store(1, Ordering::Release);
    wait_for("every hop ran", || {
        order.lock().unwrap().len() >= chain.len()
    });
    let order = order.lock().unwrap().clone();
    order
}

/// With hand-off on, a task woken by the run before it, on its own
/// worker, runs next, not behind the tasks already queued; with it off
/// (the default), behind them.
#[test]
fn a_task_woken_by_a_run_on_its_worker_runs_next() {
    // 0 wakes 1; 2 and 3 were queued behind 0.
    let chain = [Some(1), None, None, None];
    assert_eq!(hops(&chain, &[0, 2, 3], true), [0, 1, 2, 3]);
    assert_eq!(hops(&chain, &[0, 2, 3], false), [0, 2, 3, 1]);
}

/// A chain of tasks waking each other takes at most four hand-offs in a
/// row; then the queued task runs, then the chain goes on.
#[test]
fn a_chain_of_hand_offs_does_not_starve_the_queue() {
    let mut chain: Vec<Option<usize>> = (1..10).map(Some).collect();
    chain.push(None);
    // Task 10 is queued behind the chain's first.
    chain.push(None);
    let order = hops(&chain, &[0, 10], true);
    assert_eq!(order, [0, 1, 2, 3, 4, 10, 5, 6, 7, 8, 9]);
}

/// Of two tasks woken by one run, the later takes the slot and the
/// earlier goes to the back of the queue.
#[test]
fn a_second_hand_off_sends_the_first_to_the_queue() {
    let s = scheduler(1, Policy::default());
    s.set_handoff(true);
    let waker = s.waker();
    let ids: Vec<_> = (0..3).map(|_| s.reserve().unwrap()).collect();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ready = Arc::new(AtomicUsize::new(0));
    for (n, id) in ids.iter().enumerate().skip(1) {
        let (order, ready) = (order.clone(), ready.clone());
        let mut first = true;
        s.start_task(
            *id,
            Box::new(move |_: &mut Timeslice| {
                if std::mem::take(&mut first) {
                    ready.fetch_add(1, Ordering::AcqRel);
                } else {
                    order.lock().unwrap().push(n);
                }
                TaskStatus::Idle
            }),
        );
    }
    wait_for("both ran once", || ready.load(Ordering::Acquire) == 2);
    let (o, w, next) = (order.clone(), waker.clone(), ids.clone());
    s.start_task(
        ids[0],
        Box::new(move |_: &mut Timeslice| {
            o.lock().unwrap().push(0);
            w.wake(next[1]);
            w.wake(next[2]);
            TaskStatus::Done
        }),
    );
    wait_for("all ran", || order.lock().unwrap().len() == 3);
    assert_eq!(*order.lock().unwrap(), [0, 2, 1]);
}

/// With writers left to the queue, a task registered as a stream's writer
/// is not handed off: it runs behind the tasks queued before it.
#[test]
fn a_streams_writer_is_not_handed_off_when_writers_are_skipped() {
    let s = scheduler(1, Policy::default());
    s.set_handoff(true);
    s.set_handoff_skips_writers(true);
    let waker = s.waker();
    let ids: Vec<_> = (0..3).map(|_| s.reserve().unwrap()).collect();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let armed = Arc::new(AtomicUsize::new(0));
    for (n, id) in ids.iter().enumerate().skip(1) {
        let (order, runs, armed) = (order.clone(), runs.clone(), armed.clone());
        s.start_task(
            *id,
            Box::new(move |_: &mut Timeslice| {
                runs.fetch_add(1, Ordering::AcqRel);
                if armed.load(Ordering::Acquire) == 1 {
                    order.lock().unwrap().push(n);
                }
                TaskStatus::Idle
            }),
        );
    }
    wait_for("both ran once", || runs.load(Ordering::Acquire) == 2);
    // Registered now, task 1 is a writer; the stream's first readiness
    // (writable) wakes it once more.
    let reactor = flick_runtime::io::Reactor::start(s.waker()).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (_server, _) = listener.accept().unwrap();
    client.set_nonblocking(true).unwrap();
    let mut stream = mio::net::TcpStream::from_std(client);
    let token = reactor
        .register_stream(&mut stream, None, Some(ids[1]))
        .unwrap();
    wait_for("the writer was woken by its stream", || {
        runs.load(Ordering::Acquire) == 3
    });
    armed.store(1, Ordering::Release);
    let (o, w, next) = (order.clone(), waker.clone(), ids.clone());
    s.start_task(
        ids[0],
        Box::new(move |_: &mut Timeslice| {
            o.lock().unwrap().push(0);
            // 2 takes the slot; 1, the writer, would push it out to the
            // queue if it were handed off, but is queued itself.
            w.wake(next[2]);
            w.wake(next[1]);
            TaskStatus::Done
        }),
    );
    wait_for("all ran", || order.lock().unwrap().len() >= 3);
    assert_eq!(*order.lock().unwrap(), [0, 2, 1]);
    reactor.deregister_stream(&mut stream, token);
}

/// Readiness a sleeping worker finds in `epoll_wait` wakes its tasks
/// without writing its own eventfd: it is awake from the moment the wait
/// returns. (Marked asleep until after its events' wakes, each wake was a
/// `write` to itself, and the next wait returned at once for it.)
#[test]
fn a_worker_woken_by_its_sockets_does_not_interrupt_itself() {
    use std::io::{Read, Write};
    let s = scheduler(1, Policy::default());
    let reactor = flick_runtime::io::Reactor::start(s.waker()).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    server.set_nonblocking(true).unwrap();
    let reader = server.try_clone().unwrap();
    let mut stream = mio::net::TcpStream::from_std(server);
    let id = s.reserve().unwrap();
    let read = Arc::new(AtomicUsize::new(0));
    let seen = read.clone();
    s.start_task(
        id,
        Box::new(move |_: &mut Timeslice| {
            let mut buf = [0u8; 64];
            while let Ok(n) = (&reader).read(&mut buf) {
                if n == 0 {
                    return TaskStatus::Done;
                }
                seen.fetch_add(n, Ordering::AcqRel);
            }
            TaskStatus::Idle
        }),
    );
    let token = reactor
        .register_stream(&mut stream, Some(id), None)
        .unwrap();
    let at_start = reactor.interrupts();
    // Each byte arrives while the worker sleeps in `epoll_wait`.
    let bytes = 50;
    for n in 1..=bytes {
        std::thread::sleep(Duration::from_millis(2));
        client.write_all(b"x").unwrap();
        wait_for("the byte was read", || read.load(Ordering::Acquire) >= n);
    }
    let interrupts = reactor.interrupts() - at_start;
    assert!(
        interrupts < bytes / 5,
        "{interrupts} eventfd writes for {bytes} wake-ups by readiness"
    );
    reactor.deregister_stream(&mut stream, token);
}

/// A stream's writer is woken by writable readiness only after it asked
/// for it (`Reactor::want_writable`): bytes arriving for its reader on a
/// socket that is writable anyway do not run it, and a socket that had
/// no room wakes it once the peer reads.
#[test]
fn a_writer_is_woken_by_writable_readiness_only_when_it_asked() {
    use std::io::{ErrorKind, Read, Write};
    let s = scheduler(1, Policy::default());
    let reactor = Arc::new(flick_runtime::io::Reactor::start(s.waker()).unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    server.set_nonblocking(true).unwrap();
    let (reading, writing) = (server.try_clone().unwrap(), server.try_clone().unwrap());
    let mut stream = mio::net::TcpStream::from_std(server);
    let (rid, wid) = (s.reserve().unwrap(), s.reserve().unwrap());
    let read = Arc::new(AtomicUsize::new(0));
    let writer_runs = Arc::new(AtomicUsize::new(0));
    // Set once the stream is registered: the writer asks through its token.
    let token = Arc::new(std::sync::OnceLock::new());
    // What the writer is to write, and what it wrote.
    let to_write = Arc::new(AtomicUsize::new(0));
    let written = Arc::new(AtomicUsize::new(0));
    let seen = read.clone();
    s.start_task(
        rid,
        Box::new(move |_: &mut Timeslice| {
            let mut buf = [0u8; 64];
            while let Ok(n) = (&reading).read(&mut buf) {
                if n == 0 {
                    return TaskStatus::Done;
                }
                seen.fetch_add(n, Ordering::AcqRel);
            }
            TaskStatus::Idle
        }),
    );
    let (runs, want, done, r, t) = (
        writer_runs.clone(),
        to_write.clone(),
        written.clone(),
        reactor.clone(),
        token.clone(),
    );
    s.start_task(
        wid,
        Box::new(move |_: &mut Timeslice| {
            runs.fetch_add(1, Ordering::AcqRel);
            let chunk = [7u8; 65536];
            let mut asked = false;
            while done.load(Ordering::Acquire) < want.load(Ordering::Acquire) {
                let left = want.load(Ordering::Acquire) - done.load(Ordering::Acquire);
                match (&writing).write(&chunk[..left.min(chunk.len())]) {
                    Ok(n) => {
                        done.fetch_add(n, Ordering::AcqRel);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock && !asked => {
                        // Ask, then try once more.
                        if let Some(t) = t.get() {
                            r.want_writable(*t);
                        }
                        asked = true;
                    }
                    Err(_) => return TaskStatus::Idle,
                }
            }
            TaskStatus::Idle
        }),
    );
    let registered = reactor
        .register_stream(&mut stream, Some(rid), Some(wid))
        .unwrap();
    token.set(registered).unwrap();
    // Registered, the writer is woken once by the first readiness.
    wait_for("the writer's first run", || {
        writer_runs.load(Ordering::Acquire) >= 1
    });
    std::thread::sleep(Duration::from_millis(20));
    let runs_before = writer_runs.load(Ordering::Acquire);
    for n in 1..=20 {
        client.write_all(b"x").unwrap();
        wait_for("the byte was read", || read.load(Ordering::Acquire) >= n);
    }
    assert_eq!(
        writer_runs.load(Ordering::Acquire),
        runs_before,
        "bytes for the reader ran the writer"
    );
    // More than the socket holds: the writer blocks, asks, and is woken
    // as the client reads.
    let total = 8 << 20;
    to_write.store(total, Ordering::Release);
    s.waker().wake(wid);
    let mut got = 0;
    let mut buf = vec![0u8; 1 << 16];
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    while got < total {
        got += client.read(&mut buf).expect("the writer went on writing");
    }
    assert_eq!(got, total);
    reactor.deregister_stream(&mut stream, registered);
}
