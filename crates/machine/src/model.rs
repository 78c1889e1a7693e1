//! The EFSM model: what a program says, before it is compiled to tables.
//!
//! A [`Machine`] is a pipeline of [`Stage`]s. Each stage keys flow
//! contexts by packet fields, holds per-context flow registers and a
//! state, and moves between states on events, under conditions that
//! compare packet fields, registers and constants. Every value is an
//! unsigned 64-bit integer.

use crate::fields::FieldSource;

/// A value: fields, registers, constants and time are all unsigned.
pub type Value = u64;
/// Index of a state in its stage.
pub type StateId = u16;
/// Index of a packet field in [`Machine::fields`].
pub type FieldId = u16;

/// Most fields in a flow key.
pub const MAX_KEY: usize = 8;
/// Most condition bits in one stage (the condition vector is one `u64`).
pub const MAX_CONDITIONS: usize = 64;
/// Most distinct port numbers (`sendPacket(PKT, n)`, n below this).
pub const MAX_PORTS: usize = 64;
/// Most `setField` writes one packet collects across its stages.
pub const MAX_WRITES: usize = 8;
/// Most per-packet metadata words a program declares.
pub const MAX_META: usize = 16;
/// Most flow contexts one stage's table may hold.
pub const MAX_CAPACITY: usize = 1 << 24;

/// A packet field a program reads (and maybe writes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDef {
    /// As the program names it (`ipv4.src`).
    pub name: String,
    pub source: FieldSource,
}

/// A register and the value it starts with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Register {
    pub name: String,
    pub init: Value,
}

/// What an operand reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    Field(FieldId),
    FlowReg(u16),
    GlobalReg(u16),
    Const(Value),
    /// The packet's timestamp in microseconds (XL's `currentTime`).
    Now,
    /// The number of the port the packet came in on (`pktRcvd.port`).
    InPort,
    /// The frame's length in bytes (`pktRcvd.len`).
    Len,
    /// A per-packet metadata word: 0 when the packet enters the first
    /// stage, carried to the stages it goes on to.
    Meta(u16),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub fn holds(self, a: Value, b: Value) -> bool {
        match self {
            CmpOp::Eq => a == b,
            CmpOp::Ne => a != b,
            CmpOp::Lt => a < b,
            CmpOp::Le => a <= b,
            CmpOp::Gt => a > b,
            CmpOp::Ge => a >= b,
        }
    }
}

/// One bit of a stage's condition vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Condition {
    pub lhs: Operand,
    pub op: CmpOp,
    pub rhs: Operand,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArithOp {
    Add,
    /// Saturates at zero: registers are unsigned.
    Sub,
    Mul,
    /// Division by zero gives zero.
    Div,
    /// Remainder by zero gives zero.
    Mod,
    Max,
    Min,
}

impl ArithOp {
    pub fn apply(self, a: Value, b: Value) -> Value {
        match self {
            ArithOp::Add => a.wrapping_add(b),
            ArithOp::Sub => a.saturating_sub(b),
            ArithOp::Mul => a.wrapping_mul(b),
            ArithOp::Div => a.checked_div(b).unwrap_or(0),
            ArithOp::Mod => a.checked_rem(b).unwrap_or(0),
            ArithOp::Max => a.max(b),
            ArithOp::Min => a.min(b),
        }
    }
}

/// The right-hand side of an update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expr {
    Operand(Operand),
    Binary(ArithOp, Operand, Operand),
}

/// Where an update writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    FlowReg(u16),
    GlobalReg(u16),
    Meta(u16),
}

/// `target = expr`, run in order: each update sees the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Update {
    pub target: Target,
    pub expr: Expr,
}

/// What wakes a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// A packet of the context arrived (`pktRcvd`).
    Packet,
    /// The context's last packet is older than the stage's idle timeout
    /// (`idleTimeout`), noticed when its next packet arrives.
    IdleTimeout,
    /// The context is older than the stage's hard timeout (`hardTimeout`).
    HardTimeout,
    /// A new context found no room in the flow table (`tableFull`).
    TableFull,
}

