//! Lowering checked programs to [`Module`]s of register-machine code.

use crate::code::*;
use flick_check::{CheckedProgram, Ty};
use flick_span::Span;
use flick_syntax::ast::*;
use flick_syntax::format_expr;
use std::collections::HashMap;

/// The most bytes `to_int` reads, and `to_string` writes.
pub(crate) const INT_STRING_MAX: usize = flick_check::builtins::INT_STRING_MAX as usize;

/// A construct the interpreter does not run yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} cannot be compiled yet")]
pub struct Unsupported {
    pub what: String,
    pub span: Span,
}

#[derive(Clone, Copy)]
enum Name {
    Reg(Reg),
    /// A `ref` parameter: its register holds a state reference (or a value).
    RefReg(Reg),
    State(u16),
    Chan(u16),
}

struct FnBuilder {
    code: Vec<Op>,
    /// Per operation, where in the source it comes from (`Function::spans`).
    spans: Vec<u32>,
    /// The source offset of what is being lowered now.
    at: u32,
    next: u16,
    scopes: Vec<Vec<(String, Name)>>,
}

impl FnBuilder {
    fn new(params: &[String]) -> FnBuilder {
        FnBuilder::with_refs(params, &[])
    }

    /// A function whose parameters flagged in `refs` are `ref` parameters.
    fn with_refs(params: &[String], refs: &[bool]) -> FnBuilder {
        let mut b = FnBuilder {
            code: Vec::new(),
            spans: Vec::new(),
            at: 0,
            next: 0,
            scopes: vec![Vec::new()],
        };
        for (i, p) in params.iter().enumerate() {
            let r = b.reg();
            let name = match refs.get(i) {
                Some(true) => Name::RefReg(r),
                _ => Name::Reg(r),
            };
            b.scopes[0].push((p.clone(), name));
        }
        b
    }

    fn reg(&mut self) -> Reg {
        self.next += 1;
        self.next - 1
    }

    fn lookup(&self, name: &str) -> Option<Name> {
        self.scopes
            .iter()
            .rev()
            .flat_map(|s| s.iter().rev())
            .find(|(n, _)| n == name)
            .map(|(_, b)| *b)
    }

    fn here(&self) -> u32 {
        self.code.len() as u32
    }

    /// Appends `op`, lowered from what is at source offset `self.at`.
    fn emit(&mut self, op: Op) {
        self.code.push(op);
        self.spans.push(self.at);
    }

    fn finish(self, name: &str, params: u16) -> Function {
        Function {
            name: name.to_string(),
            params,
            regs: self.next.max(1),
            code: self.code,
            spans: self.spans,
        }
    }
}

struct Lowerer<'a> {
    checked: &'a CheckedProgram,
    funcs: HashMap<&'a str, FuncId>,
    /// Per function, which parameters are `ref`.
    refs: HashMap<&'a str, Vec<bool>>,
    records: HashMap<&'a str, u16>,
    /// Function declarations by name, for compiling `foldt` bodies.
    decls: HashMap<&'a str, &'a FunDecl>,
    module: Module,
}

/// Compiles every function and process of a checked program.
pub fn lower(program: &Program, checked: &CheckedProgram) -> Result<Module, Unsupported> {
    let mut l = Lowerer {
        checked,
        funcs: HashMap::new(),
        refs: HashMap::new(),
        records: HashMap::new(),
        decls: HashMap::new(),
        module: Module::default(),
    };
    for (i, r) in checked.records.iter().enumerate() {
        l.records.insert(&r.name, i as u16);
        l.module.records.push((
            r.name.clone(),
            r.fields.iter().filter_map(|f| f.name.clone()).collect(),
        ));
    }
    let funs: Vec<&FunDecl> = program
        .decls
        .iter()
        .filter_map(|d| match d {
            Decl::Fun(f) => Some(f),
            _ => None,
        })
        .collect();
    for (i, f) in funs.iter().enumerate() {
        l.funcs.insert(&f.name.name, i as FuncId);
        l.decls.insert(&f.name.name, f);
        let refs = f
            .params
            .iter()
            .map(|p| matches!(p.ty.kind, TypeKind::Ref(_)))
            .collect();
        l.refs.insert(&f.name.name, refs);
        l.module.functions.push(Function {
            name: f.name.name.clone(),
            params: f.params.len() as u16,
            regs: 0,
            code: Vec::new(),
            spans: Vec::new(),
        });
    }
    for (i, f) in funs.iter().enumerate() {
        let params: Vec<String> = f.params.iter().map(|p| p.name.name.clone()).collect();
        let mut b = FnBuilder::with_refs(&params, &l.refs[f.name.name.as_str()]);
        let v = l.block(&mut b, &f.body)?;
        b.emit(Op::Return { src: v });
        l.module.functions[i] = b.finish(&f.name.name, params.len() as u16);
    }
    for d in &program.decls {
        if let Decl::Proc(p) = d {
            let code = l.process(p)?;
            l.module.processes.push(code);
        }
    }
    Ok(l.module)
}

