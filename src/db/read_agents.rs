//! SQL of GraphQL's agent fields (SPEC 5.1, GitLab's frontend): an agent's tokens, the
//! agents that `ci_access` or `user_access` authorize for a project, and what decides who may
//! read an agent (SPEC 13), each loaded in one statement for many keys; and what the
//! dashboard's agent page shows of one agent. The decisions over these rows are
//! `gitlab::access`'s.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{FromRow, PgExecutor};

use super::agents::{user_access_entries, UserAccessRow, ENTRY_ACCESS_LEVEL};
use super::read::{AgentRow, Viewer, READABLE, VISIBLE_GROUP};
use crate::error::Result;
use crate::gitlab::access::AgentReaders;

#[derive(Debug, Clone, FromRow)]
pub struct TokenRow {
    pub agent_id: i64,
    pub id: i64,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
}

/// Up to `limit` active tokens of each agent, by id after `after`. Whoever asks must have
/// found that the viewer may read the agents ([`agent_readers`]).
pub async fn active_tokens(
    db: impl PgExecutor<'_>,
    agent_ids: &[i64],
    after: Option<i64>,
    limit: i64,
) -> Result<Vec<TokenRow>> {
    Ok(sqlx::query_as(
        "SELECT t.agent_id, t.id, t.name, t.description, t.status, t.created_at, t.last_used_at
         FROM UNNEST($1::bigint[]) AS k(agent_id)
         CROSS JOIN LATERAL (
             SELECT * FROM cluster_agent_tokens t
             WHERE t.agent_id = k.agent_id AND t.status = 'active' AND ($2::bigint IS NULL OR t.id > $2)
             ORDER BY t.id LIMIT $3) t
         ORDER BY t.agent_id, t.id",
    )
    .bind(agent_ids)
    .bind(after)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// What GitLab's `read_cluster_agent` looks at, for one agent and the viewer: their access to
/// the agent's project, their best access to a project its `ci_access` authorizes, and its
/// `user_access` entries with their access to each (as the proxy's check reads them).
#[derive(Debug, FromRow)]
pub struct AgentReaderRow {
    pub agent_id: i64,
    pub project_level: Option<i32>,
    pub ci_access_level: Option<i32>,
    /// `[{project_id, group_id, access_as, access_level}]`.
    pub user_access: sqlx::types::Json<Vec<UserAccessRow>>,
}

impl AgentReaderRow {
    /// The row as `gitlab::access::read_cluster_agent` takes it.
    pub fn readers(&self) -> AgentReaders {
        let (access_as, user_access) = user_access_entries(&self.user_access);
        AgentReaders {
            project_level: self.project_level,
            ci_access_level: self.ci_access_level,
            access_as,
            user_access,
        }
    }
}

/// The viewer's access through a membership `m` to a project that agent `a`'s `ci_access`
/// authorizes (GitLab's `all_ci_access_authorized_projects_for` and `..._namespaces_for`):
/// true when `m` covers such a project. Walks from the viewer's few memberships, so that a
/// group entry over thousands of projects costs one index probe: a project entry is the
/// member's project or below the member's group; a group entry is above the member's project,
/// or above or below the member's group with a project below the lower of the two.
const COVERS_CI_ACCESS_PROJECT: &str = "EXISTS (
    SELECT 1 FROM agent_ci_access_authorizations x
    LEFT JOIN projects xp ON xp.id = x.project_id
    LEFT JOIN namespaces xpn ON xpn.id = xp.namespace_id
    LEFT JOIN namespaces xg ON xg.id = x.group_id
    LEFT JOIN projects mp ON m.source_type = 'project' AND mp.id = m.source_id
    LEFT JOIN namespaces mpn ON mpn.id = mp.namespace_id
    LEFT JOIN namespaces mg ON m.source_type = 'group' AND mg.id = m.source_id
    WHERE x.agent_id = a.id AND (
        (xp.id IS NOT NULL AND (xp.id = mp.id OR mg.id = ANY (xpn.traversal_ids)))
     OR (xg.id IS NOT NULL AND xg.id = ANY (mpn.traversal_ids))
     OR (xg.id IS NOT NULL AND mg.id IS NOT NULL AND EXISTS (
            SELECT 1 FROM namespaces dn JOIN projects dp ON dp.namespace_id = dn.id
            WHERE (xg.id = ANY (mg.traversal_ids) AND dn.traversal_ids @> ARRAY[mg.id])
               OR (mg.id = ANY (xg.traversal_ids) AND dn.traversal_ids @> ARRAY[xg.id])))))";

/// What decides whether the viewer may read each of `agent_ids`, in one statement; agents
/// that do not exist have no row.
pub async fn agent_readers(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    agent_ids: &[i64],
) -> Result<Vec<AgentReaderRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT a.id AS agent_id,
            (SELECT max(m.access_level) FROM members m
             WHERE m.user_id = u.id AND ((m.source_type = 'project' AND m.source_id = p.id)
                OR (m.source_type = 'group' AND m.source_id = ANY (n.traversal_ids)))) AS project_level,
            (SELECT max(m.access_level) FROM members m
             WHERE m.user_id = u.id AND {COVERS_CI_ACCESS_PROJECT}) AS ci_access_level,
            COALESCE((SELECT jsonb_agg(jsonb_build_object(
                'project_id', x.project_id, 'group_id', x.group_id,
                'access_as', x.config -> 'access_as', 'access_level', {ENTRY_ACCESS_LEVEL}))
             FROM agent_user_access_authorizations x WHERE x.agent_id = a.id), '[]') AS user_access
         FROM UNNEST($2::bigint[]) AS k(id)
         JOIN cluster_agents a ON a.id = k.id
         JOIN projects p ON p.id = a.project_id LEFT JOIN namespaces n ON n.id = p.namespace_id
         JOIN users u ON u.id = $1"
    ))
    .bind(viewer.user_id)
    .bind(agent_ids)
    .fetch_all(db)
    .await?)
}

