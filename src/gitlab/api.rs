//! The GitLab connection (SPEC 12.1): GitLab's REST API and its OpenID Connect documents, as a
//! third party reaches them. Every call follows GitLab's pagination, waits out its rate limits
//! (`RateLimit-*`, `429` with `Retry-After`), retries 5xx answers and timeouts with backoff, is
//! counted in `/metrics` by endpoint and answer, and carries the request id of the request it is
//! made for. The token is sent as `PRIVATE-TOKEN` and never appears in a log line, an error or
//! `Debug`.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;

use crate::telemetry::{Metrics, RequestId};

type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// GitLab answers a page of 100 items in well under a megabyte; a larger body is refused.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// A token for GitLab's API. `Debug` never shows it.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl Token {
    pub fn new(token: &str) -> Self {
        Token(token.trim().into())
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// How a call to GitLab failed. Messages name the endpoint, never the token.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// GitLab refused the credentials (401).
    #[error("GitLab refused the token for {endpoint}")]
    Unauthorized { endpoint: &'static str },
    /// Any other answer that is not a success, after the retries.
    #[error("GitLab answered {status} for {endpoint}")]
    Status {
        endpoint: &'static str,
        status: StatusCode,
    },
    /// A list longer than the bound set for it.
    #[error("GitLab lists more than {limit} items at {endpoint}")]
    TooMany {
        endpoint: &'static str,
        limit: usize,
    },
    /// No usable answer: connection refused, timeouts, a body that is not what was expected.
    #[error("GitLab cannot be reached for {endpoint}: {reason}")]
    Unreachable {
        endpoint: &'static str,
        reason: String,
    },
}

/// Retries, timeouts and waits; the defaults suit GitLab.com and a self-managed instance.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Attempts per call, the first included.
    pub attempts: u32,
    /// Each attempt's limit, to the whole body.
    pub timeout: Duration,
    /// The first backoff after a 5xx or a timeout; doubled each time.
    pub backoff: Duration,
    /// The longest wait a `Retry-After` or `RateLimit-Reset` may impose before the call fails.
    pub max_wait: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            attempts: 4,
            timeout: Duration::from_secs(30),
            backoff: Duration::from_millis(500),
            max_wait: Duration::from_secs(60),
        }
    }
}

/// One answer: its status, headers and body.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The next page's query, from `Link: <...>; rel="next"` (keyset and offset alike), else
    /// from `X-Next-Page` (offset pagination, which GitLab sends without `Link` past 10,000).
    fn next_page(&self) -> Option<String> {
        let link = self
            .headers
            .get_all(header::LINK)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .find(|part| part.contains("rel=\"next\""));
        if let Some(part) = link {
            let url = part.split(';').next()?.trim().trim_start_matches('<');
            let url = url.trim_end_matches('>');
            return url.split_once('?').map(|(_, query)| query.to_owned());
        }
        None
    }

    fn next_page_number(&self) -> Option<u64> {
        self.headers
            .get("x-next-page")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
    }
}

/// A client of one GitLab instance.
#[derive(Clone)]
pub struct GitLab {
    /// e.g. `https://gitlab.example.com`, without a trailing slash.
    base: Arc<str>,
    token: Option<Token>,
    client: Client<Https, Full<Bytes>>,
    metrics: Arc<Metrics>,
    policy: Policy,
    /// Calls sent (each attempt), for a sync pass's report.
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for GitLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitLab").field("base", &self.base).finish()
    }
}

