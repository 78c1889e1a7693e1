//! `foldt` bodies compiled to native closures when a program is loaded.
//!
//! A body that builds the element record again from the key and integer
//! arithmetic over the two elements' fields (`kv(k, e1.value + e2.value)`,
//! through `let`s and calls of functions of the same kind) is described by
//! a [`FoldSpec`]: per integer field, a step expression, compiled here
//! into closures. The host then folds every element of a key in one go
//! ([`Host::merge_fold`](crate::Host::merge_fold)), keeping the running
//! values as integers, and the record is built once per key. Any other
//! body runs in the interpreter.

use crate::vm::Fault;
use flick_syntax::ast::BinOp;
use std::fmt;

/// The most integer fields a compiled fold keeps, and the most fields of
/// the next element it reads.
pub const MAX_ACCS: usize = 8;

/// What a field of the record a step builds is made from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldArg {
    /// The key the fold is over (the ordering field).
    Key,
    /// Running value `i` ([`FoldSpec::accs`]).
    Acc(u16),
}

/// A step expression over the running values and the next element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FoldExpr {
    /// Running value `i`: the field of the record built so far.
    Acc(u16),
    /// Field `FoldSpec::next_fields[i]` of the next element.
    Next(u16),
    Const(i64),
    Neg(Box<FoldExpr>),
    Bin(BinOp, Box<FoldExpr>, Box<FoldExpr>),
}

type Compiled = Box<dyn Fn(&[i64], &[i64]) -> Result<i64, Fault> + Send + Sync>;

/// A `foldt` body compiled: how each step's record is made.
pub struct FoldSpec {
    /// Per named field of the record, in order.
    pub args: Vec<FoldArg>,
    /// Per running value: the record field it is, and its step expression
    /// (over the running values before the step).
    pub accs: Vec<(u16, FoldExpr)>,
    /// Fields of the next element the steps read.
    pub next_fields: Vec<u16>,
    step: Vec<Compiled>,
    /// The body is one sum, `acc + next` (word count): no closure call.
    sum: Option<(usize, usize)>,
}

impl FoldSpec {
    pub fn new(args: Vec<FoldArg>, accs: Vec<(u16, FoldExpr)>, next_fields: Vec<u16>) -> FoldSpec {
        let step = accs.iter().map(|(_, e)| compile(e)).collect();
        let sum = match &accs[..] {
            [(_, FoldExpr::Bin(BinOp::Add, x, y))] => match (&**x, &**y) {
                (FoldExpr::Acc(i), FoldExpr::Next(j)) | (FoldExpr::Next(j), FoldExpr::Acc(i)) => {
                    Some((*i as usize, *j as usize))
                }
                _ => None,
            },
            _ => None,
        };
        FoldSpec {
            args,
            accs,
            next_fields,
            step,
            sum,
        }
    }

    /// One step: the running values `accs` folded with the next element's
    /// fields `next`, with the interpreter's arithmetic.
    #[inline(always)]
    pub fn step(&self, accs: &mut [i64], next: &[i64]) -> Result<(), Fault> {
        if let Some((i, j)) = self.sum {
            accs[i] = accs[i].wrapping_add(next[j]);
            return Ok(());
        }
        self.step_general(accs, next)
    }

    /// A step of a body other than a lone sum.
    #[inline(never)]
    fn step_general(&self, accs: &mut [i64], next: &[i64]) -> Result<(), Fault> {
        let mut out = [0i64; MAX_ACCS];
        for (o, f) in out.iter_mut().zip(&self.step) {
            *o = f(accs, next)?;
        }
        accs.copy_from_slice(&out[..accs.len()]);
        Ok(())
    }
}

impl fmt::Debug for FoldSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FoldSpec")
            .field("args", &self.args)
            .field("accs", &self.accs)
            .field("next_fields", &self.next_fields)
            .finish()
    }
}

impl PartialEq for FoldSpec {
    fn eq(&self, other: &FoldSpec) -> bool {
        self.args == other.args && self.accs == other.accs && self.next_fields == other.next_fields
    }
}

