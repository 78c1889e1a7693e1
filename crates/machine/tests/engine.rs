//! The executor on field values directly: transitions, timeouts, a full
//! table, biflow keys, and tables replaced under live contexts.

use flick_machine::xl::parse_str;
use flick_machine::{Engine, Program, ReplaceError};
use std::sync::Arc;

fn engine(text: &str) -> Engine {
    Engine::new(Arc::new(
        Program::new(parse_str("t.xl", text).unwrap()).unwrap(),
    ))
}

const MS: u64 = 1_000_000;

const COUNTER: &str = r#"
Stage count {
    Register n;
    setFlowKey(ipv4.src);
    setIdleTimeout(10000);
    setTableSize(8);
    State initial fresh {
        on (pktRcvd) { n = n + 1; sendPacket(255, 1); setNextState(seen); }
        on (tableFull) { sendPacket(255, 2); }
    }
    State seen {
        on (pktRcvd) {
            if (n >= 3) { sendPacket(255, 3); }
            n = n + 1; sendPacket(255, 1);
        }
        on (idleTimeout) { n = 100; }
    }
}
"#;

#[test]
fn transitions_registers_and_the_idle_timeout() {
    let mut e = engine(COUNTER);
    let ports = |e: &mut Engine, src, t| e.process(&[src], 1, 60, t).ports;
    assert_eq!(ports(&mut e, 7, 0), 1 << 1);
    assert_eq!(ports(&mut e, 7, MS), 1 << 1);
    assert_eq!(ports(&mut e, 7, 2 * MS), 1 << 1);
    // n is 3 now: the `if` row matches, and the event's own statements
    // run with it.
    assert_eq!(ports(&mut e, 7, 3 * MS), 1 << 1 | 1 << 3);
    let c = &e.contexts()[0];
    assert_eq!((c.state, c.regs[0]), (1, 4));
    // 20 ms later the context has been idle for longer than 10 ms: its
    // idleTimeout transition runs first (n = 100), then the packet's.
    assert_eq!(ports(&mut e, 7, 23 * MS), 1 << 1 | 1 << 3);
    assert_eq!(e.counters().expired, 1);
    assert_eq!(e.contexts()[0].regs[0], 101);
}

#[test]
fn a_full_table_runs_the_table_full_transition() {
    let mut e = engine(COUNTER);
    let mut full = 0;
    for src in 0..100u64 {
        if e.process(&[src], 1, 60, 0).ports == 1 << 2 {
            full += 1;
        }
    }
    let c = e.counters();
    assert!(full > 0 && c.table_full == full, "{c:?}");
    assert_eq!(e.contexts().len() as u64 + full, 100);
    // After the idle timeout the expired contexts make room.
    assert_eq!(e.process(&[1000], 1, 60, 50 * MS).ports, 1 << 1);
    assert_eq!(e.counters().evicted, 1);
}

#[test]
fn contexts_in_their_initial_state_are_not_kept() {
    let mut e = engine(
        "Stage s { setFlowKey(tcp.dport); State initial a { on(pktRcvd) { if (tcp.dport == 1) { setNextState(b); } } } State b { on(pktRcvd) { setNextState(a); } } }",
    );
    e.process(&[5], 1, 60, 0);
    assert!(e.contexts().is_empty());
    e.process(&[1], 1, 60, 0);
    assert_eq!(e.contexts().len(), 1);
    e.process(&[1], 1, 60, 0);
    assert!(e.contexts().is_empty(), "back to the initial state");
}

#[test]
fn a_biflow_key_is_one_context_for_both_directions() {
    let mut e = engine(
        "Stage s { Register n; setBiflowKey(ipv4.src, udp.sport, ipv4.dst, udp.dport); State initial a { on(pktRcvd) { n = n + 1; } } }",
    );
    // Fields in order of first use: ipv4.src, udp.sport, ipv4.dst, udp.dport.
    e.process(&[10, 1000, 20, 53], 1, 60, 0);
    e.process(&[20, 53, 10, 1000], 2, 60, 0);
    e.process(&[10, 1001, 20, 53], 1, 60, 0);
    let cs = e.contexts();
    let mut counts: Vec<u64> = cs.iter().map(|c| c.regs[0]).collect();
    counts.sort();
    assert_eq!(counts, [1, 2]);
}

