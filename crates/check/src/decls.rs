//! Declarations: collecting names, resolving written types, validating
//! annotations and record layouts (including `size=` expressions).

use crate::checker::Checker;
use crate::limits::*;
use crate::program::{Record, RecordField};
use crate::types::{ChanTy, Ty};
use flick_span::{Diagnostic, Span};
use flick_syntax::ast::*;

/// An earlier field of the record being resolved, visible to `size=`.
pub(crate) struct EarlierField<'a> {
    pub name: &'a str,
    pub ty: Ty,
}

/// What a `size=` expression may refer to.
pub(crate) enum SizeScope<'a> {
    /// Outside records: constants only.
    Constant,
    /// In a record: constants and the earlier integer fields; `later`
    /// lists the names declared after this field, for a precise error.
    Record {
        earlier: &'a [EarlierField<'a>],
        later: &'a [&'a str],
    },
}

impl<'p> Checker<'p> {
    /// Registers every type, function and process name, reporting duplicates.
    pub(crate) fn collect(&mut self) {
        let mut seen: std::collections::HashMap<&str, Span> = Default::default();
        for decl in &self.program.decls {
            let name = match decl {
                Decl::Grammar(g) => {
                    if let Some(prev) = &self.out.grammar {
                        self.diags.push(
                            Diagnostic::error(
                                "E0104",
                                format!("a program names one grammar; `{prev}` was named already"),
                                g.span,
                            )
                            .label("second grammar"),
                        );
                    } else {
                        self.out.grammar = Some(g.name.name.clone());
                        self.out.grammar_span = g.name.span;
                    }
                    continue;
                }
                Decl::Type(t) => &t.name,
                Decl::Proc(p) => &p.name,
                Decl::Fun(f) => &f.name,
            };
            if let Some(prev) = seen.get(name.name.as_str()) {
                self.diags.push(
                    Diagnostic::error(
                        "E0104",
                        format!("`{}` is defined twice", name.name),
                        name.span,
                    )
                    .label("second definition")
                    .also(*prev, "first definition"),
                );
                continue;
            }
            if crate::builtins::is_builtin(&name.name) {
                self.diags.push(
                    Diagnostic::error(
                        "E0104",
                        format!("`{}` is a built-in and cannot be redefined", name.name),
                        name.span,
                    )
                    .hint("choose another name"),
                );
                continue;
            }
            seen.insert(&name.name, name.span);
            match decl {
                Decl::Type(t) => match &t.body {
                    TypeBody::Record(_) => {
                        self.record_ids
                            .insert(t.name.name.clone(), self.record_decls.len());
                        self.record_decls.push(t);
                    }
                    TypeBody::Alias(ty) => {
                        self.aliases.insert(t.name.name.clone(), ty);
                    }
                },
                Decl::Fun(f) => {
                    self.fun_ids
                        .insert(f.name.name.clone(), self.fun_decls.len());
                    self.fun_decls.push(f);
                }
                Decl::Proc(p) => self.proc_decls.push(p),
                Decl::Grammar(_) => {}
            }
        }
    }

    /// Resolves every type alias once, in declaration order, so that an
    /// alias's errors are reported even when nothing uses it.
    pub(crate) fn resolve_aliases(&mut self) {
        for decl in &self.program.decls {
            if let Decl::Type(TypeDecl {
                name,
                body: TypeBody::Alias(_),
                ..
            }) = decl
            {
                // Duplicates and built-in names were reported, not registered.
                if !self.aliases.contains_key(&name.name) {
                    continue;
                }
                let named = TypeExpr {
                    kind: TypeKind::Named(name.clone()),
                    annotations: Vec::new(),
                    span: name.span,
                };
                self.resolve_type(&named, &SizeScope::Constant);
            }
        }
    }

