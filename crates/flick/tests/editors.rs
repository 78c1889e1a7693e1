//! `editors/vscode` kept in step with the language: its TextMate grammar
//! highlights every reserved word and built-in, it claims `.flick` files,
//! and the extension starts the server as `flick lsp`.

use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../editors/vscode");

fn json(path: &str) -> Value {
    let text = std::fs::read_to_string(format!("{DIR}/{path}")).expect(path);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `match` pattern of the grammar, joined.
fn patterns(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if k == "match" {
                    out.push_str(v.as_str().unwrap());
                    out.push('\n');
                } else {
                    patterns(v, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| patterns(v, out)),
        _ => {}
    }
}

/// The words of the grammar's `\b(a|b|c)\b` alternatives.
fn words(all: &str) -> Vec<String> {
    all.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_grammar_highlights_every_reserved_word_and_builtin() {
    let grammar = json("syntaxes/flick.tmLanguage.json");
    assert_eq!(grammar["scopeName"], "source.flick");
    let mut all = String::new();
    patterns(&grammar, &mut all);
    let words = words(&all);
    for w in flick_syntax::KEYWORDS
        .iter()
        .filter(|w| !matches!(**w, "while" | "for" | "loop"))
    {
        assert!(
            words.iter().any(|x| x == w),
            "keyword `{w}` not highlighted"
        );
    }
    for b in flick_check::builtins::BUILTINS {
        assert!(
            words.iter().any(|x| x == b),
            "built-in `{b}` not highlighted"
        );
    }
    // The repository entries it includes all exist.
    for p in grammar["patterns"].as_array().unwrap() {
        let name = p["include"].as_str().unwrap().trim_start_matches('#');
        assert!(grammar["repository"].get(name).is_some(), "{name}");
    }
}

#[test]
fn the_extension_claims_flick_files_and_starts_flick_lsp() {
    let pkg = json("package.json");
    let lang = &pkg["contributes"]["languages"][0];
    assert_eq!(lang["id"], "flick");
    assert_eq!(lang["extensions"][0], ".flick");
    let config = lang["configuration"].as_str().unwrap();
    json(config);
    let grammar = &pkg["contributes"]["grammars"][0];
    assert_eq!(grammar["scopeName"], "source.flick");
    json(grammar["path"].as_str().unwrap());
    let main = std::fs::read_to_string(format!("{DIR}/{}", pkg["main"].as_str().unwrap())).unwrap();
    assert!(main.contains("args: [\"lsp\"]"), "{main}");
    assert_eq!(
        pkg["contributes"]["configuration"]["properties"]["flick.server.path"]["default"],
        "flick"
    );
}
