//! `flick run` leaves no request unanswered, as nginx's reload does: a
//! server just started answers the connections made in its first
//! milliseconds, and across 20 SIGHUP reloads under load (clients on new
//! and kept-alive connections, and busy threads beside them, as parallel
//! tests are) every request on a new connection is answered within 2 s,
//! none reset or refused, and no kept-alive connection closed: the old
//! version hands them to the new one (`reload_keep_alive.rs` holds that
//! to more clients and pauses).
//! `flick serve`'s redeploy, the same path, is held to the same over 10
//! redeploys.
//! Each `flick run` is killed when the test ends, and every wait is
//! bounded.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::serve::TempDir;
use support::{counting_program, free_port, ROOT};

/// How long a request may wait for its answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// Held by each test for its whole run: the tests load the machine on
/// purpose, each by a measured amount, and three at once would starve
/// each other's clients past `ANSWER_WITHIN` on two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running `flick run` on two workers, killed on drop.
struct Run {
    child: Child,
    port: u16,
    /// Lines of its standard output seen so far ("listening", "reloaded").
    log: Arc<std::sync::Mutex<String>>,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Run {
    /// Starts `flick run PROGRAM` on `port`, without waiting for it.
    fn spawn(program: &std::path::Path, port: u16) -> Run {
        let (child, log) = support::run_logging(&[program.to_str().unwrap()], port);
        Run { child, port, log }
    }

    fn hup(&self) {
        support::hup(&self.child);
    }

    fn reloads(&self) -> usize {
        self.log.lock().unwrap().matches("reloaded").count()
    }
}

/// How a request ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// Answered: the reason phrase.
    Answered(String),
    /// Answered on a kept-alive connection with `Connection: close`: the
    /// server ends it, and the client, as HTTP clients do, asks next on a
    /// new one.
    AnsweredClosing(String),
    /// Nothing within `ANSWER_WITHIN`.
    Stalled,
    /// Closed or reset before any byte of an answer.
    Closed,
    /// Refused: nothing listened.
    Refused,
}

/// One GET on `s`, its answer read whole.
fn exchange(s: &mut TcpStream, keep_alive: bool) -> Outcome {
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let request = format!("GET / HTTP/1.1\r\nHost: x\r\nConnection: {connection}\r\n\r\n");
    if s.write_all(request.as_bytes()).is_err() {
        return Outcome::Closed;
    }
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    let failed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Outcome::Stalled,
        _ => Outcome::Closed,
    };
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(0) => return Outcome::Closed,
            Ok(_) => head.push(byte[0]),
            Err(e) => return failed(e),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    if let Err(e) = s.read_exact(&mut body) {
        return failed(e);
    }
    let reason = head.lines().next().and_then(|l| l.splitn(3, ' ').nth(2));
    let reason = reason.unwrap_or_default().to_string();
    let closing = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("connection: close"));
    if keep_alive && closing {
        Outcome::AnsweredClosing(reason)
    } else {
        Outcome::Answered(reason)
    }
}

fn connect(port: u16) -> Result<TcpStream, Outcome> {
    let s = TcpStream::connect(("127.0.0.1", port)).map_err(|_| Outcome::Refused)?;
    s.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    s.set_write_timeout(Some(ANSWER_WITHIN)).unwrap();
    Ok(s)
}

/// A GET over a new connection.
fn get_new(port: u16) -> Outcome {
    match connect(port) {
        Ok(mut s) => exchange(&mut s, false),
        Err(o) => o,
    }
}

/// Threads that keep both cores busy until dropped, as tests running
/// beside this one do.
struct Busy(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl Busy {
    fn start(threads: usize) -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Busy(stop, handles)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        for h in self.1.drain(..) {
            let _ = h.join();
        }
    }
}

#[test]
fn connections_made_as_flick_run_starts_are_answered() {
    let _one = one_at_a_time();
    let dir = TempDir::new("start-load");
    let path = dir.0.join("hits.flick");
    std::fs::write(&path, counting_program("v1")).unwrap();
    let _busy = Busy::start(2);
    // Each round, clients connect from the moment the port is bound
    // (refused before), one request each, and nothing else arrives that
    // would wake a listener that missed its connections.
    for round in 0..8 {
        let port = free_port();
        let run = Run::spawn(&path, port);
        let clients: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    let until = Instant::now() + Duration::from_secs(30);
                    loop {
                        match connect(port) {
                            Ok(mut s) => return exchange(&mut s, false),
                            Err(_) if Instant::now() < until => {
                                std::thread::sleep(Duration::from_micros(200))
                            }
                            Err(o) => return o,
                        }
                    }
                })
            })
            .collect();
        for c in clients {
            let outcome = c.join().unwrap();
            assert_eq!(
                outcome,
                Outcome::Answered("v1".into()),
                "round {round}: a connection made as flick run started; log:\n{}",
                run.log.lock().unwrap()
            );
        }
    }
}

/// What the clients saw, counted.
#[derive(Default)]
struct Counts {
    answered: AtomicU64,
    stalled: AtomicU64,
    /// Of those, on a kept-alive connection.
    stalled_kept_alive: AtomicU64,
    /// New connections closed or reset before their answer.
    reset: AtomicU64,
    refused: AtomicU64,
    /// Kept-alive connections closed by a draining version before an
    /// answer: asked again on a new connection.
    keep_alive_closed: AtomicU64,
    /// Kept-alive connections whose answer said `Connection: close`.
    announced_closes: AtomicU64,
}

