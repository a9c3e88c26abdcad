//! The middleware around every route: the request's span, id, log line and metrics, the
//! client's address, and the request timeout.
//!
//! Both are tower layers written out rather than `axum::middleware::from_fn`: a `from_fn`
//! layer clones the route below it into a new boxed service on every request, takes the
//! request apart and together again for its extractors, and boxes its future, and its `Next`
//! goes through one more boxed route; these call the route below directly (tower's
//! `poll_ready` then `call`), the timeout with no allocation at all.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::response::{IntoResponse, Response};
use tower::{Layer, Service};

use crate::error::Error;
use crate::http::client_address::{self, TrustedProxies};
use crate::telemetry::request_id::REQUEST_ID_HEADER;
use crate::telemetry::request_span::RequestSpan;
use crate::telemetry::{Metrics, RequestId};

/// What [`Observe`] needs: where it counts, and whose `X-Forwarded-For` it believes.
#[derive(Clone)]
pub struct Observed {
    pub metrics: Arc<Metrics>,
    pub trusted_proxies: TrustedProxies,
}

impl<S> Layer<S> for Observed {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            observed: self.clone(),
        }
    }
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
/// It also records the client's address (`client_address`): one layer rather than two, each
/// a service and a future more on every request.
#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    observed: Observed,
}

impl<S> Service<Request> for Observe<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let started = Instant::now();
        let id = RequestId::from_headers(req.headers());
        let method = req.method().clone();
        // The route's pattern is shared (an Arc), not copied.
        let matched = req.extensions().get::<MatchedPath>().cloned();
        let span = RequestSpan::open(&id, &method, matched.as_ref(), req.headers());
        let header = id.header_value();
        req.extensions_mut().insert(id);
        client_address::record(&mut req, &self.observed.trusted_proxies);
        let metrics = self.observed.metrics.clone();
        // Called now, polled inside the span: a route's future does nothing until polled.
        let inner = self.inner.call(req);
        let handled = async move {
            let Ok(mut response) = inner.await;
            let elapsed = started.elapsed();
            let status = response.status().as_u16();
            metrics.record(&method, matched.as_ref().into(), status, elapsed);
            response.headers_mut().insert(REQUEST_ID_HEADER, header);
            // The message as a plain `&str` field (where `info!(..., "request")` would format
            // `format_args!` through `Debug` on every request), first as the macro puts it.
            tracing::info!(
                message = "request",
                status,
                duration_ms = elapsed.as_secs_f64() * 1000.0,
            );
            Ok(response)
        };
        Box::pin(span.run(handled))
    }
}

/// Answers 503 when a request takes longer than the limit; the handler's future is dropped,
/// which rolls back its open transaction.
#[derive(Clone, Copy)]
pub struct TimeoutLayer(pub Duration);

impl<S> Layer<S> for TimeoutLayer {
    type Service = Timeout<S>;

    fn layer(&self, inner: S) -> Timeout<S> {
        Timeout {
            inner,
            limit: self.0,
        }
    }
}

/// [`TimeoutLayer`]'s service.
#[derive(Clone)]
pub struct Timeout<S> {
    inner: S,
    limit: Duration,
}

impl<S> Service<Request> for Timeout<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = TimeoutFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        TimeoutFuture {
            inner: tokio::time::timeout(self.limit, self.inner.call(req)),
            limit: self.limit,
        }
    }
}

pin_project_lite::pin_project! {
    /// The route's future under the request timeout.
    pub struct TimeoutFuture<F> {
        #[pin]
        inner: tokio::time::Timeout<F>,
        limit: Duration,
    }
}

impl<F> Future for TimeoutFuture<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        Poll::Ready(match ready!(this.inner.poll(cx)) {
            Ok(answered) => answered,
            Err(_) => Ok(Error::Timeout(*this.limit).into_response()),
        })
    }
}
