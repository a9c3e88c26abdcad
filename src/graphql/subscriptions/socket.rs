//! The WebSocket at `GET /api/graphql` (SPEC 8.2): `graphql-transport-ws` and the older
//! `graphql-ws`, both spoken by async-graphql's `http::WebSocket`; this module adds what a
//! service on the internet needs around it.
//!
//! - The `Origin` is checked before the upgrade: a browser sends the user's cookie with a
//!   WebSocket from any site, so only envlens' own origin (`--public-url`) and the configured
//!   CORS origins may open one (cross-site WebSocket hijacking). A client that sends no
//!   `Origin` is no browser, and carries its own credentials.
//! - Authentication happens in `connection_init`, through `auth::authenticate` as for every
//!   other request: the payload's `Authorization` (a bearer token) or, with the session
//!   cookie of the upgrade request, its `X-Csrf-Token` (or the `gitlab-csrf-token` query
//!   parameter). A refusal closes the socket with 4403 and the reason.
//! - Bounds: the size of a message, subscriptions per connection, connections in all; a
//!   connection that does not initialise within [`SocketLimits::init_timeout`] is closed
//!   (4408), one that answers no ping for two intervals too, and one with no subscription for
//!   [`SocketLimits::idle_timeout`].
//! - Memory: an idle socket keeps little. Its buffers grow to the largest frame and stay that
//!   large (tungstenite keeps their capacity), and a first `resourceGroupUpdated` with every
//!   manifest is some 150 KB: so a message longer than [`FRAME_BYTES`] goes out in fragments
//!   of that size, and neither end's frame buffer grows past it. axum's WebSocket cannot send
//!   fragments, so the upgrade is answered here and the socket is tokio-tungstenite's own.
//! - Fan-out: a connection splices (`graphql::splice`): a `resourceGroupUpdated` message's
//!   payload is rendered once per feed message and selection and shared by every subscriber;
//!   each socket writes its own envelope (its protocol's, with its subscription's id) around
//!   the shared bytes, which go out as frames that are slices of them.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_graphql::futures_util::{SinkExt, Stream, StreamExt};
use async_graphql::http::{WebSocket as GraphQLSocket, WsMessage};
use async_graphql::{Data, Executor};
use axum::body::Body;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::{
    AUTHORIZATION, CONNECTION, COOKIE, ORIGIN, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY,
    SEC_WEBSOCKET_PROTOCOL, UPGRADE,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data as OpData, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::Live;
use crate::auth::{authenticate, CurrentUser, Keys, CSRF_HEADER};
use crate::error::Error;
use crate::gitlab::tokens::Purpose;
use crate::gitlab::Instance;
use crate::graphql::loaders::{self, SessionUser};
use crate::graphql::splice::Splices;
use crate::graphql::Engine;
use crate::http::client_address::ClientAddress;

/// What one connection, and all of them together, may take.
#[derive(Debug, Clone, Copy)]
pub struct SocketLimits {
    /// The largest message (and frame) a client may send.
    pub max_message_bytes: usize,
    /// Subscriptions running at once on one connection.
    pub max_subscriptions: usize,
    /// WebSocket connections open at once.
    pub max_connections: usize,
    /// From the upgrade to `connection_init` accepted.
    pub init_timeout: Duration,
    /// How often the server pings; a client silent for two intervals is gone.
    pub ping_interval: Duration,
    /// A connection without a subscription for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for SocketLimits {
    /// 64 KiB messages (a subscription document is a few hundred bytes), 20 subscriptions per
    /// connection, 10,000 connections, 10 s to initialise (graphql-ws' own default), a ping
    /// every 30 s, 5 minutes idle.
    fn default() -> Self {
        SocketLimits {
            max_message_bytes: 64 * 1024,
            max_subscriptions: 20,
            max_connections: 10_000,
            init_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// Who may open a socket from a browser: envlens' own origin and the CORS origins, as
/// `scheme://host[:port]` in lower case.
#[derive(Debug, Clone, Default)]
pub struct Origins(Vec<String>);

impl Origins {
    pub fn new<'a>(public_url: Option<&str>, cors: impl IntoIterator<Item = &'a String>) -> Self {
        let mut origins: Vec<String> = cors.into_iter().filter_map(|o| origin_of(o)).collect();
        origins.extend(public_url.and_then(origin_of));
        Origins(origins)
    }

    /// Whether a request with this `Origin` header may open a socket (none: not a browser).
    pub fn allow(&self, origin: Option<&HeaderValue>) -> Result<(), String> {
        let Some(origin) = origin else { return Ok(()) };
        let text = origin.to_str().unwrap_or("");
        match origin_of(text) {
            Some(o) if self.0.contains(&o) => Ok(()),
            _ => Err(format!(
                "WebSocket connections from origin `{}` are not allowed: only envlens' own \
                 (--public-url) and the configured cors.allowed_origins may subscribe",
                String::from_utf8_lossy(origin.as_bytes())
            )),
        }
    }
}

/// `scheme://host[:port]` of a URL or origin, lower case, the default port left out.
fn origin_of(url: &str) -> Option<String> {
    let uri: Uri = url.trim().trim_end_matches('/').parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    let host = authority.host().to_ascii_lowercase();
    let default = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    Some(match authority.port_u16() {
        Some(port) if port != default => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
}

/// The subprotocols, in our order of preference.
const TRANSPORT_WS: &str = "graphql-transport-ws";
const LEGACY_WS: &str = "graphql-ws";

/// `GET /api/graphql`: the WebSocket upgrade; any other GET is 405, as before.
pub async fn upgrade(
    State(live): State<Live>,
    State(engine): State<Engine>,
    State(keys): State<Arc<Keys>>,
    State(gitlab): State<Option<Arc<Instance>>>,
    req: Request,
) -> Response {
    let (mut parts, _) = req.into_parts();
    if let Err(message) = live.origins.allow(parts.headers.get(ORIGIN)) {
        return refuse(StatusCode::FORBIDDEN, "FORBIDDEN", &message);
    }
    let websocket = parts
        .headers
        .get(UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !websocket {
        return refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "BAD_REQUEST",
            "send queries as POST with Content-Type: application/json; subscriptions over a \
             WebSocket (graphql-transport-ws or graphql-ws)",
        );
    }
    // axum checks the handshake (method, version, key, connection) and answers what is wrong
    // with it; the upgrade itself is ours (see the module's documentation).
    let on_upgrade = parts.extensions.get::<hyper::upgrade::OnUpgrade>().cloned();
    if let Err(rejection) = WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        return rejection.into_response();
    }
    let (Some(on_upgrade), Some(key)) = (on_upgrade, parts.headers.get(SEC_WEBSOCKET_KEY)) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST",
            "this connection cannot be upgraded to a WebSocket",
        );
    };
    let accept = derive_accept_key(key.as_bytes());
    let offered = parts
        .headers
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect::<Vec<_>>();
    let protocol = if offered.contains(&TRANSPORT_WS) {
        async_graphql::http::WebSocketProtocols::GraphQLWS
    } else if offered.contains(&LEGACY_WS) {
        async_graphql::http::WebSocketProtocols::SubscriptionsTransportWS
    } else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST",
            "ask for the subprotocol graphql-transport-ws (or graphql-ws) in Sec-WebSocket-Protocol",
        );
    };
    let Ok(permit) = live.connections.clone().try_acquire_owned() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "SERVICE_UNAVAILABLE",
            "too many WebSocket connections; try again later",
        );
    };
    let limits = live.limits;
    let auth = Authenticator {
        headers: parts.headers.clone(),
        uri: parts.uri.clone(),
        client: parts.extensions.get::<ClientAddress>().copied(),
        user: Arc::default(),
        keys,
        gitlab,
        live: live.clone(),
        engine: engine.clone(),
        splices: Arc::new(Splices::for_socket()),
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(limits.max_message_bytes))
        .max_frame_size(Some(limits.max_message_bytes))
        // Small buffers: an idle subscriber should cost little (they grow when needed, up to
        // a frame; frames are at most FRAME_BYTES).
        .read_buffer_size(4 * 1024)
        .write_buffer_size(0);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let socket = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                serve(socket, protocol, auth, engine, limits, permit).await;
            }
            Err(e) => tracing::debug!(error = %e, "WebSocket upgrade failed"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(CONNECTION, "upgrade")
        .header(UPGRADE, "websocket")
        .header(SEC_WEBSOCKET_ACCEPT, accept)
        .header(SEC_WEBSOCKET_PROTOCOL, protocol.sec_websocket_protocol())
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The largest frame the server writes; a longer message goes out in fragments.
pub const FRAME_BYTES: usize = 8 * 1024;

/// `text` as the frames that carry it: one text message when short, else a text frame and
/// continuations of at most [`FRAME_BYTES`], cut between characters (RFC 6455 5.4).
#[cfg(test)]
fn fragments(text: String) -> Vec<Message> {
    frames(vec![Bytes::from(text)])
}

/// The text message made of `pieces` (UTF-8 each, as [`Splices::splice`] cuts a text only
/// beside a quote) as the frames that carry it: one text message when short; else a text
/// frame and continuations of at most [`FRAME_BYTES`], each a slice of one piece (shared
/// bytes are not copied), cut between characters (RFC 6455 5.4).
fn frames(pieces: Vec<Bytes>) -> Vec<Message> {
    let total: usize = pieces.iter().map(Bytes::len).sum();
    if total <= FRAME_BYTES {
        let text = match <[Bytes; 1]>::try_from(pieces) {
            Ok([one]) => one,
            Err(pieces) => Bytes::from(crate::graphql::splice::concat(&pieces)),
        };
        return match tokio_tungstenite::tungstenite::Utf8Bytes::try_from(text) {
            Ok(text) => vec![Message::Text(text)],
            Err(_) => Vec::new(),
        };
    }
    let mut frames = Vec::with_capacity(total.div_ceil(FRAME_BYTES - 3) + pieces.len());
    let mut sent = 0;
    for bytes in pieces {
        let mut start = 0;
        while start < bytes.len() {
            let mut end = (start + FRAME_BYTES).min(bytes.len());
            // Back to the start of a character (a UTF-8 continuation byte is 0b10xxxxxx).
            while end < bytes.len() && bytes[end] & 0xC0 == 0x80 {
                end -= 1;
            }
            let opcode = if sent == 0 {
                OpData::Text
            } else {
                OpData::Continue
            };
            sent += end - start;
            frames.push(Message::Frame(Frame::message(
                bytes.slice(start..end),
                OpCode::Data(opcode),
                sent == total,
            )));
            start = end;
        }
    }
    frames
}

fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    let body = json!({"errors": [{"message": message, "extensions": {"code": code}}]});
    (status, Json(body)).into_response()
}