impl GitLab {
    /// A client of the instance at `base`; HTTPS is verified against the system's roots.
    pub fn new(
        base: &str,
        token: Option<Token>,
        metrics: Arc<Metrics>,
        policy: Policy,
    ) -> anyhow::Result<Self> {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| anyhow::anyhow!("no CA certificates to verify GitLab with: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(GitLab {
            base: base.trim_end_matches('/').into(),
            token,
            client: Client::builder(TokioExecutor::new()).build(connector),
            metrics,
            policy,
            sent: Arc::default(),
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether the instance's own token is configured (needed for every call but the public
    /// documents and a user's own token).
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// The same client with another retry policy (a hook's inline attempt is short).
    pub fn with_policy(&self, policy: Policy) -> Self {
        GitLab {
            policy,
            ..self.clone()
        }
    }

    /// Calls sent so far by this client and its clones, each attempt counted.
    pub fn requests_sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `GET` of a URL under the instance, `None` for a 404 (an object GitLab does not have).
    pub async fn get_optional<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        path_and_query: &str,
        request_id: Option<&RequestId>,
    ) -> Result<Option<T>, ApiError> {
        match self.get_raw(endpoint, path_and_query, request_id).await? {
            Some(body) => parse(endpoint, &body).map(Some),
            None => Ok(None),
        }
    }

    /// The body of a `GET` as GitLab sends it (a repository file's raw content, say), `None`
    /// for a 404.
    pub async fn get_raw(
        &self,
        endpoint: &'static str,
        path_and_query: &str,
        request_id: Option<&RequestId>,
    ) -> Result<Option<Bytes>, ApiError> {
        match self
            .send(endpoint, path_and_query, self.token.as_ref(), request_id)
            .await
        {
            Ok(answer) => Ok(Some(answer.body)),
            Err(ApiError::Status {
                status: StatusCode::NOT_FOUND,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `GET` of a public document (OpenID discovery, the key set), without any credential.
    pub async fn get_public<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        url: &str,
    ) -> Result<T, ApiError> {
        let answer = self.exchange(endpoint, url, None, None).await?;
        parse(endpoint, &answer.body)
    }

    /// `GET` of a URL under the instance (`/api/v4/...`, `/.well-known/...`), parsed as `T`,
    /// with the instance's token. `endpoint` names it in metrics and errors: a pattern such as
    /// `/projects/:id/environments`, never a path with ids.
    pub async fn get<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        path_and_query: &str,
        request_id: Option<&RequestId>,
    ) -> Result<T, ApiError> {
        let answer = self
            .send(endpoint, path_and_query, self.token.as_ref(), request_id)
            .await?;
        parse(endpoint, &answer.body)
    }

    /// Every item of a paginated list, following `Link` / `X-Next-Page`, 100 per page.
    pub async fn get_all<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        path: &str,
        request_id: Option<&RequestId>,
    ) -> Result<Vec<T>, ApiError> {
        self.get_all_limited(endpoint, path, request_id, usize::MAX)
            .await
    }

    /// [`GitLab::get_all`], failing with [`ApiError::TooMany`] once more than `limit` items
    /// came: a bound on what one list may cost.
    pub async fn get_all_limited<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        path: &str,
        request_id: Option<&RequestId>,
        limit: usize,
    ) -> Result<Vec<T>, ApiError> {
        let separator = if path.contains('?') { '&' } else { '?' };
        let (base_path, _) = path.split_once('?').unwrap_or((path, ""));
        let mut next = format!("{path}{separator}per_page=100");
        let mut items = Vec::new();
        loop {
            let answer = self
                .send(endpoint, &next, self.token.as_ref(), request_id)
                .await?;
            items.extend(parse::<Vec<T>>(endpoint, &answer.body)?);
            if items.len() > limit {
                return Err(ApiError::TooMany { endpoint, limit });
            }
            next = match (answer.next_page(), answer.next_page_number()) {
                (Some(query), _) => format!("{base_path}?{query}"),
                (None, Some(page)) => {
                    format!("{path}{separator}per_page=100&page={page}")
                }
                (None, None) => return Ok(items),
            };
        }
    }

    /// `GET` with a caller's own token (`Authorization: Bearer`), e.g. `/api/v4/user` to learn
    /// whose token it is. A 401 is [`ApiError::Unauthorized`].
    pub async fn get_as<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        path_and_query: &str,
        bearer: &Token,
        request_id: Option<&RequestId>,
    ) -> Result<T, ApiError> {
        let answer = self
            .exchange(
                endpoint,
                path_and_query,
                Some(Credential::Bearer(bearer)),
                request_id,
            )
            .await?;
        parse(endpoint, &answer.body)
    }

