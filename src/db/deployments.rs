//! SQL of environments, deployments, their creation outcome and `agent_deployments`.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;

use crate::error::{Error, Result};
use crate::gitlab::agent_config::CiAccessEntry;
use crate::gitlab::deployment_status::{DeploymentStatus, StatusReport};

/// The recorded outcome of a deployment's first creation call: what it asked for, and why no
/// `agent_deployments` row was written (`None` when one was).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Creation {
    pub agent: Option<String>,
    pub namespace: Option<String>,
    pub flux_resource_path: Option<String>,
    pub reason: Option<String>,
}

/// Claims the creation of `deployment_id` for this request, recording what it asks for; `Some`
/// with the earlier outcome when another request claimed it first (waiting for that one to
/// commit or roll back).
pub async fn claim_creation(
    conn: &mut PgConnection,
    deployment_id: i64,
    requested: &Creation,
) -> Result<Option<Creation>> {
    let claimed = sqlx::query(
        "INSERT INTO deployment_creations (deployment_id, agent, namespace, flux_resource_path)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (deployment_id) DO NOTHING",
    )
    .bind(deployment_id)
    .bind(&requested.agent)
    .bind(&requested.namespace)
    .bind(&requested.flux_resource_path)
    .execute(&mut *conn)
    .await?;
    if claimed.rows_affected() == 1 {
        return Ok(None);
    }
    let earlier = sqlx::query_as(
        "SELECT agent, namespace, flux_resource_path, reason FROM deployment_creations
         WHERE deployment_id = $1",
    )
    .bind(deployment_id)
    .fetch_one(conn)
    .await?;
    Ok(Some(earlier))
}

pub async fn set_creation_reason(
    conn: &mut PgConnection,
    deployment_id: i64,
    reason: &str,
) -> Result<()> {
    sqlx::query("UPDATE deployment_creations SET reason = $2 WHERE deployment_id = $1")
        .bind(deployment_id)
        .bind(reason)
        .execute(conn)
        .await?;
    Ok(())
}

pub struct Environment<'a> {
    pub id: i64,
    pub project_id: i64,
    pub name: &'a str,
    pub slug: &'a str,
    pub tier: Option<&'a str>,
}

/// Creates or updates an environment. Another environment of the project with the same name
/// was deleted in GitLab (ids are never reused; names are), and GitLab deleted its deployments
/// with it: so is it here.
pub async fn put_environment(conn: &mut PgConnection, env: &Environment<'_>) -> Result<()> {
    sqlx::query("DELETE FROM environments WHERE project_id = $1 AND name = $2 AND id <> $3")
        .bind(env.project_id)
        .bind(env.name)
        .bind(env.id)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "INSERT INTO environments (id, project_id, name, slug, tier) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (id) DO UPDATE SET project_id = EXCLUDED.project_id, name = EXCLUDED.name,
             slug = EXCLUDED.slug, tier = COALESCE(EXCLUDED.tier, environments.tier), updated_at = now()
         WHERE (environments.project_id, environments.name, environments.slug, environments.tier)
               IS DISTINCT FROM (EXCLUDED.project_id, EXCLUDED.name, EXCLUDED.slug, COALESCE(EXCLUDED.tier, environments.tier))",
    )
    .bind(env.id)
    .bind(env.project_id)
    .bind(env.name)
    .bind(env.slug)
    .bind(env.tier)
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn environment_id(
    conn: &mut PgConnection,
    project_id: i64,
    name: &str,
) -> Result<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT id FROM environments WHERE project_id = $1 AND name = $2")
            .bind(project_id)
            .bind(name)
            .fetch_optional(conn)
            .await?,
    )
}

/// A deployment as the creation call or a hook first describes it.
pub struct NewDeployment<'a> {
    pub id: i64,
    pub iid: Option<i64>,
    pub project_id: i64,
    pub environment_id: Option<i64>,
    pub environment_name: &'a str,
    pub report: StatusReport,
    pub git_ref: Option<&'a str>,
    pub sha: Option<&'a str>,
    pub tag: Option<bool>,
    pub job_id: Option<i64>,
    pub created_at: Option<DateTime<Utc>>,
}

