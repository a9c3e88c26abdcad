//! A stand-in for GitLab's agent server (KAS) and its Kubernetes API proxy, in front of the test
//! Kubernetes API servers, written from SPEC 14 and KAS' sources
//! (`internal/module/kubernetes_api/server/proxy.go`, agentk's impersonation):
//!
//! - `Authorization: Bearer pat:<agent id>:<token>`, one header, parsed as KAS does; every
//!   refusal is a 401 with `Gitlab-Unauthorized: true`;
//! - GitLab is asked (`authorize_proxy_user`, [`super::gitlab_kas`]) whether the token is
//!   active with `k8s_proxy` and its user passes the agent's `user_access`; answers are kept 60 s
//!   (refusals 10 s), as KAS keeps them;
//! - `Authorization`, `Cookie`, `Gitlab-Agent-Id`, `X-Csrf-Token`, `Host` and hop-by-hop
//!   headers are stripped, `Via` added both ways, the cluster's CORS headers dropped;
//! - the cluster sees the agent's ServiceAccount (`access_as: agent`), or the token's user
//!   impersonated with GitLab's roles as groups and agentk's extras (`access_as: user`). The
//!   test API server has no authentication, so the agent's identity is itself presented by
//!   impersonation: a request carrying its own `Impersonate-*` is refused in both modes, as
//!   agentk refuses nested impersonation;
//! - a disconnected agent is waited for (20 s in KAS, [`TestKas::start`]'s `wait` here), then
//!   502 `... Agent connection not found. Is agent up to date and connected?`;
//! - its own errors are `Status` bodies whose message starts `GitLab Agent Server:`, with its
//!   `Server` header; answers from the cluster stream through (watches, followed logs), and
//!   break off when the agent disconnects, as its tunnel goes with it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::watch;

use super::gitlab_kas::KAS_API_SECRET;
use super::kube_api::Served;

const SERVER: &str = "gitlab-kas/v17.6.0/test";
const PREFIX: &str = "/k8s-proxy/";
const NOT_CONNECTED: &str = "HTTP->gRPC: failed to read gRPC response: rpc error: code = \
     DeadlineExceeded desc = Agent connection not found. Is agent up to date and connected?";
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

type Client =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

/// What GitLab answered for one (agent, token), and when.
type Decision = (Instant, Result<Value, u16>);
/// One (agent, token)'s decision, locked while GitLab is asked.
type Slot = Arc<tokio::sync::Mutex<Option<Decision>>>;

struct Inner {
    gitlab: String,
    wait: Mutex<Duration>,
    ttl: Duration,
    /// Connected agents and the API server their agentk reaches.
    agents: Mutex<HashMap<i64, String>>,
    connected: watch::Sender<u64>,
    /// Per (agent, token); concurrent requests wait for one call to GitLab, as KAS' cache does.
    decisions: Mutex<HashMap<(i64, String), Slot>>,
    /// Every request KAS received: method, path and query, headers.
    received: Mutex<Vec<(String, String, HeaderMap)>>,
    client: Client,
}

/// A running KAS; dropping it stops it.
pub struct TestKas {
    pub addr: SocketAddr,
    inner: Arc<Inner>,
    stop: watch::Sender<bool>,
}

