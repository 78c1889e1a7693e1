//! The access log (`flick run --access-log PATH|-`): a line per request
//! answered, as nginx writes one, e.g.
//!
//! ```text
//! 2026-05-01T12:00:00.123456Z 127.0.0.1:50312 client 127.0.0.1:11211 reply 38 45 212
//! ```
//!
//! time (UTC), client address, channel, backend (`-` for none, `*` for a
//! request sent to every backend), outcome (`reply`, `fault`, `reject`,
//! `refused`), request bytes, reply bytes and the time from the request's
//! arrival to its last reply passed on, in microseconds.
//!
//! Workers never wait on the disk: each formats its line into a buffer of
//! its own (a shard, behind a lock only the writer thread also takes, to
//! swap it for an empty one), and a thread writes the buffers out every
//! [`FLUSH_EVERY`], or sooner when one fills. A line that finds its buffer
//! full is dropped and counted ([`AccessLog::dropped`]). Buffers keep their
//! storage, so logging allocates nothing per line.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often buffered lines are written out.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Bytes each worker's buffer holds before lines are dropped.
pub const SHARD_BYTES: usize = 256 * 1024;
/// Room kept for one line: a line is written only where this much is free.
const MAX_LINE: usize = 512;

/// How a request was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// By a backend (or by the program itself).
    Reply,
    /// With the grammar's `%fault` reply: a backend down, too slow or
    /// broken, or a compute fault.
    Fault,
    /// With the grammar's `%reject` reply: the request did not parse.
    Reject,
    /// With the `%reject` reply for a request the grammar `%refuse`s.
    Refused,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Reply => "reply",
            Outcome::Fault => "fault",
            Outcome::Reject => "reject",
            Outcome::Refused => "refused",
        }
    }
}

/// Which backend a request went to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// None: answered by the proxy itself.
    None,
    Backend(SocketAddr),
    /// Every backend of a channel array (`%broadcast`).
    All,
}

/// One line's fields.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub client: Option<SocketAddr>,
    pub channel: &'a str,
    pub backend: Target,
    pub outcome: Outcome,
    pub request_bytes: u64,
    pub reply_bytes: u64,
    pub duration: Duration,
}

struct Inner {
    shards: Box<[Mutex<Vec<u8>>]>,
    dropped: AtomicU64,
    lines: AtomicU64,
    stop: AtomicBool,
    /// The writer thread, to wake when a buffer fills.
    thread: OnceLock<std::thread::Thread>,
}

