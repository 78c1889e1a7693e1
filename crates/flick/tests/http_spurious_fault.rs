//! Well-formed requests through the HTTP load balancer
//! (`examples/http_lb.flick`) to a backend that is up get the backend's
//! response, never a fault reply of the balancer's own (`502`, `503` or
//! `504 Backend Error`): many clients at once, keep-alive and not, GET and
//! POST, against nginx as `flick_testkit` starts it, and against one that
//! closes its connections every few requests (`keepalive_requests`) or
//! when they idle a moment (`keepalive_timeout`).
//!
//! Each run is bounded in time; the balancer's log is kept, and printed
//! with the counts when a fault reply comes.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::Procs;

/// What the clients saw.
#[derive(Default)]
struct Seen {
    ok: AtomicUsize,
    /// The balancer's own fault replies, by status.
    faults: [AtomicUsize; 3],
    /// Fault replies to GET requests (sent again by the balancer when
    /// lost with a connection) and to POST requests (not sent again).
    fault_gets: AtomicUsize,
    fault_posts: AtomicUsize,
    /// Other answers: none, or not 200.
    other: AtomicUsize,
    /// Of those: connecting or writing failed, the connection ended with
    /// no response, a status other than 200 or a fault reply.
    other_kinds: [AtomicUsize; 3],
}

/// Starts `flick run examples/http_lb.flick` in front of `backend`, its
/// log (standard error) written to `log`; returns its port.
fn balancer(procs: &mut Procs, backend: u16, log: &std::path::Path) -> u16 {
    let listen = format!("client=127.0.0.1:{}", support::free_port());
    let connect = format!("backends=127.0.0.1:{backend}");
    let child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(support::ROOT)
        .args(["run", "examples/http_lb.flick", "--listen", &listen])
        .args(["--connect", &connect, "--workers", "2"])
        .args(["--response-timeout-ms", "5000"])
        .args(match std::env::var_os("HTTP_SPURIOUS_DEBUG") {
            Some(_) => &["--log-level", "debug"][..],
            None => &[][..],
        })
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    support::listening_port(procs, child)
}

/// One response's status, and whether the connection stays open after it;
/// `None` if the connection ended first.
fn response(r: &mut BufReader<TcpStream>) -> Option<(u16, bool)> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
    let http10 = line.starts_with("HTTP/1.0");
    let (mut length, mut close) = (None, http10);
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end().to_ascii_lowercase();
        if h.is_empty() {
            break;
        }
        if let Some(v) = h.strip_prefix("content-length:") {
            length = v.trim().parse::<usize>().ok();
        }
        if h.starts_with("connection:") {
            close = h.contains("close");
        }
    }
    match length {
        Some(n) => r.read_exact(&mut vec![0; n]).ok()?,
        // A fault reply has no body and closes the connection.
        None => close = true,
    }
    Some((status, !close))
}

