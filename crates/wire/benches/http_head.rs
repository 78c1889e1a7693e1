//! An HTTP/1.1 request head, as a browser sends it: the `http` grammar's
//! `request` unit against `httparse` doing the same framing work
//! (Content-Length, Transfer-Encoding, Connection).
//!
//! `cargo bench -p flick-wire --bench http_head` (results: `docs/performance.md`)

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use flick_wire::{Grammar, Parser, Progress};

/// A Firefox GET of a page: request line and 8 headers, no body.
const HEAD: &[u8] = b"GET /wiki/Network_function_virtualization HTTP/1.1\r\n\
Host: en.wikipedia.org\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n\
Accept: text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8\r\n\
Accept-Language: en-GB,en;q=0.7,de;q=0.3\r\n\
Accept-Encoding: gzip, deflate, br, zstd\r\n\
Connection: keep-alive\r\n\
Cookie: WMF-Last-Access=17-Mar-2025; GeoIP=GB:ENG:London:51.51:-0.09:v4; enwikimwuser-sessionId=3f2a9c1b7d\r\n\
Upgrade-Insecure-Requests: 1\r\n\
\r\n";

/// How the body of a request is framed, as a proxy must know it.
#[derive(Debug, PartialEq, Eq)]
struct Framing {
    len: usize,
    content_length: u64,
    chunked: bool,
    keep_alive: bool,
}

fn trim(b: &[u8]) -> &[u8] {
    let s = b.iter().position(|c| !matches!(c, b' ' | b'\t'));
    let e = b.iter().rposition(|c| !matches!(c, b' ' | b'\t'));
    match (s, e) {
        (Some(s), Some(e)) => &b[s..=e],
        _ => &[],
    }
}

fn has_token(v: &[u8], t: &[u8]) -> bool {
    v.split(|c| *c == b',')
        .any(|x| trim(x).eq_ignore_ascii_case(t))
}

fn dec(v: &[u8]) -> Option<u64> {
    let v = trim(v);
    if v.is_empty() || v.len() > 19 {
        return None;
    }
    v.iter().try_fold(0u64, |n, c| {
        c.is_ascii_digit().then(|| n * 10 + (c - b'0') as u64)
    })
}

/// `httparse` plus the framing rules the grammar enforces: one
/// Content-Length value, not with Transfer-Encoding, which must end in
/// `chunked`; keep-alive from the version and Connection.
fn hand(buf: &[u8]) -> Option<Framing> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut req = httparse::Request::new(&mut headers);
    let httparse::Status::Complete(len) = req.parse(buf).ok()? else {
        return None;
    };
    let mut content_length: Option<u64> = None;
    let mut te: Option<&[u8]> = None;
    let mut connection: Option<&[u8]> = None;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = dec(h.value)?;
            if content_length.is_some_and(|c| c != n) {
                return None;
            }
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            te = Some(h.value);
        } else if name.eq_ignore_ascii_case(b"connection") {
            connection = Some(h.value);
        }
    }
    let chunked = match te {
        Some(v) => {
            let last = v.rsplit(|c| *c == b',').next().unwrap_or(&[]);
            if content_length.is_some() || !trim(last).eq_ignore_ascii_case(b"chunked") {
                return None;
            }
            true
        }
        None => false,
    };
    let conn = connection.unwrap_or(&[]);
    let keep_alive = match req.version? {
        1 => !has_token(conn, b"close"),
        _ => has_token(conn, b"keep-alive"),
    };
    Some(Framing {
        len,
        content_length: content_length.unwrap_or(0),
        chunked,
        keep_alive,
    })
}

/// Slots of the framing values, resolved once as a program does.
#[derive(Clone, Copy)]
struct Fields {
    content_length: u16,
    chunked: u16,
    keep_alive: u16,
}

/// The grammar engine: parse the head, read the same framing values.
fn engine(p: &mut Parser, f: Fields, buf: &[u8]) -> Option<Framing> {
    p.reset();
    let Ok(Progress::Done(len)) = p.parse(buf) else {
        return None;
    };
    let m = p.message(buf);
    Some(Framing {
        len,
        content_length: m.int_at(f.content_length)? as u64,
        chunked: m.int_at(f.chunked)? != 0,
        keep_alive: m.int_at(f.keep_alive)? != 0,
    })
}

/// Only the parse: the engine's Progress, httparse's Status.
fn engine_parse_only(p: &mut Parser, buf: &[u8]) -> Progress {
    p.reset();
    p.parse(buf).unwrap()
}

fn hand_parse_only(buf: &[u8]) -> usize {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n + req.headers.len(),
        _ => 0,
    }
}

fn bench(c: &mut Criterion) {
    let g = Grammar::stock("http").unwrap();
    let unit = g.unit_id("request").unwrap();
    let slot = |name| g.field_slot(unit, name).unwrap();
    let f = Fields {
        content_length: slot("content_length"),
        chunked: slot("chunked"),
        keep_alive: slot("keep_alive"),
    };
    let mut p = g.parser(unit).interpreted();
    flick_grammars::install();
    let mut gen = g.parser(unit);
    assert!(gen.is_compiled());
    let want = Framing {
        len: HEAD.len(),
        content_length: 0,
        chunked: false,
        keep_alive: true,
    };
    assert_eq!(engine(&mut p, f, HEAD), Some(want));
    assert_eq!(hand(HEAD), engine(&mut p, f, HEAD));
    assert_eq!(hand(HEAD), engine(&mut gen, f, HEAD));

    let mut group = c.benchmark_group("http_head");
    group.throughput(Throughput::Elements(1));
    group.bench_function("grammar", |b| b.iter(|| engine(&mut p, f, black_box(HEAD))));
    group.bench_function("generated", |b| {
        b.iter(|| engine(&mut gen, f, black_box(HEAD)))
    });
    group.bench_function("httparse", |b| b.iter(|| hand(black_box(HEAD))));
    group.bench_function("grammar_parse_only", |b| {
        b.iter(|| engine_parse_only(&mut p, black_box(HEAD)))
    });
    group.bench_function("generated_parse_only", |b| {
        b.iter(|| engine_parse_only(&mut gen, black_box(HEAD)))
    });
    group.bench_function("httparse_parse_only", |b| {
        b.iter(|| hand_parse_only(black_box(HEAD)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
