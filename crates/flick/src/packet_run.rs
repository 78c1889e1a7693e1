//! `flick run --port NAME=SPEC ...`: a program whose channels are bound to
//! packet ports, served by `flick-packet` until its input files end (or,
//! for live ports, until SIGINT or SIGTERM). SIGUSR1 writes the `--dump`
//! file while it runs; `--metrics` serves the run's counters. Ports may
//! also come from the configuration file's `[ports]`.

use crate::config::Settings;
use flick_packet::steering::{DeclaredKey, SteeringPlan};
use flick_packet::{Binding, BoundPort, LiveStats, PacketConfig, PacketService, PortUse};
use flick_packet_io::PortSpec;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What `flick run` hands over for a packet program.
pub struct PacketRun<'a> {
    pub loaded: flick_platform::Loaded,
    pub settings: &'a Settings,
    /// `--port` flags as given: `NAME=SPEC[,SPEC...]`.
    pub ports: &'a [String],
    pub dump: Option<&'a str>,
    /// `--check`: validate, then exit.
    pub check: bool,
    pub log_level: Option<&'a str>,
    pub log_format: crate::logging::LogFormat,
    pub program_path: &'a str,
    /// Further programs given on the command line (`flick run A B ...`),
    /// with their paths: each reads and writes the ports its channels
    /// name, beside the first.
    pub others: Vec<(String, flick_platform::Loaded)>,
}

