//! HTTP/1.1 clients over loopback for the tests of served programs, and
//! the types those programs read and answer with.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// A program of the `http` grammar whose rule reads a `request` and
/// answers a `simple_response`: those two types, then `$rest`, the
/// program's processes and functions.
macro_rules! http_program {
    ($rest:literal) => {
        concat!(
            "grammar http

type request: record
  target : string

type simple_response: record
  status : integer {size=2}
  reason : string
  body : string

",
            $rest
        )
    };
}
pub(crate) use http_program;

/// The whole answer to `GET target` (`Connection: close`) over a new
/// connection to `port`, each read waiting at most `wait`; or the error.
pub fn get_answer(port: u16, target: &str, wait: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(wait))?;
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer)
}

/// What answers `raw` sent over a new connection to the Unix socket
/// `sock`, read to its end (each read waiting at most 10 s); a write or
/// read that fails ends it, so a refusal that closes early still shows.
pub fn unix_exchange(sock: &Path, raw: &[u8]) -> String {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(raw);
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
}

/// A 200 answer's reason and body; `None` for any other answer.
pub fn ok_parts(answer: &str) -> Option<(String, String)> {
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((answer, ""));
    let reason = head.lines().next()?.strip_prefix("HTTP/1.1 200 ")?;
    Some((reason.to_string(), body.to_string()))
}

/// `GET target`'s reason and body where it was answered 200 within
/// `wait`; `None` where it was not (a connection left in the backlog of a
/// version that stops is reset, as the reload documents).
pub fn try_get(port: u16, target: &str, wait: Duration) -> Option<(String, String)> {
    ok_parts(&get_answer(port, target, wait).ok()?)
}

/// `GET target`'s reason and body; panics unless it is answered 200
/// within 10 s.
pub fn get(port: u16, target: &str) -> (String, String) {
    let answer = get_answer(port, target, Duration::from_secs(10)).unwrap();
    ok_parts(&answer).unwrap_or_else(|| panic!("not a 200 answer: {answer:?}"))
}

/// Asks `GET {prefix}N` for N = 0, 1, ..., a target never asked before
/// each time, each waiting at most `wait`, until a 200 answer's reason
/// and body satisfy `done`; panics with `what` past `deadline`. A server
/// just listening may not answer a first request in time, and one that
/// reaches a version as it stops is reset: both are asked again.
pub fn ask_until(
    port: u16,
    prefix: &str,
    wait: Duration,
    deadline: Instant,
    what: &str,
    done: impl Fn(&str, &str) -> bool,
) {
    let mut n = 0;
    while !try_get(port, &format!("{prefix}{n}"), wait).is_some_and(|(r, b)| done(&r, &b)) {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
        n += 1;
    }
}

/// `GET target`'s reason and body, asked again until it is answered 200
/// within `wait` (until the old version has closed its listener, a new
/// connection may still land in its backlog, and be reset); panics past
/// `deadline`.
pub fn get_until_answered(
    port: u16,
    target: &str,
    wait: Duration,
    deadline: Instant,
) -> (String, String) {
    loop {
        if let Some(answer) = try_get(port, target, wait) {
            return answer;
        }
        assert!(Instant::now() < deadline, "{target} never answered");
    }
}

/// Counts requests per target in dictionaries of values: `hits`
/// (integers), `first` (the target as first seen, a string of at most 32
/// bytes) and `again` (booleans). A target's first request answers `New`
/// and `1`; the second `Second` and `2`; later ones the target as it was
/// first kept (reason) and the count (body).
pub const COUNTS: &str = http_program!(
    "proc Counts: (request/simple_response client)
  global hits := empty_dict
  global first := empty_dict
  global again := empty_dict
  | client => count(hits, first, again, client)

fun count: (hits: ref dict<string*integer>, first: ref dict<string*string {max=32}>, again: ref dict<string*bool>, -/simple_response client, req: request) -> ()
  if hits[req.target] = None:
    hits[req.target] := 1
    first[req.target] := req.target
    again[req.target] := False
    simple_response(200, \"New\", \"1\") => client
  else:
    hits[req.target] := hits[req.target] + 1
    if again[req.target]:
      simple_response(200, first[req.target], to_string(hits[req.target])) => client
    else:
      again[req.target] := True
      simple_response(200, \"Second\", to_string(hits[req.target])) => client
"
);

/// Connections a [`path_backend`] accepted, has open now, and had open at
/// most at once.
#[derive(Default)]
pub struct BackendConns {
    pub accepted: std::sync::atomic::AtomicUsize,
    pub open: std::sync::atomic::AtomicUsize,
    pub most: std::sync::atomic::AtomicUsize,
}

/// A backend of the test's own on a free loopback port: it answers each
/// GET with its path after `delay`, on kept-alive connections, and counts
/// its connections in what it returns.
pub fn path_backend(delay: Duration) -> (u16, std::sync::Arc<BackendConns>) {
    use std::sync::atomic::Ordering::SeqCst;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let conns = std::sync::Arc::new(BackendConns::default());
    let counts = conns.clone();
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            counts.accepted.fetch_add(1, SeqCst);
            let n = counts.open.fetch_add(1, SeqCst) + 1;
            counts.most.fetch_max(n, SeqCst);
            let counts = counts.clone();
            std::thread::spawn(move || {
                answer_paths(s, delay);
                counts.open.fetch_sub(1, SeqCst);
            });
        }
    });
    (port, conns)
}

fn answer_paths(s: TcpStream, delay: Duration) {
    use std::io::BufRead;
    // Bounded: a test that fails leaves no thread behind for long.
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = std::io::BufReader::new(s);
    loop {
        let mut line = String::new();
        let mut path = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if path.is_empty() {
                path = line.split(' ').nth(1).unwrap_or("").to_string();
            }
            if line == "\r\n" {
                break;
            }
        }
        std::thread::sleep(delay);
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{path}",
            path.len()
        );
        if w.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// A GET of `path` on kept-alive connection `s`: the status, and for a 200
/// the body checked to be the path (a [`path_backend`]'s answer: the
/// client's own).
pub fn get_kept_alive(s: &mut std::io::BufReader<TcpStream>, path: &str) -> u16 {
    use std::io::BufRead;
    s.get_mut()
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
        .unwrap();
    let mut status = 0;
    let mut len = 0;
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            s.read_line(&mut line).unwrap() > 0,
            "closed before a response"
        );
        if status == 0 {
            status = line
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut body = vec![0; len];
    s.read_exact(&mut body).unwrap();
    if status == 200 {
        assert_eq!(String::from_utf8_lossy(&body), path, "the client's own");
    }
    status
}
