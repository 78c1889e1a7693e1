//! The compute task of a graph: runs the process's rules on the messages
//! its input tasks deliver, through the interpreter, and hands what the
//! rules send to the output tasks.

use crate::msg::{Msg, MsgPool, Part};
use crate::state::{DictGot, DictSet, SharedState};
use flick_exec::code::ProcessCode;
use flick_exec::{Fault, Host, Module, Outcome, Sent, Value, Vm};
use flick_runtime::{Receiver, Sender, TaskStatus, Timeslice, TryRecvError};
use flick_wire::{FieldKind, Routing, Slot};
use std::sync::Arc;

/// Where a wire field of a record lives in a message's slots.
pub type FieldMap = Arc<Vec<Vec<Option<(u16, FieldKind)>>>>;

/// One input of the compute task: a channel (and array index).
pub struct Input {
    pub rx: Receiver<Msg>,
    pub chan: u16,
    pub index: Option<u32>,
    pub open: bool,
    /// The input of a shared connection this instance left (for one of its
    /// own): its closing is no peer going away.
    pub retired: bool,
    /// The output the body of this input's streaming message goes to (the
    /// one its head was sent to).
    pub follow: Option<usize>,
    /// The connection of a peer the instance only writes to (a reducer):
    /// nothing is read from it, and its closing first means the stream
    /// broke. It does not keep the instance alive.
    pub sentinel: bool,
    /// The head read last ends the session but its body is still coming:
    /// the input closes after the body's last piece, not before.
    pub last_body: bool,
}

/// One output: where messages sent to `chan[index]` go.
pub struct Output {
    pub tx: Option<Sender<Msg>>,
    pub chan: u16,
    pub index: Option<u32>,
    /// The connection and its reader task, to close it from here.
    pub conn: Option<(Arc<crate::conn::Conn>, flick_runtime::TaskId)>,
    /// For a stream whose grammar ends it with a message (`%end`): the
    /// CRC32 of what was sent so far, which that message may carry.
    pub crc: Option<flick_wire::StreamCrc>,
    /// A backend connection other instances share.
    pub shared: bool,
    /// An exclusive backend connection left with nothing owed this long is
    /// not written to again: the next request goes over a new one
    /// (`Backend::idle_timeout`).
    pub idle_limit: Option<std::time::Duration>,
}

/// Opens a new connection for `chan[index]` of the instance whose compute
/// task is given: its input and output, with their tasks already started.
pub type Reconnect =
    Arc<dyn Fn(flick_runtime::TaskId, u16, Option<u32>) -> Option<(Input, Output)> + Send + Sync>;
/// Whether every connection the instance's worker may have to
/// `chan[index]` is open and busy (`Backend::at_cap`).
pub type AtCap = Arc<dyn Fn(flick_runtime::TaskId, u16, Option<u32>) -> bool + Send + Sync>;
/// Wakes a compute task at a time.
pub type WakeAt = Arc<dyn Fn(flick_runtime::TaskId, std::time::Instant) + Send + Sync>;

/// How often a connection to a peer the instance only writes to is looked
/// at while connecting, before the instance starts.
const CONNECTING_POLL: std::time::Duration = std::time::Duration::from_millis(5);

pub struct Compute {
    pub module: Arc<Module>,
    pub process: usize,
    pub inputs: Vec<Input>,
    pub host: GraphHost,
    pub vm: Vm,
    /// The next input to look at, so no input starves another.
    pub next_input: usize,
    /// Messages taken in a row from the input at `next_input`.
    pub streak: u32,
    /// The process's state was initialised.
    pub started: bool,
    /// Until when a peer the instance only writes to (a reducer) is tried
    /// again before the instance starts; set at the first try that fails.
    pub reach_by: Option<std::time::Instant>,
    /// The input whose close ends the instance (the client connection).
    pub client: Option<usize>,
    /// Guarded rules should run again: a merge took a message since.
    pub guards_due: bool,
    /// The input whose streaming message's head the running rule handles.
    pub following: Option<usize>,
    /// A body piece waiting for room in the output it follows its head to.
    pub held_piece: Option<(usize, Msg)>,
    /// Kept with the rest of the graph's storage (see [`GraphStorage`]).
    pub starting: Vec<(flick_runtime::TaskId, Box<dyn flick_runtime::Task>)>,
    /// The program's text, for where a fault happened.
    pub source: Option<Arc<flick_span::SourceFile>>,
    /// The running rule started on a client's request (not a peer's reply).
    pub rule_on_request: bool,
    /// The function of the running rule, and the channel of the message
    /// it started on.
    pub rule: flick_exec::FuncId,
    pub rule_chan: u16,
}

use crate::graph_pool::GraphStorage;

impl Compute {
    /// The graph's storage, for the pool, once the instance has ended.
    pub fn take_storage(&mut self) -> GraphStorage {
        let h = &mut self.host;
        GraphStorage {
            inputs: std::mem::take(&mut self.inputs),
            outputs: std::mem::take(&mut h.outputs),
            peers: std::mem::take(&mut h.peers),
            msgs: std::mem::take(&mut h.msgs),
            ready: std::mem::take(&mut h.ready),
            groups: std::mem::take(&mut h.groups),
            order: std::mem::take(&mut h.order),
            merges: std::mem::take(&mut h.merges),
            widths: std::mem::take(&mut h.widths),
            balanced: {
                // The instance has ended: it counts towards no peer now.
                h.balance.ended(&mut h.balanced);
                std::mem::take(&mut h.balanced)
            },
            vm: std::mem::take(&mut self.vm),
            locals: Some(std::mem::replace(&mut h.locals, h.globals.clone())),
            starting: std::mem::take(&mut self.starting),
            made_ahead: false,
        }
    }
}

/// What running the guarded rules came to.
enum Guards {
    /// A guard blocked or yielded: return this status.
    Suspended(TaskStatus),
    /// They ran and made progress: look again.
    Ran,
    /// Nothing to do until an input moves.
    Idle,
}

/// Whether a guarded rule is due to run again.
/// Messages a compute task takes from one input before it tries the next.
const STREAK: u32 = 16;

fn is_guard(label: &str) -> bool {
    label.starts_with("if ")
}

