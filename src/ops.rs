//! Operations endpoints: liveness, readiness, metrics.

use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::error::{Error, Result};
use crate::state::AppState;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/-/liveness", get(liveness))
        .route("/-/readiness", get(readiness))
        .route("/metrics", get(metrics))
}

/// The process answers: nothing else is checked, so a slow database never gets it restarted.
async fn liveness() -> &'static str {
    "ok"
}

/// Ready while the database answers, within two seconds.
async fn readiness(State(state): State<AppState>) -> Result<&'static str> {
    let ping = sqlx::query("SELECT 1").execute(&state.db);
    match tokio::time::timeout(Duration::from_secs(2), ping).await {
        Ok(Ok(_)) => Ok("ok"),
        Ok(Err(e)) => Err(Error::Unavailable(e)),
        Err(_) => Err(Error::Unavailable(sqlx::Error::PoolTimedOut)),
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        state.metrics.render(),
    )
}
