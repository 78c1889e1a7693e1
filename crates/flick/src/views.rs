//! Records as views of wire-grammar units: a program that names a grammar
//! (`grammar memcached_binary`) may declare a record with a subset of a
//! unit's fields (`type cmd: record` with only `key`); each field must be a
//! field of the unit of the same name, of a matching kind.
//!
//! A grammar may come with a library in Flick source: a program that says
//! `grammar packet` is read with lib/packet.flick after its own text
//! ([`program_source`]), and a name it shares with the library is reported
//! at the user's definition.

use flick_check::{CheckedProgram, Ty};
use flick_span::Diagnostic;
use flick_wire::{FieldKind, Grammar};
use std::path::Path;
use std::sync::Arc;

/// Finds the grammar a program names: a stock grammar, or a file
/// `NAME.grammar` next to the program or in `grammars/`.
pub fn find_grammar(name: &str, program_path: &Path) -> Result<Arc<Grammar>, String> {
    if let Some(g) = Grammar::stock(name) {
        return Ok(g);
    }
    let dir = program_path.parent().unwrap_or(Path::new("."));
    for candidate in [
        dir.join(format!("{name}.grammar")),
        Path::new("grammars").join(format!("{name}.grammar")),
    ] {
        if let Ok(src) = std::fs::read_to_string(&candidate) {
            return Grammar::from_source(name, &src).map(Arc::new).map_err(|e| {
                format!(
                    "{} does not load: {e} (run `flick grammar check {}`)",
                    candidate.display(),
                    candidate.display()
                )
            });
        }
    }
    Err(format!(
        "no stock grammar `{name}` and no file {name}.grammar; the stock grammars are {}",
        flick_wire::stock::NAMES.join(", ")
    ))
}

/// The grammar of a program without a `grammar` line: its records that
/// describe their own wire layout (`size=` on every field), compiled to
/// units by `flick_compile::record_grammar`. The grammar is named after the
/// program file. `Err` says why no record could be compiled.
pub fn record_grammar(
    program_path: &Path,
    program: &flick_syntax::ast::Program,
    checked: &CheckedProgram,
) -> Result<Arc<Grammar>, String> {
    let name = program_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "program".into());
    let compiled = flick_compile::record_grammar(&name, program, checked);
    if compiled.is_empty() {
        let why: Vec<String> = compiled
            .skipped
            .iter()
            .map(|(r, why)| format!("record `{r}`: {why}"))
            .collect();
        return Err(if why.is_empty() {
            "the program has no records".into()
        } else {
            format!("no record has a complete wire layout ({})", why.join("; "))
        });
    }
    Grammar::from_source(&name, &compiled.source)
        .map(Arc::new)
        .map_err(|e| format!("the grammar compiled from the records does not load: {e}"))
}

/// Checks every record whose name is a unit of `grammar` against it.
pub fn check_views(program: &CheckedProgram, grammar: &Grammar) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    for record in &program.records {
        let Some(unit) = grammar.unit_id(&record.name) else {
            continue;
        };
        let info = grammar.unit(unit);
        for field in &record.fields {
            let Some(name) = &field.name else { continue };
            let Some(wire) = info.fields.iter().find(|f| &f.name == name) else {
                let names: Vec<&str> = info.fields.iter().map(|f| f.name.as_str()).collect();
                diags.push(
                    Diagnostic::error(
                        "E0701",
                        format!(
                            "unit `{}` of grammar `{}` has no field `{name}`",
                            record.name, grammar.name
                        ),
                        field.span,
                    )
                    .label("not in the grammar")
                    .hint(format!("the unit's fields are {}", names.join(", "))),
                );
                continue;
            };
            let fits = matches!(
                (&field.ty, &wire.kind),
                (Ty::Int { .. } | Ty::Bool, FieldKind::Int)
                    | (Ty::Str { .. } | Ty::Bytes { .. }, FieldKind::Bytes)
                    | (Ty::List(..), FieldKind::List { .. })
                    | (Ty::Record(..), FieldKind::Unit(_))
            );
            if fits && matches!(wire.kind, FieldKind::List { .. }) {
                // A view reads scalars and byte ranges from the message's
                // slots; a list there has no value form yet, so reading it
                // would fault at run time. Refuse it here instead.
                diags.push(
                    Diagnostic::error(
                        "E0704",
                        format!("field `{name}` is a list in the grammar, which a view cannot read"),
                        field.span,
                    )
                    .label("a list of the message")
                    .hint(if name == "headers" {
                        "read one header with `header(msg, \"Name\")`, and leave `headers` out of the record".to_string()
                    } else {
                        format!("leave `{name}` out of the record; a proxy passes it on unread")
                    }),
                );
                continue;
            }
            if !fits {
                diags.push(
                    Diagnostic::error(
                        "E0702",
                        format!(
                            "field `{name}` is `{}` here but {} in the grammar",
                            field.ty,
                            kind_name(&wire.kind)
                        ),
                        field.span,
                    )
                    .label("kind differs from the grammar"),
                );
            }
        }
    }
    diags
}

fn kind_name(k: &FieldKind) -> &'static str {
    match k {
        FieldKind::Int => "an integer",
        FieldKind::Bytes => "bytes",
        FieldKind::List { .. } => "a list",
        FieldKind::Unit(_) => "a unit",
    }
}

