//! Grammars compiled ahead of time: a registry of generated parsers, and
//! the match between a loaded grammar and the code generated from it.
//!
//! A crate that compiles grammars (`flick-grammars`) registers them once
//! at start-up. A parser made afterwards for a grammar whose generated
//! code has the same fingerprint as the registered code runs that code
//! first on each message (see [`codegen`]).

use crate::codegen;
use crate::program::{CExpr, UnitId};
use crate::rt::{BatchFn, CompiledGrammar, CompiledUnit, Cx, EachFn, ParseFn};
use crate::Grammar;
use std::sync::{Arc, RwLock};

static REGISTRY: RwLock<Vec<&'static CompiledGrammar>> = RwLock::new(Vec::new());

/// Makes `g`'s generated parsers available to parsers made from now on.
/// Registering the same grammar twice is harmless.
pub fn register(g: &'static CompiledGrammar) {
    let mut r = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
    if !r.iter().any(|x| x.fingerprint == g.fingerprint) {
        r.push(g);
    }
}

/// What a parser runs before the interpreter, and what that reads and
/// reports.
pub(crate) struct FastParse {
    /// The variant in use: one message, a run of them in one buffer, and
    /// a message from each of several buffers.
    pub full: ParseFn,
    pub batch: BatchFn,
    pub each: EachFn,
    pub cx: Cx,
    code: &'static CompiledUnit,
    /// The code honours views, and can leave fields in place.
    views: bool,
    in_place: bool,
    /// The variant in use leaves fields in place.
    pub leaves_in_place: bool,
}

impl FastParse {
    /// Runs the variant under a view or not, leaving fields in place or
    /// not; `false`, and nothing changed, if the code has no such variant.
    pub fn select(&mut self, view: bool, in_place: bool) -> bool {
        if (view && !self.views) || (in_place && !self.in_place) {
            return false;
        }
        let (v, p) = (view as usize, in_place as usize);
        self.full = self.code.one[v][p];
        self.batch = self.code.batch[v][p];
        self.each = self.code.each[v][p];
        self.leaves_in_place = in_place;
        true
    }
}

/// What generating code from a loaded grammar gave: its fingerprint and,
/// per unit, the expressions its code evaluates.
#[derive(Debug)]
pub(crate) struct Fingerprint {
    pub fingerprint: u64,
    pub units: Vec<Option<UnitCode>>,
    /// The keep-everything of parsers without a view, shared.
    pub no_view: Arc<[bool]>,
}

/// What a unit's generated code evaluates, and the variants it has.
#[derive(Debug)]
pub(crate) struct UnitCode {
    exprs: Arc<[CExpr]>,
    /// It honours views.
    views: bool,
    /// It can leave fields in place.
    in_place: bool,
}

/// The generated parser of `unit`, if one is registered for `g` as loaded.
pub(crate) fn lookup(g: &Grammar, unit: UnitId) -> Option<FastParse> {
    let compiled = {
        let r = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
        r.iter().copied().find(|c| c.name == g.name)?
    };
    let fp = g.generated.get_or_init(|| {
        let gen = codegen::generate(g);
        Fingerprint {
            fingerprint: gen.fingerprint,
            units: gen
                .units
                .into_iter()
                .map(|u| {
                    u.map(|u| UnitCode {
                        exprs: Arc::from(u.exprs),
                        views: u.views,
                        in_place: u.in_place,
                    })
                })
                .collect(),
            no_view: Arc::from(&[][..]),
        }
    });
    if fp.fingerprint != compiled.fingerprint {
        return None;
    }
    let UnitCode {
        exprs,
        views,
        in_place,
    } = fp.units.get(unit)?.as_ref()?;
    let name = &g.units[unit].name;
    let cu = compiled.units.iter().find(|u| u.unit == name)?;
    Some(FastParse {
        full: cu.one[0][0],
        batch: cu.batch[0][0],
        each: cu.each[0][0],
        cx: Cx {
            limits: g.limit_values.clone(),
            ..Cx::new(exprs.clone(), fp.no_view.clone())
        },
        code: cu,
        views: *views,
        in_place: *in_place,
        leaves_in_place: false,
    })
}
