//! Idle backend connections of the HTTP load balancer
//! (`examples/http_lb.flick`) have an age limit
//! (`--backend-idle-timeout-ms`): a connection that has carried nothing
//! for that long is closed rather than written to again, whether it waits
//! among its worker's idle connections or stays with a kept-alive client,
//! so a backend whose own idle timeout is longer (nginx's
//! `keepalive_timeout`) never closes one under a request.
//!
//! The backend here is the test's own: it records, for each request, how
//! long its connection had been idle since the response before, and the
//! clients pause longer than the limit between requests.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use support::Procs;

/// What the backend saw: for each request, how long its connection had
/// been idle (`None`: the connection's first request).
#[derive(Default)]
struct Seen {
    idle: Mutex<Vec<Option<Duration>>>,
}

/// Answers each GET with `200 ok` on keep-alive connections, recording
/// each request's idle time; ends with `stop`.
fn backend(stop: Arc<AtomicBool>, seen: Arc<Seen>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((s, _)) => {
                    let seen = seen.clone();
                    thread::spawn(move || serve(s, &seen));
                }
                Err(_) => thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    port
}

fn serve(s: TcpStream, seen: &Seen) {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut answered: Option<Instant> = None;
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let idle = answered.map(|t| t.elapsed());
        // The rest of the head.
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
        }
        seen.idle.lock().unwrap().push(idle);
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        if w.write_all(ok).is_err() {
            return;
        }
        answered = Some(Instant::now());
    }
}

/// One response's status; the body is read by its Content-Length.
fn status(r: &mut BufReader<TcpStream>) -> u16 {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = 0;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        if h == "\r\n" || h.is_empty() {
            break;
        }
        let h = h.to_ascii_lowercase();
        if let Some(v) = h.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).unwrap();
    status
}

/// The pause between requests: longer than the limit under test.
const PAUSE: Duration = Duration::from_millis(300);

/// Runs the balancer with `--backend-idle-timeout-ms limit_ms` in front of
/// the test's backend; a kept-alive client and a client on a new
/// connection each time send a GET each, `rounds` times, `PAUSE` apart.
/// Returns the idle times the backend saw.
fn idle_times(limit_ms: u64, rounds: usize) -> Vec<Option<Duration>> {
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let port = backend(stop.clone(), seen.clone());
    let mut procs = Procs(Vec::new());
    let limit = limit_ms.to_string();
    let flick = support::flick_run_with(
        &mut procs,
        "examples/http_lb.flick",
        &[port],
        &["--backend-idle-timeout-ms", &limit],
    );
    let kept = support::connect(flick);
    let mut kept_w = kept.try_clone().unwrap();
    let mut kept_r = BufReader::new(kept);
    for round in 0..rounds {
        kept_w
            .write_all(format!("GET /k{round} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
            .unwrap();
        assert_eq!(status(&mut kept_r), 200, "round {round}, kept-alive client");
        let fresh = support::connect(flick);
        let mut fresh_w = fresh.try_clone().unwrap();
        fresh_w
            .write_all(
                format!("GET /f{round} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .unwrap();
        assert_eq!(
            status(&mut BufReader::new(fresh)),
            200,
            "round {round}, new client"
        );
        thread::sleep(PAUSE);
    }
    stop.store(true, Ordering::Relaxed);
    let idle = seen.idle.lock().unwrap().clone();
    idle
}

#[test]
fn an_idle_backend_connection_older_than_the_limit_is_not_written_to() {
    // Without a limit, connections idle through each pause are written to
    // again: what the test looks for is there to see.
    let unlimited = idle_times(0, 4);
    assert!(
        unlimited.iter().flatten().any(|d| *d >= PAUSE / 2),
        "no connection was written to after idling: {unlimited:?}"
    );
    let limited = idle_times(100, 4);
    assert_eq!(limited.len(), 8, "every request reached the backend");
    assert!(
        limited.iter().flatten().all(|d| *d < PAUSE / 2),
        "a connection idle longer than the 100 ms limit was written to: {limited:?}"
    );
}
