//! A JSON body extractor whose rejections use envlens' error format: 400 for bytes that are
//! not JSON, 422 naming the field for JSON of the wrong shape, 413 over the body limit.

use axum::body::Bytes;
use axum::extract::{FromRef, FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::config::Limits;
use crate::error::Error;

pub struct Json<T>(pub T);

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

/// Parses JSON, telling malformed input (400) from a field of the wrong shape (422). Bytes
/// after the JSON value (other than white space) are malformed input too.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| shape_error(e, ""))?;
    de.end()
        .map_err(|e| Error::BadRequest(format!("malformed JSON: {e}")))?;
    Ok(value)
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
}
