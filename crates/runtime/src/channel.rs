//! Bounded channels between tasks, with backpressure.
//!
//! A channel joins one producing task to one consuming task. Sending wakes
//! the consumer; a full channel hands the value back
//! ([`TrySendError::Full`]) and remembers that the producer waits, so that
//! the consumer wakes it when it makes room. Nothing buffers without bound:
//! a producer that cannot send stops reading its own input.

use crate::scheduler::Waker;
use crate::task::TaskId;
use crossbeam_queue::ArrayQueue;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

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
    producer_waiting: AtomicBool,
    closed: AtomicBool,
    waker: Waker,
}

/// The sending end; owned by the producing task.
pub struct Sender<T> {
    inner: Arc<Inner<T>>,
}

/// The receiving end; owned by the consuming task.
pub struct Receiver<T> {
    inner: Arc<Inner<T>>,
}

/// A channel of `capacity` values; its storage is allocated here, once.
pub fn channel<T>(capacity: usize, waker: Waker) -> (Sender<T>, Receiver<T>) {
    let inner = Arc::new(Inner {
        queue: ArrayQueue::new(capacity.max(1)),
        consumer: AtomicU32::new(NOBODY),
        producer: AtomicU32::new(NOBODY),
        producer_waiting: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        waker,
    });
    (
        Sender {
            inner: inner.clone(),
        },
        Receiver { inner },
    )
}

impl<T> Inner<T> {
    fn wake(&self, who: &AtomicU32) {
        let id = who.load(Ordering::Acquire);
        if id != NOBODY {
            self.waker.wake(TaskId(id));
        }
    }
}

impl<T> Sender<T> {
    /// Names the task that sends, so a full channel can wake it later.
    pub fn bind(&self, producer: TaskId) {
        self.inner.producer.store(producer.0, Ordering::Release);
    }

    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(TrySendError::Closed(value));
        }
        match self.inner.queue.push(value) {
            Ok(()) => {
                self.inner.wake(&self.inner.consumer);
                Ok(())
            }
            Err(value) => {
                self.inner.producer_waiting.store(true, Ordering::Release);
                // Room may have been made between the push and the flag.
                match self.inner.queue.push(value) {
                    Ok(()) => {
                        self.inner.producer_waiting.store(false, Ordering::Release);
                        self.inner.wake(&self.inner.consumer);
                        Ok(())
                    }
                    Err(value) => Err(TrySendError::Full(value)),
                }
            }
        }
    }

    /// No more values will come; the consumer drains what is queued.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.wake(&self.inner.consumer);
    }

    pub fn is_full(&self) -> bool {
        self.inner.queue.is_full()
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.close();
    }
}

impl<T> Receiver<T> {
    /// Names the task that receives, so sends can wake it.
    pub fn bind(&self, consumer: TaskId) {
        self.inner.consumer.store(consumer.0, Ordering::Release);
    }

    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        match self.inner.queue.pop() {
            Some(v) => {
                if self.inner.producer_waiting.swap(false, Ordering::AcqRel) {
                    self.inner.wake(&self.inner.producer);
                }
                Ok(v)
            }
            None if self.inner.closed.load(Ordering::Acquire) => {
                // A value pushed just before closing is still delivered.
                self.inner.queue.pop().ok_or(TryRecvError::Closed)
            }
            None => Err(TryRecvError::Empty),
        }
    }

    pub fn len(&self) -> usize {
        self.inner.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.queue.is_empty()
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.wake(&self.inner.producer);
    }
}
