//! The packet header grammar against captured-style frames: Ethernet +
//! IPv4 + TCP SYN with options, an 802.1Q-tagged ARP request, IPv6 + UDP,
//! an ICMP echo request, and IPv4 with a Router Alert option. The
//! fixtures carry correct checksums, which the tests verify from the
//! parsed fields.

mod support;

use flick_wire::{Builder, Grammar, Progress, Value};
use proptest::prelude::*;
use std::sync::Arc;
use support::check_every_split;

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect()
}

const SYN_ETHERNET: &str = "00 1a a0 3b 7c 21 f0 de f1 2c 9e 6b 08 00";
const SYN_IPV4: &str = "45 00 00 3c 8f 3c 40 00 40 06 b3 e5 c0 a8 01 17 5d b8 d8 22";
/// Linux's SYN options: MSS 1460, SACK permitted, timestamps, NOP,
/// window scale 7.
const SYN_TCP: &str = "c8 e8 00 50 3a 1c 5e 77 00 00 00 00 a0 02 fa f0 4a 85 00 00 \
                       02 04 05 b4 04 02 08 0a 00 32 a8 f1 00 00 00 00 01 03 03 07";
const VLAN_ETHERNET: &str = "ff ff ff ff ff ff 00 1b 21 3a 4f 5e 81 00 a0 7b 08 06";
const ARP_REQUEST: &str = "00 01 08 00 06 04 00 01 00 1b 21 3a 4f 5e 0a 00 00 01 \
                           00 00 00 00 00 00 0a 00 00 02";
const IPV6: &str = "60 01 23 45 00 25 11 40 \
                    20 01 0d b8 00 00 00 00 00 00 00 00 00 00 00 01 \
                    20 01 0d b8 00 00 00 00 00 00 00 00 00 00 00 02";
const UDP: &str = "d4 31 00 35 00 25 54 8d";
/// A DNS query for example.com, the UDP payload.
const DNS_QUERY: &str =
    "ab cd 01 00 00 01 00 00 00 00 00 00 07 65 78 61 6d 70 6c 65 03 63 6f 6d 00 00 01 00 01";
const ICMP_ECHO: &str = "08 00 4d 31 00 01 00 2a";
/// Windows ping's payload.
const ICMP_DATA: &[u8] = b"abcdefghijklmnopqrstuvwabcdefghi";
/// An IGMP report's IPv4 header, with the Router Alert option.
const IPV4_ROUTER_ALERT: &str =
    "46 c0 00 20 00 00 40 00 01 02 42 42 c0 a8 01 17 e0 00 00 16 94 04 00 00";

fn grammar() -> Arc<Grammar> {
    Grammar::stock("packet").unwrap()
}

