//! Rules compiled when they are first started: a function and everything
//! it calls flattened into one straight-line body ([`Flat`]), calls
//! inlined into register windows of their own, so that a run needs no
//! frames, no register resizing per call and no return dispatch.
//!
//! Only loop-free code is compiled: a function with a timeslice check, a
//! backward jump, a merge or a call chain too deep or too large is left to
//! the interpreter whole. Each flattened operation keeps the function and
//! operation it came from, so faults and `log` lines name the same place
//! as the interpreter's. This module must not change what an operation
//! means: the [`Vm`](crate::Vm) runs flattened operations with the
//! interpreter's own helpers.

use crate::code::{FuncId, Module, Op, Reg};

/// The most operations a flattened body may have.
const MAX_OPS: usize = 8192;
/// The deepest chain of inlined calls.
const MAX_DEPTH: usize = 16;

/// A function with its calls inlined: operations over one register file
/// (absolute registers), jumps to absolute positions.
#[derive(Debug)]
pub(crate) struct Flat {
    pub(crate) code: Vec<Op>,
    /// Per operation: the function and operation it was flattened from.
    pub(crate) sites: Vec<(FuncId, u32)>,
    pub(crate) regs: usize,
    /// The form a run takes: typed registers, fused operations.
    pub(crate) typed: crate::typed::Typed,
}

/// `func` flattened, or `None` where it must be interpreted.
pub(crate) fn flatten(module: &Module, func: FuncId) -> Option<Flat> {
    let mut flat = Flat {
        code: Vec::new(),
        sites: Vec::new(),
        regs: module.functions.get(func as usize)?.regs as usize,
        typed: Default::default(),
    };
    inline(module, func, 0, &[], None, &mut flat, 0)?;
    if flat.regs > Reg::MAX as usize {
        return None;
    }
    let params = module.functions[func as usize].params as usize;
    crate::typed::coalesce(&mut flat.code, flat.regs, params);
    flat.typed = crate::typed::compile(&flat.code, flat.regs, params);
    Some(flat)
}

/// Appends `func`'s body with its registers at `base`. A parameter the
/// body never writes is the caller's register it was given (`args`,
/// absolute), not a copy: the caller's registers do not change while the
/// callee runs. A callee's `Return` becomes a move to `ret` (caller's
/// register, absolute) and a jump past the body; the entry function's
/// stays a `Return`.
fn inline(
    module: &Module,
    func: FuncId,
    base: usize,
    args: &[Reg],
    ret: Option<Reg>,
    flat: &mut Flat,
    depth: usize,
) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    let f = module.functions.get(func as usize)?;
    let mut renamed: Vec<Option<Reg>> = args.iter().map(|a| Some(*a)).collect();
    for op in &f.code {
        if let Some(w) = written(op) {
            if let Some(slot) = renamed.get_mut(w as usize) {
                *slot = None;
            }
        }
    }
    let r = |x: Reg| -> Option<Reg> {
        match renamed.get(x as usize) {
            Some(Some(given)) => Some(*given),
            _ => Reg::try_from(base + x as usize).ok(),
        }
    };
    // Where each operation of `f` starts in the flat body, and the jumps
    // to patch once every start is known.
    let mut starts = vec![0u32; f.code.len() + 1];
    let mut patches: Vec<(usize, u32)> = Vec::new();
    let mut exits: Vec<usize> = Vec::new();
    for (pc, op) in f.code.iter().enumerate() {
        starts[pc] = flat.code.len() as u32;
        if flat.code.len() > MAX_OPS {
            return None;
        }
        let site = (func, pc as u32);
        let push = |flat: &mut Flat, op: Op| {
            flat.code.push(op);
            flat.sites.push(site);
        };
        let mapped = match op {
            Op::CheckSlice | Op::Merge { .. } | Op::MergeFold { .. } => return None,
            Op::Jump { to } | Op::JumpIfFalse { to, .. } if (*to as usize) <= pc => return None,
            Op::Jump { to } => {
                patches.push((flat.code.len(), *to));
                Op::Jump { to: 0 }
            }
            Op::JumpIfFalse { cond, to } => {
                patches.push((flat.code.len(), *to));
                Op::JumpIfFalse {
                    cond: r(*cond)?,
                    to: 0,
                }
            }
            Op::Call { dst, func: g, args } => {
                let callee = module.functions.get(*g as usize)?;
                let window = flat.regs;
                flat.regs += callee.regs as usize;
                if flat.regs > Reg::MAX as usize {
                    return None;
                }
                let given: Vec<Reg> = args.iter().map(|a| r(*a)).collect::<Option<_>>()?;
                let callee_renamed = renamed_params(callee);
                for (i, a) in given.iter().enumerate() {
                    if !callee_renamed.get(i).copied().unwrap_or(false) {
                        let dst = Reg::try_from(window + i).ok()?;
                        push(flat, Op::Move { dst, src: *a });
                    }
                }
                inline(module, *g, window, &given, Some(r(*dst)?), flat, depth + 1)?;
                continue;
            }
            Op::Return { src } => match ret {
                None => Op::Return { src: r(*src)? },
                Some(dst) => {
                    push(flat, Op::Move { dst, src: r(*src)? });
                    exits.push(flat.code.len());
                    Op::Jump { to: 0 }
                }
            },
            op => remap(op, &r)?,
        };
        push(flat, mapped);
    }
    let end = flat.code.len() as u32;
    starts[f.code.len()] = end;
    for (at, to) in patches {
        let target = *starts.get(to as usize)?;
        if let Op::Jump { to } | Op::JumpIfFalse { to, .. } = &mut flat.code[at] {
            *to = target;
        }
    }
    for at in exits {
        flat.code[at] = Op::Jump { to: end };
    }
    Some(())
}

