//! A machine's per-packet path as machine code, generated with Cranelift
//! when the engine first runs the program (and again for tables that
//! replace it): the flow key read from the packet's fields, the table's
//! hash and two-bucket probe, the port and each stage's state told by
//! compares, each plan's conditions as a tree of branches, and each
//! entry's updates, next state and actions as straight-line loads and
//! stores, every constant of the tables folded in.
//!
//! It covers machines whose stages all keep contexts in one table (one
//! stage, or stages on the same key and size, as the connection
//! tracker's two): a packet whose contexts are found and live, whose miss
//! is quiet and constant (a reply the key summary says has no context),
//! or that makes a context in a free slot or in a record another stage
//! holds. Anything else it hands back, with what it learnt (the slot
//! found, or that the key is absent) and the stage it got to, and the
//! table interpreter in [`crate::engine`] goes on from there; that
//! interpreter stays the reference, and `crates/machine/tests/native.rs`
//! runs every example both ways.
//!
//! It must not change what a packet does: every entry is the one the
//! plan's decision table names, every update runs in order on the same
//! words, and a context goes back to its start exactly where the
//! interpreter's would.

use crate::engine::Verdict;
use crate::flows::{summary_index, FlowTable, META_WORDS, SUMMARY, SUMMARY_MUL, TABLE_SEEDS};
use crate::model::{ArithOp, Expr, FieldId, Operand, Stage, Target, Value, MAX_KEY, MAX_WRITES};
use crate::tables::{Entry, StageTables, Test};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I16, I32, I64};
use cranelift_codegen::ir::{AbiParam, Block, InstBuilder, MemFlagsData, Value as Ir};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Switch};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};
use std::collections::HashMap;
use std::mem::offset_of;

/// What the generated code reads besides the packet, kept by the engine
/// and refreshed whenever its table changes shape (an insertion or a
/// removal moves the stash count and may move the summary's probe).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Env {
    pub tags: *mut u64,
    /// Each slot's other bucket.
    pub alts: *mut u32,
    /// The first record (the table's records start on a cache line).
    pub records: *mut Value,
    /// The summary's counters for the probed key word.
    pub summary: *const u32,
    /// The field holding the probed key word.
    pub probe_field: u64,
    pub in_stash: u64,
    pub globals: *mut Value,
    /// Written by the code for [`status::MAKE`]: the new context's state
    /// and registers.
    pub fresh_state: u64,
    pub fresh: [Value; MAX_FRESH],
    /// Written with [`status::MAKE_PLACED`]: the key's buckets and tag.
    pub place: [u64; 3],
    /// Each stage's count of contexts (in the order of the table's
    /// members, which is the stages' order).
    pub live: *mut usize,
    /// What an insertion counts its key into: the table's summary (every
    /// key word's counters), its words' counts of counters not zero, and
    /// its length.
    pub counters: *mut u32,
    pub nonzero: *mut u32,
    pub len: *mut usize,
}

/// Most flow registers a stage has for its code to make contexts.
const MAX_FRESH: usize = 16;

// The pointers are into the engine's own table and globals, which move
// between threads with it.
unsafe impl Send for Env {}

impl Env {
    pub(crate) fn empty() -> Env {
        Env {
            tags: std::ptr::null_mut(),
            alts: std::ptr::null_mut(),
            records: std::ptr::null_mut(),
            summary: std::ptr::null(),
            probe_field: 0,
            in_stash: 0,
            globals: std::ptr::null_mut(),
            fresh_state: 0,
            fresh: [0; MAX_FRESH],
            place: [0; 3],
            live: std::ptr::null_mut(),
            counters: std::ptr::null_mut(),
            nonzero: std::ptr::null_mut(),
            len: std::ptr::null_mut(),
        }
    }

    /// Points at `table` as it is now, for `stage`.
    pub(crate) fn refresh(
        &mut self,
        table: &mut FlowTable,
        live: &mut [usize],
        stage: &Stage,
        globals: &mut [Value],
    ) {
        self.live = live.as_mut_ptr();
        let raw = table.raw();
        self.tags = raw.tags;
        self.alts = raw.alts;
        self.records = raw.records;
        self.summary = raw.summary;
        self.probe_field = stage.key.get(raw.probe).map_or(0, |&f| f as u64);
        self.in_stash = raw.in_stash as u64;
        self.counters = raw.counters;
        self.nonzero = raw.nonzero;
        self.len = raw.len;
        self.globals = globals.as_mut_ptr();
    }

    /// Whether the key summary says that the key of a packet with these
    /// fields is absent from the table: the one test of the code's path
    /// for a port whose miss is quiet (`Gen::port_path`), which the
    /// engine makes itself where that path would then only set the
    /// ports (`Engine::absent_ports`), to spare the call.
    #[inline(always)]
    pub(crate) fn absent(&self, fields: &[Value]) -> bool {
        let Some(&w) = fields.get(self.probe_field as usize) else {
            return false;
        };
        // Safety: with code taken, `summary` points at the probed key
        // word's row of `SUMMARY` counters in the engine's table, kept so
        // by `refresh` and `follow` after every change (the code reads it
        // the same way), and `summary_index` is below `SUMMARY`.
        unsafe { *self.summary.add(summary_index(w)) == 0 }
    }

    /// Follows what an insertion or a removal in `table` may change (the
    /// rest stays where [`Env::refresh`] pointed).
    #[inline]
    pub(crate) fn follow(&mut self, table: &FlowTable, stage: &Stage) {
        let (row, probe, in_stash) = table.probe_state();
        self.summary = self.counters.wrapping_add(row);
        self.probe_field = stage.key.get(probe).map_or(0, |&f| f as u64);
        self.in_stash = in_stash as u64;
    }
}

/// What the generated code did with a packet: the low byte says what,
/// bits 8 to 39 hold a slot where there is one, bits 40 to 55 an entry
/// (`u16::MAX`: none) and bits 56 to 63 the stage it got to.
pub(crate) mod status {
    /// Done: the verdict is written and the context stored.
    pub const DONE: u64 = 0;
    /// Nothing learnt, nothing changed: interpret the packet.
    pub const INTERPRET: u64 = 1;
    /// The key's record is at the slot above, but its context needs the
    /// interpreter (expired, or absent from it); nothing changed.
    pub const FOUND: u64 = 2;
    /// The key is not in the table; nothing changed.
    pub const MISSING: u64 = 3;
    /// The verdict is written and the stage's context at the slot above
    /// is back at its start, and no other stage's context is left in the
    /// record: forget it (the record goes), then go on after the entry.
    pub const FORGET: u64 = 4;
    /// The key is not in the table and the packet makes a context: its
    /// globals are written, its entry (numbered above) taken into the
    /// verdict, and its state and registers are in the env's
    /// `fresh_state` and `fresh`. The context is left to make (or, where
    /// there is no room, the table-full transition to run instead of the
    /// entry).
    pub const MAKE: u64 = 5;
    /// [`MAKE`], with the key's place in the env's `place`.
    pub const MAKE_PLACED: u64 = 6;
    /// The key was not in the table and the packet made a context in a
    /// free slot of its buckets, the one above (the slot the table's own
    /// insertion takes): its entry is taken, its record, tag and
    /// alternate bucket written, and it is counted (the table's summary
    /// and length, the stage's contexts). The stages after the entry are
    /// left to run.
    pub const INSERTED: u64 = 7;
    /// Done, as [`DONE`], after an insertion that made a counter of the
    /// table's summary leave zero: its probed word is to choose again.
    pub const REPROBE: u64 = 8;

