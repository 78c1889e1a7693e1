//! The stock grammars compiled ahead of time: Rust parsers generated from
//! `grammars/*.grammar` by `flick_wire::codegen` when this crate builds.
//!
//! [`install`] registers them with `flick-wire`; parsers made after that
//! for a stock grammar run the generated code first on each message and
//! fall back to the interpreter for everything it does not finish
//! (split messages, streamed bodies, errors). A grammar that differs from
//! the one compiled here, a user's grammar for instance, is interpreted.
//!
//! This crate owns no parsing logic of its own and touches no sockets.

/// The generated modules, one per stock grammar.
pub mod generated {
    pub mod http {
        include!(concat!(env!("OUT_DIR"), "/http.rs"));
    }
    pub mod memcached_binary {
        include!(concat!(env!("OUT_DIR"), "/memcached_binary.rs"));
    }
    pub mod memcached_ascii {
        include!(concat!(env!("OUT_DIR"), "/memcached_ascii.rs"));
    }
    pub mod hadoop_ifile {
        include!(concat!(env!("OUT_DIR"), "/hadoop_ifile.rs"));
    }
    pub mod packet {
        include!(concat!(env!("OUT_DIR"), "/packet.rs"));
    }
}

/// Every compiled stock grammar.
pub static ALL: [&flick_wire::rt::CompiledGrammar; 5] = [
    &generated::http::GRAMMAR,
    &generated::memcached_binary::GRAMMAR,
    &generated::memcached_ascii::GRAMMAR,
    &generated::hadoop_ifile::GRAMMAR,
    &generated::packet::GRAMMAR,
];

/// Each unit's fields of a compiled grammar as constants, by unit name
/// (`generated::NAME::fields::UNITS`).
pub type FieldTables = &'static [(
    &'static str,
    &'static [(&'static str, flick_wire::FieldRef)],
)];

/// Every stock grammar's field constants, by grammar name: for code that
/// reads fields of the stock grammars at offsets known when it compiles
/// (`generated::packet::fields::frame::IP4_SRC`).
pub static FIELDS: [(&str, FieldTables); 5] = [
    ("http", generated::http::fields::UNITS),
    (
        "memcached_binary",
        generated::memcached_binary::fields::UNITS,
    ),
    ("memcached_ascii", generated::memcached_ascii::fields::UNITS),
    ("hadoop_ifile", generated::hadoop_ifile::fields::UNITS),
    ("packet", generated::packet::fields::UNITS),
];

/// Each unit's headers of a compiled grammar, by unit name: each
/// header's path, start slot and length
/// (`generated::NAME::headers::UNITS`).
pub type HeaderTables = &'static [(&'static str, &'static [(&'static str, u16, usize)])];

/// Every stock grammar's header constants, by grammar name: for code that
/// takes a header whole and reads its fields at offsets known when it
/// compiles (`generated::packet::headers::frame::IP4`).
pub static HEADERS: [(&str, HeaderTables); 5] = [
    ("http", generated::http::headers::UNITS),
    (
        "memcached_binary",
        generated::memcached_binary::headers::UNITS,
    ),
    (
        "memcached_ascii",
        generated::memcached_ascii::headers::UNITS,
    ),
    ("hadoop_ifile", generated::hadoop_ifile::headers::UNITS),
    ("packet", generated::packet::headers::UNITS),
];

/// Registers every compiled stock grammar; call it before making parsers.
pub fn install() {
    for g in ALL {
        flick_wire::compiled::register(g);
    }
}
