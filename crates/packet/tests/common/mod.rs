//! Programs loaded against a small grammar of fixed fields, and ports
//! that read and write frames in memory.

#![allow(dead_code)]

use flick_packet::{Binding, BoundPort, PacketConfig, PacketService, Summary};
use flick_packet_io::{Port, PortError, RecvStatus, RxPort, TxPort};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

/// A flow number, a kind and a sequence number, then any payload.
pub const GRAMMAR: &str = "grammar testpkt;
%byteorder = big;
type pkt = unit {
    flow : uint16;
    kind : uint8;
    seq  : uint32;
};
";

/// The bytes of a frame of `GRAMMAR` with `pad` bytes of payload.
pub fn frame(flow: u16, kind: u8, seq: u32, pad: usize) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&flow.to_be_bytes());
    f.push(kind);
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend((0..pad).map(|i| i as u8));
    f
}

pub fn service(program: &str, config: PacketConfig) -> PacketService {
    let (ast, diags) = flick_syntax::parse(program);
    assert!(diags.is_empty(), "{diags:?}");
    let (checked, diags) = flick_check::check(&ast);
    assert!(diags.is_empty(), "{diags:?}");
    let grammar = Arc::new(flick_wire::Grammar::from_source("testpkt", GRAMMAR).expect("grammar"));
    let loaded = flick_platform::Loaded::new(&ast, &checked, grammar).expect("loads");
    PacketService::new(loaded, config).expect("a packet program")
}

pub struct MemRx {
    pub frames: Arc<Vec<(Vec<u8>, u64)>>,
    pub at: usize,
}

impl RxPort for MemRx {
    fn recv_batch(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError> {
        let end = (self.at + max).min(self.frames.len());
        if self.at == end {
            return Ok(RecvStatus::End);
        }
        for (b, ts) in &self.frames[self.at..end] {
            f(b, *ts);
        }
        let n = end - self.at;
        self.at = end;
        Ok(RecvStatus::Frames(n))
    }

    fn raw_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// A live port: its frames, then nothing, never an end.
pub struct LiveRx(pub MemRx);

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
}

/// Frames with their timestamps.
pub type Frames = Vec<(Vec<u8>, u64)>;

/// Frames written, kept for the test to look at.
#[derive(Clone, Default)]
pub struct MemTx(pub Arc<Mutex<Frames>>);

impl TxPort for MemTx {
    fn send(&mut self, frame: &[u8], ts: u64) -> Result<(), PortError> {
        self.0.lock().unwrap().push((frame.to_vec(), ts));
        Ok(())
    }

    fn flush(&mut self) -> Result<(), PortError> {
        Ok(())
    }
}

pub fn rx(frames: Vec<(Vec<u8>, u64)>) -> BoundPort {
    BoundPort {
        spec: "mem-in".into(),
        port: Port {
            rx: Some(Box::new(MemRx {
                frames: Arc::new(frames),
                at: 0,
            })),
            tx: None,
        },
        live: false,
    }
}

pub fn tx(out: &MemTx) -> BoundPort {
    BoundPort {
        spec: "mem-out".into(),
        port: Port {
            rx: None,
            tx: Some(Box::new(out.clone())),
        },
        live: false,
    }
}

pub fn bind(channel: &str, ports: Vec<BoundPort>) -> Binding {
    Binding {
        channel: channel.into(),
        ports,
    }
}

/// Runs `program` over `frames` on `inside`, `outside` written to memory.
pub fn run(
    program: &str,
    workers: usize,
    frames: Vec<(Vec<u8>, u64)>,
) -> (Summary, Vec<(Vec<u8>, u64)>) {
    let svc = service(
        program,
        PacketConfig {
            workers,
            ..PacketConfig::default()
        },
    );
    let out = MemTx::default();
    let summary = svc
        .run(
            vec![
                bind("inside", vec![rx(frames)]),
                bind("outside", vec![tx(&out)]),
            ],
            &AtomicBool::new(false),
        )
        .expect("runs");
    let written = out.0.lock().unwrap().clone();
    (summary, written)
}
