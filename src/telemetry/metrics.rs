//! Metrics in the OpenMetrics text format, with the Prometheus project's own client
//! (`prometheus-client`): typed label sets and no global registry, so that every server a test
//! starts counts on its own.
//!
//! Names follow Prometheus' conventions (`_total`, `_seconds`, base units). Labels stay bounded:
//! HTTP routes are the matched patterns, cluster resources the API's plural names that the
//! cluster's discovery knows (any other is `other`: `k8s::observe::KnownResources`), agents
//! their ids (as many as are configured); never a user, an object's name or a raw path.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::MatchedPath;
use axum::http::Method;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the latency histograms, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    method: MethodLabel,
    route: Route,
    status: u16,
}

/// A request's method as a label: a standard method's clone copies no text.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct MethodLabel(Method);

impl EncodeLabelValue for MethodLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        self.0.as_str().encode(encoder)
    }
}

/// The route a request is counted under: the router's pattern (shared, not copied: the
/// request path's labels allocate nothing), `unmatched`, or a text of its own.
#[derive(Debug, Clone)]
pub struct Route(RouteText);

#[derive(Debug, Clone)]
enum RouteText {
    Matched(MatchedPath),
    Unmatched,
    Text(Arc<str>),
}

impl Route {
    fn as_str(&self) -> &str {
        match &self.0 {
            RouteText::Matched(path) => path.as_str(),
            RouteText::Unmatched => "unmatched",
            RouteText::Text(text) => text,
        }
    }
}

impl From<Option<&MatchedPath>> for Route {
    fn from(matched: Option<&MatchedPath>) -> Self {
        Route(matched.map_or(RouteText::Unmatched, |m| RouteText::Matched(m.clone())))
    }
}

impl From<&str> for Route {
    fn from(text: &str) -> Self {
        Route(RouteText::Text(text.into()))
    }
}

