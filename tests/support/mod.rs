//! What the integration tests share: a database per test, the router with known secrets,
//! and tokens minted as GitLab would mint them.

pub mod browser;
pub mod demo;
pub mod environment;
pub mod gitlab;
pub mod gitlab_kas;
pub mod gitlab_rest;
pub mod gitops;
pub mod kas;
pub mod kube_api;
pub mod postgres;
pub mod reach;

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::Router;
use envlens::auth::secrets::{Secret, Secrets};
use envlens::auth::{mint_session, Keys, INTERNAL_HEADER};
use envlens::config::Limits;
use envlens::state::AppState;
use http_body_util::BodyExt;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use sqlx::PgPool;
use tower::ServiceExt;

pub const INTERNAL_KEY: &[u8; 32] = b"internal-key-internal-key-intern";
pub const SESSION_KEY: &[u8; 32] = b"session-key-session-key-session-";
pub const WEBHOOK_TOKEN: &str = "webhook-token";

pub struct TestApp {
    pub router: Router,
    pub db: PgPool,
    /// Dropped with the app, at the test's end.
    _database: Option<postgres::TestDatabase>,
}

pub struct TestResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl TestResponse {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `error.code` of an error answer, after checking the status.
    #[track_caller]
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.text());
        self.json()["error"].clone()
    }
}

/// The cluster connections of `settings` as `serve` makes them: the entries, then GitLab's agent
/// server for every other agent when `gitlab.kas` is configured (SPEC 14).
pub async fn clusters(
    settings: &envlens::config::file::Settings,
) -> envlens::k8s::clusters::Clusters {
    let mut clusters =
        envlens::k8s::clusters::Clusters::load(&settings.kubernetes, Default::default())
            .await
            .expect("test clusters");
    if let Some(gitlab) = &settings.gitlab {
        if let Some(kas) = envlens::k8s::kas::Kas::start(gitlab, Default::default())
            .await
            .expect("test KAS")
        {
            clusters = clusters.with_kas(kas);
        }
    }
    clusters
}

impl TestApp {
    pub async fn new() -> Self {
        Self::with_limits(Limits::default()).await
    }

    pub async fn with_limits(limits: Limits) -> Self {
        let database = postgres::fresh_database().await;
        let state = AppState::new(database.clone(), keys(), limits);
        TestApp {
            router: envlens::app(state),
            db: database.clone(),
            _database: Some(database),
        }
    }

    /// The router over `state`, whose database `db` the caller keeps (its own server, say).
    /// The router of `state`, owning the test database it serves.
    pub fn owning(state: AppState, database: postgres::TestDatabase) -> Self {
        TestApp {
            router: envlens::app(state),
            db: (*database).clone(),
            _database: Some(database),
        }
    }

    pub fn serving(state: AppState, db: PgPool) -> Self {
        TestApp {
            router: envlens::app(state),
            db,
            _database: None,
        }
    }

    /// With a configuration file's settings (cluster connections, CORS).
    pub async fn with_config(yaml: &str) -> Self {
        Self::with_config_then(yaml, |state| state).await
    }

    /// [`TestApp::with_config`], the state then changed by `adjust` (a GitLab beside it, say).
    pub async fn with_config_then(yaml: &str, adjust: impl FnOnce(AppState) -> AppState) -> Self {
        let settings = envlens::config::file::Settings::parse(yaml).expect("test configuration");
        let clusters = clusters(&settings).await;
        let database = postgres::fresh_database().await;
        let health = envlens::resources::health::Customizations::load(
            settings.health.customizations.as_deref(),
            &settings.health.scripts,
        )
        .expect("test health scripts");
        let state = AppState::new(database.clone(), keys(), Limits::default())
            .with_clusters(clusters, settings.cors)
            .with_trusted_proxies(envlens::http::client_address::TrustedProxies::new(
                settings.trusted_proxies.clone(),
            ))
            .with_health(health)
            .with_per_user(settings.per_user);
        let state = adjust(state);
        TestApp {
            router: envlens::app(state),
            db: database.clone(),
            _database: Some(database),
        }
    }

    /// The dashboard page at `path`, as `user_id` signed in to the dashboard: its HTML.
    pub async fn page_as(&self, user_id: i64, path: &str) -> String {
        let res = self.page_response_as(user_id, path).await;
        assert_eq!(res.status, 200, "{}", res.text());
        res.text()
    }

    /// The answer to a GET of the dashboard's `path`, as `user_id` signed in to the dashboard.
    pub async fn page_response_as(&self, user_id: i64, path: &str) -> TestResponse {
        let pool = envlens::db::pool::Pool::from(self.db.clone());
        let cookie = envlens::web::session::begin(&pool, &envlens::web::Site::default(), user_id)
            .await
            .unwrap();
        let cookie = cookie
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        self.send(
            Request::get(path)
                .header(header::COOKIE, cookie)
                .body(Body::empty())
                .unwrap(),
        )
        .await
    }

