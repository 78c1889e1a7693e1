//! The synchronisation types of the scheduler's task state word, its
//! queues and wake-up path, and the bounded channels: std's (and
//! crossbeam's queue) in every build, loom's under `cfg(loom)`, so that
//! `tests/loom_*.rs` model-check the protocols built from them over every
//! interleaving (tokio's `src/loom` habit). Run them with
//! `RUSTFLAGS="--cfg loom" cargo test -p flick-runtime --release --test loom_scheduler`
//! (and `loom_channel`), in a target directory of their own; `scripts/test.sh`
//! does.
//!
//! The readiness I/O (`io.rs`: epoll, eventfds, the sleeping flags) keeps
//! std's types: loom cannot model system calls, so the models drive the
//! queues in place of the workers' loop.

#[cfg(loom)]
pub(crate) use loom::sync::{atomic, Arc, Condvar, Mutex};
#[cfg(not(loom))]
pub(crate) use std::sync::{atomic, Arc, Condvar, Mutex};

#[cfg(not(loom))]
pub(crate) use crossbeam_queue::ArrayQueue;
#[cfg(loom)]
pub(crate) use model::ArrayQueue;

#[cfg(loom)]
mod model {
    use std::collections::VecDeque;

    /// Stands in for crossbeam's `ArrayQueue` under loom, which cannot see
    /// inside crossbeam's atomics: a locked `VecDeque` that refuses a push
    /// when `capacity` values are queued, as the real queue does. The queue
    /// itself is crossbeam's tested code; what the models check is the
    /// protocol around it (the waiting flags, the closed flag, the task
    /// state word and the pool's hand-back). Each operation here is totally
    /// ordered by the lock, as crossbeam's are by its `SeqCst` head and tail
    /// updates (and the `SeqCst` fence in its full check).
    pub(crate) struct ArrayQueue<T> {
        capacity: usize,
        items: loom::sync::Mutex<VecDeque<T>>,
    }

    impl<T> ArrayQueue<T> {
        pub(crate) fn new(capacity: usize) -> ArrayQueue<T> {
            assert!(capacity > 0, "capacity must be non-zero");
            ArrayQueue {
                capacity,
                items: loom::sync::Mutex::new(VecDeque::with_capacity(capacity)),
            }
        }

        fn items(&self) -> loom::sync::MutexGuard<'_, VecDeque<T>> {
            self.items.lock().expect("model queue lock")
        }

        pub(crate) fn push(&self, value: T) -> Result<(), T> {
            let mut items = self.items();
            if items.len() == self.capacity {
                return Err(value);
            }
            items.push_back(value);
            Ok(())
        }

        pub(crate) fn pop(&self) -> Option<T> {
            self.items().pop_front()
        }

        pub(crate) fn len(&self) -> usize {
            self.items().len()
        }

        pub(crate) fn is_empty(&self) -> bool {
            self.items().is_empty()
        }

        pub(crate) fn is_full(&self) -> bool {
            self.items().len() == self.capacity
        }
    }
}
