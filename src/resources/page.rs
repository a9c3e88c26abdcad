//! A page of a Kubernetes list, read in one pass over its text: each item parsed as it is met,
//! its text kept beside it, and the list's `continue` token.
//!
//! Reading a page as `{"items": [&RawValue]}` and then each item's text finds every item's
//! bounds in a first scan and builds its fields in a second: two passes over every byte of the
//! page, and scanning JSON (its strings above all: some hundred per object, keys included) is
//! most of what a resource group costs beyond the wire. Here the page's top level is walked by
//! hand, and each item is parsed by `serde_json`'s stream reader, which tells where the item
//! ended: its bounds come from the parse that builds it.

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::de::{Deserializer, StrRead};
use serde_json::value::RawValue;

use super::object::{self, Object, KEPT};
use super::tree::{self, Container, Keep, TextKey, TreeBuf, Write};

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

/// A list item as the resource group keeps it, from the one parse that reads it off the page:
/// its [`KEPT`] fields, and where its `metadata.managedFields` lies in its text. The object's
/// text leaves those out ([`object::without_managed_fields`]); finding them here spares a
/// second scan of every object's text, which was a fifth of what a view parses.
#[derive(Debug)]
pub struct Item<'a> {
    view: TreeBuf,
    /// The value of `metadata.managedFields`, borrowed from the page; `None` when absent, or
    /// when `metadata` or the member is given twice (the text is then kept whole, as
    /// [`object::without_managed_fields`] keeps it).
    managed: Option<&'a str>,
}

impl<'a> Item<'a> {
    /// The object of `api_version` and `kind` (list items often lack them); `text` is the
    /// item's text as [`read`] gives it beside the item.
    pub fn into_object(self, text: &'a str, api_version: &str, kind: &str) -> Object {
        let cut = self
            .managed
            .and_then(|value| object::managed_fields_member(text, value));
        Object::from_listed(self.view, text, cut, api_version, kind)
    }
}

impl<'de> Deserialize<'de> for Item<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Item<'de>, D::Error> {
        let mut found = Found::default();
        let view = tree::capture(|| {
            Spy {
                keep: KEPT,
                depth: 0,
                found: &mut found,
            }
            .deserialize(deserializer)
        })?;
        let once = found.metadata <= 1 && found.members <= 1;
        Ok(Item {
            view,
            managed: found.managed.filter(|_| once),
        })
    }
}

/// What [`Spy`] saw on its way through an item.
#[derive(Default)]
struct Found<'de> {
    managed: Option<&'de str>,
    /// Times `metadata` was met at the top, and `managedFields` in it.
    metadata: u8,
    members: u8,
}

/// [`Keep`]'s reading, which also notes where the item's `metadata.managedFields` are: at the
/// item's top (`depth` 0) and in its `metadata` (1); below, plain [`Keep`].
struct Spy<'f, 'de> {
    keep: Keep,
    depth: u8,
    found: &'f mut Found<'de>,
}

