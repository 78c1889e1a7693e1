//! Plain Rust models of the FlowBlaze use cases (`examples/flowblaze/`),
//! for their property tests.
//!
//! Each model is the use case as a careful programmer would write it by
//! hand: per-flow state in maps, and a verdict per packet (the ports it
//! leaves on, the header fields rewritten). [`Flows`] keeps the rules the
//! programs run under that decide verdicts: a context expires when idle
//! (or old) for longer than its timeout, noticed at its next packet; a
//! context back at its initial value is forgotten; a table holds a bounded
//! number of contexts, an expired one giving way to a new one, and a new
//! flow that finds no room is handled without a context.

use hashbrown::HashMap;
use std::hash::Hash;

/// What the models read of a frame: untagged Ethernet, IPv4 without
/// options, TCP or UDP. Fields a frame lacks are 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pkt {
    pub src: u32,
    pub dst: u32,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// IPv4 total length.
    pub ip_len: u16,
    /// Frame length.
    pub len: usize,
}

const TCP: u8 = 6;
const UDP: u8 = 17;

fn be(f: &[u8], at: usize, n: usize) -> u64 {
    f.get(at..at + n)
        .map_or(0, |b| b.iter().fold(0, |v, &x| v << 8 | x as u64))
}

impl Pkt {
    pub fn parse(f: &[u8]) -> Pkt {
        let mut p = Pkt {
            len: f.len(),
            ..Pkt::default()
        };
        if be(f, 12, 2) != 0x0800 || f.len() < 34 {
            return p;
        }
        p.ip_len = be(f, 16, 2) as u16;
        p.proto = f[23];
        p.src = be(f, 26, 4) as u32;
        p.dst = be(f, 30, 4) as u32;
        if p.proto == TCP || p.proto == UDP {
            p.sport = be(f, 34, 2) as u16;
            p.dport = be(f, 36, 2) as u16;
        }
        if p.proto == TCP {
            p.seq = be(f, 38, 4) as u32;
            p.ack = be(f, 42, 4) as u32;
            p.flags = be(f, 47, 1) as u8;
        }
        p
    }

    /// Both endpoints, the lower first: a biflow key.
    pub fn biflow(&self) -> [u64; 4] {
        let a = [self.src as u64, self.sport as u64];
        let b = [self.dst as u64, self.dport as u64];
        let (x, y) = if b < a { (b, a) } else { (a, b) };
        [x[0], x[1], y[0], y[1]]
    }
}

/// Where a packet goes: ports as a bit set (bit `n` for port `n`; none:
/// dropped) and the fields written, by XL name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub ports: u64,
    pub writes: Vec<(&'static str, u64)>,
}

impl Verdict {
    pub fn drop() -> Verdict {
        Verdict::default()
    }

    pub fn to(port: u8) -> Verdict {
        Verdict {
            ports: 1 << port,
            writes: Vec::new(),
        }
    }

    pub fn write(mut self, field: &'static str, value: u64) -> Verdict {
        self.writes.push((field, value));
        self
    }
}

/// Why a context expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    Idle,
    Hard,
}

struct Entry<C> {
    ctx: C,
    created: u64,
    last: u64,
}

/// A flow table: contexts by key, with timeouts (microseconds) and a
/// capacity.
pub struct Flows<K, C> {
    map: HashMap<K, Entry<C>>,
    capacity: usize,
    idle: Option<u64>,
    hard: Option<u64>,
    initial: C,
}

/// A new context found no room.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

impl<K: Hash + Eq + Copy, C: Copy + PartialEq> Flows<K, C> {
    pub fn new(initial: C, capacity: usize, idle: Option<u64>, hard: Option<u64>) -> Self {
        Flows {
            map: HashMap::new(),
            capacity,
            idle,
            hard,
            initial,
        }
    }

    fn expiry(&self, e: &Entry<C>, now: u64) -> Option<Expiry> {
        if self.hard.is_some_and(|h| now.saturating_sub(e.created) > h) {
            Some(Expiry::Hard)
        } else if self.idle.is_some_and(|i| now.saturating_sub(e.last) > i) {
            Some(Expiry::Idle)
        } else {
            None
        }
    }

    /// The context a packet at `now` finds, and when it was created. An
    /// expired one is passed through `timeout` (which returns `None` where
    /// the program has no timeout transition: the context starts over).
    pub fn get(&self, key: &K, now: u64, timeout: impl FnOnce(C, Expiry) -> Option<C>) -> (C, u64) {
        match self.map.get(key) {
            None => (self.initial, now),
            Some(e) => match self.expiry(e, now) {
                None => (e.ctx, e.created),
                Some(why) => (timeout(e.ctx, why).unwrap_or(self.initial), now),
            },
        }
    }

