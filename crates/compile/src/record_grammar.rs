//! Annotated records as a wire grammar: a program without a `grammar` line
//! may describe its messages' layout in its records (Listing 1 of the
//! paper: `keylen : integer {signed=false, size=2}`, `key : string
//! {size=keylen}`, anonymous `_` fields). This module writes such records as
//! the source text of a `flick-wire` grammar, one unit per record, so that
//! `flick run` can parse and copy their messages like any grammar's.
//!
//! A record becomes a unit when every field has a wire layout:
//!
//! - an `integer` with an explicit `size=` is `uint8` … `uint64` (`int8` …
//!   `int64` when signed), big endian;
//! - a `string` or `bytes` with `size=EXPR` is `bytes &length = EXPR`, with
//!   the field's bound from the checker as `&max`; names of earlier fields
//!   become `self.NAME` and `mod` becomes `%`;
//! - a `list<T>` with `size=EXPR` (an element count) is `T[] &count = EXPR`
//!   when its elements have a layout;
//! - a field of a record type is a field of that record's unit, when that
//!   record has a layout too.
//!
//! Anonymous fields become anonymous grammar fields (`: bytes &length = 3;`):
//! they are read and carried but cannot be named, as in the program. Other
//! records (a `bool`, a string without `size`, an integer without `size`)
//! are left out, with the reason.

use flick_check::{CheckedProgram, Ty};
use flick_syntax::ast::{self, BinOp, Decl, ExprKind, TypeBody, TypeExpr, TypeKind, UnOp};
use std::collections::HashMap;
use std::fmt::Write;

/// The grammar written for a program's annotated records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordGrammar {
    /// Grammar source text for `flick_wire::Grammar::from_source`; empty
    /// when no record has a layout.
    pub source: String,
    /// The records that became units, in declaration order.
    pub units: Vec<String>,
    /// The records left out, each with why.
    pub skipped: Vec<(String, String)>,
}

impl RecordGrammar {
    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }
}

/// Names the grammar language reads as something other than a unit name.
const RESERVED_TYPES: &[&str] = &[
    "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "bytes", "string",
    "vint", "vlong", "ws",
];

/// Words a grammar field cannot be named.
const RESERVED_FIELDS: &[&str] = &["var", "switch", "self"];

/// Writes the records of `checked` (parsed from `program`) that have a
/// complete wire layout as grammar units. `name` heads the text as its
/// `grammar` line.
pub fn record_grammar(
    name: &str,
    program: &ast::Program,
    checked: &CheckedProgram,
) -> RecordGrammar {
    let mut w = Writer {
        checked,
        records: program
            .decls
            .iter()
            .filter_map(|d| match d {
                Decl::Type(t) => match &t.body {
                    TypeBody::Record(fields) => Some((t.name.name.as_str(), fields.as_slice())),
                    TypeBody::Alias(_) => None,
                },
                _ => None,
            })
            .collect(),
        aliases: program
            .decls
            .iter()
            .filter_map(|d| match d {
                Decl::Type(t) => match &t.body {
                    TypeBody::Alias(te) => Some((t.name.name.as_str(), te)),
                    TypeBody::Record(_) => None,
                },
                _ => None,
            })
            .collect(),
        done: HashMap::new(),
        visiting: Vec::new(),
    };
    let mut out = RecordGrammar::default();
    let mut units = String::new();
    for record in &checked.records {
        match w.unit(&record.name) {
            Ok(text) => {
                out.units.push(record.name.clone());
                units.push_str(&text);
            }
            Err(why) => out.skipped.push((record.name.clone(), why)),
        }
    }
    if !out.units.is_empty() {
        let mut src = String::new();
        let _ = writeln!(
            src,
            "# Written by flick from the annotated records of the program."
        );
        if is_ident(name) {
            let _ = writeln!(src, "grammar {name};");
        }
        src.push_str("%byteorder = big;\n");
        src.push_str(&units);
        out.source = src;
    }
    out
}

