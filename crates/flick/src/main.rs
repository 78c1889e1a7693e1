//! `flick`: check, format, draw and run Flick programs.

use clap::{CommandFactory, Parser, Subcommand};
use flick::bounds_report::bounds_report;
use flick::render::render;
use flick_span::SourceFile;
use std::io::IsTerminal;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "flick",
    version,
    about = "Write and run network functions in Flick"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check programs: syntax, types, channel directions, termination and bounds.
    Check {
        /// Print each process's memory bound and worst-case operations per message.
        #[arg(long)]
        bounds: bool,
        /// The programs to check.
        #[arg(required = true)]
        files: Vec<String>,
    },
    /// Run a program: listen for clients and connect to backends.
    Run(Box<RunArgs>),
    /// Serve many programs on one set of workers, deployed through an HTTP API.
    Serve(Box<flick::serve::ServeArgs>),
    /// Deploy, inspect and undeploy services of a running `flick serve`.
    Ctl(Box<flick::ctl::CtlArgs>),
    /// Replace a running FlowBlaze machine's tables.
    #[command(subcommand)]
    Table(TableCommand),
    /// Print a program's task graphs as Graphviz DOT, or render them.
    Graph {
        /// The program.
        file: String,
        /// Render an SVG to this path with Graphviz's `dot`.
        #[arg(long, value_name = "OUT")]
        svg: Option<String>,
    },
    /// Check message grammars, or parse bytes with one.
    #[command(subcommand)]
    Grammar(GrammarCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Serve the Language Server Protocol on standard input and output, for editors.
    Lsp,
    /// Print the manual page (roff): `flick man | man -l -`, `flick man run`.
    Man {
        /// A command's own page (`flick-run(1)`) instead of `flick(1)`.
        command: Option<String>,
        /// Write every page (flick.1, flick-run.1, ...) into this directory.
        #[arg(long, value_name = "DIR", conflicts_with = "command")]
        dir: Option<String>,
    },
    /// Print programs in canonical layout, or rewrite them in place.
    Fmt {
        /// Exit non-zero, naming each file not already canonical; change nothing.
        #[arg(long, conflicts_with = "write")]
        check: bool,
        /// Rewrite the files in place instead of printing them.
        #[arg(long)]
        write: bool,
        /// Programs, or directories searched for `*.flick` files.
        #[arg(required = true)]
        paths: Vec<String>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// The program (optional with a configuration file that names it).
    file: Option<String>,
    /// Further packet programs, sharing the ports their channels name
    /// (steered by their largest common flow key).
    #[arg(value_name = "MORE")]
    more: Vec<String>,
    /// Read the settings from a TOML file; flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<String>,
    /// Bind a channel to a listening address: each connection is an instance.
    #[arg(long, value_name = "CHANNEL=ADDR")]
    listen: Vec<String>,
    /// Bind a channel (or channel array) to backend addresses.
    #[arg(long, value_name = "CHANNEL=ADDR[,ADDR...]")]
    connect: Vec<String>,
    /// Worker threads [default: one per core].
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Keep worker i on the i-th core the process may run on (see
    /// `taskset`), as nginx's `worker_cpu_affinity auto`; for a machine
    /// whose cores are set aside for Flick [default: off, the kernel
    /// places the workers].
    #[arg(long)]
    pin_workers: bool,
    /// The cooperative scheduler's timeslice, in microseconds [default: 50].
    #[arg(long, value_name = "N")]
    timeslice_us: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Write a line per answered request to FILE (appended), or to standard
    /// output for `-`: time, client, channel, backend, outcome (reply,
    /// fault, reject, refused), request and reply bytes, microseconds
    /// [default: none].
    #[arg(long, value_name = "FILE|-")]
    access_log: Option<String>,
    /// The most client connections open at once; past it, new ones wait in
    /// the listen backlog until one closes [default: 10000].
    #[arg(long, value_name = "N")]
    max_instances: Option<usize>,
    /// Task graphs made when the service starts, and kept after a burst:
    /// a connection that finds one starts without making its own, so a
    /// burst of new connections is served sooner, for about 110 KiB held
    /// per graph (HTTP balancer) from the start [default: 16].
    #[arg(long, value_name = "N")]
    graphs_ahead: Option<usize>,
    /// Capacity of every task channel, in messages [default: 64].
    #[arg(long, value_name = "N")]
    channel_capacity: Option<usize>,
    /// Entries of each dictionary in process state [default: 1024].
    #[arg(long, value_name = "N")]
    dict_capacity: Option<usize>,
    /// How long a backend may take to answer before its requests get the
    /// grammar's fault reply and it is reconnected, in ms [default: 2000].
    #[arg(long, value_name = "MS")]
    response_timeout_ms: Option<u64>,
    /// The most bytes of a request body, for a grammar with the limit
    /// `max_body_bytes` (HTTP): a Content-Length over it, or chunks that
    /// add up to more, get 413 [default: 1048576, at most 1073741824].
    #[arg(long, value_name = "N")]
    max_body_bytes: Option<u64>,
    /// A request of at most this many bytes, head and body, is read whole
    /// and checked before any of it goes to a backend, so a body that
    /// breaks its framing gets 400 and the backend sees nothing; a larger
    /// one streams. 0: every body streams [default: 16384, at most
    /// 1048576].
    #[arg(long, value_name = "N")]
    request_buffer_bytes: Option<usize>,
    /// Connections to each backend per worker, shared by the clients on
    /// that worker, requests pipelined; 0 gives each client its own
    /// [default: 1].
    #[arg(long, value_name = "N")]
    backend_connections: Option<usize>,
    /// An idle exclusive backend connection (HTTP's) unused this long is
    /// closed rather than taken again; keep it under the backends' own
    /// idle timeout (nginx's `keepalive_timeout`), or a request written as
    /// a backend closes one is lost with it. 0: kept however long, in ms
    /// [default: 4000].
    #[arg(long, value_name = "MS")]
    backend_idle_timeout_ms: Option<u64>,
    /// How long a client request may take from its first bytes to its
    /// last; past it the client gets the grammar's timeout reply (HTTP
    /// 408) or its connection closes (Memcached), as nginx's
    /// `client_header_timeout`. A connection idle between requests is not
    /// timed. 0: no limit, in ms [default: 60000].
    #[arg(long, value_name = "MS")]
    client_request_timeout_ms: Option<u64>,
    /// The most exclusive connections (HTTP's) each worker opens to each
    /// backend, busy and idle; past it a request waits for one to come
    /// back, at most the response timeout, then gets the fault reply
    /// (HTTP 503). 0: no cap [default: 0].
    #[arg(long, value_name = "N")]
    backend_max_connections: Option<usize>,
    /// How clients share a backend connection: `pipelined` (requests of
    /// many clients interleaved) or `exclusive` (one client at a time, then
    /// back to the idle ones) [default: as the grammar says: exclusive for
    /// HTTP, pipelined for Memcached].
    #[arg(long, value_name = "MODE")]
    backend_sharing: Option<String>,
    /// Which workers accept client connections: `per-worker` (a listening
    /// socket per worker, `SO_REUSEPORT`, each worker running the
    /// instances it accepts) or `single` (the first worker accepts them
    /// all) [default: per-worker; a `--fan-in` channel array accepts on
    /// one worker].
    #[arg(long, value_name = "MODE")]
    accept: Option<String>,
    /// How long a fan-in group may wait for its last connection before its
    /// job fails and its connections are reset, in ms [default: 10000].
    #[arg(long, value_name = "MS")]
    fan_in_timeout_ms: Option<u64>,
    /// How long a job keeps trying, with backoff, to reach a peer it only
    /// writes to (a reducer) before it fails and its connections are
    /// reset, in ms [default: 10000].
    #[arg(long, value_name = "MS")]
    connect_timeout_ms: Option<u64>,
    /// For a listening channel array: how many connections, in order of
    /// arrival, make up one instance (the mappers of an aggregator).
    #[arg(long, value_name = "CHANNEL=N")]
    fan_in: Vec<String>,
    /// Bind a channel (or channel array) to packet ports, making the
    /// program a packet program served over them: `pcap:FILE` (read),
    /// `pcap-out:FILE` (write), `afpacket:IFACE`, `afxdp:IFACE`, `tun:NAME`; an array's
    /// ports comma-separated. Repeatable; not with --listen/--connect.
    #[arg(long, value_name = "CHANNEL=SPEC[,SPEC...]")]
    port: Vec<String>,
    /// For a packet program: write every `global`, merged over the
    /// workers, and the port counters as JSON to FILE at the end and on
    /// SIGUSR1.
    #[arg(long, value_name = "FILE")]
    dump: Option<String>,
    /// For a FlowBlaze `.xl` program: listen on a Unix socket at PATH for
    /// `flick table load`, which replaces the running tables [default: none].
    #[arg(long, value_name = "PATH")]
    control: Option<String>,
    /// Validate the program and the configuration, then exit (like `nginx -t`).
    #[arg(long)]
    check: bool,
    /// What to log: error, warn, info, debug or trace, or `RUST_LOG`
    /// directives [default: RUST_LOG, else info].
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// How log lines on standard error are written.
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: flick::logging::LogFormat,
}

#[derive(Subcommand)]
enum TableCommand {
    /// Load FILE.xl into the machine of `flick run FILE.xl --control PATH`,
    /// keeping its flow contexts: refused if a stage's key, flow registers
    /// or states differ, or the file has errors.
    Load {
        /// The machine's control socket.
        #[arg(long, value_name = "PATH")]
        control: String,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
        /// The new program.
        file: String,
    },
}

#[derive(Subcommand)]
enum GrammarCommand {
    /// Check grammar files: syntax, field references, limits.
    Check {
        #[arg(required = true)]
        files: Vec<String>,
    },
    /// Parse messages from a file (or standard input) and print them.
    Parse {
        /// A stock grammar's name or a grammar file.
        grammar: String,
        /// The unit to parse.
        unit: String,
        /// The bytes; standard input when absent.
        input: Option<String>,
    },
}

/// Loads a grammar by stock name or path, printing diagnostics on failure.
fn load_grammar(name: &str, color: bool) -> Result<std::sync::Arc<flick_wire::Grammar>, ExitCode> {
    if let Some(g) = flick_wire::Grammar::stock(name) {
        return Ok(g);
    }
    let file = read(name)?;
    let stem = std::path::Path::new(name)
        .file_stem()
        .map_or(name.to_string(), |s| s.to_string_lossy().into_owned());
    match flick_wire::Grammar::from_source(&stem, &file.text) {
        Ok(g) => Ok(std::sync::Arc::new(g)),
        Err(e) => {
            eprint!("{}", render(&file, &e.diagnostics, color));
            eprintln!("{name}: {} error(s)", e.diagnostics.len());
            Err(ExitCode::FAILURE)
        }
    }
}

fn grammar_command(cmd: GrammarCommand, color: bool) -> ExitCode {
    match cmd {
        GrammarCommand::Check { files } => {
            let mut failed = false;
            for f in &files {
                match load_grammar(f, color) {
                    Ok(g) => println!("{f}: ok ({} units)", g.units().len()),
                    Err(_) => failed = true,
                }
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        GrammarCommand::Parse {
            grammar,
            unit,
            input,
        } => {
            let g = match load_grammar(&grammar, color) {
                Ok(g) => g,
                Err(code) => return code,
            };
            let Some(u) = g.unit_id(&unit) else {
                eprintln!("error: grammar `{}` has no unit `{unit}`", g.name);
                return ExitCode::FAILURE;
            };
            let bytes = match input {
                Some(path) => std::fs::read(&path),
                None => {
                    let mut v = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::stdin(), &mut v).map(|_| v)
                }
            };
            let bytes = match bytes {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("error: cannot read input: {e}");
                    return ExitCode::from(2);
                }
            };
            let mut p = g.parser(u);
            let mut at = 0;
            let mut streamed = 0;
            let mut head = 0;
            let mut in_message = false;
            while at < bytes.len() || in_message {
                let rest = &bytes[at..];
                in_message = true;
                match p.finish(rest) {
                    Ok(flick_wire::Progress::Done(n)) => {
                        if streamed == 0 {
                            println!("{:?}", p.message(rest));
                        } else {
                            let body = (streamed + n).saturating_sub(head);
                            println!(
                                "  ... a body of {body} bytes passed through; the message ends"
                            );
                        }
                        at += n;
                        streamed = 0;
                        head = 0;
                        in_message = false;
                        p.reset();
                    }
                    Ok(flick_wire::Progress::Head(n)) => {
                        head = n;
                        println!("{:?}", p.message(rest));
                    }
                    Ok(flick_wire::Progress::Stream(n)) => {
                        streamed += n;
                        at += n;
                    }
                    Ok(flick_wire::Progress::NeedMore) => unreachable!("finish never needs more"),
                    Err(e) => {
                        eprintln!("error: message at byte {at}: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            ExitCode::SUCCESS
        }
    }
}

/// `flick run` serves one process: a file with more is refused, at its
/// second `proc`, rather than served in part.
fn several_processes(program: &flick_syntax::ast::Program) -> Option<flick_span::Diagnostic> {
    let procs: Vec<&flick_syntax::ast::ProcDecl> = program
        .decls
        .iter()
        .filter_map(|d| match d {
            flick_syntax::ast::Decl::Proc(p) => Some(p),
            _ => None,
        })
        .collect();
    let second = procs.get(1)?;
    Some(
        flick_span::Diagnostic::error(
            "E0801",
            format!(
                "`flick run` serves one process, and this file has {}",
                procs.len()
            ),
            second.name.span,
        )
        .label(format!("`{}` would not be served", second.name.name))
        .hint(format!(
            "put each process in a file of its own and run each, or keep `{}` only",
            procs[0].name.name
        )),
    )
}

/// Why `flick run` cannot load its files: what to show (diagnostics
/// rendered) and the exit status it fails with at start.
struct RunFailure {
    message: String,
    code: ExitCode,
}

impl RunFailure {
    fn new(code: ExitCode, message: impl Into<String>) -> RunFailure {
        RunFailure {
            message: message.into(),
            code,
        }
    }
}

/// `flick run`'s program loaded and checked, with its settings: what it
/// starts with, and what each reload reads again.
struct RunLoad {
    settings: flick::config::Settings,
    loaded: flick_platform::Loaded,
    program_path: String,
    state: Vec<flick::reload::StateVar>,
}

/// A checked program over the stock `packet` grammar, with the flow key
/// its `steer` declares; `None` for any other program.
fn shared_packet_program(
    path: &str,
    text: &str,
    checked: &flick_check::CheckedProgram,
) -> Option<flick::packet_run::SharedProgram> {
    if checked.grammar.as_deref() != Some("packet") {
        return None;
    }
    let grammar = flick::views::find_grammar("packet", std::path::Path::new(path)).ok()?;
    let (program, _) = flick_syntax::parse(&flick::views::program_source(text));
    let loaded = flick_platform::Loaded::new(&program, checked, grammar).ok()?;
    Some(flick::packet_run::SharedProgram {
        path: path.to_string(),
        key: flick_packet::steering::DeclaredKey::of_module(&loaded.module),
        bounds: checked.processes.first()?.bounds.clone(),
    })
}

/// Reads the configuration file (if any) and the program, resolves the
/// settings (flags win over the file) and checks the program.
fn load_run(args: &RunArgs, color: bool) -> Result<RunLoad, RunFailure> {
    use flick::config::{resolve, FileConfig, Overrides};
    let file_config = match &args.config {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                RunFailure::new(
                    ExitCode::from(2),
                    format!("error: cannot read {path}: {e}\n"),
                )
            })?;
            let parsed = FileConfig::parse(&text)
                .map_err(|e| RunFailure::new(ExitCode::FAILURE, format!("error: {path}: {e}\n")))?;
            Some((parsed, std::path::PathBuf::from(path)))
        }
    };
    let flags = Overrides {
        program: args.file.clone(),
        listen: args.listen.clone(),
        connect: args.connect.clone(),
        workers: args.workers,
        pin_workers: args.pin_workers.then_some(true),
        timeslice_us: args.timeslice_us,
        metrics: args.metrics.clone(),
        access_log: args.access_log.clone(),
        max_instances: args.max_instances,
        graphs_ahead: args.graphs_ahead,
        channel_capacity: args.channel_capacity,
        dict_capacity: args.dict_capacity,
        response_timeout_ms: args.response_timeout_ms,
        max_body_bytes: args.max_body_bytes,
        request_buffer_bytes: args.request_buffer_bytes,
        backend_connections: args.backend_connections,
        backend_idle_timeout_ms: args.backend_idle_timeout_ms,
        client_request_timeout_ms: args.client_request_timeout_ms,
        backend_max_connections: args.backend_max_connections,
        backend_sharing: args.backend_sharing.clone(),
        accept: args.accept.clone(),
        fan_in_timeout_ms: args.fan_in_timeout_ms,
        connect_timeout_ms: args.connect_timeout_ms,
        fan_in: args.fan_in.clone(),
    };
    let settings =
        resolve(file_config.as_ref().map(|(c, p)| (c, p.as_path())), &flags).map_err(|errors| {
            let lines: String = errors.iter().map(|e| format!("error: {e}\n")).collect();
            RunFailure::new(ExitCode::FAILURE, lines)
        })?;
    let program_path = settings.program.to_string_lossy().into_owned();
    let text = std::fs::read_to_string(&program_path).map_err(|e| {
        RunFailure::new(
            ExitCode::from(2),
            format!("error: cannot read {program_path}: {e}\n"),
        )
    })?;
    let file = match flick::views::program_source(&text) {
        std::borrow::Cow::Borrowed(_) => SourceFile::new(&program_path, text),
        std::borrow::Cow::Owned(t) => SourceFile::new(&program_path, t),
    };
    let (program, _) = flick_syntax::parse(&file.text);
    let (checked, diags) = flick::views::check_program(&settings.program, &file.text);
    if !diags.is_empty() {
        return Err(RunFailure::new(
            ExitCode::FAILURE,
            render(&file, &diags, color),
        ));
    }
    if let Some(d) = several_processes(&program) {
        return Err(RunFailure::new(
            ExitCode::FAILURE,
            render(&file, &[d], color),
        ));
    }
    let found = match &checked.grammar {
        Some(gname) => flick::views::find_grammar(gname, &settings.program),
        // Records that describe their own layout are the grammar.
        None => {
            flick::views::record_grammar(&settings.program, &program, &checked).map_err(|why| {
                format!(
                    "{program_path} names no wire grammar; add a `grammar NAME` line\nnote: {why}"
                )
            })
        }
    };
    let mut grammar =
        found.map_err(|why| RunFailure::new(ExitCode::FAILURE, format!("error: {why}\n")))?;
    // The grammar's limits, before any parser copies them (the grammar
    // was just loaded: nothing else holds it yet).
    let g = std::sync::Arc::get_mut(&mut grammar).expect("a grammar of its own");
    if !g.set_limit("max_body_bytes", settings.max_body_bytes as i128)
        && args.max_body_bytes.is_some()
    {
        eprintln!(
            "warning: --max-body-bytes has no effect: the grammar of {program_path} has no \
             limit `max_body_bytes`"
        );
    }
    let mut loaded = flick_platform::Loaded::new(&program, &checked, grammar)
        .map_err(|e| RunFailure::new(ExitCode::FAILURE, format!("error: {e}\n")))?;
    loaded.source = Some(std::sync::Arc::new(file));
    let state = checked
        .processes
        .first()
        .map(flick::reload::state_vars)
        .unwrap_or_default();
    Ok(RunLoad {
        settings,
        loaded,
        program_path,
        state,
    })
}

/// The service's configuration, once its bindings check against the
/// program's channels.
fn run_service_config(
    settings: &flick::config::Settings,
    loaded: &flick_platform::Loaded,
) -> Result<flick_platform::ServiceConfig, RunFailure> {
    let code = &loaded.module.processes[loaded.process];
    let errors =
        flick::config::check_bindings(&code.name, &code.channels, &loaded.arrays, settings);
    if !errors.is_empty() {
        let lines: String = errors.iter().map(|e| format!("error: {e}\n")).collect();
        return Err(RunFailure::new(ExitCode::FAILURE, lines));
    }
    let mut config = flick_platform::ServiceConfig {
        listen: settings.listen.clone(),
        fan_in: settings.fan_in.clone(),
        connect: settings.connect.clone(),
        policy: flick_runtime::Policy::Cooperative {
            timeslice: std::time::Duration::from_micros(settings.timeslice_us),
        },
        max_instances: settings.max_instances,
        graphs_ahead: settings.graphs_ahead,
        channel_capacity: settings.channel_capacity,
        dict_capacity: settings.dict_capacity,
        response_timeout: std::time::Duration::from_millis(settings.response_timeout_ms),
        request_buffer_bytes: settings.request_buffer_bytes,
        backend_connections: settings.backend_connections,
        backend_idle_timeout: (settings.backend_idle_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(settings.backend_idle_timeout_ms)),
        client_request_timeout: (settings.client_request_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(settings.client_request_timeout_ms)),
        backend_max_connections: settings.backend_max_connections,
        backend_sharing: settings.backend_sharing,
        accept: settings.accept,
        fan_in_timeout: std::time::Duration::from_millis(settings.fan_in_timeout_ms),
        connect_timeout: std::time::Duration::from_millis(settings.connect_timeout_ms),
        // A reloaded version listens beside the old one before it goes.
        reuse_port: true,
        ..flick_platform::ServiceConfig::default()
    };
    if let Some(w) = settings.workers {
        config.workers = w;
    }
    Ok(config)
}

/// The platform's task table for `flick run`: a compute task, and a
/// reader and a writer per connection of each instance and per shared
/// backend connection, for two versions at once (the old one drains while
/// the reloaded one runs), a quarter more so each worker has ids of its own.
fn run_tasks(config: &flick_platform::ServiceConfig) -> usize {
    let fan_in = config
        .fan_in
        .iter()
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(1)
        .max(1);
    let peers: usize = config.connect.iter().map(|(_, a)| a.len()).sum();
    let workers = config.workers.max(1);
    let one = config.max_instances * (1 + 2 * (fan_in + peers))
        + 2 * config.backend_connections * workers * peers;
    2 * one * 5 / 4 + 64
}

/// Logs SIGHUP as not supported for programs `flick run` cannot reload,
/// instead of letting it end the process.
fn reload_not_supported(what: &'static str) {
    let Ok(mut signals) = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP]) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("flick-sighup".into())
        .spawn(move || {
            for _ in signals.forever() {
                tracing::warn!("SIGHUP: reload is not supported for {what}; restart to change it");
            }
        });
}

/// The version `flick run` serves now.
struct RunningVersion {
    service: std::sync::Arc<flick_platform::Service>,
    state: Vec<flick::reload::StateVar>,
    version: u64,
}

/// What a reload needs beside the arguments: the shared platform, the
/// access log every version writes to, and the metrics' view of the
/// current version.
struct Reloader<'a> {
    args: &'a RunArgs,
    platform: &'a flick_platform::Platform,
    access_log: Option<std::sync::Arc<flick_platform::access_log::AccessLog>>,
    metrics: Option<std::sync::Arc<std::sync::Mutex<flick::metrics::Render>>>,
    /// Old versions draining, joined before the process exits.
    draining: Vec<std::thread::JoinHandle<()>>,
}

