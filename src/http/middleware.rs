//! The middleware around every route: the request log and its metrics, and the request timeout.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::Limits;
use crate::error::Error;
use crate::telemetry::Metrics;

/// Records and logs every request, under its route pattern (never the raw path, which would
/// make one series per id).
pub async fn observe(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let response = next.run(req).await;
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    metrics.record(method.as_str(), &route, status, elapsed);
    tracing::info!(
        method = %method,
        path,
        route,
        status,
        duration_ms = elapsed.as_secs_f64() * 1000.0,
        "request"
    );
    response
}

/// Answers 503 when a request takes longer than the limit; the handler's future is dropped,
/// which rolls back its open transaction.
pub async fn timeout(State(limits): State<Limits>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limits.request_timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => Error::Timeout(limits.request_timeout).into_response(),
    }
}
