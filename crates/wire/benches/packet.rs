//! Packet headers: Ethernet, IPv4 and TCP from the `packet` grammar, one
//! unit per header or the `frame` unit for all three, reading the flow's
//! 5-tuple as a firewall or L4 balancer would, against a hand-written parser that makes the same
//! checks (EtherType, IP version and header length, TCP data offset), and
//! against the packet parsers of two Rust network stacks: smoltcp's `wire`
//! module (checked views, as the hand-written one) and etherparse's
//! `SlicedPacket` (every header of the frame sliced and checked). The
//! `frame` unit is also parsed leaving the headers' fixed fields in place,
//! read where they lie, one frame at a time and in bursts.
//!
//! `cargo bench -p flick-wire --bench packet` (results: `docs/performance.md`)

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use flick_wire::{Batch, FieldRef, Message, Parser, Progress};

const FRAMES: usize = 1000;

/// 1000 Ethernet frames carrying IPv4/TCP segments from varied flows;
/// every fourth segment has 12 bytes of TCP options (NOP, NOP, timestamps).
fn frames() -> Vec<Vec<u8>> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    (0..FRAMES)
        .map(|i| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let options: &[u8] = if i % 4 == 0 {
                &[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]
            } else {
                &[]
            };
            let payload = [0u8; 64];
            let tcp_len = 20 + options.len();
            let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
            f.push(0x45);
            f.push(0);
            f.extend(((20 + tcp_len + payload.len()) as u16).to_be_bytes());
            f.extend((i as u16).to_be_bytes());
            f.extend(0x4000u16.to_be_bytes()); // don't fragment
            f.extend([64, 6, 0, 0]);
            f.extend(((seed >> 32) as u32 | 0x0a00_0000).to_be_bytes());
            f.extend(0x0a00_0001u32.to_be_bytes());
            f.extend(((seed & 0xffff) as u16 | 1024).to_be_bytes());
            f.extend(443u16.to_be_bytes());
            f.extend((seed as u32).to_be_bytes());
            f.extend(0u32.to_be_bytes());
            let off_flags = ((tcp_len / 4) as u16) << 12 | 0x18; // PSH, ACK
            f.extend(off_flags.to_be_bytes());
            f.extend([0xff, 0xff, 0, 0, 0, 0]);
            f.extend(options);
            f.extend(payload);
            f
        })
        .collect()
}

/// A flow's 5-tuple: addresses, protocol, ports.
type Flow = (u32, u32, u8, u16, u16);

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// The hand-written parser: Ethernet without a VLAN tag, IPv4 (version 4,
/// IHL at least 5, total length covering the header), TCP (data offset at
/// least 5).
#[inline(always)]
fn hand(f: &[u8]) -> Option<Flow> {
    if f.len() < 14 || be16(f, 12) != 0x0800 {
        return None;
    }
    let ip = &f[14..];
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    let ihl = (ip[0] & 0x0f) as usize * 4;
    if ihl < 20 || ip.len() < ihl || (be16(ip, 2) as usize) < ihl || ip[9] != 6 {
        return None;
    }
    let tcp = &ip[ihl..];
    if tcp.len() < 20 {
        return None;
    }
    let offset = (tcp[12] >> 4) as usize * 4;
    if offset < 20 || tcp.len() < offset {
        return None;
    }
    Some((
        be32(ip, 12),
        be32(ip, 16),
        ip[9],
        be16(tcp, 0),
        be16(tcp, 2),
    ))
}

/// smoltcp's checked views of each header.
#[inline(always)]
fn smoltcp(f: &[u8]) -> Option<Flow> {
    use smoltcp::wire::{EthernetFrame, EthernetProtocol, IpProtocol, Ipv4Packet, TcpPacket};
    let eth = EthernetFrame::new_checked(f).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
    if ip.version() != 4 || ip.next_header() != IpProtocol::Tcp {
        return None;
    }
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    Some((
        u32::from_be_bytes(ip.src_addr().octets()),
        u32::from_be_bytes(ip.dst_addr().octets()),
        6,
        tcp.src_port(),
        tcp.dst_port(),
    ))
}

/// etherparse's slicing of the whole frame.
#[inline(always)]
fn etherparse(f: &[u8]) -> Option<Flow> {
    use etherparse::{NetSlice, SlicedPacket, TransportSlice};
    let p = SlicedPacket::from_ethernet(f).ok()?;
    let (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Tcp(tcp))) = (p.net, p.transport) else {
        return None;
    };
    let h = ip.header();
    Some((
        u32::from_be_bytes(h.source()),
        u32::from_be_bytes(h.destination()),
        h.protocol().0,
        tcp.source_port(),
        tcp.destination_port(),
    ))
}

