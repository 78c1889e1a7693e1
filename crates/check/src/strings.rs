//! The built-ins on strings and bytes (`starts_with`, `ends_with`,
//! `contains`, `lower`, `substring`, `to_int`, `to_string`, `split_once`)
//! and `header`, which finds a header field of a message by name: their
//! types, the bounds of their results, and their cost.
//!
//! None of them fails at run time. Given `None` (a header or dictionary
//! entry that is not there), the tests are `False` and the others give
//! `None`; `to_int` of something that is not a number, `split_once`
//! without the separator and `header` without the field give `None` too.

use crate::builtins::INT_STRING_MAX;
use crate::checker::Checker;
use crate::limits::DEFAULT_BYTES_MAX;
use crate::types::Ty;
use flick_span::{Diagnostic, Span};
use flick_syntax::ast::*;

/// The most bytes a string or bytes type holds.
pub(crate) fn max_of(t: &Ty) -> Option<u64> {
    match t.behind_refs() {
        Ty::Str { max } | Ty::Bytes { max } => Some(*max),
        _ => None,
    }
}

/// What running a string built-in once may cost: operations, and bytes
/// it adds to the interpreter's scratch buffer (which holds what it makes
/// until the message is handled).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StringCost {
    pub ops: u64,
    pub scratch: u64,
}

