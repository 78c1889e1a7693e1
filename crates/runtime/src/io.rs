//! Readiness I/O: every worker owns an epoll instance (through mio) and
//! polls it itself, between tasks and when it has nothing to run, so a
//! socket's readiness wakes its task on the worker that runs it without
//! another thread in between. Tasks read and write their non-blocking
//! sockets themselves, until `WouldBlock`.
//!
//! A stream is registered with the epoll of the worker its tasks run from
//! (their home queue), and its token carries the reader's and writer's task
//! ids, so an event wakes them without a lookup. A worker about to block in
//! `epoll_wait` says so; a task queued for it meanwhile writes its eventfd.
//!
//! This is the one place the platform meets the operating system's event
//! interface: an io_uring reactor would replace this module and keep the
//! same contract (a task is woken when its socket may make progress).

use crate::scheduler::Waker;
use crate::task::TaskId;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The token of a worker's eventfd.
const WAKE: Token = Token(usize::MAX);
/// Tokens with this bit name a listener by its index.
const LISTENER: usize = 1 << 63;
/// Tokens with this bit name a parked stream (a connection with no tasks,
/// waiting for its next bytes) by its key.
const PARKED: usize = 1 << 62;
/// The longest a worker blocks in `epoll_wait`: timers fire within it.
pub const TICK: Duration = Duration::from_millis(10);

/// A stream's token: its reader's and writer's task ids, each plus one (0
/// for none).
fn stream_token(reader: Option<TaskId>, writer: Option<TaskId>) -> Token {
    let id = |t: Option<TaskId>| t.map_or(0, |t| t.0 as usize + 1);
    Token(id(reader) | (id(writer) << 32))
}

fn stream_tasks(t: Token) -> (Option<u32>, Option<u32>) {
    let id = |v: usize| (v != 0).then(|| (v - 1) as u32);
    (id(t.0 & 0xFFFF_FFFF), id((t.0 >> 32) & 0x7FFF_FFFF))
}

type OnReady = Box<dyn FnMut() + Send>;
/// Called with a parked stream's key when it becomes readable (or closes).
pub type OnParked = Box<dyn Fn(usize) + Send + Sync>;

/// The workers' epoll instances as the rest of the scheduler sees them.
pub(crate) struct IoShared {
    registries: Vec<Registry>,
    wakers: Vec<mio::Waker>,
    /// Worker `i` is blocked (or about to block) in `epoll_wait`.
    sleeping: Vec<AtomicBool>,
    listeners: Mutex<Vec<Option<OnReady>>>,
    /// What a parked stream's readiness calls; set once, by its service.
    on_parked: std::sync::OnceLock<OnParked>,
    /// Tasks to wake at a time, earliest first.
    timers: Mutex<BinaryHeap<Reverse<(Instant, u32)>>>,
    registrations: AtomicUsize,
    /// Writes to the workers' eventfds: each is a system call, and a
    /// worker's own wakes must not cost one.
    interrupts: AtomicUsize,
    /// Per reader task: its stream's peer has closed (or failed). A read
    /// that came up short need not be followed by one that says
    /// `WouldBlock`, unless the end of the stream may be waiting.
    hangups: Box<[AtomicBool]>,
    /// Per writer task: its stream's next writable readiness wakes it.
    /// Set when the stream is registered (its connecting finishes with
    /// one) and by [`Reactor::want_writable`] when a write found the
    /// socket full; taken by the readiness. A stream that is simply
    /// writable when its reader's bytes arrive (every request) does not
    /// run its writer for nothing.
    writable_wanted: Box<[AtomicBool]>,
}

