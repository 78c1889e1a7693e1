//! Clients that share backend connections never get each other's replies:
//! quiet requests (Memcached's `noreply`, meta `q`, binary quiet opcodes),
//! which memcached answers only on a hit or an error, interleaved from
//! several clients over the proxies' shared connections to real memcached
//! servers. Each client's values carry its own name, so a reply that went
//! to the wrong client shows.

mod support;

use std::io::Write;
use std::thread;
use support::{connect, flick_run, memcached, request_with_opaque, Procs};

/// Clients at once; with two workers and one shared connection per
/// backend per worker, several share each connection.
const CLIENTS: usize = 8;
/// Rounds per client: bounded, each a few pipelined requests.
const ROUNDS: usize = 60;

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
            let got = support::read_until(&mut s, b"MN\r\n");
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

/// Binary requests that memcached answers by closing its connection (a
/// get, set or delete with no key) or does not know (an unknown opcode,
/// the response magic) are answered by the proxy itself, with the status
/// memcached gives, and never reach the connections other clients share:
/// their requests in flight meanwhile all get their own values.
#[test]
fn requests_memcached_would_close_on_hurt_no_other_client() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..2).map(|_| memcached(&mut procs)).collect();
    let port = flick_run(&mut procs, "examples/memcached_proxy.flick", &backends);
    const GET: u8 = 0x00;
    const SET: u8 = 0x01;
    const DELETE: u8 = 0x04;
    let bad: Vec<(Vec<u8>, u16)> = vec![
        (request_with_opaque(GET, b"", b"", b"", 7), 0x04),
        (request_with_opaque(SET, b"", b"v", &[0; 8], 7), 0x04),
        (request_with_opaque(DELETE, b"", b"", b"", 7), 0x04),
        (request_with_opaque(0x50, b"k", b"", b"", 7), 0x81),
        (
            {
                let mut r = request_with_opaque(GET, b"k", b"", b"", 7);
                r[0] = 0x81;
                r
            },
            0x04,
        ),
    ];
    let stop = std::sync::atomic::AtomicBool::new(false);
    thread::scope(|s| {
        // Clients whose gets go over the shared connections all along.
        let good: Vec<_> = (0..4)
            .map(|c| {
                let stop = &stop;
                s.spawn(move || {
                    let mut conn = connect(port);
                    let key = format!("good-{c}");
                    let set = request_with_opaque(SET, key.as_bytes(), key.as_bytes(), &[0; 8], 1);
                    conn.write_all(&set).unwrap();
                    assert_eq!(support::response(&mut conn).0, 0);
                    let mut rounds = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) && rounds < 2000 {
                        let get = request_with_opaque(GET, key.as_bytes(), b"", b"", 2);
                        conn.write_all(&get).unwrap();
                        assert_eq!(
                            support::response(&mut conn),
                            (0, key.clone().into_bytes()),
                            "client {c} round {rounds}"
                        );
                        rounds += 1;
                    }
                    rounds
                })
            })
            .collect();
        for (request, status) in &bad {
            for _ in 0..20 {
                let mut conn = connect(port);
                conn.write_all(request).unwrap();
                let h = support::response_header(&mut conn);
                let (_, value) = support::response_body(&mut conn, &h);
                assert_eq!(support::status(&h), *status, "{value:?}");
                assert_eq!((h[0], h[1]), (0x81, request[1]), "the opcode is echoed");
                assert_eq!(&h[12..16], &7u32.to_be_bytes(), "the opaque is echoed");
                // The connection reads on.
                conn.write_all(&request_with_opaque(GET, b"missing", b"", b"", 3))
                    .unwrap();
                assert_eq!(support::response(&mut conn).0, 0x01, "not found");
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for g in good {
            assert!(g.join().expect("a good client's replies were its own") > 0);
        }
    });
}
