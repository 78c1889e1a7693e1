//! The checker's state and the order of its passes.

use crate::program::CheckedProgram;
use crate::types::{Ty, Unifier};
use flick_span::{Diagnostic, Span};
use flick_syntax::ast::*;
use std::collections::HashMap;

/// How a name in scope came to be, which decides what may be done to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindKind {
    Let,
    Param,
    /// A `ref` parameter: assignable, and passable to `ref` parameters.
    RefParam,
    State(StateScope),
    Channel,
}

#[derive(Clone, Debug)]
pub(crate) struct Binding {
    pub ty: Ty,
    pub kind: BindKind,
    /// A `let` of `E mod len(A)`: the name of `A`, which this value always
    /// indexes in range.
    pub index_of: Option<String>,
}

pub(crate) struct Checker<'p> {
    pub program: &'p Program,
    pub diags: Vec<Diagnostic>,
    pub out: CheckedProgram,
    pub uni: Unifier,
    pub record_ids: HashMap<String, usize>,
    pub record_decls: Vec<&'p TypeDecl>,
    pub record_sizes: HashMap<usize, u64>,
    pub aliases: HashMap<String, &'p TypeExpr>,
    /// Aliases being resolved, to catch cycles.
    pub resolving: Vec<String>,
    /// Aliases already resolved, so that errors in an alias's body are
    /// reported once, however often it is used.
    pub alias_types: HashMap<String, Ty>,
    pub fun_ids: HashMap<String, usize>,
    pub fun_decls: Vec<&'p FunDecl>,
    pub proc_decls: Vec<&'p ProcDecl>,
    /// Innermost scope last.
    pub scopes: Vec<Vec<(String, Binding)>>,
    /// The function whose body is being checked, for the call graph.
    pub current_fun: Option<usize>,
    /// Call graph edges: caller, callee, call site.
    pub calls: Vec<(usize, usize, Span)>,
    /// Maximum sizes that a wire grammar gives record fields, by record
    /// and field name: the default for fields that state none.
    pub wire_limits: HashMap<(String, String), u64>,
    /// The wire limit of the record field being resolved.
    pub wire_max: Option<u64>,
    /// Whole-message sizes of records that view wire-grammar units.
    pub wire_messages: HashMap<String, u64>,
    /// Header lists of the units records view, by record name.
    pub header_lists: HashMap<String, crate::HeaderList>,
    /// Where meters and Bloom filters are written (their types, fresh
    /// values and built-ins), each with what it is: packet state, refused
    /// at the end unless the program says `grammar packet`.
    pub packet_state_uses: Vec<(Span, String)>,
}

impl<'p> Checker<'p> {
    pub(crate) fn new(program: &'p Program) -> Checker<'p> {
        Checker {
            program,
            diags: Vec::new(),
            out: CheckedProgram::default(),
            uni: Unifier::default(),
            record_ids: HashMap::new(),
            record_decls: Vec::new(),
            record_sizes: HashMap::new(),
            aliases: HashMap::new(),
            resolving: Vec::new(),
            alias_types: HashMap::new(),
            fun_ids: HashMap::new(),
            fun_decls: Vec::new(),
            proc_decls: Vec::new(),
            scopes: Vec::new(),
            current_fun: None,
            calls: Vec::new(),
            wire_limits: HashMap::new(),
            wire_max: None,
            wire_messages: HashMap::new(),
            header_lists: HashMap::new(),
            packet_state_uses: Vec::new(),
        }
    }

    pub(crate) fn run(mut self) -> (CheckedProgram, Vec<Diagnostic>) {
        self.collect();
        self.resolve_aliases();
        self.resolve_records();
        self.function_signatures();
        for (i, f) in self.fun_decls.clone().into_iter().enumerate() {
            self.function_body(i, f);
        }
        self.check_recursion();
        let procs = self.proc_decls.clone();
        let mut checked = Vec::new();
        for p in procs {
            checked.push(self.process(p));
        }
        self.packet_state_outside_packet_programs();
        let types = std::mem::take(&mut self.out.expr_types);
        self.out.expr_types = types
            .into_iter()
            .map(|(span, ty)| (span, self.uni.resolve(&ty)))
            .collect();
        if self.diags.is_empty() {
            for (p, mut info) in self.proc_decls.clone().into_iter().zip(checked) {
                info.bounds = self.bounds(p, &info);
                self.out.processes.push(info);
            }
        } else {
            self.out.processes = checked;
        }
        self.diags.sort_by_key(|d| d.span().start);
        (self.out, self.diags)
    }

    pub(crate) fn push_scope(&mut self) {
        self.scopes.push(Vec::new());
    }

    pub(crate) fn pop_scope(&mut self) {
        self.scopes.pop();
    }

    pub(crate) fn bind(&mut self, name: &str, ty: Ty, kind: BindKind) {
        self.scopes.last_mut().expect("a scope is open").push((
            name.to_string(),
            Binding {
                ty,
                kind,
                index_of: None,
            },
        ));
    }

    pub(crate) fn lookup(&self, name: &str) -> Option<&Binding> {
        self.scopes
            .iter()
            .rev()
            .flat_map(|s| s.iter().rev())
            .find(|(n, _)| n == name)
            .map(|(_, b)| b)
    }

    /// Every name in scope, for suggestions.
    pub(crate) fn names_in_scope(&self) -> Vec<String> {
        self.scopes
            .iter()
            .flat_map(|s| s.iter().map(|(n, _)| n.clone()))
            .collect()
    }

    /// Unifies `found` with `expected`, reporting a mismatch at `span`.
    pub(crate) fn expect_ty(&mut self, found: &Ty, expected: &Ty, span: Span, what: &str) -> bool {
        if self.uni.unify(found, expected).is_ok() {
            return true;
        }
        let found = self.uni.resolve(found);
        let expected = self.uni.resolve(expected);
        self.diags.push(
            Diagnostic::error(
                "E0201",
                format!("{what}: expected `{expected}`, found `{found}`"),
                span,
            )
            .label(format!("this is `{found}`")),
        );
        false
    }
}
