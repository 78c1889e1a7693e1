//! XL's parser: tokens to the syntax tree below, one file at a time.

use super::lexer::{Tok, Token};
use super::XlError;
use crate::model::{ArithOp, CmpOp};

/// Where a piece of syntax is: a file of the load, and byte offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pos {
    pub file: u16,
    pub start: u32,
    pub end: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ident {
    pub name: String,
    pub pos: Pos,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Term {
    /// `ipv4.src`, `pktRcvd.port`.
    Field(Ident, Ident),
    Name(Ident),
    /// An integer, or an address in quotes.
    Int(u64, Pos),
}

impl Term {
    pub fn pos(&self) -> Pos {
        match self {
            Term::Field(a, b) => Pos {
                end: b.pos.end,
                ..a.pos
            },
            Term::Name(i) => i.pos,
            Term::Int(_, p) => *p,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    pub lhs: Term,
    pub op: CmpOp,
    pub rhs: Term,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExprAst {
    Term(Term),
    Binary(ArithOp, Term, Term),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stmt {
    Call { name: Ident, args: Vec<Term> },
    Assign { target: Ident, expr: ExprAst },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfBlock {
    pub conds: Vec<Cond>,
    pub body: Vec<Stmt>,
    pub pos: Pos,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnBlock {
    pub event: Ident,
    pub body: Vec<Stmt>,
    pub ifs: Vec<IfBlock>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDecl {
    pub initial: bool,
    pub name: Ident,
    pub body: Vec<Stmt>,
    pub on: Vec<OnBlock>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegDecl {
    pub global: bool,
    pub name: Ident,
    pub init: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionDecl {
    pub name: Ident,
    pub body: Vec<Stmt>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageDecl {
    pub name: Ident,
    pub regs: Vec<RegDecl>,
    pub actions: Vec<ActionDecl>,
    pub body: Vec<Stmt>,
    pub states: Vec<StateDecl>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldEntry {
    /// `ipv4.src` for `src` in `PacketField ipv4`.
    pub name: String,
    pub pos: Pos,
    pub offset: u64,
    pub len: u64,
}

/// A file's (or, merged, a load's) declarations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XlFile {
    pub imports: Vec<(String, Pos)>,
    pub fields: Vec<FieldEntry>,
    pub constants: Vec<(Ident, u64)>,
    pub regs: Vec<RegDecl>,
    pub actions: Vec<ActionDecl>,
    pub stages: Vec<StageDecl>,
}

pub struct Parser<'a> {
    toks: &'a [Token],
    i: usize,
    file: u16,
    err: &'a dyn Fn(Pos, String) -> XlError,
}

type R<T> = Result<T, XlError>;

fn describe(t: &Tok) -> String {
    match t {
        Tok::Ident(s) => format!("`{s}`"),
        Tok::Int(v) => format!("`{v}`"),
        Tok::Str(s) => format!("\"{s}\""),
        Tok::Punct(c) => format!("`{c}`"),
        Tok::Cmp(c) => format!("`{c}`"),
        Tok::Eof => "the end of the file".into(),
    }
}

impl<'a> Parser<'a> {
    pub fn new(toks: &'a [Token], file: u16, err: &'a dyn Fn(Pos, String) -> XlError) -> Self {
        Parser {
            toks,
            i: 0,
            file,
            err,
        }
    }

    fn peek(&self) -> &Tok {
        &self.toks[self.i].tok
    }

    fn peek2(&self) -> &Tok {
        &self.toks[(self.i + 1).min(self.toks.len() - 1)].tok
    }

    fn pos(&self) -> Pos {
        let t = &self.toks[self.i];
        Pos {
            file: self.file,
            start: t.start as u32,
            end: t.end as u32,
        }
    }

    fn bump(&mut self) -> &Token {
        let t = &self.toks[self.i];
        if self.i + 1 < self.toks.len() {
            self.i += 1;
        }
        t
    }

    fn fail<T>(&self, what: &str) -> R<T> {
        Err((self.err)(
            self.pos(),
            format!("expected {what}, found {}", describe(self.peek())),
        ))
    }

    fn is_punct(&self, c: char) -> bool {
        *self.peek() == Tok::Punct(c)
    }

    fn is_word(&self, w: &str) -> bool {
        matches!(self.peek(), Tok::Ident(s) if s == w)
    }

    fn punct(&mut self, c: char) -> R<()> {
        if self.is_punct(c) {
            self.bump();
            Ok(())
        } else {
            self.fail(&format!("`{c}`"))
        }
    }

    fn ident(&mut self) -> R<Ident> {
        let pos = self.pos();
        match self.peek().clone() {
            Tok::Ident(name) => {
                self.bump();
                Ok(Ident { name, pos })
            }
            _ => self.fail("a name"),
        }
    }

    fn int(&mut self) -> R<u64> {
        match *self.peek() {
            Tok::Int(v) => {
                self.bump();
                Ok(v)
            }
            _ => self.fail("an integer"),
        }
    }

    /// A value: an integer or a quoted IPv4 or MAC address.
    fn value(&mut self) -> R<(u64, Pos)> {
        let pos = self.pos();
        match self.peek().clone() {
            Tok::Int(v) => {
                self.bump();
                Ok((v, pos))
            }
            Tok::Str(s) => match address(&s) {
                Some(v) => {
                    self.bump();
                    Ok((v, pos))
                }
                None => Err((self.err)(
                    pos,
                    format!("\"{s}\" is neither an IPv4 address nor a MAC address"),
                )),
            },
            _ => self.fail("a value"),
        }
    }

    pub fn file(&mut self) -> R<XlFile> {
        let mut f = XlFile::default();
        loop {
            match self.peek().clone() {
                Tok::Eof => return Ok(f),
                Tok::Ident(w) => {
                    match w.as_str() {
                        "import" => {
                            self.bump();
                            loop {
                                let pos = self.pos();
                                match self.peek().clone() {
                                    Tok::Str(s) => {
                                        self.bump();
                                        f.imports.push((s, pos));
                                    }
                                    _ => return self.fail("a file name in quotes"),
                                }
                                if self.is_punct(',') {
                                    self.bump();
                                } else {
                                    break;
                                }
                            }
                            self.punct(';')?;
                        }
                        "PacketField" => self.packet_field(&mut f.fields)?,
                        "Constant" => {
                            self.bump();
                            loop {
                                let name = self.ident()?;
                                self.punct('=')?;
                                let (v, _) = self.value()?;
                                f.constants.push((name, v));
                                if self.is_punct(',') {
                                    self.bump();
                                } else {
                                    break;
                                }
                            }
                            self.punct(';')?;
                        }
                        "Register" => self.registers(&mut f.regs)?,
                        "Action" => f.actions.push(self.action()?),
                        "Stage" => f.stages.push(self.stage()?),
                        "Event" => {
                            return Err((self.err)(
                                self.pos(),
                                "custom events (`Event NAME = ...`) are not supported".into(),
                            ))
                        }
                        "State" => {
                            return Err((self.err)(
                                self.pos(),
                                "a State must be inside a Stage".into(),
                            ))
                        }
                        _ => return self.fail(
                            "`import`, `PacketField`, `Constant`, `Register`, `Action` or `Stage`",
                        ),
                    }
                }
                _ => {
                    return self.fail(
                        "`import`, `PacketField`, `Constant`, `Register`, `Action` or `Stage`",
                    )
                }
            }
        }
    }

    fn packet_field(&mut self, out: &mut Vec<FieldEntry>) -> R<()> {
        self.bump();
        let header = self.ident()?;
        self.punct('{')?;
        while !self.is_punct('}') {
            let name = self.ident()?;
            self.punct('=')?;
            let base = self.ident()?;
            self.punct('.')?;
            let data = self.ident()?;
            if base.name != "packet" || data.name != "data" {
                return Err((self.err)(
                    Pos {
                        end: data.pos.end,
                        ..base.pos
                    },
                    "a packet field is `packet.data[OFFSET:+LENGTH]`".into(),
                ));
            }
            self.punct('[')?;
            let offset = self.int()?;
            let len = if self.is_punct(':') {
                self.bump();
                if !self.is_punct('+') {
                    return self.fail("`+` (write the range as [OFFSET:+LENGTH])");
                }
                self.bump();
                let lpos = self.pos();
                let len = self.int()?;
                if !(1..=8).contains(&len) {
                    return Err((self.err)(
                        lpos,
                        format!("a field is 1 to 8 bytes long, not {len}"),
                    ));
                }
                len
            } else {
                1
            };
            self.punct(']')?;
            self.punct(';')?;
            if offset > u16::MAX as u64 {
                return Err((self.err)(
                    name.pos,
                    format!("offset {offset} is past any frame"),
                ));
            }
            out.push(FieldEntry {
                name: format!("{}.{}", header.name, name.name),
                pos: name.pos,
                offset,
                len,
            });
        }
        self.punct('}')
    }

    fn registers(&mut self, out: &mut Vec<RegDecl>) -> R<()> {
        self.bump();
        let global = if self.is_word("global") {
            self.bump();
            true
        } else {
            if self.is_word("local") {
                self.bump();
            }
            false
        };
        loop {
            let name = self.ident()?;
            let init = if self.is_punct('=') {
                self.bump();
                Some(self.value()?.0)
            } else {
                None
            };
            out.push(RegDecl { global, name, init });
            if self.is_punct(',') {
                self.bump();
            } else {
                break;
            }
        }
        self.punct(';')
    }

    fn action(&mut self) -> R<ActionDecl> {
        self.bump();
        let name = self.ident()?;
        self.punct('{')?;
        let mut body = Vec::new();
        while !self.is_punct('}') {
            self.stmt(&mut body)?;
        }
        self.bump();
        Ok(ActionDecl { name, body })
    }

    fn stage(&mut self) -> R<StageDecl> {
        self.bump();
        let name = self.ident()?;
        self.punct('{')?;
        let mut s = StageDecl {
            name,
            regs: Vec::new(),
            actions: Vec::new(),
            body: Vec::new(),
            states: Vec::new(),
        };
        while !self.is_punct('}') {
            if self.is_word("Register") {
                self.registers(&mut s.regs)?;
            } else if self.is_word("Action") {
                s.actions.push(self.action()?);
            } else if self.is_word("State") {
                s.states.push(self.state()?);
            } else if self.is_word("Event") {
                return Err((self.err)(
                    self.pos(),
                    "custom events (`Event NAME = ...`) are not supported".into(),
                ));
            } else if *self.peek() == Tok::Eof {
                return self.fail("`}`");
            } else {
                self.stmt(&mut s.body)?;
            }
        }
        self.bump();
        Ok(s)
    }

    fn state(&mut self) -> R<StateDecl> {
        self.bump();
        let initial = if self.is_word("initial") {
            self.bump();
            true
        } else {
            false
        };
        let name = self.ident()?;
        self.punct('{')?;
        let mut st = StateDecl {
            initial,
            name,
            body: Vec::new(),
            on: Vec::new(),
        };
        while !self.is_punct('}') {
            if self.is_word("on") && *self.peek2() == Tok::Punct('(') {
                st.on.push(self.on()?);
            } else if *self.peek() == Tok::Eof {
                return self.fail("`}`");
            } else {
                self.stmt(&mut st.body)?;
            }
        }
        self.bump();
        Ok(st)
    }

    fn on(&mut self) -> R<OnBlock> {
        self.bump();
        self.punct('(')?;
        let event = self.ident()?;
        self.punct(')')?;
        self.punct('{')?;
        let mut on = OnBlock {
            event,
            body: Vec::new(),
            ifs: Vec::new(),
        };
        while !self.is_punct('}') {
            if self.is_word("if") {
                let pos = self.pos();
                self.bump();
                self.punct('(')?;
                let mut conds = Vec::new();
                loop {
                    conds.push(self.cond()?);
                    if self.is_punct(',') {
                        self.bump();
                    } else {
                        break;
                    }
                }
                self.punct(')')?;
                self.punct('{')?;
                let mut body = Vec::new();
                while !self.is_punct('}') {
                    if *self.peek() == Tok::Eof {
                        return self.fail("`}`");
                    }
                    self.stmt(&mut body)?;
                }
                self.bump();
                on.ifs.push(IfBlock { conds, body, pos });
            } else if *self.peek() == Tok::Eof {
                return self.fail("`}`");
            } else {
                self.stmt(&mut on.body)?;
            }
        }
        self.bump();
        Ok(on)
    }

    fn cond(&mut self) -> R<Cond> {
        let lhs = self.term()?;
        let op = match self.peek() {
            Tok::Cmp(op) => match *op {
                "==" => CmpOp::Eq,
                "!=" => CmpOp::Ne,
                "<=" => CmpOp::Le,
                ">=" => CmpOp::Ge,
                "<" => CmpOp::Lt,
                _ => CmpOp::Gt,
            },
            _ => return self.fail("a comparison (`==`, `!=`, `<`, `<=`, `>`, `>=`)"),
        };
        self.bump();
        let rhs = self.term()?;
        Ok(Cond { lhs, op, rhs })
    }

    fn term(&mut self) -> R<Term> {
        match self.peek() {
            Tok::Ident(_) => {
                let a = self.ident()?;
                if self.is_punct('.') {
                    self.bump();
                    let b = self.ident()?;
                    Ok(Term::Field(a, b))
                } else {
                    Ok(Term::Name(a))
                }
            }
            Tok::Int(_) | Tok::Str(_) => {
                let (v, p) = self.value()?;
                Ok(Term::Int(v, p))
            }
            _ => self.fail("a field, register, constant or value"),
        }
    }

    /// A statement; `serial { ... }` is taken as its statements (they run
    /// in order anyway).
    fn stmt(&mut self, out: &mut Vec<Stmt>) -> R<()> {
        if self.is_word("serial") && *self.peek2() == Tok::Punct('{') {
            self.bump();
            self.bump();
            while !self.is_punct('}') {
                if *self.peek() == Tok::Eof {
                    return self.fail("`}`");
                }
                self.stmt(out)?;
            }
            self.bump();
            return Ok(());
        }
        let name = self.ident()?;
        if self.is_punct('(') {
            self.bump();
            let mut args = Vec::new();
            while !self.is_punct(')') {
                args.push(self.term()?);
                if self.is_punct(',') {
                    self.bump();
                } else if !self.is_punct(')') {
                    return self.fail("`,` or `)`");
                }
            }
            self.bump();
            self.punct(';')?;
            out.push(Stmt::Call { name, args });
            return Ok(());
        }
        if !self.is_punct('=') {
            return self.fail("`(` or `=`");
        }
        self.bump();
        let expr = if self.is_word("max") || self.is_word("min") {
            let op = if self.is_word("max") {
                ArithOp::Max
            } else {
                ArithOp::Min
            };
            self.bump();
            self.punct('(')?;
            let a = self.term()?;
            self.punct(',')?;
            let b = self.term()?;
            self.punct(')')?;
            ExprAst::Binary(op, a, b)
        } else {
            let a = self.term()?;
            let op = match self.peek() {
                Tok::Punct('+') => Some(ArithOp::Add),
                Tok::Punct('-') => Some(ArithOp::Sub),
                Tok::Punct('*') => Some(ArithOp::Mul),
                Tok::Punct('/') => Some(ArithOp::Div),
                Tok::Punct('%') => Some(ArithOp::Mod),
                _ => None,
            };
            match op {
                Some(op) => {
                    self.bump();
                    ExprAst::Binary(op, a, self.term()?)
                }
                None => ExprAst::Term(a),
            }
        };
        self.punct(';')?;
        out.push(Stmt::Assign { target: name, expr });
        Ok(())
    }
}

/// "10.0.0.1" as a 32-bit integer, "aa:bb:cc:dd:ee:ff" as a 48-bit one.
pub fn address(s: &str) -> Option<u64> {
    let dotted: Vec<&str> = s.split('.').collect();
    if dotted.len() == 4 {
        return dotted.iter().try_fold(0u64, |v, p| {
            let b: u8 = p.parse().ok()?;
            Some(v << 8 | b as u64)
        });
    }
    let mac: Vec<&str> = s.split(':').collect();
    if mac.len() == 6 {
        return mac.iter().try_fold(0u64, |v, p| {
            (p.len() <= 2)
                .then(|| u8::from_str_radix(p, 16).ok())
                .flatten()
                .map(|b| v << 8 | b as u64)
        });
    }
    None
}
