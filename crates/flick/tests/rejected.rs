//! Programs the front end must reject, one per file in `tests/rejected/`,
//! each snapshotted with its source and its rendered diagnostics.
//!
//! Every case starts with a `# ` comment saying what it shows. A case that
//! checks cleanly fails the test: it would no longer show a rejection.

use flick::render::render;
use flick_span::SourceFile;
use std::path::Path;

/// The case's path relative to this crate, with `/` separators, so that
/// snapshots never hold a machine path.
fn case_name(path: &Path) -> String {
    let rel = path
        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .expect("cases live under the crate");
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn rejected() {
    insta::glob!("rejected/*.flick", |path| {
        let name = case_name(path);
        let text = std::fs::read_to_string(path).expect("readable case");
        assert!(
            text.starts_with("# "),
            "{name}: a case starts with a `# ` comment saying what it shows"
        );
        // A program that says `grammar packet` is checked as the CLI
        // checks it, with the packet library after it; the snapshot shows
        // the case's own text.
        let (file, diags) = match flick::views::program_source(&text) {
            std::borrow::Cow::Owned(source) => {
                let diags = flick::views::check_program(path, &source).1;
                (SourceFile::new(name.clone(), source), diags)
            }
            std::borrow::Cow::Borrowed(_) => {
                let file = SourceFile::new(name.clone(), text.clone());
                let (_, diags) = flick_check::check_source(&file.text);
                (file, diags)
            }
        };
        assert!(
            !diags.is_empty(),
            "{name}: checks cleanly, but every case here must be rejected"
        );
        let rendered = render(&file, &diags, false);
        let s = if diags.len() == 1 { "" } else { "s" };
        let snapshot = format!(
            "{}\n---- {} error{s} ----\n{}",
            text.trim_end(),
            diags.len(),
            rendered.trim_end()
        );
        insta::assert_snapshot!(snapshot);
    });
}

/// The suite keeps at least as many cases as it was written with.
#[test]
fn enough_cases() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rejected");
    let cases = std::fs::read_dir(dir)
        .expect("the cases directory exists")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "flick"))
        .count();
    assert!(cases >= 36, "only {cases} rejected cases");
}
