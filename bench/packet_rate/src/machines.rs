//! `packet-rate machines`: frames per second of one worker of
//! `flick_machine::Engine` running three FlowBlaze use cases
//! (`examples/flowblaze/`: port knocking, the server load balancer, the
//! TCP connection tracker) against the same logic written by hand in
//! Rust (a std `HashMap` keyed by the flow key with a multiply-shift
//! hasher, no allocation per frame), on one seeded trace per use case
//! held in memory; and the flow context table's insertions and lookups
//! per second with the table 95% full.
//!
//! Two measures per use case, one thread, no I/O:
//! - `machine`: the state machine alone. The engine gets each frame's
//!   field values read beforehand (as a worker does, the dispatcher
//!   having parsed the frame); the hand-written code gets the header
//!   fields it needs, parsed beforehand.
//! - `frame`: parsing included. The engine's `FieldReader` (fixed
//!   offsets for plain TCP/IPv4 frames when every field the program reads
//!   has one, else the stock `packet` grammar) then the engine, against
//!   fixed-offset parsing then the hand-written logic.
//! - `machine batch`, `frame batch`: the same, the engine taking frames
//!   [`BATCH`] at a time through `Engine::process_batch` (a worker's
//!   batch of the packet service), which runs them one by one; the
//!   hand-written code as before. The batch measures also
//!   read a frame descriptor per frame, which the others do not.
//!
//! Rates are per second of the thread's time on a CPU
//! (`CLOCK_THREAD_CPUTIME_ID`), so that time spent waiting for a CPU on a
//! loaded machine is left out.
//!
//! Each run starts with empty tables whose memory the process already
//! holds, as a worker's tables are once it has run a while: the engine
//! is made before the clock starts (it takes its tables' pages as it
//! makes them), and the hand-written map is the one the verdict check filled,
//! emptied. With `--cold`, both are made on the clock and the run pays
//! for their pages (2^20 slots: tens of megabytes zeroed by the kernel;
//! the hand-written map's pages as its entries first reach them).
//!
//! Before timing, every frame's verdict (ports and written values) from
//! the engine is checked against the hand-written code's.
//!
//! Each stage's table is given room for every flow of the trace (the
//! examples' own capacities, 8 and 4096, are sized for their captures),
//! so neither side ever finds its table full.
//!
//!   packet-rate machines [--frames N] [--reps N] [--slots N] [--cases "port_knocking ... table"]
//!                        [--measures "machine,frame batch"] [--cold]

use flick_machine::flows::{FlowTable, Placed, Timeouts};
use flick_machine::model::Eviction;
use flick_machine::{lang, Engine, FieldReader, Frame as EngineFrame, Program, Verdict};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Instant;

/// This thread's time on a CPU (`CLOCK_THREAD_CPUTIME_ID`), else the wall
/// clock: on a shared machine the time the thread waits for a CPU is not
/// the code's. Not `/proc/thread-self/schedstat`, which the kernel brings
/// up to date only at its ticks (4 ms apart): a run of 50 ms read that
/// way moved by 8% either way.
struct CpuClock {
    wall: Instant,
    on_cpu_ns: Option<u64>,
}

/// `struct timespec` on 64-bit Linux.
#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

