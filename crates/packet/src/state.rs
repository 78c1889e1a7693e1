//! A worker's shard of the process's `global` state, and the dump that
//! merges every shard at the end (or on request).
//!
//! Each worker owns its shard outright, so state needs no locks: steering
//! sends every frame of a flow to one worker, and that flow's entries live
//! there. A dictionary holds at most `capacity` entries per shard; once
//! full, new keys are refused (counted as `dict_full`) while the keys it
//! holds are still updated, so a flood of new flows cannot evict the state
//! of established ones.

use flick_exec::{Fault, Value};
use hashbrown::HashMap;
use serde_json::{Map, Number, Value as Json};
use std::sync::Arc;

/// Tags of encoded dictionary keys: a key of any value is one byte string,
/// so that lookups borrow a reused buffer and allocate nothing.
const KEY_INT: u8 = 0;
const KEY_BOOL: u8 = 1;
const KEY_BYTES: u8 = 2;
const KEY_NONE: u8 = 3;
const KEY_TUPLE: u8 = 4;

pub(crate) struct Dict {
    entries: HashMap<StoredKey, Value>,
    capacity: usize,
}

/// Room a dictionary is made with; it grows (as new keys are added) to
/// its capacity.
const INITIAL_ENTRIES: usize = 1024;

/// Longest key kept inside its entry: `flow_key5` of an IPv4 frame (five
/// packed integers, 46 bytes encoded) fits.
const INLINE_KEY: usize = 46;

/// An encoded key as a dictionary keeps it: a short one inside the entry,
/// so a lookup compares it where the hash led without following a pointer
/// to another cache line; a longer one on the heap.
#[derive(Clone)]
enum StoredKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl StoredKey {
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
}

/// One worker's state variables, by the process's state index.
pub(crate) struct Shard {
    pub vars: Vec<Var>,
    capacity: usize,
    /// Keys refused because their dictionary was full.
    pub dict_full: u64,
}

impl Shard {
    pub fn new(n: usize, capacity: usize) -> Shard {
        Shard {
            vars: (0..n).map(|_| Var::Value(Value::Unit)).collect(),
            capacity: capacity.max(1),
            dict_full: 0,
        }
    }

    pub fn load(&self, i: u16) -> Value {
        match self.vars.get(i as usize) {
            Some(Var::Value(v)) => v.clone(),
            Some(Var::Dict(_)) => Value::Dict { state: i },
            None => Value::None,
        }
    }

    /// Stores `v`, whose bytes are already owned (see [`own`]); a fresh
    /// `empty_dict` makes (or empties) the variable's dictionary.
    pub fn store(&mut self, i: u16, v: Value) -> Result<(), Fault> {
        let capacity = self.capacity;
        let slot = self
            .vars
            .get_mut(i as usize)
            .ok_or_else(|| Fault::Host(format!("no state variable {i}")))?;
        match v {
            Value::Dict { state } if state == u16::MAX => match slot {
                Var::Dict(d) => d.entries.clear(),
                _ => {
                    // Grown as keys come, up to `capacity`: a table sized
                    // for the most keys but holding few spreads them over
                    // more cache lines than it needs.
                    *slot = Var::Dict(Dict {
                        entries: HashMap::with_capacity(capacity.min(INITIAL_ENTRIES)),
                        capacity,
                    })
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

    pub fn dict_get(&mut self, i: u16, key: &[u8]) -> Result<Value, Fault> {
        Ok(self
            .dict(i)?
            .entries
            .get(key)
            .cloned()
            .unwrap_or(Value::None))
    }

    pub fn dict_set(&mut self, i: u16, key: &[u8], v: Value) -> Result<(), Fault> {
        let d = self.dict(i)?;
        if let Some(old) = d.entries.get_mut(key) {
            *old = v;
        } else if d.entries.len() < d.capacity {
            d.entries.insert(StoredKey::new(key), v);
        } else {
            self.dict_full += 1;
        }
        Ok(())
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
        let mut s = String::with_capacity(2 + 2 * b.len());
        s.push_str("0x");
        for c in b {
            s.push_str(&format!("{c:02x}"));
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
    for (i, name) in names.iter().enumerate() {
        let mut entry: Option<Json> = None;
        for shard in shards {
            let v = match &shard.vars[i] {
                Var::Value(v) => json(v),
                Var::Dict(d) => {
                    let mut m = Map::new();
                    for (k, v) in &d.entries {
                        let key = decode_key(k.as_bytes());
                        let v = json(v);
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
        out.insert(name.to_string(), entry.unwrap_or(Json::Null));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