/// The front end for a program file: parse, load the grammar it names (if
/// any), check with the grammar's field limits, and check its views.
pub fn check_program(path: &Path, src: &str) -> (CheckedProgram, Vec<Diagnostic>) {
    let (program, diags) = flick_syntax::parse(src);
    if !diags.is_empty() {
        return (flick_check::check(&program).0, diags);
    }
    let named = program.decls.iter().find_map(|d| match d {
        flick_syntax::ast::Decl::Grammar(g) => Some(g),
        _ => None,
    });
    let Some(decl) = named else {
        return flick_check::check(&program);
    };
    match find_grammar(&decl.name.name, path) {
        Err(why) => {
            let (checked, mut diags) = flick_check::check(&program);
            diags.push(
                Diagnostic::error(
                    "E0700",
                    format!("cannot load grammar `{}`", decl.name.name),
                    decl.name.span,
                )
                .hint(why),
            );
            (checked, diags)
        }
        Ok(grammar) => {
            let (checked, mut diags) = flick_check::check_with(&program, &GrammarLimits(&grammar));
            if diags.is_empty() {
                diags.extend(check_views(&checked, &grammar));
            }
            if let Some(start) = library_start(src) {
                diags = diags
                    .into_iter()
                    .map(|d| library_name_taken(src, start, d))
                    .collect();
            }
            (checked, diags)
        }
    }
}

/// A name defined twice, once by the user and once by the library that
/// follows the user's text, is reported at the user's definition, as a
/// name the library takes.
fn library_name_taken(src: &str, start: usize, d: Diagnostic) -> Diagnostic {
    let in_library = |s: flick_span::Span| s.start as usize >= start;
    let user = d.labels.iter().skip(1).find(|l| !in_library(l.span));
    match user {
        Some(user) if d.code == "E0104" && in_library(d.span()) => {
            let name = &src[user.span.range()];
            Diagnostic::error(
                "E0104",
                format!("`{name}` is a name of the packet library"),
                user.span,
            )
            .label("the packet library defines it too")
            .hint(format!(
                "`grammar packet` brings the packet library (lib/packet.flick), which defines `{name}`; choose another name, or use the library's"
            ))
        }
        _ => d,
    }
}

/// A grammar's sizes, for the checker's bounds.
struct GrammarLimits<'a>(&'a Grammar);

impl flick_check::WireLimits for GrammarLimits<'_> {
    fn field_max(&self, record: &str, field: &str) -> Option<u64> {
        let unit = self.0.unit_id(record)?;
        self.0
            .unit(unit)
            .fields
            .iter()
            .find(|f| f.name == field)?
            .max_bytes
    }

    fn message_max(&self, record: &str) -> Option<u64> {
        self.0.unit_id(record).map(|u| self.0.max_bytes(u))
    }

    fn header_list(&self, record: &str) -> Option<flick_check::HeaderList> {
        header_list(self.0, record)
    }
}

/// The header fields `header(msg, NAME)` searches in a message of unit
/// `record`: a field `headers`, a list of units with `name` and `value`
/// bytes fields (HTTP's requests and responses), where the platform's
/// host looks for them too.
pub fn header_list(grammar: &Grammar, record: &str) -> Option<flick_check::HeaderList> {
    let unit = grammar.unit(grammar.unit_id(record)?);
    let list = unit.fields.iter().find(|f| f.name == "headers")?;
    let FieldKind::List {
        elem_unit: Some(elem),
        elem_slots,
    } = list.kind
    else {
        return None;
    };
    let bytes = |name: &str| {
        let f = grammar.unit(elem).fields.iter().find(|f| f.name == name)?;
        matches!(f.kind, FieldKind::Bytes).then_some(
            f.max_bytes
                .unwrap_or(flick_check::limits::DEFAULT_BYTES_MAX),
        )
    };
    // The list's elements have the slots from the count's to the next
    // field's (or the unit's end): as many as it holds at most.
    let end = unit
        .fields
        .iter()
        .map(|f| f.slot)
        .filter(|s| *s > list.slot)
        .min()
        .unwrap_or(unit.slots);
    let count_max = (end - list.slot).saturating_sub(1) / elem_slots.max(1);
    Some(flick_check::HeaderList {
        count_max: count_max.into(),
        name_max: bytes("name")?,
        value_max: bytes("value")?,
    })
}

/// The packet library (lib/packet.flick), loaded for every program that
/// says `grammar packet`.
pub const PACKET_LIBRARY: &str = include_str!("../../../lib/packet.flick");

/// What of the library follows a program: all after its own `grammar
/// packet` line (which it has so that it can be checked alone), since a
/// program names one grammar.
pub fn library_body() -> &'static str {
    let line = "\ngrammar packet\n";
    PACKET_LIBRARY
        .find(line)
        .map_or(PACKET_LIBRARY, |i| &PACKET_LIBRARY[i + line.len()..])
}

/// The text the checker reads for a program: the user's text, followed by
/// the library of the grammar it names (only `grammar packet` has one).
/// The library comes after the user's text, so spans in the user's part
/// keep their offsets, lines and file name.
pub fn program_source(text: &str) -> std::borrow::Cow<'_, str> {
    let body = library_body();
    // The library itself, checked alone, is not read twice.
    if !names_packet_grammar(text) || text.ends_with(body) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut combined = String::with_capacity(text.len() + body.len() + 1);
    combined.push_str(text);
    if !text.ends_with('\n') {
        combined.push('\n');
    }
    combined.push_str(body);
    std::borrow::Cow::Owned(combined)
}

/// Where the library starts in a text made by [`program_source`], if it
/// holds one: spans at or past it are the library's.
pub fn library_start(combined: &str) -> Option<usize> {
    let body = library_body();
    combined
        .len()
        .checked_sub(body.len())
        .filter(|start| combined.ends_with(body) && names_packet_grammar(&combined[..*start]))
}

/// Whether a line of `text` is `grammar packet` (a trailing comment allowed).
fn names_packet_grammar(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        words.next() == Some("grammar") && words.next() == Some("packet") && words.next().is_none()
    })
}
