//! `flick run` as an operator uses it: `--config` files, `--check`,
//! `--metrics` (Prometheus text format and OpenMetrics, read back by the
//! Prometheus project's Python parsers), `--access-log` and a clean stop
//! on SIGTERM, with
//! the Memcached proxy in front of real memcached servers (Debian package
//! `memcached`). Every wait here is bounded in time and every loop in count.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};
use support::{connect, free_port, memcached, request, response, Procs, ROOT};

/// A scratch directory removed when the test ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("flick-run-cli-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn program() -> String {
    Path::new(ROOT)
        .join("examples/memcached_proxy.flick")
        .to_string_lossy()
        .into_owned()
}

/// A configuration for the proxy in front of `backends`, listening and
/// serving metrics on free ports.
fn proxy_config(backends: &[u16]) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|p| format!("\"127.0.0.1:{p}\""))
        .collect();
    format!(
        "program = {:?}\nworkers = 2\nmetrics = \"127.0.0.1:{}\"\n\n[listen]\nclient = \"127.0.0.1:{}\"\n\n[connect]\nbackends = [{}]\n",
        program(),
        free_port(),
        free_port(),
        list.join(", ")
    )
}

/// `text` with the value after `key` on its line replaced by `value`.
fn replace_value(text: &str, key: &str, value: &str) -> String {
    text.lines()
        .map(|l| match l.strip_prefix(key) {
            Some(_) => format!("{key}{value}"),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn flick(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flick"))
        .args(args)
        .current_dir(ROOT)
        .output()
        .expect("flick runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A running `flick run`: its pid, its stdout, and the ports it printed.
struct Running {
    pid: u32,
    out: BufReader<ChildStdout>,
    port: u16,
    metrics: u16,
}

fn port_of(line: &str) -> u16 {
    let addr = line
        .split_whitespace()
        .find_map(|w| {
            let w = w.trim_start_matches("http://").trim_end_matches("/metrics");
            w.parse::<std::net::SocketAddr>().ok()
        })
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    addr.port()
}

fn start(procs: &mut Procs, args: &[&str]) -> Running {
    start_logging(procs, args, Stdio::inherit())
}

/// `start`, with the log (standard error) going to `log`.
fn start_logging(procs: &mut Procs, args: &[&str], log: Stdio) -> Running {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .arg("run")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    procs.0.push(child);
    let mut listening = String::new();
    out.read_line(&mut listening).unwrap();
    assert!(listening.contains("listening on"), "{listening:?}");
    let mut metrics = String::new();
    out.read_line(&mut metrics).unwrap();
    assert!(metrics.contains("/metrics"), "{metrics:?}");
    Running {
        pid,
        out,
        port: port_of(&listening),
        metrics: port_of(&metrics),
    }
}

/// `n` sets and gets through the proxy, each answered.
fn traffic(port: u16, n: usize) -> TcpStream {
    let mut c = connect(port);
    for i in 0..n {
        let key = format!("key:{i}");
        c.write_all(&request(0x01, key.as_bytes(), b"v", &[0; 8]))
            .unwrap();
        assert_eq!(response(&mut c).0, 0, "set {key}");
        c.write_all(&request(0x00, key.as_bytes(), b"", b""))
            .unwrap();
        assert_eq!(response(&mut c), (0, b"v".to_vec()), "get {key}");
    }
    c
}

/// One HTTP request; (status line, headers and body).
fn http_get(port: u16, path: &str) -> (String, String) {
    http_get_with(port, path, "")
}

/// `http_get` with more header lines (each ending in CRLF).
fn http_get_with(port: u16, path: &str, headers: &str) -> (String, String) {
    let mut s = connect(port);
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n").unwrap();
    let mut raw = Vec::new();
    s.take(1 << 20).read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete answer");
    let status = head.lines().next().unwrap_or("").to_string();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.trim().parse().ok())
        .expect("Content-Length");
    assert_eq!(length, body.len(), "Content-Length matches the body");
    (format!("{status}\n{head}"), body.to_string())
}

/// Checks the Prometheus text format (0.0.4): `# HELP`/`# TYPE` comments,
/// each family typed once before its samples (a histogram's samples named
/// with `_bucket`, `_sum` and `_count` after it), and every other line
/// `name value` or `name{label="value",...} value`. Returns the samples.
fn parse_exposition(text: &str) -> Vec<(String, f64)> {
    fn is_name(s: &str, colon: bool) -> bool {
        let mut cs = s.chars();
        matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || (colon && c == ':'))
            && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colon && c == ':'))
    }
    assert!(text.ends_with('\n'), "ends with a newline");
    let mut typed = std::collections::HashSet::new();
    let mut histograms = std::collections::HashSet::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(c) = line.strip_prefix('#') {
            let words: Vec<&str> = c.trim_start().splitn(3, ' ').collect();
            match words.as_slice() {
                ["HELP", name, help] => {
                    assert!(is_name(name, true) && !help.is_empty(), "{line}")
                }
                ["TYPE", name, kind] => {
                    assert!(is_name(name, true), "{line}");
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(kind),
                        "{line}"
                    );
                    if *kind == "counter" {
                        assert!(name.ends_with("_total"), "counter named _total: {line}");
                    }
                    if *kind == "histogram" {
                        histograms.insert(name.to_string());
                    }
                    assert!(typed.insert(name.to_string()), "typed twice: {line}");
                }
                _ => {}
            }
            continue;
        }
        assert!(!line.is_empty(), "no blank lines");
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("value of {line}"));
        let name = match series.split_once('{') {
            None => series,
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').unwrap_or_else(|| panic!("{line}"));
                // label="value" pairs, values with \\, \" and \n escapes.
                let mut rest = labels;
                while !rest.is_empty() {
                    let (label, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("{line}"));
                    assert!(is_name(label, false), "label {label:?} in {line}");
                    let mut chars = after.char_indices();
                    let end = loop {
                        match chars.next() {
                            Some((_, '\\')) => {
                                let e = chars.next().map(|(_, c)| c);
                                assert!(matches!(e, Some('\\' | '"' | 'n')), "{line}");
                            }
                            Some((i, '"')) => break i,
                            Some(_) => {}
                            None => panic!("unterminated label value in {line}"),
                        }
                    };
                    rest = &after[end + 1..];
                    rest = rest.strip_prefix(',').unwrap_or(rest);
                }
                name
            }
        };
        assert!(is_name(name, true), "{line}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| histograms.contains(*f)))
            .unwrap_or(name);
        assert!(typed.contains(family), "sample before its TYPE: {line}");
        samples.push((series.to_string(), value));
    }
    samples
}

