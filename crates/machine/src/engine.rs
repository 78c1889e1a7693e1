//! One worker's executor: its flow tables (one per stage), its global
//! registers, and the per-packet walk through the stages' tables.
//!
//! Per packet and stage: build the flow key (ordered endpoints for a
//! biflow key), look the context up; if it has expired, run its timeout
//! transition (or reset it when there is none); evaluate the condition
//! vector, take the first matching row, run its updates in order, move to
//! its next state, and collect its sends and writes. A context back in its
//! initial state with its registers at their initial values is not kept,
//! so traffic that moves no machine fills no table. A new context that
//! finds no room runs the `tableFull` transition of the initial state
//! instead, which decides where the packet goes (nowhere if there is none).

use crate::flows::{Expiry, FlowTable, Place, Placed, Timeouts};
use crate::model::{Event, FieldId, Machine, Stage, Value, MAX_KEY, MAX_META, MAX_WRITES};
use crate::tables::{apply_updates, CompileError, Entry, Inputs, StageTables, Writable};
use std::sync::Arc;

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

/// A stage's flow key for a packet, on the stack: its fields' values,
/// the two endpoints in order for a biflow key.
#[inline]
fn flow_key(stage: &Stage, fields: &[Value]) -> ([Value; MAX_KEY], usize) {
    let mut key = [0 as Value; MAX_KEY];
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
    (key, n)
}

/// A machine and its compiled tables.
#[derive(Debug)]
pub struct Program {
    pub machine: Machine,
    pub tables: Vec<StageTables>,
}

impl Program {
    pub fn new(machine: Machine) -> Result<Program, CompileError> {
        let tables = machine
            .stages
            .iter()
            .map(StageTables::compile)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Program { machine, tables })
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

/// Where a packet goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
    flows: FlowTable,
    regs: Vec<Value>,
    init: Vec<Value>,
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

/// Frames [`Engine::process_batch`] hashes and prefetches ahead of
/// processing them, at most.
pub const BATCH: usize = 64;
/// How many frames ahead of the one processed a batch asks for tag words,
/// and for the records those tags point at (after the tags have had time
/// to arrive).
const TAGS_AHEAD: usize = 8;
const RECORDS_AHEAD: usize = 4;

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
    /// A batch's places, [`BATCH`] frames of one per stage, made once.
    places: Vec<Place>,
    /// Per stage, an earlier stage whose key (fields and direction) and
    /// table size are the same, so its place is this stage's too: a batch
    /// hashes such a key once (the tracker's two stages).
    same_place: Vec<Option<usize>>,
    globals: Vec<Value>,
    counters: Counters,
    /// The latest packet time seen, microseconds.
    pub now_us: u64,
}

