//! The configuration file (`--config`, YAML): cluster connections per agent (SPEC section 6),
//! the Kubernetes proxy's timeouts, and the browser origins allowed by CORS.
//!
//! ```yaml
//! kubernetes:
//!   kubeconfig: /etc/envlens/kubeconfig   # of entries with a context and no kubeconfig; default: KUBECONFIG, ~/.kube/config
//!   connect_timeout: 5s
//!   response_timeout: 30s                 # until the cluster's first byte; streams then run free
//!   access_cache: 5s                      # how long a user_access decision is reused
//!   cache_idle: 10m                       # a namespace's watches stop after this long unread
//!   cache_max_objects: 200000             # past it, the namespace read least recently is dropped; 0: no cache
//!   health_budget_objects: 100000         # resources of the groups whose health is kept current (SPEC 18)
//!   agents:
//!     - agent: 7                          # an agent id ...
//!       context: production
//!     - agent: group/project:my-agent     # ... or `<configuration project path>:<agent name>`
//!       context: staging
//!       kubeconfig: /etc/envlens/staging  # this entry's own kubeconfig
//!     - agent: 9
//!       in_cluster: true                  # the pod's own service account
//!   # An agent without an entry has no cluster connection: no default, no current context.
//!   own_namespace: envlens               # whose Secrets are never proxied; default: POD_NAMESPACE
//! cors:
//!   allowed_origins: [https://gitlab.example.com]
//! health:                                 # Lua health scripts in Argo CD's format (SPEC 11)
//!   customizations: /etc/envlens/resource_customizations   # <group>/<Kind>/health.lua
//!   scripts:                              # inline, keyed as in argocd-cm
//!     cert-manager.io_Certificate: |
//!       return {status = "Healthy"}
//! trusted_proxies: [10.0.0.0/8]           # peers whose X-Forwarded-For names the client (none by default)
//! history:                                # deployment history (SPEC 10)
//!   settle_timeout: 10m                   # the second snapshot at the latest this long after the first
//!   keep_per_environment: 100             # deployments per environment that keep snapshots
//!   events_keep: 30d                      # how long envlens' own timeline events are kept (SPEC 17)
//! ```
//!
//! Unknown keys are refused, so that a typo does not silently leave a cluster unconfigured.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Deserializer};

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    #[serde(default)]
    pub kubernetes: KubernetesSettings,
    #[serde(default)]
    pub cors: CorsSettings,
    /// The GitLab instance envlens runs beside (SPEC 12).
    #[serde(default)]
    pub gitlab: Option<GitLabSettings>,
    #[serde(default)]
    pub health: HealthSettings,
    #[serde(default)]
    pub history: HistorySettings,
    /// The reverse proxies (addresses or ranges) in front of envlens: from a peer among them,
    /// the client's address is taken from `X-Forwarded-For` (its rightmost address that is not
    /// such a proxy); from any other peer, the connection's address is the client's. It bounds
    /// what one client may cost (SPEC 13), so list only proxies that set the header themselves.
    #[serde(default)]
    pub trusted_proxies: Vec<crate::config::cidr::Cidr>,
    #[serde(default)]
    pub per_user: PerUserLimits,
}

/// What one person may hold open at once, across every replica (SPEC 13, "Bounded per person"):
///
/// ```yaml
/// per_user:
///   watch_sockets: 20   # GitLab's watch API (`/k8s-proxy/watch`); beyond: 429
///   subscriptions: 100  # GraphQL subscriptions, over any number of sockets; beyond: an error
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerUserLimits {
    #[serde(default = "default_watch_sockets")]
    pub watch_sockets: usize,
    #[serde(default = "default_subscriptions")]
    pub subscriptions: usize,
}

impl Default for PerUserLimits {
    fn default() -> Self {
        PerUserLimits {
            watch_sockets: default_watch_sockets(),
            subscriptions: default_subscriptions(),
        }
    }
}

fn default_watch_sockets() -> usize {
    20
}

fn default_subscriptions() -> usize {
    100
}

