//! The input task of a stream a `foldt` merges: the connection's bytes
//! go to the compute task as they arrive, in pooled chunks, unparsed. The
//! merge parses them where they lie, many records at a time
//! (`merge.rs`), so a record costs no message, channel hop or task switch
//! of its own.

use crate::conn::{hand_on, Conn, HandedOn};
use crate::msg::{Msg, MsgPool};
use crate::stats::Stats;
use flick_runtime::{Sender, TaskStatus, Timeslice};
use std::io::{ErrorKind, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The most bytes one chunk carries: enough for the merge to parse in
/// long runs, few enough that the pooled messages stay small.
pub const CHUNK: usize = 32 * 1024;

/// The most chunks queued for the merge at once.
pub const QUEUED: usize = 4;

/// Reads a merged stream's connection into chunks for the compute task.
pub struct ChunkReader {
    pub conn: Arc<Conn>,
    /// `None` once finished: closing it tells the merge the stream ended.
    pub out: Option<Sender<Msg>>,
    pub pool: Arc<MsgPool>,
    pub pending: Option<Msg>,
    pub stats: Arc<Stats>,
    /// Set when the service shuts down: the reader stops once it has read
    /// what already arrived.
    pub draining: Arc<AtomicBool>,
    /// The last read took less than there was room for (see
    /// `conn::ReadSide`): wait for the next wake-up.
    drained: bool,
    hangup: bool,
}

impl ChunkReader {
    pub fn new(
        conn: Arc<Conn>,
        out: Sender<Msg>,
        pool: Arc<MsgPool>,
        stats: Arc<Stats>,
        draining: Arc<AtomicBool>,
    ) -> ChunkReader {
        ChunkReader {
            conn,
            out: Some(out),
            pool,
            pending: None,
            stats,
            draining,
            drained: false,
            hangup: false,
        }
    }

    fn finish(&mut self) -> TaskStatus {
        if let Some(m) = self.pending.take() {
            self.pool.give(m);
        }
        self.out = None;
        let _ = self.conn.stream.shutdown(std::net::Shutdown::Read);
        TaskStatus::Done
    }

    pub fn run(&mut self, slice: &mut Timeslice) -> TaskStatus {
        self.drained = false;
        self.hangup |= self.conn.hung_up();
        loop {
            let Some(out) = &self.out else {
                return self.finish();
            };
            match hand_on(out, &mut self.pending, &self.stats, self.conn.chan, slice) {
                HandedOn::ReadOn => {}
                HandedOn::Stop(status) => return status,
                HandedOn::Closed => return self.finish(),
            }
            if self.drained && !self.hangup {
                return self.idle();
            }
            // A short queue: the merge parses chunks while they are still
            // in the cache, and the rest waits in the socket's buffer.
            if !out.has_room_within(QUEUED) {
                return TaskStatus::Idle;
            }
            let mut m = self.pool.take();
            m.bytes.resize(CHUNK, 0);
            let read = (&self.conn.stream).read(&mut m.bytes);
            match read {
                Ok(0) => {
                    self.pool.give(m);
                    return self.finish();
                }
                Ok(n) => {
                    m.bytes.truncate(n);
                    self.drained = n < CHUNK;
                    self.pending = Some(m);
                }
                Err(e) => {
                    self.pool.give(m);
                    match e.kind() {
                        ErrorKind::WouldBlock => return self.idle(),
                        ErrorKind::Interrupted => {}
                        _ => {
                            self.conn.failed_with(&e);
                            return self.finish();
                        }
                    }
                }
            }
        }
    }

    fn idle(&mut self) -> TaskStatus {
        if self.draining.load(Ordering::Acquire) {
            return self.finish();
        }
        TaskStatus::Idle
    }
}
