//! `flick serve`'s API fuzzed from its own OpenAPI document: the test
//! reads docs/api/openapi.yaml, and a seeded generator makes requests from
//! each path, method, parameter and body schema it declares, valid ones and
//! mutated ones (wrong types, values out of range, bad names and escapes,
//! bodies that are not JSON or are too large, methods and paths it does not
//! declare, a missing or wrong token). Each goes to a real `serve` on a
//! loopback TCP address with a token, and each answer must be one the
//! document declares for that request: a status listed for the operation
//! (or, for a request mutated below HTTP's routing, one the document's
//! description gives), with JSON of the declared shape. The server must
//! answer every request, and still serve its API and its service at the
//! end. Bounded: a fixed number of requests, each with a timeout. Where
//! the test may open packet sockets (root), a machine that only counts
//! (`mz`, on `afpacket:lo`) is deployed too, so that a machine's state
//! paths (registers, flow contexts by key, deletes) are fuzzed as well.
//! `FLICK_FUZZ_SEED` and `FLICK_FUZZ_REQUESTS` run other requests, or more.

mod support;

use serde_json::{json, Map, Value as Json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;
use support::http::{get_answer, http_program};
use support::serve::serve;
use support::{free_port, ROOT};
use support::{xorshift, Scratch};

/// Requests made in one run.
const REQUESTS: usize = 500;
const TOKEN: &str = "fuzz-token";

/// A small reader of the YAML the OpenAPI document is written in: block
/// mappings and sequences by indentation, `|` block scalars, flow
/// mappings and sequences, quoted and plain scalars. Enough for the
/// document, and a test failure (not a wrong answer) for anything else.
mod yaml {
    use serde_json::{Map, Value as Json};

    struct Line {
        indent: usize,
        text: String,
    }

    pub fn parse(text: &str) -> Json {
        let lines: Vec<Line> = text
            .lines()
            .map(|l| {
                let t = l.trim_end();
                Line {
                    indent: t.len() - t.trim_start().len(),
                    text: t.trim_start().to_string(),
                }
            })
            .collect();
        let mut i = 0;
        skip_blank(&lines, &mut i);
        let v = block(&lines, &mut i, 0);
        skip_blank(&lines, &mut i);
        assert_eq!(i, lines.len(), "YAML not read past line {}", i + 1);
        v
    }

    fn skip_blank(lines: &[Line], i: &mut usize) {
        while *i < lines.len() && (lines[*i].text.is_empty() || lines[*i].text.starts_with('#')) {
            *i += 1;
        }
    }

    fn block(lines: &[Line], i: &mut usize, indent: usize) -> Json {
        if lines[*i].text == "-" || lines[*i].text.starts_with("- ") {
            let mut seq = Vec::new();
            while *i < lines.len() && lines[*i].indent == indent && lines[*i].text.starts_with('-')
            {
                let rest = lines[*i].text[1..].trim_start().to_string();
                if is_key_line(&rest) {
                    // A mapping whose first key shares the dash's line.
                    let mut sub: Vec<Line> = vec![Line {
                        indent: indent + 2,
                        text: rest,
                    }];
                    *i += 1;
                    while *i < lines.len()
                        && (lines[*i].text.is_empty() || lines[*i].indent > indent)
                    {
                        sub.push(Line {
                            indent: lines[*i].indent,
                            text: lines[*i].text.clone(),
                        });
                        *i += 1;
                    }
                    let mut j = 0;
                    seq.push(block(&sub, &mut j, indent + 2));
                } else {
                    seq.push(flow_or_scalar(&rest));
                    *i += 1;
                }
                skip_blank(lines, i);
            }
            return Json::Array(seq);
        }
        let mut map = Map::new();
        while *i < lines.len() && lines[*i].indent == indent {
            let (key, rest) = split_key(&lines[*i].text);
            *i += 1;
            let value = if rest.is_empty() {
                skip_blank(lines, i);
                if *i < lines.len() && lines[*i].indent > indent {
                    let deeper = lines[*i].indent;
                    block(lines, i, deeper)
                } else {
                    Json::Null
                }
            } else if rest == "|" || rest == "|-" {
                let mut text: Vec<&str> = Vec::new();
                let mut at = None;
                while *i < lines.len() && (lines[*i].text.is_empty() || lines[*i].indent > indent) {
                    let l = &lines[*i];
                    at.get_or_insert(l.indent);
                    text.push(&l.text);
                    *i += 1;
                }
                let mut s = text.join("\n").trim_end().to_string();
                if rest == "|" {
                    s.push('\n');
                }
                Json::String(s)
            } else {
                flow_or_scalar(&rest)
            };
            map.insert(key, value);
            skip_blank(lines, i);
        }
        Json::Object(map)
    }

    fn is_key_line(s: &str) -> bool {
        if s.starts_with('{') || s.starts_with('[') {
            return false;
        }
        if let Some(q) = s.strip_prefix('"') {
            let end = q.find('"').map(|e| e + 1).unwrap_or(q.len());
            return q[end..].starts_with(':');
        }
        s.ends_with(':') || s.contains(": ")
    }

    fn split_key(s: &str) -> (String, String) {
        if let Some(q) = s.strip_prefix('"') {
            let end = q.find('"').expect("a closed quote");
            let rest = q[end + 1..].strip_prefix(':').expect("a key's colon");
            return (q[..end].to_string(), rest.trim().to_string());
        }
        match s.find(": ") {
            Some(at) => (s[..at].to_string(), s[at + 2..].trim().to_string()),
            None => (
                s.strip_suffix(':')
                    .unwrap_or_else(|| panic!("not a key: {s}"))
                    .to_string(),
                String::new(),
            ),
        }
    }

    fn flow_or_scalar(s: &str) -> Json {
        if s.starts_with('{') || s.starts_with('[') || s.starts_with('"') {
            let chars: Vec<char> = s.chars().collect();
            let mut at = 0;
            let v = flow(&chars, &mut at);
            assert!(
                chars[at..].iter().all(|c| c.is_whitespace()),
                "text after a flow value: {s}"
            );
            return v;
        }
        plain(s.trim())
    }

    fn plain(s: &str) -> Json {
        match s {
            "true" => Json::Bool(true),
            "false" => Json::Bool(false),
            "null" | "~" => Json::Null,
            _ => match s.parse::<i64>() {
                Ok(n) => Json::from(n),
                Err(_) => Json::String(s.to_string()),
            },
        }
    }

    fn ws(c: &[char], at: &mut usize) {
        while *at < c.len() && c[*at].is_whitespace() {
            *at += 1;
        }
    }

    fn flow(c: &[char], at: &mut usize) -> Json {
        ws(c, at);
        match c[*at] {
            '{' => {
                *at += 1;
                let mut map = Map::new();
                loop {
                    ws(c, at);
                    if c[*at] == '}' {
                        *at += 1;
                        return Json::Object(map);
                    }
                    let key = match flow_scalar(c, at, true) {
                        Json::String(s) => s,
                        other => other.to_string(),
                    };
                    ws(c, at);
                    // A key alone (`a, b` read as YAML does) has no value.
                    let v = match c[*at] {
                        ':' => {
                            *at += 1;
                            flow(c, at)
                        }
                        _ => Json::Null,
                    };
                    map.insert(key, v);
                    ws(c, at);
                    if c[*at] == ',' {
                        *at += 1;
                    }
                }
            }
            '[' => {
                *at += 1;
                let mut seq = Vec::new();
                loop {
                    ws(c, at);
                    if c[*at] == ']' {
                        *at += 1;
                        return Json::Array(seq);
                    }
                    seq.push(flow(c, at));
                    ws(c, at);
                    if c[*at] == ',' {
                        *at += 1;
                    }
                }
            }
            _ => flow_scalar(c, at, false),
        }
    }

    fn flow_scalar(c: &[char], at: &mut usize, key: bool) -> Json {
        ws(c, at);
        if c[*at] == '"' {
            *at += 1;
            let mut s = String::new();
            while c[*at] != '"' {
                if c[*at] == '\\' {
                    *at += 1;
                    s.push(match c[*at] {
                        'n' => '\n',
                        'r' => '\r',
                        't' => '\t',
                        other => other,
                    });
                } else {
                    s.push(c[*at]);
                }
                *at += 1;
            }
            *at += 1;
            return Json::String(s);
        }
        let start = *at;
        while *at < c.len() && !matches!(c[*at], ',' | '}' | ']') && !(key && c[*at] == ':') {
            *at += 1;
        }
        plain(c[start..*at].iter().collect::<String>().trim())
    }
}

/// A seeded xorshift generator: every run makes the same requests.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        xorshift(&mut self.0)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// `$ref`s followed to what they name in the document.
fn resolve<'a>(doc: &'a Json, mut v: &'a Json) -> &'a Json {
    while let Some(r) = v.get("$ref").and_then(Json::as_str) {
        v = doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("no {r}"));
    }
    v
}

