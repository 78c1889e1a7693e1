//! Bounded channels between tasks, with backpressure.
//!
//! A channel joins one producing task to one consuming task. Sending wakes
//! the consumer; a full channel hands the value back
//! ([`TrySendError::Full`]) and remembers that the producer waits, so that
//! the consumer wakes it when it makes room. Nothing buffers without bound:
//! a producer that cannot send stops reading its own input.
//!
//! Channels taken from a [`ChannelPool`] go back to it when both ends are
//! dropped, so a graph made per connection reuses the storage of graphs
//! that ended instead of allocating its own.

use crate::scheduler::Waker;
use crate::task::TaskId;
// loom's types (and a loom-modelled queue) under `cfg(loom)`:
// `tests/loom_channel.rs` model-checks the wake-ups, closing and the pool.
use crate::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use crate::sync::{Arc, ArrayQueue};
// The pool itself is held in std's `Arc` in every build (loom has no
// `Weak`); its count is not part of the protocol the models check.
use std::sync::Weak;

const NOBODY: u32 = u32::MAX;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TrySendError<T> {
    #[error("the channel is full")]
    Full(T),
    #[error("the channel is closed")]
    Closed(T),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TryRecvError {
    #[error("the channel is empty")]
    Empty,
    #[error("the channel is closed and empty")]
    Closed,
}

struct Inner<T> {
    queue: ArrayQueue<T>,
    consumer: AtomicU32,
    producer: AtomicU32,
    /// Set by a producer that found the queue full, then cleared by the
    /// receive that wakes it. `SeqCst` where it is set and cleared: each
    /// side writes one of the flag and the queue and then reads the other
    /// (a Dekker pattern), and only sequential consistency, with the
    /// queue's own (crossbeam's head update and full check are `SeqCst`),
    /// rules out both reading the old value and the wake-up being lost.
    /// loom cannot see this (it treats `SeqCst` as `AcqRel`, and its queue
    /// stand-in is a lock); the model checks the rest of the protocol.
    producer_waiting: AtomicBool,
    closed: AtomicBool,
    /// Ends not yet dropped: 2 while the channel is in use.
    ends: AtomicU8,
    waker: Waker,
    /// The pool the storage returns to once both ends are gone.
    home: Weak<ChannelPool<T>>,
    /// Made with its pool rather than during a burst: trimming keeps it.
    made_ahead: bool,
}

/// The sending end; owned by the producing task.
pub struct Sender<T> {
    /// `None` only while being dropped.
    inner: Option<Arc<Inner<T>>>,
}

/// The receiving end; owned by the consuming task.
pub struct Receiver<T> {
    /// `None` only while being dropped.
    inner: Option<Arc<Inner<T>>>,
}

/// A channel of `capacity` values; its storage is allocated here, once.
pub fn channel<T>(capacity: usize, waker: Waker) -> (Sender<T>, Receiver<T>) {
    ends(Arc::new(Inner::new(capacity, waker, Weak::new())))
}

fn ends<T>(inner: Arc<Inner<T>>) -> (Sender<T>, Receiver<T>) {
    (
        Sender {
            inner: Some(inner.clone()),
        },
        Receiver { inner: Some(inner) },
    )
}

/// Channels of one capacity, made ahead of use; a channel goes back to
/// its pool when both its ends are dropped, emptied and unbound.
pub struct ChannelPool<T> {
    free: ArrayQueue<Arc<Inner<T>>>,
    capacity: usize,
    waker: Waker,
}

impl<T> ChannelPool<T> {
    /// A pool keeping up to `keep` channels of `capacity` values, `prefill`
    /// of them made now.
    pub fn new(
        capacity: usize,
        prefill: usize,
        keep: usize,
        waker: Waker,
    ) -> std::sync::Arc<ChannelPool<T>> {
        let pool = std::sync::Arc::new(ChannelPool {
            free: ArrayQueue::new(keep.max(1)),
            capacity,
            waker,
        });
        for _ in 0..prefill.min(keep) {
            let mut inner = Inner::new(
                capacity,
                pool.waker.clone(),
                std::sync::Arc::downgrade(&pool),
            );
            inner.made_ahead = true;
            let _ = pool.free.push(Arc::new(inner));
        }
        pool
    }

    /// A channel from the pool, or a new one (which joins the pool when it
    /// is done) if the pool is empty.
    pub fn channel(self: &std::sync::Arc<Self>) -> (Sender<T>, Receiver<T>) {
        let inner = self.free.pop().unwrap_or_else(|| {
            Arc::new(Inner::new(
                self.capacity,
                self.waker.clone(),
                std::sync::Arc::downgrade(self),
            ))
        });
        ends(inner)
    }

    /// Channels ready in the pool.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Frees pooled channels beyond `keep` (what a burst left); how many.
    /// Channels made during a burst go first and those made with the pool
    /// stay: these lie together in memory made at start, while a burst's
    /// lie among its connections' freed storage, where one kept would hold
    /// pages the allocator could otherwise give back.
    pub fn trim(&self, keep: usize) -> usize {
        let mut freed = 0;
        // One pass over the queue, its channels made ahead put back.
        for _ in 0..self.free.len() {
            if self.free.len() <= keep {
                return freed;
            }
            let Some(inner) = self.free.pop() else {
                return freed;
            };
            if inner.made_ahead {
                // Full again (channels came back meanwhile): freed after all.
                if self.free.push(inner).is_err() {
                    freed += 1;
                }
            } else {
                freed += 1;
            }
        }
        // Beyond `keep` with only channels made ahead left (a smaller `keep`).
        while self.free.len() > keep && self.free.pop().is_some() {
            freed += 1;
        }
        freed
    }
}

/// Gives a channel's storage back to its pool if this was its last end.
fn recycle<T>(inner: Arc<Inner<T>>) {
    // The end that counts itself out last puts the channel back. Each end
    // has closed it and woken the other before it counts itself out, and
    // touches nothing but its reference after, so the last has it alone.
    // (Waiting to see the `Arc` unique instead, with `Arc::get_mut`, lost
    // the channel when both ends dropped at once: each still saw the
    // other's reference. The loom model of the pool found it.)
    if inner.ends.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    let Some(pool) = inner.home.upgrade() else {
        return;
    };
    while inner.queue.pop().is_some() {}
    // Relaxed: the pool's queue hands these to the channel's next user.
    inner.consumer.store(NOBODY, Ordering::Relaxed);
    inner.producer.store(NOBODY, Ordering::Relaxed);
    inner.producer_waiting.store(false, Ordering::Relaxed);
    inner.closed.store(false, Ordering::Relaxed);
    inner.ends.store(2, Ordering::Relaxed);
    let _ = pool.free.push(inner);
}

impl<T> Inner<T> {
    fn new(capacity: usize, waker: Waker, home: Weak<ChannelPool<T>>) -> Inner<T> {
        Inner {
            queue: ArrayQueue::new(capacity.max(1)),
            consumer: AtomicU32::new(NOBODY),
            producer: AtomicU32::new(NOBODY),
            producer_waiting: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            ends: AtomicU8::new(2),
            waker,
            home,
            made_ahead: false,
        }
    }

    fn wake(&self, who: &AtomicU32) {
        let id = who.load(Ordering::Acquire);
        if id != NOBODY {
            self.waker.wake(TaskId(id));
        }
    }
}

impl<T> Sender<T> {
    fn inner(&self) -> &Inner<T> {
        self.inner.as_ref().expect("a live sender")
    }

    /// Names the task that sends, so a full channel can wake it later.
    pub fn bind(&self, producer: TaskId) {
        self.inner().producer.store(producer.0, Ordering::Release);
    }

    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        if self.inner().closed.load(Ordering::Acquire) {
            return Err(TrySendError::Closed(value));
        }
        match self.inner().queue.push(value) {
            Ok(()) => {
                self.inner().wake(&self.inner().consumer);
                Ok(())
            }
            Err(value) => {
                self.inner().producer_waiting.store(true, Ordering::SeqCst);
                // Room may have been made between the push and the flag.
                match self.inner().queue.push(value) {
                    Ok(()) => {
                        self.inner()
                            .producer_waiting
                            .store(false, Ordering::Release);
                        self.inner().wake(&self.inner().consumer);
                        Ok(())
                    }
                    Err(value) => Err(TrySendError::Full(value)),
                }
            }
        }
    }

    /// No more values will come; the consumer drains what is queued.
    pub fn close(&self) {
        self.inner().closed.store(true, Ordering::Release);
        self.inner().wake(&self.inner().consumer);
    }

    pub fn is_full(&self) -> bool {
        self.inner().queue.is_full()
    }

    /// Whether a value would fit now. If not, the producer is woken when
    /// the consumer makes room, as after a failed send: a producer that
    /// checks before sending and waits must use this, not `is_full`, or
    /// nothing wakes it.
    pub fn has_room(&self) -> bool {
        let inner = self.inner();
        if !inner.queue.is_full() {
            return true;
        }
        inner.producer_waiting.store(true, Ordering::SeqCst);
        // Room may have been made between the check and the flag.
        !inner.queue.is_full()
    }
}

