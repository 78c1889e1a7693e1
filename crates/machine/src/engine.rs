//! One worker's executor: its flow tables, its global registers, and the
//! per-packet walk through the stages' tables. Stateful stages on the
//! same key and table size share one table, a key's record holding each
//! such stage's context, so a packet looks the key up once for them all.
//!
//! Per packet and stage: build the flow key (ordered endpoints for a
//! biflow key), look the context up (unless the table's key summary says
//! the key is absent and the stage's rows say a packet from this port
//! that finds no context leaves none: then the lookup would miss and
//! change nothing); if it has expired, run its timeout
//! transition (or reset it when there is none); evaluate the condition
//! vector, take the first matching row, run its updates in order, move to
//! its next state, and collect its sends and writes. A context back in its
//! initial state with its registers at their initial values is not kept,
//! so traffic that moves no machine fills no table. A new context that
//! finds no room runs the `tableFull` transition of the initial state
//! instead, which decides where the packet goes (nowhere if there is none).

use crate::flows::{Expiry, FlowTable, Meta, Place, Placed, Timeouts, META_WORDS};
use crate::model::{Event, FieldId, Machine, Stage, StateId, Value, MAX_KEY, MAX_META, MAX_WRITES};
use crate::native::{self, status, Env, NativeEntry, StageCode};
use crate::tables::{apply_updates, CompileError, Entry, Inputs, StageTables, Writable};
use std::sync::{Arc, OnceLock};

/// Decides `event` for a packet whose stage is in `state` and runs the
/// entry's updates: what every transition of every stage does. The
/// entry taken, if any.
#[inline(always)]
fn transition<'t>(
    tables: &'t StageTables,
    state: StateId,
    event: Event,
    fields: &[Value],
    out: Writable,
    regs: &mut [Value],
    (now, port, len): (u64, Value, Value),
) -> Option<&'t Entry> {
    let inputs = Inputs {
        fields,
        globals: out.globals,
        now_us: now,
        port,
        len,
        meta: out.meta,
    };
    let entry = tables.decide(state, event, &inputs, regs);
    if let Some(e) = entry {
        apply_updates(&e.updates, fields, regs, out, now, port, len);
    }
    entry
}

/// Adds what entry `e` does to a packet to its verdict: clears the ports
/// earlier stages chose where it drops the packet, adds its ports, and
/// the values of its field writes, read with `regs` as the flow
/// registers (after the entry's updates).
#[inline(always)]
fn take(
    e: &Entry,
    verdict: &mut Verdict,
    (fields, globals, meta): (&[Value], &[Value], &[Value]),
    regs: &[Value],
    (now, port, len): (u64, Value, Value),
) {
    if e.drop {
        verdict.ports = 0;
    }
    verdict.ports |= e.ports;
    if e.writes.is_empty() {
        return;
    }
    let inputs = Inputs {
        fields,
        globals,
        now_us: now,
        port,
        len,
        meta,
    };
    for &(f, v) in &e.writes {
        if verdict.nwrites < MAX_WRITES {
            verdict.writes[verdict.nwrites] = (f, inputs.operand(regs, v));
            verdict.nwrites += 1;
        }
    }
}

/// Whether two register lists are equal: a loop the compiler keeps
/// inline, where slice equality calls `memcmp` (lists are a few words).
#[inline]
fn same(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |d, (x, y)| d | (x ^ y)) == 0
}

/// Copies registers word by word, for the same reason.
#[inline]
fn copy(to: &mut [Value], from: &[Value]) {
    for (t, f) in to.iter_mut().zip(from) {
        *t = *f;
    }
}

/// A stage's flow key for a packet into `key` (on the caller's stack):
/// its fields' values, the two endpoints in order for a biflow key; the
/// number of words. Written in place rather than returned: a returned
/// array is copied with wide loads over the narrow stores just made,
/// which the processor cannot forward (a stall per packet and stage).
#[inline(always)]
fn flow_key(stage: &Stage, fields: &[Value], key: &mut [Value; MAX_KEY]) -> usize {
    let n = stage.key.len();
    for (k, &f) in key.iter_mut().zip(&stage.key) {
        *k = fields[f as usize];
    }
    if stage.biflow {
        let h = n / 2;
        if key[h..n] < key[..h] {
            for i in 0..h {
                key.swap(i, h + i);
            }
        }
    }
    n
}

/// A machine and its compiled tables.
#[derive(Debug)]
pub struct Program {
    pub machine: Machine,
    pub tables: Vec<StageTables>,
    /// Its per-packet path as machine code, made when first asked for.
    code: OnceLock<Option<StageCode>>,
}

