//! `%forward`: a parsed message written as the runs of bytes it was read
//! from, wherever writing it field by field would give those very bytes.
//!
//! A proxy passes most of a message on as it came: HTTP's `%forward`
//! drops a few hop-by-hop header lines and appends two. Writing every
//! field again cost about 5,000 instructions a message (a response of
//! eight header lines). Here the unit's fields are walked as the writer
//! would walk them, from a plan made once per unit ([`CopyPlan`]), but
//! each value is checked to begin where the bytes written so far end in
//! the message (and each delimiter and literal to be there), and what
//! checks is copied as one run. A field that does not (a value elsewhere,
//! a value the writer would refuse, a number that may be spelt otherwise,
//! a nested unit, a field of a kind not covered) ends the run and is
//! written by [`Grammar::emit_ops`] as before, so the output is the same
//! byte for byte whatever the message's origin.

use crate::error::WireError;
use crate::program::*;
use crate::serialize::Emit;
use crate::Grammar;
use std::sync::Arc;

/// Whether `lit` lies in `data` at `at`. Compared byte by byte: the
/// literals are a delimiter's one or two bytes, where a call to `memcmp`
/// costs more than the comparison.
#[inline]
fn lit_at(data: &[u8], at: usize, lit: &[u8]) -> bool {
    data.get(at..at + lit.len())
        .is_some_and(|b| b.iter().zip(lit).all(|(x, y)| x == y))
}

/// A unit's fields as the copying writer walks them: its own block's
/// steps (one of them the edited list) and the list elements'.
#[derive(Clone, Debug)]
pub(crate) struct CopyPlan {
    /// The unit's operations' steps, in its block's order.
    unit: Vec<Step>,
    /// The list elements' operations' steps, in their block's order.
    elem: Vec<Step>,
    elem_block: BlockId,
    elem_slots: usize,
    /// The elements' steps in a compact form, where every one is a value,
    /// whitespace, a literal or nothing (HTTP's header lines).
    elem_compact: Option<Vec<Compact>>,
    /// The list's terminator, written after what the edit adds.
    stop: Option<Arc<[u8]>>,
}

/// A step of an element in the compact form: the value at `slot` (if
/// any; at most `max` bytes), or `unset` where the slot is unset, then
/// `after`.
#[derive(Clone, Debug)]
struct Compact {
    slot: Option<u16>,
    max: u32,
    unset: Arc<[u8]>,
    after: Arc<[u8]>,
}

/// `steps` in the compact form, if they all have one.
fn compact(steps: &[Step]) -> Option<Vec<Compact>> {
    let none: Arc<[u8]> = Arc::from(&[][..]);
    let step = |slot, max, unset: &Arc<[u8]>, after: &Arc<[u8]>| {
        Some(Compact {
            slot,
            max,
            unset: unset.clone(),
            after: after.clone(),
        })
    };
    steps
        .iter()
        .filter(|s| !matches!(s, Step::Nothing))
        .map(|s| match s {
            Step::Value { slot, max, until } => {
                step(Some(*slot), *max, &none, until.as_ref().unwrap_or(&none))
            }
            Step::Ws { slot: Some(slot) } => step(Some(*slot), u32::MAX, &none, &none),
            Step::Literal { slot, bytes } => match slot {
                Some(slot) => step(Some(*slot), u32::MAX, bytes, &none),
                None => step(None, 0, &none, bytes),
            },
            _ => None,
        })
        .collect()
}

/// One operation of a block, for the copying writer.
#[derive(Clone, Debug)]
enum Step {
    /// Nothing written (a variable, a mark, what an anonymous
    /// `&while_any` skipped).
    Nothing,
    /// The bytes value at `slot`, at most `max` long, then `until`.
    Value {
        slot: u16,
        max: u32,
        until: Option<Arc<[u8]>>,
    },
    /// A token value at `slot` (`&before_any`), which the writer refuses
    /// where it holds a byte of `set` or the sequence `also`.
    Token {
        slot: u16,
        max: u32,
        set: Arc<[u8]>,
        also: Arc<[u8]>,
    },
    /// A literal: what its slot holds where it has one, else its bytes.
    Literal { slot: Option<u16>, bytes: Arc<[u8]> },
    /// Whitespace: what its slot holds, if any.
    Ws { slot: Option<u16> },
    /// The edited list.
    List,
    /// Written by the field writer (stopping there for a head if it
    /// streams).
    Op,
}

