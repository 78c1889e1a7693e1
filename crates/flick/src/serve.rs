//! `flick serve`: many services on one platform (one set of workers),
//! deployed, inspected, redeployed and undeployed at run time through an
//! HTTP/1.1 JSON API (docs/api/openapi.yaml), each recorded in a state
//! directory and deployed again when `serve` restarts.
//!
//! A deploy is the front end of `flick run` (load, check, bindings) and
//! `Service::start_on` the shared platform: nothing else restarts. Each
//! service reserves its static memory bound (the checker's instance bound
//! times its `max_instances`, plus its `global` state) against the
//! `--memory-budget`.
//!
//! The API answers one request per connection, at most [`MAX_CLIENTS`] at
//! once, each bounded in size and time (`api.rs`).

mod packets;

use crate::api::{self, ApiAddr, HttpError, Request};
use crate::reload::{DictOf, Scalar, StateVar};
use flick_platform::{EntryRef, EntryValue, Platform, PlatformConfig, Service, StateValue};
use flick_span::SourceFile;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// API requests served at once; more are answered 503 and closed.
pub const MAX_CLIENTS: usize = 16;
/// How long an undeployed (or replaced) service's connections may take to
/// finish what they have.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(5);
/// Instances a service may run at once unless its bindings say.
pub const DEFAULT_MAX_INSTANCES: usize = 1024;
/// Dictionary entries a listing gives unless `limit` says, and the most
/// it gives.
pub const LIST_LIMIT: usize = 100;
pub const LIST_LIMIT_MAX: usize = 1000;

/// What `flick serve` was told.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub api: ApiAddr,
    pub api_token: Option<String>,
    pub state_dir: PathBuf,
    pub workers: usize,
    /// Worker `i` kept on the `i`-th core the process may run on.
    pub pin_workers: bool,
    /// Bytes all services may reserve together; `None`: no limit.
    pub memory_budget: Option<u64>,
    /// The platform's task table, over every service.
    pub tasks: usize,
    /// How often each service's `global` state is saved to the state
    /// directory while it runs, when it changed; `None`: only at a clean stop.
    pub save_every: Option<Duration>,
}

/// The default API address: a Unix socket in the state directory.
pub fn default_api(state_dir: &Path) -> ApiAddr {
    ApiAddr::Unix(state_dir.join("flick.sock"))
}

/// A deploy request: the program and its bindings, as `flick run` takes
/// them (`CHANNEL=ADDR` strings, a TOML configuration's text).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeploySpec {
    #[serde(default)]
    pub name: String,
    /// The program's file name, for diagnostics and to find grammars.
    #[serde(default)]
    pub file: String,
    /// The program's text.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub program: String,
    #[serde(default)]
    pub listen: Vec<String>,
    #[serde(default)]
    pub connect: Vec<String>,
    /// A `flick run` configuration file's text (bindings and limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_instances: Option<usize>,
    /// Its share of the workers against the other services' (1 to 1000;
    /// the configuration's `weight`, or 1, unless given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// `CHANNEL=SPEC[,SPEC...]`: packet ports, for a packet program or a
    /// machine (`N=SPEC` for an XL program's numbered ports).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot create the state directory {0}: {1}")]
    StateDir(PathBuf, std::io::Error),
    #[error("cannot listen for the API on {0}: {1}")]
    Listen(String, std::io::Error),
    #[error("the API would listen on {0}, which is not loopback: give --api-token TOKEN, and every request must carry it")]
    NotLoopback(std::net::SocketAddr),
    #[error("something already serves the API at {0}")]
    InUse(String),
    #[error(transparent)]
    Platform(#[from] flick_platform::PlatformError),
}

/// A refused request: its status, message and, for a program that does
/// not check, the diagnostics rendered as text.
#[derive(Debug)]
struct Refusal {
    status: u16,
    message: String,
    diagnostics: Option<String>,
}

impl Refusal {
    fn new(status: u16, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
            diagnostics: None,
        }
    }

    fn json(&self) -> Json {
        let mut j = json!({ "error": self.message });
        if let Some(d) = &self.diagnostics {
            j["diagnostics"] = Json::String(d.clone());
        }
        j
    }
}

impl From<HttpError> for Refusal {
    fn from(e: HttpError) -> Refusal {
        Refusal::new(e.status, e.message)
    }
}

/// One deployed service.
struct Deployed {
    spec: DeploySpec,
    service: Arc<Service>,
    /// Its static memory bound, reserved against the budget.
    reserved: u64,
    max_instances: usize,
    state: Vec<StateVar>,
    version: u64,
    deploy_us: u64,
    /// Globals carried over from the version it replaced.
    carried: Vec<String>,
    /// The weight it was given (what `Service::weight` says it runs with,
    /// unless the scheduler had no group for it).
    weight: u32,
}

struct Registry {
    platform: Platform,
    services: Mutex<BTreeMap<String, Deployed>>,
    /// Services on packet ports (packet programs and machines); a name is
    /// in one map or the other. Locked after `services` where both are.
    packet_services: Mutex<BTreeMap<String, packets::Running>>,
    budget: Option<u64>,
    dir: PathBuf,
    /// Held while state files are written or removed, so that a save
    /// racing an undeploy never leaves a removed service's state behind.
    saving: Mutex<()>,
}

/// A program checked and its service configured, not started yet.
struct Prepared {
    loaded: flick_platform::Loaded,
    config: flick_platform::ServiceConfig,
    reserved: u64,
    bound: String,
    max_instances: usize,
    state: Vec<StateVar>,
    /// The weight the request or its configuration gives, if either does.
    weight: Option<u32>,
}

/// The weight of a service the request says nothing of (nor a recorded
/// earlier version).
pub const DEFAULT_WEIGHT: u32 = 1;