impl Reloader<'_> {
    /// Re-reads and checks the files; if they check, starts the new
    /// version beside `running` and drains the old one; if not, logs why
    /// and keeps the old one.
    fn reload(&mut self, running: &mut RunningVersion) {
        let started = std::time::Instant::now();
        if let Err(e) = flick::notify::notify("RELOADING=1") {
            tracing::warn!("cannot tell the service manager it is reloading: {e}");
        }
        match self.start_next(running, started) {
            Ok(()) => {}
            Err(f) => tracing::error!(
                version = running.version,
                "reload failed; still serving the old version\n{}",
                f.message.trim_end()
            ),
        }
        if let Err(e) = flick::notify::notify("READY=1") {
            tracing::warn!("cannot tell the service manager it is ready: {e}");
        }
    }

    fn start_next(
        &mut self,
        running: &mut RunningVersion,
        started: std::time::Instant,
    ) -> Result<(), RunFailure> {
        let load = load_run(self.args, false)?;
        if !self.args.port.is_empty() || !load.settings.ports.is_empty() {
            return Err(RunFailure::new(
                ExitCode::FAILURE,
                "error: the program became a packet program; restart to run it",
            ));
        }
        let mut config = run_service_config(&load.settings, &load.loaded)?;
        config.access_log = self.access_log.clone();
        // The new version takes over the old one's listening sockets once
        // the state is carried: from then on only it accepts, and what
        // waits in the backlogs is its to accept.
        let (service, carried) = flick::reload::start_next(
            self.platform,
            load.loaded,
            config,
            &running.service,
            &running.state,
            &load.state,
        )
        .map_err(|e| RunFailure::new(ExitCode::FAILURE, format!("error: {e}")))?;
        let service = std::sync::Arc::new(service);
        if let Some(m) = &self.metrics {
            *m.lock().expect("metrics lock") = flick::metrics::render_service(service.clone());
        }
        let old = std::mem::replace(
            running,
            RunningVersion {
                service,
                state: load.state,
                version: running.version + 1,
            },
        );
        tracing::info!(
            program = %load.program_path,
            listen = %running.service.local_addr(),
            version = running.version,
            reload_us = started.elapsed().as_micros() as u64,
            carried = ?carried,
            "reloaded"
        );
        // New connections go to the new version; the old one's finish.
        let drain = std::thread::Builder::new()
            .name("flick-drain".into())
            .spawn(move || {
                let stopped = old.service.stop(flick::serve::DRAIN_DEADLINE);
                tracing::info!(
                    version = old.version,
                    drained = stopped.drained,
                    handed_over = stopped.handed_over,
                    "old version stopped"
                );
            });
        if let Ok(d) = drain {
            self.draining.push(d);
        }
        Ok(())
    }
}

