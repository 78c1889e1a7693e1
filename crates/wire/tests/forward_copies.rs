//! `%forward` copies what it keeps of a message as the bytes it was read
//! from (`crates/wire/src/verbatim.rs`): on random HTTP requests and
//! responses (header names of any case, hop-by-hop ones among them,
//! whitespace of every kind the grammar takes, messages with bodies and
//! streamed ones) the output equals writing every kept line field by
//! field, by the interpreted parser and the generated one alike.

use flick_wire::{ForwardContext, Grammar, Parser, Progress};
use proptest::prelude::*;
use std::sync::Arc;

const NAMES: [&str; 12] = [
    "Host",
    "connection",
    "Keep-Alive",
    "TE",
    "Upgrade",
    "Proxy-Connection",
    "Accept",
    "X-Custom-Header",
    "Content-Type",
    "Date",
    "ETag",
    "Server",
];

fn header() -> impl Strategy<Value = String> {
    (
        0..NAMES.len(),
        any::<bool>(),
        prop::sample::select(vec!["", " ", "  ", "\t", " \t "]),
        "[a-zA-Z0-9 ,;=/*.-]{0,24}",
    )
        .prop_map(|(n, upper, ws, value)| {
            let name = if upper {
                NAMES[n].to_ascii_uppercase()
            } else {
                NAMES[n].to_string()
            };
            format!("{name}:{ws}{value}\r\n")
        })
}

/// Forwarded both ways by a parser of `unit` over `bytes`: (copied, by
/// fields), or `None` where the message does not parse whole.
fn both(
    g: &Arc<Grammar>,
    unit: &str,
    bytes: &[u8],
    interpreted: bool,
    session_ends: bool,
) -> Option<(Vec<u8>, Vec<u8>)> {
    let unit = g.unit_id(unit).unwrap();
    let mut p = Parser::new(g.clone(), unit);
    if interpreted {
        p = p.interpreted();
    }
    let head_only = match p.parse(bytes).ok()? {
        Progress::Done(_) => false,
        Progress::Head(_) => true,
        _ => return None,
    };
    let cx = ForwardContext {
        peer_address: b"192.0.2.9",
        session_ends,
    };
    let (mut copied, mut by_fields) = (Vec::new(), Vec::new());
    g.forward(unit, p.slots(), bytes, head_only, &cx, &mut copied)
        .unwrap();
    g.forward_by_fields(unit, p.slots(), bytes, head_only, &cx, &mut by_fields)
        .unwrap();
    Some((copied, by_fields))
}

/// The header lines of `out` the program had (not the framing ones the
/// test adds, nor those the edit adds).
fn kept_lines(out: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(out);
    let head = text.split("\r\n\r\n").next().unwrap_or("");
    head.split("\r\n")
        .skip(1)
        .map(|l| format!("{l}\r\n"))
        .filter(|l| {
            let name = l.split(':').next().unwrap_or("").to_ascii_lowercase();
            !["content-length", "transfer-encoding", "x-forwarded-for"].contains(&name.as_str())
                && !(name == "connection"
                    && (l.ends_with(": keep-alive\r\n") || l.ends_with(": close\r\n")))
        })
        .collect()
}

/// `headers` less those named in `hop` (ignoring case), in order.
fn expected_lines(headers: &[String], hop: &[&str]) -> Vec<String> {
    headers
        .iter()
        .filter(|l| {
            let name = l.split(':').next().unwrap_or("").to_ascii_lowercase();
            !hop.contains(&name.as_str())
        })
        .cloned()
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn requests_forward_as_written_field_by_field(
        headers in prop::collection::vec(header(), 0..12),
        lead in prop::sample::select(vec!["", "\r\n", "\n"]),
        body in prop::option::of("[a-z]{1,16}"),
        interpreted in any::<bool>(),
    ) {
        let g = Grammar::stock("http").unwrap();
        let mut m = format!("{lead}POST /p HTTP/1.1\r\n{}", headers.concat());
        if let Some(b) = &body {
            m.push_str(&format!("Content-Length: {}\r\n\r\n{b}", b.len()));
        } else {
            m.push_str("\r\n");
        }
        if let Some((copied, by_fields)) = both(&g, "request", m.as_bytes(), interpreted, false) {
            prop_assert_eq!(
                String::from_utf8_lossy(&copied),
                String::from_utf8_lossy(&by_fields)
            );
            let hop = ["connection", "keep-alive", "proxy-connection", "te", "upgrade"];
            prop_assert_eq!(kept_lines(&copied), expected_lines(&headers, &hop));
        }
    }

    #[test]
    fn responses_forward_as_written_field_by_field(
        headers in prop::collection::vec(header(), 0..12),
        chunked in any::<bool>(),
        session_ends in any::<bool>(),
        interpreted in any::<bool>(),
    ) {
        let g = Grammar::stock("http").unwrap();
        let mut m = format!("HTTP/1.1 200 OK\r\n{}", headers.concat());
        if chunked {
            m.push_str("Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
        } else {
            m.push_str("Content-Length: 2\r\n\r\nok");
        }
        if let Some((copied, by_fields)) = both(&g, "response", m.as_bytes(), interpreted, session_ends) {
            prop_assert_eq!(
                String::from_utf8_lossy(&copied),
                String::from_utf8_lossy(&by_fields)
            );
            prop_assert_eq!(kept_lines(&copied), expected_lines(&headers, &["connection", "keep-alive"]));
        }
    }
}

/// The copies are taken: the usual request goes through (a test that the
/// property above compares something real), and a kept line keeps its
/// own spelling.
#[test]
fn kept_lines_keep_their_spelling() {
    let g = Grammar::stock("http").unwrap();
    let m = b"GET / HTTP/1.1\r\nhOsT:\t a\r\nConnection: close\r\nAccept:*/*\r\n\r\n";
    let (copied, by_fields) = both(&g, "request", m, false, false).unwrap();
    assert_eq!(copied, by_fields);
    assert_eq!(
        String::from_utf8_lossy(&copied),
        "GET / HTTP/1.1\r\nhOsT:\t a\r\nAccept:*/*\r\nConnection: keep-alive\r\nX-Forwarded-For: 192.0.2.9\r\n\r\n"
    );
}
