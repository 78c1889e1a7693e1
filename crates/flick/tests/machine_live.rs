//! A machine while it runs: `flick run` of FlowBlaze's port knocking on
//! AF_PACKET ports (veth pairs in a network namespace of the test's own),
//! frames sent in by the test; `--metrics` answers with the frames in,
//! out and dropped per port and the contexts held, and SIGUSR1 writes the
//! dump without stopping the run, twice, each as it stands.
//!
//! Needs root and `ip` (iproute2): under CI (`CI=true`) a missing one
//! fails the test, elsewhere it is skipped with a message.

use flick_packet_io::PortSpec;
use flick_testkit::netns::{self, Netns};
use serde_json::Value as Json;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
/// The namespace is the test's own, so a fixed port is free.
const METRICS: &str = "127.0.0.1:19464";

/// `flick run` inside the namespace, killed on drop.
struct Flick {
    child: Child,
    dump: PathBuf,
    log: PathBuf,
}

impl Flick {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
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

fn signal(child: &Child, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status();
}

/// An Ethernet/IPv4/TCP SYN from `src` to `dst` port `dport`, checksummed.
fn syn(src: [u8; 4], dst: [u8; 4], dport: u16) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
    let mut ip = vec![0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0];
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let sum = ip
        .chunks(2)
        .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
        .sum::<u32>();
    let sum = !(((sum & 0xffff) + (sum >> 16)) as u16);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    f.resize(60, 0);
    f
}

/// `GET /metrics` inside the namespace; empty while nothing answers.
fn scrape(ns: &Netns) -> String {
    ns.enter(|| {
        let Ok(mut s) = std::net::TcpStream::connect(METRICS) else {
            return String::new();
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: flick\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    })
}

/// A sample's value in a scrape, if it is there.
fn sample(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Scrapes until `name` reads `want`, at most 5 s; the last scrape.
fn wait_for(ns: &Netns, name: &str, want: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = scrape(ns);
        if sample(&text, name) == Some(want) || Instant::now() > deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends SIGUSR1 and waits (at most 5 s) for the dump file to appear.
fn dump_now(flick: &Flick) -> Json {
    let _ = std::fs::remove_file(&flick.dump);
    signal(&flick.child, "USR1");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !flick.dump.exists() {
        assert!(
            Instant::now() < deadline,
            "no dump 5 s after SIGUSR1: {}",
            flick.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    serde_json::from_slice(&std::fs::read(&flick.dump).unwrap()).unwrap()
}

#[test]
fn sigusr1_dumps_and_metrics_answer_while_a_machine_runs() {
    if !netns::available("sigusr1_dumps_and_metrics_answer_while_a_machine_runs") {
        return;
    }
    let ns = Netns::new("flkmlive");
    ns.ip(&["link", "set", "lo", "up"]);
    ns.veth_pair("out0", "out1");
    ns.veth_pair("in0", "in1");
    let dump = std::env::temp_dir().join(format!("flick-mlive-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&dump);
    let log = dump.with_extension("log");
    let child = ns
        .command(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args([
            "run",
            "examples/flowblaze/port_knocking.flick",
            "--workers",
            "1",
            "--port",
            "outside=afpacket:out1",
            "--port",
            "inside=afpacket:in0",
            "--metrics",
            METRICS,
            "--dump",
        ])
        .arg(&dump)
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let mut flick = Flick { child, dump, log };
    // Ready once metrics answer and both packet sockets are bound.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if netns::bound_packet_sockets(flick.child.id()) >= 2 && !scrape(&ns).is_empty() {
            break;
        }
        assert!(
            flick.running() && Instant::now() < deadline,
            "flick not ready in 10 s: {}",
            flick.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (host, server) = ([198, 51, 100, 7], [10, 0, 0, 22]);
    let send = |ports: &[u16]| {
        ns.enter(|| {
            let mut tx = flick_packet_io::open(&PortSpec::AfPacket("out0".into()))
                .unwrap()
                .tx
                .unwrap();
            for &p in ports {
                tx.send(&syn(host, server, p), 0).unwrap();
                tx.flush().unwrap();
            }
        })
    };
    // Three knocks (dropped) open the door; SSH then passes inside.
    send(&[1111, 2222, 3333, 22]);
    let text = wait_for(&ns, "flick_machine_tx_frames_total{port=\"inside\"}", 1);
    assert_eq!(
        sample(&text, "flick_machine_rx_frames_total{port=\"outside\"}"),
        Some(4),
        "{text}"
    );
    assert_eq!(
        sample(&text, "flick_machine_tx_frames_total{port=\"inside\"}"),
        Some(1),
        "{text}"
    );
    assert_eq!(
        sample(&text, "flick_machine_dropped_total{port=\"outside\"}"),
        Some(3),
        "{text}"
    );
    assert_eq!(
        sample(&text, "flick_machine_contexts{stage=\"knocking\"}"),
        Some(1),
        "{text}"
    );
    assert_eq!(sample(&text, "flick_machine_table_full_total"), Some(0));
    assert!(
        text.contains("# TYPE flick_machine_contexts gauge"),
        "{text}"
    );
    let first = dump_now(&flick);
    assert!(flick.running(), "SIGUSR1 stopped the run: {}", flick.log());
    assert_eq!(first["frames"], 4, "{first}");
    let knocking = first["stages"]["knocking"].as_array().unwrap();
    assert_eq!(knocking.len(), 1, "{first}");
    assert_eq!(knocking[0]["state"], "open");
    assert_eq!(knocking[0]["key"]["ipv4.src"], 0xc633_6407u64);
    // SSH twice more: the second dump has them.
    send(&[22, 22]);
    wait_for(&ns, "flick_machine_rx_frames_total{port=\"outside\"}", 6);
    let second = dump_now(&flick);
    assert!(flick.running());
    assert_eq!(second["frames"], 6, "{second}");
    assert_eq!(second["sent"]["2"], 3, "{second}");
    // SIGINT ends the run, and the final dump is written as before.
    let _ = std::fs::remove_file(&flick.dump);
    signal(&flick.child, "INT");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = flick.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "flick did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{}", flick.log());
    let last: Json = serde_json::from_slice(&std::fs::read(&flick.dump).unwrap()).unwrap();
    assert_eq!(last["frames"], 6, "{last}");
}
