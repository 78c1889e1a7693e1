//! The string built-ins and `header`, run by the interpreter: what each
//! gives, `None` passed along rather than a fault, and no allocation once
//! the interpreter's buffers have grown.

use flick_exec::{lower, Fault, Host, Module, Outcome, Sent, Value, Vm};
use flick_runtime::Timeslice;
use flick_testkit::alloc::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// `req` views a unit with header fields of values up to 64 bytes.
struct Headers;

impl flick_check::WireLimits for Headers {
    fn field_max(&self, _: &str, _: &str) -> Option<u64> {
        None
    }
    fn message_max(&self, _: &str) -> Option<u64> {
        None
    }
    fn header_list(&self, record: &str) -> Option<flick_check::HeaderList> {
        (record == "req").then_some(flick_check::HeaderList {
            count_max: 8,
            name_max: 32,
            value_max: 64,
        })
    }
}

fn module(src: &str) -> (Module, flick_check::CheckedProgram) {
    let (program, diags) = flick_syntax::parse(src);
    assert!(diags.is_empty(), "{diags:?}");
    let (checked, diags) = flick_check::check_with(&program, &Headers);
    assert!(diags.is_empty(), "{diags:?}");
    (lower(&program, &checked).unwrap(), checked)
}

/// One message (`req`) with a key and header fields.
#[derive(Default)]
struct StrHost {
    key: Vec<u8>,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Host for StrHost {
    fn bytes<'a>(&'a self, v: &'a Value) -> Option<&'a [u8]> {
        match v {
            Value::MsgBytes { msg: 0, start, len } => {
                self.key.get(*start as usize..(*start + *len) as usize)
            }
            Value::MsgBytes { msg, start, len } => self
                .headers
                .get(*msg as usize - 1)?
                .1
                .get(*start as usize..(*start + *len) as usize),
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }
    fn field(&mut self, _: &Value, _: u16, _: u16) -> Result<Value, Fault> {
        Ok(Value::MsgBytes {
            msg: 0,
            start: 0,
            len: self.key.len() as u32,
        })
    }
    fn send(&mut self, _: &Value, _: &Value) -> Result<Sent, Fault> {
        Ok(Sent::Done)
    }
    fn channels(&self, _: u16) -> i64 {
        1
    }
    fn all_ready(&mut self, _: u16) -> bool {
        true
    }
    fn load_state(&mut self, _: u16) -> Value {
        Value::Unit
    }
    fn store_state(&mut self, _: u16, _: Value) -> Result<(), Fault> {
        Ok(())
    }
    fn dict_get(&mut self, _: u16, _: &Value) -> Result<Value, Fault> {
        Ok(Value::None)
    }
    fn dict_set(&mut self, _: u16, _: &Value, _: &Value) -> Result<(), Fault> {
        Ok(())
    }
    fn record(&mut self, _: u16, _: &[Value]) -> Result<Value, Fault> {
        Err(Fault::Host("no records".into()))
    }
    fn header(&self, _: &Value, _: u16, name: &[u8]) -> Result<Value, Fault> {
        // Message `i + 1` stands for header field `i`'s value.
        Ok(self
            .headers
            .iter()
            .position(|(n, _)| n.eq_ignore_ascii_case(name))
            .map_or(Value::None, |i| Value::MsgBytes {
                msg: i as u32 + 1,
                start: 0,
                len: self.headers[i].1.len() as u32,
            }))
    }
}

const CHECKS: &str = "type req: record
  key : string {max=64}

fun checks: (r: req) -> (list<bool>)
  let k = r.key
  [starts_with(k, \"User:\"), ends_with(k, \":42\"), contains(k, \"ALICE\"),
   lower(k) = \"user:alice:42\", lower(\"MiXeD\") = \"mixed\",
   substring(k, 5, 5) = \"ALICE\", substring(k, 11, 100) = \"42\",
   substring(k, -3, 4) = \"User\", substring(k, 50, 2) = \"\", substring(\"abcdef\", 2, 3) = \"cde\",
   substring(lower(k), 0, 4) = \"user\",
   to_int(substring(k, 11, 2)) = 42, to_int(k) = None, to_int(\"-17\") = 0 - 17,
   to_string(0 - 1234) = \"-1234\", to_string(to_int(\"0042\")) = \"42\",
   split_once(k, \":\")[0] = \"User\", split_once(k, \":\")[1] = \"ALICE:42\",
   split_once(k, \"#\") = None, split_once(k, \"#\")[1] = None,
   split_once(lower(k), \":a\")[1] = \"lice:42\", split_once(\"a=b\", \"=\")[0] = \"a\",
   header(r, \"x-shard\") = \"7\", to_int(header(r, \"X-SHARD\")) = 7, header(r, \"X-Other\") = None,
   starts_with(header(r, \"X-Other\"), \"\") = False, lower(header(r, \"X-Other\")) = None,
   to_int(header(r, \"X-Other\")) = None, starts_with(header(r, \"Host\"), \"exa\"),
   hash(lower(k)) = hash(\"user:alice:42\"), len(to_string(123456)) = 6]
";

fn host() -> StrHost {
    StrHost {
        key: b"User:ALICE:42".to_vec(),
        headers: vec![
            (b"Host".to_vec(), b"example.org".to_vec()),
            (b"X-Shard".to_vec(), b"7".to_vec()),
        ],
    }
}

#[test]
fn string_builtins_give_what_the_reference_says() {
    let (m, _) = module(CHECKS);
    let mut h = host();
    let mut vm = Vm::for_function(&m, 0);
    vm.start(&m, 0, &[Value::Msg(0)]);
    let Outcome::Done(Value::List(results)) =
        vm.run(&m, &mut h, &mut Timeslice::unlimited()).unwrap()
    else {
        panic!("a list");
    };
    for (i, r) in results.iter().enumerate() {
        assert_eq!(*r, Value::Bool(true), "check {i} of the list in CHECKS");
    }
    assert_eq!(results.len(), 31);
}

#[test]
fn string_builtins_allocate_nothing_once_warm() {
    let src = "type req: record
  key : string {max=64}

fun route: (r: req) -> (integer)
  let k = lower(r.key)
  let shard = to_int(header(r, \"X-Shard\"))
  let part = split_once(substring(k, 0, 10), \":\")
  if starts_with(k, \"user:\") and contains(part[1], \"ali\") and to_string(shard) = \"7\":
    shard
  else:
    0
";
    let (m, _) = module(src);
    let mut h = host();
    let mut vm = Vm::for_function(&m, 0);
    let mut once = |vm: &mut Vm| {
        vm.start(&m, 0, &[Value::Msg(0)]);
        vm.run(&m, &mut h, &mut Timeslice::unlimited()).unwrap()
    };
    assert_eq!(once(&mut vm), Outcome::Done(Value::Int(7)));
    let before = ALLOC.this_thread();
    for _ in 0..100 {
        assert_eq!(once(&mut vm), Outcome::Done(Value::Int(7)));
    }
    let made = ALLOC.this_thread() - before;
    assert_eq!(made, 0, "allocations once warm");
}

#[test]
fn string_builtins_are_charged_by_length() {
    let src = "type req: record
  key : string {max=64}

proc P: (req/req c)
  | c => f(c)

fun f: (-/req c, r: req) -> ()
  if starts_with(lower(r.key), \"user:\"):
    r => c
";
    let (_, checked) = module(src);
    let ops = &checked.processes[0].bounds.rule_ops;
    // lower: 64 bytes read and 64 written to the scratch buffer;
    // starts_with: 5 bytes compared.
    assert!(ops[0].1 >= 64 + 5, "{ops:?}");
    let parts = &checked.processes[0].bounds.instance_parts;
    let bound = parts.iter().find(|(w, _)| w.starts_with("values")).unwrap();
    assert!(bound.1 >= 64, "{parts:?}");
}
