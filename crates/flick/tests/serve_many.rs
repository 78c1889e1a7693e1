//! Many services on one `flick serve`: each deployed on a port of its own
//! answers an HTTP GET, and after they are all undeployed the server runs
//! no more threads than it did with a few, because every service shares
//! the platform's workers. The server is killed when the test ends, and
//! every wait is bounded.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{free_port, ROOT};

/// Services deployed at once, each answering a client: 1000 deploy,
/// answer and undeploy in about 5 s in a release build on two cores (the
/// test prints its times). Each holds a listener per worker, more
/// descriptors than the usual soft limit of 1024: `flick serve` raises its
/// limit to the hard one.
const SERVICES: usize = 1000;

/// A scratch directory removed when the test ends.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `flick serve`, killed on drop.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `flick serve` on `state` with two workers and waits (at most
/// 30 s) for it to serve the API.
fn serve(state: &Path) -> Serve {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args([
            "serve",
            "--workers",
            "2",
            "--log-level",
            "warn",
            "--state-dir",
        ])
        .arg(state)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out);
        let mut line = String::new();
        let _ = lines.read_line(&mut line);
        let _ = tx.send(line);
        let mut rest = String::new();
        while lines.read_line(&mut rest).unwrap_or(0) > 0 {
            rest.clear();
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
    let s = Serve(child);
    assert!(
        line.contains("serving the API"),
        "flick serve printed {line:?}"
    );
    s
}

/// One API request over the Unix socket: the status and the body.
fn api(state: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = UnixStream::connect(state.join("flick.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: flick\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

/// One HTTP GET over a new connection: the whole answer.
fn http_get(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

/// The process's thread count, from /proc.
fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// Waits (at most 10 s) for `pid`'s thread count to be at most `most`;
/// the count then.
fn threads_settle(pid: u32, most: usize) -> usize {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let n = threads(pid);
        if n <= most || Instant::now() > until {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn many_services_answer_on_one_serve_and_cost_no_threads_each() {
    let started = Instant::now();
    let dir =
        TempDir(std::env::temp_dir().join(format!("flick-serve-many-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    std::fs::create_dir_all(&dir.0).unwrap();
    let state = dir.0.join("state");
    let server = serve(&state);
    let pid = server.0.id();
    let program =
        std::fs::read_to_string(Path::new(ROOT).join("examples/static_web.flick")).unwrap();
    let file = Path::new(ROOT).join("examples/static_web.flick");

    let mut ports = Vec::new();
    let mut threads_after_one = 0;
    for i in 0..SERVICES {
        let port = free_port();
        let spec = serde_json::json!({
            "name": format!("web{i}"),
            "file": file.to_string_lossy(),
            "program": program,
            "listen": [format!("client=127.0.0.1:{port}")],
        });
        let (status, answer) = api(&state, "POST", "/services", &spec.to_string());
        assert_eq!(status, 201, "deploy {i}: {answer}");
        ports.push(port);
        if i == 0 {
            // The API's handler thread of this deploy may still be ending.
            threads_after_one = threads(pid);
        }
    }
    let deployed = started.elapsed();
    for (i, port) in ports.iter().enumerate() {
        let answer = http_get(*port);
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.contains("Hello from Flick"),
            "service {i} on port {port} answered {answer:?}"
        );
    }
    let with_all = threads_settle(pid, threads_after_one);
    assert!(
        with_all <= threads_after_one + 2,
        "{SERVICES} services run {with_all} threads, one ran {threads_after_one}"
    );
    for i in 0..SERVICES {
        let (status, answer) = api(&state, "DELETE", &format!("/services/web{i}"), "");
        assert_eq!(status, 200, "undeploy {i}: {answer}");
    }
    let (_, list) = api(&state, "GET", "/services", "");
    assert!(!list.contains("\"web"), "services left: {list}");
    let after = threads_settle(pid, threads_after_one);
    assert!(
        after <= threads_after_one,
        "after undeploying every service {after} threads run, with one {threads_after_one}"
    );
    println!(
        "{SERVICES} services: deployed in {:.1} s, all in {:.1} s; threads: {threads_after_one} with one, {with_all} with all, {after} after",
        deployed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
