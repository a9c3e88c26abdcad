//! SQL of the Flux actions' audit (SPEC 15, migration 0057): one row per action asked for,
//! written with its line on the environment's timeline in one statement, and read a page at a
//! time, newest first.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::error::Result;

/// The timeline reasons of the actions (`environment_events.reason`): shown, like the health
/// changes, only to viewers with `user_access` (see `db::events`).
pub const EVENT_REASONS: [&str; 3] = ["FluxReconcile", "FluxSuspend", "FluxResume"];

/// One audited action.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FluxActionRow {
    pub id: i64,
    pub environment_id: i64,
    pub user_id: i64,
    pub username: String,
    /// `RECONCILE`, `SUSPEND` or `RESUME`.
    pub kind: String,
    pub resource: String,
    pub answer_code: i32,
    pub created_at: DateTime<Utc>,
}

/// What is audited of an action.
#[derive(Debug, Clone)]
pub struct NewAction<'a> {
    pub environment_id: i64,
    pub user_id: i64,
    pub username: &'a str,
    pub kind: &'a str,
    pub resource: &'a str,
    pub answer_code: i32,
}

const COLUMNS: &str =
    "id, environment_id, user_id, username, kind, resource, answer_code, created_at";

/// Audits `action` and puts it on the environment's timeline (`Normal` when the cluster took
/// it, `Warning` otherwise), in one statement: neither is written without the other.
pub async fn record(db: impl PgExecutor<'_>, action: &NewAction<'_>) -> Result<FluxActionRow> {
    Ok(sqlx::query_as(&format!(
        "WITH audited AS (
             INSERT INTO flux_actions (environment_id, user_id, username, kind, resource, answer_code)
             VALUES ($1, $2, $3, $4, $5, $6)
             RETURNING {COLUMNS}),
         shown AS (
             INSERT INTO environment_events (environment_id, type, reason, message, first_time, last_time)
             SELECT environment_id,
                    CASE WHEN answer_code BETWEEN 200 AND 299 THEN 'Normal' ELSE 'Warning' END,
                    CASE kind WHEN 'RECONCILE' THEN 'FluxReconcile'
                              WHEN 'SUSPEND' THEN 'FluxSuspend' ELSE 'FluxResume' END,
                    username || ' asked to ' || lower(kind) || ' ' || resource || ': '
                      || CASE WHEN answer_code BETWEEN 200 AND 299 THEN 'done'
                              ELSE 'refused (' || answer_code || ')' END,
                    created_at, created_at
             FROM audited)
         SELECT {COLUMNS} FROM audited"
    ))
    .bind(action.environment_id)
    .bind(action.user_id)
    .bind(action.username)
    .bind(action.kind)
    .bind(action.resource)
    .bind(action.answer_code)
    .fetch_one(db)
    .await?)
}

/// Up to `limit` actions on the environment, newest first, those older than `before` (an id)
/// when given.
pub async fn page(
    db: impl PgExecutor<'_>,
    environment_id: i64,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<FluxActionRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM flux_actions
         WHERE environment_id = $1 AND ($2::bigint IS NULL OR id < $2)
         ORDER BY id DESC LIMIT $3"
    ))
    .bind(environment_id)
    .bind(before)
    .bind(limit)
    .fetch_all(db)
    .await?)
}
