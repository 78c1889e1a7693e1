//! FlowBlaze's per-flow machines (`examples/flowblaze/*.xl`) run by the
//! `flick` binary over pcap files the test writes: the frames that come
//! out are the ones the program's logic lets through, the dump equals its
//! golden file (`examples/flowblaze/golden/`, rewritten with
//! `FLICK_BLESS=1`), and one worker and two give the same files. A
//! property test holds the UDP firewall to a plain Rust model of it.

use flick_machine::{Engine, FieldReader, Program};
use flick_packet_io::{read_pcap, write_pcap};
use proptest::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use support::{golden_file, ipv4_frame, run_over_ports, Scratch, ROOT};

mod support;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

fn examples() -> PathBuf {
    Path::new(ROOT).join("examples/flowblaze")
}

/// An Ethernet + IPv4 frame carrying a TCP SYN (`proto` 6) or UDP (17),
/// with `payload` bytes after the L4 header.
fn frame(proto: u8, src: u32, sport: u16, dst: u32, dport: u16, payload: usize) -> Vec<u8> {
    let mut f = ipv4_frame(proto, (src, sport), (dst, dport), (0x02, 0, 0), payload);
    let l4 = if proto == 6 { 20 } else { 8 };
    // Tell frames apart in the outputs.
    for (i, b) in f[14 + 20 + l4..].iter_mut().enumerate() {
        *b = i as u8;
    }
    f
}

fn tcp(src: u32, dst: u32, dport: u16) -> Vec<u8> {
    frame(6, src, 40000, dst, dport, 4)
}

type Frames = Vec<(Vec<u8>, u64)>;

/// Runs `program` with `inputs` (port number, frames) and output ports
/// `outs`; returns each output's frames and the dump.
fn run(
    dir: &Scratch,
    program: &str,
    inputs: &[(u8, &Frames)],
    outs: &[u8],
    workers: usize,
) -> (Vec<Frames>, String) {
    let mut ports = Vec::new();
    for (n, frames) in inputs {
        let p = dir.path(&format!("in{n}.pcap"));
        write_pcap(&p, frames).unwrap();
        ports.push(format!("{n}=pcap:{}", p.display()));
    }
    for n in outs {
        let p = dir.path(&format!("out{n}-{workers}.pcap"));
        ports.push(format!("{n}=pcap-out:{}", p.display()));
    }
    let dump = dir.path(&format!("dump-{workers}.json"));
    run_over_ports(&examples().join(program), &ports, workers, &dump);
    let outputs = outs
        .iter()
        .map(|n| read_pcap(&dir.path(&format!("out{n}-{workers}.pcap"))).unwrap())
        .collect();
    (outputs, std::fs::read_to_string(dump).unwrap())
}

/// Runs with one worker and two, asserts they agree, and compares the dump
/// with its golden file.
fn golden(name: &str, program: &str, inputs: &[(u8, &Frames)], outs: &[u8]) -> Vec<Frames> {
    let dir = Scratch::new(name);
    let (one, dump) = run(&dir, program, inputs, outs, 1);
    let (two, dump2) = run(&dir, program, inputs, outs, 2);
    assert_eq!(one, two, "one worker and two wrote different frames");
    assert_eq!(dump, dump2, "one worker and two dumped different state");
    let file = examples().join("golden").join(format!("{name}.dump.json"));
    let want = String::from_utf8(golden_file(&file, dump.as_bytes(), "FLICK_BLESS")).unwrap();
    assert_eq!(dump, want, "the dump differs from {}", file.display());
    one
}

fn pick(frames: &Frames, idx: &[usize]) -> Frames {
    idx.iter().map(|&i| frames[i].clone()).collect()
}

const A: u32 = 0xc633_6401; // 198.51.100.1, outside
const B: u32 = 0xc633_6402;
const C: u32 = 0xc633_6403;
const SERVER: u32 = 0x0a00_0005; // 10.0.0.5, inside

