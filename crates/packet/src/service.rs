//! A packet program served over ports: one dispatcher (the calling
//! thread), `workers` worker threads and one writer thread. Frames cross
//! threads in batches ([`Batch`], up to [`BATCH_FRAMES`] frames in one
//! buffer), made once at start and recycled whole, so a channel operation
//! is paid per batch and nothing is allocated per frame or per batch.
//!
//! 1. The dispatcher reads each receiving port in turn, a batch at a time.
//!    If the program has `steer`, it parses each frame with the grammar
//!    unit of the port's channel (a frame that does not parse is dropped
//!    and counted as malformed), runs `steer` on it and hashes the result
//!    to pick a worker; without `steer` every frame goes to worker 0, as
//!    it does with one worker where `steer` cannot fault (`pure_steer.rs`).
//!    Where the worker is named by a flow key's header fields instead (the
//!    common key of programs sharing the port, or, with several workers,
//!    the library key a `steer` that cannot fault returns as it is), the
//!    dispatcher hashes those fields and neither parses nor runs `steer`. The
//!    frame is numbered in reading order and copied into the batch the
//!    dispatcher is filling for that worker. A batch goes to its worker's
//!    queue when it is full and when a port's `recv_batch` call ends, so a
//!    live port's lone frame is not held back. With no free batch a file's
//!    frames wait (no loss, after sending what the dispatcher holds, so
//!    that the batches it waits for can come back). A live port is read
//!    only while every worker has a batch with room for a whole read:
//!    until then its frames wait in the port's own ring (the kernel's,
//!    which counts what it drops when full), so a service that falls
//!    behind for a moment loses nothing, and a trickle of frames, each
//!    sent in a batch of its own, cannot use up the batches. A live
//!    port's batch that finds its worker's queue full is kept and sent
//!    later; a frame larger than the room kept for it that finds no batch
//!    is dropped and counted.
//! 2. A worker parses each frame of a batch (again) in place, counting it
//!    as malformed if it does not parse, runs the channel's rule on its
//!    own interpreter against its own state shard, notes in the batch the
//!    ports the rule sent the frame to, and passes the batch on to the
//!    writer.
//! 3. The writer puts frames back in reading order: each worker's batches
//!    arrive in increasing order of their frames' numbers, and every
//!    number was given to a frame of some batch, so the next frame to
//!    write is at the head of one worker's oldest pending batch (a k-way
//!    merge). It writes each to its ports with its input timestamp and
//!    returns a batch to the free pool once all its frames are written.
//!    When the program writes no port, the workers return their batches
//!    to the free pool themselves and the writer has nothing to do.
//!
//! Output files are therefore the same whatever the number of workers.
//!
//! State written from outside while running ([`StateControl`], an API's
//! writes) reaches each worker on a bounded queue of its own, which it
//! drains between batches: the frame path takes no lock for it.

use crate::host::{Edits, FieldTable, FrameHost, Sends, FRAME};
use crate::rewrite;
use crate::state::{self, Shard};
use crate::stats::{set, LiveStats};
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use flick_exec::{FuncId, Module, Outcome, TablePolicy, Value, Vm};
use flick_packet_io::{Port, PortError, RecvStatus, RxPort, TxPort};
use flick_platform::log::RateLimit;
use flick_platform::Loaded;
use flick_runtime::Timeslice;
use flick_wire::{Grammar, Parser, Progress, UnitId};
use serde_json::{Map, Value as Json};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How a packet program is served.
#[derive(Clone, Debug)]
pub struct PacketConfig {
    /// Worker threads, each with its own state shard.
    pub workers: usize,
    /// Entries of each dictionary, per shard.
    pub dict_capacity: usize,
    /// Frames queued to a worker before the dispatcher waits (or drops),
    /// in whole batches of [`BATCH_FRAMES`] (at least one).
    pub queue_capacity: usize,
    /// Frames in flight: rounded up to whole batches of [`BATCH_FRAMES`],
    /// at least two per worker and one more.
    pub buffers: usize,
    /// Set (by SIGUSR1, say) to have the state dumped while running; the
    /// engine clears it once the dump is written.
    pub dump_request: Option<Arc<AtomicBool>>,
    /// Where dumps go.
    pub dump_path: Option<std::path::PathBuf>,
    /// Counters published while running (for `--metrics`).
    pub stats: Option<Arc<LiveStats>>,
    /// Steer by this flow key instead of the program's `steer`: the
    /// common key of the programs run beside it on the same frames
    /// (`steering.rs`), so a frame goes to the same worker index for
    /// each. It must lie within the program's own key, and the frames
    /// be Ethernet.
    pub steer_by: Option<crate::steering::FlowKey>,
    /// Writes of `global` state while running (an API's).
    pub control: Option<Arc<StateControl>>,
}

impl Default for PacketConfig {
    fn default() -> PacketConfig {
        PacketConfig {
            workers: 1,
            dict_capacity: 1024,
            queue_capacity: 1024,
            buffers: 4096,
            dump_request: None,
            dump_path: None,
            stats: None,
            steer_by: None,
            control: None,
        }
    }
}

/// One opened port bound to a channel (or an element of a channel array).
pub struct BoundPort {
    /// The spec as written, for messages (`pcap:in.pcap`).
    pub spec: String,
    pub port: Port,
    /// A live port (an interface): frames that find no room are dropped
    /// and counted rather than waited for.
    pub live: bool,
}

/// A channel's ports: one, or one per element of a channel array.
pub struct Binding {
    pub channel: String,
    pub ports: Vec<BoundPort>,
}

