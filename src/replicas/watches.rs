//! The owner's side of the watches other replicas hand it (SPEC 16): a watch of a watch-API
//! socket opened there ([`watch`]; the replica's side is `k8s::watch_api::through_owner`) and
//! a proxied Kubernetes watch (`?watch=true`, [`proxied`]; the replica's side is in
//! `k8s::proxy`). Each carries the viewer's own credential, which is checked here afresh,
//! and ends when this replica no longer holds the connection, so that the other replica asks
//! the new owner.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use super::forward::KEEPALIVE_EVERY;
use super::internal::Internal;
use crate::auth::{Credential, FromReplica};
use crate::error::{kubernetes_status, Error};
use crate::gitlab::tokens::Purpose;
use crate::k8s::clusters::Cluster;
use crate::k8s::grants::{AccessType, Grant};
use crate::k8s::proxied_watch::{ProxyAsk, ANSWERED};
use crate::k8s::proxy::{is_watch, request_headers, unauthorized, Upstream};
use crate::k8s::request_info::RequestInfo;
use crate::k8s::watch::WatchCache;
use crate::k8s::watch_api::through_owner::WatchAsk;
use crate::k8s::watch_api::{tokens, Running, Watcher};

/// Messages queued for the other replica before the watch waits.
const OUTBOX: usize = 1024;

/// The credential a request carries, decoded; 401 without one.
pub(super) fn credential(from: &FromReplica) -> Result<Credential, Error> {
    from.credential
        .as_deref()
        .and_then(Credential::decode)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| Error::Unauthorized("the request carries no viewer's credential".into()))
}

/// `user`'s grant to `agent`, decided here (403 without one), and the agent's connection,
/// which this replica must hold (503 otherwise: the other replica asks again).
pub(super) async fn granted(
    state: &Internal,
    agent: i64,
    user: i64,
) -> Result<(Arc<Grant>, Cluster), Error> {
    let grant = {
        let mut conn = state.db.acquire().await?;
        state
            .clusters
            .grants
            .authorize(&mut *conn, agent, user)
            .await?
    };
    let grant = grant.ok_or_else(|| {
        Error::Forbidden(format!(
            "agent {agent} does not exist or its user_access does not allow you"
        ))
    })?;
    crate::telemetry::record_agent(agent, None);
    let cluster = state
        .clusters
        .for_agent(
            grant.agent.id,
            &grant.agent.project_full_path,
            &grant.agent.name,
        )
        .await?;
    if !cluster.watch.held() {
        return Err(Error::NoConnection(
            "this replica does not hold the agent's connection".into(),
        ));
    }
    Ok((grant, cluster))
}

/// A watch of a socket another replica holds: the socket's token (a spent one, checked here
/// with its signature and its recorded use), the viewer's `user_access` and the proxy's own
/// refusals decided here; then the watch's messages from this replica's cache, a line each,
/// as for a fresh watcher, and an empty line every [`KEEPALIVE_EVERY`].
pub(super) async fn watch(
    State(state): State<Internal>,
    from: FromReplica,
) -> Result<Response, Error> {
    let credential = credential(&from)?;
    let token = credential
        .watch_token()
        .ok_or_else(|| Error::Unauthorized("the request carries no watch token".into()))?;
    let bound = tokens::spent(&state.keys, &state.db, token).await?;
    let ask: WatchAsk = serde_json::from_slice(&from.body)
        .map_err(|e| Error::BadRequest(format!("not a forwarded watch: {e}")))?;
    if ask.agent != bound.agent_id {
        return Err(Error::Forbidden(
            "the watch token is for another agent".into(),
        ));
    }
    if let Some(why) = ask.params.invalid() {
        return Err(Error::invalid("params", why));
    }
    let refusal = RequestInfo::parse(&ask.params.path())
        .and_then(|info| info.refusal(state.clusters.own_namespace.as_deref()));
    if let Some(refusal) = refusal {
        return Err(Error::Forbidden(refusal));
    }
    let (grant, cluster) = granted(&state, ask.agent, bound.user_id).await?;
    let kinds = cluster
        .discovery
        .kinds()
        .await
        .map_err(|e| Error::BadGateway(e.message))?
        .kinds;
    let (kind, selection) = ask
        .params
        .cached(&kinds)
        .map(|(k, s)| (k.clone(), s))
        .ok_or_else(|| Error::invalid("params", "not a watch the watch cache serves"))?;
    let (outbox, messages) = mpsc::channel(OUTBOX);
    let watcher = Watcher {
        headers: Arc::new(
            grant
                .impersonation_headers(AccessType::from(bound.via))
                .clone(),
        ),
        cluster: cluster.clone(),
        outbox,
        timeout: state.clusters.response_timeout,
        through: None,
        for_replica: true,
        recheck: crate::k8s::watch_api::recheck_every(&state.clusters),
    };
    let task = tokio::spawn(watcher.for_another_replica(ask.params, kind, selection));
    Ok(lines(messages, Running(task.abort_handle()), cluster.watch))
}

