//! Counters of a running service, for `/metrics` and for tests that check
//! nothing leaks.

use std::sync::atomic::AtomicU64;

#[derive(Debug, Default)]
pub struct Stats {
    pub connections_accepted: AtomicU64,
    pub connections_open: AtomicU64,
    pub graphs_live: AtomicU64,
    pub messages_in: AtomicU64,
    pub messages_out: AtomicU64,
    pub malformed: AtomicU64,
    pub backend_connect_errors: AtomicU64,
}
