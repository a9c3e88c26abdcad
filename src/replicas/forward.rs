//! A view of a connection another replica owns, answered through that owner (SPEC 16): the
//! non-owner sends what to read and the viewer's own credential ([`Credential`]), signed with
//! the internal secret for replicas only; the owner authenticates the viewer afresh, decides
//! their `user_access` itself, and answers from its watch cache ([`super::internal`]).

use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{wire, Ownership};
use crate::auth::{Credential, Keys, REPLICA_HEADER};
use crate::db::replicas::Member;
use crate::error::Error;
use crate::resources::group::ResourceGroup;

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// The route of a forwarded view on the owner's internal listener.
pub const RESOURCE_GROUP_PATH: &str = "/-/replica/resource-group";
/// The route of a forwarded subscription's changes on the owner's internal listener.
pub const CHANGES_PATH: &str = "/-/replica/changes";
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
            timeout,
        }))))
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
        let inner = self.inner()?;
        let request = inner.request(owner, CHANGES_PATH, credential, ask)?;
        let response = tokio::time::timeout(inner.timeout, inner.client.request(request))
            .await
            .map_err(|_| {
                NotForwarded::Unreachable(format!("no answer within {:?}", inner.timeout))
            })?
            .map_err(|e| NotForwarded::Unreachable(e.to_string()))?;
        let (parts, body) = response.into_parts();
        if parts.status != StatusCode::OK {
            let body = Limited::new(body, 64 * 1024)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return answer(parts.status, &body).map(|_| Changes { body: None });
        }
        Ok(Changes { body: Some(body) })
    }

    fn inner(&self) -> Result<&Inner, NotForwarded> {
        self.0
            .as_deref()
            .ok_or_else(|| NotForwarded::Unreachable("this replica shares no connection".into()))
    }

    /// The group `ask` names, from `owner`, as `credential`'s viewer.
    pub async fn resource_group(
        &self,
        owner: &Member,
        credential: &Credential,
        ask: &GroupAsk,
    ) -> Result<ResourceGroup, NotForwarded> {
        let inner = self.inner()?;
        let request = inner.request(owner, RESOURCE_GROUP_PATH, credential, ask)?;
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
        answer(status, &body)
    }
}

impl Inner {
    /// A request to `owner`'s `path`, signed, carrying `credential` and `ask`.
    fn request(
        &self,
        owner: &Member,
        path: &str,
        credential: &Credential,
        ask: &GroupAsk,
    ) -> Result<Request<Full<Bytes>>, NotForwarded> {
        let unreachable = |e: String| NotForwarded::Unreachable(e);
        let token = self
            .keys
            .sign_for_replica(Some(credential))
            .map_err(|e| unreachable(e.to_string()))?;
        let body = serde_json::to_vec(ask).map_err(|e| unreachable(e.to_string()))?;
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

/// The owner's answer: the group, its decision, or an answer that is neither.
fn answer(status: StatusCode, body: &[u8]) -> Result<ResourceGroup, NotForwarded> {
    let message = || {
        serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
    };
    match status {
        StatusCode::OK => wire::decode(body)
            .map_err(|e| NotForwarded::Unreachable(format!("its answer is no group: {e}"))),
        StatusCode::FORBIDDEN => Err(NotForwarded::Decided(Error::Forbidden(
            message().unwrap_or_default(),
        ))),
        StatusCode::BAD_GATEWAY => match message() {
            Some(message) => Err(NotForwarded::Decided(Error::BadGateway(message))),
            None => Err(NotForwarded::Unreachable(format!("it answered {status}"))),
        },
        status => Err(NotForwarded::Unreachable(match message() {
            Some(message) => format!("it answered {status}: {message}"),
            None => format!("it answered {status}"),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owners_decisions_are_taken_as_answers() {
        let refused = br#"{"error": {"code": "forbidden", "message": "no access"}}"#;
        match answer(StatusCode::FORBIDDEN, refused) {
            Err(NotForwarded::Decided(Error::Forbidden(m))) => assert_eq!(m, "no access"),
            other => panic!("{other:?}"),
        }
        let cluster =
            br#"{"error": {"code": "bad_gateway", "message": "cannot reach the cluster"}}"#;
        assert!(matches!(
            answer(StatusCode::BAD_GATEWAY, cluster),
            Err(NotForwarded::Decided(Error::BadGateway(_)))
        ));
        // A proxy's 502 page, a 401 (another internal secret), a 500: read here instead.
        for (status, body) in [
            (StatusCode::BAD_GATEWAY, &b"<html>bad gateway</html>"[..]),
            (StatusCode::UNAUTHORIZED, &br#"{"error": {"code": "unauthorized", "message": "token signature does not match"}}"#[..]),
            (StatusCode::INTERNAL_SERVER_ERROR, &b""[..]),
            (StatusCode::OK, &b"{}"[..]),
        ] {
            assert!(
                matches!(answer(status, body), Err(NotForwarded::Unreachable(_))),
                "{status}"
            );
        }
    }
}
