//! SQL of GitOps environments (SPEC 15): the agent GitLab's environments API names for an
//! environment (`environment_agents`), and pull-based deployments (`pull_deployments`): what a
//! bound Flux object applied, recorded once per revision change, and its GitLab side.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgExecutor, PgPool};

use crate::db::read;
use crate::error::Result;

/// GitLab's `cluster_agent` of an environment as the sync decided it: the agent row to use, or
/// why not.
pub struct EnvironmentAgent<'a> {
    pub environment_id: i64,
    pub reference: &'a str,
    /// `Ok((agent id, namespace))` when `ci_access` lets the project use it.
    pub decision: std::result::Result<(i64, &'a str), &'a str>,
    pub flux_resource_path: Option<&'a str>,
}

/// Writes the environment's agent as GitLab names it (nothing when unchanged).
pub async fn put_environment_agent(
    conn: &mut PgConnection,
    a: &EnvironmentAgent<'_>,
) -> Result<()> {
    let (agent_id, namespace, reason) = match a.decision {
        Ok((agent, namespace)) => (Some(agent), Some(namespace), None),
        Err(reason) => (None, None, Some(reason)),
    };
    sqlx::query(
        "INSERT INTO environment_agents AS x (environment_id, agent_id, kubernetes_namespace,
                                              flux_resource_path, agent_reference, reason)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (environment_id) DO UPDATE SET agent_id = $2, kubernetes_namespace = $3,
             flux_resource_path = $4, agent_reference = $5, reason = $6, updated_at = now()
         WHERE (x.agent_id, x.kubernetes_namespace, x.flux_resource_path, x.agent_reference, x.reason)
               IS DISTINCT FROM ($2, $3, $4, $5, $6)",
    )
    .bind(a.environment_id)
    .bind(agent_id)
    .bind(namespace)
    .bind(a.flux_resource_path)
    .bind(a.reference)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// GitLab names no agent for the environment (any more).
pub async fn remove_environment_agent(conn: &mut PgConnection, environment_id: i64) -> Result<()> {
    sqlx::query("DELETE FROM environment_agents WHERE environment_id = $1")
        .bind(environment_id)
        .execute(conn)
        .await?;
    Ok(())
}

/// The agent of environments without a successful deployment through one: GitLab's
/// `cluster_agent`, when `ci_access` allowed it. `(environment id, agent id, namespace, Flux
/// resource path)`.
pub async fn environment_agents(
    db: impl PgExecutor<'_>,
    environment_ids: &[i64],
) -> Result<Vec<(i64, i64, String, Option<String>)>> {
    Ok(sqlx::query_as(
        "SELECT environment_id, agent_id, kubernetes_namespace, flux_resource_path
         FROM environment_agents WHERE environment_id = ANY ($1) AND agent_id IS NOT NULL",
    )
    .bind(environment_ids)
    .fetch_all(db)
    .await?)
}

/// The agent GitLab names for one environment without a successful deployment through one
/// ([`environment_agents`]), as a deployment's agent is read (`read::last_deployments`): its
/// row (`deployment_id` 0: no deployment), the agent, and the agent's project as `viewer`
/// may read it. What a subscription follows where a view reads `Environment::last_agent`.
pub async fn environment_agent(
    conn: &mut PgConnection,
    viewer: read::Viewer,
    environment_id: i64,
) -> Result<Option<(read::AgentDeploymentRow, read::AgentRow, read::ProjectRow)>> {
    let named = environment_agents(&mut *conn, &[environment_id]).await?;
    let Some((_, agent_id, kubernetes_namespace, flux_resource_path)) = named.into_iter().next()
    else {
        return Ok(None);
    };
    let Some(agent) = read::agents(&mut *conn, &[agent_id]).await?.pop() else {
        return Ok(None);
    };
    let Some(project) = read::projects(&mut *conn, viewer, &[agent.project_id])
        .await?
        .pop()
    else {
        return Ok(None);
    };
    let row = read::AgentDeploymentRow {
        deployment_id: 0,
        agent_id,
        kubernetes_namespace,
        flux_resource_path,
    };
    Ok(Some((row, agent, project)))
}

