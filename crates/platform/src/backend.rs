//! Shared backend connections: every instance's requests to a backend go
//! over a few connections that all instances share, pipelined, and each
//! reply goes back to the instance whose request it answers, in order (the
//! way twemproxy multiplexes).
//!
//! Or, where the grammar asks for it (`%exclusive`, HTTP), exclusively: a
//! connection serves one instance at a time and goes back to its worker's
//! idle connections when that instance is done with it (no request in
//! flight, no body half sent), for the next instance to take (the way
//! nginx's upstream `keepalive` and HAProxy's `http-reuse safe` reuse
//! connections). One client's slow body, broken framing or timeout then
//! touches its own connection only.
//!
//! An instance joins a shared connection as a member with two task
//! channels of its own, requests in and replies out, so to the instance a
//! shared connection looks like one of its own. The connection's writer
//! takes requests from the members in turn and records, in order, whose
//! each one is (with the value its reply will echo, `%correlate`); its
//! reader hands each reply to the member at the head of that record,
//! skipping quiet requests that got no reply and keeping the head while a
//! reply continues (`%more`). When the connection fails, every member's
//! channels close, and each instance answers what it was owed with the
//! grammar's `%fault` reply and joins a fresh connection later.

use crate::compute::{Input, Output};
use crate::conn::{Conn, Inbound};
use crate::msg::{Msg, MsgPool, Part, Routed};
use crate::outbox::Flushed;
use crate::stats::Stats;
use flick_runtime::{Receiver, Sender, TaskId, TaskStatus, Timeslice, TryRecvError, TrySendError};
use flick_wire::{Grammar, Routing, UnitId};
use std::collections::{HashMap, VecDeque};
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Of a worker's idle exclusive connections beyond those always kept,
/// one unused this long is closed by the sweep: longer than the gaps
/// between requests under a steady load, so the sweep does not close what
/// the next second dials again.
pub const IDLE_TRIM_AFTER: Duration = Duration::from_secs(1);

/// Nanoseconds on a clock that starts at its first reading: when a
/// connection was last used, in a word that needs no lock.
fn clock_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

struct Member {
    key: u32,
    /// Its instance ended (its request channel closed).
    gone: bool,
    requests: Receiver<Msg>,
    replies: Sender<Msg>,
}

#[derive(Default)]
struct Members {
    next_key: u32,
    list: Vec<Member>,
    /// The instance's ends of an idle exclusive connection's last member
    /// (its key, requests sender, replies receiver), kept by the connection
    /// when the instance gave it back, for the next instance to take over
    /// (bound to it): giving back and taking then neither close channels,
    /// which would wake the connection's reader and writer for nothing,
    /// nor make new ones.
    kept: Option<(u32, Sender<Msg>, Receiver<Msg>)>,
}

impl Members {
    /// Whether no member has a request left to write: their instances
    /// ended (or gave the connection back) with nothing queued.
    fn none_writing(&self) -> bool {
        let kept = self.kept.as_ref().map(|k| k.0);
        self.list
            .iter()
            .all(|m| m.requests.is_finished() || (Some(m.key) == kept && m.requests.is_empty()))
    }

    /// Forgets every member (the connection closes or changes hands).
    fn clear(&mut self) {
        self.list.clear();
        self.kept = None;
    }
}

/// A request written on a shared connection and not yet answered.
struct InFlight {
    /// The member whose request it is.
    member: u32,
    /// What its reply will echo (`%correlate`).
    corr: Option<i128>,
    /// What the reply's parse needs to know (`%reply_context`).
    context: i128,
    /// A quiet request written with the grammar's `%fence` after it: its
    /// replies run up to the fence's reply (`%fenced`).
    fenced: bool,
}

/// One shared connection to a backend.
pub struct SharedConn {
    pub conn: Arc<Conn>,
    pub reader: TaskId,
    writer: TaskId,
    members: Mutex<Members>,
    /// Whose requests were written and not answered, oldest first.
    inflight: Mutex<VecDeque<InFlight>>,
    dead: AtomicBool,
    /// Its connecting was refused and the backend's stats were told, once
    /// for all its members.
    refusal_counted: AtomicBool,
    /// The writer is in the middle of a member's request body.
    streaming: AtomicBool,
    /// When a member joined it or a reply was handed on (`clock_ns`): the
    /// backend's idle timer runs from about then.
    last_used: AtomicU64,
    /// Exclusive: it is on its worker's stack of idle connections (changed
    /// only under the backend's pools lock).
    stacked: AtomicBool,
    chan: u16,
    index: Option<u32>,
}