impl TestKas {
    /// KAS on 127.0.0.1:0 for the GitLab at `gitlab_url`, waiting `wait` for a disconnected
    /// agent.
    pub async fn start(gitlab_url: &str, wait: Duration) -> TestKas {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let inner = Arc::new(Inner {
            gitlab: gitlab_url.trim_end_matches('/').to_owned(),
            wait: Mutex::new(wait),
            ttl: Duration::from_secs(60),
            agents: Mutex::default(),
            connected: watch::Sender::new(0),
            decisions: Mutex::default(),
            received: Mutex::default(),
            client: hyper_util::client::legacy::Client::builder(
                hyper_util::rt::TokioExecutor::new(),
            )
            .build_http(),
        });
        let app = axum::Router::new()
            .fallback(proxy)
            .with_state(inner.clone());
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await;
        });
        TestKas { addr, inner, stop }
    }

    /// The Kubernetes API proxy's URL, as `externalK8sProxyUrl` names it.
    pub fn proxy_url(&self) -> String {
        format!("http://{}/k8s-proxy", self.addr)
    }

    /// The agents' address, as GitLab 17.5's `externalUrl` names it.
    pub fn external_url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    /// The agent's agentk connects, from the cluster `served` runs.
    pub fn connect(&self, agent: i64, served: &Served) {
        lock(&self.inner.agents).insert(agent, served.url());
        self.inner.connected.send_modify(|n| *n += 1);
    }

    /// The agent's agentk goes away: requests wait for it, and its open streams break off.
    pub fn disconnect(&self, agent: i64) {
        lock(&self.inner.agents).remove(&agent);
        self.inner.connected.send_modify(|n| *n += 1);
    }

    /// From now on, waits `wait` for a disconnected agent.
    pub fn set_wait(&self, wait: Duration) {
        *lock(&self.inner.wait) = wait;
    }

    /// Forgets GitLab's answers, as KAS does 60 s after each (10 s for refusals): the next
    /// request of each (agent, token) asks GitLab again.
    pub fn forget_decisions(&self) {
        lock(&self.inner.decisions).clear();
    }

    /// Every request received so far: method, path and query, headers.
    pub fn received(&self) -> Vec<(String, String, HeaderMap)> {
        lock(&self.inner.received).clone()
    }
}

impl Drop for TestKas {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn proxy(State(kas): State<Arc<Inner>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    lock(&kas.received).push((
        parts.method.to_string(),
        path_and_query.clone(),
        parts.headers.clone(),
    ));
    let Some(rest) = path_and_query.strip_prefix(PREFIX) else {
        return kas_error(
            StatusCode::BAD_REQUEST,
            "Bad request: URL does not start with expected prefix",
        );
    };
    let upstream_path = format!("/{rest}");
    let (agent, token) = match credentials(&parts.headers) {
        Ok(found) => found,
        Err(why) => return unauthorized(&format!("Unauthorized: {why}")),
    };
    let authorization = match authorize(&kas, agent, &token).await {
        Ok(authorization) => authorization,
        Err(401) => return unauthorized("Unauthorized"),
        Err(_) => {
            return kas_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Failed to authorize user session",
            )
        }
    };
    let Some(cluster) = wait_for(&kas, agent).await else {
        return kas_error(StatusCode::BAD_GATEWAY, NOT_CONNECTED);
    };
    let headers = &mut parts.headers;
    if headers
        .keys()
        .any(|name| name.as_str().starts_with("impersonate-"))
    {
        // agentk's own answer (plain text, as `http.Error` writes it).
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "Nested impersonation is not supported - agent is already configured to impersonate an identity",
        )
            .into_response();
    }
    strip(headers);
    for name in [
        "authorization",
        "cookie",
        "gitlab-agent-id",
        "x-csrf-token",
        "host",
    ] {
        headers.remove(name);
    }
    headers.append(
        header::VIA,
        HeaderValue::from_str(&format!("gRPC/1.0 {SERVER}")).unwrap(),
    );
    impersonate(headers, agent, &authorization);
    let uri = format!("{cluster}{upstream_path}");
    let mut upstream = axum::http::Request::new(body);
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = uri.parse().unwrap();
    *upstream.headers_mut() = parts.headers;
    match kas.client.request(upstream).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip(&mut parts.headers);
            let cors: Vec<HeaderName> = parts
                .headers
                .keys()
                .filter(|n| n.as_str().starts_with("access-control-"))
                .cloned()
                .collect();
            for name in cors {
                parts.headers.remove(name);
            }
            parts.headers.append(
                header::VIA,
                HeaderValue::from_str(&format!("gRPC/1.0 {SERVER}")).unwrap(),
            );
            let gone = Box::pin(until_disconnected(kas.clone(), agent));
            Response::from_parts(parts, Body::new(Tunnel { body, gone }))
        }
        Err(e) => kas_error(
            StatusCode::BAD_GATEWAY,
            &format!("HTTP->gRPC: failed to read gRPC response: {e}"),
        ),
    }
}

