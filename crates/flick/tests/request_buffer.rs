//! The HTTP load balancer's request buffer (`--request-buffer-bytes`): a
//! request that fits it is read and checked whole before any of it goes to
//! a backend; a larger one, or one that waits for `100 Continue`, streams.
//! The backend here is a loopback listener of the test's own, which says
//! when each request's first bytes arrive.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;
use support::Procs;

/// What the backend saw.
#[derive(Debug, PartialEq)]
enum Seen {
    /// The first bytes of a request.
    Arrived,
    /// A whole request: its head and how many body bytes followed it.
    Request { head: String, body: usize },
}

/// How long a backend that must see nothing is watched. Long enough for a
/// request the balancer passed on to arrive on a loaded machine, so a
/// balancer that forwards early fails.
const QUIET: Duration = Duration::from_millis(400);
/// How long anything the backend must see may take.
const DEADLINE: Duration = Duration::from_secs(10);

/// A backend that answers every request framed by Content-Length with 200
/// and the body's length, sends `100 Continue` first where the request
/// asks for it, and reports what it sees.
fn recording_backend() -> (u16, Receiver<Seen>) {
    let backend = support::listener();
    let port = backend.local_addr().unwrap().port();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for c in backend.incoming() {
            let Ok(c) = c else { return };
            let tx = tx.clone();
            std::thread::spawn(move || serve(c, &tx));
        }
    });
    (port, rx)
}

fn serve(c: TcpStream, tx: &std::sync::mpsc::Sender<Seen>) -> Option<()> {
    let mut w = c.try_clone().ok()?;
    let mut r = BufReader::new(c);
    loop {
        if r.fill_buf().ok()?.is_empty() {
            return None;
        }
        tx.send(Seen::Arrived).ok()?;
        let mut head = String::new();
        let mut length = 0;
        let mut expect = false;
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().ok()?;
            }
            expect |= lower.starts_with("expect:") && lower.contains("100-continue");
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        if expect {
            w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").ok()?;
        }
        let mut body = vec![0; length];
        r.read_exact(&mut body).ok()?;
        let reply = format!("got {length}");
        write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{reply}",
            reply.len()
        )
        .ok()?;
        tx.send(Seen::Request { head, body: length }).ok()?;
    }
}

fn balancer(procs: &mut Procs, backend: u16, more: &[&str]) -> u16 {
    support::flick_run_with(procs, "examples/http_lb.flick", &[backend], more)
}

/// A response's status and body (framed by Content-Length, or by the
/// connection's end).
fn response(r: &mut BufReader<TcpStream>) -> (u16, String) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok());
    let status = status.unwrap_or_else(|| panic!("a status line, not {line:?}"));
    let mut length = None;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().ok();
        }
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    let mut body = Vec::new();
    match length {
        Some(n) => {
            body.resize(n, 0);
            r.read_exact(&mut body).unwrap();
        }
        None => {
            let _ = r.read_to_end(&mut body);
        }
    }
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn connect(port: u16) -> (TcpStream, BufReader<TcpStream>) {
    let s = support::connect(port);
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

fn post_head(length: usize) -> String {
    format!("POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n\r\n")
}

/// Nothing reaches the backend while a request that fits the buffer is
/// incomplete; then the whole of it does, and its response comes back.
#[test]
fn a_request_within_the_buffer_goes_on_only_once_complete() {
    let mut procs = Procs(Vec::new());
    let (backend, seen) = recording_backend();
    let port = balancer(&mut procs, backend, &[]);
    let (mut s, mut r) = connect(port);
    s.write_all(post_head(1000).as_bytes()).unwrap();
    s.write_all(&[b'x'; 999]).unwrap();
    assert_eq!(
        seen.recv_timeout(QUIET),
        Err(RecvTimeoutError::Timeout),
        "the backend saw a request whose body is incomplete"
    );
    s.write_all(b"x").unwrap();
    assert_eq!(seen.recv_timeout(DEADLINE), Ok(Seen::Arrived));
    match seen.recv_timeout(DEADLINE) {
        Ok(Seen::Request { body, .. }) => assert_eq!(body, 1000),
        other => panic!("the backend saw {other:?}"),
    }
    assert_eq!(response(&mut r), (200, "got 1000".to_string()));
}

/// A request larger than the buffer streams: its head reaches the backend
/// while the client is still sending its body.
#[test]
fn a_request_over_the_buffer_streams() {
    let mut procs = Procs(Vec::new());
    let (backend, seen) = recording_backend();
    let port = balancer(&mut procs, backend, &["--request-buffer-bytes", "1024"]);
    let (mut s, mut r) = connect(port);
    s.write_all(post_head(4000).as_bytes()).unwrap();
    s.write_all(&[b'x'; 2000]).unwrap();
    assert_eq!(
        seen.recv_timeout(DEADLINE),
        Ok(Seen::Arrived),
        "the head goes on before the body is complete"
    );
    s.write_all(&[b'x'; 2000]).unwrap();
    assert_eq!(response(&mut r), (200, "got 4000".to_string()));
}

/// A request that waits for `100 Continue` before it sends its body is not
/// held: its head goes on at once, the backend's interim response comes
/// back, and then the body.
#[test]
fn a_request_that_expects_100_continue_goes_on_at_once() {
    let mut procs = Procs(Vec::new());
    let (backend, seen) = recording_backend();
    let port = balancer(&mut procs, backend, &[]);
    let (mut s, mut r) = connect(port);
    write!(
        s,
        "POST /p HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"
    )
    .unwrap();
    assert_eq!(seen.recv_timeout(DEADLINE), Ok(Seen::Arrived));
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 100"), "{line:?}");
    // (Its fields, then the blank line that ends it.)
    while line != "\r\n" {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the interim response ends"
        );
    }
    s.write_all(b"0123456789").unwrap();
    assert_eq!(response(&mut r), (200, "got 10".to_string()));
}

