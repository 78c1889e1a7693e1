//! One receiving port read by several readers, each getting every frame.
//!
//! Several packet programs on one port each see every frame. Most ports
//! can simply be opened once per program (each AF_PACKET socket gets its
//! own copy of the interface's frames, each reader of a file reads it
//! whole), but a TUN device takes one reader only: a second open of it
//! fails with `EBUSY`, and a multi-queue device would split the packets,
//! not copy them. [`fan_out`] shares one opened port instead.
//!
//! There is no thread here: whichever reader finds its own queue empty
//! reads a batch from the port and copies each frame into every reader's
//! queue (fixed slots, made when the fan-out is made and reused, so no
//! allocation per frame once a slot has held the largest frame). A reader
//! whose queue is full loses the frame, counted as a drop of its own, as
//! a kernel ring would drop it. Each reader's [`RxPort::raw_fd`] is an
//! epoll instance watching both the port's descriptor and an eventfd that
//! the other readers signal when they leave frames in its queue, so a
//! reader waiting in `poll` wakes for either.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use crate::{PortError, PortStats, RecvStatus, RxPort};

/// Room a queue slot starts with: an Ethernet frame of the usual MTU.
const SLOT_BYTES: usize = 2048;

/// One reader's queue of frames not yet handed out.
struct Queue {
    /// Frames waiting, oldest first: (slot, timestamp).
    waiting: VecDeque<(Vec<u8>, u64)>,
    /// Slots free for the next frames.
    free: Vec<Vec<u8>>,
    /// Frames and bytes handed to this reader, and its own drops.
    stats: PortStats,
    /// Its eventfd: written when another reader leaves frames here.
    wake: OwnedFd,
}

struct Shared {
    port: Box<dyn RxPort>,
    queues: Vec<Queue>,
    /// The port said it ended (a file).
    ended: bool,
}

/// One reader of a fanned-out port.
pub struct FanOutRx {
    shared: Arc<Mutex<Shared>>,
    me: usize,
    /// Epoll instance over the port's fd and this reader's eventfd; none
    /// where the port has no fd to wait on.
    ready: Option<OwnedFd>,
}

