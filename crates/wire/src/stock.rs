//! The grammars shipped with Flick. Their sources live in `grammars/` at
//! the repository root and are embedded here; like any user grammar they
//! are parsed and compiled when loaded.

/// Every stock grammar, by the name a program's `grammar` line uses.
pub const NAMES: &[&str] = &[
    "http",
    "memcached_binary",
    "memcached_ascii",
    "hadoop_ifile",
    "packet",
];

pub fn source(name: &str) -> Option<&'static str> {
    Some(match name {
        "http" => include_str!("../../../grammars/http.grammar"),
        "memcached_binary" => include_str!("../../../grammars/memcached_binary.grammar"),
        "memcached_ascii" => include_str!("../../../grammars/memcached_ascii.grammar"),
        "hadoop_ifile" => include_str!("../../../grammars/hadoop_ifile.grammar"),
        "packet" => include_str!("../../../grammars/packet.grammar"),
        _ => return None,
    })
}
