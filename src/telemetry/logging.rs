//! The log subscriber: text for a person at a terminal, JSON for a log pipeline, each line
//! carrying the fields of the spans it was written in (the request's id, route, user, agent),
//! and, with `--otlp-endpoint`, the same spans exported as traces.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use crate::config::LogFormat;

/// Logs to stderr; the filter comes from `ENVLENS_LOG` (e.g. `debug`, `envlens=debug,sqlx=info`).
/// With an OTLP endpoint, spans are exported too; the returned guard flushes them when dropped.
pub fn init_logging(format: LogFormat, otlp_endpoint: Option<&str>) -> anyhow::Result<Guard> {
    let filter = || {
        EnvFilter::try_from_env("ENVLENS_LOG").unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"))
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
    };
    let (traces, guard) = match otlp_endpoint {
        Some(endpoint) => {
            let (layer, provider) = super::otlp::layer(endpoint)?;
            (Some(layer.with_filter(filter())), Guard(Some(provider)))
        }
        None => (None, Guard(None)),
    };
    // A second call (tests start several servers in one process) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter()))
        .with(traces)
        .try_init();
    Ok(guard)
}

/// Flushes and stops the trace exporter, if any, when dropped.
#[must_use]
pub struct Guard(Option<opentelemetry_sdk::trace::SdkTracerProvider>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            let _ = provider.shutdown();
        }
    }
}
