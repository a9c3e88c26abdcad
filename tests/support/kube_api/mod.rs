//! An in-process stand-in for the Kubernetes API server, faithful enough for `kubectl` and kube-rs:
//! discovery, CRUD with metav1 `Status` errors, label/field selectors, list pagination, watches,
//! pod logs (with follow), RBAC-style denials and impersonation headers.
//!
//! No real cluster can run where the tests run, so integration tests and benchmarks talk to this
//! instead. Objects are plain `serde_json::Value`s; nothing is validated beyond what clients rely
//! on (names, namespaces, kinds, resourceVersions), and no controllers run.
//!
//! Not modelled: protobuf request bodies (kubectl's typed `create namespace|configmap|…`
//! generators get a 415; `apply -f`/`create -f` send JSON and work), server-side Table output
//! and aggregated discovery (kubectl falls back to plain lists and per-group discovery),
//! authentication beyond bearer tokens (every caller is "admin" unless impersonating or its token
//! was added with `KubeApi::add_token`; kubectl sends no token over http anyway), field ownership for server-side apply, finalizers and graceful deletion.
//!
//! ```ignore
//! let api = KubeApi::new();
//! api.insert(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "ns"}}));
//! let served = api.serve(dir.path()).await;
//! let out = served.kubectl().args(["get", "pods", "-n", "ns", "-o", "name"]).output()?;
//! ```

// Each test binary uses a different part of this module.
#![allow(dead_code)]

mod discovery;
mod handlers;
mod logs;
mod openapi;
mod patch;
mod rbac;
mod selectors;
mod status;
mod store;
mod streams;
pub mod tls;
mod writes;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use axum::body::Bytes;
use serde_json::{json, Value};
use tokio::sync::watch;

use discovery::{Registry, ResourceKind};
use store::Write;

/// The fake API server. Cloning is cheap and every clone sees the same objects.
#[derive(Clone)]
pub struct KubeApi {
    inner: Arc<Inner>,
}

type DenyRule = dyn Fn(&RequestInfo) -> bool + Send + Sync;
type FaultRule = dyn Fn(&RequestInfo) -> Option<Fault> + Send + Sync;

/// What a fault rule does to a resource request it matches (see [`KubeApi::fault`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Answer with this code and a `Status` carrying the message instead of serving the request.
    Status(u16, String),
    /// Serve the request, but only after this long (on top of [`KubeApi::set_latency`]).
    Delay(Duration),
}

struct Inner {
    registry: RwLock<Registry>,
    store: store::Store,
    logs: logs::Logs,
    latency: Mutex<Duration>,
    deny: RwLock<Vec<Box<DenyRule>>>,
    requests: Mutex<Vec<RecordedRequest>>,
    /// Off for long benchmarks, where the recorded requests would only pile up.
    recording: AtomicBool,
    /// Watches and log follows currently streaming, so tests can check none leak.
    open_streams: AtomicUsize,
    faults: RwLock<Vec<Box<FaultRule>>>,
    /// Group versions whose (aggregated) server is down: their discovery and resources answer 503.
    unavailable: RwLock<Vec<(String, String)>>,
    /// Requests being handled right now, and the most there ever were at once.
    in_flight: AtomicUsize,
    in_flight_peak: AtomicUsize,
    /// Resource requests per `(verb, resource)`, resource as `pods` or `deployments.apps`; kept
    /// even when recording is off, so that benchmarks can see what the cluster was asked.
    counts: Mutex<BTreeMap<(String, String), u64>>,
    /// Access reviews answered per question asked: see [`KubeApi::review_counts`].
    reviews: Mutex<BTreeMap<ReviewAsked, u64>>,
    /// Whether resource requests are authorized by the stored RBAC objects (off: everyone may do
    /// anything unless a deny rule says otherwise).
    rbac: AtomicBool,
    /// Bearer tokens and the user and groups each authenticates ([`KubeApi::add_token`]).
    tokens: RwLock<HashMap<String, (String, Vec<String>)>>,
    /// How often a watch that asked for bookmarks gets one.
    bookmark_interval: Mutex<Duration>,
    /// How long each watch event waits before it is sent (see [`KubeApi::delay_watch_events`]).
    watch_delay: Mutex<Duration>,
    /// The client's end of every connection [`KubeApi::serve`] accepted, in order.
    accepted: Mutex<Vec<SocketAddr>>,
    /// Bumped by [`KubeApi::drop_watches`]: every open watch ends.
    cut: watch::Sender<u64>,
    /// Bumped by [`KubeApi::close_connections`]: every connection [`KubeApi::serve_tls`]
    /// accepted before fails.
    closing: watch::Sender<u64>,
    /// Each connection [`KubeApi::serve_tls`] serves, asked through it to say GOAWAY
    /// ([`KubeApi::go_away`]); it answers once it has.
    going_away: Mutex<Vec<tls::GoAway>>,
    /// The most HTTP/2 streams a connection [`KubeApi::serve_tls`] accepts then carries at
    /// once ([`KubeApi::limit_streams_per_connection`]; `None`: hyper's 200).
    streams_per_connection: Mutex<Option<u32>>,
}

