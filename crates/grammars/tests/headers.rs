//! Headers read whole (`Message::header`): the generated constants are
//! what the grammar resolves, every header of every stock grammar's
//! fuzz-corpus messages reads as its fields read one by one, and the
//! packet grammar's frames give their 5-tuples through their headers,
//! with a header a frame lacks absent.

use flick_grammars::generated::packet::{fields::frame as field, headers::frame as header};
use flick_wire::{FieldKind, FieldRef, FixedKind, Grammar, HeaderRef, Message, Parser, Progress};
use std::path::PathBuf;
use std::sync::Arc;

/// The unit at `path` inside `unit` ("" for `unit` itself).
fn unit_at(g: &Grammar, unit: usize, path: &str) -> usize {
    path.split('.')
        .filter(|_| !path.is_empty())
        .fold(unit, |u, name| {
            let f = g.unit(u).fields.iter().find(|f| f.name == name).unwrap();
            match f.kind {
                FieldKind::Unit(inner) => inner,
                _ => panic!("{path} is not a unit"),
            }
        })
}

/// The paths of the units inside `unit`, through the units inside them.
fn unit_paths(g: &Grammar, unit: usize, prefix: &str, out: &mut Vec<String>) {
    for f in &g.unit(unit).fields {
        if let FieldKind::Unit(inner) = f.kind {
            let path = format!("{prefix}{}", f.name);
            out.push(path.clone());
            unit_paths(g, inner, &format!("{path}."), out);
        }
    }
}

fn headers_of(grammar: &str) -> flick_grammars::HeaderTables {
    flick_grammars::HEADERS
        .iter()
        .find(|(name, _)| *name == grammar)
        .expect("headers for every stock grammar")
        .1
}

fn fields_of(grammar: &str) -> flick_grammars::FieldTables {
    flick_grammars::FIELDS
        .iter()
        .find(|(name, _)| *name == grammar)
        .expect("fields for every stock grammar")
        .1
}

#[test]
fn header_constants_are_what_the_grammar_resolves() {
    for name in flick_wire::stock::NAMES {
        let g = Grammar::stock(name).unwrap();
        let tables = headers_of(name);
        assert_eq!(tables.len(), g.units().len());
        for (unit, (unit_name, consts)) in tables.iter().enumerate() {
            assert_eq!(*unit_name, g.unit(unit).name);
            let mut paths = vec![String::new()];
            unit_paths(&g, unit, "", &mut paths);
            // Every unit with a fixed run, at every path, has its constant.
            let mut want: Vec<(String, u16, usize)> = paths
                .into_iter()
                .filter_map(|p| {
                    let run = g.unit(unit_at(&g, unit, &p)).fixed_run?;
                    let start = g.header_ref::<0>(unit, &p)?.start();
                    Some((p, start, run.len as usize))
                })
                .collect();
            let mut got: Vec<(String, u16, usize)> = consts
                .iter()
                .map(|(p, s, n)| (p.to_string(), *s, *n))
                .collect();
            want.sort();
            got.sort();
            assert_eq!(got, want, "{name}: headers of unit {unit_name}");
        }
    }
    // A header resolves for any length up to its own, and no further.
    let g = Grammar::stock("packet").unwrap();
    let frame = g.unit_id("frame").unwrap();
    assert_eq!(g.header_ref::<20>(frame, "ip4"), Some(header::IP4));
    assert_eq!(
        g.header_ref::<12>(frame, "ip4").map(|h| h.start()),
        Some(header::IP4.start())
    );
    assert_eq!(g.header_ref::<21>(frame, "ip4"), None);
    assert_eq!(
        g.header_ref::<20>(frame, "ip4.src"),
        None,
        "a field is no header"
    );
    assert_eq!(g.header_ref::<20>(frame, "nothing"), None);
    // `frame` itself begins with a nested unit, not fixed fields.
    assert_eq!(g.header_ref::<1>(frame, ""), None);
}

