//! Tokens, with the layout rule applied.
//!
//! Flick is indentation-structured: a line indented deeper than the one
//! before opens a block (`Indent`), a shallower one closes blocks (`Dedent`),
//! and every logical line ends with `Newline`. Inside brackets line breaks
//! and indentation are ignored, so long signatures may wrap freely.

use crate::ast::{Comment, TimeUnit};
use flick_span::{Diagnostic, Span};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    Ident(String),
    Int {
        value: u64,
        hex: bool,
        /// The text where it is not the canonical one (`ast::int_spelling`).
        spelling: Option<Box<str>>,
    },
    Str(String),
    // Keywords.
    Type,
    Proc,
    Fun,
    Grammar,
    Global,
    Local,
    Let,
    If,
    Else,
    On,
    Foldt,
    Ordering,
    By,
    As,
    And,
    Or,
    Not,
    Mod,
    True,
    False,
    None,
    /// `while`, `for`, `loop`: reserved so that they get a helpful error.
    Loop(&'static str),
    // Punctuation.
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Comma,
    Colon,
    Dot,
    Underscore,
    Bar,
    Assign, // :=
    Arrow,  // =>
    RArrow, // ->
    Eq,     // =
    Ne,     // <>
    Lt,
    Le,
    Gt,
    Ge,
    Plus,
    Minus,
    Star,
    Slash,
    Ellipsis, // ...
    /// `;`, `10s` and `10.0.0.1`: only inside a `machine`, which
    /// separates items with `;` and writes durations and IPv4 addresses.
    Semi,
    Duration(u64, TimeUnit),
    Ipv4([u8; 4]),
    Newline,
    Indent,
    Dedent,
    Eof,
}

impl Tok {
    /// How the token reads in an error message.
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Int { value, .. } => format!("`{value}`"),
            Tok::Duration(n, u) => format!("`{n}{}`", u.name()),
            Tok::Ipv4([a, b, c, d]) => format!("`{a}.{b}.{c}.{d}`"),
            Tok::Str(_) => "a string".into(),
            Tok::Newline => "end of line".into(),
            Tok::Indent => "an indented block".into(),
            Tok::Dedent => "end of block".into(),
            Tok::Eof => "end of file".into(),
            other => format!("`{}`", other.text()),
        }
    }

    pub(crate) fn text(&self) -> &'static str {
        match self {
            Tok::Type => "type",
            Tok::Proc => "proc",
            Tok::Fun => "fun",
            Tok::Grammar => "grammar",
            Tok::Global => "global",
            Tok::Local => "local",
            Tok::Let => "let",
            Tok::If => "if",
            Tok::Else => "else",
            Tok::On => "on",
            Tok::Foldt => "foldt",
            Tok::Ordering => "ordering",
            Tok::By => "by",
            Tok::As => "as",
            Tok::And => "and",
            Tok::Or => "or",
            Tok::Not => "not",
            Tok::Mod => "mod",
            Tok::True => "True",
            Tok::False => "False",
            Tok::None => "None",
            Tok::Loop(s) => s,
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::LBrace => "{",
            Tok::RBrace => "}",
            Tok::Comma => ",",
            Tok::Colon => ":",
            Tok::Dot => ".",
            Tok::Underscore => "_",
            Tok::Bar => "|",
            Tok::Assign => ":=",
            Tok::Arrow => "=>",
            Tok::RArrow => "->",
            Tok::Eq => "=",
            Tok::Ne => "<>",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
            Tok::Ellipsis => "...",
            Tok::Semi => ";",
            _ => "?",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Token {
    pub tok: Tok,
    pub span: Span,
}

/// Every reserved word (for editors' highlighting; `keyword` decides).
pub const KEYWORDS: &[&str] = &[
    "type", "proc", "fun", "grammar", "global", "local", "let", "if", "else", "on", "foldt",
    "ordering", "by", "as", "and", "or", "not", "mod", "True", "true", "False", "false", "None",
    "while", "for", "loop",
];

fn keyword(word: &str) -> Option<Tok> {
    Some(match word {
        "type" => Tok::Type,
        "proc" => Tok::Proc,
        "fun" => Tok::Fun,
        "grammar" => Tok::Grammar,
        "global" => Tok::Global,
        "local" => Tok::Local,
        "let" => Tok::Let,
        "if" => Tok::If,
        "else" => Tok::Else,
        "on" => Tok::On,
        "foldt" => Tok::Foldt,
        "ordering" => Tok::Ordering,
        "by" => Tok::By,
        "as" => Tok::As,
        "and" => Tok::And,
        "or" => Tok::Or,
        "not" => Tok::Not,
        "mod" => Tok::Mod,
        // The paper writes `True` in code and `false` in annotations.
        "True" | "true" => Tok::True,
        "False" | "false" => Tok::False,
        "None" => Tok::None,
        "while" => Tok::Loop("while"),
        "for" => Tok::Loop("for"),
        "loop" => Tok::Loop("loop"),
        _ => return None,
    })
}

/// Splits `src` into tokens. Lexical errors are reported and skipped, so
/// the parser always receives a well-formed layout (balanced indents).
pub fn lex(src: &str) -> (Vec<Token>, Vec<Comment>, Vec<Diagnostic>) {
    let mut lx = Lexer {
        src,
        bytes: src.as_bytes(),
        pos: 0,
        toks: Vec::new(),
        comments: Vec::new(),
        diags: Vec::new(),
        indents: vec![0],
        depth: 0,
        machine: false,
    };
    lx.run();
    (lx.toks, lx.comments, lx.diags)
}

struct Lexer<'a> {
    src: &'a str,
    bytes: &'a [u8],
    pos: usize,
    toks: Vec<Token>,
    comments: Vec<Comment>,
    diags: Vec<Diagnostic>,
    indents: Vec<usize>,
    /// Bracket nesting; layout is suspended while it is non-zero.
    depth: usize,
    /// Inside a `machine` item (from its line to the next line in the
    /// first column): `;`, `%`, durations and IPv4 addresses are tokens.
    machine: bool,
}

