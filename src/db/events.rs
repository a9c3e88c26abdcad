//! SQL of envlens' own events on an environment's timeline (SPEC 17, migration 0055): a page of
//! them, the health changes recorded once whichever replica saw them, and pruning. Deployments
//! write their events by trigger.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use crate::error::Result;
use crate::resources::timeline::{self, Cursor, Entry, Filter, HealthMark, Source};

#[derive(Debug, sqlx::FromRow)]
struct Row {
    id: i64,
    r#type: String,
    reason: String,
    message: String,
    resource_uid: Option<String>,
    first_time: DateTime<Utc>,
    last_time: DateTime<Utc>,
}

impl From<Row> for Entry {
    fn from(r: Row) -> Entry {
        Entry {
            id: timeline::envlens_id(r.id),
            event_type: r.r#type,
            reason: r.reason,
            message: r.message,
            count: 1,
            first_time: r.first_time,
            last_time: r.last_time,
            resource_uid: r.resource_uid,
            source: Source::Envlens,
        }
    }
}

const COLUMNS: &str = "id, type, reason, message, resource_uid, first_time, last_time";

/// The reasons of events shown only to viewers with `user_access` to the agent: the health
/// changes, and the Flux actions (`db::flux_actions::EVENT_REASONS`).
const GATED: &str =
    "('HealthChanged', 'GroupHealthChanged', 'FluxReconcile', 'FluxSuspend', 'FluxResume')";

/// Up to `limit` of the environment's own events that `filter` admits, newest first (the
/// timeline's order: last time, then [`timeline::envlens_id`], compared bytewise). Without
/// `resources`, the health events are left out (a viewer who may not see the group).
pub async fn page(
    db: impl PgExecutor<'_>,
    environment_id: i64,
    filter: &Filter,
    resources: bool,
    limit: i64,
) -> Result<Vec<Entry>> {
    let (after_time, after_id) = match &filter.after {
        Some(Cursor { last_time, id }) => (Some(*last_time), Some(id.as_str())),
        None => (None, None),
    };
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM environment_events
         WHERE environment_id = $1
           AND ($2::timestamptz IS NULL
                OR (last_time, 'envlens-' || lpad(id::text, 19, '0') COLLATE \"C\") < ($2, $3::text COLLATE \"C\"))
           AND ($4::timestamptz IS NULL OR last_time >= $4)
           AND ($5::text[] IS NULL OR type = ANY ($5))
           AND ($6 OR reason NOT IN {GATED})
         ORDER BY last_time DESC, id DESC LIMIT $7"
    ))
    .bind(environment_id)
    .bind(after_time)
    .bind(after_id)
    .bind(filter.since)
    .bind(filter.types.as_deref())
    .bind(resources)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Entry::from).collect())
}

/// The environment's own events with an id above `after`, oldest first, at most `limit`: what
/// a live subscriber has not been sent yet.
pub async fn since_id(
    db: impl PgExecutor<'_>,
    environment_id: i64,
    after: i64,
    resources: bool,
    limit: i64,
) -> Result<Vec<(i64, Entry)>> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM environment_events
         WHERE environment_id = $1 AND id > $2
           AND ($3 OR reason NOT IN {GATED})
         ORDER BY id LIMIT $4"
    ))
    .bind(environment_id)
    .bind(after)
    .bind(resources)
    .bind(limit)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, Entry::from(r))).collect())
}

/// The highest id of the environment's own events, 0 when there is none.
pub async fn last_id(db: impl PgExecutor<'_>, environment_id: i64) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT COALESCE(max(id), 0) FROM environment_events WHERE environment_id = $1",
    )
    .bind(environment_id)
    .fetch_one(db)
    .await?)
}

/// Records `marks` observed at `at`: a mark whose resource's last recorded health differs
/// becomes a `HealthChanged` (`GroupHealthChanged` for the group) event. A resource seen for the
/// first time (or again after its mark was pruned) is only marked: its health then is where it
/// stands, not a change, and a first view of an environment writes no burst of events (what
/// the cluster said about a new resource is in its own Events).
///
/// Several replicas may observe the same change and all call this: the upsert of the mark is
/// conditional on the health differing, and PostgreSQL re-checks that condition on the row as
/// the first writer left it (`ON CONFLICT … DO UPDATE … WHERE`), so only the first call
/// returns the mark and writes the event; the others change nothing. Returns how many events
/// were written.
///
/// `first_sight`: the marks are a recorder's first sight of the group, and it started following
/// at that time. Such a mark replaces only a mark written before then: one written since comes
/// from a replica that was following the group already, and this one's first sight may lag
/// behind it (its watch has not yet delivered the change); replacing it would record the
/// change backwards and then again. What changed while nobody followed is still recorded.
pub async fn record_health(
    db: impl PgExecutor<'_>,
    environment_id: i64,
    marks: &[HealthMark],
    at: DateTime<Utc>,
    first_sight: Option<DateTime<Utc>>,
) -> Result<u64> {
    if marks.is_empty() {
        return Ok(0);
    }
    let keys: Vec<&str> = marks.iter().map(|m| m.key.as_str()).collect();
    let healths: Vec<&str> = marks.iter().map(|m| m.health.as_str()).collect();
    let types: Vec<&str> = marks.iter().map(|m| m.event_type()).collect();
    let reasons: Vec<&str> = marks.iter().map(|m| m.reason()).collect();
    let messages: Vec<&str> = marks.iter().map(|m| m.message.as_str()).collect();
    let done = sqlx::query(
        "WITH input AS (
             SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
               AS i(resource_key, health, type, reason, message)),
         prev AS (
             SELECT m.resource_key, m.health FROM environment_health_marks m
             WHERE m.environment_id = $1 AND m.resource_key = ANY ($2)),
         marked AS (
             INSERT INTO environment_health_marks (environment_id, resource_key, health, marked_at)
             SELECT $1, resource_key, health, $7 FROM input
             ON CONFLICT (environment_id, resource_key) DO UPDATE
               SET health = excluded.health, marked_at = excluded.marked_at
               WHERE environment_health_marks.health <> excluded.health
                 AND ($8::timestamptz IS NULL OR environment_health_marks.marked_at < $8)
             RETURNING resource_key)
         INSERT INTO environment_events (environment_id, type, reason, message, resource_uid, first_time, last_time)
         SELECT $1, i.type, i.reason,
                i.message || CASE WHEN p.health IS NULL THEN '' ELSE ' (was ' || p.health || ')' END,
                NULLIF(i.resource_key, ''), $7, $7
         FROM marked JOIN input i USING (resource_key) LEFT JOIN prev p USING (resource_key)
         WHERE p.health IS NOT NULL",
    )
    .bind(environment_id)
    .bind(&keys)
    .bind(&healths)
    .bind(&types)
    .bind(&reasons)
    .bind(&messages)
    .bind(at)
    .bind(first_sight)
    .execute(db)
    .await?;
    Ok(done.rows_affected())
}

/// Removes the events whose last time is older than `before`, and the health marks not
/// changed since (a resource marked again later is seen anew). Returns the events removed.
pub async fn prune(db: impl PgExecutor<'_> + Copy, before: DateTime<Utc>) -> Result<u64> {
    let removed = sqlx::query("DELETE FROM environment_events WHERE last_time < $1")
        .bind(before)
        .execute(db)
        .await?;
    sqlx::query("DELETE FROM environment_health_marks WHERE marked_at < $1")
        .bind(before)
        .execute(db)
        .await?;
    Ok(removed.rows_affected())
}