/// Resolves once `agent` is no longer connected.
async fn until_disconnected(kas: Arc<Inner>, agent: i64) {
    let mut changes = kas.connected.subscribe();
    while lock(&kas.agents).contains_key(&agent) {
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// A cluster's answer through the agent's tunnel: it breaks off when the agent disconnects.
struct Tunnel {
    body: hyper::body::Incoming,
    gone: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl http_body::Body for Tunnel {
    type Data = axum::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if self.gone.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(Some(Err("the agent disconnected".into())));
        }
        std::pin::Pin::new(&mut self.body)
            .poll_frame(cx)
            .map_err(Into::into)
    }
}

/// The agent id and token of `Authorization: Bearer pat:<agent>:<token>`, worded as KAS.
fn credentials(headers: &HeaderMap) -> Result<(i64, String), String> {
    let values: Vec<&HeaderValue> = headers.get_all(header::AUTHORIZATION).iter().collect();
    let value = match values.as_slice() {
        [] => return Err("no valid credentials provided".into()),
        [one] => one.to_str().unwrap_or_default(),
        more => {
            return Err(format!(
                "Authorization header: expecting a single header, got {}",
                more.len()
            ))
        }
    };
    let Some(token) = value.strip_prefix("Bearer ") else {
        return Err("Authorization header: expecting Bearer token".into());
    };
    let Some((kind, rest)) = token.split_once(':') else {
        return Err("Authorization header: invalid value".into());
    };
    if kind != "pat" {
        return Err("Authorization header: unknown token type".into());
    }
    let Some((agent, token)) = rest.split_once(':') else {
        return Err("Authorization header: invalid value".into());
    };
    let agent: i64 = agent
        .parse()
        .map_err(|e| format!("Authorization header: failed to parse: {e}"))?;
    if token.is_empty() {
        return Err("Authorization header: empty token".into());
    }
    Ok((agent, token.to_owned()))
}

/// GitLab's `authorize_proxy_user` answer, kept `ttl` (a refusal 10 s); `Err(401)` for a
/// refusal (GitLab's 401, 403 and 404), another code when GitLab failed.
async fn authorize(kas: &Inner, agent: i64, token: &str) -> Result<Value, u16> {
    let entry = lock(&kas.decisions)
        .entry((agent, token.to_owned()))
        .or_default()
        .clone();
    let mut entry = entry.lock().await;
    if let Some((at, decision)) = entry.as_ref() {
        let ttl = if decision.is_ok() {
            kas.ttl
        } else {
            kas.ttl.min(Duration::from_secs(10))
        };
        if at.elapsed() < ttl {
            return decision.clone();
        }
    }
    let body = json!({"agent_id": agent, "access_type": "personal_access_token",
                      "access_key": token, "csrf_token": ""});
    let request = axum::http::Request::post(format!(
        "{}/api/v4/internal/kubernetes/authorize_proxy_user",
        kas.gitlab
    ))
    .header("gitlab-kas-api-request", KAS_API_SECRET)
    .header(header::CONTENT_TYPE, "application/json")
    .body(Body::from(body.to_string()))
    .unwrap();
    let decision = match kas.client.request(request).await {
        Ok(response) => {
            let status = response.status().as_u16();
            let bytes = http_body_util::BodyExt::collect(response.into_body())
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            match status {
                200 => serde_json::from_slice(&bytes).map_err(|_| 500),
                401 | 403 | 404 => Err(401),
                other => Err(other),
            }
        }
        Err(_) => Err(500),
    };
    if matches!(&decision, Ok(_) | Err(401)) {
        *entry = Some((Instant::now(), decision.clone()));
    }
    decision
}

/// The cluster of the agent's agentk, waiting up to `wait` for it to connect.
async fn wait_for(kas: &Inner, agent: i64) -> Option<String> {
    let mut changes = kas.connected.subscribe();
    let deadline = tokio::time::Instant::now() + *lock(&kas.wait);
    loop {
        if let Some(url) = lock(&kas.agents).get(&agent) {
            return Some(url.clone());
        }
        if tokio::time::timeout_at(deadline, changes.changed())
            .await
            .is_err()
        {
            return None;
        }
    }
}

/// Whom the cluster sees: the agent's ServiceAccount, or the token's user as agentk
/// impersonates them under `access_as: user`.
fn impersonate(headers: &mut HeaderMap, agent: i64, authorization: &Value) {
    let mut add = |name: &str, value: String| {
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(&value).unwrap(),
        );
    };
    let Some(user) = authorization["access_as"].get("user") else {
        add("impersonate-user", AGENT_SERVICE_ACCOUNT.into());
        add("impersonate-group", "system:serviceaccounts".into());
        add(
            "impersonate-group",
            "system:serviceaccounts:gitlab-agent".into(),
        );
        return;
    };
    let username = authorization["user"]["username"]
        .as_str()
        .unwrap_or_default();
    add("impersonate-user", format!("gitlab:user:{username}"));
    add("impersonate-group", "gitlab:user".into());
    for (kind, list) in [("project", &user["projects"]), ("group", &user["groups"])] {
        for entry in list.as_array().into_iter().flatten() {
            for role in entry["roles"].as_array().into_iter().flatten() {
                add(
                    "impersonate-group",
                    format!(
                        "gitlab:{kind}_role:{}:{}",
                        entry["id"],
                        role.as_str().unwrap_or_default()
                    ),
                );
            }
        }
    }
    let config_project = authorization["agent"]["config_project"]["id"].to_string();
    for (key, value) in [
        ("id", agent.to_string()),
        ("username", username.to_owned()),
        ("access_type", "personal_access_token".to_owned()),
        ("config_project_id", config_project),
    ] {
        add(
            &format!("impersonate-extra-agent.gitlab.com%2f{key}"),
            value,
        );
    }
}

