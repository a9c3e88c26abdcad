//! Watch-API tokens spent (`migrations/0063_watch_tokens.sql`): the one use of each, across
//! replicas. Times are the database's.

use sqlx::PgExecutor;

use crate::error::Result;

/// How long past its expiry a spent token's row is kept (and a socket opened with it can be
/// handed to another owner).
pub const KEPT_HOURS: i64 = 24;

/// Records the use of token `id`, valid until `expires_at` (Unix seconds): `true` the first
/// time, `false` if it was spent before. Rows kept past [`KEPT_HOURS`] go on the way.
pub async fn spend(db: impl PgExecutor<'_>, id: &str, expires_at: i64) -> Result<bool> {
    let spent: Option<bool> = sqlx::query_scalar(
        "WITH gone AS (
             DELETE FROM watch_tokens_spent
             WHERE expires_at < now() - make_interval(hours => $3::int))
         INSERT INTO watch_tokens_spent (id, expires_at) VALUES ($1, to_timestamp($2))
         ON CONFLICT (id) DO NOTHING RETURNING true",
    )
    .bind(id)
    .bind(expires_at as f64)
    .bind(KEPT_HOURS as i32)
    .fetch_optional(db)
    .await?;
    Ok(spent.unwrap_or(false))
}

/// Whether token `id` was spent (and its row is still kept).
pub async fn was_spent(db: impl PgExecutor<'_>, id: &str) -> Result<bool> {
    Ok(
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM watch_tokens_spent WHERE id = $1)")
            .bind(id)
            .fetch_one(db)
            .await?,
    )
}
