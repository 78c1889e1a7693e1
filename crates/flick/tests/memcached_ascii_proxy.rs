//! The Memcached proxy for the text protocol (`examples/memcached_ascii_proxy.flick`)
//! run by `flick run` in front of real memcached servers: what twemproxy
//! users rely on, checked with libmemcached's `memccapable` and by hand.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;
use support::{connect, flick_run, memcached, Procs};

fn proxy(procs: &mut Procs, backends: &[u16]) -> u16 {
    flick_run(procs, "examples/memcached_ascii_proxy.flick", backends)
}

/// The backend `hash(key) mod n` names, as the program computes it.
fn home(key: &str, n: u64) -> usize {
    ((flick_exec::fnv1a(key.as_bytes()) >> 1) % n) as usize
}

/// Sends `request` and reads until the reply ends with `end` (or 10 s pass).
fn exchange(s: &mut TcpStream, request: &[u8], end: &[u8]) -> String {
    s.write_all(request).unwrap();
    String::from_utf8(support::read_until(s, end)).unwrap()
}

/// `memccapable` in ASCII mode through the proxy in front of four
/// memcached servers passes every test it passes against one directly:
/// noreply, multi-key gets, flush, verbosity, version, stats, quit.
#[test]
fn memccapable_ascii_passes_through_the_proxy() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..4).map(|_| memcached(&mut procs)).collect();
    // Not a test of timeouts: slow replies on a loaded machine stay replies.
    let port = support::flick_run_with(
        &mut procs,
        "examples/memcached_ascii_proxy.flick",
        &backends,
        &["--response-timeout-ms", "20000"],
    );
    let direct = support::memccapable(backends[0], "-a");
    let proxied = support::memccapable(port, "-a");
    support::same_passes(&direct, &proxied);
}

/// A get of keys that live on different backends is answered in the
/// request's key order under one END; each key sits on the backend its
/// hash names; noreply requests get no reply; a request that does not
/// parse gets ERROR and the connection reads on.
#[test]
fn multi_key_gets_follow_key_order_across_backends() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..4).map(|_| memcached(&mut procs)).collect();
    let port = proxy(&mut procs, &backends);
    let mut c = connect(port);
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    let used: std::collections::HashSet<usize> = keys.iter().map(|k| home(k, 4)).collect();
    assert!(used.len() >= 3, "the keys spread over the backends");
    for k in &keys {
        let set = format!("set {k} 0 0 {} noreply\r\nv-{k}\r\n", k.len() + 2);
        c.write_all(set.as_bytes()).unwrap();
    }
    // Nothing came back for the noreply sets: the next reply is this one.
    assert_eq!(exchange(&mut c, b"version\r\n", b"\r\n")[..8], *"VERSION ");
    let mut get = String::from("get missing");
    for k in keys.iter().rev() {
        get.push(' ');
        get.push_str(k);
    }
    get.push_str("\r\n");
    let reply = exchange(&mut c, get.as_bytes(), b"END\r\n");
    let mut want = String::new();
    for k in keys.iter().rev() {
        want.push_str(&format!("VALUE {k} 0 {}\r\nv-{k}\r\n", k.len() + 2));
    }
    want.push_str("END\r\n");
    assert_eq!(reply, want);
    // Each key is on the backend its hash names, and only there.
    for k in &keys {
        for (i, b) in backends.iter().enumerate() {
            let mut d = connect(*b);
            let r = exchange(&mut d, format!("get {k}\r\n").as_bytes(), b"END\r\n");
            assert_eq!(
                r.starts_with("VALUE"),
                i == home(k, 4),
                "{k} on backend {i}"
            );
        }
    }
    // A request that does not parse is answered, and the next one works.
    assert_eq!(exchange(&mut c, b"bogus command\r\n", b"\r\n"), "ERROR\r\n");
    let r = exchange(&mut c, b"get k1\r\n", b"END\r\n");
    assert_eq!(r, "VALUE k1 0 4\r\nv-k1\r\nEND\r\n");
}

/// A dead backend's keys get SERVER_ERROR at once while the other keys
/// keep working, and the proxy stays up.
#[test]
fn a_dead_backend_gives_server_errors_not_hangs() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..2).map(|_| memcached(&mut procs)).collect();
    let port = proxy(&mut procs, &backends);
    let mut c = connect(port);
    let on = |b: usize| {
        (0..100)
            .map(|i| format!("d{i}"))
            .find(|k| home(k, 2) == b)
            .unwrap()
    };
    let (live, dead) = (on(0), on(1));
    for k in [&live, &dead] {
        let r = exchange(
            &mut c,
            format!("set {k} 0 0 1\r\nx\r\n").as_bytes(),
            b"\r\n",
        );
        assert_eq!(r, "STORED\r\n");
    }
    procs.0[1].kill().unwrap();
    procs.0[1].wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let r = exchange(&mut c, format!("get {dead}\r\n").as_bytes(), b"\r\n");
    assert_eq!(r, "SERVER_ERROR backend unavailable\r\n");
    let r = exchange(&mut c, format!("get {live}\r\n").as_bytes(), b"END\r\n");
    assert_eq!(r, format!("VALUE {live} 0 1\r\nx\r\nEND\r\n"));
}

