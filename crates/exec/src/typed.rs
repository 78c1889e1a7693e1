//! The form a flattened rule runs in: its operations over two register
//! files, integers and booleans unboxed in an `i64` slot per register
//! where every write to the register makes one, everything else a
//! [`Value`](crate::Value) as the interpreter keeps it.
//!
//! A register is typed when each operation that writes it yields an
//! integer (a constant, arithmetic, `-`) or each yields a boolean (a
//! constant, a comparison, `and`, `or`, `not`), moves included, and no
//! run can read it before writing it. Those operations run here on `i64`s;
//! every other operation is the interpreter's own ([`Fast::Value`]), run
//! on `Value`s, with each typed register it reads boxed into its `Value`
//! slot just before. A few common sequences are fused: a field compared
//! with an integer constant or with `None`, a value compared with `None`,
//! such a test (or a `not`) with the conditional jump on it, an integer
//! register stored into a `ref` dictionary without boxing, and jumps to
//! the next operation vanish. Every fast operation keeps the
//! flattened operation it stands for, so faults and `log` lines name the
//! interpreter's positions.
//!
//! What an operation means must not change here: each typed operation
//! computes what [`Vm::binary`](crate::Vm) and its helpers compute for
//! the values the register would hold (integers and booleans, where `int`
//! reads a boolean as 0 or 1), faults included; `crates/exec/tests/compiled.rs`
//! compares the two on random frames.

use crate::code::{Const, Op, Reg};
use flick_syntax::ast::{BinOp, UnOp};

/// What a register holds in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// No write seen yet (only while classifying).
    Unwritten,
    /// A `Value` slot.
    Value,
    /// An `i64` slot holding an integer.
    Int,
    /// An `i64` slot holding a boolean as 0 or 1.
    Bool,
}

impl Class {
    fn join(self, other: Class) -> Class {
        match (self, other) {
            (Class::Unwritten, c) | (c, Class::Unwritten) => c,
            (a, b) if a == b => a,
            _ => Class::Value,
        }
    }

    fn typed(self) -> bool {
        matches!(self, Class::Int | Class::Bool)
    }
}

/// An operand of a typed operation: an `i64` slot or a `Value` slot.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operand {
    Slot(Reg),
    Value(Reg),
}