impl IoShared {
    /// An epoll instance per worker: the shared side, and the `Poll` each
    /// worker thread takes.
    pub(crate) fn new(workers: usize, tasks: usize) -> io::Result<(IoShared, Vec<Poll>)> {
        let mut polls = Vec::with_capacity(workers);
        let mut registries = Vec::with_capacity(workers);
        let mut wakers = Vec::with_capacity(workers);
        for _ in 0..workers {
            let poll = Poll::new()?;
            registries.push(poll.registry().try_clone()?);
            wakers.push(mio::Waker::new(poll.registry(), WAKE)?);
            polls.push(poll);
        }
        Ok((
            IoShared {
                registries,
                wakers,
                sleeping: (0..workers).map(|_| AtomicBool::new(false)).collect(),
                interrupts: AtomicUsize::new(0),
                listeners: Mutex::new(Vec::new()),
                on_parked: std::sync::OnceLock::new(),
                timers: Mutex::new(BinaryHeap::new()),
                registrations: AtomicUsize::new(0),
                hangups: (0..tasks).map(|_| AtomicBool::new(false)).collect(),
                writable_wanted: (0..tasks).map(|_| AtomicBool::new(false)).collect(),
            },
            polls,
        ))
    }

    /// Marks worker `me` as about to block; the caller looks at its queue
    /// once more after this, so a task queued in between is not missed.
    pub(crate) fn going_to_sleep(&self, me: usize) {
        self.sleeping[me].store(true, Ordering::SeqCst);
    }

    pub(crate) fn awake(&self, me: usize) {
        self.sleeping[me].store(false, Ordering::SeqCst);
    }

    /// Whether worker `w` may be blocked in `epoll_wait`.
    pub(crate) fn is_sleeping(&self, w: usize) -> bool {
        self.sleeping[w].load(Ordering::SeqCst)
    }

    /// Interrupts worker `w`'s `epoll_wait`.
    pub(crate) fn interrupt(&self, w: usize) {
        self.interrupts.fetch_add(1, Ordering::Relaxed);
        let _ = self.wakers[w].wake();
    }

    pub(crate) fn interrupt_all(&self) {
        for w in &self.wakers {
            let _ = w.wake();
        }
    }

    /// Wakes the tasks whose timers are due; how long until the next one
    /// (at most [`TICK`]). Another worker checking at the same moment
    /// leaves it to that one.
    pub(crate) fn fire_timers(&self, waker: &Waker) -> Duration {
        let Ok(mut timers) = self.timers.try_lock() else {
            return TICK;
        };
        let now = Instant::now();
        while let Some(Reverse((at, task))) = timers.peek().copied() {
            if at > now {
                return (at - now).min(TICK);
            }
            timers.pop();
            waker.wake(TaskId(task));
        }
        TICK
    }

    /// Polls a worker's epoll for up to `timeout`, waking the tasks of
    /// the streams that became ready and running listeners' callbacks;
    /// the number of events. `sleeper` is the worker, where it said it was
    /// going to sleep ([`Io::going_to_sleep`]): it is awake again as soon
    /// as `epoll_wait` returns, before the wakes of its events. Marked
    /// sleeping while it queues them, each of those wakes would write the
    /// worker's own eventfd (a system call), and its next poll would
    /// return at once for it.
    pub(crate) fn poll(
        &self,
        waker: &Waker,
        poll: &mut Poll,
        events: &mut Events,
        timeout: Duration,
        sleeper: Option<usize>,
    ) -> usize {
        let polled = poll.poll(events, Some(timeout));
        if let Some(me) = sleeper {
            self.awake(me);
        }
        if let Err(e) = polled {
            if e.kind() != io::ErrorKind::Interrupted {
                std::thread::sleep(timeout);
            }
            return 0;
        }
        let mut n = 0;
        for ev in events.iter() {
            n += 1;
            let t = ev.token();
            if t == WAKE {
                continue;
            }
            if t.0 & LISTENER != 0 {
                self.accept(t.0 & !LISTENER);
                continue;
            }
            if t.0 & PARKED != 0 {
                if let Some(f) = self.on_parked.get() {
                    f(t.0 & !PARKED);
                }
                continue;
            }
            let (reader, writer) = stream_tasks(t);
            let closed = ev.is_error() || ev.is_read_closed() || ev.is_write_closed();
            if ev.is_readable() || closed {
                if let Some(r) = reader {
                    if ev.is_read_closed() || ev.is_error() {
                        if let Some(h) = self.hangups.get(r as usize) {
                            h.store(true, Ordering::Release);
                        }
                    }
                    waker.wake(TaskId(r));
                }
            }
            if ev.is_writable() || closed {
                if let Some(w) = writer {
                    let wanted = self
                        .writable_wanted
                        .get(w as usize)
                        .is_none_or(|f| f.swap(false, Ordering::AcqRel));
                    if wanted || closed {
                        waker.wake(TaskId(w));
                    }
                }
            }
        }
        n
    }

