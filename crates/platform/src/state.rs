//! Process state: `global` variables shared by every instance of a process
//! (safely across workers) and `local` ones per instance. Dictionaries hold
//! at most their declared capacity and evict the oldest entry to make room
//! when a program sets a new key; the operator's writes ([`GlobalDict`])
//! never evict, and are refused when a dictionary is full.

use crate::msg::{Msg, MsgPool, Values};
use flick_exec::Value;
use flick_wire::Grammar;
use hashbrown::HashTable;
use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A dictionary of fixed capacity whose storage is made when it is
/// created and reused as entries come and go: inserting allocates only
/// while a key (or a string value) is longer than any the reused entry
/// held before. Integers and booleans are held in the entry itself;
/// strings in the entry's buffer, made at the declared maximum where
/// [`SharedState::bound_strings`] gave one.
struct Dict {
    /// Entry ids by the hash of their key.
    index: HashTable<u32>,
    entries: Vec<Entry>,
    /// Entry ids in insertion order, for eviction.
    order: VecDeque<u32>,
    /// Ids of entries removed, for the next keys to reuse.
    free: Vec<u32>,
    capacity: usize,
    /// Bytes each entry's string buffer is made with.
    string_room: usize,
    hasher: RandomState,
}

struct Entry {
    key: Vec<u8>,
    value: Held,
    /// A string value's bytes (while `value` is [`Held::Bytes`]), and the
    /// room kept for the next one.
    bytes: Vec<u8>,
}

/// What an entry holds.
enum Held {
    Nothing,
    Msg(Msg),
    Int(i64),
    Bool(bool),
    /// A string, in the entry's `bytes`.
    Bytes,
}

/// A value a dictionary entry is set to.
pub enum DictSet<'a> {
    Msg(Msg),
    Int(i64),
    Bool(bool),
    Bytes(&'a [u8]),
}

/// What a dictionary holds under a key, as compute code gets it: a
/// message (a copy from the pool), an integer, a boolean, or a string's
/// bytes in a message from the pool (`bytes` only).
pub enum DictGot {
    Msg(Msg),
    Int(i64),
    Bool(bool),
    Bytes(Msg),
}

/// A dictionary entry's value as the operator reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryRef<'a> {
    /// A message's wire bytes.
    Message(&'a [u8]),
    Int(i64),
    Bool(bool),
    Bytes(&'a [u8]),
}

/// A dictionary entry's value, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryValue {
    /// A message's wire bytes.
    Message(Vec<u8>),
    Int(i64),
    Bool(bool),
    Bytes(Vec<u8>),
}

impl EntryRef<'_> {
    pub fn to_owned(self) -> EntryValue {
        match self {
            EntryRef::Message(b) => EntryValue::Message(b.to_vec()),
            EntryRef::Int(n) => EntryValue::Int(n),
            EntryRef::Bool(b) => EntryValue::Bool(b),
            EntryRef::Bytes(b) => EntryValue::Bytes(b.to_vec()),
        }
    }
}

impl Entry {
    fn view(&self) -> Option<EntryRef<'_>> {
        Some(match &self.value {
            Held::Nothing => return None,
            Held::Msg(m) => EntryRef::Message(&m.bytes),
            Held::Int(n) => EntryRef::Int(*n),
            Held::Bool(b) => EntryRef::Bool(*b),
            Held::Bytes => EntryRef::Bytes(&self.bytes),
        })
    }

    /// Empties the entry, its message back to the pool; its buffers stay.
    fn clear(&mut self, pool: &MsgPool) {
        if let Held::Msg(m) = std::mem::replace(&mut self.value, Held::Nothing) {
            pool.give(m);
        }
        self.bytes.clear();
    }

    fn put(&mut self, value: DictSet<'_>, pool: &MsgPool) {
        self.clear(pool);
        self.value = match value {
            DictSet::Msg(m) => Held::Msg(m),
            DictSet::Int(n) => Held::Int(n),
            DictSet::Bool(b) => Held::Bool(b),
            DictSet::Bytes(b) => {
                self.bytes.extend_from_slice(b);
                Held::Bytes
            }
        };
    }
}

