//! Exclusive backend connections of the HTTP load balancer
//! (`examples/http_lb.flick`) are capped per backend and worker
//! (`--backend-max-connections`, as HAProxy's `maxconn` per server): past
//! the cap a request waits for a connection to come back, never opens
//! another, and one that waits longer than the response timeout gets 503.
//!
//! A kept-alive client holds its connection only while a request of its
//! is in flight: between its requests the connection is back in the pool,
//! so two kept-alive clients taking turns at a cap of one both get quick
//! answers, where the first would otherwise hold it until it idled long
//! enough to park (1 s), and the other wait that long for each request.
//!
//! The backend is the test's own: it answers each request after a delay
//! and records how many connections it had open at once.

mod support;

use std::io::{BufReader, Read, Write};
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;
use support::http::{get_kept_alive, path_backend};
use support::Procs;

/// A GET of `/c<n>` on a new connection that it closes: the response's
/// status.
fn get(port: u16, n: usize) -> u16 {
    let s = support::connect(port);
    let mut w = s.try_clone().unwrap();
    w.write_all(format!("GET /c{n} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut text = String::new();
    let r = BufReader::new(s).read_to_string(&mut text);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // A response is the client's own: its body is the path it asked for.
    if status == 200 {
        assert!(
            r.is_ok() && text.ends_with(&format!("\r\n\r\n/c{n}")),
            "{text:?}"
        );
    }
    status
}

/// `clients` GETs at once through a balancer (two workers) capped at one
/// connection per worker; the statuses, and the most connections the
/// backend had open at once.
fn capped(clients: usize, delay_ms: u64, timeout_ms: &str) -> (Vec<u16>, usize) {
    let (port, open) = path_backend(Duration::from_millis(delay_ms));
    let mut procs = Procs(Vec::new());
    let flick = support::flick_run_with(
        &mut procs,
        "examples/http_lb.flick",
        &[port],
        &[
            "--backend-max-connections",
            "1",
            "--response-timeout-ms",
            timeout_ms,
        ],
    );
    let threads: Vec<_> = (0..clients)
        .map(|n| thread::spawn(move || get(flick, n)))
        .collect();
    let statuses = threads.into_iter().map(|t| t.join().unwrap()).collect();
    (statuses, open.most.load(Ordering::SeqCst))
}

#[test]
fn requests_past_the_cap_wait_for_a_connection() {
    // Six requests of 50 ms, at most three on a worker: each waits less
    // than the timeout.
    let (statuses, most) = capped(6, 50, "2000");
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every request waits its turn: {statuses:?}"
    );
    assert!(
        most <= 2,
        "{most} backend connections at once, over 1 per worker"
    );
}

#[test]
fn a_request_that_waits_longer_than_the_timeout_gets_503() {
    // Ten requests of 150 ms, at least five on one worker: its fifth
    // waits 600 ms for a connection, over the 400 ms timeout.
    let (statuses, most) = capped(10, 150, "400");
    assert!(
        most <= 2,
        "{most} backend connections at once, over 1 per worker"
    );
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "each request is answered or gets 503: {statuses:?}"
    );
    assert!(
        statuses.contains(&503),
        "a request waited past the timeout: {statuses:?}"
    );
}

#[test]
fn kept_alive_clients_taking_turns_at_a_cap_of_one_are_answered_at_once() {
    let (port, open) = path_backend(Duration::ZERO);
    // One worker, so both clients share its one connection.
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(support::ROOT)
        .args(["run", "examples/http_lb.flick", "--workers", "1"])
        .args([
            "--listen",
            &format!("client=127.0.0.1:{}", support::free_port()),
        ])
        .args(["--connect", &format!("backends=127.0.0.1:{port}")])
        .args([
            "--backend-max-connections",
            "1",
            "--response-timeout-ms",
            "5000",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut procs = Procs(Vec::new());
    let flick = support::listening_port(&mut procs, child);
    let mut clients: Vec<_> = (0..2)
        .map(|_| {
            let s = support::connect(flick);
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            BufReader::new(s)
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for n in 0..20 {
        let started = std::time::Instant::now();
        let status = get_kept_alive(&mut clients[n % 2], &format!("/k{n}"));
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert_eq!(status, 200, "request {n} after {took:?}");
    }
    eprintln!("20 requests taking turns, the slowest answered in {slowest:?}");
    // Held until its client parks, the connection would make each turn
    // wait the park time (1 s); given back, a turn waits for nothing.
    assert!(
        slowest < Duration::from_millis(600),
        "a request waited {slowest:?} for the connection the other client idled on"
    );
    assert!(open.most.load(Ordering::SeqCst) <= 1, "over the cap");
}
