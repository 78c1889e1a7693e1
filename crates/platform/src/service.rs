//! A running program: listeners, the graph of tasks instantiated for each
//! client connection (the paper's application and graph dispatchers), and
//! the scheduler and reactor they run on.

use crate::compute::{Compute, FieldMap, GraphHost, Input, Output};
use crate::conn::{Conn, Reader, Writer};
use crate::msg::MsgPool;
use crate::state::SharedState;
use crate::stats::Stats;
use flick_exec::{Module, Vm};
use flick_runtime::io::Reactor;
use flick_runtime::{channel, Policy, Scheduler, SchedulerConfig, TaskId};
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
    /// Per process channel: the grammar unit of its messages.
    pub units: Arc<Vec<Option<UnitId>>>,
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
        for (name, ty) in &info.channels {
            let carried = match ty {
                flick_check::Ty::Chan(c) | flick_check::Ty::ChanArray(c, _) => c
                    .input
                    .as_ref()
                    .or(c.output.as_ref())
                    .map(|t| t.to_string()),
                _ => None,
            };
            units.push(match carried {
                Some(t) => Some(grammar.unit_id(&t).ok_or_else(|| {
                    LoadError::NoUnit(name.clone(), t.clone(), grammar.name.clone())
                })?),
                None => None,
            });
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
            .map(|c| {
                module.processes[process]
                    .items
                    .iter()
                    .any(|it| it.source == Some(c as u16) && !it.label.starts_with("on "))
            })
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
            fields: Arc::new(fields),
            global: Arc::new(global),
            arrays,
        })
    }

    fn channel(&self, name: &str) -> Option<usize> {
        self.module.processes[self.process]
            .channels
            .iter()
            .position(|c| c == name)
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
    /// The most instances (client connections) alive at once.
    pub max_instances: usize,
    /// Capacity of every task channel, in messages.
    pub channel_capacity: usize,
    /// Entries of each dictionary in process state.
    pub dict_capacity: usize,
    /// How long a backend may take to answer before its requests get fault
    /// replies and it is reconnected.
    pub response_timeout: std::time::Duration,
    /// Connections to each backend address shared by all instances, with
    /// requests pipelined; 0 gives each instance connections of its own.
    pub backend_connections: usize,
}

