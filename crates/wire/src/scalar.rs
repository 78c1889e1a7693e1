//! Reading one scalar field (integers, bytes up to a delimiter or of a
//! length, ASCII numbers, VInts, literals, whitespace) at the parser's
//! position: all of it, or nothing when the bytes run out first.

use crate::error::{WireError, WireErrorKind};
use crate::parse::{State, WS_MAX};
use crate::program::*;
use crate::rt::before_any_or;
use memchr::memmem;

impl State {
    /// Reads one scalar; `false` when the bytes run out first.
    pub(crate) fn scalar(
        &mut self,
        s: &Scalar,
        op: &Op,
        at: Option<usize>,
        base: u32,
        buf: &[u8],
    ) -> Result<bool, WireError> {
        let avail = buf.len().saturating_sub(self.pos);
        match s {
            Scalar::Int {
                bytes,
                signed,
                order,
            } => {
                let n = *bytes as usize;
                if avail < n {
                    return Ok(false);
                }
                if self.keeps(at) {
                    let raw = &buf[self.pos..self.pos + n];
                    let mut v: u64 = 0;
                    match order {
                        crate::grammar::ast::ByteOrder::Big => {
                            raw.iter().for_each(|b| v = v << 8 | *b as u64)
                        }
                        crate::grammar::ast::ByteOrder::Little => {
                            raw.iter().rev().for_each(|b| v = v << 8 | *b as u64)
                        }
                    }
                    let slot = if *signed {
                        let shift = 64 - 8 * n as u32;
                        Slot::SInt(((v << shift) as i64) >> shift)
                    } else {
                        Slot::Int(v)
                    };
                    self.store(at, slot);
                }
                self.pos += n;
            }
            Scalar::Bytes {
                len: Len::Expr(e),
                max,
            } => {
                let n = self
                    .env(base, buf)
                    .int(e)
                    .map_err(|_| self.error(op, WireErrorKind::Invalid))?;
                let n = self.bytes_len(op, n, *max)?;
                if avail < n {
                    return Ok(false);
                }
                self.store_bytes(at, n);
                self.pos += n;
            }
            // Only a `&stream` field may run to the end of the stream.
            Scalar::Bytes { len: Len::Eof, .. } => {
                return Err(self.error(op, WireErrorKind::Invalid));
            }
            Scalar::Bytes {
                len: Len::Until(d),
                max,
            } => {
                let Some(end) = self.find(buf, d, *max as usize, op)? else {
                    return Ok(false);
                };
                self.store_bytes(at, end - self.pos);
                self.pos = end + d.len();
            }
            Scalar::Bytes {
                len: Len::BeforeAny(set, also),
                max,
            } => {
                let found = if also.is_empty() {
                    self.find_any(buf, set, *max as usize, op)?
                } else {
                    self.find_any_or(buf, set, also, *max as usize, op)?
                };
                let Some(end) = found else {
                    return Ok(false);
                };
                if end == self.pos {
                    return Err(self.error(op, WireErrorKind::Mismatch));
                }
                self.store_bytes(at, end - self.pos);
                self.pos = end;
            }
            Scalar::Bytes {
                len: Len::WhileAny(set),
                max,
            } => {
                let max = *max as usize;
                let limit = (self.pos + max + 1).min(buf.len());
                let skipped = buf[self.pos..limit].iter().position(|b| !set.contains(b));
                let Some(n) = skipped else {
                    if buf.len() > self.pos + max {
                        return Err(self.error(op, WireErrorKind::TooLong { max: max as u64 }));
                    }
                    return Ok(false);
                };
                self.store_bytes(at, n);
                self.pos += n;
            }
            Scalar::AsciiInt {
                until,
                hex,
                before,
                signed,
                bytes,
            } => {
                let digits = 20 + usize::from(*signed);
                let end = if *before {
                    self.find_any(buf, until, digits, op)?
                } else {
                    self.find(buf, until, digits, op)?
                };
                let Some(end) = end else {
                    return Ok(false);
                };
                let slot = crate::rt::ascii_int(&buf[self.pos..end], *hex, *signed, *bytes)
                    .ok_or_else(|| self.error(op, WireErrorKind::BadNumber))?;
                self.store(at, slot);
                self.pos = if *before { end } else { end + until.len() };
            }
            Scalar::VInt => {
                let Some((v, size)) = read_vlong(buf.get(self.pos..).unwrap_or(&[])) else {
                    return Ok(false);
                };
                self.store(at, Slot::SInt(v));
                self.pos += size;
            }
            Scalar::Literal { bytes, nocase } => {
                let n = bytes.len().min(avail);
                let got = &buf[self.pos..self.pos + n];
                let ok = if *nocase {
                    got.eq_ignore_ascii_case(&bytes[..n])
                } else {
                    got == &bytes[..n]
                };
                if !ok {
                    return Err(self.error(op, WireErrorKind::Mismatch));
                }
                if n < bytes.len() {
                    return Ok(false);
                }
                self.store_bytes(at, n);
                self.pos += n;
            }
            Scalar::Ws => {
                let rest = &buf[self.pos..];
                let n = rest
                    .iter()
                    .take_while(|c| matches!(c, b' ' | b'\t'))
                    .count();
                if n > WS_MAX {
                    return Err(self.error(op, WireErrorKind::TooLong { max: WS_MAX as u64 }));
                }
                if n == rest.len() {
                    return Ok(false);
                }
                self.store_bytes(at, n);
                self.pos += n;
            }
        }
        Ok(true)
    }