impl SharedConn {
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    fn touch(&self) {
        self.last_used.store(clock_ns(), Ordering::Relaxed);
    }

    /// How long since it was last used.
    fn unused_for(&self) -> Duration {
        Duration::from_nanos(clock_ns().saturating_sub(self.last_used.load(Ordering::Relaxed)))
    }

    /// Closes a connection no instance is on.
    fn close_unused(&self) {
        self.fail();
        let _ = self.conn.stream.shutdown(std::net::Shutdown::Both);
    }

    /// Adds instance `compute` as a member: its input (replies) and output
    /// (requests) for this backend.
    pub fn join(
        self: &Arc<Self>,
        compute: TaskId,
        graphs: &crate::graph_pool::GraphPool,
    ) -> Option<(Input, Output)> {
        self.join_when(compute, graphs, None)
    }

    /// Adds instance `compute` as a member only if the connection is idle:
    /// alive, with no member and no request in flight. One idle for
    /// `idle_timeout` or longer is closed instead (see [`Backend`]).
    pub fn join_if_idle(
        self: &Arc<Self>,
        compute: TaskId,
        graphs: &crate::graph_pool::GraphPool,
        idle_timeout: Option<Duration>,
    ) -> Option<(Input, Output)> {
        self.join_when(compute, graphs, Some(idle_timeout))
    }

    /// `idle_only`: join only an idle connection, closing it if it has
    /// been idle for as long as the limit it holds, or longer.
    fn join_when(
        self: &Arc<Self>,
        compute: TaskId,
        graphs: &crate::graph_pool::GraphPool,
        idle_only: Option<Option<Duration>>,
    ) -> Option<(Input, Output)> {
        let mut members = self.members.lock().expect("members lock");
        if self.is_dead() {
            return None;
        }
        if let Some(idle_timeout) = idle_only {
            // Members whose instance has ended and left nothing to write
            // are gone already, whether or not the writer has seen it.
            let busy = self.streaming.load(Ordering::Acquire)
                || !members.none_writing()
                || !self.inflight.lock().expect("inflight lock").is_empty();
            if busy {
                return None;
            }
            // The backend may have closed it while it idled (nginx's
            // `keepalive_timeout`) with its reader not yet run since: its
            // end is in the socket already, and a request written now
            // would be lost with it (a POST's, not sent again: 502).
            // Idle as long as the backend may keep it, or longer: the
            // backend may be closing it now, and a request written as it
            // does is lost with it (nginx's upstream `keepalive_timeout`).
            let too_old = idle_timeout.is_some_and(|t| self.unused_for() >= t);
            if too_old || self.ended_while_idle() {
                self.dead.store(true, Ordering::Release);
                members.clear();
                let _ = self.conn.stream.shutdown(std::net::Shutdown::Both);
                return None;
            }
            if let Some((key, req_tx, rep_rx)) = members.kept.take() {
                members.list.retain(|m| m.key == key);
                if members.list.len() == 1 {
                    self.touch();
                    req_tx.bind(compute);
                    rep_rx.bind(compute);
                    return Some(self.ends(rep_rx, req_tx, idle_timeout));
                }
            }
            members.clear();
        }
        self.touch();
        let (req_tx, req_rx) = graphs.links.channel();
        req_tx.bind(compute);
        req_rx.bind(self.writer);
        let (rep_tx, rep_rx) = graphs.replies.channel();
        rep_tx.bind(self.reader);
        rep_rx.bind(compute);
        let key = members.next_key;
        members.next_key = members.next_key.wrapping_add(1);
        members.list.push(Member {
            key,
            gone: false,
            requests: req_rx,
            replies: rep_tx,
        });
        Some(self.ends(rep_rx, req_tx, idle_only.flatten()))
    }

    /// An instance's input and output for this connection, over its ends
    /// of a member's channels.
    fn ends(
        self: &Arc<Self>,
        rep_rx: Receiver<Msg>,
        req_tx: Sender<Msg>,
        idle_limit: Option<Duration>,
    ) -> (Input, Output) {
        (
            Input {
                rx: rep_rx,
                chan: self.chan,
                index: self.index,
                open: true,
                retired: false,
                follow: None,
                sentinel: false,
                last_body: false,
            },
            Output {
                tx: Some(req_tx),
                chan: self.chan,
                index: self.index,
                conn: Some((self.conn.clone(), self.reader)),
                crc: None,
                shared: true,
                idle_limit,
            },
        )
    }