impl Lexer<'_> {
    fn push(&mut self, tok: Tok, start: usize) {
        self.toks.push(Token {
            tok,
            span: Span::new(start, self.pos),
        });
    }

    fn peek(&self, ahead: usize) -> u8 {
        self.bytes.get(self.pos + ahead).copied().unwrap_or(0)
    }

    fn run(&mut self) {
        let mut at_line_start = true;
        while self.pos < self.bytes.len() {
            if at_line_start && self.depth == 0 {
                if !self.layout() {
                    // A blank line: the next one starts a line too.
                    continue;
                }
                at_line_start = false;
            }
            let c = self.peek(0);
            let start = self.pos;
            match c {
                b'\n' => {
                    self.pos += 1;
                    if self.depth == 0 {
                        self.push(Tok::Newline, start);
                        at_line_start = true;
                    }
                }
                b' ' | b'\t' | b'\r' => self.pos += 1,
                b'#' => self.skip_comment(true),
                b'0'..=b'9' => self.number(),
                b'"' => self.string(),
                b'a'..=b'z' | b'A'..=b'Z' | b'_' => self.word(),
                _ => self.punct(),
            }
        }
        let end = self.bytes.len();
        if !matches!(self.toks.last().map(|t| &t.tok), None | Some(Tok::Newline)) {
            self.toks.push(Token {
                tok: Tok::Newline,
                span: Span::new(end, end),
            });
        }
        while self.indents.len() > 1 {
            self.indents.pop();
            self.toks.push(Token {
                tok: Tok::Dedent,
                span: Span::new(end, end),
            });
        }
        self.toks.push(Token {
            tok: Tok::Eof,
            span: Span::new(end, end),
        });
    }

    /// Measures the indentation of a line and emits `Indent`/`Dedent`.
    /// Returns false for blank and comment-only lines, which are skipped.
    fn layout(&mut self) -> bool {
        let start = self.pos;
        let mut width = 0;
        while matches!(self.peek(0), b' ' | b'\t') {
            if self.peek(0) == b'\t' {
                self.diags.push(
                    Diagnostic::error(
                        "E0003",
                        "tab in indentation",
                        Span::new(self.pos, self.pos + 1),
                    )
                    .hint("indent with spaces; Flick blocks are structured by indentation"),
                );
            }
            width += 1;
            self.pos += 1;
        }
        match self.peek(0) {
            b'\n' => {
                self.pos += 1;
                return false;
            }
            b'\r' if self.peek(1) == b'\n' => {
                self.pos += 2;
                return false;
            }
            b'#' => {
                self.skip_comment(false);
                if self.peek(0) == b'\n' {
                    self.pos += 1;
                }
                return false;
            }
            // The end of the text; a NUL byte in it is an unexpected
            // character, lexed like any other.
            0 if self.pos >= self.bytes.len() => return false,
            _ => {}
        }
        if width == 0 {
            let rest = &self.bytes[self.pos..];
            self.machine = rest.starts_with(b"machine")
                && !rest
                    .get(7)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_');
        }
        let here = Span::new(start, self.pos);
        let current = *self.indents.last().unwrap();
        if width > current {
            self.indents.push(width);
            self.toks.push(Token {
                tok: Tok::Indent,
                span: here,
            });
        } else if width < current {
            while width < *self.indents.last().unwrap() {
                self.indents.pop();
                self.toks.push(Token {
                    tok: Tok::Dedent,
                    span: here,
                });
            }
            if width != *self.indents.last().unwrap() {
                self.diags.push(
                    Diagnostic::error(
                        "E0004",
                        "this line's indentation matches no enclosing block",
                        here,
                    )
                    .hint("indent it exactly as far as the block it belongs to"),
                );
            }
        }
        true
    }

    fn skip_comment(&mut self, trailing: bool) {
        let start = self.pos;
        while self.pos < self.bytes.len() && self.peek(0) != b'\n' {
            self.pos += 1;
        }
        self.comments.push(Comment {
            span: Span::new(start, self.pos),
            text: self.src[start..self.pos].trim_end().to_string(),
            follows: self.toks.last().filter(|_| trailing).map(|t| t.span),
        });
    }

    /// In a machine: `10s`, `5ms`, `100us`, or `10.0.0.1`.
    fn machine_literal(&mut self) -> bool {
        let rest = &self.src[self.pos..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let word = rest[digits..]
            .bytes()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
            .count();
        let unit = match &rest[digits..digits + word] {
            "us" => Some(TimeUnit::Us),
            "ms" => Some(TimeUnit::Ms),
            "s" => Some(TimeUnit::S),
            _ => None,
        };
        let start = self.pos;
        if let (Some(unit), Ok(n)) = (unit, rest[..digits].parse::<u64>()) {
            self.pos += digits + word;
            self.push(Tok::Duration(n, unit), start);
            return true;
        }
        // Four dotted decimal bytes.
        let mut octets = [0u8; 4];
        let mut at = 0;
        for (i, o) in octets.iter_mut().enumerate() {
            if i > 0 {
                if rest.as_bytes().get(at) != Some(&b'.') {
                    return false;
                }
                at += 1;
            }
            let n = rest[at..].bytes().take_while(u8::is_ascii_digit).count();
            match rest[at..at + n].parse::<u8>() {
                Ok(v) if n > 0 => *o = v,
                _ => return false,
            }
            at += n;
        }
        if rest
            .as_bytes()
            .get(at)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'.')
        {
            return false;
        }
        self.pos += at;
        self.push(Tok::Ipv4(octets), start);
        true
    }

    fn number(&mut self) {
        if self.machine && self.machine_literal() {
            return;
        }
        let start = self.pos;
        let hex = self.peek(0) == b'0' && matches!(self.peek(1), b'x' | b'X');
        if hex {
            self.pos += 2;
        }
        let digits_start = self.pos;
        while self.peek(0).is_ascii_alphanumeric() || self.peek(0) == b'_' {
            self.pos += 1;
        }
        let digits: String = self.src[digits_start..self.pos]
            .chars()
            .filter(|c| *c != '_')
            .collect();
        let parsed = if hex {
            u64::from_str_radix(&digits, 16)
        } else {
            digits.parse::<u64>()
        };
        let (value, spelling) = match parsed {
            Ok(v) => (
                v,
                crate::ast::int_spelling(&self.src[start..self.pos], v, hex),
            ),
            Err(_) => {
                self.diags.push(
                    Diagnostic::error(
                        "E0002",
                        format!("`{}` is not a valid integer", &self.src[start..self.pos]),
                        Span::new(start, self.pos),
                    )
                    .hint("integers are decimal or 0x-prefixed hexadecimal and fit in 64 bits"),
                );
                (0, None)
            }
        };
        self.push(
            Tok::Int {
                value,
                hex,
                spelling,
            },
            start,
        );
    }

    fn string(&mut self) {
        let start = self.pos;
        self.pos += 1;
        let mut out = String::new();
        loop {
            match self.peek(0) {
                b'"' => {
                    self.pos += 1;
                    break;
                }
                0 | b'\n' if self.pos >= self.bytes.len() || self.peek(0) == b'\n' => {
                    self.diags.push(
                        Diagnostic::error(
                            "E0001",
                            "unterminated string",
                            Span::new(start, self.pos),
                        )
                        .hint("close the string with `\"` on the same line"),
                    );
                    // The rest of the line is lost: close the brackets it
                    // left open, so that the next lines are laid out again.
                    self.depth = 0;
                    break;
                }
                b'\\' => {
                    let esc_start = self.pos;
                    self.pos += 1;
                    let c = self.src[self.pos..].chars().next().unwrap_or('\0');
                    self.pos = (self.pos + c.len_utf8()).min(self.bytes.len());
                    match c {
                        'n' => out.push('\n'),
                        'r' => out.push('\r'),
                        't' => out.push('\t'),
                        '0' => out.push('\0'),
                        '\\' => out.push('\\'),
                        '"' => out.push('"'),
                        'x' => {
                            let hex = self.src.get(self.pos..self.pos + 2).unwrap_or("");
                            match u8::from_str_radix(hex, 16) {
                                Ok(b) if b < 0x80 => {
                                    out.push(b as char);
                                    self.pos += 2;
                                }
                                _ => self.bad_escape(esc_start),
                            }
                        }
                        _ => self.bad_escape(esc_start),
                    }
                }
                _ => {
                    let ch = self.src[self.pos..].chars().next().unwrap();
                    out.push(ch);
                    self.pos += ch.len_utf8();
                }
            }
        }
        self.push(Tok::Str(out), start);
    }

    fn bad_escape(&mut self, at: usize) {
        self.diags.push(
            Diagnostic::error("E0001", "unknown escape in string", Span::new(at, self.pos))
                .hint("the escapes are \\n \\r \\t \\0 \\\\ \\\" and \\xHH (below 0x80)"),
        );
    }

    fn word(&mut self) {
        let start = self.pos;
        while self.peek(0).is_ascii_alphanumeric() || self.peek(0) == b'_' {
            self.pos += 1;
        }
        let word = &self.src[start..self.pos];
        let tok = if word == "_" {
            Tok::Underscore
        } else {
            keyword(word).unwrap_or_else(|| Tok::Ident(word.to_string()))
        };
        self.push(tok, start);
    }

    fn punct(&mut self) {
        let start = self.pos;
        let c = self.peek(0);
        let n = self.peek(1);
        // Other languages' spellings of `=`, `<>`, `mod` and `not`: an
        // error that names Flick's, read as it so that parsing goes on.
        if self.machine && matches!(c, b';' | b'%') {
            self.pos += 1;
            self.push(if c == b';' { Tok::Semi } else { Tok::Mod }, start);
            return;
        }
        let other = match (c, n) {
            (b'=', b'=') => Some((Tok::Eq, 2, "use `=` for equality")),
            (b'!', b'=') => Some((Tok::Ne, 2, "use `<>` for inequality")),
            (b'%', _) => Some((
                Tok::Mod,
                1,
                "use `mod` for the remainder, as in `hash(k) mod n`",
            )),
            (b'!', _) => Some((Tok::Not, 1, "use `not` for negation")),
            _ => None,
        };
        if let Some((tok, len, hint)) = other {
            let text = &self.src[start..start + len];
            self.diags.push(
                Diagnostic::error(
                    "E0001",
                    format!("`{text}` is not an operator in Flick"),
                    Span::new(start, start + len),
                )
                .label(format!("`{text}`"))
                .hint(hint),
            );
            self.pos += len;
            self.push(tok, start);
            return;
        }
        let (tok, len) = match (c, n) {
            (b':', b'=') => (Tok::Assign, 2),
            (b'=', b'>') => (Tok::Arrow, 2),
            (b'-', b'>') => (Tok::RArrow, 2),
            (b'<', b'>') => (Tok::Ne, 2),
            (b'<', b'=') => (Tok::Le, 2),
            (b'>', b'=') => (Tok::Ge, 2),
            (b'.', b'.') if self.peek(2) == b'.' => (Tok::Ellipsis, 3),
            (b'(', _) => (Tok::LParen, 1),
            (b')', _) => (Tok::RParen, 1),
            (b'[', _) => (Tok::LBracket, 1),
            (b']', _) => (Tok::RBracket, 1),
            (b'{', _) => (Tok::LBrace, 1),
            (b'}', _) => (Tok::RBrace, 1),
            (b',', _) => (Tok::Comma, 1),
            (b':', _) => (Tok::Colon, 1),
            (b'.', _) => (Tok::Dot, 1),
            (b'|', _) => (Tok::Bar, 1),
            (b'=', _) => (Tok::Eq, 1),
            (b'<', _) => (Tok::Lt, 1),
            (b'>', _) => (Tok::Gt, 1),
            (b'+', _) => (Tok::Plus, 1),
            (b'-', _) => (Tok::Minus, 1),
            (b'*', _) => (Tok::Star, 1),
            (b'/', _) => (Tok::Slash, 1),
            _ => {
                let ch = self.src[self.pos..].chars().next().unwrap();
                self.pos += ch.len_utf8();
                self.diags.push(Diagnostic::error(
                    "E0001",
                    format!("unexpected character `{}`", ch.escape_debug()),
                    Span::new(start, self.pos),
                ));
                return;
            }
        };
        match tok {
            Tok::LParen | Tok::LBracket | Tok::LBrace => self.depth += 1,
            Tok::RParen | Tok::RBracket | Tok::RBrace => self.depth = self.depth.saturating_sub(1),
            _ => {}
        }
        self.pos += len;
        self.push(tok, start);
    }
}

#[cfg(test)]
mod keyword_list {
    #[test]
    fn keywords_lists_exactly_the_reserved_words() {
        for w in super::KEYWORDS {
            assert!(super::keyword(w).is_some(), "{w}");
        }
        // Words that are only names stay out of the list.
        for w in ["record", "elem", "ref", "hash"] {
            assert!(super::keyword(w).is_none() && !super::KEYWORDS.contains(&w));
        }
    }
}