impl Program {
    pub fn new(machine: Machine) -> Result<Program, CompileError> {
        let tables = machine
            .stages
            .iter()
            .map(StageTables::compile)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Program {
            machine,
            tables,
            code: OnceLock::new(),
        })
    }

    /// The per-packet path generated for this program ([`crate::native`]),
    /// made the first time it is asked for; none where the machine is not
    /// of the shape it covers, the host has no code generator, or
    /// `FLICK_INTERPRET=1`.
    pub fn code(&self) -> Option<&StageCode> {
        self.code
            .get_or_init(|| {
                if native::interpret_only() {
                    return None;
                }
                native::compile(
                    &self.machine.stages,
                    &self.tables,
                    self.machine.globals.len(),
                    self.machine.meta.len(),
                )
            })
            .as_ref()
    }

    /// The stages keeping flow contexts, grouped by the table they share:
    /// stages on the same key, direction and capacity share one table
    /// whose record holds each one's context. In stage order, each group
    /// in the order its first stage comes.
    pub fn table_groups(&self) -> Vec<Vec<usize>> {
        let all = &self.machine.stages;
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (s, stage) in all.iter().enumerate().filter(|(_, st)| !st.stateless()) {
            let shared = groups.iter_mut().find(|g| {
                let first = &all[g[0]];
                first.key == stage.key
                    && first.biflow == stage.biflow
                    && first.capacity == stage.capacity
            });
            match shared {
                Some(group) => group.push(s),
                None => groups.push(vec![s]),
            }
        }
        groups
    }

    /// Words after the key in a record of the table `group` shares: the
    /// first stage's registers, then each other's meta words and registers.
    fn record_data_words(&self, group: &[usize]) -> usize {
        let stages = &self.machine.stages;
        group
            .iter()
            .map(|&s| stages[s].flow_regs.len())
            .sum::<usize>()
            + META_WORDS * (group.len() - 1)
    }

    /// Bytes the flow tables of one engine (a worker) take, padding and
    /// indexes included: what [`Engine::new`] allocates and touches.
    pub fn table_bytes(&self) -> usize {
        self.table_groups()
            .iter()
            .map(|group| {
                let first = &self.machine.stages[group[0]];
                FlowTable::bytes_for(
                    first.capacity,
                    first.key.len(),
                    self.record_data_words(group),
                )
            })
            .sum()
    }

    /// Bytes one flow context of stage `s` takes in its table: key words,
    /// registers, and the state and timestamps.
    pub fn context_bytes(&self, s: usize) -> usize {
        let st = &self.machine.stages[s];
        if st.stateless() {
            return 0;
        }
        8 * st.key.len() + 8 * st.flow_regs.len() + std::mem::size_of::<crate::flows::Meta>()
    }
}

/// Where a packet goes. Only the first `nwrites` of `writes` are its: a
/// verdict reused from packet to packet ([`Engine::process_into`]) is
/// cleared by its two counts, not its 128 bytes of writes, and two
/// verdicts are equal when their ports and writes are.
#[derive(Clone, Copy, Debug, Default)]
pub struct Verdict {
    /// Port numbers as a bit set; none: dropped.
    pub ports: u64,
    pub writes: [(FieldId, Value); MAX_WRITES],
    pub nwrites: usize,
}

impl Verdict {
    pub fn writes(&self) -> &[(FieldId, Value)] {
        &self.writes[..self.nwrites]
    }
}

impl PartialEq for Verdict {
    fn eq(&self, other: &Verdict) -> bool {
        self.ports == other.ports && self.writes() == other.writes()
    }
}

impl Eq for Verdict {}

/// What the executor counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub packets: u64,
    /// New contexts that found no room.
    pub table_full: u64,
    /// Contexts evicted for new ones.
    pub evicted: u64,
    /// Contexts found expired (idle or hard timeout).
    pub expired: u64,
}

/// A flow context, as a dump shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    pub stage: usize,
    pub key: Vec<Value>,
    pub state: u16,
    pub regs: Vec<Value>,
    pub created_us: u64,
    pub last_us: u64,
}

struct StageState {
    regs: Vec<Value>,
    init: Vec<Value>,
    /// The table keeping this stage's contexts, in `Engine::tables`.
    table: usize,
    /// Where this stage's context lies in its table's records: its
    /// state word (with [`PRESENT`]), created and last, at `meta_at`; its
    /// registers at `regs_at`.
    meta_at: usize,
    regs_at: usize,
    /// Its place in its table's `members`.
    member: usize,
}

/// Set in a stage's state word in a record where the stage has a
/// context: a record shared by several stages holds contexts of some.
const PRESENT: Value = 1 << 32;

/// One flow table and the stages keeping their contexts in it: a stateful
/// stage alone, or the stages sharing its key (fields and direction) and
/// table size, whose contexts for one key then lie in one record, so a
/// packet looks the key up once for all of them (the tracker's two).
struct TableState {
    flows: FlowTable,
    /// Per stage kept here: its state word's place in a record and its
    /// timeouts (a record may be evicted early when every context in it
    /// has expired).
    members: Vec<(usize, Timeouts)>,
    /// Contexts each of those stages holds.
    live: Vec<usize>,
    /// The packet (its number in the counters) whose lookup `slot` and
    /// `place` are, so that the next stage on this table reuses them:
    /// the slot of the key's record after the stages before, if any.
    looked_up: u64,
    slot: Option<usize>,
    place: Place,
    /// Whether `place` is this packet's: a lookup skipped (the key known
    /// absent) leaves it to the insertion, if any, to compute.
    placed: bool,
}

impl TableState {
    /// The slot of the record under `key` holding a context of the stage
    /// whose state word is at `meta_at`.
    fn context(&self, meta_at: usize, key: &[Value]) -> Option<usize> {
        let slot = self.flows.find(key)?;
        (self.flows.words(slot)[meta_at] & PRESENT != 0).then_some(slot)
    }

    /// Forgets the context at `meta_at` in the record at `slot`, and the
    /// record when no stage has one left in it.
    fn forget(&mut self, meta_at: usize, slot: usize) {
        self.flows.words_mut(slot)[meta_at] = 0;
        if !self.any_present(slot) {
            self.flows.remove(slot);
        }
    }

    /// Whether any stage has a context in the record at `slot`.
    fn any_present(&self, slot: usize) -> bool {
        let w = self.flows.words(slot);
        self.members.iter().any(|&(at, _)| w[at] & PRESENT != 0)
    }
}

