//! Rendering diagnostics with source context, through miette.

use flick_span::{Diagnostic, Severity, SourceFile};
use miette::{
    GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, ThemeCharacters, ThemeStyles,
};
use std::fmt;

/// A diagnostic together with its source, as miette wants it.
struct Report<'a> {
    diag: &'a Diagnostic,
    source: NamedSource<String>,
    at: String,
}

impl fmt::Debug for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.diag)
    }
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.diag.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(
            f,
            "{}: {kind}[{}]: {}",
            self.at, self.diag.code, self.diag.message
        )
    }
}

impl std::error::Error for Report<'_> {}

impl miette::Diagnostic for Report<'_> {
    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diag.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.diag
            .hint
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(&self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let labels = self.diag.labels.iter().enumerate().map(|(i, l)| {
            let text = (!l.message.is_empty()).then(|| l.message.clone());
            let span = (l.span.start as usize, l.span.len());
            if i == 0 {
                LabeledSpan::new_primary_with_span(text, span)
            } else {
                LabeledSpan::new_with_span(text, span)
            }
        });
        Some(Box::new(labels))
    }
}

/// Renders `diags` against `file`: the message with file, line and column,
/// the source line with a caret line under the span, and the hint.
pub fn render(file: &SourceFile, diags: &[Diagnostic], color: bool) -> String {
    let styles = if color {
        ThemeStyles::ansi()
    } else {
        ThemeStyles::none()
    };
    // Carets all along the span, even where a label hangs from it.
    let characters = ThemeCharacters {
        underbar: '^',
        ..ThemeCharacters::ascii()
    };
    let theme = GraphicalTheme { characters, styles };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(160)
        .with_links(false);
    let mut out = String::new();
    for d in diags {
        let lc = file.line_col(d.span().start);
        let report = Report {
            diag: d,
            source: NamedSource::new(file.name.clone(), file.text.clone()),
            at: format!("{}:{}:{}", file.name, lc.line, lc.col),
        };
        handler
            .render_report(&mut out, &report)
            .expect("writing to a String cannot fail");
        out.push('\n');
    }
    out
}
