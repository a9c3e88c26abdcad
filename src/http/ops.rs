//! Operations endpoints: liveness, readiness, metrics.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::db::pool::Pool;
use crate::error::{Error, Result};
use crate::telemetry::Metrics;

pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Pool: FromRef<S>,
    Arc<Metrics>: FromRef<S>,
{
    Router::new()
        .route("/-/liveness", get(liveness))
        .route("/-/readiness", get(readiness))
        .route("/metrics", get(metrics))
}

/// The process answers: nothing else is checked, so a slow database never gets it restarted.
async fn liveness() -> &'static str {
    "ok"
}

/// Ready while the database answers, within two seconds; not ready at once while it is known
/// to be down (`db::pool`).
async fn readiness(State(db): State<Pool>) -> Result<&'static str> {
    let ping = async {
        let mut conn = db.acquire().await?;
        sqlx::query("SELECT 1").execute(&mut *conn).await
    };
    match tokio::time::timeout(Duration::from_secs(2), ping).await {
        Ok(Ok(_)) => Ok("ok"),
        Ok(Err(e)) => Err(Error::Unavailable(e)),
        Err(_) => Err(Error::Unavailable(sqlx::Error::PoolTimedOut)),
    }
}

async fn metrics(State(metrics): State<Arc<Metrics>>, State(db): State<Pool>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.render(Some(db.pg())),
    )
}
