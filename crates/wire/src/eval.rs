//! Evaluation of grammar expressions over value slots. Allocation-free:
//! values borrow from the message bytes or from the grammar's literals.

use crate::grammar::ast::{BinOp, UnOp};
use crate::program::{Builtin, CExpr, Slot};

/// A value of a grammar expression.
#[derive(Clone, Copy, Debug)]
pub enum Val<'a> {
    Int(i128),
    Bytes(&'a [u8]),
    List {
        count: u32,
        base: usize,
        elem_slots: u16,
    },
    /// An unset slot (a field of a switch case not taken).
    Unset,
}

/// Why an expression has no value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EvalFail;

pub(crate) struct Env<'a> {
    pub slots: &'a [Slot],
    pub base: usize,
    pub data: &'a [u8],
    pub dollar: Val<'a>,
    /// Base of the list element `$$.field` refers to.
    pub dollar_base: usize,
    /// `reply_context()`: what the request being answered said of its
    /// reply (its `%reply_context`), 0 where there is none.
    pub context: i128,
    /// `limit(..)`: the grammar's limits as set, by index (empty where
    /// none are known: each then has its default).
    pub limits: &'a [i128],
    /// `streamed()`: the `&stream` bytes of the message begun so far.
    pub streamed: u64,
}

pub(crate) fn slot_val<'a>(slots: &[Slot], data: &'a [u8], at: usize) -> Val<'a> {
    match slots.get(at) {
        Some(Slot::Int(v)) => Val::Int(*v as i128),
        Some(Slot::SInt(v)) => Val::Int(*v as i128),
        Some(Slot::Bytes { start, len }) => {
            let s = *start as usize;
            Val::Bytes(data.get(s..s + *len as usize).unwrap_or(&[]))
        }
        Some(Slot::Count(n)) => Val::Int(*n as i128),
        _ => Val::Unset,
    }
}