fn corpus(name: &str) -> Vec<Vec<u8>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let Ok(entries) = std::fs::read_dir(root.join(format!("wire_{name}"))) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// Reads header `h` (at `start`, of `N` bytes) of `m` whole, checks it
/// against the message's bytes and every field of `fields` (with how it
/// lies in place, if it does) against its read one by one; returns how
/// many fields it read through the header.
fn check_header<const N: usize>(
    m: &Message<'_>,
    data: &[u8],
    start: u16,
    fields: &[(&FieldRef, Option<FixedKind>)],
) -> usize {
    let h = HeaderRef::<N>::compiled(start);
    let Some(hdr) = m.header(&h) else {
        assert_eq!(m.uint_at(start), None, "a header whose start is set reads");
        return 0;
    };
    let at = m.uint_at(start).expect("the header's start") as usize;
    assert_eq!(&hdr.as_bytes()[..], &data[at..at + N]);
    let mut read = 0;
    for (r, fixed) in fields {
        let slot = r.slot();
        match fixed {
            Some(FixedKind::Int { .. }) => {
                assert_eq!(hdr.uint(r), m.uint_of(r), "integer at slot {slot}");
                assert!(hdr.uint(r).is_some(), "integer at slot {slot} read");
                assert_eq!(hdr.bytes(r), None);
            }
            Some(FixedKind::Bytes { .. }) => {
                assert_eq!(hdr.bytes(r), m.bytes_of(r), "bytes at slot {slot}");
                assert!(hdr.bytes(r).is_some(), "bytes at slot {slot} read");
                assert_eq!(hdr.uint(r), None);
            }
            None => assert_eq!((hdr.uint(r), hdr.bytes(r)), (None, None)),
        }
        read += usize::from(fixed.is_some());
    }
    read
}

/// Every header of every message of `data` (of `unit`) read whole.
fn read_headers(g: &Grammar, unit: usize, p: &mut Parser, data: &[u8]) -> usize {
    let grammar = g.name.as_str();
    let (_, headers) = headers_of(grammar)[unit];
    let (_, fields) = fields_of(grammar)[unit];
    let (mut at, mut read) = (0, 0);
    while at < data.len() {
        p.reset();
        let buf = &data[at..];
        let n = match p.finish(buf) {
            Ok(Progress::Done(n)) if n > 0 => n,
            _ => break,
        };
        let m = p.message(&buf[..n]);
        for &(path, start, len) in headers {
            let inner = unit_at(g, unit, path);
            // The fields directly in this header's unit.
            let mine: Vec<(&FieldRef, Option<FixedKind>)> = fields
                .iter()
                .filter_map(|(f, r)| {
                    let name = match path {
                        "" => *f,
                        p => f.strip_prefix(p)?.strip_prefix('.')?,
                    };
                    let info = g.unit(inner).fields.iter().find(|i| i.name == name)?;
                    Some((r, info.fixed.map(|x| x.kind)))
                })
                .collect();
            read += match len {
                4 => check_header::<4>(&m, &buf[..n], start, &mine),
                8 => check_header::<8>(&m, &buf[..n], start, &mine),
                14 => check_header::<14>(&m, &buf[..n], start, &mine),
                20 => check_header::<20>(&m, &buf[..n], start, &mine),
                24 => check_header::<24>(&m, &buf[..n], start, &mine),
                28 => check_header::<28>(&m, &buf[..n], start, &mine),
                40 => check_header::<40>(&m, &buf[..n], start, &mine),
                n => panic!("{grammar}: a header of {n} bytes; add its length here"),
            };
        }
        at += n;
    }
    read
}

/// Every corpus message of `name`'s units, parsed storing every field and
/// leaving them in place.
fn headers_agree(name: &str) -> usize {
    flick_grammars::install();
    let g = Grammar::stock(name).unwrap();
    let units = g.units().len();
    let inputs = corpus(name);
    assert!(!inputs.is_empty(), "no corpus for {name}");
    let mut read = 0;
    for input in &inputs {
        let Some(&u) = input.first() else { continue };
        let unit = u as usize % units;
        let data = input.get(2..).unwrap_or(&[]);
        for mut p in [g.parser(unit), g.parser(unit).in_place()] {
            read += read_headers(&g, unit, &mut p, data);
        }
    }
    read
}