/// What a port can do, for checking bindings before ports are opened.
#[derive(Clone, Debug)]
pub struct PortUse {
    pub spec: String,
    pub rx: bool,
    pub tx: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}", .0.join("\n"))]
    Bindings(Vec<String>),
    #[error("channel `{0}` carries no record of the grammar, so it cannot be bound to a port")]
    NoUnit(String),
    #[error(transparent)]
    Port(#[from] PortError),
    #[error("cannot write the dump to {path}: {source}")]
    Dump {
        path: String,
        source: std::io::Error,
    },
    #[error("a {0} thread panicked")]
    Panicked(&'static str),
    #[error("cannot start a {0} thread: {1}")]
    Spawn(&'static str, std::io::Error),
}

/// Counters of one named port (`chan` or `chan[i]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortCounts {
    pub name: String,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Frames the port failed to send: refused, or taken and then lost
    /// to a full send queue.
    pub tx_errors: u64,
    /// Frames of a live port dropped for want of a buffer or queue room.
    pub rx_overflow: u64,
    /// Frames the port itself dropped on the way in: its kernel ring
    /// full while the service waited for room, or a shared port's queue.
    pub rx_drops: u64,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub ports: Vec<PortCounts>,
    /// Frames the program sent nowhere.
    pub dropped: u64,
    /// Frames that did not parse.
    pub malformed: u64,
    /// Frames whose rule (or `steer`) faulted.
    pub faults: u64,
    /// New dictionary keys refused because the dictionary was full.
    pub dict_full: u64,
    /// Every `global` by name, all shards merged.
    pub state: Map<String, Json>,
    /// Per flow table (a dictionary with `idle=` or `evict=`) by name:
    /// entries evicted and expired, all shards summed.
    pub tables: Map<String, Json>,
    /// Frames each worker handled (not in the dump, which is the same
    /// whatever the number of workers).
    pub worker_frames: Vec<u64>,
}

impl Summary {
    /// The dump: state, port counters and drop counts, keys sorted.
    pub fn dump_json(&self) -> String {
        let mut ports = Map::new();
        for p in &self.ports {
            let mut m = Map::new();
            for (k, v) in [
                ("rx_frames", p.rx_frames),
                ("rx_bytes", p.rx_bytes),
                ("tx_frames", p.tx_frames),
                ("tx_bytes", p.tx_bytes),
            ] {
                m.insert(k.into(), v.into());
            }
            // Losses only where there were some, so clean dumps keep
            // their shape.
            for (k, v) in [
                ("rx_drops", p.rx_drops),
                ("rx_overflow", p.rx_overflow),
                ("tx_errors", p.tx_errors),
            ] {
                if v > 0 {
                    m.insert(k.into(), v.into());
                }
            }
            ports.insert(p.name.clone(), Json::Object(m));
        }
        let mut top = Map::new();
        top.insert("globals".into(), Json::Object(self.state.clone()));
        top.insert("ports".into(), Json::Object(ports));
        top.insert("dropped".into(), self.dropped.into());
        top.insert("malformed".into(), self.malformed.into());
        top.insert("faults".into(), self.faults.into());
        top.insert("dict_full".into(), self.dict_full.into());
        // Only where the program has flow tables, so other dumps keep
        // their shape.
        if !self.tables.is_empty() {
            top.insert("tables".into(), Json::Object(self.tables.clone()));
        }
        let mut s = serde_json::to_string_pretty(&Json::Object(top)).unwrap_or_default();
        s.push('\n');
        s
    }

    /// One line for standard error at the end of a run.
    pub fn line(&self) -> String {
        let rx: u64 = self.ports.iter().map(|p| p.rx_frames).sum();
        let out: Vec<String> = self
            .ports
            .iter()
            .filter(|p| p.tx_frames > 0 || p.rx_frames == 0)
            .map(|p| format!("{} {}", p.name, p.tx_frames))
            .collect();
        let out = if out.is_empty() {
            "none".to_string()
        } else {
            out.join(", ")
        };
        let mut line = format!(
            "flick: {rx} frames in; out: {out}; dropped by the program {}; malformed {}; faults {}",
            self.dropped, self.malformed, self.faults
        );
        // What only some runs have, said only when it happened.
        let overflow: u64 = self.ports.iter().map(|p| p.rx_overflow).sum();
        let rx_drops: u64 = self.ports.iter().map(|p| p.rx_drops).sum();
        let tx_errors: u64 = self.ports.iter().map(|p| p.tx_errors).sum();
        for (n, what) in [
            (rx_drops, "dropped by the ports on the way in"),
            (overflow, "lost for want of room"),
            (tx_errors, "not sent (port errors or full send queues)"),
            (self.dict_full, "new keys refused by full dictionaries"),
        ] {
            if n > 0 {
                line.push_str(&format!("; {what} {n}"));
            }
        }
        line
    }
}

/// A loaded packet program, ready to run over ports.
pub struct PacketService {
    module: Arc<Module>,
    grammar: Arc<Grammar>,
    process: String,
    channels: Vec<String>,
    arrays: Vec<bool>,
    /// Per channel: whether a rule reads it and whether code names it
    /// (to send to it), which is what its port must be able to do; the
    /// channel's type may allow more.
    readable: Vec<bool>,
    writable: Vec<bool>,
    /// Per channel: the unit its frames are parsed with.
    units: Vec<Option<UnitId>>,
    /// Per channel: the rule run on its frames.
    rules: Vec<Option<FuncId>>,
    init: FuncId,
    steer: Option<FuncId>,
    /// The flow key the dispatcher hashes, with several workers, instead
    /// of running `steer`: [`PacketConfig::steer_by`], or else the
    /// library key `steer` returns as it is where it cannot fault
    /// ([`DeclaredKey::returned_by_steer`]): frames go to workers by the
    /// same flows, the state and outputs are the same, and the dispatcher
    /// neither parses a frame nor interprets anything for it.
    ///
    /// [`DeclaredKey::returned_by_steer`]: crate::steering::DeclaredKey::returned_by_steer
    steer_key: Option<crate::steering::FlowKey>,
    fields: Arc<FieldTable>,
    state_names: Vec<String>,
    /// Per state variable: the table policy its type declares.
    tables: Vec<TablePolicy>,
    source: Option<Arc<flick_span::SourceFile>>,
    config: PacketConfig,
}

static MALFORMED_LOG: RateLimit = RateLimit::new();
static FAULT_LOG: RateLimit = RateLimit::new();
static TX_LOG: RateLimit = RateLimit::new();
static RX_LOG: RateLimit = RateLimit::new();

impl PacketService {
    pub fn new(loaded: Loaded, config: PacketConfig) -> Result<PacketService, Error> {
        let module = loaded.module.clone();
        let code = &loaded.module.processes[loaded.process];
        let grammar = loaded.grammar.clone();
        for (c, name) in code.channels.iter().enumerate() {
            if loaded.units.get(c).copied().flatten().is_none() {
                return Err(Error::NoUnit(name.clone()));
            }
        }
        let rules = (0..code.channels.len())
            .map(|c| code.rule_for(c as u16))
            .collect();
        let fields: FieldTable = module
            .records
            .iter()
            .map(|(record, names)| {
                let unit = grammar.unit_id(record);
                names
                    .iter()
                    .map(|n| {
                        let u = unit?;
                        let info = grammar.unit(u).fields.iter().find(|f| &f.name == n)?;
                        let int = matches!(info.kind, flick_wire::FieldKind::Int);
                        Some((grammar.field_ref(u, n)?, int))
                    })
                    .collect()
            })
            .collect();
        let declared = crate::steering::DeclaredKey::returned_by_steer(&module);
        let (module, steer) = with_steer_hash(module);
        let fields = Arc::new(fields);
        let steer_key = config.steer_by.or_else(|| {
            let pure = steer.is_some_and(|f| crate::pure_steer::cannot_fault(&module, &fields, f));
            declared.filter(|_| pure)
        });
        flick_grammars::install();
        Ok(PacketService {
            process: code.name.clone(),
            channels: code.channels.clone(),
            state_names: code.state.iter().map(|(n, _)| n.clone()).collect(),
            tables: code.tables.clone(),
            init: code.init,
            arrays: loaded.arrays.clone(),
            readable: (0..code.channels.len())
                .map(|c| code.items.iter().any(|it| it.source == Some(c as u16)))
                .collect(),
            writable: (0..code.channels.len())
                .map(|c| writes(&module, c as u16))
                .collect(),
            units: loaded.units.to_vec(),
            rules,
            steer,
            steer_key,
            fields,
            source: loaded.source.clone(),
            module,
            grammar,
            config,
        })
    }

    /// The process's channels, in order.
    pub fn channels(&self) -> &[String] {
        &self.channels
    }

    /// Whether the program steers frames to workers by flow.
    pub fn steers(&self) -> bool {
        self.steer.is_some()
    }

    /// Whether the dispatcher runs `steer` on each frame with this many
    /// workers: not without `steer`, nor with one worker where `steer`
    /// cannot fault, since every frame then goes to that worker anyway,
    /// nor with several where it hashes a flow key's fields instead
    /// (see `steer_key`).
    pub fn steers_in_dispatcher(&self, workers: usize) -> bool {
        self.dispatch_steer(workers).is_some()
    }

    /// Whether, with this many workers, the dispatcher picks each frame's
    /// worker by a hash of a flow key's header fields, parsing nothing.
    pub fn steers_by_key(&self, workers: usize) -> bool {
        workers > 1 && self.steer_key.is_some()
    }

    fn dispatch_steer(&self, workers: usize) -> Option<FuncId> {
        if self.steers_by_key(workers) {
            return None;
        }
        self.steer.filter(|&f| {
            workers > 1 || !crate::pure_steer::cannot_fault(&self.module, &self.fields, f)
        })
    }

    /// Every problem with binding these ports to the process's channels:
    /// unknown names, unbound channels, a read channel without a receiving
    /// port, a written one without a transmitting port, an array's width.
    pub fn check_bindings(&self, bindings: &[(String, Vec<PortUse>)]) -> Result<(), Error> {
        let mut errors = Vec::new();
        let process = &self.process;
        let list = self.channels.join(", ");
        for (i, (name, ports)) in bindings.iter().enumerate() {
            if bindings[..i].iter().any(|(n, _)| n == name) {
                errors.push(format!(
                    "--port: channel `{name}` is bound twice; give an array's ports as one comma-separated list"
                ));
                continue;
            }
            let Some(c) = self.channels.iter().position(|n| n == name) else {
                errors.push(format!(
                    "--port: `{name}` is not a channel of process `{process}` (its channels: {list})"
                ));
                continue;
            };
            if !self.arrays[c] && ports.len() != 1 {
                errors.push(format!(
                    "--port: `{name}` is a single channel; bind it to one port, not {}",
                    ports.len()
                ));
            }
            for p in ports {
                if self.readable[c] && !p.rx {
                    errors.push(format!(
                        "channel `{name}` is read by the program, but port `{}` cannot receive",
                        p.spec
                    ));
                }
                if self.writable[c] && !p.tx {
                    errors.push(format!(
                        "channel `{name}` is written by the program, but port `{}` cannot transmit",
                        p.spec
                    ));
                }
            }
        }
        for c in &self.channels {
            if !bindings.iter().any(|(n, _)| n == c) {
                errors.push(format!(
                    "channel `{c}` has no port: give it --port {c}=SPEC"
                ));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Bindings(errors))
        }
    }

    /// Serves frames from the bound ports until every receiving port has
    /// ended (files) or `stop` is set (live ports), then flushes the
    /// transmitting ports, writes the dump if asked for and says what
    /// happened.
    pub fn run(&self, bindings: Vec<Binding>, stop: &AtomicBool) -> Result<Summary, Error> {
        let uses: Vec<(String, Vec<PortUse>)> = bindings
            .iter()
            .map(|b| {
                let uses = b
                    .ports
                    .iter()
                    .map(|p| PortUse {
                        spec: p.spec.clone(),
                        rx: p.port.rx.is_some(),
                        tx: p.port.tx.is_some(),
                    })
                    .collect();
                (b.channel.clone(), uses)
            })
            .collect();
        self.check_bindings(&uses)?;
        let mut counts = Vec::new();
        let mut sources = Vec::new();
        let mut sinks: Vec<(usize, Box<dyn TxPort>)> = Vec::new();
        let mut tx_of: Vec<Vec<Option<u16>>> = vec![Vec::new(); self.channels.len()];
        for b in bindings {
            let c = self
                .channels
                .iter()
                .position(|n| *n == b.channel)
                .unwrap_or_default();
            let array = self.arrays[c];
            for (elem, p) in b.ports.into_iter().enumerate() {
                let name = if array {
                    format!("{}[{elem}]", b.channel)
                } else {
                    b.channel.clone()
                };
                let index = counts.len();
                counts.push(PortCounts {
                    name,
                    ..PortCounts::default()
                });
                if let (Some(rx), true) = (p.port.rx, self.readable[c]) {
                    sources.push(Source {
                        rx,
                        chan: c as u16,
                        counts: index,
                        live: p.live,
                        ended: false,
                    });
                }
                let tx = match p.port.tx {
                    Some(tx) => {
                        sinks.push((index, tx));
                        Some(sinks.len() as u16 - 1)
                    }
                    None => None,
                };
                tx_of[c].push(tx);
            }
        }
        let tx_of = Arc::new(tx_of);
        let workers = self.config.workers.max(1);
        let stats = self.config.stats.clone().unwrap_or_default();
        stats.start(counts.iter().map(|c| c.name.clone()).collect(), workers);
        // Enough batches that each worker can have one filling, one queued
        // and the writer one, and the queues never hold more than there are.
        let batches = self
            .config
            .buffers
            .div_ceil(BATCH_FRAMES)
            .max(workers * 2 + 1);
        let queue_batches = self
            .config
            .queue_capacity
            .div_ceil(BATCH_FRAMES)
            .clamp(1, batches);
        let (done_tx, done_rx) = bounded::<Batch>(batches);
        let (free_tx, free_rx) = bounded::<Batch>(batches);
        for _ in 0..batches {
            let _ = free_tx.send(Batch::new());
        }
        // A program that writes no port needs no order: its workers put
        // their batches straight back in the free pool, waking nobody.
        let unordered = sinks.is_empty().then(|| free_tx.clone());
        let writer_stats = stats.clone();
        let writer = std::thread::Builder::new()
            .name("flick-packet-writer".into())
            .spawn(move || write_in_order(sinks, done_rx, free_tx, workers, batches, &writer_stats))
            .map_err(|e| Error::Spawn("writer", e))?;
        let snapshots = Arc::new(Snapshots {
            shards: std::sync::Mutex::new((0..workers).map(|_| None).collect()),
            epoch: std::sync::atomic::AtomicU64::new(0),
        });
        let mut queues = Vec::with_capacity(workers);
        let mut handles = Vec::with_capacity(workers);
        let mut controls = Vec::with_capacity(workers);
        let state_names = Arc::new(self.state_names.clone());
        for w in 0..workers {
            let (batch_tx, batch_rx) = bounded::<Batch>(queue_batches);
            queues.push(batch_tx);
            let (control_tx, control_rx) = bounded::<Command>(CONTROL_QUEUE);
            controls.push(control_tx);
            let worker = Worker {
                module: self.module.clone(),
                grammar: self.grammar.clone(),
                units: self.units.clone(),
                rules: self.rules.clone(),
                fields: self.fields.clone(),
                tx_of: tx_of.clone(),
                source: self.source.clone(),
                shard: Shard::with_tables(
                    self.state_names.len(),
                    self.config.dict_capacity,
                    &self.tables,
                ),
                init: self.init,
                index: w,
                channels: Arc::new(self.channels.clone()),
                stats: stats.clone(),
                state_names: state_names.clone(),
                snapshots: snapshots.clone(),
                control: control_rx,
            };
            let done = unordered.clone().unwrap_or_else(|| done_tx.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("flick-packet-{w}"))
                    .spawn(move || worker.run(batch_rx, done))
                    .map_err(|e| Error::Spawn("worker", e))?,
            );
        }
        drop((done_tx, unordered));
        if let Some(control) = &self.config.control {
            control.start(state_names, controls);
        }
        let mut dispatch = Dispatch {
            service: self,
            parsers: self.parsers(),
            vm: Vm::default(),
            key: Vec::new(),
            sends: Sends::default(),
            steer: self.dispatch_steer(workers),
            filling: (0..workers).map(|_| None).collect(),
            held: false,
            queues,
            free: free_rx,
            spare: None,
            seq: 0,
            malformed: 0,
            faults: 0,
            overflow: vec![0; counts.len()],
            rx_drops: vec![0; counts.len()],
            rx: vec![(0, 0); counts.len()],
            tx_of: tx_of.clone(),
            stats: stats.clone(),
        };
        let mut result = Ok(());
        let mut poll_fds = Vec::with_capacity(sources.len());
        // The ports' own drops cost a system call to read (AF_XDP's
        // statistics): read a few times a second, and at the end.
        let mut drops_due = std::time::Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if std::time::Instant::now() >= drops_due {
                dispatch.read_port_drops(&sources);
                drops_due = std::time::Instant::now() + PORT_DROPS_EVERY;
            }
            if let Some(req) = &self.config.dump_request {
                if req.swap(false, Ordering::Relaxed) {
                    self.dump_while_running(&dispatch, &snapshots, &counts);
                }
            }
            let mut busy = false;
            let mut open = false;
            let mut full = None;
            for s in sources.iter_mut().filter(|s| !s.ended) {
                // What the service cannot hold yet stays in the port's ring.
                if s.live {
                    if let Err(wait) = dispatch.room_for_read() {
                        (open, full) = (true, Some(wait));
                        continue;
                    }
                }
                match dispatch.read(s) {
                    Ok(RecvStatus::Frames(_)) => (busy, open) = (true, true),
                    Ok(RecvStatus::Idle) => open = true,
                    Ok(RecvStatus::End) => s.ended = true,
                    Err(e) => {
                        result = Err(Error::Port(e));
                        s.ended = true;
                    }
                }
            }
            if !open {
                break;
            }
            // A live port's batch that found its queue full goes now if
            // it can; meanwhile the wait for frames is short.
            dispatch.send_held();
            if let Some(wait) = full {
                dispatch.wait_for(wait);
            } else if !busy {
                wait_readable(&sources, &mut poll_fds, dispatch.held);
            }
        }
        // Every numbered frame reaches the writer, which waits for each.
        dispatch.send_all(true);
        dispatch.read_port_drops(&sources);
        let Dispatch {
            queues,
            malformed,
            faults: steer_faults,
            overflow,
            rx,
            rx_drops,
            ..
        } = dispatch;
        // Closing the queues ends the workers once they are drained, and
        // their ends of the writer's channel close with them.
        drop(queues);
        if let Some(control) = &self.config.control {
            control.end();
        }
        let mut shards = Vec::with_capacity(workers);
        let mut summary = Summary {
            malformed,
            faults: steer_faults,
            ..Summary::default()
        };
        for h in handles {
            let done = h.join().map_err(|_| Error::Panicked("worker"))?;
            summary.dropped += done.dropped;
            summary.faults += done.faults;
            summary.malformed += done.malformed;
            summary.dict_full += done.shard.dict_full;
            summary.worker_frames.push(done.frames);
            shards.push(done.shard);
        }
        let tx = writer.join().map_err(|_| Error::Panicked("writer"))?;
        for (i, c) in counts.iter_mut().enumerate() {
            (c.rx_frames, c.rx_bytes) = rx[i];
            c.rx_overflow = overflow[i];
            c.rx_drops = rx_drops[i];
        }
        for (index, frames, bytes, errors) in tx {
            let c = &mut counts[index];
            c.tx_frames += frames;
            c.tx_bytes += bytes;
            c.tx_errors += errors;
        }
        summary.ports = counts;
        let names: Vec<&str> = self.state_names.iter().map(String::as_str).collect();
        let all: Vec<&Shard> = shards.iter().collect();
        summary.state = state::merged(&names, &all);
        summary.tables = state::table_counts(&names, &all);
        if let Some(path) = &self.config.dump_path {
            write_dump(path, &summary.dump_json())?;
        }
        result.map(|()| summary)
    }

    /// A dump while running: each worker copies its shard out between
    /// frames when it sees the request; the counters are the dispatcher's
    /// so far.
    fn dump_while_running(
        &self,
        dispatch: &Dispatch<'_>,
        snapshots: &Snapshots,
        counts: &[PortCounts],
    ) {
        let Some(path) = &self.config.dump_path else {
            return;
        };
        if let Ok(mut s) = snapshots.shards.lock() {
            s.iter_mut().for_each(|x| *x = None);
        }
        snapshots.epoch.fetch_add(1, Ordering::Relaxed);
        // Idle workers look at the request when their queue wait times out.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let shards = loop {
            if let Ok(s) = snapshots.shards.lock() {
                if s.iter().all(Option::is_some) {
                    break s
                        .iter()
                        .flatten()
                        .map(|x| (x.0.clone(), x.1.clone()))
                        .collect::<Vec<_>>();
                }
            }
            if std::time::Instant::now() > deadline {
                tracing::warn!("state dump skipped: a worker did not answer in time");
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let mut summary = Summary {
            malformed: dispatch.malformed,
            faults: dispatch.faults,
            ..Summary::default()
        };
        summary.ports = counts
            .iter()
            .enumerate()
            .map(|(i, c)| PortCounts {
                rx_frames: dispatch.rx[i].0,
                rx_bytes: dispatch.rx[i].1,
                ..c.clone()
            })
            .collect();
        let mut tables = Map::new();
        summary.state = shards.into_iter().fold(Map::new(), |mut all, (m, t)| {
            for (k, v) in m {
                merge_json(&mut all, k, v);
            }
            // Each table's counts, summed over the shards.
            for (name, counts) in t {
                let sum = tables
                    .entry(name)
                    .or_insert_with(|| serde_json::json!({"evicted": 0, "expired": 0}));
                for key in ["evicted", "expired"] {
                    let n = sum[key].as_u64().unwrap_or(0) + counts[key].as_u64().unwrap_or(0);
                    sum[key] = n.into();
                }
            }
            all
        });
        summary.tables = tables;
        if let Err(e) = write_dump(path, &summary.dump_json()) {
            tracing::warn!("{e}");
        }
    }

    fn parsers(&self) -> Vec<Option<Parser>> {
        parsers(&self.grammar, &self.units)
    }
}

