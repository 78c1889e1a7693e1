use super::*;
use crate::engine::Program;
use std::path::Path;

fn examples() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/flowblaze")
}

/// The first diagnostic's code and the text under its span.
fn error(src: &str) -> (String, String, String) {
    let diags = compile(src).expect_err("should not compile");
    let d = &diags[0];
    let span = d.span();
    (
        d.code.to_string(),
        d.message.clone(),
        src[span.range()].to_string(),
    )
}

#[test]
fn port_knocking_lowers_to_the_xl_programs_machine_and_tables() {
    let text = std::fs::read_to_string(examples().join("port_knocking.flick")).unwrap();
    let lowered = compile(&text).unwrap();
    let xl = crate::xl::load(&examples().join("port_knocking.xl")).unwrap();
    assert_eq!(lowered.machine, xl);
    assert_eq!(lowered.channels, ["outside", "inside"]);
    assert_eq!(lowered.port("inside"), Some(2));
    let (a, b) = (
        Program::new(lowered.machine).unwrap(),
        Program::new(xl).unwrap(),
    );
    assert_eq!(a.tables, b.tables);
}

const HEAD: &str = "grammar packet\n\nmachine m: (packet/packet a, packet/packet b)\n";

fn with(body: &str) -> String {
    format!("{HEAD}{body}")
}

#[test]
fn meta_stateless_stages_drop_and_set_lower() {
    let src = with(
        "  global seen: integer := 0
  meta class: integer
  stage classify:
    on packet when tcp.dport = 22: meta.class := 1; goto count
    on packet when ipv4.src = 10.0.0.1: drop
    on packet: set ipv4.ttl := 9; goto count
  stage count:
    key ipv4.src
    capacity 16
    evict oldest
    hard_timeout 5ms
    flow n: integer := 0
    states counting
    in any on packet when meta.class = 1: n := n + 1; seen := max(seen, n); forward b
    in any on packet: n := n % 3; forward a
",
    );
    let l = compile(&src).unwrap();
    let m = &l.machine;
    assert_eq!(m.meta, ["class"]);
    let (classify, count) = (&m.stages[0], &m.stages[1]);
    assert!(classify.stateless() && !count.stateless());
    assert_eq!(classify.transitions[0].next_stage, Some(1));
    assert_eq!(
        classify.transitions[0].updates,
        [Update {
            target: Target::Meta(0),
            expr: Expr::Operand(Operand::Const(1))
        }]
    );
    assert_eq!(
        classify.transitions[1].when[0].rhs,
        Operand::Const(0x0a00_0001)
    );
    assert!(classify.transitions[1].drop);
    assert_eq!(classify.transitions[2].writes.len(), 1);
    assert_eq!(count.capacity, 16);
    assert_eq!(count.eviction, Eviction::Oldest);
    assert_eq!(count.hard_timeout_us, Some(5_000));
    assert_eq!(count.transitions[0].ports, 1 << 2);
    assert_eq!(
        count.transitions[0].updates[1].expr,
        Expr::Binary(ArithOp::Max, Operand::GlobalReg(0), Operand::FlowReg(0))
    );
    assert!(m.single_worker(), "writes a global");
    assert_eq!(m.steering_stage(), Some(1));
}

#[test]
fn each_static_rule_has_its_diagnostic() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "  stage s:\n    key ipv4.sorce\n    states x\n",
            E_UNKNOWN,
            "ipv4.sorce",
        ),
        (
            "  stage s:\n    key ipv4.src\n    states x\n    in x on packet: next y\n",
            E_UNKNOWN,
            "y",
        ),
        (
            "  stage s:\n    key ipv4.src\n    states x\n    in x on packet: forward c\n",
            E_UNKNOWN,
            "c",
        ),
        (
            "  stage s:\n    key ipv4.src\n    states x\n    in x on packet: r := 1\n",
            E_UNKNOWN,
            "r := 1",
        ),
        (
            "  stage s:\n    key ipv4.src\n    states x\n    in x on packet when q = 1: drop\n",
            E_UNKNOWN,
            "q",
        ),
        (
            "  stage s:\n    key ipv4.src\n    states x\n    in x on packet: goto s\n",
            E_BACKWARD,
            "s",
        ),
        (
            "  stage s:\n    on packet: goto t\n  stage t:\n    on packet: goto s\n",
            E_BACKWARD,
            "s",
        ),
        (
            "  stage s:\n    key ipv4.src, ipv4.dst, tcp.sport, tcp.dport, ipv4.proto, ipv4.tos, ipv4.ttl, ipv4.id, eth.type\n    states x\n",
            E_KEY,
            "key ipv4.src, ipv4.dst, tcp.sport, tcp.dport, ipv4.proto, ipv4.tos, ipv4.ttl, ipv4.id, eth.type",
        ),
        (
            "  stage s:\n    key biflow (ipv4.src) (ipv4.dst, tcp.dport)\n    states x\n",
            E_KEY,
            "key biflow (ipv4.src) (ipv4.dst, tcp.dport)",
        ),
        (
            "  stage s:\n    key now\n    states x\n",
            E_KEY,
            "now",
        ),
        (
            "  global g: string := 0\n  stage s:\n    on packet: drop\n",
            E_TYPE,
            "string",
        ),
        (
            "  stage s:\n    key ipv4.src\n    capacity 0\n    states x\n",
            E_CAPACITY,
            "0",
        ),
        (
            "  stage s:\n    key ipv4.src\n    capacity 100000000\n    states x\n",
            E_CAPACITY,
            "100000000",
        ),
        (
            "  stage s:\n    flow n: integer := 0\n    on packet: drop\n",
            E_PLACE,
            "flow n: integer := 0",
        ),
        (
            "  stage s:\n    key ipv4.src\n    states x\n    in x on idle_timeout: forward a\n",
            E_PLACE,
            "forward a",
        ),
        (
            "  stage s:\n    key ipv4.src\n    states x\n    in x on packet: forward a; drop\n",
            E_CONFLICT,
            "drop",
        ),
        (
            "  stage s:\n    key ipv4.src\n    states x\n    on packet: drop\n",
            E_MISSING,
            "packet",
        ),
        (
            "  stage s:\n    key ipv4.src\n",
            E_MISSING,
            "s",
        ),
        (
            "  const a = 1\n  stage s:\n    on packet: drop\n",
            E_TWICE,
            "a",
        ),
        (
            "  stage s:\n    key ipv4.src\n    states x\n    in x on packet: set vlan.id := 1\n",
            E_PLACE,
            "vlan.id",
        ),
        (
            "  stage s:\n    key ipv4.src\n    states x\n    in x on arrival: drop\n",
            E_UNKNOWN,
            "arrival",
        ),
    ];
    for (body, code, under) in cases {
        let src = with(body);
        let (c, message, text) = error(&src);
        assert_eq!(
            (c.as_str(), text.as_str()),
            (*code, *under),
            "{body}: {message}"
        );
    }
}