/// One `ci_access` authorization that may apply to a project: the project's own entry
/// (`kind` `project`), the agent's configuration project (`config`, no entry), or an entry of
/// an ancestor group (`group`, with the group's depth, 1 for the top level).
#[derive(Debug, Clone, FromRow)]
pub struct CiAuthorizationRow {
    /// The project asked about.
    pub for_project_id: i64,
    #[sqlx(flatten)]
    pub agent: AgentRow,
    pub kind: String,
    pub depth: Option<i32>,
    /// The entry's configuration as GitLab shows it: without its `id`; `{}` for the
    /// configuration project.
    pub config: Value,
}

/// Every `ci_access` authorization of every agent that may apply to each of `project_ids`.
pub async fn ci_authorizations(
    db: impl PgExecutor<'_>,
    project_ids: &[i64],
) -> Result<Vec<CiAuthorizationRow>> {
    Ok(sqlx::query_as(
        "SELECT k.project_id AS for_project_id, a.id, a.project_id, a.name, a.created_at,
                CASE WHEN x.project_id IS NOT NULL THEN 'project' ELSE 'group' END AS kind,
                array_position(n.traversal_ids, x.group_id) AS depth, x.config - 'id' AS config
         FROM UNNEST($1::bigint[]) AS k(project_id)
         JOIN projects p ON p.id = k.project_id LEFT JOIN namespaces n ON n.id = p.namespace_id
         JOIN agent_ci_access_authorizations x
           ON x.project_id = p.id OR x.group_id = ANY (n.traversal_ids)
         JOIN cluster_agents a ON a.id = x.agent_id
         UNION ALL
         SELECT k.project_id, a.id, a.project_id, a.name, a.created_at, 'config', NULL, '{}'::jsonb
         FROM UNNEST($1::bigint[]) AS k(project_id)
         JOIN cluster_agents a ON a.project_id = k.project_id
         ORDER BY 1, 2",
    )
    .bind(project_ids)
    .fetch_all(db)
    .await?)
}

/// One `user_access` entry of an agent that covers a project, with the viewer's access to what
/// it names: the project's own entry, or an entry of one of its ancestor groups.
#[derive(Debug, Clone, FromRow)]
pub struct UserAuthorizationRow {
    /// The project asked about.
    pub for_project_id: i64,
    #[sqlx(flatten)]
    pub agent: AgentRow,
    /// `project` or `group`.
    pub kind: String,
    /// The project's or the group's id.
    pub source_id: i64,
    pub access_level: Option<i32>,
    pub config: Value,
}

/// Every `user_access` entry that covers each of `project_ids`, per project and agent the
/// project's own entry first, then its groups' from the nearest.
pub async fn user_authorizations(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    project_ids: &[i64],
) -> Result<Vec<UserAuthorizationRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT k.project_id AS for_project_id, a.id, a.project_id, a.name, a.created_at,
                CASE WHEN x.project_id IS NOT NULL THEN 'project' ELSE 'group' END AS kind,
                COALESCE(x.project_id, x.group_id) AS source_id,
                {ENTRY_ACCESS_LEVEL} AS access_level, x.config
         FROM UNNEST($2::bigint[]) AS k(project_id)
         JOIN active_users u ON u.id = $1
         JOIN projects p ON p.id = k.project_id LEFT JOIN namespaces n ON n.id = p.namespace_id
         JOIN agent_user_access_authorizations x
           ON x.project_id = p.id OR x.group_id = ANY (n.traversal_ids)
         JOIN cluster_agents a ON a.id = x.agent_id
         ORDER BY k.project_id, a.id, x.project_id IS NULL,
                  array_position(n.traversal_ids, x.group_id) DESC"
    ))
    .bind(viewer.user_id)
    .bind(project_ids)
    .fetch_all(db)
    .await?)
}

