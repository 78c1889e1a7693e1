//! Service weights through `flick serve`'s API and `flick ctl`, against a
//! real `serve`: a deploy with a weight (and one from its configuration
//! file), `status` and `list` showing it, a running service given another
//! (`flick ctl weight`, `PUT /services/NAME/weight`), a redeploy keeping
//! it unless it names one, the weight recorded in the state directory and
//! given back after a restart, and weights out of 1..=1000 refused with
//! 400. Every child process is killed when its test ends, and every wait
//! is bounded.

mod support;

use serde_json::{json, Value as Json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use support::serve::{call, ctl, ok, refused, serve, TempDir};
use support::{free_port, ROOT};

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
