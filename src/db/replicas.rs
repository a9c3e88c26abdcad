//! The replicas' rows and the connection leases (SPEC 16; `migrations/0061_replicas.sql`).
//! Every time is the database's `now()`, so that replicas whose clocks differ still agree on
//! who is live and which lease has expired.

use std::time::Duration;

use sqlx::PgExecutor;

use crate::error::Result;

/// A live replica: its id and the address other replicas reach it at.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Member {
    pub id: String,
    pub advertise_url: String,
}

/// Registers the replica, or moves its heartbeat on.
pub async fn heartbeat(db: impl PgExecutor<'_>, id: &str, advertise_url: &str) -> Result<()> {
    sqlx::query(
        "INSERT INTO replicas (id, advertise_url) VALUES ($1, $2)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), advertise_url = EXCLUDED.advertise_url",
    )
    .bind(id)
    .bind(advertise_url)
    .execute(db)
    .await?;
    Ok(())
}

/// The replicas whose heartbeat is younger than `window`, by id.
pub async fn live(db: impl PgExecutor<'_>, window: Duration) -> Result<Vec<Member>> {
    Ok(sqlx::query_as(
        "SELECT id, advertise_url FROM replicas
         WHERE heartbeat_at > now() - make_interval(secs => $1) ORDER BY id",
    )
    .bind(window.as_secs_f64())
    .fetch_all(db)
    .await?)
}

/// Forgets the rows of replicas dead for longer than `after`.
pub async fn forget_dead(db: impl PgExecutor<'_>, after: Duration) -> Result<()> {
    sqlx::query("DELETE FROM replicas WHERE heartbeat_at < now() - make_interval(secs => $1)")
        .bind(after.as_secs_f64())
        .execute(db)
        .await?;
    Ok(())
}

/// A stopping replica leaves at once rather than after the window.
pub async fn leave(db: impl PgExecutor<'_>, id: &str) -> Result<()> {
    sqlx::query("DELETE FROM replicas WHERE id = $1")
        .bind(id)
        .execute(db)
        .await?;
    Ok(())
}

/// Takes for `replica`, for `ttl`, the leases of `connections` that nobody holds (no row, or
/// an expired one), in one statement: those taken, with their generations. The rows are
/// written in the order given: replicas that ask in the same (sorted) order never deadlock.
pub async fn take_all(
    db: impl PgExecutor<'_>,
    connections: &[String],
    replica: &str,
    ttl: Duration,
) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "INSERT INTO connection_leases (connection, replica, generation, expires_at)
         SELECT c.connection, $2, 1, now() + make_interval(secs => $3)
           FROM unnest($1::text[]) WITH ORDINALITY AS c (connection, n)
          ORDER BY c.n
         ON CONFLICT (connection) DO UPDATE
            SET replica = EXCLUDED.replica,
                generation = connection_leases.generation + 1,
                expires_at = EXCLUDED.expires_at
            WHERE connection_leases.expires_at <= now()
         RETURNING connection, generation",
    )
    .bind(connections)
    .bind(replica)
    .bind(ttl.as_secs_f64())
    .fetch_all(db)
    .await?)
}

/// Extends, by `ttl` from now, the leases of `connections` that `replica` holds and that have
/// not expired: those renewed, with their generations. A lease missing from the answer is lost.
pub async fn renew(
    db: impl PgExecutor<'_>,
    replica: &str,
    connections: &[String],
    ttl: Duration,
) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "UPDATE connection_leases SET expires_at = now() + make_interval(secs => $3)
         WHERE replica = $1 AND connection = ANY($2) AND expires_at > now()
         RETURNING connection, generation",
    )
    .bind(replica)
    .bind(connections)
    .bind(ttl.as_secs_f64())
    .fetch_all(db)
    .await?)
}

/// Gives up `replica`'s leases of `connections` (all of them when `None`): expired at once,
/// their generation kept.
pub async fn release(
    db: impl PgExecutor<'_>,
    replica: &str,
    connections: Option<&[String]>,
) -> Result<()> {
    sqlx::query(
        "UPDATE connection_leases SET expires_at = '-infinity'
         WHERE replica = $1 AND ($2::text[] IS NULL OR connection = ANY($2))",
    )
    .bind(replica)
    .bind(connections)
    .execute(db)
    .await?;
    Ok(())
}
