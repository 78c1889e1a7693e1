//! Replacing a running machine's tables: the control socket of
//! `flick run FILE --control PATH`, SIGHUP, and the client,
//! `flick table load --control PATH FILE` (an `.xl` program, or a Flick
//! program holding a `machine`).
//!
//! The protocol: one request per connection, one line (at most
//! [`MAX_REQUEST`] bytes, read within [`READ_TIMEOUT`]), either
//! `load FILE` or the JSON `{"load": "FILE"}`; the answer is one JSON
//! line, `{"applied": true, "micros": N}` or
//! `{"applied": false, "micros": N, "error": "..."}`. A load reads and
//! checks the file (its diagnostics are the error), compiles it, and
//! checks that it keeps every stage's key, flow registers and states
//! before handing it to the dispatcher, which installs it before the next
//! frame it reads; a refused program leaves the running tables as they
//! were. SIGHUP loads the running file again by the same path.

use crate::machine_run::read_machine;
use flick_machine::Program;
use serde_json::{json, Value as Json};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest request line, in bytes.
pub const MAX_REQUEST: usize = 4096;
/// How long a connection may take to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the client waits for its answer (a load compiles the file).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// What a load did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOutcome {
    /// Handed to the machine; otherwise the running tables are unchanged.
    pub applied: bool,
    /// From the request to the hand-over (or the refusal).
    pub micros: u64,
    /// Why not: diagnostics, or what the new program changes.
    pub error: Option<String>,
}

impl LoadOutcome {
    pub fn json(&self) -> Json {
        let mut o = json!({ "applied": self.applied, "micros": self.micros });
        if let Some(e) = &self.error {
            o["error"] = e.clone().into();
        }
        o
    }

    fn from_json(v: &Json) -> Option<LoadOutcome> {
        Some(LoadOutcome {
            applied: v.get("applied")?.as_bool()?,
            micros: v.get("micros").and_then(Json::as_u64).unwrap_or(0),
            error: v.get("error").and_then(Json::as_str).map(str::to_string),
        })
    }
}

/// The running tables and the way to replace them: shared by the control
/// socket and SIGHUP, so every replacement is checked against the tables
/// the last one installed.
pub struct TableLoader {
    running: Arc<Program>,
    /// Workers serving the machine (a program needing one is refused
    /// when there are several).
    workers: usize,
    swaps: flick_machine::SwapSender,
}

impl TableLoader {
    pub fn new(
        running: Arc<Program>,
        workers: usize,
        swaps: flick_machine::SwapSender,
    ) -> TableLoader {
        TableLoader {
            running,
            workers,
            swaps,
        }
    }

    /// Loads, checks and compiles `path`, then hands it to the machine.
    pub fn load(&mut self, path: &Path) -> LoadOutcome {
        let start = Instant::now();
        let result = self.try_load(path);
        let micros = start.elapsed().as_micros() as u64;
        match result {
            Ok(()) => LoadOutcome {
                applied: true,
                micros,
                error: None,
            },
            Err(e) => LoadOutcome {
                applied: false,
                micros,
                error: Some(e),
            },
        }
    }

    /// The tables the last load installed.
    pub fn running(&self) -> Arc<Program> {
        self.running.clone()
    }

    /// [`TableLoader::load`] of a machine already read (`file` names it in
    /// errors): the control API's table writes.
    pub fn load_machine(&mut self, file: &str, machine: flick_machine::Machine) -> LoadOutcome {
        let start = Instant::now();
        let result = self.install(Path::new(file), machine);
        let micros = start.elapsed().as_micros() as u64;
        LoadOutcome {
            applied: result.is_ok(),
            micros,
            error: result.err(),
        }
    }

    fn try_load(&mut self, path: &Path) -> Result<(), String> {
        let (machine, _) = read_machine(path, false)?;
        self.install(path, machine)
    }

    fn install(&mut self, path: &Path, machine: flick_machine::Machine) -> Result<(), String> {
        let program = Program::new(machine).map_err(|e| format!("{}: {e}", path.display()))?;
        flick_machine::FieldReader::new(&program.machine.fields)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        self.running
            .check_replacement(&program)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if program.machine.single_worker() && self.workers > 1 {
            return Err(format!(
                "{}: the new program needs one worker (several stages with flow keys, or global registers written), and this run has {}",
                path.display(),
                self.workers
            ));
        }
        let program = Arc::new(program);
        self.swaps
            .send(program.clone())
            .map_err(|_| "the machine has stopped".to_string())?;
        self.running = program;
        Ok(())
    }
}

/// A listening control socket; the socket file is removed on drop.
pub struct ControlSocket {
    path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {0}: another process is listening there")]
    InUse(PathBuf),
    #[error("control socket {0}: {1}")]
    Io(PathBuf, std::io::Error),
}

