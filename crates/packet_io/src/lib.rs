//! Packet ports: where a packet program's frames come from and go to
//! (pcap and pcapng files, live interfaces through AF_PACKET or AF_XDP, TUN
//! devices).
//!
//! This crate moves whole frames as bytes. It must not parse anything
//! above the link framing of its ports, know what a program does with a
//! frame, or own threads or the scheduler.
//!
//! A port is named on the command line as `NAME=SPEC` ([`PortSpec`]) and
//! opened with [`open`] into a [`Port`]: an [`RxPort`] that hands frames out
//! in batches without blocking and without allocating per frame, and a
//! [`TxPort`] that takes frames one at a time and sends what it holds on
//! [`TxPort::flush`]. Live ports give the fd to wait on
//! ([`RxPort::raw_fd`]); the runtime polls it, this crate never sleeps.
//!
//! Every port counts frames, bytes, errors and drops ([`PortStats`]), read
//! through [`RxPort::stats`] and [`TxPort::stats`].
//!
//! A port that takes one reader only (a TUN device) is shared by several
//! with [`fan_out`]: each reader gets every frame.
//!
//! An AF_XDP port ([`afxdp`]) attaches a six-instruction XDP program of its
//! own ([`xdp_redirect`]) for as long as it is open.

use std::fmt;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub mod afpacket;
pub mod afxdp;
pub mod fanout;
pub mod pcap;
pub mod tun;
mod xdp_redirect;

pub use afpacket::{AfPacket, AfPacketConfig, AfPacketRx, AfPacketTx};
pub use afxdp::{AfXdp, AfXdpConfig, AfXdpRx, AfXdpTx};
pub use fanout::{fan_out, FanOutRx};
pub use pcap::{PcapRx, PcapTx, TimestampResolution};
pub use tun::{Tun, TunRx, TunTx, TUN_DST_MAC, TUN_SRC_MAC};

/// The kinds a spec may name, for error messages.
const PORT_KINDS: &str = "pcap:FILE, pcap-out:FILE, afpacket:IFACE, afxdp:IFACE, tun:NAME";

/// Longest interface name the kernel takes (IFNAMSIZ less the NUL).
pub const MAX_IFACE_NAME: usize = 15;

/// Where a port's frames come from or go to, as given on the command line
/// (`--port NAME=SPEC`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSpec {
    /// `pcap:FILE`: read a pcap or pcapng file (Ethernet link type), then end.
    PcapIn(PathBuf),
    /// `pcap-out:FILE`: write a pcap file (Ethernet link type, nanosecond
    /// timestamps).
    PcapOut(PathBuf),
    /// `afpacket:IFACE`: a live interface through AF_PACKET, a TPACKET_V3
    /// memory-mapped RX ring read in batches, TX by `sendmmsg` on the same
    /// socket.
    AfPacket(String),
    /// `afxdp:IFACE`: a live interface through AF_XDP, queue 0: a UMEM and
    /// its rings, and an XDP program steering the queue's frames to the
    /// socket while the port is open (see [`afxdp`]).
    AfXdp(String),
    /// `tun:NAME`: a TUN device (IFF_TUN|IFF_NO_PI); frames are IP packets
    /// given a fixed Ethernet header on the way in (see [`tun`]).
    Tun(String),
}

impl PortSpec {
    /// Whether the port is a live device (frames arrive at their own pace
    /// and can be lost), not a file.
    pub fn is_live(&self) -> bool {
        matches!(
            self,
            PortSpec::AfPacket(_) | PortSpec::AfXdp(_) | PortSpec::Tun(_)
        )
    }

    /// Whether the device can be opened by one reader only (a TUN device;
    /// an AF_XDP queue, which one socket and one XDP program hold), so
    /// several programs bound to it share one port through [`fan_out`].
    pub fn takes_one_reader(&self) -> bool {
        matches!(self, PortSpec::AfXdp(_) | PortSpec::Tun(_))
    }

    /// Parses `NAME=SPEC`, as `--port` takes it.
    pub fn parse_named(text: &str) -> Result<(String, PortSpec), PortError> {
        let Some((name, spec)) = text.split_once('=') else {
            return Err(PortError::BadSpec {
                spec: text.to_string(),
                reason: "expected NAME=SPEC, e.g. `in=pcap:trace.pcap`".to_string(),
            });
        };
        if name.is_empty() {
            return Err(PortError::BadSpec {
                spec: text.to_string(),
                reason: "the port name before `=` is empty".to_string(),
            });
        }
        Ok((name.to_string(), spec.parse()?))
    }
}

impl FromStr for PortSpec {
    type Err = PortError;