/// `NAME=SPEC[,SPEC...]`: a channel and its ports, one per element of a
/// channel array.
pub fn parse_port_flag(flag: &str) -> Result<(String, Vec<PortSpec>), String> {
    let (name, specs) = flag
        .split_once('=')
        .ok_or_else(|| format!("--port `{flag}`: expected NAME=SPEC, e.g. `in=pcap:trace.pcap`"))?;
    if name.is_empty() {
        return Err(format!(
            "--port `{flag}`: the channel name before `=` is empty"
        ));
    }
    let specs = specs
        .split(',')
        .map(|s| {
            s.parse::<PortSpec>()
                .map_err(|e| format!("--port `{flag}`: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((name.to_string(), specs))
}

/// What a port spec reads and writes: a pcap file one way, a live port
/// both.
pub(crate) fn port_use(spec: &PortSpec) -> PortUse {
    let (rx, tx) = match spec {
        PortSpec::PcapIn(_) => (true, false),
        PortSpec::PcapOut(_) => (false, true),
        PortSpec::AfPacket(_) | PortSpec::AfXdp(_) | PortSpec::Tun(_) => (true, true),
    };
    PortUse {
        spec: spec.to_string(),
        rx,
        tx,
    }
}

pub fn run(r: PacketRun<'_>) -> ExitCode {
    let mut errors = Vec::new();
    // The configuration file's ports, then the flags': a flag replaces
    // the file's ports of its channel; a channel given twice by flags is
    // reported by the binding check.
    let mut bound: Vec<(String, Vec<PortSpec>, bool)> = Vec::new();
    let from_file = r
        .settings
        .ports
        .iter()
        .map(|(c, specs)| (format!("{c}={}", specs.join(",")), true));
    for (flag, file) in from_file.chain(r.ports.iter().map(|f| (f.clone(), false))) {
        match parse_port_flag(&flag) {
            Ok((c, specs)) => match bound.iter_mut().find(|(n, _, f)| *n == c && *f) {
                Some(b) if !file => *b = (c, specs, false),
                _ => bound.push((c, specs, file)),
            },
            Err(e) => errors.push(e),
        }
    }
    let bound: Vec<(String, Vec<PortSpec>)> =
        bound.into_iter().map(|(c, specs, _)| (c, specs)).collect();
    for (c, _) in &r.settings.listen {
        errors.push(if bound.iter().any(|(n, _)| n == c) {
            format!("channel `{c}` is bound by both --port and --listen")
        } else {
            format!("channel `{c}` is bound with --listen, but a program served over --port binds every channel to a port")
        });
    }
    for (c, _) in &r.settings.connect {
        errors.push(if bound.iter().any(|(n, _)| n == c) {
            format!("channel `{c}` is bound by both --port and --connect")
        } else {
            format!("channel `{c}` is bound with --connect, but a program served over --port binds every channel to a port")
        });
    }
    let dump_request = Arc::new(AtomicBool::new(false));
    // Handlers go in before any port opens: a supervisor that waits for the
    // ports and then signals must never meet the default action (exit).
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let _ = signal_hook::flag::register(signal_hook::consts::SIGUSR1, dump_request.clone());
    let stats = Arc::new(LiveStats::default());
    let config = PacketConfig {
        workers: r
            .settings
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        dict_capacity: r.settings.dict_capacity,
        dump_request: Some(dump_request.clone()),
        dump_path: r.dump.map(Into::into),
        stats: Some(stats.clone()),
        ..PacketConfig::default()
    };
    let mut programs: Vec<(String, flick_platform::Loaded)> =
        vec![(r.program_path.to_string(), r.loaded)];
    programs.extend(r.others);
    let several = programs.len() > 1;
    let keys: Vec<DeclaredKey> = programs
        .iter()
        .map(|(_, l)| DeclaredKey::of_module(&l.module))
        .collect();
    let names: Vec<String> = programs.iter().map(|(p, _)| p.clone()).collect();
    let plan = SteeringPlan::new(&keys);
    let mut services = Vec::new();
    for (i, (path, loaded)) in programs.into_iter().enumerate() {
        let config = PacketConfig {
            dump_path: r.dump.map(|d| dump_path(d, &path, several).into()),
            // The metrics show the first program's workers.
            stats: (i == 0).then(|| stats.clone()),
            // A frame goes to the same worker index for every program
            // of its cluster: by the cluster's common key.
            steer_by: plan
                .clusters
                .iter()
                .find(|c| several && c.programs.contains(&i))
                .and_then(|c| match c.key {
                    DeclaredKey::Key(k) => Some(k),
                    DeclaredKey::Whole | DeclaredKey::Opaque => None,
                }),
            ..config.clone()
        };
        match PacketService::new(loaded, config) {
            Ok(s) => services.push((path, s)),
            Err(e) => {
                eprintln!("error: {path}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let uses: Vec<(String, Vec<PortUse>)> = bound
        .iter()
        .map(|(n, specs)| (n.clone(), specs.iter().map(port_use).collect()))
        .collect();
    for (path, service) in &services {
        // Each program binds the ports of its own channels.
        let own: Vec<(String, Vec<PortUse>)> = uses
            .iter()
            .filter(|(n, _)| !several || service.channels().contains(n))
            .cloned()
            .collect();
        if let Err(e) = service.check_bindings(&own) {
            errors.push(if several {
                format!("{path}: {e}")
            } else {
                e.to_string()
            });
        }
    }
    if several {
        for (n, _) in &bound {
            if !services.iter().any(|(_, s)| s.channels().contains(n)) {
                errors.push(format!(
                    "--port: `{n}` is not a channel of any program ({})",
                    names.join(", ")
                ));
            }
        }
    }
    if !errors.is_empty() {
        for e in errors {
            eprintln!("error: {e}");
        }
        return ExitCode::FAILURE;
    }
    if several {
        print!("{}", plan.describe(&names));
    }
    if r.check {
        for path in &names {
            println!("{path}: program and ports are valid");
        }
        return ExitCode::SUCCESS;
    }
    if let Err(e) = crate::logging::init(r.log_level, r.log_format) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    // A file written by several programs is opened once and shared: the
    // frames each sends are all written.
    let mut shared_out: Vec<(String, SharedTx)> = Vec::new();
    // A TUN device takes one reader: bound by several programs, it is
    // opened once, every program reads every packet through a fan-out
    // and all send through one handle.
    let mut tun_uses: Vec<(String, usize)> = Vec::new();
    if several {
        for (_, service) in &services {
            for (_, specs) in bound.iter().filter(|(n, _)| service.channels().contains(n)) {
                for spec in specs.iter().filter(|s| s.takes_one_reader()) {
                    let key = spec.to_string();
                    match tun_uses.iter_mut().find(|(k, _)| *k == key) {
                        Some((_, n)) => *n += 1,
                        None => tun_uses.push((key, 1)),
                    }
                }
            }
        }
    }
    let mut shared_tun: Vec<(String, Vec<flick_packet_io::FanOutRx>, SharedTx)> = Vec::new();
    let mut all_bindings = Vec::new();
    for (_, service) in &services {
        let mut bindings = Vec::new();
        for (channel, specs) in bound
            .iter()
            .filter(|(n, _)| !several || service.channels().contains(n))
        {
            let mut ports = Vec::new();
            for spec in specs {
                let opened = match spec {
                    PortSpec::PcapOut(_) if several => {
                        let key = spec.to_string();
                        match shared_out.iter().find(|(k, _)| *k == key) {
                            Some((_, tx)) => Ok(tx.port()),
                            None => flick_packet_io::open(spec).map(|p| {
                                let tx = SharedTx::new(p.tx.expect("a pcap-out port writes"));
                                let port = tx.port();
                                shared_out.push((key, tx));
                                port
                            }),
                        }
                    }
                    _ if spec.takes_one_reader()
                        && tun_uses
                            .iter()
                            .any(|(k, n)| *k == spec.to_string() && *n > 1) =>
                    {
                        open_shared_tun(spec, &tun_uses, &mut shared_tun)
                    }
                    _ => flick_packet_io::open(spec),
                };
                match opened {
                    Ok(port) => ports.push(BoundPort {
                        spec: spec.to_string(),
                        port,
                        live: spec.is_live(),
                    }),
                    Err(e) => {
                        eprintln!("error: --port {channel}={spec}: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            bindings.push(Binding {
                channel: channel.clone(),
                ports,
            });
        }
        all_bindings.push(bindings);
    }
    let metrics = match r.settings.metrics {
        None => None,
        Some(addr) => {
            let started = std::net::TcpListener::bind(addr).and_then(|l| {
                crate::metrics::MetricsServer::start(l, render_metrics(stats.clone()))
            });
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
    // Each program on threads of its own, all until their inputs end.
    let results: Vec<_> = std::thread::scope(|scope| {
        let running: Vec<_> = services
            .iter()
            .zip(all_bindings)
            .map(|((_, service), bindings)| {
                let stop = &stop;
                scope.spawn(move || service.run(bindings, stop))
            })
            .collect();
        running
            .into_iter()
            .map(|h| h.join().expect("a packet service thread panicked"))
            .collect()
    });
    if let Some(m) = metrics {
        m.stop();
    }
    let mut code = ExitCode::SUCCESS;
    for ((path, _), result) in services.iter().zip(results) {
        let prefix = if several {
            format!("{path}: ")
        } else {
            String::new()
        };
        match result {
            Ok(summary) => eprintln!("{prefix}{}", summary.line()),
            Err(e) => {
                eprintln!("error: {prefix}{e}");
                code = ExitCode::FAILURE;
            }
        }
    }
    code
}

/// Where a program's `--dump` goes: the path given, or with several
/// programs the path with the program's file stem before its extension
/// (`flows.json` and `a.flick`: `flows.a.json`).
pub fn dump_path(dump: &str, program: &str, several: bool) -> String {
    if !several {
        return dump.to_string();
    }
    let stem = std::path::Path::new(program)
        .file_stem()
        .map_or_else(|| "program".into(), |s| s.to_string_lossy());
    let d = std::path::Path::new(dump);
    let named = match (d.file_stem(), d.extension()) {
        (Some(base), Some(ext)) => format!(
            "{}.{stem}.{}",
            base.to_string_lossy(),
            ext.to_string_lossy()
        ),
        _ => format!("{dump}.{stem}"),
    };
    d.with_file_name(named).to_string_lossy().into_owned()
}

/// A transmitting port several programs send to: each program's
/// service holds a handle, and every frame any of them sends is written.
#[derive(Clone)]
struct SharedTx(Arc<std::sync::Mutex<Box<dyn flick_packet_io::TxPort>>>);

impl SharedTx {
    fn new(tx: Box<dyn flick_packet_io::TxPort>) -> SharedTx {
        SharedTx(Arc::new(std::sync::Mutex::new(tx)))
    }

    fn port(&self) -> flick_packet_io::Port {
        flick_packet_io::Port {
            rx: None,
            tx: Some(Box::new(self.clone())),
        }
    }
}

impl flick_packet_io::TxPort for SharedTx {
    fn send(&mut self, frame: &[u8], timestamp_ns: u64) -> Result<(), flick_packet_io::PortError> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(frame, timestamp_ns)
    }

    fn flush(&mut self) -> Result<(), flick_packet_io::PortError> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).flush()
    }

    fn stats(&self) -> flick_packet_io::PortStats {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).stats()
    }
}

/// Frames a reader of a shared TUN device may hold unread.
const SHARED_TUN_DEPTH: usize = 4096;

/// A use of TUN port `spec` that `tun_uses` says several programs make:
/// the device opened at its first use, each use given a reader of its
/// own and the shared sending side.
fn open_shared_tun(
    spec: &PortSpec,
    tun_uses: &[(String, usize)],
    shared_tun: &mut Vec<(String, Vec<flick_packet_io::FanOutRx>, SharedTx)>,
) -> Result<flick_packet_io::Port, flick_packet_io::PortError> {
    let key = spec.to_string();
    if !shared_tun.iter().any(|(k, _, _)| *k == key) {
        let port = flick_packet_io::open(spec)?;
        let uses = tun_uses.iter().find(|(k, _)| *k == key).map_or(1, |u| u.1);
        let readers =
            flick_packet_io::fan_out(port.rx.expect("a TUN port reads"), uses, SHARED_TUN_DEPTH)?;
        let tx = SharedTx::new(port.tx.expect("a TUN port writes"));
        shared_tun.push((key.clone(), readers, tx));
    }
    let (_, readers, tx) = shared_tun
        .iter_mut()
        .find(|(k, _, _)| *k == key)
        .expect("opened above");
    let rx = readers.pop().expect("a reader per use");
    Ok(flick_packet_io::Port {
        rx: Some(Box::new(rx)),
        tx: tx.port().tx,
    })
}

/// One packet program of several given together (`flick check A B`).
pub struct SharedProgram {
    pub path: String,
    /// The flow key its `steer` declares.
    pub key: DeclaredKey,
    pub bounds: flick_check::ProcessBounds,
}

/// The steering plan of several packet programs on one port, each
/// program's own key, and the bound of one frame through all of them:
/// a frame runs every program's rule on its cluster's worker, and each
/// program keeps its own state.
pub fn shared_port_report(programs: &[SharedProgram]) -> String {
    use std::fmt::Write;
    let keys: Vec<DeclaredKey> = programs.iter().map(|p| p.key.clone()).collect();
    let names: Vec<String> = programs.iter().map(|p| p.path.clone()).collect();
    let mut out = SteeringPlan::new(&keys).describe(&names);
    for p in programs {
        let _ = writeln!(out, "  {}: flow key {}", p.path, p.key);
    }
    let global: u64 = programs.iter().map(|p| p.bounds.global_bytes).sum();
    let instance: u64 = programs.iter().map(|p| p.bounds.instance_bytes).sum();
    let ops: u64 = programs.iter().map(|p| p.bounds.max_ops()).sum();
    let _ = writeln!(
        out,
        "combined: state {global} B per worker, {instance} B per frame in flight, at most {ops} operations per frame"
    );
    out
}

/// `/metrics` for a packet program: per port frames and bytes received
/// and sent, frames lost for want of room and not sent; frames dropped by
/// the program, malformed, faulted, and handled per worker.
pub fn render_metrics(stats: Arc<LiveStats>) -> crate::metrics::Render {
    use std::fmt::Write;
    use std::sync::atomic::Ordering::Relaxed;
    Arc::new(move |format| {
        let open = format == crate::metrics::Format::OpenMetrics;
        let mut out = String::new();
        let mut family = |name: &str, help: &str, samples: Vec<(String, u64)>| {
            // OpenMetrics names a counter's family without `_total`.
            let family = if open {
                name.to_string()
            } else {
                format!("{name}_total")
            };
            let _ = writeln!(out, "# HELP {family} {help}");
            let _ = writeln!(out, "# TYPE {family} counter");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}_total{labels} {v}");
            }
        };
        let ports = stats.ports();
        let per_port = |f: &dyn Fn(&flick_packet::PortStats) -> u64| {
            ports
                .iter()
                .map(|p| (format!("{{port=\"{}\"}}", p.name), f(p)))
                .collect::<Vec<_>>()
        };
        family(
            "flick_packet_rx_frames",
            "Frames received.",
            per_port(&|p| p.rx_frames.load(Relaxed)),
        );
        family(
            "flick_packet_rx_bytes",
            "Bytes of frames received.",
            per_port(&|p| p.rx_bytes.load(Relaxed)),
        );
        family(
            "flick_packet_rx_overflow",
            "Frames of a live port lost for want of a buffer or queue room.",
            per_port(&|p| p.rx_overflow.load(Relaxed)),
        );
        family(
            "flick_packet_rx_drops",
            "Frames a port dropped on the way in (its kernel ring or a shared port's queue full).",
            per_port(&|p| p.rx_drops.load(Relaxed)),
        );
        family(
            "flick_packet_tx_frames",
            "Frames sent.",
            per_port(&|p| p.tx_frames.load(Relaxed)),
        );
        family(
            "flick_packet_tx_bytes",
            "Bytes of frames sent.",
            per_port(&|p| p.tx_bytes.load(Relaxed)),
        );
        family(
            "flick_packet_tx_errors",
            "Frames a port failed to send.",
            per_port(&|p| p.tx_errors.load(Relaxed)),
        );
        let one = |v: u64| vec![(String::new(), v)];
        family(
            "flick_packet_dropped",
            "Frames the program sent nowhere.",
            one(stats.workers_sum(|w| &w.dropped)),
        );
        family(
            "flick_packet_malformed",
            "Frames that did not parse.",
            one(stats.malformed.load(Relaxed)),
        );
        family(
            "flick_packet_faults",
            "Frames whose rule or steer faulted.",
            one(stats.workers_sum(|w| &w.faults) + stats.steer_faults.load(Relaxed)),
        );
        family(
            "flick_packet_dict_full",
            "New keys refused by full dictionaries.",
            one(stats.workers_sum(|w| &w.dict_full)),
        );
        family(
            "flick_packet_table_evicted",
            "Flow-table entries evicted to make room (evict=lru).",
            one(stats.workers_sum(|w| &w.table_evicted)),
        );
        family(
            "flick_packet_table_expired",
            "Flow-table entries gone after their idle timeout.",
            one(stats.workers_sum(|w| &w.table_expired)),
        );
        family(
            "flick_packet_worker_frames",
            "Frames each worker handled.",
            stats
                .workers()
                .iter()
                .enumerate()
                .map(|(i, w)| (format!("{{worker=\"{i}\"}}"), w.frames.load(Relaxed)))
                .collect(),
        );
        if open {
            out.push_str("# EOF\n");
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Format;

    #[test]
    fn metrics_are_counters_in_either_format() {
        let stats = Arc::new(LiveStats::default());
        let render = render_metrics(stats);
        let text = render(Format::Text);
        assert!(
            text.contains(
                "# TYPE flick_packet_dropped_total counter\nflick_packet_dropped_total 0\n"
            ),
            "{text}"
        );
        let open = render(Format::OpenMetrics);
        assert!(
            open.contains("# TYPE flick_packet_dropped counter\nflick_packet_dropped_total 0\n"),
            "{open}"
        );
        assert!(open.ends_with("# EOF\n"));
    }

    #[test]
    fn each_programs_dump_is_named_after_it_when_several_run() {
        assert_eq!(dump_path("out/d.json", "x/a.flick", false), "out/d.json");
        assert_eq!(dump_path("out/d.json", "x/a.flick", true), "out/d.a.json");
        assert_eq!(dump_path("dump", "b.flick", true), "dump.b");
    }

    #[test]
    fn port_flags_name_a_channel_and_its_specs() {
        let (c, specs) = parse_port_flag("outs=pcap-out:a.pcap,pcap-out:b.pcap").unwrap();
        assert_eq!(c, "outs");
        assert_eq!(specs.len(), 2);
        assert!(parse_port_flag("pcap:x")
            .unwrap_err()
            .contains("expected NAME=SPEC"));
        assert!(parse_port_flag("=pcap:x").unwrap_err().contains("empty"));
    }
}
