//! `&requires` checks of the stock grammars pass and fail where they
//! should, with the failing field and offset: the parser turns checks of
//! values against constants into range tests, and these pin down that
//! they agree with the expressions.

use flick_wire::{write_vlong, Grammar, Progress, WireErrorKind};

/// Parses `bytes` as one message of `unit`: its length, or the failing
/// field, offset and kind.
fn parse(grammar: &str, unit: &str, bytes: &[u8]) -> Result<usize, (String, usize, WireErrorKind)> {
    let g = Grammar::stock(grammar).unwrap();
    let mut p = g.parser(g.unit_id(unit).unwrap());
    match p.parse(bytes) {
        Ok(Progress::Done(n)) => Ok(n),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err((e.field.to_string(), e.offset, e.kind)),
    }
}

fn record(key_len: i64, value_len: i64, rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_vlong(&mut out, key_len);
    write_vlong(&mut out, value_len);
    out.extend(rest);
    out
}

#[test]
fn ifile_lengths_are_both_end_markers_or_both_lengths() {
    let parse = |b: &[u8]| parse("hadoop_ifile", "record", b);
    assert_eq!(parse(&record(-1, -1, &[0, 0, 0, 1])), Ok(6));
    assert_eq!(parse(&record(1, 2, b"abc")), Ok(5));
    assert_eq!(parse(&record(0, 0, b"")), Ok(2));
    let invalid = |field: &str, offset| Err((field.to_string(), offset, WireErrorKind::Invalid));
    assert_eq!(parse(&record(-1, 0, b"")), invalid("value_len", 2));
    assert_eq!(parse(&record(0, -1, b"")), invalid("value_len", 2));
    assert_eq!(parse(&record(5, -3, b"")), invalid("value_len", 2));
    assert_eq!(parse(&record(-2, 0, b"")), invalid("key_len", 1));
}

/// A Memcached binary request header and body.
fn request(magic: u8, opcode: u8, key_len: u16, extras: &[u8], total: u32) -> Vec<u8> {
    let mut out = vec![magic, opcode];
    out.extend(key_len.to_be_bytes());
    out.push(extras.len() as u8);
    out.extend([0, 0, 0]);
    out.extend(total.to_be_bytes());
    out.extend([0; 12]);
    out.extend(extras);
    out.resize(24 + total as usize, b'k');
    out
}

#[test]
fn memcached_header_checks() {
    let parse = |b: &[u8]| parse("memcached_binary", "cmd", b);
    let invalid = |field: &str, offset| Err((field.to_string(), offset, WireErrorKind::Invalid));
    assert_eq!(parse(&request(0x80, 0x00, 3, &[], 3)), Ok(27));
    assert_eq!(parse(&request(0x81, 0x00, 3, &[], 5)), Ok(29));
    assert_eq!(parse(&request(0x82, 0x00, 3, &[], 3)), invalid("magic", 1));
    assert_eq!(parse(&request(0x7f, 0x00, 3, &[], 3)), invalid("magic", 1));
    assert_eq!(
        parse(&request(0x80, 0x00, 251, &[], 251)),
        invalid("key_len", 4)
    );
    assert_eq!(parse(&request(0x80, 0x00, 250, &[], 250)), Ok(274));
    assert_eq!(
        parse(&request(0x80, 0x00, 3, &[], 2)),
        invalid("total_len", 12)
    );
    // Set takes 8 bytes of extras, checked on `flags`.
    assert_eq!(parse(&request(0x80, 0x01, 1, &[0; 8], 9)), Ok(33));
    assert_eq!(
        parse(&request(0x80, 0x01, 1, &[0; 4], 5)),
        invalid("flags", 28)
    );
}

#[test]
fn ipv4_version_and_header_length() {
    let header = |version_ihl: u8, total: u16| {
        let mut h = vec![version_ihl, 0];
        h.extend(total.to_be_bytes());
        h.extend([0; 16]);
        h.resize(((version_ihl & 15) as usize * 4).max(20), 0);
        h
    };
    let parse = |b: &[u8]| parse("packet", "ipv4", b);
    let invalid = |field: &str, offset| Err((field.to_string(), offset, WireErrorKind::Invalid));
    assert_eq!(parse(&header(0x45, 20)), Ok(20));
    assert_eq!(parse(&header(0x46, 24)), Ok(24));
    assert_eq!(parse(&header(0x65, 20)), invalid("version", 1));
    assert_eq!(parse(&header(0x44, 20)), invalid("ihl", 1));
    assert_eq!(parse(&header(0x46, 20)), invalid("total_length", 4));
}
