//! The one error type of the HTTP layer, and how each variant is answered.
//!
//! REST answers are `{"error": {"code", "message", "field"?}}` (SPEC section 3), GraphQL
//! answers an error with `extensions.code`, and the Kubernetes proxy a `Status` object. Internal
//! errors are logged once, inside the request's span, and the client sees a generic message.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// One input field fails validation; `field` is its path in the body, e.g. `projects[2].visibility`.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("database unavailable")]
    Unavailable(#[source] sqlx::Error),
    #[error("request timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// A cluster (or another upstream) could not be reached or answered nothing usable.
    #[error("{0}")]
    BadGateway(String),
    /// GitLab, which must vouch for the request, cannot be asked now: retry later.
    #[error("{0}")]
    GitLabUnavailable(String),
    /// The agent has no cluster connection (SPEC 6): nothing was sent anywhere.
    #[error("{0}")]
    NoConnection(String),
    /// The caller has asked too much too fast: `Retry-After` says when to come back.
    #[error("{message}")]
    TooManyRequests {
        message: String,
        retry_after: std::time::Duration,
    },
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Error::BadRequest(_) => StatusCode::BAD_REQUEST,
            Error::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Error::Forbidden(_) => StatusCode::FORBIDDEN,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
            Error::Conflict(_) => StatusCode::CONFLICT,
            Error::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Error::Unavailable(_) | Error::Timeout(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Error::GitLabUnavailable(_) | Error::NoConnection(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The stable, machine-readable name of the error, `error.code` in the body.
    pub fn code(&self) -> &'static str {
        match self {
            Error::BadRequest(_) => "bad_request",
            Error::Unauthorized(_) => "unauthorized",
            Error::Forbidden(_) => "forbidden",
            Error::NotFound(_) => "not_found",
            Error::Conflict(_) => "conflict",
            Error::PayloadTooLarge { .. } => "payload_too_large",
            Error::Invalid { .. } => "invalid",
            Error::Unavailable(_) | Error::Timeout(_) | Error::GitLabUnavailable(_) => {
                "unavailable"
            }
            Error::NoConnection(_) => "no_connection",
            Error::BadGateway(_) => "bad_gateway",
            Error::TooManyRequests { .. } => "too_many_requests",
            Error::Internal(_) => "internal",
        }
    }
}

/// Database errors: a connection that cannot be had is 503 (retry later), anything else a bug.
impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        match is_unavailable(&e) {
            true => Error::Unavailable(e),
            false => Error::Internal(e.into()),
        }
    }
}

/// Whether `e` means the database cannot be had (away, starting, shutting down, too busy to
/// lend a connection) rather than a bug.
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => is_unavailable_code(db.code().as_deref()),
        _ => false,
    }
}

/// The server refused a connection for want of a slot (SQLSTATE 53300 `too_many_connections`:
/// its `max_connections`, or a role's or database's `CONNECTION LIMIT`): unavailable to that
/// request (503), but the server is up, and the connections already open serve.
pub fn is_out_of_slots(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("53300"))
}

/// SQLSTATE classes that mean "the server is going away or not accepting work", not a bug:
/// 08 connection exception, 53 insufficient resources (too many connections, out of memory,
/// disk full), 57P01..57P03 admin shutdown / crash shutdown / cannot connect now.
fn is_unavailable_code(code: Option<&str>) -> bool {
    matches!(code, Some(c) if c.starts_with("08") || c.starts_with("53") || c.starts_with("57P"))
}

impl Error {
    /// The same error as a GraphQL error, `extensions.code` naming its kind. Internal causes
    /// are logged here and never shown.
    pub fn to_graphql(&self) -> async_graphql::Error {
        let code = match self {
            Error::Unauthorized(_) => "UNAUTHENTICATED",
            Error::Forbidden(_) => "FORBIDDEN",
            Error::NotFound(_) => "NOT_FOUND",
            Error::BadRequest(_) | Error::Invalid { .. } | Error::PayloadTooLarge { .. } => {
                "BAD_USER_INPUT"
            }
            Error::Conflict(_) => "CONFLICT",
            Error::Unavailable(_)
            | Error::Timeout(_)
            | Error::GitLabUnavailable(_)
            | Error::NoConnection(_) => "SERVICE_UNAVAILABLE",
            Error::BadGateway(_) => "BAD_GATEWAY",
            Error::TooManyRequests { .. } => "TOO_MANY_REQUESTS",
            Error::Internal(_) => "INTERNAL_SERVER_ERROR",
        };
        let message = self.public_message();
        use async_graphql::ErrorExtensions;
        async_graphql::Error::new(message).extend_with(|_, ext| ext.set("code", code))
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = match &self {
            Error::Invalid { message, .. } => message.clone(),
            other => other.public_message(),
        };
        let mut error = json!({ "code": self.code(), "message": message });
        if let Error::Invalid { field, .. } = &self {
            error["field"] = json!(field);
        }
        let mut response = (status, Json(json!({ "error": error }))).into_response();
        self.retry_after(&mut response);
        response
    }
}

impl Error {
    /// What the client is told. Logs the cause of an internal error (and a database outage)
    /// here, once, inside the request's span; the client sees no detail of it.
    fn public_message(&self) -> String {
        match self {
            Error::Internal(e) => {
                tracing::error!(error = ?e, "internal error");
                "internal error".to_owned()
            }
            Error::Unavailable(e) => {
                tracing::warn!(error = %e, "database unavailable");
                self.to_string()
            }
            other => other.to_string(),
        }
    }

    /// The same error as a Kubernetes `Status` object, as the proxy answers (SPEC 5.3).
    pub fn to_kubernetes_status(&self) -> Response {
        let mut response = kubernetes_status(self.status(), &self.public_message());
        self.retry_after(&mut response);
        response
    }

    /// `Retry-After` (whole seconds, at least one) on a [`Error::TooManyRequests`] answer.
    pub fn retry_after(&self, response: &mut Response) {
        if let Error::TooManyRequests { retry_after, .. } = self {
            let seconds = retry_after.as_secs_f64().ceil().max(1.0) as u64;
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
    }
}

/// A Kubernetes `Status` answer of envlens' own: `reason` as the API server names it.
pub fn kubernetes_status(code: StatusCode, message: &str) -> Response {
    (
        code,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        kubernetes_status_body(code, message),
    )
        .into_response()
}

/// The `Status` document of [`kubernetes_status`], for answers made outside axum (a cluster
/// client's own layer).
pub fn kubernetes_status_body(code: StatusCode, message: &str) -> String {
    let reason = match code {
        StatusCode::BAD_REQUEST => "BadRequest",
        StatusCode::UNAUTHORIZED => "Unauthorized",
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::NOT_FOUND => "NotFound",
        StatusCode::CONFLICT => "Conflict",
        StatusCode::PAYLOAD_TOO_LARGE => "RequestEntityTooLarge",
        StatusCode::UNPROCESSABLE_ENTITY => "Invalid",
        StatusCode::GATEWAY_TIMEOUT => "Timeout",
        StatusCode::NOT_IMPLEMENTED => "MethodNotAllowed",
        StatusCode::TOO_MANY_REQUESTS => "TooManyRequests",
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailable",
        _ => "InternalError",
    };
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_cannot_take_the_work_is_unavailable_and_a_bug_is_not() {
        for code in ["08006", "53300", "53100", "57P01", "57P03"] {
            assert!(is_unavailable_code(Some(code)), "{code}");
        }
        for code in ["23505", "42P01", "40001", "22P02"] {
            assert!(!is_unavailable_code(Some(code)), "{code}");
        }
        assert!(!is_unavailable_code(None));
    }
}
