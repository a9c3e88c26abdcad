//! The Kubernetes proxy for the browser (SPEC 5.3): `/k8s-proxy/<Kubernetes API path>` is the
//! agent's cluster, reached after the session and `user_access` checks.
//!
//! Requests are forwarded as they came, minus the headers that carry the user's GitLab
//! credentials or could claim another identity; responses (the cluster's errors included) come
//! back as they are, and streams (watches, followed logs) pass each chunk on as it arrives. When
//! the client goes away, its response body is dropped and with it the upstream request.
//!
//! Every answer envlens makes itself is a Kubernetes `Status`, so that kubectl and client
//! libraries show it as they would show the cluster's own.

use std::borrow::Cow;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;

use crate::auth::Keys;
use crate::auth::{authenticate, Session, Via};
use crate::config::Limits;
use crate::db::pool::Pool;
use crate::error::{kubernetes_status, Error};
use crate::gitlab::tokens::Purpose;
use crate::gitlab::Instance;
use crate::k8s::clusters::{Cluster, Clusters};
use crate::k8s::grants::{AccessType, Grant};
use crate::k8s::observe::ForAgent;
use crate::k8s::request_info::RequestInfo;
use crate::replicas::forward::Forward;
use crate::telemetry::RequestId;

pub const PREFIX: &str = "/k8s-proxy";
const AGENT_HEADER: &str = "gitlab-agent-id";
const AGENT_QUERY: &str = "gitlab-agent-id";
/// Query parameters that are envlens' own and never reach the cluster.
const OWN_QUERY: &[&str] = &[AGENT_QUERY, "gitlab-csrf-token"];

/// Headers about this hop only (RFC 9110 section 7.6.1), never forwarded either way.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Request headers that carry the user's GitLab credentials or another identity.
const CREDENTIALS: &[&str] = &["authorization", "cookie", AGENT_HEADER, "x-csrf-token"];

