//! The parse plan: each block's operations lowered, once when the grammar
//! loads, into the steps the parser runs. Expressions are folded and
//! lowered ([`IntExpr`]); checks of values against constants become range
//! tests ([`Pred`]); bit-field variables become a shift and a mask;
//! switches over constants keep their cases as values; runs of
//! fixed-width fields (the Memcached header, packet headers) are fused
//! into one step with one bounds check; and each unit's lists are listed,
//! so that a reset clears only the elements a message used.
//!
//! Block ids and operation indices are the grammar's: a step names the
//! operation it runs, for errors and for what the plan leaves general.

use crate::eval::{slot_val, Env, EvalFail, Val};
use crate::grammar::ast::ByteOrder;
use crate::int_expr::{fold, int_valued, lower, ConstOp, IntExpr, Node, Operand};
use crate::program::{BlockId, CExpr, Elem, Len, Op, OpKind, Scalar, UnitInfo};
use crate::ranges::check_ranges;
use std::sync::Arc;

#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Steps per block, indexed like the grammar's blocks.
    pub blocks: Vec<Vec<Step>>,
    /// Per unit, the lists of its layout, by position.
    pub lists: Vec<Box<[ListRegion]>>,
}

/// The slots a list reserves in a unit's layout: its count slot, then room
/// for its elements. A parser writes elements only below the count, so a
/// reset clears the elements the count says were written and not the
/// rest (an HTTP head reserves 100 headers and mostly uses a few).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ListRegion {
    pub count: u32,
    pub elem_slots: u32,
    /// One past the region's last slot.
    pub end: u32,
}

#[derive(Debug)]
pub(crate) struct Step {
    /// Index of the block's operation this step runs.
    pub op: u32,
    /// The operation's slot, relative to the unit's base.
    pub slot: Option<u16>,
    /// `&requires`, lowered.
    pub check: Option<Check>,
    pub kind: StepKind,
}

#[derive(Debug)]
pub(crate) enum StepKind {
    /// Fixed-width fields taken at once when all their bytes are in the
    /// buffer. The next `covers` steps are the same fields one by one, for
    /// when they are not.
    Run(Box<Run>),
    /// A binary integer.
    Int(IntField),
    /// Bytes of a computed length (`&length`), not streamed.
    Bytes {
        len: IntExpr,
        max: u32,
    },
    /// A Hadoop VInt.
    VInt,
    /// Any other scalar, read by the general scalar reader.
    Scalar,
    Var(ValExpr),
    Switch(Box<Switch>),
    Unit(BlockId),
    List,
    /// A `&stream` field or list.
    Stream,
    /// Writes nothing when parsing (`&serialize` of a variable).
    Nothing,
    /// Stores where the unit begins (`OpKind::Mark`).
    Mark,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct IntField {
    pub width: u8,
    pub signed: bool,
    pub little: bool,
}

impl IntField {
    /// Decodes `raw`, which is `width` bytes long.
    #[inline]
    pub fn decode(self, raw: &[u8]) -> crate::Slot {
        // The usual widths as single loads; others byte by byte.
        let v = match (raw.len(), self.little) {
            (1, _) => raw[0] as u64,
            (2, false) => u16::from_be_bytes([raw[0], raw[1]]) as u64,
            (2, true) => u16::from_le_bytes([raw[0], raw[1]]) as u64,
            (4, false) => u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) as u64,
            (4, true) => u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]) as u64,
            (8, false) => u64::from_be_bytes(raw.try_into().expect("eight bytes")),
            (8, true) => u64::from_le_bytes(raw.try_into().expect("eight bytes")),
            (_, false) => raw.iter().fold(0, |v, b| v << 8 | *b as u64),
            (_, true) => raw.iter().rev().fold(0, |v, b| v << 8 | *b as u64),
        };
        if self.signed {
            let shift = 64 - 8 * raw.len() as u32;
            crate::Slot::SInt(((v << shift) as i64) >> shift)
        } else {
            crate::Slot::Int(v)
        }
    }
}

