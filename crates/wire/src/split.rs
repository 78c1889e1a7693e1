//! `%split = self.LIST;`: a request that carries a list (Memcached's
//! `get k1 k2 ...`) is handled as one request per element, each with the
//! list reduced to that element, so that a proxy can send each part where
//! its own key says.

use crate::program::{CExpr, ListRef, Slot, UnitId};
use crate::{Grammar, WireError};

impl Grammar {
    fn split_list(&self, unit: UnitId) -> Option<ListRef> {
        self.units[unit]
            .properties
            .iter()
            .find_map(|(n, e)| match e {
                CExpr::List(l) if n == "split" => Some(*l),
                _ => None,
            })
    }

    /// How many requests a message of `unit` is handled as: the length of
    /// the list its `%split` names when that is more than one, else 1.
    pub fn split_parts(&self, unit: UnitId, slots: &[Slot]) -> usize {
        let Some(l) = self.split_list(unit) else {
            return 1;
        };
        match slots.get(l.slot as usize) {
            Some(Slot::Count(n)) if *n > 1 => *n as usize,
            _ => 1,
        }
    }

    /// Part `i` of a message that splits: its values with the `%split`
    /// list reduced to element `i`, serialised to `out`. `scratch` holds
    /// the part's values, so that splitting allocates nothing once warm.
    pub fn split_part(
        &self,
        unit: UnitId,
        slots: &[Slot],
        bytes: &[u8],
        i: usize,
        scratch: &mut Vec<Slot>,
        out: &mut Vec<u8>,
    ) -> Result<(), WireError> {
        scratch.clear();
        scratch.extend_from_slice(slots);
        if let Some(l) = self.split_list(unit) {
            let (at, n) = (l.slot as usize + 1, l.elem_slots as usize);
            if at + (i + 1) * n <= scratch.len() {
                scratch[at - 1] = Slot::Count(1);
                scratch.copy_within(at + i * n..at + (i + 1) * n, at);
            }
        }
        self.serialize(unit, scratch, bytes, out)
    }
}
