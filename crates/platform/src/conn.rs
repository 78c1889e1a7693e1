//! The input and output tasks of a connection: bytes to messages with the
//! grammar's parser, messages to bytes on the socket. The socket is
//! non-blocking; the reactor wakes these tasks when it may make progress.

use crate::msg::{Msg, MsgPool, Part, Values};
use crate::outbox::Flushed;
use crate::stats::Stats;
use flick_runtime::io::{IoToken, Reactor};
use flick_runtime::{Receiver, Sender, TaskStatus, Timeslice, TryRecvError, TrySendError};
use flick_wire::{Parser, Progress, PropertyRef};
use mio::net::TcpStream;
use std::io::{ErrorKind, Read};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// Where a client connection goes when its last task lets go of it: back
/// to the service to wait for its next bytes with no instance (parked), or
/// closed.
pub trait ClientSlot: Send + Sync {
    /// Takes an idle connection whose instance ended.
    fn park(&self, stream: TcpStream);
    /// A client connection closed.
    fn closed(&self);
    /// Whether a connection at rest goes on to another version of the
    /// service rather than close (a version draining for its successor):
    /// its reader then lets go of it ([`Conn::hand_over`]), and its drop
    /// gives it to [`ClientSlot::park`].
    fn hands_over(&self) -> bool {
        false
    }
}

/// [`Conn::rest`]'s low two bits: the connection's reader is reading (or
/// may be), ...
const OPEN: u32 = 0;
/// ... it is idle at a message boundary with nothing buffered, ...
pub const RESTING: u32 = 1;
/// ... the instance gave the connection up to be parked: the reader reads
/// no more and nothing shuts the socket down, ...
const PARKED: u32 = 2;
/// ... or it is to be closed even so (the instance ended badly).
const CLOSING: u32 = 3;

/// A socket shared by its two tasks; dropping the last one closes it.
pub struct Conn {
    pub stream: TcpStream,
    pub token: Option<IoToken>,
    pub reactor: Arc<Reactor>,
    pub stats: Arc<Stats>,
    /// The process channel this connection serves, for per-channel counters.
    pub chan: usize,
    /// Its connecting was refused: the peer was never reached (so its
    /// requests get the fault reply for an unreachable peer).
    pub refused: AtomicBool,
    /// A client connection: what its closing (or parking) tells the service.
    pub client: Option<Arc<dyn ClientSlot>>,
    /// Whether the reader says when it rests, so that the instance may
    /// park the connection (see [`Conn::rest`]).
    pub parkable: bool,
    /// The reader's state in the low two bits (`OPEN`, `RESTING`, `PARKED`,
    /// `CLOSING`), above them a count of its wake-ups from rest, so that a
    /// rest seen twice is known to be one rest, unbroken.
    pub rest: AtomicU32,
}

impl Conn {
    /// Notes an error of a read or write on the connection.
    pub fn failed_with(&self, e: &std::io::Error) {
        if e.kind() == ErrorKind::ConnectionRefused {
            self.refused.store(true, Ordering::Release);
        }
    }

    /// The writer found the socket full: its next writable readiness
    /// wakes it (see [`crate::outbox::Outbox::flush_to`]).
    pub fn want_writable(&self) {
        if let Some(t) = self.token {
            self.reactor.want_writable(t);
        }
    }

    /// Whether the peer may have closed since the last wake-up.
    pub fn hung_up(&self) -> bool {
        self.token.is_none_or(|t| self.reactor.take_hangup(t))
    }

    /// The reader is idle with nothing buffered.
    fn resting(&self) {
        let _ = self
            .rest
            .fetch_update(Ordering::Release, Ordering::Relaxed, |w| {
                (w & 3 == OPEN).then_some(w | RESTING)
            });
    }

    /// The reader was woken: `false` if the connection was parked, and
    /// the reader must read no more.
    fn wake_from_rest(&self) -> bool {
        let r = self
            .rest
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| match w & 3 {
                RESTING => Some((w & !3).wrapping_add(4) | OPEN),
                _ => None,
            });
        !matches!(r, Err(w) if w & 3 == PARKED)
    }

    /// The rest word: compare two readings to tell an unbroken rest.
    pub fn rest_word(&self) -> u32 {
        self.rest.load(Ordering::Acquire)
    }

    /// Parks the connection if its reader has rested since `word` was read;
    /// the reader must then be woken, to let go.
    pub fn park(&self, word: u32) -> bool {
        word & 3 == RESTING
            && self
                .rest
                .compare_exchange(
                    word,
                    (word & !3) | PARKED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Whether the connection is being parked (not shut down or closed).
    pub fn parked(&self) -> bool {
        self.rest.load(Ordering::Acquire) & 3 == PARKED
    }

    /// The reader lets go of a connection with nothing of a next request
    /// read, to be handed on when its last task does, as a parked one is;
    /// unless it is to close (the instance ended badly, or the client was
    /// told its session ends).
    pub fn hand_over(&self) {
        let _ = self
            .rest
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| match w & 3 {
                OPEN | RESTING => Some((w & !3) | PARKED),
                _ => None,
            });
    }

    /// The session ends (the client asked for it, or was told so): the
    /// connection closes when its last task lets go, whatever its reader
    /// did, and is never parked or handed on.
    pub fn end_session(&self) {
        let _ = self
            .rest
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                (w & 3 != CLOSING).then_some((w & !3) | CLOSING)
            });
    }

    /// Closes the connection after all, when its last task lets go.
    pub fn unpark(&self) {
        let _ = self
            .rest
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
                (w & 3 == PARKED).then_some((w & !3) | CLOSING)
            });
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(t) = self.token {
            self.reactor.deregister_stream(&mut self.stream, t);
        }
        if let (Some(client), true) = (&self.client, self.parked()) {
            // The socket outlives this record: a duplicate of its
            // descriptor waits in the service, and this one closes.
            use std::os::fd::AsFd;
            if let Ok(fd) = self.stream.as_fd().try_clone_to_owned() {
                client.park(TcpStream::from_std(std::net::TcpStream::from(fd)));
                return;
            }
        }
        if self.client.is_some() {
            linger::close(&self.stream);
        }
        self.stats.connections_open.fetch_sub(1, Ordering::Relaxed);
        if let Some(client) = &self.client {
            client.closed();
        }
    }
}

