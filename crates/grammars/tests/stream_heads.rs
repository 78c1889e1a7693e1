//! Heads of messages with a streamed body, parsed by generated code and
//! handed over to the interpreter at the body: for HTTP requests and
//! responses with Content-Length bodies (and the bodiless, chunked and
//! bad ones around them), one after another in a buffer, whole and split
//! at every byte, a parser that runs generated code first reports the
//! same progress, values, resumption state and errors as one that only
//! interprets. And generated code does parse the heads.

mod common;

use flick_wire::{Grammar, Parser, Progress, Slot};

fn parsers(unit: &str, context: i128) -> (Parser, Parser) {
    flick_grammars::install();
    let g = Grammar::stock("http").unwrap();
    let id = g.unit_id(unit).unwrap();
    let mut fast = g.parser(id);
    assert!(fast.is_compiled());
    let mut slow = g.parser(id).interpreted();
    fast.set_reply_context(context);
    slow.set_reply_context(context);
    (fast, slow)
}

/// The set slots, with their index.
fn set_of(p: &Parser) -> Vec<(usize, Slot)> {
    p.slots()
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != Slot::Unset)
        .map(|(i, s)| (i, *s))
        .collect()
}

/// [`common::drive`] logging the slots set at each message done and, at
/// a head, with the state the interpreter resumes from.
fn drive(p: &mut Parser, data: &[u8], cut: usize) -> Vec<String> {
    common::drive(
        p,
        data,
        cut,
        |p, n| format!("done {n} {:?}", set_of(p)),
        |p, n| format!("head {n} {:?} {}", set_of(p), p.resume_state()),
    )
}

const RESPONSES: &[&str] = &[
    "HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Type: text/html\r\nContent-Length: 12\r\nConnection: keep-alive\r\n\r\nhello world\n",
    "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
    "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n",
    "HTTP/1.0 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    "HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nnope",
    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "HTTP/1.1 500 Oops\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nContent-Length: 1\r\n\r\nx",
    "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
    "HTTP/1.1 200 OK\r\nContent-Length: x1\r\n\r\nabc",
    "HTTP/1.1 101 Switching\r\nContent-Length: 1\r\n\r\nx",
    "HTTP/1.1 200 OK\r\n\r\nuntil the end",
];

const REQUESTS: &[&str] = &[
    "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
    "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    "PUT /x HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\nContent-Length: 1\r\nConnection: close\r\n\r\n!",
    "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
    "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
    "POST / HTTP/1.0\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nabc",
    "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999\r\n\r\nabc",
    "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\nabc",
];

/// Both parsers over `data`, offered whole and split at every byte.
fn agree(unit: &str, context: i128, data: &[u8]) {
    for cut in 0..=data.len() {
        // Fresh parsers for each offer: no state of an earlier run counts.
        let (mut f, mut s) = parsers(unit, context);
        let (got, want) = (drive(&mut f, data, cut), drive(&mut s, data, cut));
        assert_eq!(
            got,
            want,
            "{unit} context {context} cut at {cut}: {:?}",
            String::from_utf8_lossy(data)
        );
    }
}

#[test]
fn each_response_alone_and_split() {
    for context in [0, 1] {
        for r in RESPONSES {
            agree("response", context, r.as_bytes());
        }
    }
}

#[test]
fn each_request_alone_and_split() {
    for r in REQUESTS {
        agree("request", 0, r.as_bytes());
    }
}

/// Messages one after another in a buffer: a head handed over after a
/// message the code finished with more headers, and the reverse, leaves no
/// slot of the message before.
#[test]
fn messages_in_sequence() {
    for (unit, msgs) in [("response", RESPONSES), ("request", REQUESTS)] {
        for a in msgs.iter() {
            for b in msgs.iter() {
                let data = format!("{a}{b}{a}");
                let (mut f, mut s) = parsers(unit, 0);
                let len = data.len();
                assert_eq!(
                    drive(&mut f, data.as_bytes(), len),
                    drive(&mut s, data.as_bytes(), len),
                    "{unit}: {data:?}"
                );
            }
        }
    }
}

/// Generated code parses a head with a Content-Length body, and the
/// interpreter, handed it, streams the body from the right place.
#[test]
fn generated_code_parses_the_head() {
    let (mut f, _) = parsers("response", 0);
    let data = RESPONSES[0].as_bytes();
    let head = data.len() - 12;
    assert_eq!(f.parse(data).unwrap(), Progress::Head(head));
    assert_eq!(f.compiled_heads(), 1);
    assert_eq!(f.parse(data).unwrap(), Progress::Stream(data.len()));
    assert_eq!(f.parse(&[]).unwrap(), Progress::Done(0));
    f.reset();
    let (mut f, _) = parsers("request", 0);
    let data = REQUESTS[0].as_bytes();
    assert_eq!(f.parse(data).unwrap(), Progress::Head(data.len() - 5));
    assert_eq!(f.compiled_heads(), 1);
}

/// Chunks: the streamed data is followed by more of the unit (a CRLF, or
/// trailers after the last chunk), which the interpreter parses after the
/// hand-over.
#[test]
fn chunks_alone_split_and_in_sequence() {
    const CHUNKS: &[&str] = &[
        "5\r\nhello\r\n",
        "3;name=value\r\nabc\r\n",
        "0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n",
        "0\r\n\r\n",
        "1\r\nxy",
        "zz\r\n",
    ];
    for unit in ["chunk", "response_chunk"] {
        for c in CHUNKS {
            agree(unit, 0, c.as_bytes());
        }
        for a in CHUNKS {
            for b in CHUNKS {
                let data = format!("{a}{b}{a}");
                let (mut f, mut s) = parsers(unit, 0);
                let len = data.len();
                let got = drive(&mut f, data.as_bytes(), len);
                assert_eq!(got, drive(&mut s, data.as_bytes(), len), "{unit}: {data:?}");
            }
        }
    }
}
