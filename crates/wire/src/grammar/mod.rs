//! The grammar language: its tree and its parser.

pub mod ast;
pub(crate) mod parser;

pub use parser::parse_grammar;
