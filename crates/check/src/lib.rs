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
mod program;
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