/// The Internet checksum's ones' complement sum, folded to 16 bits.
fn ones_sum(parts: &[&[u8]]) -> u16 {
    let mut s: u32 = 0;
    for p in parts {
        for w in p.chunks(2) {
            s += u32::from(w[0]) << 8 | u32::from(*w.get(1).unwrap_or(&0));
        }
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

fn parse_one(g: &Arc<Grammar>, unit: &str, bytes: &[u8]) -> flick_wire::Parser {
    let mut p = g.parser(g.unit_id(unit).unwrap());
    match p.parse(bytes) {
        Ok(Progress::Done(n)) => assert_eq!(n, bytes.len(), "{unit}"),
        other => panic!("{unit}: {other:?}"),
    }
    p
}

fn reserialize(g: &Arc<Grammar>, unit: &str, bytes: &[u8]) -> Vec<u8> {
    let p = parse_one(g, unit, bytes);
    let mut slots = p.slots().to_vec();
    let mut out = Vec::new();
    g.serialize(p.unit(), &mut slots, bytes, &mut out).unwrap();
    out
}

fn int(m: &flick_wire::Message, f: &str) -> i128 {
    m.int(f).unwrap_or_else(|| panic!("no integer {f}"))
}

#[test]
fn ethernet_ipv4_tcp_syn() {
    let g = grammar();
    let eth = hex(SYN_ETHERNET);
    let ip = hex(SYN_IPV4);
    let tcp = hex(SYN_TCP);

    let p = parse_one(&g, "ethernet", &eth);
    let m = p.message(&eth);
    assert_eq!(m.bytes("dst"), Some(&eth[0..6]));
    assert_eq!(m.bytes("src"), Some(&hex("f0 de f1 2c 9e 6b")[..]));
    assert_eq!(int(&m, "ethertype"), 0x0800);
    assert_eq!(int(&m, "payload_type"), 0x0800);
    assert!(matches!(m.get("tci"), Value::Absent));
    assert!(matches!(m.get("inner_ethertype"), Value::Absent));

    let p = parse_one(&g, "ipv4", &ip);
    let m = p.message(&ip);
    assert_eq!(int(&m, "version"), 4);
    assert_eq!(int(&m, "ihl"), 5);
    assert_eq!(int(&m, "dscp"), 0);
    assert_eq!(int(&m, "ecn"), 0);
    assert_eq!(int(&m, "total_length"), 60);
    assert_eq!(int(&m, "id"), 0x8f3c);
    assert_eq!(int(&m, "dont_fragment"), 1);
    assert_eq!(int(&m, "more_fragments"), 0);
    assert_eq!(int(&m, "fragment_offset"), 0);
    assert_eq!(int(&m, "ttl"), 64);
    assert_eq!(int(&m, "protocol"), 6);
    assert_eq!(int(&m, "src"), 0xc0a8_0117); // 192.168.1.23
    assert_eq!(int(&m, "dst"), 0x5db8_d822); // 93.184.216.34
    assert_eq!(m.bytes("options"), Some(&b""[..]));
    // A correct header checksum sums to all ones.
    assert_eq!(int(&m, "checksum"), 0xb3e5);
    assert_eq!(ones_sum(&[&ip]), 0xffff);
    let (src, dst, total) = (int(&m, "src"), int(&m, "dst"), int(&m, "total_length"));

    let p = parse_one(&g, "tcp", &tcp);
    let m = p.message(&tcp);
    assert_eq!(int(&m, "src_port"), 51432);
    assert_eq!(int(&m, "dst_port"), 80);
    assert_eq!(int(&m, "seq"), 0x3a1c_5e77);
    assert_eq!(int(&m, "ack"), 0);
    assert_eq!(int(&m, "data_offset"), 10);
    assert_eq!(int(&m, "flags"), 0x02);
    assert_eq!(int(&m, "flag_syn"), 1);
    for f in [
        "flag_fin", "flag_rst", "flag_psh", "flag_ack", "flag_urg", "flag_ece", "flag_cwr",
    ] {
        assert_eq!(int(&m, f), 0, "{f}");
    }
    assert_eq!(int(&m, "window"), 64240);
    assert_eq!(int(&m, "urgent"), 0);
    assert_eq!(int(&m, "options_len"), 20);
    let opts = m.bytes("options").unwrap();
    assert_eq!(opts[..4], [2, 4, 0x05, 0xb4], "MSS 1460");
    assert_eq!(opts[17..], [3, 3, 7], "window scale 7");
    // The TCP checksum covers the IPv4 pseudo-header.
    let mut pseudo = Vec::new();
    pseudo.extend((src as u32).to_be_bytes());
    pseudo.extend((dst as u32).to_be_bytes());
    pseudo.extend([0, 6]);
    pseudo.extend(((total - 20) as u16).to_be_bytes());
    assert_eq!(int(&m, "checksum"), 0x4a85);
    assert_eq!(ones_sum(&[&pseudo, &tcp]), 0xffff);

    for (unit, bytes) in [("ethernet", &eth), ("ipv4", &ip), ("tcp", &tcp)] {
        assert_eq!(&reserialize(&g, unit, bytes), bytes, "{unit}");
    }
}

#[test]
fn vlan_tagged_arp_request() {
    let g = grammar();
    let eth = hex(VLAN_ETHERNET);
    let arp = hex(ARP_REQUEST);

    let p = parse_one(&g, "ethernet", &eth);
    let m = p.message(&eth);
    assert_eq!(m.bytes("dst"), Some(&[0xff; 6][..]));
    assert_eq!(int(&m, "ethertype"), 0x8100);
    assert_eq!(int(&m, "tci"), 0xa07b);
    assert_eq!(int(&m, "pcp"), 5);
    assert_eq!(int(&m, "dei"), 0);
    assert_eq!(int(&m, "vlan_id"), 123);
    assert_eq!(int(&m, "inner_ethertype"), 0x0806);
    assert_eq!(int(&m, "payload_type"), 0x0806);

    let p = parse_one(&g, "arp", &arp);
    let m = p.message(&arp);
    assert_eq!(int(&m, "htype"), 1);
    assert_eq!(int(&m, "ptype"), 0x0800);
    assert_eq!(int(&m, "hlen"), 6);
    assert_eq!(int(&m, "plen"), 4);
    assert_eq!(int(&m, "oper"), 1);
    assert_eq!(m.bytes("sha"), Some(&hex("00 1b 21 3a 4f 5e")[..]));
    assert_eq!(int(&m, "spa"), 0x0a00_0001);
    assert_eq!(m.bytes("tha"), Some(&[0; 6][..]));
    assert_eq!(int(&m, "tpa"), 0x0a00_0002);

    for (unit, bytes) in [("ethernet", &eth), ("arp", &arp)] {
        assert_eq!(&reserialize(&g, unit, bytes), bytes, "{unit}");
    }

    // Not IPv4 over Ethernet: hardware type 6 (IEEE 802).
    let mut other = arp.clone();
    other[1] = 6;
    let mut p = g.parser(g.unit_id("arp").unwrap());
    assert!(p.parse(&other).is_err());
}

#[test]
fn ipv6_udp() {
    let g = grammar();
    let ip = hex(IPV6);
    let udp = hex(UDP);
    let dns = hex(DNS_QUERY);

    let p = parse_one(&g, "ipv6", &ip);
    let m = p.message(&ip);
    assert_eq!(int(&m, "version"), 6);
    assert_eq!(int(&m, "traffic_class"), 0);
    assert_eq!(int(&m, "flow_label"), 0x12345);
    assert_eq!(int(&m, "payload_length"), 37);
    assert_eq!(int(&m, "next_header"), 17);
    assert_eq!(int(&m, "hop_limit"), 64);
    let src = m.bytes("src").unwrap();
    let dst = m.bytes("dst").unwrap();
    assert_eq!(
        src,
        &hex("20 01 0d b8 00 00 00 00 00 00 00 00 00 00 00 01")[..]
    );
    assert_eq!(dst[15], 2);

    let p = parse_one(&g, "udp", &udp);
    let m = p.message(&udp);
    assert_eq!(int(&m, "src_port"), 54321);
    assert_eq!(int(&m, "dst_port"), 53);
    assert_eq!(int(&m, "length"), 8 + dns.len() as i128);
    // The UDP checksum over the IPv6 pseudo-header.
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(src);
    pseudo.extend_from_slice(dst);
    pseudo.extend((int(&m, "length") as u32).to_be_bytes());
    pseudo.extend([0, 0, 0, 17]);
    assert_eq!(ones_sum(&[&pseudo, &udp, &dns]), 0xffff);

    for (unit, bytes) in [("ipv6", &ip), ("udp", &udp)] {
        assert_eq!(&reserialize(&g, unit, bytes), bytes, "{unit}");
    }

    // An IPv4 header is not an IPv6 one, nor a UDP length under 8 valid.
    let mut p = g.parser(g.unit_id("ipv6").unwrap());
    assert!(p.parse(&hex(SYN_IPV4)).is_err());
    let mut p = g.parser(g.unit_id("udp").unwrap());
    assert!(p.parse(&hex("00 01 00 02 00 07 00 00")).is_err());
}

#[test]
fn icmp_echo_request() {
    let g = grammar();
    let icmp = hex(ICMP_ECHO);
    let p = parse_one(&g, "icmp", &icmp);
    let m = p.message(&icmp);
    assert_eq!(int(&m, "type"), 8);
    assert_eq!(int(&m, "code"), 0);
    assert_eq!(int(&m, "checksum"), 0x4d31);
    assert_eq!(int(&m, "identifier"), 1);
    assert_eq!(int(&m, "sequence"), 42);
    assert!(matches!(m.get("rest_of_header"), Value::Absent));
    assert_eq!(ones_sum(&[&icmp, ICMP_DATA]), 0xffff);
    assert_eq!(reserialize(&g, "icmp", &icmp), icmp);

    // Destination unreachable (port): the rest of the header is bytes.
    let unreachable = hex("03 03 fc fc 00 00 00 00");
    let p = parse_one(&g, "icmp", &unreachable);
    let m = p.message(&unreachable);
    assert_eq!(int(&m, "type"), 3);
    assert_eq!(m.bytes("rest_of_header"), Some(&[0; 4][..]));
    assert!(matches!(m.get("identifier"), Value::Absent));
    assert_eq!(reserialize(&g, "icmp", &unreachable), unreachable);
}

#[test]
fn ipv4_options() {
    let g = grammar();
    let ip = hex(IPV4_ROUTER_ALERT);
    let p = parse_one(&g, "ipv4", &ip);
    let m = p.message(&ip);
    assert_eq!(int(&m, "ihl"), 6);
    assert_eq!(int(&m, "dscp"), 48); // CS6
    assert_eq!(int(&m, "ttl"), 1);
    assert_eq!(int(&m, "protocol"), 2); // IGMP
    assert_eq!(int(&m, "dst"), 0xe000_0016); // 224.0.0.22
    assert_eq!(m.bytes("options"), Some(&hex("94 04 00 00")[..]));
    assert_eq!(ones_sum(&[&ip]), 0xffff);
    assert_eq!(reserialize(&g, "ipv4", &ip), ip);

    let mut p = g.parser(g.unit_id("ipv4").unwrap());
    for (bad, field) in [
        ("44 00 00 14", "ihl"),          // shorter than the fixed header
        ("65 00 00 14", "version"),      // IPv6
        ("46 00 00 14", "total_length"), // 20 < IHL 6 * 4
    ] {
        p.reset();
        let mut b = hex(bad);
        b.resize(60, 0);
        let e = p.parse(&b).unwrap_err();
        assert_eq!(&*e.field, field, "{bad}");
    }
}

#[test]
fn serialising_recomputes_header_lengths() {
    let g = grammar();
    // Options added to a parsed IPv4 header raise its IHL.
    let ip = hex(SYN_IPV4);
    let unit = g.unit_id("ipv4").unwrap();
    let p = parse_one(&g, "ipv4", &ip);
    let mut b = Builder::new(g.clone(), unit);
    b.copy_from(p.slots(), &ip);
    b.set_bytes("options", &[1, 1, 1, 0]);
    let mut out = Vec::new();
    b.serialize(&mut out).unwrap();
    assert_eq!(out[0], 0x46);
    assert_eq!(out.len(), 24);

    // Options dropped from a TCP header lower its data offset, keeping
    // the flags.
    let tcp = hex(SYN_TCP);
    let unit = g.unit_id("tcp").unwrap();
    let p = parse_one(&g, "tcp", &tcp);
    let mut b = Builder::new(g.clone(), unit);
    b.copy_from(p.slots(), &tcp);
    b.set_bytes("options", &[]);
    let mut out = Vec::new();
    b.serialize(&mut out).unwrap();
    assert_eq!(out[12..14], [0x50, 0x02]);
    assert_eq!(out.len(), 20);
}

#[test]
fn views_decode_what_the_header_needs() {
    let g = grammar();
    let unit = g.unit_id("ipv4").unwrap();
    let keep = g.view(unit, &["dst", "options"]).unwrap();
    let mut p = flick_wire::Parser::with_view(g.clone(), unit, keep);
    let ip = hex(IPV4_ROUTER_ALERT);
    assert_eq!(p.parse(&ip).unwrap(), Progress::Done(ip.len()));
    let m = p.message(&ip);
    assert_eq!(m.int("dst"), Some(0xe000_0016));
    assert_eq!(m.bytes("options"), Some(&hex("94 04 00 00")[..]));
    // Not decoded, but at a fixed offset: read in place when asked.
    let id = g.field_slot(unit, "id").unwrap() as usize;
    assert_eq!(p.slots()[id], flick_wire::Slot::Unset);
    assert_eq!(m.int("id"), Some(0));
    assert_eq!(m.int("ttl"), Some(1));
}

/// The headers of frame `hex` strings, concatenated.
fn frame_of(headers: &[&str]) -> Vec<u8> {
    headers.iter().flat_map(|h| hex(h)).collect()
}

/// A whole frame is one message of `frame`: each header a field, at its
/// own slots, and the headers of protocols the frame does not carry
/// absent.
#[test]
fn whole_frames_parse_as_one_message() {
    let g = grammar();
    let header = |m: &flick_wire::Message<'_>, name: &str| match m.get(name) {
        Value::Unit(u) => u.int(match u.unit_name() {
            "ethernet" => "payload_type",
            "ipv4" => "protocol",
            "ipv6" => "next_header",
            _ => "src_port",
        }),
        other => panic!("{name}: {other:?}"),
    };

    let syn = frame_of(&[SYN_ETHERNET, SYN_IPV4, SYN_TCP]);
    let p = parse_one(&g, "frame", &syn);
    let m = p.message(&syn);
    assert_eq!(header(&m, "eth"), Some(0x0800));
    assert_eq!(header(&m, "ip4"), Some(6));
    assert_eq!(header(&m, "tcp4"), Some(51432));
    let Value::Unit(ip) = m.get("ip4") else {
        unreachable!()
    };
    assert_eq!(int(&ip, "src"), 0xc0a8_0117);
    assert_eq!(int(&ip, "dst"), 0x5db8_d822);
    let Value::Unit(tcp) = m.get("tcp4") else {
        unreachable!()
    };
    assert_eq!(int(&tcp, "dst_port"), 80);
    assert_eq!(int(&tcp, "options_len"), 20);
    for absent in ["udp4", "icmp4", "ip6", "tcp6", "udp6"] {
        assert_eq!(header(&m, absent), None, "{absent}");
    }
    // A field is its header unit's slot plus the field's slot there.
    let frame = g.unit_id("frame").unwrap();
    let src = g.field_slot(frame, "ip4").unwrap()
        + g.field_slot(g.unit_id("ipv4").unwrap(), "src").unwrap();
    assert_eq!(m.int_at(src), Some(0xc0a8_0117));
    // A typed read answers only for an unsigned integer: not for bytes,
    // nor for a header the frame does not have.
    assert_eq!(m.uint_at(src), Some(0xc0a8_0117));
    let mac = g.field_slot(frame, "eth").unwrap()
        + g.field_slot(g.unit_id("ethernet").unwrap(), "dst").unwrap();
    assert_eq!((m.uint_at(mac), m.int_at(mac)), (None, None));
    assert!(m.bytes_at(mac).is_some());
    let udp_port = g.field_slot(frame, "udp4").unwrap()
        + g.field_slot(g.unit_id("udp").unwrap(), "src_port").unwrap();
    assert_eq!(m.uint_at(udp_port), None);
    assert_eq!(&reserialize(&g, "frame", &syn), &syn);

    let eth6 = SYN_ETHERNET.replace("08 00", "86 dd");
    let v6 = frame_of(&[&eth6, IPV6, UDP]);
    let p = parse_one(&g, "frame", &v6);
    let m = p.message(&v6);
    assert_eq!(header(&m, "ip6"), Some(17));
    assert_eq!(header(&m, "udp6"), Some(54321));
    for absent in ["ip4", "tcp4", "udp4", "tcp6"] {
        assert_eq!(header(&m, absent), None, "{absent}");
    }

    // ARP is not among the frame's protocols: the message is the Ethernet
    // header, tag included, and the ARP body is payload.
    let arp = frame_of(&[VLAN_ETHERNET]);
    let p = parse_one(&g, "frame", &arp);
    let m = p.message(&arp);
    assert_eq!(header(&m, "eth"), Some(0x0806));
    assert_eq!(header(&m, "ip4"), None);

    // A frame cut inside its IPv4 header needs more; one whose IPv4
    // header is bad is an error naming the field.
    let mut p = g.parser(frame);
    assert_eq!(p.parse(&syn[..20]).unwrap(), Progress::NeedMore);
    let mut bad = syn.clone();
    bad[14] = 0x65;
    let mut p = g.parser(frame);
    let e = p.parse(&bad).unwrap_err();
    assert_eq!((e.offset, &*e.field), (15, "version"));
}

#[test]
fn headers_parse_the_same_at_every_split() {
    let g = grammar();
    let streams: &[(&str, &[&str])] = &[
        ("ethernet", &[SYN_ETHERNET, VLAN_ETHERNET, SYN_ETHERNET]),
        ("arp", &[ARP_REQUEST, ARP_REQUEST]),
        ("ipv4", &[SYN_IPV4, IPV4_ROUTER_ALERT, SYN_IPV4]),
        ("ipv6", &[IPV6, IPV6]),
        (
            "tcp",
            &[
                SYN_TCP,
                "00 50 c8 e8 00 00 00 01 3a 1c 5e 78 50 12 ff ff 00 00 00 00",
                SYN_TCP,
            ],
        ),
        ("udp", &[UDP, UDP, UDP]),
        ("icmp", &[ICMP_ECHO, "03 03 fc fc 00 00 00 00", ICMP_ECHO]),
    ];
    for (unit, msgs) in streams {
        let stream: Vec<u8> = msgs.iter().flat_map(|m| hex(m)).collect();
        check_every_split(&g, unit, &stream, msgs.len());
    }
    // Whole frames' headers, back to back (no payloads between).
    let frames = [
        frame_of(&[SYN_ETHERNET, SYN_IPV4, SYN_TCP]),
        frame_of(&[VLAN_ETHERNET]),
        frame_of(&[SYN_ETHERNET, SYN_IPV4, SYN_TCP]),
    ];
    check_every_split(&g, "frame", &frames.concat(), frames.len());
}

/// Builds a message of `unit` from named values, serialises it, and
/// checks that parsing gives the values back and that serialising the
/// parse reproduces the bytes.
fn build_and_check(unit: &str, ints: &[(&str, i128)], bytes: &[(&str, &[u8])]) -> Vec<u8> {
    let g = grammar();
    let id = g.unit_id(unit).unwrap();
    let mut b = Builder::new(g.clone(), id);
    for (f, v) in ints {
        assert!(b.set_int(f, *v), "{f}");
    }
    for (f, v) in bytes {
        assert!(b.set_bytes(f, v), "{f}");
    }
    let mut out = Vec::new();
    b.serialize(&mut out).unwrap();
    let p = parse_one(&g, unit, &out);
    let m = p.message(&out);
    for (f, v) in ints {
        assert_eq!(m.int(f), Some(*v), "{unit}.{f}");
    }
    for (f, v) in bytes {
        assert_eq!(m.bytes(f), Some(*v), "{unit}.{f}");
    }
    assert_eq!(reserialize(&g, unit, &out), out, "{unit}");
    out
}

fn mac() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 6)
}

