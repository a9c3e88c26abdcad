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
    /// The order over the environment `e` and its shown health `s` (the shown columns
    /// `shown_severity` and `shown_since`). Every environment of a filtered page has a health:
    /// there `DESC` is written without `NULLS LAST`, the order `environment_health_worst_idx`
    /// is kept in, so that PostgreSQL walks it and stops at the page's end instead of sorting
    /// every match.
    fn sql(self, filtered: bool, e: &str, s: &str) -> String {
        match (self, filtered) {
            (Order::Id, _) => format!("{e}.id"),
            (Order::WorstFirst, true) => {
                format!("{s}.shown_severity DESC, {s}.shown_since DESC, {e}.id")
            }
            (Order::WorstFirst, false) => format!(
                "{s}.shown_severity DESC NULLS LAST, {s}.shown_since DESC NULLS LAST, {e}.id"
            ),
            (Order::UpdatedDesc, _) => format!("{e}.updated_at DESC, {e}.id"),
            (Order::NameAsc, _) => format!("{e}.name COLLATE \"C\", {e}.id"),
        }
    }
}

/// The kept healths the viewer sees ([`Seen`], `$7` to `$10`): of an agent whose every health
/// they see, or under impersonation of a reviewed agent, namespace and kinds; the second test
/// written only when some agent impersonates. A filter, so that a walk of an index in order
/// stays in order. The agents are `= ANY` of the bound array, not a subquery over it: in the
/// plan of the bound values the array is a constant, which PostgreSQL (14 and later) probes
/// as a hashed set and whose matches it estimates from the column's statistics (a subquery
/// counts as half the rows), so that the page's estimate is its real share.
fn seen_sql(seen: &Seen) -> &'static str {
    if seen.reviewed.is_empty() {
        "h.agent_id = ANY ($7::bigint[])"
    } else {
        "(h.agent_id = ANY ($7::bigint[])
          OR (h.agent_id, h.namespace, array_to_string(h.kinds, ' ')) IN
             (SELECT * FROM unnest($8::bigint[], $9::text[], $10::text[])))"
    }
}

/// The kept healths the viewer sees, as shown: `UNKNOWN` since the later of the two times
/// where the agent's connection is down (`$11`, `$12`). Without an agent down, the kept
/// columns themselves, which `environment_health_worst_idx` orders. Inlined by the planner
/// into the statement that uses it.
fn shown(seen: &Seen) -> String {
    let test = seen_sql(seen);
    if seen.down.is_empty() {
        return format!(
            "shown AS (SELECT h.*, h.status AS shown_status, h.severity AS shown_severity,
                              h.since AS shown_since
                       FROM environment_health h WHERE {test})"
        );
    }
    format!(
        "shown AS (
        SELECT h.*,
               CASE WHEN d.agent_id IS NULL THEN h.status ELSE 'UNKNOWN' END AS shown_status,
               CASE WHEN d.agent_id IS NULL THEN h.severity ELSE 5 END AS shown_severity,
               CASE WHEN d.agent_id IS NULL THEN h.since ELSE GREATEST(d.since, h.since) END AS shown_since
        FROM environment_health h
        LEFT JOIN unnest($11::bigint[], $12::timestamptz[]) AS d (agent_id, since) ON d.agent_id = h.agent_id
        WHERE {test})"
    )
}

/// The environments of the group and its subgroups the viewer may read.
const IN_GROUP: &str = "FROM environments e
    JOIN projects p ON p.id = e.project_id JOIN namespaces n ON n.id = p.namespace_id";

/// [`IN_GROUP`]'s condition, `$1` to `$5`: the tier and the search written only when given,
/// so that each shape is its own prepared statement and no generic plan has to guess them.
fn in_group_where(scope: &Scope<'_>) -> String {
    let mut sql = format!("n.traversal_ids @> ARRAY[$3::bigint] AND {READABLE}");
    if scope.tier.is_some() {
        sql.push_str(" AND e.tier = $4");
    }
    if scope.search.is_some() {
        sql.push_str(" AND envlens_contains(e.name, $5)");
    }
    sql
}

