//! A machine served over packet ports: the calling thread dispatches,
//! `workers` threads run the engine, one thread writes.
//!
//! 1. The dispatcher reads the input ports. Files are merged by timestamp
//!    (ties to the lower port number), so time-driven machines see the
//!    frames in the order they were captured; with a live port among the
//!    inputs, ports are read in turn, a batch at a time, a live one no more
//!    frames than there are free jobs (the rest wait in its kernel ring,
//!    which counts what it drops: [`LiveStats::rx_drops`]). Each frame is
//!    copied into a pooled job, numbered in reading order, parsed once
//!    with the `packet` unit into the program's field values, and queued
//!    to the worker its flow key hashes to (the key of the first stage
//!    that keeps contexts, ordered for a biflow key, so both directions
//!    meet; frames of a program whose stages are all stateless go to the
//!    workers in turn). A program with several stages that keep contexts,
//!    or that writes a global register, is served by one worker: its
//!    contexts or globals could not be split by one key.
//! 2. A worker runs the engine on the job: its flow tables are its own,
//!    so nothing is locked per frame. Tables sent to [`MachineService::run`]
//!    reach every worker through its queue, between two frames, in the
//!    input's order.
//! 3. The writer puts jobs back in reading order (a ring as large as the
//!    pool, so it never overflows), sends each frame to the ports its
//!    verdict names, and returns the job to the pool.
//!
//! Output files are therefore the same whatever the number of workers.
//! Nothing is allocated per frame once the pool's buffers have grown.
//!
//! While it runs, [`LiveStats`] counts frames in, out and dropped per port
//! and each worker's engine counters (for metrics), and a dump asked for
//! through [`MachineService::dump_on`] is taken without stopping: the
//! dispatcher queues a dump request to every worker behind the frames
//! already sent to it, gathers their contexts, and hands the dump over.
//! Writes to registers and flow contexts ([`MachineControl`]) go the same
//! way: a bounded queue the dispatcher looks at between frames, then each
//! worker's queue, applied between two batches; the writer waits for the
//! workers' answers, the dispatcher never does.