/// What compute code sees of its graph.
pub struct GraphHost {
    pub outputs: Vec<Output>,
    /// Messages the running rule holds; index 0 is the one it started on.
    pub msgs: Vec<Option<Msg>>,
    pub pool: Arc<MsgPool>,
    pub fields: FieldMap,
    /// Channels per process channel (1, or the array's length).
    pub widths: Vec<u32>,
    /// `global` variables, shared by every instance, and `local` ones.
    pub globals: Arc<SharedState>,
    pub locals: Arc<SharedState>,
    /// Which of the two each state variable lives in.
    pub global: Arc<Vec<bool>>,
    /// Running the process's state initialisation.
    pub initialising: bool,
    /// Peers that answer requests (backends): per output, the requests
    /// sent and not answered yet, oldest first, and whether the peer is gone.
    pub peers: Vec<Peer>,
    /// Messages ready for their rule: replies settled by the peers' logic
    /// (including fault replies for requests no peer will answer).
    pub ready: std::collections::VecDeque<(u16, Option<u32>, Msg)>,
    /// Broadcast requests waiting for their replies, by id.
    pub groups: Vec<Option<Group>>,
    /// Replies held back so the client gets them in request order.
    pub order: crate::peers::Order,
    /// The client asked to end the session (`%ends`): once its requests
    /// are answered, the instance closes.
    pub ending: bool,
    pub waker: flick_runtime::Waker,
    /// How long a peer may take to answer.
    pub timeout: std::time::Duration,
    /// How long a peer the instance only writes to (a reducer) is tried,
    /// with backoff, before the instance fails.
    pub connect_timeout: std::time::Duration,
    /// When the compute task is next woken to check on its peers.
    pub timer: Option<std::time::Instant>,
    pub reconnect: Reconnect,
    /// Opens a connection of this instance's own to `chan[index]`, even
    /// where connections are shared.
    pub own_connection: Reconnect,
    /// As `reconnect`, but never takes an idle connection: a request sent
    /// again after the backend closed its connection goes over a new one,
    /// where another idle one may be closing too.
    pub fresh_connection: Reconnect,
    /// Whether a connection could not be had because the worker has as
    /// many as it may (`--backend-max-connections`).
    pub at_cap: AtCap,
    /// Inputs of connections opened while a rule ran, for the compute task
    /// to take in.
    pub new_inputs: Vec<Input>,
    /// `hash(channel)` of each connection asked so far, by channel: its
    /// addresses cost two system calls, and a balancer asks per request.
    /// The `Weak` tells the connection the hash is for (a recycled
    /// instance gets another), and keeps its address from being reused.
    pub connection_hashes: Vec<(u16, Option<u32>, std::sync::Weak<crate::conn::Conn>, u64)>,
    pub wake_at: WakeAt,
    /// The service is shutting down: finish and close.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// This instance has seen the shutdown and told its client readers.
    pub drain_noticed: bool,
    /// The channel the instance's clients connect to.
    pub client_chan: u16,
    /// The client's address, for `%forward` (`X-Forwarded-For`).
    pub client_address: crate::forward::ClientAddress,
    /// The compute task's id, for reconnections and timers.
    pub id: flick_runtime::TaskId,
    /// The output the running rule last sent to: where the body of a
    /// streaming message follows its head.
    pub last_route: Option<usize>,
    /// A stream to a peer that answers nothing broke (or never connected):
    /// the instance ends at once.
    pub broken: bool,
    /// A reply to the client was cut short by its backend: the instance
    /// ends (`broken`) once what is queued for the client has gone on,
    /// the cut reply's part among it, and reads no more requests.
    pub cutting: bool,
    pub grammar: Arc<flick_wire::Grammar>,
    /// The code it runs: string constants kept in dictionaries are read
    /// from it.
    pub module: Arc<Module>,
    /// The grammar unit of each process channel.
    pub units: Arc<Vec<Option<flick_wire::UnitId>>>,
    /// The grammar unit of what is written to each process channel.
    pub out_units: Arc<Vec<Option<flick_wire::UnitId>>>,
    /// Parts of a split request (`%split`) waiting for their rule, each
    /// with whether it is the last.
    pub parts: std::collections::VecDeque<(u16, Option<u32>, Msg, bool)>,
    /// The running rule handles a part of a split request: `Some(last)`.
    pub part_last: Option<bool>,
    /// Values of the part being made, and a parser to read each back.
    pub part_slots: Vec<Slot>,
    pub part_parser: Option<flick_wire::Parser>,
    /// Inputs no rule reads: `foldt` takes their messages in key order.
    pub merges: Vec<crate::merge::MergeInput>,
    /// Messages merges have taken, to tell whether a guard made progress.
    pub taken: u64,
    /// What native folds over the merges keep between calls.
    pub fold: crate::merge::FoldState,
    /// Records the program builds: per record, its grammar unit's builder
    /// and a parser to find the values in the built bytes (made on first use).
    /// Boxed: each is taken out and put back per record built, and a
    /// builder with its parser is too large to move by value each time.
    pub builders: Vec<Option<Box<crate::build::RecordBuilder>>>,
    /// Record names with their named fields, as compute code numbers them.
    pub records: Arc<Vec<(String, Vec<String>)>>,
    /// Live instances per peer for `least_connections`, shared by the
    /// service's instances, and the peers this instance counts towards.
    pub balance: Arc<crate::balance::Balance>,
    pub balanced: Vec<u64>,
    /// Messages the running rule has sent.
    pub sends: u32,
    /// A request is being sent again over a new connection.
    pub resending: bool,
    /// Peers whose connection was given up (timed out, or replaced after a
    /// failure): replies still queued from it answer requests that already
    /// got fault replies, and are never read.
    pub given_up: Vec<(u16, Option<u32>)>,
    /// Requests lost with their connection, to send again (kept, so that
    /// nothing is allocated each time).
    pub retry: Vec<crate::peers::Pending>,
    /// A stream merged into the instance failed its checks: the instance
    /// ends with its connections aborted.
    pub job_failed: bool,
    pub stats: Arc<crate::stats::Stats>,
}

pub use crate::peers::{Group, Peer};

impl GraphHost {
    fn state(&self, i: u16) -> &SharedState {
        if self.global.get(i as usize).copied().unwrap_or(true) {
            &self.globals
        } else {
            &self.locals
        }
    }

    fn msg(&self, v: &Value) -> Result<&Msg, Fault> {
        match v {
            Value::Msg(h) => self
                .msgs
                .get(*h as usize)
                .and_then(|m| m.as_ref())
                .ok_or(Fault::Kind("a live record")),
            _ => Err(Fault::Kind("a record")),
        }
    }

    /// What a dictionary read gives compute code: a string's bytes stay in
    /// a message of the pool, held until the rule ends.
    fn dict_got(&mut self, got: Option<DictGot>) -> Value {
        match got {
            None => Value::None,
            Some(DictGot::Msg(m)) => self.hold(m),
            Some(DictGot::Int(n)) => Value::Int(n),
            Some(DictGot::Bool(b)) => Value::Bool(b),
            Some(DictGot::Bytes(m)) => {
                let len = m.bytes.len() as u32;
                match self.hold(m) {
                    Value::Msg(msg) => Value::MsgBytes { msg, start: 0, len },
                    _ => unreachable!("hold gives a message"),
                }
            }
        }
    }

