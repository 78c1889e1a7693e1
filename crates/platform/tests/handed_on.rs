//! A send that is its message's last use passes the message itself on
//! (`Host::send_owned`), not a copy. Where the channel is full the message
//! must come back whole, unedited and unnumbered, so that the send runs
//! again on resume: with channels of two messages, a pipelined burst
//! fills them on every hop, and every reply must still answer its own
//! request, in order.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;
use support::{memcached, serve, Procs};

#[test]
fn pipelined_requests_through_full_channels_each_get_their_own_reply() {
    let mut procs = Procs(Vec::new());
    let backends = [memcached(&mut procs), memcached(&mut procs)];
    let config = flick_platform::ServiceConfig {
        channel_capacity: 2,
        ..Default::default()
    };
    let service = serve("memcached_ascii_proxy.flick", &backends, config);
    let c = TcpStream::connect(service.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut w = c.try_clone().unwrap();
    let mut r = BufReader::new(c);
    const N: usize = 300;
    let mut burst = Vec::new();
    for i in 0..N {
        let v = format!("value-{i}-{}", "x".repeat(i % 40));
        write!(burst, "set handed:{i} 0 0 {}\r\n{v}\r\n", v.len()).unwrap();
    }
    for i in (0..N).rev() {
        write!(burst, "get handed:{i}\r\n").unwrap();
    }
    // Written whole before any reply is read: the proxy's channels fill
    // behind a client that reads nothing yet.
    w.write_all(&burst).unwrap();
    let mut line = String::new();
    for i in 0..N {
        line.clear();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, "STORED\r\n", "reply to set {i}");
    }
    for i in (0..N).rev() {
        let v = format!("value-{i}-{}", "x".repeat(i % 40));
        line.clear();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, format!("VALUE handed:{i} 0 {}\r\n", v.len()));
        line.clear();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, format!("{v}\r\n"));
        line.clear();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, "END\r\n", "end of get {i}");
    }
}