#[test]
fn replaced_tables_keep_the_contexts() {
    let v1 = "Stage s { Register n; setFlowKey(ipv4.src); State initial a { on(pktRcvd) { n = n + 1; sendPacket(255, 1); } } }";
    let v2 = "Stage s { Register n; setFlowKey(ipv4.src); State initial a { on(pktRcvd) { if (n >= 2) { n = n + 10; sendPacket(255, 2); } n = n + 1; sendPacket(255, 1); } } State extra { } }";
    let mut e = engine(v1);
    e.process(&[1], 1, 60, 0);
    e.process(&[1], 1, 60, 0);
    let p2 = Arc::new(Program::new(parse_str("v2.xl", v2).unwrap()).unwrap());
    e.replace(p2).unwrap();
    // The context counted 2 under the old tables; the new ones see it.
    assert_eq!(e.process(&[1], 1, 60, 0).ports, 1 << 1 | 1 << 2);
    assert_eq!(e.contexts()[0].regs[0], 13);
    assert_eq!(e.process(&[2], 1, 60, 0).ports, 1 << 1);
    // A program that would strand the contexts is refused.
    let bad = "Stage s { Register m; setFlowKey(ipv4.src); State initial a { } }";
    let p3 = Arc::new(Program::new(parse_str("bad.xl", bad).unwrap()).unwrap());
    assert_eq!(e.replace(p3), Err(ReplaceError::Registers("s".into())));
    let bad = "Stage s { Register n; setFlowKey(ipv4.dst); State initial a { } }";
    let p4 = Arc::new(Program::new(parse_str("bad.xl", bad).unwrap()).unwrap());
    assert_eq!(e.replace(p4), Err(ReplaceError::Key("s".into())));
}

#[test]
fn tables_have_a_condition_bit_per_distinct_comparison() {
    let p = Program::new(parse_str("t.xl", COUNTER).unwrap()).unwrap();
    let t = &p.tables[0];
    assert_eq!(t.conditions.len(), 1);
    assert_eq!(t.entries.len(), 5);
    // Packet rows: fresh 1, seen 2; idleTimeout: seen 1; tableFull: fresh 1.
    assert_eq!(t.row_count(), 5);
    assert_eq!(p.context_bytes(0), 8 + 8 + 24);
}

#[test]
fn a_packet_goes_on_through_later_stages() {
    // Stage one counts per source and passes every third packet on; stage
    // two, keyed by destination, sends it to port 1 the first time and to
    // port 2 after.
    let mut e = engine(
        "Stage one { Register n; setFlowKey(ipv4.src); \
           State initial a { on(pktRcvd) { \
             if (n == 2) { n = 0; setNextStage(two); } \
             if (n < 2) { n = n + 1; } } } } \
         Stage two { setFlowKey(ipv4.dst); \
           State initial first { on(pktRcvd) { sendPacket(255, 1); setNextState(later); } } \
           State later { on(pktRcvd) { sendPacket(255, 2); } } }",
    );
    // Fields: ipv4.src, then ipv4.dst.
    let got: Vec<u64> = (0..9).map(|_| e.process(&[1, 9], 1, 60, 0).ports).collect();
    assert_eq!(got, [0, 0, 1 << 1, 0, 0, 1 << 2, 0, 0, 1 << 2]);
    let cs = e.contexts();
    assert_eq!(
        cs.len(),
        1,
        "stage one is back at n = 0; stage two is in `later`"
    );
    assert_eq!((cs[0].stage, cs[0].state), (1, 1));
}

/// Two stages on one biflow key, small tables (so they fill and evict)
/// and idle timeouts: the batch path meets every branch of a lookup.
const SHARED_KEY: &str = r#"
Stage one {
    Register n;
    setBiflowKey(ipv4.src, ipv4.dst);
    setIdleTimeout(5000);
    setTableSize(16);
    State initial fresh {
        on (pktRcvd) { n = n + 1; sendPacket(255, 1); setNextState(open); }
        on (tableFull) { sendPacket(255, 2); }
    }
    State open {
        on (pktRcvd) { n = n + 1; setNextStage(two); }
        on (idleTimeout) { n = 0; }
    }
}
Stage two {
    Register m;
    setBiflowKey(ipv4.src, ipv4.dst);
    setIdleTimeout(3000);
    setTableSize(16);
    State initial fresh {
        on (pktRcvd) { m = m + 2; sendPacket(255, 3); setNextState(seen); }
        on (tableFull) { sendPacket(255, 4); }
    }
    State seen {
        on (pktRcvd) { if (m >= 6) { sendPacket(255, 5); setNextState(fresh); } m = m + 1; }
    }
}
"#;