/// Sends `request` and then `mn`, and reads up to the `MN` that answers it:
/// everything the request got, or nothing for a request with no reply.
fn exchange_fenced(s: &mut TcpStream, request: &[u8]) -> String {
    s.write_all(request).unwrap();
    exchange(s, b"mn\r\n", b"MN\r\n")
}

/// Malformed and oversized requests get, through the proxy, exactly what
/// memcached itself answers, and the connection goes on as memcached's
/// does: a data block over the item size limit or not ended by "\r\n" is
/// read and dropped (never run as commands), `noreply` silences a storage
/// command's errors, `delete <key> 0` is taken.
#[test]
fn malformed_requests_get_memcacheds_own_replies() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..2).map(|_| memcached(&mut procs)).collect();
    let port = proxy(&mut procs, &backends);
    let big = |n: usize, fill: u8| vec![fill; n];
    let mut cases: Vec<Vec<u8>> = vec![
        b"set k 0 0 3\r\nabcde\r\nget k\r\n".to_vec(),
        b"set k abc 0 1\r\nx\r\n".to_vec(),
        [
            b"set ".to_vec(),
            big(300, b'k'),
            b" 0 0 1\r\nx\r\n".to_vec(),
        ]
        .concat(),
        b"get\r\n".to_vec(),
        b"bogus\r\n".to_vec(),
        b"set k 0 0 -1\r\nx\r\n".to_vec(),
        b"incr k abc\r\n".to_vec(),
        b"set k 0 0 3 noreply\r\nabcde\r\n".to_vec(),
        b"mg k v q zz\r\n".to_vec(),
        b"delete k 0\r\n".to_vec(),
        b"delete k 5\r\n".to_vec(),
        b"delete k 0 noreply\r\n".to_vec(),
        b"delete k noreply 0\r\n".to_vec(),
        b"delete k 0 noreply extra\r\n".to_vec(),
    ];
    for (line, n) in [
        (&b"set k 0 0 2000000\r\n"[..], 2_000_000),
        (b"set k 0 0 1048577\r\n", 1_048_577),
        (b"set k 0 0 2000000 noreply\r\n", 2_000_000),
        (b"ms k 2000000 q\r\n", 2_000_000),
    ] {
        cases.push([line.to_vec(), big(n, b'x'), b"\r\nget k\r\n".to_vec()].concat());
    }
    for case in &cases {
        let direct = exchange_fenced(&mut connect(backends[0]), case);
        let proxied = exchange_fenced(&mut connect(port), case);
        let shown = String::from_utf8_lossy(&case[..case.len().min(40)]).into_owned();
        assert_eq!(proxied, direct, "{shown:?}");
    }
}

/// A value over the item size limit that holds a storage command: the
/// command is never run, through the proxy as against memcached.
#[test]
fn an_oversized_value_is_never_run_as_commands() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..2).map(|_| memcached(&mut procs)).collect();
    let port = proxy(&mut procs, &backends);
    let inner = b"\r\nset smuggled 0 0 5\r\nhello\r\n";
    let n = 1_100_000;
    let mut value = vec![b'a'; n];
    value[1000..1000 + inner.len()].copy_from_slice(inner);
    let request = [
        format!("set big 0 0 {n}\r\n").into_bytes(),
        value,
        b"\r\n".to_vec(),
    ]
    .concat();
    let mut c = connect(port);
    assert_eq!(
        exchange_fenced(&mut c, &request),
        "SERVER_ERROR object too large for cache\r\nMN\r\n"
    );
    assert_eq!(exchange(&mut c, b"get smuggled\r\n", b"END\r\n"), "END\r\n");
    for b in &backends {
        let r = exchange(&mut connect(*b), b"get smuggled\r\n", b"END\r\n");
        assert_eq!(r, "END\r\n", "nothing stored on {b}");
    }
}

