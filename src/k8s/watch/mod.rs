//! The watch cache (SPEC 8.1): per cluster connection and namespace, one watch per listable
//! namespaced kind plus the Events, so that a resource group is answered from memory.
//!
//! A namespace's watches start on its first read and stop after `kubernetes.cache_idle` with no
//! reader. Each read compares the watched kinds with discovery (itself refreshed in the
//! background), so a kind installed later is watched from the next read on and a removed one
//! dropped. Past `kubernetes.cache_max_objects`, the namespace read least recently is dropped.
//!
//! The watches run as the cluster connection's own identity and are shared by every user; only
//! the kinds that identity may list and watch in the namespace are watched ([`own_rules`]: a
//! view as that identity leaves the others out and names them, a view as a user lists them
//! fresh, as the user). With
//! `access_as: user` (impersonation headers on the read), each kind is shown only after a
//! `SubjectAccessReview` for that identity allows it ([`access`]).
//!
//! The answer is built by the same code as a fresh list ([`fetch::into_listing`]) from the same
//! per-kind outcomes, so the two cannot drift apart: a selected list is the cached objects that
//! match the selector, an unselected list of an owned kind is all of them.
//!
//! Built over `kube::Client::send` rather than kube's `runtime` watcher: the objects parse
//! straight into the compact [`Object`] the listing uses (no `DynamicObject` in between), and
//! no new dependency is needed.

pub(crate) mod access;
mod consistent;
pub mod fence;
mod kind;
mod timeline;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue};
use tracing::Instrument;

use crate::k8s::circuit::Circuit;
use crate::k8s::discovery::{events_kind, ApiKind, Discovered, DiscoveryCache, Failure};
use crate::k8s::fetch::{self, FetchError, FetchOptions, Job, Listed, Purpose};
use crate::k8s::observe;
use crate::k8s::own_rules::{self, OwnView};
use crate::resources::group::{self, ResourceGroup};
use crate::resources::health::Customizations;
use crate::resources::listing::{ListError, Listing};
use crate::resources::object::Object;
use crate::resources::tree::Tree;
use crate::telemetry::request_id::AUDIT_ID_HEADER;
use crate::telemetry::Metrics;

use kind::KindWatch;
pub(crate) use kind::Phase;
pub use kind::{Change, KindChange, HANDOVER, PACK_AFTER};

/// Limits of one cluster connection's cache.
#[derive(Debug, Clone)]
pub struct WatchSettings {
    /// A namespace unread this long stops its watches.
    pub idle: Duration,
    /// The most objects held; past it the namespace read least recently is dropped.
    pub max_objects: usize,
    /// How long a `SubjectAccessReview` decision is reused.
    pub access_ttl: Duration,
}

/// The cache of one cluster connection. Cheap to clone.
#[derive(Clone)]
pub struct WatchCache {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    /// The watch streams' own client: a connection pool of their own ([`WatchCache::new`]).
    streams: kube::Client,
    /// The connection's circuit: a kind backing off after a failure goes on when it closes.
    circuit: Circuit,
    /// This replica's hold of the connection ([`fence`]): no watch runs without it.
    fence: fence::Fence,
    /// The hold ([`fence::Fence::term`]) the namespaces' watches were started under: a
    /// namespace of an earlier hold is dropped at the next use ([`Inner::spaces`]).
    held_as: Mutex<Option<u64>>,
    settings: WatchSettings,
    metrics: Arc<Metrics>,
    namespaces: Mutex<HashMap<String, Arc<Namespace>>>,
    total: Arc<AtomicUsize>,
    access: Arc<access::AccessCache>,
    sweeper: std::sync::Once,
    /// Ends, when dropped with the cache, the task that starts the namespaces over at every
    /// change of hold ([`WatchCache::follow_fence`]).
    follower: std::sync::OnceLock<tokio::sync::oneshot::Sender<()>>,
}

impl Inner {
    fn route(&self) -> kind::Route {
        kind::Route {
            client: self.client.clone(),
            streams: self.streams.clone(),
            circuit: self.circuit.clone(),
            fence: self.fence.clone(),
        }
    }

    /// The namespaces, after dropping those watched under another hold of the connection
    /// than the current one (their watches stopped when it was lost).
    fn spaces(&self) -> MutexGuard<'_, HashMap<String, Arc<Namespace>>> {
        let mut spaces = lock(&self.namespaces);
        let now = self.fence.term();
        let mut held_as = lock(&self.held_as);
        if *held_as != now {
            if !spaces.is_empty() {
                tracing::info!(from = ?*held_as, to = ?now, "watch cache: the connection's hold changed; its namespaces start over");
            }
            spaces.clear();
            *held_as = now;
        }
        spaces
    }
}

struct Namespace {
    kinds: Mutex<HashMap<ApiKind, Arc<KindWatch>>>,
    last_read: Mutex<Instant>,
    /// Every change to the namespace's kinds, for [`WatchCache::changes`].
    changes: tokio::sync::broadcast::Sender<Arc<KindChange>>,
    /// Moves on after every change to what a view of the namespace reads ([`KindWatch`]).
    generation: Arc<AtomicU64>,
    /// Groups assembled lately, each with the generation it was read at ([`Memo`]).
    groups: Mutex<Vec<Memo>>,
    /// One assembly at a time: viewers that arrive together after a change wait for the first
    /// one's group instead of each assembling the same.
    assembling: tokio::sync::Mutex<()>,
    /// The Events as the timeline last read them ([`timeline`]).
    timeline: Mutex<timeline::Memo>,
}

/// An assembled group, and what it was assembled from besides the namespace's objects.
struct Memo {
    key: GroupKey,
    generation: u64,
    group: Arc<ResourceGroup>,
}

/// What a group depends on beyond the cached objects: two views with equal keys at the same
/// generation get the same answer. The identity is not in it, only what it may see: the
/// access decision of every kind (refusals carry their message), so users with the same
/// rights share a group and users with different rights never do.
struct GroupKey {
    label_selector: String,
    /// Which discovery the kinds, their order and the unavailable APIs come from.
    discovery: u64,
    kinds: Arc<[ApiKind]>,
    /// Per watched kind (the discovered watchable ones, then the Events): its refusal, if
    /// refused.
    refusals: Vec<Option<Failure>>,
    /// The kinds left out as the connection's own identity may not list them, named.
    warning: Option<String>,
    events_per_resource: usize,
    /// The user's health scripts, compared by identity (they do not change while loaded).
    custom: Arc<Customizations>,
}

