//! `flick serve` and `flick ctl` as an operator uses them: services
//! deployed into one running platform over the API's Unix socket, talked
//! to through their ports (the static web server answering HTTP, the
//! Memcached proxy in front of a real memcached), listed, inspected, their
//! `global` state read and written, a program that does not check refused
//! with its diagnostic, one undeployed while another keeps answering, a
//! redeploy that carries a counter over, a restart that deploys the
//! recorded services again, and the API's refusals; a service whose rule
//! faults or whose backend is gone answers its own clients with fault
//! replies while its neighbours answer as before. Every child process is
//! killed when its test ends, and every wait is bounded.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;
use support::http::{get_answer, http_program, unix_exchange};
use support::serve::{ctl, ok, refused, serve, TempDir};
use support::terminate;
use support::{free_port, memcached, request, response, Procs, ROOT};

fn example(name: &str) -> String {
    Path::new(ROOT)
        .join("examples")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The static web server example, which every test here deploys.
fn static_web() -> String {
    example("static_web.flick")
}

/// `flick ctl deploy web` of the static web server on `port`, with `more`.
fn deploy_web(state: &Path, port: u16, more: &[&str]) -> Output {
    deploy_on(state, "deploy", "web", &static_web(), port, more)
}

/// One HTTP GET over a new connection: the whole answer, or the error.
fn http_get(port: u16) -> std::io::Result<String> {
    get_answer(port, "/", Duration::from_secs(10))
}

/// `flick ctl VERB NAME FILE --listen client=127.0.0.1:PORT MORE...`.
fn deploy_on(state: &Path, verb: &str, name: &str, file: &str, port: u16, more: &[&str]) -> Output {
    let listen = format!("client=127.0.0.1:{port}");
    let mut args = vec![verb, name, file, "--listen", &listen];
    args.extend(more);
    ctl(state, &args)
}

/// A set and a get of `key` through the Memcached proxy on `port`.
fn memcached_round_trip(port: u16, key: &[u8], value: &[u8]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&request(0x01, key, value, &[0; 8])).unwrap();
    assert_eq!(response(&mut s).0, 0, "set through the proxy");
    s.write_all(&request(0x00, key, b"", b"")).unwrap();
    assert_eq!(
        response(&mut s),
        (0, value.to_vec()),
        "get through the proxy"
    );
}

