//! The HTTP/1.1 of `flick serve`'s control API, both ends: a bounded
//! request reader and a response writer for the server, and a small
//! client for `flick ctl`, over a Unix socket or loopback TCP. One request
//! per connection (`Connection: close`), bodies sized by
//! `Content-Length`, JSON both ways. No input makes the reader panic:
//! what it will not read is an [`HttpError`] with its status.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The most bytes of a request line and headers.
pub const MAX_HEAD: usize = 16 * 1024;
/// The most bytes of a request body (a program's text and its bindings).
pub const MAX_BODY: usize = 1 << 20;
/// The most header lines of a request.
pub const MAX_HEADERS: usize = 32;
/// How long a client has to send its whole request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the API listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl ApiAddr {
    /// `HOST:PORT` is TCP; anything else (a path) a Unix socket.
    pub fn parse(s: &str) -> ApiAddr {
        match s.parse::<SocketAddr>() {
            Ok(a) => ApiAddr::Tcp(a),
            Err(_) => ApiAddr::Unix(PathBuf::from(s.strip_prefix("unix:").unwrap_or(s))),
        }
    }
}

impl std::fmt::Display for ApiAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ApiAddr::Tcp(a) => write!(f, "http://{a}"),
        }
    }
}

/// A request as the server read it.
#[derive(Debug)]
pub struct Request {
    pub method: String,
    /// The path, percent-decoded, without a query.
    pub path: String,
    /// The query after `?`, as sent (see [`Request::query_param`]).
    pub query: String,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `name=VALUE` in the query, percent-decoded (`+` is a
    /// space); the first if it is given more than once.
    pub fn query_param(&self, name: &str) -> Result<Option<String>, HttpError> {
        for pair in self.query.split('&').filter(|p| !p.is_empty()) {
            let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
            if n == name {
                return percent_decode(&v.replace('+', " ")).map(Some);
            }
        }
        Ok(None)
    }
}

/// A request the server will not take, with the status that says why.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HttpError {
    pub status: u16,
    pub message: String,
}

impl HttpError {
    pub fn new(status: u16, message: impl Into<String>) -> HttpError {
        HttpError {
            status,
            message: message.into(),
        }
    }
}

/// Reads one request, within the size, header and time bounds; the
/// stream's read timeout is set as the deadline nears.
pub fn read_request<S: Read>(
    stream: &mut S,
    set_timeout: &dyn Fn(&mut S, Duration) -> std::io::Result<()>,
) -> Result<Request, HttpError> {
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(HttpError::new(431, "request head too large"));
        }
        let n = read_some(stream, set_timeout, deadline, &mut chunk)?;
        if n == 0 {
            return Err(HttpError::new(400, "the request ended early"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    if head_end > MAX_HEAD {
        return Err(HttpError::new(431, "request head too large"));
    }
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| HttpError::new(400, "the request head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HttpError::new(400, "malformed request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::new(400, "only HTTP/1.x is spoken"));
    }
    let mut headers = Vec::new();
    for l in lines {
        if headers.len() >= MAX_HEADERS {
            return Err(HttpError::new(431, "too many header fields"));
        }
        let (n, v) = l
            .split_once(':')
            .ok_or_else(|| HttpError::new(400, "malformed header field"))?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut req = Request {
        method: method.to_string(),
        path: percent_decode(path)?,
        query: query.to_string(),
        headers,
        body: Vec::new(),
    };
    if req.header("transfer-encoding").is_some() {
        return Err(HttpError::new(411, "send the body with Content-Length"));
    }
    let len = match req.header("content-length") {
        None => 0,
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| HttpError::new(400, "malformed Content-Length"))?,
    };
    if len > MAX_BODY {
        return Err(HttpError::new(
            413,
            format!("the request body is {len} bytes; the most taken is {MAX_BODY}"),
        ));
    }
    let mut body = buf.split_off(head_end + 4);
    while body.len() < len {
        let n = read_some(stream, set_timeout, deadline, &mut chunk)?;
        if n == 0 {
            return Err(HttpError::new(400, "the request body ended early"));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(len);
    req.body = body;
    Ok(req)
}

fn read_some<S: Read>(
    stream: &mut S,
    set_timeout: &dyn Fn(&mut S, Duration) -> std::io::Result<()>,
    deadline: Instant,
    chunk: &mut [u8],
) -> Result<usize, HttpError> {
    let left = deadline.saturating_duration_since(Instant::now());
    let timeout = || HttpError::new(408, "the request took too long");
    if left.is_zero() || set_timeout(stream, left).is_err() {
        return Err(timeout());
    }
    match stream.read(chunk) {
        Ok(n) => Ok(n),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(timeout())
        }
        Err(e) => Err(HttpError::new(400, format!("cannot read the request: {e}"))),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `%XX` escapes decoded (names and dictionary keys may need them).
pub fn percent_decode(s: &str) -> Result<String, HttpError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| HttpError::new(400, "malformed percent escape in the path"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| HttpError::new(400, "the path is not UTF-8"))
}

/// Escapes what a path segment cannot hold as is.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Bytes as standard base64 (RFC 4648, padded): how the API shows a
/// dictionary entry's message, whose bytes need not be text.
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64, padded or not; `None` where it is not base64.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        let v = BASE64.iter().position(|&x| x == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    // Leftover bits must be the zero padding of the last byte.
    (bits < 6 && acc == 0).then_some(out)
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        431 => "Request Header Fields Too Large",
        507 => "Insufficient Storage",
        _ => "Internal Server Error",
    }
}

/// Writes a JSON response and asks the client to close.
pub fn write_response(
    stream: &mut impl Write,
    status: u16,
    body: &serde_json::Value,
) -> std::io::Result<()> {
    let text = body.to_string();
    write!(
        stream,
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        reason(status),
        text.len() + 1,
    )?;
    stream.write_all(b"\n")?;
    stream.flush()
}

/// Writes a 200 answer of `content_type` with `body` (the Prometheus
/// exposition of `GET /metrics`), then closes.
pub fn write_text(stream: &mut impl Write, content_type: &str, body: &str) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len(),
    )?;
    stream.flush()
}

