//! FlowBlaze's Table 3 use cases (`examples/flowblaze/*.xl`) run by the
//! `flick` binary over the captures `scripts/gen_flowblaze.py` writes
//! (`examples/flowblaze/testdata/NAME-N.pcap`, one per input port):
//!
//! - the captures in the repository are what the script writes;
//! - each program's output captures and dump equal its golden files
//!   (`examples/flowblaze/golden/usecases/`, rewritten with
//!   `FLICK_BLESS=1`), byte for byte, with one worker and with two; and
//!   what they hold was checked by hand against what the program is for
//!   (the assertions below: frames per port, which flows passed, the
//!   rewritten headers and their checksums);
//! - each use case written in Flick's machine syntax (`NAME.flick`) sends
//!   the same frames as its XL program and leaves the same dump;
//! - on random traffic (proptest), every frame's verdict (ports, fields
//!   written) by the XL program and by the `.flick` machine equals the
//!   one of a plain Rust model of the use case
//!   (`flick_testkit::flowblaze_model`).

use flick_machine::{Engine, FieldReader, Program};
use flick_packet_io::read_pcap;
use flick_testkit::flowblaze_model::{self as model, Pkt, Verdict};
use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use support::{golden_file, ipv4_frame, run_over_ports, script_writes, Scratch, ROOT};

mod support;

fn examples() -> PathBuf {
    Path::new(ROOT).join("examples/flowblaze")
}

/// A program and its ports: the XL port numbers it reads captures on and
/// the ones it sends to.
struct UseCase {
    name: &'static str,
    inputs: &'static [u8],
    outputs: &'static [u8],
}

/// A use case's name, input ports and output ports.
const fn use_case_on(name: &'static str, inputs: &'static [u8], outputs: &'static [u8]) -> UseCase {
    UseCase {
        name,
        inputs,
        outputs,
    }
}

const USE_CASES: &[UseCase] = &[
    use_case_on("server_load_balancer", &[1, 2, 3], &[1, 2, 3]),
    use_case_on("udp_firewall", &[1, 2], &[1, 2]),
    use_case_on("port_knocking", &[1, 2], &[1, 2]),
    use_case_on("flowlet_lb", &[1], &[2, 3]),
    use_case_on("traffic_policer", &[1], &[2]),
    use_case_on("big_flows", &[1], &[1, 2]),
    use_case_on("syn_flood", &[1, 2], &[1, 2]),
    use_case_on("tcp_optimistic_ack", &[1, 2], &[1, 2]),
    use_case_on("super_spreader", &[1], &[2]),
    use_case_on("dynamic_nat", &[1, 2], &[1, 2]),
    use_case_on("tcp_conntrack", &[1, 2], &[1, 2]),
];

fn use_case(name: &str) -> &'static UseCase {
    USE_CASES.iter().find(|u| u.name == name).unwrap()
}

/// What one run wrote: each output capture's bytes, in `outputs` order,
/// and the dump.
struct Run {
    captures: Vec<Vec<u8>>,
    dump: String,
}

/// Runs `program` over the use case's captures with `workers` workers.
fn run(dir: &Scratch, program: &Path, uc: &UseCase, workers: usize) -> Run {
    let tag = format!(
        "{}-{workers}",
        program.extension().unwrap().to_string_lossy()
    );
    let mut ports = Vec::new();
    for n in uc.inputs {
        let p = examples().join(format!("testdata/{}-{n}.pcap", uc.name));
        ports.push(format!("{n}=pcap:{}", p.display()));
    }
    for n in uc.outputs {
        let p = dir.path(&format!("out{n}-{tag}.pcap"));
        ports.push(format!("{n}=pcap-out:{}", p.display()));
    }
    let dump = dir.path(&format!("dump-{tag}.json"));
    run_over_ports(program, &ports, workers, &dump);
    Run {
        captures: uc
            .outputs
            .iter()
            .map(|n| std::fs::read(dir.path(&format!("out{n}-{tag}.pcap"))).unwrap())
            .collect(),
        dump: std::fs::read_to_string(dump).unwrap(),
    }
}