/// What the apiserver's authorizer sees of a resource request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestInfo {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: String,
    /// "" for the core group.
    pub group: String,
    pub version: String,
    /// Plural, e.g. "pods".
    pub resource: String,
    /// e.g. "log", "status", "scale".
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The impersonated user if `Impersonate-User` was sent, else the token's user "admin".
    pub user: String,
    /// Impersonated groups plus "system:authenticated" (as the apiserver adds it), or the admin's
    /// groups ("system:masters", "system:authenticated").
    pub groups: Vec<String>,
    pub uid: Option<String>,
    /// `Impersonate-Extra-<key>` values, keys lower-cased and percent-decoded.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What one `SubjectAccessReview` (or `SelfSubjectAccessReview`) asked: the subject's user, the
/// namespace ("" for none), the verb and the resource as `plural` or `plural.group`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReviewAsked {
    pub user: String,
    pub namespace: String,
    pub verb: String,
    pub resource: String,
}

/// One request as received, before any denial or latency.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    /// Raw query string, "" when there is none.
    pub query: String,
    pub impersonate_user: Option<String>,
    /// Every `Impersonate-Group` header value, in order.
    pub impersonate_groups: Vec<String>,
    pub impersonate_uid: Option<String>,
    /// `Impersonate-Extra-<key>` headers, keys lower-cased and percent-decoded.
    pub impersonate_extra: BTreeMap<String, Vec<String>>,
    /// All headers, names lower-case (repeated headers stay together, in order).
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// HTTP/1.1, or HTTP/2 over [`KubeApi::serve_tls`] when the client offered `h2`.
    pub version: axum::http::Version,
    /// The client's end of the connection it came over ([`KubeApi::serve`]'s; `None` through
    /// [`KubeApi::router`] alone).
    pub peer: Option<SocketAddr>,
}