/// What `connection_init` needs to authenticate: the upgrade request's cookie, query and
/// headers, and the payload.
struct Authenticator {
    headers: HeaderMap,
    uri: Uri,
    /// The client's address, for the bound on GitLab token checks.
    client: Option<ClientAddress>,
    /// The user, once `connection_init` is accepted: checked again every `access_cache`.
    user: Arc<OnceLock<i64>>,
    keys: Arc<Keys>,
    gitlab: Option<Arc<Instance>>,
    live: Live,
    engine: Engine,
    /// The connection's placeholders (see `graphql::splice`): its answers are spliced.
    splices: Arc<Splices>,
}

/// Why a `connection_init` was refused, as the close reason says it.
const REFUSED: &str = "Forbidden: ";

impl Authenticator {
    async fn init(self, payload: serde_json::Value) -> async_graphql::Result<Data> {
        let parts = self.parts(&payload).map_err(refused)?;
        let session = authenticate(&parts, &self.keys, self.gitlab.as_deref(), Purpose::Api)
            .await
            .map_err(|e| refused(e.to_string()))?;
        // A user the mirror does not know is refused like a forged token.
        let mut conn = self
            .live
            .pool
            .acquire()
            .await
            .map_err(|e| refused(Error::from(e).to_string()))?;
        CurrentUser::find(&mut *conn, session)
            .await
            .map_err(|e| refused(e.to_string()))?;
        drop(conn);
        let _ = self.user.set(session.user_id);
        let mut data = Data::default();
        data.insert(Arc::new(loaders::loader(
            self.engine.reads.clone(),
            SessionUser::new(session),
        )));
        data.insert(self.engine.clusters.clone());
        data.insert(self.engine.health.clone());
        data.insert(self.engine.recorder.clone());
        data.insert(self.engine.forward.clone());
        data.insert(crate::auth::Credential::of(&parts));
        data.insert(self.live.clone());
        data.insert(self.splices.clone());
        data.insert(session);
        Ok(data)
    }

