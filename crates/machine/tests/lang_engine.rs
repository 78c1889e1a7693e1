//! What the `machine` syntax adds to the model, run by the executor on
//! field values: metadata carried from stage to stage and zero for each
//! packet, stateless stages that keep no contexts, an explicit `drop`
//! that takes back an earlier stage's `forward`, and timeouts.

use flick_machine::lang::compile;
use flick_machine::{Engine, Program};
use std::sync::Arc;

fn engine(body: &str) -> (Engine, Vec<String>) {
    let text = format!("grammar packet\n\nmachine m: (packet/packet a, packet/packet b)\n{body}");
    let l = compile(&text).unwrap_or_else(|d| panic!("{d:#?}"));
    let fields = l.machine.fields.iter().map(|f| f.name.clone()).collect();
    (
        Engine::new(Arc::new(Program::new(l.machine).unwrap())),
        fields,
    )
}

const MS: u64 = 1_000_000;
const A: u64 = 1 << 1;
const B: u64 = 1 << 2;

const PIPELINE: &str = "  meta class: integer
  stage classify:
    on packet when tcp.dport = 22: meta.class := 2; goto count
    on packet when tcp.dport = 80: meta.class := 1; forward a; goto count
    on packet: goto count
  stage count:
    key ipv4.src
    flow ssh: integer := 0
    states seen
    in any on packet when meta.class = 2: ssh := ssh + 1; forward b
    in any on packet when meta.class = 1: forward b
    in any on packet when meta.class = 0: drop
";

#[test]
fn metadata_goes_from_stage_to_stage_and_starts_at_zero() {
    let (mut e, fields) = engine(PIPELINE);
    assert_eq!(fields, ["tcp.dport", "ipv4.src"]);
    // tcp.dport, ipv4.src
    assert_eq!(e.process(&[22, 7], 1, 60, 0).ports, B);
    assert_eq!(e.process(&[22, 7], 1, 60, MS).ports, B);
    // class 1: both stages forward.
    assert_eq!(e.process(&[80, 7], 1, 60, 2 * MS).ports, A | B);
    // Metadata does not outlive its packet: class is 0 again, and the
    // second stage's drop takes back nothing the first sent.
    assert_eq!(e.process(&[443, 7], 1, 60, 3 * MS).ports, 0);
    let c = e.contexts();
    assert_eq!(c.len(), 1, "only the keyed stage keeps contexts");
    assert_eq!((c[0].stage, c[0].regs[0]), (1, 2));
}

#[test]
fn drop_takes_back_an_earlier_stages_forward() {
    let (mut e, _) = engine(
        "  stage first:
    on packet: forward a; goto second
  stage second:
    on packet when ipv4.ttl < 2: drop
    on packet: forward b
",
    );
    assert_eq!(e.process(&[64], 1, 60, 0).ports, A | B);
    assert_eq!(e.process(&[1], 1, 60, 0).ports, 0);
    assert!(e.contexts().is_empty());
}

#[test]
fn a_stateless_stage_reads_globals_and_writes_them() {
    let (mut e, _) = engine(
        "  global bytes: integer := 0
  stage meter:
    on packet when bytes < 150: bytes := bytes + len; forward b
    on packet: drop
",
    );
    assert_eq!(e.process(&[], 1, 100, 0).ports, B);
    assert_eq!(e.process(&[], 1, 100, 0).ports, B);
    assert_eq!(e.process(&[], 1, 100, 0).ports, 0);
    assert_eq!(e.globals(), [200]);
}

#[test]
fn the_idle_timeout_transition_runs_before_the_packet() {
    let (mut e, _) = engine(
        "  stage s:
    key ipv4.src
    idle_timeout 10ms
    flow n: integer := 0
    states closed, open
    in closed on packet when from a: n := n + 1; next open
    in open on packet when n > 1: forward b
    in open on packet: n := n + 1; forward a
    in open on idle_timeout: n := 0; next closed
",
    );
    assert_eq!(e.process(&[9], 1, 60, 0).ports, 0);
    assert_eq!(e.process(&[9], 1, 60, MS).ports, A);
    assert_eq!(e.process(&[9], 1, 60, 2 * MS).ports, B);
    // 20 ms idle: back to closed with n = 0, then this packet opens again.
    assert_eq!(e.process(&[9], 1, 60, 22 * MS).ports, 0);
    assert_eq!(e.counters().expired, 1);
    assert_eq!(e.contexts()[0].regs, [1]);
}
