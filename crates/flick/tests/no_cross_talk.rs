//! Clients that share backend connections never get each other's replies:
//! quiet requests (Memcached's `noreply`, meta `q`, binary quiet opcodes),
//! which memcached answers only on a hit or an error, interleaved from
//! several clients over the proxies' shared connections to real memcached
//! servers. Each client's values carry its own name, so a reply that went
//! to the wrong client shows.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread;
use support::{connect, flick_run, memcached, request_with_opaque, Procs};

/// Clients at once; with two workers and one shared connection per
/// backend per worker, several share each connection.
const CLIENTS: usize = 8;
/// Rounds per client: bounded, each a few pipelined requests.
const ROUNDS: usize = 60;

/// Reads from `s` until what came ends with `end`; panics after 10 s.
fn read_until(s: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(end) {
        match s.read(&mut buf) {
            Ok(0) => panic!("closed after {:?}", String::from_utf8_lossy(&got)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("{e} after {:?}", String::from_utf8_lossy(&got)),
        }
    }
    got
}

/// Runs `client(i)` for every client at once; each panics on a wrong reply.
fn all_clients(client: impl Fn(usize) + Sync) {
    thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let client = &client;
                s.spawn(move || client(i))
            })
            .collect();
        for h in handles {
            h.join().expect("a client got a reply that was not its own");
        }
    });
}

/// Meta commands with `q` and storage commands with `noreply`, between
/// ordinary ones: each round's one visible reply is the client's own
/// value, then END, then `MN` for the `mn` that ends the round.
#[test]
fn quiet_text_requests_never_shift_replies_between_clients() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..4).map(|_| memcached(&mut procs)).collect();
    let port = flick_run(
        &mut procs,
        "examples/memcached_ascii_proxy.flick",
        &backends,
    );
    all_clients(|c| {
        let mut s = connect(port);
        for r in 0..ROUNDS {
            let value = format!("c{c}-r{r}");
            let round = format!(
                // A miss and a successful store, both quiet: no reply.
                "mg miss-{c}-{r} v q\r\n\
                 ms key-{c} {len} q\r\n{value}\r\n\
                 set other-{c} 0 0 {len} noreply\r\n{value}\r\n\
                 md miss-{c}-{r} q\r\n\
                 mg key-{c} v\r\n\
                 get other-{c} miss-{c}-{r}\r\n\
                 mn\r\n",
                len = value.len()
            );
            s.write_all(round.as_bytes()).unwrap();
            let got = read_until(&mut s, b"MN\r\n");
            // memcached 1.6 answers a quiet md of a missing key with NF.
            let want = format!(
                "NF\r\nVA {len}\r\n{value}\r\nVALUE other-{c} 0 {len}\r\n{value}\r\nEND\r\nMN\r\n",
                len = value.len()
            );
            let want_without_nf = &want[4..];
            let got = String::from_utf8(got).unwrap();
            assert!(
                got == want || got == want_without_nf,
                "client {c} round {r}: {got:?}"
            );
        }
    });
}

/// Binary quiet gets that miss or hit and quiet sets, all with opaque 0
/// from every client, so nothing in the replies tells the clients apart:
/// each client must still get its own value, then its own key's GETK.
/// (A quiet miss written just before another client's quiet hit takes
/// that hit's reply where replies are matched by opaque and opcode.)
#[test]
fn quiet_binary_requests_never_shift_replies_between_clients() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..4).map(|_| memcached(&mut procs)).collect();
    let port = flick_run(&mut procs, "examples/memcached_proxy.flick", &backends);
    const GETQ: u8 = 0x09;
    const SETQ: u8 = 0x11;
    const GETK: u8 = 0x0c;
    all_clients(|c| {
        let mut s = connect(port);
        let key = format!("key-{c}");
        for r in 0..ROUNDS {
            let value = format!("c{c}-r{r}");
            let miss = format!("miss-{c}-{r}");
            s.write_all(&request_with_opaque(GETQ, miss.as_bytes(), b"", b"", 0))
                .unwrap();
            // Apart, so that other clients' requests come between.
            thread::sleep(std::time::Duration::from_millis(1));
            let mut round = request_with_opaque(SETQ, key.as_bytes(), value.as_bytes(), &[0; 8], 0);
            round.extend(request_with_opaque(GETQ, key.as_bytes(), b"", b"", 0));
            round.extend(request_with_opaque(GETK, key.as_bytes(), b"", b"", 0));
            s.write_all(&round).unwrap();
            for op in [GETQ, GETK] {
                let h = support::response_header(&mut s);
                let (k, v) = support::response_body(&mut s, &h);
                let k = if op == GETK {
                    k
                } else {
                    key.clone().into_bytes()
                };
                assert_eq!(
                    (h[1], support::status(&h), k, v),
                    (op, 0, key.clone().into_bytes(), value.clone().into_bytes()),
                    "client {c} round {r}"
                );
            }
        }
    });
}
