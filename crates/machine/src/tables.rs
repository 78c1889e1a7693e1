//! A stage compiled to tables, as FlowBlaze's hardware holds it: a
//! condition vector (each distinct comparison of the stage, one bit) and
//! a transition table from (state, event, condition bits) to an entry
//! (updates, next state, actions).
//!
//! The rows of one (state, event) are tried in order, first match wins
//! (a TCAM's priority): the state's own transitions in program order,
//! then those written for any state. A row matches when the condition
//! bits under its mask equal its value. Interpreting tables rather than
//! code is what lets a stage's tables be replaced while flow contexts
//! stay ([`crate::Engine::replace`]).
//!
//! When tables are made (loaded or replaced, never per packet) each
//! (state, event) is also compiled to a [`Plan`]: the few conditions its
//! rows read, in a flat list, and a decision table indexed by those
//! conditions' bits that names the first matching row's entry. A packet
//! then evaluates only those conditions and reads one word, rather than
//! the stage's whole condition vector and a walk of the rows; the entry is
//! the same one the rows give, so the two forms cannot disagree.

use crate::model::{
    CmpOp, Condition, Event, Expr, FieldId, Operand, Stage, StateId, Target, Update, Value,
    MAX_CONDITIONS, MAX_PORTS,
};

/// One row of the transition table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub mask: u64,
    pub value: u64,
    pub entry: u32,
}

/// What a matching row does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub updates: Vec<Update>,
    pub next_state: Option<StateId>,
    /// Port numbers as a bit set; none: the packet is dropped.
    pub ports: u64,
    pub writes: Vec<(FieldId, Operand)>,
    pub next_stage: Option<u16>,
    /// Clears the ports earlier stages sent the packet to.
    pub drop: bool,
}

/// A stage's tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageTables {
    pub conditions: Vec<Condition>,
    /// Indexed by `state * Event::COUNT + event`.
    pub rows: Vec<Vec<Row>>,
    pub entries: Vec<Entry>,
    /// Ports with plans of their own: a packet from port `p` below this
    /// takes the plans made for it, any other the plans for all ports.
    ports: usize,
    /// Indexed by `(state * Event::COUNT + event) * (ports + 1) + port`,
    /// `port` capped at `ports` (the plan for every port).
    plans: Vec<Plan>,
    /// Per port as `plans` (capped likewise): whether a packet from it
    /// that finds no context leaves none, whatever its fields, globals
    /// and metadata: every entry the initial state's packet plan can take
    /// keeps the initial state and writes no flow register. Such a
    /// packet's lookup matters only where a context exists (its idle
    /// timer, its expiry), so a lookup known to miss may be skipped.
    quiet_miss: Vec<bool>,
    /// Per port as `quiet_miss`: where a miss is quiet and the initial
    /// state's packet plan reads no condition and takes an entry with no
    /// updates (or none), that entry plus one (0: none); `u32::MAX`
    /// otherwise. Such a packet that finds no context takes it whatever
    /// its fields: a server's reply to the balancer, forwarded.
    constant_miss: Vec<u32>,
    /// The conditions each plan reads, plan after plan.
    tests: Vec<Test>,
    /// Decision tables, plan after plan: `1 << tests` words each, the
    /// entry (plus one; 0: no row matches) for those condition bits.
    decisions: Vec<u32>,
}

/// Most conditions one (state, event) may read for a decision table
/// (`2^DECISION_BITS` words); more are decided by walking the rows.
pub const DECISION_BITS: usize = 8;

/// Most ports with plans of their own (see [`StageTables::decide`]); a
/// stage with more (states times events times ports) keeps one plan per
/// (state, event), reading the port at run time.
const MAX_PORT_PLANS: usize = 4096;

/// One (state, event), for one port or all, compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    /// Where its conditions start in `tests`.
    tests: u32,
    /// How many (the rows before the first unconditional one read no
    /// others).
    count: u8,
    /// Where its decision table starts in `decisions`; `u32::MAX`: none,
    /// walk the rows.
    decisions: u32,
    /// The condition bits it reads.
    used: u64,
}

