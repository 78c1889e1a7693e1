//! Dictionaries of integers, booleans and strings in a socket program run
//! with `flick run`, answering real HTTP clients over loopback: a count per
//! target kept in a `dict<string*integer>` across many clients (one after
//! another, and at once) and both workers, the target kept in a `dict<string*string {max=32}>` (a field of
//! the request) and a flag in a `dict<string*bool>`; a missing key reads as
//! `None`, and a full dictionary evicts its oldest entry. Every process is
//! killed when its test ends, and every read is bounded in time.

mod support;

use std::time::{Duration, Instant};
use support::http::{ask_until, get, get_until_answered, COUNTS};
use support::{start_flick, Procs};

/// How long a request may wait while a version starts or stops.
const WAIT: Duration = Duration::from_secs(2);

/// A program file removed when the test ends.
struct Program(std::path::PathBuf);

impl Program {
    fn new(name: &str) -> Program {
        let p = std::env::temp_dir().join(format!(
            "flick-dict-values-{}-{name}.flick",
            std::process::id()
        ));
        std::fs::write(&p, COUNTS).unwrap();
        Program(p)
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn run(procs: &mut Procs, program: &Program, more: &[&str]) -> u16 {
    let listen = format!("client=127.0.0.1:{}", support::free_port());
    let mut args = vec!["run", program.0.to_str().unwrap(), "--listen", &listen];
    args.extend(more);
    let port = start_flick(procs, &args);
    // Listening is not yet answering at once: a first request (a target of
    // its own each time, older than any a test asks for) may wait past its
    // time, and is asked again.
    let deadline = Instant::now() + Duration::from_secs(20);
    let never = "flick run never answered";
    ask_until(port, "/warm", WAIT, deadline, never, |_, _| true);
    port
}

#[test]
fn counts_per_key_are_kept_across_clients_and_workers() {
    let program = Program::new("counts");
    let mut procs = Procs(Vec::new());
    let port = run(&mut procs, &program, &[]);
    assert_eq!(get(port, "/k"), ("New".into(), "1".into()));
    assert_eq!(get(port, "/k"), ("Second".into(), "2".into()));
    assert_eq!(get(port, "/k"), ("/k".into(), "3".into()));
    // Forty clients one after another, each on a connection of its own
    // (accepted by either worker): every request counted.
    for _ in 0..40 {
        assert_eq!(get(port, "/k").0, "/k");
    }
    assert_eq!(get(port, "/k"), ("/k".into(), "44".into()));
    // Eight clients at once, ten requests each: every one answered from
    // the dictionary. A read and a set are each whole, but an increment
    // on one worker may interleave with one on the other (as for any
    // `global`), so the count grows by at most the requests made.
    let clients: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let (reason, body) = get(port, "/k");
                    assert_eq!(reason, "/k");
                    let n: u32 = body.parse().unwrap();
                    assert!((45..=124).contains(&n), "{n}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let n: u32 = get(port, "/k").1.parse().unwrap();
    assert!((46..=125).contains(&n), "{n}");
    // Another key counts apart; a long target is kept whole.
    let long = format!("/{}", "x".repeat(30));
    assert_eq!(get(port, &long), ("New".into(), "1".into()));
    assert_eq!(get(port, &long).1, "2");
    assert_eq!(get(port, &long), (long.clone(), "3".into()));
    assert_eq!(get(port, "/k").1, (n + 1).to_string());
    // curl, a client of its own, counted too.
    let curl = std::process::Command::new("curl")
        .args(["-s", "--max-time", "10"])
        .arg(format!("http://127.0.0.1:{port}/k"))
        .output()
        .expect("curl runs");
    assert!(curl.status.success(), "{curl:?}");
    assert_eq!(String::from_utf8_lossy(&curl.stdout), (n + 2).to_string());
}

#[test]
fn a_full_dictionary_of_values_evicts_its_oldest_entry() {
    let program = Program::new("evict");
    let mut procs = Procs(Vec::new());
    let port = run(&mut procs, &program, &["--dict-capacity", "2"]);
    // The warm-up's entries are the oldest: /a and /b push them out.
    assert_eq!(get(port, "/a").0, "New");
    assert_eq!(get(port, "/b").0, "New");
    assert_eq!(get(port, "/b").1, "2");
    // /b was replaced, not inserted: /a is still the oldest, and goes.
    assert_eq!(get(port, "/c").0, "New");
    assert_eq!(get(port, "/b"), ("/b".into(), "3".into()));
    assert_eq!(get(port, "/a"), ("New".into(), "1".into()), "evicted: None");
    // /a came back in /b's place, the oldest then.
    assert_eq!(get(port, "/c").1, "2");
    assert_eq!(get(port, "/b"), ("New".into(), "1".into()));
}

/// `flick run`'s reload on SIGHUP carries dictionaries of values into the
/// new version, entry by entry.
#[test]
fn dictionaries_of_values_survive_flick_runs_reload() {
    let program = Program::new("reload");
    let mut procs = Procs(Vec::new());
    let port = run(&mut procs, &program, &[]);
    for _ in 0..3 {
        get(port, "/a");
    }
    std::fs::write(&program.0, COUNTS.replace("\"New\"", "\"Fresh\"")).unwrap();
    support::hup(&procs.0[0]);
    // A target never asked before, each time, until the new version answers.
    let deadline = Instant::now() + Duration::from_secs(20);
    let never = "the new version never answered";
    ask_until(port, "/z", WAIT, deadline, never, |reason, _| {
        reason == "Fresh"
    });
    let (reason, _) = get_until_answered(port, "/a", WAIT, deadline);
    assert_eq!(reason, "/a", "the target kept was carried over");
    assert_eq!(get(port, "/a").1, "5", "so was the count");
}
