//! Service weights through `flick serve`'s API and `flick ctl`, against a
//! real `serve`: a deploy with a weight (and one from its configuration
//! file), `status` and `list` showing it, a running service given another
//! (`flick ctl weight`, `PUT /services/NAME/weight`), a redeploy keeping
//! it unless it names one, the weight recorded in the state directory and
//! given back after a restart, and weights out of 1..=1000 refused with
//! 400. Every child process is killed when its test ends, and every wait
//! is bounded.

mod support;

use flick::api::{self, ApiAddr};
use serde_json::{json, Value as Json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;
use support::{free_port, ROOT};

/// A scratch directory removed when the test ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("flick-serve-weight-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `flick serve`, killed on drop.
struct Serve {
    child: Child,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `flick serve` on `state` with two workers and `more` flags, and
/// waits (at most 20 s) for it to say it serves the API.
fn serve(state: &Path, more: &[&str]) -> Serve {
    let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args(["serve", "--workers", "2", "--state-dir"])
        .arg(state)
        .args(more)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out);
        let mut banner = String::new();
        for _ in 0..2 {
            if lines.read_line(&mut banner).unwrap_or(0) == 0 {
                break;
            }
        }
        let _ = tx.send(banner);
        let mut rest = String::new();
        while lines.read_line(&mut rest).unwrap_or(0) > 0 {
            rest.clear();
        }
    });
    let banner = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
    let s = Serve { child };
    assert!(
        banner.contains("serving the API"),
        "flick serve did not start: {banner:?}"
    );
    s
}

