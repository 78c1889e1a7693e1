//! A program steered by the common key of the programs run beside it
//! (`PacketConfig::steer_by`) instead of its own `steer`: each frame goes
//! to the worker the key's hash names, the state is what its own `steer`
//! gives, and the per-frame path still allocates nothing (a counting
//! global allocator over runs of 1,000 and 10,000 frames).

mod common;

use common::*;
use flick_packet::steering::{FlowKey, FrameFields};
use flick_packet::{Binding, PacketConfig, PacketService, Summary};
use flick_testkit::alloc::CountingAlloc;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// The tests run one at a time: the allocator counts every thread's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// The flow tracker example with the packet library, over the stock
/// `packet` grammar.
fn tracker(steer_by: Option<FlowKey>) -> PacketService {
    let program = include_str!("../../../examples/packets/flow_tracker.flick");
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
        steer_by,
        ..PacketConfig::default()
    };
    PacketService::new(loaded, config).expect("a packet program")
}

/// A 64-byte Ethernet/IPv4/UDP frame from source `src` to port `port`.
fn udp_frame(src: u8, port: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&[0x45, 0, 0, 34, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[10, 0, 0, src]);
    f.extend_from_slice(&[192, 168, 0, 1]);
    f.extend_from_slice(&(1000 + port).to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&[0, 14, 0, 0]);
    f.resize(64, 0);
    f
}

/// `n` frames of 65 flows (13 sources), all seen in the first 1,000.
fn frames(n: usize) -> Vec<(Vec<u8>, u64)> {
    (0..n)
        .map(|i| (udp_frame((i % 13) as u8, (i % 5) as u16), i as u64))
        .collect()
}

fn run(svc: &PacketService, frames: Vec<(Vec<u8>, u64)>) -> Summary {
    let bindings = vec![Binding {
        channel: "wire".into(),
        ports: vec![rx(frames)],
    }];
    svc.run(bindings, &AtomicBool::new(false)).expect("runs")
}

#[test]
fn frames_go_to_the_worker_the_common_key_names_and_the_state_is_unchanged() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let key = FlowKey::of_library_function("src_key").unwrap();
    let input = frames(2_000);
    let mut expected = [0u64; 2];
    for (f, _) in &input {
        expected[(key.hash(&FrameFields::of_ethernet(f)) % 2) as usize] += 1;
    }
    assert!(expected[0] > 0 && expected[1] > 0, "{expected:?}");
    let by_key = run(&tracker(Some(key)), input.clone());
    assert_eq!(by_key.worker_frames, expected.to_vec());
    let own = run(&tracker(None), input);
    assert_eq!(by_key.state, own.state);
    assert_eq!(by_key.dump_json(), own.dump_json());
}

#[test]
fn steering_by_the_common_key_allocates_nothing_per_frame() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let key = FlowKey::of_library_function("src_key").unwrap();
    let allocations = |n: usize| {
        let svc = tracker(Some(key));
        let input = frames(n);
        let before = ALLOC.allocations();
        let summary = run(&svc, input);
        let made = ALLOC.allocations() - before;
        assert_eq!(summary.worker_frames.iter().sum::<u64>(), n as u64);
        made
    };
    allocations(1_000);
    let small = allocations(1_000);
    let large = allocations(10_000);
    eprintln!("steer_by: 1,000 frames: {small} allocations; 10,000 frames: {large} allocations");
    assert!(
        large <= small + 16,
        "9,000 more frames made {} more allocations",
        large.saturating_sub(small)
    );
}