#[test]
fn packet_headers_read_as_their_fields() {
    assert!(headers_agree("packet") > 1000);
}

#[test]
fn memcached_binary_headers_read_as_their_fields() {
    assert!(headers_agree("memcached_binary") > 1000);
}

/// Ethernet, with an 802.1Q tag if `vlan`, IPv4 from 10.0.0.1 to
/// 10.0.0.2, and `l4` (TCP or UDP) from port 1234 to 80.
fn frame(vlan: bool, protocol: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
    if vlan {
        f.extend([0x81, 0x00, 0x00, 0x07]);
    }
    f.extend([0x08, 0x00]);
    f.extend([
        0x45,
        0,
        0,
        20 + l4.len() as u8,
        0,
        1,
        0x40,
        0,
        64,
        protocol,
        0,
        0,
    ]);
    f.extend([10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend(l4);
    f
}

const TCP: [u8; 20] = [
    0x04, 0xd2, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0,
];
const UDP: [u8; 8] = [0x04, 0xd2, 0, 80, 0, 8, 0, 0];

#[test]
fn a_frame_gives_its_five_tuple_through_its_headers() {
    flick_grammars::install();
    let g = Grammar::stock("packet").unwrap();
    let unit = g.unit_id("frame").unwrap();
    let parsers = |g: &Arc<Grammar>| [g.parser(unit), g.parser(unit).in_place()];
    for mut p in parsers(&g) {
        for vlan in [false, true] {
            let f = frame(vlan, 6, &TCP);
            p.reset();
            assert_eq!(p.parse(&f).unwrap(), Progress::Done(f.len()));
            let m = p.message(&f);
            let ip = m.header(&header::IP4).expect("an IPv4 header");
            let tcp = m.header(&header::TCP4).expect("a TCP header");
            assert_eq!(ip.uint(&field::IP4_SRC), Some(0x0a00_0001));
            assert_eq!(ip.uint(&field::IP4_DST), Some(0x0a00_0002));
            assert_eq!(ip.uint(&field::IP4_PROTOCOL), Some(6));
            assert_eq!(ip.uint(&field::IP4_IHL), Some(5), "a bit field");
            assert_eq!(tcp.uint(&field::TCP4_SRC_PORT), Some(1234));
            assert_eq!(tcp.uint(&field::TCP4_DST_PORT), Some(80));
            assert_eq!(tcp.uint(&field::TCP4_FLAG_SYN), Some(1));
            // A field of another header is not read through this one.
            assert_eq!(tcp.uint(&field::IP4_SRC), None);
            assert_eq!(m.header(&header::UDP4).map(|_| ()), None);
            assert_eq!(m.header(&header::IP6).map(|_| ()), None);
            let eth = m.header(&header::ETH).expect("an Ethernet header");
            assert_eq!(eth.bytes(&field::ETH_SRC), Some(&f[6..12]));
            assert_eq!(eth.uint(&field::ETH_SRC), None, "bytes, not an integer");
            let ethertype = if vlan { 0x8100 } else { 0x0800 };
            assert_eq!(eth.uint(&field::ETH_ETHERTYPE), Some(ethertype));
            // The next frame, UDP, shows no TCP header of this one.
            let f = frame(vlan, 17, &UDP);
            p.reset();
            assert_eq!(p.parse(&f).unwrap(), Progress::Done(f.len()));
            let m = p.message(&f);
            assert_eq!(m.header(&header::TCP4).map(|_| ()), None);
            let udp = m.header(&header::UDP4).expect("a UDP header");
            assert_eq!(udp.uint(&field::UDP4_SRC_PORT), Some(1234));
            assert_eq!(udp.uint(&field::UDP4_LENGTH), Some(8));
        }
    }
}