    /// The request `auth::authenticate` reads: the upgrade's cookie and query (and its
    /// `Upgrade` header, which lets the CSRF token come as a query parameter), with the
    /// payload's `Authorization` and `X-Csrf-Token` as headers.
    fn parts(&self, payload: &serde_json::Value) -> Result<axum::http::request::Parts, String> {
        let mut request = axum::http::Request::builder().uri(self.uri.clone());
        for name in [COOKIE, UPGRADE, AUTHORIZATION] {
            for value in self.headers.get_all(&name) {
                request = request.header(&name, value);
            }
        }
        let mut request = request.body(()).map_err(|e| e.to_string())?;
        if let Some(client) = self.client {
            request.extensions_mut().insert(client);
        }
        let fields = match payload {
            serde_json::Value::Object(fields) => fields.clone(),
            serde_json::Value::Null => Default::default(),
            _ => return Err("the connection_init payload must be an object".into()),
        };
        for (key, value) in fields {
            let name = match key.to_ascii_lowercase().as_str() {
                "authorization" => AUTHORIZATION,
                CSRF_HEADER => axum::http::HeaderName::from_static(CSRF_HEADER),
                _ => continue,
            };
            let value = value
                .as_str()
                .and_then(|v| HeaderValue::from_str(v).ok())
                .ok_or_else(|| format!("`{key}` in the connection_init payload must be a string of visible characters"))?;
            request.headers_mut().insert(name, value);
        }
        Ok(request.into_parts().0)
    }
}

