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

/// The slots of `slots` that are set, as (index, value).
fn set_of(slots: &[Slot]) -> Vec<(usize, Slot)> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != Slot::Unset)
        .map(|(i, s)| (i, *s))
        .collect()
}

/// The set slots after parsing `msg`.
fn set_slots(p: &mut Parser, msg: &[u8]) -> Vec<(usize, Slot)> {
    p.reset();
    assert_eq!(p.parse(msg).unwrap(), Progress::Done(msg.len()));
    set_of(p.slots())
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

/// Header-only frames of every kind the `frame` unit tells apart, so that
/// in a stream of them each message is one frame's headers.
fn frames() -> Vec<Vec<u8>> {
    let eth = |ethertype: u16| {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
        f.extend(ethertype.to_be_bytes());
        f
    };
    let vlan = |inner: u16| {
        let mut f = eth(0x8100);
        f.extend([0x20, 0x07]);
        f.extend(inner.to_be_bytes());
        f
    };
    let ipv4 = |protocol: u8| {
        let mut h = vec![0x45, 0, 0, 60, 0, 1, 0x40, 0, 64, protocol, 0, 0];
        h.extend([10, 0, 0, 1, 10, 0, 0, 2]);
        h
    };
    let ipv6 = |next: u8| {
        let mut h = vec![0x60, 0, 0, 0, 0, 20, next, 64];
        h.extend([0xfe; 32]);
        h
    };
    let tcp = [
        0x04, 0xd2, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x12, 0xff, 0xff, 0, 0, 0, 0,
    ];
    let udp = [0x30, 0x39, 0x00, 0x35, 0, 8, 0, 0];
    let echo = [8, 0, 0, 0, 0, 7, 0, 1];
    let unreachable = [3, 1, 0, 0, 0, 0, 0, 0];
    let join = |parts: &[&[u8]]| parts.concat();
    vec![
        join(&[&eth(0x0800), &ipv4(6), &tcp]),
        join(&[&eth(0x0800), &ipv4(17), &udp]),
        join(&[&eth(0x0800), &ipv4(1), &echo]),
        join(&[&eth(0x0800), &ipv4(1), &unreachable]),
        join(&[&eth(0x0800), &ipv4(47)]),
        join(&[&eth(0x86dd), &ipv6(6), &tcp]),
        join(&[&eth(0x86dd), &ipv6(17), &udp]),
        join(&[&eth(0x86dd), &ipv6(59)]),
        join(&[&vlan(0x0800), &ipv4(6), &tcp]),
        join(&[&vlan(0x86dd), &ipv6(17), &udp]),
        eth(0x0806),
        vlan(0x0806),
    ]
}

/// The packet grammar, with generated code, and its `frame` unit.
fn packet_frame() -> (std::sync::Arc<Grammar>, flick_wire::UnitId) {
    flick_grammars::install();
    let g = Grammar::stock("packet").unwrap();
    let frame = g.unit_id("frame").unwrap();
    (g, frame)
}

/// `n` numbers below `kinds`, in an order that puts every kind after
/// every other somewhere.
fn shuffled(kinds: usize, n: usize) -> Vec<usize> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % kinds as u64) as usize
        })
        .collect()
}

/// Frames of every kind in a shuffled order through one generated
/// parser, one batch, and views naming fields of the headers: each frame
/// shows exactly what it shows parsed alone by the interpreter, however
/// its switches went in the frame before.
#[test]
fn frames_in_any_order_show_nothing_of_the_one_before() {
    let (g, frame) = packet_frame();
    let kinds = frames();
    let order = shuffled(kinds.len(), 400);
    let stream: Vec<u8> = order.iter().flat_map(|&k| kinds[k].clone()).collect();
    let views: [Option<&[&str]>; 3] = [
        None,
        Some(&["ip4.src", "tcp4.dst_port", "udp6.src_port"]),
        Some(&["eth.vlan_id", "icmp4.identifier", "ip6.dst", "tcp6"]),
    ];
    for fields in views {
        let make = || match fields {
            None => g.parser(frame),
            Some(f) => Parser::with_view(g.clone(), frame, g.view(frame, f).unwrap()),
        };
        let alone: Vec<Vec<(usize, Slot)>> = kinds
            .iter()
            .map(|f| set_slots(&mut make().interpreted(), f))
            .collect();
        let mut one = make();
        assert!(one.is_compiled());
        for &k in &order {
            assert_eq!(
                set_slots(&mut one, &kinds[k]),
                alone[k],
                "{fields:?}, kind {k}"
            );
        }
        assert_eq!(one.compiled_messages(), order.len() as u64);

        let mut p = make();
        let mut batch = p.batch(3);
        let (mut at, mut i) = (0, 0);
        while at < stream.len() {
            let n = p.parse_batch(&stream[at..], &mut batch);
            assert!(n > 0, "{fields:?}: a batch stopped at {at}");
            for row in 0..batch.len() {
                assert_eq!(
                    set_of(batch.slots(row)),
                    alone[order[i]],
                    "{fields:?}, row {row}, frame {i}"
                );
                i += 1;
            }
            at += n;
        }
        assert_eq!(i, order.len());
    }
}