    fn from_str(text: &str) -> Result<Self, PortError> {
        let Some((kind, target)) = text.split_once(':') else {
            return Err(PortError::BadSpec {
                spec: text.to_string(),
                reason: format!("expected KIND:TARGET ({PORT_KINDS})"),
            });
        };
        let missing = |what: &str| PortError::BadSpec {
            spec: text.to_string(),
            reason: format!("missing {what} after `{kind}:`"),
        };
        match kind {
            "pcap" | "pcap-out" => {
                if target.is_empty() {
                    return Err(missing("FILE"));
                }
                let path = PathBuf::from(target);
                Ok(if kind == "pcap" {
                    PortSpec::PcapIn(path)
                } else {
                    PortSpec::PcapOut(path)
                })
            }
            "afpacket" | "afxdp" | "tun" => {
                if target.is_empty() {
                    return Err(missing(if kind == "tun" { "NAME" } else { "IFACE" }));
                }
                check_iface_name(target).map_err(|reason| PortError::BadSpec {
                    spec: text.to_string(),
                    reason,
                })?;
                let target = target.to_string();
                Ok(match kind {
                    "tun" => PortSpec::Tun(target),
                    "afxdp" => PortSpec::AfXdp(target),
                    _ => PortSpec::AfPacket(target),
                })
            }
            _ => Err(PortError::UnknownKind {
                kind: kind.to_string(),
            }),
        }
    }
}

/// An interface name the kernel would take: 1 to 15 bytes, no `/`, no
/// whitespace, no NUL, not `.` or `..`.
fn check_iface_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_IFACE_NAME {
        return Err(format!(
            "interface name `{name}` is longer than {MAX_IFACE_NAME} bytes"
        ));
    }
    if name == "."
        || name == ".."
        || name
            .chars()
            .any(|c| c == '/' || c == '\0' || c.is_whitespace())
    {
        return Err(format!("`{name}` is not a valid interface name"));
    }
    Ok(())
}

impl fmt::Display for PortSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortSpec::PcapIn(path) => write!(f, "pcap:{}", path.display()),
            PortSpec::PcapOut(path) => write!(f, "pcap-out:{}", path.display()),
            PortSpec::AfPacket(iface) => write!(f, "afpacket:{iface}"),
            PortSpec::AfXdp(iface) => write!(f, "afxdp:{iface}"),
            PortSpec::Tun(name) => write!(f, "tun:{name}"),
        }
    }
}

/// What can go wrong with a port. Errors for one frame
/// ([`PortError::is_frame_error`]) leave the port usable.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// The spec's kind is none of the known ones.
    #[error("unknown port kind `{kind}` ({PORT_KINDS})")]
    UnknownKind {
        /// The kind as written.
        kind: String,
    },
    /// The spec does not parse.
    #[error("bad port spec `{spec}`: {reason}")]
    BadSpec {
        /// The spec as written.
        spec: String,
        /// Why.
        reason: String,
    },
    /// A file, device or socket could not be opened or set up.
    #[error("cannot open {what}: {source}")]
    Open {
        /// What was being opened, naming the file or interface.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing an open port failed.
    #[error("{what}: {source}")]
    Io {
        /// The port and the operation.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file starts with neither a pcap nor a pcapng magic number.
    #[error("`{path}` is not a pcap or pcapng file")]
    NotPcap {
        /// The file.
        path: PathBuf,
    },
    /// The capture's link type is not Ethernet.
    #[error(
        "`{path}` has link type {link_type}, not Ethernet (1); packet ports carry Ethernet frames"
    )]
    NotEthernet {
        /// The file.
        path: PathBuf,
        /// The link type found.
        link_type: String,
    },
    /// The file ends inside a record.
    #[error("`{path}` is truncated: it ends inside a record")]
    Truncated {
        /// The file.
        path: PathBuf,
    },
    /// A record of the file is malformed.
    #[error("`{path}` is malformed: {reason}")]
    BadCapture {
        /// The file.
        path: PathBuf,
        /// What the pcap reader or writer found wrong.
        reason: String,
    },
    /// A frame given to a TUN port does not carry IPv4 or IPv6.
    #[error("TUN port `{port}` takes IPv4 (0x0800) or IPv6 (0x86dd) frames, not EtherType {ethertype:#06x}")]
    NotIp {
        /// The TUN device.
        port: String,
        /// The frame's EtherType.
        ethertype: u16,
    },
    /// A frame too short or too long for the port.
    #[error("{port}: frame of {len} bytes is outside {min}..={max}")]
    FrameSize {
        /// The port.
        port: String,
        /// The frame's length.
        len: usize,
        /// Shortest frame the port takes.
        min: usize,
        /// Longest frame the port takes.
        max: usize,
    },
}

