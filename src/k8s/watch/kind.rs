//! One kind's watch in one namespace: list, then watch from the list's `resourceVersion`,
//! applying ADDED, MODIFIED and DELETED to a map by name and moving the version on with every
//! event and BOOKMARK. A stream that ends is resumed from the last version; `410 Gone` (the
//! version left the server's history) relists; any other failure backs off (250 ms doubling to
//! 30 s) and resumes, relisting if the watch was refused (but not when the server was only
//! unavailable: 429, 502, 503, 504). A relist the server cannot answer keeps the objects listed
//! before, shown as out of date; a refused one hides them.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, Request};
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::{broadcast, watch};
use tracing::Instrument;

use crate::k8s::circuit::Circuit;
use crate::k8s::discovery::{self, ApiKind, Failure};
use crate::k8s::fetch::encode;
use crate::k8s::lines::{Lines, MAX_EVENT};
use crate::resources::object::Object;
use crate::resources::page;
use crate::resources::text::Dictionary;
use crate::resources::tree::Tree;
use crate::telemetry::Metrics;

/// How far a kind's cache has come.
#[derive(Debug, Clone)]
pub(crate) enum Phase {
    /// The first list has not answered yet.
    Pending,
    /// The objects are the cluster's, as of the last event.
    Synced,
    /// The last list failed; the objects (if any) are from before.
    Failed(Failure),
}

/// A change to one kind's cached objects, as the cache applied it.
#[derive(Debug, Clone)]
pub enum Change {
    /// Added or modified: the object as it is now.
    Applied(Object),
    /// Deleted: the object as it was last.
    Deleted(Object),
    /// The kind was listed again, or its watch started or stopped failing: read it whole.
    Reset,
}

/// A change in a namespace, with the kind it happened to.
#[derive(Debug, Clone)]
pub struct KindChange {
    pub kind: ApiKind,
    pub change: Change,
}

/// A kind's objects in one namespace, by name (the cluster's list order).
pub(crate) struct KindWatch {
    pub kind: ApiKind,
    /// Shared with the views that read them: a view takes the objects without copying them.
    /// Ordered by the name each object holds ([`Named`]), so that no name is kept twice.
    objects: Mutex<BTreeSet<Named>>,
    pub phase: watch::Sender<Phase>,
    /// The namespace's change feed; an object is cloned into it only while somebody listens.
    changes: broadcast::Sender<Arc<KindChange>>,
    /// The namespace's generation, moved on after every change to what a view reads here (the
    /// objects, the phase, the staleness), so that a group assembled at one generation is
    /// known to be current while it stays.
    generation: Arc<AtomicU64>,
    /// Since when the watch has been failing, and its last error: the objects are as of then.
    stale: Mutex<Option<(chrono::DateTime<chrono::Utc>, Failure)>>,
    task: OnceLock<tokio::task::AbortHandle>,
    /// The cache's count of objects, for its bound.
    total: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    /// The text the kind's objects are packed against ([`crate::resources::text`]): the first
    /// object of the last list, or the first one to arrive after an empty list.
    dictionary: Mutex<Option<Arc<Dictionary>>>,
}

/// A cached object, ordered and found by its `metadata.name` (read from its kept fields): the
/// index of a kind holds each name once, in the object, rather than a copy of it beside it.
pub(crate) struct Named(pub Arc<Object>);

impl Named {
    fn name(&self) -> &str {
        self.0
            .view
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Tree::as_str)
            .unwrap_or_default()
    }
}

impl std::borrow::Borrow<str> for Named {
    fn borrow(&self) -> &str {
        self.name()
    }
}

impl PartialEq for Named {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Named {}

/// As the names compare (`Borrow<str>` requires it).
impl Ord for Named {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.name().cmp(other.name())
    }
}

impl PartialOrd for Named {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Drop for KindWatch {
    fn drop(&mut self) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
        let held = self.lock().len();
        self.total.fetch_sub(held, Ordering::Relaxed);
        self.metrics.watch_cache_objects.dec_by(held as i64);
    }
}

/// How long a watch may stay open before the server is asked to end it; client-go picks 5 to
/// 10 minutes so that load spreads over the apiserver's instances.
const WATCH_SECONDS: u64 = 290;

/// Why a kind's watch stopped when this replica lost the connection's lease.
pub(crate) const NOT_HELD: &str =
    "this envlens replica no longer holds the cluster connection's watches";
const BACKOFF_START: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