impl<'a> Lowerer<'a> {
    fn add_function(&mut self, f: Function) -> FuncId {
        self.module.functions.push(f);
        self.module.functions.len() as FuncId - 1
    }

    fn process(&mut self, p: &ProcDecl) -> Result<ProcessCode, Unsupported> {
        let channels: Vec<String> = p.params.iter().map(|c| c.name.name.clone()).collect();
        let state: Vec<(String, StateScope)> = p
            .items
            .iter()
            .filter_map(|i| match i {
                ProcItem::State(s) => Some((s.name.name.clone(), s.scope)),
                _ => None,
            })
            .collect();
        let scope = |b: &mut FnBuilder| {
            for (i, c) in channels.iter().enumerate() {
                b.scopes[0].push((c.clone(), Name::Chan(i as u16)));
            }
            for (i, (s, _)) in state.iter().enumerate() {
                b.scopes[0].push((s.clone(), Name::State(i as u16)));
            }
        };
        // State initialisation, in declaration order.
        let mut b = FnBuilder::new(&[]);
        scope(&mut b);
        let mut n = 0;
        for item in &p.items {
            if let ProcItem::State(s) = item {
                let v = self.expr(&mut b, &s.init)?;
                b.emit(Op::StoreState { state: n, src: v });
                n += 1;
            }
        }
        let unit = b.reg();
        b.emit(Op::Const {
            dst: unit,
            value: Const::Unit,
        });
        b.emit(Op::Return { src: unit });
        let init = self.add_function(b.finish(&format!("{}.init", p.name.name), 0));
        let mut items = Vec::new();
        for item in &p.items {
            let (name, params, source, label): (String, Vec<String>, Option<u16>, String) =
                match item {
                    ProcItem::State(_) => continue,
                    ProcItem::Rule(r) => (
                        "rule".into(),
                        vec!["$msg".into()],
                        channel_index(&r.source, &channels),
                        rule_label(r),
                    ),
                    ProcItem::Guarded(g) => (
                        "guard".into(),
                        vec![],
                        None,
                        format!("if {}", format_expr(&g.cond, 0, 0)),
                    ),
                    ProcItem::Handler(h) => (
                        "handler".into(),
                        h.index.iter().map(|i| i.name.clone()).collect(),
                        channels
                            .iter()
                            .position(|c| *c == h.channel.name)
                            .map(|i| i as u16),
                        format!("on {}({})", h.event.name, h.channel.name),
                    ),
                };
            let mut b = FnBuilder::new(&params);
            scope(&mut b);
            let result = match item {
                ProcItem::Rule(r) => self.rule(&mut b, r)?,
                ProcItem::Guarded(g) => {
                    let c = self.expr(&mut b, &g.cond)?;
                    let out = b.reg();
                    b.emit(Op::Const {
                        dst: out,
                        value: Const::Unit,
                    });
                    let jump = b.code.len();
                    b.emit(Op::JumpIfFalse { cond: c, to: 0 });
                    self.block(&mut b, &g.body)?;
                    let end = b.here();
                    b.code[jump] = Op::JumpIfFalse { cond: c, to: end };
                    out
                }
                ProcItem::Handler(h) => self.block(&mut b, &h.body)?,
                ProcItem::State(_) => unreachable!(),
            };
            b.emit(Op::Return { src: result });
            let func = self
                .add_function(b.finish(&format!("{}.{name}", p.name.name), params.len() as u16));
            items.push(ItemCode {
                func,
                source,
                label,
            });
        }
        let checked_state = self
            .checked
            .processes
            .iter()
            .find(|c| c.name == p.name.name)
            .map(|c| &c.state[..])
            .unwrap_or_default();
        let tables = p
            .items
            .iter()
            .filter_map(|i| match i {
                ProcItem::State(s) => Some(s),
                _ => None,
            })
            .enumerate()
            .map(|(i, s)| {
                let mut policy = table_policy(s.ty.as_ref());
                policy.object = checked_state.get(i).and_then(|v| state_object(&v.ty));
                policy
            })
            .collect();
        Ok(ProcessCode {
            name: p.name.name.clone(),
            channels,
            state,
            tables,
            init,
            items,
        })
    }

    /// `source => steps`: the message is in register 0.
    fn rule(&mut self, b: &mut FnBuilder, r: &Rule) -> Result<Reg, Unsupported> {
        let mut flowing: Reg = 0;
        for step in &r.steps {
            match &step.kind {
                ExprKind::Call(f, args) if self.funcs.contains_key(f.name.as_str()) => {
                    let mut regs = self.args(b, &f.name, args)?;
                    regs.push(flowing);
                    let dst = b.reg();
                    b.emit(Op::Call {
                        dst,
                        func: self.funcs[f.name.as_str()],
                        args: regs.into(),
                    });
                    flowing = dst;
                }
                _ => {
                    let chan = self.expr(b, step)?;
                    b.emit(Op::Send { src: flowing, chan });
                    let unit = b.reg();
                    b.emit(Op::Const {
                        dst: unit,
                        value: Const::Unit,
                    });
                    flowing = unit;
                }
            }
        }
        Ok(flowing)
    }

