//! A clean shutdown of the Memcached proxy served in-process: requests
//! already read are answered, then every client is closed.

use flick_platform::{Loaded, Service, ServiceConfig};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn memcached(procs: &mut Procs) -> u16 {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
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
    procs.0.push(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("memcached is installed"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "memcached did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    port
}

fn proxy(backends: &[u16]) -> Service {
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

fn request(op: u8, key: &[u8], value: &[u8], extras: &[u8], out: &mut Vec<u8>) {
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
fn response(s: &mut TcpStream, buf: &mut [u8]) -> u16 {
    s.read_exact(&mut buf[..24]).unwrap();
    let total = u32::from_be_bytes(buf[8..12].try_into().unwrap()) as usize;
    let status = u16::from_be_bytes([buf[6], buf[7]]);
    s.read_exact(&mut buf[24..24 + total]).unwrap();
    status
}

#[test]
fn a_drain_answers_what_was_read_and_closes_every_client() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs)];
    let service = proxy(&backends);
    let mut c = TcpStream::connect(service.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = Vec::new();
    let mut buf = vec![0u8; 4096];
    request(0x01, b"k", b"v", &[0; 8], &mut req);
    c.write_all(&req).unwrap();
    assert_eq!(response(&mut c, &mut buf), 0);
    // A request in flight when the drain starts still gets its answer.
    request(0x00, b"k", b"", b"", &mut req);
    c.write_all(&req).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    service.drain();
    assert_eq!(response(&mut c, &mut buf), 0);
    // Then the connection closes, while the service object still lives.
    let mut one = [0u8; 1];
    assert_eq!(c.read(&mut one).unwrap_or(1), 0, "closed by the drain");
    let deadline = Instant::now() + Duration::from_secs(5);
    while service.stats().graphs_live.load(Ordering::Relaxed) > 0 {
        assert!(Instant::now() < deadline, "the instance ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    // And nothing new is accepted.
    assert!(TcpStream::connect(service.local_addr())
        .map(|mut s| {
            s.set_read_timeout(Some(Duration::from_millis(500)))
                .unwrap();
            s.read(&mut one).map(|n| n == 0).unwrap_or(true)
        })
        .unwrap_or(true));
}
