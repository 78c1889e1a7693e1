//! Serialisation: values back to bytes, recomputing dependent fields.
//!
//! Three passes over a unit's operations. First, every field whose length
//! or count is given by a plain field (`&length = self.key_len`) sets that
//! field from the value's actual size. Second, variables with `&serialize`
//! set their target (Listing 2's `total_len`). Third, the bytes are
//! written. A field that was parsed keeps its original bytes where the
//! grammar allows several spellings (whitespace, case-insensitive tokens).

use crate::error::{WireError, WireErrorKind};
use crate::eval::{Env, Val};
use crate::grammar::ast::ByteOrder;
use crate::program::*;
use crate::Grammar;
use std::sync::Arc;

impl Grammar {
    /// Writes the message in `slots` (byte values in `data`) to `out`,
    /// after updating the fields that depend on others.
    pub fn serialize(
        &self,
        unit: UnitId,
        slots: &mut [Slot],
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), WireError> {
        let block = self.units[unit].block;
        self.lengths(block, slots, 0, data)?;
        self.variables(block, slots, 0, data)?;
        self.emit(block, slots, 0, data, Emit::default(), out)
            .map(drop)
    }

    /// Whether a proxy changes messages of `unit` that it passes on
    /// (`%forward`).
    pub fn has_forward(&self, unit: UnitId) -> bool {
        self.units[unit].forward.is_some()
    }

    /// Whether [`Grammar::forward`] can change a message of `unit` when
    /// the client's session ends (`session_ends`) or not: `false` where
    /// the unit drops nothing and adds only under the other answer of
    /// `session_ends()` (a reply a program builds, which says `Connection:
    /// close` on the last one alone), so the message passes on as it is
    /// and need not be written again.
    pub fn forward_changes(&self, unit: UnitId, session_ends: bool) -> bool {
        let Some(f) = &self.units[unit].forward else {
            return false;
        };
        !f.drop.is_empty()
            || f.add
                .iter()
                .any(|a| !matches!(a.when, When::SessionEnds(when) if when != session_ends))
    }

    /// Writes a parsed message as a proxy passes it on, with `%forward`'s
    /// edits: the other fields keep their bytes. With `head_only`, the
    /// message is the head of one whose body streams: writing stops at
    /// the first `&stream` field, as the body follows in pieces.
    pub fn forward(
        &self,
        unit: UnitId,
        slots: &[Slot],
        data: &[u8],
        head_only: bool,
        cx: &ForwardContext,
        out: &mut Vec<u8>,
    ) -> Result<(), WireError> {
        let (block, how) = self.forward_how(unit, head_only, cx);
        match how.edit {
            Some((f, _)) => self.forward_copying(block, f, slots, data, how, out),
            None => self.emit(block, slots, 0, data, how, out).map(drop),
        }
    }

