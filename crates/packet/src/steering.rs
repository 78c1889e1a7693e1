//! Steering several packet programs that share a port (Enif-Lang section
//! 6): their largest common flow key, and clusters where there is none.
//!
//! Each program declares its flow key by what its `steer` returns: one of
//! the packet library's key functions (`flow_key5`, `sym_flow_key2`, ...).
//! A key is a set of header fields, directional or symmetric. The common
//! key of several programs is the coarsest key that keeps every flow of
//! every one of them on one worker: the intersection of their fields, and
//! where any of them is symmetric, only the fields whose pair (source and
//! destination) is whole, hashed without regard to direction. When the
//! intersection is empty, programs are put in clusters, each with a
//! non-empty common key, and every frame is copied to each cluster's
//! worker choice.
//!
//! This module only plans and hashes; it reads no port and runs no rule.

use flick_exec::code::{Module, Op};
use std::fmt;

/// One header field of a flow key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyField {
    SrcAddr = 1,
    DstAddr = 2,
    Proto = 4,
    SrcPort = 8,
    DstPort = 16,
}

const ALL_FIELDS: [KeyField; 5] = [
    KeyField::SrcAddr,
    KeyField::DstAddr,
    KeyField::Proto,
    KeyField::SrcPort,
    KeyField::DstPort,
];
const ADDRS: u8 = KeyField::SrcAddr as u8 | KeyField::DstAddr as u8;
const PORTS: u8 = KeyField::SrcPort as u8 | KeyField::DstPort as u8;

impl KeyField {
    fn name(self) -> &'static str {
        match self {
            KeyField::SrcAddr => "src_addr",
            KeyField::DstAddr => "dst_addr",
            KeyField::Proto => "proto",
            KeyField::SrcPort => "src_port",
            KeyField::DstPort => "dst_port",
        }
    }
}

/// A flow key: the fields it reads, and whether both directions of a
/// flow give the same key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    fields: u8,
    symmetric: bool,
}

impl FlowKey {
    /// The key that puts every frame in one flow.
    pub const EMPTY: FlowKey = FlowKey {
        fields: 0,
        symmetric: false,
    };

    /// A key of `fields`; a symmetric key keeps only whole pairs.
    pub fn new(fields: &[KeyField], symmetric: bool) -> FlowKey {
        let bits = fields.iter().fold(0u8, |b, f| b | *f as u8);
        FlowKey::from_bits(bits, symmetric)
    }

    fn from_bits(bits: u8, symmetric: bool) -> FlowKey {
        let mut fields = bits & 0x1f;
        if symmetric {
            // A lone source or destination is not the same both ways.
            if fields & ADDRS != ADDRS {
                fields &= !ADDRS;
            }
            if fields & PORTS != PORTS {
                fields &= !PORTS;
            }
        }
        FlowKey {
            fields,
            symmetric: symmetric && fields != 0,
        }
    }

