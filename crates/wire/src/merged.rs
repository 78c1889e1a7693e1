//! Replies of a request sent to every peer (`%broadcast`) merged entry by
//! entry, for requests that ask for it (`%merge`): a reply that names an
//! entry (`%merge_key`, Memcached's `STAT <name> <value>`) is one entry of
//! the merged reply, which has one entry per key; where `%merge_sum` holds
//! for an entry, the peers' numbers (`%merge_value`, decimal) are added,
//! and elsewhere the first peer's entry stands (a server's process id, its
//! clock, its version).

use crate::program::{CExpr, Slot, UnitId};
use crate::{eval, Grammar, WireError};

impl Grammar {
    fn merge_expr(&self, unit: UnitId, name: &str) -> Option<&CExpr> {
        self.units[unit]
            .properties
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, e)| e)
    }

    /// The key of a reply of `unit` that is an entry of a merged reply
    /// (`%merge_key`): `None` where the unit has none, or the reply no key.
    pub fn merge_key<'a>(&self, unit: UnitId, slots: &[Slot], bytes: &'a [u8]) -> Option<&'a [u8]> {
        let CExpr::Slot(slot) = self.merge_expr(unit, "merge_key")? else {
            return None;
        };
        field_bytes(slots, bytes, *slot).filter(|b| !b.is_empty())
    }

    /// `entry` (a reply of `unit`, the first peer's) with `other`'s number
    /// added to its own, serialised to `out`, where `%merge_sum` holds for
    /// `entry` and both numbers are decimal; `Ok(false)`, writing nothing,
    /// where the first peer's entry stands as it is.
    pub fn merge_add(
        &self,
        unit: UnitId,
        entry: (&[Slot], &[u8]),
        other: (&[Slot], &[u8]),
        out: &mut Vec<u8>,
    ) -> Result<bool, WireError> {
        let (Some(sum), Some(value)) = (
            self.merge_expr(unit, "merge_sum"),
            self.merge_expr(unit, "merge_value"),
        ) else {
            return Ok(false);
        };
        let env = eval::Env {
            slots: entry.0,
            base: 0,
            data: entry.1,
            dollar: eval::Val::Unset,
            dollar_base: 0,
            context: 0,
            limits: &self.limit_values,
            streamed: 0,
        };
        if !env.truthy(sum).unwrap_or(false) {
            return Ok(false);
        }
        let CExpr::Slot(slot) = value else {
            return Ok(false);
        };
        let number = |slots: &[Slot], bytes: &[u8]| -> Option<u64> {
            let b = field_bytes(slots, bytes, *slot)?;
            if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
                return None;
            }
            std::str::from_utf8(b).ok()?.parse().ok()
        };
        let (Some(a), Some(b)) = (number(entry.0, entry.1), number(other.0, other.1)) else {
            return Ok(false);
        };
        // The merged number goes after the entry's bytes, and the entry is
        // written again with it (a binary reply's lengths recomputed).
        let mut data = entry.1.to_vec();
        let digits = a.saturating_add(b).to_string();
        let start = data.len() as u32;
        data.extend_from_slice(digits.as_bytes());
        let mut slots = entry.0.to_vec();
        slots[*slot as usize] = Slot::Bytes {
            start,
            len: digits.len() as u32,
        };
        self.serialize(unit, &mut slots, &data, out)?;
        Ok(true)
    }
}

/// The bytes of a field's slot.
fn field_bytes<'a>(slots: &[Slot], bytes: &'a [u8], slot: u16) -> Option<&'a [u8]> {
    match slots.get(slot as usize)? {
        Slot::Bytes { start, len } => bytes.get(*start as usize..(*start as usize + *len as usize)),
        _ => None,
    }
}