/// A stateful stage's timeouts.
fn timeouts(stage: &Stage) -> Timeouts {
    Timeouts {
        idle: stage.idle_timeout_us,
        hard: stage.hard_timeout_us,
    }
}

/// The meta words at `at` of a record.
#[inline]
fn meta_at(w: &[Value], at: usize) -> Meta {
    Meta {
        used: w[at] & PRESENT != 0,
        state: w[at] as u16,
        created: w[at + 1],
        last: w[at + 2],
    }
}

/// Why a program cannot replace another under live contexts.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReplaceError {
    #[error("the new program has {new} stages, the running one {old}")]
    Stages { old: usize, new: usize },
    #[error("stage `{0}`: the flow key differs, so its contexts would not be found")]
    Key(String),
    #[error("stage `{0}`: the flow registers differ; contexts keep theirs, so the new tables must name the same ones in the same order")]
    Registers(String),
    #[error("stage `{0}`: the states differ; the new tables must keep the running states in their order (new ones may follow)")]
    States(String),
    #[error("the global registers differ")]
    Globals,
}

/// Frames a worker hands [`Engine::process_batch`] at a time, at most.
pub const BATCH: usize = 64;

/// One frame of a batch, as [`Engine::process_batch`] reads it.
pub trait BatchFrame {
    /// The program's field values (see [`crate::FieldReader`]).
    fn fields(&self) -> &[Value];
    /// The number of the port it came in on.
    fn port(&self) -> u8;
    /// Its length in bytes.
    fn bytes(&self) -> usize;
    /// Its timestamp, nanoseconds.
    fn ts_ns(&self) -> u64;
}

/// A [`BatchFrame`] made of borrowed parts.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    pub fields: &'a [Value],
    pub port: u8,
    pub len: usize,
    pub ts_ns: u64,
}

impl BatchFrame for Frame<'_> {
    fn fields(&self) -> &[Value] {
        self.fields
    }
    fn port(&self) -> u8 {
        self.port
    }
    fn bytes(&self) -> usize {
        self.len
    }
    fn ts_ns(&self) -> u64 {
        self.ts_ns
    }
}

pub struct Engine {
    program: Arc<Program>,
    stages: Vec<StageState>,
    tables: Vec<TableState>,
    globals: Vec<Value>,
    counters: Counters,
    /// The packet's metadata words (see [`Engine::process_into`]).
    meta: [Value; MAX_META],
    /// The latest packet time seen, microseconds.
    pub now_us: u64,
    /// The program's generated path, where it runs packets first (it was
    /// made, for a table of this engine's shape), and what it reads.
    native: Option<NativeEntry>,
    env: Env,
    /// Per plan port, where the code is taken: the ports a packet from
    /// there is sent to when the key summary says its key is absent, if
    /// that is all the code would do then ([`Engine::absent_ports_of`]);
    /// [`NOT_CONSTANT`] where the code is to run.
    absent_ports: Box<[u64]>,
}

/// [`Engine::absent_ports`] of a port whose packets the code decides.
const NOT_CONSTANT: u64 = u64::MAX;

impl Engine {
    pub fn new(program: Arc<Program>) -> Engine {
        let all = &program.machine.stages;
        let mut stages: Vec<StageState> = Vec::with_capacity(all.len());
        // Per table, the stages keeping contexts there; a record holds the
        // first one's state, created and last in the table's own meta
        // words and registers after the key, then the others' meta words
        // and registers in turn. Stateless stages share table 0, empty:
        // they look nothing up.
        let groups = program.table_groups();
        let mut tables: Vec<TableState> = (0..=groups.len())
            .map(|_| TableState {
                flows: FlowTable::new(0, 0, 0),
                members: Vec::new(),
                live: Vec::new(),
                looked_up: u64::MAX,
                slot: None,
                place: Place::default(),
                placed: false,
            })
            .collect();
        let layouts: Vec<Vec<usize>> = std::iter::once(Vec::new()).chain(groups).collect();
        for (s, stage) in all.iter().enumerate() {
            let init: Vec<Value> = stage.flow_regs.iter().map(|r| r.init).collect();
            let table = layouts
                .iter()
                .position(|members| members.contains(&s))
                .unwrap_or(0);
            stages.push(StageState {
                regs: init.clone(),
                init,
                table,
                meta_at: 0,
                regs_at: 0,
                member: 0,
            });
        }
        for (t, members) in layouts.iter().enumerate().skip(1) {
            let key_len = all[members[0]].key.len();
            let mut at = META_WORDS + key_len;
            for (i, &s) in members.iter().enumerate() {
                let st = &mut stages[s];
                if i == 0 {
                    st.meta_at = 0;
                } else {
                    st.meta_at = at;
                    at += META_WORDS;
                }
                st.regs_at = at;
                st.member = i;
                at += st.init.len();
                tables[t].members.push((st.meta_at, timeouts(&all[s])));
                tables[t].live.push(0);
            }
            let data = at - META_WORDS - key_len;
            debug_assert_eq!(data, program.record_data_words(members));
            tables[t].flows = FlowTable::new(all[members[0]].capacity, key_len, data);
            tables[t].flows.take_pages();
        }
        let globals = program.machine.globals.iter().map(|g| g.init).collect();
        let mut engine = Engine {
            program,
            stages,
            tables,
            globals,
            counters: Counters::default(),
            meta: [0; MAX_META],
            now_us: 0,
            native: None,
            env: Env::empty(),
            absent_ports: Box::default(),
        };
        engine.take_code();
        engine
    }

