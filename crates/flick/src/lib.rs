//! The `flick` command line: reads files, runs the front end, renders
//! diagnostics and reports.
//!
//! This crate owns everything a user sees: argument parsing, file I/O,
//! rendering [`flick_span::Diagnostic`]s with miette, and report layout;
//! for `flick run`, the configuration file ([`config`]) and the Prometheus
//! endpoint ([`metrics`]). It must not contain language rules: those live
//! in `flick-syntax` and `flick-check`, which it only calls.

pub mod api;
pub mod bounds_report;
pub mod config;
pub mod ctl;
pub mod ide;
pub mod logging;
pub mod lsp;
pub mod machine_run;
pub mod metrics;
pub mod notify;
pub mod open_files;
pub mod packet_run;
pub mod reload;
pub mod render;
pub mod serve;
pub mod table_load;
pub mod views;
