//! SQL of environments, deployments, their creation outcome and `agent_deployments`.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::types::Json;
use sqlx::{Arguments, PgConnection};

use super::identity::last_segment;
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

/// The agent `$1:$2` (its configuration project's full path, matched case-insensitively, and
/// its name) with each of its `ci_access` entries for project `$3`, a row each: the
/// project's own entry with a NULL depth, a group's with the group's depth (1 for a top-level
/// group). One row without an entry when it has none for the project; no row when there is no
/// such agent.
macro_rules! authorization_sql {
    () => {
        "SELECT a.id, a.project_id, x.depth, x.config
         FROM cluster_agents a JOIN projects ap ON ap.id = a.project_id
         LEFT JOIN LATERAL (
             SELECT NULL::int AS depth, c.config FROM agent_ci_access_authorizations c
             WHERE c.agent_id = a.id AND c.project_id = $3
             UNION ALL
             SELECT array_position(n.traversal_ids, c.group_id), c.config
             FROM projects p JOIN namespaces n ON n.id = p.namespace_id
             JOIN agent_ci_access_authorizations c
               ON c.agent_id = a.id AND c.group_id = ANY (n.traversal_ids)
             WHERE p.id = $3) x ON true
         WHERE lower(ap.full_path) = lower($1) AND a.name = $2"
    };
}

/// An agent and what its `ci_access` says of one project.
#[derive(Debug)]
pub struct Authorization {
    pub agent_id: i64,
    /// The agent's configuration project, always authorized.
    pub config_project_id: i64,
    /// The entry naming the project.
    pub project: Option<CiAccessEntry>,
    /// The entries naming an ancestor group, with its depth.
    pub groups: Vec<(usize, CiAccessEntry)>,
}

/// A row of [`authorization_sql`]: all NULL where a left join found no agent.
type AuthorizationRow = (
    Option<i64>,
    Option<i64>,
    Option<i32>,
    Option<Json<CiAccessEntry>>,
);

/// The agent of the rows, if they name one, with its entries.
fn authorization_of(rows: impl IntoIterator<Item = AuthorizationRow>) -> Option<Authorization> {
    let mut found: Option<Authorization> = None;
    for (agent_id, config_project_id, depth, config) in rows {
        let (Some(agent_id), Some(config_project_id)) = (agent_id, config_project_id) else {
            continue;
        };
        let agent = found.get_or_insert_with(|| Authorization {
            agent_id,
            config_project_id,
            project: None,
            groups: Vec::new(),
        });
        match (depth, config) {
            (_, None) => {}
            (None, Some(Json(entry))) => agent.project = Some(entry),
            (Some(depth), Some(Json(entry))) => agent.groups.push((depth as usize, entry)),
        }
    }
    found
}

/// The agent named `<agent_project>:<name>` and its `ci_access` entries for `project_id`, in
/// one round trip; `None` when there is no such agent.
pub async fn authorization(
    conn: &mut PgConnection,
    agent_project: &str,
    name: &str,
    project_id: i64,
) -> Result<Option<Authorization>> {
    let rows: Vec<AuthorizationRow> = sqlx::query_as(authorization_sql!())
        .bind(agent_project)
        .bind(name)
        .bind(project_id)
        .fetch_all(conn)
        .await?;
    Ok(authorization_of(rows))
}

/// What a creation call asks for, for [`check_fresh`] and [`create_fresh`].
pub struct FreshCreation<'a> {
    pub project_full_path: &'a str,
    pub environment: &'a Environment<'a>,
    pub deployment: &'a NewDeployment<'a>,
    /// `<config project path>` and agent name, when the call names an agent.
    pub agent: Option<(&'a str, &'a str)>,
}