/// Whether `c` reads nothing but the port the packet came in on and
/// constants, so that it is decided for a known port when tables are made.
fn port_only(c: &Condition) -> bool {
    let known = |o: Operand| matches!(o, Operand::InPort | Operand::Const(_));
    known(c.lhs) && known(c.rhs)
}

/// The rows of one (state, event) as a packet from `port` sees them:
/// those whose port conditions fail dropped, the port conditions of the
/// others taken out of their masks (they hold). `None`: every port, the
/// rows as they are.
fn rows_for_port(rows: &[Row], conditions: &[Condition], port: Option<u64>) -> Vec<Row> {
    let Some(port) = port else {
        return rows.to_vec();
    };
    let inputs = Inputs::of_port(port);
    let mut folded = 0u64;
    let mut holding = 0u64;
    for (b, c) in conditions.iter().enumerate() {
        if port_only(c) {
            folded |= 1 << b;
            if inputs.holds(&[], c) {
                holding |= 1 << b;
            }
        }
    }
    rows.iter()
        .filter(|r| r.mask & folded & !holding == 0)
        .map(|r| Row {
            mask: r.mask & !folded,
            value: r.value & !folded,
            entry: r.entry,
        })
        .collect()
}

/// The plan of one (state, event): the conditions its reachable rows read
/// and, when few, the first matching row for each of their values.
/// A condition as a plan evaluates it: the shapes stages compare most
/// (a field with a constant or with a flow register) read without a
/// dispatch on their operands' kinds, and every comparison as a truth
/// table over less, equal and greater, with no branch on the operator.
/// Conditions were a tenth of the connection tracker's instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Test {
    FieldConst {
        field: u16,
        truth: u8,
        value: Value,
    },
    FieldFlow {
        field: u16,
        truth: u8,
        reg: u16,
    },
    Operands {
        lhs: Operand,
        rhs: Operand,
        truth: u8,
    },
}

/// Bit 0, 1 or 2: `a` less than, equal to or greater than `b`.
#[inline(always)]
fn order(a: Value, b: Value) -> u8 {
    1 << ((a >= b) as u8 + (a > b) as u8)
}

impl Test {
    fn of(c: &Condition) -> Test {
        let truth = match c.op {
            CmpOp::Lt => 0b001,
            CmpOp::Eq => 0b010,
            CmpOp::Le => 0b011,
            CmpOp::Gt => 0b100,
            CmpOp::Ne => 0b101,
            CmpOp::Ge => 0b110,
        };
        match (c.lhs, c.rhs) {
            (Operand::Field(field), Operand::Const(value)) => Test::FieldConst {
                field,
                truth,
                value,
            },
            (Operand::Field(field), Operand::FlowReg(reg)) => Test::FieldFlow { field, truth, reg },
            (lhs, rhs) => Test::Operands { lhs, rhs, truth },
        }
    }

    #[inline(always)]
    fn holds(&self, inputs: &Inputs, flow: &[Value]) -> bool {
        let (truth, o) = match *self {
            Test::FieldConst {
                field,
                truth,
                value,
            } => (truth, order(inputs.fields[field as usize], value)),
            Test::FieldFlow { field, truth, reg } => (
                truth,
                order(inputs.fields[field as usize], flow[reg as usize]),
            ),
            Test::Operands { lhs, rhs, truth } => (
                truth,
                order(inputs.operand(flow, lhs), inputs.operand(flow, rhs)),
            ),
        };
        truth & o != 0
    }
}