/// `flick ctl --api SOCKET ARGS`, bounded in time.
fn ctl(state: &Path, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args(["ctl", "--api"])
        .arg(state.join("flick.sock"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "flick ctl failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "flick ctl should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One API request over the Unix socket: status and JSON answer.
fn call(state: &Path, method: &str, path: &str, body: Option<&Json>) -> (u16, Json) {
    let addr = ApiAddr::Unix(state.join("flick.sock"));
    api::call(&addr, None, method, path, body, Duration::from_secs(30)).unwrap()
}

/// A `GET /` answered by the static web server on `port`.
fn answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = write!(s, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

fn web() -> String {
    Path::new(ROOT)
        .join("examples/static_web.flick")
        .to_string_lossy()
        .into_owned()
}

fn weight_of(state: &Path, name: &str) -> Json {
    let (status, a) = call(state, "GET", &format!("/services/{name}"), None);
    assert_eq!(status, 200, "{a}");
    a["weight"].clone()
}

#[test]
fn a_weight_is_deployed_shown_changed_and_kept_over_a_restart() {
    let dir = TempDir::new("kept");
    let state = dir.0.join("state");
    let server = serve(&state, &["--save-every", "0"]);
    let port = free_port();
    let listen = format!("client=127.0.0.1:{port}");
    let out = ok(&ctl(
        &state,
        &[
            "deploy",
            "web",
            &web(),
            "--listen",
            &listen,
            "--weight",
            "5",
        ],
    ));
    assert!(out.contains("with weight 5"), "{out}");
    assert!(answers(port));
    assert_eq!(weight_of(&state, "web"), json!(5));
    let status = ok(&ctl(&state, &["status", "web"]));
    assert!(
        status
            .lines()
            .any(|l| l.split_whitespace().eq(["weight", "5"])),
        "{status}"
    );
    let (_, list) = call(&state, "GET", "/services", None);
    assert_eq!(list["services"][0]["weight"], json!(5), "{list}");
    let table = ok(&ctl(&state, &["list"]));
    assert!(table.lines().next().unwrap().contains("WEIGHT"), "{table}");

    // Changed while it runs, with ctl and over the API.
    let out = ok(&ctl(&state, &["weight", "web", "9"]));
    assert!(out.contains("weight 9 (was 5)"), "{out}");
    assert_eq!(weight_of(&state, "web"), json!(9));
    let (status, a) = call(
        &state,
        "PUT",
        "/services/web/weight",
        Some(&json!({ "weight": 12 })),
    );
    assert_eq!((status, a["weight"].clone()), (200, json!(12)), "{a}");
    let (status, a) = call(&state, "GET", "/services/web/weight", None);
    assert_eq!((status, a["weight"].clone()), (200, json!(12)), "{a}");
    assert!(answers(port));

    // A redeploy that names none keeps it; one that names one takes it.
    ok(&ctl(
        &state,
        &["redeploy", "web", &web(), "--listen", &listen],
    ));
    assert_eq!(weight_of(&state, "web"), json!(12));
    ok(&ctl(
        &state,
        &[
            "redeploy",
            "web",
            &web(),
            "--listen",
            &listen,
            "--weight",
            "3",
        ],
    ));
    assert_eq!(weight_of(&state, "web"), json!(3));
    ok(&ctl(&state, &["weight", "web", "4"]));

    // Recorded: a restarted serve deploys it again with its weight.
    let record = std::fs::read_to_string(state.join("services/web.json")).unwrap();
    assert!(record.contains("\"weight\": 4"), "{record}");
    let term = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let mut server = server;
    assert!(server.child.wait().unwrap().success());
    drop(server);
    let _server = serve(&state, &[]);
    assert_eq!(weight_of(&state, "web"), json!(4));
    assert!(answers(port));
}

#[test]
fn a_configuration_file_gives_a_weight_and_the_request_wins() {
    let dir = TempDir::new("config");
    let state = dir.0.join("state");
    let _server = serve(&state, &[]);
    let config = dir.file("web.toml", "weight = 7\n");
    let listen = format!("client=127.0.0.1:{}", free_port());
    ok(&ctl(
        &state,
        &[
            "deploy",
            "a",
            &web(),
            "--listen",
            &listen,
            "--config",
            &config,
        ],
    ));
    assert_eq!(weight_of(&state, "a"), json!(7));
    let listen = format!("client=127.0.0.1:{}", free_port());
    ok(&ctl(
        &state,
        &[
            "deploy",
            "b",
            &web(),
            "--listen",
            &listen,
            "--config",
            &config,
            "--weight",
            "2",
        ],
    ));
    assert_eq!(weight_of(&state, "b"), json!(2));
    // None said: 1.
    let listen = format!("client=127.0.0.1:{}", free_port());
    ok(&ctl(&state, &["deploy", "c", &web(), "--listen", &listen]));
    assert_eq!(weight_of(&state, "c"), json!(1));
}

#[test]
fn weights_out_of_range_are_refused() {
    let dir = TempDir::new("refused");
    let state = dir.0.join("state");
    let _server = serve(&state, &[]);
    let program = std::fs::read_to_string(web()).unwrap();
    let deploy = |name: &str, weight: Json| {
        let listen = format!("client=127.0.0.1:{}", free_port());
        call(
            &state,
            "POST",
            "/services",
            Some(&json!({
                "name": name, "file": "web.flick", "program": program,
                "listen": [listen], "weight": weight,
            })),
        )
    };
    for bad in [json!(0), json!(1001)] {
        let (status, a) = deploy("w", bad.clone());
        assert_eq!(status, 400, "{bad}: {a}");
        assert!(
            a["error"]
                .as_str()
                .unwrap()
                .contains("must be between 1 and 1000"),
            "{a}"
        );
    }
    for bad in [json!(-1), json!("heavy"), json!(1.5)] {
        let (status, a) = deploy("w", bad.clone());
        assert_eq!(status, 400, "{bad}: {a}");
    }
    let err = refused(&ctl(
        &state,
        &[
            "deploy",
            "w",
            &web(),
            "--listen",
            "client=127.0.0.1:0",
            "--weight",
            "0",
        ],
    ));
    assert!(err.contains("must be between 1 and 1000"), "{err}");
    let (status, _) = deploy("w", json!(1000));
    assert_eq!(status, 201);
    let put = |body: Json| call(&state, "PUT", "/services/w/weight", Some(&body));
    for bad in [
        json!({ "weight": 0 }),
        json!({ "weight": 1001 }),
        json!({ "weight": "x" }),
        json!({}),
        json!(-3),
    ] {
        let (status, a) = put(bad.clone());
        assert_eq!(status, 400, "{bad}: {a}");
    }
    assert_eq!(weight_of(&state, "w"), json!(1000), "left as it was");
    let err = refused(&ctl(&state, &["weight", "w", "1001"]));
    assert!(err.contains("must be between 1 and 1000"), "{err}");
    let (status, _) = call(
        &state,
        "PUT",
        "/services/nobody/weight",
        Some(&json!({ "weight": 2 })),
    );
    assert_eq!(status, 404);
    let (status, _) = call(&state, "DELETE", "/services/w/weight", None);
    assert_eq!(status, 405);
}
