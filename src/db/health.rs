//! SQL of each environment's kept group health (SPEC 18, migration 0059): written when it
//! changes, once whichever replica saw the change; read for `Environment.health`, and for the
//! organization view's filters, sorts and counts without building any group: PostgreSQL
//! filters, sorts, pages and counts them, once the viewer's access to each agent is decided.

use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgExecutor};

use crate::db::read::{EnvironmentRow, Viewer, ENVIRONMENT_COLUMNS, READABLE};
use crate::error::Result;

/// A group's health as the recorder read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub agent_id: i64,
    pub namespace: String,
    /// As GraphQL spells it (`HEALTHY`).
    pub status: &'static str,
    /// SPEC 5.2's order, 0 (`HEALTHY`) to 5 (`UNKNOWN`).
    pub severity: i16,
    pub message: Option<String>,
    /// `group/version/plural/Kind` of each kind in the group, sorted.
    pub kinds: Vec<String>,
    pub objects: i32,
}

/// Writes `observed` as the environment's health when it differs from the row (or the row was
/// not kept current): `since` moves only when the status or the message changed. Replicas that
/// observe the same change all call this; the `WHERE` of the upsert is re-checked on the row as
/// the first writer left it, so only the first call changes it. Returns whether it wrote.
pub async fn record(
    db: impl PgExecutor<'_>,
    environment_id: i64,
    observed: &Observed,
    at: DateTime<Utc>,
) -> Result<bool> {
    let done = sqlx::query(
        "INSERT INTO environment_health AS h
           (environment_id, agent_id, namespace, status, severity, message, since, kinds, objects)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (environment_id) DO UPDATE
           SET agent_id = excluded.agent_id, namespace = excluded.namespace,
               status = excluded.status, severity = excluded.severity, message = excluded.message,
               since = CASE WHEN h.status = excluded.status AND h.message IS NOT DISTINCT FROM excluded.message
                            THEN h.since ELSE excluded.since END,
               kinds = excluded.kinds, objects = excluded.objects, unkept_since = NULL
           WHERE h.status <> excluded.status OR h.message IS DISTINCT FROM excluded.message
              OR h.agent_id <> excluded.agent_id OR h.namespace <> excluded.namespace
              OR h.kinds <> excluded.kinds OR h.unkept_since IS NOT NULL",
    )
    .bind(environment_id)
    .bind(observed.agent_id)
    .bind(&observed.namespace)
    .bind(observed.status)
    .bind(observed.severity)
    .bind(&observed.message)
    .bind(at)
    .bind(&observed.kinds)
    .bind(observed.objects)
    .execute(db)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// The group can no longer be read (its agent's connection is lost): an environment with a
/// recorded health becomes `UNKNOWN` with `message`, never keeping its last healthy state. One
/// never read stays without a row (its health is null).
pub async fn lost(
    db: impl PgExecutor<'_>,
    environment_id: i64,
    message: &str,
    at: DateTime<Utc>,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE environment_health SET status = 'UNKNOWN', severity = 5, message = $2, since = $3
         WHERE environment_id = $1 AND (status <> 'UNKNOWN' OR message IS DISTINCT FROM $2)",
    )
    .bind(environment_id)
    .bind(message)
    .bind(at)
    .execute(db)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// These environments' groups are not kept current from `at` (over the watch budget); those
/// already marked keep their first time.
pub async fn unkept(
    db: impl PgExecutor<'_>,
    environment_ids: &[i64],
    at: DateTime<Utc>,
) -> Result<()> {
    if environment_ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE environment_health SET unkept_since = $2
         WHERE environment_id = ANY ($1) AND unkept_since IS NULL",
    )
    .bind(environment_ids)
    .bind(at)
    .execute(db)
    .await?;
    Ok(())
}

/// An environment with a cluster connection: its last successful deployment went through an
/// agent.
#[derive(Debug, Clone, FromRow)]
pub struct Bound {
    pub environment_id: i64,
    pub project_id: i64,
    pub slug: String,
    pub agent_id: i64,
    pub agent_name: String,
    pub agent_project: String,
    pub namespace: String,
}

/// Every environment whose last successful deployment went through an agent, by id.
pub async fn bound(db: impl PgExecutor<'_>) -> Result<Vec<Bound>> {
    Ok(sqlx::query_as(
        "SELECT e.id AS environment_id, e.project_id, e.slug, ad.agent_id, a.name AS agent_name,
                p.full_path AS agent_project, ad.kubernetes_namespace AS namespace
         FROM environments e
         CROSS JOIN LATERAL (SELECT d.id FROM deployments d
                             WHERE d.environment_id = e.id AND d.status = 'success'
                             ORDER BY d.id DESC LIMIT 1) d
         JOIN agent_deployments ad ON ad.deployment_id = d.id
         JOIN cluster_agents a ON a.id = ad.agent_id
         JOIN projects p ON p.id = a.project_id
         ORDER BY e.id",
    )
    .fetch_all(db)
    .await?)
}