impl PartialEq for GroupKey {
    fn eq(&self, other: &Self) -> bool {
        self.label_selector == other.label_selector
            && self.discovery == other.discovery
            && self.events_per_resource == other.events_per_resource
            && Arc::ptr_eq(&self.custom, &other.custom)
            && (Arc::ptr_eq(&self.kinds, &other.kinds) || self.kinds == other.kinds)
            && self.refusals == other.refusals
            && self.warning == other.warning
    }
}

/// Groups kept per namespace: one per selector and set of rights in use, the rest dropped
/// oldest first.
const GROUPS_KEPT: usize = 16;

/// Changes a listener may fall behind by before it is told it lagged (and reads again). A
/// broadcast holds all its slots from the start (32 bytes each), for as long as the namespace
/// is watched: 128 are 4 KiB a namespace (512 were 16 KiB, ~6 B of every kept object in the
/// organization bench, BENCHMARKS.md, session 24). A listener that lags reads again (a feed
/// its group, as after any change, at most every 100 ms; GitLab's watch API the kind, sending
/// what differs from what it sent): only a burst of more than 128 changes in the namespace
/// between two reads costs that read.
const CHANGE_BACKLOG: usize = 128;

impl Namespace {
    fn new() -> Arc<Namespace> {
        Arc::new(Namespace {
            kinds: Mutex::new(HashMap::new()),
            last_read: Mutex::new(Instant::now()),
            changes: tokio::sync::broadcast::channel(CHANGE_BACKLOG).0,
            generation: Arc::new(AtomicU64::new(0)),
            groups: Mutex::new(Vec::new()),
            assembling: tokio::sync::Mutex::new(()),
            timeline: Mutex::new(timeline::Memo::default()),
        })
    }

    /// The group of `key` assembled at `generation`, if kept.
    fn group(&self, key: &GroupKey, generation: u64) -> Option<Arc<ResourceGroup>> {
        lock(&self.groups)
            .iter()
            .find(|m| m.generation == generation && m.key == *key)
            .map(|m| m.group.clone())
    }

    /// Keeps `group`, read at `generation`; groups read earlier are out of date and go.
    fn keep(&self, key: GroupKey, generation: u64, group: Arc<ResourceGroup>) {
        let mut groups = lock(&self.groups);
        groups.retain(|m| m.generation >= generation && m.key != key);
        if groups.len() >= GROUPS_KEPT {
            groups.remove(0);
        }
        groups.push(Memo {
            key,
            generation,
            group,
        });
    }