/// One operation of the typed form. `dst` of a typed operation is an
/// `i64` slot.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Fast {
    /// Flattened operation `at`, run on `Value`s as the interpreter runs it.
    Value {
        at: u32,
    },
    /// The `Value` slot of typed register `reg` set from its `i64` slot.
    Box {
        reg: Reg,
        bool: bool,
    },
    /// The `i64` slot of typed register `reg` set from its `Value` slot,
    /// after the interpreter's operation wrote it.
    Unbox {
        reg: Reg,
    },
    /// `Value` register `dst` set from typed register `src`.
    BoxTo {
        dst: Reg,
        src: Reg,
        bool: bool,
    },
    Set {
        dst: Reg,
        value: i64,
    },
    Move {
        dst: Reg,
        src: Reg,
    },
    /// `not`: of a boolean slot, or of a value (`truthy`, which faults on
    /// anything but a boolean).
    Not {
        dst: Reg,
        src: Operand,
    },
    /// `-` of an integer.
    Neg {
        dst: Reg,
        src: Operand,
    },
    /// Arithmetic or an ordering of two integers, at least one of them in
    /// a slot (so neither is bytes, whose ordering is the interpreter's).
    Int {
        op: BinOp,
        dst: Reg,
        a: Operand,
        b: Operand,
    },
    /// `=` or `<>` of two slots of one class.
    EqSlots {
        dst: Reg,
        a: Reg,
        b: Reg,
        ne: bool,
    },
    /// `=` or `<>` of a value and a slot: equal only where the value is
    /// the slot's class and number.
    EqValue {
        dst: Reg,
        v: Reg,
        slot: Reg,
        bool: bool,
        ne: bool,
    },
    /// `and` or `or` of two boolean slots.
    Logic {
        dst: Reg,
        a: Reg,
        b: Reg,
        or: bool,
    },
    /// Any other binary operation of two values, the interpreter's, its
    /// integer or boolean result unboxed.
    Binary {
        op: BinOp,
        dst: Reg,
        a: Reg,
        b: Reg,
    },
    /// `v = k` or `v <> k` of a value and an integer constant.
    EqValueK {
        dst: Reg,
        v: Reg,
        k: i64,
        ne: bool,
    },
    /// `a = k` or `a <> k` of an integer slot and a constant.
    EqSlotK {
        dst: Reg,
        a: Reg,
        k: i64,
        ne: bool,
    },
    /// Arithmetic or an ordering of an integer and an integer constant.
    IntK {
        op: BinOp,
        dst: Reg,
        a: Operand,
        k: i64,
    },
    /// `v = None` or `v <> None`.
    IsNone {
        dst: Reg,
        src: Reg,
        ne: bool,
    },
    /// `msg.field = k` or `<> k` of an integer constant `k`, without the
    /// field's value stored anywhere.
    FieldIsInt {
        dst: Reg,
        src: Reg,
        record: u16,
        field: u16,
        k: i64,
        ne: bool,
    },
    /// `msg.field = None` or `<> None`.
    FieldIsNone {
        dst: Reg,
        src: Reg,
        record: u16,
        field: u16,
        ne: bool,
    },
    /// Field reads `first..first + n`, each read only by the `pack` that
    /// follows them: packed without storing them.
    PackFields {
        first: u32,
        n: u32,
    },
    /// A `ref` dictionary parameter dereferenced (`at`) and indexed
    /// (`at + 1`), the dictionary never stored in a register.
    DerefIndex {
        at: u32,
    },
    /// The same, stored into (`d[k] := v`).
    DerefIndexSet {
        at: u32,
    },
    /// The same, of an integer register's value, never boxed.
    DerefIndexSetInt {
        at: u32,
    },
    /// `d[k] := d[k] + x` on a `ref` dictionary: the dereference at `at`
    /// and the index after it, the addition at `add` (of the constant
    /// made just before it where `konst`, else of its second operand, a
    /// value), and the dereference at `add + 1` with the store after it.
    /// The host adds in place where the entry holds an integer; otherwise
    /// the operations run as the interpreter runs them. (Kept to three
    /// words: a larger operation made every dispatch dearer.)
    DictAdd {
        at: u32,
        add: u32,
        konst: bool,
    },
    /// `frame_len(msg)` into a `Value` register, asked of the host as an
    /// integer.
    FrameLen {
        dst: Reg,
        src: Reg,
    },
    /// `Value` register `dst` set to a reference to state `state`.
    StateRef {
        dst: Reg,
        state: u16,
    },
    /// `Value` register `dst` set to `()`.
    Unit {
        dst: Reg,
    },
    /// `Value` register `dst` set to a copy of `Value` register `src`.
    MoveValue {
        dst: Reg,
        src: Reg,
    },
    /// A jump taken where boolean slot `cond` is true (a `not` fused
    /// with the jump on it).
    JumpIf {
        cond: Reg,
        to: u32,
    },
    /// A jump taken unless `v = None` (`v <> None` where `ne`): an
    /// [`Fast::IsNone`] fused with the jump on it.
    JumpUnlessNone {
        src: Reg,
        ne: bool,
        to: u32,
    },
    /// A jump taken unless `msg.field = k` (`<> k` where `ne`): a
    /// [`Fast::FieldIsInt`] fused with the jump on it.
    JumpUnlessField {
        src: Reg,
        record: u16,
        field: u16,
        k: i64,
        ne: bool,
        to: u32,
    },
    Jump {
        to: u32,
    },
    JumpIfNot {
        cond: Reg,
        to: u32,
    },
    /// A jump on a `Value` register (`truthy`).
    JumpIfNotValue {
        cond: Reg,
        to: u32,
    },
    Return {
        src: Reg,
    },
    /// A send that is the last use of its record (see
    /// [`Host::send_owned`](crate::Host::send_owned)).
    SendOwned {
        src: Reg,
        chan: Reg,
    },
}

/// `d[k] := d[k] + x` at `pc`: a dereference and an index, then perhaps
/// a constant or `frame_len(msg)` made for the addition alone, the
/// addition of the entry and `x`, and a dereference of the same reference
/// and a store under the same key of the sum, each value read once and
/// nothing jumped into. Whether a constant is added, how many operations
/// the pattern takes, and where the `frame_len` is, if any.
fn dict_add(
    code: &[Op],
    pc: usize,
    single: &dyn Fn(Reg) -> bool,
    target: &[bool],
    cls: &dyn Fn(Reg) -> Class,
) -> Option<(bool, usize, Option<usize>)> {
    let (
        Op::Deref { dst: x1, src: r },
        Op::Index {
            dst: v,
            base,
            index,
        },
    ) = (code.get(pc)?, code.get(pc + 1)?)
    else {
        return None;
    };
    // What `x` is, when made between the read and the addition: a
    // constant, or the frame's length.
    let (made, between) = match code.get(pc + 2)? {
        Op::Const {
            dst,
            value: Const::Int(_),
        } => (Some((*dst, true)), None),
        Op::Builtin {
            f: crate::code::Builtin::FrameLen,
            dst,
            args,
        } if args.len() == 1 && cls(*dst) == Class::Value && !cls(args[0]).typed() => {
            (Some((*dst, false)), Some(pc + 2))
        }
        _ => (None, None),
    };
    let sum = pc + 2 + made.is_some() as usize;
    let (
        Op::Binary {
            op: BinOp::Add,
            dst: y,
            a,
            b,
        },
        Op::Deref { dst: x2, src: r2 },
        Op::IndexSet {
            base: base2,
            index: index2,
            src,
        },
    ) = (code.get(sum)?, code.get(sum + 1)?, code.get(sum + 2)?)
    else {
        return None;
    };
    let konst = match made {
        Some((m, konst)) if *b == m && single(m) => konst,
        Some(_) => return None,
        // A typed register would be boxed for the addition: not fused.
        None if cls(*b).typed() => return None,
        None => false,
    };
    let fits = base == x1
        && a == v
        && b != v
        && r2 == r
        && base2 == x2
        && index2 == index
        && src == y
        && ![*x1, *v, *y, *x2, *b].contains(index)
        && [*x1, *v, *y, *x2].into_iter().all(single)
        && cls(*y) == Class::Int
        && cls(*index) == Class::Value
        && !cls(*r).typed()
        && (pc + 1..=sum + 2).all(|p| !target[p]);
    fits.then_some((konst, sum + 3 - pc, between))
}

