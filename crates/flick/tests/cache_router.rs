//! The paper's cache router (Listing 1), run by `flick run` in front of two
//! real memcached servers (Debian package `memcached`). The program names no
//! grammar: its annotated `cmd` record is compiled to one. A GETK reply is
//! cached by the router, and later GETKs for the key are answered without
//! asking the backend, whose `get_hits` stays put.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use support::{connect, flick_run, memcached, request_with_opaque, Procs};

/// Starts the cache router in front of `backends`; returns its port.
fn flick_router(procs: &mut Procs, backends: &[u16]) -> u16 {
    flick_run(procs, "examples/memcached_cache_router.flick", backends)
}

/// One response.
#[derive(Debug, PartialEq)]
struct Response {
    opcode: u8,
    status: u16,
    key: Vec<u8>,
    value: Vec<u8>,
}

fn response(s: &mut TcpStream) -> Response {
    let h = support::response_header(s);
    assert_eq!(h[0], 0x81, "a response");
    let (key, value) = support::response_body(s, &h);
    Response {
        opcode: h[1],
        status: support::status(&h),
        key,
        value,
    }
}

/// The `get_hits` counter of a memcached server, asked in ASCII.
fn get_hits(port: u16) -> u64 {
    let mut s = connect(port);
    s.write_all(b"stats\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut hits = None;
    loop {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "stats ended early");
        let line = line.trim_end();
        if line == "END" {
            break;
        }
        if let Some(n) = line.strip_prefix("STAT get_hits ") {
            hits = n.parse().ok();
        }
    }
    hits.expect("memcached reports get_hits")
}

#[test]
fn getk_replies_are_cached_by_the_router() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs), memcached(&mut procs)];
    let router = flick_router(&mut procs, &backends);
    let key = b"cached:key";
    let value = b"a value worth caching";
    // The program's `hash(req.key) mod len(backends)`.
    let target = ((flick_exec::fnv1a(key) >> 1) % 2) as usize;

    let mut c = connect(router);
    // SET goes through the router to the backend the hash names.
    c.write_all(&request_with_opaque(0x01, key, value, &[0; 8], 1))
        .unwrap();
    let set = response(&mut c);
    assert_eq!((set.opcode, set.status), (0x01, 0), "{set:?}");
    let mut direct = connect(backends[target]);
    direct
        .write_all(&request_with_opaque(0x0c, key, b"", b"", 2))
        .unwrap();
    assert_eq!(
        response(&mut direct).value,
        value,
        "stored on backend {target}"
    );
    let mut other = connect(backends[1 - target]);
    other
        .write_all(&request_with_opaque(0x0c, key, b"", b"", 3))
        .unwrap();
    assert_eq!(response(&mut other).status, 1, "not on the other backend");

    let hits = get_hits(backends[target]);
    let expected = Response {
        opcode: 0x0c,
        status: 0,
        key: key.to_vec(),
        value: value.to_vec(),
    };
    // The first GETK asks the backend, and the router caches the reply.
    c.write_all(&request_with_opaque(0x0c, key, b"", b"", 4))
        .unwrap();
    assert_eq!(response(&mut c), expected);
    assert_eq!(get_hits(backends[target]), hits + 1, "the backend answered");
    // The later ones are answered from the cache, on this connection and
    // on another: `cache` is global state.
    let mut c2 = connect(router);
    for i in 0..5 {
        let s = if i % 2 == 0 { &mut c } else { &mut c2 };
        s.write_all(&request_with_opaque(0x0c, key, b"", b"", 5 + i))
            .unwrap();
        assert_eq!(response(s), expected, "GETK {i} from the cache");
    }
    assert_eq!(
        get_hits(backends[target]),
        hits + 1,
        "the backend was not asked again"
    );
    assert_eq!(get_hits(backends[1 - target]), 0);

    // Other commands still go to the backend: a GET (not GETK) is a hit there.
    c.write_all(&request_with_opaque(0x00, key, b"", b"", 20))
        .unwrap();
    let get = response(&mut c);
    assert_eq!(
        (get.opcode, get.status, get.value),
        (0x00, 0, value.to_vec())
    );
    assert_eq!(get_hits(backends[target]), hits + 2);
}
