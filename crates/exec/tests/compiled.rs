//! Flattened rules (run in their typed form, `crates/exec/src/typed.rs`)
//! against the interpreter: every packet example, and programs of the
//! kind the packet engine's tests run, over random frames
//! through both, with outputs, sends, logs, edits, meters, Bloom filters,
//! dictionaries, state, faults and fault sites compared exactly.

use flick_exec::{
    lower, BloomOp, Fault, FuncId, HeaderEdit, Host, Module, ObjectKey, Sent, Value, Vm,
};
use flick_runtime::Timeslice;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const LIBRARY: &str = include_str!("../../../lib/packet.flick");

const EXAMPLES: [(&str, &str); 6] = [
    (
        "flow_tracker",
        include_str!("../../../examples/packets/flow_tracker.flick"),
    ),
    (
        "dpi_balancer",
        include_str!("../../../examples/packets/dpi_balancer.flick"),
    ),
    (
        "port_knocking",
        include_str!("../../../examples/packets/port_knocking.flick"),
    ),
    (
        "new_flows",
        include_str!("../../../examples/packets/new_flows.flick"),
    ),
    (
        "policer",
        include_str!("../../../examples/packets/policer.flick"),
    ),
    (
        "static_nat",
        include_str!("../../../examples/packets/static_nat.flick"),
    ),
];

/// As the packet engine's tests write them: state through `ref`
/// parameters, calls, arithmetic that faults on some frames.
const ENGINE_PROGRAMS: [&str; 4] = [
    include_str!("../../packet/tests/programs/steered.flick"),
    "grammar testpkt

type pkt: record
  flow : integer
  kind : integer
  seq : integer

proc faulty: (pkt/pkt inside, pkt/pkt outside)
  global sums := empty_dict
  global total := 0
  | inside => add(sums, total, outside)

fun share: (a: integer, b: integer) -> (integer)
  if a > b:
    a / b
  else:
    (a - b) mod b

fun add: (sums: ref dict<integer*integer>, total: ref integer, outside: -/pkt, p: pkt) -> ()
  total := total + share(p.seq, p.kind)
  if sums[p.flow] = None:
    sums[p.flow] := share(p.kind, p.flow)
  else:
    sums[p.flow] := sums[p.flow] + share(p.flow, p.kind) * 2
  # Read again after the write: a merged lookup must not answer it.
  if sums[p.flow] > 1000:
    p => outside
  if p.seq - p.kind >= 3 and not (p.flow = 2):
    p => outside
",
    // Integer and boolean registers of the typed form: arithmetic,
    // orderings, `and`, `or`, `not`, `-`, booleans compared, fields
    // compared with constants and `None` and packed, a `ref` dictionary
    // indexed and stored; fields of the wrong kind make them fault.
    "grammar testpkt

type pkt: record
  flow : integer
  kind : integer
  seq : integer

proc typed: (pkt/pkt inside, pkt/pkt outside)
  global seen: dict<string*integer> := empty_dict
  global count := 0
  | inside => classify(seen, count, outside)

fun small: (x: integer) -> (bool)
  x < 4 and not (x = 2)

fun score: (a: integer, b: integer) -> (integer)
  let n = a * 3 - b
  if n >= 10 or n = 0 - 1:
    n mod 7
  else:
    -n / (b - 5)

fun classify: (seen: ref dict<string*integer>, count: ref integer, outside: -/pkt, p: pkt) -> ()
  let k = pack(p.flow, p.kind, p.seq)
  let fresh = seen[k] = None
  if fresh and small(p.kind):
    seen[k] := score(p.seq, p.kind)
  else:
    seen[k] := seen[k] + score(p.flow, 3)
  count := count + 1
  if p.kind = 6 or p.flow <> None:
    p => outside
  if (p.seq = 17) = (count > 2):
    p => outside
",
    // Counters, `d[k] := d[k] + x` (fused, `Fast::DictAdd`): of a
    // constant, of `frame_len`, of a value read before; added where the
    // host can, and read, added and stored where the entry is absent or
    // not an integer, which makes some of them fault.
    "grammar testpkt

type pkt: record
  flow : integer
  kind : integer
  seq : integer

proc counters: (pkt/pkt inside, pkt/pkt outside)
  global packets: dict<string*integer> := empty_dict
  global bytes: dict<string*integer> := empty_dict
  global marks: dict<string*integer> := empty_dict
  global hits: dict<string*integer> := empty_dict
  | inside => count(packets, bytes, marks, hits, outside)

fun count: (packets: ref dict<string*integer>, bytes: ref dict<string*integer>, marks: ref dict<string*integer>, hits: ref dict<string*integer>, outside: -/pkt, p: pkt) -> ()
  let k = pack(p.flow, p.kind)
  let s = p.seq
  if p.kind = 4:
    hits[k] := 5
  if p.kind >= 4:
    hits[k] := hits[k] + 2
  if packets[k] = None:
    packets[k] := 1
    bytes[k] := frame_len(p)
  else:
    packets[k] := packets[k] + 1
    bytes[k] := bytes[k] + frame_len(p)
  if p.kind = 3:
    marks[k] := 0
  marks[k] := marks[k] + s
  p => outside
",
];