/// Why GitLab's `cluster_agent` of the environment is not used, if it is not.
pub async fn environment_agent_refusal(
    db: impl PgExecutor<'_>,
    environment_id: i64,
) -> Result<Option<(String, String)>> {
    Ok(sqlx::query_as(
        "SELECT agent_reference, reason FROM environment_agents
         WHERE environment_id = $1 AND reason IS NOT NULL",
    )
    .bind(environment_id)
    .fetch_optional(db)
    .await?)
}

/// An environment bound to a Flux object, through its agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash, sqlx::FromRow)]
pub struct Bound {
    pub environment_id: i64,
    pub project_id: i64,
    pub environment: String,
    pub agent_id: i64,
    pub agent_project_path: String,
    pub agent_name: String,
    pub namespace: String,
    pub flux_resource_path: String,
}

/// Every available environment bound to a Flux object: the agent, namespace and Flux resource
/// path of its last successful deployment through an agent, else GitLab's `cluster_agent`.
pub async fn bound(db: impl PgExecutor<'_>) -> Result<Vec<Bound>> {
    Ok(sqlx::query_as(
        "SELECT e.id AS environment_id, e.project_id, e.name AS environment, a.id AS agent_id,
                p.full_path AS agent_project_path, a.name AS agent_name, b.namespace,
                b.flux_resource_path
         FROM environments e
         JOIN LATERAL (
             SELECT * FROM (
                 (SELECT 0 AS rank, ad.agent_id, ad.kubernetes_namespace AS namespace, ad.flux_resource_path
                  FROM deployments d JOIN agent_deployments ad ON ad.deployment_id = d.id
                  WHERE d.environment_id = e.id AND d.status = 'success'
                  ORDER BY d.id DESC LIMIT 1)
                 UNION ALL
                 SELECT 1, x.agent_id, x.kubernetes_namespace, x.flux_resource_path
                 FROM environment_agents x WHERE x.environment_id = e.id AND x.agent_id IS NOT NULL
             ) c ORDER BY rank LIMIT 1
         ) b ON b.flux_resource_path IS NOT NULL
         JOIN cluster_agents a ON a.id = b.agent_id
         JOIN projects p ON p.id = a.project_id
         WHERE e.state = 'available'
         ORDER BY e.id",
    )
    .fetch_all(db)
    .await?)
}

/// A revision a bound Flux object applied.
pub struct Applied<'a> {
    pub bound: &'a Bound,
    pub revision: &'a str,
    /// The object's `metadata.resourceVersion`, as a number (etcd's revision, as every API
    /// server backed by etcd writes it), when it is one.
    pub resource_version: Option<i64>,
    pub sha: Option<&'a str>,
    pub git_ref: Option<&'a str>,
    pub tag: bool,
    /// Why GitLab is not told, when it is not.
    pub gitlab_reason: Option<&'a str>,
}

