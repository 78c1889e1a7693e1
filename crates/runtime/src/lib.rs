//! The Flick platform's execution core: tasks, the cooperative scheduler
//! and the bounded channels that join tasks into graphs (the paper's
//! section 5).
//!
//! This crate owns who runs when: worker threads, per-worker queues,
//! scavenging, the timeslice, backpressure between tasks, and readiness I/O
//! (an epoll instance per worker). It must not parse protocols (that is
//! `flick-wire`) or know what a task computes.

pub mod channel;
pub mod io;
mod scheduler;
mod sync;
mod task;

pub use channel::{channel, ChannelPool, Receiver, Sender, TryRecvError, TrySendError};
pub use scheduler::{Full, Scheduler, SchedulerConfig, Waker};
pub use task::{Policy, Task, TaskId, TaskStatus, Timeslice};
