//! A view of a connection another replica owns, answered through that owner (SPEC 16): the
//! non-owner sends what to read and the viewer's own credential ([`Credential`]), signed with
//! the internal secret for replicas only; the owner authenticates the viewer afresh, decides
//! their `user_access` itself, and answers from its watch cache ([`super::internal`]).

use std::sync::Arc;
use std::time::Duration;

use axum::http::header::IF_NONE_MATCH;
use axum::http::{HeaderValue, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::memo::Received;
use super::Ownership;
use crate::auth::{replica_request, Credential, Keys, REPLICA_HEADER};
use crate::db::replicas::Member;
use crate::error::Error;
use crate::resources::group::ResourceGroup;

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// The route of a forwarded view on the owner's internal listener.
pub const RESOURCE_GROUP_PATH: &str = "/-/replica/resource-group";
/// The route of a forwarded subscription's changes on the owner's internal listener.
pub const CHANGES_PATH: &str = "/-/replica/changes";
/// The route of a forwarded watch of GitLab's watch API on the owner's internal listener.
pub const WATCH_PATH: &str = "/-/replica/watch";
/// The route of a forwarded proxied watch (`?watch=true`) on the owner's internal listener.
pub const PROXY_PATH: &str = "/-/replica/proxy";
/// A line of the changes: something changed in a namespace followed.
pub const CHANGE: &[u8] = b"c\n";
/// A line of the changes: nothing changed, the owner is there.
pub const KEEPALIVE: &[u8] = b"k\n";
/// How often the owner says it is there.
pub const KEEPALIVE_EVERY: Duration = Duration::from_secs(5);
/// An owner silent this long is taken for gone.
const SILENT: Duration = Duration::from_secs(15);
/// The largest answer read: a group of the cache's whole bound of objects fits.
const MAX_ANSWER: usize = 512 * 1024 * 1024;
/// How long the owner may take to be reached at all.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What a non-owner asks the owner: the group of `selector` in `namespaces` (the first the
/// deployment's) through `agent`'s connection.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GroupAsk {
    pub agent: i64,
    pub namespaces: Vec<String>,
    pub selector: String,
}

/// Why a view did not come through the owner.
#[derive(Debug)]
pub enum NotForwarded {
    /// The owner answered with a decision of its own (the viewer refused, the cluster
    /// unreachable from it): the view's answer.
    Decided(Error),
    /// The owner could not be asked, or did not answer usably (gone, stopped mid-answer,
    /// not ours): the view is read here instead, saying so.
    Unreachable(String),
}

/// A viewer's way to the owners: what a subscription's feed reads through.
#[derive(Clone)]
pub struct AsViewer {
    pub forward: Forward,
    pub credential: Credential,
}

/// Forwards views to their owners; a process that shares nothing never does.
#[derive(Clone, Default)]
pub struct Forward(Option<Arc<Inner>>);

struct Inner {
    ownership: Ownership,
    keys: Arc<Keys>,
    client: Client<Https, Full<Bytes>>,
    /// The groups last received, asked again by their tag ([`super::memo`]).
    received: Received,
    /// The owner's own bound on a view (the cluster's response timeout), and some.
    timeout: Duration,
}

