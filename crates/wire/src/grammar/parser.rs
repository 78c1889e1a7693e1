//! A parser for grammar files (Spicy-like units, as in the paper's
//! Listing 2). Errors are diagnostics with spans, reported all at once
//! where the parser can resume at the next `;`.

use super::ast::*;
use flick_span::{Diagnostic, Span};

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Int(u64),
    Str(Vec<u8>),
    Punct(&'static str),
    Eof,
}

struct Token {
    tok: Tok,
    span: Span,
}

const PUNCT: &[&str] = &[
    "$$", "::", "->", "==", "!=", "<=", ">=", "&&", "||", "{", "}", "(", ")", "[", "]", ";", ":",
    ",", "=", "&", "%", ".", "+", "-", "*", "/", "<", ">", "!",
];

fn lex(src: &str, diags: &mut Vec<Diagnostic>) -> Vec<Token> {
    let b = src.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'#' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c.is_ascii_digit() {
            let hex = c == b'0' && matches!(b.get(i + 1), Some(b'x' | b'X'));
            if hex {
                i += 2;
            }
            let ds = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let digits: String = src[ds..i].chars().filter(|c| *c != '_').collect();
            let v = if hex {
                u64::from_str_radix(&digits, 16)
            } else {
                digits.parse()
            };
            match v {
                Ok(v) => out.push(Token {
                    tok: Tok::Int(v),
                    span: Span::new(start, i),
                }),
                Err(_) => diags.push(Diagnostic::error(
                    "W0001",
                    "not a valid integer",
                    Span::new(start, i),
                )),
            }
        } else if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Token {
                tok: Tok::Ident(src[start..i].to_string()),
                span: Span::new(start, i),
            });
        } else if c == b'"' {
            i += 1;
            let mut s = Vec::new();
            let mut closed = false;
            while i < b.len() && b[i] != b'\n' {
                match b[i] {
                    b'"' => {
                        i += 1;
                        closed = true;
                        break;
                    }
                    b'\\' if i + 1 < b.len() => {
                        let e = b[i + 1];
                        i += 2;
                        match e {
                            b'r' => s.push(b'\r'),
                            b'n' => s.push(b'\n'),
                            b't' => s.push(b'\t'),
                            b'0' => s.push(0),
                            b'\\' => s.push(b'\\'),
                            b'"' => s.push(b'"'),
                            b'x' => match src
                                .get(i..i + 2)
                                .and_then(|h| u8::from_str_radix(h, 16).ok())
                            {
                                Some(v) => {
                                    s.push(v);
                                    i += 2;
                                }
                                None => diags.push(Diagnostic::error(
                                    "W0001",
                                    "`\\x` needs two hexadecimal digits",
                                    Span::new(i - 2, i),
                                )),
                            },
                            _ => diags.push(Diagnostic::error(
                                "W0001",
                                "unknown escape in string",
                                Span::new(i - 2, i),
                            )),
                        }
                    }
                    x => {
                        s.push(x);
                        i += 1;
                    }
                }
            }
            if !closed {
                diags.push(Diagnostic::error(
                    "W0001",
                    "unterminated string",
                    Span::new(start, i),
                ));
            }
            out.push(Token {
                tok: Tok::Str(s),
                span: Span::new(start, i),
            });
        } else if let Some(p) = PUNCT.iter().find(|p| src[i..].starts_with(**p)) {
            i += p.len();
            out.push(Token {
                tok: Tok::Punct(p),
                span: Span::new(start, i),
            });
        } else {
            let ch = src[i..].chars().next().unwrap();
            i += ch.len_utf8();
            diags.push(Diagnostic::error(
                "W0001",
                format!("unexpected character `{}`", ch.escape_debug()),
                Span::new(start, i),
            ));
        }
    }
    out.push(Token {
        tok: Tok::Eof,
        span: Span::new(b.len(), b.len()),
    });
    out
}

struct Reported;

