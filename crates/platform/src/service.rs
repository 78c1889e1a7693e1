//! A running program: listeners, the graph of tasks instantiated for each
//! client connection (the paper's application and graph dispatchers), on
//! the scheduler and reactor of a [`Platform`], its own (`Service::start`)
//! or shared with other services (`Service::start_on`); a service stops
//! alone (`Service::stop`), releasing its listeners, backend connections
//! and pools without touching the others.

use crate::compute::{Compute, FieldMap, GraphHost, Input, Output};
use crate::conn::{Conn, Reader, Writer};
use crate::graph_pool::{GraphPool, GraphPoolConfig};
use crate::msg::MsgPool;
use crate::platform::{Platform, PlatformConfig, TENANT_SHIFT};
use crate::state::SharedState;
use crate::stats::Stats;
use flick_exec::Module;
use flick_runtime::io::Reactor;
use flick_runtime::{Policy, Scheduler, TaskId};
use flick_syntax::ast::StateScope;
use flick_wire::{Grammar, UnitId};
use mio::net::{TcpListener, TcpStream};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// A program ready to run one of its processes.
pub struct Loaded {
    pub module: Arc<Module>,
    pub process: usize,
    pub grammar: Arc<Grammar>,
    /// Per process channel: the grammar unit of the messages read from it.
    pub units: Arc<Vec<Option<UnitId>>>,
    /// Per process channel: the grammar unit of the messages written to it.
    pub out_units: Arc<Vec<Option<UnitId>>>,
    pub fields: FieldMap,
    pub global: Arc<Vec<bool>>,
    /// Per process channel: whether it is a channel array.
    pub arrays: Vec<bool>,
    /// Per process channel: whether the process reads it (a peer behind a
    /// channel it only writes, such as a reducer, answers nothing).
    pub readable: Vec<bool>,
    /// Per process channel: whether the process writes it.
    pub writable: Vec<bool>,
    /// Record names and their named fields, for records the program builds.
    pub records: Arc<Vec<(String, Vec<String>)>>,
    /// Per process channel: whether a rule reads it; the messages of a
    /// readable channel no rule reads wait for a `foldt` to take them.
    pub ruled: Vec<bool>,
    /// The program's text, for the positions of run-time faults in logs.
    pub source: Option<Arc<flick_span::SourceFile>>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("the program has no process")]
    NoProcess,
    #[error("channel `{0}` carries `{1}`, which is not a unit of grammar `{2}`")]
    NoUnit(String, String, String),
    #[error(transparent)]
    Code(#[from] flick_exec::Unsupported),
}

impl Loaded {
    /// Prepares the first process of a checked program whose messages
    /// follow `grammar`.
    pub fn new(
        program: &flick_syntax::ast::Program,
        checked: &flick_check::CheckedProgram,
        grammar: Arc<Grammar>,
    ) -> Result<Loaded, LoadError> {
        let module = flick_exec::lower(program, checked)?;
        let process = 0;
        let info = checked.processes.first().ok_or(LoadError::NoProcess)?;
        let mut units = Vec::new();
        let arrays = info
            .channels
            .iter()
            .map(|(_, t)| matches!(t, flick_check::Ty::ChanArray(..)))
            .collect();
        let direction = |write: bool| {
            info.channels
                .iter()
                .map(|(_, t)| match t {
                    flick_check::Ty::Chan(c) | flick_check::Ty::ChanArray(c, _) => {
                        if write {
                            c.output.is_some()
                        } else {
                            c.input.is_some()
                        }
                    }
                    _ => false,
                })
                .collect::<Vec<bool>>()
        };
        let (readable, writable) = (direction(false), direction(true));
        // Per channel, the unit of what is read from it and of what is
        // written to it (a text protocol's requests and replies differ);
        // a channel used one way only uses that unit both ways.
        let mut out_units = Vec::new();
        for (name, ty) in &info.channels {
            let (input, output) = match ty {
                flick_check::Ty::Chan(c) | flick_check::Ty::ChanArray(c, _) => {
                    (c.input.as_ref(), c.output.as_ref())
                }
                _ => (None, None),
            };
            let unit = |t: Option<&Box<flick_check::Ty>>| -> Result<Option<UnitId>, LoadError> {
                let Some(t) = t.map(|t| t.to_string()) else {
                    return Ok(None);
                };
                let id = grammar.unit_id(&t).ok_or_else(|| {
                    LoadError::NoUnit(name.clone(), t.clone(), grammar.name.clone())
                })?;
                Ok(Some(id))
            };
            let (i, o) = (unit(input)?, unit(output)?);
            units.push(i.or(o));
            out_units.push(o.or(i));
        }
        let fields: Vec<Vec<Option<(u16, flick_wire::FieldKind)>>> = module
            .records
            .iter()
            .map(|(record, names)| {
                let unit = grammar.unit_id(record);
                names
                    .iter()
                    .map(|n| {
                        let u = unit?;
                        grammar
                            .unit(u)
                            .fields
                            .iter()
                            .find(|f| &f.name == n)
                            .map(|f| (f.slot, f.kind.clone()))
                    })
                    .collect()
            })
            .collect();
        let global = module.processes[process]
            .state
            .iter()
            .map(|(_, scope)| *scope == StateScope::Global)
            .collect();
        let ruled = (0..info.channels.len())
            .map(|c| module.processes[process].rule_for(c as u16).is_some())
            .collect();
        Ok(Loaded {
            records: Arc::new(module.records.clone()),
            readable,
            writable,
            ruled,
            module: Arc::new(module),
            process,
            grammar,
            units: Arc::new(units),
            out_units: Arc::new(out_units),
            fields: Arc::new(fields),
            global: Arc::new(global),
            arrays,
            source: None,
        })
    }

    fn channel(&self, name: &str) -> Option<usize> {
        self.module.processes[self.process]
            .channels
            .iter()
            .position(|c| c == name)
    }

    /// Whether the rule reading channel `chan` passes each message on
    /// unchanged (`| backends => client`), as the instance then does
    /// without running it (`Compute::pass_on`).
    pub fn passes_on(&self, chan: u16) -> bool {
        self.module.processes[self.process]
            .rule_for(chan)
            .and_then(|f| self.module.functions.get(f as usize))
            .is_some_and(|f| f.passes_on().is_some())
    }
}

#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Channels bound to a listening address: each connection is an instance.
    pub listen: Vec<(String, SocketAddr)>,
    /// For a listening channel array: how many connections make up one
    /// instance (the mappers of an aggregator), in order of arrival.
    pub fan_in: Vec<(String, usize)>,
    /// Channels (or channel arrays) bound to backend addresses.
    pub connect: Vec<(String, Vec<SocketAddr>)>,
    pub workers: usize,
    pub policy: Policy,
    /// The most client connections open at once (each an instance while
    /// it has something in flight); past it, new connections wait in the
    /// listen backlog until one closes.
    pub max_instances: usize,
    /// Capacity of every task channel, in messages.
    pub channel_capacity: usize,
    /// Entries of each dictionary in process state.
    pub dict_capacity: usize,
    /// How long a backend may take to answer before its requests get fault
    /// replies and it is reconnected.
    pub response_timeout: std::time::Duration,
    /// Connections to each backend address per worker, shared by the
    /// instances on that worker, with requests pipelined; 0 gives each
    /// instance connections of its own.
    pub backend_connections: usize,
    /// An idle exclusive backend connection unused this long is closed
    /// rather than taken again, so that a backend's own idle timeout set
    /// longer than it (nginx's `keepalive_timeout`, 75 s by default) never
    /// closes one under a request. `None`: kept however long.
    pub backend_idle_timeout: Option<std::time::Duration>,
    /// A client request begun (some of it read) but not complete this
    /// long after gets the grammar's timeout reply (HTTP 408) where it has
    /// one, or its connection closes: a client that stops mid-request
    /// (slowloris) holds no instance for ever. A connection idle between
    /// requests is not timed. `None`: no limit.
    pub client_request_timeout: Option<std::time::Duration>,
    /// The most exclusive connections each worker opens to each backend
    /// address, busy and idle; past it a request waits for one to come
    /// back, at most the response timeout, then gets the grammar's fault
    /// reply (HTTP 503). 0: no cap.
    pub backend_max_connections: usize,
    /// How backend connections are shared; `None`: as the grammar says
    /// (`%exclusive` on the unit of requests).
    pub backend_sharing: Option<Sharing>,
    /// How long a fan-in group may wait for its last connection before its
    /// job fails.
    pub fan_in_timeout: std::time::Duration,
    /// How long an instance tries, with backoff, to reach a peer it only
    /// writes to (a reducer) before its job fails.
    pub connect_timeout: std::time::Duration,
    /// Where a line per answered request goes (`--access-log`), if anywhere.
    pub access_log: Option<Arc<crate::access_log::AccessLog>>,
    /// How long a client connection stays idle (nothing buffered, nothing
    /// in flight) before its instance ends and the connection waits with
    /// no tasks, channels or buffers until its next bytes; `None` keeps
    /// instances for as long as their connections. Only programs whose
    /// instances keep nothing between requests (no `local` state, no
    /// connections of their own, no `least_connections`) park.
    pub park_after: Option<std::time::Duration>,
    /// Which workers accept client connections.
    pub accept: Accept,
    /// Bind every listener with `SO_REUSEPORT`, so that a new version of
    /// the service can listen on the same address before this one stops.
    pub reuse_port: bool,
    /// Graphs made when the service starts, and kept however long they go
    /// unused (at most `max_instances`); more are made on demand.
    pub graphs_ahead: usize,
    /// The most messages the service's pool keeps for reuse.
    pub message_pool: usize,
    /// Messages made when the service starts (each holds a slot per field
    /// of the grammar's largest unit: kilobytes for HTTP's), and kept
    /// however long they go unused; more are made on demand and trimmed
    /// back to this many.
    pub messages_ahead: usize,
    /// Its share of the platform's workers against other services' (1 to
    /// `flick_runtime::MAX_WEIGHT`): its tasks run in a scheduler group of
    /// this weight, so a busy neighbour cannot starve it. 0: no group of its
    /// own; it shares the platform's default group, first come first
    /// served, with every other such service. A service on a platform of
    /// its own (`Service::start`) has nobody to share with and takes none.
    pub weight: u32,
    /// A client's message whose whole body, head included, fits in this
    /// many bytes is read and checked to its end before any of it goes
    /// on (where its grammar's `%buffer_body` allows); a larger one
    /// streams. 0: every body streams.
    pub request_buffer_bytes: usize,
}

