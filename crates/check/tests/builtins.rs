//! Built-ins check their arguments: `least_connections` takes a channel
//! array and gives an unsigned integer, like `len` of one.

fn balancer(body: &str) -> String {
    format!(
        "type request: record\n  target : string\n\n\
         proc LoadBalancer: (request/request client, [-/request] backends)\n  \
         | client => pick(backends)\n\n\
         fun pick: ([-/request] backends, req: request) -> ()\n{body}"
    )
}

#[test]
fn least_connections_of_a_channel_array_is_an_index() {
    let src = balancer(
        "  let i = least_connections(backends)\n  \
         req => backends[i mod len(backends)]\n",
    );
    let (_, diags) = flick_check::check_source(&src);
    assert!(diags.is_empty(), "{diags:?}");
}

#[test]
fn least_connections_of_anything_but_a_channel_array_is_an_error_with_a_span() {
    for (arg, ty) in [
        ("req.target", "string"),
        ("backends[0]", "-/request"),
        ("1", "integer"),
    ] {
        let src = balancer(&format!(
            "  let i = least_connections({arg})\n  req => backends[i mod len(backends)]\n"
        ));
        let (_, diags) = flick_check::check_source(&src);
        assert_eq!(diags.len(), 1, "{arg}: {diags:?}");
        let d = &diags[0];
        assert_eq!(d.code, "E0203", "{arg}: {d:?}");
        assert!(d.message.contains("least_connections"), "{}", d.message);
        let span = d.labels[0].span;
        assert_eq!(&src[span.start as usize..span.end as usize], arg);
        assert!(d.labels[0].message.contains(ty), "{arg}: {d:?}");
    }
}

#[test]
fn least_connections_takes_one_argument() {
    let src = balancer(
        "  let i = least_connections(backends, backends)\n  \
         req => backends[i mod len(backends)]\n",
    );
    let (_, diags) = flick_check::check_source(&src);
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert_eq!(diags[0].code, "E0202");
}
