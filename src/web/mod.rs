//! The dashboard's server side (SPEC 9): who is signed in ([`session`]), signing in
//! ([`sign_in`]), and the pages ([`dashboard`], an agent's in `agent_page`): rendered on the server with `maud` from what
//! the GraphQL schema answers the viewer (`data`), readable without script, kept fresh by a
//! little of it (`assets/dashboard.js`).

mod agent_page;
pub mod assets;
pub mod dashboard;
mod data;
mod graph;
pub mod html;
mod order;
mod pages;
pub mod session;
pub mod sign_in;
mod yaml;

/// The GraphQL document the environment page reads, for comparing the two (benches/dashboard.rs).
pub const ENVIRONMENT_DOCUMENT: &str = data::ENVIRONMENT;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use axum::routing::{get, post};
use axum::Router;

use crate::db::pool::Pool;
use crate::gitlab::oidc::Oidc;
use crate::gitlab::Instance;

/// How long a dashboard session lasts by default (`--session-lifetime`).
pub const DEFAULT_SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// The bounds of `--session-lifetime`: a session that outlives a week is one nobody ends.
pub const MIN_SESSION_LIFETIME: Duration = Duration::from_secs(60);
pub const MAX_SESSION_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where the dashboard is reached, how long its sessions last, and whether GitLab signs users
/// in. Cheap to clone.
#[derive(Clone)]
pub struct Site(Arc<SiteSettings>);

struct SiteSettings {
    /// `--public-url`, without a trailing slash.
    public_url: String,
    secure: bool,
    session_lifetime: Duration,
    /// "Sign in with GitLab", when the configuration names an OAuth application.
    gitlab: Option<Arc<Oidc>>,
}

impl std::fmt::Debug for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Site")
            .field("public_url", &self.0.public_url)
            .field("session_lifetime", &self.0.session_lifetime)
            .field("gitlab", &self.0.gitlab.is_some())
            .finish()
    }
}

impl Site {
    /// `public_url` is `http(s)://host[:port][/prefix]`; the session lifetime within
    /// [`MIN_SESSION_LIFETIME`] and [`MAX_SESSION_LIFETIME`].
    pub fn new(public_url: &str, session_lifetime: Duration) -> anyhow::Result<Self> {
        let parsed = url::Url::parse(public_url)
            .map_err(|e| anyhow::anyhow!("--public-url `{public_url}` is not a URL: {e}"))?;
        let secure = match parsed.scheme() {
            "https" => true,
            "http" => false,
            other => anyhow::bail!("--public-url must be http or https, not {other}"),
        };
        if parsed.host().is_none() || parsed.query().is_some() || parsed.fragment().is_some() {
            anyhow::bail!("--public-url must be a host's address, without query or fragment");
        }
        if !(MIN_SESSION_LIFETIME..=MAX_SESSION_LIFETIME).contains(&session_lifetime) {
            anyhow::bail!(
                "--session-lifetime must be between {}s and {}s",
                MIN_SESSION_LIFETIME.as_secs(),
                MAX_SESSION_LIFETIME.as_secs()
            );
        }
        Ok(Site(Arc::new(SiteSettings {
            public_url: public_url.trim_end_matches('/').to_owned(),
            secure,
            session_lifetime,
            gitlab: None,
        })))
    }

    /// With "Sign in with GitLab" through `oidc`.
    pub fn with_gitlab(self, oidc: Oidc) -> Self {
        Site(Arc::new(SiteSettings {
            public_url: self.0.public_url.clone(),
            secure: self.0.secure,
            session_lifetime: self.0.session_lifetime,
            gitlab: Some(Arc::new(oidc)),
        }))
    }

    /// "Sign in with GitLab", when configured.
    pub fn gitlab(&self) -> Option<&Oidc> {
        self.0.gitlab.as_deref()
    }

    /// e.g. `https://envlens.example.com`, without a trailing slash.
    pub fn public_url(&self) -> &str {
        &self.0.public_url
    }

    /// Whether an `Origin` header names envlens itself (its public URL's scheme, host, port).
    pub fn is_own_origin(&self, origin: &axum::http::HeaderValue) -> bool {
        crate::graphql::Origins::new(Some(&self.0.public_url), [])
            .allow(Some(origin))
            .is_ok()
    }

    /// Whether cookies are `Secure`: the public URL is https.
    pub fn secure(&self) -> bool {
        self.0.secure
    }

    pub fn session_lifetime(&self) -> Duration {
        self.0.session_lifetime
    }
}

impl Default for Site {
    /// The default of `--listen`, as `--public-url` defaults to.
    fn default() -> Self {
        Site::new("http://127.0.0.1:8080", DEFAULT_SESSION_LIFETIME).expect("a valid default")
    }
}

/// The dashboard's routes: its pages, signing in and out.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Pool: FromRef<S>,
    Site: FromRef<S>,
    Arc<crate::auth::Keys>: FromRef<S>,
    Option<Arc<Instance>>: FromRef<S>,
    crate::graphql::Engine: FromRef<S>,
{
    dashboard::routes()
        .route(sign_in::PATH, get(sign_in::page))
        .route(
            "/-/sign-in/link/{token}",
            get(sign_in::link_page).post(sign_in::link),
        )
        .route("/-/sign-in/gitlab", get(sign_in::gitlab))
        .route(sign_in::CALLBACK_PATH, get(sign_in::callback))
        .route(session::SIGN_OUT_PATH, post(session::sign_out))
}
