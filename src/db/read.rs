//! SQL of the read side (GraphQL): projects and groups as a user may read them, environments,
//! deployments and agents, each list loaded in one statement for many keys.
//!
//! The loads by key take an array (`UNNEST($1)`, `= ANY ($1)`), except for a single key, the
//! common query of one object, which has a statement of its own with a scalar parameter.
//! PostgreSQL keeps a prepared statement's generic plan only when it does not look costlier
//! than a plan for the values at hand, and a generic plan cannot know an array's length (it
//! assumes 10 elements): with one key it always looked costlier, so PostgreSQL planned the
//! statement anew on every call, which cost more than running it.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgExecutor, Row};

use crate::db::identity::User;
use crate::error::Result;

/// Who reads: the reading rules depend on it.
#[derive(Debug, Clone, Copy)]
pub struct Viewer {
    pub user_id: i64,
    pub admin: bool,
}

/// Who may read a project, GitLab's rule and the one place envlens writes it: Reporter (20) or
/// more through the project or an ancestor group, a public project, an internal one unless
/// the user is external (GitLab's external users see internal projects only where they are
/// members), or an admin. `$1` is the user id, `$2` whether they are an admin; `p` is the
/// project and `n` its group (NULL for a personal project).
pub(crate) const READABLE: &str = "(p.visibility = 'public' OR $2::bool
  OR (p.visibility = 'internal' AND NOT EXISTS (SELECT 1 FROM users x WHERE x.id = $1 AND x.external))
  OR EXISTS (
    SELECT 1 FROM members m WHERE m.user_id = $1 AND m.access_level >= 20
      AND ((m.source_type = 'project' AND m.source_id = p.id)
        OR (m.source_type = 'group' AND m.source_id = ANY (n.traversal_ids)))))";

/// Who sees a group `g` ([`visible_group`]): an admin, a member of it or of an ancestor, or
/// whoever may read a project in it or below. `$1` and `$2` as in [`READABLE`].
pub(crate) static VISIBLE_GROUP: LazyLock<String> = LazyLock::new(|| {
    format!(
        "($2::bool
          OR EXISTS (SELECT 1 FROM members m WHERE m.user_id = $1 AND m.source_type = 'group'
                     AND m.source_id = ANY (g.traversal_ids))
          OR EXISTS (SELECT 1 FROM projects p JOIN namespaces n ON n.id = p.namespace_id
                     WHERE n.traversal_ids @> ARRAY[g.id] AND {READABLE}))"
    )
});

#[derive(Debug, Clone, FromRow)]
pub struct ProjectRow {
    pub id: i64,
    pub path: String,
    pub full_path: String,
    /// Whether the viewer may read its environments. A project reached through an agent
    /// shows its path even when they may not.
    pub readable: bool,
}

#[derive(Debug, Clone, FromRow)]
pub struct GroupRow {
    pub id: i64,
    pub path: String,
    pub full_path: String,
}

#[derive(Debug, Clone, FromRow)]
pub struct EnvironmentRow {
    pub id: i64,
    pub project_id: i64,
    pub name: String,
    pub slug: String,
    pub tier: Option<String>,
    pub state: String,
}

#[derive(Debug, Clone, FromRow)]
pub struct DeploymentRow {
    pub id: i64,
    pub iid: Option<i64>,
    pub environment_id: Option<i64>,
    pub status: String,
    #[sqlx(rename = "ref")]
    pub git_ref: Option<String>,
    pub sha: Option<String>,
    pub tag: Option<bool>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, FromRow)]
pub struct AgentRow {
    pub id: i64,
    pub project_id: i64,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, FromRow)]
pub struct AgentDeploymentRow {
    pub deployment_id: i64,
    pub agent_id: i64,
    pub kubernetes_namespace: String,
    pub flux_resource_path: Option<String>,
}

pub(crate) const ENVIRONMENT_COLUMNS: &str = "e.id, e.project_id, e.name, e.slug, e.tier, e.state";
const DEPLOYMENT_COLUMNS: &str =
    "d.id, d.iid, d.environment_id, d.status, d.ref, d.sha, d.tag, d.created_at, d.updated_at, d.finished_at";

/// A row read column after column, by position. The blueprint query's three statements read
/// their rows this way: sqlx's `FromRow` finds each column by its name, a SipHash of the name
/// and a map lookup per column of every row, ~17.8k instructions of the query's ~250k over its
/// 32 columns (session 22, callgrind). Each [`At::get`] names the column it expects, in the
/// order of the statement's select list; debug builds (the tests') check that name against the
/// one PostgreSQL sent, so a select list and its reader that drift apart fail every test that
/// runs the statement (`tests/graphql.rs`: `the_blueprint_query` runs the three).
struct At<'r> {
    row: &'r PgRow,
    next: usize,
}

