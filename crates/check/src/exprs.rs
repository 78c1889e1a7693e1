//! Types of expressions, statements and blocks.

use crate::checker::{BindKind, Checker};
use crate::limits::DEFAULT_DICT_CAPACITY;
use crate::suggest::closest;
use crate::types::{ChanTy, Ty};
use flick_span::{Diagnostic, Span};
use flick_syntax::ast::*;
use flick_syntax::format_expr;

impl Checker<'_> {
    pub(crate) fn expr(&mut self, e: &Expr) -> Ty {
        let ty = self.expr_inner(e);
        self.out.expr_types.insert(e.span, ty.clone());
        ty
    }

    fn expr_inner(&mut self, e: &Expr) -> Ty {
        match &e.kind {
            ExprKind::Int { .. } => Ty::int(),
            ExprKind::Str(s) => Ty::Str {
                max: s.len() as u64,
            },
            ExprKind::Bool(_) => Ty::Bool,
            ExprKind::None => Ty::None,
            ExprKind::Var(v) => self.var(v),
            ExprKind::Anonymous => {
                self.diags.push(
                    Diagnostic::error("E0106", "`_` is not a value", e.span)
                        .label("anonymous")
                        .hint("`_` marks fields that no code may read or write"),
                );
                Ty::Error
            }
            ExprKind::Unary(op, x) => {
                let t = self.expr(x);
                let (want, name) = match op {
                    UnOp::Not => (Ty::Bool, "`not`"),
                    UnOp::Neg => (Ty::int(), "`-`"),
                };
                if self.operand(&t, &want, x.span, name) {
                    want
                } else {
                    Ty::Error
                }
            }
            ExprKind::Binary(op, a, b) => self.binary(*op, a, b),
            ExprKind::Field(x, f) => self.field(x, f),
            ExprKind::Index(x, i) => self.index(x, i),
            ExprKind::Call(f, args) => self.call(f, args, None, e.span),
            ExprKind::Tuple(es) => Ty::Tuple(es.iter().map(|e| self.expr(e)).collect()),
            ExprKind::List(es) => {
                let elem = self.uni.fresh();
                for x in es {
                    let t = self.expr(x);
                    self.expect_ty(&t, &elem, x.span, "list elements must have one type");
                }
                Ty::List(Box::new(elem), es.len() as u64)
            }
            ExprKind::Foldt(f) => self.foldt(f),
        }
    }

    fn var(&mut self, v: &Ident) -> Ty {
        if let Some(b) = self.lookup(&v.name) {
            return b.ty.clone();
        }
        if v.name == "empty_dict" {
            return self.empty_dict();
        }
        // Fresh packet state, typed by what it is stored in.
        if v.name == crate::builtins::NEW_METER {
            self.packet_state_uses
                .push((v.span, format!("`{}`", v.name)));
            return Ty::Meter {
                rate: 0,
                burst: 0,
                excess: 0,
            };
        }
        if v.name == crate::builtins::NEW_BLOOM {
            self.packet_state_uses
                .push((v.span, format!("`{}`", v.name)));
            return Ty::Bloom { bits: 0, hashes: 0 };
        }
        if self.fun_ids.contains_key(&v.name) || crate::builtins::is_builtin(&v.name) {
            self.diags.push(
                Diagnostic::error(
                    "E0107",
                    format!("`{}` is a function, not a value", v.name),
                    v.span,
                )
                .hint(format!(
                    "Flick functions are first-order: call it as `{}(...)`, or name it as the first argument of fold, map or filter",
                    v.name
                )),
            );
            return Ty::Error;
        }
        let mut d = Diagnostic::error("E0101", format!("unknown name `{}`", v.name), v.span)
            .label("not in scope");
        if let Some(s) = closest(&v.name, self.names_in_scope()) {
            d = d.hint(format!("did you mean `{s}`?"));
        }
        self.diags.push(d);
        Ty::Error
    }

    fn empty_dict(&mut self) -> Ty {
        let k = self.uni.fresh();
        let v = self.uni.fresh();
        Ty::Dict(Box::new(k), Box::new(v), DEFAULT_DICT_CAPACITY)
    }

    /// Checks an operand against `want`, as an operator error; returns
    /// whether it matched.
    pub(crate) fn operand(&mut self, t: &Ty, want: &Ty, span: Span, op: &str) -> bool {
        if self.uni.unify(t, want).is_err() {
            let found = self.uni.resolve(t);
            self.diags.push(
                Diagnostic::error(
                    "E0203",
                    format!("{op} needs `{want}` operands, found `{found}`"),
                    span,
                )
                .label(format!("this is `{found}`")),
            );
            return false;
        }
        true
    }

    fn binary(&mut self, op: BinOp, a: &Expr, b: &Expr) -> Ty {
        let ta = self.expr(a);
        let tb = self.expr(b);
        let name = format!("`{}`", op.symbol());
        match op {
            BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod => {
                if matches!(op, BinOp::Div | BinOp::Mod) && !self.nonzero(b) {
                    self.out.warnings.push(
                        Diagnostic::warning("E0902", format!("{name} may divide by zero"), b.span)
                            .label("this may be 0 at run time")
                            .hint("a fault answers the request with the grammar's error reply; divide by a constant or by `len` of a channel array, which is never 0"),
                    );
                }
                let ok_a = self.operand(&ta, &Ty::int(), a.span, &name);
                let ok_b = self.operand(&tb, &Ty::int(), b.span, &name);
                // The operator's error stands for its result's, too.
                if !(ok_a && ok_b) {
                    return Ty::Error;
                }
                match self.uni.resolve(&ta).behind_refs() {
                    t @ Ty::Int { .. } => t.clone(),
                    _ => Ty::int(),
                }
            }
            BinOp::And | BinOp::Or => {
                self.operand(&ta, &Ty::Bool, a.span, &name);
                self.operand(&tb, &Ty::Bool, b.span, &name);
                Ty::Bool
            }
            BinOp::Eq | BinOp::Ne => {
                let ra = self.uni.shallow(&ta);
                let rb = self.uni.shallow(&tb);
                // `x = None` asks whether a dictionary lookup found nothing.
                if matches!(ra, Ty::None) || matches!(rb, Ty::None) {
                    return Ty::Bool;
                }
                for (t, e) in [(&ra, a), (&rb, b)] {
                    if matches!(t.behind_refs(), Ty::Chan(_) | Ty::ChanArray(..)) {
                        self.diags.push(
                            Diagnostic::error("E0203", "channels cannot be compared", e.span)
                                .label("a channel"),
                        );
                        return Ty::Bool;
                    }
                }
                if self.uni.unify(&ta, &tb).is_err() {
                    let (x, y) = (self.uni.resolve(&ta), self.uni.resolve(&tb));
                    self.diags.push(
                        Diagnostic::error(
                            "E0201",
                            format!("cannot compare `{x}` with `{y}`"),
                            a.span.to(b.span),
                        )
                        .label(format!("`{x}` {} `{y}`", op.symbol()))
                        .also(b.span, format!("this is `{y}`")),
                    );
                }
                Ty::Bool
            }
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
                let ok = self.uni.unify(&ta, &tb).is_ok()
                    && matches!(
                        self.uni.resolve(&ta).behind_refs(),
                        Ty::Int { .. } | Ty::Str { .. } | Ty::Bytes { .. } | Ty::Var(_) | Ty::Error
                    );
                if !ok {
                    let (x, y) = (self.uni.resolve(&ta), self.uni.resolve(&tb));
                    self.diags.push(
                        Diagnostic::error(
                            "E0203",
                            format!("{name} orders integers or strings, not `{x}` and `{y}`"),
                            a.span.to(b.span),
                        )
                        .label("cannot be ordered"),
                    );
                }
                Ty::Bool
            }
        }
    }

    fn field(&mut self, x: &Expr, f: &Ident) -> Ty {
        let t = self.expr(x);
        let t = self.uni.resolve(&t);
        match t.behind_refs() {
            Ty::Record(id, rname) => {
                if f.name == "_" {
                    self.diags.push(
                        Diagnostic::error("E0106", "anonymous fields cannot be read", f.span)
                            .label("`_` field")
                            .hint("`_` marks fields that no code may read or write; name the field to use it"),
                    );
                    return Ty::Error;
                }
                let rec = &self.out.records[*id];
                if let Some((_, field)) = rec.field(&f.name) {
                    return field.ty.clone();
                }
                let names: Vec<String> = rec.fields.iter().filter_map(|f| f.name.clone()).collect();
                let mut d = Diagnostic::error(
                    "E0105",
                    format!("record `{rname}` has no field `{}`", f.name),
                    f.span,
                )
                .label("unknown field");
                d = match closest(&f.name, names.clone()) {
                    Some(s) => d.hint(format!("did you mean `{s}`?")),
                    None => d.hint(format!("its fields are {}", quoted(&names))),
                };
                self.diags.push(d);
                Ty::Error
            }
            Ty::Error | Ty::Var(_) => Ty::Error,
            other => {
                self.diags.push(
                    Diagnostic::error("E0204", format!("`{other}` has no fields"), x.span)
                        .label(format!("this is `{other}`, not a record")),
                );
                Ty::Error
            }
        }
    }

    /// Warns of `x[i]` unless `i` is provably in range: `E mod len(x)`, or
    /// a name `let` to that.
    fn may_fault_index(&mut self, x: &Expr, i: &Expr) {
        let ExprKind::Var(base) = &x.kind else {
            return self.warn_index(x, i);
        };
        let proven = match &i.kind {
            ExprKind::Var(v) => self
                .lookup(&v.name)
                .and_then(|b| b.index_of.as_deref())
                .is_some_and(|a| a == base.name),
            _ => in_range_of(i).is_some_and(|a| a == base.name),
        };
        if !proven {
            self.warn_index(x, i);
        }
    }

    fn warn_index(&mut self, x: &Expr, i: &Expr) {
        let base = format_expr(x, 0, 0);
        self.out.warnings.push(
            Diagnostic::warning("E0901", format!("this index of `{base}` may be out of range"), i.span)
                .label("not known to lie in range")
                .hint(format!(
                    "a fault answers the request with the grammar's error reply; an index `E mod len({base})` is always in range"
                )),
        );
    }

    /// Whether `e` is never 0: a constant other than 0, or the length of a
    /// channel array (bound to one peer at least).
    fn nonzero(&self, e: &Expr) -> bool {
        match &e.kind {
            ExprKind::Int { value, .. } => *value != 0,
            ExprKind::Call(f, args) if f.name == "len" && args.len() == 1 => matches!(
                self.out
                    .expr_types
                    .get(&args[0].span)
                    .map(|t| self.uni.resolve(t)),
                Some(Ty::ChanArray(..))
            ),
            _ => false,
        }
    }

    fn index(&mut self, x: &Expr, i: &Expr) -> Ty {
        let t = self.expr(x);
        let ti = self.expr(i);
        let t = self.uni.resolve(&t);
        match t.behind_refs() {
            Ty::Dict(k, v, _) => {
                self.expect_ty(&ti, k, i.span, "dictionary key");
                (**v).clone()
            }
            Ty::ChanArray(c, _) => {
                self.expect_ty(&ti, &Ty::int(), i.span, "channel index");
                self.may_fault_index(x, i);
                Ty::Chan(c.clone())
            }
            Ty::List(e, _) => {
                self.expect_ty(&ti, &Ty::int(), i.span, "list index");
                self.may_fault_index(x, i);
                (**e).clone()
            }
            Ty::Tuple(ts) if !ts.is_empty() => {
                let n = ts.len();
                match &i.kind {
                    ExprKind::Int { value, .. } if *value < n as u64 => ts[*value as usize].clone(),
                    _ => {
                        self.diags.push(
                            Diagnostic::error(
                                "E0205",
                                format!("a tuple of {n} is indexed by a constant from 0 to {}", n - 1),
                                i.span,
                            )
                            .label("not such a constant")
                            .hint("`split_once(s, sep)[0]` is the part before the separator, `[1]` the part after"),
                        );
                        Ty::Error
                    }
                }
            }
            Ty::Str { .. } | Ty::Bytes { .. } => {
                self.expect_ty(&ti, &Ty::int(), i.span, "byte index");
                self.may_fault_index(x, i);
                Ty::Int {
                    signed: false,
                    bytes: 1,
                }
            }
            Ty::Error | Ty::Var(_) => Ty::Error,
            other => {
                self.diags.push(
                    Diagnostic::error("E0205", format!("`{other}` cannot be indexed"), x.span)
                        .label(format!("this is `{other}`"))
                        .hint("dictionaries, lists, strings, tuples and channel arrays can be indexed"),
                );
                Ty::Error
            }
        }
    }

    /// Checks a call. `piped` is the value a process rule feeds in as the
    /// last argument.
    pub(crate) fn call(
        &mut self,
        f: &Ident,
        args: &[Expr],
        piped: Option<(Ty, Span)>,
        span: Span,
    ) -> Ty {
        if let Some(&id) = self.fun_ids.get(&f.name) {
            return self.user_call(id, f, args, piped, span);
        }
        if let Some(&rid) = self.record_ids.get(&f.name) {
            return self.construct(rid, f, args, span);
        }
        if crate::builtins::is_builtin(&f.name) {
            return self.builtin(f, args, span);
        }
        if self.lookup(&f.name).is_some() {
            self.diags.push(
                Diagnostic::error("E0102", format!("`{}` is not a function", f.name), f.span)
                    .label("a value, called"),
            );
        } else {
            let known = self
                .fun_ids
                .keys()
                .chain(self.record_ids.keys())
                .cloned()
                .chain(crate::builtins::BUILTINS.iter().map(|s| s.to_string()));
            let d = Diagnostic::error("E0102", format!("unknown function `{}`", f.name), f.span)
                .label("not defined");
            let near = closest(&f.name, known);
            self.diags
                .push(d.hint(unknown_function_hint(&f.name, near)));
        }
        for a in args {
            self.expr(a);
        }
        Ty::Error
    }

    pub(crate) fn arity(
        &mut self,
        f: &Ident,
        expected: usize,
        found: usize,
        span: Span,
        note: &str,
    ) -> bool {
        if expected == found {
            return true;
        }
        let s = if expected == 1 { "" } else { "s" };
        let were = if found == 1 { "was" } else { "were" };
        self.diags.push(
            Diagnostic::error(
                "E0202",
                format!(
                    "`{}` takes {expected} argument{s}{note}, but {found} {were} given",
                    f.name
                ),
                span,
            )
            .label(format!("{found} given")),
        );
        false
    }

    fn user_call(
        &mut self,
        id: usize,
        f: &Ident,
        args: &[Expr],
        piped: Option<(Ty, Span)>,
        span: Span,
    ) -> Ty {
        if let Some(caller) = self.current_fun {
            self.calls.push((caller, id, f.span));
        }
        let sig = self.out.functions[id].clone();
        let given = args.len() + usize::from(piped.is_some());
        let note = if piped.is_some() {
            " (the value flowing in counts as the last)"
        } else {
            ""
        };
        let ok = self.arity(f, sig.params.len(), given, span, note);
        self.prefix_arguments(id, args);
        for (i, a) in args.iter().enumerate() {
            let t = self.expr(a);
            if ok {
                let (pname, pty) = &sig.params[i];
                self.argument(a, &t, pty, pname, &f.name);
            }
        }
        if let (true, Some((t, pspan))) = (ok, piped) {
            let (pname, pty) = sig.params.last().expect("arity checked");
            self.expect_ty(
                &t,
                pty,
                pspan,
                &format!("the value flowing into `{}` as `{pname}`", f.name),
            );
        }
        sig.result.clone()
    }

    /// Checks one argument against its parameter, including channel
    /// directions and `ref` parameters.
    fn argument(&mut self, a: &Expr, t: &Ty, pty: &Ty, pname: &str, fname: &str) {
        let actual = self.uni.resolve(t);
        match (pty, actual.behind_refs()) {
            (Ty::Chan(p), Ty::Chan(c)) | (Ty::ChanArray(p, _), Ty::ChanArray(c, _)) => {
                self.chan_arg(a, p, c, pname, fname, pty);
            }
            (Ty::Ref(inner), _) => {
                let is_place = matches!(&a.kind, ExprKind::Var(v)
                    if matches!(self.lookup(&v.name).map(|b| b.kind),
                        Some(BindKind::State(_) | BindKind::RefParam)));
                if !is_place && !matches!(actual, Ty::Error) {
                    self.diags.push(
                        Diagnostic::error(
                            "E0207",
                            format!("`{pname}` of `{fname}` is a `ref` parameter"),
                            a.span,
                        )
                        .label("not a state variable")
                        .hint(
                            "pass a `global` or `local` state variable, or another `ref` parameter",
                        ),
                    );
                }
                self.expect_ty(
                    t,
                    inner,
                    a.span,
                    &format!("argument `{pname}` of `{fname}`"),
                );
            }
            _ => {
                let what = format!("argument `{pname}` of `{fname}`");
                if self.expect_ty(t, pty, a.span, &what) {
                    self.fits(t, pty, a.span, &what);
                }
            }
        }
    }

    /// A value's size bound must fit the bound of where it goes: the
    /// memory bound of a program relies on it.
    pub(crate) fn fits(&mut self, value: &Ty, target: &Ty, span: Span, what: &str) {
        let (v, t) = (self.uni.resolve(value), self.uni.resolve(target));
        let (have, limit, unit) = match (v.behind_refs(), t.behind_refs()) {
            (
                Ty::Str { max: a } | Ty::Bytes { max: a },
                Ty::Str { max: b } | Ty::Bytes { max: b },
            ) => (*a, *b, "bytes"),
            (Ty::List(_, a), Ty::List(_, b)) => (*a, *b, "elements"),
            _ => return,
        };
        if have > limit {
            self.diags.push(
                Diagnostic::error(
                    "E0508",
                    format!("{what} holds at most {limit} {unit}, but this may have {have}"),
                    span,
                )
                .label(format!("up to {have} {unit}"))
                .hint("raise the `max` where it is declared, or bound the value more tightly"),
            );
        }
    }

    fn chan_arg(&mut self, a: &Expr, p: &ChanTy, c: &ChanTy, pname: &str, fname: &str, pty: &Ty) {
        // `c` is one channel's type; the argument may be an array of them.
        let (actual, these) = match pty {
            Ty::ChanArray(..) => (format!("[{c}]"), "these channels cannot be"),
            _ => (format!("{c}"), "this channel cannot be"),
        };
        let sides = [
            (&p.input, &c.input, "read from"),
            (&p.output, &c.output, "written to"),
        ];
        for (want, have, verb) in sides {
            match (want, have) {
                (Some(w), Some(h)) => {
                    if self.uni.unify(w, h).is_err() {
                        self.diags.push(
                            Diagnostic::error(
                                "E0201",
                                format!(
                                    "argument `{pname}` of `{fname}`: expected `{pty}`, found `{actual}`"
                                ),
                                a.span,
                            )
                            .label("channel of another type"),
                        );
                        return;
                    }
                }
                (Some(_), None) => {
                    let code = if verb == "read from" {
                        "E0301"
                    } else {
                        "E0302"
                    };
                    self.diags.push(
                        Diagnostic::error(
                            code,
                            format!("`{fname}` needs `{pname}` to be {verb}, but {these}"),
                            a.span,
                        )
                        .label(format!("this is `{actual}`"))
                        .hint(format!("`{pname}` is declared `{pty}`")),
                    );
                    return;
                }
                // A function may use fewer directions than it is given.
                (None, _) => {}
            }
        }
    }

    fn construct(&mut self, rid: usize, f: &Ident, args: &[Expr], span: Span) -> Ty {
        let fields: Vec<(String, Ty)> = self.out.records[rid]
            .fields
            .iter()
            .filter_map(|fl| fl.name.clone().map(|n| (n, fl.ty.clone())))
            .collect();
        let ok = self.arity(f, fields.len(), args.len(), span, " (one per named field)");
        for (i, a) in args.iter().enumerate() {
            let t = self.expr(a);
            if ok {
                let (n, ft) = &fields[i];
                let what = format!("field `{n}` of `{}`", f.name);
                if self.expect_ty(&t, ft, a.span, &what) {
                    self.fits(&t, ft, a.span, &what);
                }
            }
        }
        Ty::Record(rid, f.name.clone())
    }

    fn builtin(&mut self, f: &Ident, args: &[Expr], span: Span) -> Ty {
        match f.name.as_str() {
            "hash" | "len" => {
                if !self.arity(f, 1, args.len(), span, "") {
                    args.iter().for_each(|a| drop(self.expr(a)));
                    return Ty::int();
                }
                let t = self.expr(&args[0]);
                let r = self.uni.resolve(&t);
                let ok = match (f.name.as_str(), r.behind_refs()) {
                    (_, Ty::Error | Ty::Var(_)) => true,
                    // A single channel hashes its connection's addresses and
                    // ports (a balancer's per-connection choice).
                    ("hash", Ty::ChanArray(..) | Ty::None | Ty::Dict(..)) => false,
                    ("hash", _) => true,
                    (
                        _,
                        Ty::Str { .. }
                        | Ty::Bytes { .. }
                        | Ty::List(..)
                        | Ty::Dict(..)
                        | Ty::ChanArray(..),
                    ) => true,
                    _ => false,
                };
                if !ok {
                    let what = if f.name == "hash" {
                        "hashes values, not"
                    } else {
                        "measures strings, bytes, lists, dictionaries and channel arrays, not"
                    };
                    self.diags.push(
                        Diagnostic::error(
                            "E0203",
                            format!("`{}` {what} `{r}`", f.name),
                            args[0].span,
                        )
                        .label(format!("this is `{r}`")),
                    );
                }
                Ty::Int {
                    signed: false,
                    bytes: 8,
                }
            }
            "least_connections" => {
                let int = Ty::Int {
                    signed: false,
                    bytes: 8,
                };
                if !self.arity(f, 1, args.len(), span, "") {
                    args.iter().for_each(|a| drop(self.expr(a)));
                    return int;
                }
                let t = self.expr(&args[0]);
                let r = self.uni.resolve(&t);
                if !matches!(r.behind_refs(), Ty::ChanArray(..) | Ty::Error | Ty::Var(_)) {
                    self.diags.push(
                        Diagnostic::error(
                            "E0203",
                            format!("`least_connections` chooses among a channel array, not `{r}`"),
                            args[0].span,
                        )
                        .label(format!("this is `{r}`"))
                        .hint("give it the channel array of the peers, as in `least_connections(backends)`"),
                    );
                }
                int
            }
            "empty_dict" => {
                self.arity(f, 0, args.len(), span, "");
                args.iter().for_each(|a| drop(self.expr(a)));
                self.empty_dict()
            }
            "all_ready" => {
                if !self.arity(f, 1, args.len(), span, "") {
                    args.iter().for_each(|a| drop(self.expr(a)));
                    return Ty::Bool;
                }
                let t = self.expr(&args[0]);
                self.readable_array(&t, &args[0], "all_ready");
                Ty::Bool
            }
            "fold" | "map" | "filter" => self.iteration(f, args, span),
            n if crate::builtins::STRING_BUILTINS.contains(&n) => {
                self.string_builtin(f, args, span)
            }
            n if crate::builtins::PACKET_BUILTINS.contains(&n) => {
                self.packet_builtin(f, args, span)
            }
            _ => unreachable!("every built-in is handled"),
        }
    }

    /// The element type of a channel array that can be read, or `Error`.
    pub(crate) fn readable_array(&mut self, t: &Ty, e: &Expr, what: &str) -> Ty {
        match self.uni.resolve(t).behind_refs() {
            Ty::ChanArray(c, _) => match &c.input {
                Some(t) => (**t).clone(),
                None => {
                    self.diags.push(
                        Diagnostic::error(
                            "E0301",
                            format!("`{what}` reads channels that are write-only"),
                            e.span,
                        )
                        .label(format!("this is `[{c}]`: nothing can be read from it"))
                        .hint("declare the channels with an input type, as in `[kv/-] mappers`"),
                    );
                    Ty::Error
                }
            },
            Ty::Error => Ty::Error,
            other => {
                self.diags.push(
                    Diagnostic::error(
                        "E0303",
                        format!("`{what}` works on an array of channels"),
                        e.span,
                    )
                    .label(format!("this is `{other}`")),
                );
                Ty::Error
            }
        }
    }

    /// `fold(f, acc, xs)`, `map(f, xs)`, `filter(p, xs)`: bounded iteration.
    fn iteration(&mut self, f: &Ident, args: &[Expr], span: Span) -> Ty {
        let n = if f.name == "fold" { 3 } else { 2 };
        if !self.arity(f, n, args.len(), span, "") {
            args.iter().for_each(|a| drop(self.expr(a)));
            return Ty::Error;
        }
        let list = &args[n - 1];
        let lt = self.expr(list);
        let acc = if n == 3 {
            Some(self.expr(&args[1]))
        } else {
            None
        };
        let (elem, max) = match self.uni.resolve(&lt).behind_refs() {
            Ty::List(e, max) => ((**e).clone(), *max),
            t @ (Ty::Chan(_) | Ty::ChanArray(..)) => {
                let (what, why) = if matches!(t, Ty::Chan(_)) {
                    ("a channel", "a channel is an unbounded stream")
                } else {
                    ("channels", "channels are unbounded streams")
                };
                self.diags.push(
                    Diagnostic::error(
                        "E0403",
                        format!("`{}` over {what} would never end", f.name),
                        list.span,
                    )
                    .label(why)
                    .hint("iterate over bounded lists only; a process rule handles each value a channel delivers, and foldt merges channel arrays"),
                );
                (Ty::Error, 0)
            }
            Ty::Error => (Ty::Error, 0),
            other => {
                self.diags.push(
                    Diagnostic::error(
                        "E0403",
                        format!("`{}` iterates over a list, not `{other}`", f.name),
                        list.span,
                    )
                    .label(format!("this is `{other}`")),
                );
                (Ty::Error, 0)
            }
        };
        let fun = &args[0];
        let ExprKind::Var(fname) = &fun.kind else {
            self.expr(fun);
            self.diags.push(
                Diagnostic::error(
                    "E0404",
                    format!("the first argument of `{}` must name a function", f.name),
                    fun.span,
                )
                .label("not a function's name")
                .hint("Flick functions are first-order: define the function with `fun` and pass its name"),
            );
            return Ty::Error;
        };
        let Some(&id) = self.fun_ids.get(&fname.name) else {
            let mut d = Diagnostic::error(
                "E0404",
                format!("`{}` is not a function", fname.name),
                fname.span,
            )
            .label(format!("`{}` needs a function's name here", f.name));
            if let Some(s) = closest(&fname.name, self.fun_ids.keys().cloned()) {
                d = d.hint(format!("did you mean `{s}`?"));
            }
            self.diags.push(d);
            return Ty::Error;
        };
        if let Some(caller) = self.current_fun {
            self.calls.push((caller, id, fname.span));
        }
        let sig = self.out.functions[id].clone();
        let (want_params, shape) = match f.name.as_str() {
            "fold" => (2, "(accumulator, element) -> (accumulator)"),
            "map" => (1, "(element) -> (result)"),
            _ => (1, "(element) -> (bool)"),
        };
        if sig.params.len() != want_params {
            self.diags.push(
                Diagnostic::error(
                    "E0404",
                    format!(
                        "`{}` needs a function of {want_params} parameter{}, and `{}` has {}",
                        f.name,
                        if want_params == 1 { "" } else { "s" },
                        sig.name,
                        sig.params.len()
                    ),
                    fname.span,
                )
                .hint(format!("its function has the shape {shape}")),
            );
            return Ty::Error;
        }
        let what = format!("`{}` called by `{}`", sig.name, f.name);
        match f.name.as_str() {
            "fold" => {
                let acc = acc.expect("fold has an accumulator");
                self.expect_ty(&acc, &sig.params[0].1, args[1].span, &what);
                self.expect_ty(&elem, &sig.params[1].1, list.span, &what);
                self.expect_ty(&sig.result, &sig.params[0].1, fname.span, &what);
                sig.result
            }
            "map" => {
                self.expect_ty(&elem, &sig.params[0].1, list.span, &what);
                Ty::List(Box::new(sig.result), max)
            }
            _ => {
                self.expect_ty(&elem, &sig.params[0].1, list.span, &what);
                self.expect_ty(&sig.result, &Ty::Bool, fname.span, &what);
                Ty::List(Box::new(elem), max)
            }
        }
    }

    fn foldt(&mut self, f: &Foldt) -> Ty {
        let ct = self.expr(&f.channels);
        let elem = self.readable_array(&ct, &f.channels, "foldt");
        let key = match self.uni.resolve(&elem) {
            Ty::Record(id, rname) => match self.out.records[id].field(&f.order_field.name) {
                Some((_, fl)) => fl.ty.clone(),
                None => {
                    self.diags.push(
                        Diagnostic::error(
                            "E0105",
                            format!("record `{rname}` has no field `{}`", f.order_field.name),
                            f.order_field.span,
                        )
                        .label("foldt orders by this field"),
                    );
                    Ty::Error
                }
            },
            Ty::Error => Ty::Error,
            other => {
                self.diags.push(
                    Diagnostic::error(
                        "E0204",
                        format!(
                            "foldt orders records by a field, but the channels carry `{other}`"
                        ),
                        f.channels.span,
                    )
                    .label(format!("carries `{other}`")),
                );
                Ty::Error
            }
        };
        self.push_scope();
        self.bind(&f.left.name, elem.clone(), BindKind::Let);
        self.bind(&f.right.name, elem.clone(), BindKind::Let);
        self.bind(&f.key.name, key, BindKind::Let);
        let body = self.block(&f.body);
        self.pop_scope();
        let span = f.body.stmts.last().map_or(f.body.span, |s| s.span);
        self.expect_ty(&body, &elem, span, "foldt combines two elements into one");
        elem
    }

    /// Checks a block in a new scope; its value is its last expression's.
    pub(crate) fn block(&mut self, b: &Block) -> Ty {
        self.push_scope();
        let mut last = Ty::unit();
        for s in &b.stmts {
            last = self.stmt(s);
        }
        self.pop_scope();
        last
    }

    fn stmt(&mut self, s: &Stmt) -> Ty {
        match &s.kind {
            StmtKind::Let { name, ty, value } => {
                let t = self.expr(value);
                let t = match ty {
                    Some(te) => {
                        let declared = self.resolve_type(te, &crate::decls::SizeScope::Constant);
                        let what = format!("`{}`", name.name);
                        if self.expect_ty(&t, &declared, value.span, &what) {
                            self.fits(&t, &declared, value.span, &what);
                        }
                        declared
                    }
                    None => t,
                };
                if matches!(self.uni.shallow(&t), Ty::None) {
                    self.diags.push(
                        Diagnostic::error("E0209", "`None` only compares", value.span)
                            .hint("`None` is what a dictionary lookup yields for a missing key; test it with `d[k] = None`"),
                    );
                }
                self.bind(&name.name, t, BindKind::Let);
                if let Some(array) = in_range_of(value) {
                    if let Some((_, b)) = self.scopes.last_mut().and_then(|s| s.last_mut()) {
                        b.index_of = Some(array);
                    }
                }
                Ty::unit()
            }
            StmtKind::Assign { place, value } => {
                self.assign(place, value);
                Ty::unit()
            }
            StmtKind::Send { value, channel } => {
                let t = self.expr(value);
                self.send(&t, value.span, channel);
                Ty::unit()
            }
            StmtKind::If {
                cond,
                then,
                otherwise,
            } => {
                let c = self.expr(cond);
                if self.uni.unify(&c, &Ty::Bool).is_err() {
                    let found = self.uni.resolve(&c);
                    self.diags.push(
                        Diagnostic::error(
                            "E0206",
                            format!("a condition is a `bool`, not `{found}`"),
                            cond.span,
                        )
                        .label(format!("this is `{found}`")),
                    );
                }
                let a = self.block(then);
                match otherwise {
                    Some(o) => {
                        let b = self.block(o);
                        let a_unit = self.uni.resolve(&a).is_unit();
                        let b_unit = self.uni.resolve(&b).is_unit();
                        if a_unit || b_unit {
                            Ty::unit()
                        } else if self.uni.unify(&a, &b).is_err() {
                            let (x, y) = (self.uni.resolve(&a), self.uni.resolve(&b));
                            let at = |blk: &Block| blk.stmts.last().map_or(blk.span, |st| st.span);
                            self.diags.push(
                                Diagnostic::error(
                                    "E0201",
                                    format!("the branches of this `if` end with different types: `{x}` and `{y}`"),
                                    at(then),
                                )
                                .label(format!("this is `{x}`"))
                                .also(at(o), format!("this is `{y}`"))
                                .hint("an `if` used as a value needs both branches to end with the same type"),
                            );
                            Ty::Error
                        } else {
                            a
                        }
                    }
                    None => Ty::unit(),
                }
            }
            StmtKind::Expr(e) => self.expr(e),
        }
    }

    fn assign(&mut self, place: &Expr, value: &Expr) {
        let vt = self.expr(value);
        match &place.kind {
            ExprKind::Var(v) => {
                let Some(b) = self.lookup(&v.name).cloned() else {
                    self.var(v);
                    return;
                };
                match b.kind {
                    BindKind::State(_) | BindKind::RefParam => {
                        self.expect_ty(&vt, &b.ty, value.span, &format!("`{}`", v.name));
                    }
                    _ => self.diags.push(
                        Diagnostic::error("E0207", format!("`{}` cannot be assigned", v.name), v.span)
                            .label("immutable")
                            .hint("`:=` assigns state variables, `ref` parameters and dictionary entries; bind a new name with `let`"),
                    ),
                }
                self.out.expr_types.insert(place.span, b.ty);
            }
            ExprKind::Index(d, k) => {
                let t = self.expr(place);
                let dt = self
                    .out
                    .expr_types
                    .get(&d.span)
                    .cloned()
                    .unwrap_or(Ty::Error);
                match self.uni.resolve(&dt).behind_refs() {
                    Ty::Dict(..) => {
                        self.expect_ty(&vt, &t, value.span, "dictionary value");
                    }
                    Ty::Error => {}
                    other => self.diags.push(
                        Diagnostic::error(
                            "E0207",
                            format!("`{other}` entries cannot be assigned"),
                            place.span,
                        )
                        .label("not a dictionary")
                        .hint("only dictionary entries are assigned by index"),
                    ),
                }
                let _ = k;
            }
            ExprKind::Field(..) => {
                self.expr(place);
                self.diags.push(
                    Diagnostic::error("E0207", "record fields cannot be assigned", place.span)
                        .label("a field")
                        .hint("records are values: build a new one with the record's constructor"),
                );
            }
            _ => {
                self.expr(place);
                self.diags.push(
                    Diagnostic::error("E0207", "this cannot be assigned", place.span).hint(
                        "`:=` assigns state variables, `ref` parameters and dictionary entries",
                    ),
                );
            }
        }
    }

    /// Checks `value => channel`; returns whether the channel is writable.
    pub(crate) fn send(&mut self, t: &Ty, vspan: Span, channel: &Expr) -> bool {
        let ct = self.expr(channel);
        match self.uni.resolve(&ct).behind_refs() {
            Ty::Chan(c) => {
                match &c.output {
                    Some(out) => {
                        self.expect_ty(t, out, vspan, &format!("value sent on `{c}`"));
                        true
                    }
                    None => {
                        self.diags.push(
                        Diagnostic::error("E0302", "cannot write to a read-only channel", channel.span)
                            .label(format!("this is `{c}`: nothing can be written to it"))
                            .hint("a channel `In/-` is read-only; declare an output type to write to it"),
                    );
                        false
                    }
                }
            }
            Ty::ChanArray(c, _) => {
                self.diags.push(
                    Diagnostic::error(
                        "E0303",
                        "a value goes to one channel of an array",
                        channel.span,
                    )
                    .label(format!("this is `[{c}]`"))
                    .hint("choose the channel by index, as in `backends[i]`"),
                );
                false
            }
            Ty::Error => false,
            other => {
                self.diags.push(
                    Diagnostic::error(
                        "E0303",
                        format!("`=>` sends to a channel, not `{other}`"),
                        channel.span,
                    )
                    .label(format!("this is `{other}`")),
                );
                false
            }
        }
    }
}

