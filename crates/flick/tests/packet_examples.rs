//! The packet examples (`examples/packets/`) on the captures
//! `scripts/gen_packets.py` writes (`examples/packets/testdata/`):
//!
//! - the captures in the repository are what the script writes;
//! - the expected outputs (`testdata/expected/`) are what the plain Rust
//!   models of `flick_testkit::packet_model` give, and `flick run` gives
//!   exactly them, byte for byte, with one worker and with two;
//! - on random traffic (proptest, seeds printed on failure), `flick run`
//!   agrees with the models.
//!
//! `UPDATE_GOLDEN=1 cargo test -p flick --test packet_examples` rewrites
//! the expected files from the models (then read the diff).

use flick_testkit::packet_model::{self as model, dump_key, FlowTracker, Key, PortKnocking};
use proptest::prelude::*;
use serde_json::{json, Map, Value as Json};
use std::path::{Path, PathBuf};
use support::{assert_globals, golden_file, run_for_globals, script_writes, Scratch, ROOT};

mod support;

const DPI_OUTPUTS: usize = 3;

fn testdata(name: &str) -> PathBuf {
    Path::new(ROOT).join("examples/packets/testdata").join(name)
}

/// A packet example's program.
fn example(name: &str) -> PathBuf {
    Path::new(ROOT).join("examples/packets").join(name)
}

fn frames_of(path: &Path) -> Vec<(Vec<u8>, u64)> {
    flick_packet_io::read_pcap(path).unwrap()
}

/// A dictionary of the model as the dump spells it.
fn dict<K, V>(
    entries: impl Iterator<Item = (K, V)>,
    key: impl Fn(&K) -> Vec<u8>,
    value: impl Fn(&V) -> u64,
) -> Json {
    let mut m = Map::new();
    for (k, v) in entries {
        m.insert(dump_key(&key(&k)), json!(value(&v)));
    }
    Json::Object(
        m.into_iter()
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect(),
    )
}

/// What the models say for a capture: the tracker's globals, the
/// firewall's globals and passed frames, the balancer's outputs.
struct Expected {
    tracker: Json,
    knock: Json,
    knock_out: Vec<(Vec<u8>, u64)>,
    dpi_out: Vec<Vec<(Vec<u8>, u64)>>,
}

fn models(frames: &[(Vec<u8>, u64)]) -> Expected {
    let mut tracker = FlowTracker::default();
    let mut knock = PortKnocking::default();
    let mut knock_out = Vec::new();
    let mut dpi_out = vec![Vec::new(); DPI_OUTPUTS];
    for (f, ts) in frames {
        tracker.frame(f);
        if knock.frame(f) {
            knock_out.push((f.clone(), *ts));
        }
        let outs = model::dpi_outputs(f, DPI_OUTPUTS);
        for (i, out) in dpi_out.iter_mut().enumerate() {
            if outs & (1 << i) != 0 {
                out.push((f.clone(), *ts));
            }
        }
    }
    let packed = |k: &Key| k.packed();
    Expected {
        tracker: json!({
            "bytes": dict(tracker.flows.iter(), |k| packed(k), |v| v.1),
            "packets": dict(tracker.flows.iter(), |k| packed(k), |v| v.0),
        }),
        knock: json!({
            "allowed": dict(knock.allowed.iter(), |k| packed(k), |_| 1),
            "knocks": dict(knock.knocks.iter(), |k| packed(k), |v| **v as u64),
        }),
        knock_out,
        dpi_out,
    }
}

/// Runs the three examples on `input` with `workers` and checks every
/// output against `expected`.
fn run_examples(input: &Path, workers: usize, expected: &Expected, scratch: &Scratch) {
    let input = input.display();
    let ports = [format!("wire=pcap:{input}")];
    let tracker = example("flow_tracker.flick");
    assert_globals(scratch, &tracker, &ports, workers, &expected.tracker);

    let passed = scratch.path("passed.pcap");
    let ports = [
        format!("inside=pcap:{input}"),
        format!("outside=pcap-out:{}", passed.display()),
    ];
    let knock = example("port_knocking.flick");
    assert_globals(scratch, &knock, &ports, workers, &expected.knock);
    assert_eq!(
        frames_of(&passed),
        expected.knock_out,
        "port_knocking's passed frames"
    );

    let outs: Vec<PathBuf> = (0..DPI_OUTPUTS)
        .map(|i| scratch.path(&format!("dpi{i}.pcap")))
        .collect();
    let specs: Vec<String> = outs
        .iter()
        .map(|p| format!("pcap-out:{}", p.display()))
        .collect();
    run_for_globals(
        &example("dpi_balancer.flick"),
        &[
            format!("wire=pcap:{input}"),
            format!("workers={}", specs.join(",")),
        ],
        &scratch.path("dpi.json"),
        workers,
    );
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(
            frames_of(out),
            expected.dpi_out[i],
            "dpi_balancer's workers[{i}]"
        );
    }
}