/// What [`ServiceConfig::request_buffer_bytes`] is unless set: 16 KiB, as
/// nginx's `client_body_buffer_size` on 64-bit systems.
pub const REQUEST_BUFFER_BYTES: usize = 16 << 10;

/// Which workers accept client connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Accept {
    /// A listening socket per worker, all bound to the same address with
    /// `SO_REUSEPORT` and each on its worker's epoll: the kernel spreads
    /// connections over them by hash, and a worker places the instances it
    /// accepts on itself. A channel array with `--fan-in` gathers its
    /// groups in one place, so it accepts on one worker regardless.
    #[default]
    PerWorker,
    /// One listening socket, on the first worker, which accepts every
    /// connection and spreads the instances over the workers.
    Single,
}

/// How instances share a backend connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// Requests of many instances interleaved, replies matched in order.
    Pipelined,
    /// One instance at a time; back to the idle ones when it is done.
    Exclusive,
}

/// Whether connections to the peers of channel `chan` are exclusive.
fn exclusive(loaded: &Loaded, chan: usize, sharing: Option<Sharing>) -> bool {
    match sharing {
        Some(s) => s == Sharing::Exclusive,
        None => loaded.out_units[chan].is_some_and(|u| {
            loaded
                .grammar
                .property(u, "exclusive", &[], &[])
                .unwrap_or(0)
                != 0
        }),
    }
}

impl Default for ServiceConfig {
    fn default() -> ServiceConfig {
        ServiceConfig {
            listen: Vec::new(),
            fan_in: Vec::new(),
            connect: Vec::new(),
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            policy: Policy::default(),
            max_instances: 10_000,
            channel_capacity: 64,
            dict_capacity: 1024,
            response_timeout: std::time::Duration::from_secs(2),
            backend_connections: 1,
            backend_idle_timeout: Some(BACKEND_IDLE_TIMEOUT),
            client_request_timeout: Some(CLIENT_REQUEST_TIMEOUT),
            backend_max_connections: 0,
            backend_sharing: None,
            fan_in_timeout: std::time::Duration::from_secs(10),
            connect_timeout: std::time::Duration::from_secs(10),
            access_log: None,
            park_after: Some(std::time::Duration::from_secs(1)),
            accept: Accept::default(),
            reuse_port: false,
            graphs_ahead: GRAPHS_MADE_AHEAD,
            message_pool: MSG_POOL_MAX,
            messages_ahead: 256,
            weight: 1,
            request_buffer_bytes: REQUEST_BUFFER_BYTES,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("channel `{0}` is not a channel of the process")]
    UnknownChannel(String),
    #[error("nothing listens: bind a channel with --listen")]
    NothingListens,
    #[error("channel `{0}` has no binding: give it --listen or --connect")]
    Unbound(String),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("channel `{0}` is a channel array: give how many connections make up an instance (--fan-in {0}=N)")]
    FanIn(String),
    #[error(transparent)]
    Platform(#[from] crate::platform::PlatformError),
}

struct Parts {
    loaded: Loaded,
    config: ServiceConfig,
    /// What a client request that timed out is answered with
    /// ([`timeout_status`]).
    timeout_status: Option<u16>,
    platform: Platform,
    /// The scheduler group its tasks run in; `None`: the default group.
    group: Option<flick_runtime::Group>,
    /// Its number on the platform, set once it joined.
    tenant: std::sync::OnceLock<usize>,
    /// Most client connections open since memory was last given back.
    trim_peak: std::sync::atomic::AtomicUsize,
    scheduler: Arc<Scheduler>,
    reactor: Arc<Reactor>,
    pool: Arc<MsgPool>,
    globals: Arc<SharedState>,
    stats: Arc<Stats>,
    /// The channel index of the listening channel.
    client_chan: usize,
    /// Connections that make up one instance (1 unless it is an array).
    fan_in: usize,
    /// Connections accepted for an instance that is not complete yet.
    /// Connections of a fan-in group that is not full yet, and when its
    /// first arrived.
    arriving: Mutex<(Vec<TcpStream>, Option<std::time::Instant>)>,
    /// Per connect binding: (channel index, addresses).
    backends: Vec<(usize, Vec<SocketAddr>)>,
    /// Set on shutdown: every instance finishes what it has and closes.
    draining: Arc<std::sync::atomic::AtomicBool>,
    /// Compute tasks of the live instances, to wake them for a drain.
    computes: Mutex<std::collections::HashSet<TaskId>>,
    /// Shared connections per backend address (empty: per instance).
    shared: Vec<crate::backend::Backend>,
    /// Graphs for new instances, made ahead and reused.
    graphs: Arc<GraphPool>,
    /// Live instances per peer of each channel array bound to peers, for
    /// `least_connections` (nothing is counted if the program never calls it).
    balance: Arc<crate::balance::Balance>,
    /// The listeners (one, or one per worker), while the service accepts.
    accepting: Vec<Acceptor>,
    /// Where the next resumption after the limit starts, so that no
    /// listener's backlog is always served last.
    resume_from: std::sync::atomic::AtomicUsize,
    /// Client connections open (parked ones too), against `max_instances`.
    clients: std::sync::atomic::AtomicUsize,
    /// Accepting stopped at the limit: the next close accepts again.
    accept_paused: std::sync::atomic::AtomicBool,
    /// Whether idle client connections give up their instances.
    parkable: bool,
    /// Idle client connections with no instance, by key.
    parked: Mutex<Parked>,
    /// What client connections tell the service when they close or park.
    slot: std::sync::OnceLock<Arc<dyn crate::conn::ClientSlot>>,
    /// The version that replaced this one and takes its idle client
    /// connections as it drains (see [`Service::start_replacing`]).
    successor: Mutex<Option<std::sync::Weak<Parts>>>,
    /// Client connections handed to the successor.
    handed_over: std::sync::atomic::AtomicU64,
    /// Backends (channel and index) whose connections are exclusive: an
    /// instance takes one at its first request to the backend and gives
    /// it back as soon as it has nothing in flight.
    exclusive: Arc<[(u16, Option<u32>)]>,
}

/// A listening socket and where the instances it accepts run.
struct Acceptor {
    listener: Mutex<Option<TcpListener>>,
    /// Its registration with the reactor, to drop it when accepting stops.
    token: Mutex<Option<flick_runtime::io::IoToken>>,
    /// The worker whose epoll it is registered on, which runs its
    /// instances; `None`: instances go wherever free task ids fall.
    worker: Option<usize>,
    /// Connections it accepted.
    accepted: std::sync::atomic::AtomicU64,
}

/// Parked connections: a slab, so a readiness event finds its stream by
/// the key in its token.
#[derive(Default)]
struct Parked {
    streams: Vec<Option<(TcpStream, flick_runtime::io::IoToken)>>,
    free: Vec<usize>,
}

/// The service as its client connections see it.
struct Clients {
    parts: std::sync::Weak<Parts>,
    hooks: Hooks,
}

impl crate::conn::ClientSlot for Clients {
    fn park(&self, mut stream: TcpStream) {
        let Some(p) = self.parts.upgrade() else {
            return;
        };
        // Read under the lock `drain` takes after setting it: a connection
        // parked as the drain begins is either in the slab it empties or
        // sees the drain here, never left behind in a slab nobody empties.
        let mut parked = p.parked.lock().expect("parked lock");
        if p.draining.load(Ordering::Acquire) {
            drop(parked);
            return hand_over(&p, &self.hooks, stream);
        }
        let key = match parked.free.pop() {
            Some(k) => k,
            None => {
                parked.streams.push(None);
                parked.streams.len() - 1
            }
        };
        let worker = key % p.scheduler.workers().max(1);
        let tenant = p.tenant.get().copied().unwrap_or(0);
        let routed = (tenant << TENANT_SHIFT) | key;
        match p.reactor.register_parked(&mut stream, routed, worker) {
            Ok(token) => parked.streams[key] = Some((stream, token)),
            Err(_) => {
                parked.free.push(key);
                drop(parked);
                drop(stream);
                client_lost(&p, &self.hooks, true);
            }
        }
    }

    fn closed(&self) {
        if let Some(p) = self.parts.upgrade() {
            client_closed(&p, &self.hooks);
        }
    }

