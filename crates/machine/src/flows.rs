//! The flow context table: bounded cuckoo hashing with a stash.
//!
//! A key has two candidate buckets of [`BUCKET`] slots; a lookup reads at
//! most those two buckets and the [`STASH`], so it takes constant time
//! whatever the load. An insertion that finds both buckets full searches
//! (breadth first, at most [`MAX_SEARCH`] slots) for a chain of entries to
//! move to their other bucket, then falls back to the stash, then to the
//! eviction policy. A slot's state, timestamps, key and registers lie
//! together in one record of a flat array (a lookup that finds its key
//! then reads one place, not three arrays), beside a dense array of 16-bit
//! tags, a bucket's four in one word: a lookup loads both of its buckets'
//! words at once (their cache misses overlap), finds the slots whose tag
//! matches with a few word operations, and reads a record only there.
//! Both are made once: nothing is allocated after [`FlowTable::new`].
//!
//! Written here rather than taken from a crate: the table must hand out
//! slot numbers (registers are kept beside it), evict by the machine's
//! timeouts and report a full table, which general maps do not do.

use crate::model::{Eviction, Value, MAX_KEY};

/// Slots per bucket.
pub const BUCKET: usize = 4;
/// Slots in the stash, for keys whose buckets and moves are all full.
pub const STASH: usize = 8;
// Tags are kept a bucket to a word, the stash's too.
const _: () = assert!(STASH.is_multiple_of(BUCKET) && BUCKET * 16 == 64);
/// Slots visited looking for a chain of moves.
pub const MAX_SEARCH: usize = 256;

/// A context's bookkeeping beside its key and registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub used: bool,
    pub state: u16,
    /// Microseconds, from packet timestamps.
    pub created: u64,
    pub last: u64,
}

/// Idle and hard timeouts, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub idle: Option<u64>,
    pub hard: Option<u64>,
}

/// Why a context expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    Idle,
    Hard,
}

impl Timeouts {
    /// The hard timeout first: it ends a context however busy.
    pub fn expiry(&self, m: &Meta, now: u64) -> Option<Expiry> {
        if self.hard.is_some_and(|h| now.saturating_sub(m.created) > h) {
            Some(Expiry::Hard)
        } else if self.idle.is_some_and(|i| now.saturating_sub(m.last) > i) {
            Some(Expiry::Idle)
        } else {
            None
        }
    }
}

/// Where an insertion put the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// A free slot (maybe after moving others).
    Free(usize),
    /// The slot of a context evicted for it.
    Evicted(usize),
}

/// Where a key's slots are: its two buckets and its tag. It depends on
/// the key and the table's size only, so one computed for a lookup serves
/// the insertion after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Place {
    b1: usize,
    b2: usize,
    tag: u16,
}

impl Place {
    /// The place of buckets `b1`, `b2` and tag `tag`, as
    /// [`FlowTable::place`] gives it (for generated code, which computes
    /// it the same way).
    pub(crate) fn of(b1: usize, b2: usize, tag: u16) -> Place {
        Place { b1, b2, tag }
    }
}

/// No slot could be found or freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableFull;

/// See [`FlowTable::raw`].
pub(crate) struct RawTable {
    pub tags: *mut u64,
    pub alts: *mut u32,
    pub records: *mut Value,
    pub summary: *const u32,
    pub probe: usize,
    pub in_stash: usize,
    /// The whole summary, each key word's counters, and how many of each
    /// word's are not zero, and the table's length: what code that
    /// inserts counts its key into.
    pub counters: *mut u32,
    pub nonzero: *mut u32,
    pub len: *mut usize,
}

pub struct FlowTable {
    key_len: usize,
    regs: usize,
    mask: usize,
    /// Slots: `buckets * BUCKET` in buckets, then the stash; each a
    /// record of `stride` words from `base`: state, created, last, key,
    /// registers, then padding up to a whole power of two (or multiple
    /// of 8) words, so that with `base` on a cache line's start a record
    /// lies in as few lines as its size allows. A record across two lines
    /// is two misses per lookup (the balancer's seven words, or a
    /// four-word record 16 bytes off a line, as an allocation's start
    /// lies, were one in two or most of them).
    records: Vec<Value>,
    base: usize,
    stride: usize,
    /// Per slot, 16 bits of its key's hash (never 0), or 0 when free,
    /// [`BUCKET`] slots to a word (the stash is whole words too): a lookup
    /// reads a bucket's tags (small and dense, so mostly cached) and a
    /// record only where a tag matches.
    tags: Vec<u64>,
    /// Per bucket slot, the other bucket of its key: the search for moves
    /// reads it rather than hashing each key it passes (a record, not in
    /// cache, per slot searched).
    alts: Vec<u32>,
    len: usize,
    /// Used slots in the stash: a lookup reads the stash only when some
    /// are.
    in_stash: usize,
    /// Breadth-first search: (slot, parent node), reused.
    search: Vec<(u32, u32)>,
    /// Per key word, [`SUMMARY`] counters: how many keys held have a
    /// value of that word that falls on each (see [`FlowTable::absent`]).
    summary: Vec<u32>,
    /// Per key word, its counters that are not zero.
    nonzero: [u32; MAX_KEY],
    /// The key word whose counters are fewest not zero: the one most
    /// likely to tell a key absent.
    probe: usize,
}