    /// A value compute code sets a dictionary entry to: a record (copied
    /// from the pool), an integer, a boolean, or a string's bytes where
    /// they lie (a message's, a constant's, the host's).
    fn dict_value<'a>(&'a self, v: &'a Value) -> Result<DictSet<'a>, Fault> {
        Ok(match v {
            Value::Int(n) => DictSet::Int(*n),
            Value::Bool(b) => DictSet::Bool(*b),
            Value::Msg(_) => DictSet::Msg(self.pool.copy(self.msg(v)?)),
            Value::ConstBytes { func, op } => {
                let code = self
                    .module
                    .functions
                    .get(*func as usize)
                    .and_then(|f| f.code.get(*op as usize));
                match code {
                    Some(flick_exec::code::Op::Const {
                        value: flick_exec::code::Const::Str(s),
                        ..
                    }) => DictSet::Bytes(s),
                    _ => return Err(Fault::Kind("a string")),
                }
            }
            Value::MsgBytes { .. } | Value::Bytes(_) => {
                DictSet::Bytes(self.bytes(v).ok_or(Fault::Kind("a string"))?)
            }
            // `to_string`'s and `lower`'s bytes live in the interpreter's
            // scratch, which the host cannot reach.
            Value::Scratch { .. } | Value::Halves { .. } => {
                return Err(Fault::Host(
                    "a string made in this rule (to_string, lower, split_once) cannot be kept in a dictionary; keep a field's or a constant's"
                        .into(),
                ))
            }
            _ => {
                return Err(Fault::Host(
                    "a dictionary of this service holds records, integers, booleans and strings only"
                        .into(),
                ))
            }
        })
    }

    /// Whether what is sent to output `out` needs only its bytes: its
    /// peer answers nothing (a client), so nothing is remembered or
    /// matched, and its writer reads no values; nor does routing (no
    /// `%quiet`), nor a `%forward` edit. A reply passed on to its client
    /// is then copied without its values, which copying and clearing
    /// again cost more than its bytes (a Memcached reply: 3% of the
    /// proxy's samples).
    fn bytes_suffice(&self, out: usize) -> bool {
        if self.peers.get(out).is_none_or(|p| p.answers) {
            return false;
        }
        let chan = self.outputs[out].chan;
        self.out_units
            .get(chan as usize)
            .copied()
            .flatten()
            .is_some_and(|unit| {
                !self.grammar.has_forward(unit) && !self.grammar.declares(unit, Routing::Quiet)
            })
    }

    /// The output a channel value names, with its channel and element.
    fn output_of(&self, chan: &Value) -> Result<(usize, u16, Option<u32>), Fault> {
        let Value::Chan { chan, elem } = chan else {
            return Err(Fault::Kind("a channel"));
        };
        let out = self
            .outputs
            .iter()
            .position(|o| o.chan == *chan && o.index == *elem)
            .ok_or_else(|| Fault::Host("a channel with no connection".into()))?;
        Ok((out, *chan, *elem))
    }

    /// Counts a send that went.
    fn count_send(&mut self, sent: Sent, chan: u16, elem: Option<u32>) -> Sent {
        if sent == Sent::Done {
            self.sends += 1;
            if let Some(index) = elem {
                // From its first message there, the instance counts
                // towards this peer for `least_connections`.
                self.balance.sent(&mut self.balanced, chan, index);
            }
        }
        sent
    }

    pub(crate) fn hold(&mut self, m: Msg) -> Value {
        self.msgs.push(Some(m));
        Value::Msg(self.msgs.len() as u32 - 1)
    }

    /// Gives the rule's messages back to the pool.
    pub fn release(&mut self) {
        for m in self.msgs.drain(..).flatten() {
            self.pool.give(m);
        }
    }
}

impl GraphHost {
    /// Closes every output, first sending the message that ends a stream
    /// whose grammar has one (`%end`); `false` while such an output is
    /// full (the task is woken when it has room, and calls again).
    pub(crate) fn close_outputs(&mut self) -> bool {
        // A failed job's streams must not look whole.
        let end_them = !self.job_failed;
        for o in self.outputs.iter_mut().filter(|_| end_them) {
            let (Some(tx), Some(crc)) = (&o.tx, &o.crc) else {
                continue;
            };
            let Some(unit) = self.out_units.get(o.chan as usize).copied().flatten() else {
                continue;
            };
            let mut m = self.pool.take();
            if !matches!(
                self.grammar.end_of_stream(unit, crc, &mut m.bytes),
                Ok(true)
            ) {
                self.pool.give(m);
                o.crc = None;
                continue;
            }
            match tx.try_send(m) {
                Ok(()) => o.crc = None,
                Err(flick_runtime::TrySendError::Full(m)) => {
                    self.pool.give(m);
                    return false;
                }
                Err(flick_runtime::TrySendError::Closed(m)) => {
                    self.pool.give(m);
                    o.crc = None;
                }
            }
        }
        for o in &mut self.outputs {
            o.tx = None;
        }
        true
    }
}

impl GraphHost {
    /// A request that splits (`%split`) is queued as its parts, and `None`
    /// returned; any other comes back to be handled as it is.
    fn split(&mut self, chan: u16, index: Option<u32>, m: Msg) -> Option<Msg> {
        let unit = self.units.get(chan as usize).copied().flatten()?;
        let n = self.grammar.split_parts(unit, &m.slots);
        if n <= 1 {
            return Some(m);
        }
        let parser = self
            .part_parser
            .get_or_insert_with(|| self.grammar.parser(unit));
        for i in 0..n {
            let mut part = self.pool.take();
            let made = self.grammar.split_part(
                unit,
                &m.slots,
                &m.bytes,
                i,
                &mut self.part_slots,
                &mut part.bytes,
            );
            parser.reset();
            match (made, parser.parse(&part.bytes)) {
                (Ok(()), Ok(flick_wire::Progress::Done(_))) => {
                    let values = crate::msg::Values::parsed(parser);
                    self.pool.copy_values(&mut part, values, parser.slots());
                    self.parts.push_back((chan, index, part, i + 1 == n));
                }
                // A part that does not read back: the request goes whole.
                _ => {
                    self.pool.give(part);
                    for (_, _, p, _) in self.parts.drain(..) {
                        self.pool.give(p);
                    }
                    return Some(m);
                }
            }
        }
        self.pool.give(m);
        None
    }
}

impl Host for GraphHost {
    fn bytes<'a>(&'a self, v: &'a Value) -> Option<&'a [u8]> {
        match v {
            Value::MsgBytes { msg, start, len } => {
                let m = self.msgs.get(*msg as usize)?.as_ref()?;
                m.bytes.get(*start as usize..(*start + *len) as usize)
            }
            Value::Bytes(b) => Some(b),
            Value::ConstBytes { .. } => flick_exec::const_bytes(&self.module, v),
            _ => None,
        }
    }

    fn reads_constants(&self) -> bool {
        true
    }

    fn field(&mut self, msg: &Value, record: u16, field: u16) -> Result<Value, Fault> {
        let Value::Msg(h) = msg else {
            return Err(Fault::Kind("a record"));
        };
        let m = self.msg(msg)?;
        let Some((slot, _)) = self
            .fields
            .get(record as usize)
            .and_then(|r| r.get(field as usize))
            .and_then(|f| f.clone())
        else {
            return Err(Fault::Host(
                "a field that the wire grammar does not have".into(),
            ));
        };
        Ok(match m.slots.get(slot as usize) {
            Some(Slot::Int(v)) => Value::Int(*v as i64),
            Some(Slot::SInt(v)) => Value::Int(*v),
            Some(Slot::Bytes { start, len }) => Value::MsgBytes {
                msg: *h,
                start: *start,
                len: *len,
            },
            _ => Value::None,
        })
    }

