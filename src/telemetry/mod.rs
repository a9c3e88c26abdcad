//! What envlens tells its operators: logs (text or JSON, one span per request), traces over
//! OTLP when asked for, Prometheus metrics, and the request id that ties a log line to GitLab's
//! correlation id and to the cluster's audit log.

mod json_log;
mod log_writer;
pub mod logging;
pub mod metrics;
mod otlp;
pub mod request_id;
pub mod request_span;

pub use log_writer::dropped as log_lines_dropped;
pub use logging::{announce, init_logging, LogFormat};
pub use metrics::{Kind as MetricKind, Metrics};
pub use request_id::RequestId;

/// Records who is asking into the request's span, once authentication knows.
pub fn record_user(user_id: i64) {
    request_span::record_user(user_id);
}

/// Records the agent (and environment) a request is about into its span.
pub fn record_agent(agent_id: i64, environment: Option<&str>) {
    request_span::record_agent(agent_id, environment);
}