fn refused(message: impl std::fmt::Display) -> async_graphql::Error {
    async_graphql::Error::new(format!("{REFUSED}{message}"))
}

/// Runs one connection: the client's messages into async-graphql (counting subscriptions),
/// its answers out, pings and the timeouts around them.
async fn serve(
    socket: WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>,
    protocol: async_graphql::http::WebSocketProtocols,
    auth: Authenticator,
    engine: Engine,
    limits: SocketLimits,
    _permit: OwnedSemaphorePermit,
) {
    let (mut sink, mut source) = socket.split();
    let (to_graphql, from_client) = mpsc::channel::<Vec<u8>>(16);
    let input = async_graphql::futures_util::stream::unfold(from_client, |mut rx| async move {
        rx.recv().await.map(|m| (m, rx))
    });
    let schema = engine.schemas.strict.clone();
    let mut closing = auth.live.closing.subscribe();
    let splices = auth.splices.clone();
    let (user, pool) = (auth.user.clone(), auth.live.pool.clone());
    // A user blocked (or gone) since `connection_init` loses the socket at the next check.
    let every = engine.clusters.grants.ttl().max(Duration::from_millis(100));
    let mut recheck = tokio::time::interval_at(Instant::now() + every, every);
    let mut graphql = Box::pin(
        GraphQLSocket::new(Subscriptions(schema), input, protocol)
            .on_connection_init(move |payload| auth.init(payload)),
    );
    let mut active: HashSet<String> = HashSet::new();
    let mut acked = false;
    let opened = Instant::now();
    let mut last_heard = Instant::now();
    let mut idle_since = Some(Instant::now());
    let mut ping =
        tokio::time::interval_at(Instant::now() + limits.ping_interval, limits.ping_interval);
    let mut to_graphql = Some(to_graphql);
    // The client's messages not yet taken by async-graphql. They are handed over in their own
    // branch, never awaited while reading: async-graphql reads its input only while its output
    // is polled, so a burst of messages awaited into a full channel would stop both for good.
    let mut pending: VecDeque<Vec<u8>> = VecDeque::new();
    let close = |code: u16, reason: &str| {
        Message::Close(Some(CloseFrame {
            code: CloseCode::from(code),
            reason: reason.to_owned().into(),
        }))
    };
    loop {
        let init_deadline = opened + limits.init_timeout;
        let idle_deadline = idle_since.map(|since| since + limits.idle_timeout);
        tokio::select! {
            incoming = source.next(), if to_graphql.is_some() && pending.len() < INPUT_QUEUE => {
                last_heard = Instant::now();
                let bytes = match incoming {
                    Some(Ok(Message::Text(text))) => text.as_str().as_bytes().to_vec(),
                    Some(Ok(Message::Binary(bytes))) => bytes.to_vec(),
                    Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                        // No more input: async-graphql ends its streams and stops.
                        to_graphql = None;
                        continue;
                    }
                };
                match control(&bytes) {
                    Control::Subscribe(id) if !active.contains(&id) && active.len() >= limits.max_subscriptions => {
                        let error = too_many(&id, limits.max_subscriptions);
                        if sink.send(Message::Text(error.into())).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    Control::Subscribe(id) => {
                        active.insert(id);
                        idle_since = None;
                    }
                    Control::Stop(id) => {
                        active.remove(&id);
                    }
                    Control::Other => {}
                }
                pending.push_back(bytes);
            }
            permit = reserve(to_graphql.clone()), if !pending.is_empty() => match permit {
                Some(permit) => {
                    if let Some(bytes) = pending.pop_front() {
                        permit.send(bytes);
                    }
                }
                // The client's input has ended: what it had still queued has no reader.
                None if to_graphql.is_none() => pending.clear(),
                None => break,
            },
            outgoing = graphql.next() => {
                let frames = match outgoing {
                    Some(WsMessage::Text(text)) => {
                        if text.starts_with(r#"{"type":"connection_ack""#) {
                            acked = true;
                        } else if let Some(id) = ended(&text) {
                            active.remove(&id);
                        }
                        if splices.is_empty() {
                            frames(vec![Bytes::from(text)])
                        } else {
                            frames(splices.splice(Bytes::from(text)))
                        }
                    }
                    Some(WsMessage::Close(code, reason)) => {
                        // A refused `connection_init` is 4403 Forbidden in graphql-transport-ws.
                        let code = if reason.starts_with(REFUSED) { 4403 } else { code };
                        let _ = sink.send(close(code, &reason)).await;
                        break;
                    }
                    None => {
                        let _ = sink.send(close(1000, "")).await;
                        break;
                    }
                };
                let mut sent = Ok(());
                for frame in frames {
                    sent = sink.feed(frame).await;
                    if sent.is_err() {
                        break;
                    }
                }
                if sent.is_err() || sink.flush().await.is_err() {
                    break;
                }
                if active.is_empty() && idle_since.is_none() {
                    idle_since = Some(Instant::now());
                }
            }
            () = tokio::time::sleep_until(init_deadline), if !acked => {
                let _ = sink.send(close(4408, "Connection initialisation timeout")).await;
                break;
            }
            () = sleep_until_some(idle_deadline) => {
                if active.is_empty() {
                    let _ = sink.send(close(1000, "idle: no subscription")).await;
                    break;
                }
                idle_since = None;
            }
            _ = closing.changed() => {
                let shutting_down = *closing.borrow_and_update();
                if shutting_down {
                    let _ = sink.send(close(1001, "the server is shutting down")).await;
                    break;
                }
            }
            _ = recheck.tick() => {
                let Some(&user_id) = user.get() else { continue };
                let found = async {
                    let mut conn = pool.acquire().await?;
                    crate::db::identity::find_user(&mut *conn, user_id).await
                };
                // Only a definite answer closes the socket: the database away is no verdict.
                if let Ok(None) = found.await {
                    let reason = format!("{REFUSED}the user is not active in GitLab");
                    let _ = sink.send(close(4403, &reason)).await;
                    break;
                }
            }
            _ = ping.tick() => {
                if last_heard.elapsed() > 2 * limits.ping_interval {
                    let _ = sink.send(close(1001, "no answer to pings")).await;
                    break;
                }
                if sink.send(Message::Ping(Default::default())).await.is_err() {
                    break;
                }
            }
        }
    }
    finish_close(source).await;
}

