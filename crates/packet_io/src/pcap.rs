//! pcap and pcapng files as ports.
//!
//! [`PcapRx`] reads a classic pcap file (either byte order, microsecond or
//! nanosecond timestamps) or a pcapng file (any number of sections and
//! interfaces, each interface's `if_tsresol` and `if_tsoffset` applied), then
//! ends. Every frame's interface must have the Ethernet link type; another
//! link type is an error naming the file and the type, at open for pcap and
//! at the first frame of that interface for pcapng.
//!
//! Reading allocates nothing per frame: the `pcap-file` reader parses
//! records in place in one buffer it reuses (8 MB, allocated at open), and
//! frames are handed out as slices of it. For pcapng this module takes the
//! raw blocks and decodes the packet blocks itself, because `pcap-file`'s
//! own decoding of an enhanced packet block collects its options into a
//! `Vec` (one allocation per frame that carries options) and reads every
//! timestamp as nanoseconds whatever the interface's resolution.
//!
//! [`PcapTx`] writes a classic pcap file, Ethernet link type, nanosecond
//! timestamps by default ([`TimestampResolution`]), little-endian, snaplen
//! [`PCAP_SNAPLEN`]: the file header by `pcap-file`, each record's 16-byte
//! header here (the crate's writer hides its inner writer, so it could not
//! be flushed without being closed), through a buffered writer flushed by
//! [`TxPort::flush`] and on drop.

use std::fs::File;
use std::io::{BufWriter, ErrorKind, Read, Write};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use pcap_file::pcap::{PcapHeader, PcapReader};
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::PcapNgReader;
use pcap_file::{DataLink, Endianness, PcapError, TsResolution};

use crate::{PortError, PortStats, RecvStatus, RxPort, TxPort};

/// Longest frame a written file takes (libpcap's largest snaplen).
pub const PCAP_SNAPLEN: u32 = 262_144;

const PCAPNG_SECTION_HEADER: u32 = 0x0A0D_0D0A;
const PCAPNG_INTERFACE_DESCRIPTION: u32 = 1;
const PCAPNG_PACKET: u32 = 2;
const PCAPNG_SIMPLE_PACKET: u32 = 3;
const PCAPNG_ENHANCED_PACKET: u32 = 6;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The resolution of the timestamps a pcap file is written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimestampResolution {
    /// Microseconds (the original pcap format; nanoseconds are cut).
    Micro,
    /// Nanoseconds (magic number 0xa1b23c4d).
    #[default]
    Nano,
}

/// A pcap or pcapng file read frame by frame.
pub struct PcapRx {
    path: PathBuf,
    reader: Reader,
    ended: bool,
    stats: PortStats,
}

enum Reader {
    Pcap {
        reader: PcapReader<File>,
        nanos: bool,
    },
    PcapNg {
        reader: Box<PcapNgReader<File>>,
        endianness: Endianness,
        interfaces: Vec<Interface>,
    },
}

/// What a pcapng frame needs of its interface, taken from its description
/// block once.
struct Interface {
    link_type: DataLink,
    /// Timestamp units per second (`if_tsresol`; microseconds by default).
    units_per_sec: u64,
    /// Seconds added to every timestamp (`if_tsoffset`).
    offset_ns: u64,
}

impl Interface {
    fn timestamp_ns(&self, ticks: u64) -> u64 {
        let ns = if self.units_per_sec == NANOS_PER_SEC {
            ticks
        } else {
            (u128::from(ticks) * u128::from(NANOS_PER_SEC) / u128::from(self.units_per_sec)) as u64
        };
        ns.wrapping_add(self.offset_ns)
    }
}

