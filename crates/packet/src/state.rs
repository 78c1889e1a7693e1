//! A worker's shard of the process's `global` state, and the dump that
//! merges every shard at the end (or on request).
//!
//! Each worker owns its shard outright, so state needs no locks: steering
//! sends every frame of a flow to one worker, and that flow's entries live
//! there. A dictionary holds at most `capacity` entries per shard; once
//! full, new keys are refused (counted as `dict_full`) while the keys it
//! holds are still updated, so a flood of new flows cannot evict the state
//! of established ones.
//!
//! A plain dictionary keeps its entries in slots indexed by a `HashTable`
//! of slot numbers. One hasher serves every dictionary of a shard, and
//! the shard remembers the entry last looked up or stored: the next
//! operation on an equal key takes its hash, and in the same dictionary
//! its slot, so a read then a write of one key, or one key in two
//! dictionaries, is hashed once and probed once per dictionary.
//!
//! A dictionary whose type declares `idle=` or `evict=lru|idle` is a flow
//! table ([`Timed`]): its entries sit in slots on an intrusive list, most
//! recently touched first, indexed by a `HashTable` of slot numbers. Time
//! is packet time (the frame's timestamp), so a run over a capture ends
//! the same way every time. An entry untouched (neither read nor written)
//! for `idle` seconds is gone: a lookup finds nothing and a dump leaves it
//! out. Expiry is lazy (on lookup and when the table needs room) plus a
//! few entries swept from the list's old end per frame, so each operation
//! is O(1) and allocates nothing once the slots have grown.
//!
//! Meters and Bloom filters are state of fixed size ([`Var::Meter`],
//! [`Var::Bloom`]), made when the program's `new_meter` or `new_bloom` is
//! stored: a meter is one integer (the packet time its bucket is full
//! again, see [`MeterSpec`]), a dictionary of meters holds that integer
//! per key, and a Bloom filter is its words of bits, allocated once. Like
//! every global, each worker has its own: a meter or filter keyed by what
//! the program steers by is exact whatever the number of workers; one
//! that is not counts only the frames its worker is given.

use flick_exec::{
    BloomOp, BloomSpec, Evict, Fault, IntField, MeterSpec, MeterState, StateObject, TablePolicy,
    Value,
};
use hashbrown::{DefaultHashBuilder, HashTable};
use serde_json::{Map, Number, Value as Json};
use std::hash::BuildHasher;
use std::sync::Arc;

/// Tags of encoded dictionary keys: a key of any value is one byte string,
/// so that lookups borrow a reused buffer and allocate nothing.
const KEY_INT: u8 = 0;
const KEY_BOOL: u8 = 1;
const KEY_BYTES: u8 = 2;
const KEY_NONE: u8 = 3;
const KEY_TUPLE: u8 = 4;

pub(crate) enum Dict {
    /// Entries kept until the dictionary is emptied; a full one refuses
    /// new keys.
    Plain(Plain),
    /// A flow table with idle timeouts or an eviction policy.
    Timed(Box<Timed>),
}

/// No slot: the end of a list.
const NIL: u32 = u32::MAX;

/// Entries swept from a flow table's old end per frame, at most: enough to
/// keep up with the entries one frame can add, bounded so a frame's cost
/// is too.
const SWEEP_PER_FRAME: usize = 4;

const NANOS_PER_SEC: u64 = 1_000_000_000;

struct Slot {
    key: StoredKey,
    value: Value,
    hash: u64,
    /// Packet time of the last read or write, in nanoseconds.
    touched: u64,
    /// Neighbours on the recency list (or, free, the next free slot).
    newer: u32,
    older: u32,
}

/// An entry of a plain dictionary. A removed one holds an empty key,
/// which no encoded key equals (each has a tag byte).
struct Entry {
    key: StoredKey,
    value: Value,
    hash: u64,
}

/// A plain dictionary: entries in slots that keep their place until
/// removed, indexed by their keys' hashes, so that the lookup of a key
/// can name the slot that the write after it uses.
pub(crate) struct Plain {
    index: HashTable<u32>,
    slots: Vec<Entry>,
    /// Slots of removed entries, taken again first.
    free: Vec<u32>,
    capacity: usize,
}

impl Plain {
    fn new(capacity: usize) -> Plain {
        let room = capacity.min(INITIAL_ENTRIES);
        Plain {
            index: HashTable::with_capacity(room),
            slots: Vec::with_capacity(room),
            free: Vec::new(),
            capacity,
        }
    }

    fn len(&self) -> usize {
        self.index.len()
    }

    fn clear(&mut self) {
        self.index.clear();
        self.slots.clear();
        self.free.clear();
    }

    fn find(&self, key: &[u8], hash: u64) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| same_key(slots[i as usize].key.as_bytes(), key))
            .copied()
    }

    /// Adds `key`, known to be absent; its slot.
    fn insert(&mut self, key: &[u8], hash: u64, value: Value) -> u32 {
        let entry = Entry {
            key: StoredKey::new(key),
            value,
            hash,
        };
        let i = match self.free.pop() {
            Some(f) => {
                self.slots[f as usize] = entry;
                f
            }
            None => {
                self.slots.push(entry);
                (self.slots.len() - 1) as u32
            }
        };
        let slots = &self.slots;
        self.index
            .insert_unique(hash, i, |&j| slots[j as usize].hash);
        i
    }

    fn remove(&mut self, key: &[u8], hash: u64) -> bool {
        let slots = &self.slots;
        let Ok(e) = self
            .index
            .find_entry(hash, |&i| slots[i as usize].key.as_bytes() == key)
        else {
            return false;
        };
        let (i, _) = e.remove();
        let entry = &mut self.slots[i as usize];
        entry.key = StoredKey::EMPTY;
        // Dropped now, so that bytes it held go back at once.
        entry.value = Value::Unit;
        self.free.push(i);
        true
    }

    fn live(&self) -> impl Iterator<Item = (&StoredKey, &Value)> + '_ {
        self.slots
            .iter()
            .filter(|e| !e.key.as_bytes().is_empty())
            .map(|e| (&e.key, &e.value))
    }
}

/// A flow table: slots on a recency list, newest at `newest`, indexed by
/// their keys' hashes.
pub(crate) struct Timed {
    index: HashTable<u32>,
    slots: Vec<Slot>,
    free: u32,
    newest: u32,
    oldest: u32,
    len: usize,
    capacity: usize,
    idle_ns: Option<u64>,
    evict: Evict,
    /// Live entries removed to make room (`evict=lru`).
    pub evicted: u64,
    /// Entries removed because they were idle too long.
    pub expired: u64,
}

impl Timed {
    fn new(capacity: usize, policy: &TablePolicy) -> Timed {
        let room = capacity.min(INITIAL_ENTRIES);
        Timed {
            index: HashTable::with_capacity(room),
            slots: Vec::with_capacity(room),
            free: NIL,
            newest: NIL,
            oldest: NIL,
            len: 0,
            capacity,
            idle_ns: policy.idle_secs.map(|s| s.saturating_mul(NANOS_PER_SEC)),
            evict: policy.evict,
            evicted: 0,
            expired: 0,
        }
    }

    fn clear(&mut self) {
        self.index.clear();
        self.slots.clear();
        self.free = NIL;
        self.newest = NIL;
        self.oldest = NIL;
        self.len = 0;
    }

