//! Live interfaces through AF_PACKET.
//!
//! One `SOCK_RAW` packet socket per port, bound to the interface
//! (`if_nametoindex`) for every protocol (`ETH_P_ALL`):
//!
//! - **Receive** through a TPACKET_V3 ring mapped into memory: the kernel
//!   fills blocks of frames ([`AfPacketConfig::block_size`], retired to the
//!   reader when full or after [`AfPacketConfig::retire_timeout_ms`]), the
//!   port walks a block frame by frame, handing out slices of the ring, and
//!   gives the block back (`TP_STATUS_KERNEL`) once its last frame is
//!   handed out. Nothing is copied or allocated per frame, except that a
//!   frame whose VLAN tag the kernel took off (`TP_STATUS_VLAN_VALID`) is
//!   copied into a buffer of the port's own with the tag put back, so a
//!   program sees the frame as it was on the wire.
//! - The socket ignores its own transmissions and those of the host
//!   (`PACKET_IGNORE_OUTGOING`, Linux 4.20 on); on older kernels the port
//!   skips frames marked `PACKET_OUTGOING` as it walks the ring.
//! - **Send** with `sendmmsg` on the same socket: [`TxPort::send`] copies
//!   the frame into a buffer made at open, and [`TxPort::flush`] (or a full
//!   buffer) sends all that it holds in one call. A full socket or device
//!   queue (`EAGAIN`, `ENOBUFS`) drops the rest of the batch, counted as
//!   drops; a frame the kernel refuses is counted as an error, skipped, and
//!   its error returned once the batch is through.
//! - **Fan-out**: [`AfPacket::open_fanout`] joins a `PACKET_FANOUT_HASH`
//!   group, so several workers each own a socket and the kernel spreads
//!   flows over them.
//! - Kernel ring drops (`PACKET_STATISTICS`) are added to the receive
//!   side's [`PortStats::drops`] when its stats are read.
//!
//! AF_XDP would be another port behind the same traits (see the crate doc).

use std::cell::Cell;
use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use crate::{PortError, PortStats, RecvStatus, RxPort, TxPort};

const ETHERNET_HEADER: usize = 14;
/// Largest frame sent: a 64 KiB packet behind an Ethernet header.
const MAX_TX_FRAME: usize = 65_535 + ETHERNET_HEADER;
/// Where a frame's `sockaddr_ll` begins after its `tpacket3_hdr`.
const SOCKADDR_OFFSET: usize = (size_of::<libc::tpacket3_hdr>() + 15) & !15;
/// `sll_pkttype`'s offset in `sockaddr_ll`.
const PKTTYPE_OFFSET: usize = 10;

/// How a port's ring and send batch are sized.
#[derive(Debug, Clone)]
pub struct AfPacketConfig {
    /// Bytes per ring block (a power of two, a multiple of the page size;
    /// a frame must fit in one).
    pub block_size: u32,
    /// Blocks in the ring.
    pub block_count: u32,
    /// The frame size the kernel sizes its bookkeeping by (V3 packs frames
    /// tightly whatever their size).
    pub frame_size: u32,
    /// Milliseconds after which a block that is not full goes to the reader.
    pub retire_timeout_ms: u32,
    /// Frames held before a send batch goes out by itself.
    pub tx_batch: usize,
    /// Join this `PACKET_FANOUT_HASH` group.
    pub fanout_group: Option<u16>,
}

impl Default for AfPacketConfig {
    fn default() -> Self {
        AfPacketConfig {
            block_size: 1 << 20,
            block_count: 16,
            frame_size: 2048,
            retire_timeout_ms: 4,
            tx_batch: 64,
            fanout_group: None,
        }
    }
}

/// An open AF_PACKET socket with its ring, before it is split into its two
/// sides.
pub struct AfPacket {
    iface: String,
    fd: Arc<OwnedFd>,
    ring: Ring,
    tx_batch: usize,
}

/// The mapped RX ring.
struct Ring {
    base: *mut u8,
    len: usize,
    block_size: usize,
    block_count: usize,
}

