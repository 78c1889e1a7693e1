//! What a proxy needs of a grammar beyond parsing. `%forward`: what it
//! changes in a message it passes on (HTTP drops the hop-by-hop header
//! fields, keeps the backend connection open, adds `X-Forwarded-For`, and
//! tells the client whether its connection stays). `%reply_context`: what
//! a request tells the parse of its reply (a HEAD request's response has
//! no body).

use flick_wire::{ForwardContext, Grammar, Parser, Progress};

/// `bytes` as the proxy passes them on: the edited head, and whether the
/// message streams (only its head is written then).
fn forwarded(unit: &str, bytes: &[u8], cx: ForwardContext) -> (String, bool) {
    let g = Grammar::stock("http").unwrap();
    let unit = g.unit_id(unit).unwrap();
    let mut p = Parser::new(g.clone(), unit);
    let head_only = match p.parse(bytes).unwrap() {
        Progress::Done(n) => {
            assert_eq!(n, bytes.len(), "one whole message");
            false
        }
        Progress::Head(_) => true,
        other => panic!("{other:?}"),
    };
    let mut out = Vec::new();
    g.forward(unit, p.slots(), bytes, head_only, &cx, &mut out)
        .unwrap();
    (String::from_utf8(out).unwrap(), head_only)
}

const CLIENT: ForwardContext = ForwardContext {
    peer_address: b"127.0.0.7",
    session_ends: false,
};

#[test]
fn a_request_loses_its_hop_by_hop_fields_and_gains_x_forwarded_for() {
    let (out, _) = forwarded(
        "request",
        b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTE: trailers\r\nAccept:  */*\r\nkeep-alive: 5\r\n\r\n",
        CLIENT,
    );
    assert_eq!(
        out,
        "GET /a HTTP/1.1\r\nHost: x\r\nAccept:  */*\r\nConnection: keep-alive\r\nX-Forwarded-For: 127.0.0.7\r\n\r\n"
    );
}

#[test]
fn an_http_1_0_request_asks_the_backend_to_keep_the_connection() {
    let (out, _) = forwarded("request", b"GET / HTTP/1.0\r\n\r\n", CLIENT);
    assert_eq!(
        out,
        "GET / HTTP/1.0\r\nConnection: keep-alive\r\nX-Forwarded-For: 127.0.0.7\r\n\r\n"
    );
}

#[test]
fn an_earlier_x_forwarded_for_is_kept_and_the_client_added_after_it() {
    let (out, _) = forwarded(
        "request",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n",
        CLIENT,
    );
    assert_eq!(
        out,
        "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.0.0.1\r\nConnection: keep-alive\r\nX-Forwarded-For: 127.0.0.7\r\n\r\n"
    );
}

#[test]
fn a_streaming_request_is_written_up_to_its_body() {
    let (out, head_only) = forwarded(
        "request",
        b"POST /u HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        CLIENT,
    );
    assert!(head_only);
    assert_eq!(
        out,
        "POST /u HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: keep-alive\r\nX-Forwarded-For: 127.0.0.7\r\n\r\n"
    );
}

#[test]
fn a_response_says_close_only_when_the_clients_session_ends() {
    let response = b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n";
    let (kept, _) = forwarded("response", response, CLIENT);
    assert_eq!(
        kept,
        "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n"
    );
    let ends = ForwardContext {
        session_ends: true,
        ..CLIENT
    };
    let (closed, _) = forwarded("response", response, ends);
    assert_eq!(
        closed,
        "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
}

#[test]
fn a_unit_without_forward_is_not_edited_and_bad_edits_are_diagnosed() {
    let g = Grammar::stock("http").unwrap();
    assert!(!g.has_forward(g.unit_id("chunk").unwrap()));
    assert!(g.has_forward(g.unit_id("request").unwrap()));
    let bad = "grammar t; type u = unit { n : uint8; %forward n = drop(\"x\", \"y\"); };";
    let err = Grammar::from_source("t", bad).unwrap_err();
    assert_eq!(err.diagnostics.len(), 1, "{:?}", err.diagnostics);
    assert!(
        err.diagnostics[0].message.contains("not a list of units"),
        "{:?}",
        err.diagnostics
    );
}

#[test]
fn the_response_to_a_head_request_has_no_body_whatever_its_head_says() {
    let g = Grammar::stock("http").unwrap();
    let request = g.unit_id("request").unwrap();
    let mut p = Parser::new(g.clone(), request);
    let head = b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert!(matches!(p.parse(head), Ok(Progress::Done(_))));
    let context = g
        .property(request, "reply_context", p.slots(), head)
        .unwrap();
    assert_eq!(context, 1);
    let get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    p.reset();
    assert!(matches!(p.parse(get), Ok(Progress::Done(_))));
    assert_eq!(
        g.property(request, "reply_context", p.slots(), get),
        Some(0)
    );

    let response = g.unit_id("response").unwrap();
    let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
    let mut r = Parser::new(g.clone(), response);
    r.set_reply_context(context);
    assert_eq!(r.parse(reply).unwrap(), Progress::Done(reply.len()));
    // The same head answering a GET has a body of 5 bytes to come.
    r.reset();
    r.set_reply_context(0);
    assert!(matches!(r.parse(reply), Ok(Progress::Head(_))));
}

#[test]
fn connect_is_refused_with_501() {
    let g = Grammar::stock("http").unwrap();
    let mut p = Parser::new(g.clone(), g.unit_id("request").unwrap());
    let err = p
        .parse(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n")
        .unwrap_err();
    assert_eq!(err.status, Some(501), "{err}");
}

/// A reply a program builds passes on unchanged until its client's
/// session ends, as `forward` itself writes it; messages whose unit drops
/// fields, or adds one either way, may always change.
#[test]
fn a_built_reply_changes_only_when_the_session_ends() {
    let g = Grammar::stock("http").unwrap();
    let simple = g.unit_id("simple_response").unwrap();
    assert!(!g.forward_changes(simple, false));
    assert!(g.forward_changes(simple, true));
    for unit in ["request", "response"] {
        let unit = g.unit_id(unit).unwrap();
        assert!(g.forward_changes(unit, false) && g.forward_changes(unit, true));
    }
    assert!(!g.forward_changes(g.unit_id("chunk").unwrap(), true));
    // What `forward_changes` promises: the same bytes.
    let built = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi";
    let (kept, _) = forwarded("simple_response", built, CLIENT);
    assert_eq!(kept.as_bytes(), built);
    let last = ForwardContext {
        session_ends: true,
        ..CLIENT
    };
    let (closing, _) = forwarded("simple_response", built, last);
    assert!(closing.contains("Connection: close\r\n"), "{closing}");
}