impl RecordedRequest {
    /// First value of a header (name case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A query parameter's first value, percent-decoded.
    pub fn query_param(&self, name: &str) -> Option<String> {
        handlers::parse_query(&self.query)
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

impl Default for KubeApi {
    fn default() -> Self {
        Self::new()
    }
}

impl KubeApi {
    /// A server with no objects and the built-in kinds registered: v1 pods, services, endpoints,
    /// configmaps, secrets, serviceaccounts, persistentvolumeclaims, events, namespaces, nodes;
    /// apps/v1 deployments, replicasets, statefulsets, daemonsets; batch/v1 jobs, cronjobs;
    /// networking.k8s.io/v1 ingresses; discovery.k8s.io/v1 endpointslices; autoscaling/v2
    /// horizontalpodautoscalers; apiregistration.k8s.io/v1 apiservices; rbac.authorization.k8s.io/v1
    /// roles, rolebindings.
    pub fn new() -> Self {
        KubeApi {
            inner: Arc::new(Inner {
                registry: RwLock::new(Registry::builtin()),
                store: store::Store::new(),
                logs: logs::Logs::new(),
                latency: Mutex::new(Duration::ZERO),
                deny: RwLock::new(Vec::new()),
                requests: Mutex::new(Vec::new()),
                recording: AtomicBool::new(true),
                open_streams: AtomicUsize::new(0),
                faults: RwLock::new(Vec::new()),
                unavailable: RwLock::new(Vec::new()),
                in_flight: AtomicUsize::new(0),
                in_flight_peak: AtomicUsize::new(0),
                counts: Mutex::new(BTreeMap::new()),
                reviews: Mutex::new(BTreeMap::new()),
                rbac: AtomicBool::new(false),
                tokens: RwLock::new(HashMap::new()),
                bookmark_interval: Mutex::new(Duration::from_secs(60)),
                watch_delay: Mutex::new(Duration::ZERO),
                accepted: Mutex::new(Vec::new()),
                cut: watch::Sender::new(0),
                closing: watch::Sender::new(0),
                going_away: Mutex::new(Vec::new()),
                streams_per_connection: Mutex::new(None),
            }),
        }
    }

    /// Registers a custom resource kind at run time (shows up in discovery immediately), with a
    /// `status` subresource like most CRDs.
    pub fn add_kind(&self, group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) {
        self.add_kind_watchable(group, version, kind, plural, namespaced, true);
    }

    /// [`KubeApi::add_kind`], with `watch` served or not (discovery leaves the verb out, and a
    /// watch answers 405, as for aggregated APIs that only list).
    pub fn add_kind_watchable(
        &self,
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
        watchable: bool,
    ) {
        write(&self.inner.registry).add(ResourceKind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
            short_names: Vec::new(),
            categories: Vec::new(),
            subresources: vec!["status".into()],
            create_only: false,
            watchable,
        });
    }

    /// Unregisters a kind (e.g. a CRD version that is no longer served): it leaves discovery and its
    /// paths answer 404. Stored objects stay, and show again if the kind is added back or served
    /// under another version of the same group.
    pub fn remove_kind(&self, group: &str, version: &str, plural: &str) {
        write(&self.inner.registry).remove(group, version, plural);
    }

    /// Stores an object as-is, replacing one with the same name (fills metadata.uid,
    /// resourceVersion and creationTimestamp if missing, and namespace "default" for namespaced
    /// kinds; a resourceVersion equal to the stored one is bumped). Emits ADDED or MODIFIED.
    ///
    /// Panics if `apiVersion`/`kind` is not registered or `metadata.name` is missing: that is a
    /// mistake in the test, not a request to answer.
    pub fn insert(&self, mut obj: Value) {
        let api_version = obj["apiVersion"].as_str().unwrap_or_default().to_string();
        let kind_name = obj["kind"].as_str().unwrap_or_default().to_string();
        let kind = read(&self.inner.registry)
            .find_by_kind(&api_version, &kind_name)
            .cloned()
            .unwrap_or_else(|| panic!("KubeApi::insert: {api_version:?} {kind_name:?} is not registered; call add_kind first"));
        let name = obj["metadata"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| panic!("KubeApi::insert: object has no metadata.name: {obj}"))
            .to_string();
        let ns = if kind.namespaced {
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string();
            obj["metadata"]["namespace"] = json!(ns);
            ns
        } else {
            if let Some(m) = obj["metadata"].as_object_mut() {
                m.remove("namespace");
            }
            String::new()
        };
        let _ = self
            .inner
            .store
            .write::<()>(&kind.store_key(), &ns, &name, |prev, rv| {
                let old = |field: &str| prev.and_then(|p| p["metadata"].get(field)).cloned();
                let meta = &mut obj["metadata"];
                // A replaced object keeps its identity unless the test sets it explicitly.
                for (field, fresh) in [
                    ("uid", json!(writes::new_uid())),
                    ("creationTimestamp", json!(writes::now())),
                ] {
                    if meta.get(field).is_none() {
                        meta[field] = old(field).unwrap_or(fresh);
                    }
                }
                // An object re-inserted after `get` still carries the old version: bump it, so
                // watchers and resuming clients see a change.
                if meta.get("resourceVersion").is_none()
                    || meta.get("resourceVersion").cloned() == old("resourceVersion")
                {
                    meta["resourceVersion"] = json!(rv.to_string());
                }
                Ok(Write::Put(obj))
            });
    }

    /// The stored object, by `plural` or `plural.group` (e.g. "pods", "deployments.apps").
    /// `namespace` is ignored for cluster-scoped kinds.
    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let kind = read(&self.inner.registry)
            .find_by_resource(resource)
            .cloned()?;
        let ns = if kind.namespaced {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        self.inner
            .store
            .get(&kind.store_key(), ns, name)
            .map(|o| (*o).clone())
    }

    /// Stored objects of a resource, in namespace/name order; `namespace: None` means all.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        let Some(kind) = read(&self.inner.registry)
            .find_by_resource(resource)
            .cloned()
        else {
            return Vec::new();
        };
        let ns = namespace.filter(|_| kind.namespaced);
        self.inner
            .store
            .list(&kind.store_key(), ns)
            .1
            .into_iter()
            .map(|(_, o)| (*o).clone())
            .collect()
    }