fn run_command(args: RunArgs, color: bool) -> ExitCode {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    if let Some(machine) = args
        .file
        .as_deref()
        .filter(|f| flick::machine_run::is_machine(f))
    {
        return flick::machine_run::run(
            machine,
            &args.port,
            args.workers,
            args.dump.as_deref(),
            args.control.as_deref(),
            args.metrics.as_deref(),
            color,
        );
    }
    if args.control.is_some() {
        eprintln!("error: --control is for machines (`.xl` programs and `machine` items)");
        return ExitCode::FAILURE;
    }
    let RunLoad {
        settings,
        loaded,
        program_path,
        state,
    } = match load_run(&args, color) {
        Ok(l) => l,
        Err(f) => {
            eprint!("{}", f.message);
            return f.code;
        }
    };
    let packet = !args.port.is_empty() || !settings.ports.is_empty();
    if !args.more.is_empty() && !packet {
        eprintln!("error: several programs run together only over packet ports (--port)");
        return ExitCode::FAILURE;
    }
    if packet {
        reload_not_supported("packet programs");
        let mut others = Vec::new();
        let mut args = args;
        for path in std::mem::take(&mut args.more) {
            args.file = Some(path.clone());
            match load_run(&args, color) {
                Ok(l) => others.push((path, l.loaded)),
                Err(f) => {
                    eprint!("{}", f.message);
                    return f.code;
                }
            }
        }
        return flick::packet_run::run(flick::packet_run::PacketRun {
            others,
            loaded,
            settings: &settings,
            ports: &args.port,
            dump: args.dump.as_deref(),
            check: args.check,
            log_level: args.log_level.as_deref(),
            log_format: args.log_format,
            program_path: &program_path,
        });
    }
    flick::open_files::raise_to_hard_limit();
    let mut config = match run_service_config(&settings, &loaded) {
        Ok(c) => c,
        Err(f) => {
            eprint!("{}", f.message);
            return f.code;
        }
    };
    if args.check {
        match &args.config {
            Some(c) => println!("{c}: program {program_path} and configuration are valid"),
            None => println!("{program_path}: program and configuration are valid"),
        }
        return ExitCode::SUCCESS;
    }
    if let Err(e) = flick::logging::init(args.log_level.as_deref(), args.log_format) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let reload = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone());
    // Bound before the service starts, so that a taken port fails early.
    let metrics_listener = match settings.metrics {
        None => None,
        Some(addr) => match std::net::TcpListener::bind(addr) {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("error: cannot listen on {addr} for metrics: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    // Opened before the service starts, so that a bad path fails early.
    let access_log = match &settings.access_log {
        None => None,
        Some(dest) => match flick_platform::access_log::AccessLog::open(dest, config.workers) {
            Ok(log) => Some(log),
            Err(e) => {
                eprintln!("error: cannot open the access log {dest}: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    config.access_log = access_log.clone();
    // The listeners share their port (SO_REUSEPORT) so that a reloaded
    // version can bind beside the old one; that would also let a second
    // `flick run` on the same address share it without a word. A plain
    // bind first fails as nginx does when anything listens there already;
    // it does not listen, so no connection made meanwhile is reset.
    for (chan, addr) in &config.listen {
        if addr.port() == 0 {
            continue;
        }
        if let Err(e) = flick_platform::Service::check_address_free(*addr) {
            eprintln!("error: cannot listen on {addr} for channel `{chan}`: {e}");
            return ExitCode::FAILURE;
        }
    }
    // A platform of its own, so that a reloaded version starts on the same
    // workers beside the old one.
    let platform = match flick_platform::Platform::start(flick_platform::PlatformConfig {
        workers: config.workers,
        policy: config.policy,
        tasks: run_tasks(&config),
        pin: settings.pin_workers,
    }) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let service = match flick_platform::Service::start_on(&platform, loaded, config) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "flick: {program_path} listening on {}",
        service.local_addr()
    );
    // Each scrape reads the version serving now.
    let metrics_render = Arc::new(std::sync::Mutex::new(flick::metrics::render_service(
        service.clone(),
    )));
    let metrics = match metrics_listener {
        None => None,
        Some(l) => {
            let current = metrics_render.clone();
            let render: flick::metrics::Render = Arc::new(move |format| {
                let now = current.lock().expect("metrics lock").clone();
                now(format)
            });
            match flick::metrics::MetricsServer::start(l, render) {
                Ok(m) => {
                    println!("flick: metrics on http://{}/metrics", m.local_addr());
                    Some(m)
                }
                Err(e) => {
                    eprintln!("error: cannot serve metrics: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    // Under systemd (`Type=notify`, deploy/flick.service): started now.
    if let Err(e) = flick::notify::notify("READY=1") {
        tracing::warn!("cannot tell the service manager it is ready: {e}");
    }
    let mut running = RunningVersion {
        service,
        state,
        version: 1,
    };
    let mut reloader = Reloader {
        args: &args,
        platform: &platform,
        access_log: access_log.clone(),
        metrics: metrics.is_some().then_some(metrics_render),
        draining: Vec::new(),
    };
    while !stop.load(Ordering::Relaxed) {
        if reload.swap(false, Ordering::Relaxed) {
            reloader.reload(&mut running);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = flick::notify::notify("STOPPING=1");
    if let Some(m) = metrics {
        m.stop();
    }
    // Stop accepting, let open connections finish their requests, then exit.
    let service = &running.service;
    service.drain();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while service.stats().graphs_live.load(Ordering::Relaxed) > 0
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for d in reloader.draining.drain(..) {
        let _ = d.join();
    }
    // The lines of the requests answered in the drain are written out.
    if let Some(log) = &access_log {
        log.close();
    }
    println!("flick: stopped");
    ExitCode::SUCCESS
}

/// Renders DOT to SVG with Graphviz (Debian package `graphviz`).
fn render_svg(dot: &str, out: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new("dot")
        .args(["-Tsvg", "-o", out])
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(dot.as_bytes())?;
    let status = child.wait()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("dot exited with {status}")))
    }
}

/// A program file as the checker sees it: with the library its grammar
/// brings (`grammar packet` brings lib/packet.flick) after the user's text.
fn read_program(path: &str) -> Result<SourceFile, ExitCode> {
    let file = read(path)?;
    match flick::views::program_source(&file.text) {
        std::borrow::Cow::Borrowed(_) => Ok(file),
        std::borrow::Cow::Owned(text) => Ok(SourceFile::new(path, text)),
    }
}

fn read(path: &str) -> Result<SourceFile, ExitCode> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(SourceFile::new(path, text)),
        Err(e) => {
            eprintln!("error: cannot read {path}: {e}");
            Err(ExitCode::from(2))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    flick_grammars::install();
    let color = std::io::stderr().is_terminal();
    match cli.command {
        Command::Grammar(cmd) => grammar_command(cmd, color),
        Command::Run(args) => run_command(*args, color),
        Command::Serve(args) => flick::serve::main(*args),
        Command::Ctl(args) => flick::ctl::main(*args),
        Command::Table(TableCommand::Load {
            control,
            json,
            file,
        }) => {
            if flick::table_load::load_command(&control, &file, json) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Graph { file: path, svg } => {
            let file = match read_program(&path) {
                Ok(f) => f,
                Err(code) => return code,
            };
            let (program, _) = flick_syntax::parse(&file.text);
            let (checked, diags) =
                flick::views::check_program(std::path::Path::new(&path), &file.text);
            if !diags.is_empty() {
                eprint!("{}", render(&file, &diags, color));
                return ExitCode::FAILURE;
            }
            let dot = flick_compile::to_dot(&flick_compile::task_graphs(&program, &checked));
            match svg {
                None => {
                    print!("{dot}");
                    ExitCode::SUCCESS
                }
                Some(out) => match render_svg(&dot, &out) {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("error: cannot render {out} with Graphviz `dot`: {e}");
                        ExitCode::FAILURE
                    }
                },
            }
        }
        Command::Check { bounds, files } => {
            let mut failed = false;
            // Packet programs given together may share a port: their
            // steering plan and combined bound follow the files' lines.
            let mut packet_programs = Vec::new();
            for path in &files {
                if let Some(procs) = flick::machine_run::machine_file(path) {
                    failed |= !flick::machine_run::check(path, color, bounds);
                    // Processes beside the machine are checked as usual.
                    if !procs {
                        continue;
                    }
                }
                let file = match read_program(path) {
                    Ok(f) => f,
                    Err(code) => return code,
                };
                let (checked, diags) =
                    flick::views::check_program(std::path::Path::new(path), &file.text);
                if diags.is_empty() {
                    // Operations that may fault: accepted, and said where.
                    if !checked.warnings.is_empty() {
                        eprint!("{}", render(&file, &checked.warnings, color));
                    }
                    match checked.warnings.len() {
                        0 => println!("{path}: ok"),
                        1 => println!("{path}: ok, 1 operation may fault"),
                        n => println!("{path}: ok, {n} operations may fault"),
                    }
                    if bounds {
                        print!("{}", bounds_report(&checked));
                    }
                    if let Some(p) = shared_packet_program(path, &file.text, &checked) {
                        packet_programs.push(p);
                    }
                } else {
                    failed = true;
                    eprint!("{}", render(&file, &diags, color));
                    let s = if diags.len() == 1 { "" } else { "s" };
                    eprintln!("{path}: {} error{s}", diags.len());
                }
            }
            if packet_programs.len() > 1 {
                print!(
                    "{}",
                    flick::packet_run::shared_port_report(&packet_programs)
                );
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Fmt {
            check,
            write,
            paths,
        } => fmt_files(&paths, check, write, color),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "flick", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Lsp => match flick::lsp::serve_stdio() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: flick lsp: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Man { command, dir } => man_pages(command.as_deref(), dir.as_deref()),
    }
}

/// `flick fmt`: each program printed in canonical layout, checked (`--check`)
/// or rewritten (`--write`); directories are searched for `*.flick` files.
fn fmt_files(paths: &[String], check: bool, write: bool, color: bool) -> ExitCode {
    let mut files = Vec::new();
    for p in paths {
        if let Err(e) = flick_files(std::path::Path::new(p), &mut files) {
            eprintln!("error: {p}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if files.len() > 1 && !check && !write {
        eprintln!("error: printing several files would join them: use --write or --check");
        return ExitCode::FAILURE;
    }
    let mut failed = false;
    for path in files {
        let path = path.display().to_string();
        let file = match read(&path) {
            Ok(f) => f,
            Err(_) => {
                failed = true;
                continue;
            }
        };
        let (program, comments, diags) = flick_syntax::parse_with_comments(&file.text);
        if !diags.is_empty() {
            eprint!("{}", render(&file, &diags, color));
            failed = true;
            continue;
        }
        let text = flick_syntax::format_with_comments(&program, &comments);
        if check {
            if text != file.text {
                eprintln!("{path}: not in canonical layout (run `flick fmt --write {path}`)");
                failed = true;
            }
        } else if write {
            if text != file.text {
                if let Err(e) = std::fs::write(&path, &text) {
                    eprintln!("error: {path}: {e}");
                    failed = true;
                    continue;
                }
                println!("{path}: formatted");
            }
        } else {
            print!("{text}");
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `path` itself if it is a file, else every `*.flick` file below it, sorted.
fn flick_files(path: &std::path::Path, out: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    if !path.is_dir() {
        std::fs::metadata(path)?;
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<_> = std::fs::read_dir(path)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for e in entries {
        if e.is_dir() {
            flick_files(&e, out)?;
        } else if e.extension().is_some_and(|x| x == "flick") {
            out.push(e);
        }
    }
    Ok(())
}

/// `flick man`: `flick(1)`, one command's page, or every page into a directory.
fn man_pages(command: Option<&str>, dir: Option<&str>) -> ExitCode {
    let cli = Cli::command();
    let result = if let Some(dir) = dir {
        clap_mangen::generate_to(cli, dir)
    } else if let Some(name) = command {
        // Built as `generate_to` builds it, so the page is flick-run(1).
        let mut cli = cli.disable_help_subcommand(true);
        cli.build();
        let Some(sub) = cli.find_subcommand(name) else {
            eprintln!("error: no command `{name}` (see `flick --help`)");
            return ExitCode::FAILURE;
        };
        clap_mangen::Man::new(sub.clone()).render(&mut std::io::stdout())
    } else {
        clap_mangen::Man::new(cli).render(&mut std::io::stdout())
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