/// A flattened body in its typed form.
#[derive(Debug, Default)]
pub(crate) struct Typed {
    pub(crate) code: Vec<Fast>,
    /// Per operation: the flattened operation whose site it reports.
    pub(crate) at: Vec<u32>,
    /// `Value` registers a run may read before writing them, reset to
    /// `Unit` when a run starts (as the interpreter's fresh frame has
    /// them); no other register is reset.
    pub(crate) reset: Vec<Reg>,
}

/// Registers `op` reads.
pub(crate) fn reads(op: &Op, out: &mut Vec<Reg>) {
    out.clear();
    match op {
        Op::Const { .. }
        | Op::Chan { .. }
        | Op::LoadState { .. }
        | Op::StateRef { .. }
        | Op::Jump { .. }
        | Op::CheckSlice => {}
        Op::Move { src, .. }
        | Op::StoreState { src, .. }
        | Op::Field { src, .. }
        | Op::Unary { src, .. }
        | Op::Deref { src, .. }
        | Op::Return { src } => out.push(*src),
        Op::Index { base, index, .. } => out.extend([*base, *index]),
        Op::IndexSet { base, index, src } => out.extend([*base, *index, *src]),
        Op::Binary { a, b, .. } => out.extend([*a, *b]),
        Op::Builtin { args, .. } | Op::Record { args, .. } => out.extend(args.iter()),
        Op::List { items, .. } | Op::Tuple { items, .. } => out.extend(items.iter()),
        Op::Push { list, src } => out.extend([*list, *src]),
        Op::Send { src, chan } => out.extend([*src, *chan]),
        Op::JumpIfFalse { cond, .. } => out.push(*cond),
        Op::Release { src, unless } => {
            out.push(*src);
            out.extend(unless.iter());
        }
        Op::StoreRef { target, src } => out.extend([*target, *src]),
        Op::Call { args, .. } => out.extend(args.iter()),
        Op::Merge { .. } | Op::MergeFold { .. } => {}
    }
}

/// The register `op` surely writes (a `StoreRef`'s target only maybe).
fn surely_written(op: &Op) -> Option<Reg> {
    match op {
        Op::StoreRef { .. } => None,
        op => crate::compiled::written(op),
    }
}

fn is_arith(op: BinOp) -> bool {
    matches!(
        op,
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod
    )
}

/// The class of what `op` writes, given the classes of registers so far.
fn yields(op: &Op, class: &[Class]) -> Class {
    match op {
        Op::Const {
            value: Const::Int(_),
            ..
        } => Class::Int,
        Op::Const {
            value: Const::Bool(_),
            ..
        } => Class::Bool,
        // Arithmetic gives an integer or faults; every other operator a
        // boolean or faults (`Vm::binary`).
        Op::Binary { op, .. } if is_arith(*op) => Class::Int,
        Op::Binary { .. } => Class::Bool,
        Op::Unary { op: UnOp::Not, .. } => Class::Bool,
        Op::Unary { op: UnOp::Neg, .. } => Class::Int,
        Op::Move { src, .. } => class[*src as usize],
        _ => Class::Value,
    }
}

