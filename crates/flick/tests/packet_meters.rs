//! The meter and Bloom filter examples (`examples/packets/policer.flick`,
//! `examples/packets/new_flows.flick`) on the captures
//! `scripts/gen_meters.py` writes:
//!
//! - the captures in the repository are what the script writes;
//! - the expected outputs (`testdata/expected/policer.*`,
//!   `new_flows.*`) are what the plain Rust models of
//!   `flick_testkit::meter_model` give, and `flick run` gives exactly
//!   them, with one worker and with two;
//! - on random traffic with random gaps (proptest), `flick run` agrees
//!   with the models: the policer with any number of workers, and a Bloom
//!   filter small enough to give false positives with one;
//! - `flick check` refuses a meter or filter without its parameters.
//!
//! `UPDATE_GOLDEN=1 cargo test -p flick --test packet_meters` rewrites
//! the expected files from the models (then read the diff).

use flick_testkit::meter_model::{
    encoded_string_key, Bucket, Buckets, Colour, NewFlows, Policer, POLICER,
};
use flick_testkit::packet_model::{dump_key, fix_checksums, parse, Key};
use proptest::prelude::*;
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};
use std::process::Command;
use support::{assert_globals, golden_file, run_for_globals, script_writes, Scratch, ROOT};

mod support;

fn testdata(name: &str) -> PathBuf {
    Path::new(ROOT).join("examples/packets/testdata").join(name)
}

fn example(name: &str) -> PathBuf {
    Path::new(ROOT).join("examples/packets").join(name)
}

type Frames = Vec<(Vec<u8>, u64)>;

fn frames_of(path: &Path) -> Frames {
    flick_packet_io::read_pcap(path).unwrap()
}

/// What the models say for a capture.
struct Expected {
    policer: Json,
    passed: Frames,
    new_flows: Json,
    new: Frames,
}

fn models(frames: &Frames) -> Expected {
    let mut policer = Policer::new(POLICER);
    let mut passed = Vec::new();
    let mut flows = NewFlows::new(65536, 3);
    let mut new = Vec::new();
    for (f, ts) in frames {
        if let Some(out) = policer.frame(f, *ts) {
            passed.push((out, *ts));
        }
        if flows.frame(f) {
            new.push((f.clone(), *ts));
        }
    }
    let buckets: std::collections::BTreeMap<String, Json> = policer
        .tokens()
        .map(|(k, (c, e))| (dump_key(&k.packed()), json!({"committed": c, "excess": e})))
        .collect();
    Expected {
        policer: json!({ "buckets": buckets, "red": policer.red }),
        passed,
        new_flows: json!({
            "seen": { "bits": flows.seen.bits(), "hashes": 3, "set": flows.seen.set() }
        }),
        new,
    }
}

/// `have` is `want`, or a failure naming the first frame that differs.
fn same_frames(have: &Frames, want: &Frames, what: &str) {
    if have == want {
        return;
    }
    let at = have.iter().zip(want).position(|(a, b)| a != b);
    let show = |fs: &Frames, i: Option<usize>| {
        i.and_then(|i| fs.get(i))
            .map(|(f, ts)| format!("{} bytes at {ts}: {:02x?}", f.len(), &f[..f.len().min(40)]))
    };
    panic!(
        "{what}: {} frames, {} expected; first difference at {at:?}: {:?} instead of {:?}",
        have.len(),
        want.len(),
        show(have, at),
        show(want, at)
    );
}

/// Runs both examples on `input` with `workers` and checks every output
/// against `expected`.
fn run_examples(input: &Path, workers: usize, expected: &Expected, scratch: &Scratch) {
    let all = frames_of(input);
    let input = input.display();
    let passed = scratch.path("passed.pcap");
    let ports = [
        format!("wire=pcap:{input}"),
        format!("out=pcap-out:{}", passed.display()),
    ];
    let policer = example("policer.flick");
    assert_globals(scratch, &policer, &ports, workers, &expected.policer);
    same_frames(
        &frames_of(&passed),
        &expected.passed,
        &format!("policer's passed frames, {workers} workers"),
    );

    let (new, out) = (scratch.path("new.pcap"), scratch.path("out.pcap"));
    let ports = [
        format!("wire=pcap:{input}"),
        format!("new=pcap-out:{}", new.display()),
        format!("out=pcap-out:{}", out.display()),
    ];
    let flows = example("new_flows.flick");
    assert_globals(scratch, &flows, &ports, workers, &expected.new_flows);
    assert!(
        frames_of(&new) == expected.new,
        "new_flows' new frames, {workers} workers"
    );
    assert!(frames_of(&out) == all, "new_flows sends every frame to out");
}