    fn is_expired(&self, i: u32, now: u64) -> bool {
        self.idle_ns
            .is_some_and(|idle| now.saturating_sub(self.slots[i as usize].touched) >= idle)
    }

    fn find(&self, key: &[u8], hash: u64) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| slots[i as usize].key.as_bytes() == key)
            .copied()
    }

    fn unlink(&mut self, i: u32) {
        let (newer, older) = {
            let s = &self.slots[i as usize];
            (s.newer, s.older)
        };
        match newer {
            NIL => self.newest = older,
            n => self.slots[n as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.slots[o as usize].newer = newer,
        }
    }

    fn push_newest(&mut self, i: u32) {
        let old_newest = self.newest;
        {
            let s = &mut self.slots[i as usize];
            s.newer = NIL;
            s.older = old_newest;
        }
        match old_newest {
            NIL => self.oldest = i,
            n => self.slots[n as usize].newer = i,
        }
        self.newest = i;
    }

    fn touch(&mut self, i: u32, now: u64) {
        self.slots[i as usize].touched = now;
        if self.newest != i {
            self.unlink(i);
            self.push_newest(i);
        }
    }

    fn remove(&mut self, i: u32) {
        let hash = self.slots[i as usize].hash;
        if let Ok(e) = self.index.find_entry(hash, |&j| j == i) {
            e.remove();
        }
        self.unlink(i);
        let free = self.free;
        let s = &mut self.slots[i as usize];
        // Dropped now, so that bytes it held go back at once.
        s.value = Value::Unit;
        s.older = free;
        self.free = i;
        self.len -= 1;
    }

    /// Removes up to `max` expired entries from the old end.
    fn sweep(&mut self, now: u64, max: usize) {
        for _ in 0..max {
            let i = self.oldest;
            if i == NIL || !self.is_expired(i, now) {
                break;
            }
            self.remove(i);
            self.expired += 1;
        }
    }

    /// The live entry under `key` (of hash `hash`), touched: its slot.
    fn get(&mut self, key: &[u8], hash: u64, now: u64) -> Option<u32> {
        let i = self.find(key, hash)?;
        if self.is_expired(i, now) {
            self.remove(i);
            self.expired += 1;
            return None;
        }
        self.touch(i, now);
        Some(i)
    }

    /// The slot `key` is stored in, or `None` if the key is new and the
    /// table has no room for it.
    fn set(&mut self, key: &[u8], hash: u64, v: Value, now: u64) -> Option<u32> {
        if let Some(i) = self.find(key, hash) {
            if self.is_expired(i, now) {
                // The old entry is gone; the new one takes its slot.
                self.expired += 1;
            }
            self.slots[i as usize].value = v;
            self.touch(i, now);
            return Some(i);
        }
        if self.len >= self.capacity && !self.make_room(now) {
            return None;
        }
        let slot = Slot {
            key: StoredKey::new(key),
            value: v,
            hash,
            touched: now,
            newer: NIL,
            older: NIL,
        };
        let i = match self.free {
            NIL => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
            f => {
                self.free = self.slots[f as usize].older;
                self.slots[f as usize] = slot;
                f
            }
        };
        let slots = &self.slots;
        self.index
            .insert_unique(hash, i, |&j| slots[j as usize].hash);
        self.push_newest(i);
        self.len += 1;
        Some(i)
    }

    /// Frees one entry of a full table as its policy allows.
    fn make_room(&mut self, now: u64) -> bool {
        let i = self.oldest;
        if i == NIL {
            return false;
        }
        if self.is_expired(i, now) {
            self.remove(i);
            self.expired += 1;
            return true;
        }
        if self.evict == Evict::Lru {
            self.remove(i);
            self.evicted += 1;
            return true;
        }
        false
    }

    /// The live entries, newest first.
    fn live(&self, now: u64) -> impl Iterator<Item = (&StoredKey, &Value)> + '_ {
        let mut at = self.newest;
        std::iter::from_fn(move || {
            while at != NIL {
                let i = at;
                at = self.slots[i as usize].older;
                if !self.is_expired(i, now) {
                    let s = &self.slots[i as usize];
                    return Some((&s.key, &s.value));
                }
            }
            None
        })
    }
}

/// Room a dictionary is made with; it grows (as new keys are added) to
/// its capacity.
const INITIAL_ENTRIES: usize = 1024;

/// Longest key kept inside its entry: `flow_key5` of an IPv4 frame (five
/// packed integers, 46 bytes encoded) fits.
const INLINE_KEY: usize = 46;

/// Whether two keys are the same bytes, compared inline a word at a
/// time: a key is a few dozen bytes, which a call to `memcmp` costs more
/// than comparing.
#[inline]
fn same_key(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let n = a.len();
    if n < 8 {
        return a == b;
    }
    let word =
        |s: &[u8], at: usize| u64::from_ne_bytes(s[at..at + 8].try_into().unwrap_or_default());
    // Whole words, then the last eight bytes (overlapping the last whole
    // word where the length is not a multiple of eight): no byte loop.
    let mut diff = word(a, n - 8) ^ word(b, n - 8);
    let mut at = 0;
    while at + 8 < n {
        diff |= word(a, at) ^ word(b, at);
        at += 8;
    }
    diff == 0
}

/// An encoded key as a dictionary keeps it: a short one inside the entry,
/// so a lookup compares it where the hash led without following a pointer
/// to another cache line; a longer one on the heap.
#[derive(Clone)]
pub(crate) enum StoredKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl StoredKey {
    /// The key of no entry: every encoded key has at least its tag.
    const EMPTY: StoredKey = StoredKey::Inline {
        len: 0,
        bytes: [0; INLINE_KEY],
    };

    fn new(key: &[u8]) -> StoredKey {
        if key.len() <= INLINE_KEY {
            let mut bytes = [0; INLINE_KEY];
            bytes[..key.len()].copy_from_slice(key);
            StoredKey::Inline {
                len: key.len() as u8,
                bytes,
            }
        } else {
            StoredKey::Heap(key.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            StoredKey::Inline { len, bytes } => &bytes[..*len as usize],
            StoredKey::Heap(b) => b,
        }
    }
}

impl std::borrow::Borrow<[u8]> for StoredKey {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

// Hashed and compared as the bytes it holds, so that `&[u8]` looks it up.
impl std::hash::Hash for StoredKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl PartialEq for StoredKey {
    fn eq(&self, other: &StoredKey) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for StoredKey {}

pub(crate) enum Var {
    Value(Value),
    Dict(Dict),
    /// A meter's buckets.
    Meter(MeterState),
    Bloom(Bloom),
}

/// A Bloom filter's bits, in 64-bit words made once.
pub(crate) struct Bloom {
    words: Box<[u64]>,
    bits: u64,
    hashes: u32,
    /// Bits set, for dumps.
    set: u64,
}

impl Bloom {
    fn new(spec: &BloomSpec) -> Bloom {
        let words = spec.bits.max(1).div_ceil(64);
        Bloom {
            words: vec![0; usize::try_from(words).unwrap_or(usize::MAX)].into_boxed_slice(),
            bits: words * 64,
            hashes: spec.hashes.max(1),
            set: 0,
        }
    }

