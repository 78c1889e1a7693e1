//! Packet programs and machines under `flick serve`: the server runs in a
//! network namespace of the test's own with veth pairs, services are
//! deployed on AF_PACKET ports through `flick ctl`, frames are sent by the
//! test, and their counters, flow entries and flow contexts are read
//! through the API. A machine's table is replaced through the API and the
//! verdict changes while the flow context lives on; its global and flow
//! registers are written and change the verdict of the next frames; a
//! packet program's entries are deleted; a write to a service that does
//! not answer holds up no other request; an undeploy closes the
//! service's ports.
//!
//! Needs root and `ip` (iproute2): under CI (`CI=true`) a missing one
//! fails the test, elsewhere it is skipped with a message.

mod support;

use flick_testkit::netns::{self, Netns};
use flick_testkit::packet_model::tcp_syn;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};
use support::http::unix_exchange;
use support::live::send_and_collect;
use support::serve::{call, ctl, ok, refused, serve_by, Serve, TempDir};
use support::terminate;
use support::ROOT;

/// Passes what comes from outside to the inside, counting each source
/// host's frames in its flow context.
const GATE_OPEN: &str = "grammar packet

machine gate: (packet/packet inside, packet/packet outside)
  stage gate:
    key ipv4.src
    capacity 64
    flow packets: integer := 0
    states seen
    in seen on packet when from outside: packets := packets + 1; forward inside
    in seen on packet: packets := packets + 1
";

/// The same machine, its key, registers and states unchanged, dropping
/// what comes from outside.
fn gate_shut() -> String {
    let forward =
        "    in seen on packet when from outside: packets := packets + 1; forward inside\n";
    GATE_OPEN.replace(forward, "")
}

/// Sends `frames` into `iface`, then reads what reaches `out` (if any)
/// until `expected` came and nothing more for 300 ms, or 5 s pass.
fn send(
    ns: &Netns,
    iface: &str,
    frames: &[Vec<u8>],
    out: Option<&str>,
    expected: usize,
) -> Vec<Vec<u8>> {
    let timed: Vec<(Vec<u8>, u64)> = frames.iter().map(|f| (f.clone(), 0)).collect();
    let mut got = send_and_collect(ns, iface, &timed, out, expected);
    // Frames the test sent itself are seen on their own veth end too.
    got.retain(|f| f.len() > 29 && f[29] != 0 && f[30..34] == [10, 0, 1, 1]);
    got
}

/// Where `test` may make network namespaces (else it says so and gets
/// `None`): a namespace of its own named `ns` with `veths` pairs, a
/// scratch directory, its `state` directory and a `flick serve` on it,
/// run in the namespace. Dropped in the reverse order: the server, the
/// directory, then the namespace.
fn serve_in_netns(
    test: &str,
    ns: &str,
    veths: &[(&str, &str)],
) -> Option<(Netns, TempDir, PathBuf, Serve)> {
    serve_in_netns_with(test, ns, veths, &[])
}

/// [`serve_in_netns`] with `more` flags for `flick serve`.
fn serve_in_netns_with(
    test: &str,
    ns: &str,
    veths: &[(&str, &str)],
    more: &[&str],
) -> Option<(Netns, TempDir, PathBuf, Serve)> {
    if !netns::available(test) {
        return None;
    }
    let dir = TempDir::new(ns);
    let ns = Netns::new(ns);
    for (a, b) in veths {
        ns.veth_pair(a, b);
    }
    let state = dir.0.join("state");
    let server = serve_by(ns.command(env!("CARGO_BIN_EXE_flick")), &state, more);
    Some((ns, dir, state, server))
}

