//! The inputs a `foldt` merges: channels that no rule reads, whose next
//! message waits at the head until the merge takes it.

use crate::compute::{FieldMap, GraphHost};
use crate::msg::Msg;
use flick_exec::{Fault, Value};
use flick_runtime::{Receiver, TryRecvError};
use flick_wire::Slot;
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
}

impl MergeInput {
    pub fn new(rx: Receiver<Msg>, chan: u16) -> MergeInput {
        MergeInput {
            rx,
            chan,
            head: None,
            ended: false,
        }
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
                    if self.property(chan, "ends", &m).unwrap_or(0) != 0 {
                        self.merges[i].ended = true;
                        self.pool.give(m);
                    } else {
                        self.merges[i].head = Some(m);
                    }
                }
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Closed) => {
                    moved = true;
                    self.merges[i].ended = true;
                }
            }
        }
        moved
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
        self.taken += 1;
        Ok(Some(self.hold(m)))
    }
}
