//! Counters of a running service, for `/metrics` and for tests that check
//! nothing leaks: atomics bumped on the hot path without locks or
//! allocation, and read whole at scrape time. Those bumped per message are
//! sharded, a cache line per shard and each thread bumping its own, so
//! that workers on different cores do not pass one line between them on
//! every message (as nginx keeps its counters per worker).

use crate::access_log::AccessLog;
use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Default)]
pub struct Stats {
    /// Client connections accepted.
    pub connections_accepted: Counter,
    /// Sockets open now: clients and backends.
    pub connections_open: Counter,
    /// Instances (task graphs) alive now.
    pub graphs_live: Counter,
    /// Messages parsed from any connection and passed to compute.
    pub messages_in: Counter,
    /// Messages written in full to any connection.
    pub messages_out: Counter,
    pub malformed: Counter,
    pub backend_connect_errors: Counter,
    /// Rules stopped by a run-time fault of compute code.
    pub compute_faults: Counter,
    /// Client connections the proxy closed because a reply could not be
    /// given whole (cut short by its backend, no error reply to write, a
    /// stream the instance feeds lost).
    pub clients_closed: Counter,
    /// Jobs failed because a stream merged into them was truncated, had a
    /// wrong checksum or was out of order.
    pub jobs_failed: Counter,
    /// Requests answered with the grammar's `%fault` reply (a backend down,
    /// too slow or broken, or a compute fault) instead of a peer's reply.
    pub fault_replies: Counter,
    /// Backend replies dropped because no waiting request owned them: late
    /// (their request had its fault reply already) or unsolicited.
    pub late_replies: Counter,
    /// Requests that waited for a backend connection to come free, every
    /// one the worker may have being busy, and got none in time.
    pub backend_busy: Counter,
    /// Client requests begun but not complete within the client request
    /// timeout: they got the grammar's timeout reply, or their connection
    /// closed.
    pub client_timeouts: Counter,
    /// The same message counts per process channel, in the process's order
    /// of channels (a channel array counts all its connections).
    pub channels: Vec<ChannelStats>,
    /// The channel clients connect to (whose requests' latency is kept).
    pub listening: Option<usize>,
    /// Per backend address bound with `--connect`, in binding order.
    pub backends: Vec<BackendStats>,
    /// Where a line per answered request goes, if anywhere.
    pub access_log: Option<Arc<AccessLog>>,
}

#[derive(Debug)]
pub struct ChannelStats {
    pub name: String,
    pub messages_in: Counter,
    pub messages_out: Counter,
    /// For a listening channel: from a request's arrival at its instance
    /// to its last reply passed on towards the client's writer.
    pub latency: Histogram,
}

/// A backend address: its replies' latency and whether it can be reached.
#[derive(Debug)]
pub struct BackendStats {
    /// The process channel it is bound to, and its place in a channel array.
    pub chan: u16,
    pub index: Option<u32>,
    pub addr: SocketAddr,
    /// From a request written to it to its last reply matched.
    pub latency: Histogram,
    /// Up: it has answered a request since it last failed. Down (as at
    /// start, before it has answered anything): a connection to it was
    /// refused or could not be made, timed out, or broke with requests owed.
    pub up: AtomicBool,
    /// Failed connection attempts since it last answered.
    pub consecutive_failures: Counter,
    /// Failed connection attempts in all.
    pub connect_failures: Counter,
}

impl Stats {
    /// Counters with one entry per channel of `names`.
    pub fn for_channels(names: &[String]) -> Stats {
        Stats {
            channels: names
                .iter()
                .map(|n| ChannelStats {
                    name: n.clone(),
                    messages_in: Counter::default(),
                    messages_out: Counter::default(),
                    latency: Histogram::default(),
                })
                .collect(),
            ..Stats::default()
        }
    }

    /// With an entry per backend: (channel, index in its array, address).
    pub fn with_backends(
        mut self,
        backends: impl IntoIterator<Item = (u16, Option<u32>, SocketAddr)>,
    ) -> Stats {
        self.backends = backends
            .into_iter()
            .map(|(chan, index, addr)| BackendStats {
                chan,
                index,
                addr,
                latency: Histogram::default(),
                up: AtomicBool::new(false),
                consecutive_failures: Counter::default(),
                connect_failures: Counter::default(),
            })
            .collect();
        self
    }