/// A weight checked against [`crate::config::WEIGHT`].
fn checked_weight(w: u64) -> Result<u32, Refusal> {
    u32::try_from(w)
        .ok()
        .filter(|w| crate::config::WEIGHT.contains(w))
        .ok_or_else(|| {
            Refusal::new(
                400,
                format!(
                    "weight: {w} is out of range: must be between {} and {}",
                    crate::config::WEIGHT.start(),
                    crate::config::WEIGHT.end()
                ),
            )
        })
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Refuses a deploy of a name already deployed (409) and a redeploy of
/// one that is not (404).
fn check_presence(name: &str, exists: bool, replace: bool) -> Result<(), Refusal> {
    match (exists, replace) {
        (true, false) => Err(Refusal::new(
            409,
            format!("service `{name}` is deployed already: redeploy it with PUT"),
        )),
        (false, true) => Err(Refusal::new(404, format!("no service `{name}`"))),
        _ => Ok(()),
    }
}

/// A deployed program read and checked: its file name, source, tree and
/// checked form.
struct Checked {
    file_name: String,
    file: SourceFile,
    program: flick_syntax::ast::Program,
    checked: flick_check::CheckedProgram,
}

/// Reads and checks the program of `spec` (its file name, or NAME.flick),
/// refusing one that does not check with its diagnostics.
fn check_deployed(spec: &DeploySpec) -> Result<Checked, Refusal> {
    let file_name = if spec.file.is_empty() {
        format!("{}.flick", spec.name)
    } else {
        spec.file.clone()
    };
    let text = crate::views::program_source(&spec.program).into_owned();
    let file = SourceFile::new(&file_name, text);
    let (program, _) = flick_syntax::parse(&file.text);
    let (checked, diags) = crate::views::check_program(Path::new(&file_name), &file.text);
    if !diags.is_empty() {
        return Err(Refusal {
            status: 422,
            message: format!("{file_name} does not check"),
            diagnostics: Some(crate::render::render(&file, &diags, false)),
        });
    }
    Ok(Checked {
        file_name,
        file,
        program,
        checked,
    })
}

/// Load, check and bind a program, as `flick run` does.
fn prepare(spec: &DeploySpec) -> Result<Prepared, Refusal> {
    use crate::config::{check_bindings, resolve, FileConfig, Overrides};
    let Checked {
        file_name,
        file,
        program,
        checked,
    } = check_deployed(spec)?;
    let path = Path::new(&file_name);
    let procs = checked.processes.len();
    if procs != 1 {
        return Err(Refusal::new(
            422,
            format!("a service runs one process, and {file_name} has {procs}"),
        ));
    }
    if checked.grammar.as_deref() == Some("packet") {
        return Err(Refusal::new(
            422,
            "a packet program is bound to packet ports: deploy it with `--port CH=SPEC`",
        ));
    }
    let grammar = match &checked.grammar {
        Some(g) => crate::views::find_grammar(g, path),
        None => crate::views::record_grammar(path, &program, &checked)
            .map_err(|why| format!("{file_name} names no wire grammar: {why}")),
    }
    .map_err(|why| Refusal::new(422, why))?;
    let file_config = match &spec.config {
        None => None,
        Some(t) => Some(
            FileConfig::parse(t).map_err(|e| Refusal::new(400, format!("configuration: {e}")))?,
        ),
    };
    let flags = Overrides {
        program: Some(file_name.clone()),
        listen: spec.listen.clone(),
        connect: spec.connect.clone(),
        max_instances: spec.max_instances.or(match &file_config {
            Some(c) if c.max_instances.is_some() => None,
            _ => Some(DEFAULT_MAX_INSTANCES),
        }),
        ..Overrides::default()
    };
    let config_path = PathBuf::from(format!("{}.toml", spec.name));
    let settings = resolve(
        file_config.as_ref().map(|c| (c, config_path.as_path())),
        &flags,
    )
    .map_err(|e| Refusal::new(400, e.join("; ")))?;
    let weight = match spec.weight {
        Some(w) => Some(checked_weight(w.into())?),
        None => file_config.as_ref().and_then(|c| c.weight),
    };
    // The grammar's limits, before any parser copies them (the grammar
    // was just loaded: nothing else holds it yet).
    let mut grammar = grammar;
    let g = Arc::get_mut(&mut grammar).expect("a grammar of its own");
    g.set_limit("max_body_bytes", settings.max_body_bytes as i128);
    let mut loaded = flick_platform::Loaded::new(&program, &checked, grammar)
        .map_err(|e| Refusal::new(422, e.to_string()))?;
    loaded.source = Some(Arc::new(file.clone()));
    let code = &loaded.module.processes[loaded.process];
    let errors = check_bindings(&code.name, &code.channels, &loaded.arrays, &settings);
    if !errors.is_empty() {
        return Err(Refusal::new(400, errors.join("; ")));
    }
    let bounds = &checked.processes[0].bounds;
    let reserved = bounds
        .instance_bytes
        .saturating_mul(settings.max_instances as u64)
        .saturating_add(bounds.global_bytes);
    let bound = format!(
        "{} B per instance x {} instances + {} B of global state",
        bounds.instance_bytes, settings.max_instances, bounds.global_bytes
    );
    let state = crate::reload::state_vars(&checked.processes[0]);
    let config = flick_platform::ServiceConfig {
        listen: settings.listen.clone(),
        fan_in: settings.fan_in.clone(),
        connect: settings.connect.clone(),
        max_instances: settings.max_instances,
        channel_capacity: settings.channel_capacity,
        dict_capacity: settings.dict_capacity,
        response_timeout: Duration::from_millis(settings.response_timeout_ms),
        request_buffer_bytes: settings.request_buffer_bytes,
        backend_connections: settings.backend_connections,
        backend_idle_timeout: (settings.backend_idle_timeout_ms > 0)
            .then(|| Duration::from_millis(settings.backend_idle_timeout_ms)),
        client_request_timeout: (settings.client_request_timeout_ms > 0)
            .then(|| Duration::from_millis(settings.client_request_timeout_ms)),
        backend_max_connections: settings.backend_max_connections,
        backend_sharing: settings.backend_sharing,
        accept: settings.accept,
        fan_in_timeout: Duration::from_millis(settings.fan_in_timeout_ms),
        connect_timeout: Duration::from_millis(settings.connect_timeout_ms),
        // A new version listens beside the old one before it goes.
        reuse_port: true,
        // Many services share the machine: each makes little ahead of
        // its load, and its pools grow with it.
        graphs_ahead: 1,
        message_pool: 1024,
        messages_ahead: 0,
        weight: weight.unwrap_or(DEFAULT_WEIGHT),
        ..flick_platform::ServiceConfig::default()
    };
    Ok(Prepared {
        loaded,
        config,
        reserved,
        bound,
        max_instances: settings.max_instances,
        state,
        weight,
    })
}

impl Registry {
    fn reserved_except(&self, services: &BTreeMap<String, Deployed>, name: &str) -> (u64, usize) {
        let others = services.iter().filter(|(n, _)| *n != name);
        let (b, n) = others.fold((0, 0), |(b, n), (_, d)| (b + d.reserved, n + 1));
        let packet = self.packet_services.lock().expect("packet services lock");
        let others = packet.iter().filter(|(n, _)| *n != name);
        others.fold((b, n), |(b, n), (_, d)| (b + d.reserved, n + 1))
    }

    /// Deploys (or redeploys) a packet program or a machine on its ports.
    fn deploy_packets(
        &self,
        spec: DeploySpec,
        kind: packets::Kind,
        replace: bool,
        started: Instant,
    ) -> Result<Json, Refusal> {
        // Held throughout: the name is checked against both maps.
        let services = self.services.lock().expect("services lock");
        if services.contains_key(&spec.name) {
            return Err(Refusal::new(
                409,
                format!(
                    "service `{}` is deployed already, on sockets: undeploy it first",
                    spec.name
                ),
            ));
        }
        let exists = self
            .packet_services
            .lock()
            .expect("packet services lock")
            .contains_key(&spec.name);
        check_presence(&spec.name, exists, replace)?;
        if replace {
            let mut packet = self.packet_services.lock().expect("packet services lock");
            let running = packet.get_mut(&spec.name).expect("checked above");
            if let Some(answer) = running.replace_tables(&spec) {
                let answer = answer?;
                if let Err(e) = self.record(&running.spec) {
                    tracing::warn!(service = %spec.name, "cannot record the service in the state directory: {e}");
                }
                tracing::info!(service = %spec.name, version = running.version, "redeployed: tables replaced, flow contexts kept");
                return Ok(answer);
            }
        }
        let (others, n) = self.reserved_except(&services, &spec.name);
        // A replaced version's ports close before the new one opens them.
        let old = match replace {
            true => self
                .packet_services
                .lock()
                .expect("packet services lock")
                .remove(&spec.name),
            false => None,
        };
        let version = old.as_ref().map_or(1, |o| o.version + 1);
        let mut state = None;
        if let Some(old) = old {
            let (stopped, kept) = old.stop_keeping();
            state = kept;
            tracing::info!(service = %spec.name, summary = %stopped["summary"], "old version stopped");
        }
        let mut running = packets::start(&spec, kind, &self.dir)?;
        if let Some(budget) = self.budget {
            if others.saturating_add(running.reserved) > budget {
                let reserved = running.reserved;
                running.stop();
                return Err(Refusal::new(
                    507,
                    format!(
                        "service `{}` needs {reserved} bytes (its flow tables and state), but the memory budget is {budget} bytes and {n} services reserve {others} of them ({} left)",
                        spec.name,
                        budget.saturating_sub(others)
                    ),
                ));
            }
        }
        running.version = version;
        // Given before the deploy is answered, so a read after it sees them.
        let carried = state.map_or_else(Vec::new, |s| running.take_over(&s));
        running.carried.clone_from(&carried);
        running.deploy_us = started.elapsed().as_micros() as u64;
        if let Err(e) = self.record(&spec) {
            tracing::warn!(service = %spec.name, "cannot record the service in the state directory: {e}");
        }
        tracing::info!(service = %spec.name, file = %spec.file, ports = ?spec.ports, version, deploy_us = running.deploy_us, "{}", if replace { "redeployed" } else { "deployed" });
        let answer = json!({
            "name": spec.name,
            "kind": match kind { packets::Kind::Packet => "packet", packets::Kind::Machine => "machine" },
            "version": version,
            "listen": "",
            "ports": spec.ports,
            "deploy_us": running.deploy_us,
            "reserved_bytes": running.reserved,
            "carried": carried,
            "weight": DEFAULT_WEIGHT,
        });
        self.packet_services
            .lock()
            .expect("packet services lock")
            .insert(spec.name.clone(), running);
        Ok(answer)
    }

    /// Deploys (or, with `replace`, redeploys) a service.
    fn deploy(
        &self,
        mut spec: DeploySpec,
        replace: bool,
        started: Instant,
    ) -> Result<Json, Refusal> {
        if !valid_name(&spec.name) {
            return Err(Refusal::new(
                400,
                format!(
                    "`{}` is not a service name: 1 to 64 letters, digits, `-` and `_`",
                    spec.name
                ),
            ));
        }
        if let Some(kind) = packets::kind_of(&spec) {
            if let Some(w) = spec.weight {
                return Err(Refusal::new(
                    400,
                    format!("weight {w}: {}", packets::NO_WEIGHT),
                ));
            }
            return self.deploy_packets(spec, kind, replace, started);
        }
        if self
            .packet_services
            .lock()
            .expect("packet services lock")
            .contains_key(&spec.name)
        {
            return Err(Refusal::new(
                409,
                format!(
                    "service `{}` is deployed already, on packet ports: undeploy it first",
                    spec.name
                ),
            ));
        }
        let prepared = prepare(&spec)?;
        let mut services = self.services.lock().expect("services lock");
        let exists = services.contains_key(&spec.name);
        check_presence(&spec.name, exists, replace)?;
        // Listeners share ports (SO_REUSEPORT, for redeploys): another
        // service's address would be taken silently, connections split.
        for (other, d) in services.iter().filter(|(n, _)| **n != spec.name) {
            let theirs = d.service.local_addr();
            for (_, ours) in &prepared.config.listen {
                let same_ip = ours.ip() == theirs.ip()
                    || ours.ip().is_unspecified()
                    || theirs.ip().is_unspecified();
                if ours.port() != 0 && ours.port() == theirs.port() && same_ip {
                    return Err(Refusal::new(
                        409,
                        format!("service `{other}` listens on {theirs} already"),
                    ));
                }
            }
        }
        if let Some(budget) = self.budget {
            let (others, n) = self.reserved_except(&services, &spec.name);
            if others.saturating_add(prepared.reserved) > budget {
                return Err(Refusal::new(
                    507,
                    format!(
                        "service `{}` needs {} bytes ({}), but the memory budget is {budget} bytes and {n} services reserve {others} of them ({} left)",
                        spec.name,
                        prepared.reserved,
                        prepared.bound,
                        budget.saturating_sub(others)
                    ),
                ));
            }
        }
        let Prepared {
            loaded,
            mut config,
            reserved,
            max_instances,
            state,
            weight,
            ..
        } = prepared;
        // A redeploy that names no weight keeps the one the service runs with.
        let weight = weight
            .or_else(|| services.get(&spec.name).map(|d| d.weight))
            .unwrap_or(DEFAULT_WEIGHT);
        config.weight = weight;
        // Recorded with the service, so a restart gives it the same.
        spec.weight = Some(weight);
        // A redeploy takes over the old version's listening sockets once
        // the state is carried, so no connection waiting in them is reset.
        let (service, carried) = match services.get(&spec.name) {
            Some(old) => crate::reload::start_next(
                &self.platform,
                loaded,
                config,
                &old.service,
                &old.state,
                &state,
            ),
            None => Service::start_on(&self.platform, loaded, config).map(|service| {
                crate::reload::bound_dicts(&service, &state);
                (service, Vec::new())
            }),
        }
        .map_err(|e| Refusal::new(409, e.to_string()))?;
        let old = services.remove(&spec.name);
        let deploy_us = started.elapsed().as_micros() as u64;
        let version = old.as_ref().map_or(1, |o| o.version + 1);
        if let Err(e) = self.record(&spec) {
            tracing::warn!(service = %spec.name, "cannot record the service in the state directory: {e}");
        }
        let local = service.local_addr();
        tracing::info!(
            service = %spec.name,
            file = %spec.file,
            listen = %local,
            version,
            weight,
            deploy_us,
            carried = ?carried,
            "{}",
            if replace { "redeployed" } else { "deployed" }
        );
        let answer = json!({
            "name": spec.name,
            "version": version,
            "listen": local.to_string(),
            "deploy_us": deploy_us,
            "reserved_bytes": reserved,
            "carried": carried,
            "weight": weight,
        });
        services.insert(
            spec.name.clone(),
            Deployed {
                spec,
                service: Arc::new(service),
                reserved,
                max_instances,
                state,
                version,
                deploy_us,
                carried,
                weight,
            },
        );
        drop(services);
        // Loading and checking a program leaves the allocator holding
        // free pages (in the API thread's arena): given back now, or an
        // idle service would seem to cost them.
        flick_platform::release_free_memory();
        // The new version accepts already; the old one drains beside it.
        if let Some(old) = old {
            let stopped = old.service.stop(DRAIN_DEADLINE);
            tracing::info!(service = %old.spec.name, version = old.version, drained = stopped.drained, handed_over = stopped.handed_over, "old version stopped");
        }
        Ok(answer)
    }

    fn undeploy(&self, name: &str) -> Result<Json, Refusal> {
        let packet = self
            .packet_services
            .lock()
            .expect("packet services lock")
            .remove(name);
        if let Some(running) = packet {
            {
                let _saving = self.saving.lock().expect("saving lock");
                self.forget(name);
            }
            let answer = running.stop();
            tracing::info!(service = %name, summary = %answer["summary"], "undeployed; its ports are closed");
            return Ok(answer);
        }
        let old = self
            .services
            .lock()
            .expect("services lock")
            .remove(name)
            .ok_or_else(|| Refusal::new(404, format!("no service `{name}`")))?;
        {
            let _saving = self.saving.lock().expect("saving lock");
            self.forget(name);
        }
        let started = Instant::now();
        let stopped = old.service.stop(DRAIN_DEADLINE);
        tracing::info!(
            service = %name,
            drained = stopped.drained,
            clients_left = stopped.clients_left,
            "undeployed"
        );
        Ok(json!({
            "name": name,
            "drained": stopped.drained,
            "clients_left": stopped.clients_left,
            "stop_us": started.elapsed().as_micros() as u64,
        }))
    }

    /// Gives a running service another weight, from each worker's next
    /// turn of it, and records it for the next `serve`.
    fn set_weight(&self, name: &str, body: &[u8]) -> Result<Json, Refusal> {
        let j: Json = serde_json::from_slice(body)
            .map_err(|e| Refusal::new(400, format!("the body is not JSON: {e}")))?;
        let given = j.get("weight").unwrap_or(&j);
        let w = given.as_u64().ok_or_else(|| {
            Refusal::new(
                400,
                format!("give the weight as {{\"weight\": N}}, N from 1 to 1000, not {given}"),
            )
        })?;
        let weight = checked_weight(w)?;
        if self
            .packet_services
            .lock()
            .expect("packet services lock")
            .contains_key(name)
        {
            return Err(Refusal::new(
                422,
                format!("service `{name}`: {}", packets::NO_WEIGHT),
            ));
        }
        let mut services = self.services.lock().expect("services lock");
        let d = services
            .get_mut(name)
            .ok_or_else(|| Refusal::new(404, format!("no service `{name}`")))?;
        let previous = d.weight;
        d.service.set_weight(weight);
        d.weight = weight;
        d.spec.weight = Some(weight);
        if let Err(e) = self.record(&d.spec) {
            tracing::warn!(service = %name, "cannot record the service in the state directory: {e}");
        }
        tracing::info!(service = %name, weight, previous, "weight changed");
        Ok(json!({ "name": name, "weight": weight, "previous": previous }))
    }

    fn services_dir(&self) -> PathBuf {
        self.dir.join("services")
    }

    /// Writes the program and its bindings (without the text) to the state
    /// directory, each file replaced whole.
    fn record(&self, spec: &DeploySpec) -> std::io::Result<()> {
        let dir = self.services_dir();
        std::fs::create_dir_all(&dir)?;
        let write = |name: String, bytes: &[u8]| -> std::io::Result<()> {
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(tmp, dir.join(name))
        };
        write(format!("{}.flick", spec.name), spec.program.as_bytes())?;
        let bindings = DeploySpec {
            program: String::new(),
            ..spec.clone()
        };
        let text = serde_json::to_string_pretty(&bindings).map_err(std::io::Error::other)?;
        write(format!("{}.json", spec.name), text.as_bytes())
    }

    /// Writes a service's `global` integers, booleans, strings and
    /// dictionaries beside its record (replaced whole: written aside,
    /// synced, renamed), for the next `serve` to give back. Its size is
    /// bounded by the dictionaries' capacities and the messages' maxima.
    fn save_state(&self, name: &str, service: &Service, state: &[StateVar]) -> std::io::Result<()> {
        let mut saved = serde_json::Map::new();
        for var in state.iter().filter(|v| v.global) {
            if let Some(DictOf::Messages(_) | DictOf::Values(..)) = &var.dict {
                let entries: Vec<Json> = crate::reload::dict_entries(service, &var.name)
                    .iter()
                    .map(|(k, v)| {
                        let mut e = json!({ "key": hex(k) });
                        match v {
                            EntryValue::Message(b) => e["message"] = json!(hex(b)),
                            EntryValue::Int(n) => e["int"] = json!(n),
                            EntryValue::Bool(b) => e["bool"] = json!(b),
                            EntryValue::Bytes(b) => e["hex"] = json!(hex(b)),
                        }
                        e
                    })
                    .collect();
                saved.insert(
                    var.name.clone(),
                    json!({ "type": var.ty, "entries": entries }),
                );
                continue;
            }
            let value = match service.read_global(&var.name) {
                Ok(StateValue::Int(n)) => json!({ "int": n }),
                Ok(StateValue::Bool(b)) => json!({ "bool": b }),
                Ok(StateValue::Bytes(b)) => json!({ "hex": hex(&b) }),
                _ => continue,
            };
            saved.insert(var.name.clone(), json!({ "type": var.ty, "value": value }));
        }
        let dir = self.services_dir();
        let tmp = dir.join(format!(".{name}.globals.tmp"));
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(Json::Object(saved).to_string().as_bytes())?;
            f.sync_data()?;
        }
        std::fs::rename(tmp, dir.join(format!("{name}.globals")))
    }

    /// Saves every service whose state changed since `saved` says it was
    /// last saved (by the service and its count of changes).
    fn save_changed(&self, saved: &mut BTreeMap<String, (usize, u64)>) {
        let _saving = self.saving.lock().expect("saving lock");
        let now: Vec<(String, Arc<Service>, Vec<StateVar>)> = self
            .services
            .lock()
            .expect("services lock")
            .iter()
            .map(|(n, d)| (n.clone(), d.service.clone(), d.state.clone()))
            .collect();
        saved.retain(|n, _| now.iter().any(|(m, ..)| m == n));
        for (name, service, state) in now {
            let mark = (Arc::as_ptr(&service) as usize, service.state_changes());
            if saved.get(&name) == Some(&mark) {
                continue;
            }
            match self.save_state(&name, &service, &state) {
                Ok(()) => {
                    tracing::debug!(service = %name, "state saved");
                    saved.insert(name, mark);
                }
                Err(e) => tracing::warn!(service = %name, "cannot save its state: {e}"),
            }
        }
    }

    /// Gives a service deployed again from its record the `global`
    /// values and dictionaries saved last (while it ran, or when it
    /// stopped), where the program still declares them with the same
    /// type; what was given back, by name.
    fn restore_globals(&self, name: &str) -> Vec<String> {
        let path = self.services_dir().join(format!("{name}.globals"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Vec::new();
        };
        let Ok(Json::Object(saved)) = serde_json::from_str::<Json>(&text) else {
            tracing::warn!(service = %name, "the saved globals do not read as JSON: not given back");
            return Vec::new();
        };
        let (service, state) = {
            let services = self.services.lock().expect("services lock");
            let Some(d) = services.get(name) else {
                return Vec::new();
            };
            (d.service.clone(), d.state.clone())
        };
        let mut given = Vec::new();
        for var in state.iter().filter(|v| v.global) {
            let Some(entry) = saved.get(&var.name) else {
                continue;
            };
            if entry["type"].as_str() != Some(var.ty.as_str()) {
                continue;
            }
            if let Some(of @ (DictOf::Messages(_) | DictOf::Values(..))) = &var.dict {
                let entries: crate::reload::Entries = entry["entries"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| {
                        let key = unhex(e["key"].as_str()?)?;
                        let value = if let Some(m) = e["message"].as_str() {
                            EntryValue::Message(unhex(m)?)
                        } else if let Some(n) = e["int"].as_i64() {
                            EntryValue::Int(n)
                        } else if let Some(b) = e["bool"].as_bool() {
                            EntryValue::Bool(b)
                        } else {
                            EntryValue::Bytes(unhex(e["hex"].as_str()?)?)
                        };
                        Some((key, value))
                    })
                    .collect();
                if crate::reload::put_entries(&service, &var.name, of, &entries) > 0 {
                    given.push(var.name.clone());
                }
                continue;
            }
            let v = &entry["value"];
            let value = if let Some(n) = v["int"].as_i64() {
                StateValue::Int(n)
            } else if let Some(b) = v["bool"].as_bool() {
                StateValue::Bool(b)
            } else if let Some(b) = v["hex"].as_str().and_then(unhex) {
                StateValue::Bytes(b)
            } else {
                continue;
            };
            if service.write_global(&var.name, value).is_ok() {
                given.push(var.name.clone());
            }
        }
        given
    }

    /// Writes a packet program's `global` state as it ended beside its
    /// record, for the next `serve` (a packet service's is saved only at
    /// a clean stop: its workers hold it, and a dump while running costs
    /// each of them a copy of its shard).
    fn save_packet_state(&self, name: &str, state: &packets::Carried) -> std::io::Result<()> {
        let dir = self.services_dir();
        let tmp = dir.join(format!(".{name}.globals.tmp"));
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(state.to_saved().to_string().as_bytes())?;
            f.sync_data()?;
        }
        std::fs::rename(tmp, dir.join(format!("{name}.globals")))
    }

    /// Gives a packet service deployed again from its record the state
    /// it was stopped with, where the program declares each variable with
    /// the same type; what was given back, by name.
    fn restore_packet_globals(&self, name: &str) -> Vec<String> {
        let path = self.services_dir().join(format!("{name}.globals"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Vec::new();
        };
        let saved = serde_json::from_str::<Json>(&text).ok();
        let Some(state) = saved.as_ref().and_then(packets::Carried::from_saved) else {
            tracing::warn!(service = %name, "the saved globals do not read as saved state: not given back");
            return Vec::new();
        };
        let mut packet = self.packet_services.lock().expect("packet services lock");
        match packet.get_mut(name) {
            Some(running) => {
                let given = running.take_over(&state);
                running.carried.clone_from(&given);
                given
            }
            None => Vec::new(),
        }
    }

    fn forget(&self, name: &str) {
        let dir = self.services_dir();
        for ext in ["json", "flick", "globals"] {
            let _ = std::fs::remove_file(dir.join(format!("{name}.{ext}")));
        }
    }

    /// Deploys every service recorded in the state directory.
    fn restore(&self) -> (usize, usize) {
        let Ok(entries) = std::fs::read_dir(self.services_dir()) else {
            return (0, 0);
        };
        let mut paths: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        paths.sort();
        let (mut ok, mut failed) = (0, 0);
        for p in paths {
            let spec = std::fs::read_to_string(&p)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<DeploySpec>(&t).map_err(|e| e.to_string()))
                .and_then(|mut s| {
                    let program = p.with_extension("flick");
                    s.program = std::fs::read_to_string(&program)
                        .map_err(|e| format!("{}: {e}", program.display()))?;
                    Ok(s)
                });
            match spec.map_err(|e| Refusal::new(400, e)).and_then(|s| {
                let name = s.name.clone();
                self.deploy(s, false, Instant::now()).map(|_| name)
            }) {
                Ok(name) => {
                    ok += 1;
                    let mut given = self.restore_globals(&name);
                    given.extend(self.restore_packet_globals(&name));
                    if !given.is_empty() {
                        tracing::info!(service = %name, globals = ?given, "globals given back from the last stop");
                    }
                }
                Err(r) => {
                    failed += 1;
                    tracing::error!(record = %p.display(), "cannot deploy a recorded service again: {}{}", r.message, r.diagnostics.map(|d| format!("\n{d}")).unwrap_or_default());
                }
            }
        }
        (ok, failed)
    }

    /// Every service's metrics, as `flick run --metrics` serves one
    /// service's, each sample labelled with its service's name.
    fn metrics(&self, format: crate::metrics::Format) -> String {
        let services = self.services.lock().expect("services lock");
        let mut registry = prometheus_client::registry::Registry::default();
        for (name, d) in services.iter() {
            registry
                .sub_registry_with_label(("service".into(), name.clone().into()))
                .register_collector(crate::metrics::collector(d.service.clone()));
        }
        drop(services);
        let packet = self.packet_services.lock().expect("packet services lock");
        for (name, running) in packet.iter() {
            if let Some(c) = running.collector() {
                registry
                    .sub_registry_with_label(("service".into(), name.clone().into()))
                    .register_collector(c);
            }
        }
        crate::metrics::encode(&registry, format)
    }

    fn list(&self) -> Json {
        let services = self.services.lock().expect("services lock");
        let list: Vec<Json> = services
            .iter()
            .map(|(name, d)| {
                json!({
                    "name": name,
                    "file": d.spec.file,
                    "listen": d.service.local_addr().to_string(),
                    "version": d.version,
                    "clients": d.service.client_connections(),
                    "instances": d.service.stats().graphs_live.load(Ordering::Relaxed),
                    "reserved_bytes": d.reserved,
                    "weight": d.service.weight(),
                })
            })
            .collect();
        let mut reserved: u64 = services.values().map(|d| d.reserved).sum();
        let mut list = list;
        for (_, p) in self
            .packet_services
            .lock()
            .expect("packet services lock")
            .iter()
        {
            reserved += p.reserved;
            list.push(p.list_entry());
        }
        json!({
            "services": list,
            "reserved_bytes": reserved,
            "memory_budget": self.budget,
            "workers": self.platform.workers(),
            "tasks_live": self.platform.live_tasks(),
        })
    }

    fn status(&self, name: &str) -> Result<Json, Refusal> {
        if let Some(p) = self
            .packet_services
            .lock()
            .expect("packet services lock")
            .get(name)
        {
            return Ok(p.status());
        }
        let services = self.services.lock().expect("services lock");
        let d = services
            .get(name)
            .ok_or_else(|| Refusal::new(404, format!("no service `{name}`")))?;
        let s = crate::metrics::Sample::of(&d.service);
        Ok(json!({
            "name": name,
            "file": d.spec.file,
            "version": d.version,
            "deploy_us": d.deploy_us,
            "carried": d.carried,
            "weight": d.service.weight(),
            "bindings": {
                "listen": d.spec.listen,
                "connect": d.spec.connect,
                "config": d.spec.config.is_some(),
                "max_instances": d.max_instances,
            },
            "listen": d.service.local_addr().to_string(),
            "reserved_bytes": d.reserved,
            "clients": d.service.client_connections(),
            "parked": d.service.parked_connections(),
            "instances": s.instances_live,
            "state": d.state.iter().map(|v| json!({"name": v.name, "type": v.ty, "global": v.global})).collect::<Vec<_>>(),
            "counters": {
                "connections_accepted": s.connections_accepted,
                "connections_open": s.connections_open,
                "malformed": s.malformed,
                "backend_connect_errors": s.backend_connect_errors,
                "compute_faults": s.compute_faults,
                "fault_replies": s.fault_replies,
                "late_replies": s.late_replies,
                "clients_closed": s.clients_closed,
                "channels": s.channels.iter().map(|(c, i, o)| json!({"channel": c, "messages_in": i, "messages_out": o})).collect::<Vec<_>>(),
                "backends": s.backends.iter().map(|b| json!({"channel": b.channel, "address": b.address, "up": b.up, "connect_failures": b.connect_failures})).collect::<Vec<_>>(),
            },
        }))
    }

    fn service_state(&self, name: &str) -> Result<(Arc<Service>, Vec<StateVar>), Refusal> {
        let services = self.services.lock().expect("services lock");
        services
            .get(name)
            .map(|d| (d.service.clone(), d.state.clone()))
            .ok_or_else(|| Refusal::new(404, format!("no service `{name}`")))
    }

    /// The service and its `global` dictionary `var`, with what its
    /// entries hold (messages of a grammar unit, or integers, booleans or
    /// strings); refused with 404 (no such global), 400 (not a
    /// dictionary) or 422 (a dictionary of values of another type).
    fn dict_var(&self, name: &str, var: &str) -> Result<(Arc<Service>, DictOf), Refusal> {
        let (service, state) = self.service_state(name)?;
        let refuse = |e: flick_platform::StateError| Refusal::new(404, e.to_string());
        // Unknown or `local`: the platform says which.
        service.read_global(var).map_err(refuse)?;
        let v = state
            .iter()
            .find(|v| v.name == var)
            .ok_or_else(|| Refusal::new(404, format!("`{var}` is not state of the process")))?;
        match &v.dict {
            Some(of @ (DictOf::Messages(_) | DictOf::Values(..))) => Ok((service, of.clone())),
            Some(DictOf::Other(of)) => Err(Refusal::new(
                422,
                format!(
                    "`{var}` is a {}: the API reads and writes dictionaries of messages, integers, booleans and strings, not of {of}",
                    v.ty
                ),
            )),
            None => Err(Refusal::new(
                400,
                format!(
                    "`{var}` is a {}, not a dictionary: write it at state/{var}",
                    v.ty
                ),
            )),
        }
    }

    /// `NAME` (a global, or a dictionary's entries) or `NAME/KEY` (a
    /// dictionary entry).
    fn read_state(&self, name: &str, path: &str, req: &Request) -> Result<Json, Refusal> {
        let (service, state) = self.service_state(name)?;
        let refuse = |e: flick_platform::StateError| Refusal::new(404, e.to_string());
        match path.split_once('/') {
            None => {
                let v = service.read_global(path).map_err(refuse)?;
                let ty = state.iter().find(|v| v.name == path);
                match ty.filter(|v| v.dict.is_some()) {
                    Some(var) => list_entries(&service, var, req),
                    None => Ok(json!({ "path": path, "value": to_json(&v) })),
                }
            }
            Some((var, key)) => self.read_entry(name, var, key.as_bytes()),
        }
    }

    /// What the dictionary `var` holds under `key`.
    fn read_entry(&self, name: &str, var: &str, key: &[u8]) -> Result<Json, Refusal> {
        let (service, _) = self.dict_var(name, var)?;
        let d = service
            .global_dict(var)
            .map_err(|e| Refusal::new(404, e.to_string()))?;
        let v = d
            .get(key)
            .map_err(|e| Refusal::new(400, format!("`{var}`: {e}")))?;
        let v = v.ok_or_else(|| {
            Refusal::new(
                404,
                format!("`{var}` holds nothing under {}", shown_key(key)),
            )
        })?;
        let mut answer = entry_answer(var, key);
        entry_json(&mut answer, &v);
        Ok(answer)
    }

    fn write_state(&self, name: &str, path: &str, body: &[u8]) -> Result<Json, Refusal> {
        if let Some((var, key)) = path.split_once('/') {
            return self.write_entry(name, var, key.as_bytes(), body);
        }
        let (service, state) = self.service_state(name)?;
        let (j, value) = scalar_of(&state, path, body)?;
        service.write_global(path, value).map_err(|e| {
            let status = match e {
                flick_platform::StateError::Kind(..) => 400,
                _ => 404,
            };
            Refusal::new(status, e.to_string())
        })?;
        tracing::info!(service = %name, global = %path, value = %j, "state written");
        Ok(json!({ "path": path, "value": j }))
    }

    /// Sets a dictionary entry to a message given as its wire bytes: the
    /// body's `value` (text) or `base64`, or the body a JSON string.
    fn write_entry(&self, name: &str, var: &str, key: &[u8], body: &[u8]) -> Result<Json, Refusal> {
        let (service, of) = self.dict_var(name, var)?;
        let j: Json = serde_json::from_slice(body)
            .map_err(|e| Refusal::new(400, format!("the body is not JSON: {e}")))?;
        let unit = match of {
            DictOf::Messages(unit) => unit,
            DictOf::Values(kind, max) => {
                return self.write_value_entry(name, &service, var, key, &j, kind, max)
            }
            DictOf::Other(_) => unreachable!("dict_var refuses it"),
        };
        let wanted = || {
            Refusal::new(
                400,
                format!("an entry of `{var}` is a `{unit}` message: give its wire bytes as {{\"value\": TEXT}} or {{\"base64\": BASE64}}"),
            )
        };
        let bytes = match (&j, j.get("base64"), j.get("value")) {
            (Json::String(s), ..) => s.clone().into_bytes(),
            (_, Some(Json::String(b)), None) => {
                api::base64_decode(b).ok_or_else(|| Refusal::new(400, "`base64` is not base64"))?
            }
            (_, None, Some(Json::String(s))) => s.clone().into_bytes(),
            _ => return Err(wanted()),
        };
        let d = service
            .global_dict(var)
            .map_err(|e| Refusal::new(404, e.to_string()))?;
        let created = d.insert(key, &unit, &bytes).map_err(|e| {
            let status = match e {
                flick_platform::DictError::Full { .. } => 409,
                flick_platform::DictError::NoUnit(_) => 422,
                _ => 400,
            };
            Refusal::new(status, format!("`{var}`: {e}"))
        })?;
        let size = d.size().map_err(|e| Refusal::new(400, e.to_string()))?;
        tracing::info!(service = %name, dictionary = %var, key = %shown_key(key), bytes = bytes.len(), created, "dictionary entry written");
        let mut answer = entry_answer(var, key);
        answer["value"] = json!(String::from_utf8_lossy(&bytes));
        answer["base64"] = json!(api::base64_encode(&bytes));
        answer["created"] = json!(created);
        answer["len"] = json!(size.len);
        answer["capacity"] = json!(size.capacity);
        Ok(answer)
    }

    /// Sets an entry of a dictionary of integers, booleans or strings to
    /// the body's `value` (or the body itself), which must be of that
    /// kind; a string may come as `base64`, and is at most the declared
    /// maximum long.
    #[allow(clippy::too_many_arguments)]
    fn write_value_entry(
        &self,
        name: &str,
        service: &Service,
        var: &str,
        key: &[u8],
        j: &Json,
        kind: Scalar,
        max: Option<u64>,
    ) -> Result<Json, Refusal> {
        let owned = entry_value_of(var, j, kind, max)?;
        let value = match &owned {
            EntryValue::Int(n) => EntryRef::Int(*n),
            EntryValue::Bool(b) => EntryRef::Bool(*b),
            EntryValue::Bytes(b) => EntryRef::Bytes(b),
            EntryValue::Message(b) => EntryRef::Message(b),
        };
        let d = service
            .global_dict(var)
            .map_err(|e| Refusal::new(404, e.to_string()))?;
        let created = d.insert_value(key, value).map_err(|e| {
            let status = match e {
                flick_platform::DictError::Full { .. } => 409,
                _ => 400,
            };
            Refusal::new(status, format!("`{var}`: {e}"))
        })?;
        let size = d.size().map_err(|e| Refusal::new(400, e.to_string()))?;
        tracing::info!(service = %name, dictionary = %var, key = %shown_key(key), created, "dictionary entry written");
        let mut answer = entry_answer(var, key);
        answer["created"] = json!(created);
        answer["len"] = json!(size.len);
        answer["capacity"] = json!(size.capacity);
        entry_json(&mut answer, &value.to_owned());
        Ok(answer)
    }

    fn delete_entry(&self, name: &str, path: &str) -> Result<Json, Refusal> {
        let Some((var, key)) = path.split_once('/') else {
            return Err(Refusal::new(
                405,
                format!("`{path}` is a variable, which cannot be deleted; DELETE takes a dictionary entry, VAR/KEY"),
            ));
        };
        self.delete_key(name, var, key.as_bytes())
    }

    /// Removes the entry under `key` of the dictionary `var`.
    fn delete_key(&self, name: &str, var: &str, key: &[u8]) -> Result<Json, Refusal> {
        let (service, _) = self.dict_var(name, var)?;
        let d = service
            .global_dict(var)
            .map_err(|e| Refusal::new(404, e.to_string()))?;
        let removed = d
            .remove(key)
            .map_err(|e| Refusal::new(400, format!("`{var}`: {e}")))?;
        if !removed {
            return Err(Refusal::new(
                404,
                format!("`{var}` holds nothing under {}", shown_key(key)),
            ));
        }
        let size = d.size().map_err(|e| Refusal::new(400, e.to_string()))?;
        tracing::info!(service = %name, dictionary = %var, key = %shown_key(key), "dictionary entry deleted");
        let mut answer = entry_answer(var, key);
        answer["deleted"] = json!(true);
        answer["len"] = json!(size.len);
        answer["capacity"] = json!(size.capacity);
        Ok(answer)
    }
}

