//! The Memcached text protocol grammar against the syntax of memcached's
//! doc/protocol.txt: every command and reply, pipelining, reads split at
//! every byte, serialisation, and the malformed inputs a proxy answers with
//! `CLIENT_ERROR` or `ERROR`.

use flick_wire::{Builder, Grammar, Message, Parser, Progress, Value, WireError, WireErrorKind};
use proptest::prelude::*;
use std::sync::Arc;

fn grammar() -> Arc<Grammar> {
    Grammar::stock("memcached_ascii").unwrap()
}

fn parser(unit: &str) -> Parser {
    let g = grammar();
    g.parser(g.unit_id(unit).unwrap())
}

/// Parses one whole message, which must take all of `bytes`.
fn parse_one(unit: &str, bytes: &[u8]) -> Parser {
    let mut p = parser(unit);
    match p.parse(bytes) {
        Ok(Progress::Done(n)) if n == bytes.len() => p,
        other => panic!("{unit} {:?}: {other:?}", String::from_utf8_lossy(bytes)),
    }
}

fn parse_err(unit: &str, bytes: &[u8]) -> WireError {
    match parser(unit).parse(bytes) {
        Err(e) => e,
        Ok(p) => panic!("{unit} {:?} parsed: {p:?}", String::from_utf8_lossy(bytes)),
    }
}

fn text<'a>(m: &Message<'a>, name: &str) -> Option<&'a str> {
    m.bytes(name).map(|b| std::str::from_utf8(b).unwrap())
}

/// The `value` of each `arg` of a list (keys, meta flags, arguments).
fn tokens(m: &Message, name: &str) -> Vec<String> {
    let Some(l) = m.list(name) else {
        return Vec::new();
    };
    (0..l.len())
        .map(|i| match l.get(i) {
            Value::Unit(a) => String::from_utf8(a.bytes("value").unwrap().to_vec()).unwrap(),
            other => panic!("{other:?}"),
        })
        .collect()
}

// Requests, one of each form of protocol.txt's syntax.
const SET: &[u8] = b"set foo 0 0 3\r\nbar\r\n";
const SET_NOREPLY: &[u8] = b"set foo 4294967295 -1 5 noreply\r\nhello\r\n";
const ADD_EMPTY: &[u8] = b"add k 1 100 0\r\n\r\n";
const REPLACE: &[u8] = b"replace k 7 2592000 4\r\nr\r\nx\r\n";
const APPEND: &[u8] = b"append k 0 0 2\r\n\r\n\r\n";
const PREPEND: &[u8] = b"prepend k 0 0 1 noreply\r\nx\r\n";
const CAS: &[u8] = b"cas k 3 60 3 18446744073709551615\r\nabc\r\n";
const CAS_NOREPLY: &[u8] = b"cas k 0 0 1 42 noreply\r\nz\r\n";
const GET: &[u8] = b"get foo\r\n";
const GETS_MANY: &[u8] = b"gets a bb ccc dddd\r\n";
const GAT: &[u8] = b"gat 100 a b\r\n";
const GATS: &[u8] = b"gats -1 k\r\n";
const TOUCH: &[u8] = b"touch k 10\r\n";
const TOUCH_NOREPLY: &[u8] = b"touch k 10 noreply\r\n";
const DELETE: &[u8] = b"delete k\r\n";
const DELETE_NOREPLY: &[u8] = b"delete k noreply\r\n";
const INCR: &[u8] = b"incr n 5\r\n";
const DECR_NOREPLY: &[u8] = b"decr n 18446744073709551615 noreply\r\n";
const FLUSH: &[u8] = b"flush_all\r\n";
const FLUSH_DELAY: &[u8] = b"flush_all 60\r\n";
const FLUSH_NOREPLY: &[u8] = b"flush_all noreply\r\n";
const FLUSH_BOTH: &[u8] = b"flush_all 60 noreply\r\n";
const VERSION: &[u8] = b"version\r\n";
const VERBOSITY: &[u8] = b"verbosity 1\r\n";
const VERBOSITY_NOREPLY: &[u8] = b"verbosity 2 noreply\r\n";
const STATS: &[u8] = b"stats\r\n";
const STATS_ARGS: &[u8] = b"stats cachedump 1 10\r\n";
const QUIT: &[u8] = b"quit\r\n";
const MG: &[u8] = b"mg foo s v t f k O123\r\n";
const MG_BARE: &[u8] = b"mg foo\r\n";
const MS: &[u8] = b"ms foo 2 T90 F5 I\r\nhi\r\n";
const MS_QUIET: &[u8] = b"ms foo 0 q\r\n\r\n";
const MD: &[u8] = b"md foo q\r\n";
const MA: &[u8] = b"ma foo N0 J10 D5 MI v\r\n";
const MN: &[u8] = b"mn\r\n";
const ME: &[u8] = b"me foo\r\n";

const REQUESTS: &[&[u8]] = &[
    SET,
    SET_NOREPLY,
    ADD_EMPTY,
    REPLACE,
    APPEND,
    PREPEND,
    CAS,
    CAS_NOREPLY,
    GET,
    GETS_MANY,
    GAT,
    GATS,
    TOUCH,
    TOUCH_NOREPLY,
    DELETE,
    DELETE_NOREPLY,
    INCR,
    DECR_NOREPLY,
    FLUSH,
    FLUSH_DELAY,
    FLUSH_NOREPLY,
    FLUSH_BOTH,
    VERSION,
    VERBOSITY,
    VERBOSITY_NOREPLY,
    STATS,
    STATS_ARGS,
    QUIT,
    MG,
    MG_BARE,
    MS,
    MS_QUIET,
    MD,
    MA,
    MN,
    ME,
];

// Replies.
const VALUE: &[u8] = b"VALUE foo 0 3\r\nbar\r\n";
const VALUE_CAS: &[u8] = b"VALUE foo 5 4 99\r\n\r\nab\r\n";
const VALUE_EMPTY: &[u8] = b"VALUE k 0 0\r\n\r\n";
const CLIENT_ERROR: &[u8] = b"CLIENT_ERROR bad data chunk\r\n";
const SERVER_ERROR: &[u8] = b"SERVER_ERROR out of memory storing object\r\n";
const STAT: &[u8] = b"STAT pid 1234\r\n";
const STAT_SPACES: &[u8] = b"STAT version 1.6.21 (beta)\r\n";
const VERSION_REPLY: &[u8] = b"VERSION 1.6.21\r\n";
const NUMBER: &[u8] = b"18446744073709551615\r\n";
const NUMBER_PADDED: &[u8] = b"9  \r\n";
const HD: &[u8] = b"HD\r\n";
const HD_FLAGS: &[u8] = b"HD c5 kfoo O123\r\n";
const VA: &[u8] = b"VA 2 s2 f0 t-1\r\nhi\r\n";
const VA_EMPTY: &[u8] = b"VA 0\r\n\r\n";
const NF: &[u8] = b"NF\r\n";
const NS: &[u8] = b"NS O1\r\n";
const EX: &[u8] = b"EX c7\r\n";
const ME_REPLY: &[u8] = b"ME foo exp=-1 la=3 cas=2 fetch=no cls=1 size=63\r\n";
const SIMPLE_REPLIES: &[&str] = &[
    "END",
    "STORED",
    "NOT_STORED",
    "EXISTS",
    "NOT_FOUND",
    "DELETED",
    "TOUCHED",
    "OK",
    "ERROR",
    "EN",
    "MN",
];

