//! A counting global allocator for the tests that prove a path allocates
//! nothing. A test binary declares one as its allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: flick_testkit::alloc::CountingAlloc = CountingAlloc::new();
//! ```
//!
//! and compares [`CountingAlloc::allocations`] (every thread's) or
//! [`CountingAlloc::this_thread`] (the calling thread's: the harness and
//! other tests allocate meanwhile on threads of their own) before and
//! after the path. Allocations and reallocations count; frees do not.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    // Const-initialised and without a destructor, so reading it from the
    // allocator never allocates.
    static THIS_THREAD: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations and reallocations.
pub struct CountingAlloc {
    all: AtomicU64,
}

impl CountingAlloc {
    pub const fn new() -> CountingAlloc {
        CountingAlloc {
            all: AtomicU64::new(0),
        }
    }

    /// Allocations by every thread since the process started.
    pub fn allocations(&self) -> u64 {
        self.all.load(Ordering::SeqCst)
    }

    /// Allocations by the calling thread since it started.
    pub fn this_thread(&self) -> u64 {
        THIS_THREAD.try_with(Cell::get).unwrap_or(0)
    }

    fn count(&self) {
        self.all.fetch_add(1, Ordering::Relaxed);
        // A thread being torn down has no counter left; it counts only in
        // the total.
        let _ = THIS_THREAD.try_with(|n| n.set(n.get() + 1));
    }
}

impl Default for CountingAlloc {
    fn default() -> CountingAlloc {
        CountingAlloc::new()
    }
}

// SAFETY: every call is passed on to `System` unchanged; counting touches
// only an atomic and a const thread-local, neither of which allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.count();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.count();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
