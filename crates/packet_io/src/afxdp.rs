//! Live interfaces through AF_XDP.
//!
//! One `AF_XDP` socket per port, bound to one queue of the interface
//! (queue 0 unless [`AfXdpConfig::queue`] says otherwise), with its own
//! UMEM: a region of fixed-size frames that the kernel and the port hand
//! back and forth through four rings mapped into memory.
//!
//! - **Receive**: the first [`AfXdpConfig::rx_frames`] frames of the UMEM
//!   sit in the fill ring; the kernel writes arriving frames into them and
//!   names them on the RX ring. [`RxPort::recv_batch`] hands out slices of
//!   the UMEM and puts each frame straight back on the fill ring once its
//!   callback returns: no copy, no allocation, no system call.
//! - **Send**: [`TxPort::send`] copies a frame into one of the other
//!   [`AfXdpConfig::tx_frames`] frames and names it on the TX ring;
//!   [`TxPort::flush`] (or a full batch) wakes the kernel with `sendto`,
//!   and sent frames come back on the completion ring. With no frame free
//!   the frame is dropped and counted.
//! - **Steering**: an XDP program ([`crate::xdp_redirect`]) redirects the
//!   queue's frames to the socket; frames of queues with no socket go on
//!   to the kernel. The program is attached while the port lives.
//! - **Mode**: the kernel picks zero-copy where the driver supports it and
//!   copies otherwise (veth, most virtual devices); the XDP program runs in
//!   the driver where the driver has XDP (veth does), else generically.
//!
//! The two sides share the socket and UMEM but no ring: the receiving side
//! alone touches the RX and fill rings, the sending side the TX and
//! completion rings, so each can live on its own thread without a lock.
//! AF_XDP gives no arrival time: frames are stamped with the clock when a
//! batch is read. Kernel drops (RX ring full, no fill entry) come from
//! `XDP_STATISTICS` into the receiving side's [`PortStats::drops`].

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::afpacket::set_option;
use crate::xdp_redirect::{XdpRedirect, MAP_ENTRIES};
use crate::{PortError, PortStats, RecvStatus, RxPort, TxPort};

const ETHERNET_HEADER: usize = 14;
/// How long opening waits for a queue whose last socket is being released.
const BUSY_QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
const BUSY_QUEUE_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// How a port's UMEM and rings are sized.
#[derive(Debug, Clone)]
pub struct AfXdpConfig {
    /// Bytes per UMEM frame (2048 or 4096): the longest frame the port
    /// sends or receives.
    pub frame_size: u32,
    /// Frames for receiving (a power of two): the fill and RX rings' size.
    pub rx_frames: u32,
    /// Frames for sending (a power of two): the TX and completion rings'
    /// size.
    pub tx_frames: u32,
    /// The interface queue the socket is bound to.
    pub queue: u32,
    /// Frames held before a send wakes the kernel.
    pub tx_batch: usize,
}

impl Default for AfXdpConfig {
    fn default() -> Self {
        AfXdpConfig {
            frame_size: 2048,
            rx_frames: 2048,
            tx_frames: 2048,
            queue: 0,
            tx_batch: 64,
        }
    }
}

/// An open AF_XDP port, both sides; [`AfXdp::split`] them to use.
pub struct AfXdp {
    iface: String,
    shared: Arc<Shared>,
    rx: Ring,
    fill: Ring,
    tx: Ring,
    completion: Ring,
    config: AfXdpConfig,
}

/// What both sides hold: the socket, the UMEM and the XDP program.
struct Shared {
    // Field order is drop order: the program goes first, so no frame is
    // redirected to a socket about to close.
    _redirect: XdpRedirect,
    socket: OwnedFd,
    umem: Mapping,
}

