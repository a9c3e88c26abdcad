//! The test GitLab's side of its agent server: `GET /api/v4/metadata` (`doc/api/metadata.md`,
//! both the 17.6 shape with `kas.externalK8sProxyUrl` and the 17.5 one without), and the
//! internal call KAS makes for every new `pat:` credential,
//! `POST /api/v4/internal/kubernetes/authorize_proxy_user` (GitLab's
//! `lib/api/internal/kubernetes.rb`): the token must be active and carry `k8s_proxy`, and its
//! user must pass the agent's `user_access`; the answer names the agent, the user and
//! `access_as` (`{agent: {}}` or `{user: {projects, groups}}` with the user's roles), as KAS
//! reads it. Refusals are 401/403/404, which KAS turns into its own 401.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

/// The secret KAS and GitLab share (`gitlab_kas['api_secret_key']`); KAS signs a JWT with it
/// in `Gitlab-Kas-Api-Request` (here, the secret itself stands for that JWT).
pub const KAS_API_SECRET: &str = "kas-api-secret-for-tests";

/// A token GitLab knows, as `personal_access_tokens/self` would describe it.
#[derive(Clone, Debug)]
pub struct ProxyToken {
    pub user_id: i64,
    pub username: String,
    pub scopes: Vec<String>,
    pub active: bool,
}

/// Authorized projects or groups with the user's roles in each: `(id, roles)`.
pub type Roles = Vec<(i64, Vec<String>)>;

/// An agent's `user_access` as GitLab evaluates it: who passes, with which roles on which
/// authorized projects and groups.
#[derive(Clone, Debug, Default)]
pub struct AgentAccess {
    pub config_project_id: i64,
    /// `true` for `access_as: {user: {}}`; else the agent's identity.
    pub as_user: bool,
    /// user id → (projects, groups), each `(id, roles)`.
    pub users: HashMap<i64, (Roles, Roles)>,
}

#[derive(Clone, Default)]
pub struct KasSide {
    pub metadata: Arc<Mutex<Value>>,
    pub tokens: Arc<Mutex<HashMap<String, ProxyToken>>>,
    pub agents: Arc<Mutex<HashMap<i64, AgentAccess>>>,
    /// Every `authorize_proxy_user` call, as `(agent id, token)`.
    pub authorizations: Arc<Mutex<Vec<(i64, String)>>>,
    /// Every metadata read.
    pub metadata_reads: Arc<std::sync::atomic::AtomicUsize>,
}

impl KasSide {
    /// GitLab 17.6 or later: the proxy's address in `externalK8sProxyUrl`.
    pub fn set_proxy_url(&self, proxy_url: &str) {
        let external = proxy_url
            .trim_end_matches("/k8s-proxy")
            .replacen("http", "ws", 1);
        *self.metadata.lock().unwrap() = json!({
            "version": "17.6.0", "revision": "c401a659d0c", "enterprise": false,
            "kas": {"enabled": true, "externalUrl": external,
                    "externalK8sProxyUrl": proxy_url, "version": "17.6.0"}});
    }

    /// GitLab 17.5: only the agents' address, `ws(s)://`, from which the proxy is derived.
    pub fn set_external_url_only(&self, external_url: &str) {
        *self.metadata.lock().unwrap() = json!({
            "version": "17.5.3", "revision": "4f1e2a6c8b3", "enterprise": false,
            "kas": {"enabled": true, "externalUrl": external_url, "version": "17.5.3"}});
    }

    pub fn add_token(&self, token: &str, user_id: i64, username: &str, scopes: &[&str]) {
        self.tokens.lock().unwrap().insert(
            token.to_owned(),
            ProxyToken {
                user_id,
                username: username.to_owned(),
                scopes: scopes.iter().map(|s| s.to_string()).collect(),
                active: true,
            },
        );
    }

    pub fn revoke(&self, token: &str) {
        if let Some(t) = self.tokens.lock().unwrap().get_mut(token) {
            t.active = false;
        }
    }

    /// `user` passes `agent`'s `user_access` as Developer of project `project`.
    pub fn allow(
        &self,
        agent: i64,
        config_project_id: i64,
        as_user: bool,
        user: i64,
        project: i64,
    ) {
        let mut agents = self.agents.lock().unwrap();
        let access = agents.entry(agent).or_default();
        access.config_project_id = config_project_id;
        access.as_user = as_user;
        let roles = ["guest", "planner", "reporter", "developer"]
            .map(String::from)
            .to_vec();
        access
            .users
            .insert(user, (vec![(project, roles)], Vec::new()));
    }

    pub fn routes(&self) -> Router {
        Router::new()
            .route("/api/v4/metadata", get(metadata))
            .route(
                "/api/v4/internal/kubernetes/authorize_proxy_user",
                post(authorize_proxy_user),
            )
            .with_state(self.clone())
    }
}

/// Any token GitLab accepts reads the metadata (the instance's `read_api` token, or a KAS
/// token).
async fn metadata(State(side): State<KasSide>, headers: HeaderMap) -> Response {
    side.metadata_reads
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let private = headers.get("private-token").and_then(|v| v.to_str().ok());
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let known = private == Some(super::gitlab_rest::API_TOKEN)
        || bearer.is_some_and(|t| side.tokens.lock().unwrap().get(t).is_some_and(|t| t.active));
    if !known {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"message": "401 Unauthorized"})),
        )
            .into_response();
    }
    Json(side.metadata.lock().unwrap().clone()).into_response()
}

async fn authorize_proxy_user(
    State(side): State<KasSide>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let from_kas = headers
        .get("gitlab-kas-api-request")
        .and_then(|v| v.to_str().ok())
        == Some(KAS_API_SECRET);
    if !from_kas {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"message": "401 Unauthorized"})),
        )
            .into_response();
    }
    let agent_id = body["agent_id"].as_i64().unwrap_or(0);
    let key = body["access_key"].as_str().unwrap_or_default().to_owned();
    side.authorizations
        .lock()
        .unwrap()
        .push((agent_id, key.clone()));
    if body["access_type"] != "personal_access_token" {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"message": "400 Bad request"})),
        )
            .into_response();
    }
    let token = side.tokens.lock().unwrap().get(&key).cloned();
    let Some(token) = token.filter(|t| t.active) else {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"message": "401 Unauthorized"})),
        )
            .into_response();
    };
    if !token.scopes.iter().any(|s| s == "k8s_proxy") {
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"message": "403 Forbidden - insufficient scope"})),
        )
            .into_response();
    }
    let access = side.agents.lock().unwrap().get(&agent_id).cloned();
    let Some(access) = access else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"message": "404 Not found"})),
        )
            .into_response();
    };
    let Some((projects, groups)) = access.users.get(&token.user_id) else {
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"message": "403 Forbidden"})),
        )
            .into_response();
    };
    let entries = |list: &Roles| {
        list.iter()
            .map(|(id, roles)| json!({"id": id, "roles": roles}))
            .collect::<Vec<_>>()
    };
    let access_as = if access.as_user {
        json!({"user": {"projects": entries(projects), "groups": entries(groups)}})
    } else {
        json!({"agent": {}})
    };
    Json(json!({
        "agent": {"id": agent_id, "config_project": {"id": access.config_project_id}},
        "user": {"id": token.user_id, "username": token.username},
        "access_as": access_as,
    }))
    .into_response()
}