/// One frame: a value per field (the record's field index picks it), the
/// bytes that string fields view, and its length on the wire.
#[derive(Clone, Debug)]
struct Frame {
    fields: Vec<Value>,
    payload: Vec<u8>,
    len: i64,
}

/// A host of plain data that writes down everything a rule does to it.
#[derive(Clone, Debug, Default)]
struct ModelHost {
    frame: Option<Frame>,
    state: Vec<Value>,
    dicts: BTreeMap<(u16, Vec<u8>), Value>,
    meters: BTreeMap<(u16, Vec<u8>), i64>,
    blooms: BTreeSet<(u16, Vec<u8>)>,
    effects: Vec<String>,
}

impl ModelHost {
    fn key(&self, v: &Value) -> Vec<u8> {
        match v {
            Value::Int(i) => [&b"i"[..], &i.to_be_bytes()].concat(),
            Value::Bool(b) => vec![b'b', *b as u8],
            Value::None => b"n".to_vec(),
            v => match self.bytes(v) {
                Some(b) => [&b"s"[..], b].concat(),
                None => format!("{v:?}").into_bytes(),
            },
        }
    }

    fn object_key(&self, k: Option<ObjectKey<'_>>) -> Vec<u8> {
        match k {
            None => Vec::new(),
            Some(ObjectKey::Bytes(b)) => [&b"s"[..], b].concat(),
            Some(ObjectKey::Value(v)) => self.key(v),
        }
    }
}