impl CpuClock {
    fn on_cpu_ns() -> Option<u64> {
        if !cfg!(all(target_os = "linux", target_pointer_width = "64")) {
            return None;
        }
        let mut ts = Timespec { sec: 0, nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec for the call.
        let r = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        (r == 0).then(|| ts.sec as u64 * 1_000_000_000 + ts.nsec as u64)
    }

    fn now() -> CpuClock {
        CpuClock {
            wall: Instant::now(),
            on_cpu_ns: Self::on_cpu_ns(),
        }
    }

    fn elapsed_s(&self) -> f64 {
        match (self.on_cpu_ns, Self::on_cpu_ns()) {
            (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e9,
            _ => self.wall.elapsed().as_secs_f64(),
        }
    }
}

/// Frames per batch for the batch measures: a live port's batch.
const BATCH: usize = 256;

/// The measures, in the order they run.
const MEASURES: [&str; 4] = ["machine", "machine batch", "frame", "frame batch"];

struct Args {
    frames: usize,
    reps: usize,
    slots: usize,
    /// Which use cases (and `table`) to run.
    cases: Vec<String>,
    /// Which measures to time (all four unless told).
    measures: Vec<String>,
    /// Make each run's tables on the clock (see [`CpuClock`]'s users).
    cold: bool,
}

fn args(mut it: impl Iterator<Item = String>) -> Args {
    let mut a = Args {
        frames: 1_000_000,
        reps: 5,
        slots: 1 << 20,
        cases: [
            "port_knocking",
            "server_load_balancer",
            "tcp_conntrack",
            "table",
        ]
        .map(String::from)
        .to_vec(),
        measures: MEASURES.map(String::from).to_vec(),
        cold: false,
    };
    while let Some(flag) = it.next() {
        if flag == "--cold" {
            a.cold = true;
            continue;
        }
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--frames" => a.frames = value.parse().unwrap(),
            "--reps" => a.reps = value.parse().unwrap(),
            "--slots" => a.slots = value.parse().unwrap(),
            "--cases" => a.cases = value.split_whitespace().map(String::from).collect(),
            "--measures" => a.measures = value.split(',').map(String::from).collect(),
            _ => panic!(
                "unknown flag {flag} (--frames, --reps, --slots, --cases, --measures, --cold)"
            ),
        }
    }
    a
}

use flick_testkit::rng::Xorshift as Rng;

/// A flow's size in frames: Pareto (alpha 1.1), many of one or two frames
/// and a few of thousands.
fn flow_size(rng: &mut Rng, min: usize) -> usize {
    let s = rng.unit().powf(-1.0 / 1.1) as usize;
    s.clamp(min, 20_000)
}

/// One frame of a trace: its bytes, the port it came in on, its time.
struct Frame {
    bytes: Vec<u8>,
    port: u8,
    ts_ns: u64,
}

/// A 64-byte Ethernet/IPv4/TCP frame.
fn tcp(src: u32, dst: u32, sport: u16, dport: u16, seq: u32, ack: u32, flags: u8) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0, 0, 46, 0, 0, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src.to_be_bytes());
    f.extend_from_slice(&dst.to_be_bytes());
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&ack.to_be_bytes());
    f.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    f.resize(64, 0);
    f
}

/// Flows' frames, each flow starting at a random moment of a two-minute
/// trace with gaps of up to 100 ms between its frames (one gap in a
/// hundred of 15 s, so idle timeouts happen), merged by time.
fn merge(rng: &mut Rng, flows: Vec<Vec<(Vec<u8>, u8)>>) -> Vec<Frame> {
    const SPAN_NS: u64 = 120_000_000_000;
    let mut out = Vec::new();
    for flow in flows {
        let mut t = rng.below(SPAN_NS);
        for (bytes, port) in flow {
            out.push(Frame {
                bytes,
                port,
                ts_ns: t,
            });
            t += if rng.below(100) == 0 {
                15_000_000_000
            } else {
                rng.below(100_000_000)
            };
        }
    }
    out.sort_by_key(|f| f.ts_ns);
    out
}

/// Port knocking: hosts outside (port 1) knock (four in five rightly,
/// the rest with one wrong knock) and then use SSH (some web); hosts
/// inside (port 2) send out.
fn knocking_trace(frames: usize) -> Vec<Frame> {
    let mut rng = Rng(0x4b4e_4f43);
    let server = 0x0a00_0016;
    let mut flows = Vec::new();
    let mut total = 0;
    let mut n = 0u32;
    while total < frames {
        let size = flow_size(&mut rng, 1);
        let mut flow = Vec::with_capacity(size);
        if rng.below(10) < 3 {
            let src = 0x0a00_1000 + n;
            for _ in 0..size {
                flow.push((tcp(src, 0x0808_0808, 40000, 443, 0, 0, 0x10), 2));
            }
        } else {
            let src = 0xc633_0000 + n;
            let wrong = if rng.below(5) == 0 {
                rng.below(3) as usize
            } else {
                9
            };
            for i in 0..size {
                let dport = match i {
                    0..=2 if i == wrong => 9999,
                    0 => 1111,
                    1 => 2222,
                    2 => 3333,
                    _ if rng.below(8) == 0 => 80,
                    _ => 22,
                };
                flow.push((tcp(src, server, 50000, dport, 0, 0, 0x02), 1));
            }
        }
        total += size;
        n += 1;
        flows.push(flow);
    }
    let mut t = merge(&mut rng, flows);
    t.truncate(frames);
    t
}