// One label value whichever way it was made: equal and hashed by its text.
impl PartialEq for Route {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Route {}

impl std::hash::Hash for Route {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl EncodeLabelValue for Route {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        self.as_str().encode(encoder)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    agent: String,
    verb: &'static str,
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterAnswerLabels {
    agent: String,
    verb: &'static str,
    resource: String,
    /// The HTTP status, or `error` when no answer came (refused, timed out).
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GitLabLabels {
    /// The endpoint's pattern, e.g. `/projects/:id/environments`.
    endpoint: &'static str,
    /// The HTTP status, or `error` when no answer came.
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FollowupLabels {
    /// `environment_lookup` or `agent_refresh`.
    kind: &'static str,
    /// What came of one attempt: recorded, refused, not_last_deployment, no_agent, gone,
    /// refreshed, retry, gave_up...
    outcome: &'static str,
}

/// An agent's connection (SPEC 14): never the agent's id, whose number has no bound.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentConnectionLabels {
    /// kas, kubeconfig, in_cluster.
    kind: &'static str,
    /// connected, agent_not_connected, token_refused, unreachable, not_checked.
    status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConnectionState {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    /// `X-Gitlab-Event` and `event_name`, `other` for any name envlens does not know.
    event: String,
    /// applied, ignored, unapplied, duplicate, rejected (a 4xx) or failed (a 5xx).
    outcome: &'static str,
}

/// Every metric envlens keeps. Cheap to share (`Arc<Metrics>`); recording takes a read lock
/// once a series exists.
pub struct Metrics {
    /// Locked to render, and to [register](Metrics::register) a reading.
    registry: std::sync::Mutex<Registry>,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: Histograms<HttpLabels>,
    cluster_requests: Family<ClusterAnswerLabels, Counter>,
    cluster_duration: Histograms<ClusterLabels>,
    gitlab_requests: Family<GitLabLabels, Counter>,
    gitlab_duration: Histograms<GitLabLabels>,
    database_connections: Family<ConnectionState, Gauge>,
    database_max_connections: Gauge,
    database_acquire: Histogram,
    database_acquire_failures: Counter,
    webhook_events: Family<WebhookLabels, Counter>,
    gitlab_followups: Family<FollowupLabels, Counter>,
    agent_connections: Family<AgentConnectionLabels, Gauge>,
    agent_status_changes: Family<AgentConnectionLabels, Counter>,
    sync_passes: Family<OutcomeLabel, Counter>,
    sync_last_complete: Gauge,
    sync_duration: Histogram,
    connections_open: Gauge,
    connections_refused: Counter,
    connections_timed_out: Counter,
    /// Unix time of the last change applied to the identity mirror, 0 before the first.
    mirror_applied_at: AtomicI64,
    mirror_applied_gauge: Gauge,
    /// Objects held by the watch caches of every cluster (SPEC 8.1).
    pub watch_cache_objects: Gauge,
    /// Watch streams open to clusters for the cache.
    pub watch_streams: Gauge,
    /// Full lists by the cache: first syncs, and again after `410 Gone` or a failed watch.
    pub watch_relists: Counter,
    /// Watch events the cache applied (bookmarks included).
    pub watch_events: Counter,
    /// Resource groups assembled again by the live feeds (subscriptions, health recorders)
    /// after a change that can reach them.
    pub feed_assemblies: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "envlens_http_requests",
            "HTTP requests answered, by method, route and status",
            http_requests.clone(),
        );
        let http_duration = Histograms::<HttpLabels>::new_with_constructor(histogram);
        registry.register(
            "envlens_http_request_duration_seconds",
            "Time to answer HTTP requests, to the response head",
            http_duration.clone(),
        );
        let cluster_requests = Family::<ClusterAnswerLabels, Counter>::default();
        registry.register(
            "envlens_cluster_requests",
            "Requests to Kubernetes API servers, by agent, verb, resource and answer",
            cluster_requests.clone(),
        );
        let cluster_duration = Histograms::<ClusterLabels>::new_with_constructor(histogram);
        registry.register(
            "envlens_cluster_request_duration_seconds",
            "Time for a Kubernetes API server to answer, to the response head",
            cluster_duration.clone(),
        );
        let gitlab_requests = Family::<GitLabLabels, Counter>::default();
        registry.register(
            "envlens_gitlab_requests",
            "Calls to GitLab's API, by endpoint and answer",
            gitlab_requests.clone(),
        );
        let gitlab_duration = Histograms::<GitLabLabels>::new_with_constructor(histogram);
        registry.register(
            "envlens_gitlab_request_duration_seconds",
            "Time for GitLab to answer a call, the whole body read",
            gitlab_duration.clone(),
        );
        let database_connections = Family::<ConnectionState, Gauge>::default();
        registry.register(
            "envlens_database_connections",
            "Open PostgreSQL connections of the pool, idle or in use",
            database_connections.clone(),
        );
        let database_max_connections = Gauge::default();
        registry.register(
            "envlens_database_max_connections",
            "The pool's maximum number of connections",
            database_max_connections.clone(),
        );
        let database_acquire = histogram();
        registry.register(
            "envlens_database_acquire_duration_seconds",
            "Time to get a connection for a request",
            database_acquire.clone(),
        );
        let database_acquire_failures = Counter::default();
        registry.register(
            "envlens_database_acquire_failures",
            "Requests that got no connection (timeout or database down)",
            database_acquire_failures.clone(),
        );
        let webhook_events = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "envlens_webhook_events",
            "GitLab webhook events received, by event and outcome",
            webhook_events.clone(),
        );
        let gitlab_followups = Family::<FollowupLabels, Counter>::default();
        registry.register(
            "envlens_gitlab_followups",
            "Work left by GitLab's hooks and done with its API (environment lookups, agent \
             refreshes), by kind and what came of each attempt",
            gitlab_followups.clone(),
        );
        let sync_passes = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "envlens_gitlab_sync_passes",
            "Passes of the sync from GitLab's API, complete or failed",
            sync_passes.clone(),
        );
        let sync_last_complete = Gauge::default();
        registry.register(
            "envlens_gitlab_sync_last_complete_timestamp_seconds",
            "Unix time the last complete sync pass ended (0: none yet)",
            sync_last_complete.clone(),
        );
        let sync_duration = Histogram::new([1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0]);
        registry.register(
            "envlens_gitlab_sync_duration_seconds",
            "Time a sync pass took, complete or not",
            sync_duration.clone(),
        );
        let connections_open = Gauge::default();
        registry.register(
            "envlens_http_connections_open",
            "HTTP connections open",
            connections_open.clone(),
        );
        let connections_refused = Counter::default();
        registry.register(
            "envlens_http_connections_refused",
            "Connections (or their requests) refused at the connection cap",
            connections_refused.clone(),
        );
        let connections_timed_out = Counter::default();
        registry.register(
            "envlens_http_connections_timed_out",
            "Connections closed for a slow request head or idleness",
            connections_timed_out.clone(),
        );
        let mirror_applied_gauge = Gauge::default();
        registry.register(
            "envlens_identity_mirror_last_applied_timestamp_seconds",
            "Unix time of the last change applied to the identity mirror (0: none yet)",
            mirror_applied_gauge.clone(),
        );
        let watch_cache_objects = Gauge::default();
        registry.register(
            "envlens_watch_cache_objects",
            "Kubernetes objects held by the watch cache",
            watch_cache_objects.clone(),
        );
        let watch_streams = Gauge::default();
        registry.register(
            "envlens_watch_streams",
            "Watch streams open to clusters for the cache",
            watch_streams.clone(),
        );
        let watch_relists = Counter::default();
        registry.register(
            "envlens_watch_relists",
            "Lists made by the watch cache: first syncs, and after 410 Gone or a failed watch",
            watch_relists.clone(),
        );
        let watch_events = Counter::default();
        registry.register(
            "envlens_watch_events",
            "Watch events applied by the watch cache, bookmarks included",
            watch_events.clone(),
        );
        let feed_assemblies = Counter::default();
        registry.register(
            "envlens_feed_assemblies",
            "Resource groups assembled again by the live feeds after a change that can reach them",
            feed_assemblies.clone(),
        );
        let agent_connections = Family::<AgentConnectionLabels, Gauge>::default();
        registry.register(
            "envlens_agent_connections",
            "Agents' cluster connections in use, by kind and status of their last request",
            agent_connections.clone(),
        );
        let agent_status_changes = Family::<AgentConnectionLabels, Counter>::default();
        registry.register(
            "envlens_agent_status_changes",
            "Changes of an agent's connection status, by kind and the status changed to",
            agent_status_changes.clone(),
        );
        registry.register_collector(Box::new(Reading {
            name: "envlens_log_lines_dropped",
            help: "Log lines dropped because the writer's buffer was full (stderr not keeping up)",
            kind: Kind::Counter,
            read: Box::new(super::log_lines_dropped),
        }));
        Metrics {
            watch_cache_objects,
            watch_streams,
            watch_relists,
            watch_events,
            feed_assemblies,
            registry: std::sync::Mutex::new(registry),
            http_requests,
            http_duration,
            cluster_requests,
            cluster_duration,
            gitlab_requests,
            gitlab_duration,
            database_connections,
            database_max_connections,
            database_acquire,
            database_acquire_failures,
            webhook_events,
            gitlab_followups,
            agent_connections,
            agent_status_changes,
            sync_passes,
            sync_last_complete,
            sync_duration,
            connections_open,
            connections_refused,
            connections_timed_out,
            mirror_applied_at: AtomicI64::new(0),
            mirror_applied_gauge,
        }
    }
}

impl Metrics {
    /// One answered HTTP request.
    pub fn record(&self, method: &Method, route: Route, status: u16, elapsed: Duration) {
        let labels = HttpLabels {
            method: MethodLabel(method.clone()),
            route,
            status,
        };
        self.http_requests.get_or_create(&labels).inc();
        self.http_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// One request to a cluster: `code` is the HTTP status, `None` when no answer came.
    pub fn cluster_request(
        &self,
        agent: &str,
        verb: &'static str,
        resource: &str,
        code: Option<u16>,
        elapsed: Duration,
    ) {
        let code = code.map_or_else(|| "error".to_owned(), |c| c.to_string());
        self.cluster_requests
            .get_or_create(&ClusterAnswerLabels {
                agent: agent.to_owned(),
                verb,
                resource: resource.to_owned(),
                code,
            })
            .inc();
        self.cluster_duration
            .get_or_create(&ClusterLabels {
                agent: agent.to_owned(),
                verb,
                resource: resource.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// One call to GitLab (each attempt of it): `code` `None` when no answer came.
    pub fn gitlab_request(&self, endpoint: &'static str, code: Option<u16>, elapsed: Duration) {
        let labels = GitLabLabels {
            endpoint,
            code: code.map_or_else(|| "error".to_owned(), |c| c.to_string()),
        };
        self.gitlab_requests.get_or_create(&labels).inc();
        self.gitlab_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// A connection handed to a request after `waited`, or none (`ok` false).
    pub fn database_acquired(&self, waited: Duration, ok: bool) {
        self.database_acquire.observe(waited.as_secs_f64());
        if !ok {
            self.database_acquire_failures.inc();
        }
    }

    /// A webhook event and what became of it: applied, ignored, unapplied, duplicate,
    /// rejected (a 4xx) or failed (a 5xx).
    pub fn webhook_event(&self, event: &str, outcome: &'static str) {
        self.webhook_events
            .get_or_create(&WebhookLabels {
                event: event.to_owned(),
                outcome,
            })
            .inc();
    }

    /// One attempt at work a GitLab hook left, and what came of it.
    pub fn gitlab_followup(&self, kind: &'static str, outcome: &'static str) {
        self.gitlab_followups
            .get_or_create(&FollowupLabels { kind, outcome })
            .inc();
    }

    /// An agent's connection of `kind` moved from `from` (`None`: it is new) to `to`, or went
    /// (`to` `None`); a move from one status to another is counted as a change.
    pub fn agent_connection(
        &self,
        kind: &'static str,
        from: Option<&'static str>,
        to: Option<&'static str>,
    ) {
        if let Some(status) = from {
            self.agent_connections
                .get_or_create(&AgentConnectionLabels { kind, status })
                .dec();
        }
        if let Some(status) = to {
            self.agent_connections
                .get_or_create(&AgentConnectionLabels { kind, status })
                .inc();
            if from.is_some() {
                self.agent_status_changes
                    .get_or_create(&AgentConnectionLabels { kind, status })
                    .inc();
            }
        }
    }

    /// A sync pass ended, complete or not, after `elapsed`.
    pub fn sync_pass(&self, complete: bool, elapsed: Duration) {
        let outcome = if complete { "complete" } else { "failed" };
        self.sync_passes
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
        self.sync_duration.observe(elapsed.as_secs_f64());
        if complete {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            self.sync_last_complete.set(now);
        }
    }

    /// Counts a connection open while the returned guard lives.
    pub fn connection_opened(&self) -> OpenConnection<'_> {
        self.connections_open.inc();
        OpenConnection(self)
    }

    /// A connection (or a request on the reserve) turned away at the connection cap.
    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    /// A connection closed for sending its head too slowly, or nothing for too long.
    pub fn connection_timed_out(&self) {
        self.connections_timed_out.inc();
    }

    /// The identity mirror changed now.
    pub fn mirror_applied(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.mirror_applied_at.store(now, Ordering::Relaxed);
    }

    /// The OpenMetrics text of every series, with the pool's gauges read now.
    pub fn render(&self, pool: Option<&sqlx::PgPool>) -> String {
        if let Some(pool) = pool {
            let size = i64::from(pool.size());
            let idle = pool.num_idle() as i64;
            let connections = &self.database_connections;
            connections
                .get_or_create(&ConnectionState { state: "idle" })
                .set(idle);
            connections
                .get_or_create(&ConnectionState { state: "in_use" })
                .set((size - idle).max(0));
            self.database_max_connections
                .set(i64::from(pool.options().get_max_connections()));
        }
        self.mirror_applied_gauge
            .set(self.mirror_applied_at.load(Ordering::Relaxed));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }

    /// A metric without labels whose value `read` gives at each scrape (a counter another
    /// part keeps, a state): `name` as exposed (a counter's ends in `_total`).
    pub fn register(
        &self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        read: impl Fn() -> u64 + Send + Sync + 'static,
    ) {
        let reading = Reading {
            name: name.strip_suffix("_total").unwrap_or(name),
            help,
            kind,
            read: Box::new(read),
        };
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        registry.register_collector(Box::new(reading));
    }
}

/// An open connection, counted until dropped.
pub struct OpenConnection<'a>(&'a Metrics);

impl Drop for OpenConnection<'_> {
    fn drop(&mut self) {
        self.0.connections_open.dec();
    }
}

/// What a [registered](Metrics::register) reading is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

struct Reading {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    read: Box<dyn Fn() -> u64 + Send + Sync>,
}

impl std::fmt::Debug for Reading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Collector for Reading {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let value = (self.read)();
        match self.kind {
            Kind::Counter => {
                let metric = ConstCounter::new(value);
                let encoder =
                    encoder.encode_descriptor(self.name, self.help, None, metric.metric_type())?;
                metric.encode(encoder)
            }
            Kind::Gauge => {
                let metric = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
                let encoder =
                    encoder.encode_descriptor(self.name, self.help, None, metric.metric_type())?;
                metric.encode(encoder)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_and_cumulative_buckets() {
        let m = Metrics::default();
        let get = Method::GET;
        m.record(&get, "/-/liveness".into(), 200, Duration::from_micros(500));
        m.record(&get, "/-/liveness".into(), 200, Duration::from_millis(20));
        m.record(
            &Method::POST,
            "/webhooks/gitlab".into(),
            401,
            Duration::from_secs(30),
        );
        m.record(&get, None.into(), 404, Duration::from_millis(1));
        m.cluster_request("7", "list", "pods", Some(403), Duration::from_millis(3));
        m.cluster_request("7", "list", "pods", None, Duration::from_millis(3));
        let text = m.render(None);
        assert!(text.contains(
            "envlens_http_requests_total{method=\"GET\",route=\"/-/liveness\",status=\"200\"} 2"
        ), "{text}");
        assert!(text.contains("envlens_http_request_duration_seconds_bucket{le=\"0.001\",method=\"GET\",route=\"/-/liveness\",status=\"200\"} 1"), "{text}");
        assert!(text.contains("envlens_http_request_duration_seconds_bucket{le=\"0.025\",method=\"GET\",route=\"/-/liveness\",status=\"200\"} 2"));
        assert!(text.contains("envlens_http_request_duration_seconds_bucket{le=\"10.0\",method=\"POST\",route=\"/webhooks/gitlab\",status=\"401\"} 0"));
        assert!(text.contains("envlens_http_request_duration_seconds_bucket{le=\"+Inf\",method=\"POST\",route=\"/webhooks/gitlab\",status=\"401\"} 1"));
        assert!(
            text.contains(
                "envlens_http_requests_total{method=\"GET\",route=\"unmatched\",status=\"404\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("envlens_cluster_requests_total{agent=\"7\",verb=\"list\",resource=\"pods\",code=\"403\"} 1"));
        assert!(text.contains("envlens_cluster_requests_total{agent=\"7\",verb=\"list\",resource=\"pods\",code=\"error\"} 1"));
        assert!(text.contains("envlens_cluster_request_duration_seconds_count{agent=\"7\",verb=\"list\",resource=\"pods\"} 2"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn counts_webhook_events_by_event_and_outcome() {
        let m = Metrics::default();
        m.webhook_event("user_create", "applied");
        m.webhook_event("user_create", "applied");
        m.webhook_event("other", "ignored");
        let text = m.render(None);
        assert!(text.contains(
            "envlens_webhook_events_total{event=\"user_create\",outcome=\"applied\"} 2\n"
        ));
        assert!(
            text.contains("envlens_webhook_events_total{event=\"other\",outcome=\"ignored\"} 1\n")
        );
        assert!(text.contains("# TYPE envlens_webhook_events counter\n"));
    }

    #[test]
    fn renders_registered_readings_as_they_are_when_asked() {
        let m = Metrics::default();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let read = count.clone();
        m.register("envlens_things_total", "Things", Kind::Counter, move || {
            read.load(Ordering::Relaxed)
        });
        m.register("envlens_up", "Up", Kind::Gauge, || 1);
        let text = m.render(None);
        assert!(
            text.contains("# TYPE envlens_things counter\nenvlens_things_total 0\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE envlens_up gauge\nenvlens_up 1\n"),
            "{text}"
        );
        count.store(3, Ordering::Relaxed);
        assert!(m.render(None).contains("\nenvlens_things_total 3\n"));
    }
}
