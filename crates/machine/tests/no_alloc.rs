//! The per-packet path allocates nothing: reading fields from a frame and
//! running the engine, once the table holds its contexts.

use flick_machine::xl::parse_str;
use flick_machine::{Engine, FieldReader, Frame, Program};
use flick_testkit::alloc::CountingAlloc;
use std::sync::Arc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Allocations by this thread: the test harness and the other tests
/// allocate meanwhile on threads of their own.
fn allocs() -> u64 {
    ALLOC.this_thread()
}

fn udp(src: u32, sport: u16, dst: u32, dport: u16) -> Vec<u8> {
    let mut f = vec![0u8; 42];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&28u16.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&src.to_be_bytes());
    f[30..34].copy_from_slice(&dst.to_be_bytes());
    f[34..36].copy_from_slice(&sport.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    f[38..40].copy_from_slice(&8u16.to_be_bytes());
    f
}

#[test]
fn reading_and_running_a_packet_allocates_nothing() {
    let text = "Stage s { Register n; setBiflowKey(ipv4.src, udp.sport, ipv4.dst, udp.dport); setIdleTimeout(1000000); \
        State initial a { on(pktRcvd) { if (pktRcvd.port == 1) { n = n + 1; sendPacket(255, 2); setNextState(open); } } } \
        State open { on(pktRcvd) { n = n + pktRcvd.len; sendPacket(255, 1); } on(idleTimeout) { setNextState(a); } } }";
    let program = Arc::new(Program::new(parse_str("t.xl", text).unwrap()).unwrap());
    let mut reader = FieldReader::new(&program.machine.fields).unwrap();
    let mut engine = Engine::new(program.clone());
    let frames: Vec<Vec<u8>> = (0..64u32)
        .flat_map(|i| {
            [
                udp(0x0a000001 + i, 1000, 0x08080808, 53),
                udp(0x08080808, 53, 0x0a000001 + i, 1000),
            ]
        })
        .collect();
    let mut fields = vec![0u64; program.machine.fields.len()];
    let mut run = |round: u64| {
        for (i, f) in frames.iter().enumerate() {
            assert!(reader.read(f, &mut fields));
            let port = if i % 2 == 0 { 1 } else { 2 };
            engine.process(&fields, port, f.len(), round * 1000 + i as u64);
        }
    };
    run(0);
    let before = allocs();
    for round in 1..20 {
        run(round);
    }
    assert_eq!(allocs() - before, 0);
    assert_eq!(engine.contexts().len(), 64);

    // The batch path: fields read for a whole batch, then run.
    let nf = program.machine.fields.len();
    let mut all = vec![0u64; nf * frames.len()];
    for (f, out) in frames.iter().zip(all.chunks_mut(nf)) {
        assert!(reader.read(f, out));
    }
    let batch: Vec<Frame> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| Frame {
            fields: &all[i * nf..(i + 1) * nf],
            port: if i % 2 == 0 { 1 } else { 2 },
            len: f.len(),
            ts_ns: 0,
        })
        .collect();
    let mut ports = 0u64;
    let before = allocs();
    for _ in 0..20 {
        engine.process_batch(&batch, |_, v| ports |= v.ports);
    }
    assert_eq!(allocs() - before, 0);
    assert_eq!(ports, 1 << 1, "every context is open: port 1");
}

#[test]
fn a_machine_with_metadata_and_a_stateless_stage_allocates_nothing_per_packet() {
    let text = "machine m: (packet/packet a, packet/packet b)
  meta class: integer
  stage classify:
    on packet when udp.dport = 53: meta.class := 1; goto count
    on packet: drop
  stage count:
    key ipv4.src
    flow n: integer := 0
    states s
    in s on packet when meta.class = 1: n := n + len; set ipv4.ttl := n; forward b
";
    let machine = flick_machine::lang::compile(text).unwrap().machine;
    let program = Arc::new(Program::new(machine).unwrap());
    let mut reader = FieldReader::new(&program.machine.fields).unwrap();
    let mut engine = Engine::new(program.clone());
    let frames: Vec<Vec<u8>> = (0..64u32)
        .map(|i| udp(0x0a000001 + i, 1000, 0x08080808, 53 + (i % 2) as u16))
        .collect();
    let mut fields = vec![0u64; program.machine.fields.len()];
    let mut run = |round: u64| {
        for (i, f) in frames.iter().enumerate() {
            assert!(reader.read(f, &mut fields));
            engine.process(&fields, 1, f.len(), round * 1000 + i as u64);
        }
    };
    run(0);
    let before = allocs();
    for round in 1..20 {
        run(round);
    }
    assert_eq!(allocs() - before, 0);
    assert_eq!(engine.contexts().len(), 32);
}
