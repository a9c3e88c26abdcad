//! A JSON body extractor whose rejections use envlens' error format: 400 for bytes that are
//! not JSON (bytes after the value included), 422 naming the field for JSON of the wrong shape
//! or a string PostgreSQL cannot store, 413 over the body limit.

use axum::body::Bytes;
use axum::extract::{FromRef, FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::config::Limits;
use crate::error::Error;

/// A body that is a JSON object, read into `T`.
pub struct Json<T>(pub T);

/// A body that is a JSON array (as GitLab's REST API answers a list), read into `Vec<T>`.
pub struct JsonList<T>(pub Vec<T>);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonList<T>
where
    Limits: FromRef<S>,
{
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let body = read_body(req, Limits::from_ref(state).body_limit).await?;
        parse_list(&body).map(JsonList)
    }
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Json<T>
where
    Limits: FromRef<S>,
{
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let body = read_body(req, Limits::from_ref(state).body_limit).await?;
        parse(&body).map(Json)
    }
}

/// The whole body, within the body limit (`DefaultBodyLimit`, set from `--body-limit`).
pub async fn read_body(req: Request, limit: usize) -> Result<Bytes, Error> {
    Bytes::from_request(req, &()).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::PayloadTooLarge { limit }
        } else {
            Error::BadRequest(rejection.body_text())
        }
    })
}

/// Parses a request body, a JSON object, in this order: bytes that are not one JSON value
/// (trailing bytes included) are 400, whatever comes first in them; then a value that is not an
/// object, a string with a NUL anywhere (a key too: PostgreSQL stores no NUL in `text` or
/// `jsonb`, and GitLab, on PostgreSQL too, never sends one), and a field of the wrong shape
/// are 422 naming the field.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Error> {
    parse_shape(body, Shape::Object)
}

/// Parses a request body that is a JSON array of `T`, with [`parse`]'s order of refusals.
pub fn parse_list<T: DeserializeOwned>(body: &[u8]) -> Result<Vec<T>, Error> {
    parse_shape(body, Shape::Array)
}

/// The JSON value a body must be: serde reads a struct from an array too, so the shape is
/// checked before the fields (`[]` to an endpoint that takes an object is a 422).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Object,
    Array,
}

fn parse_shape<T: DeserializeOwned>(body: &[u8], shape: Shape) -> Result<T, Error> {
    if let Some(value) = parse_well_formed(body, shape) {
        return Ok(value);
    }
    // One pass that allocates nothing, so that malformed JSON is 400 before any field is judged.
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map_err(|e| Error::BadRequest(format!("malformed JSON: {e}")))?;
    let (opening, what) = match shape {
        Shape::Object => (b'{', "the body must be a JSON object"),
        Shape::Array => (b'[', "the body must be a JSON array"),
    };
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&opening) {
        return Err(Error::invalid("", what));
    }
    if let Some(field) = nul_field(body) {
        return Err(Error::invalid(
            field,
            "must not contain the NUL character (\\u0000): it cannot be stored",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| shape_error(e, ""))
}

/// A body that [`parse_shape`] takes, read in one pass: its shape first, no NUL escape, then
/// `T` read by serde_json alone, with nothing after it. `None` for anything else, which the
/// passes of `parse_shape` then refuse in their order, with the field's path: reading `T`
/// through `serde_path_to_error` cost two thirds of a deployment creation's parse, the pass
/// for malformed JSON another fifth, and a body that reads as `T` to its end is well-formed
/// JSON (serde_json reads every byte of the value, what `T` ignores as the well-formedness
/// pass does, what it keeps more strictly).
fn parse_well_formed<T: DeserializeOwned>(body: &[u8], shape: Shape) -> Option<T> {
    let opening = match shape {
        Shape::Object => b'{',
        Shape::Array => b'[',
    };
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&opening) || nul_escaped(body) {
        return None;
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = T::deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(value)
}

/// Whether the body holds a NUL's escape, `\u0000` (not an escaped backslash before `u0000`).
fn nul_escaped(body: &[u8]) -> bool {
    const ESCAPE: &[u8] = b"\\u0000";
    // Most bodies have no backslash at all: one quick scan.
    if !body.contains(&b'\\') {
        return false;
    }
    body.windows(ESCAPE.len()).enumerate().any(|(i, w)| {
        // `\\u0000` is an escaped backslash and the text `u0000`: a NUL's escape starts an
        // odd run of backslashes.
        w == ESCAPE && body[..i].iter().rev().take_while(|b| **b == b'\\').count() % 2 == 0
    })
}

/// The path of the first string (or key) holding a NUL in a well-formed JSON body. In JSON a
/// NUL can only be written `\u0000` (a raw one is malformed), so the bytes are scanned for
/// that escape first and the body read as a tree only when one is there.
fn nul_field(body: &[u8]) -> Option<String> {
    if !nul_escaped(body) {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    nul_path(&value, String::new())
}

fn nul_path(value: &serde_json::Value, path: String) -> Option<String> {
    use serde_json::Value;
    match value {
        Value::String(s) if s.contains('\0') => Some(path),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_path(item, format!("{path}[{i}]"))),
        Value::Object(fields) => fields.iter().find_map(|(key, item)| {
            let field = match path.as_str() {
                "" => key.replace('\0', "\\u0000"),
                _ => format!("{path}.{}", key.replace('\0', "\\u0000")),
            };
            if key.contains('\0') {
                Some(field)
            } else {
                nul_path(item, field)
            }
        }),
        _ => None,
    }
}

/// Reads a part of an already parsed body; errors name fields below `prefix` (e.g. `agent_config`).
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value, prefix: &str) -> Result<T, Error> {
    serde_path_to_error::deserialize(value).map_err(|e| shape_error(e, prefix))
}