    /// Resolves every record's fields, in declaration order.
    pub(crate) fn resolve_records(&mut self) {
        for (id, decl) in self.record_decls.clone().into_iter().enumerate() {
            let TypeBody::Record(fields) = &decl.body else {
                unreachable!("only records are registered as records")
            };
            let mut earlier: Vec<EarlierField> = Vec::new();
            let mut out_fields = Vec::new();
            let names: Vec<&str> = fields
                .iter()
                .filter_map(|f| f.name.as_ref().map(|n| n.name.as_str()))
                .collect();
            for (i, f) in fields.iter().enumerate() {
                if let Some(n) = &f.name {
                    if let Some(prev) = fields[..i]
                        .iter()
                        .find(|g| g.name.as_ref().is_some_and(|g| g.name == n.name))
                    {
                        self.diags.push(
                            Diagnostic::error(
                                "E0104",
                                format!("field `{}` is declared twice", n.name),
                                n.span,
                            )
                            .also(prev.span, "first declaration"),
                        );
                    }
                }
                let later_start =
                    names.len() - fields[i + 1..].iter().filter(|g| g.name.is_some()).count();
                let later = &names[later_start..];
                let scope = SizeScope::Record {
                    earlier: &earlier,
                    later,
                };
                self.wire_max = f.name.as_ref().and_then(|n| {
                    self.wire_limits
                        .get(&(decl.name.name.clone(), n.name.clone()))
                        .copied()
                });
                let ty = self.resolve_type(&f.ty, &scope);
                self.wire_max = None;
                let size =
                    f.ty.annotations
                        .iter()
                        .find(|a| a.name.name == "size")
                        .filter(|_| matches!(ty, Ty::Str { .. } | Ty::Bytes { .. } | Ty::List(..)))
                        .map(|a| a.value.clone());
                if let Some(n) = &f.name {
                    earlier.push(EarlierField {
                        name: &n.name,
                        ty: ty.clone(),
                    });
                }
                out_fields.push(RecordField {
                    name: f.name.as_ref().map(|n| n.name.clone()),
                    ty,
                    size,
                    max_bytes: 0,
                    span: f.span,
                });
            }
            debug_assert_eq!(id, self.out.records.len());
            self.out.records.push(Record {
                name: decl.name.name.clone(),
                fields: out_fields,
                span: decl.span,
            });
        }
        // Field sizes need every record resolved, and a record that
        // contains itself has no size at all.
        for id in 0..self.out.records.len() {
            let mut visiting = Vec::new();
            self.record_bytes(id, &mut visiting);
        }
    }

    /// The most bytes a value of record `id` occupies, filling in
    /// `max_bytes` of its fields.
    fn record_bytes(&mut self, id: usize, visiting: &mut Vec<usize>) -> u64 {
        if let Some(b) = self.record_sizes.get(&id) {
            return *b;
        }
        if let Some(pos) = visiting.iter().position(|v| *v == id) {
            let cycle: Vec<&str> = visiting[pos..]
                .iter()
                .chain(std::iter::once(&id))
                .map(|r| self.out.records[*r].name.as_str())
                .collect();
            let decl = self.record_decls[id];
            self.diags.push(
                Diagnostic::error(
                    "E0507",
                    format!("record `{}` contains itself", decl.name.name),
                    decl.name.span,
                )
                .label(cycle.join(" contains "))
                .hint("a value must have a bounded size: use a list with a `max` for nesting"),
            );
            self.record_sizes.insert(id, 0);
            return 0;
        }
        visiting.push(id);
        let mut total: u64 = 0;
        for i in 0..self.out.records[id].fields.len() {
            let ty = self.out.records[id].fields[i].ty.clone();
            let b = self.bytes_in(&ty, visiting);
            self.out.records[id].fields[i].max_bytes = b;
            total = total.saturating_add(b);
        }
        visiting.pop();
        self.record_sizes.insert(id, total);
        total
    }

    /// The most bytes a value of type `ty` occupies.
    pub(crate) fn value_bytes(&mut self, ty: &Ty) -> u64 {
        self.bytes_in(ty, &mut Vec::new())
    }

