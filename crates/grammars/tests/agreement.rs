//! Generated parsers agree with the interpreter: on every input of the
//! `wire_*` fuzz corpora, on mutations of them, whole and split, with and
//! without views, a parser that runs generated code first gives the same
//! progress, values and errors as one that only interprets. And the
//! generated code does the work: most messages of the corpora that parse
//! at all are finished by it, not handed back. Parsing a run of messages
//! in batches gives the same messages as parsing them one by one. A
//! parser that leaves fields in place gives the same values when they are
//! read.

mod common;

use flick_wire::{Batch, FieldKind, FieldRef, Grammar, Message, Parser, Progress, Slot};
use std::path::PathBuf;
use std::sync::Arc;

fn corpus(name: &str) -> Vec<Vec<u8>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(format!("wire_{name}"))) else {
            continue;
        };
        for e in entries {
            let path = e.expect("a directory entry").path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).expect("corpus files read"))
        .collect()
}

/// [`common::drive`] logging, of every message done, every slot set (not
/// only those below the highest this message set: a value left from an
/// earlier message shows), and at a head the slots used.
fn drive(p: &mut Parser, data: &[u8], cut: usize) -> Vec<String> {
    common::drive(
        p,
        data,
        cut,
        |p, n| format!("done {n} {} {:?}", p.used_slots().len(), set(p.slots())),
        |p, n| format!("head {n} {:?}", p.used_slots()),
    )
}

/// The slots set, with their indices.
fn set(slots: &[Slot]) -> Vec<(usize, &Slot)> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, s)| **s != Slot::Unset)
        .collect()
}

/// The messages `drive` logs before anything else (and up to one of no
/// bytes, after which it stops), less the highest slot set, which a
/// batch does not report.
fn leading_messages(log: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for line in log {
        let mut words = line.splitn(4, ' ');
        let (Some("done"), Some(n), Some(_high), Some(set)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            break;
        };
        out.push(format!("done {n} {set}"));
        if n == "0" {
            break;
        }
    }
    out
}

/// The messages at the start of `data`, parsed whole, a batch at a time,
/// one by one where a batch stops; logged as `leading_messages` gives
/// them.
fn drive_batched(p: &mut Parser, batch: &mut Batch, data: &[u8]) -> Vec<String> {
    let mut log = Vec::new();
    let mut at = 0;
    p.reset();
    while at < data.len() && log.len() <= data.len() {
        let n = p.parse_batch(&data[at..], batch);
        for i in 0..batch.len() {
            let len = batch.span(i).len();
            log.push(format!("done {len} {:?}", set(batch.slots(i))));
            if len == 0 {
                return log;
            }
        }
        at += n;
        if n > 0 {
            continue;
        }
        match p.parse(&data[at..]) {
            Ok(Progress::Done(n)) => {
                log.push(format!("done {n} {:?}", set(p.slots())));
                p.reset();
                at += n;
                if n == 0 {
                    break;
                }
            }
            _ => break,
        }
    }
    log
}

/// Inputs derived from `data`: itself and a few mutations (bytes
/// replaced, duplicated, cut).
fn variants(data: &[u8], seed: &mut u64) -> Vec<Vec<u8>> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let mut out = vec![data.to_vec()];
    if data.is_empty() {
        return out;
    }
    for _ in 0..3 {
        let mut v = data.to_vec();
        let i = next() as usize % v.len();
        v[i] = next() as u8;
        out.push(v);
    }
    let mut twice = data.to_vec();
    twice.extend_from_slice(data);
    out.push(twice);
    out.push(data[..next() as usize % data.len()].to_vec());
    out
}

struct Tally {
    messages: u64,
    compiled: u64,
}