impl PcapRx {
    /// Opens a pcap or pcapng file, told apart by its magic number.
    pub fn open(path: &Path) -> Result<PcapRx, PortError> {
        let open_error = |source| PortError::Open {
            what: format!("pcap file `{}`", path.display()),
            source,
        };
        let mut magic = [0u8; 4];
        File::open(path)
            .and_then(|mut file| file.read_exact(&mut magic))
            .map_err(|e| {
                if e.kind() == ErrorKind::UnexpectedEof {
                    PortError::NotPcap {
                        path: path.to_path_buf(),
                    }
                } else {
                    open_error(e)
                }
            })?;
        let file = File::open(path).map_err(open_error)?;
        let reader = match magic {
            [0xd4, 0xc3, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0xc3, 0xd4]
            | [0x4d, 0x3c, 0xb2, 0xa1]
            | [0xa1, 0xb2, 0x3c, 0x4d] => {
                let reader = PcapReader::new(file).map_err(|e| capture_error(path, e))?;
                let header = reader.header();
                if header.datalink != DataLink::ETHERNET {
                    return Err(PortError::NotEthernet {
                        path: path.to_path_buf(),
                        link_type: format!(
                            "{:?} ({})",
                            header.datalink,
                            u32::from(header.datalink)
                        ),
                    });
                }
                Reader::Pcap {
                    reader,
                    nanos: header.ts_resolution == TsResolution::NanoSecond,
                }
            }
            [0x0a, 0x0d, 0x0d, 0x0a] => {
                let reader = PcapNgReader::new(file).map_err(|e| capture_error(path, e))?;
                let endianness = reader.section().endianness;
                Reader::PcapNg {
                    reader: Box::new(reader),
                    endianness,
                    interfaces: Vec::new(),
                }
            }
            _ => {
                return Err(PortError::NotPcap {
                    path: path.to_path_buf(),
                })
            }
        };
        Ok(PcapRx {
            path: path.to_path_buf(),
            reader,
            ended: false,
            stats: PortStats::default(),
        })
    }

    /// Whether the file is pcapng.
    pub fn is_pcapng(&self) -> bool {
        matches!(self.reader, Reader::PcapNg { .. })
    }
}

/// A `pcap-file` error as a port error naming the file.
fn capture_error(path: &Path, error: PcapError) -> PortError {
    match error {
        PcapError::IncompleteBuffer => PortError::Truncated {
            path: path.to_path_buf(),
        },
        PcapError::IoError(e) if e.kind() == ErrorKind::UnexpectedEof => PortError::Truncated {
            path: path.to_path_buf(),
        },
        PcapError::IoError(source) => PortError::Io {
            what: format!("reading pcap file `{}`", path.display()),
            source,
        },
        other => PortError::BadCapture {
            path: path.to_path_buf(),
            reason: other.to_string(),
        },
    }
}

