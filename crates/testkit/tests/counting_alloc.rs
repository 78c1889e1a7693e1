//! `CountingAlloc` as a test binary's allocator: it counts allocations and
//! reallocations, each thread's apart from every thread's.

use flick_testkit::alloc::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

#[test]
fn counts_an_allocation_and_a_reallocation_on_this_thread() {
    let (all, mine) = (ALLOC.allocations(), ALLOC.this_thread());
    let mut v: Vec<u64> = Vec::with_capacity(1);
    v.reserve_exact(64);
    std::hint::black_box(&v);
    assert_eq!(ALLOC.this_thread() - mine, 2);
    assert!(ALLOC.allocations() - all >= 2);
}

#[test]
fn a_new_thread_counts_only_its_own() {
    let all = ALLOC.allocations();
    let made = std::thread::spawn(|| {
        let before = ALLOC.this_thread();
        std::hint::black_box(vec![0u8; 100]);
        ALLOC.this_thread() - before
    })
    .join()
    .unwrap();
    assert_eq!(made, 1);
    assert!(ALLOC.allocations() - all >= 1);
}