    fn send(&mut self, chan: &Value, value: &Value) -> Result<Sent, Fault> {
        let (out, c, elem) = self.output_of(chan)?;
        let bytes_only = self.bytes_suffice(out);
        let request = self.msg(value)?;
        let request = match bytes_only {
            true => self.pool.copy_bytes(request),
            false => self.pool.copy(request),
        };
        self.last_route = Some(out);
        let sent = self.route(out, request);
        Ok(self.count_send(sent, c, elem))
    }

    fn send_owned(&mut self, chan: &Value, value: &Value) -> Result<Sent, Fault> {
        let Value::Msg(h) = value else {
            return self.send(chan, value);
        };
        let (out, c, elem) = self.output_of(chan)?;
        let Some(mut request) = self.msgs.get_mut(*h as usize).and_then(Option::take) else {
            return Err(Fault::Kind("a live record"));
        };
        // As a copy would be: what goes on is a message, not a rejection.
        request.rejected = None;
        // The message itself goes on: compute code never reads it again.
        self.last_route = Some(out);
        let sent = match self.route_or_hand_back(out, request) {
            Ok(sent) => sent,
            Err(request) => {
                self.msgs[*h as usize] = Some(request);
                Sent::Full
            }
        };
        Ok(self.count_send(sent, c, elem))
    }

    fn channels(&self, chan: u16) -> i64 {
        self.widths.get(chan as usize).copied().unwrap_or(0) as i64
    }

    fn all_ready(&mut self, chan: u16) -> bool {
        self.merge_ready(chan)
    }

    fn load_state(&mut self, state: u16) -> Value {
        self.state(state).load(state)
    }

    fn store_state(&mut self, state: u16, v: Value) -> Result<(), Fault> {
        let global = self.global.get(state as usize).copied().unwrap_or(true);
        if self.initialising && global {
            self.globals.init_once(state, v);
        } else {
            self.state(state).store(state, v);
        }
        Ok(())
    }

    fn dict_get(&mut self, state: u16, key: &Value) -> Result<Value, Fault> {
        let key = self.bytes(key).ok_or(Fault::Kind("bytes"))?;
        let got = self.state(state).dict_get(state, key, &self.pool);
        Ok(self.dict_got(got))
    }

    fn dict_set(&mut self, state: u16, key: &Value, value: &Value) -> Result<(), Fault> {
        let key = self.bytes(key).ok_or(Fault::Kind("bytes"))?;
        let value = self.dict_value(value)?;
        self.state(state).dict_set(state, key, value, &self.pool);
        Ok(())
    }

    fn dict_get_bytes(&mut self, state: u16, key: &[u8]) -> Result<Value, Fault> {
        let got = self.state(state).dict_get(state, key, &self.pool);
        Ok(self.dict_got(got))
    }

    fn dict_set_bytes(&mut self, state: u16, key: &[u8], value: &Value) -> Result<(), Fault> {
        let value = self.dict_value(value)?;
        self.state(state).dict_set(state, key, value, &self.pool);
        Ok(())
    }

    fn record(&mut self, record: u16, fields: &[Value]) -> Result<Value, Fault> {
        let m = self.build(record, fields)?;
        Ok(self.hold(m))
    }

    fn merge_take(
        &mut self,
        chan: u16,
        record: u16,
        field: u16,
        key: Option<&Value>,
    ) -> Result<Option<Value>, Fault> {
        self.merge_take_msg(chan, record, field, key)
    }

    fn merge_fold(
        &mut self,
        call: flick_exec::FoldCall<'_>,
    ) -> Result<flick_exec::FoldStep, Fault> {
        self.merge_fold_native(call)
    }

    fn connection_hash(&mut self, chan: u16, elem: Option<u32>) -> Result<u64, Fault> {
        let conn = self
            .outputs
            .iter()
            .find(|o| o.chan == chan && o.index == elem)
            .and_then(|o| o.conn.as_ref())
            .ok_or_else(|| Fault::Host("a channel with no connection".into()))?;
        let known = self
            .connection_hashes
            .iter()
            .position(|(c, e, _, _)| *c == chan && *e == elem);
        if let Some((_, _, of, hash)) = known.map(|at| &self.connection_hashes[at]) {
            if std::ptr::eq(of.as_ptr(), Arc::as_ptr(&conn.0)) {
                return Ok(*hash);
            }
        }
        let (Ok(peer), Ok(local)) = (conn.0.stream.peer_addr(), conn.0.stream.local_addr()) else {
            return Err(Fault::Host("a connection without addresses".into()));
        };
        // Both ends' addresses and ports, in a fixed layout.
        let mut key = [0u8; 36];
        for (at, a) in [(0, peer), (18, local)] {
            let ip = match a.ip() {
                std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                std::net::IpAddr::V6(v6) => v6.octets(),
            };
            key[at..at + 16].copy_from_slice(&ip);
            key[at + 16..at + 18].copy_from_slice(&a.port().to_be_bytes());
        }
        let hash = flick_exec::fnv1a(&key);
        let entry = (chan, elem, Arc::downgrade(&conn.0), hash);
        match known {
            Some(at) => self.connection_hashes[at] = entry,
            None => self.connection_hashes.push(entry),
        }
        Ok(hash)
    }

    fn message_len(&self, msg: &Value) -> Result<Value, Fault> {
        Ok(Value::Int(self.msg(msg)?.bytes.len() as i64))
    }

    fn header(&self, msg: &Value, record: u16, name: &[u8]) -> Result<Value, Fault> {
        let Value::Msg(h) = msg else {
            return Err(Fault::Kind("a record"));
        };
        let m = self.msg(msg)?;
        // The unit's `headers` list of `name` and `value` fields, as the
        // checker requires of `header`'s record (`flick::views`).
        let g = &self.grammar;
        let unit = self
            .records
            .get(record as usize)
            .and_then(|(r, _)| g.unit_id(r));
        let list = unit.and_then(|u| g.unit(u).fields.iter().find(|f| f.name == "headers"));
        let Some(flick_wire::FieldInfo {
            slot,
            kind:
                FieldKind::List {
                    elem_unit: Some(elem),
                    elem_slots,
                },
            ..
        }) = list
        else {
            return Err(Fault::Host("a record without header fields".into()));
        };
        let (Some(name_at), Some(value_at)) = (
            g.field_slot(*elem, "name").map(usize::from),
            g.field_slot(*elem, "value").map(usize::from),
        ) else {
            return Err(Fault::Host("header fields without a name and value".into()));
        };
        let count = match m.slots.get(*slot as usize) {
            Some(Slot::Count(n)) => *n as usize,
            _ => 0,
        };
        let bytes_at = |at: usize| match m.slots.get(at) {
            Some(Slot::Bytes { start, len }) => Some((*start, *len)),
            _ => None,
        };
        for i in 0..count {
            let base = *slot as usize + 1 + i * *elem_slots as usize;
            let Some((start, len)) = bytes_at(base + name_at) else {
                continue;
            };
            let found = m.bytes.get(start as usize..(start + len) as usize);
            if !found.is_some_and(|n| n.eq_ignore_ascii_case(name)) {
                continue;
            }
            let Some((start, len)) = bytes_at(base + value_at) else {
                return Ok(Value::None);
            };
            let value = m
                .bytes
                .get(start as usize..(start + len) as usize)
                .unwrap_or(&[]);
            // A field value ends before its trailing blanks (RFC 9110 5.5).
            let kept = value.len()
                - value
                    .iter()
                    .rev()
                    .take_while(|c| matches!(c, b' ' | b'\t'))
                    .count();
            return Ok(Value::MsgBytes {
                msg: *h,
                start,
                len: kept as u32,
            });
        }
        Ok(Value::None)
    }