    fn block(&mut self, b: &mut FnBuilder, block: &Block) -> Result<Reg, Unsupported> {
        b.scopes.push(Vec::new());
        let mut last = None;
        for s in &block.stmts {
            last = self.stmt(b, s)?;
        }
        b.scopes.pop();
        Ok(match last {
            Some(r) => r,
            None => {
                let r = b.reg();
                b.emit(Op::Const {
                    dst: r,
                    value: Const::Unit,
                });
                r
            }
        })
    }

    /// Lowers a statement; returns its value's register if it has one.
    fn stmt(&mut self, b: &mut FnBuilder, s: &Stmt) -> Result<Option<Reg>, Unsupported> {
        b.at = s.span.start;
        match &s.kind {
            StmtKind::Let { name, value, .. } => {
                let v = self.expr(b, value)?;
                // A fresh register, so later rebinding cannot clobber it.
                let r = b.reg();
                b.emit(Op::Move { dst: r, src: v });
                b.scopes
                    .last_mut()
                    .unwrap()
                    .push((name.name.clone(), Name::Reg(r)));
                Ok(None)
            }
            StmtKind::Assign { place, value } => {
                let v = self.expr(b, value)?;
                match &place.kind {
                    ExprKind::Var(x) => match b.lookup(&x.name) {
                        Some(Name::State(i)) => b.emit(Op::StoreState { state: i, src: v }),
                        Some(Name::Reg(r)) => b.emit(Op::Move { dst: r, src: v }),
                        Some(Name::RefReg(r)) => b.emit(Op::StoreRef { target: r, src: v }),
                        _ => return Err(self.unsupported("this assignment", place.span)),
                    },
                    ExprKind::Index(base, index) => {
                        let base = self.expr(b, base)?;
                        let index = self.expr(b, index)?;
                        b.emit(Op::IndexSet {
                            base,
                            index,
                            src: v,
                        });
                    }
                    _ => return Err(self.unsupported("this assignment", place.span)),
                }
                Ok(None)
            }
            StmtKind::Send { value, channel } => {
                let v = self.expr(b, value)?;
                let c = self.expr(b, channel)?;
                b.emit(Op::Send { src: v, chan: c });
                Ok(None)
            }
            StmtKind::If {
                cond,
                then,
                otherwise,
            } => {
                let c = self.expr(b, cond)?;
                let out = b.reg();
                let jump_else = b.code.len();
                b.emit(Op::JumpIfFalse { cond: c, to: 0 });
                let t = self.block(b, then)?;
                b.emit(Op::Move { dst: out, src: t });
                let jump_end = b.code.len();
                b.emit(Op::Jump { to: 0 });
                let else_at = b.here();
                b.code[jump_else] = Op::JumpIfFalse {
                    cond: c,
                    to: else_at,
                };
                match otherwise {
                    Some(o) => {
                        let e = self.block(b, o)?;
                        b.emit(Op::Move { dst: out, src: e });
                    }
                    None => b.emit(Op::Const {
                        dst: out,
                        value: Const::Unit,
                    }),
                }
                let end = b.here();
                b.code[jump_end] = Op::Jump { to: end };
                Ok(Some(out))
            }
            StmtKind::Expr(e) => Ok(Some(self.expr(b, e)?)),
        }
    }

    fn unsupported(&self, what: &str, span: Span) -> Unsupported {
        Unsupported {
            what: what.to_string(),
            span,
        }
    }

    fn constant(b: &mut FnBuilder, value: Const) -> Reg {
        let dst = b.reg();
        b.emit(Op::Const { dst, value });
        dst
    }

    /// Lowers `e`; its operations are marked with where it starts.
    fn expr(&mut self, b: &mut FnBuilder, e: &Expr) -> Result<Reg, Unsupported> {
        let outer = std::mem::replace(&mut b.at, e.span.start);
        let r = self.expr_here(b, e);
        b.at = outer;
        r
    }