/// The deployment history's snapshots (SPEC 10; `crate::history::worker`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistorySettings {
    /// How long after the first snapshot the rollout may stay PROGRESSING before the second
    /// snapshot is taken anyway.
    #[serde(default = "default_settle_timeout", deserialize_with = "duration")]
    pub settle_timeout: Duration,
    /// How often a settling rollout's group is looked at (from the watch cache).
    #[serde(default = "default_settle_poll", deserialize_with = "duration")]
    pub settle_poll: Duration,
    /// The first wait before a snapshot is tried again after the cluster could not be read;
    /// doubled at each attempt, up to five minutes.
    #[serde(default = "default_retry_backoff", deserialize_with = "duration")]
    pub retry_backoff: Duration,
    /// Deployments per environment that keep their snapshots (the newest).
    #[serde(default = "default_keep_per_environment")]
    pub keep_per_environment: u32,
    /// How long envlens' own events of an environment's timeline (deployments, health
    /// changes; SPEC 17) are kept.
    #[serde(default = "default_events_keep", deserialize_with = "duration")]
    pub events_keep: Duration,
}

impl Default for HistorySettings {
    fn default() -> Self {
        HistorySettings {
            settle_timeout: default_settle_timeout(),
            settle_poll: default_settle_poll(),
            retry_backoff: default_retry_backoff(),
            keep_per_environment: default_keep_per_environment(),
            events_keep: default_events_keep(),
        }
    }
}

fn default_events_keep() -> Duration {
    Duration::from_secs(30 * 24 * 3600)
}

fn default_settle_timeout() -> Duration {
    Duration::from_secs(600)
}

fn default_settle_poll() -> Duration {
    Duration::from_secs(5)
}

fn default_retry_backoff() -> Duration {
    Duration::from_secs(5)
}

fn default_keep_per_environment() -> u32 {
    100
}

/// ```yaml
/// gitlab:
///   url: https://gitlab.example.com     # its address, as it writes it into ID tokens' `iss`
///   token_file: /etc/envlens/gitlab-token # a `read_api` token, for the sync (optional)
///   token_cache: 60s                      # how long GitLab's word on a user's token holds
///   client_id: 0123abcd...                # "Sign in with GitLab": the OAuth application's id
///   client_secret_file: /etc/envlens/gitlab-client-secret  # and its secret (optional: PKCE)
///   groups: [acme]                        # the top-level groups to sync; all with an admin's token
///   sync_interval: 1h                     # `serve` syncs this often (0s: never)
///   sync_max_projects: 10000              # a pass refuses to read more (a bound on its cost)
///   sync_timeout: 30m                     # a pass that takes longer stops, removing nothing
///   webhooks:                             # group webhooks' own tokens (SPEC 13), for their Owners
///     - group: acme/team-b                # events under this token may change only acme/team-b
///       token_file: /etc/envlens/webhook-token-team-b   # and what is below it
///   kas:                                  # every agent without a kubernetes.agents entry, through GitLab's agent server (SPEC 14)
///     token_file: /etc/envlens/kas-token  # a `k8s_proxy` token; default: gitlab.token_file's
///     url: https://kas.example.com/k8s-proxy  # the Kubernetes API proxy; default: from /api/v4/metadata
///     metadata_interval: 1m               # the metadata is read again at most this often
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitLabSettings {
    pub url: String,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// How long GitLab's answer about a user's token is reused (SPEC 12.4).
    #[serde(default = "default_token_cache", deserialize_with = "duration")]
    pub token_cache: Duration,
    /// The OAuth application of "Sign in with GitLab" (SPEC 9): its id, with the scopes
    /// `openid read_user` and the redirect URI `<public url>/-/auth/gitlab/callback`.
    #[serde(default)]
    pub client_id: Option<String>,
    /// A file holding the application's secret; none for an application that is not
    /// confidential.
    #[serde(default)]
    pub client_secret_file: Option<PathBuf>,
    /// The top-level groups whose groups, projects, members, agents and environments the
    /// sync reads (SPEC 12.3); empty: every group the token sees (an administrator's).
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default = "default_sync_interval", deserialize_with = "duration")]
    pub sync_interval: Duration,
    #[serde(default = "default_sync_max_projects")]
    pub sync_max_projects: usize,
    #[serde(default = "default_sync_timeout", deserialize_with = "duration")]
    pub sync_timeout: Duration,
    /// Group webhooks with a token of their own: an event under one may change only that
    /// group's subtree. The instance's token (`--webhook-token-file`) stays trusted for all.
    #[serde(default)]
    pub webhooks: Vec<GroupWebhookSettings>,
    /// GitLab's agent server: every agent without an entry under `kubernetes.agents` is
    /// reached through its Kubernetes API proxy (SPEC 14).
    #[serde(default)]
    pub kas: Option<KasSettings>,
}