    /// With `chan` the channel clients connect to.
    pub fn with_listening(mut self, chan: usize) -> Stats {
        self.listening = Some(chan);
        self
    }

    /// With an access log (`None`: none is written).
    pub fn with_access_log(mut self, log: Option<Arc<AccessLog>>) -> Stats {
        self.access_log = log;
        self
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

    /// The backend bound to `chan[index]` (a short scan: there are few).
    pub fn backend(&self, chan: u16, index: Option<u32>) -> Option<&BackendStats> {
        self.backends
            .iter()
            .find(|b| b.chan == chan && b.index == index)
    }

    /// A connection to `addr` could not even be started.
    pub fn connect_failed_to(&self, addr: SocketAddr) {
        for b in self.backends.iter().filter(|b| b.addr == addr) {
            b.connect_failed();
        }
    }

    /// A connection to backend `chan[index]` was refused.
    pub fn connect_failed(&self, chan: u16, index: Option<u32>) {
        if let Some(b) = self.backend(chan, index) {
            b.connect_failed();
        }
    }

    /// A connection to backend `chan[index]` timed out or broke with
    /// requests owed: down until it answers again.
    pub fn backend_failed(&self, chan: u16, index: Option<u32>) {
        if let Some(b) = self.backend(chan, index) {
            b.up.store(false, Ordering::Relaxed);
        }
    }
}

impl BackendStats {
    fn connect_failed(&self) {
        self.up.store(false, Ordering::Relaxed);
        self.consecutive_failures.fetch_add(1, Ordering::Relaxed);
        self.connect_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// It answered a request (given its last reply's latency): up. A load
    /// first, so that a healthy backend's line is only read, not written.
    pub fn answered(&self, latency: Duration) {
        self.latency.record(latency);
        if !self.up.load(Ordering::Relaxed) {
            self.up.store(true, Ordering::Relaxed);
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }
}

/// Shards of a [`Counter`] or [`Histogram`]: threads take them in turn
/// (more threads than shards share some).
pub const SHARDS: usize = 8;

/// The shard of the calling thread, given on its first bump.
#[inline]
fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD.with(|s| match s.get() {
        usize::MAX => {
            let n = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
            s.set(n);
            n
        }
        n => n,
    })
}

/// One shard's word, alone on its cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Line(AtomicU64);

/// A counter (or a gauge) bumped by every worker: each thread adds to its
/// own shard, and a read sums them (wrapping, so that a gauge raised on
/// one thread and lowered on another reads right).
#[derive(Debug, Default)]
pub struct Counter([Line; SHARDS]);

impl Counter {
    #[inline]
    pub fn fetch_add(&self, n: u64, order: Ordering) {
        self.0[shard()].0.fetch_add(n, order);
    }

    #[inline]
    pub fn fetch_sub(&self, n: u64, order: Ordering) {
        self.0[shard()].0.fetch_sub(n, order);
    }

    /// Sets it to `v` (tests and resets: not while others bump it).
    pub fn store(&self, v: u64, order: Ordering) {
        for (i, l) in self.0.iter().enumerate() {
            l.0.store(if i == 0 { v } else { 0 }, order);
        }
    }

