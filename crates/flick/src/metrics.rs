//! `flick run --metrics ADDR`: the service's counters, gauges and latency
//! histograms, encoded by the Prometheus project's client library
//! (`prometheus-client`) and served at `GET /metrics` by a small HTTP/1.1
//! server on its own threads (the library has none). A scraper that asks
//! for OpenMetrics (`Accept: application/openmetrics-text`, as Prometheus
//! does) gets it; anything else gets the text format 0.0.4.
//!
//! The service's atomics are read at each scrape by a [`Collector`], so
//! nothing on the request path touches the library.
//!
//! The server answers one request per connection and closes it. Requests
//! are bounded in size ([`MAX_REQUEST`]) and in time ([`REQUEST_TIMEOUT`]),
//! at most [`MAX_CLIENTS`] are served at once, and no input makes it panic:
//! anything that is not `GET /metrics` (or `HEAD`) gets a 4xx answer.

use flick_platform::{HistogramSnapshot, LATENCY_BOUNDS_US};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
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

/// The exposition formats served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format, version 0.0.4.
    Text,
    /// OpenMetrics 1.0 text (counters typed without `_total`, `# EOF`).
    OpenMetrics,
}

impl Format {
    /// OpenMetrics if the `Accept` value names it, else the text format.
    pub fn for_accept(accept: Option<&str>) -> Format {
        match accept.is_some_and(|a| {
            a.to_ascii_lowercase()
                .contains("application/openmetrics-text")
        }) {
            true => Format::OpenMetrics,
            false => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// A backend's health and latency at one moment.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BackendSample {
    pub channel: String,
    pub address: String,
    pub up: bool,
    pub consecutive_failures: u64,
    pub connect_failures: u64,
    pub latency: HistogramSnapshot,
}

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
    pub late_replies: u64,
    pub backend_busy: u64,
    pub client_timeouts: u64,
    pub jobs_failed: u64,
    pub clients_closed: u64,
    /// Per worker.
    pub queue_lengths: Vec<usize>,
    pub tasks_live: usize,
    pub pooled_messages: usize,
    /// Per listening channel: its requests' latency.
    pub requests: Vec<(String, HistogramSnapshot)>,
    pub backends: Vec<BackendSample>,
    pub access_log_dropped: u64,
}

impl Sample {
    /// Reads a running service's counters.
    pub fn of(service: &flick_platform::Service) -> Sample {
        let s = service.stats();
        let get = |a: &flick_platform::Counter| a.load(Ordering::Relaxed);
        let name = |chan: u16| {
            s.channels
                .get(chan as usize)
                .map_or_else(String::new, |c| c.name.clone())
        };
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
            late_replies: get(&s.late_replies),
            backend_busy: get(&s.backend_busy),
            client_timeouts: get(&s.client_timeouts),
            jobs_failed: get(&s.jobs_failed),
            clients_closed: get(&s.clients_closed),
            queue_lengths: service.queue_lengths(),
            tasks_live: service.live_tasks(),
            pooled_messages: service.pooled_messages(),
            requests: s
                .listening
                .and_then(|c| s.channels.get(c))
                .map(|c| (c.name.clone(), c.latency.snapshot()))
                .into_iter()
                .collect(),
            backends: s
                .backends
                .iter()
                .map(|b| BackendSample {
                    channel: name(b.chan),
                    address: b.addr.to_string(),
                    up: b.up.load(Ordering::Relaxed),
                    consecutive_failures: get(&b.consecutive_failures),
                    connect_failures: get(&b.connect_failures),
                    latency: b.latency.snapshot(),
                })
                .collect(),
            access_log_dropped: s.access_log.as_ref().map_or(0, |l| l.dropped()),
        }
    }

    /// The sample in `format`, through a registry of its own.
    pub fn render(&self, format: Format) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.clone()));
        encode(&registry, format)
    }
}

/// The registry a running service's metrics are read from, at each scrape.
pub fn registry(service: Arc<flick_platform::Service>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ServiceCollector(service)));
    registry
}