    /// Whether an idle connection has ended, or holds bytes no request
    /// asked for, as a look at its socket (nothing read) finds.
    fn ended_while_idle(&self) -> bool {
        match self.conn.stream.peek(&mut [0u8; 1]) {
            Ok(_) => true,
            Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
        }
    }

    /// Alive, with no member and nothing in flight.
    fn is_idle(&self) -> bool {
        let members = self.members.lock().expect("members lock");
        !self.is_dead()
            && !self.streaming.load(Ordering::Acquire)
            && members.none_writing()
            && self.inflight.lock().expect("inflight lock").is_empty()
    }

    /// Counts a refused connecting against the backend, once: whichever
    /// of the reader and the writer saw it first.
    fn note_refused(&self, stats: &Stats) {
        if self.conn.refused.load(Ordering::Acquire)
            && !self.refusal_counted.swap(true, Ordering::AcqRel)
        {
            stats.connect_failed(self.chan, self.index);
        }
    }

    /// The connection failed: every member hears of it.
    fn fail(&self) {
        self.dead.store(true, Ordering::Release);
        self.members.lock().expect("members lock").clear();
        self.inflight.lock().expect("inflight lock").clear();
    }
}

/// The writer of a shared connection.
pub struct SharedWriter {
    pub shared: Arc<SharedConn>,
    /// Requests taken from the members, written together (`outbox.rs`).
    pub outbox: crate::outbox::Outbox,
    pub next: usize,
    /// The member whose request body is being written, piece by piece.
    pub streaming: Option<u32>,
    pub pool: Arc<MsgPool>,
    pub grammar: Arc<Grammar>,
    pub unit: UnitId,
    pub stats: Arc<Stats>,
}

impl SharedWriter {
    fn fail(&mut self) -> TaskStatus {
        self.outbox.clear(&self.pool);
        self.shared.note_refused(&self.stats);
        self.shared.fail();
        let _ = self.shared.conn.stream.shutdown(std::net::Shutdown::Both);
        TaskStatus::Done
    }

    pub fn run(&mut self, slice: &mut Timeslice) -> TaskStatus {
        loop {
            if self.shared.is_dead() {
                self.outbox.clear(&self.pool);
                return TaskStatus::Done;
            }
            let Some(whole_pass) = self.take_requests() else {
                return self.fail();
            };
            if self.outbox.is_empty() {
                return TaskStatus::Idle;
            }
            match self.outbox.flush_to(&self.shared.conn, &self.pool) {
                Ok(Flushed::All(n)) => {
                    self.stats.messages_out(self.shared.conn.chan, n);
                    // A pass that polled every member until it was empty
                    // is not made again: a request sent since woke this
                    // task while it ran, which runs it again. (A second
                    // pass over every member's channel, finding nothing,
                    // was most of the shared writer's 5% of a Memcached
                    // proxy's CPU.)
                    if whole_pass {
                        return TaskStatus::Idle;
                    }
                    if slice.item_done() {
                        return TaskStatus::Yield;
                    }
                }
                Ok(Flushed::Blocked(n)) => {
                    self.stats.messages_out(self.shared.conn.chan, n);
                    return TaskStatus::Idle;
                }
                Err(e) if e.kind() == ErrorKind::NotConnected => return TaskStatus::Idle,
                Err(e) => {
                    self.shared.conn.failed_with(&e);
                    return self.fail();
                }
            }
        }
    }