    /// A namespace somebody listens to is in use even when nobody reads it.
    fn listened(&self) -> bool {
        self.changes.receiver_count() > 0
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl WatchCache {
    /// A cache whose lists and reviews go through `client`, and whose watch streams go
    /// through `streams`: a client of the same cluster with a connection pool of its own.
    ///
    /// A connection's HTTP read buffer grows to the largest body it carried and is never
    /// shrunk. A watch on a connection that carried a list page would keep that page's buffer
    /// for as long as it runs: 41 watches a namespace, ~1.6 MiB held for nothing
    /// (BENCHMARKS.md). So no watch ever runs on a list's connection: the streams' connections
    /// only carry events, and a list's connection goes back to `client`'s pool, where the next
    /// lists (the next namespace's first view) find it open, and which closes it, its buffer
    /// with it, once unused for a moment ([`crate::k8s::connection::client_builder`]: bounded
    /// in time and number).
    pub fn new(
        client: kube::Client,
        streams: kube::Client,
        settings: WatchSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self::on_circuit(client, streams, Circuit::default(), settings, metrics)
    }

    /// As [`WatchCache::new`], for a connection with a circuit ([`crate::k8s::circuit`]):
    /// while it is open the kinds' requests fail at once and they back off; its closing ends
    /// their wait.
    pub fn on_circuit(
        client: kube::Client,
        streams: kube::Client,
        circuit: Circuit,
        settings: WatchSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self::held_by(
            client,
            streams,
            circuit,
            fence::Fence::always(),
            settings,
            metrics,
        )
    }

    /// As [`WatchCache::on_circuit`], for a connection shared with other replicas: its
    /// watches run only while `fence` is held ([`fence`]); meanwhile every view is listed
    /// fresh, as with the cache off.
    pub fn held_by(
        client: kube::Client,
        streams: kube::Client,
        circuit: Circuit,
        fence: fence::Fence,
        settings: WatchSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        WatchCache {
            inner: Arc::new(Inner {
                client,
                streams,
                circuit,
                held_as: Mutex::new(fence.term()),
                fence,
                access: Arc::new(access::AccessCache::new(settings.access_ttl)),
                settings,
                metrics,
                namespaces: Mutex::new(HashMap::new()),
                total: Arc::new(AtomicUsize::new(0)),
                sweeper: std::sync::Once::new(),
                follower: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Whether the cache keeps anything: `kubernetes.cache_max_objects: 0` turns it off, and
    /// every view is then listed fresh.
    pub fn enabled(&self) -> bool {
        self.inner.settings.max_objects > 0 && self.held()
    }

    /// Whether this replica holds the connection's watches now ([`fence`]).
    pub fn held(&self) -> bool {
        self.inner.fence.generation().is_some()
    }

    /// The metrics the cache counts into.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// How long a namespace nobody reads keeps its watches (`kubernetes.cache_idle`).
    pub fn idle(&self) -> Duration {
        self.inner.settings.idle
    }

    /// Objects held now, across namespaces.
    pub fn objects(&self) -> usize {
        self.inner.total.load(Ordering::Relaxed)
    }

    /// Namespaces watched now (not the cluster scope, [`CLUSTER_SCOPE`]).
    pub fn namespaces(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .inner
            .spaces()
            .keys()
            .filter(|name| name.as_str() != CLUSTER_SCOPE)
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// Every change to `namespace`'s cached kinds from now on. Subscribe first, then read
    /// ([`Self::list_resource_group`] starts the watches): nothing falls between the two. While
    /// the receiver lives, the namespace neither goes idle nor is dropped for the bound (which
    /// drops only namespaces nobody listens to). A receiver that lags (`RecvError::Lagged`)
    /// must read the group again.
    pub fn changes(&self, namespace: &str) -> tokio::sync::broadcast::Receiver<Arc<KindChange>> {
        self.start_sweeper();
        self.follow_fence();
        self.inner
            .spaces()
            .entry(namespace.to_owned())
            .or_insert_with(Namespace::new)
            .changes
            .subscribe()
    }

    /// The namespace's Kubernetes Events for the environment's timeline (SPEC 17), newest
    /// first, each once: `None` unless a view of the namespace started their watch and it has
    /// listed. Whoever shows them checks first that the viewer may see them (a view of the
    /// group as the viewer, whose errors name a refused `v1 Event`).
    pub fn timeline(&self, namespace: &str) -> Option<Arc<crate::resources::timeline::Events>> {
        let ns = self.inner.spaces().get(namespace)?.clone();
        let watch = lock(&ns.kinds).get(&events_kind())?.clone();
        if !matches!(*watch.phase.borrow(), Phase::Synced) {
            return None;
        }
        // The generation first: objects newer than it are never paired with an older one.
        let generation = ns.generation.load(Ordering::Acquire);
        let objects = watch.objects();
        let events = lock(&ns.timeline).read(generation, objects);
        Some(events)
    }

    /// The resource group of `label_selector` in `namespace`, from the cache: the same answer
    /// as [`fetch::list_resource_group`] with the same arguments. The first read of a namespace
    /// starts its watches and waits (up to `options.request_timeout`) for their first lists; a
    /// kind still without one then is reported as failing. A selector that is not made of
    /// equality terms is listed fresh (the cache would have to evaluate it), and so is every
    /// view when the cache is off ([`Self::enabled`]).
    pub async fn list_resource_group(
        &self,
        discovery: &DiscoveryCache,
        headers: &HeaderMap,
        namespace: &str,
        label_selector: &str,
        options: &FetchOptions,
    ) -> Result<Listing, FetchError> {
        match self
            .prepare(discovery, headers, namespace, label_selector, options)
            .await?
        {
            None => {
                fetch::list_resource_group(
                    &self.inner.client,
                    discovery,
                    headers,
                    namespace,
                    label_selector,
                    options,
                )
                .await
            }
            Some(view) => {
                self.listing(
                    &view,
                    discovery,
                    headers,
                    namespace,
                    label_selector,
                    options,
                )
                .await
            }
        }
    }

    /// The assembled group ([`group::assemble`]) of what [`Self::list_resource_group`] lists,
    /// shared: a view of a namespace where nothing changed since an earlier view with the same
    /// selector and the same rights is answered with that view's group, neither listed nor
    /// assembled again. Any change the cache applies to the namespace (an object, a kind's
    /// list, a watch failing or recovering), a new discovery or other access decisions make
    /// the next view assemble afresh. Views that the cache does not answer whole (a selector
    /// it cannot evaluate, the cache off, kinds that cannot be watched and are listed as the
    /// user each time) are assembled every time.
    pub async fn resource_group(
        &self,
        discovery: &DiscoveryCache,
        headers: &HeaderMap,
        namespace: &str,
        label_selector: &str,
        options: &FetchOptions,
        custom: &Arc<Customizations>,
    ) -> Result<Arc<ResourceGroup>, FetchError> {
        self.resource_group_kept(
            discovery,
            headers,
            namespace,
            label_selector,
            options,
            custom,
            true,
        )
        .await
    }

    /// [`Self::resource_group`], keeping what it assembles for the next views only if `keep`:
    /// a reader that nobody else waits on (a feed that only records health, SPEC 18) takes a
    /// group kept for a view, but leaves none of its own. A namespace keeps up to 16 groups
    /// (some 19 KB each for 20 objects), which a health keeper's feeds, one per environment,
    /// would otherwise fill and hold at rest in every namespace it keeps (BENCHMARKS.md).
    #[allow(clippy::too_many_arguments)]
    pub async fn resource_group_kept(
        &self,
        discovery: &DiscoveryCache,
        headers: &HeaderMap,
        namespace: &str,
        label_selector: &str,
        options: &FetchOptions,
        custom: &Arc<Customizations>,
        keep: bool,
    ) -> Result<Arc<ResourceGroup>, FetchError> {
        let Some(view) = self
            .prepare(discovery, headers, namespace, label_selector, options)
            .await?
        else {
            let listing = fetch::list_resource_group(
                &self.inner.client,
                discovery,
                headers,
                namespace,
                label_selector,
                options,
            )
            .await?;
            return Ok(assemble(listing, custom).await);
        };
        self.group_of(
            view,
            discovery,
            headers,
            namespace,
            label_selector,
            options,
            custom,
            keep,
        )
        .await
    }

    /// The group of a prepared view: the memoised one while nothing changed, else assembled
    /// (and kept if `keep`). A view with kinds listed fresh (unwatchable, or behind the cluster
    /// at a consistent read) is assembled every time.
    #[allow(clippy::too_many_arguments)]
    async fn group_of(
        &self,
        view: Prepared,
        discovery: &DiscoveryCache,
        headers: &HeaderMap,
        namespace: &str,
        label_selector: &str,
        options: &FetchOptions,
        custom: &Arc<Customizations>,
        keep: bool,
    ) -> Result<Arc<ResourceGroup>, FetchError> {
        if view.unwatched || !view.fresh.is_empty() {
            let listing = self
                .listing(
                    &view,
                    discovery,
                    headers,
                    namespace,
                    label_selector,
                    options,
                )
                .await?;
            return Ok(assemble(listing, custom).await);
        }
        let key = GroupKey {
            label_selector: label_selector.to_owned(),
            discovery: view.discovered.generation,
            kinds: view.discovered.kinds.clone(),
            refusals: view.refusals.clone(),
            warning: view.warning.clone(),
            events_per_resource: options.events_per_resource,
            custom: custom.clone(),
        };
        let ns = view.namespace.clone();
        // The generation is read before the objects: a change after this read moves it on,
        // and the group kept below is then never reused.
        if let Some(group) = ns.group(&key, ns.generation.load(Ordering::Acquire)) {
            return Ok(group);
        }
        let _assembling = ns.assembling.lock().await;
        let generation = ns.generation.load(Ordering::Acquire);
        if let Some(group) = ns.group(&key, generation) {
            return Ok(group);
        }
        let listing = self
            .listing(
                &view,
                discovery,
                headers,
                namespace,
                label_selector,
                options,
            )
            .await?;
        // A kind that answered 404 made discovery start over: the next view is asked anew.
        let kind_gone = listing.errors.iter().any(|e| e.code == Some(404));
        let group = assemble(listing, custom).await;
        if keep && !kind_gone {
            ns.keep(key, generation, group.clone());
        }
        Ok(group)
    }

    /// [`Self::resource_group`] as a consistent read: at least as new as the cluster when it
    /// is called, as a fresh list would be (see [`consistent`]). For each list the group needs,
    /// the server's names and versions of its selection (metadata only) are compared with the
    /// cache's; the read waits, at most `within`, for the cache to hold them, and lists fresh
    /// the kinds still behind. Costs a metadata list per kind over the cached read; the
    /// deployment history reads so at a success hook, where the deployment's own writes must
    /// be in what it keeps.
    #[allow(clippy::too_many_arguments)]
    pub async fn resource_group_consistent(
        &self,
        discovery: &DiscoveryCache,
        headers: &HeaderMap,
        namespace: &str,
        label_selector: &str,
        options: &FetchOptions,
        custom: &Arc<Customizations>,
        within: Duration,
    ) -> Result<Arc<ResourceGroup>, FetchError> {
        // Subscribed before the watches are read: no change falls between.
        let mut changes = self.changes(namespace);
        let Some(mut view) = self
            .prepare(discovery, headers, namespace, label_selector, options)
            .await?
        else {
            // Listed fresh anyway.
            return self
                .resource_group(
                    discovery,
                    headers,
                    namespace,
                    label_selector,
                    options,
                    custom,
                )
                .await;
        };
        let by_type: HashMap<(String, String), &Arc<KindWatch>> = view
            .watches
            .iter()
            .filter(|w| matches!(*w.phase.borrow(), Phase::Synced))
            .map(|w| ((w.kind.api_version(), w.kind.kind.clone()), w))
            .collect();
        let jobs = fetch::plan(
            &view.discovered.kinds,
            namespace,
            label_selector,
            Some(view.terms.clone()),
        );
        let checked: Vec<(&Job, &Arc<KindWatch>)> = jobs
            .iter()
            .filter(|job| job.purpose != Purpose::Events)
            .filter_map(|job| {
                by_type
                    .get(&(job.api_version.clone(), job.kind.clone()))
                    .map(|w| (job, *w))
            })
            .collect();
        let limit = Arc::new(tokio::sync::Semaphore::new(options.max_in_flight.max(1)));
        let shared = Arc::new(headers.clone());
        let mut lists = tokio::task::JoinSet::new();
        for (i, (job, _)) in checked.iter().enumerate() {
            let (limit, headers, client, job) = (
                limit.clone(),
                shared.clone(),
                self.inner.client.clone(),
                (*job).clone(),
            );
            let (page_size, agent, timeout) = (
                options.page_size.max(1),
                options.agent,
                options.request_timeout,
            );
            lists.spawn(async move {
                let _slot = limit.acquire().await;
                let versions =
                    consistent::server_versions(&client, &headers, &job, page_size, agent, timeout)
                        .await;
                (i, versions)
            });
        }
        let mut server: Vec<Option<consistent::ServerVersions>> = vec![None; checked.len()];
        while let Some(joined) = lists.join_next().await {
            if let Ok((i, Ok(versions))) = joined {
                server[i] = Some(versions);
            }
        }
        // A kind whose metadata list failed cannot be shown to be current: listed fresh (its
        // failure, if it fails again, is reported as any list's).
        let mut behind: Vec<(&Job, &Arc<KindWatch>, Option<consistent::ServerVersions>)> = checked
            .into_iter()
            .zip(server)
            .map(|((job, watch), versions)| (job, watch, versions))
            .collect();
        // What the read waits for comes with the watches: a first view's may start now.
        view.done.release();
        let deadline = tokio::time::Instant::now() + within;
        loop {
            behind.retain(|(job, watch, server)| match server {
                Some(server) => !consistent::caught_up(server, &cached_versions(job, watch)),
                None => true,
            });
            if behind.iter().all(|(_, _, server)| server.is_none()) {
                break;
            }
            // Any change in the namespace may be the one awaited; a lagging listener looks
            // again just the same.
            match tokio::time::timeout_at(deadline, changes.recv()).await {
                Err(_) => break,
                Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => break,
                Ok(_) => {}
            }
        }
        drop(changes);
        view.fresh = behind
            .iter()
            .map(|(job, _, _)| (job.api_version.clone(), job.kind.clone()))
            .collect();
        if !view.fresh.is_empty() {
            tracing::debug!(
                namespace,
                kinds = view.fresh.len(),
                "watch cache: behind the cluster after the wait; those kinds are listed fresh"
            );
        }
        self.group_of(
            view,
            discovery,
            headers,
            namespace,
            label_selector,
            options,
            custom,
            true,
        )
        .await
    }

    /// Everything a view from the cache reads but the objects: discovery, the namespace's
    /// watches of every discovered kind (started where missing, waited for until synced) and
    /// the identity's access to each. `None` when the cache does not answer this view.
    async fn prepare(
        &self,
        discovery: &DiscoveryCache,
        headers: &HeaderMap,
        namespace: &str,
        label_selector: &str,
        options: &FetchOptions,
    ) -> Result<Option<Prepared>, FetchError> {
        if namespace.is_empty() {
            return Err(FetchError::NoNamespace);
        }
        let terms = fetch::equality_terms(label_selector).filter(|_| self.enabled());
        let Some(terms) = terms else {
            return Ok(None);
        };
        // The watches run as the connection's own identity, whoever views: only the kinds it
        // may list and watch in the namespace are watched. Its rules are asked beside
        // discovery, not after it, and (but for `in_cluster`, [`own_rules`]) a namespace not
        // reviewed yet has its first lists sent beside the review too: through KAS each is a
        // round trip a first view would otherwise wait for before its lists.
        let own = discovery.own_rules();
        let lists_first = own.lists_first(namespace);
        let review = {
            let (own, namespace, timeout) =
                (own.clone(), namespace.to_owned(), options.request_timeout);
            let cause = headers.get(AUDIT_ID_HEADER).cloned();
            observe::within(cause, async move { own.get(&namespace, timeout).await })
        };
        let cause = headers.get(AUDIT_ID_HEADER);
        let (discovered, rules, kinds, (ns, watches, done)) = match lists_first {
            false => {
                let (discovered, rules) =
                    tokio::join!(observe::caused_by(headers, discovery.kinds()), review);
                let discovered = discovered?;
                let kinds = watched_kinds(&discovered, rules.as_deref());
                let started = self.watch(namespace, &kinds, options.page_size.max(1), cause);
                (discovered, rules, kinds, started)
            }
            true => {
                // The review in a task of its own: the lists start before it answers.
                let review = tokio::spawn(review);
                let discovered = observe::caused_by(headers, discovery.kinds()).await?;
                // Every kind's first list goes now; the watches wait for the view anyway.
                let all = watched_kinds(&discovered, None);
                let (ns, watches, done) =
                    self.watch(namespace, &all, options.page_size.max(1), cause);
                // What the rules refuse is dropped before anything of it is shown or watched
                // (a refused first list is the identity's 403, nothing more): in a task of its
                // own, holding the view's watches, so that a view that goes away meanwhile
                // still lets none of them start before the review answers.
                let narrowing = {
                    let (ns, discovered) = (ns.clone(), discovered.clone());
                    tokio::spawn(async move {
                        let rules = review.await.unwrap_or(None);
                        let kinds = watched_kinds(&discovered, rules.as_deref());
                        lock(&ns.kinds).retain(|k, _| kinds.contains(k));
                        (rules, kinds, done)
                    })
                };
                let (rules, kinds, done) = narrowing.await.map_err(|e| {
                    FetchError::Unreachable(format!("the rules review did not finish: {e}"))
                })?;
                let watches = watches
                    .into_iter()
                    .filter(|w| kinds.contains(&w.kind))
                    .collect();
                (discovered, rules, kinds, (ns, watches, done))
            }
        };
        let events_watched = kinds.contains(&events_kind());
        let watched = |k: &ApiKind| k.watchable && own_rules::may_watch(rules.as_deref(), k);
        self.bound(namespace);
        // The viewer's access reviews are sent beside the lists, not after them: through GitLab's
        // agent server each is a round trip a first view would otherwise wait for after its
        // slowest list. Nothing is shown before both are in.
        let ((), refusals) = tokio::join!(
            wait_synced(&watches, options.request_timeout),
            self.access(headers, namespace, &kinds, options.request_timeout)
        );
        // As the connection's own identity, the kinds it may not list are left out (and named);
        // as a user, the kinds not watched are listed fresh with the user's own rights.
        let view = if own_rules::is_own_identity(headers) {
            OwnView::new(rules.as_deref(), discovered, namespace)
        } else {
            OwnView::all(discovered)
        };
        let unwatched =
            view.discovered.kinds.iter().any(|k| !watched(k)) || (view.events && !events_watched);
        Ok(Some(Prepared {
            namespace: ns,
            discovered: view.discovered,
            events: view.events,
            warning: view.warning,
            terms,
            watches,
            refusals,
            unwatched,
            fresh: HashSet::new(),
            done,
        }))
    }

    /// The listing of a prepared view: the cached objects of each job, the unwatched kinds
    /// listed fresh, the failing watches reported.
    async fn listing(
        &self,
        view: &Prepared,
        discovery: &DiscoveryCache,
        headers: &HeaderMap,
        namespace: &str,
        label_selector: &str,
        options: &FetchOptions,
    ) -> Result<Listing, FetchError> {
        let Prepared {
            discovered,
            events,
            warning,
            terms,
            watches,
            refusals,
            fresh,
            ..
        } = view;
        let by_type: HashMap<(String, String), WatchAccess<'_>> = watches
            .iter()
            .zip(refusals)
            .map(|(w, refused)| ((w.kind.api_version(), w.kind.kind.clone()), (w, refused)))
            .filter(|(key, _)| !fresh.contains(key))
            .collect();
        let mut jobs = fetch::plan(
            &discovered.kinds,
            namespace,
            label_selector,
            Some(terms.clone()),
        );
        if !events {
            jobs.retain(|job| job.purpose != Purpose::Events);
        }
        // Kinds that are not watched are listed fresh, as the user, for every view.
        let unwatched: Vec<Job> = jobs
            .iter()
            .filter(|job| !by_type.contains_key(&(job.api_version.clone(), job.kind.clone())))
            .cloned()
            .collect();
        let mut listed = fetch::run(&self.inner.client, headers, &unwatched, options)
            .await
            .into_iter();
        let outcomes = jobs
            .iter()
            .map(
                |job| match by_type.get(&(job.api_version.clone(), job.kind.clone())) {
                    None => listed.next().unwrap_or_else(|| {
                        Err(Failure {
                            code: None,
                            message: "the list stopped unexpectedly".into(),
                            answered: false,
                        })
                    }),
                    Some((_, Some(refused))) => Err(refused.clone()),
                    Some((watch, None)) => outcome(job, watch),
                },
            )
            .collect();
        let mut listing = fetch::into_listing(
            &jobs,
            outcomes,
            discovered,
            discovery,
            namespace,
            label_selector,
            options,
        )
        .await?;
        listing.warnings.extend(warning.clone());
        // Kinds whose watch is failing: their last known objects are shown, with the error
        // and since when they are out of date.
        let mut stale: Vec<_> = by_type
            .values()
            .filter(|(watch, refused)| {
                refused.is_none() && matches!(*watch.phase.borrow(), Phase::Synced)
            })
            .filter_map(|(watch, _)| watch.stale().map(|s| (watch.kind.clone(), s)))
            .collect();
        stale.sort_by(|a, b| a.0.cmp(&b.0));
        for (kind, (since, failure)) in stale {
            listing.warnings.push(format!(
                "{} {} may be out of date: its watch has been failing since {}",
                kind.api_version(),
                kind.kind,
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ));
            listing.errors.push(ListError {
                api_version: kind.api_version(),
                kind: kind.kind,
                code: failure.code,
                message: failure.message,
            });
        }
        listing.errors.sort();
        listing
            .errors
            .dedup_by(|a, b| a.api_version == b.api_version && a.kind == b.kind);
        Ok(listing)
    }

    /// The namespace and its watches of `kinds`, in that order: started where missing, the
    /// namespace marked read now, watches of kinds no longer discovered stopped.
    ///
    /// Watches started here send their first watch only once the returned sender says the
    /// view is done (or is dropped): see [`kind::FirstList`].
    fn watch(
        &self,
        namespace: &str,
        kinds: &[ApiKind],
        page_size: usize,
        cause: Option<&HeaderValue>,
    ) -> (Arc<Namespace>, Vec<Arc<KindWatch>>, ViewDone) {
        let (done, watch_after) = tokio::sync::watch::channel(false);
        self.start_sweeper();
        let (ns, watches) = self.watch_more(namespace, kinds, page_size, cause, Some(&watch_after));
        // Every kind of `kinds` (discovery's, each once) is watched now: any more are kinds no
        // longer wanted. Counted rather than each searched for in `kinds` (a warm view of a
        // GitOps group comes here for seven namespaces of some thirty kinds).
        let mut watched = lock(&ns.kinds);
        if watched.len() > kinds.len() {
            watched.retain(|k, _| kinds.contains(k));
        }
        drop(watched);
        (ns, watches, ViewDone(done))
    }

    /// Drops the namespaces read least recently (never `reading`, never one listened to) while
    /// over the bound.
    fn bound(&self, reading: &str) {
        let max = self.inner.settings.max_objects;
        while self.objects() > max {
            let mut namespaces = lock(&self.inner.namespaces);
            let oldest = namespaces
                .iter()
                .filter(|(name, ns)| name.as_str() != reading && !ns.listened())
                .min_by_key(|(_, ns)| *lock(&ns.last_read))
                .map(|(name, _)| name.clone());
            match oldest {
                Some(name) => {
                    tracing::info!(namespace = %name, objects = self.objects(), max, "watch cache full: dropping the namespace read least recently");
                    namespaces.remove(&name);
                }
                None => break,
            }
        }
    }

    /// Starts, once, the task that drops the namespaces as soon as the connection is held
    /// under a new hold ([`fence::Fence::term_changed`]): again after a loss or a handover.
    /// Dropping a namespace closes its change feed, so whoever listens (a subscription's feed,
    /// the health keeper's recorders) subscribes again and reads the group: under a new hold,
    /// that read starts its watches. Without it a listener would wait on a namespace of the
    /// old hold, whose watches stopped, until something else read it.
    fn follow_fence(&self) {
        self.inner.follower.get_or_init(|| {
            let (tx, mut gone) = tokio::sync::oneshot::channel::<()>();
            let weak: Weak<Inner> = Arc::downgrade(&self.inner);
            let fence = self.inner.fence.clone();
            let mut term = *lock(&self.inner.held_as);
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = &mut gone => return,
                        () = fence.term_changed(term) => {}
                    }
                    if fence.term().is_none() {
                        // Lost: each watch told its readers as it stopped (they read fresh
                        // meanwhile); the namespaces go once it is held again.
                        term = None;
                        continue;
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    // `spaces` drops the namespaces of another term than the fence's.
                    let spaces = inner.spaces();
                    term = *lock(&inner.held_as);
                    drop(spaces);
                }
            });
            tx
        });
    }

    /// Stops the watches of namespaces unread for `idle`, checking a few times per `idle`.
    fn start_sweeper(&self) {
        self.inner.sweeper.call_once(|| {
            let weak: Weak<Inner> = Arc::downgrade(&self.inner);
            let idle = self.inner.settings.idle;
            let every = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(60));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let Some(inner) = weak.upgrade() else { return };
                    lock(&inner.namespaces).retain(|name, ns| {
                        let keep = ns.listened() || lock(&ns.last_read).elapsed() < idle;
                        if !keep {
                            tracing::debug!(namespace = %name, "watch cache: idle namespace dropped");
                        }
                        keep
                    });
                }
            });
        });
    }
}