    /// Stores the context the packet left: forgotten if initial; a new one
    /// takes a free place or an expired context's, or finds none.
    pub fn put(&mut self, key: K, ctx: C, created: u64, now: u64) -> Result<(), Full> {
        if ctx == self.initial {
            self.map.remove(&key);
            return Ok(());
        }
        if let Some(e) = self.map.get_mut(&key) {
            *e = Entry {
                ctx,
                created,
                last: now,
            };
            return Ok(());
        }
        if self.map.len() >= self.capacity {
            let victim = self
                .map
                .iter()
                .find(|(_, e)| self.expiry(e, now).is_some())
                .map(|(k, _)| *k)
                .ok_or(Full)?;
            self.map.remove(&victim);
        }
        self.map.insert(
            key,
            Entry {
                ctx,
                created,
                last: now,
            },
        );
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Contexts a table of the default size holds (4096 rounded to buckets,
/// and the stash).
pub const DEFAULT_CAPACITY: usize = 4096 + 8;
const SEC: u64 = 1_000_000;

/// `server_load_balancer.xl`: connections from port 1 dealt in turn to
/// server A (port 2) and B (port 3), the Ethernet destination rewritten;
/// replies back to port 1; 16 contexts, 10 s idle.
pub struct ServerLoadBalancer {
    turn: u8,
    conns: Flows<[u64; 4], u8>,
}

pub const MAC_A: u64 = 0x0200_0000_0a01;
pub const MAC_B: u64 = 0x0200_0000_0b01;

impl Default for ServerLoadBalancer {
    fn default() -> Self {
        ServerLoadBalancer {
            turn: 0,
            conns: Flows::new(0, 16, Some(10 * SEC), None),
        }
    }
}

impl ServerLoadBalancer {
    pub fn packet(&mut self, p: &Pkt, port: u8, now: u64) -> Verdict {
        let key = [p.src as u64, p.sport as u64, p.dst as u64, p.dport as u64];
        let (mut server, created) = self.conns.get(&key, now, |_, _| None);
        let to = |s: u8| {
            if s == 2 {
                Verdict::to(2).write("eth.dst", MAC_A)
            } else {
                Verdict::to(3).write("eth.dst", MAC_B)
            }
        };
        let v = match (port, server) {
            (1, 0) => {
                server = if self.turn == 0 { 2 } else { 3 };
                self.turn ^= 1;
                to(server)
            }
            (1, s) => to(s),
            (2 | 3, _) => Verdict::to(1),
            _ => Verdict::drop(),
        };
        match self.conns.put(key, server, created, now) {
            Ok(()) => v,
            Err(Full) if port == 1 => to(2),
            Err(Full) => Verdict::drop(),
        }
    }
}

/// `flowlet_lb.xl`: a flow's packets stay on one path (port 2 or 3) until
/// a gap over 50 ms; the next flowlet takes the next path in turn.
pub struct FlowletLb {
    turn: u8,
    /// Path (0: none yet) and flowlets after the first.
    flows: Flows<[u64; 5], (u8, u64)>,
}

impl Default for FlowletLb {
    fn default() -> Self {
        FlowletLb {
            turn: 0,
            flows: Flows::new((0, 0), DEFAULT_CAPACITY, Some(50_000), None),
        }
    }
}

impl FlowletLb {
    pub fn packet(&mut self, p: &Pkt, _port: u8, now: u64) -> Verdict {
        let key = [
            p.src as u64,
            p.dst as u64,
            p.proto as u64,
            p.sport as u64,
            p.dport as u64,
        ];
        let ((mut path, n), created) = self.flows.get(&key, now, |(_, n), _| Some((0, n + 1)));
        if path == 0 {
            path = 2 + self.turn;
            self.turn ^= 1;
        }
        self.flows.put(key, (path, n), created, now).unwrap();
        Verdict::to(path)
    }
}

/// `traffic_policer.xl`: per source, the generic cell rate algorithm at
/// 10 us per byte with 20 ms of burst; conforming packets to port 2.
pub struct TrafficPolicer {
    /// (tat, earliest, cost).
    sources: Flows<u32, (u64, u64, u64)>,
}

impl Default for TrafficPolicer {
    fn default() -> Self {
        TrafficPolicer {
            sources: Flows::new((0, 0, 0), DEFAULT_CAPACITY, Some(SEC), None),
        }
    }
}

impl TrafficPolicer {
    pub fn packet(&mut self, p: &Pkt, _port: u8, now: u64) -> Verdict {
        let ((mut tat, mut earliest, mut cost), created) =
            self.sources.get(&p.src, now, |_, _| None);
        let v = if now >= earliest {
            cost = p.len as u64 * 10;
            tat = tat.max(now) + cost;
            earliest = tat.saturating_sub(20_000);
            Verdict::to(2)
        } else {
            Verdict::drop()
        };
        self.sources
            .put(p.src, (tat, earliest, cost), created, now)
            .unwrap();
        v
    }
}

/// `syn_flood.xl`: more than five SYNs from an outside source (port 1) in
/// a one-second window block it for five seconds; inside (port 2) goes out.
pub struct SynFlood {
    /// (blocked, syns, until).
    sources: Flows<u32, (bool, u64, u64)>,
}

impl Default for SynFlood {
    fn default() -> Self {
        SynFlood {
            sources: Flows::new((false, 0, 0), DEFAULT_CAPACITY, None, Some(SEC)),
        }
    }
}

impl SynFlood {
    pub fn packet(&mut self, p: &Pkt, port: u8, now: u64) -> Verdict {
        let ((mut blocked, mut syns, mut until), created) =
            self.sources.get(&p.src, now, |(b, s, u), _| {
                Some(if b { (b, s, u) } else { (b, 0, u) })
            });
        let syn = p.flags == 0x02;
        let v = match (port, blocked) {
            (1, false) if syn && syns >= 5 => {
                syns += 1;
                until = now + 5 * SEC;
                blocked = true;
                Verdict::drop()
            }
            (1, false) => {
                if syn {
                    syns += 1;
                }
                Verdict::to(2)
            }
            (1, true) if now > until => {
                (blocked, syns, until) = (false, 0, 0);
                Verdict::to(2)
            }
            (2, _) => Verdict::to(1),
            _ => Verdict::drop(),
        };
        self.sources
            .put(p.src, (blocked, syns, until), created, now)
            .unwrap();
        v
    }
}

/// `tcp_optimistic_ack.xl`: a client (port 1) ACK beyond what its server
/// (port 2) sent marks the connection; its client's segments are dropped
/// from then on.
pub struct TcpOptimisticAck {
    /// (optimistic, end, highest).
    conns: Flows<[u64; 4], (bool, u64, u64)>,
}

impl Default for TcpOptimisticAck {
    fn default() -> Self {
        TcpOptimisticAck {
            conns: Flows::new((false, 0, 0), DEFAULT_CAPACITY, Some(30 * SEC), None),
        }
    }
}

impl TcpOptimisticAck {
    pub fn packet(&mut self, p: &Pkt, port: u8, now: u64) -> Verdict {
        let key = p.biflow();
        let ((mut optimistic, mut end, mut highest), created) =
            self.conns.get(&key, now, |_, _| None);
        let v = match (port, optimistic) {
            (2, false) => {
                end = (p.seq as u64 + p.ip_len as u64).saturating_sub(39);
                highest = highest.max(end);
                Verdict::to(1)
            }
            (1, false) if p.ack as u64 > highest => {
                optimistic = true;
                Verdict::drop()
            }
            (1, false) => Verdict::to(2),
            (2, true) => Verdict::to(1),
            _ => Verdict::drop(),
        };
        self.conns
            .put(key, (optimistic, end, highest), created, now)
            .unwrap();
        v
    }
}

/// `super_spreader.xl`: a source reaching a fifth new destination in its
/// ten-second window is dropped for the rest of the window; a pair is new
/// unless seen in the last ten seconds.
pub struct SuperSpreader {
    pairs: Flows<[u32; 2], bool>,
    /// (spreader, distinct destinations).
    sources: Flows<u32, (bool, u64)>,
}

impl Default for SuperSpreader {
    fn default() -> Self {
        SuperSpreader {
            pairs: Flows::new(false, DEFAULT_CAPACITY, Some(10 * SEC), None),
            sources: Flows::new((false, 0), DEFAULT_CAPACITY, None, Some(10 * SEC)),
        }
    }
}

impl SuperSpreader {
    pub fn packet(&mut self, p: &Pkt, _port: u8, now: u64) -> Verdict {
        let pair = [p.src, p.dst];
        let (seen, created) = self.pairs.get(&pair, now, |_, _| None);
        let fresh = !seen;
        self.pairs.put(pair, true, created, now).unwrap();
        let ((mut spreader, mut dsts), created) = self.sources.get(&p.src, now, |_, _| None);
        let v = if spreader {
            if fresh {
                dsts += 1;
            }
            Verdict::drop()
        } else if fresh && dsts >= 4 {
            dsts += 1;
            spreader = true;
            Verdict::drop()
        } else {
            if fresh {
                dsts += 1;
            }
            Verdict::to(2)
        };
        self.sources
            .put(p.src, (spreader, dsts), created, now)
            .unwrap();
        v
    }
}

/// `dynamic_nat.xl`: inside hosts (port 1) take the first free address of
/// a pool of three, lent while they send within five seconds; packets from
/// outside (port 2) to a lent address go to its holder.
pub struct DynamicNat {
    /// The public address each host holds (0: none).
    hosts: Flows<u32, u64>,
    holder: [u64; 3],
    until: [u64; 3],
    pub refused: u64,
}

pub const NAT_POOL: [u64; 3] = [
    0xcb00_7101, // 203.0.113.1
    0xcb00_7102,
    0xcb00_7103,
];

impl Default for DynamicNat {
    fn default() -> Self {
        DynamicNat {
            hosts: Flows::new(0, DEFAULT_CAPACITY, Some(5 * SEC), None),
            holder: [0; 3],
            until: [0; 3],
            refused: 0,
        }
    }
}

impl DynamicNat {
    pub fn packet(&mut self, p: &Pkt, port: u8, now: u64) -> Verdict {
        let (mut public, created) = self.hosts.get(&p.src, now, |_, _| None);
        let v = match (port, public) {
            (1, 0) => match (0..3).find(|&k| now > self.until[k]) {
                Some(k) => {
                    public = NAT_POOL[k];
                    self.holder[k] = p.src as u64;
                    self.until[k] = now + 5 * SEC;
                    Verdict::to(2).write("ipv4.src", public)
                }
                None => {
                    self.refused += 1;
                    Verdict::drop()
                }
            },
            (1, _) => {
                let k = NAT_POOL.iter().position(|&a| a == public).unwrap();
                self.until[k] = now + 5 * SEC;
                Verdict::to(2).write("ipv4.src", public)
            }
            (2, _) => match (0..3).find(|&k| p.dst as u64 == NAT_POOL[k] && now <= self.until[k]) {
                Some(k) => Verdict::to(1).write("ipv4.dst", self.holder[k]),
                None => Verdict::drop(),
            },
            _ => Verdict::drop(),
        };
        self.hosts.put(p.src, public, created, now).unwrap();
        v
    }
}

/// The handshake states of `tcp_conntrack.xl`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Handshake {
    #[default]
    Closed,
    SynSent,
    SynRcvd,
    Established,
}

/// The teardown states of `tcp_conntrack.xl`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Teardown {
    #[default]
    Open,
    FinIn,
    FinOut,
    LastAck,
    Done,
    Reset,
}

/// One direction's window: the furthest segment start seen and the
/// bounds around it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Window {
    lo: u64,
    min: u64,
    max: u64,
}

