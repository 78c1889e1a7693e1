//! Peers that answer requests (backends): sending to them, matching their
//! replies to requests, merging the replies of a request sent to every peer,
//! and answering for a peer that is gone.
//!
//! What a reply is and which request it answers comes from the grammar's
//! routing properties, not from here: `%correlate` (a value a reply echoes
//! from its request), `%more` (a reply continues with further messages) and
//! `%broadcast` (a request goes to every peer of a channel array),
//! `%ends` (a request that ends the client's session) and `%fault` (the
//! reply for a request no peer will answer). A broadcast whose request
//! says `%merge` gets its peers' entries (`%merge_key`) merged into one
//! reply, one entry per key (Memcached's `stats` summed over servers).

use crate::access_log::{Entry, Outcome, Target};
use crate::compute::GraphHost;
use crate::msg::{Msg, Part, Routed, Values};
use flick_exec::Sent;
use flick_runtime::TrySendError;
use flick_wire::Routing;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A connection that answers what it is sent.
pub struct Peer {
    pub answers: bool,
    /// Requests sent and not answered yet, oldest first.
    pub outstanding: VecDeque<Pending>,
    pub dead: bool,
    /// When to try to reconnect a dead peer.
    pub retry_at: Option<Instant>,
    /// The wait before the next reconnection attempt.
    pub backoff: Duration,
    /// Its connection closed with nothing owed (a backend closing a
    /// connection it keeps no longer, as HTTP servers do after so many
    /// requests or so long idle), or broke after it had answered (a reset
    /// along the way, a backend restarted): the next request reconnects
    /// at once rather than failing for a backoff. A connection that breaks
    /// before any answer takes the backoff, so a backend that takes
    /// connections only to drop them is not reconnected per request.
    pub reconnect_at_once: bool,
    /// Its connection has answered a request.
    pub answered: bool,
    /// Since when its connection has owed nothing, after a reply.
    pub quiet_since: Option<Instant>,
    /// Since when a request has waited for a connection to it to come
    /// free (the worker has as many as it may).
    pub waiting_since: Option<Instant>,
}

/// How often a request waiting for a connection to come free looks again.
const CONNECTION_POLL: Duration = Duration::from_millis(5);

/// Why a request gets its grammar's `%fault` reply: `$$` in `%fault`
/// (HTTP answers 503, 504 and 502 for them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The peer is down or could not be reached: the request never got there.
    Unreachable = 1,
    /// The peer took longer than the response timeout.
    Timeout = 2,
    /// The peer's connection broke with the request unanswered.
    Lost = 3,
    /// The program faulted handling the request or its reply.
    Internal = 4,
}

/// What a request answered here, not by a peer, gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The grammar's `%reject` reply, with the status of the parse error.
    Reject(u16),
    /// The grammar's `%fault` reply for a compute fault.
    Fault,
}

/// The first wait before reconnecting, doubled after each failure.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait between reconnection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A request waiting for its reply.
pub struct Pending {
    pub request: Msg,
    /// What its reply will echo (`%correlate`).
    pub corr: Option<i128>,
    /// The broadcast it is part of.
    pub group: Option<u32>,
    /// When it was sent.
    pub sent: Instant,
    /// When its peer was last heard from about it: when it was sent, then
    /// when each part of a reply that streams came. The response timeout
    /// runs from it, so a reply that streams on is not cut short, nor one
    /// whose last part is on its way (nginx's `proxy_read_timeout` also
    /// runs between two reads).
    pub heard: Instant,
    /// Its place among the client's requests, for answering in order;
    /// `None` for a quiet request, which may get no reply (`%quiet`).
    pub seq: Option<u64>,
    /// Whether its final reply reaches the client: not for the parts of a
    /// split request (`%split`) but the last, whose final reply ends them all.
    pub keep_final: bool,
    /// A quiet request followed by the grammar's `%fence`: its replies, if
    /// any, are those before the fence's reply, which ends it.
    pub fenced: bool,
    /// It was sent again after its connection was lost.
    pub retried: bool,
    /// Part of its reply has gone on to the client (a streaming reply's
    /// head, a quiet request's hit): it must get no other reply, and is
    /// not sent again.
    pub replied: bool,
    /// Some of a reply that comes whole has come (`%coalesce`: a VALUE
    /// before its END): lost with its connection, it is not sent again,
    /// whose reply would repeat that part.
    pub begun: bool,
}

/// A reply on its way to the rule that reads its channel.
pub type Reply = (u16, Option<u32>, Msg);

/// The replies of one request held back, and whether all of them are in.
#[derive(Default)]
struct Held {
    replies: Vec<Reply>,
    done: bool,
}

/// Replies kept until every earlier request of the client has its own:
/// a client gets its replies in the order of its requests, whichever
/// backends answer first.
#[derive(Default)]
pub struct Order {
    next_seq: u64,
    /// The oldest request whose replies are not all passed on.
    deliver: u64,
    /// Requests `deliver..`, in order; reused so that nothing is allocated
    /// per request once warm.
    held: VecDeque<Held>,
    spare: Vec<Held>,
    /// Requests `deliver..next_seq`, in order: what the latency histogram
    /// and the access log need of each (kept, so nothing is allocated).
    records: VecDeque<Record>,
    /// The parts of a split request answered so far, whose line and
    /// latency are its last part's.
    carry: Option<Record>,
    /// The client's address, looked up once for the access log.
    client: Option<Option<SocketAddr>>,
    /// The client request whose rule runs now: when it arrived, its size,
    /// and the request number then; if the rule sends it to no peer, it is
    /// answered here (a static page) and counted when the rule ends.
    local: Option<(Instant, u64, u64)>,
    /// Bytes the running rule has sent to the client.
    local_reply_bytes: u64,
    /// The clock as the compute task's run read it (refreshed where a
    /// latency ends): what requests and replies are stamped with while
    /// it runs, so that each does not read the clock again. A run lasts
    /// about a timeslice (50 us), the most a stamp is early by; `None`
    /// outside a run.
    clock: Option<Instant>,
}

/// A client request waiting for its last reply.
#[derive(Clone, Copy)]
struct Record {
    arrived: Instant,
    request_bytes: u64,
    reply_bytes: u64,
    /// The output it went to (`None`: answered here; `Some(u16::MAX)`:
    /// every peer of a channel array).
    out: Option<u16>,
    outcome: Outcome,
    /// A part of a split request other than the last (`%split`).
    part: bool,
}

/// `Record::out` for a request sent to every peer.
const ALL: u16 = u16::MAX;

impl Record {
    /// This part of a split request and the `later` one, as one request.
    fn joined(self, later: Record) -> Record {
        Record {
            arrived: self.arrived,
            request_bytes: self.request_bytes + later.request_bytes,
            reply_bytes: self.reply_bytes + later.reply_bytes,
            out: if self.out == later.out {
                self.out
            } else {
                Some(ALL)
            },
            outcome: match self.outcome {
                Outcome::Reply => later.outcome,
                o => o,
            },
            part: later.part,
        }
    }
}

/// A request sent to every peer: its replies still to come, and the final
/// reply kept until the last one.
pub struct Group {
    pub remaining: u32,
    pub held: Option<Reply>,
    pub seq: Option<u64>,
    /// The request says its peers' entries merge (`%merge`).
    pub merge: bool,
    /// Those entries so far, with the output each came from.
    pub entries: Vec<(usize, Msg)>,
    /// A peer failed it: its fault reply is the final one, whichever
    /// peer answers last.
    pub faulted: bool,
}

