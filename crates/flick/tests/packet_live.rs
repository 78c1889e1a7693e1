//! The packet examples on live interfaces: `flick run` with AF_PACKET
//! ports on veth pairs inside a network namespace of the test's own, the
//! capture frames sent into one end by the test and what comes out read
//! at the other. The port-knocking firewall passes exactly the frames
//! the expected capture holds (the same as from a file), and the flow
//! tracker's counts are exact, also when both programs share the port.
//!
//! Needs root and `ip` (iproute2): under CI (`CI=true`) a missing one
//! fails the test, elsewhere it is skipped with a message.

use flick_testkit::netns::{self, Netns};
use serde_json::Value as Json;
use std::net::{SocketAddrV4, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::live::send_and_collect;
use support::{Scratch, ROOT};

mod support;

fn testdata(name: &str) -> PathBuf {
    Path::new(ROOT).join("examples/packets/testdata").join(name)
}

/// `flick run` inside the namespace, killed on drop.
struct Flick {
    child: Child,
    dump: PathBuf,
    /// Its standard error.
    log: PathBuf,
}

impl Flick {
    /// `programs` run together on their ports (several: one port shared,
    /// each program's dump in a file of its own).
    fn start(ns: &Netns, programs: &[&str], ports: &[&str], tag: &str) -> Flick {
        let dump =
            std::env::temp_dir().join(format!("flick-live-{tag}-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&dump);
        let log = dump.with_extension("log");
        let mut cmd = ns.command(env!("CARGO_BIN_EXE_flick"));
        cmd.current_dir(ROOT)
            .arg("run")
            .args(programs.iter().map(|p| format!("examples/packets/{p}")))
            .args(["--workers", "2", "--dump"])
            .arg(&dump)
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
        for p in ports {
            cmd.args(["--port", p]);
        }
        let flick = Flick {
            child: cmd.spawn().unwrap(),
            dump,
            log,
        };
        // Ready once its packet sockets are bound (frames then wait in
        // their rings), one per interface named, its TUN devices made and
        // its AF_XDP ports' programs attached (the last step of opening).
        let named = |kind: &str| {
            let mut names: Vec<&str> = ports
                .iter()
                .filter_map(|p| p.split_once('=')?.1.strip_prefix(kind))
                .collect();
            names.sort();
            names.dedup();
            names
        };
        let (ifaces, tuns, xdps) = (named("afpacket:"), named("tun:"), named("afxdp:"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if netns::bound_packet_sockets(flick.child.id()) >= ifaces.len()
                && tuns.iter().all(|t| ns.has_link(t))
                && xdps.iter().all(|x| ns.has_xdp_program(x))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "flick opened no ports in 10 s: {}",
                flick.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        flick
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it with SIGINT and returns its final dump.
    fn finish(mut self) -> Json {
        self.stop();
        serde_json::from_slice(&std::fs::read(&self.dump).unwrap()).unwrap()
    }

    /// Where `program`'s dump goes when several run.
    fn program_dump(&self, program: &str) -> PathBuf {
        let stem = self.dump.with_extension("");
        let program = program.trim_end_matches(".flick");
        PathBuf::from(format!("{}.{program}.json", stem.display()))
    }

    /// Asks for dumps (SIGUSR1) into `path` until one satisfies `done`,
    /// for at most 5 s.
    fn dump_until(&self, path: &Path, done: impl Fn(&Json) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let _ = std::fs::remove_file(path);
            signal(&self.child, "USR1");
            std::thread::sleep(Duration::from_millis(100));
            let dump = std::fs::read(path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Json>(&b).ok());
            if dump.is_some_and(|d| done(&d)) {
                return;
            }
        }
    }

    /// Stops it with SIGINT and returns each program's final dump.
    fn finish_programs(mut self, programs: &[&str]) -> Vec<Json> {
        let paths: Vec<PathBuf> = programs.iter().map(|p| self.program_dump(p)).collect();
        for p in &paths {
            let _ = std::fs::remove_file(p);
        }
        self.stop();
        paths
            .iter()
            .map(|p| {
                let dump = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                let _ = std::fs::remove_file(p);
                serde_json::from_slice(&dump).unwrap()
            })
            .collect()
    }

    fn stop(&mut self) {
        let _ = std::fs::remove_file(&self.dump);
        signal(&self.child, "INT");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "flick exited with {status}: {}",
                    self.log()
                );
                break;
            }
            assert!(Instant::now() < deadline, "flick did not stop on SIGINT");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Flick {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.dump);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Signals flick (`ip netns exec` becomes the program it runs).
fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status();
}

#[test]
fn port_knocking_on_a_veth_pair() {
    port_knocking_over("afpacket", "port_knocking_on_a_veth_pair");
}

#[test]
fn port_knocking_over_af_xdp() {
    port_knocking_over("afxdp", "port_knocking_over_af_xdp");
}

/// The firewall between two veth pairs, its ports of `kind`.
fn port_knocking_over(kind: &str, test: &str) {
    if !netns::available(test) {
        return;
    }
    let ns = Netns::new("flkknock");
    ns.veth_pair("in0", "in1");
    ns.veth_pair("out0", "out1");
    let flick = Flick::start(
        &ns,
        &["port_knocking.flick"],
        &[
            &format!("inside={kind}:in1"),
            &format!("outside={kind}:out0"),
        ],
        &format!("knock-{kind}"),
    );
    let input = flick_packet_io::read_pcap(&testdata("knock.pcap")).unwrap();
    let expected = written(&testdata("expected/knock.port_knocking.pcap"));
    assert!(!expected.is_empty() && expected.len() < input.len());
    let passed = send_and_collect(&ns, "in0", &input, Some("out1"), expected.len());
    let dump = flick.finish();
    // The ports' counts (frames read, kernel drops) tell a frame lost on
    // the way in from one the program dropped.
    assert_eq!(
        passed, expected,
        "the frames the firewall passed; its ports: {}",
        dump["ports"]
    );
    let want: Json = serde_json::from_slice(
        &std::fs::read(testdata("expected/knock.port_knocking.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(dump["globals"], want, "knock and flow tables");
    assert_eq!(dump["ports"]["inside"]["rx_frames"], input.len(), "{dump}");
}

#[test]
fn flow_tracker_counts_on_a_veth_pair() {
    if !netns::available("flow_tracker_counts_on_a_veth_pair") {
        return;
    }
    let ns = Netns::new("flktrack");
    ns.veth_pair("in0", "in1");
    let flick = Flick::start(
        &ns,
        &["flow_tracker.flick"],
        &["wire=afpacket:in1"],
        "tracker",
    );
    let input = flick_packet_io::read_pcap(&testdata("tracker.pcap")).unwrap();
    send_and_collect(&ns, "in0", &input, None, 0);
    // Every frame read before stopping: the port's count says so.
    flick.dump_until(&flick.dump, |d| {
        d["ports"]["wire"]["rx_frames"].as_u64() == Some(input.len() as u64)
    });
    let dump = flick.finish();
    assert_eq!(dump["ports"]["wire"]["rx_frames"], input.len(), "{dump}");
    let want: Json = serde_json::from_slice(
        &std::fs::read(testdata("expected/tracker.flow_tracker.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(dump["globals"], want, "packets and bytes per flow");
}

#[test]
fn tracker_and_port_knocking_share_a_live_port() {
    share_a_live_port("afpacket", "tracker_and_port_knocking_share_a_live_port");
}

/// An AF_XDP queue takes one socket: the programs share one port, each
/// reading every frame through a fan-out.
#[test]
fn tracker_and_port_knocking_share_an_af_xdp_port() {
    share_a_live_port("afxdp", "tracker_and_port_knocking_share_an_af_xdp_port");
}

fn share_a_live_port(kind: &str, test: &str) {
    if !netns::available(test) {
        return;
    }
    let ns = Netns::new("flkshare");
    ns.veth_pair("in0", "in1");
    ns.veth_pair("out0", "out1");
    let programs = ["flow_tracker.flick", "port_knocking.flick"];
    let flick = Flick::start(
        &ns,
        &programs,
        &[
            &format!("wire={kind}:in1"),
            &format!("inside={kind}:in1"),
            &format!("outside={kind}:out0"),
        ],
        &format!("share-{kind}"),
    );
    let input = flick_packet_io::read_pcap(&testdata("knock.pcap")).unwrap();
    let expected = written(&testdata("expected/knock.port_knocking.pcap"));
    let passed = send_and_collect(&ns, "in0", &input, Some("out1"), expected.len());
    let dumps = flick.finish_programs(&programs);
    // Each program saw every frame once and did what it does alone.
    assert_eq!(
        passed, expected,
        "the frames the firewall passed; its ports: {}",
        dumps[1]["ports"]
    );
    let want = |name: &str| -> Json {
        serde_json::from_slice(&std::fs::read(testdata(&format!("expected/{name}"))).unwrap())
            .unwrap()
    };
    assert_eq!(
        dumps[0]["globals"],
        want("knock.flow_tracker.json"),
        "packets and bytes per flow; the tracker's ports: {}",
        dumps[0]["ports"]
    );
    assert_eq!(
        dumps[1]["globals"],
        want("knock.port_knocking.json"),
        "knock and flow tables"
    );
}

/// Frames in a pcap file `flick` wrote.
fn written(path: &Path) -> Vec<Vec<u8>> {
    flick_packet_io::read_pcap(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .map(|(f, _)| f)
        .collect()
}

#[test]
fn two_programs_share_a_tun_port() {
    if !netns::available("two_programs_share_a_tun_port") {
        return;
    }
    let ns = Netns::new("flktun");
    // The kernel sends nothing of its own (IPv6 router solicitations) on
    // the device flick makes.
    ns.sysctl("net.ipv6.conf.default.disable_ipv6=1");
    let out = Scratch::new("live-tun");
    let (new, all) = (out.0.join("new.pcap"), out.0.join("all.pcap"));
    let programs = ["flow_tracker.flick", "new_flows.flick"];
    let flick = Flick::start(
        &ns,
        &programs,
        &[
            "wire=tun:flt0",
            &format!("new=pcap-out:{}", new.display()),
            &format!("out=pcap-out:{}", all.display()),
        ],
        "tun",
    );
    ns.ip(&["addr", "add", "10.9.0.1/24", "dev", "flt0"]);
    ns.ip(&["link", "set", "flt0", "up"]);
    // Three flows of four datagrams, routed out through the device.
    let (flows, each) = (3, 4);
    ns.enter(|| {
        for _ in 0..flows {
            let socket = UdpSocket::bind("10.9.0.1:0").unwrap();
            for i in 0..each {
                socket
                    .send_to(&[i as u8; 20], SocketAddrV4::new([10, 9, 0, 2].into(), 9))
                    .unwrap();
            }
        }
    });
    // Every datagram read before stopping: the tracker's dump says so.
    let counted = |dump: &Json| -> i64 {
        dump["globals"]["packets"]
            .as_object()
            .map(|m| m.values().filter_map(Json::as_i64).sum())
            .unwrap_or(0)
    };
    flick.dump_until(&flick.program_dump("flow_tracker.flick"), |d| {
        counted(d) == flows * each
    });
    let dumps = flick.finish_programs(&programs);
    let packets = dumps[0]["globals"]["packets"].as_object().unwrap().clone();
    assert_eq!(
        packets.len(),
        flows as usize,
        "one entry per flow: {packets:?}"
    );
    assert!(
        packets.values().all(|n| n.as_i64() == Some(each)),
        "{each} datagrams in each flow: {packets:?}"
    );
    // The other program saw the same datagrams: each flow's first is new.
    let (new, all) = (written(&new), written(&all));
    assert_eq!(all.len(), (flows * each) as usize, "every datagram out");
    assert_eq!(new.len(), flows as usize, "each flow's first datagram");
    assert!(new.iter().all(|f| all.contains(f)));
}
