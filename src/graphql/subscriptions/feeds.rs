//! One feed per resource group being watched, shared by every subscriber who sees it the same
//! way (same cluster, namespace, selector and identity towards the cluster): it follows the
//! watch cache's change feed of the namespace, assembles the group again after a change, and
//! broadcasts what changed ([`delta::diff`]). A thousand subscribers of one environment cost
//! one assembly per change, not a thousand.
//!
//! A GitOps environment's feed ([`GitOpsKey`]) follows every namespace its group spans, and
//! the cluster scope of its cluster-scoped entries: what its sources apply, and the Flux
//! objects themselves, wherever they are.
//!
//! Coalescing: a change after a quiet spell is assembled at once; changes within
//! [`WINDOW`] of the last message wait for the window's end and go out as one message. A
//! subscriber that falls behind the broadcast gets the whole group again (`complete`).
//!
//! A message is rendered once per distinct selection, not once per subscriber: it carries its
//! texts ([`Update::rendered`]), which the first subscriber with a selection renders and the
//! others share; the whole group that joining subscribers get first is one shared message
//! too, while the group stays the same.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use async_graphql::futures_util::future::select_all;
use std::time::Duration;

use axum::http::HeaderMap;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;

use crate::graphql::splice::PerSelection;
use crate::k8s::clusters::Cluster;
use crate::k8s::fetch::FetchOptions;
use crate::k8s::gitops;
use crate::k8s::watch::{KindChange, WatchCache, CLUSTER_SCOPE};
use crate::replicas::forward::AsViewer;
use crate::resources::delta::{self, GroupDelta};
use crate::resources::group::ResourceGroup;
use crate::resources::health::Customizations;

/// Changes within this long of the last message are sent together.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Messages a subscriber may fall behind by before it is sent the whole group again.
const BACKLOG: usize = 64;

/// What identifies a feed: whoever shares it sees the same group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FeedKey {
    pub agent: i64,
    pub namespace: String,
    pub selector: String,
    /// The impersonation headers, as sorted `name: value` lines (empty for the agent's own
    /// identity).
    pub identity: String,
    /// The GitOps sources of the group, when it has some (SPEC 15).
    pub gitops: Option<Arc<GitOpsKey>>,
}

/// What a GitOps environment's group is the union of (SPEC 15): its sources, and its labels
/// source (the key's selector) in these namespaces, none when it has none.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GitOpsKey {
    pub sources: Vec<crate::gitops::ObjRef>,
    pub labels_namespaces: Vec<String>,
}

impl FeedKey {
    /// The key of a GitOps environment's group, its `namespace` the first it spans.
    pub fn gitops(agent: i64, selector: &str, headers: &HeaderMap, gitops: GitOpsKey) -> Self {
        let first = gitops
            .labels_namespaces
            .first()
            .cloned()
            .or_else(|| gitops.sources.iter().find_map(|s| s.namespace.clone()))
            .unwrap_or_default();
        FeedKey {
            gitops: Some(Arc::new(gitops)),
            ..FeedKey::new(agent, &first, selector, headers)
        }
    }

    pub fn new(agent: i64, namespace: &str, selector: &str, headers: &HeaderMap) -> Self {
        let mut lines: Vec<String> = headers
            .iter()
            .map(|(k, v)| format!("{k}: {}", String::from_utf8_lossy(v.as_bytes())))
            .collect();
        lines.sort();
        FeedKey {
            agent,
            namespace: namespace.to_owned(),
            selector: selector.to_owned(),
            identity: lines.join("\n"),
            gitops: None,
        }
    }
}

/// A message of a feed: a change, or why the group could not be read at all.
pub type Message = Result<Arc<Update>, Arc<str>>;

/// A change as every subscriber of the feed receives it, with its JSON per selection.
pub struct Update {
    pub delta: GroupDelta,
    pub rendered: PerSelection,
}

impl Update {
    fn new(delta: GroupDelta) -> Arc<Self> {
        Arc::new(Update {
            delta,
            rendered: PerSelection::default(),
        })
    }
}

/// The feeds running now.
#[derive(Default)]
pub struct Feeds {
    running: Running,
}

