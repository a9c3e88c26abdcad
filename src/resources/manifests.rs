//! Kubernetes manifests as text: a YAML or JSON stream cut into documents, each document an
//! object or a list of them.
//!
//! Pure: text in, objects and per-document errors out, so that one bad document costs only
//! itself. YAML documents are cut apart here rather than by the parser, to name the one that
//! fails (1-based, with the line in the whole text) and still read the others. JSON is
//! recognised by its first character (`{` or `[`) and may be a stream of concatenated values,
//! as `kubectl get -o json` piped together gives.

use std::fmt;

use serde_json::{Map, Value};

/// The objects read from one text, in order, and what could not be read.
#[derive(Debug, Default)]
pub struct Manifests {
    pub objects: Vec<Value>,
    pub errors: Vec<DocumentError>,
    /// What was read all the same, as kubectl reads it: a repeated mapping key.
    pub warnings: Vec<DocumentError>,
}

/// A document (or one item of a list document) that is not a readable Kubernetes object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentError {
    /// 1-based index of the document in its text.
    pub document: usize,
    /// 1-based index in the list's `items`, when the problem is one item of a list.
    pub item: Option<usize>,
    /// 1-based line (and column) in the whole text, when known.
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

impl fmt::Display for DocumentError {
    /// `document 2, item 3 (line 14, column 5): message`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(item) = self.item {
            write!(f, ", item {item}")?;
        }
        match (self.line, self.column) {
            (Some(line), Some(column)) => write!(f, " (line {line}, column {column})")?,
            (Some(line), None) => write!(f, " (line {line})")?,
            _ => {}
        }
        write!(f, ": {}", self.message)
    }
}

/// Reads every document of `text`: YAML (`---` between documents) or JSON (one value or
/// several concatenated). Empty documents are skipped; a `List` (or any `*List` with `items`)
/// stands for its items.
pub fn parse(text: &str) -> Manifests {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut out = Manifests::default();
    let looks_like_json = matches!(text.trim_start().as_bytes().first(), Some(b'{' | b'['));
    // A flow-style YAML document (`{kind: Pod, ...}`) also starts with `{`: when not even the
    // first value is JSON, the text is read as YAML instead.
    if !(looks_like_json && parse_json(text, &mut out)) {
        parse_yaml(text, &mut out);
    }
    out
}

// ---- JSON ----

/// Returns false, having added nothing, when the first value is not JSON.
fn parse_json(text: &str, out: &mut Manifests) -> bool {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let mut document = 0;
    let mut lines = LineCounter::new(text);
    loop {
        let start = stream.byte_offset();
        match stream.next() {
            None => return true,
            Some(Ok(value)) => {
                document += 1;
                let skipped = text[start..].len() - text[start..].trim_start().len();
                let line = lines.line_at(start + skipped);
                add_document(value, document, line, out);
            }
            Some(Err(_)) if document == 0 => return false,
            Some(Err(e)) => {
                // The stream cannot resynchronise after a syntax error: the rest is lost.
                let (line, column) = (e.line(), e.column());
                out.errors.push(DocumentError {
                    document: document + 1,
                    item: None,
                    line: (line > 0).then_some(line),
                    column: (column > 0).then_some(column),
                    message: strip_suffix(
                        e.to_string(),
                        &format!(" at line {line} column {column}"),
                    ),
                });
                return true;
            }
        }
    }
}

// ---- YAML ----

/// One YAML document's text, cut at `---` and `...` lines.
struct Chunk<'a> {
    text: &'a str,
    /// 1-based line of the chunk's first line in the whole text.
    first_line: usize,
    /// Started by a `---` line: a document even when empty. Without one, the text before the
    /// first `---` (or after a `...`) is a document only if it has content.
    explicit: bool,
}