/// A collector that reads `service` at each scrape, for a registry of
/// many services (`flick serve`'s `/metrics`).
pub fn collector(service: Arc<flick_platform::Service>) -> Box<dyn Collector> {
    Box::new(ServiceCollector(service))
}

/// `registry` in `format`.
pub fn encode(registry: &Registry, format: Format) -> String {
    let mut out = String::with_capacity(8192);
    // Writing to a String cannot fail, nor can our collectors.
    let _ = match format {
        Format::Text => prometheus_client::encoding::prometheus_text::encode(&mut out, registry),
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, registry),
    };
    out
}

/// What `/metrics` serves for a running service.
pub fn render_service(service: Arc<flick_platform::Service>) -> Render {
    let registry = registry(service);
    Arc::new(move |format| encode(&registry, format))
}

/// Reads the service at each scrape.
struct ServiceCollector(Arc<flick_platform::Service>);

impl std::fmt::Debug for ServiceCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceCollector")
    }
}

impl Collector for ServiceCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Encoded {
        Sample::of(&self.0).encode(encoder)
    }
}

type Encoded = std::result::Result<(), std::fmt::Error>;

/// A family of counters (`name` without `_total`: the encoder adds it).
fn counters<L: EncodeLabelSet>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, u64)>,
) -> Encoded {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Encoded {
    let m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    ConstCounter::new(v).encode(m)
}

fn gauges<L: EncodeLabelSet>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, u64)>,
) -> Encoded {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Encoded {
    let m = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(v).encode(m)
}

fn histograms<'a, L: EncodeLabelSet + 'a>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, &'a HistogramSnapshot)>,
) -> Encoded {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, h) in series {
        let mut buckets = [(f64::INFINITY, 0); flick_platform::BUCKETS];
        for (i, b) in buckets.iter_mut().enumerate() {
            let le = LATENCY_BOUNDS_US
                .get(i)
                .map_or(f64::INFINITY, |us| *us as f64 / 1e6);
            *b = (le, h.counts[i]);
        }
        m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
            h.sum,
            h.count(),
            &buckets,
            None,
        )?;
    }
    Ok(())
}