impl Event {
    pub const COUNT: usize = 4;
    pub const ALL: [Event; 4] = [
        Event::Packet,
        Event::IdleTimeout,
        Event::HardTimeout,
        Event::TableFull,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// The XL name.
    pub fn name(self) -> &'static str {
        match self {
            Event::Packet => "pktRcvd",
            Event::IdleTimeout => "idleTimeout",
            Event::HardTimeout => "hardTimeout",
            Event::TableFull => "tableFull",
        }
    }
}

/// One transition: in `from` (or any state), on `event`, when every
/// condition holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// `None`: any state (tried after the state's own transitions).
    pub from: Option<StateId>,
    pub event: Event,
    pub when: Vec<Condition>,
    pub updates: Vec<Update>,
    pub next_state: Option<StateId>,
    /// Port numbers the packet is sent to, as a bit set (none: dropped).
    pub ports: u64,
    /// `setField(field, PKT, value)`: written into the frame as it leaves.
    pub writes: Vec<(FieldId, Operand)>,
    /// Go on to this later stage with the packet.
    pub next_stage: Option<u16>,
    /// Drop the packet: the ports earlier stages sent it to are cleared.
    pub drop: bool,
}

/// Which context gives way when a new one finds no room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Eviction {
    /// Only an expired context (past its idle or hard timeout).
    #[default]
    Expired,
    /// An expired one, else the least recently seen of the new key's
    /// candidate slots.
    Oldest,
}

/// One stage: a flow key, states, registers and transitions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    pub name: String,
    /// Empty for a stateless stage: no flow context is looked up, its
    /// one state is the initial one and it has no flow registers.
    pub key: Vec<FieldId>,
    /// Both directions share a context: the key's first half and second
    /// half are the two endpoints, ordered before lookup.
    pub biflow: bool,
    pub states: Vec<String>,
    pub initial: StateId,
    pub flow_regs: Vec<Register>,
    pub transitions: Vec<Transition>,
    /// Microseconds without a packet after which a context expires.
    pub idle_timeout_us: Option<u64>,
    /// Microseconds after its creation at which a context expires.
    pub hard_timeout_us: Option<u64>,
    /// Flow contexts the table holds (rounded up to whole buckets).
    pub capacity: usize,
    pub eviction: Eviction,
}

/// Flow contexts per stage unless the program says otherwise.
pub const DEFAULT_CAPACITY: usize = 4096;

/// A whole program: its fields, global registers and stages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    pub fields: Vec<FieldDef>,
    pub globals: Vec<Register>,
    pub stages: Vec<Stage>,
    /// Per-packet metadata words, by name (none in XL programs).
    pub meta: Vec<String>,
}

impl Stage {
    /// A stage without a flow key keeps no contexts.
    pub fn stateless(&self) -> bool {
        self.key.is_empty()
    }
}

impl Machine {
    /// Whether one worker must serve every frame: more than one stage
    /// keeps flow contexts (no one key splits them all), or a transition
    /// writes a global register (globals are exact only in one place).
    pub fn single_worker(&self) -> bool {
        self.stages.iter().filter(|s| !s.stateless()).count() > 1 || self.writes_globals()
    }

    /// The stage whose flow key steers frames to workers: the first (and,
    /// where several workers serve, the only) stage that keeps contexts.
    /// None when every stage is stateless: any worker may take a frame.
    pub fn steering_stage(&self) -> Option<usize> {
        self.stages.iter().position(|s| !s.stateless())
    }

    /// Whether some transition writes a global register (then one worker
    /// serves every frame, so that globals are exact).
    pub fn writes_globals(&self) -> bool {
        self.stages.iter().any(|s| {
            s.transitions.iter().any(|t| {
                t.updates
                    .iter()
                    .any(|u| matches!(u.target, Target::GlobalReg(_)))
            })
        })
    }
}