/// The load balancer: client connections (port 1) to the virtual
/// address, each frame answered by a server (ports 2 and 3) half the time.
fn balancer_trace(frames: usize) -> Vec<Frame> {
    let mut rng = Rng(0x534c_4221);
    let vip = 0x0a00_0064;
    let mut flows = Vec::new();
    let mut total = 0;
    let mut n = 0u32;
    while total < frames {
        let size = flow_size(&mut rng, 1);
        let client = 0xc000_0000 + (n >> 4);
        let sport = 1024 + (n & 0xf) as u16 * 3000 + rng.below(3000) as u16;
        let mut flow = Vec::with_capacity(size);
        for _ in 0..size {
            if rng.below(2) == 0 {
                flow.push((tcp(client, vip, sport, 80, 0, 0, 0x10), 1));
            } else {
                let server = 2 + rng.below(2) as u8;
                flow.push((tcp(vip, client, 80, sport, 0, 0, 0x10), server));
            }
        }
        total += size;
        n += 1;
        flows.push(flow);
    }
    let mut t = merge(&mut rng, flows);
    t.truncate(frames);
    t
}

/// The connection tracker: connections opened from inside (port 1),
/// handshake, data both ways, then FINs or a RST; a few refused (RST-ACK),
/// a few segments out of their window, and unsolicited segments from
/// outside (port 2).
fn conntrack_trace(frames: usize) -> Vec<Frame> {
    let mut rng = Rng(0x4354_524b);
    let mut flows = Vec::new();
    let mut total = 0;
    let mut n = 0u32;
    while total < frames {
        let size = flow_size(&mut rng, 1);
        let inside = 0x0a00_0000 + (n >> 4);
        let outside = 0x5db8_d800 + (rng.below(4096) as u32);
        let sport = 1024 + (n & 0xf) as u16 * 4000 + rng.below(4000) as u16;
        let (isn, osn) = (rng.next() as u32 >> 1, rng.next() as u32 >> 1);
        let mut flow = Vec::with_capacity(size);
        let i = |seq, ack, flags| (tcp(inside, outside, sport, 443, seq, ack, flags), 1);
        let o = |seq, ack, flags| (tcp(outside, inside, 443, sport, seq, ack, flags), 2);
        match rng.below(20) {
            0 => {
                for k in 0..size as u32 {
                    flow.push(o(osn + k * 100, 0, 0x10));
                }
            }
            1 => {
                flow.push(i(isn, 0, 0x02));
                flow.push(o(0, isn + 1, 0x14));
            }
            _ => {
                let (mut a, mut b) = (isn + 1, osn + 1);
                flow.push(i(isn, 0, 0x02));
                flow.push(o(osn, a, 0x12));
                flow.push(i(a, b, 0x10));
                for _ in 3..size.max(3) {
                    if rng.below(2) == 0 {
                        flow.push(i(a, b, 0x18));
                        a += 1000;
                    } else {
                        flow.push(o(b, a, 0x18));
                        b += if rng.below(200) == 0 { 200_000 } else { 1000 };
                    }
                }
                if rng.below(10) == 0 {
                    flow.push(o(b, a, 0x04));
                } else {
                    flow.push(i(a, b, 0x11));
                    flow.push(o(b, a + 1, 0x11));
                    flow.push(i(a + 1, b + 1, 0x10));
                }
            }
        }
        total += flow.len();
        n += 1;
        flows.push(flow);
    }
    let mut t = merge(&mut rng, flows);
    t.truncate(frames);
    t
}