    /// An engine that runs every packet through the tables' interpreter,
    /// whatever code the program has: the reference the generated path
    /// is tested against, and the other side of its benchmark.
    pub fn interpreted(program: Arc<Program>) -> Engine {
        let mut e = Engine::new(program);
        e.native = None;
        e
    }

    /// Whether this engine runs packets through generated code first.
    pub fn native(&self) -> bool {
        self.native.is_some()
    }

    /// Takes the program's generated path where it was made for a table
    /// of this engine's shape.
    fn take_code(&mut self) {
        let shape = |e: &Engine| {
            let t = e.stages.first()?.table;
            Some(e.tables.get(t)?.flows.shape())
        };
        self.native = match (self.program.code(), shape(self)) {
            (Some(code), Some(shape)) if code.shape == shape && self.stages[0].table != 0 => {
                Some(code.entry())
            }
            _ => None,
        };
        self.absent_ports = match self.native {
            Some(_) => self.absent_ports_of(),
            None => Box::default(),
        };
        self.refresh_env();
    }

    /// [`Engine::absent_ports`] for the first stage's table: per plan
    /// port whose miss is quiet and constant ([`StageTables::constant_miss`]),
    /// in a stage that is not biflow (whose summary is of ordered words)
    /// and has a key, with an entry that writes no field and goes on to
    /// no later stage (or none), the ports that entry sends to: what the
    /// code's quiet path (`native::Gen::missing`) comes to, the verdict
    /// cleared before.
    fn absent_ports_of(&self) -> Box<[u64]> {
        let machine = &self.program.machine;
        let (stage, tables) = (&machine.stages[0], &self.program.tables[0]);
        (0..=tables.port_plans())
            .map(|p| match tables.misses_at(p) {
                (true, d) if d != u32::MAX && !stage.biflow && !stage.key.is_empty() => {
                    let Some(e) = d.checked_sub(1).map(|e| &tables.entries[e as usize]) else {
                        return 0;
                    };
                    let later = e
                        .next_stage
                        .is_some_and(|n| n > 0 && (n as usize) < machine.stages.len());
                    if later || !e.writes.is_empty() {
                        NOT_CONSTANT
                    } else {
                        e.ports
                    }
                }
                _ => NOT_CONSTANT,
            })
            .collect()
    }

    /// Points the generated code's [`Env`] at the table's summary and
    /// stash as they are after a change.
    #[inline]
    fn follow_table(&mut self) {
        if self.native.is_some() {
            let t = self.stages[0].table;
            self.env
                .follow(&self.tables[t].flows, &self.program.machine.stages[0]);
        }
    }

    /// Points the generated code's [`Env`] at the table as it is now.
    fn refresh_env(&mut self) {
        if self.native.is_some() {
            let t = self.stages[0].table;
            let stage = &self.program.machine.stages[0];
            let table = &mut self.tables[t];
            self.env
                .refresh(&mut table.flows, &mut table.live, stage, &mut self.globals);
        }
    }

    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Contexts stage `stage` holds now.
    pub fn live_contexts(&self, stage: usize) -> usize {
        self.stages
            .get(stage)
            .filter(|s| s.table != 0)
            .map_or(0, |s| self.tables[s.table].live[s.member])
    }

    pub fn globals(&self) -> &[Value] {
        &self.globals
    }

    /// Swaps in new tables between packets; flow contexts and globals stay.
    /// The new program must keep every stage's key, flow registers and
    /// states (new states may follow the old ones) and the globals.
    pub fn replace(&mut self, program: Arc<Program>) -> Result<(), ReplaceError> {
        self.program.check_replacement(&program)?;
        for t in &mut self.tables {
            t.members.clear();
        }
        for (st, stage) in self.stages.iter().zip(&program.machine.stages) {
            if !stage.stateless() {
                self.tables[st.table]
                    .members
                    .push((st.meta_at, timeouts(stage)));
            }
        }
        self.program = program;
        self.take_code();
        Ok(())
    }

    /// Runs one packet through the stages. `fields` holds the program's
    /// field values (see [`crate::FieldReader`]), `port` the number of the
    /// port it came in on, `ts_ns` its timestamp. Allocates nothing.
    #[inline]
    pub fn process(&mut self, fields: &[Value], port: u8, len: usize, ts_ns: u64) -> Verdict {
        let mut verdict = Verdict::default();
        self.process_into(fields, port, len, ts_ns, &mut verdict);
        verdict
    }

    /// Runs frames through the stages in order, as [`Engine::process`]
    /// one after another would (same effects, same order), calling `out`
    /// with each frame's index and verdict. Allocates nothing.
    ///
    /// It used to hash a batch's keys first and ask for their tag words
    /// and records a few frames ahead, where a key had several words. With
    /// the hash two multiplications and replies' lookups skipped, that
    /// cost more than it saved: without it, Flick's frames per CPU second
    /// in batches went from 13.5-14.0 M to 18.0-18.3 M for the balancer,
    /// 7.9-8.0 M to 9.0 M for the tracker (with parsing in batches 6.4 M
    /// to 8.6 M, and the tracker's 5.4 M to 4.5-5.0 M: its one loss). The
    /// frames now run one by one. Tried again over the generated path
    /// (tags asked for 8 frames ahead, then records or the insertion's
    /// slot 4 ahead): no change beyond the noise for any of the three.
    pub fn process_batch<F: BatchFrame>(
        &mut self,
        frames: &[F],
        mut out: impl FnMut(usize, &Verdict),
    ) {
        let mut v = Verdict::default();
        for (i, f) in frames.iter().enumerate() {
            self.process_into(f.fields(), f.port(), f.bytes(), f.ts_ns(), &mut v);
            out(i, &v);
        }
    }

