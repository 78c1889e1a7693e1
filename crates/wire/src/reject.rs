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

    /// What a proxy sends on, in place of a request of `unit` that did not
    /// parse, so that the backend ends as the server alone would have
    /// (memcached drops the old item of a `set` too large to store):
    /// `%reject_send`, a string evaluated over what parsed of the request,
    /// with each `{FIELD}` in it replaced by that bytes field of the unit,
    /// and each `{FIELD:be16}` (or `+N` after the name, and `be8`..`be64`,
    /// `le8`..`le64`) by that integer field plus `N` in that width and byte
    /// order (a binary header's lengths), appended to `out`. `false`, with
    /// `out` as it was, where the unit has none, it is empty for this
    /// request, or a field it names has no value of that kind (or one that
    /// does not fit its width).
    pub fn reject_send(
        &self,
        unit: UnitId,
        slots: &[Slot],
        bytes: &[u8],
        out: &mut Vec<u8>,
    ) -> bool {
        let info = &self.units[unit];
        let Some((_, e)) = info.properties.iter().find(|(n, _)| n == "reject_send") else {
            return false;
        };
        let env = eval::Env {
            slots,
            base: 0,
            data: bytes,
            dollar: eval::Val::Unset,
            dollar_base: 0,
            context: 0,
            limits: &self.limit_values,
            streamed: 0,
        };
        let Ok(eval::Val::Bytes(template)) = env.eval(e) else {
            return false;
        };
        if template.is_empty() {
            return false;
        }
        let was = out.len();
        let mut rest = template;
        while let Some(open) = rest.iter().position(|b| *b == b'{') {
            out.extend_from_slice(&rest[..open]);
            let Some(close) = rest[open..].iter().position(|b| *b == b'}') else {
                out.truncate(was);
                return false;
            };
            let spec = &rest[open + 1..open + close];
            let (name, encoding) = match spec.iter().position(|b| *b == b':') {
                Some(colon) => (&spec[..colon], Some(&spec[colon + 1..])),
                None => (spec, None),
            };
            let (name, added) = match name.iter().position(|b| *b == b'+') {
                Some(plus) => (&name[..plus], Some(&name[plus + 1..])),
                None => (name, None),
            };
            let slot = info
                .fields
                .iter()
                .find(|f| f.name.as_bytes() == name)
                .and_then(|f| slots.get(f.slot as usize));
            let written = match (slot, encoding) {
                (Some(Slot::Bytes { start, len }), None) if added.is_none() => bytes
                    .get(*start as usize..(*start + *len) as usize)
                    .map(|value| out.extend_from_slice(value))
                    .is_some(),
                (Some(Slot::Int(n)), Some(encoding)) => {
                    let added = match added {
                        Some(digits) => parse_decimal(digits),
                        None => Some(0),
                    };
                    match (added.and_then(|a| n.checked_add(a)), int_encoding(encoding)) {
                        (Some(n), Some((width, big))) => put_uint(n, width, big, out),
                        _ => false,
                    }
                }
                _ => false,
            };
            if !written {
                out.truncate(was);
                return false;
            }
            rest = &rest[open + close + 1..];
        }
        out.extend_from_slice(rest);
        true
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

/// A decimal number of a `%reject_send` template (`{key_len+8:be32}`).
fn parse_decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// An integer encoding of a `%reject_send` template: its width in bytes,
/// and whether it is big-endian.
fn int_encoding(name: &[u8]) -> Option<(usize, bool)> {
    let (big, bits) = match name {
        [b'b', b'e', bits @ ..] => (true, bits),
        [b'l', b'e', bits @ ..] => (false, bits),
        _ => return None,
    };
    let width = match bits {
        b"8" => 1,
        b"16" => 2,
        b"32" => 4,
        b"64" => 8,
        _ => return None,
    };
    Some((width, big))
}

/// `n` in `width` bytes appended to `out`; `false` where it does not fit.
fn put_uint(n: u64, width: usize, big: bool, out: &mut Vec<u8>) -> bool {
    if width < 8 && n >> (width * 8) != 0 {
        return false;
    }
    let all = if big {
        n.to_be_bytes()
    } else {
        n.to_le_bytes()
    };
    if big {
        out.extend_from_slice(&all[8 - width..]);
    } else {
        out.extend_from_slice(&all[..width]);
    }
    true
}
