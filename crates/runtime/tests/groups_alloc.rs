//! Switching between tasks of groups allocates nothing once each group's
//! queue has grown to its load: two groups of yielding tasks on two
//! workers, counted by a global allocator over many thousand runs (every
//! run is timed and charged, as whenever groups exist). Only the workers'
//! allocations count (the test harness's threads allocate as they please):
//! a task marks its worker when it first runs there.

use flick_runtime::{Policy, Scheduler, SchedulerConfig, TaskStatus, Timeslice};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static ON_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if ON_WORKER.with(|w| w.get()) {
        ALLOCATIONS.fetch_add(1, Ordering::SeqCst);
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn task_switches_between_groups_allocate_nothing() {
    let s = Scheduler::start(SchedulerConfig {
        workers: 2,
        policy: Policy::default(),
        capacity: 64,
        pin: false,
    });
    let groups = [s.group(1).unwrap(), s.group(3).unwrap()];
    let runs = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    for group in &groups {
        for _ in 0..4 {
            let (runs, stop) = (runs.clone(), stop.clone());
            s.spawn_in(
                group,
                Box::new(move |_: &mut Timeslice| {
                    if stop.load(Ordering::Relaxed) {
                        return TaskStatus::Done;
                    }
                    ON_WORKER.with(|w| w.set(true));
                    runs.fetch_add(1, Ordering::Relaxed);
                    TaskStatus::Yield
                }),
            )
            .unwrap();
        }
    }
    let until = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while runs.load(Ordering::Relaxed) < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            runs.load(Ordering::Relaxed) >= n,
            "the tasks stopped running"
        );
    };
    // Warm: every queue has held every task it will.
    until(10_000);
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let from = runs.load(Ordering::Relaxed);
    until(from + 50_000);
    let allocated = ALLOCATIONS.load(Ordering::SeqCst) - before;
    stop.store(true, Ordering::Relaxed);
    assert!(s.wait_all_done(Duration::from_secs(10)));
    assert_eq!(allocated, 0, "allocations over 50,000 task switches");
}