/// `---`, or `---` followed by a space or tab and (possibly) the document's content.
fn is_document_start(line: &str) -> bool {
    line.strip_prefix("---")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

fn is_document_end(line: &str) -> bool {
    line.strip_prefix("...")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

/// Cuts a YAML stream into documents. A `---` or `...` at the start of a line is always a
/// document marker in YAML: not even a block scalar may contain one at column 0.
fn split_yaml(text: &str) -> Vec<Chunk<'_>> {
    let mut chunks = Vec::new();
    let (mut start, mut first_line, mut explicit) = (0, 1, false);
    let mut offset = 0;
    for (index, raw) in text.split_inclusive('\n').enumerate() {
        let line = raw.trim_end_matches(['\n', '\r']);
        let number = index + 1;
        if is_document_start(line) {
            push_chunk(&mut chunks, &text[start..offset], first_line, explicit);
            (start, first_line, explicit) = (offset, number, true);
        } else if is_document_end(line) {
            let end = offset + raw.len();
            push_chunk(&mut chunks, &text[start..end], first_line, explicit);
            (start, first_line, explicit) = (end, number + 1, false);
        }
        offset += raw.len();
    }
    push_chunk(&mut chunks, &text[start..], first_line, explicit);
    chunks
}

fn push_chunk<'a>(chunks: &mut Vec<Chunk<'a>>, text: &'a str, first_line: usize, explicit: bool) {
    if explicit || first_content_line(text, false).is_some() {
        chunks.push(Chunk {
            text,
            first_line,
            explicit,
        });
    }
}

/// 0-based index of the first line with content (not blank, a comment, a directive or a
/// marker), or None for an empty document.
fn first_content_line(text: &str, explicit: bool) -> Option<usize> {
    text.lines().enumerate().position(|(i, line)| {
        let line = if explicit && i == 0 {
            // Content may follow the marker on its line: `--- !tag` or `--- {a: 1}`.
            line.get(3..).unwrap_or("")
        } else {
            line
        };
        let line = line.trim();
        !(line.is_empty()
            || line.starts_with('#')
            || line.starts_with('%')
            || is_document_end(line))
    })
}

fn parse_yaml(text: &str, out: &mut Manifests) {
    for (index, chunk) in split_yaml(text).iter().enumerate() {
        let document = index + 1;
        let Some(content) = first_content_line(chunk.text, chunk.explicit) else {
            continue;
        };
        let content_line = chunk.first_line + content;
        let strict =
            serde_saphyr::from_str_with_options::<Value>(chunk.text, yaml_options(chunk.text));
        match strict {
            Ok(value) => add_document(value, document, content_line, out),
            // kubectl and Argo CD read a repeated key, the later value winning (kubectl warns):
            // so does envlens, with a warning naming the first repeated key.
            Err(e)
                if matches!(
                    e.without_snippet(),
                    serde_saphyr::Error::DuplicateMappingKey { .. }
                ) =>
            {
                let mut options = yaml_options(chunk.text);
                options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::LastWins;
                match serde_saphyr::from_str_with_options::<Value>(chunk.text, options) {
                    Ok(value) => {
                        let mut warning = document_error(&e, chunk, document, content_line);
                        warning.message.push_str("; the later value is used");
                        out.warnings.push(warning);
                        add_document(value, document, content_line, out);
                    }
                    Err(e) => out
                        .errors
                        .push(document_error(&e, chunk, document, content_line)),
                }
            }
            Err(e) => out
                .errors
                .push(document_error(&e, chunk, document, content_line)),
        }
    }
}

/// The parser's error, located in the whole text and rid of the parser's own phrasing.
fn document_error(
    e: &serde_saphyr::Error,
    chunk: &Chunk,
    document: usize,
    content_line: usize,
) -> DocumentError {
    let location = e.location().filter(|l| l.line() > 0);
    let plain = e.render_with_options(serde_saphyr::render_options! {
        snippets: serde_saphyr::SnippetMode::Off,
    });
    let message = match location {
        Some(l) => strip_suffix(
            plain,
            &format!(" at line {}, column {}", l.line(), l.column()),
        ),
        None => plain,
    };
    // A hint for the parser's programmer, not for whoever wrote the manifest.
    let message = strip_suffix(message, ", set DuplicateKeyPolicy in Options if acceptable");
    DocumentError {
        document,
        item: None,
        line: Some(location.map_or(content_line, |l| chunk.first_line + l.line() as usize - 1)),
        column: location.map(|l| l.column() as usize),
        message,
    }
}

/// The parser's defaults stop at 250,000 nodes, about a thousand Pods in one
/// `kubectl get -o yaml` list. Every node takes at least a byte of input, so a budget of the
/// input's size still stops amplification (aliases keep their own limits) without refusing a
/// big cluster's listing.
fn yaml_options(text: &str) -> serde_saphyr::Options {
    let defaults = serde_saphyr::Budget::default();
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_nodes: defaults.max_nodes.max(text.len()),
            max_events: defaults.max_events.max(text.len().saturating_mul(2)),
        },
    }
}

