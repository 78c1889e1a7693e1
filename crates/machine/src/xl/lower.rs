//! The syntax tree of a load (every file merged) to a [`Machine`]: names
//! resolved, actions inlined, each `if` (and each unconditional body) one
//! transition.

use super::parser::{ActionDecl, Cond, ExprAst, Ident, Pos, RegDecl, Stmt, Term, XlFile};
use super::XlError;
use crate::fields::{write_place, xl_field, FieldSource, XL_FIELDS};
use crate::lang::E_CAPACITY;
use crate::model::{
    Condition, Event, Eviction, Expr, FieldDef, FieldId, Machine, Operand, Register, Stage,
    StateId, Target, Transition, Update, DEFAULT_CAPACITY, MAX_CAPACITY, MAX_KEY, MAX_PORTS,
};
use std::collections::HashMap;

type R<T> = Result<T, XlError>;

/// XL's packet: `sendPacket(PKT, n)` names it by this number.
const PKT: u64 = 255;
/// Depth of actions calling actions before it is called a loop.
const MAX_INLINE: usize = 16;

struct Lower<'a> {
    err: &'a dyn Fn(Pos, String) -> XlError,
    defined: HashMap<String, (u64, u64, Pos)>,
    constants: HashMap<String, u64>,
    fields: Vec<FieldDef>,
    globals: Vec<Register>,
    stage_names: Vec<String>,
}

/// What one stage's names resolve to.
struct Scope<'a> {
    flow: &'a [Register],
    states: &'a [String],
    actions: HashMap<&'a str, &'a ActionDecl>,
    stage: usize,
}

#[derive(Default)]
struct Effects {
    updates: Vec<Update>,
    next_state: Option<StateId>,
    ports: u64,
    writes: Vec<(FieldId, Operand)>,
    next_stage: Option<u16>,
}

