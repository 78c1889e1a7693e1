//! Room for a run of parsed messages: what [`Parser::parse_batch`] fills,
//! one row of slots per message.
//!
//! [`Parser::parse_batch`]: crate::Parser::parse_batch

use crate::program::{Slot, UnitId};
use crate::{Grammar, Message};
use std::ops::Range;
use std::sync::Arc;

/// Messages of one unit parsed in one go: a run of them from the start of
/// a buffer ([`Parser::parse_batch`]), or one from the start of each of
/// several buffers ([`Parser::parse_each`]).
///
/// Made by [`Parser::batch`] and filled only by parsers of the same
/// grammar, unit and view that leave the same fields in place: a row
/// keeps what its last message set until the next message there
/// overwrites or unsets it.
///
/// [`Parser::parse_batch`]: crate::Parser::parse_batch
/// [`Parser::parse_each`]: crate::Parser::parse_each
/// [`Parser::batch`]: crate::Parser::batch
pub struct Batch {
    grammar: Arc<Grammar>,
    unit: UnitId,
    keep: Option<Arc<[bool]>>,
    /// Filled by parsers that leave fields in place.
    in_place: bool,
    width: usize,
    pub(crate) slots: Vec<Slot>,
    /// Where each message ends in the buffer parsed.
    pub(crate) ends: Vec<u32>,
    /// Each row's [`Cx::arms`](crate::rt::Cx::arms).
    pub(crate) arms: Vec<u64>,
    /// One past the highest slot a message in any row set: what a row may
    /// still hold set.
    pub(crate) high: usize,
    /// Rows filled by the last parse.
    pub(crate) len: usize,
}

impl Batch {
    pub(crate) fn new(
        grammar: Arc<Grammar>,
        unit: UnitId,
        keep: Option<Arc<[bool]>>,
        in_place: bool,
        rows: usize,
    ) -> Batch {
        let width = (grammar.units[unit].slots as usize).max(1);
        Batch {
            grammar,
            unit,
            keep,
            in_place,
            width,
            slots: vec![Slot::Unset; width * rows],
            ends: vec![0; rows],
            arms: vec![0; rows],
            high: 0,
            len: 0,
        }
    }

    /// Whether a parser of `grammar`'s `unit` under `keep`, leaving fields
    /// in place or not, may fill it.
    pub(crate) fn made_for(
        &self,
        grammar: &Arc<Grammar>,
        unit: UnitId,
        keep: Option<&Arc<[bool]>>,
        in_place: bool,
    ) -> bool {
        let same_view = match (&self.keep, keep) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            _ => false,
        };
        Arc::ptr_eq(&self.grammar, grammar)
            && self.unit == unit
            && same_view
            && self.in_place == in_place
    }

    /// How many messages the last parse gave.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes its messages take from the start of the buffer parsed.
    #[inline]
    pub fn consumed(&self) -> usize {
        match self.len {
            0 => 0,
            n => self.ends[n - 1] as usize,
        }
    }

    /// Where message `i` lies in the buffer parsed.
    #[inline]
    pub fn span(&self, i: usize) -> Range<usize> {
        assert!(i < self.len, "message {i} of a batch of {}", self.len);
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        start..self.ends[i] as usize
    }

    /// Message `i`'s slots, as [`Parser::slots`](crate::Parser::slots)
    /// gives them after parsing it alone; byte offsets count from the
    /// message's first byte.
    #[inline]
    pub fn slots(&self, i: usize) -> &[Slot] {
        assert!(i < self.len, "message {i} of a batch of {}", self.len);
        &self.slots[i * self.width..(i + 1) * self.width]
    }

    /// Its messages in order, over `buf`, the buffer the batch was parsed
    /// from.
    #[inline]
    pub fn messages<'a>(&'a self, buf: &'a [u8]) -> impl Iterator<Item = Message<'a>> + 'a {
        let mut start = 0;
        let (g, unit) = (&*self.grammar, self.unit);
        self.slots
            .chunks_exact(self.width)
            .zip(&self.ends[..self.len])
            .map(move |(row, &end)| {
                let m = Message::new(g, unit, row, 0, &buf[start..end as usize]);
                start = end as usize;
                m
            })
    }

    /// Message `i`, over `buf`, the buffer the batch was parsed from.
    #[inline]
    pub fn message<'a>(&'a self, i: usize, buf: &'a [u8]) -> Message<'a> {
        let span = self.span(i);
        Message::new(&self.grammar, self.unit, self.slots(i), 0, &buf[span])
    }

    /// The messages of a batch filled by [`Parser::parse_each`], in
    /// order, each over its buffer among `msgs` (those given to it).
    ///
    /// [`Parser::parse_each`]: crate::Parser::parse_each
    #[inline]
    pub fn messages_in<'a>(
        &'a self,
        msgs: &'a [&'a [u8]],
    ) -> impl Iterator<Item = Message<'a>> + 'a {
        let (g, unit) = (&*self.grammar, self.unit);
        self.slots
            .chunks_exact(self.width)
            .zip(&self.ends[..self.len])
            .zip(msgs)
            .map(move |((row, &end), msg)| {
                Message::new(g, unit, row, 0, &msg[..(end as usize).min(msg.len())])
            })
    }
}
