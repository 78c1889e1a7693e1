//! The generated per-packet path (`flick_machine::native`) against the
//! table interpreter: every FlowBlaze example, in both its languages and
//! at two table sizes (its own and one small enough to fill, meeting the
//! stash, evictions and table-full events), run on seeded random frames
//! by an engine that takes the generated path first and by one that
//! interprets only. Verdicts frame by frame, then counters, contexts,
//! live counts and globals must be equal.

use flick_machine::model::{Machine, Operand, Value};
use flick_machine::{lang, xl, Engine, Frame, Program};
use flick_testkit::rng::Xorshift;
use std::path::Path;
use std::sync::Arc;

/// Every machine in examples/flowblaze, with its file name.
fn examples() -> Vec<(String, Machine)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/flowblaze");
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for path in files {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let machine = match path.extension().and_then(|e| e.to_str()) {
            Some("flick") => {
                let text = std::fs::read_to_string(&path).unwrap();
                lang::compile(&text)
                    .unwrap_or_else(|d| panic!("{name}: {d:?}"))
                    .machine
            }
            Some("xl") => xl::load(&path).unwrap_or_else(|e| panic!("{name}: {e}")),
            _ => continue,
        };
        out.push((name, machine));
    }
    out
}

/// Values worth giving a field: every constant the machine compares or
/// computes with (so conditions go both ways), a few small numbers, and
/// their neighbours.
fn interesting(m: &Machine) -> Vec<Value> {
    let mut v: Vec<Value> = (0..6).collect();
    for s in &m.stages {
        for t in &s.transitions {
            for c in &t.when {
                for o in [c.lhs, c.rhs] {
                    if let Operand::Const(k) = o {
                        v.extend([k, k.wrapping_add(1), k.wrapping_sub(1)]);
                    }
                }
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// Seeded frames: fields from `values`, ports 0 to 4, times moving by up
/// to 2 ms with, now and then, a gap of up to a minute (timeouts fire).
fn frames(m: &Machine, seed: u64, n: usize) -> Vec<(Vec<Value>, u8, u64)> {
    let values = interesting(m);
    let mut rng = Xorshift(seed);
    let mut ts = 0u64;
    (0..n)
        .map(|_| {
            let fields = (0..m.fields.len()).map(|_| rng.pick(&values)).collect();
            ts += if rng.next().is_multiple_of(200) {
                rng.next() % 60_000_000_000
            } else {
                rng.next() % 2_000_000
            };
            (fields, (rng.next() % 5) as u8, ts)
        })
        .collect()
}

fn sorted(e: &Engine) -> Vec<flick_machine::Context> {
    let mut c = e.contexts();
    c.sort_by(|a, b| (a.stage, &a.key).cmp(&(b.stage, &b.key)));
    c
}

/// Runs `m` (with every stage's capacity set to `capacity`, if given) on
/// seeded frames by an engine that takes the generated path first and by
/// one that interprets only, one frame at a time and in batches, and
/// asserts that verdicts, counters, contexts, live counts and globals are
/// equal. Whether the first engine took generated code.
fn both_ways(name: &str, machine: &Machine, capacity: Option<usize>) -> bool {
    let mut m = machine.clone();
    if let Some(c) = capacity {
        for s in &mut m.stages {
            s.capacity = c;
        }
    }
    let program = Arc::new(Program::new(m.clone()).unwrap());
    let mut fast = Engine::new(program.clone());
    let mut slow = Engine::interpreted(program);
    assert!(!slow.native());
    for seed in 1..4 {
        let frames = frames(&m, seed * 7919 + capacity.unwrap_or(0) as u64, 4000);
        for (i, (f, port, ts)) in frames.iter().enumerate() {
            let len = 60 + i % 1400;
            let a = fast.process(f, *port, len, *ts);
            let b = slow.process(f, *port, len, *ts);
            assert_eq!(
                a, b,
                "{name} ({capacity:?}), seed {seed}, frame {i}: {f:?} on {port}"
            );
        }
        // And in batches.
        let views: Vec<Frame> = frames
            .iter()
            .map(|(f, port, ts)| Frame {
                fields: f,
                port: *port,
                len: 60,
                ts_ns: ts + 120_000_000_000,
            })
            .collect();
        let (mut got, mut want) = (Vec::new(), Vec::new());
        fast.process_batch(&views, |_, v| got.push(*v));
        slow.process_batch(&views, |_, v| want.push(*v));
        assert_eq!(got, want, "{name} ({capacity:?}), seed {seed}, batched");
        assert_eq!(fast.counters(), slow.counters(), "{name} ({capacity:?})");
        assert_eq!(sorted(&fast), sorted(&slow), "{name} ({capacity:?})");
        assert_eq!(fast.globals(), slow.globals(), "{name} ({capacity:?})");
        assert!(fast.counts_hold(), "{name} ({capacity:?}): counts");
        assert!(slow.counts_hold(), "{name} ({capacity:?}): counts");
        for s in 0..m.stages.len() {
            assert_eq!(fast.live_contexts(s), slow.live_contexts(s), "{name}");
        }
    }
    fast.native()
}

#[test]
fn the_generated_path_does_what_the_tables_say() {
    let mut native = 0;
    for (name, machine) in examples() {
        for capacity in [None, Some(8)] {
            native += both_ways(&name, &machine, capacity) as usize;
        }
    }
    // Every example but the super spreader (two stages on different
    // keys), in both languages, takes the generated path at both sizes:
    // the connection tracker's two stages on one record included.
    assert!(native >= 40, "only {native} engines generated code");
}

/// Ports whose packets, when the key summary says they have no context,
/// take one entry whatever they hold: the engine decides those without
/// the generated code only where the entry just sends the packet on, and
/// leaves to the code an entry that writes a field or goes on to a later
/// stage.
#[test]
fn packets_told_absent_by_the_summary_do_what_the_tables_say() {
    const KEYED: &str = "grammar packet

machine absent_misses: (packet/packet a, packet/packet b, packet/packet c, packet/packet d)
  stage first:
    key ipv4.src, tcp.dport
    idle_timeout 1s
    capacity 64
    states idle, seen
    in idle on packet when from a: next seen; forward b
    in seen on packet when from a: forward b
    in any on packet when from b: forward a
    in any on packet when from c: set eth.dst := 0x20000000a01; forward a
    in any on packet when from d: goto second
  stage second:
    key ipv4.src, tcp.dport
    idle_timeout 1s
    capacity 64
    states quiet, loud
    in quiet on packet when from d: next loud; forward c
    in loud on packet when from d: forward a
";
    let machine = flick_machine::lang::compile(KEYED)
        .unwrap_or_else(|d| panic!("{d:?}"))
        .machine;
    for capacity in [None, Some(8)] {
        assert!(both_ways("absent_misses", &machine, capacity));
    }
}

#[test]
fn tables_that_replace_a_running_program_bring_their_own_code() {
    let text = |port: u8| {
        format!(
            "grammar packet\n\
             machine m: (packet/packet a, packet/packet b)\n\
             \x20 stage s:\n\
             \x20   key ipv4.src\n\
             \x20   states closed, open\n\
             \x20   in closed on packet when tcp.dport = 7: next open\n\
             \x20   in open on packet: forward {}\n",
            if port == 1 { "a" } else { "b" }
        )
    };
    let program = |p| Arc::new(Program::new(lang::compile(&text(p)).unwrap().machine).unwrap());
    let mut e = Engine::new(program(1));
    assert!(e.native());
    let (src, knock) = (
        field_values(&text(1), 10, 7),
        field_values(&text(1), 10, 80),
    );
    assert_eq!(e.process(&src, 1, 60, 1_000).ports, 0);
    assert_eq!(e.process(&knock, 1, 60, 2_000).ports, 1 << 1);
    e.replace(program(2)).unwrap();
    assert!(e.native());
    assert_eq!(e.process(&knock, 1, 60, 3_000).ports, 1 << 2);
}

/// A frame's fields with `ipv4.src` and `tcp.dport` set.
fn field_values(text: &str, src: Value, dport: Value) -> Vec<Value> {
    let m = lang::compile(text).unwrap().machine;
    m.fields
        .iter()
        .map(|f| match f.name.as_str() {
            "ipv4.src" => src,
            "tcp.dport" => dport,
            _ => 0,
        })
        .collect()
}
