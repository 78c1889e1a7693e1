//! `flick lsp`: a language server on standard input and output, for
//! editors (`editors/vscode` starts it). It keeps each open document's
//! text, publishes its diagnostics whenever it changes, and answers hover,
//! go to definition and formatting from [`crate::ide`].
//!
//! The protocol (JSON-RPC framing, the initialize handshake) is
//! rust-analyzer's `lsp-server`; the message types are `lsp-types`.

use crate::ide::{self, Analysis};
use flick_span::{Diagnostic, Severity, SourceFile, Span};
use lsp_server::{Connection, ExtractError, Message, Notification, Request, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidCloseTextDocument, DidOpenTextDocument, Notification as _,
    PublishDiagnostics,
};
use lsp_types::request::{Formatting, GotoDefinition, HoverRequest, Request as _};
use lsp_types::{
    DiagnosticSeverity, GotoDefinitionResponse, Hover, HoverContents, HoverProviderCapability,
    Location, MarkupContent, MarkupKind, NumberOrString, OneOf, Position, PublishDiagnosticsParams,
    Range, ServerCapabilities, TextDocumentSyncCapability, TextDocumentSyncKind, TextEdit, Url,
};
use std::collections::HashMap;
use std::path::PathBuf;

/// Serves one editor session over standard input and output, until the
/// editor asks the server to exit.
pub fn serve_stdio() -> Result<(), Box<dyn std::error::Error + Sync + Send>> {
    let (connection, io_threads) = Connection::stdio();
    let capabilities = ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(TextDocumentSyncKind::FULL)),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        definition_provider: Some(OneOf::Left(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        ..ServerCapabilities::default()
    };
    connection.initialize(serde_json::to_value(capabilities)?)?;
    let mut server = Server {
        connection: &connection,
        documents: HashMap::new(),
    };
    server.run()?;
    // The writer thread ends when the last sender goes.
    drop(server);
    drop(connection);
    io_threads.join()?;
    Ok(())
}

/// An open document: its analysis and the file that maps offsets to lines.
struct Document {
    analysis: Analysis,
    file: SourceFile,
}

struct Server<'a> {
    connection: &'a Connection,
    documents: HashMap<Url, Document>,
}

type Error = Box<dyn std::error::Error + Sync + Send>;