impl ControlSocket {
    /// Listens at `path` (a stale socket file left there is replaced) and
    /// answers requests on a thread of its own, one connection at a time.
    pub fn start(
        path: &Path,
        loader: Arc<Mutex<TableLoader>>,
    ) -> Result<ControlSocket, ControlError> {
        if UnixStream::connect(path).is_ok() {
            return Err(ControlError::InUse(path.into()));
        }
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).map_err(|e| ControlError::Io(path.into(), e))?;
        std::thread::Builder::new()
            .name("flick-control".into())
            .spawn(move || {
                for conn in listener.incoming().flatten() {
                    serve(conn, &loader);
                }
            })
            .map_err(|e| ControlError::Io(path.into(), e))?;
        Ok(ControlSocket { path: path.into() })
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The file a request asks to load, if it is the documented request.
pub fn parse_request(line: &str) -> Result<PathBuf, String> {
    let line = line.trim();
    if line.starts_with('{') {
        let v: Json = serde_json::from_str(line).map_err(|e| format!("bad JSON request: {e}"))?;
        return match v.get("load").and_then(Json::as_str) {
            Some(f) if !f.is_empty() => Ok(f.into()),
            _ => Err("unknown request: the only request is {\"load\": \"FILE\"}".into()),
        };
    }
    match line.split_once(' ') {
        Some(("load", f)) if !f.trim().is_empty() => Ok(f.trim().into()),
        _ => Err("unknown request: the only request is `load FILE`".into()),
    }
}

fn serve(conn: UnixStream, loader: &Mutex<TableLoader>) {
    let _ = conn.set_read_timeout(Some(READ_TIMEOUT));
    let _ = conn.set_write_timeout(Some(READ_TIMEOUT));
    let mut line = String::new();
    let read = BufReader::new((&conn).take(MAX_REQUEST as u64 + 1)).read_line(&mut line);
    let answer = match read {
        Err(e) => {
            json!({ "applied": false, "micros": 0, "error": format!("cannot read the request: {e}") })
        }
        Ok(_) if line.len() > MAX_REQUEST => {
            json!({ "applied": false, "micros": 0, "error": format!("request longer than {MAX_REQUEST} bytes") })
        }
        Ok(_) => match parse_request(&line) {
            Err(e) => json!({ "applied": false, "micros": 0, "error": e }),
            Ok(path) => {
                let outcome = loader.lock().unwrap_or_else(|p| p.into_inner()).load(&path);
                log(&path, &outcome, "control socket");
                outcome.json()
            }
        },
    };
    let mut conn = conn;
    let _ = writeln!(conn, "{answer}");
}

/// One line on standard error about a load.
pub fn log(path: &Path, outcome: &LoadOutcome, from: &str) {
    match &outcome.error {
        None => eprintln!(
            "flick: {from}: tables of {} applied in {} us",
            path.display(),
            outcome.micros
        ),
        Some(e) => {
            // Rendered diagnostics span lines: they start on their own.
            let sep = if e.trim_end().contains('\n') {
                "\n"
            } else {
                " "
            };
            eprintln!(
                "flick: {from}: tables of {} not applied, the running ones stay:{sep}{}",
                path.display(),
                e.trim_end()
            )
        }
    }
}

/// Reloads `path` on each SIGHUP.
pub fn reload_on_sighup(path: PathBuf, loader: Arc<Mutex<TableLoader>>) {
    let Ok(mut signals) = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP]) else {
        return;
    };
    let _ = std::thread::Builder::new()
        .name("flick-sighup".into())
        .spawn(move || {
            for _ in signals.forever() {
                let outcome = loader.lock().unwrap_or_else(|p| p.into_inner()).load(&path);
                log(&path, &outcome, "SIGHUP");
            }
        });
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the control socket {0}: {1}")]
    Connect(PathBuf, std::io::Error),
    #[error("control socket {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("control socket {0}: unexpected answer {1:?}")]
    Answer(PathBuf, String),
}

/// Asks the machine listening at `control` to load `file` (made absolute
/// first, since the machine may run elsewhere). Returns the answer.
pub fn request_load(control: &Path, file: &Path) -> Result<(LoadOutcome, Json), ClientError> {
    let file = std::fs::canonicalize(file).unwrap_or_else(|_| file.into());
    let mut conn =
        UnixStream::connect(control).map_err(|e| ClientError::Connect(control.into(), e))?;
    let io = |e| ClientError::Io(control.into(), e);
    conn.set_read_timeout(Some(ANSWER_TIMEOUT)).map_err(io)?;
    let request = json!({ "load": file.display().to_string() });
    writeln!(conn, "{request}").map_err(io)?;
    let mut line = String::new();
    BufReader::new(conn.take(1 << 20))
        .read_line(&mut line)
        .map_err(io)?;
    let v: Json = serde_json::from_str(line.trim())
        .map_err(|_| ClientError::Answer(control.into(), line.clone()))?;
    let outcome =
        LoadOutcome::from_json(&v).ok_or_else(|| ClientError::Answer(control.into(), line))?;
    Ok((outcome, v))
}

