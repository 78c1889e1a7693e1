//! Every stock grammar loads without diagnostics.

#[test]
fn stock_grammars_load() {
    for name in flick_wire::stock::NAMES {
        let src = flick_wire::stock::source(name).unwrap();
        if let Err(e) = flick_wire::Grammar::from_source(name, src) {
            let file = flick_span::SourceFile::new(*name, src);
            for d in &e.diagnostics {
                let lc = file.line_col(d.span().start);
                eprintln!("{name}:{}:{}: {}", lc.line, lc.col, d);
            }
            panic!("{e}");
        }
    }
}
