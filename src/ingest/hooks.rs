//! `POST /webhooks/gitlab`: system hooks and deployment hooks (SPEC 2.3, 4.1, 4.4), and
//! group webhooks' member, project and subgroup events, applied as the system hooks of the same
//! names, and pushes touching `.gitlab/agents/` (SPEC 12.3).
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
//!
//! A group webhook's token (SPEC 13) vouches only for events inside its group: one that reaches
//! outside is refused with 403 before anything is written (`gitlab::hook_scope`), a `System
//! Hook` under it is refused before its body is read, and it never writes a user.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json as JsonResponse;
use serde_json::{json, Value};
use sqlx::PgConnection;

use super::deployments::{DeploymentHook, StatusEvent};
use super::followups;
use super::identity::{event_label, Outcome, SystemHook, Users};
use crate::auth::Webhook;
use crate::db::{deliveries, identity};
use crate::error::{Error, Result};
use crate::gitlab::hook_scope::{self, Footprint, Verdict};
use crate::gitlab::push::PushEvent;
use crate::http::extract::{from_value, parse, read_body};
use crate::state::AppState;

const EVENT_HEADER: &str = "x-gitlab-event";
const DELIVERY_HEADERS: [&str; 2] = ["x-gitlab-event-uuid", "idempotency-key"];

enum Hook {
    System(SystemHook),
    Deployment(StatusEvent),
    Push(PushEvent),
}

impl Hook {
    /// What it touches, for the rule of a group's webhook token.
    fn footprint(&self) -> Footprint {
        match self {
            Hook::System(hook) => hook.footprint(),
            Hook::Deployment(status) => status.footprint(),
            Hook::Push(push) => push.footprint(),
        }
    }
}

/// Group webhooks' events that carry the system hooks' payloads (`event_name` and the same
/// keys; `subgroup_create`/`subgroup_destroy` are its own names for a group's).
const SYSTEM_LIKE: [&str; 4] = [
    "System Hook",
    "Member Hook",
    "Project Hook",
    "Subgroup Hook",
];

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
    source: Webhook,
    State(state): State<AppState>,
    headers: HeaderMap,
    req: Request,
) -> Result<(StatusCode, JsonResponse<Value>)> {
    let mut event = "other";
    let result = handle(&state, &source, &headers, req, &mut event).await;
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
    source: &Webhook,
    headers: &HeaderMap,
    req: Request,
    event: &mut &'static str,
) -> Result<Answer> {
    let kind = headers
        .get(EVENT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if let (Webhook::Group(group), "System Hook") = (source, kind) {
        return Err(Error::Forbidden(format!(
            "a System Hook needs the instance's webhook token, not group {group}'s"
        )));
    }
    if !SYSTEM_LIKE.contains(&kind) && !matches!(kind, "Deployment Hook" | "Push Hook") {
        return Ok(Answer::not_applied(
            "ignored",
            format!("`{kind}` events are not used by envlens"),
        ));
    }
    let body: Value = parse(&read_body(req, state.limits.body_limit).await?)?;
    if !body.is_object() {
        return Err(Error::invalid("", "a hook must be a JSON object"));
    }
    let hook = if SYSTEM_LIKE.contains(&kind) {
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
    } else if kind == "Push Hook" {
        *event = "push";
        if worker(state).is_none() {
            return Ok(Answer::not_applied(
                "ignored",
                "reading agents' configuration needs gitlab.url and gitlab.token_file",
            ));
        }
        let push: PushEvent = from_value(body, "")?;
        if let Some(reason) = push.agents_untouched() {
            return Ok(Answer::not_applied("ignored", reason));
        }
        Hook::Push(push)
    } else {
        *event = "deployment";
        Hook::Deployment(from_value::<DeploymentHook>(body, "")?.validate()?)
    };
    let mut tx = state.db.begin().await?;
    if let Webhook::Group(group) = source {
        let footprint = hook.footprint();
        let located = identity::locate(&mut tx, &footprint).await?;
        match hook_scope::decide(group, &footprint, &located) {
            Verdict::Allowed => {}
            Verdict::Forbidden(reason) => return Err(Error::Forbidden(reason)),
            Verdict::Unapplied(reason) => {
                tracing::warn!(event = *event, group = %group, reason = %reason,
                    "group webhook event not applied");
                return Ok(Answer::not_applied("unapplied", reason));
            }
        }
    }
    if !first_delivery(&mut tx, headers).await? {
        return Ok(Answer {
            status: StatusCode::OK,
            outcome: "duplicate",
            applied: false,
            reason: Some("already delivered".into()),
        });
    }
    let applied = match &hook {
        Hook::System(hook) => {
            // A group's webhook never writes a user: `decide` found its users in the mirror.
            let users = match source {
                Webhook::Instance => Users::Write,
                Webhook::Group(_) => Users::Keep,
            };
            hook.apply(&mut tx, users).await
        }
        Hook::Push(push) => {
            let followup = followups::after_push(&mut tx, push.project_id).await?;
            let answer = commit(tx, Answer::applied(true)).await?;
            if let Some(worker) = worker(state) {
                worker.try_now(followup).await;
            }
            return Ok(answer);
        }
        Hook::Deployment(status) => match status.apply(&mut tx).await {
            Ok(changed) => {
                // SPEC 12.2: a success nobody described is looked up in GitLab.
                let lookup = match (status.succeeded(), worker(state)) {
                    (Some(d), Some(_)) => followups::after_success(&mut tx, &d).await?,
                    _ => None,
                };
                let answer = commit(tx, Answer::applied(changed)).await?;
                if let (Some(id), Some(worker)) = (lookup, worker(state)) {
                    worker.try_now(id).await;
                }
                return Ok(answer);
            }
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

/// The worker of GitLab follow-ups, when envlens has GitLab's URL and a token for it.
fn worker(state: &AppState) -> Option<followups::Worker> {
    let gitlab = state.gitlab.as_ref().filter(|g| g.api.has_token())?;
    Some(followups::Worker::new(
        state.db.pg().clone(),
        gitlab.api.clone(),
        state.metrics.clone(),
    ))
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