fn responses() -> Vec<Vec<u8>> {
    let mut all: Vec<Vec<u8>> = [
        VALUE,
        VALUE_CAS,
        VALUE_EMPTY,
        CLIENT_ERROR,
        SERVER_ERROR,
        STAT,
        STAT_SPACES,
        VERSION_REPLY,
        NUMBER,
        NUMBER_PADDED,
        HD,
        HD_FLAGS,
        VA,
        VA_EMPTY,
        NF,
        NS,
        EX,
        ME_REPLY,
    ]
    .iter()
    .map(|b| b.to_vec())
    .collect();
    all.extend(
        SIMPLE_REPLIES
            .iter()
            .map(|r| format!("{r}\r\n").into_bytes()),
    );
    all
}

#[test]
fn storage_commands() {
    for (bytes, command) in [
        (SET, "set"),
        (ADD_EMPTY, "add"),
        (REPLACE, "replace"),
        (APPEND, "append"),
        (PREPEND, "prepend"),
    ] {
        let p = parse_one("request", bytes);
        let m = p.message(bytes);
        assert_eq!(text(&m, "command"), Some(command));
        assert!(matches!(m.get("cas"), Value::Absent));
    }

    let p = parse_one("request", SET);
    let m = p.message(SET);
    assert_eq!(text(&m, "key"), Some("foo"));
    assert_eq!(m.int("flags"), Some(0));
    assert_eq!(m.int("exptime"), Some(0));
    assert_eq!(m.int("bytes"), Some(3));
    assert_eq!(m.int("noreply"), Some(0));
    assert_eq!(text(&m, "data"), Some("bar"));

    let p = parse_one("request", SET_NOREPLY);
    let m = p.message(SET_NOREPLY);
    assert_eq!(m.int("flags"), Some(u32::MAX as i128));
    assert_eq!(
        m.int("exptime"),
        Some(-1),
        "a negative exptime expires at once"
    );
    assert_eq!(m.int("noreply"), Some(1));
    assert_eq!(text(&m, "data"), Some("hello"));

    let p = parse_one("request", ADD_EMPTY);
    let m = p.message(ADD_EMPTY);
    assert_eq!((m.int("flags"), m.int("exptime")), (Some(1), Some(100)));
    assert_eq!(text(&m, "data"), Some(""));

    // The data block is counted, not searched for: it may hold "\r\n".
    let p = parse_one("request", REPLACE);
    let m = p.message(REPLACE);
    assert_eq!(m.int("exptime"), Some(2592000));
    assert_eq!(text(&m, "data"), Some("r\r\nx"));
    let p = parse_one("request", APPEND);
    assert_eq!(text(&p.message(APPEND), "data"), Some("\r\n"));

    let p = parse_one("request", PREPEND);
    assert_eq!(p.message(PREPEND).int("noreply"), Some(1));

    let p = parse_one("request", CAS);
    let m = p.message(CAS);
    assert_eq!(text(&m, "command"), Some("cas"));
    assert_eq!(
        (m.int("flags"), m.int("exptime"), m.int("bytes")),
        (Some(3), Some(60), Some(3))
    );
    assert_eq!(m.int("cas"), Some(u64::MAX as i128));
    assert_eq!(m.int("noreply"), Some(0));
    assert_eq!(text(&m, "data"), Some("abc"));

    let p = parse_one("request", CAS_NOREPLY);
    let m = p.message(CAS_NOREPLY);
    assert_eq!((m.int("cas"), m.int("noreply")), (Some(42), Some(1)));
    assert_eq!(text(&m, "data"), Some("z"));
}

#[test]
fn retrieval_commands() {
    let p = parse_one("request", GET);
    let m = p.message(GET);
    assert_eq!(text(&m, "command"), Some("get"));
    assert_eq!(text(&m, "key"), Some("foo"));
    assert_eq!(tokens(&m, "keys"), ["foo"]);

    let p = parse_one("request", GETS_MANY);
    let m = p.message(GETS_MANY);
    assert_eq!(text(&m, "command"), Some("gets"));
    assert_eq!(text(&m, "key"), Some("a"), "the first key");
    assert_eq!(tokens(&m, "keys"), ["a", "bb", "ccc", "dddd"]);

    let p = parse_one("request", GAT);
    let m = p.message(GAT);
    assert_eq!(text(&m, "command"), Some("gat"));
    assert_eq!(m.int("exptime"), Some(100));
    assert_eq!(tokens(&m, "keys"), ["a", "b"]);

    let p = parse_one("request", GATS);
    let m = p.message(GATS);
    assert_eq!(m.int("exptime"), Some(-1));
    assert_eq!(text(&m, "key"), Some("k"));

    // As many keys as the grammar allows, each as long as a key may be.
    let key = "k".repeat(250);
    let line = format!("get{}\r\n", format!(" {key}").repeat(255));
    let p = parse_one("request", line.as_bytes());
    let m = p.message(line.as_bytes());
    assert_eq!(m.list("keys").unwrap().len(), 255);
    assert_eq!(text(&m, "key"), Some(key.as_str()));
}

#[test]
fn other_commands() {
    // Bytes, command, key, and integer fields.
    type Case<'a> = (&'a [u8], &'a str, Option<&'a str>, &'a [(&'a str, i128)]);
    let cases: &[Case] = &[
        (
            TOUCH,
            "touch",
            Some("k"),
            &[("exptime", 10), ("noreply", 0)],
        ),
        (
            TOUCH_NOREPLY,
            "touch",
            Some("k"),
            &[("exptime", 10), ("noreply", 1)],
        ),
        (DELETE, "delete", Some("k"), &[("noreply", 0)]),
        (DELETE_NOREPLY, "delete", Some("k"), &[("noreply", 1)]),
        (INCR, "incr", Some("n"), &[("value", 5), ("noreply", 0)]),
        (
            DECR_NOREPLY,
            "decr",
            Some("n"),
            &[("value", u64::MAX as i128), ("noreply", 1)],
        ),
        (FLUSH, "flush_all", None, &[("noreply", 0)]),
        (
            FLUSH_DELAY,
            "flush_all",
            None,
            &[("delay", 60), ("noreply", 0)],
        ),
        (FLUSH_NOREPLY, "flush_all", None, &[("noreply", 1)]),
        (
            FLUSH_BOTH,
            "flush_all",
            None,
            &[("delay", 60), ("noreply", 1)],
        ),
        (
            VERBOSITY,
            "verbosity",
            None,
            &[("level", 1), ("noreply", 0)],
        ),
        (
            VERBOSITY_NOREPLY,
            "verbosity",
            None,
            &[("level", 2), ("noreply", 1)],
        ),
        (VERSION, "version", None, &[]),
        (STATS, "stats", None, &[]),
        (QUIT, "quit", None, &[]),
    ];
    for (bytes, command, key, ints) in cases {
        let p = parse_one("request", bytes);
        let m = p.message(bytes);
        let what = String::from_utf8_lossy(bytes);
        assert_eq!(text(&m, "command"), Some(*command), "{what}");
        assert_eq!(text(&m, "key"), *key, "{what}");
        for (name, v) in *ints {
            assert_eq!(m.int(name), Some(*v), "{name} of {what}");
        }
    }
    for bytes in [FLUSH, FLUSH_NOREPLY] {
        let p = parse_one("request", bytes);
        assert!(matches!(p.message(bytes).get("delay"), Value::Absent));
    }
    let p = parse_one("request", STATS);
    assert_eq!(tokens(&p.message(STATS), "args"), Vec::<String>::new());
    let p = parse_one("request", STATS_ARGS);
    assert_eq!(
        tokens(&p.message(STATS_ARGS), "args"),
        ["cachedump", "1", "10"]
    );
}

