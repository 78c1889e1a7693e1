//! Routing properties in the shapes grammars give them most, read without
//! walking their expressions: a field compared with a number (`%ends =
//! self.key_len == -1`), a field's own number (`%quiet = self.noreply`),
//! a field that is one of some strings (`%broadcast = self.command ==
//! "flush_all" || self.command == "version"`), maybe scaled (`%refuse =
//! 6 * (...)`), and any other expression of numbers and integer fields
//! alone (`%quiet = self.magic == Magic::Request && (self.opcode ==
//! Opcode::GetQ || ...)`, a binary protocol's), read as a tree of plain
//! integer operations. Each property's shape is found when its grammar is
//! compiled; [`Grammar::property`] and [`PropertyRef`] read through it.

use crate::grammar::ast::{BinOp, UnOp};
use crate::program::{CExpr, Slot, UnitId};
use crate::Grammar;
use std::sync::Arc;

/// How a property is read (see the module doc); `Expr`: by walking it.
#[derive(Clone, Debug)]
pub(crate) enum PropertyForm {
    /// `slot == constant` (or `!=`, where the flag is false).
    Compare(u16, i128, bool),
    /// The slot's number.
    Number(u16),
    /// `scale` where the slot's bytes are one of these, else 0 (`!=` of
    /// one string: 1 where they are not it, where the flag is false).
    OneOf {
        slot: u16,
        strings: Vec<Arc<[u8]>>,
        scale: i128,
        equal: bool,
    },
    /// Numbers and integer fields only, read without building values.
    Ints(IntForm),
    Expr,
}

/// An expression of numbers and integer fields: what
/// [`Env::int`](crate::eval::Env::int) computes for it, wherever every
/// field it reads holds a number that fits an `i64` and no step overflows
/// one (elsewhere it cannot tell, and the expression is walked). In `i64`
/// rather than the walk's `i128`, whose checked multiplication is a call
/// and whose values come back through memory. Not the parser's
/// [`IntExpr`](crate::int_expr::IntExpr): its tests of one field against
/// many numbers are a node per comparison, where here they are one table
/// (the binary Memcached proxy, under callgrind: 20,626 instructions an
/// operation with properties lowered that way, 17,022 with these).
#[derive(Clone, Debug)]
pub(crate) enum IntForm {
    Int(i64),
    Slot(u16),
    Not(Box<IntForm>),
    Neg(Box<IntForm>),
    Binary(BinOp, Box<IntForm>, Box<IntForm>),
    /// A test of one field against numbers (`self.opcode == Opcode::GetQ
    /// || self.opcode == Opcode::GetKQ || ...`), answered from a bit per
    /// value where the field holds 0..=255, by `test` elsewhere.
    Test {
        slot: u16,
        bits: [u64; 4],
        test: Box<IntForm>,
    },
    /// `&&` of tests of different fields (`self.magic == Magic::Request
    /// && (self.opcode == ...)`), each tabled as [`IntForm::Test`] is,
    /// read left to right as `&&` reads them: 0 at the first that fails,
    /// 1 where all hold. Where a field holds no number in 0..=255, `tree`
    /// (the `&&` itself) answers. One node where the tree is a call per
    /// test and per `&&`.
    AllOf {
        tests: Box<[(u16, [u64; 4])]>,
        tree: Box<IntForm>,
    },
}

/// The number in slot `s`, as the trees read it.
#[inline(always)]
fn slot_int(slots: &[Slot], s: u16) -> Option<i64> {
    match slots.get(s as usize)? {
        Slot::Int(v) => i64::try_from(*v).ok(),
        Slot::SInt(v) => Some(*v),
        Slot::Count(n) => Some(i64::from(*n)),
        _ => None,
    }
}

impl IntForm {
    /// [`IntForm::eval`] of an operand, its leaves (a number, a field)
    /// read in place rather than by a call each.
    #[inline(always)]
    fn operand(&self, slots: &[Slot]) -> Option<i64> {
        match self {
            IntForm::Int(v) => Some(*v),
            IntForm::Slot(s) => slot_int(slots, *s),
            f => f.eval(slots),
        }
    }

