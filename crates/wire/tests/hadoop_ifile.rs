//! The Hadoop IFile grammar against Hadoop's documented encodings:
//! `WritableUtils.writeVLong` for lengths, `IFile.Writer` for records and
//! the end marker, `IFileOutputStream` for the CRC32 trailer, and `Text`,
//! `IntWritable` and `LongWritable` for typed keys and values.

mod support;

use flick_wire::{Builder, Grammar, Progress, Slot, Value};
use proptest::prelude::*;
use std::sync::Arc;
use support::check_every_split;

/// A line-for-line port of Hadoop's `WritableUtils.writeVLong`, kept
/// independent of the crate's own encoder.
fn vlong(mut i: i64) -> Vec<u8> {
    let mut out = Vec::new();
    if (-112..=127).contains(&i) {
        out.push(i as u8);
        return out;
    }
    let mut len: i32 = -112;
    if i < 0 {
        i ^= -1;
        len = -120;
    }
    let mut tmp = i;
    while tmp != 0 {
        tmp >>= 8;
        len -= 1;
    }
    out.push(len as u8);
    let len = if len < -120 {
        -(len + 120)
    } else {
        -(len + 112)
    };
    for idx in (1..=len).rev() {
        let shift = (idx - 1) * 8;
        out.push(((i & (0xff << shift)) >> shift) as u8);
    }
    out
}

/// CRC-32 (IEEE 802.3, zlib's polynomial), bit by bit.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// One IFile record as `IFile.Writer.append` writes it.
fn record(key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = vlong(key.len() as i64);
    out.extend(vlong(value.len() as i64));
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    out
}

/// A whole IFile: records, the EOF marker and the CRC32 of all of it.
fn ifile(records: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in records {
        out.extend(record(k, v));
    }
    out.extend(vlong(-1));
    out.extend(vlong(-1));
    let sum = crc32(&out);
    out.extend(sum.to_be_bytes());
    out
}

/// `Text.write`: a VInt byte count and the UTF-8 bytes.
fn text(s: &str) -> Vec<u8> {
    let mut out = vlong(s.len() as i64);
    out.extend_from_slice(s.as_bytes());
    out
}

fn grammar() -> Arc<Grammar> {
    Grammar::stock("hadoop_ifile").unwrap()
}

fn parse_one(g: &Arc<Grammar>, unit: &str, bytes: &[u8]) -> flick_wire::Parser {
    let mut p = g.parser(g.unit_id(unit).unwrap());
    assert_eq!(p.parse(bytes).unwrap(), Progress::Done(bytes.len()));
    p
}

fn reserialize(g: &Arc<Grammar>, unit: &str, bytes: &[u8]) -> Vec<u8> {
    let p = parse_one(g, unit, bytes);
    let mut slots = p.slots().to_vec();
    let mut out = Vec::new();
    g.serialize(p.unit(), &mut slots, bytes, &mut out).unwrap();
    out
}

#[test]
fn the_test_crc32_is_the_standard_one() {
    assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    assert_eq!(crc32(b""), 0);
}

