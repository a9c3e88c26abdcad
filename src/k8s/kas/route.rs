//! The client of one agent through KAS: every request goes to the proxy's current address
//! with the agent's credential, and KAS' own answers are read before anyone else sees them.
//!
//! - KAS' 401 (`Gitlab-Unauthorized: true`) refuses envlens' token, not the viewer: it
//!   becomes a 503 `Status` naming the agent, so no viewer ever reads it as their own 401.
//! - KAS' `Agent connection not found` (after its 20 s wait) becomes a 503 naming the agent.
//! - No answer at all, or a 404 that is not KAS' (no `Via` of KAS, no `GitLab Agent Server:`
//!   message: something else now answers at that address), has the metadata read again.
//! - A request carrying `Impersonate-*` (`access_as: user`) loses it: KAS cannot impersonate for
//!   envlens (agentk refuses nested impersonation), so the viewer's identity is first put to the
//!   cluster as a `SubjectAccessReview` ([`review`]) and the request is sent only when allowed;
//!   what cannot be decided is refused.
//!
//! - While the agent's circuit is open ([`crate::k8s::circuit`]), a request is answered at
//!   once with the 503 that opened it, but for the single probe it lets through now and then.
//!
//! Answers that came through KAS (with its `Via`) stream on untouched: watches and followed
//! logs included.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{header, HeaderValue, Request, Response, StatusCode, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::Incoming;
use tower::{Layer, Service};

use super::{review, Kas, Reach};
use crate::k8s::circuit::Admission;
use crate::k8s::connection::{Condition, ConnectionStatus};