// SAFETY: the mapping is owned by the ring alone and only touched through
// `&mut self` of the receiving side.
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made at open.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Sets socket option `level`/`name` to `value` (AF_XDP's options too).
pub(crate) fn set_option<T>(
    fd: &OwnedFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: passes a live value and its size.
    let result = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            ptr::from_ref(value).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl AfPacket {
    /// Opens `iface` with the default ring.
    pub fn open(iface: &str) -> Result<AfPacket, PortError> {
        AfPacket::open_with(iface, &AfPacketConfig::default())
    }

    /// Opens `iface` as one member of fan-out group `group_id`: each socket
    /// of the group gets the flows that hash to it.
    pub fn open_fanout(iface: &str, group_id: u16) -> Result<AfPacket, PortError> {
        AfPacket::open_with(
            iface,
            &AfPacketConfig {
                fanout_group: Some(group_id),
                ..AfPacketConfig::default()
            },
        )
    }

    /// Opens `iface` with the given ring and batch sizes.
    pub fn open_with(iface: &str, config: &AfPacketConfig) -> Result<AfPacket, PortError> {
        let fail = |step: &str, source: io::Error| PortError::Open {
            what: format!("interface `{iface}` (AF_PACKET, {step})"),
            source,
        };
        let name = CString::new(iface)
            .map_err(|_| fail("name", io::Error::from(io::ErrorKind::InvalidInput)))?;
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(fail("if_nametoindex", io::Error::last_os_error()));
        }
        // Protocol 0 receives nothing until bind, so no frame queues up
        // outside the ring while it is set up.
        // SAFETY: plain arguments.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if raw < 0 {
            return Err(fail("socket", io::Error::last_os_error()));
        }
        // SAFETY: a fresh fd nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let version = libc::tpacket_versions::TPACKET_V3 as libc::c_int;
        set_option(&fd, libc::SOL_PACKET, libc::PACKET_VERSION, &version)
            .map_err(|e| fail("PACKET_VERSION", e))?;
        let one: libc::c_int = 1;
        match set_option(&fd, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, &one) {
            Ok(()) => {}
            // Older kernels: outgoing frames are skipped in the ring instead.
            Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => {}
            Err(e) => return Err(fail("PACKET_IGNORE_OUTGOING", e)),
        }
        let request = libc::tpacket_req3 {
            tp_block_size: config.block_size,
            tp_block_nr: config.block_count,
            tp_frame_size: config.frame_size,
            tp_frame_nr: config.block_size / config.frame_size.max(1) * config.block_count,
            tp_retire_blk_tov: config.retire_timeout_ms,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        set_option(&fd, libc::SOL_PACKET, libc::PACKET_RX_RING, &request)
            .map_err(|e| fail("PACKET_RX_RING", e))?;
        let len = config.block_size as usize * config.block_count as usize;
        // SAFETY: maps the ring the kernel just made for this socket.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(fail("mmap", io::Error::last_os_error()));
        }
        let ring = Ring {
            base: base.cast(),
            len,
            block_size: config.block_size as usize,
            block_count: config.block_count as usize,
        };
        // SAFETY: sockaddr_ll is plain data; zero is a valid start.
        let mut address: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        address.sll_family = libc::AF_PACKET as u16;
        address.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        address.sll_ifindex = ifindex as libc::c_int;
        // SAFETY: binds to a live address of the right size.
        let bound = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                ptr::from_ref(&address).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if bound < 0 {
            return Err(fail("bind", io::Error::last_os_error()));
        }
        if let Some(group) = config.fanout_group {
            let argument =
                libc::c_int::from(group) | ((libc::PACKET_FANOUT_HASH as libc::c_int) << 16);
            set_option(&fd, libc::SOL_PACKET, libc::PACKET_FANOUT, &argument)
                .map_err(|e| fail("PACKET_FANOUT", e))?;
        }
        Ok(AfPacket {
            iface: iface.to_string(),
            fd: Arc::new(fd),
            ring,
            tx_batch: config.tx_batch.max(1),
        })
    }

    /// The receiving and sending sides, sharing the socket.
    pub fn split(self) -> (AfPacketRx, AfPacketTx) {
        let vlan_buffer = vec![0u8; self.ring.block_size + 4].into_boxed_slice();
        let tx_buffer = vec![0u8; (self.tx_batch * 2048).max(MAX_TX_FRAME)];
        (
            AfPacketRx {
                iface: self.iface.clone(),
                fd: Arc::clone(&self.fd),
                ring: self.ring,
                block: 0,
                frames_left: 0,
                next_frame: 0,
                vlan_buffer,
                stats: PortStats::default(),
                kernel_drops: Cell::new(0),
            },
            AfPacketTx {
                iface: self.iface,
                fd: self.fd,
                buffer: tx_buffer,
                used: 0,
                held: Vec::with_capacity(self.tx_batch),
                iovecs: Vec::with_capacity(self.tx_batch),
                messages: Vec::with_capacity(self.tx_batch),
                batch: self.tx_batch,
                stats: PortStats::default(),
            },
        )
    }
}