fn plan(
    rows: &[Row],
    conditions: &[Condition],
    tests: &mut Vec<Test>,
    decisions: &mut Vec<u32>,
) -> Plan {
    // Rows after an unconditional one are never reached.
    let reachable = rows
        .iter()
        .position(|r| r.mask == 0)
        .map_or(rows, |i| &rows[..=i]);
    let used = reachable.iter().fold(0u64, |m, r| m | r.mask);
    let bits: Vec<usize> = (0..64).filter(|b| used >> b & 1 == 1).collect();
    let at = tests.len() as u32;
    tests.extend(bits.iter().map(|&b| Test::of(&conditions[b])));
    if bits.len() > DECISION_BITS {
        return Plan {
            tests: at,
            count: bits.len() as u8,
            decisions: u32::MAX,
            used,
        };
    }
    let table = decisions.len() as u32;
    for index in 0..1u64 << bits.len() {
        // The condition vector these bits stand for (the others unread).
        let vector = bits
            .iter()
            .enumerate()
            .fold(0u64, |v, (i, &b)| v | (index >> i & 1) << b);
        let first = reachable
            .iter()
            .find(|r| vector & r.mask == r.value)
            .map_or(0, |r| r.entry + 1);
        decisions.push(first);
    }
    Plan {
        tests: at,
        count: bits.len() as u8,
        decisions: table,
        used,
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompileError {
    #[error("stage `{stage}` compares {count} distinct conditions; a stage has at most {MAX_CONDITIONS} condition bits")]
    TooManyConditions { stage: String, count: usize },
}

impl StageTables {
    pub fn compile(stage: &Stage) -> Result<StageTables, CompileError> {
        let mut conditions: Vec<Condition> = Vec::new();
        let mut entries = Vec::with_capacity(stage.transitions.len());
        let mut own: Vec<Vec<Row>> = vec![Vec::new(); stage.states.len() * Event::COUNT];
        let mut any: Vec<Vec<Row>> = vec![Vec::new(); Event::COUNT];
        for t in &stage.transitions {
            let mut mask = 0u64;
            for c in &t.when {
                let bit = match conditions.iter().position(|x| x == c) {
                    Some(b) => b,
                    None => {
                        conditions.push(*c);
                        conditions.len() - 1
                    }
                };
                if bit < MAX_CONDITIONS {
                    mask |= 1 << bit;
                }
            }
            let row = Row {
                mask,
                value: mask,
                entry: entries.len() as u32,
            };
            entries.push(Entry {
                updates: t.updates.clone(),
                next_state: t.next_state,
                ports: t.ports,
                writes: t.writes.clone(),
                next_stage: t.next_stage,
                drop: t.drop,
            });
            match t.from {
                Some(s) => own[s as usize * Event::COUNT + t.event.index()].push(row),
                None => any[t.event.index()].push(row),
            }
        }
        if conditions.len() > MAX_CONDITIONS {
            return Err(CompileError::TooManyConditions {
                stage: stage.name.clone(),
                count: conditions.len(),
            });
        }
        for (i, rows) in own.iter_mut().enumerate() {
            rows.extend_from_slice(&any[i % Event::COUNT]);
        }
        // Ports named by conditions that read only the port and constants
        // (`from clients`) get plans of their own, those conditions decided.
        let ports = conditions
            .iter()
            .filter(|c| port_only(c))
            .flat_map(|c| [c.lhs, c.rhs])
            .filter_map(|o| match o {
                Operand::Const(v) => Some(v.saturating_add(1).min(MAX_PORTS as u64) as usize),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let ports = if own.len() * (ports + 1) > MAX_PORT_PLANS {
            0
        } else {
            ports
        };
        let (mut tests, mut decisions) = (Vec::new(), Vec::new());
        let mut plans = Vec::with_capacity(own.len() * (ports + 1));
        for rows in &own {
            for p in 0..=ports {
                let port = (p < ports).then_some(p as u64);
                let rows = rows_for_port(rows, &conditions, port);
                plans.push(plan(&rows, &conditions, &mut tests, &mut decisions));
            }
        }
        let mut tables = StageTables {
            conditions,
            rows: own,
            entries,
            ports,
            plans,
            quiet_miss: Vec::new(),
            constant_miss: Vec::new(),
            tests,
            decisions,
        };
        tables.quiet_miss = (0..=ports)
            .map(|p| tables.quiet_miss_from(stage.initial, p))
            .collect();
        tables.constant_miss = (0..=ports)
            .map(|p| tables.constant_miss_from(stage.initial, p))
            .collect();
        Ok(tables)
    }

    /// Ports with plans of their own: a packet from port `p` takes plan
    /// index `p.min(port_plans())` (for [`crate::native`]).
    pub(crate) fn port_plans(&self) -> usize {
        self.ports
    }

    /// The conditions and decision table (`None`: too many conditions,
    /// the rows are walked) of (`state`, packet) for plan index `port`.
    pub(crate) fn packet_plan(
        &self,
        state: StateId,
        port: usize,
    ) -> Option<(&[Test], Option<&[u32]>)> {
        let at = (state as usize * Event::COUNT + Event::Packet.index()) * (self.ports + 1) + port;
        let plan = *self.plans.get(at)?;
        let tests = &self.tests[plan.tests as usize..][..plan.count as usize];
        let decisions = (plan.decisions != u32::MAX)
            .then(|| &self.decisions[plan.decisions as usize..][..1 << plan.count]);
        Some((tests, decisions))
    }

    /// `quiet_miss` and `constant_miss` for plan index `port`.
    pub(crate) fn misses_at(&self, port: usize) -> (bool, u32) {
        (self.quiet_miss[port], self.constant_miss[port])
    }

    /// The plan of (`state`, `event`) for a packet from `port`.
    #[inline(always)]
    fn plan_index(&self, state: StateId, event: Event, port: u64) -> usize {
        let port = (port as usize).min(self.ports);
        (state as usize * Event::COUNT + event.index()) * (self.ports + 1) + port
    }

    /// See [`StageTables::quiet_miss`]: the entries the initial state's
    /// packet plan for port index `port` can take.
    fn quiet_miss_from(&self, initial: StateId, port: usize) -> bool {
        let slot = initial as usize * Event::COUNT + Event::Packet.index();
        let Some(plan) = self.plans.get(slot * (self.ports + 1) + port) else {
            return true;
        };
        let quiet = |e: &Entry| {
            !matches!(e.next_state, Some(n) if n != initial)
                && e.updates
                    .iter()
                    .all(|u| !matches!(u.target, Target::FlowReg(_)))
        };
        if plan.decisions == u32::MAX {
            // Walked rows: any of them may be taken.
            return self.rows[slot]
                .iter()
                .all(|r| quiet(&self.entries[r.entry as usize]));
        }
        self.decisions[plan.decisions as usize..][..1 << plan.count]
            .iter()
            .all(|&d| d == 0 || quiet(&self.entries[d as usize - 1]))
    }

    /// See the field `constant_miss`.
    fn constant_miss_from(&self, initial: StateId, port: usize) -> u32 {
        let slot = initial as usize * Event::COUNT + Event::Packet.index();
        let Some(plan) = self.plans.get(slot * (self.ports + 1) + port) else {
            return u32::MAX;
        };
        if !self.quiet_miss[port] || plan.count != 0 || plan.decisions == u32::MAX {
            return u32::MAX;
        }
        match self.decisions[plan.decisions as usize] {
            0 => 0,
            d if self.entries[d as usize - 1].updates.is_empty() => d,
            _ => u32::MAX,
        }
    }

    /// The entry a packet from `port` takes where it finds no context and
    /// the stage's rows decide it without reading anything: `Some(None)`
    /// for no entry. `None`: decide as usual.
    #[inline(always)]
    pub fn constant_miss(&self, port: u64) -> Option<Option<&Entry>> {
        match self.constant_miss[(port as usize).min(self.ports)] {
            u32::MAX => None,
            0 => Some(None),
            d => Some(Some(&self.entries[d as usize - 1])),
        }
    }

    /// Whether a packet from `port` that finds no context in this stage
    /// leaves none (see the field `quiet_miss`): such a packet's lookup
    /// may be skipped where it is known to miss.
    #[inline(always)]
    pub fn quiet_miss(&self, port: u64) -> bool {
        self.quiet_miss[(port as usize).min(self.ports)]
    }

    /// The entry a packet takes in (`state`, `event`): what [`lookup`]
    /// gives for the full condition vector, found by evaluating only the
    /// conditions the rows read and indexing the decision table.
    ///
    /// [`lookup`]: StageTables::lookup
    #[inline(always)]
    pub fn decide(
        &self,
        state: StateId,
        event: Event,
        inputs: &Inputs,
        flow: &[Value],
    ) -> Option<&Entry> {
        let plan = *self.plans.get(self.plan_index(state, event, inputs.port))?;
        let tests = &self.tests[plan.tests as usize..][..plan.count as usize];
        let mut index = 0usize;
        for (i, t) in tests.iter().enumerate() {
            index |= (t.holds(inputs, flow) as usize) << i;
        }
        if plan.decisions == u32::MAX {
            return self.walk(plan, index, state, event, inputs.port);
        }
        match self.decisions[plan.decisions as usize + index] {
            0 => None,
            e => Some(&self.entries[e as usize - 1]),
        }
    }

    /// [`StageTables::decide`] for a plan of too many conditions for a
    /// decision table: the bits `index` gives back in their places in
    /// the condition vector, and the rows walked.
    #[cold]
    #[inline(never)]
    fn walk(
        &self,
        plan: Plan,
        index: usize,
        state: StateId,
        event: Event,
        port: u64,
    ) -> Option<&Entry> {
        let mut bits = 0u64;
        let mut rest = plan.used;
        let mut i = 0;
        while rest != 0 {
            let b = rest.trailing_zeros();
            bits |= (index as u64 >> i & 1) << b;
            rest &= rest - 1;
            i += 1;
        }
        self.lookup_for_port(state, event, bits, port)
    }

    /// [`StageTables::lookup`] where the port's own plan was made: its
    /// decided conditions hold in the rows it keeps, so they are set in
    /// `bits` for the walk.
    fn lookup_for_port(
        &self,
        state: StateId,
        event: Event,
        bits: u64,
        port: u64,
    ) -> Option<&Entry> {
        if (port as usize) >= self.ports {
            return self.lookup(state, event, bits);
        }
        let inputs = Inputs::of_port(port);
        let decided = self
            .conditions
            .iter()
            .enumerate()
            .filter(|(_, c)| port_only(c) && inputs.holds(&[], c))
            .fold(0u64, |m, (b, _)| m | 1 << b);
        self.lookup(state, event, bits | decided)
    }

    /// The first row of (`state`, `event`) that `bits` match.
    #[inline]
    pub fn lookup(&self, state: StateId, event: Event, bits: u64) -> Option<&Entry> {
        self.rows
            .get(state as usize * Event::COUNT + event.index())?
            .iter()
            .find(|r| bits & r.mask == r.value)
            .map(|r| &self.entries[r.entry as usize])
    }

    /// Rows in all (every (state, event) list, `any` rows counted in each
    /// state they apply to).
    pub fn row_count(&self) -> usize {
        self.rows.iter().map(Vec::len).sum()
    }
}

/// What operands read, for one packet in one context.
pub struct Inputs<'a> {
    pub fields: &'a [u64],
    pub globals: &'a [u64],
    pub now_us: u64,
    pub port: u64,
    pub len: u64,
    /// The packet's metadata words.
    pub meta: &'a [u64],
}

impl Inputs<'_> {
    /// Inputs that say only the packet's port: what a condition on the
    /// port alone reads, when tables are made.
    pub fn of_port(port: u64) -> Inputs<'static> {
        Inputs {
            fields: &[],
            globals: &[],
            now_us: 0,
            port,
            len: 0,
            meta: &[],
        }
    }

    #[inline]
    pub fn operand(&self, flow: &[u64], op: Operand) -> u64 {
        match op {
            Operand::Field(f) => self.fields[f as usize],
            Operand::FlowReg(r) => flow[r as usize],
            Operand::GlobalReg(r) => self.globals[r as usize],
            Operand::Const(c) => c,
            Operand::Now => self.now_us,
            Operand::InPort => self.port,
            Operand::Len => self.len,
            Operand::Meta(m) => self.meta[m as usize],
        }
    }

    /// Whether one condition holds.
    #[inline]
    pub fn holds(&self, flow: &[u64], c: &Condition) -> bool {
        c.op.holds(self.operand(flow, c.lhs), self.operand(flow, c.rhs))
    }

    /// The condition vector.
    #[inline]
    pub fn bits(&self, flow: &[u64], conditions: &[Condition]) -> u64 {
        let mut bits = 0;
        for (i, c) in conditions.iter().enumerate() {
            if c.op
                .holds(self.operand(flow, c.lhs), self.operand(flow, c.rhs))
            {
                bits |= 1 << i;
            }
        }
        bits
    }
}

/// What updates write besides the flow registers.
pub struct Writable<'a> {
    pub globals: &'a mut [u64],
    pub meta: &'a mut [u64],
}

