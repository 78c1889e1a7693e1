//! The paper's cache router (Listing 1), run by `flick run` in front of two
//! real memcached servers (Debian package `memcached`). The program names no
//! grammar: its annotated `cmd` record is compiled to one. A GETK reply is
//! cached by the router, and later GETKs for the key are answered without
//! asking the backend, whose `get_hits` stays put.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Child processes killed when the test ends, however it ends.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn memcached(procs: &mut Procs) -> u16 {
    let port = free_port();
    let child = Command::new("memcached")
        .args([
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
        ])
        .args(if root() { &["-u", "root"][..] } else { &[][..] })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("memcached is installed (scripts/test.sh installs it)");
    procs.0.push(child);
    wait_for(port);
    port
}

fn root() -> bool {
    std::env::var("USER").map(|u| u == "root").unwrap_or(false)
        || Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0"))
            .unwrap_or(false)
}

/// Starts the cache router in front of `backends`; returns its port.
fn flick_router(procs: &mut Procs, backends: &[u16]) -> u16 {
    let list: Vec<String> = backends.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .args([
            "run",
            "examples/memcached_cache_router.flick",
            "--listen",
            "client=127.0.0.1:0",
        ])
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

fn request(op: u8, key: &[u8], value: &[u8], extras: &[u8], opaque: u32) -> Vec<u8> {
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

/// One response.
#[derive(Debug, PartialEq)]
struct Response {
    opcode: u8,
    status: u16,
    key: Vec<u8>,
    value: Vec<u8>,
}

fn response(s: &mut TcpStream) -> Response {
    let mut h = [0u8; 24];
    s.read_exact(&mut h).unwrap();
    assert_eq!(h[0], 0x81, "a response");
    let total = u32::from_be_bytes(h[8..12].try_into().unwrap()) as usize;
    let (keylen, extras) = (u16::from_be_bytes([h[2], h[3]]) as usize, h[4] as usize);
    let mut body = vec![0; total];
    s.read_exact(&mut body).unwrap();
    Response {
        opcode: h[1],
        status: u16::from_be_bytes([h[6], h[7]]),
        key: body[extras..extras + keylen].to_vec(),
        value: body[extras + keylen..].to_vec(),
    }
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// The `get_hits` counter of a memcached server, asked in ASCII.
fn get_hits(port: u16) -> u64 {
    let mut s = connect(port);
    s.write_all(b"stats\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut hits = None;
    loop {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "stats ended early");
        let line = line.trim_end();
        if line == "END" {
            break;
        }
        if let Some(n) = line.strip_prefix("STAT get_hits ") {
            hits = n.parse().ok();
        }
    }
    hits.expect("memcached reports get_hits")
}

#[test]
fn getk_replies_are_cached_by_the_router() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs), memcached(&mut procs)];
    let router = flick_router(&mut procs, &backends);
    let key = b"cached:key";
    let value = b"a value worth caching";
    // The program's `hash(req.key) mod len(backends)`.
    let target = ((flick_exec::fnv1a(key) >> 1) % 2) as usize;

    let mut c = connect(router);
    // SET goes through the router to the backend the hash names.
    c.write_all(&request(0x01, key, value, &[0; 8], 1)).unwrap();
    let set = response(&mut c);
    assert_eq!((set.opcode, set.status), (0x01, 0), "{set:?}");
    let mut direct = connect(backends[target]);
    direct.write_all(&request(0x0c, key, b"", b"", 2)).unwrap();
    assert_eq!(
        response(&mut direct).value,
        value,
        "stored on backend {target}"
    );
    let mut other = connect(backends[1 - target]);
    other.write_all(&request(0x0c, key, b"", b"", 3)).unwrap();
    assert_eq!(response(&mut other).status, 1, "not on the other backend");

    let hits = get_hits(backends[target]);
    let expected = Response {
        opcode: 0x0c,
        status: 0,
        key: key.to_vec(),
        value: value.to_vec(),
    };
    // The first GETK asks the backend, and the router caches the reply.
    c.write_all(&request(0x0c, key, b"", b"", 4)).unwrap();
    assert_eq!(response(&mut c), expected);
    assert_eq!(get_hits(backends[target]), hits + 1, "the backend answered");
    // The later ones are answered from the cache, on this connection and
    // on another: `cache` is global state.
    let mut c2 = connect(router);
    for i in 0..5 {
        let s = if i % 2 == 0 { &mut c } else { &mut c2 };
        s.write_all(&request(0x0c, key, b"", b"", 5 + i)).unwrap();
        assert_eq!(response(s), expected, "GETK {i} from the cache");
    }
    assert_eq!(
        get_hits(backends[target]),
        hits + 1,
        "the backend was not asked again"
    );
    assert_eq!(get_hits(backends[1 - target]), 0);

    // Other commands still go to the backend: a GET (not GETK) is a hit there.
    c.write_all(&request(0x00, key, b"", b"", 20)).unwrap();
    let get = response(&mut c);
    assert_eq!(
        (get.opcode, get.status, get.value),
        (0x00, 0, value.to_vec())
    );
    assert_eq!(get_hits(backends[target]), hits + 2);
}