pub async fn forward(
    State(keys): State<Arc<Keys>>,
    State(db): State<Pool>,
    State(clusters): State<Arc<Clusters>>,
    State(limits): State<Limits>,
    State(gitlab): State<Option<Arc<Instance>>>,
    State(forward): State<Forward>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let Admitted {
        agent_id,
        session,
        grant,
    } = match admit(&parts, &keys, &db, &clusters, gitlab.as_deref()).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let request_id = parts.extensions.get::<RequestId>().cloned();
    if parts.headers.contains_key(header::UPGRADE) {
        return kubernetes_status(
            StatusCode::NOT_IMPLEMENTED,
            "connection upgrades (exec, attach, port-forward) are not proxied",
        );
    }
    let Some(uri) = upstream_uri(&parts.uri) else {
        return kubernetes_status(
            StatusCode::BAD_REQUEST,
            "the path must be a Kubernetes API path: no segment that decodes to `.` or `..`, no encoded `/`, `\\` or `%`, no NUL, no empty segment",
        );
    };
    if let Some(refusal) = RequestInfo::parse(uri.path())
        .and_then(|info| info.refusal(clusters.own_namespace.as_deref()))
    {
        return kubernetes_status(StatusCode::FORBIDDEN, &refusal);
    }
    let body = match axum::body::to_bytes(body, limits.body_limit).await {
        Ok(body) => body,
        Err(_) => {
            let limit = limits.body_limit;
            return Error::PayloadTooLarge { limit }.to_kubernetes_status();
        }
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

    // A watch of a connection another replica holds is that replica's to serve (SPEC 16).
    if is_watch(&parts.method, &uri) {
        let credential = crate::auth::Credential::of(&parts);
        if let Some(answer) = crate::k8s::proxied_watch::through_owner(
            &forward,
            &cluster,
            &credential,
            agent_id,
            &uri,
            &parts.headers,
        )
        .await
        {
            return answer;
        }
    }
    let upstream = Upstream {
        method: parts.method,
        uri,
        headers: request_headers(parts.headers),
        body,
    };
    upstream
        .send(
            &cluster,
            agent_id,
            &grant,
            session.via,
            request_id.as_ref(),
            clusters.response_timeout,
        )
        .await
}

/// What the proxy sends the cluster: the client's request, its headers cleaned
/// ([`request_headers`]).
pub struct Upstream {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
}

impl Upstream {
    /// Sends the request to `cluster` as the viewer `grant` and `via` say (impersonation),
    /// within `timeout` for the answer's head; the answer as the cluster gave it, less this
    /// hop's headers and its CORS ones, or a Kubernetes `Status` of envlens' own.
    pub async fn send(
        self,
        cluster: &Cluster,
        agent_id: i64,
        grant: &Grant,
        via: Via,
        request_id: Option<&RequestId>,
        timeout: std::time::Duration,
    ) -> Response {
        let mut upstream = axum::http::Request::new(kube::client::Body::from(self.body));
        *upstream.method_mut() = self.method;
        *upstream.uri_mut() = self.uri;
        let headers = upstream.headers_mut();
        *headers = self.headers;
        for (name, value) in grant.impersonation_headers(AccessType::from(via)) {
            headers.append(name, value.clone());
        }
        if let Some(id) = request_id {
            id.outgoing_headers(headers);
        }
        upstream.extensions_mut().insert(ForAgent(agent_id));
        match tokio::time::timeout(timeout, cluster.client.send(upstream)).await {
            Ok(Ok(response)) => {
                let (mut parts, body) = response.into_parts();
                response_headers(&mut parts.headers);
                Response::from_parts(parts, Body::new(body))
            }
            Ok(Err(e)) => {
                tracing::warn!(agent = agent_id, cluster = %cluster.source, error = %e, "cluster unreachable");
                Error::BadGateway(format!(
                    "the cluster of agent {agent_id} cannot be reached: {e}"
                ))
                .to_kubernetes_status()
            }
            Err(_) => Error::BadGateway(format!(
                "the cluster of agent {agent_id} did not answer within {}s",
                timeout.as_secs_f32()
            ))
            .to_kubernetes_status(),
        }
    }
}

/// Whether a request is a watch (`GET` with `watch=true` or `watch=1`): what is served by the
/// owner of a connection; lists, reads, logs and writes go to the cluster from here.
pub fn is_watch(method: &Method, uri: &Uri) -> bool {
    method == Method::GET
        && uri
            .query()
            .unwrap_or("")
            .split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1" | "watch=True" | "watch"))
}

/// A request that passed the session and `user_access` checks.
pub struct Admitted {
    pub agent_id: i64,
    pub session: Session,
    pub grant: Arc<Grant>,
}

/// The checks of every proxied request (and of a watch token's request): the session, the
/// agent named, and the user's `user_access` to it. Refusals are answered as the proxy answers
/// them: 401 with `Gitlab-Unauthorized`, the same for an unknown agent as for a forbidden one.
pub async fn admit(
    parts: &Parts,
    keys: &Keys,
    db: &Pool,
    clusters: &Clusters,
    gitlab: Option<&Instance>,
) -> Result<Admitted, Response> {
    let session = match authenticate(parts, keys, gitlab, Purpose::Kubernetes).await {
        Ok(session) => session,
        // GitLab, which vouches for its tokens, or the database, which holds the dashboard's
        // sessions, cannot be asked, or the client asked too often: not a refusal.
        Err(
            e @ (Error::GitLabUnavailable(_)
            | Error::Unavailable(_)
            | Error::TooManyRequests { .. }),
        ) => return Err(e.to_kubernetes_status()),
        Err(e) => return Err(unauthorized(&e.to_string())),
    };
    let Some(agent_id) = agent_id(&parts.headers, &parts.uri) else {
        return Err(unauthorized(
            "the Gitlab-Agent-Id header (or gitlab-agent-id parameter) must name an agent",
        ));
    };
    crate::telemetry::record_agent(agent_id, None);
    match current_grant(db, clusters, agent_id, session.user_id).await {
        Ok(Some(grant)) => Ok(Admitted {
            agent_id,
            session,
            grant,
        }),
        // An unknown agent, an unknown user and a refusal read the same.
        Ok(None) => Err(unauthorized(&format!(
            "agent {agent_id} does not exist or its user_access does not allow you"
        ))),
        Err(e) => Err(e.to_kubernetes_status()),
    }
}

/// The user's grant to the agent now: a recent decision needs no connection, so the proxy
/// works while the database is down.
pub async fn current_grant(
    db: &Pool,
    clusters: &Clusters,
    agent_id: i64,
    user_id: i64,
) -> Result<Option<Arc<Grant>>, Error> {
    let grants = &clusters.grants;
    match grants.cached(agent_id, user_id) {
        Some(grant) => Ok(grant),
        None => {
            let mut conn = db.acquire().await?;
            Ok(grants.authorize(&mut *conn, agent_id, user_id).await?)
        }
    }
}

/// The agent a proxied request names: `Gitlab-Agent-Id`, else the query's parameter.
pub fn agent_id(headers: &HeaderMap, uri: &Uri) -> Option<i64> {
    let from_header = headers.get(AGENT_HEADER).and_then(|v| v.to_str().ok());
    let from_query = || {
        uri.query()?
            .split('&')
            .find_map(|pair| pair.strip_prefix(AGENT_QUERY)?.strip_prefix('='))
    };
    from_header
        .or_else(from_query)?
        .trim()
        .parse()
        .ok()
        .filter(|id| *id > 0)
}

/// The cluster's URI for the request: the path after the prefix, the query without envlens'
/// own parameters; `None` when the path is refused (see [`unambiguous_path`]).
pub fn upstream_uri(uri: &Uri) -> Option<Uri> {
    let path = uri.path().strip_prefix(PREFIX)?;
    let path = if path.is_empty() { "/" } else { path };
    if !unambiguous_path(path) {
        return None;
    }
    let query = uri.query().unwrap_or("");
    if query.is_empty() {
        return path.parse().ok();
    }
    let query: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let key = pair.split('=').next().unwrap_or("");
            !pair.is_empty() && !OWN_QUERY.contains(&key)
        })
        .collect();
    let path_and_query = if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", query.join("&"))
    };
    path_and_query.parse().ok()
}