    /// Fills the outbox with the members' requests, member after member
    /// in turn; while a member's request streams its body, from that
    /// member only. `Some(true)` if every member was polled until it was
    /// empty (none skipped for another's body, the outbox never full);
    /// `None` if a member left in the middle of a body: the backend's
    /// stream cannot be completed.
    fn take_requests(&mut self) -> Option<bool> {
        let mut members = self.shared.members.lock().expect("members lock");
        let mut gone = false;
        // One pass over the members, each drained in turn: a pass that
        // finds nothing costs a poll per member, so it is made once.
        let n = members.list.len();
        let first = self.next;
        // The next pass starts one member on, unless this one fills up.
        self.next = (first + 1) % n.max(1);
        let mut whole_pass = true;
        'members: for k in 0..n {
            let i = (first + k) % n;
            let member = &mut members.list[i];
            while !self.outbox.is_full() {
                if self.streaming.is_some_and(|key| key != member.key) {
                    whole_pass = false;
                    continue 'members;
                }
                match member.requests.try_recv() {
                    Ok(m) => {
                        let key = member.key;
                        self.streaming = match m.part {
                            Part::Head | Part::Body => Some(key),
                            Part::Whole | Part::End => None,
                        };
                        self.shared
                            .streaming
                            .store(self.streaming.is_some(), Ordering::Release);
                        self.record(key, &m);
                        self.outbox.push(m);
                    }
                    Err(TryRecvError::Empty) => continue 'members,
                    Err(TryRecvError::Closed) => {
                        member.gone = true;
                        gone = true;
                        continue 'members;
                    }
                }
            }
            // The batch is full: the next run starts with this member.
            self.next = i;
            whole_pass = false;
            break;
        }
        // Members whose instance ended leave; replies still due to them
        // are dropped when they come.
        if gone {
            let streaming_left = self
                .streaming
                .is_some_and(|key| members.list.iter().any(|m| m.key == key && m.gone));
            members.list.retain(|m| !m.gone);
            if streaming_left {
                return None;
            }
        }
        Some(whole_pass)
    }

    /// Records whose request `m` is, in the order requests are written,
    /// so its reply finds its way back.
    fn record(&self, key: u32, m: &Msg) {
        // A reply is awaited for a whole request or a head, unless it is
        // quiet in a protocol whose replies do not say what they answer and
        // that has no fence: then none comes. (The instance wrote the fence
        // after a quiet request, as `peers.rs` decides.)
        if !matches!(m.part, Part::Whole | Part::Head) {
            return;
        }
        let (quiet, fenced, corr, context) = match m.routed.is_set() {
            true => {
                let r = m.routed;
                (r.quiet(), r.fenced(), r.corr(), r.context())
            }
            false => routed_of(&self.grammar, self.unit, m),
        };
        if quiet && !fenced && corr.is_none() {
            return;
        }
        self.shared
            .inflight
            .lock()
            .expect("inflight lock")
            .push_back(InFlight {
                member: key,
                corr,
                context,
                fenced,
            });
    }
}

/// How a request `m` of `unit` written to a backend connection is matched
/// to its reply, read from its values: its `%quiet`, whether it is
/// fenced, its `%correlate` and `%reply_context` (as `Msg::routed` carries
/// them where the sender worked them out). Quiet requests are fenced where the
/// grammar has a `%fence` (the instance wrote it after them, as
/// `peers.rs` decides); a fenced request's replies end at the fence's, so
/// none is matched by `%correlate`.
fn routed_of(grammar: &Grammar, unit: UnitId, m: &Msg) -> (bool, bool, Option<i128>, i128) {
    let quiet = grammar
        .routing(unit, Routing::Quiet, &m.slots, &m.bytes)
        .unwrap_or(0)
        != 0;
    let fenced = quiet && m.part == Part::Whole && grammar.fence(unit).is_some();
    let corr = match fenced {
        true => None,
        false => grammar.routing(unit, Routing::Correlate, &m.slots, &m.bytes),
    };
    let context = grammar
        .routing(unit, Routing::ReplyContext, &m.slots, &m.bytes)
        .unwrap_or(0);
    (quiet, fenced, corr, context)
}

/// The reader of a shared connection.
pub struct SharedReader {
    pub shared: Arc<SharedConn>,
    pub read: crate::conn::ReadSide,
    pub pending: Option<(u32, Msg)>,
    /// The backend said it closes the connection after the reply being
    /// read (HTTP's `Connection: close`, the reply unit's `%ends`): once
    /// that reply is handed over, the connection is given up, before any
    /// other request can be written to it.
    pub closing: bool,
    pub pool: Arc<MsgPool>,
    pub grammar: Arc<Grammar>,
    pub unit: UnitId,
    pub stats: Arc<Stats>,
    /// The rule that reads these replies passes them on unchanged
    /// (`| backends => client`), so none sees where one ends: a reply
    /// whose rest comes by itself goes with that rest as one message
    /// where both are read together ([`SharedReader::merge_end`]).
    pub merge_ends: bool,
}

impl SharedReader {
    /// Whether reply `m` has routing property `p` (not 0).
    fn holds(&self, p: Routing, m: &Msg) -> bool {
        self.grammar
            .routing(self.unit, p, &m.slots, &m.bytes)
            .unwrap_or(0)
            != 0
    }

