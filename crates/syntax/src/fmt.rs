//! The canonical layout of a program, as printed by `flick fmt`.
//!
//! Two-space indentation, one blank line between declarations, rules
//! without a leading `|`, signatures on the declaration's line. Parsing the
//! output gives back the same tree (see the round-trip property test).

use crate::ast::*;
use flick_span::Span;
use std::fmt::Write;

const INDENT: &str = "  ";
/// Precedence of atoms and postfix expressions: never parenthesised.
const ATOM: u8 = 10;

/// The text being written, and the source's comments still to be placed.
struct Out<'c> {
    text: String,
    comments: &'c [Comment],
    next: usize,
}

impl Out<'_> {
    fn push(&mut self, c: char) {
        self.text.push(c);
    }

    fn push_str(&mut self, s: &str) {
        self.text.push_str(s);
    }

    /// Writes, each on its own line, the comments that came before `at`.
    fn comments_before(&mut self, at: Span, depth: usize) {
        while let Some(c) = self.comments.get(self.next) {
            if c.span.start >= at.start {
                return;
            }
            indent(self, depth);
            self.text.push_str(&c.text);
            self.text.push('\n');
            self.next += 1;
        }
    }
}

impl Out<'_> {
    /// After a line of a machine ending at `end`: a comment that followed
    /// it on its line stays at the line's end.
    fn trailing_comment(&mut self, end: Span) {
        let Some(c) = self.comments.get(self.next) else {
            return;
        };
        let on_line = c
            .follows
            .is_some_and(|f| f.end >= end.start && f.end <= end.end);
        if on_line && self.text.ends_with('\n') {
            self.text.pop();
            self.text.push_str("  ");
            self.text.push_str(&c.text);
            self.text.push('\n');
            self.next += 1;
        }
    }
}

impl Write for Out<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.text.push_str(s);
        Ok(())
    }
}

pub fn format_program(p: &Program) -> String {
    format_with_comments(p, &[])
}

/// Formats `p`, putting each comment (from [`parse_with_comments`]) on a
/// line of its own before the declaration, field, rule or statement that
/// followed it in the source.
///
/// [`parse_with_comments`]: crate::parse_with_comments
pub fn format_with_comments(p: &Program, comments: &[Comment]) -> String {
    let mut out = Out {
        text: String::new(),
        comments,
        next: 0,
    };
    let out = &mut out;
    // Declarations and machines in source order (for trees without
    // spans, declarations first).
    let mut items: Vec<(Span, Option<&Decl>, Option<&MachineDecl>)> = p
        .decls
        .iter()
        .map(|d| {
            let span = match d {
                Decl::Grammar(g) => g.span,
                Decl::Type(t) => t.span,
                Decl::Proc(p) => p.span,
                Decl::Fun(f) => f.span,
            };
            (span, Some(d), None)
        })
        .chain(p.machines.iter().map(|m| (m.span, None, Some(m))))
        .collect();
    items.sort_by_key(|(span, ..)| span.start);
    for (i, (span, d, m)) in items.into_iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.comments_before(span, 0);
        match (d, m) {
            (Some(Decl::Grammar(g)), _) => {
                let _ = writeln!(out, "grammar {}", g.name.name);
            }
            (Some(Decl::Type(t)), _) => type_decl(out, t),
            (Some(Decl::Proc(p)), _) => proc_decl(out, p),
            (Some(Decl::Fun(f)), _) => fun_decl(out, f),
            (None, Some(m)) => machine_decl(out, m),
            (None, None) => {}
        }
    }
    // Comments after the last declaration close the file.
    out.comments_before(
        Span {
            start: u32::MAX,
            end: u32::MAX,
        },
        0,
    );
    out.text.clone()
}

fn type_decl(out: &mut Out, t: &TypeDecl) {
    match &t.body {
        TypeBody::Record(fields) => {
            let _ = writeln!(out, "type {}: record", t.name.name);
            for f in fields {
                out.comments_before(f.span, 1);
                let name = f.name.as_ref().map_or("_", |n| n.name.as_str());
                let _ = writeln!(out, "{INDENT}{name} : {}", type_expr(&f.ty));
            }
        }
        TypeBody::Alias(ty) => {
            let _ = writeln!(out, "type {}: {}", t.name.name, type_expr(ty));
        }
    }
}

