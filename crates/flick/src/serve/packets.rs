//! Packet programs and machines under `flick serve`: services bound to
//! packet ports (`--port CH=SPEC`, as `flick run` takes them) instead of
//! listening sockets.
//!
//! Each runs on packet threads of its own, as under `flick run`: their
//! dispatchers poll the ports and their workers hold the flow state, so
//! they do not go through the platform's task scheduler and its weights.
//! Undeploy sets the service's stop flag and waits for its threads, which
//! closes its ports. A machine's redeploy with the same ports replaces its
//! tables as `flick table load` does (flow contexts kept where their
//! stage's key, registers and states are unchanged); any other redeploy
//! stops the old version, then starts the new one.
//!
//! State is read from a dump taken between two frames without stopping
//! (the one SIGUSR1 asks for under `flick run`), and a path names a part
//! of it. A machine's `table` is written whole from a program's text, its
//! global registers and flow contexts (named by their key) through its
//! control queue (`MachineService::control`); a packet program's `global`
//! values and entries are written and deleted through its workers' write
//! queues (`PacketConfig::control`), carried into a new version on
//! redeploy and saved at a clean stop. Reads and writes other than a
//! table's go through a [`StateHandle`] taken under the registry's lock
//! and used once it is let go, so a service slow to answer holds up no
//! other request. Its counters are read for `/metrics` at each scrape.
//!
//! This module must not touch the socket services' registry: `serve.rs`
//! routes to it by name.

use super::{DeploySpec, Refusal};
use crate::reload::{DictOf, Scalar, StateVar};
use crate::table_load::TableLoader;
use flick_machine::engine::FlowEdit;
use flick_machine::service::{ControlError, ControlOp, MachineControl};
use flick_machine::{MachineService, Program};
use flick_packet::{Binding, BoundPort, PacketConfig, PacketService, PortUse};
use flick_packet_io::PortSpec;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Why a packet service takes no weight.
pub const NO_WEIGHT: &str = "a service on packet ports runs on packet threads of its own, not on the shared scheduler that weights divide, so it takes no weight";

/// How long a read waits for the dump it asked for.
pub const DUMP_TIMEOUT: Duration = Duration::from_secs(5);

/// What a deploy request binds to ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A Flick process over the `packet` grammar.
    Packet,
    /// A `machine` (Flick) or an XL program.
    Machine,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Packet => "packet",
            Kind::Machine => "machine",
        }
    }
}

/// Whether a deploy request is served on packet ports: an `.xl` file or a
/// program holding a `machine`, or any program given `--port` bindings.
/// `None`: a socket service.
pub fn kind_of(spec: &DeploySpec) -> Option<Kind> {
    if spec.file.ends_with(".xl") {
        return Some(Kind::Machine);
    }
    let text = crate::views::program_source(&spec.program);
    let (program, _) = flick_syntax::parse(&text);
    if !program.machines.is_empty() {
        return Some(Kind::Machine);
    }
    (!spec.ports.is_empty()).then_some(Kind::Packet)
}

/// A machine's running parts the API reaches.
struct MachineParts {
    program: Arc<Mutex<Arc<Program>>>,
    loader: Mutex<TableLoader>,
    stats: Arc<flick_machine::service::LiveStats>,
    /// The latest dump handed over by the dispatcher.
    dumped: Arc<Mutex<Option<String>>>,
    /// The channel names of a Flick machine (port N is the Nth); none for XL.
    channels: Vec<String>,
    /// The text of the tables running (the last program loaded).
    table_text: Mutex<(String, String)>,
    /// Writes to its registers and flow contexts.
    control: MachineControl,
}

/// One packet service running.
pub struct Running {
    pub spec: DeploySpec,
    pub kind: Kind,
    pub reserved: u64,
    pub version: u64,
    pub deploy_us: u64,
    /// Globals carried over from the version it replaced.
    pub carried: Vec<String>,
    stop: Arc<AtomicBool>,
    /// What the run said when it ended: its line and (a packet
    /// program's) final `global` state, or why it failed.
    thread: Option<JoinHandle<Result<Ended, String>>>,
    /// Set by its thread as it ends, for waits made without the handle.
    finished: Arc<AtomicBool>,
    dump_request: Arc<AtomicBool>,
    /// Where a packet program's dumps are written.
    dump_path: PathBuf,
    packet_stats: Option<Arc<flick_packet::LiveStats>>,
    machine: Option<MachineParts>,
    /// A packet program's state: its declared variables, and the
    /// configuration whose `control` writes them while it runs.
    state: Option<Arc<PacketState>>,
}

/// A run's last line and a packet program's final `global` state.
type Ended = (String, Option<serde_json::Map<String, Json>>);

/// What writing a packet program's `global` state needs.
struct PacketState {
    vars: Vec<StateVar>,
    /// Per variable (by name): a dictionary's key kind, if it is one the
    /// API can give (an integer or a string).
    keys: Vec<(String, Option<Scalar>)>,
    config: PacketConfig,
}

/// How long a state write waits for the workers to apply it: they look
/// between batches, and an idle one at least every 50 ms.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

fn refuse(status: u16, message: impl Into<String>) -> Refusal {
    Refusal::new(status, message)
}

/// Loads, checks, binds and starts a packet service. `dumps` is the
/// directory its dumps are written to.
pub fn start(spec: &DeploySpec, kind: Kind, dumps: &Path) -> Result<Running, Refusal> {
    if spec.ports.is_empty() {
        return Err(refuse(
            400,
            format!(
                "a {} service is bound to packet ports: give them as `ports` (`--port CH=SPEC`)",
                kind.name()
            ),
        ));
    }
    if !spec.listen.is_empty() || !spec.connect.is_empty() {
        return Err(refuse(
            400,
            "a service on packet ports takes no `listen` or `connect`: every channel is bound to a port",
        ));
    }
    if spec.config.is_some() {
        return Err(refuse(
            400,
            "a service on packet ports takes no configuration file; give its ports as `ports`",
        ));
    }
    let started = Instant::now();
    let mut running = match kind {
        Kind::Packet => start_packet(spec, dumps)?,
        Kind::Machine => start_machine(spec)?,
    };
    running.deploy_us = started.elapsed().as_micros() as u64;
    Ok(running)
}

fn file_name(spec: &DeploySpec) -> String {
    if spec.file.is_empty() {
        format!("{}.flick", spec.name)
    } else {
        spec.file.clone()
    }
}