/// Per parameter of `f`: whether inlining renames it to the caller's
/// register (`f` never writes it).
fn renamed_params(f: &crate::code::Function) -> Vec<bool> {
    let mut renamed = vec![true; f.params as usize];
    for op in &f.code {
        if let Some(slot) = written(op).and_then(|w| renamed.get_mut(w as usize)) {
            *slot = false;
        }
    }
    renamed
}

/// The register `op` writes, if any (a `StoreRef`'s target counts: it
/// writes the register when the target is no state).
pub(crate) fn written(op: &Op) -> Option<Reg> {
    match op {
        Op::Const { dst, .. }
        | Op::Move { dst, .. }
        | Op::Chan { dst, .. }
        | Op::LoadState { dst, .. }
        | Op::Field { dst, .. }
        | Op::Index { dst, .. }
        | Op::Unary { dst, .. }
        | Op::Binary { dst, .. }
        | Op::Builtin { dst, .. }
        | Op::Record { dst, .. }
        | Op::List { dst, .. }
        | Op::Tuple { dst, .. }
        | Op::Call { dst, .. }
        | Op::Merge { dst, .. }
        | Op::StateRef { dst, .. }
        | Op::Deref { dst, .. } => Some(*dst),
        Op::Push { list, .. } => Some(*list),
        Op::StoreRef { target, .. } => Some(*target),
        Op::IndexSet { .. }
        | Op::StoreState { .. }
        | Op::Send { .. }
        | Op::Jump { .. }
        | Op::JumpIfFalse { .. }
        | Op::MergeFold { .. }
        | Op::Release { .. }
        | Op::CheckSlice
        | Op::Return { .. } => None,
    }
}

/// `op` with its registers moved by `r` (no jumps, calls or returns).
pub(crate) fn remap(op: &Op, r: &impl Fn(Reg) -> Option<Reg>) -> Option<Op> {
    let rs = |xs: &[Reg]| -> Option<Box<[Reg]>> { xs.iter().map(|x| r(*x)).collect() };
    Some(match op {
        Op::Const { dst, value } => Op::Const {
            dst: r(*dst)?,
            value: value.clone(),
        },
        Op::Move { dst, src } => Op::Move {
            dst: r(*dst)?,
            src: r(*src)?,
        },
        Op::Chan { dst, chan } => Op::Chan {
            dst: r(*dst)?,
            chan: *chan,
        },
        Op::LoadState { dst, state } => Op::LoadState {
            dst: r(*dst)?,
            state: *state,
        },
        Op::StoreState { state, src } => Op::StoreState {
            state: *state,
            src: r(*src)?,
        },
        Op::Field {
            dst,
            src,
            record,
            field,
        } => Op::Field {
            dst: r(*dst)?,
            src: r(*src)?,
            record: *record,
            field: *field,
        },
        Op::Index { dst, base, index } => Op::Index {
            dst: r(*dst)?,
            base: r(*base)?,
            index: r(*index)?,
        },
        Op::IndexSet { base, index, src } => Op::IndexSet {
            base: r(*base)?,
            index: r(*index)?,
            src: r(*src)?,
        },
        Op::Unary { op, dst, src } => Op::Unary {
            op: *op,
            dst: r(*dst)?,
            src: r(*src)?,
        },
        Op::Binary { op, dst, a, b } => Op::Binary {
            op: *op,
            dst: r(*dst)?,
            a: r(*a)?,
            b: r(*b)?,
        },
        Op::Builtin { f, dst, args } => Op::Builtin {
            f: *f,
            dst: r(*dst)?,
            args: rs(args)?,
        },
        Op::Record { dst, record, args } => Op::Record {
            dst: r(*dst)?,
            record: *record,
            args: rs(args)?,
        },
        Op::List { dst, items } => Op::List {
            dst: r(*dst)?,
            items: rs(items)?,
        },
        Op::Push { list, src } => Op::Push {
            list: r(*list)?,
            src: r(*src)?,
        },
        Op::Tuple { dst, items } => Op::Tuple {
            dst: r(*dst)?,
            items: rs(items)?,
        },
        Op::Send { src, chan } => Op::Send {
            src: r(*src)?,
            chan: r(*chan)?,
        },
        Op::Release { src, unless } => Op::Release {
            src: r(*src)?,
            unless: rs(unless)?,
        },
        Op::StateRef { dst, state } => Op::StateRef {
            dst: r(*dst)?,
            state: *state,
        },
        Op::Deref { dst, src } => Op::Deref {
            dst: r(*dst)?,
            src: r(*src)?,
        },
        Op::StoreRef { target, src } => Op::StoreRef {
            target: r(*target)?,
            src: r(*src)?,
        },
        Op::Jump { .. }
        | Op::JumpIfFalse { .. }
        | Op::Call { .. }
        | Op::Return { .. }
        | Op::CheckSlice
        | Op::Merge { .. }
        | Op::MergeFold { .. } => return None,
    })
}