#[test]
fn more_than_64_conditions_in_a_stage_are_refused() {
    let mut body = String::from("  stage s:\n    key ipv4.src\n    states x\n");
    for i in 0..65 {
        body.push_str(&format!(
            "    in x on packet when tcp.dport = {i}: forward a\n"
        ));
    }
    let (code, message, text) = error(&with(&body));
    assert_eq!(
        (code.as_str(), text.as_str()),
        (E_CONDITIONS, "s"),
        "{message}"
    );
}

#[test]
fn a_channel_that_is_not_one_and_a_program_without_a_machine() {
    let (code, _, text) = error("machine m: (n: integer)\n  stage s:\n    on packet: drop\n");
    assert_eq!((code.as_str(), text.as_str()), (E_CHANNEL, "integer"));
    let diags = compile("grammar packet\n").unwrap_err();
    assert_eq!(diags[0].code, E_MACHINES);
    let (code, _, text) =
        error("grammar http\n\nmachine m: (packet/packet a)\n  stage s:\n    on packet: drop\n");
    assert_eq!((code.as_str(), text.as_str()), (E_MACHINES, "http"));
}

#[test]
fn every_problem_is_reported() {
    let diags = compile(&with(
        "  stage s:\n    key ipv4.src\n    states x\n    in y on packet: next z; forward c\n",
    ))
    .unwrap_err();
    assert_eq!(diags.len(), 3, "{diags:?}");
}

mod no_panic {
    use super::*;
    use proptest::prelude::*;

    /// Pieces of machines, shuffled: every text lowers or is refused with
    /// diagnostics, and nothing panics.
    const PIECES: &[&str] = &[
        "machine m: (packet/packet a, packet/packet b)\n",
        "  const C = 10.0.0.1\n",
        "  global g: integer := C\n",
        "  meta k: integer\n",
        "  stage s:\n",
        "  stage t:\n",
        "    key ipv4.src, tcp.dport\n",
        "    key biflow (ipv4.src) (ipv4.dst)\n",
        "    idle_timeout 18446744073709551615s\n",
        "    capacity 4\n",
        "    flow n: integer := 1\n",
        "    states x, y\n",
        "    in x on packet when from a, n > g: n := n % 0; next y; forward b\n",
        "    in any on idle_timeout: next x\n",
        "    on packet when meta.k = len: meta.k := max(now, in_port); goto t\n",
        "    in y on table_full: set ipv4.ttl := n; drop\n",
        "    in y on packet:\n      g := g - 1\n      goto s\n",
        "proc p: (-/- c)\n  c => c\n",
        "#\n",
        ";%:=(",
    ];

    proptest! {
        #[test]
        fn any_arrangement_of_pieces_compiles_or_is_refused(
            picks in proptest::collection::vec(0..PIECES.len(), 0..14)
        ) {
            let text: String = picks.iter().map(|&i| PIECES[i]).collect();
            if let Ok(l) = compile(&text) {
                let _ = Program::new(l.machine);
            }
        }
    }
}

/// `at` says where `set` writes a field; XL knows it only for fields a
/// `PacketField` places, so machines are compared without it.
fn without_places(mut m: Machine) -> Machine {
    for f in &mut m.fields {
        if let FieldSource::Unit { at, .. } = &mut f.source {
            *at = None;
        }
    }
    m
}

#[test]
fn every_flick_example_lowers_to_its_xl_originals_machine() {
    let mut pairs = 0;
    for e in std::fs::read_dir(examples()).unwrap() {
        let path = e.unwrap().path();
        let xl = path.with_extension("xl");
        if path.extension().is_none_or(|x| x != "flick") || !xl.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let ours = compile(&text)
            .unwrap_or_else(|d| panic!("{}: {d:#?}", path.display()))
            .machine;
        let theirs = crate::xl::load(&xl).unwrap();
        let (a, b) = (
            Program::new(ours.clone()).unwrap(),
            Program::new(theirs.clone()).unwrap(),
        );
        assert_eq!(a.tables, b.tables, "{}", path.display());
        assert_eq!(
            without_places(ours),
            without_places(theirs),
            "{}",
            path.display()
        );
        pairs += 1;
    }
    assert!(pairs >= 1);
}
