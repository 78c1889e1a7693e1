//! Idle client connections: an instance ends once its connection has been
//! idle a while and a new one takes over at the next bytes (the connection
//! stays open, parked, with no tasks or buffers); past the limit of open
//! connections, new ones wait in the listen backlog rather than being
//! reset; a burst's graphs are trimmed once it is over.

mod support;

use flick_platform::{Loaded, Service, ServiceConfig};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::{memcached, request, response, Procs};

/// Listing 1's proxy in front of `backends`, with `config`'s limits.
fn proxy(backends: &[u16], config: ServiceConfig) -> Service {
    let path = format!(
        "{}/../../examples/memcached_proxy.flick",
        env!("CARGO_MANIFEST_DIR")
    );
    let src = std::fs::read_to_string(path).unwrap();
    let (program, _) = flick_syntax::parse(&src);
    let (checked, _) = flick_check::check(&program);
    let grammar = flick_wire::Grammar::stock("memcached_binary").unwrap();
    let loaded = Loaded::new(&program, &checked, grammar).unwrap();
    let listen = format!("127.0.0.1:{}", flick_testkit::free_port());
    Service::start(
        loaded,
        ServiceConfig {
            listen: vec![("client".into(), listen.parse().unwrap())],
            connect: vec![(
                "backends".into(),
                backends
                    .iter()
                    .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
                    .collect(),
            )],
            workers: 2,
            ..config
        },
    )
    .unwrap()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn get(c: &mut TcpStream, key: &[u8], req: &mut Vec<u8>, buf: &mut [u8]) -> u16 {
    request(0x00, key, b"", b"", req);
    c.write_all(req).unwrap();
    response(c, buf)
}

#[test]
fn an_idle_connection_parks_and_its_next_request_takes_a_new_instance() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs)];
    let service = proxy(
        &backends,
        ServiceConfig {
            park_after: Some(Duration::from_millis(100)),
            ..Default::default()
        },
    );
    let mut c = TcpStream::connect(service.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (mut req, mut buf) = (Vec::new(), vec![0u8; 4096]);
    request(0x01, b"k", b"v", &[0; 8], &mut req);
    c.write_all(&req).unwrap();
    assert_eq!(response(&mut c, &mut buf), 0);
    let live = || service.stats().graphs_live.load(Ordering::Relaxed);
    wait_for("the idle instance ends", || live() == 0);
    assert_eq!(service.parked_connections(), 1);
    assert_eq!(service.client_connections(), 1);
    // Parked, not closed: the next requests are answered, in order, by a
    // new instance, pipelined ones too.
    assert_eq!(get(&mut c, b"k", &mut req, &mut buf), 0);
    assert_eq!(live(), 1);
    let mut burst = Vec::new();
    for _ in 0..10 {
        request(0x00, b"k", b"", b"", &mut req);
        burst.extend_from_slice(&req);
    }
    wait_for("parked again", || live() == 0);
    c.write_all(&burst).unwrap();
    for _ in 0..10 {
        assert_eq!(response(&mut c, &mut buf), 0);
    }
    // A parked connection whose client closes is closed and counted so.
    wait_for("parked again", || service.parked_connections() == 1);
    drop(c);
    wait_for("the connection closes", || {
        service.client_connections() == 0 && live() == 0
    });
    assert_eq!(service.parked_connections(), 0);
    assert_eq!(
        service.stats().connections_open.load(Ordering::Relaxed) as usize,
        service.shared_connections(),
        "only the shared backend connections stay open"
    );
}

#[test]
fn a_connection_past_the_limit_waits_in_the_backlog_and_is_never_reset() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs)];
    let service = proxy(
        &backends,
        ServiceConfig {
            max_instances: 2,
            // Parked connections count against the limit too.
            park_after: Some(Duration::from_millis(50)),
            ..Default::default()
        },
    );
    let (mut req, mut buf) = (Vec::new(), vec![0u8; 4096]);
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(service.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(get(&mut c, b"k", &mut req, &mut buf), 1, "a miss");
        open.push(c);
    }
    wait_for("both parked", || service.parked_connections() == 2);
    // The third connects (the kernel completes it into the backlog) but
    // is not accepted: its request waits, unanswered and not refused.
    let mut third = TcpStream::connect(service.local_addr()).unwrap();
    request(0x00, b"k", b"", b"", &mut req);
    third.write_all(&req).unwrap();
    third
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut one = [0u8; 1];
    match third.read(&mut one) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) => {}
        other => panic!("the third connection was served or closed: {other:?}"),
    }
    assert_eq!(service.client_connections(), 2);
    // One closes: the third is accepted and answered.
    drop(open.pop());
    third
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(response(&mut third, &mut buf), 1, "a miss");
    assert_eq!(service.client_connections(), 2);
}

#[test]
fn a_drain_closes_parked_connections() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs)];
    let service = proxy(
        &backends,
        ServiceConfig {
            park_after: Some(Duration::from_millis(50)),
            ..Default::default()
        },
    );
    let mut c = TcpStream::connect(service.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (mut req, mut buf) = (Vec::new(), vec![0u8; 4096]);
    assert_eq!(get(&mut c, b"k", &mut req, &mut buf), 1);
    wait_for("parked", || service.parked_connections() == 1);
    service.drain();
    let mut one = [0u8; 1];
    assert_eq!(c.read(&mut one).unwrap_or(1), 0, "closed by the drain");
    assert_eq!(service.client_connections(), 0);
}

#[test]
fn a_bursts_graphs_are_trimmed_once_it_is_over() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs)];
    let service = proxy(
        &backends,
        ServiceConfig {
            park_after: None,
            ..Default::default()
        },
    );
    let (mut req, mut buf) = (Vec::new(), vec![0u8; 4096]);
    let mut burst = Vec::new();
    for _ in 0..300 {
        let mut c = TcpStream::connect(service.local_addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(get(&mut c, b"k", &mut req, &mut buf), 1);
        burst.push(c);
    }
    assert_eq!(service.stats().graphs_live.load(Ordering::Relaxed), 300);
    drop(burst);
    wait_for("the burst's instances end", || {
        service.stats().graphs_live.load(Ordering::Relaxed) == 0
    });
    assert!(service.pooled_graphs() >= 256, "the graphs went back");
    // Unused for a whole trim period, they are freed down to what a
    // service makes ahead.
    wait_for("trimmed", || service.pooled_graphs() <= 64);
}