pub fn lower(file: &XlFile, err: &dyn Fn(Pos, String) -> XlError) -> R<Machine> {
    let mut l = Lower {
        err,
        defined: HashMap::new(),
        constants: HashMap::new(),
        fields: Vec::new(),
        globals: Vec::new(),
        stage_names: file.stages.iter().map(|s| s.name.name.clone()).collect(),
    };
    for f in &file.fields {
        if let Some((o, n, _)) = l.defined.get(&f.name) {
            if (*o, *n) != (f.offset, f.len) {
                return Err(err(
                    f.pos,
                    format!("packet field `{}` is defined twice, differently", f.name),
                ));
            }
        }
        l.defined.insert(f.name.clone(), (f.offset, f.len, f.pos));
    }
    for (name, v) in &file.constants {
        if l.constants.insert(name.name.clone(), *v).is_some() {
            return Err(err(
                name.pos,
                format!("constant `{}` is defined twice", name.name),
            ));
        }
    }
    if file.stages.is_empty() {
        return Err(err(Pos::default(), "the program has no `Stage`".into()));
    }
    let mut seen = HashMap::new();
    for s in &file.stages {
        if seen.insert(s.name.name.as_str(), ()).is_some() {
            return Err(err(
                s.name.pos,
                format!("stage `{}` is defined twice", s.name.name),
            ));
        }
    }
    let file_flow: Vec<&RegDecl> = file.regs.iter().filter(|r| !r.global).collect();
    for r in file.regs.iter().filter(|r| r.global).chain(
        file.stages
            .iter()
            .flat_map(|s| s.regs.iter().filter(|r| r.global)),
    ) {
        l.declare(&mut Vec::new(), r)?;
    }
    let mut stages = Vec::new();
    for (si, decl) in file.stages.iter().enumerate() {
        let mut flow = Vec::new();
        for r in file_flow
            .iter()
            .copied()
            .chain(decl.regs.iter().filter(|r| !r.global))
        {
            l.declare(&mut flow, r)?;
        }
        let mut states: Vec<String> = Vec::new();
        let mut initial = None;
        for st in &decl.states {
            if st.name.name == "any" {
                if st.initial {
                    return Err(err(
                        st.name.pos,
                        "`any` stands for every state; it cannot be initial".into(),
                    ));
                }
                continue;
            }
            if states.contains(&st.name.name) {
                return Err(err(
                    st.name.pos,
                    format!("state `{}` is defined twice", st.name.name),
                ));
            }
            if st.initial {
                if initial.is_some() {
                    return Err(err(
                        st.name.pos,
                        format!("a second initial state, `{}`", st.name.name),
                    ));
                }
                initial = Some(states.len() as StateId);
            }
            states.push(st.name.name.clone());
        }
        let Some(initial) = initial else {
            return Err(err(
                decl.name.pos,
                format!(
                    "stage `{}` has no initial state: write `State initial NAME {{ ... }}`",
                    decl.name.name
                ),
            ));
        };
        let mut actions: HashMap<&str, &ActionDecl> = file
            .actions
            .iter()
            .map(|a| (a.name.name.as_str(), a))
            .collect();
        for a in &decl.actions {
            actions.insert(a.name.name.as_str(), a);
        }
        let scope = Scope {
            flow: &flow,
            states: &states,
            actions,
            stage: si,
        };
        let mut stage = Stage {
            name: decl.name.name.clone(),
            key: Vec::new(),
            biflow: false,
            states: states.clone(),
            initial,
            flow_regs: flow.clone(),
            transitions: Vec::new(),
            idle_timeout_us: None,
            hard_timeout_us: None,
            capacity: DEFAULT_CAPACITY,
            eviction: Eviction::Expired,
        };
        for s in &decl.body {
            l.stage_setting(&scope, &mut stage, s)?;
        }
        if stage.key.is_empty() {
            return Err(err(
                decl.name.pos,
                format!(
                    "stage `{}` has no flow key: add `setFlowKey(FIELD, ...);`",
                    decl.name.name
                ),
            ));
        }
        for st in &decl.states {
            let from = states
                .iter()
                .position(|n| *n == st.name.name)
                .map(|i| i as StateId);
            let mut has_packet = false;
            for on in &st.on {
                let event = match on.event.name.as_str() {
                    "pktRcvd" => Event::Packet,
                    "idleTimeout" => Event::IdleTimeout,
                    "hardTimeout" => Event::HardTimeout,
                    "tableFull" => Event::TableFull,
                    other => {
                        return Err(err(on.event.pos, format!("unknown event `{other}`: XL here knows pktRcvd, idleTimeout, hardTimeout and tableFull")))
                    }
                };
                let pre: Vec<&Stmt> = if event == Event::Packet {
                    has_packet = true;
                    st.body.iter().chain(&on.body).collect()
                } else {
                    on.body.iter().collect()
                };
                for i in &on.ifs {
                    let when = i
                        .conds
                        .iter()
                        .map(|c| l.condition(&scope, c))
                        .collect::<R<Vec<_>>>()?;
                    let body: Vec<&Stmt> = pre.iter().copied().chain(&i.body).collect();
                    stage
                        .transitions
                        .push(l.transition(&scope, from, event, when, &body)?);
                }
                if !pre.is_empty() {
                    stage
                        .transitions
                        .push(l.transition(&scope, from, event, Vec::new(), &pre)?);
                }
            }
            if !has_packet && !st.body.is_empty() {
                let body: Vec<&Stmt> = st.body.iter().collect();
                stage.transitions.push(l.transition(
                    &scope,
                    from,
                    Event::Packet,
                    Vec::new(),
                    &body,
                )?);
            }
        }
        stages.push(stage);
    }
    Ok(Machine {
        fields: l.fields,
        globals: l.globals,
        stages,
        meta: Vec::new(),
    })
}

