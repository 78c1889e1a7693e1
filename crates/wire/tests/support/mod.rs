//! What the grammar tests share: parsing a stream that arrives in pieces,
//! and checking it parses the same wherever it is split.
#![allow(dead_code)]

use flick_wire::{Grammar, Progress};
use std::sync::Arc;

/// Parses `stream` as consecutive messages of `unit`, the bytes arriving
/// in pieces that end at `arrivals` (increasing; the last is the stream's
/// length). Follows the parser's contract: a message's bytes stay
/// contiguous from its first byte, and `parse` sees the same prefix again
/// with more after `NeedMore`.
pub fn parse_stream(
    g: &Arc<Grammar>,
    unit: &str,
    stream: &[u8],
    arrivals: &[usize],
) -> Vec<String> {
    let mut p = g.parser(g.unit_id(unit).unwrap());
    let mut arrivals = arrivals.iter().copied();
    let mut avail = arrivals.next().unwrap();
    let mut start = 0;
    let mut out = Vec::new();
    while start < stream.len() {
        let buf = &stream[start..avail];
        match p.parse(buf).unwrap() {
            Progress::Done(n) => {
                out.push(format!("{:?}", p.message(buf)));
                start += n;
                p.reset();
            }
            Progress::NeedMore => {
                avail = arrivals.next().expect("the stream ends inside a message");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    out
}

pub fn check_every_split(g: &Arc<Grammar>, unit: &str, stream: &[u8], messages: usize) {
    let whole = parse_stream(g, unit, stream, &[stream.len()]);
    assert_eq!(whole.len(), messages, "{unit}");
    for k in 0..=stream.len() {
        let cuts = [k, stream.len()];
        assert_eq!(
            parse_stream(g, unit, stream, &cuts),
            whole,
            "{unit}: split at {k}"
        );
    }
    let bytewise: Vec<usize> = (1..=stream.len()).collect();
    assert_eq!(
        parse_stream(g, unit, stream, &bytewise),
        whole,
        "{unit}: bytewise"
    );
}