#[test]
fn captures_are_what_the_generator_writes() {
    let names = ["policer.pcap", "new_flows.pcap"].map(String::from);
    script_writes("scripts/gen_meters.py", &testdata(""), &names);
}

fn expected_path(what: &str) -> PathBuf {
    testdata(&format!("expected/{what}"))
}

/// The expected files, from the models: each capture runs through both
/// examples, but the files keep each example's own capture.
fn golden_files() -> Vec<(&'static str, Vec<u8>)> {
    let policer = models(&frames_of(&testdata("policer.pcap")));
    let flows = models(&frames_of(&testdata("new_flows.pcap")));
    let scratch = Scratch::new("golden");
    let pcap = |name: &str, frames: &Frames| {
        let p = scratch.path(name);
        flick_packet_io::write_pcap(&p, frames).unwrap();
        std::fs::read(&p).unwrap()
    };
    vec![
        (
            "policer.policer.json",
            serde_json::to_vec_pretty(&policer.policer).unwrap(),
        ),
        ("policer.policer.pcap", pcap("a.pcap", &policer.passed)),
        (
            "new_flows.new_flows.json",
            serde_json::to_vec_pretty(&flows.new_flows).unwrap(),
        ),
        ("new_flows.new_flows.pcap", pcap("b.pcap", &flows.new)),
    ]
}

#[test]
fn expected_files_are_what_the_models_give() {
    for (what, bytes) in golden_files() {
        let path = expected_path(what);
        let have = golden_file(&path, &bytes, "UPDATE_GOLDEN");
        assert!(
            have == bytes,
            "{} is not what the model gives",
            path.display()
        );
    }
}

fn read_json(what: &str) -> Json {
    serde_json::from_slice(&std::fs::read(expected_path(what)).unwrap()).unwrap()
}

#[test]
fn flick_gives_the_expected_outputs() {
    // Each capture through both examples; the expected files hold each
    // example on its own capture, the models the rest.
    for capture in ["policer", "new_flows"] {
        let input = testdata(&format!("{capture}.pcap"));
        let mut expected = models(&frames_of(&input));
        if capture == "policer" {
            expected.policer = read_json("policer.policer.json");
            expected.passed = frames_of(&expected_path("policer.policer.pcap"));
        } else {
            expected.new_flows = read_json("new_flows.new_flows.json");
            expected.new = frames_of(&expected_path("new_flows.new_flows.pcap"));
        }
        for workers in [1, 2] {
            let scratch = Scratch::new(capture);
            run_examples(&input, workers, &expected, &scratch);
        }
    }
}

/// The policer's capture: each kind of source is metered as the example
/// says (a sanity check of the model, which the files come from).
#[test]
fn the_policer_passes_sources_under_the_rate_and_polices_the_rest() {
    let frames = frames_of(&testdata("policer.pcap"));
    let passed = frames_of(&expected_path("policer.policer.pcap"));
    // IPv4 frames from 10.0.3.`last`, and those of them demoted to CS1.
    let count = |fs: &Frames, last: u8| {
        let from: Vec<&Vec<u8>> = fs
            .iter()
            .map(|(f, _)| f)
            .filter(|f| {
                let h = parse(f);
                h.ip == 4 && h.src[3] == last
            })
            .collect();
        let yellow = from.iter().filter(|f| f[15] >> 2 == 8).count();
        (from.len(), yellow)
    };
    // Under the rate: all of them, green.
    assert_eq!(count(&passed, 1), (count(&frames, 1).0, 0));
    // 1000-byte frames at twice the rate for 1 s: the committed burst and
    // the rate's worth green (3 frames and 125 a second), then the excess
    // burst (6 frames) yellow, once: E refills only while C is full.
    let (over, yellow) = count(&passed, 2);
    assert_eq!(yellow, 6);
    assert!((131..=135).contains(&over), "{over}");
    // Two bursts of 8, half a second apart (time to refill both buckets):
    // 2 green and 4 yellow each.
    assert_eq!(count(&passed, 3), (12, 8));
    let red = read_json("policer.policer.json")["red"].as_u64().unwrap();
    assert_eq!(red as usize, frames.len() - passed.len());
}