impl<'r> At<'r> {
    fn new(row: &'r PgRow) -> Self {
        At { row, next: 0 }
    }

    /// The next column, which must be `name`; its type is checked as by name.
    fn get<T>(&mut self, name: &str) -> sqlx::Result<T>
    where
        T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    {
        use sqlx::Column;
        let i = self.next;
        debug_assert_eq!(
            self.row.columns().get(i).map(|c| c.name()),
            Some(name),
            "column {i} of the statement is not the one its reader expects"
        );
        self.next += 1;
        self.row.try_get(i)
    }
}

impl EnvironmentRow {
    /// The columns of [`ENVIRONMENT_COLUMNS`], by position.
    fn read(at: &mut At<'_>) -> sqlx::Result<Self> {
        Ok(EnvironmentRow {
            id: at.get("id")?,
            project_id: at.get("project_id")?,
            name: at.get("name")?,
            slug: at.get("slug")?,
            tier: at.get("tier")?,
            state: at.get("state")?,
        })
    }
}

impl DeploymentRow {
    /// The columns of [`DEPLOYMENT_COLUMNS`], by position.
    fn read(at: &mut At<'_>) -> sqlx::Result<Self> {
        Ok(DeploymentRow {
            id: at.get("id")?,
            iid: at.get("iid")?,
            environment_id: at.get("environment_id")?,
            status: at.get("status")?,
            git_ref: at.get("ref")?,
            sha: at.get("sha")?,
            tag: at.get("tag")?,
            created_at: at.get("created_at")?,
            updated_at: at.get("updated_at")?,
            finished_at: at.get("finished_at")?,
        })
    }
}

/// The project at `full_path`, if the viewer may read it.
pub async fn readable_project(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    full_path: &str,
) -> Result<Option<ProjectRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT p.id, p.path, p.full_path, true AS readable FROM projects p LEFT JOIN namespaces n ON n.id = p.namespace_id
         WHERE lower(p.full_path) = lower($3) AND {READABLE}"
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(full_path)
    .fetch_optional(db)
    .await?)
}

/// The user `user_id`, and the project at `full_path` if that user may read it; `None` when
/// the mirror does not know the user. A request's first statement is usually its project's,
/// and it reads the session's user along: one round trip fewer than the user on its own.
pub async fn user_and_readable_project(
    db: impl PgExecutor<'_>,
    user_id: i64,
    full_path: &str,
) -> Result<Option<(User, Option<ProjectRow>)>> {
    /// `READABLE` for the user row `u`, whose admin flag is not known beforehand.
    static SQL: LazyLock<String> = LazyLock::new(|| {
        let readable = READABLE
            .replace("$2::bool", "u.admin")
            .replace("$1", "u.id");
        format!(
            "SELECT u.id AS user_id, u.username, u.admin, u.external, p.id, p.path, p.full_path
             FROM active_users u LEFT JOIN LATERAL (
               SELECT p.id, p.path, p.full_path FROM projects p LEFT JOIN namespaces n ON n.id = p.namespace_id
               WHERE lower(p.full_path) = lower($2) AND {readable}) p ON true
             WHERE u.id = $1"
        )
    });
    let read = |row: PgRow| {
        let mut at = At::new(&row);
        let user = User {
            id: at.get("user_id")?,
            username: at.get("username")?,
            admin: at.get("admin")?,
            external: at.get("external")?,
        };
        let project: (Option<i64>, Option<String>, Option<String>) =
            (at.get("id")?, at.get("path")?, at.get("full_path")?);
        Ok((user, project))
    };
    let row = sqlx::query(&SQL)
        .bind(user_id)
        .bind(full_path)
        .try_map(read)
        .fetch_optional(db)
        .await?;
    Ok(row.map(|(user, project)| {
        let project = match project {
            (Some(id), Some(path), Some(full_path)) => Some(ProjectRow {
                id,
                path,
                full_path,
                readable: true,
            }),
            _ => None,
        };
        (user, project)
    }))
}

/// The group at `full_path`, if the viewer is an admin, a member of it or of an ancestor, or
/// may read a project in it: otherwise it does not exist for them.
pub async fn visible_group(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    full_path: &str,
) -> Result<Option<GroupRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT g.id, g.path, g.full_path FROM namespaces g
         WHERE lower(g.full_path) = lower($3) AND {}",
        *VISIBLE_GROUP
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(full_path)
    .fetch_optional(db)
    .await?)
}