/// The receiving side of an AF_PACKET port.
pub struct AfPacketRx {
    iface: String,
    fd: Arc<OwnedFd>,
    ring: Ring,
    /// The block being walked, or the next to be looked at.
    block: usize,
    /// Frames of `block` not handed out yet; 0 when no block is held.
    frames_left: u32,
    /// Offset in `block` of the next frame's header.
    next_frame: usize,
    /// A frame with its VLAN tag put back.
    vlan_buffer: Box<[u8]>,
    stats: PortStats,
    /// Kernel drops read so far (reading them resets the kernel's count).
    kernel_drops: Cell<u64>,
}

impl AfPacketRx {
    fn block_desc(&self, block: usize) -> *mut libc::tpacket_block_desc {
        // SAFETY: `block < block_count`, so the offset is inside the mapping.
        unsafe { self.ring.base.add(block * self.ring.block_size).cast() }
    }

    /// Hands block `self.block` back to the kernel and moves on.
    fn release_block(&mut self) {
        let desc = self.block_desc(self.block);
        // The frames must be read before the kernel may overwrite them.
        fence(Ordering::Release);
        // SAFETY: the block header lies in the mapping; the kernel reads
        // the status word concurrently, hence the volatile write.
        unsafe {
            ptr::write_volatile(
                ptr::addr_of_mut!((*desc).hdr.bh1.block_status),
                libc::TP_STATUS_KERNEL,
            )
        };
        self.frames_left = 0;
        self.block = (self.block + 1) % self.ring.block_count;
    }
}

impl RxPort for AfPacketRx {
    fn recv_batch(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError> {
        let mut frames = 0;
        while frames < max {
            if self.frames_left == 0 {
                let desc = self.block_desc(self.block);
                // SAFETY: the block header lies in the mapping; the kernel
                // writes the status word concurrently.
                let status =
                    unsafe { ptr::read_volatile(ptr::addr_of!((*desc).hdr.bh1.block_status)) };
                if status & libc::TP_STATUS_USER == 0 {
                    break;
                }
                // The block's contents are read only after its status.
                fence(Ordering::Acquire);
                // SAFETY: the block is the reader's until released.
                let (count, first) = unsafe {
                    (
                        (*desc).hdr.bh1.num_pkts,
                        (*desc).hdr.bh1.offset_to_first_pkt,
                    )
                };
                if count == 0 {
                    self.release_block();
                    continue;
                }
                self.frames_left = count;
                self.next_frame = first as usize;
            }
            let block_start = self.block * self.ring.block_size;
            // SAFETY: the kernel placed this header inside the block.
            let header = unsafe {
                &*self
                    .ring
                    .base
                    .add(block_start + self.next_frame)
                    .cast::<libc::tpacket3_hdr>()
            };
            let frame_at = block_start + self.next_frame + header.tp_mac as usize;
            let len = header.tp_snaplen as usize;
            // SAFETY: sll_pkttype follows the header inside the block.
            let packet_type = unsafe {
                *self
                    .ring
                    .base
                    .add(block_start + self.next_frame + SOCKADDR_OFFSET + PKTTYPE_OFFSET)
            };
            let ts = u64::from(header.tp_sec) * 1_000_000_000 + u64::from(header.tp_nsec);
            let vlan = (header.tp_status & libc::TP_STATUS_VLAN_VALID != 0).then(|| {
                let tpid = if header.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                    header.hv1.tp_vlan_tpid
                } else {
                    0x8100
                };
                (tpid, header.hv1.tp_vlan_tci as u16)
            });
            self.next_frame += header.tp_next_offset as usize;
            self.frames_left -= 1;
            if frame_at + len > self.ring.len {
                self.stats.errors += 1;
            } else if packet_type != libc::PACKET_OUTGOING {
                // SAFETY: checked above to lie inside the mapping; the
                // block stays the reader's until released below.
                let frame =
                    unsafe { std::slice::from_raw_parts(self.ring.base.add(frame_at), len) };
                let frame = match vlan {
                    Some((tpid, tci)) if len >= 12 => {
                        let out = &mut self.vlan_buffer[..len + 4];
                        out[..12].copy_from_slice(&frame[..12]);
                        out[12..14].copy_from_slice(&tpid.to_be_bytes());
                        out[14..16].copy_from_slice(&tci.to_be_bytes());
                        out[16..].copy_from_slice(&frame[12..]);
                        &*out
                    }
                    _ => frame,
                };
                f(frame, ts);
                self.stats.frames += 1;
                self.stats.bytes += frame.len() as u64;
                frames += 1;
            }
            if self.frames_left == 0 {
                self.release_block();
            }
        }
        Ok(if frames > 0 {
            RecvStatus::Frames(frames)
        } else {
            RecvStatus::Idle
        })
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn stats(&self) -> PortStats {
        // SAFETY: tpacket_stats_v3 is plain data.
        let mut kernel: libc::tpacket_stats_v3 = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: reads into a live value of the given size.
        let result = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                ptr::from_mut(&mut kernel).cast(),
                &mut len,
            )
        };
        if result == 0 {
            self.kernel_drops
                .set(self.kernel_drops.get() + u64::from(kernel.tp_drops));
        }
        PortStats {
            drops: self.stats.drops + self.kernel_drops.get(),
            ..self.stats
        }
    }
}

