//! Functions and processes: signatures, bodies, rules, state and handlers.

use crate::checker::{BindKind, Checker};
use crate::decls::SizeScope;
use crate::program::{Function, Process, ProcessBounds, StateVar};
use crate::types::Ty;
use flick_span::Diagnostic;
use flick_syntax::ast::*;

/// Events a handler can catch.
pub const EVENTS: &[&str] = &["disconnect"];

impl Checker<'_> {
    fn param_kind(ty: &Ty) -> BindKind {
        match ty {
            Ty::Chan(_) | Ty::ChanArray(..) => BindKind::Channel,
            Ty::Ref(_) => BindKind::RefParam,
            _ => BindKind::Param,
        }
    }

    fn params(&mut self, params: &[Param]) -> Vec<(String, Ty)> {
        let mut out: Vec<(String, Ty)> = Vec::new();
        for p in params {
            if let Some(prev) = params
                .iter()
                .take_while(|q| !std::ptr::eq(*q, p))
                .find(|q| q.name.name == p.name.name)
            {
                self.diags.push(
                    Diagnostic::error(
                        "E0104",
                        format!("parameter `{}` is declared twice", p.name.name),
                        p.name.span,
                    )
                    .also(prev.name.span, "first declaration"),
                );
            }
            let ty = self.resolve_type(&p.ty, &SizeScope::Constant);
            out.push((p.name.name.clone(), ty));
        }
        out
    }

    pub(crate) fn function_signatures(&mut self) {
        for f in self.fun_decls.clone() {
            let params = self.params(&f.params);
            let mut results: Vec<Ty> = f
                .results
                .iter()
                .map(|t| self.resolve_type(t, &SizeScope::Constant))
                .collect();
            let result = if results.len() == 1 {
                results.pop().unwrap()
            } else {
                Ty::Tuple(results)
            };
            self.out.functions.push(Function {
                name: f.name.name.clone(),
                params,
                result,
                span: f.span,
            });
        }
    }

    pub(crate) fn function_body(&mut self, id: usize, f: &FunDecl) {
        let sig = self.out.functions[id].clone();
        self.current_fun = Some(id);
        self.push_scope();
        for (name, ty) in &sig.params {
            self.bind(name, ty.clone(), Self::param_kind(ty));
        }
        let body = self.block(&f.body);
        self.pop_scope();
        self.current_fun = None;
        if sig.result.is_unit() {
            return;
        }
        let last = f.body.stmts.last().map_or(f.body.span, |s| s.span);
        if self.uni.unify(&body, &sig.result).is_err() {
            let found = self.uni.resolve(&body);
            let d = Diagnostic::error(
                "E0208",
                format!(
                    "`{}` returns `{}`, but its body ends with `{found}`",
                    f.name.name, sig.result
                ),
                last,
            )
            .label(format!("this is `{found}`"));
            self.diags.push(if found.is_unit() {
                d.hint("a function's result is the value of its last line")
            } else {
                d
            });
        }
    }

    pub(crate) fn process(&mut self, p: &ProcDecl) -> Process {
        self.push_scope();
        let channels = self.params(&p.params);
        for (name, ty) in &channels {
            if !matches!(ty, Ty::Chan(_) | Ty::ChanArray(..) | Ty::Error) {
                let span = p
                    .params
                    .iter()
                    .find(|q| &q.name.name == name)
                    .unwrap()
                    .ty
                    .span;
                self.diags.push(
                    Diagnostic::error(
                        "E0303",
                        format!("process parameter `{name}` must be a channel"),
                        span,
                    )
                    .label(format!("this is `{ty}`"))
                    .hint("processes connect to the world through channels; keep values in `global` or `local` state"),
                );
            }
            self.bind(name, ty.clone(), Self::param_kind(ty));
        }
        let mut state = Vec::new();
        for item in &p.items {
            match item {
                ProcItem::State(s) => state.push(self.state(s)),
                ProcItem::Rule(r) => self.rule(r),
                ProcItem::Guarded(g) => {
                    let c = self.expr(&g.cond);
                    if self.uni.unify(&c, &Ty::Bool).is_err() {
                        let found = self.uni.resolve(&c);
                        self.diags.push(
                            Diagnostic::error(
                                "E0206",
                                format!("a condition is a `bool`, not `{found}`"),
                                g.cond.span,
                            )
                            .label(format!("this is `{found}`")),
                        );
                    }
                    self.block(&g.body);
                }
                ProcItem::Handler(h) => self.handler(h, &channels),
            }
        }
        self.pop_scope();
        for s in &mut state {
            s.ty = self.uni.resolve(&s.ty);
        }
        Process {
            name: p.name.name.clone(),
            channels,
            state,
            bounds: ProcessBounds::default(),
            span: p.span,
        }
    }

    fn state(&mut self, s: &StateDecl) -> StateVar {
        let t = self.expr(&s.init);
        let ty = match &s.ty {
            Some(te) => {
                let declared = self.resolve_type(te, &SizeScope::Constant);
                let what = format!("`{}`", s.name.name);
                if self.expect_ty(&t, &declared, s.init.span, &what) {
                    self.fits(&t, &declared, s.init.span, &what);
                }
                declared
            }
            None => t,
        };
        if matches!(self.uni.resolve(&ty), Ty::Chan(_) | Ty::ChanArray(..)) {
            self.diags.push(
                Diagnostic::error("E0303", format!("state variable `{}` cannot hold a channel", s.name.name), s.init.span)
                    .label("a channel")
                    .hint("channels belong to one instance's connections; use the process's channel parameters directly"),
            );
        }
        if self.lookup(&s.name.name).is_some() {
            self.diags.push(
                Diagnostic::error(
                    "E0104",
                    format!("`{}` is already defined in this process", s.name.name),
                    s.name.span,
                )
                .label("second definition"),
            );
        }
        self.bind(&s.name.name, ty.clone(), BindKind::State(s.scope));
        StateVar {
            name: s.name.name.clone(),
            scope: s.scope,
            ty,
        }
    }

    /// `source => step => ...`: a value read from `source` flows through
    /// calls (as their last argument) and ends on a channel.
    fn rule(&mut self, r: &Rule) {
        let st = self.expr(&r.source);
        let resolved = self.uni.resolve(&st);
        let mut flowing = match resolved.behind_refs() {
            Ty::Chan(c) | Ty::ChanArray(c, _) => match &c.input {
                Some(t) => (**t).clone(),
                None => {
                    self.diags.push(
                        Diagnostic::error("E0301", "cannot read from a write-only channel", r.source.span)
                            .label(format!("this is `{resolved}`: nothing can be read from it"))
                            .hint("a channel `-/Out` is write-only; declare an input type to read from it"),
                    );
                    Ty::Error
                }
            },
            Ty::Error => Ty::Error,
            other => {
                self.diags.push(
                    Diagnostic::error(
                        "E0303",
                        format!("a rule reads from a channel, not `{other}`"),
                        r.source.span,
                    )
                    .label(format!("this is `{other}`")),
                );
                Ty::Error
            }
        };
        let mut from = r.source.span;
        let mut ended: Option<&str> = None;
        for step in &r.steps {
            if let Some(why) = ended {
                self.diags.push(
                    Diagnostic::error("E0601", format!("nothing flows out of {why}"), step.span)
                        .label("this step receives nothing")
                        .also(from, "the flow ends here"),
                );
                return;
            }
            match &step.kind {
                ExprKind::Call(f, args) if self.fun_ids.contains_key(&f.name) => {
                    let result = self.call(f, args, Some((flowing.clone(), from)), step.span);
                    self.out.expr_types.insert(step.span, result.clone());
                    if self.uni.resolve(&result).is_unit() {
                        ended = Some("a function that returns `()`");
                    }
                    flowing = result;
                }
                ExprKind::Call(f, args) => {
                    let known = self.record_ids.contains_key(&f.name)
                        || crate::builtins::is_builtin(&f.name);
                    if known {
                        self.diags.push(
                            Diagnostic::error("E0601", format!("`{}` cannot be a rule step", f.name), step.span)
                                .label("a built-in or record constructor")
                                .hint("a rule step is a `fun` (which receives the flowing value last) or a channel"),
                        );
                    } else {
                        self.call(f, args, None, step.span);
                    }
                    return;
                }
                _ => {
                    self.send(&flowing, from, step);
                    ended = Some("a channel");
                }
            }
            from = step.span;
        }
    }

    fn handler(&mut self, h: &Handler, channels: &[(String, Ty)]) {
        if !EVENTS.contains(&h.event.name.as_str()) {
            self.diags.push(
                Diagnostic::error(
                    "E0109",
                    format!("unknown event `{}`", h.event.name),
                    h.event.span,
                )
                .hint(format!("handlers catch {}", EVENTS.join(", "))),
            );
        }
        self.push_scope();
        match channels.iter().find(|(n, _)| *n == h.channel.name) {
            None => self.diags.push(
                Diagnostic::error(
                    "E0109",
                    format!("`{}` is not a channel of this process", h.channel.name),
                    h.channel.span,
                )
                .label("unknown channel"),
            ),
            Some((_, Ty::ChanArray(..))) => match &h.index {
                Some(i) => self.bind(&i.name, Ty::int(), BindKind::Let),
                None => self.diags.push(
                    Diagnostic::error(
                        "E0109",
                        format!("`{}` is an array of channels", h.channel.name),
                        h.channel.span,
                    )
                    .hint(format!(
                        "name the failed channel's index: `on {}({}[i]):`",
                        h.event.name, h.channel.name
                    )),
                ),
            },
            Some(_) => {
                if let Some(i) = &h.index {
                    self.diags.push(
                        Diagnostic::error(
                            "E0109",
                            format!("`{}` is a single channel, not an array", h.channel.name),
                            i.span,
                        )
                        .label("no index to bind"),
                    );
                }
            }
        }
        self.block(&h.body);
        self.pop_scope();
    }
}