impl<'de> DeserializeSeed<'de> for Spy<'_, 'de> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// Writes on the tree's scratch buffer as [`Write`] does ([`tree::capture`] takes it off).
impl<'de> Visitor<'de> for Spy<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut object = Container::object();
        while let Some(TextKey(key)) = map.next_key()? {
            let rule = self.keep.field(&key);
            if self.depth == 0 && key == "metadata" {
                self.found.metadata = self.found.metadata.saturating_add(1);
                let seed = Spy {
                    keep: rule.unwrap_or(Keep::Fields(&[])),
                    depth: 1,
                    found: &mut *self.found,
                };
                match rule {
                    Some(_) => {
                        let entry = object.key(&key);
                        map.next_value_seed(seed)?;
                        object.end_entry(entry);
                    }
                    None => {
                        // Read for its `managedFields`, not kept.
                        let mark = tree::mark();
                        map.next_value_seed(seed)?;
                        tree::unwrite(mark);
                    }
                }
            } else if self.depth == 1 && key == "managedFields" {
                self.found.members = self.found.members.saturating_add(1);
                let raw: &'de RawValue = map.next_value()?;
                self.found.managed = Some(raw.get());
                if let Some(rule) = rule {
                    let entry = object.key(&key);
                    rule.write(raw.get()).map_err(serde::de::Error::custom)?;
                    object.end_entry(entry);
                }
            } else {
                match rule {
                    Some(rule) => {
                        let entry = object.key(&key);
                        map.next_value_seed(Write(rule))?;
                        object.end_entry(entry);
                    }
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
        }
        object.finish().map_err(serde::de::Error::custom)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        Write(self.keep).visit_seq(seq)
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<(), E> {
        Write(self.keep).visit_bool(v)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<(), E> {
        Write(self.keep).visit_i64(v)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<(), E> {
        Write(self.keep).visit_u64(v)
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<(), E> {
        Write(self.keep).visit_f64(v)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        Write(self.keep).visit_str(v)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Write(self.keep).visit_unit()
    }
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

    /// What reading an item apart gives: its kept fields ([`Object::parse`]) and its text
    /// without `managedFields` ([`object::without_managed_fields`]).
    fn apart(text: &str, api_version: &str, kind: &str) -> Object {
        let raw = RawValue::from_string(text.to_owned()).unwrap();
        Object::parse(&raw, api_version, kind).unwrap()
    }

    #[test]
    fn items_are_read_with_their_managed_fields_cut_in_one_pass() {
        let managed = r#"[{"manager":"kubectl","fieldsV1":{"f:metadata":{"f:labels":{".":{}}}}}]"#;
        let items = [
            // Last, middle, first, only member; compact and spaced out.
            format!(r#"{{"metadata":{{"name":"a","managedFields":{managed}}},"spec":{{"replicas":2}}}}"#),
            format!(r#"{{"metadata":{{"name":"a","managedFields":{managed},"uid":"u"}},"status":{{"x":[1]}}}}"#),
            format!(r#"{{"metadata":{{"managedFields":{managed},"name":"a","labels":{{"k":"v"}}}}}}"#),
            format!(r#"{{"metadata":{{"managedFields":{managed}}},"kind":"Pod"}}"#),
            format!("{{ \"metadata\" : {{ \"name\" : \"a\" ,\n  \"managedFields\" : {managed} \n}} }}"),
            format!("{{\"metadata\": {{\"managedFields\" : {managed} ,\n \"name\": \"a\"}}}}"),
            // Left whole: none, one elsewhere than in `metadata`, an escaped key, `metadata` or
            // the member given twice, odd shapes.
            r#"{"metadata":{"name":"a"}}"#.to_string(),
            format!(r#"{{"metadata":{{"name":"a"}},"spec":{{"managedFields":{managed}}}}}"#),
            format!(r#"{{"metadata":{{"managed\u0046ields":{managed}}}}}"#),
            format!(r#"{{"metadata":{{"managedFields":{managed}}},"metadata":{{"name":"b"}}}}"#),
            format!(r#"{{"metadata":{{"managedFields":{managed},"managedFields":[]}}}}"#),
            r#"{"metadata":null,"spec":"text","status":[1,-2,3.5,true,null]}"#.to_string(),
            r#"{"apiVersion":"example.com/v2","kind":"Widget","metadata":{"labels":{"a":"b"},"name":"x","ownerReferences":[{"uid":"o","name":"n"}]}}"#.to_string(),
        ];
        let body = format!(
            r#"{{"kind":"List","metadata":{{}},"items":[{}]}}"#,
            items.join(",\n ")
        );
        let page = read::<Item>(body.as_bytes()).unwrap();
        assert_eq!(page.items.len(), items.len());
        for ((item, text), sent) in page.items.into_iter().zip(&items) {
            assert_eq!(text, sent);
            let object = item.into_object(text, "v1", "Pod");
            assert_eq!(object, apart(sent, "v1", "Pod"), "{sent}");
        }
        // Items that are no objects read as the compact tree reads them.
        let page = read::<Item>(br#"{"items":[[1,{"a":2}],"s",3,null,true]}"#).unwrap();
        for (item, text) in page.items {
            assert_eq!(
                item.into_object(text, "v1", "Pod"),
                apart(text, "v1", "Pod"),
                "{text}"
            );
        }
    }
}