fn value(samples: &[(String, f64)], series: &str) -> f64 {
    samples
        .iter()
        .find(|(s, _)| s == series)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {series} in {samples:?}"))
}

#[test]
fn check_accepts_a_good_config_and_the_example() {
    let dir = TempDir::new("good");
    let cfg = dir.file("good.toml", &proxy_config(&[free_port(), free_port()]));
    let o = flick(&["run", "--check", "--config", &cfg]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("valid"));
    // The shipped example, its program named relative to the file.
    let o = flick(&[
        "run",
        "--check",
        "--config",
        "examples/memcached_proxy.toml",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Flags override the file: a bad file value replaced by a good flag.
    let bad_workers = dir.file(
        "workers.toml",
        &proxy_config(&[free_port()]).replace("workers = 2", "workers = 0"),
    );
    let o = flick(&["run", "--check", "--config", &bad_workers]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("workers: 0 is out of range"),
        "{}",
        stderr(&o)
    );
    let o = flick(&["run", "--check", "--config", &bad_workers, "--workers", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn check_rejects_bad_configs_naming_the_problem() {
    let dir = TempDir::new("bad");
    let good = proxy_config(&[free_port()]);
    let cases = [
        (
            "unknown_key.toml",
            good.replace("workers = 2", "wokers = 2"),
            "unknown field `wokers`",
        ),
        (
            "unknown_channel.toml",
            good.replace("client = ", "clinet = "),
            "`clinet` is not a channel of process `Memcached`",
        ),
        (
            "bad_address.toml",
            replace_value(&good, "client = ", "\"127.0.0.1\""),
            "listen.client: `127.0.0.1`: invalid socket address",
        ),
        (
            "bad_metrics.toml",
            replace_value(&good, "metrics = ", "\"9100\""),
            "metrics: `9100`: invalid socket address",
        ),
        (
            "bad_sharing.toml",
            good.replace(
                "workers = 2",
                "workers = 2\nbackend_sharing = \"sometimes\"",
            ),
            "`sometimes` is not a way of sharing: pipelined or exclusive",
        ),
        (
            "not_toml.toml",
            "program = \n".to_string(),
            "TOML parse error at line 1",
        ),
    ];
    for (name, text, message) in cases {
        let path = dir.file(name, &text);
        let o = flick(&["run", "--check", "--config", &path]);
        assert_ne!(o.status.code(), Some(0), "{name} accepted");
        assert!(o.status.code().is_some(), "{name}: exited, not killed");
        let err = stderr(&o);
        assert!(err.contains(message), "{name}: {message:?} not in:\n{err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let o = flick(&["run", "--check", "--config", "/nonexistent/flick.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read"));
}

#[test]
fn metrics_count_connections_and_messages() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs), memcached(&mut procs)];
    let dir = TempDir::new("metrics");
    let cfg = dir.file("proxy.toml", &proxy_config(&backends));
    let run = start(&mut procs, &["--config", &cfg]);
    let requests = 10;
    let client = traffic(run.port, requests);
    // The writer counts a message after its last byte is written, so the
    // counters may trail the replies by a moment: poll, bounded.
    let deadline = Instant::now() + Duration::from_secs(10);
    let samples = loop {
        let (head, body) = http_get(run.metrics, "/metrics");
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
        assert!(
            head.contains("Content-Type: text/plain; version=0.0.4"),
            "{head}"
        );
        let samples = parse_exposition(&body);
        let out = value(&samples, "flick_messages_out_total{channel=\"client\"}");
        if out >= (2 * requests) as f64 || Instant::now() > deadline {
            break samples;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let v = |s: &str| value(&samples, s);
    assert!(v("flick_connections_accepted_total") >= 1.0);
    // The client and its two backend connections.
    assert!(v("flick_connections_open") >= 3.0);
    assert!(v("flick_instances_live") >= 1.0);
    let n = (2 * requests) as f64;
    assert!(v("flick_messages_in_total{channel=\"client\"}") >= n);
    assert!(v("flick_messages_out_total{channel=\"client\"}") >= n);
    assert!(v("flick_messages_in_total{channel=\"backends\"}") >= n);
    assert!(v("flick_messages_out_total{channel=\"backends\"}") >= n);
    assert_eq!(v("flick_malformed_messages_total"), 0.0);
    assert_eq!(v("flick_backend_connect_errors_total"), 0.0);
    assert!(v("flick_tasks_live") >= 1.0);
    assert!(v("flick_pooled_messages") >= 0.0);
    for w in 0..2 {
        v(&format!("flick_scheduler_queue_length{{worker=\"{w}\"}}"));
    }
    // Other paths are not found; the endpoint still answers afterwards.
    let (head, _) = http_get(run.metrics, "/");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    let (head, _) = http_get(run.metrics, "/metrics?again");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    drop(client);
}

#[test]
fn sigterm_stops_the_service_cleanly() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs)];
    let dir = TempDir::new("sigterm");
    let cfg = dir.file("proxy.toml", &proxy_config(&backends));
    // The flag overrides the file's worker count.
    let mut run = start(&mut procs, &["--config", &cfg, "--workers", "1"]);
    drop(traffic(run.port, 3));
    // A client that stays connected, idle: the shutdown closes it.
    let mut idle = traffic(run.port, 1);
    let killed = Command::new("kill")
        .args(["-TERM", &run.pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let child = procs
        .0
        .iter_mut()
        .find(|c| c.id() == run.pid)
        .expect("flick is a child");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "flick still runs 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "exit status {status}");
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(
        idle.read(&mut buf).unwrap_or(0),
        0,
        "the idle client was closed"
    );
    let mut rest = String::new();
    run.out.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("flick: stopped"), "{rest:?}");
}

#[test]
fn a_service_manager_hears_ready_once_it_listens_and_stopping_on_sigterm() {
    use std::os::unix::net::UnixDatagram;
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs)];
    let dir = TempDir::new("notify");
    let cfg = dir.file("proxy.toml", &proxy_config(&backends));
    // What systemd does for `Type=notify`: a datagram socket in NOTIFY_SOCKET.
    let sock_path = dir.0.join("notify.sock");
    let manager = UnixDatagram::bind(&sock_path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args(["run", "--config", &cfg, "--workers", "1"])
        .env("NOTIFY_SOCKET", &sock_path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    procs.0.push(child);
    let mut buf = [0u8; 64];
    let n = manager.recv(&mut buf).expect("READY=1 within 10 s");
    assert_eq!(&buf[..n], b"READY=1");
    // Ready means listening: a client is served at once.
    let mut listening = String::new();
    out.read_line(&mut listening).unwrap();
    drop(traffic(port_of(&listening), 2));
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let n = manager.recv(&mut buf).expect("STOPPING=1 within 10 s");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("flick: stopped"), "{rest:?}");
}

/// Listeners share their port with a reloaded version (SO_REUSEPORT), but
/// a second `flick run` on an address in use fails, as nginx does.
#[test]
fn a_second_run_on_an_address_in_use_fails() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs)];
    let dir = TempDir::new("in_use");
    let cfg = dir.file("proxy.toml", &proxy_config(&backends));
    let run = start(&mut procs, &["--config", &cfg, "--workers", "1"]);
    let listen = format!("client=127.0.0.1:{}", run.port);
    // Bounded: without the check the second run would serve on.
    let second = Command::new("timeout")
        .arg("10")
        .arg(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args(["run", "--config", &cfg, "--listen", &listen])
        .args(["--metrics", "127.0.0.1:0", "--workers", "1"])
        .output()
        .expect("flick runs");
    assert!(
        !second.status.success(),
        "a second run on port {} started",
        run.port
    );
    let err = stderr(&second);
    assert!(
        err.contains(&format!("cannot listen on 127.0.0.1:{}", run.port)) && err.contains("in use"),
        "{err}"
    );
    // The first still answers.
    drop(traffic(run.port, 1));
}

#[test]
fn help_lists_the_run_options() {
    let o = flick(&["run", "--help"]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for option in [
        "--config",
        "--listen",
        "--connect",
        "--workers",
        "--timeslice-us",
        "--metrics",
        "--access-log",
        "--max-instances",
        "--channel-capacity",
        "--dict-capacity",
        "--check",
    ] {
        assert!(help.contains(option), "{option} missing from:\n{help}");
    }
}

/// A run-time fault in compute code (a backend index out of range) gets
/// the client the grammar's fault reply in the request's place, the
/// connection reads on, one JSON log line names the rule and the program
/// position, and the metrics count the fault and the reply.
#[test]
fn a_compute_fault_gets_an_error_reply_a_log_line_and_a_metric() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs), memcached(&mut procs)];
    let dir = TempDir::new("fault");
    let log_path = dir.0.join("stderr.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let connect_to = format!(
        "backends=127.0.0.1:{},127.0.0.1:{}",
        backends[0], backends[1]
    );
    let program = "crates/flick/tests/programs/faulting_router.flick";
    let run = start_logging(
        &mut procs,
        &[
            program,
            "--listen",
            &format!("client=127.0.0.1:{}", free_port()),
            "--connect",
            &connect_to,
            "--metrics",
            &format!("127.0.0.1:{}", free_port()),
            "--log-format",
            "json",
        ],
        Stdio::from(log),
    );
    let mut c = connect(run.port);
    c.write_all(b"set abc 0 0 1\r\nx\r\nget a\r\nget abc\r\n")
        .unwrap();
    assert_eq!(
        String::from_utf8(support::read_until(&mut c, b"END\r\n")).unwrap(),
        "STORED\r\nSERVER_ERROR backend unavailable\r\nVALUE abc 0 1\r\nx\r\nEND\r\n"
    );
    let (_, body) = http_get(run.metrics, "/metrics");
    let samples = parse_exposition(&body);
    assert_eq!(value(&samples, "flick_compute_faults_total"), 1.0);
    assert_eq!(value(&samples, "flick_fault_replies_total"), 1.0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let text = std::fs::read_to_string(&log_path).unwrap();
        if let Some(l) = text.lines().find(|l| l.contains("compute fault")) {
            break l.to_string();
        }
        assert!(Instant::now() < deadline, "no log line in {text:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(line.starts_with('{') && line.ends_with('}'), "{line}");
    assert!(line.contains("\"level\":\"WARN\""), "{line}");
    assert!(
        line.contains("index -2 is out of range (length 2)"),
        "{line}"
    );
    assert!(
        line.contains(&format!("\"at\":\"{program}:18:10\"")),
        "{line}"
    );
    assert!(
        line.contains("client => by_length(backends), in by_length"),
        "{line}"
    );
}

/// `flick run` serves one process: a file with two is refused with a
/// diagnostic at the second, not served in part.
#[test]
fn a_file_with_two_processes_is_refused_at_the_second() {
    let dir = TempDir::new("two-procs");
    let text = std::fs::read_to_string(program()).unwrap();
    let second = "proc Second: (cmd/cmd client, [cmd/cmd] backends)\n  \
                  | backends => client\n  | client => target_backend(backends)\n";
    let file = dir.file("two.flick", &format!("{text}\n{second}"));
    let out = flick(&["run", "--check", &file, "--listen", "client=127.0.0.1:0"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("E0801"), "{err}");
    assert!(
        err.contains("serves one process, and this file has 2"),
        "{err}"
    );
    assert!(err.contains("`Second` would not be served"), "{err}");
    assert!(err.contains("two.flick:"), "{err}");
}

/// Reads an exposition with the Prometheus project's Python parser
/// (`prometheus_client`, installed by scripts/test.sh): the text-format
/// parser, or with `openmetrics` the OpenMetrics one, which also refuses
/// a histogram whose buckets are not cumulative or lack `+Inf`. For every
/// histogram the script checks that much itself too, and that its `+Inf`
/// bucket is its count. Returns the samples as the parser read them,
/// `name{label="value",...}` with labels in name order.
fn python_parse(body: &str, openmetrics: bool) -> Vec<(String, f64)> {
    const SCRIPT: &str = r#"
import math, sys
if sys.argv[1] == "openmetrics":
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
for fam in text_string_to_metric_families(sys.stdin.read()):
    series = {}
    for s in fam.samples:
        labels = ",".join('%s="%s"' % kv for kv in sorted(s.labels.items()))
        print("%s{%s}\t%r" % (s.name, labels, float(s.value)) if labels else "%s\t%r" % (s.name, float(s.value)))
        if fam.type == "histogram":
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            h = series.setdefault(key, {"buckets": [], "count": None})
            if s.name.endswith("_bucket"):
                h["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                h["count"] = s.value
    for key, h in series.items():
        b = sorted(h["buckets"])
        assert b and math.isinf(b[-1][0]), (fam.name, key, "no +Inf bucket")
        assert all(x[1] <= y[1] for x, y in zip(b, b[1:])), (fam.name, key, "not cumulative")
        assert b[-1][1] == h["count"], (fam.name, key, "+Inf is not the count")
"#;
    let mut child = Command::new("timeout")
        .args(["60", "python3", "-c", SCRIPT])
        .arg(if openmetrics { "openmetrics" } else { "text" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused /metrics (is prometheus_client installed? scripts/test.sh does): {}\n{body}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (series, v) = l.split_once('\t').unwrap();
            (series.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// `/metrics`, read by the Prometheus project's parsers, has a latency
/// histogram of the client's requests and one per backend, whose counts
/// are the requests sent, and a health gauge per backend: 1 while it
/// answers, 0 once it is killed and the proxy cannot reach it.
#[test]
fn metrics_read_by_prometheus_parsers_have_latency_histograms_and_backend_health() {
    let mut procs = Procs(Vec::new());
    let b0 = memcached(&mut procs);
    let killed = procs.0.len() - 1;
    let b1 = memcached(&mut procs);
    let dir = TempDir::new("histograms");
    let cfg = dir.file("proxy.toml", &proxy_config(&[b0, b1]));
    let run = start(&mut procs, &["--config", &cfg]);
    let requests = 20;
    let mut client = traffic(run.port, requests);
    let n = (2 * requests) as f64;
    let (head, body) = http_get(run.metrics, "/metrics");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    parse_exposition(&body);
    let samples = python_parse(&body, false);
    let v = |samples: &[(String, f64)], s: &str| value(samples, s);
    // Recorded as each reply is passed on, before the client reads it.
    let client_series =
        |what: &str| format!("flick_request_duration_seconds_{what}{{channel=\"client\"}}");
    assert_eq!(v(&samples, &client_series("count")), n);
    assert!(v(&samples, &client_series("sum")) > 0.0);
    let buckets: Vec<&(String, f64)> = samples
        .iter()
        .filter(|(s, _)| s.starts_with("flick_request_duration_seconds_bucket{"))
        .collect();
    assert_eq!(buckets.len(), 17, "16 bounds and +Inf: {buckets:?}");
    assert_eq!(
        v(
            &samples,
            "flick_request_duration_seconds_bucket{channel=\"client\",le=\"+Inf\"}"
        ),
        n
    );
    assert!(buckets.iter().any(|(s, _)| s.contains("le=\"5e-05\"")));
    let backend = |samples: &[(String, f64)], what: &str, port: u16| {
        v(
            samples,
            &format!("{what}{{backend=\"127.0.0.1:{port}\",channel=\"backends\"}}"),
        )
    };
    let answered = |samples: &[(String, f64)], port| {
        backend(
            samples,
            "flick_backend_response_duration_seconds_count",
            port,
        )
    };
    // Every request went to one backend or the other, and was answered.
    assert_eq!(answered(&samples, b0) + answered(&samples, b1), n);
    assert!(answered(&samples, b0) > 0.0 && answered(&samples, b1) > 0.0);
    for port in [b0, b1] {
        assert_eq!(backend(&samples, "flick_backend_up", port), 1.0);
        assert_eq!(
            backend(&samples, "flick_backend_consecutive_connect_failures", port),
            0.0
        );
    }
    assert_eq!(v(&samples, "flick_access_log_dropped_total"), 0.0);

    // OpenMetrics for a scraper that asks for it, read by its own parser.
    let (head, body) = http_get_with(
        run.metrics,
        "/metrics",
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
    );
    assert!(
        head.contains("Content-Type: application/openmetrics-text"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    let samples = python_parse(&body, true);
    assert_eq!(v(&samples, &client_series("count")), n);

    // The first backend dies: requests for its keys get fault replies, and
    // it shows as down once the proxy finds it cannot reconnect.
    procs.0[killed].kill().unwrap();
    procs.0[killed].wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let samples = loop {
        for i in 0..8 {
            let key = format!("key:{i}");
            client
                .write_all(&request(0x00, key.as_bytes(), b"", b""))
                .unwrap();
            response(&mut client);
        }
        let samples = python_parse(&http_get(run.metrics, "/metrics").1, false);
        if backend(&samples, "flick_backend_up", b0) == 0.0
            && backend(&samples, "flick_backend_connect_failures_total", b0) >= 1.0
        {
            break samples;
        }
        assert!(
            Instant::now() < deadline,
            "the killed backend still shows as up: {samples:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(backend(&samples, "flick_backend_consecutive_connect_failures", b0) >= 1.0);
    assert_eq!(backend(&samples, "flick_backend_up", b1), 1.0);
    assert!(v(&samples, "flick_fault_replies_total") >= 1.0);
}

/// `--access-log FILE` (over the file's `access_log`) writes a line per
/// request answered, with its time, client, channel, backend, outcome,
/// sizes and duration: `reply` for the live backend's requests, `fault`
/// for those of a backend nothing listens on.
#[test]
fn the_access_log_has_a_line_per_request_answered() {
    let mut procs = Procs(Vec::new());
    let live = memcached(&mut procs);
    let dead = free_port();
    let dir = TempDir::new("access-log");
    let ignored = dir.0.join("ignored.log");
    let log_path = dir.0.join("access.log");
    let cfg = dir.file(
        "proxy.toml",
        &format!(
            "access_log = {:?}\n{}",
            ignored.to_string_lossy(),
            proxy_config(&[live, dead])
        ),
    );
    let run = start(
        &mut procs,
        &[
            "--config",
            &cfg,
            "--access-log",
            &log_path.to_string_lossy(),
        ],
    );
    let mut c = connect(run.port);
    let requests = 12;
    let mut sent = Vec::new();
    for i in 0..requests {
        let key = format!("key:{i}");
        let req = request(0x01, key.as_bytes(), b"value", &[0; 8]);
        c.write_all(&req).unwrap();
        let h = support::response_header(&mut c);
        let (_, body) = support::response_body(&mut c, &h);
        sent.push((req.len(), support::status(&h), 24 + body.len()));
    }
    let statuses: Vec<u16> = sent.iter().map(|s| s.1).collect();
    assert!(
        statuses.contains(&0),
        "some set reached the live backend: {statuses:?}"
    );
    assert!(
        statuses.iter().any(|s| *s != 0),
        "some got fault replies: {statuses:?}"
    );
    // Written by the log's thread within a flush or two.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if text.lines().count() >= requests || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), requests, "a line per request:\n{text}");
    let client = c.local_addr().unwrap().to_string();
    for (line, (request_bytes, status, reply_bytes)) in lines.iter().zip(&sent) {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 8, "{line}");
        // 2026-05-01T12:00:00.123456Z
        assert!(
            f[0].len() == 27 && f[0].ends_with('Z') && f[0].as_bytes()[10] == b'T',
            "{line}"
        );
        assert_eq!(f[1], client, "{line}");
        assert_eq!(f[2], "client", "{line}");
        let (backend, outcome) = match status {
            0 => (live, "reply"),
            _ => (dead, "fault"),
        };
        assert_eq!(f[3], format!("127.0.0.1:{backend}"), "{line}");
        assert_eq!(f[4], outcome, "{line}");
        assert_eq!(f[5], request_bytes.to_string(), "{line}");
        assert_eq!(f[6], reply_bytes.to_string(), "{line}");
        let micros: u64 = f[7].parse().unwrap_or_else(|_| panic!("{line}"));
        assert!(micros < 10_000_000, "{line}");
    }
    assert!(
        !ignored.exists(),
        "the flag overrides the file's access_log"
    );
    let samples = parse_exposition(&http_get(run.metrics, "/metrics").1);
    assert_eq!(value(&samples, "flick_access_log_dropped_total"), 0.0);
}

/// A program that answers requests itself (no backend) logs and times
/// them too: one access log line and one histogram count per request.
#[test]
fn requests_a_program_answers_itself_are_logged_and_timed() {
    let mut procs = Procs(Vec::new());
    let dir = TempDir::new("access-log-static");
    let log_path = dir.0.join("access.log");
    let port = free_port();
    let metrics = free_port();
    let run = start(
        &mut procs,
        &[
            "examples/static_web.flick",
            "--listen",
            &format!("client=127.0.0.1:{port}"),
            "--metrics",
            &format!("127.0.0.1:{metrics}"),
            "--access-log",
            &log_path.to_string_lossy(),
            "--workers",
            "1",
        ],
    );
    let requests = 5;
    let mut c = TcpStream::connect(("127.0.0.1", run.port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reply_bytes = 0;
    for i in 0..requests {
        write!(c, "GET /page{i} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        // The page is 137 bytes, head and body.
        let mut page = [0u8; 137];
        c.read_exact(&mut page).unwrap();
        assert!(
            page.starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&page)
        );
        reply_bytes += page.len();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if text.lines().count() >= requests || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), requests, "a line per request:\n{text}");
    let client = c.local_addr().unwrap().to_string();
    for line in &lines {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 8, "{line}");
        assert_eq!(
            (f[1], f[2], f[3], f[4]),
            (client.as_str(), "client", "-", "reply"),
            "{line}"
        );
        assert_eq!(f[6], (reply_bytes / requests).to_string(), "{line}");
    }
    let (_, body) = http_get(run.metrics, "/metrics");
    let samples = parse_exposition(&body);
    assert_eq!(
        value(
            &samples,
            "flick_request_duration_seconds_count{channel=\"client\"}"
        ),
        requests as f64,
        "{body}"
    );
}

/// `--max-body-bytes` with a grammar that has no such limit (Memcached)
/// says it has no effect, and the program runs.
#[test]
fn a_limit_the_grammar_lacks_is_warned_about() {
    let mut procs = Procs(Vec::new());
    let mc = memcached(&mut procs);
    let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args([
            "run",
            "examples/memcached_ascii_proxy.flick",
            "--listen",
            &format!("client=127.0.0.1:{}", free_port()),
            "--connect",
            &format!("backends=127.0.0.1:{mc}"),
            "--max-body-bytes",
            "5",
            "--workers",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = support::first_line(&mut child);
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(line.contains("listening on"), "{line:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--max-body-bytes has no effect") && err.contains("no limit `max_body_bytes`"),
        "{err}"
    );
}

/// The cores each of process `pid`'s threads named `flick-worker-*` may
/// run on, in thread-name order, and the cores of the process itself.
fn worker_cores(pid: u32) -> (Vec<String>, String) {
    let allowed = |status: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|v| v.trim().to_string())
            .unwrap()
    };
    let process = allowed(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap());
    let mut workers = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap();
        if comm.starts_with("flick-worker-") {
            let status = std::fs::read_to_string(t.join("status")).unwrap();
            workers.push((comm.trim().to_string(), allowed(&status)));
        }
    }
    workers.sort();
    (workers.into_iter().map(|(_, c)| c).collect(), process)
}

/// The workers go where the kernel puts them unless `--pin-workers` (or
/// `pin_workers = true`) keeps each on a core of its own, as nginx's
/// `worker_cpu_affinity auto`.
#[test]
fn workers_are_pinned_only_when_asked() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut procs = Procs(Vec::new());
    let listen = |port: u16| format!("client=127.0.0.1:{port}");
    let metrics = || format!("127.0.0.1:{}", free_port());
    let (plain, m) = (listen(free_port()), metrics());
    let args = [
        "examples/static_web.flick",
        "--listen",
        &plain,
        "--metrics",
        &m,
    ];
    let r = start(&mut procs, &[&args[..], &["--workers", "2"]].concat());
    let (workers, process) = worker_cores(r.pid);
    assert_eq!(workers, vec![process.clone(), process], "unpinned");
    let (pinned, m) = (listen(free_port()), metrics());
    let args = [
        "examples/static_web.flick",
        "--listen",
        &pinned,
        "--metrics",
        &m,
    ];
    let r = start(
        &mut procs,
        &[&args[..], &["--workers", "2", "--pin-workers"]].concat(),
    );
    let (workers, process) = worker_cores(r.pid);
    assert_eq!(workers.len(), 2);
    if cores > 1 {
        assert_ne!(workers[0], process, "worker 0 on one core of {process}");
        assert!(
            workers.iter().all(|w| !w.contains(['-', ','])),
            "{workers:?}"
        );
        assert_ne!(workers[0], workers[1], "two workers, two cores");
    }
}
