//! A recursive-descent parser from tokens to the [`ast`](crate::ast).
//!
//! The parser never gives up on a file: an error inside a declaration is
//! reported and parsing resumes at the next top-level declaration, so one
//! run reports the problems of every declaration.

use crate::ast::*;
use crate::lexer::{lex, Tok, Token};
use flick_span::{Diagnostic, Span};

/// How deeply expressions, types and blocks may nest. Checking and
/// formatting recurse over the tree, so a limit keeps a pathological input
/// (two thousand `(`, say) from overflowing the stack; real programs stay
/// far below it.
pub const MAX_NESTING: usize = 256;

/// Parses a whole program. The tree holds every declaration that parsed;
/// the diagnostics hold every lexical and syntax error found.
pub fn parse(src: &str) -> (Program, Vec<Diagnostic>) {
    let (program, _, diags) = parse_with_comments(src);
    (program, diags)
}

/// Parses a whole program, also returning its comments in source order.
pub fn parse_with_comments(src: &str) -> (Program, Vec<Comment>, Vec<Diagnostic>) {
    let (toks, comments, diags) = lex(src);
    let mut p = Parser {
        toks,
        pos: 0,
        lex_errors: diags.len(),
        diags,
        depth: 0,
    };
    let program = p.program();
    (program, comments, p.diags)
}

/// Marker for "an error was reported; unwind to a recovery point".
struct Reported;

type PResult<T> = Result<T, Reported>;

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    /// How many of `diags`, at the front, the lexer reported.
    lex_errors: usize,
    diags: Vec<Diagnostic>,
    /// How deeply the tree being parsed nests here (see [`MAX_NESTING`]).
    depth: usize,
}

impl Parser {
    // ---- token plumbing ----

    fn tok(&self) -> &Tok {
        &self.toks[self.pos].tok
    }

    fn nth(&self, n: usize) -> &Tok {
        &self.toks[(self.pos + n).min(self.toks.len() - 1)].tok
    }

    fn span(&self) -> Span {
        self.toks[self.pos].span
    }

    fn prev_span(&self) -> Span {
        self.toks[self.pos.saturating_sub(1)].span
    }

    /// Whether the last token consumed ended a line (a nested block does).
    fn prev_ended_line(&self) -> bool {
        self.pos > 0 && matches!(self.toks[self.pos - 1].tok, Tok::Dedent | Tok::Newline)
    }

