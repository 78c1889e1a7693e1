//! The per-frame path allocates nothing: a counting global allocator
//! watches whole runs of a forwarding program over in-memory frames, one
//! of 1,000 frames and one of 11,000, and of the flow tracker example
//! (string keys made by `flow_key5`, looked up as bytes) over a fixed set
//! of flows, 1,000 frames and 10,000. Setting up a run (threads, batches,
//! parsers, interpreters, the flows' first entries) costs the same in
//! both, so the frames more may not add allocations beyond a few from the
//! queues' waiting threads, which vary from run to run.

mod common;

use common::*;
use flick_packet::{Binding, BoundPort, PacketConfig};
use flick_packet_io::{Port, PortError, PortStats, TxPort};
use flick_testkit::alloc::CountingAlloc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The tests run one at a time: the allocator counts every thread's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Counts what it is sent and keeps nothing, so it allocates nothing.
struct Sink(Arc<AtomicU64>);

impl TxPort for Sink {
    fn send(&mut self, frame: &[u8], _ts: u64) -> Result<(), PortError> {
        self.0.fetch_add(frame.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), PortError> {
        Ok(())
    }
}

const PROGRAM: &str = "grammar testpkt

type pkt: record
  flow : integer
  kind : integer

proc fwd: (pkt/pkt inside, pkt/pkt outside)
  global count := 0
  | inside => tally(count, outside)

fun steer: (p: pkt) -> (integer)
  p.flow

fun tally: (count: ref integer, outside: -/pkt, p: pkt) -> ()
  count := count + 1
  if p.kind < 200:
    p => outside
";

/// Allocations made by one run over `n` frames, and the bytes sent.
fn allocations(n: usize) -> (u64, u64) {
    let svc = service(
        PROGRAM,
        PacketConfig {
            workers: 2,
            ..PacketConfig::default()
        },
    );
    let frames: Vec<_> = (0..n)
        .map(|i| (frame((i % 64) as u16, 1, i as u32, 40 + i % 200), i as u64))
        .collect();
    let sent = Arc::new(AtomicU64::new(0));
    let bindings = vec![
        Binding {
            channel: "inside".into(),
            ports: vec![rx(frames)],
        },
        Binding {
            channel: "outside".into(),
            ports: vec![BoundPort {
                spec: "sink".into(),
                port: Port {
                    rx: None,
                    tx: Some(Box::new(Sink(sent.clone()))),
                },
                live: false,
            }],
        },
    ];
    let stop = AtomicBool::new(false);
    let before = ALLOC.allocations();
    let summary = svc.run(bindings, &stop).expect("runs");
    let made = ALLOC.allocations() - before;
    assert_eq!(summary.ports[1].tx_frames, n as u64);
    (made, sent.load(Ordering::Relaxed))
}

#[test]
fn frames_through_the_engine_allocate_nothing_each() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A first run warms what is made once per process (thread-locals).
    allocations(1_000);
    let (small, _) = allocations(1_000);
    let (large, bytes) = allocations(11_000);
    eprintln!("1,000 frames: {small} allocations; 11,000 frames: {large} allocations");
    assert!(bytes > 0);
    assert!(
        large <= small + 16,
        "10,000 more frames made {} more allocations",
        large.saturating_sub(small)
    );
}

/// The flow tracker example with the packet library, as `flick run`
/// reads it, over the stock `packet` grammar; `table` replaces its
/// dictionaries' annotation.
fn tracker(table: &str) -> flick_packet::PacketService {
    let program = include_str!("../../../examples/packets/flow_tracker.flick")
        .replace("{capacity=65536}", table);
    let library = include_str!("../../../lib/packet.flick");
    let line = "\ngrammar packet\n";
    let body = &library[library.find(line).expect("the library names its grammar") + line.len()..];
    let text = format!("{program}\n{body}");
    let (ast, diags) = flick_syntax::parse(&text);
    assert!(diags.is_empty(), "{diags:?}");
    let (checked, diags) = flick_check::check(&ast);
    assert!(diags.is_empty(), "{diags:?}");
    let grammar = flick_wire::Grammar::stock("packet").expect("the stock packet grammar");
    let loaded = flick_platform::Loaded::new(&ast, &checked, grammar).expect("loads");
    let config = PacketConfig {
        workers: 2,
        ..PacketConfig::default()
    };
    flick_packet::PacketService::new(loaded, config).expect("a packet program")
}

