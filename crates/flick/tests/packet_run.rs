//! `flick run --port`: a packet program over pcap files, end to end. The
//! output captures and the state dump are the same bytes whatever the
//! number of workers; bad bindings fail with messages that name them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const GRAMMAR: &str = "grammar flows;
%byteorder = big;
type pkt = unit {
    flow : uint16;
    kind : uint8;
    seq  : uint32;
};
";

/// Steered by a string flow key; kinds 0 and 1 go to the array's two
/// ports, others are dropped; each flow's last sequence number is kept.
const PROGRAM: &str = "grammar flows

type pkt: record
  flow : integer
  kind : integer
  seq : integer

proc split: (pkt/pkt inside, [pkt/pkt] outs)
  global last := empty_dict
  global frames := 0
  | inside => route(last, frames, outs)

fun steer: (p: pkt) -> (string)
  to_string(p.flow)

fun route: (last: ref dict<integer*integer>, frames: ref integer, [-/pkt] outs, p: pkt) -> ()
  frames := frames + 1
  last[p.flow] := p.seq
  if p.kind < 2:
    p => outs[p.kind]
";

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flick-packet-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("flows.grammar"), GRAMMAR).unwrap();
    std::fs::write(d.join("split.flick"), PROGRAM).unwrap();
    d
}

fn frames() -> Vec<(Vec<u8>, u64)> {
    (0..3000u32)
        .map(|i| {
            let mut f = Vec::new();
            f.extend_from_slice(&((i * 7 % 50) as u16).to_be_bytes());
            f.push((i % 3) as u8);
            f.extend_from_slice(&i.to_be_bytes());
            f.extend((0..(i % 60) as u8).map(|b| b ^ 0x5a));
            (f, 1_700_000_000_000_000_000 + i as u64 * 1_000)
        })
        .collect()
}

