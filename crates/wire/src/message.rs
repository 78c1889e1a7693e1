//! Read access to a parsed message: values by field name, borrowing from
//! the bytes it was parsed from.

use crate::eval::{slot_val, Val};
use crate::header::{Header, HeaderRef};
use crate::in_place::decode;
use crate::program::{FieldInfo, FieldKind, Fixed, FixedKind, Slot, UnitId};
use crate::Grammar;

/// A short summary of a field name (its length, first and last bytes):
/// names with different tags differ.
#[inline]
fn name_tag(name: &str) -> u32 {
    let b = name.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => (b.len() as u32) << 16 | (*f as u32) << 8 | *l as u32,
        _ => 0,
    }
}

/// A unit's fields by name: an open-addressing table keyed by
/// [`name_tag`], so that a lookup compares about one name rather than
/// scanning the unit's fields.
#[derive(Debug)]
pub(crate) struct FieldIndex {
    /// Field indices, [`FieldIndex::EMPTY`] where none; a power of two long.
    table: Box<[u32]>,
    tags: Box<[u32]>,
}

impl FieldIndex {
    const EMPTY: u32 = u32::MAX;

    pub fn new(fields: &[FieldInfo]) -> FieldIndex {
        let size = (fields.len() * 2).next_power_of_two().max(4);
        let mut table = vec![Self::EMPTY; size];
        let tags: Box<[u32]> = fields.iter().map(|f| name_tag(&f.name)).collect();
        for (i, f) in fields.iter().enumerate() {
            // A name declared again (in another switch case) keeps its
            // first declaration, as a scan in order would find.
            if fields[..i].iter().any(|g| g.name == f.name) {
                continue;
            }
            let mut h = Self::hash(tags[i], size);
            while table[h] != Self::EMPTY {
                h = (h + 1) & (size - 1);
            }
            table[h] = i as u32;
        }
        FieldIndex {
            table: table.into(),
            tags,
        }
    }

    #[inline]
    fn hash(tag: u32, size: usize) -> usize {
        (tag.wrapping_mul(0x9e37_79b1) >> 16) as usize & (size - 1)
    }

    /// The field called `name` among `fields` (those it was built from).
    #[inline]
    pub fn find<'f>(&self, fields: &'f [FieldInfo], name: &str) -> Option<&'f FieldInfo> {
        let tag = name_tag(name);
        let size = self.table.len();
        let mut h = Self::hash(tag, size);
        loop {
            let i = *self.table.get(h)?;
            if i == Self::EMPTY {
                return None;
            }
            if self.tags.get(i as usize) == Some(&tag) {
                let f = fields.get(i as usize)?;
                if f.name == name {
                    return Some(f);
                }
            }
            h = (h + 1) & (size - 1);
        }
    }
}

/// A field resolved once ([`Grammar::field_ref`]) for reading it from
/// every message: its slot and, for a field read in place, where it lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldRef {
    slot: u16,
    /// A big-endian integer read in place, as eight bytes loaded at
    /// `offset` from where the slot `start` says its unit begins, shifted
    /// right by `drop` and masked; `start` is `u16::MAX` for other fields.
    /// Both are derived from the parts below (`compiled`), kept for the
    /// one test `uint_of` makes.
    pub(crate) start: u16,
    pub(crate) offset: u16,
    /// The integer's own bytes, all a read needs where fewer than eight
    /// are left; 0 for bytes.
    pub(crate) width: u8,
    pub(crate) drop: u8,
    pub(crate) mask: u64,
    /// Whether a parser may leave the field in place: only then is an
    /// unset slot worth decoding.
    in_place: bool,
    /// For any field read in place, the start slot of the header it lies
    /// in ([`Header`](crate::Header)), `u16::MAX` for other fields; with
    /// the integer's byte order and shift, or the bytes' length.
    pub(crate) header: u16,
    pub(crate) little: bool,
    pub(crate) shift: u8,
    pub(crate) len: u16,
}

