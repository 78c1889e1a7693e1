//! The isolation benchmark (issue 22): a light service and a busy neighbour
//! on one platform's workers. The light service (examples/static_web.flick)
//! answers small HTTP requests from one paced client; the busy one answers
//! each request after folding over nested lists (`L`^3 steps, millions of
//! interpreter operations), driven by clients of its own in closed loops.
//! For each way of sharing the workers it reports the light service's
//! latency alone and beside the busy one, and the busy one's throughput:
//!
//! - `no groups`: both services in the platform's default group (weight
//!   0), first come first served, as before groups existed;
//! - `1:1` and `4:1`: each service in a group of its own, the light one's
//!   weight first.
//!
//! Every service listens on 127.0.0.1, on ports from `--port` (below
//! 32768); the counts bound each run (about `--requests` / `--rate`
//! seconds). The platform's workers are pinned to the first cores, the
//! clients to the last core.
//!
//! Each figure is the median over `--repeat` rounds (3; at most 5), the
//! modes taking turns within a round, so that a neighbour on the machine
//! weighs on every mode alike.
//!
//! Run: `cargo run --release -p isolation -- [--workers N] [--requests N]
//! [--rate N] [--busy-clients N] [--fold N] [--port N] [--repeat N] [--out FILE]`

use flick_platform::{Loaded, Platform, PlatformConfig, Service, ServiceConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Options {
    workers: usize,
    /// Light requests per measurement.
    requests: usize,
    /// Light requests a second.
    rate: u64,
    busy_clients: usize,
    /// Elements of each list the busy service folds over (three deep).
    fold: usize,
    port: u16,
    /// Rounds over every mode; each figure is the median of the rounds'.
    repeat: usize,
    out: Option<String>,
}

fn options() -> Options {
    let mut o = Options {
        workers: 1,
        requests: 10_000,
        rate: 2_000,
        busy_clients: 4,
        fold: 64,
        port: 23300,
        repeat: 3,
        out: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let value = |i: usize| -> u64 {
            args.get(i + 1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{} needs a number", args[i]))
        };
        match args[i].as_str() {
            "--workers" => o.workers = value(i) as usize,
            "--requests" => o.requests = value(i) as usize,
            "--rate" => o.rate = value(i).max(1),
            "--busy-clients" => o.busy_clients = value(i) as usize,
            "--fold" => o.fold = value(i) as usize,
            "--port" => o.port = value(i) as u16,
            "--repeat" => o.repeat = (value(i) as usize).clamp(1, 5),
            "--out" => o.out = args.get(i + 1).cloned(),
            "--help" | "-h" => {
                println!(
                    "isolation [--workers N] [--requests N] [--rate N] [--busy-clients N] [--fold N] [--port N] [--repeat N] [--out FILE]"
                );
                std::process::exit(0);
            }
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    assert!(o.port < 32768 - 32, "--port: listen below 32768");
    o
}

fn load(src: &str) -> Loaded {
    let (program, diags) = flick_syntax::parse(src);
    assert!(diags.is_empty(), "{diags:?}");
    let (checked, diags) = flick_check::check(&program);
    assert!(diags.is_empty(), "{diags:?}");
    let grammar = flick_wire::Grammar::stock("http").expect("the http grammar");
    Loaded::new(&program, &checked, grammar).expect("the program loads")
}

fn light_program() -> Loaded {
    // From the repository root, where bench/isolation.sh runs it (also a
    // copy of the repository on another machine), else where it was built.
    let here = "examples/static_web.flick";
    let path = if std::path::Path::new(here).exists() {
        here
    } else {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/static_web.flick"
        )
    };
    load(&std::fs::read_to_string(path).expect("examples/static_web.flick"))
}

/// An HTTP service whose every answer costs `n`^3 fold steps.
fn busy_program(n: usize) -> Loaded {
    let list = (1..=n)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let src = format!(
        r#"grammar http

type request: record
  target : string

type simple_response: record
  status : integer {{size=2}}
  reason : string
  body : string

proc Busy: (request/simple_response client)
  | client => respond(client)

fun respond: (-/simple_response client, req: request) -> ()
  let n = fold(outer, 0, [{list}])
  if n = 7:
    simple_response(200, "OK", "seven\n") => client
  else:
    simple_response(200, "OK", "folded\n") => client

fun outer: (acc: integer, x: integer) -> (integer)
  fold(middle, acc + x, [{list}])

fun middle: (acc: integer, y: integer) -> (integer)
  fold(step, acc + y, [{list}])

fun step: (acc: integer, z: integer) -> (integer)
  (acc * 31 + z) mod 1000003
"#
    );
    load(&src)
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n";

/// Sends a request on `s` and reads its response (head and a
/// `Content-Length` body) into `buf`.
fn exchange(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    s.write_all(GET)?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(head) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&buf[..head]).to_ascii_lowercase();
            let len: usize = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= head + 4 + len {
                return Ok(());
            }
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => {
                s.set_nodelay(true).expect("nodelay");
                s.set_read_timeout(Some(Duration::from_secs(20)))
                    .expect("timeout");
                return s;
            }
            Err(e) if Instant::now() > deadline => panic!("cannot connect to {addr}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn pin_client(core: Option<core_affinity::CoreId>) {
    if let Some(c) = core {
        core_affinity::set_for_current(c);
    }
}

/// The light client: `n` requests, one every 1/`rate` s on one
/// connection (or as soon as the last is answered, if that is later);
/// each one's latency, sorted, and the rate achieved.
fn light_load(
    addr: SocketAddr,
    n: usize,
    rate: u64,
    core: Option<core_affinity::CoreId>,
) -> (Vec<Duration>, f64) {
    pin_client(core);
    let mut s = connect(addr);
    let mut buf = Vec::with_capacity(4096);
    // A few to warm the connection's instance.
    for _ in 0..50 {
        exchange(&mut s, &mut buf).expect("a light answer");
    }
    let gap = Duration::from_nanos(1_000_000_000 / rate);
    let start = Instant::now();
    let mut next = start;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += gap;
        let t = Instant::now();
        exchange(&mut s, &mut buf).expect("a light answer");
        lat.push(t.elapsed());
    }
    let achieved = n as f64 / start.elapsed().as_secs_f64();
    lat.sort();
    (lat, achieved)
}

/// The busy clients: closed loops until `stop`; answers counted.
fn busy_load(
    addr: SocketAddr,
    clients: usize,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    core: Option<core_affinity::CoreId>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..clients)
        .map(|_| {
            let (stop, answered) = (stop.clone(), answered.clone());
            std::thread::spawn(move || {
                pin_client(core);
                let mut s = connect(addr);
                let mut buf = Vec::with_capacity(4096);
                while !stop.load(Ordering::Relaxed) {
                    exchange(&mut s, &mut buf).expect("a busy answer");
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect()
}

fn pct(v: &[Duration], p: f64) -> f64 {
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1e6
}

struct Row {
    /// Light answers a second beside the busy service.
    light_rate: f64,
    alone: (f64, f64, f64),
    busy: (f64, f64, f64),
    busy_rate: f64,
    light_cpu: Duration,
    busy_cpu: Duration,
}

fn measure(o: &Options, weights: (u32, u32), port: u16) -> Row {
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let client_core = cores.last().copied();
    let platform = Platform::start(PlatformConfig {
        workers: o.workers,
        tasks: 1 << 14,
        pin: true,
        ..PlatformConfig::default()
    })
    .expect("a platform");
    let config = |port: u16, weight: u32| ServiceConfig {
        listen: vec![("client".into(), SocketAddr::from(([127, 0, 0, 1], port)))],
        max_instances: 64,
        weight,
        ..ServiceConfig::default()
    };
    let light = Service::start_on(&platform, light_program(), config(port, weights.0))
        .expect("the light service");
    let busy = Service::start_on(&platform, busy_program(o.fold), config(port + 1, weights.1))
        .expect("the busy service");
    let (alone, _) = light_load(light.local_addr(), o.requests, o.rate, client_core);

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let clients = busy_load(
        busy.local_addr(),
        o.busy_clients,
        stop.clone(),
        answered.clone(),
        client_core,
    );
    // The busy service is busy before the light one is measured.
    std::thread::sleep(Duration::from_millis(500));
    let (cpu0, bcpu0) = (light.cpu_charged(), busy.cpu_charged());
    let from = (Instant::now(), answered.load(Ordering::Relaxed));
    let (beside, light_rate) = light_load(light.local_addr(), o.requests, o.rate, client_core);
    let busy_rate =
        (answered.load(Ordering::Relaxed) - from.1) as f64 / from.0.elapsed().as_secs_f64();
    let (light_cpu, busy_cpu) = (light.cpu_charged() - cpu0, busy.cpu_charged() - bcpu0);
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("a busy client");
    }
    light.stop(Duration::from_secs(5));
    busy.stop(Duration::from_secs(5));
    let summary = |v: &[Duration]| (pct(v, 0.5), pct(v, 0.99), pct(v, 0.999));
    Row {
        light_rate,
        alone: summary(&alone),
        busy: summary(&beside),
        busy_rate,
        light_cpu,
        busy_cpu,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let o = options();
    let modes = [
        ("no groups (before)", (0, 0)),
        ("groups 1:1", (1, 1)),
        ("groups 4:1", (4, 1)),
    ];
    let mut rows: Vec<Vec<Row>> = modes.iter().map(|_| Vec::new()).collect();
    for round in 0..o.repeat {
        for (i, (mode, weights)) in modes.into_iter().enumerate() {
            let port = o.port + 2 * (round * modes.len() + i) as u16;
            let r = measure(&o, weights, port);
            eprintln!(
                "round {round} {mode}: alone p99 {:.0} us, beside p99 {:.0} us, light {:.0}/s, busy {:.1}/s",
                r.alone.1, r.busy.1, r.light_rate, r.busy_rate
            );
            rows[i].push(r);
        }
    }
    let mut out = String::new();
    out.push_str(&format!(
        "isolation: {} worker(s); light: static_web, 1 client, {} requests at {}/s; busy: {}^3 fold steps per request, {} closed-loop clients; median of {} rounds\n\n",
        o.workers, o.requests, o.rate, o.fold, o.busy_clients, o.repeat
    ));
    out.push_str("| sharing (light:busy) | light alone p50 us | p99 us | p99.9 us | beside busy p50 us | p99 us | p99.9 us | p99 rise | light answers/s | busy answers/s | light:busy CPU charged |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for ((mode, _), rs) in modes.iter().zip(&rows) {
        let m = |f: &dyn Fn(&Row) -> f64| median(rs.iter().map(f).collect());
        let (a50, a99, a999) = (m(&|r| r.alone.0), m(&|r| r.alone.1), m(&|r| r.alone.2));
        let (b50, b99, b999) = (m(&|r| r.busy.0), m(&|r| r.busy.1), m(&|r| r.busy.2));
        let busy_cpu = m(&|r| r.busy_cpu.as_secs_f64());
        let charged = if busy_cpu == 0.0 {
            "-".to_string()
        } else {
            format!(
                "{:.3}",
                m(&|r| r.light_cpu.as_secs_f64() / r.busy_cpu.as_secs_f64().max(1e-9))
            )
        };
        out.push_str(&format!(
            "| {mode} | {a50:.0} | {a99:.0} | {a999:.0} | {b50:.0} | {b99:.0} | {b999:.0} | {:+.0}% | {:.0} | {:.1} | {charged} |\n",
            (b99 / a99 - 1.0) * 100.0,
            m(&|r| r.light_rate),
            m(&|r| r.busy_rate),
        ));
    }
    print!("{out}");
    if let Some(path) = &o.out {
        std::fs::write(path, out).expect("write --out");
    }
}
