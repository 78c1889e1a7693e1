//! Plain Rust models of the metering and Bloom filter packet examples,
//! for their property tests.
//!
//! `examples/packets/policer.flick` and `examples/packets/new_flows.flick`
//! written by hand over [`packet_model`](crate::packet_model)'s parsing and
//! keys: an RFC 2697 three-colour meter per source, its committed bucket
//! kept as the nanosecond it is full again (GCRA) and its excess bucket as
//! the nanoseconds it then takes to fill, and a Bloom filter whose bit positions are the ones
//! Flick's filters use (FNV-1a of the encoded key, mixed by SplitMix64's
//! finaliser, double hashing), so false positives agree too.

use crate::packet_model::{fnv1a, parse, Key};
use hashbrown::HashMap;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The colours of RFC 2697's single-rate three-colour marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    Green,
    Yellow,
    Red,
}

/// A single-rate three-colour meter (RFC 2697, colour-blind): `rate`
/// tokens a second, a committed bucket `burst` deep and an excess bucket
/// `excess` deep (0: two colours), in packet time (nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub rate: u64,
    pub burst: u64,
    pub excess: u64,
}

/// A meter's buckets as Flick keeps them: when the committed one is full
/// again, and how long the excess one then takes to fill.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Buckets {
    pub full_at: u64,
    pub excess_owed: u64,
}

impl Bucket {
    fn cost(&self, n: u64) -> u64 {
        (n as u128 * NANOS_PER_SEC).div_ceil(self.rate as u128) as u64
    }

    /// The colour of `n` tokens at `now`, and the buckets after.
    pub fn take(&self, b: Buckets, now: u64, n: u64) -> (Colour, Buckets) {
        let full_at = b.full_at.max(now);
        let excess_owed = b.excess_owed.saturating_sub(now.saturating_sub(b.full_at));
        let after = full_at + self.cost(n);
        if after - now <= self.cost(self.burst) {
            return (
                Colour::Green,
                Buckets {
                    full_at: after,
                    excess_owed,
                },
            );
        }
        let owed = excess_owed + self.cost(n);
        if self.excess > 0 && owed <= self.cost(self.excess) {
            return (
                Colour::Yellow,
                Buckets {
                    full_at,
                    excess_owed: owed,
                },
            );
        }
        (Colour::Red, b)
    }

    fn held(&self, owed: u64, depth: u64) -> u64 {
        let missing = (owed as u128 * self.rate as u128).div_ceil(NANOS_PER_SEC) as u64;
        depth.saturating_sub(missing)
    }

    /// Tokens held at `now` in the committed and the excess bucket,
    /// rounded down.
    pub fn tokens(&self, b: Buckets, now: u64) -> (u64, u64) {
        let excess_owed = b.excess_owed.saturating_sub(now.saturating_sub(b.full_at));
        (
            self.held(b.full_at.saturating_sub(now), self.burst),
            self.held(excess_owed, self.excess),
        )
    }
}

/// The policer example's meter: 125000 bytes a second, 3000 committed,
/// 6000 excess.
pub const POLICER: Bucket = Bucket {
    rate: 125_000,
    burst: 3000,
    excess: 6000,
};

/// The DSCP the policer gives yellow frames (CS1).
pub const YELLOW_DSCP: u8 = 8;

/// Sets an IP frame's DSCP (IPv4's type of service byte, IPv6's traffic
/// class), keeping the ECN bits; IPv4 checksums recomputed from scratch.
pub fn set_dscp(frame: &mut [u8], dscp: u8) {
    let (ethertype, ip) = match (frame.get(12..14), frame.get(16..18)) {
        (Some([0x81, 0x00]), Some(inner)) => (u16::from_be_bytes([inner[0], inner[1]]), 18),
        (Some(t), _) => (u16::from_be_bytes([t[0], t[1]]), 14),
        _ => return,
    };
    match ethertype {
        0x0800 if frame.len() >= ip + 20 => {
            frame[ip + 1] = dscp << 2 | frame[ip + 1] & 3;
            crate::packet_model::fix_checksums(frame);
        }
        0x86dd if frame.len() >= ip + 40 => {
            let tc = (frame[ip] & 0x0f) << 4 | frame[ip + 1] >> 4;
            let tc = dscp << 2 | tc & 3;
            frame[ip] = frame[ip] & 0xf0 | tc >> 4;
            frame[ip + 1] = frame[ip + 1] & 0x0f | tc << 4;
        }
        _ => {}
    }
}

/// `examples/packets/policer.flick`: per source address, a frame is
/// green (passes), yellow (passes with DSCP 8) or red (dropped); frames
/// that are not IP pass.
pub struct Policer {
    pub bucket: Bucket,
    /// Per source (`src_key`), its buckets.
    pub sources: HashMap<Key, Buckets>,
    /// Frames dropped for being over the rate.
    pub red: u64,
    /// Packet time: the latest frame's.
    pub now: u64,
}

