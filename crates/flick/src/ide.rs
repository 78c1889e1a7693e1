//! What an editor asks of a program, answered from its text: diagnostics,
//! hover (types, signatures, memory bounds), go to definition and
//! formatting. Positions are byte offsets; the language server (`lsp.rs`)
//! converts them to the editor's lines and columns.

use flick_check::{CheckedProgram, Ty};
use flick_span::{Diagnostic, Span};
use flick_syntax::ast::*;
use std::path::Path;

/// One version of a program's text, analysed.
pub struct Analysis {
    pub text: String,
    /// Errors, then the checker's warnings.
    pub diagnostics: Vec<Diagnostic>,
    checked: CheckedProgram,
    /// Every name written in the program, with the span of what it names
    /// (a declaration names itself).
    refs: Vec<(Span, Span)>,
}

/// Parses and checks `text` as the file at `path` (its grammar is looked
/// up beside it, as `flick check` does).
pub fn analyse(path: &Path, text: &str) -> Analysis {
    // A program that says `grammar packet` is checked with the packet
    // library after it; what lies in the library has no place in the
    // editor's text.
    let source = crate::views::program_source(text);
    let (checked, mut diagnostics) = crate::views::check_program(path, &source);
    diagnostics.extend(checked.warnings.iter().cloned());
    if let Some(start) = crate::views::library_start(&source) {
        diagnostics.retain(|d| (d.span().start as usize) < start);
    }
    let (program, _) = flick_syntax::parse(&source);
    let mut r = Resolver::default();
    r.program(&program);
    Analysis {
        text: text.to_string(),
        diagnostics,
        checked,
        refs: r.refs,
    }
}

/// The canonical layout of `text`, or its syntax errors.
pub fn format(text: &str) -> Result<String, Vec<Diagnostic>> {
    let (program, comments, diags) = flick_syntax::parse_with_comments(text);
    if diags.is_empty() {
        Ok(flick_syntax::format_with_comments(&program, &comments))
    } else {
        Err(diags)
    }
}

impl Analysis {
    /// The declaration that the name at `offset` refers to.
    pub fn definition(&self, offset: u32) -> Option<Span> {
        self.reference_at(offset)
            .map(|(_, def)| def)
            .filter(|def| (def.end as usize) <= self.text.len())
    }

    /// What to show for the name or expression at `offset`, and the span
    /// it is about.
    pub fn hover(&self, offset: u32) -> Option<(Span, String)> {
        if let Some((at, def)) = self.reference_at(offset) {
            let name = &self.text[at.range()];
            if let Some(text) = self.describe_declaration(name, def) {
                return Some((at, text));
            }
        }
        // The innermost typed expression around the offset.
        let (span, ty) = self
            .checked
            .expr_types
            .iter()
            .filter(|(s, t)| s.start <= offset && offset < s.end && !matches!(t, Ty::Error))
            .min_by_key(|(s, _)| s.end - s.start)?;
        let src = &self.text[span.range()];
        Some((*span, format!("```flick\n{src} : {ty}\n```")))
    }

    fn reference_at(&self, offset: u32) -> Option<(Span, Span)> {
        self.refs
            .iter()
            .find(|(at, _)| at.start <= offset && offset < at.end)
            .copied()
    }