/// What the hand-written code reads of a frame, at fixed offsets:
/// untagged Ethernet, IPv4 without options, TCP.
#[derive(Clone, Copy, Default)]
struct Hdr {
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
}

#[inline]
fn parse(f: &[u8]) -> Hdr {
    let be32 = |at: usize| u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]]);
    let be16 = |at: usize| u16::from_be_bytes([f[at], f[at + 1]]);
    if f.len() < 54 || be16(12) != 0x0800 || f[14] != 0x45 || f[23] != 6 {
        return Hdr::default();
    }
    Hdr {
        src: be32(26),
        dst: be32(30),
        sport: be16(34),
        dport: be16(36),
        seq: be32(38),
        ack: be32(42),
        flags: f[47],
    }
}

/// A multiply-shift hash of the flow key (keys are integers): what a
/// performance-minded engineer puts in place of SipHash.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64)
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    #[inline]
    fn write_u128(&mut self, v: u128) {
        self.write_u64(v as u64);
        self.write_u64((v >> 64) as u64);
    }
}

type Map<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

fn map<K, V>(capacity: usize) -> Map<K, V> {
    Map::with_capacity_and_hasher(capacity, Default::default())
}

const SEC_US: u64 = 1_000_000;

/// What a hand-written program returns for a frame: ports as a bit set
/// and the value written into `eth.dst` (0 for none).
type HandVerdict = (u64, u64);

trait ByHand {
    fn packet(&mut self, h: &Hdr, port: u8, now_us: u64) -> HandVerdict;
    /// Forgets every flow, keeping the map's memory.
    fn clear(&mut self);
}

/// Port knocking by hand: a source's knocks so far, and its last frame.
struct Knocking {
    sources: Map<u32, (u8, u64)>,
}

impl ByHand for Knocking {
    #[inline]
    fn packet(&mut self, h: &Hdr, port: u8, now: u64) -> HandVerdict {
        const OPEN: u8 = 3;
        if port == 2 {
            // Inside: out, whatever the source's state (only its time moves).
            if let Some(e) = self.sources.get_mut(&h.src) {
                if now - e.1 > 10 * SEC_US {
                    self.sources.remove(&h.src);
                } else {
                    e.1 = now;
                }
            }
            return (1 << 1, 0);
        }
        let state = match self.sources.get(&h.src) {
            Some(&(s, last)) if now - last <= 10 * SEC_US => s,
            _ => 0,
        };
        let (next, out) = match (state, h.dport) {
            (0, 1111) => (1, 0),
            (1, 2222) => (2, 0),
            (2, 3333) => (OPEN, 0),
            (OPEN, 22) => (OPEN, 1 << 2),
            (OPEN, _) => (OPEN, 0),
            _ => (0, 0),
        };
        if next == 0 {
            self.sources.remove(&h.src);
        } else {
            self.sources.insert(h.src, (next, now));
        }
        (out, 0)
    }

    fn clear(&mut self) {
        self.sources.clear();
    }
}

/// The load balancer by hand: each connection's server and last frame,
/// and whose turn it is.
struct Balancer {
    conns: Map<u128, (u8, u64)>,
    turn: u8,
}

const MAC_A: u64 = 0x0200_0000_0a01;
const MAC_B: u64 = 0x0200_0000_0b01;

impl ByHand for Balancer {
    #[inline]
    fn packet(&mut self, h: &Hdr, port: u8, now: u64) -> HandVerdict {
        if port != 1 {
            return (1 << 1, 0);
        }
        let key = (h.src as u128) << 64
            | (h.sport as u128) << 48
            | (h.dst as u128) << 16
            | h.dport as u128;
        let e = self.conns.entry(key).or_insert((0, now));
        if e.0 == 0 || now - e.1 > 10 * SEC_US {
            e.0 = 1 + self.turn;
            self.turn ^= 1;
        }
        e.1 = now;
        if e.0 == 1 {
            (1 << 2, MAC_A)
        } else {
            (1 << 3, MAC_B)
        }
    }

    fn clear(&mut self) {
        self.conns.clear();
        self.turn = 0;
    }
}

