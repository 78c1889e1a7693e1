//! The grammars shipped with Flick. Their sources live in `grammars/` at
//! the repository root and are embedded here; like any user grammar they
//! are parsed and compiled when loaded.

/// Every stock grammar, by the name a program's `grammar` line uses.
pub const NAMES: &[&str] = &["memcached_binary"];

pub fn source(name: &str) -> Option<&'static str> {
    Some(match name {
        "memcached_binary" => include_str!("../../../grammars/memcached_binary.grammar"),
        _ => return None,
    })
}