/// A region mapped into memory, unmapped on drop.
struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; which side touches which part is
// kept apart by the ring protocol (see the module doc).
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made at open.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn map(len: usize, fd: RawFd, offset: libc::off_t) -> io::Result<Mapping> {
    let (flags, fd) = if fd < 0 {
        (
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
        )
    } else {
        (libc::MAP_SHARED | libc::MAP_POPULATE, fd)
    };
    // SAFETY: a fresh mapping of `len` bytes; checked for failure below.
    let base = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            offset,
        )
    };
    if base == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(Mapping {
            base: base.cast(),
            len,
        })
    }
}

/// One of the four rings: a producer index, a consumer index, a flags word
/// and `size` descriptors, shared with the kernel.
struct Ring {
    // Kept for its unmapping on drop.
    _mapping: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    descs: *mut u8,
    mask: u32,
    /// This side's copy of the index it advances.
    local: u32,
}

// SAFETY: a ring is used by one side only, through `&mut self`.
unsafe impl Send for Ring {}

impl Ring {
    /// Maps a ring of `size` descriptors of `desc` bytes at `offset` of the
    /// socket, where `at` says where its parts lie.
    fn open(
        socket: &OwnedFd,
        offset: libc::off_t,
        at: &libc::xdp_ring_offset,
        size: u32,
        desc: usize,
        producing: bool,
    ) -> io::Result<Ring> {
        let len = at.desc as usize + size as usize * desc;
        let mapping = map(len, socket.as_raw_fd(), offset)?;
        // SAFETY: the kernel's offsets lie inside the mapping it sized.
        let (producer, consumer, descs) = unsafe {
            (
                mapping.base.add(at.producer as usize).cast::<AtomicU32>(),
                mapping.base.add(at.consumer as usize).cast::<AtomicU32>(),
                mapping.base.add(at.desc as usize),
            )
        };
        let mut ring = Ring {
            _mapping: mapping,
            producer,
            consumer,
            descs,
            mask: size - 1,
            local: 0,
        };
        ring.local = if producing {
            ring.producer().load(Ordering::Relaxed)
        } else {
            ring.consumer().load(Ordering::Relaxed)
        };
        Ok(ring)
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into the live mapping; the kernel uses it atomically.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*self.consumer }
    }

    /// The `u64` address descriptor at `index` (fill and completion rings).
    fn addr(&self, index: u32) -> *mut u64 {
        // SAFETY: masked into the ring's descriptors.
        unsafe { self.descs.cast::<u64>().add((index & self.mask) as usize) }
    }

    /// The `xdp_desc` at `index` (RX and TX rings).
    fn desc(&self, index: u32) -> *mut libc::xdp_desc {
        // SAFETY: masked into the ring's descriptors.
        unsafe {
            self.descs
                .cast::<libc::xdp_desc>()
                .add((index & self.mask) as usize)
        }
    }
}