    /// [`Engine::process`] into `verdict`, whatever it held: a caller
    /// running packet after packet keeps one verdict, and only its counts
    /// are cleared (the packet's stores are fewer: each waits behind
    /// those to a record's line not yet in cache), and a verdict returned
    /// by value is copied (144 bytes, a call to `memcpy` per packet).
    #[inline]
    pub fn process_into(
        &mut self,
        fields: &[Value],
        port: u8,
        len: usize,
        ts_ns: u64,
        verdict: &mut Verdict,
    ) {
        verdict.ports = 0;
        verdict.nwrites = 0;
        let now = ts_ns / 1000;
        self.now_us = self.now_us.max(now);
        self.counters.packets += 1;
        if let Some(code) = self.native {
            if fields.len() >= code.fields {
                // A packet whose key the summary says is absent, from a
                // port whose rows then only send it on (a server's reply
                // to the balancer): the code would do no more than this.
                let last = self.absent_ports.len().saturating_sub(1);
                if let Some(&ports) = self.absent_ports.get((port as usize).min(last)) {
                    if ports != NOT_CONSTANT && self.env.absent(fields) {
                        verdict.ports = ports;
                        return;
                    }
                }
                // Safety: the program holding the code is this engine's,
                // the env describes its table as it is now (refreshed
                // after every change the interpreter or a forget makes),
                // the code was made for its shape (`take_code`), the
                // fields are enough and the verdict is cleared.
                let got = unsafe {
                    code.run(&mut self.env, fields, port as u64, len as u64, now, verdict)
                };
                if got != status::DONE {
                    self.handed_back(got, fields, port, len, now, verdict);
                }
                return;
            }
        }
        self.interpret(fields, port, len, now, verdict);
    }

    /// A packet the generated path handed back (see [`status`]): what is
    /// left of it, with the lookup it made, so that it is not made twice.
    #[cold]
    #[inline(never)]
    fn handed_back(
        &mut self,
        got: u64,
        fields: &[Value],
        port: u8,
        len: usize,
        now: u64,
        verdict: &mut Verdict,
    ) {
        let (slot, s, entry) = (status::slot(got), status::stage(got), status::entry(got));
        let packets = self.counters.packets;
        let program = &*self.program;
        let t = self.stages[0].table;
        // The stage after entry `entry` of stage `s`, where the
        // interpreter goes on.
        let after = |entry: Option<&Entry>| {
            entry
                .and_then(|e| e.next_stage)
                .map(|n| n as usize)
                .filter(|&n| n > s)
        };
        let table = &mut self.tables[t];
        let resume = match got & 0xff {
            status::FORGET => {
                let st = &self.stages[s];
                table.live[st.member] -= 1;
                table.forget(st.meta_at, slot);
                table.looked_up = packets;
                table.slot = None;
                table.placed = false;
                after(entry.map(|e| &program.tables[s].entries[e]))
            }
            status::FOUND => {
                table.looked_up = packets;
                table.slot = Some(slot);
                table.placed = false;
                Some(s)
            }
            status::MISSING => {
                table.looked_up = packets;
                table.slot = None;
                table.placed = false;
                Some(s)
            }
            status::REPROBE => {
                table.flows.reprobe();
                None
            }
            status::INSERTED => {
                table.looked_up = packets;
                table.slot = Some(slot);
                table.placed = false;
                after(entry.map(|e| &program.tables[s].entries[e]))
            }
            status::MAKE | status::MAKE_PLACED => {
                // The packet's entry is decided, taken and its globals
                // written: only the context is left to make, as the
                // interpreter would (or the table-full transition).
                let (stage, tables) = (&program.machine.stages[s], &program.tables[s]);
                let st = &mut self.stages[s];
                let n = st.regs.len();
                st.regs.copy_from_slice(&self.env.fresh[..n]);
                table.looked_up = packets;
                table.placed = got & 0xff == status::MAKE_PLACED;
                if table.placed {
                    let [b1, b2, tag] = self.env.place;
                    table.place = Place::of(b1 as usize, b2 as usize, tag as u16);
                }
                let entry = entry.map(|e| &tables.entries[e]);
                let packet = (now, port as Value, len as Value);
                let taken = Self::make_context(
                    stage,
                    tables,
                    st,
                    table,
                    &mut self.globals,
                    &mut self.counters,
                    &mut self.meta,
                    fields,
                    None,
                    packet,
                    verdict,
                    (entry, true),
                    self.env.fresh_state as StateId,
                );
                after(taken)
            }
            _ => Some(0),
        };
        if let Some(from) = resume {
            self.interpret_from(from, fields, port, len, now, verdict);
        }
        self.follow_table();
    }

    /// A packet through the stages' tables.
    #[inline(never)]
    fn interpret(
        &mut self,
        fields: &[Value],
        port: u8,
        len: usize,
        now: u64,
        verdict: &mut Verdict,
    ) {
        self.interpret_from(0, fields, port, len, now, verdict)
    }

