//! Every field of a grammar's units as a [`FieldRef`] constant, and every
//! header (a unit's leading fixed fields) as a
//! [`HeaderRef`](crate::HeaderRef) constant, written out as Rust: for code
//! compiled against a grammar known ahead of time (the stock grammars),
//! whose reads then name slots and offsets the compiler sees, not ones
//! loaded from a reference at run time.
//!
//! Each constant is what [`Grammar::field_ref`] resolves for the same path,
//! so it reads messages of that grammar only; on another grammar's message
//! it reads the wrong slot or bytes, never out of bounds.

use crate::{FieldKind, FieldRef, Grammar, UnitId};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Each unit module's table of its constants; a field of this name gets none.
const TABLE: &str = "FIELDS";

/// The same, of a unit's headers.
const HEADER_TABLE: &str = "HEADERS";

/// How deep field paths go into units inside units.
const MAX_DEPTH: usize = 8;

/// A `pub mod fields` with a module per unit, holding a constant per field
/// path (`ip4.src` in `frame` is `fields::frame::IP4_SRC`) and a table
/// of them by path (`fields::frame::FIELDS`); `fields::UNITS` lists the
/// tables.
pub fn field_consts(g: &Grammar) -> String {
    let mut out = String::from(
        "/// Every field of each unit, resolved as `Grammar::field_ref` resolves it\n\
         /// when this grammar was compiled: `fields::UNIT::PATH`.\n\
         #[allow(dead_code)]\npub mod fields {\n",
    );
    let mut units = String::new();
    for (id, info) in g.units.iter().enumerate() {
        if !is_ident(&info.name) {
            continue;
        }
        let mut paths = Vec::new();
        collect(g, id, "", 0, &mut paths);
        let mut consts: BTreeMap<String, Option<(String, FieldRef)>> = BTreeMap::new();
        for path in paths {
            let Some(r) = g.field_ref(id, &path) else {
                continue;
            };
            let name = path.replace('.', "_").to_ascii_uppercase();
            if name == TABLE {
                continue;
            }
            // Two paths with one name (`a.b_c`, `a_b.c`): neither is written.
            consts
                .entry(name)
                .and_modify(|c| *c = None)
                .or_insert(Some((path, r)));
        }
        let module = module_name(&info.name);
        let _ = writeln!(out, "    /// `{}`.\n    pub mod {module} {{", info.name);
        let mut all = String::new();
        for (name, (path, r)) in consts.into_iter().filter_map(|(n, c)| Some((n, c?))) {
            let _ = writeln!(
                out,
                "        /// `{path}`.\n        pub const {name}: flick_wire::FieldRef = flick_wire::{};",
                r.source()
            );
            let _ = write!(all, "({path:?}, {name}), ");
        }
        let _ = writeln!(
            out,
            "        /// Every constant above, by its path.\n        \
             pub const {TABLE}: &[(&str, flick_wire::FieldRef)] = &[{all}];\n    }}"
        );
        let _ = write!(units, "({:?}, {module}::{TABLE}), ", info.name);
    }
    let _ = writeln!(
        out,
        "    /// Every unit's table, by the unit's name.\n    \
         pub const UNITS: &[(&str, &[(&str, flick_wire::FieldRef)])] = &[{units}];\n}}"
    );
    out.push_str(&header_consts(g));
    out
}

/// A `pub mod headers` with a module per unit, holding a
/// [`HeaderRef`](crate::HeaderRef) constant, of the run's whole length,
/// for the unit's own header (`UNIT`) and for each unit inside it that has
/// one (`ip4` in `frame` is `headers::frame::IP4`); `headers::UNITS` lists
/// each unit's headers by path, with their start slots and lengths.
fn header_consts(g: &Grammar) -> String {
    let mut out = String::from(
        "/// Each unit's headers, resolved as `Grammar::header_ref` resolves them\n\
         /// when this grammar was compiled: `headers::UNIT::PATH`.\n\
         #[allow(dead_code)]\npub mod headers {\n",
    );
    let mut units = String::new();
    for (id, info) in g.units.iter().enumerate() {
        if !is_ident(&info.name) {
            continue;
        }
        let mut consts: BTreeMap<String, Option<(String, u16, u16)>> = BTreeMap::new();
        for h in g.headers(id) {
            let (path, start, len) = (h.path, h.start, h.len);
            if !path.split('.').all(|p| p.is_empty() || is_ident(p)) {
                continue;
            }
            let name = match path.as_str() {
                "" => "UNIT".to_string(),
                p => p.replace('.', "_").to_ascii_uppercase(),
            };
            if name == HEADER_TABLE {
                continue;
            }
            consts
                .entry(name)
                .and_modify(|c| *c = None)
                .or_insert(Some((path, start, len)));
        }
        let module = module_name(&info.name);
        let _ = writeln!(out, "    /// `{}`.\n    pub mod {module} {{", info.name);
        let mut all = String::new();
        for (name, (path, start, len)) in consts.into_iter().filter_map(|(n, c)| Some((n, c?))) {
            let what = match path.as_str() {
                "" => "The unit's own header.".to_string(),
                p => format!("`{p}`."),
            };
            let _ = writeln!(
                out,
                "        /// {what}\n        pub const {name}: flick_wire::HeaderRef<{len}> = \
                 flick_wire::HeaderRef::compiled({start});"
            );
            let _ = write!(all, "({path:?}, {name}.start(), {name}.len()), ");
        }
        let _ = writeln!(
            out,
            "        /// Every constant above, by its path: start slot, length.\n        \
             pub const {HEADER_TABLE}: &[(&str, u16, usize)] = &[{all}];\n    }}"
        );
        let _ = write!(units, "({:?}, {module}::{HEADER_TABLE}), ", info.name);
    }
    let _ = writeln!(
        out,
        "    /// Every unit's table, by the unit's name.\n    \
         #[allow(clippy::type_complexity)]\n    \
         pub const UNITS: &[(&str, &[(&str, u16, usize)])] = &[{units}];\n}}"
    );
    out
}

/// The paths of `unit`'s scalar fields, through the units inside it.
fn collect(g: &Grammar, unit: UnitId, prefix: &str, depth: usize, out: &mut Vec<String>) {
    for f in &g.units[unit].fields {
        if !is_ident(&f.name) {
            continue;
        }
        let path = format!("{prefix}{}", f.name);
        match f.kind {
            FieldKind::Int | FieldKind::Bytes => out.push(path),
            FieldKind::Unit(u) if depth < MAX_DEPTH => {
                collect(g, u, &format!("{path}."), depth + 1, out)
            }
            _ => {}
        }
    }
}

/// Whether `s` is made as a Rust identifier is (keywords included).
fn is_ident(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A unit's name as a module's: raw where it is a Rust keyword, and with
/// a `_` after it where it is one no raw name can take (`crate_`).
fn module_name(unit: &str) -> String {
    if ["self", "Self", "super", "crate"].contains(&unit) {
        return format!("{unit}_");
    }
    const KEYWORDS: &[&str] = &[
        "as", "break", "const", "continue", "else", "enum", "extern", "false", "fn", "for", "if",
        "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return",
        "static", "struct", "trait", "true", "type", "unsafe", "use", "where", "while", "async",
        "await", "dyn", "abstract", "become", "box", "do", "final", "macro", "override", "priv",
        "typeof", "unsized", "virtual", "yield", "try", "gen",
    ];
    if KEYWORDS.contains(&unit) {
        format!("r#{unit}")
    } else {
        unit.to_string()
    }
}
