//! Real peers for tests: memcached servers (Debian package `memcached`)
//! and nginx web servers (`nginx-light`) started on loopback ports and
//! killed when the test ends, however it ends; and plain Rust models of
//! the packet examples (`packet_model`), what their tests and benchmarks
//! compare Flick with; a counting allocator (`alloc`) for the tests
//! that prove a path allocates nothing; and a seeded generator (`rng`)
//! for test traffic and benchmark traces.
//!
//! For tests and benchmarks only: no library or product binary of the
//! workspace may depend on it, and it knows nothing of Flick's crates.

pub mod alloc;
pub mod flowblaze_model;
pub mod meter_model;
pub mod netns;
pub mod packet_model;
pub mod rng;
pub mod toxiproxy;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// A loopback port nothing listened on a moment ago, below 32768: ports
/// from 32768 up are the kernel's for outgoing connections, and a listener
/// there can collide with one under load. Ports are tried from a place
/// that differs by process and call, so parallel tests rarely meet.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    const FIRST: u32 = 20000;
    const SPAN: u32 = 32768 - FIRST;
    let seed = std::process::id().wrapping_mul(7919)
        ^ CALLS.fetch_add(1, Ordering::Relaxed).wrapping_mul(104729);
    for i in 0..SPAN {
        let port = (FIRST + (seed.wrapping_add(i)) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port below 32768");
}

/// A listener on a free loopback port below 32768 (see [`free_port`]).
pub fn listener() -> TcpListener {
    for _ in 0..100 {
        if let Ok(l) = TcpListener::bind(("127.0.0.1", free_port())) {
            return l;
        }
    }
    panic!("no free loopback port below 32768");
}

/// Waits up to 10 s for something to listen on loopback `port`.
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
    s.write_all(b"stats\r\n").ok()?;
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

/// Starts nginx serving the files of `root` on a free loopback port, with
/// the response header `X-Served-By: NAME`; returns the port. `/echo`
/// answers with what a proxy sent: the request's `X-Forwarded-For` and
/// `Connection` fields, and the backend connection's number and count of
/// requests. One process (no master), so killing it at the end of the
/// test leaves nothing behind.
pub fn nginx(procs: &mut Procs, root: &std::path::Path, name: &str) -> u16 {
    nginx_with(procs, root, name, "keepalive_requests 1000000;")
}

/// `nginx`, with `server` directives of the caller's instead of the
/// default `keepalive_requests 1000000;` (a server that closes its
/// connections after a few requests: `keepalive_requests 3;`).
pub fn nginx_with(procs: &mut Procs, root: &std::path::Path, name: &str, server: &str) -> u16 {
    for _ in 0..20 {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("flick-nginx-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("nginx.conf");
        let d = dir.display();
        std::fs::write(
            &conf,
            format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\n\
                 error_log {d}/error.log;\npid {d}/nginx.pid;\n\
                 events {{ worker_connections 1024; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n\
                 proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n\
                 uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
                 server {{\n    listen 127.0.0.1:{port};\n    root {};\n\
                 {server}\n    add_header X-Served-By {name};\n\
                 location = /echo {{ return 200 \"xff=$http_x_forwarded_for \
                 connection=$http_connection conn=$connection \
                 requests=$connection_requests\\n\"; }}\n  }}\n}}\n",
                root.display()
            ),
        )
        .unwrap();
        let mut child = Command::new("nginx")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx is installed (scripts/test.sh installs nginx-light)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                break; // it could not bind the port
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                procs.0.push(child);
                return port;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("nginx would not start");
}
