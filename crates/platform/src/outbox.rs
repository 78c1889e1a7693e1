//! Messages waiting to be written to a connection, written together: one
//! `writev` carries every message a writer has, up to a batch, instead of
//! one `write` each. Under load that divides the writer's system calls, and
//! the wake-ups of whoever reads the other end, by the batch.

use crate::msg::{Msg, MsgPool};
use std::io::{self, IoSlice, Write};

/// The most messages written by one call.
pub const BATCH: usize = 32;
/// Stop taking messages into a batch past this many bytes.
const BATCH_BYTES: usize = 256 * 1024;

/// A ring of up to [`BATCH`] messages, kept inline so that a writer's
/// outbox costs no allocation of its own.
pub struct Outbox {
    ring: [Option<Msg>; BATCH],
    first: usize,
    len: usize,
    /// Bytes of the first message already written.
    written: usize,
    bytes: usize,
}

impl Default for Outbox {
    fn default() -> Outbox {
        Outbox {
            ring: std::array::from_fn(|_| None),
            first: 0,
            len: 0,
            written: 0,
            bytes: 0,
        }
    }
}

/// How a flush ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Flushed {
    /// Everything was written; this many messages went out.
    All(usize),
    /// The socket took what it could; this many messages went out whole.
    Blocked(usize),
}

impl Outbox {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the batch should be written before more is taken.
    pub fn is_full(&self) -> bool {
        self.len == BATCH || self.bytes >= BATCH_BYTES
    }

    /// Whether the last message waits for the rest of its reply
    /// ([`Msg::continued`]) and there is room for it: a writer leaves the
    /// batch unwritten until then.
    pub fn awaits_rest(&self) -> bool {
        !self.is_full()
            && self.len > 0
            && self.ring[(self.first + self.len - 1) % BATCH]
                .as_ref()
                .is_some_and(|m| m.continued)
    }

    pub fn push(&mut self, m: Msg) {
        debug_assert!(self.len < BATCH, "push to a full outbox");
        self.bytes += m.bytes.len();
        self.ring[(self.first + self.len) % BATCH] = Some(m);
        self.len += 1;
    }