    fn bytes_in(&mut self, ty: &Ty, visiting: &mut Vec<usize>) -> u64 {
        match self.uni.resolve(ty) {
            Ty::Int { bytes, .. } => bytes as u64,
            Ty::Bool => 1,
            Ty::Str { max } | Ty::Bytes { max } => max,
            Ty::Record(id, _) => self.record_bytes(id, visiting),
            Ty::List(t, n) => n.saturating_mul(self.bytes_in(&t, visiting)),
            Ty::Tuple(ts) => ts.iter().fold(0u64, |acc, t| {
                acc.saturating_add(self.bytes_in(t, visiting))
            }),
            Ty::Dict(k, v, n) => {
                let entry = self
                    .bytes_in(&k, visiting)
                    .saturating_add(self.bytes_in(&v, visiting));
                n.saturating_mul(entry)
            }
            // A reference is a pointer to a value counted where it lives.
            Ty::Ref(_) => 8,
            Ty::Meter { .. } => crate::types::METER_BYTES,
            Ty::Bloom { bits, .. } => crate::types::bloom_bytes(bits),
            Ty::Chan(_) | Ty::ChanArray(..) | Ty::None | Ty::Var(_) | Ty::Error => 0,
        }
    }

    /// Resolves a written type, checking its annotations.
    pub(crate) fn resolve_type(&mut self, te: &TypeExpr, scope: &SizeScope) -> Ty {
        let allowed: &[&str] = match &te.kind {
            TypeKind::Integer => &["size", "signed"],
            TypeKind::String | TypeKind::Bytes => &["size", "max"],
            TypeKind::List(_) => &["size", "max"],
            TypeKind::Dict(..) => &["capacity", "idle", "evict"],
            TypeKind::ChanArray(_) => &["max"],
            TypeKind::Named(n) => crate::types::object_annotations(&n.name).unwrap_or(&[]),
            _ => &[],
        };
        // An unknown type's annotations are reported with the type.
        let unknown = matches!(&te.kind, TypeKind::Named(n)
            if !self.record_ids.contains_key(&n.name) && !self.aliases.contains_key(&n.name)
                && crate::types::object_annotations(&n.name).is_none());
        for a in te.annotations.iter().filter(|_| !unknown) {
            if !allowed.contains(&a.name.name.as_str()) {
                let kind = describe_kind(&te.kind);
                let d = Diagnostic::error(
                    "E0108",
                    format!("`{}` is not an annotation of {kind}", a.name.name),
                    a.name.span,
                );
                self.diags.push(if allowed.is_empty() {
                    d.hint(format!("{kind} takes no annotations"))
                } else {
                    d.hint(format!("{kind} takes {}", allowed.join(", ")))
                });
            }
        }
        match &te.kind {
            TypeKind::Integer => {
                let mut bytes = DEFAULT_INTEGER_BYTES;
                let mut signed = true;
                if let Some(a) = annotation(te, "size") {
                    match self.const_value(&a.value) {
                        Some(n @ (1 | 2 | 4 | 8)) => bytes = n as u8,
                        Some(n) => self.diags.push(
                            Diagnostic::error(
                                "E0503",
                                format!("an integer cannot be {n} bytes wide"),
                                a.value.span,
                            )
                            .hint("integer sizes are 1, 2, 4 or 8 bytes"),
                        ),
                        None => {}
                    }
                }
                if let Some(a) = annotation(te, "signed") {
                    match a.value.kind {
                        ExprKind::Bool(b) => signed = b,
                        _ => self.diags.push(
                            Diagnostic::error(
                                "E0503",
                                "`signed` is `true` or `false`",
                                a.value.span,
                            )
                            .label("not a boolean"),
                        ),
                    }
                }
                Ty::Int { signed, bytes }
            }
            TypeKind::String | TypeKind::Bytes => {
                let default = self.wire_max.take().unwrap_or(DEFAULT_BYTES_MAX);
                let max = self.byte_limit(te, scope, default);
                if matches!(te.kind, TypeKind::String) {
                    Ty::Str { max }
                } else {
                    Ty::Bytes { max }
                }
            }
            TypeKind::Bool => Ty::Bool,
            TypeKind::Named(name) => {
                if let Some(id) = self.record_ids.get(&name.name) {
                    return Ty::Record(*id, name.name.clone());
                }
                if let Some(t) = self.alias_types.get(&name.name) {
                    return t.clone();
                }
                if let Some(alias) = self.aliases.get(&name.name).copied() {
                    if self.resolving.contains(&name.name) {
                        self.diags.push(
                            Diagnostic::error(
                                "E0507",
                                format!("type `{}` is defined in terms of itself", name.name),
                                name.span,
                            )
                            .hint("a value must have a bounded size"),
                        );
                        return Ty::Error;
                    }
                    self.resolving.push(name.name.clone());
                    let t = self.resolve_type(alias, &SizeScope::Constant);
                    self.resolving.pop();
                    self.alias_types.insert(name.name.clone(), t.clone());
                    return t;
                }
                if let Some(t) = self.object_type(te, &name.name) {
                    return t;
                }
                let mut d =
                    Diagnostic::error("E0103", format!("unknown type `{}`", name.name), name.span)
                        .label("not defined");
                let known = ["integer", "string", "bytes", "bool", "list", "dict", "ref"]
                    .into_iter()
                    .map(String::from)
                    .chain(self.record_ids.keys().cloned())
                    .chain(self.aliases.keys().cloned());
                if let Some(s) = crate::suggest::closest(&name.name, known) {
                    d = d.hint(format!("did you mean `{s}`?"));
                }
                self.diags.push(d);
                Ty::Error
            }
            TypeKind::List(elem) => {
                let elem = self.resolve_type(elem, &SizeScope::Constant);
                let max = self.count_limit(te, scope, DEFAULT_LIST_MAX);
                Ty::List(Box::new(elem), max)
            }
            TypeKind::Tuple(ts) => Ty::Tuple(
                ts.iter()
                    .map(|t| self.resolve_type(t, &SizeScope::Constant))
                    .collect(),
            ),
            TypeKind::Dict(k, v) => {
                let k = self.resolve_type(k, &SizeScope::Constant);
                let v = self.resolve_type(v, &SizeScope::Constant);
                let cap = self.positive_const(te, "capacity", DEFAULT_DICT_CAPACITY);
                self.table_policy(te);
                Ty::Dict(Box::new(k), Box::new(v), cap)
            }
            TypeKind::Ref(t) => Ty::Ref(Box::new(self.resolve_type(t, &SizeScope::Constant))),
            TypeKind::Chan(c) => Ty::Chan(self.chan(c)),
            TypeKind::ChanArray(c) => {
                let max = self.positive_const(te, "max", DEFAULT_CHANNEL_ARRAY_MAX);
                Ty::ChanArray(self.chan(c), max)
            }
        }
    }

