//! The engine over in-memory ports: forwarding, dropping, steering,
//! state dumps, malformed frames and faults.

mod common;

use common::*;
use flick_packet::PacketConfig;
use std::sync::atomic::AtomicBool;

const FORWARD: &str = "grammar testpkt

type pkt: record
  flow : integer
  kind : integer

proc fwd: (pkt/pkt inside, pkt/pkt outside)
  | inside => outside
";

/// Forwards kind 1 only, counts every frame and keeps each flow's last
/// sequence number; steered by flow.
const STEERED: &str = include_str!("programs/steered.flick");

fn frames(n: usize) -> Vec<(Vec<u8>, u64)> {
    (0..n)
        .map(|i| (frame(i as u16 % 7, 1, i as u32, i % 50), 1_000 + i as u64))
        .collect()
}

#[test]
fn forwards_every_frame_in_order_with_its_timestamp() {
    let input = frames(300);
    let (summary, out) = run(FORWARD, 1, input.clone());
    assert_eq!(out, input);
    assert_eq!(summary.ports[0].rx_frames, 300);
    assert_eq!(summary.ports[1].tx_frames, 300);
    let bytes: u64 = input.iter().map(|(b, _)| b.len() as u64).sum();
    assert_eq!(summary.ports[1].tx_bytes, bytes);
    assert_eq!(
        (summary.dropped, summary.malformed, summary.faults),
        (0, 0, 0)
    );
}

#[test]
fn frames_sent_nowhere_are_counted_as_dropped() {
    let input: Vec<_> = (0..100u32)
        .map(|i| (frame(1, (i % 4) as u8, i, 0), i as u64))
        .collect();
    let (summary, out) = run(STEERED, 1, input.clone());
    let kept: Vec<_> = input.into_iter().filter(|(b, _)| b[2] == 1).collect();
    assert_eq!(out, kept);
    assert_eq!(summary.dropped, 75);
    assert_eq!(summary.state["count"], 100);
}

fn interleaved_flows() -> Vec<(Vec<u8>, u64)> {
    // 50 flows, 40 frames each, interleaved with a stride so that
    // neighbours belong to different flows.
    (0..2000u32)
        .map(|i| {
            let flow = (i * 7 % 50) as u16;
            (frame(flow, 1, i, (i % 13) as usize), i as u64 * 10)
        })
        .collect()
}

#[test]
fn steering_keeps_flows_on_one_worker_and_output_in_input_order() {
    let input = interleaved_flows();
    let (one, out_one) = run(STEERED, 1, input.clone());
    let (two, out_two) = run(STEERED, 2, input.clone());
    assert_eq!(out_one, input);
    assert_eq!(out_two, input, "output order is input order with 2 workers");
    // Each flow's last sequence number: were a flow split across the two
    // shards, the merge would sum two of them and differ.
    assert_eq!(one.state, two.state);
    let last = one.state["last"].as_object().expect("a dictionary");
    assert_eq!(last.len(), 50);
    for (flow, seq) in last {
        let flow: u32 = flow.parse().unwrap();
        let expected = (0..2000u32).rev().find(|i| i * 7 % 50 == flow).unwrap();
        assert_eq!(seq.as_u64(), Some(expected as u64), "flow {flow}");
    }
    // Both workers had flows.
    assert_eq!(two.worker_frames.len(), 2);
    assert!(
        two.worker_frames.iter().all(|n| *n > 0),
        "{:?}",
        two.worker_frames
    );
    assert_eq!(two.worker_frames.iter().sum::<u64>(), 2000);
    // The scalar counter is summed over the shards.
    assert_eq!(two.state["count"], 2000);
    assert_eq!(one.dump_json(), two.dump_json());
}

#[test]
fn without_steer_every_frame_goes_to_one_worker() {
    let input = frames(500);
    let (summary, out) = run(FORWARD, 3, input.clone());
    assert_eq!(out, input);
    assert_eq!(summary.worker_frames, [500, 0, 0]);
    assert_eq!(summary.ports[1].tx_frames, 500);
}