#[test]
fn port_knocking_opens_ssh_only_after_the_sequence() {
    let outside: Frames = vec![
        (tcp(A, SERVER, 22), 0),              // 0 closed: dropped
        (tcp(A, SERVER, 1111), SEC),          // 1 knock 1
        (tcp(B, SERVER, 1111), SEC + 1),      // 2 B knocks 1
        (tcp(A, SERVER, 2222), 2 * SEC),      // 3 knock 2
        (tcp(B, SERVER, 3333), 2 * SEC + 1),  // 4 B wrong: back to closed
        (tcp(A, SERVER, 3333), 3 * SEC),      // 5 knock 3: open
        (tcp(A, SERVER, 22), 4 * SEC),        // 6 passes
        (tcp(B, SERVER, 22), 4 * SEC + 1),    // 7 B: dropped
        (tcp(A, SERVER, 80), 5 * SEC),        // 8 not SSH: dropped
        (tcp(C, SERVER, 1111), 5 * SEC + 1),  // 9 C knock 1
        (tcp(A, SERVER, 22), 6 * SEC),        // 10 passes
        (tcp(A, SERVER, 22), 17 * SEC),       // 11 11 s idle: closed again, dropped
        (tcp(C, SERVER, 2222), 17 * SEC + 1), // 12 C idle too: starts over, dropped
        (tcp(B, SERVER, 1111), 18 * SEC),     // 13 B knocks 1 again: kept
    ];
    let inside: Frames = vec![
        (tcp(SERVER, A, 40000), 4 * SEC + 500), // replies go out
        (tcp(SERVER, B, 40000), 16 * SEC),
    ];
    let out = golden(
        "port_knocking",
        "port_knocking.xl",
        &[(1, &outside), (2, &inside)],
        &[1, 2],
    );
    assert_eq!(out[0], inside, "everything from inside goes out");
    assert_eq!(out[1], pick(&outside, &[6, 10]));
}

fn udp(src: u32, sport: u16, dst: u32, dport: u16) -> Vec<u8> {
    frame(17, src, sport, dst, dport, 12)
}

#[test]
fn the_udp_firewall_opens_the_way_back_for_flows_from_inside() {
    let h1 = 0x0a00_0001;
    let h2 = 0x0a00_0002;
    let dns = 0x0808_0808;
    let inside: Frames = vec![
        (udp(h1, 5000, dns, 53), SEC),       // 0 opens h1:5000 <-> dns:53
        (udp(h2, 6000, dns, 53), 3 * SEC),   // 1 opens h2:6000 <-> dns:53
        (tcp(h1, dns, 53), 4 * SEC),         // 2 not UDP: dropped
        (udp(h1, 5000, dns, 53), 40 * SEC),  // 3 h1 again
        (udp(h2, 6000, dns, 53), 100 * SEC), // 4 reopens after idling
    ];
    let outside: Frames = vec![
        (udp(dns, 53, h1, 5001), 0),        // 0 no path: dropped
        (udp(dns, 53, h1, 5000), 2 * SEC),  // 1 reply: passes
        (udp(dns, 53, h2, 6000), 5 * SEC),  // 2 passes
        (udp(dns, 53, h1, 5001), 6 * SEC),  // 3 other port: dropped
        (udp(dns, 53, h1, 5000), 41 * SEC), // 4 passes (reopened at 40 s)
        (udp(dns, 53, h2, 6000), 50 * SEC), // 5 idle 45 s: closed, dropped
    ];
    let out = golden(
        "udp_firewall",
        "udp_firewall.xl",
        &[(1, &inside), (2, &outside)],
        &[1, 2],
    );
    assert_eq!(out[1], pick(&inside, &[0, 1, 3, 4]));
    assert_eq!(out[0], pick(&outside, &[1, 2, 4]));
}

#[test]
fn big_flows_move_to_port_2_for_the_rest_of_their_window() {
    let (x, y, z) = (0x0a00_0001, 0x0a00_0002, 0x0a00_0003);
    let mut frames: Frames = Vec::new();
    // x -> y: 1000-byte frames, 10 ms apart: the fourth crosses 3000 bytes.
    for i in 0..6u64 {
        frames.push((frame(17, x, 1, y, 2, 958), i * 10 * MS));
    }
    // x -> z: small, never big.
    for i in 0..3u64 {
        frames.push((frame(17, x, 1, z, 2, 10), i * 10 * MS + 1));
    }
    // A second later the window has ended: x -> y is small again.
    frames.push((frame(17, x, 1, y, 2, 958), 1200 * MS));
    frames.sort_by_key(|f| f.1);
    let out = golden("big_flows", "big_flows.xl", &[(1, &frames)], &[1, 2]);
    let len = |f: &Frames| f.iter().map(|(b, _)| b.len()).collect::<Vec<_>>();
    assert_eq!(len(&out[1]), [1000, 1000, 1000]);
    assert_eq!(out[0].len(), 3 + 3 + 1);
    assert_eq!(out[0].last().unwrap().1, 1200 * MS);
}

