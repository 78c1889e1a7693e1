//! `flick run`'s settings: a TOML file (`--config`), command-line flags
//! that override it, and the checks that make `flick run --check` useful
//! before a deployment (addresses, ranges, channel bindings against the
//! program).
//!
//! ```toml
//! program = "memcached_proxy.flick"   # relative to this file
//! workers = 4
//! pin_workers = false                 # true: worker i on the i-th core it may use
//! timeslice_us = 50
//! metrics = "127.0.0.1:9100"
//! access_log = "/var/log/flick/access.log"   # or "-": standard output
//! max_instances = 10000              # client connections open at once
//! graphs_ahead = 16                   # task graphs made at start, and kept after a burst
//! channel_capacity = 64
//! dict_capacity = 1024
//! response_timeout_ms = 2000
//! max_body_bytes = 1048576           # a request body over it is 413 (HTTP)
//! request_buffer_bytes = 16384       # a request this size or less is read whole before it goes on
//! backend_connections = 1             # per backend and worker; 0: per client
//! backend_sharing = "pipelined"       # or "exclusive"; default: as the grammar says
//! backend_idle_timeout_ms = 4000      # an idle exclusive backend connection older is closed; 0: never
//! client_request_timeout_ms = 60000   # a client request begun and not complete gets 408 (or a close); 0: never
//! backend_max_connections = 0         # exclusive connections per backend and worker; 0: no cap
//! accept = "per-worker"               # or "single": only the first worker accepts
//! weight = 1                          # share of `flick serve`'s workers against other services
//!
//! [listen]
//! client = "127.0.0.1:11311"
//!
//! [connect]
//! backends = ["127.0.0.1:11212", "127.0.0.1:11213"]
//!
//! fan_in_timeout_ms = 10000           # a fan-in group not full by then fails
//! connect_timeout_ms = 10000          # a reducer not reached by then fails the job
//!
//! [fan_in]            # a listening channel array: connections per instance
//! mappers = 8
//! ```

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

/// Worker threads a service may have.
pub const WORKERS: RangeInclusive<usize> = 1..=1024;
/// The scheduler's timeslice, in microseconds.
pub const TIMESLICE_US: RangeInclusive<u64> = 1..=10_000;
/// Instances (client connections) alive at once. The scheduler's task
/// table and the message pool are sized from it when the service starts.
pub const MAX_INSTANCES: RangeInclusive<usize> = 1..=100_000;
/// Task graphs made when the service starts and kept after a burst (each
/// about 110 KiB for the HTTP balancer): more start the first connections
/// sooner, for memory held from the start.
pub const GRAPHS_AHEAD: RangeInclusive<usize> = 0..=100_000;
/// Messages a task channel holds.
pub const CHANNEL_CAPACITY: RangeInclusive<usize> = 1..=65_536;
/// Entries of each dictionary in process state.
pub const DICT_CAPACITY: RangeInclusive<usize> = 1..=16_777_216;
pub const RESPONSE_TIMEOUT_MS: RangeInclusive<u64> = 10..=600_000;
pub const BACKEND_CONNECTIONS: RangeInclusive<usize> = 0..=1024;
/// How long an idle exclusive backend connection may wait to be taken
/// again; 0: however long.
pub const BACKEND_IDLE_TIMEOUT_MS: RangeInclusive<u64> = 0..=3_600_000;
/// How long a client request may take to arrive, ms; 0: no limit.
pub const CLIENT_REQUEST_TIMEOUT_MS: RangeInclusive<u64> = 0..=3_600_000;
/// Exclusive connections each worker may open to a backend; 0: no cap.
pub const BACKEND_MAX_CONNECTIONS: RangeInclusive<usize> = 0..=100_000;
/// A request body's most bytes, where the grammar has the limit
/// `max_body_bytes` (HTTP): up to its fields' own maximum, 1 GiB.
pub const MAX_BODY_BYTES: RangeInclusive<u64> = 0..=1 << 30;
/// `max_body_bytes` unless set: 1 MiB, as nginx's `client_max_body_size`.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 1 << 20;
/// A request (head and body) of at most this many bytes is read whole and
/// checked before any of it goes to a backend; a larger one streams. 0:
/// every body streams. Each client connection's read buffer may grow to
/// it, so it is kept well below the memory a connection may take.
pub const REQUEST_BUFFER_BYTES: RangeInclusive<usize> = 0..=1 << 20;
/// A service's weight: its share of `flick serve`'s workers against the
/// other services' while they all have work (the scheduler's groups).
pub const WEIGHT: RangeInclusive<u32> = 1..=flick_runtime::MAX_WEIGHT;

