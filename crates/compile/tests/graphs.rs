//! The paper's programs compile to the task graphs of its Figure 3.

use flick_compile::{task_graphs, to_dot, GraphTemplate, TaskKind};

fn graph_of(example: &str) -> GraphTemplate {
    let path = format!("{}/../../examples/{example}", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(path).unwrap();
    let (program, diags) = flick_syntax::parse(&src);
    assert!(diags.is_empty());
    let (checked, diags) = flick_check::check(&program);
    assert!(diags.is_empty(), "{diags:?}");
    task_graphs(&program, &checked).remove(0)
}

/// Edges as `from -> to` with task names, sorted.
fn edges(g: &GraphTemplate) -> Vec<String> {
    let name = |i: usize| match &g.tasks[i].kind {
        TaskKind::Input { channel } => format!("in:{}", g.channels[*channel].name),
        TaskKind::Output { channel } => format!("out:{}", g.channels[*channel].name),
        TaskKind::Compute { label, .. } => label.clone(),
    };
    let mut v: Vec<String> = g
        .edges
        .iter()
        .map(|e| format!("{} -> {}", name(e.from), name(e.to)))
        .collect();
    v.sort();
    v
}

#[test]
fn memcached_proxy() {
    let g = graph_of("memcached_proxy.flick");
    assert_eq!(
        edges(&g),
        [
            "backends => client -> out:client",
            "client => target_backend(backends) -> out:backends",
            "in:backends -> backends => client",
            "in:client -> client => target_backend(backends)",
        ]
    );
}

#[test]
fn cache_router_writes_through_its_functions() {
    let g = graph_of("memcached_cache_router.flick");
    let e = edges(&g);
    // test_cache writes to both the client (a hit) and the backends (a miss).
    assert!(
        e.contains(&"client => test_cache(client, backends, cache) -> out:client".to_string()),
        "{e:?}"
    );
    assert!(
        e.contains(&"client => test_cache(client, backends, cache) -> out:backends".to_string()),
        "{e:?}"
    );
    assert!(
        e.contains(&"backends => update_cache(cache) => client -> out:client".to_string()),
        "{e:?}"
    );
}

#[test]
fn hadoop_aggregator_merges_all_mappers() {
    let g = graph_of("hadoop_wordcount.flick");
    assert_eq!(
        edges(&g),
        [
            "if all_ready(mappers) -> out:reducer",
            "in:mappers -> if all_ready(mappers)"
        ]
    );
    let dot = to_dot(&[g]);
    assert!(dot.starts_with("digraph flick {"));
    assert!(dot.contains("input: mappers[i]"));
    // Rules are drawn inside the one compute task that runs them.
    assert!(dot.contains("label=\"compute task (1 rule)\""), "{dot}");
}