    fn chan(&mut self, c: &ChanType) -> ChanTy {
        let mut side = |s: &Option<Box<TypeExpr>>| {
            s.as_ref()
                .map(|t| Box::new(self.resolve_type(t, &SizeScope::Constant)))
        };
        ChanTy {
            input: side(&c.input),
            output: side(&c.output),
        }
    }

    /// The byte bound of a string or bytes type: its constant `size`, or
    /// the upper bound of its `size` expression capped by `max` or the
    /// default.
    fn byte_limit(&mut self, te: &TypeExpr, scope: &SizeScope, default: u64) -> u64 {
        let cap = self.positive_const(te, "max", default);
        let Some(size) = annotation(te, "size") else {
            return cap;
        };
        let Some((lo, hi)) = self.size_interval(&size.value, scope) else {
            return cap;
        };
        if lo == hi && lo >= 0 {
            let n = lo as u64;
            if annotation(te, "max").is_some() && n > cap {
                self.diags.push(
                    Diagnostic::error(
                        "E0503",
                        format!("`size` is {n} but `max` is {cap}"),
                        size.value.span,
                    )
                    .hint("a fixed size needs no `max`"),
                );
            }
            return n;
        }
        if hi < 0 {
            self.diags.push(
                Diagnostic::error("E0503", "this size is always negative", size.value.span)
                    .label(format!("at most {hi}")),
            );
            return 0;
        }
        (hi as u64).min(cap)
    }