/// Inserts the deployment unless it exists, then locks its row. Returns the status it had
/// when it existed already.
pub async fn insert_or_lock(
    conn: &mut PgConnection,
    d: &NewDeployment<'_>,
) -> Result<Option<StatusReport>> {
    let finished_at = d
        .report
        .status
        .is_finished()
        .then_some(d.report.changed_at)
        .flatten();
    let inserted = sqlx::query(
        "INSERT INTO deployments (id, iid, project_id, environment_id, environment_name, status, ref, sha, tag,
                                  job_id, created_at, status_changed_at, finished_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, COALESCE($11, now()), $12, $13)
         ON CONFLICT (id) DO NOTHING",
    )
    .bind(d.id)
    .bind(d.iid)
    .bind(d.project_id)
    .bind(d.environment_id)
    .bind(d.environment_id.is_none().then_some(d.environment_name))
    .bind(d.report.status.as_str())
    .bind(d.git_ref)
    .bind(d.sha)
    .bind(d.tag)
    .bind(d.job_id)
    .bind(d.created_at)
    .bind(d.report.changed_at)
    .bind(finished_at)
    .execute(&mut *conn)
    .await?;
    if inserted.rows_affected() == 1 {
        return Ok(None);
    }
    let (status, changed_at): (String, Option<DateTime<Utc>>) = sqlx::query_as(
        "SELECT status, status_changed_at FROM deployments WHERE id = $1 FOR UPDATE",
    )
    .bind(d.id)
    .fetch_one(conn)
    .await?;
    let status = DeploymentStatus::parse(&status).ok_or_else(|| {
        Error::Internal(anyhow::anyhow!("deployment {} has status {status}", d.id))
    })?;
    Ok(Some(StatusReport { status, changed_at }))
}

/// Completes a deployment a hook created, with what only the creation call knows.
pub async fn complete(conn: &mut PgConnection, d: &NewDeployment<'_>) -> Result<()> {
    sqlx::query(
        "UPDATE deployments SET iid = $2, project_id = $3, environment_id = $4, environment_name = NULL,
             ref = $5, sha = COALESCE($6, sha), tag = $7, job_id = $8, created_at = COALESCE($9, created_at),
             updated_at = now()
         WHERE id = $1",
    )
    .bind(d.id)
    .bind(d.iid)
    .bind(d.project_id)
    .bind(d.environment_id)
    .bind(d.git_ref)
    .bind(d.sha)
    .bind(d.tag)
    .bind(d.job_id)
    .bind(d.created_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records a newer status; `finished_at` is the time it finished.
pub async fn set_status(conn: &mut PgConnection, id: i64, report: &StatusReport) -> Result<()> {
    sqlx::query(
        "UPDATE deployments SET status = $2, status_changed_at = $3,
             finished_at = CASE WHEN $4 THEN COALESCE($3, now()) ELSE finished_at END, updated_at = now()
         WHERE id = $1",
    )
    .bind(id)
    .bind(report.status.as_str())
    .bind(report.changed_at)
    .bind(report.status.is_finished())
    .execute(conn)
    .await?;
    Ok(())
}

/// Links a hook-created deployment to its environment once the environment is known.
pub async fn link_environment(conn: &mut PgConnection, id: i64, environment_id: i64) -> Result<()> {
    sqlx::query(
        "UPDATE deployments SET environment_id = $2, environment_name = NULL WHERE id = $1 AND environment_id IS NULL",
    )
    .bind(id)
    .bind(environment_id)
    .execute(conn)
    .await?;
    Ok(())
}

/// The agent named `<config project path>:<name>`: its id and configuration project id.
pub async fn find_agent(
    conn: &mut PgConnection,
    project_path: &str,
    name: &str,
) -> Result<Option<(i64, i64)>> {
    Ok(sqlx::query_as(
        "SELECT a.id, a.project_id FROM cluster_agents a JOIN projects p ON p.id = a.project_id
         WHERE lower(p.full_path) = lower($1) AND a.name = $2",
    )
    .bind(project_path)
    .bind(name)
    .fetch_optional(conn)
    .await?)
}

/// The agent's `ci_access` entries for the project: its own entry, and the entries of its
/// ancestor groups with their depth (1 for the top-level group).
pub async fn ci_access_entries(
    conn: &mut PgConnection,
    agent_id: i64,
    project_id: i64,
) -> Result<(Option<CiAccessEntry>, Vec<(usize, CiAccessEntry)>)> {
    let rows: Vec<(Option<i32>, Value)> = sqlx::query_as(
        "SELECT NULL::int, a.config FROM agent_ci_access_authorizations a
         WHERE a.agent_id = $1 AND a.project_id = $2
         UNION ALL
         SELECT array_position(n.traversal_ids, a.group_id), a.config
         FROM projects p JOIN namespaces n ON n.id = p.namespace_id
         JOIN agent_ci_access_authorizations a ON a.agent_id = $1 AND a.group_id = ANY (n.traversal_ids)
         WHERE p.id = $2",
    )
    .bind(agent_id)
    .bind(project_id)
    .fetch_all(conn)
    .await?;
    let mut project = None;
    let mut groups = Vec::new();
    for (depth, config) in rows {
        let entry: CiAccessEntry =
            serde_json::from_value(config).map_err(|e| Error::Internal(e.into()))?;
        match depth {
            None => project = Some(entry),
            Some(depth) => groups.push((depth as usize, entry)),
        }
    }
    Ok((project, groups))
}

/// A deployment's `agent_deployments` row (without the deployment id).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct AgentDeployment {
    pub agent_id: i64,
    pub kubernetes_namespace: String,
    pub flux_resource_path: Option<String>,
}

pub async fn insert_agent_deployment(
    conn: &mut PgConnection,
    deployment_id: i64,
    row: &AgentDeployment,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO agent_deployments (deployment_id, agent_id, kubernetes_namespace, flux_resource_path)
         VALUES ($1, $2, $3, $4)",
    )
    .bind(deployment_id)
    .bind(row.agent_id)
    .bind(&row.kubernetes_namespace)
    .bind(&row.flux_resource_path)
    .execute(conn)
    .await?;
    Ok(())
}