/// A program with `global` state: a counter of requests and a greeting.
const COUNTER: &str = http_program!(
    "proc Counter: (request/simple_response client)
  global hits := 0
  global greeting := \"hello\"
  | client => respond(hits, greeting, client)

fun respond: (hits: ref integer, greeting: ref string, -/simple_response client, req: request) -> ()
  hits := hits + 1
  simple_response(200, \"OK\", greeting) => client
"
);

#[test]
fn services_deploy_answer_undeploy_redeploy_and_come_back_after_a_restart() {
    let dir = TempDir::new("life");
    let state = dir.0.join("state");
    let mut procs = Procs(Vec::new());
    let backend = memcached(&mut procs);
    let server = serve(&state, &[]);
    let (web, cache, count) = (free_port(), free_port(), free_port());

    let out = ok(&deploy_web(&state, web, &[]));
    assert!(out.contains("deployed web version 1"), "{out}");
    assert!(
        out.contains(" us"),
        "the deploy says how long it took: {out}"
    );
    ok(&deploy_on(
        &state,
        "deploy",
        "cache",
        &example("memcached_proxy.flick"),
        cache,
        &["--connect", &format!("backends=127.0.0.1:{backend}")],
    ));
    let page = http_get(web).unwrap();
    assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
    assert!(page.contains("Hello from Flick"), "{page}");
    memcached_round_trip(cache, b"serve:key", b"one");

    let list = ok(&ctl(&state, &["list"]));
    assert!(list.contains("web") && list.contains("cache"), "{list}");
    assert!(list.contains(&format!("127.0.0.1:{web}")), "{list}");
    let status: serde_json::Value =
        serde_json::from_str(&ok(&ctl(&state, &["--json", "status", "web"]))).unwrap();
    assert_eq!(status["listen"], format!("127.0.0.1:{web}"));
    assert!(status["counters"]["connections_accepted"].as_u64().unwrap() >= 1);
    assert_eq!(status["counters"]["channels"][0]["channel"], "client");
    let plain = ok(&ctl(&state, &["status", "cache"]));
    assert!(plain.contains(&format!("127.0.0.1:{backend}")), "{plain}");

    // Global state, read and written while the service runs.
    let counter = dir.file("counter.flick", COUNTER);
    ok(&deploy_on(&state, "deploy", "count", &counter, count, &[]));
    for _ in 0..2 {
        assert!(http_get(count).unwrap().ends_with("hello"));
    }
    assert_eq!(ok(&ctl(&state, &["read", "count", "hits"])).trim(), "2");
    ok(&ctl(&state, &["write", "count", "hits", "40"]));
    ok(&ctl(&state, &["write", "count", "greeting", "\"hi\""]));
    assert!(http_get(count).unwrap().ends_with("hi"));
    assert_eq!(ok(&ctl(&state, &["read", "count", "hits"])).trim(), "41");
    let err = refused(&ctl(&state, &["write", "count", "hits", "true"]));
    assert!(err.contains("holds an integer"), "{err}");
    let err = refused(&ctl(&state, &["read", "count", "nothing"]));
    assert!(err.contains("`nothing` is not state"), "{err}");

    // A program that does not check is refused with its diagnostic.
    let bad = dir.file(
        "bad.flick",
        "grammar http\n\ntype request: record\n  target : string\n\nproc Bad: (request/request client)\n  | client => nowhere(client)\n",
    );
    let err = refused(&ctl(
        &state,
        &["deploy", "bad", &bad, "--listen", "client=127.0.0.1:1"],
    ));
    assert!(err.contains("bad.flick does not check"), "{err}");
    assert!(
        err.contains("bad.flick:7:15"),
        "file, line and column: {err}"
    );
    assert!(err.contains("^^^^^^^"), "a caret under the name: {err}");
    assert!(err.contains("unknown function `nowhere`"), "{err}");
    let err = refused(&deploy_web(&state, 1, &[]));
    assert!(err.contains("deployed already"), "{err}");
    let err = refused(&deploy_on(
        &state,
        "deploy",
        "web2",
        &static_web(),
        web,
        &[],
    ));
    assert!(err.contains("service `web` listens on"), "{err}");

    // Undeploying one leaves the others answering.
    let out = ok(&ctl(&state, &["undeploy", "web"]));
    assert!(out.contains("undeployed web"), "{out}");
    assert!(http_get(web).is_err(), "nothing listens on {web} any more");
    memcached_round_trip(cache, b"serve:key2", b"two");
    assert!(!ok(&ctl(&state, &["list"])).contains("web "));

    // A redeploy starts the new version and carries the counter over.
    let out = ok(&deploy_on(
        &state,
        "redeploy",
        "count",
        &counter,
        count,
        &[],
    ));
    assert!(out.contains("version 2"), "{out}");
    assert!(out.contains("carried: hits, greeting"), "{out}");
    assert!(http_get(count).unwrap().ends_with("hi"));
    assert_eq!(ok(&ctl(&state, &["read", "count", "hits"])).trim(), "42");

    // Restarted on the same state directory, the services come back.
    drop(server);
    let server = serve(&state, &[]);
    assert!(
        server.banner.contains("2 services deployed again"),
        "{}",
        server.banner
    );
    let list = ok(&ctl(&state, &["list"]));
    assert!(list.contains("cache") && list.contains("count"), "{list}");
    memcached_round_trip(cache, b"serve:key3", b"three");
    assert!(http_get(count).unwrap().starts_with("HTTP/1.1 200 OK"));
    assert!(http_get(web).is_err(), "the undeployed service stays gone");
}

/// `COUNTER` whose rule faults on every request, after counting it (a
/// division by zero).
fn faulty_counter() -> String {
    COUNTER.replace(
        "  hits := hits + 1\n",
        "  hits := hits + 1\n  hits := 10 / (hits - hits)\n",
    )
}

#[test]
fn a_service_that_faults_or_loses_its_backend_leaves_the_others_answering() {
    let dir = TempDir::new("faults");
    let state = dir.0.join("state");
    let server = serve(&state, &[]);
    let (web, faulty, balancer, dead) = (free_port(), free_port(), free_port(), free_port());
    let deploy = |name: &str, file: &str, port: u16, more: &[&str]| {
        ok(&deploy_on(&state, "deploy", name, file, port, more));
    };
    deploy("web", &static_web(), web, &[]);
    let faulty_file = dir.file("faulty.flick", &faulty_counter());
    deploy("faulty", &faulty_file, faulty, &[]);
    // Nothing listens on `dead`: every request finds its backend gone.
    let dead = format!("backends=127.0.0.1:{dead}");
    deploy(
        "balancer",
        &example("http_lb.flick"),
        balancer,
        &["--connect", &dead],
    );
    let status = |answer: &str| -> u16 {
        answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    for round in 0..5 {
        let answer = http_get(faulty).unwrap();
        assert_eq!(
            status(&answer),
            500,
            "round {round}: the faulting rule's client gets the fault reply: {answer}"
        );
        let answer = http_get(balancer).unwrap();
        assert!(
            (502..=504).contains(&status(&answer)),
            "round {round}: the balancer's client gets 502/503/504: {answer}"
        );
        let page = http_get(web).unwrap();
        assert!(
            page.starts_with("HTTP/1.1 200 OK") && page.contains("Hello from Flick"),
            "round {round}: the neighbour answers as alone: {page}"
        );
    }
    // Both still run, and the faults were counted where they happened.
    let list = ok(&ctl(&state, &["list"]));
    for name in ["web", "faulty", "balancer"] {
        assert!(list.contains(name), "{name} still deployed: {list}");
    }
    assert_eq!(
        ok(&ctl(&state, &["read", "faulty", "hits"])).trim(),
        "5",
        "each faulting request ran to its fault"
    );
    drop(server);
}

#[test]
fn a_deploy_past_the_memory_budget_is_refused_with_the_figures() {
    let dir = TempDir::new("budget");
    let state = dir.0.join("state");
    let _server = serve(&state, &["--memory-budget", "2000000"]);
    let port = free_port();
    let err = refused(&deploy_web(&state, port, &[]));
    assert!(err.contains("the memory budget is 2000000 bytes"), "{err}");
    assert!(err.contains("per instance x 1024 instances"), "{err}");
    assert!(http_get(port).is_err(), "nothing was started");
    // Fewer instances fit.
    ok(&deploy_web(&state, port, &["--max-instances", "1"]));
}

#[test]
fn the_api_refuses_what_it_does_not_serve() {
    let dir = TempDir::new("refusals");
    let state = dir.0.join("state");
    // Not on loopback without a token: refused before anything starts.
    let out = Command::new("timeout")
        .arg("20")
        .arg(env!("CARGO_BIN_EXE_flick"))
        .args(["serve", "--api", "0.0.0.0:1", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--api-token"), "{err}");

    let _server = serve(&state, &[]);
    let ask = |raw: &[u8]| unix_exchange(&state.join("flick.sock"), raw);
    let big = ask(b"POST /services HTTP/1.1\r\nContent-Length: 5000000\r\n\r\n{}");
    assert!(big.starts_with("HTTP/1.1 413"), "{big}");
    assert!(big.contains("\"error\""), "{big}");
    let many: String = (0..100).map(|i| format!("X-{i}: y\r\n")).collect();
    let headers = ask(format!("GET /services HTTP/1.1\r\n{many}\r\n").as_bytes());
    assert!(headers.starts_with("HTTP/1.1 431"), "{headers}");
    assert!(ask(b"GET /nothing HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    assert!(ask(b"PATCH /services HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
    let junk = ask(b"POST /services HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc");
    assert!(junk.starts_with("HTTP/1.1 400"), "{junk}");
    assert!(ask(b"GET /services/none HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
}

#[test]
fn a_tcp_api_with_a_token_wants_it_on_every_request() {
    let dir = TempDir::new("token");
    let state = dir.0.join("state");
    let api = format!("127.0.0.1:{}", free_port());
    let _server = serve(&state, &["--api", &api, "--api-token", "sesame"]);
    let run = |token: Option<&str>| {
        let mut c = Command::new("timeout");
        c.arg("20")
            .arg(env!("CARGO_BIN_EXE_flick"))
            .args(["ctl", "--api", &api]);
        if let Some(t) = token {
            c.args(["--api-token", t]);
        }
        c.arg("list")
            .env_remove("FLICK_API_TOKEN")
            .output()
            .unwrap()
    };
    let err = refused(&run(None));
    assert!(err.contains("Authorization: Bearer"), "{err}");
    refused(&run(Some("wrong")));
    assert!(ok(&run(Some("sesame"))).contains("NAME"));
}

/// A service's configuration file sets its grammar's limits as `flick run`
/// does: `max_body_bytes = 10` refuses an 11-byte body with 413.
#[test]
fn a_deploys_configuration_sets_the_body_limit() {
    let dir = TempDir::new("limit");
    let state = dir.0.join("state");
    let _server = serve(&state, &[]);
    let port = free_port();
    let config = dir.0.join("web.toml");
    std::fs::write(&config, "max_body_bytes = 10\n").unwrap();
    ok(&deploy_web(
        &state,
        port,
        &["--config", &config.to_string_lossy()],
    ));
    let post = |n: usize| {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut m = format!(
            "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {n}\r\n\r\n"
        )
        .into_bytes();
        m.resize(m.len() + n, b'x');
        s.write_all(&m).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer
    };
    let over = post(11);
    assert!(over.starts_with("HTTP/1.1 413"), "{over}");
    let within = post(10);
    assert!(
        within.starts_with("HTTP/1.1 ") && !within.starts_with("HTTP/1.1 413"),
        "{within}"
    );
}

/// `GET /metrics` on the API: every service's counters in the Prometheus
/// text format, each labelled with its service, read at the scrape.
#[test]
fn metrics_cover_every_service_by_name() {
    let dir = TempDir::new("metrics");
    let state = dir.0.join("state");
    let _server = serve(&state, &[]);
    let ports = [free_port(), free_port()];
    for (name, port) in ["web", "site"].iter().zip(ports) {
        ok(&deploy_on(&state, "deploy", name, &static_web(), port, &[]));
    }
    for _ in 0..3 {
        assert!(http_get(ports[0]).unwrap().starts_with("HTTP/1.1 200"));
    }
    let metrics = b"GET /metrics HTTP/1.1\r\nHost: flick\r\n\r\n";
    let answer = unix_exchange(&state.join("flick.sock"), metrics);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("Content-Type: text/plain"), "{answer}");
    let accepted = |service: &str| {
        answer
            .lines()
            .find(|l| {
                l.starts_with("flick_connections_accepted_total{")
                    && l.contains(&format!("service=\"{service}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(accepted("web"), Some(3.0), "{answer}");
    assert_eq!(accepted("site"), Some(0.0), "{answer}");
}

/// Stopped cleanly (SIGTERM), `flick serve` saves each service's `global`
/// integers, booleans and strings; the next `serve` on the state directory
/// deploys the service again with them.
#[test]
fn globals_come_back_after_a_clean_stop() {
    let dir = TempDir::new("globals");
    let state = dir.0.join("state");
    let counter = dir.file("counter.flick", COUNTER);
    let port = free_port();
    let mut server = serve(&state, &[]);
    ok(&deploy_on(&state, "deploy", "count", &counter, port, &[]));
    for _ in 0..2 {
        assert!(http_get(port).unwrap().starts_with("HTTP/1.1 200"));
    }
    ok(&ctl(&state, &["write", "count", "greeting", "\"hey\""]));
    let exited = terminate(&mut server.child);
    assert!(exited.success(), "serve ended with {exited}");
    drop(server);
    let _server = serve(&state, &[]);
    assert_eq!(ok(&ctl(&state, &["read", "count", "hits"])).trim(), "2");
    assert_eq!(
        ok(&ctl(&state, &["read", "count", "greeting"])).trim(),
        "\"hey\""
    );
    assert!(http_get(port).unwrap().ends_with("hey"));
    assert_eq!(ok(&ctl(&state, &["read", "count", "hits"])).trim(), "3");
}