/// One parser that takes frames one at a time with batches in between:
/// what a batch's rows held says nothing of the parser's own slots, so a
/// frame parsed after a batch shows nothing of the frame parsed before it.
#[test]
fn batches_between_single_frames_leave_them_nothing() {
    let (g, frame) = packet_frame();
    let kinds = frames();
    let alone: Vec<Vec<(usize, Slot)>> = kinds
        .iter()
        .map(|f| set_slots(&mut g.parser(frame).interpreted(), f))
        .collect();
    let mut p = g.parser(frame);
    let mut batch = p.batch(2);
    for (a, b, c) in (0..kinds.len())
        .flat_map(|a| (0..kinds.len()).map(move |b| (a, b)))
        .flat_map(|(a, b)| (0..kinds.len()).map(move |c| (a, b, c)))
    {
        assert_eq!(set_slots(&mut p, &kinds[a]), alone[a], "first {a}");
        p.reset();
        let pair = [kinds[b].clone(), kinds[b].clone()].concat();
        assert_eq!(p.parse_batch(&pair, &mut batch), pair.len());
        for row in 0..2 {
            assert_eq!(set_of(batch.slots(row)), alone[b], "batch {b} after {a}");
        }
        assert_eq!(
            set_slots(&mut p, &kinds[c]),
            alone[c],
            "{c} after {a}, batch {b}"
        );
    }
}

/// A parser that leaves the headers' fields in place stores where each
/// header begins, and unsets that when a frame lacks the header: read
/// through their references, the fields of a header the frame before had
/// and this one lacks are not there.
#[test]
fn fields_in_place_show_nothing_of_the_frame_before() {
    let (g, frame) = packet_frame();
    let paths = [
        "eth.dst",
        "eth.vlan_id",
        "ip4.src",
        "ip4.ttl",
        "ip6.hop_limit",
        "ip6.src",
        "tcp4.src_port",
        "tcp4.flag_syn",
        "udp4.dst_port",
        "icmp4.code",
        "tcp6.dst_port",
        "udp6.src_port",
    ];
    let refs: Vec<_> = paths
        .iter()
        .map(|p| g.field_ref(frame, p).unwrap())
        .collect();
    let read = |p: &mut Parser, f: &[u8]| {
        p.reset();
        assert_eq!(p.parse(f).unwrap(), Progress::Done(f.len()));
        let m = p.message(f);
        refs.iter()
            .map(|r| (m.uint_of(r), m.bytes_of(r).map(<[u8]>::to_vec)))
            .collect::<Vec<_>>()
    };
    let kinds = frames();
    let alone: Vec<_> = kinds
        .iter()
        .map(|f| read(&mut g.parser(frame).interpreted(), f))
        .collect();
    // Every field is somewhere in some frame.
    for (i, path) in paths.iter().enumerate() {
        assert!(alone.iter().any(|v| v[i] != (None, None)), "{path}");
    }
    let mut one = g.parser(frame).in_place();
    for a in 0..kinds.len() {
        for b in 0..kinds.len() {
            read(&mut one, &kinds[a]);
            assert_eq!(read(&mut one, &kinds[b]), alone[b], "kind {b} after {a}");
        }
    }
    assert_eq!(
        one.compiled_messages(),
        2 * (kinds.len() * kinds.len()) as u64
    );

    // The same in bursts (`parse_each`), leaving fields in place or not.
    let order = shuffled(kinds.len(), 400);
    for mut p in [g.parser(frame).in_place(), g.parser(frame)] {
        let mut rows = p.batch(5);
        for burst in order.chunks(5) {
            let msgs: Vec<&[u8]> = burst.iter().map(|&k| kinds[k].as_slice()).collect();
            assert_eq!(p.parse_each(&msgs, &mut rows), msgs.len());
            for (m, &k) in rows.messages_in(&msgs).zip(burst) {
                let got: Vec<_> = refs
                    .iter()
                    .map(|r| (m.uint_of(r), m.bytes_of(r).map(<[u8]>::to_vec)))
                    .collect();
                assert_eq!(got, alone[k], "kind {k} in a burst");
            }
        }
    }
}

/// A burst stops at the first message the generated code does not
/// finish; the parser then takes that one and says what is wrong.
#[test]
fn a_burst_stops_at_a_frame_it_cannot_finish() {
    let (g, frame) = packet_frame();
    let kinds = frames();
    let short = &kinds[0][..20];
    let msgs: [&[u8]; 4] = [&kinds[0], &kinds[1], short, &kinds[2]];
    for mut p in [g.parser(frame).in_place(), g.parser(frame)] {
        let mut rows = p.batch(4);
        assert_eq!(p.parse_each(&msgs, &mut rows), 2);
        assert_eq!(rows.len(), 2);
        assert_eq!(p.parse(short).unwrap(), Progress::NeedMore);
        // A batch made for another parser is not filled.
        let mut other = g.parser(g.unit_id("ipv4").unwrap()).batch(4);
        p.reset();
        assert_eq!(p.parse_each(&msgs, &mut other), 0);
    }
}
