//! Per-flow extended finite state machines, FlowBlaze's model: stages that
//! key flow contexts by packet fields, each context a state and flow
//! registers, moved by events under conditions; compiled to tables (a
//! condition vector and a transition table) and interpreted per packet.
//!
//! - [`model`]: the machine as a program states it.
//! - [`tables`]: a stage compiled to its condition vector and transition
//!   table.
//! - [`flows`]: the flow context table (bounded cuckoo hashing with a
//!   stash, timeouts, eviction).
//! - [`engine`]: one worker's executor; tables replaced between packets
//!   keep the flow contexts.
//! - [`native`]: a one-stage machine's common per-packet path as machine
//!   code (Cranelift), made from its tables; the rest interpreted.
//! - [`fields`]: XL's field names on the stock `packet` grammar's unit,
//!   and the per-frame reader.
//! - [`xl`]: FlowBlaze's XL language front end.
//! - [`lang`]: Flick's own `machine` items (parsed by `flick-syntax`) to
//!   the same model, with diagnostics.
//! - [`service`]: a machine served over packet ports, frames steered to
//!   workers by flow key and written back in input order; the dump.
//!
//! This crate must not open ports itself (that is `flick-packet-io`),
//! render diagnostics (that is the `flick` binary) or parse above the
//! `packet` grammar.

pub mod engine;
pub mod fields;
pub mod flows;
pub mod lang;
pub mod model;
pub mod native;
pub mod service;
pub mod tables;
pub mod xl;

pub use engine::{BatchFrame, Context, Counters, Engine, Frame, Program, ReplaceError, Verdict};
pub use fields::{FieldError, FieldReader};
pub use model::Machine;
pub use service::{
    swap_channel, Dump, InPort, MachineService, OutPort, RunError, Summary, SwapSender,
};