/// Per register: whether some run may read it before writing it (found
/// by forward passes over loop-free code: written-for-sure sets,
/// intersected where paths meet).
fn unsure_reads(code: &[Op], regs: usize, params: usize) -> Vec<bool> {
    let mut buf = Vec::new();
    let words = regs.div_ceil(64);
    let mut sure_in: Vec<Option<Vec<u64>>> = vec![None; code.len() + 1];
    let mut entry = vec![0u64; words];
    for r in 0..params.min(regs) {
        entry[r / 64] |= 1 << (r % 64);
    }
    sure_in[0] = Some(entry);
    let mut unsure = vec![false; regs];
    let meet = |slot: &mut Option<Vec<u64>>, set: &[u64]| match slot {
        Some(s) => s.iter_mut().zip(set).for_each(|(a, b)| *a &= b),
        None => *slot = Some(set.to_vec()),
    };
    for (pc, op) in code.iter().enumerate() {
        // Unreachable code reads nothing in any run.
        let Some(mut set) = sure_in[pc].take() else {
            continue;
        };
        reads(op, &mut buf);
        for r in &buf {
            let r = *r as usize;
            if r < regs && set[r / 64] & (1 << (r % 64)) == 0 {
                unsure[r] = true;
            }
        }
        if let Some(w) = surely_written(op) {
            let w = w as usize;
            if w < regs {
                set[w / 64] |= 1 << (w % 64);
            }
        }
        match op {
            Op::Jump { to } => meet(&mut sure_in[*to as usize], &set),
            Op::JumpIfFalse { to, .. } => {
                meet(&mut sure_in[*to as usize], &set);
                meet(&mut sure_in[pc + 1], &set);
            }
            Op::Return { .. } => {}
            _ => meet(&mut sure_in[pc + 1], &set),
        }
    }

    unsure
}

/// Copies coalesced: a `Move { dst: y, src: x }` where the move is `x`'s
/// only read and `y`'s only write, every write of `x` comes before it and
/// neither is read unwritten, has `x`'s writes write `y` instead and
/// becomes a jump to the next operation (which the typed form drops). So
/// a value made in an inlined callee lands in the caller's register, and
/// a `let` binding costs no copy.
pub(crate) fn coalesce(code: &mut [Op], regs: usize, params: usize) {
    let unsure = unsure_reads(code, regs, params);
    let mut buf = Vec::new();
    let mut reads_of = vec![0u32; regs];
    let mut writes_of = vec![0u32; regs];
    // The last operation writing each register.
    let mut last_write = vec![0usize; regs];
    for (pc, op) in code.iter().enumerate() {
        reads(op, &mut buf);
        for r in &buf {
            reads_of[*r as usize] += 1;
        }
        if let Some(w) = crate::compiled::written(op) {
            writes_of[w as usize] += 1;
            last_write[w as usize] = pc;
        }
    }
    let mut target = vec![false; code.len() + 1];
    for op in code.iter() {
        if let Op::Jump { to } | Op::JumpIfFalse { to, .. } = op {
            target[*to as usize] = true;
        }
    }
    for pc in 0..code.len() {
        let Op::Move { dst: y, src: x } = code[pc] else {
            continue;
        };
        let (xi, yi) = (x as usize, y as usize);
        // Made by the operation just before and read only here: that
        // operation writes `y` itself, whatever else writes `y`.
        if pc > 0
            && x != y
            && xi >= params
            && yi >= params
            && !target[pc]
            && reads_of[xi] == 1
            && writes_of[xi] == 1
            && last_write[xi] == pc - 1
        {
            if let Some(renamed) =
                crate::compiled::remap(&code[pc - 1], &|r| Some(if r == x { y } else { r }))
            {
                code[pc - 1] = renamed;
                code[pc] = Op::Jump { to: pc as u32 + 1 };
                last_write[yi] = pc - 1;
                writes_of[xi] = 0;
                reads_of[xi] = 0;
                continue;
            }
        }
        if x == y
            || xi < params
            || yi < params
            || unsure[xi]
            || unsure[yi]
            || reads_of[xi] != 1
            || writes_of[yi] != 1
            || writes_of[xi] == 0
            || last_write[xi] >= pc
        {
            continue;
        }
        for op in code[..pc].iter_mut() {
            if crate::compiled::written(op) == Some(x) {
                if let Some(renamed) =
                    crate::compiled::remap(op, &|r| Some(if r == x { y } else { r }))
                {
                    *op = renamed;
                }
            }
        }
        code[pc] = Op::Jump { to: pc as u32 + 1 };
        writes_of[yi] = writes_of[xi];
        last_write[yi] = last_write[xi];
        writes_of[xi] = 0;
        reads_of[xi] = 0;
    }
}

