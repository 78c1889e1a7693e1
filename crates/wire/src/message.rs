//! Read access to a parsed message: values by field name, borrowing from
//! the bytes it was parsed from.

use crate::eval::{slot_val, Val};
use crate::program::{FieldKind, Slot, UnitId};
use crate::Grammar;

/// A parsed unit instance.
#[derive(Clone, Copy)]
pub struct Message<'a> {
    grammar: &'a Grammar,
    unit: UnitId,
    slots: &'a [Slot],
    base: usize,
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
            slots,
            base,
            data,
        }
    }

    pub fn unit_name(&self) -> &'a str {
        &self.grammar.unit(self.unit).name
    }

    pub fn get(&self, name: &str) -> Value<'a> {
        let Some(f) = self
            .grammar
            .unit(self.unit)
            .fields
            .iter()
            .find(|f| f.name == name)
        else {
            return Value::Absent;
        };
        let at = self.base + f.slot as usize;
        match &f.kind {
            FieldKind::Int | FieldKind::Bytes => value(slot_val(self.slots, self.data, at)),
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

    pub fn int(&self, name: &str) -> Option<i128> {
        match self.get(name) {
            Value::Int(v) => Some(v),
            _ => None,
        }
    }

    pub fn bytes(&self, name: &str) -> Option<&'a [u8]> {
        match self.get(name) {
            Value::Bytes(b) => Some(b),
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
