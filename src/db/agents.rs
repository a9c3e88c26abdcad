//! SQL of cluster agents and their resolved `ci_access` / `user_access` authorizations.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgExecutor};

use super::violated_constraint;
use crate::error::{Error, Result};
use crate::gitlab::access::{AccessAs, SourceKind, UserAccessEntry};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Agent {
    pub id: i64,
    pub project_id: i64,
    pub name: String,
    /// The full path of the agent's configuration project.
    pub project_full_path: String,
}

pub async fn find(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Agent>> {
    Ok(sqlx::query_as(
        "SELECT a.id, a.project_id, a.name, p.full_path AS project_full_path
         FROM cluster_agents a JOIN projects p ON p.id = a.project_id WHERE a.id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// Every registered agent, by id (at most `limit`).
pub async fn all(db: impl PgExecutor<'_>, limit: i64) -> Result<Vec<Agent>> {
    Ok(sqlx::query_as(
        "SELECT a.id, a.project_id, a.name, p.full_path AS project_full_path
         FROM cluster_agents a JOIN projects p ON p.id = a.project_id ORDER BY a.id LIMIT $1",
    )
    .bind(limit)
    .fetch_all(db)
    .await?)
}

pub async fn project_exists(db: impl PgExecutor<'_>, id: i64) -> Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM projects WHERE id = $1)")
            .bind(id)
            .fetch_one(db)
            .await?,
    )
}

/// Registers or updates an agent; true when it is new.
pub async fn upsert(db: impl PgExecutor<'_>, id: i64, project_id: i64, name: &str) -> Result<bool> {
    sqlx::query_scalar(
        "INSERT INTO cluster_agents (id, project_id, name) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO UPDATE SET project_id = EXCLUDED.project_id, name = EXCLUDED.name, updated_at = now()
         RETURNING (xmax = 0)",
    )
    .bind(id)
    .bind(project_id)
    .bind(name)
    .fetch_one(db)
    .await
    .map_err(|e| match violated_constraint(&e) {
        Some("cluster_agents_project_id_name_key") => {
            Error::Conflict(format!("project {project_id} already has another agent named `{name}`"))
        }
        _ => e.into(),
    })
}

/// Ids of the paths (lower-cased) that name a project (`groups` false) or group inside the
/// top-level namespace `root`, in the order of `paths`; `None` where nothing matches.
pub async fn resolve(
    conn: &mut PgConnection,
    groups: bool,
    root: &str,
    paths: &[String],
) -> Result<Vec<Option<i64>>> {
    let table = if groups { "namespaces" } else { "projects" };
    let found: Vec<Option<i64>> = sqlx::query_scalar(&format!(
        "SELECT t.id FROM UNNEST($1::text[]) WITH ORDINALITY AS w(path, ord)
         LEFT JOIN {table} t ON lower(t.full_path) = w.path AND split_part(lower(t.full_path), '/', 1) = $2
         ORDER BY w.ord"
    ))
    .bind(paths)
    .bind(root)
    .fetch_all(conn)
    .await?;
    Ok(found)
}

/// One resolved entry: a project or a group id, and the entry's configuration.
pub struct Authorization {
    pub project_id: Option<i64>,
    pub group_id: Option<i64>,
    pub config: Value,
}

/// Stores the configuration and replaces both sets of authorizations.
pub async fn replace_configuration(
    conn: &mut PgConnection,
    agent_id: i64,
    config: &Value,
    ci_access: &[Authorization],
    user_access: &[Authorization],
) -> Result<()> {
    sqlx::query("UPDATE cluster_agents SET config = $2, updated_at = now() WHERE id = $1")
        .bind(agent_id)
        .bind(config)
        .execute(&mut *conn)
        .await?;
    for (table, rows) in [
        ("agent_ci_access_authorizations", ci_access),
        ("agent_user_access_authorizations", user_access),
    ] {
        sqlx::query(&format!("DELETE FROM {table} WHERE agent_id = $1"))
            .bind(agent_id)
            .execute(&mut *conn)
            .await?;
        let project_ids: Vec<Option<i64>> = rows.iter().map(|r| r.project_id).collect();
        let group_ids: Vec<Option<i64>> = rows.iter().map(|r| r.group_id).collect();
        let configs: Vec<Value> = rows.iter().map(|r| r.config.clone()).collect();
        sqlx::query(&format!(
            "INSERT INTO {table} (agent_id, project_id, group_id, config)
             SELECT $1, * FROM UNNEST($2::bigint[], $3::bigint[], $4::jsonb[])"
        ))
        .bind(agent_id)
        .bind(&project_ids)
        .bind(&group_ids)
        .bind(&configs)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The access level of the user `u` to what the `user_access` entry `x` names, as the decision
/// needs it: their effective access to a project (its own membership or an ancestor group's),
/// or their membership of a group or one of its ancestors (a subgroup's does not count); NULL
/// for none. Shared by the proxy's check (5.2) and GraphQL's `userAccessAuthorizedAgents`.
pub(crate) const ENTRY_ACCESS_LEVEL: &str = "CASE WHEN x.project_id IS NOT NULL THEN
        (SELECT max(m.access_level) FROM members m
         WHERE m.user_id = u.id AND (
            (m.source_type = 'project' AND m.source_id = x.project_id)
            OR (m.source_type = 'group' AND m.source_id = ANY (
                SELECT unnest(n.traversal_ids) FROM projects xp
                JOIN namespaces n ON n.id = xp.namespace_id WHERE xp.id = x.project_id))))
    ELSE
        (SELECT max(m.access_level) FROM members m JOIN namespaces g ON g.id = x.group_id
         WHERE m.user_id = u.id AND m.source_type = 'group'
           AND m.source_id = ANY (g.traversal_ids))
    END";

/// What the `user_access` decision needs, in one statement: the agent, the user, and each
/// `user_access` entry with the user's access to what it names.
#[derive(Debug, sqlx::FromRow)]
pub struct UserAccessRows {
    #[sqlx(flatten)]
    pub agent: Agent,
    pub username: String,
    pub admin: bool,
    pub entries: sqlx::types::Json<Vec<UserAccessRow>>,
}

#[derive(Debug, serde::Deserialize)]
pub struct UserAccessRow {
    pub project_id: Option<i64>,
    pub group_id: Option<i64>,
    /// The user's effective access to the project (its own membership or an ancestor group's),
    /// or their membership of the group or one of its ancestors; a subgroup's does not count.
    pub access_level: Option<i32>,
    pub access_as: Option<Value>,
}

/// The `user_access` section's `access_as` and its entries, as
/// `gitlab::access::user_access` takes them. Every entry carries its section's `access_as`;
/// they are the same for one agent.
pub fn user_access_entries(rows: &[UserAccessRow]) -> (Option<AccessAs>, Vec<UserAccessEntry>) {
    let access_as = rows
        .first()
        .and_then(|e| AccessAs::from_config(e.access_as.as_ref()));
    let entries = rows
        .iter()
        .filter_map(|e| {
            let (kind, id) = match (e.project_id, e.group_id) {
                (Some(id), _) => (SourceKind::Project, id),
                (None, Some(id)) => (SourceKind::Group, id),
                (None, None) => return None,
            };
            Some(UserAccessEntry {
                kind,
                id,
                access_level: e.access_level,
            })
        })
        .collect();
    (access_as, entries)
}

/// [`UserAccessRows`] of the agents `agents` (an SQL condition on `a`) for the user `$2`.
fn user_access_sql(agents: &str) -> String {
    format!(
        "SELECT a.id, a.project_id, a.name, p.full_path AS project_full_path, u.username, u.admin,
            COALESCE((SELECT jsonb_agg(jsonb_build_object(
                'project_id', x.project_id, 'group_id', x.group_id,
                'access_as', x.config -> 'access_as',
                'access_level', {ENTRY_ACCESS_LEVEL}) ORDER BY x.project_id NULLS LAST, x.group_id)
             FROM agent_user_access_authorizations x WHERE x.agent_id = a.id), '[]') AS entries
         FROM cluster_agents a
         JOIN projects p ON p.id = a.project_id
         JOIN active_users u ON u.id = $2
         WHERE {agents}"
    )
}

/// `None` when the agent or the user does not exist.
pub async fn user_access(
    db: impl PgExecutor<'_>,
    agent_id: i64,
    user_id: i64,
) -> Result<Option<UserAccessRows>> {
    Ok(sqlx::query_as(&user_access_sql("a.id = $1"))
        .bind(agent_id)
        .bind(user_id)
        .fetch_optional(db)
        .await?)
}

/// [`user_access`] of several agents in one statement: the rows of each of `agent_ids` that
/// exists, none when the user does not.
pub async fn user_access_of(
    db: impl PgExecutor<'_>,
    agent_ids: &[i64],
    user_id: i64,
) -> Result<Vec<UserAccessRows>> {
    Ok(sqlx::query_as(&user_access_sql("a.id = ANY ($1)"))
        .bind(agent_ids)
        .bind(user_id)
        .fetch_all(db)
        .await?)
}

/// An agent token as GitLab reports it; never the secret.
#[derive(Debug, Clone)]
pub struct Token {
    pub id: i64,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub created_at: DateTime<Utc>,
    pub created_by_user_id: Option<i64>,
    pub last_used_at: Option<DateTime<Utc>>,
}

/// Replaces the agent's tokens with `tokens`. A token id that another agent holds is a
/// conflict: GitLab's token ids are unique across agents.
pub async fn replace_tokens(
    conn: &mut PgConnection,
    agent_id: i64,
    tokens: &[Token],
) -> Result<()> {
    sqlx::query("DELETE FROM cluster_agent_tokens WHERE agent_id = $1")
        .bind(agent_id)
        .execute(&mut *conn)
        .await?;
    let ids: Vec<i64> = tokens.iter().map(|t| t.id).collect();
    let held: Option<(i64, i64)> = sqlx::query_as(
        "SELECT id, agent_id FROM cluster_agent_tokens WHERE id = ANY ($1) ORDER BY id LIMIT 1",
    )
    .bind(&ids)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some((token, other)) = held {
        return Err(Error::Conflict(format!(
            "token {token} belongs to agent {other}: GitLab's token ids are unique"
        )));
    }
    let names: Vec<&str> = tokens.iter().map(|t| t.name.as_str()).collect();
    let descriptions: Vec<Option<&str>> = tokens.iter().map(|t| t.description.as_deref()).collect();
    let statuses: Vec<&str> = tokens.iter().map(|t| t.status.as_str()).collect();
    let created: Vec<DateTime<Utc>> = tokens.iter().map(|t| t.created_at).collect();
    let creators: Vec<Option<i64>> = tokens.iter().map(|t| t.created_by_user_id).collect();
    let used: Vec<Option<DateTime<Utc>>> = tokens.iter().map(|t| t.last_used_at).collect();
    sqlx::query(
        "INSERT INTO cluster_agent_tokens
             (agent_id, id, name, description, status, created_at, created_by_user_id, last_used_at)
         SELECT $1, * FROM UNNEST($2::bigint[], $3::text[], $4::text[], $5::text[], $6::timestamptz[],
                                  $7::bigint[], $8::timestamptz[])",
    )
    .bind(agent_id)
    .bind(&ids)
    .bind(&names)
    .bind(&descriptions)
    .bind(&statuses)
    .bind(&created)
    .bind(&creators)
    .bind(&used)
    .execute(conn)
    .await
    .map_err(|e| match violated_constraint(&e) {
        Some("cluster_agent_tokens_pkey") => Error::Conflict(format!(
            "a token of agent {agent_id} belongs to another agent: GitLab's token ids are unique"
        )),
        _ => e.into(),
    })?;
    Ok(())
}

/// Registers an agent as GitLab's API lists it: another agent of the project with the same
/// name was deleted in GitLab (names are unique per project at any moment, ids never reused),
/// and goes. True when anything changed.
pub async fn put_listed(
    conn: &mut PgConnection,
    id: i64,
    project_id: i64,
    name: &str,
) -> Result<bool> {
    let gone =
        sqlx::query("DELETE FROM cluster_agents WHERE project_id = $1 AND name = $2 AND id <> $3")
            .bind(project_id)
            .bind(name)
            .bind(id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
    let written = sqlx::query(
        "INSERT INTO cluster_agents (id, project_id, name) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO UPDATE SET project_id = EXCLUDED.project_id, name = EXCLUDED.name, updated_at = now()
         WHERE (cluster_agents.project_id, cluster_agents.name) IS DISTINCT FROM (EXCLUDED.project_id, EXCLUDED.name)",
    )
    .bind(id)
    .bind(project_id)
    .bind(name)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(gone + written > 0)
}

/// The configuration last applied to an agent (`None`: never, or no agent).
pub async fn config_of(db: impl PgExecutor<'_>, id: i64) -> Result<Option<Value>> {
    let config: Option<Option<Value>> =
        sqlx::query_scalar("SELECT config FROM cluster_agents WHERE id = $1")
            .bind(id)
            .fetch_optional(db)
            .await?;
    Ok(config.flatten())
}