    /// Finds `d` after the current position within `max` bytes. `None`
    /// when more bytes are needed.
    fn find(
        &mut self,
        buf: &[u8],
        d: &[u8],
        max: usize,
        op: &Op,
    ) -> Result<Option<usize>, WireError> {
        let from = self.scan.max(self.pos);
        let limit = (self.pos + max + d.len()).min(buf.len());
        // A header name's `:` and the line end it must not pass, in one
        // search (on the first try; a resumed search checks apart).
        let fused = match (&op.forbid, d) {
            (Some(f), [d]) if !f.is_empty() && from == self.pos && from < limit => Some((f, *d)),
            _ => None,
        };
        let found = match fused {
            Some((f, d)) => match find_before(&buf[from..limit], d, f) {
                Ok(found) => found.map(|i| from + i),
                Err(()) => return Err(self.error(op, WireErrorKind::Mismatch)),
            },
            None if from < limit => find_bytes(&buf[from..limit], d).map(|i| from + i),
            None => None,
        };
        if let (Some(f), None) = (&op.forbid, fused) {
            let end = found.unwrap_or(limit);
            if end > self.pos && find_bytes(&buf[self.pos..end], f).is_some() {
                return Err(self.error(op, WireErrorKind::Mismatch));
            }
        }
        if let Some(i) = found {
            self.scan = 0;
            return Ok(Some(i));
        }
        if buf.len() >= self.pos + max + d.len() {
            return Err(self.error(op, WireErrorKind::TooLong { max: max as u64 }));
        }
        // The delimiter may straddle the end: rescan its length less one.
        self.scan = buf.len().saturating_sub(d.len() - 1).max(self.pos);
        Ok(None)
    }

    /// Finds the first of the bytes `set` after the current position, within
    /// `max` bytes (`&before_any`). `None` when more bytes are needed.
    fn find_any(
        &mut self,
        buf: &[u8],
        set: &[u8],
        max: usize,
        op: &Op,
    ) -> Result<Option<usize>, WireError> {
        let from = self.scan.max(self.pos);
        let limit = (self.pos + max + 1).min(buf.len());
        if from < limit {
            if let Some(i) = position_any(&buf[from..limit], set) {
                self.scan = 0;
                return Ok(Some(from + i));
            }
        }
        if buf.len() > self.pos + max {
            return Err(self.error(op, WireErrorKind::TooLong { max: max as u64 }));
        }
        self.scan = buf.len().max(self.pos);
        Ok(None)
    }

    /// [`find_any`](Self::find_any) where the sequence `also` ends the
    /// bytes too (`&before_also`). The whole buffer is searched again each
    /// time: a token is short.
    fn find_any_or(
        &mut self,
        buf: &[u8],
        set: &[u8],
        also: &[u8],
        max: usize,
        op: &Op,
    ) -> Result<Option<usize>, WireError> {
        if let Some(i) = before_any_or(buf, self.pos, set, also, max) {
            return Ok(Some(i));
        }
        if buf.len() >= self.pos + max + also.len() {
            return Err(self.error(op, WireErrorKind::TooLong { max: max as u64 }));
        }
        Ok(None)
    }

