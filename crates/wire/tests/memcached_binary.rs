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

/// Messages of `stream` as text, fed in `pieces` under the parser's
/// contract: the current message's bytes stay contiguous from its start.
fn messages(pieces: &[&[u8]]) -> Vec<String> {
    let g = Grammar::stock("memcached_binary").unwrap();
    let mut p = g.parser(g.unit_id("cmd").unwrap());
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        while let Progress::Done(n) = p.parse(&buf).unwrap() {
            out.push(format!("{:?}", p.message(&buf)));
            buf.drain(..n);
            p.reset();
        }
    }
    assert!(buf.is_empty());
    out
}

#[test]
fn every_split_point_gives_the_same_messages() {
    let stream: Vec<u8> = [GET_REQUEST, ADD_REQUEST, GET_RESPONSE, GET_REQUEST]
        .iter()
        .flat_map(|h| hex(h))
        .collect();
    let whole = messages(&[&stream]);
    assert_eq!(whole.len(), 4);
    for cut in 0..=stream.len() {
        let (a, b) = stream.split_at(cut);
        assert_eq!(messages(&[a, b]), whole, "split at {cut}");
    }
    for cut in 0..stream.len() {
        for cut2 in cut..stream.len() {
            let pieces = [&stream[..cut], &stream[cut..cut2], &stream[cut2..]];
            assert_eq!(messages(&pieces), whole, "splits at {cut} and {cut2}");
        }
    }
}

#[test]
fn a_view_decodes_only_what_it_needs() {
    let g = Grammar::stock("memcached_binary").unwrap();
    let unit = g.unit_id("cmd").unwrap();
    let keep = g.view(unit, &["key"]).unwrap();
    let mut p = flick_wire::Parser::with_view(g.clone(), unit, keep);
    let bytes = hex(ADD_REQUEST);
    assert_eq!(p.parse(&bytes).unwrap(), Progress::Done(bytes.len()));
    let m = p.message(&bytes);
    assert_eq!(m.bytes("key"), Some(&b"Hello"[..]));
    // Lengths the key depends on are decoded; the value and cas are skipped.
    assert_eq!(m.int("key_len"), Some(5));
    assert!(matches!(m.get("value"), Value::Absent));
    let cas = g.field_slot(unit, "cas").unwrap() as usize;
    assert_eq!(p.slots()[cas], flick_wire::Slot::Unset);
    // The header's fields lie at fixed offsets: read in place all the same.
    assert_eq!(m.int("cas"), Some(0));
    assert!(g.view(unit, &["nope"]).is_err());
}

#[test]
fn bad_bytes_are_typed_errors() {
    let g = Grammar::stock("memcached_binary").unwrap();
    let mut p = g.parser(g.unit_id("cmd").unwrap());
    // Bad magic.
    let mut bytes = hex(GET_REQUEST);
    bytes[0] = 0x42;
    let e = p.parse(&bytes).unwrap_err();
    assert_eq!((&*e.field, e.offset), ("magic", 1));
    // A value length of 4 GB is rejected against the maximum, not obeyed.
    p.reset();
    let mut bytes = hex(GET_REQUEST);
    bytes[8..12].copy_from_slice(&[0xff, 0xff, 0xff, 0xff]);
    let e = p.parse(&bytes).unwrap_err();
    assert_eq!(&*e.field, "value");
    assert!(matches!(
        e.kind,
        flick_wire::WireErrorKind::TooLong { max: 1048576 }
    ));
    // A key longer than Memcached allows.
    p.reset();
    let mut bytes = hex(GET_REQUEST);
    bytes[2..4].copy_from_slice(&[0x01, 0x00]);
    assert_eq!(&*p.parse(&bytes).unwrap_err().field, "key_len");
}

mod roundtrip {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn build_serialise_parse(
            opcode in prop::sample::select(vec![0x00u8, 0x01, 0x04, 0x0c, 0x1c]),
            key in proptest::collection::vec(any::<u8>(), 0..250),
            value in proptest::collection::vec(any::<u8>(), 0..2000),
            flags in any::<u32>(),
            opaque in any::<u32>(),
            cas in any::<u64>(),
        ) {
            let g = Grammar::stock("memcached_binary").unwrap();
            let unit = g.unit_id("cmd").unwrap();
            let mut b = flick_wire::Builder::new(g.clone(), unit);
            b.set_int("magic", 0x80);
            b.set_int("opcode", opcode as i128);
            let extras = match opcode { 0x01 => 8, 0x1c => 4, _ => 0 };
            b.set_int("extras_len", extras);
            b.set_int("flags", flags as i128);
            b.set_int("expiration", 7);
            b.set_int("opaque", opaque as i128);
            b.set_int("cas", cas as i128);
            b.set_bytes("key", &key);
            b.set_bytes("value", &value);
            let mut out = Vec::new();
            b.serialize(&mut out).unwrap();
            let mut p = g.parser(unit);
            prop_assert_eq!(p.parse(&out).unwrap(), Progress::Done(out.len()));
            let m = p.message(&out);
            prop_assert_eq!(m.bytes("key"), Some(&key[..]));
            prop_assert_eq!(m.bytes("value"), Some(&value[..]));
            prop_assert_eq!(m.int("opaque"), Some(opaque as i128));
            prop_assert_eq!(m.int("cas"), Some(cas as i128));
            if opcode == 0x01 {
                prop_assert_eq!(m.int("flags"), Some(flags as i128));
            }
            // And serialising the parse gives the same bytes back.
            let mut slots = p.slots().to_vec();
            let mut again = Vec::new();
            g.serialize(unit, &mut slots, &out, &mut again).unwrap();
            prop_assert_eq!(again, out);
        }
    }
}

