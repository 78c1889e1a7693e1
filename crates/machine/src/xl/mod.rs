//! FlowBlaze's XL language: `.xl` programs and the `.xlh` headers they
//! import, to a [`Machine`].
//!
//! [`load`] reads a file and its imports (each resolved relative to the
//! file that imports it, each read once), [`parse_str`] takes one text
//! with no imports. Errors carry the file, line, column and byte range.

mod lexer;
mod lower;
mod parser;

pub use parser::{address, Pos, XlFile};

use crate::model::Machine;
use std::path::{Path, PathBuf};

/// The code of an XL mistake that has no `machine` counterpart.
pub const X_SYNTAX: &str = "X0001";

#[derive(Debug, thiserror::Error)]
pub enum XlError {
    /// A mistake in a file, at a place in it.
    #[error("{}:{line}:{col}: {message}", path.display())]
    At {
        path: PathBuf,
        line: usize,
        col: usize,
        /// Byte range in the file.
        start: usize,
        end: usize,
        message: String,
        /// The diagnostic's code: [`X_SYNTAX`] for most mistakes, a
        /// machine code (`M…`) where `machine` reports the same one.
        code: &'static str,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl XlError {
    pub fn message(&self) -> String {
        match self {
            XlError::At { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }

    /// The diagnostic's code (an unreadable file has [`X_SYNTAX`]).
    pub fn code(&self) -> &'static str {
        match self {
            XlError::At { code, .. } => code,
            XlError::Read { .. } => X_SYNTAX,
        }
    }

    /// The same error under another code.
    pub(crate) fn with_code(mut self, new: &'static str) -> XlError {
        if let XlError::At { code, .. } = &mut self {
            *code = new;
        }
        self
    }
}

fn at(path: &Path, text: &str, start: usize, end: usize, message: String) -> XlError {
    let start = start.min(text.len());
    let before = &text[..start];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    XlError::At {
        path: path.to_path_buf(),
        line,
        col,
        start,
        end: end.max(start),
        message,
        code: X_SYNTAX,
    }
}

struct Files {
    paths: Vec<PathBuf>,
    texts: Vec<String>,
}

impl Files {
    fn error(&self, pos: Pos, message: String) -> XlError {
        let f = pos.file as usize;
        at(
            &self.paths[f],
            &self.texts[f],
            pos.start as usize,
            pos.end as usize,
            message,
        )
    }
}

fn parse_one(files: &Files, file: usize) -> Result<XlFile, XlError> {
    let text = &files.texts[file];
    let path = &files.paths[file];
    let toks = lexer::lex(text, &|s, e, m| at(path, text, s, e, m))?;
    let err = |p: Pos, m: String| files.error(p, m);
    parser::Parser::new(&toks, file as u16, &err).file()
}

/// Parses and lowers one program text that imports nothing; `name` is
/// what errors call the file.
pub fn parse_str(name: &str, text: &str) -> Result<Machine, XlError> {
    let files = Files {
        paths: vec![PathBuf::from(name)],
        texts: vec![text.to_string()],
    };
    let f = parse_one(&files, 0)?;
    if let Some((_, pos)) = f.imports.first() {
        return Err(files.error(
            *pos,
            "imports need a file: load the program with `load`".into(),
        ));
    }
    lower::lower(&f, &|p, m| files.error(p, m))
}

/// Reads `path` and everything it imports, and lowers the whole.
pub fn load(path: &Path) -> Result<Machine, XlError> {
    load_with(path, &|p| std::fs::read_to_string(p))
}

/// [`load`] with the reading of files left to `read`.
pub fn load_with(
    path: &Path,
    read: &dyn Fn(&Path) -> std::io::Result<String>,
) -> Result<Machine, XlError> {
    let text = read(path).map_err(|source| XlError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut files = Files {
        paths: vec![path.to_path_buf()],
        texts: vec![text],
    };
    let mut merged = XlFile::default();
    let mut next = 0;
    // Files in the order they are found; each import read once.
    while next < files.paths.len() {
        let f = parse_one(&files, next)?;
        let dir = files.paths[next]
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        for (name, pos) in &f.imports {
            let p = dir.join(name);
            if files.paths.contains(&p) {
                continue;
            }
            let text = read(&p)
                .map_err(|e| files.error(*pos, format!("cannot read {}: {e}", p.display())))?;
            if files.paths.len() >= u16::MAX as usize {
                return Err(files.error(*pos, "too many imports".into()));
            }
            files.paths.push(p);
            files.texts.push(text);
        }
        if next > 0 && !f.stages.is_empty() {
            let s = &f.stages[0].name;
            return Err(files.error(
                s.pos,
                "an imported file declares fields, constants, registers and actions, not stages"
                    .into(),
            ));
        }
        merged.fields.extend(f.fields);
        merged.constants.extend(f.constants);
        merged.regs.extend(f.regs);
        merged.actions.extend(f.actions);
        merged.stages.extend(f.stages);
        next += 1;
    }
    lower::lower(&merged, &|p, m| files.error(p, m))
}

#[cfg(test)]
mod tests;
