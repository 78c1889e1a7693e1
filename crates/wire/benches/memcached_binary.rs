//! Memcached binary requests: the `memcached_binary` grammar's `cmd` unit,
//! decoding every field or (as the paper's Memcached proxy) only `key`,
//! against a hand-written parser of the 24-byte header.
//!
//! `cargo bench -p flick-wire --bench memcached_binary` (results: `docs/performance.md`)

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use flick_wire::{Grammar, Parser, Progress};
use std::ops::Range;

const HEADER: usize = 24;
const MAX_KEY: usize = 250;
const MAX_VALUE: usize = 1 << 20;

/// A request as a client library writes it.
fn request(opcode: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    let total = (extras.len() + key.len() + value.len()) as u32;
    let mut out = vec![0x80, opcode];
    out.extend((key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.push(0); // data type
    out.extend(0u16.to_be_bytes()); // vbucket
    out.extend(total.to_be_bytes());
    out.extend(0xdead_beefu32.to_be_bytes()); // opaque
    out.extend(0u64.to_be_bytes()); // cas
    out.extend(extras);
    out.extend(key);
    out.extend(value);
    out
}

fn get() -> Vec<u8> {
    request(0x00, &[], b"user:1000:profile", &[])
}

fn set() -> Vec<u8> {
    let mut extras = 0x0000_0001u32.to_be_bytes().to_vec(); // flags
    extras.extend(3600u32.to_be_bytes()); // expiration
    let value: Vec<u8> = (0..64u8).map(|i| b'a' + i % 26).collect();
    request(0x01, &extras, b"user:1000:profile", &value)
}

/// Every field of a request, as the grammar decodes it.
#[derive(Debug, PartialEq, Eq)]
struct Cmd<'a> {
    len: usize,
    magic: u8,
    opcode: u8,
    data_type: u8,
    vbucket: u16,
    opaque: u32,
    cas: u64,
    flags: Option<u32>,
    expiration: Option<u32>,
    extras: &'a [u8],
    key: &'a [u8],
    value: &'a [u8],
}

#[derive(Debug, PartialEq, Eq)]
enum Bad {
    NeedMore,
    Invalid,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// The hand-written parser: the header's big-endian fields, the checks the
/// grammar makes (magic, key length, total length, extras length for the
/// opcode, value size), then extras, key and value as slices.
fn hand(b: &[u8]) -> Result<Cmd<'_>, Bad> {
    if b.len() < HEADER {
        return Err(Bad::NeedMore);
    }
    let magic = b[0];
    if magic != 0x80 && magic != 0x81 {
        return Err(Bad::Invalid);
    }
    let opcode = b[1];
    let key_len = be16(b, 2) as usize;
    let extras_len = b[4] as usize;
    let total = be32(b, 8) as usize;
    if key_len > MAX_KEY || total < key_len + extras_len {
        return Err(Bad::Invalid);
    }
    let value_len = total - key_len - extras_len;
    if value_len > MAX_VALUE {
        return Err(Bad::Invalid);
    }
    if b.len() < HEADER + total {
        return Err(Bad::NeedMore);
    }
    let extras = &b[HEADER..HEADER + extras_len];
    let (mut flags, mut expiration) = (None, None);
    if extras_len > 0 && magic == 0x80 {
        match opcode {
            // Set, Add, Replace and their quiet forms: flags, expiration.
            0x01..=0x03 | 0x11..=0x13 => {
                if extras_len != 8 {
                    return Err(Bad::Invalid);
                }
                flags = Some(be32(extras, 0));
                expiration = Some(be32(extras, 4));
            }
            // Flush, Touch, GAT...: expiration.
            0x08 | 0x18 | 0x1c | 0x1d | 0x1e | 0x23 | 0x24 => {
                if extras_len != 4 {
                    return Err(Bad::Invalid);
                }
                expiration = Some(be32(extras, 0));
            }
            _ => {}
        }
    }
    let key = &b[HEADER + extras_len..HEADER + extras_len + key_len];
    let value = &b[HEADER + extras_len + key_len..HEADER + total];
    Ok(Cmd {
        len: HEADER + total,
        magic,
        opcode,
        data_type: b[5],
        vbucket: be16(b, 6),
        opaque: be32(b, 12),
        cas: u64::from_be_bytes(b[16..24].try_into().unwrap()),
        flags,
        expiration,
        extras,
        key,
        value,
    })
}

/// Only what the proxy routes on: the key (and the message's length).
fn hand_key(b: &[u8]) -> Result<(usize, &[u8]), Bad> {
    if b.len() < HEADER {
        return Err(Bad::NeedMore);
    }
    if b[0] != 0x80 && b[0] != 0x81 {
        return Err(Bad::Invalid);
    }
    let key_len = be16(b, 2) as usize;
    let extras_len = b[4] as usize;
    let total = be32(b, 8) as usize;
    if key_len > MAX_KEY || total < key_len + extras_len || total - key_len - extras_len > MAX_VALUE
    {
        return Err(Bad::Invalid);
    }
    if b.len() < HEADER + total {
        return Err(Bad::NeedMore);
    }
    Ok((
        HEADER + total,
        &b[HEADER + extras_len..HEADER + extras_len + key_len],
    ))
}

/// Where a slice of `b` lies in it (a message's values borrow the parser).
fn range(b: &[u8], s: &[u8]) -> Range<usize> {
    let start = s.as_ptr() as usize - b.as_ptr() as usize;
    start..start + s.len()
}

/// Slots of the fields read back, resolved once as a program does.
#[derive(Clone, Copy)]
struct Fields {
    key: u16,
    value: u16,
}

/// The engine, decoding every field; reads key and value back.
fn engine(p: &mut Parser, f: Fields, b: &[u8]) -> Option<(usize, Range<usize>, Range<usize>)> {
    p.reset();
    let Ok(Progress::Done(n)) = p.parse(b) else {
        return None;
    };
    let m = p.message(b);
    Some((
        n,
        range(b, m.bytes_at(f.key)?),
        range(b, m.bytes_at(f.value)?),
    ))
}

/// The engine through a view of `key`; reads the key back.
fn engine_key(p: &mut Parser, f: Fields, b: &[u8]) -> Option<(usize, Range<usize>)> {
    p.reset();
    let Ok(Progress::Done(n)) = p.parse(b) else {
        return None;
    };
    Some((n, range(b, p.message(b).bytes_at(f.key)?)))
}

fn bench(c: &mut Criterion) {
    let g = Grammar::stock("memcached_binary").unwrap();
    let unit = g.unit_id("cmd").unwrap();
    let f = Fields {
        key: g.field_slot(unit, "key").unwrap(),
        value: g.field_slot(unit, "value").unwrap(),
    };
    let key_view = || g.view(unit, &["key"]).unwrap();
    let mut full = g.parser(unit).interpreted();
    let mut view = Parser::with_view(g.clone(), unit, key_view()).interpreted();
    flick_grammars::install();
    let mut gen = g.parser(unit);
    let mut gen_view = Parser::with_view(g.clone(), unit, key_view());
    assert!(gen.is_compiled() && gen_view.is_compiled());

    for (name, msg) in [("get", get()), ("set", set())] {
        let h = hand(&msg).unwrap();
        let (key, value) = (range(&msg, h.key), range(&msg, h.value));
        let all = Some((h.len, key.clone(), value));
        assert_eq!(engine(&mut full, f, &msg), all);
        assert_eq!(engine(&mut gen, f, &msg), all);
        assert_eq!(engine_key(&mut view, f, &msg), Some((h.len, key.clone())));
        assert_eq!(engine_key(&mut gen_view, f, &msg), Some((h.len, key)));
        assert_eq!(hand_key(&msg), Ok((h.len, h.key)));
        if name == "set" {
            let m = full.message(&msg);
            assert_eq!(m.int("flags"), h.flags.map(i128::from));
            assert_eq!(m.int("expiration"), h.expiration.map(i128::from));
        }

        let mut group = c.benchmark_group(format!("memcached_binary/{name}"));
        group.throughput(Throughput::Elements(1));
        group.bench_function("grammar", |b| {
            b.iter(|| engine(&mut full, f, black_box(&msg)))
        });
        group.bench_function("generated", |b| {
            b.iter(|| engine(&mut gen, f, black_box(&msg)))
        });
        group.bench_function("hand", |b| b.iter(|| hand(black_box(&msg))));
        group.bench_function("grammar_view_key", |b| {
            b.iter(|| engine_key(&mut view, f, black_box(&msg)))
        });
        group.bench_function("generated_view_key", |b| {
            b.iter(|| engine_key(&mut gen_view, f, black_box(&msg)))
        });
        group.bench_function("hand_key", |b| b.iter(|| hand_key(black_box(&msg))));
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