/// The kept healths `h` of the scope's environments (`$1` to `$6`), by the project and tier
/// each carries (migration 0064), without joining `environments`: of one of the scope's
/// readable projects ([`Scope::projects`]), of the tier when given. Only a search reads the
/// environment's name. The projects are a bound array, tested per row: no join whose
/// estimate (of tables too small to be analyzed) could turn a walk of the page's order into a
/// scan and a sort, and, unlike an array computed inside the statement, a constant in the
/// plan of the bound values, whose matches PostgreSQL estimates from the column's statistics
/// (an array it cannot see counts as 10 values: a tenth of the rows for 100 projects). The
/// tally, which reads every match, finds them by the same test as an index condition instead
/// ([`tally`]).
fn health_in_scope(scope: &Scope<'_>, h: &str) -> String {
    let mut sql = format!("{h}.project_id = ANY ($6::bigint[])");
    if scope.tier.is_some() {
        sql.push_str(&format!(" AND {h}.tier = $4"));
    }
    if scope.search.is_some() {
        sql.push_str(&format!(
            " AND envlens_contains((SELECT e.name FROM environments e WHERE e.id = {h}.environment_id), $5)"
        ));
    }
    sql
}

/// Which group of environments, as the viewer reads it.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub viewer: Viewer,
    pub group_id: i64,
    /// The projects of the group and its subgroups that the viewer may read: [`projects`],
    /// read once per request before the statements that take the scope.
    pub projects: &'a [i64],
    pub tier: Option<&'a str>,
    pub search: Option<&'a str>,
}

/// The projects of group `group_id` and its subgroups that `viewer` may read (decided per
/// project, where it sits now, by [`READABLE`]): the scope of the organization view's
/// statements, bound to them as an array rather than computed inside each (see
/// [`health_in_scope`] for why).
pub async fn projects(db: impl PgExecutor<'_>, viewer: Viewer, group_id: i64) -> Result<Vec<i64>> {
    Ok(sqlx::query_scalar(&format!(
        "SELECT p.id FROM projects p JOIN namespaces n ON n.id = p.namespace_id
         WHERE n.traversal_ids @> ARRAY[$3::bigint] AND {READABLE} ORDER BY p.id"
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(group_id)
    .fetch_all(db)
    .await?)
}

fn bind_scope<'q, O>(
    q: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    scope: Scope<'q>,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    q.bind(scope.viewer.user_id)
        .bind(scope.viewer.admin)
        .bind(scope.group_id)
        .bind(scope.tier)
        .bind(scope.search)
        .bind(scope.projects)
}

fn bind_seen<'q, O>(
    q: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    seen: &'q Seen,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    let reviewed_agents: Vec<i64> = seen.reviewed.iter().map(|r| r.0).collect();
    let reviewed_namespaces: Vec<&str> = seen.reviewed.iter().map(|r| r.1.as_str()).collect();
    let reviewed_kinds: Vec<&str> = seen.reviewed.iter().map(|r| r.2.as_str()).collect();
    let down: Vec<i64> = seen.down.iter().map(|d| d.0).collect();
    let down_since: Vec<Option<DateTime<Utc>>> = seen.down.iter().map(|d| d.1).collect();
    q.bind(&seen.agents)
        .bind(reviewed_agents)
        .bind(reviewed_namespaces)
        .bind(reviewed_kinds)
        .bind(down)
        .bind(down_since)
}

/// Who read a kept health: what deciding who sees it needs.
#[derive(Debug, Clone, FromRow, PartialEq, Eq, Hash)]
pub struct Reader {
    pub agent_id: i64,
    pub agent_name: String,
    pub agent_project: String,
    pub namespace: String,
    pub kinds: Vec<String>,
}

impl Reader {
    /// Its agent: id, project path, name.
    pub fn agent(&self) -> (i64, &str, &str) {
        (self.agent_id, &self.agent_project, &self.agent_name)
    }
}

/// How many of a scope's kept healths have `status`, read through one agent (and, when
/// asked for, one namespace and set of kinds).
#[derive(Debug, Clone, FromRow)]
pub struct Tally {
    pub agent_id: i64,
    pub agent_name: String,
    pub agent_project: String,
    /// With [`tally`]'s `by_reader` only.
    pub namespace: Option<String>,
    /// With [`tally`]'s `by_reader` only.
    pub kinds: Option<Vec<String>>,
    pub status: String,
    pub count: i64,
}

impl Tally {
    /// Its agent: id, project path, name.
    pub fn agent(&self) -> (i64, &str, &str) {
        (self.agent_id, &self.agent_project, &self.agent_name)
    }

    /// Its reader, when it was tallied by reader.
    pub fn reader(&self) -> Option<Reader> {
        Some(Reader {
            agent_id: self.agent_id,
            agent_name: self.agent_name.clone(),
            agent_project: self.agent_project.clone(),
            namespace: self.namespace.clone()?,
            kinds: self.kinds.clone()?,
        })
    }
}