impl Engine {
    pub fn new(program: Arc<Program>) -> Engine {
        let stages: Vec<StageState> = program
            .machine
            .stages
            .iter()
            .map(|s| {
                let init: Vec<Value> = s.flow_regs.iter().map(|r| r.init).collect();
                // A stateless stage looks nothing up: the smallest table.
                let capacity = if s.stateless() { 0 } else { s.capacity };
                StageState {
                    flows: FlowTable::new(capacity, s.key.len(), s.flow_regs.len()),
                    regs: init.clone(),
                    init,
                }
            })
            .collect();
        let globals = program.machine.globals.iter().map(|g| g.init).collect();
        let places = vec![Place::default(); BATCH * stages.len()];
        let all = &program.machine.stages;
        let same_place = (0..all.len())
            .map(|s| {
                (0..s).find(|&t| {
                    !all[s].stateless()
                        && all[t].key == all[s].key
                        && all[t].biflow == all[s].biflow
                        && stages[t].flows.capacity() == stages[s].flows.capacity()
                })
            })
            .collect();
        Engine {
            program,
            stages,
            places,
            same_place,
            globals,
            counters: Counters::default(),
            now_us: 0,
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
        self.stages.get(stage).map_or(0, |s| s.flows.len())
    }

    pub fn globals(&self) -> &[Value] {
        &self.globals
    }

    /// Swaps in new tables between packets; flow contexts and globals stay.
    /// The new program must keep every stage's key, flow registers and
    /// states (new states may follow the old ones) and the globals.
    pub fn replace(&mut self, program: Arc<Program>) -> Result<(), ReplaceError> {
        self.program.check_replacement(&program)?;
        self.program = program;
        Ok(())
    }

    /// Runs one packet through the stages. `fields` holds the program's
    /// field values (see [`crate::FieldReader`]), `port` the number of the
    /// port it came in on, `ts_ns` its timestamp. Allocates nothing.
    pub fn process(&mut self, fields: &[Value], port: u8, len: usize, ts_ns: u64) -> Verdict {
        self.process_at(fields, port, len, ts_ns, None)
    }

    /// Runs frames through the stages in order, as [`Engine::process`]
    /// one after another would (same effects, same order), calling `out`
    /// with each frame's index and verdict. Every stateful stage's key is
    /// hashed once per frame up front, [`BATCH`] frames at a time, and
    /// the buckets' tag words, then the matching records, are asked for a
    /// few frames ahead, so that one frame's cache misses overlap the work
    /// on those before it. Allocates nothing.
    pub fn process_batch<F: BatchFrame>(
        &mut self,
        frames: &[F],
        mut out: impl FnMut(usize, Verdict),
    ) {
        let mut places = std::mem::take(&mut self.places);
        let program = Arc::clone(&self.program);
        let stages = &program.machine.stages;
        let n = stages.len();
        for (c, chunk) in frames.chunks(BATCH).enumerate() {
            for (i, f) in chunk.iter().enumerate() {
                for (s, stage) in stages.iter().enumerate() {
                    if let Some(t) = self.same_place[s] {
                        places[i * n + s] = places[i * n + t];
                    } else if !stage.stateless() {
                        let (key, k) = flow_key(stage, f.fields());
                        places[i * n + s] = self.stages[s].flows.place(&key[..k]);
                    }
                }
            }
            let ask = |engine: &Engine, i: usize, records: bool| {
                for (s, stage) in stages.iter().enumerate() {
                    if !stage.stateless() {
                        let table = &engine.stages[s].flows;
                        if records {
                            table.prefetch_records(places[i * n + s]);
                        } else {
                            table.prefetch_tags(places[i * n + s]);
                        }
                    }
                }
            };
            for i in 0..chunk.len().min(TAGS_AHEAD) {
                ask(self, i, false);
            }
            for i in 0..chunk.len().min(RECORDS_AHEAD) {
                ask(self, i, true);
            }
            for (i, f) in chunk.iter().enumerate() {
                if i + TAGS_AHEAD < chunk.len() {
                    ask(self, i + TAGS_AHEAD, false);
                }
                if i + RECORDS_AHEAD < chunk.len() {
                    ask(self, i + RECORDS_AHEAD, true);
                }
                let at = &places[i * n..(i + 1) * n];
                let v = self.process_at(f.fields(), f.port(), f.bytes(), f.ts_ns(), Some(at));
                out(c * BATCH + i, v);
            }
        }
        self.places = places;
    }

    /// [`Engine::process`], with each stateful stage's place computed
    /// already where `places` is given (one per stage).
    #[inline]
    fn process_at(
        &mut self,
        fields: &[Value],
        port: u8,
        len: usize,
        ts_ns: u64,
        places: Option<&[Place]>,
    ) -> Verdict {
        let now = ts_ns / 1000;
        self.now_us = self.now_us.max(now);
        self.counters.packets += 1;
        let program = &*self.program;
        let mut verdict = Verdict::default();
        // The packet's metadata: zero as it enters, carried along.
        let mut meta = [0 as Value; MAX_META];
        let (port, len) = (port as Value, len as Value);
        let mut s = 0;
        while let (Some(stage), Some(tables), Some(st)) = (
            program.machine.stages.get(s),
            program.tables.get(s),
            self.stages.get_mut(s),
        ) {
            let entry = if stage.stateless() {
                let inputs = Inputs {
                    fields,
                    globals: &self.globals,
                    now_us: now,
                    port,
                    len,
                    meta: &meta,
                };
                let entry = tables.decide(stage.initial, Event::Packet, &inputs, &st.regs);
                if let Some(e) = entry {
                    let out = Writable {
                        globals: &mut self.globals,
                        meta: &mut meta,
                    };
                    apply_updates(&e.updates, fields, &mut st.regs, out, now, port, len);
                }
                entry
            } else {
                Self::stateful(
                    stage,
                    tables,
                    st,
                    &mut self.globals,
                    &mut self.counters,
                    &mut meta,
                    fields,
                    places.map(|p| p[s]),
                    (now, port, len),
                )
            };
            let Some(e) = entry else { break };
            if e.drop {
                verdict.ports = 0;
            }
            verdict.ports |= e.ports;
            let inputs = Inputs {
                fields,
                globals: &self.globals,
                now_us: now,
                port,
                len,
                meta: &meta,
            };
            for &(f, v) in &e.writes {
                if verdict.nwrites < MAX_WRITES {
                    verdict.writes[verdict.nwrites] = (f, inputs.operand(&st.regs, v));
                    verdict.nwrites += 1;
                }
            }
            match e.next_stage {
                Some(next) if next as usize > s => s = next as usize,
                _ => break,
            }
        }
        verdict
    }

    /// A stage that keeps flow contexts: finds the packet's, runs its
    /// timeout and packet transitions, and stores it back (or not, when
    /// it is back at its start). The entry the packet took, if any;
    /// `st.regs` holds the context's registers after it.
    #[allow(clippy::too_many_arguments)]
    fn stateful<'t>(
        stage: &Stage,
        tables: &'t StageTables,
        st: &mut StageState,
        globals: &mut [Value],
        counters: &mut Counters,
        meta: &mut [Value; MAX_META],
        fields: &[Value],
        place: Option<Place>,
        (now, port, len): (u64, Value, Value),
    ) -> Option<&'t Entry> {
        let (key, n) = flow_key(stage, fields);
        let key = &key[..n];
        let timeouts = Timeouts {
            idle: stage.idle_timeout_us,
            hard: stage.hard_timeout_us,
        };
        let place = place.unwrap_or_else(|| st.flows.place(key));
        let found = st.flows.find_at(key, place);
        let (mut state, mut created) = (stage.initial, now);
        match found {
            Some(slot) => {
                copy(&mut st.regs, st.flows.regs(slot));
                let m = st.flows.meta(slot);
                (state, created) = (m.state, m.created);
                if let Some(why) = timeouts.expiry(&m, now) {
                    counters.expired += 1;
                    let event = match why {
                        Expiry::Idle => Event::IdleTimeout,
                        Expiry::Hard => Event::HardTimeout,
                    };
                    let inputs = Inputs {
                        fields,
                        globals,
                        now_us: now,
                        port,
                        len,
                        meta,
                    };
                    match tables.decide(state, event, &inputs, &st.regs) {
                        Some(e) => {
                            let out = Writable { globals, meta };
                            apply_updates(&e.updates, fields, &mut st.regs, out, now, port, len);
                            state = e.next_state.unwrap_or(state);
                        }
                        None => {
                            state = stage.initial;
                            copy(&mut st.regs, &st.init);
                        }
                    }
                    created = now;
                }
            }
            None => st.regs.copy_from_slice(&st.init),
        }
        let inputs = Inputs {
            fields,
            globals,
            now_us: now,
            port,
            len,
            meta,
        };
        let mut entry = tables.decide(state, Event::Packet, &inputs, &st.regs);
        if let Some(e) = entry {
            let out = Writable { globals, meta };
            apply_updates(&e.updates, fields, &mut st.regs, out, now, port, len);
            state = e.next_state.unwrap_or(state);
        }
        let initial = state == stage.initial && same(&st.regs, &st.init);
        let slot = match found {
            Some(slot) if initial => {
                st.flows.remove(slot);
                None
            }
            Some(slot) => Some(slot),
            None if initial => None,
            None => match st
                .flows
                .insert_at(key, place, now, &timeouts, stage.eviction)
            {
                Ok(Placed::Free(slot)) => Some(slot),
                Ok(Placed::Evicted(slot)) => {
                    counters.evicted += 1;
                    Some(slot)
                }
                Err(_) => {
                    counters.table_full += 1;
                    copy(&mut st.regs, &st.init);
                    let inputs = Inputs {
                        fields,
                        globals,
                        now_us: now,
                        port,
                        len,
                        meta,
                    };
                    entry = tables.decide(stage.initial, Event::TableFull, &inputs, &st.regs);
                    if let Some(e) = entry {
                        let out = Writable { globals, meta };
                        apply_updates(&e.updates, fields, &mut st.regs, out, now, port, len);
                    }
                    None
                }
            },
        };
        if let Some(slot) = slot {
            copy(st.flows.regs_mut(slot), &st.regs);
            st.flows.set_meta(slot, state, created, now);
        }
        entry
    }

    /// Every context of every stage, in slot order.
    pub fn contexts(&self) -> Vec<Context> {
        let mut out = Vec::new();
        for (i, st) in self.stages.iter().enumerate() {
            for slot in st.flows.slots() {
                let m = st.flows.meta(slot);
                out.push(Context {
                    stage: i,
                    key: st.flows.key(slot).to_vec(),
                    state: m.state,
                    regs: st.flows.regs(slot).to_vec(),
                    created_us: m.created,
                    last_us: m.last,
                });
            }
        }
        out
    }
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
        let Some(slot) = st.flows.find(&ordered[..n]) else {
            return false;
        };
        match edit {
            FlowEdit::Register(r, value) => match st.flows.regs_mut(slot).get_mut(r as usize) {
                Some(reg) => *reg = value,
                None => return false,
            },
            FlowEdit::State(s) if (s as usize) < states => {
                let m = st.flows.meta(slot);
                st.flows.set_meta(slot, s, m.created, m.last);
            }
            FlowEdit::State(_) => return false,
            FlowEdit::Remove => st.flows.remove(slot),
        }
        true
    }
}
