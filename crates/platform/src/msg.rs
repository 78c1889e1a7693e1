//! Messages as they travel between tasks, and the pool their storage
//! comes from, so that steady-state traffic allocates nothing.

use crossbeam_queue::ArrayQueue;
use flick_wire::Slot;
use std::sync::Arc;

/// A parsed (or built) message: its wire bytes and its value slots. Moving
/// one between tasks moves two pointers.
#[derive(Debug, Default)]
pub struct Msg {
    pub bytes: Vec<u8>,
    pub slots: Vec<Slot>,
    /// Stands for a request that did not parse, with the status of its
    /// error (0 for none): it has no values, and is answered with the
    /// grammar's `%reject`.
    pub rejected: Option<u16>,
    /// Whether this is a whole message or part of one whose body streams.
    pub part: Part,
}

/// What part of a message a `Msg` is. Only a whole message or a head has
/// values; body pieces are bytes passed on to where their head went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Part {
    #[default]
    Whole,
    Head,
    Body,
    /// The last piece of a body.
    End,
}

/// Reusable message storage. Taking from an empty pool allocates; giving
/// back to a full pool frees; in steady state neither happens.
pub struct MsgPool {
    free: ArrayQueue<Msg>,
    slots: usize,
}

impl MsgPool {
    /// A pool of up to `capacity` messages of `slots` value slots each,
    /// `prefill` of them made now.
    pub fn new(capacity: usize, slots: usize, prefill: usize, bytes: usize) -> Arc<MsgPool> {
        let pool = MsgPool {
            free: ArrayQueue::new(capacity.max(1)),
            slots,
        };
        for _ in 0..prefill.min(capacity) {
            let _ = pool.free.push(Msg {
                bytes: Vec::with_capacity(bytes),
                slots: vec![Slot::Unset; slots],
                rejected: None,
                part: Part::Whole,
            });
        }
        Arc::new(pool)
    }

    pub fn take(&self) -> Msg {
        match self.free.pop() {
            Some(mut m) => {
                m.bytes.clear();
                m.rejected = None;
                m.part = Part::Whole;
                m
            }
            None => Msg {
                bytes: Vec::new(),
                slots: vec![Slot::Unset; self.slots],
                rejected: None,
                part: Part::Whole,
            },
        }
    }

    pub fn give(&self, m: Msg) {
        let _ = self.free.push(m);
    }

    /// A copy of `m` in pooled storage.
    pub fn copy(&self, m: &Msg) -> Msg {
        let mut c = self.take();
        c.bytes.extend_from_slice(&m.bytes);
        c.slots.clear();
        c.slots.extend_from_slice(&m.slots);
        c.part = m.part;
        c
    }

    /// Messages waiting in the pool.
    pub fn available(&self) -> usize {
        self.free.len()
    }
}