impl<'a> Env<'a> {
    pub fn eval(&self, e: &'a CExpr) -> Result<Val<'a>, EvalFail> {
        Ok(match e {
            CExpr::Int(v) => Val::Int(*v),
            CExpr::Str(s) => Val::Bytes(s),
            CExpr::Slot(s) => slot_val(self.slots, self.data, self.base + *s as usize),
            CExpr::List(l) => {
                let at = self.base + l.slot as usize;
                let count = match self.slots.get(at) {
                    Some(Slot::Count(n)) => *n,
                    _ => 0,
                };
                Val::List {
                    count,
                    base: at + 1,
                    elem_slots: l.elem_slots,
                }
            }
            CExpr::Dollar => self.dollar,
            CExpr::DollarField(s) => {
                slot_val(self.slots, self.data, self.dollar_base + *s as usize)
            }
            CExpr::ElemField(_) => return Err(EvalFail),
            CExpr::Unary(op, x) => {
                let v = self.int(x)?;
                match op {
                    UnOp::Not => Val::Int(i128::from(v == 0)),
                    UnOp::Neg => Val::Int(-v),
                }
            }
            CExpr::Binary(op, a, b) => Val::Int(self.binary(*op, a, b)?),
            CExpr::Call(f, args) => self.call(*f, args)?,
        })
    }

    pub fn int(&self, e: &'a CExpr) -> Result<i128, EvalFail> {
        // Integer-only nodes skip building a `Val` (the hot path of lengths
        // and `&requires` checks); the rest go through `eval`.
        if let Some(v) = self.int_quick(e) {
            return Ok(v);
        }
        match e {
            CExpr::Dollar => {
                if let Val::Int(v) = self.dollar {
                    return Ok(v);
                }
            }
            CExpr::Binary(op, a, b) => return self.binary(*op, a, b),
            CExpr::Unary(UnOp::Not, x) => return Ok(i128::from(self.int(x)? == 0)),
            CExpr::Unary(UnOp::Neg, x) => return Ok(-self.int(x)?),
            _ => {}
        }
        match self.eval(e)? {
            Val::Int(v) => Ok(v),
            Val::List { count, .. } => Ok(count as i128),
            _ => Err(EvalFail),
        }
    }

    pub fn truthy(&self, e: &'a CExpr) -> Result<bool, EvalFail> {
        Ok(self.int(e)? != 0)
    }

    /// Bytes of a value; an absent value (a header not sent) is empty.
    fn bytes(&self, e: &'a CExpr) -> Result<&'a [u8], EvalFail> {
        match self.eval(e)? {
            Val::Bytes(b) => Ok(b),
            Val::Unset => Ok(&[]),
            _ => Err(EvalFail),
        }
    }

    /// The value of a constant or of a set integer field, as `eval` gives
    /// it; `None` for anything else (which `eval` then reads).
    #[inline]
    fn int_quick(&self, e: &CExpr) -> Option<i128> {
        match e {
            CExpr::Int(v) => Some(*v),
            CExpr::Slot(s) => match self.slots.get(self.base + *s as usize) {
                Some(Slot::Int(v)) => Some(*v as i128),
                Some(Slot::SInt(v)) => Some(*v as i128),
                Some(Slot::Count(n)) => Some(*n as i128),
                _ => None,
            },
            _ => None,
        }
    }

    /// A binary operation; every operator yields an integer.
    fn binary(&self, op: BinOp, a: &'a CExpr, b: &'a CExpr) -> Result<i128, EvalFail> {
        if matches!(op, BinOp::And | BinOp::Or) {
            let x = self.truthy(a)?;
            return Ok(i128::from(match op {
                BinOp::And => x && self.truthy(b)?,
                _ => x || self.truthy(b)?,
            }));
        }
        if matches!(op, BinOp::Eq | BinOp::Ne) {
            // A field compared with a number (`self.opcode == Opcode::Get`,
            // most of a binary protocol's routing properties) needs no `Val`.
            let eq = match (self.int_quick(a), self.int_quick(b)) {
                (Some(x), Some(y)) => x == y,
                _ => equal(self.eval(a)?, self.eval(b)?)?,
            };
            return Ok(i128::from(eq == (op == BinOp::Eq)));
        }
        let x = self.int(a)?;
        let y = self.int(b)?;
        let v = match op {
            BinOp::Add => x.checked_add(y),
            BinOp::Sub => x.checked_sub(y),
            BinOp::Mul => x.checked_mul(y),
            BinOp::Div => x.checked_div(y),
            BinOp::Mod => x.checked_rem(y),
            BinOp::Lt => Some(i128::from(x < y)),
            BinOp::Le => Some(i128::from(x <= y)),
            BinOp::Gt => Some(i128::from(x > y)),
            BinOp::Ge => Some(i128::from(x >= y)),
            _ => unreachable!("handled above"),
        };
        v.ok_or(EvalFail)
    }

    /// Elements of a list whose `field` equals `key`, case-insensitively.
    fn matches(
        &self,
        list: &'a CExpr,
        field: &'a CExpr,
        key: &'a CExpr,
    ) -> Result<impl Iterator<Item = usize> + 'a, EvalFail> {
        let list = self.eval(list)?;
        let CExpr::ElemField(f) = field else {
            return Err(EvalFail);
        };
        let key = self.bytes(key)?;
        matching(self.slots, self.data, list, *f, key).ok_or(EvalFail)
    }

    fn call(&self, f: Builtin, args: &'a [CExpr]) -> Result<Val<'a>, EvalFail> {
        let bool = |b: bool| Ok(Val::Int(i128::from(b)));
        match f {
            Builtin::ReplyContext => Ok(Val::Int(self.context)),
            Builtin::Limit => match args {
                [CExpr::Int(i), CExpr::Int(default)] => Ok(Val::Int(
                    self.limits.get(*i as usize).copied().unwrap_or(*default),
                )),
                _ => Err(EvalFail),
            },
            Builtin::Streamed => Ok(Val::Int(self.streamed as i128)),
            Builtin::Choose => match self.truthy(&args[0])? {
                true => self.eval(&args[1]),
                false => self.eval(&args[2]),
            },
            Builtin::Len => match self.eval(&args[0])? {
                Val::Bytes(b) => Ok(Val::Int(b.len() as i128)),
                Val::List { count, .. } => Ok(Val::Int(count as i128)),
                _ => Err(EvalFail),
            },
            // An absent or empty value counts as 0; `is_dec` tells them apart.
            Builtin::ToInt => to_int(self.bytes(&args[0])?).map(Val::Int).ok_or(EvalFail),
            Builtin::HexToInt => parse_int(self.bytes(&args[0])?, 16).map(Val::Int),
            Builtin::IsDec => bool(parse_int(self.bytes(&args[0])?, 10).is_ok()),
            Builtin::IsHex => bool(parse_int(self.bytes(&args[0])?, 16).is_ok()),
            Builtin::EqNocase => bool(
                self.bytes(&args[0])?
                    .eq_ignore_ascii_case(self.bytes(&args[1])?),
            ),
            Builtin::LastTokenNocase => bool(last_token_nocase(
                self.bytes(&args[0])?,
                self.bytes(&args[1])?,
            )),
            Builtin::EndsWithWs => bool(matches!(self.bytes(&args[0])?.last(), Some(b' ' | b'\t'))),
            Builtin::StartsWithWs => {
                bool(matches!(self.bytes(&args[0])?.first(), Some(b' ' | b'\t')))
            }
            Builtin::IsToken => {
                let b = self.bytes(&args[0])?;
                bool(!b.is_empty() && b.iter().all(|c| is_tchar(*c)))
            }
            Builtin::HasTokenNocase => bool(has_token_nocase(
                self.bytes(&args[0])?,
                self.bytes(&args[1])?,
            )),
            Builtin::Before => Ok(Val::Bytes(before(
                self.bytes(&args[0])?,
                self.bytes(&args[1])?,
            ))),
            Builtin::After => Ok(Val::Bytes(after(
                self.bytes(&args[0])?,
                self.bytes(&args[1])?,
            ))),
            Builtin::Trim => Ok(Val::Bytes(trim(self.bytes(&args[0])?))),
            Builtin::CNumber => Ok(Val::Bytes(c_number(self.bytes(&args[0])?))),
            Builtin::Prefix => {
                let (b, n) = (self.bytes(&args[0])?, self.int(&args[1])?);
                let n = usize::try_from(n).map_err(|_| EvalFail)?;
                Ok(Val::Bytes(&b[..b.len().min(n)]))
            }
            Builtin::Only => bool(only(self.bytes(&args[0])?, self.bytes(&args[1])?)),
            Builtin::PctEncoded => bool(pct_encoded(self.bytes(&args[0])?)),
            Builtin::Elem => {
                let list = self.eval(&args[0])?;
                let CExpr::ElemField(f) = &args[2] else {
                    return Err(EvalFail);
                };
                let i = self.int(&args[1])?;
                elem(self.slots, self.data, list, i, *f).ok_or(EvalFail)
            }
            Builtin::Present => Ok(Val::Int(i128::from(!matches!(
                self.eval(&args[0])?,
                Val::Unset
            )))),
            Builtin::Count => Ok(Val::Int(
                self.matches(&args[0], &args[1], &args[2])?.count() as i128,
            )),
            Builtin::Lookup => {
                let CExpr::ElemField(v) = &args[3] else {
                    return Err(EvalFail);
                };
                let found = self.matches(&args[0], &args[1], &args[2])?.last();
                Ok(field_of(self.slots, self.data, found, *v))
            }
            Builtin::AllSame => {
                let CExpr::ElemField(v) = &args[3] else {
                    return Err(EvalFail);
                };
                let found = self.matches(&args[0], &args[1], &args[2])?;
                bool(all_same(self.slots, self.data, found, *v))
            }
        }
    }
}

/// The bases of the elements of `list` whose field `f` equals `key`,
/// ignoring ASCII case; `None` if `list` is no list.
pub fn matching<'a>(
    slots: &'a [Slot],
    data: &'a [u8],
    list: Val,
    f: u16,
    key: &'a [u8],
) -> Option<impl Iterator<Item = usize> + 'a> {
    let Val::List {
        count,
        base,
        elem_slots,
    } = list
    else {
        return None;
    };
    let f = f as usize;
    Some(
        (0..count as usize)
            .map(move |i| base + i * elem_slots as usize)
            .filter(move |b| matches!(slot_val(slots, data, b + f), Val::Bytes(v) if v.eq_ignore_ascii_case(key))),
    )
}

