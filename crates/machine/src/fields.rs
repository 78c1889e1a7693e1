//! Packet fields: XL's names mapped onto the stock `packet` grammar's flat
//! unit, and the per-frame reader that fills a program's field values.
//!
//! [`XL_FIELDS`] is the one table of the mapping. A field defined by byte
//! offset (`PacketField ipv4 { src = packet.data[26:+4]; }`) is read from
//! the unit where the table says the unit's field sits at that offset in
//! an untagged IPv4 frame (so it is also right for VLAN-tagged frames and
//! IP options); anywhere else it is read from the frame's bytes at the
//! offset. Writes (`setField`) always go to the byte offset.

use crate::model::{FieldDef, Value};
use flick_wire::{FieldRef, Grammar, Parser, Progress};
use std::sync::Arc;

/// Where a field's value comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldSource {
    /// A field of the `packet` unit (`ip_src`). `bytes`: a byte-string
    /// field (MAC addresses), read as a big-endian integer. `at`: where
    /// the program placed it, for `setField`.
    Unit {
        field: &'static str,
        bytes: bool,
        at: Option<(u16, u8)>,
    },
    /// `len` bytes (1 to 8) at `offset` from the frame's start, big-endian;
    /// 0 where the frame is shorter.
    Bytes { offset: u16, len: u8 },
}

/// One row of the mapping: XL name, unit field, and the unit field's
/// offset and length in an untagged Ethernet + IPv4 (no options) frame,
/// or `None` where it has no fixed place there.
pub struct XlField {
    pub xl: &'static str,
    pub unit: &'static str,
    pub bytes: bool,
    pub at: Option<(u16, u8)>,
}

const fn f(xl: &'static str, unit: &'static str, at: Option<(u16, u8)>) -> XlField {
    XlField {
        xl,
        unit,
        bytes: false,
        at,
    }
}

/// XL field names and the `packet` unit's fields they are. TCP and UDP
/// ports are the unit's `src_port`/`dst_port`, which both protocols fill.
pub const XL_FIELDS: &[XlField] = &[
    XlField {
        xl: "eth.dst",
        unit: "eth_dst",
        bytes: true,
        at: Some((0, 6)),
    },
    XlField {
        xl: "eth.src",
        unit: "eth_src",
        bytes: true,
        at: Some((6, 6)),
    },
    f("eth.type", "ethertype", Some((12, 2))),
    f("vlan.id", "vlan_id", None),
    f("vlan.pcp", "pcp", None),
    f("ipv4.tos", "ip_tos", Some((15, 1))),
    f("ipv4.len", "ip_total_length", Some((16, 2))),
    f("ipv4.id", "ip_id", Some((18, 2))),
    f("ipv4.ttl", "ip_ttl", Some((22, 1))),
    f("ipv4.proto", "ip_protocol", Some((23, 1))),
    f("ipv4.csum", "ip_checksum", Some((24, 2))),
    f("ipv4.src", "ip_src", Some((26, 4))),
    f("ipv4.dst", "ip_dst", Some((30, 4))),
    f("ip.proto", "l4_protocol", None),
    f("tcp.sport", "src_port", Some((34, 2))),
    f("tcp.dport", "dst_port", Some((36, 2))),
    f("tcp.seq", "tcp_seq", Some((38, 4))),
    f("tcp.ack", "tcp_ack", Some((42, 4))),
    f("tcp.flags", "tcp_flags", Some((47, 1))),
    f("tcp.win", "tcp_window", Some((48, 2))),
    f("tcp.csum", "tcp_checksum", Some((50, 2))),
    f("udp.sport", "src_port", Some((34, 2))),
    f("udp.dport", "dst_port", Some((36, 2))),
    f("udp.len", "udp_length", Some((38, 2))),
    f("udp.csum", "udp_checksum", Some((40, 2))),
    f("icmp.type", "icmp_type", Some((34, 1))),
    f("icmp.code", "icmp_code", Some((35, 1))),
];

