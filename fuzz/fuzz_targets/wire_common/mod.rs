//! Checks shared by the `wire_*` fuzz targets, one per stock grammar.
//!
//! An input is `[unit, cut, stream...]`: the first byte picks a unit of the
//! grammar (modulo their number), the second a point to split the stream
//! at (scaled to its length), and the rest is a stream of messages of that
//! unit. For that unit:
//!
//! (a) the stream is parsed whole, as one piece, with the driver loop of a
//!     proxy (`Head`, `Stream`, `Done`, `reset`, `finish` at the end): no
//!     panic, at most `len * 4 + 16` calls, every count within the buffer,
//!     progress on every call;
//! (b) the stream split in two gives the same messages (heads, lengths,
//!     values) and the same error as whole;
//! (c) every message parsed whole (no streaming) serialises, and the
//!     serialised bytes (followed by what followed the message, which the
//!     parser may have looked at) parse back to the same values;
//! (d) a parser with a view (the field chosen by the second byte, or none)
//!     frames the stream as the full parser does, without panicking;
//! (e) parsers that run the grammar's generated code first (`flick-grammars`)
//!     and parsers that only interpret give the same runs, values and
//!     errors included, whole, split and under the view;
//! (f) the stream parsed by one parser a batch of two messages at a time
//!     (`Parser::parse_batch`) and one message by itself after each batch,
//!     gives the same messages as whole up to the first one that streams
//!     or fails, with and without the view;
//! (g) a parser that leaves fields in place (`Parser::in_place`) gives the
//!     same run, its messages read field by field; and the messages of the
//!     stream, each in its own buffer, parsed in one burst
//!     (`Parser::parse_each`) give the same messages as whole, as far as
//!     the burst goes;
//! (h) every header of every message parsed whole, by the full parser and
//!     by one leaving fields in place, taken whole (`Message::header`)
//!     holds the message's bytes at its start, and each of its fields
//!     reads through it (`Header::uint`, `Header::bytes`) as it reads one
//!     by one (`Message::uint_of`, `bytes_of`).
//!
//! `crates/wire/tests/fuzz_corpus.rs` includes this module, to replay the
//! corpora with plain `cargo test`.

use flick_wire::{
    FieldKind, FieldRef, FixedKind, Grammar, HeaderInfo, HeaderRef, Message, Parser, Progress,
    UnitId, WireErrorKind,
};
use std::sync::{Arc, OnceLock};

/// The stock grammars, loaded once.
pub fn grammar(name: &str) -> Arc<Grammar> {
    static ALL: OnceLock<Vec<(&'static str, Arc<Grammar>)>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        flick_wire::stock::NAMES
            .iter()
            .map(|n| (*n, Grammar::stock(n).expect("a stock grammar")))
            .collect()
    });
    all.iter()
        .find(|(n, _)| *n == name)
        .map(|(_, g)| g.clone())
        .unwrap_or_else(|| panic!("no stock grammar {name}"))
}

/// What the driver saw of one message.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// `Head(at)`, with the head's values.
    Head { at: usize, msg: String },
    /// `Done`, with the message's length over all its pieces, and its
    /// values when it was parsed whole (none were streamed).
    Done { len: usize, msg: Option<String> },
}

/// A parse error, at its offset from the start of its message.
#[derive(Debug, PartialEq, Eq)]
pub struct Failure {
    pub kind: WireErrorKind,
    pub field: String,
    pub status: Option<u16>,
    pub at: usize,
}

/// Everything the driver saw of a stream.
#[derive(Debug, PartialEq, Eq)]
pub struct Run {
    pub events: Vec<Event>,
    pub end: Result<(), Failure>,
}

impl Run {
    /// The framing only: message lengths, head offsets and the error,
    /// without values (a view leaves some out).
    fn shape(&self) -> (Vec<(bool, usize)>, Result<(), &Failure>) {
        let events = self
            .events
            .iter()
            .map(|e| match e {
                Event::Head { at, .. } => (true, *at),
                Event::Done { len, .. } => (false, *len),
            })
            .collect();
        (events, self.end.as_ref().map(|_| ()))
    }
}