    fn count_limit(&mut self, te: &TypeExpr, scope: &SizeScope, default: u64) -> u64 {
        self.byte_limit(te, scope, default)
    }

    /// A positive constant annotation, or `default` when absent.
    /// Checks a dictionary's `idle=` (seconds, a positive constant) and
    /// `evict=` (`refuse`, `lru` or `idle`, which needs `idle=`). They
    /// shape a packet program's `global` flow tables; elsewhere they are
    /// accepted and have no effect.
    fn table_policy(&mut self, te: &TypeExpr) {
        let idle = annotation(te, "idle").is_some();
        if idle {
            self.positive_const(te, "idle", 1);
        }
        let Some(a) = annotation(te, "evict") else {
            return;
        };
        match &a.value.kind {
            ExprKind::Var(v) if v.name == "idle" && !idle => self.diags.push(
                Diagnostic::error("E0503", "`evict=idle` needs an `idle=` time", a.value.span)
                    .label("no `idle` annotation on this dictionary")
                    .hint("add `idle=SECONDS`, as in `{idle=30, evict=idle}`"),
            ),
            ExprKind::Var(v) if is_evict_policy(&v.name) => {}
            _ => self.diags.push(
                Diagnostic::error(
                    "E0503",
                    "`evict` is `refuse`, `lru` or `idle`",
                    a.value.span,
                )
                .label("not an eviction policy"),
            ),
        }
    }

    fn positive_const(&mut self, te: &TypeExpr, name: &str, default: u64) -> u64 {
        let Some(a) = annotation(te, name) else {
            return default;
        };
        match self.const_value(&a.value) {
            Some(n) if n > 0 => n as u64,
            Some(_) => {
                self.diags.push(
                    Diagnostic::error(
                        "E0503",
                        format!("`{name}` must be at least 1"),
                        a.value.span,
                    )
                    .label("too small"),
                );
                default
            }
            None => default,
        }
    }

    /// Evaluates an annotation that must be a constant.
    pub(crate) fn const_value(&mut self, e: &Expr) -> Option<i128> {
        self.size_interval(e, &SizeScope::Constant)
            .and_then(|(lo, hi)| (lo == hi).then_some(lo))
    }

