//! `flick`: check, format and (in later versions) run Flick programs.

use clap::{Parser, Subcommand};
use flick::bounds_report::bounds_report;
use flick::render::render;
use flick_span::SourceFile;
use std::io::IsTerminal;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "flick",
    version,
    about = "Write and run network functions in Flick"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check programs: syntax, types, channel directions, termination and bounds.
    Check {
        /// Print each process's memory bound and worst-case operations per message.
        #[arg(long)]
        bounds: bool,
        /// The programs to check.
        #[arg(required = true)]
        files: Vec<String>,
    },
    /// Print a program in canonical layout.
    Fmt {
        /// Exit non-zero, printing nothing, if the file is not already canonical.
        #[arg(long)]
        check: bool,
        /// The program to format.
        file: String,
    },
}

fn read(path: &str) -> Result<SourceFile, ExitCode> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(SourceFile::new(path, text)),
        Err(e) => {
            eprintln!("error: cannot read {path}: {e}");
            Err(ExitCode::from(2))
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let color = std::io::stderr().is_terminal();
    match cli.command {
        Command::Check { bounds, files } => {
            let mut failed = false;
            for path in &files {
                let file = match read(path) {
                    Ok(f) => f,
                    Err(code) => return code,
                };
                let (checked, diags) = flick_check::check_source(&file.text);
                if diags.is_empty() {
                    println!("{path}: ok");
                    if bounds {
                        print!("{}", bounds_report(&checked));
                    }
                } else {
                    failed = true;
                    eprint!("{}", render(&file, &diags, color));
                    let s = if diags.len() == 1 { "" } else { "s" };
                    eprintln!("{path}: {} error{s}", diags.len());
                }
            }
            if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Command::Fmt { check, file: path } => {
            let file = match read(&path) {
                Ok(f) => f,
                Err(code) => return code,
            };
            let (program, comments, diags) = flick_syntax::parse_with_comments(&file.text);
            if !diags.is_empty() {
                eprint!("{}", render(&file, &diags, color));
                return ExitCode::FAILURE;
            }
            let text = flick_syntax::format_with_comments(&program, &comments);
            if check {
                if text != file.text {
                    eprintln!("{path}: not in canonical layout (run `flick fmt {path}`)");
                    return ExitCode::FAILURE;
                }
            } else {
                print!("{text}");
            }
            ExitCode::SUCCESS
        }
    }
}