#[test]
fn frames_that_do_not_parse_are_counted_as_malformed() {
    let mut input = frames(20);
    input.insert(5, (vec![0, 1, 2], 7));
    input.insert(11, (Vec::new(), 8));
    let (summary, out) = run(FORWARD, 2, input);
    assert_eq!(summary.malformed, 2);
    assert_eq!(out, frames(20));
    assert_eq!(summary.ports[0].rx_frames, 22);
}

#[test]
fn a_fault_drops_its_frame_and_is_counted() {
    let program = "grammar testpkt

type pkt: record
  flow : integer
  kind : integer

proc divide: (pkt/pkt inside, pkt/pkt outside)
  | inside => check(outside)

fun check: (outside: -/pkt, p: pkt) -> ()
  if 100 / p.kind > 0:
    p => outside
";
    let input: Vec<_> = (0..30u32)
        .map(|i| (frame(1, (i % 3) as u8, i, 0), i as u64))
        .collect();
    let (summary, out) = run(program, 2, input.clone());
    assert_eq!(summary.faults, 10);
    assert_eq!(out.len(), 20);
    assert!(out.iter().all(|(b, _)| b[2] != 0));
}

#[test]
fn a_full_dictionary_refuses_new_flows_and_counts_them() {
    let svc = service(
        STEERED,
        PacketConfig {
            dict_capacity: 10,
            ..PacketConfig::default()
        },
    );
    let out = MemTx::default();
    let summary = svc
        .run(
            vec![
                bind("inside", vec![rx(interleaved_flows())]),
                bind("outside", vec![tx(&out)]),
            ],
            &AtomicBool::new(false),
        )
        .unwrap();
    assert_eq!(summary.state["last"].as_object().unwrap().len(), 10);
    assert_eq!(summary.dict_full, 40 * 40);
}

#[test]
fn bindings_are_checked_and_every_problem_named() {
    let svc = service(FORWARD, PacketConfig::default());
    let out = MemTx::default();
    let err = svc
        .run(
            vec![
                bind("inside", vec![tx(&out)]),
                bind("elsewhere", vec![tx(&out)]),
            ],
            &AtomicBool::new(false),
        )
        .expect_err("refused")
        .to_string();
    assert!(
        err.contains("channel `inside` is read by the program, but port `mem-out` cannot receive"),
        "{err}"
    );
    assert!(
        err.contains(
            "`elsewhere` is not a channel of process `fwd` (its channels: inside, outside)"
        ),
        "{err}"
    );
    assert!(
        err.contains("channel `outside` has no port: give it --port outside=SPEC"),
        "{err}"
    );
}

#[test]
fn the_dump_has_ports_counters_and_sorted_state() {
    let (summary, _) = run(STEERED, 2, interleaved_flows());
    let dump: serde_json::Value = serde_json::from_str(&summary.dump_json()).unwrap();
    assert_eq!(dump["ports"]["inside"]["rx_frames"], 2000);
    assert_eq!(dump["ports"]["outside"]["tx_frames"], 2000);
    assert_eq!(dump["dropped"], 0);
    assert_eq!(dump["globals"]["count"], 2000);
    assert!(
        summary.line().contains("2000 frames in"),
        "{}",
        summary.line()
    );
}

