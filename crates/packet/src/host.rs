//! The [`Host`] compute code sees while it handles one frame: the frame's
//! fields, sends that name the ports the frame goes out of, and the
//! worker's state shard. Made per frame from borrows, so it costs nothing.

use crate::rewrite::Edit;
use crate::state::{encode_bytes_key, encode_key, own, Shard};
use flick_exec::{
    BloomOp, Fault, FuncId, HeaderEdit, Host, IntField, Module, ObjectKey, Sent, Value,
};
use flick_platform::log::RateLimit;
use flick_span::SourceFile;
use flick_wire::{FieldRef, Message};

/// `log(msg)` lines of every packet program, rate-limited together like
/// the service's own lines.
static PROGRAM_LOG: RateLimit = RateLimit::new();

/// The most sends one frame's rule may make (a frame to a few ports).
pub const MAX_SENDS: usize = 16;

/// Where a frame goes: transmit port indices, in the order sent.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sends {
    ports: [u16; MAX_SENDS],
    len: u8,
}

impl Sends {
    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn as_slice(&self) -> &[u16] {
        &self.ports[..self.len as usize]
    }

    fn push(&mut self, port: u16) -> Result<(), Fault> {
        let at = self.len as usize;
        if at == MAX_SENDS {
            return Err(Fault::Host(format!(
                "a frame may be sent at most {MAX_SENDS} times"
            )));
        }
        self.ports[at] = port;
        self.len += 1;
        Ok(())
    }
}

/// How to read field `field` of record `record`: the grammar field it
/// views and whether it holds an integer. Indexed `[record][field]`.
pub type FieldTable = Vec<Vec<Option<(FieldRef, bool)>>>;

/// The most header edits one frame's rule may make.
pub const MAX_EDITS: usize = 8;

/// The edits a rule made to its frame, applied once it is done.
#[derive(Clone, Copy, Debug, Default)]
pub struct Edits {
    edits: [Option<Edit>; MAX_EDITS],
    len: u8,
}

impl Edits {
    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn iter(&self) -> impl Iterator<Item = Edit> + '_ {
        self.edits[..self.len as usize].iter().flatten().copied()
    }

    fn push(&mut self, e: Edit) -> Result<(), Fault> {
        let at = self.len as usize;
        if at == MAX_EDITS {
            return Err(Fault::Host(format!(
                "a frame's headers may be edited at most {MAX_EDITS} times"
            )));
        }
        self.edits[at] = Some(e);
        self.len += 1;
        Ok(())
    }
}

/// What a frame's host reads and writes, borrowed for one run.
pub struct FrameHost<'a> {
    pub frame: &'a [u8],
    pub message: Message<'a>,
    pub fields: &'a FieldTable,
    /// Per process channel, per element: the transmit port it is bound to.
    pub tx_of: &'a [Vec<Option<u16>>],
    /// The program, and its source if known: where a `log` call is.
    pub module: &'a Module,
    pub source: Option<&'a SourceFile>,
    /// None while steering: `steer` reads the frame and nothing else.
    pub shard: Option<&'a mut Shard>,
    pub key: &'a mut Vec<u8>,
    pub sends: &'a mut Sends,
    /// None while steering: `steer` picks a worker and edits nothing.
    pub edits: Option<&'a mut Edits>,
}

/// The value a frame's record is in compute code.
pub const FRAME: Value = Value::Msg(0);

/// Whether `v` is [`FRAME`] (a match, not a call of `Value`'s `==`).
#[inline(always)]
fn is_frame(v: &Value) -> bool {
    matches!(v, Value::Msg(0))
}

fn frame_bytes<'a>(frame: &'a [u8], v: &'a Value) -> Option<&'a [u8]> {
    match v {
        Value::MsgBytes { msg: 0, start, len } => {
            frame.get(*start as usize..(*start as usize).checked_add(*len as usize)?)
        }
        Value::Bytes(b) => Some(b),
        _ => None,
    }
}

