//! Cluster connections (SPEC section 6): which Kubernetes client reaches which agent's cluster.
//!
//! In GitLab an agent reaches exactly one cluster, the one its agentk runs in. envlens keeps
//! that rule: an agent is reached only through an entry of the configuration file that names
//! it (a kubeconfig context, or `in_cluster: true` for the pod's own service account), or, when
//! `gitlab.kas` is configured, through GitLab's agent server as itself (SPEC 14), which routes
//! to that agent's agentk and nowhere else. There is no catch-all: a kubeconfig's current
//! context, or the pod's account, is never lent to an agent that does not name it, since any
//! Maintainer can register an agent and would otherwise read whatever envlens' own identity
//! can. An agent with neither has no connection ([`NoConnection`]): its views say so (503),
//! nothing is sent anywhere.
//!
//! Entries' clients are built once, at start-up, so that a context that does not exist stops
//! `serve` with a message naming the agent and the context rather than failing a user's request
//! later. Clients through KAS are built on an agent's first use and kept (a bounded number).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::sync::Mutex;

use crate::config::file::{AgentCluster, AgentRef, KubernetesSettings};
use crate::k8s::connection::{Checked, Condition, ConnectionStatus, RecordLayer};
use crate::k8s::discovery::DiscoveryCache;
use crate::k8s::kas::Kas;
use crate::k8s::observe::{KnownResources, ObserveLayer};
use crate::k8s::watch::fence::{Fence, Fences};
use crate::k8s::watch::{WatchCache, WatchSettings};
use crate::telemetry::Metrics;

/// A client, where it leads (for messages), and the cluster's discovered kinds, shared by
/// every view of the cluster.
#[derive(Clone)]
pub struct Cluster {
    pub client: kube::Client,
    /// e.g. `context "prod" of /etc/envlens/kubeconfig`.
    pub source: String,
    /// How the cluster is reached.
    pub kind: ConnectionKind,
    /// How its last request went.
    pub condition: Condition,
    pub discovery: DiscoveryCache,
    /// The objects of the namespaces viewed, kept by watches (SPEC 8.1).
    pub watch: WatchCache,
    /// The GitOps groups read from `watch` lately (SPEC 15).
    pub gitops: Arc<crate::k8s::gitops::Memo>,
}

/// How an agent's cluster is reached (SPEC 14's `AgentConnection.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionKind {
    /// Through GitLab's agent server, as the agent.
    Kas,
    /// A context of a kubeconfig file.
    Kubeconfig,
    /// The pod's own service account (`in_cluster: true`).
    InCluster,
}

impl ConnectionKind {
    /// As the metrics name it.
    pub fn label(self) -> &'static str {
        match self {
            ConnectionKind::Kas => "kas",
            ConnectionKind::Kubeconfig => "kubeconfig",
            ConnectionKind::InCluster => "in_cluster",
        }
    }
}

impl Cluster {
    /// Reached with the pod's own service account (`in_cluster: true`).
    pub fn in_cluster(&self) -> bool {
        self.kind == ConnectionKind::InCluster
    }
}

/// The most agents whose clients through KAS are kept; past it, the least recently used one
/// is dropped (and built again on its next use).
const MAX_KAS_CLUSTERS: usize = 10_000;

/// Every agent without an entry, reached through KAS: their clients, built on first use.
struct ThroughKas {
    kas: Arc<Kas>,
    built: Mutex<lru::LruCache<i64, Cluster>>,
}

