//! `flick run --metrics ADDR`: the service's counters in the Prometheus
//! text exposition format (version 0.0.4), served at `GET /metrics` by a
//! small HTTP/1.1 server on its own threads.
//!
//! The server answers one request per connection and closes it. Requests
//! are bounded in size ([`MAX_REQUEST`]) and in time ([`REQUEST_TIMEOUT`]),
//! at most [`MAX_CLIENTS`] are served at once, and no input makes it panic:
//! anything that is not `GET /metrics` (or `HEAD`) gets a 4xx answer.

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most bytes of a request (line and headers) the server reads.
pub const MAX_REQUEST: usize = 8192;
/// How long a client has to send its request and read the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more are closed unanswered.
pub const MAX_CLIENTS: usize = 8;

/// The counters and gauges of a service at one moment.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sample {
    pub connections_accepted: u64,
    pub connections_open: u64,
    pub instances_live: u64,
    /// (channel, messages in, messages out)
    pub channels: Vec<(String, u64, u64)>,
    pub malformed: u64,
    pub backend_connect_errors: u64,
    pub compute_faults: u64,
    pub fault_replies: u64,
    pub jobs_failed: u64,
    pub clients_closed: u64,
    /// Per worker.
    pub queue_lengths: Vec<usize>,
    pub tasks_live: usize,
    pub pooled_messages: usize,
}

impl Sample {
    /// Reads a running service's counters.
    pub fn of(service: &flick_platform::Service) -> Sample {
        let s = service.stats();
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Sample {
            connections_accepted: get(&s.connections_accepted),
            connections_open: get(&s.connections_open),
            instances_live: get(&s.graphs_live),
            channels: s
                .channels
                .iter()
                .map(|c| (c.name.clone(), get(&c.messages_in), get(&c.messages_out)))
                .collect(),
            malformed: get(&s.malformed),
            backend_connect_errors: get(&s.backend_connect_errors),
            compute_faults: get(&s.compute_faults),
            fault_replies: get(&s.fault_replies),
            jobs_failed: get(&s.jobs_failed),
            clients_closed: get(&s.clients_closed),
            queue_lengths: service.queue_lengths(),
            tasks_live: service.live_tasks(),
            pooled_messages: service.pooled_messages(),
        }
    }

    /// The sample in the Prometheus text format: per metric a `# HELP` and a
    /// `# TYPE` line, then its samples.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(2048);
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let one = |v: u64| [(String::new(), v)];
        family(
            "flick_connections_accepted_total",
            "counter",
            "Client connections accepted.",
            &one(self.connections_accepted),
        );
        family(
            "flick_connections_open",
            "gauge",
            "Connections open now, to clients and to backends.",
            &one(self.connections_open),
        );
        family(
            "flick_instances_live",
            "gauge",
            "Instances (task graphs, one per client connection) alive now.",
            &one(self.instances_live),
        );
        let per_channel = |f: fn(&(String, u64, u64)) -> u64| -> Vec<(String, u64)> {
            self.channels
                .iter()
                .map(|c| (format!("{{channel=\"{}\"}}", escape(&c.0)), f(c)))
                .collect()
        };
        family(
            "flick_messages_in_total",
            "counter",
            "Messages read and parsed, per channel of the process.",
            &per_channel(|c| c.1),
        );
        family(
            "flick_messages_out_total",
            "counter",
            "Messages written, per channel of the process.",
            &per_channel(|c| c.2),
        );
        family(
            "flick_malformed_messages_total",
            "counter",
            "Messages that did not parse: answered with the grammar's reject reply, or their connection closed.",
            &one(self.malformed),
        );
        family(
            "flick_backend_connect_errors_total",
            "counter",
            "Failed connections to backends.",
            &one(self.backend_connect_errors),
        );
        family(
            "flick_compute_faults_total",
            "counter",
            "Rules stopped by a run-time fault of the program (each logged with its position).",
            &one(self.compute_faults),
        );
        family(
            "flick_jobs_failed_total",
            "counter",
            "Jobs whose merged streams were truncated, out of order or had a wrong checksum: their output was aborted.",
            &one(self.jobs_failed),
        );
        family(
            "flick_clients_closed_total",
            "counter",
            "Client connections closed because a reply could not be given whole (cut short by its backend, no error reply to write).",
            &one(self.clients_closed),
        );
        family(
            "flick_fault_replies_total",
            "counter",
            "Requests answered with the grammar's fault reply: a backend down, too slow or broken, or a compute fault.",
            &one(self.fault_replies),
        );
        let queues: Vec<(String, u64)> = self
            .queue_lengths
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("{{worker=\"{i}\"}}"), *n as u64))
            .collect();
        family(
            "flick_scheduler_queue_length",
            "gauge",
            "Tasks waiting in each worker's run queue.",
            &queues,
        );
        family(
            "flick_tasks_live",
            "gauge",
            "Tasks alive in the scheduler.",
            &one(self.tasks_live as u64),
        );
        family(
            "flick_pooled_messages",
            "gauge",
            "Message buffers available in the shared pool.",
            &one(self.pooled_messages as u64),
        );
        out
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// What the server answers to one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// 200 with the metrics; `false` for `HEAD` (no body).
    Metrics {
        body: bool,
    },
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

/// Routes a request head (the bytes up to its blank line). Anything but a
/// well-formed `GET`/`HEAD` request line is a bad request.
pub fn route(head: &[u8]) -> Route {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return Route::BadRequest;
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Route::BadRequest;
    }
    let path = target.split(['?', '#']).next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics { body: true },
        ("HEAD", "/metrics") => Route::Metrics { body: false },
        ("GET" | "HEAD", _) => Route::NotFound,
        _ => Route::MethodNotAllowed,
    }
}