struct Writer<'a> {
    checked: &'a CheckedProgram,
    /// The fields of each record as written.
    records: HashMap<&'a str, &'a [ast::Field]>,
    /// Named type expressions (`type key: string {max=250}`).
    aliases: HashMap<&'a str, &'a TypeExpr>,
    /// Each record's unit text, or why it has none.
    done: HashMap<String, Result<String, String>>,
    visiting: Vec<String>,
}

impl<'a> Writer<'a> {
    /// The unit of record `name`, or why it has none.
    fn unit(&mut self, name: &str) -> Result<String, String> {
        if let Some(r) = self.done.get(name) {
            return r.clone();
        }
        if self.visiting.iter().any(|v| v == name) {
            return Err(format!("record `{name}` contains itself"));
        }
        self.visiting.push(name.to_string());
        let r = self.write_unit(name);
        self.visiting.pop();
        self.done.insert(name.to_string(), r.clone());
        r
    }

    fn write_unit(&mut self, name: &str) -> Result<String, String> {
        if !is_ident(name) || RESERVED_TYPES.contains(&name) {
            return Err(format!("`{name}` cannot name a grammar unit"));
        }
        let checked = self.checked;
        let record = checked
            .record(name)
            .ok_or_else(|| format!("record `{name}` did not check"))?;
        let written = *self
            .records
            .get(name)
            .ok_or_else(|| format!("record `{name}` is not declared"))?;
        if written.len() != record.fields.len() {
            return Err(format!("record `{name}` did not check"));
        }
        let mut text = format!("type {name} = unit {{\n");
        for (field, decl) in record.fields.iter().zip(written) {
            let label = field.name.as_deref().unwrap_or("_");
            if let Some(n) = &field.name {
                if !is_ident(n) || RESERVED_FIELDS.contains(&n.as_str()) {
                    return Err(format!("field `{n}` cannot name a grammar field"));
                }
            }
            let te = self.resolve(&decl.ty);
            let ty = self
                .field_type(te, &field.ty, field.size.as_ref())
                .map_err(|why| format!("field `{label}` {why}"))?;
            match &field.name {
                Some(n) => writeln!(text, "    {n} : {ty};"),
                None => writeln!(text, "    : {ty};"),
            }
            .expect("writing to a String");
        }
        text.push_str("};\n");
        Ok(text)
    }

    /// A type written as the name of an alias stands for the alias's type.
    fn resolve(&self, te: &'a TypeExpr) -> &'a TypeExpr {
        let mut te = te;
        // The checker rejects aliases defined in terms of themselves; the
        // limit only keeps this loop finite on an unchecked tree.
        for _ in 0..64 {
            let TypeKind::Named(n) = &te.kind else {
                break;
            };
            match self.aliases.get(n.name.as_str()) {
                Some(alias) => te = alias,
                None => break,
            }
        }
        te
    }

    /// The grammar type and attributes of one field.
    fn field_type(
        &mut self,
        te: &'a TypeExpr,
        ty: &Ty,
        size: Option<&ast::Expr>,
    ) -> Result<String, String> {
        let size = size.or_else(|| annotation(te, "size"));
        match ty {
            Ty::Int { .. } => self.scalar(te, ty),
            Ty::Str { max } | Ty::Bytes { max } => {
                let size = size.ok_or("has no `size`")?;
                Ok(format!("bytes &length = {} &max = {max}", expr(size)?))
            }
            Ty::List(elem, max) => {
                let size = size.ok_or("is a list without `size`")?;
                let TypeKind::List(elem_te) = &te.kind else {
                    return Err("is a list of a type the grammar cannot express".into());
                };
                let elem_te = self.resolve(elem_te);
                let elem = match &**elem {
                    Ty::Record(_, r) => {
                        self.unit(r).map_err(|why| {
                            format!("is a list of `{r}`, which has no layout: {why}")
                        })?;
                        r.clone()
                    }
                    Ty::Int { .. } => self.scalar(elem_te, elem)?,
                    other => return Err(format!("is a list of `{other}`")),
                };
                Ok(format!("{elem}[] &count = {} &max = {max}", expr(size)?))
            }
            Ty::Record(_, r) => {
                self.unit(r)
                    .map_err(|why| format!("is a `{r}`, which has no layout: {why}"))?;
                Ok(r.clone())
            }
            other => Err(format!("is `{other}`, which has no wire layout")),
        }
    }

    /// A binary integer: its width must be written (`size=`).
    fn scalar(&self, te: &TypeExpr, ty: &Ty) -> Result<String, String> {
        let Ty::Int { signed, bytes } = ty else {
            return Err(format!("is `{ty}`, which has no wire layout"));
        };
        if annotation(te, "size").is_none() {
            return Err("is an integer without `size`".into());
        }
        let bits = u32::from(*bytes) * 8;
        Ok(format!("{}int{bits}", if *signed { "" } else { "u" }))
    }
}

fn annotation<'t>(te: &'t TypeExpr, name: &str) -> Option<&'t ast::Expr> {
    te.annotations
        .iter()
        .find(|a| a.name.name == name)
        .map(|a| &a.value)
}