impl Dict {
    fn new(capacity: usize, string_room: usize) -> Dict {
        Dict {
            index: HashTable::with_capacity(capacity),
            entries: Vec::with_capacity(capacity),
            order: VecDeque::with_capacity(capacity),
            free: Vec::new(),
            capacity,
            string_room,
            hasher: RandomState::new(),
        }
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        let h = self.hasher.hash_one(key);
        let entries = &self.entries;
        self.index
            .find(h, |&id| entries[id as usize].key == key)
            .copied()
    }

    fn get(&self, key: &[u8]) -> Option<EntryRef<'_>> {
        self.entries[self.find(key)? as usize].view()
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn set(&mut self, key: &[u8], value: DictSet<'_>, pool: &MsgPool) {
        if let Some(id) = self.find(key) {
            self.entries[id as usize].put(value, pool);
            return;
        }
        let id = if let Some(id) = self.free.pop() {
            id
        } else if self.entries.len() < self.capacity {
            self.entries.push(Entry {
                key: Vec::new(),
                value: Held::Nothing,
                bytes: Vec::with_capacity(self.string_room),
            });
            self.entries.len() as u32 - 1
        } else {
            // Full: the oldest entry makes room, and its storage is reused.
            let oldest = self
                .order
                .pop_front()
                .expect("a full dictionary has entries");
            let h = self.hasher.hash_one(&self.entries[oldest as usize].key[..]);
            if let Ok(e) = self.index.find_entry(h, |&id| id == oldest) {
                e.remove();
            }
            self.entries[oldest as usize].clear(pool);
            oldest
        };
        let entry = &mut self.entries[id as usize];
        entry.key.clear();
        entry.key.extend_from_slice(key);
        entry.put(value, pool);
        let (hasher, entries) = (&self.hasher, &self.entries);
        self.index.insert_unique(hasher.hash_one(key), id, |&x| {
            hasher.hash_one(&entries[x as usize].key[..])
        });
        self.order.push_back(id);
    }

    /// Removes `key`'s entry; whether there was one.
    fn remove(&mut self, key: &[u8], pool: &MsgPool) -> bool {
        let Some(id) = self.find(key) else {
            return false;
        };
        let h = self.hasher.hash_one(key);
        if let Ok(e) = self.index.find_entry(h, |&x| x == id) {
            e.remove();
        }
        if let Some(at) = self.order.iter().position(|&x| x == id) {
            self.order.remove(at);
        }
        let entry = &mut self.entries[id as usize];
        entry.key.clear();
        entry.clear(pool);
        if self.free.capacity() == 0 {
            // Once: removals never outnumber the entries.
            self.free.reserve_exact(self.capacity);
        }
        self.free.push(id);
        true
    }

    /// Gives every entry's string buffer room for `room` bytes.
    fn reserve_strings(&mut self, room: usize) {
        self.string_room = room;
        for e in &mut self.entries {
            e.bytes.reserve_exact(room.saturating_sub(e.bytes.len()));
        }
    }
}

enum Var {
    Value(Value),
    Dict(Dict),
}

/// One scope's variables.
pub struct SharedState {
    vars: Mutex<Vec<Var>>,
    capacity: usize,
    /// Changes made so far (stores and dictionary writes): whoever saves
    /// the state compares it with what it saw last.
    changes: AtomicU64,
    /// Per variable: bytes each entry of its dictionary keeps for a
    /// string value (its declared maximum, where that is small).
    string_rooms: Vec<AtomicUsize>,
}

/// The largest declared string maximum a dictionary's entries are made
/// with room for; longer bounds (1 MiB unless declared) grow as used.
pub const STRING_ROOM_MAX: usize = 4096;

impl SharedState {
    /// `n` variables; dictionaries created in them hold `capacity` entries.
    pub fn new(n: usize, capacity: usize) -> SharedState {
        SharedState {
            vars: Mutex::new((0..n).map(|_| Var::Value(Value::Unit)).collect()),
            capacity: capacity.max(1),
            changes: AtomicU64::new(0),
            string_rooms: (0..n).map(|_| AtomicUsize::new(0)).collect(),
        }
    }