    /// Reply `m`, which `%more` and `%coalesce` say the rest of its reply
    /// follows by itself (a VALUE before its END), with the final reply
    /// that ends it appended, where that reply is already read whole: one
    /// message through the instance and the client's writer rather than
    /// two. `end_at` says where the final reply begins, for an instance
    /// that passes on the first and not the end (a part of a split get).
    /// Entries of a merged reply (`%merge_key`: STAT lines) are left
    /// alone, as is anything but a final reply of the same request, and
    /// the replies of a fenced quiet request, which run up to its fence's.
    /// Whether it was appended.
    fn merge_end(&mut self, m: &mut Msg, corr: Option<i128>) -> bool {
        let fenced = || {
            let inflight = self.shared.inflight.lock().expect("inflight lock");
            inflight.front().is_none_or(|f| f.fenced)
        };
        if !self.holds(Routing::Coalesce, m)
            || self
                .grammar
                .merge_key(self.unit, &m.slots, &m.bytes)
                .is_some()
            || fenced()
        {
            return false;
        }
        let (grammar, unit) = (&self.grammar, self.unit);
        let at = m.bytes.len();
        let appended = self.read.append_buffered(&mut m.bytes, |slots, bytes| {
            let holds = |p| grammar.routing(unit, p, slots, bytes).unwrap_or(0) != 0;
            grammar.routing(unit, Routing::Correlate, slots, bytes) == corr
                && !holds(Routing::More)
                && !holds(Routing::Ends)
        });
        if appended {
            m.end_at = at as u32;
        }
        appended
    }

    fn finish(&mut self) -> TaskStatus {
        if let Some((_, m)) = self.pending.take() {
            self.pool.give(m);
        }
        if self.read.refused {
            self.shared
                .conn
                .refused
                .store(true, std::sync::atomic::Ordering::Release);
        }
        self.shared.note_refused(&self.stats);
        self.shared.fail();
        let _ = self.shared.conn.stream.shutdown(std::net::Shutdown::Both);
        TaskStatus::Done
    }

    /// Hands a reply to its member; `false` if the member's channel is full.
    fn deliver(&mut self, key: u32, m: Msg) -> bool {
        let members = self.shared.members.lock().expect("members lock");
        let Some(member) = members.list.iter().find(|x| x.key == key) else {
            self.pool.give(m);
            return true;
        };
        match member.replies.try_send(m) {
            Ok(()) => {
                self.shared.touch();
                self.stats.message_in(self.shared.conn.chan);
                true
            }
            // A client that does not read its replies must not hold up the
            // others on this connection: it leaves the connection, and the
            // replies it is owed become fault replies.
            Err(TrySendError::Full(m)) => {
                drop(members);
                self.pool.give(m);
                self.shared
                    .members
                    .lock()
                    .expect("members lock")
                    .list
                    .retain(|x| x.key != key);
                true
            }
            Err(TrySendError::Closed(m)) => {
                self.pool.give(m);
                true
            }
        }
    }

    pub fn run(&mut self, slice: &mut Timeslice) -> TaskStatus {
        self.read.woken(self.shared.conn.hung_up());
        loop {
            if let Some((key, m)) = self.pending.take() {
                let last = self.closing && matches!(m.part, Part::Whole | Part::End);
                // Backpressure: a slow member holds this connection's replies.
                if !self.deliver(key, m) {
                    return TaskStatus::Idle;
                }
                if last {
                    return self.finish();
                }
                if slice.item_done() {
                    return TaskStatus::Yield;
                }
            }
            if self.shared.is_dead() {
                return self.finish();
            }
            // The reply that parses next answers the oldest request waiting.
            let context = self
                .shared
                .inflight
                .lock()
                .expect("inflight lock")
                .front()
                .map_or(0, |f| f.context);
            self.read.set_reply_context(context);
            let mut m = match self.read.next(&self.shared.conn.stream, &self.pool) {
                Inbound::Message(m) => m,
                Inbound::Idle => return TaskStatus::Idle,
                Inbound::Closed => return self.finish(),
                // A backend's replies must all parse: the stream cannot be
                // matched to requests any more.
                bad @ (Inbound::Malformed | Inbound::Rejected { .. }) => {
                    if let Inbound::Rejected {
                        partial: Some(m), ..
                    } = bad
                    {
                        self.pool.give(m);
                    }
                    self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    static MALFORMED: crate::log::RateLimit = crate::log::RateLimit::new();
                    crate::limited!(
                        MALFORMED,
                        warn,
                        backend = %crate::conn::peer(&self.shared.conn),
                        "a backend reply does not parse: its shared connection is closed, \
                         and the requests in flight on it get fault replies"
                    );
                    return self.finish();
                }
            };
            // Pieces of a body carry no values.
            let whole_or_head = matches!(m.part, Part::Whole | Part::Head);
            let corr = whole_or_head
                .then(|| {
                    self.grammar
                        .routing(self.unit, Routing::Correlate, &m.slots, &m.bytes)
                })
                .flatten();
            // A head and the pieces of its body are followed by more.
            let mut continues = m.part == Part::Whole && self.holds(Routing::More, &m);
            if continues && self.merge_ends && self.merge_end(&mut m, corr) {
                continues = false;
            }
            let more = matches!(m.part, Part::Head | Part::Body) || continues;
            if whole_or_head {
                // Its instance reads them from here (`GraphHost::on_reply`).
                m.routed = Routed::reply(corr, continues);
            }
            let owner = {
                let mut inflight = self.shared.inflight.lock().expect("inflight lock");
                match inflight.front() {
                    // A fenced quiet request owns every reply up to its
                    // fence's, which ends it (the member sees that too).
                    Some(f) if f.fenced => {
                        let owner = f.member;
                        let fence = m.part == Part::Whole && self.holds(Routing::Fenced, &m);
                        if fence {
                            inflight.pop_front();
                        }
                        Some(owner)
                    }
                    _ => {
                        // Quiet requests that got no reply.
                        while let Some(f) = inflight.front() {
                            match (f.corr, corr) {
                                (Some(a), Some(b)) if a != b => {
                                    inflight.pop_front();
                                }
                                _ => break,
                            }
                        }
                        let owner = inflight.front().map(|f| f.member);
                        if !more {
                            inflight.pop_front();
                        }
                        owner
                    }
                }
            };
            if whole_or_head && self.holds(Routing::Ends, &m) {
                self.closing = true;
            }
            match owner {
                Some(key) => self.pending = Some((key, m)),
                None => self.pool.give(m),
            }
        }
    }
}

