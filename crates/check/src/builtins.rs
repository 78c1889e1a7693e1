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
];

pub fn is_builtin(name: &str) -> bool {
    BUILTINS.contains(&name)
}