    /// The bit positions of `key`: double hashing of two 64-bit hashes of
    /// its encoded bytes (fixed, not seeded, so runs repeat exactly).
    fn positions(&self, key: &[u8]) -> impl Iterator<Item = usize> + '_ {
        let (h1, h2) = bloom_hashes(key);
        (0..self.hashes as u64)
            .map(move |i| (h1.wrapping_add(i.wrapping_mul(h2)) % self.bits) as usize)
    }

    fn add(&mut self, key: &[u8]) {
        let (h1, h2) = bloom_hashes(key);
        for i in 0..self.hashes as u64 {
            let at = (h1.wrapping_add(i.wrapping_mul(h2)) % self.bits) as usize;
            let (w, bit) = (at / 64, 1u64 << (at % 64));
            if self.words[w] & bit == 0 {
                self.words[w] |= bit;
                self.set += 1;
            }
        }
    }

    fn has(&self, key: &[u8]) -> bool {
        self.positions(key)
            .all(|at| self.words[at / 64] & (1u64 << (at % 64)) != 0)
    }

    fn clear(&mut self) {
        self.words.fill(0);
        self.set = 0;
    }
}

/// SplitMix64's finaliser: spreads every input bit over the output.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The two hashes a Bloom filter's positions are made of: FNV-1a of the
/// encoded key, mixed, and a second odd one mixed from it.
pub fn bloom_hashes(key: &[u8]) -> (u64, u64) {
    let h = flick_exec::fnv1a(key);
    let h1 = mix64(h);
    let h2 = mix64(h1 ^ 0x9e37_79b9_7f4a_7c15) | 1;
    (h1, h2)
}

/// One worker's state variables, by the process's state index.
pub(crate) struct Shard {
    pub vars: Vec<Var>,
    /// Entries of a dictionary that declares no capacity.
    capacity: usize,
    /// Per state variable: what its type declares.
    tables: Vec<TablePolicy>,
    /// State variables that are flow tables, swept per frame.
    timed: Vec<u16>,
    /// Packet time of the frame being handled (the latest seen), in
    /// nanoseconds.
    pub now: u64,
    /// Keys refused because their dictionary was full.
    pub dict_full: u64,
    /// Hashes every dictionary's keys, so that a key's hash found in one
    /// serves for the others.
    hasher: DefaultHashBuilder,
    /// The dictionary and slot of the entry last looked up or stored: a
    /// key that equals its key has its hash, and in a plain dictionary
    /// it names the entry without a probe (a read then a write of one
    /// key, the same key in a second dictionary). Always checked against
    /// the slot's key, so neither emptying nor removing can mislead it.
    last: Option<(u16, u32)>,
}

impl Shard {
    #[cfg(test)]
    pub fn new(n: usize, capacity: usize) -> Shard {
        Shard::with_tables(n, capacity, &[])
    }

    /// A shard whose dictionaries follow `tables` (by state index; a
    /// variable past its end declares nothing).
    pub fn with_tables(n: usize, capacity: usize, tables: &[TablePolicy]) -> Shard {
        Shard {
            vars: (0..n).map(|_| Var::Value(Value::Unit)).collect(),
            capacity: capacity.max(1),
            tables: tables.to_vec(),
            timed: Vec::new(),
            now: 0,
            dict_full: 0,
            hasher: DefaultHashBuilder::default(),
            last: None,
        }
    }

    /// Sets packet time for the next frame and sweeps a few expired
    /// entries from each flow table.
    pub fn advance(&mut self, now: u64) {
        // A frame stamped earlier than one before it (ports merged out of
        // order) does not turn the clock back.
        self.now = self.now.max(now);
        for &i in &self.timed {
            if let Some(Var::Dict(Dict::Timed(t))) = self.vars.get_mut(i as usize) {
                t.sweep(self.now, SWEEP_PER_FRAME);
            }
        }
    }

    pub fn load(&self, i: u16) -> Value {
        match self.vars.get(i as usize) {
            Some(Var::Value(v)) => v.clone(),
            Some(Var::Dict(_) | Var::Meter(_) | Var::Bloom(_)) => Value::Dict { state: i },
            None => Value::None,
        }
    }

    /// What [`Shard::load`] returns as `Value::Dict { state }`: the
    /// variable itself where it holds a dictionary, meter or filter.
    pub fn dict_of(&self, i: u16) -> Option<u16> {
        match self.vars.get(i as usize) {
            Some(Var::Dict(_) | Var::Meter(_) | Var::Bloom(_)) => Some(i),
            Some(Var::Value(Value::Dict { state })) => Some(*state),
            _ => None,
        }
    }

    /// Stores `v`, whose bytes are already owned (see [`own`]); a fresh
    /// `empty_dict` makes (or empties) the variable's dictionary.
    pub fn store(&mut self, i: u16, v: Value) -> Result<(), Fault> {
        let policy = self.tables.get(i as usize).copied().unwrap_or_default();
        // The declared capacity wins; the host's default otherwise.
        let capacity = policy
            .capacity
            .map_or(self.capacity, |c| usize::try_from(c).unwrap_or(usize::MAX))
            .max(1);
        let slot = self
            .vars
            .get_mut(i as usize)
            .ok_or_else(|| Fault::Host(format!("no state variable {i}")))?;
        match (v, policy.object) {
            (Value::Dict { state }, Some(StateObject::Meter(_))) if state == u16::MAX => {
                // A fresh meter's bucket is full.
                *slot = Var::Meter(MeterState::default());
            }
            (Value::Dict { state }, Some(StateObject::Bloom(spec))) if state == u16::MAX => {
                match slot {
                    Var::Bloom(b) => b.clear(),
                    _ => *slot = Var::Bloom(Bloom::new(&spec)),
                }
            }
            (v, _) => self.store_value(i, v, &policy, capacity)?,
        }
        Ok(())
    }

    fn store_value(
        &mut self,
        i: u16,
        v: Value,
        policy: &TablePolicy,
        capacity: usize,
    ) -> Result<(), Fault> {
        let slot = self
            .vars
            .get_mut(i as usize)
            .ok_or_else(|| Fault::Host(format!("no state variable {i}")))?;
        match v {
            Value::Dict { state } if state == u16::MAX => match slot {
                Var::Dict(Dict::Plain(p)) => p.clear(),
                Var::Dict(Dict::Timed(t)) => t.clear(),
                _ if policy.idle_secs.is_none() && policy.evict == Evict::Refuse => {
                    // Grown as keys come, up to `capacity`: a table sized
                    // for the most keys but holding few spreads them over
                    // more cache lines than it needs.
                    *slot = Var::Dict(Dict::Plain(Plain::new(capacity)))
                }
                _ => {
                    *slot = Var::Dict(Dict::Timed(Box::new(Timed::new(capacity, policy))));
                    self.timed.push(i);
                }
            },
            // `a := b` of two dictionaries is not something a packet
            // program needs; a dictionary stays where it was made.
            Value::Dict { state } if state == i => {}
            Value::Dict { .. } => {
                return Err(Fault::Host(
                    "a dictionary cannot be copied into another state variable".into(),
                ))
            }
            v => *slot = Var::Value(v),
        }
        Ok(())
    }

    fn dict(&mut self, i: u16) -> Result<&mut Dict, Fault> {
        match self.vars.get_mut(i as usize) {
            Some(Var::Dict(d)) => Ok(d),
            _ => Err(Fault::Kind("a dictionary")),
        }
    }