/// A 64-byte Ethernet/IPv4/UDP frame of flow `flow`.
fn udp_frame(flow: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0, 0, 34, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[10, 0, (flow >> 8) as u8, flow as u8]);
    f.extend_from_slice(&[192, 168, 0, 1]);
    f.extend_from_slice(&(1000 + flow).to_be_bytes());
    f.extend_from_slice(&53u16.to_be_bytes());
    f.extend_from_slice(&[0, 14, 0, 0]);
    f.resize(64, 0);
    f
}

/// Allocations made by one run of the tracker over `n` frames of 100
/// flows, and the frames it counted.
fn tracker_allocations(n: usize) -> (u64, u64) {
    table_allocations(n, "{capacity=65536}")
}

/// As [`tracker_allocations`], with the tracker's dictionaries annotated
/// `table`; frames are a second apart in packet time.
fn table_allocations(n: usize, table: &str) -> (u64, u64) {
    let svc = tracker(table);
    let frames: Vec<_> = (0..n)
        .map(|i| (udp_frame((i * 7 % 100) as u16), i as u64 * 1_000_000_000))
        .collect();
    let bindings = vec![Binding {
        channel: "wire".into(),
        ports: vec![rx(frames)],
    }];
    let stop = AtomicBool::new(false);
    let before = ALLOC.allocations();
    let summary = svc.run(bindings, &stop).expect("runs");
    let made = ALLOC.allocations() - before;
    let packets = summary.state["packets"]
        .as_object()
        .expect("a dictionary")
        .values()
        .map(|v| v.as_u64().expect("a count"))
        .sum();
    (made, packets)
}

#[test]
fn a_flow_tracker_keyed_by_strings_allocates_nothing_per_frame() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tracker_allocations(1_000);
    let (small, counted) = tracker_allocations(1_000);
    assert_eq!(counted, 1_000);
    let (large, counted) = tracker_allocations(10_000);
    assert_eq!(counted, 10_000);
    eprintln!("tracker: 1,000 frames: {small} allocations; 10,000 frames: {large} allocations");
    assert!(
        large <= small + 16,
        "9,000 more frames made {} more allocations",
        large.saturating_sub(small)
    );
}

/// An LRU flow table too small for the flows, so that nearly every frame
/// evicts an entry (and some expire): slots are reused, nothing is made.
#[test]
fn a_flow_table_that_evicts_allocates_nothing_per_frame() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let table = "{capacity=64, idle=90, evict=lru}";
    table_allocations(1_000, table);
    let (small, _) = table_allocations(1_000, table);
    let (large, _) = table_allocations(10_000, table);
    eprintln!("lru table: 1,000 frames: {small} allocations; 10,000 frames: {large} allocations");
    assert!(
        large <= small + 16,
        "9,000 more frames made {} more allocations",
        large.saturating_sub(small)
    );
}

/// A port that takes every frame and loses every other one, counted at
/// its flush, as a live port whose send queue is full does.
struct Lossy {
    taken: u64,
    lost: u64,
    stats: PortStats,
}

impl TxPort for Lossy {
    fn send(&mut self, frame: &[u8], _ts: u64) -> Result<(), PortError> {
        self.taken += 1;
        if self.taken % 2 == 0 {
            self.lost += 1;
        } else {
            self.stats.frames += 1;
            self.stats.bytes += frame.len() as u64;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), PortError> {
        self.stats.drops = self.lost;
        Ok(())
    }
    fn stats(&self) -> PortStats {
        self.stats
    }
}

#[test]
fn frames_a_port_loses_when_its_queue_is_full_are_counted_as_not_sent() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let svc = service(
        PROGRAM,
        PacketConfig {
            workers: 1,
            ..PacketConfig::default()
        },
    );
    let frames: Vec<_> = (0..1000)
        .map(|i| (frame((i % 64) as u16, 1, i as u32, 60), i as u64))
        .collect();
    let bindings = vec![
        Binding {
            channel: "inside".into(),
            ports: vec![rx(frames)],
        },
        Binding {
            channel: "outside".into(),
            ports: vec![BoundPort {
                spec: "lossy".into(),
                port: Port {
                    rx: None,
                    tx: Some(Box::new(Lossy {
                        taken: 0,
                        lost: 0,
                        stats: PortStats::default(),
                    })),
                },
                live: true,
            }],
        },
    ];
    let summary = svc.run(bindings, &AtomicBool::new(false)).expect("runs");
    let out = &summary.ports[1];
    // Every frame went to the port; those it lost are errors, not silence.
    assert_eq!(out.tx_frames, 1000);
    assert_eq!(out.tx_errors, 500, "frames counted as not sent");
    let line = summary.line();
    assert!(
        line.contains("not sent (port errors or full send queues) 500"),
        "{line}"
    );
}