/// Compares `got` with the golden file `name` (rewritten under
/// `FLICK_BLESS=1`).
fn against_golden(name: &str, got: &[u8]) {
    let file = examples().join("golden/usecases").join(name);
    let want = golden_file(&file, got, "FLICK_BLESS");
    assert!(got == want, "{} differs from this run", file.display());
}

type Frames = Vec<(Vec<u8>, u64)>;

/// Runs the XL program with one worker and two, asserts they agree and
/// match the golden files; returns each output port's frames (in
/// `outputs` order) and the dump.
fn golden(name: &str) -> (Vec<Frames>, Json) {
    let uc = use_case(name);
    let dir = Scratch::new(name);
    let program = examples().join(format!("{name}.xl"));
    let one = run(&dir, &program, uc, 1);
    let two = run(&dir, &program, uc, 2);
    assert!(
        one.captures == two.captures,
        "one worker and two wrote different frames"
    );
    assert_eq!(
        one.dump, two.dump,
        "one worker and two dumped different state"
    );
    against_golden(&format!("{name}.dump.json"), one.dump.as_bytes());
    for (n, bytes) in uc.outputs.iter().zip(&one.captures) {
        against_golden(&format!("{name}.out{n}.pcap"), bytes);
    }
    let frames = uc
        .outputs
        .iter()
        .map(|n| read_pcap(&dir.path(&format!("out{n}-xl-1.pcap"))).unwrap())
        .collect();
    (frames, serde_json::from_str(&one.dump).unwrap())
}

fn input(name: &str, port: u8) -> Frames {
    read_pcap(&examples().join(format!("testdata/{name}-{port}.pcap"))).unwrap()
}

