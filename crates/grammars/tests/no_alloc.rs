//! Generated parsers allocate nothing per message: a counting global
//! allocator watches every stock grammar's parsers run over its fuzz
//! corpus, after a first round that may size buffers, and the reads of
//! their fields, through references and through whole headers.

use flick_testkit::alloc::CountingAlloc;
use flick_wire::{Grammar, Progress};

/// Counts only this thread's allocations, not the harness's.
#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Every corpus input of grammar `name`: its unit byte and its stream.
fn corpus(name: &str) -> Vec<(u8, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(format!("wire_{name}"));
    let mut out: Vec<(u8, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("the corpus is committed")
        .map(|e| std::fs::read(e.expect("an entry").path()).expect("readable"))
        .filter(|d| d.len() > 2)
        .map(|d| (d[0], d[2..].to_vec()))
        .collect();
    out.sort();
    out
}

#[test]
fn generated_parsers_allocate_nothing_per_message() {
    flick_grammars::install();
    for name in flick_wire::stock::NAMES {
        let g = Grammar::stock(name).expect("a stock grammar");
        let inputs = corpus(name);
        let mut parsers: Vec<_> = (0..g.units().len()).map(|u| g.parser(u)).collect();
        let mut messages = 0;
        let mut counted_from = 0;
        for round in 0..2 {
            if round == 1 {
                counted_from = ALLOC.this_thread();
            }
            for (unit, data) in &inputs {
                let p = &mut parsers[*unit as usize % g.units().len()];
                let mut at = 0;
                // Whole messages only; anything else ends the input.
                while let Ok(Progress::Done(n)) = p.parse(&data[at..]) {
                    p.reset();
                    messages += usize::from(round == 1);
                    at += n;
                    if n == 0 || at >= data.len() {
                        break;
                    }
                }
                p.reset();
            }
        }
        let allocations = ALLOC.this_thread() - counted_from;
        let compiled: u64 = parsers.iter().map(|p| p.compiled_messages()).sum();
        eprintln!("{name}: {messages} messages, {compiled} by generated code over two rounds, {allocations} allocations");
        assert_eq!(allocations, 0, "{name}");
        assert!(
            compiled as usize > messages,
            "{name}: generated code barely ran"
        );
    }
}

/// Nor do batches, once made: every stock grammar's corpus parsed a batch
/// at a time, reading each message's fields.
#[test]
fn batches_allocate_nothing_per_message() {
    flick_grammars::install();
    for name in flick_wire::stock::NAMES {
        let g = Grammar::stock(name).expect("a stock grammar");
        let inputs = corpus(name);
        let units = g.units().len();
        let mut parsers: Vec<_> = (0..units).map(|u| g.parser(u)).collect();
        let mut batches: Vec<_> = parsers.iter().map(|p| p.batch(4)).collect();
        let fields: Vec<Vec<String>> = (0..units)
            .map(|u| g.unit(u).fields.iter().map(|f| f.name.clone()).collect())
            .collect();
        let (mut messages, mut read) = (0, 0);
        let counted_from = ALLOC.this_thread();
        for (unit, data) in &inputs {
            let u = *unit as usize % units;
            let (p, batch) = (&mut parsers[u], &mut batches[u]);
            let mut at = 0;
            loop {
                let n = p.parse_batch(&data[at..], batch);
                for m in batch.messages(&data[at..]) {
                    messages += 1;
                    for f in &fields[u] {
                        read += usize::from(!matches!(m.get(f), flick_wire::Value::Absent));
                    }
                }
                at += n;
                if n == 0 || at >= data.len() {
                    break;
                }
            }
        }
        let allocations = ALLOC.this_thread() - counted_from;
        eprintln!(
            "{name}: {messages} messages in batches, {read} fields read, {allocations} allocations"
        );
        assert_eq!(allocations, 0, "{name}");
        assert!(messages > inputs.len() / 2, "{name}: batches barely ran");
    }
}

/// Nor do bursts of messages each in its own buffer, parsed by parsers
/// that leave fields in place, with every field read where it lies.
#[test]
fn bursts_in_place_allocate_nothing_per_message() {
    flick_grammars::install();
    for name in flick_wire::stock::NAMES {
        let g = Grammar::stock(name).expect("a stock grammar");
        let inputs = corpus(name);
        let units = g.units().len();
        let mut parsers: Vec<_> = (0..units).map(|u| g.parser(u).in_place()).collect();
        let mut batches: Vec<_> = parsers.iter().map(|p| p.batch(4)).collect();
        let refs: Vec<Vec<_>> = (0..units)
            .map(|u| {
                let fields = &g.unit(u).fields;
                fields
                    .iter()
                    .filter_map(|f| g.field_ref(u, &f.name))
                    .collect()
            })
            .collect();
        // Each input is one buffer; bursts of four inputs of a unit.
        let mut by_unit: Vec<Vec<&[u8]>> = vec![Vec::new(); units];
        for (unit, data) in &inputs {
            by_unit[*unit as usize % units].push(data);
        }
        let (mut messages, mut read) = (0, 0);
        let counted_from = ALLOC.this_thread();
        for (u, msgs) in by_unit.iter().enumerate() {
            let (p, batch) = (&mut parsers[u], &mut batches[u]);
            let mut rest = &msgs[..];
            while !rest.is_empty() {
                let burst = &rest[..rest.len().min(4)];
                let n = p.parse_each(burst, batch);
                for m in batch.messages_in(burst) {
                    messages += 1;
                    for r in &refs[u] {
                        read += usize::from(m.uint_of(r).is_some() || m.bytes_of(r).is_some());
                    }
                    read += header_reads(name, &g.unit(u).name, &m);
                }
                // A message the code does not finish is skipped here.
                rest = &rest[(n + 1).min(rest.len())..];
            }
        }
        let allocations = ALLOC.this_thread() - counted_from;
        eprintln!(
            "{name}: {messages} messages in bursts, {read} fields read, {allocations} allocations"
        );
        assert_eq!(allocations, 0, "{name}");
        assert!(messages > 0, "{name}: bursts never ran");
    }
}

/// Fields read through whole headers (`Message::header`), as a packet
/// function or a Memcached router reads them: how many were there.
fn header_reads(grammar: &str, unit: &str, m: &flick_wire::Message<'_>) -> usize {
    use flick_grammars::generated::{memcached_binary, packet};
    let mut read = 0;
    match (grammar, unit) {
        ("packet", "frame") => {
            use packet::{fields::frame as f, headers::frame as h};
            if let Some(eth) = m.header(&h::ETH) {
                read += usize::from(eth.bytes(&f::ETH_SRC).is_some());
            }
            if let Some(ip) = m.header(&h::IP4) {
                read += usize::from(ip.uint(&f::IP4_SRC).is_some());
            }
            if let Some(ip) = m.header(&h::IP6) {
                read += usize::from(ip.bytes(&f::IP6_SRC).is_some());
            }
            if let Some(tcp) = m.header(&h::TCP4) {
                read += usize::from(tcp.uint(&f::TCP4_DST_PORT).is_some());
            }
            if let Some(udp) = m.header(&h::UDP4) {
                read += usize::from(udp.uint(&f::UDP4_DST_PORT).is_some());
            }
        }
        ("memcached_binary", "cmd") => {
            use memcached_binary::{fields::cmd as f, headers::cmd as h};
            if let Some(head) = m.header(&h::UNIT) {
                read += usize::from(head.uint(&f::KEY_LEN).is_some());
                read += usize::from(head.uint(&f::TOTAL_LEN).is_some());
            }
        }
        _ => {}
    }
    read
}
