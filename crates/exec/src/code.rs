//! Compiled compute code: functions of register-machine operations.
//!
//! The form is flat and explicit so that an interpreter can stop at any
//! operation and resume there later (a full output channel, an expired
//! timeslice at a loop's back-edge), and so that it can later be turned
//! into native code one operation at a time.

use flick_syntax::ast::{BinOp, StateScope, UnOp};

/// A register of the current frame.
pub type Reg = u16;
pub type FuncId = u16;

#[derive(Clone, Debug, PartialEq)]
pub enum Const {
    Unit,
    Bool(bool),
    Int(i64),
    Str(Box<[u8]>),
    None,
}

/// Which built-in an operation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    Hash,
    Len,
    /// `least_connections(chans)`: the index of the element whose peer
    /// serves the fewest live instances (the host keeps the counts).
    LeastConnections,
    EmptyDict,
    AllReady,
    /// `starts_with(s, prefix)`.
    StartsWith,
    /// `ends_with(s, suffix)`.
    EndsWith,
    /// `contains(s, part)`.
    Contains,
    /// `lower(s)`: ASCII letters in lower case.
    Lower,
    /// `substring(s, start, count)`.
    Substring,
    /// `to_int(s)`: a decimal integer, or `None`.
    ToInt,
    /// `to_string(i)`: an integer in decimal.
    ToString,
    /// `split_once(s, sep)`: the parts before and after the first `sep`.
    SplitOnce,
    /// `header(msg, name)`: the value of the message's first header field
    /// named `name` (ignoring case), of a message of record `record`.
    Header {
        record: u16,
    },
    /// `pack(a, ...)`: the values as one string, each part a tag byte and
    /// its value (see [`crate::vm`]), written into the scratch buffer.
    Pack,
    /// `frame_len(msg)`: the message's length in bytes, from the host.
    FrameLen,
    /// `in_prefix(addr, "A.B.C.D/N")`: whether an IPv4 address lies in
    /// the prefix (`False` for `None` or a prefix that does not parse).
    InPrefix,
    /// `min(a, b)`, `max(a, b)` of integers (`None` if either is).
    Min,
    Max,
    /// `set_ttl(p, v)`, `set_ip_src(p, v)`, ...: an edit of the packet
    /// being handled, made by the host.
    EditHeader(HeaderEdit),
    /// `log(msg)`: a line in the host's log, with where the call is.
    Log,
    /// `meter(m, amount)` of a `meter` state variable, or `meter(m, key,
    /// amount)` of a dictionary of meters: the colour (see [`MeterSpec`]),
    /// from the host, which keeps the buckets. The first argument is a
    /// reference to the state variable.
    Meter,
    /// `bloom_add(b, key)`, `bloom_has(b, key)`, `bloom_clear(b)` of a
    /// `bloom` state variable, made by the host.
    Bloom(BloomOp),
}

/// What a Bloom filter built-in does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BloomOp {
    Add,
    Has,
    Clear,
}

/// Colours `meter` gives: green within the committed burst, yellow
/// within the excess burst (a three-colour meter only), red over both.
pub const GREEN: i64 = 0;
pub const YELLOW: i64 = 1;
pub const RED: i64 = 2;

/// A `meter {rate=R, burst=B}` or `meter {rate=R, burst=B, excess=E}`:
/// RFC 2697's single-rate three-colour marker (srTCM), colour-blind, in
/// packet time. Two token buckets: C, `burst` deep, and E, `excess` deep,
/// both full at first; `rate` tokens a second go to C, and to E only while
/// C is full. Metering `n` tokens is green, taking them from C, when C
/// holds `n`; else yellow, taking them from E, when E holds `n`; else red,
/// taking none. Without `excess` (0) E is always empty: a single-rate
/// two-colour token bucket, green or red. What a token is (a byte, a
/// packet) is what the program passes as `n`.
///
/// The buckets are kept as two integers ([`MeterState`]): when C is full
/// again (the GCRA's theoretical arrival time), and how long E then takes
/// to fill. `n` tokens cost `ceil(n * 1e9 / rate)` ns; C holds `n` when it
/// is full again within `burst`'s worth of ns after taking them, E when
/// its time to fill, with theirs, is within `excess`'s worth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeterSpec {
    /// Tokens a second, at least 1.
    pub rate: u64,
    /// The committed bucket's depth in tokens, at least 1.
    pub burst: u64,
    /// The excess bucket's depth in tokens; 0 for a two-colour meter.
    pub excess: u64,
}