    /// `e` as such a tree, if it is one.
    fn of(e: &CExpr) -> Option<IntForm> {
        let f = match e {
            CExpr::Int(v) => IntForm::Int(i64::try_from(*v).ok()?),
            CExpr::Slot(s) => IntForm::Slot(*s),
            CExpr::Unary(UnOp::Not, x) => IntForm::Not(Box::new(IntForm::of(x)?)),
            CExpr::Unary(UnOp::Neg, x) => IntForm::Neg(Box::new(IntForm::of(x)?)),
            CExpr::Binary(op, a, b) => {
                IntForm::Binary(*op, Box::new(IntForm::of(a)?), Box::new(IntForm::of(b)?))
            }
            _ => return None,
        };
        Some(f.tabled())
    }

    /// This tree, or where it is a test (0 or 1) of one field alone, that
    /// test with its answers for the field's values 0..=255 tabled.
    fn tabled(self) -> IntForm {
        let test = matches!(
            self,
            IntForm::Not(_)
                | IntForm::Binary(
                    BinOp::Eq
                        | BinOp::Ne
                        | BinOp::Lt
                        | BinOp::Le
                        | BinOp::Gt
                        | BinOp::Ge
                        | BinOp::And
                        | BinOp::Or,
                    ..
                )
        );
        let Some(slot) = self.one_slot().flatten().filter(|_| test) else {
            return self.all_of();
        };
        let mut bits = [0u64; 4];
        let mut slots = vec![Slot::Unset; slot as usize + 1];
        for v in 0..256u64 {
            slots[slot as usize] = Slot::Int(v);
            match self.eval(&slots) {
                Some(0) => {}
                Some(1) => bits[(v / 64) as usize] |= 1 << (v % 64),
                _ => return self,
            }
        }
        IntForm::Test {
            slot,
            bits,
            test: Box::new(self),
        }
    }

    /// This tree as an [`IntForm::AllOf`] where it is `a && b` and each
    /// side is a tabled test or such a conjunction.
    fn all_of(self) -> IntForm {
        let tests = |f: &IntForm| -> Option<Vec<(u16, [u64; 4])>> {
            let IntForm::Binary(BinOp::And, a, b) = f else {
                return None;
            };
            let mut tests = Vec::new();
            for side in [a, b] {
                match &**side {
                    IntForm::Test { slot, bits, .. } => tests.push((*slot, *bits)),
                    IntForm::AllOf { tests: more, .. } => tests.extend_from_slice(more),
                    _ => return None,
                }
            }
            Some(tests)
        };
        match tests(&self) {
            Some(tests) => IntForm::AllOf {
                tests: tests.into(),
                tree: Box::new(self),
            },
            None => self,
        }
    }

    /// The one field the tree reads: `Some(None)` where it reads none,
    /// `None` where it reads several.
    fn one_slot(&self) -> Option<Option<u16>> {
        let join = |a: Option<u16>, b: Option<u16>| match (a, b) {
            (Some(x), Some(y)) if x != y => None,
            (x, y) => Some(x.or(y)),
        };
        match self {
            IntForm::Int(_) => Some(None),
            IntForm::Slot(s) | IntForm::Test { slot: s, .. } => Some(Some(*s)),
            IntForm::Not(x) | IntForm::Neg(x) => x.one_slot(),
            IntForm::Binary(_, a, b) => join(a.one_slot()?, b.one_slot()?),
            IntForm::AllOf { tree, .. } => tree.one_slot(),
        }
    }