impl AfPacketRx {
    /// The interface this port reads.
    pub fn iface(&self) -> &str {
        &self.iface
    }
}

/// The sending side of an AF_PACKET port.
pub struct AfPacketTx {
    iface: String,
    fd: Arc<OwnedFd>,
    /// Frames held, back to back.
    buffer: Vec<u8>,
    used: usize,
    /// (offset, length) of each held frame.
    held: Vec<(usize, usize)>,
    iovecs: Vec<libc::iovec>,
    messages: Vec<libc::mmsghdr>,
    batch: usize,
    stats: PortStats,
}

// SAFETY: the raw pointers in `iovecs` and `messages` point into `buffer`
// and `iovecs`, owned by this value, and are rebuilt at each flush.
unsafe impl Send for AfPacketTx {}

impl AfPacketTx {
    /// The interface this port writes.
    pub fn iface(&self) -> &str {
        &self.iface
    }
}

impl TxPort for AfPacketTx {
    fn send(&mut self, frame: &[u8], _timestamp_ns: u64) -> Result<(), PortError> {
        if frame.len() < ETHERNET_HEADER || frame.len() > MAX_TX_FRAME {
            self.stats.errors += 1;
            return Err(PortError::FrameSize {
                port: format!("interface `{}`", self.iface),
                len: frame.len(),
                min: ETHERNET_HEADER,
                max: MAX_TX_FRAME,
            });
        }
        if self.held.len() == self.batch || self.used + frame.len() > self.buffer.len() {
            self.flush()?;
        }
        self.buffer[self.used..self.used + frame.len()].copy_from_slice(frame);
        self.held.push((self.used, frame.len()));
        self.used += frame.len();
        if self.held.len() == self.batch {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), PortError> {
        if self.held.is_empty() {
            return Ok(());
        }
        self.iovecs.clear();
        self.messages.clear();
        for &(offset, len) in &self.held {
            self.iovecs.push(libc::iovec {
                // SAFETY: inside `buffer`.
                iov_base: unsafe { self.buffer.as_mut_ptr().add(offset) }.cast(),
                iov_len: len,
            });
        }
        for iovec in &mut self.iovecs {
            // SAFETY: msghdr is plain data; zero means no address, no
            // control data (the socket is bound to its interface).
            let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
            header.msg_iov = iovec;
            header.msg_iovlen = 1;
            self.messages.push(libc::mmsghdr {
                msg_hdr: header,
                msg_len: 0,
            });
        }
        let count = self.messages.len();
        let mut sent = 0;
        let mut first_error = None;
        while sent < count {
            let remaining = &mut self.messages[sent..];
            // SAFETY: every message points at a live iovec and frame.
            let result = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    remaining.as_mut_ptr(),
                    remaining.len() as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if result > 0 {
                for &(_, len) in &self.held[sent..sent + result as usize] {
                    self.stats.frames += 1;
                    self.stats.bytes += len as u64;
                }
                sent += result as usize;
                continue;
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                    self.stats.drops += (count - sent) as u64;
                    break;
                }
                _ => {
                    // This frame is refused; the rest may still go.
                    self.stats.errors += 1;
                    sent += 1;
                    first_error.get_or_insert(error);
                }
            }
        }
        self.held.clear();
        self.used = 0;
        match first_error {
            None => Ok(()),
            Some(source) => Err(PortError::Io {
                what: format!("sending on interface `{}`", self.iface),
                source,
            }),
        }
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}

impl Drop for AfPacketTx {
    fn drop(&mut self) {
        // Frames held are sent, as a file port's are flushed.
        let _ = self.flush();
    }
}