/// Whether `v` has the shape `schema` declares: types, required
/// properties, the properties' and items' shapes, one of `oneOf`.
fn conforms(doc: &Json, schema: &Json, v: &Json) -> Result<(), String> {
    let schema = resolve(doc, schema);
    if let Some(alts) = schema.get("oneOf").and_then(Json::as_array) {
        let errors: Vec<String> = alts
            .iter()
            .filter_map(|s| conforms(doc, s, v).err())
            .collect();
        return match errors.len() < alts.len() {
            true => Ok(()),
            false => Err(format!("{v} is none of oneOf: {}", errors.join("; "))),
        };
    }
    if v.is_null() && schema.get("nullable") == Some(&json!(true)) {
        return Ok(());
    }
    let ty = schema.get("type").and_then(Json::as_str);
    let ok = match ty {
        None => true,
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some(other) => return Err(format!("unknown type {other}")),
    };
    if !ok {
        return Err(format!("{v} is not of type {}", ty.unwrap_or("?")));
    }
    if let Some(obj) = v.as_object() {
        for r in schema["required"].as_array().into_iter().flatten() {
            let r = r.as_str().unwrap_or("");
            if !obj.contains_key(r) {
                return Err(format!("{v} lacks `{r}`"));
            }
        }
        if let Some(props) = schema.get("properties").and_then(Json::as_object) {
            for (k, s) in props {
                if let Some(x) = obj.get(k) {
                    conforms(doc, s, x).map_err(|e| format!("{k}: {e}"))?;
                }
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        for x in arr {
            conforms(doc, items, x)?;
        }
    }
    Ok(())
}

/// A value of `schema`'s shape, or (now and then) not.
fn generate(doc: &Json, schema: &Json, rng: &mut Rng, depth: usize) -> Json {
    let schema = resolve(doc, schema);
    if rng.chance(4) || depth > 4 {
        return wrong_value(rng);
    }
    if let Some(alts) = schema.get("oneOf").and_then(Json::as_array) {
        return generate(doc, rng.pick(alts), rng, depth + 1);
    }
    if let Some(ex) = schema.get("example") {
        if rng.chance(50) {
            return ex.clone();
        }
    }
    match schema.get("type").and_then(Json::as_str) {
        Some("object") | None if schema.get("properties").is_some() => {
            let mut m = Map::new();
            let required: Vec<&str> = schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Json::as_str)
                .collect();
            for (k, s) in schema["properties"].as_object().unwrap() {
                if required.contains(&k.as_str()) || rng.chance(60) {
                    m.insert(k.clone(), generate(doc, s, rng, depth + 1));
                }
            }
            if rng.chance(5) {
                m.insert("unexpected".into(), json!(1));
            }
            Json::Object(m)
        }
        Some("array") => {
            let n = rng.below(3);
            Json::Array(
                (0..n)
                    .map(|_| generate(doc, &schema["items"], rng, depth + 1))
                    .collect(),
            )
        }
        Some("integer") => rng
            .pick(&[json!(0), json!(1), json!(7), json!(-1), json!(1u64 << 40)])
            .clone(),
        Some("boolean") => json!(rng.chance(50)),
        Some("string") => {
            let choices = [
                "",
                "x",
                "GET /f HTTP/1.1\r\nHost: x\r\n\r\n",
                "client=127.0.0.1:0",
                "R0VUIC9mIEhUVFAvMS4xDQpIb3N0OiB4DQoNCg==",
                "\u{0}\u{7f}é",
            ];
            json!(rng.pick(&choices))
        }
        _ => wrong_value(rng),
    }
}

fn wrong_value(rng: &mut Rng) -> Json {
    rng.pick(&[
        Json::Null,
        json!(1.5),
        json!(-9_007_199_254_740_993i64),
        json!([1, "a"]),
        json!({ "value": { "nested": true } }),
        json!("é".repeat(50)),
        json!(true),
    ])
    .clone()
}

/// A machine that counts each source's frames and sends none, deployed
/// as `mz` on the loopback interface where the test may open it.
const COUNTER: &str = "grammar packet

machine mz: (packet/packet wire)
  global limit: integer := 2

  stage count:
    key ipv4.src
    capacity 64
    flow packets: integer := 0
    states seen, marked
    in seen on packet: packets := packets + 1
    in marked on packet: packets := packets + 1
";

/// The program the fuzzed requests find deployed, as `fz`.
const NOTES: &str = http_program!(
    "proc Notes: (request/simple_response client)
  global hits := 0
  global notes := empty_dict
  global counts := empty_dict
  | client => respond(hits, notes, counts, client)

fun respond: (hits: ref integer, notes: ref dict<string*request>, counts: ref dict<string*integer>, -/simple_response client, req: request) -> ()
  hits := hits + 1
  notes[req.target] := req
  counts[req.target] := hits
  simple_response(200, \"OK\", \"noted\") => client
"
);

/// How a request was mutated below the level of routing: what the
/// document's description (not the operation) says it gets.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Transport {
    Plain,
    NoToken,
    BadEscape,
    Chunked,
    TooLarge,
    ShortBody,
}

struct Answer {
    status: u16,
    content_type: String,
    body: Vec<u8>,
}

/// Sends one request and reads its whole answer.
fn send(port: u16, raw: &[u8]) -> Answer {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("the API accepts");
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = s.write_all(raw);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).expect("the API answers");
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&answer)));
    let head = String::from_utf8_lossy(&answer[..end]).to_string();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    let content_type = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Type: "))
        .unwrap_or("")
        .to_string();
    Answer {
        status,
        content_type,
        body: answer[end + 4..].to_vec(),
    }
}

