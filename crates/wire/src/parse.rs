//! The incremental parser: interprets a unit's operations over the bytes of
//! one message, resuming where it stopped when the bytes run out.
//!
//! The caller keeps the message's bytes contiguous from its first byte and
//! calls [`Parser::parse`] again with the same prefix and more bytes after
//! [`Progress::NeedMore`]. Nothing is allocated per message: slots and the
//! frame stack are sized once, when the parser is made.
//!
//! The parser runs the grammar's [plan](crate::plan): within a block it
//! steps through the plan's steps without going back to the frame stack,
//! which it touches only to enter a unit, a switch case or a list, or to
//! stop for more bytes.

use crate::batch::Batch;
use crate::compiled::FastParse;
use crate::error::{WireError, WireErrorKind};
use crate::eval::{slot_val, Env, Val};
use crate::int_expr::Operand;
use crate::plan::{Check, ListRegion, Pred, Run, RunKind, StepKind, ValExpr};
use crate::program::*;
use crate::ranges::in_ranges;
use crate::rt::HEAD;
use crate::scalar::{read_vlong, starts};
use crate::{Grammar, Message};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The message ends after this many bytes (counted from the start of
    /// the buffer passed in, which after [`Progress::Stream`] is the first
    /// byte not yet handed over).
    Done(usize),
    /// The bytes end inside a message; call again with more.
    NeedMore,
    /// Everything before the message's first `&stream` field is parsed,
    /// in this many bytes: the head's values can be read now. The head's
    /// bytes stay in the buffer; call again to go on.
    Head(usize),
    /// This many bytes from the start of the buffer belong to the message
    /// and are finished with: pass them on, drop them from the buffer, and
    /// call again with what follows. Values of the head are gone from then on.
    Stream(usize),
}

#[derive(Clone, Copy, Debug)]
enum Frame {
    Seq {
        block: BlockId,
        pc: u32,
        base: u32,
    },
    List {
        block: BlockId,
        op: u32,
        /// The count slot; elements follow.
        base: u32,
        index: u32,
        /// The element count of a `&count` list, once evaluated.
        target: Option<u32>,
        after_elem: bool,
        /// Where the list began, for `&max_bytes`.
        start: u32,
    },
}

/// Most spaces and tabs a `ws` field takes.
pub const WS_MAX: usize = 1024;

/// Deepest nesting of units, switches and lists a grammar may use.
const MAX_DEPTH: usize = 64;

/// Parses messages of one unit of a grammar, one after another.
pub struct Parser {
    grammar: Arc<Grammar>,
    unit: UnitId,
    st: State,
    /// The unit's generated parser, tried first on each message.
    fast: Option<FastParse>,
    /// Messages the generated parser finished.
    compiled: u64,
    /// Heads the generated parser parsed and handed over at a stream.
    compiled_heads: u64,
}

/// What parsing changes; apart from the grammar, so that the grammar can
/// be borrowed while the state is written.
pub(crate) struct State {
    pub(crate) slots: Vec<Slot>,
    stack: Vec<Frame>,
    pub(crate) pos: usize,
    /// Where a delimiter search resumes, so rescans are not quadratic.
    pub(crate) scan: usize,
    /// Slots a view needs; `None` stores every field.
    keep: Option<Arc<[bool]>>,
    /// Whether [`Progress::Head`] was reported for this message.
    head_done: bool,
    /// Bytes still to come of the `&stream` field being passed on.
    remaining: Option<u64>,
    /// Set by [`Parser::finish`]: no bytes follow the buffer.
    eof: bool,
    /// `reply_context()` for the message being parsed.
    context: i128,
    /// One past the highest slot written for this message.
    high: usize,
    /// Nothing of the current message is parsed yet, and the frame stack
    /// is not set up for it.
    fresh: bool,
    /// Slots below this may still hold the last message's values: what
    /// generated code left, for the interpreter to unset before it starts
    /// on a message the code handed over (see [`Parser::reset`]).
    stale: usize,
    /// Generated code finished the current message: it leaves no slot of
    /// an earlier message set, so nothing needs clearing after it.
    by_code: bool,
    /// `limit(..)`: the grammar's limits when the parser was made.
    limits: Box<[i128]>,
    /// `streamed()`: the `&stream` bytes of this message begun so far.
    streamed: u64,
}

impl Parser {
    pub fn new(grammar: Arc<Grammar>, unit: UnitId) -> Parser {
        let n = grammar.units[unit].slots as usize;
        let fast = crate::compiled::lookup(&grammar, unit);
        let limits = grammar.limit_values.clone();
        let mut p = Parser {
            fast,
            compiled: 0,
            compiled_heads: 0,
            grammar,
            unit,
            st: State {
                slots: vec![Slot::Unset; n],
                stack: Vec::with_capacity(MAX_DEPTH),
                pos: 0,
                scan: 0,
                keep: None,
                head_done: false,
                remaining: None,
                eof: false,
                context: 0,
                high: 0,
                fresh: true,
                stale: 0,
                by_code: false,
                limits,
                streamed: 0,
            },
        };
        p.reset();
        p
    }

    /// A parser that decodes only the slots in `keep` (see [`Grammar::view`]).
    pub fn with_view(grammar: Arc<Grammar>, unit: UnitId, keep: Arc<[bool]>) -> Parser {
        let mut p = Parser::new(grammar, unit);
        if let Some(f) = &mut p.fast {
            f.cx.set_view(keep.clone());
        }
        p.st.keep = Some(keep);
        // Generated code that cannot honour a view is not used under one.
        if p.fast.as_mut().is_some_and(|f| !f.select(true, false)) {
            p.fast = None;
        }
        p
    }