    /// The unit's block, and how [`Grammar::forward`] writes it.
    fn forward_how<'a>(
        &'a self,
        unit: UnitId,
        head_only: bool,
        cx: &'a ForwardContext,
    ) -> (BlockId, Emit<'a>) {
        let edit = self.units[unit].forward.as_ref().map(|f| (f, cx));
        (self.units[unit].block, Emit { head_only, edit })
    }

    /// [`Grammar::forward`] with every field written, none copied as the
    /// bytes it was read from: the reference the copies are tested
    /// against.
    #[doc(hidden)]
    pub fn forward_by_fields(
        &self,
        unit: UnitId,
        slots: &[Slot],
        data: &[u8],
        head_only: bool,
        cx: &ForwardContext,
        out: &mut Vec<u8>,
    ) -> Result<(), WireError> {
        let (block, how) = self.forward_how(unit, head_only, cx);
        self.emit(block, slots, 0, data, how, out).map(drop)
    }

    fn err(op: &Op, kind: WireErrorKind, offset: usize) -> WireError {
        WireError {
            kind,
            field: op.field.clone(),
            offset,
            status: op.status,
        }
    }

    /// The block a switch takes for the current values.
    #[allow(clippy::too_many_arguments)]
    fn chosen(
        &self,
        op: &Op,
        on: &CExpr,
        cases: &[(CExpr, BlockId)],
        default: Option<BlockId>,
        slots: &[Slot],
        base: usize,
        data: &[u8],
    ) -> Result<BlockId, WireError> {
        let env = Env {
            slots,
            base,
            data,
            dollar: Val::Unset,
            dollar_base: 0,
            context: 0,
            limits: &self.limit_values,
            streamed: 0,
        };
        let v = env
            .eval(on)
            .map_err(|_| Self::err(op, WireErrorKind::Invalid, 0))?;
        for (c, b) in cases {
            let hit = match (v, env.eval(c)) {
                (Val::Int(x), Ok(Val::Int(y))) => x == y,
                (Val::Bytes(x), Ok(Val::Bytes(y))) => x == y,
                _ => false,
            };
            if hit {
                return Ok(*b);
            }
        }
        default.ok_or_else(|| Self::err(op, WireErrorKind::NoCase, 0))
    }

    /// The sub-blocks of an operation, at their bases, without allocating.
    fn nested(
        &self,
        op: &Op,
        slots: &[Slot],
        base: usize,
        data: &[u8],
    ) -> Result<Nested, WireError> {
        Ok(match &op.kind {
            OpKind::Switch { on, cases, default } => Nested {
                block: self.chosen(op, on, cases, *default, slots, base, data)?,
                first: base,
                stride: 0,
                count: 1,
            },
            OpKind::Unit { block } => Nested {
                block: *block,
                first: base + op.slot.unwrap_or(0) as usize,
                stride: 0,
                count: 1,
            },
            OpKind::List {
                elem: Elem::Unit { block, slots: n },
                ..
            } => {
                let at = base + op.slot.unwrap_or(0) as usize;
                let count = match slots.get(at) {
                    Some(Slot::Count(c)) => *c as usize,
                    _ => 0,
                };
                Nested {
                    block: *block,
                    first: at + 1,
                    stride: *n as usize,
                    count,
                }
            }
            _ => Nested {
                block: 0,
                first: 0,
                stride: 0,
                count: 0,
            },
        })
    }

    fn lengths(
        &self,
        block: BlockId,
        slots: &mut [Slot],
        base: usize,
        data: &[u8],
    ) -> Result<(), WireError> {
        for op in &self.blocks[block as usize] {
            let at = op.slot.map(|s| base + s as usize);
            match (&op.kind, at) {
                // An integer never set is written, and computed with, as 0.
                (
                    OpKind::Scalar(Scalar::Int { .. } | Scalar::AsciiInt { .. } | Scalar::VInt),
                    Some(at),
                ) if slots[at] == Slot::Unset => {
                    slots[at] = Slot::Int(0);
                }
                (
                    OpKind::Scalar(Scalar::Bytes {
                        len: Len::Expr(CExpr::Slot(t)),
                        ..
                    }),
                    Some(at),
                ) => {
                    let n = match slots[at] {
                        Slot::Bytes { len, .. } => len as u64,
                        _ => 0,
                    };
                    slots[base + *t as usize] = Slot::Int(n);
                }
                (
                    OpKind::List {
                        stop: Stop::Count(CExpr::Slot(t)),
                        ..
                    },
                    Some(at),
                ) => {
                    let n = match slots[at] {
                        Slot::Count(c) => c as u64,
                        _ => 0,
                    };
                    slots[base + *t as usize] = Slot::Int(n);
                }
                _ => {}
            }
            let n = self.nested(op, slots, base, data)?;
            for at in n.bases() {
                self.lengths(n.block, slots, at, data)?;
            }
        }
        Ok(())
    }

    fn variables(
        &self,
        block: BlockId,
        slots: &mut [Slot],
        base: usize,
        data: &[u8],
    ) -> Result<(), WireError> {
        for op in &self.blocks[block as usize] {
            if let OpKind::SerializeVar { var, target, expr } = &op.kind {
                let dollar = crate::eval::slot_val(slots, data, base + *var as usize);
                let env = Env {
                    slots,
                    base,
                    data,
                    dollar,
                    dollar_base: 0,
                    context: 0,
                    limits: &self.limit_values,
                    streamed: 0,
                };
                let v = env
                    .int(expr)
                    .map_err(|_| Self::err(op, WireErrorKind::Invalid, 0))?;
                slots[base + *target as usize] = Slot::Int(v as u64);
            }
            let n = self.nested(op, slots, base, data)?;
            for at in n.bases() {
                self.variables(n.block, slots, at, data)?;
            }
        }
        Ok(())
    }

    /// Writes a block's fields; `true` if it stopped at a `&stream` field
    /// (`how.head_only`).
    pub(crate) fn emit(
        &self,
        block: BlockId,
        slots: &[Slot],
        base: usize,
        data: &[u8],
        how: Emit,
        out: &mut Vec<u8>,
    ) -> Result<bool, WireError> {
        self.emit_ops(&self.blocks[block as usize], slots, base, data, how, out)
    }

    /// [`Grammar::emit`] of some of a block's operations.
    pub(crate) fn emit_ops(
        &self,
        ops: &[Op],
        slots: &[Slot],
        base: usize,
        data: &[u8],
        how: Emit,
        out: &mut Vec<u8>,
    ) -> Result<bool, WireError> {
        // Edits apply to the unit's own list, not to nested units.
        let nested = Emit { edit: None, ..how };
        for op in ops {
            if how.head_only && op.stream {
                return Ok(true);
            }
            let at = op.slot.map(|s| base + s as usize);
            match &op.kind {
                OpKind::Scalar(s) => {
                    emit_scalar(op, s, at.map_or(Slot::Unset, |a| slots[a]), data, out)?
                }
                OpKind::Var(_) | OpKind::SerializeVar { .. } | OpKind::Mark => {}
                OpKind::Switch { .. } | OpKind::Unit { .. } => {
                    let n = self.nested(op, slots, base, data)?;
                    for at in n.bases() {
                        if self.emit(n.block, slots, at, data, nested, out)? {
                            return Ok(true);
                        }
                    }
                }
                OpKind::List {
                    elem, stop, sep, ..
                } => {
                    let at = at.unwrap_or(base);
                    let count = match slots.get(at) {
                        Some(Slot::Count(c)) => *c as usize,
                        _ => 0,
                    };
                    let edit = how
                        .edit
                        .filter(|(f, _)| base + f.list as usize == at && base == 0);
                    for i in 0..count {
                        if let (Some((f, _)), Elem::Unit { slots: n, .. }) = (edit, elem) {
                            if f.drops(slots, at + 1 + i * *n as usize, data) {
                                continue;
                            }
                        }
                        if i > 0 {
                            if let Some(s) = sep {
                                out.extend_from_slice(s);
                            }
                        }
                        match elem {
                            Elem::Unit { block, slots: n } => {
                                let elem = at + 1 + i * *n as usize;
                                if self.emit(*block, slots, elem, data, nested, out)? {
                                    return Ok(true);
                                }
                            }
                            Elem::Scalar(s) => {
                                let v = slots[at + 1 + i];
                                match (&**s, sep) {
                                    // Separated tokens: the separator, not the delimiter, follows.
                                    (
                                        Scalar::Bytes {
                                            len: Len::Until(_), ..
                                        },
                                        Some(_),
                                    ) => out.extend_from_slice(bytes_of(v, data)),
                                    // Separated numbers: the separator follows, once.
                                    (Scalar::AsciiInt { hex, signed, .. }, Some(_)) => {
                                        let x = int_of(v);
                                        if *signed && x < 0 {
                                            out.push(b'-');
                                        }
                                        let x = if *signed { x.unsigned_abs() } else { x as u64 };
                                        write_int(out, x, *hex)
                                    }
                                    _ => emit_scalar(op, s, v, data, out)?,
                                }
                            }
                        }
                    }
                    if let Some((f, cx)) = edit {
                        f.append(slots, data, cx, out);
                    }
                    if let Stop::Until(t) | Stop::UntilEither(t, _) = stop {
                        out.extend_from_slice(t);
                    }
                }
            }
        }
        Ok(false)
    }
}

