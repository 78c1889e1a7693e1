//! Helpers shared by the tests that run `flick` in front of real memcached
//! servers (Debian package `memcached`) and speak the binary protocol to it.

// Each test file compiles this module on its own and uses only some of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The workspace root, where `flick run` is started.
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Child processes killed when the test ends, however it ends.
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn wait_for(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the tests run as root, where memcached must be told `-u root`.
pub fn root() -> bool {
    std::env::var("USER").map(|u| u == "root").unwrap_or(false)
        || Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0"))
            .unwrap_or(false)
}

/// Starts a memcached on a free loopback port; returns the port.
pub fn memcached(procs: &mut Procs) -> u16 {
    for _ in 0..20 {
        if let Some(port) = try_memcached_on(procs, free_port()) {
            return port;
        }
    }
    panic!("memcached would not start");
}

/// Starts a memcached on loopback `port`; returns the port once it listens.
pub fn memcached_on(procs: &mut Procs, port: u16) -> u16 {
    // The port was just freed by a stopped server: give it a few tries.
    for _ in 0..20 {
        if try_memcached_on(procs, port).is_some() {
            return port;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("memcached would not start on port {port}");
}

/// Starts memcached on `port` and makes sure the server answering there is
/// the one started: tests run in parallel, and two may pick the same free
/// port.
fn try_memcached_on(procs: &mut Procs, port: u16) -> Option<u16> {
    let mut child = Command::new("memcached")
        .args(["-l", "127.0.0.1", "-p", &port.to_string()])
        .args(["-U", "0", "-t", "1", "-m", "16"])
        .args(if root() { &["-u", "root"][..] } else { &[][..] })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("memcached is installed (scripts/test.sh installs it)");
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return None; // it could not bind the port
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
pub fn memcached_pid(port: u16) -> Option<u32> {
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

/// Starts `flick run program` (relative to the workspace root) in front of
/// `backends`, with two workers; returns the port it listens on.
pub fn flick_run(procs: &mut Procs, program: &str, backends: &[u16]) -> u16 {
    let list: Vec<String> = backends.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args(["run", program, "--listen", "client=127.0.0.1:0"])
        .arg("--connect")
        .arg(format!("backends={}", list.join(",")))
        .args(["--workers", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    procs.0.push(child);
    let port = line.trim().rsplit(':').next().and_then(|p| p.parse().ok());
    port.unwrap_or_else(|| panic!("flick printed {line:?}"))
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
