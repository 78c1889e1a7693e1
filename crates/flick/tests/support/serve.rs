//! A running `flick serve` for the tests of its API and `flick ctl`: a
//! scratch state directory, the server (killed on drop), `flick ctl` and
//! one API request over the Unix socket, each bounded in time.

use super::ROOT;
use flick::api::{self, ApiAddr};
use serde_json::Value as Json;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// A scratch directory removed when the test ends.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("flick-serve-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn file(&self, name: &str, text: &str) -> String {
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
pub struct Serve {
    pub child: Child,
    /// What it printed before it was ready.
    pub banner: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `flick serve` on `state` with two workers and `more` flags, and
/// waits (at most 20 s) for it to say it serves the API.
pub fn serve(state: &Path, more: &[&str]) -> Serve {
    serve_by(Command::new(env!("CARGO_BIN_EXE_flick")), state, more)
}

/// [`serve`] started by `command`, a command for the flick binary (one
/// that runs it in a network namespace, say).
pub fn serve_by(mut command: Command, state: &Path, more: &[&str]) -> Serve {
    let mut child = command
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
        // Keep reading, so that the server never blocks on a full pipe.
        let mut rest = String::new();
        while lines.read_line(&mut rest).unwrap_or(0) > 0 {
            rest.clear();
        }
    });
    let banner = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
    let s = Serve { child, banner };
    assert!(
        s.banner.contains("serving the API"),
        "flick serve did not start: {:?}",
        s.banner
    );
    s
}

/// `flick ctl --api SOCKET ARGS`, bounded in time.
pub fn ctl(state: &Path, args: &[&str]) -> Output {
    let sock = state.join("flick.sock");
    let out = Command::new("timeout")
        .arg("60")
        .arg(env!("CARGO_BIN_EXE_flick"))
        .current_dir(ROOT)
        .args(["ctl", "--api"])
        .arg(&sock)
        .args(args)
        .output()
        .unwrap();
    out
}

pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "flick ctl failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn refused(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "flick ctl should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One API request over the Unix socket: status and JSON answer.
pub fn call(state: &Path, method: &str, path: &str, body: Option<&Json>) -> (u16, Json) {
    let addr = ApiAddr::Unix(state.join("flick.sock"));
    api::call(&addr, None, method, path, body, Duration::from_secs(30)).unwrap()
}