/// Requests remembered per peer; beyond this (quiet requests that are never
/// answered) the oldest are forgotten.
const MAX_OUTSTANDING: usize = 256;

impl Order {
    /// Back to a new client's first request, keeping the storage.
    pub fn reset(&mut self) {
        self.next_seq = 0;
        self.deliver = 0;
        self.records.clear();
        self.carry = None;
        self.client = None;
        self.local = None;
        self.clock = None;
        for mut h in self.held.drain(..) {
            h.replies.clear();
            h.done = false;
            self.spare.push(h);
        }
    }

    /// The next request's number, noting when it arrived and its size.
    fn take_seq(&mut self, out: Option<u16>, request_bytes: usize, part: bool) -> u64 {
        self.records.push_back(Record {
            arrived: self.clock.unwrap_or_else(Instant::now),
            request_bytes: request_bytes as u64,
            reply_bytes: 0,
            out,
            outcome: Outcome::Reply,
            part,
        });
        self.next_seq += 1;
        self.next_seq - 1
    }

    /// The last number taken goes back: its request was not sent.
    fn untake(&mut self, seq: Option<u64>) {
        if seq.is_some_and(|s| s + 1 == self.next_seq) {
            self.next_seq -= 1;
            self.records.pop_back();
        }
    }

    fn record(&mut self, seq: Option<u64>) -> Option<&mut Record> {
        let at = seq?.checked_sub(self.deliver)?;
        self.records.get_mut(at as usize)
    }
}

impl GraphHost {
    /// A routing property of a message read from `chan`.
    pub(crate) fn property(&self, chan: u16, p: Routing, m: &Msg) -> Option<i128> {
        let unit = self.units.get(chan as usize).copied().flatten()?;
        self.grammar.routing(unit, p, &m.slots, &m.bytes)
    }

    /// A routing property of a message written to `chan`.
    pub(crate) fn out_property(&self, chan: u16, p: Routing, m: &Msg) -> Option<i128> {
        let unit = self.out_units.get(chan as usize).copied().flatten()?;
        self.grammar.routing(unit, p, &m.slots, &m.bytes)
    }

    /// Whether `m` ends its session and the connection it goes over
    /// (`%ends_peer`, by default as `%ends`).
    fn ends_peer(&self, chan: u16, m: &Msg) -> bool {
        let ends = self.out_property(chan, Routing::Ends, m).unwrap_or(0) != 0;
        ends && self
            .out_property(chan, Routing::EndsPeer, m)
            .is_none_or(|v| v != 0)
    }

    /// Sends `request` to output `out`, or to every peer of its channel
    /// array if the grammar says it goes to all (`%broadcast`).
    pub(crate) fn route(&mut self, out: usize, request: Msg) -> Sent {
        let sent = self.route_or_hand_back(out, request);
        self.full_unless_sent(sent)
    }

    /// [`GraphHost::route`], handing `request` back where it cannot go
    /// yet (a full peer: [`Sent::Full`]).
    pub(crate) fn route_or_hand_back(&mut self, out: usize, request: Msg) -> Result<Sent, Msg> {
        let chan = self.outputs[out].chan;
        let answers = self.peers[out].answers;
        let broadcast = answers
            && self.outputs[out].index.is_some()
            && self
                .out_property(chan, Routing::Broadcast, &request)
                .unwrap_or(0)
                != 0;
        // Pieces of a body carry no values.
        let quiet = matches!(request.part, Part::Whole | Part::Head)
            && self
                .out_property(chan, Routing::Quiet, &request)
                .unwrap_or(0)
                != 0;
        // A quiet request with a fence after it is answered like any other:
        // the fence's reply says where its replies end.
        let fenced = quiet && request.part == Part::Whole && self.fence(chan).is_some();
        let quiet = quiet && !fenced;
        if !broadcast {
            // A full channel sends nothing: the request keeps no number.
            // Nor does a peer owing as many replies as are remembered: the
            // send waits until replies come in (quiet requests at the front
            // are forgotten instead, as they may never be answered).
            let owing = &self.peers[out].outstanding;
            let owes_too_many = answers
                && !quiet
                && owing.len() >= MAX_OUTSTANDING
                && owing.front().is_some_and(|p| p.seq.is_some());
            let full = (owes_too_many
                || self.outputs[out].tx.as_ref().is_some_and(|t| !t.has_room()))
                && !self.peers[out].dead;
            if full || (answers && self.waits_for_connection(out)) {
                return Err(request);
            }
            // The session is ending (the request read last said so, and was
            // read after every earlier one was sent): its requests must not
            // close a connection other instances share.
            // Unless the grammar passes requests on so that they keep the
            // peer's connection (`%ends_peer = 0`: HTTP asks for keep-alive).
            let ending = self.ending
                && answers
                && self.outputs[out].shared
                && self
                    .out_property(chan, Routing::EndsPeer, &request)
                    .is_none_or(|v| v != 0);
            if ending && !self.peers[out].dead && !self.own_connection_for(out) {
                return Err(request);
            }
            // Counted once sent: a full channel's send runs again.
            if !answers && chan == self.client_chan {
                self.order.local_reply_bytes += request.bytes.len() as u64;
            }
            let part = !self.part_last.unwrap_or(true);
            let seq = (answers && !quiet).then(|| {
                self.order
                    .take_seq(Some(out as u16), request.bytes.len(), part)
            });
            return self.send_one_or_hand_back(out, request, None, seq, fenced);
        }
        let targets: Vec<usize> = (0..self.outputs.len())
            .filter(|o| self.outputs[*o].chan == chan)
            .collect();
        // All or none: a full peer holds the whole broadcast back.
        if targets.iter().any(|o| {
            self.outputs[*o].tx.as_ref().is_some_and(|t| !t.has_room()) && !self.peers[*o].dead
        }) {
            return Err(request);
        }
        let part = !self.part_last.unwrap_or(true);
        let seq = (!quiet).then(|| self.order.take_seq(Some(ALL), request.bytes.len(), part));
        let merge = self
            .out_property(chan, Routing::Merge, &request)
            .unwrap_or(0)
            != 0;
        let group = self.new_group(targets.len() as u32, seq, merge);
        for o in targets {
            let copy = self.pool.copy(&request);
            self.send_one(o, copy, Some(group), seq, fenced);
        }
        self.pool.give(request);
        Ok(Sent::Done)
    }

    fn new_group(&mut self, remaining: u32, seq: Option<u64>, merge: bool) -> u32 {
        let g = Group {
            remaining,
            held: None,
            seq,
            merge,
            entries: Vec::new(),
            faulted: false,
        };
        match self.groups.iter().position(|g| g.is_none()) {
            Some(i) => {
                self.groups[i] = Some(g);
                i as u32
            }
            None => {
                self.groups.push(Some(g));
                self.groups.len() as u32 - 1
            }
        }
    }

    /// The `%fence` written after a quiet request sent on `chan`.
    fn fence(&self, chan: u16) -> Option<&[u8]> {
        let unit = self.out_units.get(chan as usize).copied().flatten()?;
        self.grammar.fence(unit)
    }

    fn send_one(
        &mut self,
        out: usize,
        request: Msg,
        group: Option<u32>,
        seq: Option<u64>,
        fenced: bool,
    ) -> Sent {
        let sent = self.send_one_or_hand_back(out, request, group, seq, fenced);
        self.full_unless_sent(sent)
    }