/// Declares a struct of settings with its own fields first, then the
/// settings that the file and the command line both give, each an
/// `Option` (unset unless given): one list, so the two cannot drift apart.
macro_rules! with_shared_settings {
    ($(#[$attr:meta])* pub struct $name:ident { $($own:tt)* }) => {
        $(#[$attr])*
        pub struct $name {
            $($own)*
            pub workers: Option<usize>,
            /// Each worker kept on a core of its own (nginx's
            /// `worker_cpu_affinity auto`).
            pub pin_workers: Option<bool>,
            pub timeslice_us: Option<u64>,
            /// Address of the Prometheus `/metrics` endpoint.
            pub metrics: Option<String>,
            /// Where a line per answered request goes (`-`: standard output).
            pub access_log: Option<String>,
            pub max_instances: Option<usize>,
            /// Task graphs made at start and kept after a burst.
            pub graphs_ahead: Option<usize>,
            pub channel_capacity: Option<usize>,
            pub dict_capacity: Option<usize>,
            /// How long a backend may take to answer, in milliseconds.
            pub response_timeout_ms: Option<u64>,
            /// A request body's most bytes (the grammar's `max_body_bytes`).
            pub max_body_bytes: Option<u64>,
            /// The largest request read whole before it goes on.
            pub request_buffer_bytes: Option<usize>,
            /// Connections to each backend shared by all clients (0: per client).
            pub backend_connections: Option<usize>,
            /// How long an idle exclusive backend connection is kept (0: always).
            pub backend_idle_timeout_ms: Option<u64>,
            /// How long a client request may take from its first bytes to its
            /// last (0: no limit).
            pub client_request_timeout_ms: Option<u64>,
            /// Exclusive connections per backend and worker, at most (0: no cap).
            pub backend_max_connections: Option<usize>,
            /// `pipelined` or `exclusive`.
            pub backend_sharing: Option<String>,
            /// `per-worker` or `single`.
            pub accept: Option<String>,
            /// How long a fan-in group may wait for its last connection.
            pub fan_in_timeout_ms: Option<u64>,
            /// How long a peer the program only writes to (a reducer) is tried.
            pub connect_timeout_ms: Option<u64>,
        }
    };
}

with_shared_settings! {
    /// A configuration file as written. Every key is optional; unknown keys
    /// are errors.
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct FileConfig {
        /// The program, relative to the configuration file's directory.
        pub program: Option<String>,
        /// Channel name to listening address.
        #[serde(default)]
        pub listen: BTreeMap<String, String>,
        /// Channel (or channel array) name to backend addresses.
        #[serde(default)]
        pub connect: BTreeMap<String, Addrs>,
        /// The service's share of the workers against other services'.
        pub weight: Option<u32>,
        /// Listening channel array name to the connections that make up one
        /// instance.
        #[serde(default)]
        pub fan_in: BTreeMap<String, usize>,
        /// Channel (or channel array) name to packet ports (`pcap:FILE`,
        /// `pcap-out:FILE`, `afpacket:IFACE`, `tun:NAME`): a packet program.
        #[serde(default)]
        pub ports: BTreeMap<String, Addrs>,
    }
}

/// One address (`"host:port"`) or a list of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addrs(pub Vec<String>);

impl<'de> Deserialize<'de> for Addrs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Addrs, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Addrs;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an address \"host:port\" or a list of them")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Addrs, E> {
                Ok(Addrs(vec![s.to_string()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Addrs, A::Error> {
                let mut v = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    v.push(s);
                }
                Ok(Addrs(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl FileConfig {
    /// Parses a configuration file's text; the error names the line, the
    /// column and, for an unknown key, the key.
    pub fn parse(text: &str) -> Result<FileConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string().trim_end().to_string())
    }
}

with_shared_settings! {
    /// What the command line gives; each `Some` (and each binding) overrides
    /// the file.
    #[derive(Debug, Default, Clone)]
    pub struct Overrides {
        pub program: Option<String>,
        /// `CHANNEL=ADDR`
        pub listen: Vec<String>,
        /// `CHANNEL=ADDR[,ADDR...]`
        pub connect: Vec<String>,
        /// `CHANNEL=N`
        pub fan_in: Vec<String>,
    }
}

/// The settings of one `flick run`, resolved and range-checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub program: PathBuf,
    /// In channel-name order.
    pub listen: Vec<(String, SocketAddr)>,
    /// In channel-name order.
    pub connect: Vec<(String, Vec<SocketAddr>)>,
    /// `None`: one per core.
    pub workers: Option<usize>,
    /// Worker `i` pinned to the `i`-th core the process may run on.
    pub pin_workers: bool,
    pub timeslice_us: u64,
    pub metrics: Option<SocketAddr>,
    /// A path, or `-` for standard output; `None`: no access log.
    pub access_log: Option<String>,
    pub max_instances: usize,
    /// `ServiceConfig::graphs_ahead`.
    pub graphs_ahead: usize,
    pub channel_capacity: usize,
    pub dict_capacity: usize,
    pub response_timeout_ms: u64,
    /// Set as the grammar's limit `max_body_bytes` where it has one.
    pub max_body_bytes: u64,
    /// `ServiceConfig::request_buffer_bytes`.
    pub request_buffer_bytes: usize,
    pub backend_connections: usize,
    /// `ServiceConfig::backend_idle_timeout` in ms; 0: none.
    pub backend_idle_timeout_ms: u64,
    /// `ServiceConfig::client_request_timeout` in ms; 0: none.
    pub client_request_timeout_ms: u64,
    /// `ServiceConfig::backend_max_connections`.
    pub backend_max_connections: usize,
    /// `None`: as the grammar says.
    pub backend_sharing: Option<flick_platform::Sharing>,
    pub accept: flick_platform::Accept,
    pub fan_in_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// `ServiceConfig::weight` (1 unless set); only a service among others
    /// (`flick serve`) has anyone to share with.
    pub weight: u32,
    /// In channel-name order.
    pub fan_in: Vec<(String, usize)>,
    /// Packet ports from the configuration file, in channel-name order,
    /// as `--port` takes them (files relative to the file's directory);
    /// `--port` flags replace a channel's.
    pub ports: Vec<(String, Vec<String>)>,
}

/// Most connections that make up one instance of a listening array.
pub const FAN_IN: RangeInclusive<usize> = 1..=4096;

/// Resolves `host:port` to its first address.
pub fn parse_addr(a: &str) -> Result<SocketAddr, String> {
    a.to_socket_addrs()
        .map_err(|e| format!("`{a}`: {e}"))?
        .next()
        .ok_or_else(|| format!("`{a}` resolves to no address"))
}

/// Splits a `CHANNEL=ADDR[,ADDR...]` flag.
fn split_binding(s: &str) -> Result<(String, Vec<String>), String> {
    let (chan, addrs) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not CHANNEL=ADDR"))?;
    if chan.is_empty() {
        return Err(format!("`{s}` names no channel"));
    }
    Ok((
        chan.to_string(),
        addrs.split(',').map(str::to_string).collect(),
    ))
}

/// A flag's value (with its origin `--flag-name`) if given, else the
/// file's (with its origin `FILE: key`).
fn setting<T>(
    at: &dyn Fn(&str) -> String,
    key: &str,
    flag: Option<T>,
    file: Option<T>,
) -> Option<(String, T)> {
    match (flag, file) {
        (Some(v), _) => Some((format!("--{}", key.replace('_', "-")), v)),
        (None, Some(v)) => Some((at(key), v)),
        (None, None) => None,
    }
}

fn ranged<T: PartialOrd + std::fmt::Display + Copy>(
    errors: &mut Vec<String>,
    origin: &str,
    value: T,
    range: &RangeInclusive<T>,
) -> T {
    if !range.contains(&value) {
        errors.push(format!(
            "{origin}: {value} is out of range: must be between {} and {}",
            range.start(),
            range.end()
        ));
    }
    value
}

/// Bindings of one kind (`listen`, `connect`): the file's, then the
/// flags', each replacing a channel's; channel name to the binding's
/// origin and addresses.
fn bindings<'a>(
    errors: &mut Vec<String>,
    at: &dyn Fn(&str) -> String,
    kind: &str,
    file: impl Iterator<Item = (&'a String, Vec<String>)>,
    flags: &[String],
) -> BTreeMap<String, (String, Vec<String>)> {
    let mut all: BTreeMap<String, (String, Vec<String>)> = file
        .map(|(c, a)| (c.clone(), (at(&format!("{kind}.{c}")), a)))
        .collect();
    for b in flags {
        match split_binding(b) {
            Ok((c, a)) => {
                all.insert(c, (format!("--{kind} {b}"), a));
            }
            Err(e) => errors.push(format!("--{kind} {e}")),
        }
    }
    all
}

/// Joins a configuration file (if any, with its path: its program path is
/// taken from its directory) and the command line. Returns every problem
/// found, not only the first, each naming the flag or the file and key it
/// comes from.
pub fn resolve(
    file: Option<(&FileConfig, &Path)>,
    flags: &Overrides,
) -> Result<Settings, Vec<String>> {
    let empty = FileConfig::default();
    let (cfg, path) = file.unwrap_or((&empty, Path::new("")));
    let dir = path.parent().unwrap_or(Path::new(""));
    let at = |key: &str| format!("{}: {key}", path.display());
    let mut errors = Vec::new();
    let program = match (&flags.program, &cfg.program) {
        (Some(p), _) => Some(PathBuf::from(p)),
        (None, Some(p)) => Some(dir.join(p)),
        (None, None) => {
            errors.push(
                "no program: give it on the command line or as `program` in the configuration file"
                    .to_string(),
            );
            None
        }
    };

    let file_listen = cfg.listen.iter().map(|(c, a)| (c, vec![a.clone()]));
    let listen = bindings(&mut errors, &at, "listen", file_listen, &flags.listen);
    let file_connect = cfg.connect.iter().map(|(c, a)| (c, a.0.clone()));
    let connect = bindings(&mut errors, &at, "connect", file_connect, &flags.connect);
    fn resolve_all(errors: &mut Vec<String>, origin: &str, addrs: &[String]) -> Vec<SocketAddr> {
        if addrs.is_empty() {
            errors.push(format!("{origin}: no address"));
        }
        addrs
            .iter()
            .filter_map(|a| {
                parse_addr(a)
                    .map_err(|e| errors.push(format!("{origin}: {e}")))
                    .ok()
            })
            .collect()
    }
    let mut listen_addrs = Vec::new();
    for (chan, (origin, addrs)) in &listen {
        if addrs.len() != 1 {
            errors.push(format!("{origin}: one address per listening channel"));
            continue;
        }
        if let Some(a) = resolve_all(&mut errors, origin, addrs).first() {
            listen_addrs.push((chan.clone(), *a));
        }
    }
    let mut connect_addrs = Vec::new();
    for (chan, (origin, addrs)) in &connect {
        let resolved = resolve_all(&mut errors, origin, addrs);
        if resolved.len() == addrs.len() && !addrs.is_empty() {
            connect_addrs.push((chan.clone(), resolved));
        }
    }
    let mut fan_in: BTreeMap<String, (String, usize)> = cfg
        .fan_in
        .iter()
        .map(|(c, n)| (c.clone(), (at(&format!("fan_in.{c}")), *n)))
        .collect();
    for f in &flags.fan_in {
        let parsed = f
            .split_once('=')
            .and_then(|(c, n)| Some((c, n.parse::<usize>().ok()?)))
            .filter(|(c, _)| !c.is_empty());
        match parsed {
            Some((c, n)) => {
                fan_in.insert(c.to_string(), (format!("--fan-in {f}"), n));
            }
            None => errors.push(format!("--fan-in `{f}` is not CHANNEL=N")),
        }
    }
    let fan_in: Vec<(String, usize)> = fan_in
        .into_iter()
        .map(|(c, (origin, n))| (c, ranged(&mut errors, &origin, n, &FAN_IN)))
        .collect();
    let metrics = match (&flags.metrics, &cfg.metrics) {
        (Some(a), _) => parse_addr(a)
            .map_err(|e| errors.push(format!("--metrics {e}")))
            .ok(),
        (None, Some(a)) => parse_addr(a)
            .map_err(|e| errors.push(format!("{}: {e}", at("metrics"))))
            .ok(),
        (None, None) => None,
    };
    let access_log = setting(
        &at,
        "access_log",
        flags.access_log.clone(),
        cfg.access_log.clone(),
    )
    .and_then(|(o, v)| match v.is_empty() {
        true => {
            errors.push(format!("{o}: an empty path; give a file or `-`"));
            None
        }
        false => Some(v),
    });

    let defaults = flick_platform::ServiceConfig::default();
    // A numeric setting: the flag's, else the file's, checked against its
    // range; else `default`.
    macro_rules! ranged_setting {
        ($key:ident, $range:expr, $default:expr) => {
            setting(&at, stringify!($key), flags.$key, cfg.$key)
                .map_or($default, |(o, v)| ranged(&mut errors, &o, v, &$range))
        };
    }
    let as_ms = |t: Option<std::time::Duration>| t.map_or(0, |t| t.as_millis() as u64);
    let workers = setting(&at, "workers", flags.workers, cfg.workers)
        .map(|(o, w)| ranged(&mut errors, &o, w, &WORKERS));
    // Off by default, as nginx's `worker_cpu_affinity`: a worker held to
    // one core cannot move off it when the backends or other programs on
    // the machine are woken there.
    let pin_workers =
        setting(&at, "pin_workers", flags.pin_workers, cfg.pin_workers).is_some_and(|(_, v)| v);
    let timeslice_us = ranged_setting!(timeslice_us, TIMESLICE_US, 50);
    let max_instances = ranged_setting!(max_instances, MAX_INSTANCES, defaults.max_instances);
    let graphs_ahead = ranged_setting!(graphs_ahead, GRAPHS_AHEAD, defaults.graphs_ahead);
    let channel_capacity = ranged_setting!(
        channel_capacity,
        CHANNEL_CAPACITY,
        defaults.channel_capacity
    );
    let dict_capacity = ranged_setting!(dict_capacity, DICT_CAPACITY, defaults.dict_capacity);
    let response_timeout_ms = ranged_setting!(
        response_timeout_ms,
        RESPONSE_TIMEOUT_MS,
        defaults.response_timeout.as_millis() as u64
    );
    let max_body_bytes = ranged_setting!(max_body_bytes, MAX_BODY_BYTES, DEFAULT_MAX_BODY_BYTES);
    let request_buffer_bytes = ranged_setting!(
        request_buffer_bytes,
        REQUEST_BUFFER_BYTES,
        defaults.request_buffer_bytes
    );
    let backend_connections = ranged_setting!(
        backend_connections,
        BACKEND_CONNECTIONS,
        defaults.backend_connections
    );
    let backend_idle_timeout_ms = ranged_setting!(
        backend_idle_timeout_ms,
        BACKEND_IDLE_TIMEOUT_MS,
        as_ms(defaults.backend_idle_timeout)
    );
    let client_request_timeout_ms = ranged_setting!(
        client_request_timeout_ms,
        CLIENT_REQUEST_TIMEOUT_MS,
        as_ms(defaults.client_request_timeout)
    );
    let backend_max_connections = ranged_setting!(
        backend_max_connections,
        BACKEND_MAX_CONNECTIONS,
        defaults.backend_max_connections
    );
    let backend_sharing = setting(
        &at,
        "backend_sharing",
        flags.backend_sharing.clone(),
        cfg.backend_sharing.clone(),
    )
    .and_then(|(o, v)| match v.as_str() {
        "pipelined" => Some(flick_platform::Sharing::Pipelined),
        "exclusive" => Some(flick_platform::Sharing::Exclusive),
        _ => {
            errors.push(format!(
                "{o}: `{v}` is not a way of sharing: pipelined or exclusive"
            ));
            None
        }
    });
    let accept = setting(&at, "accept", flags.accept.clone(), cfg.accept.clone()).map_or(
        defaults.accept,
        |(o, v)| match v.as_str() {
            "per-worker" => flick_platform::Accept::PerWorker,
            "single" => flick_platform::Accept::Single,
            _ => {
                errors.push(format!(
                    "{o}: `{v}` is not a way of accepting: per-worker or single"
                ));
                defaults.accept
            }
        },
    );
    let fan_in_timeout_ms = ranged_setting!(
        fan_in_timeout_ms,
        RESPONSE_TIMEOUT_MS,
        defaults.fan_in_timeout.as_millis() as u64
    );
    let connect_timeout_ms = ranged_setting!(
        connect_timeout_ms,
        RESPONSE_TIMEOUT_MS,
        defaults.connect_timeout.as_millis() as u64
    );
    let weight = cfg.weight.map_or(defaults.weight, |w| {
        ranged(&mut errors, &at("weight"), w, &WEIGHT)
    });
    // A port's file is found where the configuration file is, as the
    // program is.
    let ports = cfg
        .ports
        .iter()
        .map(|(c, specs)| {
            let specs = specs
                .0
                .iter()
                .map(|spec| match spec.split_once(':') {
                    Some((kind @ ("pcap" | "pcap-out"), file)) => {
                        format!("{kind}:{}", dir.join(file).display())
                    }
                    _ => spec.clone(),
                })
                .collect();
            (c.clone(), specs)
        })
        .collect();
    match program {
        Some(program) if errors.is_empty() => Ok(Settings {
            program,
            listen: listen_addrs,
            connect: connect_addrs,
            workers,
            pin_workers,
            timeslice_us,
            metrics,
            access_log,
            max_instances,
            graphs_ahead,
            channel_capacity,
            dict_capacity,
            response_timeout_ms,
            max_body_bytes,
            request_buffer_bytes,
            backend_connections,
            backend_idle_timeout_ms,
            client_request_timeout_ms,
            backend_max_connections,
            backend_sharing,
            accept,
            fan_in_timeout_ms,
            connect_timeout_ms,
            weight,
            fan_in,
            ports,
        }),
        _ => Err(errors),
    }
}

/// Checks the bindings against the process's channels (`arrays[i]`: channel
/// `i` is a channel array): every name is a channel, exactly one channel
/// listens, every other channel connects, a plain channel connects to one
/// address. Returns every problem.
pub fn check_bindings(
    process: &str,
    channels: &[String],
    arrays: &[bool],
    settings: &Settings,
) -> Vec<String> {
    let mut errors = Vec::new();
    let known = |c: &str| channels.iter().position(|n| n == c);
    let list = channels.join(", ");
    for (c, _) in &settings.listen {
        match known(c) {
            None => errors.push(format!(
                "listen: `{c}` is not a channel of process `{process}` (its channels: {list})"
            )),
            Some(i) if arrays.get(i) == Some(&true) => {
                if !settings.fan_in.iter().any(|(f, _)| f == c) {
                    errors.push(format!(
                        "listen: `{c}` is a channel array: say how many connections make up one instance with --fan-in {c}=N (or in [fan_in])"
                    ))
                }
            }
            Some(_) => {}
        }
    }
    for (c, _) in &settings.fan_in {
        let listening_array = settings.listen.iter().any(|(l, _)| l == c)
            && known(c).is_some_and(|i| arrays.get(i) == Some(&true));
        if !listening_array {
            errors.push(format!(
                "fan_in: `{c}` is not a listening channel array of process `{process}`"
            ));
        }
    }
    for (c, addrs) in &settings.connect {
        match known(c) {
            None => errors.push(format!(
                "connect: `{c}` is not a channel of process `{process}` (its channels: {list})"
            )),
            Some(i) if arrays.get(i) != Some(&true) && addrs.len() != 1 => errors.push(format!(
                "connect: `{c}` is a single channel; bind it to one address, not {}",
                addrs.len()
            )),
            Some(_) => {}
        }
        if settings.listen.iter().any(|(l, _)| l == c) {
            errors.push(format!("channel `{c}` both listens and connects"));
        }
    }
    match settings.listen.len() {
        0 => errors
            .push("nothing listens: bind a channel with --listen (or in [listen])".to_string()),
        1 => {}
        _ => errors.push(format!(
            "only one channel can listen, but {} do",
            settings
                .listen
                .iter()
                .map(|(c, _)| format!("`{c}`"))
                .collect::<Vec<_>>()
                .join(" and ")
        )),
    }
    for c in channels {
        let bound = settings.listen.iter().any(|(l, _)| l == c)
            || settings.connect.iter().any(|(k, _)| k == c);
        if !bound {
            errors.push(format!(
                "channel `{c}` has no binding: give it --listen or --connect (or bind it in [listen] or [connect])"
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
program = "proxy.flick"
workers = 2
metrics = "127.0.0.1:9100"

[listen]
client = "127.0.0.1:11211"

[connect]
backends = ["127.0.0.1:1", "127.0.0.1:2"]
one = "127.0.0.1:3"
"#;

    /// Flags that give only the program.
    fn program() -> Overrides {
        Overrides {
            program: Some("p.flick".into()),
            ..Overrides::default()
        }
    }

    /// The settings of a file `f.toml` holding `text`, with `flags`.
    fn with_file(text: &str, flags: &Overrides) -> Settings {
        let cfg = FileConfig::parse(text).unwrap();
        resolve(Some((&cfg, Path::new("f.toml"))), flags).unwrap()
    }

    #[test]
    fn a_file_resolves_with_its_program_beside_it() {
        let cfg = FileConfig::parse(GOOD).unwrap();
        let s = resolve(
            Some((&cfg, Path::new("etc/flick.toml"))),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(s.program, Path::new("etc/proxy.flick"));
        assert_eq!(s.workers, Some(2));
        assert_eq!(s.timeslice_us, 50);
        assert_eq!(
            s.listen,
            vec![("client".into(), "127.0.0.1:11211".parse().unwrap())]
        );
        assert_eq!(s.connect[0].1.len(), 2);
        assert_eq!(
            s.connect[1],
            ("one".into(), vec!["127.0.0.1:3".parse().unwrap()])
        );
        assert_eq!(s.metrics, Some("127.0.0.1:9100".parse().unwrap()));
    }

    #[test]
    fn flags_override_the_file() {
        let cfg = FileConfig::parse(GOOD).unwrap();
        let flags = Overrides {
            program: Some("other.flick".into()),
            listen: vec!["client=127.0.0.1:5".into()],
            connect: vec!["backends=127.0.0.1:6".into()],
            workers: Some(3),
            timeslice_us: Some(7),
            ..Overrides::default()
        };
        let s = resolve(Some((&cfg, Path::new("etc/flick.toml"))), &flags).unwrap();
        assert_eq!(s.program, Path::new("other.flick"));
        assert_eq!(s.workers, Some(3));
        assert_eq!(s.timeslice_us, 7);
        assert_eq!(s.listen[0].1.port(), 5);
        assert_eq!(s.connect[0].1, vec!["127.0.0.1:6".parse().unwrap()]);
    }

    #[test]
    fn workers_are_pinned_only_when_the_file_or_the_flag_says() {
        let unset = with_file("program = \"p.flick\"\n", &Overrides::default());
        assert!(!unset.pin_workers);
        let file = "program = \"p.flick\"\npin_workers = true\n";
        assert!(with_file(file, &Overrides::default()).pin_workers);
        let flag = Overrides {
            pin_workers: Some(true),
            ..Overrides::default()
        };
        assert!(with_file("program = \"p.flick\"\n", &flag).pin_workers);
        assert!(FileConfig::parse("pin_workers = 1\n").is_err());
    }

    #[test]
    fn graphs_made_ahead_come_from_the_file_or_the_flag() {
        let file = "program = \"p.flick\"\ngraphs_ahead = 300\n";
        assert_eq!(with_file(file, &Overrides::default()).graphs_ahead, 300);
        let flag = Overrides {
            graphs_ahead: Some(0),
            ..Overrides::default()
        };
        assert_eq!(with_file(file, &flag).graphs_ahead, 0);
        let unset = with_file("program = \"p.flick\"\n", &Overrides::default());
        assert_eq!(
            unset.graphs_ahead,
            flick_platform::ServiceConfig::default().graphs_ahead
        );
        let cfg = FileConfig::parse("program = \"p.flick\"\ngraphs_ahead = 100001\n").unwrap();
        let e = resolve(Some((&cfg, Path::new("f.toml"))), &Overrides::default()).unwrap_err();
        assert_eq!(
            e,
            vec!["f.toml: graphs_ahead: 100001 is out of range: must be between 0 and 100000"]
        );
    }

    #[test]
    fn accepting_is_per_worker_unless_said() {
        let s = with_file(
            "program = \"p.flick\"\naccept = \"single\"\n",
            &Overrides::default(),
        );
        assert_eq!(s.accept, flick_platform::Accept::Single);
        let s = resolve(None, &program()).unwrap();
        assert_eq!(s.accept, flick_platform::Accept::PerWorker);
        let flags = Overrides {
            accept: Some("every".into()),
            ..program()
        };
        let e = resolve(None, &flags).unwrap_err();
        assert_eq!(
            e,
            vec!["--accept: `every` is not a way of accepting: per-worker or single".to_string()]
        );
    }

    #[test]
    fn max_body_bytes_is_1_mib_unless_set() {
        let s = resolve(None, &program()).unwrap();
        assert_eq!(s.max_body_bytes, 1 << 20);
        let file = "program = \"p.flick\"\nmax_body_bytes = 5000\n";
        let s = with_file(file, &Overrides::default());
        assert_eq!(s.max_body_bytes, 5000);
        let flags = Overrides {
            max_body_bytes: Some(7),
            ..Overrides::default()
        };
        assert_eq!(with_file(file, &flags).max_body_bytes, 7);
        let flags = Overrides {
            max_body_bytes: Some((1 << 30) + 1),
            ..program()
        };
        assert_eq!(
            resolve(None, &flags).unwrap_err(),
            vec![
                "--max-body-bytes: 1073741825 is out of range: must be between 0 and 1073741824"
                    .to_string()
            ]
        );
    }

    #[test]
    fn client_request_timeout_is_60_s_unless_set_and_checked() {
        let s = resolve(None, &program()).unwrap();
        assert_eq!(s.client_request_timeout_ms, 60_000);
        let file = "program = \"p.flick\"\nclient_request_timeout_ms = 500\n";
        let s = with_file(file, &Overrides::default());
        assert_eq!(s.client_request_timeout_ms, 500);
        let flags = Overrides {
            client_request_timeout_ms: Some(0),
            ..Overrides::default()
        };
        assert_eq!(
            with_file(file, &flags).client_request_timeout_ms,
            0,
            "the flag wins over the file"
        );
        let flags = Overrides {
            client_request_timeout_ms: Some(3_600_001),
            ..program()
        };
        assert!(resolve(None, &flags).is_err());
    }

    #[test]
    fn request_buffer_bytes_is_16_kib_unless_set_and_checked() {
        let s = resolve(None, &program()).unwrap();
        assert_eq!(s.request_buffer_bytes, 16 << 10);
        let file = "program = \"p.flick\"\nrequest_buffer_bytes = 65536\n";
        let s = with_file(file, &Overrides::default());
        assert_eq!(s.request_buffer_bytes, 65536);
        let flags = Overrides {
            request_buffer_bytes: Some(0),
            ..Overrides::default()
        };
        assert_eq!(
            with_file(file, &flags).request_buffer_bytes,
            0,
            "the flag wins over the file"
        );
        let flags = Overrides {
            request_buffer_bytes: Some((1 << 20) + 1),
            ..program()
        };
        assert_eq!(
            resolve(None, &flags).unwrap_err(),
            vec![
                "--request-buffer-bytes: 1048577 is out of range: must be between 0 and 1048576"
                    .to_string()
            ]
        );
    }

    #[test]
    fn weight_is_1_unless_set_and_checked() {
        let s = resolve(None, &program()).unwrap();
        assert_eq!(s.weight, 1);
        let cfg = FileConfig::parse("program = \"p.flick\"\nweight = 4\n").unwrap();
        let s = resolve(Some((&cfg, Path::new("c.toml"))), &Overrides::default()).unwrap();
        assert_eq!(s.weight, 4);
        for bad in [0, 1001] {
            let cfg =
                FileConfig::parse(&format!("program = \"p.flick\"\nweight = {bad}\n")).unwrap();
            let errors =
                resolve(Some((&cfg, Path::new("c.toml"))), &Overrides::default()).unwrap_err();
            assert_eq!(
                errors,
                [format!(
                    "c.toml: weight: {bad} is out of range: must be between 1 and 1000"
                )]
            );
        }
        let e = FileConfig::parse("weight = -1\n").unwrap_err();
        assert!(e.contains("weight"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = FileConfig::parse("workers = 1\nwokers = 2\n").unwrap_err();
        assert!(e.contains("wokers"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        let e = FileConfig::parse("connect = { b = 3 }\n").unwrap_err();
        assert!(e.contains("host:port"), "{e}");
    }

    #[test]
    fn every_problem_is_reported() {
        let cfg =
            FileConfig::parse("workers = 0\nmax_instances = 0\n[listen]\nclient = \"127.0.0.1\"\n")
                .unwrap();
        let flags = Overrides {
            max_instances: Some(1),
            channel_capacity: Some(0),
            ..Overrides::default()
        };
        let e = resolve(Some((&cfg, Path::new("f.toml"))), &flags).unwrap_err();
        assert_eq!(e.len(), 4, "{e:?}");
        assert!(e[0].starts_with("no program"), "{e:?}");
        assert!(
            e.contains(&"f.toml: listen.client: `127.0.0.1`: invalid socket address".into()),
            "{e:?}"
        );
        assert!(
            e.contains(&"f.toml: workers: 0 is out of range: must be between 1 and 1024".into()),
            "{e:?}"
        );
        assert!(
            e.contains(
                &"--channel-capacity: 0 is out of range: must be between 1 and 65536".into()
            ),
            "{e:?}"
        );
    }

    #[test]
    fn bindings_are_checked_against_the_process() {
        let chans = ["client".to_string(), "backends".to_string()];
        let arrays = [false, true];
        let cfg = FileConfig::parse(GOOD).unwrap();
        let s = resolve(Some((&cfg, Path::new("f.toml"))), &Overrides::default()).unwrap();
        let e = check_bindings("P", &chans, &arrays, &s);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].contains("`one` is not a channel of process `P`"),
            "{e:?}"
        );
        let flags = Overrides {
            program: Some("p".into()),
            listen: vec!["backends=127.0.0.1:1".into()],
            connect: vec!["client=127.0.0.1:1,127.0.0.1:2".into()],
            ..Overrides::default()
        };
        let s = resolve(None, &flags).unwrap();
        let e = check_bindings("P", &chans, &arrays, &s);
        assert!(e.iter().any(|m| m.contains("channel array")), "{e:?}");
        assert!(e.iter().any(|m| m.contains("single channel")), "{e:?}");
    }
}
