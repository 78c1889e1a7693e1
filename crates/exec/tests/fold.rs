//! `foldt` bodies compiled to native folds where they are integer
//! arithmetic that rebuilds the element record, and left to the
//! interpreter otherwise.

use flick_exec::code::Op;
use flick_exec::fold::{FoldArg, FoldExpr};
use flick_exec::{lower, FoldSpec, Module};
use flick_syntax::ast::BinOp;

fn module(src: &str) -> Module {
    let (program, diags) = flick_syntax::parse(src);
    assert!(diags.is_empty(), "{diags:?}");
    let (checked, diags) = flick_check::check(&program);
    assert!(diags.is_empty(), "{diags:?}");
    lower(&program, &checked).unwrap()
}

/// The compiled body of the program's `foldt`, if it was compiled.
fn fold_of(m: &Module) -> Option<&FoldSpec> {
    m.functions
        .iter()
        .flat_map(|f| &f.code)
        .find_map(|op| match op {
            Op::MergeFold { fold, .. } => Some(&**fold),
            _ => None,
        })
}

fn program(body: &str, extra: &str) -> String {
    format!(
        "type kv: record\n  key : string\n  value : integer {{signed=true, size=4}}\n\n\
         proc hadoop: ([kv/-] mappers, -/kv reducer):\n  if (all_ready(mappers)):\n    \
         let result = foldt on mappers\n      ordering elem e1, e2 by elem.key as e_key:\n\
         {body}\n    result => reducer\n{extra}"
    )
}

#[test]
fn the_word_count_body_is_a_native_sum() {
    let src = std::fs::read_to_string(format!(
        "{}/../../examples/hadoop_wordcount.flick",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let m = module(&src);
    let spec = fold_of(&m).expect("compiled");
    assert_eq!(spec.args, [FoldArg::Key, FoldArg::Acc(0)]);
    assert_eq!(
        spec.accs,
        [(
            1,
            FoldExpr::Bin(
                BinOp::Add,
                Box::new(FoldExpr::Acc(0)),
                Box::new(FoldExpr::Next(0))
            )
        )]
    );
    assert_eq!(spec.next_fields, [1]);
    // The interpreted loop is still there, for hosts that do not fold.
    assert!(m
        .functions
        .iter()
        .flat_map(|f| &f.code)
        .any(|op| matches!(op, Op::Merge { key: Some(_), .. })));
}

#[test]
fn lets_calls_and_arithmetic_compile() {
    let body = "        let d = e2.value * 2\n        kv(e2.key, twice(e1.value - d, 3) / 7)";
    let m = module(&program(
        body,
        "\nfun twice(a: integer, b: integer) -> (integer):\n  let c = a + a\n  c - b\n",
    ));
    let spec = fold_of(&m).expect("compiled");
    assert_eq!(spec.args, [FoldArg::Key, FoldArg::Acc(0)]);
    let mut accs = [40];
    // ((40 - 3*2) * 2 - 3) / 7 = 65 / 7 = 9
    spec.step(&mut accs, &[3]).unwrap();
    assert_eq!(accs, [9]);
}

#[test]
fn other_bodies_stay_interpreted() {
    for body in [
        // A comparison is not integer arithmetic.
        "        let big = e1.value > e2.value\n        kv(e_key, e1.value + e2.value)",
        // The key must stay the key.
        "        kv(\"other\", e1.value + e2.value)",
        // A running record, not a new one.
        "        e1",
    ] {
        let m = module(&program(body, ""));
        assert!(fold_of(&m).is_none(), "{body}");
    }
}