/// The dump's counters: frames, dropped, expired, table_full, evicted,
/// and frames sent per port (port, count).
fn counters(dump: &Json) -> (u64, u64, u64, u64, u64, Vec<(String, u64)>) {
    let n = |k: &str| dump[k].as_u64().unwrap();
    let sent = dump["sent"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    (
        n("frames"),
        n("dropped"),
        n("expired"),
        n("table_full"),
        n("evicted"),
        sent,
    )
}

fn sent(list: &[(u8, u64)]) -> Vec<(String, u64)> {
    list.iter().map(|(p, n)| (p.to_string(), *n)).collect()
}

/// One's complement sum over `data`, folded.
fn sum16(data: &[u8], mut s: u32) -> u32 {
    for c in data.chunks(2) {
        s += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s
}

/// Whether an IPv4 frame's header checksum and TCP or UDP checksum hold.
fn checksums_hold(f: &[u8]) -> bool {
    let ip = &f[14..34];
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let seg = &f[34..14 + total];
    let mut pseudo = Vec::from(&ip[12..20]);
    pseudo.extend([0, ip[9]]);
    pseudo.extend((seg.len() as u16).to_be_bytes());
    sum16(ip, 0) == 0xffff && sum16(seg, sum16(&pseudo, 0)) == 0xffff
}

fn be32(f: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(f[at..at + 4].try_into().unwrap())
}

fn src(f: &[u8]) -> u32 {
    be32(f, 26)
}

fn dst(f: &[u8]) -> u32 {
    be32(f, 30)
}

fn sport(f: &[u8]) -> u16 {
    u16::from_be_bytes([f[34], f[35]])
}

fn ip(a: [u8; 4]) -> u32 {
    u32::from_be_bytes(a)
}

#[test]
fn the_captures_are_what_the_script_writes() {
    let names: Vec<String> = USE_CASES
        .iter()
        .flat_map(|uc| uc.inputs.iter().map(|n| format!("{}-{n}.pcap", uc.name)))
        .collect();
    script_writes(
        "scripts/gen_flowblaze.py",
        &examples().join("testdata"),
        &names,
    );
}

#[test]
fn server_load_balancer_keeps_connections_on_their_server() {
    let (out, dump) = golden("server_load_balancer");
    // 48 frames; 5 new connections found the table (16 contexts) full, 3
    // expired ones gave way; the first connection expired at 11 s.
    assert_eq!(
        counters(&dump),
        (48, 0, 1, 5, 3, sent(&[(1, 2), (2, 27), (3, 19)]))
    );
    // Every frame to a server carries its MAC address, checksums intact
    // (the Ethernet header is outside them), and a connection's frames
    // all went to one server, except the first connection, which expired
    // and was dealt again.
    let mac = |f: &[u8]| f[..6].iter().fold(0u64, |v, &b| v << 8 | b as u64);
    assert!(out[1]
        .iter()
        .all(|(f, _)| mac(f) == model::MAC_A && checksums_hold(f)));
    assert!(out[2].iter().all(|(f, _)| mac(f) == model::MAC_B));
    let a: Vec<(u32, u16)> = out[1].iter().map(|(f, _)| (src(f), sport(f))).collect();
    let b: Vec<(u32, u16)> = out[2].iter().map(|(f, _)| (src(f), sport(f))).collect();
    let c0 = ip([198, 51, 100, 1]);
    assert_eq!(a.iter().filter(|k| **k == (c0, 40001)).count(), 4);
    assert_eq!(b.iter().filter(|k| **k == (c0, 40001)).count(), 1);
    assert_eq!(
        b.iter()
            .filter(|k| **k == (ip([198, 51, 100, 2]), 40002))
            .count(),
        4
    );
    // No other connection went to both servers (the three that found the
    // table full went to A, and were dealt A again).
    assert!(!a.iter().any(|k| k.1 != 40001 && b.contains(k)));
    assert_eq!(
        out[0],
        input("server_load_balancer", 2)
            .into_iter()
            .chain(input("server_load_balancer", 3))
            .collect::<Frames>()
    );
}

#[test]
fn flowlets_move_only_after_a_gap() {
    let (out, dump) = golden("flowlet_lb");
    // Three flows of eleven packets, each in three flowlets (gaps of 51
    // and 200 ms end one; 50 ms does not): 7, 2 and 2 packets.
    assert_eq!(counters(&dump), (33, 0, 6, 0, 0, sent(&[(2, 20), (3, 13)])));
    let on = |o: &Frames, s: u32| o.iter().filter(|(f, _)| src(f) == s).count();
    let (f1, f2, f3) = (ip([10, 1, 0, 1]), ip([10, 1, 0, 2]), ip([10, 1, 0, 3]));
    assert_eq!(
        [on(&out[0], f1), on(&out[0], f2), on(&out[0], f3)],
        [9, 2, 9]
    );
    assert_eq!(
        [on(&out[1], f1), on(&out[1], f2), on(&out[1], f3)],
        [2, 9, 2]
    );
}

#[test]
fn the_policer_drops_what_exceeds_rate_and_burst() {
    let (out, dump) = golden("traffic_policer");
    // s1: 3 of a burst of 4, 5 of 5 at the rate, 3 of 6 too fast, 3 of 4
    // after a second's rest; s2: all 20.
    assert_eq!(counters(&dump), (39, 5, 1, 0, 0, sent(&[(2, 34)])));
    let s1 = ip([10, 0, 0, 1]);
    assert_eq!(out[0].iter().filter(|(f, _)| src(f) == s1).count(), 14);
}

#[test]
fn a_syn_flooder_is_blocked_for_five_seconds() {
    let (out, dump) = golden("syn_flood");
    // The attacker's 6th, 7th and 8th SYNs and its four packets while
    // blocked are dropped; the busy client's 5 SYNs a window pass.
    assert_eq!(counters(&dump), (54, 7, 5, 0, 0, sent(&[(1, 10), (2, 37)])));
    let attacker = ip([198, 51, 100, 66]);
    let passed: Vec<u64> = out[1]
        .iter()
        .filter(|(f, _)| src(f) == attacker)
        .map(|(_, t)| (t / 1000 - 1_700_000_000_000_000) / 100_000)
        .collect();
    // At 0, 100, ..., 400 ms, then at 5.6 s and 5.7 s.
    assert_eq!(passed, [0, 1, 2, 3, 4, 56, 57]);
    assert_eq!(out[0], input("syn_flood", 2));
}

#[test]
fn optimistic_acks_are_caught() {
    let (out, dump) = golden("tcp_optimistic_ack");
    // The optimistic client's ACKs from its second on, and the third
    // client's ACK two past the last byte, are dropped; servers' data all
    // passes; 31 s later the connection is new.
    assert_eq!(counters(&dump), (46, 4, 1, 0, 0, sent(&[(1, 20), (2, 22)])));
    let mut want = input("tcp_optimistic_ack", 1);
    let c2 = ip([198, 51, 100, 2]);
    let cut = 1_700_000_010_000_000_000u64; // ns: before the 31 s reconnection
    let dropped: Vec<usize> = want
        .iter()
        .enumerate()
        .filter(|(_, (f, t))| src(f) == c2 && *t < cut && be32(f, 42) >= 8_001)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(dropped.len(), 3);
    for i in dropped.into_iter().rev() {
        want.remove(i);
    }
    want.retain(|(f, _)| be32(f, 42) != 13_003);
    assert_eq!(out[1], want);
    assert_eq!(out[0], input("tcp_optimistic_ack", 2));
}

#[test]
fn super_spreaders_are_dropped_for_their_window() {
    let (out, dump) = golden("super_spreader");
    assert_eq!(counters(&dump), (57, 6, 8, 0, 0, sent(&[(2, 51)])));
    let scanner = ip([10, 0, 0, 66]);
    let dsts: Vec<u8> = out[0]
        .iter()
        .filter(|(f, _)| src(f) == scanner)
        .map(|(f, _)| f[33])
        .collect();
    // Four destinations twice each, then after the window the first (not
    // new) and four new ones; the sixth is over the limit again.
    assert_eq!(dsts, [1, 1, 2, 2, 3, 3, 4, 4, 1, 2, 3, 4, 5]);
}

#[test]
fn dynamic_nat_lends_its_pool_and_translates_back() {
    let (out, dump) = golden("dynamic_nat");
    assert_eq!(counters(&dump), (32, 5, 1, 0, 0, sent(&[(1, 5), (2, 22)])));
    assert_eq!(dump["globals"]["refused"], 3);
    // Outgoing frames leave from a pool address, replies reach inside
    // hosts, checksums kept right.
    let pool = |a: u32| model::NAT_POOL.contains(&(a as u64));
    assert!(out[1]
        .iter()
        .all(|(f, _)| pool(src(f)) && checksums_hold(f)));
    assert!(out[0].iter().all(|(f, _)| checksums_hold(f)));
    let mapping: Vec<(u32, u32)> = input("dynamic_nat", 1)
        .iter()
        .zip(&out[1])
        .map(|((a, _), (b, _))| (src(a), src(b)))
        .take(3)
        .collect();
    let h = |n| ip([10, 0, 0, n]);
    let p = |n| ip([203, 0, 113, n]);
    assert_eq!(mapping, [(h(1), p(1)), (h(2), p(2)), (h(3), p(3))]);
    let back: Vec<u32> = out[0].iter().map(|(f, _)| dst(f)).collect();
    assert_eq!(back, [h(1), h(2), h(3), h(4), h(5)]);
    // Host 4 left as 203.0.113.1 once host 1 let it go.
    assert!(out[1]
        .iter()
        .any(|(f, _)| sport(f) == 1003 && src(f) == p(1)));
}

#[test]
fn the_connection_tracker_passes_only_tracked_segments() {
    let (out, dump) = golden("tcp_conntrack");
    assert_eq!(
        counters(&dump),
        (60, 13, 1, 0, 0, sent(&[(1, 20), (2, 27)]))
    );
    let states: Vec<&str> = dump["stages"]["teardown"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["done", "reset", "reset", "done", "reset", "reset"]);
    // Dropped: A's segment out of its window and the one after the close;
    // B's segment after the refusal and its SYN-ACK with a wrong ACK;
    // C's segment after the RST; D's after 31 s idle; the three strays;
    // E's ACK after the RST; F's segment after the close; G's and H's
    // after their RSTs.
    let everything: Frames = input("tcp_conntrack", 1)
        .into_iter()
        .chain(input("tcp_conntrack", 2))
        .collect();
    let passed: Vec<&(Vec<u8>, u64)> = out[0].iter().chain(&out[1]).collect();
    let mut dropped: Vec<(u16, u16, u32)> = everything
        .iter()
        .filter(|f| !passed.contains(f))
        .map(|(f, _)| {
            let seq = if f[23] == 6 { be32(f, 38) } else { 0 };
            (sport(f), u16::from_be_bytes([f[36], f[37]]), seq)
        })
        .collect();
    dropped.sort();
    assert_eq!(
        dropped,
        [
            (80, 40001, 52002),
            (80, 40001, 250000),
            (80, 40002, 1),
            (80, 40002, 90000),
            (80, 40005, 50002),
            (80, 40007, 50001),
            (80, 40008, 50001),
            (80, 40009, 1),
            (5353, 53, 0),
            (40003, 80, 1001),
            (40004, 80, 1011),
            (40006, 80, 1002),
            (40010, 80, 1),
        ]
    );
}

#[test]
fn the_earlier_examples_over_captures() {
    let (out, dump) = golden("port_knocking");
    // Host 1 knocks right: its two SSH packets pass, port 80 does not, and
    // 14 s later it is closed again; the others never open.
    assert_eq!(counters(&dump), (15, 12, 2, 0, 0, sent(&[(1, 1), (2, 2)])));
    assert!(out[1].iter().all(|(f, _)| src(f) == ip([198, 51, 100, 1])));
    let (_, dump) = golden("udp_firewall");
    assert_eq!(counters(&dump), (7, 2, 1, 0, 0, sent(&[(1, 2), (2, 3)])));
    let (out, dump) = golden("big_flows");
    assert_eq!(counters(&dump), (13, 0, 1, 0, 0, sent(&[(1, 10), (2, 3)])));
    assert!(out[1].iter().all(|(f, _)| f.len() == 1000));
}

/// Every use case written in Flick's machine syntax (`NAME.flick`) sends
/// the same frames as its XL program and leaves the same state, with one
/// worker and with two.
#[test]
fn the_flick_machines_match_the_xl_programs() {
    for uc in USE_CASES {
        let dir = Scratch::new(&format!("flick-{}", uc.name));
        let xl = run(&dir, &examples().join(format!("{}.xl", uc.name)), uc, 1);
        for workers in [1, 2] {
            let flick = run(
                &dir,
                &examples().join(format!("{}.flick", uc.name)),
                uc,
                workers,
            );
            assert!(
                flick.captures == xl.captures,
                "{}.flick with {workers} workers sent other frames than {}.xl",
                uc.name,
                uc.name
            );
            assert_eq!(
                flick.dump, xl.dump,
                "{}.flick with {workers} workers left other state than {}.xl",
                uc.name, uc.name
            );
        }
    }
}

// Property tests: the engine against the models, frame by frame.

#[allow(clippy::too_many_arguments)]
fn tcp(
    src: u32,
    sport: u16,
    dst: u32,
    dport: u16,
    flags: u8,
    seq: u32,
    ack: u32,
    payload: usize,
) -> Vec<u8> {
    ipv4_frame(6, (src, sport), (dst, dport), (flags, seq, ack), payload)
}

fn udp(src: u32, sport: u16, dst: u32, dport: u16, payload: usize) -> Vec<u8> {
    ipv4_frame(17, (src, sport), (dst, dport), (0, 0, 0), payload)
}

/// One program's engine and field reader.
struct Machine {
    program: Arc<Program>,
    reader: FieldReader,
    engine: Engine,
    fields: Vec<u64>,
}

impl Machine {
    fn new(machine: flick_machine::Machine) -> Machine {
        let program = Arc::new(Program::new(machine).unwrap());
        Machine {
            reader: FieldReader::new(&program.machine.fields).unwrap(),
            engine: Engine::new(program.clone()),
            fields: vec![0; program.machine.fields.len()],
            program,
        }
    }

    /// The verdict on `frame`, in the models' terms.
    fn verdict(&mut self, frame: &[u8], port: u8, now_us: u64) -> Verdict {
        assert!(self.reader.read(frame, &mut self.fields));
        let got = self
            .engine
            .process(&self.fields, port, frame.len(), now_us * 1000);
        let name = |id: u16| {
            let name = self.program.machine.fields[id as usize].name.as_str();
            ["eth.dst", "ipv4.src", "ipv4.dst"]
                .into_iter()
                .find(|n| *n == name)
                .unwrap_or("?")
        };
        Verdict {
            ports: got.ports,
            writes: got.writes().iter().map(|&(id, v)| (name(id), v)).collect(),
        }
    }
}

/// Runs `steps` (input port, frame, microseconds since the step before)
/// through the engines of the use case's XL program and of its `.flick`
/// machine, and through `model`, and asserts each frame's verdicts agree.
fn agree(
    name: &str,
    steps: Vec<(u8, Vec<u8>, u64)>,
    mut model: impl FnMut(&Pkt, u8, u64) -> Verdict,
) -> Result<(), TestCaseError> {
    let mut xl =
        Machine::new(flick_machine::xl::load(&examples().join(format!("{name}.xl"))).unwrap());
    let text = std::fs::read_to_string(examples().join(format!("{name}.flick"))).unwrap();
    let mut flick = Machine::new(flick_machine::lang::compile(&text).unwrap().machine);
    // Packet time starts past 0, as captures' times do.
    let mut now_us = 1_000_000u64;
    for (i, (port, f, gap)) in steps.into_iter().enumerate() {
        now_us += gap;
        let want = model(&Pkt::parse(&f), port, now_us);
        let got = xl.verdict(&f, port, now_us);
        prop_assert_eq!(
            &got,
            &want,
            "{}.xl: frame {} at {} us from port {}",
            name,
            i,
            now_us,
            port
        );
        let got = flick.verdict(&f, port, now_us);
        prop_assert_eq!(
            &got,
            &want,
            "{}.flick: frame {} at {} us from port {}",
            name,
            i,
            now_us,
            port
        );
    }
    Ok(())
}

const VIP: u32 = 0x0a00_0064; // 10.0.0.100

fn lb_step() -> impl Strategy<Value = (u8, Vec<u8>, u64)> {
    // Mostly close together, so that more than 16 connections live at
    // once (the table is full); sometimes a pause, so that they expire.
    let gap = prop_oneof![9 => 0u64..300_000, 1 => 5_000_000u64..12_000_000];
    (0u32..20, 0u16..2, 0u8..4, gap).prop_map(|(c, s, from, gap)| {
        let client = 0xc633_6400 + c;
        let port = if from == 3 { 1 } else { from + 1 };
        let f = if port == 1 {
            tcp(client, 40000 + s, VIP, 80, 0x18, 1, 0, 10)
        } else {
            tcp(VIP, 80, client, 40000 + s, 0x18, 1, 0, 10)
        };
        (port, f, gap)
    })
}

fn flowlet_step() -> impl Strategy<Value = (u8, Vec<u8>, u64)> {
    (0u32..4, 0u64..80, 0usize..100).prop_map(|(flow, gap_ms, n)| {
        let f = if flow == 3 {
            udp(0x0a01_0003, 5003, 0x0a02_0002, 53, n)
        } else {
            tcp(
                0x0a01_0000 + flow,
                5000 + flow as u16,
                0x0a02_0001,
                80,
                0x18,
                1,
                0,
                n,
            )
        };
        (1, f, gap_ms * 1000)
    })
}

fn policer_step() -> impl Strategy<Value = (u8, Vec<u8>, u64)> {
    (
        0u32..3,
        0usize..1400,
        prop_oneof![4 => 0u64..15_000, 1 => 900_000u64..1_200_000],
    )
        .prop_map(|(s, n, gap)| (1, udp(0x0a00_0001 + s, 7000, 0x0a09_0001, 7001, n), gap))
}

const FLAGS: [u8; 7] = [0x02, 0x12, 0x10, 0x18, 0x11, 0x04, 0x14];

fn syn_flood_step() -> impl Strategy<Value = (u8, Vec<u8>, u64)> {
    (
        0u32..3,
        any::<bool>(),
        0usize..4,
        prop_oneof![9 => 0u64..100, 1 => 1000u64..6000],
    )
        .prop_map(|(s, inside, fl, gap_ms)| {
            let (host, server) = (0xc633_6400 + s, 0x0a00_0050);
            let flags = if inside {
                0x12
            } else {
                FLAGS[[0, 0, 2, 3][fl]]
            };
            let f = if inside {
                tcp(server, 80, host, 30000, flags, 1, 0, 0)
            } else {
                tcp(host, 30000, server, 80, flags, 1, 0, 0)
            };
            (if inside { 2 } else { 1 }, f, gap_ms * 1000)
        })
}

/// Sequence numbers, payloads and ACKs from small sets, so that ACKs land
/// on, just under and just over the highest byte sent.
fn optimistic_step() -> impl Strategy<Value = (u8, Vec<u8>, u64)> {
    (
        0u16..3,
        any::<bool>(),
        0usize..2,
        0usize..2,
        0usize..11,
        prop_oneof![9 => 0u64..3000, 1 => 29_000u64..32_000],
    )
        .prop_map(|(c, server, s, n, a, gap_ms)| {
            let (client, srv) = (0xc633_6401, 0x0a00_0050);
            let f = if server {
                tcp(
                    srv,
                    80,
                    client,
                    40000 + c,
                    0x18,
                    [1000, 2000][s],
                    1,
                    [0, 100][n],
                )
            } else {
                let ack = [
                    0, 1000, 1001, 1002, 1100, 1101, 1102, 2001, 2002, 2101, 2102,
                ][a];
                tcp(client, 40000 + c, srv, 80, 0x10, 1, ack, 0)
            };
            (if server { 2 } else { 1 }, f, gap_ms * 1000)
        })
}

fn spreader_step() -> impl Strategy<Value = (u8, Vec<u8>, u64)> {
    (0u32..3, 0u32..8, 0u64..3000).prop_map(|(s, d, gap_ms)| {
        (
            1,
            udp(0x0a00_0000 + s, 9999, 0x0a01_0000 + d, 80, 4),
            gap_ms * 1000,
        )
    })
}

fn nat_step() -> impl Strategy<Value = (u8, Vec<u8>, u64)> {
    (0u32..5, any::<bool>(), 0u32..4, 0u64..3000).prop_map(|(h, inside, p, gap_ms)| {
        let (host, web) = (0x0a00_0001 + h, 0xc000_0250);
        let f = if inside {
            tcp(host, 1000 + h as u16, web, 80, 0x18, 1, 0, 8)
        } else {
            tcp(web, 80, 0xcb00_7101 + p, 1000, 0x18, 1, 0, 8)
        };
        (if inside { 1 } else { 2 }, f, gap_ms * 1000)
    })
}

/// Segments of two connections with sequence and acknowledgement numbers
/// from small sets, and now and then a whole handshake, so that
/// connections open, segments fall in and out of their windows, and
/// teardowns run.
fn conntrack_step() -> impl Strategy<Value = Vec<(u8, Vec<u8>, u64)>> {
    (
        0u16..2,
        0u8..8,
        0usize..7,
        0usize..4,
        0usize..4,
        prop_oneof![19 => 0u64..2000, 1 => 29_000u64..32_000],
    )
        .prop_map(|(c, how, fl, s, a, gap_ms)| {
            let (h, w, sport) = (0x0a00_0005, 0xc000_0250, 40000 + c);
            let gap = gap_ms * 1000;
            match how {
                0 => vec![
                    (1, tcp(h, sport, w, 80, 0x02, 100, 0, 0), gap),
                    (2, tcp(w, 80, h, sport, 0x12, 900, 101, 0), 1000),
                    (1, tcp(h, sport, w, 80, 0x10, 101, 901, 0), 1000),
                ],
                1..=3 => {
                    let seq = [900, 901, 7000, 300_000][s];
                    let ack = [101, 102, 5, 90][a];
                    vec![(2, tcp(w, 80, h, sport, FLAGS[fl], seq, ack, 0), gap)]
                }
                _ => {
                    let seq = [100, 101, 5000, 200_000][s];
                    let ack = [901, 902, 5, 90][a];
                    vec![(1, tcp(h, sport, w, 80, FLAGS[fl], seq, ack, 0), gap)]
                }
            }
        })
}

/// Single packets, and now and then a source's whole knock sequence.
fn knocking_step() -> impl Strategy<Value = Vec<(u8, Vec<u8>, u64)>> {
    (
        0u32..3,
        0u8..6,
        0usize..6,
        prop_oneof![9 => 0u64..3000, 1 => 9_000u64..12_000],
    )
        .prop_map(|(s, how, d, gap_ms)| {
            let (host, server) = (0xc633_6401 + s, 0x0a00_0016);
            let knock = |dport| tcp(host, 40000, server, dport, 0x02, 1, 0, 0);
            let gap = gap_ms * 1000;
            match how {
                0 => vec![
                    (1, knock(1111), gap),
                    (1, knock(2222), 1000),
                    (1, knock(3333), 1000),
                ],
                1 => vec![(2, tcp(server, 22, host, 40000, 0x12, 1, 0, 0), gap)],
                _ => vec![(1, knock([1111, 2222, 3333, 22, 22, 80][d]), gap)],
            }
        })
}

/// Datagrams both ways between two hosts and two servers, and TCP from
/// inside (which opens nothing).
fn firewall_step() -> impl Strategy<Value = (u8, Vec<u8>, u64)> {
    (
        0u32..2,
        0u16..2,
        0u32..2,
        0u8..5,
        prop_oneof![9 => 0u64..5000, 1 => 25_000u64..35_000],
    )
        .prop_map(|(h, sp, d, how, gap_ms)| {
            let (host, server) = (0x0a00_0001 + h, 0x0808_0808 + d);
            let (port, f) = match how {
                0 => (1, tcp(host, 5000 + sp, server, 53, 0x02, 1, 0, 0)),
                1 | 2 => (1, udp(host, 5000 + sp, server, 53, 12)),
                _ => (2, udp(server, 53, host, 5000 + sp, 12)),
            };
            (port, f, gap_ms * 1000)
        })
}

/// Frames of 1000 and 500 bytes, so that a window's bytes often reach the
/// threshold exactly.
fn big_flows_step() -> impl Strategy<Value = (u8, Vec<u8>, u64)> {
    (0u32..3, 0usize..2, 0u64..400).prop_map(|(d, n, gap_ms)| {
        let f = udp(0x0a00_0001, 1, 0x0a00_0002 + d, 2, [958, 458][n]);
        (1, f, gap_ms * 1000)
    })
}

/// Steps of a strategy that yields a few at a time, one after another.
fn flat(
    steps: impl Strategy<Value = Vec<Vec<(u8, Vec<u8>, u64)>>>,
) -> impl Strategy<Value = Vec<(u8, Vec<u8>, u64)>> {
    steps.prop_map(|s| s.into_iter().flatten().collect())
}

/// A property test per use case: `steps` through [`agree`] with a fresh
/// model of the use case.
macro_rules! matches_its_model {
    ($($test:ident: $name:literal, $model:ident, $steps:expr;)*) => {
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(48))]
            $(
                #[test]
                fn $test(steps in $steps) {
                    let mut m = model::$model::default();
                    agree($name, steps, |p, port, now| m.packet(p, port, now))?;
                }
            )*
        }
    };
}

