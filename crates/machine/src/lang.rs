//! Flick's own `machine` items (`flick_syntax::ast::MachineDecl`) to a
//! [`Machine`]: names resolved (packet fields by their XL names through
//! [`crate::fields::XL_FIELDS`], registers, metadata words, constants,
//! channels, states and stages) and the static rules checked, each
//! problem a [`Diagnostic`] with its span. Every problem of a machine is
//! reported, not only the first.
//!
//! A machine's channels are its ports, numbered 1, 2, ... in the order
//! they are declared, so a machine and the XL program that sends to the
//! same port numbers compile to the same tables.

use crate::fields::{write_place, xl_field, FieldSource, XL_FIELDS};
use crate::model::{
    ArithOp, CmpOp, Condition, Event, Eviction, Expr, FieldDef, FieldId, Machine, Operand,
    Register, Stage, StateId, Target, Transition, Update, DEFAULT_CAPACITY, MAX_CAPACITY,
    MAX_CONDITIONS, MAX_KEY, MAX_META, MAX_PORTS,
};
use flick_span::{Diagnostic, Span};
use flick_syntax::ast::{
    BinOp, Decl, Ident, MAction, MCond, MExpr, MOperand, MOperandKind, MachineDecl, MachineItem,
    RegisterDecl, StageDecl, StageItem, TransitionDecl, TypeKind,
};
use std::collections::HashMap;

/// A name used elsewhere, or a declaration twice.
pub const E_UNKNOWN: &str = "M0001";
pub const E_TWICE: &str = "M0002";
/// `goto` to this stage or an earlier one.
pub const E_BACKWARD: &str = "M0003";
/// More distinct conditions in a stage than its condition vector holds.
pub const E_CONDITIONS: &str = "M0004";
/// A flow key too long, of something other than fields, or lopsided.
pub const E_KEY: &str = "M0005";
/// A register or metadata word that is not an integer.
pub const E_TYPE: &str = "M0006";
/// A capacity out of bounds.
pub const E_CAPACITY: &str = "M0007";
/// An item where it has no meaning (a timeout that forwards, a stateless
/// stage with states, ...).
pub const E_PLACE: &str = "M0008";
/// Channels: not a channel, too many.
pub const E_CHANNEL: &str = "M0009";
/// Something a machine or stage must have and lacks.
pub const E_MISSING: &str = "M0010";
/// Items of one transition that contradict each other.
pub const E_CONFLICT: &str = "M0011";
/// Programs that hold no machine, or several, or name a grammar other
/// than `packet`.
pub const E_MACHINES: &str = "M0012";

/// The one state of a stateless stage.
pub const STATELESS_STATE: &str = "default";

/// A machine lowered, with what the model does not keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lowered {
    pub name: String,
    pub machine: Machine,
    /// Channel names; channel `i` is port `i + 1`.
    pub channels: Vec<String>,
}

impl Lowered {
    /// The port number of a channel name.
    pub fn port(&self, channel: &str) -> Option<u8> {
        self.channels
            .iter()
            .position(|c| c == channel)
            .map(|i| i as u8 + 1)
    }
}

/// Parses `text` and lowers the one machine it holds. Diagnostics of the
/// parse come first; a text with errors lowers nothing.
pub fn compile(text: &str) -> Result<Lowered, Vec<Diagnostic>> {
    let (program, mut diags) = flick_syntax::parse(text);
    if program.machines.len() != 1 {
        let span = program
            .machines
            .get(1)
            .map_or(Span::new(0, 0), |m| m.name.span);
        let what = if program.machines.is_empty() {
            "the program holds no `machine`"
        } else {
            "a program holds one `machine`"
        };
        diags.push(Diagnostic::error(E_MACHINES, what, span));
        return Err(diags);
    }
    // A machine reads packets: fields are the `packet` grammar's.
    for d in &program.decls {
        if let Decl::Grammar(g) = d {
            if g.name.name != "packet" {
                diags.push(
                    Diagnostic::error(
                        E_MACHINES,
                        format!(
                            "a machine reads the `packet` grammar, not `{}`",
                            g.name.name
                        ),
                        g.name.span,
                    )
                    .hint("write `grammar packet`"),
                );
            }
        }
    }
    match lower(&program.machines[0]) {
        Ok(l) if diags.is_empty() => Ok(l),
        Ok(_) => Err(diags),
        Err(more) => {
            diags.extend(more);
            Err(diags)
        }
    }
}