fn params(ps: &[Param]) -> String {
    let items: Vec<String> = ps
        .iter()
        .map(|p| match p.ty.kind {
            TypeKind::Chan(_) | TypeKind::ChanArray(_) => {
                format!("{} {}", type_expr(&p.ty), p.name.name)
            }
            _ => format!("{}: {}", p.name.name, type_expr(&p.ty)),
        })
        .collect();
    format!("({})", items.join(", "))
}

fn proc_decl(out: &mut Out, p: &ProcDecl) {
    let sep = signature_separator(p.items.is_empty());
    let _ = writeln!(out, "proc {}:{sep}{}", p.name.name, params(&p.params));
    for item in &p.items {
        let span = match item {
            ProcItem::State(s) => s.span,
            ProcItem::Rule(r) => r.span,
            ProcItem::Guarded(g) => g.span,
            ProcItem::Handler(h) => h.span,
        };
        out.comments_before(span, 1);
        match item {
            ProcItem::State(s) => {
                let scope = match s.scope {
                    StateScope::Global => "global",
                    StateScope::Local => "local",
                };
                let ty =
                    s.ty.as_ref()
                        .map_or(String::new(), |t| format!(": {}", type_expr(t)));
                let _ = write!(out, "{INDENT}{scope} {}{ty} := ", s.name.name);
                expr_line(out, &s.init, 1);
            }
            ProcItem::Rule(r) => {
                // Rules keep the paper's leading bar (`| client => ...`).
                let _ = write!(out, "{INDENT}| {}", expr(&r.source, 0, 1));
                for s in &r.steps {
                    let _ = write!(out, " => {}", expr(s, 0, 1));
                }
                out.push('\n');
            }
            ProcItem::Guarded(g) => {
                let _ = writeln!(out, "{INDENT}if {}:", expr(&g.cond, 0, 1));
                block(out, &g.body, 2);
            }
            ProcItem::Handler(h) => {
                let index = h
                    .index
                    .as_ref()
                    .map_or(String::new(), |i| format!("[{}]", i.name));
                let _ = writeln!(
                    out,
                    "{INDENT}on {}({}{index}):",
                    h.event.name, h.channel.name
                );
                block(out, &h.body, 2);
            }
        }
    }
}

fn fun_decl(out: &mut Out, f: &FunDecl) {
    let results: Vec<String> = f.results.iter().map(type_expr).collect();
    let sep = signature_separator(f.body.stmts.is_empty());
    let _ = writeln!(
        out,
        "fun {}:{sep}{} -> ({})",
        f.name.name,
        params(&f.params),
        results.join(", ")
    );
    block(out, &f.body, 1);
}

/// What separates a declaration's name from its signature. With an empty
/// body, the signature goes on an indented line of its own: a declaration
/// with nothing indented below it has no body and does not parse.
fn signature_separator(empty_body: bool) -> String {
    if empty_body {
        format!("\n{INDENT}")
    } else {
        " ".to_string()
    }
}

fn block(out: &mut Out, b: &Block, depth: usize) {
    for s in &b.stmts {
        stmt(out, s, depth);
    }
}

fn indent(out: &mut Out, depth: usize) {
    for _ in 0..depth {
        out.push_str(INDENT);
    }
}

/// Writes an expression that ends a line; a `foldt` continues on the
/// indented lines that follow.
fn expr_line(out: &mut Out, e: &Expr, depth: usize) {
    if let ExprKind::Foldt(f) = &e.kind {
        let _ = writeln!(out, "foldt on {}", expr(&f.channels, ATOM, depth));
        indent(out, depth + 1);
        let _ = writeln!(
            out,
            "ordering {} {}, {} by {}.{} as {}:",
            f.elem.name, f.left.name, f.right.name, f.elem.name, f.order_field.name, f.key.name
        );
        block(out, &f.body, depth + 2);
    } else {
        out.push_str(&expr(e, 0, depth));
        out.push('\n');
    }
}

