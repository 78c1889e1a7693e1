//! Whether running `steer` can change anything but the worker it picks.
//!
//! With one worker every frame goes to it whatever `steer` gives, so the
//! dispatcher need not run `steer` (nor parse the frame for it) when
//! `steer` can neither fault nor have an effect: the frame's only other
//! outcome in the dispatcher would be a fault counted and the frame lost.
//! Malformed frames are then counted by the worker, which parses every
//! frame anyway.
//!
//! The proof is conservative: only operations that read the frame, compare,
//! branch, call and `pack` are allowed, and each operand must be a value
//! they cannot fault on (a boolean where a boolean is tested, a plain
//! value, not the unit or a handle, where one is packed or hashed, the
//! frame where a field is read). Anything else, arithmetic included (a
//! field absent from a frame is `None`, which arithmetic faults on), keeps
//! `steer` running.

use crate::host::FieldTable;
use flick_exec::code::{Builtin, Const, FuncId, Module, Op};
use flick_syntax::ast::{BinOp, UnOp};

/// Calls deeper than this are not looked into (the function is taken to
/// be able to fault).
const DEPTH_MAX: usize = 16;

/// Whether function `f`, given the frame as its only argument, surely
/// returns without a fault or an effect.
pub(crate) fn cannot_fault(module: &Module, fields: &FieldTable, f: FuncId) -> bool {
    check(module, fields, f, &[true], 0).is_some()
}

/// What a register surely holds, over every write to it.
#[derive(Clone, Copy)]
struct Holds {
    /// The frame being handled.
    frame: bool,
    /// A boolean.
    boolean: bool,
    /// An integer, boolean, `None` or bytes: what `pack` and `hash` take.
    plain: bool,
}

const NOTHING: Holds = Holds {
    frame: false,
    boolean: false,
    plain: false,
};
const BOOLEAN: Holds = Holds {
    frame: false,
    boolean: true,
    plain: true,
};
const PLAIN: Holds = Holds {
    frame: false,
    boolean: false,
    plain: true,
};

/// `Some(what the function surely returns)` where function `f`, with
/// parameter `i` the frame where `frame_args[i]`, cannot fault; `None`
/// where it might.
fn check(
    module: &Module,
    fields: &FieldTable,
    f: FuncId,
    frame_args: &[bool],
    depth: usize,
) -> Option<Holds> {
    if depth > DEPTH_MAX {
        return None;
    }
    let func = module.functions.get(f as usize)?;
    let params = func.params as usize;
    let mut holds = vec![
        Holds {
            frame: true,
            boolean: true,
            plain: true,
        };
        func.regs as usize
    ];
    // A parameter starts as its argument; a register nothing writes stays
    // the unit, which is none of these.
    let mut written = vec![false; func.regs as usize];
    for (i, h) in holds.iter_mut().enumerate() {
        if i < params {
            *h = Holds {
                frame: frame_args.get(i).copied().unwrap_or(false),
                ..NOTHING
            };
            written[i] = true;
        }
    }
    for op in &func.code {
        if let Some(dst) = written_by(op) {
            *written.get_mut(dst as usize)? = true;
        }
    }
    for (h, w) in holds.iter_mut().zip(&written) {
        if !w {
            *h = NOTHING;
        }
    }
    // What each write gives, until nothing changes (flags only fall).
    let mut returns: Vec<Option<Holds>> = vec![None; func.code.len()];
    loop {
        let mut changed = false;
        for (at, op) in func.code.iter().enumerate() {
            let Some(dst) = written_by(op) else { continue };
            let gives = match op {
                Op::Const { value, .. } => match value {
                    Const::Bool(_) => BOOLEAN,
                    Const::Int(_) | Const::Str(_) | Const::None => PLAIN,
                    Const::Unit => NOTHING,
                },
                Op::Move { src, .. } => *holds.get(*src as usize)?,
                Op::Field { .. } | Op::Builtin { .. } => PLAIN,
                Op::Binary { .. } | Op::Unary { .. } => BOOLEAN,
                Op::Call { func: g, args, .. } => {
                    if returns[at].is_none() {
                        let frames: Vec<bool> = args
                            .iter()
                            .map(|a| holds.get(*a as usize).is_some_and(|h| h.frame))
                            .collect();
                        returns[at] = Some(check(module, fields, *g, &frames, depth + 1)?);
                    }
                    returns[at]?
                }
                _ => return None,
            };
            let h = holds.get_mut(dst as usize)?;
            let after = Holds {
                frame: h.frame && gives.frame,
                boolean: h.boolean && gives.boolean,
                plain: h.plain && gives.plain,
            };
            if (after.frame, after.boolean, after.plain) != (h.frame, h.boolean, h.plain) {
                *h = after;
                changed = true;
                // A call's frame arguments may have changed: look again.
                returns.iter_mut().for_each(|r| *r = None);
            }
        }
        if !changed {
            break;
        }
    }
    let reg = |r: u16| holds.get(r as usize).copied().unwrap_or(NOTHING);
    let mut result = BOOLEAN;
    for op in &func.code {
        let fine = match op {
            Op::Const { .. } | Op::Move { .. } | Op::Jump { .. } | Op::CheckSlice => true,
            // Calls were checked above.
            Op::Call { .. } => true,
            Op::Field {
                src, record, field, ..
            } => {
                reg(*src).frame
                    && fields
                        .get(*record as usize)
                        .and_then(|r| r.get(*field as usize))
                        .is_some_and(|f| f.is_some())
            }
            Op::Binary { op, a, b, .. } => match op {
                BinOp::Eq | BinOp::Ne => reg(*a).plain && reg(*b).plain,
                BinOp::And | BinOp::Or => reg(*a).boolean && reg(*b).boolean,
                _ => false,
            },
            Op::Unary {
                op: UnOp::Not, src, ..
            } => reg(*src).boolean,
            Op::JumpIfFalse { cond, .. } => reg(*cond).boolean,
            Op::Builtin {
                f: Builtin::Pack | Builtin::Hash,
                args,
                ..
            } => args.iter().all(|a| reg(*a).plain),
            Op::Return { src } => {
                let h = reg(*src);
                result.boolean &= h.boolean;
                result.plain &= h.plain;
                true
            }
            _ => false,
        };
        if !fine {
            return None;
        }
    }
    Some(result)
}

/// The register an operation of the allowed kinds writes.
fn written_by(op: &Op) -> Option<u16> {
    match op {
        Op::Const { dst, .. }
        | Op::Move { dst, .. }
        | Op::Field { dst, .. }
        | Op::Binary { dst, .. }
        | Op::Unary { dst, .. }
        | Op::Builtin { dst, .. }
        | Op::Call { dst, .. }
        | Op::Index { dst, .. }
        | Op::Record { dst, .. }
        | Op::List { dst, .. }
        | Op::Tuple { dst, .. }
        | Op::Chan { dst, .. }
        | Op::LoadState { dst, .. }
        | Op::StateRef { dst, .. }
        | Op::Deref { dst, .. }
        | Op::Merge { dst, .. } => Some(*dst),
        _ => None,
    }
}