    /// One request as the caller built it (the OAuth token exchange of "Sign in with GitLab",
    /// through the `oauth2` crate), to a URL under the instance only. Never retried: what it
    /// carries (an authorization code) works once. Counted as every call is; any status is
    /// an answer (the protocol reads GitLab's error bodies).
    pub async fn send_once(
        &self,
        endpoint: &'static str,
        request: axum::http::Request<Vec<u8>>,
    ) -> Result<axum::http::Response<Vec<u8>>, ApiError> {
        let unreachable = |reason: String| ApiError::Unreachable { endpoint, reason };
        let url = request.uri().to_string();
        if !url
            .strip_prefix(&*self.base)
            .is_some_and(|rest| rest.starts_with('/'))
        {
            return Err(unreachable(format!("{url} is not under {}", self.base)));
        }
        let (mut parts, body) = request.into_parts();
        parts.headers.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("envlens/", env!("CARGO_PKG_VERSION"))),
        );
        if let Some(value) = parts.headers.get_mut(header::AUTHORIZATION) {
            value.set_sensitive(true);
        }
        let request = Request::from_parts(parts, Full::new(Bytes::from(body)));
        let started = std::time::Instant::now();
        let outcome = self
            .round_trip(request)
            .await
            .map(|(parts, body)| axum::http::Response::from_parts(parts, body.to_vec()));
        let code = outcome.as_ref().ok().map(|r| r.status().as_u16());
        self.metrics
            .gitlab_request(endpoint, code, started.elapsed());
        outcome.map_err(unreachable)
    }

    async fn send(
        &self,
        endpoint: &'static str,
        path_and_query: &str,
        token: Option<&Token>,
        request_id: Option<&RequestId>,
    ) -> Result<Answer, ApiError> {
        self.exchange(
            endpoint,
            path_and_query,
            token.map(Credential::Private),
            request_id,
        )
        .await
    }

    /// One call, with its retries and waits.
    async fn exchange(
        &self,
        endpoint: &'static str,
        path_and_query: &str,
        credential: Option<Credential<'_>>,
        request_id: Option<&RequestId>,
    ) -> Result<Answer, ApiError> {
        let absolute =
            path_and_query.starts_with("http://") || path_and_query.starts_with("https://");
        let url = if absolute {
            path_and_query.to_owned()
        } else {
            format!("{}{path_and_query}", self.base)
        };
        // A URL GitLab named (a `jwks_uri`, a `Link`) that leads elsewhere gets no credential.
        let credential = credential.filter(|_| {
            !absolute
                || url
                    .strip_prefix(&*self.base)
                    .is_some_and(|rest| rest.starts_with('/'))
        });
        let mut backoff = self.policy.backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= self.policy.attempts;
            let started = std::time::Instant::now();
            self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let outcome = self
                .once(Method::GET, &url, None, credential, request_id)
                .await;
            let code = match &outcome {
                Ok(answer) => Some(answer.status.as_u16()),
                Err(_) => None,
            };
            self.metrics
                .gitlab_request(endpoint, code, started.elapsed());
            let wait = match outcome {
                Ok(answer) if answer.status.is_success() => {
                    // Spend the budget evenly: when it is gone, wait for its reset before
                    // the next call rather than collecting a 429.
                    if let Some(wait) = rate_limit_wait(&answer.headers) {
                        tokio::time::sleep(wait.min(self.policy.max_wait)).await;
                    }
                    return Ok(answer);
                }
                Ok(answer) if answer.status == StatusCode::UNAUTHORIZED => {
                    return Err(ApiError::Unauthorized { endpoint })
                }
                Ok(answer) if answer.status == StatusCode::TOO_MANY_REQUESTS => {
                    let wait = retry_after(&answer.headers).unwrap_or(backoff);
                    if last || wait > self.policy.max_wait {
                        return Err(ApiError::Status {
                            endpoint,
                            status: answer.status,
                        });
                    }
                    wait
                }
                Ok(answer) if answer.status.is_server_error() && !last => backoff,
                Ok(answer) => {
                    return Err(ApiError::Status {
                        endpoint,
                        status: answer.status,
                    })
                }
                Err(reason) if !last => {
                    tracing::debug!(endpoint, %reason, attempt, "GitLab call failed; retrying");
                    backoff
                }
                Err(reason) => return Err(ApiError::Unreachable { endpoint, reason }),
            };
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(self.policy.max_wait);
        }
    }

    /// A write (`POST`, `PUT`) of `body` as JSON to a path under the instance, with the
    /// instance's token, parsed as `T`. Sent once: a write GitLab may have done is not sent
    /// again here (its caller keeps it and decides, as the follow-ups do).
    pub async fn send_json<T: DeserializeOwned>(
        &self,
        method: Method,
        endpoint: &'static str,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<T, ApiError> {
        let url = format!("{}{path}", self.base);
        let started = std::time::Instant::now();
        self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let outcome = self
            .once(
                method,
                &url,
                Some(body.to_string().into_bytes()),
                self.token.as_ref().map(Credential::Private),
                None,
            )
            .await;
        let code = outcome.as_ref().ok().map(|a| a.status.as_u16());
        self.metrics
            .gitlab_request(endpoint, code, started.elapsed());
        match outcome {
            Ok(answer) if answer.status.is_success() => parse(endpoint, &answer.body),
            Ok(answer) if answer.status == StatusCode::UNAUTHORIZED => {
                Err(ApiError::Unauthorized { endpoint })
            }
            Ok(answer) => Err(ApiError::Status {
                endpoint,
                status: answer.status,
            }),
            Err(reason) => Err(ApiError::Unreachable { endpoint, reason }),
        }
    }

    async fn once(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
        credential: Option<Credential<'_>>,
        request_id: Option<&RequestId>,
    ) -> Result<Answer, String> {
        let mut request = Request::builder()
            .method(method)
            .uri(url)
            .header(header::ACCEPT, "application/json")
            .header(
                header::USER_AGENT,
                concat!("envlens/", env!("CARGO_PKG_VERSION")),
            );
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let mut request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| format!("bad URL: {e}"))?;
        let headers = request.headers_mut();
        match credential {
            Some(Credential::Private(token)) => {
                headers.insert(PRIVATE_TOKEN, secret_value(&token.0)?);
            }
            Some(Credential::Bearer(token)) => {
                headers.insert(
                    header::AUTHORIZATION,
                    secret_value(&format!("Bearer {}", token.0))?,
                );
            }
            None => {}
        }
        if let Some(id) = request_id {
            headers.insert(HeaderName::from_static("x-request-id"), id.header_value());
        }
        let (parts, body) = self.round_trip(request).await?;
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// One request and its answer, read up to `MAX_BODY`, within the policy's timeout.
    async fn round_trip(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<(axum::http::response::Parts, Bytes), String> {
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("{e}"))?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_BODY)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            Ok((parts, body))
        };
        tokio::time::timeout(self.policy.timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {:?}", self.policy.timeout))?
    }
}