    fn hands_over(&self) -> bool {
        self.parts
            .upgrade()
            .is_some_and(|p| p.draining.load(Ordering::Acquire) && successor(&p).is_some())
    }
}

/// Whether `next` can take `old`'s client connections between requests:
/// it reads the same messages from them (same grammar, same client units)
/// and, like `old`, serves each connection as an instance of its own. The
/// listening address is the same already (`next` took over `old`'s
/// listeners). `local` state starts afresh, as on a new connection.
fn same_clients(old: &Parts, next: &Parts) -> bool {
    let units = |p: &Parts| {
        let unit = |u: Option<UnitId>| u.map(|u| p.loaded.grammar.units()[u].name.clone());
        (
            p.loaded.grammar.name.clone(),
            unit(p.loaded.units[p.client_chan]),
            unit(p.loaded.out_units[p.client_chan]),
        )
    };
    let one_each = |p: &Parts| p.fan_in == 1 && p.loaded.ruled[p.client_chan];
    one_each(old) && one_each(next) && units(old) == units(next)
}

/// The version that takes this draining one's idle client connections,
/// while it runs.
fn successor(p: &Parts) -> Option<Arc<Parts>> {
    p.successor
        .lock()
        .expect("successor lock")
        .as_ref()
        .and_then(std::sync::Weak::upgrade)
}

/// An idle client connection of a draining version (nothing read of a
/// next request, nothing owed to it): its successor takes it as one of
/// its own parked connections, and reads what the client sends next; with
/// no successor (a plain stop) it closes.
fn hand_over(p: &Arc<Parts>, hooks: &Hooks, stream: TcpStream) {
    let next = successor(p);
    client_lost(p, hooks, true);
    let Some(next) = next else {
        return drop(stream);
    };
    p.handed_over.fetch_add(1, Ordering::Relaxed);
    next.clients.fetch_add(1, Ordering::AcqRel);
    next.stats.connections_open.fetch_add(1, Ordering::Relaxed);
    match next.slot.get() {
        // Registered, it is reported readable at once if bytes wait.
        Some(slot) => slot.park(stream),
        None => {
            drop(stream);
            client_lost(&next, &self::hooks(&next), true);
        }
    }
}

/// A client connection closed without a `Conn` to say so (it never had
/// one, or it was parked): counted as closed.
fn client_lost(p: &Arc<Parts>, hooks: &Hooks, counted_open: bool) {
    if counted_open {
        p.stats.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
    client_closed(p, hooks);
}

/// One client connection fewer: accepting resumes if it stopped at the
/// limit.
fn client_closed(p: &Arc<Parts>, hooks: &Hooks) {
    p.clients.fetch_sub(1, Ordering::AcqRel);
    if p.accept_paused.swap(false, Ordering::AcqRel) {
        // Every listener may have connections waiting in its backlog, and
        // edge-triggered readiness will not say so again.
        let n = p.accepting.len();
        let from = p.resume_from.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            accept_ready(p, hooks, (from + i) % n, true);
        }
    }
}

/// Accepts connections until the backlog is empty or the limit of open
/// client connections is reached; at the limit the rest wait in the
/// backlog, and the next connection to close accepts again. `nested`: a
/// call from a connection closing, which may be inside an accept on this
/// thread, so it does not wait for the listener.
fn accept_ready(p: &Arc<Parts>, hooks: &Hooks, which: usize, nested: bool) {
    let acceptor = &p.accepting[which];
    loop {
        let guard = match nested {
            false => acceptor.listener.lock().expect("listener lock"),
            true => match acceptor.listener.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    // Whoever holds the listener looks again when done.
                    p.accept_paused.store(true, Ordering::Release);
                    return;
                }
            },
        };
        let Some(l) = guard.as_ref() else { return };
        let mut at_limit = false;
        // Accept until the backlog is empty: readiness is edge-triggered,
        // so stopping early would strand connections until the next one
        // arrives (or, at the limit, until one closes).
        loop {
            if p.clients.load(Ordering::Acquire) >= p.config.max_instances {
                p.accept_paused.store(true, Ordering::Release);
                at_limit = true;
                break;
            }
            match l.accept() {
                Ok((stream, _)) => {
                    p.clients.fetch_add(1, Ordering::AcqRel);
                    p.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
                    acceptor.accepted.fetch_add(1, Ordering::Relaxed);
                    arrive(p, hooks, stream, acceptor.worker);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // A client gone before it was accepted, or a signal.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::Interrupted
                            | std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::ConnectionReset
                    ) => {}
                // Out of descriptors or memory: try again on the next
                // readiness event rather than spin.
                Err(_) => break,
            }
        }
        drop(guard);
        // A connection that closed while the listener was held may have
        // found it taken: look again.
        if at_limit
            && p.clients.load(Ordering::Acquire) < p.config.max_instances
            && p.accept_paused.swap(false, Ordering::AcqRel)
        {
            continue;
        }
        return;
    }
}

/// A parked connection has bytes (or closed): a new instance for it.
fn unpark(p: &Arc<Parts>, hooks: &Hooks, key: usize) {
    let taken = {
        let mut parked = p.parked.lock().expect("parked lock");
        let taken = parked.streams.get_mut(key).and_then(Option::take);
        if taken.is_some() {
            parked.free.push(key);
        }
        taken
    };
    let Some((mut stream, token)) = taken else {
        return;
    };
    p.reactor.deregister_stream(&mut stream, token);
    // A client that closed (most parked connections end so) needs no
    // instance to say goodbye to: a burst of closes would otherwise make a
    // burst of instances, each joining its backends.
    let mut byte = [0u8; 1];
    match stream.peek(&mut byte) {
        Ok(n) if n > 0 => instantiate(p, hooks, std::iter::once(stream), true, None),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            // Nothing after all: back to waiting.
            if let Some(slot) = p.slot.get() {
                slot.park(stream);
            }
        }
        _ => {
            drop(stream);
            client_lost(p, hooks, true);
        }
    }
}

/// Listen backlog: connections past the limit wait here (the kernel caps
/// it at `net.core.somaxconn`).
const LISTEN_BACKLOG: i32 = 65_535;

/// A non-blocking listener with a deep backlog; `shared`: one of several
/// bound to the same address (`SO_REUSEPORT`), among which the kernel
/// spreads connections.
fn listen(addr: SocketAddr, shared: bool) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if shared {
        socket.set_reuse_port(true)?;
    }
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(TcpListener::from_std(socket.into()))
}

/// What every instance's compute task calls back into the service with.
struct Hooks {
    reconnect: crate::compute::Reconnect,
    own_connection: crate::compute::Reconnect,
    fresh_connection: crate::compute::Reconnect,
    at_cap: crate::compute::AtCap,
    wake_at: crate::compute::WakeAt,
}

/// A service's channels checked against its bindings: the listening
/// channel, how many connections make up one instance, and the channel of
/// each connect binding.
struct Bound {
    laddr: SocketAddr,
    client_chan: usize,
    fan_in: usize,
    backends: Vec<(usize, Vec<SocketAddr>)>,
}

fn bind(loaded: &Loaded, config: &ServiceConfig) -> Result<Bound, StartError> {
    let (lname, laddr) = config
        .listen
        .first()
        .cloned()
        .ok_or(StartError::NothingListens)?;
    let client_chan = loaded
        .channel(&lname)
        .ok_or_else(|| StartError::UnknownChannel(lname.clone()))?;
    let fan_in = match loaded.arrays[client_chan] {
        false => 1,
        true => config
            .fan_in
            .iter()
            .find(|(c, _)| *c == lname)
            .map(|(_, n)| *n)
            .filter(|n| *n > 0)
            .ok_or_else(|| StartError::FanIn(lname.clone()))?,
    };
    let mut backends = Vec::new();
    for (name, addrs) in &config.connect {
        let c = loaded
            .channel(name)
            .ok_or_else(|| StartError::UnknownChannel(name.clone()))?;
        backends.push((c, addrs.clone()));
    }
    for (i, name) in loaded.module.processes[loaded.process]
        .channels
        .iter()
        .enumerate()
    {
        if i != client_chan && !backends.iter().any(|(c, _)| *c == i) {
            return Err(StartError::Unbound(name.clone()));
        }
    }
    Ok(Bound {
        laddr,
        client_chan,
        fan_in,
        backends,
    })
}

/// What became of a service asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped {
    /// Every instance finished before the deadline.
    pub drained: bool,
    /// Client connections still open at the deadline (they close when
    /// their clients do, or when their instances finish).
    pub clients_left: usize,
    /// Idle client connections handed to the version that replaced it.
    pub handed_over: u64,
}

/// A `global` of a service's process as the operator sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum StateValue {
    /// Not set yet (no instance has run its initialiser).
    Unset,
    Int(i64),
    Bool(bool),
    Bytes(Vec<u8>),
    /// A dictionary: read its entries by key.
    Dict,
    /// A value of another kind, by name, which is not shown.
    Other(&'static str),
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum StateError {
    #[error("`{0}` is not state of the process")]
    NoSuchState(String),
    #[error("`{0}` is `local` state, which belongs to each instance; only `global` state can be read or written")]
    Local(String),
    #[error("`{0}` is not a dictionary")]
    NotDict(String),
    #[error("`{0}` holds {1}; it cannot be given {2}")]
    Kind(String, &'static str, &'static str),
}

impl StateValue {
    fn kind(&self) -> &'static str {
        match self {
            StateValue::Unset => "nothing yet",
            StateValue::Int(_) => "an integer",
            StateValue::Bool(_) => "a boolean",
            StateValue::Bytes(_) => "a string",
            StateValue::Dict => "a dictionary",
            StateValue::Other(k) => k,
        }
    }
}

pub struct Service {
    parts: Arc<Parts>,
    local: SocketAddr,
}

impl Service {
    /// Starts the service on a platform of its own, with `config.workers`
    /// workers and a task table sized for its limits.
    pub fn start(loaded: Loaded, config: ServiceConfig) -> Result<Service, StartError> {
        let b = bind(&loaded, &config)?;
        let peers = b.backends.iter().map(|b| b.1.len()).sum::<usize>();
        let workers = config.workers.max(1);
        let platform = Platform::start(PlatformConfig {
            workers: config.workers,
            policy: config.policy,
            // A compute task, and a reader and a writer per connection of
            // each instance and per shared connection; a quarter more so
            // that every worker has ids of its own when tasks are placed.
            tasks: (config.max_instances * (1 + 2 * (b.fan_in + peers))
                + 2 * config.backend_connections * workers * peers)
                * 5
                / 4
                + 64,
            pin: false,
        })?;
        // Alone on its workers: no group, and no run timed.
        let config = ServiceConfig {
            weight: 0,
            ..config
        };
        Service::start_on(&platform, loaded, config)
    }

    /// Starts the service on `platform`'s workers, beside the services
    /// already there (`config.workers` and `config.policy` are the
    /// platform's, not the service's).
    pub fn start_on(
        platform: &Platform,
        loaded: Loaded,
        config: ServiceConfig,
    ) -> Result<Service, StartError> {
        Service::start_with(platform, loaded, config, None, &mut |_| {})
    }

    /// Starts a new version of `old` on `platform`, as `start_on` does,
    /// that takes over `old`'s listening sockets instead of binding new
    /// ones: `prepare` runs on the new version before it accepts (to carry
    /// state over), then `old` stops accepting and the new version accepts
    /// on the same sockets, what waits in their backlogs included. No
    /// listening socket closes, so no connection is refused or reset, and
    /// none is left in a socket that nobody polls. A version that listens
    /// elsewhere, or on a different number of sockets, binds its own (then
    /// `old`'s close when it stops accepting).
    pub fn start_replacing(
        platform: &Platform,
        loaded: Loaded,
        config: ServiceConfig,
        old: &Service,
        prepare: &mut dyn FnMut(&Service),
    ) -> Result<Service, StartError> {
        Service::start_with(platform, loaded, config, Some(old), prepare)
    }

