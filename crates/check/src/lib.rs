//! Static checks of Flick programs: names, types, channel directions,
//! termination and memory bounds.
//!
//! This crate owns the meaning of a parsed program. Its output, a
//! [`CheckedProgram`], is what the compiler to task graphs consumes. It must
//! not read files, render diagnostics or run programs.

mod bounds;
pub mod builtins;
mod calls;
mod checker;
mod decls;
mod exprs;
mod items;
pub mod limits;
pub mod packets;
mod program;
mod strings;
mod suggest;
pub mod types;

pub use items::EVENTS;
pub use program::*;
pub use types::{ChanTy, Ty};

use flick_span::Diagnostic;
use flick_syntax::ast::Program;

/// Checks `program`, returning what was resolved and every problem found.
/// Bounds in the result are computed only when there are no problems.
pub fn check(program: &Program) -> (CheckedProgram, Vec<Diagnostic>) {
    checker::Checker::new(program).run()
}

/// What a wire grammar says of the records that view its units.
pub trait WireLimits {
    /// The grammar's maximum size of a field, which bounds a string or
    /// bytes field that states no size of its own.
    fn field_max(&self, record: &str, field: &str) -> Option<u64>;
    /// The most bytes a whole message takes (a view's unread fields are
    /// carried along), which bounds messages on channels.
    fn message_max(&self, record: &str) -> Option<u64>;
    /// The header fields of the unit a record views (HTTP's `headers`
    /// list of `name` and `value`), which `header(msg, NAME)` searches;
    /// `None` where the unit has none.
    fn header_list(&self, record: &str) -> Option<HeaderList> {
        let _ = record;
        None
    }
}

/// What bounds a unit's list of header fields: how many, and how long a
/// name and a value can be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderList {
    pub count_max: u64,
    pub name_max: u64,
    pub value_max: u64,
}

/// Checks `program` whose records view units of a wire grammar.
pub fn check_with(program: &Program, wire: &dyn WireLimits) -> (CheckedProgram, Vec<Diagnostic>) {
    let mut c = checker::Checker::new(program);
    for decl in &program.decls {
        let flick_syntax::ast::Decl::Type(t) = decl else {
            continue;
        };
        let flick_syntax::ast::TypeBody::Record(fields) = &t.body else {
            continue;
        };
        if let Some(max) = wire.message_max(&t.name.name) {
            c.wire_messages.insert(t.name.name.clone(), max);
        }
        if let Some(h) = wire.header_list(&t.name.name) {
            c.header_lists.insert(t.name.name.clone(), h);
        }
        for f in fields.iter().filter_map(|f| f.name.as_ref()) {
            if let Some(max) = wire.field_max(&t.name.name, &f.name) {
                c.wire_limits
                    .insert((t.name.name.clone(), f.name.clone()), max);
            }
        }
    }
    c.run()
}

/// Parses and checks a source text: the whole front end in one call.
/// Syntax errors, when there are any, are the only ones reported.
pub fn check_source(src: &str) -> (CheckedProgram, Vec<Diagnostic>) {
    let (program, diags) = flick_syntax::parse(src);
    let (checked, more) = check(&program);
    // The checker still runs on what parsed, but after a syntax error its
    // findings are mostly echoes of it (a name whose `let` did not parse).
    if diags.is_empty() {
        (checked, more)
    } else {
        (checked, diags)
    }
}

/// A program that did not pass the front end, with every reason.
#[derive(Debug, thiserror::Error)]
#[error("the program has {} error(s)", .diagnostics.len())]
pub struct Rejected {
    pub diagnostics: Vec<Diagnostic>,
}

/// The front end as a `Result`: the checked program, or why it was rejected.
pub fn front_end(src: &str) -> Result<CheckedProgram, Rejected> {
    match check_source(src) {
        (checked, diagnostics) if diagnostics.is_empty() => Ok(checked),
        (_, diagnostics) => Err(Rejected { diagnostics }),
    }
}