    /// A send's outcome where a message handed back is not kept: it goes
    /// back to the pool, and the send found its channel full.
    fn full_unless_sent(&mut self, sent: Result<Sent, Msg>) -> Sent {
        sent.unwrap_or_else(|request| {
            self.pool.give(request);
            Sent::Full
        })
    }

    /// [`GraphHost::send_one`], handing `request` back unedited where its
    /// channel is full (a channel has one producer, this task, so a
    /// channel with room takes the send that follows).
    fn send_one_or_hand_back(
        &mut self,
        out: usize,
        request: Msg,
        group: Option<u32>,
        seq: Option<u64>,
        fenced: bool,
    ) -> Result<Sent, Msg> {
        let answers = self.peers[out].answers;
        let chan = self.outputs[out].chan;
        // A quiet request of a protocol whose replies do not say what they
        // answer, and that has no fence, gets no reply at all: nothing
        // waits for one. What its reply will echo, worked out once (a
        // fenced request needs no echo: the fence ends its replies).
        let corr = (answers && !fenced)
            .then(|| self.out_property(chan, Routing::Correlate, &request))
            .flatten();
        let silent = answers && seq.is_none() && corr.is_none();
        let keep_final = self.part_last.unwrap_or(true);
        let gone = self.peers[out].dead || self.outputs[out].tx.is_none();
        if answers && !gone && self.idled_too_long(out) {
            self.renew_connection(out);
        }
        if answers && gone && self.peers[out].reconnect_at_once {
            self.reconnect_now(out, self.resending);
        }
        if answers && (self.peers[out].dead || self.outputs[out].tx.is_none()) {
            // A part of a split request gets the fault reply like any
            // request: left out, its keys would read as misses.
            if silent {
                self.pool.give(request);
                match group {
                    Some(g) => self.settle_group(g, None),
                    None => self.reply_for(seq, None, true),
                }
            } else {
                self.fault(out, request, group, seq, Cause::Unreachable);
            }
            return Ok(Sent::Done);
        }
        if self.outputs[out].tx.is_none() {
            self.pool.give(request);
            self.lost_stream(out);
            return Ok(Sent::Done);
        }
        if self.outputs[out].tx.as_ref().is_some_and(|t| !t.has_room()) {
            // Not sent: its number goes back, or later replies would wait for it.
            self.order.untake(seq);
            return Err(request);
        }
        // What is written is the message as the grammar passes it on, its
        // bytes alone; what is remembered (for a retry or a fault reply) is
        // the request itself, with the values it was parsed with. The
        // backend connection's writer gets what it needs of those values
        // worked out here.
        let routed = match (answers && !silent, request.part) {
            (true, Part::Whole | Part::Head) => {
                // What route worked out already: a request to a peer that
                // answers has no number exactly where it is quiet and not
                // fenced (`backend::routed_of` reads the same from values).
                let quiet = fenced || seq.is_none();
                let context = self
                    .out_property(chan, Routing::ReplyContext, &request)
                    .unwrap_or(0);
                Routed::new(quiet, fenced, corr, context)
            }
            // Pieces of a body carry no values, and are matched to nothing.
            (true, _) => Some(Routed::default()),
            (false, _) => None,
        };
        let (mut request, remember) = match routed {
            Some(routed) => {
                let mut sent = match self.forwarded(out, &request) {
                    Some(edited) => edited,
                    None => self.pool.copy_bytes(&request),
                };
                sent.routed = routed;
                (sent, Some(request))
            }
            None if answers && !silent => {
                // A context beyond a word: the values go along (no grammar's).
                let copy = self.pool.copy(&request);
                let mut request = request;
                self.edit_forwarded(out, &mut request);
                (request, Some(copy))
            }
            None => {
                let mut request = request;
                self.edit_forwarded(out, &mut request);
                (request, None)
            }
        };
        // Looked up (by name) only for a request that has one.
        if fenced {
            if let Some(fence) = self.fence(chan) {
                request.bytes.extend_from_slice(fence);
            }
        }
        let Some(tx) = &self.outputs[out].tx else {
            unreachable!("an output with no connection returned above")
        };
        let crc = self.outputs[out].crc.as_ref().map(|c| {
            let mut c = c.clone();
            c.update(&request.bytes);
            c
        });
        match tx.try_send(request) {
            Ok(()) => {
                if crc.is_some() {
                    self.outputs[out].crc = crc;
                }
                if let (true, Some(g)) = (silent, group) {
                    self.settle_group(g, None);
                }
                if let Some(r) = remember {
                    let now = self.now();
                    self.peers[out].outstanding.push_back(Pending {
                        request: r,
                        corr,
                        group,
                        sent: now,
                        heard: now,
                        seq,
                        keep_final,
                        fenced,
                        retried: self.resending,
                        replied: false,
                        begun: false,
                    });
                    if self.peers[out].outstanding.len() > MAX_OUTSTANDING {
                        let old = self.peers[out]
                            .outstanding
                            .pop_front()
                            .expect("over the limit");
                        self.forget(old);
                    }
                }
                Ok(Sent::Done)
            }
            Err(TrySendError::Full(m)) => {
                self.pool.give(m);
                if let Some(r) = remember {
                    self.pool.give(r);
                }
                // Not sent: its number goes back, or later replies would wait for it.
                self.order.untake(seq);
                Ok(Sent::Full)
            }
            // The connection is gone: a peer's requests get fault replies.
            Err(TrySendError::Closed(m)) => {
                // Closed with nothing owed (the backend closed a connection
                // it keeps no longer), this request not written: it goes
                // over a new connection, once, as it was before its edits.
                let clean = answers
                    && !self.resending
                    && self.peers[out].outstanding.is_empty()
                    && !self.peers[out].dead;
                let m = match (clean, remember) {
                    (true, Some(r)) => {
                        self.pool.give(m);
                        self.peer_gone(out, Cause::Lost);
                        self.resending = true;
                        let sent = self.send_one(out, r, group, seq, fenced);
                        self.resending = false;
                        return Ok(sent);
                    }
                    // The fault reply is made from the request as it was
                    // read, whose values match its bytes.
                    (_, Some(r)) => {
                        self.pool.give(m);
                        r
                    }
                    (_, None) => m,
                };
                if answers {
                    self.peer_gone(out, Cause::Unreachable);
                    self.fault(out, m, group, seq, Cause::Unreachable);
                } else {
                    self.pool.give(m);
                    self.lost_stream(out);
                }
                Ok(Sent::Done)
            }
        }
    }

    /// A request that will get no reply (a quiet request whose peer said
    /// nothing): it counts as answered in its broadcast.
    fn forget(&mut self, p: Pending) {
        self.pool.give(p.request);
        match p.group {
            Some(g) => self.settle_group(g, None),
            None => self.reply_for(p.seq, None, true),
        }
    }

