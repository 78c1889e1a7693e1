//! The interpreter of compiled code. Its state (frames and registers) lives
//! in the [`Vm`], not on the Rust stack, so it can stop at a full channel or
//! an expired timeslice and resume at the same operation later.

use crate::code::*;
use crate::compiled::Flat;
use crate::fold::{FoldSpec, FoldStep};
use crate::typed::{Fast, Operand};
use flick_runtime::Timeslice;
use flick_syntax::ast::{BinOp, UnOp};
use std::sync::Arc;

/// A value of compute code. Bytes and records are handles that the
/// [`Host`] resolves, so values stay small and copying them allocates
/// nothing.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Unit,
    None,
    Bool(bool),
    Int(i64),
    /// Bytes in a message the host holds: `msg`'s bytes `start..start+len`.
    MsgBytes {
        msg: u32,
        start: u32,
        len: u32,
    },
    /// Bytes of a constant: operation `op` of function `func`.
    ConstBytes {
        func: FuncId,
        op: u32,
    },
    /// Bytes the host owns for the value's lifetime (dictionary keys).
    Bytes(Arc<[u8]>),
    /// Bytes in the interpreter's scratch buffer (what `lower` and
    /// `to_string` make): `start..start+len`, kept until the next run
    /// starts. Stored anywhere that outlives the run, they are copied.
    Scratch {
        start: u32,
        len: u32,
    },
    /// What `split_once` gives: two ranges, `a` and `b`, of message `msg`'s
    /// bytes, or of the scratch buffer where `msg` is [`SCRATCH`]; `[0]`
    /// and `[1]` read them.
    Halves {
        msg: u32,
        a: u32,
        a_len: u32,
        b: u32,
        b_len: u32,
    },
    /// A record: a message the host holds.
    Msg(u32),
    /// A process channel, or one channel of a channel array.
    Chan {
        chan: u16,
        elem: Option<u32>,
    },
    /// A dictionary held in state slot `state`.
    Dict {
        state: u16,
    },
    /// A `ref` parameter's reference to process state variable `state`.
    StateRef(u16),
    /// A meter's buckets, as a dictionary of meters keeps them.
    Meter(MeterState),
    List(Arc<Vec<Value>>),
    Tuple(Arc<[Value]>),
}

/// The `msg` of a [`Value::Halves`] in the scratch buffer.
pub const SCRATCH: u32 = u32::MAX;

/// The most bytes of a `log(msg)` line; a longer message is cut.
pub const LOG_LINE_MAX: usize = 256;

/// A run-time failure of compute code: the message being handled is
/// dropped and the host decides what the connection sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    #[error("division by zero")]
    DivideByZero,
    #[error("index {index} is out of range (length {len})")]
    OutOfRange { index: i64, len: i64 },
    #[error("{0}")]
    Host(String),
    #[error("an operation got a value of the wrong kind: {0}")]
    Kind(&'static str),
}

/// A field as [`Host::field_int`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntField {
    Int(i64),
    None,
    /// Bytes, or anything else that is not an integer.
    Other,
}

/// Whether a send went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    Done,
    /// The channel is full: suspend, and retry when woken.
    Full,
}

/// One [`Host::merge_fold`]: the merge, the fold's key and first element,
/// its compiled body and running values (updated in place), and the
/// timeslice, which the host checks between elements.
pub struct FoldCall<'a> {
    pub chan: u16,
    pub record: u16,
    pub field: u16,
    pub key: &'a Value,
    pub first: &'a Value,
    pub fold: &'a FoldSpec,
    pub accs: &'a mut [i64],
    /// Steps taken so far; the running values come from `first` while 0.
    pub count: &'a mut i64,
    pub slice: &'a mut Timeslice,
}

/// What compute code needs from the task running it: messages, channels,
/// state. The runtime implements it; tests implement it with plain data.
pub trait Host {
    /// Bytes of a bytes value.
    fn bytes<'a>(&'a self, v: &'a Value) -> Option<&'a [u8]>;
    /// `msg.field`, for field `field` of record type `record`.
    fn field(&mut self, msg: &Value, record: u16, field: u16) -> Result<Value, Fault>;
    /// `msg.field` where only whether it is a given integer, or `None`,
    /// matters (a field compared with a constant): no `Value` made.
    fn field_int(&mut self, msg: &Value, record: u16, field: u16) -> Result<IntField, Fault> {
        Ok(match self.field(msg, record, field)? {
            Value::Int(i) => IntField::Int(i),
            Value::None => IntField::None,
            _ => IntField::Other,
        })
    }
    /// [`Host::field_int`] of several fields of one message, into `out`
    /// in the same order (one call where a key packs several fields); on
    /// a fault, the position of the field that faulted.
    fn field_ints(
        &mut self,
        msg: &Value,
        fields: &[(u16, u16)],
        out: &mut [IntField],
    ) -> Result<(), (usize, Fault)> {
        for (i, (&(record, field), o)) in fields.iter().zip(out).enumerate() {
            *o = self.field_int(msg, record, field).map_err(|f| (i, f))?;
        }
        Ok(())
    }
    fn send(&mut self, chan: &Value, value: &Value) -> Result<Sent, Fault>;
    /// [`Host::send`] of a value compute code never reads again (the
    /// send is the last use of a record built or received in this run,
    /// and nothing else holds it): the host may pass its storage on
    /// rather than a copy. Where it answers [`Sent::Full`], `value` must
    /// still be whole, since the send runs again on resume.
    fn send_owned(&mut self, chan: &Value, value: &Value) -> Result<Sent, Fault> {
        self.send(chan, value)
    }
    /// Channels in a channel array.
    fn channels(&self, chan: u16) -> i64;
    fn all_ready(&mut self, chan: u16) -> bool;
    fn load_state(&mut self, state: u16) -> Value;
    /// The dictionary that state variable `state` holds (the `state` of
    /// the `Value::Dict` that [`Host::load_state`] returns), if it holds
    /// one: what a `ref` parameter is indexed in, with no `Value` made.
    fn dict_of(&mut self, state: u16) -> Option<u16> {
        match self.load_state(state) {
            Value::Dict { state } => Some(state),
            _ => None,
        }
    }
    fn store_state(&mut self, state: u16, v: Value) -> Result<(), Fault>;
    fn dict_get(&mut self, state: u16, key: &Value) -> Result<Value, Fault>;
    fn dict_set(&mut self, state: u16, key: &Value, value: &Value) -> Result<(), Fault>;
    /// `dict_get` of a key made in the interpreter's scratch (`pack`,
    /// `to_string`), given as its bytes. The default copies them into a
    /// [`Value::Bytes`]; a host that can look bytes up as they are
    /// overrides it and allocates nothing.
    fn dict_get_bytes(&mut self, state: u16, key: &[u8]) -> Result<Value, Fault> {
        self.dict_get(state, &Value::Bytes(key.into()))
    }
    /// [`Host::dict_get_bytes`] written into `out` (a register) rather
    /// than returned: a value copied whole just after it was written in
    /// parts stalls on the store buffer, once per layer it is returned
    /// through.
    fn dict_get_bytes_into(
        &mut self,
        state: u16,
        key: &[u8],
        out: &mut Value,
    ) -> Result<(), Fault> {
        *out = self.dict_get_bytes(state, key)?;
        Ok(())
    }
    /// [`Host::dict_get_bytes_into`] where an integer is what the answer
    /// is used as: an integer or `None` answer returned as it is, `out`
    /// left alone (the register it goes to is written from the integer,
    /// not copied from where the host wrote it in parts); anything else
    /// written into `out` ([`IntField::Other`]).
    fn dict_get_bytes_int(
        &mut self,
        state: u16,
        key: &[u8],
        out: &mut Value,
    ) -> Result<IntField, Fault> {
        self.dict_get_bytes_into(state, key, out)?;
        Ok(match out {
            Value::Int(i) => IntField::Int(*i),
            Value::None => IntField::None,
            _ => IntField::Other,
        })
    }
    /// `dict_set` of a key given as bytes, as for [`Host::dict_get_bytes`].
    fn dict_set_bytes(&mut self, state: u16, key: &[u8], value: &Value) -> Result<(), Fault> {
        self.dict_set(state, &Value::Bytes(key.into()), value)
    }
    /// [`Host::dict_set_bytes`] of an integer, from a typed register.
    fn dict_set_bytes_int(&mut self, state: u16, key: &[u8], value: i64) -> Result<(), Fault> {
        self.dict_set_bytes(state, key, &Value::Int(value))
    }
    /// `d[key] := d[key] + x` (wrapping, as the interpreter adds) where
    /// the entry under `key` holds an integer and the host can add where
    /// it lies: `true` when done, `false` with nothing changed (no such
    /// entry, not an integer, or a dictionary whose reads do more than
    /// read), and the interpreter reads, adds and stores. The default
    /// leaves it to the interpreter.
    fn dict_add_bytes_int(&mut self, state: u16, key: &[u8], x: i64) -> Result<bool, Fault> {
        let _ = (state, key, x);
        Ok(false)
    }
    /// A message of record `record` with `fields` in its fields' order.
    /// A field holds a constant's bytes as [`Value::ConstBytes`] only
    /// where [`Host::reads_constants`] says so; otherwise as owned bytes.
    fn record(&mut self, record: u16, fields: &[Value]) -> Result<Value, Fault>;
    /// Whether [`Host::bytes`] reads [`Value::ConstBytes`] (the host holds
    /// the module): then a record's constant fields reach [`Host::record`]
    /// as they are, not copied into owned bytes for every record built.
    fn reads_constants(&self) -> bool {
        false
    }
    /// For `foldt` over channel array `chan`, ordered by `field` of
    /// `record`: the next element (see [`Op::Merge`]), `Value::None` when
    /// there is none, or `Ok(None)` to suspend until an input has more.
    fn merge_take(
        &mut self,
        chan: u16,
        record: u16,
        field: u16,
        key: Option<&Value>,
    ) -> Result<Option<Value>, Fault> {
        let _ = (chan, record, field, key);
        Err(Fault::Host(
            "`foldt` needs a host that merges channels".into(),
        ))
    }
    /// For `foldt`: folds every further element with key `call.key` into
    /// `call.accs` with the compiled body (see [`Op::MergeFold`]). The
    /// default folds nothing natively: the interpreted loop runs.
    fn merge_fold(&mut self, call: FoldCall<'_>) -> Result<FoldStep, Fault> {
        let _ = call;
        Ok(FoldStep::Unsupported)
    }
    /// A record value that compute code no longer uses.
    fn release(&mut self, v: &Value) {
        let _ = v;
    }
    /// `hash(chan)`: a hash of the addresses and ports of the connection
    /// behind a channel, the same for the connection's whole life.
    fn connection_hash(&mut self, chan: u16, elem: Option<u32>) -> Result<u64, Fault> {
        let _ = (chan, elem);
        Err(Fault::Host("this host has no connections".into()))
    }
    /// `least_connections(chans)` for channel array `chan`: the index of
    /// the element whose peer serves the fewest live instances.
    fn least_connections(&mut self, chan: u16) -> Result<u64, Fault> {
        let _ = chan;
        Err(Fault::Host("this host counts no connections".into()))
    }
    /// `header(msg, name)` for `msg`, a record of type `record`: the value
    /// of its first header field named `name` (ASCII case ignored), without
    /// the blanks that end it, or `Value::None` where it has none.
    fn header(&self, msg: &Value, record: u16, name: &[u8]) -> Result<Value, Fault> {
        let _ = (msg, record, name);
        Err(Fault::Host("this host reads no header fields".into()))
    }
    /// `set_ttl(msg, v)` and the other header edits of the packet being
    /// handled: the host makes the edit (and keeps checksums right) or
    /// says why it cannot.
    fn edit_header(&mut self, msg: &Value, edit: HeaderEdit, value: i64) -> Result<(), Fault> {
        let _ = (msg, edit, value);
        Err(Fault::Host("only packet programs edit headers".into()))
    }
    /// `frame_len(msg)`: the length in bytes of the whole message `msg`
    /// (for a packet, the frame's length on the wire).
    fn message_len(&self, msg: &Value) -> Result<Value, Fault> {
        let _ = msg;
        Err(Fault::Host("this host does not measure messages".into()))
    }
    /// [`Host::message_len`] as an integer where it is one or `None`
    /// ([`IntField::Other`]: ask `message_len` for the value).
    fn message_len_int(&self, msg: &Value) -> Result<IntField, Fault> {
        Ok(match self.message_len(msg)? {
            Value::Int(i) => IntField::Int(i),
            Value::None => IntField::None,
            _ => IntField::Other,
        })
    }
    /// `log(msg)` called by operation `pc` of function `func`: the host
    /// writes the line (rate-limited) with where the call is, or refuses.
    fn log(&mut self, func: FuncId, pc: u32, msg: &[u8]) -> Result<(), Fault> {
        let _ = (func, pc, msg);
        Err(Fault::Host("only packet programs log".into()))
    }
    /// `meter(m, n)` of meter state variable `state` (`key` `None`), or
    /// `meter(m, key, n)` of a dictionary of meters: the colour
    /// ([`GREEN`](crate::GREEN), [`YELLOW`](crate::YELLOW) or
    /// [`RED`](crate::RED)).
    fn meter(&mut self, state: u16, key: Option<ObjectKey<'_>>, n: i64) -> Result<i64, Fault> {
        let _ = (state, key, n);
        Err(Fault::Host("only packet programs have meters".into()))
    }
    /// `bloom_add`, `bloom_has` (the answer) and `bloom_clear` (`key`
    /// `None`) of Bloom filter state variable `state`.
    fn bloom(
        &mut self,
        state: u16,
        op: BloomOp,
        key: Option<ObjectKey<'_>>,
    ) -> Result<bool, Fault> {
        let _ = (state, op, key);
        Err(Fault::Host(
            "only packet programs have Bloom filters".into(),
        ))
    }
}