/// Per operation: whether it is a send that is the last use of the
/// record it sends ([`Fast::SendOwned`]). So it is where the sent
/// register only ever holds records received (a parameter, never written)
/// or built in this run, the send is its one use as a whole value, and
/// what else reads it reads a field (or `header`, `frame_len`) before the
/// send, into a register read only before the send and only by
/// operations whose results cannot hold the field's bytes (comparisons,
/// `hash`, `len`, `to_int`, ...). Then no register holds the record, nor
/// bytes of it, once the send has run: the body has no loops, so an
/// operation runs after the send only if it comes after it.
fn last_uses(code: &[Op], regs: usize, params: usize) -> Vec<bool> {
    use crate::code::Builtin;
    let mut buf = Vec::new();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); regs];
    let mut writes = vec![0u32; regs];
    let mut built = vec![true; regs];
    for (pc, op) in code.iter().enumerate() {
        reads(op, &mut buf);
        buf.sort_unstable();
        buf.dedup();
        for r in &buf {
            readers[*r as usize].push(pc);
        }
        if let Some(w) = crate::compiled::written(op) {
            writes[w as usize] += 1;
            built[w as usize] &= matches!(op, Op::Record { .. });
        }
    }
    // A reader of a field's value whose result holds none of its bytes.
    let consumes = |op: &Op| match op {
        Op::Binary { .. } | Op::Unary { .. } | Op::JumpIfFalse { .. } => true,
        Op::Builtin { f, .. } => matches!(
            f,
            Builtin::Hash
                | Builtin::Len
                | Builtin::StartsWith
                | Builtin::EndsWith
                | Builtin::Contains
                | Builtin::ToInt
                | Builtin::InPrefix
        ),
        _ => false,
    };
    let mut owned = vec![false; code.len()];
    for (pc, op) in code.iter().enumerate() {
        let Op::Send { src, chan } = op else {
            continue;
        };
        let r = *src as usize;
        if src == chan || r >= regs {
            continue;
        }
        let holds_own = match r < params {
            true => writes[r] == 0,
            false => writes[r] > 0 && built[r],
        };
        let others_read_fields = readers[r].iter().all(|&at| {
            if at == pc {
                return true;
            }
            if at > pc {
                return false;
            }
            let dst = match &code[at] {
                Op::Field { dst, src, .. } if src == &(r as Reg) => *dst,
                Op::Builtin {
                    f: Builtin::FrameLen,
                    ..
                } => return true,
                Op::Builtin {
                    f: Builtin::Header { .. },
                    dst,
                    args,
                } if args.first() == Some(&(r as Reg)) && !args[1..].contains(&(r as Reg)) => *dst,
                _ => return false,
            };
            let d = dst as usize;
            d != r
                && writes[d] == 1
                && readers[d]
                    .iter()
                    .all(|&u| u < pc && u != at && consumes(&code[u]))
        });
        owned[pc] = holds_own && others_read_fields;
    }
    owned
}

