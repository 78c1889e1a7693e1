//! Hadoop IFile streams of word-count map output (`Text` keys,
//! `IntWritable` values), read and written by hand: the shared part of the
//! hand-written combiner (`ifile-combiner`) and of the load driver
//! (`ifile-driver`) that `bench/run.sh` uses to measure Flick's Hadoop
//! aggregator (`examples/hadoop_wordcount.flick`) against it.
//!
//! Layout, as `IFile.Writer` writes it with no codec:
//!
//! ```text
//! file    := record* EOF trailer
//! record  := VInt(keyLen) VInt(valueLen) key[keyLen] value[valueLen]
//! EOF     := VInt(-1) VInt(-1)                  = ff ff
//! trailer := CRC32 (zlib polynomial) of every byte before it, big-endian
//! ```
//!
//! Key bytes are a serialised `Text` (VInt byte count, then UTF-8), value
//! bytes an `IntWritable` (4 bytes, big-endian). Keys are ordered as
//! `Text.Comparator` orders them: unsigned bytes of the UTF-8 payload,
//! shorter prefix first, with the VInt length prefix skipped.

use std::cmp::Ordering;
use std::io::{self, Read, Write};
use std::ops::Range;

/// Largest key a stream may carry; the same bound as Flick's
/// `hadoop_ifile` grammar, so both systems reject the same inputs.
pub const MAX_KEY_LEN: usize = 64 * 1024;

/// `WritableUtils.writeVLong`: one byte for -112..=127, otherwise a length
/// byte and the magnitude (ones' complement when negative), big-endian.
pub fn write_vint(out: &mut Vec<u8>, v: i64) {
    if (-112..=127).contains(&v) {
        out.push(v as u8);
        return;
    }
    let (magnitude, base) = if v < 0 { (!v, -120i32) } else { (v, -112i32) };
    let bytes = 8 - (magnitude.leading_zeros() as usize) / 8;
    out.push((base - bytes as i32) as u8);
    for i in (0..bytes).rev() {
        out.push((magnitude >> (8 * i)) as u8);
    }
}

/// `WritableUtils.decodeVIntSize`: the encoded size, from the first byte.
pub fn vint_size(first: u8) -> usize {
    let b = first as i8;
    if b >= -112 {
        1
    } else if b < -120 {
        (-119 - b as i32) as usize
    } else {
        (-111 - b as i32) as usize
    }
}

/// `WritableUtils.readVLong` from the start of `s`: the value and the bytes
/// it took, or `None` when `s` ends inside it.
pub fn read_vint(s: &[u8]) -> Option<(i64, usize)> {
    let first = *s.first()?;
    let size = vint_size(first);
    if size == 1 {
        return Some((first as i8 as i64, 1));
    }
    let tail = s.get(1..size)?;
    let v = tail.iter().fold(0i64, |acc, &b| (acc << 8) | b as i64);
    Some((if (first as i8) < -120 { !v } else { v }, size))
}

/// The UTF-8 bytes of a serialised `Text` (its VInt length prefix skipped).
pub fn text_payload(key: &[u8]) -> &[u8] {
    match key.first() {
        Some(&b) => &key[vint_size(b).min(key.len())..],
        None => key,
    }
}

/// `Text.Comparator.compare` on two serialised `Text` keys.
pub fn text_cmp(a: &[u8], b: &[u8]) -> Ordering {
    text_payload(a).cmp(text_payload(b))
}