/// Unit properties that tell a proxy how to route and match messages.
pub const ROUTING: &[&str] = &[
    "broadcast",
    "more",
    "coalesce",
    "correlate",
    "ends",
    "ends_peer",
    "reply_context",
    "quiet",
    "split",
    "resync",
    "fence",
    "fenced",
    "discard",
    "quiet_reject",
    "reject_send",
    "refuse",
    "exclusive",
    "idempotent",
    "buffer_body",
    "timeout_status",
    "merge",
    "merge_key",
    "merge_value",
    "merge_sum",
];
type PResult<T> = Result<T, Reported>;

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    diags: Vec<Diagnostic>,
}

/// Parses grammar source into its tree; the diagnostics hold every error.
pub fn parse_grammar(src: &str) -> (GrammarFile, Vec<Diagnostic>) {
    let mut diags = Vec::new();
    let toks = lex(src, &mut diags);
    let mut p = Parser {
        toks,
        pos: 0,
        diags,
    };
    let file = p.file();
    (file, p.diags)
}

impl Parser {
    fn tok(&self) -> &Tok {
        &self.toks[self.pos].tok
    }

    fn span(&self) -> Span {
        self.toks[self.pos].span
    }

    fn prev_span(&self) -> Span {
        self.toks[self.pos.saturating_sub(1)].span
    }

    fn bump(&mut self) {
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
    }

    fn is(&self, p: &str) -> bool {
        matches!(self.tok(), Tok::Punct(q) if *q == p)
    }

    fn is_word(&self, w: &str) -> bool {
        matches!(self.tok(), Tok::Ident(x) if x == w)
    }

