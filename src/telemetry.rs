//! Logs and metrics: the log subscriber, and request counts and latencies by route and status
//! in Prometheus' text format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tracing_subscriber::EnvFilter;

/// Logs to stderr; the filter comes from `ENVLENS_LOG` (e.g. `debug`, `envlens=debug,sqlx=info`).
pub fn init_logging() {
    let filter =
        EnvFilter::try_from_env("ENVLENS_LOG").unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Upper bounds of the latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    method: String,
    route: String,
    status: u16,
}

#[derive(Debug, Default)]
struct Series {
    count: u64,
    sum_seconds: f64,
    /// Non-cumulative counts per bucket; the last slot is `+Inf`.
    buckets: [u64; BUCKETS.len() + 1],
}

/// Request metrics. Routes are the matched patterns, so the number of series stays bounded.
#[derive(Debug, Default)]
pub struct Metrics {
    series: Mutex<BTreeMap<Key, Series>>,
    connections_open: AtomicI64,
    connections_refused: AtomicU64,
    connections_timed_out: AtomicU64,
}

/// Counts a connection open while it lives.
pub struct OpenConnection<'a>(&'a Metrics);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    pub fn record(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|&le| seconds <= le)
            .unwrap_or(BUCKETS.len());
        let key = Key {
            method: method.to_owned(),
            route: route.to_owned(),
            status,
        };
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let s = series.entry(key).or_default();
        s.count += 1;
        s.sum_seconds += seconds;
        s.buckets[bucket] += 1;
    }

    pub fn connection_opened(&self) -> OpenConnection<'_> {
        self.connections_open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(self)
    }

    /// A connection (or a request on the reserve) turned away at the connection cap.
    pub fn connection_refused(&self) {
        self.connections_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed for sending its head too slowly, or nothing for too long.
    pub fn connection_timed_out(&self) {
        self.connections_timed_out.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = write!(
            out,
            "# HELP envlens_http_connections_open HTTP connections open.\n\
             # TYPE envlens_http_connections_open gauge\n\
             envlens_http_connections_open {}\n\
             # HELP envlens_http_connections_refused_total Connections (or their requests) refused at the connection cap.\n\
             # TYPE envlens_http_connections_refused_total counter\n\
             envlens_http_connections_refused_total {}\n\
             # HELP envlens_http_connections_timed_out_total Connections closed for a slow request head or idleness.\n\
             # TYPE envlens_http_connections_timed_out_total counter\n\
             envlens_http_connections_timed_out_total {}\n",
            self.connections_open.load(Ordering::Relaxed),
            self.connections_refused.load(Ordering::Relaxed),
            self.connections_timed_out.load(Ordering::Relaxed),
        );
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        out.push_str("# HELP envlens_http_requests_total HTTP requests answered, by method, route and status.\n");
        out.push_str("# TYPE envlens_http_requests_total counter\n");
        for (k, s) in series.iter() {
            let _ = writeln!(
                out,
                "envlens_http_requests_total{{{}}} {}",
                labels(k),
                s.count
            );
        }
        out.push_str("# HELP envlens_http_request_duration_seconds Time to answer HTTP requests (to the response head).\n");
        out.push_str("# TYPE envlens_http_request_duration_seconds histogram\n");
        for (k, s) in series.iter() {
            let l = labels(k);
            let mut cumulative = 0;
            for (i, le) in BUCKETS.iter().enumerate() {
                cumulative += s.buckets[i];
                let _ = writeln!(
                    out,
                    "envlens_http_request_duration_seconds_bucket{{{l},le=\"{le}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "envlens_http_request_duration_seconds_bucket{{{l},le=\"+Inf\"}} {}",
                s.count
            );
            let _ = writeln!(
                out,
                "envlens_http_request_duration_seconds_sum{{{l}}} {}",
                s.sum_seconds
            );
            let _ = writeln!(
                out,
                "envlens_http_request_duration_seconds_count{{{l}}} {}",
                s.count
            );
        }
        out
    }
}

fn labels(k: &Key) -> String {
    format!(
        "method=\"{}\",route=\"{}\",status=\"{}\"",
        escape(&k.method),
        escape(&k.route),
        k.status
    )
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_cumulative_buckets() {
        let m = Metrics::default();
        m.record("GET", "/-/liveness", 200, Duration::from_micros(500));
        m.record("GET", "/-/liveness", 200, Duration::from_millis(20));
        m.record("POST", "/webhooks/gitlab", 401, Duration::from_secs(30));
        let text = m.render();
        assert!(text.contains(
            "envlens_http_requests_total{method=\"GET\",route=\"/-/liveness\",status=\"200\"} 2"
        ));
        assert!(text.contains("envlens_http_request_duration_seconds_bucket{method=\"GET\",route=\"/-/liveness\",status=\"200\",le=\"0.001\"} 1"));
        assert!(text.contains("envlens_http_request_duration_seconds_bucket{method=\"GET\",route=\"/-/liveness\",status=\"200\",le=\"0.025\"} 2"));
        assert!(text.contains("envlens_http_request_duration_seconds_bucket{method=\"POST\",route=\"/webhooks/gitlab\",status=\"401\",le=\"10\"} 0"));
        assert!(text.contains("envlens_http_request_duration_seconds_bucket{method=\"POST\",route=\"/webhooks/gitlab\",status=\"401\",le=\"+Inf\"} 1"));
    }
}
