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
//! of it. A machine's `table` is written whole from a program's text.
//!
//! This module must not touch the socket services' registry: `serve.rs`
//! routes to it by name.

use super::{DeploySpec, Refusal};
use crate::table_load::TableLoader;
use flick_machine::{MachineService, Program};
use flick_packet::{Binding, BoundPort, PacketConfig, PacketService, PortUse};
use flick_packet_io::PortSpec;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
}

/// One packet service running.
pub struct Running {
    pub spec: DeploySpec,
    pub kind: Kind,
    pub reserved: u64,
    pub version: u64,
    pub deploy_us: u64,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<String, String>>>,
    dump_request: Arc<AtomicBool>,
    /// Where a packet program's dumps are written.
    dump_path: PathBuf,
    packet_stats: Option<Arc<flick_packet::LiveStats>>,
    machine: Option<MachineParts>,
}

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
        ..PacketConfig::default()
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
                live: matches!(spec, PortSpec::AfPacket(_) | PortSpec::Tun(_)),
            });
        }
        bindings.push(Binding { channel, ports });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let thread = std::thread::Builder::new()
        .name(format!("flick-packet-{}", spec.name))
        .spawn(move || {
            service
                .run(bindings, &stopping)
                .map(|s| s.line())
                .map_err(|e| e.to_string())
        })
        .map_err(|e| refuse(500, format!("cannot start the packet thread: {e}")))?;
    Ok(Running {
        spec: spec.clone(),
        kind: Kind::Packet,
        reserved,
        version: 1,
        deploy_us: 0,
        stop,
        thread: Some(thread),
        dump_request,
        dump_path,
        packet_stats: Some(stats),
        machine: None,
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

/// Each stateful stage's table bytes, for one worker.
fn machine_bytes(program: &Program) -> u64 {
    program
        .machine
        .stages
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.stateless())
        .map(|(i, s)| {
            let slots = flick_machine::flows::FlowTable::new(s.capacity, 0, 0).capacity();
            (slots * program.context_bytes(i)) as u64
        })
        .sum()
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
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let stats = service.stats();
    let thread = std::thread::Builder::new()
        .name(format!("flick-machine-{}", spec.name))
        .spawn(move || {
            service
                .run(inputs, outputs, &stopping, Some(swaps))
                .map(|s| s.line())
                .map_err(|e| e.to_string())
        })
        .map_err(|e| refuse(500, format!("cannot start the machine's thread: {e}")))?;
    Ok(Running {
        spec: spec.clone(),
        kind: Kind::Machine,
        reserved,
        version: 1,
        deploy_us: 0,
        stop,
        thread: Some(thread),
        dump_request,
        dump_path: PathBuf::new(),
        packet_stats: None,
        machine: Some(MachineParts {
            program: Arc::new(Mutex::new(program)),
            loader: Mutex::new(loader),
            stats,
            dumped,
            channels,
            table_text: Mutex::new((file, spec.program.clone())),
        }),
    })
}

impl Running {
    /// Whether its threads still run (a pcap input that ended stops them).
    pub fn running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops its threads and closes its ports; what the run said.
    pub fn stop(mut self) -> Json {
        let started = Instant::now();
        self.stop.store(true, Ordering::Relaxed);
        let summary = match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Ok(line))) => json!(line),
            Some(Ok(Err(e))) => json!(format!("error: {e}")),
            Some(Err(_)) => json!("the service's thread panicked"),
            None => Json::Null,
        };
        let _ = std::fs::remove_file(&self.dump_path);
        json!({
            "name": self.spec.name,
            "drained": true,
            "clients_left": 0,
            "summary": summary,
            "stop_us": started.elapsed().as_micros() as u64,
        })
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
                    "drops": r(&p.rx_overflow) + r(&p.tx_errors),
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
            "carried": [],
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

    /// The state as JSON, taken between two frames without stopping.
    fn dump(&self) -> Result<Json, Refusal> {
        if !self.running() {
            return Err(refuse(
                409,
                format!(
                    "service `{}` has stopped (its inputs ended)",
                    self.spec.name
                ),
            ));
        }
        let deadline = Instant::now() + DUMP_TIMEOUT;
        let text = match &self.machine {
            Some(m) => {
                *m.dumped.lock().expect("dump slot") = None;
                self.dump_request.store(true, Ordering::Relaxed);
                loop {
                    if let Some(t) = m.dumped.lock().expect("dump slot").take() {
                        break t;
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

    /// `GET /services/NAME/state/PATH`: `dump` (all of it), `table` (a
    /// machine's running tables), or a path into the dump (`globals/R`,
    /// `stages/S`, a packet program's `globals/G`, ...).
    pub fn read(&self, path: &str) -> Result<Json, Refusal> {
        if path == "table" {
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
            return Ok(json!({ "path": path, "file": file, "value": text, "stages": stages }));
        }
        let dump = self.dump()?;
        if path == "dump" {
            return Ok(json!({ "path": path, "value": dump }));
        }
        let mut at = &dump;
        for seg in path.split('/') {
            at = match at {
                Json::Object(o) => o.get(seg),
                Json::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            }
            .ok_or_else(|| {
                refuse(
                    404,
                    format!(
                        "no `{path}` in the state of `{}` (read `dump` for all of it)",
                        self.spec.name
                    ),
                )
            })?;
        }
        Ok(json!({ "path": path, "value": at }))
    }

    /// `PUT /services/NAME/state/table`: a machine's tables replaced from
    /// a program's text (`{"file": F, "program": TEXT}`), atomically
    /// between two frames.
    pub fn write(&mut self, path: &str, body: &[u8]) -> Result<Json, Refusal> {
        let Some(m) = &self.machine else {
            return Err(refuse(
                422,
                format!("`{path}`: a packet program's state is read only through the API"),
            ));
        };
        if path != "table" {
            return Err(refuse(
                422,
                format!("`{path}`: of a machine, only its `table` is written (global registers are read only)"),
            ));
        }
        let j: Json = serde_json::from_slice(body)
            .map_err(|e| refuse(400, format!("the body is not JSON: {e}")))?;
        let text = j["program"]
            .as_str()
            .ok_or_else(|| refuse(400, "give the table as {\"file\": NAME, \"program\": TEXT}"))?;
        let file = j["file"].as_str().unwrap_or(&self.spec.file).to_string();
        let micros = m.load(&file, text)?;
        self.spec.program = text.to_string();
        Ok(json!({ "path": path, "value": file, "applied": true, "micros": micros }))
    }
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