    /// The key of the packet library's key function `name`, if it is one.
    pub fn of_library_function(name: &str) -> Option<FlowKey> {
        use KeyField::*;
        Some(match name {
            "flow_key5" => FlowKey::new(&[SrcAddr, DstAddr, Proto, SrcPort, DstPort], false),
            "flow_key3" => FlowKey::new(&[SrcAddr, DstAddr, Proto], false),
            "flow_key2" => FlowKey::new(&[SrcAddr, DstAddr], false),
            "src_key" => FlowKey::new(&[SrcAddr], false),
            "sym_flow_key5" => FlowKey::new(&[SrcAddr, DstAddr, Proto, SrcPort, DstPort], true),
            "sym_flow_key3" => FlowKey::new(&[SrcAddr, DstAddr, Proto], true),
            "sym_flow_key2" => FlowKey::new(&[SrcAddr, DstAddr], true),
            _ => return None,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.fields == 0
    }

    pub fn is_symmetric(&self) -> bool {
        self.symmetric
    }

    pub fn fields(&self) -> impl Iterator<Item = KeyField> + '_ {
        ALL_FIELDS
            .into_iter()
            .filter(|f| self.fields & *f as u8 != 0)
    }

    /// The largest key coarser than both: every flow of either lies
    /// within one of its flows.
    pub fn common(&self, other: &FlowKey) -> FlowKey {
        FlowKey::from_bits(
            self.fields & other.fields,
            self.symmetric || other.symmetric,
        )
    }

    /// Whether every flow of `finer` lies within one flow of this key.
    pub fn is_coarser_than(&self, finer: &FlowKey) -> bool {
        self.fields & finer.fields == self.fields && (self.symmetric || !finer.symmetric)
    }

    /// The hash of `frame` by this key (the key's fields mixed in a word
    /// at a time, then scrambled so that the low bits that pick a worker
    /// depend on all of them; a symmetric key orders the two endpoints
    /// first). Frames of one flow of this key hash alike. Allocates
    /// nothing.
    pub fn hash(&self, frame: &FrameFields) -> u64 {
        let mut h = WordMix::new();
        // A symmetric key puts the lesser endpoint first, compared by the
        // key's own fields only, so fields outside it never decide.
        let swap = self.symmetric && {
            let endpoint = |addr: [u8; 16], port: u16| {
                (
                    if self.fields & ADDRS != 0 {
                        addr
                    } else {
                        [0; 16]
                    },
                    if self.fields & PORTS != 0 { port } else { 0 },
                )
            };
            endpoint(frame.src_addr, frame.src_port) > endpoint(frame.dst_addr, frame.dst_port)
        };
        let (src_addr, dst_addr, src_port, dst_port) = if swap {
            (
                &frame.dst_addr,
                &frame.src_addr,
                frame.dst_port,
                frame.src_port,
            )
        } else {
            (
                &frame.src_addr,
                &frame.dst_addr,
                frame.src_port,
                frame.dst_port,
            )
        };
        let addr = |a: &[u8; 16]| {
            let (hi, lo) = a.split_at(8);
            let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or_default());
            (word(hi), word(lo))
        };
        // The fields in `ALL_FIELDS`' order, each tested once: this runs
        // for every frame the dispatcher reads.
        let has = |f: KeyField| self.fields & f as u8 != 0;
        if has(KeyField::SrcAddr) {
            h.write_pair(addr(src_addr));
        }
        if has(KeyField::DstAddr) {
            h.write_pair(addr(dst_addr));
        }
        if has(KeyField::Proto) {
            h.write(u64::from(frame.proto));
        }
        if has(KeyField::SrcPort) {
            h.write(u64::from(src_port));
        }
        if has(KeyField::DstPort) {
            h.write(u64::from(dst_port));
        }
        h.finish()
    }
}

impl fmt::Display for FlowKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("<>");
        }
        f.write_str("<")?;
        for (i, k) in self.fields().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(k.name())?;
        }
        f.write_str(">")?;
        if self.symmetric {
            f.write_str(" symmetric")?;
        }
        Ok(())
    }
}

/// The steering hash's state: each field's words multiplied in (a field
/// in a place of its own, so that a key's fields cannot trade values),
/// then murmur3's finaliser, so that the low bits that pick a worker
/// depend on every bit of every field.
struct WordMix(u64);

impl WordMix {
    const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