fn start_packet(spec: &DeploySpec, dumps: &Path) -> Result<Running, Refusal> {
    let super::Checked {
        file_name,
        file,
        program,
        checked,
    } = super::check_deployed(spec)?;
    let path = Path::new(&file_name);
    if checked.processes.len() != 1 {
        return Err(refuse(
            422,
            format!(
                "a service runs one process, and {file_name} has {}",
                checked.processes.len()
            ),
        ));
    }
    if checked.grammar.as_deref() != Some("packet") {
        return Err(refuse(
            422,
            format!("{file_name} is not over the `packet` grammar: only packet programs and machines are bound to ports"),
        ));
    }
    let grammar = crate::views::find_grammar("packet", path).map_err(|why| refuse(422, why))?;
    let mut loaded = flick_platform::Loaded::new(&program, &checked, grammar)
        .map_err(|e| refuse(422, e.to_string()))?;
    loaded.source = Some(Arc::new(file.clone()));
    let bounds = &checked.processes[0].bounds;
    let reserved = bounds.instance_bytes.saturating_add(bounds.global_bytes);
    let dump_request = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(flick_packet::LiveStats::default());
    let dump_path = dumps.join(format!("{}.dump.json", spec.name));
    let config = PacketConfig {
        workers: 1,
        dump_request: Some(dump_request.clone()),
        dump_path: Some(dump_path.clone()),
        stats: Some(stats.clone()),
        control: Some(Arc::default()),
        ..PacketConfig::default()
    };
    let process = &checked.processes[0];
    let state = PacketState {
        vars: crate::reload::state_vars(process),
        keys: process
            .state
            .iter()
            .map(|v| {
                let key = match &v.ty {
                    flick_check::Ty::Dict(key, ..) => match &**key {
                        flick_check::Ty::Int { .. } => Some(Scalar::Int),
                        flick_check::Ty::Str { .. } | flick_check::Ty::Bytes { .. } => {
                            Some(Scalar::Bytes)
                        }
                        _ => None,
                    },
                    _ => None,
                };
                (v.name.clone(), key)
            })
            .collect(),
        config: config.clone(),
    };
    let service = PacketService::new(loaded, config).map_err(|e| refuse(422, e.to_string()))?;
    let mut bound = Vec::new();
    for flag in &spec.ports {
        let (c, specs) = crate::packet_run::parse_port_flag(flag).map_err(|e| refuse(400, e))?;
        bound.push((c, specs));
    }
    let uses: Vec<(String, Vec<PortUse>)> = bound
        .iter()
        .map(|(n, specs)| {
            (
                n.clone(),
                specs.iter().map(crate::packet_run::port_use).collect(),
            )
        })
        .collect();
    service
        .check_bindings(&uses)
        .map_err(|e| refuse(400, e.to_string()))?;
    let mut bindings = Vec::new();
    for (channel, specs) in bound {
        let mut ports = Vec::new();
        for spec in specs {
            let port = flick_packet_io::open(&spec)
                .map_err(|e| refuse(409, format!("--port {channel}={spec}: {e}")))?;
            ports.push(BoundPort {
                spec: spec.to_string(),
                port,
                live: spec.is_live(),
            });
        }
        bindings.push(Binding { channel, ports });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let finished = Arc::new(AtomicBool::new(false));
    let ending = finished.clone();
    let thread = std::thread::Builder::new()
        .name(format!("flick-packet-{}", spec.name))
        .spawn(move || {
            let ended = service
                .run(bindings, &stopping)
                .map(|s| (s.line(), Some(s.state)))
                .map_err(|e| e.to_string());
            ending.store(true, Ordering::Release);
            ended
        })
        .map_err(|e| refuse(500, format!("cannot start the packet thread: {e}")))?;
    Ok(Running {
        spec: spec.clone(),
        kind: Kind::Packet,
        reserved,
        version: 1,
        deploy_us: 0,
        carried: Vec::new(),
        stop,
        thread: Some(thread),
        finished,
        dump_request,
        dump_path,
        packet_stats: Some(stats),
        machine: None,
        state: Some(Arc::new(state)),
    })
}

/// A machine's program from a request's text: Flick's `machine`, or XL
/// (whose imports are read from beside `file`).
fn machine_of(file: &str, text: &str) -> Result<(flick_machine::Machine, Vec<String>), Refusal> {
    if file.ends_with(".xl") {
        let main = PathBuf::from(file);
        let read = |p: &Path| {
            if p == main {
                Ok(text.to_string())
            } else {
                std::fs::read_to_string(p)
            }
        };
        return flick_machine::xl::load_with(&main, &read)
            .map(|m| (m, Vec::new()))
            .map_err(|e| Refusal {
                status: 422,
                message: format!("{file} does not check"),
                diagnostics: Some(format!("{e}")),
            });
    }
    match flick_machine::lang::compile(text) {
        Ok(l) => Ok((l.machine, l.channels)),
        Err(diags) => {
            let src = flick_span::SourceFile::new(file, text.to_string());
            Err(Refusal {
                status: 422,
                message: format!("{file} does not check"),
                diagnostics: Some(crate::render::render(&src, &diags, false)),
            })
        }
    }
}

/// The flow tables' bytes, for one worker: what its engine allocates.
fn machine_bytes(program: &Program) -> u64 {
    program.table_bytes() as u64
}

fn start_machine(spec: &DeploySpec) -> Result<Running, Refusal> {
    let file = file_name(spec);
    let (machine, channels) = machine_of(&file, &spec.program)?;
    let program = Arc::new(Program::new(machine).map_err(|e| refuse(422, format!("{file}: {e}")))?);
    let mut service =
        MachineService::new(program.clone(), 1).map_err(|e| refuse(422, format!("{file}: {e}")))?;
    let (inputs, outputs) =
        crate::machine_run::open_ports(&spec.ports, &channels).map_err(|e| refuse(400, e))?;
    let reserved = machine_bytes(&program) * service.workers() as u64;
    let dump_request = Arc::new(AtomicBool::new(false));
    let dumped = Arc::new(Mutex::new(None));
    let sink = dumped.clone();
    service.dump_on(
        dump_request.clone(),
        Box::new(move |d| *sink.lock().expect("dump slot") = Some(d.json())),
    );
    let (swap_tx, swaps) = flick_machine::swap_channel();
    let loader = TableLoader::new(program.clone(), service.workers(), swap_tx);
    let control = service.control();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let finished = Arc::new(AtomicBool::new(false));
    let ending = finished.clone();
    let stats = service.stats();
    let thread = std::thread::Builder::new()
        .name(format!("flick-machine-{}", spec.name))
        .spawn(move || {
            let ended = service
                .run(inputs, outputs, &stopping, Some(swaps))
                .map(|s| (s.line(), None))
                .map_err(|e| e.to_string());
            ending.store(true, Ordering::Release);
            ended
        })
        .map_err(|e| refuse(500, format!("cannot start the machine's thread: {e}")))?;
    Ok(Running {
        spec: spec.clone(),
        kind: Kind::Machine,
        reserved,
        version: 1,
        deploy_us: 0,
        carried: Vec::new(),
        stop,
        thread: Some(thread),
        finished,
        dump_request,
        dump_path: PathBuf::new(),
        packet_stats: None,
        state: None,
        machine: Some(MachineParts {
            program: Arc::new(Mutex::new(program)),
            loader: Mutex::new(loader),
            stats,
            dumped,
            channels,
            table_text: Mutex::new((file, spec.program.clone())),
            control,
        }),
    })
}

impl Running {
    /// Whether its threads still run (a pcap input that ended stops them).
    pub fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops its threads and closes its ports; what the run said.
    pub fn stop(self) -> Json {
        self.stop_keeping().0
    }

    /// Stops it as [`Running::stop`] does; what the run said, and its
    /// final state with the types it was declared with (a packet
    /// program's), for a new version to take over.
    pub fn stop_keeping(mut self) -> (Json, Option<Carried>) {
        let started = Instant::now();
        self.stop.store(true, Ordering::Relaxed);
        let mut carried = None;
        let summary = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Ok((line, state)))) => {
                carried = state.zip(self.state.take()).map(|(values, s)| Carried {
                    vars: s.vars.clone(),
                    values,
                });
                json!(line)
            }
            Some(Ok(Err(e))) => json!(format!("error: {e}")),
            Some(Err(_)) => json!("the service's thread panicked"),
            None => Json::Null,
        };
        let _ = std::fs::remove_file(&self.dump_path);
        let answer = json!({
            "name": self.spec.name,
            "drained": true,
            "clients_left": 0,
            "summary": summary,
            "stop_us": started.elapsed().as_micros() as u64,
        });
        (answer, carried)
    }

    /// A machine redeployed with the same ports: its tables replaced, flow
    /// contexts kept. `None`: not such a redeploy (the caller restarts it).
    pub fn replace_tables(&mut self, spec: &DeploySpec) -> Option<Result<Json, Refusal>> {
        let m = self.machine.as_ref()?;
        if spec.ports != self.spec.ports || kind_of(spec) != Some(Kind::Machine) || !self.running()
        {
            return None;
        }
        let started = Instant::now();
        let file = file_name(spec);
        let outcome = m.load(&file, &spec.program);
        Some(outcome.map(|micros| {
            self.spec = spec.clone();
            self.version += 1;
            self.deploy_us = started.elapsed().as_micros() as u64;
            json!({
                "name": spec.name,
                "version": self.version,
                "listen": "",
                "deploy_us": self.deploy_us,
                "swap_us": micros,
                "reserved_bytes": self.reserved,
                "carried": ["flow contexts"],
                "weight": super::DEFAULT_WEIGHT,
            })
        }))
    }

    /// A line of `GET /services`.
    pub fn list_entry(&self) -> Json {
        json!({
            "name": self.spec.name,
            "file": self.spec.file,
            "kind": self.kind.name(),
            "listen": "",
            "ports": self.spec.ports,
            "version": self.version,
            "clients": 0,
            "instances": 0,
            "reserved_bytes": self.reserved,
            "weight": super::DEFAULT_WEIGHT,
            "running": self.running(),
        })
    }

    /// `GET /services/NAME`: ports with their frames, flow table fill and
    /// counters.
    pub fn status(&self) -> Json {
        let mut ports = Vec::new();
        let mut counters = json!({});
        let mut tables = Vec::new();
        if let Some(stats) = &self.packet_stats {
            let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            for p in stats.ports() {
                ports.push(json!({
                    "port": p.name,
                    "rx_frames": r(&p.rx_frames),
                    "tx_frames": r(&p.tx_frames),
                    "drops": r(&p.rx_drops) + r(&p.rx_overflow) + r(&p.tx_errors),
                }));
            }
            counters = json!({
                "dropped": stats.workers_sum(|w| &w.dropped),
                "malformed": r(&stats.malformed),
                "faults": stats.workers_sum(|w| &w.faults) + r(&stats.steer_faults),
                "dict_full": stats.workers_sum(|w| &w.dict_full),
                "table_evicted": stats.workers_sum(|w| &w.table_evicted),
                "table_expired": stats.workers_sum(|w| &w.table_expired),
            });
        }
        if let Some(m) = &self.machine {
            let s = &m.stats;
            let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            let program = m.program.lock().expect("program lock").clone();
            let mut numbers: Vec<u8> = Vec::new();
            for flag in &self.spec.ports {
                if let Ok((name, _)) = PortSpec::parse_named(flag) {
                    if let Some(n) = m.port_number(&name) {
                        numbers.push(n);
                    }
                }
            }
            numbers.sort();
            numbers.dedup();
            for n in numbers {
                let i = n as usize;
                let name = m
                    .channels
                    .get(i - 1)
                    .cloned()
                    .unwrap_or_else(|| n.to_string());
                ports.push(json!({
                    "port": name,
                    "rx_frames": s.received.get(i).map_or(0, r),
                    "tx_frames": s.sent.get(i).map_or(0, r),
                    "drops": s.dropped_from.get(i).map_or(0, r),
                }));
            }
            for (i, st) in program.machine.stages.iter().enumerate() {
                if st.stateless() {
                    continue;
                }
                let slots = flick_machine::flows::FlowTable::new(st.capacity, 0, 0).capacity();
                tables.push(json!({
                    "stage": st.name,
                    "contexts": s.contexts(i),
                    "capacity": slots,
                }));
            }
            counters = json!({
                "unbound": r(&s.unbound),
                "not_sent": r(&s.not_sent),
                "rx_drops": r(&s.rx_drops),
                "unparsed": r(&s.unparsed),
                "table_full": s.workers_sum(|w| &w.table_full),
                "evicted": s.workers_sum(|w| &w.evicted),
                "expired": s.workers_sum(|w| &w.expired),
                "table_swaps": s.workers_sum(|w| &w.swaps),
            });
        }
        json!({
            "name": self.spec.name,
            "file": self.spec.file,
            "kind": self.kind.name(),
            "version": self.version,
            "deploy_us": self.deploy_us,
            "carried": self.carried,
            "weight": super::DEFAULT_WEIGHT,
            "running": self.running(),
            "bindings": { "ports": self.spec.ports },
            "listen": "",
            "reserved_bytes": self.reserved,
            "clients": 0,
            "instances": 0,
            "ports": ports,
            "flow_tables": tables,
            "counters": counters,
        })
    }

    /// What a state request needs of it, to use once the registry's lock
    /// is let go.
    pub fn handle(&self) -> StateHandle {
        StateHandle {
            name: self.spec.name.clone(),
            finished: self.finished.clone(),
            dump_request: self.dump_request.clone(),
            dump_path: self.dump_path.clone(),
            dumped: self.machine.as_ref().map(|m| m.dumped.clone()),
            packet: self.state.clone(),
            machine: self.machine.as_ref().map(|m| {
                let program = m.program.lock().expect("program lock").clone();
                (m.control.clone(), program)
            }),
        }
    }

    /// `GET /services/NAME/state/table`: a machine's running tables.
    pub fn read_table(&self) -> Result<Json, Refusal> {
        let m = self
            .machine
            .as_ref()
            .ok_or_else(|| refuse(404, "only a machine has a `table`"))?;
        let program = m.program.lock().expect("program lock").clone();
        let (file, text) = m.table_text.lock().expect("table text").clone();
        let stages: Vec<Json> = program
            .machine
            .stages
            .iter()
            .zip(&program.tables)
            .map(|(st, t)| {
                json!({
                    "stage": st.name,
                    "states": st.states,
                    "conditions": t.conditions.len(),
                    "entries": t.entries.len(),
                    "rows": t.row_count(),
                })
            })
            .collect();
        Ok(json!({ "path": "table", "file": file, "value": text, "stages": stages }))
    }

    /// `PUT /services/NAME/state/table`: a machine's tables replaced from
    /// a program's text (`{"file": F, "program": TEXT}`), atomically
    /// between two frames.
    pub fn write_table(&mut self, body: &[u8]) -> Result<Json, Refusal> {
        let Some(m) = &self.machine else {
            return Err(refuse(
                404,
                "only a machine has a `table`: a packet program's state is its `global` variables",
            ));
        };
        let j: Json = serde_json::from_slice(body)
            .map_err(|e| refuse(400, format!("the body is not JSON: {e}")))?;
        let text = j["program"]
            .as_str()
            .ok_or_else(|| refuse(400, "give the table as {\"file\": NAME, \"program\": TEXT}"))?;
        let file = j["file"].as_str().unwrap_or(&self.spec.file).to_string();
        let micros = m.load(&file, text)?;
        self.spec.program = text.to_string();
        Ok(json!({ "path": "table", "value": file, "applied": true, "micros": micros }))
    }
}

