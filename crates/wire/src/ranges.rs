//! Checks as range tests: a check that compares one integer (`$$` or a
//! slot) with constants, through `&&`, `||` and `!`, holds for a set of
//! values, kept as sorted ranges. When the value is an integer, testing it
//! against the ranges gives the check's result without evaluating it.

use crate::int_expr::{ConstOp, IntExpr, Node, Operand};

/// Values as sorted, disjoint, inclusive ranges.
pub(crate) type Ranges = Vec<(i128, i128)>;

/// The values of one integer (`$$` or a slot) for which a check holds,
/// when the check compares nothing else, with constants, through `&&`,
/// `||` and `!` (`$$ == 0x80 || $$ == 0x81` is `[0x80, 0x81]` of `$$`).
/// Then the check is a range test. `None` for any other check.
pub(crate) fn check_ranges(e: &IntExpr) -> Option<(Operand, Ranges)> {
    let x = subject(e)?;
    Some((x, ranges(e, x)?))
}

/// The first value a check compares.
fn subject(e: &IntExpr) -> Option<Operand> {
    match e {
        IntExpr::Dollar => Some(Operand::Dollar),
        IntExpr::Slot(s) | IntExpr::SlotChain(s, _) => Some(Operand::Slot(*s)),
        IntExpr::Node(n) => match &**n {
            Node::Not(x) | Node::Chain(x, _) => subject(x),
            Node::And(x, y) | Node::Or(x, y) | Node::Lt(x, y) | Node::Le(x, y) => {
                subject(x).or_else(|| subject(y))
            }
            Node::EqInt { x, .. } => Some(*x),
            _ => None,
        },
        IntExpr::Const(_) | IntExpr::Sum(_) => None,
    }
}

fn is(e: &IntExpr, x: Operand) -> bool {
    match (e, x) {
        (IntExpr::Dollar, Operand::Dollar) => true,
        (IntExpr::Slot(s), Operand::Slot(t)) => *s == t,
        _ => false,
    }
}

fn ranges(e: &IntExpr, x: Operand) -> Option<Ranges> {
    const ALL: (i128, i128) = (i128::MIN, i128::MAX);
    let compare = |ops: &[ConstOp]| match *ops {
        [ConstOp::Lt(c)] => Some(vec![(i128::MIN, c.checked_sub(1)?)]),
        [ConstOp::Le(c)] => Some(vec![(i128::MIN, c)]),
        [ConstOp::Gt(c)] => Some(vec![(c.checked_add(1)?, i128::MAX)]),
        [ConstOp::Ge(c)] => Some(vec![(c, i128::MAX)]),
        _ => None,
    };
    let n = match e {
        IntExpr::Const(0) => return Some(Vec::new()),
        IntExpr::Const(_) => return Some(vec![ALL]),
        IntExpr::SlotChain(s, ops) if matches!(x, Operand::Slot(t) if t == *s) => {
            return compare(ops)
        }
        IntExpr::Node(n) => n,
        _ => return None,
    };
    let konst = |e: &IntExpr| match e {
        IntExpr::Const(c) => Some(*c),
        _ => None,
    };
    Some(match &**n {
        Node::Not(y) => complement(&ranges(y, x)?),
        Node::And(a, b) => intersect(&ranges(a, x)?, &ranges(b, x)?),
        Node::Or(a, b) => union(ranges(a, x)?, ranges(b, x)?),
        Node::Chain(v, ops) if is(v, x) => compare(ops)?,
        Node::Lt(v, c) if is(v, x) => vec![(i128::MIN, konst(c)?.checked_sub(1)?)],
        Node::Le(v, c) if is(v, x) => vec![(i128::MIN, konst(c)?)],
        Node::Lt(c, v) if is(v, x) => vec![(konst(c)?.checked_add(1)?, i128::MAX)],
        Node::Le(c, v) if is(v, x) => vec![(konst(c)?, i128::MAX)],
        Node::EqInt { x: y, e, eq } if is_same(*y, x) => {
            let c = konst(e)?;
            if *eq {
                vec![(c, c)]
            } else {
                complement(&[(c, c)])
            }
        }
        _ => return None,
    })
}

fn is_same(a: Operand, b: Operand) -> bool {
    match (a, b) {
        (Operand::Dollar, Operand::Dollar) => true,
        (Operand::Slot(s), Operand::Slot(t)) => s == t,
        _ => false,
    }
}

fn complement(r: &[(i128, i128)]) -> Ranges {
    let mut out = Vec::new();
    let mut next = Some(i128::MIN);
    for &(lo, hi) in r {
        if let Some(n) = next {
            if lo > n {
                out.push((n, lo - 1));
            }
        }
        next = hi.checked_add(1);
    }
    if let Some(n) = next {
        out.push((n, i128::MAX));
    }
    out
}

fn intersect(a: &[(i128, i128)], b: &[(i128, i128)]) -> Ranges {
    let mut out: Ranges = a
        .iter()
        .flat_map(|&(l1, h1)| {
            b.iter()
                .map(move |&(l2, h2)| (l1.max(l2), h1.min(h2)))
                .filter(|(lo, hi)| lo <= hi)
        })
        .collect();
    out.sort_unstable();
    out
}

fn union(mut a: Ranges, b: Ranges) -> Ranges {
    a.extend(b);
    a.sort_unstable();
    let mut out: Ranges = Vec::with_capacity(a.len());
    for (lo, hi) in a {
        match out.last_mut() {
            // Overlapping or adjacent: one range.
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// Whether `v` lies in one of the ranges.
#[inline]
pub(crate) fn in_ranges(r: &[(i128, i128)], v: i128) -> bool {
    r.iter().any(|&(lo, hi)| lo <= v && v <= hi)
}