    /// Files a reply (or, with `None`, just the end) of request `seq`, and
    /// passes on every reply whose earlier requests are all answered.
    fn reply_for(&mut self, seq: Option<u64>, reply: Option<Reply>, last: bool) {
        let Some(seq) = seq else {
            self.ready.extend(reply);
            return;
        };
        if let (Some(r), Some((_, _, m))) = (self.order.record(Some(seq)), &reply) {
            r.reply_bytes += m.bytes.len() as u64;
        }
        let dropping = self.ending_split();
        let order = &mut self.order;
        if seq < order.deliver {
            // A late extra reply to a request already answered: never
            // passed on, where it would answer the client's next request.
            if let Some((chan, index, m)) = reply {
                self.late_reply(chan, index, m);
            }
            return;
        }
        if seq == order.deliver && order.held.front().is_none_or(|h| h.replies.is_empty()) {
            // In order, the common case: straight through.
            match reply {
                Some((_, _, m)) if dropping => self.pool.give(m),
                r => self.ready.extend(r),
            }
            if last {
                if let Some(h) = order.held.pop_front() {
                    order.spare.push(h);
                }
                order.deliver += 1;
                let done = order.records.pop_front();
                self.answered(done);
            } else if order.held.is_empty() {
                let h = order.spare.pop().unwrap_or_default();
                order.held.push_back(h);
            }
        } else {
            let at = (seq - order.deliver) as usize;
            while order.held.len() <= at {
                let mut h = order.spare.pop().unwrap_or_default();
                h.done = false;
                order.held.push_back(h);
            }
            order.held[at].replies.extend(reply);
            order.held[at].done |= last;
        }
        loop {
            let dropping = self.ending_split();
            let Some(h) = self.order.held.front_mut() else {
                break;
            };
            if dropping {
                for (_, _, m) in h.replies.drain(..) {
                    self.pool.give(m);
                }
            } else {
                self.ready.extend(h.replies.drain(..));
            }
            if !h.done {
                break;
            }
            let mut h = self.order.held.pop_front().expect("a front");
            h.done = false;
            self.order.spare.push(h);
            self.order.deliver += 1;
            let done = self.order.records.pop_front();
            self.answered(done);
        }
    }

    /// Whether the request next in order is a later part of a split
    /// request an earlier part of which got the fault reply: that reply
    /// ended the client's reply (one `SERVER_ERROR` for a get of several
    /// keys), so the later parts' replies are dropped, their `END` too.
    fn ending_split(&self) -> bool {
        self.order
            .carry
            .is_some_and(|c| c.outcome == Outcome::Fault)
    }

    /// A rule starts on a client request of `request_bytes`.
    pub(crate) fn request_started(&mut self, request_bytes: usize) {
        let o = &mut self.order;
        o.local = Some((
            o.clock.unwrap_or_else(Instant::now),
            request_bytes as u64,
            o.next_seq,
        ));
        o.local_reply_bytes = 0;
    }

    /// The rule on a client request ended. If it sent the request to no
    /// peer and wrote the client a reply itself, that request is answered
    /// here: its latency and access log line are recorded now, as a
    /// proxied request's are when its last reply is passed on.
    pub(crate) fn request_ended(&mut self) {
        let Some((arrived, request_bytes, seq)) = self.order.local.take() else {
            return;
        };
        let o = &self.order;
        if o.next_seq != seq || o.local_reply_bytes == 0 || o.carry.is_some() {
            return;
        }
        let record = Record {
            arrived,
            request_bytes,
            reply_bytes: o.local_reply_bytes,
            out: None,
            outcome: Outcome::Reply,
            part: false,
        };
        self.answered(Some(record));
    }

    /// A client request's last reply is passed on: its latency is
    /// recorded, and its access log line written.
    fn answered(&mut self, record: Option<Record>) {
        let Some(mut r) = record else { return };
        if let Some(earlier) = self.order.carry.take() {
            r = earlier.joined(r);
        }
        if r.part {
            // The parts of a split request are one request to its client.
            self.order.carry = Some(r);
            return;
        }
        // A reply from a peer was timed as it came (`replied_in`), which
        // refreshed the run's clock; one answered here reads it anew.
        let now = match r.out {
            Some(_) => self.now(),
            None => self.clock_read(),
        };
        let took = now.saturating_duration_since(r.arrived);
        let client = self.client_chan as usize;
        if let Some(c) = self.stats.channels.get(client) {
            c.latency.record(took);
        }
        if self.stats.access_log.is_none() {
            return;
        }
        let address = *self.order.client.get_or_insert_with(|| {
            self.outputs
                .iter()
                .find(|o| o.chan == client as u16)
                .and_then(|o| o.conn.as_ref())
                .and_then(|c| c.0.stream.peer_addr().ok())
        });
        let backend = match r.out {
            None => Target::None,
            Some(ALL) => Target::All,
            Some(out) => self
                .outputs
                .get(out as usize)
                .and_then(|o| self.stats.backend(o.chan, o.index))
                .map_or(Target::None, |b| Target::Backend(b.addr)),
        };
        let channel = self.stats.channels.get(client).map_or("-", |c| &c.name);
        let Some(log) = &self.stats.access_log else {
            return;
        };
        log.log(
            self.waker.home_of(self.id),
            &Entry {
                client: address,
                channel,
                backend,
                outcome: r.outcome,
                request_bytes: r.request_bytes,
                reply_bytes: r.reply_bytes,
                duration: took,
            },
        );
    }

    /// A client request answered here rather than by a peer: one that did
    /// not parse (`%resync` skipped it) gets the grammar's `%reject` reply,
    /// one whose rule faulted the `%fault` reply, in its place among the
    /// replies, passed on as if a peer had answered it. Where the grammar
    /// has no such reply, the client's connection closes, so that it does
    /// not wait for a reply that will not come.
    pub(crate) fn answer_request(&mut self, request: Msg, answer: Answer) {
        let client = self.client_chan as usize;
        let Some(unit) = self.out_units.get(client).copied().flatten() else {
            self.pool.give(request);
            self.close_client("no error reply can be written for a request it sent");
            return;
        };
        let request_bytes = request.bytes.len();
        let outcome = match answer {
            // A request that parsed was refused (`%refuse`).
            Answer::Reject(_) if request.rejected.is_none() => Outcome::Refused,
            Answer::Reject(_) => Outcome::Reject,
            Answer::Fault => Outcome::Fault,
        };
        let mut reply = self.pool.take();
        let made = match answer {
            Answer::Reject(status) => {
                let status = (status != 0).then_some(status);
                let read_as = self.units.get(client).copied().flatten();
                match (read_as == Some(unit), request.rejected.is_none()) {
                    // A request that parsed, of the reply's own unit.
                    (true, true) => self.grammar.reject_reply_to(
                        unit,
                        &request.slots,
                        &request.bytes,
                        status,
                        &mut reply.bytes,
                    ),
                    // A reply that echoes its request (Memcached's binary
                    // opcode and opaque): from the part that parsed, where
                    // the reader kept it (a header that gave the length to
                    // skip); else it cannot be made, and the connection
                    // closes.
                    (true, false) if !request.bytes.is_empty() => self.grammar.reject_reply_to(
                        unit,
                        &request.slots,
                        &request.bytes,
                        status,
                        &mut reply.bytes,
                    ),
                    (true, false) => Ok(false),
                    (false, _) => self.grammar.reject_reply(unit, status, &mut reply.bytes),
                }
            }
            Answer::Fault => {
                let read_as = self.units.get(client).copied().flatten();
                self.fault_bytes(unit, read_as, &request, Cause::Internal, &mut reply.bytes)
            }
        };
        self.pool.give(request);
        if !matches!(made, Ok(true)) {
            self.pool.give(reply);
            self.close_client("no error reply can be written for a request it sent");
            return;
        }
        if answer == Answer::Fault {
            self.stats.fault_replies.fetch_add(1, Ordering::Relaxed);
        }
        // The reply goes on with the values it is written from (`%forward`
        // edits them), read as the peers' replies are.
        let peer = self.peers.iter().position(|p| p.answers);
        let read_as = peer
            .and_then(|out| {
                self.units
                    .get(self.outputs[out].chan as usize)
                    .copied()
                    .flatten()
            })
            .unwrap_or(unit);
        let mut parser = self.grammar.parser(read_as);
        if !matches!(
            parser.parse(&reply.bytes),
            Ok(flick_wire::Progress::Done(_) | flick_wire::Progress::Head(_))
        ) {
            self.pool.give(reply);
            return;
        }
        let values = crate::msg::Values::parsed(&parser);
        self.pool.copy_values(&mut reply, values, parser.slots());
        match peer {
            // No peers (a static server): every earlier reply went out as
            // its request was handled, so this one goes straight after.
            None => match self.outputs.iter().position(|o| o.chan == client as u16) {
                Some(client_out) => {
                    let _ = self.route(client_out, reply);
                }
                None => self.pool.give(reply),
            },
            Some(out) => {
                let (chan, index) = (self.outputs[out].chan, self.outputs[out].index);
                let seq = Some(self.order.take_seq(None, request_bytes, false));
                if let Some(r) = self.order.record(seq) {
                    r.outcome = outcome;
                }
                self.reply_for(seq, Some((chan, index, reply)), true);
            }
        }
    }