/// The typed form of flattened `code` over `regs` registers, of which the
/// first `params` are the arguments a run starts with.
pub(crate) fn compile(code: &[Op], regs: usize, params: usize) -> Typed {
    let mut buf = Vec::new();
    let unsure = unsure_reads(code, regs, params);

    // Classes: the join of what every write yields, moves followed until
    // nothing changes; parameters and registers read unwritten are values.
    let mut class = vec![Class::Unwritten; regs];
    for (r, c) in class.iter_mut().enumerate() {
        if r < params || unsure[r] {
            *c = Class::Value;
        }
    }
    loop {
        let mut changed = false;
        for op in code {
            if let Some(w) = crate::compiled::written(op) {
                let w = w as usize;
                let c = class[w].join(yields(op, &class));
                // A register some writes leave unknown stays a value.
                let c = if matches!(op, Op::StoreRef { .. } | Op::Push { .. }) {
                    Class::Value
                } else {
                    c
                };
                if c != class[w] {
                    class[w] = c;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    for c in class.iter_mut() {
        if *c == Class::Unwritten {
            *c = Class::Value;
        }
    }

    // How often each register is read and written, and which operations
    // jumps lead to: what fusing needs.
    let mut read_count = vec![0u32; regs];
    let mut write_count = vec![0u32; regs];
    let mut target = vec![false; code.len() + 1];
    for (pc, op) in code.iter().enumerate() {
        reads(op, &mut buf);
        for r in &buf {
            read_count[*r as usize] += 1;
        }
        if let Some(w) = crate::compiled::written(op) {
            write_count[w as usize] += 1;
        }
        match op {
            // A jump to the next operation vanishes: what follows it is
            // reached as if it were not there.
            Op::Jump { to } if *to as usize == pc + 1 => {}
            Op::Jump { to } | Op::JumpIfFalse { to, .. } => target[*to as usize] = true,
            _ => {}
        }
    }
    let single = |r: Reg| read_count[r as usize] == 1 && write_count[r as usize] == 1;
    let owned = last_uses(code, regs, params);

    let mut t = Typed {
        reset: (0..regs)
            .filter(|r| unsure[*r] && *r >= params)
            .map(|r| r as Reg)
            .collect(),
        ..Typed::default()
    };
    // Where each flattened operation starts in the typed code; jumps are
    // patched once all are known.
    let mut start = vec![0u32; code.len() + 1];
    let mut pc = 0;
    while pc < code.len() {
        start[pc] = t.code.len() as u32;
        let at = pc as u32;
        let push = |t: &mut Typed, f: Fast| {
            t.code.push(f);
            t.at.push(at);
        };
        let cls = |r: Reg| class[r as usize];
        // Boxes the typed registers `op` reads, before an operation that
        // reads them as values.
        let box_reads = |t: &mut Typed, buf: &mut Vec<Reg>, op: &Op| {
            reads(op, buf);
            buf.sort_unstable();
            buf.dedup();
            for r in buf.iter() {
                if cls(*r).typed() {
                    push(
                        t,
                        Fast::Box {
                            reg: *r,
                            bool: cls(*r) == Class::Bool,
                        },
                    );
                }
            }
        };
        // Fused: a field compared with an integer constant or `None`.
        if let (
            Some(Op::Field {
                dst: x,
                src,
                record,
                field,
            }),
            Some(Op::Const { dst: y, value }),
            Some(Op::Binary {
                op: op @ (BinOp::Eq | BinOp::Ne),
                dst,
                a,
                b,
            }),
        ) = (code.get(pc), code.get(pc + 1), code.get(pc + 2))
        {
            if a == x
                && b == y
                && x != y
                && single(*x)
                && single(*y)
                && !target[pc + 1]
                && !target[pc + 2]
                && cls(*dst) == Class::Bool
                && cls(*src) == Class::Value
            {
                let ne = *op == BinOp::Ne;
                let fused = match value {
                    Const::Int(k) => Some(Fast::FieldIsInt {
                        dst: *dst,
                        src: *src,
                        record: *record,
                        field: *field,
                        k: *k,
                        ne,
                    }),
                    Const::None => Some(Fast::FieldIsNone {
                        dst: *dst,
                        src: *src,
                        record: *record,
                        field: *field,
                        ne,
                    }),
                    _ => None,
                };
                if let Some(f) = fused {
                    push(&mut t, f);
                    start[pc + 1] = start[pc];
                    start[pc + 2] = start[pc];
                    pc += 3;
                    continue;
                }
            }
        }
        // Fused: fields read only to be packed.
        let fields = code[pc..]
            .iter()
            .take_while(|op| matches!(op, Op::Field { .. }))
            .count();
        if fields > 0 {
            if let Some(Op::Builtin {
                f: crate::code::Builtin::Pack,
                args,
                ..
            }) = code.get(pc + fields)
            {
                let reads_fields = args.len() == fields
                    && code[pc..pc + fields]
                        .iter()
                        .zip(args.iter())
                        .all(|(op, a)| {
                            matches!(op, Op::Field { dst, src, .. }
                            if dst == a && single(*dst) && cls(*src) == Class::Value)
                        })
                    && (pc + 1..=pc + fields).all(|p| !target[p]);
                if reads_fields {
                    push(
                        &mut t,
                        Fast::PackFields {
                            first: at,
                            n: fields as u32,
                        },
                    );
                    for p in pc + 1..=pc + fields {
                        start[p] = start[pc];
                    }
                    pc += fields + 1;
                    continue;
                }
            }
        }
        // Fused: `d[k] := d[k] + x`, the entry read, added to and stored
        // (a counter), with what computes `x` between the read and the
        // addition (a constant, or `frame_len` of the message, which reads
        // nothing else) run first.
        if let Some((konst, len, before)) = dict_add(code, pc, &single, &target, &cls) {
            if let Some((b, Op::Builtin { dst, args, .. })) = before.map(|b| (b, &code[b])) {
                t.code.push(Fast::FrameLen {
                    dst: *dst,
                    src: args[0],
                });
                t.at.push(b as u32);
            }
            push(
                &mut t,
                Fast::DictAdd {
                    at,
                    add: (pc + len - 3) as u32,
                    konst,
                },
            );
            for p in pc + 1..pc + len {
                start[p] = start[pc];
            }
            pc += len;
            continue;
        }
        // Fused: a `ref` dictionary dereferenced, then indexed or stored.
        if let (Some(Op::Deref { dst: x, src: r }), Some(next)) = (code.get(pc), code.get(pc + 1)) {
            let fused = match next {
                Op::Index { base, index, .. } if base == x && index != x => {
                    Some(Fast::DerefIndex { at })
                }
                Op::IndexSet { base, index, src }
                    if base == x && index != x && src != x && cls(*src) == Class::Int =>
                {
                    Some(Fast::DerefIndexSetInt { at })
                }
                Op::IndexSet { base, index, src } if base == x && index != x && src != x => {
                    Some(Fast::DerefIndexSet { at })
                }
                _ => None,
            };
            if let Some(f) = fused.filter(|_| single(*x) && !target[pc + 1] && !cls(*r).typed()) {
                match (f, next) {
                    // The stored integer goes to the host unboxed; the
                    // key, where typed too, is boxed as it is read.
                    (Fast::DerefIndexSetInt { .. }, Op::IndexSet { index, .. }) => {
                        if cls(*index).typed() {
                            push(
                                &mut t,
                                Fast::Box {
                                    reg: *index,
                                    bool: cls(*index) == Class::Bool,
                                },
                            );
                        }
                    }
                    _ => box_reads(&mut t, &mut buf, next),
                }
                push(&mut t, f);
                start[pc + 1] = start[pc];
                pc += 2;
                continue;
            }
        }
        // Fused: an operation with an integer constant as its second
        // operand, the constant made for it alone.
        if let (
            Some(Op::Const {
                dst: y,
                value: Const::Int(k),
            }),
            Some(Op::Binary { op, dst, a, b }),
        ) = (code.get(pc), code.get(pc + 1))
        {
            if b == y && a != y && single(*y) && !target[pc + 1] && cls(*dst).typed() {
                let (dst, k) = (*dst, *k);
                let fused = match (op, cls(*a)) {
                    (BinOp::Eq | BinOp::Ne, Class::Value) => Some(Fast::EqValueK {
                        dst,
                        v: *a,
                        k,
                        ne: *op == BinOp::Ne,
                    }),
                    (BinOp::Eq | BinOp::Ne, Class::Int) => Some(Fast::EqSlotK {
                        dst,
                        a: *a,
                        k,
                        ne: *op == BinOp::Ne,
                    }),
                    (BinOp::Eq | BinOp::Ne | BinOp::And | BinOp::Or, _) => None,
                    (op, _) => Some(Fast::IntK {
                        op: *op,
                        dst,
                        a: if cls(*a).typed() {
                            Operand::Slot(*a)
                        } else {
                            Operand::Value(*a)
                        },
                        k,
                    }),
                };
                if let Some(f) = fused {
                    // A fault is the operation's, not the constant's.
                    t.code.push(f);
                    t.at.push(at + 1);
                    start[pc + 1] = start[pc];
                    pc += 2;
                    continue;
                }
            }
        }
        // Fused: a value compared with `None`.
        if let (
            Some(Op::Const {
                dst: y,
                value: Const::None,
            }),
            Some(Op::Binary {
                op: op @ (BinOp::Eq | BinOp::Ne),
                dst,
                a,
                b,
            }),
        ) = (code.get(pc), code.get(pc + 1))
        {
            if b == y
                && a != y
                && single(*y)
                && !target[pc + 1]
                && cls(*dst) == Class::Bool
                && cls(*a) == Class::Value
            {
                push(
                    &mut t,
                    Fast::IsNone {
                        dst: *dst,
                        src: *a,
                        ne: *op == BinOp::Ne,
                    },
                );
                start[pc + 1] = start[pc];
                pc += 2;
                continue;
            }
        }
        let op = &code[pc];
        let operand = |r: Reg| {
            if cls(r).typed() {
                Operand::Slot(r)
            } else {
                Operand::Value(r)
            }
        };
        let typed_dst = surely_written(op).is_some_and(|w| cls(w).typed());
        let fast = match op {
            Op::Jump { to } if *to as usize == pc + 1 => None,
            Op::Jump { to } => Some(Fast::Jump { to: *to }),
            Op::JumpIfFalse { cond, to } if cls(*cond) == Class::Bool => Some(Fast::JumpIfNot {
                cond: *cond,
                to: *to,
            }),
            Op::JumpIfFalse { cond, to } if cls(*cond) == Class::Value => {
                Some(Fast::JumpIfNotValue {
                    cond: *cond,
                    to: *to,
                })
            }
            Op::Const { dst, value } if typed_dst => match value {
                Const::Int(i) => Some(Fast::Set {
                    dst: *dst,
                    value: *i,
                }),
                Const::Bool(b) => Some(Fast::Set {
                    dst: *dst,
                    value: *b as i64,
                }),
                _ => None,
            },
            Op::Move { dst, src } if typed_dst => Some(Fast::Move {
                dst: *dst,
                src: *src,
            }),
            Op::Move { dst, src } if cls(*src).typed() => Some(Fast::BoxTo {
                dst: *dst,
                src: *src,
                bool: cls(*src) == Class::Bool,
            }),
            Op::Move { dst, src } if !cls(*dst).typed() => Some(Fast::MoveValue {
                dst: *dst,
                src: *src,
            }),
            Op::Unary {
                op: UnOp::Not,
                dst,
                src,
            } if typed_dst && cls(*src) != Class::Int => Some(Fast::Not {
                dst: *dst,
                src: operand(*src),
            }),
            Op::Unary {
                op: UnOp::Neg,
                dst,
                src,
            } if typed_dst => Some(Fast::Neg {
                dst: *dst,
                src: operand(*src),
            }),
            Op::Binary { op, dst, a, b } if typed_dst => {
                let (ca, cb) = (cls(*a), cls(*b));
                match op {
                    BinOp::Eq | BinOp::Ne => {
                        let ne = *op == BinOp::Ne;
                        match (ca, cb) {
                            (x, y) if x.typed() && x == y => Some(Fast::EqSlots {
                                dst: *dst,
                                a: *a,
                                b: *b,
                                ne,
                            }),
                            (Class::Value, y) if y.typed() => Some(Fast::EqValue {
                                dst: *dst,
                                v: *a,
                                slot: *b,
                                bool: y == Class::Bool,
                                ne,
                            }),
                            (x, Class::Value) if x.typed() => Some(Fast::EqValue {
                                dst: *dst,
                                v: *b,
                                slot: *a,
                                bool: x == Class::Bool,
                                ne,
                            }),
                            (Class::Value, Class::Value) => Some(Fast::Binary {
                                op: *op,
                                dst: *dst,
                                a: *a,
                                b: *b,
                            }),
                            _ => None,
                        }
                    }
                    BinOp::And | BinOp::Or => match (ca, cb) {
                        (Class::Bool, Class::Bool) => Some(Fast::Logic {
                            dst: *dst,
                            a: *a,
                            b: *b,
                            or: *op == BinOp::Or,
                        }),
                        (Class::Value, Class::Value) => Some(Fast::Binary {
                            op: *op,
                            dst: *dst,
                            a: *a,
                            b: *b,
                        }),
                        _ => None,
                    },
                    _ if ca == Class::Value && cb == Class::Value => Some(Fast::Binary {
                        op: *op,
                        dst: *dst,
                        a: *a,
                        b: *b,
                    }),
                    _ => Some(Fast::Int {
                        op: *op,
                        dst: *dst,
                        a: operand(*a),
                        b: operand(*b),
                    }),
                }
            }
            Op::Return { src } if !cls(*src).typed() => Some(Fast::Return { src: *src }),
            Op::Builtin {
                f: crate::code::Builtin::FrameLen,
                dst,
                args,
            } if args.len() == 1 && !cls(args[0]).typed() && !cls(*dst).typed() => {
                Some(Fast::FrameLen {
                    dst: *dst,
                    src: args[0],
                })
            }
            Op::Send { src, chan } if owned[pc] && !cls(*chan).typed() => Some(Fast::SendOwned {
                src: *src,
                chan: *chan,
            }),
            Op::StateRef { dst, state } if !cls(*dst).typed() => Some(Fast::StateRef {
                dst: *dst,
                state: *state,
            }),
            Op::Const {
                dst,
                value: Const::Unit,
            } if !cls(*dst).typed() => Some(Fast::Unit { dst: *dst }),
            _ => None,
        };
        match fast {
            Some(Fast::JumpIfNot { cond, to }) if !target[pc] && read_count[cond as usize] == 1 => {
                // Superinstructions: the test that made `cond`, read
                // only here and run just before (nothing jumps here),
                // fused with the jump. A fault is the test's, whose
                // operation it keeps.
                let fused = match t.code.last() {
                    Some(Fast::Not {
                        dst,
                        src: Operand::Slot(c),
                    }) if *dst == cond => Some(Fast::JumpIf { cond: *c, to }),
                    Some(Fast::IsNone { dst, src, ne }) if *dst == cond => {
                        Some(Fast::JumpUnlessNone {
                            src: *src,
                            ne: *ne,
                            to,
                        })
                    }
                    Some(Fast::FieldIsInt {
                        dst,
                        src,
                        record,
                        field,
                        k,
                        ne,
                    }) if *dst == cond => Some(Fast::JumpUnlessField {
                        src: *src,
                        record: *record,
                        field: *field,
                        k: *k,
                        ne: *ne,
                        to,
                    }),
                    _ => None,
                };
                match fused {
                    Some(f) => {
                        if let Some(last) = t.code.last_mut() {
                            *last = f;
                        }
                        start[pc] = t.code.len() as u32 - 1;
                    }
                    None => push(&mut t, Fast::JumpIfNot { cond, to }),
                }
            }
            Some(f) => push(&mut t, f),
            None if matches!(op, Op::Jump { to } if *to as usize == pc + 1) => {}
            None => {
                // The interpreter's operation, its typed operands boxed.
                box_reads(&mut t, &mut buf, op);
                match op {
                    Op::Return { src } => push(&mut t, Fast::Return { src: *src }),
                    Op::JumpIfFalse { cond, to } => push(
                        &mut t,
                        Fast::JumpIfNotValue {
                            cond: *cond,
                            to: *to,
                        },
                    ),
                    _ => push(&mut t, Fast::Value { at }),
                }
                if let Some(w) = surely_written(op).filter(|w| cls(*w).typed()) {
                    push(&mut t, Fast::Unbox { reg: w });
                }
            }
        }
        pc += 1;
    }
    start[code.len()] = t.code.len() as u32;
    for f in t.code.iter_mut() {
        if let Fast::Jump { to }
        | Fast::JumpIfNot { to, .. }
        | Fast::JumpIfNotValue { to, .. }
        | Fast::JumpIf { to, .. }
        | Fast::JumpUnlessNone { to, .. }
        | Fast::JumpUnlessField { to, .. } = f
        {
            *to = start[*to as usize];
        }
    }
    t
}
