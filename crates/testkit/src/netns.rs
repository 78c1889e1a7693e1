//! Network namespaces made for one test (root and `ip` from iproute2),
//! deleted when the test ends however it ends: where packet tests create
//! their veth pairs and TUN devices, never touching the machine's own
//! interfaces.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Whether namespace tests can run here: root and `ip`. Under CI
/// (`CI=true`) they must, so this panics; elsewhere it says why they skip.
pub fn available(test: &str) -> bool {
    // SAFETY: no arguments.
    let root = unsafe { libc::geteuid() } == 0;
    let ip = Command::new("ip")
        .arg("-V")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if root && ip {
        return true;
    }
    let why = if root { "`ip` is missing" } else { "not root" };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root and `ip` for network namespaces, but {why}");
    }
    eprintln!("skipping {test}: {why} (network namespaces need root and `ip`)");
    false
}

/// A network namespace made for one test, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// A namespace named `tag` plus this process's id and a counter.
    pub fn new(tag: &str) -> Netns {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "{tag}{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        run("ip", &["netns", "add", &name]);
        Netns { name }
    }

    /// Runs `ip -n NAME ARGS...` and asserts it succeeds.
    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run("ip", &all);
    }

    /// A veth pair `a`-`b` inside, both up, with IPv6 off so the kernel
    /// sends nothing of its own on them (router solicitations).
    pub fn veth_pair(&self, a: &str, b: &str) {
        self.ip(&["link", "add", a, "type", "veth", "peer", "name", b]);
        for dev in [a, b] {
            self.sysctl(&format!("net.ipv6.conf.{dev}.disable_ipv6=1"));
            self.ip(&["link", "set", dev, "up"]);
        }
        // Carrier comes a moment after `up`; a frame sent before it is
        // dropped without a word. At most 10 s.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for dev in [a, b] {
            loop {
                let out = Command::new("ip")
                    .args(["-n", &self.name, "-o", "link", "show", "dev", dev])
                    .output()
                    .expect("ip");
                let line = String::from_utf8_lossy(&out.stdout);
                if line.contains("LOWER_UP") && line.contains("state UP") {
                    break;
                }
                assert!(
                    std::time::Instant::now() < until,
                    "{dev} has no carrier after 10 s: {line}"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }

    /// Sets a sysctl (`KEY=VALUE`) inside the namespace.
    pub fn sysctl(&self, setting: &str) {
        run(
            "ip",
            &["netns", "exec", &self.name, "sysctl", "-q", "-w", setting],
        );
    }

    /// Whether a network device `dev` exists inside.
    pub fn has_link(&self, dev: &str) -> bool {
        Command::new("ip")
            .args(["-n", &self.name, "link", "show", "dev", dev])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Whether device `dev` inside has an XDP program attached.
    pub fn has_xdp_program(&self, dev: &str) -> bool {
        Command::new("ip")
            .args(["-n", &self.name, "-details", "link", "show", "dev", dev])
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("prog/xdp"))
    }

    /// `ip netns exec NAME PROGRAM`: a command to start inside.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs `f` on a thread inside the namespace; sockets and devices it
    /// makes belong to the namespace for good.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let ns = File::open(format!("/run/netns/{}", self.name))
            .or_else(|_| File::open(format!("/var/run/netns/{}", self.name)))
            .expect("namespace file");
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: moves only this thread into the namespace.
                    let entered = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                    assert_eq!(entered, 0, "setns: {}", std::io::Error::last_os_error());
                    f()
                })
                .join()
                .expect("thread in the namespace")
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// How many packet sockets in the network namespace of process `pid` are
/// bound to an interface and running, as `/proc/PID/net/packet` lists
/// them. A socket shows there from its creation, before its ring is set
/// up and it is bound: frames sent then are not read, so a test waits for
/// the bound count, not the listed one.
pub fn bound_packet_sockets(pid: u32) -> usize {
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/packet")) else {
        return 0;
    };
    // Columns: sk RefCnt Type Proto Iface R Rmem User Inode.
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            cols.len() > 5 && cols[4] != "0" && cols[5] == "1"
        })
        .count()
}

fn run(program: &str, args: &[&str]) {
    let output = Command::new(program).args(args).output().expect(program);
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
