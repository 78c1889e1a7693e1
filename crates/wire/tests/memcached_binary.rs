//! The Memcached binary grammar against the protocol specification's
//! examples (BinaryProtocolRevamped, "Example" sections).

use flick_wire::{Grammar, Progress, Value};

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

const GET_REQUEST: &str =
    "80 00 00 05 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 00 00 00 00 00 48 65 6c 6c 6f";
const GET_RESPONSE: &str = "81 00 00 00 04 00 00 00 00 00 00 09 00 00 00 00 00 00 00 00 00 00 00 01 de ad be ef 57 6f 72 6c 64";
const ADD_REQUEST: &str = "80 02 00 05 08 00 00 00 00 00 00 12 00 00 00 00 00 00 00 00 00 00 00 00 de ad be ef 00 00 0e 10 48 65 6c 6c 6f 57 6f 72 6c 64";

#[test]
fn parses_the_specification_examples() {
    let g = Grammar::stock("memcached_binary").unwrap();
    let unit = g.unit_id("cmd").unwrap();
    let mut p = g.parser(unit);

    let bytes = hex(GET_REQUEST);
    assert_eq!(p.parse(&bytes).unwrap(), Progress::Done(bytes.len()));
    let m = p.message(&bytes);
    assert_eq!(m.int("magic"), Some(0x80));
    assert_eq!(m.int("opcode"), Some(0));
    assert_eq!(m.bytes("key"), Some(&b"Hello"[..]));
    assert_eq!(m.bytes("value"), Some(&b""[..]));

    p.reset();
    let bytes = hex(GET_RESPONSE);
    assert_eq!(p.parse(&bytes).unwrap(), Progress::Done(bytes.len()));
    let m = p.message(&bytes);
    assert_eq!(m.int("flags"), Some(0xdeadbeef));
    assert_eq!(m.bytes("value"), Some(&b"World"[..]));
    assert!(matches!(m.get("expiration"), Value::Absent));

    p.reset();
    let bytes = hex(ADD_REQUEST);
    assert_eq!(p.parse(&bytes).unwrap(), Progress::Done(bytes.len()));
    let m = p.message(&bytes);
    assert_eq!(m.int("flags"), Some(0xdeadbeef));
    assert_eq!(m.int("expiration"), Some(0xe10));
    assert_eq!(m.bytes("key"), Some(&b"Hello"[..]));
    assert_eq!(m.bytes("value"), Some(&b"World"[..]));
}

#[test]
fn serialising_a_parse_reproduces_the_bytes() {
    let g = Grammar::stock("memcached_binary").unwrap();
    let unit = g.unit_id("cmd").unwrap();
    for fixture in [GET_REQUEST, GET_RESPONSE, ADD_REQUEST] {
        let bytes = hex(fixture);
        let mut p = g.parser(unit);
        assert_eq!(p.parse(&bytes).unwrap(), Progress::Done(bytes.len()));
        let mut slots = p.slots().to_vec();
        let mut out = Vec::new();
        g.serialize(unit, &mut slots, &bytes, &mut out).unwrap();
        assert_eq!(out, bytes);
    }
}

#[test]
fn serialisation_recomputes_lengths() {
    let g = Grammar::stock("memcached_binary").unwrap();
    let unit = g.unit_id("cmd").unwrap();
    let mut b = flick_wire::Builder::new(g.clone(), unit);
    b.set_int("magic", 0x80);
    b.set_int("opcode", 0x01);
    b.set_int("flags", 0xdeadbeef);
    b.set_int("expiration", 0xe10);
    b.set_bytes("key", b"Hello");
    b.set_bytes("value", b"World!");
    b.set_int("extras_len", 8);
    let mut out = Vec::new();
    b.serialize(&mut out).unwrap();
    assert_eq!(out[2..4], [0, 5], "key_len");
    assert_eq!(out[8..12], [0, 0, 0, 8 + 5 + 6], "total_len");
    let mut p = g.parser(unit);
    assert_eq!(p.parse(&out).unwrap(), Progress::Done(out.len()));
    assert_eq!(p.message(&out).bytes("value"), Some(&b"World!"[..]));
}