#[derive(Debug)]
pub(crate) struct Run {
    /// Bytes the fields take in all.
    pub width: u32,
    /// How many steps after this one the run stands for.
    pub covers: u32,
    /// The integers with a slot, decoded first in one tight loop: no
    /// expression of the run reads a later field, so decoding ahead
    /// changes nothing that `fields` then computes or checks in order.
    pub ints: Box<[RunInt]>,
    /// The fields in order, for what is left: checks, variables, byte
    /// ranges and literals (integers are [`RunKind::Nothing`] here).
    pub fields: Box<[RunField]>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct RunInt {
    pub at: u16,
    pub slot: u16,
    pub field: IntField,
}

#[derive(Debug)]
pub(crate) struct RunField {
    pub op: u32,
    /// Where the field starts and ends, from the start of the run.
    pub at: u32,
    pub end: u32,
    pub slot: Option<u16>,
    pub check: Option<Check>,
    pub kind: RunKind,
}

#[derive(Debug)]
pub(crate) enum RunKind {
    Int(IntField),
    /// Bytes of a constant length.
    Bytes,
    Literal {
        bytes: Arc<[u8]>,
        nocase: bool,
    },
    Var(ValExpr),
    Nothing,
}

/// Inclusive bounds of passing values.
pub(crate) type Range = (i128, i128);

/// A `&requires` check.
#[derive(Debug)]
pub(crate) struct Check {
    pub expr: IntExpr,
    /// The check as range tests, when it compares values with constants
    /// only.
    pub pred: Option<Pred>,
}

/// Range tests of integer values combined with `&&`, `||` and `!`:
/// `($$ == -1 && self.key_len == -1) || ($$ >= 0 && self.key_len >= 0)`.
/// Where every value it reads is an integer, it is the check's result.
#[derive(Debug)]
pub(crate) enum Pred {
    Test(Operand, Box<[Range]>),
    And(Box<Pred>, Box<Pred>),
    Or(Box<Pred>, Box<Pred>),
    Not(Box<Pred>),
}

impl Pred {
    fn of(e: &IntExpr) -> Option<Pred> {
        if let Some((x, r)) = check_ranges(e) {
            return Some(Pred::Test(x, r.into()));
        }
        let IntExpr::Node(n) = e else { return None };
        let b = |e: &IntExpr| Pred::of(e).map(Box::new);
        Some(match &**n {
            Node::And(x, y) => Pred::And(b(x)?, b(y)?),
            Node::Or(x, y) => Pred::Or(b(x)?, b(y)?),
            Node::Not(x) => Pred::Not(b(x)?),
            _ => return None,
        })
    }
}

impl Check {
    fn new(e: &CExpr) -> Check {
        let expr = lower(e);
        Check {
            pred: Pred::of(&expr),
            expr,
        }
    }
}

/// An expression whose value may be an integer or bytes.
#[derive(Debug)]
pub(crate) enum ValExpr {
    Slot(u16),
    /// A bit field of an unsigned integer slot, `(slot >> shift) & mask`
    /// (`self.flags_frag / 8192 % 2`), worked out in 64 bits; any other
    /// value of the slot goes through the expression.
    Bits {
        slot: u16,
        shift: u32,
        mask: u64,
        expr: IntExpr,
    },
    Int(IntExpr),
    General(CExpr),
}

#[derive(Debug)]
pub(crate) struct Switch {
    pub on: ValExpr,
    pub cases: Cases,
    pub default: Option<BlockId>,
}

#[derive(Debug)]
pub(crate) enum Cases {
    /// Every case value a constant: compared without evaluation.
    Consts(Vec<(Case, BlockId)>),
    General(Vec<(CExpr, BlockId)>),
}

#[derive(Debug)]
pub(crate) enum Case {
    Int(i128),
    /// Bytes, with their [`bytes_tag`] to skip most comparisons.
    Bytes(Arc<[u8]>, u32),
}

/// The length, first and last byte of `b`: bytes with different tags
/// differ.
#[inline]
fn bytes_tag(b: &[u8]) -> u32 {
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => (b.len() as u32) << 16 | (*f as u32) << 8 | *l as u32,
        _ => 0,
    }
}

impl Plan {
    pub fn new(blocks: &[Vec<Op>], units: &[UnitInfo]) -> Plan {
        Plan {
            blocks: blocks.iter().map(|ops| block(ops)).collect(),
            lists: units
                .iter()
                .map(|u| {
                    let mut r = Vec::new();
                    list_regions(blocks, u.block, 0, 0, &mut r);
                    // Small lists are cheaper to clear whole than to skip.
                    r.retain(|l| l.end - l.count > 16);
                    r.sort_unstable();
                    r.dedup();
                    // Regions that overlap (none should) would make a reset
                    // skip slots: then the unit is cleared whole.
                    let disjoint = r.windows(2).all(|w| w[0].end <= w[1].count);
                    let fits = r.iter().all(|x| x.end <= u.slots as u32);
                    let r: Box<[ListRegion]> = if disjoint && fits {
                        r.into()
                    } else {
                        Box::new([])
                    };
                    r
                })
                .collect(),
        }
    }
}