/// The module with, if the program defines `steer` over one record, a
/// function of its own that returns `hash(steer(p))`: the language's
/// `hash` (FNV-1a) of whatever `steer` gives, a string in the
/// interpreter's scratch buffer (as `pack` makes) included, without
/// copying it out.
fn with_steer_hash(module: Arc<Module>) -> (Arc<Module>, Option<FuncId>) {
    use flick_exec::code::{Builtin, Function, Op};
    let Some(steer) = module
        .functions
        .iter()
        .position(|f| f.name == "steer" && f.params == 1)
    else {
        return (module, None);
    };
    let mut m = (*module).clone();
    let at = m.functions[steer].spans.first().copied().unwrap_or(0);
    m.functions.push(Function {
        name: "steer hash".into(),
        params: 1,
        regs: 3,
        code: vec![
            Op::Call {
                dst: 1,
                func: steer as FuncId,
                args: Box::new([0]),
            },
            Op::Builtin {
                f: Builtin::Hash,
                dst: 2,
                args: Box::new([1]),
            },
            Op::Return { src: 2 },
        ],
        spans: vec![at; 3],
    });
    let f = (m.functions.len() - 1) as FuncId;
    (Arc::new(m), Some(f))
}

/// Whether any code names channel `chan`: a send to it, or passing it to
/// a function that does.
fn writes(module: &Module, chan: u16) -> bool {
    module.functions.iter().any(|f| {
        f.code
            .iter()
            .any(|op| matches!(op, flick_exec::code::Op::Chan { chan: c, .. } if *c == chan))
    })
}