impl KindWatch {
    /// Starts the watch of `kind` in `namespace`. The task holds only a weak reference: it
    /// ends when the cache drops the kind. `changes` and `generation` are the namespace's,
    /// `total` and `metrics` the cache's. Its first list carries `cause`, the `Audit-ID` of
    /// the view that needed the kind ([`crate::k8s::observe`]); what follows is nobody's.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        route: Route,
        first: FirstList,
        kind: ApiKind,
        namespace: &str,
        page_size: usize,
        changes: broadcast::Sender<Arc<KindChange>>,
        generation: Arc<AtomicU64>,
        total: Arc<AtomicUsize>,
        metrics: Arc<Metrics>,
    ) -> Arc<KindWatch> {
        let watch = Arc::new(KindWatch {
            kind,
            objects: Mutex::new(BTreeSet::new()),
            phase: watch::Sender::new(Phase::Pending),
            changes,
            generation,
            stale: Mutex::new(None),
            task: OnceLock::new(),
            total,
            metrics,
            dictionary: Mutex::new(None),
        });
        // No namespace: the kind's cluster-scoped objects ([`super::WatchCache::view_cluster_kind`]).
        let path = match namespace {
            "" => format!(
                "{}/{}",
                watch.kind.group_version_path(),
                encode(&watch.kind.plural)
            ),
            _ => format!(
                "{}/namespaces/{}/{}",
                watch.kind.group_version_path(),
                encode(namespace),
                encode(&watch.kind.plural)
            ),
        };
        let weak = Arc::downgrade(&watch);
        let fence = route.fence.clone();
        let task = tokio::spawn(async move {
            // The fence first: a watch of a connection not held sends nothing at all.
            tokio::select! {
                biased;
                () = fence.lost() => {
                    if let Some(watch) = weak.upgrade() {
                        watch.set_phase(Phase::Failed(Failure {
                            code: Some(503),
                            message: NOT_HELD.into(),
                            answered: false,
                        }));
                    }
                }
                () = run(route, weak.clone(), path, page_size, first) => {}
            }
        });
        let _ = watch.task.set(task.abort_handle());
        watch
    }

    /// Since when the cached objects have been out of date, and why.
    pub fn stale(&self) -> Option<(chrono::DateTime<chrono::Utc>, Failure)> {
        self.stale.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Marks the objects out of date for `failure`, or current again with `None`. A change of
    /// failure is told to the listeners as well as a start or an end: a subscriber shown a
    /// dropped connection is told when it turns out to be the agent gone, as a view would be.
    fn set_stale(&self, failure: Option<Failure>) {
        let mut stale = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        let moved = match failure {
            None => stale.take().is_some(),
            Some(failure) => {
                let since = stale
                    .as_ref()
                    .map_or_else(chrono::Utc::now, |(since, _)| *since);
                let moved = stale.as_ref().map(|(_, f)| f) != Some(&failure);
                *stale = Some((since, failure));
                moved
            }
        };
        drop(stale);
        if moved {
            self.moved();
            self.publish(|| Change::Reset);
        }
    }

    /// Sets the phase and tells the listeners to read the kind again.
    fn set_phase(&self, phase: Phase) {
        self.phase.send_replace(phase);
        self.moved();
        self.publish(|| Change::Reset);
    }

    /// Moves the namespace's generation on, after a change is in place: a reader that reads
    /// the generation first and the objects second never pairs a generation with objects
    /// older than it.
    fn moved(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Sends a change to the namespace's listeners, built only if there are any.
    fn publish(&self, change: impl FnOnce() -> Change) {
        if self.changes.receiver_count() > 0 {
            let _ = self.changes.send(Arc::new(KindChange {
                kind: self.kind.clone(),
                change: change(),
            }));
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeSet<Named>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object named `name` now, if held (shared, not copied).
    pub fn object(&self, name: &str) -> Option<Arc<Object>> {
        self.lock().get(name).map(|named| named.0.clone())
    }

    /// The objects now, in name order (shared, not copied).
    pub fn objects(&self) -> Vec<Arc<Object>> {
        self.lock().iter().map(|named| named.0.clone()).collect()
    }

    fn replace(&self, fresh: BTreeSet<Named>) {
        let mut objects = self.lock();
        let (before, after) = (objects.len(), fresh.len());
        *objects = fresh;
        drop(objects);
        self.moved();
        self.count(after as i64 - before as i64);
    }

    /// Adds `object`, or puts it in the place of the one of its name ([`Named`]: the name of
    /// its kept fields, the event's `metadata.name`). Its text is packed once the change is
    /// out: the listeners' copy is read as it came.
    fn put(&self, object: Object) {
        let listened = self.changes.receiver_count() > 0;
        let copy = listened.then(|| object.clone());
        let object = Arc::new(object);
        if self.lock().replace(Named(object.clone())).is_none() {
            self.count(1);
        }
        self.moved();
        if let Some(copy) = copy {
            self.publish(|| Change::Applied(copy));
        }
        let dictionary = self
            .dictionary_lock()
            .get_or_insert_with(|| object.dictionary())
            .clone();
        object.pack(&dictionary);
    }

    fn dictionary_lock(&self) -> MutexGuard<'_, Option<Arc<Dictionary>>> {
        self.dictionary.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Packs the texts of the objects held now against the kind's dictionary, some at a time:
    /// a large kind does not keep a worker of the runtime from others.
    async fn pack(&self) {
        let Some(dictionary) = self.dictionary_lock().clone() else {
            return;
        };
        for some in self.objects().chunks(64) {
            for object in some {
                object.pack(&dictionary);
            }
            tokio::task::yield_now().await;
        }
    }

    fn remove(&self, name: &str) {
        let removed = self.lock().take(name);
        if let Some(Named(object)) = removed {
            self.moved();
            self.count(-1);
            self.publish(|| Change::Deleted(Arc::unwrap_or_clone(object)));
        }
    }

    fn count(&self, delta: i64) {
        if delta >= 0 {
            self.total.fetch_add(delta as usize, Ordering::Relaxed);
        } else {
            self.total.fetch_sub((-delta) as usize, Ordering::Relaxed);
        }
        self.metrics.watch_cache_objects.inc_by(delta);
    }
}

#[derive(Deserialize)]
struct ObjectMeta {
    #[serde(default)]
    metadata: ListMetaOfObject,
}

#[derive(Deserialize, Default)]
struct ListMetaOfObject {
    #[serde(default)]
    name: String,
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(borrow)]
    object: &'a RawValue,
}

#[derive(Deserialize, Default)]
struct StatusBody {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    message: String,
}

/// Why a watch ended.
enum Ended {
    /// The server closed it (timeout) or the connection dropped: resume.
    Closed,
    /// `410 Gone`: relist.
    Expired,
    /// Anything else: back off, then resume.
    Failed(Failure),
}

/// How a kind's watch reaches the cluster: lists through `client`, whose pool takes each
/// list's connection back for the next request, and watches through `streams`, whose
/// connections only ever carry events ([`super::WatchCache::new`]).
pub(crate) struct Route {
    pub client: kube::Client,
    pub streams: kube::Client,
    pub circuit: Circuit,
    /// This replica's hold of the connection: the watch ends when it is lost.
    pub fence: super::fence::Fence,
}

/// Waits out `backoff` after a failure, or less: until the connection's circuit closes (the
/// agent is back, and the kinds waiting on it need not each find that out in its own time).
/// Then the next wait doubles, or starts over after a closing.
async fn back_off(circuit: &Circuit, backoff: &mut Duration) {
    tokio::select! {
        () = tokio::time::sleep(*backoff) => *backoff = (*backoff * 2).min(BACKOFF_MAX),
        () = circuit.closes() => *backoff = BACKOFF_START,
    }
}

/// What a kind's first list is for: the view that caused it (its `Audit-ID`), and that view's
/// end, which the first watch waits for. A first view lists every kind at once; the watches
/// that follow each list would otherwise be sent while the other lists are still coming, and
/// compete with them (through GitLab's agent server, 41 more requests) for what the viewer
/// waits for.
#[derive(Default)]
pub struct FirstList {
    pub cause: Option<HeaderValue>,
    pub watch_after: Option<watch::Receiver<bool>>,
}

async fn run(
    route: Route,
    watch: std::sync::Weak<KindWatch>,
    path: String,
    page_size: usize,
    first: FirstList,
) {
    let FirstList {
        mut cause,
        mut watch_after,
    } = first;
    let mut version: Option<String> = None;
    // Whether the cluster's last word on the kind was a refusal (401, 403): then nothing is
    // kept when the relist cannot be answered.
    let mut refused = false;
    let mut backoff = BACKOFF_START;
    loop {
        let Some(this) = watch.upgrade() else { return };
        if version.is_none() {
            this.metrics.watch_relists.inc();
            // Boxed, as the watch's request below: a future awaited inline sizes the task's,
            // which a cache holds per kind and namespace, nearly always at rest in the watch.
            let listed = Box::pin(list(&route.client, &this, &path, page_size));
            match crate::k8s::observe::within(cause.take(), listed).await {
                Ok(rv) => {
                    version = Some(rv);
                    refused = false;
                    this.set_stale(None);
                    this.set_phase(Phase::Synced);
                    tokio::spawn(pack_later(Arc::downgrade(&this)));
                }
                Err(failure) => {
                    tracing::debug!(path, code = ?failure.code, message = %failure.message, "watch cache: list failed");
                    let synced = matches!(*this.phase.borrow(), Phase::Synced);
                    if synced && !refused && (!failure.answered || unavailable(failure.code)) {
                        // A relist the cluster could not answer (the agent gone while its
                        // watch expired or failed): the objects listed before are kept and
                        // shown as out of date, as a failing watch's are, never emptied. A
                        // refused relist hides them: the identity may no longer list them;
                        // so does one that follows a refused watch, whatever its own answer.
                        this.set_stale(Some(failure));
                    } else {
                        this.set_phase(Phase::Failed(failure));
                    }
                    drop(this);
                    back_off(&route.circuit, &mut backoff).await;
                    continue;
                }
            }
        }
        let from = version.clone().unwrap_or_default();
        drop(this);
        if let Some(mut view) = watch_after.take() {
            // Done or dropped, the view lets go; a change meanwhile comes with the watch,
            // which starts from the list's version.
            let _ = view.wait_for(|done| *done).await;
        }
        match stream(&route.streams, &watch, &path, &mut version, &from).await {
            // The backoff starts over only once a watch has worked: a cluster whose lists
            // answer but whose watches fail is not asked in a tight loop.
            Ended::Closed => backoff = BACKOFF_START,
            Ended::Expired => {
                backoff = BACKOFF_START;
                version = None;
                refused = false;
            }
            Ended::Failed(failure) => {
                tracing::debug!(path, code = ?failure.code, message = %failure.message, "watch cache: watch failed");
                if let Some(this) = watch.upgrade() {
                    this.set_stale(Some(failure.clone()));
                }
                back_off(&route.circuit, &mut backoff).await;
                // A watch the server refuses may be refused for its version: list again. Not
                // when it is only unavailable (an agent away from GitLab's agent server, its
                // circuit open, an overloaded server): the version still holds, and the watch
                // resumes from it once the cluster answers, its objects shown meanwhile as
                // they were.
                if failure.answered && !unavailable(failure.code) {
                    version = None;
                    refused = matches!(failure.code, Some(401 | 403));
                }
            }
        }
    }
}

/// Whether an answer's code says the server cannot answer now, rather than refusing the
/// request: 429, 502, 503, 504.
fn unavailable(code: Option<u16>) -> bool {
    matches!(code, Some(429 | 502 | 503 | 504))
}

/// Lists every object of the kind in the namespace, following `continue`; the list's version.
async fn list(
    client: &kube::Client,
    watch: &KindWatch,
    path: &str,
    page_size: usize,
) -> Result<String, Failure> {
    // Collected in the order the pages give, then made a set at once (below).
    let mut listed: Vec<Named> = Vec::new();
    let mut token: Option<String> = None;
    let mut version = None;
    let api_version = watch.kind.api_version();
    loop {
        let mut uri = format!("{path}?limit={page_size}");
        if let Some(t) = &token {
            uri.push_str(&format!("&continue={}", encode(t)));
        }
        let body = discovery::get(
            client,
            &uri,
            &HeaderMap::new(),
            None,
            Duration::from_secs(60),
        )
        .instrument(tracing::debug_span!("watch.list_get"))
        .await?;
        let parsing = tracing::debug_span!("watch.list_parse").entered();
        // One pass over the page: each item's kept fields and its text from the same scan, its
        // name read from the kept fields (`page::read`, as a fresh list reads its pages).
        let page = page::read::<page::Item>(&body).map_err(Failure::bad_body)?;
        listed.reserve(page.items.len());
        for (item, text) in page.items {
            let object = item.into_object(text, &api_version, &watch.kind.kind);
            listed.push(Named(Arc::new(object)));
        }
        drop(parsing);
        version.get_or_insert(page.resource_version);
        match page.continue_token.filter(|t| !t.is_empty()) {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    // The cluster lists by name: a set made of the whole list sorts it in one pass over
    // sorted items and builds its nodes in order, where inserting each item searched the
    // tree for its place (each comparison reading two names from their trees: ~10k
    // instructions an object, more than the parse of its page). Of a name given twice the
    // last is kept, as inserting them in turn kept it.
    let fresh: BTreeSet<Named> = listed.into_iter().collect();
    *watch.dictionary_lock() = fresh.first().map(|first| first.0.dictionary());
    watch.replace(fresh);
    Ok(version.unwrap_or_default())
}

/// How long after a list its objects' texts are packed ([`crate::resources::text`]): the view
/// that waited for the list is answered first. An object a watch event brings is packed at
/// once, after its change is out.
pub const PACK_AFTER: Duration = Duration::from_secs(1);

/// Packs a listed kind's texts [`PACK_AFTER`] its list, unless the kind has been dropped.
async fn pack_later(watch: std::sync::Weak<KindWatch>) {
    tokio::time::sleep(PACK_AFTER).await;
    if let Some(watch) = watch.upgrade() {
        watch.pack().await;
    }
}

/// By when the connections a first view's lists went over have been closed, if nothing used
/// them since: twice the idle time the clients' pools keep a connection for
/// ([`crate::k8s::connection::POOL_IDLE`]; their sweep runs once per idle time). What a list
/// left in a connection's read buffer is freed with it.
pub const HANDOVER: Duration = Duration::from_secs(2 * crate::k8s::connection::POOL_IDLE.as_secs());

/// One watch request, applied until it ends.
async fn stream(
    client: &kube::Client,
    watch: &std::sync::Weak<KindWatch>,
    path: &str,
    version: &mut Option<String>,
    from: &str,
) -> Ended {
    let uri = format!(
        "{path}?watch=true&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds={WATCH_SECONDS}",
        encode(from)
    );
    let request = match Request::get(uri).body(kube::client::Body::empty()) {
        Ok(mut r) => {
            r.headers_mut()
                .insert(header::ACCEPT, HeaderValue::from_static("application/json"));
            r
        }
        Err(e) => {
            return Ended::Failed(Failure {
                code: None,
                message: e.to_string(),
                answered: false,
            })
        }
    };
    let response = match Box::pin(client.send(request)).await {
        Ok(r) => r,
        Err(e) => {
            return Ended::Failed(Failure {
                code: None,
                message: e.to_string(),
                answered: false,
            })
        }
    };
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let bytes = Box::pin(body.collect())
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if status.as_u16() == 410 {
            return Ended::Expired;
        }
        return Ended::Failed(Failure {
            code: Some(status.as_u16()),
            message: discovery::error_message(status, &bytes),
            answered: true,
        });
    }
    let Some(this) = watch.upgrade() else {
        return Ended::Closed;
    };
    this.set_stale(None);
    let metrics = this.metrics.clone();
    drop(this);
    metrics.watch_streams.inc();
    let _open = Open(metrics.clone());
    let mut lines = Lines::default();
    loop {
        let frame = match body.frame().await {
            None => return Ended::Closed,
            Some(Err(_)) => return Ended::Closed,
            Some(Ok(frame)) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        lines.push(&data);
        while let Some(line) = lines.next_line() {
            let Some(this) = watch.upgrade() else {
                return Ended::Closed;
            };
            match apply(&this, line, version) {
                Ok(()) => {
                    metrics.watch_events.inc();
                }
                Err(ended) => return ended,
            }
        }
        if lines.rest() > MAX_EVENT {
            return Ended::Failed(Failure {
                code: None,
                message: format!("the cluster sent an event over {} MiB", MAX_EVENT >> 20),
                answered: true,
            });
        }
    }
}

/// Counts an open watch stream while it lives.
struct Open(Arc<Metrics>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.watch_streams.dec();
    }
}

/// Applies one event line.
fn apply(watch: &KindWatch, line: &[u8], version: &mut Option<String>) -> Result<(), Ended> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    let bad = |e: serde_json::Error| Ended::Failed(Failure::bad_body(e));
    let event: Line = serde_json::from_slice(line).map_err(bad)?;
    if event.kind == "ERROR" {
        let status: StatusBody = serde_json::from_str(event.object.get()).unwrap_or_default();
        if status.code == 410 {
            return Err(Ended::Expired);
        }
        return Err(Ended::Failed(Failure {
            code: Some(status.code).filter(|c| *c != 0),
            message: status.message,
            answered: true,
        }));
    }
    let head: ObjectMeta = serde_json::from_str(event.object.get()).map_err(bad)?;
    match event.kind {
        "ADDED" | "MODIFIED" => {
            let object = Object::parse(event.object, &watch.kind.api_version(), &watch.kind.kind)
                .map_err(bad)?;
            watch.put(object);
        }
        "DELETED" => watch.remove(&head.metadata.name),
        _ => {}
    }
    if !head.metadata.resource_version.is_empty() {
        *version = Some(head.metadata.resource_version);
    }
    Ok(())
}
