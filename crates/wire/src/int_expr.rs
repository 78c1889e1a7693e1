//! Grammar expressions lowered for the parser's hot path: constants folded
//! (`-1` is one constant, not a negation), integer operations and
//! comparisons with a constant as their own nodes, so that a length or a
//! `&requires` check evaluates without building a [`Val`] per node.
//! Anything else keeps its [`CExpr`] and goes through the general
//! evaluator, so results are the same as [`Env::int`] and [`Env::eval`].

use crate::eval::{is_tchar, parse_int, slot_val, Env, EvalFail, Val};
use crate::grammar::ast::{BinOp, UnOp};
use crate::program::{Builtin, CExpr, Slot};
use std::sync::Arc;

/// Where a compared value comes from: a slot or `$$`. Either may be unset
/// or bytes, which comparisons must tell apart from integers.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operand {
    Slot(u16),
    Dollar,
}

/// An expression evaluated to an integer (a truth value is 0 or 1).
/// Leaves are evaluated in place; only inner nodes cost a call.
#[derive(Clone, Debug)]
pub(crate) enum IntExpr {
    Const(i128),
    /// An integer slot; unset or bytes fail, as in [`Env::int`].
    Slot(u16),
    /// `$$` as an integer.
    Dollar,
    /// An integer slot followed by operations with constants: a bit
    /// field or an offset, evaluated in place.
    SlotChain(u16, Box<[ConstOp]>),
    /// A sum of slots, `$$` and constants (`self.total_len -
    /// (self.extras_len + self.key_len)`), in one pass.
    Sum(Box<Sum>),
    Node(Box<Node>),
}

/// `konst + Σ ±term`. At most [`Sum::MAX`] terms and constants, each
/// below 2^64 in magnitude: no order of adding them overflows an `i128`,
/// so the sum fails exactly when a term has no integer value.
#[derive(Clone, Debug)]
pub(crate) struct Sum {
    /// Each term, and whether it is subtracted.
    pub(crate) terms: Box<[(Operand, bool)]>,
    pub(crate) konst: i128,
}

impl Sum {
    const MAX: usize = 8;

    /// `e` as a sum of two or more terms, if it is one.
    fn of(e: &CExpr) -> Option<Sum> {
        let mut terms = Vec::new();
        let mut konst = 0i128;
        let mut items = 0;
        if !Sum::collect(e, false, &mut terms, &mut konst, &mut items) || terms.len() < 2 {
            return None;
        }
        Some(Sum {
            terms: terms.into(),
            konst,
        })
    }

