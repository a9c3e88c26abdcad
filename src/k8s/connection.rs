//! How an agent's connection did when last used (SPEC 14's `AgentConnection.status`): each
//! cluster's client records the outcome of its requests in its [`Condition`], and a change is
//! logged once, so that an operator sees an agent drop or come back without reading every
//! request's line. And the clients of a cluster reached directly, over a connection pool
//! bounded in time and number ([`client_builder`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

/// [`client_builder`] for the watch cache's streams ([`crate::k8s::watch::WatchCache::new`]).
/// A cluster reached over TLS that accepts `h2` by ALPN (an API server does) carries them as
/// HTTP/2 streams of a few connections ([`Streams`]), as client-go does: a watch at rest then
/// holds a stream's state, not a connection with its buffers and its task. Otherwise (plain
/// `http://`, e.g. `kubectl proxy`, or a server that picks HTTP/1.1) each watch has an HTTP/1
/// connection that reads [`STREAM_READ_BUFFER`] bytes at a time, so that the connection held
/// by a watch at rest holds that much.
pub fn streams_builder(
    config: &kube::Config,
) -> anyhow::Result<kube::client::ClientBuilder<ClusterService>> {
    checked(config)?;
    let http1 = http1_pool(config, POOL_IDLE, Some(STREAM_READ_BUFFER))?;
    if config.cluster_url.scheme_str() != Some("https") {
        return stacked(config, boxed_bodies(http1));
    }
    let streams = Streams::new(connector(config, true)?, http1);
    stacked(config, streams)
}

/// [`client_builder`], keeping an unused connection `idle`, reading `read_buffer` bytes at a
/// time if given (else hyper's adaptive reads).
fn pooled(
    config: &kube::Config,
    idle: Duration,
    read_buffer: Option<usize>,
) -> anyhow::Result<kube::client::ClientBuilder<ClusterService>> {
    checked(config)?;
    let pool = http1_pool(config, idle, read_buffer)?;
    stacked(config, boxed_bodies(pool))
}

/// What the clients of a cluster refuse in `config`.
fn checked(config: &kube::Config) -> anyhow::Result<()> {
    anyhow::ensure!(
        !config.default_retry,
        "the cluster's client does not retry: default_retry must be off"
    );
    anyhow::ensure!(
        config.proxy_url.is_none(),
        "a proxy between envlens and the cluster is not supported"
    );
    Ok(())
}

/// A cluster's connector: kube's TLS for its config, its timeouts.
type Connector = hyper_timeout::TimeoutConnector<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
>;

/// The connector of `config`'s cluster, as kube's `rustls_https_connector_with_connector`
/// builds it; offering `h2` and `http/1.1` by ALPN if `h2`, else nothing (HTTP/1.1).
fn connector(config: &kube::Config, h2: bool) -> anyhow::Result<Connector> {
    use anyhow::Context as _;
    use kube::client::ConfigExt as _;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let tls = config
        .rustls_client_config()
        .context("cannot set up TLS for the cluster")?;
    let mut builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = config.tls_server_name.as_ref() {
        let name = name
            .clone()
            .try_into()
            .context("the cluster's tls-server-name")?;
        builder =
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = match h2 {
        true => builder.enable_http1().enable_http2().wrap_connector(http),
        false => builder.enable_http1().wrap_connector(http),
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    Ok(connector)
}

/// A cluster's HTTP/1 connection pool (see [`client_builder`]).
type Http1Pool = hyper_util::client::legacy::Client<Connector, kube::client::Body>;

fn http1_pool(
    config: &kube::Config,
    idle: Duration,
    read_buffer: Option<usize>,
) -> anyhow::Result<Http1Pool> {
    let mut pool =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
    pool.pool_timer(hyper_util::rt::TokioTimer::new())
        .pool_idle_timeout(idle)
        .pool_max_idle_per_host(POOL_MAX_IDLE);
    if let Some(size) = read_buffer {
        pool.http1_read_buf_exact_size(size);
    }
    Ok(pool.build(connector(config, false)?))
}

type Answer = Response<Box<kube::client::DynBody>>;

/// kube's boxed body of an answer.
fn boxed(answer: Response<hyper::body::Incoming>) -> Answer {
    answer.map(|body| {
        Box::new(http_body_util::BodyExt::map_err(body, BoxError::from))
            as Box<kube::client::DynBody>
    })
}

/// `pool` answering kube's boxed bodies.
fn boxed_bodies(
    pool: Http1Pool,
) -> tower::util::BoxCloneService<Request<kube::client::Body>, Answer, BoxError> {
    ServiceBuilder::new()
        .map_err(BoxError::from)
        .map_response(boxed)
        .service(pool)
        .boxed_clone()
}

/// kube's layers for `config` (its address, authentication, extra headers) over `inner`.
fn stacked<S>(
    config: &kube::Config,
    inner: S,
) -> anyhow::Result<kube::client::ClientBuilder<ClusterService>>
where
    S: Service<Request<kube::client::Body>, Response = Answer, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    use anyhow::Context as _;
    use kube::client::ConfigExt as _;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().context("the cluster's credentials")?)
        .layer(
            config
                .extra_headers_layer()
                .context("the cluster's extra headers")?,
        )
        .service(inner)
        .boxed();
    Ok(kube::client::ClientBuilder::new(
        service,
        config.default_namespace.clone(),
    ))
}

