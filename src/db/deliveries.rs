//! SQL of webhook deliveries already applied.

use sqlx::PgConnection;

use crate::error::Result;

/// Records a delivery id; false when it was recorded before. A concurrent duplicate waits
/// on the first one's row lock and then sees it.
pub async fn record(conn: &mut PgConnection, delivery_id: &str, event: &str) -> Result<bool> {
    let inserted = sqlx::query(
        "INSERT INTO webhook_deliveries (delivery_id, event) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    )
    .bind(delivery_id)
    .bind(event)
    .execute(conn)
    .await?;
    Ok(inserted.rows_affected() == 1)
}

/// Forgets deliveries older than `days`: GitLab redelivers within hours, not weeks.
pub async fn prune(db: &sqlx::PgPool, days: i32) -> Result<u64> {
    let deleted = sqlx::query(
        "DELETE FROM webhook_deliveries WHERE received_at < now() - make_interval(days => $1)",
    )
    .bind(days)
    .execute(db)
    .await?;
    Ok(deleted.rows_affected())
}
