//! Stages on one key and table size keep their contexts in one record of
//! one table (one lookup a packet for all of them). While the table has
//! room this must be invisible: the same program with the stages' tables
//! apart (sizes that differ by one, rounded to the same slots) gives the
//! same verdicts, contexts, counters and per-stage counts, frame by frame
//! and in batches, with contexts that expire, return to their start and
//! are forgotten in one stage while the other keeps its own.

use flick_machine::xl::parse_str;
use flick_machine::{Counters, Engine, Frame, Program};
use std::sync::Arc;

fn engine(text: &str) -> Engine {
    Engine::new(Arc::new(
        Program::new(parse_str("t.xl", text).unwrap()).unwrap(),
    ))
}

/// Stage `one` counts a pair's packets and hands the pair to `two` from
/// its second packet; `two` counts by twos and forgets its context (back
/// to its start) at 6; `one` forgets its own at 5. The timeouts differ.
const TWO_STAGES: &str = r#"
Stage one {
    Register n;
    setBiflowKey(ipv4.src, ipv4.dst);
    setIdleTimeout(5000);
    setTableSize(SIZE_ONE);
    State initial fresh {
        on (pktRcvd) { n = n + 1; sendPacket(255, 1); setNextState(open); }
        on (tableFull) { sendPacket(255, 2); }
    }
    State open {
        on (pktRcvd) {
            if (n >= 4) { n = 0; sendPacket(255, 6); setNextState(fresh); }
            n = n + 1; setNextStage(two);
        }
        on (idleTimeout) { n = 0; }
    }
}
Stage two {
    Register m;
    Register k;
    setBiflowKey(ipv4.src, ipv4.dst);
    setIdleTimeout(3000);
    setHardTimeout(9000);
    setTableSize(SIZE_TWO);
    State initial fresh {
        on (pktRcvd) { m = m + 2; k = 7; sendPacket(255, 3); setNextState(seen); }
        on (tableFull) { sendPacket(255, 4); }
    }
    State seen {
        on (pktRcvd) {
            if (m >= 6) { m = 0; k = 0; sendPacket(255, 5); setNextState(fresh); }
            m = m + 1;
        }
        on (hardTimeout) { m = 1; }
    }
}
"#;

fn program(one: usize, two: usize) -> String {
    TWO_STAGES
        .replace("SIZE_ONE", &one.to_string())
        .replace("SIZE_TWO", &two.to_string())
}

/// Seeded frames over 30 addresses either way (pairs come back), about
/// `gap` ns apart.
fn frames(seed: u64, n: u64, gap: u64) -> Vec<([u64; 2], u64)> {
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|i| ([next() % 30, next() % 30], i * gap + next() % gap))
        .collect()
}

fn sorted(e: &Engine) -> Vec<flick_machine::Context> {
    let mut c = e.contexts();
    c.sort_by(|a, b| (a.stage, &a.key).cmp(&(b.stage, &b.key)));
    c
}

#[test]
fn one_record_for_both_stages_is_invisible_while_the_table_has_room() {
    let mut seen = Counters::default();
    let mut most = [0usize; 2];
    for seed in 1..7u64 {
        // 4096 and 4095 round to the same slots, but tables apart.
        let mut shared = engine(&program(4096, 4096));
        let mut apart = engine(&program(4096, 4095));
        let mut batched = engine(&program(4096, 4096));
        let gap = if seed % 2 == 0 { 300_000 } else { 900_000 };
        let frames = frames(seed, 3000, gap);
        for chunk in frames.chunks(37) {
            let views: Vec<Frame> = chunk
                .iter()
                .map(|(f, ts)| Frame {
                    fields: f,
                    port: 1,
                    len: 60,
                    ts_ns: *ts,
                })
                .collect();
            let mut got = Vec::new();
            batched.process_batch(&views, |_, v| got.push(*v));
            for (f, b) in views.iter().zip(&got) {
                let a = apart.process(f.fields, 1, 60, f.ts_ns);
                let s = shared.process(f.fields, 1, 60, f.ts_ns);
                assert_eq!(s, a, "seed {seed}, {:?} at {}", f.fields, f.ts_ns);
                assert_eq!(*b, a, "seed {seed}, batched");
            }
            for (stage, most) in most.iter_mut().enumerate() {
                let live = apart.live_contexts(stage);
                assert_eq!(shared.live_contexts(stage), live);
                assert_eq!(batched.live_contexts(stage), live);
                *most = (*most).max(live);
            }
        }
        assert_eq!(sorted(&shared), sorted(&apart), "seed {seed}");
        assert_eq!(sorted(&batched), sorted(&apart), "seed {seed}");
        assert_eq!(shared.counters(), apart.counters());
        assert_eq!(batched.counters(), apart.counters());
        let c = apart.counters();
        seen.expired += c.expired;
        seen.packets += c.packets;
    }
    // The traces meet timeouts and both stages' contexts.
    assert!(seen.expired > 0, "{seen:?}");
    assert!(most[0] > 10 && most[1] > 10, "{most:?}");
}

#[test]
fn a_full_shared_table_keeps_its_counts_and_a_key_takes_one_slot() {
    // 16 slots (and the stash) for 900 pairs: full, with evictions of
    // expired records and table-full events.
    let mut e = engine(&program(16, 16));
    let mut full = 0;
    // Frames 20 us apart: a record idles out after some 250 frames, so
    // new pairs meet a full table of live records and expired ones.
    for (f, ts) in frames(3, 4000, 20_000) {
        let v = e.process(&f, 1, 60, ts);
        if v.ports & (1 << 2 | 1 << 4) != 0 {
            full += 1;
        }
        let c = e.contexts();
        for stage in 0..2 {
            let n = c.iter().filter(|c| c.stage == stage).count();
            assert_eq!(e.live_contexts(stage), n);
        }
        // A pair's contexts share its slot: no more pairs than slots.
        let mut keys: Vec<_> = c.iter().map(|c| c.key.clone()).collect();
        keys.sort();
        keys.dedup();
        assert!(keys.len() <= 16 + flick_machine::flows::STASH);
    }
    let c = e.counters();
    assert!(c.table_full > 0 && c.evicted > 0, "{c:?}");
    assert_eq!(c.table_full, full);
}
