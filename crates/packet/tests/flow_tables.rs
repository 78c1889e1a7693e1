//! Flow tables: dictionaries with `idle=` and `evict=`, run over frames
//! whose timestamps are chosen so that entries expire or are evicted.

mod common;

use common::*;
use serde_json::json;

const SEC: u64 = 1_000_000_000;

/// Kind 1 writes the flow's sequence number; kind 2 looks the flow up and
/// forwards the frame only if it was found.
fn program(annotation: &str) -> String {
    format!(
        "grammar testpkt

type pkt: record
  flow : integer
  kind : integer
  seq : integer

proc tables: (pkt/pkt inside, pkt/pkt outside)
  global last: dict<integer*integer> {annotation} := empty_dict
  | inside => track(last, outside)

fun track: (last: ref dict<integer*integer> {annotation}, outside: -/pkt, p: pkt) -> ()
  if p.kind = 1:
    last[p.flow] := p.seq
  else:
    if last[p.flow] <> None:
      p => outside
"
    )
}

/// `(seconds, flow, kind)` as frames, numbered in order.
fn frames(at: &[(u64, u16, u8)]) -> Vec<(Vec<u8>, u64)> {
    at.iter()
        .enumerate()
        .map(|(i, &(t, flow, kind))| (frame(flow, kind, i as u32, 0), t * SEC))
        .collect()
}

/// The flows of the frames that came out.
fn flows(out: &[(Vec<u8>, u64)]) -> Vec<u16> {
    out.iter()
        .map(|(b, _)| u16::from_be_bytes([b[0], b[1]]))
        .collect()
}

#[test]
fn lru_evicts_the_least_recently_used_and_idle_entries_expire() {
    let input = frames(&[
        (0, 1, 1),
        (1, 2, 1),
        (2, 3, 1),
        (3, 1, 2),  // found: flow 1 is now the most recently used
        (4, 4, 1),  // full: flow 2, least recently used, goes
        (5, 2, 2),  // not found
        (6, 3, 2),  // found
        (20, 5, 1), // flows 1, 3 and 4 have been idle 10 s or more
        (21, 4, 2), // not found
    ]);
    let (summary, out) = run(
        &program("{capacity=1 + 2, idle=5 * 2, evict=lru}"),
        1,
        input,
    );
    assert_eq!(flows(&out), [1, 3]);
    assert_eq!(summary.state["last"], json!({"5": 7}));
    assert_eq!(summary.tables["last"], json!({"evicted": 1, "expired": 3}));
    assert_eq!(summary.dict_full, 0);
    assert!(summary.dump_json().contains("\"tables\""));
}

/// The live counters a metrics endpoint reads sum the tables' counts.
#[test]
fn live_counters_count_evictions_and_expiries() {
    use flick_packet::{LiveStats, PacketConfig};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let stats = Arc::new(LiveStats::default());
    let svc = service(
        &program("{capacity=1, idle=10, evict=lru}"),
        PacketConfig {
            stats: Some(stats.clone()),
            ..PacketConfig::default()
        },
    );
    let out = MemTx::default();
    let input = frames(&[(0, 1, 1), (1, 2, 1), (30, 3, 1)]);
    svc.run(
        vec![
            bind("inside", vec![rx(input)]),
            bind("outside", vec![tx(&out)]),
        ],
        &AtomicBool::new(false),
    )
    .unwrap();
    let w = &stats.workers()[0];
    assert_eq!(w.table_evicted.load(Ordering::Relaxed), 1);
    assert_eq!(w.table_expired.load(Ordering::Relaxed), 1);
}

#[test]
fn refuse_keeps_old_entries_until_they_have_been_idle() {
    let input = frames(&[
        (0, 1, 1),
        (1, 2, 1),
        (2, 3, 1),  // full: refused
        (9, 1, 2),  // found, touched at 9
        (11, 3, 1), // flow 2 (touched at 1) has expired: room
        (12, 2, 2), // not found
        (12, 1, 2), // found
    ]);
    let (summary, out) = run(&program("{capacity=2, idle=10, evict=refuse}"), 1, input);
    assert_eq!(flows(&out), [1, 1]);
    assert_eq!(summary.state["last"], json!({"1": 0, "3": 4}));
    assert_eq!(summary.tables["last"], json!({"evicted": 0, "expired": 1}));
    assert_eq!(summary.dict_full, 1);
}

#[test]
fn the_idle_policy_makes_room_only_from_idle_entries() {
    let input = frames(&[
        (0, 1, 1),
        (5, 2, 1),
        (6, 3, 1),  // full, nothing idle: refused
        (7, 1, 2),  // found, touched at 7
        (12, 3, 1), // flow 2 idle 7 s, flow 1 5 s: refused
        (15, 3, 1), // flow 2 idle 10 s: gone, room
        (16, 2, 2), // not found
        (16, 1, 2), // found
    ]);
    let (summary, out) = run(&program("{capacity=2, idle=10, evict=idle}"), 1, input);
    assert_eq!(flows(&out), [1, 1]);
    assert_eq!(summary.state["last"], json!({"1": 0, "3": 5}));
    assert_eq!(summary.tables["last"], json!({"evicted": 0, "expired": 1}));
    assert_eq!(summary.dict_full, 2);
}

#[test]
fn a_declared_capacity_wins_over_the_default() {
    let input = frames(&[(0, 1, 1), (0, 2, 1), (0, 3, 1)]);
    let (summary, _) = run(&program("{capacity=2}"), 1, input);
    assert_eq!(summary.state["last"], json!({"1": 0, "2": 1}));
    assert_eq!(summary.dict_full, 1);
    // Not a flow table: the dump has no table counts.
    assert!(summary.tables.is_empty());
    assert!(!summary.dump_json().contains("\"tables\""));
}

/// Entries expire by packet time: frames a day apart see nothing of one
/// another, however fast they are handled.
#[test]
fn time_is_the_frames_timestamps() {
    let day = 86_400;
    let input = frames(&[(0, 1, 1), (day, 1, 2), (day, 2, 1), (day + 1, 2, 2)]);
    let (summary, out) = run(&program("{idle=60, evict=lru}"), 1, input);
    assert_eq!(flows(&out), [2]);
    assert_eq!(summary.state["last"], json!({"2": 2}));
}
