//! Process state: `global` variables shared by every instance of a process
//! (safely across workers) and `local` ones per instance. Dictionaries hold
//! at most their declared capacity and evict the oldest entry to make room.

use crate::msg::{Msg, MsgPool};
use flick_exec::Value;
use hashbrown::HashTable;
use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

/// A dictionary of fixed capacity whose storage is made when it is
/// created and reused as entries come and go: inserting allocates only
/// while a key is longer than any the reused entry held before.
struct Dict {
    /// Entry ids by the hash of their key.
    index: HashTable<u32>,
    entries: Vec<Entry>,
    /// Entry ids in insertion order, for eviction.
    order: VecDeque<u32>,
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

    fn set(&mut self, key: &[u8], value: Msg, pool: &MsgPool) {
        if let Some(id) = self.find(key) {
            if let Some(old) = self.entries[id as usize].msg.replace(value) {
                pool.give(old);
            }
            return;
        }
        let id = if self.entries.len() < self.capacity {
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
}

enum Var {
    Value(Value),
    Dict(Dict),
}

/// One scope's variables.
pub struct SharedState {
    vars: Mutex<Vec<Var>>,
    capacity: usize,
}

impl SharedState {
    /// `n` variables; dictionaries created in them hold `capacity` entries.
    pub fn new(n: usize, capacity: usize) -> SharedState {
        SharedState {
            vars: Mutex::new((0..n).map(|_| Var::Value(Value::Unit)).collect()),
            capacity: capacity.max(1),
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
            (Value::Dict { state: u16::MAX }, _) => Var::Dict(Dict::new(self.capacity)),
            (v, _) => Var::Value(v),
        };
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
            Some(Var::Dict(d)) => d.set(key, value, pool),
            _ => pool.give(value),
        }
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
}