    /// The range of values a `size=` expression can take, from the ranges of
    /// the integer fields it reads. `None` after reporting an error.
    fn size_interval(&mut self, e: &Expr, scope: &SizeScope) -> Option<(i128, i128)> {
        match &e.kind {
            ExprKind::Int { value, .. } => Some((*value as i128, *value as i128)),
            ExprKind::Var(v) => {
                let SizeScope::Record { earlier, later } = scope else {
                    self.diags.push(
                        Diagnostic::error("E0505", "this size must be a constant", v.span)
                            .label("a name is allowed only in a record field's size")
                            .hint("write a number, or move the value into a record field"),
                    );
                    return None;
                };
                if let Some(f) = earlier.iter().find(|f| f.name == v.name) {
                    return match self.uni.resolve(&f.ty) {
                        Ty::Int { signed, bytes } => Some(int_range(signed, bytes)),
                        Ty::Error => None,
                        other => {
                            self.diags.push(
                                Diagnostic::error(
                                    "E0502",
                                    format!("size refers to `{}`, which is not an integer", v.name),
                                    v.span,
                                )
                                .label(format!("`{}` is `{other}`", v.name))
                                .hint("sizes are computed from earlier integer fields"),
                            );
                            None
                        }
                    };
                }
                let d = if later.contains(&v.name.as_str()) {
                    Diagnostic::error(
                        "E0501",
                        format!("size refers to `{}`, a later field", v.name),
                        v.span,
                    )
                    .label("declared after this field")
                    .hint("a field's size may depend only on fields before it: parsing reads them first")
                } else {
                    Diagnostic::error(
                        "E0502",
                        format!(
                            "size refers to `{}`, which is not a field of this record",
                            v.name
                        ),
                        v.span,
                    )
                    .label("unknown field")
                };
                self.diags.push(d);
                None
            }
            ExprKind::Binary(op, a, b) => {
                let (al, ah) = self.size_interval(a, scope)?;
                let (bl, bh) = self.size_interval(b, scope)?;
                match op {
                    BinOp::Add => Some((al.saturating_add(bl), ah.saturating_add(bh))),
                    BinOp::Sub => Some((al.saturating_sub(bh), ah.saturating_sub(bl))),
                    BinOp::Mul => {
                        let m = |x: i128, y: i128| x.saturating_mul(y);
                        let c = [m(al, bl), m(al, bh), m(ah, bl), m(ah, bh)];
                        Some((*c.iter().min().unwrap(), *c.iter().max().unwrap()))
                    }
                    BinOp::Div | BinOp::Mod if bl <= 0 && bh >= 0 => {
                        self.diags.push(
                            Diagnostic::error("E0505", "this size may divide by zero", b.span)
                                .label(format!("ranges over {bl}..={bh}")),
                        );
                        None
                    }
                    BinOp::Div => {
                        let d = |x: i128, y: i128| x.checked_div(y).unwrap_or(i128::MAX);
                        let c = [d(al, bl), d(al, bh), d(ah, bl), d(ah, bh)];
                        Some((*c.iter().min().unwrap(), *c.iter().max().unwrap()))
                    }
                    BinOp::Mod => {
                        let m = bl.saturating_abs().max(bh.saturating_abs()) - 1;
                        Some((if al < 0 { -m } else { 0 }, m))
                    }
                    _ => {
                        self.diags.push(
                            Diagnostic::error(
                                "E0505",
                                format!("`{}` cannot appear in a size", op.symbol()),
                                e.span,
                            )
                            .hint("sizes use numbers, earlier fields and + - * / mod"),
                        );
                        None
                    }
                }
            }
            ExprKind::Anonymous => {
                self.diags.push(
                    Diagnostic::error("E0106", "anonymous fields cannot be read", e.span)
                        .hint("give the field a name to use it in a size"),
                );
                None
            }
            _ => {
                self.diags.push(
                    Diagnostic::error(
                        "E0505",
                        "a size must be arithmetic on numbers and fields",
                        e.span,
                    )
                    .hint("sizes use numbers, earlier fields and + - * / mod"),
                );
                None
            }
        }
    }
}

fn annotation<'a>(te: &'a TypeExpr, name: &str) -> Option<&'a Annotation> {
    te.annotations.iter().find(|a| a.name.name == name)
}

fn int_range(signed: bool, bytes: u8) -> (i128, i128) {
    let bits = bytes as u32 * 8;
    if signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

fn describe_kind(k: &TypeKind) -> &'static str {
    match k {
        TypeKind::Integer => "`integer`",
        TypeKind::String => "`string`",
        TypeKind::Bytes => "`bytes`",
        TypeKind::Bool => "`bool`",
        TypeKind::Named(_) => "a named type",
        TypeKind::List(_) => "`list`",
        TypeKind::Tuple(_) => "a tuple",
        TypeKind::Dict(..) => "`dict`",
        TypeKind::Ref(_) => "`ref`",
        TypeKind::Chan(_) => "a channel",
        TypeKind::ChanArray(_) => "a channel array",
    }
}

fn is_evict_policy(name: &str) -> bool {
    EVICT_POLICIES.contains(&name)
}