    fn expr_here(&mut self, b: &mut FnBuilder, e: &Expr) -> Result<Reg, Unsupported> {
        Ok(match &e.kind {
            ExprKind::Int { value, .. } => Self::constant(b, Const::Int(*value as i64)),
            ExprKind::Str(s) => Self::constant(b, Const::Str(s.as_bytes().into())),
            ExprKind::Bool(v) => Self::constant(b, Const::Bool(*v)),
            ExprKind::None => Self::constant(b, Const::None),
            ExprKind::Anonymous => return Err(self.unsupported("`_`", e.span)),
            ExprKind::Var(v) => match b.lookup(&v.name) {
                Some(Name::Reg(r)) => r,
                Some(Name::RefReg(r)) => {
                    let dst = b.reg();
                    b.emit(Op::Deref { dst, src: r });
                    dst
                }
                Some(Name::State(i)) => {
                    let dst = b.reg();
                    b.emit(Op::LoadState { dst, state: i });
                    dst
                }
                Some(Name::Chan(i)) => {
                    let dst = b.reg();
                    b.emit(Op::Chan { dst, chan: i });
                    dst
                }
                // A fresh meter or Bloom filter, like a fresh dictionary,
                // gets its storage when it is stored in state.
                None if matches!(v.name.as_str(), "empty_dict" | "new_meter" | "new_bloom") => {
                    let dst = b.reg();
                    b.emit(Op::Builtin {
                        f: Builtin::EmptyDict,
                        dst,
                        args: Box::new([]),
                    });
                    dst
                }
                None => return Err(self.unsupported(&format!("`{}`", v.name), v.span)),
            },
            ExprKind::Unary(op, x) => {
                let src = self.expr(b, x)?;
                let dst = b.reg();
                b.emit(Op::Unary { op: *op, dst, src });
                dst
            }
            ExprKind::Binary(op @ (BinOp::And | BinOp::Or), x, y) => {
                // Short-circuit: the right side runs only when it decides.
                let dst = b.reg();
                let l = self.expr(b, x)?;
                b.emit(Op::Move { dst, src: l });
                let skip = b.code.len();
                let test = b.reg();
                if *op == BinOp::Or {
                    b.emit(Op::Unary {
                        op: UnOp::Not,
                        dst: test,
                        src: l,
                    });
                } else {
                    b.emit(Op::Move { dst: test, src: l });
                }
                b.emit(Op::JumpIfFalse { cond: test, to: 0 });
                let r = self.expr(b, y)?;
                b.emit(Op::Move { dst, src: r });
                let end = b.here();
                b.code[skip + 1] = Op::JumpIfFalse {
                    cond: test,
                    to: end,
                };
                dst
            }
            ExprKind::Binary(op, x, y) => {
                let a = self.expr(b, x)?;
                let c = self.expr(b, y)?;
                let dst = b.reg();
                b.emit(Op::Binary {
                    op: *op,
                    dst,
                    a,
                    b: c,
                });
                dst
            }
            ExprKind::Field(x, f) => {
                let src = self.expr(b, x)?;
                let record = match self
                    .checked
                    .expr_types
                    .get(&x.span)
                    .map(|t| t.behind_refs())
                {
                    Some(Ty::Record(id, _)) => *id,
                    _ => {
                        return Err(
                            self.unsupported("a field of a value that is not a record", e.span)
                        )
                    }
                };
                // Fields are numbered among the named ones, as in `Module::records`.
                let field = self.checked.records[record]
                    .fields
                    .iter()
                    .filter_map(|fl| fl.name.as_deref())
                    .position(|n| n == f.name)
                    .ok_or_else(|| self.unsupported("an unknown field", f.span))?;
                let dst = b.reg();
                b.emit(Op::Field {
                    dst,
                    src,
                    record: record as u16,
                    field: field as u16,
                });
                dst
            }
            ExprKind::Index(x, i) => {
                let base = self.expr(b, x)?;
                let index = self.expr(b, i)?;
                let dst = b.reg();
                b.emit(Op::Index { dst, base, index });
                dst
            }
            ExprKind::Call(f, args) if matches!(f.name.as_str(), "fold" | "map" | "filter") => {
                self.iteration(b, f, args)?
            }
            ExprKind::Call(f, args) if f.name == "broadcast" && args.len() == 2 => {
                self.broadcast(b, &args[0], &args[1])?
            }
            ExprKind::Call(f, args) => {
                let regs = self.args(b, &f.name, args)?;
                let dst = b.reg();
                let name = f.name.as_str();
                if let Some(&func) = self.funcs.get(name) {
                    b.emit(Op::Call {
                        dst,
                        func,
                        args: regs.into(),
                    });
                } else if let Some(&record) = self.records.get(name) {
                    b.emit(Op::Record {
                        dst,
                        record,
                        args: regs.into(),
                    });
                } else {
                    let f = match (name, Builtin::by_name(name)) {
                        (_, Some(b)) => b,
                        ("header", None) => match self
                            .checked
                            .expr_types
                            .get(&args[0].span)
                            .map(Ty::behind_refs)
                        {
                            Some(Ty::Record(id, _)) => Builtin::Header { record: *id as u16 },
                            _ => {
                                return Err(self.unsupported(
                                    "`header` of a value that is not a record",
                                    args[0].span,
                                ))
                            }
                        },
                        _ => return Err(self.unsupported(&format!("`{name}`"), f.span)),
                    };
                    b.emit(Op::Builtin {
                        f,
                        dst,
                        args: regs.into(),
                    });
                }
                dst
            }
            ExprKind::Tuple(es) => {
                let mut items = Vec::new();
                for x in es {
                    items.push(self.expr(b, x)?);
                }
                let dst = b.reg();
                b.emit(Op::Tuple {
                    dst,
                    items: items.into(),
                });
                dst
            }
            ExprKind::List(es) => {
                let mut items = Vec::new();
                for x in es {
                    items.push(self.expr(b, x)?);
                }
                let dst = b.reg();
                b.emit(Op::List {
                    dst,
                    items: items.into(),
                });
                dst
            }
            ExprKind::Foldt(f) => self.foldt(b, f)?,
        })
    }
}

