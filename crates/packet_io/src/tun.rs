//! TUN devices as ports.
//!
//! A TUN device (opened `IFF_TUN | IFF_NO_PI`) carries bare IP packets, but
//! programs parse Ethernet. So the port makes Ethernet frames of them:
//!
//! - **Receive**: each packet is read into a buffer of the port's own (made
//!   at open, reused) just behind a fixed 14-byte Ethernet header:
//!   destination [`TUN_DST_MAC`] (02:00:00:00:00:01), source
//!   [`TUN_SRC_MAC`] (02:00:00:00:00:02), EtherType 0x0800 or 0x86DD chosen
//!   by the packet's IP version nibble. A packet of another version is
//!   counted as an error and skipped. Timestamps are the wall clock when read.
//! - **Send**: the first 14 bytes of a frame are stripped and the rest
//!   written to the device. A frame whose EtherType is not IPv4 or IPv6 is
//!   refused with [`PortError::NotIp`] and one shorter than an Ethernet
//!   header with [`PortError::FrameSize`], each counted as an error; the
//!   port goes on. A full device queue drops the frame, counted as a drop.
//!
//! The device lives as long as the port's fd: it is created by [`Tun::open`]
//! (or attached, if a persistent one of that name exists) in the network
//! namespace of the calling thread, and goes when both halves are dropped.
//! The fd is non-blocking; wait on it for readability.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use crate::{PortError, PortStats, RecvStatus, RxPort, TxPort, MAX_IFACE_NAME};

/// Destination MAC of the frames a TUN port receives.
pub const TUN_DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// Source MAC of the frames a TUN port receives.
pub const TUN_SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

const ETHERNET_HEADER: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
/// Largest IP packet a TUN device carries.
const MAX_PACKET: usize = 65_535;

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags.
#[repr(C)]
struct InterfaceRequest {
    name: [u8; 16],
    flags: libc::c_short,
    _rest: [u8; 22],
}

/// An open TUN device, before it is split into its two sides.
pub struct Tun {
    name: String,
    fd: OwnedFd,
}

impl Tun {
    /// Creates (or attaches to) the TUN device `name` in the calling
    /// thread's network namespace.
    pub fn open(name: &str) -> Result<Tun, PortError> {
        let open_error = |source| PortError::Open {
            what: format!("TUN device `{name}`"),
            source,
        };
        if name.is_empty() || name.len() > MAX_IFACE_NAME || name.contains('\0') {
            return Err(open_error(io::Error::from(io::ErrorKind::InvalidInput)));
        }
        let path = c"/dev/net/tun";
        // SAFETY: a NUL-terminated path and plain flags.
        let raw = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(open_error(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut request = InterfaceRequest {
            name: [0; 16],
            flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
            _rest: [0; 22],
        };
        request.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which
        // `InterfaceRequest` lays out (40 bytes).
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut request) } < 0 {
            return Err(open_error(io::Error::last_os_error()));
        }
        // The kernel writes back the name it used.
        let name = CStr::from_bytes_until_nul(&request.name)
            .ok()
            .and_then(|n| n.to_str().ok())
            .unwrap_or(name)
            .to_string();
        Ok(Tun { name, fd })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The receiving and sending sides, sharing the device.
    pub fn split(self) -> (TunRx, TunTx) {
        let fd = Arc::new(self.fd);
        let mut buffer = vec![0u8; ETHERNET_HEADER + MAX_PACKET].into_boxed_slice();
        buffer[0..6].copy_from_slice(&TUN_DST_MAC);
        buffer[6..12].copy_from_slice(&TUN_SRC_MAC);
        (
            TunRx {
                name: self.name.clone(),
                fd: Arc::clone(&fd),
                buffer,
                stats: PortStats::default(),
            },
            TunTx {
                name: self.name,
                fd,
                stats: PortStats::default(),
            },
        )
    }
}

/// The receiving side of a TUN port.
pub struct TunRx {
    name: String,
    fd: Arc<OwnedFd>,
    /// The Ethernet header, then room for the largest packet.
    buffer: Box<[u8]>,
    stats: PortStats,
}

/// Wall-clock time in nanoseconds (no allocation; vDSO).
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

impl RxPort for TunRx {
    fn recv_batch(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError> {
        let mut frames = 0;
        while frames < max {
            let room = &mut self.buffer[ETHERNET_HEADER..];
            // SAFETY: reads into the buffer's tail, within its length.
            let read =
                unsafe { libc::read(self.fd.as_raw_fd(), room.as_mut_ptr().cast(), room.len()) };
            if read < 0 {
                let error = io::Error::last_os_error();
                match error.kind() {
                    io::ErrorKind::WouldBlock => break,
                    io::ErrorKind::Interrupted => continue,
                    _ => {
                        self.stats.errors += 1;
                        return Err(PortError::Io {
                            what: format!("reading TUN device `{}`", self.name),
                            source: error,
                        });
                    }
                }
            }
            let len = read as usize;
            let version = (len > 0).then(|| self.buffer[ETHERNET_HEADER] >> 4);
            let ethertype = match version {
                Some(4) => ETHERTYPE_IPV4,
                Some(6) => ETHERTYPE_IPV6,
                _ => {
                    self.stats.errors += 1;
                    continue;
                }
            };
            self.buffer[12..14].copy_from_slice(&ethertype.to_be_bytes());
            let frame = &self.buffer[..ETHERNET_HEADER + len];
            f(frame, now_ns());
            self.stats.frames += 1;
            self.stats.bytes += frame.len() as u64;
            frames += 1;
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
        self.stats
    }
}

/// The sending side of a TUN port.
pub struct TunTx {
    name: String,
    fd: Arc<OwnedFd>,
    stats: PortStats,
}

impl TxPort for TunTx {
    fn send(&mut self, frame: &[u8], _timestamp_ns: u64) -> Result<(), PortError> {
        if frame.len() <= ETHERNET_HEADER || frame.len() > ETHERNET_HEADER + MAX_PACKET {
            self.stats.errors += 1;
            return Err(PortError::FrameSize {
                port: format!("TUN device `{}`", self.name),
                len: frame.len(),
                min: ETHERNET_HEADER + 1,
                max: ETHERNET_HEADER + MAX_PACKET,
            });
        }
        let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
        if ethertype != ETHERTYPE_IPV4 && ethertype != ETHERTYPE_IPV6 {
            self.stats.errors += 1;
            return Err(PortError::NotIp {
                port: self.name.clone(),
                ethertype,
            });
        }
        let packet = &frame[ETHERNET_HEADER..];
        loop {
            // SAFETY: writes from a live slice.
            let written =
                unsafe { libc::write(self.fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
            if written >= 0 {
                self.stats.frames += 1;
                self.stats.bytes += frame.len() as u64;
                return Ok(());
            }
            let error = io::Error::last_os_error();
            match error.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {
                    self.stats.drops += 1;
                    return Ok(());
                }
                _ => {
                    self.stats.errors += 1;
                    return Err(PortError::Io {
                        what: format!("writing TUN device `{}`", self.name),
                        source: error,
                    });
                }
            }
        }
    }

    fn flush(&mut self) -> Result<(), PortError> {
        // Every frame is written as it is sent.
        Ok(())
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}
