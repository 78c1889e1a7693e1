//! The field reader's fixed-offset path (plain TCP/IPv4 frames read from
//! their bytes, no parse) against the `packet` grammar's parse, on seeded
//! frames near that shape: other ethertypes, VLAN tags, IP versions and
//! header lengths, fragments, protocols, TCP data offsets and truncated
//! frames. Every field and the "parsed" answer must be the same.

use flick_machine::fields::{FieldSource, XL_FIELDS};
use flick_machine::model::FieldDef;
use flick_machine::FieldReader;

fn every_field() -> Vec<FieldDef> {
    let mut defs: Vec<FieldDef> = XL_FIELDS
        .iter()
        .map(|r| FieldDef {
            name: r.xl.into(),
            source: r.source(),
        })
        .collect();
    // A field by byte offset, past the end of short frames, ending where
    // a minimum frame (60 bytes) ends.
    defs.push(FieldDef {
        name: "payload".into(),
        source: FieldSource::Bytes { offset: 56, len: 4 },
    });
    defs
}

/// A plain TCP/IPv4 frame of `len` bytes (at least 54), then at most
/// three changes near the headers.
fn frame(next: &mut impl FnMut() -> u64) -> Vec<u8> {
    let len = 54 + (next() % 30) as usize;
    let mut f: Vec<u8> = (0..len).map(|_| next() as u8).collect();
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    f[20..22].copy_from_slice(&[0x40, 0x00]);
    f[23] = 6;
    f[46] = 0x50 | (f[46] & 0x0f);
    for _ in 0..next() % 4 {
        match next() % 10 {
            0 => f[12..14]
                .copy_from_slice(&[[0x81, 0x00], [0x86, 0xdd], [0x08, 0x06]][next() as usize % 3]),
            1 => f[14] = [0x46, 0x44, 0x55, 0x4f, 0x65][next() as usize % 5],
            2 => f[16..18].copy_from_slice(&(next() as u16 % 40).to_be_bytes()),
            3 => f[20..22].copy_from_slice(&(next() as u16).to_be_bytes()),
            4 => f[23] = [17, 1, 0, 6][next() as usize % 4],
            5 => f[46] = (next() as u8) & 0xf0,
            7 => f[46] = 0x60,
            _ => {}
        }
    }
    // Now and then cut short, anywhere in the headers.
    if next().is_multiple_of(8) {
        f.truncate((next() % 60) as usize);
    }
    f
}

/// Reads 20,000 seeded frames with `defs` both ways and requires the
/// same fields and "parsed" answers, and both kinds of frame met.
fn agrees_with_the_parse(defs: &[FieldDef]) {
    let mut reader = FieldReader::new(defs).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut fast, mut parsed) = (vec![0; defs.len()], vec![0; defs.len()]);
    let mut kinds = [0usize; 2];
    for i in 0..20_000 {
        let f = frame(&mut next);
        let a = reader.read(&f, &mut fast);
        let b = reader.read_parsing(&f, &mut parsed);
        assert_eq!((a, &fast), (b, &parsed), "frame {i}: {f:02x?}");
        kinds[b as usize] += 1;
    }
    // Both frames that parse and frames that do not were met.
    assert!(kinds[0] > 1000 && kinds[1] > 5000, "{kinds:?}");
}

#[test]
fn fixed_offsets_read_what_the_parse_reads() {
    agrees_with_the_parse(&every_field());
}

#[test]
fn a_field_past_a_minimum_frame_is_read_from_the_frame() {
    // Frames of 60 bytes or more are read from a copy of their first 60,
    // where every field lies; a field that ends past them turns that off.
    let mut defs = every_field();
    defs.push(FieldDef {
        name: "past".into(),
        source: FieldSource::Bytes { offset: 58, len: 4 },
    });
    agrees_with_the_parse(&defs);
}