/// A value for a path parameter: valid, or not.
fn path_value(name: &str, rng: &mut Rng) -> String {
    match name {
        "name" => rng
            .pick(&[
                "fz",
                "fz",
                "fz",
                "fz",
                "fz",
                "mz",
                "x",
                "nobody",
                "bad%20name",
                "a%2Fb",
                &"n".repeat(65),
                "%C3%A9",
            ])
            .to_string(),
        _ => rng
            .pick(&[
                "hits",
                "notes",
                "notes//f",
                "notes/%2Fg",
                "notes//missing",
                "hits/x",
                "nothing",
                "notes/a/b/c",
                "counts//f",
                "counts/x",
                "counts",
                "%E2%82%AC",
                "..%2F..",
                "dump",
                "table",
                "globals/limit",
                "globals/nosuch",
                "stages/count/flows/127.0.0.1",
                "stages/count/flows/127.0.0.1/registers/packets",
                "stages/count/flows/127.0.0.1/state",
                "stages/count/flows/1,2",
                "stages/count/0",
            ])
            .to_string(),
    }
}

#[test]
fn every_answer_is_one_the_openapi_document_declares() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("docs/api/openapi.yaml")).unwrap();
    let doc = yaml::parse(&text);
    assert_eq!(doc["openapi"], json!("3.0.3"));
    let paths = doc["paths"].as_object().unwrap().clone();
    assert!(paths.contains_key("/services/{name}/state/{path}"));

    let dir = Scratch::new("api-fuzz");
    let api_port = free_port();
    let api = format!("127.0.0.1:{api_port}");
    let state = dir.path("state");
    let _server = serve(
        &state,
        &["--save-every", "1", "--api", &api, "--api-token", TOKEN],
    );

    let request = |method: &str, target: &str, body: &[u8], extra: &str| -> Vec<u8> {
        let mut r = format!(
            "{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    };
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    // The service the requests find.
    let service_port = free_port();
    let deploy = json!({
        "name": "fz",
        "file": "fz.flick",
        "program": NOTES,
        "listen": [format!("client=127.0.0.1:{service_port}")],
    });
    let a = send(
        api_port,
        &request("POST", "/services", deploy.to_string().as_bytes(), &auth),
    );
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.body));
    // Not root: no packet socket, and requests to `mz` find nothing.
    let counter = json!({
        "name": "mz",
        "file": "mz.flick",
        "program": COUNTER,
        "ports": ["wire=afpacket:lo"],
    });
    let a = send(
        api_port,
        &request("POST", "/services", counter.to_string().as_bytes(), &auth),
    );
    eprintln!("the counting machine's deploy: {}", a.status);

    let methods = ["GET", "PUT", "POST", "DELETE", "PATCH"];
    // Another seed and count from the environment, to look further.
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let mut rng = Rng(env("FLICK_FUZZ_SEED").unwrap_or(0x5eed_f11c).max(1));
    let requests = env("FLICK_FUZZ_REQUESTS").map_or(REQUESTS, |n| n as usize);
    let mut seen = std::collections::BTreeMap::<(String, u16), usize>::new();
    let served = |port: u16| get_answer(port, "/end", Duration::from_secs(10)).unwrap();
    for n in 0..requests {
        // The service answers all along (its globals first set by writes
        // of the API, before any instance, in the first stretch).
        if n % 100 == 99 {
            let answer = served(service_port);
            assert!(answer.ends_with("noted"), "before request {n}: {answer:?}");
        }
        let (template, item) = {
            let keys: Vec<&String> = paths.keys().collect();
            let k = rng.pick(&keys).to_string();
            (k.clone(), paths[&k].clone())
        };
        let declared: Vec<&str> = methods
            .iter()
            .copied()
            .filter(|m| item.get(m.to_lowercase()).is_some())
            .collect();
        let method = match rng.chance(85) {
            true => *rng.pick(&declared),
            false => *rng.pick(&methods),
        };
        // The path, its parameters filled in (now and then a bad one).
        let mut target = template.clone();
        for p in ["name", "path"] {
            let v = path_value(p, &mut rng);
            target = target.replace(&format!("{{{p}}}"), &v);
        }
        // The service under test stays: undeploys go to other names.
        if method == "DELETE" && template == "/services/{name}" && target == "/services/fz" {
            target = "/services/nobody".into();
        }
        let mut unrouted = false;
        if rng.chance(4) {
            target = rng
                .pick(&[
                    "/",
                    "/nothing",
                    "/services/fz/state",
                    "/services/fz/other/x",
                ])
                .to_string();
            unrouted = true;
        }
        let op = item.get(method.to_lowercase()).cloned();
        // Query parameters the operation declares, valid or not.
        if let Some(params) = op.as_ref().and_then(|o| o["parameters"].as_array()) {
            let mut q: Vec<String> = Vec::new();
            for p in params.iter().filter(|p| p["in"] == json!("query")) {
                if rng.chance(60) {
                    let v = rng.pick(&[
                        "0",
                        "1",
                        "2",
                        "1000",
                        "1001",
                        "-1",
                        "x",
                        "99999999999999999999",
                    ]);
                    q.push(format!("{}={v}", p["name"].as_str().unwrap()));
                }
            }
            if !q.is_empty() {
                target = format!("{target}?{}", q.join("&"));
            }
        }
        // The body: of the declared schema, mutated, or none.
        let body_schema = op
            .as_ref()
            .and_then(|o| o.pointer("/requestBody/content/application~1json/schema"));
        let mut body: Vec<u8> = match body_schema {
            Some(s) if rng.chance(90) => {
                let mut v = generate(&doc, s, &mut rng, 0);
                // Now and then the program deploys: a new service on a
                // port of its own, a redeploy on the service's port.
                if v.is_object() && v.get("program").is_some() && rng.chance(30) {
                    let port = match template.as_str() {
                        "/services/{name}" => service_port,
                        _ => 0,
                    };
                    v["program"] = json!(NOTES);
                    v["listen"] = json!([format!("client=127.0.0.1:{port}")]);
                    let m = v.as_object_mut().unwrap();
                    for k in ["config", "connect", "max_instances", "unexpected"] {
                        m.remove(k);
                    }
                }
                v.to_string().into_bytes()
            }
            _ if rng.chance(10) => b"{not json".to_vec(),
            _ => Vec::new(),
        };
        let mut transport = Transport::Plain;
        let mut extra = auth.clone();
        match rng.below(40) {
            0 | 1 => {
                transport = Transport::NoToken;
                extra = rng
                    .pick(&[
                        "",
                        "Authorization: Bearer wrong\r\n",
                        "Authorization: fuzz-token\r\n",
                    ])
                    .to_string();
            }
            2 => {
                transport = Transport::BadEscape;
                // In the path: a query is decoded only where it is read.
                target = match target.split_once('?') {
                    Some((path, query)) => format!("{path}%zz?{query}"),
                    None => format!("{target}%zz"),
                };
            }
            3 => {
                transport = Transport::Chunked;
                extra.push_str("Transfer-Encoding: chunked\r\n");
            }
            4 => transport = Transport::TooLarge,
            5 => transport = Transport::ShortBody,
            _ => {}
        }
        let raw = match transport {
            Transport::TooLarge => format!(
                "{method} {target} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: {}\r\n\r\n",
                (1 << 20) + 1 + rng.below(1000)
            )
            .into_bytes(),
            Transport::ShortBody => {
                body = b"{\"value\": 1}".to_vec();
                let mut r = format!(
                    "{method} {target} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: {}\r\n\r\n",
                    body.len() + 10
                )
                .into_bytes();
                r.extend_from_slice(&body);
                r
            }
            _ => request(method, &target, &body, &extra),
        };
        let a = send(api_port, &raw);
        let shown = format!(
            "request {n}: {} -> {} {}",
            String::from_utf8_lossy(&raw[..raw.len().min(300)]),
            a.status,
            String::from_utf8_lossy(&a.body)
        );
        *seen.entry((method.to_string(), a.status)).or_default() += 1;
        // What the document allows for this request.
        let allowed: Vec<u16> = match transport {
            Transport::BadEscape | Transport::ShortBody => vec![400],
            Transport::Chunked => vec![411],
            Transport::TooLarge => vec![413],
            Transport::NoToken => vec![401],
            Transport::Plain => match (&op, unrouted) {
                (Some(op), false) => op["responses"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .map(|k| k.parse().unwrap())
                    .collect(),
                _ => vec![404, 405],
            },
        };
        assert!(allowed.contains(&a.status), "undeclared status: {shown}");
        if template == "/metrics" && a.status == 200 && transport == Transport::Plain && !unrouted {
            assert!(a.content_type.starts_with("text/plain"), "{shown}");
            continue;
        }
        assert_eq!(a.content_type, "application/json", "{shown}");
        let json: Json = serde_json::from_slice(&a.body).unwrap_or_else(|e| panic!("{e}: {shown}"));
        let declared = op
            .as_ref()
            .filter(|_| !unrouted && transport == Transport::Plain)
            .and_then(|o| o["responses"].get(a.status.to_string()))
            .map(|r| resolve(&doc, r))
            .and_then(|r| r.pointer("/content/application~1json/schema"));
        let schema = match declared {
            Some(s) => s.clone(),
            None => json!({ "$ref": "#/components/schemas/Error" }),
        };
        if let Err(e) = conforms(&doc, &schema, &json) {
            panic!("answer not of the declared shape: {e}\n{shown}");
        }
    }
    eprintln!("method and status: count {seen:?}");
    // Every kind of answer came up: successes and refusals.
    let statuses: std::collections::BTreeSet<u16> = seen.keys().map(|(_, s)| *s).collect();
    for s in [200, 400, 401, 404, 405, 411, 413, 422] {
        assert!(statuses.contains(&s), "no {s} in {seen:?}");
    }
    // Still up: the API answers and the service serves.
    let a = send(api_port, &request("GET", "/services/fz", b"", &auth));
    assert_eq!(a.status, 200);
    let a = send(api_port, &request("GET", "/services", b"", &auth));
    let status = String::from_utf8_lossy(&a.body).to_string();
    let answer = served(service_port);
    assert!(answer.ends_with("noted"), "{answer}\n{status}");
}