    /// Its value; `None` where a field read holds no number (unset,
    /// bytes) or an operation fails (overflow, division by zero), which
    /// the walk then decides.
    fn eval(&self, slots: &[Slot]) -> Option<i64> {
        match self {
            IntForm::Int(v) => Some(*v),
            IntForm::Slot(s) => slot_int(slots, *s),
            IntForm::Test { slot, bits, test } => match slots.get(*slot as usize) {
                Some(Slot::Int(v)) if *v < 256 => {
                    Some(i64::from(bits[(*v / 64) as usize] >> (*v % 64) & 1 == 1))
                }
                _ => test.eval(slots),
            },
            IntForm::AllOf { tests, tree } => {
                for (slot, bits) in tests.iter() {
                    match slots.get(*slot as usize) {
                        Some(Slot::Int(v)) if *v < 256 => {
                            if bits[(*v / 64) as usize] >> (*v % 64) & 1 == 0 {
                                return Some(0);
                            }
                        }
                        _ => return tree.eval(slots),
                    }
                }
                Some(1)
            }
            IntForm::Not(x) => Some(i64::from(x.operand(slots)? == 0)),
            IntForm::Neg(x) => x.operand(slots)?.checked_neg(),
            IntForm::Binary(op, a, b) => {
                let x = a.operand(slots)?;
                // `&&` and `||` read their right side only as the walk does.
                match op {
                    BinOp::And if x == 0 => return Some(0),
                    BinOp::Or if x != 0 => return Some(1),
                    _ => {}
                }
                let y = b.operand(slots)?;
                match op {
                    BinOp::And | BinOp::Or => Some(i64::from(y != 0)),
                    BinOp::Eq => Some(i64::from(x == y)),
                    BinOp::Ne => Some(i64::from(x != y)),
                    BinOp::Lt => Some(i64::from(x < y)),
                    BinOp::Le => Some(i64::from(x <= y)),
                    BinOp::Gt => Some(i64::from(x > y)),
                    BinOp::Ge => Some(i64::from(x >= y)),
                    BinOp::Add => x.checked_add(y),
                    BinOp::Sub => x.checked_sub(y),
                    BinOp::Mul => x.checked_mul(y),
                    BinOp::Div => x.checked_div(y),
                    BinOp::Mod => x.checked_rem(y),
                }
            }
        }
    }
}

/// The slot and string of `e`, if it is `self.field == "string"` (either
/// way round) and `op` is its operator.
fn slot_is(e: &CExpr, op: BinOp) -> Option<(u16, Arc<[u8]>)> {
    let CExpr::Binary(o, a, b) = e else {
        return None;
    };
    if *o != op {
        return None;
    }
    match (&**a, &**b) {
        (CExpr::Slot(s), CExpr::Str(t)) | (CExpr::Str(t), CExpr::Slot(s)) => Some((*s, t.clone())),
        _ => None,
    }
}

/// The slot and strings of a chain of `||` whose every term compares the
/// same slot with a string.
fn one_of(e: &CExpr) -> Option<(u16, Vec<Arc<[u8]>>)> {
    if let Some((s, t)) = slot_is(e, BinOp::Eq) {
        return Some((s, vec![t]));
    }
    let CExpr::Binary(BinOp::Or, a, b) = e else {
        return None;
    };
    let (s, mut strings) = one_of(a)?;
    let (t, more) = one_of(b)?;
    (s == t).then(|| {
        strings.extend(more);
        (s, strings)
    })
}

impl PropertyForm {
    pub(crate) fn of(e: &CExpr) -> PropertyForm {
        let e = crate::int_expr::fold(e);
        if let CExpr::Binary(op @ (BinOp::Eq | BinOp::Ne), a, b) = &e {
            if let (CExpr::Slot(s), CExpr::Int(c)) | (CExpr::Int(c), CExpr::Slot(s)) = (&**a, &**b)
            {
                return PropertyForm::Compare(*s, *c, *op == BinOp::Eq);
            }
        }
        if let CExpr::Slot(s) = e {
            return PropertyForm::Number(s);
        }
        if let Some((slot, t)) = slot_is(&e, BinOp::Ne) {
            return PropertyForm::OneOf {
                slot,
                strings: vec![t],
                scale: 1,
                equal: false,
            };
        }
        let (scale, chain) = match &e {
            CExpr::Binary(BinOp::Mul, a, b) => match (&**a, &**b) {
                (CExpr::Int(k), x) | (x, CExpr::Int(k)) => (*k, x),
                _ => (1, &e),
            },
            _ => (1, &e),
        };
        match one_of(chain) {
            Some((slot, strings)) => PropertyForm::OneOf {
                slot,
                strings,
                scale,
                equal: true,
            },
            None => IntForm::of(&e).map_or(PropertyForm::Expr, PropertyForm::Ints),
        }
    }