/// A meter's buckets: packet time (ns) at which the committed bucket is
/// full again, and the ns the excess bucket then takes to fill. A fresh
/// meter (both full) is all zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeterState {
    pub full_at: u64,
    pub excess_owed: u64,
}

const NANOS_PER_SEC: u128 = 1_000_000_000;

impl MeterSpec {
    /// Nanoseconds `n` tokens take to refill, rounded up.
    pub fn cost_ns(&self, n: u64) -> u64 {
        let rate = self.rate.max(1) as u128;
        let ns = (n as u128 * NANOS_PER_SEC).div_ceil(rate);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// Metering `n` tokens at packet time `now` (ns): the colour and the
    /// buckets after. A red frame leaves them as they were.
    pub fn meter(&self, s: MeterState, now: u64, n: u64) -> (i64, MeterState) {
        let cost = self.cost_ns(n);
        // Since C was last full, E has been filling.
        let full_at = s.full_at.max(now);
        let excess_owed = s.excess_owed.saturating_sub(now.saturating_sub(s.full_at));
        let after = full_at.saturating_add(cost);
        if after - now <= self.cost_ns(self.burst) {
            return (
                GREEN,
                MeterState {
                    full_at: after,
                    excess_owed,
                },
            );
        }
        let owed = excess_owed.saturating_add(cost);
        if self.excess > 0 && owed <= self.cost_ns(self.excess) {
            return (
                YELLOW,
                MeterState {
                    full_at,
                    excess_owed: owed,
                },
            );
        }
        (RED, s)
    }

    fn tokens_for(&self, owed_ns: u64, depth: u64) -> u64 {
        let missing = (owed_ns as u128 * self.rate as u128).div_ceil(NANOS_PER_SEC);
        depth.saturating_sub(u64::try_from(missing).unwrap_or(u64::MAX))
    }

    /// Tokens in the committed and the excess bucket at packet time
    /// `now`, rounded down.
    pub fn tokens(&self, s: MeterState, now: u64) -> (u64, u64) {
        let excess_owed = s.excess_owed.saturating_sub(now.saturating_sub(s.full_at));
        (
            self.tokens_for(s.full_at.saturating_sub(now), self.burst),
            self.tokens_for(excess_owed, self.excess),
        )
    }
}

/// A `bloom {bits=N, hashes=K}`: `N` bits (rounded up to whole 64-bit
/// words), `K` bit positions per key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BloomSpec {
    pub bits: u64,
    pub hashes: u32,
}

/// A state variable that is a meter, a dictionary of meters or a Bloom
/// filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateObject {
    Meter(MeterSpec),
    /// A dictionary whose values are meters of this spec.
    Meters(MeterSpec),
    Bloom(BloomSpec),
}

/// What a header-editing built-in sets (the host keeps the checksums right).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderEdit {
    /// IPv4 TTL or IPv6 hop limit.
    Ttl,
    /// IPv4's DSCP (the type of service byte's top 6 bits) or IPv6's (the
    /// traffic class's); the ECN bits are kept.
    Dscp,
    IpSrc,
    IpDst,
    SrcPort,
    DstPort,
}

