//! Records that compute code builds (`kv(key, v)` in a `foldt`), turned
//! into messages with their grammar unit's serialiser.

use crate::compute::GraphHost;
use crate::msg::{Msg, MsgPool, Part, Values};
use flick_exec::{Fault, Host, Value};
use flick_wire::{Builder, Parser, Progress, Slot};

/// Builds messages of one record's unit, reusing its storage.
pub struct RecordBuilder {
    builder: Builder,
    /// Reads the built bytes back, so the message's slots point into them.
    parser: Parser,
    /// Messages built from constants (see [`KEPT_PER_RECORD`]).
    kept: Vec<Kept>,
}

/// A message built from constants, kept with the fields it was built
/// from: its bytes and the slots its values use, not a pooled message
/// (whose slots have room for the largest message of the grammar: for
/// HTTP, 16 KiB, held by every instance while it lives).
struct Kept {
    fields: Vec<Value>,
    bytes: Vec<u8>,
    slots: Vec<Slot>,
    values: Values,
    part: Part,
    continued: bool,
}

impl Kept {
    fn of(fields: &[Value], m: &Msg) -> Kept {
        let used = match m.values {
            Values::None => 0,
            Values::Parsed { high, .. } => (high as usize).min(m.slots.len()),
            Values::Any => m.slots.len(),
        };
        Kept {
            fields: fields.to_vec(),
            bytes: m.bytes.clone(),
            slots: m.slots[..used].to_vec(),
            values: m.values,
            part: m.part,
            continued: m.continued,
        }
    }

    /// A pooled message equal to the one kept.
    fn copy(&self, pool: &MsgPool) -> Msg {
        let mut m = pool.take();
        m.bytes.extend_from_slice(&self.bytes);
        pool.copy_values(&mut m, self.values, &self.slots);
        m.part = self.part;
        m.continued = self.continued;
        m
    }
}

/// Messages a builder keeps of those built from constants alone (a static
/// page, a fixed reply): the same fields give the same message, so it is
/// copied rather than serialised and parsed back again, most of what a
/// static server's response cost.
const KEPT_PER_RECORD: usize = 4;

/// Whether `v` is the same whatever the message being handled: a field
/// of such values builds the same record every time.
fn constant(v: &Value) -> bool {
    matches!(
        v,
        Value::Int(_) | Value::Bool(_) | Value::None | Value::Unit | Value::ConstBytes { .. }
    )
}

impl GraphHost {
    /// A pooled message of record `record` with the given field values;
    /// lengths and other dependent fields are computed by the grammar.
    pub(crate) fn build(&mut self, record: u16, fields: &[Value]) -> Result<Msg, Fault> {
        let records = self.records.clone();
        let (name, names) = records
            .get(record as usize)
            .ok_or(Fault::Kind("a known record"))?;
        if self.builders.len() <= record as usize {
            self.builders.resize_with(record as usize + 1, || None);
        }
        let mut rb = match self.builders[record as usize].take() {
            Some(rb) => rb,
            None => {
                let unit = self.grammar.unit_id(name).ok_or_else(|| {
                    Fault::Host(format!("record `{name}` is not a unit of the grammar"))
                })?;
                Box::new(RecordBuilder {
                    builder: Builder::new(self.grammar.clone(), unit),
                    parser: self.grammar.parser(unit),
                    kept: Vec::new(),
                })
            }
        };
        let constants = fields.iter().all(constant);
        let kept = constants
            .then(|| rb.kept.iter().find(|k| k.fields[..] == *fields))
            .flatten();
        let built = match kept {
            Some(k) => Ok(k.copy(&self.pool)),
            None => {
                let built = self.fill(&mut rb, names, fields);
                if let (true, Ok(m)) = (constants, &built) {
                    if rb.kept.len() < KEPT_PER_RECORD {
                        rb.kept.push(Kept::of(fields, m));
                    }
                }
                built
            }
        };
        self.builders[record as usize] = Some(rb);
        built
    }

    fn fill(
        &mut self,
        rb: &mut RecordBuilder,
        names: &[String],
        fields: &[Value],
    ) -> Result<Msg, Fault> {
        rb.builder.clear();
        for (name, v) in names.iter().zip(fields) {
            let set = match v {
                Value::Int(i) => rb.builder.set_int(name, *i as i128),
                Value::Bool(b) => rb.builder.set_int(name, *b as i128),
                Value::None | Value::Unit => true,
                other => {
                    let bytes = self.bytes(other).ok_or(Fault::Kind("a field value"))?;
                    rb.builder.set_bytes(name, bytes)
                }
            };
            if !set {
                return Err(Fault::Host(format!("the grammar has no field `{name}`")));
            }
        }
        let mut m = self.pool.take();
        if let Err(e) = rb.builder.serialize(&mut m.bytes) {
            self.pool.give(m);
            return Err(Fault::Host(e.to_string()));
        }
        rb.parser.reset();
        match rb.parser.parse(&m.bytes) {
            Ok(Progress::Done(n)) if n == m.bytes.len() => {
                let values = crate::msg::Values::parsed(&rb.parser);
                self.pool.copy_values(&mut m, values, rb.parser.slots());
                Ok(m)
            }
            _ => {
                self.pool.give(m);
                Err(Fault::Host("a built record does not parse back".into()))
            }
        }
    }
}
