//! Packets per second of the packet examples (`examples/packets/`) from
//! frames held in memory: Flick's engine (`flick-packet`, the program as
//! `flick run` loads it, an in-memory port in, a port that counts and
//! discards out) against the same logic written by hand in Rust
//! (`flick_testkit::packet_model`), at each worker count.
//!
//! The hand-written program at one worker is one thread looping over the
//! frames; at N workers, the main thread parses each frame's key and
//! hands its index to the worker the key's hash names (a bounded queue
//! each), as Flick's dispatcher does. Prints one JSON object per run and
//! a table; `bench/packets.sh` runs it and keeps the results.
//!
//! On a 2-core virtual machine shared with other builds (so ±15% from run
//! to run), 600,000 frames, one worker: the flow tracker 1.2 M frames/s
//! and port knocking 1.2 M (0.7-0.8 M each when every frame crossed the
//! threads alone, three channel operations per frame), against 22 M and
//! 15 M by hand. With rules flattened and run in their typed form
//! (`crates/exec/src/typed.rs`) the worker spent about 410 ns of CPU a
//! frame (840 ns before); with dictionary slots remembered between a
//! lookup and its write, integers passed to and from the host unboxed
//! and tests fused with their jumps, about 305 ns: what remains is the
//! two dictionary probes a frame (a third), the typed form's dispatch (a
//! quarter) and field reads (docs/performance.md, "Packet programs").
//!
//!   packet-rate [--workers "1 2 4"] [--frames N] [--flows N] [--reps N]
//!   packet-rate machines [--frames N] [--reps N] [--slots N]
//!
//! `machines` measures FlowBlaze's use cases on `flick_machine`'s engine
//! instead (see the module `machines`).

mod machines;

use crossbeam_queue::ArrayQueue;
use flick_packet::{Binding, BoundPort, PacketConfig, PacketService};
use flick_packet_io::{Port, PortError, RecvStatus, RxPort, TxPort};
use flick_testkit::packet_model::{parse, FlowTracker, Key, PortKnocking, KNOCKS};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The programs compared, in the order they run.
const PROGRAMS: [&str; 2] = ["flow_tracker", "port_knocking"];

struct Args {
    workers: Vec<usize>,
    frames: usize,
    flows: usize,
    reps: usize,
    /// Which programs to run (both unless told).
    programs: Vec<String>,
}

/// Says what is wrong with the command line and how to use it, then exits 2.
fn usage_error(what: &str) -> ! {
    eprint!("packet-rate: {what}\n\n{USAGE}");
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args {
        workers: vec![1, 2, 4],
        frames: 1_000_000,
        flows: 10_000,
        reps: 3,
        programs: PROGRAMS.map(String::from).to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .unwrap_or_else(|| usage_error(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--workers" => {
                a.workers = value
                    .split_whitespace()
                    .map(|w| w.parse().unwrap())
                    .collect()
            }
            "--frames" => a.frames = value.parse().unwrap(),
            "--flows" => a.flows = value.parse().unwrap(),
            "--reps" => a.reps = value.parse().unwrap(),
            "--programs" => {
                a.programs = value.split_whitespace().map(String::from).collect();
                if let Some(p) = a.programs.iter().find(|p| !PROGRAMS.contains(&p.as_str())) {
                    usage_error(&format!("no program {p}"))
                }
            }
            _ => usage_error(&format!("unknown flag {flag}")),
        }
    }
    a
}