/// The lines of `messages`, an empty one every [`KEEPALIVE_EVERY`]; the end once `watch`'s
/// connection is no longer held here, or `messages` end. `running` is dropped (and with it
/// what sends the messages) when the other replica goes away.
fn lines(messages: mpsc::Receiver<String>, running: Running, watch: WatchCache) -> Response {
    let keepalive = tokio::time::interval_at(
        tokio::time::Instant::now() + KEEPALIVE_EVERY,
        KEEPALIVE_EVERY,
    );
    let stream = async_graphql::futures_util::stream::unfold(
        (messages, keepalive, running, watch),
        |(mut messages, mut keepalive, running, watch)| async move {
            let line = tokio::select! {
                message = messages.recv() => {
                    let mut line = message?;
                    line.push('\n');
                    line
                }
                _ = keepalive.tick() => {
                    if !watch.held() {
                        return None;
                    }
                    "\n".to_owned()
                }
            };
            Some((
                Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(line)),
                (messages, keepalive, running, watch),
            ))
        },
    );
    axum::body::Body::from_stream(stream).into_response()
}

/// A proxied watch another replica hands over: the viewer authenticated afresh from the
/// credential it carries (as the proxy authenticates), their `user_access` and the proxy's
/// own refusals decided here, then the cluster's answer as the proxy would give it, marked
/// [`ANSWERED`]; it ends when this replica no longer holds the connection. An answer without
/// the mark (401 for the replica's token, 503 when the connection is not held here) is the
/// other replica's to serve itself.
pub(super) async fn proxied(
    State(state): State<Internal>,
    from: FromReplica,
) -> Result<Response, Error> {
    let credential = credential(&from)?;
    let ask: ProxyAsk = serde_json::from_slice(&from.body)
        .map_err(|e| Error::BadRequest(format!("not a forwarded watch: {e}")))?;
    let uri: Uri = ask
        .uri
        .parse()
        .map_err(|_| Error::invalid("uri", "not a path and query"))?;
    if !is_watch(&Method::GET, &uri) {
        return Err(Error::invalid("uri", "not a watch"));
    }
    let session = match credential
        .authenticate_for(&state.keys, state.gitlab.as_deref(), Purpose::Kubernetes)
        .await
    {
        Ok(session) => session,
        Err(e @ (Error::GitLabUnavailable(_) | Error::Unavailable(_))) => return Err(e),
        Err(e) => return Ok(answered(unauthorized(&e.to_string()))),
    };
    let refusal = RequestInfo::parse(uri.path())
        .and_then(|info| info.refusal(state.clusters.own_namespace.as_deref()));
    if let Some(refusal) = refusal {
        return Ok(answered(kubernetes_status(StatusCode::FORBIDDEN, &refusal)));
    }
    let (grant, cluster) = match granted(&state, ask.agent, session.user_id).await {
        Ok(granted) => granted,
        Err(Error::Forbidden(why)) => return Ok(answered(unauthorized(&why))),
        Err(e) => return Err(e),
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &ask.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            headers.append(name, value);
        }
    }
    let upstream = Upstream {
        method: Method::GET,
        uri,
        headers: request_headers(headers),
        body: axum::body::Bytes::new(),
    };
    let response = upstream
        .send(
            &cluster,
            ask.agent,
            &grant,
            session.via,
            None,
            state.clusters.response_timeout,
        )
        .await;
    let (parts, body) = response.into_parts();
    let body = while_held(body, cluster.watch);
    Ok(answered(Response::from_parts(parts, body)))
}

/// `response` marked as the proxy's own answer.
fn answered(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(ANSWERED, HeaderValue::from_static("true"));
    response
}

/// `body` until it ends or `watch`'s connection is no longer held here (looked at every
/// second), whichever comes first.
fn while_held(body: axum::body::Body, watch: WatchCache) -> axum::body::Body {
    use http_body_util::BodyExt;
    let every = std::time::Duration::from_secs(1);
    let look = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let stream = async_graphql::futures_util::stream::unfold(
        (body, look, watch),
        |(mut body, mut look, watch)| async move {
            loop {
                tokio::select! {
                    frame = body.frame() => {
                        let data = match frame? {
                            Ok(frame) => match frame.into_data() {
                                Ok(data) => Ok(data),
                                Err(_) => continue,
                            },
                            Err(e) => Err(e),
                        };
                        return Some((data, (body, look, watch)));
                    }
                    _ = look.tick() => if !watch.held() { return None },
                }
            }
        },
    );
    axum::body::Body::from_stream(stream)
}