/// A body that breaks its framing, in a request that fits the buffer, gets
/// the balancer's own 400; the backend sees nothing of it. With the buffer
/// off (0) its head has gone on by then, as before.
#[test]
fn a_broken_body_within_the_buffer_reaches_no_backend() {
    let mut procs = Procs(Vec::new());
    let (backend, seen) = recording_backend();
    let port = balancer(&mut procs, backend, &[]);
    let (mut s, mut r) = connect(port);
    s.write_all(
        b"POST /p HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
    )
    .unwrap();
    assert_eq!(response(&mut r).0, 400);
    assert_eq!(seen.recv_timeout(QUIET), Err(RecvTimeoutError::Timeout));

    let unbuffered = balancer(&mut procs, backend, &["--request-buffer-bytes", "0"]);
    let (mut s, _r) = connect(unbuffered);
    s.write_all(b"POST /p HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        .unwrap();
    assert_eq!(
        seen.recv_timeout(DEADLINE),
        Ok(Seen::Arrived),
        "without the buffer the head streams"
    );
}

/// A body sent one byte per 30 ms for longer than the response timeout
/// (1 s) holds no backend connection while it comes: the backend gets the
/// request once it is complete, and answers it in time (streamed, the
/// client got 504).
#[test]
fn a_slow_body_within_the_buffer_is_answered() {
    let mut procs = Procs(Vec::new());
    let (backend, seen) = recording_backend();
    let port = balancer(&mut procs, backend, &["--response-timeout-ms", "1000"]);
    let (mut s, mut r) = connect(port);
    s.write_all(post_head(60).as_bytes()).unwrap();
    for _ in 0..60 {
        assert_eq!(
            seen.try_recv(),
            Err(std::sync::mpsc::TryRecvError::Empty),
            "the backend saw the request before its body was complete"
        );
        s.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    assert_eq!(response(&mut r), (200, "got 60".to_string()));
    assert_eq!(seen.recv_timeout(DEADLINE), Ok(Seen::Arrived));
}

/// Identical Content-Length fields frame the body by their one value (RFC
/// 9110 section 8.6), as the backend reads it: the request is complete
/// after 5 bytes, not after their sum.
#[test]
fn identical_content_lengths_frame_the_body_by_their_one_value() {
    let mut procs = Procs(Vec::new());
    let (backend, _seen) = recording_backend();
    let port = balancer(&mut procs, backend, &[]);
    let (mut s, mut r) = connect(port);
    s.write_all(
        b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    )
    .unwrap();
    assert_eq!(response(&mut r), (200, "got 5".to_string()));
}