/// Field `v` of the element at `base`, unset without one (`lookup`).
pub fn field_of<'a>(slots: &[Slot], data: &'a [u8], base: Option<usize>, v: u16) -> Val<'a> {
    match base {
        Some(b) => slot_val(slots, data, b + v as usize),
        None => Val::Unset,
    }
}

/// Whether field `v` of every element at `bases` that has it in bytes
/// holds the same bytes, spaces and tabs around them aside (`all_same`).
pub fn all_same(slots: &[Slot], data: &[u8], bases: impl Iterator<Item = usize>, v: u16) -> bool {
    let mut first: Option<&[u8]> = None;
    for b in bases {
        let Val::Bytes(x) = slot_val(slots, data, b + v as usize) else {
            continue;
        };
        let x = trim(x);
        match first {
            None => first = Some(x),
            Some(f) if f != x => return false,
            Some(_) => {}
        }
    }
    true
}

/// `elem(list, i, "f")`: field `f` of element `i`, unset past the end;
/// `None` if `list` is no list.
pub fn elem<'a>(slots: &[Slot], data: &'a [u8], list: Val, i: i128, f: u16) -> Option<Val<'a>> {
    let Val::List {
        count,
        base,
        elem_slots,
    } = list
    else {
        return None;
    };
    if i < 0 || i >= count as i128 {
        return Some(Val::Unset);
    }
    let at = base + i as usize * elem_slots as usize + f as usize;
    Some(slot_val(slots, data, at))
}