/// The most streams [`Streams`] opens on one HTTP/2 connection, or fewer if the server allows
/// fewer (its `SETTINGS_MAX_CONCURRENT_STREAMS`, as last heard): RFC 9113 recommends that a
/// server allow at least 100 (§5.1.2); kube-apiserver allows 1000 by default, Go's servers 250,
/// and `--http2-max-streams-per-connection` sets an API server's own. Beyond it a new
/// connection is opened, as Go's client does when a connection is full (hyper's pool would
/// queue the request on its one connection until a stream ends: a watch rarely ends).
pub const STREAMS_PER_CONNECTION: usize = 100;

/// How long [`Streams`] waits for the head of a stream's answer (an API server sends a watch's
/// at once). Longer, and the request fails and its connection takes no more streams: the server
/// does not answer on it, or the stream waits in the connection for another to end (the server
/// lowered its limit of streams below those open; [`Streams`] otherwise stays within it).
pub const STREAM_HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// How often an HTTP/2 connection of [`Streams`] is pinged, and how long its answer may take
/// before the connection is given up with its streams, as client-go checks its connections
/// (`ReadIdleTimeout` 30 s, `PingTimeout` 15 s): a watch at rest sends nothing and may hear
/// nothing for minutes, so a connection lost without a word is found this way.
pub const STREAMS_PING: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(15));

/// The most times [`Streams`] sends one request: again while the connections it went to turn
/// out closed or going away (each is then left), twice at most on a connection opened for it
/// or refused by a connection still taking streams.
const SEND_ATTEMPTS: usize = 16;

type H2Sender = hyper::client::conn::http2::SendRequest<kube::client::Body>;

/// A connection's hyper task (it hands requests to h2 and their answers back), shared between
/// the task that drives it and [`H2Connection::most`], which reads the server's limit of
/// streams off it; `None` once it has ended: its queue of requests is dropped with it, so that
/// its sender says closed and a request left in it comes back unsent.
type H2Task = Arc<
    Mutex<
        Option<
            Pin<
                Box<
                    hyper::client::conn::http2::Connection<
                        <Connector as Service<axum::http::Uri>>::Response,
                        kube::client::Body,
                        hyper_util::rt::TokioExecutor,
                    >,
                >,
            >,
        >,
    >,
>;

