//! Clusters reached through GitLab's agent server (KAS, SPEC 14): its Kubernetes API proxy
//! routes each request to one agent's agentk, so an agent reaches its own cluster and nowhere
//! else, with no kubeconfig. envlens calls it as `glab` does, with
//! `Authorization: Bearer pat:<agent id>:<token>`.
//!
//! [`Kas`] knows where the proxy is: `gitlab.kas.url`, else GitLab's metadata ([`metadata`]),
//! read again (at most every `metadata_interval`) after a connection failure or a 404 that is
//! not KAS' own, so that a KAS that moved is found without a restart. [`route`] is the layer
//! of each agent's client that sends there and reads KAS' own answers.

pub mod metadata;
mod review;
pub mod route;

use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::http::Uri;

use crate::config::file::GitLabSettings;
use crate::gitlab::api::{GitLab, Policy, Token};
use crate::telemetry::Metrics;

/// The Kubernetes API proxy's base URL, without a trailing `/`: requests go to
/// `<base><Kubernetes API path>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyUrl(Arc<str>);

impl ProxyUrl {
    /// An `http` or `https` URL with a host and no query; `None` otherwise.
    pub fn parse(text: &str) -> Option<ProxyUrl> {
        let text = text.trim().trim_end_matches('/');
        let uri: Uri = text.parse().ok()?;
        let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
        (scheme_ok && uri.authority().is_some() && uri.query().is_none())
            .then(|| ProxyUrl(text.into()))
    }

    /// The URI of a Kubernetes API path (with its query) under the proxy.
    pub fn join(&self, path_and_query: &str) -> Result<Uri, axum::http::uri::InvalidUri> {
        format!("{}{path_and_query}", self.0).parse()
    }
}

impl std::fmt::Display for ProxyUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether, and where, KAS can be used now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    Usable {
        url: ProxyUrl,
        version: Option<String>,
        /// Where the address came from, for messages.
        from: &'static str,
    },
    /// Why not, for the operator and in every answer that needed it.
    Unusable(String),
}

/// GitLab's agent server as envlens uses it: the proxy's address and the token.
pub struct Kas {
    /// The `k8s_proxy` token, trimmed (never logged: [`Kas`]'s `Debug` leaves it out), and
    /// the file it is read from again when KAS refuses it ([`Kas::reread_token`]).
    secret: RwLock<Option<Arc<str>>>,
    secret_file: Option<(std::path::PathBuf, &'static str)>,
    /// GitLab's API, for its metadata.
    gitlab: GitLab,
    /// `gitlab.kas.url`: when set, the metadata is never read.
    fixed: Option<ProxyUrl>,
    reach: RwLock<Reach>,
    interval: Duration,
    last_read: std::sync::Mutex<Option<Instant>>,
    /// Wakes the task that reads the metadata again.
    suspect: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for Kas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kas")
            .field("reach", &self.reach())
            .finish_non_exhaustive()
    }
}