impl FrameHost<'_> {
    fn shard(&mut self) -> Result<&mut Shard, Fault> {
        self.shard
            .as_deref_mut()
            .ok_or_else(|| Fault::Host("`steer` cannot use process state".into()))
    }

    /// The shard, and `key` (made in the interpreter's scratch) encoded
    /// as its dictionaries hold keys.
    fn shard_and_bytes_key(&mut self, key: &[u8]) -> Result<(&mut Shard, &[u8]), Fault> {
        let shard = self
            .shard
            .as_deref_mut()
            .ok_or_else(|| Fault::Host("`steer` cannot use process state".into()))?;
        encode_bytes_key(key, self.key);
        Ok((shard, &self.key[..]))
    }

    fn encode(&mut self, key: &Value) -> Result<(), Fault> {
        self.key.clear();
        let frame = self.frame;
        if encode_key(key, &|v| frame_bytes(frame, v), self.key) {
            Ok(())
        } else {
            Err(Fault::Kind("a dictionary key"))
        }
    }

    /// Encodes a meter's or Bloom filter's key into `self.key`, as a
    /// dictionary's keys are.
    fn encode_object_key(&mut self, key: ObjectKey<'_>) -> Result<(), Fault> {
        match key {
            ObjectKey::Bytes(b) => {
                encode_bytes_key(b, self.key);
                Ok(())
            }
            ObjectKey::Value(v) => self.encode(v),
        }
    }

    /// Where `record.field` of the frame lies, and whether it reads as an
    /// integer: the lookup `field` and `field_int` share.
    #[inline]
    fn field_ref(&self, msg: &Value, record: u16, field: u16) -> Result<(FieldRef, bool), Fault> {
        if !is_frame(msg) {
            return Err(Fault::Kind("a packet"));
        }
        self.ref_of(record, field)
    }

    /// Where field `field` of record type `record` lies in the frame's
    /// parse, and whether it is an integer.
    #[inline(always)]
    fn ref_of(&self, record: u16, field: u16) -> Result<(FieldRef, bool), Fault> {
        self.fields
            .get(record as usize)
            .and_then(|r| r.get(field as usize))
            .and_then(|f| *f)
            .ok_or_else(|| Fault::Host("a field that the wire grammar does not have".into()))
    }

    /// The field at `r` as [`Host::field_int`] gives it.
    #[inline(always)]
    fn int_of(&self, r: FieldRef, int: bool) -> IntField {
        let m = &self.message;
        if int {
            match m.uint_of(&r) {
                Some(v) => IntField::Int(v as i64),
                None => m
                    .int_at(r.slot())
                    .map_or(IntField::None, |v| IntField::Int(v as i64)),
            }
        } else {
            match m.bytes_of(&r) {
                Some(_) => IntField::Other,
                None => IntField::None,
            }
        }
    }

    fn owned(&self, v: &Value) -> Result<Value, Fault> {
        if matches!(v, Value::Msg(_)) {
            return Err(Fault::Host(
                "a packet cannot be kept in state; keep its fields".into(),
            ));
        }
        let frame = self.frame;
        Ok(own(v, &|v| frame_bytes(frame, v)))
    }
}