#[test]
fn captures_are_what_the_generator_writes() {
    let names = ["tracker.pcap", "dpi.pcap", "knock.pcap"].map(String::from);
    script_writes("scripts/gen_packets.py", &testdata(""), &names);
}

/// The expected files: the models' outputs on the three captures.
fn golden() -> Vec<(&'static str, Expected)> {
    let mut out = Vec::new();
    for name in ["tracker", "knock", "dpi"] {
        out.push((name, models(&frames_of(&testdata(&format!("{name}.pcap"))))));
    }
    out
}

fn expected_path(capture: &str, what: &str) -> PathBuf {
    testdata(&format!("expected/{capture}.{what}"))
}

#[test]
fn expected_files_are_what_the_models_give() {
    for (capture, e) in golden() {
        let files: Vec<(String, Vec<u8>)> = {
            let mut files = vec![
                (
                    "flow_tracker.json".to_string(),
                    serde_json::to_vec_pretty(&e.tracker).unwrap(),
                ),
                (
                    "port_knocking.json".to_string(),
                    serde_json::to_vec_pretty(&e.knock).unwrap(),
                ),
            ];
            let scratch = Scratch::new("golden");
            let mut pcaps = vec![("port_knocking.pcap".to_string(), e.knock_out.clone())];
            for (i, out) in e.dpi_out.iter().enumerate() {
                pcaps.push((format!("dpi_balancer{i}.pcap"), out.clone()));
            }
            for (name, frames) in pcaps {
                let p = scratch.path(&name);
                flick_packet_io::write_pcap(&p, &frames).unwrap();
                files.push((name, std::fs::read(&p).unwrap()));
            }
            files
        };
        for (what, bytes) in files {
            let path = expected_path(capture, &what);
            let have = golden_file(&path, &bytes, "UPDATE_GOLDEN");
            assert!(
                have == bytes,
                "{} is not what the model gives",
                path.display()
            );
        }
    }
}

#[test]
fn flick_gives_the_expected_outputs() {
    for (capture, _) in golden() {
        let expected = Expected {
            tracker: serde_json::from_slice(
                &std::fs::read(expected_path(capture, "flow_tracker.json")).unwrap(),
            )
            .unwrap(),
            knock: serde_json::from_slice(
                &std::fs::read(expected_path(capture, "port_knocking.json")).unwrap(),
            )
            .unwrap(),
            knock_out: frames_of(&expected_path(capture, "port_knocking.pcap")),
            dpi_out: (0..DPI_OUTPUTS)
                .map(|i| frames_of(&expected_path(capture, &format!("dpi_balancer{i}.pcap"))))
                .collect(),
        };
        for workers in [1, 2] {
            let scratch = Scratch::new(capture);
            run_examples(
                &testdata(&format!("{capture}.pcap")),
                workers,
                &expected,
                &scratch,
            );
        }
    }
}

/// One frame of random traffic, from small pools of hosts and ports so
/// that flows repeat, knocks happen and DNS turns up.
#[derive(Debug, Clone)]
enum Frame {
    Tcp4 {
        src: u8,
        dst: u8,
        sport: u16,
        dport: u16,
        len: usize,
    },
    Udp4 {
        src: u8,
        dst: u8,
        sport: u16,
        dport: u16,
        len: usize,
    },
    Icmp4 {
        src: u8,
        dst: u8,
    },
    Frag4 {
        src: u8,
        dst: u8,
    },
    Tcp6 {
        src: u8,
        dst: u8,
        sport: u16,
        dport: u16,
    },
    Udp6 {
        src: u8,
        dst: u8,
        sport: u16,
        dport: u16,
    },
    Arp,
    Vlan {
        src: u8,
        dst: u8,
        dport: u16,
    },
}