/// `flick table load --control PATH FILE.xl`: prints the outcome; false
/// if the tables were not applied.
pub fn load_command(control: &str, file: &str, as_json: bool) -> bool {
    match request_load(Path::new(control), Path::new(file)) {
        Err(e) => {
            eprintln!("error: {e}");
            false
        }
        Ok((outcome, v)) => {
            if as_json {
                println!("{v}");
            }
            match &outcome.error {
                None => {
                    if !as_json {
                        println!("{file}: applied in {} us", outcome.micros);
                    }
                    true
                }
                Some(e) => {
                    if !as_json {
                        eprint!("{}", e);
                        if !e.ends_with('\n') {
                            eprintln!();
                        }
                        eprintln!("error: {file}: not applied; the running tables stay");
                    }
                    false
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flick_machine::xl;

    const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/flowblaze");

    /// port_knocking.xl edited, beside a copy of its headers.
    fn knocking(dir: &Path, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
        std::fs::copy(
            Path::new(EXAMPLES).join("headers.xlh"),
            dir.join("headers.xlh"),
        )
        .unwrap();
        let text = std::fs::read_to_string(Path::new(EXAMPLES).join("port_knocking.xl")).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, edit(text)).unwrap();
        path
    }

    #[test]
    fn a_flick_machine_replaces_the_xl_programs_tables_and_its_own() {
        let dir = std::env::temp_dir().join(format!("flick-loader-flick-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text =
            std::fs::read_to_string(Path::new(EXAMPLES).join("port_knocking.flick")).unwrap();
        let write = |name: &str, text: String| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let same = write("knock.flick", text.clone());
        let variant = write("variant.flick", text.replace("SSH = 22", "SSH = 2200"));
        let other_key = write("key.flick", text.replace("key ipv4.src", "key ipv4.dst"));
        let broken = write("broken.flick", text.replace("next open", "next opened"));
        let xl = knocking(&dir, "knock.xl", |t| t);
        let program = Arc::new(Program::new(xl::load(&xl).unwrap()).unwrap());
        let (tx, rx) = flick_machine::swap_channel();
        let mut loader = TableLoader::new(program, 1, tx);
        let o = loader.load(&other_key);
        assert!(!o.applied && o.error.unwrap().contains("flow key"));
        let o = loader.load(&broken);
        let e = o.error.clone().unwrap_or_default();
        assert!(
            !o.applied && e.contains("broken.flick:") && e.contains('^'),
            "{o:?}"
        );
        assert!(rx.try_recv().is_err(), "a refused program was sent");
        assert!(loader.load(&same).applied);
        let o = loader.load(&variant);
        assert!(o.applied, "{o:?}");
        let sent = (rx.try_recv().unwrap(), rx.try_recv().unwrap()).1;
        assert!(format!("{:?}", sent.machine).contains("2200"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_compatible_programs_are_sent() {
        let dir = std::env::temp_dir().join(format!("flick-loader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let running = knocking(&dir, "knock.xl", |t| t);
        let variant = knocking(&dir, "variant.xl", |t| t.replace("== SSH", "== 2200"));
        let other_key = knocking(&dir, "key.xl", |t| t.replace("(ipv4.src)", "(ipv4.dst)"));
        let fewer_states = knocking(&dir, "states.xl", |t| t.replace("knocked2", "knocked9"));
        let broken = knocking(&dir, "broken.xl", |t| t.replace("State open {", "State {"));
        let program = Arc::new(Program::new(xl::load(&running).unwrap()).unwrap());
        let (tx, rx) = flick_machine::swap_channel();
        let mut loader = TableLoader::new(program, 2, tx);

        let o = loader.load(&other_key);
        assert!(
            !o.applied && o.error.as_deref().unwrap().contains("flow key"),
            "{o:?}"
        );
        let o = loader.load(&fewer_states);
        assert!(
            !o.applied && o.error.as_deref().unwrap().contains("states"),
            "{o:?}"
        );
        let o = loader.load(&broken);
        let e = o.error.clone().unwrap_or_default();
        assert!(
            !o.applied && e.contains("broken.xl") && e.contains('^'),
            "{o:?}"
        );
        let o = loader.load(&dir.join("missing.xl"));
        assert!(!o.applied, "{o:?}");
        assert!(rx.try_recv().is_err(), "a refused program was sent");

        let o = loader.load(&variant);
        assert!(o.applied && o.error.is_none(), "{o:?}");
        let sent = rx.try_recv().expect("the variant was sent");
        assert!(format!("{:?}", sent.machine).contains("2200"));
        // Checked against the variant now running: still compatible.
        assert!(loader.load(&running).applied);
        assert_eq!(o.json()["applied"], true);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn requests() {
        assert_eq!(parse_request("load a.xl\n"), Ok("a.xl".into()));
        assert_eq!(
            parse_request(r#"{"load": "/x/b.xl"}"#),
            Ok("/x/b.xl".into())
        );
        assert!(parse_request("dump\n").is_err());
        assert!(parse_request("load \n").is_err());
        assert!(parse_request(r#"{"unload": "a"}"#).is_err());
    }
}
