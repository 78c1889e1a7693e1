//! Generates Rust parsers for every stock grammar (`grammars/*.grammar`)
//! with `flick_wire::codegen`, into `OUT_DIR/NAME.rs`.

use std::path::Path;

fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    for name in flick_wire::stock::NAMES {
        let g = flick_wire::Grammar::stock(name).expect("stock grammars load");
        let gen = flick_wire::codegen::generate(&g);
        // Every stock unit is meant to have generated code; one without
        // is interpreted, correctly but slowly, so say so.
        for (unit, why) in &gen.skipped {
            println!("cargo:warning=grammar {name}, unit {unit}: no generated parser ({why})");
        }
        std::fs::write(Path::new(&out).join(format!("{name}.rs")), gen.code)
            .expect("OUT_DIR is writable");
    }
    // Grammars of the tests alone (`tests/grammars/NAME.grammar`, into
    // `OUT_DIR/test_NAME.rs`): the cases where generated code and the
    // interpreter once disagreed, which no stock grammar shows any more.
    let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grammars");
    let mut names: Vec<_> = std::fs::read_dir(&tests)
        .expect("tests/grammars is committed")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "grammar"))
        .collect();
    names.sort();
    for path in names {
        let name = path
            .file_stem()
            .expect("a file name")
            .to_string_lossy()
            .into_owned();
        let src = std::fs::read_to_string(&path).expect("test grammars read");
        let g = flick_wire::Grammar::from_source(&name, &src).expect("test grammars load");
        let gen = flick_wire::codegen::generate(&g);
        for (unit, why) in &gen.skipped {
            println!("cargo:warning=test grammar {name}, unit {unit}: no generated parser ({why})");
        }
        std::fs::write(Path::new(&out).join(format!("test_{name}.rs")), gen.code)
            .expect("OUT_DIR is writable");
    }
    println!("cargo:rerun-if-changed=tests/grammars");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../../grammars");
}