/// Reads a socket option of plain C data (integers only, so all-zero is a
/// valid value to start from).
fn get_option<T: Copy>(socket: RawFd, name: libc::c_int) -> io::Result<T> {
    // SAFETY: only used with C structs of integers, for which zero is valid.
    let mut value: T = unsafe { std::mem::zeroed() };
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `value`.
    let result = unsafe {
        libc::getsockopt(
            socket,
            libc::SOL_XDP,
            name,
            ptr::from_mut(&mut value).cast(),
            &mut len,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(value)
    }
}

impl AfXdp {
    /// Opens queue 0 of `iface` with the default sizes.
    pub fn open(iface: &str) -> Result<AfXdp, PortError> {
        AfXdp::open_with(iface, &AfXdpConfig::default())
    }

    /// Opens `config.queue` of `iface`.
    pub fn open_with(iface: &str, config: &AfXdpConfig) -> Result<AfXdp, PortError> {
        let failed = |step: &str, source: io::Error| PortError::Open {
            what: format!("AF_XDP port on `{iface}` ({step})"),
            source,
        };
        let sizes_ok = config.rx_frames.is_power_of_two()
            && config.tx_frames.is_power_of_two()
            && matches!(config.frame_size, 2048 | 4096)
            && config.queue < MAP_ENTRIES
            && config.tx_batch > 0;
        if !sizes_ok {
            return Err(failed(
                "checking the sizes",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "ring sizes must be powers of two, frames 2048 or 4096 bytes, \
                     the queue below 256 and the batch above 0",
                ),
            ));
        }
        let name = std::ffi::CString::new(iface)
            .map_err(|_| failed("naming the interface", io::ErrorKind::InvalidInput.into()))?;
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(failed("finding the interface", io::Error::last_os_error()));
        }
        // SAFETY: plain socket creation; checked below.
        let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(failed("creating the socket", io::Error::last_os_error()));
        }
        // SAFETY: a new fd that nothing else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };

        let frames = (config.rx_frames + config.tx_frames) as usize;
        let umem = map(frames * config.frame_size as usize, -1, 0)
            .map_err(|e| failed("mapping the UMEM", e))?;
        let registration = libc::xdp_umem_reg_v1 {
            addr: umem.base as u64,
            len: umem.len as u64,
            chunk_size: config.frame_size,
            headroom: 0,
        };
        set_option(&socket, libc::SOL_XDP, libc::XDP_UMEM_REG, &registration)
            .map_err(|e| failed("registering the UMEM", e))?;
        for (option, size) in [
            (libc::XDP_UMEM_FILL_RING, config.rx_frames),
            (libc::XDP_RX_RING, config.rx_frames),
            (libc::XDP_UMEM_COMPLETION_RING, config.tx_frames),
            (libc::XDP_TX_RING, config.tx_frames),
        ] {
            set_option(&socket, libc::SOL_XDP, option, &size)
                .map_err(|e| failed("sizing the rings", e))?;
        }
        let offsets: libc::xdp_mmap_offsets =
            get_option(socket.as_raw_fd(), libc::XDP_MMAP_OFFSETS)
                .map_err(|e| failed("reading the ring offsets", e))?;
        let desc = size_of::<libc::xdp_desc>();
        let addr = size_of::<u64>();
        let ring = |offset: u64, at, size, desc, producing| {
            Ring::open(&socket, offset as libc::off_t, at, size, desc, producing)
                .map_err(|e| failed("mapping the rings", e))
        };
        let rx = ring(
            libc::XDP_PGOFF_RX_RING as u64,
            &offsets.rx,
            config.rx_frames,
            desc,
            false,
        )?;
        let tx = ring(
            libc::XDP_PGOFF_TX_RING as u64,
            &offsets.tx,
            config.tx_frames,
            desc,
            true,
        )?;
        let mut fill = ring(
            libc::XDP_UMEM_PGOFF_FILL_RING,
            &offsets.fr,
            config.rx_frames,
            addr,
            true,
        )?;
        let completion = ring(
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
            &offsets.cr,
            config.tx_frames,
            addr,
            false,
        )?;
        // Every receive frame goes to the kernel before the socket binds.
        for i in 0..config.rx_frames {
            // SAFETY: the fill ring is empty and holds `rx_frames` entries.
            unsafe { *fill.addr(fill.local) = u64::from(i) * u64::from(config.frame_size) };
            fill.local = fill.local.wrapping_add(1);
        }
        fill.producer().store(fill.local, Ordering::Release);

        let address = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: 0,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: config.queue,
            sxdp_shared_umem_fd: 0,
        };
        // A socket of this queue closed a moment ago is released by the
        // kernel in the background, and until then the queue is busy: wait
        // for it a while (a port reopened at once, a restarted program).
        let mut waited = std::time::Duration::ZERO;
        loop {
            // SAFETY: a live address of the size passed.
            let bound = unsafe {
                libc::bind(
                    socket.as_raw_fd(),
                    ptr::from_ref(&address).cast(),
                    size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if bound == 0 {
                break;
            }
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EBUSY) || waited >= BUSY_QUEUE_WAIT {
                return Err(failed("binding the socket", error));
            }
            std::thread::sleep(BUSY_QUEUE_POLL);
            waited += BUSY_QUEUE_POLL;
        }
        let mut redirect = XdpRedirect::new().map_err(|(step, e)| failed(step, e))?;
        redirect
            .insert(config.queue, socket.as_raw_fd())
            .map_err(|e| failed("entering the socket in the map", e))?;
        redirect
            .attach(ifindex)
            .map_err(|(step, e)| failed(step, e))?;
        Ok(AfXdp {
            iface: iface.to_string(),
            shared: Arc::new(Shared {
                _redirect: redirect,
                socket,
                umem,
            }),
            rx,
            fill,
            tx,
            completion,
            config: config.clone(),
        })
    }

    /// The receiving and sending sides, each usable on its own thread.
    pub fn split(self) -> (AfXdpRx, AfXdpTx) {
        let frame_size = u64::from(self.config.frame_size);
        let first_tx = u64::from(self.config.rx_frames) * frame_size;
        let free = (0..u64::from(self.config.tx_frames))
            .map(|i| first_tx + i * frame_size)
            .collect();
        (
            AfXdpRx {
                iface: self.iface.clone(),
                shared: Arc::clone(&self.shared),
                rx: self.rx,
                fill: self.fill,
                frame_mask: !(frame_size - 1),
                stats: PortStats::default(),
            },
            AfXdpTx {
                iface: self.iface,
                shared: self.shared,
                tx: self.tx,
                completion: self.completion,
                free,
                held: 0,
                batch: self.config.tx_batch,
                frame_size: self.config.frame_size as usize,
                stats: PortStats::default(),
            },
        )
    }
}