type Running = Arc<Mutex<HashMap<FeedKey, Arc<Feed>>>>;

struct Feed {
    state: Mutex<State>,
    /// The first subscriber's way to the owner of the connection (SPEC 16), kept for the
    /// feed's life: a feed started without one (the health keeper's, as the agent) takes it
    /// from the first subscriber who brings one.
    through: OnceLock<AsViewer>,
}

struct State {
    /// The group as last sent; `None` until the first assembly.
    current: Option<Arc<ResourceGroup>>,
    /// The whole of a group as a message, for those who join (or fall behind) while it is
    /// the group: shared, so rendered once per selection.
    complete: Option<(Arc<ResourceGroup>, Arc<Update>)>,
    tx: broadcast::Sender<Message>,
}

impl State {
    /// All of `group` as a message.
    fn complete(&mut self, group: &Arc<ResourceGroup>) -> Arc<Update> {
        if let Some((kept, update)) = &self.complete {
            if Arc::ptr_eq(kept, group) {
                return update.clone();
            }
        }
        let update = Update::new(GroupDelta::complete(group));
        if self
            .current
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, group))
        {
            self.complete = Some((group.clone(), update.clone()));
        }
        update
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a feed reads the group with.
pub struct Source {
    pub cluster: Cluster,
    pub headers: HeaderMap,
    pub options: FetchOptions,
    pub health: Arc<Customizations>,
    /// How often an impersonated group is assembled again with no change: access reviews
    /// (RBAC) may have changed meanwhile.
    pub recheck: Duration,
    /// A subscriber's way to the owner of the connection, when another replica may own it
    /// (SPEC 16): the feed then hears of changes and reads the group through it.
    pub through: Option<crate::replicas::forward::AsViewer>,
}

/// A subscriber's end of a feed.
pub struct Subscriber {
    feed: Arc<Feed>,
    /// The whole group to send first, when the feed already has one.
    pub first: Option<Arc<ResourceGroup>>,
    pub rx: broadcast::Receiver<Message>,
}

impl Subscriber {
    /// The next message: a change, the whole group again after falling behind, or `None` when
    /// the feed stopped.
    pub async fn next(&mut self) -> Option<Message> {
        if let Some(first) = self.first.take() {
            return Some(Ok(lock(&self.feed.state).complete(&first)));
        }
        match self.rx.recv().await {
            Ok(message) => Some(message),
            Err(RecvError::Closed) => None,
            Err(RecvError::Lagged(_)) => {
                let mut state = lock(&self.feed.state);
                self.rx = state.tx.subscribe();
                let current = state.current.clone()?;
                Some(Ok(state.complete(&current)))
            }
        }
    }
}

impl Feeds {
    /// Joins the feed of `key`, starting it when none runs.
    pub fn subscribe(&self, key: FeedKey, source: impl FnOnce() -> Source) -> Subscriber {
        let mut running = lock(&self.running);
        if let Some(feed) = running.get(&key) {
            if feed.through.get().is_none() {
                if let Some(through) = source().through {
                    let _ = feed.through.set(through);
                }
            }
            let state = lock(&feed.state);
            return Subscriber {
                feed: feed.clone(),
                first: state.current.clone(),
                rx: state.tx.subscribe(),
            };
        }
        let (tx, rx) = broadcast::channel(BACKLOG);
        let mut source = source();
        let through = OnceLock::new();
        if let Some(given) = source.through.take() {
            let _ = through.set(given);
        }
        let feed = Arc::new(Feed {
            through,
            state: Mutex::new(State {
                current: None,
                complete: None,
                tx,
            }),
        });
        running.insert(key.clone(), feed.clone());
        tokio::spawn(run(self.running.clone(), key, feed.clone(), source));
        Subscriber {
            feed,
            first: None,
            rx,
        }
    }

    /// Feeds running now (for tests and metrics).
    pub(super) fn len(&self) -> usize {
        lock(&self.running).len()
    }
}

