//! Hadoop IFile streams for the merge tests: a word-count IFile written
//! (VLong lengths, Text keys, big-endian int values, the end marker and
//! the CRC32) and read back, and the aggregator (Listing 3) on one worker.
#![allow(dead_code)]

use flick_platform::{Loaded, Service, ServiceConfig};

/// A Hadoop VLong.
pub fn vlong(out: &mut Vec<u8>, v: i64) {
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

pub fn read_vlong(b: &[u8], at: &mut usize) -> i64 {
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

/// The CRC32 an IFile ends with.
pub fn crc32(data: &[u8]) -> u32 {
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
pub fn ifile(records: &[(String, i32)]) -> Vec<u8> {
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
pub fn read_ifile(b: &[u8]) -> Vec<(String, i32)> {
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

/// The aggregator, its `mappers` fan-in of that many connections.
pub fn aggregator(reducer: u16, mappers: usize) -> Service {
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
            fan_in: vec![("mappers".into(), mappers)],
            workers: 1,
            max_instances: 16,
            ..ServiceConfig::default()
        },
    )
    .unwrap()
}
