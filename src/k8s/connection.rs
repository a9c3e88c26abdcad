//! How an agent's connection did when last used (SPEC 14's `AgentConnection.status`): each
//! cluster's client records the outcome of its requests in its [`Condition`], and a change is
//! logged once, so that an operator sees an agent drop or come back without reading every
//! request's line. And the clients of a cluster reached directly, over a connection pool
//! bounded in time and number ([`client_builder`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{Request, Response};
use chrono::{DateTime, Utc};
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt as _};

use crate::k8s::circuit::Circuit;
use crate::k8s::clusters::ConnectionKind;
use crate::telemetry::Metrics;

/// SPEC 14's `AgentConnectionStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionStatus {
    /// The cluster answered.
    Connected,
    /// GitLab's agent server has no connection from the agent's agentk.
    AgentNotConnected,
    /// GitLab's agent server refused envlens' token for the agent.
    TokenRefused,
    /// Nothing answered (or KAS cannot be used: its address is unknown).
    Unreachable,
    /// No connection is configured for the agent (SPEC 6).
    NotConfigured,
    /// Configured, not used yet.
    NotChecked,
}

impl ConnectionStatus {
    /// As the metrics name it.
    pub fn label(self) -> &'static str {
        match self {
            ConnectionStatus::Connected => "connected",
            ConnectionStatus::AgentNotConnected => "agent_not_connected",
            ConnectionStatus::TokenRefused => "token_refused",
            ConnectionStatus::Unreachable => "unreachable",
            ConnectionStatus::NotConfigured => "not_configured",
            ConnectionStatus::NotChecked => "not_checked",
        }
    }
}

/// The last outcome: its status, a message for the ones that are not [`Connected`], and when.
///
/// [`Connected`]: ConnectionStatus::Connected
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub status: ConnectionStatus,
    pub message: Option<String>,
    pub at: DateTime<Utc>,
}

/// The last outcome of one agent's connection; clones share it. Counted in the metrics by
/// kind and status while it lives (`envlens_agent_connections`), each change of status too.
#[derive(Debug, Clone)]
pub struct Condition {
    agent: Option<i64>,
    shared: Arc<Shared>,
    /// Opened and closed by the outcomes recorded ([`Circuit::outcome`]).
    circuit: Circuit,
}

#[derive(Debug)]
struct Shared {
    kind: ConnectionKind,
    metrics: Arc<Metrics>,
    last: Mutex<Option<Checked>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let last = self.last.get_mut().unwrap_or_else(|e| e.into_inner());
        let status = last
            .as_ref()
            .map_or(ConnectionStatus::NotChecked, |c| c.status);
        self.metrics
            .agent_connection(self.kind.label(), Some(status.label()), None);
    }
}

impl Condition {
    /// For the connection of `agent` (`None`: an entry by path, whose id is not known here),
    /// reached as `kind`, counted in `metrics`.
    pub fn new(agent: Option<i64>, kind: ConnectionKind, metrics: Arc<Metrics>) -> Self {
        metrics.agent_connection(
            kind.label(),
            None,
            Some(ConnectionStatus::NotChecked.label()),
        );
        Condition {
            agent,
            shared: Arc::new(Shared {
                kind,
                metrics,
                last: Mutex::default(),
            }),
            circuit: Circuit::default(),
        }
    }

    /// The agent's circuit: whether its requests are sent now.
    pub fn circuit(&self) -> &Circuit {
        &self.circuit
    }

    /// Records an outcome; logs and counts when the status differs from the last one.
    pub fn record(&self, status: ConnectionStatus, message: Option<String>) {
        let mut last = self.shared.last.lock().unwrap_or_else(|e| e.into_inner());
        self.circuit.outcome(status, message.as_deref());
        let before = last
            .as_ref()
            .map_or(ConnectionStatus::NotChecked, |c| c.status);
        if before != status {
            self.shared.metrics.agent_connection(
                self.shared.kind.label(),
                Some(before.label()),
                Some(status.label()),
            );
            let agent = self.agent.map_or_else(|| "-".to_owned(), |a| a.to_string());
            let detail = message.as_deref().unwrap_or("");
            match status {
                ConnectionStatus::Connected => {
                    tracing::info!(agent, status = ?status, "agent's cluster connection is up")
                }
                _ => {
                    tracing::warn!(agent, status = ?status, detail, "agent's cluster connection is down")
                }
            }
        }
        *last = Some(Checked {
            status,
            message,
            at: Utc::now(),
        });
    }

