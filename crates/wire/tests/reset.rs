//! A reset parser holds no value of the messages before: after parsing
//! longer messages (and failing in the middle of one), its slots for the
//! next message are those of a new parser. A reset clears only the list
//! elements that were written, so this checks it finds them all.

use flick_wire::{Grammar, Progress};

/// Parses `msgs` in turn with one parser, then `last`, and compares the
/// slots with a new parser's for `last` alone.
fn same_as_new(grammar: &str, unit: &str, msgs: &[&[u8]], last: &[u8]) {
    let g = Grammar::stock(grammar).unwrap();
    let u = g.unit_id(unit).unwrap();
    let mut used = g.parser(u);
    for m in msgs {
        used.reset();
        let _ = used.parse(m);
    }
    used.reset();
    let mut fresh = g.parser(u);
    assert_eq!(used.parse(last), fresh.parse(last));
    assert!(matches!(fresh.parse(last), Ok(Progress::Done(_))));
    assert_eq!(used.slots(), fresh.slots(), "{grammar} {unit}");
}

#[test]
fn http_headers_of_earlier_heads_are_cleared() {
    let many = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\n\r\n";
    // Fails in the sixth header, after five were stored.
    let broken = b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\nbad header\r\n\r\n";
    let one = b"GET /x HTTP/1.0\r\nHost: h\r\n\r\n";
    same_as_new("http", "request", &[many, broken], one);
    same_as_new(
        "http",
        "request",
        &[broken, many],
        b"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
    );
}

#[test]
fn memcached_keys_of_earlier_gets_are_cleared() {
    let three: &[u8] = b"get a b c\r\n";
    let set: &[u8] = b"set k 0 0 1\r\nx\r\n";
    same_as_new("memcached_ascii", "request", &[three, set], b"get z\r\n");
    same_as_new(
        "memcached_ascii",
        "request",
        &[three],
        b"set k 0 0 1\r\ny\r\n",
    );
}

/// Copying a message's values copies what a message of its unit may have
/// set; into unset slots, that is all of them, and clearing unsets them.
#[test]
fn copied_values_are_the_parsed_ones_and_clearing_unsets_them() {
    use flick_wire::{Grammar, Parser, Progress, Slot};
    let g = Grammar::stock("http").unwrap();
    let unit = g.unit_id("request").unwrap();
    let mut p = Parser::new(g.clone(), unit);
    let head = b"GET /a HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n";
    assert!(matches!(p.parse(head), Ok(Progress::Done(_))));
    let mut copy = vec![Slot::Unset; p.slots().len()];
    g.copy_slots(unit, p.used_slots(), &mut copy);
    assert_eq!(copy, p.slots());
    g.clear_slots(unit, &mut copy, p.used_slots().len());
    assert!(copy.iter().all(|s| *s == Slot::Unset));
}

/// The same for units whose switch cases share slots (so their lists
/// overlap): copying up to the highest slot set gives every value.
#[test]
fn copied_values_of_every_memcached_text_command_are_all_of_them() {
    use flick_wire::{Grammar, Parser, Progress, Slot};
    let g = Grammar::stock("memcached_ascii").unwrap();
    let unit = g.unit_id("request").unwrap();
    let mut p = Parser::new(g.clone(), unit);
    let mut copy = Vec::new();
    for req in [
        &b"get a b c\r\n"[..],
        b"set k 0 0 5\r\nhello\r\n",
        b"gets x\r\n",
        b"incr n 5 noreply\r\n",
        b"mg k v t\r\n",
        b"version\r\n",
    ] {
        p.reset();
        assert!(matches!(p.parse(req), Ok(Progress::Done(_))), "{req:?}");
        g.copy_slots(unit, p.used_slots(), &mut copy);
        assert_eq!(&copy[..p.slots().len()], p.slots(), "{req:?}");
        g.clear_slots(unit, &mut copy, p.used_slots().len());
        assert!(copy.iter().all(|s| *s == Slot::Unset), "{req:?}");
    }
}
