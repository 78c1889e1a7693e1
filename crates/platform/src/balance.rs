//! `least_connections(chans)`: per element of each channel array bound to
//! peers (`--connect`), how many live instances use it, shared by every
//! worker of the service. An instance counts towards an element from its
//! first message sent there until it ends; each instance remembers which
//! elements it counts towards in a bitset kept with its graph's storage,
//! so counting allocates nothing per connection.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// The counts of one service, made when it starts.
#[derive(Debug, Default)]
pub struct Balance {
    /// Per process channel: where its elements start in `counts`, and how
    /// many there are (0 for channels that are not counted).
    ranges: Vec<(u32, u32)>,
    counts: Box<[AtomicU32]>,
    /// Where the next choice starts looking, so that elements with equal
    /// counts take turns.
    turn: AtomicUsize,
}

impl Balance {
    /// Counts for the channel arrays given as (channel, elements), among
    /// `channels` process channels.
    pub fn new(channels: usize, arrays: impl IntoIterator<Item = (usize, u32)>) -> Balance {
        let mut ranges = vec![(0, 0); channels];
        let mut total = 0u32;
        for (chan, n) in arrays {
            if let Some(r) = ranges.get_mut(chan) {
                *r = (total, n);
                total += n;
            }
        }
        Balance {
            ranges,
            counts: (0..total).map(|_| AtomicU32::new(0)).collect(),
            turn: AtomicUsize::new(0),
        }
    }

    /// Words of the bitset an instance keeps (see [`Balance::sent`]).
    pub fn words(&self) -> usize {
        self.counts.len().div_ceil(64)
    }

    fn slot(&self, chan: u16, index: u32) -> Option<usize> {
        let &(start, n) = self.ranges.get(chan as usize)?;
        (index < n).then_some((start + index) as usize)
    }

    /// The element of `chan` whose peer serves the fewest live instances;
    /// among equals, the first from a starting point that moves on each
    /// call. `None` if `chan` is not counted.
    pub fn least(&self, chan: u16) -> Option<u64> {
        let &(start, n) = self.ranges.get(chan as usize)?;
        if n == 0 {
            return None;
        }
        let n = n as usize;
        let from = self.turn.fetch_add(1, Ordering::Relaxed) % n;
        let counts = &self.counts[start as usize..start as usize + n];
        let mut best = (u32::MAX, from);
        for k in 0..n {
            let i = (from + k) % n;
            let c = counts[i].load(Ordering::Acquire);
            if c < best.0 {
                best = (c, i);
            }
        }
        Some(best.1 as u64)
    }

    /// An instance whose bitset is `mine` sent a message to `chan[index]`:
    /// the first time, it counts towards that element.
    pub fn sent(&self, mine: &mut [u64], chan: u16, index: u32) {
        let Some(s) = self.slot(chan, index) else {
            return;
        };
        let Some(word) = mine.get_mut(s / 64) else {
            return;
        };
        let bit = 1u64 << (s % 64);
        if *word & bit == 0 {
            *word |= bit;
            self.counts[s].fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The instance whose bitset is `mine` ended: it counts towards no
    /// element any more. Clears `mine`, so a second call does nothing.
    pub fn ended(&self, mine: &mut [u64]) {
        for (w, word) in mine.iter_mut().enumerate() {
            let mut bits = std::mem::take(word);
            while bits != 0 {
                let s = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if let Some(c) = self.counts.get(s) {
                    c.fetch_sub(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// Instances counted towards `chan[index]` now.
    #[cfg(test)]
    fn count(&self, chan: u16, index: u32) -> u32 {
        self.slot(chan, index)
            .map_or(0, |s| self.counts[s].load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_loaded_element_is_chosen_and_equals_take_turns() {
        // Channel 0 is the client; channel 1 an array of three peers.
        let b = Balance::new(2, [(1, 3)]);
        assert_eq!(b.least(0), None, "the client is not counted");
        let mut seen = std::collections::HashSet::new();
        for _ in 0..3 {
            seen.insert(b.least(1).unwrap());
        }
        assert_eq!(seen.len(), 3, "equal counts take turns: {seen:?}");
        let (mut x, mut y) = (vec![0; b.words()], vec![0; b.words()]);
        b.sent(&mut x, 1, 0);
        b.sent(&mut x, 1, 0);
        b.sent(&mut x, 1, 2);
        b.sent(&mut y, 1, 2);
        assert_eq!((b.count(1, 0), b.count(1, 1), b.count(1, 2)), (1, 0, 2));
        for _ in 0..4 {
            assert_eq!(b.least(1), Some(1));
        }
        b.ended(&mut x);
        b.ended(&mut x);
        assert_eq!((b.count(1, 0), b.count(1, 1), b.count(1, 2)), (0, 0, 1));
        b.ended(&mut y);
        assert_eq!(b.count(1, 2), 0);
    }

    #[test]
    fn more_than_64_elements_fit_the_bitset() {
        let b = Balance::new(3, [(1, 2), (2, 100)]);
        let mut x = vec![0; b.words()];
        assert_eq!(x.len(), 2);
        b.sent(&mut x, 2, 99);
        b.sent(&mut x, 1, 1);
        assert_eq!((b.count(2, 99), b.count(1, 1)), (1, 1));
        b.ended(&mut x);
        assert_eq!((b.count(2, 99), b.count(1, 1)), (0, 0));
    }
}
