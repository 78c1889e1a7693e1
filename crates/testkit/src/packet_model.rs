//! The packet examples' logic written by hand in Rust
//! (`examples/packets/*.flick`): what their golden tests, property tests
//! and benchmarks compare Flick with. Frames are parsed just far enough
//! (Ethernet with one VLAN tag, IPv4 or IPv6, the TCP or UDP ports) and
//! state lives in `hashbrown` maps keyed by fixed-size flow keys, as a
//! careful programmer would write it; [`Key::packed`] spells a key as the
//! Flick program's `pack` does, to compare dumps.

use hashbrown::HashMap;

const TCP: u8 = 6;
const UDP: u8 = 17;

/// What the examples read of a frame.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Headers {
    /// 4 or 6; 0 for a frame that is not IP.
    pub ip: u8,
    /// IPv4 addresses in the first 4 bytes, IPv6 whole.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub protocol: u8,
    /// Ports, where there is a TCP or UDP header (not in a later IPv4
    /// fragment).
    pub ports: Option<(u16, u16)>,
    /// Whether the header with the ports is TCP's.
    pub tcp: bool,
}

pub fn parse(frame: &[u8]) -> Headers {
    let mut h = Headers::default();
    let Some(mut ethertype) = be16(frame, 12) else {
        return h;
    };
    let mut at = 14;
    if ethertype == 0x8100 {
        let Some(inner) = be16(frame, 16) else {
            return h;
        };
        ethertype = inner;
        at = 18;
    }
    let l4 = match ethertype {
        0x0800 => {
            let Some(ip) = frame.get(at..at + 20) else {
                return h;
            };
            h.ip = 4;
            h.protocol = ip[9];
            h.src[..4].copy_from_slice(&ip[12..16]);
            h.dst[..4].copy_from_slice(&ip[16..20]);
            if u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0 {
                return h;
            }
            at + (ip[0] & 0x0f) as usize * 4
        }
        0x86dd => {
            let Some(ip) = frame.get(at..at + 40) else {
                return h;
            };
            h.ip = 6;
            h.protocol = ip[6];
            h.src.copy_from_slice(&ip[8..24]);
            h.dst.copy_from_slice(&ip[24..40]);
            at + 40
        }
        _ => return h,
    };
    if h.protocol == TCP || h.protocol == UDP {
        if let (Some(s), Some(d)) = (be16(frame, l4), be16(frame, l4 + 2)) {
            h.ports = Some((s, d));
            h.tcp = h.protocol == TCP;
        }
    }
    h
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Which of the library's keys a [`Key`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// `flow_key5`: addresses, protocol, ports.
    Five,
    /// `src_key`: the source address.
    Source,
    /// `sym_flow_key2`: the two addresses, lesser first.
    Pair,
}

/// A flow key of fixed size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub kind: KeyKind,
    pub ip: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub protocol: u8,
    pub ports: Option<(u16, u16)>,
}

impl Key {
    pub fn five(h: &Headers) -> Key {
        Key {
            kind: KeyKind::Five,
            ip: h.ip,
            src: h.src,
            dst: h.dst,
            protocol: h.protocol,
            ports: h.ports,
        }
    }

    pub fn source(h: &Headers) -> Key {
        Key {
            kind: KeyKind::Source,
            dst: [0; 16],
            protocol: 0,
            ports: None,
            ..Key::five(h)
        }
    }

    pub fn pair(h: &Headers) -> Key {
        let (src, dst) = if h.src <= h.dst {
            (h.src, h.dst)
        } else {
            (h.dst, h.src)
        };
        Key {
            kind: KeyKind::Pair,
            src,
            dst,
            protocol: 0,
            ports: None,
            ..Key::five(h)
        }
    }

