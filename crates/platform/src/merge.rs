//! The inputs a `foldt` merges: channels that no rule reads, whose next
//! record waits at the head until the merge takes it.
//!
//! An input's reader sends the stream's bytes in chunks (`merge_read.rs`);
//! the merge parses them where they lie, a run of records at a time with
//! the grammar's generated code (`Parser::parse_batch`), and compares keys
//! as slices of those bytes. A record becomes a message only where compute
//! code takes it as a value (the first element of a key); a body the host
//! folds natively (`flick_exec::fold`) takes every further record of the
//! key straight from the batch, and the record is built once per key.
//!
//! Each input is a stream checked as it is merged: where its grammar ends
//! a stream with a message (`%end`, Hadoop's end marker and CRC32), the
//! stream must end with exactly that message for the bytes it carried; and
//! its records must come in the merge's key order. A stream that closes
//! without it (truncated, reset, or cut short by bytes that do not parse),
//! carries a wrong checksum or comes out of order fails the instance's job
//! (`GraphHost::fail_job`): its output streams are aborted without their
//! end, so that no reader takes a well-formed stream with wrong content.

use crate::compute::{FieldMap, GraphHost};
use crate::msg::{Msg, MsgPool, Values};
use flick_exec::{Fault, FoldCall, FoldStep, Value};
use flick_runtime::{Receiver, TryRecvError};
use flick_wire::{
    Batch, Grammar, Parser, PlainInt, Progress, PropertyRef, Slot, StreamCrc, UnitId,
};
use std::cmp::Ordering;
use std::sync::Arc;

/// Rows of a batch: records parsed in one go. Few enough that the rows of
/// every input of a merge stay in the cache together.
const ROWS: usize = 64;

/// Records a native fold takes between looks at the timeslice.
const FOLD_SLICE: u32 = 1024;

/// Where the record at the head of an input lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Head {
    None,
    /// Row `i` of the batch parsed from `batch_at` in the chunk.
    Row(usize),
    /// A record parsed on its own (the parser holds its values), `len`
    /// bytes at `start` of the chunk, or of `carry`.
    Single {
        start: usize,
        len: usize,
        carry: bool,
    },
}

/// What looking for an input's next record found.
enum Fill {
    Head,
    Waiting,
    /// The connection closed.
    Closed,
    /// The stream is broken: why.
    Bad(&'static str),
}

/// One channel (of an array) whose records a merge takes in key order.
pub struct MergeInput {
    pub rx: Receiver<Msg>,
    pub chan: u16,
    /// The stream ended: its connection closed, or it sent the message
    /// its grammar says ends a stream (`%ends`).
    pub ended: bool,
    /// It ended with the grammar's end message, which checked out.
    pub marked: bool,
    /// The CRC32 of the stream so far, for its end message's checksum.
    pub crc: StreamCrc,
    /// The key of the record the merge took from it last, to check their
    /// order; the storage is kept, so nothing is allocated per record.
    last_key: Option<OwnedKey>,
    /// Its place among the streams of the instance, for log lines.
    pub index: usize,
    head: Head,
    /// Bytes received and not all taken yet.
    chunk: Option<Msg>,
    /// Where the chunk's unparsed bytes begin.
    pos: usize,
    /// The chunk's bytes from `crc_from` to `crc_to` are records taken
    /// into the stream's CRC32 but not yet added to it.
    crc_from: usize,
    crc_to: usize,
    /// A record split between chunks, put together (from `cpos` on).
    carry: Vec<u8>,
    cpos: usize,
    /// The carry's bytes from earlier chunks; those after them are the
    /// chunk's, up to `pos`, copied.
    carry_old: usize,
    /// The carry from `cpos` on holds no whole record: it grows before it
    /// is parsed again.
    carry_short: bool,
    parser: Option<Parser>,
    batch: Option<Batch>,
    batch_at: usize,
    /// Rows of the batch, and the next one to take.
    rows: usize,
    next_row: usize,
    /// The most bytes a record may take (0 until the parser is made).
    max: usize,
    /// The grammar's `%ends`, which says a record ends the stream.
    ends: Option<PropertyRef>,
}

/// A key kept from a record given up.
enum OwnedKey {
    Int(i128),
    Bytes(Vec<u8>),
}

impl MergeInput {
    pub fn new(rx: Receiver<Msg>, chan: u16, index: usize) -> MergeInput {
        MergeInput {
            rx,
            chan,
            ended: false,
            marked: false,
            crc: StreamCrc::default(),
            last_key: None,
            index,
            head: Head::None,
            chunk: None,
            pos: 0,
            crc_from: 0,
            crc_to: 0,
            carry: Vec::new(),
            cpos: 0,
            carry_old: 0,
            carry_short: false,
            parser: None,
            batch: None,
            batch_at: 0,
            rows: 0,
            next_row: 0,
            max: 0,
            ends: None,
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
                if v.as_slice() != *b {
                    v.clear();
                    v.extend_from_slice(b);
                }
            }
            (slot, Key::Int(i)) => *slot = Some(OwnedKey::Int(*i)),
            (slot, Key::Bytes(b)) => *slot = Some(OwnedKey::Bytes(b.to_vec())),
        }
        in_order
    }