    /// How many changes were made so far; it only grows.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    fn string_room(&self, i: u16) -> usize {
        self.string_rooms
            .get(i as usize)
            .map_or(0, |r| r.load(Ordering::Relaxed))
    }

    /// Variable `i` is a dictionary of strings of at most `max` bytes:
    /// each of its entries keeps that much room for its value (where
    /// `max` is at most [`STRING_ROOM_MAX`]), so setting one allocates
    /// nothing.
    pub(crate) fn bound_strings(&self, i: u16, max: u64) {
        let Some(room) = self.string_rooms.get(i as usize) else {
            return;
        };
        let Ok(max) = usize::try_from(max) else {
            return;
        };
        if max > STRING_ROOM_MAX {
            return;
        }
        room.store(max, Ordering::Relaxed);
        if let Some(Var::Dict(d)) = self.vars.lock().expect("state lock").get_mut(i as usize) {
            d.reserve_strings(max);
        }
    }

    /// Every variable unset again, for a new instance (`local` state).
    pub fn reset(&mut self) {
        for v in self.vars.get_mut().expect("state lock").iter_mut() {
            *v = Var::Value(Value::Unit);
        }
    }

    pub fn load(&self, i: u16) -> Value {
        match self.vars.lock().expect("state lock").get(i as usize) {
            Some(Var::Value(v)) => v.clone(),
            Some(Var::Dict(_)) => Value::Dict { state: i },
            None => Value::Unit,
        }
    }

    pub fn store(&self, i: u16, v: Value) {
        let mut vars = self.vars.lock().expect("state lock");
        let Some(slot) = vars.get_mut(i as usize) else {
            return;
        };
        // Storing a fresh `empty_dict` gives the variable a dictionary, once:
        // every instance of a process initialises shared state again.
        *slot = match (v, &*slot) {
            (Value::Dict { state: u16::MAX }, Var::Dict(_)) => return,
            (Value::Dict { state: u16::MAX }, _) => {
                Var::Dict(Dict::new(self.capacity, self.string_room(i)))
            }
            (v, _) => Var::Value(v),
        };
        self.changed();
    }

    /// Sets a variable unless an instance did already: `global` state is
    /// initialised by the first instance of its process.
    pub fn init_once(&self, i: u16, v: Value) {
        let unset = matches!(
            self.vars.lock().expect("state lock").get(i as usize),
            Some(Var::Value(Value::Unit))
        );
        if unset {
            self.store(i, v);
        }
    }

    /// What dictionary `i` holds under `key`: messages and strings in
    /// messages from `pool` (taken from its free ones: no allocation once
    /// warm), integers and booleans as they are.
    pub fn dict_get(&self, i: u16, key: &[u8], pool: &MsgPool) -> Option<DictGot> {
        let vars = self.vars.lock().expect("state lock");
        let Some(Var::Dict(d)) = vars.get(i as usize) else {
            return None;
        };
        let id = d.find(key)?;
        let e = &d.entries[id as usize];
        Some(match &e.value {
            Held::Nothing => return None,
            Held::Msg(m) => DictGot::Msg(pool.copy(m)),
            Held::Int(n) => DictGot::Int(*n),
            Held::Bool(b) => DictGot::Bool(*b),
            Held::Bytes => {
                let mut m = pool.take();
                m.bytes.extend_from_slice(&e.bytes);
                DictGot::Bytes(m)
            }
        })
    }

    /// The bytes of the message or string dictionary `i` holds under `key`.
    pub fn entry_bytes(&self, i: u16, key: &[u8], pool: &MsgPool) -> Option<Vec<u8>> {
        match self.dict_get(i, key, pool)? {
            DictGot::Msg(m) | DictGot::Bytes(m) => {
                let bytes = m.bytes.clone();
                pool.give(m);
                Some(bytes)
            }
            _ => None,
        }
    }

    /// Sets `key` of dictionary `i` (the oldest entry evicted where it is
    /// full); a message given to a variable that is no dictionary goes
    /// back to the pool.
    pub fn dict_set(&self, i: u16, key: &[u8], value: DictSet<'_>, pool: &MsgPool) {
        let mut vars = self.vars.lock().expect("state lock");
        match vars.get_mut(i as usize) {
            Some(Var::Dict(d)) => {
                d.set(key, value, pool);
                self.changed();
            }
            _ => {
                if let DictSet::Msg(m) = value {
                    pool.give(m)
                }
            }
        }
    }
}