impl FieldRef {
    pub(crate) fn new(slot: u16, fixed: Option<Fixed>) -> FieldRef {
        let (header, offset, int, len) = match fixed {
            None => (u16::MAX, 0, (0, false, 0, 0), 0),
            Some(Fixed {
                start,
                offset,
                kind:
                    FixedKind::Int {
                        width,
                        little,
                        shift,
                        mask,
                    },
            }) if shift < 64 => (start, offset, (width, little, shift, mask), 0),
            Some(Fixed {
                kind: FixedKind::Int { .. },
                ..
            }) => (u16::MAX, 0, (0, false, 0, 0), 0),
            Some(Fixed {
                start,
                offset,
                kind: FixedKind::Bytes { len },
            }) => (start, offset, (0, false, 0, 0), len),
        };
        FieldRef::compiled(slot, fixed.is_some(), (header, offset), int, len)
    }

    /// A reference from its parts, as [`Grammar::field_ref`] resolves
    /// them and generated code names them
    /// ([`codegen::field_consts`](crate::codegen::field_consts)): the
    /// field's slot, whether a parser may leave it in place, the start
    /// slot of its header and its offset there, an integer's width, byte
    /// order, shift and mask (width 0 for bytes), and the bytes' length.
    /// Parts no reference has fail to compile.
    #[doc(hidden)]
    pub const fn compiled(
        slot: u16,
        in_place: bool,
        (header, offset): (u16, u16),
        (width, little, shift, mask): (u8, bool, u8, u64),
        len: u16,
    ) -> FieldRef {
        // What the reads count on: shifts and loads that cannot panic.
        assert!(width <= 8 && shift < 64, "not a field reference");
        // `uint_of` reads a big-endian integer with one eight-byte load.
        let drop = 64 + shift as u32 - 8 * width as u32;
        let one_load = width > 0 && !little && drop < 64 && header != u16::MAX;
        FieldRef {
            slot,
            start: if one_load { header } else { u16::MAX },
            offset,
            width,
            drop: if one_load { drop as u8 } else { 0 },
            mask,
            in_place,
            header,
            little,
            shift,
            len,
        }
    }

    /// The Rust expression that builds this reference.
    pub(crate) fn source(&self) -> String {
        format!(
            "FieldRef::compiled({}, {}, ({}, {}), ({}, {}, {}, {:#x}), {})",
            self.slot,
            self.in_place,
            self.header,
            self.offset,
            self.width,
            self.little,
            self.shift,
            self.mask,
            self.len
        )
    }

    /// The field's slot in its unit's layout.
    pub fn slot(&self) -> u16 {
        self.slot
    }
}

/// A parsed unit instance.
#[derive(Clone, Copy)]
pub struct Message<'a> {
    grammar: &'a Grammar,
    unit: UnitId,
    /// The unit's slots, from its first.
    slots: &'a [Slot],
    data: &'a [u8],
}

/// A field's value.
#[derive(Clone, Copy)]
pub enum Value<'a> {
    Int(i128),
    Bytes(&'a [u8]),
    List(List<'a>),
    Unit(Message<'a>),
    /// Not present: a field of a switch case not taken, or skipped by a view.
    Absent,
}

impl std::fmt::Debug for Value<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Bytes(b) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Value::List(l) => f
                .debug_list()
                .entries((0..l.len()).map(|i| l.get(i)))
                .finish(),
            Value::Unit(m) => write!(f, "{m:?}"),
            Value::Absent => f.write_str("-"),
        }
    }
}

/// The elements of a list field.
#[derive(Clone, Copy)]
pub struct List<'a> {
    grammar: &'a Grammar,
    elem_unit: Option<UnitId>,
    elem_slots: usize,
    slots: &'a [Slot],
    /// The count slot; elements follow it.
    base: usize,
    data: &'a [u8],
}

impl<'a> List<'a> {
    pub fn len(&self) -> usize {
        match self.slots.get(self.base) {
            Some(Slot::Count(n)) => *n as usize,
            _ => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Value<'a> {
        if i >= self.len() {
            return Value::Absent;
        }
        let at = self.base + 1 + i * self.elem_slots;
        match self.elem_unit {
            Some(u) => Value::Unit(Message::new(self.grammar, u, self.slots, at, self.data)),
            None => value(slot_val(self.slots, self.data, at)),
        }
    }
}

fn value(v: Val<'_>) -> Value<'_> {
    match v {
        Val::Int(i) => Value::Int(i),
        Val::Bytes(b) => Value::Bytes(b),
        _ => Value::Absent,
    }
}

impl<'a> Message<'a> {
    #[inline]
    pub(crate) fn new(
        grammar: &'a Grammar,
        unit: UnitId,
        slots: &'a [Slot],
        base: usize,
        data: &'a [u8],
    ) -> Message<'a> {
        Message {
            grammar,
            unit,
            slots: slots.get(base..).unwrap_or(&[]),
            data,
        }
    }

    pub fn unit_name(&self) -> &'a str {
        &self.grammar.unit(self.unit).name
    }