    /// Deletes an object (emitting DELETED) and returns it, if it existed.
    pub fn remove(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let kind = read(&self.inner.registry)
            .find_by_resource(resource)
            .cloned()?;
        let ns = if kind.namespaced {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        self.inner
            .store
            .write(&kind.store_key(), ns, name, |prev, _| {
                prev.map(|_| Write::Delete).ok_or(())
            })
            .ok()
            .map(|o| (*o).clone())
    }

    /// Sets a pod's log text. `container: None` answers for any container of the pod.
    pub fn set_pod_log(&self, namespace: &str, pod: &str, container: Option<&str>, text: &str) {
        self.inner.logs.set(namespace, pod, container, text);
    }

    /// Sets the log of a container's previous run, which `previous=true` reads (the kubelet
    /// keeps one terminated instance of each container).
    pub fn set_previous_pod_log(&self, namespace: &str, pod: &str, container: &str, text: &str) {
        self.inner
            .logs
            .set_previous(namespace, pod, container, text);
    }

    /// Appends to a pod's log; followers (follow=true) receive the new text while connected.
    /// Goes to the pod's only stored log, else its container-less log, else its default
    /// container's (the `kubectl.kubernetes.io/default-container` annotation or the first one).
    pub fn append_pod_log(&self, namespace: &str, pod: &str, text: &str) {
        let default = self.get("pods", Some(namespace), pod).and_then(|p| {
            p["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"]
                .as_str()
                .or_else(|| p["spec"]["containers"][0]["name"].as_str())
                .map(str::to_string)
        });
        self.inner
            .logs
            .append(namespace, pod, default.as_deref(), text);
    }

    /// Added to every request before it is answered, for benchmarks.
    pub fn set_latency(&self, d: Duration) {
        *lock(&self.inner.latency) = d;
    }

    /// Refuses resource requests for which `rule` returns true with a 403 Status worded like the
    /// apiserver's RBAC denial. Rules accumulate; discovery and `/version` are never denied.
    pub fn deny(&self, rule: impl Fn(&RequestInfo) -> bool + Send + Sync + 'static) {
        write(&self.inner.deny).push(Box::new(rule));
    }

    /// Injects faults into resource requests (never discovery): the first rule that returns a
    /// [`Fault`] for a request decides. Rules accumulate and run after the deny rules.
    pub fn fault(&self, rule: impl Fn(&RequestInfo) -> Option<Fault> + Send + Sync + 'static) {
        write(&self.inner.faults).push(Box::new(rule));
    }

    /// Marks a group version as served by an aggregated API server that is down: its discovery
    /// document and its resource paths answer 503, as the apiserver does when an APIService is
    /// unavailable, while `/apis` still lists the group.
    pub fn set_unavailable(&self, group: &str, version: &str) {
        write(&self.inner.unavailable).push((group.into(), version.into()));
    }

    /// The most requests that were ever being handled at once (latency included) since the
    /// server started or [`KubeApi::reset_in_flight_peak`].
    pub fn in_flight_peak(&self) -> usize {
        self.inner.in_flight_peak.load(Ordering::SeqCst)
    }

    pub fn reset_in_flight_peak(&self) {
        self.inner.in_flight_peak.store(
            self.inner.in_flight.load(Ordering::SeqCst),
            Ordering::SeqCst,
        );
    }

    /// Drops every deny rule.
    pub fn allow_all(&self) {
        write(&self.inner.deny).clear();
    }

    /// The client's end of every connection accepted so far ([`KubeApi::serve`]), oldest
    /// first: which requests went over a connection opened before them
    /// ([`RecordedRequest::peer`]).
    pub fn accepted(&self) -> Vec<SocketAddr> {
        lock(&self.inner.accepted).clone()
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.inner.requests).clone()
    }