/// The lists of a block, of its switch cases and of its nested units (not
/// of list elements, which a reset clears whole), at slot offset `base`.
fn list_regions(
    blocks: &[Vec<Op>],
    block: BlockId,
    base: u32,
    depth: usize,
    out: &mut Vec<ListRegion>,
) {
    // Grammars nest at most this deep (the parser's frame limit).
    if depth > 64 {
        return;
    }
    for op in blocks.get(block as usize).into_iter().flatten() {
        match &op.kind {
            OpKind::List { elem, max, .. } => {
                let Some(s) = op.slot else { continue };
                let elem_slots = match elem {
                    Elem::Unit { slots, .. } => *slots as u32,
                    Elem::Scalar(_) => 1,
                };
                let stored = if op.stream { 1 } else { *max };
                let count = base + s as u32;
                out.push(ListRegion {
                    count,
                    elem_slots,
                    end: count.saturating_add(1 + stored.saturating_mul(elem_slots)),
                });
            }
            OpKind::Switch { cases, default, .. } => {
                for b in cases.iter().map(|(_, b)| *b).chain(*default) {
                    list_regions(blocks, b, base, depth + 1, out);
                }
            }
            OpKind::Unit { block } => {
                let inner = base + op.slot.unwrap_or(0) as u32;
                list_regions(blocks, *block, inner, depth + 1, out);
            }
            _ => {}
        }
    }
}

fn block(ops: &[Op]) -> Vec<Step> {
    let mut steps = Vec::with_capacity(ops.len());
    let mut i = 0;
    while i < ops.len() {
        // Runs are kept short enough for 16-bit offsets.
        let mut width = 0u32;
        let n = ops[i..]
            .iter()
            .take_while(|op| match run_kind(op) {
                Some((_, w)) if width + w <= u16::MAX as u32 => {
                    width += w;
                    true
                }
                _ => false,
            })
            .count();
        if n >= 2 {
            let mut fields = Vec::with_capacity(n);
            let mut ints = Vec::new();
            let mut width = 0u32;
            for (k, op) in ops[i..i + n].iter().enumerate() {
                let (mut kind, w) = run_kind(op).expect("counted as run fields");
                if let (RunKind::Int(field), Some(slot)) = (&kind, op.slot) {
                    ints.push(RunInt {
                        at: width as u16,
                        slot,
                        field: *field,
                    });
                    kind = RunKind::Nothing;
                }
                let check = op.requires.as_ref().map(Check::new);
                // Fields left with nothing to do are dropped.
                if !matches!(kind, RunKind::Nothing) || check.is_some() {
                    fields.push(RunField {
                        op: (i + k) as u32,
                        at: width,
                        end: width + w,
                        slot: op.slot,
                        check,
                        kind,
                    });
                }
                width += w;
            }
            steps.push(Step {
                op: i as u32,
                slot: None,
                check: None,
                kind: StepKind::Run(Box::new(Run {
                    width,
                    covers: n as u32,
                    ints: ints.into(),
                    fields: fields.into(),
                })),
            });
        }
        for (k, op) in ops[i..i + n.max(1)].iter().enumerate() {
            steps.push(step((i + k) as u32, op));
        }
        i += n.max(1);
    }
    steps
}

fn step(index: u32, op: &Op) -> Step {
    let kind = match &op.kind {
        _ if op.stream => StepKind::Stream,
        OpKind::Scalar(Scalar::Int {
            bytes,
            signed,
            order,
        }) => StepKind::Int(IntField {
            width: *bytes,
            signed: *signed,
            little: *order == ByteOrder::Little,
        }),
        OpKind::Scalar(Scalar::Bytes {
            len: Len::Expr(e),
            max,
        }) => StepKind::Bytes {
            len: lower(e),
            max: *max,
        },
        OpKind::Scalar(Scalar::VInt) => StepKind::VInt,
        OpKind::Scalar(_) => StepKind::Scalar,
        OpKind::Var(e) => StepKind::Var(val_expr(e)),
        OpKind::SerializeVar { .. } => StepKind::Nothing,
        OpKind::Mark => StepKind::Mark,
        OpKind::Switch { on, cases, default } => StepKind::Switch(Box::new(Switch {
            on: val_expr(on),
            cases: const_cases(cases),
            default: *default,
        })),
        OpKind::Unit { block } => StepKind::Unit(*block),
        OpKind::List { .. } => StepKind::List,
    };
    Step {
        op: index,
        slot: op.slot,
        check: op.requires.as_ref().map(Check::new),
        kind,
    }
}

