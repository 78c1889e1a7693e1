//! The Flick platform's execution core: tasks, the cooperative scheduler
//! and the bounded channels that join tasks into graphs (the paper's
//! section 5).
//!
//! This crate owns who runs when: worker threads, per-worker queues,
//! groups of tasks sharing the workers by weight, scavenging, the
//! timeslice, backpressure between tasks, and readiness I/O
//! (an epoll instance per worker). It must not parse protocols (that is
//! `flick-wire`) or know what a task computes.

pub mod channel;
pub mod io;
mod run_queue;
mod scheduler;
mod sync;
mod task;

pub use channel::{channel, ChannelPool, Receiver, Sender, TryRecvError, TrySendError};
pub use scheduler::{
    Full, Group, GroupsFull, Scheduler, SchedulerConfig, Waker, MAX_GROUPS, MAX_WEIGHT,
};
pub use task::{Policy, Task, TaskId, TaskStatus, Timeslice};