impl Host for ModelHost {
    fn bytes<'a>(&'a self, v: &'a Value) -> Option<&'a [u8]> {
        match v {
            Value::MsgBytes { msg: 0, start, len } => self
                .frame
                .as_ref()?
                .payload
                .get(*start as usize..(*start + *len) as usize),
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }
    fn field(&mut self, msg: &Value, _: u16, field: u16) -> Result<Value, Fault> {
        if *msg != Value::Msg(0) {
            return Err(Fault::Kind("the frame"));
        }
        let f = self.frame.as_ref().expect("a frame");
        Ok(f.fields[field as usize % f.fields.len()].clone())
    }
    fn send(&mut self, chan: &Value, value: &Value) -> Result<Sent, Fault> {
        self.effects.push(format!("send {chan:?} {value:?}"));
        Ok(Sent::Done)
    }
    fn channels(&self, _: u16) -> i64 {
        3
    }
    fn all_ready(&mut self, _: u16) -> bool {
        true
    }
    fn load_state(&mut self, state: u16) -> Value {
        match self.state.get(state as usize) {
            Some(Value::Unit) | None => Value::Dict { state },
            Some(v) => v.clone(),
        }
    }
    fn store_state(&mut self, state: u16, v: Value) -> Result<(), Fault> {
        let s = state as usize;
        if self.state.len() <= s {
            self.state.resize(s + 1, Value::Unit);
        }
        self.state[s] = match v {
            Value::Dict { .. } => Value::Dict { state },
            v => v,
        };
        Ok(())
    }
    fn dict_get(&mut self, state: u16, key: &Value) -> Result<Value, Fault> {
        let k = self.key(key);
        Ok(self.dicts.get(&(state, k)).cloned().unwrap_or(Value::None))
    }
    fn dict_set(&mut self, state: u16, key: &Value, value: &Value) -> Result<(), Fault> {
        let k = self.key(key);
        self.dicts.insert((state, k), value.clone());
        Ok(())
    }
    /// Declines for odd state numbers, as the packet host does for flow
    /// tables, so that the read, the addition and the store run on
    /// integer entries too.
    fn dict_add_bytes_int(&mut self, state: u16, key: &[u8], x: i64) -> Result<bool, Fault> {
        if state % 2 == 1 {
            return Ok(false);
        }
        let k = self.key(&Value::Bytes(key.into()));
        Ok(match self.dicts.get_mut(&(state, k)) {
            Some(Value::Int(n)) => {
                *n = n.wrapping_add(x);
                true
            }
            _ => false,
        })
    }
    fn record(&mut self, _: u16, _: &[Value]) -> Result<Value, Fault> {
        Err(Fault::Host("no records".into()))
    }
    fn edit_header(&mut self, msg: &Value, edit: HeaderEdit, value: i64) -> Result<(), Fault> {
        if value < 0 {
            return Err(Fault::Host("a negative header value".into()));
        }
        self.effects.push(format!("edit {msg:?} {edit:?} {value}"));
        Ok(())
    }
    fn message_len(&self, _: &Value) -> Result<Value, Fault> {
        Ok(Value::Int(self.frame.as_ref().map_or(0, |f| f.len)))
    }
    fn log(&mut self, func: FuncId, pc: u32, msg: &[u8]) -> Result<(), Fault> {
        self.effects.push(format!("log {func} {pc} {msg:?}"));
        Ok(())
    }
    fn meter(&mut self, state: u16, key: Option<ObjectKey<'_>>, n: i64) -> Result<i64, Fault> {
        let k = self.object_key(key);
        let used = self.meters.entry((state, k)).or_default();
        *used += n;
        let colour = (*used / 500).clamp(0, 2);
        self.effects.push(format!("meter {state} {n} {colour}"));
        Ok(colour)
    }
    fn bloom(
        &mut self,
        state: u16,
        op: BloomOp,
        key: Option<ObjectKey<'_>>,
    ) -> Result<bool, Fault> {
        let k = (state, self.object_key(key));
        self.effects.push(format!("bloom {state} {op:?}"));
        Ok(match op {
            BloomOp::Add => !self.blooms.insert(k),
            BloomOp::Has => self.blooms.contains(&k),
            BloomOp::Clear => {
                self.blooms.retain(|(s, _)| *s != state);
                false
            }
        })
    }
}

fn module(src: &str) -> Module {
    let text = if src.starts_with("grammar packet") || src.contains("\ngrammar packet\n") {
        let line = "\ngrammar packet\n";
        let body = &LIBRARY[LIBRARY.find(line).expect("the library's grammar line") + line.len()..];
        format!("{src}\n{body}")
    } else {
        src.to_string()
    };
    let (program, diags) = flick_syntax::parse(&text);
    assert!(diags.is_empty(), "{diags:?}");
    let (checked, diags) = flick_check::check(&program);
    assert!(diags.is_empty(), "{diags:?}");
    lower(&program, &checked).expect("lowers")
}

/// What one run did: its result, where it faulted, and what it did to
/// the host.
type Run = (
    Result<flick_exec::Outcome, Fault>,
    Option<(FuncId, u32)>,
    Vec<String>,
);

fn run_one(
    module: &Module,
    vm: &mut Vm,
    host: &mut ModelHost,
    func: FuncId,
    args: &[Value],
) -> Run {
    host.effects.clear();
    vm.start(module, func, args);
    let out = vm.run(module, host, &mut Timeslice::unlimited());
    let site = if out.is_err() { vm.fault_site() } else { None };
    if out.is_err() {
        vm.stop();
    }
    (out, site, std::mem::take(&mut host.effects))
}

/// The rule functions and `steer` of `module`'s first process.
fn entry_points(module: &Module) -> Vec<FuncId> {
    let mut fs: Vec<FuncId> = module.processes[0].items.iter().map(|i| i.func).collect();
    fs.extend(
        module
            .functions
            .iter()
            .position(|f| f.name == "steer")
            .map(|f| f as FuncId),
    );
    fs
}

/// Runs `frames` through `module` flattened and interpreted; panics at
/// the first difference.
fn compare(name: &str, module: &Module, frames: &[Frame]) {
    let (mut flat, mut interp) = (Vm::default(), Vm::default());
    flat.set_interpreted(false);
    interp.set_interpreted(true);
    let (mut hf, mut hi) = (ModelHost::default(), ModelHost::default());
    let init = module.processes[0].init;
    assert_eq!(
        run_one(module, &mut flat, &mut hf, init, &[]),
        run_one(module, &mut interp, &mut hi, init, &[]),
        "{name}: setting up state"
    );
    let entries = entry_points(module);
    for (n, frame) in frames.iter().enumerate() {
        hf.frame = Some(frame.clone());
        hi.frame = Some(frame.clone());
        for &f in &entries {
            let a = run_one(module, &mut flat, &mut hf, f, &[Value::Msg(0)]);
            let b = run_one(module, &mut interp, &mut hi, f, &[Value::Msg(0)]);
            assert_eq!(
                a, b,
                "{name}: frame {n}, function {}",
                module.functions[f as usize].name
            );
        }
    }
    assert_eq!(hf.state, hi.state, "{name}: state");
    assert_eq!(hf.dicts, hi.dicts, "{name}: dictionaries");
    assert_eq!(hf.meters, hi.meters, "{name}: meters");
    assert_eq!(hf.blooms, hi.blooms, "{name}: Bloom filters");
}

/// Mostly integers a packet's fields hold and rules test for, some
/// `None` (a header the frame lacks), some bytes and some of the wrong
/// kind, so faults are compared too.
fn field_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => Just(Value::None),
        6 => prop::sample::select(vec![
            0i64, 1, 2, 3, 4, 6, 17, 22, 53, 64, 0x0800, 0x86dd, 0x0806, 5123, 6234, 7345, 8456,
            0x0a00_0001, 0xc0a8_0001,
        ])
        .prop_map(Value::Int),
        4 => (0i64..8).prop_map(Value::Int),
        2 => any::<i64>().prop_map(Value::Int),
        2 => (0u32..8, 0u32..9).prop_map(|(start, len)| Value::MsgBytes { msg: 0, start, len }),
        1 => any::<bool>().prop_map(Value::Bool),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (
        prop::collection::vec(field_value(), 80),
        prop::collection::vec(any::<u8>(), 16),
        40i64..1600,
    )
        .prop_map(|(fields, payload, len)| Frame {
            fields,
            payload,
            len,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn flattened_rules_do_what_the_interpreter_does(frames in prop::collection::vec(frame(), 1..24)) {
        for (name, src) in EXAMPLES {
            compare(name, &module(src), &frames);
        }
        for (i, src) in ENGINE_PROGRAMS.iter().enumerate() {
            compare(&format!("engine program {i}"), &module(src), &frames);
        }
    }
}

/// The examples' rules are flattened (all but the balancer, whose
/// `broadcast` is a loop); were they not, the comparison above would
/// compare the interpreter with itself.
#[test]
fn the_examples_rules_are_flattened() {
    for (name, src) in EXAMPLES {
        let m = module(src);
        let mut vm = Vm::default();
        vm.set_interpreted(false);
        for item in &m.processes[0].items {
            let flat = vm.runs_compiled(&m, item.func);
            assert_eq!(flat, name != "dpi_balancer", "{name}: {}", item.label);
        }
    }
    for src in ENGINE_PROGRAMS {
        let m = module(src);
        let mut vm = Vm::default();
        vm.set_interpreted(false);
        assert!(vm.runs_compiled(&m, m.processes[0].items[0].func));
    }
}

/// One `Vm` running two programs' rules in turn (a dispatcher steering
/// for each) keeps both flattened, and each run does what a fresh
/// interpreter's does.
#[test]
fn a_vm_alternating_between_modules_keeps_each_flattened() {
    let a = module(EXAMPLES[0].1);
    let b = module(EXAMPLES[2].1);
    let frames: Vec<Frame> = (0..6)
        .map(|i| Frame {
            fields: (0..80).map(|f| Value::Int((f * 7 + i) % 9)).collect(),
            payload: vec![i as u8; 16],
            len: 64 + i,
        })
        .collect();
    let mut vm = Vm::default();
    vm.set_interpreted(false);
    let (mut ha, mut hb) = (ModelHost::default(), ModelHost::default());
    let (mut ra, mut rb) = (ModelHost::default(), ModelHost::default());
    for frame in &frames {
        for (m, h, reference) in [(&a, &mut ha, &mut ra), (&b, &mut hb, &mut rb)] {
            let f = entry_points(m)[0];
            assert!(vm.runs_compiled(m, f));
            h.frame = Some(frame.clone());
            reference.frame = Some(frame.clone());
            let mut fresh = Vm::default();
            fresh.set_interpreted(true);
            assert_eq!(
                run_one(m, &mut vm, h, f, &[Value::Msg(0)]),
                run_one(m, &mut fresh, reference, f, &[Value::Msg(0)])
            );
        }
    }
    assert_eq!(ha.dicts, ra.dicts);
    assert_eq!(hb.dicts, rb.dicts);
}