    /// Runs listener `i`'s callback, outside the table's lock: it registers
    /// the streams it accepts.
    fn accept(&self, i: usize) {
        let Some(mut on_ready) = self
            .listeners
            .lock()
            .expect("listeners lock")
            .get_mut(i)
            .and_then(Option::take)
        else {
            return;
        };
        on_ready();
        if let Some(slot) = self.listeners.lock().expect("listeners lock").get_mut(i) {
            *slot = Some(on_ready);
        }
    }
}

/// A registration's key, to drop it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IoToken {
    worker: usize,
    listener: Option<usize>,
    reader: Option<TaskId>,
    writer: Option<TaskId>,
}

/// The handle through which connections are registered with the workers'
/// epoll instances, and timers set.
pub struct Reactor {
    waker: Waker,
}

impl Reactor {
    pub fn start(waker: Waker) -> io::Result<Reactor> {
        Ok(Reactor { waker })
    }

    fn io(&self) -> &IoShared {
        self.waker.io()
    }

    /// Wakes `reader` when the stream is readable (or closed) and `writer`
    /// when it is writable. The stream goes to the epoll of the worker
    /// whose queue the reader (else the writer) runs from.
    pub fn register_stream(
        &self,
        stream: &mut TcpStream,
        reader: Option<TaskId>,
        writer: Option<TaskId>,
    ) -> io::Result<IoToken> {
        let worker = reader.or(writer).map_or(0, |t| self.waker.home_of(t));
        // Before the stream is registered: its first readiness may be
        // handled at once, on its worker.
        if let Some(f) = writer.and_then(|w| self.io().writable_wanted.get(w.0 as usize)) {
            f.store(true, Ordering::SeqCst);
        }
        self.io().registries[worker].register(
            stream,
            stream_token(reader, writer),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        self.io().registrations.fetch_add(1, Ordering::Relaxed);
        if let Some(w) = writer {
            self.waker.mark_writer(w);
        }
        Ok(IoToken {
            worker,
            listener: None,
            reader,
            writer,
        })
    }

    /// Calls `on_ready` (which should accept until `WouldBlock`) whenever
    /// the listener has connections waiting, on the first worker.
    pub fn register_listener(
        &self,
        listener: &mut TcpListener,
        on_ready: OnReady,
    ) -> io::Result<IoToken> {
        self.register_listener_on(listener, on_ready, 0)
    }

    /// Like [`Reactor::register_listener`], on `worker`'s epoll: with a
    /// listener per worker (`SO_REUSEPORT`), each worker accepts its share
    /// of the connections itself.
    pub fn register_listener_on(
        &self,
        listener: &mut TcpListener,
        on_ready: OnReady,
        worker: usize,
    ) -> io::Result<IoToken> {
        let worker = worker % self.io().registries.len();
        let i = {
            let mut table = self.io().listeners.lock().expect("listeners lock");
            table.push(Some(on_ready));
            table.len() - 1
        };
        self.io().registries[worker].register(listener, Token(LISTENER | i), Interest::READABLE)?;
        self.io().registrations.fetch_add(1, Ordering::Relaxed);
        Ok(IoToken {
            worker,
            listener: Some(i),
            reader: None,
            writer: None,
        })
    }

    /// Calls `on_parked` with a parked stream's key when it has bytes to
    /// read or closes; the first call wins (one service per reactor).
    pub fn on_parked(&self, on_parked: OnParked) {
        let _ = self.io().on_parked.set(on_parked);
    }

    /// Watches a stream that has no tasks (an idle connection whose
    /// instance ended) on `worker`'s epoll: its readiness calls the
    /// parked handler with `key` (below 2^62). Readiness present at
    /// registration is reported too, so bytes that came before are not
    /// missed.
    pub fn register_parked(
        &self,
        stream: &mut TcpStream,
        key: usize,
        worker: usize,
    ) -> io::Result<IoToken> {
        debug_assert!(key & (PARKED | LISTENER) == 0);
        let worker = worker % self.io().registries.len();
        self.io().registries[worker].register(stream, Token(PARKED | key), Interest::READABLE)?;
        self.io().registrations.fetch_add(1, Ordering::Relaxed);
        Ok(IoToken {
            worker,
            listener: None,
            reader: None,
            writer: None,
        })
    }

    pub fn deregister_stream(&self, stream: &mut TcpStream, token: IoToken) {
        if self.io().registries[token.worker]
            .deregister(stream)
            .is_ok()
        {
            self.io().registrations.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub fn deregister_listener(&self, listener: &mut TcpListener, token: IoToken) {
        let _ = self.io().registries[token.worker].deregister(listener);
        if let Some(i) = token.listener {
            if let Some(slot) = self
                .io()
                .listeners
                .lock()
                .expect("listeners lock")
                .get_mut(i)
            {
                *slot = None;
                self.io().registrations.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Wakes `task` at `at` (within a worker's tick, 10 ms). A task woken
    /// early checks the time itself.
    pub fn wake_at(&self, task: TaskId, at: Instant) {
        self.io()
            .timers
            .lock()
            .expect("timers lock")
            .push(Reverse((at, task.0)));
    }

    /// Whether the peer of the stream registered as `token` may have
    /// closed since this was last asked (a read should go on until it says
    /// so). Asking clears it.
    /// The stream's writer found its socket full (or not yet connected):
    /// the next writable readiness wakes it. The writer tries once more
    /// after asking, as the readiness may have come just before.
    pub fn want_writable(&self, token: IoToken) {
        if let Some(f) = token
            .writer
            .and_then(|w| self.io().writable_wanted.get(w.0 as usize))
        {
            f.store(true, Ordering::SeqCst);
        }
    }

    pub fn take_hangup(&self, token: IoToken) -> bool {
        token
            .reader
            .and_then(|r| self.io().hangups.get(r.0 as usize))
            .is_none_or(|h| h.swap(false, Ordering::AcqRel))
    }

    /// Registrations alive: streams and listeners.
    pub fn registrations(&self) -> usize {
        self.io().registrations.load(Ordering::Relaxed)
    }

    /// How many times a worker's `epoll_wait` was interrupted (its eventfd
    /// written) since the scheduler started.
    pub fn interrupts(&self) -> usize {
        self.io().interrupts.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streams_token_carries_its_tasks() {
        let t = stream_token(Some(TaskId(7)), Some(TaskId(4_000_000)));
        assert_eq!(stream_tasks(t), (Some(7), Some(4_000_000)));
        assert_eq!(
            stream_tasks(stream_token(None, Some(TaskId(0)))),
            (None, Some(0))
        );
        assert_eq!(
            stream_tasks(stream_token(Some(TaskId(0)), None)),
            (Some(0), None)
        );
        assert_eq!(t.0 & LISTENER, 0);
        assert_eq!(t.0 & PARKED, 0);
        assert_ne!(t, WAKE);
    }
}