/// One direction's window.
#[derive(Clone, Copy, Default)]
struct Window {
    lo: u64,
    min: u64,
    max: u64,
}

impl Window {
    fn at(lo: u64) -> Window {
        Window {
            lo,
            min: lo.saturating_sub(65535),
            max: lo + 65535,
        }
    }
}

/// A connection by hand: the handshake's state and windows, the
/// teardown's state (0: open), each with its last frame (the two are
/// forgotten apart, as the machine's two stages forget them).
#[derive(Clone, Copy, Default)]
struct Conn {
    hs: u8,
    inside: Window,
    outside: Window,
    hs_last: u64,
    hs_kept: bool,
    td: u8,
    td_last: u64,
}

struct Conntrack {
    conns: Map<[u64; 2], Conn>,
}

impl ByHand for Conntrack {
    #[inline]
    fn packet(&mut self, h: &Hdr, port: u8, now: u64) -> HandVerdict {
        const IDLE: u64 = 30 * SEC_US;
        let (a, b) = (
            (h.src as u64) << 16 | h.sport as u64,
            (h.dst as u64) << 16 | h.dport as u64,
        );
        let key = if b < a { [b, a] } else { [a, b] };
        let mut c = self.conns.get(&key).copied().unwrap_or_default();
        if c.hs_kept && now - c.hs_last > IDLE {
            c.hs = 0;
            c.inside = Window::default();
            c.outside = Window::default();
        }
        let (seq, ack, flags) = (h.seq as u64, h.ack as u64, h.flags);
        let mut onward = false;
        let mut out = 0;
        match (c.hs, port) {
            (0, 1) if flags == 0x02 => {
                c.inside = Window::at(seq + 1);
                c.hs = 1;
                out = 1 << 2;
            }
            (1, 1) if flags == 0x02 => out = 1 << 2,
            (1, 2) if flags == 0x12 && ack == c.inside.lo => {
                c.outside = Window::at(seq + 1);
                c.hs = 2;
                out = 1 << 1;
            }
            (1, 2) if flags == 0x14 && ack == c.inside.lo => {
                c.inside = Window::default();
                c.hs = 0;
                out = 1 << 1;
            }
            (2, 1) if flags == 0x10 && ack == c.outside.lo => {
                c.hs = 3;
                out = 1 << 2;
            }
            (2, 2) if flags == 0x12 => out = 1 << 1,
            (3, 1) if c.inside.min <= seq && seq <= c.inside.max => {
                c.inside = Window::at(c.inside.lo.max(seq));
                onward = true;
            }
            (3, 2) if c.outside.min <= seq && seq <= c.outside.max => {
                c.outside = Window::at(c.outside.lo.max(seq));
                onward = true;
            }
            _ => {}
        }
        c.hs_kept = c.hs != 0
            || c.inside.lo | c.inside.min | c.inside.max != 0
            || c.outside.lo | c.outside.min | c.outside.max != 0;
        c.hs_last = now;
        if onward {
            if c.td != 0 && now - c.td_last > IDLE {
                c.td = 0;
            }
            let other = if port == 1 { 1 << 2 } else { 1 << 1 };
            (c.td, out) = match (c.td, port) {
                (4 | 5, _) => (c.td, 0),
                (0, 1) if flags == 0x11 => (1, other),
                (0, 2) if flags == 0x11 => (2, other),
                (1, 2) | (2, 1) if flags == 0x11 => (3, other),
                (3, _) if flags == 0x10 => (4, other),
                (_, 1 | 2) if flags == 0x04 || flags == 0x14 => (5, other),
                (s, 1 | 2) => (s, other),
                (s, _) => (s, 0),
            };
            c.td_last = now;
        }
        if c.hs_kept || c.td != 0 {
            self.conns.insert(key, c);
        } else {
            self.conns.remove(&key);
        }
        (out, 0)
    }

    fn clear(&mut self) {
        self.conns.clear();
    }
}

/// A use case: its program and trace.
struct Case {
    name: &'static str,
    file: &'static str,
    frames: Vec<Frame>,
}