    /// The slot of a status.
    pub fn slot(got: u64) -> usize {
        (got >> 8) as u32 as usize
    }

    /// The entry of a status, if any.
    pub fn entry(got: u64) -> Option<usize> {
        match (got >> 40) as u16 {
            u16::MAX => None,
            e => Some(e as usize),
        }
    }

    /// The stage a status is of.
    pub fn stage(got: u64) -> usize {
        (got >> 56) as usize
    }
}

type StageFn = unsafe extern "C" fn(
    env: *mut Env,
    fields: *const Value,
    port: u64,
    len: u64,
    now: u64,
    verdict: *mut Verdict,
) -> u64;

/// A machine's generated per-packet path and the code memory it lives in.
pub struct StageCode {
    f: StageFn,
    /// The table shape its constants assume: (bucket mask, record words).
    pub(crate) shape: (usize, usize),
    /// Fields the code reads, at most: a packet with fewer is interpreted.
    pub(crate) fields: usize,
    /// The code's memory, freed with it (a module dropped keeps its
    /// memory, so that pointers into it stay valid: tables replaced again
    /// and again would leak).
    module: Option<JITModule>,
}

impl Drop for StageCode {
    fn drop(&mut self) {
        if let Some(module) = self.module.take() {
            // Safety: the one pointer into this memory is `f`, and every
            // copy of it (an engine's `NativeEntry`) is used only while
            // the program holding this code is alive.
            unsafe { module.free_memory() };
        }
    }
}

// The module is only kept alive: its code is immutable once finalised.
unsafe impl Send for StageCode {}
unsafe impl Sync for StageCode {}

impl std::fmt::Debug for StageCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageCode")
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

impl StageCode {
    /// The code's entry, for an engine to keep beside the program that
    /// keeps the code.
    pub(crate) fn entry(&self) -> NativeEntry {
        NativeEntry {
            f: self.f,
            fields: self.fields,
        }
    }
}

/// The entry of a [`StageCode`], valid while the program holding it is.
#[derive(Clone, Copy)]
pub(crate) struct NativeEntry {
    f: StageFn,
    /// Fields the code reads, at most: a packet with fewer is interpreted.
    pub fields: usize,
}

impl NativeEntry {
    /// Runs the generated path on one packet; see [`status`].
    ///
    /// # Safety
    /// The program whose code this is must be alive, `env` describe the
    /// table the code was made for as it is now, `fields` hold at least
    /// [`NativeEntry::fields`] values, and `verdict` be cleared.
    #[inline(always)]
    pub(crate) unsafe fn run(
        self,
        env: &mut Env,
        fields: &[Value],
        port: u64,
        len: u64,
        now: u64,
        verdict: &mut Verdict,
    ) -> u64 {
        unsafe { (self.f)(env, fields.as_ptr(), port, len, now, verdict) }
    }
}

/// Where a stage's context lies in its table's records (as
/// `Engine::new` lays them out): its state word and timestamps, its
/// registers, and its place among the table's members.
#[derive(Clone, Copy, Debug)]
struct Layout {
    meta_at: usize,
    regs_at: usize,
    member: usize,
}

/// The layouts of stages that share one table, in stage order, and the
/// words of a record after the key.
fn layouts(stages: &[Stage]) -> (Vec<Layout>, usize) {
    let key_len = stages[0].key.len();
    let mut at = META_WORDS + key_len;
    let mut out = Vec::new();
    for (i, st) in stages.iter().enumerate() {
        let meta_at = if i == 0 {
            0
        } else {
            at += META_WORDS;
            at - META_WORDS
        };
        out.push(Layout {
            meta_at,
            regs_at: at,
            member: i,
        });
        at += st.flow_regs.len();
    }
    (out, at - META_WORDS - key_len)
}

/// Whether the machine is of the shape covered: stages that all keep
/// contexts in one table (same key, direction and size), the same ports
/// with plans of their own, no metadata, registers and field writes of
/// later stages within what the code handles.
fn covered(stages: &[Stage], tables: &[StageTables], globals: usize, meta: usize) -> bool {
    let Some(first) = stages.first() else {
        return false;
    };
    if meta != 0
        || first.stateless()
        || (first.biflow && first.key.len() % 2 != 0)
        || first.key.len() > MAX_KEY
        || tables.len() != stages.len()
    {
        return false;
    }
    let alike = stages.iter().zip(tables).all(|(st, t)| {
        st.key == first.key
            && st.biflow == first.biflow
            && st.capacity == first.capacity
            && st.flow_regs.len() <= MAX_FRESH
            && t.port_plans() == tables[0].port_plans()
    });
    let ok = |s: usize, st: &Stage| {
        let regs = st.flow_regs.len();
        let operand_ok = |o: &Operand| match *o {
            Operand::FlowReg(r) => (r as usize) < regs,
            Operand::GlobalReg(r) => (r as usize) < globals,
            Operand::Meta(_) => false,
            _ => true,
        };
        st.transitions.iter().all(|t| {
            // Later stages add to a verdict: their writes are left to
            // the interpreter.
            (s == 0 || t.writes.is_empty())
                && t.when
                    .iter()
                    .all(|c| operand_ok(&c.lhs) && operand_ok(&c.rhs))
                && t.writes.iter().all(|(_, o)| operand_ok(o))
                && t.updates.iter().all(|u| {
                    let target = match u.target {
                        Target::FlowReg(r) => (r as usize) < regs,
                        Target::GlobalReg(r) => (r as usize) < globals,
                        Target::Meta(_) => false,
                    };
                    let expr = match &u.expr {
                        Expr::Operand(o) => operand_ok(o),
                        Expr::Binary(_, a, b) => operand_ok(a) && operand_ok(b),
                    };
                    target && expr
                })
        })
    };
    alike && stages.iter().enumerate().all(|(s, st)| ok(s, st))
}