    /// Waiting for a record that has not arrived.
    fn waiting(&self) -> bool {
        self.head == Head::None && !self.ended
    }

    fn has_head(&self) -> bool {
        self.head != Head::None
    }

    /// The head record's bytes and values (byte ranges count from its
    /// first byte).
    #[inline]
    fn head(&self) -> Option<(&[u8], &[Slot])> {
        match self.head {
            Head::None => None,
            Head::Row(i) => {
                let (b, c) = (self.batch.as_ref()?, self.chunk.as_ref()?);
                let span = b.span(i);
                let at = self.batch_at;
                Some((&c.bytes[at + span.start..at + span.end], b.slots(i)))
            }
            Head::Single { start, len, carry } => {
                let buf = match carry {
                    true => &self.carry[..],
                    false => &self.chunk.as_ref()?.bytes[..],
                };
                Some((&buf[start..start + len], self.parser.as_ref()?.slots()))
            }
        }
    }

    /// The head record is taken: the next one is looked for by `fill`.
    fn advance(&mut self) {
        match self.head {
            Head::Single {
                len, carry: true, ..
            } => self.cpos += len,
            Head::Single {
                len, carry: false, ..
            } => self.pos += len,
            Head::Row(_) | Head::None => {}
        }
        self.head = Head::None;
    }

    /// The head record, not the stream's end, counts towards its CRC32.
    fn count_head(&mut self) {
        match self.head {
            Head::Row(i) => {
                let end = self.batch_at + self.batch.as_ref().map_or(0, |b| b.span(i).end);
                self.crc_to = end;
            }
            Head::Single {
                start,
                len,
                carry: false,
            } => self.crc_to = start + len,
            Head::Single {
                start,
                len,
                carry: true,
            } => self.crc.update(&self.carry[start..start + len]),
            Head::None => {}
        }
    }

    /// Adds the records counted in the chunk to the CRC32.
    fn flush_crc(&mut self) {
        if let Some(c) = &self.chunk {
            if self.crc_to > self.crc_from {
                self.crc.update(&c.bytes[self.crc_from..self.crc_to]);
            }
        }
        self.crc_from = self.crc_to;
    }