/// Whether `path` means the same to every server that reads it, judged on its decoded segments
/// (RFC 3986 section 6.2.2): behind a cluster URL with a path (as Rancher's), a segment that
/// decodes to `.` or `..` could leave the cluster's API, whether sent as `..`, `%2e%2e`, `.%2E`
/// or `..%2f`. Refused: such segments; an encoded `/` or `\`, or a `\` at all (servers split
/// on them differently); NUL; a `%` that does not start a valid escape, or that decodes to `%`
/// (a server decoding twice would see `%2e%2e` in `%252e%252e`); and empty segments but a last
/// one (servers that merge `//` would shift the path). Kubernetes' own paths need none of these.
fn unambiguous_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let mut segments = rest.split('/').peekable();
    while let Some(segment) = segments.next() {
        // Decoded only when it has an escape: every proxied request comes through here.
        let decoded: Cow<'_, [u8]> = if segment.contains('%') {
            match percent_decode(segment) {
                Some(decoded) => Cow::Owned(decoded),
                None => return false,
            }
        } else {
            Cow::Borrowed(segment.as_bytes())
        };
        let empty_inside = decoded.is_empty() && segments.peek().is_some();
        if empty_inside
            || *decoded == *b"."
            || *decoded == *b".."
            || decoded.iter().any(|b| matches!(b, b'/' | b'\\' | 0 | b'%'))
        {
            return false;
        }
    }
    true
}

/// A path segment with its `%XX` escapes decoded; `None` when a `%` starts no valid escape.
fn percent_decode(segment: &str) -> Option<Vec<u8>> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// The client's headers minus this hop's, the GitLab credentials, any `Impersonate-*` (the
/// identity is envlens' to set), and the framing the upstream request sets anew.
pub fn request_headers(mut headers: HeaderMap) -> HeaderMap {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    remove_where(&mut headers, |name| {
        HOP_BY_HOP.contains(&name)
            || CREDENTIALS.contains(&name)
            || name == "host"
            || name == "content-length"
            || name.starts_with("impersonate-")
    });
    headers
}

/// The cluster's headers minus this hop's and its CORS headers: which origins may read the
/// answer is envlens' decision, not the cluster's.
pub fn response_headers(headers: &mut HeaderMap) {
    remove_where(headers, |name| {
        HOP_BY_HOP.contains(&name) || name.starts_with("access-control-")
    });
}