/// Closing a client connection the way nginx does ("lingering close"):
/// its end is sent, then what the client still sends (a body no one read)
/// is read and dropped for a while before the socket closes. A socket
/// closed with bytes unread, or that are still to come, is reset by the
/// kernel, which drops what it had yet to send of the last replies.
/// One thread does it for the process, for at most [`LINGER`] and
/// [`DRAIN_MAX`] bytes a connection, [`MAX_LINGERING`] connections at a
/// time (past them a connection closes at once); it holds no instance.
mod linger {
    use mio::net::TcpStream;
    use mio::{Events, Interest, Poll, Token, Waker};
    use std::io::{ErrorKind, Read};
    use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    const LINGER: Duration = Duration::from_secs(5);
    const DRAIN_MAX: usize = 64 * 1024;
    const MAX_LINGERING: usize = 1024;
    const WAKE: Token = Token(usize::MAX);

    struct Closer {
        tx: SyncSender<TcpStream>,
        waker: Waker,
    }

    static CLOSER: OnceLock<Option<Closer>> = OnceLock::new();

    /// Sends the connection's end, and leaves its socket to close once the
    /// client has ended too, or the linger time passed; `stream` may be
    /// dropped as soon as this returns.
    pub fn close(stream: &TcpStream) {
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut drained = 0;
        if drain(stream, &mut [0; 512], &mut drained) {
            return;
        }
        let Some(closer) = CLOSER.get_or_init(start) else {
            return;
        };
        use std::os::fd::AsFd;
        let Ok(fd) = stream.as_fd().try_clone_to_owned() else {
            return;
        };
        let dup = TcpStream::from_std(std::net::TcpStream::from(fd));
        // Full: this one closes now.
        if closer.tx.try_send(dup).is_ok() {
            let _ = closer.waker.wake();
        }
    }