/// The feed's task: reads the group, then follows the namespaces' changes until nobody
/// subscribes any more.
async fn run(running: Running, key: FeedKey, feed: Arc<Feed>, source: Source) {
    let watch = &source.cluster.watch;
    let mut changes = Changes::default();
    changes.follow(watch, &initial_namespaces(&key));
    let mut heard = super::routed::listen(&source, &key, feed.through.get()).await;
    let mut current = match read(&source, &key, feed.through.get(), &mut changes).await {
        Ok(group) => group,
        Err(message) => {
            leave(&running, &key, &feed);
            let _ = lock(&feed.state).tx.send(Err(message.into()));
            return;
        }
    };
    publish(&feed, current.clone(), None);
    let mut last_sent = Instant::now();
    let impersonated = !source.headers.is_empty();
    let mut recheck = tokio::time::interval_at(Instant::now() + source.recheck, source.recheck);
    loop {
        let dirty = tokio::select! {
            heard_of = heard.next(&source, &key, feed.through.get()) => {
                if !heard_of {
                    // Ended, or the connection changed hands: heard from its owner now.
                    tokio::time::sleep(WINDOW).await;
                    heard = super::routed::listen(&source, &key, feed.through.get()).await;
                }
                true
            }
            () = changes.next(watch) => true,
            _ = recheck.tick() => impersonated,
        };
        if unsubscribed(&running, &key, &feed) {
            break;
        }
        if !dirty {
            continue;
        }
        let due = last_sent + WINDOW;
        if Instant::now() < due {
            tokio::time::sleep_until(due).await;
        }
        // Whatever arrived meanwhile is in the assembly below.
        changes.drain();
        match read(&source, &key, feed.through.get(), &mut changes).await {
            Ok(next) => {
                let delta = delta::diff(&current, &next);
                if delta::changed(&current, &delta) {
                    current = next;
                    publish(&feed, current.clone(), Some(delta));
                    last_sent = Instant::now();
                }
            }
            Err(message) => {
                tracing::warn!(namespace = %key.namespace, error = %message, "resource group feed: cannot read the group; keeping the last one");
            }
        }
    }
    tracing::debug!(namespace = %key.namespace, "resource group feed: no subscriber left");
}

/// The namespaces a feed follows before its first read: the key's, and for a GitOps group
/// those its labels source and its sources name, and the cluster scope.
fn initial_namespaces(key: &FeedKey) -> Vec<String> {
    let mut namespaces = vec![key.namespace.clone()];
    if let Some(gitops) = &key.gitops {
        namespaces.extend(gitops.labels_namespaces.iter().cloned());
        namespaces.extend(gitops.sources.iter().filter_map(|s| s.namespace.clone()));
        namespaces.push(CLUSTER_SCOPE.to_owned());
    }
    namespaces
}

/// Reads the group, then follows the namespaces it spans: subscribed before the read that
/// shows them, so no change falls between. A group that spans namespaces not followed before
/// (a source applies in a new one) is read again once they are (a few times at most, for
/// sources nested deeper).
async fn read(
    source: &Source,
    key: &FeedKey,
    through: Option<&AsViewer>,
    changes: &mut Changes,
) -> Result<Arc<ResourceGroup>, String> {
    let mut rounds = 0;
    loop {
        let (group, spans) = assemble(source, key, through).await?;
        rounds += 1;
        if !changes.follow(&source.cluster.watch, &spans) || rounds > 3 {
            return Ok(group);
        }
    }
}

/// The change feeds of the namespaces a feed follows, as one.
#[derive(Default)]
struct Changes {
    feeds: HashMap<String, broadcast::Receiver<KindChange>>,
}

impl Changes {
    /// Follows exactly `namespaces` from now on; whether some were not followed before.
    fn follow(&mut self, watch: &WatchCache, namespaces: &[String]) -> bool {
        self.feeds.retain(|ns, _| namespaces.contains(ns));
        let mut added = false;
        for ns in namespaces {
            if !self.feeds.contains_key(ns) {
                self.feeds.insert(ns.clone(), watch.changes(ns));
                added = true;
            }
        }
        added
    }

