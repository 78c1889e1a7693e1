//! Machines written in Flick's own syntax (`machine` items), run by the
//! `flick` binary over pcap files the test writes: port knocking in the
//! new syntax (`examples/flowblaze/port_knocking.flick`) sends exactly
//! the frames its XL original sends, and leaves the same state; `flick
//! check` reports a machine's mistakes with file, line, column and caret.

use flick_packet_io::{read_pcap, write_pcap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SEC: u64 = 1_000_000_000;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/flowblaze")
}

/// A directory of the test's own, removed when the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d =
            std::env::temp_dir().join(format!("flick-machine-lang-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An Ethernet + IPv4 + TCP frame with four bytes of payload.
fn tcp(src: u32, dst: u32, dport: u16) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 20 + 4];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&44u16.to_be_bytes());
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&src.to_be_bytes());
    f[30..34].copy_from_slice(&dst.to_be_bytes());
    f[34..36].copy_from_slice(&40000u16.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    f[46] = 0x50;
    f[47] = 0x02;
    f
}

type Frames = Vec<(Vec<u8>, u64)>;

fn flick(args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flick"))
        .args(args)
        .output()
        .unwrap()
}

/// Runs `program` with its two ports named `names` (inputs and outputs
/// alike); returns what each port got, and the dump.
fn run(
    dir: &Scratch,
    program: &Path,
    names: [&str; 2],
    inputs: [&Frames; 2],
    workers: usize,
) -> (Vec<Frames>, String) {
    let tag = format!(
        "{}-{workers}",
        program.extension().unwrap().to_string_lossy()
    );
    let mut args = vec!["run".to_string(), program.display().to_string()];
    for (name, frames) in names.iter().zip(inputs) {
        let p = dir.path(&format!("in-{name}.pcap"));
        write_pcap(&p, frames).unwrap();
        args.push("--port".into());
        args.push(format!("{name}=pcap:{}", p.display()));
        args.push("--port".into());
        args.push(format!(
            "{name}=pcap-out:{}",
            dir.path(&format!("out-{name}-{tag}.pcap")).display()
        ));
    }
    let dump = dir.path(&format!("dump-{tag}.json"));
    args.extend([
        "--workers".into(),
        workers.to_string(),
        "--dump".into(),
        dump.display().to_string(),
    ]);
    let o = flick(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let outputs = names
        .iter()
        .map(|n| read_pcap(&dir.path(&format!("out-{n}-{tag}.pcap"))).unwrap())
        .collect();
    (outputs, std::fs::read_to_string(dump).unwrap())
}

const A: u32 = 0xc633_6401;
const B: u32 = 0xc633_6402;
const C: u32 = 0xc633_6403;
const SERVER: u32 = 0x0a00_0005;

#[test]
fn port_knocking_in_flick_sends_what_the_xl_original_sends() {
    let outside: Frames = vec![
        (tcp(A, SERVER, 22), 0),
        (tcp(A, SERVER, 1111), SEC),
        (tcp(B, SERVER, 1111), SEC + 1),
        (tcp(A, SERVER, 2222), 2 * SEC),
        (tcp(B, SERVER, 3333), 2 * SEC + 1),
        (tcp(A, SERVER, 3333), 3 * SEC),
        (tcp(A, SERVER, 22), 4 * SEC),
        (tcp(B, SERVER, 22), 4 * SEC + 1),
        (tcp(A, SERVER, 80), 5 * SEC),
        (tcp(C, SERVER, 1111), 5 * SEC + 1),
        (tcp(A, SERVER, 22), 6 * SEC),
        (tcp(A, SERVER, 22), 17 * SEC),
        (tcp(C, SERVER, 2222), 17 * SEC + 1),
        (tcp(B, SERVER, 1111), 18 * SEC),
    ];
    let inside: Frames = vec![
        (tcp(SERVER, A, 40000), 4 * SEC + 500),
        (tcp(SERVER, B, 40000), 16 * SEC),
    ];
    let dir = Scratch::new("knocking");
    let (xl, xl_dump) = run(
        &dir,
        &examples().join("port_knocking.xl"),
        ["1", "2"],
        [&outside, &inside],
        1,
    );
    for workers in [1, 2] {
        let (flick, dump) = run(
            &dir,
            &examples().join("port_knocking.flick"),
            ["outside", "inside"],
            [&outside, &inside],
            workers,
        );
        assert_eq!(flick, xl, "{workers} workers");
        assert_eq!(dump, xl_dump, "{workers} workers");
    }
    assert_eq!(xl[0], inside, "everything from inside goes out");
    assert_eq!(xl[1], vec![outside[6].clone(), outside[10].clone()]);
    // Ports by number, as for XL.
    let (by_number, _) = run(
        &dir,
        &examples().join("port_knocking.flick"),
        ["1", "2"],
        [&outside, &inside],
        1,
    );
    assert_eq!(by_number, xl);
}

#[test]
fn check_shows_a_machines_mistakes_with_line_column_and_caret() {
    let dir = Scratch::new("check");
    let text = std::fs::read_to_string(examples().join("port_knocking.flick"))
        .unwrap()
        .replace("next knocked2\n", "next knocked3\n")
        .replace("forward outside", "forward outsid");
    let path = dir.path("broken.flick");
    std::fs::write(&path, &text).unwrap();
    let o = flick(&["check".into(), path.display().to_string()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    let line = text.lines().position(|l| l.contains("knocked3")).unwrap() + 1;
    assert!(err.contains("no state `knocked3`"), "{err}");
    assert!(err.contains(&format!("broken.flick:{line}:")), "{err}");
    assert!(err.contains("no channel `outsid`"), "{err}");
    assert!(err.contains('^'), "{err}");
}

#[test]
fn check_bounds_sizes_each_stages_table() {
    let o = flick(&[
        "check".into(),
        "--bounds".into(),
        examples().join("port_knocking.flick").display().to_string(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("stage knocking: table of 4104 contexts, 32 bytes per context"),
        "{out}"
    );
    // The whole table: at least its contexts, at most twice them (records
    // padded to a power of two words) and its indexes.
    let total: usize = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("flow tables: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no flow tables line: {out}"));
    assert!(
        (4104 * 32..4104 * 64 + 64 * 1024).contains(&total),
        "{total} bytes: {out}"
    );
}

#[test]
fn the_example_is_in_canonical_layout() {
    let o = flick(&[
        "fmt".into(),
        "--check".into(),
        examples().join("port_knocking.flick").display().to_string(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_port_named_after_no_channel_is_refused() {
    let o = flick(&[
        "run".into(),
        examples().join("port_knocking.flick").display().to_string(),
        "--port".into(),
        "outsde=pcap:/nonexistent.pcap".into(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the machine's channels are outside, inside"),
        "{err}"
    );
}
