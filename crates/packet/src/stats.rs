//! Counters a run publishes while it goes, for a metrics endpoint to read
//! at each scrape. Each counter has one writer (the dispatcher, a worker
//! or the writer thread), which stores its running total after each
//! batch or frame: no thread contends for another's cache line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// One port's counters.
#[derive(Debug, Default)]
pub struct PortStats {
    pub name: String,
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub tx_errors: AtomicU64,
    pub rx_overflow: AtomicU64,
    /// Frames the port itself dropped on the way in (a kernel ring or a
    /// shared port's queue full), as it last reported them.
    pub rx_drops: AtomicU64,
}

/// One worker's counters.
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub frames: AtomicU64,
    pub dropped: AtomicU64,
    pub faults: AtomicU64,
    pub dict_full: AtomicU64,
    /// Flow-table entries evicted to make room and expired, over all of
    /// the worker's tables (for `flick_packet_*` metrics).
    pub table_evicted: AtomicU64,
    pub table_expired: AtomicU64,
}

/// What a running service has done so far. Made empty; the run fills in
/// its ports and workers when it starts.
#[derive(Debug, Default)]
pub struct LiveStats {
    ports: OnceLock<Vec<PortStats>>,
    workers: OnceLock<Vec<WorkerStats>>,
    pub malformed: AtomicU64,
    /// Faults of `steer`, run by the dispatcher.
    pub steer_faults: AtomicU64,
}

impl LiveStats {
    /// The ports' counters; empty until the run starts.
    pub fn ports(&self) -> &[PortStats] {
        self.ports.get().map_or(&[], Vec::as_slice)
    }

    /// The workers' counters; empty until the run starts.
    pub fn workers(&self) -> &[WorkerStats] {
        self.workers.get().map_or(&[], Vec::as_slice)
    }

    pub(crate) fn start(&self, ports: Vec<String>, workers: usize) {
        let _ = self.ports.set(
            ports
                .into_iter()
                .map(|name| PortStats {
                    name,
                    ..PortStats::default()
                })
                .collect(),
        );
        let _ = self
            .workers
            .set((0..workers).map(|_| WorkerStats::default()).collect());
    }

    /// A sum over the workers.
    pub fn workers_sum(&self, f: impl Fn(&WorkerStats) -> &AtomicU64) -> u64 {
        self.workers()
            .iter()
            .map(|w| f(w).load(Ordering::Relaxed))
            .sum()
    }
}

pub(crate) fn set(counter: &AtomicU64, v: u64) {
    counter.store(v, Ordering::Relaxed);
}