/// Lowers one machine, or gives every problem found in it.
pub fn lower(m: &MachineDecl) -> Result<Lowered, Vec<Diagnostic>> {
    let mut l = Lower::default();
    for (i, c) in m.channels.iter().enumerate() {
        if !matches!(c.ty.kind, TypeKind::Chan(_)) {
            l.error(
                Diagnostic::error(
                    E_CHANNEL,
                    format!("`{}` is not a channel", c.name.name),
                    c.ty.span,
                )
                .hint("a machine's parameters are its packet channels: `packet/packet NAME`"),
            );
        }
        if i + 1 >= MAX_PORTS {
            l.error(Diagnostic::error(
                E_CHANNEL,
                format!("a machine has at most {} channels", MAX_PORTS - 1),
                c.name.span,
            ));
        }
        l.declare(&c.name);
        l.channels.push(c.name.name.clone());
    }
    for item in &m.items {
        match item {
            MachineItem::Const { name, value, .. } => {
                if let Some(v) = l.constant(value, "a constant's value") {
                    l.declare(name);
                    l.consts.insert(name.name.clone(), v);
                }
            }
            MachineItem::Global(r) => {
                let init = l.register(r);
                l.globals.push(Register {
                    name: r.name.name.clone(),
                    init,
                });
            }
            MachineItem::Meta(r) => {
                l.register(r);
                if l.meta.len() == MAX_META {
                    l.error(Diagnostic::error(
                        E_PLACE,
                        format!("a machine has at most {MAX_META} metadata words"),
                        r.name.span,
                    ));
                }
                l.meta.push(r.name.name.clone());
            }
            MachineItem::Stage(s) => {
                if l.stage_names.contains(&s.name.name) {
                    l.error(
                        Diagnostic::error(
                            E_TWICE,
                            format!("stage `{}` is defined twice", s.name.name),
                            s.name.span,
                        )
                        .label("second definition"),
                    );
                }
                l.stage_names.push(s.name.name.clone());
            }
        }
    }
    let stages: Vec<&StageDecl> = m
        .items
        .iter()
        .filter_map(|i| match i {
            MachineItem::Stage(s) => Some(s),
            _ => None,
        })
        .collect();
    if stages.is_empty() {
        l.error(
            Diagnostic::error(
                E_MISSING,
                format!("machine `{}` has no stage", m.name.name),
                m.name.span,
            )
            .hint("add `stage NAME:` with a key, states and transitions"),
        );
    }
    let mut lowered = Vec::new();
    for (i, s) in stages.iter().enumerate() {
        lowered.push(l.stage(i, s));
    }
    if !l.diags.is_empty() {
        return Err(l.diags);
    }
    Ok(Lowered {
        name: m.name.name.clone(),
        machine: Machine {
            fields: l.fields,
            globals: l.globals,
            stages: lowered,
            meta: l.meta,
        },
        channels: l.channels,
    })
}

#[derive(Default)]
struct Lower {
    diags: Vec<Diagnostic>,
    /// Every machine-level name and where it was declared.
    names: HashMap<String, Span>,
    consts: HashMap<String, u64>,
    channels: Vec<String>,
    globals: Vec<Register>,
    meta: Vec<String>,
    fields: Vec<FieldDef>,
    stage_names: Vec<String>,
}

/// What one stage's names resolve to.
struct Scope<'a> {
    index: usize,
    flow: &'a [Register],
    states: &'a [String],
    stateless: bool,
}

/// Names that mean something of their own in operands.
const RESERVED: &[&str] = &["now", "len", "in_port", "meta", "any"];