pub async fn projects(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    ids: &[i64],
) -> Result<Vec<ProjectRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT p.id, p.path, p.full_path, {READABLE} AS readable
         FROM projects p LEFT JOIN namespaces n ON n.id = p.namespace_id WHERE p.id = ANY ($3)"
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(ids)
    .fetch_all(db)
    .await?)
}

/// An environment by id (a deployment's: readable as its deployment is).
pub async fn environment_by_id(db: impl PgExecutor<'_>, id: i64) -> Result<Option<EnvironmentRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {ENVIRONMENT_COLUMNS} FROM environments e WHERE e.id = $1"
    ))
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// Environments by (project id, name).
pub async fn environments_by_name(
    db: impl PgExecutor<'_>,
    keys: &[(i64, String)],
) -> Result<Vec<EnvironmentRow>> {
    static ONE: LazyLock<String> = LazyLock::new(|| {
        format!("SELECT {ENVIRONMENT_COLUMNS} FROM environments e WHERE e.project_id = $1 AND e.name = $2")
    });
    if let [(project_id, name)] = keys {
        return Ok(sqlx::query(&ONE)
            .bind(project_id)
            .bind(name)
            .try_map(|row: PgRow| EnvironmentRow::read(&mut At::new(&row)))
            .fetch_all(db)
            .await?);
    }
    let (project_ids, names): (Vec<i64>, Vec<String>) = keys.iter().cloned().unzip();
    Ok(sqlx::query_as(&format!(
        "SELECT {ENVIRONMENT_COLUMNS} FROM UNNEST($1::bigint[], $2::text[]) AS k(project_id, name)
         JOIN environments e ON e.project_id = k.project_id AND e.name = k.name"
    ))
    .bind(&project_ids)
    .bind(&names)
    .fetch_all(db)
    .await?)
}

/// A deployment with what its `agent` field shows: its `agent_deployments` row, the agent and
/// the agent's project (as the viewer may read it), when it has an agent.
#[derive(Debug, Clone)]
pub struct DeploymentWithAgent {
    pub deployment: DeploymentRow,
    pub agent: Option<(AgentDeploymentRow, AgentRow, ProjectRow)>,
}

/// The columns of [`DeploymentWithAgent`] ([`with_agent`]'s select list, read by position),
/// NULL where there is no agent.
struct DeploymentWithAgentColumns {
    deployment: DeploymentRow,
    agent_id: Option<i64>,
    kubernetes_namespace: Option<String>,
    flux_resource_path: Option<String>,
    agent_project_id: Option<i64>,
    agent_name: Option<String>,
    agent_created_at: Option<DateTime<Utc>>,
    agent_project_path: Option<String>,
    agent_project_full_path: Option<String>,
    agent_project_readable: Option<bool>,
}

impl<'r> FromRow<'r, PgRow> for DeploymentWithAgentColumns {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        let mut at = At::new(row);
        Ok(DeploymentWithAgentColumns {
            deployment: DeploymentRow::read(&mut at)?,
            agent_id: at.get("agent_id")?,
            kubernetes_namespace: at.get("kubernetes_namespace")?,
            flux_resource_path: at.get("flux_resource_path")?,
            agent_project_id: at.get("agent_project_id")?,
            agent_name: at.get("agent_name")?,
            agent_created_at: at.get("agent_created_at")?,
            agent_project_path: at.get("agent_project_path")?,
            agent_project_full_path: at.get("agent_project_full_path")?,
            agent_project_readable: at.get("agent_project_readable")?,
        })
    }
}

impl From<DeploymentWithAgentColumns> for DeploymentWithAgent {
    fn from(c: DeploymentWithAgentColumns) -> Self {
        let d = c.deployment.id;
        // The foreign keys make these all present or all absent.
        let agent = match (
            c.agent_id,
            c.kubernetes_namespace,
            c.agent_project_id,
            c.agent_name,
            c.agent_created_at,
            c.agent_project_path,
            c.agent_project_full_path,
            c.agent_project_readable,
        ) {
            (
                Some(id),
                Some(ns),
                Some(project_id),
                Some(name),
                Some(created_at),
                Some(path),
                Some(full_path),
                Some(readable),
            ) => Some((
                AgentDeploymentRow {
                    deployment_id: d,
                    agent_id: id,
                    kubernetes_namespace: ns,
                    flux_resource_path: c.flux_resource_path,
                },
                AgentRow {
                    id,
                    project_id,
                    name,
                    created_at,
                },
                ProjectRow {
                    id: project_id,
                    path,
                    full_path,
                    readable,
                },
            )),
            _ => None,
        };
        DeploymentWithAgent {
            deployment: c.deployment,
            agent,
        }
    }
}

