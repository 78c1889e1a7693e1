//! The field constants written for a compiled grammar: one per field path
//! of each unit, named by the path, with the names Rust or the tables
//! would reject left out; and any reference, whatever its parts, reads
//! any message without panicking.

use flick_wire::codegen::field_consts;
use flick_wire::{Grammar, HeaderRef};

const GRAMMAR: &str = r#"
grammar names;

type inner = unit {
    b_c : uint8;
    x   : uint16;
};

type other = unit {
    c : uint8;
};

type crate = unit {
    y : uint8;
};

type match = unit {
    a      : inner;
    a_b    : other;
    fields : uint8;
    n      : uint8;
    tail   : bytes &length = self.n;
};
"#;

#[test]
fn each_field_path_is_a_constant_named_by_it() {
    let g = Grammar::from_source("names", GRAMMAR).unwrap();
    let out = field_consts(&g);
    let unit = g.unit_id("match").unwrap();
    // A unit named by a Rust keyword is a raw module name.
    assert!(out.contains("pub mod r#match {"), "{out}");
    // A field of a unit inside the unit, by its path, as `field_ref`
    // resolves it.
    let x = g.field_ref(unit, "a.x").unwrap();
    assert!(out.contains("/// `a.x`.\n        pub const A_X: flick_wire::FieldRef"));
    assert!(out.contains("(\"a.x\", A_X)"));
    assert_eq!(x.slot(), g.field_slot(unit, "a").unwrap() + 1);
    assert!(out.contains("pub const TAIL: flick_wire::FieldRef"));
    // `a.b_c` and `a_b.c` would both be A_B_C: neither is written.
    assert!(!out.contains("A_B_C"), "{out}");
    // A field called `fields` would clash with the unit's table.
    assert!(!out.contains("pub const FIELDS: flick_wire::FieldRef"));
    assert!(out.contains("pub const FIELDS: &[(&str, flick_wire::FieldRef)]"));
    assert!(out.contains("(\"match\", r#match::FIELDS)"), "{out}");
    // A keyword no raw name can take.
    assert!(out.contains("pub mod crate_ {"), "{out}");
}

#[test]
fn each_header_is_a_constant_of_its_length() {
    let g = Grammar::from_source("names", GRAMMAR).unwrap();
    let out = field_consts(&g);
    let unit = g.unit_id("match").unwrap();
    let a = g.header_ref::<3>(unit, "a").unwrap();
    assert!(
        out.contains(&format!(
            "/// `a`.\n        pub const A: flick_wire::HeaderRef<3> = \
             flick_wire::HeaderRef::compiled({});",
            a.start()
        )),
        "{out}"
    );
    assert!(
        out.contains("pub const A_B: flick_wire::HeaderRef<1>"),
        "{out}"
    );
    // A unit's own header, and none for one that begins with a unit.
    assert!(
        out.contains("pub const UNIT: flick_wire::HeaderRef<3>"),
        "{out}"
    );
    assert_eq!(g.header_ref::<1>(unit, ""), None);
    assert!(out.contains("(\"match\", r#match::HEADERS)"), "{out}");
    assert!(out.contains("(\"a\", A.start(), A.len())"), "{out}");
}

#[test]
#[should_panic(expected = "not a field reference")]
fn parts_no_reference_has_are_refused() {
    // A shift of 64 would panic in every read.
    let _ = flick_wire::FieldRef::compiled(0, true, (0, 0), (2, false, 64, 0xffff), 0);
}

#[test]
fn any_reference_reads_any_message_without_panicking() {
    let g = std::sync::Arc::new(Grammar::from_source("names", GRAMMAR).unwrap());
    let unit = g.unit_id("match").unwrap();
    let bytes = [1, 2, 3, 4, 5, 2, b'h', b'i'];
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for in_place in [false, true] {
        let p = g.parser(unit);
        let mut p = if in_place { p.in_place() } else { p };
        assert!(matches!(p.parse(&bytes), Ok(flick_wire::Progress::Done(8))));
        for cut in 0..=bytes.len() {
            // The message over fewer bytes than it was parsed from.
            let m = p.message(&bytes[..cut]);
            for _ in 0..2000 {
                let r = next();
                let int = (
                    (r >> 32) as u8 % 9,
                    r >> 62 & 1 == 1,
                    (r >> 40) as u8 % 64,
                    next(),
                );
                let place = ((r >> 8) as u16 % 16, (r >> 16) as u16 % 16);
                let len = (r >> 52) as u16 % 24;
                let f =
                    flick_wire::FieldRef::compiled(r as u16 % 12, r >> 63 == 1, place, int, len);
                let _ = (m.uint_of(&f), m.bytes_of(&f));
                // A header of any start and length, and any field of it.
                let start = (r >> 20) as u16 % 16;
                if let Some(h) = m.header(&HeaderRef::<3>::compiled(start)) {
                    let _ = (h.uint(&f), h.bytes(&f));
                }
                if let Some(h) = m.header(&HeaderRef::<1>::compiled(start)) {
                    let _ = (h.uint(&f), h.bytes(&f));
                }
            }
        }
    }
}