    /// A packet through the stages' tables from stage `start` (the
    /// stages before it run, by the generated code).
    #[inline(always)]
    fn interpret_from(
        &mut self,
        start: usize,
        fields: &[Value],
        port: u8,
        len: usize,
        now: u64,
        verdict: &mut Verdict,
    ) {
        let program = &*self.program;
        // The packet's metadata: zero as it enters, carried along. Only
        // the words the program names are cleared: each store counts
        // where a packet's stores wait behind a record's line.
        let meta = &mut self.meta;
        if start == 0 {
            meta[..program.machine.meta.len().min(MAX_META)].fill(0);
        }
        let (port, len) = (port as Value, len as Value);
        let mut s = start;
        while let (Some(stage), Some(tables), Some(st)) = (
            program.machine.stages.get(s),
            program.tables.get(s),
            self.stages.get_mut(s),
        ) {
            let entry = if stage.stateless() {
                let entry = transition(
                    tables,
                    stage.initial,
                    Event::Packet,
                    fields,
                    Writable {
                        globals: &mut self.globals,
                        meta,
                    },
                    &mut st.regs,
                    (now, port, len),
                );
                if let Some(e) = entry {
                    let got = (fields, &self.globals[..], &meta[..]);
                    take(e, verdict, got, &st.regs, (now, port, len));
                }
                entry
            } else {
                let t = st.table;
                Self::stateful(
                    stage,
                    tables,
                    st,
                    &mut self.tables[t],
                    &mut self.globals,
                    &mut self.counters,
                    meta,
                    fields,
                    (now, port, len),
                    verdict,
                )
            };
            let Some(e) = entry else { break };
            match e.next_stage {
                Some(next) if next as usize > s => s = next as usize,
                _ => break,
            }
        }
    }

