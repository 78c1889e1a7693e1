//! A clean shutdown of the Memcached proxy served in-process: requests
//! already read are answered, then every client is closed.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::{memcached, proxy, request, response, Procs};

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

/// Requests a client sent before the shutdown but that the proxy had not
/// read yet (a burst far larger than its channels hold, so the reader is
/// held back) are answered too, every one, before the client is closed.
#[test]
fn a_drain_answers_requests_sent_but_not_read_yet() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs), memcached(&mut procs)];
    let service = proxy(&backends);
    let mut c = TcpStream::connect(service.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut req, mut buf) = (Vec::new(), vec![0u8; 4096]);
    request(0x01, b"burst", b"v", &[0; 8], &mut req);
    c.write_all(&req).unwrap();
    assert_eq!(response(&mut c, &mut buf), 0);
    let n = 2000;
    let mut burst = Vec::new();
    for _ in 0..n {
        request(0x00, b"burst", b"", b"", &mut req);
        burst.extend_from_slice(&req);
    }
    c.write_all(&burst).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    service.drain();
    for i in 0..n {
        let mut h = [0u8; 24];
        c.read_exact(&mut h)
            .unwrap_or_else(|e| panic!("reply {i} of {n}: {e}"));
        let total = u32::from_be_bytes(h[8..12].try_into().unwrap()) as usize;
        assert_eq!(u16::from_be_bytes([h[6], h[7]]), 0, "reply {i}");
        c.read_exact(&mut buf[..total]).unwrap();
    }
    let mut one = [0u8; 1];
    assert_eq!(
        c.read(&mut one).unwrap_or(1),
        0,
        "closed after the last reply"
    );
}