    fn collect(
        e: &CExpr,
        neg: bool,
        terms: &mut Vec<(Operand, bool)>,
        konst: &mut i128,
        items: &mut usize,
    ) -> bool {
        *items += 1;
        if *items > 2 * Sum::MAX {
            return false;
        }
        match e {
            CExpr::Binary(BinOp::Add, a, b) => {
                Sum::collect(a, neg, terms, konst, items)
                    && Sum::collect(b, neg, terms, konst, items)
            }
            CExpr::Binary(BinOp::Sub, a, b) => {
                Sum::collect(a, neg, terms, konst, items)
                    && Sum::collect(b, !neg, terms, konst, items)
            }
            CExpr::Slot(_) | CExpr::Dollar | CExpr::Int(_) => {
                let leaves = terms.len() + usize::from(*konst != 0);
                if leaves >= Sum::MAX {
                    return false;
                }
                match e {
                    CExpr::Int(c) if c.unsigned_abs() < 1 << 64 => {
                        *konst += if neg { -c } else { *c };
                        true
                    }
                    CExpr::Int(_) => false,
                    _ => {
                        terms.push((operand(e).expect("a slot or $$"), neg));
                        true
                    }
                }
            }
            _ => false,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Node {
    Not(IntExpr),
    Neg(IntExpr),
    And(IntExpr, IntExpr),
    Or(IntExpr, IntExpr),
    Add(IntExpr, IntExpr),
    Sub(IntExpr, IntExpr),
    Mul(IntExpr, IntExpr),
    Div(IntExpr, IntExpr),
    Mod(IntExpr, IntExpr),
    Lt(IntExpr, IntExpr),
    Le(IntExpr, IntExpr),
    /// `x == e` (or `!=` when `eq` is false), `e` an integer-valued
    /// expression: an unset `x` is unequal, bytes fail.
    EqInt {
        x: Operand,
        e: IntExpr,
        eq: bool,
    },
    /// `x == "..."`: unset is unequal, an integer fails.
    EqBytes {
        x: Operand,
        s: Arc<[u8]>,
        eq: bool,
    },
    /// Both sides are integer-valued: a plain comparison.
    EqBoth(IntExpr, IntExpr, bool),
    /// An expression followed by operations with constants, applied in
    /// a loop: bit fields (`self.flags / 8192 % 2`) and offsets
    /// (`self.ihl * 4 - 20`) without a call per operator.
    Chain(IntExpr, Box<[ConstOp]>),
    /// A test of the bytes of a slot or of `$$` (`is_token($$)`); other
    /// values go through the general evaluator, with the call kept here.
    BytesTest(Builtin, Operand, CExpr),
    /// Everything else, through the general evaluator.
    General(CExpr),
}

/// An operation with a constant right-hand side.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ConstOp {
    Add(i128),
    Sub(i128),
    Mul(i128),
    Div(i128),
    Mod(i128),
    /// `/ 2^k`, a shift for values that are not negative.
    Shr(u32),
    /// `% 2^k`, a mask for values that are not negative.
    Mask(i128),
    Lt(i128),
    Le(i128),
    Gt(i128),
    Ge(i128),
}

/// Constant folding: `Neg(Int(1))` is `Int(-1)`, and operators over
/// constants are computed once, when they cannot fail.
pub(crate) fn fold(e: &CExpr) -> CExpr {
    match e {
        CExpr::Unary(op, x) => {
            let x = fold(x);
            match (op, &x) {
                (UnOp::Neg, CExpr::Int(v)) if v.checked_neg().is_some() => CExpr::Int(-v),
                (UnOp::Not, CExpr::Int(v)) => CExpr::Int(i128::from(*v == 0)),
                _ => CExpr::Unary(*op, Box::new(x)),
            }
        }
        CExpr::Binary(op, a, b) => {
            let (a, b) = (fold(a), fold(b));
            if let (CExpr::Int(x), CExpr::Int(y)) = (&a, &b) {
                if let Some(v) = const_binary(*op, *x, *y) {
                    return CExpr::Int(v);
                }
            }
            CExpr::Binary(*op, Box::new(a), Box::new(b))
        }
        CExpr::Call(f, args) => CExpr::Call(*f, args.iter().map(fold).collect()),
        other => other.clone(),
    }
}

fn const_binary(op: BinOp, x: i128, y: i128) -> Option<i128> {
    let b = |c: bool| Some(i128::from(c));
    match op {
        BinOp::Add => x.checked_add(y),
        BinOp::Sub => x.checked_sub(y),
        BinOp::Mul => x.checked_mul(y),
        BinOp::Div => x.checked_div(y),
        BinOp::Mod => x.checked_rem(y),
        BinOp::Lt => b(x < y),
        BinOp::Le => b(x <= y),
        BinOp::Gt => b(x > y),
        BinOp::Ge => b(x >= y),
        BinOp::Eq => b(x == y),
        BinOp::Ne => b(x != y),
        BinOp::And => b(x != 0 && y != 0),
        BinOp::Or => b(x != 0 || y != 0),
    }
}

/// Whether an expression always yields an integer when it succeeds (never
/// bytes, a list or unset).
pub(crate) fn int_valued(e: &IntExpr) -> bool {
    match e {
        IntExpr::Const(_) | IntExpr::SlotChain(..) | IntExpr::Sum(_) => true,
        IntExpr::Slot(_) | IntExpr::Dollar => false,
        IntExpr::Node(n) => !matches!(**n, Node::General(_)),
    }
}

fn operand(e: &CExpr) -> Option<Operand> {
    match e {
        CExpr::Slot(s) => Some(Operand::Slot(*s)),
        CExpr::Dollar => Some(Operand::Dollar),
        _ => None,
    }
}

/// Lowers a compiled expression (folded first).
pub(crate) fn lower(e: &CExpr) -> IntExpr {
    lower_folded(&fold(e))
}

fn lower_folded(e: &CExpr) -> IntExpr {
    let l = lower_folded;
    let node = |n: Node| IntExpr::Node(Box::new(n));
    match e {
        CExpr::Int(v) => IntExpr::Const(*v),
        CExpr::Slot(s) => IntExpr::Slot(*s),
        CExpr::Dollar => IntExpr::Dollar,
        CExpr::Unary(UnOp::Not, x) => node(Node::Not(l(x))),
        CExpr::Unary(UnOp::Neg, x) => node(Node::Neg(l(x))),
        CExpr::Binary(op @ (BinOp::Eq | BinOp::Ne), a, b) => {
            let eq = *op == BinOp::Eq;
            let (la, lb) = (l(a), l(b));
            let str_of = |e: &CExpr| match e {
                CExpr::Str(s) => Some(s.clone()),
                _ => None,
            };
            node(match (operand(a), operand(b)) {
                _ if int_valued(&la) && int_valued(&lb) => Node::EqBoth(la, lb, eq),
                (Some(x), _) if int_valued(&lb) => Node::EqInt { x, e: lb, eq },
                (_, Some(x)) if int_valued(&la) => Node::EqInt { x, e: la, eq },
                (Some(x), _) if str_of(b).is_some() => Node::EqBytes {
                    x,
                    s: str_of(b).expect("checked"),
                    eq,
                },
                (_, Some(x)) if str_of(a).is_some() => Node::EqBytes {
                    x,
                    s: str_of(a).expect("checked"),
                    eq,
                },
                _ => Node::General(e.clone()),
            })
        }
        CExpr::Binary(BinOp::Add | BinOp::Sub, ..) if Sum::of(e).is_some() => {
            IntExpr::Sum(Box::new(Sum::of(e).expect("checked")))
        }
        CExpr::Binary(op, a, b) if const_of(b).and_then(|c| const_op(*op, c)).is_some() => {
            let op = const_of(b).and_then(|c| const_op(*op, c)).expect("checked");
            match l(a) {
                IntExpr::Slot(s) => IntExpr::SlotChain(s, Box::new([op])),
                IntExpr::SlotChain(s, ops) => {
                    IntExpr::SlotChain(s, ops.iter().copied().chain([op]).collect())
                }
                IntExpr::Node(n) if matches!(*n, Node::Chain(..)) => {
                    let Node::Chain(start, ops) = *n else {
                        unreachable!("matched above")
                    };
                    let ops = ops.iter().copied().chain([op]).collect();
                    node(Node::Chain(start, ops))
                }
                a => node(Node::Chain(a, Box::new([op]))),
            }
        }
        CExpr::Binary(op, a, b) => {
            let (a, b) = (l(a), l(b));
            node(match op {
                BinOp::And => Node::And(a, b),
                BinOp::Or => Node::Or(a, b),
                BinOp::Add => Node::Add(a, b),
                BinOp::Sub => Node::Sub(a, b),
                BinOp::Mul => Node::Mul(a, b),
                BinOp::Div => Node::Div(a, b),
                BinOp::Mod => Node::Mod(a, b),
                BinOp::Lt => Node::Lt(a, b),
                BinOp::Le => Node::Le(a, b),
                // `a > b` is `b < a`: the operands have no side effects.
                BinOp::Gt => Node::Lt(b, a),
                BinOp::Ge => Node::Le(b, a),
                BinOp::Eq | BinOp::Ne => unreachable!("handled above"),
            })
        }
        CExpr::Call(
            f @ (Builtin::IsToken
            | Builtin::IsDec
            | Builtin::IsHex
            | Builtin::EndsWithWs
            | Builtin::StartsWithWs),
            args,
        ) if args.len() == 1 && operand(&args[0]).is_some() => node(Node::BytesTest(
            *f,
            operand(&args[0]).expect("checked"),
            e.clone(),
        )),
        other => node(Node::General(other.clone())),
    }
}

fn const_of(e: &CExpr) -> Option<i128> {
    match e {
        CExpr::Int(c) => Some(*c),
        _ => None,
    }
}

/// `op` with the constant `c` on its right, as a chain operation.
fn const_op(op: BinOp, c: i128) -> Option<ConstOp> {
    let pow2 = c > 0 && (c as u128).is_power_of_two();
    Some(match op {
        BinOp::Add => ConstOp::Add(c),
        BinOp::Sub => ConstOp::Sub(c),
        BinOp::Mul => ConstOp::Mul(c),
        BinOp::Div if pow2 => ConstOp::Shr(c.trailing_zeros()),
        BinOp::Div => ConstOp::Div(c),
        BinOp::Mod if pow2 => ConstOp::Mask(c - 1),
        BinOp::Mod => ConstOp::Mod(c),
        BinOp::Lt => ConstOp::Lt(c),
        BinOp::Le => ConstOp::Le(c),
        BinOp::Gt => ConstOp::Gt(c),
        BinOp::Ge => ConstOp::Ge(c),
        _ => return None,
    })
}

impl<'a> Env<'a> {
    pub(crate) fn operand(&self, x: Operand) -> Val<'a> {
        match x {
            Operand::Slot(s) => slot_val(self.slots, self.data, self.base + s as usize),
            Operand::Dollar => self.dollar,
        }
    }

    /// Evaluates a lowered expression; the same result as [`Env::int`] on
    /// the expression it was lowered from.
    // Always inlined: leaves are then read in place by their parent node.
    #[inline(always)]
    pub(crate) fn int_of(&self, e: &'a IntExpr) -> Result<i128, EvalFail> {
        match e {
            IntExpr::Const(v) => Ok(*v),
            IntExpr::Slot(s) => match self.slots.get(self.base + *s as usize) {
                Some(Slot::Int(v)) => Ok(*v as i128),
                Some(Slot::SInt(v)) => Ok(*v as i128),
                Some(Slot::Count(n)) => Ok(*n as i128),
                _ => Err(EvalFail),
            },
            IntExpr::Dollar => match self.dollar {
                Val::Int(v) => Ok(v),
                Val::List { count, .. } => Ok(count as i128),
                _ => Err(EvalFail),
            },
            IntExpr::SlotChain(s, ops) => self.slot_chain(*s, ops),
            IntExpr::Sum(sum) => self.sum(sum),
            IntExpr::Node(n) => self.node(n),
        }
    }

    #[inline(never)]
    fn sum(&self, sum: &Sum) -> Result<i128, EvalFail> {
        let mut v = sum.konst;
        for (x, neg) in sum.terms.iter() {
            // As `Env::int`: integer slots (and counts), an integer `$$`
            // or the count of a list `$$`.
            let t = match x {
                Operand::Slot(s) => match self.slots.get(self.base + *s as usize) {
                    Some(Slot::Int(v)) => *v as i128,
                    Some(Slot::SInt(v)) => *v as i128,
                    Some(Slot::Count(n)) => *n as i128,
                    _ => return Err(EvalFail),
                },
                Operand::Dollar => match self.dollar {
                    Val::Int(v) => v,
                    Val::List { count, .. } => count as i128,
                    _ => return Err(EvalFail),
                },
            };
            v = if *neg { v - t } else { v + t };
        }
        Ok(v)
    }

    // Out of line, so that `int_of` stays small enough to inline.
    #[inline(never)]
    fn slot_chain(&self, s: u16, ops: &[ConstOp]) -> Result<i128, EvalFail> {
        let mut v = match self.slots.get(self.base + s as usize) {
            Some(Slot::Int(v)) => *v as i128,
            Some(Slot::SInt(v)) => *v as i128,
            Some(Slot::Count(n)) => *n as i128,
            _ => return Err(EvalFail),
        };
        for op in ops {
            v = apply(v, *op).ok_or(EvalFail)?;
        }
        Ok(v)
    }

    /// A test of the bytes of a slot or of `$$`; other values go through
    /// the general evaluator with the whole call.
    #[inline(never)]
    pub(crate) fn bytes_test(
        &self,
        f: Builtin,
        x: Operand,
        call: &'a CExpr,
    ) -> Result<i128, EvalFail> {
        // As the general evaluator's `bytes`: unset is empty.
        let v = match self.operand(x) {
            Val::Bytes(v) => v,
            Val::Unset => &[],
            _ => return self.int(call),
        };
        Ok(i128::from(match f {
            Builtin::IsToken => !v.is_empty() && v.iter().all(|c| is_tchar(*c)),
            Builtin::IsDec => parse_int(v, 10).is_ok(),
            Builtin::IsHex => parse_int(v, 16).is_ok(),
            Builtin::EndsWithWs => matches!(v.last(), Some(b' ' | b'\t')),
            Builtin::StartsWithWs => matches!(v.first(), Some(b' ' | b'\t')),
            _ => return self.int(call),
        }))
    }

    fn node(&self, n: &'a Node) -> Result<i128, EvalFail> {
        let b = |c: bool| Ok(i128::from(c));
        let f = |v: Option<i128>| v.ok_or(EvalFail);
        match n {
            Node::Not(x) => b(self.int_of(x)? == 0),
            Node::Neg(x) => f(self.int_of(x)?.checked_neg()),
            Node::And(x, y) => b(self.int_of(x)? != 0 && self.int_of(y)? != 0),
            Node::Or(x, y) => b(self.int_of(x)? != 0 || self.int_of(y)? != 0),
            Node::Add(x, y) => f(self.int_of(x)?.checked_add(self.int_of(y)?)),
            Node::Sub(x, y) => f(self.int_of(x)?.checked_sub(self.int_of(y)?)),
            Node::Mul(x, y) => f(mul(self.int_of(x)?, self.int_of(y)?)),
            Node::Div(x, y) => f(div(self.int_of(x)?, self.int_of(y)?)),
            Node::Mod(x, y) => f(rem(self.int_of(x)?, self.int_of(y)?)),
            Node::Lt(x, y) => b(self.int_of(x)? < self.int_of(y)?),
            Node::Le(x, y) => b(self.int_of(x)? <= self.int_of(y)?),
            Node::EqInt { x, e, eq } => {
                let v = match self.operand(*x) {
                    Val::Int(v) => v == self.int_of(e)?,
                    Val::Unset => {
                        self.int_of(e)?;
                        false
                    }
                    _ => return Err(EvalFail),
                };
                b(v == *eq)
            }
            Node::EqBytes { x, s, eq } => {
                let v = match self.operand(*x) {
                    Val::Bytes(v) => v == &s[..],
                    Val::Unset => false,
                    _ => return Err(EvalFail),
                };
                b(v == *eq)
            }
            Node::EqBoth(x, y, eq) => b((self.int_of(x)? == self.int_of(y)?) == *eq),
            Node::Chain(start, ops) => {
                let mut v = self.int_of(start)?;
                for op in ops.iter() {
                    v = apply(v, *op).ok_or(EvalFail)?;
                }
                Ok(v)
            }
            Node::BytesTest(f, x, call) => self.bytes_test(*f, *x, call),
            Node::General(c) => self.general(c),
        }
    }

    /// The general evaluator, out of line: inlined, its frame would weigh
    /// on every node.
    #[inline(never)]
    fn general(&self, c: &'a CExpr) -> Result<i128, EvalFail> {
        self.int(c)
    }
}

/// `v` with a constant operation applied; `None` where it fails.
#[inline(always)]
pub(crate) fn apply(v: i128, op: ConstOp) -> Option<i128> {
    match op {
        ConstOp::Add(c) => v.checked_add(c),
        ConstOp::Sub(c) => v.checked_sub(c),
        ConstOp::Mul(c) => mul(v, c),
        ConstOp::Div(c) => div(v, c),
        ConstOp::Mod(c) => rem(v, c),
        // Truncating division and remainder are a shift and a mask only
        // for values that are not negative.
        ConstOp::Shr(k) if v >= 0 => Some(v >> k),
        ConstOp::Shr(k) => div(v, 1 << k),
        ConstOp::Mask(m) if v >= 0 => Some(v & m),
        ConstOp::Mask(m) => rem(v, m + 1),
        ConstOp::Lt(c) => Some(i128::from(v < c)),
        ConstOp::Le(c) => Some(i128::from(v <= c)),
        ConstOp::Gt(c) => Some(i128::from(v > c)),
        ConstOp::Ge(c) => Some(i128::from(v >= c)),
    }
}

/// Multiplication of values that fit in 64 bits is done in 64 bits when
/// it does not overflow there: 128-bit overflow checks are a library call.
#[inline(always)]
pub fn mul(x: i128, y: i128) -> Option<i128> {
    match (i64::try_from(x), i64::try_from(y)) {
        (Ok(a), Ok(b)) => match a.checked_mul(b) {
            Some(v) => Some(i128::from(v)),
            None => x.checked_mul(y),
        },
        _ => x.checked_mul(y),
    }
}

/// Division of values that fit in 64 bits is done in 64 bits: 128-bit
/// division is a library call, and bit fields are written with `/` and `%`.
/// A divisor of 0 or -1 (where 64 bits could overflow) takes 128 bits.
pub fn div(x: i128, y: i128) -> Option<i128> {
    match (i64::try_from(x), i64::try_from(y)) {
        (Ok(a), Ok(b)) if b != 0 && b != -1 => Some(i128::from(a / b)),
        _ => x.checked_div(y),
    }
}

pub fn rem(x: i128, y: i128) -> Option<i128> {
    match (i64::try_from(x), i64::try_from(y)) {
        (Ok(a), Ok(b)) if b != 0 && b != -1 => Some(i128::from(a % b)),
        _ => x.checked_rem(y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ranges::{check_ranges, in_ranges};

    fn int(v: i128) -> CExpr {
        CExpr::Int(v)
    }

    fn bin(op: BinOp, a: CExpr, b: CExpr) -> CExpr {
        CExpr::Binary(op, Box::new(a), Box::new(b))
    }

    /// Lowered expressions give what the general evaluator gives, for
    /// every kind of slot and `$$` value.
    #[test]
    fn lowered_matches_general() {
        let data = b"abc 12";
        let slots = [
            Slot::Int(5),
            Slot::SInt(-1),
            Slot::Unset,
            Slot::Bytes { start: 0, len: 3 },
            Slot::Count(2),
            Slot::Int(u64::MAX),
            Slot::Bytes { start: 4, len: 2 },
        ];
        let s = CExpr::Slot;
        let neg1 = CExpr::Unary(UnOp::Neg, Box::new(int(1)));
        let mut exprs = vec![
            bin(
                BinOp::Or,
                bin(BinOp::Eq, CExpr::Dollar, int(0x80)),
                bin(BinOp::Eq, CExpr::Dollar, int(0x81)),
            ),
            bin(BinOp::Le, CExpr::Dollar, int(250)),
            bin(BinOp::Ge, CExpr::Dollar, neg1.clone()),
            bin(BinOp::Ne, CExpr::Dollar, int(3)),
            CExpr::Unary(UnOp::Not, Box::new(bin(BinOp::Lt, CExpr::Dollar, int(7)))),
            bin(BinOp::Eq, CExpr::Dollar, CExpr::Str(Arc::from(&b"abc"[..]))),
            CExpr::Call(Builtin::IsToken, vec![CExpr::Dollar]),
            CExpr::Call(Builtin::IsDec, vec![CExpr::Dollar]),
        ];
        for i in 0..slots.len() as u16 {
            exprs.push(bin(BinOp::Mod, bin(BinOp::Div, s(i), int(16384)), int(2)));
            exprs.push(bin(BinOp::Sub, bin(BinOp::Mul, s(i), int(4)), int(20)));
            exprs.push(bin(BinOp::Div, s(i), int(-1)));
            exprs.push(bin(BinOp::Mod, s(i), int(0)));
            exprs.push(bin(BinOp::Eq, s(i), neg1.clone()));
            exprs.push(bin(BinOp::Eq, s(i), s(0)));
            exprs.push(bin(BinOp::Gt, CExpr::Dollar, bin(BinOp::Add, s(i), s(0))));
            exprs.push(bin(
                BinOp::And,
                s(i),
                CExpr::Unary(UnOp::Neg, Box::new(s(i))),
            ));
            exprs.push(CExpr::Call(Builtin::IsHex, vec![s(i)]));
            exprs.push(bin(BinOp::Sub, s(i), bin(BinOp::Add, s(0), s(4))));
            exprs.push(bin(
                BinOp::Add,
                bin(BinOp::Sub, CExpr::Dollar, s(i)),
                int(5),
            ));
            exprs.push(bin(BinOp::Sub, bin(BinOp::Add, s(5), s(i)), neg1.clone()));
        }
        for dollar_at in 0..=slots.len() {
            let dollar = slot_val(&slots, data, dollar_at);
            let env = Env {
                slots: &slots,
                base: 0,
                data,
                dollar,
                dollar_base: 0,
                context: 0,
                limits: &[],
                streamed: 0,
            };
            for e in &exprs {
                let lowered = lower(e);
                let want = env.int(e).ok();
                assert_eq!(
                    env.int_of(&lowered).ok(),
                    want,
                    "{e:?} with $$ = {dollar:?}"
                );
                // A range test gives the check's result whenever the value
                // it tests is an integer.
                if let Some((x, r)) = check_ranges(&lowered) {
                    if let Val::Int(v) = env.operand(x) {
                        let got = i128::from(in_ranges(&r, v));
                        assert_eq!(Some(got), want.map(|w| i128::from(w != 0)), "{e:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn ranges_of_checks() {
        let d = || CExpr::Dollar;
        let magic = bin(
            BinOp::Or,
            bin(BinOp::Eq, d(), int(0x80)),
            bin(BinOp::Eq, d(), int(0x81)),
        );
        let dollar = |e: &CExpr| match check_ranges(&lower(e)) {
            Some((Operand::Dollar, r)) => Some(r),
            _ => None,
        };
        assert_eq!(dollar(&magic), Some(vec![(0x80, 0x81)]));
        let not3 = bin(BinOp::Ne, d(), int(3));
        assert_eq!(dollar(&not3), Some(vec![(i128::MIN, 2), (4, i128::MAX)]));
        let both = bin(
            BinOp::And,
            bin(BinOp::Ge, d(), int(1)),
            bin(BinOp::Le, d(), int(9)),
        );
        assert_eq!(dollar(&both), Some(vec![(1, 9)]));
        assert_eq!(dollar(&bin(BinOp::Le, d(), CExpr::Slot(0))), None);
        let slot = bin(BinOp::Eq, CExpr::Slot(3), int(8));
        assert!(matches!(
            check_ranges(&lower(&slot)),
            Some((Operand::Slot(3), r)) if r == vec![(8, 8)]
        ));
        let mixed = bin(
            BinOp::And,
            bin(BinOp::Eq, CExpr::Slot(3), int(8)),
            bin(BinOp::Eq, d(), int(1)),
        );
        assert!(check_ranges(&lower(&mixed)).is_none());
    }
}
