//! `flick check FILE` and `flick run FILE --port CHANNEL=SPEC ...` for
//! machines: FlowBlaze XL programs (`.xl`) and Flick programs holding a
//! `machine` item, loaded by `flick-machine`, their errors rendered like
//! every other diagnostic, their tables sized, and the machine served
//! over packet ports (numbered, or named by the machine's channels) until
//! its input files end (or, for live ports, until SIGINT or SIGTERM); its
//! tables replaced while it runs on SIGHUP and through `--control`
//! ([`crate::table_load`]). SIGUSR1 writes the `--dump` file while it
//! runs; `--metrics ADDR` serves the run's counters ([`render_metrics`]).

use crate::render::render;
use crate::table_load::{self, ControlSocket, TableLoader};
use flick_machine::service::LiveStats;
use flick_machine::xl::{self, XlError};
use flick_machine::{lang, InPort, Machine, MachineService, OutPort, Program};
use flick_packet_io::PortSpec;
use flick_span::{Diagnostic, SourceFile, Span};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// The error with its source line and a caret under the place.
pub fn render_xl_error(e: &XlError, color: bool) -> String {
    match e {
        XlError::At {
            path,
            start,
            end,
            message,
            ..
        } => match std::fs::read_to_string(path) {
            Ok(text) => {
                let file = SourceFile::new(path.display().to_string(), text);
                let d = Diagnostic::error(e.code(), message.clone(), Span::new(*start, *end));
                render(&file, &[d], color)
            }
            Err(_) => format!("error: {e}\n"),
        },
        XlError::Read { .. } => format!("error: {e}\n"),
    }
}

/// Whether `path` is a machine's program: an `.xl` file, or a Flick
/// program holding a `machine` item. A file that cannot be read is left
/// to the caller's own reading, which reports it.
pub fn is_machine(path: &str) -> bool {
    machine_file(path).is_some()
}

/// For a machine's program, whether it also holds processes (which
/// `flick check` checks too); `None` for any other file.
pub fn machine_file(path: &str) -> Option<bool> {
    if path.ends_with(".xl") {
        return Some(false);
    }
    let text = std::fs::read_to_string(path).ok()?;
    let (program, _) = flick_syntax::parse(&text);
    let procs = program
        .decls
        .iter()
        .any(|d| matches!(d, flick_syntax::ast::Decl::Proc(_)));
    (!program.machines.is_empty()).then_some(procs)
}

/// A machine's program read and lowered: the machine and its channel
/// names (none for XL, whose ports are numbers), or the rendered errors.
pub fn read_machine(path: &Path, color: bool) -> Result<(Machine, Vec<String>), String> {
    if path.extension().is_some_and(|e| e == "xl") {
        return xl::load(path)
            .map(|m| (m, Vec::new()))
            .map_err(|e| render_xl_error(&e, color));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("error: cannot read {}: {e}\n", path.display()))?;
    match lang::compile(&text) {
        Ok(l) => Ok((l.machine, l.channels)),
        Err(diags) => {
            let file = SourceFile::new(path.display().to_string(), text);
            Err(render(&file, &diags, color))
        }
    }
}

fn load(path: &str, color: bool) -> Option<(Arc<Program>, Vec<String>)> {
    let (machine, channels) = match read_machine(Path::new(path), color) {
        Ok(m) => m,
        Err(e) => {
            eprint!("{e}");
            return None;
        }
    };
    match Program::new(machine) {
        Ok(p) => Some((Arc::new(p), channels)),
        Err(e) => {
            eprintln!("error: {path}: {e}");
            None
        }
    }
}

