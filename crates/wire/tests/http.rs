//! The HTTP/1.1 grammar: heads, bodies streamed in pieces, limits with the
//! statuses a proxy answers, and the inputs that enable request smuggling.

use flick_wire::{Grammar, Parser, Progress, WireError};
use std::sync::Arc;

fn grammar() -> Arc<Grammar> {
    Grammar::stock("http").unwrap()
}

/// What a proxy sees of a stream of messages fed in `pieces`: each message's
/// head (as text), and every byte handed over, in order.
#[derive(Debug, PartialEq)]
struct Seen {
    heads: Vec<String>,
    passed: Vec<u8>,
}

fn feed(unit: &str, pieces: &[&[u8]], eof: bool) -> Result<Seen, WireError> {
    let g = grammar();
    let mut p = Parser::new(g.clone(), g.unit_id(unit).unwrap());
    let mut buf: Vec<u8> = Vec::new();
    let mut seen = Seen {
        heads: Vec::new(),
        passed: Vec::new(),
    };
    let mut streaming = false;
    let last = pieces.len();
    for (i, piece) in pieces.iter().enumerate() {
        buf.extend_from_slice(piece);
        loop {
            let at_end = eof && i + 1 == last;
            let r = if at_end {
                p.finish(&buf)?
            } else {
                p.parse(&buf)?
            };
            match r {
                Progress::NeedMore => break,
                Progress::Head(_) => {
                    seen.heads.push(format!("{:?}", p.message(&buf)));
                    streaming = true;
                }
                Progress::Stream(n) => {
                    seen.passed.extend(buf.drain(..n));
                }
                Progress::Done(n) => {
                    if !streaming {
                        seen.heads.push(format!("{:?}", p.message(&buf)));
                    }
                    seen.passed.extend(buf.drain(..n));
                    streaming = false;
                    p.reset();
                    if buf.is_empty() && !at_end {
                        break;
                    }
                    if buf.is_empty() {
                        return Ok(seen);
                    }
                }
            }
        }
    }
    assert!(
        buf.is_empty(),
        "bytes left over: {:?}",
        String::from_utf8_lossy(&buf)
    );
    Ok(seen)
}

fn whole(unit: &str, bytes: &[u8]) -> Result<Seen, WireError> {
    feed(unit, &[bytes], false)
}

const PIPELINE: &[u8] = b"GET /index.html HTTP/1.1\r\nHost: example.com\r\nConnection: keep-alive\r\n\r\n\
POST /up HTTP/1.1\r\nHost: a\r\ncontent-length: 5\r\n\r\nhello\
PUT /c HTTP/1.1\r\nHost: c\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nTrailer: t\r\n\r\n\
GET /old HTTP/1.0\r\n\r\n";