    /// One token of a separated list: ends at `sep` (consumed) or before
    /// `term` (left for the list).
    pub(crate) fn token(
        &mut self,
        buf: &[u8],
        at: usize,
        sep: &[u8],
        term: &[u8],
        max: usize,
        op: &Op,
    ) -> Result<bool, WireError> {
        let rest = &buf[self.pos..buf.len().min(self.pos + max + term.len().max(sep.len()))];
        let s = find_bytes(rest, sep);
        let t = find_bytes(rest, term);
        let (end, consume) = match (s, t) {
            (Some(s), Some(t)) if t <= s => (t, 0),
            (Some(s), _) => (s, sep.len()),
            (None, Some(t)) => (t, 0),
            (None, None) => {
                if rest.len() >= max + term.len().max(sep.len()) {
                    return Err(self.error(op, WireErrorKind::TooLong { max: max as u64 }));
                }
                return Ok(false);
            }
        };
        if end == 0 {
            return Err(self.error(op, WireErrorKind::Mismatch));
        }
        self.store_bytes(Some(at), end);
        self.pos += end + consume;
        Ok(true)
    }
}

/// The first occurrence of `needle` in `hay`. Delimiters are mostly one or
/// two bytes (" ", ":", "\r\n"): `memchr` finds those without building a
/// `memmem` searcher on every call.
pub(crate) fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    match needle {
        [] => Some(0),
        [a] => memchr::memchr(*a, hay),
        [a, b] => {
            // Most fields are short: look at their first bytes directly
            // before setting up a vector search.
            let head = hay.len().min(16);
            if let Some(i) = hay[..head]
                .windows(2)
                .position(|w| w[0] == *a && w[1] == *b)
            {
                return Some(i);
            }
            let mut from = head.saturating_sub(1);
            while let Some(i) = memchr::memchr(*a, &hay[from..]) {
                let at = from + i;
                match hay.get(at + 1) {
                    Some(c) if c == b => return Some(at),
                    Some(_) => from = at + 1,
                    None => return None,
                }
            }
            None
        }
        _ => memmem::find(hay, needle),
    }
}

/// The first byte of `hay` that is in `set`. Sets are a few bytes
/// (`" \r\n"`), which `memchr` searches for together. Inlined, so that
/// generated code's constant sets fold into the search.
#[inline]
pub(crate) fn position_any(hay: &[u8], set: &[u8]) -> Option<usize> {
    // Tokens (commands, numbers) are mostly a few bytes: up to 32 bytes are
    // searched eight at a time in a register, the rest with `memchr`.
    if let [a, ref more @ ..] = *set {
        if more.len() <= 2 {
            let (b, c) = (*more.first().unwrap_or(&a), *more.last().unwrap_or(&a));
            let mut i = 0;
            while i + 8 <= hay.len() && i < 32 {
                let v = u64::from_le_bytes(hay[i..i + 8].try_into().expect("eight bytes"));
                let m =
                    zero_bytes(v ^ splat(a)) | zero_bytes(v ^ splat(b)) | zero_bytes(v ^ splat(c));
                if m != 0 {
                    return Some(i + (m.trailing_zeros() / 8) as usize);
                }
                i += 8;
            }
            let rest = &hay[i..];
            if rest.len() < 8 {
                return rest
                    .iter()
                    .position(|x| *x == a || *x == b || *x == c)
                    .map(|k| i + k);
            }
            let found = match *set {
                [a] => memchr::memchr(a, rest),
                [a, b] => memchr::memchr2(a, b, rest),
                _ => memchr::memchr3(a, b, c, rest),
            };
            return found.map(|k| i + k);
        }
    }
    match *set {
        [a] => memchr::memchr(a, hay),
        [a, b] => memchr::memchr2(a, b, hay),
        [a, b, d] => memchr::memchr3(a, b, d, hay),
        _ => hay.iter().position(|c| set.contains(c)),
    }
}

/// `b` in every byte of a word.
#[inline(always)]
fn splat(b: u8) -> u64 {
    u64::from_ne_bytes([b; 8])
}

