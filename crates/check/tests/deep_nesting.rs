//! Programs nested as deep as the parser allows check without exhausting
//! a test thread's stack; deeper ones are refused with a diagnostic.

fn program(expr: &str) -> String {
    format!("fun f: (x: integer) -> (integer)\n  {expr}\n")
}

#[test]
fn the_deepest_allowed_nesting_checks() {
    let depth = flick_syntax::MAX_NESTING - 8;
    for expr in [
        format!("{}x", "-".repeat(depth)),
        format!("{}x{}", "(".repeat(depth), ")".repeat(depth)),
        vec!["x"; depth].join(" + "),
    ] {
        let (_, diags) = flick_check::check_source(&program(&expr));
        assert!(diags.is_empty(), "{}", diags[0]);
    }
}

#[test]
fn deeper_nesting_is_refused_not_overflowed() {
    let expr = format!("{}x", "-".repeat(flick_syntax::MAX_NESTING * 4));
    let (_, diags) = flick_check::check_source(&program(&expr));
    assert!(diags.iter().any(|d| d.code == "E0011"), "{diags:?}");
}