impl Builtin {
    /// The built-in a program calls by `name` (`header` is made with its
    /// record by the lowering, and `broadcast` is lowered to a loop of
    /// sends).
    pub fn by_name(name: &str) -> Option<Builtin> {
        Some(match name {
            "hash" => Builtin::Hash,
            "len" => Builtin::Len,
            "least_connections" => Builtin::LeastConnections,
            "empty_dict" => Builtin::EmptyDict,
            "all_ready" => Builtin::AllReady,
            "starts_with" => Builtin::StartsWith,
            "ends_with" => Builtin::EndsWith,
            "contains" => Builtin::Contains,
            "lower" => Builtin::Lower,
            "substring" => Builtin::Substring,
            "to_int" => Builtin::ToInt,
            "to_string" => Builtin::ToString,
            "split_once" => Builtin::SplitOnce,
            "pack" => Builtin::Pack,
            "frame_len" => Builtin::FrameLen,
            "in_prefix" => Builtin::InPrefix,
            "min" => Builtin::Min,
            "max" => Builtin::Max,
            "set_ttl" => Builtin::EditHeader(HeaderEdit::Ttl),
            "set_ip_src" => Builtin::EditHeader(HeaderEdit::IpSrc),
            "set_ip_dst" => Builtin::EditHeader(HeaderEdit::IpDst),
            "set_src_port" => Builtin::EditHeader(HeaderEdit::SrcPort),
            "set_dst_port" => Builtin::EditHeader(HeaderEdit::DstPort),
            "set_dscp" => Builtin::EditHeader(HeaderEdit::Dscp),
            "log" => Builtin::Log,
            "meter" => Builtin::Meter,
            "bloom_add" => Builtin::Bloom(BloomOp::Add),
            "bloom_has" => Builtin::Bloom(BloomOp::Has),
            "bloom_clear" => Builtin::Bloom(BloomOp::Clear),
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Const {
        dst: Reg,
        value: Const,
    },
    Move {
        dst: Reg,
        src: Reg,
    },
    /// A process channel (or channel array) by its index.
    Chan {
        dst: Reg,
        chan: u16,
    },
    /// A process state variable.
    LoadState {
        dst: Reg,
        state: u16,
    },
    StoreState {
        state: u16,
        src: Reg,
    },
    /// `src.field` of a record value.
    Field {
        dst: Reg,
        src: Reg,
        record: u16,
        field: u16,
    },
    /// `base[index]`: a channel of an array, a dictionary entry, a list
    /// element or a byte.
    Index {
        dst: Reg,
        base: Reg,
        index: Reg,
    },
    /// `dict[key] := value`.
    IndexSet {
        base: Reg,
        index: Reg,
        src: Reg,
    },
    Unary {
        op: UnOp,
        dst: Reg,
        src: Reg,
    },
    Binary {
        op: BinOp,
        dst: Reg,
        a: Reg,
        b: Reg,
    },
    Builtin {
        f: Builtin,
        dst: Reg,
        args: Box<[Reg]>,
    },
    /// A record built from its named fields, in order.
    Record {
        dst: Reg,
        record: u16,
        args: Box<[Reg]>,
    },
    List {
        dst: Reg,
        items: Box<[Reg]>,
    },
    /// Appends to a list built by `map` or `filter`.
    Push {
        list: Reg,
        src: Reg,
    },
    Tuple {
        dst: Reg,
        items: Box<[Reg]>,
    },
    Call {
        dst: Reg,
        func: FuncId,
        args: Box<[Reg]>,
    },
    /// `value => channel`; the interpreter suspends here while the channel
    /// is full and retries when woken.
    Send {
        src: Reg,
        chan: Reg,
    },
    Jump {
        to: u32,
    },
    JumpIfFalse {
        cond: Reg,
        to: u32,
    },
    /// One element of a `foldt` merge over the channel array in `chans`,
    /// ordered by field `field` of record `record`. Without `key`: the
    /// element with the least key, or `None` once every input has ended.
    /// With `key`: another element with that key, or `None` when no input
    /// holds one. The interpreter suspends here while an open input has
    /// nothing yet, since its next element could be the one.
    Merge {
        dst: Reg,
        chans: Reg,
        record: u16,
        field: u16,
        key: Option<Reg>,
    },
    /// Every further element with key `key` of the `foldt` merge over
    /// `chans`, folded natively by the host with the compiled body `fold`
    /// into the running values in `accs` (taken from the first element
    /// `first` while `count`, the steps taken, is 0). It suspends here like
    /// [`Op::Merge`]; where the host cannot fold these records, it goes on
    /// at `fallback`, the interpreted loop.
    MergeFold {
        chans: Reg,
        record: u16,
        field: u16,
        key: Reg,
        first: Reg,
        accs: Box<[Reg]>,
        count: Reg,
        fold: std::sync::Arc<crate::fold::FoldSpec>,
        fallback: u32,
    },
    /// The record in `src` is dead unless it is one of `unless`: its
    /// storage can go back to the host (a `foldt` step's inputs).
    Release {
        src: Reg,
        unless: Box<[Reg]>,
    },
    /// A reference to process state variable `state`, for a `ref`
    /// parameter.
    StateRef {
        dst: Reg,
        state: u16,
    },
    /// The value behind a `ref` parameter: the state it refers to, or the
    /// value itself when the argument was not state.
    Deref {
        dst: Reg,
        src: Reg,
    },
    /// `param := src` for a `ref` parameter: stores to the state it
    /// refers to, or into the parameter's register otherwise.
    StoreRef {
        target: Reg,
        src: Reg,
    },
    /// A loop's back-edge: yield here if the timeslice is used up.
    CheckSlice,
    Return {
        src: Reg,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub params: u16,
    /// Registers a frame of this function needs.
    pub regs: u16,
    pub code: Vec<Op>,
    /// Per operation, the source offset of the expression or statement it
    /// was lowered from: where a run-time fault is reported.
    pub spans: Vec<u32>,
}

impl Function {
    /// The channel this function, a rule, passes its message on to
    /// unchanged, where that is all it does (`| backends => client`): a
    /// host may then pass the message on without running it.
    pub fn passes_on(&self) -> Option<u16> {
        match &self.code[..] {
            [Op::Chan { dst: c, chan }, Op::Send { src: 0, chan: to }, Op::Const {
                dst: u,
                value: Const::Unit,
            }, Op::Return { src: r }]
                if self.params == 1 && c == to && u == r && *c != 0 && *u != 0 =>
            {
                Some(*chan)
            }
            _ => None,
        }
    }
}

/// What a full dictionary does with a new key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Evict {
    /// The new key is refused; the keys held stay.
    #[default]
    Refuse,
    /// The least recently used entry makes room.
    Lru,
    /// An entry idle past the table's `idle` makes room; with none, the
    /// new key is refused.
    Idle,
}

impl Evict {
    /// The policy an `evict=` annotation names.
    pub fn by_name(name: &str) -> Option<Evict> {
        Some(match name {
            "refuse" => Evict::Refuse,
            "lru" => Evict::Lru,
            "idle" => Evict::Idle,
            _ => return None,
        })
    }
}

/// A dictionary's declared `{capacity=N, idle=S, evict=P}`, as packet
/// programs keep their flow tables.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TablePolicy {
    /// Entries per worker shard; `None` takes the host's default.
    pub capacity: Option<u64>,
    /// Seconds (of packet time) an entry lives untouched; `None` forever.
    pub idle_secs: Option<u64>,
    pub evict: Evict,
    /// A meter or Bloom filter the variable is (or, for a dictionary,
    /// its values are).
    pub object: Option<StateObject>,
}

/// One process, compiled: what each rule runs on a message.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessCode {
    pub name: String,
    pub channels: Vec<String>,
    pub state: Vec<(String, StateScope)>,
    /// Per state variable: the table policy its dictionary type declares
    /// (default where it declares none or is no dictionary).
    pub tables: Vec<TablePolicy>,
    /// Run once per instance (locals) or per process (globals) to set state.
    pub init: FuncId,
    /// Per process item: the function it runs (rules take the message read
    /// from their source channel as parameter 0), with its source channel.
    pub items: Vec<ItemCode>,
}

impl ProcessCode {
    /// The function of the rule that reads channel `chan` (not an `on`
    /// handler of it), if one does.
    pub fn rule_for(&self, chan: u16) -> Option<FuncId> {
        self.items
            .iter()
            .find(|it| it.source == Some(chan) && !it.label.starts_with("on "))
            .map(|it| it.func)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ItemCode {
    pub func: FuncId,
    /// The channel whose messages start it (rules and handlers).
    pub source: Option<u16>,
    pub label: String,
}

/// Every function of a program and what each process runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Module {
    pub functions: Vec<Function>,
    pub processes: Vec<ProcessCode>,
    /// Record names by index, with their named fields in order.
    pub records: Vec<(String, Vec<String>)>,
    /// Its functions' flattened forms, made once for every interpreter
    /// that runs the module (see [`FlatCache`]).
    pub flat: FlatCache,
}

/// One function's entry: flattened, or `None` where it is interpreted.
type FlatSlot = std::sync::OnceLock<Option<std::sync::Arc<crate::compiled::Flat>>>;

/// A module's flattened functions ([`crate::compiled`]), each made the
/// first time any interpreter starts it and shared by all of them after:
/// made per interpreter, every connection's instance flattened the
/// program's rules again on its first message (62,000 of the 152,000
/// instructions a new connection cost the HTTP balancer).
/// Filled only once the module is complete (its functions are not
/// changed after it first runs). A clone starts empty; two caches are
/// always equal, as they hold nothing the module does not say.
#[derive(Default)]
pub struct FlatCache {
    funcs: std::sync::OnceLock<Box<[FlatSlot]>>,
}

impl FlatCache {
    /// `func` of `module` flattened, or `None` where it is interpreted.
    pub(crate) fn get(
        &self,
        module: &Module,
        func: FuncId,
    ) -> Option<std::sync::Arc<crate::compiled::Flat>> {
        let funcs = self.funcs.get_or_init(|| {
            (0..module.functions.len())
                .map(|_| std::sync::OnceLock::new())
                .collect()
        });
        match funcs.get(func as usize) {
            Some(slot) => slot
                .get_or_init(|| crate::compiled::flatten(module, func).map(std::sync::Arc::new))
                .clone(),
            None => crate::compiled::flatten(module, func).map(std::sync::Arc::new),
        }
    }
}

impl Clone for FlatCache {
    fn clone(&self) -> FlatCache {
        FlatCache::default()
    }
}

impl PartialEq for FlatCache {
    fn eq(&self, _: &FlatCache) -> bool {
        true
    }
}

impl std::fmt::Debug for FlatCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlatCache")
    }
}

