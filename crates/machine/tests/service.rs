//! A machine served over in-memory ports: frames merged by timestamp,
//! steered to two workers, written back in input order; and tables
//! replaced between two frames of a run, the contexts kept.

mod support;
use support::udp;

use flick_machine::xl::parse_str;
use flick_machine::{InPort, MachineService, OutPort, Program};
use flick_packet_io::{PortError, RecvStatus, RxPort, TxPort};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

type Frames = Vec<(Vec<u8>, u64)>;
type Sent = Arc<Mutex<Frames>>;

/// Frames handed out one call at a time; reading frame `at` sends `swap`.
struct MemRx {
    frames: Frames,
    next: usize,
    swap: Option<(usize, crossbeam_channel::Sender<Arc<Program>>, Arc<Program>)>,
}

impl RxPort for MemRx {
    fn recv_batch(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError> {
        let mut n = 0;
        while n < max && self.next < self.frames.len() {
            if let Some((at, tx, p)) = &self.swap {
                if *at == self.next {
                    tx.send(p.clone()).unwrap();
                }
            }
            let (b, ts) = &self.frames[self.next];
            f(b, *ts);
            self.next += 1;
            n += 1;
        }
        Ok(if n == 0 {
            RecvStatus::End
        } else {
            RecvStatus::Frames(n)
        })
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

struct MemTx(Sent);

impl TxPort for MemTx {
    fn send(&mut self, frame: &[u8], ts: u64) -> Result<(), PortError> {
        self.0.lock().unwrap().push((frame.to_vec(), ts));
        Ok(())
    }
    fn flush(&mut self) -> Result<(), PortError> {
        Ok(())
    }
}

fn program(text: &str) -> Arc<Program> {
    Arc::new(Program::new(parse_str("t.xl", text).unwrap()).unwrap())
}

fn serve(
    p: Arc<Program>,
    inputs: Vec<Frames>,
    workers: usize,
    swap: Option<(usize, Arc<Program>)>,
) -> (Vec<Frames>, String) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let ins = inputs
        .into_iter()
        .enumerate()
        .map(|(i, frames)| InPort {
            number: i as u8 + 1,
            spec: format!("mem{i}"),
            rx: Box::new(MemRx {
                frames,
                next: 0,
                swap: swap
                    .as_ref()
                    .filter(|_| i == 0)
                    .map(|(at, p)| (*at, tx.clone(), p.clone())),
            }),
            live: false,
        })
        .collect();
    let sent: Vec<Sent> = (0..2).map(|_| Sent::default()).collect();
    let outs = sent
        .iter()
        .enumerate()
        .map(|(i, s)| OutPort {
            number: i as u8 + 1,
            spec: format!("out{i}"),
            tx: Box::new(MemTx(s.clone())),
        })
        .collect();
    let service = MachineService::new(p, workers).unwrap();
    assert_eq!(service.workers(), workers);
    let summary = service
        .run(ins, outs, &AtomicBool::new(false), Some(rx))
        .unwrap();
    assert!(
        summary.refused_swaps.is_empty(),
        "{:?}",
        summary.refused_swaps
    );
    let out = sent.iter().map(|s| s.lock().unwrap().clone()).collect();
    (out, summary.dump.json())
}

const COUNT: &str = "Stage s { Register n; setFlowKey(ipv4.src, udp.sport); \
    State initial a { on(pktRcvd) { n = n + 1; sendPacket(255, 1); } } }";

#[test]
fn files_are_merged_by_time_and_outputs_keep_input_order() {
    let a: Vec<_> = (0..50u64).map(|i| (udp(i as u32 % 7, 1), i * 2)).collect();
    let b: Vec<_> = (0..50u64)
        .map(|i| (udp(100 + i as u32 % 5, 2), i * 2 + 1))
        .collect();
    let (one, dump1) = serve(program(COUNT), vec![a.clone(), b.clone()], 1, None);
    let (two, dump2) = serve(program(COUNT), vec![a, b], 2, None);
    assert_eq!(one, two);
    assert_eq!(dump1, dump2);
    let ts: Vec<u64> = one[0].iter().map(|f| f.1).collect();
    assert_eq!(ts, (0..100).collect::<Vec<u64>>(), "merged by timestamp");
    assert!(dump1.contains("\"frames\": 100"), "{dump1}");
}

#[test]
fn tables_swapped_mid_run_keep_the_contexts() {
    let v2 = program(
        "Stage s { Register n; setFlowKey(ipv4.src, udp.sport); \
         State initial a { on(pktRcvd) { \
            if (n >= 3) { n = n + 1; sendPacket(255, 2); } \
            if (n < 3) { n = n + 1; sendPacket(255, 1); } } } }",
    );
    let frames: Vec<_> = (0..12u64).map(|i| (udp(i as u32 % 2, 1), i)).collect();
    // Reading frame 5 sends the new tables: frames 0 to 5 run on the old
    // ones (each flow counts 3), 6 to 11 on the new, which see the counts.
    let (out, dump) = serve(program(COUNT), vec![frames.clone()], 2, Some((5, v2)));
    assert_eq!(out[0], frames[..6].to_vec());
    assert_eq!(out[1], frames[6..].to_vec());
    assert_eq!(dump.matches("\"n\": 6").count(), 2, "{dump}");
}

#[test]
fn set_field_rewrites_the_frame_at_its_offset() {
    let p = program(
        "PacketField ipv4 { tos = packet.data[15:+1]; } PacketField udp { csum = packet.data[40:+2]; } \
         Stage s { Register n; setFlowKey(ipv4.src); \
         State initial a { on(pktRcvd) { n = n + 1; setField(ipv4.tos, 255, 0x2e); setField(udp.csum, 255, n); sendPacket(255, 1); } } }",
    );
    // With a right IPv4 header checksum, which stays right.
    let frames: Vec<_> = (0..3u64)
        .map(|i| {
            let mut f = udp(7, 1);
            f[24..26].fill(0);
            let sum = ipv4_header_checksum(&f[14..34]);
            f[24..26].copy_from_slice(&sum.to_be_bytes());
            (f, i)
        })
        .collect();
    let (out, _) = serve(p, vec![frames.clone()], 1, None);
    for (i, (f, _)) in out[0].iter().enumerate() {
        let mut want = frames[i].0.clone();
        want[15] = 0x2e;
        // The IPv4 header checksum follows the TOS; the UDP checksum, set
        // itself, stays as set.
        want[24..26].fill(0);
        let sum = ipv4_header_checksum(&want[14..34]);
        want[24..26].copy_from_slice(&sum.to_be_bytes());
        want[40..42].copy_from_slice(&(i as u16 + 1).to_be_bytes());
        assert_eq!(*f, want);
    }
}

/// The checksum of an IPv4 header whose checksum field is zero.
fn ipv4_header_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn flick(body: &str) -> Arc<Program> {
    let text = format!("machine m: (packet/packet a, packet/packet b)\n{body}");
    let l = flick_machine::lang::compile(&text).unwrap_or_else(|d| panic!("{d:#?}"));
    Arc::new(Program::new(l.machine).unwrap())
}

#[test]
fn stateless_stages_spread_over_the_workers_and_a_keyed_later_stage_steers() {
    // Every stage stateless: frames go to the workers in turn.
    let filter = "  stage filter:\n    on packet when udp.sport = 1: forward b\n    on packet: set ipv4.ttl := 7; forward a\n";
    let frames: Vec<_> = (0..40u64)
        .map(|i| (udp(i as u32, 1 + (i % 2) as u16), i))
        .collect();
    let (one, _) = serve(flick(filter), vec![frames.clone()], 1, None);
    let (two, _) = serve(flick(filter), vec![frames.clone()], 2, None);
    assert_eq!(one, two);
    assert_eq!(one[1].len(), 20);
    assert!(one[0].iter().all(|(f, _)| f[22] == 7), "ttl rewritten");
    // A stateless stage before the only keyed one: still several workers,
    // steered by the keyed stage's key.
    let counted = "  stage pick:\n    on packet when udp.sport = 1: goto count\n    on packet: forward a\n  stage count:\n    key ipv4.src\n    flow n: integer := 0\n    states s\n    in s on packet: n := n + 1; forward b\n";
    let p = flick(counted);
    assert!(!p.machine.single_worker());
    let (one, d1) = serve(p.clone(), vec![frames.clone()], 1, None);
    let (two, d2) = serve(p, vec![frames], 2, None);
    assert_eq!((one, d1), (two, d2));
}

/// A port that takes every frame and loses every other one (counted at
/// its flush, as a live port whose send queue is full reports), and
/// refuses frames shorter than 20 bytes.
struct LossyTx {
    taken: u64,
    stats: flick_packet_io::PortStats,
}

impl TxPort for LossyTx {
    fn send(&mut self, frame: &[u8], _ts: u64) -> Result<(), PortError> {
        if frame.len() < 20 {
            return Err(PortError::FrameSize {
                port: "lossy".into(),
                len: frame.len(),
                min: 20,
                max: 2048,
            });
        }
        self.taken += 1;
        Ok(())
    }
    fn flush(&mut self) -> Result<(), PortError> {
        self.stats.drops = self.taken / 2;
        Ok(())
    }
    fn stats(&self) -> flick_packet_io::PortStats {
        self.stats
    }
}

#[test]
fn frames_a_port_refuses_or_loses_are_counted_as_not_sent() {
    let mut frames: Frames = (0..40u64).map(|i| (udp(i as u32 % 7, 1), i)).collect();
    frames.push((vec![0u8; 14], 40));
    let ins = vec![InPort {
        number: 1,
        spec: "mem".into(),
        rx: Box::new(MemRx {
            frames,
            next: 0,
            swap: None,
        }),
        live: false,
    }];
    let outs = vec![OutPort {
        number: 1,
        spec: "lossy".into(),
        tx: Box::new(LossyTx {
            taken: 0,
            stats: Default::default(),
        }),
    }];
    let service = MachineService::new(program(COUNT), 1).unwrap();
    let summary = service
        .run(ins, outs, &AtomicBool::new(false), None)
        .unwrap();
    // 40 frames taken, 20 of them lost, and the short one refused.
    assert_eq!(summary.not_sent, 21, "{}", summary.line());
    assert!(
        summary
            .line()
            .contains("not sent (port errors or full send queues) 21"),
        "{}",
        summary.line()
    );
}

/// A live port: its frames as fast as they are asked for, then nothing
/// (it never ends), and what its kernel ring would say it dropped.
struct LiveRx(MemRx);

impl RxPort for LiveRx {
    fn recv_batch(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError> {
        match self.0.recv_batch(max, f)? {
            RecvStatus::End => Ok(RecvStatus::Idle),
            s => Ok(s),
        }
    }
    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    fn stats(&self) -> flick_packet_io::PortStats {
        flick_packet_io::PortStats {
            drops: 5,
            ..Default::default()
        }
    }
}

/// A port that takes 100 µs to send each frame.
struct SlowTx(Sent);

impl TxPort for SlowTx {
    fn send(&mut self, frame: &[u8], ts: u64) -> Result<(), PortError> {
        std::thread::sleep(std::time::Duration::from_micros(100));
        self.0.lock().unwrap().push((frame.to_vec(), ts));
        Ok(())
    }
    fn flush(&mut self) -> Result<(), PortError> {
        Ok(())
    }
}

/// A live port read faster than the machine's frames are written loses
/// none of them: past the pool's jobs its frames wait in the port (a
/// kernel ring) instead of being read and dropped; what the port itself
/// dropped is counted.
#[test]
fn a_live_port_waits_for_free_jobs_rather_than_dropping() {
    use std::sync::atomic::Ordering;
    let frames: Frames = (0..3000u64).map(|i| (udp(i as u32 % 7, 1), i)).collect();
    let ins = vec![InPort {
        number: 1,
        spec: "live".into(),
        rx: Box::new(LiveRx(MemRx {
            frames: frames.clone(),
            next: 0,
            swap: None,
        })),
        live: true,
    }];
    let sent = Sent::default();
    let outs = vec![OutPort {
        number: 1,
        spec: "slow".into(),
        tx: Box::new(SlowTx(sent.clone())),
    }];
    let service = MachineService::new(program(COUNT), 2).unwrap();
    let stop = AtomicBool::new(false);
    let summary = std::thread::scope(|s| {
        let stop_ref = &stop;
        let running = s.spawn(move || service.run(ins, outs, stop_ref, None));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while sent.lock().unwrap().len() < frames.len() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        running.join().unwrap().unwrap()
    });
    assert_eq!(summary.received[&1], 3000, "{}", summary.line());
    assert_eq!(*sent.lock().unwrap(), frames, "every frame, in order");
    assert_eq!(summary.rx_drops, 5);
    assert!(
        summary
            .line()
            .contains("dropped by the ports on the way in 5"),
        "{}",
        summary.line()
    );
}