    fn new() -> WordMix {
        WordMix(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, w: u64) {
        self.0 = (self.0 ^ w).wrapping_mul(Self::MUL).rotate_left(27);
    }

    fn write_pair(&mut self, (a, b): (u64, u64)) {
        self.write(a);
        self.write(b);
    }

    fn finish(self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// The header fields a flow key can read, taken from a frame. IPv4
/// addresses are stored mapped into IPv6 (`::ffff:a.b.c.d`); fields a
/// frame lacks (ports of ICMP, everything of ARP) are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameFields {
    pub src_addr: [u8; 16],
    pub dst_addr: [u8; 16],
    pub proto: u8,
    pub src_port: u16,
    pub dst_port: u16,
}

impl FrameFields {
    /// The fields of an Ethernet frame (one VLAN tag skipped). A frame
    /// that is not IP, or is cut short, gives all zeros: one flow.
    pub fn of_ethernet(frame: &[u8]) -> FrameFields {
        let mut out = FrameFields::default();
        let mut at = 12;
        let Some(mut ethertype) = be16(frame, at) else {
            return out;
        };
        if ethertype == 0x8100 {
            at += 4;
            ethertype = be16(frame, at).unwrap_or(0);
        }
        let ip = at + 2;
        let l4 = match ethertype {
            0x0800 => {
                let Some(&vihl) = frame.get(ip) else {
                    return out;
                };
                let ihl = usize::from(vihl & 0x0f) * 4;
                let (Some(src), Some(dst), Some(&proto)) = (
                    frame.get(ip + 12..ip + 16),
                    frame.get(ip + 16..ip + 20),
                    frame.get(ip + 9),
                ) else {
                    return out;
                };
                out.src_addr = mapped(src);
                out.dst_addr = mapped(dst);
                out.proto = proto;
                // Only a first fragment carries ports.
                let frag_offset = be16(frame, ip + 6).unwrap_or(0) & 0x1fff;
                (frag_offset == 0).then_some(ip + ihl)
            }
            0x86dd => {
                let (Some(src), Some(dst), Some(&proto)) = (
                    frame.get(ip + 8..ip + 24),
                    frame.get(ip + 24..ip + 40),
                    frame.get(ip + 6),
                ) else {
                    return out;
                };
                out.src_addr.copy_from_slice(src);
                out.dst_addr.copy_from_slice(dst);
                out.proto = proto;
                Some(ip + 40)
            }
            _ => None,
        };
        if let Some(l4) = l4 {
            if matches!(out.proto, 6 | 17 | 132) {
                out.src_port = be16(frame, l4).unwrap_or(0);
                out.dst_port = be16(frame, l4 + 2).unwrap_or(0);
            }
        }
        out
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn mapped(v4: &[u8]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[10] = 0xff;
    a[11] = 0xff;
    a[12..].copy_from_slice(v4);
    a
}

/// What a program says about its flows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeclaredKey {
    /// `steer` returns this library key.
    Key(FlowKey),
    /// No `steer`: the program's state is one whole, so one worker sees
    /// all its frames.
    Whole,
    /// `steer` returns something else: its flows cannot be compared with
    /// another program's, so it gets a cluster of its own, steered by
    /// its own `steer`.
    Opaque,
}

impl DeclaredKey {
    /// The library key a compiled program's `steer` returns as it is, if
    /// that is all `steer` does (`fun steer: (p: packet) -> (string)` with
    /// the body `flow_key5(p)`): frames with the same value of that key
    /// are then exactly those with the same key fields, so they may be
    /// steered by a hash of those fields ([`FlowKey::hash`]) rather than
    /// by running `steer`. `None` for any other `steer`, or none.
    pub fn returned_by_steer(module: &Module) -> Option<FlowKey> {
        let steer = module
            .functions
            .iter()
            .find(|f| f.name == "steer" && f.params == 1)?;
        match &steer.code[..] {
            [Op::Call { dst, func, args }, Op::Return { src }] if src == dst && args[..] == [0] => {
                FlowKey::of_library_function(&module.functions.get(*func as usize)?.name)
            }
            _ => None,
        }
    }

    /// The key a compiled program declares: the library key function its
    /// `steer` calls, if it calls exactly one and nothing else.
    pub fn of_module(module: &Module) -> DeclaredKey {
        let Some(steer) = module
            .functions
            .iter()
            .find(|f| f.name == "steer" && f.params == 1)
        else {
            return DeclaredKey::Whole;
        };
        let mut keys = steer.code.iter().filter_map(|op| match op {
            Op::Call { func, .. } => Some(
                module
                    .functions
                    .get(*func as usize)
                    .and_then(|g| FlowKey::of_library_function(&g.name)),
            ),
            _ => None,
        });
        match (keys.next(), keys.next()) {
            (Some(Some(k)), None) => DeclaredKey::Key(k),
            _ => DeclaredKey::Opaque,
        }
    }
}

impl fmt::Display for DeclaredKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeclaredKey::Key(k) => k.fmt(f),
            DeclaredKey::Whole => f.write_str("none (no steer)"),
            DeclaredKey::Opaque => f.write_str("its own steer"),
        }
    }
}