#[test]
fn check_prints_the_tables_sizes_and_errors_with_a_caret() {
    let o = Command::new(env!("CARGO_BIN_EXE_flick"))
        .args([
            "check",
            &examples().join("udp_firewall.xl").display().to_string(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("stage udp_firewall: 2 states, 3 condition bits, 4 entries, 4 rows; key 4 fields (biflow); 1 flow registers, 64 bytes per context"),
        "{text}"
    );
    let dir = Scratch::new("check");
    let bad = dir.path("bad.xl");
    std::fs::write(&bad, "Stage s {\n  setFlowKey(ipv4.src);\n  State initial a { on(pktRcvd) { setNextState(nowhere); } }\n}\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_flick"))
        .args(["check", &bad.display().to_string()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.xl:3:48: error[X0001]: no state `nowhere` in this stage"),
        "{err}"
    );
    assert!(err.contains("^^^^^^^"), "{err}");
    // A table over the bound is refused under the capacity's own code.
    let big = dir.path("big.xl");
    std::fs::write(&big, "Stage s {\n  setFlowKey(ipv4.src);\n  setTableSize(16777217);\n  State initial a { on(pktRcvd) { setNextState(a); } }\n}\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_flick"))
        .args(["check", &big.display().to_string()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("big.xl:3:16: error[M0007]"), "{err}");
}

/// The UDP firewall by hand: a path per unordered endpoint pair, open
/// from a datagram from inside until 30 s pass without traffic.
#[derive(Default)]
struct FirewallModel {
    /// Last packet time, microseconds, per ordered endpoint pair.
    paths: HashMap<(Endpoint, Endpoint), u64>,
}

type Endpoint = (u32, u16);

impl FirewallModel {
    fn packet(&mut self, inside: bool, src: (u32, u16), dst: (u32, u16), now_us: u64) -> u64 {
        let key = if src <= dst { (src, dst) } else { (dst, src) };
        let open = self
            .paths
            .get(&key)
            .is_some_and(|&last| now_us.saturating_sub(last) <= 30_000_000);
        if open || inside {
            self.paths.insert(key, now_us);
            if inside {
                1 << 2
            } else {
                1 << 1
            }
        } else {
            self.paths.remove(&key);
            0
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn the_udp_firewall_matches_its_model(
        steps in prop::collection::vec((any::<bool>(), 0u32..3, 0u16..3, 0u32..3, 0u16..2, 0u64..40_000), 1..80)
    ) {
        let machine = flick_machine::xl::load(&examples().join("udp_firewall.xl")).unwrap();
        let program = Arc::new(Program::new(machine).unwrap());
        let mut reader = FieldReader::new(&program.machine.fields).unwrap();
        let mut engine = Engine::new(program.clone());
        let mut fields = vec![0; program.machine.fields.len()];
        let mut model = FirewallModel::default();
        let mut now_ms = 0u64;
        for (inside, host, sport, peer, dport, gap_ms) in steps {
            now_ms += gap_ms;
            let (h, p) = (0x0a00_0000 + host, 0x0808_0800 + peer);
            let (src, dst) = if inside {
                ((h, 5000 + sport), (p, 53 + dport))
            } else {
                ((p, 53 + dport), (h, 5000 + sport))
            };
            let f = udp(src.0, src.1, dst.0, dst.1);
            prop_assert!(reader.read(&f, &mut fields));
            let port = if inside { 1 } else { 2 };
            let got = engine.process(&fields, port, f.len(), now_ms * MS).ports;
            let want = model.packet(inside, src, dst, now_ms * 1000);
            prop_assert_eq!(got, want, "at {} ms, inside {}", now_ms, inside);
        }
    }
}
