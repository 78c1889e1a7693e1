//! The Flick platform (the paper's section 5): a program's processes
//! instantiated as task graphs per client connection, on the scheduler and
//! the reactor of `flick-runtime`.
//!
//! This crate joins the layers: it parses with `flick-wire` grammars in
//! input tasks, runs `flick-exec` code in compute tasks, writes messages in
//! output tasks, and keeps process state. It must not contain language or
//! protocol rules of its own: those come from the program and its grammar.

pub mod access_log;
mod backend;
mod balance;
mod build;
mod compute;
mod conn;
mod forward;
mod graph_pool;
pub mod log;
mod merge;
mod merge_read;
mod msg;
mod outbox;
mod peers;
mod platform;
mod service;
mod state;
mod stats;

pub use msg::{Msg, MsgPool};
pub use platform::{Platform, PlatformConfig, PlatformError};
pub use service::{
    release_free_memory, Accept, LoadError, Loaded, Service, ServiceConfig, Sharing, StartError,
    StateError, StateValue, Stopped, REQUEST_BUFFER_BYTES,
};
pub use state::{DictError, DictSize, EntryRef, EntryValue, GlobalDict, STRING_ROOM_MAX};
pub use stats::{
    BackendStats, ChannelStats, Counter, Histogram, HistogramSnapshot, Stats, BUCKETS,
    LATENCY_BOUNDS_US,
};