/// An environment's kept health, with what deciding who may see it needs.
#[derive(Debug, Clone, FromRow)]
pub struct HealthRow {
    pub environment_id: i64,
    pub agent_id: i64,
    pub agent_name: String,
    pub agent_project: String,
    pub namespace: String,
    pub status: String,
    pub message: Option<String>,
    pub since: DateTime<Utc>,
    pub kinds: Vec<String>,
    pub unkept_since: Option<DateTime<Utc>>,
}

impl HealthRow {
    /// Who read it, for deciding who sees it.
    pub fn reader(&self) -> Reader {
        Reader {
            agent_id: self.agent_id,
            agent_name: self.agent_name.clone(),
            agent_project: self.agent_project.clone(),
            namespace: self.namespace.clone(),
            kinds: self.kinds.clone(),
        }
    }
}

const HEALTH_COLUMNS: &str = "h.environment_id, h.agent_id, a.name AS agent_name,
    ap.full_path AS agent_project, h.namespace, h.status, h.message, h.since, h.kinds, h.unkept_since";
const HEALTH_JOINS: &str = "JOIN cluster_agents a ON a.id = h.agent_id
    JOIN projects ap ON ap.id = a.project_id";

/// The kept health of each of `environment_ids` that has one.
pub async fn of_environments(
    db: impl PgExecutor<'_>,
    environment_ids: &[i64],
) -> Result<Vec<HealthRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {HEALTH_COLUMNS} FROM environment_health h {HEALTH_JOINS}
         WHERE h.environment_id = ANY ($1)"
    ))
    .bind(environment_ids)
    .fetch_all(db)
    .await?)
}

/// An environment of a group's list, with what its sorts need and its kept health.
#[derive(Debug, Clone)]
pub struct Listed {
    pub row: EnvironmentRow,
    pub updated_at: DateTime<Utc>,
    pub health: Option<HealthRow>,
}

/// [`Listed`] as the outer join returns it.
#[derive(FromRow)]
struct ListedRow {
    #[sqlx(flatten)]
    row: EnvironmentRow,
    updated_at: DateTime<Utc>,
    environment_id: Option<i64>,
    agent_id: Option<i64>,
    agent_name: Option<String>,
    agent_project: Option<String>,
    namespace: Option<String>,
    status: Option<String>,
    message: Option<String>,
    since: Option<DateTime<Utc>>,
    kinds: Option<Vec<String>>,
    unkept_since: Option<DateTime<Utc>>,
}

impl From<ListedRow> for Listed {
    fn from(r: ListedRow) -> Listed {
        let health = (|| {
            Some(HealthRow {
                environment_id: r.environment_id?,
                agent_id: r.agent_id?,
                agent_name: r.agent_name?,
                agent_project: r.agent_project?,
                namespace: r.namespace?,
                status: r.status?,
                message: r.message,
                since: r.since?,
                kinds: r.kinds?,
                unkept_since: r.unkept_since,
            })
        })();
        Listed {
            row: r.row,
            updated_at: r.updated_at,
            health,
        }
    }
}

/// What the viewer may see of the kept healths, decided per agent before a statement filters,
/// sorts or counts them (`graphql::org` decides it; the statements only apply it).
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Agents whose every kept health the viewer sees.
    pub agents: Vec<i64>,
    /// Under impersonation, the (agent, namespace, kinds) whose health the viewer sees: the
    /// kinds as [`kinds_key`] joins them.
    pub reviewed: Vec<(i64, String, String)>,
    /// Agents whose connection is down now: their environments show `UNKNOWN`, since the
    /// later of this time (when known) and the kept `since`.
    pub down: Vec<(i64, Option<DateTime<Utc>>)>,
}

/// The kinds of a group as one text, the form [`Seen::reviewed`] matches them in.
pub fn kinds_key(kinds: &[String]) -> String {
    kinds.join(" ")
}

/// How a group's environments are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Id,
    /// Worst shown health first, then the most recent `since`, then by id; none last.
    WorstFirst,
    UpdatedDesc,
    /// By name, bytewise, then by id.
    NameAsc,
}

impl Order {
    fn sql(self) -> &'static str {
        match self {
            Order::Id => "e.id",
            Order::WorstFirst => "s.severity DESC NULLS LAST, s.since DESC NULLS LAST, e.id",
            Order::UpdatedDesc => "e.updated_at DESC, e.id",
            Order::NameAsc => "e.name COLLATE \"C\", e.id",
        }
    }
}

/// The kept healths the viewer sees ([`Seen`], `$6` to `$11`), as shown: `UNKNOWN` where the
/// agent's connection is down. Inlined by the planner into the statement that uses it.
const SHOWN: &str = "shown AS (
    SELECT h.environment_id,
           CASE WHEN d.agent_id IS NULL THEN h.status ELSE 'UNKNOWN' END AS status,
           CASE WHEN d.agent_id IS NULL THEN h.severity ELSE 5 END AS severity,
           CASE WHEN d.agent_id IS NULL THEN h.since ELSE GREATEST(d.since, h.since) END AS since
    FROM environment_health h
    LEFT JOIN unnest($10::bigint[], $11::timestamptz[]) AS d (agent_id, since) ON d.agent_id = h.agent_id
    WHERE h.agent_id = ANY ($6::bigint[])
       OR (h.agent_id, h.namespace, array_to_string(h.kinds, ' ')) IN
          (SELECT * FROM unnest($7::bigint[], $8::text[], $9::text[])))";

