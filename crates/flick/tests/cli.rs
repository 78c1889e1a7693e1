//! The `flick` binary as a user runs it: exit codes, outputs, `--bounds`.

use std::process::{Command, Output};

fn flick(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flick"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("flick runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn check_accepts_the_paper_examples() {
    let o = flick(&[
        "check",
        "examples/memcached_proxy.flick",
        "examples/memcached_cache_router.flick",
        "examples/hadoop_wordcount.flick",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).matches(": ok").count(), 3);
}

#[test]
fn check_fails_if_any_file_fails_and_reports_all_errors() {
    let o = flick(&[
        "check",
        "examples/memcached_proxy.flick",
        "examples/errors/recursion_and_directions.flick",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    for code in ["E0301", "E0302", "E0401"] {
        assert!(err.contains(code), "missing {code} in:\n{err}");
    }
    assert!(err.contains("examples/errors/recursion_and_directions.flick:21:5"));
    assert!(err.contains("3 errors"));
}

#[test]
fn unreadable_file_exits_2() {
    let o = flick(&["check", "examples/does_not_exist.flick"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read"));
}

#[test]
fn bounds_of_the_memcached_proxy() {
    let o = flick(&["check", "--bounds", "examples/memcached_proxy.flick"]);
    assert!(o.status.success());
    insta::assert_snapshot!(stdout(&o));
}

#[test]
fn bounds_follow_annotations() {
    // Overriding the defaults shrinks the bound: 8 backends, 250-byte keys.
    let dir = std::env::temp_dir().join(format!("flick-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("small.flick");
    std::fs::write(
        &path,
        "type cmd: record\n  key : string {max=250}\n\n\
         proc P: (cmd/cmd client, [cmd/cmd] {max=8} backends)\n  backends => client\n",
    )
    .unwrap();
    let o = flick(&["check", "--bounds", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // client: 250 in + 250 out; backends: 8 x (250 + 250).
    assert!(out.contains("memory per instance: 4500 B"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fmt_prints_canonical_layout_and_check_mode_detects_drift() {
    let o = flick(&["fmt", "examples/memcached_cache_router.flick"]);
    assert!(o.status.success());
    let text = stdout(&o);
    assert!(text.contains("proc memcached: (cmd/cmd client, [cmd/cmd] backends)\n"));
    assert!(text.contains("\n  | client => test_cache(client, backends, cache)\n"));
    // The examples are kept canonical (CI runs this too).
    let o = flick(&["fmt", "--check", "examples/"]);
    assert!(o.status.success(), "{}", stderr(&o));

    let dir = std::env::temp_dir().join(format!("flick-fmt-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let drifted = "proc P: (integer/integer c)\n  c=>c\n";
    std::fs::write(dir.join("a.flick"), drifted).unwrap();
    std::fs::write(dir.join("sub/b.flick"), drifted).unwrap();
    std::fs::write(dir.join("notes.txt"), "not a program").unwrap();
    let d = dir.to_str().unwrap();
    let o = flick(&["fmt", "--check", d]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("a.flick: not in canonical layout") && err.contains("b.flick: not in"),
        "{err}"
    );
    // Several files are never printed one after another.
    assert_eq!(flick(&["fmt", d]).status.code(), Some(1));
    let o = flick(&["fmt", "--write", d]);
    assert!(o.status.success(), "{}", stderr(&o));
    let want = "proc P: (integer/integer c)\n  | c => c\n";
    assert_eq!(std::fs::read_to_string(dir.join("a.flick")).unwrap(), want);
    assert_eq!(
        std::fs::read_to_string(dir.join("sub/b.flick")).unwrap(),
        want
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).unwrap(),
        "not a program"
    );
    assert!(flick(&["fmt", "--check", d]).status.success());
    // A file that does not parse is reported and left alone.
    std::fs::write(dir.join("bad.flick"), "proc P: (\n").unwrap();
    let o = flick(&["fmt", "--write", d]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("bad.flick:2:1: error"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("bad.flick")).unwrap(),
        "proc P: (\n"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_lists_the_commands() {
    let o = flick(&["--help"]);
    assert!(o.status.success());
    let out = stdout(&o);
    assert!(out.contains("check") && out.contains("fmt"));
}

#[test]
fn records_are_checked_against_the_grammar_they_view() {
    let dir = std::env::temp_dir().join(format!("flick-view-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("view.flick");
    std::fs::write(
        &path,
        "grammar memcached_binary\n\ntype cmd: record\n  key : string\n  opcod : integer\n  value : integer\n\n\
         proc P: (cmd/cmd c)\n  c => c\n",
    )
    .unwrap();
    let o = flick(&["check", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("E0701") && err.contains("no field `opcod`"),
        "{err}"
    );
    assert!(
        err.contains("E0702") && err.contains("field `value` is `integer`"),
        "{err}"
    );
    std::fs::write(
        &path,
        "grammar no_such_grammar\n\ntype cmd: record\n  key : string\n",
    )
    .unwrap();
    let o = flick(&["check", path.to_str().unwrap()]);
    assert!(stderr(&o).contains("E0700"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn graph_prints_dot_and_renders_svg() {
    let o = flick(&["graph", "examples/memcached_proxy.flick"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let dot = stdout(&o);
    assert!(dot.starts_with("digraph flick {"), "{dot}");
    assert!(
        dot.contains("input: client") && dot.contains("output: backends[i]"),
        "{dot}"
    );
    let out = std::env::temp_dir().join(format!("flick-graph-{}.svg", std::process::id()));
    let o = flick(&[
        "graph",
        "--svg",
        out.to_str().unwrap(),
        "examples/memcached_proxy.flick",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let svg = std::fs::read_to_string(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("target_backend"),
        "an SVG of the graph"
    );
}

/// `flick check` accepts a program with operations that may fault at run
/// time and says where each is (file, line, column, a caret), with exit
/// code 0; an index `E mod len(A)`, directly or through a `let`, and a
/// division by `len` of a channel array are proved safe and not flagged.
#[test]
fn check_warns_of_operations_that_may_fault() {
    let o = flick(&["check", "crates/flick/tests/programs/faulting_router.flick"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("ok, 1 operation may fault"),
        "{}",
        stdout(&o)
    );
    let err = stderr(&o);
    assert!(
        err.contains("faulting_router.flick:18:19: warning[E0901]: this index of `backends` may be out of range"),
        "{err}"
    );
    assert!(err.contains("^^^^^^"), "{err}");
    let dir = std::env::temp_dir().join(format!("flick-cli-warn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("divide.flick");
    std::fs::write(
        &file,
        "grammar memcached_binary\n\ntype cmd: record\n  key : string\n\n\
         proc P: (cmd/cmd client, [cmd/cmd] backends)\n  | backends => client\n  | client => pick(backends)\n\n\
         fun pick: ([-/cmd] backends, req: cmd) -> ()\n  \
         let n = len(req.key)\n  \
         let a = hash(req.key) mod len(backends)\n  \
         let b = (hash(req.key) / len(backends)) mod len(backends)\n  \
         let c = 100 / n\n  \
         req => backends[a]\n",
    )
    .unwrap();
    let o = flick(&["check", file.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.matches("warning[").count(), 1, "{err}");
    assert!(
        err.contains("divide.flick:14:17: warning[E0902]: `/` may divide by zero"),
        "{err}"
    );
    let o = flick(&[
        "check",
        "examples/memcached_proxy.flick",
        "examples/http_lb.flick",
    ]);
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
}

#[test]
fn completions_and_man_pages_come_from_the_command_line_definition() {
    let o = flick(&["completions", "bash"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let script = stdout(&o);
    assert!(script.contains("fmt") && script.contains("--max-instances"));
    // The script is valid bash.
    let dir = std::env::temp_dir().join(format!("flick-man-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("flick.bash"), &script).unwrap();
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(dir.join("flick.bash"))
        .status()
        .expect("bash runs");
    assert!(syntax.success());
    for shell in ["zsh", "fish"] {
        assert!(flick(&["completions", shell]).status.success());
    }
    assert_eq!(flick(&["completions", "cmd.exe"]).status.code(), Some(2));

    let o = flick(&["man"]);
    assert!(o.status.success());
    let page = stdout(&o);
    assert!(
        page.starts_with(".ie") || page.contains(".TH flick 1"),
        "{page}"
    );
    assert!(page.contains("flick\\-run(1)"), "{page}");
    let o = flick(&["man", "run"]);
    assert!(o.status.success());
    let page = stdout(&o);
    assert!(
        page.contains(".TH flick-run 1") && page.contains("\\-\\-listen"),
        "{page}"
    );
    assert_eq!(flick(&["man", "nope"]).status.code(), Some(1));
    let o = flick(&["man", "--dir", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for page in [
        "flick.1",
        "flick-run.1",
        "flick-fmt.1",
        "flick-grammar-parse.1",
    ] {
        assert!(dir.join(page).is_file(), "{page}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_view_cannot_declare_a_list_field_it_could_not_read() {
    let dir = std::env::temp_dir().join(format!("flick-view-list-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("headers.flick");
    std::fs::write(
        &path,
        "grammar http\n\ntype hdr: record\n  name : string\n  value : string\n\n\
         type request: record\n  target : string\n  headers : list<hdr> {max=100}\n\n\
         type response: record\n  reason : string\n\n\
         proc P: (request/response client, [response/request] backends)\n  | backends => client\n  | client => backends[0]\n",
    )
    .unwrap();
    let o = flick(&["check", path.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("E0704") && err.contains("header(msg, \"Name\")") && err.contains(":9:3"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