/// Waits (at most 10 s) until `pid` holds `n` bound packet sockets.
fn wait_sockets(pid: u32, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while netns::bound_packet_sockets(pid) != n {
        assert!(
            Instant::now() < deadline,
            "flick serve holds {} bound packet sockets, not {n}",
            netns::bound_packet_sockets(pid)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn json(out: &Output) -> Json {
    serde_json::from_str(&ok(out)).unwrap()
}

/// `flick ctl --json read NAME PATH`'s answer.
fn read(state: &Path, name: &str, path: &str) -> Json {
    json(&ctl(state, &["--json", "read", name, path]))
}

/// `flick ctl --json status NAME`'s answer.
fn service_status(state: &Path, name: &str) -> Json {
    json(&ctl(state, &["--json", "status", name]))
}

/// `flick ctl VERB... NAME FILE --port PORT...`.
fn deploy_ports(state: &Path, verb: &[&str], name: &str, file: &str, ports: &[&str]) -> Output {
    let mut args = verb.to_vec();
    args.extend([name, file]);
    for p in ports {
        args.extend(["--port", p]);
    }
    ctl(state, &args)
}

/// Reads `path` of `name` until `done` holds of its value (10 s at most):
/// frames reach the engine a little after they reach the port.
fn read_until(state: &Path, name: &str, path: &str, done: impl Fn(&Json) -> bool) -> Json {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = read(state, name, path)["value"].clone();
        if done(&v) || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn packet_program_and_machine_served_read_replaced_and_undeployed() {
    let test = "packet_program_and_machine_served_read_replaced_and_undeployed";
    let Some((ns, dir, state, server)) = serve_in_netns(
        test,
        "flkservep",
        &[("in0", "in1"), ("out0", "out1"), ("t0", "t1")],
    ) else {
        return;
    };
    let pid = server.child.id();

    // A packet program: the flow tracker counts what t1 receives.
    let tracker = Path::new(ROOT).join("examples/packets/flow_tracker.flick");
    let a = json(&deploy_ports(
        &state,
        &["--json", "deploy"],
        "tracker",
        tracker.to_str().unwrap(),
        &["wire=afpacket:t1"],
    ));
    assert_eq!(a["kind"], "packet", "{a}");
    wait_sockets(pid, 1);
    let input =
        flick_packet_io::read_pcap(&Path::new(ROOT).join("examples/packets/testdata/tracker.pcap"))
            .unwrap();
    let frames: Vec<Vec<u8>> = input.into_iter().map(|(f, _)| f).collect();
    send(&ns, "t0", &frames, None, 0);
    let rx = read_until(&state, "tracker", "ports/wire/rx_frames", |v| {
        *v == frames.len()
    });
    assert_eq!(rx, frames.len(), "frames the tracker read");
    let want: Json = serde_json::from_slice(
        &std::fs::read(
            Path::new(ROOT).join("examples/packets/testdata/expected/tracker.flow_tracker.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let packets = read(&state, "tracker", "globals/packets");
    assert_eq!(
        packets["value"], want["packets"],
        "flow entries through the API"
    );
    let status = service_status(&state, "tracker");
    assert_eq!(status["ports"][0]["rx_frames"], frames.len(), "{status}");

    // A machine on two ports, its table file written for a redeploy.
    let open = dir.file("gate.flick", GATE_OPEN);
    let shut = dir.file("gate_shut.flick", &gate_shut());
    let a = json(&deploy_ports(
        &state,
        &["--json", "deploy"],
        "gate",
        &open,
        &["inside=afpacket:in1", "outside=afpacket:out0"],
    ));
    assert_eq!(a["kind"], "machine", "{a}");
    assert!(a["reserved_bytes"].as_u64().unwrap() > 0, "{a}");
    wait_sockets(pid, 3);
    let before: Vec<Vec<u8>> = (0..3).map(|i| tcp_syn(5, 1000 + i)).collect();
    let passed = send(&ns, "out1", &before, Some("in0"), 3);
    assert_eq!(passed.len(), 3, "the open gate passes host 5's frames");
    let context = read_until(&state, "gate", "stages/gate/0/registers/packets", |v| {
        *v == 3
    });
    assert_eq!(context, 3, "host 5's flow context");
    let outside = "flick_machine_rx_frames_total{service=\"gate\",port=\"outside\"}";
    assert_eq!(sample_until(&state, outside, 3), Some(3));
    let inside = "flick_machine_tx_frames_total{service=\"gate\",port=\"inside\"}";
    assert_eq!(sample_until(&state, inside, 3), Some(3));

    // The table replaced through the API: the verdict changes, the
    // context lives on.
    let w = json(&ctl(&state, &["--json", "write", "gate", "table", &shut]));
    assert_eq!(w["applied"], true, "{w}");
    let table = read(&state, "gate", "table");
    assert_eq!(table["value"], gate_shut());
    let after: Vec<Vec<u8>> = (0..2).map(|i| tcp_syn(5, 2000 + i)).collect();
    let passed = send(&ns, "out1", &after, Some("in0"), 0);
    assert!(passed.is_empty(), "the shut gate passed {}", passed.len());
    let context = read_until(&state, "gate", "stages/gate/0/registers/packets", |v| {
        *v == 5
    });
    assert_eq!(context, 5, "host 5's flow context survived the new table");
    let status = service_status(&state, "gate");
    assert_eq!(status["flow_tables"][0]["contexts"], 1, "{status}");
    assert_eq!(status["counters"]["table_swaps"], 1, "{status}");

    // A table with another key is refused; the running one stays.
    let other = dir.file(
        "gate_other.flick",
        &gate_shut().replace("key ipv4.src", "key ipv4.dst"),
    );
    let e = refused(&ctl(&state, &["write", "gate", "table", &other]));
    assert!(e.contains("key"), "{e}");
    let table = read(&state, "gate", "table");
    assert_eq!(table["value"], gate_shut());

    // A redeploy on the same ports swaps the tables in place: the gate
    // opens again and the context goes on counting.
    let r = json(&deploy_ports(
        &state,
        &["--json", "redeploy"],
        "gate",
        &open,
        &["inside=afpacket:in1", "outside=afpacket:out0"],
    ));
    assert_eq!(r["carried"][0], "flow contexts", "{r}");
    assert_eq!(r["version"], 2, "{r}");
    let again = vec![tcp_syn(5, 3000)];
    let passed = send(&ns, "out1", &again, Some("in0"), 1);
    assert_eq!(passed.len(), 1, "the gate redeployed open passes again");
    let context = read_until(&state, "gate", "stages/gate/0/registers/packets", |v| {
        *v == 6
    });
    assert_eq!(context, 6, "host 5's flow context survived the redeploy");

    // A restart deploys both again from the state directory, ports open.
    drop(server);
    let server = serve_by(ns.command(env!("CARGO_BIN_EXE_flick")), &state, &[]);
    let pid = server.child.id();
    wait_sockets(pid, 3);
    let status = service_status(&state, "gate");
    assert_eq!(status["kind"], "machine", "{status}");
    assert_eq!(status["running"], true, "{status}");

    // Listed with its kind; undeployed, its ports close.
    let list = json(&ctl(&state, &["--json", "list"]));
    let kinds: Vec<&str> = list["services"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["machine", "packet"], "{list}");
    ok(&ctl(&state, &["undeploy", "gate"]));
    wait_sockets(pid, 1);
    ok(&ctl(&state, &["undeploy", "tracker"]));
    wait_sockets(pid, 0);
    let e = refused(&ctl(&state, &["status", "gate"]));
    assert!(e.contains("no service"), "{e}");
}

#[test]
fn packet_deploys_are_refused_with_the_reason() {
    let test = "packet_deploys_are_refused_with_the_reason";
    let Some((_ns, dir, state, _server)) =
        serve_in_netns_with(test, "flkserver", &[], &["--memory-budget", "1000"])
    else {
        return;
    };
    let gate = dir.file("gate.flick", GATE_OPEN);
    // No ports.
    let e = refused(&ctl(&state, &["deploy", "gate", &gate]));
    assert!(e.contains("packet ports"), "{e}");
    // Its flow table is more than the budget.
    let e = refused(&deploy_ports(
        &state,
        &["deploy"],
        "gate",
        &gate,
        &["inside=afpacket:lo", "outside=afpacket:lo"],
    ));
    assert!(e.contains("memory budget"), "{e}");
    // A port that does not exist.
    let tracker = Path::new(ROOT).join("examples/packets/flow_tracker.flick");
    let e = refused(&deploy_ports(
        &state,
        &["deploy"],
        "t",
        tracker.to_str().unwrap(),
        &["wire=afpacket:nosuch0"],
    ));
    assert!(e.contains("nosuch0"), "{e}");
}

/// Counts each IPv4 source's frames in `seen` and those within `limit`
/// in `passed`; `tag` is a string only the API sets.
const QUOTA: &str = "grammar packet

proc quota: (packet/- wire)
  global seen: dict<integer*integer> {capacity=64} := empty_dict
  global limit: integer := 1
  global passed: integer := 0
  global tag: string {max=16} := \"none\"
  | wire => count(seen, limit, passed)

fun count: (seen: ref dict<integer*integer> {capacity=64}, limit: ref integer, passed: ref integer, p: packet) -> ()
  if is_ip4(p):
    let k = src_ip(p)
    if seen[k] = None:
      seen[k] := 1
    else:
      seen[k] := seen[k] + 1
    if seen[k] <= limit:
      passed := passed + 1
";

/// 10.0.0.5, the source of `tcp_syn(5, _)`, as `src_ip` gives it.
const HOST5: &str = "167772165";

/// `GET /metrics` over the API's Unix socket: the text served.
fn metrics(state: &Path) -> String {
    let get = b"GET /metrics HTTP/1.1\r\nHost: flick\r\nConnection: close\r\n\r\n";
    unix_exchange(&state.join("flick.sock"), get)
}

/// The sample `series` of `/metrics` once it is `want`, or as it is after
/// 10 s: a counter is stored a little after its frame moves.
fn sample_until(state: &Path, series: &str, want: u64) -> Option<u64> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = sample(&metrics(state), series);
        if v == Some(want) || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The value of the sample whose line starts with `series`, if served.
fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

#[test]
fn packet_state_written_carried_over_a_redeploy_and_counted_in_metrics() {
    let test = "packet_state_written_carried_over_a_redeploy_and_counted_in_metrics";
    let Some((ns, dir, state, server)) = serve_in_netns(test, "flkservew", &[("q0", "q1")]) else {
        return;
    };
    let pid = server.child.id();
    let quota = dir.file("quota.flick", QUOTA);
    let deploy = ["deploy", "quota", &quota, "--port", "wire=afpacket:q1"];

    // A weight means nothing to packet threads: refused, not ignored.
    let mut weighted = deploy.to_vec();
    weighted.extend(["--weight", "5"]);
    let e = refused(&ctl(&state, &weighted));
    assert!(e.contains("takes no weight"), "{e}");

    ok(&ctl(&state, &deploy));
    wait_sockets(pid, 1);
    let series = "flick_packet_rx_frames_total{service=\"quota\",port=\"wire\"}";
    // The port's counters are published once its run has started.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut before = sample(&metrics(&state), series);
    while before.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        before = sample(&metrics(&state), series);
    }
    assert_eq!(before, Some(0), "before any frame");

    // Scalars, checked against their declared types.
    let w = json(&ctl(
        &state,
        &["--json", "write", "quota", "tag", "\"blue\""],
    ));
    assert_eq!(w["value"], "blue", "{w}");
    assert_eq!(read_until(&state, "quota", "globals/tag", |_| true), "blue");
    let e = refused(&ctl(&state, &["write", "quota", "tag", "5"]));
    assert!(e.contains("string"), "{e}");
    ok(&ctl(&state, &["write", "quota", "limit", "3"]));
    // A dictionary is written an entry at a time, under a key of its type.
    let e = refused(&ctl(&state, &["write", "quota", "seen", "1"]));
    assert!(e.contains("entry"), "{e}");
    let e = refused(&ctl(&state, &["write", "quota", "seen/host", "1"]));
    assert!(e.contains("integer"), "{e}");
    let e = refused(&ctl(
        &state,
        &["write", "quota", &format!("seen/{HOST5}"), "\"x\""],
    ));
    assert!(e.contains("integer"), "{e}");

    // Host 5's entry written before its frames: they count on from it,
    // in the shard that handles them, and the new limit holds.
    let w = json(&ctl(
        &state,
        &["--json", "write", "quota", &format!("seen/{HOST5}"), "1"],
    ));
    assert_eq!(w["value"], 1, "{w}");
    let frames: Vec<Vec<u8>> = (0..4).map(|i| tcp_syn(5, 1000 + i)).collect();
    send(&ns, "q0", &frames, None, 0);
    let seen = read_until(&state, "quota", &format!("globals/seen/{HOST5}"), |v| {
        *v == 5
    });
    assert_eq!(seen, 5, "the written entry and four frames");
    let passed = read_until(&state, "quota", "globals/passed", |v| *v == 2);
    let dump = read(&state, "quota", "dump");
    assert_eq!(passed, 2, "frames within the written limit of 3: {dump}");
    assert_eq!(sample_until(&state, series, 4), Some(4));
    let text = metrics(&state);
    assert!(
        text.contains("flick_packet_dropped_total{service=\"quota\"}"),
        "{text}"
    );
    let status = service_status(&state, "quota");
    assert_eq!(status["ports"][0]["rx_frames"], 4, "{status}");

    // A redeploy gives the new version the globals whose type is the
    // same; `tag` changes type and starts again.
    let changed = dir.file(
        "quota2.flick",
        &QUOTA.replace(
            "global tag: string {max=16} := \"none\"",
            "global tag: integer := 0",
        ),
    );
    let r = json(&deploy_ports(
        &state,
        &["--json", "redeploy"],
        "quota",
        &changed,
        &["wire=afpacket:q1"],
    ));
    let carried: Vec<&str> = r["carried"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Json::as_str)
        .collect();
    assert_eq!(carried, ["seen", "limit", "passed"], "{r}");
    wait_sockets(pid, 1);
    let dump = read(&state, "quota", "globals")["value"].clone();
    assert_eq!(dump["seen"][HOST5], 5, "{dump}");
    assert_eq!(dump["limit"], 3, "{dump}");
    assert_eq!(dump["passed"], 2, "{dump}");
    assert_eq!(dump["tag"], 0, "{dump}");
    let e = refused(&ctl(&state, &["weight", "quota", "2"]));
    assert!(e.contains("takes no weight"), "{e}");

    // A clean stop saves the state; the next `serve` gives it back.
    let mut server = server;
    terminate(&mut server.child);
    let server = serve_by(ns.command(env!("CARGO_BIN_EXE_flick")), &state, &[]);
    wait_sockets(server.child.id(), 1);
    let status = service_status(&state, "quota");
    assert_eq!(status["carried"][0], "seen", "{status}");
    let dump = read(&state, "quota", "globals")["value"].clone();
    assert_eq!(dump["seen"][HOST5], 5, "{dump}");
    assert_eq!(dump["limit"], 3, "{dump}");
    assert_eq!(dump["passed"], 2, "{dump}");
}

/// Passes at most `limit` frames from each outside host, counted in its
/// flow context; a context moved to `blocked` passes nothing.
const METER: &str = "grammar packet

machine meter: (packet/packet inside, packet/packet outside)
  global limit: integer := 2

  stage meter:
    key ipv4.src
    capacity 64
    flow packets: integer := 0
    states counting, blocked
    in counting on packet when from outside, packets < limit: packets := packets + 1; forward inside
    in counting on packet when from outside: packets := packets + 1
    in blocked on packet: packets := packets + 1
";

/// A refused API request: its status and its message.
fn refusal(state: &Path, method: &str, path: &str, body: Option<&Json>) -> (u16, String) {
    let (status, answer) = call(state, method, path, body);
    (status, answer["error"].as_str().unwrap_or("").to_string())
}

#[test]
fn machine_registers_and_flow_contexts_written_and_deleted() {
    let test = "machine_registers_and_flow_contexts_written_and_deleted";
    let Some((ns, dir, state, server)) =
        serve_in_netns(test, "flkservem", &[("in0", "in1"), ("out0", "out1")])
    else {
        return;
    };
    let meter = dir.file("meter.flick", METER);
    ok(&deploy_ports(
        &state,
        &["deploy"],
        "meter",
        &meter,
        &["inside=afpacket:in1", "outside=afpacket:out0"],
    ));
    wait_sockets(server.child.id(), 2);
    let flow = "stages/meter/flows/10.0.0.5";
    let packets = format!("{flow}/registers/packets");

    // Within the limit of 2, then over it.
    let frames: Vec<Vec<u8>> = (0..3).map(|i| tcp_syn(5, 1000 + i)).collect();
    assert_eq!(send(&ns, "out1", &frames, Some("in0"), 2).len(), 2);
    assert_eq!(read_until(&state, "meter", &packets, |v| *v == 3), 3);
    // The key as the dump prints it names the same context.
    let by_number = read(&state, "meter", "stages/meter/flows/ipv4.src=167772165");
    assert_eq!(by_number["value"]["registers"]["packets"], 3, "{by_number}");

    // The global register raised: host 5's next frame passes.
    let w = json(&ctl(
        &state,
        &["--json", "write", "meter", "globals/limit", "5"],
    ));
    assert_eq!(w["value"], 5, "{w}");
    let limit = read(&state, "meter", "globals/limit");
    assert_eq!(limit["value"], 5, "{limit}");
    let one = vec![tcp_syn(5, 2000)];
    assert_eq!(send(&ns, "out1", &one, Some("in0"), 1).len(), 1);
    assert_eq!(read_until(&state, "meter", &packets, |v| *v == 4), 4);

    // Its flow register written past the limit: the next frame stops.
    let w = json(&ctl(&state, &["--json", "write", "meter", &packets, "10"]));
    assert_eq!(w["applied"], true, "{w}");
    assert_eq!(read_until(&state, "meter", &packets, |_| true), 10);
    let one = vec![tcp_syn(5, 2001)];
    assert!(send(&ns, "out1", &one, Some("in0"), 0).is_empty());
    assert_eq!(read_until(&state, "meter", &packets, |v| *v == 11), 11);

    // Its state written: `blocked` passes nothing, whatever the count.
    ok(&ctl(
        &state,
        &["write", "meter", &format!("{flow}/state"), "blocked"],
    ));
    ok(&ctl(&state, &["write", "meter", &packets, "0"]));
    let s = read(&state, "meter", &format!("{flow}/state"));
    assert_eq!(s["value"], "blocked", "{s}");
    let one = vec![tcp_syn(5, 2002)];
    assert!(send(&ns, "out1", &one, Some("in0"), 0).is_empty());
    assert_eq!(read_until(&state, "meter", &packets, |v| *v == 1), 1);

    // Refusals name what was wrong.
    let api = |path: &str| format!("/services/meter/state/{path}");
    let int = serde_json::json!({ "value": 1 });
    let text = serde_json::json!({ "value": "many" });
    // (path, body, status, what the message names)
    let refusals: [(String, &Json, u16, &[&str]); 8] = [
        ("globals/nosuch".into(), &int, 404, &["nosuch", "limit"]),
        ("globals/limit".into(), &text, 400, &["integer"]),
        (
            "stages/meter/flows/10.0.0.9/registers/packets".into(),
            &int,
            404,
            &["no such flow context"],
        ),
        (
            "stages/meter/flows/1,2/registers/packets".into(),
            &int,
            400,
            &["ipv4.src"],
        ),
        (
            "stages/nosuch/flows/1/registers/packets".into(),
            &int,
            404,
            &["not a stage"],
        ),
        (format!("{flow}/registers/nosuch"), &int, 404, &["packets"]),
        (format!("{flow}/state"), &text, 400, &["counting, blocked"]),
        (
            "stages/meter/0/registers/packets".into(),
            &int,
            422,
            &["flows/KEY"],
        ),
    ];
    for (path, body, want, names) in refusals {
        let (status, e) = refusal(&state, "PUT", &api(&path), Some(body));
        assert_eq!(status, want, "{path}: {e}");
        assert!(names.iter().all(|n| e.contains(n)), "{path}: {e}");
    }

    // The context deleted: gone from the dump, and host 5 starts again.
    let d = ok(&ctl(&state, &["delete", "meter", flow]));
    assert!(d.contains("deleted"), "{d}");
    let (status, e) = refusal(&state, "GET", &api(flow), None);
    assert_eq!(status, 404, "{e}");
    let dump = read(&state, "meter", "stages/meter");
    assert_eq!(dump["value"], serde_json::json!([]), "{dump}");
    let (status, e) = refusal(&state, "DELETE", &api(flow), None);
    assert_eq!(status, 404, "{e}");
    let one = vec![tcp_syn(5, 2003)];
    assert_eq!(send(&ns, "out1", &one, Some("in0"), 1).len(), 1);
    assert_eq!(read_until(&state, "meter", &packets, |v| *v == 1), 1);
}

/// `read`'s system call number, as `/proc/PID/task/TID/syscall` shows it.
#[cfg(target_arch = "x86_64")]
const READ_SYSCALL: &str = "0";
#[cfg(target_arch = "aarch64")]
const READ_SYSCALL: &str = "63";

/// Waits (at most 10 s) until a thread of `pid` whose name starts as
/// `comm` (the kernel keeps 15 bytes) is blocked in `read` on `path`.
fn wait_reading(pid: u32, comm: &str, path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let reading = || -> Option<()> {
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
            let task = task.ok()?.path();
            if std::fs::read_to_string(task.join("comm")).ok()?.trim() != comm {
                continue;
            }
            // `NR ARG1 ...`: the call it is blocked in and its fd.
            let call = std::fs::read_to_string(task.join("syscall")).ok()?;
            let mut words = call.split_whitespace();
            if words.next() != Some(READ_SYSCALL) {
                continue;
            }
            let fd = u64::from_str_radix(words.next()?.trim_start_matches("0x"), 16).ok()?;
            if std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()? == path {
                return Some(());
            }
        }
        None
    };
    while reading().is_none() {
        assert!(
            Instant::now() < deadline,
            "no thread `{comm}` of {pid} came to read {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn packet_entries_deleted_and_a_stuck_service_holds_up_no_other_request() {
    let test = "packet_entries_deleted_and_a_stuck_service_holds_up_no_other_request";
    let Some((_ns, dir, state, server)) = serve_in_netns(test, "flkserved", &[("d0", "d1")]) else {
        return;
    };
    let quota = dir.file("quota.flick", QUOTA);
    ok(&ctl(
        &state,
        &["deploy", "quota", &quota, "--port", "wire=afpacket:d1"],
    ));
    wait_sockets(server.child.id(), 1);

    // Entries written, then one deleted: gone from the dump, the other
    // kept.
    ok(&ctl(
        &state,
        &["write", "quota", &format!("seen/{HOST5}"), "4"],
    ));
    ok(&ctl(&state, &["write", "quota", "seen/7", "2"]));
    let d = ok(&ctl(&state, &["delete", "quota", &format!("seen/{HOST5}")]));
    assert!(d.contains("deleted"), "{d}");
    let seen = read(&state, "quota", "globals/seen");
    assert_eq!(seen["value"], serde_json::json!({ "7": 2 }), "{seen}");
    // Read, written and deleted through `key_base64` ("7", "8").
    let (status, answer) = call(
        &state,
        "GET",
        "/services/quota/state/seen?key_base64=Nw==",
        None,
    );
    assert_eq!(
        (status, &answer["value"]),
        (200, &serde_json::json!(2)),
        "{answer}"
    );
    let five = serde_json::json!({ "value": 5 });
    let (status, answer) = call(
        &state,
        "PUT",
        "/services/quota/state/seen?key_base64=OA==",
        Some(&five),
    );
    assert_eq!(status, 200, "{answer}");
    let eight = read(&state, "quota", "globals/seen/8");
    assert_eq!(eight["value"], 5, "{eight}");
    ok(&ctl(&state, &["delete", "quota", "seen/8"]));
    let (status, answer) = call(
        &state,
        "DELETE",
        "/services/quota/state/seen?key_base64=Nw==",
        None,
    );
    assert_eq!(status, 200, "{answer}");
    let seen = read(&state, "quota", "globals/seen");
    assert_eq!(seen["value"], serde_json::json!({}), "{seen}");
    let (status, e) = refusal(&state, "DELETE", "/services/quota/state/seen/7", None);
    assert_eq!(status, 404, "{e}");
    assert!(e.contains("no entry"), "{e}");
    let (status, e) = refusal(&state, "DELETE", "/services/quota/state/seen/x", None);
    assert_eq!(status, 400, "{e}");
    assert!(e.contains("integer"), "{e}");
    let (status, e) = refusal(&state, "DELETE", "/services/quota/state/limit/1", None);
    assert_eq!(status, 400, "{e}");
    assert!(e.contains("not a dictionary"), "{e}");
    let (status, e) = refusal(&state, "DELETE", "/services/quota/state/nosuch/1", None);
    assert_eq!(status, 404, "{e}");

    // A machine whose input is a pipe with a pcap header and no frame:
    // its dispatcher waits in `read`, so it never takes a write.
    let fifo = dir.0.join("stuck.pcap");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // Read and write: opening it waits for no peer, and the pipe lives
    // while the test holds it.
    let mut pipe = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let mut header = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
    header.extend([0; 8]);
    header.extend(65535u32.to_le_bytes());
    header.extend(1u32.to_le_bytes());
    // The port reads the magic number, then opens the file again for
    // the whole header.
    std::io::Write::write_all(&mut pipe, &header[..4]).unwrap();
    std::io::Write::write_all(&mut pipe, &header).unwrap();
    let meter = dir.file("meter.flick", METER);
    let out = dir.0.join("out.pcap");
    ok(&ctl(
        &state,
        &[
            "deploy",
            "stuck",
            &meter,
            "--port",
            &format!("outside=pcap:{}", fifo.display()),
            "--port",
            &format!("inside=pcap-out:{}", out.display()),
        ],
    ));
    // Once its dispatcher is in `read` on the pipe it takes no write
    // and no dump request until a frame comes, and none will.
    wait_reading(server.child.id(), "flick-machine-s", &fifo);
    let writing = std::thread::spawn({
        let state = state.clone();
        move || {
            let body = serde_json::json!({ "value": 9 });
            let (status, answer) = call(
                &state,
                "PUT",
                "/services/stuck/state/globals/limit",
                Some(&body),
            );
            (status, answer, Instant::now())
        }
    });
    // A read of its state waits for its dump in the same way.
    let reading = std::thread::spawn({
        let state = state.clone();
        move || call(&state, "GET", "/services/stuck/state/dump", None)
    });
    // While those wait (5 s), the others answer at once.
    let sent = Instant::now();
    let mut answered_meanwhile = 0;
    while !writing.is_finished() || !reading.is_finished() {
        // Over the socket from here: no process to start, so what is
        // timed is the server's answer.
        let asked = Instant::now();
        let (status, list) = call(&state, "GET", "/services", None);
        let listed = asked.elapsed();
        assert_eq!(status, 200, "{list}");
        assert_eq!(list["services"].as_array().map(Vec::len), Some(2), "{list}");
        let limit = serde_json::json!({ "value": 3 });
        let (status, w) = call(&state, "PUT", "/services/quota/state/limit", Some(&limit));
        assert_eq!(status, 200, "{w}");
        let wrote = asked.elapsed() - listed;
        assert!(
            listed.max(wrote) < Duration::from_millis(2500),
            "a list took {listed:?} and a write {wrote:?} while another service's write waited"
        );
        if asked > sent + Duration::from_millis(500)
            && !writing.is_finished()
            && !reading.is_finished()
        {
            answered_meanwhile += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, answer, _) = writing.join().unwrap();
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer["error"].as_str().unwrap_or("").contains("in time"),
        "{answer}"
    );
    let (status, answer) = reading.join().unwrap();
    assert_eq!(status, 503, "{answer}");
    assert!(
        answered_meanwhile > 0,
        "no request was answered while the write waited"
    );
    // The pipe's end lets the machine finish.
    drop(pipe);
}