    /// The `%fault` reply of unit `unit` for `request`, a message of unit
    /// `request_unit`, into `out`: built from the request's values when the
    /// two are of one unit (Memcached's binary `cmd` echoes the opcode and
    /// opaque), else from none.
    fn fault_bytes(
        &self,
        unit: flick_wire::UnitId,
        request_unit: Option<flick_wire::UnitId>,
        request: &Msg,
        cause: Cause,
        out: &mut Vec<u8>,
    ) -> Result<bool, flick_wire::WireError> {
        match Some(unit) == request_unit {
            true => {
                self.grammar
                    .fault_reply(unit, &request.slots, &request.bytes, cause as u16, out)
            }
            false => {
                let unset = vec![flick_wire::Slot::Unset; self.grammar.unit(unit).slots as usize];
                self.grammar
                    .fault_reply(unit, &unset, &[], cause as u16, out)
            }
        }
    }

    /// A peer's reply whose rule faulted before passing it on: the client
    /// gets the grammar's `%fault` reply in its place, straight away (the
    /// reply's turn among the client's replies is now), or its connection
    /// closes where there is none.
    pub(crate) fn fault_to_client(&mut self, reply: Msg, from: u16) {
        let client = self.client_chan;
        let out = self.outputs.iter().position(|o| o.chan == client);
        let unit = self.out_units.get(client as usize).copied().flatten();
        let (Some(out), Some(unit)) = (out, unit) else {
            self.pool.give(reply);
            self.close_client("no fault reply can be written in place of a reply");
            return;
        };
        let mut m = self.pool.take();
        let read_as = self.units.get(from as usize).copied().flatten();
        let made = self.fault_bytes(unit, read_as, &reply, Cause::Internal, &mut m.bytes);
        self.pool.give(reply);
        let mut parser = self.grammar.parser(unit);
        let parsed = matches!(made, Ok(true))
            && matches!(
                parser.parse(&m.bytes),
                Ok(flick_wire::Progress::Done(_) | flick_wire::Progress::Head(_))
            );
        if !parsed {
            self.pool.give(m);
            self.close_client("no fault reply can be written in place of a reply");
            return;
        }
        let values = crate::msg::Values::parsed(&parser);
        self.pool.copy_values(&mut m, values, parser.slots());
        self.stats.fault_replies.fetch_add(1, Ordering::Relaxed);
        let _ = self.route(out, m);
    }

    /// A stream the instance writes to a peer that answers nothing (a
    /// reducer) is gone: what it would carry cannot be delivered, so the
    /// instance ends and its clients see their connections close rather
    /// than their data vanish.
    /// Ends the instance, closing its client's connection, because a reply
    /// cannot be given whole: logged and counted, never silent.
    /// The body of the request whose head went to output `out` does not
    /// parse (over `max_body_bytes`, a bad chunk): the body goes no
    /// further, and the client reads no more. The backend has the head and
    /// may have acted on it, so the request's reply is the backend's (or
    /// the fault reply if none comes in time), never a reject reply that
    /// would say it was not processed; the reject goes nowhere.
    pub(crate) fn body_failed(&mut self, request: Msg, status: u16) {
        static CUT: crate::log::RateLimit = crate::log::RateLimit::new();
        crate::limited!(
            CUT,
            info,
            status,
            "a request's body does not parse after its head went on: the body is cut \
             short, and the backend's reply is the request's"
        );
        self.pool.give(request);
    }

    pub(crate) fn close_client(&mut self, why: &str) {
        self.broken = true;
        self.stats.clients_closed.fetch_add(1, Ordering::Relaxed);
        static CLOSED: crate::log::RateLimit = crate::log::RateLimit::new();
        crate::limited!(CLOSED, warn, "a client's connection is closed: {why}");
    }

    /// A reply the client is getting was cut short by its backend: the
    /// client's connection closes once what is queued for it went on.
    fn cut_client(&mut self) {
        self.cutting = true;
        self.stats.clients_closed.fetch_add(1, Ordering::Relaxed);
        static CUT: crate::log::RateLimit = crate::log::RateLimit::new();
        crate::limited!(
            CUT,
            warn,
            "a client's connection is closed: its reply was cut short by its backend"
        );
    }

    /// Takes back the parts of request `seq`'s reply from output `out`
    /// that came but have not gone on to the client (held behind an
    /// earlier request's reply, or queued for the rules); `true` if none
    /// of it went on, so that it can still get a whole reply instead.
    fn take_back_reply(&mut self, out: usize, seq: Option<u64>) -> bool {
        let Some(seq) = seq else {
            return false;
        };
        let deliver = self.order.deliver;
        if seq > deliver {
            // Held: nothing of it went on.
            if let Some(h) = self.order.held.get_mut((seq - deliver) as usize) {
                for (_, _, m) in h.replies.drain(..) {
                    self.pool.give(m);
                }
            }
            return true;
        }
        if seq < deliver {
            return false;
        }
        // Next in order: its parts went to `ready`, after its head.
        let (chan, index) = (self.outputs[out].chan, self.outputs[out].index);
        let from_peer = |r: &Reply| r.0 == chan && r.1 == index;
        let Some(head) = self
            .ready
            .iter()
            .rposition(|r| from_peer(r) && r.2.part == Part::Head)
        else {
            return false;
        };
        if self
            .ready
            .iter()
            .skip(head + 1)
            .any(|r| from_peer(r) && r.2.part == Part::End)
        {
            // That head is an earlier reply's, whole.
            return false;
        }
        let mut i = self.ready.len();
        while i > head {
            i -= 1;
            if from_peer(&self.ready[i]) {
                if let Some((_, _, m)) = self.ready.remove(i) {
                    self.pool.give(m);
                }
            }
        }
        true
    }

    fn lost_stream(&mut self, out: usize) {
        if self.outputs[out].chan != self.client_chan {
            self.close_client("a stream it feeds is lost");
        }
    }

    /// A request that ends its session (HTTP's `Connection: close`) would
    /// close a connection other instances share: it goes over one of this
    /// instance's own, once the shared one owes it nothing (its replies
    /// must not race the new connection's). `false` while replies are owed.
    fn own_connection_for(&mut self, out: usize) -> bool {
        if !self.peers[out].outstanding.is_empty() {
            return false;
        }
        let (chan, index) = (self.outputs[out].chan, self.outputs[out].index);
        match (self.own_connection)(self.id, chan, index) {
            Some((input, output)) => {
                self.outputs[out] = output;
                self.new_inputs.push(input);
            }
            // Unreachable: the request gets the fault reply as usual.
            None => self.peers[out].dead = true,
        }
        true
    }

