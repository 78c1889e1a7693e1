//! `flick run` of a flow tracker whose table has an idle timeout and
//! evicts the least recently used flow, over a capture whose frames are
//! spread over an hour and a half: the dump is what a plain model of the
//! table says it must be.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

const GRAMMAR: &str = "grammar flows;
%byteorder = big;
type pkt = unit {
    flow : uint16;
    kind : uint8;
    seq  : uint32;
};
";

const CAPACITY: usize = 8;
const IDLE_SECS: u64 = 30;

const PROGRAM: &str = "grammar flows

type pkt: record
  flow : integer
  kind : integer
  seq : integer

proc tracker: (pkt/- inside)
  global packets: dict<integer*integer> {capacity=8, idle=30, evict=lru} := empty_dict
  | inside => track(packets)

fun track: (packets: ref dict<integer*integer> {capacity=8, idle=30, evict=lru}, p: pkt) -> ()
  if packets[p.flow] = None:
    packets[p.flow] := 1
  else:
    packets[p.flow] := packets[p.flow] + 1
";

const SEC: u64 = 1_000_000_000;

/// 3000 frames of 20 flows (some far busier than others), 0 to 4 seconds
/// apart, from a fixed seed.
fn frames() -> Vec<(Vec<u8>, u64)> {
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        seed >> 33
    };
    let mut t = 1_700_000_000 * SEC;
    (0..3000u32)
        .map(|i| {
            let r = next();
            let flow = if r % 3 == 0 { r % 4 } else { r % 20 } as u16;
            t += (next() % 5) * SEC;
            let mut f = flow.to_be_bytes().to_vec();
            f.push(0);
            f.extend_from_slice(&i.to_be_bytes());
            (f, t)
        })
        .collect()
}

/// The table as the documentation describes it: an entry untouched for
/// `IDLE_SECS` is gone; a new flow in a full table takes the place of the
/// least recently used one. Gives the entries left at the end and the
/// live entries evicted.
fn model(frames: &[(Vec<u8>, u64)]) -> (BTreeMap<u16, i64>, u64) {
    // Least recently used first: (flow, count, last touched).
    let mut table: Vec<(u16, i64, u64)> = Vec::new();
    let mut evicted = 0;
    let idle = IDLE_SECS * SEC;
    for (f, t) in frames {
        let flow = u16::from_be_bytes([f[0], f[1]]);
        table.retain(|&(_, _, touched)| t - touched < idle);
        let count = match table.iter().position(|e| e.0 == flow) {
            Some(i) => table.remove(i).1 + 1,
            None => {
                if table.len() == CAPACITY {
                    table.remove(0);
                    evicted += 1;
                }
                1
            }
        };
        table.push((flow, count, *t));
    }
    let end = frames.last().map_or(0, |f| f.1);
    let left = table
        .into_iter()
        .filter(|&(_, _, touched)| end - touched < idle)
        .map(|(flow, count, _)| (flow, count))
        .collect();
    (left, evicted)
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn an_lru_table_with_idle_timeouts_dumps_what_the_model_keeps() {
    let d = TempDir(std::env::temp_dir().join(format!("flick-flow-table-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&d.0);
    std::fs::create_dir_all(&d.0).unwrap();
    std::fs::write(d.0.join("flows.grammar"), GRAMMAR).unwrap();
    std::fs::write(d.0.join("tracker.flick"), PROGRAM).unwrap();
    let input = frames();
    flick_packet_io::write_pcap(&d.0.join("in.pcap"), &input).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(&d.0)
        .args([
            "run",
            "tracker.flick",
            "--port",
            "inside=pcap:in.pcap",
            "--dump",
            "state.json",
        ])
        .output()
        .expect("flick runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let dump: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.0.join("state.json")).unwrap()).unwrap();
    let (left, evicted) = model(&input);
    let want: serde_json::Map<String, serde_json::Value> = left
        .iter()
        .map(|(flow, count)| (flow.to_string(), (*count).into()))
        .collect();
    assert_eq!(dump["globals"]["packets"], serde_json::Value::Object(want));
    // Both ways of leaving the table happened, and the counts say so.
    assert!(evicted > 0);
    assert_eq!(dump["tables"]["packets"]["evicted"], evicted);
    assert!(dump["tables"]["packets"]["expired"].as_u64().unwrap() > 0);
    assert_eq!(dump["dict_full"], 0);
}