/// The program of `file` with every stage's table given `slots` contexts.
fn program(file: &str, slots: usize) -> Arc<Program> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut machine = match lang::compile(&text) {
        Ok(l) => l.machine,
        Err(d) => panic!("{file}: {d:?}"),
    };
    for s in &mut machine.stages {
        s.capacity = slots;
    }
    Arc::new(Program::new(machine).expect("tables"))
}

/// The engine's verdict in the hand-written code's terms.
fn engine_verdict(v: &Verdict) -> HandVerdict {
    (v.ports, v.writes().first().map_or(0, |w| w.1))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

pub fn main(rest: impl Iterator<Item = String>) {
    flick_grammars::install();
    let a = args(rest);
    println!("| use case | measure | frames | contexts at the end | Flick frames/s | by hand frames/s | Flick / by hand |");
    println!("|---|---|---|---|---|---|---|");
    let n = a.slots;
    let case = |name, file, frames| Case { name, file, frames };
    bench_case(
        &case(
            "port_knocking",
            "examples/flowblaze/port_knocking.flick",
            knocking_trace(a.frames),
        ),
        &a,
        || Knocking { sources: map(n) },
    );
    bench_case(
        &case(
            "server_load_balancer",
            "examples/flowblaze/server_load_balancer.flick",
            balancer_trace(a.frames),
        ),
        &a,
        || Balancer {
            conns: map(n),
            turn: 0,
        },
    );
    bench_case(
        &case(
            "tcp_conntrack",
            "examples/flowblaze/tcp_conntrack.flick",
            conntrack_trace(a.frames),
        ),
        &a,
        || Conntrack { conns: map(n) },
    );
    if a.cases.iter().any(|c| c == "table") {
        table_rates(a.slots, a.reps);
    }
}

fn bench_case<B: ByHand>(case: &Case, a: &Args, make: impl Fn() -> B) {
    if !a.cases.iter().any(|c| c == case.name) {
        return;
    }
    let program = program(case.file, a.slots);
    let nf = program.machine.fields.len();
    let mut reader = FieldReader::new(&program.machine.fields).expect("fields");
    let frames = &case.frames;
    let mut fields = vec![0u64; frames.len() * nf];
    for (f, out) in frames.iter().zip(fields.chunks_mut(nf.max(1))) {
        reader.read(&f.bytes, out);
    }
    let hdrs: Vec<Hdr> = frames.iter().map(|f| parse(&f.bytes)).collect();
    // Same verdicts, frame by frame.
    let mut engine = Engine::new(program.clone());
    let mut hand = make();
    let mut per_port = [0u64; 4];
    for (i, f) in frames.iter().enumerate() {
        let v = engine_verdict(&engine.process(
            &fields[i * nf..(i + 1) * nf],
            f.port,
            f.bytes.len(),
            f.ts_ns,
        ));
        let h = hand.packet(&hdrs[i], f.port, f.ts_ns / 1000);
        assert_eq!(
            v, h,
            "{}: frame {i} (at {} ns, in on port {})",
            case.name, f.ts_ns, f.port
        );
        for (p, n) in per_port.iter_mut().enumerate() {
            *n += (v.0 >> p) & 1;
        }
        if v.0 == 0 {
            per_port[0] += 1;
        }
    }
    let c = engine.counters();
    assert_eq!(c.table_full + c.evicted, 0, "{}: a table filled", case.name);
    let batch: Vec<EngineFrame> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| EngineFrame {
            fields: &fields[i * nf..(i + 1) * nf],
            port: f.port,
            len: 64,
            ts_ns: f.ts_ns,
        })
        .collect();
    // The batch path: the same verdicts and contexts as frame by frame.
    let mut batched = Engine::new(program.clone());
    let mut single = Engine::new(program.clone());
    for chunk in batch.chunks(BATCH) {
        let mut got = Vec::new();
        batched.process_batch(chunk, |_, v| got.push(*v));
        for (f, v) in chunk.iter().zip(got) {
            assert_eq!(v, single.process(f.fields, f.port, f.len, f.ts_ns));
        }
    }
    assert_eq!(batched.contexts(), single.contexts(), "{}", case.name);
    let flows = engine.contexts().len();
    eprintln!(
        "{}: verdicts agree on {} frames (dropped {}, port 1 {}, port 2 {}, port 3 {}); {} contexts at the end, {} expired on the way",
        case.name,
        frames.len(),
        per_port[0],
        per_port[1],
        per_port[2],
        per_port[3],
        flows,
        c.expired
    );
    for measure in MEASURES {
        if !a.measures.iter().any(|m| m == measure) {
            continue;
        }
        let (mut fl, mut hd) = (Vec::new(), Vec::new());
        let parsing = measure.starts_with("frame");
        for _ in 0..a.reps {
            // Warm: the engine made (its tables' pages taken as it makes
            // them) before the clock starts. Cold: made on the clock.
            let made = (!a.cold).then(|| Engine::new(program.clone()));
            let mut sink = 0u64;
            let t = CpuClock::now();
            let mut engine = made.unwrap_or_else(|| Engine::new(program.clone()));
            match measure {
                "machine" => {
                    let mut v = Verdict::default();
                    for (i, f) in frames.iter().enumerate() {
                        let fields = &fields[i * nf..(i + 1) * nf];
                        engine.process_into(fields, f.port, 64, f.ts_ns, &mut v);
                        sink = sink.wrapping_add(v.ports);
                    }
                }
                "machine batch" => {
                    for chunk in batch.chunks(BATCH) {
                        engine.process_batch(chunk, |_, v| sink = sink.wrapping_add(v.ports));
                    }
                }
                "frame" => {
                    let mut buf = vec![0u64; nf];
                    let mut v = Verdict::default();
                    for f in frames {
                        reader.read(&f.bytes, &mut buf);
                        engine.process_into(&buf, f.port, f.bytes.len(), f.ts_ns, &mut v);
                        sink = sink.wrapping_add(v.ports);
                    }
                }
                _ => {
                    // Fields of a batch read into one buffer, then run.
                    let mut buf = vec![0u64; nf * BATCH];
                    let mut meta = vec![(0u8, 0usize, 0u64); BATCH];
                    for chunk in frames.chunks(BATCH) {
                        for ((f, out), m) in
                            chunk.iter().zip(buf.chunks_mut(nf.max(1))).zip(&mut meta)
                        {
                            reader.read(&f.bytes, out);
                            *m = (f.port, f.bytes.len(), f.ts_ns);
                        }
                        // One small vector per batch: views borrow this batch's fields.
                        let mut views: Vec<EngineFrame> = Vec::with_capacity(BATCH);
                        views.extend(meta[..chunk.len()].iter().enumerate().map(
                            |(i, &(port, len, ts_ns))| EngineFrame {
                                fields: &buf[i * nf..(i + 1) * nf],
                                port,
                                len,
                                ts_ns,
                            },
                        ));
                        engine.process_batch(&views, |_, v| sink = sink.wrapping_add(v.ports));
                    }
                }
            }
            fl.push(frames.len() as f64 / t.elapsed_s());
            std::hint::black_box(sink);
            // Warm: the map of the verdict check, emptied, its memory
            // still the process's. Cold: a new map, made on the clock,
            // its pages first touched by the run.
            if !a.cold {
                hand.clear();
            }
            let mut sink = 0u64;
            let t = CpuClock::now();
            if a.cold {
                hand = make();
            }
            if !parsing {
                for (h, f) in hdrs.iter().zip(frames) {
                    sink = sink.wrapping_add(hand.packet(h, f.port, f.ts_ns / 1000).0);
                }
            } else {
                for f in frames {
                    let h = parse(&f.bytes);
                    sink = sink.wrapping_add(hand.packet(&h, f.port, f.ts_ns / 1000).0);
                }
            }
            hd.push(frames.len() as f64 / t.elapsed_s());
            std::hint::black_box(sink);
        }
        let (f, h) = (median(&mut fl), median(&mut hd));
        println!(
            "| {} | {measure} | {} | {flows} | {f:.0} | {h:.0} | {:.2}x |",
            case.name,
            frames.len(),
            f / h
        );
        eprintln!(
            "{{\"use_case\":\"{}\",\"measure\":\"{measure}\",\"frames\":{},\"flick_fps\":{f:.0},\"by_hand_fps\":{h:.0},\"flick_runs\":{fl:.0?},\"by_hand_runs\":{hd:.0?}}}",
            case.name,
            frames.len()
        );
    }
}

