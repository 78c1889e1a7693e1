//! A program steered by a flow key's header fields instead of by running
//! its own `steer`: the common key of the programs run beside it
//! (`PacketConfig::steer_by`), or, alone with several workers, the
//! library key its `steer` returns as it is. Each frame goes to the worker
//! the key's hash names, the state is what a run with one worker gives,
//! and the per-frame path still allocates nothing (a counting global
//! allocator over runs of 1,000 and 10,000 frames).

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
/// `packet` grammar, with two workers.
fn tracker(steer_by: Option<FlowKey>) -> PacketService {
    tracker_with(steer_by, 2, "flow_key5")
}

/// The flow tracker with `workers` workers, its `steer` returning the
/// library key `key`.
fn tracker_with(steer_by: Option<FlowKey>, workers: usize, key: &str) -> PacketService {
    let program = include_str!("../../../examples/packets/flow_tracker.flick").replace(
        "fun steer: (p: packet) -> (string)\n  flow_key5(p)",
        &format!("fun steer: (p: packet) -> (string)\n  {key}(p)"),
    );
    assert!(program.contains(&format!("{key}(p)")));
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
        workers,
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

/// How many of `frames` each of two workers gets when `key`'s hash of
/// their fields picks it (both get some).
fn spread(key: FlowKey, frames: &[(Vec<u8>, u64)]) -> Vec<u64> {
    let mut per_worker = vec![0u64; 2];
    for (f, _) in frames {
        per_worker[(key.hash(&FrameFields::of_ethernet(f)) % 2) as usize] += 1;
    }
    assert!(per_worker.iter().all(|&n| n > 0), "{per_worker:?}");
    per_worker
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
    let expected = spread(key, &input);
    let by_key = run(&tracker(Some(key)), input.clone());
    assert_eq!(by_key.worker_frames, expected);
    let one = run(&tracker_with(None, 1, "flow_key5"), input);
    assert_eq!(by_key.dump_json(), one.dump_json());
}

#[test]
fn alone_a_program_whose_steer_returns_a_library_key_is_steered_by_its_fields() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let svc = tracker(None);
    assert!(svc.steers_by_key(2));
    assert!(!svc.steers_in_dispatcher(2));
    let key = FlowKey::of_library_function("flow_key5").unwrap();
    let mut input = frames(2_000);
    // Frames cut short, which the worker (not the dispatcher) finds
    // malformed: counted once, as with one worker.
    for (at, len) in [(5, 10), (700, 30), (1500, 0)] {
        let cut = input[at].0[..len].to_vec();
        input.insert(at, (cut, input[at].1));
    }
    let expected = spread(key, &input);
    let two = run(&svc, input.clone());
    assert_eq!(two.worker_frames, expected);
    let one = run(&tracker_with(None, 1, "flow_key5"), input);
    assert_eq!(one.worker_frames, vec![2_003]);
    assert_eq!((two.malformed, one.malformed), (3, 3));
    assert_eq!(two.dump_json(), one.dump_json());
}

#[test]
fn a_steer_that_can_fault_is_still_run_by_the_dispatcher() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // The symmetric keys order endpoints with `<`, which faults on a
    // frame without them: `steer` decides what such a frame does.
    let svc = tracker_with(None, 2, "sym_flow_key5");
    assert!(!svc.steers_by_key(2));
    assert!(svc.steers_in_dispatcher(2));
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
