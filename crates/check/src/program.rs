//! The checked program: what later layers (wire views, the compiler to task
//! graphs) consume instead of the raw tree.

use crate::types::Ty;
use flick_span::{Diagnostic, Span};
use flick_syntax::ast::{Expr, StateScope};
use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct CheckedProgram {
    /// The wire grammar named by a `grammar` declaration, and where.
    pub grammar: Option<String>,
    pub grammar_span: Span,
    pub records: Vec<Record>,
    pub functions: Vec<Function>,
    pub processes: Vec<Process>,
    /// The type of every expression, by its span.
    pub expr_types: HashMap<Span, Ty>,
    /// Operations that may fault at run time (an index out of range, a
    /// division by zero): the program is accepted, and `flick check` says
    /// where. A fault answers the request with the grammar's error reply.
    pub warnings: Vec<Diagnostic>,
}

impl CheckedProgram {
    pub fn record(&self, name: &str) -> Option<&Record> {
        self.records.iter().find(|r| r.name == name)
    }

    pub fn function(&self, name: &str) -> Option<&Function> {
        self.functions.iter().find(|f| f.name == name)
    }
}

#[derive(Debug, Clone)]
pub struct Record {
    pub name: String,
    pub fields: Vec<RecordField>,
    pub span: Span,
}

impl Record {
    pub fn field(&self, name: &str) -> Option<(usize, &RecordField)> {
        self.fields
            .iter()
            .enumerate()
            .find(|(_, f)| f.name.as_deref() == Some(name))
    }
}

#[derive(Debug, Clone)]
pub struct RecordField {
    /// `None` for an anonymous `_` field.
    pub name: Option<String>,
    pub ty: Ty,
    /// The `size=` expression of a string, bytes or list field, which may
    /// refer to earlier integer fields.
    pub size: Option<Expr>,
    /// The most bytes this field can occupy.
    pub max_bytes: u64,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub struct Function {
    pub name: String,
    pub params: Vec<(String, Ty)>,
    /// `()` for a function that returns nothing.
    pub result: Ty,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub struct Process {
    pub name: String,
    pub channels: Vec<(String, Ty)>,
    pub state: Vec<StateVar>,
    pub bounds: ProcessBounds,
    pub span: Span,
}

#[derive(Debug, Clone)]
pub struct StateVar {
    pub name: String,
    pub scope: StateScope,
    pub ty: Ty,
}

/// Static resource bounds of one process, computed from the program.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessBounds {
    /// Bytes one instance (one client connection's task graph) can hold:
    /// messages in flight on its channels, `local` state and the values a
    /// handler binds while it runs.
    pub instance_bytes: u64,
    /// The parts of `instance_bytes`, each named.
    pub instance_parts: Vec<(String, u64)>,
    /// Bytes of `global` state, shared by every instance.
    pub global_bytes: u64,
    /// Worst-case operations to handle one input message, per rule.
    pub rule_ops: Vec<(String, u64)>,
}

impl ProcessBounds {
    pub fn max_ops(&self) -> u64 {
        self.rule_ops.iter().map(|(_, n)| *n).max().unwrap_or(0)
    }
}
