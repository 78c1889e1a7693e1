//! HTTP/1.1 request vectors (`tests/http_vectors/cases.txt`): raw requests
//! from RFC 9110/9112, HAProxy's regression tests, HTTP Garden's findings
//! and request smuggling research, each with the class the RFCs decide.
//! Every case is sent on a fresh connection to the HTTP load balancer
//! (`examples/http_lb.flick`), and for comparison to nginx (`proxy_pass`)
//! and HAProxy (`mode http`), all three in front of one logging nginx
//! backend. Flick must pass every case the RFCs decide; nginx and HAProxy
//! are only recorded. `HTTP_VECTORS_TABLE=docs/http_vectors.md` writes the
//! results as markdown (a path relative to the workspace root).

mod support;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use support::Procs;

/// Decided cases Flick fails today, each with why. A case here is still
/// run and shown; it is not asserted, and the test says so if it passes.
/// Each group is one change to `grammars/http.grammar` (or the platform).
const KNOWN_GAPS: &[(&str, &str)] = &[
    // (none: a malformed chunked body, RFC 9112 section 7.1, was one until
    // a request that fits the request buffer was read whole before its head
    // went on.)
];

/// How long one case may take to get its first response.
const CASE_DEADLINE: Duration = Duration::from_secs(4);
/// Connections each proxy's cases are sent over at once.
const PARALLEL: usize = 6;
/// The most bytes of responses read for one case.
const READ_MAX: usize = 256 * 1024;

// ---------------------------------------------------------------------------
// The cases

/// What a proxy's answer may be, as the RFCs decide.
#[derive(Clone, Debug, PartialEq)]
enum Alt {
    /// Forwarded, and the backend's 2xx came back.
    Accept,
    /// Forwarded, whatever the backend answered.
    Forward,
    /// Answered by the proxy itself with one of these statuses (a status,
    /// or 400..=499 for `4xx`), nothing forwarded.
    Reject(Vec<(u16, u16)>),
}

#[derive(Clone, Debug)]
enum Expect {
    Either,
    AnyOf(Vec<Alt>),
}

struct Case {
    id: String,
    source: String,
    what: String,
    expect_text: String,
    expect: Expect,
    /// The bytes sent, `{n}` replaced.
    raw: Vec<u8>,
    /// `?c=NNN` when the requests carry the case's number.
    tag: Option<String>,
}

fn parse_expect(s: &str, at: &str) -> Expect {
    if s == "either" {
        return Expect::Either;
    }
    let alts = s
        .split(" or ")
        .map(|a| match a {
            "accept" => Alt::Accept,
            "forward" => Alt::Forward,
            _ => {
                let statuses = a
                    .strip_prefix("reject:")
                    .unwrap_or_else(|| panic!("{at}: unknown class {a:?}"));
                Alt::Reject(
                    statuses
                        .split('|')
                        .map(|st| match st {
                            "4xx" => (400, 499),
                            "5xx" => (500, 599),
                            _ => {
                                let v: u16 = st
                                    .parse()
                                    .unwrap_or_else(|_| panic!("{at}: bad status {st:?}"));
                                assert!((100..=599).contains(&v), "{at}: bad status {v}");
                                (v, v)
                            }
                        })
                        .collect(),
                )
            }
        })
        .collect();
    Expect::AnyOf(alts)
}