/// How long a closed socket waits for the client's own Close before the connection is dropped.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// RFC 6455 7.1.1: after its Close frame the server reads until the client's Close (or the end),
/// and only then drops the TCP connection. Dropped at once, with the client's Pong or Close
/// still unread, the kernel answers with a reset, which can discard the Close frame before the
/// client reads it: the client then sees 1006 instead of the code it was sent.
async fn finish_close<S>(mut source: S)
where
    S: Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        while let Some(Ok(message)) = source.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// Messages read from a client and not yet taken by async-graphql; past it, reading waits.
const INPUT_QUEUE: usize = 16;

/// Room for one message in async-graphql's input; `None` once there is no input any more.
async fn reserve(tx: Option<mpsc::Sender<Vec<u8>>>) -> Option<mpsc::OwnedPermit<Vec<u8>>> {
    tx?.reserve_owned().await.ok()
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// What a client's message does to the count of subscriptions.
enum Control {
    Subscribe(String),
    Stop(String),
    Other,
}

/// Reads the `type` and `id` of a client message (the rest is async-graphql's to read).
fn control(bytes: &[u8]) -> Control {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(rename = "type")]
        kind: String,
        id: Option<String>,
    }
    let Ok(head) = serde_json::from_slice::<Head>(bytes) else {
        return Control::Other;
    };
    match (head.kind.as_str(), head.id) {
        ("subscribe" | "start", Some(id)) => Control::Subscribe(id),
        ("complete" | "stop", Some(id)) => Control::Stop(id),
        _ => Control::Other,
    }
}