const WINDOW: u64 = 65535;

impl Window {
    fn at(lo: u64) -> Window {
        Window {
            lo,
            min: lo.saturating_sub(WINDOW),
            max: lo + WINDOW,
        }
    }

    fn holds(&self, seq: u64) -> bool {
        self.min <= seq && seq <= self.max
    }
}

/// `tcp_conntrack.xl`: connections from inside (port 1) followed through
/// the handshake, windows and teardown; only their segments pass.
pub struct TcpConntrack {
    /// State, inside's window, outside's window.
    handshake: Flows<[u64; 4], (Handshake, Window, Window)>,
    teardown: Flows<[u64; 4], Teardown>,
}

impl Default for TcpConntrack {
    fn default() -> Self {
        TcpConntrack {
            handshake: Flows::new(
                (Handshake::Closed, Window::default(), Window::default()),
                DEFAULT_CAPACITY,
                Some(30 * SEC),
                None,
            ),
            teardown: Flows::new(Teardown::Open, DEFAULT_CAPACITY, Some(30 * SEC), None),
        }
    }
}

const SYN: u8 = 0x02;
const SYNACK: u8 = 0x12;
const ACK: u8 = 0x10;
const FINACK: u8 = 0x11;
const RST: u8 = 0x04;
const RSTACK: u8 = 0x14;

