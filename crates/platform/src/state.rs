//! Process state: `global` variables shared by every instance of a process
//! (safely across workers) and `local` ones per instance. Dictionaries hold
//! at most their declared capacity and evict the oldest entry to make room.

use crate::msg::{Msg, MsgPool};
use flick_exec::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

struct Dict {
    entries: HashMap<Vec<u8>, Msg>,
    /// Keys in insertion order, for eviction.
    order: VecDeque<Vec<u8>>,
    capacity: usize,
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
            (Value::Dict { state: u16::MAX }, _) => Var::Dict(Dict {
                entries: HashMap::new(),
                order: VecDeque::new(),
                capacity: self.capacity,
            }),
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
            Some(Var::Dict(d)) => d.entries.get(key).map(|m| pool.copy(m)),
            _ => None,
        }
    }

    pub fn dict_set(&self, i: u16, key: Vec<u8>, value: Msg, pool: &MsgPool) {
        let mut vars = self.vars.lock().expect("state lock");
        let Some(Var::Dict(d)) = vars.get_mut(i as usize) else {
            pool.give(value);
            return;
        };
        if let Some(old) = d.entries.insert(key.clone(), value) {
            pool.give(old);
            return;
        }
        d.order.push_back(key);
        while d.entries.len() > d.capacity {
            let Some(oldest) = d.order.pop_front() else {
                break;
            };
            if let Some(m) = d.entries.remove(&oldest) {
                pool.give(m);
            }
        }
    }
}