matches_its_model! {
    server_load_balancer_matches_its_model:
        "server_load_balancer", ServerLoadBalancer, vec(lb_step(), 1..120);
    flowlet_lb_matches_its_model: "flowlet_lb", FlowletLb, vec(flowlet_step(), 1..100);
    traffic_policer_matches_its_model:
        "traffic_policer", TrafficPolicer, vec(policer_step(), 1..100);
    syn_flood_matches_its_model: "syn_flood", SynFlood, vec(syn_flood_step(), 1..120);
    tcp_optimistic_ack_matches_its_model:
        "tcp_optimistic_ack", TcpOptimisticAck, vec(optimistic_step(), 1..100);
    super_spreader_matches_its_model:
        "super_spreader", SuperSpreader, vec(spreader_step(), 1..120);
    dynamic_nat_matches_its_model: "dynamic_nat", DynamicNat, vec(nat_step(), 1..120);
    tcp_conntrack_matches_its_model:
        "tcp_conntrack", TcpConntrack, flat(vec(conntrack_step(), 1..150));
    port_knocking_matches_its_model:
        "port_knocking", PortKnocking, flat(vec(knocking_step(), 1..120));
    big_flows_matches_its_model: "big_flows", BigFlows, vec(big_flows_step(), 1..120);
    udp_firewall_matches_its_model: "udp_firewall", UdpFirewall, vec(firewall_step(), 1..120);
}
