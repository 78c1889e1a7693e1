//! No kept-alive client connection is closed by a reload (`flick run`'s
//! SIGHUP) or a redeploy (`flick serve`): the old version answers what it
//! has read, then hands each connection to the new version, which reads
//! the client's next request. Clients here send requests over one
//! connection each, continuously (some with pauses long enough for their
//! connections to park), one of them right as each reload is asked for;
//! every request must be answered on the connection it was written to
//! (no close, reset or EOF, never a reconnect), and by the end every
//! connection is served by the last version. A proxied service with a
//! slow backend has requests in flight as it reloads: they are answered
//! by the old version, and their connections move on after.
//! Each `flick` is killed when the test ends, and every wait is bounded.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::http::path_backend;
use support::serve::TempDir;
use support::{counting_program, free_port, hup};

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `flick run ARGS` on two workers; the child and its standard error,
/// collected as it comes.
fn flick_run(args: &[&str], port: u16) -> (Killed, Arc<Mutex<String>>) {
    let (child, log) = support::run_logging(args, port);
    (Killed(child), log)
}

/// Waits (at most 30 s) until `log` holds `text` `times` times.
fn wait_log(log: &Mutex<String>, text: &str, times: usize) {
    let until = Instant::now() + Duration::from_secs(30);
    while log.lock().unwrap().matches(text).count() < times {
        assert!(
            Instant::now() < until,
            "{times} x {text:?} never logged: {}",
            log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A kept-alive connection and what it has seen.
struct Client {
    s: TcpStream,
    /// Requests answered.
    answered: u64,
}

impl Client {
    /// Connects, waiting (at most 30 s) for something to listen.
    fn connect(port: u16) -> Client {
        let until = Instant::now() + Duration::from_secs(30);
        let s = loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => break s,
                Err(e) => {
                    assert!(Instant::now() < until, "nothing listens on {port}: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        Client { s, answered: 0 }
    }

    /// One GET of `path`, answered whole on this connection: the reason
    /// phrase and the body. Any close, reset or stall is an error.
    fn get(&mut self, path: &str) -> Result<(String, String), String> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        self.s
            .write_all(request.as_bytes())
            .map_err(|e| format!("write: {e}"))?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match self.s.read(&mut byte) {
                Ok(0) => return Err(format!("EOF after {} bytes of a response", head.len())),
                Ok(_) => head.push(byte[0]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(str::to_owned)
            })
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        self.s
            .read_exact(&mut body)
            .map_err(|e| format!("body: {e}"))?;
        let status = head.lines().next().unwrap_or_default();
        if !status.starts_with("HTTP/1.1 200 ") {
            return Err(format!("not 200: {head}"));
        }
        if head.to_ascii_lowercase().contains("connection: close") {
            return Err(format!("told the connection closes: {head}"));
        }
        self.answered += 1;
        let reason = status.splitn(3, ' ').nth(2).unwrap_or_default().to_string();
        Ok((reason, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// What the clients saw.
#[derive(Default)]
struct Seen {
    answered: AtomicU64,
    failures: Mutex<Vec<String>>,
}

/// Kept-alive clients sending requests until `stop`, each pausing
/// `pause` between requests; each fails on its first unanswered request
/// and never connects again.
fn clients(
    port: u16,
    pauses: &[Duration],
    stop: &Arc<AtomicBool>,
    seen: &Arc<Seen>,
) -> Vec<std::thread::JoinHandle<Client>> {
    pauses
        .iter()
        .enumerate()
        .map(|(n, pause)| {
            let (stop, seen, pause) = (stop.clone(), seen.clone(), *pause);
            let mut c = Client::connect(port);
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let path = format!("/c{n}/{i}");
                    let failed = match c.get(&path) {
                        // A proxied answer echoes the path: its own.
                        Ok((_, body)) if body.starts_with('/') && body != path => {
                            Some(format!("another request's answer: {body}"))
                        }
                        Ok(_) => None,
                        Err(e) => Some(e),
                    };
                    if let Some(e) = failed {
                        let failure = format!("client {n}, request {i} ({pause:?} apart): {e}");
                        seen.failures.lock().unwrap().push(failure);
                        break;
                    }
                    seen.answered.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                    std::thread::sleep(pause);
                }
                c
            })
        })
        .collect()
}

/// Pauses between requests: none, short ones (the connection rests and
/// is handed on by its reader) and ones past the park time (1 s: the
/// connection waits parked and the drain hands it on).
fn pauses() -> Vec<Duration> {
    [0, 0, 1, 3, 10, 40, 1200, 1500]
        .iter()
        .map(|ms| Duration::from_millis(*ms))
        .collect()
}

/// Runs clients while `reload` runs with a client of its own (sending a
/// request right as it asks for each reload), then checks that nothing
/// failed and that every connection, still open, answers with `last`.
fn across(port: u16, reloads: usize, last: Option<&str>, mut reload: impl FnMut(usize)) {
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let running = clients(port, &pauses(), &stop, &seen);
    let mut racer = Client::connect(port);
    racer.get("/racer").unwrap();
    for n in 0..reloads {
        reload(n);
        // Written as the reload happens: the old version has it, or the
        // new one; either way it is answered on this connection.
        let answered = racer.get(&format!("/racer/{n}"));
        if let Err(e) = answered {
            seen.failures
                .lock()
                .unwrap()
                .push(format!("the request sent as reload {n} began: {e}"));
        }
    }
    // Past the park time, so that the slow clients' connections were
    // parked when the last drain began.
    std::thread::sleep(Duration::from_millis(1600));
    stop.store(true, Ordering::Relaxed);
    let mut conns: Vec<Client> = running.into_iter().map(|t| t.join().unwrap()).collect();
    let failures = seen.failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "requests left unanswered: {failures:#?}"
    );
    conns.push(racer);
    let answered = seen.answered.load(Ordering::Relaxed);
    eprintln!(
        "{answered} requests answered over {} connections across {reloads} reloads",
        conns.len()
    );
    assert!(answered > 50, "too few requests: {answered}");
    for (n, c) in conns.iter_mut().enumerate() {
        let (reason, _) = c
            .get("/last")
            .unwrap_or_else(|e| panic!("connection {n}, after the reloads: {e}"));
        if let Some(last) = last {
            assert_eq!(reason, last, "connection {n} is served by the last version");
        }
    }
}

#[test]
fn sighup_reloads_close_no_kept_alive_connection() {
    let dir = TempDir::new("reload-keep-alive");
    let path = dir.0.join("hits.flick");
    std::fs::write(&path, counting_program("v0")).unwrap();
    let port = free_port();
    let (run, log) = flick_run(&[path.to_str().unwrap()], port);
    let reloads = 6;
    across(port, reloads, Some(&format!("v{reloads}")), |n| {
        std::fs::write(&path, counting_program(&format!("v{}", n + 1))).unwrap();
        hup(&run.0);
        wait_log(&log, "reloaded", n + 1);
        // The old version drains meanwhile, handing connections on.
        std::thread::sleep(Duration::from_millis(300));
    });
    wait_log(&log, "old version stopped", reloads);
}

#[test]
fn serve_redeploys_close_no_kept_alive_connection() {
    let dir = TempDir::new("redeploy-keep-alive");
    let state = dir.0.join("state");
    let _serve = support::serve::serve(&state, &[]);
    let port = free_port();
    let listen = format!("client=127.0.0.1:{port}");
    let file = dir.file("hits.flick", &counting_program("v0"));
    support::serve::ok(&support::serve::ctl(
        &state,
        &["deploy", "hits", &file, "--listen", &listen],
    ));
    let redeploys = 5;
    across(port, redeploys, Some(&format!("v{redeploys}")), |n| {
        std::fs::write(&file, counting_program(&format!("v{}", n + 1))).unwrap();
        let said = support::serve::ok(&support::serve::ctl(
            &state,
            &["redeploy", "hits", &file, "--listen", &listen],
        ));
        assert!(said.contains(&format!("version {}", n + 2)), "{said}");
        std::thread::sleep(Duration::from_millis(300));
    });
}

#[test]
fn requests_in_flight_at_a_reload_are_answered_and_their_connections_move_on() {
    let (backend, _) = path_backend(Duration::from_millis(30));
    let connect = format!("backends=127.0.0.1:{backend}");
    let port = free_port();
    let (run, log) = flick_run(&["examples/http_lb.flick", "--connect", &connect], port);
    let reloads = 4;
    across(port, reloads, None, |n| {
        hup(&run.0);
        wait_log(&log, "reloaded", n + 1);
        std::thread::sleep(Duration::from_millis(300));
    });
    wait_log(&log, "old version stopped", reloads);
}