/// `e` as a closure; the common shapes (`acc + next`) as one closure each.
fn compile(e: &FoldExpr) -> Compiled {
    use FoldExpr::*;
    match e {
        Acc(i) => {
            let i = *i as usize;
            Box::new(move |a, _| Ok(a[i]))
        }
        Next(i) => {
            let i = *i as usize;
            Box::new(move |_, n| Ok(n[i]))
        }
        Const(c) => {
            let c = *c;
            Box::new(move |_, _| Ok(c))
        }
        Neg(x) => {
            let x = compile(x);
            Box::new(move |a, n| Ok(x(a, n)?.wrapping_neg()))
        }
        Bin(BinOp::Add, x, y) => match (&**x, &**y) {
            (Acc(i), Next(j)) | (Next(j), Acc(i)) => {
                let (i, j) = (*i as usize, *j as usize);
                Box::new(move |a, n| Ok(a[i].wrapping_add(n[j])))
            }
            _ => {
                let (x, y) = (compile(x), compile(y));
                Box::new(move |a, n| Ok(x(a, n)?.wrapping_add(y(a, n)?)))
            }
        },
        Bin(op, x, y) => {
            let (x, y) = (compile(x), compile(y));
            match op {
                BinOp::Sub => Box::new(move |a, n| Ok(x(a, n)?.wrapping_sub(y(a, n)?))),
                BinOp::Mul => Box::new(move |a, n| Ok(x(a, n)?.wrapping_mul(y(a, n)?))),
                BinOp::Div => Box::new(move |a, n| {
                    let (p, q) = (x(a, n)?, y(a, n)?);
                    p.checked_div(q).ok_or(Fault::DivideByZero)
                }),
                BinOp::Mod => Box::new(move |a, n| {
                    let (p, q) = (x(a, n)?, y(a, n)?);
                    p.checked_rem_euclid(q).ok_or(Fault::DivideByZero)
                }),
                // Only arithmetic is compiled (see `lower`).
                _ => Box::new(|_, _| Err(Fault::Kind("integers"))),
            }
        }
    }
}

/// The outcome of [`Host::merge_fold`](crate::Host::merge_fold).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoldStep {
    /// No input holds another element with the key: the fold is complete.
    Done,
    /// An input has nothing yet: run again when it moves.
    Blocked,
    /// The timeslice is used up: run again later.
    Yielded,
    /// The host cannot fold these records natively (their fields are not
    /// plain integers): run the interpreted loop instead.
    Unsupported,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_use_the_interpreters_arithmetic() {
        let spec = FoldSpec::new(
            vec![FoldArg::Key, FoldArg::Acc(0), FoldArg::Acc(1)],
            vec![
                (
                    1,
                    FoldExpr::Bin(
                        BinOp::Add,
                        Box::new(FoldExpr::Acc(0)),
                        Box::new(FoldExpr::Next(0)),
                    ),
                ),
                (
                    2,
                    FoldExpr::Bin(
                        BinOp::Div,
                        Box::new(FoldExpr::Acc(0)),
                        Box::new(FoldExpr::Next(0)),
                    ),
                ),
            ],
            vec![1],
        );
        let mut accs = [i64::MAX, 0];
        spec.step(&mut accs, &[1]).unwrap();
        // Both from the values before the step; addition wraps.
        assert_eq!(accs, [i64::MIN, i64::MAX]);
        assert_eq!(spec.step(&mut accs, &[0]), Err(Fault::DivideByZero));
        let sum = FoldSpec::new(
            vec![FoldArg::Acc(0), FoldArg::Key],
            vec![(
                0,
                FoldExpr::Bin(
                    BinOp::Add,
                    Box::new(FoldExpr::Next(0)),
                    Box::new(FoldExpr::Acc(0)),
                ),
            )],
            vec![0],
        );
        assert!(sum.sum.is_some());
        let mut accs = [i64::MAX];
        sum.step(&mut accs, &[2]).unwrap();
        assert_eq!(accs, [i64::MIN + 1]);
    }
}