impl Counts {
    fn note(&self, outcome: &Outcome) {
        let counter = match outcome {
            Outcome::Answered(_) | Outcome::AnsweredClosing(_) => &self.answered,
            Outcome::Stalled => &self.stalled,
            Outcome::Closed => &self.reset,
            Outcome::Refused => &self.refused,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Requests over new connections until `stop`.
fn fresh_client(port: u16, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    while !stop.load(Ordering::Relaxed) {
        counts.note(&get_new(port));
    }
}

/// Requests over one kept-alive connection until `stop`; when the
/// server closes it, a new one, as HTTP clients do.
fn keep_alive_client(port: u16, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let mut conn: Option<TcpStream> = None;
    while !stop.load(Ordering::Relaxed) {
        let reused = conn.is_some();
        let mut s = match conn.take() {
            Some(s) => s,
            None => match connect(port) {
                Ok(s) => s,
                Err(o) => {
                    counts.note(&o);
                    continue;
                }
            },
        };
        match exchange(&mut s, true) {
            Outcome::Answered(r) => {
                counts.note(&Outcome::Answered(r));
                conn = Some(s);
            }
            Outcome::AnsweredClosing(r) => {
                counts.note(&Outcome::Answered(r));
                counts.announced_closes.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Closed if reused => {
                counts.keep_alive_closed.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Stalled if reused => {
                counts.stalled_kept_alive.fetch_add(1, Ordering::Relaxed);
                counts.note(&Outcome::Stalled);
            }
            other => counts.note(&other),
        }
    }
}

/// Runs `reload` while clients (two on new connections, two on
/// kept-alive ones) and two busy threads run beside it; what the clients
/// saw, checked: no request stalled, reset or refused.
fn under_load(port: u16, reload: impl FnOnce()) {
    let _busy = Busy::start(2);
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (stop, counts) = (stop.clone(), counts.clone());
            std::thread::spawn(move || match i % 2 {
                0 => fresh_client(port, stop, counts),
                _ => keep_alive_client(port, stop, counts),
            })
        })
        .collect();
    reload();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let report = format!(
        "answered {}, stalled {} ({} on kept-alive connections), reset {}, refused {}, kept-alive closed {} ({} announced)",
        read(&counts.answered),
        read(&counts.stalled),
        read(&counts.stalled_kept_alive),
        read(&counts.reset),
        read(&counts.refused),
        read(&counts.keep_alive_closed),
        read(&counts.announced_closes)
    );
    eprintln!("{report}");
    assert!(read(&counts.answered) > 100, "too few requests: {report}");
    assert_eq!(read(&counts.stalled), 0, "{report}");
    assert_eq!(read(&counts.reset), 0, "{report}");
    assert_eq!(read(&counts.refused), 0, "{report}");
    assert_eq!(read(&counts.keep_alive_closed), 0, "{report}");
}

/// Asks over new connections (at most 30 s) until `version` answers.
fn wait_for_version(port: u16, version: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    while get_new(port) != Outcome::Answered(version.into()) {
        assert!(Instant::now() < until, "{version} never answered");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn no_request_is_left_unanswered_across_reloads_under_load() {
    let _one = one_at_a_time();
    let dir = TempDir::new("reload-load");
    let path = dir.0.join("hits.flick");
    std::fs::write(&path, counting_program("v1")).unwrap();
    let run = Run::spawn(&path, free_port());
    wait_for_version(run.port, "v1");
    let reloads = 20;
    under_load(run.port, || {
        for n in 2..=reloads + 1 {
            std::fs::write(&path, counting_program(&format!("v{n}"))).unwrap();
            run.hup();
            let until = Instant::now() + Duration::from_secs(30);
            while run.reloads() < n - 1 {
                assert!(Instant::now() < until, "reload {n} never happened");
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let last = format!("v{}", reloads + 1);
    assert_eq!(
        get_new(run.port),
        Outcome::Answered(last),
        "the last version answers"
    );
}

/// A running `flick serve` on two workers, killed on drop.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `flick ctl --api SOCKET ARGS`, bounded in time; its output if it
/// succeeded.
fn ctl(state: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args(["ctl", "--api"])
        .arg(state.join("flick.sock"))
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "flick ctl {args:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn no_request_is_left_unanswered_across_flick_serves_redeploys_under_load() {
    let _one = one_at_a_time();
    let dir = TempDir::new("redeploy-load");
    let state = dir.0.join("state");
    let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args(["serve", "--workers", "2", "--state-dir"])
        .arg(&state)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let _serve = Serve(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out);
        let mut line = String::new();
        while lines.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("serving the API") {
                let _ = tx.send(());
            }
            line.clear();
        }
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("flick serve serves its API");
    let port = free_port();
    let listen = format!("client=127.0.0.1:{port}");
    let path = dir.0.join("hits.flick");
    std::fs::write(&path, counting_program("v1")).unwrap();
    let file = path.to_str().unwrap();
    ctl(&state, &["deploy", "hits", file, "--listen", &listen]);
    wait_for_version(port, "v1");
    let redeploys = 10;
    under_load(port, || {
        for n in 2..=redeploys + 1 {
            std::fs::write(&path, counting_program(&format!("v{n}"))).unwrap();
            let said = ctl(&state, &["redeploy", "hits", file, "--listen", &listen]);
            assert!(said.contains(&format!("version {n}")), "{said}");
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let last = format!("v{}", redeploys + 1);
    assert_eq!(
        get_new(port),
        Outcome::Answered(last),
        "the last version answers"
    );
}
