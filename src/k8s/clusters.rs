//! Cluster connections (SPEC section 6): which Kubernetes client reaches which agent's cluster.
//!
//! In GitLab an agent reaches exactly one cluster, the one its agentk runs in. envlens keeps
//! that rule: an agent is reached only through an entry of the configuration file that names
//! it (a kubeconfig context, or `in_cluster: true` for the pod's own service account). There is
//! no catch-all: a kubeconfig's current context, or the pod's account, is never lent to an
//! agent that does not name it, since any Maintainer can register an agent and would otherwise
//! read whatever envlens' own identity can. An agent without an entry has no connection
//! ([`NoConnection`]): its views say so (503), nothing is sent anywhere.
//!
//! Clients are built once, at start-up, so that a context that does not exist stops `serve`
//! with a message naming the agent and the context rather than failing a user's request later.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::config::file::{AgentCluster, AgentRef, KubernetesSettings};
use crate::k8s::discovery::DiscoveryCache;
use crate::k8s::observe::{KnownResources, ObserveLayer};
use crate::k8s::watch::{WatchCache, WatchSettings};
use crate::telemetry::Metrics;

/// A client, where it leads (for messages), and the cluster's discovered kinds, shared by
/// every view of the cluster.
#[derive(Clone)]
pub struct Cluster {
    pub client: kube::Client,
    /// e.g. `context "prod" of /etc/envlens/kubeconfig`.
    pub source: String,
    /// Reached with the pod's own service account (`in_cluster: true`).
    pub in_cluster: bool,
    pub discovery: DiscoveryCache,
    /// The objects of the namespaces viewed, kept by watches (SPEC 8.1).
    pub watch: WatchCache,
}

pub struct Clusters {
    configured: HashMap<AgentRef, Cluster>,
    /// The namespace envlens runs in: the proxy never forwards its Secrets
    /// ([`crate::k8s::request_info`]).
    pub own_namespace: Option<String>,
    pub response_timeout: Duration,
    /// Recent `user_access` decisions.
    pub grants: crate::k8s::grants::GrantCache,
    /// Where every client counts its requests.
    pub metrics: Arc<Metrics>,
    /// GitLab's watch API: its tokens and its bound on sockets.
    pub watch_api: Arc<crate::k8s::watch_api::Shared>,
}

/// The agent has no cluster connection (SPEC 6): its views answer 503 with this message.
#[derive(Debug, Clone, thiserror::Error)]
#[error("No cluster connection is configured for agent {agent}")]
pub struct NoConnection {
    pub agent: i64,
}

impl From<NoConnection> for crate::error::Error {
    fn from(e: NoConnection) -> Self {
        crate::error::Error::NoConnection(e.to_string())
    }
}

impl Clusters {
    /// Builds the client of every configured agent.
    pub async fn load(
        settings: &KubernetesSettings,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let mut configured = HashMap::new();
        for entry in &settings.agents {
            let cluster = connect(entry, settings, &metrics)
                .await
                .with_context(|| format!("kubernetes.agents: {}, {}", entry.agent, entry.target()))?;
            configured.insert(entry.agent.clone(), cluster);
        }
        Ok(Clusters {
            configured,
            ..Clusters::none(settings, metrics)
        })
    }

    /// No agent has a connection: no entries are built.
    pub fn none(settings: &KubernetesSettings, metrics: Arc<Metrics>) -> Self {
        let own_namespace = settings.own_namespace.clone().or_else(|| {
            std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|ns| !ns.is_empty())
        });
        Clusters {
            configured: HashMap::new(),
            own_namespace,
            response_timeout: settings.response_timeout,
            grants: crate::k8s::grants::GrantCache::new(settings.access_cache),
            metrics,
            watch_api: Arc::default(),
        }
    }

    /// The cluster of an agent: its entry by id, else by path; none without an entry.
    pub async fn for_agent(
        &self,
        id: i64,
        project_full_path: &str,
        name: &str,
    ) -> Result<Cluster, NoConnection> {
        self.configured
            .get(&AgentRef::Id(id))
            .or_else(|| {
                self.configured
                    .get(&AgentRef::path(project_full_path, name))
            })
            .cloned()
            .ok_or(NoConnection { agent: id })
    }

    /// Whether the agent has an entry (for `serve`'s start-up report).
    pub fn has_entry(&self, id: i64, project_full_path: &str, name: &str) -> bool {
        self.configured.contains_key(&AgentRef::Id(id))
            || self
                .configured
                .contains_key(&AgentRef::path(project_full_path, name))
    }
}

fn watch_settings(settings: &KubernetesSettings) -> WatchSettings {
    WatchSettings {
        idle: settings.cache_idle,
        handover: crate::k8s::watch::HANDOVER,
        max_objects: settings.cache_max_objects,
        access_ttl: settings.access_cache,
    }
}

/// The client of one entry: a context of a kubeconfig file (the entry's, else
/// `kubernetes.kubeconfig`, else kube's default file), or the pod's own service account.
async fn connect(
    entry: &AgentCluster,
    settings: &KubernetesSettings,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Cluster> {
    let kubeconfig = entry.kubeconfig.as_ref().or(settings.kubeconfig.as_ref());
    let (mut config, source) = match (&entry.context, kubeconfig) {
        (Some(context), Some(path)) => {
            let options = KubeConfigOptions {
                context: Some(context.clone()),
                ..Default::default()
            };
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            let config = kube::Config::from_custom_kubeconfig(file, &options).await?;
            (config, format!("context \"{context}\" of {}", path.display()))
        }
        (Some(context), None) => {
            let options = KubeConfigOptions {
                context: Some(context.clone()),
                ..Default::default()
            };
            let config = kube::Config::from_kubeconfig(&options).await?;
            (config, format!("context \"{context}\" of the default kubeconfig"))
        }
        (None, _) => {
            let config = kube::Config::incluster()
                .context("in_cluster: envlens is not running in a pod with a service account")?;
            (config, "the pod's service account".to_owned())
        }
    };
    let connect_timeout = settings.connect_timeout;
    config.connect_timeout = Some(connect_timeout);
    // Watches and followed logs may stay quiet for as long as they like.
    config.read_timeout = None;
    // The cluster's own 429 and 503 answers belong to the caller (the proxy passes them on, a
    // resource group reports them); kube would otherwise retry them for seconds.
    config.default_retry = false;
    // The labels of the cluster's requests are the resources its discovery knows.
    let known = KnownResources::default();
    let build = |config: kube::Config| -> anyhow::Result<kube::Client> {
        Ok(kube::client::ClientBuilder::try_from(config)
            .context("cannot build the Kubernetes client")?
            .with_layer(&ObserveLayer {
                metrics: metrics.clone(),
                known: known.clone(),
            })
            .build())
    };
    // The watch cache's streams get a client, so a connection pool, of their own.
    let streams = build(config.clone())?;
    let client = build(config)?;
    Ok(Cluster {
        in_cluster: entry.context.is_none(),
        discovery: DiscoveryCache::telling(client.clone(), DiscoveryCache::DEFAULT_TTL, known),
        watch: WatchCache::new(
            client.clone(),
            streams,
            watch_settings(settings),
            metrics.clone(),
        ),
        client,
        source,
    })
}