/// `flick check FILE`: loads, compiles, and prints each stage's tables'
/// sizes; with `bounds`, each stage's table size and memory. False if
/// the program has errors.
pub fn check(path: &str, color: bool, bounds: bool) -> bool {
    let Some((program, _)) = load(path, color) else {
        return false;
    };
    if let Err(e) = flick_machine::FieldReader::new(&program.machine.fields) {
        eprintln!("error: {path}: {e}");
        return false;
    }
    println!("{path}: ok");
    for (i, (stage, tables)) in program
        .machine
        .stages
        .iter()
        .zip(&program.tables)
        .enumerate()
    {
        if stage.stateless() {
            println!(
                "  stage {}: stateless, {} condition bits, {} entries, {} rows",
                stage.name,
                tables.conditions.len(),
                tables.entries.len(),
                tables.row_count(),
            );
            continue;
        }
        println!(
            "  stage {}: {} states, {} condition bits, {} entries, {} rows; key {} fields{}; {} flow registers, {} bytes per context, {} contexts",
            stage.name,
            stage.states.len(),
            tables.conditions.len(),
            tables.entries.len(),
            tables.row_count(),
            stage.key.len(),
            if stage.biflow { " (biflow)" } else { "" },
            stage.flow_regs.len(),
            program.context_bytes(i),
            flick_machine::flows::FlowTable::new(stage.capacity, 0, 0).capacity(),
        );
    }
    if !program.machine.globals.is_empty() {
        println!("  {} global registers", program.machine.globals.len());
    }
    if !program.machine.meta.is_empty() {
        println!("  {} metadata words", program.machine.meta.len());
    }
    if bounds {
        print!("{}", bounds_report(&program));
    }
    true
}

/// Per stage: its flow table's slots, the bytes of one context, and their
/// product; then what each worker's tables take in all, as the engine
/// allocates them (records padded to cache lines, stages on one key sharing
/// a record, tags, alternate buckets and key summaries).
pub fn bounds_report(program: &Program) -> String {
    let mut out = String::from("bounds:\n");
    for (i, stage) in program.machine.stages.iter().enumerate() {
        if stage.stateless() {
            out.push_str(&format!(
                "  stage {}: stateless, no flow table\n",
                stage.name
            ));
            continue;
        }
        let slots = flick_machine::flows::FlowTable::new(stage.capacity, 0, 0).capacity();
        let bytes = program.context_bytes(i);
        out.push_str(&format!(
            "  stage {}: table of {slots} contexts, {bytes} bytes per context, {} bytes\n",
            stage.name,
            slots * bytes
        ));
    }
    out.push_str(&format!(
        "  flow tables: {} bytes per worker, padding and indexes included; {} metadata words per packet\n",
        program.table_bytes(),
        program.machine.meta.len()
    ));
    out
}

/// Writes `text` to `path` through a file beside it renamed over it, so
/// that a reader never sees half a dump.
fn write_whole(path: &str, text: &str) -> std::io::Result<()> {
    let part = format!("{path}.part");
    std::fs::write(&part, text)?;
    std::fs::rename(&part, path)
}