/// How [`Grammar::emit`] writes: whole or up to the body, edited or not.
#[derive(Clone, Copy, Default)]
pub(crate) struct Emit<'a> {
    pub(crate) head_only: bool,
    pub(crate) edit: Option<(&'a Forward, &'a ForwardContext<'a>)>,
}

impl Forward {
    /// Whether `%forward` leaves out the element at `elem`.
    pub(crate) fn drops(&self, slots: &[Slot], elem: usize, data: &[u8]) -> bool {
        self.drop.iter().any(|(field, names)| {
            let v = bytes_of(slots[elem + *field as usize], data);
            names.iter().any(|n| n.eq_ignore_ascii_case(v))
        })
    }

    /// Writes the elements `%forward` adds.
    pub(crate) fn append(
        &self,
        slots: &[Slot],
        data: &[u8],
        cx: &ForwardContext,
        out: &mut Vec<u8>,
    ) {
        let env = Env {
            slots,
            base: 0,
            data,
            dollar: Val::Unset,
            dollar_base: 0,
            context: 0,
            limits: &[],
            streamed: 0,
        };
        for add in &self.add {
            let on = match &add.when {
                When::Always => true,
                When::SessionEnds(v) => cx.session_ends == *v,
                When::Expr(e) => matches!(env.eval(e), Ok(Val::Int(x)) if x != 0),
            };
            if !on {
                continue;
            }
            for p in &add.parts {
                match p {
                    AddPart::PeerAddress => out.extend_from_slice(cx.peer_address),
                    AddPart::Expr(e) => match env.eval(e) {
                        Ok(Val::Bytes(b)) => out.extend_from_slice(b),
                        Ok(Val::Int(x)) if x < 0 => {
                            out.push(b'-');
                            write_int(out, x.unsigned_abs() as u64, false)
                        }
                        Ok(Val::Int(x)) => write_int(out, x as u64, false),
                        _ => {}
                    },
                }
            }
        }
    }
}

