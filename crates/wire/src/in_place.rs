//! Fields read in place: which fields of a unit lie at a fixed offset
//! from its start, so that a parser may leave them in the message's bytes
//! and a reader decode them when asked (a packet header's addresses and
//! ports, a Memcached header's lengths).
//!
//! They are the unit's leading run of fixed-width fields (unsigned
//! integers and bytes of a constant length), with the variables that copy
//! one of those integers or take a bit field of it. The run ends at the
//! first item whose width is not known when the grammar loads: a switch,
//! a list, a nested unit, bytes of a computed length.

use crate::grammar::ast::ByteOrder;
use crate::int_expr::fold;
use crate::plan::{val_expr, ValExpr};
use crate::program::{CExpr, FieldKind, Fixed, FixedKind, Len, Op, OpKind, Scalar, UnitInfo};

/// The fields of `ops` (a unit's block) that can be read in place, by
/// slot: their offset from the unit's start and how to decode them; and
/// the length of the run they lie in, which every message of the unit
/// holds whole.
pub(crate) fn leading_fixed(ops: &[Op], blocks: &[Vec<Op>]) -> (Vec<(u16, u16, FixedKind)>, u16) {
    let mut out = Vec::new();
    let mut ints: Vec<(u16, u16, u8, bool)> = Vec::new();
    let mut offset: u32 = 0;
    for op in ops {
        if op.stream || offset > u16::MAX as u32 {
            break;
        }
        let at = offset as u16;
        match &op.kind {
            OpKind::Scalar(Scalar::Int {
                bytes,
                signed,
                order,
            }) => {
                let little = matches!(order, ByteOrder::Little);
                if let (Some(s), false, 1..=8) = (op.slot, *signed, *bytes) {
                    ints.push((s, at, *bytes, little));
                    out.push((s, at, int(*bytes, little, 0, u64::MAX)));
                }
                offset += *bytes as u32;
            }
            OpKind::Scalar(Scalar::Bytes {
                len: Len::Expr(e), ..
            }) => {
                let CExpr::Int(n @ 0..=0xffff) = fold(e) else {
                    break;
                };
                if let Some(s) = op.slot {
                    out.push((s, at, FixedKind::Bytes { len: n as u16 }));
                }
                offset += n as u32;
            }
            OpKind::Var(e) => {
                let (from, shift, mask) = match val_expr(e) {
                    ValExpr::Slot(from) => (from, 0, u64::MAX),
                    ValExpr::Bits {
                        slot, shift, mask, ..
                    } => (slot, shift, mask),
                    _ => continue,
                };
                let source = ints.iter().find(|i| i.0 == from);
                if let (Some(s), Some(&(_, at, width, little))) = (op.slot, source) {
                    if shift < 64 {
                        out.push((s, at, int(width, little, shift as u8, mask)));
                    }
                }
            }
            OpKind::SerializeVar { .. } => {}
            _ => break,
        }
    }
    // A slot that something else in the unit also sets (a variable of the
    // same name in a switch case) is not the field's alone.
    out.retain(|(s, ..)| setters(ops, blocks, *s, 0) == 1);
    (out, offset.min(u16::MAX as u32) as u16)
}

fn int(width: u8, little: bool, shift: u8, mask: u64) -> FixedKind {
    let full = if width >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * width)) - 1
    };
    FixedKind::Int {
        width,
        little,
        shift,
        mask: mask & (full >> shift.min(63)),
    }
}

/// How many operations of `ops` and of its switch cases store `slot`.
fn setters(ops: &[Op], blocks: &[Vec<Op>], slot: u16, depth: usize) -> usize {
    if depth > 64 {
        return usize::MAX / 2;
    }
    ops.iter()
        .map(|op| {
            // `&serialize` sets its target only when serialising.
            let parses = !matches!(op.kind, OpKind::SerializeVar { .. });
            let own = usize::from(parses && op.slot == Some(slot));
            let inner = match &op.kind {
                OpKind::Switch { cases, default, .. } => cases
                    .iter()
                    .map(|(_, b)| *b)
                    .chain(*default)
                    .map(|b| setters(&blocks[b as usize], blocks, slot, depth + 1))
                    .sum(),
                _ => 0,
            };
            own + inner
        })
        .sum()
}

/// Decodes a field read in place from `data`, given where its unit
/// begins; `None` if the bytes are not there.
#[inline]
pub(crate) fn decode(kind: FixedKind, at: usize, data: &[u8]) -> Option<crate::Slot> {
    Some(match kind {
        FixedKind::Int {
            width,
            little,
            shift,
            mask,
        } => {
            let raw = data.get(at..at + width as usize)?;
            let v = if little {
                raw.iter().rev().fold(0u64, |v, b| v << 8 | *b as u64)
            } else {
                raw.iter().fold(0u64, |v, b| v << 8 | *b as u64)
            };
            crate::Slot::Int((v >> shift) & mask)
        }
        FixedKind::Bytes { len } => {
            data.get(at..at + len as usize)?;
            crate::Slot::Bytes {
                start: at as u32,
                len: len as u32,
            }
        }
    })
}

/// Per slot of `unit`'s layout, nested units included, the field read in
/// place there, with its start slot counted in the same layout; empty if
/// there is none.
pub(crate) fn layout(units: &[UnitInfo], unit: usize) -> Box<[Option<Fixed>]> {
    fn walk(units: &[UnitInfo], unit: usize, base: usize, depth: usize, out: &mut [Option<Fixed>]) {
        if depth > 64 {
            return;
        }
        for f in &units[unit].fields {
            let at = base + f.slot as usize;
            match (f.kind.clone(), f.fixed) {
                (FieldKind::Unit(u), _) => walk(units, u, at, depth + 1, out),
                (_, Some(x)) => {
                    if let Some(o) = out.get_mut(at) {
                        *o = Some(Fixed {
                            start: (base + x.start as usize) as u16,
                            ..x
                        });
                    }
                }
                _ => {}
            }
        }
    }
    let mut out = vec![None; units[unit].slots as usize];
    walk(units, unit, 0, 0, &mut out);
    if out.iter().all(Option::is_none) {
        return Box::new([]);
    }
    out.into()
}
