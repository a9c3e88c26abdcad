//! The HTTP server under the router: hyper's HTTP/1 connections, each bounded in time and in
//! number (SPEC 3), so that no client can hold the service with connections that send nothing.
//!
//! - A connection must send a whole request head within `--header-read-timeout` of its first
//!   byte (of its opening, for a new connection): a head sent a byte at a time is cut off.
//! - Between requests, a keep-alive connection that sends nothing is closed after
//!   `--idle-timeout`. A request in flight (a slow query, a watch) is never cut by either.
//! - At most `--max-connections` connections are served at once. Beyond that, up to
//!   `--reserved-connections` more are admitted for one request each, and only for the probes,
//!   `/metrics` and the internal API (`/api/v4/internal/`), with a short head timeout; others
//!   get 503. Past both, a connection is closed as soon as it is accepted. Every refusal is
//!   counted in `envlens_http_connections_refused_total`.
//! - The open-files limit is raised to its hard limit at start, and the cap kept below it with
//!   room for the database pool, the clusters and the files envlens opens, so that accepting
//!   never fails for want of a descriptor.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, HeaderValue, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::config::ConnectionLimits;
use crate::telemetry::Metrics;

/// Descriptors kept free of connections: the database pool, cluster clients, the embedded
/// PostgreSQL's pipes, files read at run time.
const OTHER_DESCRIPTORS: u64 = 256;
/// The head timeout of a connection admitted on the reserve: a probe sends its request at once.
const RESERVE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// Which of `serve`'s two listeners this is. Both share one open-files limit, so each is held
/// to its own part of it: the public one three quarters, the replicas' internal one the rest
/// (one connection per peer's pooled request or forwarded watch, far fewer than viewers').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Public,
    Internal,
}

impl Listener {
    /// This listener's part of the descriptors left for connections.
    fn room(self, room: u64) -> u64 {
        match self {
            Listener::Public => room - room / 4,
            Listener::Internal => room / 4,
        }
    }
}

/// Serves `router` on `listener` until `shutdown` resolves; then stops accepting, lets every
/// connection finish its request in flight (closing it after), and returns once all are closed.
pub async fn serve(
    listener: TcpListener,
    which: Listener,
    router: Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let open_files = raise_open_files_limit();
    let (max, reserved) = effective_caps(&limits, which, open_files);
    tracing::info!(
        listener = ?which,
        max_connections = max,
        reserved_connections = reserved,
        open_files = open_files.map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
        kept_for_other_files = OTHER_DESCRIPTORS,
        "connection caps"
    );
    let served = Arc::new(Semaphore::new(max));
    let reserve = Arc::new(Semaphore::new(reserved));
    let (close_tx, close_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Per-connection errors (reset before accepted) are the client's; running
                    // out of descriptors or memory clears after a pause.
                    if !is_connection_error(&e) {
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let (permit, kind) = match served.clone().try_acquire_owned() {
            Ok(permit) => (permit, Kind::Served),
            Err(_) => match reserve.clone().try_acquire_owned() {
                Ok(permit) => (permit, Kind::Reserve),
                Err(_) => {
                    metrics.connection_refused();
                    continue;
                }
            },
        };
        let connection = Connection {
            router: router.clone(),
            limits,
            kind,
            metrics: metrics.clone(),
            close: close_rx.clone(),
        };
        tokio::spawn(connection.run(stream, peer, permit));
    }
    drop(listener);
    drop(close_rx);
    let _ = close_tx.send(true);
    close_tx.closed().await;
}

/// The caps applied: `--max-connections` and `--reserved-connections`, within the listener's
/// part of the open-files limit less the other descriptors envlens needs.
fn effective_caps(
    limits: &ConnectionLimits,
    which: Listener,
    open_files: Option<u64>,
) -> (usize, usize) {
    let (mut max, mut reserved) = (limits.max_connections.max(1), limits.reserved_connections);
    if let Some(open_files) = open_files {
        let room = which
            .room(open_files.saturating_sub(OTHER_DESCRIPTORS))
            .max(2) as usize;
        reserved = reserved.min(room / 8);
        if max + reserved > room {
            max = (room - reserved).max(1);
            tracing::warn!(
                max_connections = max,
                reserved_connections = reserved,
                open_files,
                "the open-files limit caps the connections below --max-connections"
            );
        }
    }
    (max, reserved)
}

/// Raises the soft limit of open files to the hard one; returns the limit in force.
fn raise_open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Within `--max-connections`: every route, keep-alive.
    Served,
    /// On the reserve: one request, to the probes, `/metrics` or the internal API.
    Reserve,
}

