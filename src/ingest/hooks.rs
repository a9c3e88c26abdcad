//! `POST /webhooks/gitlab`: system hooks and deployment hooks (SPEC 2.3).
//!
//! The token is checked before the body is read. A delivery that carries an id
//! (`X-Gitlab-Event-UUID`, else `Idempotency-Key`) is recorded in the same transaction as its
//! effect, so a redelivery finds it and changes nothing.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json as JsonResponse;
use serde_json::{json, Value};
use sqlx::PgConnection;

use super::deployments::{DeploymentHook, StatusEvent};
use super::identity::SystemHook;
use crate::auth::Webhook;
use crate::db::deliveries;
use crate::error::{Error, Result};
use crate::http::extract::{from_value, parse, read_body};
use crate::state::AppState;

const EVENT_HEADER: &str = "x-gitlab-event";
const DELIVERY_HEADERS: [&str; 2] = ["x-gitlab-event-uuid", "idempotency-key"];

enum Hook {
    System(SystemHook),
    Deployment(StatusEvent),
}

pub async fn receive(
    _: Webhook,
    State(state): State<AppState>,
    headers: HeaderMap,
    req: Request,
) -> Result<(StatusCode, JsonResponse<Value>)> {
    let event = headers
        .get(EVENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !matches!(event, "System Hook" | "Deployment Hook") {
        return Ok(ignored(&format!(
            "`{event}` events are not used by envlens"
        )));
    }
    let body: Value = parse(&read_body(req, state.limits.body_limit).await?)?;
    if !body.is_object() {
        return Err(Error::invalid("", "a hook must be a JSON object"));
    }
    let hook = if event == "System Hook" {
        let hook = SystemHook::from_json(body)?;
        if matches!(hook, SystemHook::Other) {
            return Ok(ignored("this system hook event is not mirrored"));
        }
        hook.validate()?;
        Hook::System(hook)
    } else {
        Hook::Deployment(from_value::<DeploymentHook>(body, "")?.validate()?)
    };
    let mut tx = state.db.begin().await?;
    if !first_delivery(&mut tx, &headers, event).await? {
        return Ok((
            StatusCode::OK,
            JsonResponse(json!({ "applied": false, "reason": "already delivered" })),
        ));
    }
    let changed = match &hook {
        Hook::System(hook) => hook.apply(&mut tx).await.map(|()| true)?,
        Hook::Deployment(event) => event.apply(&mut tx).await?,
    };
    tx.commit().await?;
    Ok((StatusCode::OK, JsonResponse(json!({ "applied": changed }))))
}

fn ignored(reason: &str) -> (StatusCode, JsonResponse<Value>) {
    (
        StatusCode::ACCEPTED,
        JsonResponse(json!({ "applied": false, "reason": reason })),
    )
}

/// Records the delivery id, if the request has one; false when it was delivered before.
async fn first_delivery(conn: &mut PgConnection, headers: &HeaderMap, event: &str) -> Result<bool> {
    let id = DELIVERY_HEADERS.iter().find_map(|h| headers.get(*h));
    match id {
        None => Ok(true),
        Some(id) => {
            let id = id
                .to_str()
                .map_err(|_| Error::BadRequest("delivery id is not text".into()))?;
            // A primary key: an index row must stay small (GitLab's ids are 36-character UUIDs).
            if id.len() > crate::gitlab::validate::MAX_NAME {
                return Err(Error::BadRequest(
                    "delivery id is longer than 255 characters".into(),
                ));
            }
            deliveries::record(conn, id, event).await
        }
    }
}