fn stmt(out: &mut Out, s: &Stmt, depth: usize) {
    out.comments_before(s.span, depth);
    indent(out, depth);
    match &s.kind {
        StmtKind::Let { name, ty, value } => {
            let ty = ty
                .as_ref()
                .map_or(String::new(), |t| format!(": {}", type_expr(t)));
            let _ = write!(out, "let {}{ty} = ", name.name);
            expr_line(out, value, depth);
        }
        StmtKind::Assign { place, value } => {
            let _ = write!(out, "{} := ", expr(place, 0, depth));
            expr_line(out, value, depth);
        }
        StmtKind::Send { value, channel } => {
            let _ = writeln!(
                out,
                "{} => {}",
                expr(value, 0, depth),
                expr(channel, 0, depth)
            );
        }
        StmtKind::If {
            cond,
            then,
            otherwise,
        } => if_stmt(out, cond, then, otherwise.as_ref(), depth),
        StmtKind::Expr(e) => expr_line(out, e, depth),
    }
}

fn if_stmt(out: &mut Out, cond: &Expr, then: &Block, otherwise: Option<&Block>, depth: usize) {
    let _ = writeln!(out, "if {}:", expr(cond, 0, depth));
    block(out, then, depth + 1);
    let Some(other) = otherwise else { return };
    indent(out, depth);
    if let [Stmt {
        kind: StmtKind::If {
            cond,
            then,
            otherwise,
        },
        ..
    }] = other.stmts.as_slice()
    {
        out.push_str("else ");
        if_stmt(out, cond, then, otherwise.as_ref(), depth);
    } else {
        out.push_str("else:\n");
        block(out, other, depth + 1);
    }
}

pub fn type_expr(t: &TypeExpr) -> String {
    match &t.kind {
        TypeKind::Chan(c) if t.annotations.is_empty() => chan(c),
        _ => type_atom(t),
    }
}

fn chan(c: &ChanType) -> String {
    let side = |s: &Option<Box<TypeExpr>>| s.as_ref().map_or("-".to_string(), |t| type_atom(t));
    format!("{}/{}", side(&c.input), side(&c.output))
}

/// A type just before a closing `>`: `a/-` is parenthesised, as `->` would
/// lex as an arrow.
fn type_arg(t: &TypeExpr) -> String {
    match &t.kind {
        TypeKind::Chan(ChanType { output: None, .. }) => type_atom(t),
        _ => type_expr(t),
    }
}

fn type_atom(t: &TypeExpr) -> String {
    let base = match &t.kind {
        TypeKind::Integer => "integer".to_string(),
        TypeKind::String => "string".to_string(),
        TypeKind::Bytes => "bytes".to_string(),
        TypeKind::Bool => "bool".to_string(),
        TypeKind::Named(n) => n.name.clone(),
        TypeKind::List(e) => format!("list<{}>", type_arg(e)),
        TypeKind::Tuple(ts) => {
            let items: Vec<String> = ts.iter().map(type_expr).collect();
            format!("({})", items.join(", "))
        }
        TypeKind::Dict(k, v) => format!("dict<{}*{}>", type_expr(k), type_arg(v)),
        TypeKind::Ref(inner) => format!("ref {}", type_atom(inner)),
        TypeKind::Chan(c) => format!("({})", chan(c)),
        TypeKind::ChanArray(c) => format!("[{}]", chan(c)),
    };
    if t.annotations.is_empty() {
        return base;
    }
    // Annotations after `ref T` would attach to `T`: parenthesise.
    let base = match t.kind {
        TypeKind::Ref(_) => format!("({base})"),
        _ => base,
    };
    let annots: Vec<String> = t
        .annotations
        .iter()
        .map(|a| {
            let value = match a.value.kind {
                ExprKind::Bool(b) => b.to_string(),
                _ => expr(&a.value, 0, 0),
            };
            format!("{}={}", a.name.name, value)
        })
        .collect();
    format!("{base} {{{}}}", annots.join(", "))
}

fn precedence(e: &Expr) -> u8 {
    match &e.kind {
        ExprKind::Binary(op, ..) => op.precedence(),
        ExprKind::Unary(UnOp::Not, _) => NOT_PRECEDENCE,
        ExprKind::Unary(UnOp::Neg, _) => NEG_PRECEDENCE,
        // A foldt body is a block: only a whole line can hold it.
        ExprKind::Foldt(_) => 0,
        _ => ATOM,
    }
}

