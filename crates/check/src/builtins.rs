//! The built-in functions every program can call.

/// Built-ins, in the order `docs/language.md` lists them.
pub const BUILTINS: &[&str] = &[
    "hash",
    "least_connections",
    "len",
    "empty_dict",
    "all_ready",
    "fold",
    "map",
    "filter",
    "starts_with",
    "ends_with",
    "contains",
    "lower",
    "substring",
    "to_int",
    "to_string",
    "split_once",
    "header",
    "pack",
    "frame_len",
    "set_ttl",
    "set_ip_src",
    "set_ip_dst",
    "set_src_port",
    "set_dst_port",
    "set_dscp",
    "broadcast",
    "in_prefix",
    "min",
    "max",
    "log",
    "meter",
    "bloom_add",
    "bloom_has",
    "bloom_clear",
];

/// The built-ins of packet programs, checked in `packets.rs`.
pub const PACKET_BUILTINS: &[&str] = &[
    "pack",
    "frame_len",
    "broadcast",
    "in_prefix",
    "min",
    "max",
    "set_ttl",
    "set_ip_src",
    "set_ip_dst",
    "set_src_port",
    "set_dst_port",
    "set_dscp",
    "log",
    "meter",
    "bloom_add",
    "bloom_has",
    "bloom_clear",
];

/// The built-ins on meters and Bloom filters (packet state), checked in
/// `packets.rs`; each takes the state variable first.
pub const OBJECT_BUILTINS: &[&str] = &["meter", "bloom_add", "bloom_has", "bloom_clear"];

/// What a fresh meter and a fresh Bloom filter are written as, in a state
/// variable's initialiser (as `empty_dict` is a fresh dictionary).
pub const NEW_METER: &str = "new_meter";
pub const NEW_BLOOM: &str = "new_bloom";

/// The packet built-ins that edit the frame a rule is handling.
pub const HEADER_EDITS: &[&str] = &[
    "set_ttl",
    "set_ip_src",
    "set_ip_dst",
    "set_src_port",
    "set_dst_port",
    "set_dscp",
];

/// The built-ins on strings (and bytes), checked in `strings.rs`.
pub const STRING_BUILTINS: &[&str] = &[
    "starts_with",
    "ends_with",
    "contains",
    "lower",
    "substring",
    "to_int",
    "to_string",
    "split_once",
    "header",
];

/// The most bytes `to_string` gives: `-9223372036854775808`.
pub const INT_STRING_MAX: u64 = 20;

pub fn is_builtin(name: &str) -> bool {
    BUILTINS.contains(&name)
}