/// A dictionary entry's new value from a write's body (`{"value": V}`,
/// V, or a string as `{"base64": B}`), of the `kind` the dictionary holds
/// and, for a string, at most `max` bytes.
fn entry_value_of(
    var: &str,
    j: &Json,
    kind: Scalar,
    max: Option<u64>,
) -> Result<EntryValue, Refusal> {
    let wanted = match kind {
        Scalar::Int => "an integer",
        Scalar::Bool => "a boolean",
        Scalar::Bytes => "a string",
    };
    let refuse = || {
        Refusal::new(
            400,
            format!("an entry of `{var}` is {wanted}: give it as {{\"value\": VALUE}}"),
        )
    };
    let given = match (j.get("value"), j.get("base64")) {
        (Some(v), None) => v,
        (None, Some(_)) => j,
        _ if !j.is_object() => j,
        _ => return Err(refuse()),
    };
    let value = match (kind, given) {
        (Scalar::Int, Json::Number(n)) => EntryValue::Int(
            n.as_i64()
                .ok_or_else(|| Refusal::new(400, format!("{n} is not a 64-bit integer")))?,
        ),
        (Scalar::Bool, Json::Bool(b)) => EntryValue::Bool(*b),
        (Scalar::Bytes, Json::String(s)) => EntryValue::Bytes(s.as_bytes().to_vec()),
        (Scalar::Bytes, Json::Object(o)) => match o.get("base64") {
            Some(Json::String(b)) => {
                let decoded = api::base64_decode(b)
                    .ok_or_else(|| Refusal::new(400, "`base64` is not base64"))?;
                EntryValue::Bytes(decoded)
            }
            _ => return Err(refuse()),
        },
        _ => return Err(refuse()),
    };
    if let (EntryValue::Bytes(b), Some(max)) = (&value, max) {
        if b.len() as u64 > max {
            return Err(Refusal::new(
                400,
                format!(
                    "an entry of `{var}` is a string of at most {max} bytes, and this one has {}",
                    b.len()
                ),
            ));
        }
    }
    Ok(value)
}

