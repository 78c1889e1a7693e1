//! XL tokens: identifiers (keywords are identifiers the parser knows),
//! decimal and hex integers, quoted strings (file names, and IPv4 or MAC
//! addresses as values), punctuation; `//` and `/* */` comments skipped.

use super::XlError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tok {
    Ident(String),
    Int(u64),
    Str(String),
    /// One of `{ } ( ) [ ] ; , . : = + - * / %`.
    Punct(char),
    /// `== != <= >= < >`.
    Cmp(&'static str),
    Eof,
}

#[derive(Clone, Debug)]
pub struct Token {
    pub tok: Tok,
    pub start: usize,
    pub end: usize,
}

pub fn lex(
    text: &str,
    err: &dyn Fn(usize, usize, String) -> XlError,
) -> Result<Vec<Token>, XlError> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if text[i..].starts_with("//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if text[i..].starts_with("/*") {
            match text[i + 2..].find("*/") {
                Some(n) => i += n + 4,
                None => return Err(err(start, start + 2, "this comment is never closed".into())),
            }
            continue;
        }
        let tok = if c.is_ascii_alphabetic() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            Tok::Ident(text[start..i].to_string())
        } else if c.is_ascii_digit() {
            let hex = text[i..].starts_with("0x") || text[i..].starts_with("0X");
            if hex {
                i += 2;
            }
            let digits = i;
            while i < b.len() && b[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let radix = if hex { 16 } else { 10 };
            match u64::from_str_radix(&text[digits..i], radix) {
                Ok(v) => Tok::Int(v),
                Err(_) => {
                    return Err(err(
                        start,
                        i,
                        format!("`{}` is not a 64-bit integer", &text[start..i]),
                    ))
                }
            }
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                i += 1;
            }
            if i >= b.len() || b[i] != b'"' {
                return Err(err(start, i, "this string is never closed".into()));
            }
            i += 1;
            Tok::Str(text[start + 1..i - 1].to_string())
        } else {
            let two = text.get(i..i + 2).unwrap_or("");
            let cmp = ["==", "!=", "<=", ">="].into_iter().find(|op| *op == two);
            if let Some(op) = cmp {
                i += 2;
                Tok::Cmp(op)
            } else if c == b'<' || c == b'>' {
                i += 1;
                Tok::Cmp(if c == b'<' { "<" } else { ">" })
            } else if b"{}()[];,.:=+-*/%".contains(&c) {
                i += 1;
                Tok::Punct(c as char)
            } else {
                let ch = text[i..].chars().next().unwrap_or('?');
                return Err(err(
                    start,
                    start + ch.len_utf8(),
                    format!("unexpected character `{ch}`"),
                ));
            }
        };
        out.push(Token { tok, start, end: i });
    }
    out.push(Token {
        tok: Tok::Eof,
        start: b.len(),
        end: b.len(),
    });
    Ok(out)
}