/// Produces the body of `/metrics` at each request.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A running metrics endpoint; [`MetricsServer::stop`] ends it.
pub struct MetricsServer {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves `render`'s text at `/metrics` on `listener`.
    pub fn start(listener: TcpListener, render: Render) -> std::io::Result<MetricsServer> {
        let local = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("flick-metrics".into())
            .spawn(move || accept_loop(listener, render, flag))?;
        Ok(MetricsServer {
            local,
            stop,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stops accepting and waits for the accepting thread; requests being
    /// served finish on their own (bounded by [`REQUEST_TIMEOUT`]).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.local;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

fn accept_loop(listener: TcpListener, render: Render, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(_) => {
                // Out of descriptors, or a connection reset before accept:
                // wait a little rather than spin.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
            active.fetch_sub(1, Ordering::AcqRel);
            continue; // dropped: closed unanswered
        }
        let (render, done) = (render.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("flick-metrics-client".into())
            .spawn(move || {
                serve(stream, &*render);
                done.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Reads one request head (bounded in size and time) and answers it.
fn serve(mut stream: TcpStream, render: &(dyn Fn() -> String + Send + Sync)) {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let _ = stream.set_write_timeout(Some(REQUEST_TIMEOUT));
    let mut buf = vec![0u8; MAX_REQUEST];
    let mut len = 0;
    let head_end = loop {
        if let Some(end) = find_head_end(&buf[..len]) {
            break end;
        }
        if len == buf.len() {
            respond(stream, "431 Request Header Fields Too Large", "");
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            respond(stream, "408 Request Timeout", "");
            return;
        }
        match stream.read(&mut buf[len..]) {
            Ok(0) => {
                if len > 0 {
                    respond(stream, "400 Bad Request", "");
                }
                return;
            }
            Ok(n) => len += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                respond(stream, "408 Request Timeout", "");
                return;
            }
            Err(_) => return,
        }
    };
    match route(&buf[..head_end]) {
        Route::Metrics { body } => {
            let text = render();
            let mut head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                text.len()
            );
            if body {
                head.push_str(&text);
            }
            let _ = stream.write_all(head.as_bytes());
            finish(stream);
        }
        Route::NotFound => respond(stream, "404 Not Found", "not found; try /metrics\n"),
        Route::MethodNotAllowed => respond(stream, "405 Method Not Allowed", ""),
        Route::BadRequest => respond(stream, "400 Bad Request", ""),
    }
}

/// The end of the request head (after its blank line), if it is in `b`.
fn find_head_end(b: &[u8]) -> Option<usize> {
    (0..b.len()).find_map(|i| {
        if b[i..].starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else if b[i..].starts_with(b"\n\n") {
            Some(i + 2)
        } else {
            None
        }
    })
}

fn respond(mut stream: TcpStream, status: &str, body: &str) {
    let mut text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        text.push_str("Allow: GET, HEAD\r\n");
    }
    text.push_str("\r\n");
    text.push_str(body);
    let _ = stream.write_all(text.as_bytes());
    finish(stream);
}

/// Closes after the answer: ends our side, then reads (bounded) what the
/// client still sends, so that closing does not reset the connection and
/// lose the answer before the client has read it.
fn finish(mut stream: TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 1024];
    for _ in 0..64 {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics { body: true }
        );
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Route::Metrics { body: true }
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics { body: false }
        );
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        for bad in [
            &b""[..],
            b"\r\n\r\n",
            b"GET /metrics\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics SMTP\r\n\r\n",
            b"\xff\xfe /metrics HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(route(bad), Route::BadRequest, "{bad:?}");
        }
    }

    #[test]
    fn exposition_format() {
        let s = Sample {
            connections_accepted: 3,
            channels: vec![("client".into(), 5, 6), ("a\"b".into(), 0, 1)],
            queue_lengths: vec![0, 2],
            ..Sample::default()
        };
        let text = s.render();
        assert!(text.contains(
            "# HELP flick_connections_accepted_total Client connections accepted.\n\
             # TYPE flick_connections_accepted_total counter\n\
             flick_connections_accepted_total 3\n"
        ));
        assert!(text.contains("flick_messages_in_total{channel=\"client\"} 5\n"));
        assert!(text.contains("flick_messages_out_total{channel=\"a\\\"b\"} 1\n"));
        assert!(text.contains("flick_scheduler_queue_length{worker=\"1\"} 2\n"));
        assert!(text.ends_with('\n'));
        // Every family has HELP and TYPE before its samples.
        let mut typed = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.insert(rest.split(' ').next().unwrap().to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert!(typed.contains(name), "{line}");
            }
        }
    }

    #[test]
    fn the_server_answers_and_survives_bad_requests() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = MetricsServer::start(l, Arc::new(|| "flick_x 1\n".to_string())).unwrap();
        let ask = |req: &[u8]| -> String {
            let mut s = TcpStream::connect(server.local_addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let _ = s.write_all(req);
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        };
        let ok = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nflick_x 1\n"), "{ok}");
        assert!(ask(b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(ask(b"DELETE /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(ask(b"\0\0\0\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(ask(&[b'a'; MAX_REQUEST + 10]).starts_with("HTTP/1.1 431"));
        let head = ask(b"HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(head.ends_with("\r\n\r\n"), "{head}");
        assert!(ask(b"GET /metrics HTTP/1.1\r\n\r\n").contains("flick_x 1"));
        server.stop();
    }
}
