//! Helpers shared by the tests of the `flick` binary: `flick run` in front
//! of real memcached servers (Debian package `memcached`) and the binary
//! protocol spoken to it (here), `flick serve` and its API (`serve`), HTTP
//! clients and the test programs' HTTP types (`http`), `flick run` over
//! packet ports, scratch directories and golden files (`run`), and frames
//! on live ports in a network namespace (`live`).

// Each test file compiles this module on its own and uses only some of it.
#![allow(dead_code, unused_imports, unused_macros)]

pub mod http;
pub mod live;
mod run;
pub use run::*;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The workspace root, where `flick run` is started.
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

pub use flick_testkit::{
    free_port, listener, memcached, memcached_on, memcached_pid, root, wait_for, Procs,
};

/// Starts `flick run program` (relative to the workspace root) in front of
/// `backends`, with two workers; returns the port it listens on.
pub fn flick_run(procs: &mut Procs, program: &str, backends: &[u16]) -> u16 {
    flick_run_with(procs, program, backends, &[])
}

/// `flick_run` with more flags.
pub fn flick_run_with(procs: &mut Procs, program: &str, backends: &[u16], more: &[&str]) -> u16 {
    let list: Vec<String> = backends.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let connect = format!("backends={}", list.join(","));
    let listen = format!("client=127.0.0.1:{}", free_port());
    let mut args = vec!["run", program, "--listen", &listen, "--connect", &connect];
    args.extend(more);
    start_flick(procs, &args)
}

