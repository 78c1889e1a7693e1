//! What the platform's tests share: real memcached servers on loopback,
//! the paper's proxy served in-process, and binary-protocol helpers that
//! write into buffers the caller owns (so allocation counts stay clean).
//! Each test file compiles this module and uses part of it.
#![allow(dead_code, unused_imports)]

use flick_platform::{Loaded, Service, ServiceConfig};
use std::io::Read;
use std::net::TcpStream;

pub use flick_testkit::{memcached, Procs};

/// Listing 1's proxy served in-process in front of `backends`.
pub fn proxy(backends: &[u16]) -> Service {
    serve("memcached_proxy.flick", backends, ServiceConfig::default())
}

/// An example program served in-process in front of `backends`, with two
/// workers; its grammar is the one it names, or its records' own layout.
pub fn serve(example: &str, backends: &[u16], config: ServiceConfig) -> Service {
    let path = format!("{}/../../examples/{example}", env!("CARGO_MANIFEST_DIR"));
    let src = std::fs::read_to_string(path).unwrap();
    serve_source(&src, backends, config)
}

/// [`serve`] of a program given as its text.
pub fn serve_source(src: &str, backends: &[u16], config: ServiceConfig) -> Service {
    let (program, diags) = flick_syntax::parse(src);
    assert!(diags.is_empty());
    let (checked, diags) = flick_check::check(&program);
    assert!(diags.is_empty());
    let grammar = match &checked.grammar {
        Some(name) => flick_wire::Grammar::stock(name).unwrap(),
        None => {
            let compiled = flick_compile::record_grammar("records", &program, &checked);
            std::sync::Arc::new(
                flick_wire::Grammar::from_source("records", &compiled.source).unwrap(),
            )
        }
    };
    let loaded = Loaded::new(&program, &checked, grammar).unwrap();
    Service::start(
        loaded,
        ServiceConfig {
            listen: vec![(
                "client".into(),
                format!("127.0.0.1:{}", flick_testkit::free_port())
                    .parse()
                    .unwrap(),
            )],
            // A program with no backends (the static server) connects
            // nothing.
            connect: match backends {
                [] => Vec::new(),
                _ => vec![(
                    "backends".into(),
                    backends
                        .iter()
                        .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
                        .collect(),
                )],
            },
            workers: 2,
            max_instances: 64,
            ..config
        },
    )
    .unwrap()
}

pub fn request(op: u8, key: &[u8], value: &[u8], extras: &[u8], out: &mut Vec<u8>) {
    let body = extras.len() + key.len() + value.len();
    out.clear();
    out.extend_from_slice(&[0x80, op]);
    out.extend_from_slice(&(key.len() as u16).to_be_bytes());
    out.push(extras.len() as u8);
    out.extend_from_slice(&[0, 0, 0]);
    out.extend_from_slice(&(body as u32).to_be_bytes());
    out.extend_from_slice(&[0; 12]);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Reads one response into `buf`; returns its status.
pub fn response(s: &mut TcpStream, buf: &mut [u8]) -> u16 {
    s.read_exact(&mut buf[..24]).unwrap();
    let total = u32::from_be_bytes(buf[8..12].try_into().unwrap()) as usize;
    let status = u16::from_be_bytes([buf[6], buf[7]]);
    s.read_exact(&mut buf[24..24 + total]).unwrap();
    status
}

/// Reads one HTTP reply from `s` into `buf`: where its head ends (after
/// its blank line) and where the reply does (after as many body bytes as
/// its Content-Length says). Allocates nothing, so that allocation counts
/// stay the server's; panics where the server closes first or sends more
/// than one reply.
pub fn http_reply(s: &mut TcpStream, buf: &mut [u8]) -> (usize, usize) {
    let mut got = 0;
    loop {
        let n = s.read(&mut buf[got..]).unwrap();
        assert!(n > 0, "the server closed the connection");
        got += n;
        let Some(end) = buf[..got].windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..end]).unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().unwrap())
            })
            .expect("a Content-Length");
        if got >= end + 4 + length {
            assert_eq!(got, end + 4 + length, "one reply per request");
            return (end + 4, got);
        }
    }
}
