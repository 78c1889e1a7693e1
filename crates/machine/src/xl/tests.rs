use super::*;
use crate::fields::FieldSource;
use crate::model::{ArithOp, CmpOp, Condition, Event, Eviction, Expr, Operand, Target, Update};

fn err_at(text: &str) -> (usize, usize, String) {
    match parse_str("t.xl", text) {
        Err(XlError::At {
            line, col, message, ..
        }) => (line, col, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

const EVERY: &str = r#"
/* Headers, constants, registers and actions at file level. */
PacketField ipv4 {
    src = packet.data[26:+4];   // agrees with the grammar: read from the unit
    dst = packet.data[30:+4];
}
PacketField raw { b = packet.data[5]; mac = packet.data[0:+6]; }
Constant PKT = 255, LIMIT = 3, HOST = "10.0.0.1";
Register global total = 7;
Action forward { sendPacket(PKT, 1); }

Stage first {
    Register count, last = 1;
    Register local seen;
    Register global peak;
    Action mark { setField(raw.b, PKT, 0xaa); }
    setFlowKey(ipv4.src, ipv4.dst);
    setIdleTimeout(1000);
    setHardTimeout(5000);
    setTableSize(128);
    setEvictionPolicy(oldest);

    State initial idle {
        on (pktRcvd) {
            count = count + 1;
            if (count < LIMIT, pktRcvd.port == 1) {
                forward();
                setNextState(busy);
            }
            if (ipv4.src == HOST) { serial { mark(); sendPacket(PKT, 2); } }
        }
    }
    State busy {
        on (pktRcvd) {
            if (currentTime >= last) {
                last = max(last, currentTime);
                peak = count * 2;
                total = total - 1;
                seen = pktRcvd.len % 100;
                setNextStage(second);
            }
        }
        on (idleTimeout) { count = 0; setNextState(idle); }
        on (hardTimeout) { count = count / 2; }
        on (tableFull) { sendPacket(PKT, 0); }
    }
    State any {
        on (pktRcvd) { if (tcp.dport != 22) { sendPacket(PKT, 3); } }
    }
}

Stage second {
    setBiflowKey(ipv4.src, tcp.sport, ipv4.dst, tcp.dport);
    State initial only { sendPacket(PKT, 4); }
}
"#;

#[test]
fn every_construct_lowers() {
    let m = parse_str("t.xl", EVERY).unwrap();
    let names: Vec<&str> = m.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "ipv4.src",
            "ipv4.dst",
            "raw.b",
            "pktRcvd.len",
            "tcp.dport",
            "tcp.sport"
        ]
        .iter()
        .copied()
        .filter(|n| *n != "pktRcvd.len")
        .collect::<Vec<_>>()
    );
    assert!(matches!(
        m.fields[0].source,
        FieldSource::Unit {
            field: "ip_src",
            at: Some((26, 4)),
            ..
        }
    ));
    assert_eq!(m.fields[2].source, FieldSource::Bytes { offset: 5, len: 1 });
    assert!(matches!(
        m.fields[3].source,
        FieldSource::Unit {
            field: "dst_port",
            at: None,
            ..
        }
    ));
    let g: Vec<(&str, u64)> = m
        .globals
        .iter()
        .map(|g| (g.name.as_str(), g.init))
        .collect();
    assert_eq!(g, [("total", 7), ("peak", 0)]);
    let s = &m.stages[0];
    assert_eq!(s.key, [0, 1]);
    assert!(!s.biflow);
    assert_eq!(s.states, ["idle", "busy"]);
    assert_eq!(s.initial, 0);
    let regs: Vec<(&str, u64)> = s
        .flow_regs
        .iter()
        .map(|r| (r.name.as_str(), r.init))
        .collect();
    assert_eq!(regs, [("count", 0), ("last", 1), ("seen", 0)]);
    assert_eq!(s.idle_timeout_us, Some(1000));
    assert_eq!(s.hard_timeout_us, Some(5000));
    assert_eq!(s.capacity, 128);
    assert_eq!(s.eviction, Eviction::Oldest);
    // idle: two ifs and the fallback holding the event's own update.
    let t = &s.transitions;
    assert_eq!(t.len(), 2 + 1 + 1 + 1 + 1 + 1 + 1);
    assert_eq!(t[0].from, Some(0));
    assert_eq!(
        t[0].when,
        [
            Condition {
                lhs: Operand::FlowReg(0),
                op: CmpOp::Lt,
                rhs: Operand::Const(3)
            },
            Condition {
                lhs: Operand::InPort,
                op: CmpOp::Eq,
                rhs: Operand::Const(1)
            }
        ]
    );
    assert_eq!(
        t[0].updates,
        [Update {
            target: Target::FlowReg(0),
            expr: Expr::Binary(ArithOp::Add, Operand::FlowReg(0), Operand::Const(1))
        }]
    );
    assert_eq!(t[0].ports, 1 << 1);
    assert_eq!(t[0].next_state, Some(1));
    assert_eq!(t[1].when[0].rhs, Operand::Const(0x0a00_0001));
    assert_eq!(t[1].writes, [(2, Operand::Const(0xaa))]);
    assert_eq!(t[1].ports, 1 << 2);
    assert!(t[2].when.is_empty(), "the fallback row");
    assert_eq!(t[3].updates.len(), 4);
    assert_eq!(
        t[3].updates[0].expr,
        Expr::Binary(ArithOp::Max, Operand::FlowReg(1), Operand::Now)
    );
    assert_eq!(t[3].updates[1].target, Target::GlobalReg(1));
    assert_eq!(t[3].next_stage, Some(1));
    assert_eq!(t[4].event, Event::IdleTimeout);
    assert_eq!(t[5].event, Event::HardTimeout);
    assert_eq!(t[6].event, Event::TableFull);
    assert_eq!(t[6].ports, 0, "port 0 is drop");
    assert_eq!(t[7].from, None);
    let second = &m.stages[1];
    assert!(second.biflow);
    assert_eq!(second.key.len(), 4);
    assert_eq!(second.transitions.len(), 1);
    assert_eq!(second.transitions[0].ports, 1 << 4);
}

#[test]
fn imports_resolve_relative_to_the_importer() {
    let files = |p: &Path| -> std::io::Result<String> {
        match p.to_str().unwrap() {
            "dir/main.xl" => Ok("import \"hdr/h.xlh\";\nStage s { setFlowKey(x.y); State initial a { on(pktRcvd) { if (x.y == K) { sendPacket(255, 1); } } } }".into()),
            "dir/hdr/h.xlh" => Ok("import \"more.xlh\";\nPacketField x { y = packet.data[40:+2]; }".into()),
            "dir/hdr/more.xlh" => Ok("import \"h.xlh\"; Constant K = 9;".into()),
            _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
        }
    };
    let m = load_with(Path::new("dir/main.xl"), &files).unwrap();
    assert_eq!(
        m.fields[0].source,
        FieldSource::Bytes { offset: 40, len: 2 }
    );
    assert_eq!(m.stages[0].transitions[0].when[0].rhs, Operand::Const(9));
    let missing = |p: &Path| -> std::io::Result<String> {
        match p.to_str().unwrap() {
            "main.xl" => Ok("\n  import \"nope.xlh\";".into()),
            _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
        }
    };
    let e = load_with(Path::new("main.xl"), &missing).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("main.xl:2:10: cannot read nope.xlh"),
        "{e}"
    );
}