/// Feeds `pieces` (in order, each appended to the buffer) to `p` as a
/// proxy does, calling `parse` and, on the last piece, `finish`. Calls
/// `whole` with the parser, the buffer and the length of every message
/// parsed without streaming, before the message leaves the buffer.
pub fn drive(
    p: &mut Parser,
    pieces: &[&[u8]],
    whole: &mut dyn FnMut(&Parser, &[u8], usize),
) -> Run {
    let total: usize = pieces.iter().map(|s| s.len()).sum();
    let budget = total * 4 + 16;
    let mut calls = 0;
    let mut buf: Vec<u8> = Vec::new();
    let mut events = Vec::new();
    // No call since the last reset.
    let mut fresh = true;
    // Whether `Head` came, and how many bytes were handed over, for the
    // current message.
    let mut headed = false;
    let mut streamed = 0usize;
    for (i, piece) in pieces.iter().enumerate() {
        let last = i + 1 == pieces.len();
        buf.extend_from_slice(piece);
        loop {
            // A stream ending between messages ends cleanly; otherwise an
            // empty buffer waits for the next piece, or ends the message.
            if buf.is_empty() && (fresh || !last) {
                break;
            }
            calls += 1;
            assert!(
                calls <= budget,
                "{calls} calls over {total} bytes: the parser makes no progress"
            );
            let r = if last { p.finish(&buf) } else { p.parse(&buf) };
            fresh = false;
            match r {
                Err(e) => {
                    let end = Err(Failure {
                        kind: e.kind,
                        field: e.field.to_string(),
                        status: e.status,
                        at: streamed + e.offset,
                    });
                    return Run { events, end };
                }
                Ok(Progress::NeedMore) => {
                    assert!(!last, "finish returned NeedMore");
                    break;
                }
                Ok(Progress::Head(n)) => {
                    assert!(!headed, "a second Head in one message");
                    assert!(n <= buf.len(), "Head({n}) past the buffer ({})", buf.len());
                    headed = true;
                    let msg = format!("{:?}", p.message(&buf));
                    events.push(Event::Head { at: n, msg });
                }
                Ok(Progress::Stream(n)) => {
                    assert!(headed, "Stream({n}) before Head");
                    assert!(
                        n > 0 && n <= buf.len(),
                        "Stream({n}) with {} bytes buffered",
                        buf.len()
                    );
                    buf.drain(..n);
                    streamed += n;
                }
                Ok(Progress::Done(n)) => {
                    assert!(n <= buf.len(), "Done({n}) past the buffer ({})", buf.len());
                    assert!(
                        n > 0 || streamed > 0,
                        "Done(0): an empty message, the stream would not advance"
                    );
                    let msg = if headed {
                        None
                    } else {
                        whole(p, &buf, n);
                        Some(format!("{:?}", p.message(&buf)))
                    };
                    events.push(Event::Done {
                        len: streamed + n,
                        msg,
                    });
                    buf.drain(..n);
                    p.reset();
                    fresh = true;
                    headed = false;
                    streamed = 0;
                }
            }
        }
    }
    assert!(
        buf.is_empty() && fresh,
        "the stream ended with {} bytes unparsed",
        buf.len()
    );
    Run {
        events,
        end: Ok(()),
    }
}

