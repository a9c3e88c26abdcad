//! GitLab's watch API (SPEC 8.3), as KAS serves it to the `WebSocketWatchManager` of the
//! frontend package `@gitlab/cluster-client`: `GET <base>/watch?kas-websocket-token-request=true`
//! answers `{"token": ...}` to a request that passes the proxy's checks (5.3); a WebSocket to
//! `<base>/watch` offering the subprotocols `gitlab-agent-watch-api` and
//! `websocket-token.kas.gitlab.com.<token>` then carries any number of watches ([`protocol`]),
//! served from the watch cache ([`stream`]) as the user the token was issued to.
//!
//! Objects served from the cache are the cluster's text but for `metadata.managedFields`,
//! which the cache does not keep (kubectl hides them too; see
//! [`crate::resources::object::without_managed_fields`]); a watch served by the cluster itself
//! (any other, see [`stream`]) has them as the cluster sends them.
//!
//! Bounded: [`MAX_WATCHES`] per socket, [`MAX_MESSAGE`] bytes per message in, [`MAX_SOCKETS`]
//! sockets at once (and `per_user.watch_sockets` per user, across replicas: 429 beyond), a
//! socket without watches closed after [`IDLE`], and the user's
//! `user_access` (and that the user is still active) checked again every `kubernetes.access_cache`,
//! at most every [`RECHECK`]: a socket whose grant is gone is closed.

pub mod protocol;
mod stream;
pub mod through_owner;
pub mod tokens;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::auth::Credential;
use crate::auth::Keys;
use crate::db::pool::Pool;
use crate::db::slots::{SlotKind, Slots};
use crate::error::{kubernetes_status, Error};
use crate::gitlab::Instance;
use crate::k8s::clusters::{Cluster, Clusters};
use crate::k8s::grants::AccessType;
use crate::k8s::proxy::{admit, current_grant, unauthorized, Admitted};
use crate::k8s::request_info::RequestInfo;
use crate::replicas::forward::Forward;
pub use stream::Watcher;
use tokens::Bound;

/// The subprotocol of GitLab's watch API.
pub const PROTOCOL: &str = "gitlab-agent-watch-api";
/// The subprotocol that carries the token.
pub const TOKEN_PROTOCOL_PREFIX: &str = "websocket-token.kas.gitlab.com.";
/// The query parameter of a token request.
const TOKEN_REQUEST: &str = "kas-websocket-token-request";

/// Watches one socket may carry: GitLab's environment page opens about ten.
pub const MAX_WATCHES: usize = 100;
/// The largest message a browser may send; a watch request is a few hundred bytes.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Sockets open at once, across users.
pub const MAX_SOCKETS: usize = 2_000;
/// A socket with no watch for this long is closed.
pub const IDLE: Duration = Duration::from_secs(60);
/// The longest a socket's `user_access` goes unchecked, whatever `kubernetes.access_cache` says.
pub const RECHECK: Duration = Duration::from_secs(30);

/// How often a socket, and each watch it carries, is judged again: `kubernetes.access_cache`,
/// at most [`RECHECK`].
pub fn recheck_every(clusters: &Clusters) -> Duration {
    clusters
        .grants
        .ttl()
        .clamp(Duration::from_millis(100), RECHECK)
}
/// Messages queued for a slow socket before its watches wait (and the cache's feed, if they
/// fall too far behind, makes them read their kinds again).
const OUTBOX: usize = 1024;
/// How long a closed socket waits for the browser's own Close before it is dropped.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// What the watch API keeps between requests: the socket bound (the tokens are signed, and
/// their uses recorded in the database: [`tokens`]).
pub struct Shared {
    sockets: Arc<Semaphore>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            sockets: Arc::new(Semaphore::new(MAX_SOCKETS)),
        }
    }
}

