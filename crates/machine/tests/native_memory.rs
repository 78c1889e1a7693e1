//! Machine code is freed with the program that holds it: a Cranelift
//! module dropped keeps its pages, so without the free every table load
//! of a long run would leak them. Alone in its test binary, so that no
//! other test's allocations move the resident memory it measures.

use flick_machine::{lang, Program};
use std::path::Path;
use std::sync::Arc;

/// Resident memory of this process, bytes.
fn resident() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn code_is_freed_with_its_program() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/flowblaze/port_knocking.flick"),
    )
    .unwrap();
    let machine = lang::compile(&text).unwrap().machine;
    let round = || {
        for _ in 0..60 {
            let program = Arc::new(Program::new(machine.clone()).unwrap());
            assert!(program.code().is_some());
        }
    };
    round();
    let before = resident();
    round();
    let grown = resident().saturating_sub(before);
    // Each program's code takes pages of its own (about 8 KB): kept, 60
    // of them grew this process by 480 KB. Freed, the allocator's own
    // movement still reached 124 KB once, so the bound is half a leak.
    assert!(grown < 240 << 10, "{grown} bytes more after 60 programs");
}
