//! Metering and Bloom filter lookups allocate nothing per frame: a
//! counting global allocator watches runs of the policer example (a
//! meter per source in a dictionary, most frames over the rate) and of
//! the new-flows example (a Bloom filter of 5-tuples, every frame looked
//! up, each new flow added), 1,000 frames and 10,000 over a fixed set of
//! flows. Setting up a run costs the same in both, so the frames more may
//! add no allocations beyond a few from the queues' waiting threads.

mod common;

use common::*;
use flick_packet::{Binding, BoundPort, PacketConfig, PacketService};
use flick_packet_io::{Port, PortError, TxPort};
use flick_testkit::alloc::CountingAlloc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The tests run one at a time: the allocator counts every thread's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Counts the frames it is sent and keeps nothing.
struct Sink(Arc<AtomicU64>);

impl TxPort for Sink {
    fn send(&mut self, _frame: &[u8], _ts: u64) -> Result<(), PortError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), PortError> {
        Ok(())
    }
}

fn sink(count: &Arc<AtomicU64>) -> BoundPort {
    BoundPort {
        spec: "sink".into(),
        port: Port {
            rx: None,
            tx: Some(Box::new(Sink(count.clone()))),
        },
        live: false,
    }
}

/// An example program with the packet library, as `flick run` reads it.
fn example(program: &str) -> PacketService {
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
    PacketService::new(loaded, config).expect("a packet program")
}

/// An Ethernet/IPv4/UDP frame of `len` bytes from source `src`, flow `flow`.
fn udp_frame(src: u8, flow: u16, len: usize) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    let total = (len - 14) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[10, 0, 0, src]);
    f.extend_from_slice(&[192, 168, 0, 1]);
    f.extend_from_slice(&(1000 + flow).to_be_bytes());
    f.extend_from_slice(&53u16.to_be_bytes());
    f.extend_from_slice(&(total - 20).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.resize(len, 0);
    f
}

/// Allocations made by a run of the policer over `n` frames from 20
/// sources, 100 microseconds apart (over the rate: most are red), and
/// the frames that passed.
fn policer_allocations(n: usize) -> (u64, u64) {
    let svc = example(include_str!("../../../examples/packets/policer.flick"));
    let frames: Vec<_> = (0..n)
        .map(|i| (udp_frame((i % 20) as u8, 0, 1000), i as u64 * 100_000))
        .collect();
    let passed = Arc::new(AtomicU64::new(0));
    let bindings = vec![
        Binding {
            channel: "wire".into(),
            ports: vec![rx(frames)],
        },
        Binding {
            channel: "out".into(),
            ports: vec![sink(&passed)],
        },
    ];
    let stop = AtomicBool::new(false);
    let before = ALLOC.allocations();
    let summary = svc.run(bindings, &stop).expect("runs");
    let made = ALLOC.allocations() - before;
    assert_eq!(summary.faults, 0);
    (made, passed.load(Ordering::Relaxed))
}

/// Allocations made by a run of the new-flows example over `n` frames of
/// 200 flows, and the frames sent to `new`.
fn new_flows_allocations(n: usize) -> (u64, u64) {
    let svc = example(include_str!("../../../examples/packets/new_flows.flick"));
    let frames: Vec<_> = (0..n)
        .map(|i| {
            let flow = (i * 13 % 200) as u16;
            (udp_frame((flow % 7) as u8, flow, 64), i as u64 * 1000)
        })
        .collect();
    let (new, all) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let bindings = vec![
        Binding {
            channel: "wire".into(),
            ports: vec![rx(frames)],
        },
        Binding {
            channel: "new".into(),
            ports: vec![sink(&new)],
        },
        Binding {
            channel: "out".into(),
            ports: vec![sink(&all)],
        },
    ];
    let stop = AtomicBool::new(false);
    let before = ALLOC.allocations();
    let summary = svc.run(bindings, &stop).expect("runs");
    let made = ALLOC.allocations() - before;
    assert_eq!(summary.faults, 0);
    assert_eq!(all.load(Ordering::Relaxed), n as u64);
    (made, new.load(Ordering::Relaxed))
}

#[test]
fn metering_allocates_nothing_per_frame() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    policer_allocations(1_000);
    let (small, passed_small) = policer_allocations(1_000);
    let (large, passed_large) = policer_allocations(10_000);
    eprintln!("policer: 1,000 frames: {small} allocations; 10,000 frames: {large} allocations");
    // 20 sources of 1000-byte frames at 500 a second each: a quarter pass
    // after the first bursts.
    assert!(
        passed_small > 0 && passed_large < 10_000 / 2,
        "{passed_large}"
    );
    assert!(
        large <= small + 16,
        "9,000 more frames made {} more allocations",
        large.saturating_sub(small)
    );
}

#[test]
fn bloom_lookups_allocate_nothing_per_frame() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    new_flows_allocations(1_000);
    let (small, new_small) = new_flows_allocations(1_000);
    let (large, new_large) = new_flows_allocations(10_000);
    eprintln!("new flows: 1,000 frames: {small} allocations; 10,000 frames: {large} allocations");
    assert_eq!((new_small, new_large), (200, 200));
    assert!(
        large <= small + 16,
        "9,000 more frames made {} more allocations",
        large.saturating_sub(small)
    );
}