/// `/metrics` for a machine: per port frames received, sent and dropped
/// (by the port they came in on), frames not parsed and sent to unbound
/// ports; the engines' new contexts refused by full tables, evictions,
/// expiries and table swaps; frames per worker; contexts held per stage.
/// `ports` names each port number (its channel, or the number).
pub fn render_metrics(
    stats: Arc<LiveStats>,
    program: Arc<Program>,
    ports: Vec<(u8, String)>,
) -> crate::metrics::Render {
    use std::fmt::Write;
    use std::sync::atomic::Ordering::Relaxed;
    Arc::new(move |format| {
        let open = format == crate::metrics::Format::OpenMetrics;
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
            let counter = kind == "counter";
            // OpenMetrics names a counter's family without `_total`.
            let family = if counter && !open {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            let sample = if counter {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            let _ = writeln!(out, "# HELP {family} {help}");
            let _ = writeln!(out, "# TYPE {family} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{sample}{labels} {v}");
            }
        };
        let per_port = |c: &[std::sync::atomic::AtomicU64]| {
            ports
                .iter()
                .map(|(n, name)| (format!("{{port=\"{name}\"}}"), c[*n as usize].load(Relaxed)))
                .collect::<Vec<_>>()
        };
        family(
            "flick_machine_rx_frames",
            "counter",
            "Frames received.",
            per_port(&stats.received),
        );
        family(
            "flick_machine_tx_frames",
            "counter",
            "Frames sent.",
            per_port(&stats.sent),
        );
        family(
            "flick_machine_dropped",
            "counter",
            "Frames the machine sent nowhere, by the port they came in on.",
            per_port(&stats.dropped_from),
        );
        let one = |v: u64| vec![(String::new(), v)];
        family(
            "flick_machine_unbound",
            "counter",
            "Sends to a port number no --port binds.",
            one(stats.unbound.load(Relaxed)),
        );
        family(
            "flick_machine_not_sent",
            "counter",
            "Frames a port refused, or took and lost to a full send queue.",
            one(stats.not_sent.load(Relaxed)),
        );
        family(
            "flick_machine_rx_drops",
            "counter",
            "Frames the input ports dropped on the way in (a kernel ring full).",
            one(stats.rx_drops.load(Relaxed)),
        );
        family(
            "flick_machine_unparsed",
            "counter",
            "Frames the packet grammar did not parse.",
            one(stats.unparsed.load(Relaxed)),
        );
        family(
            "flick_machine_table_full",
            "counter",
            "New flow contexts refused by a full table.",
            one(stats.workers_sum(|w| &w.table_full)),
        );
        family(
            "flick_machine_evicted",
            "counter",
            "Flow contexts evicted for new ones.",
            one(stats.workers_sum(|w| &w.evicted)),
        );
        family(
            "flick_machine_expired",
            "counter",
            "Flow contexts found past their idle or hard timeout.",
            one(stats.workers_sum(|w| &w.expired)),
        );
        family(
            "flick_machine_table_swaps",
            "counter",
            "Table replacements taken, summed over the workers.",
            one(stats.workers_sum(|w| &w.swaps)),
        );
        family(
            "flick_machine_worker_frames",
            "counter",
            "Frames each worker ran.",
            stats
                .workers
                .iter()
                .enumerate()
                .map(|(i, w)| (format!("{{worker=\"{i}\"}}"), w.frames.load(Relaxed)))
                .collect(),
        );
        family(
            "flick_machine_contexts",
            "gauge",
            "Flow contexts held, per stage.",
            program
                .machine
                .stages
                .iter()
                .enumerate()
                .filter(|(_, st)| !st.stateless())
                .map(|(i, st)| (format!("{{stage=\"{}\"}}", st.name), stats.contexts(i)))
                .collect(),
        );
        if open {
            out.push_str("# EOF\n");
        }
        out
    })
}

/// Opens `--port N=SPEC` / `--port CHANNEL=SPEC` flags for a machine whose
/// channels are `channels` (none for XL, whose ports are numbers).
pub fn open_ports(
    ports: &[String],
    channels: &[String],
) -> Result<(Vec<InPort>, Vec<OutPort>), String> {
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    for flag in ports {
        let (name, spec) = match PortSpec::parse_named(flag) {
            Ok(p) => p,
            Err(e) => {
                return Err(format!("--port {flag}: {e}"));
            }
        };
        let by_name = channels
            .iter()
            .position(|c| *c == name)
            .map(|i| i as u8 + 1);
        let number = match (by_name, name.parse::<u8>()) {
            (Some(n), _) => n,
            (None, Ok(n)) if (1..64).contains(&n) => n,
            _ if channels.is_empty() => {
                return Err(format!("--port {flag}: an XL program's ports are numbered 1 to 63, as its sendPacket calls and pktRcvd.port name them (`--port 1=pcap:in.pcap`)"));
            }
            _ => {
                return Err(format!(
                    "error: --port {flag}: the machine's channels are {} (or their numbers, 1 to {})",
                    channels.join(", "),
                    channels.len()
                ));
            }
        };
        let live = spec.is_live();
        let port = match flick_packet_io::open(&spec) {
            Ok(p) => p,
            Err(e) => {
                return Err(format!("--port {flag}: {e}"));
            }
        };
        // A number may name one port that reads and one that writes (a
        // pcap file in and one out), not two of either.
        let twice = (port.rx.is_some() && inputs.iter().any(|p: &InPort| p.number == number))
            || (port.tx.is_some() && outputs.iter().any(|p: &OutPort| p.number == number));
        if twice {
            return Err(format!("--port {flag}: port {number} is bound twice"));
        }
        if let Some(rx) = port.rx {
            inputs.push(InPort {
                number,
                spec: spec.to_string(),
                rx,
                live,
            });
        }
        if let Some(tx) = port.tx {
            outputs.push(OutPort {
                number,
                spec: spec.to_string(),
                tx,
            });
        }
    }
    Ok((inputs, outputs))
}