/// A lone meter in a program without `steer`: every frame runs on one
/// worker, so one bucket meters all the traffic, whatever `--workers`.
#[test]
fn a_lone_meter_without_steer_meters_all_traffic() {
    let scratch = Scratch::new("lone");
    let program = scratch.path("lone.flick");
    std::fs::write(
        &program,
        "grammar packet

proc limit: (packet/- wire, -/packet out)
  global m: meter {rate=250000, burst=5000} := new_meter
  | wire => pass(m, out)

fun pass: (m: ref meter, -/packet out, p: packet) -> ()
  if meter(m, frame_len(p)) = 0:
    p => out
",
    )
    .unwrap();
    let input = testdata("policer.pcap");
    let frames = frames_of(&input);
    let bucket = Bucket {
        rate: 250_000,
        burst: 5000,
        excess: 0,
    };
    let (mut state, mut now) = (Buckets::default(), 0);
    let mut expected = Vec::new();
    for (f, ts) in &frames {
        now = now.max(*ts);
        let (colour, next) = bucket.take(state, now, f.len() as u64);
        state = next;
        if colour == Colour::Green {
            expected.push((f.clone(), *ts));
        }
    }
    assert!(!expected.is_empty() && expected.len() < frames.len() * 2 / 3);
    for workers in [1, 2] {
        let out = scratch.path(&format!("out{workers}.pcap"));
        let dump = run_for_globals(
            &program,
            &[
                format!("wire=pcap:{}", input.display()),
                format!("out=pcap-out:{}", out.display()),
            ],
            &scratch.path("dump.json"),
            workers,
        );
        assert!(frames_of(&out) == expected, "{workers} workers");
        assert_eq!(dump["m"], json!(bucket.tokens(state, now).0));
    }
}

#[test]
fn a_meter_or_filter_without_its_parameters_is_refused() {
    let scratch = Scratch::new("check");
    let program = scratch.path("bad.flick");
    // `flick check` of a program with a meter of only a rate, and `extra`
    // globals beside it: refused, with what it printed.
    let refused = |extra: &str| -> String {
        let source = format!(
            "grammar packet

proc p: (packet/- wire)
  global m: meter {{rate=1000}} := new_meter
{extra}  | wire => f(m)

fun f: (m: ref meter, p: packet) -> ()
  meter(m, frame_len(p))
"
        );
        std::fs::write(&program, source).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_flick"))
            .arg("check")
            .arg(&program)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout)
    };
    let text = refused("  global b: bloom {bits=65536, hashes=40} := new_bloom\n");
    assert!(text.contains("E0503"), "{text}");
    assert!(
        text.contains("`hashes` of a bloom is from 1 to 16"),
        "{text}"
    );
    // Missing parameters are reported once the rest checks.
    let text = refused("");
    assert!(text.contains("E0509"), "{text}");
    assert!(text.contains("`m` needs `burst`"), "{text}");
}

/// One frame of random traffic: a kind, a source, a size, and the gap
/// before it.
#[derive(Debug, Clone)]
struct Frame {
    kind: u8,
    src: u8,
    port: u16,
    len: usize,
    gap_us: u64,
}

fn frame() -> impl Strategy<Value = Frame> {
    (0u8..10, 0u8..4, 0u16..4, 60usize..1500, 0u64..20_000).prop_map(
        |(kind, src, port, len, gap_us)| Frame {
            kind,
            src,
            port,
            len,
            gap_us,
        },
    )
}

