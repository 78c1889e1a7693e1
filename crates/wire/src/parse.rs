//! The incremental parser: interprets a unit's operations over the bytes of
//! one message, resuming where it stopped when the bytes run out.
//!
//! The caller keeps the message's bytes contiguous from its first byte and
//! calls [`Parser::parse`] again with the same prefix and more bytes after
//! [`Progress::NeedMore`]. Nothing is allocated per message: slots and the
//! frame stack are sized once, when the parser is made.

use crate::error::{WireError, WireErrorKind};
use crate::eval::{slot_val, Env, Val};
use crate::program::*;
use crate::{Grammar, Message};
use memchr::memmem;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The message ends after this many bytes (counted from the start of
    /// the buffer passed in, which after [`Progress::Stream`] is the first
    /// byte not yet handed over).
    Done(usize),
    /// The bytes end inside a message; call again with more.
    NeedMore,
    /// Everything before the message's first `&stream` field is parsed,
    /// in this many bytes: the head's values can be read now. The head's
    /// bytes stay in the buffer; call again to go on.
    Head(usize),
    /// This many bytes from the start of the buffer belong to the message
    /// and are finished with: pass them on, drop them from the buffer, and
    /// call again with what follows. Values of the head are gone from then on.
    Stream(usize),
}

#[derive(Clone, Copy, Debug)]
enum Frame {
    Seq {
        block: BlockId,
        pc: u32,
        base: u32,
    },
    List {
        block: BlockId,
        op: u32,
        /// The count slot; elements follow.
        base: u32,
        index: u32,
        /// The element count of a `&count` list, once evaluated.
        target: Option<u32>,
        after_elem: bool,
        /// Where the list began, for `&max_bytes`.
        start: u32,
    },
}

/// Most spaces and tabs a `ws` field takes.
pub const WS_MAX: usize = 1024;

/// Deepest nesting of units, switches and lists a grammar may use.
const MAX_DEPTH: usize = 64;

/// Parses messages of one unit of a grammar, one after another.
pub struct Parser {
    grammar: Arc<Grammar>,
    unit: UnitId,
    slots: Vec<Slot>,
    stack: Vec<Frame>,
    pos: usize,
    /// Where a delimiter search resumes, so rescans are not quadratic.
    scan: usize,
    /// Slots a view needs; `None` stores every field.
    keep: Option<Arc<[bool]>>,
    /// Whether [`Progress::Head`] was reported for this message.
    head_done: bool,
    /// Bytes still to come of the `&stream` field being passed on.
    remaining: Option<u64>,
    /// Set by [`Parser::finish`]: no bytes follow the buffer.
    eof: bool,
}

impl Parser {
    pub fn new(grammar: Arc<Grammar>, unit: UnitId) -> Parser {
        let n = grammar.units[unit].slots as usize;
        let mut p = Parser {
            grammar,
            unit,
            slots: vec![Slot::Unset; n],
            stack: Vec::with_capacity(MAX_DEPTH),
            pos: 0,
            scan: 0,
            keep: None,
            head_done: false,
            remaining: None,
            eof: false,
        };
        p.reset();
        p
    }

    /// A parser that decodes only the slots in `keep` (see [`Grammar::view`]).
    pub fn with_view(grammar: Arc<Grammar>, unit: UnitId, keep: Arc<[bool]>) -> Parser {
        let mut p = Parser::new(grammar, unit);
        p.keep = Some(keep);
        p
    }

    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    pub fn unit(&self) -> UnitId {
        self.unit
    }

    /// Starts over, for the next message.
    pub fn reset(&mut self) {
        self.slots.fill(Slot::Unset);
        self.stack.clear();
        self.stack.push(Frame::Seq {
            block: self.grammar.units[self.unit].block,
            pc: 0,
            base: 0,
        });
        self.pos = 0;
        self.scan = 0;
        self.head_done = false;
        self.remaining = None;
        self.eof = false;
    }

    /// Like [`Parser::parse`], when the stream has ended after `buf`: a
    /// field that runs to the end of the stream (`&eof`) ends here, and a
    /// message cut short is an error.
    pub fn finish(&mut self, buf: &[u8]) -> Result<Progress, WireError> {
        self.eof = true;
        match self.parse(buf)? {
            Progress::NeedMore => Err(WireError {
                kind: WireErrorKind::Truncated,
                field: Arc::from("end of stream"),
                offset: buf.len(),
                status: None,
            }),
            p => Ok(p),
        }
    }