fn bad_capture(path: &Path, reason: impl Into<String>) -> PortError {
    PortError::BadCapture {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn read_u32(bytes: &[u8], at: usize, endianness: Endianness) -> u32 {
    let word = [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
    match endianness {
        Endianness::Big => u32::from_be_bytes(word),
        Endianness::Little => u32::from_le_bytes(word),
    }
}

fn read_u16(bytes: &[u8], at: usize, endianness: Endianness) -> u16 {
    let word = [bytes[at], bytes[at + 1]];
    match endianness {
        Endianness::Big => u16::from_be_bytes(word),
        Endianness::Little => u16::from_le_bytes(word),
    }
}

/// The interfaces a pcapng reader has seen in its current section.
fn interfaces_of(reader: &PcapNgReader<File>) -> Vec<Interface> {
    reader
        .interfaces()
        .iter()
        .map(|description| {
            let mut interface = Interface {
                link_type: description.linktype,
                units_per_sec: 1_000_000,
                offset_ns: 0,
            };
            for option in &description.options {
                match option {
                    InterfaceDescriptionOption::IfTsResol(resolution) => {
                        let exponent = u32::from(resolution & 0x7f);
                        let units = if resolution & 0x80 == 0 {
                            10u64.checked_pow(exponent)
                        } else {
                            2u64.checked_pow(exponent)
                        };
                        // A resolution past u64 cannot be honoured; keep the default.
                        if let Some(units) = units.filter(|&u| u > 0) {
                            interface.units_per_sec = units;
                        }
                    }
                    InterfaceDescriptionOption::IfTsOffset(seconds) => {
                        interface.offset_ns = seconds.wrapping_mul(NANOS_PER_SEC);
                    }
                    _ => {}
                }
            }
            interface
        })
        .collect()
}

impl RxPort for PcapRx {
    fn recv_batch(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(&[u8], u64),
    ) -> Result<RecvStatus, PortError> {
        if self.ended {
            return Ok(RecvStatus::End);
        }
        let path = &self.path;
        let stats = &mut self.stats;
        let mut frames = 0;
        match &mut self.reader {
            Reader::Pcap { reader, nanos } => {
                while frames < max {
                    let Some(packet) = reader.next_raw_packet() else {
                        self.ended = true;
                        break;
                    };
                    let packet = packet.map_err(|e| capture_error(path, e))?;
                    let fraction = u64::from(packet.ts_frac);
                    let fraction_ns = if *nanos { fraction } else { fraction * 1000 };
                    let ts = u64::from(packet.ts_sec) * NANOS_PER_SEC + fraction_ns;
                    f(&packet.data, ts);
                    stats.frames += 1;
                    stats.bytes += packet.data.len() as u64;
                    frames += 1;
                }
            }
            Reader::PcapNg {
                reader,
                endianness,
                interfaces,
            } => {
                while frames < max {
                    let Some(block) = reader.next_raw_block() else {
                        self.ended = true;
                        break;
                    };
                    let block = block.map_err(|e| capture_error(path, e))?;
                    let body: &[u8] = &block.body;
                    let (interface_id, ticks, data) = match block.type_ {
                        PCAPNG_ENHANCED_PACKET | PCAPNG_PACKET => {
                            if body.len() < 20 {
                                return Err(bad_capture(
                                    path,
                                    "packet block shorter than 20 bytes",
                                ));
                            }
                            let interface_id = if block.type_ == PCAPNG_ENHANCED_PACKET {
                                read_u32(body, 0, *endianness)
                            } else {
                                u32::from(read_u16(body, 0, *endianness))
                            };
                            let ticks = u64::from(read_u32(body, 4, *endianness)) << 32
                                | u64::from(read_u32(body, 8, *endianness));
                            let captured = read_u32(body, 12, *endianness) as usize;
                            let Some(data) = body.get(20..20 + captured) else {
                                return Err(bad_capture(
                                    path,
                                    "packet block's captured length runs past the block",
                                ));
                            };
                            (interface_id, ticks, data)
                        }
                        PCAPNG_SIMPLE_PACKET => {
                            if body.len() < 4 {
                                return Err(bad_capture(
                                    path,
                                    "simple packet block shorter than 4 bytes",
                                ));
                            }
                            let original = read_u32(body, 0, *endianness) as usize;
                            let data = &body[4..];
                            (0, 0, &data[..original.min(data.len())])
                        }
                        PCAPNG_SECTION_HEADER | PCAPNG_INTERFACE_DESCRIPTION => {
                            drop(block);
                            // Not per frame: once per section or interface.
                            *interfaces = interfaces_of(reader);
                            *endianness = reader.section().endianness;
                            continue;
                        }
                        _ => continue,
                    };
                    let Some(interface) = interfaces.get(interface_id as usize) else {
                        return Err(bad_capture(
                            path,
                            format!("a packet names interface {interface_id}, which no interface block describes"),
                        ));
                    };
                    if interface.link_type != DataLink::ETHERNET {
                        return Err(PortError::NotEthernet {
                            path: path.clone(),
                            link_type: format!(
                                "{:?} ({})",
                                interface.link_type,
                                u32::from(interface.link_type)
                            ),
                        });
                    }
                    f(data, interface.timestamp_ns(ticks));
                    stats.frames += 1;
                    stats.bytes += data.len() as u64;
                    frames += 1;
                }
            }
        }
        Ok(if frames > 0 {
            RecvStatus::Frames(frames)
        } else if self.ended {
            RecvStatus::End
        } else {
            RecvStatus::Idle
        })
    }

    fn raw_fd(&self) -> Option<RawFd> {
        None
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}

/// A pcap file written frame by frame.
pub struct PcapTx {
    path: PathBuf,
    writer: BufWriter<File>,
    resolution: TimestampResolution,
    stats: PortStats,
}

impl PcapTx {
    /// Creates (or truncates) a pcap file with nanosecond timestamps.
    pub fn create(path: &Path) -> Result<PcapTx, PortError> {
        PcapTx::create_with(path, TimestampResolution::Nano)
    }

    /// Creates (or truncates) a pcap file with timestamps of the given
    /// resolution.
    pub fn create_with(path: &Path, resolution: TimestampResolution) -> Result<PcapTx, PortError> {
        let file = File::create(path).map_err(|source| PortError::Open {
            what: format!("pcap file `{}` for writing", path.display()),
            source,
        })?;
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: PCAP_SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: match resolution {
                TimestampResolution::Micro => TsResolution::MicroSecond,
                TimestampResolution::Nano => TsResolution::NanoSecond,
            },
            endianness: Endianness::Little,
        };
        let mut writer = BufWriter::new(file);
        header
            .write_to(&mut writer)
            .map_err(|e| write_error(path, e))?;
        Ok(PcapTx {
            path: path.to_path_buf(),
            writer,
            resolution,
            stats: PortStats::default(),
        })
    }

    fn io_error(&self, source: std::io::Error) -> PortError {
        PortError::Io {
            what: format!("writing pcap file `{}`", self.path.display()),
            source,
        }
    }
}

fn write_error(path: &Path, error: PcapError) -> PortError {
    match error {
        PcapError::IoError(source) => PortError::Io {
            what: format!("writing pcap file `{}`", path.display()),
            source,
        },
        other => PortError::BadCapture {
            path: path.to_path_buf(),
            reason: other.to_string(),
        },
    }
}

impl TxPort for PcapTx {
    fn send(&mut self, frame: &[u8], timestamp_ns: u64) -> Result<(), PortError> {
        let seconds = u32::try_from(timestamp_ns / NANOS_PER_SEC);
        if frame.len() > PCAP_SNAPLEN as usize || seconds.is_err() {
            self.stats.errors += 1;
            return Err(match seconds {
                Err(_) => PortError::BadCapture {
                    path: self.path.clone(),
                    reason: format!(
                        "timestamp {timestamp_ns} ns is past what pcap's 32-bit seconds hold"
                    ),
                },
                Ok(_) => PortError::FrameSize {
                    port: format!("pcap file `{}`", self.path.display()),
                    len: frame.len(),
                    min: 0,
                    max: PCAP_SNAPLEN as usize,
                },
            });
        }
        let fraction = (timestamp_ns % NANOS_PER_SEC) as u32;
        let fraction = match self.resolution {
            TimestampResolution::Nano => fraction,
            TimestampResolution::Micro => fraction / 1000,
        };
        // The record header: seconds, fraction, captured and original length.
        let mut record = [0u8; 16];
        record[0..4].copy_from_slice(&seconds.unwrap_or(0).to_le_bytes());
        record[4..8].copy_from_slice(&fraction.to_le_bytes());
        record[8..12].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        record[12..16].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        let written = self
            .writer
            .write_all(&record)
            .and_then(|()| self.writer.write_all(frame));
        if let Err(e) = written {
            self.stats.errors += 1;
            return Err(self.io_error(e));
        }
        self.stats.frames += 1;
        self.stats.bytes += frame.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), PortError> {
        self.writer.flush().map_err(|e| self.io_error(e))
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}
