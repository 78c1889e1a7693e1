//! `flick run` reloads on SIGHUP, as nginx does: the program file is read
//! again and checked; a program that checks starts beside the old one and
//! takes new connections while the old version drains its own and hands
//! its kept-alive ones over, with its `global` counter carried over; a program that does not check is
//! refused with its diagnostic in the log, and the old version keeps
//! serving; the configuration file is read again too, with flags still
//! winning; systemd hears RELOADING=1 and READY=1 around each reload; a
//! packet program logs SIGHUP as not supported and runs on (in a network
//! namespace of its own, as root).
//! The child is killed when the test ends, and every wait is
//! bounded.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{counting_program, free_port, ROOT};

/// A scratch directory removed when the test ends.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A running `flick run`, killed on drop; its standard error collected.
struct Run {
    child: Child,
    port: u16,
    log: Arc<Mutex<String>>,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Run {
    /// Starts `flick run ARGS --listen client=PORT` on a free port,
    /// telling it `NOTIFY_SOCKET=notify`.
    fn start(args: &[&str], notify: &Path) -> Run {
        let listen = format!("client=127.0.0.1:{}", free_port());
        let mut child = Command::new(env!("CARGO_BIN_EXE_flick"))
            .current_dir(ROOT)
            .arg("run")
            .args(args)
            .args(["--listen", &listen, "--workers", "2"])
            .env("NOTIFY_SOCKET", notify)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = support::collect_stderr(&mut child);
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(out);
            let mut line = String::new();
            let _ = lines.read_line(&mut line);
            let _ = tx.send(line);
            // Keep reading, so that the child never blocks on a full pipe.
            let mut rest = String::new();
            while lines.read_line(&mut rest).unwrap_or(0) > 0 {
                rest.clear();
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let mut run = Run {
            child,
            port: 0,
            log,
        };
        run.port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("flick run printed {line:?}: {}", run.log()));
        run
    }

    fn hup(&self) {
        support::hup(&self.child);
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits (at most 30 s) for the log to hold `text`.
    fn wait_log(&self, text: &str) {
        let until = Instant::now() + Duration::from_secs(30);
        while !self.log().contains(text) {
            assert!(
                Instant::now() < until,
                "no {text:?} in the log: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One keep-alive GET on `s`: the reason phrase and the body.
fn get(s: &mut TcpStream) -> std::io::Result<(String, String)> {
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let reason = head
        .lines()
        .next()
        .and_then(|l| l.splitn(3, ' ').nth(2))
        .unwrap_or_default()
        .to_string();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    s.read_exact(&mut body)?;
    Ok((reason, String::from_utf8_lossy(&body).into_owned()))
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A GET over a new connection.
fn get_new(port: u16) -> (String, String) {
    get(&mut connect(port)).unwrap()
}

#[test]
fn sighup_starts_the_new_version_beside_the_old_and_refuses_one_that_does_not_check() {
    let dir = TempDir(std::env::temp_dir().join(format!("flick-reload-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("counter.flick");
    std::fs::write(&path, counting_program("v1")).unwrap();
    // Stands in for systemd's notification socket (`Type=notify`).
    let notify = UnixDatagram::bind(dir.0.join("notify.sock")).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let said = || {
        let mut buf = [0u8; 256];
        let n = notify.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let run = Run::start(&[path.to_str().unwrap()], &dir.0.join("notify.sock"));
    assert_eq!(said(), "READY=1");

    let mut old = connect(run.port);
    assert_eq!(get(&mut old).unwrap(), ("v1".into(), "1".into()));

    std::fs::write(&path, counting_program("v2")).unwrap();
    run.hup();
    run.wait_log("reloaded");
    let (reason, body) = get_new(run.port);
    assert_eq!(reason, "v2", "a new connection goes to the new version");
    // The first version answered one request; the count goes on from it.
    let hits: i64 = body.parse().unwrap();
    assert!(hits >= 2, "the counter was carried over: {body}");
    assert!(run.log().contains("carried=[\"hits\"]"), "{}", run.log());
    assert_eq!((said(), said()), ("RELOADING=1".into(), "READY=1".into()));

    // The connection opened before the reload is not closed: the old
    // version, draining, hands it to the new one, which answers its next
    // request (nginx's old workers would close it).
    run.wait_log("old version stopped");
    let (reason, body) = get(&mut old).expect("the kept-alive connection is kept");
    assert_eq!(reason, "v2", "the new version answers on it");
    assert!(body.parse::<i64>().unwrap() > hits);
    drop(old);

    std::fs::write(
        &path,
        counting_program("v3").replace("hits := hits + 1", "hits := \"x\""),
    )
    .unwrap();
    run.hup();
    run.wait_log("reload failed; still serving the old version");
    assert_eq!((said(), said()), ("RELOADING=1".into(), "READY=1".into()));
    let log = run.log();
    assert!(log.contains("error[E"), "the diagnostic is logged: {log}");
    assert!(log.contains("ERROR"), "at error level: {log}");
    let (reason, body) = get_new(run.port);
    assert_eq!(reason, "v2", "the old version still serves");
    assert!(body.parse::<i64>().unwrap() > hits);

    // A good program after a bad one is taken.
    std::fs::write(&path, counting_program("v4")).unwrap();
    run.hup();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let (reason, _) = get_new(run.port);
        if reason == "v4" {
            break;
        }
        assert!(Instant::now() < until, "never reloaded: {}", run.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_reads_the_configuration_again_and_flags_still_win() {
    let dir =
        TempDir(std::env::temp_dir().join(format!("flick-reload-config-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    std::fs::write(dir.0.join("a.flick"), counting_program("a")).unwrap();
    std::fs::write(dir.0.join("b.flick"), counting_program("b")).unwrap();
    let config = dir.0.join("flick.toml");
    // The file's listening address is overridden by --listen, at start
    // and on reload.
    let unused = free_port();
    let toml = |program: &str| {
        format!("program = \"{program}\"\n\n[listen]\nclient = \"127.0.0.1:{unused}\"\n")
    };
    std::fs::write(&config, toml("a.flick")).unwrap();
    let run = Run::start(
        &["--config", config.to_str().unwrap()],
        &dir.0.join("notify.sock"),
    );
    assert_eq!(get_new(run.port).0, "a");

    std::fs::write(&config, toml("b.flick")).unwrap();
    run.hup();
    run.wait_log("reloaded");
    assert_eq!(get_new(run.port).0, "b", "the program the file names now");
    assert!(
        TcpStream::connect(("127.0.0.1", unused)).is_err(),
        "the file's address is not listened on"
    );

    std::fs::write(&config, "program = [\n").unwrap();
    run.hup();
    run.wait_log("reload failed");
    assert_eq!(get_new(run.port).0, "b");
}

/// Packet programs do not reload: SIGHUP is logged as not supported, and
/// the program goes on (it does not die of the signal) until SIGINT.
#[test]
fn sighup_is_logged_as_not_supported_for_a_packet_program() {
    use flick_testkit::netns::{self, Netns};
    if !netns::available("sighup_is_logged_as_not_supported_for_a_packet_program") {
        return;
    }
    let ns = Netns::new("flkhup");
    ns.veth_pair("in0", "in1");
    ns.veth_pair("out0", "out1");
    let log_path =
        std::env::temp_dir().join(format!("flick-reload-packet-{}.log", std::process::id()));
    let _cleanup = TempDir(log_path.clone());
    let mut cmd = ns.command(env!("CARGO_BIN_EXE_flick"));
    cmd.current_dir(ROOT)
        .args([
            "run",
            "examples/packets/port_knocking.flick",
            "--workers",
            "1",
            "--port",
            "inside=afpacket:in1",
            "--port",
            "outside=afpacket:out0",
        ])
        .stderr(Stdio::from(std::fs::File::create(&log_path).unwrap()));
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let pid = child.0.id().to_string();
    let signal = |sig: &str| {
        let _ = Command::new("kill").args([sig, &pid]).status();
    };
    // Its packet sockets bound: it runs, and its signal handlers are set.
    let until = Instant::now() + Duration::from_secs(10);
    while netns::bound_packet_sockets(child.0.id()) < 2 {
        assert!(Instant::now() < until, "no ports opened: {}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
    signal("-HUP");
    let until = Instant::now() + Duration::from_secs(10);
    while !log().contains("reload is not supported for packet programs") {
        assert!(Instant::now() < until, "SIGHUP not logged: {}", log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.0.try_wait().unwrap().is_none(), "it survived SIGHUP");
    signal("-INT");
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "it did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}: {}", log());
    drop(child);
}

/// A child killed when the test ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
