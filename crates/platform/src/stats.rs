//! Counters of a running service, for `/metrics` and for tests that check
//! nothing leaks.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Stats {
    /// Client connections accepted.
    pub connections_accepted: AtomicU64,
    /// Sockets open now: clients and backends.
    pub connections_open: AtomicU64,
    /// Instances (task graphs) alive now.
    pub graphs_live: AtomicU64,
    /// Messages parsed from any connection and passed to compute.
    pub messages_in: AtomicU64,
    /// Messages written in full to any connection.
    pub messages_out: AtomicU64,
    pub malformed: AtomicU64,
    pub backend_connect_errors: AtomicU64,
    /// Rules stopped by a run-time fault of compute code.
    pub compute_faults: AtomicU64,
    /// Client connections the proxy closed because a reply could not be
    /// given whole (cut short by its backend, no error reply to write, a
    /// stream the instance feeds lost).
    pub clients_closed: AtomicU64,
    /// Jobs failed because a stream merged into them was truncated, had a
    /// wrong checksum or was out of order.
    pub jobs_failed: AtomicU64,
    /// Requests answered with the grammar's `%fault` reply (a backend down,
    /// too slow or broken, or a compute fault) instead of a peer's reply.
    pub fault_replies: AtomicU64,
    /// The same message counts per process channel, in the process's order
    /// of channels (a channel array counts all its connections).
    pub channels: Vec<ChannelStats>,
}

#[derive(Debug)]
pub struct ChannelStats {
    pub name: String,
    pub messages_in: AtomicU64,
    pub messages_out: AtomicU64,
}

impl Stats {
    /// Counters with one entry per channel of `names`.
    pub fn for_channels(names: &[String]) -> Stats {
        Stats {
            channels: names
                .iter()
                .map(|n| ChannelStats {
                    name: n.clone(),
                    messages_in: AtomicU64::new(0),
                    messages_out: AtomicU64::new(0),
                })
                .collect(),
            ..Stats::default()
        }
    }

    /// A message read on channel `chan` went to compute.
    pub fn message_in(&self, chan: usize) {
        self.messages_in.fetch_add(1, Ordering::Relaxed);
        if let Some(c) = self.channels.get(chan) {
            c.messages_in.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A message was written in full on channel `chan`.
    pub fn messages_out(&self, chan: usize, n: usize) {
        if n == 0 {
            return;
        }
        self.messages_out.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(c) = self.channels.get(chan) {
            c.messages_out.fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}