/// The key of the cluster-scoped kinds' watches among the namespaces (no namespace is named
/// so): they start, go idle, count towards the bound and move a generation as a namespace's do.
pub const CLUSTER_SCOPE: &str = "";

/// What a view of one namespace from the cache depends on: equal stamps, equal answers. A
/// group made of several namespaces' views (a GitOps group, [`crate::k8s::gitops`]) is the
/// same while the stamps of all of them are.
#[derive(Debug, Clone, PartialEq)]
pub struct Stamp {
    generation: u64,
    discovery: u64,
    refusals: Vec<Option<Failure>>,
    warning: Option<String>,
}

/// One kind's cached objects in one namespace, for a watcher of that kind alone (GitLab's
/// watch API, [`crate::k8s::watch_api`]). Holding it keeps the kind's watch running.
pub struct KindView {
    watch: Arc<KindWatch>,
}

impl KindView {
    pub fn kind(&self) -> &ApiKind {
        &self.watch.kind
    }

    /// The objects now, in name order, shared with the cache; or why there are none to show
    /// (the kind's list failed, or has not answered yet).
    pub(crate) fn objects(&self) -> Result<Vec<Arc<Object>>, Failure> {
        match &*self.watch.phase.borrow() {
            Phase::Pending => Err(Failure {
                code: None,
                message: "the watch cache has not listed this kind yet".into(),
                answered: false,
            }),
            Phase::Failed(failure) => Err(failure.clone()),
            Phase::Synced => Ok(self.watch.objects()),
        }
    }

