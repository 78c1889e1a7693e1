//! Requests that do not parse, for protocols that answer them and read on
//! (Memcached's text protocol answers `ERROR` and takes the next line):
//! `%reject` on the reply unit says what the answer is, `%resync` on the
//! request unit where the next request starts. Also the fence a proxy
//! writes after a request that may get no reply (`%fence`), so that it
//! knows where that request's replies end.

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
        let unset = vec![Slot::Unset; self.units[unit].slots as usize];
        self.reject_reply_to(unit, &unset, &[], status, out)
    }

    /// `reject_reply` for a request of `unit` itself that parsed but is
    /// refused (`%refuse`): the reply starts from the request's values, as
    /// `%fault`'s does (a binary reply echoes the opcode and opaque).
    pub fn reject_reply_to(
        &self,
        unit: UnitId,
        slots: &[Slot],
        bytes: &[u8],
        status: Option<u16>,
        out: &mut Vec<u8>,
    ) -> Result<bool, WireError> {
        let info = &self.units[unit];
        if info.reject.is_empty() {
            return Ok(false);
        }
        let dollar = status.map_or(eval::Val::Unset, |s| eval::Val::Int(s as i128));
        self.assign(unit, &info.reject, "%reject", slots, bytes, dollar, out)?;
        Ok(true)
    }

    /// Where reading resumes after a request of `unit` that did not parse:
    /// just past the next occurrence of these bytes (`%resync`); `None` if
    /// the connection cannot recover.
    pub fn resync(&self, unit: UnitId) -> Option<&[u8]> {
        self.bytes_property(unit, "resync")
    }

    /// What a proxy writes after a quiet request of `unit` (`%fence`): a
    /// request that is always answered, so the quiet request's replies,
    /// if any, are those before the fence's reply (`%fenced`); `None` if
    /// the unit has none.
    pub fn fence(&self, unit: UnitId) -> Option<&[u8]> {
        self.bytes_property(unit, "fence")
    }

    /// A property of `unit` whose value is a string literal.
    fn bytes_property(&self, unit: UnitId, name: &str) -> Option<&[u8]> {
        self.units[unit]
            .properties
            .iter()
            .find_map(|(n, e)| match e {
                CExpr::Str(s) if n == name => Some(&s[..]),
                _ => None,
            })
    }
}