/// Commands that administer one server (`shutdown`, `cache_memlimit`,
/// `slabs`, `lru_crawler`, ...) are refused by the proxy with a
/// `CLIENT_ERROR` that says why, and reach no server: after `shutdown`
/// every backend still answers.
#[test]
fn commands_for_one_server_are_refused_and_reach_none() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..2).map(|_| memcached(&mut procs)).collect();
    let port = proxy(&mut procs, &backends);
    let mut c = connect(port);
    for command in [
        "shutdown\r\n",
        "cache_memlimit 100\r\n",
        "slabs reassign 1 2\r\n",
        "lru_crawler metadump all\r\n",
    ] {
        assert_eq!(
            exchange_fenced(&mut c, command.as_bytes()),
            "CLIENT_ERROR not supported through the proxy: send it to each server\r\nMN\r\n",
            "{command:?}"
        );
    }
    for b in &backends {
        let r = exchange(&mut connect(*b), b"version\r\n", b"\r\n");
        assert!(r.starts_with("VERSION "), "backend {b} is up: {r:?}");
    }
}

/// A get's reply (its VALUE block and the END after it) leaves the proxy in
/// one write, as memcached sends it: the first read a client makes sees
/// all of it. pymemcache's `raw_command` keeps only the last piece of a
/// reply that comes in two, so a split reply reads as a miss there. Before
/// the writer held a reply's pieces together, 7 to 70 of these 5000 gets
/// were split with two workers.
#[test]
fn a_get_reply_arrives_in_one_piece() {
    use std::io::Read;
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..2).map(|_| memcached(&mut procs)).collect();
    let port = proxy(&mut procs, &backends);
    let mut c = connect(port);
    c.set_nodelay(true).unwrap();
    assert_eq!(
        exchange(&mut c, b"set whole 42 0 1\r\nf\r\n", b"\r\n"),
        "STORED\r\n"
    );
    let want = b"VALUE whole 42 1\r\nf\r\nEND\r\n";
    let mut split = 0;
    let mut buf = [0u8; 256];
    // A read a signal interrupts is made again: it read nothing.
    let read = |c: &mut TcpStream, buf: &mut [u8]| loop {
        match c.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r.unwrap(),
        }
    };
    for _ in 0..5000 {
        c.write_all(b"get whole\r\n").unwrap();
        let mut got = read(&mut c, &mut buf);
        if got < want.len() {
            split += 1;
            while got < want.len() {
                let n = read(&mut c, &mut buf[got..]);
                assert!(n > 0, "the proxy closed mid-reply");
                got += n;
            }
        }
        assert_eq!(&buf[..got], want);
    }
    assert_eq!(split, 0, "replies that came in more than one piece");
}

/// The STAT lines of a `stats` reply: name and value, in order.
fn stat_lines(reply: &str) -> Vec<(String, String)> {
    reply
        .split("\r\n")
        .filter_map(|l| l.strip_prefix("STAT "))
        .map(|l| {
            let (name, value) = l.split_once(' ').unwrap_or((l, ""));
            (name.to_string(), value.to_string())
        })
        .collect()
}

fn stat<'a>(stats: &'a [(String, String)], name: &str) -> &'a str {
    stats
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no STAT {name}"))
}

/// Request lines as memcached tokenises them: runs of spaces, spaces
/// before the first token and after the last, and a bare "\n" line end
/// are read as memcached reads them, and every reply line still ends in
/// "\r\n"; a get of several keys so written is split and answered in key
/// order under one END.
#[test]
fn loosely_spaced_lines_are_read_as_memcached_reads_them() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..2).map(|_| memcached(&mut procs)).collect();
    let port = proxy(&mut procs, &backends);
    let mut c = connect(port);
    let keys: Vec<String> = (0..8).map(|i| format!("loose{i}")).collect();
    let used: std::collections::HashSet<usize> = keys.iter().map(|k| home(k, 2)).collect();
    assert_eq!(used.len(), 2, "the keys spread over both backends");
    for (i, k) in keys.iter().enumerate() {
        let set = match i % 3 {
            0 => format!("  set  {k}   0 0  2 \nv{i}\r\n"),
            1 => format!("set {k} 0 0 2\nv{i}\r\n"),
            _ => format!("set {k}  0  0  2   \r\nv{i}\r\n"),
        };
        assert_eq!(exchange(&mut c, set.as_bytes(), b"\r\n"), "STORED\r\n");
    }
    assert_eq!(
        exchange(&mut c, b"  set  quiet 0 0 1   noreply \nq\r\nmn\n", b"\r\n"),
        "MN\r\n"
    );
    let reply = exchange(
        &mut c,
        b"get   loose0  loose1 loose2   quiet  \n",
        b"END\r\n",
    );
    assert_eq!(
        reply,
        "VALUE loose0 0 2\r\nv0\r\nVALUE loose1 0 2\r\nv1\r\nVALUE loose2 0 2\r\nv2\r\n\
         VALUE quiet 0 1\r\nq\r\nEND\r\n"
    );
    assert_eq!(
        exchange(&mut c, b"incr  loose9  1\n", b"\r\n"),
        "NOT_FOUND\r\n"
    );
    assert_eq!(
        exchange(&mut c, b"delete   loose3 \n", b"\r\n"),
        "DELETED\r\n"
    );
    assert_eq!(
        exchange(&mut c, b"mg  loose4  v  \n", b"\r\n"),
        "VA 2\r\nv4\r\n"
    );
    assert_eq!(exchange(&mut c, b" version \n", b"\r\n")[..8], *"VERSION ");
    // A tab is a byte of its token, as memcached reads it: no such command.
    assert_eq!(exchange(&mut c, b"get\tloose0\r\n", b"\r\n"), "ERROR\r\n");
    // An empty line is an unknown command, and the next one is read.
    assert_eq!(
        exchange(&mut c, b"\n  \r\nmn\r\n", b"MN\r\n"),
        "ERROR\r\nERROR\r\nMN\r\n"
    );
}