/// Generates the per-packet path of a machine whose stages, tables,
/// globals and metadata are these; `None` where the machine is not of
/// the shape covered or the host has no code generator.
pub(crate) fn compile(
    stages: &[Stage],
    tables: &[StageTables],
    globals: usize,
    meta: usize,
) -> Option<StageCode> {
    if !covered(stages, tables, globals, meta) {
        return None;
    }
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").ok()?;
    let isa = cranelift_native::builder()
        .ok()?
        .finish(settings::Flags::new(flags))
        .ok()?;
    let mut module = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
    let mut ctx = module.make_context();
    let sig = &mut ctx.func.signature;
    sig.params.extend([AbiParam::new(I64); 6]);
    sig.returns.push(AbiParam::new(I64));
    let id = module
        .declare_function("stage", Linkage::Local, &ctx.func.signature)
        .ok()?;
    let (layouts, data) = layouts(stages);
    let first = &stages[0];
    let shape = FlowTable::shape_of(first.capacity, first.key.len(), data);
    let frontend = module.isa().frontend_config();
    let mut fbc = FunctionBuilderContext::new();
    let b = FunctionBuilder::new(&mut ctx.func, &mut fbc);
    Gen::new(b, stages, tables, layouts, shape, globals).emit(frontend);
    if let Err(e) = module.define_function(id, &mut ctx) {
        tracing::debug!("machine code not made: {e:?}");
        return None;
    }
    module.clear_context(&mut ctx);
    module.finalize_definitions().ok()?;
    let code = module.get_finalized_function(id);
    // The signature declared above is `StageFn`'s, in the host's C
    // calling convention (the ISA's default).
    let f = unsafe { std::mem::transmute::<*const u8, StageFn>(code) };
    let reads = stages
        .iter()
        .flat_map(|st| {
            st.key
                .iter()
                .copied()
                .chain(st.transitions.iter().flat_map(|t| {
                    let ops = t
                        .when
                        .iter()
                        .flat_map(|c| [c.lhs, c.rhs])
                        .chain(t.writes.iter().map(|w| w.1))
                        .chain(t.updates.iter().flat_map(|u| match u.expr {
                            Expr::Operand(o) => [o, o],
                            Expr::Binary(_, a, b) => [a, b],
                        }));
                    ops.filter_map(|o| match o {
                        Operand::Field(f) => Some(f),
                        _ => None,
                    })
                    .collect::<Vec<FieldId>>()
                }))
        })
        .map(|f| f as usize + 1)
        .max()
        .unwrap_or(0);
    Some(StageCode {
        f,
        shape,
        fields: reads,
        module: Some(module),
    })
}

/// A context's registers while generated code works on them.
#[derive(Clone)]
enum Regs {
    /// In its record, from this address: read and written there.
    At(Ir),
    /// A context not made yet: its registers as values (the initial
    /// ones, then what updates make), and the globals updates write,
    /// held back until it is known what the packet does (where it needs
    /// the engine, nothing of this stage has been written).
    Fresh {
        flow: Vec<Ir>,
        globals: Vec<Option<Ir>>,
    },
}

/// A key's record: its slot and address.
#[derive(Clone, Copy)]
struct Found {
    slot: Ir,
    rec: Ir,
}

/// A key's buckets and tag, as values of the function.
type Place = (Ir, Ir, Ir);

/// How a packet reaches a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Arrival {
    /// Its key's record exists (two block parameters: slot, address).
    Record,
    /// Its key is not in the table, and its place is known.
    Placed,
    /// Its key is not in the table (told by the key summary).
    Unplaced,
}

/// What a plan works on: a context found live, or a fresh one (in the
/// record another stage's context holds, or in none).
#[derive(Clone, Copy)]
enum Mode {
    Live(Found),
    Fresh(Option<Found>),
}

/// One function being generated.
struct Gen<'a> {
    b: FunctionBuilder<'a>,
    stages: &'a [Stage],
    all: &'a [StageTables],
    layouts: Vec<Layout>,
    /// The stage being generated, its tables and its layout.
    s: usize,
    stage: &'a Stage,
    tables: &'a StageTables,
    layout: Layout,
    /// Global registers in all.
    globals: usize,
    /// Whether the fresh context being generated has its key's place
    /// (see [`Gen::missing`]).
    placed: bool,
    /// (bucket mask, words per record).
    shape: (usize, usize),
    /// Per port path, the key's words and its place, once its lookup
    /// made them (for stages reached with [`Arrival::Placed`]).
    keys: HashMap<usize, (Vec<Ir>, Place)>,
    /// Each stage's blocks, by port path and arrival, and those still to
    /// generate.
    blocks: HashMap<(usize, usize, Arrival), Block>,
    todo: Vec<(usize, usize, Arrival, Block)>,
    env: Ir,
    fields: Ir,
    port: Ir,
    len: Ir,
    now: Ir,
    verdict: Ir,
}

fn flags() -> MemFlagsData {
    MemFlagsData::trusted()
}

const PRESENT: i64 = 1 << 32;