/// Records the revision as a `running` deployment of the environment (its agent, namespace,
/// snapshot job, and GitLab's creation when it is to be told), unless it is the environment's
/// last recorded revision. The environment's row is locked first, so that replicas and a
/// restart record a revision once; a look older than the recorded one (by the object's
/// resourceVersion: a lagging cache, another replica's) records nothing either. envlens' own (negative) id and the follow-up that tells
/// GitLab, or `None` when nothing was recorded.
pub async fn record(
    conn: &mut PgConnection,
    a: &Applied<'_>,
) -> Result<Option<(i64, Option<i64>)>> {
    let b = a.bound;
    let locked: Option<i64> =
        sqlx::query_scalar("SELECT id FROM environments WHERE id = $1 FOR UPDATE")
            .bind(b.environment_id)
            .fetch_optional(&mut *conn)
            .await?;
    if locked.is_none() {
        return Ok(None);
    }
    let last: Option<(String, Option<i64>)> = sqlx::query_as(
        "SELECT revision, resource_version FROM pull_deployments WHERE environment_id = $1
         ORDER BY own_id LIMIT 1",
    )
    .bind(b.environment_id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some((revision, seen)) = last {
        let older = seen
            .zip(a.resource_version)
            .is_some_and(|(seen, now)| now <= seen);
        if revision == a.revision || older {
            return Ok(None);
        }
    }
    let id: i64 = sqlx::query_scalar("SELECT -nextval('pull_deployment_ids')")
        .fetch_one(&mut *conn)
        .await?;
    sqlx::query(
        "INSERT INTO deployments (id, project_id, environment_id, status, ref, sha, tag, status_changed_at)
         VALUES ($1, $2, $3, 'running', $4, $5, $6, now())",
    )
    .bind(id)
    .bind(b.project_id)
    .bind(b.environment_id)
    .bind(a.git_ref)
    .bind(a.sha)
    .bind(a.tag)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO agent_deployments (deployment_id, agent_id, kubernetes_namespace, flux_resource_path)
         VALUES ($1, $2, $3, $4)",
    )
    .bind(id)
    .bind(b.agent_id)
    .bind(&b.namespace)
    .bind(&b.flux_resource_path)
    .execute(&mut *conn)
    .await?;
    // Decided: a success hook of GitLab's for it looks nothing up.
    sqlx::query(
        "INSERT INTO deployment_creations (deployment_id, agent, namespace) VALUES ($1, $2, $3)",
    )
    .bind(id)
    .bind(format!("{}:{}", b.agent_project_path, b.agent_name))
    .bind(&b.namespace)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO pull_deployments (deployment_id, own_id, environment_id, source, revision,
                                       resource_version, gitlab_reason)
         VALUES ($1, $1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(b.environment_id)
    .bind(&b.flux_resource_path)
    .bind(a.revision)
    .bind(a.resource_version)
    .bind(a.gitlab_reason)
    .execute(&mut *conn)
    .await?;
    // The first snapshot now, the settled one when the group is healthy (SPEC 10).
    sqlx::query("INSERT INTO snapshot_jobs (deployment_id) VALUES ($1)")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    let followup = match a.gitlab_reason {
        None => add_followup(conn, PULL_CREATE, b.project_id, id).await?,
        Some(_) => None,
    };
    Ok(Some((id, followup)))
}

/// The follow-up that creates a pull-based deployment in GitLab.
pub const PULL_CREATE: &str = "pull_create";
/// The follow-up that gives GitLab a pull-based deployment's final status.
pub const PULL_FINISH: &str = "pull_finish";

/// A pull-based deployment as its GitLab side needs it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Pull {
    pub deployment_id: i64,
    pub own_id: i64,
    pub project_id: i64,
    pub environment: String,
    pub status: String,
    pub git_ref: Option<String>,
    pub sha: Option<String>,
    pub tag: Option<bool>,
    pub gitlab_id: Option<i64>,
    pub gitlab_reason: Option<String>,
}

/// The pull-based deployment whose own id is `own_id`.
pub async fn pull(db: impl PgExecutor<'_>, own_id: i64) -> Result<Option<Pull>> {
    Ok(sqlx::query_as(
        "SELECT x.deployment_id, x.own_id, d.project_id, e.name AS environment, d.status,
                d.ref AS git_ref, d.sha, d.tag, x.gitlab_id, x.gitlab_reason
         FROM pull_deployments x JOIN deployments d ON d.id = x.deployment_id
         JOIN environments e ON e.id = x.environment_id
         WHERE x.own_id = $1",
    )
    .bind(own_id)
    .fetch_optional(db)
    .await?)
}

/// Whether deployment `id` is a pull-based one: its own id then.
pub async fn own_id(db: impl PgExecutor<'_>, deployment_id: i64) -> Result<Option<i64>> {
    Ok(
        sqlx::query_scalar("SELECT own_id FROM pull_deployments WHERE deployment_id = $1")
            .bind(deployment_id)
            .fetch_optional(db)
            .await?,
    )
}