/// A scalar global's new value from a write's body (`{"value": V}` or
/// V), checked against the type `state` declares for `path`: the JSON
/// given and the value it makes.
fn scalar_of(state: &[StateVar], path: &str, body: &[u8]) -> Result<(Json, StateValue), Refusal> {
    let j: Json = serde_json::from_slice(body)
        .map_err(|e| Refusal::new(400, format!("the body is not JSON: {e}")))?;
    let j = j.get("value").cloned().unwrap_or(j);
    // The declared type decides, not the value held: a global no
    // instance has set yet holds nothing, and takes only its own kind.
    if let Some(var) = state.iter().find(|v| v.name == path && v.global) {
        let kind = |k: Option<Scalar>| match k {
            Some(Scalar::Int) => "an integer".to_string(),
            Some(Scalar::Bool) => "a boolean".to_string(),
            Some(Scalar::Bytes) => "a string".to_string(),
            None => format!("a {}", var.ty),
        };
        let given = match &j {
            Json::Number(_) => Some(Scalar::Int),
            Json::Bool(_) => Some(Scalar::Bool),
            Json::String(_) => Some(Scalar::Bytes),
            _ => None,
        };
        if given.is_some() && var.scalar != given {
            return Err(Refusal::new(
                400,
                format!(
                    "`{path}` holds {}; it cannot be given {}",
                    kind(var.scalar),
                    kind(given)
                ),
            ));
        }
    }
    let value = match &j {
        Json::Number(n) => StateValue::Int(
            n.as_i64()
                .ok_or_else(|| Refusal::new(400, format!("{n} is not a 64-bit integer")))?,
        ),
        Json::Bool(b) => StateValue::Bool(*b),
        Json::String(s) => StateValue::Bytes(s.clone().into_bytes()),
        _ => return Err(Refusal::new(400, "give an integer, a boolean or a string")),
    };
    Ok((j, value))
}

