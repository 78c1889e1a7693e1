//! Evaluation of grammar expressions over value slots. Allocation-free:
//! values borrow from the message bytes or from the grammar's literals.

use crate::grammar::ast::{BinOp, UnOp};
use crate::program::{Builtin, CExpr, Slot};

#[derive(Clone, Copy, Debug)]
pub(crate) enum Val<'a> {
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
        match e {
            CExpr::Int(v) => return Ok(*v),
            CExpr::Slot(s) => match self.slots.get(self.base + *s as usize) {
                Some(Slot::Int(v)) => return Ok(*v as i128),
                Some(Slot::SInt(v)) => return Ok(*v as i128),
                _ => {}
            },
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
            let eq = equal(self.eval(a)?, self.eval(b)?)?;
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
        let Val::List {
            count,
            base,
            elem_slots,
        } = self.eval(list)?
        else {
            return Err(EvalFail);
        };
        let CExpr::ElemField(f) = field else {
            return Err(EvalFail);
        };
        let key = self.bytes(key)?;
        let (slots, data, f) = (self.slots, self.data, *f as usize);
        Ok((0..count as usize)
            .map(move |i| base + i * elem_slots as usize)
            .filter(move |b| matches!(slot_val(slots, data, b + f), Val::Bytes(v) if v.eq_ignore_ascii_case(key))))
    }

    fn call(&self, f: Builtin, args: &'a [CExpr]) -> Result<Val<'a>, EvalFail> {
        let bool = |b: bool| Ok(Val::Int(i128::from(b)));
        match f {
            Builtin::ReplyContext => Ok(Val::Int(self.context)),
            Builtin::Len => match self.eval(&args[0])? {
                Val::Bytes(b) => Ok(Val::Int(b.len() as i128)),
                Val::List { count, .. } => Ok(Val::Int(count as i128)),
                _ => Err(EvalFail),
            },
            // An absent or empty value counts as 0; `is_dec` tells them apart.
            Builtin::ToInt => match self.bytes(&args[0])? {
                b if trim(b).is_empty() => Ok(Val::Int(0)),
                b => parse_int(b, 10).map(Val::Int),
            },
            Builtin::HexToInt => parse_int(self.bytes(&args[0])?, 16).map(Val::Int),
            Builtin::IsDec => bool(parse_int(self.bytes(&args[0])?, 10).is_ok()),
            Builtin::IsHex => bool(parse_int(self.bytes(&args[0])?, 16).is_ok()),
            Builtin::EqNocase => bool(
                self.bytes(&args[0])?
                    .eq_ignore_ascii_case(self.bytes(&args[1])?),
            ),
            Builtin::LastTokenNocase => {
                let v = self.bytes(&args[0])?;
                let t = self.bytes(&args[1])?;
                let last = v.rsplit(|c| *c == b',').next().unwrap_or(&[]);
                bool(trim(last).eq_ignore_ascii_case(t))
            }
            Builtin::EndsWithWs => bool(matches!(self.bytes(&args[0])?.last(), Some(b' ' | b'\t'))),
            Builtin::StartsWithWs => {
                bool(matches!(self.bytes(&args[0])?.first(), Some(b' ' | b'\t')))
            }
            Builtin::IsToken => {
                let b = self.bytes(&args[0])?;
                bool(!b.is_empty() && b.iter().all(|c| is_tchar(*c)))
            }
            Builtin::HasTokenNocase => {
                let v = self.bytes(&args[0])?;
                let t = self.bytes(&args[1])?;
                bool(
                    v.split(|c| *c == b',')
                        .any(|x| trim(x).eq_ignore_ascii_case(t)),
                )
            }
            Builtin::Before => {
                let v = self.bytes(&args[0])?;
                let sep = self.bytes(&args[1])?;
                let end = memchr::memmem::find(v, sep).unwrap_or(v.len());
                Ok(Val::Bytes(&v[..end]))
            }
            Builtin::Elem => {
                let Val::List {
                    count,
                    base,
                    elem_slots,
                } = self.eval(&args[0])?
                else {
                    return Err(EvalFail);
                };
                let CExpr::ElemField(f) = &args[2] else {
                    return Err(EvalFail);
                };
                let i = self.int(&args[1])?;
                if i < 0 || i >= count as i128 {
                    return Ok(Val::Unset);
                }
                let at = base + i as usize * elem_slots as usize + *f as usize;
                Ok(slot_val(self.slots, self.data, at))
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
                match self.matches(&args[0], &args[1], &args[2])?.last() {
                    Some(b) => Ok(slot_val(self.slots, self.data, b + *v as usize)),
                    None => Ok(Val::Unset),
                }
            }
            Builtin::AllSame => {
                let CExpr::ElemField(v) = &args[3] else {
                    return Err(EvalFail);
                };
                let mut first: Option<&[u8]> = None;
                for b in self.matches(&args[0], &args[1], &args[2])? {
                    let Val::Bytes(x) = slot_val(self.slots, self.data, b + *v as usize) else {
                        continue;
                    };
                    let x = trim(x);
                    match first {
                        None => first = Some(x),
                        Some(f) if f != x => return bool(false),
                        Some(_) => {}
                    }
                }
                bool(true)
            }
        }
    }
}

fn equal(a: Val, b: Val) -> Result<bool, EvalFail> {
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

pub(crate) fn trim(b: &[u8]) -> &[u8] {
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