/// `count` instances of `block`, the first at `first`, `stride` apart.
#[derive(Clone, Copy)]
struct Nested {
    block: BlockId,
    first: usize,
    stride: usize,
    count: usize,
}

impl Nested {
    fn bases(self) -> impl Iterator<Item = usize> {
        (0..self.count).map(move |i| self.first + i * self.stride)
    }
}

/// An integer slot as a signed value (unsigned ones above `i64::MAX`
/// wrap, and are written back bit for bit).
fn int_of(v: Slot) -> i64 {
    match v {
        Slot::Int(x) => x as i64,
        Slot::SInt(x) => x,
        _ => 0,
    }
}

fn bytes_of(v: Slot, data: &[u8]) -> &[u8] {
    match v {
        Slot::Bytes { start, len } => data
            .get(start as usize..(start + len) as usize)
            .unwrap_or(&[]),
        _ => &[],
    }
}

fn emit_scalar(
    op: &Op,
    s: &Scalar,
    v: Slot,
    data: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    match s {
        Scalar::Int { bytes, order, .. } => {
            let x = int_of(v) as u64;
            let be = x.to_be_bytes();
            let n = *bytes as usize;
            match order {
                ByteOrder::Big => out.extend_from_slice(&be[8 - n..]),
                ByteOrder::Little => out.extend(be[8 - n..].iter().rev()),
            }
        }
        Scalar::Bytes { len, max } => {
            let b = bytes_of(v, data);
            if b.len() > *max as usize {
                return Err(Grammar::err(
                    op,
                    WireErrorKind::TooLong { max: *max as u64 },
                    out.len(),
                ));
            }
            // A token must not end early when parsed back (a key with a space).
            if let Len::BeforeAny(set, also) = len {
                if b.is_empty()
                    || b.iter().any(|c| set.contains(c))
                    || (!also.is_empty() && b.windows(also.len()).any(|w| w == &also[..]))
                {
                    return Err(Grammar::err(op, WireErrorKind::Invalid, out.len()));
                }
            }
            // What an anonymous `&while_any` skipped is not written (HTTP's
            // empty lines before a request line); a named one writes what
            // it holds (Memcached's spaces between tokens).
            if let (Len::WhileAny(_), "_") = (len, &*op.field) {
                return Ok(());
            }
            out.extend_from_slice(b);
            if let Len::Until(d) = len {
                out.extend_from_slice(d);
            }
        }
        Scalar::AsciiInt {
            until,
            hex,
            before,
            signed,
            ..
        } => {
            let x = int_of(v);
            if *signed && x < 0 {
                out.push(b'-');
                write_int(out, x.unsigned_abs(), *hex);
            } else {
                write_int(out, x as u64, *hex);
            }
            // `&before_any` bytes belong to the next field.
            if !before {
                out.extend_from_slice(until);
            }
        }
        Scalar::VInt => write_vlong(out, int_of(v)),
        Scalar::Literal { bytes, .. } => match v {
            Slot::Bytes { .. } => out.extend_from_slice(bytes_of(v, data)),
            _ => out.extend_from_slice(bytes),
        },
        Scalar::Ws => out.extend_from_slice(bytes_of(v, data)),
    }
    Ok(())
}

