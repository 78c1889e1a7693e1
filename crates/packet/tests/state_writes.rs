//! State written into a running program (`PacketConfig::control`): each
//! write is applied by the workers between batches. With several workers
//! an entry goes only to the shard that holds its key (the one `steer`
//! sends its flow to), a key no shard holds and an integer scalar are
//! refused; with one worker a new key is made.

mod common;

use common::*;
use flick_exec::Value;
use flick_packet::PacketConfig;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts every frame and keeps each flow's last sequence number; steered
/// by flow.
const STEERED: &str = "grammar testpkt

type pkt: record
  flow : integer
  kind : integer
  seq : integer

proc steered: (pkt/pkt inside, pkt/pkt outside)
  global last := empty_dict
  global count := 0
  | inside => track(last, count, outside)

fun steer: (p: pkt) -> (integer)
  p.flow

fun track: (last: ref dict<integer*integer>, count: ref integer, outside: -/pkt, p: pkt) -> ()
  count := count + 1
  last[p.flow] := p.seq
  p => outside
";

/// Stops the run however the test ends, so a failed assertion fails the
/// test rather than hang it.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// 20 flows, 10 frames each, interleaved.
fn flows() -> Vec<(Vec<u8>, u64)> {
    (0..200u32)
        .map(|i| (frame((i % 20) as u16, 1, i, 4), i as u64 * 10))
        .collect()
}

/// Runs `STEERED` on `workers` over a live port holding `flows()`; once
/// every frame is handled (or lost for want of room), calls `during`
/// with the run's control, then stops it; the final state.
fn run_with(
    workers: usize,
    during: impl FnOnce(
        &dyn Fn(&str, i64, i64) -> Result<(), (u16, String)>,
        &dyn Fn(&str, i64) -> Result<(), (u16, String)>,
    ),
) -> serde_json::Map<String, serde_json::Value> {
    let stats = Arc::new(flick_packet::LiveStats::default());
    let config = PacketConfig {
        workers,
        stats: Some(stats.clone()),
        control: Some(Default::default()),
        ..PacketConfig::default()
    };
    let control = config.control.clone().expect("made above");
    let svc = service(STEERED, config);
    let out = MemTx::default();
    let live = flick_packet::BoundPort {
        spec: "live".into(),
        port: flick_packet_io::Port {
            rx: Some(Box::new(LiveRx(MemRx {
                frames: Arc::new(flows()),
                at: 0,
            }))),
            tx: None,
        },
        live: true,
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let running = s.spawn(|| {
            svc.run(
                vec![bind("inside", vec![live]), bind("outside", vec![tx(&out)])],
                &stop,
            )
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ports = stats.ports();
            let handled = ports
                .first()
                .map_or(0, |p| p.rx_overflow.load(Ordering::Relaxed))
                + stats.workers_sum(|w| &w.frames);
            if ports
                .first()
                .is_some_and(|p| p.rx_frames.load(Ordering::Relaxed) == 200)
                && handled == 200
            {
                break;
            }
            assert!(Instant::now() < deadline, "the frames were not handled");
            std::thread::sleep(Duration::from_millis(5));
        }
        let t = Duration::from_secs(10);
        let entry = |var: &str, key: i64, v: i64| {
            control
                .write_entry(var, &Value::Int(key), Value::Int(v), t)
                .map_err(|e| (e.status(), e.to_string()))
        };
        let global = |var: &str, v: i64| {
            control
                .write_global(var, Value::Int(v), t)
                .map_err(|e| (e.status(), e.to_string()))
        };
        during(&entry, &global);
        stop.store(true, Ordering::Relaxed);
        running.join().unwrap().unwrap().state
    })
}

#[test]
fn with_several_workers_an_entry_goes_to_the_shard_holding_its_key() {
    let mut written = Vec::new();
    let state = run_with(2, |entry, global| {
        for flow in 0..20 {
            match entry("last", flow, -flow - 1) {
                Ok(()) => written.push(flow),
                Err((status, why)) => {
                    assert_eq!(status, 422, "{why}");
                    assert!(why.contains("no worker's shard holds"), "{why}");
                }
            }
        }
        let (status, why) = entry("last", 999, 1).unwrap_err();
        assert_eq!(status, 422, "{why}");
        let (status, why) = global("count", 0).unwrap_err();
        assert_eq!(status, 422, "{why}");
        assert!(why.contains("sums"), "{why}");
        let (status, _) = entry("count", 1, 1).unwrap_err();
        assert_eq!(status, 400);
        let (status, _) = global("nothing", 1).unwrap_err();
        assert_eq!(status, 404);
    });
    assert!(!written.is_empty(), "no flow's entry was written");
    for flow in &written {
        // Written once, in one shard: the dump sums an entry over shards.
        assert_eq!(state["last"][flow.to_string()], -flow - 1, "{state:?}");
    }
    assert!(state["last"].get("999").is_none());
}

#[test]
fn with_one_worker_a_new_key_is_made_and_an_integer_set() {
    let state = run_with(1, |entry, global| {
        entry("last", 999, 7).unwrap();
        for k in 100..110 {
            entry("last", k, k * 2).unwrap();
        }
        entry("last", 3, 70).unwrap();
        global("count", 12345).unwrap();
    });
    assert_eq!(state["last"]["999"], 7);
    for k in 100..110 {
        assert_eq!(state["last"][k.to_string()], k * 2);
    }
    assert_eq!(state["last"]["3"], 70);
    assert_eq!(state["count"], 12345);
}