    fn start_with(
        platform: &Platform,
        loaded: Loaded,
        config: ServiceConfig,
        old: Option<&Service>,
        prepare: &mut dyn FnMut(&Service),
    ) -> Result<Service, StartError> {
        // Parsers made from here on run the stock grammars' generated code.
        flick_grammars::install();
        let Bound {
            laddr,
            client_chan,
            fan_in,
            backends,
        } = bind(&loaded, &config)?;
        let workers = platform.workers();
        let scheduler = platform.scheduler().clone();
        let reactor = platform.reactor().clone();
        let slots = loaded
            .grammar
            .units()
            .iter()
            .map(|u| u.slots as usize)
            .max()
            .unwrap_or(1);
        // Room for the messages in flight under load, so that steady traffic
        // never frees messages the next burst would allocate again; not for
        // every message that could be (a queue slot per message of every
        // channel of every possible instance), and surplus is trimmed.
        let pool = MsgPool::for_grammar(
            loaded.grammar.clone(),
            (config.max_instances * config.channel_capacity * 2).min(config.message_pool.max(1)),
            slots,
            config.messages_ahead.min(config.message_pool),
            256,
        );
        let nstate = loaded.module.processes[loaded.process].state.len();
        let globals = Arc::new(SharedState::new(nstate, config.dict_capacity));
        let mut shared = Vec::new();
        if config.backend_connections > 0 {
            for (chan, addrs) in backends.iter().filter(|(c, _)| loaded.readable[*c]) {
                let array = loaded.arrays[*chan];
                for (i, a) in addrs.iter().enumerate() {
                    shared.push(crate::backend::Backend::new(
                        *chan as u16,
                        array.then_some(i as u32),
                        *a,
                        config.backend_connections,
                        scheduler.workers(),
                        exclusive(&loaded, *chan, config.backend_sharing).then_some(
                            crate::backend::ExclusiveLimits {
                                idle_timeout: config.backend_idle_timeout,
                                max_per_worker: config.backend_max_connections,
                            },
                        ),
                    ));
                }
            }
        }
        // A listener per worker, unless a fan-in group needs one place to
        // gather its connections in order of arrival. The first is bound as
        // asked; the others to its actual address, so that port 0 gives
        // every worker the same port.
        let per_worker = config.accept == Accept::PerWorker && fan_in == 1 && workers > 1;
        let reuse = per_worker || config.reuse_port;
        let count = if per_worker { workers } else { 1 };
        // The old version's sockets, taken over once this one is ready.
        let takes_over = old.filter(|o| {
            let same_addr = o.local == laddr || (laddr.port() == 0 && laddr.ip() == o.local.ip());
            same_addr && o.listeners() == count && o.parts.accepting.len() == count
        });
        let (local, mut listeners) = match takes_over {
            Some(o) => (o.local, Vec::new()),
            None => {
                let first = listen(laddr, reuse).map_err(|e| StartError::Listen(laddr, e))?;
                let local = first
                    .local_addr()
                    .map_err(|e| StartError::Listen(laddr, e))?;
                let mut listeners = vec![first];
                for _ in 1..count {
                    listeners.push(listen(local, true).map_err(|e| StartError::Listen(local, e))?);
                }
                (local, listeners)
            }
        };
        let client_unit = loaded.units[client_chan].expect("checked: channels carry grammar units");
        let links_per_graph = 2 * fan_in
            + backends
                .iter()
                .map(|(c, a)| {
                    if loaded.readable[*c] {
                        a.len()
                    } else {
                        2 * a.len()
                    }
                })
                .sum::<usize>();
        let graphs = Arc::new(GraphPool::new(
            GraphPoolConfig {
                prefill: config.max_instances.min(config.graphs_ahead),
                keep: config.max_instances,
                links_per_graph,
                replies_per_graph: backends.iter().map(|(_, a)| a.len()).sum(),
                link_capacity: config.channel_capacity,
                reply_capacity: config.channel_capacity.max(64) * 4,
                nstate,
                dict_capacity: config.dict_capacity,
            },
            scheduler.waker(),
            || read_side(&loaded, client_unit, config.request_buffer_bytes),
        ));
        let stats = Arc::new(
            Stats::for_channels(&loaded.module.processes[loaded.process].channels)
                .with_backends(backends.iter().flat_map(|(c, addrs)| {
                    let array = loaded.arrays[*c];
                    let at = move |(i, a): (usize, &SocketAddr)| {
                        (*c as u16, array.then_some(i as u32), *a)
                    };
                    addrs.iter().enumerate().map(at)
                }))
                .with_listening(client_chan)
                .with_access_log(config.access_log.clone()),
        );
        let balanced = loaded
            .module
            .calls(flick_exec::code::Builtin::LeastConnections);
        let balance = Arc::new(crate::balance::Balance::new(
            loaded.arrays.len(),
            backends
                .iter()
                .filter(|(c, _)| balanced && loaded.arrays[*c])
                .map(|(c, addrs)| (*c, addrs.len() as u32)),
        ));
        let group = match config.weight {
            0 => None,
            w => match scheduler.group(w) {
                Ok(g) => Some(g),
                Err(e) => {
                    // Still served, in the default group, first come first
                    // served with the other services there.
                    tracing::warn!("service runs without a weight of its own: {e}");
                    None
                }
            },
        };
        let config_max_instances = config.max_instances;
        // An instance may end while its client is idle, and a new one take
        // over at its next bytes, only if nothing of the old one would be
        // missed: no `local` state, no connection of its own (peers only
        // written to, or connections not shared), no count of live
        // instances per peer, one connection per instance.
        let parkable = config.park_after.is_some()
            && fan_in == 1
            && loaded.ruled[client_chan]
            && loaded.global.iter().all(|g| *g)
            && !balanced
            && backends.iter().all(|(c, _)| loaded.readable[*c])
            && (backends.is_empty() || config.backend_connections > 0);
        let timeout_status = timeout_status(&loaded, client_chan);
        let exclusive: Arc<[(u16, Option<u32>)]> = shared
            .iter()
            .filter(|b| b.exclusive.is_some())
            .map(|b| (b.chan, b.index))
            .collect();
        let parts = Arc::new(Parts {
            loaded,
            config,
            timeout_status,
            platform: platform.clone(),
            group,
            tenant: std::sync::OnceLock::new(),
            trim_peak: std::sync::atomic::AtomicUsize::new(0),
            scheduler,
            reactor: reactor.clone(),
            pool,
            globals,
            stats,
            client_chan,
            fan_in,
            arriving: Mutex::new((Vec::new(), None)),
            backends,
            draining: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            computes: Mutex::new(std::collections::HashSet::with_capacity(
                config_max_instances.min(4096),
            )),
            shared,
            graphs,
            balance,
            accepting: (0..count)
                .map(|w| Acceptor {
                    listener: Mutex::new(None),
                    token: Mutex::new(None),
                    worker: per_worker.then_some(w),
                    accepted: std::sync::atomic::AtomicU64::new(0),
                })
                .collect(),
            resume_from: std::sync::atomic::AtomicUsize::new(0),
            clients: std::sync::atomic::AtomicUsize::new(0),
            accept_paused: std::sync::atomic::AtomicBool::new(false),
            parkable,
            parked: Mutex::new(Parked::default()),
            slot: std::sync::OnceLock::new(),
            successor: Mutex::new(None),
            handed_over: std::sync::atomic::AtomicU64::new(0),
            exclusive,
        });
        let _ = parts.slot.set(Arc::new(Clients {
            parts: Arc::downgrade(&parts),
            hooks: hooks(&parts),
        }));
        let tenant = platform.join(Arc::new(Tenancy {
            parts: Arc::downgrade(&parts),
            hooks: hooks(&parts),
        }));
        let _ = parts.tenant.set(tenant);
        if fan_in > 1 {
            let weak = Arc::downgrade(&parts);
            std::thread::Builder::new()
                .name("flick-fan-in".into())
                .spawn(move || reap_groups(weak))
                .map_err(|e| StartError::Listen(laddr, e))?;
        }
        let service = Service {
            parts: parts.clone(),
            local,
        };
        prepare(&service);
        if let Some(o) = takes_over {
            if same_clients(&o.parts, &parts) {
                *o.parts.successor.lock().expect("successor lock") = Some(Arc::downgrade(&parts));
            }
            listeners = o.take_listeners();
            // Stopped meanwhile by someone else: the rest bound anew.
            while listeners.len() < count {
                listeners.push(listen(local, true).map_err(|e| StartError::Listen(local, e))?);
            }
        }
        // The reactor owns the registrations, each on its worker's epoll;
        // a callback accepts from its listener while the service accepts.
        // It holds the service weakly: a stopped service is freed even if
        // a callback outlives its listener. The listener's slot is held
        // while it registers: connections already in its backlog make
        // the worker call back at once (readiness is edge-triggered, and
        // said once), and the callback must find the listener there, or
        // they would wait until another connection arrives.
        for (i, mut listener) in listeners.into_iter().enumerate() {
            let (weak, hooks) = (Arc::downgrade(&parts), hooks(&parts));
            let mut slot = parts.accepting[i].listener.lock().expect("listener lock");
            let token = reactor
                .register_listener_on(
                    &mut listener,
                    Box::new(move || {
                        if let Some(p) = weak.upgrade() {
                            accept_ready(&p, &hooks, i, false)
                        }
                    }),
                    i,
                )
                .map_err(|e| StartError::Listen(local, e))?;
            *parts.accepting[i].token.lock().expect("token lock") = Some(token);
            *slot = Some(listener);
        }
        Ok(service)
    }

    /// Fails as a plain bind does where something listens on `addr`
    /// already (listeners with `SO_REUSEPORT` would share it without a
    /// word), without listening itself: a client that connects meanwhile
    /// is refused and tries again, where a listener that closed would have
    /// taken its connection and then reset it.
    pub fn check_address_free(addr: SocketAddr) -> std::io::Result<()> {
        use socket2::{Domain, Protocol, Socket, Type};
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        socket.bind(&addr.into())
    }