#[test]
fn errors_say_where() {
    let (l, c, m) = err_at("Stage s {\n  setFlowKey(ipv4.src);\n  State initial a { on(pktRcvd) { if (ipv4.src == ) {} } }\n}");
    assert_eq!((l, c), (3, 51));
    assert!(
        m.contains("expected a field, register, constant or value, found `)`"),
        "{m}"
    );
    let (l, c, m) = err_at("Stage s {\n  setFlowKey(ipv4.nope);\n  State initial a { }\n}");
    assert_eq!((l, c), (2, 14));
    assert!(m.contains("unknown packet field `ipv4.nope`"), "{m}");
    let (l, c, m) = err_at("Stage s { setFlowKey(ipv4.src); State a { } }");
    assert_eq!((l, c), (1, 7));
    assert!(m.contains("no initial state"), "{m}");
    let (_, c, m) =
        err_at("Stage s { setFlowKey(ipv4.src); State initial a { setNextState(b); } }");
    assert_eq!(c, 64);
    assert!(m.contains("no state `b`"), "{m}");
    let (_, _, m) = err_at("Stage s { setFlowKey(ipv4.src); State initial a { x = 1; } }");
    assert!(m.contains("`x` is not a register"), "{m}");
    let (_, _, m) = err_at("Stage s { State initial a { } }");
    assert!(m.contains("no flow key"), "{m}");
    let (_, _, m) = err_at("Stage s { setFlowKey(ipv4.src); State initial a { on(boom) { } } }");
    assert!(m.contains("unknown event `boom`"), "{m}");
    let (_, _, m) = err_at("Stage s { setFlowKey(ipv4.src); State initial a { on(idleTimeout) { sendPacket(255, 1); } } }");
    assert!(m.contains("a timeout has none"), "{m}");
    let (_, _, m) =
        err_at("Stage s { setFlowKey(ipv4.src); State initial a { sendPacket(255, 64); } }");
    assert!(m.contains("ports are numbered 1 to 63"), "{m}");
    let (_, _, m) =
        err_at("Stage s { setFlowKey(ipv4.src); State initial a { setField(ipv4.ttl, 255, 1); } }");
    assert!(m.contains("define `ipv4.ttl` with PacketField"), "{m}");
    let (_, _, m) = err_at("Stage s { setBiflowKey(ipv4.src); State initial a { } }");
    assert!(m.contains("an even number of fields"), "{m}");
    let (_, _, m) = err_at("PacketField f { x = packet.data[1:4]; }");
    assert!(m.contains("[OFFSET:+LENGTH]"), "{m}");
    let (l, c, m) = err_at("// comment\n/* never closed");
    assert_eq!((l, c), (2, 1));
    assert!(m.contains("never closed"), "{m}");
    let (_, _, m) = err_at("Event e = a == b;");
    assert!(m.contains("custom events"), "{m}");
    let (_, _, m) =
        err_at("Action a { a(); } Stage s { setFlowKey(ipv4.src); State initial x { a(); } }");
    assert!(m.contains("calls itself"), "{m}");
    let (_, _, m) = err_at("Stage s { setFlowKey(ipv4.src); State initial a { nope(); } }");
    assert!(m.contains("unknown action `nope`"), "{m}");
    let (_, _, m) = err_at(
        "Stage s { setFlowKey(ipv4.src); State initial a { on(pktRcvd) { if (q == 1) {} } } }",
    );
    assert!(m.contains("unknown name `q`"), "{m}");
    let (_, _, m) = err_at("Constant C = \"1.2.3\";");
    assert!(
        m.contains("neither an IPv4 address nor a MAC address"),
        "{m}"
    );
}

