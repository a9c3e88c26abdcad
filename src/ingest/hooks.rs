//! `POST /webhooks/gitlab`: system hooks and deployment hooks (SPEC 2.3, 4.1, 4.4).
//!
//! The token is checked before the body is read. A delivery that carries an id
//! (`X-Gitlab-Event-UUID`, else `Idempotency-Key`) is recorded in the same transaction as its
//! effect, so a redelivery finds it and changes nothing.
//!
//! GitLab counts every 4xx as a failed delivery and disables a hook that keeps failing, after
//! which the mirror silently goes stale. So only a malformed body is refused: an event envlens
//! has no use for is acknowledged (202, `ignored`), and a well-formed event that cannot be
//! applied (a path another id holds, say) is acknowledged too (202, `unapplied`), changes
//! nothing, and is logged with its reason. Each outcome is counted in
//! `envlens_webhook_events_total{event,outcome}`.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json as JsonResponse;
use serde_json::{json, Value};
use sqlx::PgConnection;

use super::deployments::{DeploymentHook, StatusEvent};
use super::identity::{event_label, Outcome, SystemHook};
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

/// What became of a delivery, as answered and counted.
struct Answer {
    status: StatusCode,
    outcome: &'static str,
    applied: bool,
    reason: Option<String>,
}

impl Answer {
    fn applied(applied: bool) -> Self {
        Answer {
            status: StatusCode::OK,
            outcome: if applied { "applied" } else { "ignored" },
            applied,
            reason: (!applied).then(|| "nothing changed: the mirror has newer news".to_owned()),
        }
    }

    fn not_applied(outcome: &'static str, reason: impl Into<String>) -> Self {
        Answer {
            status: StatusCode::ACCEPTED,
            outcome,
            applied: false,
            reason: Some(reason.into()),
        }
    }
}

pub async fn receive(
    _: Webhook,
    State(state): State<AppState>,
    headers: HeaderMap,
    req: Request,
) -> Result<(StatusCode, JsonResponse<Value>)> {
    let mut event = "other";
    let result = handle(&state, &headers, req, &mut event).await;
    let outcome = match &result {
        Ok(answer) => answer.outcome,
        Err(e) if e.status().is_client_error() => "rejected",
        Err(_) => "failed",
    };
    state.metrics.webhook_event(event, outcome);
    if outcome == "applied" && event != "deployment" {
        state.metrics.mirror_applied();
    }
    let answer = result?;
    let mut body = json!({ "applied": answer.applied, "outcome": answer.outcome });
    if let Some(reason) = answer.reason {
        body["reason"] = Value::String(reason);
    }
    Ok((answer.status, JsonResponse(body)))
}

/// Reads, checks and applies one delivery; `event` is set to its metric label as soon as it
/// is known.
async fn handle(
    state: &AppState,
    headers: &HeaderMap,
    req: Request,
    event: &mut &'static str,
) -> Result<Answer> {
    let kind = headers
        .get(EVENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !matches!(kind, "System Hook" | "Deployment Hook") {
        return Ok(Answer::not_applied(
            "ignored",
            format!("`{kind}` events are not used by envlens"),
        ));
    }
    let body: Value = parse(&read_body(req, state.limits.body_limit).await?)?;
    if !body.is_object() {
        return Err(Error::invalid("", "a hook must be a JSON object"));
    }
    let hook = if kind == "System Hook" {
        *event = body
            .get("event_name")
            .or_else(|| body.get("object_kind"))
            .and_then(Value::as_str)
            .map_or("other", event_label);
        let hook = SystemHook::from_json(body)?;
        if matches!(hook, SystemHook::Ignored) {
            return Ok(Answer::not_applied(
                "ignored",
                "envlens does not use this system hook event",
            ));
        }
        hook.validate()?;
        Hook::System(hook)
    } else {
        *event = "deployment";
        Hook::Deployment(from_value::<DeploymentHook>(body, "")?.validate()?)
    };
    let mut tx = state.db.begin().await?;
    if !first_delivery(&mut tx, headers).await? {
        return Ok(Answer {
            status: StatusCode::OK,
            outcome: "duplicate",
            applied: false,
            reason: Some("already delivered".into()),
        });
    }
    let applied = match &hook {
        Hook::System(hook) => hook.apply(&mut tx).await,
        Hook::Deployment(status) => match status.apply(&mut tx).await {
            Ok(changed) => return commit(tx, Answer::applied(changed)).await,
            Err(Error::Conflict(reason)) => Ok(Outcome::Unapplied(reason)),
            Err(e) => Err(e),
        },
    };
    match applied? {
        Outcome::Applied => commit(tx, Answer::applied(true)).await,
        Outcome::Unapplied(reason) => {
            // Nothing is kept, the delivery id included: a redelivery, once the mirror has
            // caught up, is tried again.
            tx.rollback().await?;
            tracing::warn!(
                event = *event,
                delivery = delivery_id(headers).unwrap_or_default(),
                reason = %reason,
                "GitLab hook event not applied"
            );
            Ok(Answer::not_applied("unapplied", reason))
        }
    }
}

async fn commit(tx: sqlx::Transaction<'_, sqlx::Postgres>, answer: Answer) -> Result<Answer> {
    tx.commit().await?;
    Ok(answer)
}

fn delivery_id(headers: &HeaderMap) -> Option<&str> {
    DELIVERY_HEADERS
        .iter()
        .find_map(|h| headers.get(*h))
        .and_then(|v| v.to_str().ok())
}

/// Records the delivery id, if the request has one; false when it was delivered before.
async fn first_delivery(conn: &mut PgConnection, headers: &HeaderMap) -> Result<bool> {
    let event = headers
        .get(EVENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    match DELIVERY_HEADERS.iter().find_map(|h| headers.get(*h)) {
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