    /// The address the service listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn stats(&self) -> &Stats {
        &self.parts.stats
    }

    /// Messages in the shared pool, to check that nothing leaks.
    pub fn pooled_messages(&self) -> usize {
        self.parts.pool.available()
    }

    /// Backend connections shared by the instances and alive now; each has
    /// a reader and a writer task.
    pub fn shared_connections(&self) -> usize {
        self.parts.shared.iter().map(|b| b.live()).sum()
    }

    /// Graphs ready in the pool for new instances.
    pub fn pooled_graphs(&self) -> usize {
        self.parts.graphs.available()
    }

    /// Tasks alive in the scheduler.
    pub fn live_tasks(&self) -> usize {
        self.parts.scheduler.live()
    }

    /// Its weight against the other services on its platform (0: none,
    /// it runs in the platform's default group).
    pub fn weight(&self) -> u32 {
        self.parts.group.as_ref().map_or(0, |g| g.weight())
    }

    /// Changes its weight from each worker's next turn of the service; a
    /// service without a group of its own (weight 0) keeps none.
    pub fn set_weight(&self, weight: u32) {
        if let Some(g) = &self.parts.group {
            g.set_weight(weight);
        }
    }

    /// CPU time its tasks were charged with on their workers (only while
    /// groups share the platform's workers; see `flick_runtime::Group`).
    pub fn cpu_charged(&self) -> std::time::Duration {
        self.parts
            .group
            .as_ref()
            .map_or(std::time::Duration::ZERO, |g| g.charged())
    }

    /// Tasks waiting in each worker's run queue now.
    pub fn queue_lengths(&self) -> Vec<usize> {
        self.parts.scheduler.queue_lengths()
    }

    /// Client connections open now, parked ones included.
    pub fn client_connections(&self) -> usize {
        self.parts.clients.load(Ordering::Acquire)
    }

    /// Idle client connections waiting with no instance.
    pub fn parked_connections(&self) -> usize {
        let parked = self.parts.parked.lock().expect("parked lock");
        parked.streams.len() - parked.free.len()
    }

    /// Connections accepted per worker so far (all on the first with one
    /// listener).
    pub fn accepted_per_worker(&self) -> Vec<u64> {
        let workers = self.parts.scheduler.workers().max(1);
        let mut per = vec![0; workers];
        for a in &self.parts.accepting {
            per[a.worker.unwrap_or(0) % workers] += a.accepted.load(Ordering::Relaxed);
        }
        per
    }

    /// Listening sockets open now: one per worker, one, or none once
    /// accepting stopped.
    pub fn listeners(&self) -> usize {
        self.parts
            .accepting
            .iter()
            .filter(|a| a.listener.lock().expect("listener lock").is_some())
            .count()
    }

    /// Stops accepting on every listener (closing them: what waits in
    /// their backlogs is refused); instances already running finish on
    /// their own.
    pub fn stop_accepting(&self) {
        drop(self.take_listeners());
    }

    /// Stops accepting and hands the listening sockets over, open, in
    /// order (an accept under way finishes first); what waits in their
    /// backlogs stays there for whoever accepts next.
    fn take_listeners(&self) -> Vec<TcpListener> {
        let mut taken = Vec::new();
        for a in &self.parts.accepting {
            let mut slot = a.listener.lock().expect("listener lock");
            let token = a.token.lock().expect("token lock").take();
            if let (Some(mut l), Some(t)) = (slot.take(), token) {
                self.parts.reactor.deregister_listener(&mut l, t);
                taken.push(l);
            }
        }
        taken
    }

    /// Stops the service alone (an undeploy): it stops accepting, its
    /// instances drain until `deadline`, its shared backend connections
    /// close, and it leaves the platform; the platform's other services
    /// are not touched. Dropping the `Service` afterwards frees its pools.
    pub fn stop(&self, deadline: std::time::Duration) -> Stopped {
        self.drain();
        let until = std::time::Instant::now() + deadline;
        let busy = |p: &Parts| {
            p.stats.graphs_live.load(Ordering::Relaxed) > 0 || p.clients.load(Ordering::Acquire) > 0
        };
        while busy(&self.parts) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let drained = !busy(&self.parts);
        // Their tasks see the sockets shut and end.
        for b in &self.parts.shared {
            b.shut_all();
        }
        if let Some(t) = self.parts.tenant.get() {
            self.parts.platform.leave(*t);
        }
        Stopped {
            drained,
            clients_left: self.parts.clients.load(Ordering::Acquire),
            handed_over: self.parts.handed_over.load(Ordering::Relaxed),
        }
    }

    /// The names of the process's state variables, each with whether it
    /// is `global`.
    pub fn state_names(&self) -> Vec<(String, bool)> {
        let l = &self.parts.loaded;
        l.module.processes[l.process]
            .state
            .iter()
            .map(|(n, scope)| (n.clone(), *scope == StateScope::Global))
            .collect()
    }

    fn global_index(&self, name: &str) -> Result<u16, StateError> {
        let l = &self.parts.loaded;
        let i = l.module.processes[l.process]
            .state
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| StateError::NoSuchState(name.to_string()))?;
        if !l.global[i] {
            return Err(StateError::Local(name.to_string()));
        }
        Ok(i as u16)
    }

    /// A `global` variable's value now.
    pub fn read_global(&self, name: &str) -> Result<StateValue, StateError> {
        let i = self.global_index(name)?;
        Ok(match self.parts.globals.load(i) {
            flick_exec::Value::Unit => StateValue::Unset,
            flick_exec::Value::Int(n) => StateValue::Int(n),
            flick_exec::Value::Bool(b) => StateValue::Bool(b),
            flick_exec::Value::Bytes(b) => StateValue::Bytes(b.to_vec()),
            flick_exec::Value::Dict { .. } => StateValue::Dict,
            flick_exec::Value::None => StateValue::Other("none"),
            _ => StateValue::Other("a value held by the interpreter"),
        })
    }

    /// The bytes of the message a `global` dictionary holds under `key`.
    pub fn read_entry(&self, name: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        let i = self.global_index(name)?;
        match self.read_global(name)? {
            StateValue::Dict => {}
            StateValue::Unset => return Ok(None),
            _ => return Err(StateError::NotDict(name.to_string())),
        }
        Ok(self.parts.globals.entry_bytes(i, key, &self.parts.pool))
    }

    /// A `global` dictionary, for the operator to list, write and delete
    /// its entries (`state.rs`).
    pub fn global_dict(&self, name: &str) -> Result<crate::state::GlobalDict<'_>, StateError> {
        let i = self.global_index(name)?;
        let p = &self.parts;
        Ok(crate::state::GlobalDict::new(
            &p.globals,
            i,
            &p.pool,
            &p.loaded.grammar,
        ))
    }

    /// Changes made to `global` state so far (a count that only grows).
    pub fn state_changes(&self) -> u64 {
        self.parts.globals.changes()
    }

    /// Sets a `global` integer, boolean or string; a variable that holds
    /// one kind takes only that kind.
    pub fn write_global(&self, name: &str, value: StateValue) -> Result<(), StateError> {
        let i = self.global_index(name)?;
        let now = self.read_global(name)?;
        let same = std::mem::discriminant(&now) == std::mem::discriminant(&value);
        let v = match value {
            StateValue::Int(n) => flick_exec::Value::Int(n),
            StateValue::Bool(b) => flick_exec::Value::Bool(b),
            StateValue::Bytes(b) => flick_exec::Value::Bytes(b.into()),
            other => return Err(StateError::Kind(name.to_string(), now.kind(), other.kind())),
        };
        if !same && now != StateValue::Unset {
            let given = match &v {
                flick_exec::Value::Int(_) => "an integer",
                flick_exec::Value::Bool(_) => "a boolean",
                _ => "a string",
            };
            return Err(StateError::Kind(name.to_string(), now.kind(), given));
        }
        self.parts.globals.store(i, v);
        Ok(())
    }

    /// Stops accepting, and has every instance stop reading its client,
    /// answer what it has read, and close: a clean shutdown. Parked
    /// connections, which have nothing in flight, close now.
    ///
    /// A version replaced by one that serves the same clients
    /// ([`Service::start_replacing`]) closes none of its kept-alive
    /// connections: its parked ones go to the successor now, and each
    /// instance's connection, once what it read is answered and nothing
    /// of a next request has arrived, goes there too (`Conn::hand_over`);
    /// the successor reads their next requests. A client never sees the
    /// reload, and no request races a close.
    pub fn drain(&self) {
        self.stop_accepting();
        self.parts.draining.store(true, Ordering::Release);
        let parked: Vec<_> = {
            let mut parked = self.parts.parked.lock().expect("parked lock");
            let Parked { streams, free } = &mut *parked;
            free.clear();
            streams.drain(..).flatten().collect()
        };
        if !parked.is_empty() {
            let hooks = hooks(&self.parts);
            for (mut stream, token) in parked {
                self.parts.reactor.deregister_stream(&mut stream, token);
                hand_over(&self.parts, &hooks, stream);
            }
        }
        let waker = self.parts.scheduler.waker();
        for id in self.parts.computes.lock().expect("computes lock").iter() {
            waker.wake(*id);
        }
    }
}

/// One connection's input and output, for the compute task, and the
/// reader and writer tasks to start.
struct Connection {
    input: Input,
    output: Output,
    /// The reader and the writer.
    tasks: [(TaskId, Box<dyn flick_runtime::Task>); 2],
}

/// Sets up the reader and writer tasks of a connection of channel
/// `chan[index]`, feeding (and fed by) compute task `compute`.
fn connection(
    p: &Arc<Parts>,
    compute: TaskId,
    chan: usize,
    index: Option<u32>,
    stream: TcpStream,
    reopened: bool,
) -> Option<Connection> {
    // A connection's tasks run on its instance's worker.
    let worker = p.scheduler.home_of(compute);
    let (conn, rid, wid) = attach(p, stream, chan, worker, reopened)?;
    let unit = p.loaded.units[chan].expect("checked: channels carry grammar units");
    let (in_tx, in_rx) = p.graphs.links.channel();
    in_tx.bind(rid);
    in_rx.bind(compute);
    let (out_tx, out_rx) = p.graphs.links.channel();
    out_tx.bind(compute);
    out_rx.bind(wid);
    let client = chan == p.client_chan;
    let reader: Box<dyn flick_runtime::Task> = if client && !p.loaded.ruled[chan] {
        // A stream a `foldt` merges: its bytes go in chunks, parsed where
        // they are merged (merge.rs).
        let mut r = crate::merge_read::ChunkReader::new(
            conn.clone(),
            in_tx,
            p.pool.clone(),
            p.stats.clone(),
            p.draining.clone(),
        );
        Box::new(move |sl: &mut flick_runtime::Timeslice| r.run(sl))
    } else {
        let read = match client {
            true => p
                .graphs
                .read_side(|| read_side(&p.loaded, unit, p.config.request_buffer_bytes)),
            false => read_side(&p.loaded, unit, 0),
        };
        let mut r = Reader {
            conn: conn.clone(),
            read: Some(read),
            graphs: client.then(|| p.graphs.clone()),
            out: Some(in_tx),
            pool: p.pool.clone(),
            pending: None,
            stats: p.stats.clone(),
            draining: (chan == p.client_chan).then(|| p.draining.clone()),
            request_timeout: client
                .then_some(p.config.client_request_timeout)
                .flatten()
                .map(|limit| crate::conn::RequestTimeout {
                    limit,
                    task: rid,
                    status: p.timeout_status,
                    began: None,
                    armed: false,
                }),
        };
        Box::new(move |sl: &mut flick_runtime::Timeslice| r.run(sl))
    };
    let mut writer = Writer {
        conn: conn.clone(),
        rx: out_rx,
        outbox: Default::default(),
        pool: p.pool.clone(),
        stats: p.stats.clone(),
    };
    Some(Connection {
        input: Input {
            rx: in_rx,
            chan: chan as u16,
            index,
            open: true,
            retired: false,
            follow: None,
            sentinel: false,
            last_body: false,
        },
        output: Output {
            tx: Some(out_tx),
            chan: chan as u16,
            index,
            conn: Some((conn, rid)),
            crc: None,
            shared: false,
            idle_limit: None,
        },
        tasks: [
            (rid, reader),
            (
                wid,
                Box::new(move |sl: &mut flick_runtime::Timeslice| writer.run(sl)),
            ),
        ],
    })
}