impl Default for ServiceConfig {
    fn default() -> ServiceConfig {
        ServiceConfig {
            listen: Vec::new(),
            fan_in: Vec::new(),
            connect: Vec::new(),
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            policy: Policy::default(),
            max_instances: 1024,
            channel_capacity: 64,
            dict_capacity: 1024,
            response_timeout: std::time::Duration::from_secs(2),
            backend_connections: 2,
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
    #[error("cannot start the reactor: {0}")]
    Reactor(std::io::Error),
}

struct Parts {
    loaded: Loaded,
    config: ServiceConfig,
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
    arriving: Mutex<Vec<TcpStream>>,
    /// Per connect binding: (channel index, addresses).
    backends: Vec<(usize, Vec<SocketAddr>)>,
    /// Set on shutdown: every instance finishes what it has and closes.
    draining: Arc<std::sync::atomic::AtomicBool>,
    /// Compute tasks of the live instances, to wake them for a drain.
    computes: Mutex<std::collections::HashSet<TaskId>>,
    /// Shared connections per backend address (empty: per instance).
    shared: Vec<crate::backend::Backend>,
}

pub struct Service {
    parts: Arc<Parts>,
    accepting: Arc<Mutex<Option<TcpListener>>>,
    local: SocketAddr,
}

impl Service {
    pub fn start(loaded: Loaded, config: ServiceConfig) -> Result<Service, StartError> {
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
        let scheduler = Arc::new(Scheduler::start(SchedulerConfig {
            workers: config.workers,
            policy: config.policy,
            capacity: config.max_instances
                * (3 + 2 * (1 + backends.iter().map(|b| b.1.len()).sum::<usize>()))
                + 2 * config.backend_connections
                    * backends.iter().map(|b| b.1.len()).sum::<usize>(),
            pin: true,
        }));
        let reactor = Arc::new(Reactor::start(scheduler.waker()).map_err(StartError::Reactor)?);
        let slots = loaded
            .grammar
            .units()
            .iter()
            .map(|u| u.slots as usize)
            .max()
            .unwrap_or(1);
        // Room for every message that can be in flight, so that steady traffic
        // never frees messages the next burst would allocate again.
        let pool = MsgPool::new(
            config.max_instances * config.channel_capacity * 2,
            slots,
            256,
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
                    ));
                }
            }
        }
        let mut listener = TcpListener::bind(laddr).map_err(|e| StartError::Listen(laddr, e))?;
        let local = listener
            .local_addr()
            .map_err(|e| StartError::Listen(laddr, e))?;
        let stats = Arc::new(Stats::for_channels(
            &loaded.module.processes[loaded.process].channels,
        ));
        let parts = Arc::new(Parts {
            loaded,
            config,
            scheduler,
            reactor: reactor.clone(),
            pool,
            globals,
            stats,
            client_chan,
            fan_in,
            arriving: Mutex::new(Vec::new()),
            backends,
            draining: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            computes: Mutex::new(std::collections::HashSet::new()),
            shared,
        });
        // The reactor owns the registration; the callback accepts from
        // the listener while the service still accepts.
        let accepting = Arc::new(Mutex::new(None::<TcpListener>));
        let (p, a) = (parts.clone(), accepting.clone());
        reactor
            .register_listener(
                &mut listener,
                Box::new(move || {
                    let guard = a.lock().expect("listener lock");
                    let Some(l) = guard.as_ref() else { return };
                    // Accept until the backlog is empty: readiness is
                    // edge-triggered, so stopping early would strand
                    // connections until the next one arrives.
                    loop {
                        match l.accept() {
                            Ok((stream, _)) => {
                                p.stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
                                arrive(&p, stream);
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
                            // Out of descriptors or memory: try again on the
                            // next readiness event rather than spin.
                            Err(_) => break,
                        }
                    }
                }),
            )
            .map_err(|e| StartError::Listen(laddr, e))?;
        *accepting.lock().expect("listener lock") = Some(listener);
        Ok(Service {
            parts,
            accepting,
            local,
        })
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

    /// Tasks alive in the scheduler.
    pub fn live_tasks(&self) -> usize {
        self.parts.scheduler.live()
    }

    /// Tasks waiting in each worker's run queue now.
    pub fn queue_lengths(&self) -> Vec<usize> {
        self.parts.scheduler.queue_lengths()
    }

    /// Stops accepting; instances already running finish on their own.
    pub fn stop_accepting(&self) {
        *self.accepting.lock().expect("listener lock") = None;
    }

    /// Stops accepting, and has every instance stop reading its client,
    /// answer what it has read, and close: a clean shutdown.
    pub fn drain(&self) {
        self.stop_accepting();
        self.parts.draining.store(true, Ordering::Release);
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
    tasks: Vec<(TaskId, Box<dyn flick_runtime::Task>)>,
}

/// Sets up the reader and writer tasks of a connection of channel
/// `chan[index]`, feeding (and fed by) compute task `compute`.
fn connection(
    p: &Arc<Parts>,
    compute: TaskId,
    chan: usize,
    index: Option<u32>,
    stream: TcpStream,
) -> Option<Connection> {
    let (conn, rid, wid) = attach(p, stream, chan)?;
    let s = &p.scheduler;
    let unit = p.loaded.units[chan].expect("checked: channels carry grammar units");
    let cap = p.config.channel_capacity;
    let (in_tx, in_rx) = channel(cap, s.waker());
    in_tx.bind(rid);
    in_rx.bind(compute);
    let (out_tx, out_rx) = channel(cap, s.waker());
    out_tx.bind(compute);
    out_rx.bind(wid);
    let max = (p.loaded.grammar.max_bytes(unit) as usize).clamp(4096, 16 << 20);
    let mut reader = Reader {
        conn: conn.clone(),
        read: crate::conn::ReadSide::new(p.loaded.grammar.parser(unit), 4096, max),
        out: Some(in_tx),
        pool: p.pool.clone(),
        pending: None,
        stats: p.stats.clone(),
        draining: (chan == p.client_chan).then(|| p.draining.clone()),
    };
    let mut writer = Writer {
        conn: conn.clone(),
        rx: out_rx,
        current: None,
        written: 0,
        pool: p.pool.clone(),
        stats: p.stats.clone(),
    };
    Some(Connection {
        input: Input {
            rx: in_rx,
            chan: chan as u16,
            index,
            open: true,
        },
        output: Output {
            tx: Some(out_tx),
            chan: chan as u16,
            index,
            conn: Some((conn, rid)),
            crc: None,
        },
        tasks: vec![
            (
                rid,
                Box::new(move |sl: &mut flick_runtime::Timeslice| reader.run(sl)),
            ),
            (
                wid,
                Box::new(move |sl: &mut flick_runtime::Timeslice| writer.run(sl)),
            ),
        ],
    })
}

/// Takes task ids for a socket's reader and writer and registers the
/// socket with the reactor for them; `None` when the scheduler is out of
/// task slots.
fn attach(
    p: &Arc<Parts>,
    mut stream: TcpStream,
    chan: usize,
) -> Option<(Arc<Conn>, TaskId, TaskId)> {
    let s = &p.scheduler;
    let (rid, wid) = match (s.reserve(), s.reserve()) {
        (Ok(r), Ok(w)) => (r, w),
        (r, w) => {
            // Out of task slots: give back what was taken.
            for id in [r, w].into_iter().flatten() {
                s.start_task(
                    id,
                    Box::new(|_: &mut flick_runtime::Timeslice| flick_runtime::TaskStatus::Done),
                );
            }
            return None;
        }
    };
    let token = p
        .reactor
        .register_stream(&mut stream, Some(rid), Some(wid))
        .ok();
    p.stats.connections_open.fetch_add(1, Ordering::Relaxed);
    let conn = Arc::new(Conn {
        stream,
        token,
        reactor: p.reactor.clone(),
        stats: p.stats.clone(),
        chan,
    });
    Some((conn, rid, wid))
}

/// Opens a shared connection to a backend and starts its reader and writer.
fn open_shared(
    p: &Arc<Parts>,
    chan: u16,
    index: Option<u32>,
    addr: SocketAddr,
) -> Option<Arc<crate::backend::SharedConn>> {
    let (conn, rid, wid) = attach(p, dial(p, addr)?, chan as usize)?;
    let s = &p.scheduler;
    let unit = p.loaded.units[chan as usize].expect("checked: channels carry grammar units");
    let shared = crate::backend::shared_conn(conn, rid, wid, chan, index);
    let max = (p.loaded.grammar.max_bytes(unit) as usize).clamp(4096, 16 << 20);
    let mut reader = crate::backend::SharedReader {
        shared: shared.clone(),
        read: crate::conn::ReadSide::new(p.loaded.grammar.parser(unit), 16384, max),
        pending: None,
        pool: p.pool.clone(),
        grammar: p.loaded.grammar.clone(),
        unit,
        stats: p.stats.clone(),
    };
    let mut writer = crate::backend::SharedWriter {
        shared: shared.clone(),
        current: None,
        written: 0,
        next: 0,
        pool: p.pool.clone(),
        grammar: p.loaded.grammar.clone(),
        unit,
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

/// Joins instance `compute` to a shared connection of backend `chan[index]`.
fn join_shared(
    p: &Arc<Parts>,
    compute: TaskId,
    chan: u16,
    index: Option<u32>,
) -> Option<(Input, Output)> {
    let backend = p
        .shared
        .iter()
        .find(|b| b.chan == chan && b.index == index)?;
    let addr = backend.addr;
    let conn = backend.pick(|c, i| open_shared(p, c, i, addr))?;
    conn.join(compute, p.config.channel_capacity, &p.scheduler.waker())
}

/// Connects to a backend address, counting failures.
fn dial(p: &Parts, addr: SocketAddr) -> Option<TcpStream> {
    match TcpStream::connect(addr) {
        Ok(stream) => {
            let _ = stream.set_nodelay(true);
            Some(stream)
        }
        Err(_) => {
            p.stats
                .backend_connect_errors
                .fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// A connection accepted: an instance of its own, or one of the
/// connections that make up an instance of a listening channel array.
fn arrive(p: &Arc<Parts>, client: TcpStream) {
    let _ = client.set_nodelay(true);
    if p.fan_in == 1 {
        return instantiate(p, vec![client]);
    }
    let complete = {
        let mut arriving = p.arriving.lock().expect("arriving lock");
        arriving.push(client);
        (arriving.len() == p.fan_in).then(|| std::mem::take(&mut *arriving))
    };
    if let Some(clients) = complete {
        instantiate(p, clients);
    }
}

/// A new instance of the process for its client connections (one, or
/// the fan-in of a listening channel array, in order of arrival).
fn instantiate(p: &Arc<Parts>, clients: Vec<TcpStream>) {
    let s = &p.scheduler;
    let code = &p.loaded.module.processes[p.loaded.process];
    let nchan = code.channels.len();
    let Ok(compute_id) = s.reserve() else { return };
    let mut inputs = Vec::new();
    let mut merges = Vec::new();
    let mut outputs = Vec::new();
    let mut tasks: Vec<(TaskId, Box<dyn flick_runtime::Task>)> = Vec::new();
    let mut widths = vec![1u32; nchan];
    let client_array = p.loaded.arrays[p.client_chan];
    widths[p.client_chan] = clients.len() as u32;
    let mut incomplete = false;
    for (i, client) in clients.into_iter().enumerate() {
        let index = client_array.then_some(i as u32);
        match connection(p, compute_id, p.client_chan, index, client) {
            Some(c) => {
                if p.loaded.ruled[p.client_chan] {
                    inputs.push(c.input);
                } else {
                    merges.push(crate::merge::MergeInput::new(
                        c.input.rx,
                        p.client_chan as u16,
                    ));
                }
                outputs.push(c.output);
                tasks.extend(c.tasks);
            }
            None => incomplete = true,
        }
    }
    if incomplete {
        // Out of task slots: the instance cannot start.
        for (id, _) in tasks.drain(..) {
            s.start_task(
                id,
                Box::new(|_: &mut flick_runtime::Timeslice| flick_runtime::TaskStatus::Done),
            );
        }
        drop((inputs, merges, outputs));
        s.start_task(
            compute_id,
            Box::new(|_: &mut flick_runtime::Timeslice| flick_runtime::TaskStatus::Done),
        );
        return;
    }
    let mut addrs_of = Vec::new();
    for (chan, addrs) in &p.backends {
        widths[*chan] = addrs.len() as u32;
        let array = p.loaded.arrays[*chan];
        let readable = p.loaded.readable[*chan];
        for (i, a) in addrs.iter().enumerate() {
            let index = array.then_some(i as u32);
            addrs_of.push(((*chan as u16, index), *a));
            if !readable {
                // A peer that is only written to (a reducer) gets a
                // connection of this instance's own: its stream is ours.
                match dial(p, *a).and_then(|st| connection(p, compute_id, *chan, index, st)) {
                    Some(c) => {
                        outputs.push(c.output);
                        tasks.extend(c.tasks);
                    }
                    None => outputs.push(Output {
                        tx: None,
                        chan: *chan as u16,
                        index,
                        conn: None,
                        crc: None,
                    }),
                }
                continue;
            }
            if !p.shared.is_empty() {
                match join_shared(p, compute_id, *chan as u16, index) {
                    Some((input, output)) => {
                        inputs.push(input);
                        outputs.push(output);
                    }
                    None => outputs.push(Output {
                        tx: None,
                        chan: *chan as u16,
                        index,
                        conn: None,
                        crc: None,
                    }),
                }
                continue;
            }
            match dial(p, *a).and_then(|stream| connection(p, compute_id, *chan, index, stream)) {
                Some(c) => {
                    inputs.push(c.input);
                    outputs.push(c.output);
                    tasks.extend(c.tasks);
                }
                // An unreachable backend: its requests get fault replies
                // until a reconnection succeeds.
                None => outputs.push(Output {
                    tx: None,
                    chan: *chan as u16,
                    index,
                    conn: None,
                    crc: None,
                }),
            }
        }
    }
    for o in &mut outputs {
        let unit = p.loaded.units[o.chan as usize];
        let writes = p.loaded.writable[o.chan as usize];
        if writes && unit.is_some_and(|u| p.loaded.grammar.has_end(u)) {
            o.crc = Some(flick_wire::StreamCrc::default());
        }
    }
    let now = std::time::Instant::now();
    let answers: Vec<bool> = (0..nchan)
        .map(|c| c != p.client_chan && p.loaded.readable[c])
        .collect();
    let peers = outputs
        .iter()
        .map(|o| crate::compute::Peer {
            answers: answers[o.chan as usize],
            dead: o.tx.is_none(),
            retry_at: o.tx.is_none().then_some(now + crate::peers::FIRST_BACKOFF),
            backoff: crate::peers::FIRST_BACKOFF,
            outstanding: std::collections::VecDeque::new(),
        })
        .collect();
    let reconnect: crate::compute::Reconnect = {
        let p = p.clone();
        Arc::new(move |chan: u16, index: Option<u32>| {
            if !p.shared.is_empty() {
                return join_shared(&p, compute_id, chan, index);
            }
            let addr = addrs_of
                .iter()
                .find(|(k, _)| *k == (chan, index))
                .map(|(_, a)| *a)?;
            let c = connection(&p, compute_id, chan as usize, index, dial(&p, addr)?)?;
            for (id, t) in c.tasks {
                p.scheduler.start_task(id, t);
            }
            Some((c.input, c.output))
        })
    };
    let wake_at: crate::compute::WakeAt = {
        let reactor = p.reactor.clone();
        Arc::new(move |at| reactor.wake_at(compute_id, at))
    };
    let nstate = code.state.len();
    let mut compute = Compute {
        module: p.loaded.module.clone(),
        process: p.loaded.process,
        inputs,
        host: GraphHost {
            outputs,
            msgs: Vec::with_capacity(8),
            pool: p.pool.clone(),
            fields: p.loaded.fields.clone(),
            widths,
            globals: p.globals.clone(),
            locals: Arc::new(SharedState::new(nstate, p.config.dict_capacity)),
            global: p.loaded.global.clone(),
            initialising: false,
            peers,
            ready: std::collections::VecDeque::new(),
            groups: Vec::new(),
            order: crate::peers::Order::default(),
            ending: false,
            grammar: p.loaded.grammar.clone(),
            units: p.loaded.units.clone(),
            merges,
            taken: 0,
            builders: Vec::new(),
            records: p.loaded.records.clone(),
            waker: s.waker(),
            timeout: p.config.response_timeout,
            timer: None,
            reconnect,
            wake_at,
            draining: p.draining.clone(),
            drain_noticed: false,
            client_chan: p.client_chan as u16,
        },
        vm: Vm::default(),
        next_input: 0,
        started: false,
        client: (p.fan_in == 1 && p.loaded.ruled[p.client_chan]).then_some(0),
        guards_due: false,
    };
    let stats = p.stats.clone();
    stats.graphs_live.fetch_add(1, Ordering::Relaxed);
    p.computes.lock().expect("computes lock").insert(compute_id);
    let parts = p.clone();
    tasks.push((
        compute_id,
        Box::new(move |sl: &mut flick_runtime::Timeslice| {
            let r = compute.run(sl);
            if r == flick_runtime::TaskStatus::Done {
                parts
                    .computes
                    .lock()
                    .expect("computes lock")
                    .remove(&compute_id);
                stats.graphs_live.fetch_sub(1, Ordering::Relaxed);
            }
            r
        }),
    ));
    for (id, t) in tasks {
        s.start_task(id, t);
    }
}