/// Keeps GitLab's id of the deployment, as soon as GitLab answered (before the id changes, so
/// that a retry never creates it twice).
pub async fn set_gitlab_id(db: &PgPool, own_id: i64, gitlab_id: i64) -> Result<()> {
    sqlx::query(
        "UPDATE pull_deployments SET gitlab_id = $2 WHERE own_id = $1 AND gitlab_id IS NULL",
    )
    .bind(own_id)
    .bind(gitlab_id)
    .execute(db)
    .await?;
    Ok(())
}

/// The deployment takes GitLab's id (what refers to it follows). A deployment GitLab's hook
/// made of it first (same id, no job) is the same deployment: it goes. True when it moved.
pub async fn take_gitlab_id(conn: &mut PgConnection, own_id: i64, gitlab_id: i64) -> Result<bool> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(gitlab_id)
        .execute(&mut *conn)
        .await?;
    let current: Option<i64> = sqlx::query_scalar(
        "SELECT deployment_id FROM pull_deployments WHERE own_id = $1 FOR UPDATE",
    )
    .bind(own_id)
    .fetch_optional(&mut *conn)
    .await?;
    if current != Some(own_id) {
        return Ok(false);
    }
    sqlx::query("DELETE FROM deployments WHERE id = $1 AND job_id IS NULL")
        .bind(gitlab_id)
        .execute(&mut *conn)
        .await?;
    sqlx::query("UPDATE deployments SET id = $2, updated_at = now() WHERE id = $1")
        .bind(own_id)
        .bind(gitlab_id)
        .execute(&mut *conn)
        .await?;
    Ok(true)
}

/// The pull-based deployment ends with `status` (`success`, `failed`, `canceled`) unless it
/// ended already; GitLab is told in the same transaction when it was told of its creation.
/// True when it ended now.
pub async fn finish(conn: &mut PgConnection, deployment_id: i64, status: &str) -> Result<bool> {
    let now: DateTime<Utc> = Utc::now();
    let ended: Option<(i64, i64, bool)> = sqlx::query_as(
        "UPDATE deployments d SET status = $2, status_changed_at = $3, finished_at = $3, updated_at = $3
         FROM pull_deployments x
         WHERE d.id = $1 AND x.deployment_id = d.id AND d.status IN ('created', 'running')
         RETURNING x.own_id, d.project_id, x.gitlab_reason IS NULL",
    )
    .bind(deployment_id)
    .bind(status)
    .bind(now)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((own_id, project_id, told)) = ended else {
        return Ok(false);
    };
    if told {
        add_followup(conn, PULL_FINISH, project_id, own_id).await?;
    }
    Ok(true)
}

/// Keeps GitLab's side of a pull-based deployment (`pull_create` or `pull_finish`): the
/// follow-up's id, `None` when one was kept before.
pub async fn add_followup(
    conn: &mut PgConnection,
    kind: &str,
    project_id: i64,
    own_id: i64,
) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar(
        "INSERT INTO gitlab_followups (kind, project_id, deployment_id) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(kind)
    .bind(project_id)
    .bind(own_id)
    .fetch_optional(conn)
    .await?)
}

/// Every pull-based deployment of the environment with its revision, newest first (tests,
/// `envlens` views).
pub async fn revisions(
    db: impl PgExecutor<'_>,
    environment_id: i64,
) -> Result<Vec<(i64, String, String)>> {
    Ok(sqlx::query_as(
        "SELECT x.deployment_id, x.revision, d.status FROM pull_deployments x
         JOIN deployments d ON d.id = x.deployment_id
         WHERE x.environment_id = $1 ORDER BY x.own_id",
    )
    .bind(environment_id)
    .fetch_all(db)
    .await?)
}

/// What made deployment `id`, when Flux did: `(source, revision, why GitLab was not told)`.
pub async fn made_by_flux(
    db: impl PgExecutor<'_>,
    deployment_id: i64,
) -> Result<Option<(String, String, Option<String>)>> {
    Ok(sqlx::query_as(
        "SELECT source, revision, gitlab_reason FROM pull_deployments WHERE deployment_id = $1",
    )
    .bind(deployment_id)
    .fetch_optional(db)
    .await?)
}