    /// The same parser leaving the fields read in place
    /// ([`FieldInfo::fixed`](crate::FieldInfo)) in the message's bytes:
    /// generated code stores where their unit begins and not them, and
    /// [`Message`] decodes one when it is read, as a program reading a
    /// few fields of a packet's headers wants. Its slots ([`Parser::slots`])
    /// then leave those fields unset; read messages through [`Message`].
    /// Without generated code that can, nothing changes.
    pub fn in_place(mut self) -> Parser {
        let view = self.st.keep.is_some();
        if self.fast.as_mut().is_some_and(|f| f.select(view, true)) {
            // What the code stored before is not overwritten now.
            self.st.slots.fill(Slot::Unset);
            if let Some(f) = &mut self.fast {
                f.cx.arms = 0;
            }
        }
        self
    }

    /// The same parser without generated code: every message interpreted.
    pub fn interpreted(mut self) -> Parser {
        self.fast = None;
        self
    }

    /// Whether generated code parses this unit's messages first.
    pub fn is_compiled(&self) -> bool {
        self.fast.is_some()
    }

    /// How many messages generated code parsed (the rest were interpreted).
    pub fn compiled_messages(&self) -> u64 {
        self.compiled
    }

    /// How many heads generated code parsed and handed over to the
    /// interpreter at a streamed field ([`Progress::Head`]).
    pub fn compiled_heads(&self) -> u64 {
        self.compiled_heads
    }

    /// What the interpreter resumes from, for tests comparing a head
    /// generated code handed over with the interpreter's own: the frame
    /// stack, position, delimiter scan, head and stream bookkeeping.
    #[doc(hidden)]
    pub fn resume_state(&self) -> String {
        let st = &self.st;
        format!(
            "stack {:?} pos {} scan {} head_done {} remaining {:?} streamed {} fresh {}",
            st.stack, st.pos, st.scan, st.head_done, st.remaining, st.streamed, st.fresh
        )
    }

    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    pub fn unit(&self) -> UnitId {
        self.unit
    }

    /// What the request a reply answers said of it (`%reply_context`),
    /// read by `reply_context()` while the next replies parse; it stays
    /// until set again.
    pub fn set_reply_context(&mut self, context: i128) {
        self.st.context = context;
        if let Some(f) = &mut self.fast {
            f.cx.context = context;
        }
    }

    /// Starts over, for the next message.
    #[inline]
    pub fn reset(&mut self) {
        let st = &mut self.st;
        // Generated code sets (or unsets) every slot it may set, so the
        // next message's overwrites this one's.
        if st.by_code {
            st.stale = st.stale.max(st.high);
        } else {
            self.clear();
        }
        let st = &mut self.st;
        st.by_code = false;
        st.fresh = true;
        st.pos = 0;
        st.eof = false;
        st.high = 0;
    }

    /// Unsets the slots the interpreter set for the current message.
    #[inline(never)]
    fn clear(&mut self) {
        let st = &mut self.st;
        clear_below(&mut st.slots, &self.grammar.plan.lists[self.unit], st.high);
    }

    /// The slots this message may have set: all of them lie below this.
    pub fn used_slots(&self) -> &[Slot] {
        &self.st.slots[..self.st.high.min(self.st.slots.len())]
    }

    /// Like [`Parser::parse`], when the stream has ended after `buf`: a
    /// field that runs to the end of the stream (`&eof`) ends here, and a
    /// message cut short is an error.
    pub fn finish(&mut self, buf: &[u8]) -> Result<Progress, WireError> {
        self.st.eof = true;
        match self.parse(buf)? {
            Progress::NeedMore => Err(WireError {
                kind: WireErrorKind::Truncated,
                field: Arc::from("end of stream"),
                offset: buf.len(),
                status: None,
            }),
            p => Ok(p),
        }
    }

    /// The parsed message; valid after [`Progress::Done`], over the same bytes.
    #[inline]
    pub fn message<'a>(&'a self, buf: &'a [u8]) -> Message<'a> {
        Message::new(&self.grammar, self.unit, &self.st.slots, 0, buf)
    }

    /// The value slots, for serialising a parsed message. Between `reset`
    /// and the next `parse` they may still hold the last message's values.
    pub fn slots(&self) -> &[Slot] {
        &self.st.slots
    }

    /// Parses from the start of `buf`, which begins with the current
    /// message (and may hold more after it).
    #[inline]
    pub fn parse(&mut self, buf: &[u8]) -> Result<Progress, WireError> {
        if let (true, Some(f)) = (self.st.fresh, &mut self.fast) {
            let st = &mut self.st;
            let len = (f.full)(buf, &mut st.slots, &mut f.cx);
            // What the code did not set is unset now, or left to clear below.
            let stale = std::mem::take(&mut st.stale);
            if len < HEAD {
                self.compiled += 1;
                st.high = f.cx.high;
                st.by_code = true;
                st.pos = len;
                st.fresh = false;
                st.stack.clear();
                return Ok(Progress::Done(len));
            }
            if len == HEAD {
                return Ok(self.handed_over(stale));
            }
            // The interpreter starts over, from unset slots.
            let high = f.cx.high.max(stale);
            st.slots[..high].fill(Slot::Unset);
            f.cx.arms = 0;
        }
        self.interpret(buf)
    }