/// What an unknown function's diagnostic says exists: the nearest name,
/// the built-ins with similar names, or else every built-in.
fn unknown_function_hint(name: &str, near: Option<String>) -> String {
    let builtins = crate::builtins::BUILTINS;
    let similar: Vec<String> = crate::suggest::similar(name, builtins)
        .into_iter()
        .filter(|b| near.as_deref() != Some(*b))
        .map(|b| format!("`{b}`"))
        .collect();
    match (near, similar.is_empty()) {
        (Some(n), true) => format!("did you mean `{n}`?"),
        (Some(n), false) => format!(
            "did you mean `{n}`? Built-ins with similar names: {}",
            similar.join(", ")
        ),
        (None, false) => format!("built-ins with similar names: {}", similar.join(", ")),
        (None, true) => format!(
            "no function of that name is defined; the built-ins are {}",
            builtins
                .iter()
                .map(|b| format!("`{b}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn quoted(names: &[String]) -> String {
    if names.is_empty() {
        return "all anonymous".into();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `E mod len(A)`, with `A` a name: `A`, which it always indexes in range
/// (`mod` is Euclidean: never negative).
fn in_range_of(e: &Expr) -> Option<String> {
    let ExprKind::Binary(BinOp::Mod, _, d) = &e.kind else {
        return None;
    };
    let ExprKind::Call(f, args) = &d.kind else {
        return None;
    };
    match (f.name.as_str(), args.as_slice()) {
        ("len", [a]) => match &a.kind {
            ExprKind::Var(v) => Some(v.name.clone()),
            _ => None,
        },
        _ => None,
    }
}