/// A running service's parts that a state read or write reaches, taken
/// under the registry's lock ([`Running::handle`]) and used after it is
/// let go: a dump or a write waits for the service's threads (seconds, if
/// they are stuck), and no other request may wait behind that.
pub struct StateHandle {
    name: String,
    finished: Arc<AtomicBool>,
    dump_request: Arc<AtomicBool>,
    /// Where a packet program's dumps are written.
    dump_path: PathBuf,
    /// A machine's latest dump.
    dumped: Option<Arc<Mutex<Option<String>>>>,
    packet: Option<Arc<PacketState>>,
    /// A machine's control queue and the program it runs.
    machine: Option<(MachineControl, Arc<Program>)>,
}

impl StateHandle {
    fn stopped(&self) -> Refusal {
        refuse(
            409,
            format!("service `{}` has stopped (its inputs ended)", self.name),
        )
    }

    fn check_running(&self) -> Result<(), Refusal> {
        if self.finished.load(Ordering::Acquire) {
            return Err(self.stopped());
        }
        Ok(())
    }

    /// The state as JSON, taken between two frames without stopping.
    fn dump(&self) -> Result<Json, Refusal> {
        self.check_running()?;
        let deadline = Instant::now() + DUMP_TIMEOUT;
        let text = match &self.dumped {
            Some(dumped) => {
                *dumped.lock().expect("dump slot") = None;
                self.dump_request.store(true, Ordering::Relaxed);
                loop {
                    if let Some(t) = dumped.lock().expect("dump slot").take() {
                        break t;
                    }
                    if self.finished.load(Ordering::Acquire) {
                        return Err(self.stopped());
                    }
                    if Instant::now() > deadline {
                        return Err(refuse(
                            503,
                            "the machine did not answer for its state in time",
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            None => {
                // The engine renames its dump into place: present is whole.
                let _ = std::fs::remove_file(&self.dump_path);
                self.dump_request.store(true, Ordering::Relaxed);
                loop {
                    if let Ok(t) = std::fs::read_to_string(&self.dump_path) {
                        break t;
                    }
                    if self.finished.load(Ordering::Acquire) {
                        return Err(self.stopped());
                    }
                    if Instant::now() > deadline {
                        return Err(refuse(
                            503,
                            "the program did not answer for its state in time",
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        };
        serde_json::from_str(&text).map_err(|e| refuse(500, format!("the dump is not JSON: {e}")))
    }

    /// `GET /services/NAME/state/PATH`: `dump` (all of it) or a path into
    /// the dump (`globals/R`, `stages/S`, `stages/S/N`, a machine's
    /// `stages/S/flows/KEY`, a packet program's `globals/G`, ...).
    pub fn read(&self, path: &str, key: Option<&[u8]>) -> Result<Json, Refusal> {
        let dump = self.dump()?;
        if path == "dump" {
            return Ok(json!({ "path": path, "value": dump }));
        }
        let no_such = || {
            refuse(
                404,
                format!(
                    "no `{path}` in the state of `{}` (read `dump` for all of it)",
                    self.name
                ),
            )
        };
        let mut at = &dump;
        let mut segments: Vec<&str> = path.split('/').collect();
        if let Some(key) = key {
            // An entry named by `key_base64`, as the dump's text shows it.
            let var = path.strip_prefix("globals/").unwrap_or(path);
            segments = vec!["globals", var];
            let text = String::from_utf8_lossy(key).into_owned();
            let shown = if key.iter().all(|c| (0x20..0x7f).contains(c)) {
                text
            } else {
                let hex: String = key.iter().map(|c| format!("{c:02x}")).collect();
                format!("0x{hex}")
            };
            let entries = segments.iter().try_fold(at, |at, seg| at.get(seg));
            let value = entries.and_then(|e| e.get(&shown)).ok_or_else(no_such)?;
            return Ok(json!({ "path": path, "value": value }));
        }
        if let (Some((_, program)), ["stages", stage, "flows", key, rest @ ..]) =
            (&self.machine, segments.as_slice())
        {
            let (s, flow) = flow_key(&self.name, program, stage, key)?;
            let shown = context_of(&dump, program, s, &flow).ok_or_else(|| {
                refuse(
                    404,
                    format!(
                        "stage `{stage}` of `{}` has no flow context under `{key}`",
                        self.name
                    ),
                )
            })?;
            at = shown;
            segments = rest.to_vec();
        }
        for seg in segments {
            at = match at {
                Json::Object(o) => o.get(seg),
                Json::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            }
            .ok_or_else(no_such)?;
        }
        Ok(json!({ "path": path, "value": at }))
    }

    /// `PUT /services/NAME/state/PATH` (or `state/VAR?key_base64=KEY`): a
    /// packet program's global or entry, a machine's global register or a
    /// flow context's register or state.
    pub fn write(&self, path: &str, key: Option<&[u8]>, body: &[u8]) -> Result<Json, Refusal> {
        self.check_running()?;
        if let Some(state) = &self.packet {
            return state.write(&self.name, path, key, body);
        }
        let Some((control, program)) = &self.machine else {
            return Err(refuse(
                422,
                format!("`{path}`: this service has no state to write"),
            ));
        };
        let segments: Vec<&str> = path.split('/').collect();
        let (op, shown) = match segments.as_slice() {
            ["globals", reg] => {
                let i = program
                    .machine
                    .globals
                    .iter()
                    .position(|g| g.name == *reg)
                    .ok_or_else(|| {
                        refuse(
                            404,
                            format!(
                                "`{reg}` is not a global register of `{}` (its registers: {})",
                                self.name,
                                names(program.machine.globals.iter().map(|g| &g.name))
                            ),
                        )
                    })?;
                let value = register_value(reg, body)?;
                let op = ControlOp::Global {
                    reg: i as u16,
                    value,
                };
                (op, json!(value))
            }
            ["stages", stage, "flows", key, "registers", reg] => {
                let (s, flow) = flow_key(&self.name, program, stage, key)?;
                let st = &program.machine.stages[s];
                let r = st
                    .flow_regs
                    .iter()
                    .position(|g| g.name == *reg)
                    .ok_or_else(|| {
                        refuse(
                            404,
                            format!(
                                "`{reg}` is not a flow register of stage `{stage}` (its registers: {})",
                                names(st.flow_regs.iter().map(|g| &g.name))
                            ),
                        )
                    })?;
                let value = register_value(reg, body)?;
                (
                    flow_op(s, &flow, FlowEdit::Register(r as u16, value)),
                    json!(value),
                )
            }
            ["stages", stage, "flows", key, "state"] => {
                let (s, flow) = flow_key(&self.name, program, stage, key)?;
                let st = &program.machine.stages[s];
                let j = body_value(body)?;
                let given = j.as_str().ok_or_else(|| {
                    refuse(
                        400,
                        format!("a flow context's state is a state's name as a string, not {j}"),
                    )
                })?;
                let state = st.states.iter().position(|n| n == given).ok_or_else(|| {
                    refuse(
                        400,
                        format!(
                            "`{given}` is not a state of stage `{stage}` (its states: {})",
                            names(st.states.iter())
                        ),
                    )
                })?;
                (
                    flow_op(s, &flow, FlowEdit::State(state as u16)),
                    json!(given),
                )
            }
            _ => {
                return Err(refuse(
                    422,
                    format!("`{path}`: of a machine, `table`, `globals/REGISTER`, `stages/STAGE/flows/KEY/registers/REGISTER` and `stages/STAGE/flows/KEY/state` are written"),
                ))
            }
        };
        apply_to_flow(control, op, &self.name, path)?;
        tracing::info!(service = %self.name, path = %path, value = %shown, "machine state written");
        Ok(json!({ "path": path, "value": shown, "applied": true }))
    }

    /// `DELETE /services/NAME/state/PATH`: a packet program's entry
    /// (`VAR/KEY`, or `VAR` and `key_base64`) or a machine's flow context
    /// (`stages/STAGE/flows/KEY`).
    pub fn delete(&self, path: &str, key: Option<&[u8]>) -> Result<Json, Refusal> {
        self.check_running()?;
        if let Some(state) = &self.packet {
            return state.delete(&self.name, path, key);
        }
        let Some((control, program)) = &self.machine else {
            return Err(refuse(
                422,
                format!("`{path}`: this service has no state to delete"),
            ));
        };
        let segments: Vec<&str> = path.split('/').collect();
        let ["stages", stage, "flows", key] = segments.as_slice() else {
            return Err(refuse(
                422,
                format!("`{path}`: of a machine, only flow contexts are deleted, as stages/STAGE/flows/KEY"),
            ));
        };
        let (s, flow) = flow_key(&self.name, program, stage, key)?;
        apply_to_flow(
            control,
            flow_op(s, &flow, FlowEdit::Remove),
            &self.name,
            path,
        )?;
        tracing::info!(service = %self.name, path = %path, "flow context deleted");
        Ok(json!({ "path": path, "deleted": true }))
    }
}

/// Queues `op` on a machine's workers and waits for them to apply it:
/// refused where no worker holds the flow it names.
fn apply_to_flow(
    control: &MachineControl,
    op: ControlOp,
    service: &str,
    path: &str,
) -> Result<(), Refusal> {
    let held = control
        .queue(op)
        .and_then(|pending| pending.wait(WRITE_TIMEOUT))
        .map_err(|e| control_refusal(path, e))?;
    if held == 0 {
        return Err(no_flow(service, path));
    }
    Ok(())
}

/// Waits for a queued write to a packet program's dictionary; `untouched`
/// says why a write that no shard applied is refused.
fn wait_entry_write(
    queued: Result<flick_packet::PendingWrite, flick_packet::WriteError>,
    untouched: impl FnOnce() -> flick_packet::WriteError,
    path: &str,
) -> Result<(), Refusal> {
    queued
        .and_then(|pending| pending.wait(WRITE_TIMEOUT))
        .and_then(|n| match n {
            0 => Err(untouched()),
            _ => Ok(()),
        })
        .map_err(|e| refuse(e.status(), format!("`{path}`: {e}")))
}

fn control_refusal(path: &str, e: ControlError) -> Refusal {
    let status = match e {
        ControlError::NotRunning => 409,
        ControlError::Busy | ControlError::Timeout => 503,
    };
    refuse(status, format!("`{path}`: {e}"))
}

fn no_flow(service: &str, path: &str) -> Refusal {
    refuse(
        404,
        format!(
            "`{path}`: `{service}` has no such flow context (read the stage for the keys it holds)"
        ),
    )
}

fn names<'a>(all: impl Iterator<Item = &'a String>) -> String {
    let all: Vec<&str> = all.map(String::as_str).collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(", ")
    }
}

/// A register's new value from a request's body: a JSON integer that fits
/// 64 bits unsigned, as registers are.
fn register_value(reg: &str, body: &[u8]) -> Result<u64, Refusal> {
    let j = body_value(body)?;
    j.as_u64().ok_or_else(|| {
        refuse(
            400,
            format!("`{reg}` is a register of 64 bits: give an integer from 0 to 2^64-1, not {j}"),
        )
    })
}

/// A request body's value: `{"value": V}` (as `flick ctl` sends it) or V.
fn body_value(body: &[u8]) -> Result<Json, Refusal> {
    let j: Json = serde_json::from_slice(body)
        .map_err(|e| refuse(400, format!("the body is not JSON: {e}")))?;
    Ok(match j {
        Json::Object(mut o) if o.len() == 1 && o.contains_key("value") => {
            o.remove("value").unwrap_or(Json::Null)
        }
        j => j,
    })
}

fn flow_op(stage: usize, key: &[u64], edit: FlowEdit) -> ControlOp {
    let mut k = [0; flick_machine::model::MAX_KEY];
    k[..key.len()].copy_from_slice(key);
    ControlOp::Flow {
        stage: stage as u16,
        key: k,
        len: key.len() as u8,
        edit,
    }
}

/// A stage's index and a flow key from a path's text: the key's fields'
/// values in the stage's order, separated by commas, each a decimal or
/// `0x` hexadecimal integer or a dotted IPv4 address, optionally named
/// (`ipv4.src=10.0.0.1,...`, in any order then).
fn flow_key(
    service: &str,
    program: &Program,
    stage: &str,
    text: &str,
) -> Result<(usize, Vec<u64>), Refusal> {
    let m = &program.machine;
    let s = m
        .stages
        .iter()
        .position(|st| st.name == stage)
        .ok_or_else(|| {
            refuse(
                404,
                format!(
                    "`{stage}` is not a stage of `{service}` (its stages: {})",
                    names(m.stages.iter().map(|st| &st.name))
                ),
            )
        })?;
    let st = &m.stages[s];
    if st.stateless() {
        return Err(refuse(
            404,
            format!("stage `{stage}` has no flow key, so it keeps no flow contexts"),
        ));
    }
    let fields: Vec<&str> = st
        .key
        .iter()
        .map(|&f| m.fields[f as usize].name.as_str())
        .collect();
    let wanted = || {
        refuse(
            400,
            format!(
                "a flow key of stage `{stage}` is {} values, {} in that order, separated by commas (or each as FIELD=VALUE), not `{text}`",
                fields.len(),
                fields.join(", ")
            ),
        )
    };
    let parts: Vec<&str> = text.split(',').collect();
    if parts.len() != fields.len() {
        return Err(wanted());
    }
    let mut key = vec![None; fields.len()];
    for (i, part) in parts.iter().enumerate() {
        let (at, value) = match part.split_once('=') {
            Some((name, v)) => (
                fields.iter().position(|f| f == &name).ok_or_else(wanted)?,
                v,
            ),
            None => (i, *part),
        };
        let v = key_value(value).ok_or_else(wanted)?;
        if key[at].replace(v).is_some() {
            return Err(wanted());
        }
    }
    let key = key
        .into_iter()
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(wanted)?;
    Ok((s, key))
}

fn key_value(text: &str) -> Option<u64> {
    if let Some(hex) = text.strip_prefix("0x") {
        return u64::from_str_radix(hex, 16).ok();
    }
    if text.contains('.') {
        return text
            .parse::<std::net::Ipv4Addr>()
            .ok()
            .map(|a| u32::from(a) as u64);
    }
    text.parse().ok()
}

/// The context of stage `s` under `key` (either way round for a biflow
/// key) as a dump shows it.
fn context_of<'d>(dump: &'d Json, program: &Program, s: usize, key: &[u64]) -> Option<&'d Json> {
    let m = &program.machine;
    let st = &m.stages[s];
    let mut other = key.to_vec();
    if st.biflow {
        let h = other.len() / 2;
        let (a, b) = other.split_at_mut(h);
        a.swap_with_slice(b);
    }
    dump["stages"][&st.name].as_array()?.iter().find(|c| {
        let held: Option<Vec<u64>> = st
            .key
            .iter()
            .map(|&f| c["key"][&m.fields[f as usize].name].as_u64())
            .collect();
        held.is_some_and(|h| h == key || h == other)
    })
}

impl MachineParts {
    fn port_number(&self, name: &str) -> Option<u8> {
        match self.channels.iter().position(|c| c == name) {
            Some(i) => Some(i as u8 + 1),
            None => name.parse().ok(),
        }
    }

    /// Checks a program's text against the running tables and hands it
    /// over; the micros it took.
    fn load(&self, file: &str, text: &str) -> Result<u64, Refusal> {
        let (machine, _) = machine_of(file, text)?;
        let outcome = self
            .loader
            .lock()
            .expect("loader lock")
            .load_machine(file, machine);
        match outcome.error {
            Some(e) => Err(refuse(409, e)),
            None => {
                *self.program.lock().expect("program lock") =
                    self.loader.lock().expect("loader lock").running();
                *self.table_text.lock().expect("table text") = (file.to_string(), text.to_string());
                Ok(outcome.micros)
            }
        }
    }
}

/// A stopped packet program's final `global` state, with the types it
/// declared, for the version replacing it.
pub struct Carried {
    vars: Vec<StateVar>,
    values: serde_json::Map<String, Json>,
}

impl Carried {
    /// As saved in the state directory: each global's declared type and
    /// its value as the dump shows it.
    pub fn to_saved(&self) -> Json {
        let mut out = serde_json::Map::new();
        for var in self.vars.iter().filter(|v| v.global) {
            if let Some(v) = self.values.get(&var.name) {
                out.insert(var.name.clone(), json!({ "type": var.ty, "value": v }));
            }
        }
        Json::Object(out)
    }

    /// What [`Carried::to_saved`] wrote; `None` if it is not that.
    pub fn from_saved(saved: &Json) -> Option<Carried> {
        let mut vars = Vec::new();
        let mut values = serde_json::Map::new();
        for (name, entry) in saved.as_object()? {
            vars.push(StateVar {
                name: name.clone(),
                ty: entry["type"].as_str()?.to_string(),
                global: true,
                dict: None,
                scalar: None,
            });
            values.insert(name.clone(), entry["value"].clone());
        }
        Some(Carried { vars, values })
    }
}

/// Bytes from a dump's text for them: `0x` and hex digits where they were
/// not printable (see the packet crate's `state::text`), else the text.
fn dumped_bytes(text: &str) -> Vec<u8> {
    let hex = text
        .strip_prefix("0x")
        .filter(|h| !h.is_empty() && h.len() % 2 == 0 && h.bytes().all(|c| c.is_ascii_hexdigit()));
    match hex {
        Some(h) => (0..h.len())
            .step_by(2)
            .filter_map(|i| u8::from_str_radix(&h[i..i + 2], 16).ok())
            .collect(),
        None => text.as_bytes().to_vec(),
    }
}

/// A scalar from a dump's JSON, of the kind declared.
fn dumped_value(kind: Scalar, j: &Json) -> Option<flick_exec::Value> {
    use flick_exec::Value;
    match (kind, j) {
        (Scalar::Int, Json::Number(n)) => n.as_i64().map(Value::Int),
        (Scalar::Bool, Json::Bool(b)) => Some(Value::Bool(*b)),
        (Scalar::Bytes, Json::String(t)) => Some(Value::Bytes(dumped_bytes(t).into())),
        _ => None,
    }
}

impl PacketState {
    fn var(&self, service: &str, name: &str) -> Result<&StateVar, Refusal> {
        self.vars
            .iter()
            .find(|v| v.name == name && v.global)
            .ok_or_else(|| refuse(404, format!("`{name}` is not global state of `{service}`")))
    }

    fn key_kind(&self, name: &str) -> Option<Scalar> {
        self.keys.iter().find(|(n, _)| n == name).and_then(|k| k.1)
    }

    /// The control of the run going, once it has taken it.
    fn control(&self) -> Result<&flick_packet::StateControl, Refusal> {
        let control = self
            .config
            .control
            .as_ref()
            .ok_or_else(|| refuse(500, "the program takes no state writes"))?;
        // Just deployed, its run may not have taken the control yet.
        if !control.wait_running(WRITE_TIMEOUT) {
            return Err(refuse(503, "the program did not start in time"));
        }
        Ok(control)
    }

    /// A dictionary's key from a path's text or `key_base64`, of the kind
    /// its type declares.
    fn key_of(&self, name: &str, var: &StateVar, key: &[u8]) -> Result<flick_exec::Value, Refusal> {
        use flick_exec::Value;
        let shown = String::from_utf8_lossy(key);
        match self.key_kind(name) {
            Some(Scalar::Int) => Ok(Value::Int(shown.parse().map_err(|_| {
                refuse(400, format!("a key of `{name}` is an integer, not `{shown}`"))
            })?)),
            Some(_) => Ok(Value::Bytes(key.into())),
            None => Err(refuse(
                422,
                format!("the keys of `{name}` ({}) are neither integers nor strings: its entries are not written through the API", var.ty),
            )),
        }
    }

    /// `DELETE state/VAR/KEY` (or `state/VAR` and `key_base64`): the entry
    /// removed from the shard that holds it.
    fn delete(&self, service: &str, path: &str, key: Option<&[u8]>) -> Result<Json, Refusal> {
        let path = path.strip_prefix("globals/").unwrap_or(path);
        let (name, key) = match (key, path.split_once('/')) {
            (Some(k), None) => (path, k),
            (None, Some((name, k))) => (name, k.as_bytes()),
            _ => {
                return Err(refuse(
                    400,
                    format!("`{path}`: a packet program's dictionary entries are deleted as state/VAR/KEY (or state/VAR?key_base64=KEY); its other globals are not deleted"),
                ))
            }
        };
        let var = self.var(service, name)?;
        if var.dict.is_none() {
            return Err(refuse(
                400,
                format!(
                    "`{name}` is a {}, not a dictionary: it has no entries to delete",
                    var.ty
                ),
            ));
        }
        let key_value = self.key_of(name, var, key)?;
        let control = self.control()?;
        wait_entry_write(
            control.queue_delete(name, &key_value),
            || flick_packet::WriteError::NoEntry(name.into()),
            path,
        )?;
        tracing::info!(service = %service, dictionary = %name, key = %String::from_utf8_lossy(key), "dictionary entry deleted");
        let mut answer = super::entry_answer(name, key);
        answer["deleted"] = json!(true);
        Ok(answer)
    }

    /// `PUT state/VAR` (a scalar global, in every worker's shard) or
    /// `PUT state/VAR/KEY` (an entry, in the shard owning the key; or
    /// `state/VAR` and `key_base64`), checked against the declared types
    /// as a socket service's are.
    fn write(
        &self,
        service: &str,
        path: &str,
        key: Option<&[u8]>,
        body: &[u8],
    ) -> Result<Json, Refusal> {
        use flick_exec::Value;
        // Read paths name globals under `globals/`; a write may too.
        let path = path.strip_prefix("globals/").unwrap_or(path);
        let split = match key {
            Some(_) if path.contains('/') => {
                return Err(refuse(
                    400,
                    format!("`key_base64` names an entry of a dictionary: give the path as state/VAR, not `{path}`"),
                ))
            }
            Some(k) => Some((path, k)),
            None => path.split_once('/').map(|(n, k)| (n, k.as_bytes())),
        };
        let Some((name, key)) = split else {
            let control = self.control()?;
            let var = self.var(service, path)?;
            if var.dict.is_some() {
                return Err(refuse(
                    400,
                    format!(
                        "`{path}` is a {}, not a value: write an entry at state/{path}/KEY",
                        var.ty
                    ),
                ));
            }
            let (j, value) = super::scalar_of(&self.vars, path, body)?;
            let value = match value {
                flick_platform::StateValue::Int(n) => Value::Int(n),
                flick_platform::StateValue::Bool(b) => Value::Bool(b),
                flick_platform::StateValue::Bytes(b) => Value::Bytes(b.into()),
                _ => return Err(refuse(400, "give an integer, a boolean or a string")),
            };
            control
                .queue_global(path, value)
                .and_then(|pending| pending.wait(WRITE_TIMEOUT))
                .map_err(|e| refuse(e.status(), format!("`{path}`: {e}")))?;
            tracing::info!(service = %service, global = %path, value = %j, "state written");
            return Ok(json!({ "path": path, "value": j }));
        };
        let var = self.var(service, name)?;
        let (kind, max) = match &var.dict {
            Some(DictOf::Values(kind, max)) => (*kind, *max),
            Some(_) => {
                return Err(refuse(
                    422,
                    format!("`{name}` is a {}: a packet service's entries are written where they are integers, booleans or strings", var.ty),
                ))
            }
            None => {
                return Err(refuse(
                    400,
                    format!("`{name}` is a {}, not a dictionary: write it at state/{name}", var.ty),
                ))
            }
        };
        let key_value = self.key_of(name, var, key)?;
        let j: Json = serde_json::from_slice(body)
            .map_err(|e| refuse(400, format!("the body is not JSON: {e}")))?;
        let entry = super::entry_value_of(name, &j, kind, max)?;
        let value = match &entry {
            flick_platform::EntryValue::Int(n) => Value::Int(*n),
            flick_platform::EntryValue::Bool(b) => Value::Bool(*b),
            flick_platform::EntryValue::Bytes(b) | flick_platform::EntryValue::Message(b) => {
                Value::Bytes(b.as_slice().into())
            }
        };
        let control = self.control()?;
        wait_entry_write(
            control.queue_entries(name, vec![(key_value, value)]),
            || flick_packet::WriteError::Unplaced(name.into()),
            path,
        )?;
        tracing::info!(service = %service, dictionary = %name, key = %String::from_utf8_lossy(key), "dictionary entry written");
        let mut answer = super::entry_answer(name, key);
        super::entry_json(&mut answer, &entry);
        Ok(answer)
    }

    /// Gives the program the `global` values and entries of `carried`
    /// whose variable it declares with the same type; their names.
    fn take_over(&self, service: &str, carried: &Carried) -> Vec<String> {
        let Some(control) = self.config.control.as_ref() else {
            return Vec::new();
        };
        if !control.wait_running(WRITE_TIMEOUT) {
            tracing::warn!(service = %service, "the new version did not start in time: no state carried");
            return Vec::new();
        }
        let mut given = Vec::new();
        for var in self.vars.iter().filter(|v| v.global) {
            let same = carried
                .vars
                .iter()
                .any(|o| o.name == var.name && o.global && o.ty == var.ty);
            let Some(old) = carried.values.get(&var.name).filter(|_| same) else {
                continue;
            };
            let ok = match (&var.dict, var.scalar, old) {
                (None, Some(kind), j) => dumped_value(kind, j)
                    .is_some_and(|v| control.write_global(&var.name, v, WRITE_TIMEOUT).is_ok()),
                (Some(DictOf::Values(kind, _)), _, Json::Object(entries)) => {
                    let key_kind = self.key_kind(&var.name);
                    let pairs: Vec<_> = entries
                        .iter()
                        .filter(|_| key_kind.is_some())
                        .filter_map(|(k, v)| {
                            let key = match key_kind {
                                Some(Scalar::Int) => k.parse().ok().map(flick_exec::Value::Int)?,
                                _ => flick_exec::Value::Bytes(dumped_bytes(k).into()),
                            };
                            Some((key, dumped_value(*kind, v)?))
                        })
                        .collect();
                    let whole = key_kind.is_some() && pairs.len() == entries.len();
                    // One command for the whole dictionary.
                    let written = control.write_entries(&var.name, pairs, WRITE_TIMEOUT);
                    whole && written.is_ok_and(|n| n == entries.len())
                }
                _ => false,
            };
            if ok {
                given.push(var.name.clone());
            } else {
                tracing::warn!(service = %service, global = %var.name, "not carried over whole");
            }
        }
        given
    }
}

impl Running {
    /// A new version's state from the one it replaced (see
    /// [`Running::stop_keeping`]); the globals given back, by name.
    pub fn take_over(&self, carried: &Carried) -> Vec<String> {
        match &self.state {
            Some(s) => s.take_over(&self.spec.name, carried),
            None => Vec::new(),
        }
    }

    /// Its counters for `/metrics`, read at each scrape, named as `flick
    /// run --metrics` names them.
    pub fn collector(&self) -> Option<Box<dyn prometheus_client::collector::Collector>> {
        if let Some(stats) = &self.packet_stats {
            return Some(Box::new(PacketCollector(stats.clone())));
        }
        let m = self.machine.as_ref()?;
        let mut ports: Vec<(u8, String)> = Vec::new();
        for flag in &self.spec.ports {
            if let Ok((name, _)) = PortSpec::parse_named(flag) {
                if let Some(n) = m.port_number(&name) {
                    let shown = m
                        .channels
                        .get(n as usize - 1)
                        .cloned()
                        .unwrap_or_else(|| n.to_string());
                    ports.push((n, shown));
                }
            }
        }
        ports.sort();
        ports.dedup();
        Some(Box::new(MachineCollector {
            stats: m.stats.clone(),
            ports,
        }))
    }
}

/// Reads a packet program's counters at each scrape: per port frames in,
/// out and lost, and the program's drops, malformed frames and faults,
/// named as `flick run --metrics` names them.
#[derive(Debug)]
struct PacketCollector(Arc<flick_packet::LiveStats>);

impl prometheus_client::collector::Collector for PacketCollector {
    fn encode(
        &self,
        mut e: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::MetricType;
        let s = &self.0;
        let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        type PortCounter = fn(&flick_packet::PortStats) -> u64;
        let per_port: [(&str, &str, PortCounter); 6] = [
            ("flick_packet_rx_frames", "Frames received.", |p| {
                p.rx_frames.load(Ordering::Relaxed)
            }),
            ("flick_packet_tx_frames", "Frames sent.", |p| {
                p.tx_frames.load(Ordering::Relaxed)
            }),
            (
                "flick_packet_rx_overflow",
                "Frames of a live port lost for want of a buffer or queue room.",
                |p| p.rx_overflow.load(Ordering::Relaxed),
            ),
            (
                "flick_packet_rx_drops",
                "Frames a port dropped on the way in (its kernel ring or a shared port's queue full).",
                |p| p.rx_drops.load(Ordering::Relaxed),
            ),
            (
                "flick_packet_tx_errors",
                "Frames a port failed to send.",
                |p| p.tx_errors.load(Ordering::Relaxed),
            ),
            ("flick_packet_rx_bytes", "Bytes of frames received.", |p| {
                p.rx_bytes.load(Ordering::Relaxed)
            }),
        ];
        for (name, help, f) in per_port {
            let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            for p in s.ports() {
                let labels = [("port", p.name.as_str())];
                ConstCounter::new(f(p)).encode(m.encode_family(&labels)?)?;
            }
        }
        let totals = [
            (
                "flick_packet_dropped",
                "Frames the program sent nowhere.",
                s.workers_sum(|w| &w.dropped),
            ),
            (
                "flick_packet_malformed",
                "Frames that did not parse.",
                r(&s.malformed),
            ),
            (
                "flick_packet_faults",
                "Frames whose rule or steer faulted.",
                s.workers_sum(|w| &w.faults) + r(&s.steer_faults),
            ),
            (
                "flick_packet_dict_full",
                "New keys refused by full dictionaries.",
                s.workers_sum(|w| &w.dict_full),
            ),
        ];
        encode_totals(&mut e, &totals)
    }
}

/// Reads a machine's counters at each scrape: per port frames in, out and
/// sent nowhere, and its engine's counters.
#[derive(Debug)]
struct MachineCollector {
    stats: Arc<flick_machine::service::LiveStats>,
    /// Each bound port's number and name.
    ports: Vec<(u8, String)>,
}

impl prometheus_client::collector::Collector for MachineCollector {
    fn encode(
        &self,
        mut e: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::MetricType;
        let s = &self.stats;
        let r = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let per_port: [(&str, &str, &[std::sync::atomic::AtomicU64]); 3] = [
            ("flick_machine_rx_frames", "Frames received.", &s.received),
            ("flick_machine_tx_frames", "Frames sent.", &s.sent),
            (
                "flick_machine_dropped",
                "Frames the machine sent nowhere, by the port they came in on.",
                &s.dropped_from,
            ),
        ];
        for (name, help, counts) in per_port {
            let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (n, port) in &self.ports {
                let labels = [("port", port.as_str())];
                let v = counts.get(*n as usize).map_or(0, r);
                ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
            }
        }
        let totals = [
            (
                "flick_machine_unbound",
                "Sends to a port number no --port binds.",
                r(&s.unbound),
            ),
            (
                "flick_machine_not_sent",
                "Frames a port refused, or took and lost to a full send queue.",
                r(&s.not_sent),
            ),
            (
                "flick_machine_rx_drops",
                "Frames the input ports dropped on the way in (a kernel ring full).",
                r(&s.rx_drops),
            ),
            (
                "flick_machine_unparsed",
                "Frames the packet grammar did not parse.",
                r(&s.unparsed),
            ),
            (
                "flick_machine_table_full",
                "New flow contexts refused by a full table.",
                s.workers_sum(|w| &w.table_full),
            ),
            (
                "flick_machine_evicted",
                "Flow contexts evicted for new ones.",
                s.workers_sum(|w| &w.evicted),
            ),
            (
                "flick_machine_expired",
                "Flow contexts found past their idle or hard timeout.",
                s.workers_sum(|w| &w.expired),
            ),
            (
                "flick_machine_table_swaps",
                "Table replacements taken, summed over the workers.",
                s.workers_sum(|w| &w.swaps),
            ),
        ];
        encode_totals(&mut e, &totals)
    }
}

/// Counters summed over a service's workers, one sample each.
fn encode_totals(
    e: &mut prometheus_client::encoding::DescriptorEncoder,
    totals: &[(&str, &str, u64)],
) -> Result<(), std::fmt::Error> {
    use prometheus_client::encoding::EncodeMetric;
    use prometheus_client::metrics::counter::ConstCounter;
    use prometheus_client::metrics::MetricType;
    for (name, help, v) in totals {
        let m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
        ConstCounter::new(*v).encode(m)?;
    }
    Ok(())
}