#[test]
fn pipelined_requests_parse_with_their_framing() {
    let seen = whole("request", PIPELINE).unwrap();
    assert_eq!(seen.passed, PIPELINE, "every byte is handed over, in order");
    assert_eq!(seen.heads.len(), 4);
    assert!(seen.heads[0].contains(r#"method: "GET""#) && seen.heads[0].contains("keep_alive: 1"));
    assert!(seen.heads[1].contains("content_length: 5"));
    assert!(seen.heads[2].contains("chunked: 1"));
    assert!(seen.heads[3].contains(r#"minor: "0""#) && seen.heads[3].contains("keep_alive: 0"));
}

#[test]
fn every_split_point_gives_the_same_messages() {
    let expected = whole("request", PIPELINE).unwrap();
    for cut in 0..=PIPELINE.len() {
        let (a, b) = PIPELINE.split_at(cut);
        assert_eq!(
            feed("request", &[a, b], false).unwrap(),
            expected,
            "split at {cut}"
        );
    }
    let bytes: Vec<&[u8]> = PIPELINE.chunks(1).collect();
    assert_eq!(
        feed("request", &bytes, false).unwrap(),
        expected,
        "byte by byte"
    );
}

#[test]
fn a_large_body_streams_through_a_small_buffer() {
    let body = vec![b'x'; 1 << 20];
    let mut msg = b"POST /big HTTP/1.1\r\nHost: a\r\nContent-Length: 1048576\r\n\r\n".to_vec();
    msg.extend_from_slice(&body);
    let pieces: Vec<&[u8]> = msg.chunks(4096).collect();
    let g = grammar();
    let mut p = Parser::new(g.clone(), g.unit_id("request").unwrap());
    let mut buf = Vec::new();
    let mut largest = 0;
    let mut passed = 0;
    for piece in pieces {
        buf.extend_from_slice(piece);
        largest = largest.max(buf.len());
        loop {
            match p.parse(&buf).unwrap() {
                Progress::NeedMore | Progress::Head(_) if buf.is_empty() => break,
                Progress::NeedMore => break,
                Progress::Head(_) => {}
                Progress::Stream(n) | Progress::Done(n) => {
                    passed += n;
                    buf.drain(..n);
                    if buf.is_empty() {
                        break;
                    }
                }
            }
        }
    }
    assert_eq!(passed, msg.len());
    assert!(largest <= 8192, "the buffer held {largest} bytes at once");
}

#[test]
fn responses_by_framing() {
    let stream = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc\
HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n\
HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
HTTP/1.0 200 OK\r\n\r\nuntil the connection closes";
    let seen = feed("response", &[stream], true).unwrap();
    assert_eq!(seen.passed, stream);
    assert_eq!(seen.heads.len(), 4);
    assert!(seen.heads[1].contains("status: 204") && seen.heads[1].contains("framing: 0"));
    assert!(seen.heads[3].contains("framing: 3"));
}

fn status_of(unit: &str, bytes: &[u8]) -> Option<u16> {
    match whole(unit, bytes) {
        Ok(s) => panic!("accepted: {s:?}"),
        Err(e) => e.status,
    }
}

#[test]
fn limits_answer_with_their_status() {
    let long_target = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(9000));
    assert_eq!(status_of("request", long_target.as_bytes()), Some(414));
    let many = format!("GET / HTTP/1.1\r\n{}\r\n", "X-A: b\r\n".repeat(101));
    assert_eq!(status_of("request", many.as_bytes()), Some(431));
    let big = format!(
        "GET / HTTP/1.1\r\n{}\r\n",
        format!("X-{}: {}\r\n", "a", "b".repeat(8000)).repeat(9)
    );
    assert_eq!(status_of("request", big.as_bytes()), Some(431));
    let long_value = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-A: {}\r\n\r\n",
        "b".repeat(9000)
    );
    assert_eq!(status_of("request", long_value.as_bytes()), Some(431));
    let huge_body = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999\r\n\r\n";
    assert_eq!(status_of("request", huge_body), Some(413));
}

#[test]
fn smuggling_vectors_are_rejected() {
    for (what, bytes) in [
        (
            "CL with TE",
            &b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                [..],
        ),
        (
            "differing CLs",
            b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        ),
        (
            "obsolete line folding",
            b"GET / HTTP/1.1\r\nX-A: b\r\n  folded\r\n\r\n",
        ),
        ("space before colon", b"GET / HTTP/1.1\r\nHost : a\r\n\r\n"),
        (
            "bad chunk size",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ),
        (
            "CL not a number",
            b"POST / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n",
        ),
        ("bad version", b"GET / HTTP/2.0\r\n\r\n"),
    ] {
        assert_eq!(status_of("request", bytes), Some(400), "{what}");
    }
    // Repeating the same Content-Length is allowed.
    assert!(whole(
        "request",
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\ncontent-length: 1\r\n\r\nx"
    )
    .is_ok());
}

#[test]
fn serialising_a_head_reproduces_it() {
    let g = grammar();
    let unit = g.unit_id("request").unwrap();
    let head = b"GET /a?b=c HTTP/1.1\r\nHost:example.com\r\nAccept:  */*\r\n\r\n";
    let mut p = Parser::new(g.clone(), unit);
    assert_eq!(p.parse(head).unwrap(), Progress::Done(head.len()));
    let mut slots = p.slots().to_vec();
    let mut out = Vec::new();
    g.serialize(unit, &mut slots, head, &mut out).unwrap();
    assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(head));
}

#[test]
fn a_bad_response_is_the_backends_fault() {
    for bytes in [
        &b"HTTP/1.1 200 OK\r\nBad Header: x\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ] {
        assert_eq!(
            status_of("response", bytes),
            Some(502),
            "{}",
            String::from_utf8_lossy(bytes)
        );
    }
}

mod roundtrip {
    use super::*;
    use proptest::prelude::*;

    fn token() -> impl Strategy<Value = String> {
        "[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]{0,15}"
    }

    proptest! {
        /// A generated request head parses to what was generated, and
        /// serialising the parse reproduces its bytes.
        #[test]
        fn request_heads_round_trip(
            method in "[A-Z]{1,10}",
            target in "/[a-z0-9/._-]{0,40}",
            minor in 0u8..2,
            headers in proptest::collection::vec((token(), "[ -~]{0,40}"), 0..8),
            spaces in 0usize..3,
        ) {
            let headers: Vec<(String, String)> = headers
                .into_iter()
                .filter(|(n, _)| !["content-length", "transfer-encoding", "host"].iter().any(|x| n.eq_ignore_ascii_case(x)))
                .map(|(n, v)| (n, v.trim().to_string()))
                .chain([("Host".to_string(), "example.com".to_string())])
                .collect();
            let mut head = format!("{method} {target} HTTP/1.{minor}\r\n");
            for (n, v) in &headers {
                head.push_str(&format!("{n}:{}{v}\r\n", " ".repeat(spaces)));
            }
            head.push_str("\r\n");
            let g = grammar();
            let unit = g.unit_id("request").unwrap();
            let mut p = Parser::new(g.clone(), unit);
            prop_assert_eq!(p.parse(head.as_bytes()).unwrap(), Progress::Done(head.len()));
            let m = p.message(head.as_bytes());
            prop_assert_eq!(m.bytes("method"), Some(method.as_bytes()));
            prop_assert_eq!(m.bytes("target"), Some(target.as_bytes()));
            let list = m.list("headers").unwrap();
            prop_assert_eq!(list.len(), headers.len());
            for (i, (n, v)) in headers.iter().enumerate() {
                let flick_wire::Value::Unit(h) = list.get(i) else { panic!("a header unit") };
                prop_assert_eq!(h.bytes("name"), Some(n.as_bytes()));
                prop_assert_eq!(h.bytes("value"), Some(v.as_bytes()));
            }
            let mut slots = p.slots().to_vec();
            let mut out = Vec::new();
            g.serialize(unit, &mut slots, head.as_bytes(), &mut out).unwrap();
            prop_assert_eq!(String::from_utf8_lossy(&out), head.as_str());
        }
    }
}

/// What a proxy answers in place of a backend (`%fault`) and to a request
/// that does not parse (`%reject`, with the request error's status): bodiless
/// HTTP/1.0 responses, after which the connection closes (`%ends`).
#[test]
fn fault_and_reject_replies() {
    let g = Grammar::stock("http").unwrap();
    let resp = g.unit_id("response").unwrap();
    let unset = vec![flick_wire::Slot::Unset; g.unit(resp).slots as usize];
    for (cause, status) in [(1, "503"), (2, "504"), (3, "502")] {
        let mut out = Vec::new();
        assert!(g.fault_reply(resp, &unset, &[], cause, &mut out).unwrap());
        assert_eq!(
            out,
            format!("HTTP/1.0 {status} Backend Error\r\n\r\n").as_bytes()
        );
    }
    let mut out = Vec::new();
    assert!(g.reject_reply(resp, Some(431), &mut out).unwrap());
    assert_eq!(out, b"HTTP/1.0 431 Rejected\r\n\r\n");
    // Read back, its head is all of it: the body runs to the close.
    let mut p = g.parser(resp);
    assert_eq!(p.parse(&out).unwrap(), Progress::Head(out.len()));
    assert_eq!(g.property(resp, "ends", p.slots(), &out), Some(1));
    let req = g.unit_id("request").unwrap();
    for (bytes, ends) in [
        (&b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..], 0),
        (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 1),
        (b"GET / HTTP/1.0\r\n\r\n", 1),
    ] {
        let mut p = g.parser(req);
        assert_eq!(p.parse(bytes).unwrap(), Progress::Done(bytes.len()));
        assert_eq!(g.property(req, "ends", p.slots(), bytes), Some(ends));
    }
}

