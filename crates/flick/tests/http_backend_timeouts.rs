//! The response timeout of the HTTP load balancer
//! (`examples/http_lb.flick`, `--response-timeout-ms`) runs from the last
//! time the backend was heard from about a request, as nginx's
//! `proxy_read_timeout` runs between two reads: a response whose body
//! keeps coming, slower in all than the timeout, arrives whole, and so do
//! the responses pipelined behind it. Before, it ran from when the request
//! was sent: such a response was cut short, its client's connection
//! closed, and a request pipelined behind it got nothing at all.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;
use support::Procs;

/// The body each response has, sent a byte at a time.
const BODY: &[u8] = b"abcdefgh";
/// The wait before each byte of a body: the body takes 8 of them.
const BYTE_GAP: Duration = Duration::from_millis(80);

/// A backend on a free port that runs `serve` on each connection, in a
/// thread of its own.
fn backend(serve: fn(TcpStream)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for s in listener.incoming().flatten() {
            thread::spawn(move || serve(s));
        }
    });
    port
}

/// The balancer in front of `backend`, with a response timeout of 300 ms.
fn balancer(procs: &mut Procs, backend: u16) -> u16 {
    support::flick_run_with(
        procs,
        "examples/http_lb.flick",
        &[backend],
        &["--response-timeout-ms", "300"],
    )
}

fn serve(s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    loop {
        let mut h = String::new();
        loop {
            h.clear();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
        }
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", BODY.len());
        if w.write_all(head.as_bytes()).is_err() {
            return;
        }
        for b in BODY {
            thread::sleep(BYTE_GAP);
            if w.write_all(&[*b]).is_err() {
                return;
            }
        }
    }
}

/// One response: its status and body; `None` if the connection ended
/// before it was whole.
fn response(r: &mut BufReader<TcpStream>) -> Option<(u16, Vec<u8>)> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let status = line.split(' ').nth(1)?.parse().ok()?;
    let mut length = 0;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).ok()? == 0 {
            return None;
        }
        if h == "\r\n" {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).ok()?;
    Some((status, body))
}

#[test]
fn a_response_that_streams_on_is_not_cut_by_the_response_timeout() {
    // Answers each GET with `BODY`, slowly.
    let backend = backend(serve);
    let mut procs = Procs(Vec::new());
    // Each body takes 640 ms, more than twice the timeout, and the second
    // response waits behind the first for as long.
    let port = balancer(&mut procs, backend);
    let c = support::connect(port);
    let mut w = c.try_clone().unwrap();
    let mut r = BufReader::new(c);
    w.write_all(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\nGET /b HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let first = response(&mut r);
    assert_eq!(first, Some((200, BODY.to_vec())), "the first response");
    // It waited its turn behind the first, longer than the timeout: its
    // clock starts when the first is answered.
    let second = response(&mut r);
    assert_eq!(second, Some((200, BODY.to_vec())), "the second response");
}

/// A client's last request (one with `Connection: close`, or one after
/// which the client shuts its side) waits for its backend no longer than
/// any other: it gets the 504 once the timeout passes. Before, the
/// session's end left no timer armed, and such a client waited until
/// something else woke its instance, or for ever.
#[test]
fn a_sessions_last_request_gets_the_fault_reply_when_its_backend_is_silent() {
    // Reads what each connection sends and never answers.
    let backend = backend(|mut s| {
        let _ = s.read_to_end(&mut Vec::new());
    });
    let mut procs = Procs(Vec::new());
    let port = balancer(&mut procs, backend);
    for half_close in [false, true] {
        for _ in 0..5 {
            let c = support::connect(port);
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut w = c.try_clone().unwrap();
            let mut r = BufReader::new(c);
            let request: &[u8] = match half_close {
                false => b"GET /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
                true => b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n",
            };
            w.write_all(request).unwrap();
            if half_close {
                w.shutdown(std::net::Shutdown::Write).unwrap();
            }
            let got = response(&mut r);
            assert_eq!(
                got.map(|(status, _)| status),
                Some(504),
                "half close: {half_close}"
            );
        }
    }
}