fn port() -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(22u16),
        Just(53),
        Just(80),
        Just(5123),
        Just(6234),
        Just(7345),
        Just(8456),
        1024u16..1030,
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    let host = 0u8..6;
    prop_oneof![
        4 => (host.clone(), host.clone(), port(), port(), 0usize..200)
            .prop_map(|(src, dst, sport, dport, len)| Frame::Tcp4 { src, dst, sport, dport, len }),
        3 => (host.clone(), host.clone(), port(), port(), 0usize..200)
            .prop_map(|(src, dst, sport, dport, len)| Frame::Udp4 { src, dst, sport, dport, len }),
        1 => (host.clone(), host.clone()).prop_map(|(src, dst)| Frame::Icmp4 { src, dst }),
        1 => (host.clone(), host.clone()).prop_map(|(src, dst)| Frame::Frag4 { src, dst }),
        1 => (host.clone(), host.clone(), port(), port())
            .prop_map(|(src, dst, sport, dport)| Frame::Tcp6 { src, dst, sport, dport }),
        1 => (host.clone(), host.clone(), port(), port())
            .prop_map(|(src, dst, sport, dport)| Frame::Udp6 { src, dst, sport, dport }),
        1 => Just(Frame::Arp),
        1 => (host.clone(), host, port()).prop_map(|(src, dst, dport)| Frame::Vlan { src, dst, dport }),
    ]
}

fn ether(ethertype: u16, vlan: bool) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    if vlan {
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
    }
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

fn ipv4(f: &mut Vec<u8>, src: u8, dst: u8, proto: u8, l4_len: usize, frag: u16) {
    let total = (20 + l4_len) as u16;
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 1]);
    f.extend_from_slice(&frag.to_be_bytes());
    f.extend_from_slice(&[64, proto, 0, 0, 10, 0, 0, src, 10, 0, 0, dst]);
}

fn ipv6(f: &mut Vec<u8>, src: u8, dst: u8, next: u8, l4_len: usize) {
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(l4_len as u16).to_be_bytes());
    f.extend_from_slice(&[next, 64]);
    for a in [src, dst] {
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, a]);
    }
}

fn tcp(f: &mut Vec<u8>, sport: u16, dport: u16, len: usize) {
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    f.resize(f.len() + len, 0xab);
}

fn udp(f: &mut Vec<u8>, sport: u16, dport: u16, len: usize) {
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + len) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.resize(f.len() + len, 0xcd);
}

fn bytes_of(frame: &Frame) -> Vec<u8> {
    match *frame {
        Frame::Tcp4 {
            src,
            dst,
            sport,
            dport,
            len,
        } => {
            let mut f = ether(0x0800, false);
            ipv4(&mut f, src, dst, 6, 20 + len, 0x4000);
            tcp(&mut f, sport, dport, len);
            f
        }
        Frame::Udp4 {
            src,
            dst,
            sport,
            dport,
            len,
        } => {
            let mut f = ether(0x0800, false);
            ipv4(&mut f, src, dst, 17, 8 + len, 0);
            udp(&mut f, sport, dport, len);
            f
        }
        Frame::Icmp4 { src, dst } => {
            let mut f = ether(0x0800, false);
            ipv4(&mut f, src, dst, 1, 8, 0);
            f.extend_from_slice(&[8, 0, 0, 0, 0, 1, 0, 1]);
            f
        }
        Frame::Frag4 { src, dst } => {
            let mut f = ether(0x0800, false);
            ipv4(&mut f, src, dst, 6, 24, 3);
            f.resize(f.len() + 24, 0xee);
            f
        }
        Frame::Tcp6 {
            src,
            dst,
            sport,
            dport,
        } => {
            let mut f = ether(0x86dd, false);
            ipv6(&mut f, src, dst, 6, 20);
            tcp(&mut f, sport, dport, 0);
            f
        }
        Frame::Udp6 {
            src,
            dst,
            sport,
            dport,
        } => {
            let mut f = ether(0x86dd, false);
            ipv6(&mut f, src, dst, 17, 8);
            udp(&mut f, sport, dport, 0);
            f
        }
        Frame::Arp => {
            let mut f = ether(0x0806, false);
            f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1, 10, 0, 0, 1]);
            f.extend_from_slice(&[0, 0, 0, 0, 0, 0, 10, 0, 0, 2]);
            f
        }
        Frame::Vlan { src, dst, dport } => {
            let mut f = ether(0x0800, true);
            ipv4(&mut f, src, dst, 17, 8, 0);
            udp(&mut f, 4000, dport, 0);
            f
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn flick_agrees_with_the_models(traffic in prop::collection::vec(frame(), 1..120), workers in 1usize..3) {
        let frames: Vec<(Vec<u8>, u64)> = traffic
            .iter()
            .enumerate()
            .map(|(i, f)| (bytes_of(f), 1_700_000_000_000_000_000 + i as u64 * 1000))
            .collect();
        let scratch = Scratch::new("prop");
        let input = scratch.path("input.pcap");
        flick_packet_io::write_pcap(&input, &frames).unwrap();
        run_examples(&input, workers, &models(&frames), &scratch);
    }
}