/// `to_int`: an absent or empty value counts as 0.
pub fn to_int(b: &[u8]) -> Option<i128> {
    if trim(b).is_empty() {
        return Some(0);
    }
    parse_int(b, 10).ok()
}

/// Does the last of the comma-separated tokens of `v` equal `t`?
pub fn last_token_nocase(v: &[u8], t: &[u8]) -> bool {
    let last = v.rsplit(|c| *c == b',').next().unwrap_or(&[]);
    trim(last).eq_ignore_ascii_case(t)
}

/// Is `t` one of the comma-separated tokens of `v`?
pub fn has_token_nocase(v: &[u8], t: &[u8]) -> bool {
    v.split(|c| *c == b',')
        .any(|x| trim(x).eq_ignore_ascii_case(t))
}

/// The bytes of `v` before the first `sep`, or all of them.
pub fn before<'a>(v: &'a [u8], sep: &[u8]) -> &'a [u8] {
    // One byte (HTTP's checks for a NUL, a `;`, a `,`) is searched a word
    // at a time (header values are short: `memchr`'s set-up would cost
    // more than the search), a longer separator with a searcher.
    let end = match sep {
        [_] => crate::scalar::position_any(v, sep),
        _ => memchr::memmem::find(v, sep),
    };
    &v[..end.unwrap_or(v.len())]
}

/// The bytes of `v` after the first `sep`, or none.
pub fn after<'a>(v: &'a [u8], sep: &[u8]) -> &'a [u8] {
    let at = match sep {
        [_] => crate::scalar::position_any(v, sep),
        _ => memchr::memmem::find(v, sep),
    };
    match at {
        Some(i) => &v[i + sep.len()..],
        None => &v[v.len()..],
    }
}

/// Whether every byte of `v` is in `class`, a 256-bit map (bit `c % 8`
/// of byte `c / 8`) as the compiler makes of `only`'s class. A map of
/// another length holds nothing.
#[inline]
pub fn only(v: &[u8], class: &[u8]) -> bool {
    let Ok(map) = <&[u8; 32]>::try_from(class) else {
        return v.is_empty();
    };
    v.iter()
        .all(|c| map[(*c >> 3) as usize] & (1 << (*c & 7)) != 0)
}

