//! Plain integer fields: fixed-width integers that nothing else in their
//! unit reads or constrains, so that serialising any value into one and
//! parsing it back gives the value truncated to the field's width, and
//! the rest of the message parses as before.
//!
//! A program that folds values into such a field (`foldt` summing a
//! count) may keep the running value itself and build the message once,
//! where building and reading back a message at every step would give the
//! same values.

use crate::program::{CExpr, Elem, Len, Op, OpKind, Scalar, Stop, UnitId};
use crate::Grammar;

/// How a plain integer field holds a value: its width and signedness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlainInt {
    pub bytes: u8,
    pub signed: bool,
}

impl PlainInt {
    /// `v` as it reads back after being written into the field.
    #[inline]
    pub fn wrap(self, v: i64) -> i64 {
        if self.bytes >= 8 {
            return v;
        }
        let shift = 64 - 8 * self.bytes as u32;
        match self.signed {
            true => (v << shift) >> shift,
            false => ((v as u64) << shift >> shift) as i64,
        }
    }
}

impl Grammar {
    /// The field at `slot` of `unit`, if it is a plain integer: a
    /// fixed-width integer, set by one operation of the unit, without
    /// `&requires`, that no expression of the unit (lengths, variables,
    /// switches, conditions, properties, `%end`, `%fault`, `%reject`)
    /// reads. Units with nested units or lists are not looked into.
    pub fn plain_int(&self, unit: UnitId, slot: u16) -> Option<PlainInt> {
        let info = self.units.get(unit)?;
        let mut found = None;
        let mut setters = 0;
        let mut stack = vec![info.block];
        let mut seen = 0;
        while let Some(b) = stack.pop() {
            seen += 1;
            if seen > 256 {
                return None;
            }
            for op in self.blocks.get(b as usize)? {
                if reads(op, slot)? {
                    return None;
                }
                let sets = op.slot == Some(slot) && !matches!(op.kind, OpKind::SerializeVar { .. });
                if sets && op.requires.is_some() {
                    return None;
                }
                match &op.kind {
                    OpKind::Switch { cases, default, .. } => {
                        stack.extend(cases.iter().map(|(_, b)| *b).chain(*default));
                    }
                    OpKind::Unit { .. } | OpKind::List { .. } => return None,
                    OpKind::SerializeVar { target, .. } if *target == slot => return None,
                    OpKind::Scalar(Scalar::Int { bytes, signed, .. }) if sets => {
                        found = Some(PlainInt {
                            bytes: *bytes,
                            signed: *signed,
                        });
                    }
                    _ => {}
                }
                setters += usize::from(sets);
            }
        }
        let exprs = info
            .fault
            .iter()
            .chain(&info.end)
            .chain(&info.reject)
            .map(|(_, e)| e)
            .chain(info.properties.iter().map(|(_, e)| e));
        for e in exprs {
            if mentions(e, slot) {
                return None;
            }
        }
        if info.forward.is_some() || setters != 1 {
            return None;
        }
        found
    }
}

/// Whether `op` reads `slot` in an expression of its own (`None` for an
/// operation this does not look into).
fn reads(op: &Op, slot: u16) -> Option<bool> {
    let mut any = op.requires.as_ref().is_some_and(|e| mentions(e, slot));
    match &op.kind {
        OpKind::Scalar(s) => any |= scalar_reads(s, slot),
        OpKind::Var(e) => any |= mentions(e, slot),
        OpKind::Switch { on, cases, .. } => {
            any |= mentions(on, slot) || cases.iter().any(|(c, _)| mentions(c, slot));
        }
        OpKind::SerializeVar { var, expr, .. } => any |= *var == slot || mentions(expr, slot),
        OpKind::List { elem, stop, .. } => {
            any |= match stop {
                Stop::Count(e) | Stop::UntilElem(e) => mentions(e, slot),
                Stop::Until(_) | Stop::UntilEither(..) => false,
            };
            if let Elem::Scalar(s) = elem {
                any |= scalar_reads(s, slot);
            }
        }
        OpKind::Unit { .. } | OpKind::Mark => {}
    }
    Some(any)
}

fn scalar_reads(s: &Scalar, slot: u16) -> bool {
    match s {
        Scalar::Bytes {
            len: Len::Expr(e), ..
        } => mentions(e, slot),
        _ => false,
    }
}

fn mentions(e: &CExpr, slot: u16) -> bool {
    match e {
        CExpr::Slot(s) => *s == slot,
        // A list reads from its count slot on: conservatively, any slot.
        CExpr::List(_) | CExpr::DollarField(_) | CExpr::ElemField(_) => true,
        CExpr::Unary(_, a) => mentions(a, slot),
        CExpr::Binary(_, a, b) => mentions(a, slot) || mentions(b, slot),
        CExpr::Call(_, args) => args.iter().any(|a| mentions(a, slot)),
        CExpr::Int(_) | CExpr::Str(_) | CExpr::Dollar => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_as_the_field_reads_back() {
        let i32f = PlainInt {
            bytes: 4,
            signed: true,
        };
        assert_eq!(i32f.wrap(i32::MAX as i64 + 1), i32::MIN as i64);
        assert_eq!(i32f.wrap(-5), -5);
        let u16f = PlainInt {
            bytes: 2,
            signed: false,
        };
        assert_eq!(u16f.wrap(65537), 1);
        assert_eq!(u16f.wrap(-1), 65535);
    }

    #[test]
    fn hadoop_values_are_plain_and_lengths_are_not() {
        let g = Grammar::stock("hadoop_ifile").unwrap();
        let kv = g.unit_id("kv").unwrap();
        let slot = |name| g.field_slot(kv, name).unwrap();
        assert_eq!(
            g.plain_int(kv, slot("value")),
            Some(PlainInt {
                bytes: 4,
                signed: true
            })
        );
        // Read by `&requires`, `%ends` and the key's length.
        assert_eq!(g.plain_int(kv, slot("key_len")), None);
        assert_eq!(g.plain_int(kv, slot("key")), None);
    }

    #[test]
    fn a_constrained_integer_is_not_plain() {
        let g = Grammar::from_source(
            "t",
            "grammar t; type u = unit { a : uint16 &requires = $$ > 1; b : uint8; c : bytes &length = self.b; };",
        )
        .unwrap();
        let u = g.unit_id("u").unwrap();
        assert_eq!(g.plain_int(u, g.field_slot(u, "a").unwrap()), None);
        assert_eq!(g.plain_int(u, g.field_slot(u, "b").unwrap()), None);
    }
}