/// Starts `flick ARGS` (in the workspace root) with two workers, and
/// returns the port it says it listens on.
pub fn start_flick(procs: &mut Procs, args: &[&str]) -> u16 {
    let child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args(args)
        .args(["--workers", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    listening_port(procs, child)
}

/// Keeps `child`, a `flick` started with its standard output piped, in
/// `procs`, and returns the port its first line says it listens on.
pub fn listening_port(procs: &mut Procs, mut child: Child) -> u16 {
    let line = first_line(&mut child);
    procs.0.push(child);
    let port = line.trim().rsplit(':').next().and_then(|p| p.parse().ok());
    port.unwrap_or_else(|| panic!("flick printed {line:?}"))
}

/// The first line `child` printed on its piped standard output.
pub fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line
}

/// An HTTP program that counts requests in a `global` and answers with
/// the count as the body and `version` as the reason phrase: what the
/// reload tests swap in and out.
pub fn counting_program(version: &str) -> String {
    format!(
        "\
grammar http

type request: record
  target : string

type simple_response: record
  status : integer {{size=2}}
  reason : string
  body : string

proc Hits: (request/simple_response client)
  global hits := 0
  | client => respond(hits, client)

fun respond: (hits: ref integer, -/simple_response client, req: request) -> ()
  hits := hits + 1
  simple_response(200, \"{version}\", to_string(hits)) => client
"
    )
}

/// Starts `flick run ARGS` on `port` with two workers, logging at `info`;
/// the child, and its standard error collected as it comes.
pub fn run_logging(args: &[&str], port: u16) -> (Child, Arc<Mutex<String>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .arg("run")
        .args(args)
        .args(["--listen", &format!("client=127.0.0.1:{port}")])
        .args(["--workers", "2"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = collect_stderr(&mut child);
    (child, log)
}

/// `child`'s standard error (piped), collected as it comes by a thread
/// of its own, so that the child never blocks on a full pipe.
pub fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    let err = child.stderr.take().unwrap();
    let sink = log.clone();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(err);
        let mut line = String::new();
        while lines.read_line(&mut line).unwrap_or(0) > 0 {
            sink.lock().unwrap().push_str(&line);
            line.clear();
        }
    });
    log
}

/// Sends `child` SIGHUP (a `flick run` reloads its program).
pub fn hup(child: &Child) {
    let sent = Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// A loopback connection to `port` whose reads give up after 10 s.
pub fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A binary-protocol request with opaque 0 and cas 0.
pub fn request(op: u8, key: &[u8], value: &[u8], extras: &[u8]) -> Vec<u8> {
    request_with_opaque(op, key, value, extras, 0)
}

/// A binary-protocol request carrying `opaque`, with cas 0.
pub fn request_with_opaque(
    op: u8,
    key: &[u8],
    value: &[u8],
    extras: &[u8],
    opaque: u32,
) -> Vec<u8> {
    let body = extras.len() + key.len() + value.len();
    let mut r = vec![0x80, op];
    r.extend_from_slice(&(key.len() as u16).to_be_bytes());
    r.push(extras.len() as u8);
    r.extend_from_slice(&[0, 0, 0]);
    r.extend_from_slice(&(body as u32).to_be_bytes());
    r.extend_from_slice(&opaque.to_be_bytes());
    r.extend_from_slice(&[0; 8]);
    r.extend_from_slice(extras);
    r.extend_from_slice(key);
    r.extend_from_slice(value);
    r
}

/// The 24-byte header of one response.
pub fn response_header(s: &mut TcpStream) -> [u8; 24] {
    let mut h = [0u8; 24];
    s.read_exact(&mut h).unwrap();
    h
}

/// The status in response header `h`.
pub fn status(h: &[u8; 24]) -> u16 {
    u16::from_be_bytes([h[6], h[7]])
}

/// The body response header `h` announces, read from `s`: (key, value).
pub fn response_body(s: &mut TcpStream, h: &[u8; 24]) -> (Vec<u8>, Vec<u8>) {
    let total = u32::from_be_bytes(h[8..12].try_into().unwrap()) as usize;
    let (keylen, extras) = (u16::from_be_bytes([h[2], h[3]]) as usize, h[4] as usize);
    let mut body = vec![0; total];
    s.read_exact(&mut body).unwrap();
    let value = body.split_off(extras + keylen);
    (body.split_off(extras), value)
}

/// (status, value) of one response.
pub fn response(s: &mut TcpStream) -> (u16, Vec<u8>) {
    let h = response_header(s);
    let (_, value) = response_body(s, &h);
    (status(&h), value)
}

/// `memccapable FLAG` (`-b` binary, `-a` ASCII) against `port`: each test's
/// name and whether it passed. Bounded in time whatever happens.
pub fn memccapable(port: u16, flag: &str) -> Vec<(String, bool)> {
    // memccapable prints a test's name on stdout and a failure on stderr:
    // one stream keeps them on one line.
    let out = Command::new("timeout")
        .args(["120", "sh", "-c"])
        .arg(format!("memccapable {flag} -h 127.0.0.1 -p {port} 2>&1"))
        .output()
        .expect("memccapable is installed (libmemcached-tools)");
    // Each test's name is followed, possibly after messages and the
    // summary, by `[pass]` or `[FAIL]`.
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut results = Vec::new();
    let mut current = None;
    for w in words.windows(2) {
        match w[0] {
            "binary" | "ascii" => current = Some(format!("{} {}", w[0], w[1])),
            "[pass]" | "[FAIL]" => {
                if let Some(name) = current.take() {
                    results.push((name, w[0] == "[pass]"));
                }
            }
            _ => {}
        }
    }
    if let (Some(name), Some(last)) = (current, words.last()) {
        results.push((name, *last == "[pass]"));
    }
    results
}

/// Every test `memccapable` passes directly against one memcached also
/// passes through the proxy.
pub fn same_passes(direct: &[(String, bool)], proxied: &[(String, bool)]) {
    assert!(direct.len() >= 20, "memccapable ran: {direct:?}");
    for (name, _) in direct.iter().filter(|(_, passed)| *passed) {
        let through = proxied.iter().find(|(n, _)| n == name).map(|(_, p)| *p);
        assert_eq!(
            through,
            Some(true),
            "{name} passes directly but not through the proxy: {proxied:?}"
        );
    }
}

/// Reads from `s` until what came ends with `end`, or the peer closes;
/// panics on a read error (a connection from `connect` gives up after
/// 10 s).
pub fn read_until(s: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(end) {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("{e} after {:?}", String::from_utf8_lossy(&got)),
        }
    }
    got
}

pub mod serve;
