//! The compiler from checked Flick programs to task graphs.
//!
//! This crate owns the shape of execution: which tasks an instance of a
//! process has, what joins them, and (as it grows) the compiled code each
//! compute task runs. It must not run anything, open sockets or parse
//! bytes: the runtime instantiates what this crate describes.
//!
//! It also compiles records that describe their own wire layout (`size=`
//! on every field) to the source text of a wire grammar
//! ([`record_grammar`]), for programs that name no grammar.

mod graph;
mod record_grammar;

pub use graph::{task_graphs, to_dot, ChannelSpec, Edge, GraphTemplate, TaskKind, TaskSpec};
pub use record_grammar::{record_grammar, RecordGrammar};
