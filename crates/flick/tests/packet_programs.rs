//! Packet programs through the CLI: `flick check` accepts the sample
//! programs (which use the packet library that `grammar packet` brings),
//! reports a user's error with the user's file name and line, and the
//! library is in canonical layout and checks alone.

use std::process::{Command, Output};

fn flick(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flick"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("flick runs")
}

const PROGRAMS: [&str; 3] = [
    "crates/flick/tests/programs/packets/flow_tracker.flick",
    "crates/flick/tests/programs/packets/port_knocking.flick",
    "crates/flick/tests/programs/packets/balancer.flick",
];

#[test]
fn the_sample_packet_programs_check() {
    for p in PROGRAMS {
        let o = flick(&["check", "--bounds", p]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{p}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.starts_with(&format!("{p}: ok\n")), "{out}");
        assert!(out.contains("operations per input message"), "{out}");
    }
}

#[test]
fn the_library_checks_alone_and_is_formatted() {
    let o = flick(&["check", "lib/packet.flick"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = flick(&[
        "fmt",
        "--check",
        "lib/",
        "crates/flick/tests/programs/packets/",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_users_error_is_reported_in_the_users_file_and_line() {
    let dir = std::env::temp_dir().join(format!("flick-packet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.flick");
    std::fs::write(
        &path,
        "grammar packet\n\nproc P: (packet/- wire, -/packet out)\n  | wire => pass(out)\n\n\
         fun pass: (-/packet out, p: packet) -> ()\n  if is_tcp(p) and p.no_such_field = 1:\n    p => out\n",
    )
    .unwrap();
    let path_text = path.display().to_string();
    let o = flick(&["check", &path_text]);
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains(&format!("{path_text}:7:")), "{err}");
    assert!(err.contains("no_such_field"), "{err}");
    assert!(err.contains(": 1 error"), "{err}");
}

/// The library's functions on real frames: the frames parsed with the
/// `packet` unit, the program run by the interpreter over a host that
/// reads the record's fields from the parsed slots.
mod library {
    use flick_exec::{lower, Fault, Host, Module, Outcome, Sent, Value, Vm};
    use flick_wire::{Grammar, Progress, Slot};

    /// Parsed frames; message `i` is frame `i`.
    struct Frames {
        frames: Vec<(Vec<u8>, Vec<Slot>)>,
        /// Per field of the `packet` record, its slot in the unit.
        slots: Vec<usize>,
    }

    impl Host for Frames {
        fn bytes<'a>(&'a self, v: &'a Value) -> Option<&'a [u8]> {
            match v {
                Value::MsgBytes { msg, start, len } => self.frames[*msg as usize]
                    .0
                    .get(*start as usize..(*start + *len) as usize),
                Value::Bytes(b) => Some(b),
                _ => None,
            }
        }
        fn field(&mut self, msg: &Value, _: u16, field: u16) -> Result<Value, Fault> {
            let Value::Msg(m) = msg else {
                return Err(Fault::Kind("a record"));
            };
            let slots = &self.frames[*m as usize].1;
            Ok(match slots[self.slots[field as usize]] {
                Slot::Int(v) => Value::Int(v as i64),
                Slot::SInt(v) => Value::Int(v),
                Slot::Bytes { start, len } => Value::MsgBytes {
                    msg: *m,
                    start,
                    len,
                },
                _ => Value::None,
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
        fn message_len(&self, msg: &Value) -> Result<Value, Fault> {
            let Value::Msg(m) = msg else {
                return Err(Fault::Kind("a record"));
            };
            Ok(Value::Int(self.frames[*m as usize].0.len() as i64))
        }
    }

    fn eth(t: u16) -> Vec<u8> {
        let mut f: Vec<u8> = (1..=12).collect();
        f.extend_from_slice(&t.to_be_bytes());
        f
    }

    fn ip4(proto: u8, flags_frag: u16, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut h = vec![0x45, 0xb8, 0, 60, 0, 1];
        h.extend_from_slice(&flags_frag.to_be_bytes());
        h.extend_from_slice(&[64, proto, 0, 0]);
        h.extend_from_slice(&src);
        h.extend_from_slice(&dst);
        h
    }

    fn ip6(next: u8, src: u8, dst: u8) -> Vec<u8> {
        let mut h = vec![0x61, 0x21, 0x23, 0x45, 0, 8, next, 33];
        h.extend_from_slice(&[src; 16]);
        h.extend_from_slice(&[dst; 16]);
        h
    }

    fn tcp(src: u16, dst: u16, flags: u8) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&src.to_be_bytes());
        h.extend_from_slice(&dst.to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2, 0x50, flags, 0, 100, 0, 0, 0, 0]);
        h
    }

    fn udp(src: u16, dst: u16) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&src.to_be_bytes());
        h.extend_from_slice(&dst.to_be_bytes());
        h.extend_from_slice(&[0, 8, 0, 0]);
        h
    }

    const A: [u8; 4] = [10, 0, 0, 1];
    const B: [u8; 4] = [192, 168, 1, 2];

    /// The frames, by name, in message order.
    fn frames() -> Vec<(&'static str, Vec<u8>)> {
        let arp = [
            0, 1, 8, 0, 6, 4, 0, 1, 1, 2, 3, 4, 5, 6, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2,
        ];
        vec![
            (
                "syn a>b",
                [eth(0x800), ip4(6, 0, A, B), tcp(40000, 22, 0x02)].concat(),
            ),
            (
                "synack b>a",
                [eth(0x800), ip4(6, 0, B, A), tcp(22, 40000, 0x12)].concat(),
            ),
            (
                "dns6 a>b",
                [eth(0x86dd), ip6(17, 1, 2), udp(5353, 53)].concat(),
            ),
            (
                "dns6 b>a",
                [eth(0x86dd), ip6(17, 2, 1), udp(53, 5353)].concat(),
            ),
            (
                "icmp a>b",
                [eth(0x800), ip4(1, 0, A, B), vec![8, 0, 0, 0, 0, 1, 0, 7]].concat(),
            ),
            ("arp", [eth(0x806), arp.to_vec()].concat()),
            (
                "vlan udp",
                [
                    eth(0x8100),
                    vec![0x20, 0x05, 0x08, 0x00],
                    ip4(17, 0, A, B),
                    udp(1, 2),
                ]
                .concat(),
            ),
            (
                "fragment",
                [eth(0x800), ip4(6, 0x0010, A, B), tcp(1, 2, 2)].concat(),
            ),
        ]
    }

    const PROBE: &str = "grammar packet

fun facts: (p: packet) -> (list<bool>)
  [is_ip(p), is_ip4(p), is_ip6(p), is_arp(p), is_tcp(p), is_udp(p), is_icmp(p), is_frag(p),
   has_vlan(p), is_dns(p), is_syn(p), is_syn_only(p), is_ack(p), is_fin(p), is_rst(p),
   has_port(p, 22), has_src_port(p, 22), has_dst_port(p, 22),
   has_addr(p, \"10.0.0.0/8\"), has_src_addr(p, \"10.0.0.0/8\"), has_dst_addr(p, \"10.0.0.0/8\")]

fun props: (p: packet) -> (list<integer>)
  [ip_ttl(p), ip_tos(p), ip_proto(p), tcp_flags(p), src_port(p), dst_port(p), src_ip(p), dst_ip(p),
   frame_len(p)]

fun same: (p: packet, q: packet) -> (list<bool>)
  [flow_key5(p) = flow_key5(q), flow_key3(p) = flow_key3(q), flow_key2(p) = flow_key2(q),
   sym_flow_key5(p) = sym_flow_key5(q), sym_flow_key3(p) = sym_flow_key3(q),
   sym_flow_key2(p) = sym_flow_key2(q), src_key(p) = src_key(q)]
";

    struct Probe {
        module: Module,
        host: Frames,
        names: Vec<&'static str>,
    }

    impl Probe {
        fn new() -> Probe {
            flick_grammars::install();
            let source = flick::views::program_source(PROBE);
            let (checked, diags) =
                flick::views::check_program(std::path::Path::new("probe.flick"), &source);
            assert!(diags.is_empty(), "{diags:?}");
            let (program, _) = flick_syntax::parse(&source);
            let module = lower(&program, &checked).expect("lowers");
            let g = Grammar::stock("packet").expect("stock");
            let unit = g.unit_id("packet").expect("the flat unit");
            let record = checked.record("packet").expect("the library's record");
            let slots = record
                .fields
                .iter()
                .map(|f| {
                    let name = f.name.as_deref().expect("named");
                    g.field_slot(unit, name).expect("a field of the unit") as usize
                })
                .collect();
            let mut names = Vec::new();
            let mut parsed = Vec::new();
            for (name, frame) in frames() {
                let mut p = g.parser(unit);
                assert!(matches!(p.parse(&frame), Ok(Progress::Done(_))), "{name}");
                parsed.push((frame, p.slots().to_vec()));
                names.push(name);
            }
            Probe {
                module,
                host: Frames {
                    frames: parsed,
                    slots,
                },
                names,
            }
        }

        fn msg(&self, name: &str) -> Value {
            Value::Msg(self.names.iter().position(|n| *n == name).expect("a frame") as u32)
        }

        fn run(&mut self, f: &str, args: &[&str]) -> Vec<Value> {
            let args: Vec<Value> = args.iter().map(|a| self.msg(a)).collect();
            let m = &self.module;
            let id = m.functions.iter().position(|x| x.name == f).expect("fun") as u16;
            let mut vm = Vm::for_function(m, id);
            vm.start(m, id, &args);
            match vm.run(
                m,
                &mut self.host,
                &mut flick_runtime::Timeslice::unlimited(),
            ) {
                Ok(Outcome::Done(Value::List(l))) => l.to_vec(),
                other => panic!("{f}{args:?}: {other:?}"),
            }
        }
    }

    fn bools(v: &[Value]) -> String {
        v.iter()
            .map(|b| match b {
                Value::Bool(true) => '1',
                Value::Bool(false) => '0',
                _ => '?',
            })
            .collect()
    }

    #[test]
    fn predicates_on_every_kind_of_frame() {
        let mut p = Probe::new();
        // ip ip4 ip6 arp tcp udp icmp frag | vlan dns syn synonly ack fin rst |
        // port22 src22 dst22 | addr src dst
        for (frame, want) in [
            ("syn a>b", "11001000|0011000|101|110"),
            ("synack b>a", "11001000|0010100|110|101"),
            ("dns6 a>b", "10100100|0100000|000|000"),
            ("icmp a>b", "11000010|0000000|000|110"),
            ("arp", "00010000|0000000|000|000"),
            ("vlan udp", "11000100|1000000|000|110"),
            ("fragment", "11000001|0000000|000|110"),
        ] {
            let got = bools(&p.run("facts", &[frame]));
            assert_eq!(got, want.replace('|', ""), "{frame}");
        }
    }

    #[test]
    fn properties_and_absent_headers() {
        let mut p = Probe::new();
        let int = |i: i64| Value::Int(i);
        assert_eq!(
            p.run("props", &["syn a>b"]),
            [
                int(64),
                int(0xb8),
                int(6),
                int(2),
                int(40000),
                int(22),
                int(0x0a00_0001),
                int(0xc0a8_0102),
                int(54)
            ]
        );
        // IPv6: hop limit and traffic class; no IPv4 addresses.
        assert_eq!(
            p.run("props", &["dns6 a>b"]),
            [
                int(33),
                int(0x12),
                int(17),
                Value::None,
                int(5353),
                int(53),
                Value::None,
                Value::None,
                int(62)
            ]
        );
        // ARP: no IP, no ports.
        let arp = p.run("props", &["arp"]);
        assert!(arp[..8].iter().all(|v| *v == Value::None), "{arp:?}");
    }

    #[test]
    fn flow_keys_tell_flows_and_directions_apart() {
        let mut p = Probe::new();
        // key5 key3 key2 sym5 sym3 sym2 src
        for (a, b, want) in [
            ("syn a>b", "syn a>b", "1111111"),
            ("syn a>b", "synack b>a", "0001110"),
            ("dns6 a>b", "dns6 b>a", "0001110"),
            // Same addresses, another protocol: only the address keys agree.
            ("syn a>b", "icmp a>b", "0010011"),
            ("syn a>b", "arp", "0000000"),
            ("arp", "arp", "1111111"),
        ] {
            assert_eq!(bools(&p.run("same", &[a, b])), want, "{a} and {b}");
        }
    }
}