/// Counters per key word in a table's summary: 16 KiB a word, so that a
/// few words' stay in the nearer caches.
pub const SUMMARY: usize = 1 << 12;

/// What a key word is multiplied by before its top bits pick its
/// summary counter (generated code uses it too).
pub(crate) const SUMMARY_MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// Where a key word's value falls among its [`SUMMARY`] counters.
#[inline(always)]
pub(crate) fn summary_index(w: Value) -> usize {
    (w.wrapping_mul(SUMMARY_MUL) >> (64 - SUMMARY.trailing_zeros())) as usize
}

fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// A key's hash with `seed`: deterministic, so tables and steering are the
/// same from run to run.
pub fn hash_key(key: &[Value], seed: u64) -> u64 {
    let mut h = seed;
    for &w in key {
        h = mix(h ^ w).wrapping_add(0x9e37_79b9_7f4a_7c15);
    }
    mix(h)
}

/// The 128-bit product of `a` and `b`, its halves folded together: every
/// bit of the result depends on every bit of both.
#[inline(always)]
fn fold_mul(a: u64, b: u64) -> u64 {
    let m = a as u128 * b as u128;
    m as u64 ^ (m >> 64) as u64
}

/// Per word of a key, what it is mixed with (odd, high bits set, so no
/// field value cancels one), then the final multiplier.
pub(crate) const TABLE_SEEDS: [u64; MAX_KEY + 1] = [
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7345,
    0xa409_3822_299f_31d1,
    0x082e_fa98_ec4e_6c89,
    0x4528_21e6_38d0_1377,
    0xbe54_66cf_34e9_0c6d,
    0xc0ac_29b7_c97c_50dd,
    0x3f84_d5b5_b547_0917,
    0x9216_d5d9_8979_fb1b,
];

/// The table's hash of a key: words taken in pairs, each pair one folded
/// multiplication with seeds of its place (so keys whose pairs are
/// swapped, a reply's key against its request's, differ), the pairs
/// combined and folded once more. The pairs' multiplications do not
/// wait on each other, so a four-word key is hashed in two
/// multiplications' time, where [`hash_key`]'s chain takes five rounds
/// of its mix: the lookup's address, which every miss waits on, is known
/// sooner.
#[inline(always)]
pub(crate) fn table_hash(key: &[Value]) -> u64 {
    let mut h = key.len() as u64;
    let mut pairs = key.chunks_exact(2);
    for (i, p) in pairs.by_ref().enumerate() {
        h ^= fold_mul(p[0] ^ TABLE_SEEDS[2 * i], p[1] ^ TABLE_SEEDS[2 * i + 1]);
    }
    if let [w] = pairs.remainder() {
        let i = key.len() - 1;
        h ^= fold_mul(w ^ TABLE_SEEDS[i], TABLE_SEEDS[i + 1]);
    }
    fold_mul(h ^ TABLE_SEEDS[MAX_KEY], TABLE_SEEDS[0])
}

/// The high bit of each 16-bit lane of `word` whose tag is `tag`, exactly
/// (no false matches: a carry never crosses lanes).
#[inline]
fn matching_lanes(word: u64, tag: u16) -> u64 {
    const LOW: u64 = 0x7fff_7fff_7fff_7fff;
    const HIGH: u64 = 0x8000_8000_8000_8000;
    let x = word ^ (tag as u64).wrapping_mul(0x0001_0001_0001_0001);
    !(((x & LOW).wrapping_add(LOW)) | x) & HIGH
}
/// Words of a record before its key: state, created, last.
pub const META_WORDS: usize = 3;
/// Words in a cache line.
const LINE_WORDS: usize = 8;