/// A `global` dictionary as the operator reads and writes it (`flick
/// serve`'s API, a redeploy carrying it over, the state directory): its
/// entries hold messages of the grammar, written as their wire bytes and
/// parsed with the unit of the dictionary's value type.
pub struct GlobalDict<'a> {
    state: &'a SharedState,
    index: u16,
    pool: &'a MsgPool,
    grammar: &'a Arc<Grammar>,
}

/// What an operator's dictionary operation could not do.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DictError {
    #[error("it holds a value that is not a dictionary")]
    NotDict,
    #[error(
        "the dictionary is full: {len} entries of its capacity of {capacity}; delete one first"
    )]
    Full { len: usize, capacity: usize },
    #[error("the grammar has no unit `{0}` to read its messages with")]
    NoUnit(String),
    #[error("the bytes are not one whole `{unit}` message: {why}")]
    Parse { unit: String, why: String },
    #[error("a message is written with its grammar unit (`insert`)")]
    MessageWithoutUnit,
}

/// A dictionary's size now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DictSize {
    pub len: usize,
    pub capacity: usize,
}

impl<'a> GlobalDict<'a> {
    pub(crate) fn new(
        state: &'a SharedState,
        index: u16,
        pool: &'a MsgPool,
        grammar: &'a Arc<Grammar>,
    ) -> GlobalDict<'a> {
        GlobalDict {
            state,
            index,
            pool,
            grammar,
        }
    }

    /// Runs `f` on the dictionary (made empty first if no instance has
    /// made it yet and `make`), under the state's lock.
    fn with<T>(&self, make: bool, f: impl FnOnce(&mut Dict) -> T) -> Result<Option<T>, DictError> {
        let mut vars = self.state.vars.lock().expect("state lock");
        let Some(var) = vars.get_mut(self.index as usize) else {
            return Err(DictError::NotDict);
        };
        if make && matches!(var, Var::Value(Value::Unit)) {
            // The program's initialiser then leaves it alone, as it leaves
            // a dictionary another instance made.
            *var = Var::Dict(Dict::new(
                self.state.capacity,
                self.state.string_room(self.index),
            ));
        }
        match var {
            Var::Dict(d) => Ok(Some(f(d))),
            Var::Value(Value::Unit) => Ok(None),
            Var::Value(_) => Err(DictError::NotDict),
        }
    }

    /// Its values are strings of at most `max` bytes: each entry is made
    /// with room for one (where `max` is at most [`STRING_ROOM_MAX`]), so
    /// the program's sets allocate nothing.
    pub fn bound_strings(&self, max: u64) {
        self.state.bound_strings(self.index, max);
    }

    /// Its entries and capacity (no entries while nothing made it yet).
    pub fn size(&self) -> Result<DictSize, DictError> {
        let size = self.with(false, |d| DictSize {
            len: d.len(),
            capacity: d.capacity,
        })?;
        Ok(size.unwrap_or(DictSize {
            len: 0,
            capacity: self.state.capacity,
        }))
    }

    /// What the entry under `key` holds.
    pub fn get(&self, key: &[u8]) -> Result<Option<EntryValue>, DictError> {
        let got = self.with(false, |d| d.get(key).map(EntryRef::to_owned))?;
        Ok(got.flatten())
    }

    /// Calls `f` with the key and value of at most `limit` entries from
    /// the `start`th, oldest first (the order a full dictionary evicts
    /// in); the dictionary's size.
    pub fn entries(
        &self,
        start: usize,
        limit: usize,
        mut f: impl FnMut(&[u8], EntryRef<'_>),
    ) -> Result<DictSize, DictError> {
        self.with(false, |d| {
            for &id in d.order.iter().skip(start).take(limit) {
                let e = &d.entries[id as usize];
                if let Some(v) = e.view() {
                    f(&e.key, v);
                }
            }
        })?;
        self.size()
    }

    /// Sets `key` to an integer, a boolean or a string (a dictionary of
    /// such values: the caller checks the declared type); a new key in a
    /// full dictionary is refused rather than evict anything. Whether the
    /// key is new.
    pub fn insert_value(&self, key: &[u8], value: EntryRef<'_>) -> Result<bool, DictError> {
        let value = match value {
            EntryRef::Int(n) => DictSet::Int(n),
            EntryRef::Bool(b) => DictSet::Bool(b),
            EntryRef::Bytes(b) => DictSet::Bytes(b),
            EntryRef::Message(_) => return Err(DictError::MessageWithoutUnit),
        };
        self.put(key, value)
    }

    /// Sets `key` unless that needs an eviction; whether it is new. A
    /// message not taken goes back to the pool.
    fn put(&self, key: &[u8], value: DictSet<'_>) -> Result<bool, DictError> {
        let mut given = Some(value);
        let done = self.with(true, |d| {
            let new = d.find(key).is_none();
            if new && d.len() >= d.capacity {
                return Err(DictError::Full {
                    len: d.len(),
                    capacity: d.capacity,
                });
            }
            d.set(key, given.take().expect("set once"), self.pool);
            Ok(new)
        });
        if let Some(DictSet::Msg(m)) = given {
            self.pool.give(m);
        }
        let new = done?.expect("made")?;
        self.state.changed();
        Ok(new)
    }

    /// Sets `key` to the message `bytes` hold, parsed as one whole
    /// message of grammar unit `unit`; a new key in a full dictionary is
    /// refused rather than evict anything. Whether the key is new.
    pub fn insert(&self, key: &[u8], unit: &str, bytes: &[u8]) -> Result<bool, DictError> {
        let id = self
            .grammar
            .unit_id(unit)
            .ok_or_else(|| DictError::NoUnit(unit.to_string()))?;
        let mut parser = self.grammar.parser(id);
        let refuse = |why: String| DictError::Parse {
            unit: unit.to_string(),
            why,
        };
        match parser.parse(bytes) {
            Ok(flick_wire::Progress::Done(n)) if n == bytes.len() => {}
            Ok(flick_wire::Progress::Done(n)) => {
                return Err(refuse(format!(
                    "the message ends after {n} of the {} bytes",
                    bytes.len()
                )))
            }
            Ok(flick_wire::Progress::NeedMore) => {
                return Err(refuse("the bytes end inside the message".into()))
            }
            Ok(_) => return Err(refuse("a message whose body streams is not held".into())),
            Err(e) => return Err(refuse(e.to_string())),
        }
        let mut m = self.pool.take();
        m.bytes.extend_from_slice(bytes);
        self.pool
            .copy_values(&mut m, Values::parsed(&parser), parser.slots());
        self.put(key, DictSet::Msg(m))
    }

    /// Removes `key`'s entry; whether there was one.
    pub fn remove(&self, key: &[u8]) -> Result<bool, DictError> {
        let removed = self
            .with(false, |d| d.remove(key, self.pool))?
            .unwrap_or(false);
        if removed {
            self.state.changed();
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg<'a>(pool: &MsgPool, b: &[u8]) -> DictSet<'a> {
        let mut m = pool.take();
        m.bytes.extend_from_slice(b);
        DictSet::Msg(m)
    }

    fn got_bytes(got: Option<DictGot>) -> Option<Vec<u8>> {
        match got? {
            DictGot::Msg(m) | DictGot::Bytes(m) => Some(m.bytes),
            _ => None,
        }
    }

    #[test]
    fn a_full_dictionary_evicts_its_oldest_entry_and_replaces_in_place() {
        let pool = MsgPool::new(16, 1, 0, 0);
        let state = SharedState::new(1, 3);
        state.store(0, Value::Dict { state: u16::MAX });
        for k in [b"a", b"b", b"c"] {
            state.dict_set(0, k, msg(&pool, k), &pool);
        }
        // Replacing keeps the entry's age.
        state.dict_set(0, b"a", msg(&pool, b"A"), &pool);
        state.dict_set(0, b"d", msg(&pool, b"d"), &pool);
        let get = |k: &[u8]| got_bytes(state.dict_get(0, k, &pool));
        assert_eq!(get(b"a"), None, "the oldest insert goes first");
        assert_eq!(get(b"b"), Some(b"b".to_vec()));
        assert_eq!(get(b"d"), Some(b"d".to_vec()));
        state.dict_set(0, b"e", msg(&pool, b"e"), &pool);
        assert_eq!(get(b"b"), None);
        assert_eq!(get(b"c"), Some(b"c".to_vec()));
        assert_eq!(get(b"e"), Some(b"e".to_vec()));
    }

    #[test]
    fn a_removed_entry_makes_room_without_evicting_and_its_storage_is_reused() {
        let pool = MsgPool::new(16, 1, 0, 0);
        let state = SharedState::new(1, 2);
        state.store(0, Value::Dict { state: u16::MAX });
        state.dict_set(0, b"a", msg(&pool, b"a"), &pool);
        state.dict_set(0, b"b", msg(&pool, b"b"), &pool);
        let before = state.changes();
        {
            let mut vars = state.vars.lock().unwrap();
            let Var::Dict(d) = &mut vars[0] else {
                panic!("a dictionary")
            };
            assert!(d.remove(b"a", &pool));
            assert!(!d.remove(b"a", &pool));
            assert_eq!(d.len(), 1);
        }
        state.dict_set(0, b"c", msg(&pool, b"c"), &pool);
        assert!(state.changes() > before);
        let get = |k: &[u8]| got_bytes(state.dict_get(0, k, &pool));
        assert_eq!(get(b"b"), Some(b"b".to_vec()), "nothing was evicted");
        assert_eq!(get(b"c"), Some(b"c".to_vec()));
        assert_eq!(get(b"a"), None);
        // Full again: the oldest (b) goes first.
        state.dict_set(0, b"d", msg(&pool, b"d"), &pool);
        assert_eq!(get(b"b"), None);
        assert_eq!(get(b"c"), Some(b"c".to_vec()));
    }

    fn int(got: Option<DictGot>) -> Option<i64> {
        match got? {
            DictGot::Int(n) => Some(n),
            _ => None,
        }
    }

    #[test]
    fn integers_booleans_and_strings_are_held_and_evict_as_messages_do() {
        let pool = MsgPool::new(16, 1, 0, 0);
        let state = SharedState::new(1, 2);
        state.store(0, Value::Dict { state: u16::MAX });
        state.dict_set(0, b"a", DictSet::Int(1), &pool);
        state.dict_set(0, b"b", DictSet::Bool(true), &pool);
        assert_eq!(int(state.dict_get(0, b"a", &pool)), Some(1));
        assert!(matches!(
            state.dict_get(0, b"b", &pool),
            Some(DictGot::Bool(true))
        ));
        assert!(state.dict_get(0, b"z", &pool).is_none(), "a missing key");
        // Replacing keeps the age; a new key evicts the oldest (a).
        state.dict_set(0, b"a", DictSet::Int(2), &pool);
        state.dict_set(0, b"c", DictSet::Bytes(b"three"), &pool);
        assert!(state.dict_get(0, b"a", &pool).is_none());
        assert_eq!(
            got_bytes(state.dict_get(0, b"c", &pool)),
            Some(b"three".to_vec())
        );
        // A string replaced by a shorter one, and by an integer.
        state.dict_set(0, b"c", DictSet::Bytes(b"3"), &pool);
        assert_eq!(
            got_bytes(state.dict_get(0, b"c", &pool)),
            Some(b"3".to_vec())
        );
        state.dict_set(0, b"c", DictSet::Int(3), &pool);
        assert_eq!(int(state.dict_get(0, b"c", &pool)), Some(3));
    }

    #[test]
    fn bounded_strings_are_held_in_room_made_with_the_entry() {
        let pool = MsgPool::new(16, 1, 0, 0);
        let state = SharedState::new(1, 4);
        state.bound_strings(0, 16);
        state.store(0, Value::Dict { state: u16::MAX });
        state.dict_set(0, b"k", DictSet::Bytes(b"x"), &pool);
        let vars = state.vars.lock().unwrap();
        let Var::Dict(d) = &vars[0] else {
            panic!("a dictionary")
        };
        assert!(d.entries[0].bytes.capacity() >= 16);
        drop(vars);
        // A bound past the most kept is left to grow as used.
        let wide = SharedState::new(1, 4);
        wide.bound_strings(0, 1 << 20);
        assert_eq!(wide.string_room(0), 0);
    }

    #[test]
    fn the_operator_writes_values_without_evicting() {
        let pool = Arc::new(MsgPool::new(16, 1, 0, 0));
        let grammar = Grammar::stock("http").expect("the stock HTTP grammar");
        let state = SharedState::new(1, 2);
        let d = GlobalDict::new(&state, 0, &pool, &grammar);
        assert_eq!(d.insert_value(b"a", EntryRef::Int(7)), Ok(true));
        assert_eq!(d.insert_value(b"a", EntryRef::Int(8)), Ok(false));
        assert_eq!(d.insert_value(b"b", EntryRef::Bytes(b"hi")), Ok(true));
        assert_eq!(
            d.insert_value(b"c", EntryRef::Bool(true)),
            Err(DictError::Full {
                len: 2,
                capacity: 2
            })
        );
        assert_eq!(d.get(b"a"), Ok(Some(EntryValue::Int(8))));
        let mut seen = Vec::new();
        d.entries(0, 10, |k, v| seen.push((k.to_vec(), v.to_owned())))
            .unwrap();
        assert_eq!(
            seen,
            [
                (b"a".to_vec(), EntryValue::Int(8)),
                (b"b".to_vec(), EntryValue::Bytes(b"hi".to_vec()))
            ]
        );
        assert_eq!(d.remove(b"a"), Ok(true));
        assert_eq!(d.get(b"a"), Ok(None));
    }

    #[test]
    fn setting_integers_booleans_and_bounded_strings_allocates_nothing() {
        let pool = MsgPool::new(16, 1, 0, 0);
        let state = SharedState::new(1, 8);
        state.bound_strings(0, 16);
        state.store(0, Value::Dict { state: u16::MAX });
        let keys: Vec<[u8; 4]> = (0..32u32).map(|i| i.to_be_bytes()).collect();
        // Round 0 warms: every entry made, and the pool's message.
        let mut before = 0;
        for round in 0..100i64 {
            if round == 1 {
                before = counting::allocations();
            }
            for (i, k) in keys.iter().enumerate() {
                // New keys evict the oldest; old ones are replaced.
                let value = match i % 3 {
                    0 => DictSet::Int(round),
                    1 => DictSet::Bool(round % 2 == 0),
                    _ => DictSet::Bytes(b"sixteen bytes!!!"),
                };
                state.dict_set(0, k, value, &pool);
                // A string read comes in a message of the pool, which goes
                // back (compute code's at the end of its rule).
                match state.dict_get(0, k, &pool) {
                    Some(DictGot::Bytes(m) | DictGot::Msg(m)) => pool.give(m),
                    Some(_) => {}
                    None => panic!("just set"),
                }
            }
        }
        assert_eq!(counting::allocations() - before, 0);
    }
}

/// Counts this thread's allocations, for the tests above.
#[cfg(test)]
mod counting {
    use flick_testkit::alloc::CountingAlloc;

    #[global_allocator]
    static ALLOC: CountingAlloc = CountingAlloc::new();

    pub fn allocations() -> u64 {
        ALLOC.this_thread()
    }
}
