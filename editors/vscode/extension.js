// Starts `flick lsp` for .flick files: diagnostics as you type, hover,
// go to definition and formatting come from the server.
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const command = vscode.workspace.getConfiguration("flick").get("server.path", "flick");
  const server = { command, args: ["lsp"] };
  client = new LanguageClient(
    "flick",
    "Flick",
    { run: server, debug: server },
    { documentSelector: [{ scheme: "file", language: "flick" }] }
  );
  context.subscriptions.push({ dispose: () => client && client.stop() });
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
