//! The SQL of subscriptions (SPEC 8.2): an environment as a user may read it, the
//! environments a feed's filter admits, and the notifications of writes: the triggers of
//! migrations 0030 and 0031 queue an environment's id whenever a deployment, its agent row or
//! the environment is written, by whichever process; [`relay`] turns the queue into
//! notifications on [`CHANNEL`], and [`listen`] hears them.

use sqlx::postgres::PgListener;
use sqlx::{FromRow, PgExecutor, PgPool};

use crate::db::read::{EnvironmentRow, Viewer, ENVIRONMENT_COLUMNS, READABLE};
use crate::error::Result;

/// The channel the triggers notify, with the environment's id as payload.
pub const CHANNEL: &str = "envlens_environments";

/// The environment `id`, if the viewer may read its project.
pub async fn readable_environment(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    id: i64,
) -> Result<Option<EnvironmentRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {ENVIRONMENT_COLUMNS} FROM environments e JOIN projects p ON p.id = e.project_id
         LEFT JOIN namespaces n ON n.id = p.namespace_id WHERE e.id = $3 AND {READABLE}"
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// Which environments an `environmentsUpdated` subscription shows.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// In this group or its subgroups (a group the viewer cannot see: `Some(-1)`, nothing).
    pub group_id: Option<i64>,
    /// In the project at this path.
    pub project_path: Option<String>,
    pub tier: Option<String>,
}

/// An environment with a fingerprint of everything `environmentsUpdated` shows of it from the
/// database: the environment's row, and for each deployment status the newest deployment with
/// it and its agent row. Equal versions, nothing to send; a different one, something changed.
#[derive(Debug, Clone, FromRow)]
pub struct VersionedEnvironment {
    #[sqlx(flatten)]
    pub row: EnvironmentRow,
    pub version: i64,
}

/// The fingerprint of [`VersionedEnvironment`]: the row versions (`xmin`, the transaction that
/// wrote each row last) of the environment and of the newest deployment of each status, which
/// is what `lastDeployment(status:)` shows, with its agent row, and of its kept health
/// (`health`). Any write to them changes it.
const VERSION: &str = "('x' || left(md5(concat_ws(',', e.xmin::text, (
      SELECT string_agg(concat(l.id, '/', l.status, '/', l.xmin::text, '/', ad.xmin::text), ',' ORDER BY l.status)
      FROM (SELECT DISTINCT ON (d.status) d.id, d.status, d.xmin FROM deployments d
            WHERE d.environment_id = e.id ORDER BY d.status, d.id DESC) l
      LEFT JOIN agent_deployments ad ON ad.deployment_id = l.id),
      (SELECT h.xmin::text FROM environment_health h WHERE h.environment_id = e.id))), 16))::bit(64)::bigint AS version";

/// Those of `ids` (all when `None`) that the viewer may read and `filter` admits, by id, at
/// most `limit`, with their versions.
pub async fn matching_environments(
    db: impl PgExecutor<'_>,
    viewer: Viewer,
    ids: Option<&[i64]>,
    filter: &Filter,
    limit: i64,
) -> Result<Vec<VersionedEnvironment>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {ENVIRONMENT_COLUMNS}, {VERSION} FROM environments e JOIN projects p ON p.id = e.project_id
         LEFT JOIN namespaces n ON n.id = p.namespace_id
         WHERE ($3::bigint[] IS NULL OR e.id = ANY ($3)) AND {READABLE}
           AND ($4::bigint IS NULL OR n.traversal_ids @> ARRAY[$4::bigint])
           AND ($5::text IS NULL OR lower(p.full_path) = lower($5))
           AND ($6::text IS NULL OR e.tier = $6)
         ORDER BY e.id LIMIT $7"
    ))
    .bind(viewer.user_id)
    .bind(viewer.admin)
    .bind(ids)
    .bind(filter.group_id)
    .bind(filter.project_path.as_deref())
    .bind(filter.tier.as_deref())
    .bind(limit)
    .fetch_all(db)
    .await?)
}

/// A connection that listens to [`CHANNEL`]. What is notified while it is down is lost
/// (PostgreSQL keeps no notifications): whoever listens again must read again what it shows.
pub async fn listen(pool: &PgPool) -> Result<PgListener> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Drains the queue of written environments and notifies [`CHANNEL`] once per distinct id, in
/// one transaction: the writers never notify themselves, since PostgreSQL serializes the
/// commits of notifying transactions (migration 0031). Rows of transactions not yet committed
/// stay for the next drain. Returns how many ids were notified.
pub async fn relay(db: impl PgExecutor<'_>) -> Result<i64> {
    let (sent,): (i64,) = sqlx::query_as(
        "WITH drained AS (DELETE FROM environment_notices RETURNING environment_id)
         SELECT count(pg_notify($1, id::text)) FROM (SELECT DISTINCT environment_id AS id FROM drained) ids",
    )
    .bind(CHANNEL)
    .fetch_one(db)
    .await?;
    Ok(sent)
}
