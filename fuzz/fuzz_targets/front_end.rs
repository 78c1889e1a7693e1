//! The whole front end on arbitrary text: parse, check, render every
//! diagnostic. Nothing may panic, every diagnostic span must lie inside the
//! text on char boundaries, and a program that parses cleanly must still
//! parse cleanly after formatting.

#![no_main]

use flick_span::{Diagnostic, SourceFile};
use libfuzzer_sys::fuzz_target;

fn check_spans(src: &str, diags: &[Diagnostic]) {
    for d in diags {
        for l in &d.labels {
            let (start, end) = (l.span.start as usize, l.span.end as usize);
            assert!(start <= end, "inverted span {:?} in {d:?}", l.span);
            assert!(
                end <= src.len(),
                "span {:?} past the end ({}) in {d:?}",
                l.span,
                src.len()
            );
            assert!(
                src.is_char_boundary(start) && src.is_char_boundary(end),
                "span {:?} splits a char in {d:?}",
                l.span
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let src = String::from_utf8_lossy(data);
    let src: &str = &src;

    let (_checked, diags) = flick_check::check_source(src);
    check_spans(src, &diags);
    let file = SourceFile::new("fuzz.flick", src);
    let _ = flick::render::render(&file, &diags, false);

    let (program, parse_diags) = flick_syntax::parse(src);
    if parse_diags.is_empty() {
        let text = flick_syntax::format_program(&program);
        let (_, again) = flick_syntax::parse(&text);
        assert!(
            again.is_empty(),
            "formatted output does not reparse\n--- input\n{src}\n--- formatted\n{text}\n--- diagnostics\n{again:#?}"
        );
    }
});
