//! The middleware around every route: the request's span, id, log line and metrics, the
//! client's address, and the request timeout.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::Limits;
use crate::error::Error;
use crate::http::client_address::{self, TrustedProxies};
use crate::telemetry::request_id::REQUEST_ID_HEADER;
use crate::telemetry::request_span::RequestSpan;
use crate::telemetry::{Metrics, RequestId};

/// What [`observe`] needs: where it counts, and whose `X-Forwarded-For` it believes.
#[derive(Clone)]
pub struct Observed {
    pub metrics: Arc<Metrics>,
    pub trusted_proxies: TrustedProxies,
}

/// Opens the request's span and answers its id; records and logs every request under its
/// route pattern (never the raw path, which would make one series per id, and may carry
/// what a log must not).
///
/// The span carries the request id (the caller's `X-Request-Id` when well formed: GitLab's
/// correlation id), the method and route; the user, agent and environment are recorded into
/// it once known, so every line logged inside carries them. With `--otlp-endpoint` the span
/// continues the caller's W3C `traceparent`.
///
/// It also records the client's address (`client_address`): one layer rather than two, as
/// every layer of the router clones and boxes the routes below it on every request.
pub async fn observe(State(observed): State<Observed>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = RequestId::from_headers(req.headers());
    let method = req.method().clone();
    // The route's pattern is shared (an Arc), not copied.
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let span = RequestSpan::open(&id, &method, matched.as_ref(), req.headers());
    let header = id.header_value();
    req.extensions_mut().insert(id);
    client_address::record(&mut req, &observed.trusted_proxies);
    let metrics = observed.metrics;
    let handled = async move {
        let mut response = next.run(req).await;
        let elapsed = started.elapsed();
        let status = response.status().as_u16();
        let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
        metrics.record(method.as_str(), route, status, elapsed);
        response.headers_mut().insert(REQUEST_ID_HEADER, header);
        // The message as a plain `&str` field (where `info!(..., "request")` would format
        // `format_args!` through `Debug` on every request), first as the macro puts it.
        tracing::info!(
            message = "request",
            status,
            duration_ms = elapsed.as_secs_f64() * 1000.0,
        );
        response
    };
    span.run(handled).await
}

/// Answers 503 when a request takes longer than the limit; the handler's future is dropped,
/// which rolls back its open transaction.
pub async fn timeout(State(limits): State<Limits>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limits.request_timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => Error::Timeout(limits.request_timeout).into_response(),
    }
}