#[test]
fn addresses() {
    assert_eq!(address("10.0.0.1"), Some(0x0a00_0001));
    assert_eq!(address("aa:bb:cc:dd:ee:0f"), Some(0xaabb_ccdd_ee0f));
    assert_eq!(address("300.0.0.1"), None);
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Any text gives a machine or a positioned error, never a panic.
        #[test]
        fn any_text_loads_or_says_where(text in "[ -~\n\u{e9}]{0,200}") {
            if let Err(XlError::At { line, col, start, end, .. }) = parse_str("f.xl", &text) {
                prop_assert!(line >= 1 && col >= 1 && start <= end && start <= text.len());
            }
        }

        /// Fragments of real programs, shuffled, do the same.
        #[test]
        fn shuffled_tokens_load_or_say_where(picks in prop::collection::vec(0usize..24, 0..60)) {
            const T: [&str; 24] = ["Stage", "s", "{", "}", "State", "initial", "on", "(", ")", "pktRcvd",
                "if", "ipv4.src", "==", "1", ",", ";", "setFlowKey", "setNextState", "sendPacket",
                "255", "Register", "n", "=", "+"];
            let text = picks.iter().map(|&i| T[i]).collect::<Vec<_>>().join(" ");
            let _ = parse_str("f.xl", &text);
        }
    }
}

#[test]
fn a_table_size_over_the_bound_is_refused_with_the_capacity_code() {
    let program = |size: &str| {
        format!(
            "PacketField ipv4 {{ src = packet.data[26:+4]; }}\n\
             Stage s {{\n    setFlowKey(ipv4.src);\n    setTableSize({size});\n    State initial a {{ on (pktRcvd) {{ }} }}\n}}\n"
        )
    };
    let largest = crate::model::MAX_CAPACITY.to_string();
    let m = parse_str("t.xl", &program(&largest)).expect("the bound itself is accepted");
    assert_eq!(m.stages[0].capacity, crate::model::MAX_CAPACITY);
    for size in [
        (crate::model::MAX_CAPACITY + 1).to_string(),
        "0".to_string(),
    ] {
        let text = program(&size);
        match parse_str("t.xl", &text) {
            Err(e @ XlError::At { .. }) => {
                assert_eq!(e.code(), crate::lang::E_CAPACITY);
                let XlError::At {
                    line,
                    col,
                    start,
                    end,
                    message,
                    ..
                } = e
                else {
                    unreachable!()
                };
                assert_eq!((line, col), (4, 18), "{message}");
                assert_eq!(&text[start..end], size, "the caret is under the size");
                assert!(message.contains("1 to 16777216"), "{message}");
            }
            other => panic!("setTableSize({size}) accepted: {other:?}"),
        }
    }
}