    /// Waits for a change in any of the namespaces (or a lag, which calls for a read all the
    /// same). A namespace whose feed closed (the cache dropped it) is followed anew.
    async fn next(&mut self, watch: &WatchCache) {
        if self.feeds.is_empty() {
            return std::future::pending().await;
        }
        type Next<'a> = Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + 'a>>;
        let waits: Vec<Next<'_>> = self
            .feeds
            .iter_mut()
            .map(|(ns, rx)| -> Next<'_> {
                Box::pin(async move {
                    match rx.recv().await {
                        Err(RecvError::Closed) => Some(ns.clone()),
                        _ => None,
                    }
                })
            })
            .collect();
        let (closed, _, _) = select_all(waits).await;
        if let Some(ns) = closed {
            self.feeds.insert(ns.clone(), watch.changes(&ns));
        }
    }

    /// Forgets what arrived so far.
    fn drain(&mut self) {
        for rx in self.feeds.values_mut() {
            while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = rx.try_recv() {}
        }
    }
}

/// Sets the feed's group and sends the change (the whole group when `delta` is `None`),
/// under one lock: a subscriber joining takes either the old group and this change, or the
/// new group.
fn publish(feed: &Feed, group: Arc<ResourceGroup>, delta: Option<GroupDelta>) {
    let mut state = lock(&feed.state);
    state.current = Some(group.clone());
    let update = match delta {
        Some(delta) => {
            // The whole of the group before is nobody's first message any more.
            state.complete = None;
            Update::new(delta)
        }
        None => state.complete(&group),
    };
    let _ = state.tx.send(Ok(update));
}

/// Whether nobody subscribes any more; the feed then leaves the registry, under its lock so
/// that nobody joins it meanwhile.
fn unsubscribed(running: &Running, key: &FeedKey, feed: &Arc<Feed>) -> bool {
    let mut running = lock(running);
    if lock(&feed.state).tx.receiver_count() > 0 {
        return false;
    }
    if running.get(key).is_some_and(|f| Arc::ptr_eq(f, feed)) {
        running.remove(key);
    }
    true
}

fn leave(running: &Running, key: &FeedKey, feed: &Arc<Feed>) {
    let mut running = lock(running);
    if running.get(key).is_some_and(|f| Arc::ptr_eq(f, feed)) {
        running.remove(key);
    }
}

/// The group from the watch cache (assembled off the runtime's threads, shared with the
/// views of the same group at the same generation), and the namespaces it spans (through the
/// owner when another replica owns a labels group's connection); while the
/// agent's circuit is open, as a view shows it then ([`ResourceGroup::while_away`]). The
/// circuit opens and closes as the watches fail and resume, which are changes the feed reads
/// the group again for.
async fn assemble(
    source: &Source,
    key: &FeedKey,
    through: Option<&AsViewer>,
) -> Result<(Arc<ResourceGroup>, Vec<String>), String> {
    if let Some(owners) = super::routed::through_owner(source, key, through).await {
        return owners.map(|group| (group, vec![key.namespace.clone()]));
    }
    let cluster = &source.cluster;
    let (group, spans) = match &key.gitops {
        None => {
            let group = cluster
                .watch
                .resource_group(
                    &cluster.discovery,
                    &source.headers,
                    &key.namespace,
                    &key.selector,
                    &source.options,
                    &source.health,
                )
                .await
                .map_err(|e| e.to_string())?;
            (group, vec![key.namespace.clone()])
        }
        Some(gitops) => {
            let reader = gitops::Reader {
                watch: &cluster.watch,
                memo: &cluster.gitops,
                client: &cluster.client,
                discovery: &cluster.discovery,
                headers: &source.headers,
                options: &source.options,
            };
            let labels = (!gitops.labels_namespaces.is_empty()).then(|| gitops::LabelsSource {
                namespaces: gitops.labels_namespaces.clone(),
                selector: key.selector.clone(),
            });
            let grouped =
                gitops::resource_group(&reader, &gitops.sources, labels.as_ref(), &source.health)
                    .await
                    .map_err(|e| e.to_string())?;
            let mut spans = grouped.namespaces;
            spans.push(CLUSTER_SCOPE.to_owned());
            (grouped.group, spans)
        }
    };
    let group = match cluster.condition.circuit().open() {
        Some(open) => Arc::new(group.while_away(open.since, &open.said())),
        None => group,
    };
    Ok((group, spans))
}