/// Waits until a live port has frames: in `poll` on their descriptors
/// where every open port has one, for at most 20 ms so that a stop or a
/// dump request is seen (1 ms while a batch waits for room in a queue);
/// else a short sleep.
fn wait_readable(sources: &[Source], fds: &mut Vec<libc::pollfd>, held: bool) {
    fds.clear();
    for s in sources.iter().filter(|s| !s.ended) {
        match s.rx.raw_fd() {
            Some(fd) => fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            }),
            None => {
                std::thread::sleep(std::time::Duration::from_micros(200));
                return;
            }
        }
    }
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures,
    // alive for the call.
    unsafe {
        libc::poll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            if held { 1 } else { 20 },
        );
    }
}

fn merge_json(all: &mut Map<String, Json>, k: String, v: Json) {
    match (all.get_mut(&k), v) {
        (None, v) => {
            all.insert(k, v);
        }
        (Some(Json::Object(a)), Json::Object(b)) => {
            for (k2, v2) in b {
                merge_json(a, k2, v2);
            }
        }
        (Some(a), b) => {
            if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
                *a = Json::from(x.wrapping_add(y));
            }
        }
    }
}

fn write_dump(path: &std::path::Path, text: &str) -> Result<(), Error> {
    // Written beside and renamed, so a reader never sees half a dump.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| Error::Dump {
            path: path.display().to_string(),
            source,
        })
}

/// Room a batch's buffer is made with per frame: an Ethernet frame with a
/// VLAN tag fits; a batch of larger frames is sent sooner, and a single
/// frame larger than the whole buffer grows it once, which stays grown.
const FRAME_BUFFER: usize = 2048;
/// Frames taken from a port per call.
const BATCH: usize = 64;
/// How often the dispatcher reads its ports' own drop counts.
const PORT_DROPS_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// The most frames a [`Batch`] carries between threads.
pub const BATCH_FRAMES: usize = 256;

/// The shards copied out for a dump while running, and the request for
/// them: a count the workers of this run (only) watch.
struct Snapshots {
    shards: std::sync::Mutex<Vec<Option<Snapshot>>>,
    epoch: std::sync::atomic::AtomicU64,
}

/// A worker's shard, copied out for a dump while running: its state and
/// its flow tables' counts.
struct Snapshot(Map<String, Json>, Map<String, Json>);

fn parsers(grammar: &Arc<Grammar>, units: &[Option<UnitId>]) -> Vec<Option<Parser>> {
    let mut out: Vec<Option<Parser>> = (0..grammar.units().len()).map(|_| None).collect();
    for u in units.iter().flatten() {
        if out[*u].is_none() {
            out[*u] = Some(grammar.parser(*u).in_place());
        }
    }
    out
}

/// Parses one whole frame; false if it does not parse.
fn parse_frame(p: &mut Parser, frame: &[u8]) -> bool {
    p.reset();
    matches!(p.finish(frame), Ok(Progress::Done(_)))
}

struct Source {
    rx: Box<dyn RxPort>,
    chan: u16,
    counts: usize,
    live: bool,
    ended: bool,
}

/// One frame of a batch: its number in reading order, where its bytes lie
/// in the batch's buffer, and (set by its worker) the ports it goes to.
#[derive(Clone, Copy, Default)]
struct Entry {
    seq: u64,
    timestamp: u64,
    start: u32,
    len: u32,
    chan: u16,
    sends: Sends,
}

/// Frames on their way from the dispatcher through one worker to the
/// writer, and back to the free pool, whole: its vectors keep their
/// storage, so a batch is made once per run.
struct Batch {
    /// The worker the batch was filled for, which the writer's merge
    /// needs.
    worker: usize,
    entries: Vec<Entry>,
    bytes: Vec<u8>,
    /// Frames the writer has written.
    written: usize,
}

impl Batch {
    fn new() -> Batch {
        Batch {
            worker: 0,
            entries: Vec::with_capacity(BATCH_FRAMES),
            bytes: Vec::with_capacity(BATCH_FRAMES * FRAME_BUFFER),
            written: 0,
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes.clear();
        self.written = 0;
    }

    /// Whether a read of up to [`BATCH`] frames of up to [`FRAME_BUFFER`]
    /// bytes fits.
    fn has_room_for_read(&self) -> bool {
        self.entries.len() + BATCH <= BATCH_FRAMES
            && self.bytes.len() + BATCH * FRAME_BUFFER <= self.bytes.capacity()
    }

    /// Whether a frame of `len` bytes may join without growing the
    /// buffer (an empty batch takes any frame).
    fn has_room(&self, len: usize) -> bool {
        self.entries.is_empty()
            || (self.entries.len() < BATCH_FRAMES
                && self.bytes.len() + len <= self.bytes.capacity())
    }

    fn push(&mut self, seq: u64, timestamp: u64, chan: u16, frame: &[u8]) {
        self.entries.push(Entry {
            seq,
            timestamp,
            start: self.bytes.len() as u32,
            len: frame.len() as u32,
            chan,
            sends: Sends::default(),
        });
        self.bytes.extend_from_slice(frame);
    }
}

/// What a dispatcher that cannot read a live port yet waits for.
#[derive(Clone, Copy)]
enum Wait {
    /// Room in this worker's queue, for its batch short of room.
    Queue(usize),
    /// A batch back in the free pool.
    Free,
}

/// The bytes of frame `e` in `bytes`, its batch's buffer.
fn frame_of<'b>(bytes: &'b [u8], e: &Entry) -> &'b [u8] {
    &bytes[e.start as usize..e.start as usize + e.len as usize]
}