/// What a client request that timed out is answered with: the client
/// reply unit's `%reject` with the status its `%timeout_status` declares
/// (HTTP's 408, RFC 9110 section 15.5.9); `None` where the grammar
/// declares none (Memcached, which has no reply for it): such a
/// connection just closes, as memcached's would.
fn timeout_status(loaded: &Loaded, client_chan: usize) -> Option<u16> {
    let unit = loaded.out_units.get(client_chan).copied().flatten()?;
    let status = loaded
        .grammar
        .property(unit, "timeout_status", &[], &[])
        .filter(|s| (100..=999).contains(s))?;
    u16::try_from(status).ok()
}

/// A task id for the service (on `worker`'s queue, if given), in its group.
fn reserve(p: &Parts, worker: Option<usize>) -> Result<TaskId, flick_runtime::Full> {
    match (&p.group, worker) {
        (Some(g), w) => p.scheduler.reserve_in(g, w),
        (None, Some(w)) => p.scheduler.reserve_on(w),
        (None, None) => p.scheduler.reserve(),
    }
}

/// A new read side for messages of `unit`: a buffer that grows up to the
/// largest message the grammar allows, or that `hold` holds back whole.
fn read_side(loaded: &Loaded, unit: UnitId, hold: usize) -> crate::conn::ReadSide {
    let max = (loaded.grammar.max_bytes(unit) as usize).clamp(4096, 16 << 20);
    crate::conn::ReadSide::new(loaded.grammar.parser(unit), 4096, max).holding(hold)
}

/// Takes task ids for a socket's reader and writer and registers the
/// socket with the reactor for them; `None` when the scheduler is out of
/// task slots. `reopened`: a parked client connection, already counted.
fn attach(
    p: &Arc<Parts>,
    mut stream: TcpStream,
    chan: usize,
    worker: usize,
    reopened: bool,
) -> Option<(Arc<Conn>, TaskId, TaskId)> {
    let client = chan == p.client_chan;
    let s = &p.scheduler;
    let (rid, wid) = match (reserve(p, Some(worker)), reserve(p, Some(worker))) {
        (Ok(r), Ok(w)) => (r, w),
        (r, w) => {
            // Out of task slots: give back what was taken.
            for id in [r, w].into_iter().flatten() {
                s.start_task(
                    id,
                    Box::new(|_: &mut flick_runtime::Timeslice| flick_runtime::TaskStatus::Done),
                );
            }
            if client {
                drop(stream);
                if let Some(slot) = p.slot.get() {
                    if reopened {
                        p.stats.connections_open.fetch_sub(1, Ordering::Relaxed);
                    }
                    slot.closed();
                }
            }
            return None;
        }
    };
    let token = p
        .reactor
        .register_stream(&mut stream, Some(rid), Some(wid))
        .ok();
    if !reopened {
        p.stats.connections_open.fetch_add(1, Ordering::Relaxed);
    }
    let conn = Arc::new(Conn {
        stream,
        token,
        reactor: p.reactor.clone(),
        stats: p.stats.clone(),
        chan,
        refused: std::sync::atomic::AtomicBool::new(false),
        client: client.then(|| p.slot.get().cloned()).flatten(),
        parkable: client && p.parkable,
        rest: std::sync::atomic::AtomicU32::new(0),
    });
    Some((conn, rid, wid))
}

/// Opens a shared connection to a backend and starts its reader and writer.
fn open_shared(
    p: &Arc<Parts>,
    chan: u16,
    index: Option<u32>,
    addr: SocketAddr,
    worker: usize,
) -> Option<Arc<crate::backend::SharedConn>> {
    let (conn, rid, wid) = attach(p, dial(p, addr)?, chan as usize, worker, false)?;
    let s = &p.scheduler;
    let unit = p.loaded.units[chan as usize].expect("checked: channels carry grammar units");
    let shared = crate::backend::shared_conn(conn, rid, wid, chan, index);
    let max = (p.loaded.grammar.max_bytes(unit) as usize).clamp(4096, 16 << 20);
    let mut reader = crate::backend::SharedReader {
        shared: shared.clone(),
        read: crate::conn::ReadSide::new(p.loaded.grammar.parser(unit), 16384, max).whole_replies(),
        pending: None,
        closing: false,
        pool: p.pool.clone(),
        grammar: p.loaded.grammar.clone(),
        unit,
        stats: p.stats.clone(),
        merge_ends: p.loaded.passes_on(chan),
    };
    let mut writer = crate::backend::SharedWriter {
        shared: shared.clone(),
        outbox: Default::default(),
        next: 0,
        streaming: None,
        pool: p.pool.clone(),
        grammar: p.loaded.grammar.clone(),
        unit: p.loaded.out_units[chan as usize].unwrap_or(unit),
        stats: p.stats.clone(),
    };
    s.start_task(
        rid,
        Box::new(move |sl: &mut flick_runtime::Timeslice| reader.run(sl)),
    );
    s.start_task(
        wid,
        Box::new(move |sl: &mut flick_runtime::Timeslice| writer.run(sl)),
    );
    Some(shared)
}

/// Joins instance `compute` to a shared connection of backend `chan[index]`;
/// `fresh`: a new one where connections are exclusive.
fn join_shared(
    p: &Arc<Parts>,
    compute: TaskId,
    chan: u16,
    index: Option<u32>,
    fresh: bool,
) -> Option<(Input, Output)> {
    let backend = p
        .shared
        .iter()
        .find(|b| b.chan == chan && b.index == index)?;
    let addr = backend.addr;
    // The instance uses its worker's connections, served on that worker.
    let worker = p.scheduler.home_of(compute);
    let open = |c, i| open_shared(p, c, i, addr, worker);
    if backend.exclusive.is_some() {
        return backend.take_exclusive(worker, compute, &p.graphs, fresh, open);
    }
    let conn = backend.pick(worker, open)?;
    conn.join(compute, &p.graphs)
}

/// Connects to a backend address, counting failures.
fn dial(p: &Parts, addr: SocketAddr) -> Option<TcpStream> {
    match TcpStream::connect(addr) {
        Ok(stream) => {
            let _ = stream.set_nodelay(true);
            Some(stream)
        }
        Err(e) => {
            p.stats
                .backend_connect_errors
                .fetch_add(1, Ordering::Relaxed);
            p.stats.connect_failed_to(addr);
            static DIAL: crate::log::RateLimit = crate::log::RateLimit::new();
            crate::limited!(DIAL, warn, backend = %addr, "cannot connect to a backend: {e}");
            None
        }
    }
}

/// Graphs made when a service starts by default (at most `max_instances`);
/// more are made on demand and kept up to `max_instances`, and trimmed
/// back to this many. Each kept graph holds what its first instance grew
/// (its compute state) in the worker's memory among that instance's freed
/// storage, pinning a few pages there after a burst (64 kept held 0.7 MB
/// more than 16 after a burst of 1,000 connections).
const GRAPHS_MADE_AHEAD: usize = 16;

/// The service's callbacks for its instances: reconnecting a backend and
/// waking a compute task at a time.
///
/// They hold the service weakly: instances that outlive a stopped service
/// get no new connections, and keep nothing of it alive.
fn hooks(p: &Arc<Parts>) -> Hooks {
    let reconnect_with = |fresh: bool| -> crate::compute::Reconnect {
        let weak = Arc::downgrade(p);
        Arc::new(move |compute: TaskId, chan: u16, index: Option<u32>| {
            let p = weak.upgrade()?;
            if !p.shared.is_empty() && p.loaded.readable[chan as usize] {
                return join_shared(&p, compute, chan, index, fresh);
            }
            own_connection(&p, compute, chan, index)
        })
    };
    let reconnect = reconnect_with(false);
    let fresh_connection = reconnect_with(true);
    let own: crate::compute::Reconnect = {
        let weak = Arc::downgrade(p);
        Arc::new(move |compute: TaskId, chan: u16, index: Option<u32>| {
            own_connection(&weak.upgrade()?, compute, chan, index)
        })
    };
    let at_cap: crate::compute::AtCap = {
        let weak = Arc::downgrade(p);
        Arc::new(move |compute: TaskId, chan: u16, index: Option<u32>| {
            let Some(p) = weak.upgrade() else {
                return false;
            };
            let worker = p.scheduler.home_of(compute);
            p.shared
                .iter()
                .find(|b| b.chan == chan && b.index == index)
                .is_some_and(|b| b.at_cap(worker))
        })
    };
    let wake_at: crate::compute::WakeAt = {
        let reactor = p.reactor.clone();
        Arc::new(move |compute, at| reactor.wake_at(compute, at))
    };
    Hooks {
        reconnect,
        own_connection: own,
        fresh_connection,
        at_cap,
        wake_at,
    }
}

/// A connection of instance `compute`'s own to backend `chan[index]`, its
/// reader and writer started.
fn own_connection(
    p: &Arc<Parts>,
    compute: TaskId,
    chan: u16,
    index: Option<u32>,
) -> Option<(Input, Output)> {
    let addrs = &p.backends.iter().find(|(c, _)| *c == chan as usize)?.1;
    let addr = *addrs.get(index.unwrap_or(0) as usize)?;
    let c = connection(p, compute, chan as usize, index, dial(p, addr)?, false)?;
    for (id, t) in c.tasks {
        p.scheduler.start_task(id, t);
    }
    Some((c.input, c.output))
}