/// The slots of the fields a 5-tuple reads, resolved once as a program
/// does.
#[derive(Clone, Copy)]
struct FlowSlots {
    payload_type: u16,
    src: u16,
    dst: u16,
    protocol: u16,
    src_port: u16,
    dst_port: u16,
}

impl FlowSlots {
    /// Each field's slot, from its header's field in `frame`, its unit and
    /// its name.
    fn new(slot: impl Fn(&str, &str, &str) -> u16) -> FlowSlots {
        FlowSlots {
            payload_type: slot("eth", "ethernet", "payload_type"),
            src: slot("ip4", "ipv4", "src"),
            dst: slot("ip4", "ipv4", "dst"),
            protocol: slot("ip4", "ipv4", "protocol"),
            src_port: slot("tcp4", "tcp", "src_port"),
            dst_port: slot("tcp4", "tcp", "dst_port"),
        }
    }
}

/// One parser per header unit, each reset for every frame, and the slots
/// of the fields read in their headers' units.
struct Engine {
    ethernet: Parser,
    ipv4: Parser,
    tcp: Parser,
    at: FlowSlots,
}

#[inline(always)]
fn done(p: &mut Parser, b: &[u8]) -> Option<usize> {
    p.reset();
    match p.parse(b) {
        Ok(Progress::Done(n)) => Some(n),
        _ => None,
    }
}

#[inline(always)]
fn engine(e: &mut Engine, f: &[u8]) -> Option<Flow> {
    let at = done(&mut e.ethernet, f)?;
    if e.ethernet.message(f).uint_at(e.at.payload_type)? != 0x0800 {
        return None;
    }
    let ip = &f[at..];
    let ihl = done(&mut e.ipv4, ip)?;
    let m = e.ipv4.message(ip);
    let (src, dst, protocol) = (
        m.uint_at(e.at.src)?,
        m.uint_at(e.at.dst)?,
        m.uint_at(e.at.protocol)?,
    );
    if protocol != 6 {
        return None;
    }
    let tcp = &ip[ihl..];
    done(&mut e.tcp, tcp)?;
    let t = e.tcp.message(tcp);
    Some((
        src as u32,
        dst as u32,
        protocol as u8,
        t.uint_at(e.at.src_port)? as u16,
        t.uint_at(e.at.dst_port)? as u16,
    ))
}

/// One parser for the whole frame (the `frame` unit): Ethernet, IPv4 and
/// TCP headers in one message, each field at its header's base slot.
struct FrameEngine {
    frame: Parser,
    at: FlowSlots,
}

#[inline(always)]
fn frame_engine(e: &mut FrameEngine, f: &[u8]) -> Option<Flow> {
    done(&mut e.frame, f)?;
    let m = e.frame.message(f);
    if m.uint_at(e.at.payload_type)? != 0x0800 || m.uint_at(e.at.protocol)? != 6 {
        return None;
    }
    // A frame that is not TCP leaves the TCP header's slots unset.
    Some((
        m.uint_at(e.at.src)? as u32,
        m.uint_at(e.at.dst)? as u32,
        6,
        m.uint_at(e.at.src_port)? as u16,
        m.uint_at(e.at.dst_port)? as u16,
    ))
}

/// The fields of a 5-tuple in `frame`, resolved once as a program does:
/// each a slot, or where it lies in its header.
struct FlowRefs {
    payload_type: FieldRef,
    src: FieldRef,
    dst: FieldRef,
    protocol: FieldRef,
    src_port: FieldRef,
    dst_port: FieldRef,
}

/// One parser for the whole frame that leaves the headers' fixed fields
/// in the frame's bytes (`Parser::in_place`), read where they lie.
struct InPlaceEngine {
    frame: Parser,
    at: FlowRefs,
}

#[inline(always)]
fn in_place_engine(e: &mut InPlaceEngine, f: &[u8]) -> Option<Flow> {
    done(&mut e.frame, f)?;
    flow_of(&e.frame.message(f), &e.at)
}

#[inline(always)]
fn flow_of(m: &Message<'_>, at: &FlowRefs) -> Option<Flow> {
    if m.uint_of(&at.payload_type)? != 0x0800 || m.uint_of(&at.protocol)? != 6 {
        return None;
    }
    Some((
        m.uint_of(&at.src)? as u32,
        m.uint_of(&at.dst)? as u32,
        6,
        m.uint_of(&at.src_port)? as u16,
        m.uint_of(&at.dst_port)? as u16,
    ))
}

/// Frames in bursts of this many, as a NIC's receive queue hands them over.
const BURST: usize = 32;

/// The 5-tuple's fields as the constants generated for the stock grammar:
/// read at offsets the compiler sees.
const FLOW_CONSTS: FlowRefs = {
    use flick_grammars::generated::packet::fields::frame;
    FlowRefs {
        payload_type: frame::ETH_PAYLOAD_TYPE,
        src: frame::IP4_SRC,
        dst: frame::IP4_DST,
        protocol: frame::IP4_PROTOCOL,
        src_port: frame::TCP4_SRC_PORT,
        dst_port: frame::TCP4_DST_PORT,
    }
};