/// The receiving side of an AF_XDP port.
pub struct AfXdpRx {
    iface: String,
    shared: Arc<Shared>,
    rx: Ring,
    fill: Ring,
    /// Clears an address's offset inside its frame.
    frame_mask: u64,
    stats: PortStats,
}

impl AfXdpRx {
    /// The interface.
    pub fn iface(&self) -> &str {
        &self.iface
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the current time into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl RxPort for AfXdpRx {
    fn recv_batch(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError> {
        let ready = self
            .rx
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.rx.local);
        let count = (ready as usize).min(max) as u32;
        if count == 0 {
            return Ok(RecvStatus::Idle);
        }
        let ts = now_ns();
        let umem = &self.shared.umem;
        for _ in 0..count {
            // SAFETY: the kernel published this descriptor (acquire above).
            let desc = unsafe { ptr::read(self.rx.desc(self.rx.local)) };
            self.rx.local = self.rx.local.wrapping_add(1);
            let (start, len) = (desc.addr as usize, desc.len as usize);
            if start + len <= umem.len {
                // SAFETY: inside the UMEM; the frame is this side's until it
                // goes back on the fill ring below.
                let frame = unsafe { std::slice::from_raw_parts(umem.base.add(start), len) };
                f(frame, ts);
                self.stats.frames += 1;
                self.stats.bytes += len as u64;
            } else {
                self.stats.errors += 1;
            }
            // The fill ring has room: it and the RX ring share the receive
            // frames, and this one just left the RX ring.
            // SAFETY: an entry this side owns until the store below.
            unsafe { *self.fill.addr(self.fill.local) = desc.addr & self.frame_mask };
            self.fill.local = self.fill.local.wrapping_add(1);
        }
        self.rx.consumer().store(self.rx.local, Ordering::Release);
        self.fill
            .producer()
            .store(self.fill.local, Ordering::Release);
        Ok(RecvStatus::Frames(count as usize))
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.shared.socket.as_raw_fd())
    }

    fn stats(&self) -> PortStats {
        let mut stats = self.stats;
        if let Ok(kernel) =
            get_option::<libc::xdp_statistics>(self.shared.socket.as_raw_fd(), libc::XDP_STATISTICS)
        {
            stats.drops += kernel.rx_dropped + kernel.rx_ring_full;
            stats.errors += kernel.rx_invalid_descs;
        }
        stats
    }
}

/// The sending side of an AF_XDP port.
pub struct AfXdpTx {
    iface: String,
    shared: Arc<Shared>,
    tx: Ring,
    completion: Ring,
    /// Send frames not on the TX ring nor waiting on the completion ring.
    free: Vec<u64>,
    /// Frames put on the TX ring since the last wake-up.
    held: usize,
    batch: usize,
    frame_size: usize,
    stats: PortStats,
}

impl AfXdpTx {
    /// The interface.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Takes back the frames the kernel has sent.
    fn reclaim(&mut self) {
        let done = self
            .completion
            .producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.completion.local);
        for _ in 0..done {
            // SAFETY: published by the kernel (acquire above).
            let addr = unsafe { *self.completion.addr(self.completion.local) };
            self.completion.local = self.completion.local.wrapping_add(1);
            self.free.push(addr);
        }
        if done > 0 {
            self.completion
                .consumer()
                .store(self.completion.local, Ordering::Release);
        }
    }