fn write_int(out: &mut Vec<u8>, mut x: u64, hex: bool) {
    let radix = if hex { 16 } else { 10 };
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b"0123456789abcdef"[(x % radix) as usize];
        x /= radix;
        if x == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Hadoop's `WritableUtils.writeVLong`.
pub fn write_vlong(out: &mut Vec<u8>, v: i64) {
    if (-112..=127).contains(&v) {
        out.push(v as u8);
        return;
    }
    let mut len: i32 = -112;
    let mut i = v;
    if i < 0 {
        i = !i;
        len = -120;
    }
    let mut tmp = i;
    while tmp != 0 {
        tmp >>= 8;
        len -= 1;
    }
    out.push(len as i8 as u8);
    let n = if len < -120 {
        -(len + 120)
    } else {
        -(len + 112)
    };
    for idx in (0..n).rev() {
        out.push((i >> (8 * idx)) as u8);
    }
}

/// A message being built by a program, with its own byte store. Reusable:
/// [`Builder::clear`] keeps the allocations.
pub struct Builder {
    pub(crate) grammar: Arc<Grammar>,
    pub(crate) unit: UnitId,
    pub slots: Vec<Slot>,
    pub data: Vec<u8>,
}

impl Builder {
    pub fn new(grammar: Arc<Grammar>, unit: UnitId) -> Builder {
        let n = grammar.units[unit].slots as usize;
        Builder {
            grammar,
            unit,
            slots: vec![Slot::Unset; n],
            data: Vec::new(),
        }
    }

    pub fn clear(&mut self) {
        self.slots.fill(Slot::Unset);
        self.data.clear();
    }

    fn slot(&self, name: &str) -> Option<usize> {
        self.grammar.units[self.unit]
            .fields
            .iter()
            .find(|f| f.name == name)
            .map(|f| f.slot as usize)
    }

    /// Sets a top-level integer field; `false` if there is no such field.
    pub fn set_int(&mut self, name: &str, v: i128) -> bool {
        let Some(at) = self.slot(name) else {
            return false;
        };
        self.slots[at] = if v < 0 {
            Slot::SInt(v as i64)
        } else {
            Slot::Int(v as u64)
        };
        true
    }

    /// Sets a top-level bytes field; `false` if there is no such field.
    pub fn set_bytes(&mut self, name: &str, v: &[u8]) -> bool {
        let Some(at) = self.slot(name) else {
            return false;
        };
        self.slots[at] = Slot::Bytes {
            start: self.data.len() as u32,
            len: v.len() as u32,
        };
        self.data.extend_from_slice(v);
        true
    }

    /// Copies every slot of a parsed message, whose bytes are `buf`.
    pub fn copy_from(&mut self, parsed: &[Slot], buf: &[u8]) {
        self.clear();
        self.data.extend_from_slice(buf);
        self.slots.copy_from_slice(parsed);
    }

    pub fn serialize(&mut self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let g = self.grammar.clone();
        g.serialize(self.unit, &mut self.slots, &self.data, out)
    }
}