impl Step {
    fn of(op: &Op) -> Step {
        if op.stream {
            return Step::Op;
        }
        match (&op.kind, op.slot) {
            (OpKind::Var(_) | OpKind::SerializeVar { .. } | OpKind::Mark, _) => Step::Nothing,
            (OpKind::Scalar(Scalar::Bytes { len, max }), slot) => match (len, slot) {
                (Len::WhileAny(_), _) if &*op.field == "_" => Step::Nothing,
                (Len::BeforeAny(set, also), Some(slot)) => Step::Token {
                    slot,
                    max: *max,
                    set: set.clone(),
                    also: also.clone(),
                },
                (Len::BeforeAny(..), None) => Step::Op,
                (Len::Until(d), Some(slot)) => Step::Value {
                    slot,
                    max: *max,
                    until: Some(d.clone()),
                },
                (Len::Until(d), None) => Step::Literal {
                    slot: None,
                    bytes: d.clone(),
                },
                (_, Some(slot)) => Step::Value {
                    slot,
                    max: *max,
                    until: None,
                },
                (_, None) => Step::Nothing,
            },
            (OpKind::Scalar(Scalar::Literal { bytes, .. }), slot) => Step::Literal {
                slot,
                bytes: bytes.clone(),
            },
            (OpKind::Scalar(Scalar::Ws), slot) => Step::Ws { slot },
            _ => Step::Op,
        }
    }
}

impl Grammar {
    /// The plan for copying messages of the unit of `block` edited by
    /// `f`; `None` where its list is not a list of units without a
    /// separator (written field by field).
    fn copy_plan(&self, block: BlockId, f: &Forward) -> Option<CopyPlan> {
        let ops = &self.blocks[block as usize];
        let (elem_block, elem_slots, stop) =
            ops.iter().find_map(|op| match (&op.kind, op.slot) {
                (
                    OpKind::List {
                        elem: Elem::Unit { block, slots },
                        stop,
                        sep: None,
                        ..
                    },
                    Some(at),
                ) if at == f.list && !op.stream => Some((*block, *slots as usize, stop)),
                _ => None,
            })?;
        let unit = ops
            .iter()
            .map(|op| match op.slot {
                Some(at) if at == f.list && matches!(op.kind, OpKind::List { .. }) => Step::List,
                _ => Step::of(op),
            })
            .collect();
        let elem: Vec<Step> = self.blocks[elem_block as usize]
            .iter()
            .map(Step::of)
            .collect();
        let stop = match stop {
            Stop::Until(t) | Stop::UntilEither(t, _) => Some(t.clone()),
            _ => None,
        };
        let elem_compact = compact(&elem);
        Some(CopyPlan {
            unit,
            elem,
            elem_compact,
            elem_block,
            elem_slots,
            stop,
        })
    }

    /// [`Grammar::forward`] of the unit of `block` with its edit `f`,
    /// copying runs of the message's bytes (see the module's comment).
    pub(crate) fn forward_copying(
        &self,
        block: BlockId,
        f: &Forward,
        slots: &[Slot],
        data: &[u8],
        how: Emit,
        out: &mut Vec<u8>,
    ) -> Result<(), WireError> {
        let Some(plan) = f.copying.get_or_init(|| self.copy_plan(block, f)) else {
            return self.emit(block, slots, 0, data, how, out).map(drop);
        };
        let mut c = Copier {
            g: self,
            slots,
            data,
            out,
            run: None,
        };
        let ops = &self.blocks[block as usize];
        for (op, step) in ops.iter().zip(&plan.unit) {
            let stopped = match step {
                Step::List => c.list(f, plan, how)?,
                step => c.step((op, step), 0, how)?,
            };
            if stopped {
                break;
            }
        }
        c.flush();
        Ok(())
    }
}

/// The writer: the run of the message's bytes not yet copied out.
struct Copier<'a, 'o> {
    g: &'a Grammar,
    slots: &'a [Slot],
    data: &'a [u8],
    out: &'o mut Vec<u8>,
    /// `[start, end)` in `data`, still to copy.
    run: Option<(usize, usize)>,
}

impl Copier<'_, '_> {
    fn flush(&mut self) {
        if let Some((s, e)) = self.run.take() {
            #[cfg(test)]
            tests::COPIED.with(|c| c.set(c.get() + e - s));
            self.out.extend_from_slice(&self.data[s..e]);
        }
    }