    /// Signatures of functions, fields of records, channels and memory
    /// bounds of processes; the type of anything else bound to a name.
    fn describe_declaration(&self, name: &str, def: Span) -> Option<String> {
        let c = &self.checked;
        if let Some(f) = c
            .functions
            .iter()
            .find(|f| f.name == name && f.span.start <= def.start && def.end <= f.span.end)
        {
            // As declarations write them: channels type first.
            let params: Vec<String> = f
                .params
                .iter()
                .map(|(n, t)| match t {
                    Ty::Chan(_) | Ty::ChanArray(..) => format!("{t} {n}"),
                    _ => format!("{n}: {t}"),
                })
                .collect();
            let result = match &f.result {
                Ty::Tuple(_) => f.result.to_string(),
                t => format!("({t})"),
            };
            return Some(format!(
                "```flick\nfun {}: ({}) -> {result}\n```",
                f.name,
                params.join(", ")
            ));
        }
        if let Some(r) = c
            .records
            .iter()
            .find(|r| r.name == name && r.span.start <= def.start && def.end <= r.span.end)
        {
            let mut s = format!("```flick\ntype {}: record\n", r.name);
            for f in &r.fields {
                let n = f.name.as_deref().unwrap_or("_");
                s.push_str(&format!("  {n} : {}  # at most {} B\n", f.ty, f.max_bytes));
            }
            s.push_str("```");
            return Some(s);
        }
        if let Some(p) = c
            .processes
            .iter()
            .find(|p| p.name == name && p.span.start <= def.start && def.end <= p.span.end)
        {
            let chans: Vec<String> = p.channels.iter().map(|(n, t)| format!("{t} {n}")).collect();
            let b = &p.bounds;
            let mut s = format!("```flick\nproc {}: ({})\n```\n", p.name, chans.join(", "));
            s.push_str(&format!(
                "memory per instance: at most {} B; global state: {} B; operations per message: at most {}",
                b.instance_bytes,
                b.global_bytes,
                b.max_ops()
            ));
            return Some(s);
        }
        // A parameter, channel, state variable or `let`: the type of a use.
        let ty = self
            .refs
            .iter()
            .filter(|(_, d)| *d == def)
            .find_map(|(at, _)| c.expr_types.get(at))?;
        Some(format!("```flick\n{name} : {ty}\n```"))
    }
}

/// Which declaration each name refers to, scope by scope.
#[derive(Default)]
struct Resolver {
    refs: Vec<(Span, Span)>,
    /// Top-level names: functions, types, processes.
    globals: Vec<(String, Span)>,
    /// Names in scope in the body being walked, innermost last.
    locals: Vec<(String, Span)>,
    /// Record fields by record name, for `e.field`.
    fields: Vec<(String, String, Span)>,
}

impl Resolver {
    fn program(&mut self, p: &Program) {
        for d in &p.decls {
            match d {
                Decl::Type(t) => {
                    self.globals.push((t.name.name.clone(), t.name.span));
                    if let TypeBody::Record(fields) = &t.body {
                        for f in fields {
                            if let Some(n) = &f.name {
                                self.fields
                                    .push((t.name.name.clone(), n.name.clone(), n.span));
                            }
                        }
                    }
                }
                Decl::Proc(p) => self.globals.push((p.name.name.clone(), p.name.span)),
                Decl::Fun(f) => self.globals.push((f.name.name.clone(), f.name.span)),
                Decl::Grammar(_) => {}
            }
        }
        for d in &p.decls {
            match d {
                Decl::Type(t) => {
                    self.declare_global(&t.name);
                    if let TypeBody::Record(fields) = &t.body {
                        for f in fields {
                            if let Some(n) = &f.name {
                                self.refs.push((n.span, n.span));
                            }
                            self.type_expr(&f.ty);
                        }
                    } else if let TypeBody::Alias(ty) = &t.body {
                        self.type_expr(ty);
                    }
                }
                Decl::Proc(p) => {
                    self.declare_global(&p.name);
                    self.locals.clear();
                    for param in &p.params {
                        self.bind(&param.name);
                        self.type_expr(&param.ty);
                    }
                    for item in &p.items {
                        if let ProcItem::State(s) = item {
                            self.bind(&s.name);
                        }
                    }
                    for item in &p.items {
                        let mark = self.locals.len();
                        match item {
                            ProcItem::State(s) => {
                                if let Some(t) = &s.ty {
                                    self.type_expr(t);
                                }
                                self.expr(&s.init);
                            }
                            ProcItem::Rule(r) => {
                                self.expr(&r.source);
                                for s in &r.steps {
                                    self.expr(s);
                                }
                            }
                            ProcItem::Guarded(g) => {
                                self.expr(&g.cond);
                                self.block(&g.body);
                            }
                            ProcItem::Handler(h) => {
                                self.name(&h.channel);
                                if let Some(i) = &h.index {
                                    self.bind(i);
                                }
                                self.block(&h.body);
                            }
                        }
                        self.locals.truncate(mark);
                    }
                }
                Decl::Fun(f) => {
                    self.declare_global(&f.name);
                    self.locals.clear();
                    for param in &f.params {
                        self.bind(&param.name);
                        self.type_expr(&param.ty);
                    }
                    for r in &f.results {
                        self.type_expr(r);
                    }
                    self.block(&f.body);
                }
                Decl::Grammar(_) => {}
            }
        }
    }