    /// The object named `name` now, `None` when there is none; or why the kind has no
    /// objects to show (as [`Self::objects`]).
    pub(crate) fn object(&self, name: &str) -> Result<Option<Arc<Object>>, Failure> {
        match &*self.watch.phase.borrow() {
            Phase::Synced => Ok(self.watch.object(name)),
            _ => self.objects().map(|_| None),
        }
    }

    /// Waits (at most `timeout`) for the kind's first list.
    pub async fn synced(&self, timeout: Duration) {
        wait_synced(std::slice::from_ref(&self.watch), timeout).await;
    }
}

impl WatchCache {
    /// For each of `kinds`, `None` when the identity that `headers` impersonate may list and
    /// watch it in `namespace` now, else the refusal (or why there is no decision): the
    /// decisions every view of the cache is shown by ([`access`]), reused for
    /// `kubernetes.access_cache`. Without impersonation (the agent's own identity) every kind
    /// is allowed. Whatever shows a kind's resources to a viewer (a view, the deployment
    /// history) asks here.
    pub(crate) async fn access(
        &self,
        headers: &HeaderMap,
        namespace: &str,
        kinds: &[ApiKind],
        timeout: Duration,
    ) -> Vec<Option<Failure>> {
        match access::Identity::from_headers(headers) {
            Some(who) => {
                self.inner
                    .access
                    .check(&self.inner.client, &who, namespace, kinds, headers, timeout)
                    .await
            }
            None => vec![None; kinds.len()],
        }
    }