    /// The last outcome; `None` before the first request.
    pub fn get(&self) -> Option<Checked> {
        self.shared
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// How long a cluster client's pool keeps a connection nobody uses. A connection's HTTP read
/// buffer grows to the largest body it carried and is never shrunk: a connection left pooled
/// after a list keeps that list's buffer (up to some 400 KiB) for as long as it is kept. Long
/// enough for the lists of one view to find the connections of the view before it (a first view
/// of a GitOps group lists its inventory's namespaces a round trip after its own), short
/// enough that what a burst of lists opened is closed a moment after it.
pub const POOL_IDLE: Duration = Duration::from_secs(5);

/// The most unused connections a cluster client's pool keeps; more are closed as they come
/// back. Above the lists a first view sends at once (some 200 for a GitOps group of seven
/// namespaces), so that the next view finds them.
pub const POOL_MAX_IDLE: usize = 256;

/// kube's client stack for `config` (its TLS, authentication, address, extra headers and
/// timeouts) over a connection pool that keeps an unused connection [`POOL_IDLE`], at most
/// [`POOL_MAX_IDLE`] of them, and closes them then: kube's own pool keeps every connection until
/// a request finds it expired, however long that takes. Without kube's retry layer (a cluster's
/// 429 and 503 are the caller's: `config.default_retry` is refused) and its debug spans.
pub fn client_builder(
    config: &kube::Config,
) -> anyhow::Result<kube::client::ClientBuilder<ClusterService>> {
    pooled(config, POOL_IDLE, None)
}

/// What a watch stream's connection reads at a time, and so its HTTP read buffer: a watch's
/// answer head must fit in it (an API server's is some 400 bytes; nginx, as a proxy, refuses
/// a head larger than its 4 KiB `proxy_buffer_size` by default too), and an event larger than
/// it takes more than one read. A connection otherwise reads up to 8 KiB at a time, more
/// after a large answer, and holds that buffer for as long as it is open: a watch cache holds
/// a connection per watched kind and namespace, at rest nearly always (BENCHMARKS.md).
pub const STREAM_READ_BUFFER: usize = 4 << 10;

/// [`client_builder`] for the watch cache's streams ([`crate::k8s::watch::WatchCache::new`]):
/// each connection reads [`STREAM_READ_BUFFER`] bytes at a time, so that the connection held
/// by a watch at rest holds that much.
pub fn streams_builder(
    config: &kube::Config,
) -> anyhow::Result<kube::client::ClientBuilder<ClusterService>> {
    pooled(config, POOL_IDLE, Some(STREAM_READ_BUFFER))
}

/// [`client_builder`], keeping an unused connection `idle`, reading `read_buffer` bytes at a
/// time if given (else hyper's adaptive reads).
fn pooled(
    config: &kube::Config,
    idle: Duration,
    read_buffer: Option<usize>,
) -> anyhow::Result<kube::client::ClientBuilder<ClusterService>> {
    use anyhow::Context as _;
    use kube::client::ConfigExt as _;
    anyhow::ensure!(
        !config.default_retry,
        "the cluster's client does not retry: default_retry must be off"
    );
    anyhow::ensure!(
        config.proxy_url.is_none(),
        "a proxy between envlens and the cluster is not supported"
    );
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = config
        .rustls_https_connector_with_connector(http)
        .context("cannot set up TLS for the cluster")?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let mut pool =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
    pool.pool_timer(hyper_util::rt::TokioTimer::new())
        .pool_idle_timeout(idle)
        .pool_max_idle_per_host(POOL_MAX_IDLE);
    if let Some(size) = read_buffer {
        pool.http1_read_buf_exact_size(size);
    }
    let pool = pool.build::<_, kube::client::Body>(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().context("the cluster's credentials")?)
        .layer(
            config
                .extra_headers_layer()
                .context("the cluster's extra headers")?,
        )
        .map_err(BoxError::from)
        .service(pool)
        .map_response(|response| {
            response.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from))
                    as Box<kube::client::DynBody>
            })
        })
        .boxed();
    Ok(kube::client::ClientBuilder::new(
        service,
        config.default_namespace.clone(),
    ))
}

/// The service under a cluster's [`kube::Client`] ([`client_builder`]).
pub type ClusterService = tower::util::BoxService<
    Request<kube::client::Body>,
    Response<Box<kube::client::DynBody>>,
    BoxError,
>;

/// Records each answer of a cluster reached directly (a kubeconfig context, the pod's account):
/// any answer is [`ConnectionStatus::Connected`], no answer [`ConnectionStatus::Unreachable`].
#[derive(Clone)]
pub struct RecordLayer {
    pub condition: Condition,
}

impl<S> Layer<S> for RecordLayer {
    type Service = Record<S>;