impl TcpConntrack {
    pub fn packet(&mut self, p: &Pkt, port: u8, now: u64) -> Verdict {
        use Handshake::*;
        let key = p.biflow();
        let ((mut state, mut inside, mut outside), created) =
            self.handshake.get(&key, now, |_, _| None);
        let (seq, ack, flags) = (p.seq as u64, p.ack as u64, p.flags);
        let mut onward = false;
        let v = match (state, port) {
            (Closed, 1) if flags == SYN => {
                inside = Window::at(seq + 1);
                state = SynSent;
                Verdict::to(2)
            }
            (SynSent, 1) if flags == SYN => Verdict::to(2),
            (SynSent, 2) if flags == SYNACK && ack == inside.lo => {
                outside = Window::at(seq + 1);
                state = SynRcvd;
                Verdict::to(1)
            }
            (SynSent, 2) if flags == RSTACK && ack == inside.lo => {
                inside = Window::default();
                state = Closed;
                Verdict::to(1)
            }
            (SynRcvd, 1) if flags == ACK && ack == outside.lo => {
                state = Established;
                Verdict::to(2)
            }
            (SynRcvd, 2) if flags == SYNACK => Verdict::to(1),
            (Established, 1) if inside.holds(seq) => {
                inside = Window::at(inside.lo.max(seq));
                onward = true;
                Verdict::drop()
            }
            (Established, 2) if outside.holds(seq) => {
                outside = Window::at(outside.lo.max(seq));
                onward = true;
                Verdict::drop()
            }
            _ => Verdict::drop(),
        };
        self.handshake
            .put(key, (state, inside, outside), created, now)
            .unwrap();
        if onward {
            self.teardown(key, flags, port, now)
        } else {
            v
        }
    }