    /// The key as the Flick program's `pack` writes it: per part a tag
    /// (`i` integer, 8 bytes big-endian; `s` string, 4-byte length and the
    /// bytes; `n` none, a field the frame lacks) in the order the
    /// library's functions pack them.
    pub fn packed(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let int = |out: &mut Vec<u8>, v: Option<u64>| match v {
            Some(v) => {
                out.push(b'i');
                out.extend_from_slice(&(v as i64).to_be_bytes());
            }
            None => out.push(b'n'),
        };
        let addr = |out: &mut Vec<u8>, a: &[u8; 16]| match self.ip {
            4 => int(
                out,
                Some(u32::from_be_bytes([a[0], a[1], a[2], a[3]]) as u64),
            ),
            6 => {
                out.push(b's');
                out.extend_from_slice(&16u32.to_be_bytes());
                out.extend_from_slice(a);
            }
            _ => out.push(b'n'),
        };
        addr(&mut out, &self.src);
        if self.kind == KeyKind::Source {
            return out;
        }
        addr(&mut out, &self.dst);
        if self.kind == KeyKind::Pair {
            return out;
        }
        int(&mut out, (self.ip != 0).then_some(self.protocol as u64));
        int(&mut out, self.ports.map(|p| p.0 as u64));
        int(&mut out, self.ports.map(|p| p.1 as u64));
        out
    }
}

