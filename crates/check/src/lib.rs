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
pub fn check_source(src: &str) -> (CheckedProgram, Vec<Diagnostic>) {
    let (program, mut diags) = flick_syntax::parse(src);
    let (checked, more) = check(&program);
    diags.extend(more);
    (checked, diags)
}