    fn teardown(&mut self, key: [u64; 4], flags: u8, port: u8, now: u64) -> Verdict {
        use Teardown::*;
        let (mut state, created) = self.teardown.get(&key, now, |_, _| None);
        let other = if port == 1 { 2 } else { 1 };
        let v = match (state, port) {
            (Done | Reset, _) => Verdict::drop(),
            (Open, 1) if flags == FINACK => {
                state = FinIn;
                Verdict::to(2)
            }
            (Open, 2) if flags == FINACK => {
                state = FinOut;
                Verdict::to(1)
            }
            (FinIn, 2) | (FinOut, 1) if flags == FINACK => {
                state = LastAck;
                Verdict::to(other)
            }
            (LastAck, _) if flags == ACK => {
                state = Done;
                Verdict::to(other)
            }
            _ if flags == RST || flags == RSTACK => {
                state = Reset;
                Verdict::to(other)
            }
            _ => Verdict::to(other),
        };
        self.teardown.put(key, state, created, now).unwrap();
        v
    }
}

/// `port_knocking.xl`: a source outside (port 1) reaches SSH inside (port
/// 2) after knocking on 1111, 2222 and 3333; a wrong knock starts over,
/// ten seconds idle close the door; inside goes out.
pub struct PortKnocking {
    /// Knocks so far: 0 closed, 3 open.
    sources: Flows<u32, u8>,
}

impl Default for PortKnocking {
    fn default() -> Self {
        PortKnocking {
            sources: Flows::new(0, DEFAULT_CAPACITY, Some(10 * SEC), None),
        }
    }
}

impl PortKnocking {
    pub fn packet(&mut self, p: &Pkt, port: u8, now: u64) -> Verdict {
        let (mut knocks, created) = self.sources.get(&p.src, now, |_, _| None);
        let v = match (port, knocks) {
            (1, 3) if p.dport == 22 => Verdict::to(2),
            (1, 3) => Verdict::drop(),
            (1, k) => {
                knocks = match (k, p.dport) {
                    (0, 1111) => 1,
                    (1, 2222) => 2,
                    (2, 3333) => 3,
                    _ => 0,
                };
                Verdict::drop()
            }
            (2, _) => Verdict::to(1),
            _ => Verdict::drop(),
        };
        self.sources.put(p.src, knocks, created, now).unwrap();
        v
    }
}

/// `big_flows.xl`: a host pair's packets go to port 1 until it has sent
/// 3000 bytes in its one-second window, then to port 2 to the window's
/// end.
pub struct BigFlows {
    /// (big, bytes, windows).
    pairs: Flows<[u32; 2], (bool, u64, u64)>,
}

impl Default for BigFlows {
    fn default() -> Self {
        BigFlows {
            pairs: Flows::new((false, 0, 0), DEFAULT_CAPACITY, None, Some(SEC)),
        }
    }
}