struct Dispatch<'s> {
    service: &'s PacketService,
    parsers: Vec<Option<Parser>>,
    vm: Vm,
    key: Vec<u8>,
    sends: Sends,
    /// The `steer` hash run on each frame: the program's, except with one
    /// worker where `steer` cannot fault (`pure_steer.rs`), which every frame
    /// would go to anyway.
    steer: Option<FuncId>,
    /// Per worker: the batch being filled for it, if any.
    filling: Vec<Option<Batch>>,
    /// Whether a batch in `filling` found its queue full.
    held: bool,
    queues: Vec<Sender<Batch>>,
    free: Receiver<Batch>,
    /// A free batch taken while waiting for room, not yet given a worker.
    spare: Option<Batch>,
    seq: u64,
    malformed: u64,
    faults: u64,
    /// Per port: frames dropped for want of room (live ports).
    overflow: Vec<u64>,
    /// Per port: what the port last said it dropped on the way in.
    rx_drops: Vec<u64>,
    /// Per port: frames and bytes received.
    rx: Vec<(u64, u64)>,
    tx_of: Arc<Vec<Vec<Option<u16>>>>,
    stats: Arc<LiveStats>,
}

impl Dispatch<'_> {
    fn read(&mut self, s: &mut Source) -> Result<RecvStatus, PortError> {
        let (chan, counts, live) = (s.chan, s.counts, s.live);
        let status = s.rx.recv_batch(BATCH, &mut |frame, ts| {
            self.frame(chan, counts, live, frame, ts)
        });
        // What a live port gave goes on now, so no frame waits for the
        // next; a file's frames go in full batches (and all at its end).
        if live {
            self.send_all(false);
        }
        if let Some(p) = self.stats.ports().get(counts) {
            set(&p.rx_frames, self.rx[counts].0);
            set(&p.rx_bytes, self.rx[counts].1);
            set(&p.rx_overflow, self.overflow[counts]);
        }
        set(&self.stats.malformed, self.malformed);
        set(&self.stats.steer_faults, self.faults);
        status
    }

    /// Reads each receiving port's own drop count and publishes it.
    fn read_port_drops(&mut self, sources: &[Source]) {
        for s in sources {
            let drops = s.rx.stats().drops;
            if drops > self.rx_drops[s.counts] {
                let lost = drops - self.rx_drops[s.counts];
                flick_platform::limited!(
                    RX_LOG,
                    warn,
                    "{lost} frames dropped by a port on the way in: its ring was full"
                );
            }
            self.rx_drops[s.counts] = drops;
            if let Some(p) = self.stats.ports().get(s.counts) {
                set(&p.rx_drops, drops);
            }
        }
    }

    /// Sends worker `w`'s batch, waiting for room in its queue if `wait`;
    /// false (the batch kept) if the queue is full.
    fn send(&mut self, w: usize, wait: bool) -> bool {
        let Some(mut batch) = self.filling[w].take() else {
            return true;
        };
        if batch.entries.is_empty() {
            self.filling[w] = Some(batch);
            return true;
        }
        batch.worker = w;
        let kept = if wait {
            // A closed queue means its worker is gone (it panicked): the
            // run ends with that error once the ports are done.
            self.queues[w].send(batch).err().map(|e| e.0)
        } else {
            match self.queues[w].try_send(batch) {
                Ok(()) => None,
                Err(TrySendError::Full(b)) | Err(TrySendError::Disconnected(b)) => Some(b),
            }
        };
        match kept {
            None => true,
            Some(b) if wait => {
                // Nobody will handle it; its buffer is not needed either.
                drop(b);
                true
            }
            Some(b) => {
                self.filling[w] = Some(b);
                self.held = true;
                false
            }
        }
    }

    /// Sends every batch being filled that has frames.
    fn send_all(&mut self, wait: bool) {
        self.held = false;
        for w in 0..self.filling.len() {
            self.send(w, wait);
        }
    }

    /// Retries the batches that found their queues full.
    fn send_held(&mut self) {
        if self.held {
            self.send_all(false);
        }
    }

    /// Whether every worker has a batch with room for a whole read from a
    /// live port, taking free batches for those without one and sending
    /// those short of room; if not, what to wait for.
    fn room_for_read(&mut self) -> Result<(), Wait> {
        for w in 0..self.filling.len() {
            if self.filling[w]
                .as_ref()
                .is_some_and(|b| !b.has_room_for_read())
                && !self.send(w, false)
            {
                return Err(Wait::Queue(w));
            }
            if self.filling[w].is_none() {
                let Some(mut batch) = self.take_free() else {
                    return Err(Wait::Free);
                };
                batch.clear();
                self.filling[w] = Some(batch);
            }
        }
        Ok(())
    }

    /// Waits for `what` for at most a millisecond (so that a stop or a
    /// dump request is seen): room in a worker's queue for its full batch,
    /// or a batch back in the free pool.
    fn wait_for(&mut self, what: Wait) {
        const WAIT: std::time::Duration = std::time::Duration::from_millis(1);
        match what {
            Wait::Queue(w) => {
                if let Some(mut batch) = self.filling[w].take() {
                    batch.worker = w;
                    if let Err(e) = self.queues[w].send_timeout(batch, WAIT) {
                        // Still full (or its worker is gone, which the
                        // next send finds out): kept for later.
                        self.filling[w] = Some(e.into_inner());
                        self.held = true;
                    }
                }
            }
            Wait::Free => self.spare = self.free.recv_timeout(WAIT).ok(),
        }
    }

    fn take_free(&mut self) -> Option<Batch> {
        self.spare.take().or_else(|| self.free.try_recv().ok())
    }

    /// A batch for worker `w` with room for `len` bytes more, or None
    /// (for a live port that finds no room).
    fn batch_for(&mut self, w: usize, len: usize, live: bool) -> Option<&mut Batch> {
        if self.filling[w].as_ref().is_some_and(|b| !b.has_room(len)) && !self.send(w, !live) {
            return None;
        }
        if self.filling[w].is_none() {
            let batch = match self.take_free() {
                Some(b) => b,
                None if live => return None,
                None => {
                    // The batches waited for come back only once the
                    // frames before them are written: send them all.
                    self.send_all(true);
                    self.free.recv().ok()?
                }
            };
            let mut batch = batch;
            batch.clear();
            self.filling[w] = Some(batch);
        }
        self.filling[w].as_mut()
    }

    fn frame(&mut self, chan: u16, counts: usize, live: bool, frame: &[u8], timestamp: u64) {
        let rx = &mut self.rx[counts];
        rx.0 += 1;
        rx.1 += frame.len() as u64;
        let svc = self.service;
        let Some(unit) = svc.units[chan as usize] else {
            return;
        };
        let Some(p) = self.parsers[unit].as_mut() else {
            return;
        };
        // Without `steer` (or with one worker and a `steer` that cannot
        // fault) the frame is parsed once, by its worker, which also
        // counts it if it does not parse.
        let worker = match self.steer {
            // The common key needs no parse here: the worker parses.
            _ if svc.steers_by_key(self.queues.len()) => {
                let key = svc.steer_key.expect("checked above");
                let fields = crate::steering::FrameFields::of_ethernet(frame);
                (key.hash(&fields) % self.queues.len() as u64) as usize
            }
            None => 0,
            Some(_) if !parse_frame(p, frame) => {
                self.malformed += 1;
                log_malformed(svc, chan, unit, frame.len());
                return;
            }
            Some(f) => {
                let host = &mut FrameHost {
                    frame,
                    message: p.message(frame),
                    fields: &svc.fields,
                    tx_of: &self.tx_of,
                    module: &svc.module,
                    source: svc.source.as_deref(),
                    shard: None,
                    key: &mut self.key,
                    sends: &mut self.sends,
                    edits: None,
                };
                self.vm.start(&svc.module, f, &[FRAME]);
                let key = match self.vm.run(&svc.module, host, &mut Timeslice::unlimited()) {
                    Ok(Outcome::Done(Value::Int(h))) => h as u64,
                    other => {
                        self.faults += 1;
                        let why = match other {
                            Err(f) => f.to_string(),
                            Ok(_) => "it did not finish".into(),
                        };
                        log_fault(svc, &self.vm, "steer", &why);
                        self.vm.stop();
                        return;
                    }
                };
                (key % self.queues.len() as u64) as usize
            }
        };
        let seq = self.seq;
        match self.batch_for(worker, frame.len(), live) {
            Some(batch) => {
                batch.push(seq, timestamp, chan, frame);
                self.seq += 1;
            }
            None => self.overflow[counts] += 1,
        }
    }
}

