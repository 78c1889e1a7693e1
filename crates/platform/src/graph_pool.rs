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
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Made when the service started: the first instances grow it, so
    /// what it holds lies with theirs, early in the workers' memory.
    pub made_ahead: bool,
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
/// likely still in cache. What goes unused after a burst is trimmed
/// ([`GraphPool::trim`]).
pub struct GraphPool {
    storage: Mutex<Vec<GraphStorage>>,
    reads: Mutex<Vec<ReadSide>>,
    /// The fewest graphs (read sides) pooled since the last trim: that
    /// many went unused all along.
    storage_low: AtomicUsize,
    reads_low: AtomicUsize,
    keep: usize,
    links_per_graph: usize,
    replies_per_graph: usize,
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
            storage_low: AtomicUsize::new(usize::MAX),
            reads_low: AtomicUsize::new(usize::MAX),
            keep,
            links_per_graph: config.links_per_graph,
            replies_per_graph: config.replies_per_graph,
            links,
            replies,
            nstate: config.nstate,
            dict_capacity: config.dict_capacity,
        };
        for _ in 0..config.prefill.min(keep) {
            let mut s = GraphStorage {
                locals: Some(Arc::new(pool.new_locals())),
                made_ahead: true,
                ..GraphStorage::default()
            };
            s.msgs.reserve(8);
            pool.give(s);
            let mut r = read();
            r.made_ahead = true;
            pool.give_read_side(r);
        }
        pool
    }

    fn new_locals(&self) -> SharedState {
        SharedState::new(self.nstate, self.dict_capacity)
    }

    /// A graph's storage: a pooled one, or a new one if all are in use.
    pub fn take(&self) -> GraphStorage {
        let mut s = {
            let mut storage = self.storage.lock().expect("pool lock");
            let s = storage.pop();
            self.storage_low.fetch_min(storage.len(), Ordering::Relaxed);
            s.unwrap_or_default()
        };
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
        let pooled = {
            let mut reads = self.reads.lock().expect("pool lock");
            let r = reads.pop();
            self.reads_low.fetch_min(reads.len(), Ordering::Relaxed);
            r
        };
        pooled.unwrap_or_else(make)
    }

    pub fn give_read_side(&self, mut r: ReadSide) {
        r.reset();
        let mut reads = self.reads.lock().expect("pool lock");
        if reads.len() < self.keep {
            reads.push(r);
        }
    }

    /// Frees the graphs, read sides and channels that went unused since
    /// the last trim, keeping at least `keep` graphs' worth; how many
    /// things were freed.
    pub fn trim(&self, keep: usize) -> usize {
        /// Frees what went unused in `stack` beyond `keep`: first what a
        /// burst made (`made_ahead` false), then the oldest.
        fn trim_stack<T>(
            stack: &Mutex<Vec<T>>,
            low: &AtomicUsize,
            keep: usize,
            made_ahead: impl Fn(&T) -> bool,
        ) -> usize {
            let freed: Vec<T> = {
                let mut stack = stack.lock().expect("pool lock");
                let unused = low.load(Ordering::Relaxed).min(stack.len());
                let n = unused.min(stack.len().saturating_sub(keep));
                if n > 0 {
                    // What was made at start lies together in memory made
                    // at start; what a burst made lies among its freed
                    // storage, where one kept holds pages the allocator
                    // could otherwise give back. The kept ones go on top,
                    // taken first.
                    stack.sort_by_key(|t| made_ahead(t));
                }
                // The oldest go: the most recently used stay warm on top.
                let freed = stack.drain(..n).collect();
                if stack.len() < stack.capacity() / 4 {
                    let room = stack.len().max(keep);
                    stack.shrink_to(room);
                }
                low.store(stack.len(), Ordering::Relaxed);
                freed
            };
            // Dropped outside the lock.
            freed.len()
        }
        let mut freed = trim_stack(&self.storage, &self.storage_low, keep, |s| s.made_ahead);
        freed += trim_stack(&self.reads, &self.reads_low, keep, |r| r.made_ahead);
        // Channels for the graphs kept; an instance that ended returned
        // its channels here.
        let graphs = self.available().max(keep);
        freed += self.links.trim(graphs * self.links_per_graph.max(1));
        freed += self.replies.trim(graphs * self.replies_per_graph.max(1));
        freed
    }

    /// Graphs ready in the pool.
    pub fn available(&self) -> usize {
        self.storage.lock().expect("pool lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flick_runtime::{Policy, Scheduler, SchedulerConfig};

    #[test]
    fn trimming_frees_the_graphs_a_burst_made_and_keeps_those_made_ahead() {
        let s = Scheduler::start(SchedulerConfig {
            workers: 1,
            policy: Policy::default(),
            capacity: 64,
            pin: false,
        });
        let config = GraphPoolConfig {
            prefill: 0,
            keep: 16,
            links_per_graph: 0,
            replies_per_graph: 0,
            link_capacity: 1,
            reply_capacity: 1,
            nstate: 0,
            dict_capacity: 0,
        };
        let pool = GraphPool::new(config, s.waker(), || unreachable!("no read sides made"));
        // What a burst leaves: two made ahead, returned among five it made.
        for made_ahead in [false, true, false, false, true, false, false] {
            pool.give(GraphStorage {
                made_ahead,
                ..GraphStorage::default()
            });
        }
        assert_eq!(pool.trim(2), 5);
        assert_eq!(pool.available(), 2);
        assert!(pool.take().made_ahead && pool.take().made_ahead);
    }
}