/// A cluster's watch streams over HTTP/2 where the cluster speaks it (see [`streams_builder`]):
/// each request a stream of a connection with room, else of a new one. A connection has room
/// below [`STREAMS_PER_CONNECTION`] streams and below the server's own limit; it is known once
/// the answer to its first stream came (a server's first frame is its SETTINGS), and until
/// then the requests that would open another connection wait for it. Once a connection's ALPN
/// chose HTTP/1.1, this client's requests go over its HTTP/1 pool.
///
/// A server that sends GOAWAY (an API server on shutdown, or at random with `--goaway-chance`,
/// so that clients spread over the servers of a cluster) takes no more streams on that
/// connection; those open go on until they end. hyper does not say so ahead (a sender's
/// `is_closed`, `poll_ready` and `ready` only see its task end, and the task is not woken by a
/// GOAWAY): the next request given to the connection comes back unsent as its task ends, and
/// goes to another connection. So does a request the server says it did not process (a stream
/// above the GOAWAY's last one, or refused with `REFUSED_STREAM`; RFC 9113 §8.7), if its body
/// can be sent again (a watch's is empty). A viewer sees none of it.
#[derive(Clone)]
pub struct Streams {
    shared: Arc<StreamsShared>,
}

struct StreamsShared {
    connector: Connector,
    http1: Http1Pool,
    connections: Mutex<H2Connections>,
    /// Held while a connection is opened and until the answer to its first stream says the
    /// server's limit, so that the requests that find every connection full at once wait for
    /// one new connection instead of each opening its own, and are placed by that limit.
    opening: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct H2Connections {
    open: Vec<H2Connection>,
    /// The cluster's TLS chose HTTP/1.1: every request goes over the HTTP/1 pool.
    http1_only: bool,
}

struct H2Connection {
    send: H2Sender,
    task: H2Task,
    slots: Arc<Slots>,
}

impl H2Connection {
    /// The most streams it may carry now: [`STREAMS_PER_CONNECTION`], or the server's limit if
    /// lower (before the server's SETTINGS came, hyper's assumption: 100); none once ended.
    fn most(&self) -> usize {
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        task.as_ref().map_or(0, |task| {
            task.current_max_send_streams().min(STREAMS_PER_CONNECTION)
        })
    }

    /// Whether it takes one more stream.
    fn has_room(&self) -> bool {
        self.slots.settled.load(Ordering::Acquire)
            && !self.slots.gone.load(Ordering::Acquire)
            && self.slots.open.load(Ordering::Acquire) < self.most()
    }
}

/// The streams open on one connection, and whether it takes more.
struct Slots {
    open: AtomicUsize,
    /// The answer to its first stream came: the server's SETTINGS, and so its limit, are known.
    settled: AtomicBool,
    /// It takes no more streams: the server said GOAWAY (the streams open go on until they
    /// end), or left a stream unanswered.
    gone: AtomicBool,
    /// Bumped each time the connection becomes unused, so that a later close of an unused
    /// connection knows whether it has been used in between.
    idled: AtomicU64,
}

/// One stream's place on its connection, given back when the answer's body is dropped.
struct Slot {
    slots: Arc<Slots>,
    shared: std::sync::Weak<StreamsShared>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.slots.open.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // The connection's last stream ended: it is closed if nothing uses it for POOL_IDLE.
        let idled = self.slots.idled.fetch_add(1, Ordering::AcqRel) + 1;
        let (slots, shared) = (self.slots.clone(), self.shared.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(POOL_IDLE).await;
                if let Some(shared) = shared.upgrade() {
                    shared.lock().open.retain(|c| {
                        !(Arc::ptr_eq(&c.slots, &slots)
                            && slots.open.load(Ordering::Acquire) == 0
                            && slots.idled.load(Ordering::Acquire) == idled)
                    });
                }
            });
        }
    }
}

/// Where a request goes: a connection's sender and the stream's place on it, and if the
/// connection was opened for it, the hold on the opening of connections.
struct Placed<'a> {
    send: H2Sender,
    slot: Slot,
    opened: Option<Opened<'a>>,
}

/// A connection opened for a request: no other is opened, and the requests waiting for one are
/// not placed, until the answer to this one's first stream has said the server's limit.
struct Opened<'a> {
    _opening: tokio::sync::MutexGuard<'a, ()>,
    slots: Arc<Slots>,
}