/// How an operation takes part in a fused run, and its width; `None` if
/// its width is not fixed or it cannot fail the same way within a run.
fn run_kind(op: &Op) -> Option<(RunKind, u32)> {
    if op.stream {
        return None;
    }
    Some(match &op.kind {
        OpKind::Scalar(Scalar::Int {
            bytes,
            signed,
            order,
        }) => (
            RunKind::Int(IntField {
                width: *bytes,
                signed: *signed,
                little: *order == ByteOrder::Little,
            }),
            *bytes as u32,
        ),
        OpKind::Scalar(Scalar::Bytes {
            len: Len::Expr(e),
            max,
        }) => match fold(e) {
            CExpr::Int(n) if n >= 0 && n <= *max as i128 => (RunKind::Bytes, n as u32),
            _ => return None,
        },
        OpKind::Scalar(Scalar::Literal { bytes, nocase }) => (
            RunKind::Literal {
                bytes: bytes.clone(),
                nocase: *nocase,
            },
            bytes.len() as u32,
        ),
        OpKind::Var(e) => (RunKind::Var(val_expr(e)), 0),
        OpKind::SerializeVar { .. } => (RunKind::Nothing, 0),
        _ => return None,
    })
}

pub(crate) fn val_expr(e: &CExpr) -> ValExpr {
    let e = fold(e);
    match &e {
        CExpr::Slot(s) => ValExpr::Slot(*s),
        _ => match lower(&e) {
            IntExpr::SlotChain(slot, ops) => match bit_field(&ops) {
                Some((shift, mask)) => ValExpr::Bits {
                    slot,
                    shift,
                    mask,
                    expr: IntExpr::SlotChain(slot, ops),
                },
                None => ValExpr::Int(IntExpr::SlotChain(slot, ops)),
            },
            i if int_valued(&i) => ValExpr::Int(i),
            _ => ValExpr::General(e),
        },
    }
}

/// Shifts and masks as one shift and one mask, for values that are not
/// negative (where `/ 2^k` is `>> k` and `% 2^k` is `& (2^k - 1)`).
fn bit_field(ops: &[ConstOp]) -> Option<(u32, u64)> {
    let (mut shift, mut mask) = (0u32, u64::MAX);
    for op in ops {
        match *op {
            ConstOp::Shr(k) if shift + k < 64 => {
                shift += k;
                mask >>= k;
            }
            ConstOp::Mask(m) => mask &= u64::try_from(m).ok()?,
            _ => return None,
        }
    }
    Some((shift, mask))
}

fn const_cases(cases: &[(CExpr, BlockId)]) -> Cases {
    let consts: Option<Vec<(Case, BlockId)>> = cases
        .iter()
        .map(|(c, b)| match fold(c) {
            CExpr::Int(v) => Some((Case::Int(v), *b)),
            CExpr::Str(s) => {
                let tag = bytes_tag(&s);
                Some((Case::Bytes(s, tag), *b))
            }
            _ => None,
        })
        .collect();
    match consts {
        Some(c) => Cases::Consts(c),
        None => Cases::General(cases.to_vec()),
    }
}

impl<'a> Env<'a> {
    pub(crate) fn val_of(&self, e: &'a ValExpr) -> Result<Val<'a>, EvalFail> {
        match e {
            ValExpr::Slot(s) => Ok(slot_val(self.slots, self.data, self.base + *s as usize)),
            ValExpr::Int(i) | ValExpr::Bits { expr: i, .. } => self.int_of(i).map(Val::Int),
            ValExpr::General(c) => self.eval(c),
        }
    }
}

impl Switch {
    /// The block of the first case equal to `v`, else the default.
    pub fn choose<'a>(&'a self, v: Val<'a>, env: &Env<'a>) -> Option<BlockId> {
        match &self.cases {
            Cases::Consts(cases) => {
                let hit = match v {
                    Val::Int(x) => cases
                        .iter()
                        .find(|(c, _)| matches!(c, Case::Int(y) if *y == x)),
                    Val::Bytes(x) => {
                        let tag = bytes_tag(x);
                        cases
                            .iter()
                            .find(|(c, _)| matches!(c, Case::Bytes(y, t) if *t == tag && **y == *x))
                    }
                    _ => None,
                };
                hit.map(|(_, b)| *b).or(self.default)
            }
            Cases::General(cases) => cases
                .iter()
                .find(|(c, _)| env.eval(c).is_ok_and(|cv| same(v, cv)))
                .map(|(_, b)| *b)
                .or(self.default),
        }
    }
}

fn same(a: Val, b: Val) -> bool {
    match (a, b) {
        (Val::Int(x), Val::Int(y)) => x == y,
        (Val::Bytes(x), Val::Bytes(y)) => x == y,
        _ => false,
    }
}
