//! SQL of GraphQL's agent fields (SPEC 5.1, GitLab's frontend): an agent's tokens, and the
//! agents that `ci_access` or `user_access` authorize for a project, each loaded in one
//! statement for many keys. The decisions over these rows are `gitlab::access`'s.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{FromRow, PgExecutor};

use super::agents::ENTRY_ACCESS_LEVEL;
use super::read::{AgentRow, Viewer};
use crate::error::Result;

/// Developer (30) or more through the project or an ancestor group, or an admin: GitLab's
/// `read_cluster`, which its `ClusterAgent.tokens` needs. `$1` is the user id, `$2` whether
/// they are an admin; `p` is the agent's project and `n` its group.
const DEVELOPER: &str = "($2::bool OR EXISTS (
    SELECT 1 FROM members m WHERE m.user_id = $1 AND m.access_level >= 30
      AND ((m.source_type = 'project' AND m.source_id = p.id)
        OR (m.source_type = 'group' AND m.source_id = ANY (n.traversal_ids)))))";

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

/// Up to `limit` active tokens of each agent, by id after `after`, for agents whose project
/// the viewer may administer clusters of (none for the others, as GitLab answers).
pub async fn active_tokens(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    agent_ids: &[i64],
    after: Option<i64>,
    limit: i64,
) -> Result<Vec<TokenRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT t.agent_id, t.id, t.name, t.description, t.status, t.created_at, t.last_used_at
         FROM UNNEST($3::bigint[]) AS k(agent_id)
         JOIN cluster_agents a ON a.id = k.agent_id
         JOIN projects p ON p.id = a.project_id LEFT JOIN namespaces n ON n.id = p.namespace_id
         CROSS JOIN LATERAL (
             SELECT * FROM cluster_agent_tokens t
             WHERE t.agent_id = k.agent_id AND t.status = 'active' AND ($4::bigint IS NULL OR t.id > $4)
             ORDER BY t.id LIMIT $5) t
         WHERE {DEVELOPER}
         ORDER BY t.agent_id, t.id"
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(agent_ids)
    .bind(after)
    .bind(limit)
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