impl Collector for Sample {
    fn encode(&self, mut e: DescriptorEncoder) -> Encoded {
        let e = &mut e;
        counter(
            e,
            "flick_connections_accepted",
            "Client connections accepted.",
            self.connections_accepted,
        )?;
        gauge(
            e,
            "flick_connections_open",
            "Connections open now, to clients and to backends.",
            self.connections_open,
        )?;
        gauge(
            e,
            "flick_instances_live",
            "Instances (task graphs, one per client connection) alive now.",
            self.instances_live,
        )?;
        let per_channel = |f: fn(&(String, u64, u64)) -> u64| {
            self.channels
                .iter()
                .map(move |c| ([("channel", c.0.as_str())], f(c)))
        };
        counters(
            e,
            "flick_messages_in",
            "Messages read and parsed, per channel of the process.",
            per_channel(|c| c.1),
        )?;
        counters(
            e,
            "flick_messages_out",
            "Messages written, per channel of the process.",
            per_channel(|c| c.2),
        )?;
        counter(
            e,
            "flick_malformed_messages",
            "Messages that did not parse: answered with the grammar's reject reply, or their connection closed.",
            self.malformed,
        )?;
        counter(
            e,
            "flick_backend_connect_errors",
            "Failed connections to backends.",
            self.backend_connect_errors,
        )?;
        counter(
            e,
            "flick_compute_faults",
            "Rules stopped by a run-time fault of the program (each logged with its position).",
            self.compute_faults,
        )?;
        counter(
            e,
            "flick_jobs_failed",
            "Jobs whose merged streams were truncated, out of order or had a wrong checksum: their output was aborted.",
            self.jobs_failed,
        )?;
        counter(
            e,
            "flick_clients_closed",
            "Client connections closed because a reply could not be given whole (cut short by its backend, no error reply to write).",
            self.clients_closed,
        )?;
        counter(
            e,
            "flick_fault_replies",
            "Requests answered with the grammar's fault reply: a backend down, too slow or broken, or a compute fault.",
            self.fault_replies,
        )?;
        counter(
            e,
            "flick_late_replies",
            "Backend replies dropped because no waiting request owned them: late (their request had its fault reply already) or unsolicited.",
            self.late_replies,
        )?;
        counter(
            e,
            "flick_backend_busy",
            "Requests that waited for a backend connection, every one the worker may have (--backend-max-connections) being busy, and got none in time: they got the fault reply.",
            self.backend_busy,
        )?;
        counter(
            e,
            "flick_client_timeouts",
            "Client requests begun but not complete within --client-request-timeout-ms: they got the timeout reply (HTTP 408), or their connection closed.",
            self.client_timeouts,
        )?;
        let workers: Vec<String> = (0..self.queue_lengths.len())
            .map(|i| i.to_string())
            .collect();
        gauges(
            e,
            "flick_scheduler_queue_length",
            "Tasks waiting in each worker's run queue.",
            self.queue_lengths
                .iter()
                .zip(&workers)
                .map(|(n, w)| ([("worker", w.as_str())], *n as u64)),
        )?;
        gauge(
            e,
            "flick_tasks_live",
            "Tasks alive in the scheduler.",
            self.tasks_live as u64,
        )?;
        gauge(
            e,
            "flick_pooled_messages",
            "Message buffers available in the shared pool.",
            self.pooled_messages as u64,
        )?;
        histograms(
            e,
            "flick_request_duration_seconds",
            "Client requests, from their arrival to their last reply passed on to the client's writer, per listening channel.",
            self.requests
                .iter()
                .map(|(c, h)| ([("channel", c.as_str())], h)),
        )?;
        let backend = |b: &'_ BackendSample| {
            [
                ("channel", b.channel.clone()),
                ("backend", b.address.clone()),
            ]
        };
        histograms(
            e,
            "flick_backend_response_duration_seconds",
            "Requests to a backend, from being written to it to their last reply matched.",
            self.backends.iter().map(|b| (backend(b), &b.latency)),
        )?;
        gauges(
            e,
            "flick_backend_up",
            "1 if the last connection made to the backend succeeded and none has failed since; 0 if it refused, timed out or broke with requests owed (or none was made yet).",
            self.backends.iter().map(|b| (backend(b), u64::from(b.up))),
        )?;
        gauges(
            e,
            "flick_backend_consecutive_connect_failures",
            "Failed connection attempts to the backend since the last one that succeeded.",
            self.backends
                .iter()
                .map(|b| (backend(b), b.consecutive_failures)),
        )?;
        counters(
            e,
            "flick_backend_connect_failures",
            "Failed connection attempts, per backend.",
            self.backends
                .iter()
                .map(|b| (backend(b), b.connect_failures)),
        )?;
        counter(
            e,
            "flick_access_log_dropped",
            "Access log lines dropped because a worker's buffer was full (the disk too slow).",
            self.access_log_dropped,
        )
    }
}

/// What the server answers to one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// 200 with the metrics in `format`; `body` is `false` for `HEAD`.
    Metrics {
        body: bool,
        format: Format,
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
    let format = negotiate(&head[line_end.min(head.len())..]);
    match (method, path) {
        ("GET", "/metrics") => Route::Metrics { body: true, format },
        ("HEAD", "/metrics") => Route::Metrics {
            body: false,
            format,
        },
        ("GET" | "HEAD", _) => Route::NotFound,
        _ => Route::MethodNotAllowed,
    }
}

/// OpenMetrics if an `Accept` header among `headers` names it, else the
/// text format.
fn negotiate(headers: &[u8]) -> Format {
    let accept = headers.split(|&b| b == b'\n').find_map(|line| {
        let line = String::from_utf8_lossy(line).to_ascii_lowercase();
        line.strip_prefix("accept:").map(str::to_string)
    });
    Format::for_accept(accept.as_deref())
}