    /// The bytes value at `slot` (relative to `base`): `Ok(None)` where
    /// unset, `Err` where it is not bytes within the message.
    #[inline]
    fn bytes(&self, base: usize, slot: u16) -> Result<Option<(usize, usize)>, ()> {
        match self.slots[base + slot as usize] {
            Slot::Bytes { start, len } => {
                let (s, n) = (start as usize, len as usize);
                match s.checked_add(n) {
                    Some(e) if e <= self.data.len() => Ok(Some((s, n))),
                    _ => Err(()),
                }
            }
            Slot::Unset => Ok(None),
            _ => Err(()),
        }
    }

    /// The value `[start, start + len)` of the message written next.
    #[inline]
    fn value(&mut self, (start, len): (usize, usize)) {
        let end = start + len;
        match &mut self.run {
            Some((_, e)) if *e == start => *e = end,
            _ => {
                self.flush();
                self.run = Some((start, end));
            }
        }
    }

    /// `lit` written next: copied with the run where the message holds it
    /// there, else written.
    #[inline]
    fn literal(&mut self, lit: &[u8]) {
        if let Some((_, e)) = &mut self.run {
            if lit_at(self.data, *e, lit) {
                *e += lit.len();
                return;
            }
        }
        self.flush();
        self.out.extend_from_slice(lit);
    }

    /// Writes operation `op` (whose step is `step`) at `base`, copied
    /// where it checks; `true` where the writer stops there (the head of
    /// a streamed message).
    #[inline(always)]
    fn step(
        &mut self,
        (op, step): (&Op, &Step),
        base: usize,
        how: Emit,
    ) -> Result<bool, WireError> {
        if self.copied(step, base) {
            return Ok(false);
        }
        self.by_fields(op, step, base, how)
    }

    /// Copies (or writes, for a literal not where it was read) what
    /// `step` writes at `base`; `false` where the field writer must.
    #[inline(always)]
    fn copied(&mut self, step: &Step, base: usize) -> bool {
        match step {
            Step::Nothing | Step::List => true,
            Step::Value { slot, max, until } => match self.bytes(base, *slot) {
                Ok(v) if v.is_none_or(|(_, n)| n <= *max as usize) => {
                    if let Some(v) = v {
                        self.value(v);
                    }
                    if let Some(d) = until {
                        self.literal(d);
                    }
                    true
                }
                _ => false,
            },
            Step::Token {
                slot,
                max,
                set,
                also,
            } => match self.bytes(base, *slot) {
                Ok(Some((s, n))) => {
                    let b = &self.data[s..s + n];
                    let refused = b.is_empty()
                        || n > *max as usize
                        || b.iter().any(|c| set.contains(c))
                        || (!also.is_empty() && b.windows(also.len()).any(|w| w == &also[..]));
                    if !refused {
                        self.value((s, n));
                    }
                    !refused
                }
                _ => false,
            },
            Step::Literal { slot, bytes } => match slot.map(|s| self.bytes(base, s)) {
                Some(Ok(Some(v))) => {
                    self.value(v);
                    true
                }
                // An unset slot or none: the literal's own bytes.
                None | Some(Ok(None)) => {
                    self.literal(bytes);
                    true
                }
                Some(Err(())) => false,
            },
            Step::Ws { slot } => match slot.map(|s| self.bytes(base, s)) {
                Some(Ok(Some(v))) => {
                    self.value(v);
                    true
                }
                None | Some(Ok(None)) => true,
                Some(Err(())) => false,
            },
            Step::Op => false,
        }
    }

    /// `op` written by the field writer, after the run; `true` where the
    /// writer stops there (a streamed field of a head).
    #[inline(never)]
    fn by_fields(
        &mut self,
        op: &Op,
        step: &Step,
        base: usize,
        how: Emit,
    ) -> Result<bool, WireError> {
        self.flush();
        if matches!(step, Step::Op) && how.head_only && op.stream {
            return Ok(true);
        }
        let op = std::slice::from_ref(op);
        self.g
            .emit_ops(op, self.slots, base, self.data, how, self.out)
    }