/// A group webhook's token, given to that group's Owners to configure their webhook with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupWebhookSettings {
    /// The group's full path, as GitLab shows it.
    pub group: String,
    /// A file holding the token, as `--webhook-token-file` does.
    pub token_file: PathBuf,
}

/// How envlens reaches clusters through GitLab's agent server (KAS), as `glab` does: the
/// Kubernetes API proxy, with `Authorization: Bearer pat:<agent id>:<token>`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KasSettings {
    /// A personal, project or group access token with the `k8s_proxy` scope, whose user is
    /// Developer or more in each agent's `user_access`; default: `gitlab.token_file`'s token.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The Kubernetes API proxy's URL (ending `/k8s-proxy`); default: from GitLab's
    /// `/api/v4/metadata`.
    #[serde(default)]
    pub url: Option<String>,
    /// The shortest time between two reads of the metadata (after a connection failure, or a
    /// 404 that is not KAS' own).
    #[serde(default = "default_metadata_interval", deserialize_with = "duration")]
    pub metadata_interval: Duration,
}

fn default_metadata_interval() -> Duration {
    Duration::from_secs(60)
}

fn default_token_cache() -> Duration {
    Duration::from_secs(60)
}

fn default_sync_interval() -> Duration {
    Duration::from_secs(3600)
}

fn default_sync_max_projects() -> usize {
    10_000
}

fn default_sync_timeout() -> Duration {
    Duration::from_secs(1800)
}

/// The user's Lua health scripts (SPEC 11), compiled at start-up by
/// [`crate::resources::health::Customizations::load`].
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthSettings {
    /// A folder laid out as Argo CD's `resource_customizations`.
    pub customizations: Option<PathBuf>,
    /// Inline scripts keyed `<group>_<Kind>` (or `<Kind>` for the core group), as in `argocd-cm`.
    #[serde(default)]
    pub scripts: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSettings {
    /// The kubeconfig of entries that name a `context` without a `kubeconfig` of their own.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// How long connecting to a cluster may take before the proxy answers 502.
    #[serde(default = "default_connect_timeout", deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// How long a cluster may take to start answering. Watches and followed logs then stream
    /// for as long as the client stays.
    #[serde(default = "default_response_timeout", deserialize_with = "duration")]
    pub response_timeout: Duration,
    /// How long a `user_access` decision is reused for the same user and agent.
    #[serde(default = "default_access_cache", deserialize_with = "duration")]
    pub access_cache: Duration,
    /// How long the watch cache keeps a namespace's watches with no reader (SPEC 8.1).
    #[serde(default = "default_cache_idle", deserialize_with = "duration")]
    pub cache_idle: Duration,
    /// The most objects the watch cache holds per cluster connection.
    #[serde(default = "default_cache_max_objects")]
    pub cache_max_objects: usize,
    /// The most resources, across every environment's group, whose health the keeper keeps
    /// current (SPEC 18); past it, the least recently viewed groups are not kept.
    #[serde(default = "default_health_budget_objects")]
    pub health_budget_objects: usize,
    #[serde(default)]
    pub agents: Vec<AgentCluster>,
    /// The namespace envlens runs in, whose Secrets the proxy never forwards (SPEC 13);
    /// default: the `POD_NAMESPACE` environment variable (the chart sets it).
    #[serde(default)]
    pub own_namespace: Option<String>,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        KubernetesSettings {
            kubeconfig: None,
            connect_timeout: default_connect_timeout(),
            response_timeout: default_response_timeout(),
            access_cache: default_access_cache(),
            cache_idle: default_cache_idle(),
            cache_max_objects: default_cache_max_objects(),
            health_budget_objects: default_health_budget_objects(),
            agents: Vec::new(),
            own_namespace: None,
        }
    }
}