/// What the bytes at the read position hold.
enum Parsed {
    Record {
        key: Range<usize>,
        value: i32,
        len: usize,
    },
    End {
        checksum: u32,
    },
    Incomplete,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn parse_record(s: &[u8]) -> io::Result<Parsed> {
    let Some((key_len, a)) = read_vint(s) else {
        return Ok(Parsed::Incomplete);
    };
    let Some((value_len, b)) = read_vint(&s[a..]) else {
        return Ok(Parsed::Incomplete);
    };
    let head = a + b;
    if key_len == -1 && value_len == -1 {
        return Ok(match s.get(head..head + 4) {
            Some(c) => Parsed::End {
                checksum: u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
            },
            None => Parsed::Incomplete,
        });
    }
    if key_len < 1 || key_len as usize > MAX_KEY_LEN || value_len != 4 {
        return Err(invalid(format!(
            "not a Text/IntWritable record: key length {key_len}, value length {value_len}"
        )));
    }
    let key = head..head + key_len as usize;
    let len = key.end + 4;
    let Some(v) = s.get(key.end..len) else {
        return Ok(Parsed::Incomplete);
    };
    Ok(Parsed::Record {
        key,
        value: i32::from_be_bytes([v[0], v[1], v[2], v[3]]),
        len,
    })
}

/// Reads the records of one IFile stream through its own buffer, so that
/// the current key is a slice of that buffer: no copy or allocation per
/// record.
pub struct RecordReader<R> {
    src: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    key: Range<usize>,
    value: i32,
    done: bool,
    bytes_read: u64,
}

impl<R: Read> RecordReader<R> {
    pub fn new(src: R) -> Self {
        RecordReader {
            src,
            buf: vec![0; 256 * 1024],
            start: 0,
            end: 0,
            key: 0..0,
            value: 0,
            done: false,
            bytes_read: 0,
        }
    }