impl<'a> Gen<'a> {
    fn new(
        mut b: FunctionBuilder<'a>,
        stages: &'a [Stage],
        all: &'a [StageTables],
        layouts: Vec<Layout>,
        shape: (usize, usize),
        globals: usize,
    ) -> Gen<'a> {
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let p = b.block_params(entry).to_vec();
        let layout = layouts[0];
        Gen {
            b,
            stages,
            all,
            layouts,
            s: 0,
            stage: &stages[0],
            tables: &all[0],
            layout,
            globals,
            placed: false,
            shape,
            keys: HashMap::new(),
            blocks: HashMap::new(),
            todo: Vec::new(),
            env: p[0],
            fields: p[1],
            port: p[2],
            len: p[3],
            now: p[4],
            verdict: p[5],
        }
    }

    /// Makes stage `s` the one being generated.
    fn enter(&mut self, s: usize) {
        self.s = s;
        self.stage = &self.stages[s];
        self.tables = &self.all[s];
        self.layout = self.layouts[s];
    }

    /// The block where stage `s` starts for a packet of port path `p`
    /// arriving so (made, and queued to generate, the first time).
    fn stage_block(&mut self, p: usize, s: usize, arrival: Arrival) -> Block {
        if let Some(&b) = self.blocks.get(&(p, s, arrival)) {
            return b;
        }
        let b = self.b.create_block();
        if arrival == Arrival::Record {
            self.b.append_block_param(b, I64);
            self.b.append_block_param(b, I64);
        }
        self.blocks.insert((p, s, arrival), b);
        self.todo.push((p, s, arrival, b));
        b
    }

    fn konst(&mut self, v: u64) -> Ir {
        self.b.ins().iconst(I64, v as i64)
    }

    fn env_word(&mut self, offset: usize) -> Ir {
        self.b.ins().load(I64, flags(), self.env, offset as i32)
    }

    fn field(&mut self, f: FieldId) -> Ir {
        self.b.ins().load(I64, flags(), self.fields, 8 * f as i32)
    }

    /// Jumps to the block of `value`'s case, or to `default`: compares
    /// and conditional branches for a few cases, which the processor
    /// predicts from their history (an indirect jump through a table was
    /// mispredicted on most packets that alternate between cases), a jump
    /// table for many.
    fn dispatch(&mut self, value: Ir, cases: &[(u64, Block)], default: Block) {
        if cases.len() > 8 {
            let mut sw = Switch::new();
            for &(v, blk) in cases {
                sw.set_entry(v as u128, blk);
            }
            sw.emit(&mut self.b, value, default);
            return;
        }
        for &(v, blk) in cases {
            let hit = self.b.ins().icmp_imm_s(IntCC::Equal, value, v as i64);
            let next = self.b.create_block();
            self.b.ins().brif(hit, blk, &[], next, &[]);
            self.b.switch_to_block(next);
        }
        self.b.ins().jump(default, &[]);
    }

    /// Returns status `kind` of the current stage, with `slot` and entry
    /// `entry` (a number in the stage's entries) where there are some.
    fn ret_status(&mut self, kind: u64, slot: Option<Ir>, entry: Option<usize>) {
        if kind == status::DONE {
            // Done is 0, whole: the one status the engine's call tests.
            let done = self.konst(status::DONE);
            self.b.ins().return_(&[done]);
            return;
        }
        let fixed =
            kind | (entry.map_or(u16::MAX as u64, |e| e as u64) << 40) | ((self.s as u64) << 56);
        let v = match slot {
            Some(s) => {
                let shifted = self.b.ins().ishl_imm_s(s, 8);
                self.b.ins().bor_imm_s(shifted, fixed as i64)
            }
            None => self.konst(fixed),
        };
        self.b.ins().return_(&[v]);
    }

    /// An operand's value, the registers where `regs` holds them.
    fn operand(&mut self, o: Operand, regs: &Regs) -> Ir {
        match (o, regs) {
            (Operand::Field(f), _) => self.field(f),
            (Operand::FlowReg(r), Regs::At(at)) => {
                self.b.ins().load(I64, flags(), *at, 8 * r as i32)
            }
            (Operand::FlowReg(r), Regs::Fresh { flow, .. }) => flow[r as usize],
            (Operand::GlobalReg(r), _) => {
                if let Regs::Fresh { globals, .. } = regs {
                    if let Some(v) = globals[r as usize] {
                        return v;
                    }
                }
                let g = self.env_word(offset_of!(Env, globals));
                self.b.ins().load(I64, flags(), g, 8 * r as i32)
            }
            (Operand::Const(c), _) => self.konst(c),
            (Operand::Now, _) => self.now,
            (Operand::InPort, _) => self.port,
            (Operand::Len, _) => self.len,
            (Operand::Meta(_), _) => unreachable!("machines with metadata are interpreted"),
        }
    }

    /// A fresh context's registers: the initial values, no global held.
    fn fresh_regs(&mut self) -> Regs {
        let stage = self.stage;
        let flow = stage.flow_regs.iter().map(|r| self.konst(r.init)).collect();
        Regs::Fresh {
            flow,
            globals: vec![None; self.globals],
        }
    }

    /// `ArithOp::apply` on two values.
    fn arith(&mut self, op: ArithOp, a: Ir, b: Ir) -> Ir {
        let ins = &mut self.b;
        match op {
            ArithOp::Add => ins.ins().iadd(a, b),
            ArithOp::Sub => {
                let more = ins.ins().icmp(IntCC::UnsignedGreaterThan, a, b);
                let d = ins.ins().isub(a, b);
                let zero = ins.ins().iconst(I64, 0);
                ins.ins().select(more, d, zero)
            }
            ArithOp::Mul => ins.ins().imul(a, b),
            ArithOp::Div | ArithOp::Mod => {
                let zero = ins.ins().iconst(I64, 0);
                let one = ins.ins().iconst(I64, 1);
                let none = ins.ins().icmp_imm_s(IntCC::Equal, b, 0);
                let by = ins.ins().select(none, one, b);
                let q = if op == ArithOp::Div {
                    ins.ins().udiv(a, by)
                } else {
                    ins.ins().urem(a, by)
                };
                ins.ins().select(none, zero, q)
            }
            ArithOp::Max => ins.ins().umax(a, b),
            ArithOp::Min => ins.ins().umin(a, b),
        }
    }

    /// `fold_mul` of the table's hash.
    fn fold_mul(&mut self, a: Ir, b: Ir) -> Ir {
        let lo = self.b.ins().imul(a, b);
        let hi = self.b.ins().umulhi(a, b);
        self.b.ins().bxor(lo, hi)
    }

    /// The table's hash of the key words (`table_hash`).
    fn hash(&mut self, key: &[Ir]) -> Ir {
        let mut h = self.konst(key.len() as u64);
        let pairs = key.len() / 2;
        for i in 0..pairs {
            let a = self
                .b
                .ins()
                .bxor_imm_s(key[2 * i], TABLE_SEEDS[2 * i] as i64);
            let c = self
                .b
                .ins()
                .bxor_imm_s(key[2 * i + 1], TABLE_SEEDS[2 * i + 1] as i64);
            let m = self.fold_mul(a, c);
            h = self.b.ins().bxor(h, m);
        }
        if key.len() % 2 == 1 {
            let i = key.len() - 1;
            let a = self.b.ins().bxor_imm_s(key[i], TABLE_SEEDS[i] as i64);
            let c = self.konst(TABLE_SEEDS[i + 1]);
            let m = self.fold_mul(a, c);
            h = self.b.ins().bxor(h, m);
        }
        let a = self.b.ins().bxor_imm_s(h, TABLE_SEEDS[MAX_KEY] as i64);
        let c = self.konst(TABLE_SEEDS[0]);
        self.fold_mul(a, c)
    }

    fn emit(mut self, frontend: cranelift_codegen::isa::TargetFrontendConfig) {
        // The plan index: the port, capped at the ports with plans of
        // their own (the same for every stage covered). Ports whose plans
        // and misses are alike in every stage share one path, so that a
        // packet's port is told by as few branches as the program needs
        // (the balancer's two servers are one case, the other ports one).
        let ports = self.all[0].port_plans();
        let (stages, all) = (self.stages, self.all);
        let sign = |p: usize| {
            stages
                .iter()
                .zip(all)
                .map(|(st, t)| {
                    let plans: Vec<_> = (0..st.states.len() as u16)
                        .map(|s| t.packet_plan(s, p))
                        .collect();
                    (t.misses_at(p), plans)
                })
                .collect::<Vec<_>>()
        };
        let mut paths: Vec<(usize, Block)> = Vec::new();
        let mut cases: Vec<(u64, Block)> = Vec::new();
        for p in (0..=ports).rev() {
            let shared = paths
                .iter()
                .find(|&&(q, _)| sign(q) == sign(p))
                .map(|x| x.1);
            let blk = shared.unwrap_or_else(|| {
                let blk = self.b.create_block();
                paths.push((p, blk));
                blk
            });
            if p < ports {
                cases.push((p as u64, blk));
            }
        }
        // Plan index `ports` (every other port) is the default.
        let default = paths[0].1;
        cases.retain(|&(_, blk)| blk != default);
        self.dispatch(self.port, &cases, default);
        for (p, blk) in paths {
            self.b.switch_to_block(blk);
            self.enter(0);
            self.port_path(p);
        }
        while let Some((p, s, arrival, blk)) = self.todo.pop() {
            self.b.switch_to_block(blk);
            self.enter(s);
            match arrival {
                Arrival::Record => {
                    let params = self.b.block_params(blk);
                    let found = Found {
                        slot: params[0],
                        rec: params[1],
                    };
                    self.context(p, found);
                }
                Arrival::Placed => self.missing(p, None, true),
                Arrival::Unplaced => self.missing(p, None, false),
            }
        }
        self.b.seal_all_blocks();
        self.b.finalize(frontend);
    }

    /// Everything for a packet from plan index `p`: the first stage's
    /// lookup, and on to its block.
    fn port_path(&mut self, p: usize) {
        let (quiet, _) = self.tables.misses_at(p);
        // A biflow key's summary is of its ordered words: the lookup's
        // miss tells the same, only later.
        if quiet && !self.stage.biflow {
            // The key summary's probed word: absent there, absent.
            let f = self.env_word(offset_of!(Env, probe_field));
            let at = self.b.ins().ishl_imm_s(f, 3);
            let addr = self.b.ins().iadd(self.fields, at);
            let w = self.b.ins().load(I64, flags(), addr, 0);
            let off = self.summary_offset(w);
            let s = self.env_word(offset_of!(Env, summary));
            let addr = self.b.ins().iadd(s, off);
            let c = self.b.ins().load(I32, flags(), addr, 0);
            let absent = self.stage_block(p, 0, Arrival::Unplaced);
            let look = self.b.create_block();
            self.b.ins().brif(c, look, &[], absent, &[]);
            self.b.switch_to_block(look);
        }
        self.lookup(p);
    }

    /// Makes the key, probes its two buckets and goes on to the first
    /// stage with the record found or the key's place.
    fn lookup(&mut self, p: usize) {
        let (mask, stride) = self.shape;
        let stage = self.stage;
        let mut key: Vec<Ir> = stage.key.iter().map(|&f| self.field(f)).collect();
        if stage.biflow {
            self.order_endpoints(&mut key);
        }
        let h = self.hash(&key);
        let b1 = self.b.ins().band_imm_s(h, mask as i64);
        let hi = self.b.ins().ushr_imm_s(h, 32);
        let b2 = self.b.ins().band_imm_s(hi, mask as i64);
        let same = self.b.ins().icmp(IntCC::Equal, b1, b2);
        let other = self.b.ins().bxor_imm_s(b1, 1);
        let b2 = self.b.ins().select(same, other, b2);
        let t = self.b.ins().ushr_imm_s(h, 48);
        let tag = self.b.ins().bor_imm_s(t, 1);
        let tags = self.env_word(offset_of!(Env, tags));
        let lanes_of = |g: &mut Gen, bucket: Ir| {
            let at = g.b.ins().ishl_imm_s(bucket, 3);
            let addr = g.b.ins().iadd(tags, at);
            let word = g.b.ins().load(I64, flags(), addr, 0);
            let spread = g.b.ins().imul_imm_s(tag, 0x0001_0001_0001_0001);
            let x = g.b.ins().bxor(word, spread);
            let low = g.b.ins().band_imm_s(x, 0x7fff_7fff_7fff_7fff);
            let sum = g.b.ins().iadd_imm_s(low, 0x7fff_7fff_7fff_7fff);
            let any = g.b.ins().bor(sum, x);
            let none = g.b.ins().bnot(any);
            g.b.ins().band_imm_s(none, 0x8000_8000_8000_8000u64 as i64)
        };
        let l1 = lanes_of(self, b1);
        let l2 = lanes_of(self, b2);
        let records = self.env_word(offset_of!(Env, records));
        let found = self.stage_block(p, 0, Arrival::Record);

        // Each bucket's matching lanes in turn, lowest first; a bucket
        // with none costs one test. Both tag words are read before either
        // is looked at (reading the second only after the first failed
        // measured no faster).
        for (bucket, lanes) in [(b1, l1), (b2, l2)] {
            let head = self.b.create_block();
            self.b.append_block_param(head, I64);
            let check = self.b.create_block();
            let next = self.b.create_block();
            self.b.ins().jump(head, &[lanes.into()]);
            self.b.switch_to_block(head);
            let rest = self.b.block_params(head)[0];
            self.b.ins().brif(rest, check, &[], next, &[]);
            self.b.switch_to_block(check);
            let zeros = self.b.ins().ctz(rest);
            let lane = self.b.ins().ushr_imm_s(zeros, 4);
            let base = self.b.ins().ishl_imm_s(bucket, 2);
            let slot = self.b.ins().iadd(base, lane);
            let words = self.b.ins().imul_imm_s(slot, (8 * stride) as i64);
            let rec = self.b.ins().iadd(records, words);
            let mut diff = self.konst(0);
            for (i, &k) in key.iter().enumerate() {
                let stored = self
                    .b
                    .ins()
                    .load(I64, flags(), rec, (8 * (META_WORDS + i)) as i32);
                let d = self.b.ins().bxor(stored, k);
                diff = self.b.ins().bor(diff, d);
            }
            let less = self.b.ins().iadd_imm_s(rest, -1);
            let others = self.b.ins().band(rest, less);
            self.b.ins().brif(
                diff,
                head,
                &[others.into()],
                found,
                &[slot.into(), rec.into()],
            );
            self.b.switch_to_block(next);
        }
        // Not in its buckets: in the stash, or not in the table.
        let in_stash = self.env_word(offset_of!(Env, in_stash));
        let stash = self.b.create_block();
        self.keys.insert(p, (key, (b1, b2, tag)));
        let missing = self.stage_block(p, 0, Arrival::Placed);
        self.b.ins().brif(in_stash, stash, &[], missing, &[]);
        self.b.switch_to_block(stash);
        self.ret_status(status::INTERPRET, None, None);
    }

    /// Where the packet goes after entry `e` (a number in the current
    /// stage's entries) on arriving so: the stage it names, if later, or
    /// done.
    fn after(&mut self, p: usize, e: Option<usize>, arrival: Arrival, found: Option<Found>) {
        let next = e
            .and_then(|e| self.tables.entries[e].next_stage)
            .map(|n| n as usize)
            .filter(|&n| n > self.s && n < self.stages.len());
        let Some(n) = next else {
            self.ret_status(status::DONE, None, None);
            return;
        };
        let blk = self.stage_block(p, n, arrival);
        match found {
            Some(Found { slot, rec }) => {
                self.b.ins().jump(blk, &[slot.into(), rec.into()]);
            }
            None => {
                self.b.ins().jump(blk, &[]);
            }
        }
    }

    /// The current stage on a key's record: its context live, expired
    /// (handed back), or absent (a fresh one, which may join the record).
    fn context(&mut self, p: usize, found: Found) {
        let Found { slot, rec } = found;
        let at = 8 * self.layout.meta_at as i32;
        let word = self.b.ins().load(I64, flags(), rec, at);
        let present = self.b.ins().band_imm_s(word, PRESENT);
        let live = self.b.create_block();
        let absent = self.b.create_block();
        let interpret = self.b.create_block();
        self.b.ins().brif(present, live, &[], absent, &[]);
        self.b.switch_to_block(interpret);
        self.ret_status(status::FOUND, Some(slot), None);
        self.b.switch_to_block(absent);
        self.missing(p, Some(found), false);
        self.b.switch_to_block(live);
        for (timeout, off) in [
            (self.stage.hard_timeout_us, 1),
            (self.stage.idle_timeout_us, 2),
        ] {
            let Some(t) = timeout else { continue };
            let since = self.b.ins().load(I64, flags(), rec, at + 8 * off);
            let age = self.arith(ArithOp::Sub, self.now, since);
            let expired = self
                .b
                .ins()
                .icmp_imm_s(IntCC::UnsignedGreaterThan, age, t as i64);
            let fresh = self.b.create_block();
            self.b.ins().brif(expired, interpret, &[], fresh, &[]);
            self.b.switch_to_block(fresh);
        }
        let regs = self
            .b
            .ins()
            .iadd_imm_s(rec, (8 * self.layout.regs_at) as i64);
        let state = self.b.ins().band_imm_s(word, 0xffff);
        let states = self.stage.states.len();
        let blocks: Vec<Block> = (0..states).map(|_| self.b.create_block()).collect();
        let cases: Vec<(u64, Block)> = blocks
            .iter()
            .enumerate()
            .map(|(s, &b)| (s as u64, b))
            .collect();
        self.dispatch(state, &cases, interpret);
        for (s, &blk) in blocks.iter().enumerate() {
            self.b.switch_to_block(blk);
            self.plan(p, s as u16, Regs::At(regs), Mode::Live(found), interpret);
        }
    }

    /// The current stage for a packet with no context in it: the initial
    /// state's plan on the initial registers, in the record another
    /// stage's context holds (`record`) or in none (the key's place known
    /// or not). Where that leaves no context it goes on; where it makes
    /// one, the code makes it in the record or in a free slot, or hands
    /// it to the engine.
    fn missing(&mut self, p: usize, record: Option<Found>, placed: bool) {
        let (_, constant) = self.tables.misses_at(p);
        let arrival = match (record, placed) {
            (Some(_), _) => Arrival::Record,
            (None, true) => Arrival::Placed,
            (None, false) => Arrival::Unplaced,
        };
        let regs = self.fresh_regs();
        let tables = self.tables;
        self.placed = placed;
        match constant {
            u32::MAX => {
                let bail = self.b.create_block();
                self.plan(p, self.stage.initial, regs, Mode::Fresh(record), bail);
                self.b.switch_to_block(bail);
                match record {
                    Some(f) => self.ret_status(status::FOUND, Some(f.slot), None),
                    None => self.ret_status(status::MISSING, None, None),
                }
            }
            0 => self.ret_status(status::DONE, None, None),
            d => {
                let e = d as usize - 1;
                self.take(&tables.entries[e], &regs);
                self.after(p, Some(e), arrival, record);
            }
        }
    }

    /// The plan of (`state`, packet) for plan index `p`, in `mode`;
    /// `interpret`: where to go, having changed nothing of this stage,
    /// for a plan it does not cover.
    fn plan(&mut self, p: usize, state: u16, regs: Regs, mode: Mode, interpret: Block) {
        let tables = self.tables;
        let Some((tests, decisions)) = tables.packet_plan(state, p) else {
            // No plan: no entry.
            self.finish(p, state, None, regs, mode);
            return;
        };
        let Some(decisions) = decisions else {
            self.b.ins().jump(interpret, &[]);
            return;
        };
        let tests: Vec<(Operand, IntCC, Operand)> = tests
            .iter()
            .map(|t| {
                let (lhs, truth, rhs) = match *t {
                    Test::FieldConst {
                        field,
                        truth,
                        value,
                    } => (Operand::Field(field), truth, Operand::Const(value)),
                    Test::FieldFlow { field, truth, reg } => {
                        (Operand::Field(field), truth, Operand::FlowReg(reg))
                    }
                    Test::Operands { lhs, rhs, truth } => (lhs, truth, rhs),
                };
                let cc = match truth {
                    0b001 => IntCC::UnsignedLessThan,
                    0b010 => IntCC::Equal,
                    0b011 => IntCC::UnsignedLessThanOrEqual,
                    0b100 => IntCC::UnsignedGreaterThan,
                    0b101 => IntCC::NotEqual,
                    _ => IntCC::UnsignedGreaterThanOrEqual,
                };
                (lhs, cc, rhs)
            })
            .collect();
        // One block per distinct outcome (entry plus one; 0: none).
        let mut outcomes: Vec<u32> = decisions.to_vec();
        outcomes.sort_unstable();
        outcomes.dedup();
        let blocks: Vec<Block> = outcomes.iter().map(|_| self.b.create_block()).collect();
        let block_of = |d: u32| blocks[outcomes.binary_search(&d).unwrap()];
        self.decide(&tests, decisions, &regs, &block_of);
        for (&d, &blk) in outcomes.iter().zip(&blocks) {
            self.b.switch_to_block(blk);
            let mut regs = regs.clone();
            if d == 0 {
                self.finish(p, state, None, regs, mode);
                continue;
            }
            let e = d as usize - 1;
            let entry = &tables.entries[e];
            self.updates(entry, &mut regs);
            let next = entry.next_state.unwrap_or(state);
            match mode {
                Mode::Live(_) => {
                    self.take(entry, &regs);
                    self.finish(p, next, Some(e), regs, mode);
                }
                Mode::Fresh(record) => self.finish_fresh(p, next, e, regs, record),
            }
        }
    }

    /// The decision table `table` (indexed by the bits of `tests`, test
    /// `i` bit `i`) as a tree of conditional branches to the outcomes'
    /// blocks: the last test splits the table in halves, and a test whose
    /// halves agree is not evaluated, so a packet evaluates only the
    /// conditions its outcome depends on.
    fn decide(
        &mut self,
        tests: &[(Operand, IntCC, Operand)],
        table: &[u32],
        regs: &Regs,
        block_of: &dyn Fn(u32) -> Block,
    ) {
        if table.iter().all(|&d| d == table[0]) {
            self.b.ins().jump(block_of(table[0]), &[]);
            return;
        }
        let (&(lhs, cc, rhs), rest) = tests.split_last().expect("a table of one entry agrees");
        let half = table.len() / 2;
        let (unset, set) = table.split_at(half);
        if unset == set {
            return self.decide(rest, unset, regs, block_of);
        }
        let a = self.operand(lhs, regs);
        let c = self.operand(rhs, regs);
        let holds = self.b.ins().icmp(cc, a, c);
        let (yes, no) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(holds, yes, &[], no, &[]);
        self.b.switch_to_block(yes);
        self.decide(rest, set, regs, block_of);
        self.b.switch_to_block(no);
        self.decide(rest, unset, regs, block_of);
    }

    /// An entry's updates, in order, on the registers and the globals.
    fn updates(&mut self, e: &Entry, regs: &mut Regs) {
        for u in &e.updates {
            let v = match u.expr {
                Expr::Operand(o) => self.operand(o, regs),
                Expr::Binary(op, a, c) => {
                    let a = self.operand(a, regs);
                    let c = self.operand(c, regs);
                    self.arith(op, a, c)
                }
            };
            match (u.target, &mut *regs) {
                (Target::FlowReg(r), Regs::At(at)) => {
                    self.b.ins().store(flags(), v, *at, 8 * r as i32);
                }
                (Target::FlowReg(r), Regs::Fresh { flow, .. }) => flow[r as usize] = v,
                (Target::GlobalReg(r), Regs::Fresh { globals, .. }) => {
                    globals[r as usize] = Some(v)
                }
                (Target::GlobalReg(r), Regs::At(_)) => {
                    let g = self.env_word(offset_of!(Env, globals));
                    self.b.ins().store(flags(), v, g, 8 * r as i32);
                }
                (Target::Meta(_), _) => unreachable!("machines with metadata are interpreted"),
            }
        }
    }

    /// An entry's ports and writes into the verdict: the first stage's
    /// into a cleared verdict, a later one's (with no writes, see
    /// `covered`) added to what the stages before chose, or, for a drop,
    /// in place of it.
    fn take(&mut self, e: &Entry, regs: &Regs) {
        let ports_at = offset_of!(Verdict, ports) as i32;
        if self.s > 0 && !e.drop {
            if e.ports != 0 {
                let had = self.b.ins().load(I64, flags(), self.verdict, ports_at);
                let ports = self.b.ins().bor_imm_s(had, e.ports as i64);
                self.b.ins().store(flags(), ports, self.verdict, ports_at);
            }
        } else if e.ports != 0 || self.s > 0 {
            let ports = self.konst(e.ports);
            self.b.ins().store(flags(), ports, self.verdict, ports_at);
        }
        let size = std::mem::size_of::<(FieldId, Value)>();
        let (field_at, value_at) = (
            offset_of!((FieldId, Value), 0),
            offset_of!((FieldId, Value), 1),
        );
        let writes = e.writes.len().min(MAX_WRITES);
        for (i, &(f, o)) in e.writes.iter().take(MAX_WRITES).enumerate() {
            let v = self.operand(o, regs);
            let at = (offset_of!(Verdict, writes) + i * size) as i32;
            let field = self.b.ins().iconst(I16, f as i64);
            self.b
                .ins()
                .store(flags(), field, self.verdict, at + field_at as i32);
            self.b
                .ins()
                .store(flags(), v, self.verdict, at + value_at as i32);
        }
        if writes > 0 {
            let n = self.konst(writes as u64);
            self.b.ins().store(
                flags(),
                n,
                self.verdict,
                offset_of!(Verdict, nwrites) as i32,
            );
        }
    }

    /// Whether the registers differ from their initial values, as a
    /// value (non-zero: they do).
    fn changed(&mut self, regs: &Regs) -> Ir {
        let stage = self.stage;
        let mut diff = self.konst(0);
        for (i, r) in stage.flow_regs.iter().enumerate() {
            let v = self.operand(Operand::FlowReg(i as u16), regs);
            let d = self.b.ins().bxor_imm_s(v, r.init as i64);
            diff = self.b.ins().bor(diff, d);
        }
        diff
    }

    /// Adds `by` to the current stage's count of contexts.
    fn count_context(&mut self, by: i64) {
        let live = self.env_word(offset_of!(Env, live));
        let at = 8 * self.layout.member as i32;
        let n = self.b.ins().load(I64, flags(), live, at);
        let n = self.b.ins().iadd_imm_s(n, by);
        self.b.ins().store(flags(), n, live, at);
    }

    /// After entry `e` (or none), the context in state `next`: a live one
    /// forgotten where it is back at its start (its record with it where
    /// no other stage's context is left, by the engine), else stored with
    /// the packet's time; then on to the stage the entry names. A fresh
    /// context with no entry stays at its start: done.
    fn finish(&mut self, p: usize, next: u16, e: Option<usize>, regs: Regs, mode: Mode) {
        let found = match mode {
            Mode::Live(found) => found,
            Mode::Fresh(_) => {
                self.ret_status(status::DONE, None, None);
                return;
            }
        };
        let Found { slot, rec } = found;
        let at = 8 * self.layout.meta_at as i32;
        if next == self.stage.initial {
            let diff = self.changed(&regs);
            let keep = self.b.create_block();
            let forget = self.b.create_block();
            self.b.ins().brif(diff, keep, &[], forget, &[]);
            self.b.switch_to_block(forget);
            // The record stays where another stage's context is in it.
            let mut others = self.konst(0);
            for l in self.layouts.clone() {
                if l.member != self.layout.member {
                    let w = self.b.ins().load(I64, flags(), rec, 8 * l.meta_at as i32);
                    others = self.b.ins().bor(others, w);
                }
            }
            let others = self.b.ins().band_imm_s(others, PRESENT);
            let stays = self.b.create_block();
            let goes = self.b.create_block();
            self.b.ins().brif(others, stays, &[], goes, &[]);
            self.b.switch_to_block(goes);
            self.ret_status(status::FORGET, Some(slot), e);
            self.b.switch_to_block(stays);
            let zero = self.konst(0);
            self.b.ins().store(flags(), zero, rec, at);
            self.count_context(-1);
            self.after(p, e, Arrival::Record, Some(found));
            self.b.switch_to_block(keep);
        }
        let word = self.konst(next as u64 | PRESENT as u64);
        self.b.ins().store(flags(), word, rec, at);
        self.b.ins().store(flags(), self.now, rec, at + 16);
        self.after(p, e, Arrival::Record, Some(found));
    }

    /// A fresh context after entry `e`, its globals held back stored:
    /// where it is back at its start, the entry taken and on; otherwise
    /// made, in `record` (another stage's), in a free slot of the key's
    /// buckets, or by the engine ([`status::MAKE`]).
    fn finish_fresh(&mut self, p: usize, next: u16, e: usize, regs: Regs, record: Option<Found>) {
        let Regs::Fresh { flow, globals } = &regs else {
            unreachable!("a fresh context's registers are values")
        };
        for (r, v) in globals.iter().enumerate() {
            if let Some(v) = *v {
                let g = self.env_word(offset_of!(Env, globals));
                self.b.ins().store(flags(), v, g, 8 * r as i32);
            }
        }
        let tables = self.tables;
        let entry = &tables.entries[e];
        let placed = self.placed;
        let arrival = match record {
            Some(_) => Arrival::Record,
            None if placed => Arrival::Placed,
            None => Arrival::Unplaced,
        };
        let make = self.b.create_block();
        if next == self.stage.initial {
            let diff = self.changed(&regs);
            let done = self.b.create_block();
            self.b.ins().brif(diff, make, &[], done, &[]);
            self.b.switch_to_block(done);
            self.take(entry, &regs);
            self.after(p, Some(e), arrival, record);
        } else {
            self.b.ins().jump(make, &[]);
        }
        self.b.switch_to_block(make);
        self.take(entry, &regs);
        if let Some(found) = record {
            // Joins the record another stage's context holds.
            let Found { rec, .. } = found;
            let at = 8 * self.layout.meta_at as i32;
            let word = self.konst(next as u64 | PRESENT as u64);
            self.b.ins().store(flags(), word, rec, at);
            self.b.ins().store(flags(), self.now, rec, at + 8);
            self.b.ins().store(flags(), self.now, rec, at + 16);
            for (i, &v) in flow.iter().enumerate() {
                let at = 8 * (self.layout.regs_at + i) as i32;
                self.b.ins().store(flags(), v, rec, at);
            }
            self.count_context(1);
            self.after(p, Some(e), Arrival::Record, record);
            return;
        }
        let state = self.konst(next as u64);
        self.b.ins().store(
            flags(),
            state,
            self.env,
            offset_of!(Env, fresh_state) as i32,
        );
        for (i, &v) in flow.iter().enumerate() {
            let at = offset_of!(Env, fresh) + 8 * i;
            self.b.ins().store(flags(), v, self.env, at as i32);
        }
        let made = if placed {
            let (key, place) = self.keys[&p].clone();
            self.insert_free(&key, place, next, flow, e);
            for (i, v) in <[Ir; 3]>::from(place).into_iter().enumerate() {
                let at = offset_of!(Env, place) + 8 * i;
                self.b.ins().store(flags(), v, self.env, at as i32);
            }
            status::MAKE_PLACED
        } else {
            status::MAKE
        };
        self.ret_status(made, None, Some(e));
    }
}

