//! The built-ins of packet programs run by the interpreter: `pack`,
//! `frame_len`, `in_prefix`, `min`, `max` and `broadcast` give what the
//! reference says, pass `None` (a header the packet lacks) along instead
//! of faulting, `broadcast` resumes at the channel that was full, and
//! none allocates once the interpreter's buffers have grown.

use flick_exec::{lower, Fault, Host, Module, Outcome, Sent, Value, Vm};
use flick_runtime::Timeslice;
use flick_testkit::alloc::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// A packet of an ICMP-like kind: no source port (`None`), destination
/// port 53, source address 10.1.2.3, a 6-byte name; its frame is 98
/// bytes. Three output channels, of which `full` (if any) is full once.
struct PacketHost {
    name: Vec<u8>,
    full: Option<u32>,
    sent: Vec<u32>,
    keys: Vec<Vec<u8>>,
}

const FIELDS: [&str; 4] = ["src_port", "dst_port", "ip_src", "name"];

impl PacketHost {
    fn new() -> PacketHost {
        PacketHost {
            name: b"abcdef".to_vec(),
            full: None,
            sent: Vec::with_capacity(64),
            keys: Vec::new(),
        }
    }
}

impl Host for PacketHost {
    fn bytes<'a>(&'a self, v: &'a Value) -> Option<&'a [u8]> {
        match v {
            Value::MsgBytes { msg: 0, start, len } => {
                self.name.get(*start as usize..(*start + *len) as usize)
            }
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }
    fn field(&mut self, _: &Value, _: u16, field: u16) -> Result<Value, Fault> {
        Ok(match FIELDS[field as usize] {
            "src_port" => Value::None,
            "dst_port" => Value::Int(53),
            "ip_src" => Value::Int(0x0a01_0203),
            _ => Value::MsgBytes {
                msg: 0,
                start: 0,
                len: self.name.len() as u32,
            },
        })
    }
    fn send(&mut self, chan: &Value, _: &Value) -> Result<Sent, Fault> {
        let Value::Chan { elem: Some(i), .. } = chan else {
            return Err(Fault::Kind("one channel of the array"));
        };
        if self.full == Some(*i) {
            self.full = None;
            return Ok(Sent::Full);
        }
        self.sent.push(*i);
        Ok(Sent::Done)
    }
    fn channels(&self, _: u16) -> i64 {
        3
    }
    fn all_ready(&mut self, _: u16) -> bool {
        true
    }
    fn load_state(&mut self, state: u16) -> Value {
        Value::Dict { state }
    }
    fn store_state(&mut self, _: u16, _: Value) -> Result<(), Fault> {
        Ok(())
    }
    fn dict_get(&mut self, _: u16, _: &Value) -> Result<Value, Fault> {
        Ok(Value::None)
    }
    fn dict_set(&mut self, _: u16, key: &Value, _: &Value) -> Result<(), Fault> {
        let Value::Bytes(b) = key else {
            return Err(Fault::Kind("a key of bytes"));
        };
        self.keys.push(b.to_vec());
        Ok(())
    }
    fn record(&mut self, _: u16, _: &[Value]) -> Result<Value, Fault> {
        Err(Fault::Host("no records".into()))
    }
    fn message_len(&self, _: &Value) -> Result<Value, Fault> {
        Ok(Value::Int(98))
    }
}

const RECORD: &str = "type pkt: record
  src_port : integer {signed=false, size=2}
  dst_port : integer {signed=false, size=2}
  ip_src : integer {signed=false, size=4}
  name : string {max=16}
";

fn module(src: &str) -> (Module, flick_check::CheckedProgram) {
    let src = format!("{RECORD}\n{src}");
    let (program, diags) = flick_syntax::parse(&src);
    assert!(diags.is_empty(), "{diags:?}");
    let (checked, diags) = flick_check::check(&program);
    assert!(diags.is_empty(), "{diags:?}");
    (lower(&program, &checked).unwrap(), checked)
}

fn run(m: &Module, name: &str, h: &mut PacketHost, args: &[Value]) -> Result<Outcome, Fault> {
    let f = m
        .functions
        .iter()
        .position(|f| f.name == name)
        .expect("the function") as u16;
    let mut vm = Vm::for_function(m, f);
    vm.start(m, f, args);
    vm.run(m, h, &mut Timeslice::unlimited())
}

const CHECKS: &str = "fun checks: (p: pkt) -> (list<bool>)
  [pack(1, 2) <> pack(2, 1), pack(\"a\", \"bc\") <> pack(\"ab\", \"c\"), pack(1) <> pack(True),
   pack(p.name, 1) = pack(\"abcdef\", 1), len(pack(1)) = 9, len(pack(\"ab\", True)) = 9,
   len(pack(p.src_port)) = 1, pack(p.src_port, 1) <> pack(1, p.src_port),
   hash(pack(p.ip_src, p.dst_port)) = hash(pack(167838211, 53)),
   frame_len(p) = 98, frame_len(p) + 2 = 100,
   in_prefix(p.ip_src, \"10.0.0.0/8\"), in_prefix(p.ip_src, \"10.1.2.3/32\"),
   not in_prefix(p.ip_src, \"10.1.2.4/32\"), not in_prefix(p.ip_src, \"192.168.0.0/16\"),
   in_prefix(p.ip_src, \"0.0.0.0/0\"), not in_prefix(p.src_port, \"0.0.0.0/0\"),
   not in_prefix(p.ip_src, p.name), in_prefix(3232235777, \"192.168.0.0/16\"),
   min(3, 7) = 3, max(3, 7) = 7, min(0 - 1, 1) = 0 - 1, min(p.src_port, 1) = None,
   max(p.dst_port, p.ip_src) = 167838211,
   p.src_port = 22 = False, p.src_port <> 22, p.dst_port = 53]
";

#[test]
fn packet_builtins_give_what_the_reference_says() {
    let (m, _) = module(CHECKS);
    let mut h = PacketHost::new();
    let Outcome::Done(Value::List(results)) = run(&m, "checks", &mut h, &[Value::Msg(0)]).unwrap()
    else {
        panic!("a list");
    };
    for (i, r) in results.iter().enumerate() {
        assert_eq!(*r, Value::Bool(true), "check {i} of the list in CHECKS");
    }
    assert_eq!(results.len(), 27);
}

/// Tags, big-endian integers and length-prefixed strings, as a dictionary
/// key sees them.
#[test]
fn pack_writes_tagged_parts() {
    let src = "proc P: (pkt/- c)
  global d: dict<string*integer> := empty_dict
  | c => keep(d)

fun keep: (d: ref dict<string*integer>, p: pkt) -> ()
  d[pack(p.dst_port, p.name, True, p.src_port)] := 1
";
    let (m, _) = module(src);
    let mut h = PacketHost::new();
    let f = m.functions.iter().position(|f| f.name == "keep").unwrap() as u16;
    let mut vm = Vm::for_function(&m, f);
    vm.start(&m, f, &[Value::StateRef(0), Value::Msg(0)]);
    vm.run(&m, &mut h, &mut Timeslice::unlimited()).unwrap();
    let mut want = vec![b'i', 0, 0, 0, 0, 0, 0, 0, 53, b's', 0, 0, 0, 6];
    want.extend_from_slice(b"abcdef");
    want.extend_from_slice(&[b'b', 1, b'n']);
    assert_eq!(h.keys, vec![want]);
}

#[test]
fn a_field_the_packet_lacks_compares_without_a_fault() {
    let (m, _) = module(
        "fun ssh: (p: pkt) -> (bool)
  p.src_port = 22 or p.dst_port = 22
",
    );
    let mut h = PacketHost::new();
    let out = run(&m, "ssh", &mut h, &[Value::Msg(0)]).unwrap();
    assert_eq!(out, Outcome::Done(Value::Bool(false)));
}

const BROADCAST: &str = "fun copy: ([-/pkt] outs, p: pkt) -> ()
  broadcast(p, outs)
";

#[test]
fn broadcast_sends_to_every_channel_once_resuming_where_one_was_full() {
    let (m, _) = module(BROADCAST);
    let f = m.functions.iter().position(|f| f.name == "copy").unwrap() as u16;
    let outs = Value::Chan {
        chan: 0,
        elem: None,
    };
    for full in [None, Some(0), Some(1), Some(2)] {
        let mut h = PacketHost::new();
        h.full = full;
        let mut vm = Vm::for_function(&m, f);
        vm.start(&m, f, &[outs.clone(), Value::Msg(0)]);
        let mut slice = Timeslice::unlimited();
        let mut out = vm.run(&m, &mut h, &mut slice).unwrap();
        if full.is_some() {
            assert_eq!(out, Outcome::Blocked, "full {full:?}");
            out = vm.run(&m, &mut h, &mut slice).unwrap();
        }
        assert!(matches!(out, Outcome::Done(_)), "full {full:?}: {out:?}");
        assert_eq!(h.sent, vec![0, 1, 2], "full {full:?}");
    }
}

#[test]
fn packet_builtins_allocate_nothing_once_warm() {
    let src = "fun route: ([-/pkt] outs, p: pkt) -> (integer)
  let k = pack(p.ip_src, p.src_port, p.dst_port, p.name)
  if in_prefix(p.ip_src, \"10.0.0.0/8\") and min(p.dst_port, 80) = 53:
    broadcast(p, outs)
  hash(k) mod len(outs) + frame_len(p) + max(p.dst_port, 1)
";
    let (m, _) = module(src);
    let f = m.functions.iter().position(|f| f.name == "route").unwrap() as u16;
    let mut h = PacketHost::new();
    let mut vm = Vm::for_function(&m, f);
    let args = [
        Value::Chan {
            chan: 0,
            elem: None,
        },
        Value::Msg(0),
    ];
    let once = |vm: &mut Vm, h: &mut PacketHost| {
        h.sent.clear();
        vm.start(&m, f, &args);
        vm.run(&m, h, &mut Timeslice::unlimited()).unwrap()
    };
    let first = once(&mut vm, &mut h);
    let before = ALLOC.this_thread();
    for _ in 0..100 {
        assert_eq!(once(&mut vm, &mut h), first);
    }
    let made = ALLOC.this_thread() - before;
    assert_eq!(h.sent, vec![0, 1, 2]);
    assert_eq!(made, 0, "allocations once warm");
}

#[test]
fn pack_and_broadcast_are_charged() {
    let src = "proc P: (pkt/- c, [-/pkt] {max=4} outs)
  | c => f(outs)

fun f: ([-/pkt] outs, p: pkt) -> ()
  if len(pack(p.name, p.ip_src)) > 0:
    broadcast(p, outs)
";
    let (_, checked) = module(src);
    let ops = &checked.processes[0].bounds.rule_ops;
    // pack: (1 + 4 + 16) + (1 + 8) bytes written; broadcast: 4 sends.
    assert!(ops[0].1 >= 30 + 4, "{ops:?}");
    let parts = &checked.processes[0].bounds.instance_parts;
    let bound = parts.iter().find(|(w, _)| w.starts_with("values")).unwrap();
    assert!(bound.1 >= 30, "{parts:?}");
}

/// A flattened rule (calls inlined, see `compiled.rs`) allocates nothing
/// per run once warm either.
#[test]
fn flattened_rules_allocate_nothing_once_warm() {
    let src = "fun port_of: (p: pkt) -> (integer)
  if p.src_port = None:
    p.dst_port
  else:
    p.src_port

fun route: (p: pkt) -> (integer)
  let k = pack(p.ip_src, port_of(p), p.name)
  if in_prefix(p.ip_src, \"10.0.0.0/8\") and port_of(p) = 53:
    hash(k) mod 7 + frame_len(p) * 2 - port_of(p)
  else:
    0
";
    let (m, _) = module(src);
    let f = m.functions.iter().position(|f| f.name == "route").unwrap() as u16;
    let mut h = PacketHost::new();
    let mut vm = Vm::for_function(&m, f);
    vm.set_interpreted(false);
    assert!(vm.runs_compiled(&m, f), "the rule is flattened");
    let once = |vm: &mut Vm, h: &mut PacketHost| {
        vm.start(&m, f, &[Value::Msg(0)]);
        vm.run(&m, h, &mut Timeslice::unlimited()).unwrap()
    };
    let first = once(&mut vm, &mut h);
    let Outcome::Done(Value::Int(n)) = first else {
        panic!("an integer, not {first:?}");
    };
    assert!(n >= 196 - 53, "{n}");
    let before = ALLOC.this_thread();
    for _ in 0..100 {
        assert_eq!(once(&mut vm, &mut h), first);
    }
    let made = ALLOC.this_thread() - before;
    assert_eq!(made, 0, "allocations once warm");
}
