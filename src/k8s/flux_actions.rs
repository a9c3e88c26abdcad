//! Flux's actions as GitLab sends them through its proxy (SPEC 15): reconcile asks the
//! controller to reconcile now (the `reconcile.fluxcd.io/requestedAt` annotation), suspend and
//! resume set `spec.suspend`. Each is one JSON patch (RFC 6902), sent with the viewer's headers
//! (impersonated where the agent impersonates), so the cluster's own RBAC decides.
//!
//! The patches are built here, pure and tested without I/O; [`send`] reads the object first,
//! as the viewer, since the right reconcile patch depends on its annotations.

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Value};

use super::observe::ForAgent;

/// The annotation Flux's controllers watch to reconcile outside their interval.
pub const REQUESTED_AT: &str = "reconcile.fluxcd.io/requestedAt";

/// What is asked of a Flux object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FluxAction {
    Reconcile,
    Suspend,
    Resume,
}

impl FluxAction {
    /// As `FluxAction.kind` and the audit write it.
    pub fn as_str(self) -> &'static str {
        match self {
            FluxAction::Reconcile => "RECONCILE",
            FluxAction::Suspend => "SUSPEND",
            FluxAction::Resume => "RESUME",
        }
    }

    /// The patch for `object` (as the cluster answered a GET of it) at `now`.
    pub fn patch(self, object: &Value, now: DateTime<Utc>) -> Value {
        match self {
            FluxAction::Reconcile => reconcile_patch(object, now),
            FluxAction::Suspend => suspend_patch(true),
            FluxAction::Resume => suspend_patch(false),
        }
    }
}

/// GitLab's reconcile: `replace` of the annotation with the time now (RFC 3339). The apiserver's
/// JSON patch (evanphx/json-patch v4) replaces a member its object lacks, but not one whose
/// object is missing (422, "doc is missing path"): an object without annotations gets an `add`
/// of `/metadata/annotations` holding the one key instead.
pub fn reconcile_patch(object: &Value, now: DateTime<Utc>) -> Value {
    let now = now.to_rfc3339_opts(SecondsFormat::Millis, true);
    match object.pointer("/metadata/annotations") {
        Some(Value::Object(_)) => json!([{"op": "replace",
            "path": "/metadata/annotations/reconcile.fluxcd.io~1requestedAt", "value": now}]),
        _ => json!([{"op": "add", "path": "/metadata/annotations", "value": {REQUESTED_AT: now}}]),
    }
}

/// GitLab's suspend (`true`) and resume (`false`).
pub fn suspend_patch(suspend: bool) -> Value {
    json!([{"op": "replace", "path": "/spec/suspend", "value": suspend}])
}

/// Where the action goes and as whom.
pub struct Target<'a> {
    pub client: &'a kube::Client,
    pub agent: i64,
    /// The viewer's headers: impersonation (where the agent impersonates) and request ids.
    pub headers: &'a HeaderMap,
    /// The object's path below the API root, e.g.
    /// `/apis/kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/app`.
    pub path: &'a str,
    pub timeout: Duration,
}

/// What the cluster answered: its status, and its message when it refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub code: u16,
    pub message: Option<String>,
}

/// Reads the object as the viewer, then patches it: the answer of the first request the
/// cluster refused, else the patch's. A cluster that cannot be reached or does not answer in
/// time is a 502 or a 504 of envlens' own.
pub async fn send(target: &Target<'_>, action: FluxAction, now: DateTime<Utc>) -> Answer {
    let (status, body) = match exchange(target, Method::GET, None).await {
        Ok(read) => read,
        Err(answer) => return answer,
    };
    if !status.is_success() {
        return refused(status, &body);
    }
    let Ok(object) = serde_json::from_slice::<Value>(&body) else {
        return Answer {
            code: 502,
            message: Some("the cluster's answer was not a Kubernetes object".into()),
        };
    };
    let patch = action.patch(&object, now);
    match exchange(target, Method::PATCH, Some(patch)).await {
        Ok((status, _)) if status.is_success() => Answer {
            code: status.as_u16(),
            message: None,
        },
        Ok((status, body)) => refused(status, &body),
        Err(answer) => answer,
    }
}

/// The cluster's refusal, with the `message` of its `Status` when it sent one.
fn refused(status: StatusCode, body: &[u8]) -> Answer {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|s| s.get("message").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| format!("the cluster answered {status}"));
    Answer {
        code: status.as_u16(),
        message: Some(message),
    }
}

async fn exchange(
    target: &Target<'_>,
    method: Method,
    patch: Option<Value>,
) -> Result<(StatusCode, bytes::Bytes), Answer> {
    let body = patch
        .map(|p| p.to_string().into_bytes())
        .unwrap_or_default();
    let mut request = Request::new(kube::client::Body::from(body));
    *request.method_mut() = method.clone();
    *request.uri_mut() = target.path.parse().map_err(|_| Answer {
        code: 400,
        message: Some(format!("{} is not a path", target.path)),
    })?;
    let headers = request.headers_mut();
    for (name, value) in target.headers {
        headers.append(name, value.clone());
    }
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    if method == Method::PATCH {
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json-patch+json"),
        );
    }
    request.extensions_mut().insert(ForAgent(target.agent));
    match tokio::time::timeout(target.timeout, super::exchange(target.client, request)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(Answer {
            code: 502,
            message: Some(format!("the cluster cannot be reached: {e}")),
        }),
        Err(_) => Err(Answer {
            code: 504,
            message: Some(format!(
                "the cluster did not answer within {}s",
                target.timeout.as_secs_f32()
            )),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-27T18:00:00.250Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn reconcile_replaces_the_annotation_where_the_object_has_annotations() {
        let replace = json!([{"op": "replace", "path": "/metadata/annotations/reconcile.fluxcd.io~1requestedAt",
                              "value": "2026-11-27T18:00:00.250Z"}]);
        let with_it =
            json!({"metadata": {"annotations": {REQUESTED_AT: "2026-01-01T00:00:00Z", "a": "b"}}});
        assert_eq!(reconcile_patch(&with_it, at()), replace);
        let others = json!({"metadata": {"annotations": {"a": "b"}}});
        assert_eq!(reconcile_patch(&others, at()), replace);
    }

    #[test]
    fn reconcile_adds_the_annotations_an_object_lacks() {
        for object in [
            json!({"metadata": {"name": "app"}}),
            json!({"metadata": {"annotations": null}}),
        ] {
            assert_eq!(
                reconcile_patch(&object, at()),
                json!([{"op": "add", "path": "/metadata/annotations",
                        "value": {REQUESTED_AT: "2026-11-27T18:00:00.250Z"}}])
            );
        }
    }

    #[test]
    fn suspend_and_resume_replace_spec_suspend() {
        let object = json!({});
        assert_eq!(
            FluxAction::Suspend.patch(&object, at()),
            json!([{"op": "replace", "path": "/spec/suspend", "value": true}])
        );
        assert_eq!(
            FluxAction::Resume.patch(&object, at()),
            json!([{"op": "replace", "path": "/spec/suspend", "value": false}])
        );
    }

    #[test]
    fn a_refusal_carries_the_clusters_message() {
        let body = br#"{"kind":"Status","message":"kustomizations is forbidden"}"#;
        assert_eq!(
            refused(StatusCode::FORBIDDEN, body),
            Answer {
                code: 403,
                message: Some("kustomizations is forbidden".into())
            }
        );
        assert_eq!(
            refused(StatusCode::CONFLICT, b"").message.unwrap(),
            "the cluster answered 409 Conflict"
        );
    }
}