    /// Sets the interpreter up as it is when it reports the head generated
    /// code just parsed ([`HEAD`]): at the streamed field, with the code's
    /// slots, so that the next call goes on streaming from there.
    fn handed_over(&mut self, stale: usize) -> Progress {
        let Some(f) = &self.fast else {
            unreachable!("only generated code hands a head over")
        };
        let (h, high) = (f.cx.head, f.cx.high);
        let st = &mut self.st;
        // Slots the code did not reach may hold the last message's values;
        // the interpreter, from here, sees them unset.
        let stale = stale.min(st.slots.len());
        if stale > high {
            st.slots[high..stale].fill(Slot::Unset);
        }
        st.high = high;
        // The interpreter finishes the message. If it stores nothing more,
        // the slots are as the code leaves them: nothing to clear after.
        st.by_code = h.last;
        st.fresh = false;
        st.stack.clear();
        for &(block, pc) in &h.frames[..h.depth as usize] {
            st.stack.push(Frame::Seq { block, pc, base: 0 });
        }
        st.pos = h.pos;
        st.scan = 0;
        st.head_done = true;
        st.remaining = None;
        st.streamed = 0;
        self.compiled_heads += 1;
        Progress::Head(h.pos)
    }

    /// Parses as many whole messages from the start of `buf` as `batch`
    /// has rows, each into its own row, and returns the bytes they take.
    /// It stops early at a message generated code does not finish (too few
    /// bytes, a streamed body, bad bytes). It parses none for a parser
    /// without generated code, nor into a batch made for another unit or
    /// view ([`Parser::batch`]): [`Parser::parse`] takes over from
    /// the offset returned, and says what is wrong. The parser must be at
    /// the start of a message, and stays there.
    ///
    /// For a stream of small messages this is cheaper than `parse` and
    /// `reset` per message: the generated parser runs in one loop.
    #[inline]
    pub fn parse_batch(&mut self, buf: &[u8], batch: &mut Batch) -> usize {
        self.fill(batch, |f, batch| (f.batch)(buf, batch, &mut f.cx));
        batch.consumed()
    }

    /// Fills `batch` with `parse`, the generated code's loop, if this
    /// parser may; returns how many messages it parsed.
    #[inline(always)]
    fn fill(
        &mut self,
        batch: &mut Batch,
        parse: impl FnOnce(&mut FastParse, &mut Batch) -> usize,
    ) -> usize {
        batch.len = 0;
        let (true, Some(f)) = (self.st.fresh, &mut self.fast) else {
            return 0;
        };
        let in_place = f.leaves_in_place;
        if !batch.made_for(&self.grammar, self.unit, self.st.keep.as_ref(), in_place) {
            return 0;
        }
        // The arm bits say what the parser's own slots may hold; the
        // batch loads and keeps each row's in their place.
        let arms = f.cx.arms;
        let n = parse(f, batch);
        f.cx.arms = arms;
        batch.len = n;
        self.compiled += n as u64;
        n
    }

    /// Parses the message at the start of each of `msgs` (a burst of
    /// packets), each into its own row of `batch`, and returns how many it
    /// parsed; read them with [`Batch::messages_in`]. Like
    /// [`Parser::parse_batch`] it stops early at a message generated code
    /// does not finish, and parses none for a parser without generated
    /// code or a batch made for another parser: [`Parser::parse`] then
    /// takes that message and says what is wrong.
    #[inline]
    pub fn parse_each(&mut self, msgs: &[&[u8]], batch: &mut Batch) -> usize {
        self.fill(batch, |f, batch| (f.each)(msgs, batch, &mut f.cx))
    }

    /// Room for `rows` messages of this parser's unit, for
    /// [`Parser::parse_batch`] and [`Parser::parse_each`].
    pub fn batch(&self, rows: usize) -> Batch {
        let in_place = self.fast.as_ref().is_some_and(|f| f.leaves_in_place);
        let keep = self.st.keep.clone();
        Batch::new(self.grammar.clone(), self.unit, keep, in_place, rows)
    }

    #[inline(never)]
    fn interpret(&mut self, buf: &[u8]) -> Result<Progress, WireError> {
        let g: &Grammar = &self.grammar;
        let st = &mut self.st;
        if st.fresh {
            st.begin(g.units[self.unit].block);
        }
        loop {
            let Some(&frame) = st.stack.last() else {
                return Ok(Progress::Done(st.pos));
            };
            let stop = match frame {
                Frame::Seq { block, pc, base } => st.seq(g, block, pc as usize, base, buf)?,
                Frame::List { .. } => st.list(g, frame, buf)?,
            };
            if let Some(p) = stop {
                return Ok(p);
            }
        }
    }
}