    /// Folds the rows of the batch after the record taken last while they
    /// have key `want`, up to `most` of them: they are taken as the head
    /// would be, without looking for the next one after each. Stops at a
    /// row with another key, one that ends the stream (`%ends`) or the
    /// batch's end, which `fill_one` then takes as usual; returns how many
    /// it folded. The input's last key must be `want` already.
    #[inline]
    fn fold_rows(
        &mut self,
        grammar: &Grammar,
        plan: &FoldPlan,
        want: &Key,
        fold: &flick_exec::FoldSpec,
        accs: &mut [i64],
        most: u32,
    ) -> Result<u32, Fault> {
        let (Some(batch), Some(chunk)) = (&self.batch, &self.chunk) else {
            return Ok(0);
        };
        if self.head != Head::None || self.next_row >= self.rows {
            return Ok(0);
        }
        let at = self.batch_at;
        let rows = self.rows.min(self.next_row + most as usize);
        let mut next = [0i64; flick_exec::fold::MAX_ACCS];
        let mut row = self.next_row;
        let mut end = self.crc_to;
        let r = loop {
            if row >= rows {
                break Ok(());
            }
            let span = batch.span(row);
            let bytes = &chunk.bytes[at + span.start..at + span.end];
            let slots = batch.slots(row);
            if let Some(p) = &self.ends {
                if grammar.property_at(p, slots, bytes).unwrap_or(0) != 0 {
                    break Ok(());
                }
            }
            match same_key(slots, bytes, plan.key, want) {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(e) => break Err(e),
            }
            let step = (|| {
                for (n, slot) in next.iter_mut().zip(&plan.next) {
                    *n = slot_int(slots, *slot)?;
                }
                fold.step(accs, &next[..plan.next.len()])
            })();
            if let Err(e) = step {
                // As `fill_one` would have left it: this row at the head.
                self.head = Head::Row(row);
                row += 1;
                end = at + span.end;
                break Err(e);
            }
            for (a, (_, int)) in accs.iter_mut().zip(&plan.accs) {
                *a = int.wrap(*a);
            }
            row += 1;
            end = at + span.end;
        };
        let taken = (row - self.next_row) as u32;
        self.next_row = row;
        self.crc_to = end;
        r.map(|()| taken)
    }

    /// Gives back what the input holds of the stream (it ended).
    fn let_go(&mut self, pool: &MsgPool) {
        self.head = Head::None;
        self.rows = 0;
        self.next_row = 0;
        if let Some(c) = self.chunk.take() {
            pool.give(c);
        }
        self.clear_carry();
    }

    fn clear_carry(&mut self) {
        self.carry.clear();
        self.cpos = 0;
        self.carry_old = 0;
        self.carry_short = false;
    }

