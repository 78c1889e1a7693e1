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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A dictionary of fixed capacity whose storage is made when it is
/// created and reused as entries come and go: inserting allocates only
/// while a key is longer than any the reused entry held before.
struct Dict {
    /// Entry ids by the hash of their key.
    index: HashTable<u32>,
    entries: Vec<Entry>,
    /// Entry ids in insertion order, for eviction.
    order: VecDeque<u32>,
    /// Ids of entries removed, for the next keys to reuse.
    free: Vec<u32>,
    capacity: usize,
    hasher: RandomState,
}

struct Entry {
    key: Vec<u8>,
    msg: Option<Msg>,
}

impl Dict {
    fn new(capacity: usize) -> Dict {
        Dict {
            index: HashTable::with_capacity(capacity),
            entries: Vec::with_capacity(capacity),
            order: VecDeque::with_capacity(capacity),
            free: Vec::new(),
            capacity,
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

    fn get(&self, key: &[u8]) -> Option<&Msg> {
        self.entries[self.find(key)? as usize].msg.as_ref()
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn set(&mut self, key: &[u8], value: Msg, pool: &MsgPool) {
        if let Some(id) = self.find(key) {
            if let Some(old) = self.entries[id as usize].msg.replace(value) {
                pool.give(old);
            }
            return;
        }
        let id = if let Some(id) = self.free.pop() {
            id
        } else if self.entries.len() < self.capacity {
            self.entries.push(Entry {
                key: Vec::new(),
                msg: None,
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
            if let Some(m) = self.entries[oldest as usize].msg.take() {
                pool.give(m);
            }
            oldest
        };
        let entry = &mut self.entries[id as usize];
        entry.key.clear();
        entry.key.extend_from_slice(key);
        entry.msg = Some(value);
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
        if let Some(m) = entry.msg.take() {
            pool.give(m);
        }
        if self.free.capacity() == 0 {
            // Once: removals never outnumber the entries.
            self.free.reserve_exact(self.capacity);
        }
        self.free.push(id);
        true
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
}

impl SharedState {
    /// `n` variables; dictionaries created in them hold `capacity` entries.
    pub fn new(n: usize, capacity: usize) -> SharedState {
        SharedState {
            vars: Mutex::new((0..n).map(|_| Var::Value(Value::Unit)).collect()),
            capacity: capacity.max(1),
            changes: AtomicU64::new(0),
        }
    }

    /// How many changes were made so far; it only grows.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
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
            (Value::Dict { state: u16::MAX }, _) => Var::Dict(Dict::new(self.capacity)),
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

    pub fn dict_get(&self, i: u16, key: &[u8], pool: &MsgPool) -> Option<Msg> {
        let vars = self.vars.lock().expect("state lock");
        match vars.get(i as usize) {
            Some(Var::Dict(d)) => d.get(key).map(|m| pool.copy(m)),
            _ => None,
        }
    }

    pub fn dict_set(&self, i: u16, key: &[u8], value: Msg, pool: &MsgPool) {
        let mut vars = self.vars.lock().expect("state lock");
        match vars.get_mut(i as usize) {
            Some(Var::Dict(d)) => {
                d.set(key, value, pool);
                self.changed();
            }
            _ => pool.give(value),
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
            *var = Var::Dict(Dict::new(self.state.capacity));
        }
        match var {
            Var::Dict(d) => Ok(Some(f(d))),
            Var::Value(Value::Unit) => Ok(None),
            Var::Value(_) => Err(DictError::NotDict),
        }
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

    /// The wire bytes of the message under `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, DictError> {
        let got = self.with(false, |d| d.get(key).map(|m| m.bytes.clone()))?;
        Ok(got.flatten())
    }

    /// Calls `f` with the key and message bytes of at most `limit` entries
    /// from the `start`th, oldest first (the order a full dictionary
    /// evicts in); the dictionary's size.
    pub fn entries(
        &self,
        start: usize,
        limit: usize,
        mut f: impl FnMut(&[u8], &[u8]),
    ) -> Result<DictSize, DictError> {
        self.with(false, |d| {
            for &id in d.order.iter().skip(start).take(limit) {
                let e = &d.entries[id as usize];
                if let Some(m) = &e.msg {
                    f(&e.key, &m.bytes);
                }
            }
        })?;
        self.size()
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
        let mut given = Some(m);
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
        if let Some(m) = given {
            self.pool.give(m);
        }
        let new = done?.expect("made")?;
        self.state.changed();
        Ok(new)
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

    fn msg(pool: &MsgPool, b: &[u8]) -> Msg {
        let mut m = pool.take();
        m.bytes.extend_from_slice(b);
        m
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
        let get = |k: &[u8]| state.dict_get(0, k, &pool).map(|m| m.bytes);
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
        let get = |k: &[u8]| state.dict_get(0, k, &pool).map(|m| m.bytes);
        assert_eq!(get(b"b"), Some(b"b".to_vec()), "nothing was evicted");
        assert_eq!(get(b"c"), Some(b"c".to_vec()));
        assert_eq!(get(b"a"), None);
        // Full again: the oldest (b) goes first.
        state.dict_set(0, b"d", msg(&pool, b"d"), &pool);
        assert_eq!(get(b"b"), None);
        assert_eq!(get(b"c"), Some(b"c".to_vec()));
    }
}