/// How a dump spells a dictionary key: printable ASCII as itself, anything
/// else as `0x` and lowercase hex.
pub fn dump_key(bytes: &[u8]) -> String {
    if bytes.iter().all(|b| (0x20..0x7f).contains(b)) {
        String::from_utf8(bytes.to_vec()).unwrap()
    } else {
        let mut s = String::from("0x");
        for b in bytes {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }
}

/// `examples/packets/flow_tracker.flick`: packets and bytes per 5-tuple
/// of every IP frame.
#[derive(Default)]
pub struct FlowTracker {
    pub flows: HashMap<Key, (u64, u64)>,
}

impl FlowTracker {
    pub fn with_capacity(n: usize) -> FlowTracker {
        FlowTracker {
            flows: HashMap::with_capacity(n),
        }
    }

    pub fn frame(&mut self, frame: &[u8]) {
        let h = parse(frame);
        if h.ip == 0 {
            return;
        }
        let e = self.flows.entry(Key::five(&h)).or_insert((0, 0));
        e.0 += 1;
        e.1 += frame.len() as u64;
    }
}

pub const KNOCKS: [u16; 4] = [5123, 6234, 7345, 8456];

/// `examples/packets/port_knocking.flick`.
#[derive(Default)]
pub struct PortKnocking {
    pub knocks: HashMap<Key, u8>,
    pub allowed: HashMap<Key, ()>,
}

impl PortKnocking {
    pub fn with_capacity(n: usize) -> PortKnocking {
        PortKnocking {
            knocks: HashMap::with_capacity(n),
            allowed: HashMap::with_capacity(n),
        }
    }

    /// Whether the frame passes.
    pub fn frame(&mut self, frame: &[u8]) -> bool {
        let h = parse(frame);
        let flow = Key::five(&h);
        if self.allowed.contains_key(&flow) {
            return true;
        }
        let src = Key::source(&h);
        let done = self.knocks.get(&src).copied();
        if done == Some(4) {
            if h.tcp && h.ports.map(|p| p.1) == Some(22) {
                self.allowed.insert(flow, ());
                return true;
            }
            return false;
        }
        if let Some((_, port)) = h.ports {
            let done = done.unwrap_or(0);
            let next = if port == KNOCKS[done as usize] {
                done + 1
            } else if port == KNOCKS[0] {
                1
            } else {
                0
            };
            self.knocks.insert(src, next);
        }
        false
    }
}

/// `examples/packets/dpi_balancer.flick`: the outputs a frame goes to,
/// as a bit set over `outputs` (DNS to all, the rest by the hash of the
/// symmetric address pair).
pub fn dpi_outputs(frame: &[u8], outputs: usize) -> u64 {
    let h = parse(frame);
    if h.ports.is_some_and(|(s, d)| s == 53 || d == 53) {
        return (1u64 << outputs) - 1;
    }
    1 << ((fnv1a(&Key::pair(&h).packed()) >> 1) % outputs as u64)
}

/// The FNV-1a hash Flick's `hash` takes of a string.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The ones' complement checksum of `data` (RFC 1071).
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|w| u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Where an IPv4 frame's IP header starts (after Ethernet and one VLAN tag).
fn ipv4_at(frame: &[u8]) -> Option<usize> {
    match be16(frame, 12)? {
        0x0800 => Some(14),
        0x8100 if be16(frame, 16)? == 0x0800 => Some(18),
        _ => None,
    }
}

/// Recomputes an IPv4 frame's header checksum and its TCP or UDP
/// checksum from scratch (a UDP checksum of zero, "none", stays zero).
pub fn fix_checksums(frame: &mut [u8]) {
    let Some(ip) = ipv4_at(frame) else { return };
    let ihl = (frame[ip] & 0x0f) as usize * 4;
    frame[ip + 10..ip + 12].fill(0);
    let c = checksum(&frame[ip..ip + ihl]);
    frame[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
    let later_fragment = be16(frame, ip + 6).unwrap_or(0) & 0x1fff != 0;
    let l4 = ip + ihl;
    let sum = match frame[ip + 9] {
        6 if !later_fragment && frame.len() >= l4 + 20 => l4 + 16,
        17 if !later_fragment && frame.len() >= l4 + 8 && be16(frame, l4 + 6) != Some(0) => l4 + 6,
        _ => return,
    };
    frame[sum..sum + 2].fill(0);
    let end = ip + be16(frame, ip + 2).unwrap_or(0) as usize;
    let end = end.clamp(l4, frame.len());
    let mut pseudo = frame[ip + 12..ip + 20].to_vec();
    pseudo.extend_from_slice(&[0, frame[ip + 9]]);
    pseudo.extend_from_slice(&((end - l4) as u16).to_be_bytes());
    pseudo.extend_from_slice(&frame[l4..end]);
    let mut c = checksum(&pseudo);
    if c == 0 && frame[ip + 9] == 17 {
        c = 0xffff;
    }
    frame[sum..sum + 2].copy_from_slice(&c.to_be_bytes());
}

/// A 54-byte Ethernet/IPv4/TCP SYN from 10.0.0.`host` (MAC
/// 02:00:00:00:00:`host`) port 40000 to 10.0.1.1 port `dport`, checksums
/// right: the knock a firewall test sends.
pub fn tcp_syn(host: u8, dport: u16) -> Vec<u8> {
    let mut f = vec![0u8; 54];
    f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, host]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&40u16.to_be_bytes());
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&[10, 0, 0, host]);
    f[30..34].copy_from_slice(&[10, 0, 1, 1]);
    f[34..36].copy_from_slice(&40000u16.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    f[46] = 0x50;
    f[47] = 0x02;
    fix_checksums(&mut f);
    f
}

/// `examples/packets/static_nat.flick`: a frame from inside (`outbound`)
/// or from outside, as the program would send it on, or `None` where it
/// drops it. Checksums recomputed from scratch.
pub fn static_nat(frame: &[u8], outbound: bool) -> Option<Vec<u8>> {
    let h = parse(frame);
    let ip = ipv4_at(frame).filter(|_| h.ip == 4);
    let (net, to) = if outbound {
        (0x0a00_0000u32, 0xc000_0200u32)
    } else {
        (0xc000_0200, 0x0a00_0000)
    };
    let ip = ip?;
    let at = ip + if outbound { 12 } else { 16 };
    let addr = u32::from_be_bytes(frame[at..at + 4].try_into().unwrap());
    if addr & 0xffff_ff00 != net || frame[ip + 8] <= 1 {
        return None;
    }
    let mut out = frame.to_vec();
    out[ip + 8] -= 1;
    out[at..at + 4].copy_from_slice(&(addr - net + to).to_be_bytes());
    fix_checksums(&mut out);
    Some(out)
}