/// Prints `e`, parenthesised when its precedence is below `min`.
pub fn expr(e: &Expr, min: u8, depth: usize) -> String {
    let text = match &e.kind {
        ExprKind::Int {
            spelling: Some(text),
            ..
        } => text.to_string(),
        ExprKind::Int { value, hex, .. } => crate::ast::int_literal(*value, *hex),
        ExprKind::Str(s) => string_literal(s),
        ExprKind::Bool(true) => "True".into(),
        ExprKind::Bool(false) => "False".into(),
        ExprKind::None => "None".into(),
        ExprKind::Anonymous => "_".into(),
        ExprKind::Var(v) => v.name.clone(),
        ExprKind::Unary(UnOp::Not, x) => format!("not {}", expr(x, NOT_PRECEDENCE, depth)),
        ExprKind::Unary(UnOp::Neg, x) => format!("-{}", expr(x, NEG_PRECEDENCE, depth)),
        ExprKind::Binary(op, l, r) => {
            let p = op.precedence();
            format!(
                "{} {} {}",
                expr(l, p, depth),
                op.symbol(),
                expr(r, p + 1, depth)
            )
        }
        ExprKind::Field(x, f) => format!("{}.{}", expr(x, ATOM, depth), f.name),
        ExprKind::Index(x, i) => format!("{}[{}]", expr(x, ATOM, depth), expr(i, 0, depth)),
        ExprKind::Call(f, args) => format!("{}({})", f.name, list(args, depth)),
        ExprKind::Tuple(es) => format!("({})", list(es, depth)),
        ExprKind::List(es) => format!("[{}]", list(es, depth)),
        ExprKind::Foldt(_) => {
            let mut s = Out {
                text: String::new(),
                comments: &[],
                next: 0,
            };
            expr_line(&mut s, e, depth);
            s.text.trim_end().to_string()
        }
    };
    if precedence(e) < min {
        format!("({text})")
    } else {
        text
    }
}

fn list(es: &[Expr], depth: usize) -> String {
    es.iter()
        .map(|e| expr(e, 0, depth))
        .collect::<Vec<_>>()
        .join(", ")
}

fn string_literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A transition's items on its line up to this width; longer ones go on
/// indented lines of their own.
const TRANSITION_WIDTH: usize = 100;

fn machine_decl(out: &mut Out, m: &MachineDecl) {
    let sep = signature_separator(m.items.is_empty());
    let _ = writeln!(out, "machine {}:{sep}{}", m.name.name, params(&m.channels));
    for item in &m.items {
        // A blank line sets each stage apart.
        if matches!(item, MachineItem::Stage(_)) {
            out.push('\n');
        }
        out.comments_before(item.span(), 1);
        match item {
            MachineItem::Const { name, value, .. } => {
                let _ = writeln!(out, "{INDENT}const {} = {}", name.name, m_operand(value));
            }
            MachineItem::Global(r) => register(out, "global", r, 1),
            MachineItem::Meta(r) => register(out, "meta", r, 1),
            MachineItem::Stage(st) => {
                let _ = writeln!(out, "{INDENT}stage {}:", st.name.name);
                // The `:` after the name ends the line.
                out.trailing_comment(Span {
                    start: st.span.start,
                    end: st.name.span.end + 1,
                });
                for item in &st.items {
                    out.comments_before(item.span(), 2);
                    stage_item(out, item);
                    out.trailing_comment(item.span());
                }
                continue;
            }
        }
        out.trailing_comment(item.span());
    }
}

fn register(out: &mut Out, word: &str, r: &RegisterDecl, depth: usize) {
    indent(out, depth);
    let _ = write!(out, "{word} {}", r.name.name);
    if let Some(t) = &r.ty {
        let _ = write!(out, ": {}", type_expr(t));
    }
    if let Some(v) = &r.init {
        let _ = write!(out, " := {}", m_operand(v));
    }
    out.push('\n');
}

fn operands(os: &[MOperand]) -> String {
    os.iter().map(m_operand).collect::<Vec<_>>().join(", ")
}

