//! Static resource bounds: the memory one process instance can hold and the
//! operations one input message can cost.
//!
//! The cost model counts one operation per expression node, statement and
//! rule step; a call costs its body; `fold`, `map` and `filter` cost their
//! function once per element of the list's maximum length; `foldt` costs its
//! body once per channel of the array; a string built-in costs operations
//! in proportion to its arguments' maximum lengths. Memory counts, per instance, one
//! message in flight in each direction of each channel, the `local` state,
//! and every value a handler binds with `let` (in the functions it calls
//! too). Programs are checked free of recursion before bounds are computed,
//! so every walk here ends.

use crate::checker::Checker;
use crate::program::{Process, ProcessBounds};
use crate::types::Ty;
use flick_syntax::ast::*;
use flick_syntax::format_expr;
use std::collections::HashMap;

/// Cost and working memory of a piece of code. `live` is what its own
/// `let`s still hold when it ends; `peak` is the most it holds at any one
/// moment, including what the code it calls binds. Calls run one after
/// another, so their working sets do not add up.
#[derive(Clone, Copy, Default)]
struct Cost {
    ops: u64,
    live: u64,
    peak: u64,
    /// Bytes string built-ins add to the interpreter's scratch buffer,
    /// which keeps them until the message is handled: they add up.
    scratch: u64,
}

impl Cost {
    fn ops(ops: u64) -> Cost {
        Cost {
            ops,
            live: 0,
            peak: 0,
            scratch: 0,
        }
    }

    /// `self`, then `o`: what `self` binds stays live while `o` runs.
    fn add(self, o: Cost) -> Cost {
        Cost {
            ops: self.ops.saturating_add(o.ops),
            live: self.live.saturating_add(o.live),
            peak: self.peak.max(self.live.saturating_add(o.peak)),
            scratch: self.scratch.saturating_add(o.scratch),
        }
    }

    fn op(self) -> Cost {
        Cost {
            ops: self.ops.saturating_add(1),
            ..self
        }
    }

    /// The most bytes held at once, the scratch buffer included.
    fn bytes(self) -> u64 {
        self.peak.max(self.live).saturating_add(self.scratch)
    }

    /// Code whose bindings end with it (a call, a branch): its memory is
    /// transient for whoever runs it.
    fn scoped(self) -> Cost {
        Cost {
            ops: self.ops,
            live: 0,
            peak: self.peak.max(self.live),
            scratch: self.scratch,
        }
    }
}