/// An open access log and the thread that writes it.
pub struct AccessLog {
    inner: Arc<Inner>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("lines", &self.lines())
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl AccessLog {
    /// Opens `dest` for appending (created if need be), or standard output
    /// for `-`, with a buffer for each of `shards` workers.
    pub fn open(dest: &str, shards: usize) -> std::io::Result<Arc<AccessLog>> {
        let out: Box<dyn Write + Send> = match dest {
            "-" => Box::new(std::io::stdout()),
            path => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
        };
        AccessLog::to_writer(out, shards)
    }

    /// A log written to `out`.
    pub fn to_writer(
        mut out: Box<dyn Write + Send>,
        shards: usize,
    ) -> std::io::Result<Arc<AccessLog>> {
        let inner = Arc::new(Inner {
            shards: (0..shards.max(1))
                .map(|_| Mutex::new(Vec::with_capacity(SHARD_BYTES)))
                .collect(),
            dropped: AtomicU64::new(0),
            lines: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            thread: OnceLock::new(),
        });
        let shared = inner.clone();
        let handle = std::thread::Builder::new()
            .name("flick-access-log".into())
            .spawn(move || {
                // Swapped with the shards' buffers, so neither side allocates.
                let mut spare: Vec<Vec<u8>> = shared
                    .shards
                    .iter()
                    .map(|_| Vec::with_capacity(SHARD_BYTES))
                    .collect();
                loop {
                    let last = shared.stop.load(Ordering::Acquire);
                    for (shard, buf) in shared.shards.iter().zip(&mut spare) {
                        std::mem::swap(&mut *lock(shard), buf);
                        if !buf.is_empty() {
                            // A failing disk loses lines, never blocks workers.
                            let _ = out.write_all(buf);
                            buf.clear();
                        }
                    }
                    let _ = out.flush();
                    if last {
                        return;
                    }
                    std::thread::park_timeout(FLUSH_EVERY);
                }
            })?;
        let _ = inner.thread.set(handle.thread().clone());
        Ok(Arc::new(AccessLog {
            inner,
            writer: Mutex::new(Some(handle)),
        }))
    }

    /// Buffers a line in worker `shard`'s buffer, or drops it (counted)
    /// if that buffer is full.
    pub fn log(&self, shard: usize, e: &Entry) {
        let inner = &self.inner;
        let mut buf = lock(&inner.shards[shard % inner.shards.len()]);
        if buf.len() + MAX_LINE > SHARD_BYTES {
            drop(buf);
            inner.dropped.fetch_add(1, Ordering::Relaxed);
            self.wake();
            return;
        }
        let before = buf.len();
        write_line(&mut buf, SystemTime::now(), e);
        inner.lines.fetch_add(1, Ordering::Relaxed);
        // A quarter full: the writer need not wait for its next turn.
        let crossed = before < SHARD_BYTES / 4 && buf.len() >= SHARD_BYTES / 4;
        drop(buf);
        if crossed {
            self.wake();
        }
    }

    fn wake(&self) {
        if let Some(t) = self.inner.thread.get() {
            t.unpark();
        }
    }

    /// Lines dropped because their worker's buffer was full.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// Lines buffered for writing.
    pub fn lines(&self) -> u64 {
        self.inner.lines.load(Ordering::Relaxed)
    }

    /// Writes out what is buffered and stops the writer thread; lines
    /// logged afterwards stay buffered, unwritten.
    pub fn close(&self) {
        self.inner.stop.store(true, Ordering::Release);
        self.wake();
        let handle = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        self.close();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A worker that panicked mid-line leaves at worst a cut line.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Appends `e`'s line, stamped `at`, to `buf`.
fn write_line(buf: &mut Vec<u8>, at: SystemTime, e: &Entry) {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (y, mo, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    let _ = write!(
        buf,
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z ",
        s / 3600,
        s / 60 % 60,
        s % 60,
        since.subsec_micros()
    );
    let _ = match e.client {
        Some(a) => write!(buf, "{a} "),
        None => write!(buf, "- "),
    };
    // A channel name is an identifier: no spaces to escape.
    buf.extend_from_slice(e.channel.as_bytes());
    let _ = match e.backend {
        Target::None => write!(buf, " - "),
        Target::All => write!(buf, " * "),
        Target::Backend(a) => write!(buf, " {a} "),
    };
    let _ = writeln!(
        buf,
        "{} {} {} {}",
        e.outcome.as_str(),
        e.request_bytes,
        e.reply_bytes,
        e.duration.as_micros()
    );
}

/// The proleptic Gregorian (year, month, day) of a day counted from
/// 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn a_line_has_every_field() {
        let mut buf = Vec::new();
        let at = UNIX_EPOCH + Duration::from_micros(951_782_400_000_000 + 3_723_000_042);
        write_line(
            &mut buf,
            at,
            &Entry {
                client: Some("127.0.0.1:5000".parse().unwrap()),
                channel: "client",
                backend: Target::Backend("[::1]:11211".parse().unwrap()),
                outcome: Outcome::Fault,
                request_bytes: 30,
                reply_bytes: 24,
                duration: Duration::from_nanos(1_234_567),
            },
        );
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "2000-02-29T01:02:03.000042Z 127.0.0.1:5000 client [::1]:11211 fault 30 24 1234\n"
        );
    }

    /// A sink that records what is written, shared with the test.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn entry(n: u64) -> Entry<'static> {
        Entry {
            client: None,
            channel: "c",
            backend: Target::None,
            outcome: Outcome::Reply,
            request_bytes: n,
            reply_bytes: 0,
            duration: Duration::ZERO,
        }
    }

    #[test]
    fn lines_are_written_by_the_thread_and_a_full_buffer_drops() {
        let sink = Sink::default();
        let log = AccessLog::to_writer(Box::new(sink.clone()), 2).unwrap();
        log.log(0, &entry(1));
        log.log(1, &entry(2));
        log.log(7, &entry(3));
        // Written within a few flushes, without close.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sink
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            < 3
        {
            assert!(std::time::Instant::now() < deadline, "not written");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Far more than a buffer holds, faster than it is written: some
        // are dropped and counted, none cut.
        let n = 4 * SHARD_BYTES as u64 / 40;
        for i in 0..n {
            log.log(0, &entry(i));
        }
        log.close();
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let written = text.lines().count() as u64;
        assert_eq!(written + log.dropped(), n + 3);
        assert_eq!(log.lines(), written);
        assert!(text
            .lines()
            .all(|l| l.ends_with(" 0") && l.split(' ').count() == 8));
    }
}