/// A connection accepted: an instance of its own, or one of the
/// connections that make up an instance of a listening channel array.
fn arrive(p: &Arc<Parts>, hooks: &Hooks, client: TcpStream, worker: Option<usize>) {
    let _ = client.set_nodelay(true);
    if p.fan_in == 1 {
        return instantiate(p, hooks, std::iter::once(client), false, worker);
    }
    let complete = {
        let mut arriving = p.arriving.lock().expect("arriving lock");
        // A group that waited past the fan-in timeout is not this
        // connection's job: it fails, and this one starts a new group.
        expire_group(p, &mut arriving);
        let (group, since) = &mut *arriving;
        group.push(client);
        since.get_or_insert_with(std::time::Instant::now);
        (group.len() == p.fan_in).then(|| {
            *since = None;
            std::mem::take(group)
        })
    };
    if let Some(clients) = complete {
        instantiate(p, hooks, clients.into_iter(), false, None);
    }
}

/// Fails a fan-in group that has waited longer than the fan-in timeout:
/// its connections are reset (its mappers see their job fail rather than
/// wait, and none of them joins the next job's group), with a log line and
/// `jobs_failed`.
fn expire_group(p: &Parts, arriving: &mut (Vec<TcpStream>, Option<std::time::Instant>)) {
    let (group, since) = arriving;
    let Some(first) = *since else { return };
    if first.elapsed() < p.config.fan_in_timeout {
        return;
    }
    static EXPIRED: crate::log::RateLimit = crate::log::RateLimit::new();
    crate::limited!(
        EXPIRED,
        error,
        connections = group.len(),
        wanted = p.fan_in,
        "job failed: its fan-in group did not fill within {:?}; its connections are reset",
        p.config.fan_in_timeout
    );
    p.stats.jobs_failed.fetch_add(1, Ordering::Relaxed);
    for c in group.drain(..) {
        let _ = socket2::SockRef::from(&c).set_linger(Some(std::time::Duration::ZERO));
        p.clients.fetch_sub(1, Ordering::AcqRel);
    }
    *since = None;
}

/// Expires the fan-in group of a service every tenth of its timeout, for
/// as long as the service runs: a group whose last connection never comes
/// fails without waiting for another job's first.
fn reap_groups(parts: std::sync::Weak<Parts>) {
    loop {
        let Some(p) = parts.upgrade() else { return };
        let wait = (p.config.fan_in_timeout / 10).max(std::time::Duration::from_millis(10));
        expire_group(&p, &mut p.arriving.lock().expect("arriving lock"));
        drop(p);
        std::thread::sleep(wait);
    }
}

/// An output with no connection: its requests get fault replies until a
/// reconnection succeeds.
fn unconnected(chan: usize, index: Option<u32>) -> Output {
    Output {
        tx: None,
        chan: chan as u16,
        index,
        conn: None,
        crc: None,
        shared: false,
        idle_limit: None,
    }
}

/// A new instance of the process for its client connections (one, or
/// the fan-in of a listening channel array, in order of arrival), on a
/// graph from the pool.
///
/// `reopened`: the client connection was parked, and is counted as open.
/// `worker`: the worker to run on (the one that accepted it), else
/// wherever a free task id falls.
fn instantiate(
    p: &Arc<Parts>,
    hooks: &Hooks,
    clients: impl ExactSizeIterator<Item = TcpStream>,
    reopened: bool,
    worker: Option<usize>,
) {
    let s = &p.scheduler;
    let nchan = p.loaded.module.processes[p.loaded.process].channels.len();
    let reserved = match worker {
        Some(w) => reserve(p, Some(w)).or_else(|_| reserve(p, None)),
        None => reserve(p, None),
    };
    let Ok(compute_id) = reserved else {
        // Out of task slots: the connections close.
        for c in clients {
            drop(c);
            client_lost(p, hooks, reopened);
        }
        return;
    };
    let mut g = p.graphs.take();
    g.widths.resize(nchan, 1);
    // The instance counts towards no peer yet.
    g.balanced.clear();
    g.balanced.resize(p.balance.words(), 0);
    let client_array = p.loaded.arrays[p.client_chan];
    g.widths[p.client_chan] = clients.len() as u32;
    let mut incomplete = false;
    for (i, client) in clients.enumerate() {
        let index = client_array.then_some(i as u32);
        match connection(p, compute_id, p.client_chan, index, client, reopened) {
            Some(c) => {
                if p.loaded.ruled[p.client_chan] {
                    g.inputs.push(c.input);
                } else {
                    let merge = crate::merge::MergeInput::new(c.input.rx, p.client_chan as u16, i);
                    g.merges.push(merge);
                }
                g.outputs.push(c.output);
                g.starting.extend(c.tasks);
            }
            None => incomplete = true,
        }
    }
    if incomplete {
        // Out of task slots: the instance cannot start.
        let done = || -> Box<dyn flick_runtime::Task> {
            Box::new(|_: &mut flick_runtime::Timeslice| flick_runtime::TaskStatus::Done)
        };
        for (id, _) in g.starting.drain(..) {
            s.start_task(id, done());
        }
        s.start_task(compute_id, done());
        p.graphs.give(g);
        return;
    }
    for (chan, addrs) in &p.backends {
        g.widths[*chan] = addrs.len() as u32;
        let array = p.loaded.arrays[*chan];
        let readable = p.loaded.readable[*chan];
        for (i, a) in addrs.iter().enumerate() {
            let index = array.then_some(i as u32);
            // An exclusive connection is taken at the first request.
            if readable && p.exclusive.contains(&(*chan as u16, index)) {
                g.outputs.push(unconnected(*chan, index));
                continue;
            }
            if readable && !p.shared.is_empty() {
                match join_shared(p, compute_id, *chan as u16, index, false) {
                    Some((input, output)) => {
                        g.inputs.push(input);
                        g.outputs.push(output);
                    }
                    None => g.outputs.push(unconnected(*chan, index)),
                }
                continue;
            }
            // A connection of this instance's own: to a peer it only
            // writes to (a reducer, whose stream is this instance's), or
            // to every backend when connections are not shared.
            match dial(p, *a).and_then(|st| connection(p, compute_id, *chan, index, st, false)) {
                Some(mut c) => {
                    c.input.sentinel = !readable;
                    g.inputs.push(c.input);
                    g.outputs.push(c.output);
                    g.starting.extend(c.tasks);
                }
                None => g.outputs.push(unconnected(*chan, index)),
            }
        }
    }
    let now = std::time::Instant::now();
    for o in &mut g.outputs {
        let unit = p.loaded.out_units[o.chan as usize];
        let writes = p.loaded.writable[o.chan as usize];
        if writes && unit.is_some_and(|u| p.loaded.grammar.has_end(u)) {
            o.crc = Some(flick_wire::StreamCrc::default());
        }
    }
    // Peers reuse the pooled ones, so their request queues keep their room.
    g.peers.truncate(g.outputs.len());
    for (i, o) in g.outputs.iter().enumerate() {
        // An exclusive backend's connection is taken (or, at its cap,
        // waited for) by the first request, as after a clean close, rather
        // than the backend counted down.
        let awaits = o.tx.is_none() && p.exclusive.contains(&(o.chan, o.index));
        let dead = o.tx.is_none() && !awaits;
        let peer = crate::compute::Peer {
            answers: o.chan as usize != p.client_chan && p.loaded.readable[o.chan as usize],
            dead,
            retry_at: dead.then_some(now + crate::peers::FIRST_BACKOFF),
            backoff: crate::peers::FIRST_BACKOFF,
            reconnect_at_once: awaits,
            answered: false,
            quiet_since: None,
            waiting_since: None,
            outstanding: match g.peers.get_mut(i) {
                Some(old) => std::mem::take(&mut old.outstanding),
                None => std::collections::VecDeque::new(),
            },
        };
        match g.peers.get_mut(i) {
            Some(old) => *old = peer,
            None => g.peers.push(peer),
        }
    }
    // The connections' tasks start first; the list's room stays with the
    // graph, through the compute task.
    let mut starting = std::mem::take(&mut g.starting);
    for (id, t) in starting.drain(..) {
        s.start_task(id, t);
    }
    let made_ahead = g.made_ahead;
    let mut compute = Compute {
        module: p.loaded.module.clone(),
        process: p.loaded.process,
        inputs: g.inputs,
        host: GraphHost {
            outputs: g.outputs,
            msgs: g.msgs,
            pool: p.pool.clone(),
            fields: p.loaded.fields.clone(),
            widths: g.widths,
            globals: p.globals.clone(),
            locals: g.locals.expect("the pool gives graphs local state"),
            global: p.loaded.global.clone(),
            initialising: false,
            peers: g.peers,
            ready: g.ready,
            groups: g.groups,
            order: g.order,
            ending: false,
            client_address: Default::default(),
            grammar: p.loaded.grammar.clone(),
            module: p.loaded.module.clone(),
            units: p.loaded.units.clone(),
            out_units: p.loaded.out_units.clone(),
            merges: g.merges,
            parts: std::collections::VecDeque::new(),
            part_last: None,
            part_slots: Vec::new(),
            part_parser: None,
            taken: 0,
            fold: Default::default(),
            builders: Vec::new(),
            records: p.loaded.records.clone(),
            balance: p.balance.clone(),
            balanced: g.balanced,
            waker: s.waker(),
            timeout: p.config.response_timeout,
            connect_timeout: p.config.connect_timeout,
            timer: None,
            reconnect: hooks.reconnect.clone(),
            own_connection: hooks.own_connection.clone(),
            fresh_connection: hooks.fresh_connection.clone(),
            at_cap: hooks.at_cap.clone(),
            new_inputs: Vec::new(),
            connection_hashes: Vec::new(),
            wake_at: hooks.wake_at.clone(),
            draining: p.draining.clone(),
            drain_noticed: false,
            client_chan: p.client_chan as u16,
            id: compute_id,
            last_route: None,
            broken: false,
            cutting: false,
            sends: 0,
            resending: false,
            given_up: Vec::new(),
            retry: Vec::new(),
            job_failed: false,
            stats: p.stats.clone(),
        },
        vm: g.vm,
        next_input: 0,
        streak: 0,
        started: false,
        reach_by: None,
        client: (p.fan_in == 1 && p.loaded.ruled[p.client_chan]).then_some(0),
        guards_due: false,
        following: None,
        held_piece: None,
        starting,
        source: p.loaded.source.clone(),
        rule_on_request: false,
        rule: 0,
        rule_chan: 0,
    };
    let stats = p.stats.clone();
    stats.graphs_live.fetch_add(1, Ordering::Relaxed);
    p.computes.lock().expect("computes lock").insert(compute_id);
    let parts = p.clone();
    let park_after = p.config.park_after.filter(|_| p.parkable);
    let mut armed = None;
    s.start_task(
        compute_id,
        Box::new(move |sl: &mut flick_runtime::Timeslice| {
            let r = compute.run(sl);
            if r != flick_runtime::TaskStatus::Yield && !parts.exclusive.is_empty() {
                give_back_exclusive(&mut compute, &parts, r == flick_runtime::TaskStatus::Done);
            }
            if let (flick_runtime::TaskStatus::Idle, Some(after)) = (r, park_after) {
                consider_parking(&mut compute, &mut armed, after, sl.began());
            }
            if r == flick_runtime::TaskStatus::Done {
                if compute.host.broken || compute.host.job_failed {
                    // Ended badly after all: its client's connection closes.
                    for o in &compute.host.outputs {
                        if let Some((conn, _)) = &o.conn {
                            conn.unpark();
                        }
                    }
                }
                parts
                    .computes
                    .lock()
                    .expect("computes lock")
                    .remove(&compute_id);
                compute.host.release();
                let mut storage = compute.take_storage();
                storage.made_ahead = made_ahead;
                parts.graphs.give(storage);
                stats.graphs_live.fetch_sub(1, Ordering::Relaxed);
            }
            r
        }),
    );
}

