//! The documented defaults that bound every value a program holds.
//!
//! A program overrides each one where it declares the value, with an
//! annotation: `string {max=250}`, `list<kv> {max=16}`,
//! `dict<string*cmd> {capacity=4096}`, `[cmd/cmd] {max=8} backends`.
//! A packet program's `global` dictionary may also say how long an entry
//! lives untouched and what makes room when it is full:
//! `dict<string*integer> {capacity=65536, idle=30, evict=lru}`.

/// Maximum bytes of a `string` or `bytes` value without `size` or `max`
/// (Memcached's default item size limit).
pub const DEFAULT_BYTES_MAX: u64 = 1 << 20;
/// Maximum elements of a `list` without `max`.
pub const DEFAULT_LIST_MAX: u64 = 64;
/// Entries of a `dict` without `capacity`; a full dictionary evicts.
pub const DEFAULT_DICT_CAPACITY: u64 = 1024;
/// Channels in a channel array without `max` (backends, mappers).
pub const DEFAULT_CHANNEL_ARRAY_MAX: u64 = 64;
/// Width of an `integer` without `size`, in bytes.
pub const DEFAULT_INTEGER_BYTES: u8 = 8;
/// What `evict=` may name: `refuse` (a full dictionary refuses new keys,
/// the default), `lru` (the least recently used entry makes room), `idle`
/// (only an entry idle past `idle=` seconds makes room).
pub const EVICT_POLICIES: &[&str] = &["refuse", "lru", "idle"];