impl XlField {
    /// The field as the `packet` unit's field, read at its fixed offset
    /// where it has one.
    pub fn source(&self) -> FieldSource {
        FieldSource::Unit {
            field: self.unit,
            bytes: self.bytes,
            at: self.at,
        }
    }
}

/// The mapping row of an XL name.
pub fn xl_field(name: &str) -> Option<&'static XlField> {
    XL_FIELDS.iter().find(|r| r.xl == name)
}

#[derive(Debug, thiserror::Error)]
pub enum FieldError {
    #[error("the stock grammar `packet` is missing")]
    NoGrammar,
    #[error("field `{xl}` maps to `{unit}`, which the `packet` grammar's unit `packet` lacks")]
    NotInGrammar { xl: String, unit: &'static str },
}

enum Reader {
    Unit { field: FieldRef, bytes: bool },
    Bytes { offset: usize, len: usize },
}

/// Where a unit field lies in a TCP segment in an untagged IPv4 packet
/// without options, the frames of the fast path: `Some((offset, len))`,
/// or `None` where such a frame lacks the field (it reads 0). Fields not
/// listed keep every frame on the grammar's parse.
fn tcp4_place(unit: &str) -> Option<Option<(usize, usize)>> {
    Some(match unit {
        "eth_dst" => Some((0, 6)),
        "eth_src" => Some((6, 6)),
        "ethertype" => Some((12, 2)),
        "ip_tos" => Some((15, 1)),
        "ip_total_length" => Some((16, 2)),
        "ip_id" => Some((18, 2)),
        "ip_ttl" => Some((22, 1)),
        "ip_protocol" | "l4_protocol" => Some((23, 1)),
        "ip_checksum" => Some((24, 2)),
        "ip_src" => Some((26, 4)),
        "ip_dst" => Some((30, 4)),
        "src_port" => Some((34, 2)),
        "dst_port" => Some((36, 2)),
        "tcp_seq" => Some((38, 4)),
        "tcp_ack" => Some((42, 4)),
        "tcp_flags" => Some((47, 1)),
        "tcp_window" => Some((48, 2)),
        "tcp_checksum" => Some((50, 2)),
        "vlan_id" | "pcp" | "udp_length" | "udp_checksum" | "icmp_type" | "icmp_code" => None,
        _ => return None,
    })
}

/// Whether the `packet` grammar parses `frame` as a TCP segment (first
/// fragment) in an untagged IPv4 packet without options, so that its
/// fields lie where [`tcp4_place`] says: the grammar's own checks (IP
/// version, header and total length, TCP data offset and its options'
/// bytes present) on fixed bytes.
#[inline]
fn is_plain_tcp4(frame: &[u8]) -> bool {
    frame.len() >= 54
        && frame[12] == 0x08
        && frame[13] == 0x00
        && frame[14] == 0x45
        && u16::from_be_bytes([frame[16], frame[17]]) >= 20
        && u16::from_be_bytes([frame[20], frame[21]]) & 0x1fff == 0
        && frame[23] == 6
        && frame[46] >> 4 >= 5
        && frame.len() >= 34 + 4 * (frame[46] >> 4) as usize
}

/// Reads a program's fields from each frame: one parse with the `packet`
/// unit (in place), then each field by its resolved reference; or, where
/// every field has a fixed place in a plain TCP/IPv4 frame and the frame
/// is one (checked on a few bytes), each field straight from its bytes,
/// with no parse. Nothing is allocated per frame.
pub struct FieldReader {
    parser: Parser,
    readers: Vec<Reader>,
    /// Where each field lies in a plain TCP/IPv4 frame; `None` where some
    /// field has no fixed place.
    tcp4: Option<Tcp4>,
}

/// The fields' places in a plain TCP/IPv4 frame, each read as one
/// big-endian 8-byte load, shifted and masked, from a frame of at least
/// [`HEAD`] bytes where every place lies within them, else byte by byte.
struct Tcp4 {
    places: Vec<Place>,
    /// Whether every place lies within the first [`HEAD`] bytes.
    in_head: bool,
}

/// The bytes of a plain TCP/IPv4 frame that its fields are read from: a
/// minimum Ethernet frame without its check sequence.
const HEAD: usize = 60;

#[derive(Clone, Copy)]
struct Place {
    offset: usize,
    /// 0: absent from such frames, reads 0.
    len: usize,
    /// Where the eight bytes read for it start: those ending where the
    /// field ends, or the frame's first eight.
    at: usize,
    shift: u32,
    mask: u64,
}

impl Place {
    fn new((offset, len): (usize, usize)) -> Place {
        let end = offset + len;
        let at = end.saturating_sub(8);
        Place {
            offset,
            len,
            at,
            // (An absent field's mask is 0; its shift must still be
            // under 64.)
            shift: if len == 0 {
                0
            } else {
                8 * (at + 8 - end) as u32
            },
            mask: match len {
                0 => 0,
                1..8 => (1 << (8 * len)) - 1,
                _ => u64::MAX,
            },
        }
    }
}

impl FieldReader {
    pub fn new(fields: &[FieldDef]) -> Result<FieldReader, FieldError> {
        let grammar: Arc<Grammar> = Grammar::stock("packet").ok_or(FieldError::NoGrammar)?;
        let unit = grammar.unit_id("packet").ok_or(FieldError::NoGrammar)?;
        let mut readers = Vec::with_capacity(fields.len());
        let tcp4 = fields
            .iter()
            .map(|def| match &def.source {
                FieldSource::Unit { field, .. } => tcp4_place(field).map(|p| p.unwrap_or((0, 0))),
                FieldSource::Bytes { offset, len } => Some((*offset as usize, *len as usize)),
            })
            .map(|p| p.map(Place::new))
            .collect::<Option<Vec<_>>>()
            .map(|places| Tcp4 {
                in_head: places.iter().all(|p| p.offset + p.len <= HEAD),
                places,
            });
        for def in fields {
            readers.push(match &def.source {
                FieldSource::Unit { field, bytes, .. } => Reader::Unit {
                    field: grammar.field_ref(unit, field).ok_or_else(|| {
                        FieldError::NotInGrammar {
                            xl: def.name.clone(),
                            unit: field,
                        }
                    })?,
                    bytes: *bytes,
                },
                FieldSource::Bytes { offset, len } => Reader::Bytes {
                    offset: *offset as usize,
                    len: *len as usize,
                },
            });
        }
        Ok(FieldReader {
            parser: grammar.parser(unit).in_place(),
            readers,
            tcp4,
        })
    }

