//! Generated parsers clear nothing between messages, so they must leave
//! nothing of one message in the next: a `get` of one key after a `get`
//! of three, or a `delete` after a `get`, shows no slot of the message
//! before it.

use flick_wire::{Grammar, Parser, Progress, Slot};

fn request_parser() -> Parser {
    flick_grammars::install();
    let g = Grammar::stock("memcached_ascii").unwrap();
    let p = g.parser(g.unit_id("request").unwrap());
    assert!(p.is_compiled());
    p
}

/// The set slots after parsing `msg`, as (index, value).
fn set_slots(p: &mut Parser, msg: &[u8]) -> Vec<(usize, Slot)> {
    p.reset();
    assert_eq!(p.parse(msg).unwrap(), Progress::Done(msg.len()));
    p.slots()
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != Slot::Unset)
        .map(|(i, s)| (i, *s))
        .collect()
}

#[test]
fn a_message_after_a_longer_one_shows_nothing_of_it() {
    let sequence: [&[u8]; 5] = [
        b"get alpha beta gamma\r\n",
        b"get delta\r\n",
        b"delete epsilon noreply\r\n",
        b"gets zeta eta\r\n",
        b"touch theta 10\r\n",
    ];
    let mut fresh_for_each = Vec::new();
    for msg in sequence {
        fresh_for_each.push(set_slots(&mut request_parser(), msg));
    }
    let mut one = request_parser();
    for (msg, want) in sequence.iter().zip(&fresh_for_each) {
        assert_eq!(
            &set_slots(&mut one, msg),
            want,
            "{}",
            String::from_utf8_lossy(msg)
        );
    }
    assert_eq!(one.compiled_messages(), sequence.len() as u64);
}