#[test]
fn meta_commands() {
    let p = parse_one("request", MG);
    let m = p.message(MG);
    assert_eq!(text(&m, "command"), Some("mg"));
    assert_eq!(text(&m, "key"), Some("foo"));
    assert_eq!(tokens(&m, "meta_flags"), ["s", "v", "t", "f", "k", "O123"]);
    assert_eq!(m.int("noreply"), Some(0));

    let p = parse_one("request", MG_BARE);
    let m = p.message(MG_BARE);
    assert_eq!(text(&m, "key"), Some("foo"));
    assert!(tokens(&m, "meta_flags").is_empty());

    let p = parse_one("request", MS);
    let m = p.message(MS);
    assert_eq!(text(&m, "command"), Some("ms"));
    assert_eq!(text(&m, "key"), Some("foo"));
    assert_eq!(m.int("bytes"), Some(2), "datalen");
    assert_eq!(tokens(&m, "meta_flags"), ["T90", "F5", "I"]);
    assert_eq!(text(&m, "data"), Some("hi"));

    let p = parse_one("request", MS_QUIET);
    let m = p.message(MS_QUIET);
    assert_eq!((m.int("bytes"), m.int("noreply")), (Some(0), Some(1)));
    assert_eq!(text(&m, "data"), Some(""));

    let p = parse_one("request", MD);
    let m = p.message(MD);
    assert_eq!(text(&m, "command"), Some("md"));
    assert_eq!(tokens(&m, "meta_flags"), ["q"]);
    assert_eq!(m.int("noreply"), Some(1));

    let p = parse_one("request", MA);
    let m = p.message(MA);
    assert_eq!(text(&m, "command"), Some("ma"));
    assert_eq!(tokens(&m, "meta_flags"), ["N0", "J10", "D5", "MI", "v"]);

    let p = parse_one("request", MN);
    assert_eq!(text(&p.message(MN), "command"), Some("mn"));
    assert!(matches!(p.message(MN).get("key"), Value::Absent));

    let p = parse_one("request", ME);
    let m = p.message(ME);
    assert_eq!(
        (text(&m, "command"), text(&m, "key")),
        (Some("me"), Some("foo"))
    );
}

#[test]
fn replies() {
    let p = parse_one("response", VALUE);
    let m = p.message(VALUE);
    assert_eq!(text(&m, "reply"), Some("VALUE"));
    assert_eq!(text(&m, "key"), Some("foo"));
    assert_eq!((m.int("flags"), m.int("bytes")), (Some(0), Some(3)));
    assert!(matches!(m.get("cas"), Value::Absent));
    assert_eq!(text(&m, "data"), Some("bar"));

    let p = parse_one("response", VALUE_CAS);
    let m = p.message(VALUE_CAS);
    assert_eq!((m.int("flags"), m.int("bytes")), (Some(5), Some(4)));
    assert_eq!(m.int("cas"), Some(99));
    assert_eq!(text(&m, "data"), Some("\r\nab"));

    let p = parse_one("response", VALUE_EMPTY);
    assert_eq!(text(&p.message(VALUE_EMPTY), "data"), Some(""));

    for r in SIMPLE_REPLIES {
        let bytes = format!("{r}\r\n");
        let p = parse_one("response", bytes.as_bytes());
        assert_eq!(text(&p.message(bytes.as_bytes()), "reply"), Some(*r));
    }

    for (bytes, reply, message) in [
        (CLIENT_ERROR, "CLIENT_ERROR", "bad data chunk"),
        (SERVER_ERROR, "SERVER_ERROR", "out of memory storing object"),
    ] {
        let p = parse_one("response", bytes);
        let m = p.message(bytes);
        assert_eq!(text(&m, "reply"), Some(reply));
        assert_eq!(text(&m, "message"), Some(message));
    }

    let p = parse_one("response", STAT);
    let m = p.message(STAT);
    assert_eq!(
        (text(&m, "name"), text(&m, "stat")),
        (Some("pid"), Some("1234"))
    );
    let p = parse_one("response", STAT_SPACES);
    let m = p.message(STAT_SPACES);
    assert_eq!(text(&m, "stat"), Some("1.6.21 (beta)"));

    let p = parse_one("response", VERSION_REPLY);
    assert_eq!(text(&p.message(VERSION_REPLY), "version"), Some("1.6.21"));

    let p = parse_one("response", NUMBER);
    assert_eq!(p.message(NUMBER).int("number"), Some(u64::MAX as i128));
    let p = parse_one("response", NUMBER_PADDED);
    assert_eq!(p.message(NUMBER_PADDED).int("number"), Some(9));
}

#[test]
fn meta_replies() {
    let p = parse_one("response", HD);
    let m = p.message(HD);
    assert_eq!(text(&m, "reply"), Some("HD"));
    assert!(tokens(&m, "meta_flags").is_empty());

    let p = parse_one("response", HD_FLAGS);
    assert_eq!(
        tokens(&p.message(HD_FLAGS), "meta_flags"),
        ["c5", "kfoo", "O123"]
    );

    let p = parse_one("response", VA);
    let m = p.message(VA);
    assert_eq!(text(&m, "reply"), Some("VA"));
    assert_eq!(m.int("bytes"), Some(2));
    assert_eq!(tokens(&m, "meta_flags"), ["s2", "f0", "t-1"]);
    assert_eq!(text(&m, "data"), Some("hi"));

    let p = parse_one("response", VA_EMPTY);
    assert_eq!(text(&p.message(VA_EMPTY), "data"), Some(""));

    for (bytes, reply, flags) in [
        (NF, "NF", &[][..]),
        (NS, "NS", &["O1"][..]),
        (EX, "EX", &["c7"][..]),
    ] {
        let p = parse_one("response", bytes);
        let m = p.message(bytes);
        assert_eq!(text(&m, "reply"), Some(reply));
        assert_eq!(tokens(&m, "meta_flags"), flags);
    }

    let p = parse_one("response", ME_REPLY);
    let m = p.message(ME_REPLY);
    assert_eq!(text(&m, "key"), Some("foo"));
    assert_eq!(
        tokens(&m, "meta_flags"),
        ["exp=-1", "la=3", "cas=2", "fetch=no", "cls=1", "size=63"]
    );
}

/// Parses a stream of messages the way a proxy does: one message from the
/// start of its bytes, `Done(n)`, advance by n and `reset`. Returns each
/// message as text.
fn parse_stream(unit: &str, stream: &[u8]) -> Vec<String> {
    let mut p = parser(unit);
    let mut out = Vec::new();
    let mut at = 0;
    while at < stream.len() {
        match p.parse(&stream[at..]).unwrap() {
            Progress::Done(n) => {
                out.push(format!("{:?}", p.message(&stream[at..])));
                at += n;
                p.reset();
            }
            other => panic!("{other:?} at {at}"),
        }
    }
    out
}