    /// `kind` in `namespace` from the cache, watched from now on if it was not: for a reader
    /// of that one kind. A kind the connection's own identity may not list and watch there
    /// ([`own_rules`]) is refused without a request. With impersonation headers, the cluster's `SubjectAccessReview` for
    /// that identity must allow `list` and `watch` first (as for a resource group); a refusal
    /// is the failure to report. Subscribe to [`Self::changes`] before, so nothing falls
    /// between the objects read and the changes that follow.
    pub(crate) async fn view_kind(
        &self,
        discovery: &DiscoveryCache,
        headers: &HeaderMap,
        namespace: &str,
        kind: &ApiKind,
        page_size: usize,
        timeout: Duration,
    ) -> Result<KindView, Failure> {
        if !self.held() {
            return Err(Failure {
                code: Some(503),
                message: kind::NOT_HELD.into(),
                answered: false,
            });
        }
        // The watch runs as the connection's own identity: never one it would refuse.
        let rules =
            observe::caused_by(headers, discovery.own_rules().get(namespace, timeout)).await;
        if !own_rules::may_watch(rules.as_deref(), kind) {
            return Err(Failure {
                code: Some(403),
                message: format!(
                    "envlens may not list and watch {} in namespace {namespace}",
                    own_rules::resource_name(kind)
                ),
                answered: true,
            });
        }
        self.watch_one(headers, namespace, kind, page_size, timeout)
            .await
    }
}

