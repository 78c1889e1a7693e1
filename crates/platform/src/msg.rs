//! Messages as they travel between tasks, and the pool their storage
//! comes from, so that steady-state traffic allocates nothing.

use crossbeam_queue::ArrayQueue;
use flick_wire::{Grammar, Slot, UnitId};
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Messages a thread keeps back from the shared pool, so that a worker
/// taking and giving messages does not pass the pool's cache lines to the
/// other cores at every message.
const LOCAL: usize = 64;

/// Tells pools apart in the threads' caches.
static POOLS: AtomicUsize = AtomicUsize::new(1);

/// One thread's messages of one pool (the one it used last).
struct Local {
    pool: usize,
    msgs: Vec<Msg>,
}

thread_local! {
    static LOCAL_MSGS: RefCell<Local> = const {
        RefCell::new(Local {
            pool: 0,
            msgs: Vec::new(),
        })
    };
}

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
    /// Of a whole message whose body was read with its head (a reply of a
    /// `&stream` unit complete in one read): where the body begins in
    /// `bytes`. The values are the head's; `%forward` rewrites the head
    /// alone and the body follows as it came. 0: no such body.
    pub body_at: u32,
    /// Of a whole reply read together with the final reply that ends it
    /// (a VALUE and its END, `SharedReader::merge_end`): where that final
    /// reply begins in `bytes`. The values are the first reply's. 0: none.
    pub end_at: u32,
    /// A later message completes the reply this one belongs to (a VALUE
    /// before its END): a writer holds it until that one comes, so that a
    /// reply goes out in one write. Some clients (pymemcache's
    /// `raw_command`) drop the first piece of a reply that comes in two.
    pub continued: bool,
    /// Which slots may be set: copying and recycling a message touch only
    /// those.
    pub values: Values,
    /// How a request written to a backend connection is matched to its
    /// reply, where it was worked out when the request was sent, from its
    /// values (which then need not come along): see `backend.rs`.
    pub routed: Routed,
    /// Made with its pool, when the service started: a trim keeps it
    /// rather than one a burst made (see [`MsgPool::trim`]).
    made_ahead: bool,
}

/// What the writer of a backend connection records of a request so that
/// its reply finds the way back: its `%quiet`, whether a `%fence` follows
/// it, its `%correlate` and `%reply_context`. Kept in a few words (a
/// message is moved whole through channels and queues: at 128 bytes or
/// more each move is a `memcpy` call). On a reply, what the shared
/// connection's reader read of it to find its instance (its `%correlate`
/// and `%more`), so that the instance does not read them again
/// ([`Routed::reply`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Routed {
    /// `%correlate`, as two halves (an `i128` would make the message
    /// 16-byte aligned and larger).
    corr: [u64; 2],
    context: i64,
    /// `SET`, `QUIET`, `FENCED`, `CORR`.
    flags: u8,
}

impl Routed {
    const SET: u8 = 1;
    const QUIET: u8 = 2;
    const FENCED: u8 = 4;
    const CORR: u8 = 8;
    /// A reply's readings, not a request's routing (`SET` stays clear).
    const REPLY: u8 = 16;
    const MORE: u8 = 32;

    /// A reply's `%correlate` and `%more` as its reader read them.
    pub fn reply(corr: Option<i128>, more: bool) -> Routed {
        Routed {
            corr: Routed::halves(corr),
            context: 0,
            flags: Routed::REPLY
                | (more as u8 * Routed::MORE)
                | (corr.is_some() as u8 * Routed::CORR),
        }
    }

    /// `%correlate` as the two words it is kept in (0 for none).
    fn halves(corr: Option<i128>) -> [u64; 2] {
        let c = corr.unwrap_or(0) as u128;
        [c as u64, (c >> 64) as u64]
    }

    /// What [`Routed::reply`] was given, if it was.
    pub fn reply_readings(&self) -> Option<(Option<i128>, bool)> {
        (self.flags & Routed::REPLY != 0).then(|| (self.corr(), self.flags & Routed::MORE != 0))
    }

    /// `None` where the context does not fit in a word (no grammar's does).
    pub fn new(quiet: bool, fenced: bool, corr: Option<i128>, context: i128) -> Option<Routed> {
        Some(Routed {
            corr: Routed::halves(corr),
            context: i64::try_from(context).ok()?,
            flags: Routed::SET
                | (quiet as u8 * Routed::QUIET)
                | (fenced as u8 * Routed::FENCED)
                | (corr.is_some() as u8 * Routed::CORR),
        })
    }

    pub fn is_set(&self) -> bool {
        self.flags & Routed::SET != 0
    }

    pub fn quiet(&self) -> bool {
        self.flags & Routed::QUIET != 0
    }

    pub fn fenced(&self) -> bool {
        self.flags & Routed::FENCED != 0
    }

    pub fn corr(&self) -> Option<i128> {
        (self.flags & Routed::CORR != 0)
            .then(|| ((self.corr[0] as u128) | ((self.corr[1] as u128) << 64)) as i128)
    }

    pub fn context(&self) -> i128 {
        self.context as i128
    }
}

