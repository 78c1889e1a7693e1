//! The inputs a `foldt` merges: channels that no rule reads, whose next
//! message waits at the head until the merge takes it.
//!
//! Each input is a stream checked as it is merged: where its grammar ends
//! a stream with a message (`%end`, Hadoop's end marker and CRC32), the
//! stream must end with exactly that message for the bytes it carried; and
//! its messages must come in the merge's key order. A stream that closes
//! without it (truncated, reset, or cut short by bytes that do not parse),
//! carries a wrong checksum or comes out of order fails the instance's job
//! (`GraphHost::fail_job`): its output streams are aborted without their
//! end, so that no reader takes a well-formed stream with wrong content.

use crate::compute::{FieldMap, GraphHost};
use crate::msg::Msg;
use flick_exec::{Fault, Value};
use flick_runtime::{Receiver, TryRecvError};
use flick_wire::{Slot, StreamCrc};
use std::cmp::Ordering;

/// One channel (of an array) whose messages a merge takes in key order.
pub struct MergeInput {
    pub rx: Receiver<Msg>,
    pub chan: u16,
    /// The message the merge looks at next.
    pub head: Option<Msg>,
    /// The stream ended: its connection closed, or it sent the message
    /// its grammar says ends a stream (`%ends`).
    pub ended: bool,
    /// It ended with the grammar's end message, which checked out.
    pub marked: bool,
    /// The CRC32 of the stream so far, for its end message's checksum.
    pub crc: StreamCrc,
    /// The key of the message the merge took from it last, to check their
    /// order; the storage is kept, so nothing is allocated per message.
    last_key: Option<OwnedKey>,
    /// Its place among the streams of the instance, for log lines.
    pub index: usize,
}

/// A key kept from a message given up.
enum OwnedKey {
    Int(i128),
    Bytes(Vec<u8>),
}

impl MergeInput {
    pub fn new(rx: Receiver<Msg>, chan: u16, index: usize) -> MergeInput {
        MergeInput {
            rx,
            chan,
            head: None,
            ended: false,
            marked: false,
            crc: StreamCrc::default(),
            last_key: None,
            index,
        }
    }

    /// Keeps `k` as the key taken last; `false` if it comes before the one
    /// taken before it.
    fn take_key(&mut self, k: &Key) -> bool {
        let in_order = match (&self.last_key, k) {
            (None, _) => true,
            (Some(OwnedKey::Int(a)), Key::Int(b)) => a <= b,
            (Some(OwnedKey::Bytes(a)), Key::Bytes(b)) => a.as_slice() <= *b,
            _ => false,
        };
        match (&mut self.last_key, k) {
            (Some(OwnedKey::Bytes(v)), Key::Bytes(b)) => {
                v.clear();
                v.extend_from_slice(b);
            }
            (slot, Key::Int(i)) => *slot = Some(OwnedKey::Int(*i)),
            (slot, Key::Bytes(b)) => *slot = Some(OwnedKey::Bytes(b.to_vec())),
        }
        in_order
    }

    /// Waiting for a message that has not arrived.
    fn waiting(&self) -> bool {
        self.head.is_none() && !self.ended
    }
}

/// A key to order by: an integer field or a bytes field.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Key<'a> {
    Int(i128),
    Bytes(&'a [u8]),
}

fn key_of<'a>(fields: &FieldMap, record: u16, field: u16, m: &'a Msg) -> Option<Key<'a>> {
    let (slot, _) = fields.get(record as usize)?.get(field as usize)?.clone()?;
    match m.slots.get(slot as usize)? {
        Slot::Int(v) => Some(Key::Int(*v as i128)),
        Slot::SInt(v) => Some(Key::Int(*v as i128)),
        Slot::Bytes { start, len } => m
            .bytes
            .get(*start as usize..(*start + *len) as usize)
            .map(Key::Bytes),
        _ => None,
    }
}