/// The deployment's `agent_deployments` row.
pub async fn agent_deployment(
    conn: &mut PgConnection,
    deployment_id: i64,
) -> Result<Option<AgentDeployment>> {
    Ok(sqlx::query_as(
        "SELECT agent_id, kubernetes_namespace, flux_resource_path FROM agent_deployments
         WHERE deployment_id = $1",
    )
    .bind(deployment_id)
    .fetch_optional(conn)
    .await?)
}

/// Serializes the two halves of a CI deployment (the job's call and GitLab's hook) for one
/// job: the only advisory lock envlens takes, keyed by the job id.
pub async fn lock_job(conn: &mut PgConnection, job_id: i64) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(job_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// A deploy job's request (SPEC 12.2), as kept until its deployment is known.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct CiRequest {
    pub job_id: i64,
    pub project_id: i64,
    pub environment: String,
    pub ref_protected: bool,
    pub git_ref: String,
    pub kubernetes: sqlx::types::Json<serde_json::Value>,
}

/// What keeping a job's request found.
#[derive(Debug)]
pub struct KeptRequest {
    /// The request already kept for that job (then left unchanged); `None` when this one was.
    pub earlier: Option<CiRequest>,
    /// The job's deployment, once GitLab's hook has named it.
    pub deployment_id: Option<i64>,
}

/// Keeps `request` and finds the job's deployment in one round trip: the job's lock
/// ([`lock_job`]) is held, so the hook that names the deployment is either already committed
/// (and seen here) or waits for this transaction.
pub async fn put_ci_request(conn: &mut PgConnection, request: &CiRequest) -> Result<KeptRequest> {
    let (inserted, deployment_id): (bool, Option<i64>) = sqlx::query_as(
        "WITH kept AS (
             INSERT INTO ci_deployment_requests (job_id, project_id, environment, ref_protected, git_ref, kubernetes)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (job_id) DO NOTHING
             RETURNING 1)
         SELECT EXISTS (SELECT 1 FROM kept),
                (SELECT id FROM deployments WHERE job_id = $1 AND project_id = $2 ORDER BY id DESC LIMIT 1)",
    )
    .bind(request.job_id)
    .bind(request.project_id)
    .bind(&request.environment)
    .bind(request.ref_protected)
    .bind(&request.git_ref)
    .bind(&request.kubernetes)
    .fetch_one(&mut *conn)
    .await?;
    let earlier = if inserted {
        None
    } else {
        ci_request(conn, request.job_id).await?
    };
    Ok(KeptRequest {
        earlier,
        deployment_id,
    })
}

pub async fn ci_request(conn: &mut PgConnection, job_id: i64) -> Result<Option<CiRequest>> {
    Ok(sqlx::query_as(
        "SELECT job_id, project_id, environment, ref_protected, git_ref, kubernetes
         FROM ci_deployment_requests WHERE job_id = $1",
    )
    .bind(job_id)
    .fetch_optional(conn)
    .await?)
}

/// Records the job of a deployment that a hook named, where it was not known yet.
pub async fn link_job(conn: &mut PgConnection, id: i64, job_id: i64) -> Result<()> {
    sqlx::query("UPDATE deployments SET job_id = $2 WHERE id = $1 AND job_id IS NULL")
        .bind(id)
        .bind(job_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// The job of a deployment, when known.
pub async fn job_of(conn: &mut PgConnection, id: i64) -> Result<Option<i64>> {
    let job: Option<Option<i64>> =
        sqlx::query_scalar("SELECT job_id FROM deployments WHERE id = $1")
            .bind(id)
            .fetch_optional(conn)
            .await?;
    Ok(job.flatten())
}