/// Removes the hop-by-hop headers, those `Connection` names included.
fn strip(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    for name in named
        .iter()
        .map(String::as_str)
        .chain(HOP_BY_HOP.iter().copied())
    {
        headers.remove(name);
    }
}

/// KAS' own error: a `Status` whose message starts `GitLab Agent Server:`.
fn kas_error(code: StatusCode, message: &str) -> Response {
    let reason = match code.as_u16() {
        400 => "BadRequest",
        401 => "Unauthorized",
        500 => "InternalError",
        _ => "",
    };
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("GitLab Agent Server: {message}"), "reason": reason, "code": code.as_u16()});
    (
        code,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::SERVER, SERVER),
        ],
        body.to_string(),
    )
        .into_response()
}

fn unauthorized(message: &str) -> Response {
    let mut response = kas_error(StatusCode::UNAUTHORIZED, message);
    response
        .headers_mut()
        .insert("gitlab-unauthorized", HeaderValue::from_static("true"));
    response
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whom the cluster sees for an agent with `access_as: agent`: its agentk's ServiceAccount.
pub const AGENT_SERVICE_ACCOUNT: &str = "system:serviceaccount:gitlab-agent:gitlab-agent";

/// The token envlens holds for KAS in [`through_kas`].
pub const ENVLENS_TOKEN: &str = "glpat-envlens-kas-0123456789";
/// Its GitLab user, Developer in each agent's `user_access`.
pub const ENVLENS_USER: (i64, &str) = (50, "envlens-bot");

/// GitLab and KAS in front of `served`, for envlens to reach `agents` (`(agent id, its
/// configuration project)`, `access_as: agent`) through KAS with no `kubernetes.agents` entry.
pub struct ThroughKas {
    pub gitlab: super::gitlab::TestGitLab,
    pub kas: TestKas,
    /// The `gitlab:` section of envlens' configuration (the token in a file under `dir`).
    pub yaml: String,
    /// That file: writing another token there rotates it.
    pub token_file: std::path::PathBuf,
}

/// [`ThroughKas`]: KAS waits 1 s for a disconnected agent; GitLab's metadata names it (17.6).
pub async fn through_kas(
    served: &Served,
    agents: &[(i64, i64)],
    dir: &std::path::Path,
) -> ThroughKas {
    let gitlab = super::gitlab::TestGitLab::start().await;
    let kas = TestKas::start(&gitlab.url, Duration::from_secs(1)).await;
    gitlab.kas.add_token(
        ENVLENS_TOKEN,
        ENVLENS_USER.0,
        ENVLENS_USER.1,
        &["k8s_proxy", "read_api"],
    );
    for &(agent, config_project) in agents {
        kas.connect(agent, served);
        gitlab
            .kas
            .allow(agent, config_project, false, ENVLENS_USER.0, config_project);
    }
    gitlab.kas.set_proxy_url(&kas.proxy_url());
    let token_file = dir.join("kas-token");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(&token_file, format!("{ENVLENS_TOKEN}\n")).unwrap();
    let yaml = format!(
        "gitlab:\n  url: {}\n  kas:\n    token_file: {}\n    metadata_interval: 1s\n",
        gitlab.url,
        token_file.display()
    );
    ThroughKas {
        gitlab,
        kas,
        yaml,
        token_file,
    }
}