    /// Finds the next record: in the batch, in what is buffered (parsing
    /// a run of records at once), or in the next chunk received.
    fn fill(&mut self, grammar: &Arc<Grammar>, unit: UnitId, pool: &MsgPool) -> Fill {
        if self.next_row < self.rows {
            self.head = Head::Row(self.next_row);
            self.next_row += 1;
            return Fill::Head;
        }
        self.rows = 0;
        self.next_row = 0;
        if self.parser.is_none() {
            self.parser = Some(grammar.parser(unit));
            // As a connection's reader bounds a message.
            self.max = (grammar.max_bytes(unit) as usize).clamp(4096, 16 << 20);
            self.ends = grammar.property_ref(unit, "ends");
        }
        loop {
            if self.cpos < self.carry.len() {
                if self.cpos >= self.carry_old && self.chunk.is_some() {
                    // The split record is taken, and what follows it is
                    // in the chunk as well: parsed there, in batches.
                    self.pos -= self.carry.len() - self.cpos;
                    self.crc_from = self.pos;
                    self.crc_to = self.pos;
                    self.clear_carry();
                    continue;
                }
                let parser = self.parser.as_mut().expect("made");
                if !self.carry_short {
                    // A record split between chunks, put together here.
                    parser.reset();
                    match parser.parse(&self.carry[self.cpos..]) {
                        Ok(Progress::Done(n)) => {
                            self.head = Head::Single {
                                start: self.cpos,
                                len: n,
                                carry: true,
                            };
                            return Fill::Head;
                        }
                        Ok(Progress::NeedMore) => self.carry_short = true,
                        Ok(_) => return Fill::Bad("streams a body, which a merge does not take"),
                        Err(_) => return Fill::Bad("sent bytes that do not parse"),
                    }
                }
                let have = self.carry.len() - self.cpos;
                let rest = self
                    .chunk
                    .as_ref()
                    .map_or(&[][..], |c| &c.bytes[self.pos..]);
                if !rest.is_empty() {
                    // Twice as much of it (up to the most a record may
                    // take), from the next chunk.
                    let room = self.max.saturating_sub(have);
                    if room == 0 {
                        return Fill::Bad("sent a record longer than allowed");
                    }
                    let k = have.max(256).min(rest.len()).min(room);
                    self.carry.extend_from_slice(&rest[..k]);
                    self.carry_short = false;
                    self.pos += k;
                    self.crc_from = self.pos;
                    self.crc_to = self.pos;
                    continue;
                }
            } else if !self.carry.is_empty() {
                self.clear_carry();
                continue;
            } else if let Some(c) = self.chunk.as_ref().filter(|c| self.pos < c.bytes.len()) {
                let rest = &c.bytes[self.pos..];
                let parser = self.parser.as_mut().expect("made");
                parser.reset();
                let batch = self.batch.get_or_insert_with(|| parser.batch(ROWS));
                let consumed = parser.parse_batch(rest, batch);
                let n = batch.len();
                if n > 0 {
                    self.batch_at = self.pos;
                    self.pos += consumed;
                    self.rows = n;
                    self.next_row = 1;
                    self.head = Head::Row(0);
                    return Fill::Head;
                }
                // A record the generated code does not finish: most often
                // one split with the next chunk. Where that chunk is here
                // already, the record is put together and parsed once
                // (by the generated code); otherwise the interpreter reads
                // it now, or says what is wrong without waiting for more.
                if rest.len() <= self.max && !self.rx.is_empty() {
                    self.carry.extend_from_slice(rest);
                    self.carry_old = self.carry.len();
                    self.carry_short = true;
                    self.pos = c.bytes.len();
                } else {
                    parser.reset();
                    match parser.parse(rest) {
                        Ok(Progress::Done(n)) => {
                            self.head = Head::Single {
                                start: self.pos,
                                len: n,
                                carry: false,
                            };
                            return Fill::Head;
                        }
                        Ok(Progress::NeedMore) => {
                            if rest.len() > self.max {
                                return Fill::Bad("sent a record longer than allowed");
                            }
                            self.carry.extend_from_slice(rest);
                            self.carry_old = self.carry.len();
                            self.carry_short = true;
                            self.pos = c.bytes.len();
                        }
                        Ok(_) => return Fill::Bad("streams a body, which a merge does not take"),
                        Err(_) => return Fill::Bad("sent bytes that do not parse"),
                    }
                }
            }
            // Everything buffered is parsed: the next chunk.
            if let Some(c) = self.chunk.take() {
                if self.crc_to > self.crc_from {
                    self.crc.update(&c.bytes[self.crc_from..self.crc_to]);
                }
                pool.give(c);
            }
            self.crc_from = self.crc_to;
            match self.rx.try_recv() {
                Ok(m) if m.rejected.is_some() => {
                    pool.give(m);
                    return Fill::Bad("sent bytes that do not parse");
                }
                Ok(m) => {
                    self.chunk = Some(m);
                    // The carry's bytes are all of earlier chunks now.
                    self.carry_old = self.carry.len();
                    self.pos = 0;
                    self.crc_from = 0;
                    self.crc_to = 0;
                }
                Err(TryRecvError::Empty) => return Fill::Waiting,
                Err(TryRecvError::Closed) => return Fill::Closed,
            }
        }
    }
}

/// A key to order by: an integer field or a bytes field.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Key<'a> {
    Int(i128),
    Bytes(&'a [u8]),
}

