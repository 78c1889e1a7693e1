//! What the platform's tests share: real memcached servers on loopback,
//! the paper's proxy served in-process, and binary-protocol helpers that
//! write into buffers the caller owns (so allocation counts stay clean).
//! Each test file compiles this module and uses part of it.
#![allow(dead_code)]

use flick_platform::{Loaded, Service, ServiceConfig};
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn memcached(procs: &mut Procs) -> u16 {
    for _ in 0..20 {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if let Some(port) = try_memcached_on(procs, port) {
            return port;
        }
    }
    panic!("memcached would not start");
}

/// Starts memcached on `port` and makes sure the server answering there is
/// the one started: tests run in parallel, and two may pick the same free
/// port.
fn try_memcached_on(procs: &mut Procs, port: u16) -> Option<u16> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false);
    let mut cmd = Command::new("memcached");
    cmd.args([
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-t",
        "1",
        "-m",
        "16",
    ]);
    if root {
        cmd.args(["-u", "root"]);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("memcached is installed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return None;
        }
        if let Some(pid) = memcached_pid(port) {
            if pid == child.id() {
                procs.0.push(child);
                return Some(port);
            }
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The pid of the memcached answering on `port`, from its `stats`.
fn memcached_pid(port: u16) -> Option<u32> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    std::io::Write::write_all(&mut s, b"stats\r\n").ok()?;
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    while !text.contains("END\r\n") {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    text.lines()
        .find_map(|l| l.strip_prefix("STAT pid "))
        .and_then(|v| v.trim().parse().ok())
}

pub fn proxy(backends: &[u16]) -> Service {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/memcached_proxy.flick"
    );
    let src = std::fs::read_to_string(path).unwrap();
    let (program, diags) = flick_syntax::parse(&src);
    assert!(diags.is_empty());
    let (checked, diags) = flick_check::check(&program);
    assert!(diags.is_empty());
    let grammar = flick_wire::Grammar::stock("memcached_binary").unwrap();
    let loaded = Loaded::new(&program, &checked, grammar).unwrap();
    Service::start(
        loaded,
        ServiceConfig {
            listen: vec![("client".into(), "127.0.0.1:0".parse().unwrap())],
            connect: vec![(
                "backends".into(),
                backends
                    .iter()
                    .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
                    .collect(),
            )],
            workers: 2,
            max_instances: 64,
            ..ServiceConfig::default()
        },
    )
    .unwrap()
}

pub fn request(op: u8, key: &[u8], value: &[u8], extras: &[u8], out: &mut Vec<u8>) {
    let body = extras.len() + key.len() + value.len();
    out.clear();
    out.extend_from_slice(&[0x80, op]);
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&(body as u32).to_be_bytes());
    out.extend_from_slice(&[0; 12]);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Reads one response into `buf`; returns its status.
pub fn response(s: &mut TcpStream, buf: &mut [u8]) -> u16 {
    s.read_exact(&mut buf[..24]).unwrap();
    let total = u32::from_be_bytes(buf[8..12].try_into().unwrap()) as usize;
    let status = u16::from_be_bytes([buf[6], buf[7]]);
    s.read_exact(&mut buf[24..24 + total]).unwrap();
    status
}
