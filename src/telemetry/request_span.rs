//! The request's span: its id, method and route, and the user, agent and environment once
//! known, carried by every line logged inside the request.
//!
//! Two shapes of the same thing, chosen once at start-up by what the log layers need:
//! - a tracing span, entered on each poll of the request's future, when something must find it
//!   as tracing's current span: the text formatter, the OTLP exporter (parents, the
//!   `traceparent` sent on), and EnvFilter's span-field directives;
//! - otherwise (JSON lines with a per-target filter, the operators' set-up) a [`Record`] of the
//!   same fields in a task-local, which the JSON layer reads when it writes a line. A tracing
//!   span costs the registry a slot, the layers' visitors a string per field, and an entered
//!   one a push, a reference count and a close check on every poll (a deployment creation is
//!   polled some fifty times); the record is six plain fields set by the request itself
//!   (issue 23: the logs may cost a request at most 3%).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::MatchedPath;
use axum::http::{HeaderMap, HeaderValue, Method};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry_http::HeaderExtractor;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::level_filters::LevelFilter;
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::RequestId;

tokio::task_local! {
    // Boxed: the task-local is swapped in and out of its thread-local on every poll of the
    // request's future, a pointer rather than the record's hundred bytes.
    static REQUEST: Box<Record>;
}

/// Whether requests carry a [`Record`] rather than an entered span.
static RECORD: AtomicBool = AtomicBool::new(false);

/// Set once, by the subscriber's set-up, to what its layers need.
pub(super) fn use_records(record: bool) {
    RECORD.store(record, Ordering::Relaxed);
}

/// A request's fields, as its span would hold them.
pub(super) struct Record {
    pub(super) request_id: HeaderValue,
    pub(super) method: Method,
    pub(super) route: Option<MatchedPath>,
    pub(super) user_id: Cell<Option<i64>>,
    pub(super) agent_id: Cell<Option<i64>>,
    pub(super) environment: RefCell<Option<Box<str>>>,
    /// The caller's `traceparent`, whose trace and span ids the lines carry.
    pub(super) traceparent: Option<HeaderValue>,
}

impl Record {
    pub(super) fn new(request_id: HeaderValue, method: Method, route: Option<MatchedPath>) -> Self {
        Record {
            request_id,
            method,
            route,
            user_id: Cell::new(None),
            agent_id: Cell::new(None),
            environment: RefCell::new(None),
            traceparent: None,
        }
    }

    /// The trace id and the caller's span id, as [`RequestId::trace_ids`] reads them.
    pub(super) fn trace_ids(&self) -> Option<(&str, &str)> {
        super::request_id::trace_ids(self.traceparent.as_ref()?)
    }

    /// The request id: checked ASCII (`RequestId`).
    pub(super) fn request_id(&self) -> &str {
        self.request_id.to_str().unwrap_or_default()
    }

    pub(super) fn route(&self) -> &str {
        self.route.as_ref().map_or(UNMATCHED, MatchedPath::as_str)
    }
}

const UNMATCHED: &str = "unmatched";

/// The request's span, opened; [`RequestSpan::run`] runs the request's handling inside.
pub struct RequestSpan(Shape);

enum Shape {
    Span(Span),
    Record(Record),
}

impl RequestSpan {
    /// Opens the span of a request with this id, method and route (the caller's
    /// `traceparent` its parent when traces are exported).
    pub fn open(
        id: &RequestId,
        method: &Method,
        route: Option<&MatchedPath>,
        headers: &HeaderMap,
    ) -> Self {
        // Nothing is written when logs are off: no record to fill either.
        if RECORD.load(Ordering::Relaxed) && LevelFilter::current() != LevelFilter::OFF {
            let mut record = Record::new(id.header_value(), method.clone(), route.cloned());
            record.traceparent = id.traceparent().cloned();
            return RequestSpan(Shape::Record(record));
        }
        let span = tracing::info_span!(
            "request",
            request_id = id.as_str(),
            method = method.as_str(),
            route = route.map_or(UNMATCHED, MatchedPath::as_str),
            user_id = tracing::field::Empty,
            agent_id = tracing::field::Empty,
            environment = tracing::field::Empty,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        );
        if span.is_disabled() {
            return RequestSpan(Shape::Span(span));
        }
        if id.traceparent().is_some() {
            let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
            let _ = span.set_parent(parent);
        }
        // The ids that join the lines to the trace: the exported span's own, else (no
        // exporter) the caller's, whose traceparent is passed on unchanged.
        let context = span.context();
        let exported = opentelemetry::trace::TraceContextExt::span(&context)
            .span_context()
            .clone();
        if exported.is_valid() {
            span.record("trace_id", exported.trace_id().to_string());
            span.record("span_id", exported.span_id().to_string());
        } else if let Some((trace_id, span_id)) = id.trace_ids() {
            span.record("trace_id", trace_id);
            span.record("span_id", span_id);
        }
        RequestSpan(Shape::Span(span))
    }

    /// Runs `future`, the request's handling, inside the span.
    pub async fn run<F: Future>(self, future: F) -> F::Output {
        match self.0 {
            Shape::Span(span) => future.instrument(span).await,
            Shape::Record(record) => carry(record, future).await,
        }
    }
}

/// Runs `future` with `record` as the request's fields.
pub(super) async fn carry<F: Future>(record: Record, future: F) -> F::Output {
    REQUEST.scope(Box::new(record), future).await
}

/// `f` of the current request's record, if the task carries one.
pub(super) fn with_record<R>(f: impl FnOnce(&Record) -> R) -> Option<R> {
    REQUEST.try_with(|record| f(record)).ok()
}

/// Records who is asking, once authentication knows.
pub(super) fn record_user(user_id: i64) {
    if with_record(|r| r.user_id.set(Some(user_id))).is_none() {
        Span::current().record("user_id", user_id);
    }
}

/// Records the agent (and environment) the request is about.
pub(super) fn record_agent(agent_id: i64, environment: Option<&str>) {
    let recorded = with_record(|r| {
        r.agent_id.set(Some(agent_id));
        if let Some(environment) = environment {
            *r.environment.borrow_mut() = Some(environment.into());
        }
    });
    if recorded.is_none() {
        let span = Span::current();
        span.record("agent_id", agent_id);
        if let Some(environment) = environment {
            span.record("environment", environment);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_carried_record_is_the_requests_inside_only() {
        let id = RequestId::from_headers(&HeaderMap::new());
        let record = Record::new(id.header_value(), Method::POST, None);
        let inside = carry(record, async {
            record_user(7);
            record_agent(3, Some("production"));
            with_record(|r| {
                (
                    r.request_id().to_owned(),
                    r.route().to_owned(),
                    r.user_id.get(),
                    r.agent_id.get(),
                    r.environment.borrow().clone(),
                )
            })
        })
        .await;
        assert_eq!(
            inside,
            Some((
                id.to_string(),
                "unmatched".into(),
                Some(7),
                Some(3),
                Some("production".into())
            ))
        );
        assert!(with_record(|_| ()).is_none());
    }
}