impl Lower {
    fn error(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    /// Records a machine-level name, reporting one taken already.
    fn declare(&mut self, name: &Ident) {
        if RESERVED.contains(&name.name.as_str()) {
            self.error(Diagnostic::error(
                E_TWICE,
                format!("`{}` is a word of the machine language", name.name),
                name.span,
            ));
        } else if let Some(prev) = self.names.get(&name.name) {
            let prev = *prev;
            self.error(
                Diagnostic::error(
                    E_TWICE,
                    format!("`{}` is defined twice", name.name),
                    name.span,
                )
                .label("second definition")
                .also(prev, "first definition"),
            );
        } else {
            self.names.insert(name.name.clone(), name.span);
        }
    }

    /// Declares a register or metadata word; its initial value.
    fn register(&mut self, r: &RegisterDecl) -> u64 {
        self.declare(&r.name);
        self.register_value(r)
    }

    /// Checks a register's type; its initial value.
    fn register_value(&mut self, r: &RegisterDecl) -> u64 {
        if let Some(t) = &r.ty {
            if !matches!(t.kind, TypeKind::Integer) || !t.annotations.is_empty() {
                self.error(
                    Diagnostic::error(
                        E_TYPE,
                        format!("`{}` must be an `integer`", r.name.name),
                        t.span,
                    )
                    .hint("a machine's values are unsigned 64-bit integers"),
                );
            }
        }
        r.init
            .as_ref()
            .and_then(|v| self.constant(v, "an initial value"))
            .unwrap_or(0)
    }

    /// A value known before the machine runs: a number, an address or a
    /// constant declared above.
    fn constant(&mut self, o: &MOperand, what: &str) -> Option<u64> {
        match &o.kind {
            MOperandKind::Int { value, .. } => Some(*value),
            MOperandKind::Ipv4(a) => Some(u32::from_be_bytes(*a) as u64),
            MOperandKind::Name(n) if self.consts.contains_key(&n.name) => {
                Some(self.consts[&n.name])
            }
            _ => {
                self.error(
                    Diagnostic::error(
                        E_UNKNOWN,
                        format!("{what} must be a number, an address or a constant"),
                        o.span,
                    )
                    .label("not known before the machine runs"),
                );
                None
            }
        }
    }

    fn field(&mut self, header: &Ident, name: &Ident, span: Span) -> Option<FieldId> {
        let full = format!("{}.{}", header.name, name.name);
        if let Some(i) = self.fields.iter().position(|f| f.name == full) {
            return Some(i as FieldId);
        }
        let Some(m) = xl_field(&full) else {
            let known: Vec<&str> = XL_FIELDS.iter().map(|f| f.xl).collect();
            self.error(
                Diagnostic::error(E_UNKNOWN, format!("unknown packet field `{full}`"), span)
                    .hint(format!("the fields are {}", known.join(", "))),
            );
            return None;
        };
        self.fields.push(FieldDef {
            name: full,
            source: FieldSource::Unit {
                field: m.unit,
                bytes: m.bytes,
                at: m.at,
            },
        });
        Some((self.fields.len() - 1) as FieldId)
    }

    fn operand(&mut self, scope: &Scope, o: &MOperand) -> Option<Operand> {
        match &o.kind {
            MOperandKind::Int { value, .. } => Some(Operand::Const(*value)),
            MOperandKind::Ipv4(a) => Some(Operand::Const(u32::from_be_bytes(*a) as u64)),
            MOperandKind::Name(n) => {
                let name = n.name.as_str();
                if let Some(r) = scope.flow.iter().position(|r| r.name == name) {
                    Some(Operand::FlowReg(r as u16))
                } else if let Some(r) = self.globals.iter().position(|r| r.name == name) {
                    Some(Operand::GlobalReg(r as u16))
                } else if let Some(v) = self.consts.get(name) {
                    Some(Operand::Const(*v))
                } else if let Some(c) = self.channels.iter().position(|c| c == name) {
                    Some(Operand::Const(c as u64 + 1))
                } else {
                    match name {
                        "now" => Some(Operand::Now),
                        "len" => Some(Operand::Len),
                        "in_port" => Some(Operand::InPort),
                        _ => {
                            let hint = if self.meta.iter().any(|m| m == name) {
                                format!("a metadata word is read as `meta.{name}`")
                            } else {
                                "names are flow registers, globals, constants, channels, `now`, `len` and `in_port`".into()
                            };
                            self.error(
                                Diagnostic::error(
                                    E_UNKNOWN,
                                    format!("unknown name `{name}`"),
                                    n.span,
                                )
                                .hint(hint),
                            );
                            None
                        }
                    }
                }
            }
            MOperandKind::Dotted(h, f) if h.name == "meta" => {
                match self.meta.iter().position(|m| *m == f.name) {
                    Some(i) => Some(Operand::Meta(i as u16)),
                    None => {
                        self.error(
                            Diagnostic::error(
                                E_UNKNOWN,
                                format!("no metadata word `{}`", f.name),
                                o.span,
                            )
                            .hint("declare it in the machine: `meta NAME: integer`"),
                        );
                        None
                    }
                }
            }
            MOperandKind::Dotted(h, f) => self.field(h, f, o.span).map(Operand::Field),
        }
    }

    fn stage(&mut self, index: usize, s: &StageDecl) -> Stage {
        let mut stage = Stage {
            name: s.name.name.clone(),
            key: Vec::new(),
            biflow: false,
            states: Vec::new(),
            initial: 0,
            flow_regs: Vec::new(),
            transitions: Vec::new(),
            idle_timeout_us: None,
            hard_timeout_us: None,
            capacity: DEFAULT_CAPACITY,
            eviction: Eviction::Expired,
        };
        let mut key_span = None;
        let mut states_span = None;
        // Names of this stage: its flow registers and states.
        let mut local: HashMap<String, Span> = HashMap::new();
        for item in &s.items {
            match item {
                StageItem::Key {
                    fields,
                    other,
                    span,
                } => {
                    if key_span.is_some() {
                        self.error(Diagnostic::error(E_TWICE, "a stage has one `key`", *span));
                        continue;
                    }
                    key_span = Some(*span);
                    let all: Vec<&MOperand> = fields.iter().chain(other.iter().flatten()).collect();
                    if all.len() > MAX_KEY {
                        self.error(Diagnostic::error(
                            E_KEY,
                            format!(
                                "a flow key has at most {MAX_KEY} fields; this one has {}",
                                all.len()
                            ),
                            *span,
                        ));
                    }
                    if let Some(o) = other {
                        if o.len() != fields.len() {
                            self.error(
                                Diagnostic::error(
                                    E_KEY,
                                    "the two endpoints of a biflow key name as many fields each",
                                    *span,
                                )
                                .hint("`key biflow (ipv4.src, tcp.sport) (ipv4.dst, tcp.dport)`"),
                            );
                        }
                        stage.biflow = true;
                    }
                    for f in all {
                        match &f.kind {
                            MOperandKind::Dotted(h, n) if h.name != "meta" => {
                                if let Some(id) = self.field(h, n, f.span) {
                                    stage.key.push(id);
                                }
                            }
                            _ => self.error(
                                Diagnostic::error(
                                    E_KEY,
                                    "a flow key is made of packet fields",
                                    f.span,
                                )
                                .hint("name fields as `ipv4.src`, `tcp.dport`, ..."),
                            ),
                        }
                    }
                }
                StageItem::IdleTimeout(d) | StageItem::HardTimeout(d) => {
                    let Some(us) = d.amount.checked_mul(d.unit.micros()) else {
                        self.error(Diagnostic::error(
                            E_CAPACITY,
                            "the timeout does not fit in 64 bits of microseconds",
                            d.span,
                        ));
                        continue;
                    };
                    if matches!(item, StageItem::IdleTimeout(_)) {
                        stage.idle_timeout_us = Some(us);
                    } else {
                        stage.hard_timeout_us = Some(us);
                    }
                }
                StageItem::Capacity(c) => {
                    if let Some(n) = self.constant(c, "a capacity") {
                        if n == 0 || n > MAX_CAPACITY as u64 {
                            self.error(
                                Diagnostic::error(
                                    E_CAPACITY,
                                    format!("a stage holds 1 to {MAX_CAPACITY} flow contexts"),
                                    c.span,
                                )
                                .label(format!("{n} contexts")),
                            );
                        } else {
                            stage.capacity = n as usize;
                        }
                    }
                }
                StageItem::Evict(e) => match e.name.as_str() {
                    "oldest" => stage.eviction = Eviction::Oldest,
                    "expired" => stage.eviction = Eviction::Expired,
                    _ => self.error(Diagnostic::error(
                        E_UNKNOWN,
                        format!("`evict` takes `oldest` or `expired`, not `{}`", e.name),
                        e.span,
                    )),
                },
                StageItem::Flow(r) => {
                    if let Some(prev) = self.names.get(&r.name.name).or(local.get(&r.name.name)) {
                        let prev = *prev;
                        self.error(
                            Diagnostic::error(
                                E_TWICE,
                                format!("`{}` is defined twice", r.name.name),
                                r.name.span,
                            )
                            .also(prev, "first definition"),
                        );
                    }
                    local.insert(r.name.name.clone(), r.name.span);
                    let init = self.register_value(r);
                    stage.flow_regs.push(Register {
                        name: r.name.name.clone(),
                        init,
                    });
                }
                StageItem::States(names, span) => {
                    if states_span.is_some() {
                        self.error(Diagnostic::error(
                            E_TWICE,
                            "a stage lists its states once",
                            *span,
                        ));
                        continue;
                    }
                    states_span = Some(*span);
                    for n in names {
                        if n.name == "any" {
                            self.error(Diagnostic::error(
                                E_TWICE,
                                "`any` stands for every state; it is not one",
                                n.span,
                            ));
                        } else if stage.states.contains(&n.name) {
                            self.error(Diagnostic::error(
                                E_TWICE,
                                format!("state `{}` is listed twice", n.name),
                                n.span,
                            ));
                        }
                        stage.states.push(n.name.clone());
                    }
                }
                StageItem::Transition(_) => {}
            }
        }
        let stateless = key_span.is_none();
        if stateless {
            for item in &s.items {
                let what = match item {
                    StageItem::Flow(_) => "flow registers",
                    StageItem::States(..) => "states",
                    StageItem::IdleTimeout(_) | StageItem::HardTimeout(_) => "timeouts",
                    StageItem::Capacity(_) => "a capacity",
                    StageItem::Evict(_) => "an eviction policy",
                    _ => continue,
                };
                self.error(
                    Diagnostic::error(
                        E_PLACE,
                        format!("stage `{}` has no `key`, so no {what}", s.name.name),
                        item.span(),
                    )
                    .hint("a stage without a key keeps no flow contexts: add `key FIELD, ...` to keep some"),
                );
            }
            stage.states = vec![STATELESS_STATE.into()];
        } else if stage.states.is_empty() {
            self.error(
                Diagnostic::error(
                    E_MISSING,
                    format!("stage `{}` has a key but no states", s.name.name),
                    s.name.span,
                )
                .hint("list them, the initial one first: `states closed, open`"),
            );
            stage.states = vec![STATELESS_STATE.into()];
        }
        let (flow, states) = (stage.flow_regs.clone(), stage.states.clone());
        let scope = Scope {
            index,
            flow: &flow,
            states: &states,
            stateless,
        };
        for item in &s.items {
            if let StageItem::Transition(t) = item {
                if let Some(t) = self.transition(&scope, t) {
                    stage.transitions.push(t);
                }
            }
        }
        let mut distinct: Vec<Condition> = Vec::new();
        for c in stage.transitions.iter().flat_map(|t| &t.when) {
            if !distinct.contains(c) {
                distinct.push(*c);
            }
        }
        if distinct.len() > MAX_CONDITIONS {
            self.error(
                Diagnostic::error(
                    E_CONDITIONS,
                    format!(
                        "stage `{}` compares {} distinct conditions; a stage has at most {MAX_CONDITIONS}",
                        s.name.name,
                        distinct.len()
                    ),
                    s.name.span,
                )
                .hint("split the stage: `goto` a later one"),
            );
        }
        stage
    }

    fn transition(&mut self, scope: &Scope, t: &TransitionDecl) -> Option<Transition> {
        let errors = self.diags.len();
        let event = match t.event.name.as_str() {
            "packet" => Event::Packet,
            "idle_timeout" => Event::IdleTimeout,
            "hard_timeout" => Event::HardTimeout,
            "table_full" => Event::TableFull,
            other => {
                self.error(
                    Diagnostic::error(E_UNKNOWN, format!("unknown event `{other}`"), t.event.span)
                        .hint(
                        "the events are `packet`, `idle_timeout`, `hard_timeout` and `table_full`",
                    ),
                );
                Event::Packet
            }
        };
        let from = match (&t.state, scope.stateless) {
            (None, true) => Some(0),
            (Some(s), true) => {
                self.error(
                    Diagnostic::error(E_PLACE, "a stage without `key` has no states", s.span)
                        .hint("write its transitions `on packet when ...: ...`"),
                );
                None
            }
            (None, false) => {
                self.error(
                    Diagnostic::error(
                        E_MISSING,
                        "a transition of a stage with states says which state it leaves",
                        t.event.span,
                    )
                    .hint("begin it with `in STATE` or `in any`"),
                );
                None
            }
            (Some(s), false) if s.name == "any" => None,
            (Some(s), false) => match scope.states.iter().position(|n| *n == s.name) {
                Some(i) => Some(i as StateId),
                None => {
                    self.error(Diagnostic::error(
                        E_UNKNOWN,
                        format!("no state `{}` in this stage", s.name),
                        s.span,
                    ));
                    None
                }
            },
        };
        if scope.stateless && event != Event::Packet {
            self.error(Diagnostic::error(
                E_PLACE,
                "a stage without `key` keeps no contexts, so only `packet` happens to it",
                t.event.span,
            ));
        }
        let mut when = Vec::new();
        for c in &t.when {
            match c {
                MCond::From(ch, _) => match self.channels.iter().position(|c| *c == ch.name) {
                    Some(i) => when.push(Condition {
                        lhs: Operand::InPort,
                        op: CmpOp::Eq,
                        rhs: Operand::Const(i as u64 + 1),
                    }),
                    None => self.error(Diagnostic::error(
                        E_UNKNOWN,
                        format!("no channel `{}`", ch.name),
                        ch.span,
                    )),
                },
                MCond::Compare { lhs, op, rhs, .. } => {
                    let (a, b) = (self.operand(scope, lhs), self.operand(scope, rhs));
                    let op = match op {
                        BinOp::Eq => CmpOp::Eq,
                        BinOp::Ne => CmpOp::Ne,
                        BinOp::Lt => CmpOp::Lt,
                        BinOp::Le => CmpOp::Le,
                        BinOp::Gt => CmpOp::Gt,
                        _ => CmpOp::Ge,
                    };
                    if let (Some(lhs), Some(rhs)) = (a, b) {
                        when.push(Condition { lhs, op, rhs });
                    }
                }
            }
        }
        let timeout = matches!(event, Event::IdleTimeout | Event::HardTimeout);
        let mut out = Transition {
            from,
            event,
            when,
            updates: Vec::new(),
            next_state: None,
            ports: 0,
            writes: Vec::new(),
            next_stage: None,
            drop: false,
        };
        let mut forward_span = None;
        let mut drop_span = None;
        for a in &t.actions {
            if timeout && !matches!(a, MAction::Update { .. } | MAction::Next(..)) {
                self.error(
                    Diagnostic::error(
                        E_PLACE,
                        "a timeout has no packet: it updates registers and moves to a state",
                        a.span(),
                    )
                    .hint("the packet that noticed the timeout runs `on packet` next"),
                );
                continue;
            }
            match a {
                MAction::Update { target, value, .. } => {
                    let target = match &target.kind {
                        MOperandKind::Name(n) => {
                            match scope.flow.iter().position(|r| r.name == n.name) {
                                Some(r) => Some(Target::FlowReg(r as u16)),
                                None => self
                                    .globals
                                    .iter()
                                    .position(|r| r.name == n.name)
                                    .map(|r| Target::GlobalReg(r as u16)),
                            }
                        }
                        MOperandKind::Dotted(h, f) if h.name == "meta" => self
                            .meta
                            .iter()
                            .position(|m| *m == f.name)
                            .map(|i| Target::Meta(i as u16)),
                        _ => None,
                    };
                    let expr = self.expr(scope, value);
                    match (target, expr) {
                        (Some(target), Some(expr)) => out.updates.push(Update { target, expr }),
                        (None, _) => {
                            self.error(
                                Diagnostic::error(
                                    E_UNKNOWN,
                                    "only flow registers, globals and `meta.NAME` words are assigned",
                                    a.span(),
                                )
                                .hint("declare the register (`flow NAME: integer := 0`, `global ...`), or rewrite a packet field with `set`"),
                            );
                        }
                        _ => {}
                    }
                }
                MAction::Next(s, span) => {
                    if scope.stateless {
                        self.error(Diagnostic::error(
                            E_PLACE,
                            "a stage without `key` has no states to move to",
                            *span,
                        ));
                    } else if out.next_state.is_some() {
                        self.error(Diagnostic::error(
                            E_CONFLICT,
                            "a transition moves to one next state",
                            *span,
                        ));
                    } else {
                        match scope.states.iter().position(|n| *n == s.name) {
                            Some(i) => out.next_state = Some(i as StateId),
                            None => self.error(Diagnostic::error(
                                E_UNKNOWN,
                                format!("no state `{}` in this stage", s.name),
                                s.span,
                            )),
                        }
                    }
                }
                MAction::Forward(ch, span) => {
                    forward_span = Some(*span);
                    match self.channels.iter().position(|c| *c == ch.name) {
                        // Channels past the last port were reported.
                        Some(i) if i + 1 < MAX_PORTS => out.ports |= 1 << (i + 1),
                        Some(_) => {}
                        None => self.error(Diagnostic::error(
                            E_UNKNOWN,
                            format!("no channel `{}`", ch.name),
                            ch.span,
                        )),
                    }
                }
                MAction::Drop(span) => {
                    drop_span = Some(*span);
                    out.drop = true;
                }
                MAction::Set { field, value, .. } => {
                    let id = match &field.kind {
                        MOperandKind::Dotted(h, f) if h.name != "meta" => {
                            self.field(h, f, field.span)
                        }
                        _ => {
                            self.error(
                                Diagnostic::error(
                                    E_UNKNOWN,
                                    "`set` rewrites a packet field",
                                    field.span,
                                )
                                .hint("registers and metadata are assigned with `NAME := VALUE`"),
                            );
                            None
                        }
                    };
                    if let Some(id) = id {
                        if write_place(&self.fields[id as usize].source).is_none() {
                            self.error(Diagnostic::error(
                                E_PLACE,
                                format!(
                                    "`{}` has no fixed place in the frame, so `set` cannot write it",
                                    self.fields[id as usize].name
                                ),
                                field.span,
                            ));
                        }
                    }
                    let v = self.operand(scope, value);
                    if let (Some(id), Some(v)) = (id, v) {
                        out.writes.push((id, v));
                    }
                }
                MAction::Goto(s, span) => {
                    if out.next_stage.is_some() {
                        self.error(Diagnostic::error(
                            E_CONFLICT,
                            "a transition goes on to one stage",
                            *span,
                        ));
                        continue;
                    }
                    match self.stage_names.iter().position(|n| *n == s.name) {
                        Some(i) if i > scope.index => out.next_stage = Some(i as u16),
                        Some(_) => self.error(
                            Diagnostic::error(
                                E_BACKWARD,
                                format!("stage `{}` does not come after this one", s.name),
                                s.span,
                            )
                            .label("not a later stage")
                            .hint("packets only go forward through the stages, so every packet's walk ends"),
                        ),
                        None => self.error(Diagnostic::error(
                            E_UNKNOWN,
                            format!("no stage `{}`", s.name),
                            s.span,
                        )),
                    }
                }
            }
        }
        if let (Some(f), Some(d)) = (forward_span, drop_span) {
            self.error(
                Diagnostic::error(E_CONFLICT, "a transition both forwards and drops", d)
                    .also(f, "forwarded here"),
            );
        }
        (self.diags.len() == errors).then_some(out)
    }

    fn expr(&mut self, scope: &Scope, e: &MExpr) -> Option<Expr> {
        match e {
            MExpr::Operand(o) => self.operand(scope, o).map(Expr::Operand),
            MExpr::Binary(op, a, b, _) => {
                let op = match op {
                    BinOp::Add => ArithOp::Add,
                    BinOp::Sub => ArithOp::Sub,
                    BinOp::Mul => ArithOp::Mul,
                    BinOp::Div => ArithOp::Div,
                    _ => ArithOp::Mod,
                };
                let (a, b) = (self.operand(scope, a), self.operand(scope, b));
                Some(Expr::Binary(op, a?, b?))
            }
            MExpr::Call(f, a, b, _) => {
                let op = match f.name.as_str() {
                    "max" => ArithOp::Max,
                    _ => ArithOp::Min,
                };
                let (a, b) = (self.operand(scope, a), self.operand(scope, b));
                Some(Expr::Binary(op, a?, b?))
            }
        }
    }
}

#[cfg(test)]
mod tests;