/// `stats` through the proxy in front of two servers is one reply: one
/// STAT line per name, in the first server's order, the servers' counters
/// added up (`curr_items` is the sum of each server's own), what names a
/// server (`pid`) the first server's; then one END.
#[test]
fn stats_are_summed_over_the_backends() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..2).map(|_| memcached(&mut procs)).collect();
    let port = proxy(&mut procs, &backends);
    let mut c = connect(port);
    for i in 0..40 {
        let set = format!("set sum{i} 0 0 1\r\nx\r\n");
        assert_eq!(exchange(&mut c, set.as_bytes(), b"\r\n"), "STORED\r\n");
    }
    let each: Vec<Vec<(String, String)>> = backends
        .iter()
        .map(|b| stat_lines(&exchange(&mut connect(*b), b"stats\r\n", b"END\r\n")))
        .collect();
    let items: Vec<u64> = each
        .iter()
        .map(|s| stat(s, "curr_items").parse().unwrap())
        .collect();
    assert!(
        items.iter().all(|&n| n > 0),
        "both servers hold items: {items:?}"
    );
    assert_eq!(items.iter().sum::<u64>(), 40);
    let reply = exchange(&mut c, b"stats\r\n", b"END\r\n");
    assert!(reply.ends_with("\r\nEND\r\n") && reply.matches("END\r\n").count() == 1);
    let merged = stat_lines(&reply);
    assert_eq!(stat(&merged, "curr_items"), "40", "{reply}");
    assert_eq!(stat(&merged, "total_items"), "40", "{reply}");
    let names: Vec<&str> = merged.iter().map(|(n, _)| n.as_str()).collect();
    let first: Vec<&str> = each[0].iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names, first,
        "one line per name, in the first server's order"
    );
    assert_eq!(stat(&merged, "pid"), stat(&each[0], "pid"));
    assert_eq!(stat(&merged, "version"), stat(&each[0], "version"));
    let limit = |s: &[(String, String)]| stat(s, "limit_maxbytes").parse::<u64>().unwrap();
    assert_eq!(limit(&merged), limit(&each[0]) + limit(&each[1]));
    // Other forms of stats are each server's, one after the other.
    let settings = exchange(&mut c, b"stats settings\r\n", b"END\r\n");
    assert_eq!(settings.matches("STAT maxbytes ").count(), 2, "{settings}");
}

/// The proxy in front of one memcached reached through toxiproxy, and a
/// client that has stored `big` (1,000 bytes) and `small` (`hello`)
/// through it; `None` where toxiproxy is not installed (outside CI).
fn big_and_small_behind_toxiproxy(
    procs: &mut Procs,
) -> Option<(flick_testkit::toxiproxy::Proxy, TcpStream)> {
    let toxi = flick_testkit::toxiproxy::Toxiproxy::start(procs)?;
    let m = memcached(procs);
    let p = toxi.proxy("mc", m);
    let port = proxy(procs, &[p.port]);
    let mut c = connect(port);
    let mut big = b"set big 0 0 1000\r\n".to_vec();
    big.extend_from_slice(&[b'x'; 1000]);
    big.extend_from_slice(b"\r\nset small 0 0 5\r\nhello\r\n");
    assert_eq!(
        exchange(&mut c, &big, b"STORED\r\nSTORED\r\n"),
        "STORED\r\nSTORED\r\n"
    );
    Some((p, c))
}