    /// The hash of `key`, and its slot in dictionary `i` where that is
    /// the remembered entry's (see `Shard::last`) and `i` is plain.
    #[inline]
    fn recall(&self, i: u16, key: &[u8]) -> (u64, Option<u32>) {
        if let Some((d, slot)) = self.last {
            let held = match self.vars.get(d as usize) {
                Some(Var::Dict(Dict::Plain(p))) => {
                    p.slots.get(slot as usize).map(|e| (&e.key, e.hash, true))
                }
                Some(Var::Dict(Dict::Timed(t))) => {
                    t.slots.get(slot as usize).map(|s| (&s.key, s.hash, false))
                }
                _ => None,
            };
            if let Some((k, hash, plain)) = held {
                if !key.is_empty() && same_key(k.as_bytes(), key) {
                    return (hash, (plain && d == i).then_some(slot));
                }
            }
        }
        (self.hasher.hash_one(key), None)
    }

    pub fn dict_get(&mut self, i: u16, key: &[u8]) -> Result<Value, Fault> {
        let mut out = Value::None;
        self.dict_get_into(i, key, &mut out)?;
        Ok(out)
    }

    /// [`Shard::dict_get`] written into `out`, so that the value is not
    /// copied whole just after it was written in parts.
    pub fn dict_get_into(&mut self, i: u16, key: &[u8], out: &mut Value) -> Result<(), Fault> {
        match self.entry_value(i, key)? {
            Some(v) => out.clone_from(v),
            None => *out = Value::None,
        }
        Ok(())
    }

    /// [`Shard::dict_get`] of an answer wanted as an integer: an integer
    /// or `None` returned as such, anything else written into `out`.
    pub fn dict_get_int(&mut self, i: u16, key: &[u8], out: &mut Value) -> Result<IntField, Fault> {
        Ok(match self.entry_value(i, key)? {
            Some(Value::Int(n)) => IntField::Int(*n),
            Some(Value::None) | None => IntField::None,
            Some(v) => {
                out.clone_from(v);
                IntField::Other
            }
        })
    }

    /// The value under `key` in dictionary `i`, its entry remembered.
    #[inline]
    fn entry_value(&mut self, i: u16, key: &[u8]) -> Result<Option<&Value>, Fault> {
        let (hash, known) = self.recall(i, key);
        let now = self.now;
        let (slot, value) = match self.vars.get_mut(i as usize) {
            Some(Var::Dict(Dict::Plain(p))) => match known.or_else(|| p.find(key, hash)) {
                Some(s) => (s, &p.slots[s as usize].value),
                None => return Ok(None),
            },
            Some(Var::Dict(Dict::Timed(t))) => match t.get(key, hash, now) {
                Some(s) => (s, &t.slots[s as usize].value),
                None => return Ok(None),
            },
            _ => return Err(Fault::Kind("a dictionary")),
        };
        self.last = Some((i, slot));
        Ok(Some(value))
    }

    pub fn dict_set(&mut self, i: u16, key: &[u8], v: Value) -> Result<(), Fault> {
        let (hash, known) = self.recall(i, key);
        let now = self.now;
        let stored = match self.dict(i)? {
            Dict::Plain(p) => match known.or_else(|| p.find(key, hash)) {
                Some(s) => {
                    p.slots[s as usize].value = v;
                    Some(s)
                }
                None if p.len() < p.capacity => Some(p.insert(key, hash, v)),
                None => None,
            },
            Dict::Timed(t) => t.set(key, hash, v, now),
        };
        match stored {
            Some(s) => self.last = Some((i, s)),
            None => self.dict_full += 1,
        }
        Ok(())
    }

    /// `d[key] := d[key] + x` of plain dictionary `i` where the entry
    /// holds an integer, added where it lies (wrapping, as the
    /// interpreter adds); `false`, nothing changed, otherwise. A flow
    /// table is left to a read and a store: its reads expire and refresh.
    pub fn dict_add_int(&mut self, i: u16, key: &[u8], x: i64) -> Result<bool, Fault> {
        // Told before the key is hashed: a flow table declines at once.
        if let Dict::Timed(_) = self.dict(i)? {
            return Ok(false);
        }
        let (hash, known) = self.recall(i, key);
        let Dict::Plain(p) = self.dict(i)? else {
            return Ok(false);
        };
        let Some(s) = known.or_else(|| p.find(key, hash)) else {
            return Ok(false);
        };
        let Value::Int(n) = &mut p.slots[s as usize].value else {
            return Ok(false);
        };
        *n = n.wrapping_add(x);
        self.last = Some((i, s));
        Ok(true)
    }

    /// The spec of meter state variable `i` (or of its dictionary's).
    fn meter_spec(&self, i: u16) -> Result<MeterSpec, Fault> {
        match self.tables.get(i as usize).and_then(|t| t.object) {
            Some(StateObject::Meter(spec) | StateObject::Meters(spec)) => Ok(spec),
            _ => Err(Fault::Kind("a meter")),
        }
    }

    /// `meter(m, n)` of meter `i`, or with `key` (encoded), of the meter
    /// under `key` in dictionary `i`: the colour. A key the dictionary
    /// has no room for is red: no bucket vouches for its frame.
    pub fn meter(&mut self, i: u16, key: Option<&[u8]>, n: i64) -> Result<i64, Fault> {
        let n =
            u64::try_from(n).map_err(|_| Fault::Host(format!("a meter cannot take {n} tokens")))?;
        let spec = self.meter_spec(i)?;
        let now = self.now;
        let Some(key) = key else {
            let Some(Var::Meter(state)) = self.vars.get_mut(i as usize) else {
                return Err(Fault::Kind("a meter"));
            };
            let (colour, next) = spec.meter(*state, now, n);
            *state = next;
            return Ok(colour);
        };
        let state = match self.dict_get(i, key)? {
            Value::Meter(m) => m,
            _ => MeterState::default(),
        };
        let (colour, next) = spec.meter(state, now, n);
        if next != state {
            let refused = self.dict_full;
            self.dict_set(i, key, Value::Meter(next))?;
            if self.dict_full != refused {
                return Ok(flick_exec::RED);
            }
        }
        Ok(colour)
    }

    /// `bloom_add`, `bloom_has` and `bloom_clear` of filter `i`, with its
    /// encoded key.
    pub fn bloom(&mut self, i: u16, op: BloomOp, key: &[u8]) -> Result<bool, Fault> {
        let Some(Var::Bloom(b)) = self.vars.get_mut(i as usize) else {
            return Err(Fault::Kind("a Bloom filter"));
        };
        Ok(match op {
            BloomOp::Add => {
                b.add(key);
                false
            }
            BloomOp::Has => b.has(key),
            BloomOp::Clear => {
                b.clear();
                false
            }
        })
    }