    pub fn load(&self, order: Ordering) -> u64 {
        self.0
            .iter()
            .fold(0u64, |sum, l| sum.wrapping_add(l.0.load(order)))
    }
}

/// Upper bounds of the latency buckets, in microseconds (50 µs to 5 s;
/// slower goes to the `+Inf` bucket).
pub const LATENCY_BOUNDS_US: [u64; 16] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000,
];

/// The longest observation counted as it is, in nanoseconds (an hour).
const MAX_NS: u64 = 3_600_000_000_000;

/// Buckets: one per bound and the `+Inf` one.
pub const BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

/// A latency histogram of fixed buckets: recording is one search of a
/// constant array and two relaxed atomic adds to the calling thread's
/// shard, with no lock or allocation.
#[derive(Debug, Default)]
pub struct Histogram {
    shards: [HistogramShard; SHARDS],
}

/// One shard of a [`Histogram`], on cache lines of its own.
#[derive(Debug, Default)]
#[repr(align(64))]
struct HistogramShard {
    /// Observations per bucket (not cumulative): `counts[i]` those above
    /// bound `i - 1` and at most bound `i`.
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

/// A histogram read at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistogramSnapshot {
    /// Per bucket, not cumulative; the last is `+Inf`.
    pub counts: [u64; BUCKETS],
    /// Sum of the observations, in seconds.
    pub sum: f64,
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        // Capped at an hour, so that the sum cannot wrap.
        let ns = u64::try_from(d.as_nanos()).map_or(MAX_NS, |n| n.min(MAX_NS));
        let i = LATENCY_BOUNDS_US.partition_point(|&b| b * 1_000 < ns);
        let shard = &self.shards[shard()];
        shard.counts[i].fetch_add(1, Ordering::Relaxed);
        shard.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut counts = [0; BUCKETS];
        let mut sum_ns = 0u64;
        for shard in &self.shards {
            for (c, a) in counts.iter_mut().zip(&shard.counts) {
                *c += a.load(Ordering::Relaxed);
            }
            sum_ns = sum_ns.wrapping_add(shard.sum_ns.load(Ordering::Relaxed));
        }
        HistogramSnapshot {
            counts,
            sum: sum_ns as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = Histogram::default();
        h.record(Duration::ZERO);
        h.record(Duration::from_micros(50)); // on a bound: that bucket
        h.record(Duration::from_nanos(50_001));
        h.record(Duration::from_millis(3));
        h.record(Duration::from_secs(5));
        h.record(Duration::from_secs(6));
        h.record(Duration::MAX);
        let s = h.snapshot();
        assert_eq!(s.counts[0], 2);
        assert_eq!(s.counts[1], 1);
        assert_eq!(s.counts[6], 1); // 2.5 ms < 3 ms <= 5 ms
        assert_eq!(s.counts[15], 1);
        assert_eq!(s.counts[16], 2);
        assert_eq!(s.count(), 7);
        assert!(s.sum > 3_611.0 && s.sum < 3_612.0, "{}", s.sum);
    }

    #[test]
    fn sharded_counts_add_up_over_threads() {
        let c = std::sync::Arc::new(Counter::default());
        let h = std::sync::Arc::new(Histogram::default());
        let threads: Vec<_> = (0..(SHARDS + 3))
            .map(|t| {
                let (c, h) = (c.clone(), h.clone());
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        c.fetch_add(2, Ordering::Relaxed);
                        h.record(Duration::from_micros(60));
                    }
                    // A gauge lowered on another thread than raised it.
                    if t % 2 == 1 {
                        c.fetch_sub(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = (SHARDS + 3) as u64;
        assert_eq!(c.load(Ordering::Relaxed), 2000 * n - n / 2);
        let s = h.snapshot();
        assert_eq!((s.counts[1], s.count()), (1000 * n, 1000 * n));
        assert!((s.sum - 0.06 * n as f64).abs() < 1e-9, "{}", s.sum);
        c.store(5, Ordering::Relaxed);
        assert_eq!(c.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn health_follows_connections() {
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        let s = Stats::default().with_backends([(1, Some(0), a), (1, Some(1), b)]);
        let up = |i: usize| s.backends[i].up.load(Ordering::Relaxed);
        let failures = |i: usize| {
            let b = &s.backends[i];
            (
                b.consecutive_failures.load(Ordering::Relaxed),
                b.connect_failures.load(Ordering::Relaxed),
            )
        };
        assert!(!up(0), "down until it answers");
        s.backends[0].answered(Duration::from_micros(70));
        assert!(up(0) && !up(1));
        assert_eq!(s.backends[0].latency.snapshot().counts[1], 1);
        s.connect_failed_to(b);
        s.connect_failed(1, Some(1));
        assert_eq!(failures(1), (2, 2));
        s.backends[1].answered(Duration::ZERO);
        assert_eq!(failures(1), (0, 2));
        s.backend_failed(1, Some(0));
        assert!(!up(0) && up(1));
        assert_eq!(failures(0), (0, 0));
    }
}