/// Compares the two parsers on every corpus input of grammar `name`.
fn agree(name: &str) -> Tally {
    flick_grammars::install();
    let g = Grammar::stock(name).expect("a stock grammar");
    let units = g.units().len();
    let inputs = corpus(name);
    assert!(!inputs.is_empty(), "no corpus for {name}");
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut tally = Tally {
        messages: 0,
        compiled: 0,
    };
    for input in &inputs {
        let (Some(&u), Some(&c)) = (input.first(), input.get(1)) else {
            continue;
        };
        let unit = u as usize % units;
        for data in variants(&input[2..], &mut seed) {
            let cut = data.len() * c as usize / 255;
            for cut in [data.len(), cut] {
                let mut fast = g.parser(unit);
                assert!(
                    fast.is_compiled(),
                    "{name}: unit {unit} has no generated parser"
                );
                let mut slow = g.parser(unit).interpreted();
                let want = drive(&mut slow, &data, cut);
                let got = drive(&mut fast, &data, cut);
                assert_eq!(got, want, "{name}, unit {unit}, cut {cut}, input {data:?}");
                tally.messages += want.iter().filter(|l| l.starts_with("done")).count() as u64;
                tally.compiled += fast.compiled_messages();
            }
            views(&g, unit, &data);
        }
    }
    // One parser per unit for every input in turn, as a connection's
    // parser sees message after message: what one message set must not
    // show through in the next.
    // Batches of three rows, so that rows are reused within an input.
    let mut fast: Vec<Parser> = (0..units).map(|u| g.parser(u)).collect();
    let mut slow: Vec<Parser> = (0..units).map(|u| g.parser(u).interpreted()).collect();
    let mut batched: Vec<Parser> = (0..units).map(|u| g.parser(u)).collect();
    let mut batches: Vec<Batch> = batched.iter().map(|p| p.batch(3)).collect();
    let mut in_place: Vec<Parser> = (0..units).map(|u| g.parser(u).in_place()).collect();
    let mut read: Vec<Parser> = (0..units).map(|u| g.parser(u).interpreted()).collect();
    let refs = compiled_refs(&g);
    let mut rows: Vec<Batch> = in_place.iter().map(|p| p.batch(1)).collect();
    for input in &inputs {
        let Some(&u) = input.first() else { continue };
        let unit = u as usize % units;
        for data in variants(input.get(2..).unwrap_or(&[]), &mut seed) {
            let (f, s) = (&mut fast[unit], &mut slow[unit]);
            f.reset();
            s.reset();
            let (got, want) = (drive(f, &data, data.len()), drive(s, &data, data.len()));
            assert_eq!(
                got, want,
                "{name}, unit {unit}, shared parsers, input {data:?}"
            );
            assert_eq!(
                drive_batched(&mut batched[unit], &mut batches[unit], &data),
                leading_messages(&want),
                "{name}, unit {unit}, batches, input {data:?}"
            );
            let refs = &refs[unit];
            let want = drive_read(&mut read[unit], refs, &data);
            assert_eq!(
                drive_read(&mut in_place[unit], refs, &data),
                want,
                "{name}, unit {unit}, fields in place, input {data:?}"
            );
            // The first message alone in a burst, if the code finishes it.
            let p = &mut in_place[unit];
            p.reset();
            let msgs = [data.as_slice()];
            if p.parse_each(&msgs, &mut rows[unit]) == 1 {
                let m = rows[unit].messages_in(&msgs).next().expect("a row");
                assert_eq!(
                    Some(&format!("{m:?} {:?}", read_refs(&m, refs))),
                    want.first(),
                    "{name}, unit {unit}, a burst, input {data:?}"
                );
            }
        }
    }
    tally
}

/// Every unit's fields as the constants generated for them, checked to be
/// what the grammar resolves at run time, path for path.
fn compiled_refs(g: &Grammar) -> Vec<Vec<(String, FieldRef)>> {
    let (_, tables) = flick_grammars::FIELDS
        .iter()
        .find(|(name, _)| *name == g.name)
        .expect("constants for every stock grammar");
    assert_eq!(tables.len(), g.units().len());
    let mut all = Vec::new();
    for (unit, (unit_name, consts)) in tables.iter().enumerate() {
        assert_eq!(*unit_name, g.units()[unit].name);
        let mut consts: Vec<(String, FieldRef)> =
            consts.iter().map(|(p, r)| (p.to_string(), *r)).collect();
        let mut want = field_refs(g, unit);
        consts.sort_by(|a, b| a.0.cmp(&b.0));
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(consts, want, "{}: constants of unit {unit_name}", g.name);
        all.push(consts);
    }
    all
}

/// Every integer and bytes field of `unit`, by path, resolved once.
fn field_refs(g: &Grammar, unit: usize) -> Vec<(String, FieldRef)> {
    view_names(g, unit)
        .into_iter()
        .filter_map(|n| g.field_ref(unit, &n).map(|r| (n, r)))
        .collect()
}

/// The messages of `data` one after another, each read as a program
/// reads it: every field by name, and every field by its resolved
/// reference. Ends at the first message not done.
fn drive_read(p: &mut Parser, refs: &[(String, FieldRef)], data: &[u8]) -> Vec<String> {
    let mut log = Vec::new();
    let mut at = 0;
    while at < data.len() {
        p.reset();
        let buf = &data[at..];
        let n = match p.finish(buf) {
            Ok(Progress::Done(n)) if n > 0 => n,
            other => {
                log.push(format!("{other:?}"));
                break;
            }
        };
        let m = p.message(&buf[..n]);
        log.push(format!("{m:?} {:?}", read_refs(&m, refs)));
        at += n;
    }
    log
}