/// The scope's kept healths counted by agent and status, whoever may see them: one round
/// trip gives both the agents to decide over and, once decided, the counts. Read from
/// `environment_health` alone, by the project and tier it carries: an index-only scan of each
/// readable project's range of `environment_health_project_idx` (migration 0065), the
/// projects' array its index condition, so that the plan cache's generic plan (a parameter
/// array, which a filter would search element by element for each of the tier's rows) reads
/// the same rows as the plan of the bound values. With `by_reader`,
/// only those agents' healths, counted by agent, namespace, kinds and status: what deciding
/// under impersonation needs (grouping by the kinds costs more, so only where needed).
pub async fn tally(
    db: impl PgExecutor<'_>,
    scope: Scope<'_>,
    by_reader: Option<&[i64]>,
) -> Result<Vec<Tally>> {
    let (columns, and) = match by_reader {
        None => ("h.agent_id, h.status", ""),
        Some(_) => (
            "h.agent_id, h.namespace, h.kinds, h.status",
            " AND h.agent_id = ANY ($7)",
        ),
    };
    let (namespace, kinds) = match by_reader {
        None => ("NULL::text", "NULL::text[]"),
        Some(_) => ("t.namespace", "t.kinds"),
    };
    let sql = format!(
        "SELECT t.agent_id, a.name AS agent_name, ap.full_path AS agent_project,
                {namespace} AS namespace, {kinds} AS kinds, t.status, t.count
         FROM (SELECT {columns}, count(*) AS count FROM environment_health h
               WHERE {}{and} GROUP BY {columns}) t
         JOIN cluster_agents a ON a.id = t.agent_id JOIN projects ap ON ap.id = a.project_id",
        health_in_scope(&scope, "h")
    );
    let q = bind_scope(sqlx::query_as(&sql), scope);
    let q = match by_reader {
        Some(agents) => q.bind(agents),
        None => q,
    };
    Ok(q.fetch_all(db).await?)
}

/// A page of the scope's environments whose shown health is one of `health` (every one
/// without), in `order`, from position `offset`; each with its kept health when the viewer
/// sees it. Filtered, sorted and cut by PostgreSQL; with a `health` filter and no agent down,
/// by a walk of `environment_health` in the order (`environment_health_tier_worst_idx` within
/// a tier), that stops at the page's end, the scope tested on the kept project and tier. The agent's
/// names are joined to the page's rows only.
pub async fn page(
    db: impl PgExecutor<'_>,
    scope: Scope<'_>,
    seen: &Seen,
    health: Option<&[&str]>,
    order: Order,
    offset: i64,
    limit: i64,
) -> Result<Vec<Listed>> {
    let filtered = health.is_some();
    // Filtered, every row has a health: the scope is read from the kept healths themselves,
    // and the environments joined to the rows kept. Otherwise from the environments, each
    // with its health if any.
    let from = if filtered {
        format!(
            "FROM shown s JOIN environments e ON e.id = s.environment_id
             WHERE {} AND s.shown_status = ANY ($13)",
            health_in_scope(&scope, "s")
        )
    } else {
        format!(
            "{IN_GROUP} LEFT JOIN shown s ON s.environment_id = e.id WHERE {}",
            in_group_where(&scope)
        )
    };
    let sql = format!(
        "WITH {}, page AS (
            SELECT {ENVIRONMENT_COLUMNS}, e.updated_at, s.environment_id AS health_of, s.agent_id,
                   s.namespace, s.status, s.message, s.since, s.kinds, s.unkept_since,
                   s.shown_severity, s.shown_since
            {from}
            ORDER BY {} OFFSET $14 LIMIT $15)
         SELECT x.id, x.project_id, x.name, x.slug, x.tier, x.state, x.updated_at,
                x.health_of AS environment_id, x.agent_id, a.name AS agent_name,
                ap.full_path AS agent_project, x.namespace, x.status, x.message, x.since, x.kinds,
                x.unkept_since
         FROM page x LEFT JOIN (cluster_agents a JOIN projects ap ON ap.id = a.project_id)
           ON a.id = x.agent_id
         ORDER BY {}",
        shown(seen),
        order.sql(filtered, "e", "s"),
        order.sql(filtered, "x", "x"),
    );
    let q = bind_seen(bind_scope(sqlx::query_as(&sql), scope), seen);
    let rows: Vec<ListedRow> = q
        .bind(health)
        .bind(offset)
        .bind(limit)
        .fetch_all(db)
        .await?;
    Ok(rows.into_iter().map(Listed::from).collect())
}