    pub fn get(&self, name: &str) -> Value<'a> {
        let fields = &self.grammar.unit(self.unit).fields;
        let Some(f) = self.grammar.field_index[self.unit].find(fields, name) else {
            return Value::Absent;
        };
        let at = f.slot as usize;
        match &f.kind {
            FieldKind::Int | FieldKind::Bytes => match self.slot(f.slot) {
                Some(s) => value(slot_val(&[s], self.data, 0)),
                None => Value::Absent,
            },
            FieldKind::List {
                elem_unit,
                elem_slots,
            } => match self.slots.get(at) {
                Some(Slot::Count(_)) => Value::List(List {
                    grammar: self.grammar,
                    elem_unit: *elem_unit,
                    elem_slots: *elem_slots as usize,
                    slots: self.slots,
                    base: at,
                    data: self.data,
                }),
                _ => Value::Absent,
            },
            FieldKind::Unit(u) => {
                Value::Unit(Message::new(self.grammar, *u, self.slots, at, self.data))
            }
        }
    }

    /// The slot of a scalar field (or variable) called `name`.
    #[inline]
    fn scalar(&self, name: &str) -> Option<Slot> {
        let fields = &self.grammar.unit(self.unit).fields;
        let f = self.grammar.field_index[self.unit].find(fields, name)?;
        match f.kind {
            FieldKind::Int | FieldKind::Bytes => self.slot(f.slot),
            _ => None,
        }
    }

    /// Slot `slot` of the message, a field read in place decoded from
    /// the bytes if a parser left it there ([`Parser::in_place`]).
    ///
    /// [`Parser::in_place`]: crate::Parser::in_place
    #[inline(always)]
    fn slot(&self, slot: u16) -> Option<Slot> {
        match self.slots.get(slot as usize)? {
            Slot::Unset => Some(self.decoded(slot)),
            s => Some(*s),
        }
    }

    /// The field read in place at `slot`, decoded, if there is one and its
    /// unit was parsed; `Slot::Unset` otherwise.
    #[cold]
    fn decoded(&self, slot: u16) -> Slot {
        let fixed = self.grammar.fixed_at[self.unit].get(slot as usize);
        match fixed.copied().flatten() {
            Some(x) => self.decode_fixed(x).unwrap_or(Slot::Unset),
            None => Slot::Unset,
        }
    }

    /// A field read in place, from where its unit began.
    #[inline(always)]
    fn decode_fixed(&self, x: Fixed) -> Option<Slot> {
        let Slot::Int(p) = *self.slots.get(x.start as usize)? else {
            return None;
        };
        decode(x.kind, p as usize + x.offset as usize, self.data)
    }

    /// The unsigned integer `field` holds: a `uint8`..`uint64` field, or a
    /// variable whose value is not negative. A program resolves its fields
    /// once ([`Grammar::field_ref`]) and reads them with this, a field
    /// read in place straight from the message's bytes.
    ///
    /// [`Grammar::field_ref`]: crate::Grammar::field_ref
    ///
    /// A big-endian integer read in place is read from the bytes whether
    /// or not the parser also stored it: the message's bytes hold the
    /// same value. Other fields are read from their slot, or decoded in
    /// place if it is unset.
    #[inline(always)]
    pub fn uint_of(&self, field: &FieldRef) -> Option<u64> {
        // No path below calls out, so that reads of several fields of one
        // header share the loads and tests of its start.
        if field.start == u16::MAX {
            // Stored, or in place but not a big-endian integer.
            return match *self.slots.get(field.slot as usize)? {
                Slot::Int(v) => Some(v),
                Slot::Unset if field.in_place => self.uint_decoded(field),
                _ => None,
            };
        }
        let Slot::Int(p) = *self.slots.get(field.start as usize)? else {
            return None;
        };
        // Eight bytes in one load where the message has them. Offsets are
        // 32-bit, so the end of the load cannot overflow: one test.
        let at = (p as u32).wrapping_add(field.offset as u32) as usize;
        let word = match self.data.get(at..at + 8) {
            Some(b) => u64::from_be_bytes(b.try_into().unwrap_or_default()),
            // Near the end: the integer's own bytes, padded.
            None => {
                let b = self.data.get(at..at + field.width as usize)?;
                let mut w = [0u8; 8];
                w[..b.len()].copy_from_slice(b);
                u64::from_be_bytes(w)
            }
        };
        Some((word >> field.drop) & field.mask)
    }

    /// The header `h` names, its bytes checked once to be in the message:
    /// reads of its fields ([`Header::uint`]) then test nothing more.
    /// `None` if the message lacks that header (a frame of another
    /// protocol).
    #[inline(always)]
    pub fn header<const N: usize>(&self, h: &HeaderRef<N>) -> Option<Header<'a, N>> {
        let Slot::Int(p) = *self.slots.get(h.start as usize)? else {
            return None;
        };
        // Offsets are 32-bit, so the end cannot overflow.
        let at = p as u32 as usize;
        let bytes = self.data.get(at..at + N)?.try_into().ok()?;
        Some(Header::new(bytes, h.start))
    }

    #[cold]
    fn uint_decoded(&self, f: &FieldRef) -> Option<u64> {
        match self.decoded(f.slot) {
            Slot::Int(v) => Some(v),
            _ => None,
        }
    }

    /// The bytes `field` holds, as [`Message::uint_of`].
    #[inline(always)]
    pub fn bytes_of(&self, field: &FieldRef) -> Option<&'a [u8]> {
        match self.slot(field.slot)? {
            Slot::Bytes { start, len } => {
                let s = start as usize;
                Some(self.data.get(s..s + len as usize).unwrap_or(&[]))
            }
            _ => None,
        }
    }

    // `int` and `bytes` are `get` narrowed, without building a `Value`:
    // programs read scalars by name on every message.
    pub fn int(&self, name: &str) -> Option<i128> {
        match self.scalar(name)? {
            Slot::Int(v) => Some(v as i128),
            Slot::SInt(v) => Some(v as i128),
            Slot::Count(n) => Some(n as i128),
            _ => None,
        }
    }

    pub fn bytes(&self, name: &str) -> Option<&'a [u8]> {
        match self.scalar(name)? {
            Slot::Bytes { start, len } => {
                let s = start as usize;
                Some(self.data.get(s..s + len as usize).unwrap_or(&[]))
            }
            _ => None,
        }
    }

    /// The integer in slot `slot` of the message (a field's
    /// [`FieldInfo::slot`](crate::FieldInfo)): a program's read of a
    /// field it resolved when it loaded.
    #[inline(always)]
    pub fn int_at(&self, slot: u16) -> Option<i128> {
        match self.slots.get(slot as usize)? {
            Slot::Int(v) => Some(*v as i128),
            Slot::SInt(v) => Some(*v as i128),
            Slot::Count(n) => Some(*n as i128),
            _ => None,
        }
    }

    /// The integer in slot `slot` if it is an unsigned one: a `uint8`..
    /// `uint64` field, or a variable whose value is not negative. One test
    /// where [`Message::int_at`] makes three, for a program that knows the
    /// field's type.
    #[inline(always)]
    pub fn uint_at(&self, slot: u16) -> Option<u64> {
        match self.slots.get(slot as usize)? {
            Slot::Int(v) => Some(*v),
            _ => None,
        }
    }

    /// The bytes in slot `slot` of the message, as [`Message::int_at`].
    #[inline(always)]
    pub fn bytes_at(&self, slot: u16) -> Option<&'a [u8]> {
        match self.slots.get(slot as usize)? {
            Slot::Bytes { start, len } => {
                let s = *start as usize;
                Some(self.data.get(s..s + *len as usize).unwrap_or(&[]))
            }
            _ => None,
        }
    }

    pub fn list(&self, name: &str) -> Option<List<'a>> {
        match self.get(name) {
            Value::List(l) => Some(l),
            _ => None,
        }
    }
}

impl std::fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct(self.unit_name());
        for field in &self.grammar.unit(self.unit).fields {
            d.field(&field.name, &self.get(&field.name));
        }
        d.finish()
    }
}