impl Lowerer<'_> {
    /// The arguments of a call of `f`: a `ref` parameter gets a reference
    /// to the state variable (or the caller's own `ref`) it is given, so
    /// that assigning to it writes the state; other parameters get values.
    fn args(&mut self, b: &mut FnBuilder, f: &str, args: &[Expr]) -> Result<Vec<Reg>, Unsupported> {
        let mut refs = self.refs.get(f).cloned().unwrap_or_default();
        if !self.funcs.contains_key(f) && OBJECT_BUILTINS.contains(&f) {
            // A meter or Bloom filter is state the host keeps: the
            // built-in gets a reference to it.
            refs = vec![true];
        }
        let mut regs = Vec::new();
        for (i, a) in args.iter().enumerate() {
            let by_ref = refs.get(i).copied().unwrap_or(false);
            let name = match &a.kind {
                ExprKind::Var(v) if by_ref => b.lookup(&v.name),
                _ => None,
            };
            let r = match name {
                Some(Name::State(s)) => {
                    let dst = b.reg();
                    b.emit(Op::StateRef { dst, state: s });
                    dst
                }
                Some(Name::RefReg(r)) => r,
                _ => self.expr(b, a)?,
            };
            regs.push(r);
        }
        Ok(regs)
    }

    /// `broadcast(value, chans)` as a loop of sends, one per channel of
    /// the array. A send to a full channel suspends at that send, with the
    /// loop's index in its register, so the run resumes with the channel
    /// that was full and sends to each channel once.
    fn broadcast(
        &mut self,
        b: &mut FnBuilder,
        value: &Expr,
        chans: &Expr,
    ) -> Result<Reg, Unsupported> {
        let v = self.expr(b, value)?;
        let chans = self.expr(b, chans)?;
        Self::each_element(b, chans, |b, chan| b.emit(Op::Send { src: v, chan }));
        Ok(Self::constant(b, Const::Unit))
    }

    /// A loop over the elements of `seq` (a list or a channel array), by
    /// index: `body` emits what is done with each (in a register it is
    /// given), and each back-edge checks the timeslice.
    fn each_element(b: &mut FnBuilder, seq: Reg, body: impl FnOnce(&mut FnBuilder, Reg)) {
        let n = b.reg();
        b.emit(Op::Builtin {
            f: Builtin::Len,
            dst: n,
            args: Box::new([seq]),
        });
        let i = Self::constant(b, Const::Int(0));
        let one = Self::constant(b, Const::Int(1));
        let more = b.reg();
        let head = b.here();
        b.emit(Op::Binary {
            op: BinOp::Lt,
            dst: more,
            a: i,
            b: n,
        });
        let exit = b.code.len();
        b.emit(Op::JumpIfFalse { cond: more, to: 0 });
        let elem = b.reg();
        b.emit(Op::Index {
            dst: elem,
            base: seq,
            index: i,
        });
        body(b, elem);
        b.emit(Op::Binary {
            op: BinOp::Add,
            dst: i,
            a: i,
            b: one,
        });
        b.emit(Op::CheckSlice);
        b.emit(Op::Jump { to: head });
        let end = b.here();
        b.code[exit] = Op::JumpIfFalse {
            cond: more,
            to: end,
        };
    }

    /// `foldt on CHANS ordering elem A, B by elem.F as K: BODY` as a loop:
    /// take the element with the least key, then fold every other element
    /// with that key into it with BODY (A the running value, B the next
    /// element, K the key). Each back-edge checks the timeslice.
    fn foldt(&mut self, b: &mut FnBuilder, f: &Foldt) -> Result<Reg, Unsupported> {
        let record = match self.checked.expr_types.get(&f.channels.span) {
            Some(Ty::ChanArray(c, _)) => match c.input.as_deref().map(Ty::behind_refs) {
                Some(Ty::Record(id, _)) => *id,
                _ => return Err(self.unsupported("`foldt` over non-records", f.channels.span)),
            },
            _ => return Err(self.unsupported("`foldt` over this", f.channels.span)),
        };
        let field = self.checked.records[record]
            .fields
            .iter()
            .filter_map(|fl| fl.name.as_deref())
            .position(|n| n == f.order_field.name)
            .ok_or_else(|| self.unsupported("an unknown field", f.order_field.span))?
            as u16;
        let record = record as u16;
        let chans = self.expr(b, &f.channels)?;
        let acc = b.reg();
        b.emit(Op::Merge {
            dst: acc,
            chans,
            record,
            field,
            key: None,
        });
        let first = b.reg();
        b.emit(Op::Move {
            dst: first,
            src: acc,
        });
        let none = Self::constant(b, Const::None);
        let some = b.reg();
        b.emit(Op::Binary {
            op: BinOp::Ne,
            dst: some,
            a: acc,
            b: none,
        });
        let empty = b.code.len();
        b.emit(Op::JumpIfFalse { cond: some, to: 0 });
        let key = b.reg();
        b.emit(Op::Field {
            dst: key,
            src: acc,
            record,
            field,
        });
        // A body the host can fold natively goes first; the interpreted
        // loop after it runs where the host cannot.
        let native = self.fold_spec(f, record, field).map(|spec| {
            let accs: Box<[Reg]> = spec
                .accs
                .iter()
                .map(|_| Self::constant(b, Const::Int(0)))
                .collect();
            let count = Self::constant(b, Const::Int(0));
            let at = b.code.len();
            let args = spec
                .args
                .iter()
                .map(|a| match a {
                    crate::fold::FoldArg::Key => key,
                    crate::fold::FoldArg::Acc(i) => accs[*i as usize],
                })
                .collect();
            b.emit(Op::MergeFold {
                chans,
                record,
                field,
                key,
                first,
                accs,
                count,
                fold: std::sync::Arc::new(spec),
                fallback: 0,
            });
            // One element: the result is that element, as the loop leaves it.
            let zero = Self::constant(b, Const::Int(0));
            let folded = b.reg();
            b.emit(Op::Binary {
                op: BinOp::Ne,
                dst: folded,
                a: count,
                b: zero,
            });
            let single = b.code.len();
            b.emit(Op::JumpIfFalse {
                cond: folded,
                to: 0,
            });
            b.emit(Op::Record {
                dst: acc,
                record,
                args,
            });
            let done = b.code.len();
            b.emit(Op::Jump { to: 0 });
            let fallback = b.here();
            if let Op::MergeFold { fallback: to, .. } = &mut b.code[at] {
                *to = fallback;
            }
            (single, done)
        });
        let head = b.here();
        let next = b.reg();
        b.emit(Op::Merge {
            dst: next,
            chans,
            record,
            field,
            key: Some(key),
        });
        let more = b.reg();
        b.emit(Op::Binary {
            op: BinOp::Ne,
            dst: more,
            a: next,
            b: none,
        });
        let exit = b.code.len();
        b.emit(Op::JumpIfFalse { cond: more, to: 0 });
        b.scopes.push(vec![
            (f.left.name.clone(), Name::Reg(acc)),
            (f.right.name.clone(), Name::Reg(next)),
            (f.key.name.clone(), Name::Reg(key)),
        ]);
        let v = self.block(b, &f.body)?;
        b.scopes.pop();
        // The step's inputs are dead unless the body passed one on; the
        // first element stays, since the key's bytes are in it.
        b.emit(Op::Release {
            src: acc,
            unless: Box::new([v, first]),
        });
        b.emit(Op::Release {
            src: next,
            unless: Box::new([v, first]),
        });
        b.emit(Op::Move { dst: acc, src: v });
        b.emit(Op::CheckSlice);
        b.emit(Op::Jump { to: head });
        let end = b.here();
        b.code[empty] = Op::JumpIfFalse {
            cond: some,
            to: end,
        };
        b.code[exit] = Op::JumpIfFalse {
            cond: more,
            to: end,
        };
        if let Some((single, done)) = native {
            if let Op::JumpIfFalse { to, .. } = &mut b.code[single] {
                *to = end;
            }
            b.code[done] = Op::Jump { to: end };
        }
        Ok(acc)
    }

    /// The body of `f` as a [`FoldSpec`](crate::fold::FoldSpec), where it
    /// builds the element record again from the key (in the ordering
    /// field) and integer arithmetic over the two elements' fields,
    /// through `let`s and calls of functions of the same kind; `None` for
    /// anything else (the interpreter runs it).
    fn fold_spec(&self, f: &Foldt, record: u16, field: u16) -> Option<crate::fold::FoldSpec> {
        use crate::fold::{FoldArg, FoldExpr, MAX_ACCS};
        let names = &self.module.records.get(record as usize)?.1;
        if names.len() > MAX_ACCS + 1 {
            return None;
        }
        let mut fx = FoldCx {
            names,
            key_field: field,
            next_fields: Vec::new(),
        };
        let mut env = vec![
            (f.left.name.as_str(), Sym::Left),
            (f.right.name.as_str(), Sym::Right),
            (f.key.name.as_str(), Sym::Key),
        ];
        let last = self.fold_block(&f.body, &mut env, &mut fx, 0)?;
        let ExprKind::Call(ctor, args) = &last.kind else {
            return None;
        };
        let ctor = ctor.name.as_str();
        if self.funcs.contains_key(ctor) || self.records.get(ctor) != Some(&record) {
            return None;
        }
        if args.len() != names.len() {
            return None;
        }
        let mut out = Vec::new();
        let mut accs = Vec::new();
        for (i, a) in args.iter().enumerate() {
            match (self.fold_value(a, &env, &mut fx, 0)?, i == field as usize) {
                (FoldVal::Key, true) => out.push(FoldArg::Key),
                (FoldVal::Int(e), false) => {
                    out.push(FoldArg::Acc(accs.len() as u16));
                    accs.push((i as u16, e));
                }
                _ => return None,
            }
        }
        // (Running values are numbered as the fields that are not the key,
        // as `fold_value` numbers `A.f`.)
        let accs: Vec<(u16, FoldExpr)> = accs;
        if fx.next_fields.len() > MAX_ACCS {
            return None;
        }
        Some(crate::fold::FoldSpec::new(out, accs, fx.next_fields))
    }

    /// The `let`s of `block` into `env`; its last statement's expression.
    fn fold_block<'b>(
        &self,
        block: &'b Block,
        env: &mut Vec<(&'b str, Sym)>,
        fx: &mut FoldCx,
        depth: usize,
    ) -> Option<&'b Expr> {
        let (last, lets) = block.stmts.split_last()?;
        for s in lets {
            let StmtKind::Let { name, value, .. } = &s.kind else {
                return None;
            };
            let v = match self.fold_value(value, env, fx, depth)? {
                FoldVal::Int(e) => Sym::Val(e),
                FoldVal::Key => Sym::Key,
            };
            env.push((name.name.as_str(), v));
        }
        match &last.kind {
            StmtKind::Expr(e) => Some(e),
            _ => None,
        }
    }

    fn fold_value(
        &self,
        e: &Expr,
        env: &[(&str, Sym)],
        fx: &mut FoldCx,
        depth: usize,
    ) -> Option<FoldVal> {
        use crate::fold::FoldExpr;
        if depth > 64 {
            return None;
        }
        let lookup = |n: &str| env.iter().rev().find(|(m, _)| *m == n).map(|(_, s)| s);
        let int = |v: Option<FoldVal>| match v? {
            FoldVal::Int(e) => Some(e),
            FoldVal::Key => None,
        };
        Some(match &e.kind {
            ExprKind::Int { value, .. } => {
                FoldVal::Int(FoldExpr::Const(i64::try_from(*value).ok()?))
            }
            ExprKind::Var(id) => match lookup(&id.name)? {
                Sym::Val(x) => FoldVal::Int(x.clone()),
                Sym::Key => FoldVal::Key,
                Sym::Left | Sym::Right => return None,
            },
            ExprKind::Field(inner, name) => {
                let ExprKind::Var(id) = &inner.kind else {
                    return None;
                };
                let side = lookup(&id.name)?;
                let i = fx.names.iter().position(|n| *n == name.name)?;
                if i == fx.key_field as usize {
                    // Equal to the key in both elements.
                    return matches!(side, Sym::Left | Sym::Right).then_some(FoldVal::Key);
                }
                match side {
                    Sym::Left => {
                        // Running value: numbered among the fields that are
                        // not the key, as `fold_spec` numbers them.
                        let acc = i - usize::from(i > fx.key_field as usize);
                        FoldVal::Int(FoldExpr::Acc(acc as u16))
                    }
                    Sym::Right => {
                        let j = match fx.next_fields.iter().position(|&f| f as usize == i) {
                            Some(j) => j,
                            None => {
                                fx.next_fields.push(i as u16);
                                fx.next_fields.len() - 1
                            }
                        };
                        FoldVal::Int(FoldExpr::Next(j as u16))
                    }
                    _ => return None,
                }
            }
            ExprKind::Unary(UnOp::Neg, x) => FoldVal::Int(FoldExpr::Neg(Box::new(int(
                self.fold_value(x, env, fx, depth + 1)
            )?))),
            ExprKind::Binary(
                op @ (BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod),
                x,
                y,
            ) => {
                let x = int(self.fold_value(x, env, fx, depth + 1))?;
                let y = int(self.fold_value(y, env, fx, depth + 1))?;
                FoldVal::Int(FoldExpr::Bin(*op, Box::new(x), Box::new(y)))
            }
            ExprKind::Call(name, args) => {
                let decl = *self.decls.get(name.name.as_str())?;
                if decl.params.len() != args.len()
                    || decl
                        .params
                        .iter()
                        .any(|p| matches!(p.ty.kind, TypeKind::Ref(_)))
                {
                    return None;
                }
                // The function sees its parameters, not the caller's names.
                let mut inner: Vec<(&str, Sym)> = Vec::new();
                for (p, a) in decl.params.iter().zip(args) {
                    let v = match self.fold_value(a, env, fx, depth + 1)? {
                        FoldVal::Int(e) => Sym::Val(e),
                        FoldVal::Key => Sym::Key,
                    };
                    inner.push((p.name.name.as_str(), v));
                }
                let last = self.fold_block(&decl.body, &mut inner, fx, depth + 1)?;
                self.fold_value(last, &inner, fx, depth + 1)?
            }
            _ => return None,
        })
    }
}

