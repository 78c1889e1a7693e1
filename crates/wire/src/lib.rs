//! Message grammars: Spicy-like units compiled, at run time, into
//! incremental, allocation-free parsers and serialisers.
//!
//! This crate owns the bytes-to-values step of the paper's section 4.2: the
//! grammar language ([`grammar`]), its compiled form ([`program`]), the
//! parser ([`Parser`], and [`Batch`] for runs of whole messages),
//! serialisation ([`Grammar::serialize`], [`Builder`]) and the stock
//! grammars shipped in `grammars/`. It also writes a
//! grammar's parsers out as Rust ([`codegen`]), for grammars compiled ahead
//! of time, and runs such code first when it is registered ([`compiled`]).
//! It must not touch
//! sockets, threads or the scheduler: callers hand it bytes and take back
//! values or bytes.

mod batch;
pub mod codegen;
mod compile;
pub mod compiled;
mod error;
mod eval;
mod field_consts;
pub mod grammar;
mod header;
mod in_place;
mod int_expr;
mod merged;
mod message;
mod parse;
mod plain;
mod plan;
pub mod program;
mod property;
mod ranges;
mod reject;
#[doc(hidden)]
pub mod rt;
mod scalar;
mod serialize;
mod split;
pub mod stock;
mod verbatim;

pub use batch::Batch;
pub use compile::{DEFAULT_BYTES_MAX, DEFAULT_LIST_MAX};
pub use error::{GrammarError, WireError, WireErrorKind};
pub use header::{Header, HeaderInfo, HeaderRef};
pub use message::{FieldRef, List, Message, Value};
pub use parse::{Parser, Progress};
pub use plain::PlainInt;
pub use program::{
    FieldInfo, FieldKind, Fixed, FixedKind, FixedRun, ForwardContext, Slot, UnitId, UnitInfo,
};
pub use property::{PropertyRef, Routing};
pub use serialize::{write_vlong, Builder};

use program::{CExpr, Elem, Len, Op, OpKind, Scalar, Stop};
use std::sync::Arc;

/// The running CRC32 of a written stream, for its `%end` message.
#[derive(Clone, Debug, Default)]
pub struct StreamCrc(crc32fast::Hasher);

impl StreamCrc {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// A loaded grammar: every unit compiled, ready to parse and serialise.
#[derive(Debug)]
pub struct Grammar {
    pub name: String,
    pub(crate) units: Vec<UnitInfo>,
    pub(crate) blocks: Vec<Vec<Op>>,
    /// The blocks lowered for the parser.
    pub(crate) plan: plan::Plan,
    /// Per unit, its fields by name.
    pub(crate) field_index: Vec<message::FieldIndex>,
    /// Per unit, by slot of its layout (its nested units' included), the
    /// fields read in place, their start slots counted in that layout;
    /// empty for a unit with none.
    pub(crate) fixed_at: Vec<Box<[Option<Fixed>]>>,
    /// What code generated from this grammar looks like, once asked for
    /// (to match it with a compiled grammar).
    pub(crate) generated: std::sync::OnceLock<compiled::Fingerprint>,
    /// The names of its `limit(..)`s, by index.
    limit_names: Vec<String>,
    /// Their values: the defaults unless set ([`Grammar::set_limit`]).
    /// Parsers made afterwards take a copy.
    pub(crate) limit_values: Box<[i128]>,
}

impl Grammar {
    /// Loads grammar source. `name` is used when the source has no
    /// `grammar NAME;` line.
    pub fn from_source(name: &str, src: &str) -> Result<Grammar, GrammarError> {
        let (file, mut diagnostics) = grammar::parse_grammar(src);
        let name = file.name.clone().unwrap_or_else(|| name.to_string());
        let (compiled, more) = compile::compile(&file);
        diagnostics.extend(more);
        if !diagnostics.is_empty() {
            diagnostics.sort_by_key(|d| d.span().start);
            return Err(GrammarError { name, diagnostics });
        }
        let field_index = compiled
            .units
            .iter()
            .map(|u| message::FieldIndex::new(&u.fields))
            .collect();
        let plan = plan::Plan::new(&compiled.blocks, &compiled.units);
        let fixed_at = (0..compiled.units.len())
            .map(|u| in_place::layout(&compiled.units, u))
            .collect();
        Ok(Grammar {
            name,
            units: compiled.units,
            plan,
            field_index,
            fixed_at,
            blocks: compiled.blocks,
            generated: std::sync::OnceLock::new(),
            limit_names: compiled.limits.iter().map(|(n, _)| n.clone()).collect(),
            limit_values: compiled.limits.iter().map(|(_, v)| *v).collect(),
        })
    }