fn log_malformed(svc: &PacketService, chan: u16, unit: UnitId, len: usize) {
    log_malformed_in(&svc.channels, &svc.grammar, chan, unit, len);
}

fn log_malformed_in(channels: &[String], grammar: &Grammar, chan: u16, unit: UnitId, len: usize) {
    flick_platform::limited!(
        MALFORMED_LOG,
        warn,
        channel = %channels[chan as usize],
        len,
        "a frame that does not parse as `{}` was dropped",
        grammar.unit(unit).name
    );
}

fn log_fault(svc: &PacketService, vm: &Vm, what: &str, why: &str) {
    let at = fault_site(&svc.module, svc.source.as_deref(), vm);
    flick_platform::limited!(
        FAULT_LOG,
        warn,
        at = %at,
        "{what} faulted, the frame was dropped: {why}"
    );
}

/// Where in the program `vm` faulted.
fn fault_site(module: &Module, source: Option<&flick_span::SourceFile>, vm: &Vm) -> String {
    let offset = vm
        .fault_site()
        .and_then(|(f, pc)| module.source_offset(f, pc));
    crate::host::program_position(offset, source)
}

struct Worker {
    module: Arc<Module>,
    grammar: Arc<Grammar>,
    units: Vec<Option<UnitId>>,
    rules: Vec<Option<FuncId>>,
    fields: Arc<FieldTable>,
    tx_of: Arc<Vec<Vec<Option<u16>>>>,
    source: Option<Arc<flick_span::SourceFile>>,
    shard: Shard,
    init: FuncId,
    index: usize,
    channels: Arc<Vec<String>>,
    stats: Arc<LiveStats>,
    state_names: Arc<Vec<String>>,
    snapshots: Arc<Snapshots>,
    /// State writes from outside, applied between batches.
    control: Receiver<Command>,
}

struct WorkerDone {
    shard: Shard,
    frames: u64,
    dropped: u64,
    faults: u64,
    malformed: u64,
}

impl Worker {
    fn run(mut self, batches: Receiver<Batch>, done: Sender<Batch>) -> WorkerDone {
        let mut parsers = parsers(&self.grammar, &self.units);
        let mut vm = Vm::default();
        let mut key = Vec::new();
        let mut sends = Sends::default();
        let mut edits = Edits::default();
        let (mut dropped, mut faults, mut malformed, mut frames) = (0, 0, 0, 0);
        // The process's state, set up once per shard.
        {
            let host = &mut FrameHost {
                frame: &[],
                message: empty_message(&mut parsers, &self.units),
                fields: &self.fields,
                tx_of: &self.tx_of,
                module: &self.module,
                source: self.source.as_deref(),
                shard: Some(&mut self.shard),
                key: &mut key,
                sends: &mut sends,
                edits: None,
            };
            vm.start(&self.module, self.init, &[]);
            if let Err(f) = vm.run(&self.module, host, &mut Timeslice::unlimited()) {
                tracing::error!("setting up the process state faulted: {f}");
            }
        }
        let mut epoch = self.snapshots.epoch.load(Ordering::Relaxed);
        loop {
            let batch = match batches.recv_timeout(std::time::Duration::from_millis(50)) {
                Ok(b) => Some(b),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            };
            // An empty queue answers without allocating or locking.
            while let Ok(cmd) = self.control.try_recv() {
                apply_command(&mut self.shard, &self.state_names, cmd);
            }
            let now = self.snapshots.epoch.load(Ordering::Relaxed);
            if now != epoch {
                epoch = now;
                self.snapshot();
            }
            let Some(mut batch) = batch else { continue };
            let Batch { entries, bytes, .. } = &mut batch;
            for e in entries.iter_mut() {
                frames += 1;
                e.sends.clear();
                self.shard.advance(e.timestamp);
                let chan = e.chan as usize;
                let frame = frame_of(bytes, e);
                let (Some(unit), Some(rule)) = (self.units[chan], self.rules[chan]) else {
                    dropped += 1;
                    continue;
                };
                let p = parsers[unit].as_mut().expect("a parser per unit read");
                if !parse_frame(p, frame) {
                    malformed += 1;
                    log_malformed_in(&self.channels, &self.grammar, e.chan, unit, frame.len());
                    continue;
                }
                edits.clear();
                let host = &mut FrameHost {
                    frame,
                    message: p.message(frame),
                    fields: &self.fields,
                    tx_of: &self.tx_of,
                    module: &self.module,
                    source: self.source.as_deref(),
                    shard: Some(&mut self.shard),
                    key: &mut key,
                    sends: &mut e.sends,
                    edits: Some(&mut edits),
                };
                vm.start(&self.module, rule, &[FRAME]);
                let ran = vm.run(&self.module, host, &mut Timeslice::unlimited());
                // The rule's header edits, made to the frame wherever it goes.
                let edited = match &ran {
                    Ok(Outcome::Done(_)) => edits.iter().try_for_each(|ed| {
                        let at = e.start as usize..e.start as usize + e.len as usize;
                        rewrite::apply(&mut bytes[at], ed)
                    }),
                    _ => Ok(()),
                };
                match ran {
                    Ok(Outcome::Done(_)) if edited.is_ok() => {
                        if e.sends.as_slice().is_empty() {
                            dropped += 1;
                        }
                    }
                    Ok(Outcome::Done(_)) => {
                        faults += 1;
                        e.sends.clear();
                        if let Err(why) = edited {
                            self.log_fault(&vm, &why.to_string());
                        }
                    }
                    other => {
                        faults += 1;
                        e.sends.clear();
                        let why = match other {
                            Err(f) => f.to_string(),
                            Ok(_) => "it did not finish".into(),
                        };
                        self.log_fault(&vm, &why);
                        vm.stop();
                    }
                }
            }
            if let Some(w) = self.stats.workers().get(self.index) {
                set(&w.frames, frames);
                set(&w.dropped, dropped);
                set(&w.faults, faults);
                set(&w.dict_full, self.shard.dict_full);
                let (evicted, expired) = self
                    .shard
                    .table_counts()
                    .fold((0, 0), |(e, x), (_, te, tx)| (e + te, x + tx));
                set(&w.table_evicted, evicted);
                set(&w.table_expired, expired);
            }
            if done.send(batch).is_err() {
                break;
            }
        }
        WorkerDone {
            shard: self.shard,
            frames,
            dropped,
            faults,
            malformed,
        }
    }

    fn snapshot(&self) {
        let names: Vec<&str> = self.state_names.iter().map(String::as_str).collect();
        let m = state::merged(&names, &[&self.shard]);
        let t = state::table_counts(&names, &[&self.shard]);
        if let Ok(mut s) = self.snapshots.shards.lock() {
            s[self.index] = Some(Snapshot(m, t));
        }
    }

    fn log_fault(&self, vm: &Vm, why: &str) {
        let at = fault_site(&self.module, self.source.as_deref(), vm);
        flick_platform::limited!(
            FAULT_LOG,
            warn,
            at = %at,
            "a rule faulted, the frame was dropped: {why}"
        );
    }
}

/// A message over no bytes, for running the state's setup, which reads no
/// frame.
fn empty_message<'p>(
    parsers: &'p mut [Option<Parser>],
    units: &[Option<UnitId>],
) -> flick_wire::Message<'p> {
    let u = units.iter().flatten().next().copied().unwrap_or(0);
    let p = parsers[u].as_mut().expect("a parser per unit read");
    p.reset();
    p.message(&[])
}

