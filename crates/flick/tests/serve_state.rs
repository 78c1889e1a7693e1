//! A served program's `global` dictionaries as an operator reaches them
//! through a real `flick serve`: entries written (as a message's wire
//! bytes, text or base64), read, listed a page at a time and deleted over
//! the API and with `flick ctl`, the program answering from what was
//! written; dictionaries of integers, booleans and strings the same way,
//! with JSON values; a full dictionary, a value of the wrong kind and unknown names
//! refused with their status; a dictionary and a global carried over a
//! redeploy; and state saved while `serve` runs, so that a `serve` killed
//! with SIGKILL comes back with it. Every child process is killed when its
//! test ends, and every wait is bounded.

mod support;

use flick::api;
use serde_json::{json, Value as Json};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::http::{ask_until, get as http_get_reason, get_until_answered, http_program, COUNTS};
use support::serve::{call, ctl, ok, refused, serve, TempDir};
use support::terminate;
use support::{free_port, ROOT};

/// The body of the 200 answer to `GET target` over a new connection.
fn http_get(port: u16, target: &str) -> String {
    http_get_reason(port, target).1
}

/// A program that notes each request under its target and answers, for a
/// target noted already, the target of the request noted under it (which
/// an operator may have written). `seen`, a dictionary of integers, and
/// `pairs`, one of tuples, are declared and never written.
const NOTES: &str = http_program!(
    "proc Notes: (request/simple_response client)
  global hits := 0
  global notes := empty_dict
  global seen := empty_dict
  global pairs := empty_dict
  | client => respond(hits, notes, seen, pairs, client)

fun respond: (hits: ref integer, notes: ref dict<string*request>, seen: ref dict<string*integer>, pairs: ref dict<string*(integer, integer)>, -/simple_response client, req: request) -> ()
  hits := hits + 1
  if notes[req.target] = None:
    notes[req.target] := req
    simple_response(200, \"OK\", \"new\") => client
  else:
    simple_response(200, \"OK\", notes[req.target].target) => client
"
);

const WRITTEN: &str = "GET /written HTTP/1.1\r\nHost: x\r\n\r\n";

/// `flick ctl VERB NAME` of `program` (written as NAME.flick) listening
/// on `port`, its dictionaries holding `capacity` entries; what ctl said.
fn deploy_program(
    (dir, state): (&TempDir, &Path),
    verb: &str,
    name: &str,
    program: &str,
    capacity: usize,
    port: u16,
) -> String {
    let file = dir.file(&format!("{name}.flick"), program);
    let config = format!("dict_capacity = {capacity}\n");
    let config = dir.file(&format!("{name}.toml"), &config);
    let listen = format!("client=127.0.0.1:{port}");
    let args = [verb, name, &file, "--listen", &listen, "--config", &config];
    ok(&ctl(state, &args))
}

/// Deploys NOTES as `notes` on a free port, its dictionaries holding
/// `capacity` entries; the port.
fn deploy_notes(dir: &TempDir, state: &Path, capacity: usize) -> u16 {
    let port = free_port();
    deploy_program((dir, state), "deploy", "notes", NOTES, capacity, port);
    port
}

#[test]
fn dictionary_entries_are_written_read_listed_and_deleted() {
    let dir = TempDir::new("entries");
    let state = dir.0.join("state");
    let _server = serve(&state, &[]);
    let port = deploy_notes(&dir, &state, 3);

    // The program's own entry, read back whole.
    assert_eq!(http_get(port, "/a"), "new");
    assert_eq!(http_get(port, "/a"), "/a");
    let read = ok(&ctl(&state, &["read", "notes", "notes//a"]));
    assert!(read.contains("GET /a HTTP/1.1"), "{read}");

    // An entry written with ctl as text: the program answers from it.
    let out = ok(&ctl(&state, &["write", "notes", "notes//b", WRITTEN]));
    assert!(out.contains("GET /written"), "{out}");
    assert_eq!(http_get(port, "/b"), "/written");

    // One written over the API as base64.
    let (status, a) = call(
        &state,
        "PUT",
        "/services/notes/state/notes//c",
        Some(&json!({ "base64": api::base64_encode(b"GET /c64 HTTP/1.1\r\nHost: x\r\n\r\n") })),
    );
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["created"], json!(true));
    assert_eq!(
        (a["len"].clone(), a["capacity"].clone()),
        (json!(3), json!(3))
    );
    let (_, a) = call(&state, "GET", "/services/notes/state/notes//c", None);
    assert_eq!(
        api::base64_decode(a["base64"].as_str().unwrap()).unwrap(),
        b"GET /c64 HTTP/1.1\r\nHost: x\r\n\r\n"
    );

    // Listed a page at a time, oldest first.
    let (status, page) = call(&state, "GET", "/services/notes/state/notes?limit=2", None);
    assert_eq!(status, 200, "{page}");
    let keys = |p: &Json| -> Vec<String> {
        p["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["key"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(keys(&page), ["/a", "/b"]);
    assert_eq!(page["next"], json!(2));
    assert_eq!(page["len"], json!(3));
    let (_, page) = call(
        &state,
        "GET",
        "/services/notes/state/notes?limit=2&cursor=2",
        None,
    );
    assert_eq!(keys(&page), ["/c"]);
    assert_eq!(page["next"], Json::Null);
    let listing = ok(&ctl(&state, &["read", "notes", "notes"]));
    assert!(listing.contains("/b \"GET /written"), "{listing}");
    assert!(listing.contains("3 of 3 entries, capacity 3"), "{listing}");

    // Full: a new key is refused with the figures, an old one replaced.
    let err = refused(&ctl(&state, &["write", "notes", "notes//d", WRITTEN]));
    assert!(err.contains("3 entries of its capacity of 3"), "{err}");
    let (status, _) = call(
        &state,
        "PUT",
        "/services/notes/state/notes//d",
        Some(&json!({ "value": WRITTEN })),
    );
    assert_eq!(status, 409);
    let (status, a) = call(
        &state,
        "PUT",
        "/services/notes/state/notes//c",
        Some(&json!(WRITTEN)),
    );
    assert_eq!((status, a["created"].clone()), (200, json!(false)), "{a}");

    // Deleted: the program notes the target afresh.
    let out = ok(&ctl(&state, &["delete", "notes", "notes//a"]));
    assert!(out.contains("2 entries left"), "{out}");
    let err = refused(&ctl(&state, &["delete", "notes", "notes//a"]));
    assert!(err.contains("holds nothing under `/a`"), "{err}");
    assert_eq!(http_get(port, "/a"), "new");
}

#[test]
fn dictionary_writes_are_refused_with_their_status() {
    let dir = TempDir::new("refusals");
    let state = dir.0.join("state");
    let _server = serve(&state, &[]);
    deploy_notes(&dir, &state, 4);
    let put = |path: &str, body: Json| call(&state, "PUT", path, Some(&body));
    // Not a message of the dictionary's unit.
    let (status, a) = put("/services/notes/state/notes//x", json!("hello"));
    assert_eq!(status, 400, "{a}");
    assert!(a["error"].as_str().unwrap().contains("`request`"), "{a}");
    let (status, _) = put("/services/notes/state/notes//x", json!({ "base64": "!!" }));
    assert_eq!(status, 400);
    let (status, a) = put("/services/notes/state/notes//x", json!({ "value": 7 }));
    assert_eq!(status, 400, "{a}");
    // Not a dictionary, a message for a dictionary of integers, no such
    // variable or service.
    let (status, a) = put("/services/notes/state/hits/x", json!(WRITTEN));
    assert_eq!(status, 400, "{a}");
    assert!(
        a["error"].as_str().unwrap().contains("not a dictionary"),
        "{a}"
    );
    let (status, a) = put("/services/notes/state/seen/x", json!(WRITTEN));
    assert_eq!(status, 400, "{a}");
    assert!(
        a["error"].as_str().unwrap().contains("is an integer"),
        "{a}"
    );
    // A dictionary of tuples is neither written nor read.
    let (status, a) = put("/services/notes/state/pairs/x", json!(1));
    assert_eq!(status, 422, "{a}");
    let (status, a) = call(&state, "GET", "/services/notes/state/pairs/x", None);
    assert_eq!(status, 422, "{a}");
    // Before any instance has set them, globals take only their own kind.
    let (status, a) = put("/services/notes/state/hits", json!("abc"));
    assert_eq!(status, 400, "{a}");
    let (status, a) = put("/services/notes/state/notes", json!(1));
    assert_eq!(status, 400, "{a}");
    let (status, _) = put("/services/notes/state/nothing/x", json!(WRITTEN));
    assert_eq!(status, 404);
    let (status, _) = put("/services/nobody/state/notes//x", json!(WRITTEN));
    assert_eq!(status, 404);
    // A variable is not deleted; an entry that is not there is 404.
    let (status, _) = call(&state, "DELETE", "/services/notes/state/hits", None);
    assert_eq!(status, 405);
    let (status, _) = call(&state, "DELETE", "/services/notes/state/notes//zz", None);
    assert_eq!(status, 404);
    let (status, _) = call(&state, "GET", "/services/notes/state/notes//zz", None);
    assert_eq!(status, 404);
    // A listing's bounds.
    let (status, _) = call(
        &state,
        "GET",
        "/services/notes/state/notes?limit=5000",
        None,
    );
    assert_eq!(status, 400);
    let (status, _) = call(&state, "GET", "/services/notes/state/notes?cursor=x", None);
    assert_eq!(status, 400);
    let (status, a) = call(&state, "GET", "/services/notes/state/notes", None);
    assert_eq!(status, 200);
    assert_eq!(
        (a["len"].clone(), a["capacity"].clone()),
        (json!(0), json!(4)),
        "{a}"
    );
    let (status, _) = call(&state, "POST", "/services/notes/state/notes//x", None);
    assert_eq!(status, 405);
}

#[test]
fn a_dictionary_and_a_global_survive_a_redeploy() {
    let dir = TempDir::new("redeploy");
    let state = dir.0.join("state");
    let _server = serve(&state, &[]);
    let port = deploy_notes(&dir, &state, 16);
    assert_eq!(http_get(port, "/a"), "new");
    ok(&ctl(&state, &["write", "notes", "notes//b", WRITTEN]));
    // The new version answers otherwise for a new target: it is new.
    let fresh = NOTES.replace("\"new\"", "\"fresh\"");
    let out = deploy_program((&dir, &state), "redeploy", "notes", &fresh, 16, port);
    assert!(out.contains("version 2"), "{out}");
    assert!(out.contains("notes"), "{out}");
    assert!(out.contains("hits"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    // The old version drains; new connections reach the new one.
    while http_get(port, "/z") != "fresh" {
        assert!(Instant::now() < deadline, "the new version never answered");
    }
    assert_eq!(http_get(port, "/b"), "/written");
    assert_eq!(http_get(port, "/a"), "/a");
    let listing = ok(&ctl(&state, &["read", "notes", "notes"]));
    assert!(
        listing.contains("/a ") && listing.contains("/b "),
        "{listing}"
    );
    let hits: u64 = ok(&ctl(&state, &["read", "notes", "hits"]))
        .trim()
        .parse()
        .unwrap();
    assert!(hits >= 4, "hits carried and counted on: {hits}");
}

#[test]
fn state_saved_while_running_survives_a_killed_serve() {
    let dir = TempDir::new("killed");
    let state = dir.0.join("state");
    let mut server = serve(&state, &["--save-every", "1"]);
    let port = deploy_notes(&dir, &state, 16);
    assert_eq!(http_get(port, "/a"), "new");
    ok(&ctl(&state, &["write", "notes", "notes//b", WRITTEN]));
    ok(&ctl(&state, &["write", "notes", "hits", "40"]));
    // Past the save interval, then SIGKILL: nothing runs at the end.
    std::thread::sleep(Duration::from_millis(2500));
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);
    let saved = std::fs::read_to_string(state.join("services/notes.globals")).unwrap();
    assert!(saved.contains("\"entries\""), "{saved}");
    let _server = serve(&state, &["--save-every", "1"]);
    assert_eq!(ok(&ctl(&state, &["read", "notes", "hits"])).trim(), "40");
    assert!(ok(&ctl(&state, &["read", "notes", "notes//a"])).contains("GET /a"));
    assert_eq!(http_get(port, "/b"), "/written");
    assert_eq!(http_get(port, "/a"), "/a");
    assert_eq!(ok(&ctl(&state, &["read", "notes", "hits"])).trim(), "42");
}

#[test]
fn with_no_save_interval_only_a_clean_stop_saves() {
    let dir = TempDir::new("nosave");
    let state = dir.0.join("state");
    let mut server = serve(&state, &["--save-every", "0"]);
    let port = deploy_notes(&dir, &state, 16);
    assert_eq!(http_get(port, "/a"), "new");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!state.join("services/notes.globals").exists());
    assert!(terminate(&mut server.child).success());
    drop(server);
    let _server = serve(&state, &[]);
    assert_eq!(http_get(port, "/a"), "/a", "the entry came back");
}

/// `flick run`, killed on drop.
struct Run(Child);

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `flick run`'s reload on SIGHUP carries dictionaries as a redeploy
/// does: the same code (`reload.rs`).
#[test]
fn a_dictionary_survives_flick_runs_reload() {
    let dir = TempDir::new("sighup");
    let program = dir.file("notes.flick", NOTES);
    let port = free_port();
    let run = Run(Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args(["run", &program, "--workers", "2", "--listen"])
        .arg(format!("client=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "flick run never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Listening is not yet answering at once: a first request (a target
    // of its own each time) may wait past its time, and is asked again.
    let wait = Duration::from_secs(2);
    let never = "flick run never answered";
    ask_until(port, "/warm", wait, deadline, never, |_, _| true);
    assert_eq!(http_get(port, "/a"), "new");
    dir.file("notes.flick", &NOTES.replace("\"new\"", "\"fresh\""));
    support::hup(&run.0);
    // A target never asked before, each time: the old version notes it.
    // One that reaches the old version as it closes is reset: asked again.
    let never = "the new version never answered";
    ask_until(port, "/z", wait, deadline, never, |_, body| body == "fresh");
    let (_, carried) = get_until_answered(port, "/a", wait, deadline);
    assert_eq!(carried, "/a", "the entry was carried over");
}

/// Deploys (or redeploys, as `verb` says) COUNTS as `counts` on `port`,
/// its dictionaries holding `capacity` entries, a target's first request
/// answered `new` as NOTES does; what ctl said.
fn deploy_counts(dir: &TempDir, state: &Path, capacity: usize, verb: &str, port: u16) -> String {
    let counts = COUNTS.replace("\"New\", \"1\")", "\"New\", \"new\")");
    deploy_program((dir, state), verb, "counts", &counts, capacity, port)
}

#[test]
fn dictionaries_of_values_are_written_read_listed_and_deleted() {
    let dir = TempDir::new("values");
    let state = dir.0.join("state");
    let _server = serve(&state, &[]);
    let port = free_port();
    deploy_counts(&dir, &state, 3, "deploy", port);
    assert_eq!(http_get_reason(port, "/a").1, "new");
    assert_eq!(http_get_reason(port, "/a").1, "2");

    // The program's entries, read as JSON values.
    let get = |path: &str| {
        call(
            &state,
            "GET",
            &format!("/services/counts/state/{path}"),
            None,
        )
    };
    let (status, a) = get("hits//a");
    assert_eq!((status, a["value"].clone()), (200, json!(2)), "{a}");
    assert_eq!(get("first//a").1["value"], json!("/a"));
    assert_eq!(get("again//a").1["value"], json!(true));
    assert_eq!(get("hits//zz").0, 404, "a missing key");

    // Written over the API: the program counts on from there.
    let put = |path: &str, body: Json| {
        call(
            &state,
            "PUT",
            &format!("/services/counts/state/{path}"),
            Some(&body),
        )
    };
    let (status, a) = put("hits//b", json!({ "value": 41 }));
    assert_eq!(status, 200, "{a}");
    assert_eq!(
        (a["created"].clone(), a["len"].clone(), a["value"].clone()),
        (json!(true), json!(2), json!(41))
    );
    assert_eq!(put("again//b", json!(true)).0, 200);
    assert_eq!(put("first//b", json!({ "value": "/written" })).0, 200);
    assert_eq!(
        http_get_reason(port, "/b"),
        ("/written".into(), "42".into())
    );
    // With ctl: integers and booleans as JSON, strings as they are.
    ok(&ctl(&state, &["write", "counts", "hits//c", "7"]));
    ok(&ctl(&state, &["write", "counts", "again//c", "false"]));
    assert_eq!(http_get_reason(port, "/c"), ("Second".into(), "8".into()));
    assert_eq!(ok(&ctl(&state, &["read", "counts", "hits//c"])).trim(), "8");

    // Listed oldest first, values as JSON.
    let (status, page) = get("hits");
    assert_eq!(status, 200, "{page}");
    let entries: Vec<(String, Json)> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["key"].as_str().unwrap().to_string(), e["value"].clone()))
        .collect();
    assert_eq!(
        entries,
        [
            ("/a".to_string(), json!(2)),
            ("/b".to_string(), json!(42)),
            ("/c".to_string(), json!(8))
        ]
    );
    let listing = ok(&ctl(&state, &["read", "counts", "first"]));
    assert!(listing.contains("/b \"/written\""), "{listing}");

    // Refused: the wrong kind, a string past its maximum, a full dictionary.
    let (status, a) = put("hits//d", json!("abc"));
    assert_eq!(status, 400, "{a}");
    assert!(
        a["error"].as_str().unwrap().contains("is an integer"),
        "{a}"
    );
    let (status, a) = put("again//d", json!(1));
    assert_eq!(status, 400, "{a}");
    let (status, a) = put("first//d", json!("x".repeat(33)));
    assert_eq!(status, 400, "{a}");
    assert!(a["error"].as_str().unwrap().contains("at most 32"), "{a}");
    let (status, a) = put("hits//d", json!(1));
    assert_eq!(status, 409, "{a}");
    let err = refused(&ctl(&state, &["write", "counts", "hits//d", "1"]));
    assert!(err.contains("3 entries of its capacity of 3"), "{err}");
    // Replacing is always allowed.
    assert_eq!(put("hits//a", json!(100)).0, 200);

    // Deleted: the program counts the target afresh.
    let out = ok(&ctl(&state, &["delete", "counts", "hits//a"]));
    assert!(out.contains("2 entries left"), "{out}");
    assert_eq!(http_get_reason(port, "/a").1, "new");
}

#[test]
fn dictionaries_of_values_survive_a_redeploy_and_a_restart() {
    let dir = TempDir::new("values-carried");
    let state = dir.0.join("state");
    let server = serve(&state, &["--save-every", "0"]);
    let port = free_port();
    deploy_counts(&dir, &state, 16, "deploy", port);
    for _ in 0..3 {
        http_get_reason(port, "/a");
    }
    ok(&ctl(&state, &["write", "counts", "first//a", "/kept"]));
    let out = deploy_counts(&dir, &state, 16, "redeploy", port);
    for name in ["hits", "first", "again"] {
        assert!(out.contains(name), "{name} carried: {out}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (reason, body) = http_get_reason(port, "/a");
        if reason == "/kept" {
            assert!(body.parse::<u32>().unwrap() >= 4, "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "the counts never came over");
    }
    // A clean stop saves them; the next serve gives them back.
    let mut server = server;
    assert!(terminate(&mut server.child).success());
    drop(server);
    let saved = std::fs::read_to_string(state.join("services/counts.globals")).unwrap();
    assert!(saved.contains("\"int\""), "{saved}");
    let _server = serve(&state, &[]);
    let before: u64 = ok(&ctl(&state, &["read", "counts", "hits//a"]))
        .trim()
        .parse()
        .unwrap();
    assert!(before >= 4, "{before}");
    assert_eq!(
        http_get_reason(port, "/a"),
        ("/kept".into(), (before + 1).to_string())
    );
    assert_eq!(
        ok(&ctl(&state, &["read", "counts", "again//a"])).trim(),
        "true"
    );
}

/// Counts requests per pair of integers, a key that is not UTF-8: each
/// request counts under `pack(target's length, 255)` and answers the count.
const PACKED: &str = http_program!(
    "proc Packed: (request/simple_response client)
  global by_pair := empty_dict
  | client => count(by_pair, client)

fun count: (by_pair: ref dict<string*integer>, -/simple_response client, req: request) -> ()
  if by_pair[pack(len(req.target), 255)] = None:
    by_pair[pack(len(req.target), 255)] := 1
  else:
    by_pair[pack(len(req.target), 255)] := by_pair[pack(len(req.target), 255)] + 1
  simple_response(200, \"OK\", to_string(by_pair[pack(len(req.target), 255)])) => client
"
);

/// A key that is not UTF-8 (a `pack` of integers) is listed with its
/// `key_base64`, and read, written and deleted by it, over the API and
/// with `flick ctl --key-base64`; the program answers from what was
/// written.
#[test]
fn entries_under_keys_that_are_not_utf8_are_reached_by_key_base64() {
    let dir = TempDir::new("packed-keys");
    let state = dir.0.join("state");
    let file = dir.file("packed.flick", PACKED);
    let port = free_port();
    let _server = serve(&state, &[]);
    ok(&ctl(
        &state,
        &[
            "deploy",
            "packed",
            &file,
            "--listen",
            &format!("client=127.0.0.1:{port}"),
        ],
    ));
    assert_eq!(http_get(port, "/ab"), "1");
    assert_eq!(http_get(port, "/ab"), "2");

    // Listed with the key in base64, which names the entry.
    let (status, page) = call(&state, "GET", "/services/packed/state/by_pair", None);
    assert_eq!(status, 200, "{page}");
    let listed = page["entries"][0]["key_base64"]
        .as_str()
        .unwrap()
        .to_string();
    let key = api::base64_decode(&listed).unwrap();
    assert!(std::str::from_utf8(&key).is_err());
    // A tag byte and 8 bytes big-endian per integer: pack(3, 255).
    assert_eq!((key.len(), key[8], key[17]), (18, 3, 255), "{key:?}");
    let q = |key: &[u8]| {
        format!(
            "/services/packed/state/by_pair?key_base64={}",
            api::percent_encode(&api::base64_encode(key))
        )
    };
    let (status, a) = call(&state, "GET", &q(&key), None);
    assert_eq!((status, &a["value"]), (200, &json!(2)), "{a}");
    assert_eq!(a["key_base64"], json!(listed));

    // Written over the API: the program counts on from it.
    let (status, a) = call(&state, "PUT", &q(&key), Some(&json!({ "value": 40 })));
    assert_eq!((status, &a["created"]), (200, &json!(false)), "{a}");
    assert_eq!(http_get(port, "/ab"), "41");

    // A new entry under another pair, through ctl; URL-safe base64 too.
    let mut four = key.clone();
    four[8] = 4;
    let four_b64 = api::base64_encode(&four);
    let url_safe = four_b64.replace('+', "-").replace('/', "_");
    let out = ok(&ctl(
        &state,
        &[
            "write",
            "packed",
            "by_pair",
            "100",
            "--key-base64",
            &url_safe,
        ],
    ));
    assert!(out.contains("= 100"), "{out}");
    assert_eq!(
        ok(&ctl(
            &state,
            &["read", "packed", "by_pair", "--key-base64", &four_b64]
        ))
        .trim(),
        "100"
    );
    assert_eq!(http_get(port, "/abc"), "101");

    // Deleted: the API with the key, then ctl; a second delete is 404.
    let (status, a) = call(&state, "DELETE", &q(&key), None);
    assert_eq!((status, &a["deleted"]), (200, &json!(true)), "{a}");
    let (status, a) = call(&state, "GET", &q(&key), None);
    assert_eq!(status, 404, "{a}");
    assert!(a["error"].as_str().unwrap().contains(&listed), "{a}");
    let out = ok(&ctl(
        &state,
        &["delete", "packed", "by_pair", "--key-base64", &four_b64],
    ));
    assert!(out.contains("deleted (0 entries left)"), "{out}");
    let err = refused(&ctl(
        &state,
        &["delete", "packed", "by_pair", "--key-base64", &four_b64],
    ));
    assert!(err.contains("holds nothing"), "{err}");
    assert_eq!(http_get(port, "/ab"), "1", "counting starts again");

    // What is not base64, or a path that names an entry already, is 400.
    let (status, _) = call(
        &state,
        "GET",
        "/services/packed/state/by_pair?key_base64=%21%21",
        None,
    );
    assert_eq!(status, 400);
    let (status, _) = call(
        &state,
        "GET",
        "/services/packed/state/by_pair/x?key_base64=AA",
        None,
    );
    assert_eq!(status, 400);
}