/// A backend connection that breaks with requests in flight: the reads
/// that change nothing (`get`, `mg` asking for the value) are sent again
/// once over a new connection and answered as if nothing happened; a
/// `gat` or a `set`, which may have been done, gets the fault reply.
/// Toxiproxy closes the connection once 200 bytes of replies have come
/// back: the gat's value takes it over, the retried reads' replies on the
/// new connection do not. Replies are held 300 ms first, so the whole
/// batch is on the old connection when it breaks, however slowly the
/// proxy reads it; a request sent after the break would find the backend
/// marked down for its first backoff and get the fault reply instead.
#[test]
fn reads_lost_with_their_connection_are_sent_again() {
    use flick_testkit::toxiproxy::{Stream, Toxic};
    let mut procs = Procs(Vec::new());
    let Some((p, mut c)) = big_and_small_behind_toxiproxy(&mut procs) else {
        return;
    };
    p.add(
        "held",
        Stream::Downstream,
        1.0,
        Toxic::Latency {
            latency_ms: 300,
            jitter_ms: 0,
        },
    );
    p.add(
        "cut",
        Stream::Downstream,
        1.0,
        Toxic::LimitData { bytes: 200 },
    );
    let batch = b"gat 0 big\r\nget small\r\nmg small v\r\nset after 0 0 1\r\nz\r\nmg small k v\r\n";
    let reply = exchange(&mut c, batch, b"ksmall\r\nhello\r\n");
    assert_eq!(
        reply,
        "SERVER_ERROR backend unavailable\r\nVALUE small 0 5\r\nhello\r\nEND\r\n\
         VA 5\r\nhello\r\nSERVER_ERROR backend unavailable\r\nVA 5 ksmall\r\nhello\r\n"
    );
    p.remove("cut");
    p.remove("held");
    assert_eq!(
        exchange(&mut c, b"get small\r\n", b"END\r\n"),
        "VALUE small 0 5\r\nhello\r\nEND\r\n"
    );
}

/// A backend connection that had answered and then broke is made again
/// by the next request, which is answered as if nothing happened: the
/// backend is not taken for down because one connection to it broke.
/// Toxiproxy closes each connection once 200 bytes of replies have come
/// back; the `gat`'s 1,000-byte value breaks the first (the `gat` gets
/// the fault reply: it may have been done), the small replies on the
/// next connection pass, and the `gat` again breaks that one, which had
/// answered too.
#[test]
fn a_backend_connection_that_broke_is_made_again_by_the_next_request() {
    use flick_testkit::toxiproxy::{Stream, Toxic};
    let mut procs = Procs(Vec::new());
    let Some((p, mut c)) = big_and_small_behind_toxiproxy(&mut procs) else {
        return;
    };
    p.add(
        "cut",
        Stream::Downstream,
        1.0,
        Toxic::LimitData { bytes: 200 },
    );
    let fault = "SERVER_ERROR backend unavailable\r\n";
    for _ in 0..2 {
        assert_eq!(exchange(&mut c, b"gat 0 big\r\n", b"\r\n"), fault);
        assert_eq!(
            exchange(&mut c, b"get small\r\n", b"END\r\n"),
            "VALUE small 0 5\r\nhello\r\nEND\r\n"
        );
    }
    p.remove("cut");
}

/// A command sent to every backend, one of which is down, ends in the
/// fault reply whichever backend answers last: `stats` gives the live
/// server's lines and then `SERVER_ERROR` (its numbers are not the whole
/// sum), `flush_all` and `version` give `SERVER_ERROR` (not every server
/// did it), never an `END`, `OK` or `VERSION` that would say all went well.
#[test]
fn a_broadcast_with_a_dead_backend_ends_in_the_fault_reply() {
    let mut procs = Procs(Vec::new());
    let backends: Vec<u16> = (0..2).map(|_| memcached(&mut procs)).collect();
    let port = proxy(&mut procs, &backends);
    let mut c = connect(port);
    assert_eq!(exchange(&mut c, b"version\r\n", b"\r\n")[..8], *"VERSION ");
    procs.0[1].kill().unwrap();
    procs.0[1].wait().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let fault = "SERVER_ERROR backend unavailable\r\n";
    for _ in 0..3 {
        let r = exchange(&mut c, b"stats\r\n", fault.as_bytes());
        assert!(r.starts_with("STAT pid ") && !r.contains("END\r\n"), "{r}");
        assert_eq!(r.matches("STAT pid ").count(), 1, "{r}");
        assert_eq!(exchange(&mut c, b"flush_all\r\n", b"\r\n"), fault);
        assert_eq!(exchange(&mut c, b"version\r\n", b"\r\n"), fault);
    }
}