impl Host for FrameHost<'_> {
    fn bytes<'b>(&'b self, v: &'b Value) -> Option<&'b [u8]> {
        frame_bytes(self.frame, v)
    }

    fn field(&mut self, msg: &Value, record: u16, field: u16) -> Result<Value, Fault> {
        let (r, int) = self.field_ref(msg, record, field)?;
        let m = &self.message;
        Ok(if int {
            match self.int_of(r, true) {
                IntField::Int(v) => Value::Int(v),
                _ => Value::None,
            }
        } else {
            match m.bytes_of(&r) {
                Some(b) => Value::MsgBytes {
                    msg: 0,
                    // A field's bytes lie inside the frame they were read from.
                    start: (b.as_ptr() as usize - self.frame.as_ptr() as usize) as u32,
                    len: b.len() as u32,
                },
                None => Value::None,
            }
        })
    }

    fn field_int(&mut self, msg: &Value, record: u16, field: u16) -> Result<IntField, Fault> {
        let (r, int) = self.field_ref(msg, record, field)?;
        Ok(self.int_of(r, int))
    }

    fn field_ints(
        &mut self,
        msg: &Value,
        fields: &[(u16, u16)],
        out: &mut [IntField],
    ) -> Result<(), (usize, Fault)> {
        if !is_frame(msg) {
            return Err((0, Fault::Kind("a packet")));
        }
        for (i, (&(record, field), o)) in fields.iter().zip(out).enumerate() {
            let (r, int) = self.ref_of(record, field).map_err(|f| (i, f))?;
            *o = self.int_of(r, int);
        }
        Ok(())
    }

    fn send(&mut self, chan: &Value, value: &Value) -> Result<Sent, Fault> {
        let Value::Chan { chan, elem } = chan else {
            return Err(Fault::Kind("a channel"));
        };
        if !is_frame(value) {
            return Err(Fault::Host(
                "only the packet being handled can be sent to a port".into(),
            ));
        }
        let port = self
            .tx_of
            .get(*chan as usize)
            .and_then(|elems| elems.get(elem.unwrap_or(0) as usize))
            .copied()
            .flatten()
            .ok_or_else(|| Fault::Host("a channel bound to no transmitting port".into()))?;
        self.sends.push(port)?;
        Ok(Sent::Done)
    }

    fn channels(&self, chan: u16) -> i64 {
        self.tx_of.get(chan as usize).map_or(0, |e| e.len() as i64)
    }

    fn all_ready(&mut self, _chan: u16) -> bool {
        true
    }

    fn load_state(&mut self, state: u16) -> Value {
        match self.shard.as_deref() {
            Some(s) => s.load(state),
            None => Value::None,
        }
    }

    fn dict_of(&mut self, state: u16) -> Option<u16> {
        self.shard.as_deref().and_then(|s| s.dict_of(state))
    }

    fn store_state(&mut self, state: u16, v: Value) -> Result<(), Fault> {
        let v = self.owned(&v)?;
        self.shard()?.store(state, v)
    }

    fn dict_get(&mut self, state: u16, key: &Value) -> Result<Value, Fault> {
        self.shard()?;
        self.encode(key)?;
        let (shard, key) = (self.shard.as_deref_mut(), &self.key[..]);
        shard.map_or(Ok(Value::None), |s| s.dict_get(state, key))
    }

    fn dict_set(&mut self, state: u16, key: &Value, value: &Value) -> Result<(), Fault> {
        self.shard()?;
        self.encode(key)?;
        let value = self.owned(value)?;
        let (shard, key) = (self.shard.as_deref_mut(), &self.key[..]);
        shard.map_or(Ok(()), |s| s.dict_set(state, key, value))
    }

    fn dict_get_bytes(&mut self, state: u16, key: &[u8]) -> Result<Value, Fault> {
        let (shard, key) = self.shard_and_bytes_key(key)?;
        shard.dict_get(state, key)
    }

    fn dict_get_bytes_into(
        &mut self,
        state: u16,
        key: &[u8],
        out: &mut Value,
    ) -> Result<(), Fault> {
        let (shard, key) = self.shard_and_bytes_key(key)?;
        shard.dict_get_into(state, key, out)
    }

    fn dict_get_bytes_int(
        &mut self,
        state: u16,
        key: &[u8],
        out: &mut Value,
    ) -> Result<IntField, Fault> {
        let (shard, key) = self.shard_and_bytes_key(key)?;
        shard.dict_get_int(state, key, out)
    }

    fn dict_set_bytes_int(&mut self, state: u16, key: &[u8], value: i64) -> Result<(), Fault> {
        let (shard, key) = self.shard_and_bytes_key(key)?;
        shard.dict_set(state, key, Value::Int(value))
    }

    fn dict_add_bytes_int(&mut self, state: u16, key: &[u8], x: i64) -> Result<bool, Fault> {
        let (shard, key) = self.shard_and_bytes_key(key)?;
        shard.dict_add_int(state, key, x)
    }

    fn dict_set_bytes(&mut self, state: u16, key: &[u8], value: &Value) -> Result<(), Fault> {
        self.shard()?;
        let value = self.owned(value)?;
        let (shard, key) = self.shard_and_bytes_key(key)?;
        shard.dict_set(state, key, value)
    }

    fn meter(&mut self, state: u16, key: Option<ObjectKey<'_>>, n: i64) -> Result<i64, Fault> {
        self.shard()?;
        if let Some(k) = key {
            self.encode_object_key(k)?;
        }
        let (shard, encoded) = (self.shard.as_deref_mut(), &self.key[..]);
        let key = key.map(|_| encoded);
        shard.map_or(Err(Fault::Kind("a meter")), |s| s.meter(state, key, n))
    }

    fn bloom(
        &mut self,
        state: u16,
        op: BloomOp,
        key: Option<ObjectKey<'_>>,
    ) -> Result<bool, Fault> {
        self.shard()?;
        match key {
            Some(k) => self.encode_object_key(k)?,
            None => self.key.clear(),
        }
        let (shard, key) = (self.shard.as_deref_mut(), &self.key[..]);
        shard.map_or(Err(Fault::Kind("a Bloom filter")), |s| {
            s.bloom(state, op, key)
        })
    }

    fn edit_header(&mut self, msg: &Value, edit: HeaderEdit, value: i64) -> Result<(), Fault> {
        if !is_frame(msg) {
            return Err(Fault::Kind("a packet"));
        }
        let out_of_range =
            |max: i64| Fault::Host(format!("{value} does not fit the field (0 to {max})"));
        let e = match edit {
            HeaderEdit::Ttl => Edit::Ttl(u8::try_from(value).map_err(|_| out_of_range(255))?),
            HeaderEdit::Dscp => Edit::Dscp(
                u8::try_from(value)
                    .ok()
                    .filter(|d| *d < 64)
                    .ok_or_else(|| out_of_range(63))?,
            ),
            HeaderEdit::IpSrc | HeaderEdit::IpDst => {
                let a = u32::try_from(value).map_err(|_| out_of_range(u32::MAX as i64))?;
                if edit == HeaderEdit::IpSrc {
                    Edit::IpSrc(a)
                } else {
                    Edit::IpDst(a)
                }
            }
            HeaderEdit::SrcPort | HeaderEdit::DstPort => {
                let p = u16::try_from(value).map_err(|_| out_of_range(65535))?;
                if edit == HeaderEdit::SrcPort {
                    Edit::SrcPort(p)
                } else {
                    Edit::DstPort(p)
                }
            }
        };
        match self.edits.as_deref_mut() {
            Some(edits) => edits.push(e),
            None => Err(Fault::Host("`steer` cannot edit the packet".into())),
        }
    }

    fn message_len(&self, msg: &Value) -> Result<Value, Fault> {
        if !is_frame(msg) {
            return Err(Fault::Kind("a packet"));
        }
        Ok(Value::Int(self.frame.len() as i64))
    }

    fn message_len_int(&self, msg: &Value) -> Result<IntField, Fault> {
        if !is_frame(msg) {
            return Err(Fault::Kind("a packet"));
        }
        Ok(IntField::Int(self.frame.len() as i64))
    }

    fn log(&mut self, func: FuncId, pc: u32, msg: &[u8]) -> Result<(), Fault> {
        // Checked before the position is worked out, so that a held-back
        // line costs a counter and nothing more.
        if let Some(held_back) = PROGRAM_LOG.allow() {
            let at = program_position(self.module.source_offset(func, pc), self.source);
            tracing::info!(at = %at, held_back, "{}", String::from_utf8_lossy(msg));
        }
        Ok(())
    }

    fn record(&mut self, _record: u16, _fields: &[Value]) -> Result<Value, Fault> {
        Err(Fault::Host(
            "a packet program cannot build records yet".into(),
        ))
    }
}

/// A place in the program, for log lines: `file:line:col` where the source
/// is known.
pub(crate) fn program_position(offset: Option<u32>, source: Option<&SourceFile>) -> String {
    match (offset, source) {
        (Some(o), Some(file)) => {
            let lc = file.line_col(o);
            format!("{}:{}:{}", file.name, lc.line, lc.col)
        }
        (Some(o), None) => format!("byte {o}"),
        _ => "unknown".to_string(),
    }
}