/// The key of a meter in a dictionary of meters, or of a Bloom filter:
/// bytes the interpreter holds (made by `pack`, or a constant), or a value
/// the host resolves (an integer, a field's bytes).
#[derive(Clone, Copy, Debug)]
pub enum ObjectKey<'a> {
    Bytes(&'a [u8]),
    Value(&'a Value),
}

/// How a run of the interpreter ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The function returned this.
    Done(Value),
    /// A channel was full; resume when it has room.
    Blocked,
    /// The timeslice ran out at a loop's back-edge; resume later.
    Yielded,
}

#[derive(Clone, Copy, Debug)]
struct Frame {
    func: FuncId,
    pc: u32,
    base: u32,
    /// Where the caller wants the result (absolute register).
    ret: u32,
}

/// The interpreter's state for one compute task.
#[derive(Debug, Default)]
pub struct Vm {
    frames: Vec<Frame>,
    regs: Vec<Value>,
    /// The typed form's integer and boolean registers, by register.
    ints: Vec<i64>,
    /// The flattened operation a fused operation's fault came from, where
    /// it is not the first it stands for.
    fault_at: Option<u32>,
    /// Bytes string built-ins make while a run handles one message; emptied
    /// when the next run starts, its storage kept, so that once it has
    /// grown to what the messages need nothing more is allocated.
    scratch: Vec<u8>,
    /// Flattened functions of the module last started, by function id
    /// (`None` inside: that function is interpreted).
    flats: Flats,
    /// Which module `flats` belongs to.
    flats_of: ModuleIdentity,
    /// Other modules' flattened functions, for a `Vm` that runs several
    /// programs' functions in turn (a dispatcher steering for each).
    other_flats: Vec<(ModuleIdentity, Flats)>,
    /// The flattened function being run, and where it is.
    flat_run: Option<(FuncId, u32)>,
    /// Whether to interpret everything; `None`: as `FLICK_INTERPRET` says.
    interpret: Option<bool>,
    /// The last dictionary lookup of the flattened run: the dictionary's
    /// state slot, the key and what it held. Another lookup of the same
    /// key with no dictionary operation between is answered from it.
    lookup: Option<(u16, Value, Value)>,
    /// A record's field values as they are handed to [`Host::record`],
    /// the list's storage kept from one record to the next.
    record_fields: Vec<Value>,
}

/// Per function of a module: flattened (`Some(Some)`), left to the
/// interpreter (`Some(None)`), or not yet asked (`None`).
type Flats = Vec<Option<Option<Arc<Flat>>>>;

/// A module as a `Vm` tells modules apart: the addresses of the module
/// and of its functions, and how many functions it has.
type ModuleIdentity = (usize, usize, usize);

/// Modules besides the last one whose flattened functions a `Vm` keeps.
const MODULES_KEPT: usize = 8;

/// Whether `FLICK_INTERPRET=1` asks for the interpreter only (read once).
fn interpret_forced() -> bool {
    static FORCED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| std::env::var_os("FLICK_INTERPRET").is_some_and(|v| v == "1"))
}