/// What a name in a `foldt` body being compiled stands for.
#[derive(Clone)]
enum Sym {
    Val(crate::fold::FoldExpr),
    Key,
    /// The running record and the next element.
    Left,
    Right,
}

/// A value in a `foldt` body being compiled.
enum FoldVal {
    Int(crate::fold::FoldExpr),
    Key,
}

struct FoldCx<'n> {
    names: &'n [String],
    key_field: u16,
    next_fields: Vec<u16>,
}

impl Lowerer<'_> {
    /// `fold(f, acc, xs)`, `map(f, xs)`, `filter(p, xs)` as a counted loop
    /// whose back-edge checks the timeslice.
    fn iteration(
        &mut self,
        b: &mut FnBuilder,
        f: &Ident,
        args: &[Expr],
    ) -> Result<Reg, Unsupported> {
        let ExprKind::Var(g) = &args[0].kind else {
            return Err(self.unsupported("a function argument that is not a name", args[0].span));
        };
        let func = *self
            .funcs
            .get(g.name.as_str())
            .ok_or_else(|| self.unsupported("an unknown function", g.span))?;
        let xs = self.expr(b, args.last().expect("checked arity"))?;
        let out = b.reg();
        match f.name.as_str() {
            "fold" => {
                let acc = self.expr(b, &args[1])?;
                b.emit(Op::Move { dst: out, src: acc });
            }
            _ => b.emit(Op::List {
                dst: out,
                items: Box::new([]),
            }),
        }
        Self::each_element(b, xs, |b, elem| {
            let r = b.reg();
            let args: Box<[Reg]> = if f.name == "fold" {
                Box::new([out, elem])
            } else {
                Box::new([elem])
            };
            b.emit(Op::Call { dst: r, func, args });
            match f.name.as_str() {
                "fold" => b.emit(Op::Move { dst: out, src: r }),
                "map" => b.emit(Op::Push { list: out, src: r }),
                _ => {
                    let skip = b.code.len();
                    b.emit(Op::JumpIfFalse { cond: r, to: 0 });
                    b.emit(Op::Push {
                        list: out,
                        src: elem,
                    });
                    let after = b.here();
                    b.code[skip] = Op::JumpIfFalse { cond: r, to: after };
                }
            }
        });
        Ok(out)
    }
}

