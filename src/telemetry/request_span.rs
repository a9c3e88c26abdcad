//! The request's span, carried through the request's task without entering it on every poll.
//!
//! An entered span costs the registry a push, a reference count and a close check through
//! every layer on each poll of the request's future, and a deployment creation is polled some
//! fifty times (once per database answer): that was most of what its JSON line cost. The JSON
//! layer is ours and finds the request's span in a task-local instead; the span is still
//! entered when something else must find it as the current span: the text formatter, and the
//! OTLP exporter (parents, the `traceparent` sent on).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::{Instrument, Span};

tokio::task_local! {
    static REQUEST: Span;
}

/// Whether request spans are entered (the default) or only carried.
static ENTER: AtomicBool = AtomicBool::new(true);

/// Set once, by the subscriber's set-up, to what its layers need.
pub(super) fn enter_spans(enter: bool) {
    ENTER.store(enter, Ordering::Relaxed);
}

/// Runs `future`, a request's handling, inside `span`.
pub async fn run<F: Future>(span: Span, future: F) -> F::Output {
    if ENTER.load(Ordering::Relaxed) {
        future.instrument(span).await
    } else {
        carry(span, future).await
    }
}

/// Runs `future` with `span` as the request's span, not entered.
pub(super) async fn carry<F: Future>(span: Span, future: F) -> F::Output {
    REQUEST.scope(span, future).await
}

/// The current request's span: the carried one, else the entered one.
pub(super) fn current() -> Span {
    REQUEST
        .try_with(Span::clone)
        .unwrap_or_else(|_| Span::current())
}

/// The id of the span carried by the current task, if any.
pub(super) fn carried_id() -> Option<tracing::Id> {
    REQUEST.try_with(Span::id).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_carried_span_is_the_requests_span_inside_only() {
        let subscriber = tracing_subscriber::registry();
        let _default = tracing::subscriber::set_default(subscriber);
        let span = tracing::info_span!("request");
        let id = span.id();
        assert!(id.is_some());
        let inside = carry(span, async { (carried_id(), current().id()) }).await;
        assert_eq!(inside, (id.clone(), id));
        assert_eq!(carried_id(), None);
        assert_eq!(current().id(), None);
    }
}