/// The deployments `d` of `from`, with their agents: the columns of [`DeploymentWithAgent`].
/// `READABLE` takes `$1` and `$2`.
fn with_agent(from: &str) -> String {
    format!(
        "SELECT {DEPLOYMENT_COLUMNS}, ad.agent_id, ad.kubernetes_namespace, ad.flux_resource_path,
                a.project_id AS agent_project_id, a.name AS agent_name, a.created_at AS agent_created_at,
                p.path AS agent_project_path, p.full_path AS agent_project_full_path,
                {READABLE} AS agent_project_readable
         FROM {from}
         LEFT JOIN agent_deployments ad ON ad.deployment_id = d.id
         LEFT JOIN cluster_agents a ON a.id = ad.agent_id
         LEFT JOIN projects p ON p.id = a.project_id LEFT JOIN namespaces n ON n.id = p.namespace_id"
    )
}

/// The deployment with the highest id in `status` of each environment, one index probe each,
/// with its agent: one statement for what the blueprint query reads through four tables.
pub async fn last_deployments(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    environment_ids: &[i64],
    status: &str,
) -> Result<Vec<DeploymentWithAgent>> {
    // Built once: the statement cache finds a statement by its text, so the text is all a
    // repeated query costs before its round trip.
    static ONE: LazyLock<String> = LazyLock::new(|| {
        with_agent(
            "(SELECT * FROM deployments x WHERE x.environment_id = $3 AND x.status = $4
              ORDER BY x.id DESC LIMIT 1) d",
        )
    });
    static MANY: LazyLock<String> = LazyLock::new(|| {
        with_agent(
            "UNNEST($3::bigint[]) AS k(environment_id)
             CROSS JOIN LATERAL (SELECT * FROM deployments x WHERE x.environment_id = k.environment_id
                                 AND x.status = $4 ORDER BY x.id DESC LIMIT 1) d",
        )
    });
    let sql: &str = match environment_ids {
        [_] => &ONE,
        _ => &MANY,
    };
    let query = sqlx::query_as::<_, DeploymentWithAgentColumns>(sql)
        .bind(viewer.user_id)
        .bind(viewer.admin);
    let query = match environment_ids {
        [id] => query.bind(id),
        ids => query.bind(ids),
    };
    let rows = query.bind(status).fetch_all(db).await?;
    Ok(rows.into_iter().map(DeploymentWithAgent::from).collect())
}

pub async fn agent_deployments(
    db: impl PgExecutor<'_>,
    deployment_ids: &[i64],
) -> Result<Vec<AgentDeploymentRow>> {
    Ok(sqlx::query_as(
        "SELECT deployment_id, agent_id, kubernetes_namespace, flux_resource_path FROM agent_deployments
         WHERE deployment_id = ANY ($1)",
    )
    .bind(deployment_ids)
    .fetch_all(db)
    .await?)
}

pub async fn agents(db: impl PgExecutor<'_>, ids: &[i64]) -> Result<Vec<AgentRow>> {
    Ok(sqlx::query_as(
        "SELECT id, project_id, name, created_at FROM cluster_agents WHERE id = ANY ($1)",
    )
    .bind(ids)
    .fetch_all(db)
    .await?)
}

/// The agents of a project, `name` alone when given.
pub async fn project_agents(
    db: impl PgExecutor<'_>,
    project_id: i64,
    name: Option<&str>,
) -> Result<Vec<AgentRow>> {
    Ok(sqlx::query_as(
        "SELECT id, project_id, name, created_at FROM cluster_agents
         WHERE project_id = $1 AND ($2::text IS NULL OR name = $2) ORDER BY id",
    )
    .bind(project_id)
    .bind(name)
    .fetch_all(db)
    .await?)
}

/// A page of environments, by id, after the id `after`; `limit` rows at most.
#[derive(Debug, Default)]
pub struct EnvironmentFilter<'a> {
    pub name: Option<&'a str>,
    pub search: Option<&'a str>,
    pub states: Option<&'a [String]>,
    pub tier: Option<&'a str>,
    pub after: Option<i64>,
    pub limit: i64,
}

