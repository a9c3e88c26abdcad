//! Which kinds a cluster serves that a resource group can hold: the namespaced kinds that support
//! `list`, custom resources included, one version per API group (the group's preferred version, as
//! `kubectl get` picks it).
//!
//! Discovery costs `2 + groups` requests (`/api`, `/api/v1`, `/apis`, then every group's preferred
//! version), so a [`DiscoveryCache`] per cluster keeps the answer. It is served stale while a
//! background refresh runs once it is older than the TTL (stale-while-revalidate), and dropped as
//! soon as a list answers 404 for a kind it names (a CRD removed or moved to another version): the
//! next reader then waits for the fresh one.
//!
//! Discovery runs under the cluster connection's own identity, never with a user's impersonation
//! headers: the cache is shared by every user of the cluster, and discovery documents carry kinds,
//! never objects (every authenticated user may read them through `system:discovery`).

use std::sync::{Arc, Mutex, MutexGuard};

pub use crate::resources::listing::DiscoveryFailure;

use crate::k8s::observe::{ForAgent, KnownResources};
use crate::k8s::own_rules::OwnRules;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use serde::Deserialize;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// Discovery requests in flight at once, per refresh. Real clusters with many CRDs serve 50–100
/// groups; kubectl sends them all at once, this keeps some restraint.
const DISCOVERY_IN_FLIGHT: usize = 16;

/// How long one discovery request may take before its group counts as failed.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A kind that can be listed in a namespace, at the version to list it with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ApiKind {
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
    /// The resource name in paths, e.g. `deployments`.
    pub plural: String,
    pub namespaced: bool,
    /// Whether the kind supports `watch`: the watch cache keeps only those, and lists the
    /// others fresh for every view.
    pub watchable: bool,
}

impl ApiKind {
    /// `v1` or `<group>/<version>`, as objects spell it.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `/api/v1` or `/apis/<group>/<version>`: the prefix of this kind's paths.
    pub fn group_version_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

/// The namespace's Events (core/v1), listed beside the discovered kinds of every view.
pub fn events_kind() -> ApiKind {
    ApiKind {
        group: String::new(),
        version: "v1".into(),
        kind: "Event".into(),
        plural: "events".into(),
        namespaced: true,
        watchable: true,
    }
}

/// One discovery's outcome, shared by everyone reading the cache.
#[derive(Debug, Clone)]
pub struct Discovered {
    /// Core kinds first, then groups in the order `/apis` lists them.
    pub kinds: Arc<[ApiKind]>,
    pub failures: Arc<[DiscoveryFailure]>,
    pub fetched_at: Instant,
    /// Which refresh produced this: grows by one with every refresh attempt, failed ones included.
    pub generation: u64,
}

/// The cluster could not be discovered at all: `/api`, `/api/v1` or `/apis` failed, so nothing
/// can be listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("discovery of {path} failed: {message}")]
pub struct DiscoveryError {
    pub path: String,
    /// The HTTP status, when the cluster answered.
    pub code: Option<u16>,
    pub message: String,
}

/// The discovered kinds of one cluster, cached. Cheap to clone; clones share the cache.
#[derive(Clone)]
pub struct DiscoveryCache {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    ttl: Duration,
    /// Which of the kinds the connection's own identity may list, per namespace.
    own: OwnRules,
    /// Told the resources of every discovery (the labels of the cluster's requests).
    known: KnownResources,
    state: Mutex<State>,
    /// The number of the last refresh attempt that finished.
    finished: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    current: Option<Discovered>,
    /// The last attempt's error, when it failed.
    last_error: Option<DiscoveryError>,
    /// Attempts are numbered from 1; `started` is the last one started.
    started: u64,
    finished: u64,
    running: bool,
    /// Another attempt must start once the running one ends (it began before an invalidation).
    queued: bool,
    /// Snapshots from attempts before this one are known wrong (a list answered 404).
    trusted_from: u64,
}

impl std::fmt::Debug for DiscoveryCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryCache")
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

impl DiscoveryCache {
    /// The TTL to use unless there is a reason not to. A new CRD shows from the second view after
    /// it has been a minute in the cache (the first one triggers the background refresh); a
    /// removed or re-versioned one shows at once, through the 404 of its list. A refresh costs
    /// `2 + groups` small requests in the background, once a minute at most, and only while the
    /// cluster is being viewed.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(60);