#[test]
fn pipelined_requests_in_one_buffer() {
    let stream = REQUESTS.concat();
    let seen = parse_stream("request", &stream);
    assert_eq!(seen.len(), REQUESTS.len());
    for (msg, bytes) in seen.iter().zip(REQUESTS) {
        let p = parse_one("request", bytes);
        assert_eq!(msg, &format!("{:?}", p.message(bytes)));
    }
    // A get, a set whose data looks like a command, and a delete.
    let stream = b"get a b\r\nset k 0 0 9\r\nget x y\r\n\r\ndelete k\r\n";
    let seen = parse_stream("request", stream);
    assert_eq!(seen.len(), 3);
    assert!(seen[1].contains(r#"data: "get x y\r\n""#), "{}", seen[1]);
    assert!(seen[2].contains(r#"command: "delete""#), "{}", seen[2]);
}

/// Feeds `stream` in the given pieces, following the caller contract: the
/// message's bytes stay contiguous from its first byte; after `NeedMore`
/// the same prefix and more is passed; after `Done(n)` the buffer advances
/// by n and the parser is reset.
fn feed(unit: &str, pieces: &[&[u8]]) -> Vec<String> {
    let mut p = parser(unit);
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match p.parse(&buf).unwrap() {
                Progress::NeedMore => break,
                Progress::Done(n) => {
                    out.push(format!("{:?}", p.message(&buf)));
                    buf.drain(..n);
                    p.reset();
                    if buf.is_empty() {
                        break;
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert!(
        buf.is_empty(),
        "left over: {:?}",
        String::from_utf8_lossy(&buf)
    );
    out
}

fn split_reads(unit: &str, messages: &[&[u8]]) {
    let stream = messages.concat();
    let whole = parse_stream(unit, &stream);
    assert_eq!(whole.len(), messages.len());
    for k in 0..=stream.len() {
        let (a, b) = stream.split_at(k);
        assert_eq!(feed(unit, &[a, b]), whole, "split at {k}");
    }
    let bytes: Vec<&[u8]> = stream.chunks(1).collect();
    assert_eq!(feed(unit, &bytes), whole, "one byte at a time");
    for k in 2..7 {
        let pieces: Vec<&[u8]> = stream.chunks(k).collect();
        assert_eq!(feed(unit, &pieces), whole, "{k} bytes at a time");
    }
}

#[test]
fn reads_split_at_every_byte() {
    split_reads(
        "request",
        &[
            SET_NOREPLY,
            GETS_MANY,
            CAS,
            APPEND,
            GAT,
            FLUSH_BOTH,
            MS,
            MG,
            VERSION,
            DELETE_NOREPLY,
            INCR,
            STATS_ARGS,
            MN,
        ],
    );
    split_reads(
        "response",
        &[
            VALUE_CAS,
            VALUE,
            b"END\r\n",
            STAT_SPACES,
            NUMBER_PADDED,
            CLIENT_ERROR,
            VA,
            HD_FLAGS,
            b"STORED\r\n",
            ME_REPLY,
            b"EN\r\n",
        ],
    );
}

fn reserialize(unit: &str, bytes: &[u8]) -> Vec<u8> {
    let g = grammar();
    let p = parse_one(unit, bytes);
    let mut slots = p.slots().to_vec();
    let mut out = Vec::new();
    g.serialize(p.unit(), &mut slots, bytes, &mut out).unwrap();
    out
}

#[test]
fn serialising_a_parse_reproduces_the_bytes() {
    for bytes in REQUESTS {
        assert_eq!(
            String::from_utf8_lossy(&reserialize("request", bytes)),
            String::from_utf8_lossy(bytes)
        );
    }
    for bytes in responses() {
        assert_eq!(
            String::from_utf8_lossy(&reserialize("response", &bytes)),
            String::from_utf8_lossy(&bytes)
        );
    }
}

#[test]
fn built_messages_recompute_the_length() {
    let g = grammar();
    let mut b = Builder::new(g.clone(), g.unit_id("request").unwrap());
    b.set_bytes("command", b"set");
    b.set_bytes("key", b"greeting");
    // The numbers are tokens, checked and converted when parsed; the
    // length is written as given.
    b.set_bytes("flags_token", b"7");
    b.set_bytes("exptime_token", b"-1");
    b.set_bytes("bytes_token", b"12");
    b.set_bytes("data", b"hello\r\nworld");
    let mut out = Vec::new();
    b.serialize(&mut out).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out),
        "set greeting 7 -1 12\r\nhello\r\nworld\r\n"
    );

    // A key a token cannot hold is refused, not written.
    b.set_bytes("key", b"two words");
    assert_eq!(
        b.serialize(&mut Vec::new()).unwrap_err().kind,
        WireErrorKind::Invalid
    );

    // Replies a proxy or cache answers with.
    let unit = g.unit_id("response").unwrap();
    let mut b = Builder::new(g.clone(), unit);
    b.set_bytes("reply", b"VALUE");
    b.set_bytes("key", b"k");
    b.set_int("flags", 3);
    b.set_bytes("data", b"abc");
    let mut out = Vec::new();
    b.serialize(&mut out).unwrap();
    assert_eq!(String::from_utf8_lossy(&out), "VALUE k 3 3\r\nabc\r\n");

    let mut b = Builder::new(g.clone(), unit);
    b.set_bytes("reply", b"CLIENT_ERROR");
    b.set_bytes("message", b"bad command line format");
    let mut out = Vec::new();
    b.serialize(&mut out).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out),
        "CLIENT_ERROR bad command line format\r\n"
    );

    let mut b = Builder::new(g.clone(), unit);
    b.set_bytes("reply", b"STORED");
    let mut out = Vec::new();
    b.serialize(&mut out).unwrap();
    assert_eq!(out, b"STORED\r\n");
}

#[test]
fn malformed_requests_are_errors() {
    let long_key = "k".repeat(251);
    let cases: Vec<(String, WireErrorKind, Option<u16>)> = vec![
        // A key over 250 bytes: read up to 2048 bytes, then refused by
        // length, as memcached words it; a missing key is ERROR.
        (
            format!("set {long_key} 0 0 1\r\nx\r\n"),
            WireErrorKind::Invalid,
            Some(1),
        ),
        ("set \r\n".into(), WireErrorKind::Mismatch, None),
        ("delete  \n".into(), WireErrorKind::Mismatch, None),
        ("mg \r\n".into(), WireErrorKind::Mismatch, None),
        // A get's key too: read up to 2048 bytes, then refused by length.
        (
            format!("get a {long_key}\r\n"),
            WireErrorKind::Invalid,
            Some(1),
        ),
        (
            format!("mg {long_key} v\r\n"),
            WireErrorKind::Invalid,
            Some(1),
        ),
        // A length, or another number, that is not one, in a line of
        // enough tokens (each is read as a token, then checked).
        (
            "set k 0 0 abc\r\nabc\r\n".into(),
            WireErrorKind::Invalid,
            Some(1),
        ),
        (
            "set k 0 0 -3\r\nabc\r\n".into(),
            WireErrorKind::Invalid,
            Some(1),
        ),
        (
            "set k x 0 3\r\nabc\r\n".into(),
            WireErrorKind::Invalid,
            Some(1),
        ),
        (
            "cas k 0 0 3 x\r\nabc\r\n".into(),
            WireErrorKind::Invalid,
            Some(1),
        ),
        // Too few tokens is no status (ERROR), whatever they hold.
        ("set k abc\r\n".into(), WireErrorKind::Mismatch, None),
        ("set k 0 abc\n".into(), WireErrorKind::Mismatch, None),
        ("cas k 0 0 abc\r\n".into(), WireErrorKind::Mismatch, None),
        ("incr k -1\r\n".into(), WireErrorKind::Invalid, Some(4)),
        (
            "incr k 18446744073709551616\r\n".into(),
            WireErrorKind::Invalid,
            Some(4),
        ),
        ("ms k two\r\nhi\r\n".into(), WireErrorKind::Invalid, Some(1)),
        ("flush_all soon\r\n".into(), WireErrorKind::Invalid, None),
        // A data block not followed by "\r\n", or over 1 MiB.
        (
            "set k 0 0 3\r\nabcd\r\n".into(),
            WireErrorKind::Mismatch,
            Some(3),
        ),
        (
            "ms k 1 T0\r\nab\r\n".into(),
            WireErrorKind::Mismatch,
            Some(3),
        ),
        (
            "set k 0 0 1048577\r\n".into(),
            WireErrorKind::TooLong { max: 1048576 },
            Some(2),
        ),
        // Unknown commands (names are case-sensitive).
        ("bogus k\r\n".into(), WireErrorKind::NoCase, None),
        ("GET k\r\n".into(), WireErrorKind::NoCase, None),
        ("\r\n".into(), WireErrorKind::Mismatch, None),
        (
            "lru_crawler_metadump all\r\n".into(),
            WireErrorKind::TooLong { max: 16 },
            None,
        ),
        // Missing, extra or misplaced arguments.
        ("get\r\n".into(), WireErrorKind::Invalid, None),
        ("get \r\n".into(), WireErrorKind::Invalid, None),
        ("get  \n".into(), WireErrorKind::Invalid, None),
        ("set k 0 0\r\nabc\r\n".into(), WireErrorKind::Mismatch, None),
        (
            "cas k 0 0 3\r\nabc\r\n".into(),
            WireErrorKind::Mismatch,
            None,
        ),
        (
            "delete k noreply noreply\r\n".into(),
            WireErrorKind::Invalid,
            Some(5),
        ),
        // memcached reads `delete k 0 noreply` (and `delete k 0`).
        (
            "delete k 0 noreply extra\r\n".into(),
            WireErrorKind::TooMany { max: 2 },
            None,
        ),
        ("touch k\r\n".into(), WireErrorKind::Mismatch, None),
        ("flush_all 1 2\r\n".into(), WireErrorKind::NoCase, None),
        (
            "flush_all noreply 10\r\n".into(),
            WireErrorKind::NoCase,
            None,
        ),
        (
            "flush_all noreply noreply\r\n".into(),
            WireErrorKind::Invalid,
            None,
        ),
        ("verbosity 1 2 3\r\n".into(), WireErrorKind::NoCase, None),
    ];
    for (bytes, kind, status) in cases {
        let e = parse_err("request", bytes.as_bytes());
        assert_eq!(e.kind, kind, "{bytes:?}: {e}");
        assert_eq!(e.status, status, "{bytes:?}: {e}");
    }
}

#[test]
fn malformed_replies_are_errors() {
    for (bytes, kind) in [
        (&b"FOO\r\n"[..], WireErrorKind::Invalid),
        (b"STORED \r\n", WireErrorKind::Mismatch),
        (b"VALUE k 0 3\r\nabcd\r\n", WireErrorKind::Mismatch),
        (b"VALUE k 0\r\n", WireErrorKind::Mismatch),
        (b"VALUE k 0 1 x\r\na\r\n", WireErrorKind::BadNumber),
        (b"VA x\r\n", WireErrorKind::BadNumber),
        (b"CLIENT_ERROR\r\n", WireErrorKind::Mismatch),
        (b"12a\r\n", WireErrorKind::Invalid),
    ] {
        let e = parse_err("response", bytes);
        assert_eq!(e.kind, kind, "{:?}: {e}", String::from_utf8_lossy(bytes));
    }
}

#[test]
fn lines_that_never_end_are_refused_early() {
    // Each bounded field gives up once it is over its limit, rather than
    // waiting for the rest of an endless line.
    for stream in [
        format!("get {}", "k".repeat(2100)),
        "x".repeat(100),
        format!("set k 0 0 {}", "1".repeat(100)),
        format!("get{}", " k".repeat(300)),
        format!("STAT name {}", "v".repeat(5000)),
    ] {
        let mut p = parser(if stream.starts_with("STAT") {
            "response"
        } else {
            "request"
        });
        assert!(p.parse(stream.as_bytes()).is_err(), "{stream:.40}");
    }
}

fn key() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[!-~]{1,250}").unwrap()
}

proptest! {
    #[test]
    fn formatted_storage_requests_parse_back(
        command in prop::sample::select(vec!["set", "add", "replace", "append", "prepend", "cas"]),
        key in key(),
        flags in any::<u32>(),
        exptime in any::<i64>(),
        cas in any::<u64>(),
        data in proptest::collection::vec(any::<u8>(), 0..200),
        noreply in any::<bool>(),
    ) {
        let mut line = format!("{command} {key} {flags} {exptime} {}", data.len());
        if command == "cas" {
            line += &format!(" {cas}");
        }
        if noreply {
            line += " noreply";
        }
        let mut bytes = format!("{line}\r\n").into_bytes();
        bytes.extend_from_slice(&data);
        bytes.extend_from_slice(b"\r\n");
        let p = parse_one("request", &bytes);
        let m = p.message(&bytes);
        prop_assert_eq!(m.bytes("command"), Some(command.as_bytes()));
        prop_assert_eq!(m.bytes("key"), Some(key.as_bytes()));
        prop_assert_eq!(m.int("flags"), Some(flags as i128));
        prop_assert_eq!(m.int("exptime"), Some(exptime as i128));
        prop_assert_eq!(m.int("bytes"), Some(data.len() as i128));
        prop_assert_eq!(m.int("cas"), (command == "cas").then_some(cas as i128));
        prop_assert_eq!(m.int("noreply"), Some(noreply as i128));
        prop_assert_eq!(m.bytes("data"), Some(&data[..]));
        prop_assert_eq!(reserialize("request", &bytes), bytes);
    }

    #[test]
    fn built_set_requests_parse_back(
        key in key(),
        flags in any::<u32>(),
        exptime in any::<i64>(),
        data in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let g = grammar();
        let mut b = Builder::new(g.clone(), g.unit_id("request").unwrap());
        b.set_bytes("command", b"set");
        b.set_bytes("key", key.as_bytes());
        b.set_bytes("flags_token", flags.to_string().as_bytes());
        b.set_bytes("exptime_token", exptime.to_string().as_bytes());
        b.set_bytes("bytes_token", data.len().to_string().as_bytes());
        b.set_bytes("data", &data);
        let mut out = Vec::new();
        b.serialize(&mut out).unwrap();
        let mut want = format!("set {key} {flags} {exptime} {}\r\n", data.len()).into_bytes();
        want.extend_from_slice(&data);
        want.extend_from_slice(b"\r\n");
        prop_assert_eq!(&out, &want);
        let p = parse_one("request", &out);
        let m = p.message(&out);
        prop_assert_eq!(m.bytes("key"), Some(key.as_bytes()));
        prop_assert_eq!(m.int("exptime"), Some(exptime as i128));
        prop_assert_eq!(m.bytes("data"), Some(&data[..]));
    }

    #[test]
    fn formatted_gets_parse_back(
        command in prop::sample::select(vec!["get", "gets", "gat", "gats"]),
        exptime in -100i64..100_000,
        keys in proptest::collection::vec(key(), 1..20),
    ) {
        let mut line = command.to_string();
        if command.starts_with("gat") {
            line += &format!(" {exptime}");
        }
        for k in &keys {
            line += &format!(" {k}");
        }
        let bytes = format!("{line}\r\n").into_bytes();
        let p = parse_one("request", &bytes);
        let m = p.message(&bytes);
        prop_assert_eq!(tokens(&m, "keys"), keys.clone());
        prop_assert_eq!(m.bytes("key"), Some(keys[0].as_bytes()));
        if command.starts_with("gat") {
            prop_assert_eq!(m.int("exptime"), Some(exptime as i128));
        }
        prop_assert_eq!(reserialize("request", &bytes), bytes);
    }

    #[test]
    fn formatted_value_replies_parse_back(
        key in key(),
        flags in any::<u32>(),
        cas in proptest::option::of(any::<u64>()),
        data in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut line = format!("VALUE {key} {flags} {}", data.len());
        if let Some(c) = cas {
            line += &format!(" {c}");
        }
        let mut bytes = format!("{line}\r\n").into_bytes();
        bytes.extend_from_slice(&data);
        bytes.extend_from_slice(b"\r\n");
        let p = parse_one("response", &bytes);
        let m = p.message(&bytes);
        prop_assert_eq!(m.bytes("key"), Some(key.as_bytes()));
        prop_assert_eq!(m.int("flags"), Some(flags as i128));
        prop_assert_eq!(m.int("cas"), cas.map(|c| c as i128));
        prop_assert_eq!(m.bytes("data"), Some(&data[..]));
        prop_assert_eq!(reserialize("response", &bytes), bytes);
    }

    /// Whatever the bytes, parsing ends in a value, a request for more, or
    /// an error; never a panic. What parses serialises to bytes that parse
    /// to the same values (numbers lose leading zeros).
    #[test]
    fn arbitrary_bytes_never_panic(
        unit in prop::sample::select(vec!["request", "response"]),
        fixture in 0usize..64,
        cut in 0usize..64,
        noise in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let all: Vec<Vec<u8>> = REQUESTS.iter().map(|b| b.to_vec()).chain(responses()).collect();
        let mut bytes = all[fixture % all.len()].clone();
        let cut = cut.min(bytes.len());
        bytes.truncate(cut);
        bytes.extend_from_slice(&noise);
        let mut p = parser(unit);
        if let Ok(Progress::Done(n)) = p.parse(&bytes) {
            let mut slots = p.slots().to_vec();
            let mut out = Vec::new();
            grammar().serialize(p.unit(), &mut slots, &bytes, &mut out).unwrap();
            let again = parse_one(unit, &out);
            prop_assert_eq!(
                format!("{:?}", again.message(&out)),
                format!("{:?}", p.message(&bytes[..n]))
            );
        }
    }
}

/// The engine features this grammar relies on: `&before_any` tokens,
/// signed ASCII integers that must fit their type, `elem`, and a variable
/// shared by switch cases.
#[test]
fn engine_features() {
    let g = Arc::new(
        Grammar::from_source(
            "t",
            r#"
            type arg = unit { : " "; v : bytes &before_any = " ;" &max = 3; };
            type t = unit {
                a : int8 &ascii &before_any = " ;";
                : " ";
                b : uint8 &ascii &until = ",";
                args : arg[] &until = ";" &max = 2;
                switch ( len(self.args) ) {
                    0 -> var last : bytes &parse = elem(self.args, 0, "v");
                    * -> var last : bytes &parse = elem(self.args, len(self.args) - 1, "v");
                };
            };
            "#,
        )
        .unwrap(),
    );
    let unit = g.unit_id("t").unwrap();
    let parse = |s: &str| {
        let mut p = g.parser(unit);
        p.parse(s.as_bytes()).map(|r| {
            assert_eq!(r, Progress::Done(s.len()), "{s}");
            format!("{:?}", p.message(s.as_bytes()))
        })
    };
    assert_eq!(
        parse("-128 255, x yz;").unwrap(),
        r#"t { a: -128, b: 255, args: [arg { v: "x" }, arg { v: "yz" }], last: "yz" }"#
    );
    assert_eq!(
        parse("127 0,;").unwrap(),
        r#"t { a: 127, b: 0, args: [], last: - }"#
    );
    for (bad, kind) in [
        ("-129 0,;", WireErrorKind::BadNumber),
        ("128 0,;", WireErrorKind::BadNumber),
        ("1 256,;", WireErrorKind::BadNumber),
        ("1 -1,;", WireErrorKind::BadNumber),
        ("- 1,;", WireErrorKind::BadNumber),
        (" 1,;", WireErrorKind::BadNumber),
        ("1 1, ;", WireErrorKind::Mismatch),
        ("1 1, abcd;", WireErrorKind::TooLong { max: 3 }),
    ] {
        assert_eq!(parse(bad).unwrap_err().kind, kind, "{bad}");
    }
    let mut p = g.parser(unit);
    assert_eq!(p.parse(b"1 1, ab").unwrap(), Progress::NeedMore);
}

/// What a proxy reads off requests and replies: a get of several keys
/// splits into one get per key, keyless commands go to every backend,
/// `noreply` requests expect nothing, VALUE and STAT lines are followed by
/// more of their reply, and a dead backend's reply is a SERVER_ERROR.
#[test]
fn routing_properties() {
    let g = grammar();
    let req = g.unit_id("request").unwrap();
    let prop = |bytes: &[u8], name: &str| {
        let p = parse_one("request", bytes);
        g.property(req, name, p.slots(), bytes).unwrap_or(0)
    };
    let parts = |bytes: &[u8]| g.split_parts(req, parse_one("request", bytes).slots());
    assert_eq!(parts(b"get a bb ccc\r\n"), 3);
    assert_eq!(parts(b"gets a\r\n"), 1);
    assert_eq!(parts(b"gat 10 a b\r\n"), 2);
    // Other lists (arguments, flags) never split a request.
    assert_eq!(parts(b"stats slabs items\r\n"), 1);
    assert_eq!(parts(b"mg key v t f\r\n"), 1);
    assert_eq!(parts(b"set a 0 0 1 noreply\r\nx\r\n"), 1);
    let bytes = b"gat 10 a bb ccc\r\n";
    let p = parse_one("request", bytes);
    let mut scratch = Vec::new();
    let mut each = Vec::new();
    for i in 0..3 {
        let mut out = Vec::new();
        g.split_part(req, p.slots(), bytes, i, &mut scratch, &mut out)
            .unwrap();
        each.push(String::from_utf8(out).unwrap());
    }
    // Each key keeps the spaces after it, which memcached skips.
    assert_eq!(each, ["gat 10 a \r\n", "gat 10 bb \r\n", "gat 10 ccc\r\n"]);
    assert_eq!(prop(b"flush_all\r\n", "broadcast"), 1);
    assert_eq!(prop(b"stats\r\n", "broadcast"), 1);
    assert_eq!(prop(b"version\r\n", "broadcast"), 1);
    assert_eq!(prop(b"get a\r\n", "broadcast"), 0);
    assert_eq!(prop(b"set a 0 0 1 noreply\r\nx\r\n", "quiet"), 1);
    assert_eq!(prop(b"delete a noreply\r\n", "quiet"), 1);
    assert_eq!(prop(b"delete a\r\n", "quiet"), 0);
    // Meta commands with `q` are quiet too; the fence after a quiet
    // request is `mn`, whose `MN` ends the quiet request's replies.
    assert_eq!(prop(b"mg a v q\r\n", "quiet"), 1);
    assert_eq!(prop(b"ms a 1 q T0\r\nx\r\n", "quiet"), 1);
    assert_eq!(prop(b"mg a v\r\n", "quiet"), 0);
    assert_eq!(g.fence(req), Some(&b"mn\r\n"[..]));
    assert_eq!(prop(b"quit\r\n", "ends"), 1);
    let resp = g.unit_id("response").unwrap();
    let fenced = |bytes: &[u8]| {
        let p = parse_one("response", bytes);
        g.property(resp, "fenced", p.slots(), bytes).unwrap_or(0)
    };
    assert_eq!(fenced(b"MN\r\n"), 1);
    assert_eq!(fenced(b"EN\r\n"), 0);
    assert_eq!(fenced(b"END\r\n"), 0);
    let more = |bytes: &[u8]| {
        let p = parse_one("response", bytes);
        g.property(resp, "more", p.slots(), bytes).unwrap_or(0)
    };
    assert_eq!(more(b"VALUE a 0 1\r\nx\r\n"), 1);
    assert_eq!(more(b"STAT pid 1\r\n"), 1);
    assert_eq!(more(b"END\r\n"), 0);
    let unset = vec![flick_wire::Slot::Unset; g.unit(resp).slots as usize];
    let mut fault = Vec::new();
    assert!(g.fault_reply(resp, &unset, &[], 1, &mut fault).unwrap());
    assert_eq!(fault, b"SERVER_ERROR backend unavailable\r\n");
}

/// The reply to a request that does not parse is memcached's for its
/// error (`%reject`, through `choose`), and what the part that parsed says
/// of the rest: how much of a data block to drop (`%discard`) and whether
/// a `noreply` silences the reply (`%quiet_reject`).
#[test]
fn rejected_requests_get_memcacheds_replies() {
    let g = Grammar::stock("memcached_ascii").unwrap();
    let (req, resp) = (
        g.unit_id("request").unwrap(),
        g.unit_id("response").unwrap(),
    );
    let reply = |status: Option<u16>| {
        let mut out = Vec::new();
        assert!(g.reject_reply(resp, status, &mut out).unwrap());
        String::from_utf8(out).unwrap()
    };
    assert_eq!(reply(None), "ERROR\r\n");
    assert_eq!(reply(Some(1)), "CLIENT_ERROR bad command line format\r\n");
    assert_eq!(
        reply(Some(2)),
        "SERVER_ERROR object too large for cache\r\n"
    );
    assert_eq!(reply(Some(3)), "CLIENT_ERROR bad data chunk\r\n");
    assert_eq!(
        reply(Some(4)),
        "CLIENT_ERROR invalid numeric delta argument\r\n"
    );
    assert_eq!(
        reply(Some(5)),
        "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
    );
    // What the parsed part of a failed request says.
    let said = |bytes: &[u8], name: &str| {
        let mut p = g.parser(req);
        assert!(
            p.parse(bytes).is_err(),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
        g.property(req, name, p.slots(), bytes)
    };
    assert_eq!(said(b"set k 0 0 2000000\r\n", "discard"), Some(2_000_002));
    assert_eq!(said(b"set k 0 0 3\r\nabcde\r\n", "discard"), Some(5));
    assert_eq!(said(b"set k 0 0 x\r\n", "discard"), None);
    assert_eq!(said(b"bogus\r\n", "discard"), None);
    assert_eq!(
        said(b"set k 0 0 2000000 noreply\r\n", "quiet_reject"),
        Some(1)
    );
    assert_eq!(said(b"set k 0 0 2000000\r\n", "quiet_reject"), Some(0));
    assert_eq!(said(b"ms k 2000000 q\r\n", "quiet_reject"), Some(0));
}

/// A `set` or `ms` over the item size limit also drops the key's old item
/// in memcached: a proxy sends a quiet delete of the key in its place
/// (`%reject_send`, its `{key}` filled from what parsed); other storage
/// commands, and other errors, send nothing.
#[test]
fn an_oversized_set_sends_a_delete_in_its_place() {
    let g = grammar();
    let req = g.unit_id("request").unwrap();
    let sent = |bytes: &[u8]| {
        let mut p = g.parser(req);
        assert!(
            p.parse(bytes).is_err(),
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
        let mut out = b"kept".to_vec();
        let made = g.reject_send(req, p.slots(), bytes, &mut out);
        assert_eq!(made, out.len() > 4, "{:?}", String::from_utf8_lossy(&out));
        made.then(|| String::from_utf8(out[4..].to_vec()).unwrap())
    };
    let delete = Some("delete k-1 noreply\r\n".to_string());
    assert_eq!(sent(b"set k-1 0 0 2000000\r\n"), delete);
    assert_eq!(sent(b"set  k-1 0 0 1048577 noreply\r\n"), delete);
    assert_eq!(sent(b"ms k-1 1048577 q\r\n"), delete);
    assert_eq!(sent(b"add k-1 0 0 2000000\r\n"), None);
    assert_eq!(sent(b"cas k-1 0 0 2000000 1\r\n"), None);
    assert_eq!(sent(b"set k-1 0 0 3\r\nabcde\r\n"), None);
    assert_eq!(sent(b"set k-1 0 0 x\r\n"), None);
    assert_eq!(sent(b"bogus\r\n"), None);
    // What is sent parses as the quiet request it is.
    let mut p = g.parser(req);
    let delete = b"delete k-1 noreply\r\n";
    assert!(matches!(p.parse(delete), Ok(Progress::Done(n)) if n == delete.len()));
    assert_eq!(g.property(req, "quiet", p.slots(), delete), Some(1));
}

/// Requests as memcached 1.6 tokenises them (`tokenize_command`): runs of
/// spaces between tokens, spaces before the first token and after the
/// last, and a bare "\n" line end; a tab is a byte of its token.
#[test]
fn requests_are_tokenised_as_memcached_does() {
    type Case<'a> = (&'a [u8], &'a str, Option<&'a str>, &'a [(&'a str, i128)]);
    let cases: &[Case] = &[
        (
            b"set  k   1 0  3 \r\nabc\r\n",
            "set",
            Some("k"),
            &[("flags", 1), ("bytes", 3), ("noreply", 0)],
        ),
        (
            b"  set k 0 0 1  noreply  \nx\r\n",
            "set",
            Some("k"),
            &[("noreply", 1)],
        ),
        (b"get k\n", "get", Some("k"), &[]),
        (b"get   k  \r\n", "get", Some("k"), &[]),
        (
            b"incr  n  5\n",
            "incr",
            Some("n"),
            &[("value", 5), ("noreply", 0)],
        ),
        (
            b"delete k  0  noreply \n",
            "delete",
            Some("k"),
            &[("noreply", 1)],
        ),
        (b"mn\n", "mn", None, &[]),
        (b" version \n", "version", None, &[]),
        (b"mg  k  v   t\n", "mg", Some("k"), &[("noreply", 0)]),
        (b"get a\tb\r\n", "get", Some("a\tb"), &[]),
    ];
    for (bytes, command, key, ints) in cases {
        let p = parse_one("request", bytes);
        let m = p.message(bytes);
        let shown = String::from_utf8_lossy(bytes);
        assert_eq!(text(&m, "command"), Some(*command), "{shown:?}");
        assert_eq!(text(&m, "key"), *key, "{shown:?}");
        for (name, want) in *ints {
            assert_eq!(m.int(name), Some(*want), "{shown:?}: {name}");
        }
        // Written back with one space where a token must follow, and
        // read back the same.
        let again = reserialize("request", bytes);
        let q = parse_one("request", &again);
        let n = q.message(&again);
        assert_eq!(text(&n, "command"), Some(*command), "{shown:?}");
        assert_eq!(text(&n, "key"), *key, "{shown:?}");
    }
    assert_eq!(
        reserialize("request", b"  set  k   1 0  3 \r\nabc\r\n"),
        b"set k 1 0 3 \r\nabc\r\n"
    );
    // memcached answers a gat of no key with END: it parses, keyless.
    let p = parse_one("request", b"gat 10 \r\n");
    assert_eq!(text(&p.message(b"gat 10 \r\n"), "key"), None);
    let mut p = parse_one("request", b"get  a  bb\n");
    assert_eq!(tokens(&p.message(b"get  a  bb\n"), "keys"), ["a", "bb"]);
    p.reset();
    split_reads(
        "request",
        &[
            b"get  a  bb\n",
            b"  set k 0 0 1  noreply  \nx\r\n",
            b"mn\n",
            b"get k \r\n",
        ],
    );
}

/// A tab right after a space begins a key, as memcached reads it (spaces
/// alone separate tokens), and the parts of a split get keep the client's
/// spaces, written back as read.
#[test]
fn a_tab_after_a_space_begins_a_key() {
    let g = grammar();
    let bytes = b"get a \tb\r\n";
    let p = parse_one("request", bytes);
    assert_eq!(g.split_parts(p.unit(), p.slots()), 2);
    let part = |i| {
        let (mut scratch, mut out) = (Vec::new(), Vec::new());
        g.split_part(p.unit(), p.slots(), bytes, i, &mut scratch, &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    };
    assert_eq!(part(0), "get a \r\n");
    assert_eq!(part(1), "get \tb\r\n");
    assert_eq!(
        reserialize("request", b"get  a \tb  \r\n"),
        b"get  a \tb  \r\n"
    );
}

/// A `\r` is a line's end only just before its `\n` (`&before_also`):
/// anywhere else it is a byte of its token, as memcached reads it, and a
/// number is its digits up to such a `\r` (memcached's strtol stops at
/// it). Too few tokens is no status (memcached's `ERROR`) whatever they
/// hold; a bad number in a line of enough tokens is the client's error.
#[test]
fn a_lone_cr_is_a_byte_of_its_token() {
    type Case<'a> = (&'a [u8], &'a str, Option<&'a str>, &'a [(&'a str, i128)]);
    let cases: &[Case] = &[
        (b"set k 0 0 1\r\r\nx\r\n", "set", Some("k"), &[("bytes", 1)]),
        (b"set k 1\r 0 1\r\nx\r\n", "set", Some("k"), &[("flags", 1)]),
        (
            b"set k 0 0 1 noreply\r\r\nx\r\n",
            "set",
            Some("k"),
            &[("noreply", 0)],
        ),
        (
            b"set k 0 -1 1\r\nx\r\n",
            "set",
            Some("k"),
            &[("exptime", -1)],
        ),
        (
            b"set k 4294967296 0 1\r\nx\r\n",
            "set",
            Some("k"),
            &[("flags", 0)],
        ),
        (b"get k\r\r\n", "get", Some("k\r"), &[]),
        (b"get a\rb\r\n", "get", Some("a\rb"), &[]),
        (b"delete k\r\r\n", "delete", Some("k\r"), &[]),
        (b"incr k 1\r\r\n", "incr", Some("k"), &[("value", 1)]),
        (b"touch k -5\r\r\n", "touch", Some("k"), &[("exptime", -5)]),
        (b"ms k 2\r\r\nhi\r\n", "ms", Some("k"), &[("bytes", 2)]),
        // A leading `+` as strtol takes it.
        (
            b"set k +1 +0 +1\r\nx\r\n",
            "set",
            Some("k"),
            &[("flags", 1), ("exptime", 0), ("bytes", 1)],
        ),
        (b"incr k +2\r\n", "incr", Some("k"), &[("value", 2)]),
        (b"touch k +5\r\n", "touch", Some("k"), &[("exptime", 5)]),
        (b"gat -5 k\r\n", "gat", Some("k"), &[("exptime", -5)]),
        // memcached reads a meta flag by its first byte: `q\r` is quiet.
        (b"mg k v q\r\r\n", "mg", Some("k"), &[("noreply", 1)]),
    ];
    for (bytes, command, key, ints) in cases {
        let p = parse_one("request", bytes);
        let m = p.message(bytes);
        let shown = String::from_utf8_lossy(bytes);
        assert_eq!(text(&m, "command"), Some(*command), "{shown:?}");
        assert_eq!(text(&m, "key"), *key, "{shown:?}");
        for (name, want) in *ints {
            assert_eq!(m.int(name), Some(*want), "{shown:?}: {name}");
        }
        assert_eq!(reserialize("request", bytes), *bytes, "{shown:?}");
    }
    // `version\r` is not a command; a key of a lone `\r` is one.
    assert_eq!(
        parse_err("request", b"version\r\r\n").kind,
        WireErrorKind::NoCase
    );
    let p = parse_one("request", b"get k \r\r\n");
    assert_eq!(tokens(&p.message(b"get k \r\r\n"), "keys"), ["k", "\r"]);
    for (bytes, status) in [
        (&b"set k abc\r\n"[..], None),
        (b"set k 0 abc\n", None),
        (b"cas k 0 0 abc\r\n", None),
        (b"set k 0 0 abc\r\n", Some(1)),
        (b"set k abc 0 1\r\n", Some(1)),
        (b"set k 0 0 1x\r\n", Some(1)),
        (b"set k 0 0 +-1\r\n", Some(1)),
        (b"set k -1 0 1\r\n", Some(1)),
        (b"incr k -1\r\n", Some(4)),
        (b"touch k 1+\r\n", Some(7)),
    ] {
        let e = parse_err("request", bytes);
        assert_eq!(
            e.status,
            status,
            "{:?}: {e}",
            String::from_utf8_lossy(bytes)
        );
    }
    // A `\r` at the end of what has come may begin the line's end.
    split_reads(
        "request",
        &[
            b"get k\r\r\n",
            b"set k 0 0 1\r\r\nx\r\n",
            b"get a\rb \r\n",
            b"mg k\r v\r\n",
        ],
    );
}