impl Server<'_> {
    fn run(&mut self) -> Result<(), Error> {
        for msg in &self.connection.receiver {
            match msg {
                Message::Request(req) => {
                    if self.connection.handle_shutdown(&req)? {
                        return Ok(());
                    }
                    let response = self.request(req);
                    self.connection.sender.send(Message::Response(response))?;
                }
                Message::Notification(n) => self.notification(n)?,
                Message::Response(_) => {}
            }
        }
        Ok(())
    }

    fn request(&mut self, req: Request) -> Response {
        let id = req.id.clone();
        let result = match req.method.as_str() {
            HoverRequest::METHOD => cast::<HoverRequest>(req).map(|p| {
                let at = &p.text_document_position_params;
                self.hover(&at.text_document.uri, at.position)
                    .map(|h| serde_json::to_value(h).unwrap_or_default())
            }),
            GotoDefinition::METHOD => cast::<GotoDefinition>(req).map(|p| {
                let at = &p.text_document_position_params;
                self.definition(&at.text_document.uri, at.position)
                    .map(|d| serde_json::to_value(d).unwrap_or_default())
            }),
            Formatting::METHOD => cast::<Formatting>(req).map(|p| {
                self.format(&p.text_document.uri)
                    .map(|e| serde_json::to_value(e).unwrap_or_default())
            }),
            _ => {
                return Response::new_err(
                    id,
                    lsp_server::ErrorCode::MethodNotFound as i32,
                    format!("flick lsp does not answer {}", req.method),
                )
            }
        };
        match result {
            Ok(value) => Response::new_ok(id, value.unwrap_or(serde_json::Value::Null)),
            Err(why) => Response::new_err(id, lsp_server::ErrorCode::InvalidParams as i32, why),
        }
    }

    fn notification(&mut self, n: Notification) -> Result<(), Error> {
        match n.method.as_str() {
            DidOpenTextDocument::METHOD => {
                let p: lsp_types::DidOpenTextDocumentParams = serde_json::from_value(n.params)?;
                self.update(p.text_document.uri, p.text_document.text)?;
            }
            DidChangeTextDocument::METHOD => {
                let p: lsp_types::DidChangeTextDocumentParams = serde_json::from_value(n.params)?;
                // Full synchronisation: the last change is the whole text.
                if let Some(change) = p.content_changes.into_iter().last() {
                    self.update(p.text_document.uri, change.text)?;
                }
            }
            DidCloseTextDocument::METHOD => {
                let p: lsp_types::DidCloseTextDocumentParams = serde_json::from_value(n.params)?;
                self.documents.remove(&p.text_document.uri);
                self.publish(p.text_document.uri, Vec::new())?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Analyses a document's new text and publishes its diagnostics.
    fn update(&mut self, uri: Url, text: String) -> Result<(), Error> {
        let path = uri
            .to_file_path()
            .unwrap_or_else(|_| PathBuf::from(uri.path()));
        let analysis = ide::analyse(&path, &text);
        let file = SourceFile::new(path.display().to_string(), text);
        let diagnostics = analysis
            .diagnostics
            .iter()
            .map(|d| to_lsp_diagnostic(&file, d))
            .collect();
        self.documents
            .insert(uri.clone(), Document { analysis, file });
        self.publish(uri, diagnostics)
    }

    fn publish(&self, uri: Url, diagnostics: Vec<lsp_types::Diagnostic>) -> Result<(), Error> {
        let params = PublishDiagnosticsParams {
            uri,
            diagnostics,
            version: None,
        };
        let n = Notification::new(PublishDiagnostics::METHOD.to_string(), params);
        self.connection.sender.send(Message::Notification(n))?;
        Ok(())
    }

    fn hover(&self, uri: &Url, pos: Position) -> Option<Hover> {
        let doc = self.documents.get(uri)?;
        let (span, text) = doc.analysis.hover(offset(&doc.file, pos)?)?;
        Some(Hover {
            contents: HoverContents::Markup(MarkupContent {
                kind: MarkupKind::Markdown,
                value: text,
            }),
            range: Some(range(&doc.file, span)),
        })
    }

    fn definition(&self, uri: &Url, pos: Position) -> Option<GotoDefinitionResponse> {
        let doc = self.documents.get(uri)?;
        let span = doc.analysis.definition(offset(&doc.file, pos)?)?;
        Some(GotoDefinitionResponse::Scalar(Location {
            uri: uri.clone(),
            range: range(&doc.file, span),
        }))
    }

    /// One edit replacing the whole text, or none if it is canonical or
    /// does not parse (its diagnostics say why).
    fn format(&self, uri: &Url) -> Option<Vec<TextEdit>> {
        let doc = self.documents.get(uri)?;
        let text = ide::format(&doc.analysis.text).ok()?;
        if text == doc.analysis.text {
            return Some(Vec::new());
        }
        let end = doc.analysis.text.len() as u32;
        Some(vec![TextEdit {
            range: range(&doc.file, Span::new(0, end as usize)),
            new_text: text,
        }])
    }
}

fn cast<R: lsp_types::request::Request>(req: Request) -> Result<R::Params, String> {
    match req.extract::<R::Params>(R::METHOD) {
        Ok((_, params)) => Ok(params),
        Err(ExtractError::JsonError { error, .. }) => Err(error.to_string()),
        Err(ExtractError::MethodMismatch(r)) => Err(format!("unexpected {}", r.method)),
    }
}

fn to_lsp_diagnostic(file: &SourceFile, d: &Diagnostic) -> lsp_types::Diagnostic {
    let mut message = d.message.clone();
    if let Some(label) = d.labels.first().filter(|l| !l.message.is_empty()) {
        message.push_str(&format!(" ({})", label.message));
    }
    if let Some(hint) = &d.hint {
        message.push_str(&format!("\nhelp: {hint}"));
    }
    lsp_types::Diagnostic {
        range: range(file, d.span()),
        severity: Some(match d.severity {
            Severity::Error => DiagnosticSeverity::ERROR,
            Severity::Warning => DiagnosticSeverity::WARNING,
        }),
        code: Some(NumberOrString::String(d.code.to_string())),
        source: Some("flick".to_string()),
        message,
        ..lsp_types::Diagnostic::default()
    }
}

/// A byte offset as the protocol's position: a line, and a column in
/// UTF-16 code units (what LSP clients count by default).
fn position(file: &SourceFile, offset: u32) -> Position {
    let text = &file.text;
    let offset = (offset as usize).min(text.len());
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = text[..line_start].matches('\n').count();
    let col: usize = text[line_start..offset].chars().map(char::len_utf16).sum();
    Position::new(line as u32, col as u32)
}

fn range(file: &SourceFile, span: Span) -> Range {
    Range::new(position(file, span.start), position(file, span.end))
}

/// The byte offset of a protocol position, if it is inside the text.
fn offset(file: &SourceFile, pos: Position) -> Option<u32> {
    let text = &file.text;
    let mut line_start = 0;
    for _ in 0..pos.line {
        line_start += text[line_start..].find('\n')? + 1;
    }
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    let mut units = 0;
    for (i, c) in text[line_start..line_end].char_indices() {
        if units >= pos.character as usize {
            return Some((line_start + i) as u32);
        }
        units += c.len_utf16();
    }
    Some(line_end as u32)
}