    /// A cache for the cluster `client` reaches, refreshed in the background once older than
    /// `ttl`. Nothing is requested until the first [`DiscoveryCache::kinds`].
    ///
    /// Build the client with `kube::Config::default_retry = false`: kube's default policy retries
    /// 429/503/504 up to 15 times with exponential backoff, so an aggregated API that is down
    /// would cost the request timeout instead of an immediate, reported 503.
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        Self::telling(client, ttl, KnownResources::default(), true)
    }

    /// [`DiscoveryCache::new`], telling `known` the resources of every discovery;
    /// `lists_first` as [`OwnRules::new`] takes it.
    pub fn telling(
        client: kube::Client,
        ttl: Duration,
        known: KnownResources,
        lists_first: bool,
    ) -> Self {
        DiscoveryCache {
            inner: Arc::new(Inner {
                own: OwnRules::new(client.clone(), ttl, lists_first),
                client,
                ttl,
                known,
                state: Mutex::new(State::default()),
                finished: watch::Sender::new(0),
            }),
        }
    }

    /// The listable namespaced kinds. Answers from the cache when it has a trusted snapshot,
    /// starting a background refresh when that snapshot is older than the TTL; otherwise waits
    /// for a discovery (one at a time: concurrent callers share it). When a refresh fails, the
    /// previous snapshot is still answered; only a cache that never succeeded returns the error.
    pub async fn kinds(&self) -> Result<Discovered, DiscoveryError> {
        let target = {
            let mut s = self.state();
            match &s.current {
                Some(current)
                    if current.generation >= s.trusted_from || s.finished >= s.trusted_from =>
                {
                    let current = current.clone();
                    if current.fetched_at.elapsed() >= self.inner.ttl && !s.running {
                        self.start(&mut s);
                    }
                    return Ok(current);
                }
                Some(_) => s.trusted_from,
                None if s.running => s.started,
                None => self.start(&mut s),
            }
        };
        self.outcome_of(target).await
    }

    /// Which kinds the connection's own identity may list, per namespace, asked of the
    /// cluster and kept as long as a discovery ([`OwnRules`]).
    pub fn own_rules(&self) -> &OwnRules {
        &self.inner.own
    }

    /// Drops the snapshot (e.g. a kind it names answered 404) and starts a refresh now; the next
    /// [`DiscoveryCache::kinds`] waits for it.
    pub fn invalidate(&self) {
        let mut s = self.state();
        let next = if s.running {
            s.queued = true;
            s.started + 1
        } else {
            self.start(&mut s)
        };
        s.trusted_from = s.trusted_from.max(next);
    }

    /// Discovers again now and waits for the outcome.
    pub async fn refresh(&self) -> Result<Discovered, DiscoveryError> {
        self.invalidate();
        self.kinds().await
    }

    /// The cached snapshot, without any request.
    pub fn cached(&self) -> Option<Discovered> {
        self.state().current.clone()
    }