    /// The limits the grammar lets its user set (`limit("name", DEFAULT)`
    /// in its expressions), with their values.
    pub fn limits(&self) -> impl Iterator<Item = (&str, i128)> {
        self.limit_names
            .iter()
            .map(String::as_str)
            .zip(self.limit_values.iter().copied())
    }

    /// Sets limit `name` for the parsers made from now on; `false` (and
    /// nothing set) where the grammar has no such limit. The generated
    /// code and the interpreter read it alike, so a grammar's compiled
    /// code is still used.
    pub fn set_limit(&mut self, name: &str, value: i128) -> bool {
        match self.limit_names.iter().position(|n| n == name) {
            Some(i) => {
                self.limit_values[i] = value;
                true
            }
            None => false,
        }
    }

    /// One of the grammars shipped with Flick, by name (see [`stock::NAMES`]).
    pub fn stock(name: &str) -> Option<Arc<Grammar>> {
        let src = stock::source(name)?;
        Some(Arc::new(
            Grammar::from_source(name, src).expect("stock grammars load"),
        ))
    }

    pub fn unit_id(&self, name: &str) -> Option<UnitId> {
        self.units.iter().position(|u| u.name == name)
    }

    pub fn unit(&self, id: UnitId) -> &UnitInfo {
        &self.units[id]
    }

    /// The slot of field `name` of `unit`, for reading it from messages
    /// by [`Message::int_at`] and [`Message::bytes_at`].
    pub fn field_slot(&self, unit: UnitId, name: &str) -> Option<u16> {
        let fields = &self.units.get(unit)?.fields;
        self.field_index[unit].find(fields, name).map(|f| f.slot)
    }

    /// Field `path` of `unit` (`src_port`, or `tcp4.src_port` in a
    /// nested unit), resolved once for reading it from every message with
    /// [`Message::uint_of`] and [`Message::bytes_of`].
    pub fn field_ref(&self, unit: UnitId, path: &str) -> Option<FieldRef> {
        let mut base = 0usize;
        let mut unit = unit;
        let mut rest = path;
        loop {
            let (head, tail) = match rest.split_once('.') {
                Some((h, t)) => (h, Some(t)),
                None => (rest, None),
            };
            let fields = &self.units.get(unit)?.fields;
            let f = self.field_index[unit].find(fields, head)?;
            let at = base + f.slot as usize;
            match (tail, &f.kind) {
                (None, FieldKind::Int | FieldKind::Bytes) => {
                    let fixed = f.fixed.map(|x| Fixed {
                        start: (base + x.start as usize) as u16,
                        ..x
                    });
                    return Some(FieldRef::new(u16::try_from(at).ok()?, fixed));
                }
                (Some(t), FieldKind::Unit(u)) => (base, unit, rest) = (at, *u, t),
                _ => return None,
            }
        }
    }

    /// The header of `N` bytes at the start of `unit` (`path` empty) or
    /// of a unit inside it (`ip4` in `frame`), resolved once for taking
    /// it from every message with [`Message::header`]: `None` unless that
    /// unit's leading fixed-width fields ([`UnitInfo::fixed_run`]) span
    /// at least `N` bytes.
    pub fn header_ref<const N: usize>(&self, unit: UnitId, path: &str) -> Option<HeaderRef<N>> {
        let (start, len) = self.header_run(unit, path)?;
        (N <= len as usize).then_some(HeaderRef::compiled(start))
    }