#[test]
fn vints_follow_writable_utils() {
    // Encodings worked out from WritableUtils.writeVLong by hand.
    let fixtures: &[(i64, &[u8])] = &[
        (0, &[0x00]),
        (1, &[0x01]),
        (127, &[0x7f]),
        (-1, &[0xff]),
        (-112, &[0x90]),
        (-113, &[0x87, 0x70]),
        (128, &[0x8f, 0x80]),
        (255, &[0x8f, 0xff]),
        (256, &[0x8e, 0x01, 0x00]),
        (-256, &[0x87, 0xff]),
        (-257, &[0x86, 0x01, 0x00]),
        (1_000_000, &[0x8d, 0x0f, 0x42, 0x40]),
        (i32::MAX as i64, &[0x8c, 0x7f, 0xff, 0xff, 0xff]),
        (
            i64::MAX,
            &[0x88, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ),
        (
            i64::MIN,
            &[0x80, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ),
    ];
    let g = Arc::new(Grammar::from_source("vints", "type v = unit { x : vint; };").unwrap());
    for &(v, enc) in fixtures {
        assert_eq!(vlong(v), enc, "port of writeVLong, {v}");
        let mut ours = Vec::new();
        flick_wire::write_vlong(&mut ours, v);
        assert_eq!(ours, enc, "write_vlong {v}");
        let p = parse_one(&g, "v", enc);
        assert_eq!(p.message(enc).int("x"), Some(v as i128), "parse {v}");
        assert_eq!(reserialize(&g, "v", enc), enc, "round trip {v}");
    }
}

#[test]
fn record_lengths_are_vints() {
    let g = grammar();
    for n in [0usize, 1, 127, 128, 255, 256, 1000, 65536] {
        let key = vec![b'k'; n.min(65536)];
        let value = vec![b'v'; n];
        let bytes = record(&key, &value);
        let p = parse_one(&g, "record", &bytes);
        let m = p.message(&bytes);
        assert_eq!(m.int("key_len"), Some(n as i128));
        assert_eq!(m.int("value_len"), Some(n as i128));
        assert_eq!(m.bytes("key"), Some(&key[..]));
        assert_eq!(m.bytes("value"), Some(&value[..]));
        assert!(matches!(m.get("checksum"), Value::Absent));
        assert_eq!(reserialize(&g, "record", &bytes), bytes);
    }
    // 1000000 takes a four-byte VInt, and is within the value bound.
    let value = vec![7u8; 1_000_000];
    let bytes = record(b"big", &value);
    assert_eq!(bytes[1..5], [0x8d, 0x0f, 0x42, 0x40]);
    let p = parse_one(&g, "record", &bytes);
    assert_eq!(p.message(&bytes).int("value_len"), Some(1_000_000));
}

#[test]
fn a_file_is_records_then_the_marker_and_its_crc32() {
    let g = grammar();
    let records = vec![
        (b"hello".to_vec(), b"world".to_vec()),
        (Vec::new(), Vec::new()),
        (vec![0xab; 200], vec![0xcd; 300]),
        (text("the"), 7i32.to_be_bytes().to_vec()),
    ];
    let file = ifile(&records);
    let mut p = g.parser(g.unit_id("record").unwrap());
    let mut at = 0;
    for (k, v) in &records {
        let rest = &file[at..];
        let Progress::Done(n) = p.parse(rest).unwrap() else {
            panic!("record at {at} incomplete");
        };
        let m = p.message(rest);
        assert_eq!(m.int("key_len"), Some(k.len() as i128));
        assert_eq!(m.int("value_len"), Some(v.len() as i128));
        assert_eq!(m.bytes("key"), Some(&k[..]));
        assert_eq!(m.bytes("value"), Some(&v[..]));
        at += n;
        p.reset();
    }
    let rest = &file[at..];
    assert_eq!(rest.len(), 6, "two one-byte -1s and four checksum bytes");
    assert_eq!(p.parse(rest).unwrap(), Progress::Done(6));
    let m = p.message(rest);
    assert_eq!(m.int("key_len"), Some(-1));
    assert_eq!(m.int("value_len"), Some(-1));
    assert_eq!(
        m.int("checksum"),
        Some(crc32(&file[..file.len() - 4]) as i128)
    );
    assert!(matches!(m.get("key"), Value::Absent));
    assert!(matches!(m.get("value"), Value::Absent));
    assert_eq!(reserialize(&g, "record", rest), rest);
}

#[test]
fn bad_lengths_are_rejected() {
    let g = grammar();
    let unit = g.unit_id("record").unwrap();
    let bad: &[&[u8]] = &[
        &[0xfe, 0x00],             // key length -2
        &[0xff, 0x00],             // -1 with a value length: not the marker
        &[0x00, 0xff],             // a negative value length
        &[0x05, 0xfe],             // another
        &[0x8d, 0x01, 0x00, 0x01], // key of 65537 bytes: over the bound
    ];
    for b in bad {
        let mut p = g.parser(unit);
        let mut bytes = b.to_vec();
        bytes.extend([0, 0, 0, 0, 0, 0]);
        bytes.resize(bytes.len() + 70000, 0);
        assert!(p.parse(&bytes).is_err(), "{b:02x?}");
    }
}

#[test]
fn records_of_text_and_int_writable() {
    let g = grammar();
    // A word-count map output record: Text "apple", IntWritable 42.
    let key = text("apple");
    let value = 42i32.to_be_bytes();
    let bytes = record(&key, &value);
    assert_eq!(
        bytes,
        [6, 4, 5, b'a', b'p', b'p', b'l', b'e', 0, 0, 0, 42],
        "key_len covers the Text's own length byte"
    );
    let p = parse_one(&g, "text_int_record", &bytes);
    let m = p.message(&bytes);
    assert_eq!(m.int("key_len"), Some(6));
    let Value::Unit(k) = m.get("key") else {
        panic!("key is a Text")
    };
    assert_eq!(k.int("length"), Some(5));
    assert_eq!(k.bytes("value"), Some(&b"apple"[..]));
    assert_eq!(m.int("value"), Some(42));
    assert_eq!(reserialize(&g, "text_int_record", &bytes), bytes);

    // The same record as raw key and value bytes, each viewed on its own.
    let p = parse_one(&g, "record", &bytes);
    let m = p.message(&bytes);
    let kb = m.bytes("key").unwrap();
    let vb = m.bytes("value").unwrap();
    let t = parse_one(&g, "text", kb);
    assert_eq!(t.message(kb).bytes("value"), Some(&b"apple"[..]));
    let i = parse_one(&g, "int_writable", vb);
    assert_eq!(i.message(vb).int("value"), Some(42));

    // A Text longer than 127 bytes has a two-byte length.
    let word = "x".repeat(200);
    let bytes = record(&text(&word), &(-5i32).to_be_bytes());
    assert_eq!(bytes[..4], [0x8f, 202, 4, 0x8f]);
    let p = parse_one(&g, "text_int_record", &bytes);
    let m = p.message(&bytes);
    assert_eq!(m.int("key_len"), Some(202));
    assert_eq!(m.int("value"), Some(-5));
    assert_eq!(reserialize(&g, "text_int_record", &bytes), bytes);

    // A key length that disagrees with the Text is an error, as is a
    // value that is not four bytes.
    let mut p = g.parser(g.unit_id("text_int_record").unwrap());
    let e = p
        .parse(&[7, 4, 5, b'a', b'p', b'p', b'l', b'e', 0, 0, 0, 42, 0])
        .unwrap_err();
    assert_eq!(&*e.field, "key_size");
    let mut p = g.parser(g.unit_id("text_int_record").unwrap());
    assert!(p.parse(&[6, 8, 5, b'a']).is_err());

    // LongWritable: eight bytes, big-endian, signed.
    let v = (-1_234_567_890_123i64).to_be_bytes();
    let p = parse_one(&g, "long_writable", &v);
    assert_eq!(p.message(&v).int("value"), Some(-1_234_567_890_123));
    let v = i64::MAX.to_be_bytes();
    let p = parse_one(&g, "long_writable", &v);
    assert_eq!(p.message(&v).int("value"), Some(i64::MAX as i128));
}

#[test]
fn a_file_parses_the_same_at_every_split() {
    let g = grammar();
    let records = vec![
        (b"k1".to_vec(), b"v1".to_vec()),
        (vec![1; 130], vec![2; 260]),
        (Vec::new(), b"x".to_vec()),
    ];
    let file = ifile(&records);
    check_every_split(&g, "record", &file, 4);

    let mut stream = Vec::new();
    for (w, n) in [("a", 1i32), (&"long".repeat(40), -300), ("", 0)] {
        stream.extend(record(&text(w), &n.to_be_bytes()));
    }
    check_every_split(&g, "text_int_record", &stream, 3);
}

/// Sets `field` of the unit-valued top-level field `outer` of a builder.
fn set_nested_bytes(b: &mut Builder, g: &Grammar, unit: &str, outer: &str, field: &str, v: &[u8]) {
    let info = g.unit(g.unit_id(unit).unwrap());
    let o = info.fields.iter().find(|f| f.name == outer).unwrap();
    let flick_wire::FieldKind::Unit(inner) = o.kind else {
        panic!("{outer} is not a unit")
    };
    let f = g
        .unit(inner)
        .fields
        .iter()
        .find(|f| f.name == field)
        .unwrap();
    b.slots[(o.slot + f.slot) as usize] = Slot::Bytes {
        start: b.data.len() as u32,
        len: v.len() as u32,
    };
    b.data.extend_from_slice(v);
}

proptest! {
    /// Generated code's reader (`rt::vlong_at`) answers as the
    /// interpreter's (`read_vlong`) at any offset of any bytes, and reads
    /// back what `writeVLong` wrote there.
    #[test]
    fn vint_reads_agree_at_any_offset(
        prefix in proptest::collection::vec(any::<u8>(), 0..8),
        v in any::<i64>(),
        cut in 0usize..10,
        noise in proptest::collection::vec(any::<u8>(), 0..12),
    ) {
        use flick_wire::rt::{read_vlong, vlong_at};
        let mut buf = prefix.clone();
        buf.extend(vlong(v));
        let whole = buf.len();
        buf.truncate(prefix.len() + cut.min(whole - prefix.len()));
        prop_assert_eq!(vlong_at(&buf, prefix.len()), read_vlong(&buf[prefix.len()..]));
        if buf.len() == whole {
            prop_assert_eq!(vlong_at(&buf, prefix.len()), Some((v, whole - prefix.len())));
        }
        for pos in 0..=noise.len() {
            prop_assert_eq!(vlong_at(&noise, pos), read_vlong(&noise[pos..]));
        }
    }

    #[test]
    fn vints_round_trip(v in any::<i64>()) {
        let g = Arc::new(Grammar::from_source("vints", "type v = unit { x : vint; };").unwrap());
        let enc = vlong(v);
        let p = parse_one(&g, "v", &enc);
        prop_assert_eq!(p.message(&enc).int("x"), Some(v as i128));
        let mut b = Builder::new(g.clone(), 0);
        b.set_int("x", v as i128);
        let mut out = Vec::new();
        b.serialize(&mut out).unwrap();
        prop_assert_eq!(out, enc);
    }

    #[test]
    fn built_records_parse_back(
        key in proptest::collection::vec(any::<u8>(), 0..300),
        value in proptest::collection::vec(any::<u8>(), 0..600),
        checksum in any::<u32>(),
    ) {
        let g = grammar();
        let unit = g.unit_id("record").unwrap();
        let mut b = Builder::new(g.clone(), unit);
        b.set_bytes("key", &key);
        b.set_bytes("value", &value);
        let mut out = Vec::new();
        b.serialize(&mut out).unwrap();
        prop_assert_eq!(&out, &record(&key, &value));
        let p = parse_one(&g, "record", &out);
        let m = p.message(&out);
        prop_assert_eq!(m.int("key_len"), Some(key.len() as i128));
        prop_assert_eq!(m.bytes("key"), Some(&key[..]));
        prop_assert_eq!(m.bytes("value"), Some(&value[..]));
        prop_assert_eq!(reserialize(&g, "record", &out), out);

        b.clear();
        b.set_int("key_len", -1);
        b.set_int("value_len", -1);
        b.set_int("checksum", checksum as i128);
        let mut out = Vec::new();
        b.serialize(&mut out).unwrap();
        let mut want = vec![0xff, 0xff];
        want.extend(checksum.to_be_bytes());
        prop_assert_eq!(&out, &want);
        let p = parse_one(&g, "record", &out);
        prop_assert_eq!(p.message(&out).int("checksum"), Some(checksum as i128));
        prop_assert_eq!(reserialize(&g, "record", &out), out);
    }

    #[test]
    fn built_text_int_records_parse_back(word in "\\PC{0,150}", n in any::<i32>()) {
        let g = grammar();
        let unit = g.unit_id("text_int_record").unwrap();
        let mut b = Builder::new(g.clone(), unit);
        set_nested_bytes(&mut b, &g, "text_int_record", "key", "value", word.as_bytes());
        b.set_int("value", n as i128);
        let mut out = Vec::new();
        b.serialize(&mut out).unwrap();
        prop_assert_eq!(&out, &record(&text(&word), &n.to_be_bytes()));
        let p = parse_one(&g, "text_int_record", &out);
        let m = p.message(&out);
        let Value::Unit(k) = m.get("key") else { panic!("key is a Text") };
        prop_assert_eq!(k.bytes("value"), Some(word.as_bytes()));
        prop_assert_eq!(m.int("value"), Some(n as i128));
        prop_assert_eq!(reserialize(&g, "text_int_record", &out), out);
    }

    /// Arbitrary bytes never panic the parser; whatever parses serialises
    /// to bytes that parse to the same values (the same bytes, but for
    /// VInts written longer than `writeVLong` writes them).
    #[test]
    fn arbitrary_bytes_parse_safely(
        unit in prop::sample::select(vec!["record", "text", "int_writable", "long_writable", "text_int_record"]),
        bytes in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let g = grammar();
        let mut p = g.parser(g.unit_id(unit).unwrap());
        if let Ok(Progress::Done(n)) = p.parse(&bytes) {
            let first = format!("{:?}", p.message(&bytes));
            let mut slots = p.slots().to_vec();
            let mut out = Vec::new();
            g.serialize(p.unit(), &mut slots, &bytes, &mut out).unwrap();
            prop_assert!(out.len() <= n);
            let again = parse_one(&g, unit, &out);
            prop_assert_eq!(format!("{:?}", again.message(&out)), first);
        }
    }
}

/// Listing 3's `kv`: a Text key and an IntWritable value built from values,
/// written as IFile.Writer writes them, read back, and a stream closed
/// with the end marker and the CRC32 of everything before it.
#[test]
fn kv_records_and_the_end_of_their_stream() {
    let g = grammar();
    let kv = g.unit_id("kv").unwrap();
    let mut stream = Vec::new();
    for (word, n) in [("apple", 3i32), ("banana", -7)] {
        let mut b = Builder::new(g.clone(), kv);
        assert!(b.set_bytes("key", word.as_bytes()));
        assert!(b.set_int("value", n as i128));
        let mut out = Vec::new();
        b.serialize(&mut out).unwrap();
        assert_eq!(out, record(&text(word), &n.to_be_bytes()), "{word}");
        let p = parse_one(&g, "kv", &out);
        let m = p.message(&out);
        assert_eq!(m.bytes("key"), Some(word.as_bytes()));
        assert_eq!(m.int("value"), Some(n as i128));
        assert_eq!(g.property(kv, "ends", p.slots(), &out), Some(0));
        stream.extend_from_slice(&out);
    }
    let mut crc = flick_wire::StreamCrc::default();
    crc.update(&stream);
    let mut end = Vec::new();
    assert!(g.end_of_stream(kv, &crc, &mut end).unwrap());
    assert_eq!(end[..2], [0xff, 0xff]);
    // The checksum covers the end marker too, as IFileOutputStream's does.
    let mut covered = stream.clone();
    covered.extend_from_slice(&[0xff, 0xff]);
    assert_eq!(end[2..], crc32(&covered).to_be_bytes());
    stream.extend_from_slice(&end);
    // What Hadoop's writer produces for the same records.
    let hadoop = ifile(&[
        (text("apple"), 3i32.to_be_bytes().to_vec()),
        (text("banana"), (-7i32).to_be_bytes().to_vec()),
    ]);
    assert_eq!(stream, hadoop);
    let p = parse_one(&g, "kv", &end);
    assert_eq!(g.property(kv, "ends", p.slots(), &end), Some(1));
}