/// Produces the body of `/metrics`, in a format, at each request.
pub type Render = Arc<dyn Fn(Format) -> String + Send + Sync>;

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
fn serve(mut stream: TcpStream, render: &(dyn Fn(Format) -> String + Send + Sync)) {
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
        Route::Metrics { body, format } => {
            let text = render(format);
            let mut head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {}\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                format.content_type(),
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
        let get = |format| Route::Metrics { body: true, format };
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            get(Format::Text)
        );
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            get(Format::Text)
        );
        assert_eq!(
            route(
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nACCEPT: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n"
            ),
            get(Format::OpenMetrics)
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.1\r\n\r\n"),
            Route::Metrics {
                body: false,
                format: Format::Text
            }
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

    fn sample() -> Sample {
        let mut latency = HistogramSnapshot::default();
        latency.counts[0] = 2;
        latency.counts[4] = 1;
        latency.sum = 0.0012;
        Sample {
            connections_accepted: 3,
            channels: vec![("client".into(), 5, 6), ("a\"b".into(), 0, 1)],
            queue_lengths: vec![0, 2],
            requests: vec![("client".into(), latency.clone())],
            backends: vec![BackendSample {
                channel: "backends".into(),
                address: "127.0.0.1:11211".into(),
                up: true,
                latency,
                ..BackendSample::default()
            }],
            ..Sample::default()
        }
    }

    #[test]
    fn text_format() {
        let text = sample().render(Format::Text);
        assert!(
            text.contains(
                "# HELP flick_connections_accepted_total Client connections accepted.\n\
                 # TYPE flick_connections_accepted_total counter\n\
                 flick_connections_accepted_total 3\n"
            ),
            "{text}"
        );
        assert!(text.contains("flick_messages_in_total{channel=\"client\"} 5\n"));
        assert!(text.contains("flick_messages_out_total{channel=\"a\\\"b\"} 1\n"));
        assert!(text.contains("flick_scheduler_queue_length{worker=\"1\"} 2\n"));
        assert!(text.contains("# TYPE flick_request_duration_seconds histogram\n"));
        assert!(
            text.contains(
                "flick_request_duration_seconds_bucket{channel=\"client\",le=\"5e-05\"} 2\n"
            ),
            "{text}"
        );
        assert!(text
            .contains("flick_request_duration_seconds_bucket{channel=\"client\",le=\"+Inf\"} 3\n"));
        assert!(text.contains("flick_request_duration_seconds_count{channel=\"client\"} 3\n"));
        assert!(
            text.contains("flick_backend_up{channel=\"backends\",backend=\"127.0.0.1:11211\"} 1\n")
        );
        assert!(text.contains("flick_access_log_dropped_total 0\n"));
        assert!(text.ends_with('\n') && !text.contains("# EOF"));
        // Every family has HELP and TYPE before its samples.
        let mut typed = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.insert(rest.split(' ').next().unwrap().to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
                    .unwrap_or(name);
                assert!(typed.contains(family), "{line}");
            }
        }
    }

    #[test]
    fn openmetrics_format() {
        let text = sample().render(Format::OpenMetrics);
        assert!(text.contains("# TYPE flick_connections_accepted counter\n"));
        assert!(text.contains("flick_connections_accepted_total 3\n"));
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn the_server_answers_and_survives_bad_requests() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let render: Render = Arc::new(|f| match f {
            Format::Text => "flick_x 1\n".to_string(),
            Format::OpenMetrics => "flick_x 1\n# EOF\n".to_string(),
        });
        let server = MetricsServer::start(l, render).unwrap();
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
        assert!(
            ok.contains("Content-Type: text/plain; version=0.0.4"),
            "{ok}"
        );
        assert!(ok.ends_with("\r\n\r\nflick_x 1\n"), "{ok}");
        let om = ask(b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n");
        assert!(
            om.contains("Content-Type: application/openmetrics-text"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"), "{om}");
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