impl Gen<'_> {
    /// A biflow key's two endpoints in order (`flow_key`): the second
    /// half first where it is less, word by word, than the first.
    fn order_endpoints(&mut self, key: &mut [Ir]) {
        let h = key.len() / 2;
        let mut less = self.b.ins().iconst(cranelift_codegen::ir::types::I8, 0);
        let mut equal = self.b.ins().iconst(cranelift_codegen::ir::types::I8, 1);
        for i in 0..h {
            let (a, b) = (key[h + i], key[i]);
            let lt = self.b.ins().icmp(IntCC::UnsignedLessThan, a, b);
            let eq = self.b.ins().icmp(IntCC::Equal, a, b);
            let now_less = self.b.ins().band(equal, lt);
            less = self.b.ins().bor(less, now_less);
            equal = self.b.ins().band(equal, eq);
        }
        for i in 0..h {
            let (a, b) = (key[i], key[h + i]);
            key[i] = self.b.ins().select(less, b, a);
            key[h + i] = self.b.ins().select(less, a, b);
        }
    }

    /// A new context in the first free slot of the key's first bucket,
    /// else of its second, as the table's insertion chooses it: its key,
    /// the current stage's state, timestamps and registers written (the
    /// other stages' state words cleared), its tag set and its alternate
    /// bucket noted, then [`status::INSERTED`] with entry `e`. Where both
    /// buckets are full, it goes on (to hand the context to the engine,
    /// whose insertion moves others or evicts).
    fn insert_free(&mut self, key: &[Ir], (b1, b2, tag): Place, next: u16, flow: &[Ir], e: usize) {
        let (_, stride) = self.shape;
        let tags = self.env_word(offset_of!(Env, tags));
        let full = self.b.create_block();
        for (bucket, other) in [(b1, b2), (b2, b1)] {
            let at = self.b.ins().ishl_imm_s(bucket, 3);
            let addr = self.b.ins().iadd(tags, at);
            let word = self.b.ins().load(I64, flags(), addr, 0);
            // Lanes whose tag is 0 (free), as `matching_lanes(word, 0)`.
            let low = self.b.ins().band_imm_s(word, 0x7fff_7fff_7fff_7fff);
            let sum = self.b.ins().iadd_imm_s(low, 0x7fff_7fff_7fff_7fff);
            let any = self.b.ins().bor(sum, word);
            let none = self.b.ins().bnot(any);
            let free = self
                .b
                .ins()
                .band_imm_s(none, 0x8000_8000_8000_8000u64 as i64);
            let here = self.b.create_block();
            let next_bucket = self.b.create_block();
            self.b.ins().brif(free, here, &[], next_bucket, &[]);
            self.b.switch_to_block(here);
            let zeros = self.b.ins().ctz(free);
            let shift = self.b.ins().band_imm_s(zeros, !15);
            let lane = self.b.ins().ushr_imm_s(zeros, 4);
            let base = self.b.ins().ishl_imm_s(bucket, 2);
            let slot = self.b.ins().iadd(base, lane);
            let words = self.b.ins().imul_imm_s(slot, (8 * stride) as i64);
            let records = self.env_word(offset_of!(Env, records));
            let rec = self.b.ins().iadd(records, words);
            let zero = self.konst(0);
            for l in self.layouts.clone() {
                if l.member != self.layout.member {
                    self.b.ins().store(flags(), zero, rec, 8 * l.meta_at as i32);
                }
            }
            let at = 8 * self.layout.meta_at as i32;
            let state = self.konst(next as u64 | PRESENT as u64);
            self.b.ins().store(flags(), state, rec, at);
            self.b.ins().store(flags(), self.now, rec, at + 8);
            self.b.ins().store(flags(), self.now, rec, at + 16);
            for (i, &k) in key.iter().enumerate() {
                let at = 8 * (META_WORDS + i) as i32;
                self.b.ins().store(flags(), k, rec, at);
            }
            for (i, &v) in flow.iter().enumerate() {
                let at = 8 * (self.layout.regs_at + i) as i32;
                self.b.ins().store(flags(), v, rec, at);
            }
            let placed = self.b.ins().ishl(tag, shift);
            let word = self.b.ins().bor(word, placed);
            self.b.ins().store(flags(), word, addr, 0);
            let alts = self.env_word(offset_of!(Env, alts));
            let at = self.b.ins().ishl_imm_s(slot, 2);
            let addr = self.b.ins().iadd(alts, at);
            let other = self.b.ins().ireduce(I32, other);
            self.b.ins().store(flags(), other, addr, 0);
            let woke = self.count_key_in(key);
            self.count_context(1);
            let later = self.tables.entries[e]
                .next_stage
                .is_some_and(|n| n as usize > self.s);
            if later {
                self.ret_status(status::INSERTED, Some(slot), Some(e));
            } else {
                // As `FlowTable::insert_by` counts: the engine needs to
                // hear only of a counter that left zero.
                let reprobe = self.b.create_block();
                let done = self.b.create_block();
                self.b.ins().brif(woke, reprobe, &[], done, &[]);
                self.b.switch_to_block(done);
                self.ret_status(status::DONE, None, None);
                self.b.switch_to_block(reprobe);
                self.ret_status(status::REPROBE, None, None);
            }
            self.b.switch_to_block(next_bucket);
        }
        self.b.ins().jump(full, &[]);
        self.b.switch_to_block(full);
    }
}