    /// The property's value, as walking its expression gives it; `None`
    /// where this form cannot tell (walk the expression).
    #[inline]
    pub(crate) fn read(&self, slots: &[Slot], bytes: &[u8]) -> Option<Option<i128>> {
        let number = |s: u16| match slots.get(s as usize) {
            Some(Slot::Int(v)) => Some(*v as i128),
            Some(Slot::SInt(v)) => Some(*v as i128),
            Some(Slot::Count(n)) => Some(*n as i128),
            _ => None,
        };
        match self {
            PropertyForm::Compare(s, c, eq) => {
                let v = number(*s)?;
                Some(Some(i128::from((v == *c) == *eq)))
            }
            PropertyForm::Number(s) => Some(Some(number(*s)?)),
            PropertyForm::OneOf {
                slot,
                strings,
                scale,
                equal,
            } => {
                let found = match slots.get(*slot as usize) {
                    Some(Slot::Bytes { start, len }) => {
                        let at = *start as usize;
                        let field = bytes.get(at..at + *len as usize).unwrap_or(&[]);
                        strings.iter().any(|t| **t == *field)
                    }
                    // An unset field equals no string.
                    Some(Slot::Unset) | None => false,
                    _ => return None,
                };
                Some(Some(if found == *equal { *scale } else { 0 }))
            }
            PropertyForm::Ints(f) => f.eval(slots).map(|v| Some(i128::from(v))),
            PropertyForm::Expr => None,
        }
    }
}

/// A property of a unit (see [`Grammar::property`]), found by name once.
#[derive(Clone, Debug)]
pub struct PropertyRef {
    unit: UnitId,
    index: usize,
}

/// The routing properties a grammar may declare, in
/// [`ROUTING`](crate::grammar::parser::ROUTING)'s order: what the platform
/// asks of messages, found by their place in a unit's table rather than
/// by name (about twenty reads per Memcached request and reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Routing {
    Broadcast,
    More,
    Coalesce,
    Correlate,
    Ends,
    EndsPeer,
    ReplyContext,
    Quiet,
    Split,
    Resync,
    Fence,
    Fenced,
    Discard,
    QuietReject,
    RejectSend,
    Refuse,
    Exclusive,
    Idempotent,
    BufferBody,
    TimeoutStatus,
    Merge,
    MergeKey,
    MergeValue,
    MergeSum,
}

/// How many [`Routing`] properties there are.
pub(crate) const ROUTING_COUNT: usize = Routing::MergeSum as usize + 1;

impl Routing {
    /// Every one, in order.
    pub const ALL: [Routing; ROUTING_COUNT] = [
        Routing::Broadcast,
        Routing::More,
        Routing::Coalesce,
        Routing::Correlate,
        Routing::Ends,
        Routing::EndsPeer,
        Routing::ReplyContext,
        Routing::Quiet,
        Routing::Split,
        Routing::Resync,
        Routing::Fence,
        Routing::Fenced,
        Routing::Discard,
        Routing::QuietReject,
        Routing::RejectSend,
        Routing::Refuse,
        Routing::Exclusive,
        Routing::Idempotent,
        Routing::BufferBody,
        Routing::TimeoutStatus,
        Routing::Merge,
        Routing::MergeKey,
        Routing::MergeValue,
        Routing::MergeSum,
    ];

    /// Its name in grammars, without the `%`.
    pub fn name(self) -> &'static str {
        crate::grammar::parser::ROUTING[self as usize]
    }
}

/// Per [`Routing`] property, where `properties` declares it, plus one (0:
/// not declared).
pub(crate) fn routing_table(properties: &[(String, CExpr)]) -> [u8; ROUTING_COUNT] {
    let mut t = [0u8; ROUTING_COUNT];
    for (i, slot) in t.iter_mut().enumerate() {
        let name = crate::grammar::parser::ROUTING[i];
        if let Some(at) = properties.iter().position(|(n, _)| n == name) {
            *slot = u8::try_from(at + 1).unwrap_or(0);
        }
    }
    t
}