impl Module {
    /// The source offset operation `pc` of function `func` was lowered
    /// from (where [`Vm::fault_site`](crate::Vm::fault_site) points).
    pub fn source_offset(&self, func: FuncId, pc: u32) -> Option<u32> {
        self.functions
            .get(func as usize)?
            .spans
            .get(pc as usize)
            .copied()
    }

    /// Whether any function calls built-in `f` (the host keeps what
    /// `least_connections` needs only for programs that call it).
    pub fn calls(&self, f: Builtin) -> bool {
        self.functions.iter().any(|func| {
            func.code
                .iter()
                .any(|op| matches!(op, Op::Builtin { f: g, .. } if *g == f))
        })
    }

    /// The deepest chain of calls from `f`, in frames, and the registers
    /// such a chain uses: what an interpreter preallocates.
    pub fn frame_needs(&self, f: FuncId) -> (usize, usize) {
        let func = &self.functions[f as usize];
        let mut depth = 1;
        let mut regs = func.regs as usize;
        for op in &func.code {
            if let Op::Call { func: g, .. } = op {
                let (d, r) = self.frame_needs(*g);
                depth = depth.max(1 + d);
                regs = regs.max(func.regs as usize + r);
            }
        }
        (depth, regs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn at(full_at: u64, excess_owed: u64) -> MeterState {
        MeterState {
            full_at,
            excess_owed,
        }
    }

    #[test]
    fn a_meter_spec_is_a_token_bucket_in_nanoseconds() {
        let m = MeterSpec {
            rate: 3,
            burst: 2,
            excess: 0,
        };
        // A third of a second a token, rounded up.
        assert_eq!(m.cost_ns(1), 333_333_334);
        let now = 100 * SEC;
        let (c, t) = m.meter(MeterState::default(), now, 2);
        assert_eq!((c, t), (GREEN, at(now + 666_666_667, 0)));
        assert_eq!(m.tokens(t, now), (0, 0));
        assert_eq!(m.meter(t, now, 1), (RED, t));
        assert_eq!(m.tokens(t, now + SEC / 3 + 1), (1, 0));
        assert_eq!(m.meter(t, now + SEC / 3 + 1, 1).0, GREEN);
        // More than the burst is never green.
        let fresh = MeterState::default();
        assert_eq!(m.meter(fresh, now, 3), (RED, fresh));
        assert_eq!(m.tokens(fresh, now), (2, 0));
    }

    /// RFC 2697: green from C, then yellow from E, then red; E refills
    /// only once C is full.
    #[test]
    fn a_three_colour_meter_takes_the_excess_bucket_after_the_committed_one() {
        let m = MeterSpec {
            rate: 1000,
            burst: 100,
            excess: 200,
        };
        let now = 10 * SEC;
        let s = MeterState::default();
        let (c, s) = m.meter(s, now, 100);
        assert_eq!(c, GREEN);
        let (c, s) = m.meter(s, now, 150);
        assert_eq!(c, YELLOW);
        assert_eq!(m.tokens(s, now), (0, 50));
        let (c, s) = m.meter(s, now, 60);
        assert_eq!(c, RED);
        // 100 ms refills C (100 tokens); E only after that.
        assert_eq!(m.tokens(s, now + SEC / 10), (100, 50));
        assert_eq!(m.tokens(s, now + SEC / 10 + SEC / 20), (100, 100));
        assert_eq!(m.tokens(s, now + SEC), (100, 200));
        // Half-way through C's refill: 50 tokens in C, E still at 50.
        let half = now + SEC / 20;
        assert_eq!(m.meter(s, half, 50).0, GREEN);
        assert_eq!(m.meter(s, half, 51).0, RED);
        // Once C is full and E has refilled a little: yellow again.
        let later = now + SEC / 10 + SEC / 100;
        let (c, after) = m.meter(s, later, 100);
        assert_eq!(c, GREEN);
        assert_eq!(m.meter(after, later, 60).0, YELLOW);
    }
}