    /// Fills `out` (one value per field) from `frame`. Unit fields the
    /// frame lacks (another protocol, or a frame that does not parse)
    /// read as 0. Returns whether the frame parsed.
    pub fn read(&mut self, frame: &[u8], out: &mut [Value]) -> bool {
        if let Some(t) = &self.tcp4 {
            if is_plain_tcp4(frame) {
                if let Some(head) = frame.first_chunk::<HEAD>().filter(|_| t.in_head) {
                    for (p, v) in t.places.iter().zip(out.iter_mut()) {
                        // `at` is at most HEAD - 8 (`in_head`); the `min`
                        // lets the compiler drop the bounds check.
                        let at = p.at.min(HEAD - 8);
                        let word = head[at..]
                            .first_chunk::<8>()
                            .map_or(0, |b| u64::from_be_bytes(*b));
                        *v = (word >> p.shift) & p.mask;
                    }
                } else {
                    read_short(&t.places, frame, out);
                }
                return true;
            }
        }
        self.read_parsing(frame, out)
    }

    /// [`FieldReader::read`] by the grammar's parse always: the reference
    /// the fixed-offset path is tested against.
    pub fn read_parsing(&mut self, frame: &[u8], out: &mut [Value]) -> bool {
        self.parser.reset();
        let parsed = matches!(self.parser.finish(frame), Ok(Progress::Done(_)));
        let msg = self.parser.message(frame);
        for (r, v) in self.readers.iter().zip(out.iter_mut()) {
            *v = match r {
                Reader::Unit { .. } if !parsed => 0,
                Reader::Unit {
                    field,
                    bytes: false,
                } => msg.uint_of(field).unwrap_or(0),
                Reader::Unit { field, bytes: true } => msg.bytes_of(field).map_or(0, be_value),
                Reader::Bytes { offset, len } => {
                    frame.get(*offset..*offset + *len).map_or(0, be_value)
                }
            };
        }
        parsed
    }
}

/// The fields of a plain TCP/IPv4 frame shorter than [`HEAD`] (or of
/// places past it), byte by byte; apart, so that the common path saves no
/// registers for it.
#[cold]
#[inline(never)]
fn read_short(places: &[Place], frame: &[u8], out: &mut [Value]) {
    for (p, v) in places.iter().zip(out.iter_mut()) {
        *v = fixed_value(frame, p.offset, p.len);
    }
}

/// The `len` bytes (at most 8) at `offset` as a big-endian integer, 0
/// where the frame is shorter (as [`be_value`] over the slice reads
/// them): one 8-byte load and a shift where the frame has 8 bytes there.
#[inline]
fn fixed_value(frame: &[u8], offset: usize, len: usize) -> Value {
    match be_word(frame, offset) {
        Some(word) if len > 0 => word >> (8 * (8 - len)),
        _ => frame.get(offset..offset + len).map_or(0, be_value),
    }
}

/// The eight bytes at `offset` as a big-endian integer, if the frame has them.
#[inline]
fn be_word(frame: &[u8], offset: usize) -> Option<u64> {
    let b = frame.get(offset..)?.first_chunk::<8>()?;
    Some(u64::from_be_bytes(*b))
}

/// Up to the last eight bytes as a big-endian integer.
fn be_value(b: &[u8]) -> Value {
    let b = &b[b.len().saturating_sub(8)..];
    b.iter().fold(0, |v, &x| (v << 8) | x as Value)
}

/// Writes `value` big-endian into `len` bytes at `offset` (its low bytes),
/// if the frame is long enough.
pub fn write_field(frame: &mut [u8], offset: usize, len: usize, value: Value) {
    if let Some(dst) = frame.get_mut(offset..offset + len) {
        for (i, b) in dst.iter_mut().rev().enumerate() {
            *b = if i < 8 { (value >> (8 * i)) as u8 } else { 0 };
        }
    }
}

/// Where `setField` writes a field, if it has a byte offset.
pub fn write_place(source: &FieldSource) -> Option<(usize, usize)> {
    match source {
        FieldSource::Unit {
            at: Some((o, l)), ..
        } => Some((*o as usize, *l as usize)),
        FieldSource::Bytes { offset, len } => Some((*offset as usize, *len as usize)),
        FieldSource::Unit { at: None, .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mapped_field_is_in_the_packet_unit() {
        let defs: Vec<FieldDef> = XL_FIELDS
            .iter()
            .map(|r| FieldDef {
                name: r.xl.into(),
                source: r.source(),
            })
            .collect();
        FieldReader::new(&defs).unwrap();
    }

    #[test]
    fn a_field_the_grammar_lacks_is_named() {
        let defs = vec![FieldDef {
            name: "ipv4.flowlabel".into(),
            source: FieldSource::Unit {
                field: "ip_flow_label",
                bytes: false,
                at: None,
            },
        }];
        let e = FieldReader::new(&defs).err().unwrap();
        assert!(
            e.to_string()
                .contains("`ipv4.flowlabel` maps to `ip_flow_label`"),
            "{e}"
        );
    }

    #[test]
    fn write_then_read_bytes() {
        let mut frame = [0u8; 4];
        write_field(&mut frame, 1, 2, 0xabcd);
        assert_eq!(frame, [0, 0xab, 0xcd, 0]);
        assert_eq!(be_value(&frame[1..3]), 0xabcd);
    }
}