/// How one agent's cluster is reached: a context of a kubeconfig, or the pod's own service
/// account. Exactly one of `context` and `in_cluster` (SPEC 6): a kubeconfig's current context
/// is never used for an agent that does not name it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentCluster {
    pub agent: AgentRef,
    /// A context of the entry's kubeconfig (else `kubernetes.kubeconfig`, else the default one).
    #[serde(default)]
    pub context: Option<String>,
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// The pod's own service account (envlens runs in the agent's cluster).
    #[serde(default)]
    pub in_cluster: bool,
}

impl AgentCluster {
    /// Where the entry leads, for messages.
    pub fn target(&self) -> String {
        match &self.context {
            Some(context) => format!("context \"{context}\""),
            None => "in_cluster".to_owned(),
        }
    }
}

/// An agent named by id, or by `<configuration project full path>:<agent name>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AgentRef {
    Id(i64),
    /// Lower-cased, as paths are matched case-insensitively.
    Path(String),
}

impl AgentRef {
    pub fn path(project_full_path: &str, name: &str) -> Self {
        AgentRef::Path(format!("{project_full_path}:{name}").to_lowercase())
    }
}

impl std::fmt::Display for AgentRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentRef::Id(id) => write!(f, "agent {id}"),
            AgentRef::Path(path) => write!(f, "agent {path}"),
        }
    }
}