/// Which of a message's slots may hold values. A message from the pool
/// has none; one read with a grammar unit has only what a message of that
/// unit sets (an HTTP head reserves 100 headers and mostly uses a few).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Values {
    #[default]
    None,
    /// Set by parsing a message of the unit; none at or past `high`.
    Parsed { unit: UnitId, high: u32 },
    /// Any slot: written some other way.
    Any,
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

impl Values {
    /// The values `parser` has just read.
    pub fn parsed(parser: &flick_wire::Parser) -> Values {
        Values::Parsed {
            unit: parser.unit(),
            high: parser.used_slots().len() as u32,
        }
    }
}

/// Reusable message storage. Taking from an empty pool allocates; giving
/// back to a full pool frees; in steady state neither happens.
pub struct MsgPool {
    free: ArrayQueue<Msg>,
    slots: usize,
    /// The grammar whose units [`Values::Parsed`] names.
    grammar: Option<Arc<Grammar>>,
    id: usize,
    /// Messages in threads' caches: each thread counts its own on a cache
    /// line of its own (taken and given on every worker, a shared count
    /// would move between their cores on every message).
    cached: crate::stats::Counter,
    /// The fewest messages the shared queue held since the last trim:
    /// that many went unused all along.
    low: AtomicUsize,
    /// Whether messages were made with the pool.
    made_ahead: bool,
}

impl MsgPool {
    /// A pool of up to `capacity` messages of `slots` value slots each,
    /// `prefill` of them made now.
    pub fn new(capacity: usize, slots: usize, prefill: usize, bytes: usize) -> Arc<MsgPool> {
        Self::build(None, capacity, slots, prefill, bytes)
    }

    /// A pool for messages read with `grammar`'s units.
    pub fn for_grammar(
        grammar: Arc<Grammar>,
        capacity: usize,
        slots: usize,
        prefill: usize,
        bytes: usize,
    ) -> Arc<MsgPool> {
        Self::build(Some(grammar), capacity, slots, prefill, bytes)
    }

    fn build(
        grammar: Option<Arc<Grammar>>,
        capacity: usize,
        slots: usize,
        prefill: usize,
        bytes: usize,
    ) -> Arc<MsgPool> {
        let pool = MsgPool {
            free: ArrayQueue::new(capacity.max(1)),
            slots,
            grammar,
            id: POOLS.fetch_add(1, Ordering::Relaxed),
            cached: crate::stats::Counter::default(),
            low: AtomicUsize::new(usize::MAX),
            made_ahead: prefill.min(capacity) > 0,
        };
        for _ in 0..prefill.min(capacity) {
            let _ = pool.free.push(Msg {
                bytes: Vec::with_capacity(bytes),
                slots: vec![Slot::Unset; slots],
                rejected: None,
                part: Part::Whole,
                body_at: 0,
                end_at: 0,
                continued: false,
                values: Values::None,
                routed: Routed::default(),
                made_ahead: true,
            });
        }
        Arc::new(pool)
    }

    /// A message with no values (every slot unset).
    pub fn take(&self) -> Msg {
        let local = LOCAL_MSGS.with(|l| {
            let mut l = l.borrow_mut();
            (l.pool == self.id).then(|| l.msgs.pop()).flatten()
        });
        if local.is_some() {
            self.cached.fetch_sub(1, Ordering::Relaxed);
        }
        let taken = local.or_else(|| {
            let m = self.free.pop();
            self.low.fetch_min(self.free.len(), Ordering::Relaxed);
            m
        });
        match taken {
            Some(mut m) => {
                m.bytes.clear();
                m.rejected = None;
                m.part = Part::Whole;
                m.body_at = 0;
                m.end_at = 0;
                m.continued = false;
                m.routed = Routed::default();
                m
            }
            None => Msg {
                bytes: Vec::new(),
                slots: vec![Slot::Unset; self.slots],
                rejected: None,
                part: Part::Whole,
                body_at: 0,
                end_at: 0,
                continued: false,
                values: Values::None,
                routed: Routed::default(),
                made_ahead: false,
            },
        }
    }

    /// Takes `m` back, its values unset first.
    pub fn give(&self, mut m: Msg) {
        match (m.values, &self.grammar) {
            (Values::None, _) => {}
            (Values::Parsed { unit, high }, Some(g)) => {
                g.clear_slots(unit, &mut m.slots, high as usize)
            }
            _ => m.slots.fill(Slot::Unset),
        }
        m.values = Values::None;
        // A thread's cache is beyond a trim's reach: a message a burst made
        // goes back to the shared queue, unless the pool made none ahead.
        if !m.made_ahead && self.made_ahead {
            let _ = self.free.push(m);
            return;
        }
        let m = LOCAL_MSGS.with(|l| {
            let mut l = l.borrow_mut();
            if l.pool != self.id && l.msgs.is_empty() {
                l.pool = self.id;
            }
            if l.pool == self.id && l.msgs.len() < LOCAL {
                if l.msgs.capacity() == 0 {
                    l.msgs.reserve_exact(LOCAL);
                }
                l.msgs.push(m);
                self.cached.fetch_add(1, Ordering::Relaxed);
                None
            } else {
                Some(m)
            }
        });
        if let Some(m) = m {
            let _ = self.free.push(m);
        }
    }

