//! Headers read whole: a unit's leading run of fixed-width fields taken
//! from a message as one array of bytes, checked once, so that reads of
//! its fields need no test of their own (a packet function reading a
//! 5-tuple, as hand-written code slices a header once and reads at
//! constant offsets).
//!
//! A [`HeaderRef`] names where a header begins, its length fixed in its
//! type; [`Message::header`](crate::Message::header) takes the header's
//! bytes from a message; [`Header::uint`] and [`Header::bytes`] read a
//! field of it through the field's [`FieldRef`]. The stock grammars have both as constants
//! (`headers::frame::IP4`, `fields::frame::IP4_SRC`), so that every offset
//! and width is one the compiler sees.

use crate::{FieldRef, UnitId};

/// A header of a unit, as [`Grammar::headers`](crate::Grammar::headers)
/// lists them: where [`Grammar::header_ref`](crate::Grammar::header_ref)
/// finds it, and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderInfo {
    /// Its path from the unit (`ip4`; empty for the unit's own).
    pub path: String,
    /// The unit whose leading fixed fields it is.
    pub unit: UnitId,
    /// The slot, in the layout of the unit it was listed for, that says
    /// where it begins.
    pub start: u16,
    /// Its length in bytes.
    pub len: u16,
}

/// A header of `N` bytes at the start of a unit, resolved once
/// ([`Grammar::header_ref`](crate::Grammar::header_ref)) for taking it
/// from every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderRef<const N: usize> {
    /// The slot that says where the unit begins.
    pub(crate) start: u16,
}

impl<const N: usize> HeaderRef<N> {
    /// A reference from the slot that says where its unit begins, as
    /// generated code names one; [`Grammar::header_ref`] resolves the
    /// same.
    ///
    /// [`Grammar::header_ref`]: crate::Grammar::header_ref
    #[doc(hidden)]
    pub const fn compiled(start: u16) -> HeaderRef<N> {
        HeaderRef { start }
    }

    /// The slot that says where the header's unit begins.
    pub const fn start(&self) -> u16 {
        self.start
    }

    /// The header's length in bytes.
    pub const fn len(&self) -> usize {
        N
    }

    /// Whether the header has no bytes (never, for one a grammar has).
    pub const fn is_empty(&self) -> bool {
        N == 0
    }
}

/// A header's bytes in a parsed message.
#[derive(Clone, Copy, Debug)]
pub struct Header<'a, const N: usize> {
    bytes: &'a [u8; N],
    start: u16,
}

impl<'a, const N: usize> Header<'a, N> {
    #[inline(always)]
    pub(crate) fn new(bytes: &'a [u8; N], start: u16) -> Header<'a, N> {
        Header { bytes, start }
    }

    /// The unsigned integer `field` holds, if it is an integer (or a bit
    /// field or copy of one) of this header; `None` for any other field,
    /// which [`Message::uint_of`](crate::Message::uint_of) reads. With
    /// `field` a constant, every test here is decided when the code
    /// compiles, and the read is a load at a constant offset.
    #[inline(always)]
    pub fn uint(&self, field: &FieldRef) -> Option<u64> {
        if field.header != self.start || field.width == 0 {
            return None;
        }
        let at = field.offset as usize;
        let b = self.bytes.get(at..at + field.width as usize)?;
        let v = match (b, field.little) {
            (&[a], _) => a as u64,
            (&[a, b], false) => u16::from_be_bytes([a, b]) as u64,
            (&[a, b, c, d], false) => u32::from_be_bytes([a, b, c, d]) as u64,
            (_, false) => b.iter().fold(0u64, |v, c| v << 8 | *c as u64),
            (_, true) => b.iter().rev().fold(0u64, |v, c| v << 8 | *c as u64),
        };
        Some(v.checked_shr(field.shift as u32).unwrap_or(0) & field.mask)
    }

    /// The bytes `field` holds, if it is bytes of a constant length in this
    /// header (an Ethernet or IPv6 address); `None` for any other field.
    #[inline(always)]
    pub fn bytes(&self, field: &FieldRef) -> Option<&'a [u8]> {
        if field.header != self.start || field.width != 0 {
            return None;
        }
        let at = field.offset as usize;
        self.bytes.get(at..at + field.len as usize)
    }

    /// The header's bytes.
    #[inline(always)]
    pub fn as_bytes(&self) -> &'a [u8; N] {
        self.bytes
    }
}