fn channel_index(e: &Expr, channels: &[String]) -> Option<u16> {
    match &e.kind {
        ExprKind::Var(v) => channels.iter().position(|c| *c == v.name).map(|i| i as u16),
        ExprKind::Index(b, _) => channel_index(b, channels),
        _ => None,
    }
}

fn rule_label(r: &Rule) -> String {
    let mut label = format_expr(&r.source, 0, 0);
    for s in &r.steps {
        label.push_str(" => ");
        label.push_str(&format_expr(s, 0, 0));
    }
    label
}

/// The table policy a state variable's written dictionary type declares;
/// the checker has already rejected annotations that do not make one.
fn table_policy(ty: Option<&TypeExpr>) -> TablePolicy {
    let mut policy = TablePolicy::default();
    let Some(te) = ty.filter(|t| matches!(t.kind, TypeKind::Dict(..))) else {
        return policy;
    };
    for a in &te.annotations {
        match (a.name.name.as_str(), &a.value.kind) {
            ("capacity", _) => policy.capacity = constant(&a.value).filter(|n| *n > 0),
            ("idle", _) => policy.idle_secs = constant(&a.value).filter(|n| *n > 0),
            ("evict", ExprKind::Var(v)) => {
                policy.evict = Evict::by_name(&v.name).unwrap_or_default()
            }
            _ => {}
        }
    }
    policy
}