/// Shares `port` between `readers` readers, each queueing up to `depth`
/// frames that it has not read yet.
pub fn fan_out(
    port: Box<dyn RxPort>,
    readers: usize,
    depth: usize,
) -> Result<Vec<FanOutRx>, PortError> {
    let setup = |source: io::Error| PortError::Open {
        what: "a port shared by several readers".into(),
        source,
    };
    let port_fd = port.raw_fd();
    let mut queues = Vec::with_capacity(readers);
    let mut ready = Vec::with_capacity(readers);
    for _ in 0..readers {
        let wake = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })
            .map_err(setup)?;
        // SAFETY: a descriptor just made, owned by nothing else.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let epoll = match port_fd {
            None => None,
            Some(fd) => {
                let ep = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) }).map_err(setup)?;
                // SAFETY: as above.
                let ep = unsafe { OwnedFd::from_raw_fd(ep) };
                for watched in [fd, wake.as_raw_fd()] {
                    let mut event = libc::epoll_event {
                        events: libc::EPOLLIN as u32,
                        u64: watched as u64,
                    };
                    // SAFETY: both descriptors are open; `event` lives
                    // through the call.
                    cvt(unsafe {
                        libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, watched, &mut event)
                    })
                    .map_err(setup)?;
                }
                Some(ep)
            }
        };
        queues.push(Queue {
            waiting: VecDeque::with_capacity(depth),
            free: (0..depth).map(|_| Vec::with_capacity(SLOT_BYTES)).collect(),
            stats: PortStats::default(),
            wake,
        });
        ready.push(epoll);
    }
    let shared = Arc::new(Mutex::new(Shared {
        port,
        queues,
        ended: false,
    }));
    Ok(ready
        .into_iter()
        .enumerate()
        .map(|(me, ready)| FanOutRx {
            shared: shared.clone(),
            me,
            ready,
        })
        .collect())
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Adds one to an eventfd (a reader's wake-up); a full counter already
/// wakes.
fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an open eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Empties an eventfd's counter, so it is not readable until signalled
/// again.
fn reset(fd: &OwnedFd) {
    let mut count: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from an open, non-blocking
    // eventfd.
    unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
}

impl Shared {
    /// Reads a batch from the port into every reader's queue; whether it
    /// gave any frame.
    fn pull(&mut self, max: usize) -> Result<bool, PortError> {
        let queues = &mut self.queues;
        let status = self.port.recv_batch(max, &mut |frame, timestamp| {
            for q in queues.iter_mut() {
                match q.free.pop() {
                    Some(mut slot) => {
                        slot.clear();
                        slot.extend_from_slice(frame);
                        q.waiting.push_back((slot, timestamp));
                    }
                    None => q.stats.drops += 1,
                }
            }
        })?;
        match status {
            RecvStatus::Frames(n) => Ok(n > 0),
            RecvStatus::Idle => Ok(false),
            RecvStatus::End => {
                self.ended = true;
                Ok(false)
            }
        }
    }
}

impl RxPort for FanOutRx {
    fn recv_batch(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError> {
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let me = self.me;
        if shared.queues[me].waiting.is_empty() && !shared.ended && shared.pull(max)? {
            for (i, q) in shared.queues.iter().enumerate() {
                if i != me && !q.waiting.is_empty() {
                    signal(&q.wake);
                }
            }
        }
        let q = &mut shared.queues[me];
        let mut handed = 0;
        while handed < max {
            let Some((slot, timestamp)) = q.waiting.pop_front() else {
                break;
            };
            f(&slot, timestamp);
            q.stats.frames += 1;
            q.stats.bytes += slot.len() as u64;
            q.free.push(slot);
            handed += 1;
        }
        if q.waiting.is_empty() {
            // Under the lock that every push takes: no signal is lost.
            reset(&q.wake);
        }
        Ok(match handed {
            0 if shared.ended && shared.queues[me].waiting.is_empty() => RecvStatus::End,
            0 => RecvStatus::Idle,
            n => RecvStatus::Frames(n),
        })
    }

    fn raw_fd(&self) -> Option<RawFd> {
        self.ready.as_ref().map(|fd| fd.as_raw_fd())
    }

    /// This reader's frames and drops, with what the port itself lost or
    /// refused (every reader lost those).
    fn stats(&self) -> PortStats {
        let shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let port = shared.port.stats();
        let own = shared.queues[self.me].stats;
        PortStats {
            frames: own.frames,
            bytes: own.bytes,
            errors: port.errors,
            drops: own.drops + port.drops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port handing out a fixed list of frames, `per_call` at a time.
    struct Frames {
        frames: VecDeque<Vec<u8>>,
        per_call: usize,
    }

    impl RxPort for Frames {
        fn recv_batch(
            &mut self,
            max: usize,
            f: &mut dyn FnMut(&[u8], u64),
        ) -> Result<RecvStatus, PortError> {
            let mut n = 0;
            while n < max.min(self.per_call) {
                let Some(frame) = self.frames.pop_front() else {
                    break;
                };
                f(&frame, n as u64);
                n += 1;
            }
            Ok(match n {
                0 if self.frames.is_empty() => RecvStatus::End,
                0 => RecvStatus::Idle,
                n => RecvStatus::Frames(n),
            })
        }

        fn raw_fd(&self) -> Option<RawFd> {
            None
        }
    }

    fn drain(rx: &mut FanOutRx, max: usize) -> (Vec<Vec<u8>>, bool) {
        let mut got = Vec::new();
        loop {
            match rx
                .recv_batch(max, &mut |f, _| got.push(f.to_vec()))
                .unwrap()
            {
                RecvStatus::Frames(_) => {}
                RecvStatus::Idle => return (got, false),
                RecvStatus::End => return (got, true),
            }
        }
    }

    fn frames(n: u8) -> VecDeque<Vec<u8>> {
        (0..n).map(|i| vec![i; 60 + i as usize]).collect()
    }

    #[test]
    fn every_reader_gets_every_frame_in_order_then_the_end() {
        let port = Frames {
            frames: frames(10),
            per_call: 3,
        };
        let mut readers = fan_out(Box::new(port), 3, 16).unwrap();
        // Readers interleave: whoever reads first pulls for all.
        let (first, ended) = drain(&mut readers[1], 2);
        assert!(ended);
        for r in [0, 2] {
            let (got, ended) = drain(&mut readers[r], 4);
            assert!(ended, "reader {r}");
            assert_eq!(got, first, "reader {r}");
        }
        assert_eq!(first, Vec::from(frames(10)));
        for r in &readers {
            assert_eq!(r.stats().frames, 10);
            assert_eq!(r.stats().drops, 0);
        }
    }

    #[test]
    fn a_reader_that_falls_behind_loses_frames_counted_as_its_drops() {
        let port = Frames {
            frames: frames(10),
            per_call: 10,
        };
        let mut readers = fan_out(Box::new(port), 2, 4).unwrap();
        let mut got = Vec::new();
        // Reader 0 pulls all ten at once: each queue keeps four.
        readers[0]
            .recv_batch(10, &mut |f, _| got.push(f.to_vec()))
            .unwrap();
        assert_eq!(got.len(), 4);
        let (late, _) = drain(&mut readers[1], 10);
        assert_eq!(late, Vec::from(frames(4)));
        assert_eq!(readers[0].stats().drops, 6);
        assert_eq!(readers[1].stats().drops, 6);
    }
}
