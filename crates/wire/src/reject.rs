//! Requests that do not parse, for protocols that answer them and read on
//! (Memcached's text protocol answers `ERROR` and takes the next line):
//! `%reject` on the reply unit says what the answer is, `%resync` on the
//! request unit where the next request starts.

use crate::program::{CExpr, Slot, UnitId};
use crate::{eval, Grammar, WireError};

impl Grammar {
    /// The reply to a request that did not parse, from reply unit `unit`'s
    /// `%reject` (where `$$` is the status of the request's error, say 431
    /// for HTTP headers too large), serialised to `out`; `false` if it has
    /// none.
    pub fn reject_reply(
        &self,
        unit: UnitId,
        status: Option<u16>,
        out: &mut Vec<u8>,
    ) -> Result<bool, WireError> {
        let info = &self.units[unit];
        if info.reject.is_empty() {
            return Ok(false);
        }
        let unset = vec![Slot::Unset; info.slots as usize];
        let dollar = status.map_or(eval::Val::Unset, |s| eval::Val::Int(s as i128));
        self.assign(unit, &info.reject, "%reject", &unset, &[], dollar, out)?;
        Ok(true)
    }

    /// Where reading resumes after a request of `unit` that did not parse:
    /// just past the next occurrence of these bytes (`%resync`); `None` if
    /// the connection cannot recover.
    pub fn resync(&self, unit: UnitId) -> Option<&[u8]> {
        self.units[unit]
            .properties
            .iter()
            .find_map(|(n, e)| match e {
                CExpr::Str(s) if n == "resync" => Some(&s[..]),
                _ => None,
            })
    }
}