impl<T> Sender<T> {
    /// Whether fewer than `n` values are queued. If not, the producer is
    /// woken when the consumer takes one, as after [`Sender::has_room`]:
    /// a producer that keeps its consumer's queue short waits on this.
    pub fn has_room_within(&self, n: usize) -> bool {
        let inner = self.inner();
        if inner.queue.len() < n {
            return true;
        }
        inner.producer_waiting.store(true, Ordering::SeqCst);
        // Values may have been taken between the check and the flag.
        inner.queue.len() < n
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.close();
        if let Some(inner) = self.inner.take() {
            recycle(inner);
        }
    }
}

impl<T> Receiver<T> {
    fn inner(&self) -> &Inner<T> {
        self.inner.as_ref().expect("a live receiver")
    }

    /// Names the task that receives, so sends can wake it.
    pub fn bind(&self, consumer: TaskId) {
        self.inner().consumer.store(consumer.0, Ordering::Release);
    }

    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        // An empty queue is told by two loads; a `pop` that finds it empty
        // also fences, and a compute task polls several empty channels a
        // run (the check races a push as `pop` does: the push's wake
        // runs the consumer again).
        if self.inner().queue.is_empty() && !self.inner().closed.load(Ordering::Acquire) {
            return Err(TryRecvError::Empty);
        }
        match self.inner().queue.pop() {
            Some(v) => {
                // Loaded before it is cleared: the exchange is a locked
                // instruction on every receive, and a producer rarely
                // waits. The load is `SeqCst` after the pop's `SeqCst`
                // update of the head, so it still sees a flag set before
                // the producer's retry missed that update (the Dekker
                // pattern of `producer_waiting`).
                let waiting = &self.inner().producer_waiting;
                if waiting.load(Ordering::SeqCst) && waiting.swap(false, Ordering::SeqCst) {
                    self.inner().wake(&self.inner().producer);
                }
                Ok(v)
            }
            None if self.inner().closed.load(Ordering::Acquire) => {
                // A value pushed just before closing is still delivered.
                self.inner().queue.pop().ok_or(TryRecvError::Closed)
            }
            None => Err(TryRecvError::Empty),
        }
    }

    pub fn len(&self) -> usize {
        self.inner().queue.len()
    }

    /// The sender is gone and nothing is left to receive.
    pub fn is_finished(&self) -> bool {
        self.inner().closed.load(Ordering::Acquire) && self.inner().queue.is_empty()
    }

    pub fn is_empty(&self) -> bool {
        self.inner().queue.is_empty()
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.inner().closed.store(true, Ordering::Release);
        self.inner().wake(&self.inner().producer);
        if let Some(inner) = self.inner.take() {
            recycle(inner);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::{Policy, Scheduler, SchedulerConfig};

    #[test]
    fn trimming_frees_the_channels_a_burst_made_and_keeps_those_made_ahead() {
        let s = Scheduler::start(SchedulerConfig {
            workers: 1,
            policy: Policy::default(),
            capacity: 64,
            pin: false,
        });
        let pool = ChannelPool::<u32>::new(1, 2, 8, s.waker());
        // A burst: the two made ahead, then four more.
        let burst: Vec<_> = (0..6).map(|_| pool.channel()).collect();
        drop(burst);
        assert_eq!(pool.available(), 6);
        assert_eq!(pool.trim(2), 4);
        let kept: Vec<_> = std::iter::from_fn(|| pool.free.pop()).collect();
        assert_eq!(kept.len(), 2);
        assert!(kept.iter().all(|c| c.made_ahead), "the burst's went first");
        for c in kept {
            let _ = pool.free.push(c);
        }
        // Below what is made ahead, those go too.
        assert_eq!(pool.trim(1), 1);
        assert_eq!(pool.available(), 1);
    }
}
