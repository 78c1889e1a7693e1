//! Running `flick` over packet ports and checking what it leaves: scratch
//! directories, `flick run` with a dump, golden files, the capture scripts'
//! output, generated frames.

use serde_json::{Map, Value as Json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::ROOT;

/// A directory of the test's own, removed when dropped (the test failing
/// too).
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A new empty directory; `tag` names it for whoever looks, and a
    /// number of its own keeps two with one tag apart.
    pub fn new(tag: &str) -> Scratch {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("flick-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `flick run PROGRAM --port PORT... --workers N --dump DUMP` in the
/// workspace root; panics with its standard error unless it succeeds.
pub fn run_over_ports(program: &Path, ports: &[String], workers: usize, dump: &Path) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flick"));
    cmd.current_dir(ROOT).arg("run").arg(program);
    for p in ports {
        cmd.arg("--port").arg(p);
    }
    cmd.arg("--workers")
        .arg(workers.to_string())
        .arg("--dump")
        .arg(dump);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "flick run {} failed: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// [`run_over_ports`], then the dump's `globals`, no frame malformed and
/// no rule faulted.
pub fn run_for_globals(
    program: &Path,
    ports: &[String],
    dump: &Path,
    workers: usize,
) -> Map<String, Json> {
    run_over_ports(program, ports, workers, dump);
    let dump: Json = serde_json::from_slice(&std::fs::read(dump).unwrap()).unwrap();
    assert_eq!(dump["malformed"], 0, "{dump}");
    assert_eq!(dump["faults"], 0, "{dump}");
    dump["globals"].as_object().unwrap().clone()
}

/// [`run_for_globals`] of `program` with its dump in `scratch`, its
/// globals asserted to be `want`.
pub fn assert_globals(
    scratch: &Scratch,
    program: &Path,
    ports: &[String],
    workers: usize,
    want: &Json,
) {
    let name = program.file_stem().unwrap().to_string_lossy();
    let dump = scratch.path(&format!("{name}.json"));
    let globals = run_for_globals(program, ports, &dump, workers);
    assert_eq!(&Json::Object(globals), want, "{name}, {workers} workers");
}

/// The golden file `path`'s bytes, rewritten first with `got` where the
/// environment sets `bless` (then read the diff).
pub fn golden_file(path: &Path, got: &[u8], bless: &str) -> Vec<u8> {
    if std::env::var_os(bless).is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, got).unwrap();
    }
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e} ({bless}=1 writes it)", path.display()))
}

/// Sends `child` SIGTERM and waits (at most 20 s) for it to exit; how
/// it exited.
pub fn terminate(child: &mut Child) -> ExitStatus {
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "it did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Asserts that `script` (Python, run in the workspace root with a
/// scratch directory to write into) writes each of `names` as `dir`
/// holds it. Without python3 the check is skipped, except under CI.
pub fn script_writes(script: &str, dir: &Path, names: &[String]) {
    let scratch = Scratch::new("script");
    let status = Command::new("python3")
        .current_dir(ROOT)
        .arg(script)
        .arg(&scratch.0)
        .status();
    match status {
        Ok(s) => assert!(s.success(), "{script} failed"),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no python3 ({e})");
            return;
        }
        Err(e) => panic!("python3: {e}"),
    }
    for name in names {
        assert!(
            std::fs::read(scratch.path(name)).unwrap() == std::fs::read(dir.join(name)).unwrap(),
            "{name} differs from what {script} writes: run it and commit the result"
        );
    }
}

/// An Ethernet + IPv4 frame from `(src, sport)` to `(dst, dport)`
/// carrying TCP (`proto` 6, its header with `(flags, seq, ack)`) or UDP
/// (17), and `payload` zero bytes.
pub fn ipv4_frame(
    proto: u8,
    (src, sport): (u32, u16),
    (dst, dport): (u32, u16),
    (flags, seq, ack): (u8, u32, u32),
    payload: usize,
) -> Vec<u8> {
    let l4 = if proto == 6 { 20 } else { 8 };
    let mut f = vec![0u8; 14 + 20 + l4 + payload];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((20 + l4 + payload) as u16).to_be_bytes());
    f[22] = 64;
    f[23] = proto;
    f[26..30].copy_from_slice(&src.to_be_bytes());
    f[30..34].copy_from_slice(&dst.to_be_bytes());
    f[34..36].copy_from_slice(&sport.to_be_bytes());
    f[36..38].copy_from_slice(&dport.to_be_bytes());
    if proto == 6 {
        f[38..42].copy_from_slice(&seq.to_be_bytes());
        f[42..46].copy_from_slice(&ack.to_be_bytes());
        f[46] = 0x50;
        f[47] = flags;
    } else {
        f[38..40].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    }
    f
}

/// The next number of the xorshift generator whose state is `state`
/// (never 0): seeded tests make the same requests every run.
pub fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}