    fn declare_global(&mut self, name: &Ident) {
        self.refs.push((name.span, name.span));
    }

    fn bind(&mut self, name: &Ident) {
        self.refs.push((name.span, name.span));
        self.locals.push((name.name.clone(), name.span));
    }

    fn lookup(&self, name: &str) -> Option<Span> {
        self.locals
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .or_else(|| self.globals.iter().find(|(n, _)| n == name))
            .map(|(_, s)| *s)
    }

    fn name(&mut self, id: &Ident) {
        if let Some(def) = self.lookup(&id.name) {
            self.refs.push((id.span, def));
        }
    }

    fn block(&mut self, b: &Block) {
        let mark = self.locals.len();
        for s in &b.stmts {
            match &s.kind {
                StmtKind::Let { name, ty, value } => {
                    if let Some(t) = ty {
                        self.type_expr(t);
                    }
                    self.expr(value);
                    self.bind(name);
                }
                StmtKind::Assign { place, value } => {
                    self.expr(place);
                    self.expr(value);
                }
                StmtKind::Send { value, channel } => {
                    self.expr(value);
                    self.expr(channel);
                }
                StmtKind::If {
                    cond,
                    then,
                    otherwise,
                } => {
                    self.expr(cond);
                    self.block(then);
                    if let Some(o) = otherwise {
                        self.block(o);
                    }
                }
                StmtKind::Expr(e) => self.expr(e),
            }
        }
        self.locals.truncate(mark);
    }

    fn type_expr(&mut self, t: &TypeExpr) {
        match &t.kind {
            TypeKind::Named(id) => self.name(id),
            TypeKind::List(t) | TypeKind::Ref(t) => self.type_expr(t),
            TypeKind::Tuple(ts) => ts.iter().for_each(|t| self.type_expr(t)),
            TypeKind::Dict(k, v) => {
                self.type_expr(k);
                self.type_expr(v);
            }
            TypeKind::Chan(c) | TypeKind::ChanArray(c) => {
                for t in [&c.input, &c.output].into_iter().flatten() {
                    self.type_expr(t);
                }
            }
            TypeKind::Integer | TypeKind::String | TypeKind::Bytes | TypeKind::Bool => {}
        }
        for a in &t.annotations {
            self.expr(&a.value);
        }
    }

