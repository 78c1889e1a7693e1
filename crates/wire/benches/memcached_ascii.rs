//! Memcached text requests: the `memcached_ascii` grammar's `request` unit
//! on a `get` and a `set` line (with its data block), against a
//! hand-written parser of the same commands that makes the same checks
//! (token lengths, numeric arguments, data block length and terminator).
//!
//! `cargo bench -p flick-wire --bench memcached_ascii` (results: `docs/performance.md`)

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use flick_wire::{Parser, Progress};
use std::ops::Range;

const MAX_KEY: usize = 250;
const MAX_DATA: usize = 1 << 20;

fn get() -> Vec<u8> {
    b"get user:1000:profile\r\n".to_vec()
}

fn set() -> Vec<u8> {
    let value: Vec<u8> = (0..64u8).map(|i| b'a' + i % 26).collect();
    let mut out = format!("set user:1000:profile 1 3600 {}\r\n", value.len()).into_bytes();
    out.extend(&value);
    out.extend(b"\r\n");
    out
}

#[derive(Debug, PartialEq, Eq)]
enum Bad {
    NeedMore,
    Invalid,
}

/// What a `get` or `set` carries.
#[derive(Debug, PartialEq, Eq)]
struct Request<'a> {
    len: usize,
    key: &'a [u8],
    flags: Option<u32>,
    exptime: Option<i64>,
    data: Option<&'a [u8]>,
}

fn number<T: std::str::FromStr>(token: &[u8]) -> Result<T, Bad> {
    std::str::from_utf8(token)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(Bad::Invalid)
}

/// The hand-written parser for `get <key>` and
/// `set <key> <flags> <exptime> <bytes> [noreply]` plus its data block.
fn hand(b: &[u8]) -> Result<Request<'_>, Bad> {
    let line_end = b
        .windows(2)
        .position(|w| w == b"\r\n")
        .ok_or(Bad::NeedMore)?;
    let mut tokens = b[..line_end].split(|c| *c == b' ');
    let command = tokens.next().ok_or(Bad::Invalid)?;
    let key = tokens.next().ok_or(Bad::Invalid)?;
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(Bad::Invalid);
    }
    match command {
        b"get" => {
            // More keys may follow; the first is the one a proxy routes by.
            for k in tokens {
                if k.is_empty() || k.len() > MAX_KEY {
                    return Err(Bad::Invalid);
                }
            }
            Ok(Request {
                len: line_end + 2,
                key,
                flags: None,
                exptime: None,
                data: None,
            })
        }
        b"set" => {
            let flags = number(tokens.next().ok_or(Bad::Invalid)?)?;
            let exptime = number(tokens.next().ok_or(Bad::Invalid)?)?;
            let bytes: usize = number(tokens.next().ok_or(Bad::Invalid)?)?;
            match tokens.next() {
                None | Some(b"noreply") => {}
                Some(_) => return Err(Bad::Invalid),
            }
            if tokens.next().is_some() || bytes > MAX_DATA {
                return Err(Bad::Invalid);
            }
            let start = line_end + 2;
            let end = start + bytes;
            if b.len() < end + 2 {
                return Err(Bad::NeedMore);
            }
            if &b[end..end + 2] != b"\r\n" {
                return Err(Bad::Invalid);
            }
            Ok(Request {
                len: end + 2,
                key,
                flags: Some(flags),
                exptime: Some(exptime),
                data: Some(&b[start..end]),
            })
        }
        _ => Err(Bad::Invalid),
    }
}

/// Where a slice of `b` lies in it (a message's values borrow the parser).
fn range(b: &[u8], s: &[u8]) -> Range<usize> {
    let start = s.as_ptr() as usize - b.as_ptr() as usize;
    start..start + s.len()
}

/// The engine; reads the key back (the first key of a `get`).
/// `key` is the key's slot, resolved once as a program does.
fn engine(p: &mut Parser, key: u16, b: &[u8]) -> Option<(usize, Range<usize>)> {
    p.reset();
    let Ok(Progress::Done(n)) = p.parse(b) else {
        return None;
    };
    Some((n, range(b, p.message(b).bytes_at(key)?)))
}

fn bench(c: &mut Criterion) {
    let g = flick_wire::Grammar::stock("memcached_ascii").unwrap();
    let unit = g.unit_id("request").unwrap();
    let key = g.field_slot(unit, "key").unwrap();
    let mut p = g.parser(unit).interpreted();
    flick_grammars::install();
    let mut gen = g.parser(unit);
    assert!(gen.is_compiled());

    for (name, msg) in [("get", get()), ("set", set())] {
        let h = hand(&msg).unwrap();
        let want = Some((h.len, range(&msg, h.key)));
        assert_eq!(engine(&mut gen, key, &msg), want);
        assert_eq!(engine(&mut p, key, &msg), want);
        let m = p.message(&msg);
        assert_eq!(m.int("flags"), h.flags.map(i128::from));
        assert_eq!(m.int("exptime"), h.exptime.map(i128::from));
        assert_eq!(m.bytes("data"), h.data);

        let mut group = c.benchmark_group(format!("memcached_ascii/{name}"));
        group.throughput(Throughput::Elements(1));
        group.bench_function("grammar", |b| {
            b.iter(|| engine(&mut p, key, black_box(&msg)))
        });
        group.bench_function("generated", |b| {
            b.iter(|| engine(&mut gen, key, black_box(&msg)))
        });
        group.bench_function("hand", |b| b.iter(|| hand(black_box(&msg))));
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