/// The environments of the group and its subgroups the viewer may read, `tier` and `search`
/// applied: `$1` to `$5`.
const IN_GROUP: &str = "FROM environments e
    JOIN projects p ON p.id = e.project_id JOIN namespaces n ON n.id = p.namespace_id";
const IN_GROUP_WHERE: &str = "n.traversal_ids @> ARRAY[$3::bigint]
    AND ($4::text IS NULL OR e.tier = $4)
    AND ($5::text IS NULL OR envlens_contains(e.name, $5))";

/// Which group of environments, as the viewer reads it.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub viewer: Viewer,
    pub group_id: i64,
    pub tier: Option<&'a str>,
    pub search: Option<&'a str>,
}

fn bind_scope<'q, O>(
    q: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    scope: Scope<'q>,
    seen: &'q Seen,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    let reviewed_agents: Vec<i64> = seen.reviewed.iter().map(|r| r.0).collect();
    let reviewed_namespaces: Vec<&str> = seen.reviewed.iter().map(|r| r.1.as_str()).collect();
    let reviewed_kinds: Vec<&str> = seen.reviewed.iter().map(|r| r.2.as_str()).collect();
    let down: Vec<i64> = seen.down.iter().map(|d| d.0).collect();
    let down_since: Vec<Option<DateTime<Utc>>> = seen.down.iter().map(|d| d.1).collect();
    q.bind(scope.viewer.user_id)
        .bind(scope.viewer.admin)
        .bind(scope.group_id)
        .bind(scope.tier)
        .bind(scope.search)
        .bind(&seen.agents)
        .bind(reviewed_agents)
        .bind(reviewed_namespaces)
        .bind(reviewed_kinds)
        .bind(down)
        .bind(down_since)
}

/// Who read the kept healths of a scope: what deciding who sees them needs, once each.
#[derive(Debug, Clone, FromRow, PartialEq, Eq, Hash)]
pub struct Reader {
    pub agent_id: i64,
    pub agent_name: String,
    pub agent_project: String,
    pub namespace: String,
    pub kinds: Vec<String>,
}

/// The distinct agents, namespaces and kinds the kept healths of the scope were read through.
pub async fn readers(db: impl PgExecutor<'_>, scope: Scope<'_>) -> Result<Vec<Reader>> {
    Ok(sqlx::query_as(&format!(
        "SELECT DISTINCT h.agent_id, a.name AS agent_name, ap.full_path AS agent_project,
                h.namespace, h.kinds
         {IN_GROUP} JOIN environment_health h ON h.environment_id = e.id {HEALTH_JOINS}
         WHERE {IN_GROUP_WHERE} AND {READABLE}"
    ))
    .bind(scope.viewer.user_id)
    .bind(scope.viewer.admin)
    .bind(scope.group_id)
    .bind(scope.tier)
    .bind(scope.search)
    .fetch_all(db)
    .await?)
}

/// A page of the scope's environments whose shown health is one of `health` (every one
/// without), in `order`, from position `offset`; each with its kept health when the viewer
/// sees it. Filtered, sorted and cut by PostgreSQL, on `environment_health`'s rows.
pub async fn page(
    db: impl PgExecutor<'_>,
    scope: Scope<'_>,
    seen: &Seen,
    health: Option<&[&str]>,
    order: Order,
    offset: i64,
    limit: i64,
) -> Result<Vec<Listed>> {
    let sql = format!(
        "WITH {SHOWN}
         SELECT {ENVIRONMENT_COLUMNS}, e.updated_at, {HEALTH_COLUMNS}
         {IN_GROUP}
         LEFT JOIN shown s ON s.environment_id = e.id
         LEFT JOIN (environment_health h {HEALTH_JOINS}) ON h.environment_id = s.environment_id
         WHERE {IN_GROUP_WHERE} AND {READABLE}
           AND ($12::text[] IS NULL OR s.status = ANY ($12))
         ORDER BY {} OFFSET $13 LIMIT $14",
        order.sql()
    );
    let rows: Vec<ListedRow> = bind_scope(sqlx::query_as(&sql), scope, seen)
        .bind(health)
        .bind(offset)
        .bind(limit)
        .fetch_all(db)
        .await?;
    Ok(rows.into_iter().map(Listed::from).collect())
}

/// How many of the scope's environments have each shown health, among those the viewer sees.
pub async fn counts(
    db: impl PgExecutor<'_>,
    scope: Scope<'_>,
    seen: &Seen,
) -> Result<Vec<(String, i64)>> {
    let sql = format!(
        "WITH {SHOWN}
         SELECT s.status, count(*) {IN_GROUP} JOIN shown s ON s.environment_id = e.id
         WHERE {IN_GROUP_WHERE} AND {READABLE}
         GROUP BY s.status"
    );
    Ok(bind_scope(sqlx::query_as(&sql), scope, seen)
        .fetch_all(db)
        .await?)
}
