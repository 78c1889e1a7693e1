//! `flick table load` against a running port-knocking machine: AF_PACKET
//! ports on veth pairs in a network namespace of the test's own, the
//! frames sent by the test, a batch at a time, so tables are replaced
//! between known frames. A variant that opens another port takes over
//! while the hosts' knock states carry over; a program with another key,
//! or with a syntax error, is refused and the old tables run on; SIGHUP
//! loads the running file again.
//!
//! Needs root and `ip` (iproute2): under CI (`CI=true`) a missing one
//! fails the test, elsewhere it is skipped with a message.

use flick_packet_io::{PortSpec, RecvStatus};
use flick_testkit::netns::{self, Netns};
use flick_testkit::packet_model::tcp_syn;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
const FLICK: &str = env!("CARGO_BIN_EXE_flick");

/// A directory of the test's own, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("flick-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            Path::new(ROOT).join("examples/flowblaze/headers.xlh"),
            dir.join("headers.xlh"),
        )
        .unwrap();
        Scratch(dir)
    }

    /// port_knocking.xl with `edit` applied, written as `name`.
    fn knocking(&self, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
        let text =
            std::fs::read_to_string(Path::new(ROOT).join("examples/flowblaze/port_knocking.xl"))
                .unwrap();
        let path = self.0.join(name);
        std::fs::write(&path, edit(text)).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `flick run` inside the namespace, killed on drop.
struct Flick {
    child: Child,
    log: PathBuf,
    dump: PathBuf,
}

impl Flick {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it with SIGINT; its dump.
    fn finish(mut self) -> Json {
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
        serde_json::from_slice(&std::fs::read(&self.dump).unwrap()).unwrap()
    }
}

impl Drop for Flick {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status();
}

/// The (host, dport) pairs of the frames the firewall let in.
fn passed(frames: &[Vec<u8>]) -> Vec<(u8, u16)> {
    frames
        .iter()
        .map(|f| (f[29], u16::from_be_bytes([f[36], f[37]])))
        .collect()
}

/// Sends `frames` from outside (into `out1`), then reads what reaches the
/// inside (`in0`) until `expected` came and nothing more for 300 ms, or
/// 5 s pass.
fn knock(ns: &Netns, frames: &[Vec<u8>], expected: usize) -> Vec<(u8, u16)> {
    ns.enter(|| {
        let mut rx = flick_packet_io::open(&PortSpec::AfPacket("in0".into()))
            .unwrap()
            .rx
            .unwrap();
        let mut tx = flick_packet_io::open(&PortSpec::AfPacket("out1".into()))
            .unwrap()
            .tx
            .unwrap();
        for f in frames {
            tx.send(f, 0).unwrap();
            tx.flush().unwrap();
        }
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut quiet_since = Instant::now();
        while Instant::now() < deadline {
            match rx.recv_batch(64, &mut |f, _| got.push(f.to_vec())).unwrap() {
                RecvStatus::Frames(n) if n > 0 => quiet_since = Instant::now(),
                _ => {
                    if got.len() >= expected && quiet_since.elapsed() > Duration::from_millis(300) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        passed(&got)
    })
}

fn table_load(control: &Path, file: &Path, json: bool) -> Output {
    let mut cmd = Command::new(FLICK);
    cmd.args(["table", "load", "--control"]).arg(control);
    if json {
        cmd.arg("--json");
    }
    cmd.arg(file).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn tables_replaced_while_knock_states_carry_over() {
    if !netns::available("tables_replaced_while_knock_states_carry_over") {
        return;
    }
    let scratch = Scratch::new("tableload");
    let running = scratch.knocking("knock.xl", |t| t);
    // Another allowed port: same key, registers and states.
    let variant = scratch.knocking("variant.xl", |t| {
        t.replace("tcp.dport == SSH", "tcp.dport == 2200")
    });
    let other_key = scratch.knocking("other_key.xl", |t| {
        t.replace("setFlowKey(ipv4.src)", "setFlowKey(ipv4.dst)")
    });
    let broken = scratch.knocking("broken.xl", |t| {
        t.replace("State open {", "State open {{ (")
    });
    let control = scratch.0.join("control.sock");
    let dump = scratch.0.join("dump.json");
    let log = scratch.0.join("flick.log");

    let ns = Netns::new("flktable");
    ns.veth_pair("out0", "out1");
    ns.veth_pair("in0", "in1");
    let mut cmd = ns.command(FLICK);
    cmd.current_dir(ROOT)
        .arg("run")
        .arg(&running)
        .args([
            "--workers",
            "2",
            "--port",
            "1=afpacket:out0",
            "--port",
            "2=afpacket:in1",
        ])
        .arg("--control")
        .arg(&control)
        .arg("--dump")
        .arg(&dump)
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
    let flick = Flick {
        child: cmd.spawn().unwrap(),
        log,
        dump,
    };
    // Ready once both packet sockets are bound and the control socket
    // listens.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if netns::bound_packet_sockets(flick.child.id()) >= 2 && control.exists() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "flick did not start: {}",
            flick.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Host 1 knocks twice (knocked2); host 2 knocks thrice and reaches SSH.
    let got = knock(
        &ns,
        &[
            tcp_syn(1, 1111),
            tcp_syn(1, 2222),
            tcp_syn(2, 1111),
            tcp_syn(2, 2222),
            tcp_syn(2, 3333),
            tcp_syn(2, 22),
            tcp_syn(2, 2200),
        ],
        1,
    );
    assert_eq!(got, [(2, 22)], "the old tables: {}", flick.log());

    let out = table_load(&control, &variant, true);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let answer: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["applied"], true, "{answer}");
    assert!(answer["micros"].as_u64().is_some(), "{answer}");

    // Host 1 ends its knock where it left off; host 2 is still open; the
    // new tables pass 2200, not 22.
    let got = knock(
        &ns,
        &[
            tcp_syn(1, 3333),
            tcp_syn(1, 22),
            tcp_syn(1, 2200),
            tcp_syn(2, 22),
            tcp_syn(2, 2200),
        ],
        2,
    );
    assert_eq!(
        got,
        [(1, 2200), (2, 2200)],
        "the new tables: {}",
        flick.log()
    );

    // Another key: refused, the variant keeps running.
    let out = table_load(&control, &other_key, false);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "another key was applied");
    assert!(err.contains("key"), "{err}");
    assert!(err.contains("not applied"), "{err}");
    // A syntax error: refused with its diagnostic.
    let out = table_load(&control, &broken, false);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "a broken program was applied");
    assert!(err.contains("broken.xl"), "{err}");
    assert!(
        err.contains('^'),
        "the diagnostic points at the place: {err}"
    );
    // Neither a request flick does not know, nor one too long, is served.
    for request in ["dump\n".to_string(), format!("load {}\n", "x".repeat(5000))] {
        use std::io::{Read, Write};
        let mut conn = std::os::unix::net::UnixStream::connect(&control).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = conn.read_to_string(&mut answer);
        let answer: Json = serde_json::from_str(answer.trim()).unwrap();
        assert_eq!(answer["applied"], false, "{answer}");
    }
    let got = knock(&ns, &[tcp_syn(1, 22), tcp_syn(2, 2200)], 1);
    assert_eq!(got, [(2, 2200)], "the variant still runs: {}", flick.log());

    // SIGHUP loads the running file again: now it opens 2300.
    scratch.knocking("knock.xl", |t| {
        t.replace("tcp.dport == SSH", "tcp.dport == 2300")
    });
    signal(&flick.child, "HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !flick.log().contains("SIGHUP: tables of") {
        assert!(Instant::now() < deadline, "no SIGHUP line: {}", flick.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(flick.log().contains("applied in"), "{}", flick.log());
    let got = knock(&ns, &[tcp_syn(1, 2200), tcp_syn(2, 2300)], 1);
    assert_eq!(got, [(2, 2300)], "the reloaded file: {}", flick.log());

    let log = flick.log();
    let dump = flick.finish();
    let states: Vec<&str> = dump["stages"]["knocking"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["open", "open"], "{dump}");
    assert!(!log.contains("a table replacement was refused"), "{log}");
}