// ---- documents to objects ----

fn add_document(value: Value, document: usize, line: usize, out: &mut Manifests) {
    // `~`, `null` or only comments: nothing to read.
    if !value.is_null() {
        add_object(value, document, None, line, out);
    }
}

/// Adds `value` as an object, or each of its items if it is a list (lists may nest; an item's
/// problem is reported at its top-level index).
fn add_object(
    value: Value,
    document: usize,
    item: Option<usize>,
    line: usize,
    out: &mut Manifests,
) {
    let value = match value {
        Value::Object(mut object) => match list_kind(&object) {
            Some((item_kind, api_version)) => {
                let items = match object.remove("items") {
                    Some(Value::Array(items)) => items,
                    _ => Vec::new(),
                };
                for (i, entry) in items.into_iter().enumerate() {
                    let entry = with_list_defaults(entry, &item_kind, api_version.as_deref());
                    add_object(entry, document, item.or(Some(i + 1)), line, out);
                }
                return;
            }
            None => Value::Object(object),
        },
        other => other,
    };
    match object_problem(&value) {
        None => out.objects.push(value),
        Some(message) => out.errors.push(DocumentError {
            document,
            item,
            line: Some(line),
            column: None,
            message,
        }),
    }
}

/// The item kind and apiVersion when `object` is a list: `kind: List` (kubectl's generic
/// list), or a typed `<Kind>List` with `items` as the API server answers a list request.
fn list_kind(object: &Map<String, Value>) -> Option<(String, Option<String>)> {
    let kind = object.get("kind")?.as_str()?;
    let item_kind = kind.strip_suffix("List")?;
    match object.get("items") {
        Some(Value::Array(_)) => {}
        None | Some(Value::Null) if kind == "List" => {}
        _ => return None,
    }
    let api_version = object.get("apiVersion").and_then(Value::as_str);
    Some((item_kind.to_string(), api_version.map(str::to_string)))
}

/// Items of a typed list (`PodList`) come without kind and apiVersion: they are the list's.
fn with_list_defaults(mut item: Value, item_kind: &str, api_version: Option<&str>) -> Value {
    if let Some(object) = item.as_object_mut().filter(|_| !item_kind.is_empty()) {
        if !object.contains_key("kind") {
            object.insert("kind".into(), item_kind.into());
            if let (false, Some(api_version)) = (object.contains_key("apiVersion"), api_version) {
                object.insert("apiVersion".into(), api_version.into());
            }
        }
    }
    item
}

/// Why `value` is not a Kubernetes object, or None when it is one.
fn object_problem(value: &Value) -> Option<String> {
    let Some(object) = value.as_object() else {
        return Some(not_a_mapping(value));
    };
    match object.get("kind") {
        Some(Value::String(kind)) if !kind.is_empty() => None,
        Some(Value::String(_)) | None | Some(Value::Null) => {
            Some("not a Kubernetes object: it has no kind".into())
        }
        Some(_) => Some("not a Kubernetes object: its kind is not a string".into()),
    }
}

fn not_a_mapping(value: &Value) -> String {
    let what = match value {
        Value::Array(_) => "a sequence",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
        Value::Object(_) => "a mapping",
    };
    format!("not a Kubernetes object: {what}, not a mapping with a kind")
}

// ---- helpers ----

fn strip_suffix(message: String, suffix: &str) -> String {
    match message.strip_suffix(suffix) {
        Some(stripped) => stripped.to_string(),
        None => message,
    }
}

/// Lines of byte offsets asked in increasing order, counted once over the text.
struct LineCounter<'a> {
    text: &'a str,
    offset: usize,
    line: usize,
}

impl<'a> LineCounter<'a> {
    fn new(text: &'a str) -> Self {
        LineCounter {
            text,
            offset: 0,
            line: 1,
        }
    }

    fn line_at(&mut self, offset: usize) -> usize {
        let offset = offset.min(self.text.len());
        if offset >= self.offset {
            self.line += bytecount(&self.text.as_bytes()[self.offset..offset]);
            self.offset = offset;
        }
        self.line
    }
}