/// A size expression in the grammar's notation. Binary operations are
/// parenthesised, so the grammar's precedences never matter.
fn expr(e: &ast::Expr) -> Result<String, String> {
    Ok(match &e.kind {
        ExprKind::Int { value, .. } => value.to_string(),
        ExprKind::Var(v) if is_ident(&v.name) => format!("self.{}", v.name),
        ExprKind::Unary(UnOp::Neg, e) => format!("-{}", expr(e)?),
        ExprKind::Binary(op, a, b) => {
            let op = match op {
                BinOp::Add => "+",
                BinOp::Sub => "-",
                BinOp::Mul => "*",
                BinOp::Div => "/",
                BinOp::Mod => "%",
                _ => return Err("has a size the grammar cannot express".into()),
            };
            format!("({} {op} {})", expr(a)?, expr(b)?)
        }
        _ => return Err("has a size the grammar cannot express".into()),
    })
}

fn is_ident(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use flick_wire::{Grammar, Progress};
    use std::sync::Arc;

    const CACHE_ROUTER: &str = include_str!("../../../examples/memcached_cache_router.flick");

    fn compile(src: &str) -> RecordGrammar {
        let (program, diags) = flick_syntax::parse(src);
        assert!(diags.is_empty(), "{diags:?}");
        let (checked, diags) = flick_check::check(&program);
        assert!(diags.is_empty(), "{diags:?}");
        record_grammar("test", &program, &checked)
    }

    fn load(g: &RecordGrammar) -> Arc<Grammar> {
        Arc::new(Grammar::from_source("test", &g.source).unwrap_or_else(|e| {
            panic!("{e}\n{}", g.source);
        }))
    }

    /// A binary-protocol header and body.
    fn message(magic: u8, op: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
        let body = extras.len() + key.len() + value.len();
        let mut m = vec![magic, op];
        m.extend_from_slice(&(key.len() as u16).to_be_bytes());
        m.push(extras.len() as u8);
        m.extend_from_slice(&[0, 0, 0]);
        m.extend_from_slice(&(body as u32).to_be_bytes());
        m.extend_from_slice(&0xdead_beef_u32.to_be_bytes()); // opaque
        m.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 7]); // cas
        m.extend_from_slice(extras);
        m.extend_from_slice(key);
        m.extend_from_slice(value);
        m
    }

    #[test]
    fn the_cache_router_record_is_the_binary_header() {
        let g = compile(CACHE_ROUTER);
        assert_eq!(g.units, ["cmd"]);
        assert!(g.skipped.is_empty(), "{:?}", g.skipped);
        let expected = "\
type cmd = unit {
    : bytes &length = 1 &max = 1;
    opcode : uint8;
    keylen : uint16;
    extraslen : uint8;
    : bytes &length = 3 &max = 3;
    bodylen : uint32;
    : bytes &length = (12 + self.extraslen) &max = 267;
    key : bytes &length = self.keylen &max = 65535;
    : bytes &length = ((self.bodylen - self.extraslen) - self.keylen) &max = 1048576;
};
";
        assert!(g.source.ends_with(expected), "{}", g.source);
        let grammar = load(&g);
        let unit = grammar.unit_id("cmd").unwrap();
        let names: Vec<&str> = grammar
            .unit(unit)
            .fields
            .iter()
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(names, ["opcode", "keylen", "extraslen", "bodylen", "key"]);
    }

    #[test]
    fn the_generated_grammar_parses_getk_requests_and_responses() {
        let grammar = load(&compile(CACHE_ROUTER));
        let unit = grammar.unit_id("cmd").unwrap();
        let request = message(0x80, 0x0c, b"", b"greeting", b"");
        let response = message(0x81, 0x0c, &[0, 0, 0, 5], b"greeting", b"hello, world");
        for (bytes, extras) in [(&request, 0), (&response, 4)] {
            // Followed by the first bytes of the next message.
            let mut buf = bytes.clone();
            buf.extend_from_slice(&request[..10]);
            let mut p = grammar.parser(unit);
            // Every split of the input gives the same message.
            for cut in 0..bytes.len() {
                p.reset();
                assert_eq!(p.parse(&buf[..cut]).unwrap(), Progress::NeedMore);
            }
            p.reset();
            assert_eq!(p.parse(&buf).unwrap(), Progress::Done(bytes.len()));
            let m = p.message(&buf);
            assert_eq!(m.int("opcode"), Some(0x0c));
            assert_eq!(m.int("keylen"), Some(8));
            assert_eq!(m.int("extraslen"), Some(extras));
            assert_eq!(m.bytes("key"), Some(&b"greeting"[..]));
            assert_eq!(m.int("bodylen"), Some(bytes.len() as i128 - 24));
        }
    }

    #[test]
    fn a_body_shorter_than_key_and_extras_is_refused() {
        let grammar = load(&compile(CACHE_ROUTER));
        let mut bad = message(0x80, 0x0c, b"", b"greeting", b"");
        bad[8..12].copy_from_slice(&2u32.to_be_bytes());
        let mut p = grammar.parser(grammar.unit_id("cmd").unwrap());
        assert!(p.parse(&bad).is_err());
    }

    #[test]
    fn records_without_a_complete_layout_are_left_out() {
        let g = compile(
            "type hdr: record
  len : integer {size=2, signed=false}
  tag : integer {size=1}
  body : bytes {size=len mod 7}
type pair: record
  h : hdr
  n : integer {size=1, signed=false}
  parts : list<hdr> {size=n}
  counts : list<integer {size=4, signed=false}> {size=2, max=2}
type k: string {size=4}
type keyed: record
  key : k
type loose: record
  key : string
type wide: record
  n : integer
type flag: record
  b : bool
type outer: record
  inner : loose
",
        );
        assert_eq!(g.units, ["hdr", "pair", "keyed"]);
        let skipped: Vec<&str> = g.skipped.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(skipped, ["loose", "wide", "flag", "outer"]);
        assert!(g.skipped[3].1.contains("`loose`"), "{:?}", g.skipped);
        assert!(g.source.contains("tag : int8;"), "{}", g.source);
        assert!(g.source.contains("body : bytes &length = (self.len % 7)"));
        // The checker caps a list's count at 64 elements by default.
        assert!(g
            .source
            .contains("parts : hdr[] &count = self.n &max = 64;"));
        assert!(g.source.contains("counts : uint32[] &count = 2 &max = 2;"));
        assert!(g.source.contains("key : bytes &length = 4 &max = 4;"));
        let grammar = load(&g);
        let pair = grammar.unit_id("pair").unwrap();
        // hdr { len 3, tag -1, body "abc" }, n 1, one hdr, two counts.
        let mut bytes = vec![0, 3, 0xff, b'a', b'b', b'c', 1];
        bytes.extend_from_slice(&[0, 1, 5, b'z']);
        bytes.extend_from_slice(&[0, 0, 0, 9, 0, 0, 0, 10]);
        let mut p = grammar.parser(pair);
        assert_eq!(p.parse(&bytes).unwrap(), Progress::Done(bytes.len()));
        assert_eq!(p.message(&bytes).int("n"), Some(1));
    }

    #[test]
    fn no_record_with_a_layout_gives_no_grammar() {
        let g = compile("type kv: record\n  key : string\n  value : integer\n");
        assert!(g.is_empty());
        assert!(g.source.is_empty());
        assert_eq!(g.skipped.len(), 1);
    }
}
