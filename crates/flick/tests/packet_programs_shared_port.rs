//! Several packet programs on one port (`flick run A B --port ...`): each
//! sees every frame and keeps its own state, so what each writes and
//! dumps is what it writes and dumps alone, whatever the number of
//! workers; the steering plan (their largest common flow key, or
//! clusters) is printed at start and by `flick check A B`.

use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn example(name: &str) -> String {
    format!("{ROOT}/examples/packets/{name}")
}

fn capture(name: &str) -> String {
    format!("{ROOT}/examples/packets/testdata/{name}")
}

/// A directory of this test's own, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d =
            std::env::temp_dir().join(format!("flick-shared-port-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn flick(args: &[String]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_flick"))
        .args(args)
        .output()
        .expect("flick runs");
    assert!(
        o.status.success(),
        "flick {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// `flick run PROGRAMS --workers N --port ... --dump DUMP`: its stdout.
fn run(programs: &[&str], ports: &[String], dump: &str, workers: usize) -> String {
    let mut args = vec!["run".to_string()];
    args.extend(programs.iter().map(|p| example(p)));
    args.extend(["--workers".into(), workers.to_string()]);
    for p in ports {
        args.extend(["--port".into(), p.clone()]);
    }
    args.extend(["--dump".into(), dump.into()]);
    String::from_utf8(flick(&args).stdout).unwrap()
}

/// A dump's state: its `globals`.
fn globals(path: &str) -> Json {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let dump: Json = serde_json::from_str(&text).unwrap();
    dump["globals"].clone()
}

fn expected(name: &str) -> Json {
    let text = std::fs::read_to_string(capture(&format!("expected/{name}"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn frames(path: &str) -> Vec<(Vec<u8>, u64)> {
    flick_packet_io::read_pcap(Path::new(path)).unwrap()
}

#[test]
fn tracker_and_port_knocking_together_give_what_each_gives_alone() {
    let knock = capture("knock.pcap");
    for workers in [1, 2] {
        let s = Scratch::new(&format!("common{workers}"));
        run(
            &["flow_tracker.flick"],
            &[format!("wire=pcap:{knock}")],
            &s.path("tracker.json"),
            workers,
        );
        run(
            &["port_knocking.flick"],
            &[
                format!("inside=pcap:{knock}"),
                format!("outside=pcap-out:{}", s.path("alone.pcap")),
            ],
            &s.path("knocking.json"),
            workers,
        );
        let plan = run(
            &["flow_tracker.flick", "port_knocking.flick"],
            &[
                format!("wire=pcap:{knock}"),
                format!("inside=pcap:{knock}"),
                format!("outside=pcap-out:{}", s.path("together.pcap")),
            ],
            &s.path("both.json"),
            workers,
        );
        assert_eq!(plan, "steering: largest common flow key <src_addr>\n");
        let tracker = globals(&s.path("both.flow_tracker.json"));
        let knocking = globals(&s.path("both.port_knocking.json"));
        assert_eq!(
            tracker,
            globals(&s.path("tracker.json")),
            "{workers} workers"
        );
        assert_eq!(tracker, expected("knock.flow_tracker.json"));
        assert_eq!(knocking, globals(&s.path("knocking.json")));
        assert_eq!(knocking, expected("knock.port_knocking.json"));
        let passed = frames(&s.path("together.pcap"));
        assert!(!passed.is_empty());
        assert_eq!(passed, frames(&s.path("alone.pcap")));
        assert_eq!(
            passed,
            frames(&capture("expected/knock.port_knocking.pcap"))
        );
    }
}

#[test]
fn programs_without_a_common_key_are_clustered_and_each_sees_every_frame() {
    let dpi = capture("dpi.pcap");
    let s = Scratch::new("clusters");
    let balancer_outs = |tag: &str| {
        (0..3)
            .map(|i| format!("pcap-out:{}", s.path(&format!("{tag}{i}.pcap"))))
            .collect::<Vec<_>>()
            .join(",")
    };
    run(
        &["dpi_balancer.flick"],
        &[
            format!("wire=pcap:{dpi}"),
            format!("workers={}", balancer_outs("alone")),
        ],
        &s.path("alone_dpi.json"),
        2,
    );
    run(
        &["port_knocking.flick"],
        &[
            format!("inside=pcap:{dpi}"),
            format!("outside=pcap-out:{}", s.path("alone_passed.pcap")),
        ],
        &s.path("alone_knock.json"),
        2,
    );
    let plan = run(
        &["dpi_balancer.flick", "port_knocking.flick"],
        &[
            format!("wire=pcap:{dpi}"),
            format!("inside=pcap:{dpi}"),
            format!("workers={}", balancer_outs("both")),
            format!("outside=pcap-out:{}", s.path("both_passed.pcap")),
        ],
        &s.path("both.json"),
        2,
    );
    assert!(plan.contains("no common flow key; 2 clusters"), "{plan}");
    assert!(
        plan.contains("cluster 1: key <src_addr, dst_addr> symmetric:"),
        "{plan}"
    );
    assert!(plan.contains("cluster 2: key <src_addr>:"), "{plan}");
    let mut sent = 0;
    for i in 0..3 {
        let both = frames(&s.path(&format!("both{i}.pcap")));
        sent += both.len();
        assert_eq!(
            both,
            frames(&s.path(&format!("alone{i}.pcap"))),
            "workers[{i}]"
        );
    }
    // The balancer sends every frame on somewhere (DNS to all): it saw
    // them all.
    assert!(sent >= frames(&dpi).len(), "{sent} frames sent");
    assert_eq!(
        globals(&s.path("both.port_knocking.json")),
        globals(&s.path("alone_knock.json"))
    );
    assert_eq!(
        frames(&s.path("both_passed.pcap")),
        frames(&s.path("alone_passed.pcap"))
    );
}

#[test]
fn frames_two_programs_send_to_one_port_are_all_written() {
    let knock = capture("knock.pcap");
    let policer_in = capture("knock.pcap");
    let s = Scratch::new("shared-out");
    run(
        &["port_knocking.flick"],
        &[
            format!("inside=pcap:{knock}"),
            format!("outside=pcap-out:{}", s.path("knock.pcap")),
        ],
        &s.path("k.json"),
        2,
    );
    run(
        &["policer.flick"],
        &[
            format!("wire=pcap:{policer_in}"),
            format!("out=pcap-out:{}", s.path("police.pcap")),
        ],
        &s.path("p.json"),
        2,
    );
    let plan = run(
        &["port_knocking.flick", "policer.flick"],
        &[
            format!("inside=pcap:{knock}"),
            format!("wire=pcap:{policer_in}"),
            format!("outside=pcap-out:{}", s.path("one.pcap")),
            format!("out=pcap-out:{}", s.path("one.pcap")),
        ],
        &s.path("both.json"),
        2,
    );
    assert_eq!(plan, "steering: largest common flow key <src_addr>\n");
    let mut together = frames(&s.path("one.pcap"));
    let mut alone = frames(&s.path("knock.pcap"));
    alone.extend(frames(&s.path("police.pcap")));
    assert!(!alone.is_empty());
    // The two programs' frames interleave as their threads run.
    together.sort();
    alone.sort();
    assert_eq!(together, alone);
}

#[test]
fn check_of_several_packet_programs_prints_the_plan_and_the_combined_bound() {
    let o = flick(&[
        "check".into(),
        example("flow_tracker.flick"),
        example("port_knocking.flick"),
    ]);
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(
        out.contains("steering: largest common flow key <src_addr>\n"),
        "{out}"
    );
    assert!(
        out.contains("port_knocking.flick: flow key <src_addr>\n"),
        "{out}"
    );
    assert!(out.contains("combined: state "), "{out}");
    assert!(out.contains("operations per frame"), "{out}");
}

#[test]
fn a_port_no_program_reads_or_writes_is_refused() {
    let o = Command::new(env!("CARGO_BIN_EXE_flick"))
        .args([
            "run".to_string(),
            example("flow_tracker.flick"),
            example("port_knocking.flick"),
            "--port".into(),
            format!("wire=pcap:{}", capture("knock.pcap")),
            "--port".into(),
            format!("inside=pcap:{}", capture("knock.pcap")),
            "--port".into(),
            "outside=pcap-out:/dev/null".into(),
            "--port".into(),
            format!("nowhere=pcap:{}", capture("knock.pcap")),
            "--check".into(),
        ])
        .output()
        .expect("flick runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("`nowhere` is not a channel of any program"),
        "{err}"
    );
}
