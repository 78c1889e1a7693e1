//! Execution of compute code: checked programs lowered to register-machine
//! code ([`lower`]) and the interpreter that runs it ([`Vm`]); `foldt`
//! bodies of plain integer arithmetic compiled to closures ([`fold`]).
//!
//! This crate owns what one compute task does with one message. It must
//! not own threads, sockets or buffers: the runtime drives the [`Vm`] and
//! provides messages, channels and state through the [`Host`] trait. Loops
//! check the [`Timeslice`](flick_runtime::Timeslice) at their back-edges, so
//! a long `fold` yields to the scheduler and resumes where it stopped.

pub mod code;
mod compiled;
pub mod fold;
mod lower;
mod typed;
mod vm;

pub use code::{
    BloomOp, BloomSpec, Evict, FuncId, HeaderEdit, MeterSpec, MeterState, Module, StateObject,
    TablePolicy, GREEN, RED, YELLOW,
};
pub use fold::{FoldSpec, FoldStep};
pub use lower::{lower, Unsupported};
pub use vm::{
    const_bytes, fnv1a, Fault, FoldCall, Host, IntField, ObjectKey, Outcome, Sent, Value, Vm,
    LOG_LINE_MAX,
};
