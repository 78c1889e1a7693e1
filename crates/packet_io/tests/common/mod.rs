//! Helpers shared by the tests: generated frames, temporary files, and
//! network namespaces of the test's own.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flick_packet_io::{RxPort, TxPort};

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// A name unique to this process and call.
pub fn unique(tag: &str) -> String {
    format!(
        "{tag}{}x{}",
        std::process::id(),
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    )
}

/// A file path in the temporary directory, removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(extension: &str) -> TempFile {
        TempFile(std::env::temp_dir().join(format!("{}.{extension}", unique("flick-packet-io-"))))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A small deterministic generator (xorshift), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn range(&mut self, low: usize, high: usize) -> usize {
        low + (self.next() % (high - low + 1) as u64) as usize
    }
}

/// An Ethernet frame of `len` bytes: broadcast destination, a local
/// source, EtherType `ethertype`, the sequence number, then bytes from `rng`.
pub fn frame(rng: &mut Rng, len: usize, ethertype: u16, seq: u32) -> Vec<u8> {
    let mut frame = vec![0xff; 6];
    frame.extend_from_slice(&[0x02, 0, 0, 0, 0x10, 0x01]);
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame.extend_from_slice(&seq.to_be_bytes());
    while frame.len() < len {
        frame.push(rng.next() as u8);
    }
    frame.truncate(len);
    frame
}

/// `count` frames of 60..=1514 bytes with increasing timestamps.
pub fn frames(seed: u64, count: usize) -> Vec<(Vec<u8>, u64)> {
    let mut rng = Rng(seed);
    let mut ts = 1_700_000_000_000_000_000u64;
    (0..count)
        .map(|i| {
            let len = rng.range(60, 1514);
            ts += rng.range(1, 5_000_000) as u64;
            (frame(&mut rng, len, 0x88b5, i as u32), ts)
        })
        .collect()
}

#[allow(unused_imports)]
pub use flick_testkit::netns::{available as netns_available, Netns};

/// Waits until `fd` is readable or `deadline` passes; false on timeout.
pub fn wait_readable(fd: i32, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return false;
    }
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = left.as_millis().clamp(1, 1000) as i32;
    // SAFETY: one live pollfd.
    let ready = unsafe { libc::poll(&mut poll, 1, ms) };
    ready > 0
}

pub const TEST_DEADLINE: Duration = Duration::from_secs(5);

/// The EtherType of the tests' frames, to tell them from what the kernel
/// sends by itself (router solicitations and the like).
pub const MARKER: u16 = 0x88b5;

pub fn is_marked(frame: &[u8]) -> bool {
    frame.len() >= 14 && u16::from_be_bytes([frame[12], frame[13]]) == MARKER
}

/// A namespace with the veth pair `veth-a` - `veth-b`, both up.
pub fn veth_pair(test: &str) -> Option<Netns> {
    if !netns_available(test) {
        return None;
    }
    let ns = Netns::new("flkpio");
    ns.ip(&[
        "link", "add", "name", "veth-a", "type", "veth", "peer", "name", "veth-b",
    ]);
    ns.ip(&["link", "set", "dev", "veth-a", "up"]);
    ns.ip(&["link", "set", "dev", "veth-b", "up"]);
    Some(ns)
}

/// Receives marked frames from `rx` until `count` came or the deadline
/// passed.
pub fn receive_marked(rx: &mut dyn RxPort, count: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + TEST_DEADLINE;
    let fd = rx.raw_fd().expect("a live port has an fd");
    let mut got = Vec::new();
    while got.len() < count && Instant::now() < deadline {
        rx.recv_batch(16, &mut |frame, ts| {
            assert!(ts > 0, "a live frame has a timestamp");
            if is_marked(frame) {
                got.push(frame.to_vec());
            }
        })
        .unwrap();
        if got.len() < count {
            wait_readable(fd, deadline);
        }
    }
    got
}

/// Whatever marked frames `rx` holds now.
pub fn marked_now(rx: &mut dyn RxPort) -> usize {
    let mut marked = 0;
    rx.recv_batch(usize::MAX, &mut |frame, _| {
        marked += usize::from(is_marked(frame))
    })
    .unwrap();
    marked
}

/// `count` marked frames of 60..=1514 bytes, numbered from `first`.
pub fn marked_frames(rng: &mut Rng, count: u32, first: u32) -> Vec<Vec<u8>> {
    (0..count)
        .map(|seq| {
            let len = rng.range(60, 1514);
            frame(rng, len, MARKER, first + seq)
        })
        .collect()
}

/// Sends every frame through `tx`, then flushes.
pub fn send_all(tx: &mut dyn TxPort, frames: &[Vec<u8>]) {
    for frame in frames {
        tx.send(frame, 0).unwrap();
    }
    tx.flush().unwrap();
}

/// `got` is `sent`, frame by frame, in order.
pub fn assert_same_frames(got: &[Vec<u8>], sent: &[Vec<u8>], way: &str) {
    assert_eq!(got.len(), sent.len(), "frames lost on the way {way}");
    for (i, (got, sent)) in got.iter().zip(sent).enumerate() {
        assert_eq!(got, sent, "frame {i} differs on the way {way}");
    }
}