/// `GET /k8s-proxy/watch`: a token request, or the WebSocket.
pub async fn watch(
    State(keys): State<Arc<Keys>>,
    State(db): State<Pool>,
    State(clusters): State<Arc<Clusters>>,
    State(gitlab): State<Option<Arc<Instance>>>,
    State(slots): State<Slots>,
    State(forward): State<Forward>,
    request: Request,
) -> Response {
    let (mut parts, _) = request.into_parts();
    let token_request = parts
        .uri
        .query()
        .unwrap_or("")
        .split('&')
        .any(|pair| pair == TOKEN_REQUEST || pair == format!("{TOKEN_REQUEST}=true"));
    if token_request {
        let Admitted {
            agent_id,
            session,
            grant,
        } = match admit(&parts, &keys, &db, &clusters, gitlab.as_deref()).await {
            Ok(admitted) => admitted,
            Err(refused) => return refused,
        };
        // No token for a socket that could only be refused (SPEC 6: no connection).
        let agent = &grant.agent;
        if let Err(none) = clusters
            .for_agent(agent.id, &agent.project_full_path, &agent.name)
            .await
        {
            return Error::from(none).to_kubernetes_status();
        }
        let issued = tokens::issue(
            &keys,
            Bound {
                agent_id,
                user_id: session.user_id,
                via: session.via,
            },
        );
        let token = match issued {
            Ok(token) => token,
            Err(e) => return Error::Internal(e).to_kubernetes_status(),
        };
        let mut response = axum::Json(serde_json::json!({ "token": token })).into_response();
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return response;
    }
    if !parts.headers.contains_key(header::UPGRADE) {
        return kubernetes_status(
            StatusCode::BAD_REQUEST,
            "the watch API is a WebSocket (or a token request with ?kas-websocket-token-request=true)",
        );
    }
    let offered = offered_protocols(&parts.headers);
    if !offered.iter().any(|p| p == PROTOCOL) {
        return kubernetes_status(
            StatusCode::BAD_REQUEST,
            &format!("the WebSocket must offer the subprotocol {PROTOCOL}"),
        );
    }
    let Some(token) = offered
        .iter()
        .find_map(|p| p.strip_prefix(TOKEN_PROTOCOL_PREFIX))
    else {
        return unauthorized(&format!(
            "the WebSocket must offer the subprotocol {TOKEN_PROTOCOL_PREFIX}<token>"
        ));
    };
    const REFUSED_TOKEN: &str = "the watch token is unknown, expired or already used";
    let Some(verified) = tokens::verify(&keys, token) else {
        return unauthorized(REFUSED_TOKEN);
    };
    let bound = verified.bound();
    // The socket's one credential, for the owners of the connection to check (SPEC 16).
    let through = through_owner::Through {
        forward,
        credential: Credential::of_watch_socket(token),
        agent: bound.agent_id,
    };
    let grant = match current_grant(&db, &clusters, bound.agent_id, bound.user_id).await {
        Ok(Some(grant)) => grant,
        Ok(None) => {
            return unauthorized(&format!(
                "agent {} does not exist or its user_access does not allow you",
                bound.agent_id
            ))
        }
        Err(e) => return e.to_kubernetes_status(),
    };
    let cluster = match clusters
        .for_agent(
            grant.agent.id,
            &grant.agent.project_full_path,
            &grant.agent.name,
        )
        .await
    {
        Ok(cluster) => cluster,
        Err(none) => return Error::from(none).to_kubernetes_status(),
    };
    // The user's place among their sockets (across replicas), before the upgrade.
    let slot = match slots.take(bound.user_id, SlotKind::WatchSocket).await {
        Ok(Some(slot)) => slot,
        Ok(None) => return too_many_sockets(slots.limits().watch_sockets),
        Err(e) => return e.to_kubernetes_status(),
    };
    // Spent only now: a socket refused above records nothing.
    match verified.spend(&db).await {
        Ok(true) => {}
        Ok(false) => return unauthorized(REFUSED_TOKEN),
        Err(e) => return e.to_kubernetes_status(),
    }
    let Ok(permit) = clusters.watch_api.sockets.clone().try_acquire_owned() else {
        return kubernetes_status(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many watch sockets are open; try again later",
        );
    };
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    let headers = Arc::new(
        grant
            .impersonation_headers(AccessType::from(bound.via))
            .clone(),
    );
    let socket = Socket {
        cluster,
        headers,
        db,
        clusters: clusters.clone(),
        bound,
        timeout: clusters.response_timeout,
        through,
    };
    upgrade
        .protocols([PROTOCOL])
        .max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .on_upgrade(move |ws| async move {
            socket.serve(ws, permit).await;
            drop(slot);
        })
}

/// How long a client refused for its count of sockets waits before it asks again.
const SOCKETS_RETRY_AFTER: &str = "30";

/// 429 for a user who holds `max` watch sockets already.
fn too_many_sockets(max: usize) -> Response {
    let mut response = kubernetes_status(
        StatusCode::TOO_MANY_REQUESTS,
        &format!("at most {max} watch sockets per user are open at once: close one first"),
    );
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from_static(SOCKETS_RETRY_AFTER),
    );
    response
}