/// The built-ins whose first argument is a meter or Bloom filter.
const OBJECT_BUILTINS: &[&str] = &["meter", "bloom_add", "bloom_has", "bloom_clear"];

/// The meter or Bloom filter a state variable of checked type `ty` is, or
/// that its dictionary's values are.
fn state_object(ty: &Ty) -> Option<StateObject> {
    match ty.behind_refs() {
        Ty::Meter {
            rate,
            burst,
            excess,
        } => Some(StateObject::Meter(MeterSpec {
            rate: *rate,
            burst: *burst,
            excess: *excess,
        })),
        Ty::Bloom { bits, hashes } => Some(StateObject::Bloom(BloomSpec {
            bits: *bits,
            hashes: u32::try_from(*hashes).unwrap_or(u32::MAX),
        })),
        Ty::Dict(_, v, _) => match state_object(v)? {
            StateObject::Meter(spec) => Some(StateObject::Meters(spec)),
            _ => None,
        },
        _ => None,
    }
}

/// A constant annotation's value: numbers with `+ - * / mod`, as the
/// checker allows them.
fn constant(e: &Expr) -> Option<u64> {
    match &e.kind {
        ExprKind::Int { value, .. } => Some(*value),
        ExprKind::Binary(op, a, b) => {
            let (a, b) = (constant(a)?, constant(b)?);
            match op {
                BinOp::Add => a.checked_add(b),
                BinOp::Sub => a.checked_sub(b),
                BinOp::Mul => a.checked_mul(b),
                BinOp::Div => a.checked_div(b),
                BinOp::Mod => a.checked_rem(b),
                _ => None,
            }
        }
        _ => None,
    }
}