#[inline]
fn key_in<'a>(slot: u16, bytes: &'a [u8], slots: &[Slot]) -> Option<Key<'a>> {
    match slots.get(slot as usize)? {
        Slot::Int(v) => Some(Key::Int(*v as i128)),
        Slot::SInt(v) => Some(Key::Int(*v as i128)),
        Slot::Bytes { start, len } => bytes
            .get(*start as usize..(*start + *len) as usize)
            .map(Key::Bytes),
        _ => None,
    }
}

fn slot_of(fields: &FieldMap, record: u16, field: u16) -> Option<u16> {
    Some(fields.get(record as usize)?.get(field as usize)?.clone()?.0)
}

/// What native folds keep between calls: the plan of the last, and room
/// for a key.
#[derive(Default)]
pub struct FoldState {
    plan: Option<FoldPlan>,
    key: Vec<u8>,
}

/// Where a native fold finds its values, worked out once per instance.
struct FoldPlan {
    /// The spec it was made for (its address: specs live in the module).
    fold: usize,
    key: u16,
    /// Per running value: its slot and how it reads back once written.
    accs: Vec<(u16, PlainInt)>,
    /// Slots of the next element's fields the steps read.
    next: Vec<u16>,
}

impl GraphHost {
    /// Finds each waiting merge input's next record; `true` if an input
    /// got one or ended.
    pub(crate) fn fill_merges(&mut self) -> bool {
        let mut moved = false;
        for i in 0..self.merges.len() {
            if self.merges[i].waiting() {
                moved |= self.fill_one(i);
            }
        }
        moved
    }

    /// Looks for input `i`'s next record, checking the stream as it
    /// goes; `true` if it got one or ended.
    #[inline]
    fn fill_one(&mut self, i: usize) -> bool {
        // The next row of the batch: the common case, kept short.
        let input = &mut self.merges[i];
        if input.next_row < input.rows {
            let row = input.next_row;
            let batch = input.batch.as_ref().expect("rows are of the batch");
            let span = batch.span(row);
            let at = input.batch_at;
            let ends = match (&input.ends, &input.chunk) {
                (Some(p), Some(c)) => {
                    let bytes = &c.bytes[at + span.start..at + span.end];
                    self.grammar
                        .property_at(p, batch.slots(row), bytes)
                        .unwrap_or(0)
                        != 0
                }
                _ => false,
            };
            if !ends {
                input.head = Head::Row(row);
                input.next_row += 1;
                input.crc_to = at + span.end;
                return true;
            }
        }
        self.fill_slow(i)
    }

    fn fill_slow(&mut self, i: usize) -> bool {
        let chan = self.merges[i].chan;
        let Some(unit) = self.units.get(chan as usize).copied().flatten() else {
            return false;
        };
        match self.merges[i].fill(&self.grammar, unit, &self.pool) {
            Fill::Head => {
                let input = &self.merges[i];
                let (bytes, slots) = input.head().expect("just found");
                let ends = input.ends.as_ref();
                if ends.is_none_or(|p| self.grammar.property_at(p, slots, bytes).unwrap_or(0) == 0)
                {
                    self.merges[i].count_head();
                    return true;
                }
                self.merges[i].ended = true;
                self.merges[i].flush_crc();
                let ok = self.end_checks_out(i, unit);
                self.merges[i].let_go(&self.pool);
                match ok {
                    true => self.merges[i].marked = true,
                    false => self.fail_job(i, "has a wrong checksum in its end marker"),
                }
                true
            }
            Fill::Waiting => false,
            Fill::Closed => {
                self.merges[i].ended = true;
                self.merges[i].let_go(&self.pool);
                if !self.merges[i].marked && self.grammar.has_end(unit) {
                    self.fail_job(
                        i,
                        "ended without its end marker (its connection closed or was reset)",
                    );
                }
                true
            }
            Fill::Bad(why) => {
                self.merges[i].ended = true;
                self.merges[i].let_go(&self.pool);
                self.fail_job(i, why);
                true
            }
        }
    }

