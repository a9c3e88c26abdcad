//! Cluster connections (SPEC section 6): which Kubernetes client reaches which agent's cluster.
//!
//! Clients of the configuration file's entries are built once, at start-up, so that a context
//! that does not exist stops `serve` with a message naming the agent and the context rather than
//! failing a user's request later. Agents without an entry share one client of the default
//! kubeconfig's current context (`KUBECONFIG`, `~/.kube/config`), or of the in-cluster service
//! account; it is built on first use, and retried on the next use if that fails, so that envlens
//! starts on a machine with no cluster at all.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::sync::OnceCell;

use crate::config::file::{AgentRef, KubernetesSettings};
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
    pub discovery: DiscoveryCache,
    /// The objects of the namespaces viewed, kept by watches (SPEC 8.1).
    pub watch: WatchCache,
}

pub struct Clusters {
    configured: HashMap<AgentRef, Cluster>,
    default: OnceCell<Cluster>,
    default_kubeconfig: Option<std::path::PathBuf>,
    connect_timeout: Duration,
    watch: WatchSettings,
    pub response_timeout: Duration,
    /// Recent `user_access` decisions.
    pub grants: crate::k8s::grants::GrantCache,
    /// Where every client counts its requests.
    pub metrics: Arc<Metrics>,
    /// GitLab's watch API: its tokens and its bound on sockets.
    pub watch_api: Arc<crate::k8s::watch_api::Shared>,
}

/// No client could be made for the agent: the proxy answers 502 with this message.
#[derive(Debug, thiserror::Error)]
#[error("no connection to the cluster of agent {agent}: {reason}")]
pub struct Unconfigured {
    pub agent: i64,
    pub reason: String,
}

impl Clusters {
    /// Builds the client of every configured agent.
    pub async fn load(
        settings: &KubernetesSettings,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let mut configured = HashMap::new();
        for entry in &settings.agents {
            let kubeconfig = entry.kubeconfig.as_ref().or(settings.kubeconfig.as_ref());
            let cluster = connect(
                kubeconfig.map(|p| p.as_path()),
                entry.context.as_deref(),
                settings.connect_timeout,
                &watch_settings(settings),
                &metrics,
            )
            .await
            .with_context(|| {
                let context = match &entry.context {
                    Some(c) => format!("context \"{c}\""),
                    None => "the current context".to_owned(),
                };
                format!("kubernetes.agents: {}, {context}", entry.agent)
            })?;
            configured.insert(entry.agent.clone(), cluster);
        }
        Ok(Clusters {
            configured,
            ..Clusters::fallback_only(settings, metrics)
        })
    }

    /// Every agent through the default connection: no entries are built.
    pub fn fallback_only(settings: &KubernetesSettings, metrics: Arc<Metrics>) -> Self {
        Clusters {
            configured: HashMap::new(),
            default: OnceCell::new(),
            default_kubeconfig: settings.kubeconfig.clone(),
            connect_timeout: settings.connect_timeout,
            watch: watch_settings(settings),
            response_timeout: settings.response_timeout,
            grants: crate::k8s::grants::GrantCache::new(settings.access_cache),
            metrics,
            watch_api: Arc::default(),
        }
    }

    /// The cluster of an agent: its entry by id, else by path, else the default connection.
    pub async fn for_agent(
        &self,
        id: i64,
        project_full_path: &str,
        name: &str,
    ) -> Result<Cluster, Unconfigured> {
        let by_path = AgentRef::path(project_full_path, name);
        if let Some(cluster) = self
            .configured
            .get(&AgentRef::Id(id))
            .or_else(|| self.configured.get(&by_path))
        {
            return Ok(cluster.clone());
        }
        self.default
            .get_or_try_init(|| {
                connect(
                    self.default_kubeconfig.as_deref(),
                    None,
                    self.connect_timeout,
                    &self.watch,
                    &self.metrics,
                )
            })
            .await
            .cloned()
            .map_err(|e| Unconfigured {
                agent: id,
                reason: format!("{e:#}"),
            })
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

/// A client for a context of a kubeconfig file, or, without a file, what kube infers:
/// `KUBECONFIG` / `~/.kube/config`, then the in-cluster service account.
async fn connect(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    connect_timeout: Duration,
    watch: &WatchSettings,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Cluster> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let describe = |file: &str| match context {
        Some(c) => format!("context \"{c}\" of {file}"),
        None => format!("the current context of {file}"),
    };
    let (mut config, source) = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            let config = kube::Config::from_custom_kubeconfig(file, &options).await?;
            (config, describe(&path.display().to_string()))
        }
        None if context.is_some() => {
            let config = kube::Config::from_kubeconfig(&options).await?;
            (config, describe("the default kubeconfig"))
        }
        None => {
            let config = kube::Config::infer()
                .await
                .context("no kubeconfig (KUBECONFIG, ~/.kube/config) and not running in a pod")?;
            (
                config,
                "the default kubeconfig or in-cluster account".to_owned(),
            )
        }
    };
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
        discovery: DiscoveryCache::telling(client.clone(), DiscoveryCache::DEFAULT_TTL, known),
        watch: WatchCache::new(client.clone(), streams, watch.clone(), metrics.clone()),
        client,
        source,
    })
}