impl WatchCache {
    /// What a view of `namespace` from the cache ([`Self::list_resource_group`]) reads now,
    /// beside the objects' generation: the same preparation, so its watches are started and
    /// the namespace marked read. `None` when the cache does not answer such a view whole (off,
    /// or kinds listed fresh each time): nothing read then can be reused. Taken before the
    /// listing it stands for, a later change makes it differ from the next one.
    pub async fn stamp(
        &self,
        discovery: &DiscoveryCache,
        headers: &HeaderMap,
        namespace: &str,
        options: &FetchOptions,
    ) -> Result<Option<Stamp>, FetchError> {
        let Some(view) = self
            .prepare(discovery, headers, namespace, "", options)
            .await?
        else {
            return Ok(None);
        };
        if view.unwatched {
            return Ok(None);
        }
        Ok(Some(Stamp {
            generation: view.namespace.generation.load(Ordering::Acquire),
            discovery: view.discovered.generation,
            refusals: view.refusals,
            warning: view.warning,
        }))
    }

    /// [`Self::stamp`] and the unselected [`Self::list_resource_group`] of `namespace` from one
    /// preparation, for a view made of several namespaces' (a GitOps group,
    /// [`crate::k8s::gitops`]): the watches this listing started send their first watch only
    /// once the returned [`Held`] is dropped, when the whole view is answered, not while the
    /// other namespaces' lists are still coming.
    pub async fn stamped_listing(
        &self,
        discovery: &DiscoveryCache,
        headers: &HeaderMap,
        namespace: &str,
        options: &FetchOptions,
    ) -> Result<(Option<Stamp>, Listing, Held), FetchError> {
        let Some(view) = self
            .prepare(discovery, headers, namespace, "", options)
            .instrument(tracing::debug_span!("watch.prepare"))
            .await?
        else {
            let listing = fetch::list_resource_group(
                &self.inner.client,
                discovery,
                headers,
                namespace,
                "",
                options,
            )
            .await?;
            return Ok((None, listing, Held { _done: None }));
        };
        // Taken before the objects are read, as [`Self::stamp`] is before its listing.
        let stamp = (!view.unwatched).then(|| Stamp {
            generation: view.namespace.generation.load(Ordering::Acquire),
            discovery: view.discovered.generation,
            refusals: view.refusals.clone(),
            warning: view.warning.clone(),
        });
        let listing = self
            .listing(&view, discovery, headers, namespace, "", options)
            .instrument(tracing::debug_span!("watch.listing"))
            .await?;
        Ok((
            stamp,
            listing,
            Held {
                _done: Some(view.done),
            },
        ))
    }

    /// The generation of the cluster-scoped kinds' watches ([`CLUSTER_SCOPE`]), when any runs:
    /// it moves on after every change to any of them.
    pub fn cluster_generation(&self) -> Option<u64> {
        let ns = self.inner.spaces().get(CLUSTER_SCOPE)?.clone();
        let generation = ns.generation.load(Ordering::Acquire);
        Some(generation)
    }

    /// The cluster-scoped `kind` from the cache, watched cluster-wide from now on if it was
    /// not: for a reader of some of its objects by name (a GitOps inventory's Namespaces,
    /// ClusterRoles, CRDs). With impersonation headers the cluster's `SubjectAccessReview` for
    /// that identity must allow `list` and `watch` of the kind first; a refusal, the cache off
    /// or not held is the failure to report (the reader then asks the cluster itself, as the
    /// viewer). The connection's own rules are not asked: a `SelfSubjectRulesReview` has no
    /// cluster scope, and a watch it may not run fails as any list does.
    pub(crate) async fn view_cluster_kind(
        &self,
        headers: &HeaderMap,
        kind: &ApiKind,
        page_size: usize,
        timeout: Duration,
    ) -> Result<KindView, Failure> {
        if !self.enabled() || kind.namespaced || !kind.watchable {
            return Err(Failure {
                code: None,
                message: "the watch cache does not keep this kind".into(),
                answered: false,
            });
        }
        self.watch_one(headers, CLUSTER_SCOPE, kind, page_size, timeout)
            .await
    }

    /// The tail of [`Self::view_kind`] and [`Self::view_cluster_kind`]: the viewer's access
    /// review of `kind` in `namespace` (or [`CLUSTER_SCOPE`]), then its watch, started where
    /// missing.
    async fn watch_one(
        &self,
        headers: &HeaderMap,
        namespace: &str,
        kind: &ApiKind,
        page_size: usize,
        timeout: Duration,
    ) -> Result<KindView, Failure> {
        let decision = self
            .access(headers, namespace, std::slice::from_ref(kind), timeout)
            .await;
        if let Some(Some(refused)) = decision.into_iter().next() {
            return Err(refused);
        }
        self.start_sweeper();
        let (_, watches) = self.watch_more(
            namespace,
            std::slice::from_ref(kind),
            page_size.max(1),
            headers.get(AUDIT_ID_HEADER),
            None,
        );
        self.bound(namespace);
        let watch = watches.into_iter().next().expect("one watch per kind");
        Ok(KindView { watch })
    }

    /// The namespace and its watches of `kinds`, in that order: started where missing, the
    /// namespace marked read now; the watches of other kinds go on (a reader of one kind, the
    /// cluster scope's kinds, which are those its readers asked for, not discovery's). Those
    /// started here send their first watch once `watch_after` says true (or its sender is
    /// dropped), where given: see [`kind::FirstList`].
    fn watch_more(
        &self,
        namespace: &str,
        kinds: &[ApiKind],
        page_size: usize,
        cause: Option<&HeaderValue>,
        watch_after: Option<&tokio::sync::watch::Receiver<bool>>,
    ) -> (Arc<Namespace>, Vec<Arc<KindWatch>>) {
        let known = self.inner.spaces().get(namespace).cloned();
        let ns = known.unwrap_or_else(|| {
            self.inner
                .spaces()
                .entry(namespace.to_owned())
                .or_insert_with(Namespace::new)
                .clone()
        });
        *lock(&ns.last_read) = Instant::now();
        let mut watched = lock(&ns.kinds);
        let watches = kinds
            .iter()
            .map(|kind| {
                // A kind watched already is found without a copy of its name.
                if let Some(watch) = watched.get(kind) {
                    return watch.clone();
                }
                watched
                    .entry(kind.clone())
                    .or_insert_with(|| {
                        KindWatch::start(
                            self.inner.route(),
                            kind::FirstList {
                                cause: cause.cloned(),
                                watch_after: watch_after.cloned(),
                            },
                            kind.clone(),
                            namespace,
                            page_size,
                            ns.changes.clone(),
                            ns.generation.clone(),
                            self.inner.total.clone(),
                            self.inner.metrics.clone(),
                        )
                    })
                    .clone()
            })
            .collect();
        drop(watched);
        (ns, watches)
    }
}

