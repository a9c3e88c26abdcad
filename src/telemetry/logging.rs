//! The log subscriber: text for a person at a terminal, JSON for a log pipeline, each line
//! carrying the fields of the spans it was written in (the request's id, route, user, agent),
//! and, with `--otlp-endpoint`, the same spans exported as traces.
//!
//! What a request pays for its span and line is kept small (issue 23: at most 3% of its
//! throughput): the filter is a static one when `ENVLENS_LOG` allows (EnvFilter takes a lock
//! and a hash lookup on every poll of every span, for directives on span fields we rarely use),
//! JSON lines are built in one pass ([`super::json_log`]) with the request's fields from a
//! plain record rather than a span when nothing else needs one ([`super::request_span`]), and
//! lines are written by a thread of their own ([`super::log_writer`]).

use tracing::Subscriber;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use crate::config::LogFormat;

use super::json_log::JsonLayer;
use super::log_writer::{Flusher, LogWriter};

/// What `ENVLENS_LOG` says when it is not set.
const DEFAULT_FILTER: &str = "info,sqlx=warn";

/// Logs to stderr; the filter comes from `ENVLENS_LOG` (e.g. `debug`, `envlens=debug,sqlx=info`,
/// or EnvFilter's span-field directives). With an OTLP endpoint, spans are exported too. The
/// returned guard writes the lines still buffered and flushes the spans when dropped.
pub fn init_logging(format: LogFormat, otlp_endpoint: Option<&str>) -> anyhow::Result<Guard> {
    let directives = std::env::var("ENVLENS_LOG").unwrap_or_else(|_| DEFAULT_FILTER.into());
    let (targets, env_filter) = filter(&directives);
    let (writer, flusher) = LogWriter::start();
    // Only our JSON layer finds a request's fields without a span, and only EnvFilter's
    // span-field directives need to see the request's span.
    let records = format == LogFormat::Json && otlp_endpoint.is_none() && env_filter.is_none();
    let (traces, provider) = match otlp_endpoint {
        Some(endpoint) => {
            let (layer, provider) = super::otlp::layer(endpoint)?;
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    // A second call (tests start several servers in one process) keeps the first subscriber.
    let installed = tracing_subscriber::registry()
        .with(targets)
        .with(env_filter)
        .with(output(format, writer))
        .with(traces)
        .try_init()
        .is_ok();
    if installed {
        super::request_span::use_records(records);
        let _ = FORMAT.set(format);
    }
    Ok(Guard {
        provider,
        flusher: installed.then_some(flusher),
    })
}

/// The format chosen at start-up, for what is written outside the subscriber ([`announce`]).
static FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// Says something to the operator outside the log: on stdout where `serve` listens (scripts
/// and tests find the address there), on stderr why a command failed. With JSON logs it is a
/// JSON line of the log's own shape (`fields.message` and the `fields` given), so that every
/// line envlens writes is JSON; otherwise the message as it is.
pub fn announce(level: tracing::Level, message: &str, fields: &[(&str, &str)]) {
    let line = match FORMAT.get() {
        Some(LogFormat::Json) => super::json_log::line(level, message, fields),
        _ => message.to_owned(),
    };
    if level <= tracing::Level::WARN {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// A static per-target filter when the directives are only that, else EnvFilter (which also
/// takes what it cannot read with a warning rather than failing).
fn filter(directives: &str) -> (Option<Targets>, Option<EnvFilter>) {
    match directives.parse::<Targets>() {
        Ok(targets) => (Some(targets), None),
        Err(_) => {
            let env =
                EnvFilter::try_new(directives).unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
            (None, Some(env))
        }
    }
}

fn output<S>(format: LogFormat, writer: LogWriter) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    match format {
        // Colours only for a person at a terminal: not into a file, a pipe or a collector.
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(writer)
            .boxed(),
        LogFormat::Json => JsonLayer::new(writer).boxed(),
    }
}

/// Writes the buffered lines and flushes and stops the trace exporter, if any, when dropped.
#[must_use]
pub struct Guard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
    flusher: Option<Flusher>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
        if let Some(mut flusher) = self.flusher.take() {
            flusher.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing::level_filters::LevelFilter;

    use super::*;

    #[test]
    fn static_directives_take_the_cheap_filter_and_span_directives_env_filter() {
        for static_ in [
            "info,sqlx=warn",
            "off",
            "debug",
            "envlens=debug,sqlx=info",
            "warn",
        ] {
            let (targets, env) = filter(static_);
            assert!(targets.is_some() && env.is_none(), "{static_}");
        }
        let (targets, env) = filter("info,envlens[request{route=/graphql}]=trace");
        assert!(targets.is_none() && env.is_some());
        let (targets, _) = filter("info,sqlx=warn");
        let targets = targets.unwrap();
        assert!(targets.would_enable("envlens::http", &tracing::Level::INFO));
        assert!(!targets.would_enable("sqlx::query", &tracing::Level::INFO));
        assert!(targets.would_enable("sqlx::query", &tracing::Level::WARN));
        let (off, _) = filter("off");
        assert_eq!(off.unwrap().default_level(), Some(LevelFilter::OFF));
    }
}
