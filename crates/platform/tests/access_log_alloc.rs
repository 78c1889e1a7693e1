//! The access log on: every request answered gets its line, and once warm
//! logging allocates nothing per request (lines are formatted into each
//! worker's buffer, which the log's thread swaps for a spare).

mod support;

use flick_testkit::alloc::CountingAlloc;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{memcached, request, response, serve, Procs};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Counts the lines written, keeping nothing (so it allocates nothing).
struct Lines(Arc<AtomicUsize>);

impl Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let n = b.iter().filter(|&&c| c == b'\n').count();
        self.0.fetch_add(n, Ordering::Relaxed);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logged_requests_allocate_nothing_once_warm() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs), memcached(&mut procs)];
    let lines = Arc::new(AtomicUsize::new(0));
    let log = flick_platform::access_log::AccessLog::to_writer(Box::new(Lines(lines.clone())), 2)
        .unwrap();
    let config = flick_platform::ServiceConfig {
        workers: 2,
        access_log: Some(log.clone()),
        ..Default::default()
    };
    let service = serve("memcached_proxy.flick", &backends, config);
    let mut c = TcpStream::connect(service.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.set_nodelay(true).unwrap();
    let mut req = Vec::with_capacity(256);
    let mut buf = vec![0u8; 4096];
    let keys: Vec<Vec<u8>> = (0..64).map(|i| format!("key:{i}").into_bytes()).collect();
    let round = |c: &mut TcpStream, req: &mut Vec<u8>, buf: &mut Vec<u8>| {
        for k in &keys {
            request(0x01, k, b"some value", &[0; 8], req);
            c.write_all(req).unwrap();
            assert_eq!(response(c, buf), 0);
            request(0x00, k, b"", b"", req);
            c.write_all(req).unwrap();
            assert_eq!(response(c, buf), 0);
        }
    };
    for _ in 0..20 {
        round(&mut c, &mut req, &mut buf);
    }
    let before = ALLOC.allocations();
    for _ in 0..20 {
        round(&mut c, &mut req, &mut buf);
    }
    let allocations = ALLOC.allocations() - before;
    eprintln!("allocations over 2560 logged requests: {allocations}");
    assert!(
        allocations < 64,
        "{allocations} allocations over 2560 logged requests"
    );
    // Every request's line is written out, none dropped.
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines.load(Ordering::Relaxed) < 40 * 128 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(lines.load(Ordering::Relaxed), 40 * 128);
    assert_eq!(log.dropped(), 0);
    assert_eq!(log.lines(), 40 * 128);
}