    /// A reply from peer `chan[index]`.
    pub fn on_reply(&mut self, chan: u16, index: Option<u32>, mut reply: Msg) {
        let Some(out) = self
            .outputs
            .iter()
            .position(|o| o.chan == chan && o.index == index)
        else {
            self.ready.push_back((chan, index, reply));
            return;
        };
        // A head and the pieces of its body are followed by more; pieces
        // carry no values.
        let whole_or_head = matches!(reply.part, Part::Whole | Part::Head);
        // What a shared connection's reader read of it, with the unit this
        // channel reads, is not read again.
        let unit = self.units.get(chan as usize).copied().flatten();
        let readings = reply
            .routed
            .reply_readings()
            .filter(|_| matches!(reply.values, Values::Parsed { unit: u, .. } if Some(u) == unit));
        let (corr, continues) = match readings {
            Some((corr, more)) => (corr, reply.part == Part::Whole && more),
            None => (
                whole_or_head
                    .then(|| self.property(chan, Routing::Correlate, &reply))
                    .flatten(),
                reply.part == Part::Whole
                    && self.property(chan, Routing::More, &reply).unwrap_or(0) != 0,
            ),
        };
        let more = matches!(reply.part, Part::Head | Part::Body) || continues;
        // Held back for the rest of its reply where the grammar says the
        // rest follows by itself (a VALUE's END, not HTTP's final response
        // after `100 Continue`, which waits for the client's body).
        reply.continued =
            continues && self.property(chan, Routing::Coalesce, &reply).unwrap_or(0) != 0;

        // A quiet request's replies run up to its fence's reply, which
        // ends it and goes no further.
        let mut more = more;
        if self.peers[out]
            .outstanding
            .front()
            .is_some_and(|p| p.fenced)
        {
            if reply.part == Part::Whole
                && self.property(chan, Routing::Fenced, &reply).unwrap_or(0) != 0
            {
                let p = self.peers[out].outstanding.pop_front().expect("a front");
                self.replied_in(chan, index, p.sent);
                self.pool.give(p.request);
                self.pool.give(reply);
                match p.group {
                    Some(g) => self.settle_group(g, None),
                    None => self.reply_for(p.seq, None, true),
                }
                return;
            }
            more = true;
        }
        // Earlier requests whose replies never came were quiet ones.
        while let Some(front) = self.peers[out].outstanding.front() {
            match (front.corr, corr) {
                (Some(a), Some(b)) if a != b => {
                    let p = self.peers[out].outstanding.pop_front().expect("a front");
                    self.forget(p);
                }
                _ => break,
            }
        }
        let Some(front) = self.peers[out].outstanding.front() else {
            // A reply to nothing asked (unsolicited, or late for a request
            // that had its fault reply): passed on, it would answer the
            // client's next request.
            self.late_reply(chan, index, reply);
            return;
        };
        let (group, seq, keep) = (front.group, front.seq, front.keep_final);
        // Part of the reply goes on: a quiet request's hit is its reply, and
        // a streaming reply's head or body piece can only be cut short
        // after it, not followed by another reply.
        let streaming = matches!(reply.part, Part::Head | Part::Body);
        if more {
            if let Some(p) = self.peers[out].outstanding.front_mut() {
                p.replied |= streaming || p.fenced;
                p.begun |= reply.continued;
                if streaming {
                    p.heard = self.order.clock.unwrap_or_else(Instant::now);
                }
            }
        }
        if !more {
            if let Some(p) = self.peers[out].outstanding.pop_front() {
                self.replied_in(chan, index, p.sent);
                self.pool.give(p.request);
                self.peers[out].answered = true;
            }
            match self.peers[out].outstanding.front_mut() {
                // Replies come in order: the peer is heard from about the
                // next request from now on.
                Some(next) => next.heard = self.order.clock.unwrap_or_else(Instant::now),
                None if self.outputs[out].idle_limit.is_some() => {
                    self.peers[out].quiet_since = Some(self.now());
                }
                None => {}
            }
            if !keep {
                // A split request's part: its end is not the client's. A
                // reply read with that end (`Msg::end_at`) is, and the
                // client's reply goes on after it.
                if reply.end_at > 0 {
                    let mut reply = reply;
                    reply.bytes.truncate(reply.end_at as usize);
                    reply.end_at = 0;
                    reply.continued = true;
                    self.reply_for(seq, Some((chan, index, reply)), true);
                } else {
                    self.pool.give(reply);
                    self.reply_for(seq, None, true);
                }
                return;
            }
        }
        match group {
            Some(g) if !more => self.settle_group(g, Some((chan, index, reply))),
            // An entry of a reply that merges waits for the others'.
            Some(g) if continues && self.merges(g, chan, &reply) => {
                if let Some(Some(group)) = self.groups.get_mut(g as usize) {
                    group.entries.push((out, reply));
                }
            }
            _ => self.reply_for(seq, Some((chan, index, reply)), !more),
        }
    }

    /// Whether `reply`, from `chan`, is an entry of broadcast `g` that
    /// merges with the other peers' (`%merge`, `%merge_key`).
    fn merges(&self, g: u32, chan: u16, reply: &Msg) -> bool {
        let merge = self
            .groups
            .get(g as usize)
            .and_then(|x| x.as_ref())
            .is_some_and(|g| g.merge);
        let unit = self.units.get(chan as usize).copied().flatten();
        merge
            && reply.part == Part::Whole
            && unit.is_some_and(|u| {
                self.grammar
                    .merge_key(u, &reply.slots, &reply.bytes)
                    .is_some()
            })
    }

    /// The entries of a merged broadcast, one per key, in the order the
    /// first peer (by index) gave them, each peer's numbers added where
    /// the grammar says (`%merge_sum`); the first peer's entry stands
    /// elsewhere. Not a hot path: a request an operator sends.
    fn merge_entries(&mut self, mut entries: Vec<(usize, Msg)>) -> Vec<(usize, Msg)> {
        entries.sort_by_key(|(out, _)| *out);
        let mut merged: Vec<(usize, Msg)> = Vec::with_capacity(entries.len());
        let mut bytes = Vec::new();
        for (out, m) in entries {
            let chan = self.outputs[out].chan;
            let Some(unit) = self.units.get(chan as usize).copied().flatten() else {
                merged.push((out, m));
                continue;
            };
            let key = self.grammar.merge_key(unit, &m.slots, &m.bytes);
            let Some(at) = merged.iter().position(|(_, e)| {
                key.is_some() && self.grammar.merge_key(unit, &e.slots, &e.bytes) == key
            }) else {
                merged.push((out, m));
                continue;
            };
            bytes.clear();
            let first = &merged[at].1;
            let added = self.grammar.merge_add(
                unit,
                (&first.slots, &first.bytes),
                (&m.slots, &m.bytes),
                &mut bytes,
            );
            self.pool.give(m);
            if !matches!(added, Ok(true)) {
                continue;
            }
            let mut parser = self.grammar.parser(unit);
            if let Ok(flick_wire::Progress::Done(_)) = parser.parse(&bytes) {
                let mut sum = self.pool.take();
                sum.bytes.extend_from_slice(&bytes);
                sum.continued = merged[at].1.continued;
                let values = crate::msg::Values::parsed(&parser);
                self.pool.copy_values(&mut sum, values, parser.slots());
                let old = std::mem::replace(&mut merged[at].1, sum);
                self.pool.give(old);
            }
        }
        merged
    }