impl<'de> Deserialize<'de> for AgentRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Id(i64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Id(id) if id > 0 => Ok(AgentRef::Id(id)),
            Raw::Id(id) => Err(serde::de::Error::custom(format!(
                "agent id {id} must be positive"
            ))),
            Raw::Text(text) => {
                let text = text.trim();
                if let Ok(id) = text.parse::<i64>() {
                    return Ok(AgentRef::Id(id));
                }
                match text.rsplit_once(':') {
                    Some((project, name)) if !project.is_empty() && !name.is_empty() => {
                        Ok(AgentRef::path(project, name))
                    }
                    _ => Err(serde::de::Error::custom(format!(
                        "`{text}` is neither an agent id nor `<project path>:<agent name>`"
                    ))),
                }
            }
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CorsSettings {
    /// Origins such as `https://gitlab.example.com` whose pages may call envlens with the
    /// user's cookie. None by default: browsers then allow only same-origin calls.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_access_cache() -> Duration {
    Duration::from_secs(5)
}

fn default_cache_idle() -> Duration {
    Duration::from_secs(600)
}

fn default_cache_max_objects() -> usize {
    200_000
}

fn default_health_budget_objects() -> usize {
    100_000
}

fn default_response_timeout() -> Duration {
    Duration::from_secs(30)
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    crate::config::parse_duration(&text).map_err(serde::de::Error::custom)
}

impl Settings {
    /// Reads the file; every problem names the file, and the line where there is one.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the configuration file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("configuration file {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Self> {
        if text.trim().is_empty() {
            return Ok(Settings::default());
        }
        let settings: Settings =
            serde_saphyr::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> anyhow::Result<()> {
        let mut seen = std::collections::HashSet::new();
        for entry in &self.kubernetes.agents {
            anyhow::ensure!(
                seen.insert(&entry.agent),
                "{} has more than one entry under kubernetes.agents",
                entry.agent
            );
            match (&entry.context, entry.in_cluster) {
                (Some(_), false) => {}
                (None, true) => anyhow::ensure!(
                    entry.kubeconfig.is_none(),
                    "kubernetes.agents: {} has both in_cluster and a kubeconfig",
                    entry.agent
                ),
                (Some(_), true) => anyhow::bail!(
                    "kubernetes.agents: {} has both a context and in_cluster: name one",
                    entry.agent
                ),
                (None, false) => anyhow::bail!(
                    "kubernetes.agents: {} names no cluster: give it a `context` of a kubeconfig, \
                     or `in_cluster: true` for envlens' own service account",
                    entry.agent
                ),
            }
        }
        if let Some(kas) = self.gitlab.as_ref().and_then(|g| g.kas.as_ref()) {
            if let Some(url) = &kas.url {
                let uri = url.trim().parse::<axum::http::Uri>().ok();
                let valid = uri.is_some_and(|u| {
                    matches!(u.scheme_str(), Some("http" | "https"))
                        && u.authority().is_some()
                        && u.query().is_none()
                });
                anyhow::ensure!(
                    valid,
                    "gitlab.kas.url: `{url}` is not an http(s) URL like https://kas.example.com/k8s-proxy"
                );
            }
            anyhow::ensure!(
                !kas.metadata_interval.is_zero(),
                "gitlab.kas.metadata_interval must be longer than zero"
            );
        }
        anyhow::ensure!(
            self.history.keep_per_environment >= 1,
            "history.keep_per_environment must be at least 1"
        );
        anyhow::ensure!(
            !self.history.settle_poll.is_zero()
                && !self.history.retry_backoff.is_zero()
                && !self.history.events_keep.is_zero(),
            "history.settle_poll, history.retry_backoff and history.events_keep must be longer than zero"
        );
        let mut groups = std::collections::HashSet::new();
        for hook in self.gitlab.iter().flat_map(|g| &g.webhooks) {
            let path = hook.group.trim_matches('/');
            anyhow::ensure!(
                !path.is_empty() && !path.split('/').any(str::is_empty) && path == hook.group,
                "gitlab.webhooks: `{}` is not a group's full path like acme/team",
                hook.group
            );
            anyhow::ensure!(
                groups.insert(path.to_lowercase()),
                "gitlab.webhooks: group {} has more than one entry",
                hook.group
            );
        }
        for origin in &self.cors.allowed_origins {
            let valid = (origin.starts_with("https://") || origin.starts_with("http://"))
                && !origin.trim_end_matches('/').contains(['*', ' '])
                && axum::http::HeaderValue::from_str(origin).is_ok();
            anyhow::ensure!(
                valid,
                "cors.allowed_origins: `{origin}` is not an origin like https://gitlab.example.com"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_documented_example() {
        let s = Settings::parse(
            "kubernetes:\n  connect_timeout: 2s\n  agents:\n    - agent: 7\n      context: prod\n    - agent: Group/Project:My-Agent\n      context: staging\n      kubeconfig: /tmp/k\n    - agent: \"8\"\n      in_cluster: true\ncors:\n  allowed_origins: [https://gitlab.example.com]\n",
        )
        .unwrap();
        let agents = &s.kubernetes.agents;
        assert_eq!(agents[0].agent, AgentRef::Id(7));
        assert_eq!(agents[0].context.as_deref(), Some("prod"));
        assert_eq!(
            agents[1].agent,
            AgentRef::Path("group/project:my-agent".into())
        );
        assert_eq!(agents[1].kubeconfig.as_deref(), Some(Path::new("/tmp/k")));
        assert_eq!(agents[2].agent, AgentRef::Id(8));
        assert!(agents[2].in_cluster && !agents[0].in_cluster);
        assert_eq!(s.kubernetes.connect_timeout, Duration::from_secs(2));
        assert_eq!(s.kubernetes.response_timeout, Duration::from_secs(30));
        assert_eq!(s.cors.allowed_origins, ["https://gitlab.example.com"]);
        let s = Settings::parse("trusted_proxies: [10.0.0.0/8, \"::1\"]\n").unwrap();
        assert_eq!(s.trusted_proxies.len(), 2);
    }

    #[test]
    fn reads_group_webhooks() {
        let s = Settings::parse(
            "gitlab:\n  url: https://gitlab.example.com\n  webhooks:\n    - group: acme/team-b\n      token_file: /etc/envlens/b\n",
        )
        .unwrap();
        let hooks = &s.gitlab.unwrap().webhooks;
        assert_eq!(hooks[0].group, "acme/team-b");
        assert_eq!(hooks[0].token_file, Path::new("/etc/envlens/b"));
    }

    #[test]
    fn empty_file_is_the_defaults() {
        let s = Settings::parse("# nothing yet\n").unwrap();
        assert!(s.kubernetes.agents.is_empty());
        assert!(s.cors.allowed_origins.is_empty());
        assert_eq!(s.history.settle_timeout, Duration::from_secs(600));
        assert_eq!(s.history.keep_per_environment, 100);
        assert_eq!(s.history.events_keep, Duration::from_secs(30 * 24 * 3600));
    }

    #[test]
    fn refuses_what_it_cannot_act_on() {
        let err = |text: &str| format!("{:#}", Settings::parse(text).unwrap_err());
        assert!(err("kubernetes:\n  agnets: []\n").contains("agnets"));
        assert!(err("kubernetes:\n  agents:\n    - agent: no-colon\n").contains("no-colon"));
        assert!(err("kubernetes:\n  agents:\n    - agent: -3\n").contains("positive"));
        assert!(err("kubernetes:\n  connect_timeout: soon\n").contains("soon"));
        assert!(
            err("kubernetes:\n  agents:\n    - agent: 7\n      context: a\n    - agent: \"7\"\n      context: b\n")
                .contains("more than one entry")
        );
        // An entry must name its cluster: no entry falls back to a current context.
        assert!(err("kubernetes:\n  agents:\n    - agent: 7\n").contains("names no cluster"));
        assert!(
            err("kubernetes:\n  agents:\n    - agent: 7\n      kubeconfig: /k\n")
                .contains("agent 7 names no cluster")
        );
        assert!(err(
            "kubernetes:\n  agents:\n    - agent: 7\n      context: a\n      in_cluster: true\n"
        )
        .contains("both a context and in_cluster"));
        assert!(err("cors:\n  allowed_origins: ['*']\n").contains("not an origin"));
        assert!(err("history:\n  keep_per_environment: 0\n").contains("at least 1"));
        assert!(err("history:\n  settle_timout: 1m\n").contains("settle_timout"));
        assert!(err("trusted_proxies: [10.0.0.0/40]\n").contains("10.0.0.0/40"));
        let hooks = |entries: &str| {
            err(&format!(
                "gitlab:\n  url: https://g\n  webhooks:\n{entries}"
            ))
        };
        assert!(hooks("    - {group: /acme/, token_file: /t}\n").contains("full path"));
        assert!(hooks("    - {group: a//b, token_file: /t}\n").contains("full path"));
        assert!(hooks(
            "    - {group: Acme, token_file: /t}\n    - {group: acme, token_file: /u}\n"
        )
        .contains("more than one entry"));
        assert!(hooks("    - {group: acme}\n").contains("token_file"));
        let kas =
            |rest: &str| format!("gitlab:\n  url: https://gitlab.example.com\n  kas:\n{rest}");
        assert!(err(&kas("    url: kas.example.com\n")).contains("not an http(s) URL"));
        assert!(err(&kas("    tokn_file: /t\n")).contains("tokn_file"));
    }

    #[test]
    fn reads_the_agent_servers_section() {
        let s = Settings::parse(
            "gitlab:\n  url: https://gitlab.example.com\n  kas:\n    token_file: /etc/envlens/kas\n    url: https://kas.example.com/k8s-proxy/\n",
        )
        .unwrap();
        let kas = s.gitlab.unwrap().kas.unwrap();
        assert_eq!(
            kas.token_file.as_deref(),
            Some(Path::new("/etc/envlens/kas"))
        );
        assert_eq!(
            kas.url.as_deref(),
            Some("https://kas.example.com/k8s-proxy/")
        );
        assert_eq!(kas.metadata_interval, Duration::from_secs(60));
        let none = Settings::parse("gitlab:\n  url: https://gitlab.example.com\n").unwrap();
        assert!(none.gitlab.unwrap().kas.is_none());
    }
}