fn bytes_of(f: &Frame) -> Vec<u8> {
    let mac = [2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    let mut b = mac.to_vec();
    match f.kind {
        // ARP: not IP.
        0 => {
            b.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
            b.resize(42, 0);
        }
        // IPv6 UDP.
        1 => {
            b.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            let payload = f.len.max(62) - 54;
            b.extend_from_slice(&(payload as u16).to_be_bytes());
            b.extend_from_slice(&[17, 64]);
            for a in [f.src, 0xff] {
                b.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, a]);
            }
            b.extend_from_slice(&(4000 + f.port).to_be_bytes());
            b.extend_from_slice(&53u16.to_be_bytes());
            b.extend_from_slice(&(payload as u16).to_be_bytes());
            b.extend_from_slice(&[0, 0]);
            b.resize(f.len.max(62), 0xab);
        }
        // IPv4 UDP, or TCP.
        k => {
            let proto = if k % 2 == 0 { 17 } else { 6 };
            let len = f.len.max(64);
            b.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
            b.extend_from_slice(&((len - 14) as u16).to_be_bytes());
            b.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
            b.extend_from_slice(&[10, 0, 0, f.src, 10, 9, 9, 9]);
            b.extend_from_slice(&(4000 + f.port).to_be_bytes());
            b.extend_from_slice(&80u16.to_be_bytes());
            if proto == 17 {
                b.extend_from_slice(&((len - 34) as u16).to_be_bytes());
                b.extend_from_slice(&[0, 0]);
            } else {
                b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
            }
            b.resize(len, 0xcd);
        }
    }
    // Right checksums, so that an edit adjusting them incrementally and
    // the model recomputing them agree.
    fix_checksums(&mut b);
    b
}

fn timed(traffic: &[Frame]) -> Frames {
    let mut ts = 1_700_000_000_000_000_000u64;
    traffic
        .iter()
        .map(|f| {
            ts += f.gap_us * 1000;
            (bytes_of(f), ts)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn flick_agrees_with_the_models(traffic in prop::collection::vec(frame(), 1..150), workers in 1usize..3) {
        let frames = timed(&traffic);
        let scratch = Scratch::new("prop");
        let input = scratch.path("input.pcap");
        flick_packet_io::write_pcap(&input, &frames).unwrap();
        run_examples(&input, workers, &models(&frames), &scratch);
    }

    /// A filter of 128 bits and 2 hashes fills fast: false positives (new
    /// flows taken for seen ones) must be the model's, bit for bit.
    #[test]
    fn a_small_bloom_filter_errs_as_the_model_does(traffic in prop::collection::vec(frame(), 1..150)) {
        let frames = timed(&traffic);
        let scratch = Scratch::new("bloom");
        let input = scratch.path("input.pcap");
        flick_packet_io::write_pcap(&input, &frames).unwrap();
        let program = scratch.path("small.flick");
        let text = std::fs::read_to_string(example("new_flows.flick"))
            .unwrap()
            .replace("{bits=65536, hashes=3}", "{bits=128, hashes=2}");
        std::fs::write(&program, text).unwrap();
        let mut model = NewFlows::new(128, 2);
        let expected: Frames = frames.iter().filter(|(f, _)| model.frame(f)).cloned().collect();
        let new = scratch.path("new.pcap");
        let dump = run_for_globals(
            &program,
            &[
                format!("wire=pcap:{}", input.display()),
                format!("new=pcap-out:{}", new.display()),
                format!("out=pcap-out:{}", scratch.path("out.pcap").display()),
            ],
            &scratch.path("dump.json"),
            1,
        );
        prop_assert!(frames_of(&new) == expected);
        prop_assert_eq!(&dump["seen"]["set"], &json!(model.seen.set()));
        // The model's flows, for the record: how many distinct ones there were.
        let distinct: std::collections::HashSet<Vec<u8>> = frames
            .iter()
            .map(|(f, _)| parse(f))
            .filter(|h| h.ip != 0)
            .map(|h| encoded_string_key(&Key::five(&h).packed()))
            .collect();
        prop_assert!(expected.len() <= distinct.len());
    }
}
