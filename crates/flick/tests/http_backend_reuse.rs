//! Exclusive backend connections of the HTTP load balancer
//! (`examples/http_lb.flick`) are held per request, not per client: an
//! instance takes one at its first request to a backend (none to a
//! backend it never writes to) and gives it back as soon as it has
//! nothing in flight, and the next request on the worker takes the one
//! given back last. Kept-alive clients between requests hold none, so a
//! worker needs about as many as it has requests at the backend. Each
//! client holding its own (and one to every backend, taken at its start)
//! made 3,200 backend connections for 1,600 clients and a p99 latency
//! several times the mean (docs/performance.md, "Many connections: the
//! balancer at 1600").
//!
//! The backends are the test's own: they count the connections they
//! accept and have open.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};
use support::http::{get_kept_alive, path_backend};
use support::Procs;

/// The balancer with one worker in front of `backends`, with `extra` flags.
fn balancer(procs: &mut Procs, backends: &[u16], extra: &[&str]) -> u16 {
    let list: Vec<String> = backends.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(support::ROOT)
        .args(["run", "examples/http_lb.flick", "--workers", "1"])
        .args([
            "--listen",
            &format!("client=127.0.0.1:{}", support::free_port()),
        ])
        .args(["--connect", &format!("backends={}", list.join(","))])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    support::listening_port(procs, child)
}

fn client(port: u16) -> BufReader<TcpStream> {
    let s = support::connect(port);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    BufReader::new(s)
}

/// Waits (at most 15 s) for `done`; false if it never held.
fn wait_for(mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        if done() {
            return true;
        }
        thread::sleep(Duration::from_millis(20));
    }
    done()
}

#[test]
fn kept_alive_clients_taking_turns_share_one_backend_connection() {
    let (a, b) = (path_backend(Duration::ZERO), path_backend(Duration::ZERO));
    let (ports, counts) = ([a.0, b.0], [a.1, b.1]);
    let mut procs = Procs(Vec::new());
    let flick = balancer(&mut procs, &ports, &[]);
    // Thirty-two clients, all connected and kept alive, one request at a
    // time: the one before is answered, and its connection given back,
    // before the next is sent.
    let mut clients: Vec<_> = (0..32).map(|_| client(flick)).collect();
    for round in 0..3 {
        for (n, c) in clients.iter_mut().enumerate() {
            assert_eq!(get_kept_alive(c, &format!("/r{round}c{n}")), 200);
        }
    }
    let accepted: Vec<usize> = counts
        .iter()
        .map(|c| c.accepted.load(Ordering::SeqCst))
        .collect();
    // Held per client, 32 to 64 (one to each backend per instance).
    assert!(
        accepted.iter().all(|n| *n <= 1),
        "96 requests one at a time opened {accepted:?} backend connections, \
         where the one given back serves the next"
    );
    assert!(
        accepted.iter().sum::<usize>() >= 1,
        "the requests went to a backend"
    );
}

#[test]
fn a_bursts_backend_connections_beyond_those_kept_close_once_unused() {
    // Slow answers, so that the burst's requests are at the backend at
    // once, each over a connection of its own.
    let (port, counts) = path_backend(Duration::from_millis(300));
    let mut procs = Procs(Vec::new());
    // Kept however long they idle: what closes them here is the sweep of
    // those beyond the kept ones, not the idle timeout (4 s), which a
    // loaded machine could reach before the requests after the burst.
    let flick = balancer(&mut procs, &[port], &["--backend-idle-timeout-ms", "0"]);
    let burst = 40;
    let mut clients: Vec<_> = (0..burst).map(|_| client(flick)).collect();
    for (n, c) in clients.iter_mut().enumerate() {
        c.get_mut()
            .write_all(format!("GET /b{n} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
            .unwrap();
    }
    for (n, c) in clients.iter_mut().enumerate() {
        // The request is sent already: this reads its response.
        let mut line = String::new();
        c.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "request {n}: {line:?}");
        let mut rest = String::new();
        while rest != "\r\n" {
            rest.clear();
            c.read_line(&mut rest).unwrap();
        }
        let mut body = vec![0; format!("/b{n}").len()];
        c.read_exact(&mut body).unwrap();
    }
    let opened = counts.accepted.load(Ordering::SeqCst);
    assert!(
        opened > 16,
        "the burst's requests were at the backend at once: {opened} connections"
    );
    // The clients stay connected and idle: the sweep closes the idle
    // connections beyond the 16 a worker keeps, once unused for a second.
    assert!(
        wait_for(|| counts.open.load(Ordering::SeqCst) <= 16),
        "{} backend connections still open after the burst",
        counts.open.load(Ordering::SeqCst)
    );
    // Those kept serve the clients' next requests: nothing new is dialled.
    for (n, c) in clients.iter_mut().take(8).enumerate() {
        assert_eq!(get_kept_alive(c, &format!("/again{n}")), 200);
    }
    assert_eq!(
        counts.accepted.load(Ordering::SeqCst),
        opened,
        "a request after the burst dialled a new connection"
    );
}