impl PortError {
    /// Whether the error concerns one frame only (the frame was counted as
    /// an error and dropped; the port goes on).
    pub fn is_frame_error(&self) -> bool {
        matches!(self, PortError::NotIp { .. } | PortError::FrameSize { .. })
    }
}

/// What one `recv_batch` call found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecvStatus {
    /// This many frames were handed to the callback (at least one).
    Frames(usize),
    /// Nothing available now; wait on [`RxPort::raw_fd`].
    Idle,
    /// A file read to its end (live ports never end).
    End,
}

/// A port's counters for one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received or sent.
    pub frames: u64,
    /// Their bytes (as handed to or taken from the program).
    pub bytes: u64,
    /// Frames refused or failed (bad frames, I/O errors).
    pub errors: u64,
    /// Frames lost for want of room: the kernel's ring drops on receive,
    /// a full queue on send.
    pub drops: u64,
}

/// The receiving side of a port.
pub trait RxPort: Send {
    /// Calls `f(frame_bytes, timestamp_ns)` for up to `max` frames available
    /// now, without blocking; no allocation per frame.
    fn recv_batch(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError>;
    /// For live ports, the fd to wait on (epoll/poll readable); None for files.
    fn raw_fd(&self) -> Option<RawFd>;
    /// Frames and bytes received so far, errors and drops. (The default,
    /// all zero, is for ports that keep no counters, such as test doubles;
    /// every port of this crate counts.)
    fn stats(&self) -> PortStats {
        PortStats::default()
    }
}

/// The sending side of a port.
pub trait TxPort: Send {
    /// Takes one frame; a batched port may hold it until [`TxPort::flush`].
    fn send(&mut self, frame: &[u8], timestamp_ns: u64) -> Result<(), PortError>;
    /// Batched ports send what they hold; files flush.
    fn flush(&mut self) -> Result<(), PortError>;
    /// Frames and bytes sent so far, errors and drops (all zero by default,
    /// as for [`RxPort::stats`]).
    fn stats(&self) -> PortStats {
        PortStats::default()
    }
}

/// An opened port: one side or both.
pub struct Port {
    /// Where frames come in, if the port reads.
    pub rx: Option<Box<dyn RxPort>>,
    /// Where frames go out, if the port writes.
    pub tx: Option<Box<dyn TxPort>>,
}

/// Opens a port: PcapIn gives rx only, PcapOut tx only, AfPacket, AfXdp and
/// Tun both.
pub fn open(spec: &PortSpec) -> Result<Port, PortError> {
    match spec {
        PortSpec::PcapIn(path) => Ok(Port {
            rx: Some(Box::new(PcapRx::open(path)?)),
            tx: None,
        }),
        PortSpec::PcapOut(path) => Ok(Port {
            rx: None,
            tx: Some(Box::new(PcapTx::create(path)?)),
        }),
        PortSpec::AfPacket(iface) => {
            let (rx, tx) = AfPacket::open(iface)?.split();
            Ok(Port {
                rx: Some(Box::new(rx)),
                tx: Some(Box::new(tx)),
            })
        }
        PortSpec::AfXdp(iface) => {
            let (rx, tx) = AfXdp::open(iface)?.split();
            Ok(Port {
                rx: Some(Box::new(rx)),
                tx: Some(Box::new(tx)),
            })
        }
        PortSpec::Tun(name) => {
            let (rx, tx) = Tun::open(name)?.split();
            Ok(Port {
                rx: Some(Box::new(rx)),
                tx: Some(Box::new(tx)),
            })
        }
    }
}

/// Frames of a pcap/pcapng file read whole into memory (for benchmarks and
/// tests): (bytes, ts_ns) pairs.
pub fn read_pcap(path: &Path) -> Result<Vec<(Vec<u8>, u64)>, PortError> {
    let mut rx = PcapRx::open(path)?;
    let mut frames = Vec::new();
    while rx.recv_batch(usize::MAX, &mut |frame, ts| {
        frames.push((frame.to_vec(), ts))
    })? != RecvStatus::End
    {}
    Ok(frames)
}

/// Writes frames to a pcap file (tests, generators), nanosecond timestamps.
pub fn write_pcap(path: &Path, frames: &[(Vec<u8>, u64)]) -> Result<(), PortError> {
    let mut tx = PcapTx::create(path)?;
    for (frame, ts) in frames {
        tx.send(frame, *ts)?;
    }
    tx.flush()
}
