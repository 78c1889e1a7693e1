//! A client whose request the balancer answers without reading its body
//! (a 413 for a body over `--max-body-bytes`) gets that whole reply, and
//! whatever was to go before it, even while it goes on sending the body:
//! the balancer closes a client's connection the way nginx does (lingering
//! close), sending its end and reading what still comes for a while before
//! the socket closes, so the kernel does not reset the connection and drop
//! what it had yet to send.

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

/// The reply the balancer still has to send when it is done with such a
/// connection (a large response pipelined ahead of the 413, which the
/// client reads slowly) reaches the client whole, 413 and all: a close
/// with the body unread would reset the connection and drop what the
/// kernel had yet to send.
#[test]
fn a_413_behind_a_large_response_reaches_a_slow_client() {
    let mut procs = Procs(Vec::new());
    let site = std::env::temp_dir().join(format!("flick-linger-{}", std::process::id()));
    std::fs::create_dir_all(&site).unwrap();
    let big: Vec<u8> = (0..8_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(site.join("big.bin"), &big).unwrap();
    let backend = flick_testkit::nginx(&mut procs, &site, "a");
    let port = support::flick_run_with(
        &mut procs,
        "examples/http_lb.flick",
        &[backend],
        &["--max-body-bytes", "1000"],
    );
    let mut s = support::connect(port);
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    s.write_all(&[b'x'; 30000]).unwrap();
    // The balancer fills what the socket takes, the rest of the response
    // and the 413 waiting behind it.
    std::thread::sleep(Duration::from_millis(500));
    let (got, error) = read_to_end(&mut s);
    let tail = String::from_utf8_lossy(&got[got.len().saturating_sub(200)..]).into_owned();
    assert!(
        got.len() > big.len() && tail.contains("HTTP/1.0 413 "),
        "the client read {} bytes of more than {}, then {error:?}; they end {tail:?}",
        got.len(),
        big.len()
    );
    let _ = std::fs::remove_dir_all(&site);
}