fn bytecount(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'\n').count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kinds(m: &Manifests) -> Vec<String> {
        m.objects
            .iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or("?"),
                    o["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
            .collect()
    }

    fn errors(m: &Manifests) -> Vec<String> {
        m.errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn multi_document_yaml() {
        let text = "\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
---
apiVersion: v1
kind: Service
metadata:
  name: web
--- # a comment on the marker line
apiVersion: v1
kind: ConfigMap
metadata:
  name: cfg
data:
  script: |
    echo ---
    --- not a marker: indented
";
        let m = parse(text);
        assert_eq!(errors(&m), Vec::<String>::new());
        assert_eq!(
            kinds(&m),
            ["Deployment/web", "Service/web", "ConfigMap/cfg"]
        );
        // Numbers stay integers, as the health rules read them.
        assert_eq!(m.objects[0]["spec"]["replicas"], json!(3));
        assert_eq!(
            m.objects[2]["data"]["script"],
            json!("echo ---\n--- not a marker: indented\n")
        );
    }

    #[test]
    fn leading_marker_comments_and_empty_documents() {
        let text = "\
# generated by a chart
---
# only a comment
---
---
kind: Pod
metadata: {name: a}
...
---
~
---
kind: Pod
metadata: {name: b}
";
        let m = parse(text);
        assert!(m.errors.is_empty(), "{:?}", m.errors);
        assert_eq!(kinds(&m), ["Pod/a", "Pod/b"]);
        assert!(parse("").objects.is_empty() && parse("").errors.is_empty());
        assert!(parse("\n# nothing\n---\n").errors.is_empty());
    }

    #[test]
    fn document_end_marker_starts_a_new_document() {
        let text = "kind: Pod\nmetadata: {name: a}\n...\nkind: Pod\nmetadata: {name: b}\n";
        let m = parse(text);
        assert!(m.errors.is_empty(), "{:?}", m.errors);
        assert_eq!(kinds(&m), ["Pod/a", "Pod/b"]);
    }

    #[test]
    fn bad_document_is_named_and_the_others_still_read() {
        let text = "\
kind: Pod
metadata: {name: a}
---
kind: Pod
metadata:
  name: [unclosed
---
kind: Pod
metadata: {name: c}
";
        let m = parse(text);
        assert_eq!(kinds(&m), ["Pod/a", "Pod/c"]);
        assert_eq!(m.errors.len(), 1);
        let e = &m.errors[0];
        assert_eq!(e.document, 2);
        assert_eq!(e.item, None);
        // The line counts in the whole text, not in the document.
        let line = e.line.expect("a line");
        assert!((6..=7).contains(&line), "line {line}: {e}");
        assert!(
            e.to_string()
                .starts_with(&format!("document 2 (line {line}")),
            "{e}"
        );
        assert!(!e.message.contains("at line"), "{}", e.message);
    }

    #[test]
    fn documents_that_are_not_objects() {
        let text = "\
kind: Pod
metadata: {name: a}
---
# a mapping without kind
apiVersion: v1
metadata: {name: x}
---
- a
- list
---
just a string
---
kind: 42
";
        let m = parse(text);
        assert_eq!(kinds(&m), ["Pod/a"]);
        // A repeated key: the later value wins, as kubectl and Argo CD read it, with a warning.
        let repeated = parse("kind: Pod\nmetadata:\n  name: a\n  name: b\n");
        assert_eq!(kinds(&repeated), ["Pod/b"]);
        assert!(repeated.errors.is_empty());
        let warnings: Vec<String> = repeated.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            warnings,
            ["document 1 (line 4, column 3): duplicate mapping key: name; the later value is used"]
        );
        assert_eq!(
            errors(&m),
            [
                "document 2 (line 5): not a Kubernetes object: it has no kind",
                "document 3 (line 8): not a Kubernetes object: a sequence, not a mapping with a kind",
                "document 4 (line 11): not a Kubernetes object: a string, not a mapping with a kind",
                "document 5 (line 13): not a Kubernetes object: its kind is not a string",
            ]
        );
    }

    #[test]
    fn lists_expand_into_items() {
        let text = "\
apiVersion: v1
kind: List
metadata: {resourceVersion: \"\"}
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: web}
- apiVersion: v1
  kind: List
  items:
  - {apiVersion: v1, kind: Service, metadata: {name: nested}}
- {metadata: {name: anonymous}}
- 7
---
apiVersion: v1
kind: PodList
items:
- metadata: {name: p1}
- {apiVersion: v1, kind: Pod, metadata: {name: p2}}
---
kind: List
items: []
---
kind: List
";
        let m = parse(text);
        assert_eq!(
            kinds(&m),
            ["Deployment/web", "Service/nested", "Pod/p1", "Pod/p2"]
        );
        // A typed list's items get its kind and apiVersion.
        assert_eq!(m.objects[2]["apiVersion"], json!("v1"));
        assert_eq!(
            errors(&m),
            [
                "document 1, item 3 (line 1): not a Kubernetes object: it has no kind",
                "document 1, item 4 (line 1): not a Kubernetes object: a number, not a mapping with a kind",
            ]
        );
    }

    #[test]
    fn a_kind_ending_in_list_without_items_is_an_object() {
        let m =
            parse("apiVersion: example.com/v1\nkind: AllowList\nmetadata: {name: x}\nspec: {}\n");
        assert_eq!(kinds(&m), ["AllowList/x"]);
    }

    #[test]
    fn json_single_stream_and_list() {
        let single = parse(r#"  {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a"}}"#);
        assert_eq!(kinds(&single), ["Pod/a"]);
        let stream = parse(
            "{\"kind\": \"Pod\", \"metadata\": {\"name\": \"a\"}}\n{\"kind\": \"Pod\", \"metadata\": {\"name\": \"b\"}}{\"kind\":\"List\",\"items\":[{\"kind\":\"Pod\",\"metadata\":{\"name\":\"c\"}}]}\n",
        );
        assert!(stream.errors.is_empty(), "{:?}", stream.errors);
        assert_eq!(kinds(&stream), ["Pod/a", "Pod/b", "Pod/c"]);
        let kubectl = parse(
            r#"{
    "apiVersion": "v1",
    "items": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"}}
    ],
    "kind": "List",
    "metadata": {"resourceVersion": ""}
}
"#,
        );
        assert_eq!(kinds(&kubectl), ["Deployment/web"]);
    }

    #[test]
    fn json_errors_name_the_document_and_line() {
        let text = "{\"kind\": \"Pod\", \"metadata\": {\"name\": \"a\"}}\n\n[1, 2]\n{\"kind\": \"Pod\",\n \"metadata\": }\n";
        let m = parse(text);
        assert_eq!(kinds(&m), ["Pod/a"]);
        assert_eq!(m.errors.len(), 2, "{:?}", m.errors);
        assert_eq!(
            m.errors[0].to_string(),
            "document 2 (line 3): not a Kubernetes object: a sequence, not a mapping with a kind"
        );
        let e = &m.errors[1];
        assert_eq!((e.document, e.line), (3, Some(5)), "{e}");
        assert!(
            e.to_string().starts_with("document 3 (line 5, column "),
            "{e}"
        );
        assert!(!e.message.contains("at line"), "{}", e.message);
    }

    #[test]
    fn flow_yaml_that_is_not_json_is_read_as_yaml() {
        let m = parse("{kind: Pod, metadata: {name: a}}\n---\n{kind: Pod, metadata: {name: b}}\n");
        assert!(m.errors.is_empty(), "{:?}", m.errors);
        assert_eq!(kinds(&m), ["Pod/a", "Pod/b"]);
    }

    #[test]
    fn windows_line_endings_and_byte_order_mark() {
        let m = parse("\u{feff}kind: Pod\r\nmetadata: {name: a}\r\n---\r\nkind: Pod\r\nmetadata: {name: b}\r\n");
        assert!(m.errors.is_empty(), "{:?}", m.errors);
        assert_eq!(kinds(&m), ["Pod/a", "Pod/b"]);
    }

    #[test]
    fn a_large_list_is_not_refused() {
        // ~40 nodes per item: over the parser's default budget of 250,000 nodes.
        let mut text = String::from("apiVersion: v1\nkind: List\nitems:\n");
        for i in 0..8_000 {
            text.push_str(&format!(
                "- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: p{i}\n    namespace: default\n    labels: {{a: b, c: d, e: f}}\n  spec:\n    containers:\n    - name: app\n      image: nginx\n      ports: [{{containerPort: 80}}, {{containerPort: 81}}]\n  status:\n    phase: Running\n    conditions:\n    - {{type: Ready, status: \"True\"}}\n    - {{type: PodScheduled, status: \"True\"}}\n    containerStatuses:\n    - {{name: app, ready: true, restartCount: 0, state: {{running: {{startedAt: x}}}}}}\n"
            ));
        }
        let m = parse(&text);
        assert!(m.errors.is_empty(), "{:?}", m.errors.first());
        assert_eq!(m.objects.len(), 8_000);
    }
}