impl Kas {
    /// From `gitlab.kas`, when configured: reads the token files (a file that cannot be read
    /// stops `serve`), finds the proxy and logs what it found or why KAS cannot be used, then
    /// keeps the address current in the background.
    pub async fn start(
        settings: &GitLabSettings,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Option<Arc<Kas>>> {
        let Some(kas) = &settings.kas else {
            return Ok(None);
        };
        let instance_token = match &settings.token_file {
            Some(path) => Some(read_token(path, "gitlab.token_file")?),
            None => None,
        };
        let secret_file = match (&kas.token_file, &settings.token_file) {
            (Some(path), _) => Some((path.clone(), "gitlab.kas.token_file")),
            (None, Some(path)) => Some((path.clone(), "gitlab.token_file")),
            (None, None) => None,
        };
        let secret = match &kas.token_file {
            Some(path) => Some(read_token(path, "gitlab.kas.token_file")?),
            None => instance_token.clone(),
        };
        let policy = Policy {
            attempts: 2,
            timeout: Duration::from_secs(10),
            ..Policy::default()
        };
        let instance_token = instance_token.map(|t| Token::new(&t));
        let kas = Arc::new(Kas {
            secret: RwLock::new(secret),
            secret_file,
            gitlab: GitLab::new(&settings.url, instance_token, metrics, policy)?,
            fixed: kas.url.as_deref().and_then(ProxyUrl::parse),
            reach: RwLock::new(Reach::Unusable("not looked up yet".into())),
            interval: kas.metadata_interval,
            last_read: std::sync::Mutex::new(None),
            suspect: Arc::default(),
        });
        let reach = kas.look_up().await;
        match &reach {
            Reach::Usable { url, version, from } => tracing::info!(
                %url,
                version = version.as_deref().unwrap_or("unknown"),
                from = *from,
                "agents without a kubernetes.agents entry are reached through GitLab's agent server"
            ),
            Reach::Unusable(why) => tracing::warn!(
                reason = %why,
                "GitLab's agent server cannot be used: agents without a kubernetes.agents entry \
                 have no cluster connection until it can"
            ),
        }
        kas.set(reach);
        tokio::spawn(refresh(Arc::downgrade(&kas), kas.suspect.clone()));
        Ok(Some(kas))
    }

    /// Where KAS is now, or why it cannot be used.
    pub fn reach(&self) -> Reach {
        self.reach.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `Bearer pat:<agent>:<token>`, marked sensitive (never logged); `None` without a token.
    pub fn credential(&self, agent: i64) -> Option<axum::http::HeaderValue> {
        let token = self.secret()?;
        let mut value =
            axum::http::HeaderValue::try_from(format!("Bearer pat:{agent}:{token}")).ok()?;
        value.set_sensitive(true);
        Some(value)
    }

    fn secret(&self) -> Option<Arc<str>> {
        self.secret
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// KAS refused the token, or is about to be asked again after it did: the token file is
    /// read again, so that a token rotated in place (a Kubernetes Secret's file is replaced
    /// when the Secret changes) is used without a restart. Called only on those occasions, a
    /// few times a minute at most while an agent's circuit is open, so the file is read each
    /// time rather than watched. A file that cannot be read, or is empty, leaves the token as
    /// it was.
    pub fn reread_token(&self) {
        let Some((path, key)) = &self.secret_file else {
            return;
        };
        let now = match read_token(path, key) {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot read the token for GitLab's agent server again");
                return;
            }
        };
        let mut secret = self.secret.write().unwrap_or_else(|e| e.into_inner());
        if secret.as_deref() != Some(&*now) {
            tracing::info!(file = %path.display(), "{key} holds a new token: it is used from now on");
            *secret = Some(now);
        }
    }

    /// Something answered that is not KAS, or nothing did: the metadata is read again, at
    /// most once per `metadata_interval` (a task waits out the rest of it).
    pub fn suspect(&self) {
        if self.fixed.is_none() && self.secret().is_some() {
            self.suspect.notify_one();
        }
    }

    fn set(&self, reach: Reach) {
        *self.reach.write().unwrap_or_else(|e| e.into_inner()) = reach;
    }

    /// The address from the configuration, else from the metadata.
    async fn look_up(&self) -> Reach {
        let Some(secret) = self.secret() else {
            return Reach::Unusable(
                "no token: gitlab.kas.token_file (or gitlab.token_file) must hold a token with \
                 the k8s_proxy scope"
                    .into(),
            );
        };
        if let Some(url) = &self.fixed {
            return Reach::Usable {
                url: url.clone(),
                version: None,
                from: "gitlab.kas.url",
            };
        }
        *self.last_read.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        const ENDPOINT: &str = "/metadata";
        let path = "/api/v4/metadata";
        // The instance's token reads it (`read_api`); without one, the KAS token does.
        let answer = if self.gitlab.has_token() {
            self.gitlab.get_raw(ENDPOINT, path, None).await
        } else {
            self.gitlab
                .get_as::<serde_json::Value>(ENDPOINT, path, &Token::new(&secret), None)
                .await
                .map(|v| Some(v.to_string().into()))
        };
        match answer {
            Ok(Some(body)) => match metadata::proxy_address(&body) {
                Ok(found) => Reach::Usable {
                    url: found.url,
                    version: found.version,
                    from: if found.derived {
                        "GitLab's metadata (kas.externalUrl)"
                    } else {
                        "GitLab's metadata (kas.externalK8sProxyUrl)"
                    },
                },
                Err(why) => Reach::Unusable(why),
            },
            Ok(None) => Reach::Unusable(format!(
                "{}{path} answered 404 (GitLab before 15.2?): set gitlab.kas.url",
                self.gitlab.base()
            )),
            Err(e) => Reach::Unusable(format!("cannot read GitLab's metadata: {e}")),
        }
    }
}

/// A token from its file, trimmed; `key` names the setting in messages.
fn read_token(path: &std::path::Path, key: &str) -> anyhow::Result<Arc<str>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {key} {}", path.display()))?;
    anyhow::ensure!(!text.trim().is_empty(), "{key} {} is empty", path.display());
    Ok(text.trim().into())
}

/// Reads the metadata again each time [`Kas::suspect`] is called, no sooner than
/// `metadata_interval` after the last read; ends once the [`Kas`] is gone.
async fn refresh(kas: Weak<Kas>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let woken = tokio::time::timeout(Duration::from_secs(600), wake.notified()).await;
        let Some(strong) = kas.upgrade() else { return };
        if woken.is_err() {
            continue;
        }
        let last = *strong.last_read.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(wait) = last.and_then(|at| strong.interval.checked_sub(at.elapsed())) {
            drop(strong);
            tokio::time::sleep(wait).await;
        }
        let Some(strong) = kas.upgrade() else { return };
        let before = strong.reach();
        let now = strong.look_up().await;
        if now != before {
            match &now {
                Reach::Usable { url, version, from } => tracing::info!(
                    %url,
                    version = version.as_deref().unwrap_or("unknown"),
                    from = *from,
                    "GitLab's agent server found at a new address"
                ),
                Reach::Unusable(why) => {
                    tracing::warn!(reason = %why, "GitLab's agent server cannot be used")
                }
            }
        }
        strong.set(now);
    }
}