impl GraphHost {
    /// Moves each merge input's next message to its head; `true` if an
    /// input got a message or ended.
    pub(crate) fn fill_merges(&mut self) -> bool {
        let mut moved = false;
        for i in 0..self.merges.len() {
            if !self.merges[i].waiting() {
                continue;
            }
            match self.merges[i].rx.try_recv() {
                Ok(m) => {
                    moved = true;
                    let chan = self.merges[i].chan;
                    if m.rejected.is_some() {
                        // Bytes that do not parse: the stream is lost.
                        self.merges[i].ended = true;
                        self.pool.give(m);
                        self.fail_job(i, "sent bytes that do not parse");
                    } else if self.property(chan, "ends", &m).unwrap_or(0) != 0 {
                        self.merges[i].ended = true;
                        match self.end_checks_out(i, &m) {
                            true => self.merges[i].marked = true,
                            false => self.fail_job(i, "has a wrong checksum in its end marker"),
                        }
                        self.pool.give(m);
                    } else {
                        self.merges[i].crc.update(&m.bytes);
                        self.merges[i].head = Some(m);
                    }
                }
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Closed) => {
                    moved = true;
                    self.merges[i].ended = true;
                    if !self.merges[i].marked && self.has_end(self.merges[i].chan) {
                        self.fail_job(
                            i,
                            "ended without its end marker (its connection closed or was reset)",
                        );
                    }
                }
            }
        }
        moved
    }

    /// Whether stream `i`'s end message `m` is the one its grammar would
    /// write for the bytes the stream carried (`%end`); `true` where the
    /// grammar has none.
    fn end_checks_out(&mut self, i: usize, m: &Msg) -> bool {
        let Some(unit) = self
            .units
            .get(self.merges[i].chan as usize)
            .copied()
            .flatten()
        else {
            return true;
        };
        let mut want = self.pool.take();
        let made = self
            .grammar
            .end_of_stream(unit, &self.merges[i].crc, &mut want.bytes);
        let ok = match made {
            Ok(true) => want.bytes == m.bytes,
            _ => true,
        };
        self.pool.give(want);
        ok
    }

    /// Stream `i` is not what its grammar and the merge say a stream is:
    /// the job fails, visibly. The instance ends with its connections
    /// aborted (`Compute::break_up`), a log line says which stream and why,
    /// and a metric counts it.
    pub(crate) fn fail_job(&mut self, i: usize, why: &str) {
        if self.job_failed {
            return;
        }
        self.job_failed = true;
        self.broken = true;
        // The compute task may be waiting in a merge: it runs again, and
        // ends the instance.
        self.waker.wake(self.id);
        self.stats
            .jobs_failed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        static FAILED: crate::log::RateLimit = crate::log::RateLimit::new();
        crate::limited!(
            FAILED,
            error,
            stream = self.merges[i].index,
            "job failed: stream {} {why}; its output is aborted without its end",
            self.merges[i].index
        );
    }

    /// Whether streams read from `chan` end with a message (`%end`).
    fn has_end(&self, chan: u16) -> bool {
        self.units
            .get(chan as usize)
            .copied()
            .flatten()
            .is_some_and(|u| self.grammar.has_end(u))
    }

    /// Every stream of `chan` that has not ended has a message waiting,
    /// and at least one has.
    pub(crate) fn merge_ready(&mut self, chan: u16) -> bool {
        self.fill_merges();
        let of = || self.merges.iter().filter(|m| m.chan == chan);
        of().all(|m| !m.waiting()) && of().any(|m| m.head.is_some())
    }

    /// Whether every merge input has ended and been taken to its end.
    pub(crate) fn merges_done(&self) -> bool {
        self.merges.iter().all(|m| m.ended && m.head.is_none())
    }

    pub(crate) fn merge_take_msg(
        &mut self,
        chan: u16,
        record: u16,
        field: u16,
        key: Option<&Value>,
    ) -> Result<Option<Value>, Fault> {
        self.fill_merges();
        let of_chan = |m: &&MergeInput| m.chan == chan;
        if self.merges.iter().filter(of_chan).any(|m| m.waiting()) {
            return Ok(None);
        }
        let want = match key {
            None => None,
            Some(Value::Int(i)) => Some(Key::Int(*i as i128)),
            Some(v) => Some(Key::Bytes(
                flick_exec::Host::bytes(self, v).ok_or(Fault::Kind("a key"))?,
            )),
        };
        let mut best: Option<(usize, Key)> = None;
        for (i, m) in self.merges.iter().enumerate() {
            if m.chan != chan {
                continue;
            }
            let Some(head) = &m.head else { continue };
            let k = key_of(&self.fields, record, field, head)
                .ok_or(Fault::Kind("a record with its ordering field"))?;
            let take = match &want {
                Some(w) => k == *w,
                None => best
                    .as_ref()
                    .is_none_or(|(_, b)| k.cmp(b) == Ordering::Less),
            };
            if take {
                best = Some((i, k));
                if want.is_some() {
                    break;
                }
            }
        }
        let Some((i, _)) = best else {
            return Ok(Some(Value::None));
        };
        let m = self.merges[i].head.take().expect("chosen for its head");
        let k = key_of(&self.fields, record, field, &m).expect("keyed when chosen");
        if !self.merges[i].take_key(&k) {
            self.pool.give(m);
            self.fail_job(i, "has its keys out of order");
            return Ok(None);
        }
        self.taken += 1;
        Ok(Some(self.hold(m)))
    }
}
