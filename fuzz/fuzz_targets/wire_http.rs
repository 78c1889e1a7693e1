//! The `http` stock grammar on arbitrary bytes: see `wire_common` for the
//! input layout and the checks.

#![no_main]

#[path = "wire_common/mod.rs"]
mod wire_common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| wire_common::check("http", data));