/// 64-bit FNV-1a: the `hash` of the language, stable across runs and
/// machines so that a key's backend can be computed outside Flick.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Vm {
    /// An interpreter that runs `func` without growing its stacks.
    pub fn for_function(module: &Module, func: FuncId) -> Vm {
        let (frames, regs) = module.frame_needs(func);
        Vm {
            frames: Vec::with_capacity(frames),
            regs: Vec::with_capacity(regs),
            ..Vm::default()
        }
    }

    /// Makes this interpreter run flattened code (`false`) or interpret
    /// every function (`true`) whatever `FLICK_INTERPRET` says: how
    /// tests compare the two.
    pub fn set_interpreted(&mut self, interpret: bool) {
        self.interpret = Some(interpret);
    }

    /// Whether `func` of `module` runs flattened (see [`crate::compiled`]).
    pub fn runs_compiled(&mut self, module: &Module, func: FuncId) -> bool {
        !self.interpret.unwrap_or_else(interpret_forced) && self.flat(module, func)
    }

    /// Whether `func` has a flattened form, made on first asking.
    fn flat(&mut self, module: &Module, func: FuncId) -> bool {
        let of = (
            module as *const Module as usize,
            module.functions.as_ptr() as usize,
            module.functions.len(),
        );
        if self.flats_of != of {
            // Kept for when that module's functions run again; a few
            // modules at most, so a lookup is a short scan.
            let mine = std::mem::take(&mut self.flats);
            match self.other_flats.iter().position(|(o, _)| *o == of) {
                Some(i) => {
                    let (_, theirs) = self.other_flats.swap_remove(i);
                    self.flats = theirs;
                }
                None => self.flats.resize_with(module.functions.len(), || None),
            }
            if self.flats_of != (0, 0, 0) {
                self.other_flats.push((self.flats_of, mine));
                if self.other_flats.len() > MODULES_KEPT {
                    self.other_flats.remove(0);
                }
            }
            self.flats_of = of;
        }
        let Some(slot) = self.flats.get_mut(func as usize) else {
            return false;
        };
        slot.get_or_insert_with(|| module.flat.get(module, func))
            .is_some()
    }

    /// Where the last run stopped: after [`Vm::run`] returned a fault, the
    /// function and the operation that faulted (see
    /// [`Module::source_offset`](crate::Module::source_offset)).
    pub fn fault_site(&self) -> Option<(FuncId, u32)> {
        if let Some((func, pc)) = self.flat_run {
            let flat = self.flats.get(func as usize)?.as_ref()?.as_ref()?;
            let at = match self.fault_at {
                Some(at) => at,
                None => *flat.typed.at.get(pc as usize)?,
            };
            return flat.sites.get(at as usize).copied();
        }
        self.frames.last().map(|f| (f.func, f.pc))
    }

    /// Abandons the run in progress (after a fault: it cannot resume).
    pub fn stop(&mut self) {
        self.flat_run = None;
        self.lookup = None;
        self.frames.clear();
        self.regs.clear();
        self.scratch.clear();
    }

    /// Whether a run is in progress (blocked or yielded).
    pub fn is_running(&self) -> bool {
        self.flat_run.is_some() || !self.frames.is_empty()
    }

    /// Starts `func` with `args`; then call [`Vm::run`].
    pub fn start(&mut self, module: &Module, func: FuncId, args: &[Value]) {
        self.flat_run = None;
        self.lookup = None;
        self.fault_at = None;
        self.frames.clear();
        self.scratch.clear();
        if self.runs_compiled(module, func) {
            let Some(Some(flat)) = &self.flats[func as usize] else {
                unreachable!("runs_compiled made it")
            };
            // Registers are left as the last run left them but for those
            // a run may read before writing (see `crate::typed`).
            if self.regs.len() < flat.regs {
                self.regs.resize_with(flat.regs, || Value::Unit);
            }
            if self.ints.len() < flat.regs {
                self.ints.resize(flat.regs, 0);
            }
            for r in &flat.typed.reset {
                self.regs[*r as usize] = Value::Unit;
            }
            for (i, a) in args.iter().enumerate() {
                self.regs[i] = a.clone();
            }
            self.flat_run = Some((func, 0));
            return;
        }
        self.regs.clear();
        let f = &module.functions[func as usize];
        // `resize_with` writes each register; `resize` would clone the
        // filler into each, a match per register on every run and call.
        self.regs.resize_with(f.regs as usize, || Value::Unit);
        for (i, a) in args.iter().enumerate() {
            self.regs[i] = a.clone();
        }
        self.frames.push(Frame {
            func,
            pc: 0,
            base: 0,
            ret: 0,
        });
    }

    #[inline]
    fn reg(&self, base: u32, r: Reg) -> &Value {
        &self.regs[base as usize + r as usize]
    }

    #[inline]
    fn set(&mut self, base: u32, r: Reg, v: Value) {
        self.regs[base as usize + r as usize] = v;
    }

    #[inline]
    fn int(&self, base: u32, r: Reg) -> Result<i64, Fault> {
        match self.reg(base, r) {
            Value::Int(i) => Ok(*i),
            Value::Bool(b) => Ok(*b as i64),
            _ => Err(Fault::Kind("an integer")),
        }
    }

    #[inline]
    fn truthy(&self, base: u32, r: Reg) -> Result<bool, Fault> {
        match self.reg(base, r) {
            Value::Bool(b) => Ok(*b),
            _ => Err(Fault::Kind("a boolean")),
        }
    }

    /// Runs until the function returns, a send blocks, or the timeslice
    /// expires at a back-edge.
    pub fn run(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        slice: &mut Timeslice,
    ) -> Result<Outcome, Fault> {
        if let Some((func, pc)) = self.flat_run {
            // Taken out while it runs, so the registers can be borrowed.
            let flats = std::mem::take(&mut self.flats);
            let ran = match &flats[func as usize] {
                Some(Some(flat)) => self.run_flat(module, host, flat, func, pc),
                _ => unreachable!("started flattened"),
            };
            self.flats = flats;
            return ran;
        }
        loop {
            let Some(&frame) = self.frames.last() else {
                return Ok(Outcome::Done(Value::Unit));
            };
            let func = &module.functions[frame.func as usize];
            let base = frame.base;
            let op = &func.code[frame.pc as usize];
            let mut next = frame.pc + 1;
            match op {
                Op::Const { dst, value } => {
                    let v = match value {
                        Const::Unit => Value::Unit,
                        Const::Bool(b) => Value::Bool(*b),
                        Const::Int(i) => Value::Int(*i),
                        Const::Str(_) => Value::ConstBytes {
                            func: frame.func,
                            op: frame.pc,
                        },
                        Const::None => Value::None,
                    };
                    self.set(base, *dst, v);
                }
                Op::Move { dst, src } => {
                    let v = self.reg(base, *src).clone();
                    self.set(base, *dst, v);
                }
                Op::Chan { dst, chan } => self.set(
                    base,
                    *dst,
                    Value::Chan {
                        chan: *chan,
                        elem: None,
                    },
                ),
                Op::LoadState { dst, state } => {
                    let v = host.load_state(*state);
                    self.set(base, *dst, v);
                }
                Op::StoreState { state, src } => {
                    let v = self.detach(module, &*host, self.reg(base, *src));
                    host.store_state(*state, v)?
                }
                Op::Field {
                    dst,
                    src,
                    record,
                    field,
                } => {
                    let v = host.field(self.reg(base, *src), *record, *field)?;
                    self.set(base, *dst, v);
                }
                Op::Index {
                    dst,
                    base: b,
                    index,
                } => {
                    let v = self.index(module, host, base, *b, *index)?;
                    self.set(base, *dst, v);
                }
                Op::IndexSet {
                    base: b,
                    index,
                    src,
                } => match self.reg(base, *b) {
                    Value::Dict { state } => match self.scratch_bytes(base, *index) {
                        Some(key) => host.dict_set_bytes(*state, key, self.reg(base, *src))?,
                        None => {
                            let key = self.detach(module, &*host, self.reg(base, *index));
                            host.dict_set(*state, &key, self.reg(base, *src))?;
                        }
                    },
                    _ => return Err(Fault::Kind("a dictionary")),
                },
                Op::Unary { op, dst, src } => {
                    let v = match op {
                        UnOp::Not => Value::Bool(!self.truthy(base, *src)?),
                        UnOp::Neg => Value::Int(self.int(base, *src)?.wrapping_neg()),
                    };
                    self.set(base, *dst, v);
                }
                Op::Binary { op, dst, a, b } => {
                    let v = self.binary(module, host, base, *op, *a, *b)?;
                    self.set(base, *dst, v);
                }
                Op::Builtin { f, dst, args } => {
                    let v = self.builtin(module, host, base, *f, args, (frame.func, frame.pc))?;
                    self.set(base, *dst, v);
                }
                Op::Record { dst, record, args } => {
                    let v = self.record(module, host, base, *record, args)?;
                    self.set(base, *dst, v);
                }
                Op::List { dst, items } => {
                    let l: Vec<Value> = items.iter().map(|r| self.reg(base, *r).clone()).collect();
                    self.set(base, *dst, Value::List(Arc::new(l)));
                }
                Op::Push { list, src } => {
                    let v = self.reg(base, *src).clone();
                    match &mut self.regs[base as usize + *list as usize] {
                        Value::List(l) => Arc::make_mut(l).push(v),
                        _ => return Err(Fault::Kind("a list")),
                    }
                }
                Op::Tuple { dst, items } => {
                    let t: Vec<Value> = items.iter().map(|r| self.reg(base, *r).clone()).collect();
                    self.set(base, *dst, Value::Tuple(t.into()));
                }
                Op::Call { dst, func: g, args } => {
                    let callee = &module.functions[*g as usize];
                    let new_base = self.regs.len() as u32;
                    self.regs
                        .resize_with(new_base as usize + callee.regs as usize, || Value::Unit);
                    for (i, a) in args.iter().enumerate() {
                        let v = self.reg(base, *a).clone();
                        self.regs[new_base as usize + i] = v;
                    }
                    self.frames.last_mut().unwrap().pc = next;
                    self.frames.push(Frame {
                        func: *g,
                        pc: 0,
                        base: new_base,
                        ret: base + *dst as u32,
                    });
                    continue;
                }
                Op::Send { src, chan } => {
                    match host.send(self.reg(base, *chan), self.reg(base, *src))? {
                        Sent::Done => {}
                        // Stay on this operation: it runs again on resume.
                        Sent::Full => return Ok(Outcome::Blocked),
                    }
                }
                Op::Jump { to } => next = *to,
                Op::JumpIfFalse { cond, to } => {
                    if !self.truthy(base, *cond)? {
                        next = *to;
                    }
                }
                Op::Merge {
                    dst,
                    chans,
                    record,
                    field,
                    key,
                } => {
                    let Value::Chan { chan, .. } = self.reg(base, *chans) else {
                        return Err(Fault::Kind("a channel array"));
                    };
                    let key = key.map(|k| self.reg(base, k));
                    match host.merge_take(*chan, *record, *field, key)? {
                        Some(v) => self.set(base, *dst, v),
                        // Stay on this operation: it runs again on resume.
                        None => return Ok(Outcome::Blocked),
                    }
                }
                Op::MergeFold {
                    chans,
                    record,
                    field,
                    key,
                    first,
                    accs,
                    count,
                    fold,
                    fallback,
                } => {
                    let Value::Chan { chan, .. } = self.reg(base, *chans) else {
                        return Err(Fault::Kind("a channel array"));
                    };
                    let mut vals = [0i64; crate::fold::MAX_ACCS];
                    for (v, r) in vals.iter_mut().zip(accs.iter()) {
                        *v = self.int(base, *r)?;
                    }
                    let mut n = self.int(base, *count)?;
                    let step = host.merge_fold(FoldCall {
                        chan: *chan,
                        record: *record,
                        field: *field,
                        key: self.reg(base, *key),
                        first: self.reg(base, *first),
                        fold,
                        accs: &mut vals[..accs.len()],
                        count: &mut n,
                        slice,
                    })?;
                    for (v, r) in vals.iter().zip(accs.iter()) {
                        self.set(base, *r, Value::Int(*v));
                    }
                    self.set(base, *count, Value::Int(n));
                    match step {
                        FoldStep::Done => {}
                        // Stay on this operation: it runs again on resume.
                        FoldStep::Blocked => return Ok(Outcome::Blocked),
                        FoldStep::Yielded => return Ok(Outcome::Yielded),
                        FoldStep::Unsupported => next = *fallback,
                    }
                }
                Op::Release { src, unless } => {
                    let v = self.reg(base, *src);
                    if matches!(v, Value::Msg(_)) && !unless.iter().any(|r| self.reg(base, *r) == v)
                    {
                        host.release(v);
                    }
                }
                Op::StateRef { dst, state } => self.set(base, *dst, Value::StateRef(*state)),
                Op::Deref { dst, src } => {
                    let v = match self.reg(base, *src) {
                        Value::StateRef(s) => host.load_state(*s),
                        v => v.clone(),
                    };
                    self.set(base, *dst, v);
                }
                Op::StoreRef { target, src } => {
                    let v = self.reg(base, *src).clone();
                    match self.reg(base, *target) {
                        Value::StateRef(s) => {
                            let s = *s;
                            let v = self.detach(module, &*host, &v);
                            host.store_state(s, v)?
                        }
                        _ => self.set(base, *target, v),
                    }
                }
                Op::CheckSlice => {
                    if slice.expired() {
                        self.frames.last_mut().unwrap().pc = next;
                        return Ok(Outcome::Yielded);
                    }
                }
                Op::Return { src } => {
                    let v = self.reg(base, *src).clone();
                    let done = self.frames.pop().unwrap();
                    self.regs.truncate(done.base as usize);
                    if self.frames.is_empty() {
                        return Ok(Outcome::Done(v));
                    }
                    self.regs[done.ret as usize] = v;
                    continue;
                }
            }
            self.frames.last_mut().unwrap().pc = next;
        }
    }

    /// Runs flattened function `func` from operation `pc` of its typed
    /// form ([`crate::typed`]). Where it stops (a fault, a full channel)
    /// is kept in `flat_run`.
    fn run_flat(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        flat: &Flat,
        func: FuncId,
        mut pc: u32,
    ) -> Result<Outcome, Fault> {
        let code = &flat.typed.code[..];
        loop {
            let Some(op) = code.get(pc as usize) else {
                unreachable!("a flattened body ends with a return")
            };
            match self.fast_op(module, host, flat, *op) {
                Ok(Step::Next) => pc += 1,
                Ok(Step::Goto(to)) => pc = to,
                Ok(Step::Blocked) => {
                    self.flat_run = Some((func, pc));
                    return Ok(Outcome::Blocked);
                }
                Ok(Step::Done(v)) => {
                    self.flat_run = None;
                    return Ok(Outcome::Done(v));
                }
                Err(f) => {
                    self.flat_run = Some((func, pc));
                    return Err(f);
                }
            }
        }
    }

    /// An integer operand: a slot, or a value as `int` reads it.
    #[inline(always)]
    fn operand_int(&self, o: Operand) -> Result<i64, Fault> {
        match o {
            Operand::Slot(r) => Ok(self.ints[r as usize]),
            Operand::Value(r) => self.int(0, r),
        }
    }

    #[inline(always)]
    fn set_slot(&mut self, r: Reg, v: i64) {
        self.ints[r as usize] = v;
    }

    /// Whether integer field `field` of the message in `src` is `k` (a
    /// field that is not an integer is not).
    #[inline(always)]
    fn field_is(
        &self,
        host: &mut dyn Host,
        src: Reg,
        record: u16,
        field: u16,
        k: i64,
    ) -> Result<bool, Fault> {
        let f = host.field_int(&self.regs[src as usize], record, field)?;
        Ok(matches!(f, IntField::Int(x) if x == k))
    }

    /// One operation of the typed form.
    #[inline(always)]
    fn fast_op(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        flat: &Flat,
        op: Fast,
    ) -> Result<Step, Fault> {
        match op {
            Fast::Value { at } => {
                return Ok(if self.value_op(module, host, flat, at)? {
                    Step::Blocked
                } else {
                    Step::Next
                })
            }
            Fast::SendOwned { src, chan } => {
                let (chan, src) = (&self.regs[chan as usize], &self.regs[src as usize]);
                if host.send_owned(chan, src)? == Sent::Full {
                    return Ok(Step::Blocked);
                }
            }
            Fast::Box { reg, bool } => {
                let i = self.ints[reg as usize];
                put_typed(&mut self.regs[reg as usize], i, bool);
            }
            Fast::BoxTo { dst, src, bool } => {
                let i = self.ints[src as usize];
                put_typed(&mut self.regs[dst as usize], i, bool);
            }
            Fast::Unbox { reg } => {
                let i = unboxed(&self.regs[reg as usize])?;
                self.set_slot(reg, i);
            }
            Fast::Set { dst, value } => self.set_slot(dst, value),
            Fast::Move { dst, src } => self.set_slot(dst, self.ints[src as usize]),
            Fast::Not { dst, src } => {
                let b = match src {
                    Operand::Slot(r) => self.ints[r as usize] != 0,
                    Operand::Value(r) => self.truthy(0, r)?,
                };
                self.set_slot(dst, !b as i64);
            }
            Fast::Neg { dst, src } => {
                let i = self.operand_int(src)?;
                self.set_slot(dst, i.wrapping_neg());
            }
            Fast::Int { op, dst, a, b } => {
                let (x, y) = (self.operand_int(a)?, self.operand_int(b)?);
                self.set_slot(dst, int_binary_raw(op, x, y)?);
            }
            Fast::EqSlots { dst, a, b, ne } => {
                let eq = self.ints[a as usize] == self.ints[b as usize];
                self.set_slot(dst, (eq != ne) as i64);
            }
            Fast::EqValue {
                dst,
                v,
                slot,
                bool,
                ne,
            } => {
                let k = self.ints[slot as usize];
                let eq = match &self.regs[v as usize] {
                    Value::Int(x) => !bool && *x == k,
                    Value::Bool(x) => bool && *x as i64 == k,
                    _ => false,
                };
                self.set_slot(dst, (eq != ne) as i64);
            }
            Fast::Logic { dst, a, b, or } => {
                let (x, y) = (self.ints[a as usize] != 0, self.ints[b as usize] != 0);
                self.set_slot(dst, if or { x || y } else { x && y } as i64);
            }
            Fast::Binary { op, dst, a, b } => {
                // Two integers (a dictionary's answer and `frame_len`,
                // say) need not go through the interpreter's `binary`,
                // whose other cases are for bytes and booleans.
                let i = match (&self.regs[a as usize], &self.regs[b as usize]) {
                    (Value::Int(x), Value::Int(y)) if !matches!(op, BinOp::And | BinOp::Or) => {
                        int_binary_raw(op, *x, *y)?
                    }
                    _ => unboxed(&self.binary(module, host, 0, op, a, b)?)?,
                };
                self.set_slot(dst, i);
            }
            Fast::EqValueK { dst, v, k, ne } => {
                let eq = matches!(self.regs[v as usize], Value::Int(x) if x == k);
                self.set_slot(dst, (eq != ne) as i64);
            }
            Fast::EqSlotK { dst, a, k, ne } => {
                let eq = self.ints[a as usize] == k;
                self.set_slot(dst, (eq != ne) as i64);
            }
            Fast::IntK { op, dst, a, k } => {
                let x = self.operand_int(a)?;
                self.set_slot(dst, int_binary_raw(op, x, k)?);
            }
            Fast::IsNone { dst, src, ne } => {
                let eq = matches!(self.regs[src as usize], Value::None);
                self.set_slot(dst, (eq != ne) as i64);
            }
            Fast::FieldIsInt {
                dst,
                src,
                record,
                field,
                k,
                ne,
            } => {
                let eq = self.field_is(host, src, record, field, k)?;
                self.set_slot(dst, (eq != ne) as i64);
            }
            Fast::FieldIsNone {
                dst,
                src,
                record,
                field,
                ne,
            } => {
                let f = host.field_int(&self.regs[src as usize], record, field)?;
                let eq = matches!(f, IntField::None);
                self.set_slot(dst, (eq != ne) as i64);
            }
            Fast::PackFields { first, n } => self.pack_fields(module, host, flat, first, n)?,
            Fast::FrameLen { dst, src } => {
                let len = match &self.regs[src as usize] {
                    Value::None => IntField::None,
                    m => match host.message_len_int(m)? {
                        IntField::Other => {
                            let v = host.message_len(m)?;
                            self.regs[dst as usize] = v;
                            return Ok(Step::Next);
                        }
                        len => len,
                    },
                };
                match len {
                    IntField::Int(i) => put_int(&mut self.regs[dst as usize], i),
                    _ => put_none(&mut self.regs[dst as usize]),
                }
            }
            Fast::StateRef { dst, state } => match &mut self.regs[dst as usize] {
                Value::StateRef(s) => *s = state,
                r => *r = Value::StateRef(state),
            },
            Fast::Unit { dst } => {
                let r = &mut self.regs[dst as usize];
                if !matches!(r, Value::Unit) {
                    *r = Value::Unit;
                }
            }
            Fast::DerefIndexSetInt { at } => self.deref_store_int(module, host, flat, at)?,
            Fast::DictAdd { at, add, konst } => {
                self.dict_add(module, host, flat, at, add, konst)?
            }
            Fast::DerefIndex { at } | Fast::DerefIndexSet { at } => {
                self.deref_pair(module, host, flat, at)?
            }
            Fast::MoveValue { dst, src } => {
                // Scalars written as `put_int` writes them.
                let v = match &self.regs[src as usize] {
                    Value::Int(i) => {
                        let i = *i;
                        put_int(&mut self.regs[dst as usize], i);
                        return Ok(Step::Next);
                    }
                    Value::None => {
                        put_none(&mut self.regs[dst as usize]);
                        return Ok(Step::Next);
                    }
                    Value::Unit => {
                        let r = &mut self.regs[dst as usize];
                        if !matches!(r, Value::Unit) {
                            *r = Value::Unit;
                        }
                        return Ok(Step::Next);
                    }
                    v => v.clone(),
                };
                self.regs[dst as usize] = v;
            }
            Fast::JumpIf { cond, to } => {
                if self.ints[cond as usize] != 0 {
                    return Ok(Step::Goto(to));
                }
            }
            Fast::JumpUnlessNone { src, ne, to } => {
                let none = matches!(self.regs[src as usize], Value::None);
                if none == ne {
                    return Ok(Step::Goto(to));
                }
            }
            Fast::JumpUnlessField {
                src,
                record,
                field,
                k,
                ne,
                to,
            } => {
                if self.field_is(host, src, record, field, k)? == ne {
                    return Ok(Step::Goto(to));
                }
            }
            Fast::Jump { to } => return Ok(Step::Goto(to)),
            Fast::JumpIfNot { cond, to } => {
                if self.ints[cond as usize] == 0 {
                    return Ok(Step::Goto(to));
                }
            }
            Fast::JumpIfNotValue { cond, to } => {
                if !self.truthy(0, cond)? {
                    return Ok(Step::Goto(to));
                }
            }
            Fast::Return { src } => return Ok(Step::Done(self.regs[src as usize].clone())),
        }
        Ok(Step::Next)
    }

    /// A dereference at `at` fused with the index or index store after
    /// it: run straight on the dictionary the reference names, or else as
    /// the interpreter runs the two.
    #[inline]
    fn deref_pair(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        flat: &Flat,
        at: u32,
    ) -> Result<(), Fault> {
        let Op::Deref { src: r, .. } = flat.code[at as usize] else {
            unreachable!("fused from a dereference")
        };
        let Some(state) = self.ref_dict(host, r) else {
            return self.value_pair(module, host, flat, at);
        };
        let done = match flat.code[at as usize + 1] {
            Op::Index { dst, index, .. } => self.dict_index_into(module, host, state, index, dst),
            Op::IndexSet { index, src, .. } => self.dict_store(module, host, state, index, src),
            _ => unreachable!("fused from a dereference and an index"),
        };
        self.second_of_pair(at, done)
    }

    /// A dereference at `at` fused with the store of a typed integer
    /// register after it: the integer handed to the host as it is, never
    /// boxed into a `Value` (a `Value` written in parts and copied whole
    /// at once stalls on the store buffer).
    #[inline]
    fn deref_store_int(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        flat: &Flat,
        at: u32,
    ) -> Result<(), Fault> {
        let (Op::Deref { src: r, .. }, Op::IndexSet { index, src, .. }) =
            (&flat.code[at as usize], &flat.code[at as usize + 1])
        else {
            unreachable!("fused from a dereference and an index store")
        };
        let (index, src) = (*index, *src);
        let value = self.ints[src as usize];
        let Some(state) = self.ref_dict(host, *r) else {
            put_int(&mut self.regs[src as usize], value);
            return self.value_pair(module, host, flat, at);
        };
        self.lookup = None;
        let done = match self.scratch_bytes(0, index) {
            Some(key) if index != src => host.dict_set_bytes_int(state, key, value),
            _ => {
                put_int(&mut self.regs[src as usize], value);
                self.dict_store(module, host, state, index, src)
            }
        };
        self.second_of_pair(at, done)
    }

    /// `d[k] := d[k] + x` (see [`Fast::DictAdd`]): added where the entry
    /// lies if the host can, else the operations as the interpreter runs
    /// them, each fault at its own site.
    // Out of the dispatch loop: inlined there, it moved what the loop
    // inlines and cost rules that never add a tenth more.
    #[inline(never)]
    fn dict_add(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        flat: &Flat,
        at: u32,
        add: u32,
        konst: bool,
    ) -> Result<(), Fault> {
        let (Op::Deref { src: r, .. }, Op::Index { index, .. }, Op::Binary { b, .. }) = (
            &flat.code[at as usize],
            &flat.code[at as usize + 1],
            &flat.code[add as usize],
        ) else {
            unreachable!("fused from a dereference, an index and an addition")
        };
        let (r, index, b) = (*r, *index, *b);
        let x = match (konst, &flat.code[add as usize - 1]) {
            (
                true,
                Op::Const {
                    value: Const::Int(k),
                    ..
                },
            ) => Some(*k),
            (true, _) => unreachable!("fused with the constant it adds"),
            (false, _) => self.int(0, b).ok(),
        };
        if let (Some(state), Some(x)) = (self.ref_dict(host, r), x) {
            // A write: the last lookup's answer may be stale.
            self.lookup = None;
            if let Some(key) = self.scratch_bytes(0, index) {
                match host.dict_add_bytes_int(state, key, x) {
                    Ok(true) => return Ok(()),
                    Ok(false) => {}
                    Err(f) => {
                        self.fault_at = Some(at + 1);
                        return Err(f);
                    }
                }
            }
        }
        // The constant, fused away, put where it was made.
        if let (true, Some(k)) = (konst, x) {
            self.regs[b as usize] = Value::Int(k);
        }
        for pos in [at, at + 1, add, add + 1, add + 2] {
            if let Err(f) = self.value_op(module, host, flat, pos) {
                self.fault_at = Some(pos);
                return Err(f);
            }
        }
        Ok(())
    }

    /// Flattened operations `at` and `at + 1` (neither a send) as the
    /// interpreter runs them: what a fused dereference falls back to.
    fn value_pair(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        flat: &Flat,
        at: u32,
    ) -> Result<(), Fault> {
        self.value_op(module, host, flat, at)?;
        let done = self.value_op(module, host, flat, at + 1).map(drop);
        self.second_of_pair(at, done)
    }

    /// `done`, the outcome of the second operation of the fused pair at
    /// `at`, with a fault recorded at `at + 1`: the first has already run,
    /// so a fault points past it.
    #[inline]
    fn second_of_pair(&mut self, at: u32, done: Result<(), Fault>) -> Result<(), Fault> {
        if done.is_err() {
            self.fault_at = Some(at + 1);
        }
        done
    }

    /// Flattened operation `at` on `Value` registers, as the interpreter
    /// runs it; `true` where a send found its channel full (the operation
    /// runs again on resume).
    fn value_op(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        flat: &Flat,
        at: u32,
    ) -> Result<bool, Fault> {
        let op = &flat.code[at as usize];
        // What may change a dictionary, or touch another entry of one
        // (which reorders a least-recently-used table), forgets the
        // last lookup.
        if let Op::IndexSet { .. }
        | Op::StoreState { .. }
        | Op::StoreRef { .. }
        | Op::Record { .. }
        | Op::Release { .. }
        | Op::Builtin {
            f: Builtin::Meter | Builtin::Bloom(_),
            ..
        } = op
        {
            self.lookup = None;
        }
        match op {
            Op::Const { dst, value } => {
                let v = match value {
                    Const::Unit => Value::Unit,
                    Const::Bool(b) => Value::Bool(*b),
                    Const::Int(i) => Value::Int(*i),
                    Const::Str(_) => {
                        let (func, op) = flat.sites[at as usize];
                        Value::ConstBytes { func, op }
                    }
                    Const::None => Value::None,
                };
                self.set(0, *dst, v);
            }
            Op::Move { dst, src } => {
                let v = self.reg(0, *src).clone();
                self.set(0, *dst, v);
            }
            Op::Chan { dst, chan } => self.set(
                0,
                *dst,
                Value::Chan {
                    chan: *chan,
                    elem: None,
                },
            ),
            Op::LoadState { dst, state } => {
                let v = host.load_state(*state);
                self.set(0, *dst, v);
            }
            Op::StoreState { state, src } => {
                let v = self.detach(module, &*host, self.reg(0, *src));
                host.store_state(*state, v)?
            }
            Op::Field {
                dst,
                src,
                record,
                field,
            } => {
                let v = host.field(self.reg(0, *src), *record, *field)?;
                self.set(0, *dst, v);
            }
            Op::Index { dst, base, index } => {
                let v = match self.reg(0, *base) {
                    Value::Dict { state } => self.dict_index(module, host, *state, *index)?,
                    _ => self.index(module, host, 0, *base, *index)?,
                };
                self.set(0, *dst, v);
            }
            Op::IndexSet { base, index, src } => match self.reg(0, *base) {
                Value::Dict { state } => self.dict_store(module, host, *state, *index, *src)?,
                _ => return Err(Fault::Kind("a dictionary")),
            },
            Op::Unary { op, dst, src } => {
                let v = match op {
                    UnOp::Not => Value::Bool(!self.truthy(0, *src)?),
                    UnOp::Neg => Value::Int(self.int(0, *src)?.wrapping_neg()),
                };
                self.set(0, *dst, v);
            }
            Op::Binary { op, dst, a, b } => {
                // Integers and booleans unboxed here; anything else
                // as the interpreter does it.
                let v = match (self.reg(0, *a), self.reg(0, *b)) {
                    (Value::Int(x), Value::Int(y)) => int_binary(*op, *x, *y)?,
                    (Value::Bool(x), Value::Bool(y)) => match op {
                        BinOp::Eq => Value::Bool(x == y),
                        BinOp::Ne => Value::Bool(x != y),
                        BinOp::And => Value::Bool(*x && *y),
                        BinOp::Or => Value::Bool(*x || *y),
                        _ => self.binary(module, host, 0, *op, *a, *b)?,
                    },
                    _ => self.binary(module, host, 0, *op, *a, *b)?,
                };
                self.set(0, *dst, v);
            }
            Op::Builtin { f, dst, args } => {
                let v = self.builtin(module, host, 0, *f, args, flat.sites[at as usize])?;
                self.set(0, *dst, v);
            }
            Op::Record { dst, record, args } => {
                let v = self.record(module, host, 0, *record, args)?;
                self.set(0, *dst, v);
            }
            Op::List { dst, items } => {
                let l: Vec<Value> = items.iter().map(|r| self.reg(0, *r).clone()).collect();
                self.set(0, *dst, Value::List(Arc::new(l)));
            }
            Op::Push { list, src } => {
                let v = self.reg(0, *src).clone();
                match &mut self.regs[*list as usize] {
                    Value::List(l) => Arc::make_mut(l).push(v),
                    _ => return Err(Fault::Kind("a list")),
                }
            }
            Op::Tuple { dst, items } => {
                let t: Vec<Value> = items.iter().map(|r| self.reg(0, *r).clone()).collect();
                self.set(0, *dst, Value::Tuple(t.into()));
            }
            Op::Send { src, chan } => {
                if host.send(self.reg(0, *chan), self.reg(0, *src))? == Sent::Full {
                    // Stay on this operation: it runs again on resume.
                    return Ok(true);
                }
            }
            Op::Release { src, unless } => {
                let v = self.reg(0, *src);
                if matches!(v, Value::Msg(_)) && !unless.iter().any(|r| self.reg(0, *r) == v) {
                    host.release(v);
                }
            }
            Op::StateRef { dst, state } => self.set(0, *dst, Value::StateRef(*state)),
            Op::Deref { dst, src } => {
                let v = match self.reg(0, *src) {
                    Value::StateRef(s) => host.load_state(*s),
                    v => v.clone(),
                };
                self.set(0, *dst, v);
            }
            Op::StoreRef { target, src } => {
                let v = self.reg(0, *src).clone();
                match self.reg(0, *target) {
                    Value::StateRef(s) => {
                        let s = *s;
                        let v = self.detach(module, &*host, &v);
                        host.store_state(s, v)?
                    }
                    _ => self.set(0, *target, v),
                }
            }
            Op::Jump { .. }
            | Op::JumpIfFalse { .. }
            | Op::Return { .. }
            | Op::Call { .. }
            | Op::CheckSlice
            | Op::Merge { .. }
            | Op::MergeFold { .. } => unreachable!("control flow is the typed form's"),
        }
        Ok(false)
    }

    /// `d[index]` of the dictionary in state slot `state` in a flattened
    /// run: a lookup of the key and dictionary last looked up, with no
    /// change since, answered from its answer.
    #[inline]
    fn dict_index(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        state: u16,
        index: Reg,
    ) -> Result<Value, Fault> {
        if let Some((s, k, v)) = &self.lookup {
            if *s == state && k == self.reg(0, index) {
                return Ok(v.clone());
            }
        }
        let v = match self.scratch_bytes(0, index) {
            Some(key) => host.dict_get_bytes(state, key)?,
            None => {
                let key = self.detach(module, &*host, self.reg(0, index));
                host.dict_get(state, &key)?
            }
        };
        self.lookup = Some((state, self.reg(0, index).clone(), v.clone()));
        Ok(v)
    }

    /// [`Vm::dict_index`] into register `dst`.
    #[inline]
    fn dict_index_into(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        state: u16,
        index: Reg,
        dst: Reg,
    ) -> Result<(), Fault> {
        if let Some((s, k, v)) = &self.lookup {
            if *s == state && k == self.reg(0, index) {
                self.regs[dst as usize].clone_from(v);
                return Ok(());
            }
        }
        let key = match &self.regs[index as usize] {
            Value::Scratch { start, len } if dst != index => self
                .scratch
                .get(*start as usize..*start as usize + *len as usize),
            _ => None,
        };
        let Some(key) = key else {
            let v = self.dict_index(module, host, state, index)?;
            self.set(0, dst, v);
            return Ok(());
        };
        // An integer or `None` answer is written from what the host
        // returned, twice, rather than copied from one place to another
        // just after it was written in parts.
        let mut other = Value::Unit;
        let got = host.dict_get_bytes_int(state, key, &mut other)?;
        let key = self.regs[index as usize].clone();
        let answer = match got {
            IntField::Int(i) => {
                put_int(&mut self.regs[dst as usize], i);
                Value::Int(i)
            }
            IntField::None => {
                put_none(&mut self.regs[dst as usize]);
                Value::None
            }
            IntField::Other => {
                self.regs[dst as usize].clone_from(&other);
                other
            }
        };
        self.lookup = Some((state, key, answer));
        Ok(())
    }

    /// `d[index] := src` of the dictionary in state slot `state`.
    #[inline]
    fn dict_store(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        state: u16,
        index: Reg,
        src: Reg,
    ) -> Result<(), Fault> {
        self.lookup = None;
        match self.scratch_bytes(0, index) {
            Some(key) => host.dict_set_bytes(state, key, self.reg(0, src)),
            None => {
                let key = self.detach(module, &*host, self.reg(0, index));
                host.dict_set(state, &key, self.reg(0, src))
            }
        }
    }

    /// The dictionary state slot a `ref` parameter's register names, if
    /// it names one.
    #[inline]
    fn ref_dict(&self, host: &mut dyn Host, r: Reg) -> Option<u16> {
        match self.reg(0, r) {
            Value::StateRef(s) => host.dict_of(*s),
            _ => None,
        }
    }

    /// Fields read and packed as [`Vm::pack`] packs them, the fields'
    /// values never stored: the operations at `first..first + n` are the
    /// reads, the one after them the `pack`. A read's fault comes first,
    /// as when the reads run before the `pack`, and names its operation.
    fn pack_fields(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        flat: &Flat,
        first: u32,
        n: u32,
    ) -> Result<(), Fault> {
        let at = self.scratch.len();
        let mut packing = Ok(());
        // The fields' integers in one call to the host where they are of
        // one message (a flow key's are), each read alone otherwise.
        let mut read = [IntField::None; PACK_BATCH];
        let mut wanted = [(0u16, 0u16); PACK_BATCH];
        let ops = &flat.code[first as usize..(first + n) as usize];
        let batch = match ops {
            [Op::Field { src, .. }, ..] if ops.len() <= PACK_BATCH => Some(*src),
            _ => None,
        }
        .filter(|&s| {
            ops.iter().zip(&mut wanted).all(|(op, w)| match op {
                Op::Field {
                    src, record, field, ..
                } if *src == s => {
                    *w = (*record, *field);
                    true
                }
                _ => false,
            })
        });
        if let Some(src) = batch {
            let k = ops.len();
            if let Err((i, f)) = host.field_ints(self.reg(0, src), &wanted[..k], &mut read[..k]) {
                self.fault_at = Some(first + i as u32);
                return Err(f);
            }
        }
        for (i, pc) in (first..first + n).enumerate() {
            let Op::Field {
                src, record, field, ..
            } = &flat.code[pc as usize]
            else {
                unreachable!("fused from field reads")
            };
            // An integer or `None` (most fields of a flow key) is encoded
            // as `pack_value` encodes it, with no `Value` made; anything
            // else is read again as a value.
            let int = match batch {
                Some(_) => Ok(read[i]),
                None => host.field_int(self.reg(0, *src), *record, *field),
            };
            match int {
                Ok(IntField::Int(i)) => {
                    if packing.is_ok() {
                        self.scratch.push(b'i');
                        self.scratch.extend_from_slice(&i.to_be_bytes());
                    }
                    continue;
                }
                Ok(IntField::None) => {
                    if packing.is_ok() {
                        self.scratch.push(b'n');
                    }
                    continue;
                }
                Ok(IntField::Other) => {}
                Err(f) => {
                    self.fault_at = Some(pc);
                    return Err(f);
                }
            }
            // Encoded from where the host put it, not moved out first: a
            // copy of the whole value just after the host wrote it in parts
            // stalls on the store (as `Vm::set` does).
            let read = host.field(self.reg(0, *src), *record, *field);
            match &read {
                Ok(v) if packing.is_ok() => packing = self.pack_value(module, &*host, v),
                Ok(_) => {}
                Err(f) => {
                    self.fault_at = Some(pc);
                    return Err(f.clone());
                }
            }
        }
        let Op::Builtin { dst, .. } = &flat.code[(first + n) as usize] else {
            unreachable!("fused with a pack")
        };
        if let Err(f) = packing {
            self.fault_at = Some(first + n);
            return Err(f);
        }
        let (start, len) = (at as u32, (self.scratch.len() - at) as u32);
        // Written in place where the register holds a key already, as
        // `put_int` does.
        match &mut self.regs[*dst as usize] {
            Value::Scratch { start: s, len: n } => (*s, *n) = (start, len),
            r => *r = Value::Scratch { start, len },
        }
        Ok(())
    }

    /// Built-in `f` on registers `args`, called from `site` (function and
    /// operation, where `log` says the call is).
    fn builtin(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        base: u32,
        f: Builtin,
        args: &[Reg],
        site: (FuncId, u32),
    ) -> Result<Value, Fault> {
        let f = &f;
        Ok(match f {
            Builtin::Hash => {
                let v = self.reg(base, args[0]);
                let h = match v {
                    Value::Chan { chan, elem } => host.connection_hash(*chan, *elem)?,
                    Value::Int(i) => fnv1a(&i.to_le_bytes()),
                    Value::Bool(b) => fnv1a(&[*b as u8]),
                    // A field the message does not have (the key
                    // of a keyless command) hashes as empty.
                    Value::None => fnv1a(&[]),
                    other => fnv1a(
                        self.bytes_of(module, host, other)
                            .ok_or(Fault::Kind("hashable"))?,
                    ),
                };
                // Non-negative, so `mod` picks a valid index.
                Value::Int((h >> 1) as i64)
            }
            Builtin::Len => Value::Int(match self.reg(base, args[0]) {
                Value::Chan { chan, elem: None } => host.channels(*chan),
                Value::List(l) => l.len() as i64,
                other => self
                    .bytes_of(module, host, other)
                    .ok_or(Fault::Kind("something with a length"))?
                    .len() as i64,
            }),
            Builtin::LeastConnections => match self.reg(base, args[0]) {
                Value::Chan { chan, elem: None } => {
                    Value::Int(host.least_connections(*chan)? as i64)
                }
                _ => return Err(Fault::Kind("a channel array")),
            },
            // A fresh dictionary; storing it in state gives it storage.
            Builtin::EmptyDict => Value::Dict { state: u16::MAX },
            Builtin::AllReady => match self.reg(base, args[0]) {
                Value::Chan { chan, .. } => Value::Bool(host.all_ready(*chan)),
                _ => return Err(Fault::Kind("a channel array")),
            },
            Builtin::Pack => self.pack(module, &*host, base, args)?,
            Builtin::FrameLen => match self.reg(base, args[0]) {
                Value::None => Value::None,
                m => host.message_len(m)?,
            },
            Builtin::EditHeader(edit) => {
                let v = self.int(base, args[1])?;
                host.edit_header(self.reg(base, args[0]), *edit, v)?;
                Value::Unit
            }
            Builtin::Log => {
                let v = self.reg(base, args[0]);
                let text: Option<&[u8]> = match v {
                    Value::Int(_) | Value::Bool(_) | Value::None => None,
                    v => self.bytes_of(module, &*host, v),
                };
                match (text, v) {
                    (Some(t), _) => {
                        // Copied out so the host may be borrowed mutably;
                        // bounded, so a line costs no allocation.
                        let mut line = [0u8; LOG_LINE_MAX];
                        let n = t.len().min(LOG_LINE_MAX);
                        line[..n].copy_from_slice(&t[..n]);
                        host.log(site.0, site.1, &line[..n])?;
                    }
                    (None, Value::None) => host.log(site.0, site.1, b"None")?,
                    (None, _) => return Err(Fault::Kind("a string")),
                }
                Value::Unit
            }
            Builtin::Meter => {
                let state = object_state(self.reg(base, args[0]))?;
                let n = self.int(base, args[args.len() - 1])?;
                let key = if args.len() == 3 {
                    Some(self.object_key(module, base, args[1]))
                } else {
                    None
                };
                Value::Int(host.meter(state, key, n)?)
            }
            Builtin::Bloom(op) => {
                let state = object_state(self.reg(base, args[0]))?;
                let key = args.get(1).map(|&r| self.object_key(module, base, r));
                let has = host.bloom(state, *op, key)?;
                match op {
                    BloomOp::Has => Value::Bool(has),
                    _ => Value::Unit,
                }
            }
            Builtin::InPrefix => {
                let addr = self.reg(base, args[0]);
                let prefix = self.bytes_of(module, &*host, self.reg(base, args[1]));
                Value::Bool(in_prefix(addr, prefix))
            }
            Builtin::Min | Builtin::Max => {
                match (self.reg(base, args[0]), self.reg(base, args[1])) {
                    (Value::None, _) | (_, Value::None) => Value::None,
                    _ => {
                        let (a, b) = (self.int(base, args[0])?, self.int(base, args[1])?);
                        Value::Int(if *f == Builtin::Min {
                            a.min(b)
                        } else {
                            a.max(b)
                        })
                    }
                }
            }
            g => self.string_builtin(module, &*host, base, *g, args)?,
        })
    }

    fn bytes_of<'a>(
        &'a self,
        module: &'a Module,
        host: &'a dyn Host,
        v: &'a Value,
    ) -> Option<&'a [u8]> {
        match v {
            Value::Scratch { start, len } => self
                .scratch
                .get(*start as usize..*start as usize + *len as usize),
            _ => outside_bytes(module, host, v),
        }
    }

    /// Register `r` as a meter's or Bloom filter's key: bytes of the
    /// scratch buffer or of a constant as they lie, anything else as it is.
    fn object_key<'a>(&'a self, module: &'a Module, base: u32, r: Reg) -> ObjectKey<'a> {
        let v = self.reg(base, r);
        match v {
            Value::Scratch { start, len } => self
                .scratch
                .get(*start as usize..*start as usize + *len as usize)
                .map_or(ObjectKey::Value(&Value::None), ObjectKey::Bytes),
            Value::ConstBytes { func, op } => {
                match &module.functions[*func as usize].code[*op as usize] {
                    Op::Const {
                        value: Const::Str(s),
                        ..
                    } => ObjectKey::Bytes(s),
                    _ => ObjectKey::Value(v),
                }
            }
            v => ObjectKey::Value(v),
        }
    }

    /// The bytes of register `r` where it holds a scratch value (a key
    /// `pack` made), which a host can look up without copying them.
    fn scratch_bytes(&self, base: u32, r: Reg) -> Option<&[u8]> {
        match self.reg(base, r) {
            Value::Scratch { start, len } => self
                .scratch
                .get(*start as usize..*start as usize + *len as usize),
            _ => None,
        }
    }

    /// `v` as it may be kept past this run (in state, a record or a
    /// dictionary's keys): bytes of code or of the scratch buffer copied.
    /// Builds record `record` from registers `args` (of the frame at
    /// `base`) through the host. Bytes of the scratch buffer, which the
    /// host cannot see, become owned bytes, and so do constants unless
    /// the host reads them itself; the list of fields is the `Vm`'s own,
    /// kept between records.
    fn record(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        base: u32,
        record: u16,
        args: &[Reg],
    ) -> Result<Value, Fault> {
        let mut fields = std::mem::take(&mut self.record_fields);
        fields.clear();
        let constants = host.reads_constants();
        fields.extend(args.iter().map(|r| match self.reg(base, *r) {
            v @ Value::ConstBytes { .. } if constants => v.clone(),
            v => self.detach(module, &*host, v),
        }));
        let built = host.record(record, &fields);
        fields.clear();
        self.record_fields = fields;
        built
    }

    fn detach(&self, module: &Module, host: &dyn Host, v: &Value) -> Value {
        match v {
            Value::ConstBytes { .. } | Value::Scratch { .. } => self
                .bytes_of(module, host, v)
                .map_or(Value::None, |b| Value::Bytes(b.into())),
            Value::Halves { .. } => Value::Tuple(
                [0, 1]
                    .map(|i| self.detach(module, host, &half(v, i)))
                    .into(),
            ),
            v => v.clone(),
        }
    }

    /// Appends bytes `range` of `v` to the scratch buffer; where they now
    /// are.
    fn copy_to_scratch(
        &mut self,
        module: &Module,
        host: &dyn Host,
        v: &Value,
        range: std::ops::Range<usize>,
    ) -> Result<(u32, u32), Fault> {
        let at = self.scratch.len();
        match v {
            Value::Scratch { start, .. } => {
                let s = *start as usize;
                self.scratch
                    .extend_from_within(s + range.start..s + range.end);
            }
            _ => {
                let b = outside_bytes(module, host, v).ok_or(Fault::Kind("a string"))?;
                self.scratch.extend_from_slice(&b[range]);
            }
        }
        Ok((at as u32, (self.scratch.len() - at) as u32))
    }

    /// `pack(a, ...)`: each value as a part, a tag byte then the value:
    /// `i` and an integer's 8 bytes big-endian, `b` and a `bool`'s byte,
    /// `s` and a string's length (4 bytes big-endian) and bytes, or `n`
    /// alone for `None`. Tags and lengths make two different lists of
    /// values pack differently. Written into the scratch buffer.
    fn pack(
        &mut self,
        module: &Module,
        host: &dyn Host,
        base: u32,
        args: &[Reg],
    ) -> Result<Value, Fault> {
        let at = self.scratch.len();
        for r in args {
            let v = self.reg(base, *r).clone();
            self.pack_value(module, host, &v)?;
        }
        Ok(Value::Scratch {
            start: at as u32,
            len: (self.scratch.len() - at) as u32,
        })
    }

    /// One part of a `pack`, appended to the scratch buffer.
    #[inline]
    fn pack_value(&mut self, module: &Module, host: &dyn Host, v: &Value) -> Result<(), Fault> {
        match v {
            Value::Int(i) => {
                self.scratch.push(b'i');
                self.scratch.extend_from_slice(&i.to_be_bytes());
            }
            Value::Bool(x) => self.scratch.extend_from_slice(&[b'b', *x as u8]),
            Value::None => self.scratch.push(b'n'),
            v => {
                let n = self
                    .bytes_of(module, host, v)
                    .ok_or(Fault::Kind("an integer, bool or string"))?
                    .len();
                self.scratch.push(b's');
                self.scratch.extend_from_slice(&(n as u32).to_be_bytes());
                self.copy_to_scratch(module, host, v, 0..n)?;
            }
        }
        Ok(())
    }

    /// The built-ins on strings, and `header`. None fails: `None` given
    /// (or found) gives `None`, or `False` from a test.
    fn string_builtin(
        &mut self,
        module: &Module,
        host: &dyn Host,
        base: u32,
        f: Builtin,
        args: &[Reg],
    ) -> Result<Value, Fault> {
        let arg = |i: usize| self.reg(base, args[i]);
        if let Builtin::StartsWith | Builtin::EndsWith | Builtin::Contains = f {
            if matches!(arg(0), Value::None) || matches!(arg(1), Value::None) {
                return Ok(Value::Bool(false));
            }
            let s = self
                .bytes_of(module, host, arg(0))
                .ok_or(Fault::Kind("a string"))?;
            let p = self
                .bytes_of(module, host, arg(1))
                .ok_or(Fault::Kind("a string"))?;
            return Ok(Value::Bool(match f {
                Builtin::StartsWith => s.starts_with(p),
                Builtin::EndsWith => s.ends_with(p),
                _ => find(s, p).is_some(),
            }));
        }
        if f == Builtin::ToString {
            let i = self.int(base, args[0])?;
            let at = self.scratch.len();
            // Writing to a Vec cannot fail.
            let _ = std::io::Write::write_fmt(&mut self.scratch, format_args!("{i}"));
            return Ok(Value::Scratch {
                start: at as u32,
                len: (self.scratch.len() - at) as u32,
            });
        }
        let v = arg(0).clone();
        if matches!(v, Value::None) {
            return Ok(Value::None);
        }
        match f {
            Builtin::Header { record } => {
                let name = arg(1);
                if matches!(name, Value::None) {
                    return Ok(Value::None);
                }
                let name = self
                    .bytes_of(module, host, name)
                    .ok_or(Fault::Kind("a string"))?;
                host.header(&v, record, name)
            }
            Builtin::Lower => {
                let n = self
                    .bytes_of(module, host, &v)
                    .ok_or(Fault::Kind("a string"))?
                    .len();
                let (start, len) = self.copy_to_scratch(module, host, &v, 0..n)?;
                self.scratch[start as usize..].make_ascii_lowercase();
                Ok(Value::Scratch { start, len })
            }
            Builtin::ToInt => Ok(self
                .bytes_of(module, host, &v)
                .ok_or(Fault::Kind("a string"))
                .map(parse_int)?
                .map_or(Value::None, Value::Int)),
            Builtin::Substring => {
                let n = self
                    .bytes_of(module, host, &v)
                    .ok_or(Fault::Kind("a string"))?
                    .len();
                let from = self.int(base, args[1])?.clamp(0, n as i64) as usize;
                let count = self.int(base, args[2])?.clamp(0, (n - from) as i64) as usize;
                Ok(match v {
                    Value::MsgBytes { msg, start, .. } => Value::MsgBytes {
                        msg,
                        start: start + from as u32,
                        len: count as u32,
                    },
                    Value::Scratch { start, .. } => Value::Scratch {
                        start: start + from as u32,
                        len: count as u32,
                    },
                    v => {
                        let (start, len) =
                            self.copy_to_scratch(module, host, &v, from..from + count)?;
                        Value::Scratch { start, len }
                    }
                })
            }
            Builtin::SplitOnce => {
                if matches!(arg(1), Value::None) {
                    return Ok(Value::None);
                }
                let s = self
                    .bytes_of(module, host, &v)
                    .ok_or(Fault::Kind("a string"))?;
                let sep = self
                    .bytes_of(module, host, arg(1))
                    .ok_or(Fault::Kind("a string"))?;
                let (n, k) = (s.len(), sep.len());
                let Some(i) = find(s, sep) else {
                    return Ok(Value::None);
                };
                let (msg, start) = match v {
                    Value::MsgBytes { msg, start, .. } => (msg, start),
                    Value::Scratch { start, .. } => (SCRATCH, start),
                    v => (SCRATCH, self.copy_to_scratch(module, host, &v, 0..n)?.0),
                };
                Ok(Value::Halves {
                    msg,
                    a: start,
                    a_len: i as u32,
                    b: start + (i + k) as u32,
                    b_len: (n - i - k) as u32,
                })
            }
            _ => Err(Fault::Kind("a built-in")),
        }
    }

    fn index(
        &mut self,
        module: &Module,
        host: &mut dyn Host,
        base: u32,
        b: Reg,
        i: Reg,
    ) -> Result<Value, Fault> {
        match self.reg(base, b).clone() {
            Value::Chan { chan, elem: None } => {
                let n = host.channels(chan);
                let i = self.int(base, i)?;
                if i < 0 || i >= n {
                    return Err(Fault::OutOfRange { index: i, len: n });
                }
                Ok(Value::Chan {
                    chan,
                    elem: Some(i as u32),
                })
            }
            Value::Dict { state } => match self.scratch_bytes(base, i) {
                Some(key) => host.dict_get_bytes(state, key),
                None => {
                    let key = self.detach(module, &*host, self.reg(base, i));
                    host.dict_get(state, &key)
                }
            },
            // A part of what `split_once` did not find.
            Value::None => Ok(Value::None),
            h @ Value::Halves { .. } => match self.int(base, i)? {
                i @ (0 | 1) => Ok(half(&h, i as u8)),
                i => Err(Fault::OutOfRange { index: i, len: 2 }),
            },
            Value::Tuple(t) => {
                let i = self.int(base, i)?;
                t.get(i as usize).cloned().ok_or(Fault::OutOfRange {
                    index: i,
                    len: t.len() as i64,
                })
            }
            Value::List(l) => {
                let i = self.int(base, i)?;
                l.get(i as usize).cloned().ok_or(Fault::OutOfRange {
                    index: i,
                    len: l.len() as i64,
                })
            }
            other => {
                let idx = self.int(base, i)?;
                let bytes = self
                    .bytes_of(module, host, &other)
                    .ok_or(Fault::Kind("indexable"))?;
                bytes
                    .get(idx as usize)
                    .map(|b| Value::Int(*b as i64))
                    .ok_or(Fault::OutOfRange {
                        index: idx,
                        len: bytes.len() as i64,
                    })
            }
        }
    }

    fn binary(
        &self,
        module: &Module,
        host: &mut dyn Host,
        base: u32,
        op: BinOp,
        a: Reg,
        b: Reg,
    ) -> Result<Value, Fault> {
        if matches!(op, BinOp::Eq | BinOp::Ne) {
            let eq = self.equal(module, host, self.reg(base, a), self.reg(base, b))?;
            return Ok(Value::Bool(eq == (op == BinOp::Eq)));
        }
        if matches!(op, BinOp::And | BinOp::Or) {
            let (x, y) = (self.truthy(base, a)?, self.truthy(base, b)?);
            return Ok(Value::Bool(if op == BinOp::And { x && y } else { x || y }));
        }
        if let (Some(x), Some(y)) = (
            self.bytes_of(module, host, self.reg(base, a)),
            self.bytes_of(module, host, self.reg(base, b)),
        ) {
            let c = x.cmp(y);
            return Ok(Value::Bool(match op {
                BinOp::Lt => c.is_lt(),
                BinOp::Le => c.is_le(),
                BinOp::Gt => c.is_gt(),
                BinOp::Ge => c.is_ge(),
                _ => return Err(Fault::Kind("integers")),
            }));
        }
        let (x, y) = (self.int(base, a)?, self.int(base, b)?);
        int_binary(op, x, y)
    }

    fn equal(
        &self,
        module: &Module,
        host: &mut dyn Host,
        a: &Value,
        b: &Value,
    ) -> Result<bool, Fault> {
        Ok(match (a, b) {
            (Value::None, Value::None) => true,
            (Value::None, _) | (_, Value::None) => false,
            (Value::Int(x), Value::Int(y)) => x == y,
            (Value::Bool(x), Value::Bool(y)) => x == y,
            (Value::Unit, Value::Unit) => true,
            (Value::Msg(x), Value::Msg(y)) => x == y,
            _ => match (
                self.bytes_of(module, host, a),
                self.bytes_of(module, host, b),
            ) {
                (Some(x), Some(y)) => x == y,
                _ => a == b,
            },
        })
    }
}