#[test]
fn a_batch_does_what_frames_one_by_one_do() {
    use flick_machine::{Counters, Frame};
    let mut seen = Counters::default();
    for (text, nf) in [(COUNTER, 1), (SHARED_KEY, 2)] {
        for seed in 1..5u64 {
            let (mut single, mut batched) = (engine(text), engine(text));
            let mut x = seed;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            // Few addresses (contexts come back) over a time span that
            // lets the timeouts fire.
            let gap = if seed % 2 == 0 { 40_000 } else { 400_000 };
            let frames: Vec<([u64; 2], u64)> = (0..2000u64)
                .map(|i| ([next() % 40, next() % 40], i * gap + next() % gap))
                .collect();
            let mut at = 0;
            for size in [1, 3, 64, 65, 200].iter().cycle() {
                if at >= frames.len() {
                    break;
                }
                let chunk = &frames[at..(at + size).min(frames.len())];
                let views: Vec<Frame> = chunk
                    .iter()
                    .map(|(f, ts)| Frame {
                        fields: &f[..nf],
                        port: 1,
                        len: 60,
                        ts_ns: *ts,
                    })
                    .collect();
                let mut got = Vec::new();
                batched.process_batch(&views, |i, v| got.push((i, *v)));
                let want: Vec<_> = views
                    .iter()
                    .enumerate()
                    .map(|(i, f)| (i, single.process(f.fields, 1, 60, f.ts_ns)))
                    .collect();
                assert_eq!(got, want, "seed {seed}, frames from {at}");
                at += chunk.len();
            }
            assert_eq!(batched.contexts(), single.contexts());
            let c = batched.counters();
            assert_eq!(c, single.counters());
            seen.table_full += c.table_full;
            seen.evicted += c.evicted;
            seen.expired += c.expired;
        }
    }
    assert!(
        seen.table_full > 0 && seen.evicted > 0 && seen.expired > 0,
        "{seen:?}"
    );
}

/// A balancer's shape: port 1 opens contexts, port 2's rows (in every
/// state) only send, so a port-2 packet that finds no context leaves none
/// and its lookup is skipped where the table's key summary says the key
/// is absent. Where a context does exist under a port-2 packet's key, the
/// lookup still refreshes its idle timer or finds it expired.
const REPLIES: &str = r#"
Stage lb {
    setFlowKey(ipv4.src, ipv4.dst);
    setIdleTimeout(5000);
    setTableSize(64);
    State initial fresh {
        on (pktRcvd) { if (pktRcvd.port == 1) { sendPacket(255, 2); setNextState(open); } }
    }
    State open {
        on (pktRcvd) { if (pktRcvd.port == 1) { sendPacket(255, 3); } }
    }
    State any {
        on (pktRcvd) { if (pktRcvd.port == 2) { sendPacket(255, 1); } }
    }
}
"#;

#[test]
fn a_skipped_lookup_changes_nothing_and_a_needed_one_is_made() {
    let program = Arc::new(Program::new(parse_str("t.xl", REPLIES).unwrap()).unwrap());
    assert!(program.tables[0].quiet_miss(2));
    assert!(!program.tables[0].quiet_miss(1));
    for seed in 1..6u64 {
        let mut e = Engine::new(Arc::clone(&program));
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        // The plain model: each key's last packet time, while open.
        let mut open: std::collections::HashMap<[u64; 2], u64> = Default::default();
        let (mut refreshed, mut expired) = (0, 0);
        let mut t = 0;
        for i in 0..4000 {
            t += next() % 2_000_000;
            // Requests from a few clients to one server; replies mostly
            // the other way round (no context there), now and then under a
            // request's own key.
            let (c, s) = (100 + next() % 6, 7);
            let (port, key) = match next() % 4 {
                0 | 1 => (1, [c, s]),
                2 => (2, [s, c]),
                _ => (2, [c, s]),
            };
            let live = open.get(&key).filter(|&&last| t / 1000 - last <= 5000);
            let want = match (port, live) {
                (1, Some(_)) => 1 << 3,
                (1, None) => 1 << 2,
                _ => 1 << 1,
            };
            if open.contains_key(&key) {
                if live.is_some() {
                    refreshed += (port == 2) as u64;
                } else {
                    expired += 1;
                    open.remove(&key);
                }
            }
            if port == 1 || open.contains_key(&key) {
                open.insert(key, t / 1000);
            }
            assert_eq!(
                e.process(&key, port, 60, t).ports,
                want,
                "seed {seed}, packet {i}"
            );
        }
        assert_eq!(e.counters().expired, expired, "seed {seed}");
        assert_eq!(e.live_contexts(0), open.len(), "seed {seed}");
        assert!(
            refreshed > 0 && expired > 0,
            "seed {seed}: {refreshed} {expired}"
        );
    }
}