/// Asks the kernel to back the whole 2 MiB pages inside `v` with huge
/// pages (where it does so only when asked). A lookup lands anywhere in
/// a table of tens of megabytes: with 4 KiB pages nearly every one also
/// misses the TLB and walks the page tables; a huge page covers 512
/// times more. Called before the pages are first touched; advice only,
/// so a refusal changes nothing but speed.
fn advise_huge_pages<T>(v: &[T]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_ptr() as usize;
        let end = start + std::mem::size_of_val(v);
        let (from, to) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
        if to > from {
            // SAFETY: madvise changes no memory's contents; the range lies
            // inside `v`'s allocation, which outlives the call.
            unsafe {
                libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

/// Writes one word of every 4 KiB page of `v`, so the kernel backs (and
/// zeroes) all of it now, huge pages where advised, rather than on the
/// first packet to touch each page: a table's memory is taken when it is
/// made, and no packet waits on a page fault (at 2^20 slots, zeroing the
/// pages as lookups first reached them was more than half the engine's
/// time over a million frames). Volatile, since the words are zero
/// already and a plain store of zero could be left out.
fn touch_pages(v: &mut [Value]) {
    const PAGE_WORDS: usize = 4096 / std::mem::size_of::<Value>();
    for i in (0..v.len()).step_by(PAGE_WORDS) {
        // SAFETY: `i` is in bounds; a volatile write of a valid value.
        unsafe { std::ptr::write_volatile(v.as_mut_ptr().add(i), 0) };
    }
}

/// How a table for `capacity` contexts is laid out.
struct Layout {
    buckets: usize,
    slots: usize,
    /// Words per record.
    stride: usize,
}

impl Layout {
    fn of(capacity: usize, key_len: usize, regs: usize) -> Layout {
        let buckets = capacity.div_ceil(BUCKET).max(2).next_power_of_two();
        let words = META_WORDS + key_len + regs;
        Layout {
            buckets,
            slots: buckets * BUCKET + STASH,
            stride: if words <= LINE_WORDS {
                words.next_power_of_two()
            } else {
                words.next_multiple_of(LINE_WORDS)
            },
        }
    }
}

impl FlowTable {
    /// The bytes [`FlowTable::new`] allocates for these arguments: records
    /// with their padding, tags, alternate buckets, the key summary and the
    /// search queue. What a table holds at most, for memory budgets.
    pub fn bytes_for(capacity: usize, key_len: usize, regs: usize) -> usize {
        let Layout { slots, stride, .. } = Layout::of(capacity, key_len, regs);
        8 * (slots * stride + LINE_WORDS - 1)
            + 8 * (slots / BUCKET)
            + 4 * slots
            + 4 * key_len * SUMMARY
            + std::mem::size_of::<(u32, u32)>() * (MAX_SEARCH + 2 * BUCKET)
    }

    /// A table for at least `capacity` contexts (whole buckets, a power of
    /// two of them, plus the stash) of `key_len` key words and `regs`
    /// registers.
    pub fn new(capacity: usize, key_len: usize, regs: usize) -> FlowTable {
        let Layout {
            buckets,
            slots,
            stride,
        } = Layout::of(capacity, key_len, regs);
        let records: Vec<Value> = vec![0; slots * stride + LINE_WORDS - 1];
        let base = records
            .as_ptr()
            .align_offset(LINE_WORDS * 8)
            .min(LINE_WORDS - 1);
        let table = FlowTable {
            key_len,
            regs,
            mask: buckets - 1,
            records,
            base,
            stride,
            tags: vec![0; slots / BUCKET],
            alts: vec![0; slots],
            len: 0,
            in_stash: 0,
            search: Vec::with_capacity(MAX_SEARCH + 2 * BUCKET),
            summary: vec![0; key_len * SUMMARY],
            nonzero: [0; MAX_KEY],
            probe: 0,
        };
        advise_huge_pages(&table.records);
        advise_huge_pages(&table.tags);
        table
    }

    /// Takes every page of the table now (see [`touch_pages`]), so that no
    /// lookup or insertion waits on the kernel zeroing one. The engine
    /// does this for the tables it runs; a table made only to be sized,
    /// or filled slowly, need not.
    pub fn take_pages(&mut self) {
        touch_pages(&mut self.records);
        touch_pages(&mut self.tags);
    }

    /// What code generated for a table reads of it ([`crate::native`]):
    /// where its tags and records lie, the summary's probed row and
    /// word, and whether the stash holds any record. Valid until the
    /// table's next insertion or removal.
    pub(crate) fn raw(&mut self) -> RawTable {
        // The probed row is a place in the whole summary, one pointer for
        // both: generated code writes the counters and reads the row.
        let counters = self.summary.as_mut_ptr();
        RawTable {
            tags: self.tags.as_mut_ptr(),
            alts: self.alts.as_mut_ptr(),
            records: self.records[self.base..].as_mut_ptr(),
            summary: counters.wrapping_add(self.probe_row()),
            probe: self.probe,
            in_stash: self.in_stash,
            counters,
            nonzero: self.nonzero.as_mut_ptr(),
            len: &mut self.len,
        }
    }

    /// Where the probed word's row starts in the summary (0 for a table of
    /// empty keys, whose summary is empty).
    fn probe_row(&self) -> usize {
        (self.probe * SUMMARY).min(self.summary.len())
    }

    /// What of [`FlowTable::raw`] an insertion or a removal may change:
    /// where the summary's probed row starts, its word, and the stash's
    /// count.
    pub(crate) fn probe_state(&self) -> (usize, usize, usize) {
        (self.probe_row(), self.probe, self.in_stash)
    }

    /// Whether the counts kept beside the slots agree with the slots: the
    /// length, each key word's summary counters and its count of counters
    /// not zero, and the probed word. For tests of code that inserts
    /// without the table's own methods (`crate::native`).
    pub fn counts_hold(&self) -> bool {
        let mut summary = vec![0u32; self.summary.len()];
        let mut len = 0;
        for slot in self.slots() {
            len += 1;
            for (i, &w) in self.key(slot).iter().enumerate() {
                summary[i * SUMMARY + summary_index(w)] += 1;
            }
        }
        let nonzero_hold = (0..self.key_len).all(|i| {
            let row = &summary[i * SUMMARY..(i + 1) * SUMMARY];
            row.iter().filter(|&&c| c != 0).count() == self.nonzero[i] as usize
        });
        let probe = (0..self.key_len)
            .min_by_key(|&i| self.nonzero[i])
            .unwrap_or(0);
        len == self.len && summary == self.summary && nonzero_hold && probe == self.probe
    }

    /// Chooses the probed key word again, after generated code counted a
    /// key in ([`RawTable::counters`]) that made some word's counter
    /// leave zero.
    pub(crate) fn reprobe(&mut self) {
        self.probe = (0..self.key_len)
            .min_by_key(|&i| self.nonzero[i])
            .unwrap_or(0);
    }

    /// The bucket mask and words per record of a table made with these
    /// arguments (what generated code takes as constants).
    pub(crate) fn shape_of(capacity: usize, key_len: usize, regs: usize) -> (usize, usize) {
        let l = Layout::of(capacity, key_len, regs);
        (l.buckets - 1, l.stride)
    }

    /// This table's [`FlowTable::shape_of`].
    pub(crate) fn shape(&self) -> (usize, usize) {
        (self.mask, self.stride)
    }

    /// Words of the keys it holds.
    pub fn key_len(&self) -> usize {
        self.key_len
    }

    /// Slots in all, stash included.
    pub fn capacity(&self) -> usize {
        self.tags.len() * BUCKET
    }

    /// The tag of `slot`; 0: free.
    #[inline]
    fn tag(&self, slot: usize) -> u16 {
        (self.tags[slot / BUCKET] >> (16 * (slot % BUCKET))) as u16
    }

    #[inline]
    fn set_tag(&mut self, slot: usize, tag: u16) {
        let shift = 16 * (slot % BUCKET);
        let word = &mut self.tags[slot / BUCKET];
        *word = *word & !(0xffff << shift) | (tag as u64) << shift;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn stash_start(&self) -> usize {
        (self.mask + 1) * BUCKET
    }

    /// The key's two buckets and its tag.
    #[inline(always)]
    pub fn place(&self, key: &[Value]) -> Place {
        let h = table_hash(key);
        let b1 = h as usize & self.mask;
        let mut b2 = (h >> 32) as usize & self.mask;
        if b2 == b1 {
            b2 = b1 ^ 1;
        }
        Place {
            b1,
            b2,
            tag: (h >> 48) as u16 | 1,
        }
    }

    /// Where the record of `slot` starts in `records`.
    #[inline(always)]
    fn at(&self, slot: usize) -> usize {
        self.base + slot * self.stride
    }

    fn record(&self, slot: usize) -> &[Value] {
        &self.records[self.at(slot)..self.at(slot) + self.stride]
    }

    /// A slot's record: [`META_WORDS`] words (state, created, last), the
    /// key, then the registers' words.
    #[inline]
    pub fn words(&self, slot: usize) -> &[Value] {
        self.record(slot)
    }

    /// [`FlowTable::words`], to write.
    #[inline]
    pub fn words_mut(&mut self, slot: usize) -> &mut [Value] {
        let at = self.at(slot);
        &mut self.records[at..at + self.stride]
    }

    pub fn key(&self, slot: usize) -> &[Value] {
        &self.record(slot)[META_WORDS..META_WORDS + self.key_len]
    }

    pub fn regs(&self, slot: usize) -> &[Value] {
        &self.record(slot)[META_WORDS + self.key_len..][..self.regs]
    }

    pub fn regs_mut(&mut self, slot: usize) -> &mut [Value] {
        let at = self.at(slot) + META_WORDS + self.key_len;
        &mut self.records[at..at + self.regs]
    }

    pub fn meta(&self, slot: usize) -> Meta {
        let r = self.record(slot);
        Meta {
            used: self.tag(slot) != 0,
            state: r[0] as u16,
            created: r[1],
            last: r[2],
        }
    }

    /// Sets a used slot's state and timestamps.
    pub fn set_meta(&mut self, slot: usize, state: u16, created: u64, last: u64) {
        let at = self.at(slot);
        self.records[at..at + META_WORDS].copy_from_slice(&[state as Value, created, last]);
    }

    /// Used slots, in slot order.
    pub fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.capacity()).filter(|&s| self.tag(s) != 0)
    }

    /// Whether `slot` holds `key`: the key words first (one cache line for
    /// a bucket's keys), compared without a call (keys are a few words).
    #[inline]
    fn holds(&self, slot: usize, key: &[Value]) -> bool {
        let at = self.at(slot) + META_WORDS;
        let stored = &self.records[at..at + self.key_len];
        let diff = stored.iter().zip(key).fold(0, |d, (a, b)| d | (a ^ b));
        diff == 0 && self.tag(slot) != 0
    }

    /// The slot holding `key`: its two buckets, then the stash.
    #[inline]
    pub fn find(&self, key: &[Value]) -> Option<usize> {
        self.find_at(key, self.place(key))
    }

    /// [`FlowTable::find`] with the key's place already computed.
    #[inline(always)]
    pub fn find_at(&self, key: &[Value], place: Place) -> Option<usize> {
        let Place { b1, b2, tag } = place;
        // Both words read before either is looked at.
        let (w1, w2) = (self.tags[b1], self.tags[b2]);
        for (b, w) in [(b1, w1), (b2, w2)] {
            let mut lanes = matching_lanes(w, tag);
            while lanes != 0 {
                let s = b * BUCKET + lanes.trailing_zeros() as usize / 16;
                if self.holds(s, key) {
                    return Some(s);
                }
                lanes &= lanes - 1;
            }
        }
        if self.in_stash == 0 {
            return None;
        }
        self.find_in_stash(key, tag)
    }

    /// The stash's slot holding `key`: apart, so that the lookup's common
    /// path stays small enough to inline.
    #[cold]
    #[inline(never)]
    fn find_in_stash(&self, key: &[Value], tag: u16) -> Option<usize> {
        (self.stash_start()..self.capacity()).find(|&s| self.tag(s) == tag && self.holds(s, key))
    }

    /// Whether `key` is surely not in the table, from the summary alone:
    /// no key held has its probed word's value (up to the counters'
    /// sharing). One load from a small array, where a lookup hashes the
    /// whole key and reads two tag words of a large one. `false` says
    /// nothing: look the key up.
    ///
    /// Where the keys held all share a word's value (a balancer's virtual
    /// address and port), a key that differs there (a server's reply,
    /// its endpoints the other way round) is told absent at once.
    #[inline(always)]
    pub fn absent(&self, key: &[Value]) -> bool {
        match key.get(self.probe) {
            Some(&w) => self.absent_word(w),
            None => false,
        }
    }

    /// The key word [`FlowTable::absent`] reads; none for a table of
    /// empty keys.
    #[inline(always)]
    pub fn probe(&self) -> Option<usize> {
        (self.probe < self.key_len).then_some(self.probe)
    }

    /// [`FlowTable::absent`] for a key whose word at [`FlowTable::probe`]
    /// is `w`: a caller may read that one word rather than make the key.
    #[inline(always)]
    pub fn absent_word(&self, w: Value) -> bool {
        self.summary[self.probe * SUMMARY + summary_index(w)] == 0
    }

    /// Counts `key` into the summary (`add`) or out of it. Given the key
    /// rather than its slot: an insertion's record was just written, and
    /// reading it back waited for its line (the store cannot be forwarded
    /// before the line arrives), a fifth of the balancer's time.
    fn summarise(&mut self, key: &[Value], add: bool) {
        let mut changed = false;
        for (i, &w) in key.iter().enumerate() {
            let c = &mut self.summary[i * SUMMARY + summary_index(w)];
            if add {
                *c += 1;
                if *c == 1 {
                    self.nonzero[i] += 1;
                    changed = true;
                }
            } else {
                *c -= 1;
                if *c == 0 {
                    self.nonzero[i] -= 1;
                    changed = true;
                }
            }
        }
        if changed {
            self.reprobe();
        }
    }

    pub fn remove(&mut self, slot: usize) {
        if self.tag(slot) != 0 {
            let mut key = [0; MAX_KEY];
            let k = self.key_len;
            key[..k].copy_from_slice(self.key(slot));
            self.summarise(&key[..k], false);
            self.set_tag(slot, 0);
            self.len -= 1;
            if slot >= self.stash_start() {
                self.in_stash -= 1;
            }
        }
    }

    /// The first free slot of `bucket`: its free lanes found in its tag
    /// word at once.
    fn free_in(&self, bucket: usize) -> Option<usize> {
        let lanes = matching_lanes(self.tags[bucket], 0);
        (lanes != 0).then(|| bucket * BUCKET + lanes.trailing_zeros() as usize / 16)
    }

    fn move_slot(&mut self, from: usize, to: usize) {
        let (at, dest, w) = (self.at(from), self.at(to), self.stride);
        self.records.copy_within(at..at + w, dest);
        self.set_tag(to, self.tag(from));
        self.set_tag(from, 0);
        // Moves go from a key's bucket to its other one.
        self.alts[to] = (from / BUCKET) as u32;
    }

    /// The other bucket of the entry in `slot`.
    fn other_bucket(&self, slot: usize) -> usize {
        self.alts[slot] as usize
    }

    /// Frees a slot in one of `key`'s buckets by moving a chain of entries
    /// each to its other bucket.
    fn make_room(&mut self, b1: usize, b2: usize) -> Option<usize> {
        let mut search = std::mem::take(&mut self.search);
        search.clear();
        for s in (b1 * BUCKET..(b1 + 1) * BUCKET).chain(b2 * BUCKET..(b2 + 1) * BUCKET) {
            search.push((s as u32, u32::MAX));
        }
        let mut found = None;
        let mut i = 0;
        // Every slot queued is tried, not only those expanded before the
        // queue filled: a table then fills to about 95% before its stash.
        while i < search.len() {
            let slot = search[i].0 as usize;
            let alt = self.other_bucket(slot);
            if let Some(free) = self.free_in(alt) {
                found = Some((i, free));
                break;
            }
            for s in alt * BUCKET..(alt + 1) * BUCKET {
                if search.len() < MAX_SEARCH {
                    search.push((s as u32, i as u32));
                }
            }
            i += 1;
        }
        let room = found.map(|(mut node, mut to)| {
            // Move from the end of the chain back to its root.
            loop {
                let (slot, parent) = search[node];
                self.move_slot(slot as usize, to);
                to = slot as usize;
                if parent == u32::MAX {
                    return to;
                }
                node = parent as usize;
            }
        });
        self.search = search;
        room
    }

    /// Places `key` (not in the table) and returns its slot, whose meta and
    /// registers the caller then sets. `now` and `timeouts` decide which
    /// contexts have expired, for the eviction policy.
    pub fn insert(
        &mut self,
        key: &[Value],
        now: u64,
        timeouts: &Timeouts,
        eviction: Eviction,
    ) -> Result<Placed, TableFull> {
        self.insert_at(key, self.place(key), now, timeouts, eviction)
    }

    /// [`FlowTable::insert`] with the key's place already computed.
    pub fn insert_at(
        &mut self,
        key: &[Value],
        place: Place,
        now: u64,
        timeouts: &Timeouts,
        eviction: Eviction,
    ) -> Result<Placed, TableFull> {
        let placed = self.insert_by(
            key,
            place,
            eviction,
            |r| timeouts.expiry(&meta_of(r), now).is_some(),
            |r| r[2],
        )?;
        let (Placed::Free(slot) | Placed::Evicted(slot)) = placed;
        let at = self.at(slot);
        self.records[at..at + META_WORDS].fill(0);
        Ok(placed)
    }

    /// Places `key` (not in the table) where [`FlowTable::insert_at`]
    /// would, for records whose words the caller keeps itself (several
    /// contexts in one record): `expired` says whether a used record's
    /// words (see [`FlowTable::words`]) may be evicted before others,
    /// `last` when it was last seen, for [`Eviction::Oldest`]. The slot's
    /// words other than the key are left as they were (an evicted
    /// record's, for the caller to read), the caller sets them.
    pub fn insert_by(
        &mut self,
        key: &[Value],
        place: Place,
        eviction: Eviction,
        expired: impl Fn(&[Value]) -> bool,
        last: impl Fn(&[Value]) -> u64,
    ) -> Result<Placed, TableFull> {
        let Place { b1, b2, tag } = place;
        let stash = self.stash_start()..self.capacity();
        let placed = if let Some(s) = self.free_in(b1).or_else(|| self.free_in(b2)) {
            Placed::Free(s)
        } else if let Some(s) = self.make_room(b1, b2) {
            Placed::Free(s)
        } else if let Some(s) = stash.clone().find(|&s| self.tag(s) == 0) {
            Placed::Free(s)
        } else {
            let candidates = (b1 * BUCKET..(b1 + 1) * BUCKET)
                .chain(b2 * BUCKET..(b2 + 1) * BUCKET)
                .chain(stash);
            let expired = candidates.clone().find(|&s| expired(self.record(s)));
            let victim = match (expired, eviction) {
                (Some(s), _) => s,
                (None, Eviction::Oldest) => candidates
                    .min_by_key(|&s| (last(self.record(s)), s))
                    .ok_or(TableFull)?,
                (None, Eviction::Expired) => return Err(TableFull),
            };
            self.remove(victim);
            Placed::Evicted(victim)
        };
        let slot = match placed {
            Placed::Free(s) | Placed::Evicted(s) => s,
        };
        let k = self.key_len;
        let at = self.at(slot);
        // Word by word: `copy_from_slice` calls `memmove`, whose string
        // stores the reads that follow cannot take their values from.
        for (r, &w) in self.records[at + META_WORDS..at + META_WORDS + k]
            .iter_mut()
            .zip(key)
        {
            *r = w;
        }
        self.summarise(key, true);
        self.set_tag(slot, tag);
        self.alts[slot] = if slot / BUCKET == b1 { b2 } else { b1 } as u32;
        self.len += 1;
        if slot >= self.stash_start() {
            self.in_stash += 1;
        }
        Ok(placed)
    }
}

/// The [`Meta`] in a used record's first words.
fn meta_of(r: &[Value]) -> Meta {
    Meta {
        used: true,
        state: r[0] as u16,
        created: r[1],
        last: r[2],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(
        t: &mut FlowTable,
        k: u64,
        now: u64,
        to: &Timeouts,
        ev: Eviction,
    ) -> Result<Placed, TableFull> {
        let p = t.insert(&[k], now, to, ev)?;
        let s = match p {
            Placed::Free(s) | Placed::Evicted(s) => s,
        };
        t.set_meta(s, 0, now, now);
        t.regs_mut(s)[0] = k * 10;
        Ok(p)
    }

    #[test]
    fn matching_lanes_are_exactly_those_holding_the_tag() {
        let word = |lanes: [u16; 4]| {
            lanes
                .iter()
                .enumerate()
                .fold(0u64, |w, (i, &t)| w | (t as u64) << (16 * i))
        };
        for (lanes, tag, expected) in [
            ([0, 0, 0, 0], 1, 0b0000),
            ([5, 0, 5, 7], 5, 0b0101),
            ([0x8001, 1, 0xffff, 0x7fff], 0x8001, 0b0001),
            ([0x8001, 1, 0xffff, 0x7fff], 1, 0b0010),
            ([0x8001, 1, 0xffff, 0x7fff], 0xffff, 0b0100),
            ([0x8001, 1, 0xffff, 0x7fff], 0x7fff, 0b1000),
            ([0xfffe, 0xffff, 0xffff, 0xfffe], 0xffff, 0b0110),
        ] {
            let m = matching_lanes(word(lanes), tag);
            let got: u32 = (0..4)
                .map(|i| ((m >> (16 * i + 15)) & 1) as u32 * (1 << i))
                .sum();
            assert_eq!(got, expected, "{lanes:x?} for {tag:x}");
            assert_eq!(m & !0x8000_8000_8000_8000, 0);
        }
    }

    #[test]
    fn bytes_for_is_what_a_table_allocates() {
        for (capacity, key_len, regs) in [(0, 0, 0), (64, 1, 1), (4096, 2, 3), (5000, 5, 9)] {
            let t = FlowTable::new(capacity, key_len, regs);
            let held = 8 * t.records.len()
                + 8 * t.tags.len()
                + 4 * t.alts.len()
                + 4 * t.summary.len()
                + std::mem::size_of::<(u32, u32)>() * t.search.capacity();
            assert_eq!(
                FlowTable::bytes_for(capacity, key_len, regs),
                held,
                "{capacity} {key_len} {regs}"
            );
        }
    }

    #[test]
    fn fills_to_its_bound_then_reports_full() {
        let mut t = FlowTable::new(64, 1, 1);
        assert_eq!(t.capacity(), 64 + STASH);
        let to = Timeouts::default();
        let mut placed = 0;
        for k in 0..1000u64 {
            if put(&mut t, k, 0, &to, Eviction::Expired).is_ok() {
                placed += 1;
            }
            assert!(t.len() <= t.capacity());
        }
        assert_eq!(t.len(), placed);
        // Cuckoo moves and the stash fill most of the table.
        assert!(placed >= 60, "only {placed} of {} placed", t.capacity());
        // Every key placed is found, with its registers moved with it.
        let mut found = 0;
        for k in 0..1000u64 {
            if let Some(s) = t.find(&[k]) {
                assert_eq!(t.regs(s)[0], k * 10);
                found += 1;
            }
        }
        assert_eq!(found, placed);
    }

    #[test]
    fn the_stash_takes_keys_whose_buckets_are_full() {
        let mut t = FlowTable::new(8, 1, 1);
        let to = Timeouts::default();
        for k in 0..200u64 {
            let _ = put(&mut t, k, 0, &to, Eviction::Expired);
        }
        let stash: Vec<usize> = t.slots().filter(|&s| s >= t.stash_start()).collect();
        assert_eq!(stash.len(), STASH, "a full table has a full stash");
        for s in stash {
            let k = t.key(s)[0];
            assert_eq!(t.find(&[k]), Some(s));
        }
    }

    #[test]
    fn a_full_table_evicts_only_expired_contexts_unless_told_otherwise() {
        let mut t = FlowTable::new(8, 1, 1);
        let to = Timeouts {
            idle: Some(100),
            hard: None,
        };
        let mut k = 0;
        while put(&mut t, k, 0, &to, Eviction::Expired).is_ok() {
            k += 1;
        }
        let n = t.len();
        // Nothing has expired at time 50: full.
        assert_eq!(
            put(&mut t, 9999, 50, &to, Eviction::Expired),
            Err(TableFull)
        );
        // At 200 everything has: the new key takes an expired one's slot.
        assert!(matches!(
            put(&mut t, 9999, 200, &to, Eviction::Expired),
            Ok(Placed::Evicted(_))
        ));
        assert_eq!(t.len(), n);
        assert!(t.find(&[9999]).is_some());
        // `Oldest` evicts the least recently seen candidate even so.
        let fresh = Timeouts::default();
        let before = t.len();
        assert!(matches!(
            put(&mut t, 12345, 300, &fresh, Eviction::Oldest),
            Ok(Placed::Evicted(_))
        ));
        assert_eq!(t.len(), before);
        assert!(t.find(&[9999]).is_some(), "the newest context stays");
    }

    #[test]
    fn timeouts_idle_and_hard() {
        let to = Timeouts {
            idle: Some(10),
            hard: Some(200),
        };
        let m = Meta {
            used: true,
            state: 0,
            created: 0,
            last: 95,
        };
        assert_eq!(to.expiry(&m, 100), None);
        assert_eq!(to.expiry(&m, 106), Some(Expiry::Idle));
        let busy = Meta { last: 100, ..m };
        assert_eq!(to.expiry(&busy, 201), Some(Expiry::Hard));
    }

    #[test]
    fn the_summary_never_calls_a_held_key_absent() {
        let mut t = FlowTable::new(256, 2, 0);
        let to = Timeouts::default();
        let mut x = 7u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut held = std::collections::HashSet::new();
        for _ in 0..20_000 {
            // Clients to one server: the second word is the same in every
            // key held, so the summary probes it.
            let key = [100 + next() % 300, 80];
            match t.find(&key) {
                Some(s) if next() % 2 == 0 => {
                    t.remove(s);
                    held.remove(&key);
                }
                Some(_) => {}
                None => {
                    if t.insert(&key, 0, &to, Eviction::Expired).is_ok() {
                        held.insert(key);
                    }
                }
            }
            for k in 100..400 {
                let key = [k, 80];
                assert!(!t.absent(&key) || !held.contains(&key), "{key:?} held");
            }
            // The other way round (a reply) is absent, unless its words
            // fall on counters in use.
            let reply = [80, 100 + next() % 300];
            assert!(t.find(&reply).is_none());
            if !held.is_empty() && summary_index(reply[1]) != summary_index(80) {
                assert!(t.absent(&reply), "{reply:?}");
            }
        }
        assert_eq!(t.len(), held.len());
        for k in held {
            t.remove(t.find(&k).expect("held"));
        }
        assert!(t.summary.iter().all(|&c| c == 0));
        assert_eq!(t.nonzero, [0; MAX_KEY]);
    }
}