    /// Every header of `unit`: its own, and those of the units inside it
    /// at any depth up to eight, each by the path `header_ref` resolves
    /// (a name's first declaration, where switch cases declare it again).
    pub fn headers(&self, unit: UnitId) -> Vec<HeaderInfo> {
        let mut out = Vec::new();
        let mut walk = vec![(String::new(), unit, 0usize, 0usize)];
        while let Some((path, u, base, depth)) = walk.pop() {
            let Some(info) = self.units.get(u) else {
                continue;
            };
            let run = info.fixed_run;
            let start = run.and_then(|r| u16::try_from(base + r.start as usize).ok());
            if let (Some(run), Some(start)) = (run, start) {
                out.push(HeaderInfo {
                    path: path.clone(),
                    unit: u,
                    start,
                    len: run.len,
                });
            }
            for (i, f) in info.fields.iter().enumerate() {
                let first = !info.fields[..i].iter().any(|g| g.name == f.name);
                if let (FieldKind::Unit(inner), true, true) = (&f.kind, first, depth < 8) {
                    let nested = match path.as_str() {
                        "" => f.name.clone(),
                        p => format!("{p}.{}", f.name),
                    };
                    walk.push((nested, *inner, base + f.slot as usize, depth + 1));
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        out
    }

    /// Where the header at `path` in `unit` begins (a slot of `unit`'s
    /// layout) and its length.
    pub(crate) fn header_run(&self, unit: UnitId, path: &str) -> Option<(u16, u16)> {
        let (mut base, mut unit) = (0usize, unit);
        for head in path.split('.').filter(|_| !path.is_empty()) {
            let fields = &self.units.get(unit)?.fields;
            match self.field_index[unit].find(fields, head)? {
                FieldInfo {
                    kind: FieldKind::Unit(u),
                    slot,
                    ..
                } => (base, unit) = (base + *slot as usize, *u),
                _ => return None,
            }
        }
        let run = self.units.get(unit)?.fixed_run?;
        Some((u16::try_from(base + run.start as usize).ok()?, run.len))
    }

    pub fn units(&self) -> &[UnitInfo] {
        &self.units
    }

    /// A parser for messages of `unit`, decoding every field.
    pub fn parser(self: &Arc<Self>, unit: UnitId) -> Parser {
        Parser::new(self.clone(), unit)
    }

    /// Which slots a view of `unit` that reads only `fields` must decode:
    /// those fields, and every field an expression of the unit reads
    /// (lengths, switches, checks). Other top-level fields are skipped and
    /// only stepped over. A nested unit's field is named by a path
    /// (`ip4.src`): the nested unit then keeps only what is named in it
    /// and what its own expressions read; one named by no path is kept
    /// whole. Fails with the first name that is not a field.
    pub fn view(&self, unit: UnitId, fields: &[&str]) -> Result<Arc<[bool]>, String> {
        self.view_in(unit, fields, false)
    }

    /// What every view of `unit` keeps: each nested unit opened, nothing
    /// named.
    pub(crate) fn view_floor(&self, unit: UnitId) -> Arc<[bool]> {
        self.view_in(unit, &[], true).expect("no fields named")
    }

    fn view_in(
        &self,
        unit: UnitId,
        fields: &[&str],
        open_all: bool,
    ) -> Result<Arc<[bool]>, String> {
        let mut keep = vec![false; self.units[unit].slots as usize];
        let mut opened = Vec::new();
        for name in fields {
            self.keep_path(unit, 0, name, &mut keep, &mut opened)
                .ok_or_else(|| name.to_string())?;
        }
        let mut deferred = Vec::new();
        self.keep_unit(unit, 0, (&opened, open_all), &mut keep, &mut deferred);
        // A bit field kept (asked for, or read by what is kept) needs its
        // source; one nothing keeps is not computed at all.
        for (block, op, base) in deferred {
            let o = &self.blocks[block as usize][op];
            if let (Some(s), OpKind::Var(e)) = (o.slot, &o.kind) {
                if keep.get(base + s as usize).copied().unwrap_or(false) {
                    mark_expr(e, base, &mut keep);
                }
            }
        }
        Ok(keep.into())
    }

    /// Keeps the field `path` names in `unit`, whose slots start at
    /// `base`, noting the nested units the path opens.
    fn keep_path(
        &self,
        unit: UnitId,
        base: usize,
        path: &str,
        keep: &mut [bool],
        opened: &mut Vec<usize>,
    ) -> Option<()> {
        let info = &self.units[unit];
        let (head, tail) = match path.split_once('.') {
            Some((h, t)) => (h, Some(t)),
            None => (path, None),
        };
        let f = info.fields.iter().find(|f| f.name == head)?;
        let at = base + f.slot as usize;
        match (tail, &f.kind) {
            (None, _) => {
                let n = self.field_width(info.block, f);
                keep[at..at + n].fill(true);
            }
            (Some(rest), FieldKind::Unit(u)) => {
                opened.push(at);
                self.keep_path(*u, at, rest, keep, opened)?;
            }
            (Some(_), _) => return None,
        }
        Some(())
    }

    /// Keeps what `unit`'s expressions read, and its nested units and
    /// lists whole but those opened.
    fn keep_unit(
        &self,
        unit: UnitId,
        base: usize,
        (opened, open_all): (&[usize], bool),
        keep: &mut [bool],
        deferred: &mut Vec<(program::BlockId, usize, usize)>,
    ) {
        let info = &self.units[unit];
        for f in &info.fields {
            let at = base + f.slot as usize;
            match &f.kind {
                FieldKind::Int | FieldKind::Bytes => {}
                FieldKind::Unit(u) if open_all || opened.contains(&at) => {
                    self.keep_unit(*u, at, (opened, open_all), keep, deferred)
                }
                // Lists are kept whole; expressions see their own.
                _ => {
                    let n = self.field_width(info.block, f);
                    keep[at..at + n].fill(true);
                }
            }
        }
        let mut seen = Vec::new();
        self.mark_used(info.block, base, keep, &mut seen, deferred);
    }

    /// The reply to a request of `unit` that no peer will answer, from the
    /// unit's `%fault` property: the request's values with the fault's
    /// fields set, serialised to `out`. `false` if the unit has no `%fault`.
    /// In `%fault`, `$$` is `cause`: 1 the peer could not be reached, 2 it
    /// did not answer in time, 3 its connection broke.
    pub fn fault_reply(
        &self,
        unit: UnitId,
        request: &[Slot],
        bytes: &[u8],
        cause: u16,
        out: &mut Vec<u8>,
    ) -> Result<bool, WireError> {
        let info = &self.units[unit];
        if info.fault.is_empty() {
            return Ok(false);
        }
        let cause = eval::Val::Int(cause as i128);
        self.assign(unit, &info.fault, "%fault", request, bytes, cause, out)?;
        Ok(true)
    }

    /// The message that ends a stream of `unit`'s messages, from the
    /// unit's `%end` property, serialised to `out`; `false` if there is
    /// none. `crc` has seen every byte written to the stream before it. In
    /// `%end`, `$$` is the CRC32 of the stream up to the field it fills,
    /// which must be the message's last four bytes (as in Hadoop's IFile,
    /// whose checksum covers the end marker before it).
    pub fn end_of_stream(
        &self,
        unit: UnitId,
        crc: &StreamCrc,
        out: &mut Vec<u8>,
    ) -> Result<bool, WireError> {
        let info = &self.units[unit];
        if info.end.is_empty() {
            return Ok(false);
        }
        let unset = vec![Slot::Unset; info.slots as usize];
        // First with a placeholder, to learn the bytes the CRC covers.
        let start = out.len();
        let placeholder = eval::Val::Int(0);
        self.assign(unit, &info.end, "%end", &unset, &[], placeholder, out)?;
        let covered = out.len().checked_sub(4).filter(|n| *n >= start);
        let Some(covered) = covered else {
            return Err(WireError {
                kind: WireErrorKind::Invalid,
                field: std::sync::Arc::from("%end"),
                offset: 0,
                status: None,
            });
        };
        let mut h = crc.0.clone();
        h.update(&out[start..covered]);
        out.truncate(start);
        let sum = eval::Val::Int(h.finalize() as i128);
        self.assign(unit, &info.end, "%end", &unset, &[], sum, out)?;
        Ok(true)
    }

    /// Whether a stream of `unit`'s messages ends with a `%end` message.
    pub fn has_end(&self, unit: UnitId) -> bool {
        !self.units[unit].end.is_empty()
    }

    /// Whether `unit` declares property `name` (`%quiet`, `%ends`, ...),
    /// without evaluating it.
    pub fn has_property(&self, unit: UnitId, name: &str) -> bool {
        self.units
            .get(unit)
            .is_some_and(|u| u.properties.iter().any(|(n, _)| n == name))
    }

    /// Serialises `base`'s values with `assignments` applied.
    #[allow(clippy::too_many_arguments)]
    fn assign(
        &self,
        unit: UnitId,
        assignments: &[(u16, CExpr)],
        what: &str,
        base: &[Slot],
        bytes: &[u8],
        dollar: eval::Val,
        out: &mut Vec<u8>,
    ) -> Result<(), WireError> {
        let mut slots = base.to_vec();
        let mut data = bytes.to_vec();
        for (target, e) in assignments {
            let env = eval::Env {
                slots: base,
                base: 0,
                data: bytes,
                dollar,
                dollar_base: 0,
                context: 0,
                limits: &self.limit_values,
                streamed: 0,
            };
            let v = env.eval(e).map_err(|_| WireError {
                kind: WireErrorKind::Invalid,
                field: std::sync::Arc::from(what),
                offset: 0,
                status: None,
            })?;
            slots[*target as usize] = match v {
                eval::Val::Int(i) if i < 0 => Slot::SInt(i as i64),
                eval::Val::Int(i) => Slot::Int(i as u64),
                eval::Val::Bytes(b) => {
                    let start = data.len() as u32;
                    data.extend_from_slice(b);
                    Slot::Bytes {
                        start,
                        len: b.len() as u32,
                    }
                }
                _ => Slot::Unset,
            };
        }
        self.serialize(unit, &mut slots, &data, out)
    }

    /// A routing property of a parsed message of `unit` (`%broadcast`,
    /// `%more`, `%correlate`), or `None` if the unit does not declare it or
    /// it has no value for this message.
    pub fn property(&self, unit: UnitId, name: &str, slots: &[Slot], bytes: &[u8]) -> Option<i128> {
        let index = self.property_index(unit, name)?;
        self.property_of(unit, index, slots, bytes)
    }

    /// The most bytes a message of `unit` can take in a buffer at once:
    /// `&stream` fields count for nothing, since they pass through in
    /// pieces.
    pub fn max_bytes(&self, unit: UnitId) -> u64 {
        self.block_max(self.units[unit].block, 0)
    }

    fn block_max(&self, block: program::BlockId, depth: usize) -> u64 {
        if depth > 64 {
            return 0;
        }
        let mut total: u64 = 0;
        for op in &self.blocks[block as usize] {
            let n = match &op.kind {
                _ if op.stream => 0,
                OpKind::Scalar(s) => scalar_max(s),
                OpKind::Var(_) | OpKind::SerializeVar { .. } | OpKind::Mark => 0,
                OpKind::Switch { cases, default, .. } => cases
                    .iter()
                    .map(|(_, b)| *b)
                    .chain(*default)
                    .map(|b| self.block_max(b, depth + 1))
                    .max()
                    .unwrap_or(0),
                OpKind::Unit { block } => self.block_max(*block, depth + 1),
                OpKind::List {
                    elem,
                    stop,
                    sep,
                    max,
                    max_bytes,
                } => {
                    let each = match elem {
                        Elem::Unit { block, .. } => self.block_max(*block, depth + 1),
                        Elem::Scalar(s) => scalar_max(s),
                    } + sep.as_ref().map_or(0, |s| s.len() as u64);
                    let end = match stop {
                        Stop::Until(t) => t.len() as u64,
                        Stop::UntilEither(t, also) => t.len().max(also.len()) as u64,
                        _ => 0,
                    };
                    let all = (*max as u64).saturating_mul(each).saturating_add(end);
                    max_bytes.map_or(all, |m| all.min(m as u64 + end))
                }
            };
            total = total.saturating_add(n);
        }
        total
    }

    /// How many slots field `f` of the unit whose block is `block` takes.
    fn field_width(&self, block: program::BlockId, f: &FieldInfo) -> usize {
        match &f.kind {
            FieldKind::Int | FieldKind::Bytes => 1,
            FieldKind::Unit(u) => self.units[*u].slots as usize,
            FieldKind::List { elem_slots, .. } => {
                // The count slot and the elements stored at once: as many
                // as the list may have, or one for a streamed list. Only
                // this unit's list has this slot (others number their own).
                let stored = match self.list_op(block, f.slot) {
                    Some(op) if op.stream => 1,
                    Some(Op {
                        kind: OpKind::List { max, .. },
                        ..
                    }) => *max as usize,
                    _ => 0,
                };
                1 + stored * *elem_slots as usize
            }
        }
    }

    /// The list operation at `slot` of a block or of its switch cases
    /// (which share the unit's slots), not of nested units.
    fn list_op(&self, block: program::BlockId, slot: u16) -> Option<&Op> {
        self.blocks[block as usize]
            .iter()
            .find_map(|op| match &op.kind {
                OpKind::List { .. } if op.slot == Some(slot) => Some(op),
                OpKind::Switch { cases, default, .. } => cases
                    .iter()
                    .map(|(_, b)| *b)
                    .chain(*default)
                    .find_map(|b| self.list_op(b, slot)),
                _ => None,
            })
    }

    /// A variable a view may leave out when nothing it keeps reads it: a
    /// bit field of an unsigned integer field read before it in the same
    /// block, with no check of its own, so that computing it cannot fail
    /// and leaving it out changes nothing but its slot.
    pub(crate) fn droppable_var(&self, block: program::BlockId, op: usize) -> bool {
        let ops = &self.blocks[block as usize];
        let Some(Op {
            kind: OpKind::Var(e),
            requires: None,
            ..
        }) = ops.get(op)
        else {
            return false;
        };
        let plan::ValExpr::Bits { slot, .. } = plan::val_expr(e) else {
            return false;
        };
        ops[..op].iter().any(|p| {
            p.slot == Some(slot)
                && matches!(p.kind, OpKind::Scalar(Scalar::Int { signed: false, .. }))
        })
    }

    /// Marks slots read by expressions of a block and of its switch cases
    /// (which share the unit's slots), but not of nested units. Variables
    /// a view may leave out go to `deferred` instead, in order: what they
    /// read is marked only if they are kept.
    fn mark_used(
        &self,
        block: program::BlockId,
        base: usize,
        keep: &mut [bool],
        seen: &mut Vec<program::BlockId>,
        deferred: &mut Vec<(program::BlockId, usize, usize)>,
    ) {
        if seen.contains(&block) {
            return;
        }
        seen.push(block);
        for (i, op) in self.blocks[block as usize].iter().enumerate() {
            let mut exprs: Vec<&CExpr> = Vec::new();
            if let Some(r) = &op.requires {
                exprs.push(r);
                if let Some(s) = op.slot {
                    mark(keep, base + s as usize);
                }
            }
            match &op.kind {
                OpKind::Scalar(Scalar::Bytes {
                    len: Len::Expr(e), ..
                }) => exprs.push(e),
                // Every view finds its fields read in place from here.
                OpKind::Mark => {
                    if let Some(s) = op.slot {
                        mark(keep, base + s as usize);
                    }
                }
                OpKind::Var(_) if self.droppable_var(block, i) => deferred.push((block, i, base)),
                OpKind::Var(e) => {
                    exprs.push(e);
                    if let Some(s) = op.slot {
                        mark(keep, base + s as usize);
                    }
                }
                OpKind::SerializeVar { var, target, expr } => {
                    exprs.push(expr);
                    mark(keep, base + *var as usize);
                    mark(keep, base + *target as usize);
                }
                OpKind::Switch { on, cases, default } => {
                    exprs.push(on);
                    for (c, b) in cases {
                        exprs.push(c);
                        self.mark_used(*b, base, keep, seen, deferred);
                    }
                    if let Some(b) = default {
                        self.mark_used(*b, base, keep, seen, deferred);
                    }
                }
                OpKind::List {
                    stop: Stop::Count(e),
                    ..
                } => exprs.push(e),
                OpKind::List {
                    elem: Elem::Scalar(_),
                    ..
                }
                | OpKind::List { .. } => {}
                _ => {}
            }
            for e in exprs {
                mark_expr(e, base, keep);
            }
        }
    }
}

fn scalar_max(s: &Scalar) -> u64 {
    match s {
        Scalar::Int { bytes, .. } => *bytes as u64,
        Scalar::Bytes { len, max } => {
            *max as u64
                + match len {
                    Len::Until(d) => d.len() as u64,
                    _ => 0,
                }
        }
        // Digits, a `-`, and an `&until` delimiter (`&before_any` is not read).
        Scalar::AsciiInt {
            until,
            before,
            signed,
            ..
        } => 20 + u64::from(*signed) + if *before { 0 } else { until.len() as u64 },
        Scalar::VInt => 9,
        Scalar::Literal { bytes, .. } => bytes.len() as u64,
        Scalar::Ws => parse::WS_MAX as u64,
    }
}

fn mark(keep: &mut [bool], s: usize) {
    if let Some(k) = keep.get_mut(s) {
        *k = true;
    }
}

/// Keeps the slots `e` reads, `e` being an expression of a unit whose
/// slots start at `base`.
fn mark_expr(e: &CExpr, base: usize, keep: &mut [bool]) {
    match e {
        CExpr::Slot(s) => mark(keep, base + *s as usize),
        CExpr::List(l) => mark(keep, base + l.slot as usize),
        CExpr::Unary(_, x) => mark_expr(x, base, keep),
        CExpr::Binary(_, a, b) => {
            mark_expr(a, base, keep);
            mark_expr(b, base, keep);
        }
        CExpr::Call(_, args) => args.iter().for_each(|a| mark_expr(a, base, keep)),
        _ => {}
    }
}
