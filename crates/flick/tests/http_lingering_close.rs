//! A client whose request the balancer answers without reading its body
//! (a 413 for a body over `--max-body-bytes`) gets that whole reply even
//! while it goes on sending the body, after the balancer has closed the
//! connection with some of the body unread: the reset the kernel sends
//! for the unread bytes, and for those that come after the close, must
//! not take the reply from a client that has yet to read it.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};
use support::Procs;

/// What the client read until its connection ended (or 10 s passed), and
/// how it ended.
fn read_to_end(s: &mut std::net::TcpStream) -> (Vec<u8>, Option<ErrorKind>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, None),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return (got, Some(e.kind())),
        }
    }
}

#[test]
fn a_413_reaches_a_client_that_goes_on_sending_its_body() {
    let mut procs = Procs(Vec::new());
    // The balancer answers from the head: no backend sees the request.
    let backend = TcpListener::bind("127.0.0.1:0").unwrap();
    let backend_port = backend.local_addr().unwrap().port();
    let port = support::flick_run_with(
        &mut procs,
        "examples/http_lb.flick",
        &[backend_port],
        &["--max-body-bytes", "1000"],
    );
    for round in 0..3 {
        let mut s = support::connect(port);
        s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
            .unwrap();
        // More than the balancer reads with the head: some of it is unread
        // when the balancer is done with the connection.
        s.write_all(&[b'x'; 30000]).unwrap();
        // The 413 is written and the balancer is done with the connection
        // before the rest of the body comes.
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..4 {
            // Writes may fail once the balancer has closed; the reply must
            // still be there to read.
            if s.write_all(&[b'x'; 4000]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        let (got, error) = read_to_end(&mut s);
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.0 413 "),
            "round {round}: the client read {text:?}, then {error:?}"
        );
        assert!(text.contains("\r\n\r\n"), "round {round}: {text:?}");
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "the connection ends within the linger time"
        );
    }
}
