//! A client that stops mid-request (`--client-request-timeout-ms`): the
//! HTTP balancer answers 408 and closes, the backend never sees the
//! incomplete request, and a connection idle between requests, or another
//! client, is not affected. The Memcached proxy, whose protocol has no
//! such reply, closes the connection.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;
use support::Procs;

/// The timeout the balancer runs with here.
const TIMEOUT_MS: &str = "300";
/// How long a backend that must see nothing is watched: past the timeout,
/// so a balancer that forwarded the request on timing out fails.
const QUIET: Duration = Duration::from_millis(800);

/// A backend that answers each request framed by Content-Length with 200
/// and its path, and reports each request line it reads whole.
fn recording_backend() -> (u16, Receiver<String>) {
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

fn serve(c: TcpStream, tx: &std::sync::mpsc::Sender<String>) -> Option<()> {
    let mut w = c.try_clone().ok()?;
    let mut r = BufReader::new(c);
    loop {
        let mut request_line = String::new();
        if r.read_line(&mut request_line).ok()? == 0 {
            return None;
        }
        let mut length = 0;
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().ok()?;
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        r.read_exact(&mut body).ok()?;
        let path = request_line.split(' ').nth(1)?.to_string();
        write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{path}",
            path.len()
        )
        .ok()?;
        tx.send(request_line).ok()?;
    }
}

fn balancer(procs: &mut Procs, backend: u16) -> u16 {
    support::flick_run_with(
        procs,
        "examples/http_lb.flick",
        &[backend],
        &["--client-request-timeout-ms", TIMEOUT_MS],
    )
}

/// Everything the balancer sends until it closes the connection (reads
/// give up after 10 s, failing the test).
fn until_closed(s: &mut TcpStream) -> String {
    let mut all = Vec::new();
    s.read_to_end(&mut all)
        .expect("the balancer closes the connection");
    String::from_utf8_lossy(&all).into_owned()
}

/// A response's status and body, framed by Content-Length.
fn response(r: &mut BufReader<TcpStream>) -> (u16, String) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line.split(' ').nth(1).and_then(|s| s.parse().ok());
    let status = status.unwrap_or_else(|| panic!("a status line, not {line:?}"));
    let mut length = 0;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn get(s: &mut TcpStream, r: &mut BufReader<TcpStream>, path: &str) -> (u16, String) {
    write!(s, "GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    response(r)
}

fn assert_timed_out(reply: &str) {
    assert!(
        reply.starts_with("HTTP/1.0 408 ") || reply.starts_with("HTTP/1.1 408 "),
        "a 408 response, not {reply:?}"
    );
    assert!(
        reply.to_ascii_lowercase().contains("connection: close"),
        "the 408 says the connection closes: {reply:?}"
    );
}

/// Half a request head gets 408 and a close.
#[test]
fn half_a_head_gets_408_and_a_close() {
    let mut procs = Procs(Vec::new());
    let (backend, seen) = recording_backend();
    let port = balancer(&mut procs, backend);
    let mut s = support::connect(port);
    s.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\nX-Half: ")
        .unwrap();
    assert_timed_out(&until_closed(&mut s));
    assert_eq!(seen.recv_timeout(QUIET), Err(RecvTimeoutError::Timeout));
}

/// A head whose body never comes whole gets 408; the backend never sees
/// the request. Meanwhile another client gets its replies.
#[test]
fn a_body_that_stops_gets_408_and_the_backend_sees_nothing() {
    let mut procs = Procs(Vec::new());
    let (backend, seen) = recording_backend();
    let port = balancer(&mut procs, backend);
    let mut slow = support::connect(port);
    slow.write_all(b"POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
        .unwrap();
    let mut other = support::connect(port);
    let mut other_r = BufReader::new(other.try_clone().unwrap());
    for i in 0..3 {
        let path = format!("/other{i}");
        assert_eq!(get(&mut other, &mut other_r, &path), (200, path.clone()));
        assert_eq!(
            seen.recv_timeout(Duration::from_secs(10)).unwrap(),
            format!("GET {path} HTTP/1.1\r\n")
        );
    }
    assert_timed_out(&until_closed(&mut slow));
    assert_eq!(
        seen.recv_timeout(QUIET),
        Err(RecvTimeoutError::Timeout),
        "the backend saw the incomplete request"
    );
    assert_eq!(
        get(&mut other, &mut other_r, "/after"),
        (200, "/after".into())
    );
}

/// A kept-alive connection idle between requests past the timeout is not
/// timed: its next request is answered.
#[test]
fn an_idle_kept_alive_client_is_not_timed() {
    let mut procs = Procs(Vec::new());
    let (backend, _seen) = recording_backend();
    let port = balancer(&mut procs, backend);
    let mut s = support::connect(port);
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(get(&mut s, &mut r, "/first"), (200, "/first".into()));
    // Idle past the timeout (a wait for nothing to happen: no condition
    // to wait on).
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(get(&mut s, &mut r, "/second"), (200, "/second".into()));
}

/// The Memcached text proxy has no reply for a timeout: a data block that
/// stops short closes the connection with nothing sent; another client
/// is answered meanwhile.
#[test]
fn memcached_closes_a_request_that_stops() {
    let mut procs = Procs(Vec::new());
    let mc = support::memcached(&mut procs);
    let port = support::flick_run_with(
        &mut procs,
        "examples/memcached_ascii_proxy.flick",
        &[mc],
        &["--client-request-timeout-ms", TIMEOUT_MS],
    );
    let mut slow = support::connect(port);
    slow.write_all(b"set k 0 0 5\r\nab").unwrap();
    let mut other = support::connect(port);
    other.write_all(b"set o 0 0 1\r\nx\r\n").unwrap();
    assert_eq!(support::read_until(&mut other, b"\r\n"), b"STORED\r\n");
    assert_eq!(until_closed(&mut slow), "");
    other.write_all(b"get k\r\n").unwrap();
    assert_eq!(support::read_until(&mut other, b"END\r\n"), b"END\r\n");
}