/// The subprotocols a WebSocket request offers, in order.
fn offered_protocols(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

struct Socket {
    cluster: Cluster,
    headers: Arc<HeaderMap>,
    db: Pool,
    clusters: Arc<Clusters>,
    bound: Bound,
    timeout: Duration,
    through: through_owner::Through,
}

/// Aborts a watch's task when the socket drops it.
pub struct Running(pub tokio::task::AbortHandle);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Socket {
    async fn serve(self, mut ws: WebSocket, _permit: OwnedSemaphorePermit) {
        let (outbox, mut outgoing) = mpsc::channel::<String>(OUTBOX);
        let watcher = stream::Watcher {
            cluster: self.cluster.clone(),
            headers: self.headers.clone(),
            outbox,
            timeout: self.timeout,
            through: Some(self.through.clone()),
            for_replica: false,
            recheck: recheck_every(&self.clusters),
        };
        let mut watches: HashMap<String, Running> = HashMap::new();
        let mut idle_since = Some(Instant::now());
        // As the subscriptions do: a user blocked or removed loses the socket at the next
        // `access_cache` check (SPEC 13).
        let every = recheck_every(&self.clusters);
        let mut recheck = tokio::time::interval_at(Instant::now() + every, every);
        let mut undecided = crate::auth::recheck::Undecided::default();
        let closing: Option<CloseFrame> = loop {
            let idle = async {
                match idle_since {
                    Some(since) => tokio::time::sleep_until(since + IDLE).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                incoming = ws.recv() => match incoming {
                    Some(Ok(Message::Text(text))) => {
                        if let Some(reply) = self.receive(&text, &watcher, &mut watches) {
                            if ws.send(Message::Text(reply.into())).await.is_err() {
                                break None;
                            }
                        }
                        idle_since = watches.is_empty().then(Instant::now);
                    }
                    Some(Ok(Message::Binary(_))) => {
                        let reply = protocol::error(None, Some(400), "messages are JSON text");
                        if ws.send(Message::Text(reply.into())).await.is_err() {
                            break None;
                        }
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break None,
                    Some(Ok(_)) => {}
                },
                Some(message) = outgoing.recv() => {
                    if ws.send(Message::Text(message.into())).await.is_err() {
                        break None;
                    }
                }
                () = idle => break Some(CloseFrame { code: 1000, reason: "no watch for a while".into() }),
                _ = recheck.tick() => {
                    let b = self.bound;
                    match current_grant(&self.db, &self.clusters, b.agent_id, b.user_id).await {
                        // The identity the cluster sees changed (a new role, say): its watches
                        // were judged for the old one. The browser opens a new socket, with a
                        // token for who the user is now.
                        Ok(Some(grant)) if *grant.impersonation_headers(AccessType::from(b.via)) != *self.headers => {
                            break Some(CloseFrame { code: 1012, reason: "your access changed: open the socket again".into() })
                        }
                        Ok(Some(_)) => undecided.decided(),
                        Ok(None) => break Some(CloseFrame { code: 1008, reason: "user_access no longer allows you".into() }),
                        Err(e) => {
                            tracing::warn!(error = %e, "watch API: cannot check the socket's access");
                            if undecided.failed() {
                                break Some(CloseFrame { code: 1011, reason: "your access cannot be checked now".into() });
                            }
                        }
                    }
                }
            }
        };
        drop(watches);
        if let Some(frame) = closing {
            if ws.send(Message::Close(Some(frame))).await.is_ok() {
                // As the GraphQL sockets do (RFC 6455 7.1.1): read until the browser's own Close,
                // so that the connection ends without a reset that could eat the frame.
                let _ = tokio::time::timeout(CLOSE_WAIT, async {
                    while let Some(Ok(message)) = ws.recv().await {
                        if matches!(message, Message::Close(_)) {
                            break;
                        }
                    }
                })
                .await;
            }
        }
    }

    /// Handles one message from the browser; the reply to send at once, if any.
    fn receive(
        &self,
        text: &str,
        watcher: &stream::Watcher,
        watches: &mut HashMap<String, Running>,
    ) -> Option<String> {
        let incoming: protocol::Incoming = match serde_json::from_str(text) {
            Ok(m) => m,
            Err(e) => {
                return Some(protocol::error(
                    None,
                    Some(400),
                    &format!("not a watch message: {e}"),
                ))
            }
        };
        let id = match incoming.watch_id {
            Some(id) if !id.is_empty() && id.len() <= protocol::MAX_WATCH_ID => id,
            _ => {
                return Some(protocol::error(
                    None,
                    Some(400),
                    &format!(
                        "watch_id must be 1 to {} characters",
                        protocol::MAX_WATCH_ID
                    ),
                ))
            }
        };
        match incoming.kind.as_str() {
            "watch" => {
                // The same id again replaces the watch.
                watches.remove(&id);
                if watches.len() >= MAX_WATCHES {
                    return Some(protocol::error(
                        Some(&id),
                        Some(429),
                        &format!("at most {MAX_WATCHES} watches per connection"),
                    ));
                }
                // The proxy's own refusals (SPEC 13), whatever the cluster's RBAC says.
                let refusal = RequestInfo::parse(&incoming.watch_params.path())
                    .and_then(|info| info.refusal(self.clusters.own_namespace.as_deref()));
                if let Some(refusal) = refusal {
                    return Some(protocol::error(Some(&id), Some(403), &refusal));
                }
                let task = tokio::spawn(watcher.clone().run(id.clone(), incoming.watch_params));
                watches.insert(id, Running(task.abort_handle()));
                None
            }
            "unwatch" => {
                watches.remove(&id);
                None
            }
            other => Some(protocol::error(
                Some(&id),
                Some(400),
                &format!("unknown message type {other:?}: expected \"watch\""),
            )),
        }
    }
}
