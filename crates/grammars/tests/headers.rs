//! Headers read whole (`Message::header`): the generated constants are
//! what the grammar resolves, and the packet grammar's frames give their
//! 5-tuples through their headers, with a header a frame lacks absent.
//! Every header of every fuzz-corpus message reading as its fields read
//! one by one is the wire fuzz targets' check (h).

use flick_grammars::generated::packet::{fields::frame as field, headers::frame as header};
use flick_wire::{FieldKind, Grammar, Progress};
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