/// memcached reads a meta flag by its token's first byte (the rest is
/// its argument), so any token beginning with `q` is quiet, wherever it
/// stands among the flags; `Q` is no flag, and a `q` inside a token is
/// an argument.
#[test]
fn a_meta_flag_beginning_with_q_is_quiet() {
    let cases: &[(&[u8], i128)] = &[
        (b"mg k v qx\r\n", 1),
        (b"mg k qfoo\r\n", 1),
        (b"mg k O123 qq v\r\n", 1),
        (b"md k q1 O8\r\n", 1),
        (b"ma k qa\r\n", 1),
        (b"ms k 1 T0 qx O1\r\nz\r\n", 1),
        (b"mg k v Q\r\n", 0),
        (b"mg k Oq vq\r\n", 0),
        (b"mg k v\r\n", 0),
    ];
    for (bytes, quiet) in cases {
        let p = parse_one("request", bytes);
        let m = p.message(bytes);
        let shown = String::from_utf8_lossy(bytes);
        assert_eq!(m.int("noreply"), Some(*quiet), "{shown:?}");
        // The tokens themselves are kept whole, as the client wrote them.
        assert_eq!(reserialize("request", bytes), *bytes, "{shown:?}");
    }
}

/// `prefix(b, n)`: the first n bytes, all of b when shorter, a failure
/// for a negative n.
#[test]
fn prefix_takes_the_first_bytes() {
    const GRAMMAR: &str = r#"grammar prefixes;
type m = unit {
    word : bytes &before_any = "\n" &max = 64;
    : "\n";
    var one : bytes &parse = prefix(self.word, 1);
    var three : bytes &parse = prefix(self.word, 3);
    var none : bytes &parse = prefix(self.word, 0);
    var q : uint8 &parse = prefix(self.word, 1) == "q";
    : bytes &length = 0 &requires = len(prefix(self.word, len(self.word) - 4)) >= 0;
};
"#;
    let g = Arc::new(Grammar::from_source("prefixes", GRAMMAR).unwrap());
    let unit = g.unit_id("m").unwrap();
    let mut p = g.parser(unit);
    let msg = b"qfoo\n";
    assert!(matches!(p.parse(msg), Ok(Progress::Done(5))));
    let m = p.message(msg);
    assert_eq!(m.bytes("one"), Some(&b"q"[..]));
    assert_eq!(m.bytes("three"), Some(&b"qfo"[..]));
    assert_eq!(m.bytes("none"), Some(&b""[..]));
    assert_eq!(m.int("q"), Some(1));
    // A word of three bytes asks for a prefix of -1: the check fails.
    let mut p = g.parser(unit);
    assert!(p.parse(b"Qfo\n").is_err());
    let mut p = g.parser(unit);
    let msg = b"Qfoo\n";
    assert!(matches!(p.parse(msg), Ok(Progress::Done(5))));
    assert_eq!(p.message(msg).int("q"), Some(0));
}

proptest! {
    /// Any flag token, among any others: the request is quiet exactly
    /// when some token's first byte is `q`.
    #[test]
    fn quiet_is_a_flag_token_beginning_with_q(
        command in prop::sample::select(vec!["mg", "md", "ma", "ms"]),
        flags in proptest::collection::vec("[a-zA-Z0-9q]{1,6}", 0..6),
    ) {
        let mut line = format!("{command} k");
        if command == "ms" {
            line.push_str(" 1");
        }
        for f in &flags {
            line.push(' ');
            line.push_str(f);
        }
        line.push_str("\r\n");
        if command == "ms" {
            line.push_str("z\r\n");
        }
        let bytes = line.as_bytes();
        let p = parse_one("request", bytes);
        let quiet = flags.iter().any(|f| f.starts_with('q'));
        prop_assert_eq!(p.message(bytes).int("noreply"), Some(i128::from(quiet)));
    }
}
