//! Typed errors of parsing and serialising messages, and of loading
//! grammars.

use flick_span::Diagnostic;
use std::sync::Arc;

/// Bad bytes: what went wrong, in which grammar field, at which offset of
/// the message, and the status a proxy should answer with, if the grammar
/// names one (`&error = 414`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} in field `{field}` at byte {offset}")]
pub struct WireError {
    pub kind: WireErrorKind,
    pub field: Arc<str>,
    pub offset: usize,
    pub status: Option<u16>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireErrorKind {
    #[error("longer than the maximum of {max} bytes")]
    TooLong { max: u64 },
    #[error("more than the maximum of {max} elements")]
    TooMany { max: u32 },
    #[error("unexpected bytes")]
    Mismatch,
    #[error("a negative length")]
    BadLength,
    #[error("not a number")]
    BadNumber,
    #[error("a value the grammar does not allow")]
    Invalid,
    #[error("no alternative matches")]
    NoCase,
    #[error("nesting deeper than the parser allows")]
    TooDeep,
    #[error("the stream ended inside a message")]
    Truncated,
}

/// A grammar that does not load, with every reason.
#[derive(Debug, thiserror::Error)]
#[error("grammar `{name}` has {} error(s)", .diagnostics.len())]
pub struct GrammarError {
    pub name: String,
    pub diagnostics: Vec<Diagnostic>,
}