/// An agent named by its configuration project's path and its name.
#[derive(Debug, Clone, FromRow)]
pub struct NamedAgent {
    pub id: i64,
    pub name: String,
    pub project_full_path: String,
}

/// The agent `name` of the project at `project_full_path`, whoever asks: the caller decides
/// whether the viewer may read it ([`agent_readers`]).
pub async fn agent_by_path(
    db: impl PgExecutor<'_>,
    project_full_path: &str,
    name: &str,
) -> Result<Option<NamedAgent>> {
    Ok(sqlx::query_as(
        "SELECT a.id, a.name, p.full_path AS project_full_path
         FROM projects p JOIN cluster_agents a ON a.project_id = p.id
         WHERE lower(p.full_path) = lower($1) AND a.name = $2",
    )
    .bind(project_full_path)
    .bind(name)
    .fetch_optional(db)
    .await?)
}

/// A group or project that an agent's `ci_access` or `user_access` section names.
#[derive(Debug, Clone, FromRow)]
pub struct AgentGrantRow {
    /// `ci_access` or `user_access`.
    pub section: String,
    /// `group` or `project`.
    pub kind: String,
    pub full_path: String,
}

/// The groups and projects the agent's `ci_access` and `user_access` sections name, those the
/// viewer sees only (a project they may read, a group [`super::read::visible_group`] shows
/// them): the others are as if they were not listed. By section, kind and path.
pub async fn agent_grants(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    agent_id: i64,
) -> Result<Vec<AgentGrantRow>> {
    Ok(sqlx::query_as(&format!(
        "WITH entries AS (
            SELECT 'ci_access' AS section, project_id, group_id
            FROM agent_ci_access_authorizations WHERE agent_id = $3
            UNION ALL
            SELECT 'user_access', project_id, group_id
            FROM agent_user_access_authorizations WHERE agent_id = $3)
         SELECT e.section, 'project' AS kind, p.full_path FROM entries e
         JOIN projects p ON p.id = e.project_id LEFT JOIN namespaces n ON n.id = p.namespace_id
         WHERE {READABLE}
         UNION
         SELECT e.section, 'group', g.full_path FROM entries e JOIN namespaces g ON g.id = e.group_id
         WHERE {visible}
         ORDER BY 1, 2, 3",
        visible = *VISIBLE_GROUP
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(agent_id)
    .fetch_all(db)
    .await?)
}

/// An environment whose last successful deployment went through an agent, with that
/// deployment's namespace and the environment's newest deployment.
#[derive(Debug, Clone, FromRow)]
pub struct AgentEnvironmentRow {
    pub project_full_path: String,
    pub name: String,
    pub tier: Option<String>,
    pub kubernetes_namespace: String,
    pub iid: Option<i64>,
    pub status: Option<String>,
    #[sqlx(rename = "ref")]
    pub git_ref: Option<String>,
    pub sha: Option<String>,
    pub created_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The environments the agent serves now (their last successful deployment went through it,
/// as `Environment.clusterAgent` says) in projects the viewer may read, by project and name;
/// `limit` at most. Starts from the agent's deployments (`agent_deployments_agent_id_idx`).
pub async fn agent_environments(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    agent_id: i64,
    limit: i64,
) -> Result<Vec<AgentEnvironmentRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT p.full_path AS project_full_path, e.name, e.tier, ad.kubernetes_namespace,
                l.iid, l.status, l.ref, l.sha, l.created_at, l.finished_at
         FROM (SELECT DISTINCT d.environment_id FROM agent_deployments x
               JOIN deployments d ON d.id = x.deployment_id
               WHERE x.agent_id = $3 AND d.status = 'success') k
         JOIN environments e ON e.id = k.environment_id
         JOIN projects p ON p.id = e.project_id LEFT JOIN namespaces n ON n.id = p.namespace_id
         CROSS JOIN LATERAL (SELECT s.id FROM deployments s
                             WHERE s.environment_id = e.id AND s.status = 'success'
                             ORDER BY s.id DESC LIMIT 1) s
         JOIN agent_deployments ad ON ad.deployment_id = s.id AND ad.agent_id = $3
         LEFT JOIN LATERAL (SELECT d.iid, d.status, d.ref, d.sha, d.created_at, d.finished_at
                            FROM deployments d WHERE d.environment_id = e.id
                            ORDER BY d.id DESC LIMIT 1) l ON true
         WHERE {READABLE}
         ORDER BY lower(p.full_path), e.name LIMIT $4"
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(agent_id)
    .bind(limit)
    .fetch_all(db)
    .await?)
}