/// KAS' own error bodies are small `Status` documents; a larger one is not KAS'.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How long an error body may take to arrive.
const ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long KAS may take to answer (its headers; a watch's body streams on after): its own
/// wait for a disconnected agent is 20 s, so its answer of that comes in time.
const KAS_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// The prefix of every message of KAS' own errors.
pub const KAS_PREFIX: &str = "GitLab Agent Server:";

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type RouteBody = Either<Incoming, Full<Bytes>>;

/// Sends an agent's requests through KAS.
#[derive(Clone)]
pub struct RouteLayer {
    pub kas: Arc<Kas>,
    pub agent: i64,
    /// Where the outcome of each request is recorded.
    pub condition: Condition,
}

impl<S> Layer<S> for RouteLayer {
    type Service = Route<S>;

    fn layer(&self, inner: S) -> Route<S> {
        Route {
            inner,
            kas: self.kas.clone(),
            agent: self.agent,
            condition: self.condition.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Route<S> {
    inner: S,
    kas: Arc<Kas>,
    agent: i64,
    condition: Condition,
}

impl<S, B> Service<Request<B>> for Route<S>
where
    S: Service<Request<B>, Response = Response<Incoming>> + Clone + Send + 'static,
    S::Error: Into<BoxError> + Send,
    S::Future: Send,
    B: From<Vec<u8>> + Send + 'static,
{
    type Response = Response<RouteBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The service that was made ready is the one to call (tower's contract).
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        let send = send(
            inner,
            request,
            self.kas.clone(),
            self.agent,
            self.condition.clone(),
        );
        // Its own task, so that KAS' answer is read and recorded even when the caller gives up
        // first: a view that waits 10 s for discovery must still learn, from the answer KAS
        // gives after its 20 s wait, that the agent is away, or the circuit never opens.
        let task = tokio::spawn(tracing::Instrument::in_current_span(send));
        Box::pin(async move { task.await? })
    }
}

/// Sends one request through KAS (see the module's comment), bounded by [`KAS_ANSWER_TIMEOUT`].
async fn send<S, B>(
    inner: S,
    request: Request<B>,
    kas: Arc<Kas>,
    agent: i64,
    condition: Condition,
) -> Result<Response<RouteBody>, BoxError>
where
    S: Service<Request<B>, Response = Response<Incoming>> + Clone + Send + 'static,
    S::Error: Into<BoxError> + Send,
    S::Future: Send,
    B: From<Vec<u8>> + Send + 'static,
{
    let (mut parts, body) = request.into_parts();
    // While the circuit is open, the agent's answer is known: said at once, not after KAS'
    // wait. When a probe is due, it is a `GET /version` of its own, not this request: the
    // caller is answered at once either way, and nothing it asked is sent behind its back.
    let probe = match condition.circuit().admit() {
        Admission::Send => None,
        Admission::Probe(guard) => {
            // A token rotated since KAS refused it is the one to try.
            if guard.open_for() == Some(ConnectionStatus::TokenRefused) {
                kas.reread_token();
            }
            Some(guard)
        }
        Admission::Refuse(open) => return Ok(open_refusal(agent, &open)),
    };
    let review = review::take(&mut parts);
    let url = match kas.reach() {
        Reach::Usable { url, .. } => url,
        Reach::Unusable(why) => {
            kas.suspect();
            let message = format!("GitLab's agent server cannot be used: {why}");
            condition.record(ConnectionStatus::Unreachable, Some(message.clone()));
            return Ok(status(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("agent {agent}: {message}"),
            ));
        }
    };
    let Some(credential) = kas.credential(agent) else {
        return Ok(status(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("agent {agent}: no token for GitLab's agent server"),
        ));
    };
    if let Some(guard) = probe {
        if let Some(open) = condition.circuit().open() {
            let probe = Request::get(url.join("/version")?)
                .header(header::AUTHORIZATION, credential)
                .header(header::ACCEPT, "application/json")
                .body(B::from(Vec::new()))?;
            tokio::spawn(tracing::Instrument::in_current_span(async move {
                // Whatever it brings back is recorded by `answer`; the guard goes after it.
                let _ = answer(inner, probe, &kas, agent, &condition).await;
                drop(guard);
            }));
            return Ok(open_refusal(agent, &open));
        }
        // Closed meanwhile: this request goes as any other.
    }
    match review {
        None => {}
        Some(Err(why)) => {
            return Ok(status(
                StatusCode::FORBIDDEN,
                &format!("agent {agent}: {why}"),
            ))
        }
        Some(Ok(review)) => {
            let ask = Ask {
                url: &url,
                credential: &credential,
                headers: &parts.headers,
            };
            if let Some(refused) = ask
                .review(inner.clone(), review, (&kas, agent, &condition))
                .await?
            {
                return Ok(refused);
            }
        }
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = url.join(path)?;
    parts.headers.insert(header::AUTHORIZATION, credential);
    answer(
        inner,
        Request::from_parts(parts, body),
        &kas,
        agent,
        &condition,
    )
    .await
}

/// Sends `request` to KAS and reads its answer as the caller is to see it: a connection that
/// fails, or no answer within [`KAS_ANSWER_TIMEOUT`], has KAS' address suspected and the
/// agent recorded unreachable.
async fn answer<S, B>(
    inner: S,
    request: Request<B>,
    kas: &Kas,
    agent: i64,
    condition: &Condition,
) -> Result<Response<RouteBody>, BoxError>
where
    S: Service<Request<B>, Response = Response<Incoming>> + Send,
    S::Error: Into<BoxError> + Send,
    S::Future: Send,
{
    use tower::ServiceExt as _;
    let failed = |e: BoxError| {
        kas.suspect();
        condition.record(ConnectionStatus::Unreachable, Some(e.to_string()));
        e
    };
    match tokio::time::timeout(KAS_ANSWER_TIMEOUT, inner.oneshot(request)).await {
        Ok(Ok(response)) => Ok(read_answer(response, kas, agent, condition).await),
        Ok(Err(e)) => Err(failed(e.into())),
        Err(_) => Err(failed(
            format!(
                "GitLab's agent server gave no answer within {} s",
                KAS_ANSWER_TIMEOUT.as_secs()
            )
            .into(),
        )),
    }
}

/// The answer while the circuit is open: the 503 that opened it.
fn open_refusal(agent: i64, open: &crate::k8s::circuit::Open) -> Response<RouteBody> {
    status(
        StatusCode::SERVICE_UNAVAILABLE,
        &refusal(agent, open.status, open.message.as_deref().unwrap_or("")),
    )
}

/// The `kube::Client` of `agent` through KAS, counted by `metrics` like every cluster's. TLS
/// is verified against the system's roots, as kube does for a cluster without its own CA. A
/// client of the watch cache's `streams` reads [`STREAM_READ_BUFFER`] bytes at a time, as a
/// cluster's reached directly does ([`crate::k8s::connection::streams_builder`]).
///
/// [`STREAM_READ_BUFFER`]: crate::k8s::connection::STREAM_READ_BUFFER
pub fn client(
    kas: Arc<Kas>,
    agent: i64,
    condition: Condition,
    (connect_timeout, streams): (Duration, bool),
    metrics: Arc<crate::telemetry::Metrics>,
    known: crate::k8s::observe::KnownResources,
) -> anyhow::Result<kube::Client> {
    use anyhow::Context as _;
    use kube::client::ConfigExt;
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    // The configuration only lends its TLS settings: the address is the route's to set.
    let tls = kube::Config::new(Uri::from_static("https://kas.invalid"));
    let https = tls
        .rustls_https_connector_with_connector(http)
        .context("cannot set up TLS for GitLab's agent server")?;
    let mut hyper =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
    if streams {
        hyper.http1_read_buf_exact_size(crate::k8s::connection::STREAM_READ_BUFFER);
    }
    let hyper = hyper.build::<_, kube::client::Body>(https);
    let service = RouteLayer {
        kas,
        agent,
        condition,
    }
    .layer(hyper);
    Ok(kube::client::ClientBuilder::new(service, "default")
        .with_layer(&crate::k8s::observe::ObserveLayer { metrics, known })
        .build())
}

/// Where a review goes: KAS' current address, with the agent's credential and the request's
/// own other headers (its `Audit-ID`).
struct Ask<'a> {
    url: &'a super::ProxyUrl,
    credential: &'a HeaderValue,
    headers: &'a axum::http::HeaderMap,
}

impl Ask<'_> {
    /// Puts `review` to the cluster through KAS: `None` when it allows the request, else the
    /// answer to give instead (the API server's 403, KAS' own refusal, or a 403 when nothing
    /// could be decided: fail closed).
    async fn review<S, B>(
        &self,
        inner: S,
        review: review::Review,
        (kas, agent, condition): (&Kas, i64, &Condition),
    ) -> Result<Option<Response<RouteBody>>, BoxError>
    where
        S: Service<Request<B>, Response = Response<Incoming>> + Send,
        S::Error: Into<BoxError> + Send,
        S::Future: Send,
        B: From<Vec<u8>>,
    {
        use tower::ServiceExt as _;
        let mut ask = Request::post(
            self.url
                .join("/apis/authorization.k8s.io/v1/subjectaccessreviews")?,
        )
        .header(header::AUTHORIZATION, self.credential.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(B::from(review.body))?;
        if let Some(audit) = self.headers.get("audit-id") {
            ask.headers_mut().insert("audit-id", audit.clone());
        }
        let answer = match inner.oneshot(ask).await {
            Ok(answer) => answer,
            Err(e) => {
                kas.suspect();
                let e: BoxError = e.into();
                condition.record(ConnectionStatus::Unreachable, Some(e.to_string()));
                return Err(e);
            }
        };
        let through_kas = answer.headers().contains_key(header::VIA);
        if !through_kas && !answer.status().is_success() {
            // KAS' own answer (a refused token, a disconnected agent): as for any request.
            return Ok(Some(read_answer(answer, kas, agent, condition).await));
        }
        condition.record(ConnectionStatus::Connected, None);
        let code = answer.status();
        let read = tokio::time::timeout(
            ERROR_BODY_TIMEOUT,
            Limited::new(answer.into_body(), MAX_ERROR_BODY).collect(),
        )
        .await;
        let decided = match read {
            Ok(Ok(body)) => review::allowed(code, &body.to_bytes()),
            _ => Err("the cluster's SubjectAccessReview could not be read".to_owned()),
        };
        Ok(match decided {
            Ok(true) => None,
            Ok(false) => Some(status(StatusCode::FORBIDDEN, &review.refusal)),
            Err(why) => Some(status(
                StatusCode::FORBIDDEN,
                &format!(
                    "agent {agent}: access_as: user cannot be decided through GitLab's agent \
                     server, so the request is refused: {why}"
                ),
            )),
        })
    }
}

/// What KAS answered, as the caller is to see it.
async fn read_answer(
    response: Response<Incoming>,
    kas: &Kas,
    agent: i64,
    condition: &Condition,
) -> Response<RouteBody> {
    let through_kas = response.headers().contains_key(header::VIA);
    if through_kas {
        condition.record(ConnectionStatus::Connected, None);
    }
    if through_kas || response.status().is_success() || response.status().is_informational() {
        return response.map(Either::Left);
    }
    let token_refused = response.status() == StatusCode::UNAUTHORIZED
        && response
            .headers()
            .get("gitlab-unauthorized")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
    let (parts, body) = response.into_parts();
    let read = tokio::time::timeout(
        ERROR_BODY_TIMEOUT,
        Limited::new(body, MAX_ERROR_BODY).collect(),
    )
    .await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        _ => Bytes::new(),
    };
    let message = status_message(&bytes);
    let kas_own = message
        .as_deref()
        .is_some_and(|m| m.starts_with(KAS_PREFIX));
    if token_refused {
        // Perhaps rotated already: the next request (the circuit's probe) tries the file's.
        kas.reread_token();
        // The change of status is logged by the condition, once.
        let said = message.unwrap_or_else(|| "Unauthorized".into());
        let message = format!(
            "envlens' token refused by GitLab's agent server ({said}): its user needs the \
             k8s_proxy scope and Developer access in the agent's user_access"
        );
        let answer = refusal(agent, ConnectionStatus::TokenRefused, &message);
        condition.record(ConnectionStatus::TokenRefused, Some(message));
        return status(StatusCode::SERVICE_UNAVAILABLE, &answer);
    }
    if kas_own
        && message
            .as_deref()
            .is_some_and(|m| m.contains("Agent connection not found"))
    {
        let message = format!(
            "not connected to GitLab's agent server ({})",
            message.unwrap_or_default()
        );
        let answer = refusal(agent, ConnectionStatus::AgentNotConnected, &message);
        condition.record(ConnectionStatus::AgentNotConnected, Some(message));
        return status(StatusCode::SERVICE_UNAVAILABLE, &answer);
    }
    if parts.status == StatusCode::NOT_FOUND && !kas_own {
        kas.suspect();
    }
    Response::from_parts(parts, Either::Right(Full::new(bytes)))
}

/// The 503 message of an agent KAS does not reach (`status` one that opens its circuit), the
/// same whether KAS just said so or the open circuit repeats it: a watch failing on either
/// reports one failure.
fn refusal(agent: i64, status: ConnectionStatus, message: &str) -> String {
    match status {
        ConnectionStatus::AgentNotConnected => format!("agent {agent} is {message}"),
        _ => format!("agent {agent}: {message}"),
    }
}

/// The `message` of a Kubernetes `Status` body, else the body as text.
fn status_message(body: &[u8]) -> Option<String> {
    if let Ok(status) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(message) = status.get("message").and_then(|m| m.as_str()) {
            return Some(message.to_owned());
        }
    }
    let text = std::str::from_utf8(body).ok()?.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// A Kubernetes `Status` answer of envlens' own.
fn status(code: StatusCode, message: &str) -> Response<RouteBody> {
    let body = crate::error::kubernetes_status_body(code, message);
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kas_status_messages() {
        let body = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"GitLab Agent Server: Unauthorized","reason":"Unauthorized","code":401}"#;
        assert_eq!(
            status_message(body).as_deref(),
            Some("GitLab Agent Server: Unauthorized")
        );
        assert_eq!(
            status_message(b"404 page not found\n").as_deref(),
            Some("404 page not found")
        );
        assert_eq!(status_message(b""), None);
    }
}
