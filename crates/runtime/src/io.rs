//! Readiness I/O: one reactor thread owns an epoll instance (through mio)
//! and turns socket readiness into task wake-ups. Tasks read and write
//! their non-blocking sockets themselves, until `WouldBlock`.
//!
//! This is the one place the platform meets the operating system's event
//! interface: an io_uring reactor would replace this module and keep the
//! same contract (a task is woken when its socket may make progress).

use crate::scheduler::Waker;
use crate::task::TaskId;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a readiness event on a token does.
enum Entry {
    Stream {
        reader: Option<TaskId>,
        writer: Option<TaskId>,
    },
    Listener(Box<dyn FnMut() + Send>),
}

struct Shared {
    entries: Mutex<HashMap<usize, Entry>>,
    next: AtomicUsize,
    stop: AtomicBool,
    /// Tasks to wake at a time, earliest first.
    timers: Mutex<BinaryHeap<Reverse<(Instant, u32)>>>,
}

/// A registration's key, to update or drop it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IoToken(usize);

pub struct Reactor {
    registry: mio::Registry,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Reactor {
    pub fn start(waker: Waker) -> io::Result<Reactor> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let shared = Arc::new(Shared {
            entries: Mutex::new(HashMap::new()),
            next: AtomicUsize::new(1),
            stop: AtomicBool::new(false),
            timers: Mutex::new(BinaryHeap::new()),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("flick-reactor".into())
            .spawn(move || run(poll, s, waker))?;
        Ok(Reactor {
            registry,
            shared,
            thread: Some(thread),
        })
    }

    fn token(&self) -> usize {
        self.shared.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Wakes `reader` when the stream is readable (or closed) and `writer`
    /// when it is writable.
    pub fn register_stream(
        &self,
        stream: &mut TcpStream,
        reader: Option<TaskId>,
        writer: Option<TaskId>,
    ) -> io::Result<IoToken> {
        let t = self.token();
        self.shared
            .entries
            .lock()
            .expect("entries lock")
            .insert(t, Entry::Stream { reader, writer });
        self.registry
            .register(stream, Token(t), Interest::READABLE | Interest::WRITABLE)?;
        Ok(IoToken(t))
    }

    /// Calls `on_ready` (which should accept until `WouldBlock`) whenever
    /// the listener has connections waiting.
    pub fn register_listener(
        &self,
        listener: &mut TcpListener,
        on_ready: Box<dyn FnMut() + Send>,
    ) -> io::Result<IoToken> {
        let t = self.token();
        self.shared
            .entries
            .lock()
            .expect("entries lock")
            .insert(t, Entry::Listener(on_ready));
        self.registry
            .register(listener, Token(t), Interest::READABLE)?;
        Ok(IoToken(t))
    }

    pub fn deregister_stream(&self, stream: &mut TcpStream, token: IoToken) {
        let _ = self.registry.deregister(stream);
        self.shared
            .entries
            .lock()
            .expect("entries lock")
            .remove(&token.0);
    }

    pub fn deregister_listener(&self, listener: &mut TcpListener, token: IoToken) {
        let _ = self.registry.deregister(listener);
        self.shared
            .entries
            .lock()
            .expect("entries lock")
            .remove(&token.0);
    }

    /// Wakes `task` at `at` (within the reactor's tick, 10 ms). A task
    /// woken early checks the time itself.
    pub fn wake_at(&self, task: TaskId, at: Instant) {
        self.shared
            .timers
            .lock()
            .expect("timers lock")
            .push(Reverse((at, task.0)));
    }

    /// Registrations alive: streams and listeners.
    pub fn registrations(&self) -> usize {
        self.shared.entries.lock().expect("entries lock").len()
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(mut poll: Poll, shared: Arc<Shared>, waker: Waker) {
    let mut events = Events::with_capacity(1024);
    while !shared.stop.load(Ordering::Acquire) {
        {
            let now = Instant::now();
            let mut timers = shared.timers.lock().expect("timers lock");
            while let Some(Reverse((at, task))) = timers.peek().copied() {
                if at > now {
                    break;
                }
                timers.pop();
                waker.wake(TaskId(task));
            }
        }
        if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(10))) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        for ev in events.iter() {
            let mut entries = shared.entries.lock().expect("entries lock");
            match entries.get_mut(&ev.token().0) {
                Some(Entry::Stream { reader, writer }) => {
                    let closed = ev.is_error() || ev.is_read_closed() || ev.is_write_closed();
                    if ev.is_readable() || closed {
                        if let Some(r) = reader {
                            waker.wake(*r);
                        }
                    }
                    if ev.is_writable() || closed {
                        if let Some(w) = writer {
                            waker.wake(*w);
                        }
                    }
                }
                Some(Entry::Listener(_)) => {
                    // The callback registers new streams: run it unlocked.
                    let Some(Entry::Listener(mut on_ready)) = entries.remove(&ev.token().0) else {
                        unreachable!("matched a listener")
                    };
                    drop(entries);
                    on_ready();
                    shared
                        .entries
                        .lock()
                        .expect("entries lock")
                        .insert(ev.token().0, Entry::Listener(on_ready));
                }
                None => {}
            }
        }
    }
}