/// The writer: frames back in reading order, out of their ports, and
/// batches back to the free pool. Returns per port (counter index):
/// frames, bytes and errors sent.
fn write_in_order(
    mut sinks: Vec<(usize, Box<dyn TxPort>)>,
    done: Receiver<Batch>,
    free: Sender<Batch>,
    workers: usize,
    batches: usize,
    stats: &LiveStats,
) -> Vec<(usize, u64, u64, u64)> {
    let mut sent: Vec<(usize, u64, u64, u64)> = sinks.iter().map(|(i, _)| (*i, 0, 0, 0)).collect();
    // Per port, the drops it had reported at the last flush.
    let mut dropped = vec![0u64; sinks.len()];
    // Per worker, its batches not yet written, oldest first.
    let mut pending: Vec<std::collections::VecDeque<Batch>> = (0..workers)
        .map(|_| std::collections::VecDeque::with_capacity(batches))
        .collect();
    let mut next: u64 = 0;
    // Whether a port may hold frames not yet flushed.
    let mut held = false;
    for b in done.iter() {
        let mut w = b.worker;
        pending[w].push_back(b);
        // The next frame is at the head of some worker's oldest batch;
        // frames in a row from one worker are written without looking
        // at the others.
        let mut tried = 0;
        while tried < workers {
            let Some(batch) = pending[w].front_mut() else {
                (w, tried) = ((w + 1) % workers, tried + 1);
                continue;
            };
            let e = batch.entries[batch.written];
            if e.seq != next {
                (w, tried) = ((w + 1) % workers, tried + 1);
                continue;
            }
            tried = 0;
            write_frame(&mut sinks, &mut sent, stats, frame_of(&batch.bytes, &e), &e);
            next += 1;
            held = true;
            batch.written += 1;
            if batch.written == batch.entries.len() {
                if let Some(b) = pending[w].pop_front() {
                    let _ = free.send(b);
                }
            }
        }
        // Ports that batch (AF_PACKET's sendmmsg, a file's buffer) send
        // what they hold once nothing more is waiting: under load the
        // batches stay full, and a lone frame still leaves at once.
        if held && done.is_empty() {
            flush_all(&mut sinks, &mut sent, &mut dropped, stats);
            held = false;
        }
    }
    flush_all(&mut sinks, &mut sent, &mut dropped, stats);
    sent
}

/// Writes one frame to each port its rule sent it to.
fn write_frame(
    sinks: &mut [(usize, Box<dyn TxPort>)],
    sent: &mut [(usize, u64, u64, u64)],
    stats: &LiveStats,
    frame: &[u8],
    e: &Entry,
) {
    for &port in e.sends.as_slice() {
        let (_, tx) = &mut sinks[port as usize];
        let s = &mut sent[port as usize];
        match tx.send(frame, e.timestamp) {
            Ok(()) => {
                s.1 += 1;
                s.2 += frame.len() as u64;
            }
            Err(err) => {
                s.3 += 1;
                flick_platform::limited!(TX_LOG, warn, "a frame was not sent: {err}");
            }
        }
        if let Some(p) = stats.ports().get(s.0) {
            set(&p.tx_frames, s.1);
            set(&p.tx_bytes, s.2);
            set(&p.tx_errors, s.3);
        }
    }
}

/// Flushes every port. Frames a port took and then lost for want of room
/// (a full device queue, no free send buffer: its [`PortStats`]' drops)
/// are counted with the port's errors, published and logged here, so no
/// frame goes unsent without a metric and a log line.
///
/// [`PortStats`]: flick_packet_io::PortStats
fn flush_all(
    sinks: &mut [(usize, Box<dyn TxPort>)],
    sent: &mut [(usize, u64, u64, u64)],
    dropped: &mut [u64],
    stats: &LiveStats,
) {
    for (i, (_, tx)) in sinks.iter_mut().enumerate() {
        if let Err(e) = tx.flush() {
            sent[i].3 += 1;
            tracing::error!("flushing a port failed: {e}");
        }
        let drops = tx.stats().drops;
        if drops > dropped[i] {
            let lost = drops - dropped[i];
            dropped[i] = drops;
            sent[i].3 += lost;
            flick_platform::limited!(
                TX_LOG,
                warn,
                "{lost} frames not sent: the port's send queue was full"
            );
            if let Some(p) = stats.ports().get(sent[i].0) {
                set(&p.tx_errors, sent[i].3);
            }
        }
    }
}

/// Commands queued to one worker, at most; a write that finds its queue
/// full is refused as busy rather than waited for.
const CONTROL_QUEUE: usize = 16;

/// Writes of a running program's `global` state, from outside (an API),
/// into the workers' shards. Each worker owns a bounded queue of commands
/// it drains between batches (and when its batch queue has been idle for
/// its wait), so the frame path takes no lock and allocates nothing for
/// them; each command is answered on a channel of its own.
///
/// Where a write goes:
/// - a scalar global (integer, boolean, string) is set in every shard,
///   since each worker reads its own copy. An integer with several
///   workers is refused ([`WriteError::PerShard`]): a dump sums integers
///   over the shards, so the same number in each would read as a multiple.
/// - a dictionary entry goes to the shard that owns its key. With one
///   worker that is the only shard; with several, a flow's worker is
///   chosen by `steer` over a frame, not by the key, so an entry is
///   written where a shard holds its key already, and a key no shard holds
///   is refused ([`WriteError::Unplaced`]).
///
/// Made empty and given to [`PacketConfig::control`]; it serves the run
/// that takes it while that run lasts.
#[derive(Default)]
pub struct StateControl {
    run: std::sync::Mutex<Option<ControlRun>>,
}

impl std::fmt::Debug for StateControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateControl")
    }
}

struct ControlRun {
    names: Arc<Vec<String>>,
    queues: Vec<Sender<Command>>,
}

struct Command {
    var: u16,
    op: ControlOp,
    reply: Sender<Result<Applied, WriteError>>,
}

enum ControlOp {
    Set(Value),
    /// Entries (keys encoded), one command for many so that a whole
    /// dictionary costs one wait for each worker.
    Entries {
        entries: Arc<Vec<(Vec<u8>, Value)>>,
        /// Whether an entry is made where the shard does not hold its key.
        create: bool,
    },
    /// Removes the entry under a key (encoded), wherever a shard holds it.
    Delete(Vec<u8>),
}

/// Values a worker wrote for one command.
type Applied = usize;

/// Why a state write was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    #[error("the program is not running")]
    NotRunning,
    #[error("`{0}` is not global state of the program")]
    NoSuchVar(String),
    #[error(
        "`{0}` holds a dictionary, a meter or a filter, not a value: write an entry as {0}/KEY"
    )]
    NotScalar(String),
    #[error("`{0}` is not a dictionary (or the program has not made it yet)")]
    NotDict(String),
    #[error("`{var}` holds {held}; it cannot be given {given}")]
    Kind {
        var: String,
        held: &'static str,
        given: &'static str,
    },
    #[error("a dictionary key is an integer or a string, not {0}")]
    Key(&'static str),
    #[error("`{0}` is full: the key was refused")]
    Full(String),
    #[error("`{var}` is an integer of each of the {workers} workers' shards, and a dump sums them: it is written only with one worker")]
    PerShard { var: String, workers: usize },
    #[error("no worker's shard holds this key of `{0}`: with several workers an entry goes where `steer` sends its flow, so only keys a shard holds are written")]
    Unplaced(String),
    #[error("`{0}` has no entry under this key")]
    NoEntry(String),
    #[error("a worker's control queue is full; try again")]
    Busy,
    #[error("the workers did not answer in time")]
    Timeout,
}

impl WriteError {
    /// The HTTP status an API answers this refusal with.
    pub fn status(&self) -> u16 {
        match self {
            WriteError::NotRunning => 409,
            WriteError::NoSuchVar(_) | WriteError::NoEntry(_) => 404,
            WriteError::NotScalar(_) | WriteError::NotDict(_) => 400,
            WriteError::Kind { .. } | WriteError::Key(_) => 400,
            WriteError::Full(_) => 409,
            WriteError::PerShard { .. } | WriteError::Unplaced(_) => 422,
            WriteError::Busy | WriteError::Timeout => 503,
        }
    }
}

fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Int(_) => "an integer",
        Value::Bool(_) => "a boolean",
        Value::Bytes(_) => "a string",
        Value::None | Value::Unit => "nothing",
        _ => "another kind of value",
    }
}

impl StateControl {
    /// Sets scalar global `var` to `value` (an integer, a boolean or a
    /// string, as `Value::Bytes`) in every shard; waits at most `timeout`.
    pub fn write_global(
        &self,
        var: &str,
        value: Value,
        timeout: std::time::Duration,
    ) -> Result<(), WriteError> {
        self.queue_global(var, value)?.wait(timeout).map(|_| ())
    }