    /// Per flow table, by state index: entries evicted and expired.
    pub fn table_counts(&self) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        self.vars.iter().enumerate().filter_map(|(i, v)| match v {
            Var::Dict(Dict::Timed(t)) => Some((i, t.evicted, t.expired)),
            _ => None,
        })
    }
}

/// Appends key `v` to `out`, encoded; `bytes` resolves byte values.
/// `false` for a value that cannot be a key.
pub(crate) fn encode_key<'a>(
    v: &'a Value,
    bytes: &dyn Fn(&'a Value) -> Option<&'a [u8]>,
    out: &mut Vec<u8>,
) -> bool {
    match v {
        Value::Int(i) => {
            out.push(KEY_INT);
            out.extend_from_slice(&i.to_be_bytes());
        }
        Value::Bool(b) => out.extend_from_slice(&[KEY_BOOL, *b as u8]),
        Value::None => out.push(KEY_NONE),
        Value::Tuple(items) => {
            out.push(KEY_TUPLE);
            out.push(items.len() as u8);
            for item in items.iter() {
                // Each element's length first, so that elements cannot run
                // into each other.
                let at = out.len();
                out.extend_from_slice(&[0; 4]);
                if !encode_key(item, bytes, out) {
                    return false;
                }
                let len = (out.len() - at - 4) as u32;
                out[at..at + 4].copy_from_slice(&len.to_be_bytes());
            }
        }
        v => match bytes(v) {
            Some(b) => {
                encode_bytes_tail(b, out);
            }
            None => return false,
        },
    }
    true
}

/// Sets `out` to the key of a bytes value, as [`encode_key`] writes it.
pub(crate) fn encode_bytes_key(b: &[u8], out: &mut Vec<u8>) {
    out.clear();
    encode_bytes_tail(b, out);
}

fn encode_bytes_tail(b: &[u8], out: &mut Vec<u8>) {
    out.push(KEY_BYTES);
    out.extend_from_slice(b);
}

/// `v` as state may keep it, the frame it points into gone: bytes copied.
pub(crate) fn own<'a>(v: &'a Value, bytes: &dyn Fn(&'a Value) -> Option<&'a [u8]>) -> Value {
    match v {
        Value::MsgBytes { .. } | Value::Scratch { .. } | Value::ConstBytes { .. } => {
            bytes(v).map_or(Value::None, |b| Value::Bytes(Arc::from(b)))
        }
        Value::Tuple(items) => Value::Tuple(items.iter().map(|i| own(i, bytes)).collect()),
        v => v.clone(),
    }
}

/// Text for bytes: printable ASCII as it is, anything else as lowercase
/// hex after `0x`, so that a dump is valid, readable JSON.
pub(crate) fn text(b: &[u8]) -> String {
    if b.iter().all(|c| (0x20..0x7f).contains(c)) {
        String::from_utf8_lossy(b).into_owned()
    } else {
        // By table: a `format!` per byte made the dump of a large flow
        // table the bulk of a run's last moments.
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(2 + 2 * b.len());
        s.push_str("0x");
        for &c in b {
            s.push(HEX[(c >> 4) as usize] as char);
            s.push(HEX[(c & 15) as usize] as char);
        }
        s
    }
}

fn decode_key(k: &[u8]) -> String {
    match k.split_first() {
        Some((&KEY_INT, rest)) if rest.len() == 8 => {
            i64::from_be_bytes(rest.try_into().unwrap_or_default()).to_string()
        }
        Some((&KEY_BOOL, [b])) => if *b != 0 { "True" } else { "False" }.into(),
        Some((&KEY_BYTES, rest)) => text(rest),
        Some((&KEY_NONE, [])) => "None".into(),
        Some((&KEY_TUPLE, rest)) => {
            let mut parts = Vec::new();
            let mut at = 1;
            while at + 4 <= rest.len() {
                let len =
                    u32::from_be_bytes(rest[at..at + 4].try_into().unwrap_or_default()) as usize;
                let end = (at + 4 + len).min(rest.len());
                parts.push(decode_key(&rest[at + 4..end]));
                at = end;
            }
            format!("({})", parts.join(", "))
        }
        _ => text(k),
    }
}

fn json(v: &Value) -> Json {
    match v {
        Value::Int(i) => Json::Number(Number::from(*i)),
        Value::Bool(b) => Json::Bool(*b),
        Value::Bytes(b) => Json::String(text(b)),
        Value::Tuple(items) => Json::Array(items.iter().map(json).collect()),
        Value::List(items) => Json::Array(items.iter().map(json).collect()),
        Value::None | Value::Unit => Json::Null,
        other => Json::String(format!("{other:?}")),
    }
}

/// A meter in a dump: the tokens its bucket holds at `now`, or for a
/// three-colour meter those of each bucket.
fn meter_json(spec: &MeterSpec, state: MeterState, now: u64) -> Json {
    let (committed, excess) = spec.tokens(state, now);
    if spec.excess == 0 {
        return Json::Number(Number::from(committed));
    }
    let mut m = Map::new();
    m.insert("committed".into(), committed.into());
    m.insert("excess".into(), excess.into());
    Json::Object(m)
}

/// Integers of the same entry in several shards are summed; anything else
/// keeps the first shard's value.
fn merge_into(into: &mut Json, v: Json) {
    if let (Some(a), Some(b)) = (into.as_i64(), v.as_i64()) {
        *into = Json::Number(Number::from(a.wrapping_add(b)));
    }
}

/// Every state variable by name, every shard merged: a dictionary's
/// entries from all shards (its keys sorted), scalars summed where they
/// are integers (otherwise the first worker's).
pub(crate) fn merged(names: &[&str], shards: &[&Shard]) -> Map<String, Json> {
    let mut out = Map::new();
    // Meters are read at the latest packet time any worker has seen, so a
    // dump at the end is the same whatever the number of workers.
    let latest = shards.iter().map(|s| s.now).max().unwrap_or(0);
    for (i, name) in names.iter().enumerate() {
        let mut entry: Option<Json> = None;
        let object = shards
            .first()
            .and_then(|s| s.tables.get(i))
            .and_then(|t| t.object);
        for shard in shards {
            let v = match &shard.vars[i] {
                Var::Value(v) => json(v),
                // A worker that metered nothing (a program without `steer`
                // runs on one) adds no bucket of its own.
                Var::Meter(state) if *state == MeterState::default() && shards.len() > 1 => {
                    continue
                }
                Var::Meter(state) => match object {
                    Some(StateObject::Meter(spec)) => meter_json(&spec, *state, latest),
                    _ => Json::Null,
                },
                Var::Bloom(b) => {
                    let mut m = Map::new();
                    m.insert("bits".into(), b.bits.into());
                    m.insert("hashes".into(), b.hashes.into());
                    m.insert("set".into(), b.set.into());
                    Json::Object(m)
                }
                Var::Dict(d) => {
                    let mut m = Map::new();
                    let entries: Box<dyn Iterator<Item = (&StoredKey, &Value)>> = match d {
                        Dict::Plain(p) => Box::new(p.live()),
                        Dict::Timed(t) => Box::new(t.live(shard.now)),
                    };
                    for (k, v) in entries {
                        let key = decode_key(k.as_bytes());
                        let v = match (object, v) {
                            (Some(StateObject::Meters(spec)), Value::Meter(m)) => {
                                meter_json(&spec, *m, latest)
                            }
                            _ => json(v),
                        };
                        match m.get_mut(&key) {
                            Some(old) => merge_into(old, v),
                            None => {
                                m.insert(key, v);
                            }
                        }
                    }
                    Json::Object(m)
                }
            };
            entry = Some(match (entry, v) {
                (None, v) => v,
                (Some(Json::Object(mut a)), Json::Object(b)) => {
                    for (k, v) in b {
                        match a.get_mut(&k) {
                            Some(old) => merge_into(old, v),
                            None => {
                                a.insert(k, v);
                            }
                        }
                    }
                    Json::Object(a)
                }
                (Some(mut a), b) => {
                    merge_into(&mut a, b);
                    a
                }
            });
        }
        // The workers' filters merged are the filter one worker would have
        // made (a key sets the same bits wherever it is added): the bits
        // set are those of their union, the same whatever the workers.
        if let (Some(StateObject::Bloom(_)), Some(Json::Object(m)), Some(Var::Bloom(b))) = (
            object,
            entry.as_mut(),
            shards.first().and_then(|s| s.vars.get(i)),
        ) {
            let filters: Vec<&Bloom> = shards
                .iter()
                .filter_map(|s| match s.vars.get(i) {
                    Some(Var::Bloom(b)) => Some(b),
                    _ => None,
                })
                .collect();
            let set: u64 = (0..b.words.len())
                .map(|w| {
                    let word = filters
                        .iter()
                        .fold(0u64, |acc, f| acc | f.words.get(w).copied().unwrap_or(0));
                    u64::from(word.count_ones())
                })
                .sum();
            m.insert("bits".into(), b.bits.into());
            m.insert("hashes".into(), b.hashes.into());
            m.insert("set".into(), set.into());
        }
        if let (None, Some(StateObject::Meter(spec))) = (&entry, object) {
            entry = Some(meter_json(&spec, MeterState::default(), latest));
        }
        out.insert(name.to_string(), entry.unwrap_or(Json::Null));
    }
    out
}

/// Per flow table by name, every shard summed: `{"evicted": n,
/// "expired": n}`. Empty when the program has none.
pub(crate) fn table_counts(names: &[&str], shards: &[&Shard]) -> Map<String, Json> {
    let mut sums: Vec<Option<(u64, u64)>> = vec![None; names.len()];
    for shard in shards {
        for (i, evicted, expired) in shard.table_counts() {
            if let Some(sum) = sums.get_mut(i) {
                let (e, x) = sum.unwrap_or_default();
                *sum = Some((e + evicted, x + expired));
            }
        }
    }
    let mut out = Map::new();
    for (name, sum) in names.iter().zip(sums) {
        if let Some((evicted, expired)) = sum {
            let mut m = Map::new();
            m.insert("evicted".into(), evicted.into());
            m.insert("expired".into(), expired.into());
            out.insert(name.to_string(), Json::Object(m));
        }
    }
    out
}

impl Shard {
    /// Removes the entry under `key` (encoded) from dictionary `i`, for a
    /// control delete; whether it held one (an expired entry counts as
    /// none, as a lookup finds none).
    pub(crate) fn dict_remove(&mut self, i: u16, key: &[u8]) -> Result<bool, Fault> {
        let now = self.now;
        let hash = self.hasher.hash_one(key);
        Ok(match self.dict(i)? {
            Dict::Plain(p) => p.remove(key, hash),
            Dict::Timed(t) => match t.find(key, hash) {
                Some(slot) => {
                    let live = !t.is_expired(slot, now);
                    t.remove(slot);
                    live
                }
                None => false,
            },
        })
    }