/// The id of a subscription that the server ended (`complete` or `error`), if `text` is such
/// a message; only those short messages are parsed.
fn ended(text: &str) -> Option<String> {
    if !(text.starts_with(r#"{"type":"complete""#) || text.starts_with(r#"{"type":"error""#)) {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    value.get("id")?.as_str().map(str::to_owned)
}

/// The error for a subscription beyond the bound: the subscription is refused, the connection
/// stays (both protocols' `error` message).
fn too_many(id: &str, max: usize) -> String {
    json!({"id": id, "type": "error", "payload": [{
        "message": format!("at most {max} subscriptions per connection: complete one first"),
        "extensions": {"code": "TOO_MANY_SUBSCRIPTIONS"}}]})
    .to_string()
}

/// The schema as async-graphql's socket runs it.
#[derive(Clone)]
struct Subscriptions(crate::graphql::EnvlensSchema);

impl Executor for Subscriptions {
    async fn execute(&self, request: async_graphql::Request) -> async_graphql::Response {
        self.0.execute(request).await
    }

    fn execute_stream(
        &self,
        request: async_graphql::Request,
        session_data: Option<Arc<Data>>,
    ) -> async_graphql::futures_util::stream::BoxStream<'static, async_graphql::Response> {
        let stream = self
            .0
            .execute_stream_with_session_data(request, session_data.unwrap_or_default());
        stream
            .map(|mut response| {
                for error in &mut response.errors {
                    crate::graphql::with_code(error);
                }
                response
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_compared_as_origins() {
        let origins = Origins::new(
            Some("https://envlens.example.com/"),
            &["http://GitLab.example.com:8080".to_owned()],
        );
        let allow = |o: &str| origins.allow(Some(&HeaderValue::from_str(o).unwrap()));
        assert!(allow("https://envlens.example.com").is_ok());
        assert!(allow("https://envlens.example.com:443").is_ok());
        assert!(allow("http://gitlab.example.com:8080").is_ok());
        assert!(
            allow("http://envlens.example.com").is_err(),
            "another scheme"
        );
        assert!(allow("https://evil.example.com").is_err());
        assert!(allow("https://envlens.example.com.evil.com").is_err());
        assert!(allow("null").is_err());
        assert!(origins.allow(None).is_ok(), "no browser, no Origin");
        let message = allow("https://evil.example.com").unwrap_err();
        assert!(
            message.contains("`https://evil.example.com` are not allowed"),
            "{message}"
        );
    }

    #[test]
    fn subscriptions_are_counted_by_their_ids() {
        assert!(
            matches!(control(br#"{"type":"subscribe","id":"1","payload":{}}"#), Control::Subscribe(id) if id == "1")
        );
        assert!(
            matches!(control(br#"{"id":"2","type":"start"}"#), Control::Subscribe(id) if id == "2")
        );
        assert!(
            matches!(control(br#"{"type":"complete","id":"1"}"#), Control::Stop(id) if id == "1")
        );
        assert!(matches!(control(br#"{"type":"ping"}"#), Control::Other));
        assert!(matches!(control(b"not json"), Control::Other));
        assert_eq!(
            ended(r#"{"type":"complete","id":"7"}"#).as_deref(),
            Some("7")
        );
        assert_eq!(ended(r#"{"type":"next","id":"7","payload":{}}"#), None);
    }

    #[test]
    fn a_long_message_goes_out_in_fragments_cut_between_characters() {
        let short = "x".repeat(FRAME_BYTES);
        assert!(matches!(&fragments(short.clone())[..], [Message::Text(t)] if t.as_str() == short));
        // Three-byte characters that straddle every cut at FRAME_BYTES.
        let long = format!("a{}", "€".repeat(3 * FRAME_BYTES));
        let frames = fragments(long.clone());
        let mut joined = Vec::new();
        for (i, frame) in frames.iter().enumerate() {
            let Message::Frame(frame) = frame else {
                panic!("a frame: {frame:?}")
            };
            let header = frame.header();
            let first = i == 0;
            let last = i == frames.len() - 1;
            assert_eq!(
                header.opcode,
                OpCode::Data(if first {
                    OpData::Text
                } else {
                    OpData::Continue
                })
            );
            assert_eq!(header.is_final, last);
            assert!(frame.payload().len() <= FRAME_BYTES);
            assert!(
                std::str::from_utf8(frame.payload()).is_ok(),
                "cut between characters"
            );
            joined.extend_from_slice(frame.payload());
        }
        assert!(frames.len() > 3);
        assert_eq!(String::from_utf8(joined).unwrap(), long);
    }

    #[test]
    fn spliced_pieces_go_out_as_one_message_or_as_slices_of_each() {
        let envelope = Bytes::from_static(br#"{"id":"1","payload":{"data":{"x":"#);
        let end = Bytes::from_static(b"}}}");
        let small = Bytes::from(r#"["é"]"#);
        let frames_of =
            |shared: &Bytes| frames(vec![envelope.clone(), shared.clone(), end.clone()]);
        let expected = [&envelope[..], &small[..], &end[..]].concat();
        assert!(matches!(&frames_of(&small)[..], [Message::Text(t)] if t.as_bytes() == expected));
        let large = Bytes::from(format!("\"{}\"", "é".repeat(2 * FRAME_BYTES)));
        let frames = frames_of(&large);
        let mut joined = Vec::new();
        for (i, frame) in frames.iter().enumerate() {
            let Message::Frame(frame) = frame else {
                panic!("a frame: {frame:?}")
            };
            let header = frame.header();
            let data = if i == 0 {
                OpData::Text
            } else {
                OpData::Continue
            };
            assert_eq!(header.opcode, OpCode::Data(data));
            assert_eq!(header.is_final, i == frames.len() - 1);
            assert!(frame.payload().len() <= FRAME_BYTES);
            assert!(std::str::from_utf8(frame.payload()).is_ok());
            joined.extend_from_slice(frame.payload());
        }
        assert_eq!(joined, [&envelope[..], &large[..], &end[..]].concat());
        // The envelope, the shared text in slices, the end.
        assert_eq!(frames.len(), 1 + large.len().div_ceil(FRAME_BYTES - 1) + 1);
    }
}
