//! Accepting on every worker: a listening socket per worker, bound to one
//! port with `SO_REUSEPORT`, so that every worker accepts its share of the
//! connections; the limit of open connections holds over all of them, and
//! a drain closes them all.

use flick_platform::{Accept, Loaded, Service, ServiceConfig};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The static web server on port 0, two workers, no parking.
fn static_web(config: ServiceConfig) -> Service {
    let path = format!(
        "{}/../../examples/static_web.flick",
        env!("CARGO_MANIFEST_DIR")
    );
    let src = std::fs::read_to_string(path).unwrap();
    let (program, _) = flick_syntax::parse(&src);
    let (checked, _) = flick_check::check(&program);
    let grammar = flick_wire::Grammar::stock("http").unwrap();
    let loaded = Loaded::new(&program, &checked, grammar).unwrap();
    Service::start(
        loaded,
        ServiceConfig {
            listen: vec![("client".into(), "127.0.0.1:0".parse().unwrap())],
            workers: 2,
            park_after: None,
            ..config
        },
    )
    .unwrap()
}

const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n";

/// Sends a request and reads the 137-byte response; `None` if the
/// connection closes, fails or stays silent for `wait`.
fn ask(c: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    c.set_read_timeout(Some(wait)).unwrap();
    c.write_all(REQUEST).ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while got.len() < 137 {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    Some(got)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn with_two_workers_both_accept_on_one_port() {
    let service = static_web(ServiceConfig::default());
    assert_ne!(service.local_addr().port(), 0);
    assert_eq!(service.listeners(), 2);
    let mut held = Vec::new();
    for _ in 0..64 {
        let mut c = TcpStream::connect(service.local_addr()).unwrap();
        let r = ask(&mut c, Duration::from_secs(5)).expect("answered");
        assert!(r.starts_with(b"HTTP/1.1 200"));
        held.push(c);
    }
    let per = service.accepted_per_worker();
    assert_eq!(per.iter().sum::<u64>(), 64);
    // The kernel hashes each connection (its source port differs) to one
    // of the two listeners: all 64 on one is a 1 in 2^63 chance.
    assert!(per.iter().all(|n| *n > 0), "accepted per worker: {per:?}");
    let accepted = service
        .stats()
        .connections_accepted
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(accepted, 64);
}

#[test]
fn a_single_acceptor_accepts_on_the_first_worker() {
    let service = static_web(ServiceConfig {
        accept: Accept::Single,
        ..Default::default()
    });
    assert_eq!(service.listeners(), 1);
    for _ in 0..16 {
        let mut c = TcpStream::connect(service.local_addr()).unwrap();
        assert!(ask(&mut c, Duration::from_secs(5)).is_some());
    }
    assert_eq!(service.accepted_per_worker(), vec![16, 0]);
}

/// Takes from `waiting` the connections whose answers have come, within
/// `wait` altogether, until `want` of them have.
fn answered(waiting: &mut Vec<TcpStream>, want: usize, wait: Duration) -> Vec<TcpStream> {
    let deadline = Instant::now() + wait;
    let mut done = Vec::new();
    while done.len() < want && Instant::now() < deadline {
        let mut i = 0;
        while i < waiting.len() {
            waiting[i]
                .set_read_timeout(Some(Duration::from_millis(20)))
                .unwrap();
            let mut buf = [0u8; 512];
            match waiting[i].read(&mut buf) {
                Ok(n) if n > 0 => done.push(waiting.swap_remove(i)),
                _ => i += 1,
            }
        }
    }
    done
}

#[test]
fn at_the_limit_every_listener_waits_and_closes_resume_them() {
    let service = static_web(ServiceConfig {
        max_instances: 4,
        ..Default::default()
    });
    let held: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut c = TcpStream::connect(service.local_addr()).unwrap();
            assert!(ask(&mut c, Duration::from_secs(5)).is_some());
            c
        })
        .collect();
    // Past the limit: connected (in one listener's backlog or the
    // other's), not served.
    let mut waiting: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut c = TcpStream::connect(service.local_addr()).unwrap();
            c.write_all(REQUEST).unwrap();
            c
        })
        .collect();
    assert!(answered(&mut waiting, 1, Duration::from_millis(300)).is_empty());
    assert_eq!(service.client_connections(), 4);
    // Four close: four of the waiting are accepted and answered, from
    // whichever backlog, and no more.
    drop(held);
    let first = answered(&mut waiting, 4, Duration::from_secs(10));
    assert_eq!(first.len(), 4);
    assert!(answered(&mut waiting, 1, Duration::from_millis(300)).is_empty());
    drop(first);
    let second = answered(&mut waiting, 4, Duration::from_secs(10));
    assert_eq!(second.len(), 4, "the rest are answered");
    drop(second);
    wait_for("every connection closed", || {
        service.client_connections() == 0
    });
    assert_eq!(service.accepted_per_worker().iter().sum::<u64>(), 12);
}

#[test]
fn a_drain_closes_every_listener() {
    let service = static_web(ServiceConfig::default());
    let addr = service.local_addr();
    let mut c = TcpStream::connect(addr).unwrap();
    assert!(ask(&mut c, Duration::from_secs(5)).is_some());
    service.drain();
    assert_eq!(service.listeners(), 0);
    let before = service.accepted_per_worker();
    // Whichever listener the kernel would have picked, nothing is served:
    // refused, reset or left unanswered.
    for _ in 0..32 {
        if let Ok(mut c) = TcpStream::connect(addr) {
            assert!(ask(&mut c, Duration::from_millis(100)).is_none());
        }
    }
    assert_eq!(service.accepted_per_worker(), before);
}