#[test]
fn a_live_run_dumps_on_request_and_ends_on_stop() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    let dir = std::env::temp_dir().join(format!("flick-packet-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    let request = Arc::new(AtomicBool::new(false));
    // A flow table small enough to evict: its counts are in every dump.
    let program = STEERED
        .replace(
            "global last := empty_dict",
            "global last: dict<integer*integer> {capacity=3, evict=lru} := empty_dict",
        )
        .replace(
            "last: ref dict<integer*integer>,",
            "last: ref dict<integer*integer> {capacity=3, evict=lru},",
        );
    let svc = service(
        &program,
        PacketConfig {
            workers: 2,
            dump_request: Some(request.clone()),
            dump_path: Some(path.clone()),
            ..PacketConfig::default()
        },
    );
    let out = MemTx::default();
    let live = flick_packet::BoundPort {
        spec: "live".into(),
        port: flick_packet_io::Port {
            rx: Some(Box::new(LiveRx(MemRx {
                frames: Arc::new(interleaved_flows()),
                at: 0,
            }))),
            tx: None,
        },
        live: true,
    };
    let stop = AtomicBool::new(false);
    /// Stops the run however the test ends, so a failed assertion fails
    /// the test rather than hang it.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let summary = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let running = s.spawn(|| {
            svc.run(
                vec![bind("inside", vec![live]), bind("outside", vec![tx(&out)])],
                &stop,
            )
        });
        // Asked until two dumps in a row count the same frames: all the
        // port had, less what found no room.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut counts = Vec::new();
        let mut tables = serde_json::Value::Null;
        while std::time::Instant::now() < deadline {
            let _ = std::fs::remove_file(&path);
            request.store(true, Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(100));
            if let Ok(text) = std::fs::read_to_string(&path) {
                let dump: serde_json::Value = serde_json::from_str(&text).unwrap();
                tables = dump["tables"].clone();
                counts.push(dump["globals"]["count"].as_u64().unwrap_or(0));
                if counts.len() > 1 && counts[counts.len() - 2..] == [counts[counts.len() - 1]; 2] {
                    break;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        let summary = running.join().unwrap().unwrap();
        (summary, counts, tables)
    });
    let (summary, counts, tables) = summary;
    // The flow table's counts while running are those of the end.
    assert!(summary.tables["last"]["evicted"].as_u64().unwrap() > 0);
    assert_eq!(
        tables,
        serde_json::Value::Object(summary.tables.clone()),
        "tables dumped while running"
    );
    // Every frame handled: a live port that finds no room waits.
    let p = &summary.ports[0];
    assert_eq!(p.rx_frames, 2000);
    let handled = 2000 - p.rx_overflow;
    assert!(handled > 0);
    assert_eq!(
        counts.last().copied(),
        Some(handled),
        "dumps while running: {counts:?}"
    );
    assert_eq!(summary.state["count"], handled);
    assert_eq!(summary.ports[1].tx_frames, handled);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn counters_are_published_while_running() {
    use std::sync::Arc;
    let stats = Arc::new(flick_packet::LiveStats::default());
    let svc = service(
        STEERED,
        PacketConfig {
            workers: 2,
            stats: Some(stats.clone()),
            ..PacketConfig::default()
        },
    );
    let out = MemTx::default();
    let mut input = interleaved_flows();
    input.push((vec![1], 0));
    let summary = svc
        .run(
            vec![
                bind("inside", vec![rx(input)]),
                bind("outside", vec![tx(&out)]),
            ],
            &AtomicBool::new(false),
        )
        .unwrap();
    use std::sync::atomic::Ordering::Relaxed;
    let ports = stats.ports();
    assert_eq!(ports[0].name, "inside");
    assert_eq!(ports[0].rx_frames.load(Relaxed), 2001);
    assert_eq!(ports[1].tx_frames.load(Relaxed), 2000);
    assert_eq!(ports[1].tx_bytes.load(Relaxed), summary.ports[1].tx_bytes);
    assert_eq!(stats.malformed.load(Relaxed), 1);
    assert_eq!(stats.workers_sum(|w| &w.frames), 2000);
}

/// `log` writes a line and the rule goes on: nothing faults, every frame
/// is forwarded.
#[test]
fn log_lines_do_not_stop_a_rule() {
    let program = "grammar testpkt

type pkt: record
  flow : integer
  kind : integer

proc logs: (pkt/pkt inside, pkt/pkt outside)
  | inside => note(outside)

fun note: (outside: -/pkt, p: pkt) -> ()
  log(to_string(p.flow))
  log(\"a frame\")
  p => outside
";
    let input = frames(50);
    let (summary, out) = run(program, 1, input.clone());
    assert_eq!(out, input);
    assert_eq!(summary.faults, 0);
}

/// A live port whose frames come one at a time, a tenth of a millisecond
/// apart, as a trickle of traffic does: each goes to its worker in a batch
/// of its own.
struct Trickle {
    frames: std::collections::VecDeque<(Vec<u8>, u64)>,
    next: std::time::Instant,
}

impl flick_packet_io::RxPort for Trickle {
    fn recv_batch(
        &mut self,
        _max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<flick_packet_io::RecvStatus, flick_packet_io::PortError> {
        let now = std::time::Instant::now();
        if now < self.next {
            return Ok(flick_packet_io::RecvStatus::Idle);
        }
        Ok(match self.frames.pop_front() {
            Some((frame, ts)) => {
                self.next = now + std::time::Duration::from_micros(100);
                f(&frame, ts);
                flick_packet_io::RecvStatus::Frames(1)
            }
            None => flick_packet_io::RecvStatus::Idle,
        })
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// What a kernel ring would say it dropped.
    fn stats(&self) -> flick_packet_io::PortStats {
        flick_packet_io::PortStats {
            drops: 7,
            ..Default::default()
        }
    }
}

/// A port that takes a millisecond to send each frame.
struct SlowTx(MemTx);

impl flick_packet_io::TxPort for SlowTx {
    fn send(&mut self, frame: &[u8], ts: u64) -> Result<(), flick_packet_io::PortError> {
        std::thread::sleep(std::time::Duration::from_millis(1));
        self.0.send(frame, ts)
    }

    fn flush(&mut self) -> Result<(), flick_packet_io::PortError> {
        Ok(())
    }
}

/// A live port read faster than its frames are written loses none of
/// them: once the batches in flight are used up, its frames wait in the
/// port (a kernel ring) instead of being read and dropped.
#[test]
fn a_live_port_waits_for_room_rather_than_dropping() {
    use std::sync::atomic::Ordering;
    let input = frames(200);
    let out = MemTx::default();
    let svc = service(
        FORWARD,
        PacketConfig {
            workers: 2,
            ..PacketConfig::default()
        },
    );
    let live = flick_packet::BoundPort {
        spec: "live".into(),
        port: flick_packet_io::Port {
            rx: Some(Box::new(Trickle {
                frames: input.clone().into(),
                next: std::time::Instant::now(),
            })),
            tx: None,
        },
        live: true,
    };
    let slow = flick_packet::BoundPort {
        spec: "slow".into(),
        port: flick_packet_io::Port {
            rx: None,
            tx: Some(Box::new(SlowTx(out.clone()))),
        },
        live: false,
    };
    let stop = AtomicBool::new(false);
    let summary = std::thread::scope(|s| {
        let running = s.spawn(|| {
            svc.run(
                vec![bind("inside", vec![live]), bind("outside", vec![slow])],
                &stop,
            )
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while out.0.lock().unwrap().len() < input.len() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        running.join().unwrap().unwrap()
    });
    assert_eq!(summary.ports[0].rx_overflow, 0, "{}", summary.line());
    assert_eq!(summary.ports[0].rx_frames, 200);
    assert_eq!(*out.0.lock().unwrap(), input, "every frame, in order");
    // What the port dropped itself is counted and said, in the dump too.
    assert_eq!(summary.ports[0].rx_drops, 7);
    let dump: serde_json::Value = serde_json::from_str(&summary.dump_json()).unwrap();
    assert_eq!(dump["ports"]["inside"]["rx_drops"], 7, "{dump}");
    assert!(dump["ports"]["outside"].get("rx_drops").is_none(), "{dump}");
    assert!(
        summary
            .line()
            .contains("dropped by the ports on the way in 7"),
        "{}",
        summary.line()
    );
}