fn shape_error(e: serde_path_to_error::Error<serde_json::Error>, prefix: &str) -> Error {
    let path = match (prefix, e.path().to_string()) {
        (p, path) if path == "." => p.to_owned(),
        ("", path) => path,
        (p, path) if path.starts_with('[') => format!("{p}{path}"),
        (p, path) => format!("{p}.{path}"),
    };
    let inner = e.into_inner();
    if !inner.is_data() {
        return Error::BadRequest(format!("malformed JSON: {inner}"));
    }
    let message = strip_position(&inner.to_string());
    // serde names a missing field in the message, at the path of the object that lacks it (an
    // unknown field's path names the field itself).
    let field = match missing_field(&message) {
        Some(name) if path.is_empty() => name.to_owned(),
        Some(name) => format!("{path}.{name}"),
        None => path,
    };
    Error::invalid(field, message)
}

fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.strip_suffix('`')
}

/// serde_json appends " at line L column C", which says nothing to a caller that sent one line.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Outer {
        items: Vec<Inner>,
    }
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        id: i64,
        name: String,
    }

    #[test]
    fn lists_are_arrays_and_objects_are_objects() {
        let list: Vec<Inner> = parse_shape(br#"[{"id": 1, "name": "a"}]"#, Shape::Array).unwrap();
        assert_eq!(list.len(), 1);
        let refused = parse_shape::<Vec<Inner>>(br#"{"id": 1}"#, Shape::Array).unwrap_err();
        assert!(matches!(refused, Error::Invalid { .. }), "{refused:?}");
        let refused = parse::<Outer>(b"[]").unwrap_err();
        assert!(matches!(refused, Error::Invalid { .. }), "{refused:?}");
    }

    fn field_of(body: &str) -> (u16, String) {
        match parse::<Outer>(body.as_bytes()).unwrap_err() {
            Error::Invalid { field, .. } => (422, field),
            Error::BadRequest(_) => (400, String::new()),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn names_the_field_at_fault() {
        assert_eq!(
            field_of(r#"{"items": [{"id": 1, "name": "a"}, {"id": "x", "name": "b"}]}"#),
            (422, "items[1].id".into())
        );
        assert_eq!(
            field_of(r#"{"items": [{"id": 1}]}"#),
            (422, "items[0].name".into())
        );
        assert_eq!(field_of(r#"{}"#), (422, "items".into()));
        assert_eq!(field_of(r#"{"items": [}"#), (400, String::new()));
        assert_eq!(field_of(""), (400, String::new()));
        assert_eq!(field_of(r#"{"items": []} x"#), (400, String::new()));
        assert_eq!(field_of(r#"{"items": []}{}"#), (400, String::new()));
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct Kept {
        id: i64,
        name: String,
        #[serde(default)]
        tags: Vec<String>,
    }

    #[test]
    fn the_one_pass_reads_what_the_checked_passes_read_and_leaves_the_rest_to_them() {
        for body in [
            r#"{"id": 1, "name": "a"}"#,
            " \n{\"name\": \"\\u00e9t\\u00e9 \\\\u0000\", \"id\": -7, \"ignored\": {\"x\": [1, 2.5e3, null, true]}}\t",
            r#"{"id": 9, "name": "\"q\"", "tags": ["x", "y"]}"#,
        ] {
            let one: Kept = parse_well_formed(body.as_bytes(), Shape::Object).expect(body);
            let de = &mut serde_json::Deserializer::from_slice(body.as_bytes());
            let checked: Kept = serde_path_to_error::deserialize(de).unwrap();
            assert_eq!(one, checked, "{body}");
        }
        // Each of these is refused by a pass of `parse_shape`: never decided by the one pass.
        for body in [
            r#"[{"id": 1, "name": "a"}]"#,
            r#"{"id": 1, "name": "a\u0000"}"#,
            r#"{"id": 1, "name": "a"} x"#,
            r#"{"id": "1", "name": "a"}"#,
            r#"{"id": 1, "name": "a", "id": 2}"#,
            r#"{"id": 1, "name": "\ud800"}"#,
        ] {
            assert!(
                parse_well_formed::<Kept>(body.as_bytes(), Shape::Object).is_none(),
                "{body}"
            );
        }
        // A lone surrogate where `T` ignores it is well-formed for both.
        let lone = br#"{"id": 1, "name": "a", "note": "\ud800"}"#;
        assert!(parse_well_formed::<Kept>(lone, Shape::Object).is_some());
        assert!(serde_json::from_slice::<serde::de::IgnoredAny>(lone).is_ok());
    }

    #[test]
    fn white_space_after_the_value_is_fine() {
        assert!(parse::<Outer>(b"{\"items\": []}\n \t").is_ok());
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Strict {
        section: StrictInner,
    }
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct StrictInner {
        known: Option<i64>,
    }

    #[test]
    fn names_an_unknown_field() {
        match parse::<Strict>(br#"{"section": {"known": 1, "dashbord": {}}}"#).unwrap_err() {
            Error::Invalid { field, message } => {
                assert_eq!(field, "section.dashbord");
                assert!(message.starts_with("unknown field `dashbord`"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn malformed_is_400_whatever_comes_first() {
        for body in [
            r#"{"items": []} garbage"#,
            r#"{"items": []}{}"#,
            r#"{"items": [{"id": "x", "name": "a"}]} x"#,
            r#"{"items": "wrong", "more": [}"#,
            r#"[] x"#,
        ] {
            assert_eq!(field_of(body), (400, String::new()), "{body}");
        }
        assert!(parse::<Outer>(b"{\"items\": []} \n\t ").is_ok());
    }

    #[test]
    fn the_body_is_an_object() {
        assert_eq!(field_of("[]"), (422, String::new()));
        assert_eq!(field_of(" [{\"id\": 1}]"), (422, String::new()));
        assert_eq!(field_of("\"items\""), (422, String::new()));
        assert_eq!(field_of("null"), (422, String::new()));
    }

    #[test]
    fn a_nul_anywhere_is_422_naming_its_field() {
        assert_eq!(
            field_of(r#"{"items": [{"id": 1, "name": "a"}, {"id": 2, "name": "b\u0000"}]}"#),
            (422, "items[1].name".into())
        );
        assert_eq!(
            field_of(r#"{"items": [], "other": {"deep": ["\u0000"]}}"#),
            (422, "other.deep[0]".into())
        );
        assert_eq!(
            field_of(r#"{"items": [], "k\u0000ey": 1}"#),
            (422, "k\\u0000ey".into())
        );
        // An escaped backslash before `u0000` is text, not a NUL.
        assert!(parse::<Outer>(br#"{"items": [{"id": 1, "name": "a\\u0000"}]}"#).is_ok());
        assert_eq!(
            field_of(r#"{"items": [{"id": 1, "name": "a\\\u0000"}]}"#),
            (422, "items[0].name".into())
        );
    }
}