    /// A stage that keeps flow contexts: finds the packet's (looking its
    /// key up unless a stage before on the same table did for this
    /// packet), runs its timeout and packet transitions, stores it back
    /// (or not, when it is back at its start), and adds the entry's ports
    /// and writes to `verdict`. The entry the packet took, if any.
    ///
    /// A context found is worked on where it lies in its record, its
    /// registers read and written there: nothing is copied in or out.
    /// A lookup is skipped where the table's summary says the key is
    /// absent and the stage's rows say a packet from this port that
    /// finds no context leaves none ([`StageTables::quiet_miss`]): it
    /// would miss, and a miss then changes nothing beyond what the
    /// initial state's rows do (no idle timer to refresh, nothing
    /// expired, nothing made).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn stateful<'t>(
        stage: &Stage,
        tables: &'t StageTables,
        st: &mut StageState,
        table: &mut TableState,
        globals: &mut [Value],
        counters: &mut Counters,
        meta: &mut [Value; MAX_META],
        fields: &[Value],
        packet: (u64, Value, Value),
        verdict: &mut Verdict,
    ) -> Option<&'t Entry> {
        let (now, port, _) = packet;
        // A packet whose miss is quiet, told absent by the one key word
        // the summary reads: no key made, nothing looked up.
        if table.looked_up != counters.packets && !stage.biflow && tables.quiet_miss(port) {
            if let Some(p) = table.flows.probe() {
                if table.flows.absent_word(fields[stage.key[p] as usize]) {
                    table.looked_up = counters.packets;
                    table.placed = false;
                    table.slot = None;
                    return Self::fresh(
                        stage, tables, st, table, globals, counters, meta, fields, None, packet,
                        verdict,
                    );
                }
            }
        }
        // The key's record, with this stage's context in it or not (the
        // key made only where it is looked up: a later stage on the same
        // table takes the first one's record).
        let record = if table.looked_up == counters.packets {
            table.slot
        } else {
            let mut key = [0 as Value; MAX_KEY];
            let n = flow_key(stage, fields, &mut key);
            let key = &key[..n];
            table.looked_up = counters.packets;
            table.placed = false;
            table.slot = if tables.quiet_miss(port) && table.flows.absent(key) {
                None
            } else {
                if !table.placed {
                    table.place = table.flows.place(key);
                    table.placed = true;
                }
                table.flows.find_at(key, table.place)
            };
            table.slot
        };
        let found = record.filter(|&slot| table.flows.words(slot)[st.meta_at] & PRESENT != 0);
        let Some(slot) = found else {
            return Self::fresh(
                stage, tables, st, table, globals, counters, meta, fields, record, packet, verdict,
            );
        };
        let nregs = st.regs.len();
        let w = table.flows.words_mut(slot);
        let m = meta_at(w, st.meta_at);
        let (mut state, mut created) = (m.state, m.created);
        let regs = &mut w[st.regs_at..st.regs_at + nregs];
        if let Some(why) = timeouts(stage).expiry(&m, now) {
            counters.expired += 1;
            let event = match why {
                Expiry::Idle => Event::IdleTimeout,
                Expiry::Hard => Event::HardTimeout,
            };
            let out = Writable { globals, meta };
            match transition(tables, state, event, fields, out, regs, packet) {
                Some(e) => state = e.next_state.unwrap_or(state),
                None => {
                    state = stage.initial;
                    copy(regs, &st.init);
                }
            }
            created = now;
        }
        let out = Writable { globals, meta };
        let entry = transition(tables, state, Event::Packet, fields, out, regs, packet);
        if let Some(e) = entry {
            state = e.next_state.unwrap_or(state);
            take(e, verdict, (fields, globals, meta), regs, packet);
        }
        if state == stage.initial && same(regs, &st.init) {
            table.live[st.member] -= 1;
            table.forget(st.meta_at, slot);
            if !table.any_present(slot) {
                table.slot = None;
            }
        } else {
            let at = st.meta_at;
            w[at] = state as Value | PRESENT;
            w[at + 1] = created;
            w[at + 2] = now;
        }
        entry
    }

    /// [`Engine::stateful`] for a packet with no context in the stage:
    /// its initial state and registers, in the stage's own registers; a
    /// context made (in `record`, where another stage's context holds the
    /// key's record, else in a new one) unless the packet leaves it at its
    /// start, or the table-full transition where no room is found.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn fresh<'t>(
        stage: &Stage,
        tables: &'t StageTables,
        st: &mut StageState,
        table: &mut TableState,
        globals: &mut [Value],
        counters: &mut Counters,
        meta: &mut [Value; MAX_META],
        fields: &[Value],
        record: Option<usize>,
        packet: (u64, Value, Value),
        verdict: &mut Verdict,
    ) -> Option<&'t Entry> {
        if let Some(entry) = tables.constant_miss(packet.1) {
            // What the general path below comes to for such an entry:
            // the initial state and registers, unchanged.
            if let Some(e) = entry {
                take(e, verdict, (fields, globals, meta), &st.init, packet);
            }
            return entry;
        }
        let regs = &mut st.regs[..];
        copy(regs, &st.init);
        let mut state = stage.initial;
        let out = Writable { globals, meta };
        let entry = transition(tables, state, Event::Packet, fields, out, regs, packet);
        if let Some(e) = entry {
            state = e.next_state.unwrap_or(state);
        }
        if state == stage.initial && same(regs, &st.init) {
            if let Some(e) = entry {
                take(e, verdict, (fields, globals, meta), regs, packet);
            }
            return entry;
        }
        Self::make_context(
            stage,
            tables,
            st,
            table,
            globals,
            counters,
            meta,
            fields,
            record,
            packet,
            verdict,
            (entry, false),
            state,
        )
    }

    /// The end of [`Engine::fresh`] for a packet that makes a context:
    /// its entry taken (unless `entry.1` says it is in the verdict
    /// already), its state `state` and registers in the stage's own,
    /// stored in `record` or a new one; or the table-full transition
    /// where no room is found (the verdict cleared of the entry first).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn make_context<'t>(
        stage: &Stage,
        tables: &'t StageTables,
        st: &mut StageState,
        table: &mut TableState,
        globals: &mut [Value],
        counters: &mut Counters,
        meta: &mut [Value; MAX_META],
        fields: &[Value],
        record: Option<usize>,
        packet: (u64, Value, Value),
        verdict: &mut Verdict,
        (entry, taken): (Option<&'t Entry>, bool),
        state: StateId,
    ) -> Option<&'t Entry> {
        let now = packet.0;
        let regs = &mut st.regs[..];
        let slot = match record {
            // Another stage's context holds the record: this one joins it.
            Some(slot) => Some(slot),
            None => {
                let mut key = [0 as Value; MAX_KEY];
                let n = flow_key(stage, fields, &mut key);
                let key = &key[..n];
                if !table.placed {
                    table.place = table.flows.place(key);
                    table.placed = true;
                }
                match Self::insert(table, key, now, stage.eviction) {
                    Ok(slot) => Some(slot),
                    Err(evicted) => {
                        counters.evicted += evicted.evicted;
                        evicted.slot
                    }
                }
            }
        };
        let Some(slot) = slot else {
            counters.table_full += 1;
            if taken {
                verdict.ports = 0;
                verdict.nwrites = 0;
            }
            copy(regs, &st.init);
            let out = Writable { globals, meta };
            let entry = transition(
                tables,
                stage.initial,
                Event::TableFull,
                fields,
                out,
                regs,
                packet,
            );
            if let Some(e) = entry {
                take(e, verdict, (fields, globals, meta), regs, packet);
            }
            return entry;
        };
        table.live[st.member] += 1;
        if let (Some(e), false) = (entry, taken) {
            take(e, verdict, (fields, globals, meta), regs, packet);
        }
        let w = table.flows.words_mut(slot);
        copy(&mut w[st.regs_at..st.regs_at + regs.len()], regs);
        let at = st.meta_at;
        w[at] = state as Value | PRESENT;
        w[at + 1] = now;
        w[at + 2] = now;
        entry
    }

    /// Makes a record for `key` (not in `table`, whose place was computed
    /// for this packet): `Ok` with its slot when a free one was found;
    /// otherwise the contexts evicted for it (those of every stage in the
    /// evicted record; they leave their stages' counts) and its slot, or
    /// none: the table is full. Every stage's state word in the new record
    /// is cleared.
    #[cold]
    fn insert(
        table: &mut TableState,
        key: &[Value],
        now: u64,
        eviction: crate::model::Eviction,
    ) -> Result<usize, Evicted> {
        let members = &table.members;
        let expired = |w: &[Value]| {
            members.iter().all(|&(at, t)| {
                let m = meta_at(w, at);
                !m.used || t.expiry(&m, now).is_some()
            })
        };
        let last = |w: &[Value]| {
            members
                .iter()
                .filter(|&&(at, _)| w[at] & PRESENT != 0)
                .map(|&(at, _)| w[at + 2])
                .max()
                .unwrap_or(0)
        };
        let placed = table
            .flows
            .insert_by(key, table.place, eviction, expired, last);
        let (slot, evicted) = match placed {
            Ok(Placed::Free(slot)) => (Some(slot), 0),
            Ok(Placed::Evicted(slot)) => {
                let w = table.flows.words(slot);
                let mut n = 0;
                for (live, &(at, _)) in table.live.iter_mut().zip(members) {
                    if w[at] & PRESENT != 0 {
                        *live -= 1;
                        n += 1;
                    }
                }
                (Some(slot), n)
            }
            Err(_) => (None, 0),
        };
        table.slot = slot;
        let Some(slot) = slot else {
            return Err(Evicted {
                slot: None,
                evicted: 0,
            });
        };
        let w = table.flows.words_mut(slot);
        for &(at, _) in &table.members {
            w[at] = 0;
        }
        if evicted == 0 {
            Ok(slot)
        } else {
            Err(Evicted {
                slot: Some(slot),
                evicted: evicted as u64,
            })
        }
    }

    /// Whether every flow table's counts agree with its slots (see
    /// [`FlowTable::counts_hold`]).
    pub fn counts_hold(&self) -> bool {
        self.tables.iter().all(|t| t.flows.counts_hold())
    }

    /// Every context of every stage, stage by stage in slot order.
    pub fn contexts(&self) -> Vec<Context> {
        let mut out = Vec::new();
        for (i, (st, stage)) in self
            .stages
            .iter()
            .zip(&self.program.machine.stages)
            .enumerate()
        {
            if stage.stateless() {
                continue;
            }
            let flows = &self.tables[st.table].flows;
            for slot in flows.slots() {
                let w = flows.words(slot);
                let m = meta_at(w, st.meta_at);
                if m.used {
                    out.push(Context {
                        stage: i,
                        key: flows.key(slot).to_vec(),
                        state: m.state,
                        regs: w[st.regs_at..st.regs_at + st.regs.len()].to_vec(),
                        created_us: m.created,
                        last_us: m.last,
                    });
                }
            }
        }
        out
    }
}

