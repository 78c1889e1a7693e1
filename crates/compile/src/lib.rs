//! The compiler from checked Flick programs to task graphs.
//!
//! This crate owns the shape of execution: which tasks an instance of a
//! process has, what joins them, and (as it grows) the compiled code each
//! compute task runs. It must not run anything, open sockets or parse
//! bytes: the runtime instantiates what this crate describes.

mod graph;

pub use graph::{task_graphs, to_dot, ChannelSpec, Edge, GraphTemplate, TaskKind, TaskSpec};
