//! Records split between the chunks a merged stream's reader sends: the
//! Hadoop aggregator (Listing 3) sums the same words whatever the sizes
//! of the pieces its mappers' bytes arrive in, so a record cut anywhere
//! (in a length, in its key, in its value, in the end marker) is put
//! together, and the records after it are parsed where they lie.

use flick_platform::{Loaded, Service, ServiceConfig};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

const MAPPERS: usize = 3;

/// The sizes mapper `i` writes its stream in, over and over.
type Pieces = fn(usize) -> Vec<usize>;

fn vlong(out: &mut Vec<u8>, v: i64) {
    if (-112..=127).contains(&v) {
        out.push(v as u8);
        return;
    }
    let (m, base) = if v < 0 { (!v, -120i32) } else { (v, -112i32) };
    let n = 8 - (m.leading_zeros() as usize) / 8;
    out.push((base - n as i32) as u8);
    for i in (0..n).rev() {
        out.push((m >> (8 * i)) as u8);
    }
}

fn read_vlong(b: &[u8], at: &mut usize) -> i64 {
    let first = b[*at] as i8;
    *at += 1;
    if first >= -112 {
        return first as i64;
    }
    let (neg, n) = if first < -120 {
        (true, (-120 - first as i32) as usize)
    } else {
        (false, (-112 - first as i32) as usize)
    };
    let mut v = 0i64;
    for _ in 0..n {
        v = (v << 8) | b[*at] as i64;
        *at += 1;
    }
    if neg {
        !v
    } else {
        v
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xedb8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// A sorted word-count IFile of `records`, ended by the marker and CRC32.
fn ifile(records: &[(String, i32)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (word, n) in records {
        let mut key = Vec::new();
        vlong(&mut key, word.len() as i64);
        key.extend_from_slice(word.as_bytes());
        vlong(&mut out, key.len() as i64);
        vlong(&mut out, 4);
        out.extend_from_slice(&key);
        out.extend_from_slice(&n.to_be_bytes());
    }
    vlong(&mut out, -1);
    vlong(&mut out, -1);
    let crc = crc32(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// The words and counts of an IFile, checking its end marker and CRC32.
fn read_ifile(b: &[u8]) -> Vec<(String, i32)> {
    let (mut at, mut out) = (0, Vec::new());
    loop {
        let key_len = read_vlong(b, &mut at);
        let value_len = read_vlong(b, &mut at);
        if key_len == -1 {
            assert_eq!(value_len, -1);
            let crc = u32::from_be_bytes(b[at..at + 4].try_into().unwrap());
            assert_eq!(crc, crc32(&b[..at]), "the stream's CRC32");
            assert_eq!(at + 4, b.len(), "bytes after the end marker");
            return out;
        }
        let end = at + key_len as usize;
        let text_len = read_vlong(b, &mut at) as usize;
        let word = String::from_utf8(b[at..at + text_len].to_vec()).unwrap();
        assert_eq!(at + text_len, end, "the key's Text fills it");
        at = end;
        assert_eq!(value_len, 4);
        out.push((word, i32::from_be_bytes(b[at..at + 4].try_into().unwrap())));
        at += 4;
    }
}

/// Mapper `m`'s stream: sorted words of 1 to 150 bytes (a Text length of
/// one VInt byte and of two), some repeated, with counts of several sizes.
fn mapper(m: usize) -> Vec<(String, i32)> {
    let mut records = Vec::new();
    let mut x = 0x9e37_79b9u32.wrapping_mul(m as u32 + 1);
    for w in 0..400usize {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        let len = 1 + (x >> 8) as usize % if w % 50 == 0 { 150 } else { 12 };
        let word = format!("{w:04}{}", "x".repeat(len));
        for r in 0..1 + (x >> 20) as usize % 3 {
            records.push((word.clone(), (r as i32 + 1) * ((x >> 4) as i32 % 70_000)));
        }
    }
    records
}

fn aggregator(reducer: u16) -> Service {
    let path = format!(
        "{}/../../examples/hadoop_wordcount.flick",
        env!("CARGO_MANIFEST_DIR")
    );
    let src = std::fs::read_to_string(path).unwrap();
    let (program, diags) = flick_syntax::parse(&src);
    assert!(diags.is_empty());
    let (checked, diags) = flick_check::check(&program);
    assert!(diags.is_empty());
    let grammar = flick_wire::Grammar::stock("hadoop_ifile").unwrap();
    let loaded = Loaded::new(&program, &checked, grammar).unwrap();
    let addr = |p: u16| format!("127.0.0.1:{p}").parse().unwrap();
    Service::start(
        loaded,
        ServiceConfig {
            listen: vec![("mappers".into(), addr(flick_testkit::free_port()))],
            connect: vec![("reducer".into(), vec![addr(reducer)])],
            fan_in: vec![("mappers".into(), MAPPERS)],
            workers: 1,
            max_instances: 16,
            ..ServiceConfig::default()
        },
    )
    .unwrap()
}

/// One job whose mapper `i` writes its stream in pieces of sizes from
/// `pieces(i)`, each flushed as its own segment; the reducer's stream.
fn job(service: &Service, reducer: &TcpListener, streams: &[Vec<u8>], pieces: Pieces) -> Vec<u8> {
    let conns: Vec<TcpStream> = (0..MAPPERS)
        .map(|_| TcpStream::connect(service.local_addr()).unwrap())
        .collect();
    std::thread::scope(|s| {
        for (i, (mut c, bytes)) in conns.into_iter().zip(streams).enumerate() {
            s.spawn(move || {
                c.set_nodelay(true).unwrap();
                let sizes = pieces(i);
                let (mut at, mut k) = (0, 0);
                while at < bytes.len() {
                    let n = sizes[k % sizes.len()].min(bytes.len() - at);
                    // A job that failed closes early: the assertion on
                    // the reducer's stream says so.
                    if c.write_all(&bytes[at..at + n]).is_err() {
                        return;
                    }
                    at += n;
                    k += 1;
                    // Lets the reader take what arrived so far, so that
                    // chunks end inside records.
                    std::thread::yield_now();
                }
                let _ = c.shutdown(std::net::Shutdown::Write);
                // Held open until the aggregator is done with it.
                let mut rest = Vec::new();
                let _ = c.read_to_end(&mut rest);
            });
        }
        let (mut r, _) = reducer.accept().unwrap();
        r.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut out = Vec::new();
        r.read_to_end(&mut out).expect("the reducer's stream ends");
        out
    })
}

#[test]
fn records_cut_anywhere_between_chunks_sum_as_whole_ones() {
    let reducer = TcpListener::bind("127.0.0.1:0").unwrap();
    let service = aggregator(reducer.local_addr().unwrap().port());
    let records: Vec<Vec<(String, i32)>> = (0..MAPPERS).map(mapper).collect();
    let mut want: BTreeMap<String, i32> = BTreeMap::new();
    for (word, n) in records.iter().flatten() {
        let sum = want.entry(word.clone()).or_default();
        *sum = sum.wrapping_add(*n);
    }
    let want: Vec<(String, i32)> = want.into_iter().collect();
    let streams: Vec<Vec<u8>> = records.iter().map(|r| ifile(r)).collect();
    let cases: [(&str, Pieces); 4] = [
        ("whole streams", |_| vec![1 << 20]),
        ("a byte at a time, then larger", |i| {
            (1..=37).map(|n| n + i).collect()
        }),
        ("pieces of prime sizes", |i| {
            vec![3 + i, 1021, 7, 33_331, 2, 257, 65_537]
        }),
        ("pieces about a chunk", |i| {
            vec![32 * 1024 - 1 - i, 32 * 1024 + 5, 13]
        }),
    ];
    for (what, pieces) in cases {
        let out = job(&service, &reducer, &streams, pieces);
        assert_eq!(read_ifile(&out), want, "{what}");
    }
}