/// A word standing for a property's name: its first eight bytes and its
/// length. Names are found by these, one comparison each, and the one
/// that matches checked whole: a name compared as a string at every
/// lookup cost more than reading most properties.
pub(crate) fn name_key(name: &str) -> u64 {
    let b = name.as_bytes();
    let mut w = [0u8; 8];
    let n = b.len().min(8);
    w[..n].copy_from_slice(&b[..n]);
    u64::from_le_bytes(w) ^ (b.len() as u64).rotate_right(8)
}

impl Grammar {
    /// Unit `unit`'s property `name`, if it declares one.
    pub fn property_ref(&self, unit: UnitId, name: &str) -> Option<PropertyRef> {
        self.units.get(unit)?;
        let index = self.property_index(unit, name)?;
        Some(PropertyRef { unit, index })
    }

    /// Where `unit` declares property `name` among its properties.
    #[inline]
    pub(crate) fn property_index(&self, unit: UnitId, name: &str) -> Option<usize> {
        let info = &self.units[unit];
        let key = name_key(name);
        info.property_keys
            .iter()
            .enumerate()
            .filter(|(_, k)| **k == key)
            .map(|(i, _)| i)
            .find(|&i| info.properties[i].0 == name)
    }

    /// Routing property `p` of a parsed message of `unit`, as
    /// [`Grammar::property`] gives it for `p`'s name.
    #[inline]
    pub fn routing(&self, unit: UnitId, p: Routing, slots: &[Slot], bytes: &[u8]) -> Option<i128> {
        let at = self.units[unit].routing[p as usize];
        match at {
            0 => None,
            at => self.property_of(unit, at as usize - 1, slots, bytes),
        }
    }

    /// Whether `unit` declares routing property `p`.
    pub fn declares(&self, unit: UnitId, p: Routing) -> bool {
        self.units
            .get(unit)
            .is_some_and(|u| u.routing[p as usize] != 0)
    }

    /// The value of property `p` for a parsed message, as
    /// [`Grammar::property`] gives it.
    #[inline]
    pub fn property_at(&self, p: &PropertyRef, slots: &[Slot], bytes: &[u8]) -> Option<i128> {
        self.property_of(p.unit, p.index, slots, bytes)
    }