    /// The element at `base` in the compact form, copied with the run
    /// where all of it checks: each value where the last ended (the first
    /// where the run ends, or anywhere with no run) and within its most
    /// bytes, each literal there after it. `false`, nothing changed,
    /// where any of it does not (the element is then walked step by
    /// step, as any other).
    #[inline]
    fn compact_element(&mut self, steps: &[Compact], base: usize) -> bool {
        let mut span = self.run;
        // `lit` next in the message, after the span.
        let follows = |span: Option<(usize, usize)>, lit: &[u8]| {
            let (first, end) = span?;
            lit_at(self.data, end, lit).then_some((first, end + lit.len()))
        };
        for step in steps {
            if let Some(slot) = step.slot {
                match self.slots[base + slot as usize] {
                    Slot::Bytes { start, len } if len <= step.max => {
                        let (s, e) = (start as usize, start as usize + len as usize);
                        span = match span {
                            Some((first, end)) if end == s => Some((first, e)),
                            None if self.run.is_none() => Some((s, e)),
                            _ => return false,
                        };
                    }
                    Slot::Unset if step.unset.is_empty() => {}
                    Slot::Unset => match follows(span, &step.unset) {
                        Some(next) => span = Some(next),
                        None => return false,
                    },
                    _ => return false,
                }
            }
            if !step.after.is_empty() {
                match follows(span, &step.after) {
                    Some(next) => span = Some(next),
                    None => return false,
                }
            }
        }
        match span {
            Some((_, e)) if e <= self.data.len() => {
                self.run = span;
                true
            }
            _ => false,
        }
    }

    /// The edited list: its kept elements, what the edit adds, then its
    /// terminator.
    fn list(&mut self, f: &Forward, plan: &CopyPlan, how: Emit) -> Result<bool, WireError> {
        let at = f.list as usize;
        let count = match self.slots.get(at) {
            Some(Slot::Count(c)) => *c as usize,
            _ => 0,
        };
        // Edits apply to the unit's own list, not to its elements.
        let nested = Emit { edit: None, ..how };
        let ops = &self.g.blocks[plan.elem_block as usize];
        for i in 0..count {
            let base = at + 1 + i * plan.elem_slots;
            if f.drops(self.slots, base, self.data) {
                continue;
            }
            if let Some(steps) = &plan.elem_compact {
                if self.compact_element(steps, base) {
                    continue;
                }
            }
            for (op, step) in ops.iter().zip(&plan.elem) {
                if self.step((op, step), base, nested)? {
                    return Ok(true);
                }
            }
        }
        if let Some((_, cx)) = how.edit {
            self.flush();
            f.append(self.slots, self.data, cx, self.out);
        }
        if let Some(t) = &plan.stop {
            self.literal(t);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use crate::{ForwardContext, Grammar, Parser, Progress};
    use std::cell::Cell;

    thread_local! {
        /// Bytes copied out as runs on this thread.
        pub(super) static COPIED: Cell<usize> = const { Cell::new(0) };
    }

    /// A request's head is copied in runs: the output is the same as
    /// written field by field, and its kept lines keep their spelling.
    #[test]
    fn a_request_head_is_copied_as_it_was_read() {
        let g = Grammar::stock("http").unwrap();
        let unit = g.unit_id("request").unwrap();
        let head = "\r\nGET / HTTP/1.1\r\nhOsT:\t a\r\nConnection: close\r\nAccept:*/*\r\n\r\n";
        for interpreted in [false, true] {
            let mut p = Parser::new(g.clone(), unit);
            if interpreted {
                p = p.interpreted();
            }
            assert_eq!(
                p.parse(head.as_bytes()).unwrap(),
                Progress::Done(head.len())
            );
            let cx = ForwardContext {
                peer_address: b"192.0.2.9",
                session_ends: false,
            };
            let (mut copied, mut by_fields) = (Vec::new(), Vec::new());
            COPIED.with(|c| c.set(0));
            g.forward(unit, p.slots(), head.as_bytes(), false, &cx, &mut copied)
                .unwrap();
            // The request line and the kept lines, copied; what the edit
            // adds and the head's end, written.
            let kept = "GET / HTTP/1.1\r\nhOsT:\t a\r\n".len() + "Accept:*/*\r\n".len();
            assert_eq!(COPIED.with(Cell::get), kept);
            g.forward_by_fields(unit, p.slots(), head.as_bytes(), false, &cx, &mut by_fields)
                .unwrap();
            assert_eq!(copied, by_fields);
            assert_eq!(
                String::from_utf8_lossy(&copied),
                "GET / HTTP/1.1\r\nhOsT:\t a\r\nAccept:*/*\r\nConnection: keep-alive\r\nX-Forwarded-For: 192.0.2.9\r\n\r\n"
            );
        }
    }

    /// HTTP's header lines take the compact form: their lines are checked
    /// in one pass each, not step by step.
    #[test]
    fn header_lines_take_the_compact_form() {
        let g = Grammar::stock("http").unwrap();
        for unit in ["request", "response"] {
            let u = g.unit_id(unit).unwrap();
            let f = g.units[u].forward.as_ref().unwrap();
            let plan = g.copy_plan(g.units[u].block, f).unwrap();
            assert!(plan.elem_compact.is_some(), "{unit}");
        }
    }
}