impl Gen<'_> {
    /// The byte offset of key word `w`'s counter in its summary row:
    /// `flows::summary_index` (which it must equal) times the counter's
    /// four bytes.
    fn summary_offset(&mut self, w: Ir) -> Ir {
        let golden = self.konst(SUMMARY_MUL);
        let m = self.b.ins().imul(w, golden);
        let idx = self
            .b
            .ins()
            .ushr_imm_s(m, (64 - SUMMARY.trailing_zeros()) as i64);
        self.b.ins().ishl_imm_s(idx, 2)
    }

    /// Counts an inserted `key` into its table, as `FlowTable::insert_by`
    /// does: each word's summary counter up by one, the word's count of
    /// counters not zero up where its counter was zero, the length up.
    /// Returns whether some counter was zero (not zero: none was).
    fn count_key_in(&mut self, key: &[Ir]) -> Ir {
        let counters = self.env_word(offset_of!(Env, counters));
        let nonzero = self.env_word(offset_of!(Env, nonzero));
        let mut woke = self.b.ins().iconst(I32, 0);
        for (i, &w) in key.iter().enumerate() {
            let off = self.summary_offset(w);
            let addr = self.b.ins().iadd(counters, off);
            let row = (4 * i * SUMMARY) as i32;
            let c = self.b.ins().load(I32, flags(), addr, row);
            let up = self.b.ins().iadd_imm_s(c, 1);
            self.b.ins().store(flags(), up, addr, row);
            let was_zero = self.b.ins().icmp_imm_s(IntCC::Equal, c, 0);
            let was_zero = self.b.ins().uextend(I32, was_zero);
            let n = self.b.ins().load(I32, flags(), nonzero, 4 * i as i32);
            let n = self.b.ins().iadd(n, was_zero);
            self.b.ins().store(flags(), n, nonzero, 4 * i as i32);
            woke = self.b.ins().bor(woke, was_zero);
        }
        let len = self.env_word(offset_of!(Env, len));
        let n = self.b.ins().load(I64, flags(), len, 0);
        let n = self.b.ins().iadd_imm_s(n, 1);
        self.b.ins().store(flags(), n, len, 0);
        woke
    }
}

/// Whether `FLICK_INTERPRET=1` asks for the table interpreter only (read
/// once), as it does for rules.
pub(crate) fn interpret_only() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| std::env::var_os("FLICK_INTERPRET").is_some_and(|v| v == "1"))
}