pub struct Clusters {
    configured: HashMap<AgentRef, Cluster>,
    through_kas: Option<ThroughKas>,
    connect_timeout: Duration,
    watch_settings: WatchSettings,
    /// Whether this process holds each connection's watches (SPEC 16), by `source`.
    fences: Fences,
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

/// An agent's connection as `ClusterAgent.connection` shows it: how (none without one), and how
/// its last request went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    pub kind: Option<ConnectionKind>,
    pub status: ConnectionStatus,
    pub message: Option<String>,
    pub checked_at: Option<chrono::DateTime<chrono::Utc>>,
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
        Self::load_fenced(settings, metrics, Fences::solo()).await
    }

    /// As [`Clusters::load`], each connection's watches held under its fence of `fences`
    /// (keyed by the connection's `source`), for replicas that share the clusters.
    pub async fn load_fenced(
        settings: &KubernetesSettings,
        metrics: Arc<Metrics>,
        fences: Fences,
    ) -> anyhow::Result<Self> {
        let mut configured = HashMap::new();
        for entry in &settings.agents {
            let cluster = connect(entry, settings, &metrics, &fences)
                .await
                .with_context(|| {
                    format!("kubernetes.agents: {}, {}", entry.agent, entry.target())
                })?;
            configured.insert(entry.agent.clone(), cluster);
        }
        Ok(Clusters {
            configured,
            fences,
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
            through_kas: None,
            connect_timeout: settings.connect_timeout,
            watch_settings: watch_settings(settings),
            fences: Fences::solo(),
            own_namespace,
            response_timeout: settings.response_timeout,
            grants: crate::k8s::grants::GrantCache::new(settings.access_cache),
            metrics,
            watch_api: Arc::default(),
        }
    }

    /// Every agent without an entry is reached through `kas` from now on.
    pub fn with_kas(mut self, kas: Arc<Kas>) -> Self {
        self.through_kas = Some(ThroughKas {
            kas,
            built: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(MAX_KAS_CLUSTERS).expect("not zero"),
            )),
        });
        self
    }

    /// GitLab's agent server, when configured.
    pub fn kas(&self) -> Option<&Arc<Kas>> {
        self.through_kas.as_ref().map(|t| &t.kas)
    }

    /// The cluster of an agent: its entry by id, else by path, else through KAS when
    /// configured; none otherwise.
    pub async fn for_agent(
        &self,
        id: i64,
        project_full_path: &str,
        name: &str,
    ) -> Result<Cluster, NoConnection> {
        let entry = self.configured.get(&AgentRef::Id(id)).or_else(|| {
            self.configured
                .get(&AgentRef::path(project_full_path, name))
        });
        if let Some(cluster) = entry {
            return Ok(cluster.clone());
        }
        let through = self
            .through_kas
            .as_ref()
            .ok_or(NoConnection { agent: id })?;
        let mut built = through.built.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cluster) = built.get(&id) {
            return Ok(cluster.clone());
        }
        let condition = Condition::new(Some(id), ConnectionKind::Kas, self.metrics.clone());
        // The labels of the cluster's requests are the resources its discovery knows.
        let known = KnownResources::default();
        let build = |streams: bool| {
            crate::k8s::kas::route::client(
                through.kas.clone(),
                id,
                condition.clone(),
                (self.connect_timeout, streams),
                self.metrics.clone(),
                known.clone(),
            )
            .map_err(|e| {
                tracing::error!(agent = id, error = %format!("{e:#}"), "cannot build a client through GitLab's agent server");
                NoConnection { agent: id }
            })
        };
        // The watch cache's streams get a client, so a connection pool, of their own.
        let source = format!("GitLab's agent server, as agent {id}");
        let fence = self.fences.fence(&source);
        let cluster = cluster(
            build(false)?,
            build(true)?,
            (ConnectionKind::Kas, source),
            fence,
            condition,
            known,
            self.watch_settings.clone(),
            &self.metrics,
        );
        built.put(id, cluster.clone());
        Ok(cluster)
    }

    /// How the agent's cluster is reached and how that went last (SPEC 14's
    /// `ClusterAgent.connection`); asks nothing of any cluster.
    pub fn connection(&self, id: i64, project_full_path: &str, name: &str) -> Connection {
        let entry = self.configured.get(&AgentRef::Id(id)).or_else(|| {
            self.configured
                .get(&AgentRef::path(project_full_path, name))
        });
        let (kind, checked) = match (entry, &self.through_kas) {
            (Some(cluster), _) => (Some(cluster.kind), cluster.condition.get()),
            (None, Some(through)) => {
                let built = through.built.lock().unwrap_or_else(|e| e.into_inner());
                let checked = built.peek(&id).and_then(|c| c.condition.get());
                let checked = checked.or_else(|| match through.kas.reach() {
                    crate::k8s::kas::Reach::Unusable(why) => Some(Checked {
                        status: ConnectionStatus::Unreachable,
                        message: Some(format!("GitLab's agent server cannot be used: {why}")),
                        at: chrono::Utc::now(),
                    }),
                    crate::k8s::kas::Reach::Usable { .. } => None,
                });
                (Some(ConnectionKind::Kas), checked)
            }
            (None, None) => {
                return Connection {
                    kind: None,
                    status: ConnectionStatus::NotConfigured,
                    message: Some(NoConnection { agent: id }.to_string()),
                    checked_at: None,
                }
            }
        };
        match checked {
            Some(checked) => Connection {
                kind,
                status: checked.status,
                message: checked.message,
                checked_at: Some(checked.at),
            },
            None => Connection {
                kind,
                status: ConnectionStatus::NotChecked,
                message: None,
                checked_at: None,
            },
        }
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
    fences: &Fences,
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
            (
                config,
                format!("context \"{context}\" of {}", path.display()),
            )
        }
        (Some(context), None) => {
            let options = KubeConfigOptions {
                context: Some(context.clone()),
                ..Default::default()
            };
            let config = kube::Config::from_kubeconfig(&options).await?;
            (
                config,
                format!("context \"{context}\" of the default kubeconfig"),
            )
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
    let kind = match entry.context {
        Some(_) => ConnectionKind::Kubeconfig,
        None => ConnectionKind::InCluster,
    };
    let agent = match entry.agent {
        AgentRef::Id(id) => Some(id),
        AgentRef::Path(_) => None,
    };
    let condition = Condition::new(agent, kind, metrics.clone());
    let build = |config: kube::Config, streams: bool| -> anyhow::Result<kube::Client> {
        let builder = match streams {
            true => crate::k8s::connection::streams_builder(&config),
            false => crate::k8s::connection::client_builder(&config),
        };
        Ok(builder
            .context("cannot build the Kubernetes client")?
            .with_layer(&RecordLayer {
                condition: condition.clone(),
            })
            .with_layer(&ObserveLayer {
                metrics: metrics.clone(),
                known: known.clone(),
            })
            .build())
    };
    // The watch cache's streams get a client, so a connection pool, of their own, whose
    // connections read a little at a time (their buffers are held while the watches rest).
    let streams = build(config.clone(), true)?;
    let client = build(config, false)?;
    let fence = fences.fence(&source);
    Ok(cluster(
        client,
        streams,
        (kind, source),
        fence,
        condition,
        known,
        watch_settings(settings),
        metrics,
    ))
}

/// A cluster over its clients: its discovery and its watch cache, the same for every kind of
/// connection; `reach` is the kind of connection and where it leads (for messages), `fence`
/// whether this process holds its watches.
#[allow(clippy::too_many_arguments)]
fn cluster(
    client: kube::Client,
    streams: kube::Client,
    (kind, source): (ConnectionKind, String),
    fence: Fence,
    condition: Condition,
    known: KnownResources,
    watch: WatchSettings,
    metrics: &Arc<Metrics>,
) -> Cluster {
    let circuit = condition.circuit().clone();
    Cluster {
        kind,
        condition,
        // SPEC 13: an in_cluster connection sends no list its identity is refused, so its
        // first lists wait for the rules review.
        discovery: DiscoveryCache::telling(
            client.clone(),
            DiscoveryCache::DEFAULT_TTL,
            known,
            kind != ConnectionKind::InCluster,
        ),
        watch: WatchCache::held_by(
            client.clone(),
            streams,
            circuit,
            fence,
            watch,
            metrics.clone(),
        ),
        gitops: Arc::default(),
        client,
        source,
    }
}