    /// Waits until a snapshot newer than `generation` is cached (a refresh started elsewhere
    /// succeeded) and returns it. Waits forever if no refresh ever succeeds: callers bound it.
    pub async fn updated_since(&self, generation: u64) -> Discovered {
        let mut finished = self.inner.finished.subscribe();
        loop {
            if let Some(current) = self
                .state()
                .current
                .clone()
                .filter(|c| c.generation > generation)
            {
                return current;
            }
            if finished.changed().await.is_err() {
                // The sender lives as long as `self`: unreachable, but never spin.
                std::future::pending::<()>().await;
            }
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts attempt `started + 1` in the background; returns its number.
    fn start(&self, s: &mut State) -> u64 {
        s.started += 1;
        s.running = true;
        let attempt = s.started;
        let cache = self.clone();
        let cause = crate::k8s::observe::cause();
        tokio::spawn(async move {
            let outcome = crate::k8s::observe::within(cause, discover(&cache.inner.client)).await;
            cache.finish(attempt, outcome);
        });
        attempt
    }

    fn finish(
        &self,
        attempt: u64,
        outcome: Result<(Vec<ApiKind>, Vec<DiscoveryFailure>), DiscoveryError>,
    ) {
        let mut s = self.state();
        match outcome {
            Ok((kinds, failures)) => {
                for failure in &failures {
                    tracing::warn!(group_version = %failure.group_version, code = ?failure.code, message = %failure.message, "API discovery failed for a group version; its kinds are skipped");
                }
                (self.inner.known).discovered(kinds.iter().map(|k| k.plural.as_str()));
                s.current = Some(Discovered {
                    kinds: kinds.into(),
                    failures: failures.into(),
                    fetched_at: Instant::now(),
                    generation: attempt,
                });
                s.last_error = None;
            }
            Err(error) => {
                tracing::warn!(%error, "API discovery failed");
                s.last_error = Some(error);
            }
        }
        s.finished = attempt;
        s.running = false;
        if std::mem::take(&mut s.queued) {
            self.start(&mut s);
        }
        drop(s);
        self.inner.finished.send_replace(attempt);
    }

    /// Waits for attempt `target` to finish, then answers what the cache holds.
    async fn outcome_of(&self, target: u64) -> Result<Discovered, DiscoveryError> {
        let mut finished = self.inner.finished.subscribe();
        // The sender lives in `self.inner`, so this only ends once the attempt has finished.
        let _ = finished.wait_for(|done| *done >= target).await;
        let s = self.state();
        match (&s.current, &s.last_error) {
            (Some(current), _) => Ok(current.clone()),
            (None, Some(error)) => Err(error.clone()),
            (None, None) => Err(DiscoveryError {
                path: "/api".into(),
                code: None,
                message: "discovery did not run".into(),
            }),
        }
    }
}

// ---- requests ----

/// Why a GET got no usable answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The HTTP status when the cluster answered with an error; `None` when it did not answer
    /// (connection refused, timeout) or answered 2xx with a body that is not what was asked.
    pub code: Option<u16>,
    pub message: String,
    /// Whether any HTTP answer came back at all.
    pub answered: bool,
}

impl Failure {
    fn no_answer(message: String) -> Self {
        Failure {
            code: None,
            message,
            answered: false,
        }
    }