    /// Queues [`StateControl::write_global`]'s write without waiting for
    /// it.
    pub fn queue_global(&self, var: &str, value: Value) -> Result<PendingWrite, WriteError> {
        let (index, queues) = self.target(var)?;
        if matches!(value, Value::Int(_)) && queues.len() > 1 {
            return Err(WriteError::PerShard {
                var: var.into(),
                workers: queues.len(),
            });
        }
        send_all(&queues, index, |_| ControlOp::Set(value.clone()))
    }

    /// Sets the entry under `key` (`Value::Int` or `Value::Bytes`) of
    /// global dictionary `var` to `value` in the shard that owns the key;
    /// waits at most `timeout`.
    pub fn write_entry(
        &self,
        var: &str,
        key: &Value,
        value: Value,
        timeout: std::time::Duration,
    ) -> Result<(), WriteError> {
        match self.write_entries(var, vec![(key.clone(), value)], timeout)? {
            0 => Err(WriteError::Unplaced(var.into())),
            _ => Ok(()),
        }
    }

    /// Sets many entries of `var` as [`StateControl::write_entry`] sets
    /// one, in one command to each worker (a whole dictionary carried
    /// over a redeploy); how many were written. Each worker stops at the
    /// first entry it has no room for ([`WriteError::Full`]).
    pub fn write_entries(
        &self,
        var: &str,
        entries: Vec<(Value, Value)>,
        timeout: std::time::Duration,
    ) -> Result<usize, WriteError> {
        self.queue_entries(var, entries)?.wait(timeout)
    }

    /// Queues [`StateControl::write_entries`]'s write without waiting for
    /// it; its answer is how many were written.
    pub fn queue_entries(
        &self,
        var: &str,
        entries: Vec<(Value, Value)>,
    ) -> Result<PendingWrite, WriteError> {
        let mut encoded = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            encoded.push((encoded_key(&key)?, value));
        }
        let (index, queues) = self.target(var)?;
        let create = queues.len() == 1;
        let entries = Arc::new(encoded);
        send_all(&queues, index, |_| ControlOp::Entries {
            entries: entries.clone(),
            create,
        })
    }

    /// Removes the entry under `key` (`Value::Int` or `Value::Bytes`) of
    /// global dictionary `var` from the shard that holds it; waits at most
    /// `timeout`. [`WriteError::NoEntry`] where no shard holds it.
    pub fn delete_entry(
        &self,
        var: &str,
        key: &Value,
        timeout: std::time::Duration,
    ) -> Result<(), WriteError> {
        match self.queue_delete(var, key)?.wait(timeout)? {
            0 => Err(WriteError::NoEntry(var.into())),
            _ => Ok(()),
        }
    }

    /// Queues [`StateControl::delete_entry`]'s removal without waiting for
    /// it; its answer is how many shards held the key.
    pub fn queue_delete(&self, var: &str, key: &Value) -> Result<PendingWrite, WriteError> {
        let key = encoded_key(key)?;
        let (index, queues) = self.target(var)?;
        send_all(&queues, index, |_| ControlOp::Delete(key.clone()))
    }

    /// Waits (at most `timeout`) until a run has taken this control;
    /// whether one has.
    pub fn wait_running(&self, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.run.lock().is_ok_and(|r| r.is_some()) {
                return true;
            }
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The index of `var` and the queues of the run now going.
    fn target(&self, var: &str) -> Result<(u16, Vec<Sender<Command>>), WriteError> {
        let run = self.run.lock().map_err(|_| WriteError::NotRunning)?;
        let run = run.as_ref().ok_or(WriteError::NotRunning)?;
        let index = run
            .names
            .iter()
            .position(|n| n == var)
            .ok_or_else(|| WriteError::NoSuchVar(var.into()))?;
        Ok((index as u16, run.queues.clone()))
    }

    fn start(&self, names: Arc<Vec<String>>, queues: Vec<Sender<Command>>) {
        if let Ok(mut run) = self.run.lock() {
            *run = Some(ControlRun { names, queues });
        }
    }

    fn end(&self) {
        if let Ok(mut run) = self.run.lock() {
            *run = None;
        }
    }
}

type Reply = Receiver<Result<Applied, WriteError>>;

/// A dictionary key as shards store it.
fn encoded_key(key: &Value) -> Result<Vec<u8>, WriteError> {
    let mut k = Vec::new();
    match key {
        Value::Int(_) => {
            state::encode_key(key, &|_| None, &mut k);
        }
        Value::Bytes(b) => state::encode_bytes_key(b, &mut k),
        other => return Err(WriteError::Key(kind_name(other))),
    }
    Ok(k)
}

/// A command queued to every worker of a run and not yet answered.
/// Queuing and waiting are apart so that a caller may queue while it
/// holds a lock and wait once it has let go of it.
#[must_use = "a pending write is answered only through `wait`"]
pub struct PendingWrite {
    replies: Vec<Reply>,
}

impl std::fmt::Debug for PendingWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingWrite({} workers)", self.replies.len())
    }
}

impl PendingWrite {
    /// Waits at most `timeout` for every worker to apply it; the values
    /// written (or entries removed), summed over the workers.
    pub fn wait(self, timeout: std::time::Duration) -> Result<usize, WriteError> {
        Ok(collect(self.replies, timeout)?.iter().sum())
    }
}

/// Queues a command to each worker; refused whole if any queue is full
/// (none is sent then: each is tried before any is sent).
fn send_all(
    queues: &[Sender<Command>],
    var: u16,
    op: impl Fn(usize) -> ControlOp,
) -> Result<PendingWrite, WriteError> {
    if queues.iter().any(Sender::is_full) {
        return Err(WriteError::Busy);
    }
    let mut replies = Vec::with_capacity(queues.len());
    for (w, q) in queues.iter().enumerate() {
        let (reply, answer) = bounded(1);
        q.try_send(Command {
            var,
            op: op(w),
            reply,
        })
        .map_err(|e| match e {
            TrySendError::Full(_) => WriteError::Busy,
            TrySendError::Disconnected(_) => WriteError::NotRunning,
        })?;
        replies.push(answer);
    }
    Ok(PendingWrite { replies })
}

fn collect(replies: Vec<Reply>, timeout: std::time::Duration) -> Result<Vec<Applied>, WriteError> {
    let deadline = std::time::Instant::now() + timeout;
    let mut applied = Vec::with_capacity(replies.len());
    let mut error = None;
    for r in replies {
        match r.recv_deadline(deadline) {
            Ok(Ok(a)) => applied.push(a),
            Ok(Err(e)) => error = error.or(Some(e)),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => return Err(WriteError::Timeout),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                return Err(WriteError::NotRunning)
            }
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(applied),
    }
}

/// Applies one command to a worker's shard.
fn apply_command(shard: &mut Shard, names: &[String], cmd: Command) {
    let name = || {
        names
            .get(cmd.var as usize)
            .cloned()
            .unwrap_or_else(|| cmd.var.to_string())
    };
    let outcome = match cmd.op {
        ControlOp::Set(value) => match shard.vars.get_mut(cmd.var as usize) {
            Some(state::Var::Value(held)) => {
                let unset = matches!(held, Value::None | Value::Unit);
                if unset || std::mem::discriminant(held) == std::mem::discriminant(&value) {
                    *held = value;
                    Ok(1)
                } else {
                    Err(WriteError::Kind {
                        var: name(),
                        held: kind_name(held),
                        given: kind_name(&value),
                    })
                }
            }
            Some(_) => Err(WriteError::NotScalar(name())),
            None => Err(WriteError::NoSuchVar(name())),
        },
        ControlOp::Entries { entries, create } => {
            let mut written = 0;
            let mut outcome = Ok(0);
            for (key, value) in entries.iter() {
                match shard.holds(cmd.var, key) {
                    Err(_) => {
                        outcome = Err(WriteError::NotDict(name()));
                        break;
                    }
                    Ok(false) if !create => continue,
                    Ok(_) => {}
                }
                let refused = shard.dict_full;
                match shard.dict_set(cmd.var, key, value.clone()) {
                    Ok(()) if shard.dict_full > refused => {
                        // The refusal is the API's, not a frame's.
                        shard.dict_full = refused;
                        outcome = Err(WriteError::Full(name()));
                        break;
                    }
                    Ok(()) => written += 1,
                    Err(_) => {
                        outcome = Err(WriteError::NotDict(name()));
                        break;
                    }
                }
            }
            outcome.map(|_: usize| written)
        }
        ControlOp::Delete(key) => match shard.dict_remove(cmd.var, &key) {
            Ok(removed) => Ok(removed as usize),
            Err(_) => Err(WriteError::NotDict(name())),
        },
    };
    let _ = cmd.reply.try_send(outcome);
}
