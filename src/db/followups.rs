//! SQL of the work GitLab's hooks leave to be done with its API (`gitlab_followups`): kept in
//! the hook's own transaction, taken by one worker at a time through a lease on `due_at`.

use sqlx::{PgConnection, PgExecutor};

use crate::error::Result;

/// What is to be done.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Followup {
    pub id: i64,
    pub kind: String,
    pub project_id: i64,
    pub deployment_id: Option<i64>,
    pub environment: Option<String>,
    pub git_ref: Option<String>,
    pub attempts: i32,
}

pub const ENVIRONMENT_LOOKUP: &str = "environment_lookup";
pub const AGENT_REFRESH: &str = "agent_refresh";

/// Keeps a lookup of deployment `deployment_id`'s environment; its id, or `None` when one
/// was kept before (a redelivered hook).
pub async fn add_lookup(
    conn: &mut PgConnection,
    project_id: i64,
    deployment_id: i64,
    environment: &str,
    git_ref: Option<&str>,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "INSERT INTO gitlab_followups (kind, project_id, deployment_id, environment, git_ref)
         VALUES ('environment_lookup', $1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(project_id)
    .bind(deployment_id)
    .bind(environment)
    .bind(git_ref)
    .fetch_optional(conn)
    .await?)
}

/// Keeps a refresh of a project's agents; the pending one's id when there is one already.
pub async fn add_refresh(conn: &mut PgConnection, project_id: i64) -> Result<i64> {
    let added: Option<i64> = sqlx::query_scalar(
        "INSERT INTO gitlab_followups (kind, project_id) VALUES ('agent_refresh', $1)
         ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(project_id)
    .fetch_optional(&mut *conn)
    .await?;
    match added {
        Some(id) => Ok(id),
        None => Ok(sqlx::query_scalar(
            "SELECT id FROM gitlab_followups
             WHERE kind = 'agent_refresh' AND project_id = $1 AND finished_at IS NULL",
        )
        .bind(project_id)
        .fetch_one(conn)
        .await?),
    }
}

/// Whether the deployment's agent was already decided by a creation call (4.3, or the job's
/// own call of 12.2), in which case there is nothing to look up.
pub async fn creation_decided(db: impl PgExecutor<'_>, deployment_id: i64) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM deployment_creations WHERE deployment_id = $1)",
    )
    .bind(deployment_id)
    .fetch_one(db)
    .await?)
}

/// Takes the follow-up `id` if it is pending and due (or, with `id` `None`, up to `limit` due
/// ones), leasing each for `lease_seconds`: another worker does not take it meanwhile, and if
/// this one dies it is due again after the lease.
pub async fn take(
    db: impl PgExecutor<'_>,
    id: Option<i64>,
    limit: i64,
    lease_seconds: f64,
) -> Result<Vec<Followup>> {
    Ok(sqlx::query_as(
        "UPDATE gitlab_followups SET due_at = now() + make_interval(secs => $3)
         WHERE id IN (SELECT id FROM gitlab_followups
                      WHERE finished_at IS NULL AND due_at <= now() AND ($1::bigint IS NULL OR id = $1)
                      ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED)
         RETURNING id, kind, project_id, deployment_id, environment, git_ref, attempts",
    )
    .bind(id)
    .bind(limit)
    .bind(lease_seconds)
    .fetch_all(db)
    .await?)
}

/// Done: what came of it.
pub async fn finish(db: impl PgExecutor<'_>, id: i64, outcome: &str) -> Result<()> {
    sqlx::query(
        "UPDATE gitlab_followups SET finished_at = now(), outcome = $2, attempts = attempts + 1
         WHERE id = $1",
    )
    .bind(id)
    .bind(outcome)
    .execute(db)
    .await?;
    Ok(())
}

/// Not done this time: tried again after `retry_seconds`.
pub async fn retry(
    db: impl PgExecutor<'_>,
    id: i64,
    error: &str,
    retry_seconds: f64,
) -> Result<()> {
    sqlx::query(
        "UPDATE gitlab_followups SET attempts = attempts + 1, last_error = $2,
             due_at = now() + make_interval(secs => $3)
         WHERE id = $1",
    )
    .bind(id)
    .bind(error)
    .bind(retry_seconds)
    .execute(db)
    .await?;
    Ok(())
}

/// The pending follow-ups, for `envlens sync`'s report and the metrics.
pub async fn pending(db: impl PgExecutor<'_>) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM gitlab_followups WHERE finished_at IS NULL")
            .fetch_one(db)
            .await?,
    )
}

/// Forgets finished follow-ups older than `days`.
pub async fn prune(db: impl PgExecutor<'_>, days: i32) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM gitlab_followups WHERE finished_at < now() - make_interval(days => $1)",
    )
    .bind(days)
    .execute(db)
    .await?
    .rows_affected())
}