    fn least_connections(&mut self, chan: u16) -> Result<u64, Fault> {
        self.balance.least(chan).ok_or_else(|| {
            Fault::Host("`least_connections` counts only channel arrays bound to peers".into())
        })
    }

    fn release(&mut self, v: &Value) {
        if let Value::Msg(h) = v {
            if let Some(m) = self.msgs.get_mut(*h as usize).and_then(Option::take) {
                self.pool.give(m);
            }
        }
    }
}

impl Compute {
    fn code(&self) -> &ProcessCode {
        &self.module.processes[self.process]
    }

    /// Runs the rule started on the current message to its end; `None`
    /// when it blocked or yielded.
    fn step(&mut self, slice: &mut Timeslice) -> Option<TaskStatus> {
        // Fields borrowed apart, not the module's `Arc` cloned: a count
        // every worker's instances share, written twice a rule.
        match self.vm.run(&self.module, &mut self.host, slice) {
            Ok(Outcome::Done(_)) => {
                if self.rule_on_request {
                    self.host.request_ended();
                }
                self.host.release();
                None
            }
            Ok(Outcome::Blocked) => Some(TaskStatus::Idle),
            Ok(Outcome::Yielded) => Some(TaskStatus::Yield),
            Err(fault) => {
                self.fault(fault);
                None
            }
        }
    }

    /// Stops reading the replies of peer `chan[index]`'s connection: it was
    /// given up, and what it still sends answers requests already answered.
    /// Closes the inputs of the peers given up on since the last call.
    /// Done before any input is read: a reply still queued from a
    /// connection whose requests already had fault replies would answer
    /// whatever the client asked next.
    fn close_given_up(&mut self) {
        while let Some((chan, index)) = self.host.given_up.pop() {
            self.close_inputs_of(chan, index);
        }
    }

    fn close_inputs_of(&mut self, chan: u16, index: Option<u32>) {
        for (i, input) in self.inputs.iter_mut().enumerate() {
            if Some(i) != self.client && input.chan == chan && input.index == index {
                input.open = false;
            }
        }
    }

    /// The last request's body is still coming (its response may be in
    /// already: a backend that answers from the head): the instance stays
    /// until it is through, so that the backend connection it goes over is
    /// not left mid-request.
    fn last_body_coming(&self) -> bool {
        self.inputs.iter().any(|i| i.open && i.last_body)
    }

    /// The status a client's request is refused with, before any rule or
    /// peer sees it (`%refuse`: a Memcached binary request that memcached
    /// would answer by closing a connection other clients share).
    fn refused(&self, input: usize, chan: u16, m: &Msg) -> Option<u16> {
        if self.client != Some(input) || !matches!(m.part, Part::Whole | Part::Head) {
            return None;
        }
        let status = self
            .host
            .property(chan, Routing::Refuse, m)
            .filter(|s| *s != 0)?;
        self.host
            .stats
            .malformed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        static REFUSED: crate::log::RateLimit = crate::log::RateLimit::new();
        crate::limited!(
            REFUSED,
            info,
            status,
            "a request the grammar refuses gets its reject reply and goes to no backend"
        );
        Some(u16::try_from(status).unwrap_or(u16::MAX))
    }

    /// A rule stopped by a fault: it is counted and logged with where in
    /// the program it happened, and a client owed a reply gets the
    /// grammar's `%fault` reply in its place. The connection stays up.
    fn fault(&mut self, fault: flick_exec::Fault) {
        self.host
            .stats
            .compute_faults
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        static FAULTS: crate::log::RateLimit = crate::log::RateLimit::new();
        crate::limited!(
            FAULTS,
            warn,
            rule = %self.rule_label(),
            at = %self.fault_position(),
            "compute fault: {fault}; the request gets an error reply"
        );
        // The message the rule started on, unless a send took it on.
        let started_on = match self.host.sends {
            0 => self.host.msgs.first_mut().and_then(Option::take),
            _ => None,
        };
        self.host.release();
        // The rule does not resume: its next step would fault again.
        self.vm.stop();
        if let Some(m) = started_on {
            match self.rule_on_request {
                true => self.host.answer_request(m, crate::peers::Answer::Fault),
                false => self.host.fault_to_client(m, self.rule_chan),
            }
        }
    }

    /// The rule the interpreter is running, as the program writes it, and
    /// the function that faulted if it is another.
    fn rule_label(&self) -> String {
        let code = self.code();
        let rule = code
            .items
            .iter()
            .find(|it| it.func == self.rule)
            .map_or_else(|| code.name.clone(), |it| it.label.clone());
        match self.vm.fault_site() {
            Some((f, _)) if f != self.rule => {
                format!("{rule}, in {}", self.module.functions[f as usize].name)
            }
            _ => rule,
        }
    }

    /// `file:line:col` of the operation that faulted, or what is known.
    fn fault_position(&self) -> String {
        let offset = self
            .vm
            .fault_site()
            .and_then(|(f, pc)| self.module.source_offset(f, pc));
        match (offset, &self.source) {
            (Some(o), Some(file)) => {
                let at = file.line_col(o);
                format!("{}:{}:{}", file.name, at.line, at.col)
            }
            (Some(o), None) => format!("byte {o}"),
            _ => "unknown".to_string(),
        }
    }

    /// The function of the rule that reads `chan`.
    fn rule_for(&self, chan: u16) -> Option<flick_exec::FuncId> {
        self.code().rule_for(chan)
    }

    /// A peer's reply `m` on `chan` whose rule only passes it on unchanged
    /// (`| backends => client`, [`flick_exec::Function::passes_on`]) goes
    /// on as that rule's send would take it, without the interpreter.
    /// Handed back where it cannot (no such rule, a full channel): the
    /// rule then runs, and waits for room as any rule does.
    fn pass_on(&mut self, chan: u16, m: Msg) -> Result<(), Msg> {
        if chan == self.host.client_chan {
            return Err(m);
        }
        let Some(func) = self.rule_for(chan) else {
            return Err(m);
        };
        let Some(to) = self.module.functions[func as usize].passes_on() else {
            return Err(m);
        };
        let Ok((out, c, elem)) = self.host.output_of(&Value::Chan {
            chan: to,
            elem: None,
        }) else {
            return Err(m);
        };
        self.rule_on_request = false;
        self.rule_chan = chan;
        self.rule = func;
        self.host.sends = 0;
        let mut m = m;
        m.rejected = None;
        self.host.last_route = Some(out);
        let sent = self.host.route_or_hand_back(out, m)?;
        self.host.count_send(sent, c, elem);
        Ok(())
    }