    /// Writes what the outbox holds, giving written messages back to
    /// `pool`; an error other than `WouldBlock` means the connection failed.
    pub fn flush(&mut self, mut stream: impl Write, pool: &MsgPool) -> io::Result<Flushed> {
        let mut sent = 0;
        // Messages with no bytes (the empty last piece of a body) leave
        // without a write: a write of nothing would look like a failure.
        self.advance(0, pool, &mut sent);
        while self.len > 0 {
            let n = {
                let mut slices = [IoSlice::new(&[]); BATCH];
                for (k, s) in slices.iter_mut().enumerate().take(self.len) {
                    let m = self.ring[(self.first + k) % BATCH]
                        .as_ref()
                        .expect("a message");
                    let from = if k == 0 { self.written } else { 0 };
                    *s = IoSlice::new(&m.bytes[from..]);
                }
                match stream.write_vectored(&slices[..self.len]) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Ok(Flushed::Blocked(sent))
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            if n == 0 && self.bytes > self.written {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.advance(n, pool, &mut sent);
        }
        Ok(Flushed::All(sent))
    }

    /// [`Outbox::flush`] to a connection its reactor watches. A writer is
    /// woken by writable readiness only after it asked for it
    /// ([`flick_runtime::io::Reactor::want_writable`]), so that a socket
    /// merely writable when its reader's bytes arrive does not run it for
    /// nothing: where the socket is full (or not yet connected) it asks,
    /// then tries once more, as the readiness may have come before it
    /// asked.
    pub fn flush_to(&mut self, conn: &crate::conn::Conn, pool: &MsgPool) -> io::Result<Flushed> {
        let sent = match self.flush(&conn.stream, pool) {
            Ok(Flushed::Blocked(sent)) => sent,
            Err(e) if e.kind() == io::ErrorKind::NotConnected => 0,
            done => return done,
        };
        conn.want_writable();
        Ok(match self.flush(&conn.stream, pool)? {
            Flushed::Blocked(more) => Flushed::Blocked(sent + more),
            Flushed::All(more) => Flushed::All(sent + more),
        })
    }

    /// `n` more bytes were written: the messages they complete leave.
    /// Messages with nothing left to write leave too.
    fn advance(&mut self, mut n: usize, pool: &MsgPool, sent: &mut usize) {
        while self.len > 0 {
            let at = self.first;
            let left = self.ring[at].as_ref().expect("a message").bytes.len() - self.written;
            if n < left {
                self.written += n;
                return;
            }
            n -= left;
            let m = self.ring[at].take().expect("a message");
            self.bytes -= m.bytes.len();
            pool.give(m);
            self.first = (self.first + 1) % BATCH;
            self.len -= 1;
            self.written = 0;
            *sent += 1;
        }
    }

    /// Gives every message back to `pool` unwritten.
    pub fn clear(&mut self, pool: &MsgPool) {
        while self.len > 0 {
            if let Some(m) = self.ring[self.first].take() {
                pool.give(m);
            }
            self.first = (self.first + 1) % BATCH;
            self.len -= 1;
        }
        self.written = 0;
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that takes at most `cap` bytes per call, then blocks.
    struct Trickle {
        out: Vec<u8>,
        cap: usize,
        calls: usize,
        budget: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[IoSlice::new(b)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            if self.budget == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.budget -= 1;
            self.calls += 1;
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(self.cap - n);
                self.out.extend_from_slice(&b[..take]);
                n += take;
                if n == self.cap {
                    break;
                }
            }
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn msg(pool: &MsgPool, s: &str) -> Msg {
        let mut m = pool.take();
        m.bytes.extend_from_slice(s.as_bytes());
        m
    }

    #[test]
    fn messages_go_out_whole_and_in_order_across_short_writes() {
        let pool = MsgPool::new(64, 1, 0, 0);
        let mut o = Outbox::default();
        for s in ["alpha ", "beta ", "gamma ", "delta"] {
            o.push(msg(&pool, s));
        }
        let mut sock = Trickle {
            out: Vec::new(),
            cap: 4,
            calls: 0,
            budget: 3,
        };
        // Three calls of 4 bytes: "alpha beta g", two messages whole.
        assert_eq!(o.flush(&mut sock, &pool).unwrap(), Flushed::Blocked(2));
        assert_eq!(sock.out, b"alpha beta g");
        sock.budget = 100;
        assert_eq!(o.flush(&mut sock, &pool).unwrap(), Flushed::All(2));
        assert_eq!(sock.out, b"alpha beta gamma delta");
        assert!(o.is_empty());
        assert_eq!(pool.available(), 4, "every message went back");
    }

    #[test]
    fn a_continued_reply_waits_for_its_rest_unless_the_batch_is_full() {
        let pool = MsgPool::new(64, 1, 0, 0);
        let mut o = Outbox::default();
        assert!(!o.awaits_rest());
        let mut value = msg(&pool, "VALUE k 0 1\r\nv\r\n");
        value.continued = true;
        o.push(value);
        assert!(o.awaits_rest());
        o.push(msg(&pool, "END\r\n"));
        assert!(!o.awaits_rest(), "the reply is complete");
        while !o.is_full() {
            let mut m = msg(&pool, "STAT x 1\r\n");
            m.continued = true;
            o.push(m);
        }
        assert!(!o.awaits_rest(), "a full batch goes out");
        // A recycled message does not keep the mark.
        o.clear(&pool);
        assert!(!pool.take().continued);
    }

    #[test]
    fn empty_messages_leave_without_a_write() {
        let pool = MsgPool::new(64, 1, 0, 0);
        let mut o = Outbox::default();
        o.push(msg(&pool, ""));
        let mut sock = Trickle {
            out: Vec::new(),
            cap: 8,
            calls: 0,
            budget: 100,
        };
        assert_eq!(o.flush(&mut sock, &pool).unwrap(), Flushed::All(1));
        assert_eq!(sock.calls, 0);
        o.push(msg(&pool, "head"));
        o.push(msg(&pool, ""));
        o.push(msg(&pool, "tail"));
        o.push(msg(&pool, ""));
        assert_eq!(o.flush(&mut sock, &pool).unwrap(), Flushed::All(4));
        assert_eq!(sock.out, b"headtail");
        assert!(o.is_empty());
    }

    #[test]
    fn one_call_writes_a_whole_batch() {
        let pool = MsgPool::new(64, 1, 0, 0);
        let mut o = Outbox::default();
        while !o.is_full() {
            o.push(msg(&pool, "get k\r\n"));
        }
        let mut sock = Trickle {
            out: Vec::new(),
            cap: usize::MAX,
            calls: 0,
            budget: 100,
        };
        assert_eq!(o.flush(&mut sock, &pool).unwrap(), Flushed::All(BATCH));
        assert_eq!(sock.calls, 1);
        assert_eq!(sock.out.len(), 7 * BATCH);
    }
}