impl BigFlows {
    pub fn packet(&mut self, p: &Pkt, _port: u8, now: u64) -> Verdict {
        let key = [p.src, p.dst];
        let ((mut big, mut bytes, windows), created) = self
            .pairs
            .get(&key, now, |(_, _, w), _| Some((false, 0, w + 1)));
        let v = if big || bytes >= 3000 {
            big = true;
            Verdict::to(2)
        } else {
            Verdict::to(1)
        };
        bytes += p.len as u64;
        self.pairs
            .put(key, (big, bytes, windows), created, now)
            .unwrap();
        v
    }
}

/// `udp_firewall.xl`: a datagram from inside (port 1) opens its flow's
/// way back from outside (port 2) until 30 s pass without traffic.
pub struct UdpFirewall {
    /// (open, packets), per unordered endpoint pair.
    paths: Flows<[u64; 4], (bool, u64)>,
}

impl Default for UdpFirewall {
    fn default() -> Self {
        UdpFirewall {
            paths: Flows::new((false, 0), 1024 + 8, Some(30 * SEC), None),
        }
    }
}

impl UdpFirewall {
    pub fn packet(&mut self, p: &Pkt, port: u8, now: u64) -> Verdict {
        let key = p.biflow();
        let ((mut open, mut packets), created) = self.paths.get(&key, now, |_, _| None);
        let v = match (open, port) {
            (false, 1) if p.proto == UDP => {
                open = true;
                packets += 1;
                Verdict::to(2)
            }
            (false, _) => Verdict::drop(),
            (true, 1 | 2) => {
                packets += 1;
                Verdict::to(3 - port)
            }
            (true, _) => {
                packets += 1;
                Verdict::drop()
            }
        };
        self.paths.put(key, (open, packets), created, now).unwrap();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_expires_only_past_its_timeout() {
        let mut f: Flows<u32, u8> = Flows::new(0, 4, Some(10), None);
        f.put(1, 5, 0, 0).unwrap();
        assert_eq!(f.get(&1, 10, |_, _| Some(9)), (5, 0));
        assert_eq!(
            f.get(&1, 11, |c, why| Some(c + (why == Expiry::Idle) as u8)),
            (6, 11)
        );
        assert_eq!(f.get(&1, 11, |_, _| None), (0, 11));
        let mut h: Flows<u32, u8> = Flows::new(0, 4, Some(100), Some(10));
        h.put(1, 5, 0, 0).unwrap();
        h.put(1, 5, 0, 8).unwrap();
        assert_eq!(
            h.get(&1, 11, |_, why| Some(why as u8)),
            (Expiry::Hard as u8, 11)
        );
    }

    #[test]
    fn initial_contexts_are_forgotten_and_full_tables_take_expired_places() {
        let mut f: Flows<u32, u8> = Flows::new(0, 2, Some(10), None);
        f.put(1, 1, 0, 0).unwrap();
        f.put(1, 0, 0, 1).unwrap();
        assert!(f.is_empty());
        f.put(1, 1, 0, 0).unwrap();
        f.put(2, 1, 5, 5).unwrap();
        assert_eq!(f.put(3, 1, 6, 6), Err(Full));
        // A context there already is updated, full or not.
        f.put(2, 2, 5, 6).unwrap();
        // At 11 the first has expired and gives way.
        f.put(3, 1, 11, 11).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f.get(&1, 11, |_, _| None), (0, 11));
    }

    #[test]
    fn frames_parse_and_biflow_keys_are_ordered() {
        let mut f = vec![0u8; 54];
        f[12] = 8;
        f[16..18].copy_from_slice(&40u16.to_be_bytes());
        f[23] = TCP;
        f[26..30].copy_from_slice(&[10, 0, 0, 2]);
        f[30..34].copy_from_slice(&[10, 0, 0, 1]);
        f[34..36].copy_from_slice(&80u16.to_be_bytes());
        f[36..38].copy_from_slice(&4000u16.to_be_bytes());
        f[38..42].copy_from_slice(&7u32.to_be_bytes());
        f[47] = 0x12;
        let p = Pkt::parse(&f);
        assert_eq!(
            (p.src, p.sport, p.dport, p.seq, p.flags),
            (0x0a00_0002, 80, 4000, 7, 0x12)
        );
        assert_eq!(p.biflow(), [0x0a00_0001, 4000, 0x0a00_0002, 80]);
        assert_eq!(
            Pkt::parse(&f[..20]),
            Pkt {
                len: 20,
                ..Pkt::default()
            }
        );
    }
}
