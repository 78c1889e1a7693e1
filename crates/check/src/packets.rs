//! The built-ins of packet programs: `pack` (a dictionary key of several
//! values), `frame_len` (a message's length in bytes), `broadcast` (a value
//! to every channel of an array), `in_prefix` (an IPv4 address within a
//! CIDR prefix), `min`, `max` and `log` (a rate-limited line in the
//! service's log): their types, bounds and cost.
//!
//! Meters and Bloom filters are packet state of fixed size: the types
//! `meter {rate=R, burst=B, excess=E}` and `bloom {bits=N, hashes=K}` (a
//! state variable's type must give all but `excess`; a parameter's may
//! leave them out), a dictionary of meters, and the built-ins `meter(m, n)`,
//! `meter(ms, key, n)` (the colour: 0 green, 1 yellow, 2 red), `bloom_add(b, key)`,
//! `bloom_has(b, key)` and `bloom_clear(b)`, whose first argument names the
//! state variable (or a `ref` parameter given one). A program that does
//! not say `grammar packet` has none of them (E0802): a TCP service keeps
//! no such state.
//!
//! None of them fails at run time on `None` (a header the packet lacks):
//! `pack` packs it as a part of its own, `in_prefix` is `False`, `min` and
//! `max` give `None`.

use crate::checker::{BindKind, Checker};
use crate::strings::{max_of, StringCost};
use crate::types::{Ty, BLOOM_MAX_BITS, BLOOM_MAX_HASHES};
use flick_span::{Diagnostic, Span};
use flick_syntax::ast::*;
use flick_syntax::format_expr;

/// The most values `pack` packs.
pub const PACK_MAX_ARGS: usize = 8;

/// Bytes `pack` writes for one part: a tag byte, then 8 bytes for an
/// integer, 1 for a `bool`, or a 4-byte length and the bytes.
pub const PACK_TAG: u64 = 1;
pub const PACK_INT: u64 = 8;
pub const PACK_BOOL: u64 = 1;
pub const PACK_LEN: u64 = 4;

/// The most bytes `pack` writes for a part of type `t`.
fn pack_part(t: &Ty) -> u64 {
    PACK_TAG
        + match t.behind_refs() {
            Ty::Int { .. } => PACK_INT,
            Ty::Bool => PACK_BOOL,
            t => max_of(t).map_or(0, |m| PACK_LEN.saturating_add(m)),
        }
}

/// A CIDR prefix `A.B.C.D/N`: the network address (host bits cleared)
/// and the mask, or why it is not one.
pub fn parse_cidr(s: &str) -> Result<(u32, u32), &'static str> {
    let (addr, len) = s.split_once('/').ok_or("no `/` and prefix length")?;
    let len: u32 = match len.parse() {
        Ok(n) if n <= 32 && !len.starts_with('+') => n,
        _ => return Err("the prefix length is not a number from 0 to 32"),
    };
    let mut octets = addr.split('.');
    let mut ip: u32 = 0;
    for _ in 0..4 {
        let o = octets.next().ok_or("the address has fewer than 4 parts")?;
        if o.is_empty() || o.len() > 3 || !o.bytes().all(|b| b.is_ascii_digit()) {
            return Err("a part of the address is not a number from 0 to 255");
        }
        let o: u32 = o
            .parse()
            .map_err(|_| "a part of the address is not a number")?;
        if o > 255 {
            return Err("a part of the address is above 255");
        }
        ip = ip << 8 | o;
    }
    if octets.next().is_some() {
        return Err("the address has more than 4 parts");
    }
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    Ok((ip & mask, mask))
}

/// Whether `e` calls `in_prefix` with parameter `param` as its prefix.
fn prefix_of_param(e: &Expr, param: &str) -> bool {
    let any = |es: &[Expr]| es.iter().any(|x| prefix_of_param(x, param));
    match &e.kind {
        ExprKind::Call(f, args) => {
            let direct = f.name == "in_prefix"
                && matches!(args.get(1).map(|a| &a.kind), Some(ExprKind::Var(v)) if v.name == param);
            direct || any(args)
        }
        ExprKind::Unary(_, x) | ExprKind::Field(x, _) => prefix_of_param(x, param),
        ExprKind::Binary(_, a, b) | ExprKind::Index(a, b) => {
            prefix_of_param(a, param) || prefix_of_param(b, param)
        }
        ExprKind::Tuple(es) | ExprKind::List(es) => any(es),
        _ => false,
    }
}