    pub fn clear_requests(&self) {
        lock(&self.inner.requests).clear();
    }

    /// Turns request recording on (the default) or off, e.g. for benchmarks with many requests.
    pub fn set_recording(&self, on: bool) {
        self.inner.recording.store(on, Ordering::Relaxed);
    }

    /// Resource requests so far with this verb (`list`, `watch`, `get`, `create`, …) on this
    /// resource (`pods`, `deployments.apps`), denied ones included; discovery is not counted.
    pub fn request_count(&self, verb: &str, resource: &str) -> u64 {
        lock(&self.inner.counts)
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Every `(verb, resource)` asked so far and how often.
    pub fn request_counts(&self) -> BTreeMap<(String, String), u64> {
        lock(&self.inner.counts).clone()
    }

    /// All resource requests counted so far, across verbs and resources.
    pub fn resource_requests(&self) -> u64 {
        lock(&self.inner.counts).values().sum()
    }

    pub fn reset_request_counts(&self) {
        lock(&self.inner.counts).clear();
        lock(&self.inner.reviews).clear();
    }

    /// The access reviews answered so far, by what they asked (resource attributes only), and
    /// how often each; cleared with [`KubeApi::reset_request_counts`]. The per-verb counts only
    /// say how many `create`s of `subjectaccessreviews` there were; this says of what.
    pub fn review_counts(&self) -> BTreeMap<ReviewAsked, u64> {
        lock(&self.inner.reviews).clone()
    }

    /// Authorizes every resource request by the stored RBAC objects from now on, as a cluster
    /// with `--authorization-mode=RBAC` does (the admin is in `system:masters`; impersonated
    /// users get only what their bindings grant).
    pub fn enforce_rbac(&self) {
        self.inner.rbac.store(true, Ordering::SeqCst);
    }

    /// Requests with `Authorization: Bearer <token>` are `user` in `groups` (and
    /// `system:authenticated`) from now on, as a service account's token authenticates; any
    /// other caller stays "admin" in `system:masters`. With [`Self::enforce_rbac`], such a user
    /// gets what its bindings grant, impersonation included (the impersonation filter asks
    /// RBAC for `impersonate` of each user, group, extra and uid named).
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        write(&self.inner.tokens).insert(token.into(), (user.into(), groups));
    }

