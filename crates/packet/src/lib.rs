//! Packet programs served: frames read from packet ports, parsed with the
//! grammar unit their channel carries (the stock `packet` grammar's, or
//! any other), steered to workers by the program's `steer` function and
//! run through its rules, then written to the ports its sends name, in
//! the order they were read.
//!
//! Workers are plain threads, one per `--workers`, not tasks of the
//! runtime's scheduler: a packet rule runs to its end without waiting on
//! any channel (a send only notes the port), so there is nothing for a
//! cooperative task to yield to, and frames cross threads in batches, so
//! a queue operation is paid per batch, not per frame. Each worker owns a
//! shard of the process state, so nothing is locked per frame; nothing is
//! allocated per frame either once batches and interpreters have grown to
//! the frames' needs (`tests/no_alloc.rs` holds this for a forwarding
//! program and for the flow tracker's string keys). The path through the
//! threads is described in `service.rs`.
//!
//! A dump merges the shards: a dictionary's entries from every shard, and
//! a scalar `global` summed over the shards where it is an integer (each
//! shard runs the state's setup, so a counter that starts at 0 sums to the
//! total; one that starts elsewhere sums its start once per worker).
//! Meters show their tokens at the latest packet time any worker saw, and
//! Bloom filters the bits set in the union of the workers' filters, so a
//! dump at the end is the same whatever the number of workers
//! (`tests/meters_no_alloc.rs` holds that metering and filter lookups
//! allocate nothing per frame).
//!
//! Several programs on the same frames are planned by `steering`: their
//! largest common flow key, or clusters where there is none; a program
//! in a cluster is steered by the cluster's key (`PacketConfig::steer_by`)
//! so a frame goes to the same worker index for each.
//!
//! This crate must not read or write ports itself (that is
//! `flick-packet-io`) nor hold language rules (that is `flick-check`).

mod host;
mod pure_steer;
pub mod rewrite;
mod service;
mod state;
mod stats;
pub mod steering;

pub use host::{Sends, MAX_SENDS};
pub use service::{
    Binding, BoundPort, Error, PacketConfig, PacketService, PendingWrite, PortCounts, PortUse,
    StateControl, Summary, WriteError, BATCH_FRAMES,
};
pub use stats::{LiveStats, PortStats, WorkerStats};