    /// Starts the rule that reads `chan` on message `m`.
    fn start_rule(&mut self, chan: u16, _index: Option<u32>, m: Msg) {
        let Some(func) = self.rule_for(chan) else {
            self.host.pool.give(m);
            return;
        };
        self.rule_on_request = chan == self.host.client_chan;
        if self.rule_on_request {
            self.host.request_started(m.bytes.len());
        }
        self.rule_chan = chan;
        self.rule = func;
        self.host.sends = 0;
        let v = self.host.hold(m);
        self.vm.start(&self.module, func, &[v]);
    }

    /// Peers that took too long are given up on (their requests get fault
    /// replies), dead peers are reconnected with backoff, and the task is
    /// woken when the next of these falls due.
    ///
    /// Between runs only this task moves its deadlines, and each run ends
    /// by arming the timer at the earliest of them (`arm_timer`): while
    /// that timer is still ahead of `now` nothing can be due, and the
    /// per-peer bookkeeping is skipped (it was 2-3% of a Memcached
    /// proxy's CPU when done twice a run).
    fn maintain(&mut self, now: std::time::Instant) {
        self.notice_drain();
        if self.host.timer.is_some_and(|t| t <= now) {
            self.host.timer = None;
        }
        if !self.host.ending && self.host.timer.is_some() {
            return;
        }
        self.handle_due(now);
        self.arm_timer();
    }

    /// Shutting down: the client's readers are woken to read what has
    /// arrived and then close.
    fn notice_drain(&mut self) {
        if !self.host.drain_noticed
            && self
                .host
                .draining
                .load(std::sync::atomic::Ordering::Acquire)
        {
            // Shutting down: the client's readers read what has arrived
            // and then close, so the instance answers all of it and ends.
            self.host.drain_noticed = true;
            for o in &self.host.outputs {
                if let (Some((_, reader)), true) = (&o.conn, o.chan == self.host.client_chan) {
                    self.host.waker.wake(*reader);
                }
            }
        }
    }

    /// Gives up on late peers and reconnects dead ones whose retry is due.
    fn handle_due(&mut self, now: std::time::Instant) {
        for out in 0..self.host.peers.len() {
            if !self.host.peers[out].answers {
                continue;
            }
            // Quiet requests may rightly get no reply: they do not time out.
            let late = |host: &GraphHost| {
                host.peers[out]
                    .outstanding
                    .iter()
                    .find(|p| p.seq.is_some())
                    .is_some_and(|p| p.heard + host.timeout <= now)
            };
            // Replies that came in time but wait in the inputs are taken
            // first: a reply whose last piece waits there must not be
            // cut short, closing its client's connection under the
            // requests it sent after (which get the fault reply instead).
            if late(&self.host) && !self.host.peers[out].dead {
                self.absorb_replies();
                if late(&self.host) && !self.host.peers[out].dead {
                    self.host.give_up(out);
                }
            }
            // Before any reconnect: its new input must stay open.
            self.close_given_up();
            let due = self.host.peers[out].retry_at.is_some_and(|t| t <= now);
            // A session that is over reconnects nothing.
            let live = !self.host.ending && self.client.is_some_and(|c| self.inputs[c].open);
            if due && self.host.peers[out].dead && live {
                let (chan, index) = (self.host.outputs[out].chan, self.host.outputs[out].index);
                match (self.host.reconnect)(self.host.id, chan, index) {
                    Some((input, output)) => {
                        self.close_inputs_of(chan, index);
                        self.inputs.push(input);
                        self.host.outputs[out] = output;
                        let peer = &mut self.host.peers[out];
                        peer.dead = false;
                        peer.answered = false;
                        peer.retry_at = None;
                        peer.backoff = crate::peers::FIRST_BACKOFF;
                    }
                    None => {
                        let peer = &mut self.host.peers[out];
                        peer.backoff = (peer.backoff * 2).min(crate::peers::MAX_BACKOFF);
                        peer.retry_at = Some(now + peer.backoff);
                    }
                }
            }
        }
    }

    /// Sets the task's timer to the earliest deadline, if that is earlier
    /// than the one it holds.
    fn arm_timer(&mut self) {
        let next = self
            .host
            .peers
            .iter()
            .filter(|p| p.answers)
            .flat_map(|p| {
                // A session that is ending still waits for its last
                // replies no longer than the timeout; it reconnects nothing.
                let late = p
                    .outstanding
                    .iter()
                    .find(|q| q.seq.is_some())
                    .map(|q| q.heard + self.host.timeout);
                let retry = p.retry_at.filter(|_| p.dead && !self.host.ending);
                late.into_iter().chain(retry)
            })
            .min();
        if let Some(at) = next {
            if self.host.timer.is_none_or(|t| at < t) {
                self.host.timer = Some(at);
                (self.host.wake_at)(self.host.id, at);
            }
        }
    }

    /// Passes a body piece on to output `out`; `false` (the piece held) while
    /// the output is full: the task is woken when it has room.
    fn forward(&mut self, out: usize, m: Msg) -> bool {
        let Some(tx) = self.host.outputs.get(out).and_then(|o| o.tx.as_ref()) else {
            self.host.pool.give(m);
            return true;
        };
        match tx.try_send(m) {
            Ok(()) => true,
            Err(flick_runtime::TrySendError::Full(m)) => {
                self.held_piece = Some((out, m));
                false
            }
            Err(flick_runtime::TrySendError::Closed(m)) => {
                self.host.pool.give(m);
                true
            }
        }
    }

    /// Matches the replies peers have sent to their requests, without
    /// running any rule (the interpreter is busy); `true` if there were any.
    fn absorb_replies(&mut self) -> bool {
        let mut any = false;
        self.close_given_up();
        for i in 0..self.inputs.len() {
            if self.client == Some(i) || !self.inputs[i].open {
                continue;
            }
            while let Ok(m) = self.inputs[i].rx.try_recv() {
                let (chan, index) = (self.inputs[i].chan, self.inputs[i].index);
                self.host.on_reply(chan, index, m);
                any = true;
            }
        }
        any
    }

    /// Runs each guarded rule once if the inputs its merges read have
    /// moved (a message arrived, or a stream ended) since they last ran.
    fn run_guards(&mut self, slice: &mut Timeslice) -> Guards {
        if !self.host.fill_merges() && !self.guards_due {
            return Guards::Idle;
        }
        self.guards_due = false;
        let module = self.module.clone();
        let guards = module.processes[self.process]
            .items
            .iter()
            .filter(|it| it.source.is_none() && is_guard(&it.label));
        let before = self.host.taken;
        let mut ran = false;
        for g in guards {
            ran = true;
            self.vm.start(&module, g.func, &[]);
            if let Some(s) = self.step(slice) {
                // It finishes when resumed; then the guards run again.
                self.guards_due = true;
                return Guards::Suspended(s);
            }
        }
        if self.host.taken != before {
            // A merge took something: the guards may hold again.
            self.guards_due = true;
        }
        if ran && self.guards_due {
            Guards::Ran
        } else {
            Guards::Idle
        }
    }