    /// How often watches that ask for them (`allowWatchBookmarks=true`) get a BOOKMARK (the
    /// apiserver's is about a minute; tests want less).
    pub fn set_bookmark_interval(&self, every: Duration) {
        *lock(&self.inner.bookmark_interval) = every;
    }

    /// Holds every watch event this long before sending it, as a busy apiserver or a slow
    /// network does: a write is in the store (and in fresh lists) before watchers hear of it.
    pub fn delay_watch_events(&self, every: Duration) {
        *lock(&self.inner.watch_delay) = every;
    }

    /// Ends every open watch stream, as a restarting apiserver or a dropped connection would;
    /// clients resume from their last version.
    pub fn drop_watches(&self) {
        self.inner.cut.send_modify(|n| *n += 1);
    }

    /// Breaks every connection [`KubeApi::serve_tls`] accepted so far, as a restarting
    /// apiserver or a broken network would: each fails its reads and writes, and the server
    /// drops it, with no HTTP/2 GOAWAY and no end sent for the watches streaming over it.
    pub fn close_connections(&self) {
        self.inner.closing.send_modify(|n| *n += 1);
    }

    /// Says GOAWAY on every connection [`KubeApi::serve_tls`] serves, as an API server does
    /// when it shuts down and, with `--goaway-chance`, at random, so that its clients spread
    /// over the cluster's servers: an HTTP/2 connection takes no new stream, those open go on
    /// until they end, then it closes (an HTTP/1.1 one closes after its request); connections
    /// accepted after are served as before. Returns once each has queued its GOAWAY, which so
    /// goes before anything sent on it after.
    pub async fn go_away(&self) {
        let asked: Vec<_> = {
            let mut serving = lock(&self.inner.going_away);
            serving.retain(|connection| !connection.is_closed());
            serving
                .iter()
                .filter_map(|connection| {
                    let (done, said) = tokio::sync::oneshot::channel();
                    connection.send(done).ok().map(|()| said)
                })
                .collect()
        };
        for said in asked {
            let _ = said.await;
        }
    }

    /// The connections [`KubeApi::serve_tls`] accepts from now on carry at most `streams`
    /// HTTP/2 streams at once (their `SETTINGS_MAX_CONCURRENT_STREAMS`), as an API server's
    /// `--http2-max-streams-per-connection` sets: a client opening more has them refused
    /// (`REFUSED_STREAM`).
    pub fn limit_streams_per_connection(&self, streams: u32) {
        *lock(&self.inner.streams_per_connection) = Some(streams);
    }

    /// Forgets the event history, as an etcd compaction does: a watch from any version before
    /// now answers `410 Gone` (reason `Expired`).
    pub fn compact(&self) {
        self.inner.store.compact();
    }

    /// The current resourceVersion (etcd's revision): every write takes the next one.
    pub fn resource_version(&self) -> u64 {
        self.inner.store.current_rv()
    }

    /// Watches and log follows still streaming; 0 once every client has gone.
    pub fn open_streams(&self) -> usize {
        self.inner.open_streams.load(Ordering::SeqCst)
    }

    /// The whole API as one axum router (a fallback that parses Kubernetes paths itself).
    pub fn router(&self) -> axum::Router {
        axum::Router::new()
            .fallback(handlers::handle)
            .with_state(self.clone())
    }