/// Whether every `%` in `v` starts a percent-encoding: `%` and two
/// hexadecimal digits (RFC 3986 section 2.1).
pub fn pct_encoded(v: &[u8]) -> bool {
    let mut from = 0;
    while let Some(i) = memchr::memchr(b'%', &v[from..]) {
        let at = from + i;
        match v.get(at + 1..at + 3) {
            Some([a, b]) if a.is_ascii_hexdigit() && b.is_ascii_hexdigit() => from = at + 3,
            _ => return false,
        }
    }
    true
}

/// `only`'s class, `[...]` of a regular expression without the brackets:
/// bytes, ranges `a-z`, a `-` first or last standing for itself, and a
/// leading `^` taking the complement. As a 256-bit map; `None` for a
/// range whose end is below its start.
pub fn char_class(spec: &[u8]) -> Option<[u8; 32]> {
    let (negate, spec) = match spec {
        [b'^', rest @ ..] if !rest.is_empty() => (true, rest),
        _ => (false, spec),
    };
    let mut map = [0u8; 32];
    let mut i = 0;
    while i < spec.len() {
        let (lo, hi) = match spec.get(i..i + 3) {
            Some([lo, b'-', hi]) => (*lo, *hi),
            _ => (spec[i], spec[i]),
        };
        if lo > hi {
            return None;
        }
        for c in lo..=hi {
            map[(c >> 3) as usize] |= 1 << (c & 7);
        }
        i += if spec.get(i + 1) == Some(&b'-') && i + 2 < spec.len() {
            3
        } else {
            1
        };
    }
    if negate {
        for b in &mut map {
            *b = !*b;
        }
    }
    Some(map)
}

pub(crate) fn equal(a: Val, b: Val) -> Result<bool, EvalFail> {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => Ok(x == y),
        (Val::Bytes(x), Val::Bytes(y)) => Ok(x == y),
        (Val::Unset, Val::Unset) => Ok(true),
        (Val::Unset, _) | (_, Val::Unset) => Ok(false),
        _ => Err(EvalFail),
    }
}

/// RFC 9110 `tchar`: the characters of a method or header name.
pub(crate) fn is_tchar(c: u8) -> bool {
    TCHAR[c as usize]
}

/// [`is_tchar`] as a table: header names are checked byte by byte.
static TCHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric();
        c += 1;
    }
    let extra = b"!#$%&'*+-.^_`|~";
    let mut i = 0;
    while i < extra.len() {
        t[extra[i] as usize] = true;
        i += 1;
    }
    t
};

/// What C's `strtol` reads of `b` as memcached's `safe_strtol` checks
/// it: whitespace before it skipped, and it ends at the next whitespace
/// (where `strtol` stops and `isspace` accepts the end).
pub fn c_number(b: &[u8]) -> &[u8] {
    let c_space = |c: &u8| matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let start = b.iter().position(|c| !c_space(c)).unwrap_or(b.len());
    let b = &b[start..];
    &b[..b.iter().position(c_space).unwrap_or(b.len())]
}

/// `b` without the spaces and tabs around it.
pub fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t'))
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !matches!(c, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &b[start..end.max(start)]
}

/// ASCII digits to an integer: non-empty, digits only, at most 2^64 - 1.
pub(crate) fn parse_int(b: &[u8], radix: u32) -> Result<i128, EvalFail> {
    let b = trim(b);
    if b.is_empty() || b.len() > 20 {
        return Err(EvalFail);
    }
    let mut v: i128 = 0;
    for c in b {
        let d = (*c as char).to_digit(radix).ok_or(EvalFail)?;
        v = v * radix as i128 + d as i128;
    }
    if v > u64::MAX as i128 {
        return Err(EvalFail);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::c_number;

    #[test]
    fn c_number_is_what_strtol_reads_and_isspace_ends() {
        for (token, number) in [
            (&b"12"[..], &b"12"[..]),
            (b"1\r", b"1"),
            (b"\x0b+1", b"+1"),
            (b"1\x0bjunk", b"1"),
            (b"\r\t\x0c-3\n", b"-3"),
            (b"1junk", b"1junk"),
            (b"\x0b", b""),
            (b"", b""),
        ] {
            assert_eq!(c_number(token), number, "{token:?}");
        }
    }
}