/// `x op y` of two integers, as [`Vm::binary`] computes it.
#[inline]
fn int_binary(op: BinOp, x: i64, y: i64) -> Result<Value, Fault> {
    let v = int_binary_raw(op, x, y)?;
    Ok(match op {
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Mod => Value::Int(v),
        _ => Value::Bool(v != 0),
    })
}

/// `x op y` of two integers, a boolean as 0 or 1: what the typed form
/// keeps in a slot.
#[inline]
fn int_binary_raw(op: BinOp, x: i64, y: i64) -> Result<i64, Fault> {
    Ok(match op {
        BinOp::Add => x.wrapping_add(y),
        BinOp::Sub => x.wrapping_sub(y),
        BinOp::Mul => x.wrapping_mul(y),
        BinOp::Div => x.checked_div(y).ok_or(Fault::DivideByZero)?,
        BinOp::Mod => x.checked_rem_euclid(y).ok_or(Fault::DivideByZero)?,
        BinOp::Lt => (x < y) as i64,
        BinOp::Le => (x <= y) as i64,
        BinOp::Gt => (x > y) as i64,
        BinOp::Ge => (x >= y) as i64,
        BinOp::Eq => (x == y) as i64,
        BinOp::Ne => (x != y) as i64,
        BinOp::And | BinOp::Or => return Err(Fault::Kind("a boolean")),
    })
}

