//! Which fields a grammar can read in place, and reading them: a unit's
//! leading fixed-width fields in either byte order, bytes of a constant
//! length and bit fields of its integers, up to the first field whose
//! width depends on the message; and that run read whole as a header.

use flick_wire::{FixedKind, Grammar, Progress};

const GRAMMAR: &str = r#"
grammar layout;
%byteorder = little;

type rec = unit {
    a     : uint16;
    b     : int8;
    tag   : bytes &length = 3;
    var hi : uint8 &parse = self.a / 256 % 16;
    c     : uint32 &byteorder = "big";
    n     : uint8;
    body  : bytes &length = self.n;
    after : uint16;
};
"#;

#[test]
fn the_leading_fixed_fields_are_read_in_place() {
    let g = std::sync::Arc::new(Grammar::from_source("layout", GRAMMAR).unwrap());
    let unit = g.unit_id("rec").unwrap();
    let info = g.unit(unit);
    let fixed = |name: &str| {
        let f = info.fields.iter().find(|f| f.name == name).unwrap();
        f.fixed.map(|x| (x.offset, x.kind))
    };
    let int = |width, little, shift, mask| FixedKind::Int {
        width,
        little,
        shift,
        mask,
    };
    assert_eq!(fixed("a"), Some((0, int(2, true, 0, 0xffff))));
    // Signed: stored, but its width keeps the run going.
    assert_eq!(fixed("b"), None);
    assert_eq!(fixed("tag"), Some((3, FixedKind::Bytes { len: 3 })));
    assert_eq!(fixed("hi"), Some((0, int(2, true, 8, 0xf))));
    assert_eq!(fixed("c"), Some((6, int(4, false, 0, 0xffff_ffff))));
    assert_eq!(fixed("n"), Some((10, int(1, true, 0, 0xff))));
    // A length from the message ends the run.
    assert_eq!(fixed("body"), None);
    assert_eq!(fixed("after"), None);

    let bytes = [
        0x34, 0x1b, // a = 0x1b34, little-endian
        0xfe, // b = -2
        b'x', b'y', b'z', // tag
        0x01, 0x02, 0x03, 0x04, // c = 0x01020304, big-endian
        2, b'h', b'i', // n, body
        0x01, 0x00, // after = 1
    ];
    let mut p = g.parser(unit).in_place();
    assert_eq!(p.parse(&bytes).unwrap(), Progress::Done(bytes.len()));
    let m = p.message(&bytes);
    let field = |name: &str| g.field_ref(unit, name).unwrap();
    assert_eq!(m.uint_of(&field("a")), Some(0x1b34));
    assert_eq!(m.uint_of(&field("hi")), Some(0xb));
    assert_eq!(m.uint_of(&field("c")), Some(0x0102_0304));
    assert_eq!(m.uint_of(&field("n")), Some(2));
    assert_eq!(m.uint_of(&field("after")), Some(1));
    assert_eq!(m.bytes_of(&field("tag")), Some(&b"xyz"[..]));
    assert_eq!(m.bytes_of(&field("body")), Some(&b"hi"[..]));
    assert_eq!(m.int("b"), Some(-2));
    // The same by name, and from a message cut right after the run, whose
    // last field no eight-byte load covers.
    assert_eq!(m.int("hi"), Some(0xb));
    let head = &bytes[..11];
    let m = p.message(head);
    assert_eq!(m.uint_of(&field("n")), Some(2));
    assert_eq!(m.uint_of(&field("c")), Some(0x0102_0304));

    // A view that stores only `n`: the rest of the run is decoded from
    // the bytes when read, in either byte order.
    let keep = g.view(unit, &["n"]).unwrap();
    let mut v = flick_wire::Parser::with_view(g.clone(), unit, keep);
    assert_eq!(v.parse(&bytes).unwrap(), Progress::Done(bytes.len()));
    let a = g.field_slot(unit, "a").unwrap() as usize;
    assert_eq!(v.slots()[a], flick_wire::Slot::Unset);
    let m = v.message(&bytes);
    assert_eq!(m.int("a"), Some(0x1b34));
    assert_eq!(m.uint_of(&field("a")), Some(0x1b34));
    assert_eq!(m.int("hi"), Some(0xb));
    assert_eq!(m.uint_of(&field("hi")), Some(0xb));
    assert_eq!(m.int("c"), Some(0x0102_0304));
    assert_eq!(m.bytes("tag"), Some(&b"xyz"[..]));
    assert_eq!(m.uint_at(a as u16), None, "slot reads read slots only");

    // The run as one header of 11 bytes, each field read from it: in
    // either byte order, bit fields and bytes; not the signed field, nor
    // any past the run.
    assert_eq!(g.unit(unit).fixed_run.map(|r| r.len), Some(11));
    assert_eq!(g.header_ref::<12>(unit, ""), None);
    let h = g.header_ref::<11>(unit, "").unwrap();
    let hdr = m.header(&h).expect("the run is in the message");
    assert_eq!(hdr.as_bytes(), &bytes[..11]);
    assert_eq!(hdr.uint(&field("a")), Some(0x1b34));
    assert_eq!(hdr.uint(&field("hi")), Some(0xb));
    assert_eq!(hdr.uint(&field("c")), Some(0x0102_0304));
    assert_eq!(hdr.uint(&field("n")), Some(2));
    assert_eq!(hdr.bytes(&field("tag")), Some(&b"xyz"[..]));
    assert_eq!(hdr.uint(&field("tag")), None);
    assert_eq!(hdr.bytes(&field("a")), None);
    assert_eq!(hdr.uint(&field("b")), None);
    assert_eq!(hdr.uint(&field("after")), None);
    assert_eq!(hdr.bytes(&field("body")), None);
    // A message cut inside the run has no header.
    assert!(v.message(&bytes[..10]).header(&h).is_none());
}