/// Whether an instance has nothing in flight: no rule running or waiting
/// for room, no request unanswered, nothing queued on its inputs, nothing
/// held back, and it is not ending.
fn quiescent(c: &Compute) -> bool {
    let h = &c.host;
    !c.vm.is_running()
        && c.held_piece.is_none()
        && c.following.is_none()
        && !c.guards_due
        && !h.ending
        && !h.broken
        && !h.cutting
        && !h.job_failed
        && !h.resending
        && h.settled()
        && h.parts.is_empty()
        && h.new_inputs.is_empty()
        && h.given_up.is_empty()
        && h.retry.is_empty()
        && h.groups.iter().all(Option::is_none)
        && h.merges.is_empty()
        && !h.draining.load(Ordering::Acquire)
        && c.inputs
            .iter()
            .all(|i| i.follow.is_none() && !i.last_body && i.rx.is_empty())
}

/// Gives an idle instance's exclusive backend connections back to its
/// worker's idle ones as soon as it has nothing in flight, rather than
/// when its client parks or closes: a kept-alive client between requests
/// holds none, so a worker needs about as many as it has requests at the
/// backend (and, at a cap, another client's request waits for one).
/// `ended`: the instance is done, and gives back what it holds (a
/// connection still owed a reply is stacked by the sweep once answered).
fn give_back_exclusive(c: &mut Compute, p: &Parts, ended: bool) {
    if !ended && !quiescent(c) {
        return;
    }
    for out in 0..c.host.outputs.len() {
        let o = &c.host.outputs[out];
        let (chan, index) = (o.chan, o.index);
        // An instance that ended has let go of its outputs' channels
        // already; the connections are still named.
        let holds = o.tx.is_some() || (ended && o.conn.is_some());
        if !o.shared || !holds || !p.exclusive.contains(&(chan, index)) {
            continue;
        }
        let held = o.conn.clone();
        // The instance's ends of the member's channels go with the
        // connection, for the next instance to take over, where they are
        // known: its one open replies input for this backend.
        let tx = c.host.outputs[out].tx.take();
        c.host.give_back_connection(out);
        if ended {
            // Its inputs may be gone already (a broken instance's are):
            // only the connection goes back.
            drop(tx);
            if let (Some((conn, reader)), Some(backend)) = (
                held,
                p.shared.iter().find(|b| b.chan == chan && b.index == index),
            ) {
                backend.give_back(p.scheduler.home_of(c.host.id), reader, &conn, None);
            }
            continue;
        }
        let client = c
            .client
            .and_then(|i| c.inputs.get(i))
            .map(|i| (i.chan, i.index));
        let mut live = c
            .inputs
            .iter()
            .enumerate()
            .filter(|(_, i)| i.chan == chan && i.index == index && !i.rx.is_finished());
        let replies = match (live.next(), live.next()) {
            (Some((k, _)), None) => Some(k),
            _ => None,
        };
        let ends = match (tx, replies) {
            (Some(tx), Some(k)) => Some((tx, c.inputs.remove(k).rx)),
            _ => None,
        };
        if let (Some((conn, reader)), Some(backend)) = (
            held,
            p.shared.iter().find(|b| b.chan == chan && b.index == index),
        ) {
            backend.give_back(p.scheduler.home_of(c.host.id), reader, &conn, ends);
        }
        // What is left of its inputs for the backend (channels closed:
        // the ends were not kept, or of connections given back before)
        // goes: nothing is owed on them, and the next request takes a
        // connection with a channel of its own, so an instance answering
        // many requests keeps one input per backend.
        c.inputs.retain(|i| i.chan != chan || i.index != index);
        c.client =
            client.and_then(|(ch, ix)| c.inputs.iter().position(|i| i.chan == ch && i.index == ix));
        c.next_input = 0;
    }
}

/// A rest word no reader has (its state bits say `CLOSING`): what an
/// armed parking timer remembers once a request came after it was set.
const NOT_RESTING: u32 = u32::MAX;

/// Parks an instance's client connection once the instance has had
/// nothing in flight, and its reader has rested unbroken, for `after`:
/// the reader is told to let go, which ends the instance as a client's
/// close would, and the connection waits in the service with no tasks,
/// channels or buffers (`Conn`'s drop hands it over). `armed`: the rest
/// word seen and when to look again, one timer per instance at a time.
fn consider_parking(
    c: &mut Compute,
    armed: &mut Option<(u32, std::time::Instant)>,
    after: std::time::Duration,
    began: Option<std::time::Instant>,
) {
    if !quiescent(c) {
        // The timer already set stays: one per instance, not one per
        // request (arming it anew after every reply cost a timer-heap push
        // per op, and a run of the task for nothing when it fired). A rest
        // seen before this request is not one to park after.
        if let Some((seen, _)) = armed {
            *seen = NOT_RESTING;
        }
        return;
    }
    let client = c.host.client_chan;
    let Some((conn, reader)) = c
        .host
        .outputs
        .iter()
        .find(|o| o.chan == client)
        .and_then(|o| o.conn.as_ref())
    else {
        return;
    };
    let word = conn.rest_word();
    // The run's own reading where the scheduler made one: parking is
    // timed in seconds, and a fresh reading cost one a request.
    let now = began.unwrap_or_else(std::time::Instant::now);
    if let Some((seen, due)) = *armed {
        if now < due {
            return;
        }
        // Unchanged since it was armed: the reader has not woken since.
        if seen == word && conn.park(word) {
            *armed = None;
            c.host.waker.wake(*reader);
            return;
        }
    }
    let due = now + after;
    *armed = Some((word, due));
    (c.host.wake_at)(c.host.id, due);
}

/// The service as its platform sees it.
struct Tenancy {
    parts: std::sync::Weak<Parts>,
    hooks: Hooks,
}

impl crate::platform::Tenant for Tenancy {
    fn unpark(&self, key: usize) {
        if let Some(p) = self.parts.upgrade() {
            unpark(&p, &self.hooks, key);
        }
    }

    /// Trims the pools (once a second, while the service runs): what a
    /// burst made and nothing used since is freed (down to what a service
    /// makes ahead), and the allocator gives freed memory back to the
    /// system, so that memory follows the load rather than its peak.
    fn every_second(&self) {
        let Some(p) = self.parts.upgrade() else {
            return;
        };
        let mut freed = p.graphs.trim(p.config.graphs_ahead);
        freed += p
            .pool
            .trim(p.config.messages_ahead.min(p.config.message_pool));
        for b in &p.shared {
            freed += b.close_idle(IDLE_BACKEND_KEPT);
        }
        // Connections that closed since the last look freed their storage.
        let open = p.clients.load(Ordering::Relaxed);
        let peak = p.trim_peak.load(Ordering::Relaxed).max(open);
        p.trim_peak.store(peak, Ordering::Relaxed);
        if freed > 0 || peak >= open + 64 {
            p.trim_peak.store(open, Ordering::Relaxed);
            release_free_memory();
        }
    }
}

/// Idle exclusive backend connections kept per backend and worker.
const IDLE_BACKEND_KEPT: usize = 16;

/// `ServiceConfig::backend_idle_timeout` unless set: 4 s, as HAProxy's
/// `timeout http-keep-alive` examples and under the idle timeouts of
/// common servers (nginx 75 s, Apache 5 s, Node.js 5 s).
const BACKEND_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

/// `ServiceConfig::client_request_timeout` unless set: 60 s, as nginx's
/// `client_header_timeout` and `client_body_timeout`.
const CLIENT_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The most messages the pool holds.
const MSG_POOL_MAX: usize = 16_384;

/// Gives the allocator's free pages back to the system: glibc keeps what
/// is freed in its arenas, and the resident size would stay at the peak.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_memory() {
    extern "C" {
        fn malloc_trim(pad: usize) -> std::ffi::c_int;
    }
    // SAFETY: malloc_trim takes no pointers and only releases memory the
    // allocator holds free; it is safe to call from any thread.
    unsafe {
        malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() {}

/// Fixes glibc's thresholds at their starting values (128 KiB). Each
/// block it had mapped and frees otherwise raises them: blocks up to
/// that size (528 KiB after a burst of 1,000 connections) come from the
/// arenas instead of mappings of their own, and a thread's arena keeps
/// up to twice that free at its top, which `malloc_trim` leaves to the
/// arena. Fixed, what a burst frees above 128 KiB goes back as it is
/// freed, and the housekeeping thread's arena keeps none of its trims.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn settle_allocator() {
    extern "C" {
        fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
    }
    const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
    const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
    // SAFETY: mallopt takes no pointers and only sets the allocator's
    // parameters; it is safe to call from any thread.
    unsafe {
        mallopt(M_TRIM_THRESHOLD, 128 << 10);
        mallopt(M_MMAP_THRESHOLD, 128 << 10);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn settle_allocator() {}