/// The shared connections of one backend address.
pub struct Backend {
    pub chan: u16,
    pub index: Option<u32>,
    pub addr: std::net::SocketAddr,
    /// Pipelined: `per_worker` slots for each worker, worker by worker.
    pub slots: Mutex<Vec<Option<Arc<SharedConn>>>>,
    pub per_worker: usize,
    pub next: std::sync::atomic::AtomicUsize,
    /// Exclusive: each worker's connections, one instance on each at most.
    pub exclusive: Option<Mutex<Vec<ExclusivePool>>>,
    /// Exclusive: an idle connection unused this long is closed rather
    /// than taken again, before the backend's own idle timeout can close
    /// it under a request (nginx's upstream `keepalive_timeout`, HAProxy's
    /// `timeout http-keep-alive`). `None`: kept however long.
    pub idle_timeout: Option<Duration>,
    /// Exclusive: the most connections each worker has open to it at
    /// once, busy and idle (HAProxy's `maxconn` per server); past it an
    /// instance waits for one to come back. 0: no cap.
    pub max_per_worker: usize,
}

/// One worker's exclusive connections to a backend.
///
/// An instance holds one only while it has a request in flight, then gives
/// it back (as nginx's upstream `keepalive` and HAProxy's `http-reuse`
/// do), so a worker needs about as many as it has requests at the backend,
/// not one per client: at 1,600 kept-alive clients, a connection each (and
/// one to every backend, taken when the instance started) meant 3,200
/// backend connections, each with its tasks and 16 KiB read buffer, and
/// the backends serving 1,600 connections each.
#[derive(Default)]
pub struct ExclusivePool {
    /// Every open one, busy or idle, by its reader task's id: an instance
    /// giving one back names it so, and nothing is searched.
    open: HashMap<u32, Arc<SharedConn>>,
    /// Those given back, the most recent last: a request takes the last
    /// (warm, and known alive a moment ago), so under a steady load the
    /// ones at the bottom go unused and age until the sweep closes them.
    idle: Vec<Arc<SharedConn>>,
}

impl ExclusivePool {
    /// Puts an idle connection on the stack, once.
    fn stack(&mut self, c: &Arc<SharedConn>) {
        if !c.stacked.swap(true, Ordering::Relaxed) {
            self.idle.push(c.clone());
        }
    }

