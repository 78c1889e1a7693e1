//! With one worker the dispatcher skips a `steer` that cannot fault (every
//! frame goes to that worker anyway), and the results are those of a run
//! that steers: the same output, state, malformed and fault counts.

mod common;

use common::*;
use flick_packet::PacketConfig;
use std::sync::Arc;

/// Steered by a field: nothing in `steer` can fault.
const BY_FIELD: &str = "grammar testpkt

type pkt: record
  flow : integer
  kind : integer
  seq : integer

proc steered: (pkt/pkt inside, pkt/pkt outside)
  global last := empty_dict
  | inside => track(last, outside)

fun steer: (p: pkt) -> (integer)
  p.flow

fun track: (last: ref dict<integer*integer>, outside: -/pkt, p: pkt) -> ()
  last[p.flow] := p.seq
  if p.kind = 1:
    p => outside
";

/// `steer` divides by a field that is sometimes 0.
const DIVIDING: &str = "grammar testpkt

type pkt: record
  flow : integer
  kind : integer

proc divide: (pkt/pkt inside, pkt/pkt outside)
  | inside => outside

fun steer: (p: pkt) -> (integer)
  100 / p.kind
";

fn input() -> Frames {
    let mut input: Frames = (0..300u32)
        .map(|i| {
            (
                frame((i % 11) as u16, (i % 3) as u8, i, 4),
                1_000 + i as u64,
            )
        })
        .collect();
    input.insert(7, (vec![0, 1], 5));
    input.insert(100, (Vec::new(), 6));
    input
}

#[test]
fn a_steer_that_reads_fields_is_skipped_at_one_worker_with_the_same_results() {
    let svc = service(BY_FIELD, PacketConfig::default());
    assert!(!svc.steers_in_dispatcher(1));
    assert!(svc.steers_in_dispatcher(2));
    let (one, out_one) = run(BY_FIELD, 1, input());
    let (two, out_two) = run(BY_FIELD, 2, input());
    assert_eq!(out_one, out_two);
    assert_eq!(out_one.len(), 100);
    assert_eq!((one.malformed, one.faults), (2, 0));
    assert_eq!(one.dump_json(), two.dump_json());
}

#[test]
fn a_steer_that_can_fault_still_runs_at_one_worker() {
    let svc = service(DIVIDING, PacketConfig::default());
    assert!(svc.steers_in_dispatcher(1));
    let (one, out) = run(DIVIDING, 1, input());
    // Kind 0 divides by zero: those frames fault in `steer` and are lost.
    assert_eq!((one.malformed, one.faults), (2, 100));
    assert_eq!(out.len(), 200);
    let (two, _) = run(DIVIDING, 2, input());
    assert_eq!(one.dump_json(), two.dump_json());
}

#[test]
fn arithmetic_in_steer_keeps_it_running() {
    // A field absent from a frame is `None`, which `+` faults on.
    let program = BY_FIELD.replace("  p.flow\n\nfun track", "  p.flow + 1\n\nfun track");
    assert!(service(&program, PacketConfig::default()).steers_in_dispatcher(1));
}

/// The packet library after its own `grammar packet` line, as a program
/// that says `grammar packet` is read.
fn with_library(program: &str) -> String {
    let lib = include_str!("../../../lib/packet.flick");
    let line = "\ngrammar packet\n";
    let body = lib.find(line).map_or(lib, |i| &lib[i + line.len()..]);
    format!("{program}\n{body}")
}

/// `flow_key5` and `flow_key3` read fields, test them and pack them; the
/// symmetric keys order the endpoints with `<`, which faults on an absent
/// field, so they keep running.
#[test]
fn the_library_directional_flow_keys_cannot_fault() {
    for (key, skipped) in [
        ("flow_key5", true),
        ("flow_key3", true),
        ("sym_flow_key5", false),
        ("sym_flow_key3", false),
    ] {
        let text = with_library(&format!(
            "grammar packet

proc count: (packet/- wire)
  global n := 0
  | wire => bump(n)

fun steer: (p: packet) -> (string)
  {key}(p)

fun bump: (n: ref integer, p: packet) -> ()
  n := n + 1
"
        ));
        let (ast, diags) = flick_syntax::parse(&text);
        assert!(diags.is_empty(), "{key}: {diags:?}");
        let (checked, diags) = flick_check::check(&ast);
        assert!(diags.is_empty(), "{key}: {diags:?}");
        let grammar: Arc<_> = flick_wire::Grammar::stock("packet").expect("the packet grammar");
        let loaded = flick_platform::Loaded::new(&ast, &checked, grammar).expect("loads");
        let svc = flick_packet::PacketService::new(loaded, PacketConfig::default()).unwrap();
        assert_eq!(svc.steers_in_dispatcher(1), !skipped, "{key}");
        // With several workers, a key that cannot fault is hashed from the
        // frame's fields; the others are still run.
        assert_eq!(svc.steers_in_dispatcher(4), !skipped, "{key}");
        assert_eq!(svc.steers_by_key(4), skipped, "{key}");
    }
}