/// Register `slot` set to integer `i`. Where it holds an integer
/// already (a register holds the same kind of value run after run), only
/// the number is written: a `Value` built whole and then copied in, just
/// after it was written in parts, stalls on the store buffer.
#[inline(always)]
fn put_int(slot: &mut Value, i: i64) {
    match slot {
        Value::Int(x) => *x = i,
        s => *s = Value::Int(i),
    }
}

/// [`put_int`] of a typed slot's integer or boolean (0 or 1).
#[inline(always)]
fn put_typed(slot: &mut Value, i: i64, bool: bool) {
    match slot {
        Value::Bool(x) if bool => *x = i != 0,
        Value::Int(x) if !bool => *x = i,
        s if bool => *s = Value::Bool(i != 0),
        s => *s = Value::Int(i),
    }
}

/// Register `slot` set to `None`, untouched where it holds `None`.
#[inline(always)]
fn put_none(slot: &mut Value) {
    if !matches!(slot, Value::None) {
        *slot = Value::None;
    }
}

/// An integer or boolean value as a typed slot holds it.
#[inline]
fn unboxed(v: &Value) -> Result<i64, Fault> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::Bool(b) => Ok(*b as i64),
        _ => Err(Fault::Kind("an integer")),
    }
}

/// What one operation of the typed form leads to.
/// Fields of one message a key packs that are read from the host in one
/// call (a flow key packs five).
const PACK_BATCH: usize = 8;