/// The routing property `name` of each message of `stream`, taken from its
/// head.
fn properties(unit: &str, stream: &[u8], name: &str) -> Vec<Option<i128>> {
    let g = grammar();
    let u = g.unit_id(unit).unwrap();
    let mut p = Parser::new(g.clone(), u);
    let mut rest = stream;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let mut head = None;
        loop {
            match p.parse(rest).unwrap() {
                Progress::Head(_) => head = Some(g.property(u, name, p.slots(), rest)),
                Progress::Stream(n) => rest = &rest[n..],
                Progress::Done(n) => {
                    out.push(head.unwrap_or_else(|| g.property(u, name, p.slots(), rest)));
                    rest = &rest[n..];
                    break;
                }
                Progress::NeedMore => panic!("truncated: {:?}", String::from_utf8_lossy(rest)),
            }
        }
        p.reset();
    }
    out
}

/// 1xx responses are interim (RFC 9110 section 15.2): each is passed on at
/// once and followed by more responses to the same request (`%more`), and
/// none ends the client's session; the final response does. 101 Switching
/// Protocols would turn the connection into something else, which a
/// balancer does not do: it is the backend's fault, 502.
#[test]
fn interim_responses_are_followed_by_the_final_one() {
    let stream = b"HTTP/1.1 100 Continue\r\n\r\n\
HTTP/1.1 102 Processing\r\n\r\n\
HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n\
HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    assert_eq!(
        properties("response", stream, "more"),
        [Some(1), Some(1), Some(1), Some(0)]
    );
    let closing = b"HTTP/1.1 100 Continue\r\nConnection: close\r\n\r\n\
HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(properties("response", closing, "ends"), [Some(0), Some(1)]);
    assert_eq!(
        status_of(
            "response",
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        ),
        Some(502)
    );
}