/// What the client could not do.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the API at {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("the API at {0} failed mid-request: {1}")]
    Io(String, std::io::Error),
    #[error("the API at {0} answered something that is not HTTP/1.1 with JSON: {1}")]
    Malformed(String, String),
}

/// The client's side of one exchange: the status and the JSON answer.
pub fn call(
    addr: &ApiAddr,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    timeout: Duration,
) -> Result<(u16, serde_json::Value), ClientError> {
    let name = addr.to_string();
    let io = |e| ClientError::Io(name.clone(), e);
    let mut stream: Box<dyn ReadWrite> = match addr {
        ApiAddr::Unix(p) => {
            let s = std::os::unix::net::UnixStream::connect(p)
                .map_err(|e| ClientError::Connect(name.clone(), e))?;
            s.set_read_timeout(Some(timeout)).map_err(io)?;
            Box::new(s)
        }
        ApiAddr::Tcp(a) => {
            let s = std::net::TcpStream::connect_timeout(a, timeout)
                .map_err(|e| ClientError::Connect(name.clone(), e))?;
            s.set_read_timeout(Some(timeout)).map_err(io)?;
            Box::new(s)
        }
    };
    let text = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: flick\r\nConnection: close\r\nContent-Length: {}\r\n",
        text.len()
    );
    if body.is_some() {
        head.push_str("Content-Type: application/json\r\n");
    }
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).map_err(io)?;
    stream.write_all(text.as_bytes()).map_err(io)?;
    stream.flush().map_err(io)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(io)?;
    let bad = |why: &str| ClientError::Malformed(name.clone(), why.to_string());
    let end = find(&answer, b"\r\n\r\n").ok_or_else(|| bad("no end of head"))?;
    let head = String::from_utf8_lossy(&answer[..end]);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad("no status"))?;
    let json = serde_json::from_slice(&answer[end + 4..]).map_err(|e| bad(&e.to_string()))?;
    Ok((status, json))
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8]) -> Result<Request, HttpError> {
        let mut c = std::io::Cursor::new(bytes.to_vec());
        read_request(&mut c, &|_, _| Ok(()))
    }

    #[test]
    fn a_request_is_read_with_its_body() {
        let r = read(b"POST /services/a%2Fb HTTP/1.1\r\nContent-Length: 2\r\nX-A: b\r\n\r\n{}")
            .unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/services/a/b");
        assert_eq!(r.header("x-a"), Some("b"));
        assert_eq!(r.body, b"{}");
    }

    #[test]
    fn bounds_are_refused_with_their_status() {
        let big = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert_eq!(read(big.as_bytes()).unwrap_err().status, 413);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("H{i}: x\r\n")).collect();
        let req = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(read(req.as_bytes()).unwrap_err().status, 431);
        assert_eq!(read(&vec![b'a'; MAX_HEAD + 10]).unwrap_err().status, 431);
        assert_eq!(read(b"GET /\r\n\r\n").unwrap_err().status, 400);
        assert_eq!(
            read(b"GET / HTTP/1.1\r\nbad\r\n\r\n").unwrap_err().status,
            400
        );
    }

    #[test]
    fn addresses_are_tcp_or_unix() {
        assert_eq!(
            ApiAddr::parse("127.0.0.1:7000"),
            ApiAddr::Tcp("127.0.0.1:7000".parse().unwrap())
        );
        assert_eq!(
            ApiAddr::parse("x/flick.sock"),
            ApiAddr::Unix("x/flick.sock".into())
        );
        assert_eq!(percent_decode(&percent_encode("a b/c")).unwrap(), "a b/c");
    }

    #[test]
    fn base64_round_trips_and_refuses_what_is_not_base64() {
        for bytes in [
            &b""[..],
            b"f",
            b"fo",
            b"foo",
            b"foob",
            b"fooba",
            b"foobar",
            &[0, 255, 128],
        ] {
            assert_eq!(base64_decode(&base64_encode(bytes)).unwrap(), bytes);
        }
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_decode("Zm8").unwrap(), b"fo");
        assert_eq!(base64_decode("Zm9v!"), None);
        assert_eq!(base64_decode("Zm9="), None, "non-zero padding bits");
    }

    #[test]
    fn a_query_is_kept_apart_from_the_path() {
        let r = read(b"GET /services/a/state/d?limit=5&cursor=1%32 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!(r.path, "/services/a/state/d");
        assert_eq!(r.query_param("limit").unwrap().as_deref(), Some("5"));
        assert_eq!(r.query_param("cursor").unwrap().as_deref(), Some("12"));
        assert_eq!(r.query_param("x").unwrap(), None);
    }
}