enum Step {
    Next,
    Goto(u32),
    Blocked,
    Done(Value),
}

/// Bytes that do not live in the interpreter: a constant's, or the host's.
fn outside_bytes<'a>(module: &'a Module, host: &'a dyn Host, v: &'a Value) -> Option<&'a [u8]> {
    match v {
        Value::ConstBytes { .. } => const_bytes(module, v),
        _ => host.bytes(v),
    }
}

/// The bytes of a constant of `module` ([`Value::ConstBytes`]); `None`
/// for any other value.
pub fn const_bytes<'a>(module: &'a Module, v: &Value) -> Option<&'a [u8]> {
    let Value::ConstBytes { func, op } = v else {
        return None;
    };
    match module
        .functions
        .get(*func as usize)?
        .code
        .get(*op as usize)?
    {
        Op::Const {
            value: Const::Str(s),
            ..
        } => Some(s),
        _ => None,
    }
}

/// The state variable a meter or Bloom filter built-in works on: its
/// first argument, a reference to it (or its handle, loaded by name).
fn object_state(v: &Value) -> Result<u16, Fault> {
    match v {
        Value::StateRef(s) | Value::Dict { state: s } if *s != u16::MAX => Ok(*s),
        _ => Err(Fault::Kind("a meter or Bloom filter in process state")),
    }
}