    fn bump(&mut self) -> Token {
        let t = self.toks[self.pos].clone();
        if self.pos < self.toks.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn at(&self, t: &Tok) -> bool {
        self.tok() == t
    }

    fn eat(&mut self, t: &Tok) -> bool {
        if self.at(t) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn error(&mut self, d: Diagnostic) -> Reported {
        if !self.echoes_lex_error(d.span()) {
            self.diags.push(d);
        }
        Reported
    }

    /// Whether a syntax error at `at` is on the line of a lexical error,
    /// and so most likely its echo (an unterminated string swallows the
    /// `)` after it, say).
    fn echoes_lex_error(&self, at: Span) -> bool {
        self.diags[..self.lex_errors].iter().any(|l| {
            let l = l.span();
            l.start <= at.start
                && !self.toks.iter().any(|t| {
                    t.tok == Tok::Newline && t.span.start >= l.end && t.span.start < at.start
                })
        })
    }

    /// Goes one level deeper into the tree, reporting a nesting too deep.
    fn deeper(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth <= MAX_NESTING {
            return Ok(());
        }
        Err(self.error(
            Diagnostic::error(
                "E0011",
                format!("nested more than {MAX_NESTING} levels deep"),
                self.span(),
            )
            .label("too deeply nested")
            .hint("split the expression with `let`, or the type with `type` aliases"),
        ))
    }

    /// Parses with `parse` one level deeper into the tree.
    fn nested<T>(&mut self, parse: impl FnOnce(&mut Parser) -> PResult<T>) -> PResult<T> {
        let outer = self.depth;
        let result = self.deeper().and_then(|()| parse(self));
        self.depth = outer;
        result
    }

    fn unexpected(&mut self, wanted: &str) -> Reported {
        let found = self.tok().clone();
        let d = match &found {
            Tok::Loop(word) => Diagnostic::error(
                "E0010",
                format!("`{word}` loops do not exist in Flick"),
                self.span(),
            )
            .label("unbounded iteration")
            .hint("every Flick program terminates: iterate with fold, map or filter over a bounded list, or foldt over channels"),
            _ => Diagnostic::error(
                "E0005",
                format!("expected {wanted}, found {}", found.describe()),
                self.span(),
            )
            .label(format!("expected {wanted}")),
        };
        self.error(d)
    }

    fn expect(&mut self, t: &Tok, wanted: &str) -> PResult<Span> {
        if self.at(t) {
            Ok(self.bump().span)
        } else {
            Err(self.unexpected(wanted))
        }
    }

    fn ident(&mut self, wanted: &str) -> PResult<Ident> {
        match self.tok().clone() {
            Tok::Ident(name) => {
                let span = self.bump().span;
                Ok(Ident { name, span })
            }
            _ => Err(self.unexpected(wanted)),
        }
    }

    fn newline(&mut self) -> PResult<()> {
        if self.eat(&Tok::Newline) || self.at(&Tok::Eof) {
            Ok(())
        } else {
            Err(self.unexpected("end of line"))
        }
    }

    fn skip_newlines(&mut self) {
        while self.eat(&Tok::Newline) {}
    }

    /// Skips to the next top-level declaration keyword.
    fn recover_to_decl(&mut self) {
        let mut depth: i32 = 0;
        loop {
            match self.tok() {
                Tok::Eof => return,
                Tok::Indent => depth += 1,
                Tok::Dedent => depth -= 1,
                Tok::Type | Tok::Proc | Tok::Fun | Tok::Grammar
                    if depth <= 0 && self.line_start() =>
                {
                    return
                }
                Tok::Ident(w) if w == "machine" && depth <= 0 && self.line_start() => return,
                _ => {}
            }
            self.bump();
        }
    }

    /// Skips the rest of a broken line, and any block nested under it, so
    /// that the enclosing block goes on with its next line.
    fn recover_line(&mut self) {
        let mut depth = 0usize;
        loop {
            match self.tok() {
                Tok::Eof => return,
                Tok::Newline if depth == 0 => {
                    self.bump();
                    // A broken header's block goes with it, and so does
                    // the `else` of a broken `if`.
                    if !self.at(&Tok::Indent) && !self.at(&Tok::Else) {
                        return;
                    }
                    continue;
                }
                Tok::Indent => depth += 1,
                Tok::Dedent if depth == 0 => return,
                Tok::Dedent => {
                    depth -= 1;
                    if depth == 0 {
                        self.bump();
                        if !self.at(&Tok::Else) {
                            return;
                        }
                        continue;
                    }
                }
                _ => {}
            }
            self.bump();
        }
    }

    fn line_start(&self) -> bool {
        self.pos == 0
            || matches!(
                self.toks[self.pos - 1].tok,
                Tok::Newline | Tok::Dedent | Tok::Indent
            )
    }

    // ---- declarations ----

    fn program(&mut self) -> Program {
        let mut decls = Vec::new();
        let mut machines = Vec::new();
        loop {
            self.skip_newlines();
            // Stray layout at top level (an indented first line, say).
            while matches!(self.tok(), Tok::Indent | Tok::Dedent) {
                if self.at(&Tok::Indent) {
                    self.diags.push(
                        Diagnostic::error("E0004", "unexpected indentation", self.span())
                            .hint("top-level declarations start in the first column"),
                    );
                }
                self.bump();
                self.skip_newlines();
            }
            let result = match self.tok() {
                Tok::Eof => break,
                Tok::Type => self.type_decl().map(Decl::Type),
                Tok::Proc => self.proc_decl().map(Decl::Proc),
                Tok::Fun => self.fun_decl().map(Decl::Fun),
                Tok::Grammar => self.grammar_decl().map(Decl::Grammar),
                Tok::Ident(w) if w == "machine" => match self.machine_decl() {
                    Ok(m) => {
                        machines.push(m);
                        continue;
                    }
                    Err(r) => Err(r),
                },
                _ => Err(self
                    .unexpected("a declaration (`type`, `proc`, `fun`, `machine` or `grammar`)")),
            };
            match result {
                Ok(d) => decls.push(d),
                Err(Reported) => {
                    self.bump();
                    self.recover_to_decl();
                }
            }
        }
        Program { decls, machines }
    }

    fn grammar_decl(&mut self) -> PResult<GrammarDecl> {
        let start = self.bump().span;
        let name = self.ident("a grammar name")?;
        let span = start.to(name.span);
        self.newline()?;
        Ok(GrammarDecl { name, span })
    }

    fn type_decl(&mut self) -> PResult<TypeDecl> {
        let start = self.bump().span;
        let name = self.ident("a type name")?;
        self.expect(&Tok::Colon, "`:`")?;
        if matches!(self.tok(), Tok::Ident(s) if s == "record") {
            self.bump();
            self.newline()?;
            if !self.eat(&Tok::Indent) {
                return Err(self.error(
                    Diagnostic::error("E0006", "a record needs at least one field", name.span)
                        .hint("list the fields on indented lines below `record`, as `name : type`"),
                ));
            }
            let mut fields = Vec::new();
            while !self.eat(&Tok::Dedent) {
                if self.at(&Tok::Eof) {
                    break;
                }
                match self.field() {
                    Ok(f) => fields.push(f),
                    Err(Reported) => self.recover_line(),
                }
            }
            let span = start.to(self.prev_span());
            Ok(TypeDecl {
                name,
                body: TypeBody::Record(fields),
                span,
            })
        } else {
            let ty = self.type_expr()?;
            let span = start.to(ty.span);
            self.newline()?;
            Ok(TypeDecl {
                name,
                body: TypeBody::Alias(ty),
                span,
            })
        }
    }

    fn field(&mut self) -> PResult<Field> {
        let start = self.span();
        let name = if self.eat(&Tok::Underscore) {
            None
        } else {
            Some(self.ident("a field name or `_`")?)
        };
        self.expect(&Tok::Colon, "`:` after the field name")?;
        let ty = self.type_expr()?;
        let span = start.to(ty.span);
        self.newline()?;
        Ok(Field { name, ty, span })
    }

    /// The head of a process or a machine: the keyword, `NAME [:]
    /// [(PARAMS) [:]]`, the line end and the indent of its body. The
    /// parameters may instead open the body's first line (then `None`
    /// here: see [`Parser::params_line`]).
    fn body_head(
        &mut self,
        what: &str,
        kind: &str,
        hint: &str,
    ) -> PResult<(Span, Ident, Option<Vec<Param>>)> {
        let start = self.bump().span;
        let name = self.ident(what)?;
        self.eat(&Tok::Colon);
        let mut params = None;
        if self.at(&Tok::LParen) {
            params = Some(self.params()?);
            self.eat(&Tok::Colon);
        }
        self.newline()?;
        if !self.eat(&Tok::Indent) {
            return Err(self.error(
                Diagnostic::error(
                    "E0006",
                    format!("{kind} `{}` has no body", name.name),
                    name.span,
                )
                .hint(hint),
            ));
        }
        Ok((start, name, params))
    }

    /// Parameters on a body's first line, as a line of their own.
    fn params_line(&mut self) -> PResult<Vec<Param>> {
        let p = self.params()?;
        self.eat(&Tok::Colon);
        self.newline()?;
        Ok(p)
    }

    fn proc_decl(&mut self) -> PResult<ProcDecl> {
        let (start, name, params) = self.body_head(
            "a process name",
            "process",
            "write the process's rules on indented lines below its signature",
        )?;
        let params = match params {
            Some(p) => p,
            None => self.params_line()?,
        };
        let mut items = Vec::new();
        while !self.eat(&Tok::Dedent) {
            if self.at(&Tok::Eof) {
                break;
            }
            match self.proc_item() {
                Ok(item) => items.push(item),
                Err(Reported) => self.recover_line(),
            }
        }
        Ok(ProcDecl {
            name,
            params,
            items,
            span: start.to(self.prev_span()),
        })
    }

    fn params(&mut self) -> PResult<Vec<Param>> {
        self.expect(&Tok::LParen, "`(` to start the parameters")?;
        let mut params = Vec::new();
        while !self.at(&Tok::RParen) {
            params.push(self.param()?);
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(&Tok::RParen, "`,` or `)`")?;
        Ok(params)
    }

    /// `name: type`, or a channel written type-first: `cmd/cmd client`,
    /// `[-/cmd] backends`.
    fn param(&mut self) -> PResult<Param> {
        let start = self.span();
        if matches!(self.tok(), Tok::Ident(_)) && self.nth(1) == &Tok::Colon {
            let name = self.ident("a parameter name")?;
            self.bump();
            let ty = self.type_expr()?;
            let span = start.to(ty.span);
            return Ok(Param { name, ty, span });
        }
        let ty = self.type_expr()?;
        if !matches!(ty.kind, TypeKind::Chan(_) | TypeKind::ChanArray(_)) {
            return Err(self.error(
                Diagnostic::error("E0005", "expected a parameter", ty.span)
                    .label("a value parameter is written `name: type`")
                    .hint("only channels are written type first, as in `cmd/cmd client`"),
            ));
        }
        let name = self.ident("the channel's name")?;
        let span = start.to(name.span);
        Ok(Param { name, ty, span })
    }

    fn proc_item(&mut self) -> PResult<ProcItem> {
        let start = self.span();
        match self.tok() {
            Tok::Global | Tok::Local => {
                let scope = if self.bump().tok == Tok::Global {
                    StateScope::Global
                } else {
                    StateScope::Local
                };
                let name = self.ident("a state variable name")?;
                let ty = if self.eat(&Tok::Colon) {
                    Some(self.type_expr()?)
                } else {
                    None
                };
                self.expect(&Tok::Assign, "`:=` and the initial value")?;
                let init = self.expr()?;
                let span = start.to(init.span);
                self.newline()?;
                Ok(ProcItem::State(StateDecl {
                    scope,
                    name,
                    ty,
                    init,
                    span,
                }))
            }
            Tok::If => {
                self.bump();
                let cond = self.expr()?;
                self.expect(&Tok::Colon, "`:` after the condition")?;
                let body = self.block()?;
                Ok(ProcItem::Guarded(Guarded {
                    cond,
                    span: start.to(body.span),
                    body,
                }))
            }
            Tok::On => {
                self.bump();
                let event = self.ident("an event name such as `disconnect`")?;
                self.expect(&Tok::LParen, "`(` and a channel")?;
                let channel = self.ident("a channel name")?;
                let index = if self.eat(&Tok::LBracket) {
                    let i = self.ident("a name for the channel's index")?;
                    self.expect(&Tok::RBracket, "`]`")?;
                    Some(i)
                } else {
                    None
                };
                self.expect(&Tok::RParen, "`)`")?;
                self.expect(&Tok::Colon, "`:`")?;
                let body = self.block()?;
                Ok(ProcItem::Handler(Handler {
                    event,
                    channel,
                    index,
                    span: start.to(body.span),
                    body,
                }))
            }
            _ => {
                self.eat(&Tok::Bar);
                let source = self.expr()?;
                let mut steps = Vec::new();
                while self.eat(&Tok::Arrow) {
                    steps.push(self.expr()?);
                }
                if steps.is_empty() {
                    return Err(self.unexpected("`=>` (a rule reads `channel => destination`)"));
                }
                let span = start.to(self.prev_span());
                self.newline()?;
                Ok(ProcItem::Rule(Rule {
                    source,
                    steps,
                    span,
                }))
            }
        }
    }

    fn fun_decl(&mut self) -> PResult<FunDecl> {
        let start = self.bump().span;
        let name = self.ident("a function name")?;
        self.eat(&Tok::Colon);
        let mut header = None;
        if self.at(&Tok::LParen) {
            let params = self.params()?;
            self.skip_newlines();
            self.expect(&Tok::RArrow, "`->` and the result types")?;
            let results = self.results()?;
            self.eat(&Tok::Colon);
            header = Some((params, results));
        }
        if self.at(&Tok::Ellipsis) {
            return Err(self.error(
                Diagnostic::error(
                    "E0006",
                    format!("function `{}` has no body", name.name),
                    self.span(),
                )
                .label("`...` is not a body")
                .hint("write the function's statements on indented lines below its signature"),
            ));
        }
        self.newline()?;
        if !self.eat(&Tok::Indent) {
            return Err(self.error(
                Diagnostic::error(
                    "E0006",
                    format!("function `{}` has no body", name.name),
                    name.span,
                )
                .hint("write the function's statements on indented lines below its signature"),
            ));
        }
        let (params, results) = match header {
            Some(h) => h,
            None => {
                let params = self.params()?;
                self.skip_newlines();
                self.expect(&Tok::RArrow, "`->` and the result types")?;
                let results = self.results()?;
                self.eat(&Tok::Colon);
                self.newline()?;
                (params, results)
            }
        };
        let body = self.block_body(self.span())?;
        Ok(FunDecl {
            name,
            params,
            results,
            span: start.to(body.span),
            body,
        })
    }

    fn results(&mut self) -> PResult<Vec<TypeExpr>> {
        if self.eat(&Tok::LParen) {
            let mut tys = Vec::new();
            while !self.at(&Tok::RParen) {
                tys.push(self.type_expr()?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
            self.expect(&Tok::RParen, "`,` or `)`")?;
            Ok(tys)
        } else {
            Ok(vec![self.type_expr()?])
        }
    }

    // ---- types ----

    fn type_expr(&mut self) -> PResult<TypeExpr> {
        let start = self.span();
        if self.at(&Tok::Minus) && self.nth(1) == &Tok::Slash {
            self.bump();
            self.bump();
            let output = self.chan_side()?;
            return Ok(TypeExpr {
                kind: TypeKind::Chan(ChanType {
                    input: None,
                    output,
                }),
                annotations: Vec::new(),
                span: start.to(self.prev_span()),
            });
        }
        let mut ty = self.type_atom()?;
        if self.eat(&Tok::Slash) {
            let output = self.chan_side()?;
            ty = TypeExpr {
                span: start.to(self.prev_span()),
                kind: TypeKind::Chan(ChanType {
                    input: Some(Box::new(ty)),
                    output,
                }),
                annotations: Vec::new(),
            };
        }
        Ok(ty)
    }

    fn chan_side(&mut self) -> PResult<Option<Box<TypeExpr>>> {
        if self.eat(&Tok::Minus) {
            Ok(None)
        } else {
            Ok(Some(Box::new(self.type_atom()?)))
        }
    }

    fn type_atom(&mut self) -> PResult<TypeExpr> {
        let start = self.span();
        let kind = match self.tok().clone() {
            Tok::LBracket => {
                self.bump();
                let inner = self.nested(Self::type_expr)?;
                self.expect(&Tok::RBracket, "`]`")?;
                match inner.kind {
                    TypeKind::Chan(c) if inner.annotations.is_empty() => TypeKind::ChanArray(c),
                    _ => {
                        return Err(self.error(
                            Diagnostic::error(
                                "E0007",
                                "`[...]` in a type is an array of channels",
                                inner.span,
                            )
                            .label("expected a channel type such as `cmd/cmd`")
                            .hint("a list of values is written `list<T>`"),
                        ))
                    }
                }
            }
            Tok::LParen => {
                self.bump();
                let mut tys = Vec::new();
                while !self.at(&Tok::RParen) {
                    tys.push(self.nested(Self::type_expr)?);
                    if !self.eat(&Tok::Comma) {
                        break;
                    }
                }
                self.expect(&Tok::RParen, "`,` or `)`")?;
                if tys.len() == 1 {
                    let mut t = tys.pop().unwrap();
                    t.span = start.to(self.prev_span());
                    return self.annotations(t);
                }
                TypeKind::Tuple(tys)
            }
            Tok::Ident(name) => {
                let id = self.ident("a type")?;
                match name.as_str() {
                    "integer" => TypeKind::Integer,
                    "string" => TypeKind::String,
                    "bytes" => TypeKind::Bytes,
                    "bool" => TypeKind::Bool,
                    "ref" => TypeKind::Ref(Box::new(self.nested(Self::type_atom)?)),
                    "list" => {
                        self.expect(&Tok::Lt, "`<` after `list`")?;
                        let t = self.nested(Self::type_expr)?;
                        self.expect(&Tok::Gt, "`>`")?;
                        TypeKind::List(Box::new(t))
                    }
                    "dict" => {
                        self.expect(&Tok::Lt, "`<` after `dict`")?;
                        let k = self.nested(Self::type_expr)?;
                        self.expect(&Tok::Star, "`*` between key and value types")?;
                        let v = self.nested(Self::type_expr)?;
                        self.expect(&Tok::Gt, "`>`")?;
                        TypeKind::Dict(Box::new(k), Box::new(v))
                    }
                    _ => TypeKind::Named(id),
                }
            }
            _ => return Err(self.unexpected("a type")),
        };
        let ty = TypeExpr {
            kind,
            annotations: Vec::new(),
            span: start.to(self.prev_span()),
        };
        self.annotations(ty)
    }

    fn annotations(&mut self, mut ty: TypeExpr) -> PResult<TypeExpr> {
        if !self.eat(&Tok::LBrace) {
            return Ok(ty);
        }
        while !self.at(&Tok::RBrace) {
            let name = self.ident("an annotation name such as `size`")?;
            self.expect(&Tok::Eq, "`=` and the annotation's value")?;
            let value = self.expr()?;
            let span = name.span.to(value.span);
            ty.annotations.push(Annotation { name, value, span });
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(&Tok::RBrace, "`,` or `}`")?;
        ty.span = ty.span.to(self.prev_span());
        Ok(ty)
    }

    // ---- statements ----

    /// After a `:`: an indented block, or one statement on the same line.
    fn block(&mut self) -> PResult<Block> {
        if self.eat(&Tok::Newline) {
            if !self.eat(&Tok::Indent) {
                return Err(self.unexpected("an indented block"));
            }
            let start = self.prev_span();
            self.nested(|p| p.block_body(start))
        } else {
            let stmt = self.nested(Self::stmt)?;
            Ok(Block {
                span: stmt.span,
                stmts: vec![stmt],
            })
        }
    }

    /// Statements up to the `Dedent` closing the current block.
    fn block_body(&mut self, start: Span) -> PResult<Block> {
        let mut stmts = Vec::new();
        let mut end = start;
        while !self.eat(&Tok::Dedent) {
            if self.at(&Tok::Eof) {
                break;
            }
            match self.stmt() {
                Ok(s) => {
                    end = s.span;
                    stmts.push(s);
                }
                Err(Reported) => self.recover_line(),
            }
        }
        let start = stmts.first().map_or(start, |s| s.span);
        Ok(Block {
            stmts,
            span: start.to(end),
        })
    }

    fn stmt(&mut self) -> PResult<Stmt> {
        let start = self.span();
        let kind = match self.tok() {
            Tok::Let => {
                self.bump();
                let name = self.ident("a name to bind")?;
                let ty = if self.eat(&Tok::Colon) {
                    Some(self.type_expr()?)
                } else {
                    None
                };
                self.expect(&Tok::Eq, "`=` and a value")?;
                let value = self.line_expr()?;
                StmtKind::Let { name, ty, value }
            }
            Tok::If => {
                self.bump();
                let cond = self.expr()?;
                self.expect(&Tok::Colon, "`:` after the condition")?;
                let then = self.block()?;
                let otherwise = if self.at(&Tok::Else) {
                    self.bump();
                    if self.at(&Tok::If) {
                        let nested = self.stmt()?;
                        Some(Block {
                            span: nested.span,
                            stmts: vec![nested],
                        })
                    } else {
                        self.expect(&Tok::Colon, "`:` after `else`")?;
                        Some(self.block()?)
                    }
                } else {
                    None
                };
                let end = otherwise.as_ref().unwrap_or(&then).span;
                return Ok(Stmt {
                    kind: StmtKind::If {
                        cond,
                        then,
                        otherwise,
                    },
                    span: start.to(end),
                });
            }
            Tok::Foldt => StmtKind::Expr(self.foldt()?),
            _ => {
                let e = self.expr()?;
                if self.eat(&Tok::Assign) {
                    let value = self.line_expr()?;
                    StmtKind::Assign { place: e, value }
                } else if self.eat(&Tok::Arrow) {
                    let channel = self.expr()?;
                    if self.at(&Tok::Arrow) {
                        return Err(self.error(
                            Diagnostic::error(
                                "E0005",
                                "a statement sends to one channel",
                                self.span(),
                            )
                            .hint("chains such as `c => f() => d` are process rules; in a function, call `f` and send its result"),
                        ));
                    }
                    StmtKind::Send { value: e, channel }
                } else {
                    StmtKind::Expr(e)
                }
            }
        };
        let span = start.to(self.prev_span());
        // A statement that ended with a nested block (a `foldt` body)
        // has already consumed its line end.
        if !self.prev_ended_line() {
            self.newline()?;
        }
        Ok(Stmt { kind, span })
    }

    // ---- expressions ----

    fn expr(&mut self) -> PResult<Expr> {
        self.expr_bp(0)
    }

    /// The value that ends a statement: an expression, or a `foldt`,
    /// whose body is a block that only a whole line can hold.
    fn line_expr(&mut self) -> PResult<Expr> {
        if self.at(&Tok::Foldt) {
            self.foldt()
        } else {
            self.expr()
        }
    }

    fn binop(&self) -> Option<BinOp> {
        Some(match self.tok() {
            Tok::Or => BinOp::Or,
            Tok::And => BinOp::And,
            Tok::Eq => BinOp::Eq,
            Tok::Ne => BinOp::Ne,
            Tok::Lt => BinOp::Lt,
            Tok::Le => BinOp::Le,
            Tok::Gt => BinOp::Gt,
            Tok::Ge => BinOp::Ge,
            Tok::Plus => BinOp::Add,
            Tok::Minus => BinOp::Sub,
            Tok::Star => BinOp::Mul,
            Tok::Slash => BinOp::Div,
            Tok::Mod => BinOp::Mod,
            _ => return None,
        })
    }

    fn expr_bp(&mut self, min: u8) -> PResult<Expr> {
        self.nested(|p| p.climb(min))
    }

    /// Precedence climbing; every binary operator is left-associative.
    fn climb(&mut self, min: u8) -> PResult<Expr> {
        let mut lhs = self.prefix()?;
        while let Some(op) = self.binop() {
            let prec = op.precedence();
            // After a `foldt`, whose block ended the line, a `-` starts
            // the next statement.
            if prec <= min || self.prev_ended_line() {
                break;
            }
            // A left-associative chain nests as deeply as it is long.
            self.deeper()?;
            self.bump();
            let rhs = self.expr_bp(prec)?;
            lhs = Expr {
                span: lhs.span.to(rhs.span),
                kind: ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
            };
        }
        Ok(lhs)
    }

    fn prefix(&mut self) -> PResult<Expr> {
        let start = self.span();
        let (op, prec) = match self.tok() {
            Tok::Not => (UnOp::Not, NOT_PRECEDENCE),
            Tok::Minus => (UnOp::Neg, NEG_PRECEDENCE),
            _ => return self.postfix(),
        };
        self.bump();
        let e = self.expr_bp(prec - 1)?;
        Ok(Expr {
            span: start.to(e.span),
            kind: ExprKind::Unary(op, Box::new(e)),
        })
    }

    fn postfix(&mut self) -> PResult<Expr> {
        let mut e = self.primary()?;
        loop {
            // After a `foldt`, whose block ended the line, a `[` starts the
            // next statement.
            if self.prev_ended_line() {
                return Ok(e);
            }
            if matches!(self.tok(), Tok::Dot | Tok::LBracket) {
                // So does a chain of fields and indexes.
                self.deeper()?;
            }
            if self.eat(&Tok::Dot) {
                let field = if self.at(&Tok::Underscore) {
                    Ident::new("_", self.bump().span)
                } else {
                    self.ident("a field name")?
                };
                e = Expr {
                    span: e.span.to(field.span),
                    kind: ExprKind::Field(Box::new(e), field),
                };
            } else if self.eat(&Tok::LBracket) {
                let index = self.expr()?;
                self.expect(&Tok::RBracket, "`]`")?;
                e = Expr {
                    span: e.span.to(self.prev_span()),
                    kind: ExprKind::Index(Box::new(e), Box::new(index)),
                };
            } else {
                return Ok(e);
            }
        }
    }

    fn args(&mut self, close: Tok, wanted: &str) -> PResult<Vec<Expr>> {
        let mut args = Vec::new();
        while !self.at(&close) {
            args.push(self.expr()?);
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        self.expect(&close, wanted)?;
        Ok(args)
    }

    fn primary(&mut self) -> PResult<Expr> {
        let start = self.span();
        let kind = match self.tok().clone() {
            Tok::Int {
                value,
                hex,
                spelling,
            } => {
                self.bump();
                ExprKind::Int {
                    value,
                    hex,
                    spelling,
                }
            }
            Tok::Str(s) => {
                self.bump();
                ExprKind::Str(s)
            }
            Tok::True => {
                self.bump();
                ExprKind::Bool(true)
            }
            Tok::False => {
                self.bump();
                ExprKind::Bool(false)
            }
            Tok::None => {
                self.bump();
                ExprKind::None
            }
            Tok::Underscore => {
                self.bump();
                ExprKind::Anonymous
            }
            Tok::Ident(_) => {
                let id = self.ident("a name")?;
                if self.eat(&Tok::LParen) {
                    let args = self.args(Tok::RParen, "`,` or `)`")?;
                    ExprKind::Call(id, args)
                } else {
                    ExprKind::Var(id)
                }
            }
            Tok::LParen => {
                self.bump();
                let mut es = self.args(Tok::RParen, "`,` or `)`")?;
                if es.len() == 1 {
                    let mut e = es.pop().unwrap();
                    e.span = start.to(self.prev_span());
                    return Ok(e);
                }
                ExprKind::Tuple(es)
            }
            Tok::LBracket => {
                self.bump();
                ExprKind::List(self.args(Tok::RBracket, "`,` or `]`")?)
            }
            Tok::Foldt => {
                return Err(self.error(
                    Diagnostic::error(
                        "E0005",
                        "`foldt` must be the whole value of a statement",
                        self.span(),
                    )
                    .label("inside a larger expression")
                    .hint("bind it first, as in `let merged = foldt on ...`, then use `merged`"),
                ))
            }
            _ => return Err(self.unexpected("an expression")),
        };
        Ok(Expr {
            kind,
            span: start.to(self.prev_span()),
        })
    }

    fn foldt(&mut self) -> PResult<Expr> {
        let start = self.bump().span;
        self.expect(&Tok::On, "`on` and the channels to merge")?;
        let channels = self.nested(Self::postfix)?;
        // `ordering` may continue on an indented line of its own.
        let continued =
            self.at(&Tok::Newline) && self.nth(1) == &Tok::Indent && self.nth(2) == &Tok::Ordering;
        if continued {
            self.bump();
            self.bump();
        }
        self.expect(&Tok::Ordering, "`ordering`")?;
        let elem = self.ident("the element's name")?;
        let left = self.ident("a name for the left value")?;
        self.expect(&Tok::Comma, "`,`")?;
        let right = self.ident("a name for the right value")?;
        self.expect(&Tok::By, "`by`")?;
        let by = self.ident("the element's name")?;
        if by.name != elem.name {
            return Err(self.error(
                Diagnostic::error(
                    "E0005",
                    format!("`foldt` orders by a field of `{}`", elem.name),
                    by.span,
                )
                .label(format!("expected `{}`", elem.name)),
            ));
        }
        self.expect(&Tok::Dot, "`.` and the ordering field")?;
        let order_field = self.ident("the ordering field")?;
        self.expect(&Tok::As, "`as` and a name for the key")?;
        let key = self.ident("a name for the key")?;
        self.expect(&Tok::Colon, "`:`")?;
        let body = self.block()?;
        if continued && !self.eat(&Tok::Dedent) {
            return Err(self.unexpected("the end of `foldt`"));
        }
        Ok(Expr {
            span: start.to(body.span),
            kind: ExprKind::Foldt(Box::new(Foldt {
                channels,
                elem,
                left,
                right,
                order_field,
                key,
                body,
            })),
        })
    }
}

// ---- machines ----

/// A word of the machine sub-language (`stage`, `key`, `next`, ...): an
/// identifier where it stands, so programs may keep using them as names.
fn is_word(t: &Tok, w: &str) -> bool {
    matches!(t, Tok::Ident(s) if s == w)
}

impl Parser {
    fn at_word(&self, w: &str) -> bool {
        is_word(self.tok(), w)
    }

    fn machine_decl(&mut self) -> PResult<MachineDecl> {
        let (start, name, channels) = self.body_head(
            "a machine name",
            "machine",
            "write its constants, registers and stages on indented lines below it",
        )?;
        // The channels may go on the first indented line, as a process's
        // parameters may.
        let channels = match channels {
            Some(c) => c,
            None if self.at(&Tok::LParen) => self.params_line()?,
            None => Vec::new(),
        };
        let mut items = Vec::new();
        while !self.eat(&Tok::Dedent) {
            if self.at(&Tok::Eof) {
                break;
            }
            match self.machine_item() {
                Ok(item) => items.push(item),
                Err(Reported) => self.recover_line(),
            }
        }
        Ok(MachineDecl {
            name,
            channels,
            items,
            span: start.to(self.prev_span()),
        })
    }

    fn machine_item(&mut self) -> PResult<MachineItem> {
        let start = self.span();
        if self.eat(&Tok::Global) {
            let r = self.register_decl(start, true)?;
            return Ok(MachineItem::Global(r));
        }
        match self.tok().clone() {
            Tok::Ident(w) if w == "const" => {
                self.bump();
                let name = self.ident("a constant's name")?;
                self.expect(&Tok::Eq, "`=` and the constant's value")?;
                let value = self.m_operand()?;
                let span = start.to(value.span);
                self.newline()?;
                Ok(MachineItem::Const { name, value, span })
            }
            Tok::Ident(w) if w == "meta" => {
                self.bump();
                Ok(MachineItem::Meta(self.register_decl(start, false)?))
            }
            Tok::Ident(w) if w == "stage" => {
                self.bump();
                let name = self.ident("a stage name")?;
                self.expect(&Tok::Colon, "`:` after the stage's name")?;
                self.newline()?;
                if !self.eat(&Tok::Indent) {
                    return Err(self.error(
                        Diagnostic::error(
                            "E0006",
                            format!("stage `{}` has no body", name.name),
                            name.span,
                        )
                        .hint("write its key, states and transitions on indented lines below it"),
                    ));
                }
                let mut items = Vec::new();
                while !self.eat(&Tok::Dedent) {
                    if self.at(&Tok::Eof) {
                        break;
                    }
                    match self.stage_item() {
                        Ok(item) => items.push(item),
                        Err(Reported) => self.recover_line(),
                    }
                }
                Ok(MachineItem::Stage(StageDecl {
                    name,
                    items,
                    span: start.to(self.prev_span()),
                }))
            }
            _ => Err(self.unexpected("`const`, `global`, `meta` or `stage`")),
        }
    }

    /// `NAME[: TYPE] [:= VALUE]`, the keyword already read.
    fn register_decl(&mut self, start: Span, init: bool) -> PResult<RegisterDecl> {
        let name = self.ident("a name")?;
        let ty = if self.eat(&Tok::Colon) {
            Some(self.type_expr()?)
        } else {
            None
        };
        let init = if init && self.eat(&Tok::Assign) {
            Some(self.m_operand()?)
        } else {
            None
        };
        let span = start.to(self.prev_span());
        self.newline()?;
        Ok(RegisterDecl {
            name,
            ty,
            init,
            span,
        })
    }

    fn duration(&mut self) -> PResult<Duration> {
        match self.tok().clone() {
            Tok::Duration(amount, unit) => {
                let span = self.bump().span;
                Ok(Duration { amount, unit, span })
            }
            _ => Err(self.unexpected("a duration such as `10s`, `250ms` or `100us`")),
        }
    }

    fn stage_item(&mut self) -> PResult<StageItem> {
        let start = self.span();
        let word = match self.tok() {
            Tok::Ident(w) => w.clone(),
            Tok::On => "on".into(),
            _ => String::new(),
        };
        let item = match word.as_str() {
            "key" => {
                self.bump();
                if self.at_word("biflow") && self.nth(1) == &Tok::LParen {
                    self.bump();
                    let fields = self.m_operand_group()?;
                    let other = self.m_operand_group()?;
                    StageItem::Key {
                        fields,
                        other: Some(other),
                        span: start.to(self.prev_span()),
                    }
                } else {
                    let mut fields = vec![self.m_operand()?];
                    while self.eat(&Tok::Comma) {
                        fields.push(self.m_operand()?);
                    }
                    StageItem::Key {
                        fields,
                        other: None,
                        span: start.to(self.prev_span()),
                    }
                }
            }
            "idle_timeout" => {
                self.bump();
                StageItem::IdleTimeout(self.duration()?)
            }
            "hard_timeout" => {
                self.bump();
                StageItem::HardTimeout(self.duration()?)
            }
            "capacity" => {
                self.bump();
                StageItem::Capacity(self.m_operand()?)
            }
            "evict" => {
                self.bump();
                StageItem::Evict(self.ident("`oldest` or `expired`")?)
            }
            "flow" => {
                self.bump();
                // register_decl ends the line itself.
                return Ok(StageItem::Flow(self.register_decl(start, true)?));
            }
            "states" => {
                self.bump();
                let mut names = vec![self.ident("a state name")?];
                while self.eat(&Tok::Comma) {
                    names.push(self.ident("a state name")?);
                }
                StageItem::States(names, start.to(self.prev_span()))
            }
            "in" | "on" => return self.transition().map(StageItem::Transition),
            _ => {
                return Err(self.unexpected(
                    "`key`, `idle_timeout`, `hard_timeout`, `capacity`, `evict`, `flow`, `states`, `in` or `on`",
                ))
            }
        };
        self.newline()?;
        Ok(item)
    }

    /// `(A, B, ...)`: one endpoint of a biflow key.
    fn m_operand_group(&mut self) -> PResult<Vec<MOperand>> {
        self.expect(&Tok::LParen, "`(` and one endpoint's fields")?;
        let mut fields = vec![self.m_operand()?];
        while self.eat(&Tok::Comma) {
            fields.push(self.m_operand()?);
        }
        self.expect(&Tok::RParen, "`,` or `)`")?;
        Ok(fields)
    }

    fn transition(&mut self) -> PResult<TransitionDecl> {
        let start = self.span();
        let state = if self.at_word("in") {
            self.bump();
            Some(self.ident("a state name or `any`")?)
        } else {
            None
        };
        self.expect(&Tok::On, "`on` and an event")?;
        let event =
            self.ident("an event: `packet`, `idle_timeout`, `hard_timeout` or `table_full`")?;
        let mut when = Vec::new();
        if self.at_word("when") {
            self.bump();
            when.push(self.m_cond()?);
            while self.eat(&Tok::Comma) {
                when.push(self.m_cond()?);
            }
        }
        self.expect(&Tok::Colon, "`:` and what the transition does")?;
        let mut actions = Vec::new();
        if self.eat(&Tok::Newline) {
            if !self.eat(&Tok::Indent) {
                return Err(self.unexpected("an indented block"));
            }
            while !self.eat(&Tok::Dedent) {
                if self.at(&Tok::Eof) {
                    break;
                }
                match self.m_action_line(&mut actions) {
                    Ok(()) => {}
                    Err(Reported) => self.recover_line(),
                }
            }
        } else {
            self.m_action_line(&mut actions)?;
        }
        let end = actions.last().map_or(self.prev_span(), MAction::span);
        Ok(TransitionDecl {
            state,
            event,
            when,
            actions,
            span: start.to(end),
        })
    }

    /// Items separated by `;` up to the end of the line.
    fn m_action_line(&mut self, actions: &mut Vec<MAction>) -> PResult<()> {
        actions.push(self.m_action()?);
        while self.eat(&Tok::Semi) {
            if self.at(&Tok::Newline) {
                break;
            }
            actions.push(self.m_action()?);
        }
        self.newline()
    }

    fn m_action(&mut self) -> PResult<MAction> {
        let start = self.span();
        // A register may be named like an item's word (`next := 1`): the
        // word is an item's only where what follows fits the item.
        let word = match (self.tok(), self.nth(1)) {
            (Tok::Ident(w), Tok::Ident(_)) if ["next", "forward", "goto"].contains(&w.as_str()) => {
                w.clone()
            }
            (Tok::Ident(w), next) if w == "set" && !matches!(next, Tok::Assign | Tok::Dot) => {
                w.clone()
            }
            (Tok::Ident(w), Tok::Newline | Tok::Semi | Tok::Eof) if w == "drop" => w.clone(),
            _ => String::new(),
        };
        let one = |p: &mut Parser, what: &str| -> PResult<(Ident, Span)> {
            p.bump();
            let i = p.ident(what)?;
            Ok((i, start.to(p.prev_span())))
        };
        Ok(match word.as_str() {
            "next" => {
                let (i, s) = one(self, "a state name")?;
                MAction::Next(i, s)
            }
            "forward" => {
                let (i, s) = one(self, "a channel name")?;
                MAction::Forward(i, s)
            }
            "goto" => {
                let (i, s) = one(self, "a stage name")?;
                MAction::Goto(i, s)
            }
            "drop" => MAction::Drop(self.bump().span),
            "set" => {
                self.bump();
                let field = self.m_operand()?;
                self.expect(&Tok::Assign, "`:=` and the field's new value")?;
                let value = self.m_operand()?;
                MAction::Set {
                    span: start.to(value.span),
                    field,
                    value,
                }
            }
            _ => {
                let target = self.m_operand()?;
                self.expect(
                    &Tok::Assign,
                    "`:=`, or an item: `next`, `forward`, `drop`, `set` or `goto`",
                )?;
                let value = self.m_expr()?;
                MAction::Update {
                    span: start.to(value.span()),
                    target,
                    value,
                }
            }
        })
    }

    fn m_cond(&mut self) -> PResult<MCond> {
        let start = self.span();
        if self.at_word("from") && matches!(self.nth(1), Tok::Ident(_)) {
            self.bump();
            let ch = self.ident("a channel name")?;
            let span = start.to(ch.span);
            return Ok(MCond::From(ch, span));
        }
        let lhs = self.m_operand()?;
        let op = match self.tok() {
            Tok::Eq => BinOp::Eq,
            Tok::Ne => BinOp::Ne,
            Tok::Lt => BinOp::Lt,
            Tok::Le => BinOp::Le,
            Tok::Gt => BinOp::Gt,
            Tok::Ge => BinOp::Ge,
            _ => return Err(self.unexpected("a comparison: `=`, `<>`, `<`, `<=`, `>` or `>=`")),
        };
        self.bump();
        let rhs = self.m_operand()?;
        Ok(MCond::Compare {
            span: start.to(rhs.span),
            lhs,
            op,
            rhs,
        })
    }

    fn m_expr(&mut self) -> PResult<MExpr> {
        let start = self.span();
        if matches!(self.tok(), Tok::Ident(w) if w == "max" || w == "min")
            && self.nth(1) == &Tok::LParen
        {
            let f = self.ident("`max` or `min`")?;
            self.bump();
            let a = self.m_operand()?;
            self.expect(&Tok::Comma, "`,` and the second operand")?;
            let b = self.m_operand()?;
            self.expect(&Tok::RParen, "`)`")?;
            return Ok(MExpr::Call(f, a, b, start.to(self.prev_span())));
        }
        let a = self.m_operand()?;
        let op = match self.tok() {
            Tok::Plus => BinOp::Add,
            Tok::Minus => BinOp::Sub,
            Tok::Star => BinOp::Mul,
            Tok::Slash => BinOp::Div,
            Tok::Mod => BinOp::Mod,
            _ => return Ok(MExpr::Operand(a)),
        };
        self.bump();
        let b = self.m_operand()?;
        let span = start.to(b.span);
        Ok(MExpr::Binary(op, a, b, span))
    }

    fn m_operand(&mut self) -> PResult<MOperand> {
        let start = self.span();
        let kind = match self.tok().clone() {
            Tok::Int {
                value,
                hex,
                spelling,
            } => {
                self.bump();
                MOperandKind::Int {
                    value,
                    hex,
                    spelling,
                }
            }
            Tok::Ipv4(a) => {
                self.bump();
                MOperandKind::Ipv4(a)
            }
            Tok::Ident(_) => {
                let a = self.ident("a name")?;
                if self.eat(&Tok::Dot) {
                    // A field may be named like a keyword: `eth.type`.
                    let text = self.tok().text();
                    let b = if text.starts_with(|c: char| c.is_ascii_alphabetic()) {
                        Ident::new(text, self.bump().span)
                    } else {
                        self.ident("a field name")?
                    };
                    MOperandKind::Dotted(a, b)
                } else {
                    MOperandKind::Name(a)
                }
            }
            _ => return Err(self.unexpected("a field, register, constant or number")),
        };
        Ok(MOperand {
            kind,
            span: start.to(self.prev_span()),
        })
    }
}