    /// Whether stream `i`'s end message, at its head, is the one its
    /// grammar would write for the bytes the stream carried (`%end`);
    /// `true` where the grammar has none.
    fn end_checks_out(&mut self, i: usize, unit: UnitId) -> bool {
        let mut want = self.pool.take();
        let made = self
            .grammar
            .end_of_stream(unit, &self.merges[i].crc, &mut want.bytes);
        let ok = match (made, self.merges[i].head()) {
            (Ok(true), Some((bytes, _))) => want.bytes == bytes,
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

    /// Every stream of `chan` that has not ended has a record waiting,
    /// and at least one has.
    pub(crate) fn merge_ready(&mut self, chan: u16) -> bool {
        self.fill_merges();
        let of = || self.merges.iter().filter(|m| m.chan == chan);
        of().all(|m| !m.waiting()) && of().any(|m| m.has_head())
    }

    /// Whether every merge input has ended and been taken to its end.
    pub(crate) fn merges_done(&self) -> bool {
        self.merges.iter().all(|m| m.ended && !m.has_head())
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
        let slot = slot_of(&self.fields, record, field)
            .ok_or(Fault::Kind("a record with its ordering field"))?;
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
            let Some((bytes, slots)) = m.head() else {
                continue;
            };
            let k = key_in(slot, bytes, slots)
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
        let unit = self.units.get(chan as usize).copied().flatten();
        let m = self.take_head(i, slot, unit)?;
        Ok(m.map(|m| self.hold(m)))
    }

    /// Takes input `i`'s head record as a message, after checking its
    /// key's order; `None` (the job failed) if it is out of order.
    fn take_head(
        &mut self,
        i: usize,
        slot: u16,
        unit: Option<UnitId>,
    ) -> Result<Option<Msg>, Fault> {
        // The key, kept apart from the input for the order check.
        let mut scratch = std::mem::take(&mut self.fold.key);
        scratch.clear();
        let (bytes, slots) = self.merges[i].head().expect("chosen for its head");
        let int = match key_in(slot, bytes, slots).expect("keyed when chosen") {
            Key::Int(v) => Some(v),
            Key::Bytes(b) => {
                scratch.extend_from_slice(b);
                None
            }
        };
        let k = match int {
            Some(v) => Key::Int(v),
            None => Key::Bytes(&scratch),
        };
        let in_order = self.merges[i].take_key(&k);
        self.fold.key = scratch;
        if !in_order {
            self.merges[i].advance();
            self.fail_job(i, "has its keys out of order");
            return Ok(None);
        }
        let mut m = self.pool.take();
        let input = &self.merges[i];
        let (bytes, slots) = input.head().expect("still there");
        m.bytes.extend_from_slice(bytes);
        if let Some(unit) = unit {
            let values = Values::Parsed {
                unit,
                high: slots.len() as u32,
            };
            self.pool.copy_values(&mut m, values, slots);
        }
        self.merges[i].advance();
        self.taken += 1;
        Ok(Some(m))
    }

    /// The plan for folding `spec`'s records natively, or `None` where
    /// their fields are not plain integers of the grammar.
    fn fold_plan(
        &self,
        chan: u16,
        record: u16,
        field: u16,
        spec: &flick_exec::FoldSpec,
    ) -> Option<FoldPlan> {
        let unit = self.units.get(chan as usize).copied().flatten()?;
        let int_slot = |f: u16| -> Option<u16> {
            let (slot, kind) = self.fields.get(record as usize)?.get(f as usize)?.clone()?;
            matches!(kind, flick_wire::FieldKind::Int).then_some(slot)
        };
        let accs = spec
            .accs
            .iter()
            .map(|(f, _)| {
                let slot = int_slot(*f)?;
                Some((slot, self.grammar.plain_int(unit, slot)?))
            })
            .collect::<Option<Vec<_>>>()?;
        let next = spec
            .next_fields
            .iter()
            .map(|f| int_slot(*f))
            .collect::<Option<Vec<_>>>()?;
        Some(FoldPlan {
            fold: spec as *const _ as usize,
            key: slot_of(&self.fields, record, field)?,
            accs,
            next,
        })
    }

    /// Folds every further record with the fold's key natively (see
    /// `flick_exec::Host::merge_fold`): records are taken from the batches
    /// where they were parsed, their key compared in place, their values
    /// folded into the running ones, each wrapped as the record built at
    /// every step would read back.
    pub(crate) fn merge_fold_native(&mut self, call: FoldCall<'_>) -> Result<FoldStep, Fault> {
        let id = call.fold as *const _ as usize;
        if self.fold.plan.as_ref().is_none_or(|p| p.fold != id) {
            match self.fold_plan(call.chan, call.record, call.field, call.fold) {
                Some(p) => self.fold.plan = Some(p),
                None => return Ok(FoldStep::Unsupported),
            }
        }
        let plan = self.fold.plan.take().expect("made above");
        let r = self.fold_with(&plan, call);
        self.fold.plan = Some(plan);
        r
    }

    fn fold_with(&mut self, plan: &FoldPlan, call: FoldCall<'_>) -> Result<FoldStep, Fault> {
        let FoldCall {
            chan,
            record,
            key,
            first,
            fold,
            accs,
            count,
            slice,
            ..
        } = call;
        if *count == 0 {
            // The running values start as the first element's.
            let Value::Msg(h) = first else {
                return Err(Fault::Kind("a record"));
            };
            let m = self
                .msgs
                .get(*h as usize)
                .and_then(|m| m.as_ref())
                .ok_or(Fault::Kind("a live record"))?;
            for (a, (slot, _)) in accs.iter_mut().zip(&plan.accs) {
                *a = slot_int(&m.slots, *slot)?;
            }
        }
        // The key, kept apart from the records it is compared with.
        let mut want = std::mem::take(&mut self.fold.key);
        want.clear();
        let int_key = match key {
            Value::Int(i) => Some(*i as i128),
            v => {
                want.extend_from_slice(
                    flick_exec::Host::bytes(self, v).ok_or(Fault::Kind("a key"))?,
                );
                None
            }
        };
        let r = self.fold_loop(
            plan, chan, record, key, int_key, &want, fold, accs, count, slice,
        );
        self.fold.key = want;
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn fold_loop(
        &mut self,
        plan: &FoldPlan,
        chan: u16,
        record: u16,
        key: &Value,
        int_key: Option<i128>,
        want: &[u8],
        fold: &flick_exec::FoldSpec,
        accs: &mut [i64],
        count: &mut i64,
        slice: &mut flick_runtime::Timeslice,
    ) -> Result<FoldStep, Fault> {
        let want = match int_key {
            Some(i) => Key::Int(i),
            None => Key::Bytes(want),
        };
        self.fill_merges();
        if self.merges.iter().any(|m| m.chan == chan && m.waiting()) {
            return Ok(FoldStep::Blocked);
        }
        let mut next = [0i64; flick_exec::fold::MAX_ACCS];
        let mut budget = FOLD_SLICE;
        // Inputs whose last key is the fold's key already (their order
        // holds for every further record of it).
        let mut ordered: u64 = 0;
        let mut i = 0;
        // Every input holds a record or has ended. The first one (in
        // order) whose head has the key gives the next element; inputs
        // before it hold other keys until it is taken, so the search goes
        // on from there.
        while i < self.merges.len() {
            let input = &self.merges[i];
            let Some((bytes, slots)) = input.head().filter(|_| input.chan == chan) else {
                i += 1;
                continue;
            };
            if !same_key(slots, bytes, plan.key, &want)? {
                i += 1;
                continue;
            }
            for (n, slot) in next.iter_mut().zip(&plan.next) {
                *n = slot_int(slots, *slot)?;
            }
            let known = i < 64 && ordered & (1 << i) != 0;
            if !known {
                if !self.merges[i].take_key(&want) {
                    self.merges[i].advance();
                    self.fail_job(i, "has its keys out of order");
                    return Ok(FoldStep::Blocked);
                }
                if i < 64 {
                    ordered |= 1 << i;
                }
            }
            fold.step(accs, &next[..plan.next.len()])?;
            for (a, (_, int)) in accs.iter_mut().zip(&plan.accs) {
                *a = int.wrap(*a);
            }
            *count += 1;
            self.taken += 1;
            self.merges[i].advance();
            if *count == 1 {
                // The record the first step builds: a fault in building it
                // (from the key) comes where the interpreter's would.
                self.check_build(record, &fold.args, key, accs)?;
            }
            budget -= 1;
            // The rows of the batch that follow with the same key, folded
            // in one loop (its order held for this one, so for them too).
            let run = self.merges[i].fold_rows(&self.grammar, plan, &want, fold, accs, budget)?;
            *count += run as i64;
            self.taken += run as u64;
            budget -= run;
            self.fill_one(i);
            if self.merges[i].waiting() || self.broken {
                return Ok(FoldStep::Blocked);
            }
            if budget == 0 {
                budget = FOLD_SLICE;
                if slice.expired() {
                    return Ok(FoldStep::Yielded);
                }
            }
        }
        Ok(FoldStep::Done)
    }

    /// Builds (and drops) the record of a fold step, for its faults.
    fn check_build(
        &mut self,
        record: u16,
        args: &[flick_exec::fold::FoldArg],
        key: &Value,
        accs: &[i64],
    ) -> Result<(), Fault> {
        let mut fields = [const { Value::None }; flick_exec::fold::MAX_ACCS + 1];
        for (f, a) in fields.iter_mut().zip(args) {
            *f = match a {
                flick_exec::fold::FoldArg::Key => key.clone(),
                flick_exec::fold::FoldArg::Acc(i) => Value::Int(accs[*i as usize]),
            };
        }
        let m = self.build(record, &fields[..args.len()])?;
        self.pool.give(m);
        Ok(())
    }
}

/// Whether two keys are the same bytes: short keys in two overlapping
/// word loads each, without a call.
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word8 = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().expect("8"));
    let word4 = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4"));
    match n {
        17.. => a == b,
        8..=16 => (word8(a, 0) ^ word8(b, 0)) | (word8(a, n - 8) ^ word8(b, n - 8)) == 0,
        4..=7 => (word4(a, 0) ^ word4(b, 0)) | (word4(a, n - 4) ^ word4(b, n - 4)) == 0,
        _ => a == b,
    }
}

/// Whether the record (`bytes`, `slots`) has key `want` in `slot`.
#[inline(always)]
fn same_key(slots: &[Slot], bytes: &[u8], slot: u16, want: &Key) -> Result<bool, Fault> {
    Ok(match (slots.get(slot as usize), want) {
        (Some(Slot::Bytes { start, len }), Key::Bytes(w)) => bytes
            .get(*start as usize..(*start + *len) as usize)
            .is_some_and(|k| same_bytes(k, w)),
        (Some(Slot::Int(v)), Key::Int(w)) => *v as i128 == *w,
        (Some(Slot::SInt(v)), Key::Int(w)) => *v as i128 == *w,
        (Some(Slot::Bytes { .. } | Slot::Int(_) | Slot::SInt(_)), _) => false,
        _ => return Err(Fault::Kind("a record with its ordering field")),
    })
}

#[inline]
fn slot_int(slots: &[Slot], slot: u16) -> Result<i64, Fault> {
    match slots.get(slot as usize) {
        Some(Slot::Int(v)) => Ok(*v as i64),
        Some(Slot::SInt(v)) => Ok(*v),
        _ => Err(Fault::Kind("an integer")),
    }
}
