//! The examples' logic written by hand in Rust: the baseline Flick's
//! packet engine is measured against. Frames are parsed just far enough
//! (Ethernet with one VLAN tag, IPv4 or IPv6, the TCP or UDP ports) and
//! state lives in `hashbrown` maps keyed by fixed-size flow keys, as a
//! careful C or Rust programmer would write it.

use hashbrown::HashMap;

/// What the examples read of a frame.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Headers {
    pub ip: bool,
    /// IPv4 addresses in the low 4 bytes, IPv6 whole.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub protocol: u8,
    /// Ports, where the protocol is TCP or UDP and the frame is not a
    /// later fragment.
    pub ports: Option<(u16, u16)>,
}

const TCP: u8 = 6;
const UDP: u8 = 17;

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
            let ihl = (ip[0] & 0x0f) as usize * 4;
            h.ip = true;
            h.protocol = ip[9];
            h.src[12..].copy_from_slice(&ip[12..16]);
            h.dst[12..].copy_from_slice(&ip[16..20]);
            let offset = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
            if offset != 0 {
                return h;
            }
            at + ihl
        }
        0x86dd => {
            let Some(ip) = frame.get(at..at + 40) else {
                return h;
            };
            h.ip = true;
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
        }
    }
    h
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// Addresses, ports and protocol.
pub type FlowKey5 = ([u8; 16], [u8; 16], u16, u16, u8);

pub fn key5(h: &Headers) -> FlowKey5 {
    let (s, d) = h.ports.unwrap_or((0, 0));
    (h.src, h.dst, s, d, h.protocol)
}

/// Packets and bytes per 5-tuple.
#[derive(Default)]
pub struct FlowTracker {
    pub flows: HashMap<FlowKey5, (u64, u64)>,
}

impl FlowTracker {
    pub fn with_capacity(n: usize) -> FlowTracker {
        FlowTracker {
            flows: HashMap::with_capacity(n),
        }
    }

    pub fn frame(&mut self, frame: &[u8]) {
        let h = parse(frame);
        if !h.ip {
            return;
        }
        let e = self.flows.entry(key5(&h)).or_insert((0, 0));
        e.0 += 1;
        e.1 += frame.len() as u64;
    }
}

pub const KNOCKS: [u16; 4] = [5123, 6234, 7345, 8456];

/// The port-knocking firewall of examples/packets/port_knocking.flick.
#[derive(Default)]
pub struct PortKnocking {
    pub knocks: HashMap<[u8; 16], u8>,
    pub allowed: HashMap<FlowKey5, ()>,
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
        let flow = key5(&h);
        if self.allowed.contains_key(&flow) {
            return true;
        }
        let done = self.knocks.get(&h.src).copied();
        if done == Some(4) {
            if h.protocol == TCP && h.ports.map(|p| p.1) == Some(22) {
                self.allowed.insert(flow, ());
                return true;
            }
            return false;
        }
        if h.ip && (h.protocol == TCP || h.protocol == UDP) {
            let done = done.unwrap_or(0);
            let port = h.ports.map(|p| p.1);
            let next = if port == Some(KNOCKS[done as usize]) {
                done + 1
            } else if port == Some(KNOCKS[0]) {
                1
            } else {
                0
            };
            self.knocks.insert(h.src, next);
        }
        false
    }
}