impl Drop for Opened<'_> {
    fn drop(&mut self) {
        // No answer came (the request failed, or was given up): the server's limit is not
        // known, and the connection takes no more streams.
        if !self.slots.settled.load(Ordering::Acquire) {
            self.slots.gone.store(true, Ordering::Release);
        }
    }
}

/// Why a server did not process a request sent on one of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unprocessed {
    /// The connection had closed (its hyper task ended, by a GOAWAY or otherwise) before the
    /// request was given to it: it came back unsent.
    Closed,
    /// Its stream was above the last one that the server's GOAWAY let through.
    GoingAway,
    /// The server refused its stream (`REFUSED_STREAM`) and still takes others.
    Refused,
}

/// Whether `error`, a stream's, says the server did not process it, so that it may be sent
/// again (RFC 9113 §8.7).
fn unprocessed(error: &hyper::Error) -> Option<Unprocessed> {
    let h2 = std::error::Error::source(error)?.downcast_ref::<h2::Error>()?;
    if !h2.is_remote() {
        return None;
    }
    if h2.is_go_away() {
        // h2 fails a stream with the GOAWAY it received only if the stream is above its last.
        Some(Unprocessed::GoingAway)
    } else if h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM) {
        Some(Unprocessed::Refused)
    } else {
        None
    }
}

/// A copy of `request` to send again, if its body can be sent again (a watch's is empty).
fn copy(request: &Request<kube::client::Body>) -> Option<Request<kube::client::Body>> {
    let mut copy = Request::new(request.body().try_clone()?);
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    Some(copy)
}

impl Streams {
    fn new(connector: Connector, http1: Http1Pool) -> Self {
        Streams {
            shared: Arc::new(StreamsShared {
                connector,
                http1,
                connections: Mutex::default(),
                opening: tokio::sync::Mutex::new(()),
            }),
        }
    }
}