fn block_prefix_of_param(b: &Block, param: &str) -> bool {
    b.stmts.iter().any(|s| match &s.kind {
        StmtKind::Let { value, .. } | StmtKind::Expr(value) => prefix_of_param(value, param),
        StmtKind::Assign { place, value }
        | StmtKind::Send {
            value,
            channel: place,
        } => prefix_of_param(place, param) || prefix_of_param(value, param),
        StmtKind::If {
            cond,
            then,
            otherwise,
        } => {
            prefix_of_param(cond, param)
                || block_prefix_of_param(then, param)
                || otherwise
                    .as_ref()
                    .is_some_and(|o| block_prefix_of_param(o, param))
        }
    })
}

impl Checker<'_> {
    /// `meter {rate=R, burst=B}` or `bloom {bits=N, hashes=K}`, its
    /// parameters checked (missing ones are 0, refused for state in
    /// `bounds.rs`); `None` for any other name.
    pub(crate) fn object_type(&mut self, te: &TypeExpr, name: &str) -> Option<Ty> {
        let param = |this: &mut Self, n: &str, lo: u64, hi: u64| -> u64 {
            let Some(a) = te.annotations.iter().find(|a| a.name.name == n) else {
                return 0;
            };
            let at = a.value.span;
            // Not a constant is reported by `const_value`.
            let Some(v) = this.const_value(&a.value) else {
                return 0;
            };
            if v < lo as i128 || v > hi as i128 {
                let range = if hi >= u64::MAX / 2 {
                    format!("at least {lo}")
                } else {
                    format!("from {lo} to {hi}")
                };
                this.diags.push(
                    Diagnostic::error("E0503", format!("`{n}` of a {name} is {range}"), at)
                        .label("not a number in range")
                        .hint(format!("write a constant, as in `{n}={}`", lo.max(1))),
                );
                return 0;
            }
            v as u64
        };
        match name {
            "meter" => self.packet_state_uses.push((te.span, "a meter".into())),
            "bloom" => self
                .packet_state_uses
                .push((te.span, "a Bloom filter".into())),
            _ => {}
        }
        match name {
            "meter" => Some(Ty::Meter {
                rate: param(self, "rate", 1, u64::MAX / 2),
                burst: param(self, "burst", 1, u64::MAX / 2),
                excess: param(self, "excess", 1, u64::MAX / 2),
            }),
            "bloom" => Some(Ty::Bloom {
                bits: param(self, "bits", 64, BLOOM_MAX_BITS),
                hashes: param(self, "hashes", 1, BLOOM_MAX_HASHES),
            }),
            _ => None,
        }
    }

    /// `meter(m, n)`, `meter(ms, key, n)`, `bloom_add(b, key)`,
    /// `bloom_has(b, key)`, `bloom_clear(b)`.
    fn object_builtin(&mut self, f: &Ident, args: &[Expr], span: Span) -> Ty {
        let name = f.name.as_str();
        self.packet_state_uses.push((f.span, format!("`{name}`")));
        let result = match name {
            "meter" => Ty::int(),
            "bloom_has" => Ty::Bool,
            _ => Ty::unit(),
        };
        let arities: &[usize] = match name {
            "meter" => &[2, 3],
            "bloom_clear" => &[1],
            _ => &[2],
        };
        if !arities.contains(&args.len()) {
            let want = arities[arities.len() - 1];
            self.arity(f, want, args.len(), span, "");
            args.iter().for_each(|a| drop(self.expr(a)));
            return result;
        }
        let target = &args[0];
        let t = self.expr(target);
        let r = self.uni.resolve(&t);
        let is_state = match &target.kind {
            ExprKind::Var(v) => matches!(
                self.lookup(&v.name).map(|b| &b.kind),
                Some(BindKind::State(_) | BindKind::RefParam)
            ),
            _ => false,
        };
        let (want, example) = match (name, args.len()) {
            ("meter", 2) => ("a meter", "`global m: meter {rate=125000, burst=3000} := new_meter`"),
            ("meter", _) => (
                "a dictionary of meters",
                "`global ms: dict<string {max=21}*meter {rate=125000, burst=3000}> {capacity=1024} := empty_dict`",
            ),
            _ => ("a Bloom filter", "`global seen: bloom {bits=65536, hashes=3} := new_bloom`"),
        };
        let key_ty = match (name, args.len(), r.behind_refs()) {
            (_, _, Ty::Error | Ty::Var(_)) => Some(None),
            ("meter", 2, Ty::Meter { .. }) => Some(None),
            ("meter", 3, Ty::Dict(k, v, _)) if matches!(v.behind_refs(), Ty::Meter { .. }) => {
                Some(Some((**k).clone()))
            }
            ("bloom_add" | "bloom_has" | "bloom_clear", _, Ty::Bloom { .. }) => Some(None),
            _ => None,
        };
        if key_ty.is_none() {
            self.diags.push(
                Diagnostic::error(
                    "E0203",
                    format!("`{name}` works on {want}, not `{r}`"),
                    target.span,
                )
                .label(format!("this is `{r}`"))
                .hint(format!("declare it in process state, as in {example}")),
            );
        } else if !is_state && !matches!(r, Ty::Error) {
            self.diags.push(
                Diagnostic::error(
                    "E0203",
                    format!("`{name}` needs {want} kept in process state"),
                    target.span,
                )
                .label("not a state variable or `ref` parameter")
                .hint("name a `global` here, or a `ref` parameter the caller gives one"),
            );
        }
        let key = match (name, args.len()) {
            ("meter", 3) | ("bloom_add" | "bloom_has", 2) => Some(&args[1]),
            _ => None,
        };
        if let Some(key) = key {
            let kt = self.expr(key);
            let kr = self.uni.resolve(&kt);
            match key_ty.flatten() {
                Some(k) => {
                    let what = format!("the key of `{}`", format_expr(target, 0, 0));
                    self.expect_ty(&kt, &k, key.span, &what);
                }
                None if !matches!(
                    kr.behind_refs(),
                    Ty::Int { .. }
                        | Ty::Str { .. }
                        | Ty::Bytes { .. }
                        | Ty::Bool
                        | Ty::Error
                        | Ty::Var(_)
                ) =>
                {
                    self.diags.push(
                        Diagnostic::error(
                            "E0203",
                            format!("`{name}` takes an integer, string or bytes key, not `{kr}`"),
                            key.span,
                        )
                        .label(format!("this is `{kr}`"))
                        .hint("make a key of several values with `pack`"),
                    );
                }
                None => {}
            }
        }
        if name == "meter" {
            let n = &args[args.len() - 1];
            let nt = self.expr(n);
            self.operand(&nt, &Ty::int(), n.span, "`meter`");
        }
        result
    }

    /// Meters and Bloom filters live in a packet worker's shard of the
    /// state; a TCP service has none to give them, so a program that
    /// does not say `grammar packet` is refused here rather than fault
    /// at its first call. One diagnostic names every place, since one
    /// change (the grammar, or taking them out) answers them all.
    pub(crate) fn packet_state_outside_packet_programs(&mut self) {
        if self.out.grammar.as_deref() == Some("packet") || self.packet_state_uses.is_empty() {
            return;
        }
        let mut uses = std::mem::take(&mut self.packet_state_uses);
        uses.sort_by_key(|(at, _)| (at.start, at.end));
        uses.dedup_by_key(|(at, _)| *at);
        let (first, what) = uses[0].clone();
        let label = match &self.out.grammar {
            Some(g) => format!("{what} in a `grammar {g}` program"),
            None => format!("{what} in a program without `grammar packet`"),
        };
        let mut d = Diagnostic::error(
            "E0802",
            "meters and Bloom filters are for packet programs only",
            first,
        )
        .label(label);
        for (at, what) in &uses[1..] {
            d = d.also(*at, format!("{what} too"));
        }
        if self.out.grammar.is_some() {
            d = d.also(self.out.grammar_span, "a TCP service's grammar");
        }
        self.diags.push(d.hint(
            "meters and Bloom filters are packet state, kept by each packet worker: a program with them says `grammar packet` and runs over packet ports (`flick run --port`); a TCP service has none (docs/packets.md)",
        ));
    }

    pub(crate) fn packet_builtin(&mut self, f: &Ident, args: &[Expr], span: Span) -> Ty {
        let name = f.name.as_str();
        if name == "pack" {
            return self.pack(f, args, span);
        }
        if crate::builtins::OBJECT_BUILTINS.contains(&name) {
            return self.object_builtin(f, args, span);
        }
        let n = if matches!(name, "frame_len" | "log") {
            1
        } else {
            2
        };
        if !self.arity(f, n, args.len(), span, "") {
            args.iter().for_each(|a| drop(self.expr(a)));
            return match name {
                "in_prefix" => Ty::Bool,
                n if n == "broadcast"
                    || n == "log"
                    || crate::builtins::HEADER_EDITS.contains(&n) =>
                {
                    Ty::unit()
                }
                _ => Ty::int(),
            };
        }
        match name {
            n if crate::builtins::HEADER_EDITS.contains(&n) => {
                let t = self.expr(&args[0]);
                let r = self.uni.resolve(&t);
                if !matches!(r.behind_refs(), Ty::Record(..) | Ty::Error | Ty::Var(_)) {
                    self.diags.push(
                        Diagnostic::error(
                            "E0203",
                            format!("`{n}` edits the packet a rule is handling, not `{r}`"),
                            args[0].span,
                        )
                        .label(format!("this is `{r}`"))
                        .hint(format!("give it the packet, as in `{n}(p, ...)`")),
                    );
                }
                let v = self.expr(&args[1]);
                self.operand(&v, &Ty::int(), args[1].span, &format!("`{n}`"));
                Ty::unit()
            }
            "frame_len" => {
                let t = self.expr(&args[0]);
                let r = self.uni.resolve(&t);
                if !matches!(r.behind_refs(), Ty::Record(..) | Ty::Error | Ty::Var(_)) {
                    self.diags.push(
                        Diagnostic::error(
                            "E0203",
                            format!("`frame_len` measures a message, not `{r}`"),
                            args[0].span,
                        )
                        .label(format!("this is `{r}`"))
                        .hint("give it the record a rule received, as in `frame_len(p)`"),
                    );
                }
                Ty::Int {
                    signed: false,
                    bytes: 8,
                }
            }
            "log" => {
                let t = self.expr(&args[0]);
                let r = self.uni.resolve(&t);
                if !matches!(
                    r.behind_refs(),
                    Ty::Str { .. } | Ty::Bytes { .. } | Ty::Error | Ty::Var(_)
                ) {
                    self.diags.push(
                        Diagnostic::error(
                            "E0203",
                            format!("`log` writes a string, not `{r}`"),
                            args[0].span,
                        )
                        .label(format!("this is `{r}`"))
                        .hint("make an integer a string with `to_string`"),
                    );
                }
                Ty::unit()
            }
            "min" | "max" => {
                for a in args {
                    let t = self.expr(a);
                    self.operand(&t, &Ty::int(), a.span, &format!("`{name}`"));
                }
                Ty::int()
            }
            "in_prefix" => {
                let t = self.expr(&args[0]);
                self.operand(&t, &Ty::int(), args[0].span, "`in_prefix`");
                let p = self.expr(&args[1]);
                self.expect_ty(
                    &p,
                    &Ty::Str { max: 18 },
                    args[1].span,
                    "the prefix given to `in_prefix`",
                );
                if let ExprKind::Str(s) = &args[1].kind {
                    self.cidr_constant(s, args[1].span);
                }
                Ty::Bool
            }
            "broadcast" => {
                let v = self.expr(&args[0]);
                let c = self.expr(&args[1]);
                match self.uni.resolve(&c).behind_refs() {
                    Ty::ChanArray(ch, _) => match &ch.output {
                        Some(out) => {
                            let out = (**out).clone();
                            self.expect_ty(
                                &v,
                                &out,
                                args[0].span,
                                &format!("value broadcast on `[{ch}]`"),
                            );
                        }
                        None => self.diags.push(
                            Diagnostic::error(
                                "E0302",
                                "cannot write to read-only channels",
                                args[1].span,
                            )
                            .label(format!("this is `[{ch}]`: nothing can be written to it"))
                            .hint("declare an output type, as in `[-/packet] outs`"),
                        ),
                    },
                    Ty::Error => {}
                    other => self.diags.push(
                        Diagnostic::error(
                            "E0303",
                            format!(
                                "`broadcast` sends to every channel of an array, not `{other}`"
                            ),
                            args[1].span,
                        )
                        .label(format!("this is `{other}`"))
                        .hint("to send to one channel, write `value => chan`"),
                    ),
                }
                Ty::unit()
            }
            _ => unreachable!("every packet built-in is handled"),
        }
    }

    /// `pack(a, ...)`: 1 to 8 integers, `bool`s, strings or bytes, packed
    /// into one string.
    fn pack(&mut self, f: &Ident, args: &[Expr], span: Span) -> Ty {
        if args.is_empty() || args.len() > PACK_MAX_ARGS {
            self.diags.push(
                Diagnostic::error(
                    "E0202",
                    format!(
                        "`pack` takes 1 to {PACK_MAX_ARGS} arguments, but {} were given",
                        args.len()
                    ),
                    span,
                )
                .label(format!("{} given", args.len())),
            );
        }
        let mut max: u64 = 0;
        for a in args {
            let t = self.expr(a);
            let r = self.uni.resolve(&t);
            let part = match r.behind_refs() {
                t @ (Ty::Int { .. } | Ty::Bool | Ty::Str { .. } | Ty::Bytes { .. }) => pack_part(t),
                Ty::Error | Ty::Var(_) => 0,
                other => {
                    self.diags.push(
                        Diagnostic::error(
                            "E0203",
                            format!(
                                "`{}` packs integers, booleans, strings and bytes, not `{other}`",
                                f.name
                            ),
                            a.span,
                        )
                        .label(format!("this is `{other}`")),
                    );
                    0
                }
            };
            max = max.saturating_add(part);
        }
        Ty::Str { max }
    }

    /// A constant CIDR prefix that does not parse is an error here, not a
    /// `False` at run time.
    fn cidr_constant(&mut self, s: &str, span: Span) {
        if let Err(why) = parse_cidr(s) {
            self.diags.push(
                Diagnostic::error("E0210", format!("`{s}` is not an IPv4 prefix: {why}"), span)
                    .label("not `A.B.C.D/N`")
                    .hint("write an IPv4 prefix as in \"10.0.0.0/8\" or \"192.168.1.7/32\""),
            );
        }
    }

    /// Constant prefixes given to a function that hands a parameter to
    /// `in_prefix` (`has_addr(p, "10.0.0.0/8")`) are checked at the call.
    pub(crate) fn prefix_arguments(&mut self, id: usize, args: &[Expr]) {
        let decl = self.fun_decls[id];
        for (param, a) in decl.params.iter().zip(args) {
            if let ExprKind::Str(s) = &a.kind {
                if block_prefix_of_param(&decl.body, &param.name.name) {
                    self.cidr_constant(s, a.span);
                }
            }
        }
    }

    /// The cost of one call of packet built-in `f`: operations, and bytes
    /// `pack` adds to the interpreter's scratch buffer.
    pub(crate) fn packet_cost(&self, f: &str, args: &[Expr]) -> StringCost {
        match f {
            "pack" => {
                let n = args
                    .iter()
                    .filter_map(|a| self.out.expr_types.get(&a.span))
                    .fold(0u64, |n, t| n.saturating_add(pack_part(t)));
                StringCost { ops: n, scratch: n }
            }
            // Parsing the prefix (at most 18 bytes) and a comparison.
            "in_prefix" => StringCost {
                ops: 18,
                scratch: 0,
            },
            // Copying at most `LOG_LINE_MAX` (256) bytes of the message.
            "log" => StringCost {
                ops: 256,
                scratch: 0,
            },
            // Finding the header and adjusting two checksums.
            n if crate::builtins::HEADER_EDITS.contains(&n) => StringCost { ops: 8, scratch: 0 },
            // Hashing the key (its bytes) and one bit per hash, or the
            // bucket's arithmetic; clearing touches every word.
            "bloom_add" | "bloom_has" => StringCost {
                ops: 16 + crate::types::BLOOM_MAX_HASHES,
                scratch: 0,
            },
            "bloom_clear" => {
                let bits = match args
                    .first()
                    .and_then(|a| self.out.expr_types.get(&a.span))
                    .map(Ty::behind_refs)
                {
                    Some(Ty::Bloom { bits, .. }) if *bits > 0 => *bits,
                    _ => crate::types::BLOOM_MAX_BITS,
                };
                StringCost {
                    ops: bits.div_ceil(64),
                    scratch: 0,
                }
            }
            "meter" => StringCost {
                ops: 16,
                scratch: 0,
            },
            "broadcast" => {
                let n = match args.get(1).and_then(|a| self.out.expr_types.get(&a.span)) {
                    Some(Ty::ChanArray(_, n)) => *n,
                    _ => 0,
                };
                StringCost { ops: n, scratch: 0 }
            }
            _ => StringCost::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_cidr;

    /// The codes of the errors `check` finds in `src`, with the text
    /// each points at.
    fn errors(src: &str) -> Vec<(&'static str, String)> {
        let (program, diags) = flick_syntax::parse(src);
        assert!(diags.is_empty(), "{diags:?}");
        crate::check(&program)
            .1
            .iter()
            .map(|d| (d.code, src[d.span().range()].to_string()))
            .collect()
    }

    #[test]
    fn a_malformed_constant_prefix_is_an_error_where_it_is_written() {
        let src = "fun inside: (a: integer, cidr: string) -> (bool)
  in_prefix(a, cidr)

fun f: (a: integer) -> (bool)
  in_prefix(a, \"10.0.0.0/33\") or inside(a, \"10.0.0/8\") or inside(a, \"10.0.0.0/8\")
";
        assert_eq!(
            errors(src),
            vec![
                ("E0210", "\"10.0.0.0/33\"".to_string()),
                ("E0210", "\"10.0.0/8\"".to_string())
            ]
        );
    }

    #[test]
    fn misused_packet_builtins_are_errors() {
        let src = "proc P: (integer/integer c, [integer/-] ins)
  | c => f(ins, c)

fun f: ([integer/-] ins, -/integer out, x: integer) -> ()
  let a = pack()
  let b = pack(1, 2, 3, 4, 5, 6, 7, 8, 9)
  let d = pack([1, 2])
  let e = frame_len(x)
  broadcast(x, ins)
  broadcast(x, out)
  let g = min(x, \"a\")
";
        let codes: Vec<&str> = errors(src).iter().map(|(c, _)| *c).collect();
        assert_eq!(
            codes,
            ["E0202", "E0202", "E0203", "E0203", "E0302", "E0303", "E0203"]
        );
    }

    #[test]
    fn log_takes_one_string() {
        let src = "fun f: (x: integer, s: string) -> ()
  log(s)
  log(to_string(x))
  log(x)
  log(s, s)
";
        assert_eq!(
            errors(src),
            vec![
                ("E0203", "x".to_string()),
                ("E0202", "log(s, s)".to_string())
            ]
        );
    }

    #[test]
    fn table_annotations_are_checked_where_written() {
        let ok = "proc P: (integer/integer c)
  global a: dict<integer*integer> {capacity=8, idle=30, evict=lru} := empty_dict
  global b: dict<integer*integer> {idle=5, evict=idle} := empty_dict
  global d: dict<integer*integer> {evict=refuse} := empty_dict
  c => c
";
        assert_eq!(errors(ok), vec![]);
        let bad = "proc P: (integer/integer c)
  global a: dict<integer*integer> {evict=fifo} := empty_dict
  global b: dict<integer*integer> {evict=idle} := empty_dict
  global d: dict<integer*integer> {idle=0, ttl=3} := empty_dict
  c => c
";
        assert_eq!(
            errors(bad),
            vec![
                ("E0503", "fifo".to_string()),
                ("E0503", "idle".to_string()),
                ("E0503", "0".to_string()),
                ("E0108", "ttl".to_string()),
            ]
        );
    }

    /// `idle` and `evict` change nothing in the memory bound: `capacity`
    /// entries are counted either way.
    #[test]
    fn flow_table_annotations_keep_the_bound_of_their_capacity() {
        let bound = |annotation: &str| {
            let src = format!(
                "proc P: (integer/integer c)
  global a: dict<integer*integer> {annotation} := empty_dict
  c => c
"
            );
            let (program, diags) = flick_syntax::parse(&src);
            assert!(diags.is_empty(), "{diags:?}");
            let (checked, diags) = crate::check(&program);
            assert!(diags.is_empty(), "{diags:?}");
            checked.processes[0].bounds.global_bytes
        };
        assert_eq!(bound("{capacity=100}"), 100 * 16);
        assert_eq!(bound("{capacity=100, idle=30, evict=lru}"), 100 * 16);
    }

    #[test]
    fn meters_and_bloom_filters_check() {
        let ok = "grammar packet

proc P: (integer/integer c)
  global m: meter {rate=1000, burst=1500} := new_meter
  global ms: dict<string*meter {rate=10, burst=20}> {capacity=8} := empty_dict
  global b: bloom {bits=1024, hashes=3} := new_bloom
  c => f(m, ms, b)

fun f: (m: ref meter, ms: ref dict<string*meter>, b: ref bloom, x: integer) -> (integer)
  bloom_add(b, x)
  bloom_add(b, \"k\")
  if bloom_has(b, pack(x, x)):
    bloom_clear(b)
  meter(m, x) + meter(ms, \"k\", 1)
";
        assert_eq!(errors(ok), vec![]);
    }

    #[test]
    fn meter_and_bloom_parameters_are_checked() {
        let bad = "grammar packet

proc P: (integer/integer c)
  global m: meter {rate=0, burst=1500, depth=3} := new_meter
  global y: meter {rate=1, burst=1, excess=0} := new_meter
  global b: bloom {bits=8, hashes=17} := new_bloom
  global d: bloom {bits=1 - 2} := new_bloom
  c => c
";
        assert_eq!(
            errors(bad),
            vec![
                ("E0503", "0".to_string()),
                ("E0108", "depth".to_string()),
                ("E0503", "0".to_string()),
                ("E0503", "8".to_string()),
                ("E0503", "17".to_string()),
                ("E0503", "1 - 2".to_string()),
            ]
        );
    }

    #[test]
    fn meters_and_bloom_filters_in_state_need_their_bounds() {
        let bad = "grammar packet

proc P: (integer/integer c)
  global m: meter {rate=10} := new_meter
  global ms: dict<string*meter> {capacity=8} := empty_dict
  global b: bloom {hashes=2} := new_bloom
  c => c
";
        assert_eq!(
            errors(bad),
            vec![
                ("E0509", "meter {rate=10}".to_string()),
                ("E0509", "dict<string*meter> {capacity=8}".to_string()),
                ("E0509", "bloom {hashes=2}".to_string()),
            ]
        );
    }

    #[test]
    fn meter_and_bloom_built_ins_want_their_state() {
        let bad = "grammar packet

proc P: (integer/integer c)
  global m: meter {rate=10, burst=10} := new_meter
  global n: integer := 0
  global b: bloom {bits=64, hashes=1} := new_bloom
  c => f(m, n, b)

fun f: (m: ref meter, n: ref integer, b: ref bloom, x: integer) -> (integer)
  let l = [1, 2]
  bloom_add(b, l)
  bloom_add(m, 1)
  bloom_has(b)
  meter(n, 1) + meter(m, \"k\", 1) + meter(m, True) + g(m)

fun g: (m: meter) -> (integer)
  meter(m, 1)
";
        assert_eq!(
            errors(bad),
            vec![
                ("E0203", "l".to_string()),
                ("E0203", "m".to_string()),
                ("E0202", "bloom_has(b)".to_string()),
                ("E0203", "n".to_string()),
                ("E0203", "m".to_string()),
                ("E0203", "True".to_string()),
                ("E0203", "m".to_string()),
            ]
        );
    }

    /// A lone meter in a program that steers is one per worker: a
    /// warning says so; a dictionary of meters is not warned about.
    #[test]
    fn a_lone_meter_under_steering_is_warned_about() {
        let src = |steer: &str| {
            format!(
                "grammar packet

proc P: (integer/integer c)
  global m: meter {{rate=10, burst=10}} := new_meter
  global ms: dict<integer*meter {{rate=1, burst=1}}> {{capacity=100}} := empty_dict
  c => c
{steer}"
            )
        };
        let warnings = |src: &str| {
            let (program, diags) = flick_syntax::parse(src);
            assert!(diags.is_empty(), "{diags:?}");
            let (checked, diags) = crate::check(&program);
            assert!(diags.is_empty(), "{diags:?}");
            checked
                .warnings
                .iter()
                .map(|d| (d.code, src[d.span().range()].to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(warnings(&src("")), vec![]);
        let steering = src("\nfun steer: (x: integer) -> (integer)\n  x\n");
        assert_eq!(
            warnings(&steering),
            vec![("E0903", "meter {rate=10, burst=10}".to_string())]
        );
    }

    /// A meter keeps two integers; a Bloom filter its bits, in words.
    #[test]
    fn meters_and_bloom_filters_count_in_the_memory_bound() {
        let src = "grammar packet

proc P: (integer/integer c)
  global m: meter {rate=10, burst=10} := new_meter
  global ms: dict<integer*meter {rate=1, burst=1}> {capacity=100} := empty_dict
  global b: bloom {bits=100, hashes=2} := new_bloom
  c => c
";
        let (program, diags) = flick_syntax::parse(src);
        assert!(diags.is_empty(), "{diags:?}");
        let (checked, diags) = crate::check(&program);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(checked.processes[0].bounds.global_bytes, 16 + 100 * 24 + 16);
    }

    /// A TCP service has no meters or Bloom filters: one error names
    /// every place they are written, whatever grammar (or none) it says.
    #[test]
    fn meters_and_bloom_filters_outside_packet_programs_are_refused() {
        let body = "proc P: (integer/integer c)
  global m: meter {rate=1000, burst=1500} := new_meter
  global b: bloom {bits=1024, hashes=3} := new_bloom
  c => f(m, b)

fun f: (m: ref meter, b: ref bloom, x: integer) -> (integer)
  bloom_add(b, x)
  meter(m, x)
";
        let refused = |src: &str| {
            let (program, diags) = flick_syntax::parse(src);
            assert!(diags.is_empty(), "{diags:?}");
            let diags = crate::check(&program).1;
            assert_eq!(diags.len(), 1, "{diags:?}");
            let d = &diags[0];
            assert_eq!(d.code, "E0802");
            assert!(d.hint.as_deref().unwrap().contains("`grammar packet`"));
            d.labels
                .iter()
                .map(|l| src[l.span.range()].to_string())
                .collect::<Vec<_>>()
        };
        let places = [
            "meter {rate=1000, burst=1500}",
            "new_meter",
            "bloom {bits=1024, hashes=3}",
            "new_bloom",
            "meter",
            "bloom",
            "bloom_add",
            "meter",
        ];
        assert_eq!(refused(body), places);
        let http = format!("grammar http\n\n{body}");
        let mut with_grammar = places.map(String::from).to_vec();
        with_grammar.push("http".into());
        assert_eq!(refused(&http), with_grammar);
        // A dictionary of meters is refused too, and a packet program
        // keeps every one.
        let dict = "proc P: (integer/integer c)
  global ms: dict<integer*meter {rate=1, burst=1}> {capacity=8} := empty_dict
  c => c
";
        assert_eq!(refused(dict), ["meter {rate=1, burst=1}"]);
        assert_eq!(errors(&format!("grammar packet\n\n{dict}")), vec![]);
        assert_eq!(errors(&format!("grammar packet\n\n{body}")), vec![]);
    }

    #[test]
    fn cidr_prefixes_parse_to_network_and_mask() {
        assert_eq!(parse_cidr("10.0.0.0/8"), Ok((0x0a00_0000, 0xff00_0000)));
        assert_eq!(parse_cidr("192.168.1.7/32"), Ok((0xc0a8_0107, u32::MAX)));
        assert_eq!(parse_cidr("10.1.2.3/16"), Ok((0x0a01_0000, 0xffff_0000)));
        assert_eq!(parse_cidr("0.0.0.0/0"), Ok((0, 0)));
        for bad in [
            "10.0.0.0",
            "10.0.0/8",
            "10.0.0.0.0/8",
            "10.0.0.256/8",
            "10.0.0.0/33",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "a.b.c.d/8",
            "10..0.0/8",
            "",
            "/8",
            "10.0.0.1000/8",
        ] {
            assert!(parse_cidr(bad).is_err(), "{bad}");
        }
    }
}
