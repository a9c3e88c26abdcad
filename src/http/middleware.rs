//! The middleware around every route: the request's span, id, log line and metrics, and the
//! request timeout.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::Limits;
use crate::error::Error;
use crate::telemetry::request_id::REQUEST_ID_HEADER;
use crate::telemetry::{Metrics, RequestId};

/// Opens the request's span and answers its id; records and logs every request under its
/// route pattern (never the raw path, which would make one series per id, and may carry
/// what a log must not).
///
/// The span carries the request id (the caller's `X-Request-Id` when well formed: GitLab's
/// correlation id), the method and route; the user, agent and environment are recorded into
/// it once known, so every line logged inside carries them. With `--otlp-endpoint` the span
/// continues the caller's W3C `traceparent`.
pub async fn observe(
    State(metrics): State<Arc<Metrics>>,
    mut req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let id = RequestId::from_headers(req.headers());
    let method = req.method().clone();
    // The route's pattern is shared (an Arc), not copied.
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let span = tracing::info_span!(
        "request",
        request_id = id.as_str(),
        method = method.as_str(),
        route,
        user_id = tracing::field::Empty,
        agent_id = tracing::field::Empty,
        environment = tracing::field::Empty,
    );
    if id.traceparent().is_some() {
        let parent = TraceContextPropagator::new().extract(&HeaderExtractor(req.headers()));
        let _ = span.set_parent(parent);
    }
    let header = id.header_value();
    req.extensions_mut().insert(id);
    let handled = async move {
        let mut response = next.run(req).await;
        let elapsed = started.elapsed();
        let status = response.status().as_u16();
        metrics.record(method.as_str(), route, status, elapsed);
        response.headers_mut().insert(REQUEST_ID_HEADER, header);
        tracing::info!(
            status,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
            "request"
        );
        response
    };
    crate::telemetry::request_span::run(span, handled).await
}

/// Answers 503 when a request takes longer than the limit; the handler's future is dropped,
/// which rolls back its open transaction.
pub async fn timeout(State(limits): State<Limits>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limits.request_timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => Error::Timeout(limits.request_timeout).into_response(),
    }
}
