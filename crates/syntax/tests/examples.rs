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