    /// Publishes the held frames and wakes the kernel until it has taken
    /// them all or says it cannot now (a full device queue keeps the rest
    /// on the ring for the next wake-up).
    fn kick(&mut self) -> Result<(), PortError> {
        self.tx.producer().store(self.tx.local, Ordering::Release);
        self.held = 0;
        // The kernel sends a bounded number of frames per call (copy mode),
        // answering EAGAIN while more wait.
        for _ in 0..64 {
            if self.tx.consumer().load(Ordering::Acquire) == self.tx.local {
                break;
            }
            // SAFETY: a send of no data on a live socket wakes its TX ring.
            let sent = unsafe {
                libc::sendto(
                    self.shared.socket.as_raw_fd(),
                    ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    ptr::null(),
                    0,
                )
            };
            if sent < 0 {
                let error = io::Error::last_os_error();
                match error.raw_os_error() {
                    Some(libc::EAGAIN | libc::EBUSY | libc::EINTR) => continue,
                    Some(libc::ENOBUFS) => break,
                    _ => {
                        return Err(PortError::Io {
                            what: format!("AF_XDP send on `{}`", self.iface),
                            source: error,
                        })
                    }
                }
            }
        }
        self.reclaim();
        Ok(())
    }
}

impl TxPort for AfXdpTx {
    fn send(&mut self, frame: &[u8], _timestamp_ns: u64) -> Result<(), PortError> {
        if frame.len() < ETHERNET_HEADER || frame.len() > self.frame_size {
            self.stats.errors += 1;
            return Err(PortError::FrameSize {
                port: format!("afxdp:{}", self.iface),
                len: frame.len(),
                min: ETHERNET_HEADER,
                max: self.frame_size,
            });
        }
        if self.free.is_empty() {
            self.reclaim();
        }
        if self.free.is_empty() {
            self.kick()?;
        }
        let Some(addr) = self.free.pop() else {
            self.stats.drops += 1;
            return Ok(());
        };
        let umem = &self.shared.umem;
        // SAFETY: a free send frame of `frame_size` bytes inside the UMEM,
        // owned by this side until the kernel completes it.
        unsafe {
            ptr::copy_nonoverlapping(frame.as_ptr(), umem.base.add(addr as usize), frame.len());
            ptr::write(
                self.tx.desc(self.tx.local),
                libc::xdp_desc {
                    addr,
                    len: frame.len() as u32,
                    options: 0,
                },
            );
        }
        self.tx.local = self.tx.local.wrapping_add(1);
        self.held += 1;
        self.stats.frames += 1;
        self.stats.bytes += frame.len() as u64;
        if self.held >= self.batch {
            self.kick()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), PortError> {
        if self.held > 0 || self.tx.consumer().load(Ordering::Acquire) != self.tx.local {
            self.kick()?;
        }
        Ok(())
    }

    fn stats(&self) -> PortStats {
        let mut stats = self.stats;
        if let Ok(kernel) =
            get_option::<libc::xdp_statistics>(self.shared.socket.as_raw_fd(), libc::XDP_STATISTICS)
        {
            stats.errors += kernel.tx_invalid_descs;
        }
        stats
    }
}
