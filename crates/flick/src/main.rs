//! `flick`: check, format and (in later versions) run Flick programs.

use clap::{Parser, Subcommand};
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
    Run(RunArgs),
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
    /// Print a program in canonical layout.
    Fmt {
        /// Exit non-zero, printing nothing, if the file is not already canonical.
        #[arg(long)]
        check: bool,
        /// The program to format.
        file: String,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// The program.
    file: String,
    /// Bind a channel to a listening address: each connection is an instance.
    #[arg(long, value_name = "CHANNEL=ADDR")]
    listen: Vec<String>,
    /// Bind a channel (or channel array) to backend addresses.
    #[arg(long, value_name = "CHANNEL=ADDR[,ADDR...]")]
    connect: Vec<String>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// The cooperative scheduler's timeslice, in microseconds.
    #[arg(long, value_name = "N", default_value_t = 50)]
    timeslice_us: u64,
    /// Validate the program and the configuration, then exit (like `nginx -t`).
    #[arg(long)]
    check: bool,
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
            let mut in_message = false;
            while at < bytes.len() || in_message {
                let rest = &bytes[at..];
                in_message = true;
                match p.finish(rest) {
                    Ok(flick_wire::Progress::Done(n)) => {
                        if streamed == 0 {
                            println!("{:?}", p.message(rest));
                        } else {
                            println!("  ... {} more bytes; message ends", streamed + n);
                        }
                        at += n;
                        streamed = 0;
                        in_message = false;
                        p.reset();
                    }
                    Ok(flick_wire::Progress::Head(_)) => println!("{:?}", p.message(rest)),
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

fn parse_binding(s: &str) -> Result<(String, Vec<std::net::SocketAddr>), String> {
    let (chan, addrs) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not CHANNEL=ADDR"))?;
    let addrs = addrs
        .split(',')
        .map(|a| {
            std::net::ToSocketAddrs::to_socket_addrs(a)
                .map_err(|e| format!("`{a}`: {e}"))?
                .next()
                .ok_or_else(|| format!("`{a}` resolves to nothing"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((chan.to_string(), addrs))
}

fn run_command(args: RunArgs, color: bool) -> ExitCode {
    let file = match read(&args.file) {
        Ok(f) => f,
        Err(code) => return code,
    };
    let (program, _) = flick_syntax::parse(&file.text);
    let (checked, diags) =
        flick::views::check_program(std::path::Path::new(&args.file), &file.text);
    if !diags.is_empty() {
        eprint!("{}", render(&file, &diags, color));
        return ExitCode::FAILURE;
    }
    let Some(gname) = &checked.grammar else {
        eprintln!(
            "error: {} names no wire grammar; add a `grammar NAME` line",
            args.file
        );
        return ExitCode::FAILURE;
    };
    let grammar = match flick::views::find_grammar(gname, std::path::Path::new(&args.file)) {
        Ok(g) => g,
        Err(why) => {
            eprintln!("error: {why}");
            return ExitCode::FAILURE;
        }
    };
    let loaded = match flick_platform::Loaded::new(&program, &checked, grammar) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut config = flick_platform::ServiceConfig::default();
    for b in &args.listen {
        match parse_binding(b) {
            Ok((c, a)) if a.len() == 1 => config.listen.push((c, a[0])),
            Ok(_) => {
                eprintln!("error: --listen {b}: one address per listening channel");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("error: --listen {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    for b in &args.connect {
        match parse_binding(b) {
            Ok(binding) => config.connect.push(binding),
            Err(e) => {
                eprintln!("error: --connect {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(w) = args.workers {
        config.workers = w.max(1);
    }
    if !(1..=10_000).contains(&args.timeslice_us) {
        eprintln!("error: --timeslice-us must be between 1 and 10000");
        return ExitCode::FAILURE;
    }
    config.policy = flick_runtime::Policy::Cooperative {
        timeslice: std::time::Duration::from_micros(args.timeslice_us),
    };
    if args.check {
        if config.listen.is_empty() {
            eprintln!("error: nothing listens: bind a channel with --listen");
            return ExitCode::FAILURE;
        }
        println!("{}: program and configuration are valid", args.file);
        return ExitCode::SUCCESS;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let service = match flick_platform::Service::start(loaded, config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("flick: {} listening on {}", args.file, service.local_addr());
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Stop accepting, let open connections finish their requests, then exit.
    service.stop_accepting();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while service
        .stats()
        .graphs_live
        .load(std::sync::atomic::Ordering::Relaxed)
        > 0
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
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
    let color = std::io::stderr().is_terminal();
    match cli.command {
        Command::Grammar(cmd) => grammar_command(cmd, color),
        Command::Run(args) => run_command(args, color),
        Command::Graph { file: path, svg } => {
            let file = match read(&path) {
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
            for path in &files {
                let file = match read(path) {
                    Ok(f) => f,
                    Err(code) => return code,
                };
                let (checked, diags) =
                    flick::views::check_program(std::path::Path::new(path), &file.text);
                if diags.is_empty() {
                    println!("{path}: ok");
                    if bounds {
                        print!("{}", bounds_report(&checked));
                    }
                } else {
                    failed = true;
                    eprint!("{}", render(&file, &diags, color));
                    let s = if diags.len() == 1 { "" } else { "s" };
                    eprintln!("{path}: {} error{s}", diags.len());
                }
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Fmt { check, file: path } => {
            let file = match read(&path) {
                Ok(f) => f,
                Err(code) => return code,
            };
            let (program, comments, diags) = flick_syntax::parse_with_comments(&file.text);
            if !diags.is_empty() {
                eprint!("{}", render(&file, &diags, color));
                return ExitCode::FAILURE;
            }
            let text = flick_syntax::format_with_comments(&program, &comments);
            if check {
                if text != file.text {
                    eprintln!("{path}: not in canonical layout (run `flick fmt {path}`)");
                    return ExitCode::FAILURE;
                }
            } else {
                print!("{text}");
            }
            ExitCode::SUCCESS
        }
    }
}
