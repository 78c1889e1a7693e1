//! The text of `flick check --bounds`.

use flick_check::CheckedProgram;
use std::fmt::Write;

/// Per process: the memory bound of one instance with its parts, the shared
/// global state, and the worst-case operations per input message per rule.
pub fn bounds_report(program: &CheckedProgram) -> String {
    let mut out = String::new();
    for p in &program.processes {
        let b = &p.bounds;
        let _ = writeln!(out, "process {}", p.name);
        let _ = writeln!(out, "  memory per instance: {}", bytes(b.instance_bytes));
        for (what, n) in &b.instance_parts {
            let _ = writeln!(out, "    {:<48} {}", what, bytes(*n));
        }
        let _ = writeln!(
            out,
            "  global state (shared by all instances): {}",
            bytes(b.global_bytes)
        );
        let _ = writeln!(
            out,
            "  operations per input message: at most {}",
            b.max_ops()
        );
        for (rule, n) in &b.rule_ops {
            let _ = writeln!(out, "    {:<48} {}", rule, n);
        }
    }
    out
}

/// Exact bytes, with a binary-unit reading for large values.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = "";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{n} B ({v:.1} {unit})")
}
