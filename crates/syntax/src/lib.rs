//! The Flick language's syntax: lexer, parser, tree and formatter.
//!
//! This crate owns the text-to-tree direction and back ([`parse`] and
//! [`format_program`]). It must not resolve names, check types or read
//! files: meaning is the `flick-check` crate's job, and bytes come from the
//! caller.

pub mod ast;
mod fmt;
mod lexer;
mod parser;

pub use fmt::{
    expr as format_expr, format_program, format_with_comments, type_expr as format_type,
};
pub use lexer::KEYWORDS;
pub use parser::{parse, parse_with_comments, MAX_NESTING};