/// Insertions and lookups per second in a flow context table of `slots`
/// contexts (a four-word key, two registers) held 95% full.
fn table_rates(slots: usize, reps: usize) {
    let mut table = FlowTable::new(slots, 4, 2);
    let nominal = table.capacity() - flick_machine::flows::STASH;
    let target = nominal * 95 / 100;
    let key = |k: u64| [k, k.wrapping_mul(0x9e37_79b9), 443, k >> 3];
    let none = Timeouts::default();
    let mut next = 0u64;
    while table.len() < target {
        let k = key(next);
        if let Ok(p) = table.insert(&k, 0, &none, Eviction::Expired) {
            let (Placed::Free(s) | Placed::Evicted(s)) = p;
            table.set_meta(s, 0, 0, 0);
        } else {
            panic!("the table refused a key at {} of {}", table.len(), nominal)
        }
        next += 1;
    }
    let n = 1_000_000u64;
    let (mut churn, mut lookups, mut evicting) = (Vec::new(), Vec::new(), Vec::new());
    let mut oldest = 0u64;
    let mut full = 0;
    for _ in 0..reps {
        // A new key each time (looked up first, as the engine does) and
        // the oldest one gone, as its expiry would free it: 95% throughout.
        let t = Instant::now();
        for _ in 0..n {
            let k = key(next);
            if table.find(&k).is_none() {
                match table.insert(&k, 0, &none, Eviction::Expired) {
                    Ok(_) => {}
                    Err(_) => full += 1,
                }
            }
            next += 1;
            if let Some(s) = table.find(&key(oldest)) {
                table.remove(s);
            }
            oldest += 1;
        }
        churn.push(n as f64 / t.elapsed().as_secs_f64());
        let mut rng = Rng(5);
        let live = next - oldest;
        let t = Instant::now();
        let mut hits = 0u64;
        for _ in 0..n {
            let k = key(oldest + rng.below(live));
            hits += table.find(&k).is_some() as u64;
        }
        lookups.push(n as f64 / t.elapsed().as_secs_f64());
        assert!(hits + full as u64 >= n, "lookups missed: {hits} of {n}");
    }
    // Full to the last slot, every context idle past its timeout: each new
    // key takes an expired context's place.
    let idle = Timeouts {
        idle: Some(1),
        hard: None,
    };
    let mut fill = FlowTable::new(slots, 4, 2);
    let mut k = 0u64;
    let mut refused = 0;
    while refused < 1000 {
        if fill.insert(&key(k), 0, &none, Eviction::Expired).is_err() {
            refused += 1;
        }
        k += 1;
    }
    let load = fill.len() as f64 / fill.capacity() as f64;
    // Each such insertion first searches for a chain of moves in vain:
    // fewer of them.
    let n = n / 10;
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..n {
            let kk = key(k);
            if fill.find(&kk).is_none() {
                let _ = fill.insert(&kk, 10, &idle, Eviction::Expired);
            }
            k += 1;
        }
        evicting.push(n as f64 / t.elapsed().as_secs_f64());
    }
    let (c, l, e) = (
        median(&mut churn),
        median(&mut lookups),
        median(&mut evicting),
    );
    println!();
    println!("| flow table ({} slots) | operations/s |", table.capacity());
    println!("|---|---|");
    println!("| insert a new key at 95% full (miss, insert, oldest removed) | {c:.0} |");
    println!("| look up a present key at 95% full | {l:.0} |");
    println!(
        "| insert a new key into a full table ({:.1}% of slots), evicting an expired context | {e:.0} |",
        load * 100.0
    );
    if full > 0 {
        println!("({full} insertions at 95% found no room)");
    }
}