impl Forward {
    /// Through the owners `ownership` knows, signed with `keys`; a view whose owner has not
    /// answered within `timeout` is read here.
    pub fn new(ownership: Ownership, keys: Arc<Keys>, timeout: Duration) -> anyhow::Result<Self> {
        let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.set_nodelay(true);
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| anyhow::anyhow!("no CA certificates to verify other replicas with: {e}"))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Forward(Some(Arc::new(Inner {
            ownership,
            keys,
            client: Client::builder(TokioExecutor::new()).build(connector),
            received: Received::default(),
            timeout,
        }))))
    }

    /// Whether this process shares the clusters with other replicas.
    pub fn shares(&self) -> bool {
        self.0.is_some()
    }

    /// The live replica that owns `connection` when it is not this one (see
    /// [`Ownership::owner_elsewhere`]).
    pub fn owner_of(&self, connection: &str) -> Option<Member> {
        self.0.as_ref()?.ownership.owner_elsewhere(connection)
    }

    /// The changes `ask`'s namespaces have at `owner` from now on, as `credential`'s viewer:
    /// open once the owner listens.
    pub async fn changes(
        &self,
        owner: &Member,
        credential: &Credential,
        ask: &GroupAsk,
    ) -> Result<Changes, NotForwarded> {
        match self.open(owner, CHANGES_PATH, credential, ask).await? {
            Opened::Streaming(body) => Ok(Changes { body: Some(body) }),
            Opened::Answered(status, body) => Err(decision(status, &body)),
        }
    }

    /// A stream `owner` answers at `path` (of the internal listener) to `ask`, as
    /// `credential`'s viewer: its lines ([`Lines`]) once it answers 200; else the owner's
    /// decision (a 401 among them), or why it could not be asked.
    pub async fn lines(
        &self,
        owner: &Member,
        path: &str,
        credential: &Credential,
        ask: &impl serde::Serialize,
    ) -> Result<Lines, NotForwarded> {
        match self.open(owner, path, credential, ask).await? {
            Opened::Streaming(body) => Ok(Lines {
                body: Some(body),
                lines: crate::k8s::lines::Lines::default(),
            }),
            // The owner refusing the socket's token is its decision, not an owner away: a
            // watch it served is not asked again for ever (`k8s::watch_api::through_owner`).
            Opened::Answered(StatusCode::UNAUTHORIZED, body) => {
                Err(NotForwarded::Decided(Error::Unauthorized(
                    message(&body).unwrap_or_else(|| "the owner refused the credential".into()),
                )))
            }
            Opened::Answered(status, body) => Err(decision(status, &body)),
        }
    }

    /// A response `owner` starts to a POST of `ask` at `path`: its status, headers and body
    /// as they come (a proxied watch, [`PROXY_PATH`]); or why it could not be asked.
    pub async fn response(
        &self,
        owner: &Member,
        path: &str,
        credential: &Credential,
        ask: &impl serde::Serialize,
    ) -> Result<hyper::Response<hyper::body::Incoming>, NotForwarded> {
        let inner = self.inner()?;
        let request = inner.request(owner, path, credential, ask)?;
        tokio::time::timeout(inner.timeout, inner.client.request(request))
            .await
            .map_err(|_| {
                NotForwarded::Unreachable(format!("no answer within {:?}", inner.timeout))
            })?
            .map_err(|e| NotForwarded::Unreachable(e.to_string()))
    }

    async fn open(
        &self,
        owner: &Member,
        path: &str,
        credential: &Credential,
        ask: &impl serde::Serialize,
    ) -> Result<Opened, NotForwarded> {
        let (parts, body) = self
            .response(owner, path, credential, ask)
            .await?
            .into_parts();
        if parts.status != StatusCode::OK {
            let body = Limited::new(body, 64 * 1024)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Ok(Opened::Answered(parts.status, body));
        }
        Ok(Opened::Streaming(body))
    }

    fn inner(&self) -> Result<&Inner, NotForwarded> {
        self.0
            .as_deref()
            .ok_or_else(|| NotForwarded::Unreachable("this replica shares no connection".into()))
    }

    /// The group `ask` names, from `owner`, as `credential`'s viewer. The group last received
    /// for `ask` is offered by its tag: an owner that still has it (after judging the viewer)
    /// answers `304` and it is not sent again ([`super::memo`]).
    pub async fn resource_group(
        &self,
        owner: &Member,
        credential: &Credential,
        ask: &GroupAsk,
    ) -> Result<Arc<ResourceGroup>, NotForwarded> {
        let inner = self.inner()?;
        let known = inner.received.get(ask);
        let mut request = inner.request(owner, RESOURCE_GROUP_PATH, credential, ask)?;
        if let Some(tag) = known
            .as_ref()
            .and_then(|(tag, _)| HeaderValue::from_str(tag).ok())
        {
            request.headers_mut().insert(IF_NONE_MATCH, tag);
        }
        let exchange = async {
            let response = inner
                .client
                .request(request)
                .await
                .map_err(|e| format!("{e}"))?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| format!("the answer broke off: {e}"))?
                .to_bytes();
            Ok::<_, String>((parts.status, body))
        };
        let (status, body) = tokio::time::timeout(inner.timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {:?}", inner.timeout))
            .and_then(|answered| answered)
            .map_err(NotForwarded::Unreachable)?;
        match (status, known) {
            (StatusCode::NOT_MODIFIED, Some((_, group))) => Ok(group),
            (StatusCode::OK, _) => inner
                .received
                .decode(ask, &body)
                .map_err(|e| NotForwarded::Unreachable(format!("its answer is no group: {e}"))),
            (status, _) => Err(decision(status, &body)),
        }
    }
}