impl Checker<'_> {
    pub(crate) fn string_builtin(&mut self, f: &Ident, args: &[Expr], span: Span) -> Ty {
        let name = f.name.as_str();
        let n = match name {
            "lower" | "to_int" | "to_string" => 1,
            "substring" => 3,
            _ => 2,
        };
        if !self.arity(f, n, args.len(), span, "") {
            args.iter().for_each(|a| drop(self.expr(a)));
            return match name {
                "starts_with" | "ends_with" | "contains" => Ty::Bool,
                "to_int" => Ty::int(),
                _ => Ty::Error,
            };
        }
        match name {
            "starts_with" | "ends_with" | "contains" => {
                let t = self.text(f, &args[0]);
                self.pattern(f, &t, &args[1]);
                Ty::Bool
            }
            "lower" => self.text(f, &args[0]),
            "substring" => {
                let t = self.text(f, &args[0]);
                for a in &args[1..] {
                    let ta = self.expr(a);
                    self.operand(&ta, &Ty::int(), a.span, "`substring`");
                }
                // A constant count bounds the result.
                let count = match &args[2].kind {
                    ExprKind::Int { value, .. } => Some(*value),
                    _ => None,
                };
                match (&t, count) {
                    (Ty::Str { max }, Some(c)) => Ty::Str { max: (*max).min(c) },
                    (Ty::Bytes { max }, Some(c)) => Ty::Bytes { max: (*max).min(c) },
                    _ => t,
                }
            }
            "to_int" => {
                self.text(f, &args[0]);
                Ty::int()
            }
            "to_string" => {
                let t = self.expr(&args[0]);
                self.operand(&t, &Ty::int(), args[0].span, "`to_string`");
                Ty::Str {
                    max: INT_STRING_MAX,
                }
            }
            "split_once" => {
                let t = self.text(f, &args[0]);
                self.pattern(f, &t, &args[1]);
                match t {
                    Ty::Error => Ty::Error,
                    t => Ty::Tuple(vec![t.clone(), t]),
                }
            }
            "header" => self.header(f, args),
            _ => unreachable!("every string built-in is handled"),
        }
    }

    /// The first argument of a string built-in: a string or bytes, whose
    /// type (behind any `ref`) is returned, or `Error`.
    fn text(&mut self, f: &Ident, a: &Expr) -> Ty {
        let t = self.expr(a);
        let r = self.uni.resolve(&t);
        match r.behind_refs() {
            t @ (Ty::Str { .. } | Ty::Bytes { .. } | Ty::Error | Ty::Var(_)) => t.clone(),
            other => {
                self.diags.push(
                    Diagnostic::error(
                        "E0203",
                        format!("`{}` works on a string or bytes, not `{other}`", f.name),
                        a.span,
                    )
                    .label(format!("this is `{other}`")),
                );
                Ty::Error
            }
        }
    }

    /// A second argument of the same type as the first (`string` with
    /// `string`, `bytes` with `bytes`).
    fn pattern(&mut self, f: &Ident, t: &Ty, a: &Expr) {
        let p = self.expr(a);
        if !matches!(t, Ty::Error) {
            self.expect_ty(
                &p,
                t,
                a.span,
                &format!("the second argument of `{}`", f.name),
            );
        }
    }

    /// `header(msg, NAME)`: `msg` views a grammar unit with a header list.
    fn header(&mut self, f: &Ident, args: &[Expr]) -> Ty {
        let t = self.expr(&args[0]);
        let name = self.expr(&args[1]);
        self.expect_ty(
            &name,
            &Ty::Str {
                max: DEFAULT_BYTES_MAX,
            },
            args[1].span,
            "the field name given to `header`",
        );
        let r = self.uni.resolve(&t);
        match r.behind_refs() {
            Ty::Record(_, rname) => match self.header_lists.get(rname) {
                Some(h) => Ty::Str { max: h.value_max },
                None => {
                    let why = if self.wire_messages.contains_key(rname) {
                        format!("the grammar unit `{rname}` has no list of header fields")
                    } else {
                        format!("`{rname}` is not a view of a grammar unit")
                    };
                    self.diags.push(
                        Diagnostic::error(
                            "E0703",
                            format!("`{}` reads header fields, and `{rname}` has none", f.name),
                            args[0].span,
                        )
                        .label(why)
                        .hint("`header(msg, NAME)` takes a record that views a unit with a `headers` list of `name` and `value` fields, such as `request` or `response` of `grammar http`"),
                    );
                    Ty::Error
                }
            },
            Ty::Error | Ty::Var(_) => Ty::Error,
            other => {
                self.diags.push(
                    Diagnostic::error(
                        "E0203",
                        format!(
                            "`{}` reads the header fields of a message, not of `{other}`",
                            f.name
                        ),
                        args[0].span,
                    )
                    .label(format!("this is `{other}`"))
                    .hint("give it the record a rule received, as in `header(req, \"X-Shard\")`"),
                );
                Ty::Error
            }
        }
    }

    /// The cost of one call of string built-in `f` (after checking, from
    /// its arguments' types).
    pub(crate) fn string_cost(&self, f: &str, args: &[Expr]) -> StringCost {
        let max = |i: usize| {
            args.get(i)
                .and_then(|a| self.out.expr_types.get(&a.span))
                .and_then(max_of)
                .unwrap_or(0)
        };
        let (n, m) = (max(0), max(1));
        let (ops, scratch) = match f {
            "starts_with" | "ends_with" => (n.min(m), 0),
            "contains" => (n.saturating_mul(m), 0),
            "lower" => (n, n),
            "substring" => {
                let count = match args.get(2).map(|a| &a.kind) {
                    Some(ExprKind::Int { value, .. }) => n.min(*value),
                    _ => n,
                };
                (count, count)
            }
            "to_int" => (n.min(INT_STRING_MAX), 0),
            "to_string" => (INT_STRING_MAX, INT_STRING_MAX),
            "split_once" => (n.saturating_mul(m).saturating_add(n), n),
            "header" => {
                let list = match args
                    .first()
                    .and_then(|a| self.out.expr_types.get(&a.span))
                    .map(Ty::behind_refs)
                {
                    Some(Ty::Record(_, r)) => self.header_lists.get(r).copied(),
                    _ => None,
                };
                match list {
                    // Each field's name compared, and the value's trailing
                    // blanks trimmed.
                    Some(h) => (
                        h.count_max
                            .saturating_mul(h.name_max.min(m).max(1))
                            .saturating_add(h.value_max),
                        0,
                    ),
                    None => (0, 0),
                }
            }
            _ => (0, 0),
        };
        StringCost { ops, scratch }
    }
}