/// The high bit of each zero byte of `x` (and perhaps of bytes above the
/// first zero one): its lowest set bit marks the first zero byte.
#[inline(always)]
fn zero_bytes(x: u64) -> u64 {
    x.wrapping_sub(0x0101_0101_0101_0101) & !x & 0x8080_8080_8080_8080
}

/// The first `d` in `hay`, or `Err` if `forbid` (not empty) occurs wholly
/// before it (before the end of `hay` if there is no `d`).
pub(crate) fn find_before(hay: &[u8], d: u8, forbid: &[u8]) -> Result<Option<usize>, ()> {
    let Some(&f0) = forbid.first() else {
        return Ok(None);
    };
    let mut i = 0;
    // A header line's end is mostly within a few words: found a word at
    // a time there, with `memchr2` past them (`position_any`).
    while let Some(k) = position_any(&hay[i..], &[d, f0]) {
        let at = i + k;
        if hay[at] == d {
            return Ok(Some(at));
        }
        // The forbidden bytes, with no delimiter among them, come first.
        let span = &hay[at..];
        if span.starts_with(forbid) && !span[..forbid.len()].contains(&d) {
            return Err(());
        }
        i = at + 1;
    }
    Ok(None)
}

/// Hadoop's `WritableUtils.readVLong` at the start of `b`: the value and
/// its size in bytes, or `None` if `b` ends first.
#[inline]
pub fn read_vlong(b: &[u8]) -> Option<(i64, usize)> {
    let first = *b.first()? as i8;
    if first >= -112 {
        return Some((first as i64, 1));
    }
    // Most lengths in map output fit one byte: laid out of the way, the
    // longer forms leave that path without a jump.
    std::hint::cold_path();
    let size = if first < -120 {
        (-119 - first as i32) as usize
    } else {
        (-111 - first as i32) as usize
    };
    let v = b
        .get(1..size)?
        .iter()
        .fold(0i64, |v, c| (v << 8) | *c as i64);
    Some((if first < -120 { !v } else { v }, size))
}

/// Whether `buf[pos..]` starts with `t`; `None` if too short to tell.
pub(crate) fn starts(buf: &[u8], pos: usize, t: &[u8]) -> Option<bool> {
    let rest = &buf[pos.min(buf.len())..];
    let n = rest.len().min(t.len());
    if rest[..n] != t[..n] {
        return Some(false);
    }
    if n < t.len() {
        None
    } else {
        Some(true)
    }
}

#[cfg(test)]
mod search_tests {
    use super::{find_before, position_any};
    use proptest::prelude::*;

    /// What `find_before` answers, byte by byte.
    fn find_before_reference(hay: &[u8], d: u8, forbid: &[u8]) -> Result<Option<usize>, ()> {
        for i in 0..hay.len() {
            if hay[i] == d {
                return Ok(Some(i));
            }
            if hay[i..].starts_with(forbid) && !hay[i..i + forbid.len()].contains(&d) {
                return Err(());
            }
        }
        Ok(None)
    }

    proptest! {
        /// The searches done a word at a time find what a byte-by-byte
        /// search finds, over haystacks shorter and longer than the words
        /// searched before `memchr` takes over.
        #[test]
        fn word_searches_find_what_byte_searches_find(
            hay in proptest::collection::vec(
                prop::sample::select(vec![b'a', b'a', b'a', b'a', b'a', b'\r', b'\n', b':', 0]),
                0..100,
            ),
            set_len in 1usize..=3,
        ) {
            let set = &[b'\r', b'\n', b':'][..set_len];
            prop_assert_eq!(
                position_any(&hay, set),
                hay.iter().position(|c| set.contains(c))
            );
            prop_assert_eq!(
                find_before(&hay, b'\r', b"\n"),
                find_before_reference(&hay, b'\r', b"\n")
            );
            prop_assert_eq!(
                find_before(&hay, b':', b"\r\n"),
                find_before_reference(&hay, b':', b"\r\n")
            );
            let end = hay.iter().position(|c| *c == 0).unwrap_or(hay.len());
            prop_assert_eq!(crate::eval::before(&hay, b"\0"), &hay[..end]);
            let rest = hay.iter().position(|c| *c == 0).map_or(&hay[hay.len()..], |i| &hay[i + 1..]);
            prop_assert_eq!(crate::eval::after(&hay, b"\0"), rest);
        }
    }
}