/// Programs steered together: each frame goes to one worker for all of
/// them, chosen by `key` (or, for an opaque program alone, by its own
/// `steer`; for a `Whole` program, worker 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    /// Indexes of the programs, in the order given.
    pub programs: Vec<usize>,
    pub key: DeclaredKey,
}

/// How frames of a shared port reach the programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SteeringPlan {
    pub clusters: Vec<Cluster>,
}

impl SteeringPlan {
    /// Programs in order: each joins the cluster where the common key
    /// stays largest and non-empty, or starts one. With one cluster its
    /// key is the programs' largest common flow key.
    pub fn new(keys: &[DeclaredKey]) -> SteeringPlan {
        let mut clusters: Vec<Cluster> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let k = match key {
                DeclaredKey::Key(k) if !k.is_empty() => k,
                // An empty key is one flow: the whole state on one worker.
                DeclaredKey::Key(_) | DeclaredKey::Whole | DeclaredKey::Opaque => {
                    clusters.push(Cluster {
                        programs: vec![i],
                        key: match key {
                            DeclaredKey::Key(_) => DeclaredKey::Whole,
                            other => other.clone(),
                        },
                    });
                    continue;
                }
            };
            let best = clusters
                .iter()
                .enumerate()
                .filter_map(|(c, cl)| match &cl.key {
                    DeclaredKey::Key(ck) => Some((c, ck.common(k))),
                    _ => None,
                })
                .filter(|(_, common)| !common.is_empty())
                .max_by_key(|(c, common)| (common.fields.count_ones(), usize::MAX - c));
            match best {
                Some((c, common)) => {
                    clusters[c].programs.push(i);
                    clusters[c].key = DeclaredKey::Key(common);
                }
                None => clusters.push(Cluster {
                    programs: vec![i],
                    key: key.clone(),
                }),
            }
        }
        SteeringPlan { clusters }
    }

    /// The one key that steers all programs, if they form one cluster.
    pub fn common_key(&self) -> Option<&DeclaredKey> {
        match self.clusters.as_slice() {
            [one] => Some(&one.key),
            _ => None,
        }
    }

    /// Lines for `flick check` and `flick run` to print: the common key,
    /// or each cluster with its key and programs.
    pub fn describe(&self, names: &[String]) -> String {
        use fmt::Write;
        let mut out = String::new();
        let name = |i: usize| names.get(i).map_or("?", String::as_str);
        if let Some(key) = self.common_key() {
            let _ = writeln!(out, "steering: largest common flow key {key}");
            return out;
        }
        let _ = writeln!(
            out,
            "steering: no common flow key; {} clusters, each frame copied to each",
            self.clusters.len()
        );
        for (c, cl) in self.clusters.iter().enumerate() {
            let programs: Vec<&str> = cl.programs.iter().map(|&i| name(i)).collect();
            let _ = writeln!(
                out,
                "  cluster {}: key {}: {}",
                c + 1,
                cl.key,
                programs.join(", ")
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lib(name: &str) -> FlowKey {
        FlowKey::of_library_function(name).unwrap()
    }

    /// Flows that differ in few bits (consecutive sources, ports) still
    /// spread evenly over any number of workers: the worker is the hash's
    /// low bits, which every field moves.
    #[test]
    fn flows_spread_evenly_over_workers() {
        for (key, per_source) in [("flow_key5", 8u32), ("src_key", 1)] {
            let n = 20_000u32;
            let key = lib(key);
            for workers in [2u64, 3, 4, 8, 16] {
                let mut load = vec![0u32; workers as usize];
                for i in 0..n {
                    let mut f = FrameFields::default();
                    f.src_addr[10..12].copy_from_slice(&[0xff, 0xff]);
                    f.src_addr[12..].copy_from_slice(&(0x0a00_0000 + i / per_source).to_be_bytes());
                    f.dst_addr = f.src_addr;
                    f.dst_addr[15] = 1;
                    f.proto = 6;
                    f.src_port = 1024 + (i % per_source) as u16;
                    f.dst_port = 80;
                    load[(key.hash(&f) % workers) as usize] += 1;
                }
                let mean = n as f64 / workers as f64;
                for &l in &load {
                    assert!(
                        (l as f64 - mean).abs() < mean * 0.15,
                        "{key} over {workers} workers: {load:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_papers_two_applications_share_the_three_tuple() {
        assert_eq!(lib("flow_key5").common(&lib("flow_key3")), lib("flow_key3"));
    }

    #[test]
    fn the_papers_three_applications_form_two_clusters() {
        use KeyField::*;
        let ports = FlowKey::new(&[SrcPort, DstPort], false);
        let keys = [
            DeclaredKey::Key(lib("flow_key5")),
            DeclaredKey::Key(lib("flow_key3")),
            DeclaredKey::Key(ports),
        ];
        let lcfk = lib("flow_key5").common(&lib("flow_key3")).common(&ports);
        assert!(lcfk.is_empty());
        let plan = SteeringPlan::new(&keys);
        assert_eq!(
            plan.clusters,
            vec![
                Cluster {
                    programs: vec![0, 1],
                    key: DeclaredKey::Key(lib("flow_key3"))
                },
                Cluster {
                    programs: vec![2],
                    key: DeclaredKey::Key(ports)
                },
            ]
        );
    }

    #[test]
    fn symmetric_keys_keep_whole_pairs_only() {
        assert_eq!(
            lib("flow_key5").common(&lib("sym_flow_key2")),
            lib("sym_flow_key2")
        );
        assert!(lib("src_key").common(&lib("sym_flow_key2")).is_empty());
        assert_eq!(
            lib("sym_flow_key5").common(&lib("flow_key3")),
            lib("sym_flow_key3")
        );
    }

    #[test]
    fn the_flow_tracker_and_port_knocking_share_the_source_address() {
        let plan = SteeringPlan::new(&[
            DeclaredKey::Key(lib("flow_key5")),
            DeclaredKey::Key(lib("src_key")),
        ]);
        assert_eq!(plan.common_key(), Some(&DeclaredKey::Key(lib("src_key"))));
        assert_eq!(
            plan.describe(&["a".into(), "b".into()]),
            "steering: largest common flow key <src_addr>\n"
        );
    }

    #[test]
    fn programs_without_a_library_key_are_clustered_alone() {
        let plan = SteeringPlan::new(&[
            DeclaredKey::Whole,
            DeclaredKey::Key(lib("flow_key5")),
            DeclaredKey::Opaque,
            DeclaredKey::Key(lib("flow_key2")),
        ]);
        let programs: Vec<Vec<usize>> = plan.clusters.iter().map(|c| c.programs.clone()).collect();
        assert_eq!(programs, vec![vec![0], vec![1, 3], vec![2]]);
        let text = plan.describe(&["w".into(), "f".into(), "o".into(), "g".into()]);
        assert!(text.contains("3 clusters"), "{text}");
        assert!(
            text.contains("cluster 2: key <src_addr, dst_addr>: f, g"),
            "{text}"
        );
    }

    fn ipv4_tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[12] = 0x08;
        f[14] = 0x45;
        f[14 + 9] = 6;
        f[26..30].copy_from_slice(&src);
        f[30..34].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn frame_fields_come_from_ipv4_headers() {
        let f = FrameFields::of_ethernet(&ipv4_tcp([10, 0, 0, 1], [10, 0, 0, 2], 1234, 80));
        assert_eq!(&f.src_addr[12..], &[10, 0, 0, 1]);
        assert_eq!(&f.dst_addr[12..], &[10, 0, 0, 2]);
        assert_eq!((f.proto, f.src_port, f.dst_port), (6, 1234, 80));
        assert_eq!(FrameFields::of_ethernet(&[0u8; 5]), FrameFields::default());
    }

    #[test]
    fn a_symmetric_key_hashes_both_directions_alike() {
        let k = lib("sym_flow_key5");
        let a = FrameFields::of_ethernet(&ipv4_tcp([10, 0, 0, 1], [10, 0, 0, 2], 1234, 80));
        let b = FrameFields::of_ethernet(&ipv4_tcp([10, 0, 0, 2], [10, 0, 0, 1], 80, 1234));
        assert_eq!(k.hash(&a), k.hash(&b));
        assert_ne!(lib("flow_key5").hash(&a), lib("flow_key5").hash(&b));
    }
}