    /// Property `index` of `unit` for a parsed message: by its form where
    /// that tells, by walking its expression otherwise.
    #[inline]
    pub(crate) fn property_of(
        &self,
        unit: UnitId,
        index: usize,
        slots: &[Slot],
        bytes: &[u8],
    ) -> Option<i128> {
        let info = &self.units[unit];
        if let Some(v) = info
            .property_forms
            .get(index)
            .and_then(|f| f.read(slots, bytes))
        {
            return v;
        }
        let env = crate::eval::Env {
            slots,
            base: 0,
            data: bytes,
            dollar: crate::eval::Val::Unset,
            dollar_base: 0,
            context: 0,
            limits: &self.limit_values,
            streamed: 0,
        };
        env.int(&info.properties[index].1).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_properties_are_named_in_the_parsers_order() {
        assert_eq!(crate::grammar::parser::ROUTING.len(), ROUTING_COUNT);
        for (i, p) in Routing::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i);
        }
        assert_eq!(Routing::Broadcast.name(), "broadcast");
        assert_eq!(Routing::Quiet.name(), "quiet");
        assert_eq!(Routing::TimeoutStatus.name(), "timeout_status");
        assert_eq!(Routing::MergeSum.name(), "merge_sum");
    }

    #[test]
    fn routing_reads_what_the_name_reads() {
        for name in [
            "memcached_ascii",
            "memcached_binary",
            "http",
            "hadoop_ifile",
        ] {
            let g = Grammar::stock(name).unwrap();
            for unit in 0..g.units.len() {
                for p in Routing::ALL {
                    assert_eq!(
                        g.declares(unit, p),
                        g.has_property(unit, p.name()),
                        "{name} {unit} {}",
                        p.name()
                    );
                    let slots = vec![Slot::Unset; g.units[unit].slots as usize];
                    assert_eq!(
                        g.routing(unit, p, &slots, &[]),
                        g.property(unit, p.name(), &slots, &[]),
                    );
                }
            }
        }
    }

    #[test]
    fn a_compared_field_reads_as_the_expression_does() {
        let g = Grammar::stock("hadoop_ifile").unwrap();
        let kv = g.unit_id("kv").unwrap();
        let p = g.property_ref(kv, "ends").unwrap();
        assert!(matches!(
            g.units[kv].property_forms[p.index],
            PropertyForm::Compare(..)
        ));
        let key_len = g.field_slot(kv, "key_len").unwrap() as usize;
        let n = g.unit(kv).slots as usize;
        for (slot, want) in [
            (Slot::SInt(-1), Some(1)),
            (Slot::Int(3), Some(0)),
            (Slot::Unset, None),
        ] {
            let mut slots = vec![Slot::Unset; n];
            slots[key_len] = slot;
            let general = g.property(kv, "ends", &slots, &[]);
            assert_eq!(g.property_at(&p, &slots, &[]), general);
            if want.is_some() {
                assert_eq!(general, want);
            }
        }
        assert!(g.property_ref(kv, "broadcast").is_none());
    }

    /// A property's expression walked, as if it had no form.
    fn walked(g: &Grammar, slots: &[Slot], data: &[u8], e: &CExpr) -> Option<i128> {
        let env = crate::eval::Env {
            slots,
            base: 0,
            data,
            dollar: crate::eval::Val::Unset,
            dollar_base: 0,
            context: 0,
            limits: &g.limit_values,
            streamed: 0,
        };
        env.int(e).ok()
    }

    /// The slots and integer constants an expression reads.
    fn reads(e: &CExpr, slots: &mut Vec<u16>, ints: &mut Vec<i128>) {
        match e {
            CExpr::Slot(s) => slots.push(*s),
            CExpr::Int(v) => ints.push(*v),
            CExpr::Unary(_, x) => reads(x, slots, ints),
            CExpr::Binary(_, a, b) => {
                reads(a, slots, ints);
                reads(b, slots, ints);
            }
            CExpr::Call(_, args) => args.iter().for_each(|a| reads(a, slots, ints)),
            _ => {}
        }
    }

    /// Every property of the stock grammars read as a tree of integer
    /// operations reads as its expression walked does, over random
    /// values of the fields it reads: numbers near its constants, in and
    /// out of the tabled 0..=255, signed, counts, bytes and nothing.
    #[test]
    fn integer_forms_read_as_their_expressions() {
        let mut forms = 0;
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for &name in crate::stock::NAMES {
            let g = Grammar::stock(name).unwrap();
            for (u, info) in g.units.iter().enumerate() {
                for (i, (prop, e)) in info.properties.iter().enumerate() {
                    if !matches!(info.property_forms[i], PropertyForm::Ints(_)) {
                        continue;
                    }
                    forms += 1;
                    let (mut read, mut ints) = (Vec::new(), Vec::new());
                    reads(&crate::int_expr::fold(e), &mut read, &mut ints);
                    let mut values = vec![
                        Slot::Unset,
                        Slot::Int(0),
                        Slot::Int(255),
                        Slot::Int(256),
                        Slot::Int(u64::MAX),
                        Slot::SInt(-1),
                        Slot::Count(2),
                        Slot::Bytes { start: 0, len: 1 },
                    ];
                    for c in ints.iter().filter(|c| **c >= 0 && **c < u64::MAX as i128) {
                        let c = *c as u64;
                        values.extend([
                            Slot::Int(c),
                            Slot::Int(c + 1),
                            Slot::Int(c.saturating_sub(1)),
                        ]);
                    }
                    for _ in 0..400 {
                        let mut slots = vec![Slot::Unset; info.slots as usize];
                        for &s in &read {
                            // Mostly numbers, so that the trees run to the end.
                            let pick = next() as usize % values.len();
                            slots[s as usize] = values[pick];
                        }
                        assert_eq!(
                            g.property(u, prop, &slots, b"x"),
                            walked(&g, &slots, b"x", e),
                            "{name}: {}.{prop} with {slots:?}",
                            info.name
                        );
                    }
                }
            }
        }
        assert!(forms >= 10, "properties read as integer trees: {forms}");
    }

    /// The binary Memcached protocol's routing properties (a header's
    /// magic, opcode and lengths compared with numbers) are read as trees
    /// of integer operations, their tests of one field tabled, not walked.
    #[test]
    fn binary_memcached_properties_are_integer_forms() {
        let g = Grammar::stock("memcached_binary").unwrap();
        let unit = g.unit_id("cmd").unwrap();
        let info = &g.units[unit];
        for name in [
            "quiet",
            "broadcast",
            "refuse",
            "idempotent",
            "more",
            "ends",
            "correlate",
        ] {
            let i = g.property_index(unit, name).unwrap();
            assert!(
                matches!(info.property_forms[i], PropertyForm::Ints(_)),
                "%{name}: {:?}",
                info.property_forms[i]
            );
        }
        let i = g.property_index(unit, "quiet").unwrap();
        let PropertyForm::Ints(IntForm::AllOf { tests, tree }) = &info.property_forms[i] else {
            panic!("%quiet: {:?}", info.property_forms[i]);
        };
        let magic = g.field_slot(unit, "magic").unwrap();
        let opcode = g.field_slot(unit, "opcode").unwrap();
        let fields: Vec<u16> = tests.iter().map(|(slot, _)| *slot).collect();
        assert_eq!(fields, [magic, opcode]);
        let IntForm::Binary(BinOp::And, a, b) = &**tree else {
            panic!("%quiet's tree: {tree:?}");
        };
        assert!(matches!(**a, IntForm::Test { .. }), "{a:?}");
        assert!(matches!(**b, IntForm::Test { .. }), "{b:?}");
        // `%more`: magic, opcode and `key_len > 0`, three fields in order.
        let i = g.property_index(unit, "more").unwrap();
        let PropertyForm::Ints(IntForm::AllOf { tests, .. }) = &info.property_forms[i] else {
            panic!("%more: {:?}", info.property_forms[i]);
        };
        assert_eq!(tests.len(), 3);
    }

    /// Every property of every stock grammar that has a form reads as its
    /// expression walked reads, over slots of every kind: strings it
    /// names and others, numbers, counts, nothing.
    #[test]
    fn every_form_reads_as_its_expression() {
        let mut shapes = 0;
        for &name in crate::stock::NAMES {
            let g = Grammar::stock(name).unwrap();
            for (u, info) in g.units.iter().enumerate() {
                for (i, (prop, e)) in info.properties.iter().enumerate() {
                    assert_eq!(g.property_index(u, prop), Some(i), "{name}: {prop}");
                    let longer = format!("{prop}_");
                    assert!(g.property_index(u, &longer).is_none(), "{name}: {longer}");
                    let form = &info.property_forms[i];
                    let slot = match form {
                        PropertyForm::Compare(s, ..) | PropertyForm::Number(s) => *s,
                        PropertyForm::OneOf { slot, .. } => *slot,
                        PropertyForm::Ints(_) | PropertyForm::Expr => continue,
                    };
                    shapes += 1;
                    let mut data = Vec::new();
                    let mut values = vec![
                        Slot::Unset,
                        Slot::Int(0),
                        Slot::Int(1),
                        Slot::SInt(-1),
                        Slot::Count(2),
                    ];
                    let named: Vec<Arc<[u8]>> = match form {
                        PropertyForm::OneOf { strings, .. } => strings.clone(),
                        _ => Vec::new(),
                    };
                    for t in named.iter().map(|t| &t[..]).chain([&b"other"[..], b""]) {
                        values.push(Slot::Bytes {
                            start: data.len() as u32,
                            len: t.len() as u32,
                        });
                        data.extend_from_slice(t);
                    }
                    for v in values {
                        let mut slots = vec![Slot::Unset; info.slots as usize];
                        slots[slot as usize] = v;
                        assert_eq!(
                            g.property(u, prop, &slots, &data),
                            walked(&g, &slots, &data, e),
                            "{name}: {}.{prop} with {v:?}",
                            info.name
                        );
                    }
                }
            }
        }
        assert!(
            shapes >= 10,
            "the stock grammars' properties read by form: {shapes}"
        );
    }
}
