//! Routing properties looked up once and read per message: where a
//! property compares a field with a constant (`%ends = self.key_len ==
//! -1`), reading it costs one comparison, not an expression walk.

use crate::grammar::ast::BinOp;
use crate::program::{CExpr, Slot, UnitId};
use crate::Grammar;

/// A property of a unit (see [`Grammar::property`]), found by name once.
#[derive(Clone, Debug)]
pub struct PropertyRef {
    unit: UnitId,
    index: usize,
    /// `slot == constant` (or `!=`, when the flag is false).
    compare: Option<(u16, i128, bool)>,
}

impl Grammar {
    /// Unit `unit`'s property `name`, if it declares one.
    pub fn property_ref(&self, unit: UnitId, name: &str) -> Option<PropertyRef> {
        let index = self
            .units
            .get(unit)?
            .properties
            .iter()
            .position(|(n, _)| n == name)?;
        let e = crate::int_expr::fold(&self.units[unit].properties[index].1);
        let compare = match &e {
            CExpr::Binary(op @ (BinOp::Eq | BinOp::Ne), a, b) => match (&**a, &**b) {
                (CExpr::Slot(s), CExpr::Int(c)) | (CExpr::Int(c), CExpr::Slot(s)) => {
                    Some((*s, *c, *op == BinOp::Eq))
                }
                _ => None,
            },
            _ => None,
        };
        Some(PropertyRef {
            unit,
            index,
            compare,
        })
    }

    /// The value of property `p` for a parsed message, as
    /// [`Grammar::property`] gives it.
    #[inline]
    pub fn property_at(&self, p: &PropertyRef, slots: &[Slot], bytes: &[u8]) -> Option<i128> {
        if let Some((s, c, eq)) = p.compare {
            let v = match slots.get(s as usize) {
                Some(Slot::Int(v)) => Some(*v as i128),
                Some(Slot::SInt(v)) => Some(*v as i128),
                _ => None,
            };
            if let Some(v) = v {
                return Some(i128::from((v == c) == eq));
            }
        }
        let env = crate::eval::Env {
            slots,
            base: 0,
            data: bytes,
            dollar: crate::eval::Val::Unset,
            dollar_base: 0,
            context: 0,
            limits: &[],
            streamed: 0,
        };
        env.int(&self.units[p.unit].properties[p.index].1).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compared_field_reads_as_the_expression_does() {
        let g = Grammar::stock("hadoop_ifile").unwrap();
        let kv = g.unit_id("kv").unwrap();
        let p = g.property_ref(kv, "ends").unwrap();
        assert!(p.compare.is_some());
        let key_len = g.field_slot(kv, "key_len").unwrap() as usize;
        let n = g.unit(kv).slots as usize;
        for (slot, want) in [
            (Slot::SInt(-1), Some(1)),
            (Slot::Int(3), Some(0)),
            (Slot::Unset, None),
        ] {
            let mut slots = vec![Slot::Unset; n];
            slots[key_len] = slot;
            let general = g.property(kv, "ends", &slots, &[]);
            assert_eq!(g.property_at(&p, &slots, &[]), general);
            if want.is_some() {
                assert_eq!(general, want);
            }
        }
        assert!(g.property_ref(kv, "broadcast").is_none());
    }
}