/// (c): the message `p` parsed from `buf[..n]` serialises, and the result,
/// followed by `buf[n..]`, parses back to the same values.
fn round_trip(g: &Arc<Grammar>, unit: UnitId, p: &Parser, buf: &[u8], n: usize) {
    let before = format!("{:?}", p.message(buf));
    let mut slots = p.slots().to_vec();
    let mut out = Vec::new();
    if let Err(e) = g.serialize(unit, &mut slots, buf, &mut out) {
        panic!(
            "a parsed message does not serialise: {e}\n--- message\n{before}\n--- bytes\n{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
    }
    let len = out.len();
    out.extend_from_slice(&buf[n..]);
    let mut q = g.parser(unit);
    match q.finish(&out) {
        Ok(Progress::Done(m)) if m == len => {}
        other => panic!(
            "serialised bytes do not parse back: {other:?}, expected Done({len})\n\
             --- message\n{before}\n--- parsed\n{:?}\n--- serialised\n{:?}",
            String::from_utf8_lossy(&buf[..n]),
            String::from_utf8_lossy(&out[..len]),
        ),
    }
    let after = format!("{:?}", q.message(&out));
    assert_eq!(
        before,
        after,
        "serialised bytes parse to other values\n--- parsed\n{:?}\n--- serialised\n{:?}",
        String::from_utf8_lossy(&buf[..n]),
        String::from_utf8_lossy(&out[..len]),
    );
}

/// (f): the values of the messages at the start of `stream`, parsed with
/// `p` in batches and one message by itself after each batch (the stream
/// ending after `stream`), until one streams or fails. So the parser's
/// own slots and a batch's rows take turns.
fn batched(p: &mut Parser, stream: &[u8]) -> Vec<String> {
    let mut batch = p.batch(2);
    let (mut out, mut at) = (Vec::new(), 0);
    while at < stream.len() && out.len() <= stream.len() {
        let n = p.parse_batch(&stream[at..], &mut batch);
        out.extend(batch.messages(&stream[at..]).map(|m| format!("{m:?}")));
        at += n;
        match p.finish(&stream[at..]) {
            Ok(Progress::Done(n)) if n > 0 => {
                out.push(format!("{:?}", p.message(&stream[at..])));
                p.reset();
                at += n;
            }
            _ => break,
        }
    }
    out
}

/// (g): a parser leaving fields in place, message by message and in a
/// burst of the stream's messages, each in its own buffer.
fn in_place(g: &Arc<Grammar>, unit: UnitId, stream: &[u8], whole: &Run) {
    let mut p = g.parser(unit).in_place();
    let run = drive(&mut p, &[stream], &mut |p, buf, n| {
        headers(g, unit, &p.message(&buf[..n]), &buf[..n])
    });
    assert_eq!(whole, &run, "a parser leaving fields in place differs");
    let mut msgs: Vec<&[u8]> = Vec::new();
    let mut at = 0;
    for e in &whole.events {
        let Event::Done { len, msg: Some(_) } = e else {
            break;
        };
        msgs.push(&stream[at..]);
        at += len;
    }
    let mut rows = p.batch(msgs.len().max(1));
    p.reset();
    let n = p.parse_each(&msgs, &mut rows);
    let burst: Vec<String> = rows.messages_in(&msgs).map(|m| format!("{m:?}")).collect();
    assert_eq!(burst[..], leading(whole)[..n], "a burst and whole differ");
}

/// (h): every header of `m` (of `unit`, parsed from `data`), its own and
/// its nested units', read whole and field by field.
fn headers(g: &Grammar, unit: UnitId, m: &Message<'_>, data: &[u8]) {
    for h in g.headers(unit) {
        let (path, inner) = (h.path.as_str(), h.unit);
        let fields: Vec<(FieldRef, Option<FixedKind>)> = g
            .unit(inner)
            .fields
            .iter()
            .filter(|f| matches!(f.kind, FieldKind::Int | FieldKind::Bytes))
            .filter_map(|f| {
                let full = match path {
                    "" => f.name.clone(),
                    p => format!("{p}.{}", f.name),
                };
                Some((g.field_ref(unit, &full)?, f.fixed.map(|x| x.kind)))
            })
            .collect();
        match h.len {
            4 => header::<4>(g, (unit, &h), (m, data), &fields),
            8 => header::<8>(g, (unit, &h), (m, data), &fields),
            14 => header::<14>(g, (unit, &h), (m, data), &fields),
            20 => header::<20>(g, (unit, &h), (m, data), &fields),
            24 => header::<24>(g, (unit, &h), (m, data), &fields),
            28 => header::<28>(g, (unit, &h), (m, data), &fields),
            40 => header::<40>(g, (unit, &h), (m, data), &fields),
            n => panic!("a header of {n} bytes: add its length here"),
        }
    }
}

/// (h) for the header at `path`, of `N` bytes.
fn header<const N: usize>(
    g: &Grammar,
    (unit, info): (UnitId, &HeaderInfo),
    (m, data): (&Message<'_>, &[u8]),
    fields: &[(FieldRef, Option<FixedKind>)],
) {
    let path = &info.path;
    let h: HeaderRef<N> = g.header_ref(unit, path).expect("the header of a fixed run");
    assert_eq!(
        h.start(),
        info.start,
        "header {path:?} listed and resolved apart"
    );
    let at = m.uint_at(h.start());
    let Some(hdr) = m.header(&h) else {
        assert_eq!(at, None, "header {path:?} begins but cannot be read");
        return;
    };
    let at = at.expect("a header's start") as usize;
    assert_eq!(
        hdr.as_bytes().get(..),
        data.get(at..at + N),
        "header {path:?}"
    );
    for (r, fixed) in fields {
        let read = (hdr.uint(r), hdr.bytes(r));
        let want = match fixed {
            Some(FixedKind::Int { .. }) => (m.uint_of(r), None),
            Some(FixedKind::Bytes { .. }) => (None, m.bytes_of(r)),
            None => (None, None),
        };
        assert_eq!(read, want, "field at slot {} of header {path:?}", r.slot());
        if fixed.is_some() {
            assert_ne!(
                read,
                (None, None),
                "field at slot {} of header {path:?}",
                r.slot()
            );
        }
    }
}

/// The values of the messages a run gave whole, up to the first that
/// streamed.
fn leading(run: &Run) -> Vec<String> {
    run.events
        .iter()
        .map_while(|e| match e {
            Event::Done { msg: Some(m), .. } => Some(m.clone()),
            _ => None,
        })
        .collect()
}

/// Runs checks (a) to (h) on one input for grammar `name`.
pub fn check(name: &str, data: &[u8]) {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(flick_grammars::install);
    let g = grammar(name);
    let units = g.units().len();
    let (unit, pick, stream) = match data {
        [u, c, rest @ ..] => (*u as usize % units, *c as usize, rest),
        [u] => (*u as usize % units, 0, &[][..]),
        [] => return,
    };

    // (a) and (c): the whole stream at once, serialising each message.
    let mut p = g.parser(unit);
    let whole = drive(&mut p, &[stream], &mut |p, buf, n| {
        round_trip(&g, unit, p, buf, n);
        headers(&g, unit, &p.message(&buf[..n]), &buf[..n]);
    });

    // (b): split in two.
    let cut = pick * stream.len() / 255;
    let (a, b) = stream.split_at(cut);
    let mut p = g.parser(unit);
    let split = drive(&mut p, &[a, b], &mut |_, _, _| {});
    assert_eq!(whole, split, "split at {cut} of {}", stream.len());

    // (f): in batches.
    assert_eq!(
        batched(&mut g.parser(unit), stream),
        leading(&whole),
        "batches and whole differ"
    );

    // (g): fields in place, and in a burst.
    in_place(&g, unit, stream, &whole);

    // (e): the interpreter alone, whole and split.
    assert!(p.is_compiled(), "unit {unit} has no generated parser");
    for pieces in [&[stream][..], &[a, b][..]] {
        let mut q = g.parser(unit).interpreted();
        let interpreted = drive(&mut q, pieces, &mut |_, _, _| {});
        assert_eq!(
            whole, interpreted,
            "generated code and the interpreter differ"
        );
    }

    // (d): a view, of one field (a nested unit's by its path) or of none.
    let mut fields: Vec<String> = Vec::new();
    for f in &g.unit(unit).fields {
        fields.push(f.name.clone());
        if let flick_wire::FieldKind::Unit(inner) = f.kind {
            for i in &g.unit(inner).fields {
                fields.push(format!("{}.{}", f.name, i.name));
            }
        }
    }
    let chosen: Vec<&str> = fields
        .get(pick % (fields.len() + 1))
        .map(|f| f.as_str())
        .into_iter()
        .collect();
    let chosen = &chosen[..];
    let keep = g.view(unit, chosen).expect("the unit's own field");
    let mut v = Parser::with_view(g.clone(), unit, keep.clone());
    let viewed = drive(&mut v, &[stream], &mut |p, buf, _| {
        let _ = format!("{:?}", p.message(buf));
    });
    let mut vq = Parser::with_view(g.clone(), unit, keep.clone()).interpreted();
    let viewed_interpreted = drive(&mut vq, &[stream], &mut |_, _, _| {});
    assert_eq!(
        viewed, viewed_interpreted,
        "under a view of {chosen:?}, generated code and the interpreter differ"
    );
    assert_eq!(
        whole.shape(),
        viewed.shape(),
        "a view of {chosen:?} frames the stream otherwise"
    );
    let mut v = Parser::with_view(g.clone(), unit, keep);
    assert_eq!(
        batched(&mut v, stream),
        leading(&viewed),
        "under a view of {chosen:?}, batches and whole differ"
    );
}