    /// The value of one series on `/metrics` (0 when absent).
    pub async fn metric(&self, series: &str) -> f64 {
        let text = self
            .send(Request::get("/metrics").body(Body::empty()).unwrap())
            .await
            .text();
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    pub async fn send(&self, req: Request<Body>) -> TestResponse {
        let res = self
            .router
            .clone()
            .oneshot(req)
            .await
            .expect("router is infallible");
        let status = res.status();
        let headers = res.headers().clone();
        let body = res
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
            .to_vec();
        TestResponse {
            status,
            headers,
            body,
        }
    }

    /// An internal API request, signed as GitLab signs it.
    pub async fn internal(&self, method: Method, path: &str, body: &Value) -> TestResponse {
        self.internal_raw(method, path, &internal_token(), body.to_string())
            .await
    }

    pub async fn internal_raw(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: String,
    ) -> TestResponse {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(INTERNAL_HEADER, token)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap();
        self.send(req).await
    }

    /// A system hook as GitLab delivers it.
    pub async fn system_hook(&self, body: &Value) -> TestResponse {
        self.hook("System Hook", body.to_string(), None).await
    }

    pub async fn hook(&self, event: &str, body: String, delivery: Option<&str>) -> TestResponse {
        self.hook_with(WEBHOOK_TOKEN, event, body, delivery).await
    }

    /// A hook as GitLab delivers it with `token` in `X-Gitlab-Token`.
    pub async fn hook_with(
        &self,
        token: &str,
        event: &str,
        body: String,
        delivery: Option<&str>,
    ) -> TestResponse {
        let mut req = Request::post("/webhooks/gitlab")
            .header("X-Gitlab-Token", token)
            .header("X-Gitlab-Event", event)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(id) = delivery {
            req = req.header("X-Gitlab-Event-UUID", id);
        }
        self.send(req.body(Body::from(body)).unwrap()).await
    }

    /// The whole answer to a GraphQL `query` sent as `user` (a session as a bearer token); the
    /// request must be answered 200.
    pub async fn graphql(&self, user: (i64, &str), query: &str) -> Value {
        let (token, _) =
            mint_session(SESSION_KEY, user.0, user.1, Duration::from_secs(600)).unwrap();
        let req = Request::post("/api/graphql")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(
                serde_json::json!({ "query": query }).to_string(),
            ))
            .unwrap();
        let res = self.send(req).await;
        assert_eq!(res.status, 200, "{}", res.text());
        res.json()
    }

    /// A GET with the user's session as a bearer token.
    pub async fn get_as(&self, path: &str, user_id: i64, username: &str) -> TestResponse {
        let (token, _) =
            mint_session(SESSION_KEY, user_id, username, Duration::from_secs(600)).unwrap();
        let req = Request::get(path)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap();
        self.send(req).await
    }

    /// Every row of every table, as text: equal before and after means nothing changed.
    pub async fn fingerprint(&self) -> String {
        let tables = [
            "namespaces",
            "projects",
            "users",
            "members",
            "cluster_agents",
            "agent_ci_access_authorizations",
            "agent_user_access_authorizations",
            "environments",
            "deployments",
            "agent_deployments",
            "deployment_creations",
            "cluster_agent_tokens",
            "webhook_deliveries",
            "web_sessions",
            "sign_in_links",
        ];
        let mut out = String::new();
        for table in tables {
            let rows: Option<String> = sqlx::query_scalar(&format!(
                "SELECT string_agg(t::text, E'\\n' ORDER BY t::text) FROM {table} t"
            ))
            .fetch_one(&self.db)
            .await
            .unwrap();
            out.push_str(&format!("{table}:\n{}\n", rows.unwrap_or_default()));
        }
        out
    }

    /// Rows of a query as JSON values, for compact assertions.
    pub async fn rows(&self, sql: &str) -> Vec<Value> {
        sqlx::query_scalar::<_, Value>(&format!("SELECT to_jsonb(t) FROM ({sql}) t"))
            .fetch_all(&self.db)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }
}

/// The keys of the test secrets above.
pub fn keys() -> Keys {
    Keys::new(Secrets {
        internal: Secret::new(INTERNAL_KEY.to_vec()),
        session: Secret::new(SESSION_KEY.to_vec()),
        webhook_token: Secret::new(WEBHOOK_TOKEN.as_bytes().to_vec()),
        generated: Vec::new(),
    })
}

pub fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A token signed with `key` and `alg` over `claims`.
pub fn sign(claims: &Value, key: &[u8], alg: Algorithm) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, &EncodingKey::from_secret(key)).unwrap()
}

pub fn internal_claims() -> Value {
    json!({ "iss": "gitlab", "aud": "envlens", "iat": now(), "exp": now() + 60 })
}

pub fn internal_token() -> String {
    sign(&internal_claims(), INTERNAL_KEY, Algorithm::HS256)
}
