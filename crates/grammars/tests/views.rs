//! Views leave out bit fields nothing they keep reads: a packet program
//! that reads a TCP header's ports does not compute its eight flags, in
//! generated code or in the interpreter, and one that reads a flag gets it.
//! A field a view leaves out that lies at a fixed offset is still read, in
//! place, from the message's bytes.

use flick_wire::{Grammar, Parser, Progress, Slot};
use std::sync::Arc;

/// A SYN from port 51432 to port 80, with 20 bytes of options.
const SYN_TCP: &[u8] = &[
    0xc8, 0xe8, 0x00, 0x50, 0x3a, 0x1c, 0x5e, 0x77, 0x00, 0x00, 0x00, 0x00, 0xa0, 0x02, 0xfa, 0xf0,
    0x4a, 0x85, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a, 0x00, 0x6d, 0x3a, 0x4c,
    0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x03, 0x07,
];

fn packet() -> Arc<Grammar> {
    flick_grammars::install();
    Grammar::stock("packet").unwrap()
}

fn viewed(g: &Arc<Grammar>, fields: &[&str], generated: bool) -> Parser {
    let unit = g.unit_id("tcp").unwrap();
    let p = Parser::with_view(g.clone(), unit, g.view(unit, fields).unwrap());
    assert!(p.is_compiled(), "generated code runs under a view");
    if generated {
        p
    } else {
        p.interpreted()
    }
}

fn parsed(p: &mut Parser) {
    assert_eq!(p.parse(SYN_TCP).unwrap(), Progress::Done(SYN_TCP.len()));
}

/// Whether the parse stored field `name` of the TCP header.
fn stored(g: &Grammar, p: &Parser, name: &str) -> bool {
    let slot = g.field_slot(g.unit_id("tcp").unwrap(), name).unwrap();
    p.slots()[slot as usize] != Slot::Unset
}

#[test]
fn a_view_of_the_ports_computes_no_flags() {
    let g = packet();
    for generated in [true, false] {
        let mut p = viewed(&g, &["src_port", "dst_port"], generated);
        parsed(&mut p);
        let m = p.message(SYN_TCP);
        assert_eq!(m.int("src_port"), Some(51432));
        assert_eq!(m.int("dst_port"), Some(80));
        // Checked, so kept: the data offset and the options it sizes.
        assert_eq!(m.int("data_offset"), Some(10));
        for flag in ["flags", "flag_syn", "flag_ack", "flag_fin"] {
            assert!(
                !stored(&g, &p, flag),
                "{flag} computed under a view of the ports (generated: {generated})"
            );
        }
        assert!(!stored(&g, &p, "seq"));
        // Read all the same, from the bytes.
        assert_eq!(m.int("flag_syn"), Some(1));
        assert_eq!(m.int("seq"), Some(0x3a1c_5e77));
    }
}

#[test]
fn a_view_of_a_flag_computes_it_from_its_field() {
    let g = packet();
    for generated in [true, false] {
        let mut p = viewed(&g, &["flag_syn", "flag_ack"], generated);
        for _ in 0..3 {
            p.reset();
            parsed(&mut p);
            let m = p.message(SYN_TCP);
            assert_eq!(m.int("flag_syn"), Some(1));
            assert_eq!(m.int("flag_ack"), Some(0));
            assert!(stored(&g, &p, "flag_syn") && !stored(&g, &p, "flag_fin"));
        }
    }
    // Without a view every flag is there.
    let mut p = g.parser(g.unit_id("tcp").unwrap());
    parsed(&mut p);
    assert_eq!(p.message(SYN_TCP).int("flag_fin"), Some(0));
    assert_eq!(p.message(SYN_TCP).int("flags"), Some(2));
}