    fn eat(&mut self, p: &str) -> bool {
        if self.is(p) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn fail(&mut self, wanted: &str) -> Reported {
        let found = match self.tok() {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Int(v) => format!("`{v}`"),
            Tok::Str(_) => "a string".into(),
            Tok::Punct(p) => format!("`{p}`"),
            Tok::Eof => "end of file".into(),
        };
        self.diags.push(
            Diagnostic::error(
                "W0002",
                format!("expected {wanted}, found {found}"),
                self.span(),
            )
            .label(format!("expected {wanted}")),
        );
        Reported
    }

    fn expect(&mut self, p: &str) -> PResult<()> {
        if self.eat(p) {
            Ok(())
        } else {
            Err(self.fail(&format!("`{p}`")))
        }
    }

    fn ident(&mut self, wanted: &str) -> PResult<String> {
        match self.tok().clone() {
            Tok::Ident(s) => {
                self.bump();
                Ok(s)
            }
            _ => Err(self.fail(wanted)),
        }
    }

    /// Skips past the next `;` at this nesting level.
    fn recover(&mut self) {
        let mut depth = 0i32;
        loop {
            match self.tok() {
                Tok::Eof => return,
                Tok::Punct("{") => depth += 1,
                Tok::Punct("}") => {
                    if depth == 0 {
                        return;
                    }
                    depth -= 1;
                }
                Tok::Punct(";") if depth <= 0 => {
                    self.bump();
                    return;
                }
                _ => {}
            }
            self.bump();
        }
    }

    fn file(&mut self) -> GrammarFile {
        let mut f = GrammarFile {
            name: None,
            byte_order: ByteOrder::Big,
            enums: Vec::new(),
            units: Vec::new(),
        };
        while self.tok() != &Tok::Eof {
            if self.top_item(&mut f).is_err() {
                self.recover();
            }
        }
        f
    }

    fn top_item(&mut self, f: &mut GrammarFile) -> PResult<()> {
        if self.is_word("grammar") {
            self.bump();
            f.name = Some(self.ident("the grammar's name")?);
            return self.expect(";");
        }
        if self.eat("%") {
            f.byte_order = self.byte_order_property()?;
            return Ok(());
        }
        if !self.is_word("type") {
            return Err(self.fail("`type`, `grammar` or `%byteorder`"));
        }
        let start = self.span();
        self.bump();
        let name = self.ident("a type name")?;
        self.expect("=")?;
        if self.is_word("enum") {
            self.bump();
            self.expect("{")?;
            let mut variants = Vec::new();
            while !self.is("}") {
                let v = self.ident("a variant name")?;
                self.expect("=")?;
                let n = match self.tok() {
                    Tok::Int(n) => *n,
                    _ => return Err(self.fail("the variant's value")),
                };
                self.bump();
                variants.push((v, n));
                if !self.eat(",") {
                    break;
                }
            }
            self.expect("}")?;
            self.expect(";")?;
            f.enums.push(EnumDecl {
                name,
                variants,
                span: start.to(self.prev_span()),
            });
            return Ok(());
        }
        if !self.is_word("unit") {
            return Err(self.fail("`unit` or `enum`"));
        }
        self.bump();
        self.expect("{")?;
        let mut byte_order = None;
        let mut error = None;
        let mut fault = Vec::new();
        let mut end = Vec::new();
        let mut reject = Vec::new();
        let mut properties = Vec::new();
        let mut forward = None;
        let mut items = Vec::new();
        while !self.is("}") && self.tok() != &Tok::Eof {
            // `%error = STATUS;`: the status of this unit's failures that
            // name none of their own.
            if self.is("%") && matches!(&self.toks[self.pos + 1].tok, Tok::Ident(w) if w == "error")
            {
                self.bump();
                self.bump();
                let status = self.expect("=").and_then(|_| match self.tok().clone() {
                    Tok::Int(n) if n <= u16::MAX as u64 => {
                        self.bump();
                        Ok(n as u16)
                    }
                    _ => Err(self.fail("a status number")),
                });
                match status.and_then(|n| self.expect(";").map(|_| n)) {
                    Ok(n) => error = Some(n),
                    Err(_) => self.recover(),
                }
                continue;
            }
            // `%fault = FIELD = EXPR, ...;`: the reply to a request of this
            // unit that no peer will answer (a dead backend).
            if self.is("%") && matches!(&self.toks[self.pos + 1].tok, Tok::Ident(w) if w == "fault")
            {
                self.bump();
                self.bump();
                match self.fault_assignments() {
                    Ok(f) => fault = f,
                    Err(_) => self.recover(),
                }
                continue;
            }
            // `%end = FIELD = EXPR, ...;`: the message that closes a stream
            // written with this unit (`$$`: the stream's CRC32 so far).
            if self.is("%") && matches!(&self.toks[self.pos + 1].tok, Tok::Ident(w) if w == "end") {
                self.bump();
                self.bump();
                match self.fault_assignments() {
                    Ok(f) => end = f,
                    Err(_) => self.recover(),
                }
                continue;
            }
            // `%reject = FIELD = EXPR, ...;`: the reply to a request that
            // does not parse (Memcached's `ERROR`).
            if self.is("%")
                && matches!(&self.toks[self.pos + 1].tok, Tok::Ident(w) if w == "reject")
            {
                self.bump();
                self.bump();
                match self.fault_assignments() {
                    Ok(f) => reject = f,
                    Err(_) => self.recover(),
                }
                continue;
            }
            // `%forward LIST = EDIT, ...;`: what a proxy changes in a
            // message it passes on.
            if self.is("%")
                && matches!(&self.toks[self.pos + 1].tok, Tok::Ident(w) if w == "forward")
            {
                self.bump();
                self.bump();
                match self.forward() {
                    Ok(f) => forward = Some(f),
                    Err(_) => self.recover(),
                }
                continue;
            }
            // `%broadcast`, `%more`, `%correlate`, `%ends`: how a proxy routes and
            // matches this unit's messages (see docs/grammars.md).
            if self.is("%")
                && matches!(&self.toks[self.pos + 1].tok, Tok::Ident(w) if ROUTING.contains(&w.as_str()))
            {
                self.bump();
                let name = self.ident("a property")?;
                let value = self.expect("=").and_then(|_| self.expr());
                match value.and_then(|v| self.expect(";").map(|_| v)) {
                    Ok(v) => properties.push((name, v)),
                    Err(_) => self.recover(),
                }
                continue;
            }
            if self.eat("%") {
                match self.byte_order_property() {
                    Ok(b) => byte_order = Some(b),
                    Err(_) => self.recover(),
                }
                continue;
            }
            match self.item() {
                Ok(i) => items.push(i),
                Err(Reported) => self.recover(),
            }
        }
        self.expect("}")?;
        self.expect(";")?;
        f.units.push(UnitDecl {
            name,
            byte_order,
            error,
            fault,
            end,
            reject,
            properties,
            forward,
            items,
            span: start.to(self.prev_span()),
        });
        Ok(())
    }

    /// After `%forward`: `LIST = EDIT, ...;`.
    fn forward(&mut self) -> PResult<ForwardDecl> {
        let start = self.prev_span();
        let list = self.ident("the list the edits apply to")?;
        self.expect("=")?;
        let mut edits = Vec::new();
        loop {
            let at = self.span();
            let edit = self.ident("`drop` or `add`")?;
            self.expect("(")?;
            let mut args = Vec::new();
            if !self.is(")") {
                loop {
                    args.push(self.expr()?);
                    if !self.eat(",") {
                        break;
                    }
                }
            }
            self.expect(")")?;
            match edit.as_str() {
                "drop" if args.len() >= 2 => {
                    let field = args.remove(0);
                    edits.push(EditDecl::Drop { field, names: args });
                }
                "drop" => {
                    self.diags.push(
                        Diagnostic::error(
                            "W0003",
                            "`drop` takes the element field and at least one value",
                            at.to(self.prev_span()),
                        )
                        .hint("drop(\"name\", \"connection\", \"keep-alive\")"),
                    );
                    return Err(Reported);
                }
                "add" => {
                    let when = if self.is_word("if") {
                        self.bump();
                        Some(self.expr()?)
                    } else {
                        None
                    };
                    edits.push(EditDecl::Add {
                        parts: args,
                        when,
                        span: at.to(self.prev_span()),
                    });
                }
                other => {
                    self.diags.push(Diagnostic::error(
                        "W0003",
                        format!("unknown edit `{other}`: `%forward` edits are `drop` and `add`"),
                        at,
                    ));
                    return Err(Reported);
                }
            }
            if !self.eat(",") {
                break;
            }
        }
        self.expect(";")?;
        Ok(ForwardDecl {
            list,
            edits,
            span: start.to(self.prev_span()),
        })
    }

    fn fault_assignments(&mut self) -> PResult<Vec<(String, Expr)>> {
        self.expect("=")?;
        let mut out = Vec::new();
        loop {
            let field = self.ident("a field of the reply")?;
            self.expect("=")?;
            out.push((field, self.expr()?));
            if !self.eat(",") {
                break;
            }
        }
        self.expect(";")?;
        Ok(out)
    }

    fn byte_order_property(&mut self) -> PResult<ByteOrder> {
        let prop = self.ident("a property name")?;
        if prop != "byteorder" {
            self.diags.push(Diagnostic::error(
                "W0003",
                format!("unknown property `%{prop}`"),
                self.prev_span(),
            ));
            return Err(Reported);
        }
        self.expect("=")?;
        let v = self.ident("`big` or `little`")?;
        let order = match v.as_str() {
            "big" | "network" => ByteOrder::Big,
            "little" => ByteOrder::Little,
            _ => {
                self.diags.push(
                    Diagnostic::error(
                        "W0003",
                        format!("`{v}` is not a byte order"),
                        self.prev_span(),
                    )
                    .hint("write `big` or `little`"),
                );
                return Err(Reported);
            }
        };
        self.expect(";")?;
        Ok(order)
    }

    fn items_block(&mut self) -> PResult<Vec<Item>> {
        if self.eat("{") {
            let mut items = Vec::new();
            while !self.is("}") && self.tok() != &Tok::Eof {
                match self.item() {
                    Ok(i) => items.push(i),
                    Err(Reported) => self.recover(),
                }
            }
            self.expect("}")?;
            Ok(items)
        } else {
            Ok(vec![self.item()?])
        }
    }

    fn item(&mut self) -> PResult<Item> {
        let start = self.span();
        if self.is_word("var") {
            self.bump();
            let name = self.ident("the variable's name")?;
            self.expect(":")?;
            let ty = self.field_type()?;
            let mut parse = None;
            let mut serialize = None;
            let mut requires = None;
            while self.eat("&") {
                let a = self.ident("`parse` or `serialize`")?;
                self.expect("=")?;
                match a.as_str() {
                    "parse" => parse = Some(self.expr()?),
                    "requires" => requires = Some(self.expr()?),
                    "serialize" => {
                        if !self.is_word("self") {
                            return Err(self.fail("`self.FIELD = EXPR`"));
                        }
                        self.bump();
                        self.expect(".")?;
                        let target = self.ident("a field name")?;
                        self.expect("=")?;
                        serialize = Some((target, self.expr()?));
                    }
                    _ => {
                        self.diags.push(
                            Diagnostic::error(
                                "W0004",
                                format!("`&{a}` is not an attribute of a variable"),
                                self.prev_span(),
                            )
                            .hint("variables take &parse and &serialize"),
                        );
                        return Err(Reported);
                    }
                }
            }
            self.expect(";")?;
            let span = start.to(self.prev_span());
            let Some(parse) = parse else {
                self.diags.push(
                    Diagnostic::error("W0004", format!("variable `{name}` needs `&parse`"), span)
                        .hint("a variable is computed while parsing: `&parse = EXPR`"),
                );
                return Err(Reported);
            };
            return Ok(Item::Var(VarDecl {
                name,
                ty,
                parse,
                serialize,
                requires,
                span,
            }));
        }
        if self.is_word("switch") {
            self.bump();
            self.expect("(")?;
            let on = self.expr()?;
            self.expect(")")?;
            self.expect("{")?;
            let mut cases = Vec::new();
            while !self.is("}") && self.tok() != &Tok::Eof {
                let mut values = Vec::new();
                if !self.eat("*") {
                    loop {
                        values.push(self.expr()?);
                        if !self.eat(",") {
                            break;
                        }
                    }
                }
                self.expect("->")?;
                let items = self.items_block()?;
                cases.push(Case { values, items });
            }
            self.expect("}")?;
            self.expect(";")?;
            return Ok(Item::Switch(Switch {
                on,
                cases,
                span: start.to(self.prev_span()),
            }));
        }
        let name = if self.is(":") {
            None
        } else {
            Some(self.ident("a field name, `:`, `var` or `switch`")?)
        };
        self.expect(":")?;
        let ty = self.field_type()?;
        let mut attrs = Vec::new();
        while self.is("&") {
            let astart = self.span();
            self.bump();
            let name = self.ident("an attribute name")?;
            let value = if self.eat("=") {
                Some(self.expr()?)
            } else {
                None
            };
            attrs.push(Attr {
                name,
                value,
                span: astart.to(self.prev_span()),
            });
        }
        self.expect(";")?;
        Ok(Item::Field(Field {
            name,
            ty,
            attrs,
            span: start.to(self.prev_span()),
        }))
    }

    fn field_type(&mut self) -> PResult<FieldType> {
        let base = match self.tok().clone() {
            Tok::Str(s) => {
                self.bump();
                FieldType::Literal(s)
            }
            Tok::Ident(w) => {
                self.bump();
                let int = |signed: bool, bits: &str| -> Option<FieldType> {
                    let bytes = match bits {
                        "8" => 1,
                        "16" => 2,
                        "32" => 4,
                        "64" => 8,
                        _ => return None,
                    };
                    Some(FieldType::Int { bytes, signed })
                };
                if let Some(bits) = w.strip_prefix("uint") {
                    int(false, bits).unwrap_or(FieldType::Named(w))
                } else if let Some(bits) = w.strip_prefix("int") {
                    int(true, bits).unwrap_or(FieldType::Named(w))
                } else {
                    match w.as_str() {
                        "bytes" => FieldType::Bytes,
                        "string" => FieldType::String,
                        "vint" | "vlong" => FieldType::VInt,
                        "ws" => FieldType::Ws,
                        _ => FieldType::Named(w),
                    }
                }
            }
            _ => return Err(self.fail("a field type")),
        };
        if self.eat("[") {
            self.expect("]")?;
            return Ok(FieldType::List(Box::new(base)));
        }
        Ok(base)
    }

    fn expr(&mut self) -> PResult<Expr> {
        self.binary(0)
    }

    fn binop(&self) -> Option<(BinOp, u8)> {
        let Tok::Punct(p) = self.tok() else {
            return None;
        };
        Some(match *p {
            "||" => (BinOp::Or, 1),
            "&&" => (BinOp::And, 2),
            "==" => (BinOp::Eq, 3),
            "!=" => (BinOp::Ne, 3),
            "<" => (BinOp::Lt, 3),
            "<=" => (BinOp::Le, 3),
            ">" => (BinOp::Gt, 3),
            ">=" => (BinOp::Ge, 3),
            "+" => (BinOp::Add, 4),
            "-" => (BinOp::Sub, 4),
            "*" => (BinOp::Mul, 5),
            "/" => (BinOp::Div, 5),
            "%" => (BinOp::Mod, 5),
            _ => return None,
        })
    }

    fn binary(&mut self, min: u8) -> PResult<Expr> {
        let mut lhs = self.unary()?;
        while let Some((op, prec)) = self.binop() {
            if prec <= min {
                break;
            }
            self.bump();
            let rhs = self.binary(prec)?;
            lhs = Expr {
                span: lhs.span.to(rhs.span),
                kind: ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
            };
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> PResult<Expr> {
        let start = self.span();
        let op = if self.eat("!") {
            UnOp::Not
        } else if self.eat("-") {
            UnOp::Neg
        } else {
            return self.primary();
        };
        let e = self.unary()?;
        Ok(Expr {
            span: start.to(e.span),
            kind: ExprKind::Unary(op, Box::new(e)),
        })
    }

    fn path(&mut self) -> PResult<Vec<String>> {
        let mut path = Vec::new();
        while self.eat(".") {
            path.push(self.ident("a field name")?);
        }
        Ok(path)
    }

    fn primary(&mut self) -> PResult<Expr> {
        let start = self.span();
        let kind = match self.tok().clone() {
            Tok::Int(v) => {
                self.bump();
                ExprKind::Int(v)
            }
            Tok::Str(s) => {
                self.bump();
                ExprKind::Str(s)
            }
            Tok::Punct("$$") => {
                self.bump();
                ExprKind::Dollar(self.path()?)
            }
            Tok::Punct("(") => {
                self.bump();
                let e = self.expr()?;
                self.expect(")")?;
                return Ok(Expr {
                    kind: e.kind,
                    span: start.to(self.prev_span()),
                });
            }
            Tok::Ident(w) if w == "self" => {
                self.bump();
                let path = self.path()?;
                if path.is_empty() {
                    return Err(self.fail("`.` and a field name"));
                }
                ExprKind::SelfField(path)
            }
            Tok::Ident(w) if w == "true" || w == "false" => {
                self.bump();
                ExprKind::Int(u64::from(w == "true"))
            }
            Tok::Ident(w) => {
                self.bump();
                if self.eat("::") {
                    let v = self.ident("a variant name")?;
                    ExprKind::EnumConst(w, v)
                } else if self.eat("(") {
                    let mut args = Vec::new();
                    while !self.is(")") {
                        args.push(self.expr()?);
                        if !self.eat(",") {
                            break;
                        }
                    }
                    self.expect(")")?;
                    ExprKind::Call(w, args)
                } else {
                    self.diags.push(
                        Diagnostic::error("W0002", format!("unknown name `{w}`"), self.prev_span())
                            .hint("fields are written `self.NAME`, enumeration values `Enum::Variant`"),
                    );
                    return Err(Reported);
                }
            }
            _ => return Err(self.fail("an expression")),
        };
        Ok(Expr {
            kind,
            span: start.to(self.prev_span()),
        })
    }
}