/// A 64-byte Ethernet/IPv4 frame, TCP or UDP, from `src` to `dst`.
fn frame(src: u32, dst: u32, sport: u16, dport: u16, tcp: bool) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    let l4 = if tcp { 20 } else { 8 };
    let total = (20 + l4 + 6) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, if tcp { 6 } else { 17 }, 0, 0]);
    f.extend_from_slice(&src.to_be_bytes());
    f.extend_from_slice(&dst.to_be_bytes());
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    if tcp {
        f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
    } else {
        f.extend_from_slice(&((8 + 6) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
    }
    f.resize(64, 0);
    f
}

use flick_testkit::rng::Xorshift as Rng;

/// The tracker's traffic: `frames` frames over `flows` random 5-tuples
/// (as Enif-Lang's pfq-gen), TCP and UDP.
fn tracker_traffic(frames: usize, flows: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng(7);
    let tuples: Vec<Vec<u8>> = (0..flows)
        .map(|_| {
            let r = rng.next();
            frame(
                0x0a00_0000 | (r as u32 & 0xffff),
                0xc0a8_0000 | (r >> 16) as u32 & 0xff,
                (r >> 24) as u16,
                80,
                r & 1 == 0,
            )
        })
        .collect();
    (0..frames)
        .map(|_| tuples[rng.next() as usize % flows].clone())
        .collect()
}

/// The firewall's traffic: `flows` sources, each knocking (right or
/// not) and then opening SSH, interleaved at random, with the rest of
/// the frames SSH and web traffic from them.
fn knock_traffic(frames: usize, flows: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng(11);
    let server = 0x0a00_0016;
    let mut out = Vec::with_capacity(frames);
    for s in 0..flows as u32 {
        let src = 0x0a01_0000 + s;
        let right = s & 1 == 0;
        for (i, p) in KNOCKS.iter().enumerate() {
            let port = if right || i < 2 { *p } else { 9999 };
            out.push(frame(src, server, 40000 + i as u16, port, true));
        }
    }
    while out.len() < frames {
        let s = (rng.next() % flows as u64) as u32;
        let dport = if rng.next() & 3 == 0 { 80 } else { 22 };
        out.push(frame(0x0a01_0000 + s, server, 50000, dport, true));
    }
    out.truncate(frames.max(flows * 4));
    out
}

/// Frames from memory, then the end.
struct MemoryRx {
    frames: Arc<Vec<Vec<u8>>>,
    at: usize,
}

impl RxPort for MemoryRx {
    fn recv_batch(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError> {
        if self.at == self.frames.len() {
            return Ok(RecvStatus::End);
        }
        let end = (self.at + max).min(self.frames.len());
        for (i, frame) in self.frames[self.at..end].iter().enumerate() {
            f(frame, (self.at + i) as u64);
        }
        let n = end - self.at;
        self.at = end;
        Ok(RecvStatus::Frames(n))
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// Counts and discards.
struct NullTx(u64);

impl TxPort for NullTx {
    fn send(&mut self, _frame: &[u8], _ts: u64) -> Result<(), PortError> {
        self.0 += 1;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), PortError> {
        Ok(())
    }
}

fn load(program: &str) -> flick_platform::Loaded {
    // From the repository root, or from where this was built (a copy of
    // the binary run elsewhere finds the programs in its working directory).
    let path = match Path::new(program).exists() {
        true => Path::new(program).to_path_buf(),
        false => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(program),
    };
    let text = std::fs::read_to_string(&path).unwrap();
    let text = flick::views::program_source(&text).into_owned();
    let (ast, _) = flick_syntax::parse(&text);
    let (checked, diags) = flick::views::check_program(&path, &text);
    assert!(diags.is_empty(), "{program} does not check");
    let grammar = flick::views::find_grammar(checked.grammar.as_deref().unwrap(), &path).unwrap();
    flick_platform::Loaded::new(&ast, &checked, grammar).unwrap()
}

/// Seconds Flick's engine takes over `frames` with `workers`.
fn flick(
    program: &str,
    input: &str,
    output: Option<&str>,
    frames: &Arc<Vec<Vec<u8>>>,
    workers: usize,
) -> Duration {
    let config = PacketConfig {
        workers,
        dict_capacity: 65536,
        ..PacketConfig::default()
    };
    let service = PacketService::new(load(program), config).unwrap();
    let mut bindings = vec![Binding {
        channel: input.into(),
        ports: vec![BoundPort {
            spec: "memory".into(),
            port: Port {
                rx: Some(Box::new(MemoryRx {
                    frames: frames.clone(),
                    at: 0,
                })),
                tx: None,
            },
            live: false,
        }],
    }];
    if let Some(out) = output {
        bindings.push(Binding {
            channel: out.into(),
            ports: vec![BoundPort {
                spec: "null".into(),
                port: Port {
                    rx: None,
                    tx: Some(Box::new(NullTx(0))),
                },
                live: false,
            }],
        });
    }
    let start = Instant::now();
    let summary = service.run(bindings, &AtomicBool::new(false)).unwrap();
    let took = start.elapsed();
    assert_eq!(summary.malformed + summary.faults, 0);
    took
}

/// Seconds the hand-written program takes: one thread, or a dispatcher
/// and `workers` threads.
fn by_hand<M: Send>(
    frames: &Arc<Vec<Vec<u8>>>,
    workers: usize,
    make: impl Fn() -> M + Sync,
    step: impl Fn(&mut M, &[u8]) + Sync,
    key: impl Fn(&[u8]) -> u64,
) -> Duration {
    let start = Instant::now();
    if workers == 1 {
        let mut m = make();
        for f in frames.iter() {
            step(&mut m, f);
        }
        std::hint::black_box(&m);
        return start.elapsed();
    }
    let queues: Vec<ArrayQueue<u32>> = (0..workers).map(|_| ArrayQueue::new(256)).collect();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for q in &queues {
            let (make, step, done) = (&make, &step, &done);
            s.spawn(move || {
                let mut m = make();
                loop {
                    match q.pop() {
                        Some(i) => step(&mut m, &frames[i as usize]),
                        None if done.load(std::sync::atomic::Ordering::Acquire) => break,
                        // Yielding, not spinning: with more threads than
                        // cores a spinning waiter takes the time of the
                        // thread it waits for.
                        None => std::thread::yield_now(),
                    }
                }
                std::hint::black_box(&m);
            });
        }
        for (i, f) in frames.iter().enumerate() {
            let q = &queues[(key(f) % workers as u64) as usize];
            let mut item = i as u32;
            while let Err(back) = q.push(item) {
                item = back;
                std::thread::yield_now();
            }
        }
        done.store(true, std::sync::atomic::Ordering::Release);
    });
    start.elapsed()
}

fn hash(bytes: &[u8]) -> u64 {
    flick_testkit::packet_model::fnv1a(bytes)
}

const USAGE: &str = "\
packet-rate: frames per second of the packet examples from memory, Flick's
engine against the same logic written by hand.

  packet-rate [--workers \"1 2 4\"] [--frames N] [--flows N] [--reps N]
              [--programs \"flow_tracker port_knocking\"]
  packet-rate machines [--frames N] [--reps N] [--slots N]
";

fn main() {
    if std::env::args().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("machines") {
        return machines::main(std::env::args().skip(2));
    }
    flick_grammars::install();
    let a = args();
    let tracker = Arc::new(tracker_traffic(a.frames, a.flows));
    let knock = Arc::new(knock_traffic(a.frames, a.flows));
    println!("| program | workers | Flick frames/s | by hand frames/s | Flick / by hand |");
    println!("|---|---|---|---|---|");
    for &w in &a.workers {
        for name in PROGRAMS {
            if !a.programs.iter().any(|p| p == name) {
                continue;
            }
            let mut flick_s = Vec::new();
            let mut hand_s = Vec::new();
            for _ in 0..a.reps {
                let (frames, t_flick, t_hand) = if name == "flow_tracker" {
                    let t = flick(
                        "examples/packets/flow_tracker.flick",
                        "wire",
                        None,
                        &tracker,
                        w,
                    );
                    let h = by_hand(
                        &tracker,
                        w,
                        || FlowTracker::with_capacity(a.flows),
                        |m, f| m.frame(f),
                        |f| hash(&Key::five(&parse(f)).packed()),
                    );
                    (tracker.len(), t, h)
                } else {
                    let t = flick(
                        "examples/packets/port_knocking.flick",
                        "inside",
                        Some("outside"),
                        &knock,
                        w,
                    );
                    let h = by_hand(
                        &knock,
                        w,
                        || PortKnocking::with_capacity(a.flows),
                        |m, f| {
                            std::hint::black_box(m.frame(f));
                        },
                        |f| hash(&Key::source(&parse(f)).packed()),
                    );
                    (knock.len(), t, h)
                };
                flick_s.push(frames as f64 / t_flick.as_secs_f64());
                hand_s.push(frames as f64 / t_hand.as_secs_f64());
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                v[v.len() / 2]
            };
            let (f, h) = (median(&mut flick_s), median(&mut hand_s));
            println!("| {name} | {w} | {:.0} | {:.0} | {:.2}x |", f, h, f / h);
            eprintln!(
                "{{\"program\":\"{name}\",\"workers\":{w},\"frames\":{},\"flows\":{},\"flick_fps\":{f:.0},\"by_hand_fps\":{h:.0},\"flick_runs\":{flick_s:?},\"by_hand_runs\":{hand_s:?}}}",
                a.frames, a.flows
            );
        }
    }
}