    /// Shuts every connection (the service stops); their tasks see the
    /// sockets shut and end.
    fn shut_all(&mut self) {
        self.idle.clear();
        for (_, c) in self.open.drain() {
            let _ = c.conn.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// How a backend's exclusive connections are kept: see [`Backend`].
#[derive(Clone, Copy, Debug)]
pub struct ExclusiveLimits {
    pub idle_timeout: Option<Duration>,
    pub max_per_worker: usize,
}

impl Backend {
    /// `exclusive`: its connections are exclusive, kept so.
    pub fn new(
        chan: u16,
        index: Option<u32>,
        addr: std::net::SocketAddr,
        per_worker: usize,
        workers: usize,
        exclusive: Option<ExclusiveLimits>,
    ) -> Backend {
        let per_worker = per_worker.max(1);
        let limits = exclusive.unwrap_or(ExclusiveLimits {
            idle_timeout: None,
            max_per_worker: 0,
        });
        Backend {
            chan,
            index,
            addr,
            slots: Mutex::new(vec![None; per_worker * workers.max(1)]),
            per_worker,
            next: std::sync::atomic::AtomicUsize::new(0),
            exclusive: exclusive.map(|_| {
                Mutex::new(
                    (0..workers.max(1))
                        .map(|_| ExclusivePool::default())
                        .collect(),
                )
            }),
            idle_timeout: limits.idle_timeout,
            max_per_worker: limits.max_per_worker,
        }
    }

    /// Live shared connections.
    pub fn live(&self) -> usize {
        let pipelined = self
            .slots
            .lock()
            .expect("slots lock")
            .iter()
            .flatten()
            .filter(|c| !c.is_dead())
            .count();
        let exclusive = self.exclusive.as_ref().map_or(0, |e| {
            let pools = e.lock().expect("pools lock");
            pools
                .iter()
                .flat_map(|p| p.open.values())
                .filter(|c| !c.is_dead())
                .count()
        });
        pipelined + exclusive
    }

    /// Instance `compute` on `worker` takes the idle connection of that
    /// worker's given back last, or one `open` dials for it; `None` if the
    /// backend cannot be reached (or the worker is at its cap). `fresh`: a
    /// new one, never an idle one (for a request sent again, lost with a
    /// connection the backend closed: its other idle connections may be
    /// closing too). Only for an exclusive backend.
    pub fn take_exclusive(
        &self,
        worker: usize,
        compute: TaskId,
        graphs: &crate::graph_pool::GraphPool,
        fresh: bool,
        open: impl FnOnce(u16, Option<u32>) -> Option<Arc<SharedConn>>,
    ) -> Option<(Input, Output)> {
        let pools = self.exclusive.as_ref()?;
        let mut pools = pools.lock().expect("pools lock");
        let n = pools.len();
        let pool = &mut pools[worker % n];
        while let Some(c) = (!fresh).then(|| pool.idle.pop()).flatten() {
            c.stacked.store(false, Ordering::Relaxed);
            if let Some(joined) = c.join_if_idle(compute, graphs, self.idle_timeout) {
                return Some(joined);
            }
            // Closed while it idled, or too old (closed now): it counts no
            // more. (One still busy is on no stack; it comes back later.)
            if c.is_dead() {
                pool.open.remove(&c.reader.0);
            }
        }
        if self.max_per_worker > 0 && pool.open.len() >= self.max_per_worker {
            // At the cap (not on every request): dead ones leave the
            // count, and an idle one that nobody gave back (its instance
            // ended with a request in flight, answered since) is taken.
            pool.open.retain(|_, c| !c.is_dead());
            for c in pool.open.values() {
                if let Some(joined) = c.join_if_idle(compute, graphs, self.idle_timeout) {
                    return Some(joined);
                }
            }
            pool.open.retain(|_, c| !c.is_dead());
            if pool.open.len() >= self.max_per_worker {
                return None;
            }
        }
        let c = open(self.chan, self.index)?;
        let joined = c
            .join_when(compute, graphs, None)
            .map(|(input, mut output)| {
                output.idle_limit = self.idle_timeout;
                (input, output)
            });
        // A dead connection whose reader's task id was reused is replaced.
        pool.open.insert(c.reader.0, c);
        joined
    }

    /// Instance on `worker` gives back its exclusive connection, whose
    /// reader is `reader`, with nothing owed: it goes on top of the
    /// worker's idle ones, for the next request to take. `ends`: the
    /// instance's ends of its member's channels (requests sender, replies
    /// receiver), kept for the next instance; `None` where it dropped them.
    pub fn give_back(
        &self,
        worker: usize,
        reader: TaskId,
        conn: &Arc<Conn>,
        ends: Option<(Sender<Msg>, Receiver<Msg>)>,
    ) {
        let Some(pools) = &self.exclusive else {
            return;
        };
        let mut pools = pools.lock().expect("pools lock");
        let n = pools.len();
        let pool = &mut pools[worker % n];
        let Some(c) = pool.open.get(&reader.0) else {
            return;
        };
        if !Arc::ptr_eq(&c.conn, conn) {
            return;
        }
        if let Some((req_tx, rep_rx)) = ends {
            let mut members = c.members.lock().expect("members lock");
            // Its member is the one whose requests channel is still open
            // (the others left: given back without their ends, or ended);
            // with none or several, the ends are dropped, closing them.
            let mut open = members.list.iter().filter(|m| !m.requests.is_finished());
            if let (Some(m), None) = (open.next(), open.next()) {
                let key = m.key;
                members.kept = Some((key, req_tx, rep_rx));
            }
        }
        if !c.is_idle() {
            return;
        }
        let c = c.clone();
        c.touch();
        pool.stack(&c);
    }

    /// Whether `worker` has as many exclusive connections open to this
    /// backend as it may, none of them idle: an instance waits for one.
    pub fn at_cap(&self, worker: usize) -> bool {
        let Some(pools) = &self.exclusive else {
            return false;
        };
        if self.max_per_worker == 0 {
            return false;
        }
        let pools = pools.lock().expect("pools lock");
        let pool = &pools[worker % pools.len()];
        pool.open.values().filter(|c| !c.is_dead()).count() >= self.max_per_worker
            && !pool.open.values().any(|c| c.is_idle())
    }

    /// The sweep (once a second): forgets dead connections, stacks idle
    /// ones no instance gave back (their instance ended), and closes
    /// those idle for `idle_timeout` or longer and, of each worker's idle
    /// ones beyond `keep` (what a burst opened, as nginx's upstream
    /// `keepalive` caches a few), those unused for [`IDLE_TRIM_AFTER`]:
    /// under a steady load the ones a worker takes in turn stay open,
    /// rather than be closed each second and dialled again. How many it
    /// closed. Their tasks see the socket shut and end.
    pub fn close_idle(&self, keep: usize) -> usize {
        let Some(pools) = &self.exclusive else {
            return 0;
        };
        let mut closed = 0;
        for pool in pools.lock().expect("pools lock").iter_mut() {
            pool.open.retain(|_, c| !c.is_dead());
            for c in pool.open.values() {
                if !c.stacked.load(Ordering::Relaxed) && c.is_idle() {
                    c.stacked.store(true, Ordering::Relaxed);
                    pool.idle.push(c.clone());
                }
            }
            // Oldest first: the bottom of the stack.
            let mut left = pool.idle.len();
            let open = &mut pool.open;
            pool.idle.retain(|c| {
                let unused = c.unused_for();
                let too_old = self.idle_timeout.is_some_and(|t| unused >= t);
                let spare = left > keep && unused >= IDLE_TRIM_AFTER;
                if !(too_old || spare || c.is_dead() || !c.is_idle()) {
                    return true;
                }
                c.stacked.store(false, Ordering::Relaxed);
                left -= 1;
                if !c.is_dead() && c.is_idle() {
                    c.close_unused();
                    open.remove(&c.reader.0);
                    closed += 1;
                }
                false
            });
        }
        closed
    }

    /// Shuts every connection (the service stops); their tasks see the
    /// sockets shut and end.
    pub fn shut_all(&self) {
        for c in self.slots.lock().expect("slots lock").iter_mut() {
            if let Some(c) = c.take() {
                let _ = c.conn.stream.shutdown(std::net::Shutdown::Both);
            }
        }
        if let Some(pools) = &self.exclusive {
            for pool in pools.lock().expect("pools lock").iter_mut() {
                pool.shut_all();
            }
        }
    }

    /// A live shared connection of `worker`'s, in turn; `open` dials a new
    /// one (for that worker) for a slot that has none or a dead one.
    pub fn pick(
        &self,
        worker: usize,
        open: impl FnOnce(u16, Option<u32>) -> Option<Arc<SharedConn>>,
    ) -> Option<Arc<SharedConn>> {
        let mut slots = self.slots.lock().expect("slots lock");
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.per_worker;
        let i = (worker * self.per_worker + turn) % slots.len();
        if let Some(c) = &slots[i] {
            if !c.is_dead() {
                return Some(c.clone());
            }
        }
        let c = open(self.chan, self.index)?;
        slots[i] = Some(c.clone());
        Some(c)
    }
}

/// Builds a shared connection over `conn`, with its two task ids.
pub fn shared_conn(
    conn: Arc<Conn>,
    reader: TaskId,
    writer: TaskId,
    chan: u16,
    index: Option<u32>,
) -> Arc<SharedConn> {
    Arc::new(SharedConn {
        conn,
        reader,
        writer,
        members: Mutex::new(Members::default()),
        inflight: Mutex::new(VecDeque::new()),
        dead: AtomicBool::new(false),
        refusal_counted: AtomicBool::new(false),
        streaming: AtomicBool::new(false),
        last_used: AtomicU64::new(clock_ns()),
        stacked: AtomicBool::new(false),
        chan,
        index,
    })
}