/// A page of a dictionary's entries, oldest first: `limit` of them (at
/// most [`LIST_LIMIT_MAX`]) from the `cursor`th; `next` is the cursor of
/// the page after, or null at the end. Entries written or deleted between
/// pages shift the positions.
fn list_entries(service: &Service, var: &StateVar, req: &Request) -> Result<Json, Refusal> {
    let number = |name: &str, default: usize, max: usize| -> Result<usize, Refusal> {
        match req.query_param(name)? {
            None => Ok(default),
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| {
                    Refusal::new(400, format!("`{name}` is a number up to {max}, not `{v}`"))
                }),
        }
    };
    let limit = number("limit", LIST_LIMIT, LIST_LIMIT_MAX)?;
    let cursor = number("cursor", 0, usize::MAX)?;
    let d = service
        .global_dict(&var.name)
        .map_err(|e| Refusal::new(404, e.to_string()))?;
    let mut entries = Vec::new();
    let size = d
        .entries(cursor, limit, |k, v| {
            let mut e = json!({ "key": String::from_utf8_lossy(k) });
            entry_json(&mut e, &v.to_owned());
            if std::str::from_utf8(k).is_err() {
                e["key_base64"] = json!(api::base64_encode(k));
            }
            entries.push(e);
        })
        .map_err(|e| Refusal::new(400, format!("`{}`: {e}", var.name)))?;
    let end = cursor.saturating_add(entries.len());
    Ok(json!({
        "path": var.name,
        "value": { "dictionary": true },
        "type": var.ty,
        "len": size.len,
        "capacity": size.capacity,
        "cursor": cursor,
        "next": if end < size.len { json!(end) } else { Json::Null },
        "entries": entries,
    }))
}