impl Inner {
    /// A request to `owner`'s `path`, signed, carrying `credential` and `ask`.
    fn request(
        &self,
        owner: &Member,
        path: &str,
        credential: &Credential,
        ask: &impl serde::Serialize,
    ) -> Result<Request<Full<Bytes>>, NotForwarded> {
        let unreachable = |e: String| NotForwarded::Unreachable(e);
        let body = serde_json::to_vec(ask).map_err(|e| unreachable(e.to_string()))?;
        let bound = replica_request(&Method::POST, path, &body);
        let token = self
            .keys
            .sign_for_replica(Some(credential), &bound)
            .map_err(|e| unreachable(e.to_string()))?;
        Request::builder()
            .method(Method::POST)
            .uri(format!("{}{path}", owner.advertise_url))
            .header(REPLICA_HEADER, token)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| unreachable(e.to_string()))
    }
}

/// The changes an owner sends ([`Forward::changes`]).
pub struct Changes {
    body: Option<hyper::body::Incoming>,
}

impl Changes {
    /// Resolves at the next change; `None` once the owner ended them, went away or stayed
    /// silent past [`SILENT`]: whoever follows them then asks who owns the connection now.
    pub async fn next(&mut self) -> Option<()> {
        let body = self.body.as_mut()?;
        loop {
            let frame = match tokio::time::timeout(SILENT, body.frame()).await {
                Ok(Some(Ok(frame))) => frame,
                _ => {
                    self.body = None;
                    return None;
                }
            };
            if frame
                .data_ref()
                .is_some_and(|data| data.windows(CHANGE.len()).any(|w| w == CHANGE))
            {
                return Some(());
            }
        }
    }
}

/// What an owner answered to the opening of a stream.
enum Opened {
    Streaming(hyper::body::Incoming),
    Answered(StatusCode, Bytes),
}

/// The lines of a stream an owner sends ([`Forward::lines`]), each at most [`MAX_LINE`]
/// bytes; an empty line is the owner saying it is there.
pub struct Lines {
    body: Option<hyper::body::Incoming>,
    lines: crate::k8s::lines::Lines,
}

/// The longest line read from an owner: an object of the cluster's (etcd keeps at most
/// 1.5 MiB a value) in its message, and some.
const MAX_LINE: usize = 8 * 1024 * 1024;

impl Lines {
    /// The next line that is not empty, without its end; `None` once the owner ended the
    /// stream, broke it off, sent a line past [`MAX_LINE`] or stayed silent past [`SILENT`].
    pub async fn next(&mut self) -> Option<Bytes> {
        loop {
            while let Some(line) = self.lines.next_line() {
                let line = line.trim_ascii();
                if !line.is_empty() {
                    return Some(Bytes::copy_from_slice(line));
                }
            }
            if self.lines.rest() > MAX_LINE {
                self.body = None;
            }
            let body = self.body.as_mut()?;
            match tokio::time::timeout(SILENT, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        self.lines.push(data);
                    }
                }
                _ => {
                    self.body = None;
                    return None;
                }
            }
        }
    }
}

/// The message of an owner's error answer.
fn message(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
}

/// The owner's refusal of an ask: its decision (the viewer refused, the cluster unreachable
/// from it), or an answer that is none (then the ask is served here).
fn decision(status: StatusCode, body: &[u8]) -> NotForwarded {
    let message = || message(body);
    match status {
        StatusCode::FORBIDDEN => {
            NotForwarded::Decided(Error::Forbidden(message().unwrap_or_default()))
        }
        StatusCode::BAD_GATEWAY => match message() {
            Some(message) => NotForwarded::Decided(Error::BadGateway(message)),
            None => NotForwarded::Unreachable(format!("it answered {status}")),
        },
        status => NotForwarded::Unreachable(match message() {
            Some(message) => format!("it answered {status}: {message}"),
            None => format!("it answered {status}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owners_decisions_are_taken_as_answers() {
        let refused = br#"{"error": {"code": "forbidden", "message": "no access"}}"#;
        match decision(StatusCode::FORBIDDEN, refused) {
            NotForwarded::Decided(Error::Forbidden(m)) => assert_eq!(m, "no access"),
            other => panic!("{other:?}"),
        }
        let cluster =
            br#"{"error": {"code": "bad_gateway", "message": "cannot reach the cluster"}}"#;
        assert!(matches!(
            decision(StatusCode::BAD_GATEWAY, cluster),
            NotForwarded::Decided(Error::BadGateway(_))
        ));
        // A proxy's 502 page, a 401 (another internal secret), a 500: read here instead.
        for (status, body) in [
            (StatusCode::BAD_GATEWAY, &b"<html>bad gateway</html>"[..]),
            (StatusCode::UNAUTHORIZED, &br#"{"error": {"code": "unauthorized", "message": "token signature does not match"}}"#[..]),
            (StatusCode::INTERNAL_SERVER_ERROR, &b""[..]),
        ] {
            assert!(
                matches!(decision(status, body), NotForwarded::Unreachable(_)),
                "{status}"
            );
        }
    }
}
