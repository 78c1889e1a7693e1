//! Grammars of the tests alone (`tests/grammars`), compiled by this
//! crate's build as the stock ones are: on each, generated code and the
//! interpreter give the same values, message by message.

use flick_wire::{Grammar, Parser, Progress, Slot};
use std::sync::Arc;

mod two_switches {
    include!(concat!(env!("OUT_DIR"), "/test_two_switches.rs"));
}

/// The slots of one whole message parsed by `p`, which must take it all.
fn slots_of(p: &mut Parser, msg: &[u8]) -> Vec<Slot> {
    match p.parse(msg) {
        Ok(Progress::Done(n)) => assert_eq!(n, msg.len(), "{:?}", String::from_utf8_lossy(msg)),
        other => panic!("{:?}: {other:?}", String::from_utf8_lossy(msg)),
    }
    let slots = p.slots().to_vec();
    p.reset();
    slots
}

#[test]
fn a_field_set_in_two_switches_keeps_the_first_value() {
    flick_wire::compiled::register(&two_switches::GRAMMAR);
    let src = include_str!("grammars/two_switches.grammar");
    let g = Arc::new(Grammar::from_source("two_switches", src).unwrap());
    let unit = g.unit_id("m").unwrap();
    let mut fast = g.parser(unit);
    assert!(fast.is_compiled(), "the test grammar has generated code");
    let mut slow = g.parser(unit).interpreted();
    let n = g.field_slot(unit, "n").expect("a field n") as usize;
    // After each other, so a slot a message leaves shows in the next.
    for (msg, want) in [
        (&b"a 7 x\n"[..], Some(7)),
        (b"b 9 y\n", Some(9)),
        (b"a 5 z\n", Some(5)),
        (b"c w\n", None),
        (b"a 3 v\n", Some(3)),
    ] {
        let (f, s) = (slots_of(&mut fast, msg), slots_of(&mut slow, msg));
        let shown = String::from_utf8_lossy(msg);
        let int = |slots: &[Slot]| match slots.get(n) {
            Some(Slot::Int(v)) => Some(*v),
            _ => None,
        };
        assert_eq!(int(&s), want, "interpreted {shown:?}");
        assert_eq!(int(&f), want, "generated {shown:?}");
    }
    assert!(fast.compiled_messages() >= 5, "generated code ran");
}