    fn layer(&self, inner: S) -> Record<S> {
        Record {
            inner,
            condition: self.condition.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Record<S> {
    inner: S,
    condition: Condition,
}

impl<S, B, R> Service<Request<B>> for Record<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Error: std::fmt::Display,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let answer = self.inner.call(request);
        let condition = self.condition.clone();
        Box::pin(async move {
            let answer = answer.await;
            match &answer {
                Ok(_) => condition.record(ConnectionStatus::Connected, None),
                Err(e) => condition.record(ConnectionStatus::Unreachable, Some(e.to_string())),
            }
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch streams' client reads [`STREAM_READ_BUFFER`] bytes at a time: an event many
    /// times that size, sent in pieces of every size, comes whole and in order, the answer
    /// after it on the same connection too.
    #[tokio::test]
    async fn a_streams_connection_reads_events_larger_than_its_buffer() {
        use http_body_util::BodyExt as _;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let large = format!(
            "{{\"type\":\"ADDED\",\"object\":{{\"data\":\"{}\"}}}}\n",
            "x".repeat(10 * STREAM_READ_BUFFER + 7)
        );
        let events = format!("{{\"type\":\"BOOKMARK\"}}\n{large}{{\"type\":\"DELETED\"}}\n");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent = events.clone();
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buffer = [0u8; 4096];
            for _ in 0..2 {
                // Each read a whole request (a GET with no body).
                if tcp.read(&mut buffer).await.unwrap_or(0) == 0 {
                    return;
                }
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                            cache-control: no-cache, private\r\ntransfer-encoding: chunked\r\n\r\n";
                tcp.write_all(head.as_bytes()).await.unwrap();
                // Chunks of 1, 2, 4, ... bytes up to twice the buffer, each written apart.
                let (mut at, mut size) = (0, 1);
                while at < sent.len() {
                    let end = (at + size).min(sent.len());
                    let chunk = format!("{:x}\r\n{}\r\n", end - at, &sent[at..end]);
                    tcp.write_all(chunk.as_bytes()).await.unwrap();
                    tcp.flush().await.unwrap();
                    at = end;
                    size = (size * 2).min(2 * STREAM_READ_BUFFER + 3);
                }
                tcp.write_all(b"0\r\n\r\n").await.unwrap();
            }
        });
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.default_retry = false;
        let client = streams_builder(&config).unwrap().build();
        for _ in 0..2 {
            let request = Request::get("/api/v1/namespaces/a/pods?watch=true")
                .body(kube::client::Body::empty())
                .unwrap();
            let answer = client.send(request).await.unwrap();
            let body = answer.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(std::str::from_utf8(&body).unwrap(), events);
        }
    }

    /// A cluster's client takes a connection back into its pool for the next request, and
    /// closes it once unused for the pool's idle time (kube's own pool keeps it until a
    /// request finds it expired).
    #[tokio::test]
    async fn the_pool_reuses_a_connection_and_closes_it_once_idle() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (a, c) = (accepted.clone(), closed.clone());
        tokio::spawn(async move {
            loop {
                let (mut tcp, _) = listener.accept().await.unwrap();
                a.fetch_add(1, Ordering::SeqCst);
                let c = c.clone();
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    // Each read a whole request (a GET with no body): answer it, keep-alive.
                    while let Ok(n) = tcp.read(&mut buffer).await {
                        if n == 0 {
                            break;
                        }
                        let body = r#"{"major":"1","minor":"30"}"#;
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if tcp.write_all(answer.as_bytes()).await.is_err() {
                            break;
                        }
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        let mut config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        config.default_retry = false;
        let client = pooled(&config, Duration::from_millis(200), None)
            .unwrap()
            .build();
        for _ in 0..3 {
            let request = Request::get("/version").body(Vec::new()).unwrap();
            client.request_text(request).await.unwrap();
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection, reused");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while closed.load(Ordering::SeqCst) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the idle connection was never closed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The client itself is still there: only its unused connection went.
        drop(client);
    }

    #[test]
    fn keeps_the_last_outcome() {
        let metrics = Arc::new(Metrics::default());
        let condition = Condition::new(Some(7), ConnectionKind::Kas, metrics.clone());
        assert_eq!(condition.get(), None);
        condition.record(ConnectionStatus::AgentNotConnected, Some("gone".into()));
        let first = condition.get().unwrap();
        assert_eq!(first.status, ConnectionStatus::AgentNotConnected);
        assert_eq!(first.message.as_deref(), Some("gone"));
        condition.record(ConnectionStatus::Connected, None);
        let now = condition.get().unwrap();
        assert_eq!(
            (now.status, now.message),
            (ConnectionStatus::Connected, None)
        );
        assert!(now.at >= first.at);

        let text = metrics.render(None);
        for line in [
            r#"envlens_agent_connections{kind="kas",status="connected"} 1"#,
            r#"envlens_agent_connections{kind="kas",status="agent_not_connected"} 0"#,
            r#"envlens_agent_connections{kind="kas",status="not_checked"} 0"#,
            r#"envlens_agent_status_changes_total{kind="kas",status="agent_not_connected"} 1"#,
            r#"envlens_agent_status_changes_total{kind="kas",status="connected"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // A connection no longer kept is no longer counted.
        let clone = condition.clone();
        drop(condition);
        assert!(metrics
            .render(None)
            .contains(r#"envlens_agent_connections{kind="kas",status="connected"} 1"#));
        drop(clone);
        assert!(metrics
            .render(None)
            .contains(r#"envlens_agent_connections{kind="kas",status="connected"} 0"#));
    }
}
