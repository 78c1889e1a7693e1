//! A Memcached VALUE read together with its END travels from the shared
//! connection's reader to the client as one message (`Msg::end_at`), and
//! one whose END comes in a later read still goes as two; either way the
//! client gets the reply memcached wrote, and a get of several keys gets
//! its values under one END.

mod support;

use flick_platform::{Service, ServiceConfig};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::{memcached, serve, Procs};

/// Messages the instance read from its backends.
fn backend_messages(service: &Service) -> u64 {
    service
        .stats()
        .channels
        .iter()
        .find(|c| c.name == "backends")
        .expect("a backends channel")
        .messages_in
        .load(Ordering::Relaxed)
}

/// Reads until `want` bytes came (or the reply grows past them).
fn read_reply(c: &mut TcpStream, want: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < want && Instant::now() < deadline {
        let n = c.read(&mut buf).expect("a reply");
        assert!(
            n > 0,
            "the proxy closed after {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    got
}

fn client(service: &Service) -> TcpStream {
    let c = TcpStream::connect(service.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c
}

#[test]
fn a_value_read_with_its_end_goes_on_as_one_message() {
    let mut procs = Procs(Vec::new());
    let port = memcached(&mut procs);
    let service = serve(
        "memcached_ascii_proxy.flick",
        &[port],
        ServiceConfig::default(),
    );
    let mut c = client(&service);
    c.write_all(b"set k 7 0 5\r\nhello\r\n").unwrap();
    assert_eq!(read_reply(&mut c, 8), b"STORED\r\n");
    let before = backend_messages(&service);
    let want = b"VALUE k 7 5\r\nhello\r\nEND\r\n";
    let gets = 200;
    for _ in 0..gets {
        c.write_all(b"get k\r\n").unwrap();
        assert_eq!(read_reply(&mut c, want.len()), want);
    }
    // memcached writes a hit's VALUE and END together: each reply is read
    // whole, and goes on as one message (two before).
    let messages = backend_messages(&service) - before;
    assert!(
        messages <= gets + gets / 10,
        "{messages} messages from the backend for {gets} gets"
    );
    // A miss is an END alone.
    c.write_all(b"get nothing\r\n").unwrap();
    assert_eq!(read_reply(&mut c, 5), b"END\r\n");
}

#[test]
fn a_get_of_keys_on_several_servers_gets_their_values_under_one_end() {
    let mut procs = Procs(Vec::new());
    let ports = [memcached(&mut procs), memcached(&mut procs)];
    let service = serve(
        "memcached_ascii_proxy.flick",
        &ports,
        ServiceConfig::default(),
    );
    let mut c = client(&service);
    let keys: Vec<String> = (0..16).map(|i| format!("key{i}")).collect();
    let mut want = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let v = format!("value{i}");
        c.write_all(format!("set {k} {i} 0 {}\r\n{v}\r\n", v.len()).as_bytes())
            .unwrap();
        assert_eq!(read_reply(&mut c, 8), b"STORED\r\n");
        want.extend_from_slice(format!("VALUE {k} {i} {}\r\n{v}\r\n", v.len()).as_bytes());
    }
    want.extend_from_slice(b"END\r\n");
    // Sixteen keys hash to both servers: the get is split by server, each
    // part's VALUE comes with its END, and only the last part's END is
    // the client's.
    for _ in 0..20 {
        c.write_all(format!("get {}\r\n", keys.join(" ")).as_bytes())
            .unwrap();
        let got = read_reply(&mut c, want.len());
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
    }
    // Nothing more: no END of a part was passed on.
    c.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(c.read(&mut buf).is_err(), "more bytes after the reply");
}

/// A memcached stand-in that answers each get with `first` and then,
/// 50 ms later and in a write of its own, `later` (if any): what a server
/// does whose reply is cut between two reads.
fn stand_in(
    first: &'static [u8],
    later: Option<&'static [u8]>,
) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 1024];
        loop {
            let Ok(n) = s.read(&mut chunk) else { return };
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            while let Some(at) = buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = buf.drain(..at + 2).collect();
                if line.starts_with(b"get ") {
                    if s.write_all(first).is_err() {
                        return;
                    }
                    if let Some(later) = later {
                        std::thread::sleep(Duration::from_millis(50));
                        if s.write_all(later).is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    (port, t)
}

#[test]
fn a_value_whose_end_comes_later_goes_on_before_it() {
    let (port, _backend) = stand_in(b"VALUE k 0 2\r\nhi\r\n", Some(b"END\r\n"));
    let service = serve(
        "memcached_ascii_proxy.flick",
        &[port],
        ServiceConfig::default(),
    );
    let mut c = client(&service);
    let want = b"VALUE k 0 2\r\nhi\r\nEND\r\n";
    for _ in 0..3 {
        c.write_all(b"get k\r\n").unwrap();
        assert_eq!(read_reply(&mut c, want.len()), want);
    }
    assert_eq!(backend_messages(&service), 6, "a VALUE and an END a get");
}

#[test]
fn a_reply_that_does_not_parse_after_a_value_gets_the_fault_reply() {
    // The line after the VALUE is read with it, looked at for its END,
    // and does not parse: the client is answered, not left waiting.
    let (port, _backend) = stand_in(b"VALUE k 0 2\r\nhi\r\nNOT A REPLY\r\n", None);
    let service = serve(
        "memcached_ascii_proxy.flick",
        &[port],
        ServiceConfig::default(),
    );
    let mut c = client(&service);
    c.write_all(b"get k\r\n").unwrap();
    let want = b"SERVER_ERROR backend unavailable\r\n";
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(want) {
        let n = c.read(&mut buf).expect("a reply within the timeout");
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(service.stats().malformed.load(Ordering::Relaxed), 1);
}
