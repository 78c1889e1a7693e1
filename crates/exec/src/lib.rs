//! Execution of compute code: checked programs lowered to register-machine
//! code ([`lower`]) and the interpreter that runs it ([`Vm`]).
//!
//! This crate owns what one compute task does with one message. It must
//! not own threads, sockets or buffers: the runtime drives the [`Vm`] and
//! provides messages, channels and state through the [`Host`] trait. Loops
//! check the [`Timeslice`](flick_runtime::Timeslice) at their back-edges, so
//! a long `fold` yields to the scheduler and resumes where it stopped.

pub mod code;
mod lower;
mod vm;

pub use code::{FuncId, Module};
pub use lower::{lower, Unsupported};
pub use vm::{fnv1a, Fault, Host, Outcome, Sent, Value, Vm};
