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
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../../grammars");
}
