//! The header-routing balancer (`examples/http_route_by_header.flick`) run
//! by `flick run` in front of two real nginx servers: a request with
//! `X-Shard: N` goes to backend N, one without it (or with a value that is
//! not a number) to the backend its connection hashes to, and keep-alive
//! connections go on through pooled backend connections either way.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use support::Procs;

const PROGRAM: &str = "examples/http_route_by_header.flick";

fn site(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("flick-shard-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("who.txt"), format!("served by {name}\n")).unwrap();
    dir
}

/// A response's status, `X-Served-By` and body (framed by Content-Length).
fn read_response(r: &mut BufReader<TcpStream>) -> (u16, String, String) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split(' ')
        .nth(1)
        .unwrap_or_else(|| panic!("a status line, not {line:?}"))
        .parse()
        .unwrap();
    let (mut by, mut length) = (String::new(), 0);
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':').unwrap();
        match n.to_ascii_lowercase().as_str() {
            "x-served-by" => by = v.trim().to_string(),
            "content-length" => length = v.trim().parse().unwrap(),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).unwrap();
    (status, by, String::from_utf8(body).unwrap())
}

fn connect(port: u16) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

/// Sends a GET with `extra` header lines; the backend that answered.
fn get(s: &mut TcpStream, r: &mut BufReader<TcpStream>, extra: &str) -> String {
    write!(s, "GET /who.txt HTTP/1.1\r\nHost: t\r\n{extra}\r\n").unwrap();
    let (status, by, body) = read_response(r);
    assert_eq!(status, 200, "{extra:?}");
    assert_eq!(body, format!("served by {by}\n"), "{extra:?}");
    by
}

#[test]
fn requests_go_to_the_backend_their_header_names() {
    let mut procs = Procs(Vec::new());
    let (a, b) = (site("b0"), site("b1"));
    let backends = [
        flick_testkit::nginx(&mut procs, &a, "b0"),
        flick_testkit::nginx(&mut procs, &b, "b1"),
    ];
    let port = support::flick_run(&mut procs, PROGRAM, &backends);
    let (mut s, mut r) = connect(port);
    // The header names the backend, whatever the case of its name, and
    // with blanks around its value; the number wraps around the backends.
    for round in 0..4 {
        assert_eq!(get(&mut s, &mut r, "X-Shard: 0\r\n"), "b0", "round {round}");
        assert_eq!(get(&mut s, &mut r, "X-Shard: 1\r\n"), "b1", "round {round}");
        assert_eq!(get(&mut s, &mut r, "x-shard:1 \r\n"), "b1", "round {round}");
        assert_eq!(
            get(&mut s, &mut r, "X-SHARD:   0\t\r\n"),
            "b0",
            "round {round}"
        );
        assert_eq!(get(&mut s, &mut r, "X-Shard: 3\r\n"), "b1", "round {round}");
        assert_eq!(
            get(
                &mut s,
                &mut r,
                "Accept: */*\r\nX-Shard: 2\r\nX-Other: 1\r\n"
            ),
            "b0",
            "round {round}"
        );
    }
    // The first field of the name counts.
    assert_eq!(get(&mut s, &mut r, "X-Shard: 1\r\nX-Shard: 0\r\n"), "b1");
    // Without the header, or with one that is not a number, a request goes
    // where its connection hashes to: the same backend each time.
    let fallback = get(&mut s, &mut r, "");
    for extra in [
        "",
        "X-Shard: abc\r\n",
        "X-Shard:\r\n",
        "X-Shards: 1\r\n",
        "X-Shard: 1x\r\n",
    ] {
        assert_eq!(get(&mut s, &mut r, extra), fallback, "{extra:?}");
    }
    // Pipelined requests to both backends come back in order.
    let mut batch = String::new();
    for i in 0..8 {
        batch.push_str(&format!(
            "GET /who.txt HTTP/1.1\r\nHost: t\r\nX-Shard: {}\r\n\r\n",
            i % 2
        ));
    }
    s.write_all(batch.as_bytes()).unwrap();
    for i in 0..8 {
        let (status, by, _) = read_response(&mut r);
        assert_eq!(
            (status, by.as_str()),
            (200, ["b0", "b1"][i % 2]),
            "request {i}"
        );
    }
    // Connections without the header spread over both backends.
    let mut served = std::collections::HashSet::new();
    for _ in 0..16 {
        let (mut s, mut r) = connect(port);
        served.insert(get(&mut s, &mut r, ""));
    }
    assert_eq!(served.len(), 2, "both backends serve: {served:?}");
}

/// `header` on a record whose grammar unit has no header fields is an
/// error of `flick check`, which names the unit.
#[test]
fn header_of_a_unit_without_header_fields_is_rejected() {
    let dir = std::env::temp_dir().join(format!("flick-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("memcached_header.flick");
    std::fs::write(
        &path,
        "grammar memcached_binary\n\ntype cmd: record\n  key : string\n\n\
         proc P: (cmd/cmd c, [cmd/cmd] b)\n  | b => c\n  | c => pick(b)\n\n\
         fun pick: ([-/cmd] b, req: cmd) -> ()\n  req => b[to_int(header(req, \"X-Shard\")) mod len(b)]\n",
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_flick"))
        .args(["check", path.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("error[E0703]: `header` reads header fields, and `cmd` has none")
            && err.contains("the grammar unit `cmd` has no list of header fields"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
