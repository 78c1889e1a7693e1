//! The per-frame path allocates nothing: a counting global allocator
//! watches whole runs of a forwarding program over in-memory frames, one
//! of 1,000 frames and one of 11,000. Setting up a run (threads, buffers,
//! parsers, interpreters) costs the same in both, so the 10,000 frames
//! more may not add allocations beyond a few from the queues' waiting
//! threads, which vary from run to run.

mod common;

use common::*;
use flick_packet::{Binding, BoundPort, PacketConfig};
use flick_packet_io::{Port, PortError, TxPort};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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
fn allocations(n: usize) -> (usize, u64) {
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
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let summary = svc.run(bindings, &stop).expect("runs");
    let made = ALLOCATIONS.load(Ordering::SeqCst) - before;
    assert_eq!(summary.ports[1].tx_frames, n as u64);
    (made, sent.load(Ordering::Relaxed))
}

#[test]
fn frames_through_the_engine_allocate_nothing_each() {
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
