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