/// Paths answered on a reserve connection: what the kubelet, Prometheus and GitLab need.
pub fn reserved_path(path: &str) -> bool {
    matches!(path, "/-/liveness" | "/-/readiness" | "/metrics")
        || path.starts_with("/api/v4/internal/")
}

struct Connection {
    router: Router,
    limits: ConnectionLimits,
    kind: Kind,
    metrics: Arc<Metrics>,
    close: watch::Receiver<bool>,
}

impl Connection {
    /// Serves the connection from `peer`, whose address each request carries
    /// (`ConnectInfo`, read by `http::client_address`).
    async fn run(mut self, stream: TcpStream, peer: SocketAddr, permit: OwnedSemaphorePermit) {
        let _open = self.metrics.connection_opened();
        let clock = Arc::new(Clock::new());
        // The permit lives as long as the socket, an upgraded one's included.
        let io = TokioIo::new(Watched {
            stream,
            clock: clock.clone(),
            _permit: permit,
        });
        let (router, kind, metrics) = (self.router.clone(), self.kind, self.metrics.clone());
        let requests = clock.clone();
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            let guard = requests.request_started();
            let router = router.clone();
            let metrics = metrics.clone();
            async move {
                let response = if kind == Kind::Reserve && !reserved_path(req.uri().path()) {
                    metrics.connection_refused();
                    too_many_connections()
                } else {
                    match router.oneshot(req.map(Body::new)).await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    }
                };
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    Body::new(Finished {
                        body,
                        _guard: guard,
                    })
                }))
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        // The head timeout is ours (`Clock`), measured from the first byte, not hyper's.
        builder.header_read_timeout(None);
        let (header_timeout, idle_timeout) = match self.kind {
            Kind::Served => (self.limits.header_read_timeout, self.limits.idle_timeout),
            Kind::Reserve => {
                builder.keep_alive(false);
                let short = self.limits.header_read_timeout.min(RESERVE_HEADER_TIMEOUT);
                (short, short)
            }
        };
        let connection = builder.serve_connection(io, service).with_upgrades();
        tokio::pin!(connection);
        let mut closing = false;
        loop {
            let deadline = clock.deadline(header_timeout, idle_timeout);
            tokio::select! {
                _ = connection.as_mut() => break,
                () = tokio::time::sleep_until(deadline) => {
                    if clock.expired(header_timeout, idle_timeout) {
                        self.metrics.connection_timed_out();
                        break;
                    }
                }
                _ = self.close.changed(), if !closing => {
                    // Shutting down (or the server gone): finish the request in flight, then close.
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// 503 for a request beyond the cap that the reserve does not serve.
fn too_many_connections() -> Response<Body> {
    let body = serde_json::json!({"error": {
        "code": "unavailable",
        "message": "too many connections: only probes, metrics and the internal API are served",
    }});
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// When a connection last made progress, for its head and idle timeouts.
struct Clock {
    state: Mutex<ClockState>,
    /// Set while waiting for a head: a read then starts the head timeout, once.
    waiting_first_byte: AtomicBool,
}

struct ClockState {
    /// Requests whose answer is not yet fully sent.
    in_flight: usize,
    /// When the connection became idle (opened, or its last answer sent).
    idle_since: Instant,
    /// When the first byte of the next head arrived; a new connection's starts at its opening.
    head_since: Option<Instant>,
}

impl Clock {
    fn new() -> Self {
        let now = Instant::now();
        Clock {
            state: Mutex::new(ClockState {
                in_flight: 0,
                idle_since: now,
                head_since: Some(now),
            }),
            waiting_first_byte: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes arrived: when idle, they start a head.
    fn read(&self) {
        if self.waiting_first_byte.swap(false, Ordering::Relaxed) {
            let mut state = self.lock();
            if state.in_flight == 0 && state.head_since.is_none() {
                state.head_since = Some(Instant::now());
            }
        }
    }

    fn request_started(self: &Arc<Self>) -> RequestGuard {
        let mut state = self.lock();
        state.in_flight += 1;
        state.head_since = None;
        RequestGuard(self.clone())
    }

    fn request_finished(&self) {
        let mut state = self.lock();
        state.in_flight -= 1;
        if state.in_flight == 0 {
            state.idle_since = Instant::now();
            state.head_since = None;
            self.waiting_first_byte.store(true, Ordering::Relaxed);
        }
    }

    /// When the connection would be closed if nothing happens before.
    fn deadline(&self, header_timeout: Duration, idle_timeout: Duration) -> Instant {
        let state = self.lock();
        if state.in_flight > 0 {
            // Looked at again then; a request in flight is not timed here.
            return Instant::now() + idle_timeout.max(header_timeout);
        }
        match state.head_since {
            Some(since) => since + header_timeout,
            None => state.idle_since + idle_timeout,
        }
    }

    fn expired(&self, header_timeout: Duration, idle_timeout: Duration) -> bool {
        let in_flight = self.lock().in_flight > 0;
        !in_flight && Instant::now() >= self.deadline(header_timeout, idle_timeout)
    }
}

/// Ends a request when its answer's body is dropped: sent whole, or abandoned.
struct RequestGuard(Arc<Clock>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// A response body that holds its request's guard.
struct Finished {
    body: Body,
    _guard: RequestGuard,
}

impl http_body::Body for Finished {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The socket, telling the clock when bytes arrive; it holds the connection's permit.
struct Watched {
    stream: TcpStream,
    clock: Arc<Clock>,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize, reserved: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: max,
            reserved_connections: reserved,
            ..ConnectionLimits::default()
        }
    }

    #[test]
    fn caps_stay_below_the_open_files_limit() {
        use Listener::{Internal, Public};
        let caps =
            |max, reserved, which, files| effective_caps(&limits(max, reserved), which, files);
        assert_eq!(caps(4096, 32, Public, None), (4096, 32));
        assert_eq!(caps(4096, 32, Public, Some(1 << 20)), (4096, 32));
        // 1024 descriptors: 768 for connections, 576 of them the public listener's, an eighth
        // of those at most on the reserve; 192 the internal listener's.
        assert_eq!(caps(4096, 32, Public, Some(1024)), (544, 32));
        assert_eq!(caps(4096, 200, Public, Some(1024)), (504, 72));
        assert_eq!(caps(100, 8, Public, Some(1024)), (100, 8));
        assert_eq!(caps(4096, 32, Internal, Some(1024)), (168, 24));
        // Both listeners at their caps never hold more than the room for connections.
        for files in [300, 1024, 20_000, 1 << 20] {
            let [(a, b), (c, d)] =
                [Public, Internal].map(|w| caps(1 << 30, 1 << 20, w, Some(files)));
            assert!(
                a + b + c + d <= (files - OTHER_DESCRIPTORS) as usize,
                "{files}"
            );
        }
    }

    #[test]
    fn the_reserve_serves_probes_metrics_and_gitlab_only() {
        for path in [
            "/-/liveness",
            "/-/readiness",
            "/metrics",
            "/api/v4/internal/deployments",
        ] {
            assert!(reserved_path(path), "{path}");
        }
        for path in [
            "/api/graphql",
            "/k8s-proxy/api",
            "/-/liveness/x",
            "/api/v4/internal",
        ] {
            assert!(!reserved_path(path), "{path}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_is_timed_from_its_first_byte_and_idleness_from_the_last_answer() {
        let (head, idle) = (Duration::from_secs(5), Duration::from_secs(60));
        let clock = Arc::new(Clock::new());
        // A new connection must send its head within the head timeout of opening.
        assert_eq!(clock.deadline(head, idle), Instant::now() + head);
        let guard = clock.request_started();
        tokio::time::advance(Duration::from_secs(600)).await;
        assert!(!clock.expired(head, idle), "a request in flight is not cut");
        drop(guard);
        assert_eq!(clock.deadline(head, idle), Instant::now() + idle);
        tokio::time::advance(Duration::from_secs(30)).await;
        clock.read();
        assert_eq!(clock.deadline(head, idle), Instant::now() + head);
        clock.read();
        tokio::time::advance(head).await;
        assert!(clock.expired(head, idle));
    }
}