/// Each field's value through its reference: an unsigned integer, bytes,
/// or neither. Where the parser stored an unsigned integer, reading the
/// field where it lies gives the same.
fn read_refs(m: &Message<'_>, refs: &[(String, FieldRef)]) -> Vec<String> {
    refs.iter()
        .inspect(|(name, r)| {
            if let Some(v) = m.uint_at(r.slot()) {
                assert_eq!(m.uint_of(r), Some(v), "{name} read in place");
            }
        })
        .map(|(name, r)| match (m.uint_of(r), m.bytes_of(r)) {
            (Some(v), _) => format!("{name}={v}"),
            (None, Some(b)) => format!("{name}={b:?}"),
            (None, None) => format!("{name}=-"),
        })
        .collect()
}

/// The names a view may give of `unit`'s fields: each field, and each
/// field of a nested unit by its path.
fn view_names(g: &Grammar, unit: usize) -> Vec<String> {
    let mut names = Vec::new();
    for f in &g.unit(unit).fields {
        names.push(f.name.clone());
        if let FieldKind::Unit(inner) = f.kind {
            names.extend(
                view_names(g, inner)
                    .into_iter()
                    .map(|n| format!("{}.{n}", f.name)),
            );
        }
    }
    names
}

/// Under a view of each field, both parsers agree too.
fn views(g: &Arc<Grammar>, unit: usize, data: &[u8]) {
    for name in view_names(g, unit) {
        let keep = g.view(unit, &[name.as_str()]).expect("a field");
        let mut fast = Parser::with_view(g.clone(), unit, keep.clone());
        let mut slow = Parser::with_view(g.clone(), unit, keep).interpreted();
        let want = drive(&mut slow, data, data.len());
        assert_eq!(
            drive(&mut fast, data, data.len()),
            want,
            "{}, unit {unit}, view of {name}",
            g.name,
        );
        let mut batch = fast.batch(2);
        assert_eq!(
            drive_batched(&mut fast, &mut batch, data),
            leading_messages(&want),
            "{}, unit {unit}, batches under a view of {name}",
            g.name,
        );
    }
}

fn check(name: &str) {
    let t = agree(name);
    eprintln!(
        "{name}: {} of {} messages finished by generated code",
        t.compiled, t.messages
    );
    // Messages handed back are split ones, streamed ones and errors; the
    // corpora hold mostly whole messages.
    assert!(
        t.compiled * 2 > t.messages,
        "{name}: generated code finished only {} of {} messages",
        t.compiled,
        t.messages
    );
}

#[test]
fn memcached_binary() {
    check("memcached_binary");
}

#[test]
fn memcached_ascii() {
    check("memcached_ascii");
}

#[test]
fn http() {
    check("http");
}

#[test]
fn hadoop_ifile() {
    check("hadoop_ifile");
}

#[test]
fn packet() {
    check("packet");
}

/// Frames of every kind the flat `packet` unit knows, each with the bytes
/// its headers take (the message ends there; a payload after it is left).
fn packet_frames() -> Vec<(&'static str, Vec<u8>, usize)> {
    fn eth(t: u16) -> Vec<u8> {
        let mut f: Vec<u8> = (1..=12).collect();
        f.extend_from_slice(&t.to_be_bytes());
        f
    }
    fn ip4(proto: u8, flags_frag: u16, options: &[u8]) -> Vec<u8> {
        let ihl = 5 + options.len() as u8 / 4;
        let mut h = vec![0x40 | ihl, 0xb8, 0, 60, 0, 1];
        h.extend_from_slice(&flags_frag.to_be_bytes());
        h.extend_from_slice(&[64, proto, 0, 0, 10, 0, 0, 1, 192, 168, 1, 2]);
        h.extend_from_slice(options);
        h
    }
    fn ip6(next: u8) -> Vec<u8> {
        let mut h = vec![0x60, 0x01, 0x23, 0x45, 0, 8, next, 33];
        h.extend((0..32).map(|i| i as u8));
        h
    }
    let tcp = [
        0x04, 0xd2, 0, 22, 0, 0, 0, 1, 0, 0, 0, 2, 0x50, 0x12, 0, 100, 0, 0, 0, 0,
    ];
    let tcp_options = [
        0x04, 0xd2, 0, 22, 0, 0, 0, 1, 0, 0, 0, 2, 0x60, 0x02, 0, 100, 0, 0, 0, 0, 2, 4, 5, 0xb4,
    ];
    let udp = [0x14, 0xe9, 0, 53, 0, 8, 0, 0];
    let icmp = [8, 0, 0, 0, 0, 1, 0, 7];
    let arp_body = [
        0, 1, 8, 0, 6, 4, 0, 1, 1, 2, 3, 4, 5, 6, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2,
    ];
    let cat = |parts: &[&[u8]]| parts.concat();
    let payload: &[u8] = b"payload";
    vec![
        (
            "tcp4",
            cat(&[&eth(0x0800), &ip4(6, 0, &[]), &tcp, payload]),
            54,
        ),
        (
            "tcp4 with options",
            cat(&[&eth(0x0800), &ip4(6, 0x4000, &[1, 1, 1, 0]), &tcp_options]),
            62,
        ),
        ("udp4", cat(&[&eth(0x0800), &ip4(17, 0, &[]), &udp]), 42),
        ("icmp4", cat(&[&eth(0x0800), &ip4(1, 0, &[]), &icmp]), 42),
        // A later fragment has no L4 header: the message ends at IPv4's.
        (
            "fragment",
            cat(&[&eth(0x0800), &ip4(6, 0x0010, &[]), &tcp]),
            34,
        ),
        (
            "other ip protocol",
            cat(&[&eth(0x0800), &ip4(47, 0, &[]), payload]),
            34,
        ),
        (
            "vlan udp4",
            cat(&[
                &eth(0x8100),
                &[0x20, 0x05, 0x08, 0x00],
                &ip4(17, 0, &[]),
                &udp,
            ]),
            46,
        ),
        ("tcp6", cat(&[&eth(0x86dd), &ip6(6), &tcp]), 74),
        ("udp6", cat(&[&eth(0x86dd), &ip6(17), &udp, payload]), 62),
        ("icmp6", cat(&[&eth(0x86dd), &ip6(58), &icmp]), 54),
        ("arp", cat(&[&eth(0x0806), &arp_body]), 42),
        ("other ethertype", cat(&[&eth(0x88cc), payload]), 14),
    ]
}

