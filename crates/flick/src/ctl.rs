//! `flick ctl`: the client of `flick serve`'s API. Each command is one
//! request; its answer is printed as plain lines (or the API's JSON with
//! `--json`), and a refusal is the API's message on standard error with a
//! non-zero exit.

use crate::api::{self, ApiAddr};
use crate::serve::DeploySpec;
use serde_json::{json, Value as Json};
use std::time::Duration;

/// How long a command waits for its answer: an undeploy drains for up to
/// `serve::DRAIN_DEADLINE`.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// What `flick ctl` was asked to do.
#[derive(Clone, Debug)]
pub enum CtlCommand {
    Deploy {
        name: String,
        file: String,
        listen: Vec<String>,
        connect: Vec<String>,
        config: Option<String>,
        max_instances: Option<usize>,
        weight: Option<u32>,
        /// Packet ports, `CHANNEL=SPEC[,SPEC...]`.
        ports: Vec<String>,
        redeploy: bool,
    },
    Undeploy(String),
    /// A running service given another weight.
    Weight(String, u32),
    List,
    Status(String),
    /// A global, a dictionary entry (`VAR/KEY`), or a page of a
    /// dictionary's entries (`limit` from the `cursor`th).
    Read {
        name: String,
        path: String,
        limit: Option<usize>,
        cursor: Option<usize>,
        /// The entry of dictionary `path` under this key, in base64 (a key
        /// that is not UTF-8, such as a `pack` of integers).
        key_base64: Option<String>,
    },
    /// A global's value, or a dictionary entry's message: as text, or
    /// `base64` (its wire bytes in base64).
    Write {
        name: String,
        path: String,
        value: String,
        base64: bool,
        key_base64: Option<String>,
    },
    /// A dictionary entry removed (`VAR/KEY`, or `VAR` and `key_base64`).
    Delete {
        name: String,
        path: String,
        key_base64: Option<String>,
    },
}

/// A command that failed, as `flick ctl` reports it.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("cannot read {0}: {1}")]
    Read(String, std::io::Error),
    #[error(transparent)]
    Client(#[from] api::ClientError),
    /// The API's refusal: its status, message and rendered diagnostics.
    #[error("{message}{}", diagnostics.as_deref().map(|d| format!("\n{d}")).unwrap_or_default())]
    Refused {
        status: u16,
        message: String,
        diagnostics: Option<String>,
    },
}

