//! The HTTP load balancer (`examples/http_lb.flick`) run by `flick run` in
//! front of real nginx servers (Debian `nginx-light`): what a client of
//! nginx or HAProxy relies on.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::Procs;

/// Files for the backends to serve: small ones, and one of 3 MB.
fn site(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("flick-site-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..8 {
        std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.join("big.bin"), big).unwrap();
    dir
}

fn balancer(procs: &mut Procs, backends: &[u16]) -> u16 {
    balancer_with_timeout(procs, backends, 2000)
}

fn balancer_with_timeout(procs: &mut Procs, backends: &[u16], timeout_ms: u64) -> u16 {
    run_balancer(procs, "examples/http_lb.flick", backends, timeout_ms)
}

fn run_balancer(procs: &mut Procs, program: &str, backends: &[u16], timeout_ms: u64) -> u16 {
    let timeout = timeout_ms.to_string();
    support::flick_run_with(
        procs,
        program,
        backends,
        &["--response-timeout-ms", &timeout],
    )
}

/// One response: status, headers (lower-case names) and body, framed by
/// Content-Length, or by the connection's end.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn read_response(r: &mut BufReader<TcpStream>) -> Response {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split(' ')
        .nth(1)
        .unwrap_or_else(|| panic!("a status line, not {line:?}"))
        .parse()
        .unwrap();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':').unwrap();
        headers.push((n.to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut body = Vec::new();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map(|(_, v)| v.parse::<usize>().unwrap());
    match length {
        Some(n) => {
            body.resize(n, 0);
            r.read_exact(&mut body).unwrap();
        }
        None => {
            r.read_to_end(&mut body).unwrap();
        }
    }
    Response {
        status,
        headers,
        body,
    }
}

fn connect(port: u16) -> (TcpStream, BufReader<TcpStream>) {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let r = BufReader::new(s.try_clone().unwrap());
    (s, r)
}

/// The connection was closed by the balancer.
fn closed(r: &mut BufReader<TcpStream>) -> bool {
    let mut rest = Vec::new();
    matches!(r.read_to_end(&mut rest), Ok(0))
}

#[test]
fn keep_alive_pipelining_and_streamed_bodies() {
    let mut procs = Procs(Vec::new());
    let (a, b) = (site("a"), site("b"));
    let backends = [
        flick_testkit::nginx(&mut procs, &a, "a"),
        flick_testkit::nginx(&mut procs, &b, "b"),
    ];
    let port = balancer(&mut procs, &backends);
    // A connection's requests stay on one backend; connections spread
    // over both.
    let mut served = std::collections::HashSet::new();
    for _ in 0..16 {
        let (mut s, mut r) = connect(port);
        let mut by = std::collections::HashSet::new();
        for i in 0..4 {
            write!(s, "GET /f{i}.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
            let resp = read_response(&mut r);
            assert_eq!(resp.status, 200, "file {i}");
            assert_eq!(resp.body, format!("file {i}\n").as_bytes());
            by.insert(resp.header("x-served-by").unwrap().to_string());
        }
        assert_eq!(by.len(), 1, "one backend per connection: {by:?}");
        served.extend(by);
    }
    assert_eq!(served.len(), 2, "both backends serve: {served:?}");
    // Keep-alive: many requests on one connection.
    let (mut s, mut r) = connect(port);
    for round in 0..3 {
        for i in 0..8 {
            write!(s, "GET /f{i}.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
            let resp = read_response(&mut r);
            assert_eq!(resp.status, 200, "round {round}, file {i}");
            assert_eq!(resp.body, format!("file {i}\n").as_bytes());
        }
    }
    // Pipelined: eight requests in one write, answered in order.
    let mut batch = String::new();
    for i in (0..8).rev() {
        batch.push_str(&format!("GET /f{i}.txt HTTP/1.1\r\nHost: t\r\n\r\n"));
    }
    s.write_all(batch.as_bytes()).unwrap();
    for i in (0..8).rev() {
        assert_eq!(read_response(&mut r).body, format!("file {i}\n").as_bytes());
    }
    // A 3 MB response streams through whole.
    write!(s, "GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    let big = read_response(&mut r);
    assert_eq!(big.body, std::fs::read(a.join("big.bin")).unwrap());
    // Request bodies stream to the backend, by length and chunked (nginx
    // answers 405 for a POST to a file, having read the body), and the
    // connection goes on after them.
    let body = vec![b'x'; 200_000];
    write!(
        s,
        "POST /f1.txt HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(&body).unwrap();
    assert_eq!(read_response(&mut r).status, 405);
    s.write_all(b"POST /f2.txt HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    for _ in 0..20 {
        s.write_all(b"400\r\n").unwrap();
        s.write_all(&[b'y'; 0x400]).unwrap();
        s.write_all(b"\r\n").unwrap();
    }
    s.write_all(b"0\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut r).status, 405);
    write!(s, "GET /f3.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut r).body, b"file 3\n");
    // `Connection: close`: answered, then closed.
    write!(
        s,
        "GET /f4.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    assert_eq!(read_response(&mut r).body, b"file 4\n");
    assert!(closed(&mut r), "closed after Connection: close");
    // HTTP/1.0 without keep-alive: answered, then closed.
    let (mut s, mut r) = connect(port);
    write!(s, "GET /f5.txt HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut r).body, b"file 5\n");
    assert!(closed(&mut r), "closed after an HTTP/1.0 request");
}

/// Requests that do not parse get the status a proxy should answer, and
/// their connection closes; a dead backend gets clients a 503.
#[test]
fn bad_requests_and_dead_backends_get_error_statuses() {
    let mut procs = Procs(Vec::new());
    let a = site("c");
    let backends = [flick_testkit::nginx(&mut procs, &a, "c")];
    let port = balancer(&mut procs, &backends);
    let long_target = format!("/{}", "t".repeat(9000));
    let many_headers: String = (0..101).map(|i| format!("X-H{i}: v\r\n")).collect();
    let cases = [
        ("GET /f0.txt HTTP/1.1\r\nHost : t\r\n\r\n".to_string(), 400),
        (
            "GET /f0.txt HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_string(),
            400,
        ),
        (format!("GET {long_target} HTTP/1.1\r\n\r\n"), 414),
        (format!("GET / HTTP/1.1\r\n{many_headers}\r\n"), 431),
        (
            "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999\r\n\r\n".to_string(),
            413,
        ),
    ];
    for (request, status) in cases {
        let (mut s, mut r) = connect(port);
        // Earlier requests on the connection are still answered first.
        s.write_all(b"GET /f0.txt HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        s.write_all(request.as_bytes()).unwrap();
        assert_eq!(read_response(&mut r).body, b"file 0\n");
        let resp = read_response(&mut r);
        assert_eq!(
            resp.status,
            status,
            "{:?}",
            &request[..40.min(request.len())]
        );
        assert!(resp.body.is_empty());
    }
    // The backend dies: 503, at once, and the balancer stays up.
    procs.0[0].kill().unwrap();
    procs.0[0].wait().unwrap();
    let started = Instant::now();
    for _ in 0..2 {
        let (mut s, mut r) = connect(port);
        s.write_all(b"GET /f0.txt HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        // 503 where the connecting is refused; 502 where the request went
        // over a pooled connection the kill broke (nginx answers 502 for
        // both).
        let status = read_response(&mut r).status;
        assert!(status == 503 || status == 502, "{status}");
        assert!(closed(&mut r));
    }
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A backend that takes the request and never answers gets the client a
/// 504 once the response timeout passes; one whose connection breaks with
/// the request unanswered, a 502.
#[test]
fn slow_and_broken_backends_get_504_and_502() {
    let mut procs = Procs(Vec::new());
    let silent = support::listener();
    let silent_port = silent.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        // Accept, say nothing, and keep the connection open a while.
        let kept: Vec<_> = silent.incoming().take(1).map(|c| c.unwrap()).collect();
        std::thread::sleep(Duration::from_secs(4));
        drop(kept);
    });
    let port = balancer_with_timeout(&mut procs, &[silent_port], 500);
    let started = Instant::now();
    let (mut s, mut r) = connect(port);
    s.write_all(b"GET /f0.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut r).status, 504);
    assert!(started.elapsed() < Duration::from_secs(3));
    held.join().unwrap();

    let breaking = support::listener();
    let breaking_port = breaking.local_addr().unwrap().port();
    std::thread::spawn(move || {
        // Read a request, then hang up without a word.
        for c in breaking.incoming().take(4) {
            let mut c = c.unwrap();
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf);
        }
    });
    let port = balancer_with_timeout(&mut procs, &[breaking_port], 5000);
    let (mut s, mut r) = connect(port);
    s.write_all(b"GET /f0.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut r).status, 502);
}

/// The static web server (`examples/static_web.flick`): one 137-byte
/// response per request, pipelined or not, keep-alive and HTTP/1.0 as a
/// client expects, 400 for a request that does not parse.
#[test]
fn the_static_server_answers_every_request_with_its_page() {
    let mut procs = Procs(Vec::new());
    let listen = format!("client=127.0.0.1:{}", support::free_port());
    let port = support::start_flick(
        &mut procs,
        &["run", "examples/static_web.flick", "--listen", &listen],
    );
    let (mut s, mut r) = connect(port);
    s.write_all(&b"GET /any HTTP/1.1\r\nHost: t\r\n\r\n".repeat(5))
        .unwrap();
    for _ in 0..5 {
        let resp = read_response(&mut r);
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body.len(), 72);
        assert!(resp.body.starts_with(b"Hello from Flick"));
        assert_eq!(resp.header("connection"), None, "a kept connection");
    }
    // The last response of a connection says it closes.
    let (mut s, mut r) = connect(port);
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let resp = read_response(&mut r);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("connection"), Some("close"));
    assert!(closed(&mut r), "HTTP/1.0 closes");
    let (mut s, mut r) = connect(port);
    s.write_all(
        b"GET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    assert_eq!(read_response(&mut r).header("connection"), None);
    assert_eq!(read_response(&mut r).header("connection"), Some("close"));
    assert!(closed(&mut r), "closed after Connection: close");
    let (mut s, mut r) = connect(port);
    s.write_all(b"GET / HTTP/1.1\r\nHost : t\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut r).status, 400);
    assert!(closed(&mut r));
}

/// The round-robin variant: each new connection takes the next backend in
/// turn and keeps it.
#[test]
fn round_robin_gives_connections_the_backends_in_turn() {
    let mut procs = Procs(Vec::new());
    let (a, b) = (site("rr-a"), site("rr-b"));
    let backends = [
        flick_testkit::nginx(&mut procs, &a, "a"),
        flick_testkit::nginx(&mut procs, &b, "b"),
    ];
    let port = run_balancer(
        &mut procs,
        "examples/http_lb_round_robin.flick",
        &backends,
        2000,
    );
    let mut order = Vec::new();
    for _ in 0..6 {
        let (mut s, mut r) = connect(port);
        let mut by = Vec::new();
        for i in 0..3 {
            write!(s, "GET /f{i}.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
            by.push(
                read_response(&mut r)
                    .header("x-served-by")
                    .unwrap()
                    .to_string(),
            );
        }
        assert!(
            by.iter().all(|x| *x == by[0]),
            "one backend per connection: {by:?}"
        );
        order.push(by[0].clone());
    }
    for pair in order.windows(2) {
        assert_ne!(pair[0], pair[1], "connections alternate: {order:?}");
    }
}

/// Clients that send one request per connection (`Connection: close`),
/// many at once: each gets its response. The closing request goes to the
/// backend over a connection of its own, so it does not close a backend
/// connection other clients share.
#[test]
fn one_request_per_connection_clients_all_get_responses() {
    let mut procs = Procs(Vec::new());
    let a = site("close");
    let backends = [flick_testkit::nginx(&mut procs, &a, "a")];
    // Slow replies on a loaded machine stay replies: not a test of timeouts.
    let port = balancer_with_timeout(&mut procs, &backends, 20_000);
    let clients: Vec<_> = (0..12)
        .map(|t| {
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                for i in 0..5 {
                    let (mut s, mut r) = connect(port);
                    let f = (t + i) % 8;
                    write!(
                        s,
                        "GET /f{f}.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
                    )
                    .unwrap();
                    let resp = read_response(&mut r);
                    assert_eq!(resp.body, format!("file {f}\n").as_bytes());
                    statuses.push(resp.status);
                }
                statuses
            })
        })
        .collect();
    for c in clients {
        assert!(c.join().unwrap().iter().all(|s| *s == 200));
    }
}

/// What nginx's `/echo` saw of a request: its `X-Forwarded-For` and
/// `Connection` fields, and which backend connection carried it.
fn echo(resp: &Response) -> std::collections::HashMap<String, String> {
    let body = String::from_utf8(resp.body.clone()).unwrap();
    let mut out = std::collections::HashMap::new();
    let mut key = String::new();
    for word in body.trim_end().split(' ') {
        match word.split_once('=') {
            Some((k, v)) => {
                key = k.to_string();
                out.insert(key.clone(), v.to_string());
            }
            // A value with spaces (`a, b`) goes on.
            None => out.get_mut(&key).unwrap().push_str(&format!(" {word}")),
        }
    }
    out
}

/// The balancer passes requests on as a proxy should: hop-by-hop fields
/// replaced by a keep-alive of its own, `X-Forwarded-For` added, and the
/// client told whether its connection stays. So clients that close after
/// each request share the pooled backend connections instead of each
/// opening one.
#[test]
fn forwarded_requests_keep_pooled_backend_connections_and_carry_x_forwarded_for() {
    let mut procs = Procs(Vec::new());
    let a = site("xff");
    let backends = [flick_testkit::nginx(&mut procs, &a, "a")];
    let port = balancer(&mut procs, &backends);
    let mut carried = std::collections::HashSet::new();
    for i in 0..12 {
        let (mut s, mut r) = connect(port);
        if i % 2 == 0 {
            write!(
                s,
                "GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
        } else {
            write!(s, "GET /echo HTTP/1.0\r\n\r\n").unwrap();
        }
        let resp = read_response(&mut r);
        assert_eq!(resp.status, 200, "request {i}");
        let seen = echo(&resp);
        assert_eq!(seen["xff"], "127.0.0.1", "request {i}: {seen:?}");
        assert_eq!(seen["connection"], "keep-alive", "request {i}: {seen:?}");
        assert_eq!(resp.header("connection"), Some("close"), "request {i}");
        assert!(
            closed(&mut r),
            "request {i}: the client's connection closes"
        );
        carried.insert(seen["conn"].clone());
    }
    // One backend connection per worker (two) carries them all.
    assert!(
        carried.len() <= 2,
        "12 closing clients used backend connections {carried:?}"
    );
    // HTTP/1.0 with keep-alive keeps the client's connection, and says so.
    let (mut s, mut r) = connect(port);
    for i in 0..3 {
        write!(s, "GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").unwrap();
        let resp = read_response(&mut r);
        assert_eq!(resp.status, 200, "request {i}");
        assert_eq!(resp.header("connection"), Some("keep-alive"), "request {i}");
    }
    // A client's own X-Forwarded-For is kept; the balancer adds its client
    // after it.
    write!(
        s,
        "GET /echo HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 10.1.2.3\r\n\r\n"
    )
    .unwrap();
    let seen = echo(&read_response(&mut r));
    assert!(seen["xff"].starts_with("10.1.2.3"), "{seen:?}");
}

/// Starts `program` in front of `backends` with a metrics endpoint; returns
/// the port it listens on and the metrics port.
fn run_balancer_with_metrics(procs: &mut Procs, program: &str, backends: &[u16]) -> (u16, u16) {
    use std::process::{Command, Stdio};
    let list: Vec<String> = backends.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let listen = format!("client=127.0.0.1:{}", support::free_port());
    let metrics = format!("127.0.0.1:{}", support::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(support::ROOT)
        .args(["run", program, "--listen", &listen])
        .args(["--connect", &format!("backends={}", list.join(","))])
        .args(["--metrics", &metrics, "--workers", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    procs.0.push(child);
    let mut port = || {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let addr = line
            .split_whitespace()
            .find_map(|w| {
                let w = w.trim_start_matches("http://").trim_end_matches("/metrics");
                w.parse::<std::net::SocketAddr>().ok()
            })
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        addr.port()
    };
    let (listening, metrics) = (port(), port());
    // Whatever else it prints is read, so that its writes never fail.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (listening, metrics)
}

/// `flick_instances_live` from the metrics endpoint.
fn instances_live(metrics: u16) -> u64 {
    let (mut s, mut r) = connect(metrics);
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    r.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("flick_instances_live "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no flick_instances_live in {text:?}"))
}

/// The least-connections variant: a new connection goes to the backend
/// with the fewest open client connections, and stays there.
#[test]
fn least_connections_spreads_open_connections() {
    let mut procs = Procs(Vec::new());
    let (a, b) = (site("lc-a"), site("lc-b"));
    let backends = [
        flick_testkit::nginx(&mut procs, &a, "a"),
        flick_testkit::nginx(&mut procs, &b, "b"),
    ];
    let (port, metrics) = run_balancer_with_metrics(
        &mut procs,
        "examples/http_lb_least_connections.flick",
        &backends,
    );
    // A request on an open connection: the backend that served it.
    let served_by = |s: &mut TcpStream, r: &mut BufReader<TcpStream>, i: usize| {
        write!(s, "GET /f{i}.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let resp = read_response(r);
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body, format!("file {i}\n").as_bytes());
        resp.header("x-served-by").unwrap().to_string()
    };
    // Four connections, opened one after another and kept open: two each.
    let mut open = Vec::new();
    for i in 0..4 {
        let (mut s, mut r) = connect(port);
        let by = served_by(&mut s, &mut r, i);
        open.push((s, r, by));
    }
    let on = |open: &[(TcpStream, BufReader<TcpStream>, String)], name: &str| {
        open.iter().filter(|c| c.2 == name).count()
    };
    let placed: Vec<&str> = open.iter().map(|c| c.2.as_str()).collect();
    assert_eq!((on(&open, "a"), on(&open, "b")), (2, 2), "{placed:?}");
    // Later requests of a connection go where its first went.
    for (i, (s, r, by)) in open.iter_mut().enumerate() {
        assert_eq!(served_by(s, r, i + 4), *by, "connection {i} stays");
    }
    // Both connections on one backend close; once their instances have
    // ended, that backend serves none and the other two.
    let emptied = open[0].2.clone();
    open.retain(|c| c.2 != emptied);
    assert_eq!(open.len(), 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while instances_live(metrics) != 2 {
        assert!(
            Instant::now() < deadline,
            "the closed connections' instances end"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // So both new connections go to it.
    for i in 0..2 {
        let (mut s, mut r) = connect(port);
        let by = served_by(&mut s, &mut r, i);
        assert_eq!(
            by, emptied,
            "new connection {i} goes to the emptied backend"
        );
        open.push((s, r, by));
    }
    assert_eq!((on(&open, "a"), on(&open, "b")), (2, 2));
}

/// The response to a HEAD request has a `Content-Length` but no body: the
/// balancer must not wait for one, and the connection goes on. CONNECT,
/// which would make a tunnel, is refused.
#[test]
fn head_responses_have_no_body_and_connect_is_refused() {
    let mut procs = Procs(Vec::new());
    let a = site("head");
    let backends = [flick_testkit::nginx(&mut procs, &a, "a")];
    let port = balancer(&mut procs, &backends);
    let (mut s, mut r) = connect(port);
    for i in 0..3 {
        write!(s, "HEAD /f{i}.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 200"), "{line:?}");
        let mut length = None;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            if h == "\r\n" {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                length = Some(v.trim().to_string());
            }
        }
        assert_eq!(length.as_deref(), Some("7"), "HEAD {i}");
        // A GET right after gets its own response, not the HEAD's "body".
        write!(s, "GET /f{i}.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let resp = read_response(&mut r);
        assert_eq!(resp.body, format!("file {i}\n").as_bytes());
    }
    let (mut s, mut r) = connect(port);
    write!(
        s,
        "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"
    )
    .unwrap();
    assert_eq!(read_response(&mut r).status, 501);
}

/// A backend that answers with a response framed by the end of its
/// connection, the bytes and the close in one go: the balancer must see
/// the end of the stream that came with the last bytes (a short read does
/// not mean the stream is still open).
#[test]
fn a_response_framed_by_its_connections_close_arrives_whole() {
    let mut procs = Procs(Vec::new());
    let backend = support::listener();
    let backend_port = backend.local_addr().unwrap().port();
    const ROUNDS: usize = 20;
    std::thread::spawn(move || {
        for c in backend.incoming().take(ROUNDS) {
            let mut c = c.unwrap();
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            // One write, then the close: the FIN rides with the bytes.
            let _ = c.write_all(b"HTTP/1.0 200 OK\r\nX-Framing: close\r\n\r\nall of the body");
        }
    });
    let port = balancer_with_timeout(&mut procs, &[backend_port], 3000);
    for i in 0..ROUNDS {
        let (mut s, mut r) = connect(port);
        write!(s, "GET /{i} HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let resp = read_response(&mut r);
        assert_eq!(resp.status, 200, "round {i}");
        assert_eq!(resp.body, b"all of the body", "round {i}");
    }
}

/// A status line and header lines, up to the empty line: (status, lines).
fn read_head(r: &mut BufReader<TcpStream>) -> (u16, Vec<String>) {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line, not {line:?}"));
    let mut lines = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        if h == "\r\n" || h.is_empty() {
            break;
        }
        lines.push(h.trim_end().to_string());
    }
    (status, lines)
}

/// A client that sends `Expect: 100-continue` gets the backend's interim
/// `100 Continue` (RFC 9110 section 10.1.1) and then, after its body, the
/// final response: an interim response does not answer the request
/// (`%more`), so the final one is not taken for the answer to whatever the
/// shared backend connection carries next. Another client meanwhile gets
/// its own response, and both connections go on.
#[test]
fn interim_100_continue_reaches_its_client_before_the_final_response() {
    let mut procs = Procs(Vec::new());
    let a = site("continue");
    let backends = [flick_testkit::nginx(&mut procs, &a, "a")];
    let port = balancer(&mut procs, &backends);
    for round in 0..4 {
        let (mut s, mut r) = connect(port);
        s.write_all(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
        )
        .unwrap();
        let (status, _) = read_head(&mut r);
        assert_eq!(status, 100, "round {round}: the interim response first");
        // A second client, while the first has its body still to send.
        let (mut s2, mut r2) = connect(port);
        write!(s2, "GET /f{round}.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        s.write_all(b"hello").unwrap();
        let resp = read_response(&mut r);
        assert_eq!(resp.status, 200, "round {round}");
        assert!(
            resp.body.starts_with(b"xff=127.0.0.1"),
            "round {round}: {:?}",
            String::from_utf8_lossy(&resp.body)
        );
        let other = read_response(&mut r2);
        assert_eq!(other.status, 200, "round {round}: the other client");
        assert_eq!(other.body, format!("file {round}\n").as_bytes());
        // Both connections go on.
        write!(s, "GET /f5.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        assert_eq!(read_response(&mut r).body, b"file 5\n", "round {round}");
        write!(s2, "GET /f6.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        assert_eq!(read_response(&mut r2).body, b"file 6\n", "round {round}");
    }
}

/// A backend that answers one request per connection with `reply`.
fn scripted_backend(reply: &'static [u8]) -> u16 {
    let backend = support::listener();
    let port = backend.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in backend.incoming() {
            let Ok(mut c) = c else { return };
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = c.write_all(reply);
            // Held open, as a keep-alive backend would.
            std::thread::spawn(move || {
                let _ = c.read(&mut buf);
            });
        }
    });
    port
}

/// A response the balancer must not pass on is the backend's fault: the
/// client gets 502. `101 Switching Protocols` (the balancer does not
/// switch protocols), and a field value with a bare LF, which a client
/// would read as a field of its own.
#[test]
fn switching_protocols_and_split_response_fields_are_502() {
    let mut procs = Procs(Vec::new());
    for (what, reply) in [
        (
            "101",
            &b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"[..],
        ),
        (
            "bare LF",
            b"HTTP/1.1 200 OK\r\nX-A: a\nSet-Cookie: s=1\r\nContent-Length: 0\r\n\r\n",
        ),
        // Transfer-Encoding with Content-Length (RFC 9112 section 6.3): the
        // balancer would read it as chunked, a client after it might go by
        // the length; nothing of it is passed on.
        (
            "TE and CL",
            b"HTTP/1.1 200 OK\r\nSet-Cookie: s=1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        ),
    ] {
        let port = balancer_with_timeout(&mut procs, &[scripted_backend(reply)], 5000);
        let (mut s, mut r) = connect(port);
        s.write_all(
            b"GET /ws HTTP/1.1\r\nHost: t\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        )
        .unwrap();
        let resp = read_response(&mut r);
        assert_eq!(resp.status, 502, "{what}");
        assert_eq!(resp.header("set-cookie"), None, "{what}");
    }
}

/// `--max-body-bytes` (1 MiB unless set): a request whose Content-Length
/// is over it gets 413 before any backend sees it, and a chunked one whose
/// chunks add up to more gets 413 at the chunk that takes it over; one
/// within it is forwarded. Empty lines before a request line are skipped
/// (RFC 9112 section 2.2).
#[test]
fn max_body_bytes_limits_request_bodies_and_empty_lines_are_skipped() {
    let mut procs = Procs(Vec::new());
    let a = site("max-body");
    let backends = [flick_testkit::nginx(&mut procs, &a, "a")];
    let port = support::flick_run_with(
        &mut procs,
        "examples/http_lb.flick",
        &backends,
        &["--max-body-bytes", "1000"],
    );
    let post = |n: usize| {
        let mut m =
            format!("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {n}\r\n\r\n").into_bytes();
        m.resize(m.len() + n, b'x');
        m
    };
    let chunked = |sizes: &[usize]| {
        let mut m =
            b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        for n in sizes {
            m.extend_from_slice(format!("{n:x}\r\n").as_bytes());
            m.resize(m.len() + n, b'x');
            m.extend_from_slice(b"\r\n");
        }
        m.extend_from_slice(b"0\r\n\r\n");
        m
    };
    // Within the limit: forwarded, and the connection goes on, past an
    // empty line (as a client may send after a body) and a bare LF.
    let (mut s, mut r) = connect(port);
    for m in [post(1000), b"\r\n\n".to_vec(), chunked(&[500, 500])] {
        s.write_all(&m).unwrap();
    }
    for what in ["Content-Length 1000", "chunks of 1000"] {
        let resp = read_response(&mut r);
        assert_eq!(resp.status, 200, "{what}");
        assert_eq!(resp.header("x-served-by"), Some("a"), "{what}");
    }
    s.write_all(b"\r\nGET /f3.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut r).body, b"file 3\n");
    // A Content-Length over it: the balancer's own 413, the backend sees
    // nothing, and the connection closes.
    let (mut s, mut r) = connect(port);
    s.write_all(&post(1001)).unwrap();
    let resp = read_response(&mut r);
    assert_eq!(resp.status, 413);
    assert_eq!(resp.header("x-served-by"), None);
    assert!(closed(&mut r));
    // The default is 1 MiB.
    let default = balancer(&mut procs, &backends);
    for (n, status) in [(1 << 20, 200), ((1 << 20) + 1, 413)] {
        let (mut s, mut r) = connect(default);
        s.write_all(&post(n)).unwrap();
        assert_eq!(read_response(&mut r).status, status, "Content-Length {n}");
    }
    // Chunks over it, in a request that fits the request buffer (16 KiB):
    // read whole before anything goes on, so the balancer's own 413, and
    // the connection closes.
    let (mut s, mut r) = connect(port);
    s.write_all(&chunked(&[500, 500, 1])).unwrap();
    let resp = read_response(&mut r);
    assert_eq!(resp.status, 413);
    assert_eq!(resp.header("x-served-by"), None);
    assert!(closed(&mut r), "nothing follows the one reply");
    // Chunks over it, in a request larger than the request buffer (here
    // 256 bytes), which streams: the head and the chunks within it went on
    // before the chunk that takes the body over, which the backend never
    // gets.
    // The backend has the head and may act on it, so its reply is the
    // request's: one that waits for the whole body never answers, and the
    // client gets the fault reply once the response timeout passes (504),
    // not a 413 saying the request was not processed; both connections
    // close.
    let (tx, rx) = std::sync::mpsc::channel();
    let silent = support::listener();
    let silent_port = silent.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let Ok((mut c, _)) = silent.accept() else {
            return;
        };
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        let _ = tx.send(got);
    });
    let port = support::flick_run_with(
        &mut procs,
        "examples/http_lb.flick",
        &[silent_port],
        &[
            "--max-body-bytes",
            "1000",
            "--response-timeout-ms",
            "300",
            "--request-buffer-bytes",
            "256",
        ],
    );
    let (mut s, mut r) = connect(port);
    let body = chunked(&[500, 500, 1]);
    s.write_all(&body).unwrap();
    let resp = read_response(&mut r);
    assert_eq!(resp.status, 504);
    assert!(closed(&mut r));
    let got = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the backend connection closes");
    let head = b"POST /echo HTTP/1.1\r\nHost: t\r\n";
    assert!(got.starts_with(head), "{:?}", String::from_utf8_lossy(&got));
    let within = body.len() - b"1\r\nx\r\n0\r\n\r\n".len();
    assert!(
        got.len() < within + 100,
        "the backend got {} bytes of a request of {}",
        got.len(),
        body.len()
    );
    assert!(!got.ends_with(b"0\r\n\r\n"), "the body is cut short");
}

/// Requests a backend might read otherwise than the balancer are refused
/// before any backend sees them, and their connection closes: a field
/// value with a bare LF (a second request inside the first), a bare CR or
/// a NUL, more than one Host, and a transfer coding other than `chunked`
/// alone (501).
#[test]
fn split_fields_extra_hosts_and_unknown_transfer_codings_are_refused() {
    let mut procs = Procs(Vec::new());
    let a = site("refuse");
    let backends = [flick_testkit::nginx(&mut procs, &a, "a")];
    let port = balancer(&mut procs, &backends);
    let cases: [(&[u8], u16); 9] = [
        (
            b"GET /f1.txt HTTP/1.1\r\nHost: t\r\nX: a\nGET /f2.txt HTTP/1.1\r\n\r\n",
            400,
        ),
        (b"GET /f1.txt HTTP/1.1\r\nHost: t\r\nX: a\rb\r\n\r\n", 400),
        (b"GET /f1.txt HTTP/1.1\r\nHost: t\r\nX: a\0b\r\n\r\n", 400),
        (b"GET /f1.txt HTTP/1.1\r\nHost: t\r\nHost: u\r\n\r\n", 400),
        (b"GET /f1.txt HTTP/1.1\r\n\r\n", 400),
        (
            b"POST /f1.txt HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            501,
        ),
        (
            b"POST /f1.txt HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
            501,
        ),
        (
            b"POST /f1.txt HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: identity\r\n\r\n",
            400,
        ),
        (
            b"POST /f1.txt HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            501,
        ),
    ];
    for (request, status) in cases {
        let what = String::from_utf8_lossy(request);
        let (mut s, mut r) = connect(port);
        // Earlier requests on the connection are still answered first.
        s.write_all(b"GET /f0.txt HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        s.write_all(request).unwrap();
        assert_eq!(read_response(&mut r).body, b"file 0\n", "{what:?}");
        let resp = read_response(&mut r);
        assert_eq!(resp.status, status, "{what:?}");
        assert!(resp.body.is_empty(), "{what:?}");
    }
    // `chunked` alone, in any case, is fine.
    let (mut s, mut r) = connect(port);
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut r).status, 200);
}

/// The body of a request that closes the client's connection (HTTP/1.0,
/// or `Connection: close`) is passed on whole, not only its head, even when
/// the backend answers from the head: the body, which would read as a
/// request of its own if left behind, never reaches the backend as one
/// (nginx would answer its `/f1.txt` as the next response on that
/// connection), and the clients after it get their own responses.
#[test]
fn a_closing_requests_body_is_forwarded_whole() {
    let mut procs = Procs(Vec::new());
    let a = site("closing-body");
    let backends = [flick_testkit::nginx(&mut procs, &a, "a")];
    let port = balancer(&mut procs, &backends);
    let body = "GET /f1.txt HTTP/1.1\r\nHost: smuggled\r\n\r\n";
    for (i, head) in [
        "POST /echo HTTP/1.0\r\n",
        "POST /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n",
    ]
    .into_iter()
    .enumerate()
    {
        let (mut s, mut r) = connect(port);
        write!(s, "{head}Content-Length: {}\r\n\r\n", body.len()).unwrap();
        // The body after the head has gone on, as a client that waits a
        // moment sends it.
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(body.as_bytes()).unwrap();
        let resp = read_response(&mut r);
        assert_eq!(resp.status, 200, "closing request {i}");
        assert!(closed(&mut r), "closing request {i}: the connection closes");
        for j in 0..12 {
            let (mut s, mut r) = connect(port);
            write!(s, "GET /f2.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
            let resp = read_response(&mut r);
            assert_eq!(
                (resp.status, resp.body.as_slice()),
                (200, &b"file 2\n"[..]),
                "closing request {i}, client {j} after it"
            );
        }
    }
}

/// Backend connections are exclusive for HTTP (the grammar's `%exclusive`):
/// a client whose request body comes one byte at a time for longer than
/// the response timeout, and one whose chunked body breaks its framing
/// half way, hold up and hurt no other client: those get every response
/// (a request queued behind the slow body would get 504 instead).
#[test]
fn a_slow_or_broken_body_holds_up_no_other_client() {
    let mut procs = Procs(Vec::new());
    let a = site("exclusive");
    let backends = [flick_testkit::nginx(&mut procs, &a, "a")];
    let port = balancer_with_timeout(&mut procs, &backends, 1000);
    std::thread::scope(|scope| {
        let slow = scope.spawn(|| {
            let (mut s, mut r) = connect(port);
            let body = [b'x'; 60];
            write!(
                s,
                "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .unwrap();
            // 60 bytes, one per 30 ms: 1.8 s, past the 1 s timeout.
            for b in body.chunks(1) {
                if s.write_all(b).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(30));
            }
            let _ = read_response(&mut r);
        });
        let broken = scope.spawn(|| {
            let (mut s, mut r) = connect(port);
            s.write_all(
                b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
            )
            .unwrap();
            std::thread::sleep(Duration::from_millis(100));
            // Not a chunk size: the request's framing is lost.
            let _ = s.write_all(b"zz\r\nmore\r\n");
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
        });
        // Meanwhile, other clients, on both workers.
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        for i in 0..40 {
            let (mut s, mut r) = connect(port);
            write!(s, "GET /f3.txt HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
            let resp = read_response(&mut r);
            assert_eq!(
                (resp.status, resp.body.as_slice()),
                (200, &b"file 3\n"[..]),
                "client {i}"
            );
            std::thread::sleep(Duration::from_millis(30));
        }
        assert!(started.elapsed() < Duration::from_secs(20));
        slow.join().unwrap();
        broken.join().unwrap();
    });
}

/// A backend that closes its connections after a few requests (nginx's
/// `keepalive_requests`, an idle timeout) costs clients nothing: the
/// balancer gives up a connection the backend says it closes and sends
/// the next request over a new one, so every request of every client gets
/// its response.
#[test]
fn a_backend_that_closes_its_connections_costs_no_request() {
    let mut procs = Procs(Vec::new());
    let a = site("closing-backend");
    let backends = [flick_testkit::nginx_with(
        &mut procs,
        &a,
        "a",
        "keepalive_requests 3;",
    )];
    let port = balancer(&mut procs, &backends);
    std::thread::scope(|scope| {
        for c in 0..4 {
            scope.spawn(move || {
                let (mut s, mut r) = connect(port);
                for i in 0..25 {
                    write!(s, "GET /f{}.txt HTTP/1.1\r\nHost: t\r\n\r\n", i % 8).unwrap();
                    let resp = read_response(&mut r);
                    assert_eq!(
                        (resp.status, resp.body.clone()),
                        (200, format!("file {}\n", i % 8).into_bytes()),
                        "client {c}, request {i}"
                    );
                    if resp.header("connection") == Some("close") {
                        // The backend's close ended this client's session:
                        // it goes on over a new connection, as clients do.
                        (s, r) = connect(port);
                    }
                }
            });
        }
    });
}
