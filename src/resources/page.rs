//! A page of a Kubernetes list, read in one pass over its text: each item parsed as it is met,
//! its text kept beside it, and the list's `continue` token.
//!
//! Reading a page as `{"items": [&RawValue]}` and then each item's text finds every item's
//! bounds in a first scan and builds its fields in a second: two passes over every byte of the
//! page, and scanning JSON (its strings above all: some hundred per object, keys included) is
//! most of what a resource group costs beyond the wire. Here the page's top level is walked by
//! hand, and each item is parsed by `serde_json`'s stream reader, which tells where the item
//! ended: its bounds come from the parse that builds it.

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::de::{Deserializer, StrRead};

/// What one page of a list holds.
#[derive(Debug)]
pub struct Page<'a, T> {
    /// Each item, parsed, with its text as sent (valid JSON: the parse checked it).
    pub items: Vec<(T, &'a str)>,
    /// `metadata.continue`: where the next page starts, when there is one.
    pub continue_token: Option<String>,
    /// `metadata.resourceVersion`: the version a watch of the list starts from.
    pub resource_version: String,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
}

/// Reads `body`, a list (`{"metadata": {...}, "items": [...], ...}`, keys in any order), each
/// item as `T`. An `items` of `null` (which some Go versions send for an empty list) is no item.
pub fn read<'a, T: Deserialize<'a>>(body: &'a [u8]) -> serde_json::Result<Page<'a, T>> {
    // Checked once, a word at a time, so that the parser need not check each string it builds
    // (from bytes, serde_json checks the UTF-8 of every key and string it reads).
    let body = std::str::from_utf8(body).map_err(|e| {
        let at = e.valid_up_to();
        unexpected(at, "UTF-8 text")
    })?;
    let mut page = Page {
        items: Vec::new(),
        continue_token: None,
        resource_version: String::new(),
    };
    let mut at = 0;
    expect(body, &mut at, b'{')?;
    if peek(body, &mut at) == Some(b'}') {
        at += 1;
    } else {
        loop {
            let (key, _) = value::<String>(body, &mut at)?;
            expect(body, &mut at, b':')?;
            match key.as_str() {
                "items" => items(body, &mut at, &mut page.items)?,
                "metadata" => {
                    let (meta, _) = value::<Option<ListMeta>>(body, &mut at)?;
                    let meta = meta.unwrap_or_default();
                    page.continue_token = meta.continue_token;
                    page.resource_version = meta.resource_version;
                }
                _ => {
                    value::<IgnoredAny>(body, &mut at)?;
                }
            }
            match next(body, &mut at) {
                Some(b',') => continue,
                Some(b'}') => break,
                _ => return Err(unexpected(at, "`,` or `}` after a list's field")),
            }
        }
    }
    if peek(body, &mut at).is_some() {
        return Err(unexpected(at, "nothing after the list"));
    }
    Ok(page)
}

/// The elements of the array at `at` (or `null`).
fn items<'a, T: Deserialize<'a>>(
    body: &'a str,
    at: &mut usize,
    items: &mut Vec<(T, &'a str)>,
) -> serde_json::Result<()> {
    match peek(body, at) {
        Some(b'n') => {
            value::<()>(body, at)?;
            return Ok(());
        }
        Some(b'[') => *at += 1,
        _ => return Err(unexpected(*at, "the array of items")),
    }
    if peek(body, at) == Some(b']') {
        *at += 1;
        return Ok(());
    }
    loop {
        items.push(value::<T>(body, at)?);
        match next(body, at) {
            Some(b',') => continue,
            Some(b']') => return Ok(()),
            _ => return Err(unexpected(*at, "`,` or `]` after an item")),
        }
    }
}

/// The JSON value at `at` as `T`, and its text; `at` moves past it.
fn value<'a, T: Deserialize<'a>>(
    body: &'a str,
    at: &mut usize,
) -> serde_json::Result<(T, &'a str)> {
    peek(body, at);
    let start = *at;
    let mut stream = Deserializer::new(StrRead::new(&body[start..])).into_iter::<T>();
    let parsed = match stream.next() {
        Some(parsed) => parsed?,
        None => return Err(unexpected(start, "a value")),
    };
    *at = start + stream.byte_offset();
    // A value ends on an ASCII byte (a bracket, a quote, a digit or a letter of a literal), so
    // `at` is on a character boundary.
    Ok((parsed, &body[start..*at]))
}

/// The next byte that is not whitespace, left at `at`.
fn peek(body: &str, at: &mut usize) -> Option<u8> {
    while let Some(&byte) = body.as_bytes().get(*at) {
        if !matches!(byte, b' ' | b'\n' | b'\t' | b'\r') {
            return Some(byte);
        }
        *at += 1;
    }
    None
}

/// The next byte that is not whitespace, consumed.
fn next(body: &str, at: &mut usize) -> Option<u8> {
    let byte = peek(body, at)?;
    *at += 1;
    Some(byte)
}

fn expect(body: &str, at: &mut usize, wanted: u8) -> serde_json::Result<()> {
    match next(body, at) {
        Some(byte) if byte == wanted => Ok(()),
        _ => Err(unexpected(*at, &format!("`{}`", wanted as char))),
    }
}

fn unexpected(at: usize, wanted: &str) -> serde_json::Error {
    serde::de::Error::custom(format!("expected {wanted} at byte {at} of a list"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;
    use serde_json::{json, Value};

    /// What the two-pass reading (`{"items": [&RawValue]}`, then each text) gives.
    fn two_passes(body: &str) -> (Vec<Value>, Vec<String>, Option<String>) {
        #[derive(Deserialize)]
        struct List<'a> {
            #[serde(default)]
            metadata: Option<ListMeta>,
            #[serde(borrow, default)]
            items: Option<Vec<&'a RawValue>>,
        }
        let list: List = serde_json::from_str(body).unwrap();
        let items = list.items.unwrap_or_default();
        (
            items
                .iter()
                .map(|t| serde_json::from_str(t.get()).unwrap())
                .collect(),
            items.iter().map(|t| t.get().to_owned()).collect(),
            list.metadata.unwrap_or_default().continue_token,
        )
    }

    fn one_pass(body: &str) -> (Vec<Value>, Vec<String>, Option<String>) {
        let page = read::<Value>(body.as_bytes()).unwrap();
        (
            page.items.iter().map(|(v, _)| v.clone()).collect(),
            page.items.iter().map(|(_, t)| t.to_string()).collect(),
            page.continue_token,
        )
    }

    #[test]
    fn reads_what_two_passes_read() {
        let pod = json!({"metadata": {"name": "a\"b", "uid": "u1", "labels": {"é": "ü"}},
                         "spec": {"items": [{"key": "k"}], "n": [1, 2.5, -3, true, null]}});
        for body in [
            json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7", "continue": "next"},
                   "items": [pod, {}, pod]})
            .to_string(),
            // Keys in another order, whitespace everywhere, an item's text kept as sent.
            format!(
                " {{ \"items\" : [ {} , {{ \"a\" : [ ] }} ] ,\n\t\"metadata\" : {{ }} , \"kind\" : \"X\" }} ",
                serde_json::to_string_pretty(&pod).unwrap()
            ),
            r#"{"items": [], "metadata": {"continue": ""}}"#.into(),
            r#"{"items": null}"#.into(),
            r#"{"metadata": null}"#.into(),
            r#"{}"#.into(),
        ] {
            assert_eq!(one_pass(&body), two_passes(&body), "{body}");
        }
    }

    #[test]
    fn malformed_pages_are_errors_not_panics() {
        for body in [
            "",
            "[]",
            "{",
            r#"{"items": [{"a": 1},]}"#,
            r#"{"items": [{"a": 1}"#,
            r#"{"items": [{"a": }]}"#,
            r#"{"items": {}}"#,
            r#"{"items": [] "kind": "X"}"#,
            r#"{"items": []} x"#,
            r#"{"items": [], }"#,
            r#"{"metadata": {"continue": 5}}"#,
            "{\"items\": [{\"a\": \"\u{0}\"}]}",
        ] {
            assert!(read::<Value>(body.as_bytes()).is_err(), "{body:?}");
        }
        // Bytes that are not UTF-8 inside a skipped string.
        let mut body = br#"{"items": [{"a": "x"}]}"#.to_vec();
        body[18] = 0xff;
        assert!(read::<IgnoredAny>(&body).is_err());
    }
}