    /// Drops a reply no waiting request owns: logged and counted.
    fn late_reply(&mut self, chan: u16, index: Option<u32>, m: Msg) {
        self.stats.late_replies.fetch_add(1, Ordering::Relaxed);
        static LATE: crate::log::RateLimit = crate::log::RateLimit::new();
        crate::limited!(
            LATE,
            warn,
            channel = chan,
            index = ?index,
            bytes = m.bytes.len(),
            "a backend reply answers no waiting request (late, after its fault reply, or \
             unsolicited): dropped"
        );
        self.pool.give(m);
    }

    /// Peer `chan[index]` gave its last reply to a request sent at `sent`.
    fn replied_in(&mut self, chan: u16, index: Option<u32>, sent: Instant) {
        let now = self.clock_read();
        if let Some(b) = self.stats.backend(chan, index) {
            b.answered(now.saturating_duration_since(sent));
        }
    }

    /// The compute task's run began at `now`: stamps taken during it use
    /// that reading (see `Order::clock`).
    pub(crate) fn run_began(&mut self, now: Instant) {
        self.order.clock = Some(now);
    }

    /// The run is over: stamps read the clock again.
    pub(crate) fn run_ended(&mut self) {
        self.order.clock = None;
    }

    /// The time to stamp something with: the run's reading.
    fn now(&self) -> Instant {
        self.order.clock.unwrap_or_else(Instant::now)
    }

    /// The clock read now, where a latency ends; later stamps in the run
    /// use this reading.
    fn clock_read(&mut self) -> Instant {
        let now = Instant::now();
        if self.order.clock.is_some() {
            self.order.clock = Some(now);
        }
        now
    }

    /// One reply of broadcast `g` is in: the last one is passed on, or the
    /// fault reply of a peer that failed it.
    fn settle_group(&mut self, g: u32, reply: Option<Reply>) {
        let Some(group) = self.groups.get_mut(g as usize).and_then(|x| x.as_mut()) else {
            if let Some((_, _, m)) = reply {
                self.pool.give(m);
            }
            return;
        };
        group.remaining = group.remaining.saturating_sub(1);
        if let Some(r) = reply {
            if group.faulted && group.held.is_some() {
                // A peer's fault reply stays the final one.
                self.pool.give(r.2);
            } else if let Some((_, _, old)) = group.held.replace(r) {
                self.pool.give(old);
            }
        }
        if group.remaining == 0 {
            let done = self.groups[g as usize].take().expect("a group");
            if !done.entries.is_empty() {
                for (out, m) in self.merge_entries(done.entries) {
                    let (chan, index) = (self.outputs[out].chan, self.outputs[out].index);
                    self.reply_for(done.seq, Some((chan, index, m)), false);
                }
            }
            self.reply_for(done.seq, done.held, true);
        }
    }

