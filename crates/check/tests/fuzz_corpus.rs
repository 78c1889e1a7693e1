//! Replays the fuzz corpus and the fuzzer's regressions through the same
//! checks as the `front_end` fuzz target (`fuzz/fuzz_targets/front_end.rs`),
//! minus the renderer, which lives in the CLI crate: nothing panics, every
//! diagnostic span lies inside the text on char boundaries, and a program
//! that parses cleanly still parses cleanly once formatted.

use flick_span::Diagnostic;
use std::path::{Path, PathBuf};

const DIRS: &[&str] = &["fuzz/corpus/front_end", "fuzz/regressions/front_end"];

fn inputs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in DIRS {
        let dir = root.join(dir);
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
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

fn check_spans(name: &str, src: &str, diags: &[Diagnostic]) {
    for d in diags {
        for l in &d.labels {
            let (start, end) = (l.span.start as usize, l.span.end as usize);
            assert!(
                start <= end && end <= src.len(),
                "{name}: span {:?} outside the text ({} bytes) in {d:?}",
                l.span,
                src.len()
            );
            assert!(
                src.is_char_boundary(start) && src.is_char_boundary(end),
                "{name}: span {:?} splits a char in {d:?}",
                l.span
            );
        }
    }
}

fn replay(name: &str, data: &[u8]) {
    let src = String::from_utf8_lossy(data);
    let src: &str = &src;
    let (_checked, diags) = flick_check::check_source(src);
    check_spans(name, src, &diags);
    let (program, parse_diags) = flick_syntax::parse(src);
    if parse_diags.is_empty() {
        let text = flick_syntax::format_program(&program);
        let (_, again) = flick_syntax::parse(&text);
        assert!(
            again.is_empty(),
            "{name}: formatted output does not reparse\n--- formatted\n{text}\n--- diagnostics\n{again:#?}"
        );
    }
}

#[test]
fn fuzz_corpus_replays_cleanly() {
    let files = inputs();
    for path in &files {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        replay(&path.display().to_string(), &data);
    }
    assert!(
        files.len() >= 20,
        "only {} fuzz inputs replayed; is fuzz/corpus/front_end missing?",
        files.len()
    );
}
