//! Records a program builds for its replies: one built from constants
//! alone is kept and copied for later requests, so each of several such
//! replies must still go where its branch says, and one built from the
//! request must be built anew each time.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use support::{http_reply, serve_source};

/// Two pages of constants, a reply that echoes the request's target, and
/// a 404 of constants.
const PAGES: &str = r#"grammar http

type request: record
  target : string

type simple_response: record
  status : integer {size=2}
  reason : string
  body : string

proc Pages: (request/simple_response client)
  | client => respond(client)

fun respond: (-/simple_response client, req: request) -> ()
  if req.target = "/a":
    simple_response(200, "OK", "page a") => client
  else:
    if req.target = "/b":
      simple_response(200, "OK", "page b, longer") => client
    else:
      if req.target = "/missing":
        simple_response(404, "Not Found", "no such page") => client
      else:
        simple_response(200, "OK", req.target) => client
"#;

/// Sends a GET for `target` and reads one reply: its status line and body.
fn get(c: &mut TcpStream, target: &str) -> (String, String) {
    let (status, _, body) = exchange(c, target, "");
    (status, body)
}

/// Sends a GET for `target` with `more` header lines and reads one
/// reply: its status line, its head and its body.
fn exchange(c: &mut TcpStream, target: &str, more: &str) -> (String, String, String) {
    write!(c, "GET {target} HTTP/1.1\r\nHost: flick\r\n{more}\r\n").unwrap();
    let mut buf = [0u8; 1024];
    let (head, whole) = http_reply(c, &mut buf);
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
    let head = text(&buf[..head - 4]);
    let status = head.lines().next().unwrap().to_string();
    (status, head.clone(), text(&buf[head.len() + 4..whole]))
}

#[test]
fn replies_built_from_constants_and_from_requests_each_answer_their_own() {
    let service = serve_source(PAGES, &[], Default::default());
    let mut c = TcpStream::connect(service.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let ok = "HTTP/1.1 200 OK".to_string();
    for round in 0..3 {
        for (target, want) in [
            ("/a", (ok.clone(), "page a".to_string())),
            ("/echo/1", (ok.clone(), "/echo/1".to_string())),
            ("/b", (ok.clone(), "page b, longer".to_string())),
            (
                "/missing",
                (
                    "HTTP/1.1 404 Not Found".to_string(),
                    "no such page".to_string(),
                ),
            ),
            ("/echo/22", (ok.clone(), "/echo/22".to_string())),
            ("/a", (ok.clone(), "page a".to_string())),
        ] {
            assert_eq!(get(&mut c, target), want, "round {round}, {target}");
        }
    }
}

/// A kept reply passes on as it was built while the client stays, and
/// says `Connection: close` on the client's last request, after which the
/// connection closes.
#[test]
fn a_kept_reply_says_connection_close_on_the_last_request_alone() {
    let service = serve_source(PAGES, &[], Default::default());
    let mut c = TcpStream::connect(service.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for _ in 0..3 {
        let (status, head, body) = exchange(&mut c, "/a", "");
        assert_eq!(
            (status.as_str(), body.as_str()),
            ("HTTP/1.1 200 OK", "page a")
        );
        assert!(!head.to_ascii_lowercase().contains("connection:"), "{head}");
    }
    let (status, head, body) = exchange(&mut c, "/a", "Connection: close\r\n");
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("HTTP/1.1 200 OK", "page a")
    );
    assert!(head.contains("Connection: close"), "{head}");
    let mut rest = [0u8; 16];
    assert_eq!(
        c.read(&mut rest).unwrap(),
        0,
        "the connection closes after it"
    );
}
