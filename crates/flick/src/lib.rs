//! The `flick` command line: reads files, runs the front end, renders
//! diagnostics and reports.
//!
//! This crate owns everything a user sees: argument parsing, file I/O,
//! rendering [`flick_span::Diagnostic`]s with miette, and report layout. It
//! must not contain language rules: those live in `flick-syntax` and
//! `flick-check`, which it only calls.

pub mod bounds_report;
pub mod render;
pub mod views;