pub async fn project_environments(
    db: impl PgExecutor<'_>,
    project_id: i64,
    f: &EnvironmentFilter<'_>,
) -> Result<Vec<EnvironmentRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {ENVIRONMENT_COLUMNS} FROM environments e
         WHERE e.project_id = $1 AND ($2::text IS NULL OR e.name = $2)
           AND ($3::text IS NULL OR envlens_contains(e.name, $3))
           AND ($4::text[] IS NULL OR e.state = ANY ($4)) AND ($5::bigint IS NULL OR e.id > $5)
         ORDER BY e.id LIMIT $6"
    ))
    .bind(project_id)
    .bind(f.name)
    .bind(f.search)
    .bind(f.states)
    .bind(f.after)
    .bind(f.limit)
    .fetch_all(db)
    .await?)
}

/// Environments of every project in the group and its subgroups that the viewer may read.
pub async fn group_environments(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    group_id: i64,
    f: &EnvironmentFilter<'_>,
) -> Result<Vec<EnvironmentRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {ENVIRONMENT_COLUMNS} FROM environments e
         JOIN projects p ON p.id = e.project_id JOIN namespaces n ON n.id = p.namespace_id
         WHERE n.traversal_ids @> ARRAY[$3::bigint] AND {READABLE}
           AND ($4::text IS NULL OR e.tier = $4)
           AND ($5::text IS NULL OR envlens_contains(e.name, $5))
           AND ($6::bigint IS NULL OR e.id > $6)
         ORDER BY e.id LIMIT $7"
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(group_id)
    .bind(f.tier)
    .bind(f.search)
    .bind(f.after)
    .bind(f.limit)
    .fetch_all(db)
    .await?)
}

/// A page of an environment's deployments, newest first, after the deployment `before` (the
/// previous page's last).
///
/// Newest by creation time, then id: GitLab orders its deployments by id, which it allocates
/// as it creates them ("sorting by `id` produces the same result as sorting by `created_at`",
/// `DeploymentsFinder`), and a pull-based deployment (SPEC 15) goes among them by the time
/// envlens recorded it, not by its negative id. A cursor that was envlens' own id of a
/// deployment that has since taken GitLab's still finds it.
pub async fn environment_deployments(
    db: impl PgExecutor<'_>,
    environment_id: i64,
    statuses: Option<&[String]>,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<DeploymentRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {DEPLOYMENT_COLUMNS} FROM deployments d
         WHERE d.environment_id = $1 AND ($2::text[] IS NULL OR d.status = ANY ($2))
           AND ($3::bigint IS NULL OR (d.created_at, d.id) < (
               SELECT c.created_at, c.id FROM deployments c
               WHERE c.id = COALESCE((SELECT p.deployment_id FROM pull_deployments p WHERE p.own_id = $3), $3)))
         ORDER BY d.created_at DESC, d.id DESC LIMIT $4"
    ))
    .bind(environment_id)
    .bind(statuses)
    .bind(before)
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// A project's deployment by iid (the newest, should GitLab ever repeat one).
pub async fn deployment_by_iid(
    db: impl PgExecutor<'_>,
    project_id: i64,
    iid: i64,
) -> Result<Option<DeploymentRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {DEPLOYMENT_COLUMNS} FROM deployments d WHERE d.project_id = $1 AND d.iid = $2
         ORDER BY d.id DESC LIMIT 1"
    ))
    .bind(project_id)
    .bind(iid)
    .fetch_optional(db)
    .await?)
}

/// GitLab's cap on the deployments it counts for display (`EnvironmentPresenter`).
pub const DEPLOYMENTS_COUNTED: i64 = 1000;

/// The number of deployments of each environment, counting no further than
/// [`DEPLOYMENTS_COUNTED`]: one short index range each.
pub async fn deployment_counts(
    db: impl PgExecutor<'_>,
    environment_ids: &[i64],
) -> Result<Vec<(i64, i64)>> {
    Ok(sqlx::query_as(
        "SELECT k.environment_id, (SELECT count(*) FROM (
                    SELECT 1 FROM deployments d WHERE d.environment_id = k.environment_id LIMIT $2) c)
         FROM UNNEST($1::bigint[]) AS k(environment_id)",
    )
    .bind(environment_ids)
    .bind(DEPLOYMENTS_COUNTED)
    .fetch_all(db)
    .await?)
}

/// Every group the viewer sees ([`visible_group`]'s rule), by full path, at most `limit`:
/// the dashboard's first page.
pub async fn visible_groups(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    limit: i64,
) -> Result<Vec<GroupRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT g.id, g.path, g.full_path FROM namespaces g WHERE {}
         ORDER BY lower(g.full_path) LIMIT $3",
        *VISIBLE_GROUP
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(limit)
    .fetch_all(db)
    .await?)
}