use crate::engine::{Context, Counters, Engine, FlowEdit, Program, Verdict, BATCH as ENGINE_BATCH};
use crate::fields::{write_field, write_place, FieldError, FieldReader};
use crate::flows::{hash_key, Timeouts};
use crate::model::{Value, MAX_KEY, MAX_PORTS};
use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError};
use flick_packet_io::{PortError, RecvStatus, RxPort, TxPort};
use serde_json::{Map, Value as Json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A port frames come in on, by its XL number.
pub struct InPort {
    pub number: u8,
    /// As written, for messages.
    pub spec: String,
    pub rx: Box<dyn RxPort>,
    /// A live port (an interface) rather than a file.
    pub live: bool,
}

/// A port frames go out on, by its XL number.
pub struct OutPort {
    pub number: u8,
    pub spec: String,
    pub tx: Box<dyn TxPort>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Field(#[from] FieldError),
    #[error("port {number} ({spec}): {source}")]
    Port {
        number: u8,
        spec: String,
        source: PortError,
    },
    #[error("port number {0} is out of range: ports are numbered 1 to 63")]
    PortNumber(u8),
    #[error("a {0} thread panicked")]
    Panicked(&'static str),
    #[error("cannot start a {0} thread: {1}")]
    Spawn(&'static str, std::io::Error),
}

/// Frames in flight (so also the writer's ring).
const POOL: usize = 1024;
/// Jobs queued to one worker.
const QUEUE: usize = 256;
/// How often the dispatcher reads its input ports' own drop counts.
const PORT_DROPS_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// How long a dispatcher with no free job waits for one before looking
/// at its other duties (a stop, a dump, tables, writes) again.
const FREE_JOB_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// Frames taken from a live port per call.
const BATCH: usize = 64;
/// Fresh buffers hold an Ethernet frame with a VLAN tag.
const FRAME_BUFFER: usize = 2048;
const STEER_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

struct Job {
    seq: u64,
    ts: u64,
    port: u8,
    ports: u64,
    buf: Vec<u8>,
    fields: Vec<Value>,
}

enum Msg {
    Frame(Job),
    Swap(Arc<Program>),
    /// Send back this worker's part of a dump.
    Dump(Sender<WorkerDump>),
    /// Apply a control write and answer whether this worker held what it
    /// names (boxed: rare, and frames' messages stay small).
    Control(Box<(ControlOp, Sender<bool>)>),
}

/// A write to a running machine's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlOp {
    /// Sets global register `reg` (by its place in the program's list).
    Global { reg: u16, value: Value },
    /// Edits the flow context of stage `stage` under the first `len`
    /// values of `key` (see [`Engine::edit_flow`]).
    Flow {
        stage: u16,
        key: [Value; MAX_KEY],
        len: u8,
        edit: FlowEdit,
    },
}

/// Why a control write got no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("the machine is not running")]
    NotRunning,
    #[error("the machine's control queue is full; try again")]
    Busy,
    #[error("the machine did not apply the write in time")]
    Timeout,
}

/// Writes queued to the control queue at most: a writer beyond them is
/// told to try again rather than kept waiting.
const CONTROL_QUEUE: usize = 64;

/// The writing end of a running machine's control queue (see
/// [`MachineService::control`]); cheap to clone.
#[derive(Clone, Debug)]
pub struct MachineControl {
    queue: Sender<(ControlOp, Sender<bool>)>,
    workers: usize,
}

/// A control write queued and not yet answered. Queuing and waiting are
/// apart so that a caller may queue under a lock and wait outside it.
#[must_use = "a control write is answered only through `wait`"]
#[derive(Debug)]
pub struct PendingControl {
    answers: Receiver<bool>,
    workers: usize,
}

impl MachineControl {
    /// Queues `op` for every worker, without waiting.
    pub fn queue(&self, op: ControlOp) -> Result<PendingControl, ControlError> {
        let (reply, answers) = bounded(self.workers);
        self.queue.try_send((op, reply)).map_err(|e| match e {
            crossbeam_channel::TrySendError::Full(_) => ControlError::Busy,
            crossbeam_channel::TrySendError::Disconnected(_) => ControlError::NotRunning,
        })?;
        Ok(PendingControl {
            answers,
            workers: self.workers,
        })
    }
}

impl PendingControl {
    /// Waits at most `timeout` for every worker to apply the write; how
    /// many held what it names (each one for a global register, the one
    /// owning a flow context for a flow's).
    pub fn wait(self, timeout: std::time::Duration) -> Result<usize, ControlError> {
        let deadline = std::time::Instant::now() + timeout;
        let mut held = 0;
        for _ in 0..self.workers {
            match self.answers.recv_deadline(deadline) {
                Ok(h) => held += h as usize,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    return Err(ControlError::Timeout)
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(ControlError::NotRunning)
                }
            }
        }
        Ok(held)
    }
}

/// One worker's contexts, globals and counters, for a dump.
struct WorkerDump {
    program: Arc<Program>,
    contexts: Vec<Context>,
    globals: Vec<Value>,
    counters: Counters,
    now_us: u64,
}

impl WorkerDump {
    fn of(engine: &Engine) -> WorkerDump {
        WorkerDump {
            program: engine.program().clone(),
            contexts: engine.contexts(),
            globals: engine.globals().to_vec(),
            counters: engine.counters(),
            now_us: engine.now_us,
        }
    }
}

/// Builds a dump from the workers' parts (the first worker's globals and
/// program: globals are written only where one worker serves).
fn assemble(
    parts: Vec<WorkerDump>,
    fallback: &Arc<Program>,
    frames: u64,
    sent: BTreeMap<u8, u64>,
    dropped: u64,
) -> Dump {
    let mut contexts: Vec<Context> = Vec::new();
    let mut counters = Counters::default();
    for p in &parts {
        let c = p.counters;
        counters.packets += c.packets;
        counters.table_full += c.table_full;
        counters.evicted += c.evicted;
        counters.expired += c.expired;
    }
    let now_us = parts.iter().map(|p| p.now_us).max().unwrap_or(0);
    let program = parts
        .first()
        .map_or(fallback.clone(), |p| p.program.clone());
    let globals = parts.first().map(|p| p.globals.clone()).unwrap_or_default();
    for p in parts {
        contexts.extend(p.contexts);
    }
    contexts.sort_by(|a, b| (a.stage, &a.key).cmp(&(b.stage, &b.key)));
    Dump {
        program: Some(program),
        contexts,
        globals,
        counters,
        now_us,
        frames,
        sent,
        dropped,
    }
}

/// A worker's engine counters as it goes.
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub frames: AtomicU64,
    pub table_full: AtomicU64,
    pub evicted: AtomicU64,
    pub expired: AtomicU64,
    /// Table replacements the worker took.
    pub swaps: AtomicU64,
    /// Contexts held, per stage.
    pub contexts: Vec<AtomicU64>,
}

/// A run's counters while it runs: per port number frames received and
/// sent, frames dropped, and each worker's [`WorkerStats`]. Read with
/// relaxed loads: each counter is exact, two read together may be a few
/// frames apart.
#[derive(Debug)]
pub struct LiveStats {
    pub received: Vec<AtomicU64>,
    pub sent: Vec<AtomicU64>,
    /// Frames the machine sent nowhere.
    pub dropped: AtomicU64,
    /// The same, per port number the frame came in on.
    pub dropped_from: Vec<AtomicU64>,
    /// Sends to a port number no port binds.
    pub unbound: AtomicU64,
    /// Frames a port refused, or took and then lost to a full send queue.
    pub not_sent: AtomicU64,
    /// Frames the input ports dropped on the way in (a kernel ring full),
    /// as they last reported them.
    pub rx_drops: AtomicU64,
    pub unparsed: AtomicU64,
    pub workers: Vec<WorkerStats>,
}

