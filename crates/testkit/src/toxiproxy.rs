//! A real fault injector between a proxy and its backends: Shopify's
//! toxiproxy (`toxiproxy-server`, installed by `scripts/install_toxiproxy.sh`)
//! started on a free loopback port below 32768 and killed when the test
//! ends, and a small client of its REST API over `std::net::TcpStream`.
//!
//! Each [`Proxy`] listens on its own loopback port and forwards to one
//! upstream; toxics added to it act on its connections (latency, bandwidth,
//! slow close, a stall that closes, resets, a cut after so many bytes,
//! slicing), and disabling it closes its connections and stops it
//! listening (a backend that is down).
//!
//! Where to find the server: `$TOXIPROXY_SERVER`, else `toxiproxy-server`
//! on `PATH`, else `~/.local/bin/toxiproxy-server`, else the workspace's
//! `target/tools/toxiproxy-server`. When there is none, [`Toxiproxy::start`]
//! panics with the install command if `CI` is set, and otherwise prints why
//! the test is skipped and returns `None`.

use crate::{free_port, Procs};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The command that installs the server (run from the workspace root).
pub const INSTALL: &str = "scripts/install_toxiproxy.sh";

/// A running toxiproxy server: its REST API's loopback port.
#[derive(Clone, Debug)]
pub struct Toxiproxy {
    api: u16,
}

/// One proxy of a [`Toxiproxy`]: where it listens and its name.
#[derive(Clone, Debug)]
pub struct Proxy {
    api: u16,
    pub name: String,
    /// The loopback port it listens on.
    pub port: u16,
    /// The loopback port of its upstream.
    pub upstream: u16,
}

/// Which way a toxic acts: on what goes to the upstream, or comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Upstream,
    Downstream,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Upstream => "upstream",
            Stream::Downstream => "downstream",
        }
    }
}

/// The toxics of toxiproxy 2.x, with their attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toxic {
    /// Delays data by `latency_ms`, give or take `jitter_ms`.
    Latency { latency_ms: u64, jitter_ms: u64 },
    /// Limits the rate to `rate_kb` KB/s.
    Bandwidth { rate_kb: u64 },
    /// Delays the close of a connection by `delay_ms`.
    SlowClose { delay_ms: u64 },
    /// Stops all data and closes the connection after `timeout_ms`; with
    /// 0, holds the data and the connection forever (a hung peer).
    Timeout { timeout_ms: u64 },
    /// Resets the connection (TCP RST) at once, or after `timeout_ms`.
    ResetPeer { timeout_ms: u64 },
    /// Closes the connection once `bytes` have gone through.
    LimitData { bytes: u64 },
    /// Cuts data into pieces of about `average_size` bytes (give or take
    /// `size_variation`), `delay_us` microseconds apart.
    Slicer {
        average_size: u64,
        size_variation: u64,
        delay_us: u64,
    },
}

impl Toxic {
    /// Toxiproxy's name of the toxic's type.
    pub fn kind(&self) -> &'static str {
        match self {
            Toxic::Latency { .. } => "latency",
            Toxic::Bandwidth { .. } => "bandwidth",
            Toxic::SlowClose { .. } => "slow_close",
            Toxic::Timeout { .. } => "timeout",
            Toxic::ResetPeer { .. } => "reset_peer",
            Toxic::LimitData { .. } => "limit_data",
            Toxic::Slicer { .. } => "slicer",
        }
    }

    fn attributes(&self) -> String {
        let pairs: Vec<(&str, u64)> = match *self {
            Toxic::Latency {
                latency_ms,
                jitter_ms,
            } => vec![("latency", latency_ms), ("jitter", jitter_ms)],
            Toxic::Bandwidth { rate_kb } => vec![("rate", rate_kb)],
            Toxic::SlowClose { delay_ms } => vec![("delay", delay_ms)],
            Toxic::Timeout { timeout_ms } => vec![("timeout", timeout_ms)],
            Toxic::ResetPeer { timeout_ms } => vec![("timeout", timeout_ms)],
            Toxic::LimitData { bytes } => vec![("bytes", bytes)],
            Toxic::Slicer {
                average_size,
                size_variation,
                delay_us,
            } => vec![
                ("average_size", average_size),
                ("size_variation", size_variation),
                ("delay", delay_us),
            ],
        };
        let fields: Vec<String> = pairs.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", fields.join(","))
    }
}

