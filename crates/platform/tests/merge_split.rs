//! Records split between the chunks a merged stream's reader sends: the
//! Hadoop aggregator (Listing 3) sums the same words whatever the sizes
//! of the pieces its mappers' bytes arrive in, so a record cut anywhere
//! (in a length, in its key, in its value, in the end marker) is put
//! together, and the records after it are parsed where they lie.

mod ifile;

use flick_platform::Service;
use ifile::{aggregator, ifile, read_ifile};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

const MAPPERS: usize = 3;

/// The sizes mapper `i` writes its stream in, over and over.
type Pieces = fn(usize) -> Vec<usize>;

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
    let service = aggregator(reducer.local_addr().unwrap().port(), MAPPERS);
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