    pub fn run(&mut self, slice: &mut Timeslice) -> TaskStatus {
        // One clock reading a run, the scheduler's where it made one: what
        // falls due during the run is handled when its timer wakes the task.
        let now = slice.began().unwrap_or_else(std::time::Instant::now);
        self.host.run_began(now);
        self.maintain(now);
        let status = self.run_inner(slice);
        self.host.run_ended();
        if status != TaskStatus::Done {
            self.notice_drain();
            self.arm_timer();
        }
        status
    }

    /// Whether a peer the instance only writes to has closed its
    /// connection (what it sends, nothing should, is dropped).
    fn sentinel_closed(&mut self) -> bool {
        for input in self.inputs.iter_mut().filter(|i| i.sentinel && i.open) {
            loop {
                match input.rx.try_recv() {
                    Ok(m) => self.host.pool.give(m),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Closed) => return true,
                }
            }
        }
        false
    }

    /// Before the instance starts: tries again, with backoff, each peer it
    /// only writes to (a reducer) that could not be reached. `None` once
    /// every one is connected; meanwhile the instance reads nothing, so its
    /// clients (the mappers) wait on their connections. Past the connect
    /// timeout the job fails, visibly: a log line, `jobs_failed`, and its
    /// connections aborted, so that no mapper takes the job for done.
    fn reach_writes_only(&mut self) -> Option<TaskStatus> {
        let now = std::time::Instant::now();
        let client = self.host.client_chan;
        let mut next: Option<std::time::Instant> = None;
        for out in 0..self.host.outputs.len() {
            let o = &self.host.outputs[out];
            let p = &self.host.peers[out];
            if o.chan == client || p.answers {
                continue;
            }
            if o.tx.is_some() {
                // Connecting does not block: reached once the connection
                // has a peer; refused, it is given up and tried again.
                let Some((conn, _)) = &o.conn else { continue };
                if conn.stream.peer_addr().is_ok() {
                    continue;
                }
                let failed = conn.refused.load(std::sync::atomic::Ordering::Acquire)
                    || conn.stream.take_error().ok().flatten().is_some();
                if !failed {
                    let at = now + CONNECTING_POLL;
                    next = Some(next.map_or(at, |n| n.min(at)));
                    continue;
                }
                let (chan, index) = (o.chan, o.index);
                self.host.outputs[out].tx = None;
                self.host.outputs[out].conn = None;
                self.close_inputs_of(chan, index);
                let peer = &mut self.host.peers[out];
                peer.dead = true;
                let at = now + peer.backoff;
                peer.retry_at = Some(at);
                peer.backoff = (peer.backoff * 2).min(crate::peers::MAX_BACKOFF);
                next = Some(next.map_or(at, |n| n.min(at)));
                continue;
            }
            if let Some(at) = p.retry_at.filter(|t| *t > now) {
                next = Some(next.map_or(at, |n| n.min(at)));
                continue;
            }
            let (chan, index) = (o.chan, o.index);
            match (self.host.reconnect)(self.host.id, chan, index) {
                Some((mut input, mut output)) => {
                    // Nothing is read from it but its close.
                    input.sentinel = true;
                    self.inputs.push(input);
                    // A stream its grammar ends (`%end`) gets its checksum
                    // kept, as one connected at the start does.
                    let unit = self.host.out_units.get(chan as usize).copied().flatten();
                    if unit.is_some_and(|u| self.host.grammar.has_end(u)) {
                        output.crc = Some(flick_wire::StreamCrc::default());
                    }
                    self.host.outputs[out] = output;
                    let peer = &mut self.host.peers[out];
                    peer.dead = false;
                    peer.answered = false;
                    peer.retry_at = None;
                    // Checked on the next look, once connecting is done.
                    let at = now + CONNECTING_POLL;
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
                None => {
                    let peer = &mut self.host.peers[out];
                    peer.backoff = (peer.backoff * 2).min(crate::peers::MAX_BACKOFF);
                    let at = now + peer.backoff;
                    peer.retry_at = Some(at);
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
        }
        let at = next?;
        let by = *self.reach_by.get_or_insert(now + self.host.connect_timeout);
        if now >= by {
            self.host.job_failed = true;
            self.host
                .stats
                .jobs_failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            static UNREACHED: crate::log::RateLimit = crate::log::RateLimit::new();
            crate::limited!(
                UNREACHED,
                error,
                after_ms = self.host.connect_timeout.as_millis() as u64,
                "job failed: a peer it writes to (its reducer) could not be reached; \
                 its clients' connections are closed without an answer"
            );
            return Some(self.break_up());
        }
        let at = at.min(by);
        self.host.timer = Some(at);
        (self.host.wake_at)(self.host.id, at);
        Some(TaskStatus::Idle)
    }

    /// Ends a broken instance: its inputs close (their connections with
    /// them) and nothing more is written.
    fn break_up(&mut self) -> TaskStatus {
        self.host.release();
        self.vm.stop();
        self.inputs.clear();
        self.host.merges.clear();
        for o in &mut self.host.outputs {
            o.crc = None;
            o.tx = None;
            if let (true, Some((conn, reader))) = (self.host.job_failed, &o.conn) {
                // Aborted, not closed: a reset, so that no peer takes what
                // it got for a whole stream.
                let _ = socket2::SockRef::from(&conn.stream)
                    .set_linger(Some(std::time::Duration::ZERO));
                let _ = conn.stream.shutdown(std::net::Shutdown::Both);
                self.host.waker.wake(*reader);
            }
        }
        TaskStatus::Done
    }

    fn run_inner(&mut self, slice: &mut Timeslice) -> TaskStatus {
        // Inputs found empty in this run (the first 64). Each is polled
        // empty once a run: a value sent to it since wakes the task while
        // it runs, which runs it again (the scheduler's `NOTIFIED`), so
        // polling it again now would only cost a poll (a compute task
        // trying its inputs in turn was 4-7% of a Memcached proxy's CPU).
        let mut seen_empty: u64 = 0;
        if !self.started {
            if let Some(status) = self.reach_writes_only() {
                return status;
            }
            self.started = true;
            let init = self.code().init;
            self.host.initialising = true;
            self.vm.start(&self.module, init, &[]);
            let s = self.step(slice);
            self.host.initialising = false;
            if let Some(s) = s {
                return s;
            }
        }
        loop {
            if self.host.cutting
                && self.host.ready.is_empty()
                && !self.vm.is_running()
                && self.held_piece.is_none()
            {
                self.host.broken = true;
            }
            if self.host.broken || self.sentinel_closed() {
                return self.break_up();
            }
            self.close_given_up();
            if !self.host.new_inputs.is_empty() {
                // A rule switched a peer to a connection of its own: the
                // shared one's replies still come in, the old way.
                // Drained, not taken: the vector keeps its room for the
                // next request's exclusive connection.
                for input in self.host.new_inputs.drain(..) {
                    for old in self
                        .inputs
                        .iter_mut()
                        .filter(|i| i.chan == input.chan && i.index == input.index)
                    {
                        old.retired = true;
                    }
                    self.inputs.push(input);
                }
            }
            if self.vm.is_running() {
                if let Some(s) = self.step(slice) {
                    // A send waits for room; replies that came in meanwhile
                    // may make it (a peer owing too many replies).
                    if s == TaskStatus::Idle && self.absorb_replies() {
                        continue;
                    }
                    return s;
                }
                if let Some(i) = self.following.take() {
                    // The head went where the rule sent it; its body follows.
                    self.inputs[i].follow = self.host.last_route;
                }
                if slice.item_done() {
                    return TaskStatus::Yield;
                }
            }
            if let Some((out, m)) = self.held_piece.take() {
                if !self.forward(out, m) {
                    return TaskStatus::Idle;
                }
            }
            if self.host.ending
                && !self.vm.is_running()
                && self.host.settled()
                && !self.last_body_coming()
            {
                // Every reply is through: close the connections.
                if !self.host.close_outputs() {
                    return TaskStatus::Idle;
                }
            }
            if let Some((chan, index, m)) = self.host.ready.pop_front() {
                let whole_or_head = matches!(m.part, Part::Whole | Part::Head);
                if whole_or_head && self.host.property(chan, Routing::Ends, &m).unwrap_or(0) != 0 {
                    // The peer ends the session with this reply (HTTP's
                    // `Connection: close`, a fault): the client's connection
                    // closes once its replies are through.
                    self.host.ending = true;
                }
                self.host.part_last = None;
                match self.pass_on(chan, m) {
                    Ok(()) => {
                        if slice.item_done() {
                            return TaskStatus::Yield;
                        }
                    }
                    Err(m) => self.start_rule(chan, index, m),
                }
                continue;
            }
            if let Some((chan, index, m, last)) = self.host.parts.pop_front() {
                self.host.part_last = Some(last);
                self.start_rule(chan, index, m);
                continue;
            }
            if self.host.cutting {
                // Everything queued for the client went on.
                self.host.broken = true;
                continue;
            }
            self.close_given_up();
            let n = self.inputs.len();
            let mut got = None;
            for k in 0..n {
                let i = (self.next_input + k) % n;
                let bit = 1u64.checked_shl(i as u32).unwrap_or(0);
                let input = &mut self.inputs[i];
                if !input.open || seen_empty & bit != 0 {
                    continue;
                }
                match input.rx.try_recv() {
                    Ok(m) => {
                        got = Some((i, m));
                        break;
                    }
                    Err(TryRecvError::Empty) => seen_empty |= bit,
                    Err(TryRecvError::Closed) if input.sentinel => {
                        input.open = false;
                        self.host.broken = true;
                    }
                    Err(TryRecvError::Closed) if input.retired => input.open = false,
                    Err(TryRecvError::Closed) => {
                        input.open = false;
                        let (chan, index) = (input.chan, input.index);
                        if self.client != Some(i) {
                            // A peer hung up: what it owed gets fault replies.
                            if let Some(out) = self
                                .host
                                .outputs
                                .iter()
                                .position(|o| o.chan == chan && o.index == index)
                            {
                                // Never reached (its connecting was refused),
                                // or lost.
                                let refused =
                                    self.host.outputs[out].conn.as_ref().is_some_and(|(c, _)| {
                                        c.refused.load(std::sync::atomic::Ordering::Acquire)
                                    });
                                let cause = match refused {
                                    true => crate::peers::Cause::Unreachable,
                                    false => crate::peers::Cause::Lost,
                                };
                                self.host.peer_gone(out, cause);
                            }
                        }
                        if self.client == Some(i) {
                            // The client sent its last request (or is gone):
                            // answer what it sent, then let go of everything.
                            self.host.ending = true;
                        }
                    }
                }
            }
            let Some((i, m)) = got else {
                if !self.host.ready.is_empty() {
                    // A closed peer left replies to hand on.
                    continue;
                }
                match self.run_guards(slice) {
                    Guards::Suspended(s) => return s,
                    Guards::Ran => continue,
                    Guards::Idle => {}
                }
                if self.host.broken {
                    // A merge found a stream broken: no output ends well.
                    return self.break_up();
                }
                let closing = self.host.ending && self.host.settled() && !self.last_body_coming();
                if closing
                    && self.host.outputs.iter().any(|o| o.tx.is_some())
                    && !self.host.close_outputs()
                {
                    return TaskStatus::Idle;
                }
                if !self.host.new_inputs.is_empty() {
                    // A rule reconnected a peer: its input is taken in first.
                    continue;
                }
                if self.inputs.iter().any(|i| i.open && !i.sentinel) || !self.host.merges_done() {
                    return TaskStatus::Idle;
                }
                // Every input is closed: close the outputs, which ends the graph.
                if !self.host.close_outputs() {
                    return TaskStatus::Idle;
                }
                return TaskStatus::Done;
            };
            // An input with messages is read on, up to a streak, before
            // the others are tried: each try of an empty one costs a poll.
            if self.streak < STREAK {
                self.next_input = i;
                self.streak += 1;
            } else {
                self.next_input = (i + 1) % n;
                self.streak = 0;
            }
            let (chan, index) = (self.inputs[i].chan, self.inputs[i].index);
            if self.client == Some(i) && matches!(m.part, Part::Body | Part::End) {
                // A piece of a request's streaming body: after its head,
                // unread by rules. (A reply's pieces follow theirs through
                // the peers' logic below.)
                let follow = self.inputs[i].follow;
                if m.part == Part::End {
                    self.inputs[i].follow = None;
                    if self.inputs[i].last_body {
                        // The session's last request is all through.
                        self.inputs[i].last_body = false;
                        self.inputs[i].open = false;
                    }
                }
                match follow {
                    Some(out) => {
                        if !self.forward(out, m) {
                            return TaskStatus::Idle;
                        }
                    }
                    None => self.host.pool.give(m),
                }
                continue;
            }
            if self.client == Some(i) && m.part == Part::Head {
                self.following = Some(i);
                self.host.last_route = None;
            }
            if let (true, Some(status), Some(_)) =
                (self.client == Some(i), m.rejected, self.inputs[i].follow)
            {
                // The body of the request whose head went on does not
                // parse: no more of it goes, and the client reads no more.
                self.inputs[i].follow = None;
                self.host.body_failed(m, status);
            } else if let (true, Some(status)) = (self.client == Some(i), m.rejected) {
                self.host
                    .answer_request(m, crate::peers::Answer::Reject(status));
            } else if let Some(status) = self.refused(i, chan, &m) {
                self.host
                    .answer_request(m, crate::peers::Answer::Reject(status));
            } else if self.client == Some(i) {
                if self.host.property(chan, Routing::Ends, &m).unwrap_or(0) != 0 {
                    self.host.ending = true;
                    self.host.end_client_session();
                    // Nothing after the last request is read, except the
                    // body of that request itself (HTTP/1.0's POST).
                    match m.part {
                        Part::Head => self.inputs[i].last_body = true,
                        _ => self.inputs[i].open = false,
                    }
                }
                if let Some(m) = self.host.split(chan, index, m) {
                    self.host.part_last = None;
                    self.start_rule(chan, index, m);
                }
            } else {
                // A peer's reply: matched to its request, merged if the
                // request went to every peer, then queued for its rule.
                self.host.on_reply(chan, index, m);
            }
        }
    }
}