/// The 5-tuple read from whole headers (`Message::header`), each checked
/// once, through the constants generated for the stock grammar: reads at
/// constant offsets into a header, as hand-written code makes them. The
/// EtherType and protocol need no test here: the parse took the `tcp4`
/// arm only for TCP over IPv4, and a frame without it has no TCP4 header.
#[inline(always)]
fn flow_of_headers(m: &Message<'_>) -> Option<Flow> {
    use flick_grammars::generated::packet::{fields::frame as field, headers::frame as header};
    let ip = m.header(&header::IP4)?;
    let tcp = m.header(&header::TCP4)?;
    Some((
        ip.uint(&field::IP4_SRC)? as u32,
        ip.uint(&field::IP4_DST)? as u32,
        6,
        tcp.uint(&field::TCP4_SRC_PORT)? as u16,
        tcp.uint(&field::TCP4_DST_PORT)? as u16,
    ))
}

/// As `all`, the frames parsed a burst at a time (`Parser::parse_each`)
/// by the in-place engine, each read by `read`.
#[inline(always)]
fn all_in_bursts(
    frames: &[&[u8]],
    p: &mut Parser,
    read: impl Fn(&Message<'_>) -> Option<Flow>,
    batch: &mut Batch,
) -> u64 {
    let mut sum = 0u64;
    p.reset();
    for burst in frames.chunks(BURST) {
        let n = p.parse_each(burst, batch);
        assert_eq!(n, burst.len(), "a burst of TCP/IPv4 frames");
        for m in batch.messages_in(burst) {
            let flow = read(&m);
            let (s, d, p, sp, dp) = flow.expect("a TCP/IPv4 frame");
            sum = sum.wrapping_add(s as u64 ^ d as u64 ^ p as u64 ^ (sp as u64) << 16 ^ dp as u64);
        }
    }
    sum
}

/// Folds every frame's 5-tuple into one number so none is skipped.
///
/// Every parser above is inlined into this loop. One left out of line
/// hands its 5-tuple back through memory, and reading the fields back at
/// once, in loads wider than the stores that wrote them, stalls: that
/// added about 5 ns a frame to smoltcp's and the engines' times and none
/// to the hand-written parser's, which was inlined.
fn all(frames: &[Vec<u8>], mut parse: impl FnMut(&[u8]) -> Option<Flow>) -> u64 {
    frames.iter().fold(0, |sum, f| {
        let (s, d, p, sp, dp) = parse(f).expect("a TCP/IPv4 frame");
        sum.wrapping_add(s as u64 ^ d as u64 ^ p as u64 ^ (sp as u64) << 16 ^ dp as u64)
    })
}

fn bench(c: &mut Criterion) {
    let g = flick_wire::Grammar::stock("packet").unwrap();
    let id = |name: &str| g.unit_id(name).unwrap();
    let slot = |unit: &str, field: &str| g.field_slot(id(unit), field).unwrap();
    let engine_of = |parser: &dyn Fn(&str) -> Parser| Engine {
        ethernet: parser("ethernet"),
        ipv4: parser("ipv4"),
        tcp: parser("tcp"),
        at: FlowSlots::new(|_, unit, field| slot(unit, field)),
    };
    // As a program that reads only the 5-tuple parses: views of what it reads.
    let viewed = |name: &str| {
        let fields: &[&str] = match name {
            "ethernet" => &["payload_type"],
            "ipv4" => &["src", "dst", "protocol"],
            _ => &["src_port", "dst_port"],
        };
        Parser::with_view(g.clone(), id(name), g.view(id(name), fields).unwrap())
    };
    let mut e = engine_of(&|name| g.parser(id(name)).interpreted());
    flick_grammars::install();
    let mut gen = engine_of(&|name| g.parser(id(name)));
    assert!(gen.ethernet.is_compiled() && gen.ipv4.is_compiled() && gen.tcp.is_compiled());
    let mut view = engine_of(&viewed);
    assert!(view.ethernet.is_compiled() && view.ipv4.is_compiled() && view.tcp.is_compiled());
    let frame = id("frame");
    let at = |header: &str, unit: &str, field: &str| slot("frame", header) + slot(unit, field);
    let mut whole = FrameEngine {
        frame: g.parser(frame),
        at: FlowSlots::new(at),
    };
    assert!(whole.frame.is_compiled());
    // As a program that reads only the 5-tuple parses whole frames.
    let five_tuple = g
        .view(
            frame,
            &[
                "eth.payload_type",
                "ip4.src",
                "ip4.dst",
                "ip4.protocol",
                "tcp4.src_port",
                "tcp4.dst_port",
            ],
        )
        .unwrap();
    let whole_view_keep = five_tuple.clone();
    let mut whole_view = FrameEngine {
        frame: Parser::with_view(g.clone(), frame, five_tuple),
        ..whole
    };
    assert!(whole_view.frame.is_compiled());
    let field = |path: &str| g.field_ref(frame, path).unwrap();
    let refs = || FlowRefs {
        payload_type: field("eth.payload_type"),
        src: field("ip4.src"),
        dst: field("ip4.dst"),
        protocol: field("ip4.protocol"),
        src_port: field("tcp4.src_port"),
        dst_port: field("tcp4.dst_port"),
    };
    let mut in_place = InPlaceEngine {
        frame: g.parser(frame).in_place(),
        at: refs(),
    };
    let mut in_place_view = InPlaceEngine {
        frame: Parser::with_view(g.clone(), frame, whole_view_keep.clone()).in_place(),
        at: refs(),
    };
    let frames = frames();
    for f in &frames {
        assert_eq!(frame_engine(&mut whole, f), hand(f));
        assert_eq!(frame_engine(&mut whole_view, f), hand(f));
        assert_eq!(in_place_engine(&mut in_place, f), hand(f));
        assert_eq!(in_place_engine(&mut in_place_view, f), hand(f));
        assert_eq!(engine(&mut e, f), hand(f));
        assert_eq!(engine(&mut gen, f), hand(f));
        assert_eq!(engine(&mut view, f), hand(f));
        assert_eq!(smoltcp(f), hand(f));
        assert_eq!(etherparse(f), hand(f));
    }

    let mut group = c.benchmark_group("packet/ethernet_ipv4_tcp");
    // One element per frame: criterion's rate is frames per second.
    group.throughput(Throughput::Elements(FRAMES as u64));
    group.bench_function("grammar", |b| {
        b.iter(|| all(black_box(&frames), |f| engine(&mut e, f)))
    });
    group.bench_function("generated", |b| {
        b.iter(|| all(black_box(&frames), |f| engine(&mut gen, f)))
    });
    group.bench_function("generated_view", |b| {
        b.iter(|| all(black_box(&frames), |f| engine(&mut view, f)))
    });
    group.bench_function("generated_frame", |b| {
        b.iter(|| all(black_box(&frames), |f| frame_engine(&mut whole, f)))
    });
    group.bench_function("generated_frame_view", |b| {
        b.iter(|| all(black_box(&frames), |f| frame_engine(&mut whole_view, f)))
    });
    group.bench_function("generated_frame_in_place", |b| {
        b.iter(|| all(black_box(&frames), |f| in_place_engine(&mut in_place, f)))
    });
    group.bench_function("generated_frame_view_in_place", |b| {
        b.iter(|| {
            all(black_box(&frames), |f| {
                in_place_engine(&mut in_place_view, f)
            })
        })
    });
    let burst_frames: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let mut burst_rows = in_place_view.frame.batch(BURST);
    let p = &mut in_place_view.frame;
    let refs = &in_place_view.at;
    let want = all(&frames, hand);
    let by_refs = |m: &Message<'_>| flow_of(m, refs);
    let by_consts = |m: &Message<'_>| flow_of(m, &FLOW_CONSTS);
    assert_eq!(
        all_in_bursts(&burst_frames, p, by_refs, &mut burst_rows),
        want
    );
    assert_eq!(
        all_in_bursts(&burst_frames, p, by_consts, &mut burst_rows),
        want
    );
    assert_eq!(
        all_in_bursts(&burst_frames, p, flow_of_headers, &mut burst_rows),
        want
    );
    group.bench_function("generated_frame_view_bursts", |b| {
        b.iter(|| all_in_bursts(black_box(&burst_frames), p, by_refs, &mut burst_rows))
    });
    group.bench_function("generated_frame_view_bursts_consts", |b| {
        b.iter(|| all_in_bursts(black_box(&burst_frames), p, by_consts, &mut burst_rows))
    });
    group.bench_function("generated_frame_view_bursts_headers", |b| {
        b.iter(|| {
            all_in_bursts(
                black_box(&burst_frames),
                p,
                flow_of_headers,
                &mut burst_rows,
            )
        })
    });
    // The parse's share of the time: the bursts, no field read.
    group.bench_function("generated_frame_view_bursts_parse_only", |b| {
        b.iter(|| {
            p.reset();
            let bursts = black_box(&burst_frames).chunks(BURST);
            bursts
                .map(|burst| p.parse_each(burst, &mut burst_rows))
                .sum::<usize>()
        })
    });
    group.bench_function("hand", |b| b.iter(|| all(black_box(&frames), hand)));
    group.bench_function("smoltcp", |b| b.iter(|| all(black_box(&frames), smoltcp)));
    group.bench_function("etherparse", |b| {
        b.iter(|| all(black_box(&frames), etherparse))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