    /// Reads and drops what the socket has: `true` once the connection
    /// ended, failed or gave [`DRAIN_MAX`] bytes.
    fn drain(stream: &TcpStream, buf: &mut [u8], drained: &mut usize) -> bool {
        loop {
            match (&*stream).read(buf) {
                Ok(0) => return true,
                Ok(n) => {
                    *drained += n;
                    if *drained >= DRAIN_MAX {
                        return true;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return e.kind() != ErrorKind::WouldBlock,
            }
        }
    }

    fn start() -> Option<Closer> {
        let poll = Poll::new().ok()?;
        let waker = Waker::new(poll.registry(), WAKE).ok()?;
        let (tx, rx) = sync_channel(MAX_LINGERING);
        std::thread::Builder::new()
            .name("flick-linger".into())
            .spawn(move || run(poll, rx))
            .ok()?;
        Some(Closer { tx, waker })
    }

    struct Lingering {
        stream: TcpStream,
        until: Instant,
        drained: usize,
    }

    fn run(mut poll: Poll, rx: Receiver<TcpStream>) {
        let mut slots: Vec<Option<Lingering>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut events = Events::with_capacity(256);
        let mut buf = [0u8; 16 * 1024];
        loop {
            let next = slots.iter().flatten().map(|l| l.until).min();
            let timeout = next.map(|t| t.saturating_duration_since(Instant::now()));
            if let Err(e) = poll.poll(&mut events, timeout) {
                if e.kind() != ErrorKind::Interrupted {
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            }
            for ev in events.iter() {
                let i = ev.token().0;
                let done = slots
                    .get_mut(i)
                    .and_then(Option::as_mut)
                    .is_some_and(|l| drain(&l.stream, &mut buf, &mut l.drained));
                if done {
                    end(&poll, &mut slots, &mut free, i);
                }
            }
            let now = Instant::now();
            while let Ok(stream) = rx.try_recv() {
                let i = match free.pop() {
                    Some(i) => i,
                    None if slots.len() < MAX_LINGERING => {
                        slots.push(None);
                        slots.len() - 1
                    }
                    None => continue,
                };
                let mut l = Lingering {
                    stream,
                    until: now + LINGER,
                    drained: 0,
                };
                // Registered, it is reported readable if it is already.
                match poll
                    .registry()
                    .register(&mut l.stream, Token(i), Interest::READABLE)
                {
                    Ok(()) => slots[i] = Some(l),
                    Err(_) => free.push(i),
                }
            }
            for i in 0..slots.len() {
                if slots[i].as_ref().is_some_and(|l| l.until <= now) {
                    end(&poll, &mut slots, &mut free, i);
                }
            }
        }
    }

    fn end(poll: &Poll, slots: &mut [Option<Lingering>], free: &mut Vec<usize>, i: usize) {
        if let Some(mut l) = slots[i].take() {
            let _ = poll.registry().deregister(&mut l.stream);
            free.push(i);
        }
    }
}

/// What reading a connection gave.
pub enum Inbound {
    /// A whole message.
    Message(Msg),
    /// Nothing more for now: wait for the socket.
    Idle,
    /// The peer closed, or the socket failed.
    Closed,
    /// Bytes the grammar rejects, or a message larger than allowed.
    Malformed,
    /// A message that did not parse, with the status the grammar gives its
    /// error; with `resume`, it was skipped through the grammar's `%resync`
    /// delimiter and the connection reads on; with `quiet`, its parsed
    /// part says it gets no reply even so (`%quiet_reject`).
    /// `partial` holds what parsed of it (its values, over its bytes so
    /// far) where a reply must echo some of them: a binary request skipped
    /// by the length its header gave (`%discard` without `%resync`).
    Rejected {
        status: Option<u16>,
        resume: bool,
        quiet: bool,
        partial: Option<Msg>,
    },
}

/// A connection's read side: a buffer of received bytes, parsed into
/// pooled messages with the grammar.
pub struct ReadSide {
    pub parser: Parser,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The most bytes a message may need in the buffer at once.
    max: usize,
    /// Where reading resumes after a request that does not parse
    /// (`%resync`), and whether input is being skipped up to it.
    resync: Option<Arc<[u8]>>,
    skipping: bool,
    /// Bytes still to discard once past the `%resync` delimiter: the rest
    /// of a request whose extent its parsed part gave (`%discard`, a
    /// Memcached data block memcached itself would read and drop).
    discard: u64,
    /// A message is streaming (`&stream`): its head went out, its body
    /// goes in pieces; `head` bytes at the buffer start were in the head.
    streaming: bool,
    head: usize,
    /// What the parser said right after a head, before the head went out,
    /// or right after a piece of a body, when it was asked whether that
    /// piece ended the message.
    after_head: Option<Result<Progress, flick_wire::WireError>>,
    /// What the parser said after the first piece of a body, where it was
    /// asked before the piece went (`read_whole`).
    after_piece: Option<Result<Progress, flick_wire::WireError>>,
    /// Whether a streaming message whose body comes with its head goes as
    /// one message (`read_whole`): replies read from a backend.
    whole_replies: bool,
    /// A message whose whole body, head included, fits in `hold` bytes is
    /// read and checked to its end before any of it goes on, so a body
    /// that breaks its framing is refused with nothing of it sent (and a
    /// slow one holds no backend meanwhile); a larger one streams. 0:
    /// every body streams. The grammar's `%buffer_body`, where it has one,
    /// says which messages may wait (not one whose sender waits for an
    /// interim reply before it sends its body).
    hold: usize,
    buffer_body: Option<PropertyRef>,
    /// The head of the message being held, and how many bytes from
    /// `start` the parser has finished with in it.
    held: Option<Msg>,
    held_len: usize,
    /// Pieces owed once a held head went out: the buffer's first bytes,
    /// less the head's, as a body piece or the body's end.
    owed: Option<(usize, Part)>,
    /// The last read took less than there was room for: the socket had
    /// nothing more then, and readiness is edge-triggered, so another read
    /// before the next wake-up would only say `WouldBlock`.
    drained: bool,
    /// The peer may have closed: reads go on until one says so, as the end
    /// of the stream may have come with the last bytes.
    hangup: bool,
    /// A read said the connecting was refused.
    pub refused: bool,
    /// The request the grammar sends in place of one that did not parse
    /// (`%reject_send`), handed on as the next message: it reaches the
    /// program's rule, and so the backend that owns its key, after the
    /// rejected request's answer and before anything read later.
    instead: Option<Msg>,
    /// Made when its service started (see [`crate::graph_pool::GraphPool`]).
    pub(crate) made_ahead: bool,
}

impl ReadSide {
    pub fn new(parser: Parser, initial: usize, max: usize) -> ReadSide {
        let resync = parser.grammar().resync(parser.unit()).map(Arc::from);
        ReadSide {
            parser,
            buf: vec![0; initial.min(max).max(1)],
            start: 0,
            end: 0,
            max,
            resync,
            skipping: false,
            discard: 0,
            streaming: false,
            head: 0,
            after_head: None,
            after_piece: None,
            whole_replies: false,
            hold: 0,
            buffer_body: None,
            held: None,
            held_len: 0,
            owed: None,
            drained: false,
            hangup: false,
            refused: false,
            instead: None,
            made_ahead: false,
        }
    }

    /// Reads a streaming message whose body comes with its head as one
    /// message (see `read_whole`), as a backend's replies are read.
    pub fn whole_replies(mut self) -> ReadSide {
        self.whole_replies = true;
        self
    }

    /// Holds back a message whose whole body fits in `hold` bytes, head
    /// included, until its body is complete and checked; the buffer grows
    /// up to at least that much.
    pub fn holding(mut self, hold: usize) -> ReadSide {
        self.hold = hold;
        self.max = self.max.max(hold.saturating_add(4096));
        self.buffer_body = self
            .parser
            .grammar()
            .property_ref(self.parser.unit(), "buffer_body");
        self
    }

    /// Whether the message whose head the parser just read may be held.
    fn may_hold(&self, head: usize) -> bool {
        head <= self.hold
            && self.buffer_body.as_ref().is_none_or(|p| {
                self.parser
                    .grammar()
                    .property_at(p, self.parser.slots(), &self.buf[self.start..self.end])
                    .is_some_and(|v| v != 0)
            })
    }

    /// Makes `m`, the head of a streaming message just read, the whole
    /// message where its body was read with it and ends in the first
    /// piece (a reply with a `Content-Length` body): one message where
    /// there were two, with the body after the head (`Msg::body_at`).
    fn read_whole(&mut self, m: &mut Msg) {
        let Some(Ok(Progress::Stream(k))) = self.after_head else {
            return;
        };
        let head = self.head;
        if k <= head {
            return;
        }
        match self.parser.parse(&self.buf[self.start + k..self.end]) {
            Ok(Progress::Done(0)) => {
                self.make_whole(m, head, k);
                self.streaming = false;
                self.after_head = None;
                self.parser.reset();
            }
            // The body goes on in pieces, as it would have: what the
            // parser said is kept for the next call, after the first
            // piece (which `next` makes from `after_head`).
            next => self.after_piece = Some(next),
        }
    }

    /// The held message, complete: its head with its body after it
    /// (`Msg::body_at`), as one whole message.
    fn release_whole(&mut self) -> Option<Msg> {
        let mut m = self.held.take()?;
        let len = self.held_len;
        self.make_whole(&mut m, self.head.min(len), len);
        self.held_len = 0;
        Some(m)
    }

    /// Makes `m`, the head of the message whose `len` bytes (`head` of
    /// them its head's) begin the buffer, that whole message: its body
    /// after its head (`Msg::body_at`). The buffer goes on past it.
    fn make_whole(&mut self, m: &mut Msg, head: usize, len: usize) {
        if len > head {
            m.bytes
                .extend_from_slice(&self.buf[self.start + head..self.start + len]);
            m.body_at = head as u32;
        }
        m.part = Part::Whole;
        self.start += len;
        self.head = 0;
    }

    /// Lets the held head go; the body bytes read with it follow as the
    /// next message, and the rest streams.
    fn release(&mut self, part: Part) -> Option<Msg> {
        let m = self.held.take()?;
        self.owed = Some((self.held_len, part));
        self.held_len = 0;
        self.streaming = true;
        Some(m)
    }

    /// The task was woken (or runs again): the socket may have more;
    /// `hangup` if its peer may have closed.
    pub fn woken(&mut self, hangup: bool) {
        self.drained = false;
        self.hangup |= hangup;
    }

    /// A piece of a streaming message's body: the buffer's first `n` bytes
    /// less what its head already carried.
    fn piece(&mut self, n: usize, pool: &MsgPool, part: Part) -> Msg {
        let mut m = pool.take();
        let from = self.start + self.head.min(n);
        m.bytes.extend_from_slice(&self.buf[from..self.start + n]);
        m.part = part;
        self.head = self.head.saturating_sub(n);
        self.start += n;
        m
    }

    /// Skips through the `%resync` delimiter, then the bytes `%discard`
    /// said to drop after it; `true` once past them.
    fn skip(&mut self) -> bool {
        if !self.skipping {
            let n = self.discard.min((self.end - self.start) as u64);
            self.start += n as usize;
            self.discard -= n;
            return self.discard == 0;
        }
        let Some(d) = &self.resync else {
            return true;
        };
        let buffered = &self.buf[self.start..self.end];
        match memchr::memmem::find(buffered, d) {
            Some(at) => {
                self.start += at + d.len();
                self.skipping = false;
                self.parser.reset();
                self.skip()
            }
            None => {
                // Keep what could be the start of the delimiter.
                self.start = self.end - buffered.len().min(d.len() - 1);
                false
            }
        }
    }

    /// The request the grammar sends in place of the one whose parse just
    /// failed (`%reject_send`), parsed as a request read from the
    /// connection would be; `None` where there is none, or it does not
    /// parse whole. Leaves the parser reset.
    fn made_instead(&mut self, pool: &MsgPool) -> Option<Msg> {
        let mut m = pool.take();
        let made = self.parser.grammar().reject_send(
            self.parser.unit(),
            self.parser.slots(),
            &self.buf[self.start..self.end],
            &mut m.bytes,
        );
        self.parser.reset();
        let whole = made
            && matches!(self.parser.parse(&m.bytes), Ok(Progress::Done(n)) if n == m.bytes.len());
        if !whole {
            self.parser.reset();
            pool.give(m);
            return None;
        }
        let values = Values::parsed(&self.parser);
        pool.copy_values(&mut m, values, self.parser.slots());
        self.parser.reset();
        Some(m)
    }

    /// What the request the next reply answers said of it
    /// (`%reply_context`).
    pub fn set_reply_context(&mut self, context: i128) {
        self.parser.set_reply_context(context);
    }

    /// At a message boundary with nothing buffered: what comes next
    /// starts a new message.
    pub fn at_rest(&self) -> bool {
        self.start == self.end && self.between_messages()
    }

    /// At a message boundary, with nothing owed, held, skipped or put
    /// in front: what is buffered (if anything) starts a new message.
    fn between_messages(&self) -> bool {
        !self.streaming
            && !self.skipping
            && self.discard == 0
            && self.after_head.is_none()
            && self.after_piece.is_none()
            && self.instead.is_none()
            && self.held.is_none()
            && self.owed.is_none()
    }

    /// Appends the next message to `to` if it is whole in what is
    /// buffered and `accept` takes it (given its slots and bytes),
    /// without reading the socket and without making a message of it;
    /// otherwise nothing is consumed (what was parsed of it is parsed
    /// again by [`ReadSide::next`], which also reports what does not
    /// parse). Whether it was appended.
    pub fn append_buffered(
        &mut self,
        to: &mut Vec<u8>,
        accept: impl FnOnce(&[flick_wire::Slot], &[u8]) -> bool,
    ) -> bool {
        if self.end == self.start || !self.between_messages() {
            return false;
        }
        let taken = match self.parser.parse(&self.buf[self.start..self.end]) {
            Ok(Progress::Done(n)) => {
                let bytes = &self.buf[self.start..self.start + n];
                accept(self.parser.slots(), bytes).then(|| {
                    to.extend_from_slice(bytes);
                    n
                })
            }
            _ => None,
        };
        self.parser.reset();
        if let Some(n) = taken {
            self.start += n;
        }
        taken.is_some()
    }

    /// Empty, for another connection.
    pub fn reset(&mut self) {
        self.parser.reset();
        self.start = 0;
        self.end = 0;
        self.skipping = false;
        self.discard = 0;
        self.streaming = false;
        self.head = 0;
        self.after_head = None;
        self.after_piece = None;
        self.held = None;
        self.held_len = 0;
        self.owed = None;
        self.drained = false;
        self.hangup = false;
        self.refused = false;
        self.instead = None;
    }

    /// The next message: parsed from what is buffered, reading the socket
    /// when the buffer runs dry.
    pub fn next(&mut self, stream: &TcpStream, pool: &MsgPool) -> Inbound {
        if let Some(m) = self.instead.take() {
            return Inbound::Message(m);
        }
        if let Some((n, part)) = self.owed.take() {
            let m = self.piece(n, pool, part);
            if part == Part::End {
                self.streaming = false;
                return Inbound::Message(m);
            }
            if !m.bytes.is_empty() {
                return Inbound::Message(m);
            }
            pool.give(m);
        }
        loop {
            if (self.skipping || self.discard > 0) && !self.skip() {
                // Nothing to parse until the delimiter comes, and what
                // is discarded after it.
            } else if self.end > self.start
                || self.after_head.is_some()
                || self.streaming
                || self.held.is_some()
            {
                // (A body may be over with nothing buffered: `Done(0)`.)
                let progress = match self.after_head.take() {
                    Some(p) => p,
                    None => self
                        .parser
                        .parse(&self.buf[self.start + self.held_len..self.end]),
                };
                match progress {
                    // A held message is complete and checked: it goes as
                    // one message, its body after its head.
                    Ok(Progress::Done(n)) if self.held.is_some() => {
                        self.held_len += n;
                        self.parser.reset();
                        if let Some(m) = self.release_whole() {
                            return Inbound::Message(m);
                        }
                    }
                    Ok(Progress::Stream(n)) if self.held.is_some() => {
                        self.held_len += n;
                        if self.held_len > self.hold {
                            if let Some(m) = self.release(Part::Body) {
                                return Inbound::Message(m);
                            }
                        }
                        continue;
                    }
                    Ok(Progress::Done(n)) if self.streaming => {
                        self.streaming = false;
                        let m = self.piece(n, pool, Part::End);
                        self.parser.reset();
                        return Inbound::Message(m);
                    }
                    Ok(Progress::Done(n)) => {
                        let mut m = pool.take();
                        m.bytes
                            .extend_from_slice(&self.buf[self.start..self.start + n]);
                        let values = Values::parsed(&self.parser);
                        pool.copy_values(&mut m, values, self.parser.slots());
                        self.start += n;
                        self.parser.reset();
                        return Inbound::Message(m);
                    }
                    // The head of a message whose body streams: its values
                    // and bytes now, the body in pieces after it.
                    Ok(Progress::Head(n)) if self.may_hold(n) => {
                        let mut m = pool.take();
                        m.bytes
                            .extend_from_slice(&self.buf[self.start..self.start + n]);
                        let values = Values::parsed(&self.parser);
                        pool.copy_values(&mut m, values, self.parser.slots());
                        m.part = Part::Head;
                        self.head = n;
                        self.held = Some(m);
                        self.held_len = 0;
                        continue;
                    }
                    Ok(Progress::Head(n)) => {
                        // A body the grammar refuses (too long, a bad first
                        // chunk) refuses the message before its head goes
                        // anywhere: parse on at once, and keep the answer.
                        match self.parser.parse(&self.buf[self.start..self.end]) {
                            Err(e) => {
                                let status = e.status;
                                return Inbound::Rejected {
                                    status,
                                    resume: false,
                                    quiet: false,
                                    partial: None,
                                };
                            }
                            Ok(p) => self.after_head = Some(Ok(p)),
                        }
                        let mut m = pool.take();
                        m.bytes
                            .extend_from_slice(&self.buf[self.start..self.start + n]);
                        let values = Values::parsed(&self.parser);
                        pool.copy_values(&mut m, values, self.parser.slots());
                        m.part = Part::Head;
                        self.streaming = true;
                        self.head = n;
                        if self.whole_replies {
                            self.read_whole(&mut m);
                        }
                        return Inbound::Message(m);
                    }
                    Ok(Progress::Stream(n)) => {
                        let mut m = self.piece(n, pool, Part::Body);
                        if m.bytes.is_empty() {
                            pool.give(m);
                            continue;
                        }
                        // A piece that ends its message is the last one
                        // (a body read whole is one message, not a piece
                        // and an empty end); what the parser says
                        // otherwise is kept for the next call.
                        let next = match self.after_piece.take() {
                            Some(next) => next,
                            None => self.parser.parse(&self.buf[self.start..self.end]),
                        };
                        match next {
                            Ok(Progress::Done(0)) => {
                                m.part = Part::End;
                                self.streaming = false;
                                self.parser.reset();
                            }
                            next => self.after_head = Some(next),
                        }
                        return Inbound::Message(m);
                    }
                    Ok(Progress::NeedMore) => {}
                    Err(e) => {
                        let status = e.status;
                        // A held message goes no further: nothing of it
                        // was sent.
                        if let Some(m) = self.held.take() {
                            pool.give(m);
                            self.held_len = 0;
                            self.head = 0;
                        }
                        if self.resync.is_some() && !self.streaming {
                            self.skipping = true;
                            // What the part that parsed says of the rest.
                            let said = |name| {
                                self.parser.grammar().property(
                                    self.parser.unit(),
                                    name,
                                    self.parser.slots(),
                                    &self.buf[self.start..self.end],
                                )
                            };
                            let quiet = said("quiet_reject").is_some_and(|q| q != 0);
                            self.discard = said("discard")
                                .and_then(|n| u64::try_from(n).ok())
                                .unwrap_or(0);
                            self.instead = self.made_instead(pool);
                            return Inbound::Rejected {
                                status,
                                resume: true,
                                quiet,
                                partial: None,
                            };
                        }
                        // No delimiter to resync at, but a header that said
                        // how long the whole message is (Memcached binary):
                        // that many bytes are skipped from its start, and
                        // the reply echoes what the header said.
                        let whole = (self.resync.is_none() && !self.streaming)
                            .then(|| {
                                self.parser.grammar().property(
                                    self.parser.unit(),
                                    "discard",
                                    self.parser.slots(),
                                    &self.buf[self.start..self.end],
                                )
                            })
                            .flatten()
                            .and_then(|n| u64::try_from(n).ok())
                            .filter(|n| *n > 0);
                        if let Some(n) = whole {
                            let mut m = pool.take();
                            m.bytes.extend_from_slice(&self.buf[self.start..self.end]);
                            let values = Values::parsed(&self.parser);
                            pool.copy_values(&mut m, values, self.parser.slots());
                            // (Resets the parser.)
                            self.instead = self.made_instead(pool);
                            self.discard = n;
                            return Inbound::Rejected {
                                status,
                                resume: true,
                                quiet: false,
                                partial: Some(m),
                            };
                        }
                        return Inbound::Rejected {
                            status,
                            resume: false,
                            quiet: false,
                            partial: None,
                        };
                    }
                }
            }
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end == self.buf.len() {
                // No room to hold more: what is held goes, and the rest
                // streams.
                if self.buf.len() >= self.max && self.held.is_some() {
                    if let Some(m) = self.release(Part::Body) {
                        return Inbound::Message(m);
                    }
                }
                if self.buf.len() >= self.max {
                    return Inbound::Malformed;
                }
                let grown = (self.buf.len() * 2).clamp(4096, self.max);
                self.buf.resize(grown, 0);
            }
            if self.drained && !self.hangup {
                return Inbound::Idle;
            }
            let room = self.buf.len() - self.end;
            match (&*stream).read(&mut self.buf[self.end..]) {
                // A body that runs to the end of the connection ends here.
                Ok(0) if self.streaming => {
                    self.streaming = false;
                    return match self.parser.finish(&self.buf[self.start..self.end]) {
                        Ok(Progress::Done(n)) => Inbound::Message(self.piece(n, pool, Part::End)),
                        _ => Inbound::Closed,
                    };
                }
                Ok(0) => return Inbound::Closed,
                Ok(n) => {
                    self.end += n;
                    self.drained = n < room;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Inbound::Idle,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.refused |= e.kind() == ErrorKind::ConnectionRefused;
                    return Inbound::Closed;
                }
            }
        }
    }
}

/// What became of a reader's pending message.
pub(crate) enum HandedOn {
    /// Sent (or there was none): read on.
    ReadOn,
    /// The task returns this: the channel is full (the message stays
    /// pending), or the timeslice is used up.
    Stop(TaskStatus),
    /// The channel's receiver is gone (the message stays pending).
    Closed,
}

/// Hands the message a reader holds to its channel, counting it in.
pub(crate) fn hand_on(
    out: &Sender<Msg>,
    pending: &mut Option<Msg>,
    stats: &Stats,
    chan: usize,
    slice: &mut Timeslice,
) -> HandedOn {
    let Some(m) = pending.take() else {
        return HandedOn::ReadOn;
    };
    match out.try_send(m) {
        Ok(()) => {
            stats.message_in(chan);
            if slice.item_done() {
                return HandedOn::Stop(TaskStatus::Yield);
            }
            HandedOn::ReadOn
        }
        // Backpressure: stop reading until the channel has room.
        Err(TrySendError::Full(m)) => {
            *pending = Some(m);
            HandedOn::Stop(TaskStatus::Idle)
        }
        Err(TrySendError::Closed(m)) => {
            *pending = Some(m);
            HandedOn::Closed
        }
    }
}

/// Reads a connection and parses its messages onto a task channel.
pub struct Reader {
    pub conn: Arc<Conn>,
    /// `None` once finished: it went back to the graph pool.
    pub read: Option<ReadSide>,
    /// Where the read side goes when the connection ends (client
    /// connections, whose read sides the graph pool keeps).
    pub graphs: Option<Arc<crate::graph_pool::GraphPool>>,
    pub out: Option<Sender<Msg>>,
    pub pool: Arc<MsgPool>,
    pub pending: Option<Msg>,
    pub stats: Arc<Stats>,
    /// Set when the service shuts down: a client's reader stops once it
    /// has read what already arrived. `None` for peers, whose replies are
    /// still awaited.
    pub draining: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Client connections: how long a request may take from its first
    /// bytes read to its last (`None`: no limit).
    pub request_timeout: Option<RequestTimeout>,
}

/// The limit on how long a client's request may take to arrive, and when
/// the one being read began.
pub struct RequestTimeout {
    pub limit: std::time::Duration,
    /// The reader's own task, which the reactor wakes when the limit is up.
    pub task: flick_runtime::TaskId,
    /// The status the grammar's `%reject` answers a timed-out request
    /// with (HTTP's 408); `None`: the grammar has no such reply, and the
    /// connection just closes (Memcached).
    pub status: Option<u16>,
    /// When the request being read began (its first bytes were seen), and
    /// whether a wake-up is due then.
    pub began: Option<std::time::Instant>,
    pub armed: bool,
}

impl RequestTimeout {
    /// A new request is to be timed from its first bytes.
    fn reset(&mut self) {
        self.began = None;
        self.armed = false;
    }
}

impl Reader {
    fn finish(&mut self) -> TaskStatus {
        if let Some(m) = self.pending.take() {
            self.pool.give(m);
        }
        if self.read.as_ref().is_some_and(|r| r.refused) {
            self.conn.refused.store(true, Ordering::Release);
        }
        // Closing the channel tells the compute task the peer is gone.
        self.out = None;
        // A client's connection is read on as it closes (`linger`): a
        // read side shut now would reset it at the client's next bytes.
        if !self.conn.parked() && self.conn.client.is_none() {
            let _ = self.conn.stream.shutdown(std::net::Shutdown::Read);
        }
        if let (Some(r), Some(g)) = (self.read.take(), &self.graphs) {
            g.give_read_side(r);
        }
        TaskStatus::Done
    }

    /// A client's request did not arrive whole in time: it gets the
    /// grammar's timeout reply and nothing more is read (`None`: the reader
    /// reads on to hand it over), or, where there is none, the connection
    /// closes.
    fn timed_out(&mut self) -> Option<TaskStatus> {
        self.stats.client_timeouts.fetch_add(1, Ordering::Relaxed);
        let status = self.request_timeout.as_ref().and_then(|t| t.status);
        static TIMED_OUT: crate::log::RateLimit = crate::log::RateLimit::new();
        crate::limited!(
            TIMED_OUT,
            warn,
            peer = %peer(&self.conn),
            status = status.unwrap_or(0),
            "a client request not complete within the client request timeout: its connection closes"
        );
        let Some(status) = status else {
            return Some(self.finish());
        };
        // As a request that does not parse and ends its connection: the
        // compute task answers it, then the reader, with no read side,
        // ends.
        if let (Some(r), Some(g)) = (self.read.take(), &self.graphs) {
            g.give_read_side(r);
        }
        let mut m = self.pool.take();
        m.rejected = Some(status);
        self.pending = Some(m);
        None
    }

    pub fn run(&mut self, slice: &mut Timeslice) -> TaskStatus {
        if self.conn.parkable && !self.conn.wake_from_rest() {
            // The instance let the connection go while it was idle: what
            // comes next starts another instance.
            return self.finish();
        }
        if let Some(r) = &mut self.read {
            r.woken(self.conn.hung_up());
        }
        loop {
            let Some(out) = &self.out else {
                return self.finish();
            };
            match hand_on(out, &mut self.pending, &self.stats, self.conn.chan, slice) {
                HandedOn::ReadOn => {}
                HandedOn::Stop(status) => return status,
                HandedOn::Closed => return self.finish(),
            }
            let Some(read) = &mut self.read else {
                return self.finish();
            };
            match read.next(&self.conn.stream, &self.pool) {
                Inbound::Message(m) => {
                    // Something of the request went on (the whole of a held
                    // one): the next part is timed afresh.
                    if let Some(t) = &mut self.request_timeout {
                        t.reset();
                    }
                    self.pending = Some(m);
                }
                Inbound::Idle => {
                    let draining = self
                        .draining
                        .as_ref()
                        .is_some_and(|d| d.load(Ordering::Acquire));
                    let at_rest = self.read.as_ref().is_some_and(ReadSide::at_rest);
                    if draining {
                        let hands_over = self.conn.client.as_ref().is_some_and(|c| c.hands_over());
                        // Handed on between requests, the client's next
                        // request goes to the next version; one begun is
                        // read whole and answered here first.
                        if !hands_over || at_rest {
                            if hands_over {
                                self.conn.hand_over();
                            }
                            return self.finish();
                        }
                    }
                    if self.conn.parkable && at_rest {
                        self.conn.resting();
                    }
                    if let Some(t) = &mut self.request_timeout {
                        if at_rest {
                            t.reset();
                        } else {
                            let now = std::time::Instant::now();
                            let due = *t.began.get_or_insert(now) + t.limit;
                            if now >= due {
                                match self.timed_out() {
                                    Some(status) => return status,
                                    None => continue,
                                }
                            }
                            if !t.armed {
                                t.armed = true;
                                self.conn.reactor.wake_at(t.task, due);
                            }
                        }
                    }
                    return TaskStatus::Idle;
                }
                Inbound::Closed => return self.finish(),
                // This connection ends; others are not affected.
                Inbound::Malformed => {
                    self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    static MALFORMED: crate::log::RateLimit = crate::log::RateLimit::new();
                    crate::limited!(
                        MALFORMED,
                        info,
                        peer = %peer(&self.conn),
                        "a message that does not parse: its connection is closed"
                    );
                    return self.finish();
                }
                // The compute task answers it (`%reject`); the connection
                // reads on, or ends once the answer is through.
                Inbound::Rejected {
                    status,
                    resume: true,
                    quiet: true,
                    partial,
                } => {
                    if let Some(m) = partial {
                        self.pool.give(m);
                    }
                    // No reply is due: nothing goes to the compute task.
                    self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    static DROPPED: crate::log::RateLimit = crate::log::RateLimit::new();
                    crate::limited!(
                        DROPPED,
                        info,
                        peer = %peer(&self.conn),
                        status = status.unwrap_or(0),
                        "a quiet request that does not parse is dropped without a reply"
                    );
                }
                Inbound::Rejected {
                    status,
                    resume,
                    partial,
                    ..
                } => {
                    self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    static REJECTED: crate::log::RateLimit = crate::log::RateLimit::new();
                    crate::limited!(
                        REJECTED,
                        info,
                        peer = %peer(&self.conn),
                        status = status.unwrap_or(0),
                        reads_on = resume,
                        "a request that does not parse gets the grammar's reject reply"
                    );
                    let mut m = partial.unwrap_or_else(|| self.pool.take());
                    m.rejected = Some(status.unwrap_or(0));
                    if !resume {
                        // Nothing more is read: the read side goes back now.
                        if let (Some(r), Some(g)) = (self.read.take(), &self.graphs) {
                            g.give_read_side(r);
                        }
                    }
                    self.pending = Some(m);
                }
            }
        }
    }
}

/// Writes the messages of a task channel to a connection, as many as
/// have arrived in one system call (`outbox.rs`).
pub struct Writer {
    pub conn: Arc<Conn>,
    pub rx: Receiver<Msg>,
    pub outbox: crate::outbox::Outbox,
    pub pool: Arc<MsgPool>,
    pub stats: Arc<Stats>,
}

impl Writer {
    fn finish(&mut self) -> TaskStatus {
        self.outbox.clear(&self.pool);
        while let Ok(m) = self.rx.try_recv() {
            self.pool.give(m);
        }
        if !self.conn.parked() {
            let _ = self.conn.stream.shutdown(std::net::Shutdown::Write);
        }
        TaskStatus::Done
    }

    pub fn run(&mut self, slice: &mut Timeslice) -> TaskStatus {
        loop {
            let mut closed = false;
            while !self.outbox.is_full() {
                match self.rx.try_recv() {
                    Ok(m) => self.outbox.push(m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Closed) => {
                        closed = true;
                        break;
                    }
                }
            }
            if self.outbox.is_empty() {
                return if closed {
                    self.finish()
                } else {
                    TaskStatus::Idle
                };
            }
            if !closed && self.outbox.awaits_rest() {
                // The rest of the reply is on its way: sending arrives.
                return TaskStatus::Idle;
            }
            match self.outbox.flush_to(&self.conn, &self.pool) {
                Ok(Flushed::All(n)) => {
                    self.stats.messages_out(self.conn.chan, n);
                    if slice.item_done() {
                        return TaskStatus::Yield;
                    }
                }
                Ok(Flushed::Blocked(n)) => {
                    self.stats.messages_out(self.conn.chan, n);
                    return TaskStatus::Idle;
                }
                Err(e) if e.kind() == ErrorKind::NotConnected => return TaskStatus::Idle,
                Err(e) => {
                    self.conn.failed_with(&e);
                    return self.finish();
                }
            }
        }
    }
}

/// The address at the other end of `conn`, for log lines.
pub(crate) fn peer(conn: &Conn) -> String {
    conn.stream
        .peer_addr()
        .map_or_else(|_| "unknown".to_string(), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flick_wire::Grammar;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    /// A loopback connection: the writing end, and the reading end
    /// (non-blocking, as the platform's sockets are).
    fn pair() -> (std::net::TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let w = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (r, _) = l.accept().unwrap();
        r.set_nonblocking(true).unwrap();
        (w, TcpStream::from_std(r))
    }

    /// Writes `bytes`, then reads messages until `want` have come, one
    /// ends a message, or two seconds pass: each message's part and bytes.
    fn read(
        side: &mut ReadSide,
        w: &mut std::net::TcpStream,
        r: &TcpStream,
        bytes: &[u8],
        want: usize,
    ) -> Vec<(Part, String)> {
        let pool = MsgPool::for_grammar(side.parser.grammar().clone(), 16, 64, 0, 512);
        w.write_all(bytes).unwrap();
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(2);
        let ended = |got: &Vec<(Part, String)>| got.last().is_some_and(|g| g.0 == Part::End);
        while got.len() < want && !ended(&got) && Instant::now() < until {
            side.woken(false);
            match side.next(r, &pool) {
                Inbound::Message(m) => {
                    got.push((m.part, String::from_utf8_lossy(&m.bytes).into_owned()))
                }
                Inbound::Idle => std::thread::sleep(Duration::from_millis(2)),
                _ => panic!("the response did not parse"),
            }
        }
        got
    }

    fn response_side() -> ReadSide {
        let g = Grammar::stock("http").unwrap();
        let unit = g.unit_id("response").unwrap();
        ReadSide::new(g.parser(unit), 4096, 1 << 20)
    }

    #[test]
    fn a_body_read_whole_goes_as_the_last_piece() {
        let (mut w, r) = pair();
        let mut side = response_side();
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
        let got = read(&mut side, &mut w, &r, format!("{head}hello").as_bytes(), 2);
        // The head, then the body as the message's end: no empty piece.
        assert_eq!(
            got,
            [
                (Part::Head, head.to_string()),
                (Part::End, "hello".to_string())
            ]
        );
        assert!(side.at_rest());
        // A body that comes in two reads: a piece, then the end.
        let got = read(&mut side, &mut w, &r, format!("{head}hel").as_bytes(), 2);
        assert_eq!(
            got,
            [
                (Part::Head, head.to_string()),
                (Part::Body, "hel".to_string())
            ]
        );
        assert!(!side.at_rest());
        let got = read(&mut side, &mut w, &r, b"lo", 1);
        assert_eq!(got, [(Part::End, "lo".to_string())]);
        assert!(side.at_rest());
    }

    /// As `read`, with where each message's body begins.
    fn read_whole(
        side: &mut ReadSide,
        w: &mut std::net::TcpStream,
        r: &TcpStream,
        bytes: &[u8],
        want: usize,
    ) -> Vec<(Part, String, u32)> {
        let pool = MsgPool::for_grammar(side.parser.grammar().clone(), 16, 64, 0, 512);
        w.write_all(bytes).unwrap();
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(2);
        while got.len() < want
            && !got
                .last()
                .is_some_and(|g: &(Part, String, u32)| g.0 == Part::End)
            && Instant::now() < until
        {
            side.woken(false);
            match side.next(r, &pool) {
                Inbound::Message(m) => got.push((
                    m.part,
                    String::from_utf8_lossy(&m.bytes).into_owned(),
                    m.body_at,
                )),
                Inbound::Idle => std::thread::sleep(Duration::from_millis(2)),
                _ => panic!("the response did not parse"),
            }
        }
        got
    }

    #[test]
    fn a_reply_read_with_its_body_goes_as_one_message() {
        let (mut w, r) = pair();
        let mut side = response_side().whole_replies();
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n";
        let at = head.len() as u32;
        // Two replies in one read: each whole, its body after its head.
        let two = format!("{head}hello{head}world");
        let got = read_whole(&mut side, &mut w, &r, two.as_bytes(), 2);
        assert_eq!(
            got,
            [
                (Part::Whole, format!("{head}hello"), at),
                (Part::Whole, format!("{head}world"), at)
            ]
        );
        assert!(side.at_rest());
        // A body that comes in two reads streams, as without.
        let got = read_whole(&mut side, &mut w, &r, format!("{head}hel").as_bytes(), 2);
        assert_eq!(
            got,
            [
                (Part::Head, head.to_string(), 0),
                (Part::Body, "hel".to_string(), 0)
            ]
        );
        let got = read_whole(&mut side, &mut w, &r, b"lo", 1);
        assert_eq!(got, [(Part::End, "lo".to_string(), 0)]);
        assert!(side.at_rest());
        // A chunked body streams, every byte once and in order.
        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        let body = "5\r\nhello\r\n0\r\n\r\n";
        let got = read_whole(&mut side, &mut w, &r, format!("{head}{body}").as_bytes(), 8);
        assert_eq!(
            got.first().map(|g| (g.0, g.1.as_str())),
            Some((Part::Head, head))
        );
        let pieces: String = got[1..].iter().map(|g| g.1.as_str()).collect();
        assert_eq!(pieces, body);
        assert!(side.at_rest());
    }

    #[test]
    fn a_held_request_goes_as_one_message() {
        let (mut w, r) = pair();
        let g = Grammar::stock("http").unwrap();
        let unit = g.unit_id("request").unwrap();
        let mut side = ReadSide::new(g.parser(unit), 4096, 1 << 20).holding(16384);
        let head = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n";
        let at = head.len() as u32;
        // Its body in two reads: held until complete, then whole.
        let got = read_whole(&mut side, &mut w, &r, format!("{head}hel").as_bytes(), 1);
        assert!(got.is_empty(), "{got:?}");
        let got = read_whole(&mut side, &mut w, &r, b"lo", 1);
        assert_eq!(got, [(Part::Whole, format!("{head}hello"), at)]);
        assert!(side.at_rest());
        // A chunked body, held and whole, as it came.
        let head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
        let body = "5\r\nhello\r\n0\r\n\r\n";
        let got = read_whole(&mut side, &mut w, &r, format!("{head}{body}").as_bytes(), 1);
        assert_eq!(
            got,
            [(Part::Whole, format!("{head}{body}"), head.len() as u32)]
        );
        assert!(side.at_rest());
    }

    #[test]
    fn a_chunked_body_ends_with_its_last_chunk() {
        let (mut w, r) = pair();
        let mut side = response_side();
        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        let body = "5\r\nhello\r\n0\r\n\r\n";
        let got = read(&mut side, &mut w, &r, format!("{head}{body}").as_bytes(), 8);
        assert_eq!(got.first(), Some(&(Part::Head, head.to_string())));
        assert_eq!(got.last().map(|g| g.0), Some(Part::End));
        // Every byte of the body goes on, in order, once.
        let pieces: String = got[1..].iter().map(|g| g.1.as_str()).collect();
        assert_eq!(pieces, body);
        assert!(side.at_rest());
    }
}