/// `in_prefix`: whether `addr` is an IPv4 address (an integer) within the
/// CIDR prefix `prefix`; `False` for `None` or a prefix that does not
/// parse (a constant one was refused by the checker).
fn in_prefix(addr: &Value, prefix: Option<&[u8]>) -> bool {
    let (Value::Int(addr), Some(prefix)) = (addr, prefix) else {
        return false;
    };
    let Ok(prefix) = std::str::from_utf8(prefix) else {
        return false;
    };
    match (
        u32::try_from(*addr),
        flick_check::packets::parse_cidr(prefix),
    ) {
        (Ok(addr), Ok((net, mask))) => addr & mask == net,
        _ => false,
    }
}

/// Part `i` (0 or 1) of a [`Value::Halves`].
fn half(v: &Value, i: u8) -> Value {
    let Value::Halves {
        msg,
        a,
        a_len,
        b,
        b_len,
    } = *v
    else {
        return Value::None;
    };
    let (start, len) = if i == 0 { (a, a_len) } else { (b, b_len) };
    if msg == SCRATCH {
        Value::Scratch { start, len }
    } else {
        Value::MsgBytes { msg, start, len }
    }
}

/// Where `part` first occurs in `s` (at 0 if it is empty).
fn find(s: &[u8], part: &[u8]) -> Option<usize> {
    if part.is_empty() {
        return Some(0);
    }
    let (first, rest) = (part[0], &part[1..]);
    let last = s.len().checked_sub(part.len())?;
    (0..=last).find(|&i| s[i] == first && &s[i + 1..i + part.len()] == rest)
}