/// Runs one command; what to print on success.
pub fn run(
    addr: &ApiAddr,
    token: Option<&str>,
    json_out: bool,
    cmd: CtlCommand,
) -> Result<String, CtlError> {
    let call = |method: &str, path: &str, body: Option<&Json>| -> Result<Json, CtlError> {
        let (status, answer) = api::call(addr, token, method, path, body, TIMEOUT)?;
        if status >= 300 {
            let message = answer["error"]
                .as_str()
                .map_or_else(|| answer.to_string(), str::to_string);
            let diags = answer["diagnostics"].as_str().map(str::to_string);
            return Err(CtlError::Refused {
                status,
                message,
                diagnostics: diags,
            });
        }
        Ok(answer)
    };
    let enc = api::percent_encode;
    let (answer, plain) = match cmd {
        CtlCommand::Deploy {
            name,
            file,
            listen,
            connect,
            config,
            max_instances,
            weight,
            ports,
            redeploy,
        } => {
            let program =
                std::fs::read_to_string(&file).map_err(|e| CtlError::Read(file.clone(), e))?;
            let config = match config {
                None => None,
                Some(c) => Some(std::fs::read_to_string(&c).map_err(|e| CtlError::Read(c, e))?),
            };
            let spec = DeploySpec {
                name: name.clone(),
                file,
                program,
                listen,
                connect,
                config,
                max_instances,
                weight,
                ports,
            };
            let body = serde_json::to_value(&spec).expect("a deploy request is JSON");
            let a = match redeploy {
                false => call("POST", "/services", Some(&body))?,
                true => call("PUT", &format!("/services/{}", enc(&name)), Some(&body))?,
            };
            let carried = match a["carried"].as_array() {
                Some(c) if !c.is_empty() => format!(
                    " (carried: {})",
                    c.iter()
                        .filter_map(Json::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => String::new(),
            };
            let plain = format!(
                "{} {} version {} on {} with weight {} in {} us{carried}",
                if redeploy { "redeployed" } else { "deployed" },
                a["name"].as_str().unwrap_or(&name),
                a["version"],
                a["listen"].as_str().unwrap_or("?"),
                a["weight"],
                a["deploy_us"],
            );
            (a, plain)
        }
        CtlCommand::Undeploy(name) => {
            let a = call("DELETE", &format!("/services/{}", enc(&name)), None)?;
            let plain = match a["drained"].as_bool() {
                Some(true) => format!("undeployed {name}"),
                _ => format!(
                    "undeployed {name} ({} client connections had not finished)",
                    a["clients_left"]
                ),
            };
            (a, plain)
        }
        CtlCommand::Weight(name, weight) => {
            let a = call(
                "PUT",
                &format!("/services/{}/weight", enc(&name)),
                Some(&json!({ "weight": weight })),
            )?;
            let plain = format!("{name} weight {} (was {})", a["weight"], a["previous"]);
            (a, plain)
        }
        CtlCommand::List => {
            let a = call("GET", "/services", None)?;
            let mut plain = format!(
                "{:<24} {:<22} {:>7} {:>6} {:>8} {:>9}",
                "NAME", "LISTEN", "VERSION", "WEIGHT", "CLIENTS", "INSTANCES"
            );
            for s in a["services"].as_array().into_iter().flatten() {
                // A service on packet ports lists its ports where others
                // list their address.
                let ports: Vec<&str> = s["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Json::as_str)
                    .collect();
                let listen = match s["listen"].as_str() {
                    Some(l) if !l.is_empty() => l.to_string(),
                    _ => ports.join(" "),
                };
                plain.push_str(&format!(
                    "\n{:<24} {:<22} {:>7} {:>6} {:>8} {:>9}",
                    s["name"].as_str().unwrap_or(""),
                    listen,
                    s["version"].to_string(),
                    s["weight"].to_string(),
                    s["clients"].to_string(),
                    s["instances"].to_string()
                ));
            }
            (a, plain)
        }
        CtlCommand::Status(name) => {
            let a = call("GET", &format!("/services/{}", enc(&name)), None)?;
            let plain = status_lines(&a);
            (a, plain)
        }
        CtlCommand::Read {
            name,
            path,
            limit,
            cursor,
            key_base64,
        } => {
            let mut query: Vec<String> = Vec::new();
            if let Some(k) = &key_base64 {
                query.push(format!("key_base64={}", enc(k)));
            }
            if let Some(l) = limit {
                query.push(format!("limit={l}"));
            }
            if let Some(c) = cursor {
                query.push(format!("cursor={c}"));
            }
            let query = match query.is_empty() {
                true => String::new(),
                false => format!("?{}", query.join("&")),
            };
            let a = call(
                "GET",
                &format!(
                    "/services/{}/state/{}{query}",
                    enc(&name),
                    encode_path(&path)
                ),
                None,
            )?;
            let plain = match a["entries"].as_array() {
                // A dictionary: an entry a line, `KEY VALUE`, then where
                // the next page starts if there is one.
                Some(entries) => {
                    let mut lines: Vec<String> = entries
                        .iter()
                        .map(|e| format!("{} {}", e["key"].as_str().unwrap_or(""), e["value"]))
                        .collect();
                    lines.push(format!(
                        "({} of {} entries, capacity {}{})",
                        entries.len(),
                        a["len"],
                        a["capacity"],
                        match a["next"].as_u64() {
                            Some(n) => format!("; next page: --cursor {n}"),
                            None => String::new(),
                        }
                    ));
                    lines.join("\n")
                }
                None => a["value"].to_string(),
            };
            (a, plain)
        }
        CtlCommand::Write {
            name,
            path,
            value,
            base64,
            key_base64,
        } => {
            let body = match base64 {
                true => json!({ "base64": value }),
                // A machine's tables, replaced from a program file.
                false if path == "table" => {
                    let program = std::fs::read_to_string(&value)
                        .map_err(|e| CtlError::Read(value.clone(), e))?;
                    json!({ "file": value, "program": program })
                }
                // A dictionary entry: an integer or boolean as JSON (a
                // dictionary of values), anything else as it is (a message's
                // wire bytes, a string; quoted JSON for a string of digits).
                false if path.contains('/') || key_base64.is_some() => {
                    let v = match serde_json::from_str::<Json>(&value) {
                        Ok(v @ (Json::Number(_) | Json::Bool(_) | Json::String(_))) => v,
                        _ => Json::String(value),
                    };
                    json!({ "value": v })
                }
                // A value that is not JSON is taken as a string.
                false => {
                    let v: Json = serde_json::from_str(&value).unwrap_or(Json::String(value));
                    json!({ "value": v })
                }
            };
            let a = call(
                "PUT",
                &format!(
                    "/services/{}/state/{}{}",
                    enc(&name),
                    encode_path(&path),
                    key_query(key_base64.as_deref())
                ),
                Some(&body),
            )?;
            let plain = format!("{name} {} = {}", shown_path(&a, &path), a["value"]);
            (a, plain)
        }
        CtlCommand::Delete {
            name,
            path,
            key_base64,
        } => {
            let a = call(
                "DELETE",
                &format!(
                    "/services/{}/state/{}{}",
                    enc(&name),
                    encode_path(&path),
                    key_query(key_base64.as_deref())
                ),
                None,
            )?;
            let plain = match a["len"].as_u64() {
                Some(left) => format!(
                    "{name} {} deleted ({left} entries left)",
                    shown_path(&a, &path)
                ),
                // A packet service's: its shards are not counted.
                None => format!("{name} {} deleted", shown_path(&a, &path)),
            };
            (a, plain)
        }
    };
    Ok(match json_out {
        true => serde_json::to_string_pretty(&answer).expect("JSON prints"),
        false => plain,
    })
}

/// `?key_base64=KEY` escaped, or nothing.
fn key_query(key_base64: Option<&str>) -> String {
    key_base64.map_or_else(String::new, |k| {
        format!("?key_base64={}", api::percent_encode(k))
    })
}

/// An entry's path as printed: `VAR/KEY`, or `VAR[key_base64=KEY]` for a
/// key that is not UTF-8.
fn shown_path(answer: &Json, path: &str) -> String {
    match answer["key_base64"].as_str() {
        Some(k) => format!("{path}[key_base64={k}]"),
        None => path.to_string(),
    }
}

/// A state path's segments escaped one by one, keeping its `/`.
fn encode_path(path: &str) -> String {
    path.split('/')
        .map(api::percent_encode)
        .collect::<Vec<_>>()
        .join("/")
}

fn status_lines(a: &Json) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<16} {v}\n"));
    let text = |v: &Json| match v {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    };
    if a["kind"].is_string() {
        // A service on packet ports: its ports, flow tables and counters.
        for k in ["name", "file", "kind", "version", "running"] {
            line(k, text(&a[k]));
        }
        line("reserved", format!("{} bytes", a["reserved_bytes"]));
        line("deployed in", format!("{} us", a["deploy_us"]));
        for p in a["ports"].as_array().into_iter().flatten() {
            line(
                "port",
                format!(
                    "{} rx {} tx {} drops {}",
                    text(&p["port"]),
                    p["rx_frames"],
                    p["tx_frames"],
                    p["drops"]
                ),
            );
        }
        for t in a["flow_tables"].as_array().into_iter().flatten() {
            line(
                "flow table",
                format!(
                    "{} {} of {}",
                    text(&t["stage"]),
                    t["contexts"],
                    t["capacity"]
                ),
            );
        }
        for (k, v) in a["counters"].as_object().into_iter().flatten() {
            line(k, text(v));
        }
        return out.trim_end().to_string();
    }
    for k in [
        "name",
        "file",
        "version",
        "weight",
        "listen",
        "clients",
        "parked",
        "instances",
    ] {
        line(k, text(&a[k]));
    }
    line("reserved", format!("{} bytes", a["reserved_bytes"]));
    line("deployed in", format!("{} us", a["deploy_us"]));
    let b = &a["bindings"];
    for l in b["listen"].as_array().into_iter().flatten() {
        line("listen binding", text(l));
    }
    for c in b["connect"].as_array().into_iter().flatten() {
        line("connect", text(c));
    }
    line("max instances", text(&b["max_instances"]));
    for s in a["state"].as_array().into_iter().flatten() {
        let scope = if s["global"] == json!(true) {
            "global"
        } else {
            "local"
        };
        line(
            "state",
            format!("{scope} {} : {}", text(&s["name"]), text(&s["type"])),
        );
    }
    let c = &a["counters"];
    for k in [
        "connections_accepted",
        "connections_open",
        "malformed",
        "compute_faults",
        "fault_replies",
        "late_replies",
    ] {
        line(k, text(&c[k]));
    }
    for ch in c["channels"].as_array().into_iter().flatten() {
        line(
            "channel",
            format!(
                "{} in {} out {}",
                text(&ch["channel"]),
                ch["messages_in"],
                ch["messages_out"]
            ),
        );
    }
    for b in c["backends"].as_array().into_iter().flatten() {
        line(
            "backend",
            format!(
                "{} {} {}",
                text(&b["channel"]),
                text(&b["address"]),
                if b["up"] == json!(true) { "up" } else { "down" }
            ),
        );
    }
    out.trim_end().to_string()
}

/// `flick ctl`'s arguments.
#[derive(clap::Args, Debug)]
pub struct CtlArgs {
    /// The API's address: a Unix socket path or HOST:PORT (default:
    /// ./flick-state/flick.sock, as `flick serve` makes it).
    #[arg(long, value_name = "ADDR", global = true)]
    pub api: Option<String>,
    /// The token `flick serve --api-token` was given.
    #[arg(long, value_name = "TOKEN", global = true, env = "FLICK_API_TOKEN")]
    pub api_token: Option<String>,
    /// Print the API's JSON answer instead of lines.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: CtlSub,
}

/// Bindings of a deploy, as `flick run` takes them.
#[derive(clap::Args, Debug)]
pub struct DeployArgs {
    /// The service's name.
    pub name: String,
    /// The program.
    pub file: String,
    /// CHANNEL=ADDR: the channel whose connections are instances.
    #[arg(long, value_name = "CHANNEL=ADDR")]
    pub listen: Vec<String>,
    /// CHANNEL=ADDR[,ADDR...]: backends of a channel (or channel array).
    #[arg(long, value_name = "CHANNEL=ADDRS")]
    pub connect: Vec<String>,
    /// A `flick run` configuration file (bindings and limits).
    #[arg(long, value_name = "FILE")]
    pub config: Option<String>,
    /// Client connections open at once (default 1024).
    #[arg(long)]
    pub max_instances: Option<usize>,
    /// Its share of the workers against other services with work (1 to
    /// 1000; default: the configuration's `weight`, else 1, else on a
    /// redeploy the weight it runs with).
    #[arg(long)]
    pub weight: Option<u32>,
    /// CHANNEL=SPEC[,SPEC...]: packet ports (afpacket:IFACE, afxdp:IFACE,
    /// tun:NAME, pcap:FILE, pcap-out:FILE) of a packet program or a machine (N=SPEC
    /// for an XL program's numbered ports).
    #[arg(long = "port", value_name = "CHANNEL=SPEC")]
    pub ports: Vec<String>,
}

#[derive(clap::Subcommand, Debug)]
pub enum CtlSub {
    /// Deploy a program as a new service.
    Deploy(DeployArgs),
    /// Replace a service's program: the new version listens, then the old drains.
    Redeploy(DeployArgs),
    /// Stop a service: it drains and its resources are released.
    Undeploy { name: String },
    /// Give a running service another weight (1 to 1000): its share of the
    /// workers against other services with work.
    Weight { name: String, weight: u32 },
    /// List the services.
    List,
    /// A service's bindings, connections, instances and counters.
    Status { name: String },
    /// Read a global (VAR), a dictionary entry (VAR/KEY), or a dictionary's
    /// entries (VAR, a page at a time) of a service; of a service on packet
    /// ports, `dump`, a path into it or `table` (a machine's flow context:
    /// stages/STAGE/flows/KEY).
    Read {
        name: String,
        path: String,
        /// Entries of a dictionary listed at most (default 100, at most 1000).
        #[arg(long)]
        limit: Option<usize>,
        /// Where a dictionary's listing starts (the `next` of the page before).
        #[arg(long)]
        cursor: Option<usize>,
        /// Read the entry of dictionary VAR under this key, given in base64
        /// (a key that is not UTF-8, as listed in `key_base64`).
        #[arg(long)]
        key_base64: Option<String>,
    },
    /// Write a global integer, boolean or string (VAR; VALUE as JSON, else a
    /// string), or a dictionary entry (VAR/KEY; VALUE the message's wire
    /// bytes, or for a dictionary of values an integer, boolean or string).
    /// Of a machine: `table` (VALUE a program file), `globals/REGISTER`,
    /// `stages/STAGE/flows/KEY/registers/R` (an integer) or
    /// `stages/STAGE/flows/KEY/state` (a state's name).
    Write {
        name: String,
        path: String,
        value: String,
        /// VALUE is the message's wire bytes in base64 (binary grammars).
        #[arg(long)]
        base64: bool,
        /// Write the entry of dictionary VAR under this key, given in base64.
        #[arg(long)]
        key_base64: Option<String>,
    },
    /// Delete a dictionary entry (VAR/KEY, or VAR with --key-base64), or a
    /// machine's flow context (stages/STAGE/flows/KEY).
    Delete {
        name: String,
        path: String,
        /// Delete the entry of dictionary VAR under this key, given in base64.
        #[arg(long)]
        key_base64: Option<String>,
    },
}

/// `flick ctl`: one request, its answer printed.
pub fn main(args: CtlArgs) -> std::process::ExitCode {
    let addr = args.api.as_deref().map_or_else(
        || crate::serve::default_api(std::path::Path::new("./flick-state")),
        ApiAddr::parse,
    );
    let deploy = |d: DeployArgs, redeploy: bool| CtlCommand::Deploy {
        name: d.name,
        file: d.file,
        listen: d.listen,
        connect: d.connect,
        config: d.config,
        max_instances: d.max_instances,
        weight: d.weight,
        ports: d.ports,
        redeploy,
    };
    let cmd = match args.command {
        CtlSub::Deploy(d) => deploy(d, false),
        CtlSub::Redeploy(d) => deploy(d, true),
        CtlSub::Undeploy { name } => CtlCommand::Undeploy(name),
        CtlSub::Weight { name, weight } => CtlCommand::Weight(name, weight),
        CtlSub::List => CtlCommand::List,
        CtlSub::Status { name } => CtlCommand::Status(name),
        CtlSub::Read {
            name,
            path,
            limit,
            cursor,
            key_base64,
        } => CtlCommand::Read {
            name,
            path,
            limit,
            cursor,
            key_base64,
        },
        CtlSub::Write {
            name,
            path,
            value,
            base64,
            key_base64,
        } => CtlCommand::Write {
            name,
            path,
            value,
            base64,
            key_base64,
        },
        CtlSub::Delete {
            name,
            path,
            key_base64,
        } => CtlCommand::Delete {
            name,
            path,
            key_base64,
        },
    };
    match run(&addr, args.api_token.as_deref(), args.json, cmd) {
        Ok(out) => {
            println!("{out}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