/// A NUL, a bare CR or a bare LF in a field value (RFC 9110 section 5.5,
/// RFC 9112 section 2.2) is refused: a backend that ends lines at a bare LF
/// would read the rest as a line of its own, a second request even. So
/// are they in the request target, a reason phrase and a chunk's size line
/// (its extensions), where they would split a line the same way.
#[test]
fn field_values_with_nul_cr_or_lf_are_refused() {
    let requests: [&[u8]; 9] = [
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\nGET /smuggled HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\rb\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\0b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\r\nX: a\r\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: t\nX: a\r\n\r\n",
        // A trailer.
        b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: a\nb\r\n\r\n",
        // A chunk extension.
        b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n1;a\nb\r\nx\r\n0\r\n\r\n",
        // The target.
        b"GET /a\nb HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /a\0b HTTP/1.1\r\nHost: t\r\n\r\n",
    ];
    for bytes in requests {
        assert_eq!(
            status_of("request", bytes),
            Some(400),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    let responses: [&[u8]; 5] = [
        b"HTTP/1.1 200 OK\r\nX: a\nSet-Cookie: s=1\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\0\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: a\rb\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;a\nb\r\nx\r\n0\r\n\r\n",
        b"HTTP/1.1 200 O\nK\r\nContent-Length: 0\r\n\r\n",
    ];
    for bytes in responses {
        assert_eq!(
            status_of("response", bytes),
            Some(502),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    // Tabs and bytes above 0x7f (obs-text) are allowed in a value.
    let fine = b"GET / HTTP/1.1\r\nHost: t\r\nX: a\tcaf\xc3\xa9 \"q\"\r\n\r\n";
    assert!(whole("request", fine).is_ok());
    let fine = b"HTTP/1.1 200 OK\r\nX: a\tcaf\xc3\xa9\r\nContent-Length: 0\r\n\r\n";
    assert!(whole("response", fine).is_ok());
}

/// More than one Host field is 400 (RFC 9112 section 3.2), in HTTP/1.0
/// too, and so is none in HTTP/1.1; an HTTP/1.0 request without one is
/// fine.
#[test]
fn more_than_one_host_is_refused() {
    for bytes in [
        &b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
        b"GET / HTTP/1.0\r\nHost: a\r\nHOST: b\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nX-Host: a\r\n\r\n",
    ] {
        assert_eq!(
            status_of("request", bytes),
            Some(400),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert!(whole("request", b"GET / HTTP/1.0\r\n\r\n").is_ok());
    assert!(whole("request", b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").is_ok());
}

/// A request's Transfer-Encoding must be exactly `chunked`, the only coding
/// the balancer (and the backend it shares connections with) can be relied
/// on to frame alike; any other ending in chunked is 501 (RFC 9112 section
/// 6.1), one not ending in chunked 400 (section 6.3). With a Content-Length
/// too, it stays 400.
#[test]
fn transfer_codings_other_than_chunked_alone_are_501() {
    for (what, bytes) in [
        (
            "gzip, chunked",
            &b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"[..],
        ),
        (
            "chunked, chunked",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
        ),
        (
            "two fields",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        (
            "empty item",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: , chunked\r\n\r\n0\r\n\r\n",
        ),
    ] {
        assert_eq!(status_of("request", bytes), Some(501), "{what}");
    }
    // Where chunked is not the last coding, the body's length is unknown:
    // 400 (RFC 9112 section 6.3).
    for (what, bytes) in [
        (
            "identity",
            &b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n"[..],
        ),
        (
            "chunked, gzip",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        ),
        (
            "empty",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n",
        ),
    ] {
        assert_eq!(status_of("request", bytes), Some(400), "{what}");
    }
    assert_eq!(
        status_of(
            "request",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: gzip\r\n\r\nx"
        ),
        Some(400),
        "CL with TE"
    );
    for te in ["chunked", "Chunked", "CHUNKED", "chunked  "] {
        let bytes = format!(
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: {te}\r\n\r\n1\r\nx\r\n0\r\n\r\n"
        );
        let seen = whole("request", bytes.as_bytes()).unwrap_or_else(|e| panic!("{te:?}: {e}"));
        assert!(seen.heads[0].contains("chunked: 1"), "{te:?}");
    }
}

/// A request asking to switch protocols reaches the backend without its
/// `Upgrade` field (hop-by-hop, RFC 9110 section 7.8), which the balancer
/// does not implement.
#[test]
fn upgrade_is_not_passed_on() {
    let g = grammar();
    let unit = g.unit_id("request").unwrap();
    let head = b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
    let mut p = Parser::new(g.clone(), unit);
    assert_eq!(p.parse(head).unwrap(), Progress::Done(head.len()));
    let cx = flick_wire::ForwardContext {
        peer_address: b"10.0.0.1",
        session_ends: false,
    };
    let mut out = Vec::new();
    g.forward(unit, p.slots(), head, false, &cx, &mut out)
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out),
        "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n"
    );
}

/// Empty lines before a request line (CRLF, or a bare LF) are skipped
/// (RFC 9112 section 2.2), in any split, and are not passed on; more than
/// 1 KiB of them is 400, and a space before the method is still refused.
#[test]
fn empty_lines_before_a_request_line_are_skipped() {
    let g = grammar();
    let unit = g.unit_id("request").unwrap();
    for lead in ["\r\n", "\n", "\r\n\r\n\n"] {
        let bytes =
            format!("{lead}GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n");
        let seen = whole("request", bytes.as_bytes()).unwrap();
        assert_eq!(seen.heads.len(), 2, "{lead:?}");
        assert!(seen.heads[0].contains(r#"method: "GET""#), "{lead:?}");
        for cut in 0..=bytes.len() {
            let (a, b) = bytes.as_bytes().split_at(cut);
            assert_eq!(
                feed("request", &[a, b], false).unwrap(),
                seen,
                "split at {cut}"
            );
        }
        let mut p = Parser::new(g.clone(), unit);
        let head = format!("{lead}GET /a HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(
            p.parse(head.as_bytes()).unwrap(),
            Progress::Done(head.len())
        );
        let cx = flick_wire::ForwardContext {
            peer_address: b"10.0.0.1",
            session_ends: false,
        };
        let mut out = Vec::new();
        g.forward(unit, p.slots(), head.as_bytes(), false, &cx, &mut out)
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "GET /a HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n",
            "{lead:?}"
        );
        // The interpreter agrees with the generated code.
        let mut i = Parser::new(g.clone(), unit).interpreted();
        assert_eq!(
            i.parse(head.as_bytes()).unwrap(),
            Progress::Done(head.len())
        );
    }
    let many = format!("{}GET / HTTP/1.1\r\nHost: a\r\n\r\n", "\r\n".repeat(600));
    assert_eq!(status_of("request", many.as_bytes()), Some(400));
    assert_eq!(
        status_of("request", b" GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
        Some(400)
    );
}

/// A response with both Transfer-Encoding and Content-Length is the
/// backend's fault (502), whatever the coding: a proxy passing it on
/// would leave the framing to whoever reads it next.
#[test]
fn a_response_with_transfer_encoding_and_content_length_is_refused() {
    for bytes in [
        &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: gzip\r\n\r\nabc",
    ] {
        assert_eq!(
            status_of("response", bytes),
            Some(502),
            "{}",
            String::from_utf8_lossy(bytes)
        );
    }
}

fn parse_with_body_limit(limit: Option<i128>, bytes: &[u8]) -> Result<usize, WireError> {
    let mut g = Grammar::from_source("http", flick_wire::stock::source("http").unwrap()).unwrap();
    assert_eq!(
        g.limits().collect::<Vec<_>>(),
        [("max_body_bytes", 1 << 20)],
        "the grammar's limit and its default"
    );
    if let Some(l) = limit {
        assert!(g.set_limit("max_body_bytes", l));
    }
    assert!(!g.set_limit("no_such_limit", 1));
    let g = Arc::new(g);
    let unit = g.unit_id("request").unwrap();
    let mut passed = 0;
    for mut p in [
        Parser::new(g.clone(), unit),
        Parser::new(g.clone(), unit).interpreted(),
    ] {
        passed = 0;
        let mut buf = bytes;
        loop {
            match p.parse(buf)? {
                Progress::NeedMore => panic!("a whole message needs no more"),
                Progress::Head(_) => {}
                Progress::Stream(n) => {
                    passed += n;
                    buf = &buf[n..];
                }
                Progress::Done(n) => {
                    passed += n;
                    break;
                }
            }
        }
    }
    Ok(passed)
}

/// A request body over the `max_body_bytes` limit (1 MiB unless set) is
/// 413: a Content-Length from the head, a chunked body at the chunk that
/// takes the chunks' total over it.
#[test]
fn a_body_over_max_body_bytes_is_413() {
    let cl = |n: usize| {
        let mut m =
            format!("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: {n}\r\n\r\n").into_bytes();
        m.resize(m.len() + n, b'x');
        m
    };
    let chunked = |sizes: &[usize]| {
        let mut m = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for s in sizes {
            m.extend_from_slice(format!("{s:x}\r\n").as_bytes());
            m.resize(m.len() + s, b'x');
            m.extend_from_slice(b"\r\n");
        }
        m.extend_from_slice(b"0\r\n\r\n");
        m
    };
    let status = |r: Result<usize, WireError>| r.map_err(|e| e.status);
    let mib = 1 << 20;
    let m = cl(mib);
    assert_eq!(status(parse_with_body_limit(None, &m)), Ok(m.len()));
    assert_eq!(
        status(parse_with_body_limit(None, &cl(mib + 1))),
        Err(Some(413))
    );
    let m = chunked(&[mib / 2, mib / 2]);
    assert_eq!(status(parse_with_body_limit(None, &m)), Ok(m.len()));
    assert_eq!(
        status(parse_with_body_limit(
            None,
            &chunked(&[mib / 2, mib / 2, 1])
        )),
        Err(Some(413))
    );
    // Set when the grammar loads.
    assert_eq!(
        status(parse_with_body_limit(Some(10), &cl(11))),
        Err(Some(413))
    );
    let m = cl(10);
    assert_eq!(status(parse_with_body_limit(Some(10), &m)), Ok(m.len()));
    assert_eq!(
        status(parse_with_body_limit(Some(10), &chunked(&[4, 4, 3]))),
        Err(Some(413))
    );
    let m = chunked(&[4, 4, 2]);
    assert_eq!(status(parse_with_body_limit(Some(10), &m)), Ok(m.len()));
    let m = cl(3 * mib);
    assert_eq!(
        status(parse_with_body_limit(Some(4 * mib as i128), &m)),
        Ok(m.len())
    );
    // The count starts again with each message.
    let mut two = chunked(&[6]);
    two.extend_from_slice(&chunked(&[6]));
    let g = {
        let mut g =
            Grammar::from_source("http", flick_wire::stock::source("http").unwrap()).unwrap();
        g.set_limit("max_body_bytes", 10);
        Arc::new(g)
    };
    let mut p = Parser::new(g.clone(), g.unit_id("request").unwrap());
    let mut buf = &two[..];
    let mut done = 0;
    while done < 2 {
        match p.parse(buf).unwrap() {
            Progress::NeedMore => panic!("whole messages"),
            Progress::Head(_) => {}
            Progress::Stream(n) => buf = &buf[n..],
            Progress::Done(n) => {
                buf = &buf[n..];
                done += 1;
                p.reset();
            }
        }
    }
}

/// The request target, the Host value and a chunk's size line are
/// checked as RFC 9112 and RFC 3986 write them: what fails is 400, and
/// what they allow (the forms nginx and HAProxy pass) parses.
#[test]
fn targets_hosts_and_chunk_lines_are_checked() {
    let chunked = |line: &str| {
        format!(
            "POST /p HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n{line}\r\nhello\r\n0\r\n\r\n"
        )
    };
    for (what, bytes) in [
        (
            "no slash",
            "GET echo HTTP/1.1\r\nHost: t\r\n\r\n".to_string(),
        ),
        (
            "fragment",
            "GET /e#f HTTP/1.1\r\nHost: t\r\n\r\n".to_string(),
        ),
        (
            "control byte",
            "GET /e?x=\x01 HTTP/1.1\r\nHost: t\r\n\r\n".to_string(),
        ),
        ("DEL", "GET /e\x7f HTTP/1.1\r\nHost: t\r\n\r\n".to_string()),
        (
            "bad percent",
            "GET /e?x=%zz HTTP/1.1\r\nHost: t\r\n\r\n".to_string(),
        ),
        (
            "cut percent",
            "GET /e%4 HTTP/1.1\r\nHost: t\r\n\r\n".to_string(),
        ),
        (
            "empty scheme",
            "GET :x HTTP/1.1\r\nHost: t\r\n\r\n".to_string(),
        ),
        (
            "query before colon",
            "GET a?b:c HTTP/1.1\r\nHost: t\r\n\r\n".to_string(),
        ),
        (
            "host space",
            "GET / HTTP/1.1\r\nHost: t evil\r\n\r\n".to_string(),
        ),
        (
            "host port",
            "GET / HTTP/1.1\r\nHost: t:8o\r\n\r\n".to_string(),
        ),
        (
            "host two ports",
            "GET / HTTP/1.1\r\nHost: t:80:80\r\n\r\n".to_string(),
        ),
        (
            "host bad percent",
            "GET / HTTP/1.1\r\nHost: t%g0\r\n\r\n".to_string(),
        ),
        (
            "host open bracket",
            "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n".to_string(),
        ),
        (
            "host after bracket",
            "GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n".to_string(),
        ),
        (
            "host bracket port",
            "GET / HTTP/1.1\r\nHost: [::1]:8o\r\n\r\n".to_string(),
        ),
        (
            "host userinfo",
            "GET / HTTP/1.1\r\nHost: u@t\r\n\r\n".to_string(),
        ),
        (
            "host path",
            "GET / HTTP/1.1\r\nHost: t/x\r\n\r\n".to_string(),
        ),
        ("size leading space", chunked(" 5")),
        ("size trailing space", chunked("5 ")),
        ("size 0x", chunked("0x5")),
        ("size empty", chunked("")),
        ("ext empty name", chunked("5;")),
        ("ext empty name before value", chunked("5;=b")),
        ("ext open quote", chunked("5;a=\"b")),
        ("ext empty value", chunked("5;a=")),
        ("ext two equals", chunked("5;a==b")),
        ("ext bad token", chunked("5;a=b(c")),
        ("ext NUL", chunked("5;a=b\0")),
        ("ext NUL quoted", chunked("5;a=\"b\0\"")),
        ("ext bare CR", chunked("5;a=b\rc")),
        ("ext bare LF", chunked("5;a=b\nc")),
        ("ext junk after quote", chunked("5;a=\"b\"c")),
    ] {
        assert_eq!(status_of("request", bytes.as_bytes()), Some(400), "{what}");
    }
    for (what, bytes) in [
        ("origin", "GET /a/b?c=d&e=/f?g:h@i HTTP/1.1\r\nHost: t\r\n\r\n".to_string()),
        ("percent", "GET /%65cho%2Fx HTTP/1.1\r\nHost: t\r\n\r\n".to_string()),
        ("absolute", "GET http://t/e HTTP/1.1\r\nHost: t\r\n\r\n".to_string()),
        ("absolute upper", "GET HTTP://t/e HTTP/1.1\r\nHost: t\r\n\r\n".to_string()),
        ("asterisk", "OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n".to_string()),
        ("high bytes", "GET /caf\u{e9} HTTP/1.1\r\nHost: t\r\n\r\n".to_string()),
        ("host port", "GET / HTTP/1.1\r\nHost: t:8080\r\n\r\n".to_string()),
        ("host ipv6", "GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n".to_string()),
        ("host ipv6 no port", "GET / HTTP/1.1\r\nHost: [fe80::1]\r\n\r\n".to_string()),
        ("host ows", "GET / HTTP/1.1\r\nHost:   t  \r\n\r\n".to_string()),
        ("host empty", "GET / HTTP/1.1\r\nHost:\r\n\r\n".to_string()),
        ("host empty port", "GET / HTTP/1.1\r\nHost: t:\r\n\r\n".to_string()),
        ("host ipv4", "GET / HTTP/1.1\r\nHost: 10.0.0.1:80\r\n\r\n".to_string()),
        ("host sub-delims", "GET / HTTP/1.1\r\nHost: a-b_c.d~e!$&'()*+,;=%41\r\n\r\n".to_string()),
        ("no host in 1.0", "GET / HTTP/1.0\r\n\r\n".to_string()),
        (
            "size upper",
            "POST /p HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nA\r\nhelloworld\r\n0\r\n\r\n"
                .to_string(),
        ),
        ("size zeros", chunked("0005")),
        ("ext", chunked("5;a=b")),
        ("ext name only", chunked("5;a")),
        ("ext several", chunked("5;a=b;c;d=\"e;f\"")),
        ("ext quoted", chunked("5;a=\"x y\"")),
        ("ext quoted tab", chunked("5;a=\"x\ty\"")),
        ("ext bws", chunked("5 ;a=b")),
        ("ext bws around", chunked("5\t; a = b ;c")),
    ] {
        assert!(whole("request", bytes.as_bytes()).is_ok(), "{what}");
    }
}