/// A dictionary key in a message: as text in backquotes where it is
/// UTF-8, else as the `key_base64` that names it.
fn shown_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(k) => format!("`{k}`"),
        Err(_) => format!("key_base64 `{}`", api::base64_encode(key)),
    }
}

/// The start of an answer about one entry: its `path`, and its key in
/// base64 where the key is not UTF-8 (and so cannot be named in a path).
fn entry_answer(var: &str, key: &[u8]) -> Json {
    let mut answer = json!({ "path": format!("{var}/{}", String::from_utf8_lossy(key)) });
    if std::str::from_utf8(key).is_err() {
        answer["key_base64"] = json!(api::base64_encode(key));
    }
    answer
}

/// A key given as `key_base64`: standard or URL-safe base64, padded or
/// not; a `+` left unescaped in a query arrives as a space, so a space is
/// taken as `+`.
fn key_from_base64(text: &str) -> Result<Vec<u8>, Refusal> {
    let standard: String = text
        .chars()
        .map(|c| match c {
            '-' | ' ' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    api::base64_decode(&standard)
        .ok_or_else(|| Refusal::new(400, format!("`key_base64` is not base64: `{text}`")))
}

/// An entry's value as the API shows it: a message's bytes as text
/// (`value`) and in base64 (`base64`); an integer or boolean as itself; a
/// string as text, and in base64 too where it is not UTF-8.
fn entry_json(answer: &mut Json, v: &EntryValue) {
    match v {
        EntryValue::Message(b) => {
            answer["value"] = json!(String::from_utf8_lossy(b));
            answer["base64"] = json!(api::base64_encode(b));
        }
        EntryValue::Int(n) => answer["value"] = json!(n),
        EntryValue::Bool(b) => answer["value"] = json!(b),
        EntryValue::Bytes(b) => {
            answer["value"] = json!(String::from_utf8_lossy(b));
            if std::str::from_utf8(b).is_err() {
                answer["base64"] = json!(api::base64_encode(b));
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(h: &str) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) {
        return None;
    }
    (0..h.len())
        .step_by(2)
        .map(|i| h.get(i..i + 2).and_then(|x| u8::from_str_radix(x, 16).ok()))
        .collect()
}

fn to_json(v: &StateValue) -> Json {
    match v {
        StateValue::Unset => Json::Null,
        StateValue::Int(n) => json!(n),
        StateValue::Bool(b) => json!(b),
        StateValue::Bytes(b) => json!(String::from_utf8_lossy(b)),
        StateValue::Dict => json!({ "dictionary": true }),
        StateValue::Other(k) => json!({ "unshown": k }),
    }
}

/// Whether `req` carries the token, where one is wanted.
fn authorized(req: &Request, token: Option<&str>) -> bool {
    token.is_none_or(|t| {
        req.header("authorization")
            .and_then(|a| a.strip_prefix("Bearer "))
            == Some(t)
    })
}

/// Routes a request to its handler.
fn route(
    reg: &Registry,
    req: &Request,
    token: Option<&str>,
    started: Instant,
) -> Result<(u16, Json), Refusal> {
    if !authorized(req, token) {
        return Err(Refusal::new(
            401,
            "this API wants `Authorization: Bearer TOKEN`",
        ));
    }
    let segments: Vec<&str> = req.path.trim_end_matches('/').split('/').skip(1).collect();
    let method = req.method.as_str();
    let not_allowed =
        |allowed: &str| Refusal::new(405, format!("{method} is not allowed here; use {allowed}"));
    let body = |req: &Request| -> Result<DeploySpec, Refusal> {
        serde_json::from_slice(&req.body)
            .map_err(|e| Refusal::new(400, format!("the body is not a deploy request: {e}")))
    };
    match segments.as_slice() {
        ["services"] => match method {
            "GET" => Ok((200, reg.list())),
            "POST" => Ok((201, reg.deploy(body(req)?, false, started)?)),
            _ => Err(not_allowed("GET or POST")),
        },
        ["services", name] => match method {
            "GET" => Ok((200, reg.status(name)?)),
            "DELETE" => Ok((200, reg.undeploy(name)?)),
            "PUT" => {
                let mut spec = body(req)?;
                if !spec.name.is_empty() && spec.name != *name {
                    return Err(Refusal::new(
                        400,
                        format!("the body names `{}`, the path `{name}`", spec.name),
                    ));
                }
                spec.name = name.to_string();
                Ok((200, reg.deploy(spec, true, started)?))
            }
            _ => Err(not_allowed("GET, PUT or DELETE")),
        },
        ["services", name, "weight"] => match method {
            "GET" => {
                let status = reg.status(name)?;
                Ok((200, json!({ "name": name, "weight": status["weight"] })))
            }
            "PUT" => Ok((200, reg.set_weight(name, &req.body)?)),
            _ => Err(not_allowed("GET or PUT")),
        },
        ["services", name, "state", rest @ ..]
            if !rest.is_empty()
                && reg
                    .packet_services
                    .lock()
                    .expect("packet services lock")
                    .contains_key(*name) =>
        {
            let path = rest.join("/");
            let key = match req.query_param("key_base64")? {
                Some(b64) => Some(key_from_base64(&b64)?),
                None => None,
            };
            let mut packet = reg.packet_services.lock().expect("packet services lock");
            let running = packet
                .get_mut(*name)
                .ok_or_else(|| Refusal::new(404, format!("no service `{name}`")))?;
            if path == "table" && key.is_none() {
                // A table is checked and handed over without waiting for
                // the workers, so it is done under the lock.
                return match method {
                    "GET" => Ok((200, running.read_table()?)),
                    "PUT" => {
                        let answer = running.write_table(&req.body)?;
                        let spec = running.spec.clone();
                        drop(packet);
                        tracing::info!(service = %name, path = %path, "table replaced");
                        if let Err(e) = reg.record(&spec) {
                            tracing::warn!(service = %name, "cannot record the service in the state directory: {e}");
                        }
                        Ok((200, answer))
                    }
                    _ => Err(not_allowed("GET or PUT")),
                };
            }
            // Anything else may wait for the service's threads: not under
            // the lock every packet service's requests take.
            let handle = running.handle();
            drop(packet);
            match method {
                "GET" => Ok((200, handle.read(&path, key.as_deref())?)),
                "PUT" => Ok((200, handle.write(&path, key.as_deref(), &req.body)?)),
                "DELETE" => Ok((200, handle.delete(&path, key.as_deref())?)),
                _ => Err(not_allowed("GET, PUT or DELETE")),
            }
        }
        ["services", name, "state", rest @ ..] if !rest.is_empty() => {
            let path = rest.join("/");
            // A key that is not UTF-8 cannot be a path segment: it comes
            // as `state/VAR?key_base64=KEY`.
            if let Some(b64) = req.query_param("key_base64")? {
                let key = key_from_base64(&b64)?;
                if path.contains('/') {
                    return Err(Refusal::new(
                        400,
                        format!("`key_base64` names an entry of a dictionary: give the path as state/VAR, not `{path}`"),
                    ));
                }
                return match method {
                    "GET" => Ok((200, reg.read_entry(name, &path, &key)?)),
                    "PUT" => Ok((200, reg.write_entry(name, &path, &key, &req.body)?)),
                    "DELETE" => Ok((200, reg.delete_key(name, &path, &key)?)),
                    _ => Err(not_allowed("GET, PUT or DELETE")),
                };
            }
            match method {
                "GET" => Ok((200, reg.read_state(name, &path, req)?)),
                "PUT" => Ok((200, reg.write_state(name, &path, &req.body)?)),
                "DELETE" => Ok((200, reg.delete_entry(name, &path)?)),
                _ => Err(not_allowed("GET, PUT or DELETE")),
            }
        }
        // `GET /metrics` is answered before routing: Prometheus text.
        ["metrics"] => Err(not_allowed("GET")),
        _ => Err(Refusal::new(404, format!("no such resource: {}", req.path))),
    }
}

/// One API connection: a request read, routed and answered.
fn handle<S: std::io::Read + std::io::Write>(
    reg: &Registry,
    token: Option<&str>,
    mut stream: S,
    set_timeout: &dyn Fn(&mut S, Duration) -> std::io::Result<()>,
) {
    let answer = match api::read_request(&mut stream, set_timeout) {
        Err(e) => Err(Refusal::from(e)),
        Ok(req) if req.path == "/metrics" && req.method == "GET" && authorized(&req, token) => {
            // Prometheus text, not JSON: answered here.
            let format = crate::metrics::Format::for_accept(req.header("accept"));
            let body = reg.metrics(format);
            let _ = set_timeout(&mut stream, api::READ_TIMEOUT);
            let _ = api::write_text(&mut stream, format.content_type(), &body);
            return;
        }
        Ok(req) => {
            let started = Instant::now();
            // A handler that panics must not take the platform with it.
            let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                route(reg, &req, token, started)
            }))
            .unwrap_or_else(|_| Err(Refusal::new(500, "the request failed inside the server")));
            if let Err(r) = &answer {
                // A change asked for and refused is worth a line too.
                if req.method != "GET" {
                    tracing::warn!(method = %req.method, path = %req.path, status = r.status, "refused: {}", r.message);
                }
            }
            answer
        }
    };
    let (status, body) = match answer {
        Ok(a) => a,
        Err(r) => (r.status, r.json()),
    };
    let _ = set_timeout(&mut stream, api::READ_TIMEOUT);
    let _ = api::write_response(&mut stream, status, &body);
}

fn busy() -> Json {
    json!({ "error": "too many API requests at once; try again" })
}

/// Runs `work` on a thread of its own unless [`MAX_CLIENTS`] run already.
fn spawn_handler(active: &Arc<AtomicUsize>, work: Box<dyn FnOnce() + Send>) -> bool {
    if active.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
        active.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    let done = active.clone();
    let spawned = std::thread::Builder::new()
        .name("flick-api".into())
        .spawn(move || {
            work();
            done.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        active.fetch_sub(1, Ordering::AcqRel);
    }
    spawned.is_ok()
}

enum Listener {
    Unix(std::os::unix::net::UnixListener),
    Tcp(std::net::TcpListener),
}

fn bind_api(opts: &ServeOptions) -> Result<Listener, ServeError> {
    match &opts.api {
        ApiAddr::Tcp(a) => {
            if !a.ip().is_loopback() && opts.api_token.is_none() {
                return Err(ServeError::NotLoopback(*a));
            }
            std::net::TcpListener::bind(a)
                .map(Listener::Tcp)
                .map_err(|e| ServeError::Listen(a.to_string(), e))
        }
        ApiAddr::Unix(p) => {
            let shown = p.display().to_string();
            if p.exists() {
                // A socket left by a `serve` that is gone is replaced; one
                // that answers is another `serve`'s.
                if std::os::unix::net::UnixStream::connect(p).is_ok() {
                    return Err(ServeError::InUse(shown));
                }
                let _ = std::fs::remove_file(p);
            }
            let l = std::os::unix::net::UnixListener::bind(p)
                .map_err(|e| ServeError::Listen(shown.clone(), e))?;
            // Only its owner may talk to it.
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600));
            Ok(Listener::Unix(l))
        }
    }
}