#[derive(Clone, Copy)]
enum Credential<'a> {
    /// The instance's own token.
    Private(&'a Token),
    /// A user's token, checked on their behalf.
    Bearer(&'a Token),
}

const PRIVATE_TOKEN: HeaderName = HeaderName::from_static("private-token");

/// A header value marked sensitive, so that hyper never prints it.
fn secret_value(text: &str) -> Result<HeaderValue, String> {
    let mut value =
        HeaderValue::from_str(text).map_err(|_| "the token is not a valid header".to_owned())?;
    value.set_sensitive(true);
    Ok(value)
}

/// A path segment or query value as GitLab's API takes it: a project's or group's full path
/// (`acme%2Fapps`), a file path, a branch name. Everything but RFC 3986's unreserved
/// characters is percent-encoded.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn parse<T: DeserializeOwned>(endpoint: &'static str, body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::Unreachable {
        endpoint,
        reason: format!("the answer is not what GitLab documents: {e}"),
    })
}

/// `Retry-After` in seconds (GitLab sends seconds, never a date).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// When `RateLimit-Remaining` is 0, the time until `RateLimit-Reset` (a Unix time).
fn rate_limit_wait(headers: &HeaderMap) -> Option<Duration> {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if number("ratelimit-remaining")? > 0 {
        return None;
    }
    let reset = number("ratelimit-reset")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    Some(Duration::from_secs(reset.saturating_sub(now)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(headers: &[(&str, &str)]) -> Answer {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        Answer {
            status: StatusCode::OK,
            headers: map,
            body: Bytes::new(),
        }
    }

    #[test]
    fn next_pages_as_gitlab_links_them() {
        // GitLab's documented Link header (doc/api/rest/_index.md), keyset and offset.
        let a = answer(&[("link", "<https://gitlab.example.com/api/v4/projects?pagination=keyset&per_page=50&order_by=id&sort=asc&id_after=42>; rel=\"next\"")]);
        assert_eq!(
            a.next_page().as_deref(),
            Some("pagination=keyset&per_page=50&order_by=id&sort=asc&id_after=42")
        );
        let a = answer(&[("link", "<https://gitlab.example.com/api/v4/projects/8/issues/8/notes?page=1&per_page=3>; rel=\"prev\", <https://gitlab.example.com/api/v4/projects/8/issues/8/notes?page=3&per_page=3>; rel=\"next\", <https://gitlab.example.com/api/v4/projects/8/issues/8/notes?page=1&per_page=3>; rel=\"first\"")]);
        assert_eq!(a.next_page().as_deref(), Some("page=3&per_page=3"));
        let a = answer(&[("x-next-page", "4"), ("x-page", "3")]);
        assert_eq!((a.next_page(), a.next_page_number()), (None, Some(4)));
        let a = answer(&[("x-next-page", "")]);
        assert_eq!((a.next_page(), a.next_page_number()), (None, None));
    }

    #[test]
    fn rate_limits_are_waited_out() {
        assert_eq!(
            retry_after(&answer(&[("retry-after", "30")]).headers),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            rate_limit_wait(
                &answer(&[("ratelimit-remaining", "5"), ("ratelimit-reset", "1")]).headers
            ),
            None
        );
        assert_eq!(
            rate_limit_wait(
                &answer(&[("ratelimit-remaining", "0"), ("ratelimit-reset", "1")]).headers
            ),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn paths_are_encoded_as_gitlab_takes_them() {
        assert_eq!(encode("acme/apps"), "acme%2Fapps");
        assert_eq!(
            encode(".gitlab/agents/prod/config.yaml"),
            ".gitlab%2Fagents%2Fprod%2Fconfig.yaml"
        );
        assert_eq!(encode("feature/ü x"), "feature%2F%C3%BC%20x");
    }

    #[test]
    fn the_token_is_never_shown() {
        let token = Token::new("glpat-secret-value");
        assert_eq!(format!("{token:?}"), "Token(..)");
        let gitlab = GitLab::new(
            "https://gitlab.example.com/",
            Some(token),
            Arc::default(),
            Policy::default(),
        )
        .unwrap();
        assert!(!format!("{gitlab:?}").contains("glpat"));
        assert_eq!(gitlab.base(), "https://gitlab.example.com");
        assert!(secret_value("x").unwrap().is_sensitive());
    }
}