    fn expr(&mut self, e: &Expr) {
        match &e.kind {
            ExprKind::Var(id) => self.name(id),
            ExprKind::Call(f, args) => {
                self.name(f);
                args.iter().for_each(|a| self.expr(a));
            }
            ExprKind::Field(inner, field) => {
                self.expr(inner);
                // A field of any record that has one by that name: exact
                // when one record has it, the first otherwise.
                if let Some((_, _, span)) = self.fields.iter().find(|(_, n, _)| *n == field.name) {
                    self.refs.push((field.span, *span));
                }
            }
            ExprKind::Unary(_, a) => self.expr(a),
            ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
                self.expr(a);
                self.expr(b);
            }
            ExprKind::Tuple(es) | ExprKind::List(es) => es.iter().for_each(|e| self.expr(e)),
            ExprKind::Foldt(f) => {
                self.expr(&f.channels);
                let mark = self.locals.len();
                self.bind(&f.elem);
                if let Some((_, _, span)) = self
                    .fields
                    .iter()
                    .find(|(_, n, _)| *n == f.order_field.name)
                {
                    self.refs.push((f.order_field.span, *span));
                }
                self.bind(&f.left);
                self.bind(&f.right);
                self.bind(&f.key);
                self.block(&f.body);
                self.locals.truncate(mark);
            }
            ExprKind::Int { .. }
            | ExprKind::Str(_)
            | ExprKind::Bool(_)
            | ExprKind::None
            | ExprKind::Anonymous => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROGRAM: &str = "type cmd: record\n  key : string\n\n\
        proc P: (cmd/cmd client, [cmd/cmd] backends)\n  | backends => client\n  | client => route(backends)\n\n\
        fun route: ([-/cmd] backends, req: cmd) -> ()\n  let target = hash(req.key) mod len(backends)\n  req => backends[target]\n";

    fn at(text: &str, needle: &str, nth: usize) -> u32 {
        text.match_indices(needle).nth(nth).expect("needle").0 as u32
    }

    #[test]
    fn names_lead_to_their_declarations() {
        let a = analyse(Path::new("p.flick"), PROGRAM);
        assert!(a.diagnostics.is_empty(), "{:?}", a.diagnostics);
        // `route` in the rule, to the function.
        let def = a.definition(at(PROGRAM, "route", 0)).unwrap();
        assert_eq!(def.start, at(PROGRAM, "route", 1));
        // `target` in the send, to its `let`.
        let def = a.definition(at(PROGRAM, "target", 1)).unwrap();
        assert_eq!(def.start, at(PROGRAM, "target", 0));
        // `.key`, to the record's field; `cmd` in a signature, to the type.
        let def = a.definition(at(PROGRAM, "key", 1)).unwrap();
        assert_eq!(def.start, at(PROGRAM, "key", 0));
        let def = a.definition(at(PROGRAM, "cmd", 5)).unwrap();
        assert_eq!(def.start, at(PROGRAM, "cmd", 0));
        // The function's own parameter, not the process's channel.
        let def = a.definition(at(PROGRAM, "backends", 4)).unwrap();
        assert_eq!(def.start, at(PROGRAM, "backends", 3));
    }

    #[test]
    fn hover_shows_signatures_bounds_and_types() {
        let a = analyse(Path::new("p.flick"), PROGRAM);
        let (_, text) = a.hover(at(PROGRAM, "route", 0)).unwrap();
        assert!(
            text.contains("fun route: ([-/cmd] backends, req: cmd) -> ()"),
            "{text}"
        );
        let (_, text) = a.hover(at(PROGRAM, "P:", 0)).unwrap();
        assert!(text.contains("memory per instance: at most"), "{text}");
        let (_, text) = a.hover(at(PROGRAM, "target", 1)).unwrap();
        assert!(text.contains("target : integer"), "{text}");
        let (_, text) = a.hover(at(PROGRAM, "cmd", 0)).unwrap();
        assert!(text.contains("key : string"), "{text}");
    }

    const PACKETS: &str =
        "grammar packet\n\nproc P: (packet/- wire, -/packet out)\n  | wire => pass(out)\n\n\
        fun pass: (-/packet out, p: packet) -> ()\n  if is_tcp(p):\n    p => out\n";

    #[test]
    fn a_packet_program_sees_the_library() {
        let a = analyse(Path::new("p.flick"), PACKETS);
        assert!(a.diagnostics.is_empty(), "{:?}", a.diagnostics);
        let (_, text) = a.hover(at(PACKETS, "is_tcp", 0)).unwrap();
        assert!(text.contains("fun is_tcp: (p: packet) -> (bool)"), "{text}");
        // The library's text is not the editor's: no place to go to.
        assert_eq!(a.definition(at(PACKETS, "is_tcp", 0)), None);
        let bad = PACKETS.replace("fun pass", "fun is_ip");
        let a = analyse(
            Path::new("p.flick"),
            &bad.replace("wire => pass", "wire => is_ip"),
        );
        let d = a
            .diagnostics
            .iter()
            .find(|d| d.code == "E0104")
            .expect("a redefinition");
        assert!(d.message.contains("packet library"), "{}", d.message);
        assert!((d.span().end as usize) <= bad.len());
    }

    #[test]
    fn errors_and_formatting() {
        let bad = PROGRAM.replace("req => backends[target]", "req => nowhere");
        let a = analyse(Path::new("p.flick"), &bad);
        assert!(
            a.diagnostics.iter().any(|d| d.message.contains("nowhere")),
            "{:?}",
            a.diagnostics
        );
        let messy = PROGRAM.replace("| backends => client", "backends=>client");
        assert_eq!(format(&messy).unwrap(), PROGRAM);
        assert!(format("proc P: (\n").is_err());
    }
}
