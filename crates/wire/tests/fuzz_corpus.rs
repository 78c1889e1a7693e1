//! Replays the `wire_*` fuzz corpora and the fuzzer's regressions
//! (`fuzz/corpus/wire_NAME/`, `fuzz/regressions/wire_NAME/`) through the
//! same checks as the fuzz targets, with plain `cargo test`.
//!
//! An input is `[unit, cut, stream...]`: the first byte picks a unit of the
//! grammar (modulo their number), the second a point to split the stream
//! at (scaled to its length), and the rest is a stream of messages of that
//! unit. For that unit:
//!
//! (a) the stream is parsed whole, as one piece, with the driver loop of a
//!     proxy (`Head`, `Stream`, `Done`, `reset`, `finish` at the end): no
//!     panic, at most `len * 4 + 16` calls, every count within the buffer,
//!     progress on every call;
//! (b) the stream split in two gives the same messages (heads, lengths,
//!     values) and the same error as whole;
//! (c) every message parsed whole (no streaming) serialises, and the
//!     serialised bytes (followed by what followed the message, which the
//!     parser may have looked at) parse back to the same values;
//! (d) a parser with a view (the field chosen by the second byte, or none)
//!     frames the stream as the full parser does, without panicking;
//! (e) generated code and the interpreter give the same runs;
//! (f) one parser taking batches (`Parser::parse_batch`) and single
//!     messages in turn gives the same messages as whole.
//!
//! The checks are the fuzz targets' own module, included from the fuzz
//! crate (its own workspace, on nightly), so the two cannot drift apart.

#[path = "../../../fuzz/fuzz_targets/wire_common/mod.rs"]
mod wire_common;

use wire_common::check;

/// Every file of the grammar's corpus and regressions.
fn inputs(name: &str) -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "regressions"] {
        let dir = root.join(dir).join(format!("wire_{name}"));
        // The regressions folder exists once the fuzzer has found something.
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn replay(name: &str) {
    let files = inputs(name);
    for path in &files {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let r = std::panic::catch_unwind(|| check(name, &data));
        if let Err(e) = r {
            std::panic::resume_unwind(Box::new(format!(
                "{} fails: {}",
                path.display(),
                e.downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| e.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic")
            )));
        }
    }
    assert!(
        files.len() >= 20,
        "only {} inputs replayed for {name}; is fuzz/corpus/wire_{name} missing?",
        files.len()
    );
}

#[test]
fn wire_http_corpus() {
    replay("http");
}

#[test]
fn wire_memcached_binary_corpus() {
    replay("memcached_binary");
}

#[test]
fn wire_memcached_ascii_corpus() {
    replay("memcached_ascii");
}

#[test]
fn wire_hadoop_ifile_corpus() {
    replay("hadoop_ifile");
}

#[test]
fn wire_packet_corpus() {
    replay("packet");
}