    /// A copy of `m` in pooled storage.
    pub fn copy(&self, m: &Msg) -> Msg {
        let mut c = self.take();
        c.bytes.extend_from_slice(&m.bytes);
        self.copy_values(&mut c, m.values, &m.slots);
        c.part = m.part;
        c.body_at = m.body_at;
        c.end_at = m.end_at;
        c.continued = m.continued;
        c
    }

    /// A copy of `m`'s bytes alone, for a writer that only writes them:
    /// no values are copied, nor cleared when the copy comes back.
    pub fn copy_bytes(&self, m: &Msg) -> Msg {
        let mut c = self.take();
        c.bytes.extend_from_slice(&m.bytes);
        c.part = m.part;
        c.body_at = m.body_at;
        c.end_at = m.end_at;
        c.continued = m.continued;
        c
    }

    /// Gives `to`, a message with no values, the values `values` of `slots`.
    pub fn copy_values(&self, to: &mut Msg, values: Values, slots: &[Slot]) {
        match (values, &self.grammar) {
            (Values::None, _) => {}
            (Values::Parsed { unit, high }, Some(g)) => {
                let high = (high as usize).min(slots.len());
                g.copy_slots(unit, &slots[..high], &mut to.slots)
            }
            _ => {
                to.slots.clear();
                to.slots.extend_from_slice(slots);
            }
        }
        to.values = match values {
            Values::Parsed { .. } if self.grammar.is_none() => Values::Any,
            v => v,
        };
    }

    /// Frees the messages that went unused since the last trim, keeping at
    /// least `keep`; how many were freed. (After a burst, what it took is
    /// given back over the next trims instead of held at its peak.) Those
    /// a burst made go first and those made with the pool stay: these lie
    /// together in memory made at start, while a burst's lie among its
    /// connections' freed storage, where one kept would hold pages the
    /// allocator could otherwise give back.
    pub fn trim(&self, keep: usize) -> usize {
        let len = self.free.len();
        let unused = self.low.load(Ordering::Relaxed).min(len);
        // Threads' caches count towards `keep`: they hold messages made
        // ahead, which would otherwise stand in for a burst's kept here.
        let surplus =
            unused.min((len + self.cached.load(Ordering::Relaxed) as usize).saturating_sub(keep));
        let mut freed = 0;
        // One pass over the queue, the messages made ahead put back.
        for _ in 0..len {
            if freed == surplus {
                break;
            }
            let Some(m) = self.free.pop() else {
                break;
            };
            if !m.made_ahead {
                freed += 1;
            } else if self.free.push(m).is_err() {
                // Full again (messages came back meanwhile): freed after all.
                freed += 1;
            }
        }
        // Still beyond `keep` with only messages made ahead left.
        while freed < surplus && self.free.pop().is_some() {
            freed += 1;
        }
        self.low.store(self.free.len(), Ordering::Relaxed);
        freed
    }

    /// Messages waiting in the pool (and in threads' caches).
    pub fn available(&self) -> usize {
        self.free.len() + self.cached.load(Ordering::Relaxed) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_frees_the_messages_a_burst_made_and_keeps_those_made_ahead() {
        let pool = MsgPool::new(16, 1, 2, 0);
        // A burst: the two made ahead, then three more.
        let burst: Vec<Msg> = (0..5).map(|_| pool.take()).collect();
        assert_eq!(burst.iter().filter(|m| m.made_ahead).count(), 2);
        for m in burst {
            pool.give(m);
        }
        assert_eq!(pool.available(), 5);
        // Used since the last trim: none go yet.
        assert_eq!(pool.trim(2), 0);
        // The two made ahead wait in this thread's cache, beyond the trim's
        // reach, and count towards what it keeps.
        assert_eq!(pool.trim(2), 3);
        assert_eq!(pool.available(), 2);
        assert!(pool.take().made_ahead && pool.take().made_ahead);
    }

    #[test]
    fn a_message_stays_small_enough_to_move_inline() {
        assert!(
            std::mem::size_of::<Msg>() < 128,
            "{}",
            std::mem::size_of::<Msg>()
        );
    }

    #[test]
    fn routed_keeps_what_it_was_given() {
        for corr in [
            None,
            Some(0),
            Some(-1),
            Some(i128::MAX),
            Some(i128::MIN),
            Some(42),
        ] {
            let r = Routed::new(true, false, corr, 7).unwrap();
            assert!(r.is_set() && r.quiet() && !r.fenced());
            assert_eq!((r.corr(), r.context()), (corr, 7));
        }
        assert!(Routed::new(false, true, None, i128::MAX).is_none());
        assert!(!Routed::default().is_set());
        assert!(Routed::default().reply_readings().is_none());
        for corr in [None, Some(0), Some(-1), Some(i128::MAX), Some(42)] {
            for more in [false, true] {
                let r = Routed::reply(corr, more);
                assert!(!r.is_set(), "a reply's readings are no request's routing");
                assert_eq!(r.reply_readings(), Some((corr, more)));
            }
        }
    }
}