/// Whether the creation is a fresh one, and the agent's authorization with it, in one round
/// trip: `None` unless the project is in the mirror as the call names it, no other
/// environment of the project has the environment's name, and the deployment is not known.
/// A fresh creation needs nothing written before it is decided ([`create_fresh`]); any other
/// takes the steps of a transaction (a project created or moved is linked to its groups
/// before its authorization is read, an environment of the same name is deleted, a known
/// deployment is replayed or completed).
pub async fn check_fresh(
    conn: &mut PgConnection,
    c: &FreshCreation<'_>,
) -> Result<Option<Option<Authorization>>> {
    let (agent_project, agent_name) = c.agent.unzip();
    let rows: Vec<FreshRow> = sqlx::query_as_with(
        concat!(
            "SELECT EXISTS (SELECT 1 FROM projects WHERE id = $3 AND path = $4 AND full_path = $5)
                    AND NOT EXISTS (SELECT 1 FROM environments
                                    WHERE project_id = $3 AND name = $6 AND id <> $7)
                    AND NOT EXISTS (SELECT 1 FROM deployments WHERE id = $8) AS fresh,
                    agent.*
             FROM (SELECT) one LEFT JOIN (",
            authorization_sql!(),
            ") agent ON true"
        ),
        reserved(8, 256),
    )
    .bind(agent_project)
    .bind(agent_name)
    .bind(c.deployment.project_id)
    .bind(last_segment(c.project_full_path))
    .bind(c.project_full_path)
    .bind(c.environment.name)
    .bind(c.environment.id)
    .bind(c.deployment.id)
    .fetch_all(conn)
    .await?;
    if !rows.first().is_some_and(|row| row.fresh) {
        return Ok(None);
    }
    Ok(Some(authorization_of(
        rows.into_iter()
            .map(|r| (r.id, r.project_id, r.depth, r.config)),
    )))
}

/// Arguments with room for `count` values of `bytes` in all (each value's 4-byte length
/// included): bound one by one into empty ones, a creation's 30 values grew both of their
/// vectors several times a statement.
fn reserved(count: usize, bytes: usize) -> PgArguments {
    let mut arguments = PgArguments::default();
    arguments.reserve(count, bytes);
    arguments
}

/// A row of [`check_fresh`]: whether the creation is fresh, and a row of [`authorization_sql`].
#[derive(sqlx::FromRow)]
struct FreshRow {
    fresh: bool,
    id: Option<i64>,
    project_id: Option<i64>,
    depth: Option<i32>,
    config: Option<Json<CiAccessEntry>>,
}

/// Writes a fresh creation ([`check_fresh`]) in one statement, and so atomically: the
/// environment, the deployment, its claim with the request and the reason (`creation`), and
/// its `agent_deployments` row when `row` is given (with the history's snapshot queued when
/// the deployment succeeded). Conditional throughout: nothing but the environment is written
/// unless the project is still as the call names it (it is share-locked to the end) and the
/// deployment is inserted here; the claim follows the deployment and the rest the claim. False
/// when nothing was claimed (the project changed, the deployment came meanwhile, or another
/// environment took the name or another request the claim): then the caller takes the
/// transaction's steps.
pub async fn create_fresh(
    conn: &mut PgConnection,
    c: &FreshCreation<'_>,
    creation: &Creation,
    row: Option<&AgentDeployment>,
) -> Result<bool> {
    let (d, env) = (c.deployment, c.environment);
    let result = sqlx::query_scalar_with(
        "WITH project AS (
             SELECT id FROM projects WHERE id = $1 AND path = $2 AND full_path = $3 FOR SHARE
         ), environment AS (
             INSERT INTO environments (id, project_id, name, slug, tier)
             SELECT $4, id, $5, $6, $7 FROM project
             ON CONFLICT (id) DO UPDATE SET project_id = EXCLUDED.project_id, name = EXCLUDED.name,
                 slug = EXCLUDED.slug, tier = COALESCE(EXCLUDED.tier, environments.tier), updated_at = now()
             WHERE (environments.project_id, environments.name, environments.slug, environments.tier)
                   IS DISTINCT FROM (EXCLUDED.project_id, EXCLUDED.name, EXCLUDED.slug,
                                     COALESCE(EXCLUDED.tier, environments.tier))
         ), deployment AS (
             INSERT INTO deployments (id, iid, project_id, environment_id, environment_name, status, ref,
                                      sha, tag, job_id, created_at, status_changed_at, finished_at)
             SELECT $8, $9, id, $4, NULL, $10, $11, $12, $13, $14, COALESCE($15, now()), NULL, NULL
             FROM project
             ON CONFLICT (id) DO NOTHING
             RETURNING id
         ), claim AS (
             INSERT INTO deployment_creations (deployment_id, agent, namespace, flux_resource_path, reason)
             SELECT id, $16, $17, $18, $19 FROM deployment
             RETURNING deployment_id
         ), agent_row AS (
             INSERT INTO agent_deployments (deployment_id, agent_id, kubernetes_namespace, flux_resource_path)
             SELECT deployment_id, $20, $21, $22 FROM claim WHERE $20 IS NOT NULL
             RETURNING deployment_id
         ), snapshot AS (
             INSERT INTO snapshot_jobs (deployment_id)
             SELECT deployment_id FROM agent_row WHERE $10 = 'success'
         )
         SELECT EXISTS (SELECT 1 FROM claim)",
        reserved(22, 512),
    )
    .bind(d.project_id)
    .bind(last_segment(c.project_full_path))
    .bind(c.project_full_path)
    .bind(env.id)
    .bind(env.name)
    .bind(env.slug)
    .bind(env.tier)
    .bind(d.id)
    .bind(d.iid)
    .bind(d.report.status.as_str())
    .bind(d.git_ref)
    .bind(d.sha)
    .bind(d.tag)
    .bind(d.job_id)
    .bind(d.created_at)
    .bind(&creation.agent)
    .bind(&creation.namespace)
    .bind(&creation.flux_resource_path)
    .bind(&creation.reason)
    .bind(row.map(|r| r.agent_id))
    .bind(row.map(|r| &r.kubernetes_namespace))
    .bind(row.and_then(|r| r.flux_resource_path.as_deref()))
    .fetch_one(conn)
    .await;
    match result {
        Ok(claimed) => Ok(claimed),
        // The statement wrote nothing: another environment took the name, or a request that
        // took the steps claimed the deployment meanwhile (unique violation, deadlock).
        Err(sqlx::Error::Database(e)) if matches!(e.code().as_deref(), Some("23505" | "40P01")) => {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
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