impl Lower<'_> {
    fn fail<T>(&self, pos: Pos, msg: String) -> R<T> {
        Err((self.err)(pos, msg))
    }

    fn declare(&mut self, flow: &mut Vec<Register>, r: &RegDecl) -> R<()> {
        let name = &r.name.name;
        if self
            .globals
            .iter()
            .chain(flow.iter())
            .any(|g| g.name == *name)
            || self.constants.contains_key(name)
        {
            return self.fail(r.name.pos, format!("`{name}` is already defined"));
        }
        let reg = Register {
            name: name.clone(),
            init: r.init.unwrap_or(0),
        };
        if r.global {
            self.globals.push(reg);
        } else {
            flow.push(reg);
        }
        Ok(())
    }

    fn field(&mut self, header: &Ident, name: &Ident) -> R<FieldId> {
        let full = format!("{}.{}", header.name, name.name);
        if let Some(i) = self.fields.iter().position(|f| f.name == full) {
            return Ok(i as FieldId);
        }
        let mapped = xl_field(&full);
        let source = match (self.defined.get(&full), mapped) {
            (Some(&(o, n, _)), Some(m)) if m.at == Some((o as u16, n as u8)) => FieldSource::Unit {
                field: m.unit,
                bytes: m.bytes,
                at: m.at,
            },
            (Some(&(o, n, _)), _) => FieldSource::Bytes {
                offset: o as u16,
                len: n as u8,
            },
            (None, Some(m)) => FieldSource::Unit {
                field: m.unit,
                bytes: m.bytes,
                at: None,
            },
            (None, None) => {
                let pos = Pos {
                    end: name.pos.end,
                    ..header.pos
                };
                let known: Vec<&str> = XL_FIELDS.iter().map(|f| f.xl).collect();
                return self.fail(pos, format!("unknown packet field `{full}`: no PacketField defines it and the packet grammar maps no such name (known: {})", known.join(", ")));
            }
        };
        self.fields.push(FieldDef { name: full, source });
        Ok((self.fields.len() - 1) as FieldId)
    }

    fn operand(&mut self, scope: &Scope, t: &Term) -> R<Operand> {
        match t {
            Term::Int(v, _) => Ok(Operand::Const(*v)),
            Term::Name(i) => {
                if let Some(r) = scope.flow.iter().position(|r| r.name == i.name) {
                    Ok(Operand::FlowReg(r as u16))
                } else if let Some(r) = self.globals.iter().position(|r| r.name == i.name) {
                    Ok(Operand::GlobalReg(r as u16))
                } else if let Some(v) = self.constants.get(&i.name) {
                    Ok(Operand::Const(*v))
                } else if i.name == "currentTime" {
                    Ok(Operand::Now)
                } else {
                    self.fail(
                        i.pos,
                        format!(
                            "unknown name `{}`: not a register, constant or `currentTime`",
                            i.name
                        ),
                    )
                }
            }
            Term::Field(a, b) if a.name == "pktRcvd" => match b.name.as_str() {
                "port" => Ok(Operand::InPort),
                "len" => Ok(Operand::Len),
                _ => self.fail(
                    b.pos,
                    format!(
                        "`pktRcvd` has the fields `port` and `len`, not `{}`",
                        b.name
                    ),
                ),
            },
            Term::Field(a, b) => Ok(Operand::Field(self.field(a, b)?)),
        }
    }

    fn constant(&mut self, scope: &Scope, t: &Term, what: &str) -> R<u64> {
        match self.operand(scope, t)? {
            Operand::Const(v) => Ok(v),
            _ => self.fail(t.pos(), format!("{what} must be a number or a constant")),
        }
    }

    fn condition(&mut self, scope: &Scope, c: &Cond) -> R<Condition> {
        Ok(Condition {
            lhs: self.operand(scope, &c.lhs)?,
            op: c.op,
            rhs: self.operand(scope, &c.rhs)?,
        })
    }

    fn stage_setting(&mut self, scope: &Scope, stage: &mut Stage, s: &Stmt) -> R<()> {
        let Stmt::Call { name, args } = s else {
            let Stmt::Assign { target, .. } = s else {
                unreachable!()
            };
            return self.fail(
                target.pos,
                "updates belong in a State (`State NAME { on(pktRcvd) { ... } }`)".into(),
            );
        };
        let one = |l: &mut Self| -> R<u64> {
            match args.as_slice() {
                [a] => l.constant(scope, a, &format!("the argument of {}", name.name)),
                _ => l.fail(name.pos, format!("{} takes one argument", name.name)),
            }
        };
        match name.name.as_str() {
            "setFlowKey" | "setBiflowKey" => {
                let biflow = name.name == "setBiflowKey";
                if !stage.key.is_empty() {
                    return self.fail(name.pos, "the flow key is set twice".into());
                }
                if args.is_empty() || args.len() > MAX_KEY || (biflow && args.len() % 2 == 1) {
                    let what = if biflow {
                        format!("an even number of fields, 2 to {MAX_KEY}: one endpoint's, then the other's")
                    } else {
                        format!("1 to {MAX_KEY} fields")
                    };
                    return self.fail(name.pos, format!("{} takes {what}", name.name));
                }
                for a in args {
                    let Term::Field(h, f) = a else {
                        return self.fail(a.pos(), "a flow key is made of packet fields".into());
                    };
                    if h.name == "pktRcvd" {
                        return self.fail(a.pos(), "a flow key is made of packet fields".into());
                    }
                    let id = self.field(h, f)?;
                    stage.key.push(id);
                }
                stage.biflow = biflow;
            }
            "setIdleTimeout" => stage.idle_timeout_us = Some(one(self)?),
            "setHardTimeout" => stage.hard_timeout_us = Some(one(self)?),
            "setTableSize" => {
                // Bounded as `machine`'s `capacity` is, so that `flick check
                // --bounds` reports a table that can be allocated.
                let n = one(self)?;
                if n == 0 || n > MAX_CAPACITY as u64 {
                    let message = format!(
                        "a stage holds 1 to {MAX_CAPACITY} flow contexts; setTableSize asks for {n}"
                    );
                    return Err((self.err)(args[0].pos(), message).with_code(E_CAPACITY));
                }
                stage.capacity = n as usize;
            }
            "setEvictionPolicy" => {
                stage.eviction = match args.as_slice() {
                    [Term::Name(i)] if i.name == "expired" => Eviction::Expired,
                    [Term::Name(i)] if i.name == "oldest" => Eviction::Oldest,
                    _ => {
                        return self.fail(
                            name.pos,
                            "setEvictionPolicy takes `expired` or `oldest`".into(),
                        )
                    }
                }
            }
            _ => {
                let _ = scope.stage;
                return self.fail(name.pos, format!("`{}` belongs in a State; a Stage's own statements are setFlowKey, setBiflowKey, setIdleTimeout, setHardTimeout, setTableSize and setEvictionPolicy", name.name));
            }
        }
        Ok(())
    }

    fn transition(
        &mut self,
        scope: &Scope,
        from: Option<StateId>,
        event: Event,
        when: Vec<Condition>,
        body: &[&Stmt],
    ) -> R<Transition> {
        let mut fx = Effects::default();
        for s in body {
            self.effect(scope, event, s, &mut fx, 0)?;
        }
        Ok(Transition {
            from,
            event,
            when,
            updates: fx.updates,
            next_state: fx.next_state,
            ports: fx.ports,
            writes: fx.writes,
            next_stage: fx.next_stage,
            drop: false,
        })
    }

    fn effect(
        &mut self,
        scope: &Scope,
        event: Event,
        s: &Stmt,
        fx: &mut Effects,
        depth: usize,
    ) -> R<()> {
        let timeout = matches!(event, Event::IdleTimeout | Event::HardTimeout);
        match s {
            Stmt::Assign { target, expr } => {
                let t = if let Some(r) = scope.flow.iter().position(|r| r.name == target.name) {
                    Target::FlowReg(r as u16)
                } else if let Some(r) = self.globals.iter().position(|r| r.name == target.name) {
                    Target::GlobalReg(r as u16)
                } else {
                    return self.fail(target.pos, format!("`{}` is not a register; only registers are assigned (packet fields with setField)", target.name));
                };
                let expr = match expr {
                    ExprAst::Term(a) => Expr::Operand(self.operand(scope, a)?),
                    ExprAst::Binary(op, a, b) => {
                        Expr::Binary(*op, self.operand(scope, a)?, self.operand(scope, b)?)
                    }
                };
                fx.updates.push(Update { target: t, expr });
            }
            Stmt::Call { name, args } => {
                if let Some(a) = scope.actions.get(name.name.as_str()) {
                    if !args.is_empty() {
                        return self.fail(
                            name.pos,
                            format!("action `{}` takes no arguments", name.name),
                        );
                    }
                    if depth >= MAX_INLINE {
                        return self.fail(name.pos, format!("action `{}` calls itself", name.name));
                    }
                    for s in &a.body {
                        self.effect(scope, event, s, fx, depth + 1)?;
                    }
                    return Ok(());
                }
                let no_packet = |l: &Self| {
                    l.fail::<()>(
                        name.pos,
                        format!("`{}` needs a packet, and a timeout has none", name.name),
                    )
                };
                match (name.name.as_str(), args.as_slice()) {
                    ("sendPacket", [pkt, port]) => {
                        if timeout {
                            return no_packet(self);
                        }
                        if self.constant(scope, pkt, "the packet")? != PKT {
                            return self.fail(
                                pkt.pos(),
                                format!("the first argument of sendPacket is the packet, {PKT}"),
                            );
                        }
                        let n = self.constant(scope, port, "a port")?;
                        if n >= MAX_PORTS as u64 {
                            return self.fail(
                                port.pos(),
                                format!("port {n}: ports are numbered 1 to {}", MAX_PORTS - 1),
                            );
                        }
                        // Port 0 is FlowBlaze's drop.
                        if n > 0 {
                            fx.ports |= 1 << n;
                        }
                    }
                    ("setNextState", [Term::Name(s)]) => {
                        match scope.states.iter().position(|n| *n == s.name) {
                            Some(i) => fx.next_state = Some(i as StateId),
                            None => {
                                return self
                                    .fail(s.pos, format!("no state `{}` in this stage", s.name))
                            }
                        }
                    }
                    ("setNextStage", [Term::Name(s)]) => {
                        match self.stage_names.iter().position(|n| *n == s.name) {
                            Some(i) if i > scope.stage => fx.next_stage = Some(i as u16),
                            Some(_) => return self.fail(s.pos, format!("stage `{}` does not come after this one; packets only go forward", s.name)),
                            None => return self.fail(s.pos, format!("no stage `{}`", s.name)),
                        }
                        if timeout {
                            return no_packet(self);
                        }
                    }
                    ("setField", [Term::Field(h, f), pkt, value]) => {
                        if timeout {
                            return no_packet(self);
                        }
                        if self.constant(scope, pkt, "the packet")? != PKT {
                            return self.fail(
                                pkt.pos(),
                                format!("the second argument of setField is the packet, {PKT}"),
                            );
                        }
                        let id = self.field(h, f)?;
                        if write_place(&self.fields[id as usize].source).is_none() {
                            let pos = Pos {
                                end: f.pos.end,
                                ..h.pos
                            };
                            return self.fail(pos, format!("setField writes at a byte offset: define `{}.{}` with PacketField", h.name, f.name));
                        }
                        let v = self.operand(scope, value)?;
                        fx.writes.push((id, v));
                    }
                    ("sendPacket" | "setNextState" | "setNextStage" | "setField", _) => {
                        let shape = match name.name.as_str() {
                            "sendPacket" => "sendPacket(PKT, PORT)",
                            "setNextState" => "setNextState(STATE)",
                            "setNextStage" => "setNextStage(STAGE)",
                            _ => "setField(HEADER.FIELD, PKT, VALUE)",
                        };
                        return self.fail(name.pos, format!("expected {shape}"));
                    }
                    (
                        "setFlowKey" | "setBiflowKey" | "setIdleTimeout" | "setHardTimeout"
                        | "setTableSize" | "setEvictionPolicy",
                        _,
                    ) => {
                        return self.fail(
                            name.pos,
                            format!("`{}` belongs at stage level, outside the states", name.name),
                        );
                    }
                    _ => return self.fail(name.pos, format!("unknown action `{}`", name.name)),
                }
            }
        }
        Ok(())
    }
}
