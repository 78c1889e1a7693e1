#!/usr/bin/env python3
"""Drives `flick lsp` with pygls's LanguageClient, the LSP client library
of the Python ecosystem: initialize, open a program with an error and wait
for its diagnostic, then hover, go to definition and format, and shut
down. Usage: client.py FLICK_BINARY. Exits non-zero on any wrong answer.
"""
import asyncio
import sys

from lsprotocol import types as t
from pygls.lsp.client import LanguageClient

GOOD = (
    "type cmd: record\n  key : string\n\n"
    "proc P: (cmd/cmd client, [cmd/cmd] backends)\n  | backends => client\n  | client => route(backends)\n\n"
    "fun route: ([-/cmd] backends, req: cmd) -> ()\n"
    "  let target = hash(req.key) mod len(backends)\n  req => backends[target]\n"
)
URI = "file:///tmp/flick-pygls/p.flick"


async def main(flick):
    client = LanguageClient("flick-interop", "1")
    diagnostics = asyncio.Queue()

    @client.feature(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def published(params):
        diagnostics.put_nowait(params)

    await client.start_io(flick, "lsp")
    init = await client.initialize_async(
        t.InitializeParams(capabilities=t.ClientCapabilities(), process_id=None, root_uri=None))
    caps = init.capabilities
    assert caps.hover_provider and caps.definition_provider and caps.document_formatting_provider, caps
    client.initialized(t.InitializedParams())

    bad = GOOD.replace("req => backends[target]", "req => nowhere").replace(
        "| backends => client", "backends=>client")
    client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=URI, language_id="flick", version=1, text=bad)))
    got = await asyncio.wait_for(diagnostics.get(), 20)
    assert len(got.diagnostics) == 1, got
    d = got.diagnostics[0]
    assert "nowhere" in d.message and d.severity == t.DiagnosticSeverity.Error, d
    assert (d.range.start.line, d.range.start.character) == (9, 9), d.range

    hover = await client.text_document_hover_async(t.HoverParams(
        text_document=t.TextDocumentIdentifier(uri=URI), position=t.Position(line=5, character=15)))
    assert "fun route: ([-/cmd] backends, req: cmd) -> ()" in hover.contents.value, hover

    loc = await client.text_document_definition_async(t.DefinitionParams(
        text_document=t.TextDocumentIdentifier(uri=URI), position=t.Position(line=9, character=2)))
    loc = loc[0] if isinstance(loc, list) else loc
    assert (loc.range.start.line, loc.range.start.character) == (7, 30), loc

    edits = await client.text_document_formatting_async(t.DocumentFormattingParams(
        text_document=t.TextDocumentIdentifier(uri=URI),
        options=t.FormattingOptions(tab_size=2, insert_spaces=True)))
    assert len(edits) == 1 and "  | backends => client\n" in edits[0].new_text, edits

    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    print("pygls client: diagnostics, hover, definition and formatting as expected")


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(sys.argv[1]), 60))
