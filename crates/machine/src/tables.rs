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

use crate::model::{
    Condition, Event, Expr, FieldId, Operand, Stage, StateId, Target, Update, MAX_CONDITIONS,
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
        Ok(StageTables {
            conditions,
            rows: own,
            entries,
        })
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
#[inline]
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