/// The kinds of `discovered` (and the Events) that the cache watches under `rules`.
fn watched_kinds(discovered: &Discovered, rules: Option<&own_rules::Rules>) -> Vec<ApiKind> {
    let watched = |k: &ApiKind| k.watchable && own_rules::may_watch(rules, k);
    let mut kinds: Vec<ApiKind> = discovered
        .kinds
        .iter()
        .filter(|k| watched(k))
        .cloned()
        .collect();
    let events = events_kind();
    if watched(&events) && !kinds.contains(&events) {
        kinds.push(events);
    }
    kinds
}

/// A kind's watch and the identity's refusal of it, if refused.
type WatchAccess<'a> = (&'a Arc<KindWatch>, &'a Option<Failure>);

/// A view the cache answers, read up to its objects ([`WatchCache::resource_group`]).
struct Prepared {
    namespace: Arc<Namespace>,
    /// The discovered kinds the view lists (as the connection's own identity, those it may).
    discovered: Discovered,
    /// Whether the view lists the namespace's Events.
    events: bool,
    /// Names the kinds the connection's own identity may not list here ([`OwnView`]).
    warning: Option<String>,
    /// The selector's terms.
    terms: Vec<(String, String)>,
    /// The watches of the discovered watchable kinds, then the Events.
    watches: Vec<Arc<KindWatch>>,
    /// Per watch: whether the identity is refused its kind, and why.
    refusals: Vec<Option<Failure>>,
    /// Whether some discovered kind cannot be watched, and is listed fresh, as the user.
    unwatched: bool,
    /// Kinds (apiVersion, kind) listed fresh although watched: a consistent read found the
    /// cache behind the cluster for them.
    fresh: HashSet<(String, String)>,
    /// Lets the watches this view started go on once it is dropped, its answer made (or
    /// before, where the view itself waits for them: [`ViewDone::release`]).
    done: ViewDone,
}

/// Says, when dropped, that the view that started some watches is done with their lists.
struct ViewDone(tokio::sync::watch::Sender<bool>);

impl ViewDone {
    /// Lets the watches go on before the view is dropped: a view that waits for them.
    fn release(&self) {
        self.0.send_replace(true);
    }
}

impl Drop for ViewDone {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// Holds back, until dropped, the first watches of the kinds a listing started
/// ([`WatchCache::stamped_listing`]).
pub struct Held {
    _done: Option<ViewDone>,
}

/// Assembles `listing` off the runtime's threads.
async fn assemble(listing: Listing, custom: &Arc<Customizations>) -> Arc<ResourceGroup> {
    let custom = custom.clone();
    crate::k8s::off_runtime(move || Arc::new(group::assemble(listing, &custom))).await
}

/// Waits until every watch has listed once (or failed), at most `timeout`.
async fn wait_synced(watches: &[Arc<KindWatch>], timeout: Duration) {
    let all = async {
        for watch in watches {
            let mut phase = watch.phase.subscribe();
            let _ = phase.wait_for(|p| !matches!(p, Phase::Pending)).await;
        }
    };
    let _ = tokio::time::timeout(timeout, all).await;
}

/// What a job's list would have answered, from the cached objects.
fn outcome(job: &Job, watch: &KindWatch) -> Result<Listed, Failure> {
    match &*watch.phase.borrow() {
        Phase::Pending => {
            return Err(Failure {
                code: None,
                message: "the watch cache has not listed this kind yet".into(),
                answered: false,
            })
        }
        Phase::Failed(failure) => return Err(failure.clone()),
        Phase::Synced => {}
    }
    // Shared with the cache, not copied: the listing copies only what the group keeps.
    let objects = watch.objects();
    let terms = job.local_terms.as_deref().unwrap_or(&[]);
    let picked = |o: &Object| {
        let labels = o
            .view
            .get("metadata")
            .and_then(|m| m.get("labels"))
            .and_then(Tree::as_object);
        fetch::labels_match(terms, labels)
    };
    Ok(match job.purpose {
        Purpose::Selected => {
            // The plan gives a selected list only the selector's terms through `plan`'s
            // argument; every selected job here has an equality selector.
            let terms = fetch::equality_terms(job.label_selector.as_deref().unwrap_or(""))
                .unwrap_or_default();
            Listed::Objects(
                objects
                    .into_iter()
                    .filter(|o| {
                        let labels = o
                            .view
                            .get("metadata")
                            .and_then(|m| m.get("labels"))
                            .and_then(Tree::as_object);
                        fetch::labels_match(&terms, labels)
                    })
                    .collect(),
            )
        }
        Purpose::Unselected => {
            let (selected, rest): (Vec<Arc<Object>>, Vec<Arc<Object>>) = objects
                .into_iter()
                .partition(|o| job.local_terms.is_some() && picked(o));
            Listed::Unselected {
                selected,
                candidates: rest,
            }
        }
        Purpose::Events => Listed::Events(
            objects
                .iter()
                .filter_map(|o| serde_json::from_str(&o.text()).ok())
                .collect(),
        ),
    })
}

/// The cache's names and versions of `job`'s selection: what its list would answer.
fn cached_versions(job: &Job, watch: &KindWatch) -> HashMap<String, String> {
    let terms = match job.purpose {
        Purpose::Selected => {
            fetch::equality_terms(job.label_selector.as_deref().unwrap_or("")).unwrap_or_default()
        }
        Purpose::Unselected | Purpose::Events => Vec::new(),
    };
    watch
        .objects()
        .iter()
        .filter(|o| {
            let labels = o
                .view
                .get("metadata")
                .and_then(|m| m.get("labels"))
                .and_then(Tree::as_object);
            fetch::labels_match(&terms, labels)
        })
        .filter_map(|o| consistent::held_version(&o.text()))
        .collect()
}