/// Contexts evicted for a new record, and its slot (none: no room).
struct Evicted {
    slot: Option<usize>,
    evicted: u64,
}

impl Program {
    /// Whether `new` may replace these tables while running (see
    /// [`Engine::replace`]), so a caller can refuse it before sending it.
    pub fn check_replacement(&self, new: &Program) -> Result<(), ReplaceError> {
        let (old, new) = (&self.machine, &new.machine);
        if old.stages.len() != new.stages.len() {
            return Err(ReplaceError::Stages {
                old: old.stages.len(),
                new: new.stages.len(),
            });
        }
        let names = |m: &Machine, ids: &[FieldId]| -> Vec<String> {
            ids.iter()
                .map(|&f| m.fields[f as usize].name.clone())
                .collect()
        };
        for (a, b) in old.stages.iter().zip(&new.stages) {
            if names(old, &a.key) != names(new, &b.key) || a.biflow != b.biflow {
                return Err(ReplaceError::Key(b.name.clone()));
            }
            if a.flow_regs
                .iter()
                .map(|r| &r.name)
                .ne(b.flow_regs.iter().map(|r| &r.name))
            {
                return Err(ReplaceError::Registers(b.name.clone()));
            }
            if b.states.len() < a.states.len()
                || a.states[..] != b.states[..a.states.len()]
                || a.initial != b.initial
            {
                return Err(ReplaceError::States(b.name.clone()));
            }
        }
        if old
            .globals
            .iter()
            .map(|g| &g.name)
            .ne(new.globals.iter().map(|g| &g.name))
        {
            return Err(ReplaceError::Globals);
        }
        Ok(())
    }
}

/// What a control write does to one flow context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowEdit {
    /// Sets flow register `.0` (by its place in the stage's list).
    Register(u16, Value),
    /// Moves the context to state `.0`.
    State(u16),
    /// Forgets the context, as its expiry would.
    Remove,
}

/// Control writes, applied by the worker between two batches: none of
/// this runs per frame.
impl Engine {
    /// Sets global register `reg`; false where there is none.
    pub fn set_global(&mut self, reg: usize, value: Value) -> bool {
        match self.globals.get_mut(reg) {
            Some(g) => {
                *g = value;
                true
            }
            None => false,
        }
    }

    /// Edits the context of stage `stage` under `key` (the key's fields in
    /// the stage's order, a biflow key's endpoints either way round);
    /// whether this engine holds that context (and the edit fits it).
    pub fn edit_flow(&mut self, stage: usize, key: &[Value], edit: FlowEdit) -> bool {
        let Some(def) = self.program.machine.stages.get(stage) else {
            return false;
        };
        let n = key.len();
        if def.stateless() || n != def.key.len() || n > MAX_KEY {
            return false;
        }
        let mut ordered = [0 as Value; MAX_KEY];
        ordered[..n].copy_from_slice(key);
        if def.biflow && ordered[n / 2..n] < ordered[..n / 2] {
            for i in 0..n / 2 {
                ordered.swap(i, n / 2 + i);
            }
        }
        let states = def.states.len();
        let st = &mut self.stages[stage];
        let Some(slot) = self.tables[st.table].context(st.meta_at, &ordered[..n]) else {
            return false;
        };
        match edit {
            FlowEdit::Register(r, value) if (r as usize) < st.regs.len() => {
                self.tables[st.table].flows.words_mut(slot)[st.regs_at + r as usize] = value;
            }
            FlowEdit::Register(..) => return false,
            FlowEdit::State(s) if (s as usize) < states => {
                self.tables[st.table].flows.words_mut(slot)[st.meta_at] = s as Value | PRESENT;
            }
            FlowEdit::State(_) => return false,
            FlowEdit::Remove => {
                let table = &mut self.tables[st.table];
                table.live[st.member] -= 1;
                table.forget(st.meta_at, slot);
            }
        }
        true
    }
}