fn flick(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("flick runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs the program with `workers` workers; the two captures and the dump.
fn run(d: &Path, workers: &str) -> (Vec<u8>, Vec<u8>, String) {
    let o = flick(
        d,
        &[
            "run",
            "split.flick",
            "--port",
            "inside=pcap:in.pcap",
            "--port",
            &format!("outs=pcap-out:a{workers}.pcap,pcap-out:b{workers}.pcap"),
            "--workers",
            workers,
            "--dump",
            &format!("state{workers}.json"),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("3000 frames in"), "{}", stderr(&o));
    (
        std::fs::read(d.join(format!("a{workers}.pcap"))).unwrap(),
        std::fs::read(d.join(format!("b{workers}.pcap"))).unwrap(),
        std::fs::read_to_string(d.join(format!("state{workers}.json"))).unwrap(),
    )
}

#[test]
fn one_or_two_workers_write_the_same_captures_and_dump() {
    let d = dir("workers");
    let input = frames();
    flick_packet_io::write_pcap(&d.join("in.pcap"), &input).unwrap();
    let (a1, b1, dump1) = run(&d, "1");
    let (a2, b2, dump2) = run(&d, "2");
    assert!(a1 == a2, "outs[0] differs between 1 and 2 workers");
    assert!(b1 == b2, "outs[1] differs between 1 and 2 workers");
    assert_eq!(dump1, dump2);
    // What went out: each kind's frames, in input order, timestamps kept.
    let a = flick_packet_io::read_pcap(&d.join("a2.pcap")).unwrap();
    let want: Vec<_> = input.iter().filter(|(f, _)| f[2] == 0).cloned().collect();
    assert_eq!(a, want);
    let b = flick_packet_io::read_pcap(&d.join("b2.pcap")).unwrap();
    assert_eq!(b.len(), 1000);
    let dump: serde_json::Value = serde_json::from_str(&dump2).unwrap();
    assert_eq!(dump["globals"]["frames"], 3000);
    assert_eq!(dump["globals"]["last"].as_object().unwrap().len(), 50);
    assert_eq!(dump["globals"]["last"]["0"], 2950);
    assert_eq!(dump["ports"]["inside"]["rx_frames"], 3000);
    assert_eq!(dump["ports"]["outs[0]"]["tx_frames"], 1000);
    assert_eq!(dump["dropped"], 1000);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn bad_ports_and_unbound_channels_are_refused() {
    let d = dir("errors");
    flick_packet_io::write_pcap(&d.join("in.pcap"), &frames()[..10]).unwrap();
    let cases: [(&[&str], &str); 5] = [
        (&["--port", "inside=bogus:x"], "unknown port kind `bogus`"),
        (
            &["--port", "inside=pcap:in.pcap"],
            "channel `outs` has no port: give it --port outs=SPEC",
        ),
        (
            &[
                "--port",
                "inside=pcap-out:x.pcap",
                "--port",
                "outs=pcap-out:y.pcap",
            ],
            "channel `inside` is read by the program, but port `pcap-out:x.pcap` cannot receive",
        ),
        (
            &[
                "--port",
                "inside=pcap:in.pcap",
                "--port",
                "outs=pcap-out:y.pcap",
                "--listen",
                "inside=127.0.0.1:0",
            ],
            "channel `inside` is bound by both --port and --listen",
        ),
        (
            &[
                "--port",
                "inside=pcap:in.pcap",
                "--port",
                "outs=pcap-out:y.pcap",
                "--port",
                "nothere=pcap:in.pcap",
            ],
            "`nothere` is not a channel of process `split` (its channels: inside, outs)",
        ),
    ];
    for (args, message) in cases {
        let mut all = vec!["run", "split.flick"];
        all.extend_from_slice(args);
        let o = flick(&d, &all);
        assert!(!o.status.success(), "{args:?} was accepted");
        assert!(stderr(&o).contains(message), "{args:?}: {}", stderr(&o));
    }
    let o = flick(
        &d,
        &[
            "run",
            "split.flick",
            "--port",
            "inside=pcap:missing.pcap",
            "--port",
            "outs=pcap-out:y.pcap,pcap-out:z.pcap",
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("missing.pcap"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn run_help_documents_the_packet_flags() {
    let o = Command::new(env!("CARGO_BIN_EXE_flick"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("--port <CHANNEL=SPEC[,SPEC...]>"), "{help}");
    assert!(help.contains("--dump <FILE>"), "{help}");
}

/// The stock `packet` grammar and its library: a capture forwarded whole,
/// and flows counted the same with one worker or two.
#[test]
fn packet_programs_over_a_capture() {
    let d = dir("stock");
    let capture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/packets/testdata/tracker.pcap")
        .canonicalize()
        .unwrap();
    let input = flick_packet_io::read_pcap(&capture).unwrap();
    std::fs::write(
        d.join("fwd.flick"),
        "grammar packet\n\nproc fwd: (packet/- inside, -/packet outside)\n  | inside => outside\n",
    )
    .unwrap();
    let spec = format!("inside=pcap:{}", capture.display());
    let o = flick(
        &d,
        &[
            "run",
            "fwd.flick",
            "--port",
            &spec,
            "--port",
            "outside=pcap-out:out.pcap",
            "--workers",
            "2",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        flick_packet_io::read_pcap(&d.join("out.pcap")).unwrap(),
        input
    );

    std::fs::write(
        d.join("tracker.flick"),
        "grammar packet

proc tracker: (packet/- wire)
  global packets := empty_dict
  global bytes := empty_dict
  | wire => track(packets, bytes)

fun steer: (p: packet) -> (string)
  flow_key5(p)

fun track: (packets: ref dict<string*integer>, bytes: ref dict<string*integer>, p: packet) -> ()
  if is_ip(p):
    let k = flow_key5(p)
    if packets[k] = None:
      packets[k] := 1
      bytes[k] := frame_len(p)
    else:
      packets[k] := packets[k] + 1
      bytes[k] := bytes[k] + frame_len(p)
",
    )
    .unwrap();
    let mut dumps = Vec::new();
    for workers in ["1", "2"] {
        let dump = format!("flows{workers}.json");
        let o = flick(
            &d,
            &[
                "run",
                "tracker.flick",
                "--port",
                &spec.replace("inside", "wire"),
                "--workers",
                workers,
                "--dump",
                &dump,
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        dumps.push(std::fs::read_to_string(d.join(&dump)).unwrap());
    }
    assert_eq!(dumps[0], dumps[1]);
    let dump: serde_json::Value = serde_json::from_str(&dumps[0]).unwrap();
    let sum = |name: &str| -> u64 {
        dump["globals"][name]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum()
    };
    let ethertype = |f: &[u8]| match u16::from_be_bytes([f[12], f[13]]) {
        0x8100 => u16::from_be_bytes([f[16], f[17]]),
        t => t,
    };
    let ip: Vec<_> = input
        .iter()
        .filter(|(f, _)| matches!(ethertype(f), 0x0800 | 0x86dd))
        .collect();
    assert_eq!(sum("packets"), ip.len() as u64);
    assert_eq!(
        sum("bytes"),
        ip.iter().map(|(f, _)| f.len() as u64).sum::<u64>()
    );
    assert_eq!(dump["faults"], 0);
    assert_eq!(dump["malformed"], 0);
    let _ = std::fs::remove_dir_all(&d);
}

/// `[ports]` in the configuration file, files found beside it; a flag
/// replaces a channel's ports.
#[test]
fn a_configuration_file_binds_ports() {
    let d = dir("config");
    let input = frames();
    flick_packet_io::write_pcap(&d.join("in.pcap"), &input[..300]).unwrap();
    std::fs::write(
        d.join("split.toml"),
        "program = \"split.flick\"\nworkers = 2\n\n[ports]\ninside = \"pcap:in.pcap\"\nouts = [\"pcap-out:a.pcap\", \"pcap-out:b.pcap\"]\n",
    )
    .unwrap();
    // Run from elsewhere: the files are the configuration's neighbours.
    let elsewhere = std::env::temp_dir();
    let config = d.join("split.toml");
    let o = flick(&elsewhere, &["run", "--config", config.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        flick_packet_io::read_pcap(&d.join("a.pcap")).unwrap().len(),
        100
    );
    let c = format!(
        "outs=pcap-out:{},pcap-out:{}",
        d.join("c.pcap").display(),
        d.join("e.pcap").display()
    );
    let o = flick(
        &elsewhere,
        &["run", "--config", config.to_str().unwrap(), "--port", &c],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        flick_packet_io::read_pcap(&d.join("e.pcap")).unwrap().len(),
        100
    );
    let _ = std::fs::remove_dir_all(&d);
}
