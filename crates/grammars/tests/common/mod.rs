//! What the grammar tests share: a proxy's read loop over a parser.

use flick_wire::{Parser, Progress};

/// What a proxy's read loop sees of `data`, offered first up to `cut` and
/// then whole: every progress report, with what `done` says of each
/// message done and `head` of each head handed over (both given the
/// parser and the count), and the error that ends it, if any.
pub fn drive(
    p: &mut Parser,
    data: &[u8],
    cut: usize,
    done: impl Fn(&Parser, usize) -> String,
    head: impl Fn(&Parser, usize) -> String,
) -> Vec<String> {
    let mut log = Vec::new();
    let (mut at, mut end) = (0, cut.min(data.len()));
    for _ in 0..data.len() * 4 + 16 {
        let buf = &data[at..end];
        match p.parse(buf) {
            Ok(Progress::Done(n)) => {
                log.push(done(p, n));
                p.reset();
                at += n;
                if at >= data.len() || n == 0 {
                    break;
                }
                end = end.max(at);
            }
            Ok(Progress::NeedMore) if end < data.len() => end = data.len(),
            Ok(Progress::NeedMore) => {
                log.push(format!("end {:?}", p.finish(buf)));
                break;
            }
            Ok(Progress::Head(n)) => log.push(head(p, n)),
            Ok(Progress::Stream(n)) => {
                log.push(format!("stream {n}"));
                at += n;
            }
            Err(e) => {
                log.push(format!("error {e:?}"));
                break;
            }
        }
    }
    log
}
