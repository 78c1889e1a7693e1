//! Hadoop IFile records (Text keys of 8-16 characters, IntWritable values,
//! as a word count's map output): the `hadoop_ifile` grammar's `record`
//! unit, one message per record (`parse` and `reset` each, or a batch of
//! 64 at a time with `parse_batch`), against a hand-written reader of
//! `WritableUtils.readVLong` lengths.
//!
//! `cargo bench -p flick-wire --bench hadoop_ifile` (results: `docs/performance.md`)

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use flick_wire::{write_vlong, Batch, Grammar, Parser, Progress};

const RECORDS: usize = 1000;
const MAX_KEY: i64 = 65536;
const MAX_VALUE: i64 = 1 << 20;

/// 1000 records as `IFile.Writer.append` writes them: key length, value
/// length (VInts), then a serialised Text key and a 4-byte value.
fn records() -> Vec<u8> {
    let mut out = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for i in 0..RECORDS {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let n = 8 + (seed % 9) as usize;
        let word: Vec<u8> = (0..n)
            .map(|j| b'a' + ((seed >> (j * 3)) % 26) as u8)
            .collect();
        let mut key = Vec::new();
        write_vlong(&mut key, n as i64);
        key.extend(&word);
        write_vlong(&mut out, key.len() as i64);
        write_vlong(&mut out, 4);
        out.extend(&key);
        out.extend((i as u32).to_be_bytes());
    }
    out
}

/// `WritableUtils.readVLong`; `None` when the bytes run out.
fn read_vlong(b: &[u8], at: &mut usize) -> Option<i64> {
    let first = *b.get(*at)? as i8;
    if first >= -112 {
        *at += 1;
        return Some(first as i64);
    }
    let size = if first < -120 {
        (-119 - first as i32) as usize
    } else {
        (-111 - first as i32) as usize
    };
    let bytes = b.get(*at + 1..*at + size)?;
    let v = bytes.iter().fold(0i64, |v, c| (v << 8) | *c as i64);
    *at += size;
    Some(if first < -120 { !v } else { v })
}

#[derive(Debug, PartialEq, Eq)]
enum Record<'a> {
    Pair { key: &'a [u8], value: &'a [u8] },
    End { checksum: u32 },
}

#[derive(Debug, PartialEq, Eq)]
enum Bad {
    NeedMore,
    Invalid,
}

/// One record as `IFile.Reader` reads it, with the grammar's checks:
/// lengths both -1 (the end marker) or both non-negative, and bounded.
fn hand(b: &[u8]) -> Result<(usize, Record<'_>), Bad> {
    let mut at = 0;
    let key_len = read_vlong(b, &mut at).ok_or(Bad::NeedMore)?;
    let value_len = read_vlong(b, &mut at).ok_or(Bad::NeedMore)?;
    if key_len == -1 && value_len == -1 {
        let c = b.get(at..at + 4).ok_or(Bad::NeedMore)?;
        let checksum = u32::from_be_bytes(c.try_into().unwrap());
        return Ok((at + 4, Record::End { checksum }));
    }
    if key_len < 0 || value_len < 0 || key_len > MAX_KEY || value_len > MAX_VALUE {
        return Err(Bad::Invalid);
    }
    let (k, v) = (key_len as usize, value_len as usize);
    if b.len() < at + k + v {
        return Err(Bad::NeedMore);
    }
    let key = &b[at..at + k];
    let value = &b[at + k..at + k + v];
    Ok((at + k + v, Record::Pair { key, value }))
}

/// Reads every record of `buf`; sums key and value sizes so none is skipped.
fn hand_all(buf: &[u8]) -> usize {
    let (mut at, mut sum) = (0, 0);
    while at < buf.len() {
        let (n, r) = hand(&buf[at..]).unwrap();
        if let Record::Pair { key, value } = r {
            sum += key.len() + value.len();
        }
        at += n;
    }
    sum
}

/// Reads key and value by their slots, resolved once as a program does.
fn engine_all(p: &mut Parser, (key, value): (u16, u16), buf: &[u8]) -> usize {
    let (mut at, mut sum) = (0, 0);
    while at < buf.len() {
        p.reset();
        let Ok(Progress::Done(n)) = p.parse(&buf[at..]) else {
            panic!("bad record at {at}");
        };
        let m = p.message(&buf[at..]);
        sum += m.bytes_at(key).unwrap().len() + m.bytes_at(value).unwrap().len();
        at += n;
    }
    sum
}

/// As `engine_all`, a batch of records at a time.
fn batch_all(p: &mut Parser, batch: &mut Batch, (key, value): (u16, u16), buf: &[u8]) -> usize {
    let (mut at, mut sum) = (0, 0);
    p.reset();
    while at < buf.len() {
        let n = p.parse_batch(&buf[at..], batch);
        assert!(n > 0, "bad record at {at}");
        for m in batch.messages(&buf[at..]) {
            sum += m.bytes_at(key).unwrap().len() + m.bytes_at(value).unwrap().len();
        }
        at += n;
    }
    sum
}

fn bench(c: &mut Criterion) {
    let g = Grammar::stock("hadoop_ifile").unwrap();
    let unit = g.unit_id("record").unwrap();
    let f = (
        g.field_slot(unit, "key").unwrap(),
        g.field_slot(unit, "value").unwrap(),
    );
    let mut p = g.parser(unit).interpreted();
    flick_grammars::install();
    let mut gen = g.parser(unit);
    assert!(gen.is_compiled());
    let buf = records();
    assert_eq!(engine_all(&mut p, f, &buf), hand_all(&buf));
    assert_eq!(engine_all(&mut gen, f, &buf), hand_all(&buf));
    let mut batch = gen.batch(64);
    assert_eq!(batch_all(&mut gen, &mut batch, f, &buf), hand_all(&buf));

    let mut group = c.benchmark_group("hadoop_ifile");
    // One element per record: criterion's rate is records per second.
    group.throughput(Throughput::Elements(RECORDS as u64));
    group.bench_function("grammar", |b| {
        b.iter(|| engine_all(&mut p, f, black_box(&buf)))
    });
    group.bench_function("generated", |b| {
        b.iter(|| engine_all(&mut gen, f, black_box(&buf)))
    });
    group.bench_function("generated_batch", |b| {
        b.iter(|| batch_all(&mut gen, &mut batch, f, black_box(&buf)))
    });
    group.bench_function("hand", |b| b.iter(|| hand_all(black_box(&buf))));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