impl Policer {
    pub fn new(bucket: Bucket) -> Policer {
        Policer {
            bucket,
            sources: HashMap::new(),
            red: 0,
            now: 0,
        }
    }

    /// The frame as it leaves, stamped `ts` (ns), or `None` if dropped.
    pub fn frame(&mut self, frame: &[u8], ts: u64) -> Option<Vec<u8>> {
        self.now = self.now.max(ts);
        let h = parse(frame);
        if h.ip == 0 {
            return Some(frame.to_vec());
        }
        let key = Key::source(&h);
        let b = self.sources.get(&key).copied().unwrap_or_default();
        let (colour, next) = self.bucket.take(b, self.now, frame.len() as u64);
        if next != b {
            self.sources.insert(key, next);
        }
        match colour {
            Colour::Green => Some(frame.to_vec()),
            Colour::Yellow => {
                let mut out = frame.to_vec();
                set_dscp(&mut out, YELLOW_DSCP);
                Some(out)
            }
            Colour::Red => {
                self.red += 1;
                None
            }
        }
    }

    /// Per source, the tokens its buckets hold at the latest frame.
    pub fn tokens(&self) -> impl Iterator<Item = (&Key, (u64, u64))> + '_ {
        self.sources
            .iter()
            .map(|(k, b)| (k, self.bucket.tokens(*b, self.now)))
    }
}

/// A Bloom filter as Flick keeps one.
pub struct Bloom {
    pub words: Vec<u64>,
    pub hashes: u32,
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Bloom {
    /// `bits` rounded up to whole 64-bit words.
    pub fn new(bits: u64, hashes: u32) -> Bloom {
        Bloom {
            words: vec![0; bits.div_ceil(64) as usize],
            hashes,
        }
    }

    fn positions(&self, key: &[u8]) -> Vec<usize> {
        let h1 = mix64(fnv1a(key));
        let h2 = mix64(h1 ^ 0x9e37_79b9_7f4a_7c15) | 1;
        let bits = self.words.len() as u64 * 64;
        (0..self.hashes as u64)
            .map(|i| (h1.wrapping_add(i.wrapping_mul(h2)) % bits) as usize)
            .collect()
    }

    pub fn add(&mut self, key: &[u8]) {
        for at in self.positions(key) {
            self.words[at / 64] |= 1 << (at % 64);
        }
    }

    pub fn has(&self, key: &[u8]) -> bool {
        self.positions(key)
            .iter()
            .all(|&at| self.words[at / 64] & (1 << (at % 64)) != 0)
    }

    pub fn bits(&self) -> u64 {
        self.words.len() as u64 * 64
    }

    pub fn set(&self) -> u64 {
        self.words.iter().map(|w| w.count_ones() as u64).sum()
    }
}

/// A string key as Flick's state encodes it (a tag byte, then the bytes).
pub fn encoded_string_key(bytes: &[u8]) -> Vec<u8> {
    let mut k = vec![2];
    k.extend_from_slice(bytes);
    k
}

/// `examples/packets/new_flows.flick`: whether an IP frame's 5-tuple is
/// new to the filter (then added).
pub struct NewFlows {
    pub seen: Bloom,
}

impl NewFlows {
    pub fn new(bits: u64, hashes: u32) -> NewFlows {
        NewFlows {
            seen: Bloom::new(bits, hashes),
        }
    }

    /// Whether the frame goes to `new` (it always goes to `out`).
    pub fn frame(&mut self, frame: &[u8]) -> bool {
        let h = parse(frame);
        if h.ip == 0 {
            return false;
        }
        let key = encoded_string_key(&Key::five(&h).packed());
        if self.seen.has(&key) {
            return false;
        }
        self.seen.add(&key);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_passes_its_burst_then_its_excess_then_its_rate() {
        let b = Bucket {
            rate: 1000,
            burst: 1500,
            excess: 500,
        };
        let now = 5_000_000_000;
        let (c, t) = b.take(Buckets::default(), now, 1500);
        assert_eq!(c, Colour::Green);
        let (c, t) = b.take(t, now, 400);
        assert_eq!(c, Colour::Yellow);
        assert_eq!(b.take(t, now, 101), (Colour::Red, t));
        assert_eq!(b.take(t, now + 1_000_000, 1).0, Colour::Green);
        assert_eq!(b.tokens(t, now + 500_000_000), (500, 100));
        assert_eq!(b.tokens(t, now + 2_000_000_000), (1500, 500));
    }

    #[test]
    fn a_bloom_filter_has_what_it_was_given() {
        let mut f = Bloom::new(1000, 3);
        assert_eq!(f.bits(), 1024);
        for k in 0..100u32 {
            f.add(&k.to_be_bytes());
        }
        assert!((0..100u32).all(|k| f.has(&k.to_be_bytes())));
        assert!(f.set() <= 300);
    }
}