impl StreamsShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, H2Connections> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stream's place on an open connection with room, if any.
    fn reserve<'a>(self: &'a Arc<Self>) -> Option<Placed<'a>> {
        let mut connections = self.lock();
        connections.open.retain(|c| !c.send.is_closed());
        let found = connections.open.iter().find(|c| c.has_room())?;
        found.slots.open.fetch_add(1, Ordering::AcqRel);
        Some(Placed {
            send: found.send.clone(),
            slot: Slot {
                slots: found.slots.clone(),
                shared: Arc::downgrade(self),
            },
            opened: None,
        })
    }

    fn http1_only(&self) -> bool {
        self.lock().http1_only
    }

    /// A stream's place, on a new connection if every one is full; `None` once the cluster
    /// chose HTTP/1.1.
    async fn stream(
        self: &Arc<Self>,
        uri: &axum::http::Uri,
    ) -> Result<Option<Placed<'_>>, BoxError> {
        use hyper_util::client::legacy::connect::Connection as _;
        if let Some(found) = self.reserve() {
            return Ok(Some(found));
        }
        let opening = self.opening.lock().await;
        if let Some(found) = self.reserve() {
            return Ok(Some(found));
        }
        if self.http1_only() {
            return Ok(None);
        }
        let io = self.connector.clone().oneshot(uri.clone()).await?;
        if !io.connected().is_negotiated_h2() {
            let cluster = uri.authority().map_or("", |a| a.as_str());
            tracing::info!(
                cluster,
                "the cluster chose HTTP/1.1: its watches go a connection each"
            );
            self.lock().http1_only = true;
            return Ok(None);
        }
        let (send, connection) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .timer(hyper_util::rt::TokioTimer::new())
                .keep_alive_interval(STREAMS_PING.0)
                .keep_alive_timeout(STREAMS_PING.1)
                .keep_alive_while_idle(true)
                .handshake(io)
                .await?;
        let task: H2Task = Arc::new(Mutex::new(Some(Box::pin(connection))));
        let driven = task.clone();
        tokio::spawn(std::future::poll_fn(move |cx| {
            let mut task = driven.lock().unwrap_or_else(|e| e.into_inner());
            let Some(connection) = task.as_mut() else {
                return Poll::Ready(());
            };
            let ended = std::task::ready!(connection.as_mut().poll(cx));
            *task = None;
            if let Err(e) = ended {
                tracing::debug!(error = %e, "a cluster's HTTP/2 connection ended");
            }
            Poll::Ready(())
        }));
        // Its first stream is this request's; the others wait for its answer.
        let slots = Arc::new(Slots {
            open: AtomicUsize::new(1),
            settled: AtomicBool::new(false),
            gone: AtomicBool::new(false),
            idled: AtomicU64::new(0),
        });
        self.lock().open.push(H2Connection {
            send: send.clone(),
            task,
            slots: slots.clone(),
        });
        Ok(Some(Placed {
            send,
            slot: Slot {
                slots: slots.clone(),
                shared: Arc::downgrade(self),
            },
            opened: Some(Opened {
                _opening: opening,
                slots,
            }),
        }))
    }

    async fn send(
        self: Arc<Self>,
        request: Request<kube::client::Body>,
    ) -> Result<Answer, BoxError> {
        let mut request = request;
        // Tries that moved nothing on: on a connection opened for the request, or refused by
        // one that still takes streams.
        let mut strikes = 0;
        for _ in 0..SEND_ATTEMPTS {
            let found = match self.http1_only() {
                true => None,
                false => self.stream(request.uri()).await?,
            };
            let Some(Placed {
                mut send,
                slot,
                opened,
            }) = found
            else {
                return Ok(boxed(self.http1.request(request).await?));
            };
            let again = copy(&request);
            let sent = tokio::time::timeout(STREAM_HEAD_TIMEOUT, send.try_send_request(request));
            let mut failed = match sent.await {
                Ok(Ok(answer)) => {
                    slot.slots.settled.store(true, Ordering::Release);
                    drop(opened);
                    return Ok(answer.map(|body| {
                        Box::new(http_body_util::BodyExt::map_err(
                            Held { body, _slot: slot },
                            BoxError::from,
                        )) as Box<kube::client::DynBody>
                    }));
                }
                Ok(Err(failed)) => failed,
                Err(_) => {
                    slot.slots.gone.store(true, Ordering::Release);
                    return Err(
                        "no answer from the cluster in time on its HTTP/2 connection".into(),
                    );
                }
            };
            let unsent = failed.take_message();
            let error = failed.into_error();
            let (why, next) = match unsent {
                Some(unsent) => (Unprocessed::Closed, unsent),
                None => match (unprocessed(&error), again) {
                    (Some(why), Some(again)) => (why, again),
                    _ => return Err(error.into()),
                },
            };
            match why {
                // The server answered the stream, after its SETTINGS.
                Unprocessed::Refused => slot.slots.settled.store(true, Ordering::Release),
                _ => slot.slots.gone.store(true, Ordering::Release),
            }
            if opened.is_some() || why == Unprocessed::Refused {
                strikes += 1;
                if strikes == 2 {
                    return Err(error.into());
                }
            }
            tracing::debug!(error = %error, ?why, "a cluster's HTTP/2 connection did not take a request: sent again");
            request = next;
        }
        Err("the cluster's HTTP/2 connections did not take the request".into())
    }
}

/// An answer's body over HTTP/2, holding its stream's place on the connection.
struct Held {
    body: hyper::body::Incoming,
    _slot: Slot,
}

impl http_body::Body for Held {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Service<Request<kube::client::Body>> for Streams {
    type Response = Answer;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        Box::pin(self.shared.clone().send(request))
    }
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