/// Options: whole 32-bit words, at most 40 bytes.
fn options() -> impl Strategy<Value = Vec<u8>> {
    (0usize..=10).prop_flat_map(|w| proptest::collection::vec(any::<u8>(), w * 4))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn built_ethernet_parses_back(
        dst in mac(), src in mac(), ethertype in any::<u16>(),
        tci in any::<u16>(), inner in any::<u16>(), tagged in any::<bool>(),
    ) {
        if tagged {
            let out = build_and_check(
                "ethernet",
                &[("ethertype", 0x8100), ("tci", tci as i128), ("inner_ethertype", inner as i128)],
                &[("dst", &dst), ("src", &src)],
            );
            prop_assert_eq!(out.len(), 18);
            prop_assert_eq!(&out[14..16], &tci.to_be_bytes());
        } else {
            let ethertype = if ethertype == 0x8100 { 0x0800 } else { ethertype };
            let out = build_and_check(
                "ethernet",
                &[("ethertype", ethertype as i128)],
                &[("dst", &dst), ("src", &src)],
            );
            prop_assert_eq!(out.len(), 14);
        }
    }

    #[test]
    fn built_arp_parses_back(
        oper in 1u16..=2, sha in mac(), tha in mac(), spa in any::<u32>(), tpa in any::<u32>(),
    ) {
        let out = build_and_check(
            "arp",
            &[("htype", 1), ("ptype", 0x0800), ("hlen", 6), ("plen", 4), ("oper", oper as i128),
              ("spa", spa as i128), ("tpa", tpa as i128)],
            &[("sha", &sha), ("tha", &tha)],
        );
        prop_assert_eq!(out.len(), 28);
    }

    #[test]
    fn built_ipv4_parses_back(
        dscp_ecn in any::<u8>(), extra in 0u16..1400, id in any::<u16>(),
        flags_frag in any::<u16>(), ttl in any::<u8>(), protocol in any::<u8>(),
        checksum in any::<u16>(), src in any::<u32>(), dst in any::<u32>(), opts in options(),
    ) {
        let total = 20 + opts.len() as u16 + extra;
        let out = build_and_check(
            "ipv4",
            &[("dscp_ecn", dscp_ecn as i128), ("total_length", total as i128), ("id", id as i128),
              ("flags_frag", flags_frag as i128), ("ttl", ttl as i128),
              ("protocol", protocol as i128), ("checksum", checksum as i128),
              ("src", src as i128), ("dst", dst as i128)],
            &[("options", &opts)],
        );
        // The IHL is computed from the options.
        prop_assert_eq!(out[0] as usize, 0x45 + opts.len() / 4);
        prop_assert_eq!(out.len(), 20 + opts.len());
    }

    #[test]
    fn built_ipv6_parses_back(
        tc in any::<u8>(), flow in 0u32..(1 << 20), payload_length in any::<u16>(),
        next_header in any::<u8>(), hop_limit in any::<u8>(),
        src in proptest::collection::vec(any::<u8>(), 16),
        dst in proptest::collection::vec(any::<u8>(), 16),
    ) {
        let vtf = 6u32 << 28 | (tc as u32) << 20 | flow;
        let out = build_and_check(
            "ipv6",
            &[("vtf", vtf as i128), ("payload_length", payload_length as i128),
              ("next_header", next_header as i128), ("hop_limit", hop_limit as i128)],
            &[("src", &src), ("dst", &dst)],
        );
        prop_assert_eq!(out.len(), 40);
        let g = grammar();
        let p = parse_one(&g, "ipv6", &out);
        let m = p.message(&out);
        prop_assert_eq!(m.int("traffic_class"), Some(tc as i128));
        prop_assert_eq!(m.int("flow_label"), Some(flow as i128));
    }

    #[test]
    fn built_tcp_parses_back(
        src_port in any::<u16>(), dst_port in any::<u16>(), seq in any::<u32>(),
        ack in any::<u32>(), flags in 0u16..0x1000, window in any::<u16>(),
        checksum in any::<u16>(), urgent in any::<u16>(), opts in options(),
    ) {
        let out = build_and_check(
            "tcp",
            &[("src_port", src_port as i128), ("dst_port", dst_port as i128),
              ("seq", seq as i128), ("ack", ack as i128), ("window", window as i128),
              ("checksum", checksum as i128), ("urgent", urgent as i128)],
            &[("options", &opts)],
        );
        prop_assert_eq!(out.len(), 20 + opts.len());
        prop_assert_eq!(out[12] as usize >> 4, 5 + opts.len() / 4);
        // Flags set beside the options keep their bits.
        let g = grammar();
        let mut b = Builder::new(g.clone(), g.unit_id("tcp").unwrap());
        b.set_int("off_flags", flags as i128);
        b.set_bytes("options", &opts);
        let mut out = Vec::new();
        b.serialize(&mut out).unwrap();
        let p = parse_one(&g, "tcp", &out);
        let m = p.message(&out);
        prop_assert_eq!(m.int("off_flags"), Some(((5 + opts.len() / 4) << 12 | flags as usize) as i128));
        prop_assert_eq!(m.int("flags"), Some((flags % 256) as i128));
    }

    #[test]
    fn built_udp_parses_back(
        src_port in any::<u16>(), dst_port in any::<u16>(), length in 8u16..,
        checksum in any::<u16>(),
    ) {
        build_and_check(
            "udp",
            &[("src_port", src_port as i128), ("dst_port", dst_port as i128),
              ("length", length as i128), ("checksum", checksum as i128)],
            &[],
        );
    }

    #[test]
    fn built_icmp_parses_back(
        ty in any::<u8>(), code in any::<u8>(), checksum in any::<u16>(),
        identifier in any::<u16>(), sequence in any::<u16>(),
        rest in proptest::collection::vec(any::<u8>(), 4),
    ) {
        let common = [("type", ty as i128), ("code", code as i128), ("checksum", checksum as i128)];
        if ty == 0 || ty == 8 {
            let mut ints = common.to_vec();
            ints.extend([("identifier", identifier as i128), ("sequence", sequence as i128)]);
            build_and_check("icmp", &ints, &[]);
        } else {
            build_and_check("icmp", &common, &[("rest_of_header", &rest)]);
        }
    }

    /// Any bytes that parse as a header serialise back to themselves.
    #[test]
    fn parsed_headers_serialise_to_their_bytes(
        unit in prop::sample::select(vec!["ethernet", "arp", "ipv4", "ipv6", "tcp", "udp", "icmp"]),
        mut bytes in proptest::collection::vec(any::<u8>(), 60..80),
        ihl in 5u8..=15, tagged in any::<bool>(), echo in any::<bool>(),
    ) {
        // Make the fields the grammar checks valid.
        match unit {
            "ethernet" if tagged => bytes[12..14].copy_from_slice(&[0x81, 0x00]),
            "arp" => bytes[..6].copy_from_slice(&[0, 1, 8, 0, 6, 4]),
            "ipv4" => {
                bytes[0] = 0x40 | ihl;
                bytes[2] = bytes[2].max(1);
            }
            "ipv6" => bytes[0] = 0x60 | (bytes[0] & 0xf),
            "tcp" => bytes[12] = ihl << 4 | (bytes[12] & 0xf),
            "udp" => bytes[4] = bytes[4].max(1),
            "icmp" if echo => bytes[0] = 8,
            _ => {}
        }
        let g = grammar();
        let mut p = g.parser(g.unit_id(unit).unwrap());
        let Ok(Progress::Done(n)) = p.parse(&bytes) else {
            panic!("{unit} does not parse");
        };
        let mut slots = p.slots().to_vec();
        let mut out = Vec::new();
        g.serialize(p.unit(), &mut slots, &bytes, &mut out).unwrap();
        prop_assert_eq!(&out[..], &bytes[..n]);
    }
}
