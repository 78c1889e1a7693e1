//! The graph pool (section 5's graph dispatcher): the parts of an
//! instance's task graph (its compute task's state and interpreter, its
//! client connection's read buffer and parser, the channels between its
//! tasks) made when the service starts and reused when an instance ends,
//! so that a new connection takes a graph instead of building one.

use crate::compute::{Input, Output, Peer};
use crate::conn::ReadSide;
use crate::merge::MergeInput;
use crate::msg::Msg;
use crate::peers::{Group, Order, Reply};
use crate::state::SharedState;
use flick_exec::Vm;
use flick_runtime::{ChannelPool, Task, TaskId, Waker};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// What one instance's compute task keeps between messages, reused from
/// one instance to the next.
#[derive(Default)]
pub struct GraphStorage {
    pub inputs: Vec<Input>,
    pub outputs: Vec<Output>,
    pub peers: Vec<Peer>,
    pub msgs: Vec<Option<Msg>>,
    pub ready: VecDeque<Reply>,
    pub groups: Vec<Option<Group>>,
    pub order: Order,
    pub merges: Vec<MergeInput>,
    pub widths: Vec<u32>,
    /// The elements the instance counts towards for `least_connections`
    /// (a bitset, see `balance.rs`).
    pub balanced: Vec<u64>,
    pub vm: Vm,
    /// `local` state; `None` in a storage that was never used.
    pub locals: Option<Arc<SharedState>>,
    /// The graph's tasks between being made and being started.
    pub starting: Vec<(TaskId, Box<dyn Task>)>,
}

impl GraphStorage {
    /// Empties everything, keeping the allocations: channel ends go back to
    /// their pools as they drop.
    fn clear(&mut self) {
        self.inputs.clear();
        self.outputs.clear();
        for p in &mut self.peers {
            p.outstanding.clear();
        }
        self.msgs.clear();
        self.ready.clear();
        self.groups.clear();
        self.order.reset();
        self.merges.clear();
        self.widths.clear();
        self.starting.clear();
        if let Some(l) = &mut self.locals {
            match Arc::get_mut(l) {
                Some(l) => l.reset(),
                None => self.locals = None,
            }
        }
    }
}

/// Graphs ready for new instances. The most recently returned graph is
/// taken first: its storage has grown to what instances need and is
/// likely still in cache.
pub struct GraphPool {
    storage: Mutex<Vec<GraphStorage>>,
    reads: Mutex<Vec<ReadSide>>,
    keep: usize,
    /// Channels between a connection's tasks and the compute task, and an
    /// instance's request channels to shared backend connections.
    pub links: Arc<ChannelPool<Msg>>,
    /// Reply channels from shared backend connections.
    pub replies: Arc<ChannelPool<Msg>>,
    nstate: usize,
    dict_capacity: usize,
}

/// How many graphs a pool makes and keeps, and what they are made of.
pub struct GraphPoolConfig {
    /// Graphs made when the service starts.
    pub prefill: usize,
    /// Graphs kept for reuse (at most the instances alive at once).
    pub keep: usize,
    /// Channels per graph of each kind made ahead.
    pub links_per_graph: usize,
    pub replies_per_graph: usize,
    pub link_capacity: usize,
    pub reply_capacity: usize,
    /// `local` state variables and dictionary capacity.
    pub nstate: usize,
    pub dict_capacity: usize,
}

impl GraphPool {
    /// A pool of `config.prefill` graphs made now; `read` makes a client
    /// connection's read side.
    pub fn new(config: GraphPoolConfig, waker: Waker, read: impl Fn() -> ReadSide) -> GraphPool {
        let keep = config.keep.max(1);
        let links = ChannelPool::new(
            config.link_capacity,
            config.prefill * config.links_per_graph,
            keep * config.links_per_graph.max(1),
            waker.clone(),
        );
        let replies = ChannelPool::new(
            config.reply_capacity,
            config.prefill * config.replies_per_graph,
            keep * config.replies_per_graph.max(1),
            waker,
        );
        let pool = GraphPool {
            storage: Mutex::new(Vec::with_capacity(keep)),
            reads: Mutex::new(Vec::with_capacity(keep)),
            keep,
            links,
            replies,
            nstate: config.nstate,
            dict_capacity: config.dict_capacity,
        };
        for _ in 0..config.prefill.min(keep) {
            let mut s = GraphStorage {
                locals: Some(Arc::new(pool.new_locals())),
                ..GraphStorage::default()
            };
            s.msgs.reserve(8);
            pool.give(s);
            pool.give_read_side(read());
        }
        pool
    }

    fn new_locals(&self) -> SharedState {
        SharedState::new(self.nstate, self.dict_capacity)
    }

    /// A graph's storage: a pooled one, or a new one if all are in use.
    pub fn take(&self) -> GraphStorage {
        let mut s = self
            .storage
            .lock()
            .expect("pool lock")
            .pop()
            .unwrap_or_default();
        if s.locals.is_none() {
            s.locals = Some(Arc::new(self.new_locals()));
        }
        s
    }

    /// Takes back an ended instance's storage.
    pub fn give(&self, mut s: GraphStorage) {
        s.clear();
        let mut storage = self.storage.lock().expect("pool lock");
        if storage.len() < self.keep {
            storage.push(s);
        }
    }

    /// A client connection's read side: a pooled one, or `make()`.
    pub fn read_side(&self, make: impl FnOnce() -> ReadSide) -> ReadSide {
        let pooled = self.reads.lock().expect("pool lock").pop();
        pooled.unwrap_or_else(make)
    }

    pub fn give_read_side(&self, mut r: ReadSide) {
        r.reset();
        let mut reads = self.reads.lock().expect("pool lock");
        if reads.len() < self.keep {
            reads.push(r);
        }
    }

    /// Graphs ready in the pool.
    pub fn available(&self) -> usize {
        self.storage.lock().expect("pool lock").len()
    }
}