    /// The test Kubernetes server's certificate (tests/support/kube_api/tls) for a TLS server
    /// choosing `alpn` (in the client's order); and a config, for a server at `addr`, trusting
    /// its CA.
    fn tls_acceptor(alpn: &[&[u8]]) -> tokio_rustls::TlsAcceptor {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        use tokio_rustls::rustls;
        const CERT: &str = include_str!("../../tests/support/kube_api/tls/server.pem");
        const KEY: &str = include_str!("../../tests/support/kube_api/tls/server.key");
        let certs = CertificateDer::pem_slice_iter(CERT.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(KEY.as_bytes()).unwrap();
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        tls.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        tokio_rustls::TlsAcceptor::from(Arc::new(tls))
    }

    fn trusting(addr: std::net::SocketAddr) -> kube::Config {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::CertificateDer;
        use tokio_rustls::rustls;
        const CA: &str = include_str!("../../tests/support/kube_api/tls/ca.pem");
        let mut config = kube::Config::new(format!("https://{addr}").parse().unwrap());
        config.default_retry = false;
        config.root_cert = Some(vec![CertificateDer::from_pem_slice(CA.as_bytes())
            .unwrap()
            .to_vec()]);
        config
    }

    /// A TLS server for the streams' tests ([`tls_acceptor`]), whose answers are a head and a
    /// body that never ends: the request's HTTP version, then each line sent to `lines`.
    struct TlsServer {
        /// Trusting its CA.
        config: kube::Config,
        /// The connections it accepted, and those it has served to their end.
        accepted: Arc<AtomicUsize>,
        ended: Arc<AtomicUsize>,
        /// Bumped: every HTTP/2 connection open says GOAWAY (hyper's graceful shutdown: its
        /// streams go on until they end, then it closes), counted in `went_away`.
        go_away: tokio::sync::watch::Sender<u64>,
        went_away: Arc<AtomicUsize>,
        lines: tokio::sync::broadcast::Sender<String>,
    }

    /// [`TlsServer`] choosing `alpn`, allowing `streams` streams on an HTTP/2 connection.
    async fn tls_server_with(alpn: &[&[u8]], streams: u32) -> TlsServer {
        let acceptor = tls_acceptor(alpn);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = TlsServer {
            config: trusting(addr),
            accepted: Arc::default(),
            ended: Arc::default(),
            go_away: tokio::sync::watch::Sender::new(0),
            went_away: Arc::default(),
            lines: tokio::sync::broadcast::channel(16).0,
        };
        let (accepted, ended) = (server.accepted.clone(), server.ended.clone());
        let (go_away, went_away) = (server.go_away.clone(), server.went_away.clone());
        let lines = server.lines.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                accepted.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let (ended, went_away, lines) = (ended.clone(), went_away.clone(), lines.clone());
                let mut go_away = go_away.subscribe();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                    let io = hyper_util::rt::TokioIo::new(tls);
                    let answer = hyper::service::service_fn(
                        move |request: Request<hyper::body::Incoming>| {
                            let mut lines = lines.subscribe();
                            async move {
                                let (sender, body) = tokio::sync::mpsc::channel::<
                                    Result<
                                        http_body::Frame<bytes::Bytes>,
                                        std::convert::Infallible,
                                    >,
                                >(1);
                                let version = format!("{:?}\n", request.version());
                                sender
                                    .send(Ok(http_body::Frame::data(version.into())))
                                    .await
                                    .unwrap();
                                tokio::spawn(async move {
                                    loop {
                                        let line = tokio::select! {
                                            () = sender.closed() => return,
                                            line = lines.recv() => line,
                                        };
                                        let Ok(line) = line else { return };
                                        let frame =
                                            http_body::Frame::data(format!("{line}\n").into());
                                        if sender.send(Ok(frame)).await.is_err() {
                                            return;
                                        }
                                    }
                                });
                                let body = http_body_util::StreamBody::new(tokio_stream_of(body));
                                Ok::<_, std::convert::Infallible>(Response::new(body))
                            }
                        },
                    );
                    match h2 {
                        true => {
                            let connection = hyper::server::conn::http2::Builder::new(
                                hyper_util::rt::TokioExecutor::new(),
                            )
                            .max_concurrent_streams(streams)
                            .serve_connection(io, answer);
                            tokio::pin!(connection);
                            loop {
                                tokio::select! {
                                    _ = connection.as_mut() => break,
                                    Ok(()) = go_away.changed() => {
                                        connection.as_mut().graceful_shutdown();
                                        went_away.fetch_add(1, Ordering::SeqCst);
                                    }
                                }
                            }
                        }
                        false => {
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(io, answer)
                                .await;
                        }
                    }
                    ended.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        server
    }

    /// [`tls_server_with`] allowing 1000 streams a connection: its config, and its count of
    /// the connections accepted.
    async fn tls_server(alpn: &[&[u8]]) -> (kube::Config, Arc<AtomicUsize>) {
        let server = tls_server_with(alpn, 1000).await;
        (server.config, server.accepted)
    }

    /// Waits (up to 10 s) until `count` reaches `n`.
    async fn reaches(count: &AtomicUsize, n: usize, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while count.load(Ordering::SeqCst) < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: {} of {n}",
                count.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A receiver as a stream of frames.
    fn tokio_stream_of<T: Send + 'static>(
        mut receiver: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Send {
        futures_util::stream::poll_fn(move |cx| receiver.poll_recv(cx))
    }

    /// The next line of a streaming answer's body (a frame each).
    async fn next_line(body: &mut kube::client::Body) -> String {
        use http_body_util::BodyExt as _;
        let frame = body.frame().await.unwrap().unwrap();
        let data = frame.into_data().unwrap();
        String::from_utf8_lossy(&data).trim().to_owned()
    }

    /// The first line of a streaming answer's body (the version the server saw).
    async fn first_line(answer: Response<kube::client::Body>) -> String {
        next_line(&mut answer.into_body()).await
    }

    /// A watch's request in namespace `n{i}`.
    fn watch(i: usize) -> Request<kube::client::Body> {
        Request::get(format!("/api/v1/namespaces/n{i}/pods?watch=true"))
            .body(kube::client::Body::empty())
            .unwrap()
    }

    /// A server that says GOAWAY on its connections (as an API server shutting down does):
    /// their streams go on, a new stream goes over a new connection, none fails; a connection
    /// that said GOAWAY closes once its streams have ended.
    #[tokio::test]
    async fn connections_that_say_goaway_keep_their_streams_and_take_no_new_one() {
        let server = tls_server_with(&[b"h2", b"http/1.1"], 1000).await;
        let client = streams_builder(&server.config).unwrap().build();
        let mut old = Vec::new();
        for i in 0..STREAMS_PER_CONNECTION + 1 {
            let mut body = client.send(watch(i)).await.unwrap().into_body();
            assert_eq!(next_line(&mut body).await, "HTTP/2.0");
            old.push(body);
        }
        assert_eq!(server.accepted.load(Ordering::SeqCst), 2);
        // Both connections have room.
        drop(old.remove(0));

        server.go_away.send_modify(|n| *n += 1);
        reaches(&server.went_away, 2, "connections that said GOAWAY").await;
        // The line comes after the GOAWAY on each connection: the client has read it.
        server.lines.send("after".into()).unwrap();
        for body in &mut old {
            assert_eq!(next_line(body).await, "after");
        }
        let mut new = client.send(watch(0)).await.unwrap().into_body();
        assert_eq!(next_line(&mut new).await, "HTTP/2.0");
        assert_eq!(
            server.accepted.load(Ordering::SeqCst),
            3,
            "a new connection"
        );
        server.lines.send("later".into()).unwrap();
        for body in old.iter_mut().chain([&mut new]) {
            assert_eq!(next_line(body).await, "later");
        }

        // Their streams ended, the connections that said GOAWAY close; the new one stays.
        drop(old);
        reaches(&server.ended, 2, "connections closed").await;
        server.lines.send("last".into()).unwrap();
        assert_eq!(next_line(&mut new).await, "last");
        let mut another = client.send(watch(1)).await.unwrap().into_body();
        assert_eq!(next_line(&mut another).await, "HTTP/2.0");
        assert_eq!(server.accepted.load(Ordering::SeqCst), 3);
        assert_eq!(server.ended.load(Ordering::SeqCst), 2);
    }

    /// A server allowing 10 streams a connection gets 10 on each of its connections, the
    /// requests sent at once all answered (a stream beyond the server's limit would wait in
    /// the connection until another ended, and fail after STREAM_HEAD_TIMEOUT).
    #[tokio::test]
    async fn streams_stay_within_the_servers_own_limit() {
        let server = tls_server_with(&[b"h2", b"http/1.1"], 10).await;
        let client = streams_builder(&server.config).unwrap().build();
        let sent: Vec<_> = (0..25)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { client.send(watch(i)).await })
            })
            .collect();
        let mut open = Vec::new();
        for sent in sent {
            let mut body = sent.await.unwrap().unwrap().into_body();
            assert_eq!(next_line(&mut body).await, "HTTP/2.0");
            open.push(body);
        }
        assert_eq!(server.accepted.load(Ordering::SeqCst), 3, "10, 10 and 5");
        server.lines.send("event".into()).unwrap();
        for body in &mut open {
            assert_eq!(next_line(body).await, "event");
        }
    }

    /// A stream the server refuses (`REFUSED_STREAM`: not processed, RFC 9113 §8.7) is sent
    /// again; the answer is the second stream's.
    #[tokio::test]
    async fn a_refused_stream_is_sent_again() {
        let acceptor = tls_acceptor(&[b"h2"]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = trusting(listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = requests.clone();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let tls = acceptor.accept(tcp).await.unwrap();
            let mut connection = h2::server::handshake(tls).await.unwrap();
            let mut answering = Vec::new();
            while let Some(Ok((_, mut respond))) = connection.accept().await {
                if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                    continue;
                }
                let mut stream = respond.send_response(Response::new(()), false).unwrap();
                stream
                    .send_data(bytes::Bytes::from_static(b"answered\n"), false)
                    .unwrap();
                answering.push(stream);
            }
        });
        let client = streams_builder(&config).unwrap().build();
        let answer = client.send(watch(0)).await.unwrap();
        assert_eq!(first_line(answer).await, "answered");
        assert_eq!(requests.load(Ordering::SeqCst), 2);
    }

    /// Over TLS to a server that accepts `h2`, the streams go as HTTP/2 streams of one
    /// connection up to [`STREAMS_PER_CONNECTION`], then of a second connection; all open at
    /// once, none waiting for another to end.
    #[tokio::test]
    async fn streams_share_http2_connections_up_to_their_bound() {
        let (config, accepted) = tls_server(&[b"h2", b"http/1.1"]).await;
        let client = streams_builder(&config).unwrap().build();
        let mut open = Vec::new();
        for i in 0..STREAMS_PER_CONNECTION + 1 {
            let request = Request::get(format!("/api/v1/namespaces/n{i}/pods?watch=true"))
                .body(kube::client::Body::empty())
                .unwrap();
            let answer = client.send(request).await.unwrap();
            open.push(answer);
            let expected = 1 + (i / STREAMS_PER_CONNECTION);
            assert_eq!(accepted.load(Ordering::SeqCst), expected, "stream {i}");
        }
        for answer in open {
            assert_eq!(first_line(answer).await, "HTTP/2.0");
        }
    }

    /// Over TLS to a server that chooses HTTP/1.1, the streams go an HTTP/1.1 connection each.
    #[tokio::test]
    async fn streams_go_over_http1_where_the_cluster_chooses_it() {
        let (config, accepted) = tls_server(&[b"http/1.1"]).await;
        let client = streams_builder(&config).unwrap().build();
        let mut open = Vec::new();
        for _ in 0..3 {
            let request = Request::get("/api/v1/namespaces/a/pods?watch=true")
                .body(kube::client::Body::empty())
                .unwrap();
            open.push(client.send(request).await.unwrap());
        }
        for answer in open {
            assert_eq!(first_line(answer).await, "HTTP/1.1");
        }
        // The first connection chose HTTP/1.1 and was left; then one for each stream.
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
    }

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
