//! `flick run`'s log: `tracing` events of the platform (faults, dropped
//! messages, backends going down and up, refused connections) written to
//! standard error, as text or one JSON object per line.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// The log's line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Starts writing the log: at `level` (`error`, `warn`, `info`, `debug`,
/// `trace`, or any `RUST_LOG` directive) when given, else as `RUST_LOG`
/// says, else at `info`.
pub fn init(level: Option<&str>, format: LogFormat) -> Result<(), String> {
    let filter = match level {
        Some(l) => EnvFilter::try_new(l).map_err(|e| format!("bad --log-level {l:?}: {e}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|e| format!("cannot start the log: {e}"))
}