    /// A 2xx whose body could not be read as the expected document.
    pub(crate) fn bad_body(error: serde_json::Error) -> Self {
        Failure {
            code: None,
            message: format!("the answer is not valid JSON of the expected shape: {error}"),
            answered: true,
        }
    }
}

/// `GET path_and_query` with `headers` added and `Accept: application/json`; the body of a 2xx.
/// Error answers become a [`Failure`] whose message is the `Status` message when the body is one.
pub(crate) async fn get(
    client: &kube::Client,
    path_and_query: &str,
    headers: &HeaderMap,
    agent: Option<ForAgent>,
    timeout: Duration,
) -> Result<Bytes, Failure> {
    get_as(
        client,
        path_and_query,
        headers,
        agent,
        timeout,
        "application/json",
    )
    .await
}

/// The largest answer [`get_as`] reads: a page of a list, a release Secret's list, one object
/// (etcd keeps objects under 1.5 MiB by default). More is refused, not buffered.
pub(crate) const MAX_ANSWER: usize = 128 << 20;

/// [`get`], asking for `accept` (e.g. a `PartialObjectMetadataList`, falling back to JSON).
pub(crate) async fn get_as(
    client: &kube::Client,
    path_and_query: &str,
    headers: &HeaderMap,
    agent: Option<ForAgent>,
    timeout: Duration,
    accept: &'static str,
) -> Result<Bytes, Failure> {
    let mut request = Request::get(path_and_query)
        .body(kube::client::Body::empty())
        .map_err(|e| Failure::no_answer(format!("cannot build the request: {e}")))?;
    for (name, value) in headers {
        request.headers_mut().append(name, value.clone());
    }
    crate::k8s::observe::name_cause(request.headers_mut());
    request
        .headers_mut()
        .insert(header::ACCEPT, HeaderValue::from_static(accept));
    if let Some(agent) = agent {
        request.extensions_mut().insert(agent);
    }
    let exchange = async {
        let response = client.send(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(
            response.into_body(),
            MAX_ANSWER,
        ))
        .await
        .map_err(
            |e| match e.downcast_ref::<http_body_util::LengthLimitError>() {
                Some(_) => format!("the answer is over {} MiB", MAX_ANSWER >> 20),
                None => e.to_string(),
            },
        )?
        .to_bytes();
        Ok::<_, String>((status, body))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Err(Failure::no_answer(format!(
            "no answer within {} s",
            timeout.as_secs_f64()
        ))),
        Ok(Err(e)) => Err(Failure::no_answer(e)),
        Ok(Ok((status, body))) if status.is_success() => Ok(body),
        Ok(Ok((status, body))) => Err(Failure {
            code: Some(status.as_u16()),
            message: error_message(status, &body),
            answered: true,
        }),
    }
}

/// The message of a `Status` body; else the body's text, shortened; else the status' reason.
pub(crate) fn error_message(status: StatusCode, body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Status {
        #[serde(default)]
        message: String,
    }
    if let Ok(Status { message }) = serde_json::from_slice::<Status>(body) {
        if !message.is_empty() {
            return message;
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return status.canonical_reason().unwrap_or("error").to_string();
    }
    const MAX: usize = 300;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

// ---- discovery ----

async fn discover(
    client: &kube::Client,
) -> Result<(Vec<ApiKind>, Vec<DiscoveryFailure>), DiscoveryError> {
    let none = HeaderMap::new();
    let fetch = |path: &'static str| {
        let none = &none;
        async move {
            get(client, path, none, None, DISCOVERY_TIMEOUT)
                .await
                .map_err(|f| DiscoveryError {
                    path: path.into(),
                    code: f.code,
                    message: f.message,
                })
        }
    };
    // `/api` only proves the cluster speaks Kubernetes: its one version has been `v1` forever, so
    // `/api/v1` is asked at the same time rather than after it.
    let (api, core, apis) = tokio::join!(fetch("/api"), fetch("/api/v1"), fetch("/apis"));
    let invalid = |path: &str, e: serde_json::Error| DiscoveryError {
        path: path.into(),
        code: None,
        message: format!("not a discovery document: {e}"),
    };
    serde_json::from_slice::<ApiVersions>(&api?).map_err(|e| invalid("/api", e))?;
    let mut kinds = listable_kinds("", "v1", &core?).map_err(|e| invalid("/api/v1", e))?;
    let groups = preferred_versions(&apis?).map_err(|e| invalid("/apis", e))?;

    let limit = Arc::new(Semaphore::new(DISCOVERY_IN_FLIGHT));
    let mut tasks = JoinSet::new();
    let cause = crate::k8s::observe::cause();
    for (i, (group, version)) in groups.iter().cloned().enumerate() {
        let client = client.clone();
        let limit = limit.clone();
        let within = crate::k8s::observe::within;
        tasks.spawn(within(cause.clone(), async move {
            let _permit = limit.acquire_owned().await;
            let path = format!("/apis/{group}/{version}");
            let outcome =
                match get(&client, &path, &HeaderMap::new(), None, DISCOVERY_TIMEOUT).await {
                    Ok(body) => listable_kinds(&group, &version, &body).map_err(Failure::bad_body),
                    Err(failure) => Err(failure),
                };
            (i, outcome)
        }));
    }
    let mut outcomes: Vec<Option<Result<Vec<ApiKind>, Failure>>> = vec![None; groups.len()];
    while let Some(joined) = tasks.join_next().await {
        if let Ok((i, outcome)) = joined {
            outcomes[i] = Some(outcome);
        }
    }
    let mut failures = Vec::new();
    for ((group, version), outcome) in groups.into_iter().zip(outcomes) {
        let outcome = outcome
            .unwrap_or_else(|| Err(Failure::no_answer("the discovery task ended early".into())));
        match outcome {
            Ok(found) => kinds.extend(found),
            Err(failure) => failures.push(DiscoveryFailure {
                group_version: format!("{group}/{version}"),
                code: failure.code,
                message: failure.message,
            }),
        }
    }
    Ok((kinds, failures))
}

// ---- documents: pure parsing and selection ----

#[derive(Deserialize)]
struct ApiVersions {
    #[serde(default)]
    #[allow(dead_code)]
    versions: Vec<String>,
}

#[derive(Deserialize)]
struct ApiGroupList {
    #[serde(default)]
    groups: Vec<ApiGroup>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ApiGroup {
    name: String,
    #[serde(default)]
    preferred_version: Option<GroupVersion>,
    #[serde(default)]
    versions: Vec<GroupVersion>,
}

#[derive(Deserialize)]
struct GroupVersion {
    version: String,
}

#[derive(Deserialize)]
struct ApiResourceList {
    #[serde(default)]
    resources: Vec<ApiResource>,
}

#[derive(Deserialize)]
struct ApiResource {
    name: String,
    #[serde(default)]
    namespaced: bool,
    kind: String,
    #[serde(default)]
    verbs: Vec<String>,
}

/// `(group, version)` to discover for each group of an `APIGroupList` (`GET /apis`): its preferred
/// version, else the first it lists (the server's own order of preference); groups without any
/// version are skipped. Order is the document's.
fn preferred_versions(group_list: &[u8]) -> Result<Vec<(String, String)>, serde_json::Error> {
    let list: ApiGroupList = serde_json::from_slice(group_list)?;
    Ok(list
        .groups
        .into_iter()
        .filter_map(|group| {
            let version = group
                .preferred_version
                .or_else(|| group.versions.into_iter().next())?
                .version;
            (!group.name.is_empty() && !version.is_empty()).then_some((group.name, version))
        })
        .collect())
}

/// The kinds of an `APIResourceList` that a resource group lists: namespaced, with the `list`
/// verb, not a subresource (`pods/log`), and not excluded (see [`excluded`]). Document order.
fn listable_kinds(
    group: &str,
    version: &str,
    resource_list: &[u8],
) -> Result<Vec<ApiKind>, serde_json::Error> {
    let list: ApiResourceList = serde_json::from_slice(resource_list)?;
    Ok(list
        .resources
        .into_iter()
        .filter(|r| {
            r.namespaced
                && !r.name.is_empty()
                && !r.name.contains('/')
                && r.verbs.iter().any(|v| v == "list")
                && !excluded(group, &r.kind)
        })
        .map(|r| ApiKind {
            group: group.into(),
            version: version.into(),
            kind: r.kind,
            watchable: r.verbs.iter().any(|v| v == "watch"),
            plural: r.name,
            namespaced: true,
        })
        .collect())
}

/// Every kind of an `APIResourceList` that can be read by name (the `get` verb, not a
/// subresource), cluster-scoped ones included: a GitOps inventory names kinds of both scopes
/// (`k8s::gitops`), where [`listable_kinds`] keeps only what a namespace's group lists.
pub(crate) fn readable_kinds(
    group: &str,
    version: &str,
    resource_list: &[u8],
) -> Result<Vec<ApiKind>, serde_json::Error> {
    let list: ApiResourceList = serde_json::from_slice(resource_list)?;
    Ok(list
        .resources
        .into_iter()
        .filter(|r| {
            !r.name.is_empty() && !r.name.contains('/') && r.verbs.iter().any(|v| v == "get")
        })
        .map(|r| ApiKind {
            group: group.into(),
            version: version.into(),
            kind: r.kind,
            watchable: r.verbs.iter().any(|v| v == "watch"),
            plural: r.name,
            namespaced: r.namespaced,
        })
        .collect())
}

/// Kinds that are not resources of an environment, whatever their labels:
/// - Events (core and `events.k8s.io`): they are fetched once for the namespace and attached to
///   the objects they are about;
/// - `metrics.k8s.io` (PodMetrics): computed views of Pods that copy the Pod's labels, so they
///   would show every labelled Pod twice. Argo CD excludes this group by default for the same
///   reason.
fn excluded(group: &str, kind: &str) -> bool {
    matches!((group, kind), ("" | "events.k8s.io", "Event")) || group == "metrics.k8s.io"
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bytes(v: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn preferred_version_of_each_group() {
        let doc = bytes(json!({"kind": "APIGroupList", "groups": [
            {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
             "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}},
            {"name": "example.com",
             "versions": [{"groupVersion": "example.com/v2", "version": "v2"}, {"groupVersion": "example.com/v1", "version": "v1"}],
             "preferredVersion": {"groupVersion": "example.com/v1", "version": "v1"}},
            {"name": "nopreference.io", "versions": [{"groupVersion": "nopreference.io/v1beta2", "version": "v1beta2"}, {"groupVersion": "nopreference.io/v1beta1", "version": "v1beta1"}]},
            {"name": "empty.io", "versions": []},
        ]}));
        assert_eq!(
            preferred_versions(&doc).unwrap(),
            [
                ("apps".to_string(), "v1".to_string()),
                ("example.com".into(), "v1".into()),
                ("nopreference.io".into(), "v1beta2".into()),
            ]
        );
        assert_eq!(
            preferred_versions(br#"{"kind": "APIGroupList"}"#).unwrap(),
            []
        );
        assert!(preferred_versions(b"<html>").is_err());
    }

    #[test]
    fn only_namespaced_listable_kinds_are_kept() {
        let doc = bytes(
            json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod", "verbs": ["get", "list", "watch"]},
                {"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]},
                {"name": "pods/status", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get", "list"]},
                {"name": "nodes", "singularName": "node", "namespaced": false, "kind": "Node", "verbs": ["get", "list"]},
                {"name": "bindings", "singularName": "binding", "namespaced": true, "kind": "Binding", "verbs": ["create"]},
                {"name": "events", "singularName": "event", "namespaced": true, "kind": "Event", "verbs": ["list"]},
                {"name": "configmaps", "namespaced": true, "kind": "ConfigMap", "verbs": ["list"]},
            ]}),
        );
        let kinds = listable_kinds("", "v1", &doc).unwrap();
        let names: Vec<_> = kinds.iter().map(|k| k.plural.as_str()).collect();
        assert_eq!(names, ["pods", "configmaps"]);
        assert_eq!(
            kinds[0],
            ApiKind {
                group: "".into(),
                version: "v1".into(),
                kind: "Pod".into(),
                plural: "pods".into(),
                namespaced: true,
                watchable: true,
            }
        );
        assert!(!kinds[1].watchable, "configmaps say only list here");
    }

    #[test]
    fn events_and_metrics_are_excluded_custom_resources_kept() {
        let list = |kind: &str, plural: &str| {
            bytes(
                json!({"resources": [{"name": plural, "namespaced": true, "kind": kind, "verbs": ["list"]}]}),
            )
        };
        assert!(
            listable_kinds("events.k8s.io", "v1", &list("Event", "events"))
                .unwrap()
                .is_empty()
        );
        assert!(
            listable_kinds("metrics.k8s.io", "v1beta1", &list("PodMetrics", "pods"))
                .unwrap()
                .is_empty()
        );
        // A custom resource named Event is still a resource.
        assert_eq!(
            listable_kinds("example.com", "v1", &list("Event", "events")).unwrap()[0].kind,
            "Event"
        );
        let widgets =
            listable_kinds("example.com", "v1alpha1", &list("Widget", "widgets")).unwrap();
        assert_eq!(widgets[0].api_version(), "example.com/v1alpha1");
        assert_eq!(
            widgets[0].group_version_path(),
            "/apis/example.com/v1alpha1"
        );
    }

    #[test]
    fn core_paths_and_versions() {
        let pod = ApiKind {
            group: "".into(),
            version: "v1".into(),
            kind: "Pod".into(),
            plural: "pods".into(),
            namespaced: true,
            watchable: true,
        };
        assert_eq!(pod.api_version(), "v1");
        assert_eq!(pod.group_version_path(), "/api/v1");
    }

    #[test]
    fn error_messages_come_from_the_status_body() {
        let status = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods is forbidden: no","reason":"Forbidden","code":403}"#;
        assert_eq!(
            error_message(StatusCode::FORBIDDEN, status),
            "pods is forbidden: no"
        );
        assert_eq!(
            error_message(StatusCode::BAD_GATEWAY, b" upstream down \n"),
            "upstream down"
        );
        assert_eq!(
            error_message(StatusCode::SERVICE_UNAVAILABLE, b""),
            "Service Unavailable"
        );
        let long = "x".repeat(1000);
        assert_eq!(
            error_message(StatusCode::INTERNAL_SERVER_ERROR, long.as_bytes())
                .chars()
                .count(),
            301
        );
    }
}