/// `flick run FILE.xl --port N=SPEC ... [--control PATH] [--metrics ADDR]`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    path: &str,
    ports: &[String],
    workers: Option<usize>,
    dump: Option<&str>,
    control: Option<&str>,
    metrics: Option<&str>,
    color: bool,
) -> ExitCode {
    let Some((program, channels)) = load(path, color) else {
        return ExitCode::FAILURE;
    };
    // Handlers go in before any port opens: a supervisor that waits for the
    // ports and then signals must never meet the default action (exit).
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let dump_request = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGUSR1, dump_request.clone());
    let (inputs, outputs) = match open_ports(ports, &channels) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let sent_to = program
        .machine
        .stages
        .iter()
        .flat_map(|s| &s.transitions)
        .fold(0u64, |m, t| m | t.ports);
    for n in 1..64u8 {
        if sent_to & (1 << n) != 0 && !outputs.iter().any(|p| p.number == n) {
            let port = match channels.get(n as usize - 1) {
                Some(c) => format!("channel {c}"),
                None => format!("port {n}"),
            };
            eprintln!("note: the program sends to {port}, which no --port binds for output; those frames go nowhere");
        }
    }
    let asked =
        workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mut service = match MachineService::new(program.clone(), asked) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if workers.is_some_and(|w| w > 1) && service.workers() == 1 {
        eprintln!("note: one worker serves this program: it has several stages with flow keys, or writes a global register");
    }
    let dump_to = dump.map(String::from);
    service.dump_on(
        dump_request,
        Box::new(move |d| match &dump_to {
            Some(to) => {
                if let Err(e) = write_whole(to, &d.json()) {
                    eprintln!("error: cannot write the dump to {to}: {e}");
                }
            }
            None => eprintln!("note: SIGUSR1 asks for a dump, but no --dump names its file"),
        }),
    );
    let mut named: Vec<(u8, String)> = inputs
        .iter()
        .map(|p| p.number)
        .chain(outputs.iter().map(|p| p.number))
        .map(|n| {
            let name = channels
                .get(n as usize - 1)
                .cloned()
                .unwrap_or_else(|| n.to_string());
            (n, name)
        })
        .collect();
    named.sort();
    named.dedup();
    let metrics = match metrics {
        None => None,
        Some(addr) => {
            let render = render_metrics(service.stats(), program.clone(), named);
            let started = std::net::TcpListener::bind(addr)
                .and_then(|l| crate::metrics::MetricsServer::start(l, render));
            match started {
                Ok(m) => {
                    println!("flick: metrics on http://{}/metrics", m.local_addr());
                    Some(m)
                }
                Err(e) => {
                    eprintln!("error: cannot serve metrics on {addr}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let (swap_tx, swaps) = flick_machine::swap_channel();
    let loader = Arc::new(Mutex::new(TableLoader::new(
        program,
        service.workers(),
        swap_tx,
    )));
    table_load::reload_on_sighup(path.into(), loader.clone());
    // Removes the socket file when the run ends.
    let _control = match control {
        None => None,
        Some(at) => match ControlSocket::start(Path::new(at), loader) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("error: --control: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let result = service.run(inputs, outputs, &stop, Some(swaps));
    if let Some(m) = metrics {
        m.stop();
    }
    let summary = match result {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(d) = dump {
        if let Err(e) = write_whole(d, &summary.dump.json()) {
            eprintln!("error: cannot write the dump to {d}: {e}");
            return ExitCode::FAILURE;
        }
    }
    for why in &summary.refused_swaps {
        eprintln!("warning: a table replacement was refused: {why}");
    }
    eprintln!("{}", summary.line());
    ExitCode::SUCCESS
}