/// Runs `updates` in order on the flow registers, the globals and the
/// packet's metadata.
#[inline(always)]
pub fn apply_updates(
    updates: &[Update],
    fields: &[u64],
    flow: &mut [u64],
    out: Writable,
    now_us: u64,
    port: u64,
    len: u64,
) {
    let Writable { globals, meta } = out;
    for u in updates {
        let v = {
            let inputs = Inputs {
                fields,
                globals,
                now_us,
                port,
                len,
                meta,
            };
            match u.expr {
                Expr::Operand(o) => inputs.operand(flow, o),
                Expr::Binary(op, a, b) => {
                    op.apply(inputs.operand(flow, a), inputs.operand(flow, b))
                }
            }
        };
        match u.target {
            Target::FlowReg(r) => flow[r as usize] = v,
            Target::GlobalReg(r) => globals[r as usize] = v,
            Target::Meta(m) => meta[m as usize] = v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A stage whose states cover the plans' cases: rows with shared and
    /// distinct conditions, rows for any state, an unconditional row with
    /// rows after it, and a state reading more conditions than a decision
    /// table takes.
    const STAGE: &str = r#"
PacketField h { a = packet.data[26:+1]; b = packet.data[27:+1]; c = packet.data[28:+1]; }
Constant PKT = 255;
Stage s {
    Register r;
    setFlowKey(h.a);
    State initial one {
        on (pktRcvd) {
            if (h.a == 1, h.b < 2) { sendPacket(PKT, 1); setNextState(two); }
            if (h.a == 1) { sendPacket(PKT, 2); }
            if (r >= h.c) { r = r + 1; }
        }
        on (idleTimeout) { if (h.b == 0) { setNextState(two); } }
    }
    State two {
        on (pktRcvd) {
            if (pktRcvd.port == 2, h.a == 0) { sendPacket(PKT, 1); }
            if (pktRcvd.port != 1, h.b == 1) { sendPacket(PKT, 2); setNextState(one); }
            if (h.c != 3) { sendPacket(PKT, 3); }
            sendPacket(PKT, 0);
            if (h.a == 2) { setNextState(one); }
        }
    }
    State wide {
        on (pktRcvd) {
            if (h.a == 0, h.a == 1, h.a == 2, h.b == 0, h.b == 1, h.b == 2,
                h.c == 0, h.c == 1, h.c == 2) { sendPacket(PKT, 1); }
            if (h.a == 3, h.b == 3, h.c > 1, pktRcvd.port == 3) { sendPacket(PKT, 2); }
            if (h.c < 2, r == 1) { sendPacket(PKT, 3); }
        }
    }
    State any {
        on (pktRcvd) { if (h.b == 1) { sendPacket(PKT, 3); } }
        on (tableFull) { if (h.c == 2) { sendPacket(PKT, 2); } }
    }
}
"#;

    proptest! {
        #[test]
        fn decisions_take_the_entry_the_rows_give(
            values in proptest::collection::vec(0u64..4, 3),
            reg in 0u64..3,
            port in 0u64..6,
        ) {
            let stage = &crate::xl::parse_str("t.xl", STAGE).expect("parses").stages[0];
            let tables = StageTables::compile(stage).expect("compiles");
            prop_assert!(tables.plans.iter().any(|p| p.decisions == u32::MAX));
            // Ports 0 to 3 have plans of their own, 4 and 5 the common ones.
            prop_assert_eq!(tables.ports, 4);
            let fields: Vec<u64> = values;
            let flow = [reg];
            let inputs = Inputs {
                fields: &fields,
                globals: &[],
                now_us: 0,
                port,
                len: 64,
                meta: &[],
            };
            let bits = inputs.bits(&flow, &tables.conditions);
            for state in 0..stage.states.len() as StateId {
                for event in Event::ALL {
                    prop_assert_eq!(
                        tables.decide(state, event, &inputs, &flow),
                        tables.lookup(state, event, bits),
                        "state {} event {:?} port {}", state, event, port
                    );
                }
            }
        }
    }

    #[test]
    fn a_miss_is_quiet_where_no_entry_the_initial_state_takes_moves_it() {
        let stage = &crate::xl::parse_str("t.xl", STAGE).expect("parses").stages[0];
        let tables = StageTables::compile(stage).expect("compiles");
        // State `one`, the initial one: port 1 may take `setNextState(two)`,
        // and every port may update the register.
        for port in 0..6 {
            assert!(!tables.quiet_miss(port), "port {port}");
        }
        let quiet = r#"
Stage s {
    Register r;
    setFlowKey(ipv4.src);
    State initial a {
        on (pktRcvd) {
            if (pktRcvd.port == 1) { r = r + 1; }
            if (pktRcvd.port == 2) { setNextState(b); }
            sendPacket(255, 1);
        }
    }
    State b { on (pktRcvd) { setNextState(a); } }
    State any { on (pktRcvd) { if (pktRcvd.port == 3) { setNextState(a); } } }
}
"#;
        let stage = &crate::xl::parse_str("t.xl", quiet).expect("parses").stages[0];
        let tables = StageTables::compile(stage).expect("compiles");
        let quiet: Vec<bool> = (0..6).map(|p| tables.quiet_miss(p)).collect();
        // Port 0: sends only; 1 writes the register; 2 moves to `b`; 3
        // moves to `a`, where it is; 4 and up share the plan for every
        // port, which may take any row.
        assert_eq!(quiet, [true, false, false, true, false, false]);
    }

    proptest! {
        /// A plan's test holds exactly where its condition does, for every
        /// operator and each of the test's shapes.
        #[test]
        fn a_test_holds_where_its_condition_does(
            a in prop_oneof![0u64..4, any::<u64>()],
            b in prop_oneof![0u64..4, any::<u64>()],
            op in 0usize..6,
            shape in 0usize..3,
        ) {
            let op = [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge][op];
            let rhs = [Operand::Const(b), Operand::FlowReg(1), Operand::GlobalReg(0)][shape];
            let c = Condition { lhs: Operand::Field(2), op, rhs };
            let fields = [9, 9, a];
            let (flow, globals) = ([9, b], [b]);
            let inputs = Inputs {
                fields: &fields,
                globals: &globals,
                now_us: 0,
                port: 1,
                len: 64,
                meta: &[],
            };
            prop_assert_eq!(Test::of(&c).holds(&inputs, &flow), op.holds(a, b));
            prop_assert_eq!(Test::of(&c).holds(&inputs, &flow), inputs.holds(&flow, &c));
        }
    }

    #[test]
    fn a_constant_miss_is_the_entry_a_quiet_unconditional_plan_takes() {
        let text = r#"
Register global g = 0;
Stage s {
    setFlowKey(ipv4.src);
    State initial a {
        on (pktRcvd) {
            if (pktRcvd.port == 1) { setNextState(b); }
            if (pktRcvd.port == 2) { sendPacket(255, 1); }
            if (pktRcvd.port == 3, ipv4.dst == 7) { sendPacket(255, 2); }
            if (pktRcvd.port == 4) { g = g + 1; sendPacket(255, 3); }
        }
    }
    State b { on (pktRcvd) { setNextState(a); } }
}
"#;
        let stage = &crate::xl::parse_str("t.xl", text).expect("parses").stages[0];
        let tables = StageTables::compile(stage).expect("compiles");
        let sent = |p: u64| tables.constant_miss(p).map(|e| e.map(|e| e.ports));
        // Port 0: no row, so no entry, always; 1 moves the state (not a
        // quiet miss); 2 sends, whatever the packet; 3 reads a field; 4
        // updates a global; 5 and up share the plan for every port.
        assert_eq!(sent(0), Some(None));
        assert_eq!(sent(1), None);
        assert_eq!(sent(2), Some(Some(1 << 1)));
        assert_eq!(sent(3), None);
        assert_eq!(sent(4), None);
        assert_eq!(sent(5), None);
    }
}
