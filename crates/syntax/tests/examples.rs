//! The paper's listings parse, and formatting them is a fixed point.

use flick_syntax::{format_program, parse};

fn example(name: &str) -> String {
    let path = format!("{}/../../examples/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn examples_parse_and_format_stably() {
    for name in [
        "memcached_proxy.flick",
        "memcached_cache_router.flick",
        "hadoop_wordcount.flick",
        "flowblaze/port_knocking.flick",
    ] {
        let src = example(name);
        let (mut p, diags) = parse(&src);
        assert!(diags.is_empty(), "{name}: {diags:#?}");
        let text = format_program(&p);
        let (mut q, diags) = parse(&text);
        assert!(diags.is_empty(), "{name} formatted:\n{text}\n{diags:#?}");
        assert_eq!(format_program(&q), text, "{name}: fmt is not a fixed point");
        p.erase_spans();
        q.erase_spans();
        assert_eq!(p, q, "{name}: fmt changed the tree:\n{text}");
    }
}

#[test]
fn fmt_keeps_every_comment_and_is_idempotent() {
    let src = "# leading\ntype kv: record\n  # about key\n  key : string # trailing\n  value : integer\n\n\
               proc p: ([kv/-] ms, -/kv r)\n  # rule\n  ms => r\n  on disconnect(r):\n    # inside a handler\n    None\n\n\
               fun f: (x: integer) -> (integer)\n  # first\n  let y = x\n  y\n# at the end\n";
    let (p, comments, diags) = flick_syntax::parse_with_comments(src);
    assert!(diags.is_empty(), "{diags:#?}");
    let text = flick_syntax::format_with_comments(&p, &comments);
    for c in &comments {
        assert!(text.contains(&c.text), "lost {:?} in:\n{text}", c.text);
    }
    assert!(
        text.contains("  # about key\n  key : string\n  # trailing\n  value"),
        "{text}"
    );
    assert!(
        text.contains("    # inside a handler\n    None\n"),
        "{text}"
    );
    assert!(text.ends_with("  y\n# at the end\n"), "{text}");
    let (q, comments2, diags) = flick_syntax::parse_with_comments(&text);
    assert!(diags.is_empty());
    assert_eq!(flick_syntax::format_with_comments(&q, &comments2), text);
}

#[test]
fn a_machines_comments_stay_where_they_were() {
    let src = "grammar packet\n\n# a machine\nmachine m: (packet/packet a)  # its channel\n  const K = 1  # a constant\n\n  # the stage\n  stage s:  # stateless\n    # drops\n    on packet when tcp.dport = K: drop  # port 1\n    on packet:\n      forward a\n    on packet:  # two items\n      # first\n      forward a\n      goto t  # then\n# the end\n";
    let (p, comments, diags) = flick_syntax::parse_with_comments(src);
    assert!(diags.is_empty(), "{diags:#?}");
    let text = flick_syntax::format_with_comments(&p, &comments);
    for c in &comments {
        assert!(text.contains(&c.text), "lost {:?} in:\n{text}", c.text);
    }
    assert!(text.contains("  const K = 1  # a constant\n"), "{text}");
    assert!(
        text.contains("  stage s:  # stateless\n    # drops\n"),
        "{text}"
    );
    assert!(
        text.contains("drop  # port 1\n    on packet: forward a\n"),
        "{text}"
    );
    let (q, comments2, diags) = flick_syntax::parse_with_comments(&text);
    assert!(diags.is_empty());
    assert_eq!(flick_syntax::format_with_comments(&q, &comments2), text);
}

#[test]
fn the_flowblaze_machines_are_in_canonical_layout() {
    let dir = format!("{}/../../examples/flowblaze", env!("CARGO_MANIFEST_DIR"));
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_none_or(|x| x != "flick") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        let (p, comments, diags) = flick_syntax::parse_with_comments(&src);
        assert!(diags.is_empty(), "{}: {diags:#?}", path.display());
        assert_eq!(
            flick_syntax::format_with_comments(&p, &comments),
            src,
            "{}",
            path.display()
        );
    }
}

/// An integer literal is printed as it was written: `_` separators,
/// leading zeros and capital hexadecimal digits stay, in expressions,
/// annotations and machine operands alike; a canonical one stays so.
#[test]
fn fmt_keeps_the_spelling_of_integer_literals() {
    let src = "type t: record\n  n : integer {size=0x0004}\n\n\
               fun f: (x: integer) -> (bool)\n  in_prefix(x + 1_000, \"10.0.0.0/8\") or x = 0x02000000_0a01 or x = 007 or x = 0xFF or x = 0x0c or x = 12\n\n\
               machine m: (packet/packet a)\n  const BIG = 0x0a00_0001\n  const SMALL = 1_500\n\n  \
               stage s:\n    on packet when len > 0_64: forward a\n";
    let (p, diags) = parse(src);
    assert!(diags.is_empty(), "{diags:#?}");
    let text = format_program(&p);
    for literal in [
        "0x0004",
        "1_000",
        "0x02000000_0a01",
        "007",
        "0xFF",
        "0x0c",
        "= 12",
        "0x0a00_0001",
        "1_500",
        "0_64",
    ] {
        assert!(text.contains(literal), "lost {literal} in:\n{text}");
    }
    assert!(!text.contains("0x20000000a01"), "{text}");
    assert_eq!(format_program(&parse(&text).0), text, "not a fixed point");
    // The value is the same whatever the spelling.
    let value = |src: &str| match &parse(src).0.decls[0] {
        flick_syntax::ast::Decl::Fun(f) => match &f.body.stmts[0].kind {
            flick_syntax::ast::StmtKind::Expr(e) => match &e.kind {
                flick_syntax::ast::ExprKind::Int { value, .. } => *value,
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let f = |lit: &str| format!("fun f: () -> (integer)\n  {lit}\n");
    assert_eq!(value(&f("0x02000000_0a01")), 0x0200_0000_0a01);
    assert_eq!(value(&f("0x20000000a01")), 0x0200_0000_0a01);
    assert_eq!(value(&f("1_000")), 1000);
}