/// One client: connections of 1 to 6 requests (GET, and POST with a
/// body), the last sometimes with `Connection: close`, until `until`.
fn client(port: u16, until: Instant, n: usize, seen: &Seen) {
    let mut k = n;
    while Instant::now() < until {
        let Ok(s) = TcpStream::connect(("127.0.0.1", port)) else {
            seen.other.fetch_add(1, Ordering::Relaxed);
            seen.other_kinds[0].fetch_add(1, Ordering::Relaxed);
            continue;
        };
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        let count = 1 + k % 6;
        for i in 0..count {
            k = k.wrapping_mul(31).wrapping_add(7);
            let close = i + 1 == count && k.is_multiple_of(3);
            let conn = if close { "Connection: close\r\n" } else { "" };
            let get = k.is_multiple_of(2);
            let req = if get {
                format!("GET /echo?n={n}&i={i} HTTP/1.1\r\nHost: t\r\n{conn}\r\n")
            } else {
                format!(
                    "POST /echo?n={n}&i={i} HTTP/1.1\r\nHost: t\r\n{conn}Content-Length: 5\r\n\r\nhello"
                )
            };
            if w.write_all(req.as_bytes()).is_err() {
                seen.other.fetch_add(1, Ordering::Relaxed);
                seen.other_kinds[0].fetch_add(1, Ordering::Relaxed);
                break;
            }
            match response(&mut r) {
                Some((200, open)) => {
                    seen.ok.fetch_add(1, Ordering::Relaxed);
                    if !open {
                        break;
                    }
                }
                Some((status @ 502..=504, _)) => {
                    seen.faults[(status - 502) as usize].fetch_add(1, Ordering::Relaxed);
                    match get {
                        true => seen.fault_gets.fetch_add(1, Ordering::Relaxed),
                        false => seen.fault_posts.fetch_add(1, Ordering::Relaxed),
                    };
                    break;
                }
                got => {
                    seen.other.fetch_add(1, Ordering::Relaxed);
                    let kind = if got.is_none() { 1 } else { 2 };
                    if got.is_none() && std::env::var_os("HTTP_SPURIOUS_DEBUG").is_some() {
                        eprintln!(
                            "no response to {}{}",
                            req.lines().next().unwrap_or(""),
                            if close { " (Connection: close)" } else { "" }
                        );
                    }
                    seen.other_kinds[kind].fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
}

/// Runs `clients` clients for `secs` seconds through a balancer in front
/// of an nginx with `server` directives; panics, with the counts and the
/// balancer's fault log lines, if any request got a fault reply (or,
/// where `faults_allowed`, if any request got no answer at all).
fn no_fault_replies(name: &str, server: &str, clients: usize, secs: u64) {
    run_clients(name, server, clients, secs, false)
}

fn run_clients(name: &str, server: &str, clients: usize, secs: u64, faults_allowed: bool) {
    let mut procs = Procs(Vec::new());
    let root = std::env::temp_dir().join(format!("flick-spurious-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let backend = flick_testkit::nginx_with(&mut procs, &root, "a", server);
    let log = root.join("flick.log");
    let port = balancer(&mut procs, backend, &log);
    let seen = Arc::new(Seen::default());
    let until = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..clients)
        .map(|n| {
            let seen = seen.clone();
            std::thread::spawn(move || client(port, until, n, &seen))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let faults: Vec<usize> = seen
        .faults
        .iter()
        .map(|f| f.load(Ordering::Relaxed))
        .collect();
    let (ok, other) = (
        seen.ok.load(Ordering::Relaxed),
        seen.other.load(Ordering::Relaxed),
    );
    drop(procs);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("fault"))
        .take(40)
        .collect();
    eprintln!(
        "{name}: {ok} answered 200; fault replies 502: {}, 503: {}, 504: {} (to GET {}, to POST {}); \
         other: {other} (connect or write failed {}, no response {}, another status {})",
        faults[0],
        faults[1],
        faults[2],
        seen.fault_gets.load(Ordering::Relaxed),
        seen.fault_posts.load(Ordering::Relaxed),
        seen.other_kinds[0].load(Ordering::Relaxed),
        seen.other_kinds[1].load(Ordering::Relaxed),
        seen.other_kinds[2].load(Ordering::Relaxed)
    );
    assert!(ok > 0, "{name}: nothing answered");
    let counted = match faults_allowed {
        true => 0,
        false => faults.iter().sum::<usize>(),
    };
    assert_eq!(
        counted + other,
        0,
        "{name}: {ok} answered 200, fault replies [502, 503, 504] {faults:?}, other {other}; \
         the balancer's log:\n{}",
        lines.join("\n")
    );
}

#[test]
fn a_backend_that_keeps_its_connections() {
    no_fault_replies("keeps", "keepalive_requests 1000000;", 32, 6);
}

#[test]
fn a_backend_that_closes_its_connections_every_few_requests() {
    no_fault_replies("closes", "keepalive_requests 7;", 32, 6);
}

/// Known to fail: a backend that closes a keep-alive connection as it
/// idles (here after 1 ms, nginx's `keepalive_timeout`, under the
/// balancer's smallest idle limit) loses the request the balancer writes
/// on it as it closes (one whose close is already in its socket is looked
/// at and not taken). A GET is sent again once, over a new connection; a
/// POST gets 502, as nginx's own proxy answers. In 6 s of 32 clients
/// (debug build, about 18,000 requests): 543 to 717 get 502, all POSTs
/// (833 to 1,000 before the new connection for a GET sent again).
/// `HTTP_SPURIOUS_DEBUG=1` prints each request with no response and runs
/// the balancer at log level debug.
#[test]
#[ignore = "a request written as the backend closes an idle connection is lost (docs/reliability.md)"]
fn a_backend_that_closes_idle_connections() {
    no_fault_replies("idles", "keepalive_timeout 1ms;", 32, 6);
}

/// The same backend: a request lost with an idle connection may get a
/// 502, but every request is answered. The last request of a client
/// (`Connection: close`) lost so was dropped without a word, its client's
/// connection closed: 100 to 190 of them in a run like this one.
#[test]
fn a_backend_that_closes_idle_connections_leaves_no_request_unanswered() {
    run_clients("idles-answered", "keepalive_timeout 1ms;", 32, 4, true);
}
