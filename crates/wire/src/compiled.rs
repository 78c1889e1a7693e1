//! Grammars compiled ahead of time: a registry of generated parsers, and
//! the match between a loaded grammar and the code generated from it.
//!
//! A crate that compiles grammars (`flick-grammars`) registers them once
//! at start-up. A parser made afterwards for a grammar whose generated
//! code has the same fingerprint as the registered code runs that code
//! first on each message (see [`codegen`]).

use crate::codegen;
use crate::program::{CExpr, UnitId};
use crate::rt::{BatchFn, CompiledGrammar, Cx, ParseFn};
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
    pub full: ParseFn,
    /// `full` over a run of messages.
    pub batch: BatchFn,
    /// Both, under a view, if the code honours views.
    pub view: Option<(ParseFn, BatchFn)>,
    /// `full` and, if the code honours views, `view`, leaving the fields
    /// read in place unstored, if the code can.
    pub in_place: Option<(ParseFn, Option<ParseFn>)>,
    pub cx: Cx,
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
        full: cu.full,
        batch: cu.batch_full,
        view: views.then_some((cu.view, cu.batch_view)),
        in_place: in_place.then_some((cu.in_place, views.then_some(cu.in_place_view))),
        cx: Cx::new(exprs.clone(), fp.no_view.clone()),
    })
}