impl LiveStats {
    fn new(workers: usize, stages: usize) -> LiveStats {
        let counters = |n: usize| (0..n).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        LiveStats {
            received: counters(MAX_PORTS),
            sent: counters(MAX_PORTS),
            dropped: AtomicU64::new(0),
            dropped_from: counters(MAX_PORTS),
            unbound: AtomicU64::new(0),
            not_sent: AtomicU64::new(0),
            rx_drops: AtomicU64::new(0),
            unparsed: AtomicU64::new(0),
            workers: (0..workers)
                .map(|_| WorkerStats {
                    contexts: counters(stages),
                    ..WorkerStats::default()
                })
                .collect(),
        }
    }

    /// A worker's counter summed over the workers.
    pub fn workers_sum(&self, f: impl Fn(&WorkerStats) -> &AtomicU64) -> u64 {
        self.workers
            .iter()
            .map(|w| f(w).load(Ordering::Relaxed))
            .sum()
    }

    /// Contexts held in `stage`, over the workers.
    pub fn contexts(&self, stage: usize) -> u64 {
        self.workers
            .iter()
            .filter_map(|w| w.contexts.get(stage))
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// Where a dump taken while running goes.
pub type DumpSink = Box<dyn Fn(&Dump) + Send>;

/// What a run did, and the state it left.
#[derive(Debug, Default)]
pub struct Summary {
    /// Frames received per port number.
    pub received: BTreeMap<u8, u64>,
    /// Frames sent per port number.
    pub sent: BTreeMap<u8, u64>,
    /// Frames the machine sent nowhere.
    pub dropped: u64,
    /// Sends to a port number no `--port` binds.
    pub unbound: BTreeMap<u8, u64>,
    /// Frames a port refused, or took and then lost to a full send queue.
    pub not_sent: u64,
    /// Frames the input ports dropped on the way in.
    pub rx_drops: u64,
    /// Frames the `packet` unit did not parse (their unit fields read 0).
    pub unparsed: u64,
    /// Frames each worker handled (not in the dump).
    pub worker_frames: Vec<u64>,
    /// Table replacements a worker refused, and why.
    pub refused_swaps: Vec<String>,
    pub dump: Dump,
}

impl Summary {
    /// One line for standard error.
    pub fn line(&self) -> String {
        let rx: u64 = self.received.values().sum();
        let out: Vec<String> = self
            .sent
            .iter()
            .map(|(p, n)| format!("port {p} {n}"))
            .collect();
        let out = if out.is_empty() {
            "none".into()
        } else {
            out.join(", ")
        };
        let mut line = format!(
            "flick: {rx} frames in; out: {out}; dropped by the machine {}; contexts {}",
            self.dropped,
            self.dump.contexts.len()
        );
        let unbound: u64 = self.unbound.values().sum();
        for (n, what) in [
            (self.rx_drops, "dropped by the ports on the way in"),
            (unbound, "sent to unbound ports"),
            (self.not_sent, "not sent (port errors or full send queues)"),
            (self.unparsed, "not parsed"),
            (
                self.dump.counters.table_full,
                "new contexts refused by full tables",
            ),
            (self.dump.counters.evicted, "contexts evicted"),
        ] {
            if n > 0 {
                line.push_str(&format!("; {what} {n}"));
            }
        }
        line
    }
}

/// Flow contexts and global registers at the end of a run, with the
/// engine's counters.
#[derive(Debug, Default)]
pub struct Dump {
    pub program: Option<Arc<Program>>,
    /// Sorted by stage, then key.
    pub contexts: Vec<Context>,
    pub globals: Vec<Value>,
    pub counters: Counters,
    /// The latest packet time, microseconds.
    pub now_us: u64,
    pub frames: u64,
    pub sent: BTreeMap<u8, u64>,
    pub dropped: u64,
}

impl Dump {
    /// The dump as JSON: keys sorted, contexts sorted by key; the same
    /// whatever the number of workers (unless tables filled, which
    /// depends on each worker's share).
    pub fn json(&self) -> String {
        let mut top = Map::new();
        let mut stages = Map::new();
        if let Some(p) = &self.program {
            let m = &p.machine;
            for (i, st) in m.stages.iter().enumerate() {
                let timeouts = Timeouts {
                    idle: st.idle_timeout_us,
                    hard: st.hard_timeout_us,
                };
                let list: Vec<Json> = self
                    .contexts
                    .iter()
                    .filter(|c| c.stage == i)
                    .map(|c| {
                        let mut key = Map::new();
                        for (f, v) in st.key.iter().zip(&c.key) {
                            key.insert(m.fields[*f as usize].name.clone(), (*v).into());
                        }
                        let mut regs = Map::new();
                        for (r, v) in st.flow_regs.iter().zip(&c.regs) {
                            regs.insert(r.name.clone(), (*v).into());
                        }
                        let meta = crate::flows::Meta {
                            used: true,
                            state: c.state,
                            created: c.created_us,
                            last: c.last_us,
                        };
                        let mut o = Map::new();
                        o.insert("key".into(), Json::Object(key));
                        o.insert("state".into(), st.states[c.state as usize].clone().into());
                        o.insert("registers".into(), Json::Object(regs));
                        o.insert("created_us".into(), c.created_us.into());
                        o.insert("last_us".into(), c.last_us.into());
                        o.insert(
                            "expired".into(),
                            timeouts.expiry(&meta, self.now_us).is_some().into(),
                        );
                        Json::Object(o)
                    })
                    .collect();
                stages.insert(st.name.clone(), Json::Array(list));
            }
            let mut globals = Map::new();
            for (g, v) in m.globals.iter().zip(&self.globals) {
                globals.insert(g.name.clone(), (*v).into());
            }
            top.insert("globals".into(), Json::Object(globals));
        }
        top.insert("stages".into(), Json::Object(stages));
        let mut sent = Map::new();
        for (p, n) in &self.sent {
            sent.insert(p.to_string(), (*n).into());
        }
        top.insert("frames".into(), self.frames.into());
        top.insert("sent".into(), Json::Object(sent));
        top.insert("dropped".into(), self.dropped.into());
        top.insert("table_full".into(), self.counters.table_full.into());
        top.insert("evicted".into(), self.counters.evicted.into());
        top.insert("expired".into(), self.counters.expired.into());
        let mut s = serde_json::to_string_pretty(&Json::Object(top)).unwrap_or_default();
        s.push('\n');
        s
    }
}

/// The sending end of [`MachineService::run`]'s `swaps`.
pub type SwapSender = Sender<Arc<Program>>;

/// A channel for [`MachineService::run`]'s `swaps`: unbounded, since swaps
/// are rare and whoever asks for one must not wait on the frames.
pub fn swap_channel() -> (SwapSender, Receiver<Arc<Program>>) {
    crossbeam_channel::unbounded()
}

/// A machine ready to serve.
pub struct MachineService {
    program: Arc<Program>,
    workers: usize,
    stats: Arc<LiveStats>,
    dump: Option<(Arc<AtomicBool>, DumpSink)>,
    control: Option<Receiver<(ControlOp, Sender<bool>)>>,
}

impl MachineService {
    /// Checks the program's fields against the `packet` grammar.
    pub fn new(program: Arc<Program>, workers: usize) -> Result<MachineService, RunError> {
        FieldReader::new(&program.machine.fields)?;
        let one = program.machine.single_worker();
        let workers = if one { 1 } else { workers.max(1) };
        Ok(MachineService {
            stats: Arc::new(LiveStats::new(workers, program.machine.stages.len())),
            workers,
            program,
            dump: None,
            control: None,
        })
    }

    /// A control queue the run will serve: writes to its registers and
    /// flow contexts, applied between frames.
    pub fn control(&mut self) -> MachineControl {
        let (queue, rx) = bounded(CONTROL_QUEUE);
        self.control = Some(rx);
        MachineControl {
            queue,
            workers: self.workers,
        }
    }

    /// The run's counters as it goes.
    pub fn stats(&self) -> Arc<LiveStats> {
        self.stats.clone()
    }

    /// Whenever `request` is set, the run takes a dump between two frames,
    /// hands it to `sink` and clears `request`, without stopping.
    pub fn dump_on(&mut self, request: Arc<AtomicBool>, sink: DumpSink) {
        self.dump = Some((request, sink));
    }

    /// Workers that will run (one where the program needs it).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Serves until every input file ends, or `stop` is set. Programs
    /// sent on `swaps` replace the running tables between frames.
    pub fn run(
        &self,
        inputs: Vec<InPort>,
        outputs: Vec<OutPort>,
        stop: &AtomicBool,
        swaps: Option<Receiver<Arc<Program>>>,
    ) -> Result<Summary, RunError> {
        for n in inputs
            .iter()
            .map(|p| p.number)
            .chain(outputs.iter().map(|p| p.number))
        {
            if n == 0 || n as usize >= MAX_PORTS {
                return Err(RunError::PortNumber(n));
            }
        }
        let (free_tx, free_rx) = bounded::<Job>(POOL);
        let nfields = self.program.machine.fields.len();
        for _ in 0..POOL {
            let _ = free_tx.send(Job {
                seq: 0,
                ts: 0,
                port: 0,
                ports: 0,
                buf: Vec::with_capacity(FRAME_BUFFER),
                fields: vec![0; nfields],
            });
        }
        let (done_tx, done_rx) = bounded::<Job>(POOL);
        let mut queues = Vec::new();
        let mut workers = Vec::new();
        for w in 0..self.workers {
            let (tx, rx) = bounded::<Msg>(QUEUE);
            queues.push(tx);
            let done = done_tx.clone();
            let program = self.program.clone();
            let stats = self.stats.clone();
            let h = std::thread::Builder::new()
                .name(format!("flick-machine-{w}"))
                .spawn(move || work(program, rx, done, &stats.workers[w]))
                .map_err(|e| RunError::Spawn("worker", e))?;
            workers.push(h);
        }
        drop(done_tx);
        let mut tx_ports: Vec<Option<OutPort>> = (0..MAX_PORTS).map(|_| None).collect();
        for p in outputs {
            let n = p.number as usize;
            tx_ports[n] = Some(p);
        }
        let stats = self.stats.clone();
        let writer = std::thread::Builder::new()
            .name("flick-machine-writer".into())
            .spawn(move || write(tx_ports, done_rx, free_tx, &stats))
            .map_err(|e| RunError::Spawn("writer", e))?;
        let mut d = Dispatch {
            reader: FieldReader::new(&self.program.machine.fields)?,
            program: self.program.clone(),
            queues,
            seq: 0,
            unparsed: 0,
            received: BTreeMap::new(),
            refused: Vec::new(),
            stats: self.stats.clone(),
            dump: self.dump.as_ref(),
            control: self.control.as_ref(),
        };
        let read = d.read_all(inputs, &free_rx, stop, swaps.as_ref());
        let Dispatch {
            queues,
            unparsed,
            received,
            refused: refused_here,
            ..
        } = d;
        drop(queues);
        let mut engines = Vec::new();
        let mut refused = refused_here;
        let mut panicked = false;
        for h in workers {
            match h.join() {
                Ok((e, r)) => {
                    engines.push(e);
                    refused.extend(r);
                }
                Err(_) => panicked = true,
            }
        }
        let written = writer.join();
        if panicked {
            return Err(RunError::Panicked("worker"));
        }
        let (sent, unbound, dropped, write_error) =
            written.map_err(|_| RunError::Panicked("writer"))?;
        let not_sent = self.stats.not_sent.load(Ordering::Relaxed);
        let rx_drops = self.stats.rx_drops.load(Ordering::Relaxed);
        read?;
        if let Some(e) = write_error {
            return Err(e);
        }
        let frames = received.values().sum();
        let worker_frames = engines.iter().map(|e| e.counters().packets).collect();
        let parts = engines.iter().map(WorkerDump::of).collect();
        Ok(Summary {
            received,
            sent: sent.clone(),
            dropped,
            unbound,
            not_sent,
            rx_drops,
            unparsed,
            worker_frames,
            refused_swaps: refused,
            dump: assemble(parts, &self.program, frames, sent, dropped),
        })
    }
}

/// `setField`: `value` big-endian into `len` bytes at `at`, the IPv4 and
/// TCP/UDP checksums that cover them kept right (a write to a checksum
/// itself stays as written).
fn set_field(frame: &mut [u8], at: usize, len: usize, value: Value) {
    // Zeros above the value's eight bytes; no header field is wider.
    let mut bytes = [0u8; 64];
    if len > bytes.len() {
        write_field(frame, at, len, value);
        return;
    }
    write_field(&mut bytes[..len], 0, len, value);
    flick_packet::rewrite::write_keeping_checksums(frame, at, &bytes[..len]);
}

impl crate::engine::BatchFrame for Job {
    fn fields(&self) -> &[Value] {
        &self.fields
    }
    fn port(&self) -> u8 {
        self.port
    }
    fn bytes(&self) -> usize {
        self.buf.len()
    }
    fn ts_ns(&self) -> u64 {
        self.ts
    }
}

/// A worker: takes the frames queued to it (up to a batch, without
/// waiting for more) and runs them through its engine as one batch, in
/// order; a swap or a dump waits for the frames queued before it.
fn work(
    program: Arc<Program>,
    rx: Receiver<Msg>,
    done: Sender<Job>,
    stats: &WorkerStats,
) -> (Engine, Vec<String>) {
    let mut engine = Engine::new(program);
    let mut refused = Vec::new();
    let mut batch: Vec<Job> = Vec::with_capacity(ENGINE_BATCH);
    let mut next = rx.recv().ok();
    while let Some(msg) = next.take() {
        match msg {
            Msg::Frame(job) => {
                batch.push(job);
                // Frames already queued join the batch; anything else ends it.
                while batch.len() < ENGINE_BATCH {
                    match rx.try_recv() {
                        Ok(Msg::Frame(job)) => batch.push(job),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let mut verdicts = [Verdict::default(); ENGINE_BATCH];
                engine.process_batch(&batch, |i, v| verdicts[i] = *v);
                publish(&engine, stats);
                let fields = &engine.program().machine.fields;
                for (mut job, v) in batch.drain(..).zip(verdicts) {
                    for &(f, value) in v.writes() {
                        if let Some((at, len)) = write_place(&fields[f as usize].source) {
                            set_field(&mut job.buf, at, len, value);
                        }
                    }
                    job.ports = v.ports;
                    if done.send(job).is_err() {
                        return (engine, refused);
                    }
                }
            }
            Msg::Swap(p) => match engine.replace(p) {
                Ok(()) => {
                    stats.swaps.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => refused.push(e.to_string()),
            },
            Msg::Dump(reply) => {
                let _ = reply.send(WorkerDump::of(&engine));
            }
            Msg::Control(request) => {
                let (op, reply) = *request;
                let held = match op {
                    ControlOp::Global { reg, value } => engine.set_global(reg as usize, value),
                    ControlOp::Flow {
                        stage,
                        key,
                        len,
                        edit,
                    } => engine.edit_flow(stage as usize, &key[..len as usize], edit),
                };
                publish(&engine, stats);
                let _ = reply.send(held);
            }
        }
        if next.is_none() {
            next = rx.recv().ok();
        }
    }
    (engine, refused)
}

/// The engine's counters into the worker's live ones: plain stores to
/// counters only this worker writes.
fn publish(engine: &Engine, stats: &WorkerStats) {
    let c = engine.counters();
    stats.frames.store(c.packets, Ordering::Relaxed);
    stats.table_full.store(c.table_full, Ordering::Relaxed);
    stats.evicted.store(c.evicted, Ordering::Relaxed);
    stats.expired.store(c.expired, Ordering::Relaxed);
    for (s, n) in stats.contexts.iter().enumerate() {
        n.store(engine.live_contexts(s) as u64, Ordering::Relaxed);
    }
}

type Written = (BTreeMap<u8, u64>, BTreeMap<u8, u64>, u64, Option<RunError>);

fn write(
    mut ports: Vec<Option<OutPort>>,
    done: Receiver<Job>,
    free: Sender<Job>,
    stats: &LiveStats,
) -> Written {
    let mut ring: Vec<Option<Job>> = (0..POOL).map(|_| None).collect();
    let mut next = 0u64;
    let mut sent = BTreeMap::new();
    let mut unbound = BTreeMap::new();
    let mut dropped = 0;
    let mut error = None;
    let mut unflushed = false;
    // Per port, the drops it had reported at the last flush.
    let mut lost = vec![0u64; ports.len()];
    loop {
        // Live ports hold frames until flushed: flush whenever the queue
        // runs dry, so a frame waits for no later one.
        let job = match done.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                if unflushed {
                    unflushed = false;
                    flush_all(&mut ports, &mut error, &mut lost, stats);
                }
                match done.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            }
        };
        let at = job.seq as usize % POOL;
        ring[at] = Some(job);
        while let Some(job) = ring[next as usize % POOL].take() {
            next += 1;
            if job.ports == 0 {
                dropped += 1;
                stats.dropped.fetch_add(1, Ordering::Relaxed);
                stats.dropped_from[job.port as usize % MAX_PORTS].fetch_add(1, Ordering::Relaxed);
            }
            let mut bits = job.ports;
            while bits != 0 {
                let n = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                match &mut ports[n] {
                    Some(p) => match p.tx.send(&job.buf, job.ts) {
                        Ok(()) => {
                            unflushed = true;
                            stats.sent[n].fetch_add(1, Ordering::Relaxed);
                            *sent.entry(n as u8).or_insert(0) += 1
                        }
                        Err(e) if e.is_frame_error() => not_sent(stats, 1, &e),
                        Err(e) => {
                            error.get_or_insert(RunError::Port {
                                number: n as u8,
                                spec: p.spec.clone(),
                                source: e,
                            });
                        }
                    },
                    None => {
                        stats.unbound.fetch_add(1, Ordering::Relaxed);
                        *unbound.entry(n as u8).or_insert(0) += 1
                    }
                }
            }
            let _ = free.send(job);
        }
    }
    flush_all(&mut ports, &mut error, &mut lost, stats);
    (sent, unbound, dropped, error)
}

/// Flushes every port; frames a port took and then lost for want of room
/// (its stats' drops) are counted as not sent and logged.
fn flush_all(
    ports: &mut [Option<OutPort>],
    error: &mut Option<RunError>,
    lost: &mut [u64],
    stats: &LiveStats,
) {
    for (p, lost) in ports
        .iter_mut()
        .zip(lost)
        .filter_map(|(p, l)| Some((p.as_mut()?, l)))
    {
        if let Err(e) = p.tx.flush() {
            error.get_or_insert(RunError::Port {
                number: p.number,
                spec: p.spec.clone(),
                source: e,
            });
        }
        let drops = p.tx.stats().drops;
        if drops > *lost {
            not_sent(stats, drops - *lost, &"the port's send queue was full");
            *lost = drops;
        }
    }
}

/// Counts `n` frames not sent, and says why in the log: the first time and
/// then at each power of two, so a port that keeps failing does not flood
/// it.
fn not_sent(stats: &LiveStats, n: u64, why: &dyn std::fmt::Display) {
    let before = stats.not_sent.fetch_add(n, Ordering::Relaxed);
    let after = before + n;
    if before == 0 || (before + 1).ilog2() != (after + 1).ilog2() {
        tracing::warn!(not_sent = after, "frames not sent: {why}");
    }
}

struct Dispatch<'a> {
    reader: FieldReader,
    program: Arc<Program>,
    queues: Vec<Sender<Msg>>,
    seq: u64,
    unparsed: u64,
    received: BTreeMap<u8, u64>,
    /// Swaps refused before they reached the workers.
    refused: Vec<String>,
    stats: Arc<LiveStats>,
    dump: Option<&'a (Arc<AtomicBool>, DumpSink)>,
    control: Option<&'a Receiver<(ControlOp, Sender<bool>)>>,
}

impl Dispatch<'_> {
    /// Takes a dump if one was asked for: each worker answers once it has
    /// run the frames queued to it before.
    fn dump_if_asked(&mut self) {
        let Some((request, sink)) = self.dump else {
            return;
        };
        if !request.swap(false, Ordering::Relaxed) {
            return;
        }
        let mut replies = Vec::new();
        for q in &self.queues {
            let (tx, rx) = bounded(1);
            if q.send(Msg::Dump(tx)).is_ok() {
                replies.push(rx);
            }
        }
        let parts: Vec<WorkerDump> = replies.iter().filter_map(|r| r.recv().ok()).collect();
        let frames = parts.iter().map(|p| p.counters.packets).sum();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let sent = (0..MAX_PORTS)
            .filter(|&n| load(&self.stats.sent[n]) > 0)
            .map(|n| (n as u8, load(&self.stats.sent[n])))
            .collect();
        let dropped = load(&self.stats.dropped);
        sink(&assemble(parts, &self.program, frames, sent, dropped));
    }

    /// Hands the control writes queued to every worker, behind the frames
    /// already sent to it. An empty queue answers without locking.
    fn controls(&mut self) {
        let Some(rx) = self.control else { return };
        while let Ok((op, reply)) = rx.try_recv() {
            for q in &self.queues {
                let _ = q.send(Msg::Control(Box::new((op, reply.clone()))));
            }
        }
    }

    fn swaps(&mut self, swaps: Option<&Receiver<Arc<Program>>>) -> Result<(), RunError> {
        let Some(rx) = swaps else { return Ok(()) };
        while let Ok(p) = rx.try_recv() {
            if p.machine.single_worker() && self.queues.len() > 1 {
                self.refused.push(
                    "the new program needs one worker (several stages with flow keys, or global registers written), and this run has several".into(),
                );
                continue;
            }
            self.reader = FieldReader::new(&p.machine.fields)?;
            for q in &self.queues {
                let _ = q.send(Msg::Swap(p.clone()));
            }
            self.program = p;
        }
        Ok(())
    }

    /// Numbers, parses and steers a job holding a frame.
    fn dispatch(&mut self, mut job: Job) {
        job.seq = self.seq;
        self.seq += 1;
        *self.received.entry(job.port).or_insert(0) += 1;
        self.stats.received[job.port as usize % MAX_PORTS].fetch_add(1, Ordering::Relaxed);
        let n = self.program.machine.fields.len();
        if job.fields.len() != n {
            job.fields.resize(n, 0);
        }
        if !self.reader.read(&job.buf, &mut job.fields) {
            self.unparsed += 1;
            self.stats.unparsed.fetch_add(1, Ordering::Relaxed);
        }
        let steering = self.program.machine.steering_stage();
        let w = if self.queues.len() > 1 && steering.is_none() {
            // No stage keeps contexts: any worker will do.
            (job.seq % self.queues.len() as u64) as usize
        } else if let (true, Some(s)) = (self.queues.len() > 1, steering) {
            let stage = &self.program.machine.stages[s];
            let mut key = [0 as Value; MAX_KEY];
            let k = stage.key.len();
            for (v, &f) in key.iter_mut().zip(&stage.key) {
                *v = job.fields[f as usize];
            }
            if stage.biflow && key[k / 2..k] < key[..k / 2] {
                for i in 0..k / 2 {
                    key.swap(i, k / 2 + i);
                }
            }
            (hash_key(&key[..k], STEER_SEED) % self.queues.len() as u64) as usize
        } else {
            0
        };
        let _ = self.queues[w].send(Msg::Frame(job));
    }

    /// The input ports' own drop counts, summed, published.
    fn read_port_drops(&self, inputs: &[InPort]) {
        let drops: u64 = inputs.iter().map(|p| p.rx.stats().drops).sum();
        let before = self.stats.rx_drops.swap(drops, Ordering::Relaxed);
        if drops > before {
            tracing::warn!(
                rx_drops = drops,
                "{} frames dropped by the input ports on the way in: their rings were full",
                drops - before
            );
        }
    }

    fn read_all(
        &mut self,
        mut inputs: Vec<InPort>,
        free: &Receiver<Job>,
        stop: &AtomicBool,
        swaps: Option<&Receiver<Arc<Program>>>,
    ) -> Result<(), RunError> {
        let port_error = |p: &InPort, e| RunError::Port {
            number: p.number,
            spec: p.spec.clone(),
            source: e,
        };
        if inputs.iter().any(|p| p.live) {
            let mut ended = vec![false; inputs.len()];
            let mut spare: Option<Job> = None;
            // The ports' own drops cost a system call to read: read a few
            // times a second, and at the end.
            let mut drops_due = std::time::Instant::now();
            while !stop.load(Ordering::Relaxed) && ended.iter().any(|e| !e) {
                self.swaps(swaps)?;
                self.controls();
                self.dump_if_asked();
                if std::time::Instant::now() >= drops_due {
                    self.read_port_drops(&inputs);
                    drops_due = std::time::Instant::now() + PORT_DROPS_EVERY;
                }
                let mut idle = true;
                for (i, p) in inputs.iter_mut().enumerate() {
                    if ended[i] {
                        continue;
                    }
                    let number = p.number;
                    // A live port is read no further than there are free
                    // jobs (only this thread takes them, so no fewer come
                    // during the read): its other frames wait in its ring.
                    let max = if p.live {
                        let free_jobs = free.len() + usize::from(spare.is_some());
                        if free_jobs == 0 {
                            spare = free.recv_timeout(FREE_JOB_WAIT).ok();
                            idle = false;
                            continue;
                        }
                        BATCH.min(free_jobs)
                    } else {
                        BATCH
                    };
                    let status = p.rx.recv_batch(max, &mut |frame, ts| {
                        let Some(mut job) = spare.take().or_else(|| free.recv().ok()) else {
                            return;
                        };
                        job.buf.clear();
                        job.buf.extend_from_slice(frame);
                        job.ts = ts;
                        job.port = number;
                        self.dispatch(job);
                    });
                    match status {
                        Ok(RecvStatus::Frames(_)) => idle = false,
                        Ok(RecvStatus::Idle) => {}
                        Ok(RecvStatus::End) => ended[i] = true,
                        Err(e) if e.is_frame_error() => {}
                        Err(e) => return Err(port_error(p, e)),
                    }
                }
                if idle {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            self.read_port_drops(&inputs);
            return Ok(());
        }
        // Files: one frame ahead per file, the earliest dispatched first.
        let mut pending: Vec<Option<Job>> = (0..inputs.len()).map(|_| None).collect();
        let mut ended = vec![false; inputs.len()];
        let mut spare: Option<Job> = None;
        loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            self.swaps(swaps)?;
            self.controls();
            self.dump_if_asked();
            for (i, p) in inputs.iter_mut().enumerate() {
                while pending[i].is_none() && !ended[i] {
                    let mut job = match spare.take() {
                        Some(j) => j,
                        None => match free.recv() {
                            Ok(j) => j,
                            Err(_) => return Err(RunError::Panicked("writer")),
                        },
                    };
                    let mut got = false;
                    let status = p.rx.recv_batch(1, &mut |frame, ts| {
                        job.buf.clear();
                        job.buf.extend_from_slice(frame);
                        job.ts = ts;
                        got = true;
                    });
                    match status {
                        Ok(RecvStatus::End) => ended[i] = true,
                        Ok(_) => {}
                        Err(e) if e.is_frame_error() => {}
                        Err(e) => return Err(port_error(p, e)),
                    }
                    if got {
                        job.port = p.number;
                        pending[i] = Some(job);
                    } else {
                        spare = Some(job);
                        // A file has nothing now only at its end.
                        ended[i] = true;
                    }
                }
            }
            let first = pending
                .iter()
                .enumerate()
                .filter_map(|(i, j)| j.as_ref().map(|j| ((j.ts, inputs[i].number), i)))
                .min();
            let Some((_, i)) = first else { break };
            if let Some(job) = pending[i].take() {
                self.dispatch(job);
            }
        }
        Ok(())
    }
}