impl Checker<'_> {
    pub(crate) fn bounds(&mut self, p: &ProcDecl, info: &Process) -> ProcessBounds {
        let mut b = ProcessBounds::default();
        for (name, ty) in &info.channels {
            let (c, count) = match ty {
                Ty::Chan(c) => (c, 1),
                Ty::ChanArray(c, n) => (c, *n),
                _ => continue,
            };
            let inb = c.input.as_ref().map_or(0, |t| self.message_bytes(t));
            let outb = c.output.as_ref().map_or(0, |t| self.message_bytes(t));
            let bytes = inb.saturating_add(outb).saturating_mul(count);
            let what = if count > 1 {
                format!("channels {name} ({count} x one message each way)")
            } else {
                format!("channel {name} (one message each way)")
            };
            b.instance_parts.push((what, bytes));
        }
        self.object_parameters(p, info);
        for s in &info.state {
            let bytes = self.value_bytes(&s.ty);
            match s.scope {
                StateScope::Global => b.global_bytes = b.global_bytes.saturating_add(bytes),
                StateScope::Local => b.instance_parts.push((format!("local {}", s.name), bytes)),
            }
        }
        let mut memo = HashMap::new();
        let mut working = 0u64;
        for item in &p.items {
            let (label, cost) = match item {
                ProcItem::State(_) => continue,
                ProcItem::Rule(r) => {
                    let mut label = format_expr(&r.source, 0, 0);
                    let mut c = self.cost_expr(&r.source, &mut memo);
                    for step in &r.steps {
                        label.push_str(" => ");
                        label.push_str(&format_expr(step, 0, 0));
                        c = c.add(match &step.kind {
                            ExprKind::Call(f, args) => self.call_cost(f, args, &mut memo),
                            _ => self.cost_expr(step, &mut memo).op(),
                        });
                    }
                    (label, c)
                }
                ProcItem::Guarded(g) => (
                    format!("if {}", format_expr(&g.cond, 0, 0)),
                    self.cost_expr(&g.cond, &mut memo)
                        .add(self.cost_block(&g.body, &mut memo)),
                ),
                ProcItem::Handler(h) => {
                    let index = h
                        .index
                        .as_ref()
                        .map_or(String::new(), |i| format!("[{}]", i.name));
                    (
                        format!("on {}({}{index})", h.event.name, h.channel.name),
                        self.cost_block(&h.body, &mut memo),
                    )
                }
            };
            working = working.max(cost.bytes());
            b.rule_ops.push((label, cost.ops));
        }
        b.instance_parts
            .push(("values bound while handling a message".into(), working));
        b.instance_bytes = b
            .instance_parts
            .iter()
            .fold(0u64, |acc, (_, n)| acc.saturating_add(*n));
        b
    }

    /// Bytes of a message on a channel: a view of a wire unit carries the
    /// whole message, including the fields the program does not read.
    fn message_bytes(&mut self, t: &Ty) -> u64 {
        match t {
            Ty::Record(_, name) if self.wire_messages.contains_key(name) => {
                self.wire_messages[name]
            }
            _ => self.value_bytes(t),
        }
    }

    fn fun_cost(&mut self, id: usize, memo: &mut HashMap<usize, Cost>) -> Cost {
        if let Some(c) = memo.get(&id) {
            return *c;
        }
        let body = &self.fun_decls[id].body;
        let c = self.cost_block(body, memo);
        memo.insert(id, c);
        c
    }

    fn cost_block(&mut self, b: &Block, memo: &mut HashMap<usize, Cost>) -> Cost {
        let mut total = Cost::default();
        for s in &b.stmts {
            let c = match &s.kind {
                StmtKind::Let { value, .. } => {
                    let ty = self
                        .out
                        .expr_types
                        .get(&value.span)
                        .cloned()
                        .unwrap_or(Ty::Error);
                    let held = self.value_bytes(&ty);
                    let bound = Cost {
                        ops: 1,
                        live: held,
                        peak: held,
                        scratch: 0,
                    };
                    self.cost_expr(value, memo).add(bound)
                }
                StmtKind::Assign { place: a, value: b }
                | StmtKind::Send {
                    value: a,
                    channel: b,
                } => self.cost_expr(a, memo).add(self.cost_expr(b, memo)).op(),
                StmtKind::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    let t = self.cost_block(then, memo).scoped();
                    let o = otherwise
                        .as_ref()
                        .map_or(Cost::default(), |o| self.cost_block(o, memo).scoped());
                    let branch = Cost {
                        ops: t.ops.max(o.ops),
                        live: 0,
                        peak: t.peak.max(o.peak),
                        scratch: t.scratch.max(o.scratch),
                    };
                    self.cost_expr(cond, memo).add(branch)
                }
                StmtKind::Expr(e) => self.cost_expr(e, memo),
            };
            total = total.add(c);
        }
        total
    }

    /// A meter or Bloom filter in state (or a dictionary's meters) needs
    /// its parameters: they fix its memory and its rate.
    fn object_parameters(&mut self, p: &ProcDecl, info: &Process) {
        let decls = p.items.iter().filter_map(|i| match i {
            ProcItem::State(s) => Some(s),
            _ => None,
        });
        for (decl, var) in decls.zip(&info.state) {
            if matches!(var.ty.behind_refs(), Ty::Meter { .. })
                && self.fun_ids.contains_key("steer")
            {
                let at = decl.ty.as_ref().map_or(decl.name.span, |t| t.span);
                self.out.warnings.push(
                    flick_span::Diagnostic::warning(
                        "E0903",
                        format!("each worker meters its own frames with its own `{}`", var.name),
                        at,
                    )
                    .label("one meter per worker: the program steers frames to workers")
                    .hint("meter per key in a dictionary of meters keyed by what `steer` gives, or leave `steer` out to run on one worker"),
                );
            }
            let ty = match var.ty.behind_refs() {
                Ty::Dict(_, v, _) => v.behind_refs(),
                t => t,
            };
            let (missing, hint): (Vec<&str>, &str) = match ty {
                Ty::Meter { rate, burst, .. } => (
                    [("rate", *rate), ("burst", *burst)]
                        .into_iter()
                        .filter(|(_, v)| *v == 0)
                        .map(|(n, _)| n)
                        .collect(),
                    "as in `meter {rate=125000, burst=3000}` (tokens a second, the bucket's depth)",
                ),
                Ty::Bloom { bits, hashes } => (
                    [("bits", *bits), ("hashes", *hashes)]
                        .into_iter()
                        .filter(|(_, v)| *v == 0)
                        .map(|(n, _)| n)
                        .collect(),
                    "as in `bloom {bits=65536, hashes=3}`",
                ),
                _ => continue,
            };
            if missing.is_empty() {
                continue;
            }
            let at = decl.ty.as_ref().map_or(decl.name.span, |t| t.span);
            self.diags.push(
                flick_span::Diagnostic::error(
                    "E0509",
                    format!(
                        "`{}` needs `{}`: a {ty} in state has a fixed size and rate",
                        var.name,
                        missing.join("` and `")
                    ),
                    at,
                )
                .label(format!("no `{}` here", missing.join("`, `")))
                .hint(hint),
            );
        }
    }

    fn call_cost(&mut self, f: &Ident, args: &[Expr], memo: &mut HashMap<usize, Cost>) -> Cost {
        let mut c = Cost::ops(1);
        for a in args {
            c = c.add(self.cost_expr(a, memo));
        }
        if let Some(&id) = self.fun_ids.get(&f.name) {
            return c.add(self.fun_cost(id, memo).scoped());
        }
        if matches!(f.name.as_str(), "fold" | "map" | "filter") {
            let list = args.last().expect("checked arity");
            let n = match self.out.expr_types.get(&list.span) {
                Some(Ty::List(_, n)) => *n,
                _ => 0,
            };
            if let Some(&id) = args.first().and_then(|a| match &a.kind {
                ExprKind::Var(v) => self.fun_ids.get(&v.name),
                _ => None,
            }) {
                let body = self.fun_cost(id, memo).scoped();
                c = c.add(Cost {
                    ops: n.saturating_mul(body.ops.saturating_add(1)),
                    live: 0,
                    peak: body.peak,
                    scratch: n.saturating_mul(body.scratch),
                });
            }
        }
        if crate::builtins::PACKET_BUILTINS.contains(&f.name.as_str()) {
            let s = self.packet_cost(&f.name, args);
            c = c.add(Cost {
                ops: s.ops,
                live: 0,
                peak: 0,
                scratch: s.scratch,
            });
        }
        if crate::builtins::STRING_BUILTINS.contains(&f.name.as_str()) {
            let s = self.string_cost(&f.name, args);
            c = c.add(Cost {
                ops: s.ops,
                live: 0,
                peak: 0,
                scratch: s.scratch,
            });
        }
        c
    }

    fn cost_expr(&mut self, e: &Expr, memo: &mut HashMap<usize, Cost>) -> Cost {
        let one = Cost::ops(1);
        match &e.kind {
            ExprKind::Int { .. }
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::None
            | ExprKind::Var(_)
            | ExprKind::Anonymous => one,
            ExprKind::Unary(_, x) | ExprKind::Field(x, _) => self.cost_expr(x, memo).op(),
            ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
                self.cost_expr(a, memo).add(self.cost_expr(b, memo)).op()
            }
            ExprKind::Call(f, args) => self.call_cost(f, args, memo),
            ExprKind::Tuple(es) | ExprKind::List(es) => es
                .iter()
                .fold(one, |acc, x| acc.add(self.cost_expr(x, memo))),
            ExprKind::Foldt(f) => {
                let n = match self.out.expr_types.get(&f.channels.span) {
                    Some(Ty::ChanArray(_, n)) => *n,
                    _ => 0,
                };
                let body = self.cost_block(&f.body, memo).scoped();
                self.cost_expr(&f.channels, memo).op().add(Cost {
                    ops: n.saturating_mul(body.ops.saturating_add(1)),
                    live: 0,
                    peak: body.peak,
                    scratch: n.saturating_mul(body.scratch),
                })
            }
        }
    }
}