    /// Listens on 127.0.0.1:0 and writes `dir/kubeconfig` (cluster server http://127.0.0.1:PORT,
    /// context "test" with namespace "default", user "test" with a bearer token). Dropping the
    /// returned [`Served`] stops the server and ends open watches and log follows.
    pub async fn serve(&self, dir: &Path) -> Served {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local_addr");
        let accepting = self.clone();
        let listener = axum::serve::ListenerExt::tap_io(listener, move |tcp| {
            if let Ok(peer) = tcp.peer_addr() {
                lock(&accepting.inner.accepted).push(peer);
            }
        });
        let (stop, stopped) = watch::channel(false);
        let app = self
            .router()
            .layer(axum::Extension(handlers::Shutdown(stopped.clone())));
        let mut signal = stopped;
        let task = tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = signal.wait_for(|s| *s).await;
                })
                .await;
        });
        Served::new(addr, dir, false, stop, task)
    }

    /// [`KubeApi::serve`] over TLS, as an API server is reached: the server's certificate is
    /// signed by [`tls::CA_PEM`], which the kubeconfig trusts (`certificate-authority-data`);
    /// ALPN offers `h2` and `http/1.1`, so a client that offers `h2` (kubectl, envlens' watch
    /// streams) speaks HTTP/2 and one that does not HTTP/1.1. [`KubeApi::close_connections`]
    /// closes what it accepted, [`KubeApi::go_away`] says GOAWAY on it.
    pub async fn serve_tls(&self, dir: &Path) -> Served {
        let listener = tls::Listener::bind(self.clone()).await;
        let addr = listener.addr;
        let (stop, stopped) = watch::channel(false);
        let app = self
            .router()
            .layer(axum::Extension(handlers::Shutdown(stopped.clone())));
        let task = tokio::spawn(tls::serve(listener, app, self.clone(), stopped));
        Served::new(addr, dir, true, stop, task)
    }
}

/// The kubeconfig's `cluster` lines (indented four spaces) for a server at `server`: over TLS,
/// the test CA's certificate as `certificate-authority-data`.
pub fn cluster_yaml(server: &str, tls: bool) -> String {
    let mut yaml = format!("    server: {server}\n");
    if tls {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(tls::CA_PEM);
        yaml.push_str(&format!("    certificate-authority-data: {ca}\n"));
    }
    yaml
}

fn kubeconfig_yaml(server: &str, tls: bool) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
{}contexts:
- name: test
  context:
    cluster: test
    namespace: default
    user: test
current-context: test
users:
- name: test
  user:
    token: test-token
",
        cluster_yaml(server, tls)
    )
}

/// A running server; dropping it stops the server.
pub struct Served {
    pub addr: SocketAddr,
    scheme: &'static str,
    pub kubeconfig: PathBuf,
    dir: PathBuf,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Served {
    /// Writes `dir/kubeconfig` for the server at `addr`.
    fn new(
        addr: SocketAddr,
        dir: &Path,
        tls: bool,
        stop: watch::Sender<bool>,
        task: tokio::task::JoinHandle<()>,
    ) -> Served {
        std::fs::create_dir_all(dir).expect("create kubeconfig dir");
        let kubeconfig = dir.join("kubeconfig");
        let scheme = if tls { "https" } else { "http" };
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(&format!("{scheme}://{addr}"), tls),
        )
        .expect("write kubeconfig");
        Served {
            addr,
            scheme,
            kubeconfig,
            dir: dir.to_path_buf(),
            stop,
            task: Some(task),
        }
    }

    /// The `kubernetes` section's lines (indented two spaces) that lead `agents` (ids or
    /// `<project path>:<name>`) to this server through its kubeconfig's `test` context. envlens
    /// has no default connection (SPEC 6): every agent a test reads names its context.
    pub fn connections(&self, agents: &[&str]) -> String {
        let mut yaml = format!("  kubeconfig: {}\n  agents:\n", self.kubeconfig.display());
        for agent in agents {
            yaml.push_str(&format!("  - agent: \"{agent}\"\n    context: test\n"));
        }
        yaml
    }

    /// `http://127.0.0.1:PORT`, or `https://` over [`KubeApi::serve_tls`].
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// `kubectl --kubeconfig <kubeconfig> --cache-dir <dir>/kube-cache`, so discovery caching
    /// stays inside the test's directory instead of `~/.kube/cache`.
    pub fn kubectl(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("kube-cache"));
        cmd
    }

    /// Stops the server and waits until it has closed every connection.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Lock helpers that shrug off poisoning: a panicking test thread must not cascade.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
