//! metav1 `Status` errors and response helpers, worded like the apiserver's.

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::discovery::ResourceKind;

/// A metav1 Status failure.
#[derive(Debug)]
pub(crate) struct ApiError {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub(crate) fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// Unknown path or resource type, worded like the apiserver's.
    pub(crate) fn no_such_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    pub(crate) fn not_found(kind: &ResourceKind, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", kind.group_resource()),
        )
        .with_details(details(kind, name))
    }

    pub(crate) fn already_exists(kind: &ResourceKind, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", kind.group_resource()),
        )
        .with_details(details(kind, name))
    }

    pub(crate) fn conflict(kind: &ResourceKind, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                kind.group_resource()
            ),
        )
        .with_details(details(kind, name))
    }

    pub(crate) fn invalid(kind: &ResourceKind, name: &str, field_error: &str) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {field_error}", kind.kind),
        )
        .with_details(details(kind, name))
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.code, &self.status())
    }
}

pub(crate) fn details(kind: &ResourceKind, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": kind.plural});
    if !kind.group.is_empty() {
        d["group"] = json!(kind.group);
    }
    d
}

pub(crate) fn json_response(code: u16, v: &Value) -> Response {
    bytes_response(
        code,
        "application/json",
        serde_json::to_vec(v).unwrap_or_default(),
    )
}

pub(crate) fn bytes_response(code: u16, content_type: &str, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}