/// The `toxiproxy-server` binary, if there is one (see the module's doc).
pub fn server_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TOXIPROXY_SERVER") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "TOXIPROXY_SERVER={} is not a file; run {INSTALL}",
            p.display()
        );
        return Some(p);
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/bin"));
    let tools = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/tools"));
    on_path
        .into_iter()
        .chain(home)
        .chain(Some(tools))
        .map(|dir| dir.join("toxiproxy-server"))
        .find(|p| p.is_file())
}

impl Toxiproxy {
    /// Starts `toxiproxy-server` on a free loopback port (its child process
    /// joins `procs`) and waits until its API answers. `None`, after saying
    /// so on stderr, when the server is not installed and `CI` is not set;
    /// under CI a missing server is a failure.
    pub fn start(procs: &mut Procs) -> Option<Toxiproxy> {
        let Some(bin) = server_binary() else {
            if std::env::var_os("CI").is_some() {
                panic!("toxiproxy-server is not installed: run {INSTALL}");
            }
            // Straight to stderr, past the test harness's capture, so that
            // the skip shows.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: toxiproxy-server is not installed (looked at $TOXIPROXY_SERVER, \
                 PATH, ~/.local/bin, target/tools); run {INSTALL}"
            );
            return None;
        };
        for _ in 0..20 {
            let api = free_port();
            let mut child = Command::new(&bin)
                .args(["-host", "127.0.0.1", "-port", &api.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("{} would not start: {e}", bin.display()));
            let t = Toxiproxy { api };
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut up = false;
            while Instant::now() < deadline {
                if child.try_wait().ok().flatten().is_some() {
                    break; // it could not bind the port
                }
                if t.request("GET", "/version", "")
                    .is_ok_and(|(s, _)| s == 200)
                {
                    // Answered: make sure by our server, which would have
                    // exited had the port been another's.
                    std::thread::sleep(Duration::from_millis(50));
                    up = child.try_wait().ok().flatten().is_none();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if up {
                procs.0.push(child);
                return Some(t);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("toxiproxy-server would not start");
    }

    /// The port of its REST API.
    pub fn api_port(&self) -> u16 {
        self.api
    }

    /// A new proxy named `name`, on a free loopback port, to the loopback
    /// port `upstream`.
    pub fn proxy(&self, name: &str, upstream: u16) -> Proxy {
        for _ in 0..20 {
            let port = free_port();
            let body = format!(
                "{{\"name\":\"{name}\",\"listen\":\"127.0.0.1:{port}\",\
                 \"upstream\":\"127.0.0.1:{upstream}\",\"enabled\":true}}"
            );
            match http(self.api, "POST", "/proxies", &body, LONG) {
                Ok((201, _)) => {
                    return Proxy {
                        api: self.api,
                        name: name.to_string(),
                        port,
                        upstream,
                    }
                }
                // The port was taken meanwhile: the proxy was not created.
                Ok((500, _)) => continue,
                other => panic!("toxiproxy would not create proxy {name}: {other:?}"),
            }
        }
        panic!("toxiproxy would not create proxy {name}: no port");
    }

    /// Every proxy enabled again and every toxic removed.
    pub fn reset(&self) {
        expect(http(self.api, "POST", "/reset", "", LONG), &[204], "reset");
    }

    /// `METHOD path` with a JSON `body` (empty for none): the status and
    /// the body of the answer. Bounded: 10 s to connect, write and read.
    pub fn request(&self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
        http(self.api, method, path, body, LONG)
    }
}

impl Proxy {
    /// Adds `toxic` under `name` (unique on this proxy), acting on `stream`
    /// with probability `toxicity` (0.0 to 1.0) per connection.
    pub fn add(&self, name: &str, stream: Stream, toxicity: f32, toxic: Toxic) {
        let body = format!(
            "{{\"name\":\"{name}\",\"type\":\"{}\",\"stream\":\"{}\",\"toxicity\":{toxicity},\
             \"attributes\":{}}}",
            toxic.kind(),
            stream.name(),
            toxic.attributes()
        );
        let path = format!("/proxies/{}/toxics", self.name);
        expect(http(self.api, "POST", &path, &body, LONG), &[200], &path);
    }

    /// Removes the toxic called `name`.
    pub fn remove(&self, name: &str) {
        let path = format!("/proxies/{}/toxics/{name}", self.name);
        expect(http(self.api, "DELETE", &path, "", LONG), &[204], &path);
    }

    /// Removes the toxic called `name`, waiting at most `wait` for
    /// toxiproxy's answer: `false` if none came. Toxiproxy can take long
    /// to remove a toxic holding data for a connection whose other end has
    /// closed (it flushes each piece with a 5 s timeout; Shopify/toxiproxy
    /// issues 412 and 558); [`Proxy::recreate`] then heals the proxy.
    pub fn try_remove(&self, name: &str, wait: Duration) -> bool {
        let path = format!("/proxies/{}/toxics/{name}", self.name);
        matches!(http(self.api, "DELETE", &path, "", wait), Ok((204, _)))
    }

    /// Deletes the proxy (its connections close, and its toxics go with
    /// it) and creates it again on the same port, enabled, to loopback
    /// port `upstream`. Deleting a proxy waits for none of its toxics.
    pub fn recreate(&self, upstream: u16) {
        let path = format!("/proxies/{}", self.name);
        match http(self.api, "DELETE", &path, "", LONG) {
            Ok((204, _)) => {}
            // A loaded toxiproxy can take longer to answer than to delete:
            // gone is gone.
            Err(_) => self.wait_gone(&path),
            other => panic!("toxiproxy {path}: {other:?}"),
        }
        let body = format!(
            "{{\"name\":\"{}\",\"listen\":\"127.0.0.1:{}\",\
             \"upstream\":\"127.0.0.1:{upstream}\",\"enabled\":true}}",
            self.name, self.port
        );
        // The port was just let go of: a few tries.
        for _ in 0..50 {
            match http(self.api, "POST", "/proxies", &body, LONG) {
                Ok((201, _)) => return,
                Ok((500, _)) => std::thread::sleep(Duration::from_millis(20)),
                other => panic!(
                    "toxiproxy would not create proxy {} again: {other:?}",
                    self.name
                ),
            }
        }
        panic!("toxiproxy would not listen on port {} again", self.port);
    }

    /// Enables the proxy (it listens again) or disables it (its
    /// connections close and it stops listening: the upstream is down).
    pub fn set_enabled(&self, enabled: bool) {
        let path = format!("/proxies/{}", self.name);
        let body = format!("{{\"enabled\":{enabled}}}");
        expect(http(self.api, "PATCH", &path, &body, LONG), &[200], &path);
    }

    /// Waits (at most 30 s) for the proxy at `path` to be gone.
    fn wait_gone(&self, path: &str) {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if let Ok((404, _)) = http(self.api, "GET", path, "", LONG) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("toxiproxy {path}: still there 30 s after it was deleted");
    }

    /// Points the proxy at another loopback port (its connections close).
    pub fn set_upstream(&self, upstream: u16) {
        let path = format!("/proxies/{}", self.name);
        let body = format!("{{\"upstream\":\"127.0.0.1:{upstream}\"}}");
        expect(http(self.api, "PATCH", &path, &body, LONG), &[200], &path);
    }
}

fn expect(r: std::io::Result<(u16, String)>, ok: &[u16], what: &str) {
    match r {
        Ok((s, _)) if ok.contains(&s) => {}
        other => panic!("toxiproxy {what}: {other:?}"),
    }
}

/// How long an API call may take, but for [`Proxy::try_remove`].
const LONG: Duration = Duration::from_secs(10);

/// One HTTP/1.1 exchange with the API on loopback `port`, on a connection
/// of its own that the server closes after answering, within `wait`.
fn http(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    wait: Duration,
) -> std::io::Result<(u16, String)> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + wait;
    let mut s = TcpStream::connect_timeout(&addr, wait)?;
    s.set_write_timeout(Some(wait))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::other("toxiproxy did not answer in time"));
        }
        s.set_read_timeout(Some(left))?;
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if got.len() > 1 << 20 {
            return Err(std::io::Error::other("toxiproxy's answer did not end"));
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {text:?}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