/// Removes every header whose (lower-case) name `unwanted` picks, in one pass over the names
/// (the usual request or response has a handful of headers, and most lists name more).
fn remove_where(headers: &mut HeaderMap, unwanted: impl Fn(&str) -> bool) {
    let names: Vec<HeaderName> = headers
        .keys()
        .filter(|name| unwanted(name.as_str()))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

/// 401 for every credential or `user_access` failure, marked for GitLab's frontend.
pub fn unauthorized(message: &str) -> Response {
    let mut response = kubernetes_status(StatusCode::UNAUTHORIZED, message);
    response.headers_mut().insert(
        HeaderName::from_static("gitlab-unauthorized"),
        HeaderValue::from_static("true"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(uri: &str) -> Option<String> {
        upstream_uri(&uri.parse().unwrap()).map(|u| u.to_string())
    }

    #[test]
    fn paths_and_queries() {
        assert_eq!(
            upstream("/k8s-proxy/api/v1/namespaces/a/pods?labelSelector=a%3Db&gitlab-agent-id=7&watch=true"),
            Some("/api/v1/namespaces/a/pods?labelSelector=a%3Db&watch=true".into())
        );
        assert_eq!(
            upstream("/k8s-proxy/version?gitlab-agent-id=7"),
            Some("/version".into())
        );
        assert_eq!(upstream("/k8s-proxy/api/../../x"), None);
        assert_eq!(upstream("/k8s-proxy/api/./v1"), None);
        assert_eq!(upstream("/k8s-proxyx/api"), None);
        assert_eq!(upstream("/k8s-proxy/"), Some("/".into()));
        assert_eq!(upstream("/k8s-proxy"), Some("/".into()));
    }

    #[test]
    fn segments_are_judged_decoded() {
        for path in [
            "/api/v1/namespaces/a/pods",
            "/apis/apps/v1/namespaces/a/deployments/web",
            "/api/v1/namespaces/a/pods/web-1/log",
            "/api/",
            "/api/v1/namespaces/a/pods/a%3Ab",
            "/api/v1/namespaces/a.b/pods/...",
        ] {
            assert!(unambiguous_path(path), "{path} refused");
        }
        for path in [
            "/%2e%2e/%2e%2e/api/graphql",
            "/%2E%2E/x",
            "/api/.%2e/x",
            "/api/%2e/x",
            "/api/%2e",
            "/api/..%2f..%2fx",
            "/api/..%2F",
            "/api/a%5cb",
            "/api/a\\b",
            "/api/a%00b",
            "/api/%252e%252e/x",
            "/api/%2",
            "/api/%zz",
            "/api//v1",
            "//api",
            "api",
            "/..",
            "/.",
        ] {
            assert!(!unambiguous_path(path), "{path} accepted");
        }
    }

    #[test]
    fn agent_from_header_or_query() {
        let mut headers = HeaderMap::new();
        let uri: Uri = "/k8s-proxy/api?gitlab-agent-id=9".parse().unwrap();
        assert_eq!(agent_id(&headers, &uri), Some(9));
        headers.insert(AGENT_HEADER, HeaderValue::from_static("7"));
        assert_eq!(agent_id(&headers, &uri), Some(7));
        headers.insert(AGENT_HEADER, HeaderValue::from_static("-1"));
        assert_eq!(agent_id(&headers, &"/k8s-proxy/api".parse().unwrap()), None);
    }

    #[test]
    fn credentials_and_identity_never_leave() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("authorization", "Bearer x"),
            ("cookie", "_gitlab_kas=x"),
            ("gitlab-agent-id", "7"),
            ("x-csrf-token", "t"),
            ("impersonate-user", "system:admin"),
            ("impersonate-group", "system:masters"),
            ("impersonate-extra-scopes", "all"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("accept", "application/json"),
            ("content-type", "application/json"),
        ] {
            headers.append(name, HeaderValue::from_static(value));
        }
        let kept = request_headers(headers);
        let mut names: Vec<&str> = kept.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["accept", "content-type"]);
    }

    #[test]
    fn the_clusters_cors_and_framing_stay_behind() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("access-control-allow-origin", "*"),
            ("access-control-allow-credentials", "true"),
            ("connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("content-type", "application/json"),
            ("audit-id", "a"),
            ("cache-control", "no-cache, private"),
        ] {
            headers.append(name, HeaderValue::from_static(value));
        }
        response_headers(&mut headers);
        let mut names: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        names.sort();
        assert_eq!(names, ["audit-id", "cache-control", "content-type"]);
    }
}