#[test]
fn a_request_no_backend_answers_gets_the_fault_reply() {
    let g = Grammar::stock("memcached_binary").unwrap();
    let unit = g.unit_id("cmd").unwrap();
    let mut p = g.parser(unit);
    let request = hex(ADD_REQUEST);
    assert_eq!(p.parse(&request).unwrap(), Progress::Done(request.len()));
    let mut reply = Vec::new();
    assert!(g
        .fault_reply(unit, p.slots(), &request, 1, &mut reply)
        .unwrap());
    let mut q = g.parser(unit);
    assert_eq!(q.parse(&reply).unwrap(), Progress::Done(reply.len()));
    let m = q.message(&reply);
    assert_eq!(m.int("magic"), Some(0x81));
    assert_eq!(m.int("opcode"), Some(0x02), "the request's opcode");
    assert_eq!(m.int("status_or_vbucket"), Some(0x86));
    assert_eq!(m.bytes("key"), Some(&b""[..]));
    assert_eq!(
        m.bytes("value"),
        Some(&b"SERVER_ERROR backend unavailable"[..])
    );
    assert_eq!(reply.len(), 24 + 32, "no extras, no key");
}

/// The fence a proxy writes after a quiet request is a no-op request that
/// parses, is not quiet itself, and whose reply is the one `%fenced` marks.
#[test]
fn the_fence_after_a_quiet_request_is_a_noop() {
    let g = Grammar::stock("memcached_binary").unwrap();
    let unit = g.unit_id("cmd").unwrap();
    let fence = g.fence(unit).expect("a fence").to_vec();
    let mut p = g.parser(unit);
    assert_eq!(p.parse(&fence).unwrap(), Progress::Done(24));
    let m = p.message(&fence);
    assert_eq!((m.int("magic"), m.int("opcode")), (Some(0x80), Some(0x0a)));
    assert_eq!(g.property(unit, "quiet", p.slots(), &fence), Some(0));
    let prop = |bytes: &[u8], name: &str| {
        let mut p = g.parser(unit);
        assert_eq!(p.parse(bytes).unwrap(), Progress::Done(bytes.len()));
        g.property(unit, name, p.slots(), bytes)
    };
    let mut getq = hex(GET_REQUEST);
    getq[1] = 0x09;
    assert_eq!(prop(&getq, "quiet"), Some(1));
    assert_eq!(prop(&hex(GET_REQUEST), "quiet"), Some(0));
    let mut noop_reply = fence.clone();
    noop_reply[0] = 0x81;
    assert_eq!(prop(&noop_reply, "fenced"), Some(1));
    assert_eq!(prop(&hex(GET_RESPONSE), "fenced"), Some(0));
}

/// A Set or SetQ over the item size limit also drops the key's old item in
/// memcached: a proxy sends in its place a SetQ of an empty value that
/// expired long ago (`%reject_send`, its lengths and key filled from the
/// header that parsed), which memcached never answers. Add, Replace,
/// Append and Prepend keep the old item, and send nothing.
#[test]
fn an_oversized_set_sends_an_expired_quiet_set_in_its_place() {
    let g = Grammar::stock("memcached_binary").unwrap();
    let unit = g.unit_id("cmd").unwrap();
    // A header, its 8 bytes of extras and a key, saying the value is `len`.
    let head = |opcode: u8, key: &[u8], len: u32| {
        let mut b = vec![0x80, opcode, 0, key.len() as u8, 8, 0, 0, 0];
        b.extend_from_slice(&(8 + key.len() as u32 + len).to_be_bytes());
        b.extend_from_slice(&[0xaa; 4]);
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]);
        b.extend_from_slice(key);
        b
    };
    let sent = |bytes: &[u8]| {
        let mut p = g.parser(unit);
        let status = p.parse(bytes).unwrap_err().status;
        let mut out = b"kept".to_vec();
        let made = g.reject_send(unit, p.slots(), bytes, &mut out);
        assert_eq!(made, out.len() > 4);
        (status, made.then(|| out[4..].to_vec()))
    };
    let key = vec![b'k'; 250];
    for opcode in [0x01, 0x11] {
        let (status, made) = sent(&head(opcode, &key, 2_000_000));
        assert_eq!(status, Some(0x03));
        let made = made.expect("a set in its place");
        let mut want = vec![0x80, 0x11, 0, 250, 8, 0, 0, 0, 0, 0, 1, 2];
        want.extend_from_slice(&[0; 16]);
        want.extend_from_slice(&2_592_001u32.to_be_bytes());
        want.extend_from_slice(&key);
        assert_eq!(made, want);
        let mut p = g.parser(unit);
        assert_eq!(p.parse(&made).unwrap(), Progress::Done(made.len()));
        let m = p.message(&made);
        assert_eq!(m.int("expiration"), Some(2_592_001));
        assert_eq!(m.bytes("key"), Some(&key[..]));
        assert_eq!(g.property(unit, "quiet", p.slots(), &made), Some(1));
    }
    for opcode in [0x02, 0x03, 0x12, 0x13] {
        assert_eq!(sent(&head(opcode, b"k", 2_000_000)), (Some(0x03), None));
    }
    // Another error of a Set sends nothing.
    let mut bad_extras = head(0x01, b"k", 1);
    bad_extras[4] = 7;
    bad_extras[11] -= 1;
    assert_eq!(sent(&bad_extras).1, None);
}
