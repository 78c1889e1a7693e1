//! The field constants written for a compiled grammar: one per field path
//! of each unit, named by the path, with the names Rust or the tables
//! would reject left out.

use flick_wire::codegen::field_consts;
use flick_wire::Grammar;

const GRAMMAR: &str = r#"
grammar names;

type inner = unit {
    b_c : uint8;
    x   : uint16;
};

type other = unit {
    c : uint8;
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
}