/// The flat `packet` unit: both parsers agree on frames of every kind,
/// whole, cut anywhere (a truncated frame) and under views of each field;
/// the generated code finishes the whole ones.
#[test]
fn packet_frames_of_every_kind() {
    flick_grammars::install();
    let g = Grammar::stock("packet").expect("a stock grammar");
    let unit = g.unit_id("packet").expect("the flat unit");
    for (kind, frame, header_len) in packet_frames() {
        for cut in 0..=frame.len() {
            let data = &frame[..cut];
            let mut fast = g.parser(unit);
            assert!(fast.is_compiled(), "the packet unit has generated code");
            let mut slow = g.parser(unit).interpreted();
            let want = drive(&mut slow, data, data.len());
            assert_eq!(
                drive(&mut fast, data, data.len()),
                want,
                "{kind}, cut at {cut}"
            );
            if cut >= header_len {
                let done = format!("done {header_len} ");
                assert!(want[0].starts_with(&done), "{kind}, cut at {cut}: {want:?}");
                assert!(fast.compiled_messages() > 0, "{kind}: generated code ran");
            } else {
                assert!(
                    !want[0].starts_with("done"),
                    "{kind}, cut at {cut}: {want:?}"
                );
            }
        }
        views(&g, unit, &frame);
    }
}

/// A field of a header the frame lacks is unset; a field the protocols
/// share (`src_port` of TCP and UDP, `ttl` of IPv4 and IPv6) is one slot.
#[test]
fn packet_fields_of_absent_headers_are_unset() {
    flick_grammars::install();
    let g = Grammar::stock("packet").expect("a stock grammar");
    let unit = g.unit_id("packet").expect("the flat unit");
    let slot = |name: &str| {
        g.unit(unit)
            .fields
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("field {name}"))
            .slot
    };
    for (kind, frame, _) in packet_frames() {
        let mut p = g.parser(unit);
        assert!(matches!(p.parse(&frame), Ok(Progress::Done(_))), "{kind}");
        let port = &p.slots()[slot("src_port") as usize];
        let ttl = &p.slots()[slot("ttl") as usize];
        let has_port = [
            "tcp4",
            "tcp4 with options",
            "udp4",
            "vlan udp4",
            "tcp6",
            "udp6",
        ];
        assert_eq!(
            *port != Slot::Unset,
            has_port.contains(&kind),
            "{kind}: {port:?}"
        );
        let has_ip = !matches!(kind, "arp" | "other ethertype");
        assert_eq!(*ttl != Slot::Unset, has_ip, "{kind}: {ttl:?}");
        let spa = &p.slots()[slot("arp_spa") as usize];
        assert_eq!(*spa != Slot::Unset, kind == "arp", "{kind}");
    }
}

/// A grammar that is not the one compiled gets no generated parser, even
/// under a stock grammar's name.
#[test]
fn a_changed_grammar_is_interpreted() {
    flick_grammars::install();
    let src = flick_wire::stock::source("memcached_binary")
        .expect("stock source")
        .replace("$$ <= 250", "$$ <= 200");
    let g = Arc::new(Grammar::from_source("memcached_binary", &src).expect("loads"));
    let unit = g.unit_id("cmd").expect("cmd");
    assert!(!g.parser(unit).is_compiled());
    let stock = Grammar::stock("memcached_binary").expect("stock");
    assert!(stock.parser(unit).is_compiled());
}