/// Runs `flick serve` until `stop` is set: the platform started, recorded
/// services deployed again, the API served. `ready` is called with the
/// API's address once it listens.
pub fn serve(
    opts: ServeOptions,
    stop: Arc<AtomicBool>,
    ready: &dyn Fn(&str, usize, usize),
) -> Result<(), ServeError> {
    std::fs::create_dir_all(&opts.state_dir)
        .map_err(|e| ServeError::StateDir(opts.state_dir.clone(), e))?;
    let listener = bind_api(&opts)?;
    let platform = Platform::start(PlatformConfig {
        workers: opts.workers,
        tasks: opts.tasks,
        pin: opts.pin_workers,
        ..PlatformConfig::default()
    })?;
    let reg = Arc::new(Registry {
        platform,
        services: Mutex::new(BTreeMap::new()),
        packet_services: Mutex::new(BTreeMap::new()),
        budget: opts.memory_budget,
        dir: opts.state_dir.clone(),
        saving: Mutex::new(()),
    });
    let (restored, failed) = reg.restore();
    if let Some(every) = opts.save_every {
        // Saves what changed every interval, so that a `serve` that is
        // killed comes back with state at most one interval old.
        let (reg, stop) = (reg.clone(), stop.clone());
        let saver = move || {
            let mut saved = BTreeMap::new();
            let mut last = Instant::now();
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(50).min(every));
                if last.elapsed() >= every {
                    reg.save_changed(&mut saved);
                    last = Instant::now();
                }
            }
        };
        std::thread::Builder::new()
            .name("flick-state-save".into())
            .spawn(saver)
            .map_err(|e| ServeError::StateDir(opts.state_dir.clone(), e))?;
    }
    ready(&opts.api.to_string(), restored, failed);
    let token: Option<Arc<str>> = opts.api_token.as_deref().map(Arc::from);
    let active = Arc::new(AtomicUsize::new(0));
    let accept_loop = {
        let (reg, stop) = (reg.clone(), stop.clone());
        move || match listener {
            Listener::Unix(l) => {
                for s in l.incoming() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(s) = s else { continue };
                    let (reg, token, copy) = (reg.clone(), token.clone(), s.try_clone());
                    let work = move || {
                        handle(&reg, token.as_deref(), s, &|s, t| {
                            s.set_read_timeout(Some(t))
                        })
                    };
                    if !spawn_handler(&active, Box::new(work)) {
                        if let Ok(mut c) = copy {
                            let _ = api::write_response(&mut c, 503, &busy());
                        }
                    }
                }
            }
            Listener::Tcp(l) => {
                for s in l.incoming() {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(s) = s else { continue };
                    let (reg, token, copy) = (reg.clone(), token.clone(), s.try_clone());
                    let work = move || {
                        handle(&reg, token.as_deref(), s, &|s, t| {
                            s.set_read_timeout(Some(t))
                        })
                    };
                    if !spawn_handler(&active, Box::new(work)) {
                        if let Ok(mut c) = copy {
                            let _ = api::write_response(&mut c, 503, &busy());
                        }
                    }
                }
            }
        }
    };
    std::thread::Builder::new()
        .name("flick-api-accept".into())
        .spawn(accept_loop)
        .map_err(|e| ServeError::Listen(opts.api.to_string(), e))?;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Services stay recorded: the next `serve` deploys them again.
    let all: Vec<(String, Deployed)> =
        std::mem::take(&mut *reg.services.lock().expect("services lock"))
            .into_iter()
            .collect();
    for (name, d) in all {
        let stopped = d.service.stop(DRAIN_DEADLINE);
        tracing::info!(service = %name, drained = stopped.drained, "stopped");
        // Its state as it ended, for the next `serve`.
        let _saving = reg.saving.lock().expect("saving lock");
        if let Err(e) = reg.save_state(&name, &d.service, &d.state) {
            tracing::warn!(service = %name, "cannot save its state: {e}");
        }
    }
    let packet = std::mem::take(&mut *reg.packet_services.lock().expect("packet services lock"));
    for (name, p) in packet {
        let (stopped, kept) = p.stop_keeping();
        tracing::info!(service = %name, summary = %stopped["summary"], "stopped");
        if let Some(state) = kept {
            if let Err(e) = reg.save_packet_state(&name, &state) {
                tracing::warn!(service = %name, "cannot save its state: {e}");
            }
        }
    }
    if let ApiAddr::Unix(p) = &opts.api {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// `flick serve`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Where the API listens: a Unix socket path (default: flick.sock in
    /// the state directory) or HOST:PORT, loopback unless --api-token is given.
    #[arg(long, value_name = "ADDR")]
    pub api: Option<String>,
    /// A token every API request must carry (`Authorization: Bearer TOKEN`).
    #[arg(long, value_name = "TOKEN")]
    pub api_token: Option<String>,
    /// Where deployed services are recorded, and deployed again from on start.
    #[arg(long, value_name = "DIR", default_value = "./flick-state")]
    pub state_dir: PathBuf,
    /// Worker threads shared by every service (default: one per core).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Keep worker i on the i-th core the process may run on, as nginx's
    /// `worker_cpu_affinity auto` [default: off, the kernel places them].
    #[arg(long)]
    pub pin_workers: bool,
    /// Bytes all services may reserve together (each its static memory
    /// bound times its max instances); past it a deploy is refused.
    #[arg(long, value_name = "BYTES")]
    pub memory_budget: Option<u64>,
    /// Tasks alive at once over every service (the task table's size).
    #[arg(long, default_value_t = 1 << 18)]
    pub tasks: usize,
    /// Seconds between saves of each service's changed `global` state
    /// (values and dictionaries) to the state directory while it runs;
    /// 0: only at a clean stop.
    #[arg(long, value_name = "SECS", default_value_t = 5)]
    pub save_every: u64,
    /// Log level (error, warn, info, debug, trace, or a RUST_LOG directive).
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Log line format.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: crate::logging::LogFormat,
}

/// `flick serve`: runs until SIGTERM or SIGINT.
pub fn main(args: ServeArgs) -> std::process::ExitCode {
    use std::process::ExitCode;
    if let Err(e) = crate::logging::init(args.log_level.as_deref(), args.log_format) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    crate::open_files::raise_to_hard_limit();
    let opts = ServeOptions {
        api: args
            .api
            .as_deref()
            .map_or_else(|| default_api(&args.state_dir), ApiAddr::parse),
        api_token: args.api_token,
        state_dir: args.state_dir,
        workers: args
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        pin_workers: args.pin_workers,
        memory_budget: args.memory_budget,
        tasks: args.tasks,
        save_every: (args.save_every > 0).then(|| Duration::from_secs(args.save_every)),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let ready = |api: &str, restored: usize, failed: usize| {
        use std::io::Write;
        println!("flick: serving the API on {api}");
        println!(
            "flick: {restored} services deployed again from the state directory, {failed} failed"
        );
        let _ = std::io::stdout().flush();
    };
    match serve(opts, stop, &ready) {
        Ok(()) => {
            println!("flick: stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