/// A variable's value as its slot holds it. Only bytes of the message
/// can be kept in a slot; other values leave it unset.
pub fn var_slot(v: Val, buf: &[u8]) -> Slot {
    match v {
        Val::Int(i) if i < 0 => Slot::SInt(i as i64),
        Val::Int(i) => Slot::Int(i as u64),
        Val::Bytes(b) => {
            let off = (b.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
            if off.checked_add(b.len()).is_some_and(|end| end <= buf.len()) {
                Slot::Bytes {
                    start: off as u32,
                    len: b.len() as u32,
                }
            } else {
                Slot::Unset
            }
        }
        _ => Slot::Unset,
    }
}

/// Unsets every slot: of each list, only the elements its count says were
/// written (the others are unset already).
/// The ranges of `slots` a message of a unit with these lists may have
/// set: everything outside its lists, and each list's count and elements
/// up to the count. The same walk as [`clear_below`].
fn live(slots: &[Slot], lists: &[ListRegion], mut f: impl FnMut(std::ops::Range<usize>)) {
    let high = slots.len();
    let mut from = 0;
    for l in lists {
        let (count, end) = (l.count as usize, l.end as usize);
        if count >= high {
            break;
        }
        let used = match slots.get(count) {
            Some(Slot::Count(n)) => (*n as usize * l.elem_slots as usize).min(end - count - 1),
            _ => 0,
        };
        f(from..(count + 1 + used).min(high));
        from = end;
    }
    if from < high {
        f(from..high);
    }
}

impl Grammar {
    /// Copies the values of a message of `unit` from `src` (its slots up
    /// to the highest set, [`Parser::used_slots`]) into `dst`, which must
    /// hold only unset slots: only what the message may have set, so a
    /// unit that reserves room for many list elements (HTTP's 100 headers)
    /// costs what the message uses. `dst` keeps room for all of the unit's
    /// slots.
    pub fn copy_slots(&self, unit: UnitId, src: &[Slot], dst: &mut Vec<Slot>) {
        let n = (self.units[unit].slots as usize).max(src.len());
        if dst.len() < n {
            dst.resize(n, Slot::Unset);
        }
        live(src, &self.plan.lists[unit], |r| {
            dst[r.clone()].copy_from_slice(&src[r]);
        });
    }

    /// Unsets the values of a message of `unit` whose set slots all lie
    /// below `high`, as [`Grammar::copy_slots`] left them.
    pub fn clear_slots(&self, unit: UnitId, slots: &mut [Slot], high: usize) {
        let high = high.min(slots.len());
        clear_below(slots, &self.plan.lists[unit], high);
    }
}

/// Unsets the slots a message with these lists set, all of them below
/// `high`: everything outside the lists, and each list's count and its
/// elements up to the count (an HTTP head reserves 100 headers and mostly
/// uses a few).
#[inline]
fn clear_below(slots: &mut [Slot], lists: &[ListRegion], high: usize) {
    if lists.is_empty() {
        let n = high.min(slots.len());
        slots[..n].fill(Slot::Unset);
        return;
    }
    clear_lists_below(slots, lists, high);
}

/// [`clear_below`] for a unit with lists.
#[inline(never)]
fn clear_lists_below(slots: &mut [Slot], lists: &[ListRegion], high: usize) {
    let mut from = 0;
    for l in lists {
        let (count, end) = (l.count as usize, l.end as usize);
        if count >= high {
            break;
        }
        if let Slot::Count(n) = slots[count] {
            let used = (n as usize * l.elem_slots as usize).min(end - count - 1);
            slots[count + 1..(count + 1 + used).min(high)].fill(Slot::Unset);
        }
        slots[from..count + 1].fill(Slot::Unset);
        from = end;
    }
    if from < high {
        slots[from..high].fill(Slot::Unset);
    }
}

impl State {
    /// Sets the interpreter up at the start of a message of the unit
    /// whose block is `block`.
    fn begin(&mut self, block: BlockId) {
        self.fresh = false;
        self.by_code = false;
        // Only when generated code did not run first (it unsets them).
        let stale = std::mem::take(&mut self.stale);
        self.slots[..stale].fill(Slot::Unset);
        self.stack.clear();
        self.stack.push(Frame::Seq {
            block,
            pc: 0,
            base: 0,
        });
        self.pos = 0;
        self.scan = 0;
        self.head_done = false;
        self.remaining = None;
        self.streamed = 0;
    }

    /// Hands the bytes parsed so far over to the caller (see
    /// [`Progress::Stream`]): positions restart from zero.
    fn stream_out(&mut self) -> Progress {
        let n = self.pos;
        self.pos = 0;
        self.scan = 0;
        for f in &mut self.stack {
            if let Frame::List { start, .. } = f {
                *start = 0;
            }
        }
        Progress::Stream(n)
    }

    /// Records where the current block resumes.
    fn set_pc(&mut self, pc: usize) {
        if let Some(Frame::Seq { pc: p, .. }) = self.stack.last_mut() {
            *p = pc as u32;
        }
    }

    /// Runs the steps of a block from `pc`, and of the units and switch
    /// cases it enters and returns from, until a list frame is on top
    /// (`None`; also when the stack is empty) or it has to stop (`Some`).
    fn seq(
        &mut self,
        g: &Grammar,
        mut block: BlockId,
        mut pc: usize,
        mut base: u32,
        buf: &[u8],
    ) -> Result<Option<Progress>, WireError> {
        let mut steps = &g.plan.blocks[block as usize];
        let mut ops = &g.blocks[block as usize];
        loop {
            let Some(step) = steps.get(pc) else {
                // The block is done: back to the enclosing block, if the
                // frame below is one, without leaving this loop.
                self.stack.pop();
                let Some(&Frame::Seq {
                    block: b,
                    pc: p,
                    base: s,
                }) = self.stack.last()
                else {
                    return Ok(None);
                };
                (block, pc, base) = (b, p as usize, s);
                steps = &g.plan.blocks[block as usize];
                ops = &g.blocks[block as usize];
                continue;
            };
            let op = &ops[step.op as usize];
            let at = step.slot.map(|s| base as usize + s as usize);
            match &step.kind {
                StepKind::Run(run) => {
                    if buf.len().saturating_sub(self.pos) >= run.width as usize {
                        self.run(run, ops, base, buf)?;
                        pc += 1 + run.covers as usize;
                    } else {
                        pc += 1;
                    }
                    continue;
                }
                StepKind::Int(f) => {
                    let n = f.width as usize;
                    let Some(raw) = buf.get(self.pos..self.pos + n) else {
                        self.set_pc(pc);
                        return Ok(Some(Progress::NeedMore));
                    };
                    if let Some(a) = at.filter(|a| self.keep(*a)) {
                        self.set_slot(a, f.decode(raw));
                    }
                    self.pos += n;
                }
                StepKind::Bytes { len, max } => {
                    let n = self
                        .env(base, buf)
                        .int_of(len)
                        .map_err(|_| self.error(op, WireErrorKind::Invalid))?;
                    let n = self.bytes_len(op, n, *max)?;
                    if buf.len().saturating_sub(self.pos) < n {
                        self.set_pc(pc);
                        return Ok(Some(Progress::NeedMore));
                    }
                    self.store_bytes(at, n);
                    self.pos += n;
                }
                StepKind::VInt => {
                    let Some((v, size)) = read_vlong(&buf[self.pos.min(buf.len())..]) else {
                        self.set_pc(pc);
                        return Ok(Some(Progress::NeedMore));
                    };
                    self.store(at, Slot::SInt(v));
                    self.pos += size;
                }
                StepKind::Scalar => {
                    let OpKind::Scalar(s) = &op.kind else {
                        unreachable!("scalar steps run scalar operations")
                    };
                    if !self.scalar(s, op, at, base, buf)? {
                        self.set_pc(pc);
                        return Ok(Some(Progress::NeedMore));
                    }
                }
                // A view keeps every variable but bit fields nothing it
                // keeps reads (`Grammar::view`); those are not computed.
                StepKind::Var(_) if !self.keeps_var(at) => {}
                StepKind::Var(e) => {
                    let slot = self.var(e, op, base, buf)?;
                    if let Some(at) = at {
                        self.set_slot(at, slot);
                    }
                }
                StepKind::Nothing => {}
                StepKind::Mark => {
                    if let Some(at) = at {
                        self.set_slot(at, Slot::Int(self.pos as u64));
                    }
                }
                StepKind::Switch(sw) => {
                    let env = self.env(base, buf);
                    let v = env
                        .val_of(&sw.on)
                        .map_err(|_| self.error(op, WireErrorKind::Invalid))?;
                    let Some(b) = sw.choose(v, &env) else {
                        return Err(self.error(op, WireErrorKind::NoCase));
                    };
                    self.set_pc(pc + 1);
                    self.push(
                        Frame::Seq {
                            block: b,
                            pc: 0,
                            base,
                        },
                        op,
                    )?;
                    (block, pc) = (b, 0);
                    steps = &g.plan.blocks[block as usize];
                    ops = &g.blocks[block as usize];
                    continue;
                }
                StepKind::Unit(b) => {
                    self.set_pc(pc + 1);
                    let inner = base + op.slot.unwrap_or(0) as u32;
                    self.push(
                        Frame::Seq {
                            block: *b,
                            pc: 0,
                            base: inner,
                        },
                        op,
                    )?;
                    (block, pc, base) = (*b, 0, inner);
                    steps = &g.plan.blocks[block as usize];
                    ops = &g.blocks[block as usize];
                    continue;
                }
                StepKind::List => {
                    self.set_pc(pc + 1);
                    self.start_list(block, step.op, base, op)?;
                    return Ok(None);
                }
                StepKind::Stream => {
                    match &op.kind {
                        // An empty body is no stream: the message is all head.
                        OpKind::Scalar(Scalar::Bytes {
                            len: Len::Expr(e), ..
                        }) if self.remaining.is_none()
                            && matches!(self.env(base, buf).int(e), Ok(0)) =>
                        {
                            pc += 1;
                            continue;
                        }
                        OpKind::Scalar(_) | OpKind::List { .. } if !self.head_done => {
                            self.set_pc(pc);
                            self.head_done = true;
                            return Ok(Some(Progress::Head(self.pos)));
                        }
                        OpKind::Scalar(Scalar::Bytes { len, max }) => {
                            if !self.stream_bytes(len, *max, op, base, buf)? {
                                self.set_pc(pc);
                                return Ok(Some(if self.pos > 0 {
                                    self.stream_out()
                                } else {
                                    Progress::NeedMore
                                }));
                            }
                            pc += 1;
                            if self.pos > 0 {
                                self.set_pc(pc);
                                return Ok(Some(self.stream_out()));
                            }
                            continue;
                        }
                        // A scalar read in full goes on to its check below.
                        OpKind::Scalar(s) if !self.scalar(s, op, at, base, buf)? => {
                            self.set_pc(pc);
                            return Ok(Some(Progress::NeedMore));
                        }
                        OpKind::List { .. } => {
                            self.set_pc(pc + 1);
                            self.start_list(block, step.op, base, op)?;
                            return Ok(None);
                        }
                        _ => {}
                    }
                }
            }
            if let Some(req) = &step.check {
                self.check(req, op, at, base, buf)?;
            }
            pc += 1;
        }
    }

    /// A fused run of fixed-width fields, all of whose bytes are in `buf`:
    /// the same values, checks and errors as the fields one by one.
    fn run(&mut self, run: &Run, ops: &[Op], base: u32, buf: &[u8]) -> Result<(), WireError> {
        let start = self.pos;
        let bytes = &buf[start..start + run.width as usize];
        for i in run.ints.iter() {
            let a = base as usize + i.slot as usize;
            if self.keep(a) {
                let at = i.at as usize;
                self.set_slot(a, i.field.decode(&bytes[at..at + i.field.width as usize]));
            }
        }
        for f in run.fields.iter() {
            let at = f.slot.map(|s| base as usize + s as usize);
            match &f.kind {
                // Integers without a slot have nothing to store.
                RunKind::Int(_) | RunKind::Nothing => {}
                RunKind::Bytes => {
                    self.pos = start + f.at as usize;
                    self.store_bytes(at, (f.end - f.at) as usize);
                }
                RunKind::Literal { bytes: lit, nocase } => {
                    let got = &bytes[f.at as usize..f.end as usize];
                    let ok = if *nocase {
                        got.eq_ignore_ascii_case(lit)
                    } else {
                        got == &lit[..]
                    };
                    self.pos = start + f.at as usize;
                    if !ok {
                        return Err(self.error(&ops[f.op as usize], WireErrorKind::Mismatch));
                    }
                    self.store_bytes(at, got.len());
                }
                RunKind::Var(_) if !self.keeps_var(at) => {}
                RunKind::Var(e) => {
                    self.pos = start + f.at as usize;
                    let slot = match self.bits(e, base) {
                        Some(v) => v,
                        None => self.var(e, &ops[f.op as usize], base, buf)?,
                    };
                    if let Some(at) = at {
                        self.set_slot(at, slot);
                    }
                }
            }
            if let Some(req) = &f.check {
                self.pos = start + f.end as usize;
                self.check(req, &ops[f.op as usize], at, base, buf)?;
            }
        }
        self.pos = start + run.width as usize;
        Ok(())
    }

    /// A bit field of an unsigned integer, in place; `None` for any other
    /// variable or value.
    #[inline(always)]
    fn bits(&self, e: &ValExpr, base: u32) -> Option<Slot> {
        let ValExpr::Bits {
            slot, shift, mask, ..
        } = e
        else {
            return None;
        };
        match self.slots.get(base as usize + *slot as usize)? {
            Slot::Int(v) => Some(Slot::Int((v >> shift) & mask)),
            _ => None,
        }
    }

    /// A variable's value, as a slot.
    fn var(&self, e: &ValExpr, op: &Op, base: u32, buf: &[u8]) -> Result<Slot, WireError> {
        if let Some(v) = self.bits(e, base) {
            return Ok(v);
        }
        if let ValExpr::Int(i) | ValExpr::Bits { expr: i, .. } = e {
            return match self.env(base, buf).int_of(i) {
                Ok(i) if i < 0 => Ok(Slot::SInt(i as i64)),
                Ok(i) => Ok(Slot::Int(i as u64)),
                Err(_) => Err(self.error(op, WireErrorKind::Invalid)),
            };
        }
        let v = self
            .env(base, buf)
            .val_of(e)
            .map_err(|_| self.error(op, WireErrorKind::Invalid))?;
        Ok(var_slot(v, buf))
    }

    /// Enters the list at operation `op` of `block`.
    fn start_list(
        &mut self,
        block: BlockId,
        op: u32,
        base: u32,
        lop: &Op,
    ) -> Result<(), WireError> {
        let lbase = base + lop.slot.unwrap_or(0) as u32;
        self.set_slot(lbase as usize, Slot::Count(0));
        self.push(
            Frame::List {
                block,
                op,
                base: lbase,
                index: 0,
                target: None,
                after_elem: false,
                start: self.pos as u32,
            },
            lop,
        )
    }

    /// One turn of a list frame: ends the list, or reads or enters its next
    /// element.
    fn list(
        &mut self,
        g: &Grammar,
        frame: Frame,
        buf: &[u8],
    ) -> Result<Option<Progress>, WireError> {
        let Frame::List {
            block,
            op,
            base,
            index,
            target,
            after_elem,
            start,
        } = frame
        else {
            unreachable!("called with list frames")
        };
        let lop = &g.blocks[block as usize][op as usize];
        let OpKind::List {
            elem,
            stop,
            sep,
            max,
            max_bytes,
        } = &lop.kind
        else {
            unreachable!("list frames point at list operations")
        };
        if let Some(mb) = max_bytes {
            if self.pos - start as usize > *mb as usize {
                return Err(self.error(lop, WireErrorKind::TooLong { max: *mb as u64 }));
            }
        }
        // A streamed list hands each finished element over.
        if lop.stream && after_elem && self.pos > 0 {
            return Ok(Some(self.stream_out()));
        }
        // A streamed list keeps one element's values at a time.
        let slot_index = |i: u32| if lop.stream { 0 } else { i };
        let elem_slots = match elem {
            Elem::Unit { slots, .. } => *slots as u32,
            Elem::Scalar(_) => 1,
        };
        let unit_base = self.unit_base_of_list(base, lop);
        let mut target = target;
        match stop {
            Stop::UntilElem(e) if after_elem => {
                let env = Env {
                    dollar_base: (base + 1 + slot_index(index - 1) * elem_slots) as usize,
                    ..self.env(unit_base, buf)
                };
                if env
                    .truthy(e)
                    .map_err(|_| self.error(lop, WireErrorKind::Invalid))?
                {
                    self.stack.pop();
                    return Ok(None);
                }
            }
            Stop::Count(e) => {
                let n = match target {
                    Some(n) => n,
                    None => {
                        let env = self.env(unit_base, buf);
                        let n = env
                            .int(e)
                            .map_err(|_| self.error(lop, WireErrorKind::Invalid))?;
                        if n < 0 || n > *max as i128 {
                            return Err(self.error(lop, WireErrorKind::TooMany { max: *max }));
                        }
                        target = Some(n as u32);
                        n as u32
                    }
                };
                if index == n {
                    self.stack.pop();
                    return Ok(None);
                }
            }
            Stop::Until(t) => match starts(buf, self.pos, t) {
                Some(true) => {
                    self.pos += t.len();
                    self.stack.pop();
                    return Ok(None);
                }
                Some(false) => {}
                None => return Ok(Some(Progress::NeedMore)),
            },
            Stop::UntilEither(t, also) => {
                match (starts(buf, self.pos, t), starts(buf, self.pos, also)) {
                    (Some(true), _) => {
                        self.pos += t.len();
                        self.stack.pop();
                        return Ok(None);
                    }
                    (None, _) => return Ok(Some(Progress::NeedMore)),
                    (Some(false), Some(true)) => {
                        self.pos += also.len();
                        self.stack.pop();
                        return Ok(None);
                    }
                    (Some(false), None) => return Ok(Some(Progress::NeedMore)),
                    (Some(false), Some(false)) => {}
                }
            }
            Stop::UntilElem(_) => {}
        }
        if index >= *max && !lop.stream {
            return Err(self.error(lop, WireErrorKind::TooMany { max: *max }));
        }
        let at = (base + 1 + slot_index(index) * elem_slots) as usize;
        match elem {
            Elem::Unit { block: b, .. } => {
                if let (Some(s), true) = (sep, index > 0) {
                    match starts(buf, self.pos, s) {
                        Some(true) => self.pos += s.len(),
                        Some(false) => return Err(self.error(lop, WireErrorKind::Mismatch)),
                        None => return Ok(Some(Progress::NeedMore)),
                    }
                }
                *self.stack.last_mut().unwrap() = Frame::List {
                    block,
                    op,
                    base,
                    index: index + 1,
                    target,
                    after_elem: true,
                    start,
                };
                self.set_slot(base as usize, Slot::Count(slot_index(index) + 1));
                self.push(
                    Frame::Seq {
                        block: *b,
                        pc: 0,
                        base: at as u32,
                    },
                    lop,
                )?;
            }
            Elem::Scalar(s) => {
                let done = match (&**s, sep, stop) {
                    // Tokens separated by `sep`, the last ended by the terminator.
                    (
                        Scalar::Bytes {
                            len: Len::Until(_),
                            max: m,
                        },
                        Some(sp),
                        Stop::Until(t),
                    ) => self.token(buf, at, sp, t, *m as usize, lop)?,
                    _ => self.scalar(s, lop, Some(at), unit_base, buf)?,
                };
                if !done {
                    *self.stack.last_mut().unwrap() = Frame::List {
                        block,
                        op,
                        base,
                        index,
                        target,
                        after_elem,
                        start,
                    };
                    return Ok(Some(Progress::NeedMore));
                }
                self.set_slot(base as usize, Slot::Count(slot_index(index) + 1));
                *self.stack.last_mut().unwrap() = Frame::List {
                    block,
                    op,
                    base,
                    index: index + 1,
                    target,
                    after_elem: true,
                    start,
                };
            }
        }
        Ok(None)
    }
    /// Passes on the bytes of a `&stream` field as they arrive; `true`
    /// once the whole field went by.
    fn stream_bytes(
        &mut self,
        len: &Len,
        max: u32,
        op: &Op,
        base: u32,
        buf: &[u8],
    ) -> Result<bool, WireError> {
        let remaining = match self.remaining {
            Some(r) => r,
            None => {
                let n = match len {
                    Len::Expr(e) => {
                        let n = self
                            .env(base, buf)
                            .int(e)
                            .map_err(|_| self.error(op, WireErrorKind::Invalid))?;
                        if n < 0 {
                            return Err(self.error(op, WireErrorKind::BadLength));
                        }
                        if n > max as i128 {
                            return Err(self.error(op, WireErrorKind::TooLong { max: max as u64 }));
                        }
                        self.streamed += n as u64;
                        n as u64
                    }
                    Len::Eof => u64::MAX,
                    Len::Until(_) | Len::BeforeAny(..) | Len::WhileAny(_) => {
                        return Err(self.error(op, WireErrorKind::Invalid))
                    }
                };
                self.remaining = Some(n);
                n
            }
        };
        let avail = buf.len().saturating_sub(self.pos) as u64;
        let k = avail.min(remaining);
        self.pos += k as usize;
        let left = remaining - k;
        let done = left == 0 || (matches!(len, Len::Eof) && self.eof);
        self.remaining = if done { None } else { Some(left) };
        Ok(done)
    }

    /// The base of the unit a list belongs to, for its `&count` expression.
    fn unit_base_of_list(&self, list_base: u32, lop: &Op) -> u32 {
        list_base - lop.slot.unwrap_or(0) as u32
    }

    fn push(&mut self, f: Frame, op: &Op) -> Result<(), WireError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(self.error(op, WireErrorKind::TooDeep));
        }
        self.stack.push(f);
        Ok(())
    }

    pub(crate) fn env<'a>(&'a self, base: u32, buf: &'a [u8]) -> Env<'a> {
        Env {
            slots: &self.slots,
            base: base as usize,
            data: buf,
            dollar: Val::Unset,
            dollar_base: 0,
            context: self.context,
            limits: &self.limits,
            streamed: self.streamed,
        }
    }

    /// A bytes field's length, checked before anything is read: not
    /// negative, and within the field's maximum.
    pub(crate) fn bytes_len(&self, op: &Op, n: i128, max: u32) -> Result<usize, WireError> {
        if n < 0 {
            return Err(self.error(op, WireErrorKind::BadLength));
        }
        if n > max as i128 {
            return Err(self.error(op, WireErrorKind::TooLong { max: max as u64 }));
        }
        Ok(n as usize)
    }

    pub(crate) fn error(&self, op: &Op, kind: WireErrorKind) -> WireError {
        WireError {
            kind,
            field: op.field.clone(),
            offset: self.pos,
            status: op.status,
        }
    }

    /// Whether a view keeps slot `at` (every slot without a view).
    #[inline]
    pub(crate) fn keep(&self, at: usize) -> bool {
        self.keep
            .as_ref()
            .is_none_or(|k| k.get(at).copied().unwrap_or(true))
    }

    /// Whether the value of a field stored at `at`, if any, is kept.
    #[inline(always)]
    fn set_slot(&mut self, at: usize, v: Slot) {
        self.high = self.high.max(at + 1);
        self.slots[at] = v;
    }

    /// Whether a variable stored at `at` is computed: always without a
    /// view, and for every variable but the bit fields a view leaves out.
    #[inline]
    fn keeps_var(&self, at: Option<usize>) -> bool {
        at.is_none_or(|a| self.keep(a))
    }

    #[inline]
    pub(crate) fn keeps(&self, at: Option<usize>) -> bool {
        at.is_some_and(|a| self.keep(a))
    }

    pub(crate) fn store(&mut self, at: Option<usize>, v: Slot) {
        if let Some(at) = at {
            if self.keep(at) {
                self.set_slot(at, v);
            }
        }
    }

    /// Keeps the `len` bytes at the current position in slot `at`.
    pub(crate) fn store_bytes(&mut self, at: Option<usize>, len: usize) {
        let start = self.pos as u32;
        self.store(
            at,
            Slot::Bytes {
                start,
                len: len as u32,
            },
        );
    }

    /// `&requires` of the field just parsed. A check of integer values
    /// against constants is a few range tests.
    #[inline(always)]
    fn check(
        &self,
        req: &Check,
        op: &Op,
        at: Option<usize>,
        base: u32,
        buf: &[u8],
    ) -> Result<(), WireError> {
        // One test, the usual case, in place; combinations by a call.
        let passed = match &req.pred {
            Some(Pred::Test(x, r)) => self.value(*x, at, base).map(|v| in_ranges(r, v)),
            Some(p) => self.test(p, at, base),
            None => None,
        };
        match passed {
            Some(true) => return Ok(()),
            Some(false) => return Err(self.error(op, WireErrorKind::Invalid)),
            None => {}
        }
        self.check_expr(req, op, at, base, buf)
    }

    /// The integer value of a slot or of `$$` (in slot `at`), if it is one.
    #[inline(always)]
    fn value(&self, x: Operand, at: Option<usize>, base: u32) -> Option<i128> {
        let a = match x {
            Operand::Dollar => at?,
            Operand::Slot(s) => base as usize + s as usize,
        };
        match self.slots.get(a)? {
            Slot::Int(v) => Some(*v as i128),
            Slot::SInt(v) => Some(*v as i128),
            Slot::Count(n) => Some(*n as i128),
            _ => None,
        }
    }

    /// A check's range tests; `None` when a value they read is not an
    /// integer (the expression then decides). `at` is the slot of `$$`.
    fn test(&self, p: &Pred, at: Option<usize>, base: u32) -> Option<bool> {
        match p {
            Pred::Test(x, r) => Some(in_ranges(r, self.value(*x, at, base)?)),
            Pred::And(x, y) => Some(self.test(x, at, base)? && self.test(y, at, base)?),
            Pred::Or(x, y) => Some(self.test(x, at, base)? || self.test(y, at, base)?),
            Pred::Not(x) => Some(!self.test(x, at, base)?),
        }
    }

    /// [`State::check`] through the expression.
    fn check_expr(
        &self,
        req: &Check,
        op: &Op,
        at: Option<usize>,
        base: u32,
        buf: &[u8],
    ) -> Result<(), WireError> {
        let env = Env {
            dollar: at.map_or(Val::Unset, |a| slot_val(&self.slots, buf, a)),
            ..self.env(base, buf)
        };
        match env.int_of(&req.expr) {
            Ok(v) if v != 0 => Ok(()),
            _ => Err(self.error(op, WireErrorKind::Invalid)),
        }
    }
}