    /// Whether dictionary `i` holds `key` (encoded) now: for a control
    /// write, which goes to the shard owning the key.
    pub(crate) fn holds(&mut self, i: u16, key: &[u8]) -> Result<bool, Fault> {
        let now = self.now;
        let hash = self.hasher.hash_one(key);
        Ok(match self.dict(i)? {
            Dict::Plain(p) => p.find(key, hash).is_some(),
            Dict::Timed(t) => t
                .get(key, hash, now)
                .is_some_and(|s| !matches!(t.slots[s as usize].value, Value::None)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Keys compared a word at a time are equal exactly where their
        /// bytes are: one byte changed anywhere, or a length changed,
        /// makes them differ.
        #[test]
        fn keys_compared_by_words_are_compared_by_bytes(
            a in proptest::collection::vec(any::<u8>(), 0..80),
            at in any::<prop::sample::Index>(),
            flip in 1u8..,
            cut in any::<bool>(),
        ) {
            prop_assert!(same_key(&a, &a.clone()));
            if !a.is_empty() {
                let mut b = a.clone();
                b[at.index(a.len())] ^= flip;
                prop_assert!(!same_key(&a, &b));
                if cut {
                    prop_assert!(!same_key(&a, &a[..a.len() - 1]));
                }
            }
        }
    }

    #[test]
    fn keys_decode_as_they_were_given() {
        let none = |_: &Value| None;
        let mut k = Vec::new();
        assert!(encode_key(&Value::Int(-7), &none, &mut k));
        assert_eq!(decode_key(&k), "-7");
        k.clear();
        let b = Value::Bytes(Arc::from(&b"10.0.0.1:80"[..]));
        fn bytes(v: &Value) -> Option<&[u8]> {
            match v {
                Value::Bytes(b) => Some(&b[..]),
                _ => None,
            }
        }
        assert!(encode_key(&b, &bytes, &mut k));
        assert_eq!(decode_key(&k), "10.0.0.1:80");
        k.clear();
        let bin = Value::Bytes(Arc::from(&[0u8, 0xab][..]));
        assert!(encode_key(&bin, &bytes, &mut k));
        assert_eq!(decode_key(&k), "0x00ab");
    }

    #[test]
    fn a_remembered_entry_is_used_only_for_its_own_key() {
        let mut s = Shard::new(2, 8);
        s.store(0, Value::Dict { state: u16::MAX }).unwrap();
        s.store(1, Value::Dict { state: u16::MAX }).unwrap();
        let flow = b"\x02flow-key-of-some-length-0123456789";
        // A read then a write of one key, then the same key in a second
        // dictionary: each lands on its own entry.
        s.dict_set(0, flow, Value::Int(1)).unwrap();
        assert_eq!(s.dict_get(0, flow).unwrap(), Value::Int(1));
        s.dict_set(0, flow, Value::Int(2)).unwrap();
        s.dict_set(1, flow, Value::Int(64)).unwrap();
        s.dict_set(1, b"\x02other", Value::Int(7)).unwrap();
        s.dict_set(0, flow, Value::Int(3)).unwrap();
        assert_eq!(s.dict_get(1, flow).unwrap(), Value::Int(64));
        assert_eq!(s.dict_get(0, flow).unwrap(), Value::Int(3));
        assert_eq!(s.dict_get(0, b"\x02other").unwrap(), Value::None);
        // A removed entry is not written through the memory of it.
        assert_eq!(s.dict_get(0, flow).unwrap(), Value::Int(3));
        assert_eq!(s.dict_remove(0, flow), Ok(true));
        assert_eq!(s.dict_get(0, flow).unwrap(), Value::None);
        s.dict_set(0, flow, Value::Int(9)).unwrap();
        assert_eq!(s.dict_get(0, flow).unwrap(), Value::Int(9));
        // Nor is an emptied dictionary's.
        s.store(0, Value::Dict { state: u16::MAX }).unwrap();
        assert_eq!(s.dict_get(0, flow).unwrap(), Value::None);
        s.dict_set(0, b"\x02b", Value::Int(1)).unwrap();
        assert_eq!(s.dict_get(0, flow).unwrap(), Value::None);
        let dump = merged(&["a", "b"], &[&s]);
        assert_eq!(dump["a"].as_object().map(|m| m.len()), Some(1));
        assert_eq!(dump["b"].as_object().map(|m| m.len()), Some(2));
        assert_eq!(s.dict_full, 0);
    }

    #[test]
    fn integer_answers_are_numbers_and_others_values() {
        let mut s = Shard::new(3, 8);
        s.store(0, Value::Dict { state: u16::MAX }).unwrap();
        s.store(1, Value::Int(5)).unwrap();
        s.dict_set(0, b"\x02i", Value::Int(-3)).unwrap();
        s.dict_set(0, b"\x02b", Value::Bytes(Arc::from(&b"xy"[..])))
            .unwrap();
        let mut out = Value::Unit;
        assert_eq!(s.dict_get_int(0, b"\x02i", &mut out), Ok(IntField::Int(-3)));
        assert_eq!(s.dict_get_int(0, b"\x02n", &mut out), Ok(IntField::None));
        assert_eq!(out, Value::Unit, "numbers leave `out` alone");
        assert_eq!(s.dict_get_int(0, b"\x02b", &mut out), Ok(IntField::Other));
        assert_eq!(out, Value::Bytes(Arc::from(&b"xy"[..])));
        assert!(s.dict_get_int(1, b"\x02i", &mut out).is_err());
        // `dict_of` names what `load` returns as a dictionary.
        for i in 0..4 {
            let loaded = match s.load(i) {
                Value::Dict { state } => Some(state),
                _ => None,
            };
            assert_eq!(s.dict_of(i), loaded, "state {i}");
        }
    }

    #[test]
    fn a_full_dictionary_refuses_new_keys_and_updates_old_ones() {
        let mut s = Shard::new(1, 2);
        s.store(0, Value::Dict { state: u16::MAX }).unwrap();
        for k in [b"a", b"b", b"c"] {
            s.dict_set(0, k, Value::Int(1)).unwrap();
        }
        s.dict_set(0, b"a", Value::Int(5)).unwrap();
        assert_eq!(s.dict_full, 1);
        assert_eq!(s.dict_get(0, b"a").unwrap(), Value::Int(5));
        assert_eq!(s.dict_get(0, b"c").unwrap(), Value::None);
    }

    const SEC: u64 = NANOS_PER_SEC;

    fn table(capacity: u64, idle: Option<u64>, evict: Evict) -> Shard {
        let policy = TablePolicy {
            capacity: Some(capacity),
            idle_secs: idle,
            evict,
            object: None,
        };
        let mut s = Shard::with_tables(1, 1024, &[policy]);
        s.store(0, Value::Dict { state: u16::MAX }).unwrap();
        s
    }

    fn keys(s: &Shard) -> Vec<String> {
        let m = merged(&["t"], &[s]);
        m["t"].as_object().unwrap().keys().cloned().collect()
    }

    fn counts(s: &Shard) -> (u64, u64) {
        let (_, e, x) = s.table_counts().next().unwrap();
        (e, x)
    }

    #[test]
    fn an_lru_table_evicts_the_least_recently_used_entry() {
        let mut s = table(2, None, Evict::Lru);
        s.advance(SEC);
        s.dict_set(0, b"a", Value::Int(1)).unwrap();
        s.dict_set(0, b"b", Value::Int(2)).unwrap();
        // Reading `a` makes `b` the least recently used.
        assert_eq!(s.dict_get(0, b"a").unwrap(), Value::Int(1));
        s.dict_set(0, b"c", Value::Int(3)).unwrap();
        assert_eq!(keys(&s), ["a", "c"]);
        assert_eq!(s.dict_get(0, b"b").unwrap(), Value::None);
        assert_eq!((counts(&s), s.dict_full), ((1, 0), 0));
    }

    #[test]
    fn a_control_delete_removes_a_live_entry_and_frees_its_room() {
        let mut s = Shard::new(1, 2);
        s.store(0, Value::Dict { state: u16::MAX }).unwrap();
        s.dict_set(0, b"a", Value::Int(1)).unwrap();
        s.dict_set(0, b"b", Value::Int(2)).unwrap();
        assert_eq!(s.dict_remove(0, b"a"), Ok(true));
        assert_eq!(s.dict_remove(0, b"a"), Ok(false));
        s.dict_set(0, b"c", Value::Int(3)).unwrap();
        assert_eq!(
            (s.dict_full, s.dict_get(0, b"c").unwrap()),
            (0, Value::Int(3))
        );
        // In a flow table, an entry past its idle time is none to delete,
        // and the slot of one deleted takes a new key.
        let mut t = table(2, Some(10), Evict::Refuse);
        t.advance(0);
        t.dict_set(0, b"old", Value::Int(1)).unwrap();
        t.dict_set(0, b"new", Value::Int(2)).unwrap();
        t.now = 5 * SEC;
        t.dict_get(0, b"new").unwrap();
        t.now = 12 * SEC;
        assert_eq!(t.dict_remove(0, b"old"), Ok(false));
        assert_eq!(t.dict_remove(0, b"new"), Ok(true));
        assert!(keys(&t).is_empty());
        t.dict_set(0, b"x", Value::Int(3)).unwrap();
        t.dict_set(0, b"y", Value::Int(4)).unwrap();
        assert_eq!(
            (keys(&t), t.dict_full),
            (vec!["x".to_string(), "y".to_string()], 0)
        );
        assert!(s.dict_remove(1, b"a").is_err(), "no such variable");
    }

    #[test]
    fn idle_entries_are_gone_for_lookups_and_dumps() {
        let mut s = table(8, Some(30), Evict::Refuse);
        s.advance(0);
        s.dict_set(0, b"a", Value::Int(1)).unwrap();
        s.dict_set(0, b"b", Value::Int(2)).unwrap();
        s.advance(20 * SEC);
        assert_eq!(s.dict_get(0, b"a").unwrap(), Value::Int(1));
        // `b` was last touched at 0: 30 s later it is gone; `a` is not.
        s.now = 30 * SEC;
        assert_eq!(keys(&s), ["a"]);
        assert_eq!(s.dict_get(0, b"b").unwrap(), Value::None);
        assert_eq!(s.dict_get(0, b"a").unwrap(), Value::Int(1));
        // The per-frame sweep takes what lookups did not.
        s.advance(61 * SEC);
        assert!(keys(&s).is_empty());
        assert_eq!(counts(&s), (0, 2));
    }

    #[test]
    fn an_idle_policy_makes_room_only_from_idle_entries() {
        let mut s = table(2, Some(10), Evict::Idle);
        s.advance(0);
        s.dict_set(0, b"a", Value::Int(1)).unwrap();
        s.now = 5 * SEC;
        s.dict_set(0, b"b", Value::Int(2)).unwrap();
        s.dict_set(0, b"c", Value::Int(3)).unwrap();
        assert_eq!(s.dict_full, 1);
        s.now = 10 * SEC;
        s.dict_set(0, b"c", Value::Int(3)).unwrap();
        assert_eq!(keys(&s), ["b", "c"]);
        assert_eq!((counts(&s), s.dict_full), ((0, 1), 1));
    }

    #[test]
    fn a_refusing_table_with_a_declared_capacity_ignores_the_default() {
        let mut s = table(3, None, Evict::Refuse);
        for k in [b"a", b"b", b"c", b"d"] {
            s.dict_set(0, k, Value::Int(1)).unwrap();
        }
        assert_eq!((keys(&s).len(), s.dict_full), (3, 1));
        // Emptied and reused: slots and the list start over.
        s.store(0, Value::Dict { state: u16::MAX }).unwrap();
        assert!(keys(&s).is_empty());
    }

    #[test]
    fn freed_slots_are_reused_and_every_key_stays_findable() {
        let mut s = table(64, Some(1), Evict::Lru);
        for round in 0..50u64 {
            s.advance(round * SEC / 2);
            for k in 0..100u64 {
                let key = (round * 7 + k).to_be_bytes();
                s.dict_set(0, &key, Value::Int(k as i64)).unwrap();
                assert_eq!(s.dict_get(0, &key).unwrap(), Value::Int(k as i64));
            }
        }
        assert_eq!(keys(&s).len(), 64);
        let Some(Var::Dict(Dict::Timed(t))) = s.vars.first() else {
            panic!("a flow table");
        };
        assert_eq!(t.slots.len(), 64);
    }

    fn objects(objects: &[StateObject]) -> Shard {
        let tables: Vec<TablePolicy> = objects
            .iter()
            .map(|o| TablePolicy {
                object: Some(*o),
                ..TablePolicy::default()
            })
            .collect();
        let mut s = Shard::with_tables(objects.len(), 64, &tables);
        for i in 0..objects.len() {
            s.store(i as u16, Value::Dict { state: u16::MAX }).unwrap();
        }
        s
    }

    const METER: MeterSpec = MeterSpec {
        rate: 1000,
        burst: 1500,
        excess: 0,
    };

    #[test]
    fn a_meter_passes_its_burst_then_its_rate() {
        let mut s = objects(&[StateObject::Meter(METER)]);
        s.advance(10 * SEC);
        // A full bucket: 1500 tokens, then nothing.
        assert_eq!(s.meter(0, None, 1000).unwrap(), flick_exec::GREEN);
        assert_eq!(s.meter(0, None, 500).unwrap(), flick_exec::GREEN);
        assert_eq!(s.meter(0, None, 1).unwrap(), flick_exec::RED);
        // Half a second refills 500 tokens; a red frame took none.
        s.advance(10 * SEC + SEC / 2);
        assert_eq!(s.meter(0, None, 501).unwrap(), flick_exec::RED);
        assert_eq!(s.meter(0, None, 500).unwrap(), flick_exec::GREEN);
        // The dump shows the tokens at the latest packet time; a worker
        // that metered nothing adds no bucket.
        s.advance(11 * SEC);
        let m = merged(&["m"], &[&s]);
        assert_eq!(m["m"], 500);
        let unused = objects(&[StateObject::Meter(METER)]);
        assert_eq!(merged(&["m"], &[&unused, &s])["m"], 500);
        assert_eq!(merged(&["m"], &[&unused, &unused])["m"], 1500);
        assert!(s.meter(0, None, -1).is_err());
    }

    #[test]
    fn a_dictionary_of_meters_keeps_a_bucket_per_key() {
        let mut s = objects(&[StateObject::Meters(METER)]);
        s.advance(SEC);
        assert_eq!(s.meter(0, Some(b"a"), 1500).unwrap(), flick_exec::GREEN);
        assert_eq!(s.meter(0, Some(b"a"), 1).unwrap(), flick_exec::RED);
        assert_eq!(s.meter(0, Some(b"b"), 1500).unwrap(), flick_exec::GREEN);
        let m = merged(&["m"], &[&s]);
        assert_eq!(m["m"], serde_json::json!({"a": 0, "b": 0}));
    }

    #[test]
    fn a_three_colour_meter_dumps_both_buckets() {
        let spec = MeterSpec {
            excess: 1000,
            ..METER
        };
        let mut s = objects(&[StateObject::Meters(spec)]);
        s.advance(SEC);
        assert_eq!(s.meter(0, Some(b"a"), 1500).unwrap(), flick_exec::GREEN);
        assert_eq!(s.meter(0, Some(b"a"), 600).unwrap(), flick_exec::YELLOW);
        assert_eq!(s.meter(0, Some(b"a"), 600).unwrap(), flick_exec::RED);
        let m = merged(&["m"], &[&s]);
        assert_eq!(
            m["m"],
            serde_json::json!({"a": {"committed": 0, "excess": 400}})
        );
    }

    #[test]
    fn a_full_dictionary_of_meters_meters_new_keys_red() {
        let policy = TablePolicy {
            capacity: Some(1),
            object: Some(StateObject::Meters(METER)),
            ..TablePolicy::default()
        };
        let mut s = Shard::with_tables(1, 64, &[policy]);
        s.store(0, Value::Dict { state: u16::MAX }).unwrap();
        assert_eq!(s.meter(0, Some(b"a"), 1).unwrap(), flick_exec::GREEN);
        assert_eq!(s.meter(0, Some(b"b"), 1).unwrap(), flick_exec::RED);
        assert_eq!(s.dict_full, 1);
    }

    #[test]
    fn a_bloom_filter_has_what_was_added_and_counts_its_bits() {
        let spec = BloomSpec {
            bits: 1000,
            hashes: 3,
        };
        let mut s = objects(&[StateObject::Bloom(spec)]);
        let keys: Vec<[u8; 8]> = (0..50u64).map(|k| k.to_be_bytes()).collect();
        for k in &keys {
            assert!(!s.bloom(0, BloomOp::Has, k).unwrap() || k[7] > 0);
            s.bloom(0, BloomOp::Add, k).unwrap();
        }
        for k in &keys {
            assert!(s.bloom(0, BloomOp::Has, k).unwrap());
        }
        let m = merged(&["b"], &[&s, &s]);
        // 1000 bits round up to 1024; the bits set are the union's.
        let set = m["b"]["set"].as_u64().unwrap();
        assert_eq!(m["b"]["bits"], 1024);
        assert!(set > 0 && set <= 150, "{set}");
        assert_eq!(merged(&["b"], &[&s])["b"]["set"], set);
        s.bloom(0, BloomOp::Clear, b"").unwrap();
        assert!(keys.iter().all(|k| !s.bloom(0, BloomOp::Has, k).unwrap()));
        assert_eq!(merged(&["b"], &[&s])["b"]["set"], 0);
    }

    #[test]
    fn bloom_positions_are_fixed_across_runs() {
        // The filter's hashes are not seeded: the model in flick-testkit
        // computes the same ones.
        assert_eq!(bloom_hashes(b""), bloom_hashes(b""));
        let (h1, h2) = bloom_hashes(&[2, b'k']);
        assert_ne!(h1, h2);
        assert_eq!(h2 % 2, 1);
    }

    #[test]
    fn keys_kept_inside_entries_and_outside_are_told_apart() {
        let mut s = Shard::new(1, 4096);
        s.store(0, Value::Dict { state: u16::MAX }).unwrap();
        // Keys around the inline limit, and prefixes of one another,
        // beyond the room the dictionary was made with.
        let keys: Vec<Vec<u8>> = (0..INITIAL_ENTRIES + 100)
            .map(|i| {
                let len = 1 + i % (2 * INLINE_KEY);
                (0..len).map(|j| (i / (2 * INLINE_KEY) + j) as u8).collect()
            })
            .collect();
        for (i, k) in keys.iter().enumerate() {
            s.dict_set(0, k, Value::Int(i as i64)).unwrap();
        }
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(s.dict_get(0, k).unwrap(), Value::Int(i as i64), "key {k:?}");
        }
        assert_eq!(s.dict_get(0, &[7; INLINE_KEY + 1]).unwrap(), Value::None);
        assert_eq!(s.dict_full, 0);
    }
}
