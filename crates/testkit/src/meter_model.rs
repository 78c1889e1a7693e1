//! Plain Rust models of the metering and Bloom filter packet examples,
//! for their property tests.
//!
//! `examples/packets/policer.flick` and `examples/packets/new_flows.flick`
//! written by hand over [`packet_model`](crate::packet_model)'s parsing and
//! keys: a token bucket per source kept as the nanosecond its bucket is
//! full again (GCRA), and a Bloom filter whose bit positions are the ones
//! Flick's filters use (FNV-1a of the encoded key, mixed by SplitMix64's
//! finaliser, double hashing), so false positives agree too.

use crate::packet_model::{fnv1a, parse, Key};
use hashbrown::HashMap;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// A single-rate two-colour token bucket: `rate` tokens a second, `burst`
/// deep, in packet time (nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub rate: u64,
    pub burst: u64,
}

impl Bucket {
    fn cost(&self, n: u64) -> u64 {
        (n as u128 * NANOS_PER_SEC).div_ceil(self.rate as u128) as u64
    }

    /// Whether `n` tokens fit at `now`, with the bucket full again at
    /// `full_at`; and the new `full_at`.
    pub fn take(&self, full_at: u64, now: u64, n: u64) -> (bool, u64) {
        let after = full_at.max(now) + self.cost(n);
        if after - now <= self.cost(self.burst) {
            (true, after)
        } else {
            (false, full_at)
        }
    }

    /// Tokens held at `now`, rounded down.
    pub fn tokens(&self, full_at: u64, now: u64) -> u64 {
        let owed = full_at.saturating_sub(now) as u128;
        let missing = (owed * self.rate as u128).div_ceil(NANOS_PER_SEC) as u64;
        self.burst.saturating_sub(missing)
    }
}

/// The policer example's bucket: 125000 bytes a second, 3000 deep.
pub const POLICER: Bucket = Bucket {
    rate: 125_000,
    burst: 3000,
};

/// `examples/packets/policer.flick`: per source address, a frame passes
/// if its bucket holds its length; frames that are not IP pass.
pub struct Policer {
    pub bucket: Bucket,
    /// Per source (`src_key`), when its bucket is full again.
    pub sources: HashMap<Key, u64>,
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

    /// Whether the frame, stamped `ts` (ns), passes.
    pub fn frame(&mut self, frame: &[u8], ts: u64) -> bool {
        self.now = self.now.max(ts);
        let h = parse(frame);
        if h.ip == 0 {
            return true;
        }
        let key = Key::source(&h);
        let full_at = self.sources.get(&key).copied().unwrap_or(0);
        let (green, next) = self.bucket.take(full_at, self.now, frame.len() as u64);
        if next != full_at {
            self.sources.insert(key, next);
        }
        if !green {
            self.red += 1;
        }
        green
    }

    /// Per source, the tokens its bucket holds at the latest frame.
    pub fn tokens(&self) -> impl Iterator<Item = (&Key, u64)> + '_ {
        self.sources
            .iter()
            .map(|(k, t)| (k, self.bucket.tokens(*t, self.now)))
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
    fn a_bucket_passes_its_burst_then_its_rate() {
        let b = Bucket {
            rate: 1000,
            burst: 1500,
        };
        let now = 5_000_000_000;
        let (ok, t) = b.take(0, now, 1500);
        assert!(ok);
        assert_eq!(b.take(t, now, 1), (false, t));
        assert!(b.take(t, now + 1_000_000, 1).0);
        assert_eq!(b.tokens(t, now + 500_000_000), 500);
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
