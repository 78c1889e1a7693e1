//! The interpreter runs the paper's programs against a host of plain data.

use flick_exec::{fnv1a, lower, Fault, Host, Module, Outcome, Sent, Value, Vm};
use flick_runtime::Timeslice;
use std::collections::HashMap;

fn module(src: &str) -> Module {
    let (program, diags) = flick_syntax::parse(src);
    assert!(diags.is_empty(), "{diags:?}");
    let (checked, diags) = flick_check::check(&program);
    assert!(diags.is_empty(), "{diags:?}");
    lower(&program, &checked).unwrap()
}

fn example(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/../../examples/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

/// Messages are records of named byte or integer fields; channels collect
/// what is sent to them and can be made full.
#[derive(Default)]
struct TestHost {
    msgs: Vec<HashMap<String, Value>>,
    bytes: Vec<Vec<u8>>,
    fields: Vec<Vec<String>>,
    sent: Vec<(u16, Option<u32>, Value)>,
    channels: HashMap<u16, i64>,
    full: bool,
    state: HashMap<u16, Value>,
    dicts: HashMap<u16, Vec<(Vec<u8>, Value)>>,
    /// Per channel array element: queued messages, and whether it ended.
    merged: Vec<(std::collections::VecDeque<Value>, bool)>,
    released: Vec<Value>,
    /// Per send, in order: whether it was the sent record's last use
    /// ([`Host::send_owned`]).
    owned: Vec<bool>,
    /// What `least_connections` answers, and the channels it was asked about.
    least: Option<u64>,
    least_asked: Vec<u16>,
}

impl TestHost {
    fn msg(&mut self, fields: &[(&str, Value)]) -> Value {
        self.msgs.push(
            fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        );
        Value::Msg(self.msgs.len() as u32 - 1)
    }

    fn text(&mut self, s: &str) -> Value {
        self.bytes.push(s.as_bytes().to_vec());
        Value::MsgBytes {
            msg: u32::MAX - (self.bytes.len() as u32 - 1),
            start: 0,
            len: s.len() as u32,
        }
    }
}

impl Host for TestHost {
    fn bytes<'a>(&'a self, v: &'a Value) -> Option<&'a [u8]> {
        match v {
            Value::MsgBytes { msg, .. } => self
                .bytes
                .get((u32::MAX - msg) as usize)
                .map(|b| b.as_slice()),
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }
    fn field(&mut self, msg: &Value, record: u16, field: u16) -> Result<Value, Fault> {
        let Value::Msg(m) = msg else {
            return Err(Fault::Kind("a record"));
        };
        let name = &self.fields[record as usize][field as usize];
        self.msgs[*m as usize]
            .get(name)
            .cloned()
            .ok_or(Fault::Host(format!("no {name}")))
    }
    fn send(&mut self, chan: &Value, value: &Value) -> Result<Sent, Fault> {
        if self.full {
            return Ok(Sent::Full);
        }
        let Value::Chan { chan, elem } = chan else {
            return Err(Fault::Kind("a channel"));
        };
        self.sent.push((*chan, *elem, value.clone()));
        self.owned.push(false);
        Ok(Sent::Done)
    }
    fn send_owned(&mut self, chan: &Value, value: &Value) -> Result<Sent, Fault> {
        let sent = self.send(chan, value)?;
        if sent == Sent::Done {
            *self.owned.last_mut().unwrap() = true;
        }
        Ok(sent)
    }
    fn channels(&self, chan: u16) -> i64 {
        self.channels[&chan]
    }
    fn all_ready(&mut self, _chan: u16) -> bool {
        // Every open stream has an element, and some stream has one.
        self.merged.is_empty()
            || (self.merged.iter().all(|(q, ended)| !q.is_empty() || *ended)
                && self.merged.iter().any(|(q, _)| !q.is_empty()))
    }
    fn load_state(&mut self, state: u16) -> Value {
        if self.dicts.contains_key(&state) {
            return Value::Dict { state };
        }
        self.state.get(&state).cloned().unwrap_or(Value::Unit)
    }
    fn store_state(&mut self, state: u16, v: Value) -> Result<(), Fault> {
        if v == (Value::Dict { state: u16::MAX }) {
            self.dicts.insert(state, Vec::new());
        } else {
            self.state.insert(state, v);
        }
        Ok(())
    }
    fn dict_get(&mut self, state: u16, key: &Value) -> Result<Value, Fault> {
        let k = self.bytes(key).ok_or(Fault::Kind("bytes"))?.to_vec();
        Ok(self.dicts[&state]
            .iter()
            .find(|(x, _)| *x == k)
            .map_or(Value::None, |(_, v)| v.clone()))
    }
    fn dict_set(&mut self, state: u16, key: &Value, value: &Value) -> Result<(), Fault> {
        let k = self.bytes(key).ok_or(Fault::Kind("bytes"))?.to_vec();
        let d = self.dicts.get_mut(&state).unwrap();
        d.retain(|(x, _)| *x != k);
        d.push((k, value.clone()));
        Ok(())
    }
    fn record(&mut self, record: u16, fields: &[Value]) -> Result<Value, Fault> {
        let names = self.fields[record as usize].clone();
        let pairs: Vec<(&str, Value)> = names
            .iter()
            .map(|n| n.as_str())
            .zip(fields.iter().cloned())
            .collect();
        Ok(self.msg(&pairs))
    }
    fn merge_take(
        &mut self,
        _chan: u16,
        record: u16,
        field: u16,
        key: Option<&Value>,
    ) -> Result<Option<Value>, Fault> {
        if self.merged.iter().any(|(q, ended)| q.is_empty() && !ended) {
            return Ok(None);
        }
        let want = key.map(|k| self.bytes(k).unwrap().to_vec());
        let mut best: Option<(usize, Vec<u8>)> = None;
        for i in 0..self.merged.len() {
            let Some(head) = self.merged[i].0.front().cloned() else {
                continue;
            };
            let k = self.field(&head, record, field)?;
            let k = self.bytes(&k).unwrap().to_vec();
            let take = match &want {
                Some(w) => *w == k,
                None => best.as_ref().is_none_or(|(_, b)| k < *b),
            };
            if take {
                best = Some((i, k));
            }
        }
        Ok(Some(match best {
            Some((i, _)) => self.merged[i].0.pop_front().unwrap(),
            None => Value::None,
        }))
    }
    fn release(&mut self, v: &Value) {
        self.released.push(v.clone());
    }
    fn least_connections(&mut self, chan: u16) -> Result<u64, Fault> {
        self.least_asked.push(chan);
        self.least.ok_or(Fault::Host("no counts".into()))
    }
}

fn run(m: &Module, vm: &mut Vm, host: &mut TestHost) -> Outcome {
    vm.run(m, host, &mut Timeslice::unlimited()).unwrap()
}

#[test]
fn the_proxy_sends_each_request_to_the_backend_its_key_hashes_to() {
    let m = module(&example("memcached_proxy.flick"));
    let p = &m.processes[0];
    let rule = p
        .items
        .iter()
        .find(|i| i.label.starts_with("client"))
        .unwrap();
    for key in ["a", "hello", "some:longer:key"] {
        let mut h = TestHost {
            fields: m.records.iter().map(|r| r.1.clone()).collect(),
            ..Default::default()
        };
        h.channels.insert(1, 4);
        let k = h.text(key);
        let msg = h.msg(&[("key", k)]);
        let mut vm = Vm::for_function(&m, rule.func);
        vm.start(&m, rule.func, std::slice::from_ref(&msg));
        assert_eq!(run(&m, &mut vm, &mut h), Outcome::Done(Value::Unit));
        let expected = ((fnv1a(key.as_bytes()) >> 1) % 4) as u32;
        assert_eq!(h.sent, vec![(1, Some(expected), msg)], "{key}");
    }
}

#[test]
fn a_full_channel_suspends_and_resumes_at_the_send() {
    let m = module(&example("memcached_proxy.flick"));
    let rule = m.processes[0]
        .items
        .iter()
        .find(|i| i.label.starts_with("client"))
        .unwrap();
    let mut h = TestHost {
        fields: m.records.iter().map(|r| r.1.clone()).collect(),
        full: true,
        ..Default::default()
    };
    h.channels.insert(1, 4);
    let k = h.text("k");
    let msg = h.msg(&[("key", k)]);
    let mut vm = Vm::for_function(&m, rule.func);
    vm.start(&m, rule.func, &[msg]);
    assert_eq!(run(&m, &mut vm, &mut h), Outcome::Blocked);
    assert!(vm.is_running() && h.sent.is_empty());
    h.full = false;
    assert_eq!(run(&m, &mut vm, &mut h), Outcome::Done(Value::Unit));
    assert_eq!(h.sent.len(), 1, "sent exactly once");
}

#[test]
fn the_cache_router_answers_a_cached_getk() {
    let m = module(&example("memcached_cache_router.flick"));
    let p = &m.processes[0];
    let mut h = TestHost {
        fields: m.records.iter().map(|r| r.1.clone()).collect(),
        ..Default::default()
    };
    h.channels.insert(1, 2);
    let mut vm = Vm::for_function(&m, p.init);
    vm.start(&m, p.init, &[]);
    run(&m, &mut vm, &mut h);
    let from_backend = p
        .items
        .iter()
        .find(|i| i.label.starts_with("backends"))
        .unwrap();
    let from_client = p
        .items
        .iter()
        .find(|i| i.label.starts_with("client"))
        .unwrap();
    // A GETK reply (opcode 0x0c) from a backend is cached and passed on.
    let k = h.text("k");
    let reply = h.msg(&[("opcode", Value::Int(0x0c)), ("key", k)]);
    vm.start(&m, from_backend.func, std::slice::from_ref(&reply));
    run(&m, &mut vm, &mut h);
    assert_eq!(h.sent, vec![(0, None, reply.clone())]);
    // The same GETK from a client is answered from the cache.
    h.sent.clear();
    let k = h.text("k");
    let request = h.msg(&[("opcode", Value::Int(0x0c)), ("key", k)]);
    vm.start(&m, from_client.func, &[request]);
    run(&m, &mut vm, &mut h);
    assert_eq!(h.sent, vec![(0, None, reply)]);
    // A miss goes to a backend.
    h.sent.clear();
    let k = h.text("other");
    let request = h.msg(&[("opcode", Value::Int(0x0c)), ("key", k)]);
    vm.start(&m, from_client.func, &[request]);
    run(&m, &mut vm, &mut h);
    assert!(matches!(h.sent[..], [(1, Some(_), _)]));
}

#[test]
fn a_long_fold_yields_at_its_back_edge_and_resumes() {
    let src = "fun add: (a: integer, b: integer) -> (integer)\n  a + b\n\n\
               fun total: (x: integer) -> (integer)\n  fold(add, x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])\n";
    let m = module(src);
    let total = m.functions.iter().position(|f| f.name == "total").unwrap() as u16;
    let mut h = TestHost::default();
    let mut vm = Vm::for_function(&m, total);
    vm.start(&m, total, &[Value::Int(100)]);
    let mut yields = 0;
    let result = loop {
        // A timeslice that is always used up: every back-edge yields.
        let mut slice = flick_runtime::Timeslice::unlimited();
        slice_expire(&mut slice);
        match vm.run(&m, &mut h, &mut slice).unwrap() {
            Outcome::Yielded => yields += 1,
            Outcome::Done(v) => break v,
            Outcome::Blocked => unreachable!(),
        }
    };
    assert_eq!(result, Value::Int(155));
    assert_eq!(yields, 10);
}

/// Uses up a timeslice (one item left, then done).
fn slice_expire(slice: &mut Timeslice) {
    *slice = Timeslice::expired_now();
}

#[test]
fn foldt_merges_sorted_streams_and_combines_equal_keys() {
    let m = module(&example("hadoop_wordcount.flick"));
    let p = &m.processes[0];
    let mut h = TestHost {
        fields: m.records.iter().map(|r| r.1.clone()).collect(),
        ..Default::default()
    };
    h.channels.insert(0, 3);
    let streams: [&[(&str, i64)]; 3] = [
        &[("apple", 1), ("cherry", 2), ("cherry", 1)],
        &[("banana", 4), ("cherry", 10)],
        &[("apple", 5)],
    ];
    for s in streams {
        let mut q = std::collections::VecDeque::new();
        for (k, v) in s {
            let k = h.text(k);
            q.push_back(h.msg(&[("key", k), ("value", Value::Int(*v))]));
        }
        h.merged.push((q, false));
    }
    let guard = p.items.iter().find(|i| i.label.starts_with("if")).unwrap();
    let mut vm = Vm::for_function(&m, guard.func);
    let mut out = Vec::new();
    for round in 0..10 {
        // The last element of each stream is not known to be the last
        // until its stream ends: the merge waits for it.
        if round == 2 {
            for q in &mut h.merged {
                q.1 = true;
            }
        }
        if !vm.is_running() {
            vm.start(&m, guard.func, &[]);
        }
        if run(&m, &mut vm, &mut h) == Outcome::Blocked {
            continue;
        }
        for (_, _, v) in std::mem::take(&mut h.sent) {
            let k = h.field(&v, 0, 0).unwrap();
            let k = String::from_utf8(h.bytes(&k).unwrap().to_vec()).unwrap();
            let Value::Int(n) = h.field(&v, 0, 1).unwrap() else {
                panic!()
            };
            out.push((k, n));
        }
    }
    assert_eq!(
        out,
        vec![
            ("apple".to_string(), 6),
            ("banana".to_string(), 4),
            ("cherry".to_string(), 13)
        ]
    );
    // Combined inputs went back to the host; the first of each key stays
    // until the rule ends (the key's bytes are in it).
    assert!(!h.released.is_empty());
}

/// Assigning to a `ref` parameter writes the process state it was given,
/// through nested calls; other arguments stay values.
#[test]
fn ref_parameters_write_the_state_they_refer_to() {
    let src = "type m: record\n  k : string\n\n\
               proc P: (m/m c)\n  global turn := 0\n  local mine := 0\n  | c => step(turn, mine, c)\n\n\
               fun step: (turn: ref integer, mine: ref integer, -/m c, x: m) -> ()\n  bump(turn)\n  mine := turn\n  x => c\n\n\
               fun bump: (n: ref integer) -> ()\n  n := n + 1\n";
    let m = module(src);
    let p = &m.processes[0];
    let mut h = TestHost {
        fields: m.records.iter().map(|r| r.1.clone()).collect(),
        ..Default::default()
    };
    let mut vm = Vm::for_function(&m, p.init);
    vm.start(&m, p.init, &[]);
    run(&m, &mut vm, &mut h);
    let rule = p.items.iter().find(|i| i.label.starts_with("c")).unwrap();
    for _ in 0..3 {
        let k = h.text("k");
        let msg = h.msg(&[("k", k)]);
        vm.start(&m, rule.func, &[msg]);
        run(&m, &mut vm, &mut h);
    }
    assert_eq!(h.state.get(&0), Some(&Value::Int(3)), "turn");
    assert_eq!(h.state.get(&1), Some(&Value::Int(3)), "mine");
    assert_eq!(h.sent.len(), 3);
}

/// The least-connections balancer asks the host once per connection, on
/// its first request, and keeps the backend it was given: later requests
/// go there whatever the counts say by then.
#[test]
fn least_connections_picks_a_backend_once_per_connection() {
    let m = module(&example("http_lb_least_connections.flick"));
    let p = &m.processes[0];
    let rule = p
        .items
        .iter()
        .find(|i| i.label.starts_with("client"))
        .unwrap();
    let mut h = TestHost {
        fields: m.records.iter().map(|r| r.1.clone()).collect(),
        least: Some(1),
        ..Default::default()
    };
    h.channels.insert(1, 3);
    let mut vm = Vm::for_function(&m, p.init);
    vm.start(&m, p.init, &[]);
    run(&m, &mut vm, &mut h);
    for (i, least) in [1, 0, 2].into_iter().enumerate() {
        h.least = Some(least);
        let t = h.text(&format!("/f{i}"));
        let msg = h.msg(&[("target", t)]);
        vm.start(&m, rule.func, std::slice::from_ref(&msg));
        assert_eq!(run(&m, &mut vm, &mut h), Outcome::Done(Value::Unit));
        assert_eq!(h.sent.last(), Some(&(1, Some(1), msg)), "request {i}");
    }
    assert_eq!(h.least_asked, vec![1], "asked once, about `backends`");
}

/// A host that keeps no counts makes `least_connections` a fault (the
/// message is dropped), not a guess.
#[test]
fn least_connections_without_counts_is_a_fault() {
    struct Bare;
    impl Host for Bare {
        fn bytes<'a>(&'a self, _: &'a Value) -> Option<&'a [u8]> {
            None
        }
        fn field(&mut self, _: &Value, _: u16, _: u16) -> Result<Value, Fault> {
            Err(Fault::Kind("a record"))
        }
        fn send(&mut self, _: &Value, _: &Value) -> Result<Sent, Fault> {
            Ok(Sent::Done)
        }
        fn channels(&self, _: u16) -> i64 {
            2
        }
        fn all_ready(&mut self, _: u16) -> bool {
            false
        }
        fn load_state(&mut self, _: u16) -> Value {
            Value::Int(0)
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
            Err(Fault::Kind("a record"))
        }
    }
    let m = module(&example("http_lb_least_connections.flick"));
    let rule = m.processes[0]
        .items
        .iter()
        .find(|i| i.label.starts_with("client"))
        .unwrap();
    let mut vm = Vm::for_function(&m, rule.func);
    vm.start(&m, rule.func, &[Value::Msg(0)]);
    let r = vm.run(&m, &mut Bare, &mut Timeslice::unlimited());
    assert!(matches!(r, Err(Fault::Host(_))), "{r:?}");
}

#[test]
fn only_programs_that_call_least_connections_say_so() {
    use flick_exec::code::Builtin;
    let least = module(&example("http_lb_least_connections.flick"));
    assert!(least.calls(Builtin::LeastConnections));
    let hashing = module(&example("http_lb.flick"));
    assert!(!hashing.calls(Builtin::LeastConnections));
}

/// What a rule sent: channel, element, value.
type Sends = Vec<(u16, Option<u32>, Value)>;

/// The sends of `process`'s rule on `client` for one request, and whether
/// each was its record's last use.
fn sends_of(src: &str) -> (Sends, Vec<bool>) {
    let m = module(src);
    let rule = m.processes[0]
        .items
        .iter()
        .find(|i| i.label.starts_with("client"))
        .unwrap();
    let mut h = TestHost {
        fields: m.records.iter().map(|r| r.1.clone()).collect(),
        ..Default::default()
    };
    h.channels.insert(1, 2);
    let k = h.text("key");
    let msg = h.msg(&[("key", k)]);
    let mut vm = Vm::for_function(&m, rule.func);
    vm.start(&m, rule.func, &[msg]);
    assert_eq!(run(&m, &mut vm, &mut h), Outcome::Done(Value::Unit));
    (h.sent, h.owned)
}

#[test]
fn a_send_hands_its_record_on_only_where_nothing_reads_it_after() {
    let head = "type request: record\n  key : string\n\n\
        proc P: (request/request client, [-/request] backends)\n  | client => f(client, backends)\n\n";
    let cases = [
        // The request forwarded, its key read and hashed before.
        ("req => backends[hash(req.key) mod 2]", vec![true]),
        // Forwarded as it came.
        ("req => client", vec![true]),
        // A record built here, sent once.
        ("request(\"k\") => client", vec![true]),
        // Sent twice: the first send is not the last use.
        ("req => client\n  req => backends[0]", vec![false, false]),
        // Its key read after the send.
        (
            "req => client\n  request(req.key) => backends[0]",
            vec![false, true],
        ),
        // Its key's bytes kept, in a record built before the send.
        (
            "let r = request(req.key)\n  req => client\n  r => backends[0]",
            vec![false, true],
        ),
        // A substring of its key may hold its bytes: used after.
        (
            "let s = substring(req.key, 0, 1)\n  req => client\n  request(s) => backends[0]",
            vec![false, true],
        ),
        // Bound to another name: two registers hold it (a parameter's
        // copy is not coalesced away), so it is not handed on.
        ("let r2 = req\n  r2 => client", vec![false]),
    ];
    for (body, want) in cases {
        let src = format!(
            "{head}fun f: (-/request client, [-/request] backends, req: request) -> ()\n  {body}\n"
        );
        let (sent, owned) = sends_of(&src);
        assert_eq!(sent.len(), want.len(), "{body}");
        assert_eq!(owned, want, "{body}");
    }
}

#[test]
fn only_a_rule_that_just_passes_its_message_on_says_so() {
    let head = "type request: record\n  key : string\n\n\
        proc P: (request/request client, [request/request] backends)\n  | client => f(backends)\n";
    let cases = [
        ("  | backends => client\n", Some(0)),
        // A field read, a log line, or another record: more than passing on.
        ("  | backends => g(client)\n", None),
        ("  | backends => h(client)\n", None),
    ];
    for (rule, want) in cases {
        let src = format!(
            "{head}{rule}\n\
             fun f: ([-/request] backends, req: request) -> ()\n  req => backends[0]\n\n\
             fun g: (-/request client, req: request) -> ()\n  request(req.key) => client\n\n\
             fun h: (-/request client, req: request) -> ()\n  if req.key = \"x\":\n    req => client\n  else:\n    req => client\n"
        );
        let m = module(&src);
        let rule = m.processes[0]
            .items
            .iter()
            .find(|i| i.label.starts_with("backends"))
            .unwrap();
        assert_eq!(
            m.functions[rule.func as usize].passes_on(),
            want,
            "{rule:?}"
        );
    }
    // The client's rule sends to an array element: not a plain pass-on.
    let m = module(&format!(
        "{head}  | backends => client\n\nfun f: ([-/request] backends, req: request) -> ()\n  req => backends[0]\n"
    ));
    let client = m.processes[0]
        .items
        .iter()
        .find(|i| i.label.starts_with("client"))
        .unwrap();
    assert_eq!(m.functions[client.func as usize].passes_on(), None);
}