fn stage_item(out: &mut Out, item: &StageItem) {
    if let StageItem::Flow(r) = item {
        register(out, "flow", r, 2);
        return;
    }
    indent(out, 2);
    match item {
        StageItem::Key { fields, other, .. } => match other {
            None => {
                let _ = writeln!(out, "key {}", operands(fields));
            }
            Some(o) => {
                let _ = writeln!(out, "key biflow ({}) ({})", operands(fields), operands(o));
            }
        },
        StageItem::IdleTimeout(d) => {
            let _ = writeln!(out, "idle_timeout {}{}", d.amount, d.unit.name());
        }
        StageItem::HardTimeout(d) => {
            let _ = writeln!(out, "hard_timeout {}{}", d.amount, d.unit.name());
        }
        StageItem::Capacity(c) => {
            let _ = writeln!(out, "capacity {}", m_operand(c));
        }
        StageItem::Evict(e) => {
            let _ = writeln!(out, "evict {}", e.name);
        }
        StageItem::Flow(_) => {}
        StageItem::States(names, _) => {
            let names: Vec<&str> = names.iter().map(|n| n.name.as_str()).collect();
            let _ = writeln!(out, "states {}", names.join(", "));
        }
        StageItem::Transition(t) => transition(out, t),
    }
}

fn transition(out: &mut Out, t: &TransitionDecl) {
    let mut head = String::new();
    if let Some(s) = &t.state {
        let _ = write!(head, "in {} ", s.name);
    }
    let _ = write!(head, "on {}", t.event.name);
    if !t.when.is_empty() {
        let conds: Vec<String> = t
            .when
            .iter()
            .map(|c| match c {
                MCond::Compare { lhs, op, rhs, .. } => {
                    format!("{} {} {}", m_operand(lhs), op.symbol(), m_operand(rhs))
                }
                MCond::From(ch, _) => format!("from {}", ch.name),
            })
            .collect();
        let _ = write!(head, " when {}", conds.join(", "));
    }
    let actions: Vec<String> = t.actions.iter().map(m_action).collect();
    let line = format!("{head}: {}", actions.join("; "));
    // Comments among the items keep their places on lines of their own.
    let commented = out
        .comments
        .get(out.next)
        .is_some_and(|c| c.span.start < t.span.end);
    let fits = 2 * INDENT.len() + line.len() <= TRANSITION_WIDTH || actions.len() < 2;
    if fits && !commented {
        let _ = writeln!(out, "{line}");
        return;
    }
    let _ = writeln!(out, "{head}:");
    if let Some(first) = t.actions.first() {
        out.trailing_comment(Span {
            start: t.span.start,
            end: first.span().start.saturating_sub(1),
        });
    }
    for (a, text) in t.actions.iter().zip(&actions) {
        out.comments_before(a.span(), 3);
        indent(out, 3);
        let _ = writeln!(out, "{text}");
        out.trailing_comment(a.span());
    }
}

fn m_action(a: &MAction) -> String {
    match a {
        MAction::Update { target, value, .. } => {
            let v = match value {
                MExpr::Operand(o) => m_operand(o),
                MExpr::Binary(op, a, b, _) => {
                    let sym = if *op == BinOp::Mod { "%" } else { op.symbol() };
                    format!("{} {sym} {}", m_operand(a), m_operand(b))
                }
                MExpr::Call(f, a, b, _) => {
                    format!("{}({}, {})", f.name, m_operand(a), m_operand(b))
                }
            };
            format!("{} := {v}", m_operand(target))
        }
        MAction::Next(s, _) => format!("next {}", s.name),
        MAction::Forward(c, _) => format!("forward {}", c.name),
        MAction::Drop(_) => "drop".into(),
        MAction::Set { field, value, .. } => {
            format!("set {} := {}", m_operand(field), m_operand(value))
        }
        MAction::Goto(s, _) => format!("goto {}", s.name),
    }
}

fn m_operand(o: &MOperand) -> String {
    match &o.kind {
        MOperandKind::Int {
            spelling: Some(text),
            ..
        } => text.to_string(),
        MOperandKind::Int { value, hex, .. } => crate::ast::int_literal(*value, *hex),
        MOperandKind::Ipv4([a, b, c, d]) => format!("{a}.{b}.{c}.{d}"),
        MOperandKind::Name(n) => n.name.clone(),
        MOperandKind::Dotted(a, b) => format!("{}.{}", a.name, b.name),
    }
}