    /// Hands the bytes parsed so far over to the caller (see
    /// [`Progress::Stream`]): positions restart from zero.
    fn stream_out(&mut self) -> Progress {
        let n = self.pos;
        self.pos = 0;
        self.scan = 0;
        for f in &mut self.stack {
            if let Frame::List { start, .. } = f {
                *start = 0;
            }
        }
        Progress::Stream(n)
    }

    /// The parsed message; valid after [`Progress::Done`], over the same bytes.
    pub fn message<'a>(&'a self, buf: &'a [u8]) -> Message<'a> {
        Message::new(&self.grammar, self.unit, &self.slots, 0, buf)
    }

    /// The value slots, for serialising a parsed message.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Parses from the start of `buf`, which begins with the current
    /// message (and may hold more after it).
    pub fn parse(&mut self, buf: &[u8]) -> Result<Progress, WireError> {
        let g = self.grammar.clone();
        loop {
            let Some(&frame) = self.stack.last() else {
                return Ok(Progress::Done(self.pos));
            };
            match frame {
                Frame::Seq { block, pc, base } => {
                    let ops = &g.blocks[block as usize];
                    let Some(op) = ops.get(pc as usize) else {
                        self.stack.pop();
                        continue;
                    };
                    let next = Frame::Seq {
                        block,
                        pc: pc + 1,
                        base,
                    };
                    match &op.kind {
                        // An empty body is no stream: the message is all head.
                        OpKind::Scalar(Scalar::Bytes {
                            len: Len::Expr(e), ..
                        }) if op.stream
                            && self.remaining.is_none()
                            && matches!(self.env(base, buf).int(e), Ok(0)) =>
                        {
                            *self.stack.last_mut().unwrap() = next;
                        }
                        OpKind::Scalar(_) | OpKind::List { .. } if op.stream && !self.head_done => {
                            self.head_done = true;
                            return Ok(Progress::Head(self.pos));
                        }
                        OpKind::Scalar(Scalar::Bytes { len, max }) if op.stream => {
                            if !self.stream_bytes(len, *max, op, base, buf)? {
                                return Ok(if self.pos > 0 {
                                    self.stream_out()
                                } else {
                                    Progress::NeedMore
                                });
                            }
                            *self.stack.last_mut().unwrap() = next;
                            if self.pos > 0 {
                                return Ok(self.stream_out());
                            }
                        }
                        OpKind::Scalar(s) => {
                            let at = op.slot.map(|s| base as usize + s as usize);
                            if !self.scalar(s, op, at, base, buf)? {
                                return Ok(Progress::NeedMore);
                            }
                            self.check(op, at, base, buf)?;
                            *self.stack.last_mut().unwrap() = next;
                        }
                        OpKind::Var(e) => {
                            let env = self.env(base, buf);
                            let v = env
                                .eval(e)
                                .map_err(|_| self.error(op, WireErrorKind::Invalid))?;
                            let slot = match v {
                                Val::Int(i) if i < 0 => Slot::SInt(i as i64),
                                Val::Int(i) => Slot::Int(i as u64),
                                // Only bytes of the message can be kept in a slot.
                                Val::Bytes(b) => {
                                    let off =
                                        (b.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
                                    if off.checked_add(b.len()).is_some_and(|end| end <= buf.len())
                                    {
                                        Slot::Bytes {
                                            start: off as u32,
                                            len: b.len() as u32,
                                        }
                                    } else {
                                        Slot::Unset
                                    }
                                }
                                _ => Slot::Unset,
                            };
                            let at = op.slot.map(|s| base as usize + s as usize);
                            if let Some(at) = at {
                                self.slots[at] = slot;
                            }
                            self.check(op, at, base, buf)?;
                            *self.stack.last_mut().unwrap() = next;
                        }
                        OpKind::SerializeVar { .. } => *self.stack.last_mut().unwrap() = next,
                        OpKind::Switch { on, cases, default } => {
                            let env = self.env(base, buf);
                            let v = env
                                .eval(on)
                                .map_err(|_| self.error(op, WireErrorKind::Invalid))?;
                            let mut chosen = *default;
                            for (c, b) in cases {
                                if let Ok(cv) = env.eval(c) {
                                    if same(v, cv) {
                                        chosen = Some(*b);
                                        break;
                                    }
                                }
                            }
                            let Some(b) = chosen else {
                                return Err(self.error(op, WireErrorKind::NoCase));
                            };
                            *self.stack.last_mut().unwrap() = next;
                            self.push(
                                Frame::Seq {
                                    block: b,
                                    pc: 0,
                                    base,
                                },
                                op,
                            )?;
                        }
                        OpKind::Unit { block: b } => {
                            *self.stack.last_mut().unwrap() = next;
                            let base = base + op.slot.unwrap_or(0) as u32;
                            self.push(
                                Frame::Seq {
                                    block: *b,
                                    pc: 0,
                                    base,
                                },
                                op,
                            )?;
                        }
                        OpKind::List { .. } => {
                            *self.stack.last_mut().unwrap() = next;
                            let lbase = base + op.slot.unwrap_or(0) as u32;
                            self.slots[lbase as usize] = Slot::Count(0);
                            self.push(
                                Frame::List {
                                    block,
                                    op: pc,
                                    base: lbase,
                                    index: 0,
                                    target: None,
                                    after_elem: false,
                                    start: self.pos as u32,
                                },
                                op,
                            )?;
                        }
                    }
                }
                Frame::List {
                    block,
                    op,
                    base,
                    index,
                    target,
                    after_elem,
                    start,
                } => {
                    let lop = &g.blocks[block as usize][op as usize];
                    let OpKind::List {
                        elem,
                        stop,
                        sep,
                        max,
                        max_bytes,
                    } = &lop.kind
                    else {
                        unreachable!("list frames point at list operations")
                    };
                    if let Some(mb) = max_bytes {
                        if self.pos - start as usize > *mb as usize {
                            return Err(self.error(lop, WireErrorKind::TooLong { max: *mb as u64 }));
                        }
                    }
                    // A streamed list hands each finished element over.
                    if lop.stream && after_elem && self.pos > 0 {
                        return Ok(self.stream_out());
                    }
                    // A streamed list keeps one element's values at a time.
                    let slot_index = |i: u32| if lop.stream { 0 } else { i };
                    let elem_slots = match elem {
                        Elem::Unit { slots, .. } => *slots as u32,
                        Elem::Scalar(_) => 1,
                    };
                    let unit_base = self.unit_base_of_list(base, lop);
                    let mut target = target;
                    match stop {
                        Stop::UntilElem(e) if after_elem => {
                            let env = Env {
                                dollar_base: (base + 1 + slot_index(index - 1) * elem_slots)
                                    as usize,
                                ..self.env(unit_base, buf)
                            };
                            if env
                                .truthy(e)
                                .map_err(|_| self.error(lop, WireErrorKind::Invalid))?
                            {
                                self.stack.pop();
                                continue;
                            }
                        }
                        Stop::Count(e) => {
                            let n = match target {
                                Some(n) => n,
                                None => {
                                    let env = self.env(unit_base, buf);
                                    let n = env
                                        .int(e)
                                        .map_err(|_| self.error(lop, WireErrorKind::Invalid))?;
                                    if n < 0 || n > *max as i128 {
                                        return Err(
                                            self.error(lop, WireErrorKind::TooMany { max: *max })
                                        );
                                    }
                                    target = Some(n as u32);
                                    n as u32
                                }
                            };
                            if index == n {
                                self.stack.pop();
                                continue;
                            }
                        }
                        Stop::Until(t) => match starts(buf, self.pos, t) {
                            Some(true) => {
                                self.pos += t.len();
                                self.stack.pop();
                                continue;
                            }
                            Some(false) => {}
                            None => return Ok(Progress::NeedMore),
                        },
                        Stop::UntilElem(_) => {}
                    }
                    if index >= *max && !lop.stream {
                        return Err(self.error(lop, WireErrorKind::TooMany { max: *max }));
                    }
                    let at = (base + 1 + slot_index(index) * elem_slots) as usize;
                    match elem {
                        Elem::Unit { block: b, .. } => {
                            if let (Some(s), true) = (sep, index > 0) {
                                match starts(buf, self.pos, s) {
                                    Some(true) => self.pos += s.len(),
                                    Some(false) => {
                                        return Err(self.error(lop, WireErrorKind::Mismatch))
                                    }
                                    None => return Ok(Progress::NeedMore),
                                }
                            }
                            *self.stack.last_mut().unwrap() = Frame::List {
                                block,
                                op,
                                base,
                                index: index + 1,
                                target,
                                after_elem: true,
                                start,
                            };
                            self.slots[base as usize] = Slot::Count(slot_index(index) + 1);
                            self.push(
                                Frame::Seq {
                                    block: *b,
                                    pc: 0,
                                    base: at as u32,
                                },
                                lop,
                            )?;
                        }
                        Elem::Scalar(s) => {
                            let done = match (&**s, sep, stop) {
                                // Tokens separated by `sep`, the last ended by the terminator.
                                (
                                    Scalar::Bytes {
                                        len: Len::Until(_),
                                        max: m,
                                    },
                                    Some(sp),
                                    Stop::Until(t),
                                ) => self.token(buf, at, sp, t, *m as usize, lop)?,
                                _ => self.scalar(s, lop, Some(at), unit_base, buf)?,
                            };
                            if !done {
                                *self.stack.last_mut().unwrap() = Frame::List {
                                    block,
                                    op,
                                    base,
                                    index,
                                    target,
                                    after_elem,
                                    start,
                                };
                                return Ok(Progress::NeedMore);
                            }
                            self.slots[base as usize] = Slot::Count(slot_index(index) + 1);
                            *self.stack.last_mut().unwrap() = Frame::List {
                                block,
                                op,
                                base,
                                index: index + 1,
                                target,
                                after_elem: true,
                                start,
                            };
                        }
                    }
                }
            }
        }
    }

    /// Passes on the bytes of a `&stream` field as they arrive; `true`
    /// once the whole field went by.
    fn stream_bytes(
        &mut self,
        len: &Len,
        max: u32,
        op: &Op,
        base: u32,
        buf: &[u8],
    ) -> Result<bool, WireError> {
        let remaining = match self.remaining {
            Some(r) => r,
            None => {
                let n = match len {
                    Len::Expr(e) => {
                        let n = self
                            .env(base, buf)
                            .int(e)
                            .map_err(|_| self.error(op, WireErrorKind::Invalid))?;
                        if n < 0 {
                            return Err(self.error(op, WireErrorKind::BadLength));
                        }
                        if n > max as i128 {
                            return Err(self.error(op, WireErrorKind::TooLong { max: max as u64 }));
                        }
                        n as u64
                    }
                    Len::Eof => u64::MAX,
                    Len::Until(_) | Len::BeforeAny(_) => {
                        return Err(self.error(op, WireErrorKind::Invalid))
                    }
                };
                self.remaining = Some(n);
                n
            }
        };
        let avail = buf.len().saturating_sub(self.pos) as u64;
        let k = avail.min(remaining);
        self.pos += k as usize;
        let left = remaining - k;
        let done = left == 0 || (matches!(len, Len::Eof) && self.eof);
        self.remaining = if done { None } else { Some(left) };
        Ok(done)
    }

    /// The base of the unit a list belongs to, for its `&count` expression.
    fn unit_base_of_list(&self, list_base: u32, lop: &Op) -> u32 {
        list_base - lop.slot.unwrap_or(0) as u32
    }

    fn push(&mut self, f: Frame, op: &Op) -> Result<(), WireError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(self.error(op, WireErrorKind::TooDeep));
        }
        self.stack.push(f);
        Ok(())
    }

    fn env<'a>(&'a self, base: u32, buf: &'a [u8]) -> Env<'a> {
        Env {
            slots: &self.slots,
            base: base as usize,
            data: buf,
            dollar: Val::Unset,
            dollar_base: 0,
        }
    }

    fn error(&self, op: &Op, kind: WireErrorKind) -> WireError {
        WireError {
            kind,
            field: op.field.clone(),
            offset: self.pos,
            status: op.status,
        }
    }

    fn keep(&self, at: usize) -> bool {
        self.keep
            .as_ref()
            .is_none_or(|k| k.get(at).copied().unwrap_or(true))
    }

    fn store(&mut self, at: Option<usize>, v: Slot) {
        if let Some(at) = at {
            if self.keep(at) {
                self.slots[at] = v;
            }
        }
    }

    /// Keeps the `len` bytes at the current position in slot `at`.
    fn store_bytes(&mut self, at: Option<usize>, len: usize) {
        let start = self.pos as u32;
        self.store(
            at,
            Slot::Bytes {
                start,
                len: len as u32,
            },
        );
    }

    /// `&requires` of the field just parsed.
    fn check(&self, op: &Op, at: Option<usize>, base: u32, buf: &[u8]) -> Result<(), WireError> {
        let Some(req) = &op.requires else {
            return Ok(());
        };
        let env = Env {
            dollar: at.map_or(Val::Unset, |a| slot_val(&self.slots, buf, a)),
            ..self.env(base, buf)
        };
        match env.truthy(req) {
            Ok(true) => Ok(()),
            _ => Err(WireError {
                offset: self.pos,
                ..self.error(op, WireErrorKind::Invalid)
            }),
        }
    }

    /// Reads one scalar; `false` when the bytes run out first.
    fn scalar(
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
                if self.keep_or_needed(at) {
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
                if n < 0 {
                    return Err(self.error(op, WireErrorKind::BadLength));
                }
                if n > *max as i128 {
                    return Err(self.error(op, WireErrorKind::TooLong { max: *max as u64 }));
                }
                let n = n as usize;
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
                len: Len::BeforeAny(set),
                max,
            } => {
                let Some(end) = self.find_any(buf, set, *max as usize, op)? else {
                    return Ok(false);
                };
                if end == self.pos {
                    return Err(self.error(op, WireErrorKind::Mismatch));
                }
                self.store_bytes(at, end - self.pos);
                self.pos = end;
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
                let (neg, digits) = match &buf[self.pos..end] {
                    [b'-', rest @ ..] if *signed => (true, rest),
                    d => (false, d),
                };
                let v = crate::eval::parse_int(digits, if *hex { 16 } else { 10 })
                    .map_err(|_| self.error(op, WireErrorKind::BadNumber))?;
                // The value must fit the declared type.
                let bits = 8 * *bytes as u32;
                let fits = match (*signed, neg) {
                    (false, _) => v < 1i128 << bits,
                    (true, false) => v < 1i128 << (bits - 1),
                    (true, true) => v <= 1i128 << (bits - 1),
                };
                if !fits {
                    return Err(self.error(op, WireErrorKind::BadNumber));
                }
                let slot = match (*signed, neg) {
                    (true, true) => Slot::SInt((-v) as i64),
                    (true, false) => Slot::SInt(v as i64),
                    _ => Slot::Int(v as u64),
                };
                self.store(at, slot);
                self.pos = if *before { end } else { end + until.len() };
            }
            Scalar::VInt => {
                // Hadoop's WritableUtils.readVLong.
                if avail < 1 {
                    return Ok(false);
                }
                let first = buf[self.pos] as i8;
                let size = if first >= -112 {
                    1
                } else if first < -120 {
                    (-119 - first as i32) as usize
                } else {
                    (-111 - first as i32) as usize
                };
                if avail < size {
                    return Ok(false);
                }
                let v = if size == 1 {
                    first as i64
                } else {
                    let mut v: i64 = 0;
                    for b in &buf[self.pos + 1..self.pos + size] {
                        v = (v << 8) | *b as i64;
                    }
                    if first < -120 {
                        !v
                    } else {
                        v
                    }
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

    /// Integers are decoded when a view keeps them or an expression needs
    /// them; a view marks the latter as kept too.
    fn keep_or_needed(&self, at: Option<usize>) -> bool {
        at.is_some_and(|a| self.keep(a))
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
        let found = if from < limit {
            find_bytes(&buf[from..limit], d).map(|i| from + i)
        } else {
            None
        };
        if let Some(f) = &op.forbid {
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
            if let Some(i) = buf[from..limit].iter().position(|c| set.contains(c)) {
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

    /// One token of a separated list: ends at `sep` (consumed) or before
    /// `term` (left for the list).
    fn token(
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
fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    match needle {
        [] => Some(0),
        [a] => memchr::memchr(*a, hay),
        [a, b] => {
            let mut from = 0;
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

/// Whether `buf[pos..]` starts with `t`; `None` if too short to tell.
fn starts(buf: &[u8], pos: usize, t: &[u8]) -> Option<bool> {
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

fn same(a: Val, b: Val) -> bool {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => x == y,
        (Val::Bytes(x), Val::Bytes(y)) => x == y,
        _ => false,
    }
}
