//! `flick run --port NAME=SPEC ...`: a program whose channels are bound to
//! packet ports, served by `flick-packet` until its input files end (or,
//! for live ports, until SIGINT or SIGTERM). SIGUSR1 writes the `--dump`
//! file while it runs.

use crate::config::Settings;
use flick_packet::{Binding, BoundPort, PacketConfig, PacketService, PortUse};
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

fn port_use(spec: &PortSpec) -> PortUse {
    let (rx, tx) = match spec {
        PortSpec::PcapIn(_) => (true, false),
        PortSpec::PcapOut(_) => (false, true),
        PortSpec::AfPacket(_) | PortSpec::Tun(_) => (true, true),
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
    let config = PacketConfig {
        workers: r
            .settings
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        dict_capacity: r.settings.dict_capacity,
        dump_request: Some(dump_request.clone()),
        dump_path: r.dump.map(Into::into),
        ..PacketConfig::default()
    };
    let service = match PacketService::new(r.loaded, config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let uses: Vec<(String, Vec<PortUse>)> = bound
        .iter()
        .map(|(n, specs)| (n.clone(), specs.iter().map(port_use).collect()))
        .collect();
    if let Err(e) = service.check_bindings(&uses) {
        errors.push(e.to_string());
    }
    if !errors.is_empty() {
        for e in errors {
            eprintln!("error: {e}");
        }
        return ExitCode::FAILURE;
    }
    if r.check {
        println!("{}: program and ports are valid", r.program_path);
        return ExitCode::SUCCESS;
    }
    if let Err(e) = crate::logging::init(r.log_level, r.log_format) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let mut bindings = Vec::new();
    for (channel, specs) in bound {
        let mut ports = Vec::new();
        for spec in specs {
            match flick_packet_io::open(&spec) {
                Ok(port) => ports.push(BoundPort {
                    spec: spec.to_string(),
                    port,
                    live: matches!(spec, PortSpec::AfPacket(_) | PortSpec::Tun(_)),
                }),
                Err(e) => {
                    eprintln!("error: --port {channel}={spec}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        bindings.push(Binding { channel, ports });
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let _ = signal_hook::flag::register(signal_hook::consts::SIGUSR1, dump_request);
    if r.settings.metrics.is_some() {
        tracing::warn!(
            "--metrics is not served for packet programs yet; the dump has the counters"
        );
    }
    match service.run(bindings, &stop) {
        Ok(summary) => {
            eprintln!("{}", summary.line());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
