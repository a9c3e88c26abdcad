//! envlens: which cluster agent and namespace each GitLab deployment went to, and the live
//! Kubernetes resources behind an environment. `ARCHITECTURE.md` maps the modules.

pub mod allocator;
pub mod auth;
pub mod cli;
pub mod config;
pub mod db;
pub mod demo;
pub mod error;
pub mod gitlab;
pub mod gitops;
pub mod graphql;
pub mod history;
pub mod http;
pub mod ingest;
pub mod k8s;
pub mod pull;
pub mod replicas;
pub mod resources;
pub mod state;
pub mod telemetry;
pub mod web;

use std::future::Future;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::routing::{any, get, post, put};
use axum::Json;
use axum::Router;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::error::Error;
use crate::graphql::explorer;
use crate::state::AppState;

/// Every route, with its middleware. Tests drive this without a socket.
pub fn app(state: AppState) -> Router {
    let api = Router::new()
        .route(
            "/api/v4/internal/identity",
            put(crate::ingest::identity::put_snapshot),
        )
        .route(
            "/api/v4/internal/kubernetes/agents/{id}",
            put(crate::ingest::agents::put_agent),
        )
        .route(
            "/api/v4/internal/kubernetes/agents/{id}/tokens",
            put(crate::ingest::agents::put_tokens),
        )
        .route(
            "/api/v4/internal/kubernetes/agent_configuration",
            post(crate::ingest::agents::post_configuration),
        )
        .route(
            "/api/v4/internal/deployments",
            post(crate::ingest::deployments::create),
        )
        .route(
            "/api/v4/ci/deployments",
            post(ingest::ci_deployments::create),
        )
        .route("/webhooks/gitlab", post(crate::ingest::hooks::receive))
        .route("/api/user", get(current_user))
        .route(
            "/api/graphql",
            post(crate::graphql::execute).get(crate::graphql::subscribe),
        )
        .layer(http::middleware::TimeoutLayer(state.limits.request_timeout));
    // Streams run for as long as the client stays: no request timeout here.
    let proxy = Router::new()
        .route("/k8s-proxy/{*path}", any(crate::k8s::proxy::forward))
        // GitLab's watch API (SPEC 8.3): not a Kubernetes path, so never the cluster's.
        .route("/k8s-proxy/watch", get(crate::k8s::watch_api::watch));
    let mut router = Router::new()
        .merge(api)
        .merge(proxy)
        .merge(http::ops::routes())
        .merge(web::routes())
        .route(explorer::PATH, get(explorer::page))
        .route(explorer::SCRIPT_PATH, get(explorer::script))
        .route(explorer::STYLE_PATH, get(explorer::style))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.limits.body_limit));
    if let Some(cors) = cors(&state.cors) {
        router = router.layer(cors);
    }
    let observed = http::middleware::Observed {
        metrics: state.metrics.clone(),
        trusted_proxies: state.trusted_proxies.clone(),
    };
    router.layer(observed).with_state(state)
}

/// The configured origins may call envlens with the user's cookie; preflights are answered
/// before any credential check, as browsers send them without credentials.
fn cors(settings: &crate::config::file::CorsSettings) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
    if settings.allowed_origins.is_empty() {
        return None;
    }
    let origins = settings
        .allowed_origins
        .iter()
        .filter_map(|o| o.trim_end_matches('/').parse().ok());
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_credentials(true)
            .allow_methods([
                Method::GET,
                Method::HEAD,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
                Method::OPTIONS,
            ])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([
                axum::http::HeaderName::from_static("gitlab-unauthorized"),
                axum::http::header::CONTENT_TYPE,
            ])
            .max_age(Duration::from_secs(3600)),
    )
}

/// The signed-in user, so that a frontend or script can check its session.
async fn current_user(user: crate::auth::CurrentUser) -> Json<Value> {
    Json(json!({ "id": user.id, "username": user.username, "admin": user.admin }))
}

async fn not_found(method: Method, uri: Uri) -> Error {
    Error::NotFound(format!("no route for {method} {}", uri.path()))
}

/// Serves until `shutdown` resolves, then lets the requests in flight finish for at most
/// `drain` before returning. Connections are bounded as `http::server` says.
pub async fn run(
    state: AppState,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    drain: Duration,
) -> std::io::Result<()> {
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let (limits, metrics) = (state.limits.connections, state.metrics.clone());
    let live = state.live.clone();
    let server = http::server::serve(
        listener,
        http::server::Listener::Public,
        app(state),
        limits,
        metrics,
        async move {
            shutdown.await;
            // Upgraded sockets are no requests in flight: they are told to go at once.
            live.close();
            let _ = stopping_tx.send(());
        },
    );
    tokio::pin!(server);
    tokio::select! {
        () = &mut server => return Ok(()),
        _ = stopping_rx => {}
    }
    if tokio::time::timeout(drain, server).await.is_err() {
        tracing::warn!(
            ?drain,
            "requests still in flight after the drain timeout; exiting anyway"
        );
    }
    Ok(())
}
