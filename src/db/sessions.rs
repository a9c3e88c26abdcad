//! SQL of signing in to the dashboard: sessions and one-time sign-in links ("Sign in with
//! GitLab" attempts are carried by the browser: `auth::attempt`). Every key is the SHA-256 of a
//! secret the caller holds; lookups ignore what has expired, and taking a link deletes it in the
//! same statement, so that each is used once even when two requests race.

use std::time::Duration;

use sqlx::PgExecutor;

use crate::error::Result;

/// A live session, with its user as the mirror knows them.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SessionRow {
    pub user_id: i64,
    pub username: String,
    pub admin: bool,
    pub csrf: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

pub async fn create_session(
    db: impl PgExecutor<'_>,
    id_hash: &[u8],
    user_id: i64,
    csrf: &str,
    lifetime: Duration,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO web_sessions (id_hash, user_id, csrf, expires_at)
         VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
    )
    .bind(id_hash)
    .bind(user_id)
    .bind(csrf)
    .bind(seconds(lifetime))
    .execute(db)
    .await?;
    Ok(())
}

/// The live session of a cookie, joined with its user (a user removed from the mirror has no
/// sessions left: the rows go with them).
pub async fn find_session(db: impl PgExecutor<'_>, id_hash: &[u8]) -> Result<Option<SessionRow>> {
    Ok(sqlx::query_as(
        "SELECT s.user_id, u.username, u.admin, s.csrf, s.expires_at
           FROM web_sessions s JOIN active_users u ON u.id = s.user_id
          WHERE s.id_hash = $1 AND s.expires_at > now()",
    )
    .bind(id_hash)
    .fetch_optional(db)
    .await?)
}

/// Ends a session; false when there was none.
pub async fn delete_session(db: impl PgExecutor<'_>, id_hash: &[u8]) -> Result<bool> {
    let deleted = sqlx::query("DELETE FROM web_sessions WHERE id_hash = $1")
        .bind(id_hash)
        .execute(db)
        .await?;
    Ok(deleted.rows_affected() == 1)
}

pub async fn create_link(
    db: impl PgExecutor<'_>,
    token_hash: &[u8],
    user_id: i64,
    lifetime: Duration,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO sign_in_links (token_hash, user_id, expires_at)
         VALUES ($1, $2, now() + make_interval(secs => $3))",
    )
    .bind(token_hash)
    .bind(user_id)
    .bind(seconds(lifetime))
    .execute(db)
    .await?;
    Ok(())
}

/// The user (id and username) of a live link, which stays: what its page shows before the
/// browser posts to use it.
pub async fn peek_link(
    db: impl PgExecutor<'_>,
    token_hash: &[u8],
) -> Result<Option<(i64, String)>> {
    Ok(sqlx::query_as(
        "SELECT l.user_id, u.username FROM sign_in_links l JOIN active_users u ON u.id = l.user_id
          WHERE l.token_hash = $1 AND l.expires_at > now()",
    )
    .bind(token_hash)
    .fetch_optional(db)
    .await?)
}

/// The user of a live link, which is used up by this call: deleted whether or not it is still
/// valid, so that a second use finds nothing.
pub async fn take_link(db: impl PgExecutor<'_>, token_hash: &[u8]) -> Result<Option<i64>> {
    let taken: Option<(i64, bool)> = sqlx::query_as(
        "DELETE FROM sign_in_links WHERE token_hash = $1
         RETURNING user_id, expires_at > now()",
    )
    .bind(token_hash)
    .fetch_optional(db)
    .await?;
    Ok(taken.and_then(|(user, live)| live.then_some(user)))
}

/// Forgets expired sessions and links; returns how many rows went.
pub async fn prune(db: &sqlx::PgPool) -> Result<u64> {
    let mut gone = 0;
    for table in ["web_sessions", "sign_in_links"] {
        gone += sqlx::query(&format!("DELETE FROM {table} WHERE expires_at <= now()"))
            .execute(db)
            .await?
            .rows_affected();
    }
    Ok(gone)
}