    /// Moves to the next record; false once the stream has ended (end
    /// marker, or the connection closed between records). The trailer's
    /// CRC is not checked: Flick's aggregator reads it without checking
    /// too, and the benchmark compares like with like.
    pub fn advance(&mut self) -> io::Result<bool> {
        if self.done {
            return Ok(false);
        }
        loop {
            match parse_record(&self.buf[self.start..self.end])? {
                Parsed::Record { key, value, len } => {
                    self.key = self.start + key.start..self.start + key.end;
                    self.value = value;
                    self.start += len;
                    return Ok(true);
                }
                Parsed::End { .. } => {
                    self.done = true;
                    return Ok(false);
                }
                Parsed::Incomplete => {
                    if !self.refill()? {
                        if self.start == self.end {
                            self.done = true;
                            return Ok(false);
                        }
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "stream ended inside a record",
                        ));
                    }
                }
            }
        }
    }

    /// The current record's key (a serialised `Text`), valid until the
    /// next `advance`.
    pub fn key(&self) -> &[u8] {
        &self.buf[self.key.clone()]
    }

    pub fn value(&self) -> i32 {
        self.value
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    pub fn into_inner(self) -> R {
        self.src
    }

    /// Moves the unread bytes to the front and reads more; false at EOF.
    fn refill(&mut self) -> io::Result<bool> {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            // Only a record longer than the buffer gets here.
            self.buf.resize(self.buf.len() * 2, 0);
        }
        loop {
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.end += n;
                    self.bytes_read += n as u64;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Writes an IFile stream: records into a buffer that is checksummed as a
/// whole and written when it fills, then the end marker and the CRC32.
pub struct IFileWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
    crc: crc32fast::Hasher,
    bytes: u64,
}

const WRITE_CHUNK: usize = 256 * 1024;

impl<W: Write> IFileWriter<W> {
    pub fn new(out: W) -> Self {
        IFileWriter {
            out,
            buf: Vec::with_capacity(WRITE_CHUNK + MAX_KEY_LEN + 32),
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        }
    }

    /// One record: `key` is a serialised `Text`, `value` an `IntWritable`.
    pub fn record(&mut self, key: &[u8], value: i32) -> io::Result<()> {
        write_vint(&mut self.buf, key.len() as i64);
        write_vint(&mut self.buf, 4);
        self.buf.extend_from_slice(key);
        self.buf.extend_from_slice(&value.to_be_bytes());
        if self.buf.len() >= WRITE_CHUNK {
            self.flush_buf()?;
        }
        Ok(())
    }

    fn flush_buf(&mut self) -> io::Result<()> {
        self.crc.update(&self.buf);
        self.out.write_all(&self.buf)?;
        self.bytes += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes the end marker and the trailer; returns the sink and the
    /// number of bytes written.
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        self.buf.extend_from_slice(&[0xff, 0xff]);
        self.crc.update(&self.buf);
        let checksum = self.crc.clone().finalize();
        self.buf.extend_from_slice(&checksum.to_be_bytes());
        self.out.write_all(&self.buf)?;
        self.bytes += self.buf.len() as u64;
        self.out.flush()?;
        Ok((self.out, self.bytes))
    }
}

/// A whole IFile stream held in memory, checked: the records (key as a
/// range of the bytes, value), in order.
pub struct ParsedFile {
    pub records: Vec<(Range<usize>, i32)>,
}

/// Parses a complete IFile stream and checks its end marker, that nothing
/// follows the trailer, and the CRC32.
pub fn parse_file(bytes: &[u8]) -> Result<ParsedFile, String> {
    let mut at = 0;
    let mut records = Vec::new();
    loop {
        match parse_record(&bytes[at..]).map_err(|e| format!("at byte {at}: {e}"))? {
            Parsed::Record { key, value, len } => {
                records.push((at + key.start..at + key.end, value));
                at += len;
            }
            Parsed::End { checksum } => {
                let trailer_at = at + 2;
                if trailer_at + 4 != bytes.len() {
                    return Err(format!(
                        "{} bytes after the trailer",
                        bytes.len() - trailer_at - 4
                    ));
                }
                let actual = crc32fast::hash(&bytes[..trailer_at]);
                if actual != checksum {
                    return Err(format!(
                        "CRC32 mismatch: trailer {checksum:08x}, bytes give {actual:08x}"
                    ));
                }
                return Ok(ParsedFile { records });
            }
            Parsed::Incomplete => {
                return Err(format!("stream ends at byte {at} without the end marker"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vints_match_hadoop_encodings() {
        for (v, want) in [
            (-1i64, vec![0xff]),
            (17, vec![0x11]),
            (128, vec![0x8f, 0x80]),
            (300, vec![0x8e, 0x01, 0x2c]),
            (70000, vec![0x8d, 0x01, 0x11, 0x70]),
            (-113, vec![0x87, 0x70]),
        ] {
            let mut out = Vec::new();
            write_vint(&mut out, v);
            assert_eq!(out, want, "{v}");
            assert_eq!(read_vint(&out), Some((v, want.len())));
        }
    }

    #[test]
    fn text_order_skips_the_length_prefix() {
        // "aa" < "b" as Text, though the serialised "b" (01 62) sorts first.
        assert_eq!(text_cmp(&[2, b'a', b'a'], &[1, b'b']), Ordering::Less);
        assert_eq!(text_cmp(&[1, b'a'], &[2, b'a', b'a']), Ordering::Less);
    }

    #[test]
    fn written_streams_read_back() {
        let mut w = IFileWriter::new(Vec::new());
        w.record(&[3, b'c', b'a', b't'], 35).unwrap();
        w.record(&[3, b'd', b'o', b'g'], -2).unwrap();
        let (bytes, n) = w.finish().unwrap();
        assert_eq!(n as usize, bytes.len());
        let parsed = parse_file(&bytes).unwrap();
        assert_eq!(parsed.records.len(), 2);
        assert_eq!(parsed.records[1].1, -2);

        let mut r = RecordReader::new(&bytes[..]);
        assert!(r.advance().unwrap());
        assert_eq!(r.key(), &[3, b'c', b'a', b't']);
        assert!(r.advance().unwrap());
        assert_eq!(r.value(), -2);
        assert!(!r.advance().unwrap());
    }

    #[test]
    fn an_empty_stream_is_marker_and_checksum() {
        let (bytes, _) = IFileWriter::new(Vec::new()).finish().unwrap();
        assert_eq!(bytes, [0xff, 0xff, 0xff, 0xff, 0x00, 0x00]);
    }
}