    /// The grammar's `%fault` reply to `request`, sent to output `out`,
    /// handled as if the peer had answered it.
    fn fault(
        &mut self,
        out: usize,
        request: Msg,
        group: Option<u32>,
        seq: Option<u64>,
        cause: Cause,
    ) {
        let (chan, index) = (self.outputs[out].chan, self.outputs[out].index);
        self.stats.fault_replies.fetch_add(1, Ordering::Relaxed);
        let client_seq = match group {
            Some(g) => self.groups.get(g as usize).and_then(|x| x.as_ref()?.seq),
            None => seq,
        };
        if let Some(r) = self.order.record(client_seq) {
            r.outcome = Outcome::Fault;
        }
        static FAULTS: crate::log::RateLimit = crate::log::RateLimit::new();
        crate::limited!(
            FAULTS,
            warn,
            cause = ?cause,
            backend = %self.outputs[out]
                .conn
                .as_ref()
                .map_or_else(|| format!("{:?}", index), |(c, _)| crate::conn::peer(c)),
            "a request gets the grammar's fault reply: its backend {}",
            match cause {
                Cause::Unreachable => "cannot be reached",
                Cause::Timeout => "did not answer in time",
                Cause::Lost => "closed or broke the connection",
                Cause::Internal => "was not reached: the program faulted",
            }
        );
        // The reply is a message read from the peer's channel; when that
        // is the unit requests are written in, it starts from the request.
        let unit = self.units.get(chan as usize).copied().flatten();
        let sent_as = self.out_units.get(chan as usize).copied().flatten();
        let mut bytes = Vec::new();
        let made = unit.map(|u| self.fault_bytes(u, sent_as, &request, cause, &mut bytes));
        self.pool.give(request);
        let reply = match (unit, made) {
            (Some(u), Some(Ok(true))) => {
                let mut parser = self.grammar.parser(u);
                match parser.parse(&bytes) {
                    Ok(flick_wire::Progress::Done(_) | flick_wire::Progress::Head(_)) => {
                        let mut m = self.pool.take();
                        m.bytes.extend_from_slice(&bytes);
                        let values = crate::msg::Values::parsed(&parser);
                        self.pool.copy_values(&mut m, values, parser.slots());
                        Some((chan, index, m))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        match group {
            Some(g) => {
                if let Some(Some(group)) = self.groups.get_mut(g as usize) {
                    // Kept as the final reply: a broadcast that reached
                    // not every peer must not end as if it had.
                    if reply.is_some() && !group.faulted {
                        group.faulted = true;
                        if let Some((_, _, old)) = group.held.take() {
                            self.pool.give(old);
                        }
                    }
                }
                self.settle_group(g, reply)
            }
            None => self.reply_for(seq, reply, true),
        }
    }

    /// Whether a request to output `out`, which has no connection, waits
    /// for one to come free: its worker has as many connections to the
    /// backend as it may, all busy. It waits at most the response
    /// timeout; then it goes on, and gets the fault reply (HTTP 503).
    fn waits_for_connection(&mut self, out: usize) -> bool {
        let gone = self.peers[out].dead || self.outputs[out].tx.is_none();
        let (chan, index) = (self.outputs[out].chan, self.outputs[out].index);
        let waiting = self.peers[out].waiting_since.is_some();
        // A connection closed with nothing owed (or given back to the pool
        // after its last reply) is replaced now: by an idle one, a new
        // one, or, at the cap, the first to come free.
        if !gone
            || !(waiting
                || self.peers[out].reconnect_at_once
                || (self.at_cap)(self.id, chan, index))
        {
            self.peers[out].waiting_since = None;
            return false;
        }
        // One may have come back since the last look; if none did and the
        // worker is not at its cap, the backend cannot be reached.
        if self.reconnect_now(out, false) || !(self.at_cap)(self.id, chan, index) {
            self.peers[out].waiting_since = None;
            return false;
        }
        let now = Instant::now();
        let since = *self.peers[out].waiting_since.get_or_insert(now);
        if now.duration_since(since) < self.timeout {
            let at = now + CONNECTION_POLL;
            self.peers[out].retry_at = Some(at);
            (self.wake_at)(self.id, at);
            return true;
        }
        self.peers[out].waiting_since = None;
        self.stats.backend_busy.fetch_add(1, Ordering::Relaxed);
        static BUSY: crate::log::RateLimit = crate::log::RateLimit::new();
        crate::limited!(
            BUSY,
            warn,
            backend = %format!("{chan}[{index:?}]"),
            "a request waited for a backend connection and none came free in time: \
             its worker has as many as it may (--backend-max-connections)"
        );
        false
    }

    /// Gives output `out`'s exclusive connection back to its worker's idle
    /// connections, owing nothing, for another instance to take; this
    /// instance's next request to the backend takes one again (or waits
    /// for one at the cap), as after a connection closed clean.
    pub(crate) fn give_back_connection(&mut self, out: usize) {
        let o = &mut self.outputs[out];
        o.tx = None;
        o.conn = None;
        o.idle_limit = None;
        let peer = &mut self.peers[out];
        peer.reconnect_at_once = true;
        peer.answered = false;
        peer.quiet_since = None;
        peer.waiting_since = None;
    }

    /// Whether the exclusive connection of output `out` has owed nothing
    /// for its idle limit or longer: the backend may be closing it.
    fn idled_too_long(&self, out: usize) -> bool {
        let peer = &self.peers[out];
        peer.outstanding.is_empty()
            && self.outputs[out]
                .idle_limit
                .zip(peer.quiet_since)
                .is_some_and(|(limit, since)| since.elapsed() >= limit)
    }

    /// Leaves output `out`'s connection (it goes back to the idle ones,
    /// too old to be taken again) for a new one; the old one stays if no
    /// new one can be had.
    fn renew_connection(&mut self, out: usize) {
        let (chan, index) = (self.outputs[out].chan, self.outputs[out].index);
        if let Some((input, output)) = (self.fresh_connection)(self.id, chan, index) {
            self.outputs[out] = output;
            self.new_inputs.push(input);
            self.peers[out].quiet_since = None;
            self.peers[out].answered = false;
        }
    }

    /// Reconnects a peer whose connection closed with nothing owed, now;
    /// `true` if it is connected again. `fresh`: over a new connection,
    /// for a request sent again (see `fresh_connection`).
    fn reconnect_now(&mut self, out: usize, fresh: bool) -> bool {
        self.peers[out].reconnect_at_once = false;
        let (chan, index) = (self.outputs[out].chan, self.outputs[out].index);
        self.given_up.push((chan, index));
        let connect = match fresh {
            true => &self.fresh_connection,
            false => &self.reconnect,
        };
        let Some((input, output)) = connect(self.id, chan, index) else {
            return false;
        };
        self.outputs[out] = output;
        self.new_inputs.push(input);
        let peer = &mut self.peers[out];
        peer.dead = false;
        peer.answered = false;
        peer.retry_at = None;
        peer.backoff = FIRST_BACKOFF;
        true
    }

    /// A peer's connection is gone: what it owed gets fault replies, and so
    /// will what is sent to it from now on.
    pub fn peer_gone(&mut self, out: usize, cause: Cause) {
        if self.peers[out].dead {
            return;
        }
        let clean = cause == Cause::Lost && self.peers[out].outstanding.is_empty();
        self.peers[out].reconnect_at_once =
            clean || (cause == Cause::Lost && self.peers[out].answered);
        // A backend closing a connection it keeps no longer, or one a
        // session's last request ends, is not failing.
        let expected = clean || (self.ending && cause == Cause::Lost);
        if !expected {
            let (chan, index) = (self.outputs[out].chan, self.outputs[out].index);
            // A shared connection refused is counted once, by its reader
            // or writer (backend.rs); one of this instance's own, here.
            let refused = !self.outputs[out].shared
                && self.outputs[out]
                    .conn
                    .as_ref()
                    .is_some_and(|(c, _)| c.refused.load(Ordering::Acquire));
            match refused {
                true => self.stats.connect_failed(chan, index),
                false => self.stats.backend_failed(chan, index),
            }
        }
        self.peers[out].dead = true;
        // Nothing more is read from the connection: what it still holds
        // answers requests that get fault replies now.
        self.given_up
            .push((self.outputs[out].chan, self.outputs[out].index));
        let backoff = self.peers[out].backoff;
        self.peers[out].retry_at = Some(Instant::now() + backoff);
        let chan = self.outputs[out].chan;
        let mut again = std::mem::take(&mut self.retry);
        while let Some(p) = self.peers[out].outstanding.pop_front() {
            // In a session that is ending, a peer closing is expected after
            // a request that may get no reply, and after the request that
            // ends the session and its connection to the peer too
            // (Memcached's quit is answered by the close). HTTP's last
            // request keeps its backend connection (`%ends_peer` 0): lost
            // with it, it is answered like any other.
            let expected = self.ending
                && cause == Cause::Lost
                && (p.seq.is_none() || self.ends_peer(chan, &p.request));
            // A request that is safe to send twice (`%idempotent`: HTTP's
            // GET without a body, Memcached's get), lost with its connection (a keep-alive
            // connection the backend closed as the request went out), goes
            // again over a new connection, once.
            let retry = cause == Cause::Lost
                && !p.retried
                && !p.replied
                && !p.begun
                && p.group.is_none()
                && self
                    .out_property(chan, Routing::Idempotent, &p.request)
                    .unwrap_or(0)
                    != 0;
            if expected || (self.ending && p.seq.is_none()) {
                self.forget(p);
            } else if p.replied && p.fenced {
                // A quiet request whose hit came: that was its reply.
                self.forget(p);
            } else if p.replied && p.group.is_none() && self.take_back_reply(out, p.seq) {
                // Part of its reply came, but none of it went on to the
                // client yet: the fault reply takes its place.
                self.fault(out, p.request, p.group, p.seq, cause);
            } else if p.replied {
                // Its reply is cut short: the client's connection closes
                // rather than take a fault reply inside it, once what is
                // queued for it (that reply's part among it) went on.
                self.pool.give(p.request);
                self.cut_client();
            } else if retry {
                again.push(p);
            } else {
                // A request the client waits for is answered, even when it
                // is the last one.
                self.fault(out, p.request, p.group, p.seq, cause);
            }
        }
        if !again.is_empty() && self.reconnect_now(out, true) {
            let resending = std::mem::replace(&mut self.resending, true);
            for p in again.drain(..) {
                // A part of a split request sent again is still that part:
                // its final reply ends the client's reply only if it did.
                let part_last = self.part_last.replace(p.keep_final);
                let _ = self.send_one(out, p.request, p.group, p.seq, p.fenced);
                self.part_last = part_last;
            }
            self.resending = resending;
        }
        // No new connection: the peer cannot be reached now.
        for p in again.drain(..) {
            self.fault(out, p.request, p.group, p.seq, Cause::Unreachable);
        }
        self.retry = again;
    }

    /// A peer that stopped answering: its connection is closed, and what it
    /// owed gets fault replies.
    pub fn give_up(&mut self, out: usize) {
        self.outputs[out].tx = None;
        self.given_up
            .push((self.outputs[out].chan, self.outputs[out].index));
        if let Some((conn, reader)) = self.outputs[out].conn.take() {
            let _ = conn.stream.shutdown(std::net::Shutdown::Both);
            self.waker.wake(reader);
        }
        self.peer_gone(out, Cause::Timeout);
    }

    /// The client's request ends its session: its connection closes once
    /// answered, and is never handed to another version.
    pub(crate) fn end_client_session(&self) {
        let client = self.outputs.iter().find(|o| o.chan == self.client_chan);
        if let Some((conn, _)) = client.and_then(|o| o.conn.as_ref()) {
            conn.end_session();
        }
    }

    /// Whether every request sent to a peer has had its reply.
    pub fn settled(&self) -> bool {
        self.peers.iter().all(|p| p.outstanding.is_empty()) && self.ready.is_empty()
    }
}