/// Decodes a `raw:` text: escapes, `{n}` and `{N*TEXT}`; returns the bytes
/// and where it stopped (after the `}` that closes a repetition).
fn decode(s: &[u8], mut i: usize, n: &str, nested: bool, at: &str) -> (Vec<u8>, usize) {
    let mut out = Vec::new();
    while i < s.len() {
        match s[i] {
            b'}' if nested => return (out, i + 1),
            b'\\' => {
                let e = *s.get(i + 1).unwrap_or_else(|| panic!("{at}: lone \\"));
                i += 2;
                match e {
                    b'r' => out.push(b'\r'),
                    b'n' => out.push(b'\n'),
                    b't' => out.push(b'\t'),
                    b'0' => out.push(0),
                    b'\\' => out.push(b'\\'),
                    b'{' => out.push(b'{'),
                    b'x' => {
                        let hex = std::str::from_utf8(s.get(i..i + 2).unwrap_or(b"")).unwrap_or("");
                        let v = u8::from_str_radix(hex, 16)
                            .unwrap_or_else(|_| panic!("{at}: bad \\x escape"));
                        out.push(v);
                        i += 2;
                    }
                    _ => panic!("{at}: unknown escape \\{}", e as char),
                }
            }
            b'{' if s[i..].starts_with(b"{n}") => {
                out.extend_from_slice(n.as_bytes());
                i += 3;
            }
            b'{' => {
                let digits = s[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                assert!(
                    digits > 0 && s.get(i + 1 + digits) == Some(&b'*'),
                    "{at}: `{{` starts neither {{n}} nor {{N*TEXT}} (write \\{{)"
                );
                let count: usize = std::str::from_utf8(&s[i + 1..i + 1 + digits])
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(count <= 1_000_000, "{at}: repetition too long");
                let (inner, end) = decode(s, i + 2 + digits, n, true, at);
                for _ in 0..count {
                    out.extend_from_slice(&inner);
                }
                i = end;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    assert!(!nested, "{at}: a repetition is not closed");
    (out, i)
}

fn load_cases() -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/http_vectors/cases.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    // (id, fields, raw text, first line)
    let mut blocks: Vec<(String, HashMap<String, String>, String, usize)> = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let number = number + 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = line
            .split_once(": ")
            .or_else(|| line.strip_suffix(':').map(|k| (k, "")))
            .unwrap_or_else(|| panic!("cases.txt:{number}: not `key: value`"));
        assert!(
            !value.ends_with([' ', '\t']),
            "cases.txt:{number}: trailing whitespace (write \\x20 or \\t)"
        );
        match key {
            "id" => blocks.push((value.to_string(), HashMap::new(), String::new(), number)),
            "raw" => {
                let b = blocks
                    .last_mut()
                    .unwrap_or_else(|| panic!("cases.txt:{number}: raw before id"));
                b.2.push_str(value);
            }
            "source" | "what" | "expect" => {
                let b = blocks
                    .last_mut()
                    .unwrap_or_else(|| panic!("cases.txt:{number}: {key} before id"));
                assert!(
                    b.1.insert(key.to_string(), value.to_string()).is_none(),
                    "cases.txt:{number}: {key} twice"
                );
            }
            _ => panic!("cases.txt:{number}: unknown key {key:?}"),
        }
    }
    assert!(blocks.len() < 1000, "case numbers have three digits");
    let mut seen = std::collections::HashSet::new();
    blocks
        .into_iter()
        .enumerate()
        .map(|(i, (id, fields, raw, line))| {
            let at = format!("cases.txt:{line} ({id})");
            assert!(seen.insert(id.clone()), "{at}: id used twice");
            assert!(!raw.is_empty(), "{at}: no raw");
            let field = |k: &str| {
                fields
                    .get(k)
                    .cloned()
                    .unwrap_or_else(|| panic!("{at}: no {k}"))
            };
            let n = format!("{:03}", i + 1);
            let (bytes, _) = decode(raw.as_bytes(), 0, &n, false, &at);
            let expect_text = field("expect");
            Case {
                expect: parse_expect(&expect_text, &at),
                expect_text,
                source: field("source"),
                what: field("what"),
                tag: raw.contains("{n}").then(|| format!("?c={n}")),
                raw: bytes,
                id,
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// What a proxy answered

#[derive(Clone, Debug, PartialEq)]
enum Answer {
    /// A response carrying the backend's `X-Served-By: a`.
    Backend(u16),
    /// A response the proxy made itself.
    Own(u16),
    /// Bytes that are no HTTP/1.x response (an HTTP/0.9 answer, say).
    NotHttp,
    /// The connection closed with no response.
    Closed,
    /// The connection was reset with no response.
    Reset,
    /// No (whole) response head within the deadline.
    Timeout,
}

/// One case through one proxy: its first final response, and what the
/// backend logged for it.
#[derive(Clone, Debug)]
struct Outcome {
    answer: Answer,
    /// Requests of this case the backend logged.
    backend_saw: usize,
    /// The backend logged a `/smuggled` request of this case.
    smuggled: bool,
}

impl Outcome {
    fn passes(&self, expect: &Expect) -> bool {
        let alts = match expect {
            Expect::Either => return !self.smuggled,
            Expect::AnyOf(alts) => alts,
        };
        !self.smuggled
            && alts.iter().any(|alt| match (alt, &self.answer) {
                (Alt::Accept, Answer::Backend(s)) => (200..300).contains(s),
                (Alt::Forward, Answer::Backend(_)) => true,
                (Alt::Reject(statuses), Answer::Own(s)) => {
                    self.backend_saw == 0 && statuses.iter().any(|(lo, hi)| (*lo..=*hi).contains(s))
                }
                _ => false,
            })
    }

    fn cell(&self, expect: &Expect) -> String {
        let mut s = match &self.answer {
            Answer::Backend(s) => format!("fwd {s}"),
            Answer::Own(s) => s.to_string(),
            Answer::NotHttp => "not HTTP".to_string(),
            Answer::Closed => "close".to_string(),
            Answer::Reset => "reset".to_string(),
            Answer::Timeout => "timeout".to_string(),
        };
        if self.smuggled {
            s.push_str(" +smuggled");
        } else if matches!(self.answer, Answer::Own(_)) && self.backend_saw > 0 {
            s.push_str(" +fwd");
        }
        if matches!(expect, Expect::AnyOf(_)) && !self.passes(expect) {
            s.push_str(" ✗");
        }
        s
    }
}

/// Sends `raw` on a fresh connection to `port` and reads up to the head of
/// the first final (non-1xx) response.
fn send_case(port: u16, raw: &[u8]) -> Answer {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return Answer::Closed;
    };
    let _ = s.set_nodelay(true);
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    // A proxy may answer and close before it has read everything: the
    // answer is what counts, not the write.
    let _ = s.write_all(raw);
    let deadline = Instant::now() + CASE_DEADLINE;
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while Instant::now() < deadline && buf.len() < READ_MAX {
        if let Some(answer) = first_final(&mut buf) {
            return answer;
        }
        match s.read(&mut chunk) {
            Ok(0) => {
                return match first_final(&mut buf) {
                    Some(a) => a,
                    None if buf.is_empty() => Answer::Closed,
                    None => Answer::NotHttp,
                }
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => {
                return match first_final(&mut buf) {
                    Some(a) => a,
                    None if buf.is_empty() => Answer::Reset,
                    None => Answer::NotHttp,
                }
            }
        }
    }
    first_final(&mut buf).unwrap_or(Answer::Timeout)
}

/// The first final response whose head `buf` holds whole; interim (1xx)
/// heads before it are dropped from `buf`.
fn first_final(buf: &mut Vec<u8>) -> Option<Answer> {
    // At most a few interim responses come first.
    for _ in 0..8 {
        let prefix = &buf[..buf.len().min(5)];
        if !b"HTTP/".starts_with(prefix) {
            return Some(Answer::NotHttp);
        }
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())?;
        if (100..200).contains(&status) {
            buf.drain(..end);
            continue;
        }
        let from_backend = lines.any(|l| {
            l.split_once(':')
                .is_some_and(|(n, v)| n.eq_ignore_ascii_case("x-served-by") && v.trim() == "a")
        });
        return Some(if from_backend {
            Answer::Backend(status)
        } else {
            Answer::Own(status)
        });
    }
    Some(Answer::NotHttp)
}

/// Every case through the proxy on `port`, `PARALLEL` at a time. With
/// `retry_faults`, a case the proxy answers with 502, 503 or 504 of its own
/// (Flick's fault replies: a backend that broke, cannot be reached or is
/// too slow, which are no parsing decisions) is sent again, at most twice,
/// and said so in the notes returned.
fn run_cases(port: u16, cases: &[Case], retry_faults: bool) -> (Vec<Answer>, Vec<String>) {
    let next = AtomicUsize::new(0);
    let mut answers: Vec<Option<Answer>> = vec![None; cases.len()];
    let mut notes = Vec::new();
    let done: Vec<Vec<(usize, Answer, Vec<String>)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..PARALLEL)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    // Each worker takes cases until none are left.
                    for _ in 0..cases.len() {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= cases.len() {
                            break;
                        }
                        let mut answer = send_case(port, &cases[i].raw);
                        let mut notes = Vec::new();
                        for _ in 0..2 {
                            if !(retry_faults
                                && matches!(
                                    answer,
                                    Answer::Own(502) | Answer::Own(503) | Answer::Own(504)
                                ))
                            {
                                break;
                            }
                            notes.push(format!(
                                "{}: fault reply {answer:?}, sent again",
                                cases[i].id
                            ));
                            answer = send_case(port, &cases[i].raw);
                        }
                        mine.push((i, answer, notes));
                    }
                    mine
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for (i, a, n) in done.into_iter().flatten() {
        answers[i] = Some(a);
        notes.extend(n);
    }
    (answers.into_iter().map(Option::unwrap).collect(), notes)
}

/// Per case tag (`?c=NNN`): how many requests the backend logged, and
/// whether one of them was `/smuggled`.
fn backend_log(path: &Path) -> HashMap<String, (usize, bool)> {
    let text = std::fs::read(path).unwrap_or_default();
    let mut seen: HashMap<String, (usize, bool)> = HashMap::new();
    for line in String::from_utf8_lossy(&text).lines() {
        let Some(at) = line.find("?c=") else { continue };
        let tag = line[at..].chars().take(6).collect::<String>();
        let e = seen.entry(tag).or_default();
        e.0 += 1;
        e.1 |= line.contains("/smuggled?c=");
    }
    seen
}

fn outcomes(cases: &[Case], answers: Vec<Answer>, log: &Path) -> Vec<Outcome> {
    let seen = backend_log(log);
    cases
        .iter()
        .zip(answers)
        .map(|(c, answer)| {
            let (backend_saw, smuggled) = c
                .tag
                .as_ref()
                .and_then(|t| seen.get(t).copied())
                .unwrap_or((0, false));
            Outcome {
                answer,
                backend_saw,
                smuggled,
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The servers

/// A scratch directory for configurations, logs and temporary files.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flick-http-vectors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Starts `cmd` and waits until every port in `ports` listens; `None` if
/// it exits first (a port was taken) or takes over 10 s.
fn start_listening(mut cmd: Command, ports: &[u16]) -> Option<Child> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if child.try_wait().ok().flatten().is_some() {
            return None;
        }
        if ports
            .iter()
            .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
        {
            return Some(child);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// nginx's scratch paths under `dir`, prefixed `name`.
fn nginx_paths(dir: &Path, name: &str) -> String {
    let d = dir.display();
    format!(
        "error_log {d}/{name}-error.log;\npid {d}/{name}.pid;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  client_body_temp_path {d}/{name}-body;\n  proxy_temp_path {d}/{name}-proxy;\n\
         fastcgi_temp_path {d}/{name}-fastcgi;\n  uwsgi_temp_path {d}/{name}-uwsgi;\n\
         scgi_temp_path {d}/{name}-scgi;\n"
    )
}

/// The backend: one nginx process with a listener per proxy in front, each
/// logging the requests it gets (status and target) to `backend-NAME.log`.
/// It answers 200 to every request it takes, and marks every response,
/// its own errors included, `X-Served-By: a`. Returns its ports in the
/// order of `names`.
fn backend(procs: &mut Procs, dir: &Path, names: &[&str]) -> Vec<u16> {
    for _ in 0..20 {
        let ports: Vec<u16> = names.iter().map(|_| support::free_port()).collect();
        let mut conf = String::from("daemon off;\nmaster_process off;\nworker_processes 1;\n");
        conf.push_str(&nginx_paths(dir, "backend"));
        conf.push_str("  log_format vectors '$status $request_uri';\n");
        for (name, port) in names.iter().zip(&ports) {
            write!(
                conf,
                "  server {{\n    listen 127.0.0.1:{port};\n\
                 access_log {}/backend-{name}.log vectors;\n    keepalive_requests 1000000;\n\
                 add_header X-Served-By a always;\n\
                 location / {{ return 200 \"ok\\n\"; }}\n  }}\n",
                dir.display()
            )
            .unwrap();
        }
        conf.push_str("}\n");
        let path = dir.join("backend.conf");
        std::fs::write(&path, conf).unwrap();
        let mut cmd = Command::new("nginx");
        cmd.arg("-c").arg(&path);
        if let Some(child) = start_listening(cmd, &ports) {
            procs.0.push(child);
            return ports;
        }
    }
    panic!("the nginx backend would not start (is nginx installed?)");
}

/// nginx as a reverse proxy to `backend`, with keep-alive connections to
/// it; `None` if nginx cannot be started.
fn nginx_proxy(procs: &mut Procs, dir: &Path, backend: u16) -> Option<u16> {
    for _ in 0..10 {
        let port = support::free_port();
        let mut conf = String::from("daemon off;\nmaster_process off;\nworker_processes 1;\n");
        conf.push_str(&nginx_paths(dir, "nginx-proxy"));
        write!(
            conf,
            "  access_log off;\n  upstream backend {{ server 127.0.0.1:{backend}; keepalive 16; }}\n\
             server {{\n    listen 127.0.0.1:{port};\n    location / {{\n\
             proxy_pass http://backend;\n      proxy_http_version 1.1;\n\
             proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n"
        )
        .unwrap();
        let path = dir.join("nginx-proxy.conf");
        std::fs::write(&path, conf).unwrap();
        let mut cmd = Command::new("nginx");
        cmd.arg("-c").arg(&path);
        if let Some(child) = start_listening(cmd, &[port]) {
            procs.0.push(child);
            return Some(port);
        }
        Command::new("nginx").arg("-v").output().ok()?;
    }
    None
}

/// HAProxy in `mode http` in front of `backend`; `None` if HAProxy cannot
/// be started.
fn haproxy(procs: &mut Procs, dir: &Path, backend: u16) -> Option<u16> {
    for _ in 0..10 {
        let port = support::free_port();
        let conf = format!(
            "global\n    maxconn 1024\n\
             defaults\n    mode http\n    timeout connect 2s\n    timeout client 10s\n\
             timeout server 10s\n    timeout http-request 10s\n\
             frontend vectors\n    bind 127.0.0.1:{port}\n    default_backend backend\n\
             backend backend\n    server a 127.0.0.1:{backend}\n"
        );
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, conf).unwrap();
        let mut cmd = Command::new("haproxy");
        cmd.arg("-f").arg(&path).arg("-db");
        if let Some(child) = start_listening(cmd, &[port]) {
            procs.0.push(child);
            return Some(port);
        }
        Command::new("haproxy").arg("-v").output().ok()?;
    }
    None
}

/// The version `program -v` reports (the word after `version`), for the
/// table.
fn version(program: &str) -> String {
    let out = Command::new(program).arg("-v").output();
    let text = out
        .map(|o| String::from_utf8_lossy(&[o.stdout, o.stderr].concat()).into_owned())
        .unwrap_or_default();
    let words: Vec<&str> = text.split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "version:" || *w == "version")
        .and_then(|i| words.get(i + 1))
        .map(|v| v.trim_start_matches("nginx/").to_string())
        .unwrap_or_else(|| "(not installed)".to_string())
}

// ---------------------------------------------------------------------------
// The table

struct Column {
    name: &'static str,
    outcomes: Option<Vec<Outcome>>,
}

fn md(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The number of decided cases a column passes, and of smuggled requests.
fn score(cases: &[Case], column: &Column) -> Option<(usize, usize)> {
    let outcomes = column.outcomes.as_ref()?;
    let passed = cases
        .iter()
        .zip(outcomes)
        .filter(|(c, o)| matches!(c.expect, Expect::AnyOf(_)) && o.passes(&c.expect))
        .count();
    let smuggled = outcomes.iter().filter(|o| o.smuggled).count();
    Some((passed, smuggled))
}

fn markdown(cases: &[Case], columns: &[Column], versions: &str) -> String {
    let decided = cases
        .iter()
        .filter(|c| matches!(c.expect, Expect::AnyOf(_)))
        .count();
    let mut out = String::new();
    out.push_str(INTRO);
    let gaps = match KNOWN_GAPS.len() {
        0 => String::new(),
        n => format!(" but its {n} known gaps"),
    };
    writeln!(
        out,
        "\n## Summary\n\n{} cases, {decided} of them decided by the RFCs. Flick must pass \
         every decided case{gaps}.\n\n\
         | | decided cases passed | cases that smuggle a request | answers unlike Flick's |\n\
         |---|---|---|---|",
        cases.len()
    )
    .unwrap();
    for col in columns {
        let Some((passed, smuggled)) = score(cases, col) else {
            writeln!(out, "| {} | not run | | |", col.name).unwrap();
            continue;
        };
        // How many of its answers differ from Flick's.
        let differ = match (&columns[0].outcomes, &col.outcomes) {
            (Some(flick), Some(other)) if col.name != columns[0].name => cases
                .iter()
                .enumerate()
                .filter(|(i, c)| flick[*i].cell(&c.expect) != other[*i].cell(&c.expect))
                .count()
                .to_string(),
            _ => "-".to_string(),
        };
        writeln!(
            out,
            "| {} | {passed} of {decided} | {smuggled} | {differ} |",
            col.name
        )
        .unwrap();
    }
    out.push('\n');
    writeln!(out, "Run with {versions}.\n").unwrap();
    if !KNOWN_GAPS.is_empty() {
        out.push_str(
            "Known gaps: decided cases Flick fails, listed in `KNOWN_GAPS` by cause \
             (in italics: passes in this run).\n\n",
        );
        let flick = columns[0].outcomes.as_ref();
        let mut reasons: Vec<&str> = Vec::new();
        for (_, why) in KNOWN_GAPS {
            if !reasons.contains(why) {
                reasons.push(why);
            }
        }
        for why in reasons {
            let ids: Vec<String> = KNOWN_GAPS
                .iter()
                .filter(|(_, w)| *w == why)
                .map(|(id, _)| {
                    let i = cases.iter().position(|c| c.id == *id).unwrap();
                    let passes = flick.is_some_and(|o| o[i].passes(&cases[i].expect));
                    if passes {
                        format!("_`{id}`_")
                    } else {
                        format!("`{id}`")
                    }
                })
                .collect();
            writeln!(out, "- {why}: {}", ids.join(", ")).unwrap();
        }
        out.push('\n');
    }
    out.push_str("## Cases\n\n| case | what | source | expected |");
    for col in columns {
        write!(out, " {} |", col.name).unwrap();
    }
    out.push_str("\n|---|---|---|---|");
    for _ in columns {
        out.push_str("---|");
    }
    out.push('\n');
    for (i, c) in cases.iter().enumerate() {
        write!(
            out,
            "| `{}` | {} | {} | {} |",
            c.id,
            md(&c.what),
            md(&c.source),
            md(&c.expect_text)
        )
        .unwrap();
        for col in columns {
            let cell = match &col.outcomes {
                Some(o) => o[i].cell(&c.expect),
                None => "n/a".to_string(),
            };
            write!(out, " {} |", md(&cell)).unwrap();
        }
        out.push('\n');
    }
    out
}

const INTRO: &str = r#"# HTTP request vectors

Raw HTTP/1.1 requests, each with the class RFC 9110 and RFC 9112 decide,
sent to the Flick HTTP load balancer (`examples/http_lb.flick` over
`grammars/http.grammar`) and, for comparison, to nginx and HAProxy as
reverse proxies. The cases are data:
`crates/flick/tests/http_vectors/cases.txt` (its header says how to write
one); their sources are RFC sections, HAProxy's regression tests
(`reg-tests/http-messaging`), HTTP Garden's findings and request smuggling
research (CL.TE, TE.CL, TE.TE). The test `crates/flick/tests/http_vectors.rs`
sends each case on a fresh connection and reads the first final response.
It asserts that Flick passes every decided case except its known gaps
(below), and that no case gets a smuggled request to the backend through
Flick; nginx and HAProxy are only recorded.

All three proxies are in front of one nginx backend with a listener and an
access log per proxy. The backend answers every request it takes with 200
as soon as it has the head (nginx's `return`, which does not wait for the
body), and marks every response it sends, its own errors included,
`X-Served-By: a`: a response with that field was forwarded, one without it
is the proxy's own. Requests carry `?c=NNN`, the case's number, so the log
says which case each request the backend got belongs to. nginx proxies with
`proxy_pass` over HTTP/1.1 keep-alive connections, HAProxy with `mode http`
and one `server` line, both otherwise as installed.

Flick's own fault replies (`502`, `503` or `504 Backend Error`) are no
parsing decisions: a case that gets one is sent again, at most twice, and
the test prints it. One well-formed request in some thousands gets such a
reply with the backend up (`503`, logged as "its backend cannot be
reached", or `502`), an open platform issue this keeps out of the vectors.

Regenerate this file (the path is relative to the workspace root):

```sh
HTTP_VECTORS_TABLE=docs/http_vectors.md cargo test --release -p flick --test http_vectors -- --nocapture
```

or `scripts/http_vectors.sh`. The test takes about 5 seconds.

## Classes

- `accept`: the proxy forwards the request and the backend's 2xx comes
  back.
- `forward`: the proxy forwards it, whatever the backend then answers (the
  backend, nginx, has limits and opinions of its own).
- `reject:S`: the proxy answers status S itself (several are joined by
  `|`; `4xx` is any client error) and the backend sees nothing of the
  case. The RFC makes the request invalid and names the status (a MUST,
  or the SHOULD 400 of RFC 9112 section 2.2 for what does not match the
  grammar).
- `A or B`: the RFC names the alternatives, such as MUST reject or replace
  with SP (a NUL or a bare CR in a value, obsolete line folding), or MUST
  answer 4xx if the server will not process something that large.
- `either`: the RFC leaves it open (a MAY or a SHOULD between accepting
  and refusing), or the case is outside what it decides. Not asserted,
  except that no smuggled request may reach the backend.

Where two rules meet, the stronger decides: `Transfer-Encoding: gzip` is a
coding the server does not understand (SHOULD 501, RFC 9112 section 6.1)
whose final coding is not chunked (MUST 400, section 6.3), so 400.

## Reading a result

- `fwd 200`: forwarded; the backend answered 200 (`fwd 400`: forwarded,
  and the backend refused it).
- `400`: the proxy answered 400 itself.
- `close`, `reset`: the connection ended with no response.
- `timeout`: no response within 4 s (the proxy waits for more bytes).
- `not HTTP`: bytes that are no HTTP/1.x response (an HTTP/0.9 answer).
- `+smuggled`: the backend got `/smuggled?c=NNN`, a request the
  RFC-conforming reading of the bytes does not contain: the proxy and the
  backend framed the bytes differently.
- `+fwd`: the proxy answered itself, but the backend got the case too.
- `✗`: the result is not in the expected class.
"#;

// ---------------------------------------------------------------------------
// The test

#[test]
fn request_vectors_through_flick_nginx_and_haproxy() {
    let started = Instant::now();
    let cases = load_cases();
    assert!(cases.len() >= 100, "{} cases", cases.len());
    for (id, _) in KNOWN_GAPS {
        assert!(
            cases.iter().any(|c| c.id == *id),
            "KNOWN_GAPS names {id}, no case"
        );
    }
    let dir = scratch();
    let mut procs = Procs(Vec::new());
    let names = ["flick", "nginx", "haproxy"];
    let backends = backend(&mut procs, &dir, &names);
    let flick = support::flick_run_with(
        &mut procs,
        "examples/http_lb.flick",
        &[backends[0]],
        &["--response-timeout-ms", "2000"],
    );
    let ports = [
        Some(flick),
        nginx_proxy(&mut procs, &dir, backends[1]),
        haproxy(&mut procs, &dir, backends[2]),
    ];
    // The three proxies at once, each `PARALLEL` cases at a time. Flick's
    // fault replies are retried: they are no parsing decisions, and one in
    // some thousands of requests gets one with the backend up (see
    // docs/http_vectors.md).
    let runs: Vec<Option<(Vec<Answer>, Vec<String>)>> = std::thread::scope(|scope| {
        let runs: Vec<_> = ports
            .iter()
            .enumerate()
            .map(|(k, port)| {
                let cases = &cases;
                scope.spawn(move || port.map(|p| run_cases(p, cases, k == 0)))
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let mut answers = Vec::new();
    for run in runs {
        answers.push(run.map(|(a, notes)| {
            for n in notes {
                println!("Flick {n}");
            }
            a
        }));
    }
    // Requests still on their way to the backend's log.
    std::thread::sleep(Duration::from_millis(500));
    let columns: Vec<Column> = answers
        .into_iter()
        .zip(names)
        .zip(["Flick", "nginx", "HAProxy"])
        .map(|((a, name), title)| Column {
            name: title,
            outcomes: a.map(|a| outcomes(&cases, a, &dir.join(format!("backend-{name}.log")))),
        })
        .collect();
    let versions = format!(
        "nginx {} (the backend, and the nginx proxy) and HAProxy {}",
        version("nginx"),
        version("haproxy")
    );
    let table = markdown(&cases, &columns, &versions);
    println!("{table}");
    if let Ok(path) = std::env::var("HTTP_VECTORS_TABLE") {
        std::fs::write(Path::new(support::ROOT).join(&path), &table).unwrap();
        println!("wrote {path}");
    }

    // Flick: every decided case passes, known gaps aside, and no case
    // smuggles a request.
    let flick = columns[0].outcomes.as_ref().unwrap();
    let mut failures = Vec::new();
    for (c, o) in cases.iter().zip(flick) {
        let gap = KNOWN_GAPS.iter().any(|(id, _)| *id == c.id);
        if o.smuggled || (!gap && !o.passes(&c.expect)) {
            failures.push(format!(
                "{} (expected {}): {:?}, backend saw {}{}\n    {}",
                c.id,
                c.expect_text,
                o.answer,
                o.backend_saw,
                if o.smuggled { ", SMUGGLED" } else { "" },
                c.raw.escape_ascii()
            ));
        } else if gap && o.passes(&c.expect) {
            println!("known gap {} passes now: take it out of KNOWN_GAPS", c.id);
        }
    }
    if failures.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!("{} cases in {:?}", cases.len(), started.elapsed());
    assert!(
        failures.is_empty(),
        "Flick fails {} case(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