/// A decimal integer, with an optional `-` or `+`: `to_int`. Anything else,
/// or a number outside 64 signed bits, is `None`.
fn parse_int(b: &[u8]) -> Option<i64> {
    if b.len() > crate::lower::INT_STRING_MAX {
        return None;
    }
    let (neg, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let d = (d - b'0') as i64;
        n = n.checked_mul(10)?.checked_add(if neg { -d } else { d })?;
    }
    Some(n)
}

#[cfg(test)]
mod strings {
    #[test]
    fn parse_int_takes_decimal_numbers_only() {
        assert_eq!(super::parse_int(b"42"), Some(42));
        assert_eq!(super::parse_int(b"-7"), Some(-7));
        assert_eq!(super::parse_int(b"+7"), Some(7));
        assert_eq!(super::parse_int(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(super::parse_int(b"9223372036854775808"), None);
        for bad in [
            &b""[..],
            b"-",
            b"1 ",
            b" 1",
            b"0x1",
            b"1a",
            b"99999999999999999999999",
        ] {
            assert_eq!(super::parse_int(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn find_finds_the_first_occurrence() {
        assert_eq!(super::find(b"a:b:c", b":"), Some(1));
        assert_eq!(super::find(b"abc", b""), Some(0));
        assert_eq!(super::find(b"abc", b"bc"), Some(1));
        assert_eq!(super::find(b"abc", b"abcd"), None);
        assert_eq!(super::find(b"", b"a"), None);
    }
}

#[cfg(test)]
mod shared_flats {
    use super::*;

    /// `fun double: (x: integer) -> (integer)  x + x`, by hand.
    fn module() -> Module {
        Module {
            functions: vec![Function {
                name: "double".into(),
                params: 1,
                regs: 2,
                code: vec![
                    Op::Binary {
                        dst: 1,
                        op: BinOp::Add,
                        a: 0,
                        b: 0,
                    },
                    Op::Return { src: 1 },
                ],
                spans: vec![0, 0],
            }],
            ..Module::default()
        }
    }

    #[test]
    fn interpreters_of_one_module_share_its_flattened_functions() {
        let m = module();
        let (mut a, mut b) = (Vm::default(), Vm::default());
        a.set_interpreted(false);
        b.set_interpreted(false);
        assert!(a.runs_compiled(&m, 0));
        assert!(b.runs_compiled(&m, 0));
        let (Some(Some(fa)), Some(Some(fb))) = (&a.flats[0], &b.flats[0]) else {
            panic!("both flattened")
        };
        // One flattening, held by the module and by each interpreter.
        assert!(Arc::ptr_eq(fa, fb));
        assert_eq!(Arc::strong_count(fa), 3);
        // A copy of the module flattens for itself.
        let copy = m.clone();
        let mut c = Vm::default();
        c.set_interpreted(false);
        assert!(c.runs_compiled(&copy, 0));
        let Some(Some(fc)) = &c.flats[0] else {
            panic!("flattened")
        };
        assert!(!Arc::ptr_eq(fa, fc));
    }
}
