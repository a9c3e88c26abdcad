//! Lists the live resources of an environment from its cluster: every discovered kind with the
//! environment's label selector, the objects those own (through `ownerReferences`, transitively),
//! and the namespace's Events, in one round of concurrent requests.
//!
//! Requests are built by hand and sent with `kube::Client::send`, so that the caller's extra
//! headers (Kubernetes impersonation: `Impersonate-User`, `Impersonate-Group`, …) go on every list.
//! A kind that fails to list is reported and the rest still answers; only a cluster that cannot be
//! discovered, or that answers none of the lists, is an error.
//!
//! # Owned objects
//!
//! Controllers do not copy a parent's labels onto what they create: a Deployment's ReplicaSets and
//! Pods carry the pod template's labels, an EndpointSlice the Service's name. So the kinds that
//! Kubernetes' own controllers create are listed without the selector (see [`OWNED_KINDS`]) and
//! [`graph::owned_closure`] keeps those whose ownership chain leads to a selected object (plus the
//! Endpoints and EndpointSlices of selected Services). A child of a custom controller is found
//! when it carries the labels itself or is one of these kinds (Argo Rollouts' ReplicaSets are),
//! not otherwise: listing every kind of the namespace unselected would cost the whole namespace on
//! every view.
//!
//! When the selector is made of equality terms only (`k=v,k2=v2`, as
//! [`group::label_selector`](super::group::label_selector) builds it), an owned kind is listed
//! once, unselected, and its selected objects are picked out here by their labels: the same
//! answer as a second, selected list, for one request less per owned kind.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::discovery::{self, ApiKind, DiscoveryCache, DiscoveryError, DiscoveryFailure, Failure};
use super::graph;

/// `(group, kind)` of the kinds listed without the selector, because Kubernetes' controllers
/// create them for a parent without copying its labels:
/// - `apps` ReplicaSet: the Deployment controller's (also Argo Rollouts');
/// - `apps` ControllerRevision: StatefulSet and DaemonSet history;
/// - core Pod: ReplicaSet, StatefulSet, DaemonSet and Job controllers';
/// - `batch` Job: the CronJob controller's;
/// - `discovery.k8s.io` EndpointSlice: owned by its Service;
/// - core Endpoints: named as their Service, no owner reference;
/// - core PersistentVolumeClaim: a StatefulSet's claim templates (owned by the StatefulSet or Pod
///   under `persistentVolumeClaimRetentionPolicy`).
pub const OWNED_KINDS: &[(&str, &str)] = &[
    ("apps", "ReplicaSet"),
    ("apps", "ControllerRevision"),
    ("", "Pod"),
    ("batch", "Job"),
    ("discovery.k8s.io", "EndpointSlice"),
    ("", "Endpoints"),
    ("", "PersistentVolumeClaim"),
];

/// How hard to press the cluster, and how much to keep.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// List requests in flight at once (pages included). Every kind is one request per page of
    /// `page_size`, so with this at or above the number of kinds plus one (the Events) a view
    /// costs one round trip.
    pub max_in_flight: usize,
    /// How long one list request (one page) may take before its kind is reported as failed.
    pub request_timeout: Duration,
    /// `limit` of each list request; `continue` tokens are followed for the rest.
    pub page_size: usize,
    /// Events kept per resource, most recent first.
    pub events_per_resource: usize,
}

impl Default for FetchOptions {
    /// 64 in flight: one round for clusters with up to 63 namespaced kinds; the apiserver's
    /// default `--max-requests-inflight` is 400 for all clients together. 10 s per request, pages
    /// of 500 (kubectl's `--chunk-size`), 10 events per resource.
    fn default() -> Self {
        FetchOptions {
            max_in_flight: 64,
            request_timeout: Duration::from_secs(10),
            page_size: 500,
            events_per_resource: 10,
        }
    }
}

/// A kind that could not be listed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct ListError {
    pub api_version: String,
    pub kind: String,
    /// The HTTP status, when the cluster answered (403, 404, 500, …); `None` for a timeout or a
    /// connection failure.
    pub code: Option<u16>,
    /// The `Status` message when the answer carried one.
    pub message: String,
}

/// One Event about a resource, flattened from a core/v1 Event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ResourceEvent {
    /// `Normal` or `Warning`.
    pub event_type: String,
    pub reason: String,
    pub message: String,
    /// How many times it happened (`count`, or `series.count`), at least 1.
    pub count: u32,
    /// `firstTimestamp`, else `eventTime`, else the Event's creation.
    pub first_seen: Option<DateTime<Utc>>,
    /// `series.lastObservedTime`, else `lastTimestamp`, else `eventTime`, else `first_seen`.
    pub last_seen: Option<DateTime<Utc>>,
    /// The component that reported it (`source.component` or `reportingComponent`).
    pub source: Option<String>,
}

/// What the cluster answered for one environment, before assembly into a view.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub namespace: String,
    pub label_selector: String,
    /// The label-selected objects, one per uid, `apiVersion` and `kind` filled in.
    pub selected: Vec<Value>,
    /// The objects whose ownership chain leads to a selected one (and the Endpoints and
    /// EndpointSlices of selected Services), one per uid, none of them selected.
    pub owned: Vec<Value>,
    /// Events by the uid of the object they are about (only objects above), most recent first.
    pub events: HashMap<String, Vec<ResourceEvent>>,
    /// Kinds that failed to list (the Events included, as `v1 Event`), by apiVersion and kind.
    pub errors: Vec<ListError>,
    /// Group versions left out because their discovery failed.
    pub unavailable: Arc<[DiscoveryFailure]>,
}

/// Nothing could be listed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FetchError {
    #[error("cannot reach the cluster: {0}")]
    Discovery(#[from] DiscoveryError),
    /// Discovery came from the cache, but no list request got any answer.
    #[error("cannot reach the cluster: {0}")]
    Unreachable(String),
    #[error("a namespace is required")]
    NoNamespace,
}

/// Lists the resource group of `label_selector` in `namespace`: see the module documentation.
/// `headers` go on every list request (not on discovery, which the cache shares between users).
/// `client` should not retry by itself (`kube::Config::default_retry = false`, see
/// [`DiscoveryCache::new`]), or a 503 costs `options.request_timeout` instead of an error entry.
/// Requests run concurrently, at most `options.max_in_flight` at once: the selected lists, the
/// unselected lists of [`OWNED_KINDS`] and the Events all in the same round. A list answering
/// 404 invalidates `discovery`, so the next call sees the cluster's current kinds.
pub async fn list_resource_group(
    client: &kube::Client,
    discovery: &DiscoveryCache,
    headers: &HeaderMap,
    namespace: &str,
    label_selector: &str,
    options: &FetchOptions,
) -> Result<Listing, FetchError> {
    if namespace.is_empty() {
        return Err(FetchError::NoNamespace);
    }
    let discovered = discovery.kinds().await?;
    let terms = equality_terms(label_selector);
    let jobs = plan(
        &discovered.kinds,
        namespace,
        label_selector,
        terms.is_some(),
    );

    let outcomes = run(client, headers, &jobs, options).await;

    let mut selected = Vec::new();
    let mut candidates = Vec::new();
    let mut events = Vec::new();
    let mut errors = Vec::new();
    let mut answered = false;
    let mut kind_gone = false;
    for (job, outcome) in jobs.iter().zip(outcomes) {
        let items = match outcome {
            Ok(items) => items,
            Err(failure) => {
                answered |= failure.answered;
                kind_gone |= failure.code == Some(404) && job.purpose != Purpose::Events;
                tracing::debug!(api_version = %job.api_version, kind = %job.kind, code = ?failure.code, message = %failure.message, "list failed");
                errors.push(ListError {
                    api_version: job.api_version.clone(),
                    kind: job.kind.clone(),
                    code: failure.code,
                    message: failure.message,
                });
                continue;
            }
        };
        answered = true;
        match job.purpose {
            Purpose::Selected => selected.extend(items),
            Purpose::Unselected => match &terms {
                Some(terms) => {
                    for item in items {
                        if labels_match(terms, &item) {
                            selected.push(item);
                        } else {
                            candidates.push(item);
                        }
                    }
                }
                None => candidates.extend(items),
            },
            Purpose::Events => events = items,
        }
    }
    if !answered {
        let message = errors
            .first()
            .map(|e| e.message.clone())
            .unwrap_or_default();
        return Err(FetchError::Unreachable(message));
    }
    if kind_gone {
        discovery.invalidate();
    }

    let selected = unique_by_uid(selected, &HashSet::new());
    let owned_at: HashSet<usize> = graph::owned_closure(&selected, &candidates)
        .into_iter()
        .collect();
    let owned = candidates
        .into_iter()
        .enumerate()
        .filter(|(i, _)| owned_at.contains(i))
        .map(|(_, object)| object);
    let selected_uids: HashSet<String> = selected
        .iter()
        .filter_map(uid)
        .map(str::to_string)
        .collect();
    let owned = unique_by_uid(owned, &selected_uids);
    let in_group: HashSet<&str> = selected.iter().chain(&owned).filter_map(uid).collect();
    let events = events_by_object(events, &in_group, options.events_per_resource);

    errors.sort();
    errors.dedup_by(|a, b| a.api_version == b.api_version && a.kind == b.kind);
    Ok(Listing {
        namespace: namespace.to_string(),
        label_selector: label_selector.to_string(),
        selected,
        owned,
        events,
        errors,
        unavailable: discovered.failures.clone(),
    })
}

// ---- the round of requests ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// Listed with the selector: everything it answers is selected.
    Selected,
    /// An owned kind listed without the selector: candidates for the ownership walk, and the
    /// selected objects too when the selector has only equality terms.
    Unselected,
    Events,
}

/// One list, followed through its pages.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Job {
    api_version: String,
    kind: String,
    /// `/api/v1/namespaces/ns/pods`
    path: String,
    label_selector: Option<String>,
    purpose: Purpose,
}

fn is_owned_kind(kind: &ApiKind) -> bool {
    OWNED_KINDS
        .iter()
        .any(|(group, name)| kind.group == *group && kind.kind == *name)
}

/// The lists to send: every kind with the selector, except owned kinds, which are listed
/// without it (and with it too when `local_selection` is false: the selector cannot be applied
/// here), then the namespace's Events.
fn plan(
    kinds: &[ApiKind],
    namespace: &str,
    label_selector: &str,
    local_selection: bool,
) -> Vec<Job> {
    let namespace = encode(namespace);
    let mut jobs = Vec::with_capacity(kinds.len() + 8);
    for kind in kinds {
        let job = |label_selector: Option<String>, purpose| Job {
            api_version: kind.api_version(),
            kind: kind.kind.clone(),
            path: format!(
                "{}/namespaces/{namespace}/{}",
                kind.group_version_path(),
                encode(&kind.plural)
            ),
            label_selector,
            purpose,
        };
        let owned = is_owned_kind(kind);
        if owned {
            jobs.push(job(None, Purpose::Unselected));
        }
        if !owned || !local_selection {
            jobs.push(job(Some(label_selector.to_string()), Purpose::Selected));
        }
    }
    jobs.push(Job {
        api_version: "v1".into(),
        kind: "Event".into(),
        path: format!("/api/v1/namespaces/{namespace}/events"),
        label_selector: None,
        purpose: Purpose::Events,
    });
    jobs
}

/// Runs every job concurrently (each one a task, so that pages are parsed on every core),
/// with at most `max_in_flight` requests in flight; outcomes in job order.
async fn run(
    client: &kube::Client,
    headers: &HeaderMap,
    jobs: &[Job],
    options: &FetchOptions,
) -> Vec<Result<Vec<Value>, Failure>> {
    let in_flight = Arc::new(Semaphore::new(options.max_in_flight.max(1)));
    let headers = Arc::new(headers.clone());
    let mut tasks = JoinSet::new();
    for (i, job) in jobs.iter().enumerate() {
        let pages = Pages {
            client: client.clone(),
            in_flight: in_flight.clone(),
            headers: headers.clone(),
            job: job.clone(),
            page_size: options.page_size.max(1),
            timeout: options.request_timeout,
        };
        tasks.spawn(async move { (i, pages.list().await) });
    }
    let mut outcomes: Vec<Option<Result<Vec<Value>, Failure>>> = vec![None; jobs.len()];
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((i, outcome)) => outcomes[i] = Some(outcome),
            Err(e) => tracing::error!(error = %e, "a list task failed"),
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| {
                Err(Failure {
                    code: None,
                    message: "the list stopped unexpectedly".into(),
                    answered: false,
                })
            })
        })
        .collect()
}

struct Pages {
    client: kube::Client,
    in_flight: Arc<Semaphore>,
    headers: Arc<HeaderMap>,
    job: Job,
    page_size: usize,
    timeout: Duration,
}

#[derive(Deserialize)]
struct ListPage {
    #[serde(default)]
    metadata: ListMeta,
    /// Go encodes an empty list as `null` in some versions.
    #[serde(default)]
    items: Option<Vec<Value>>,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "continue")]
    continue_token: Option<String>,
}

impl Pages {
    /// Every item of the list, following `continue`. An expired token (410) restarts the list
    /// once without `limit`, as client-go's pager does.
    async fn list(&self) -> Result<Vec<Value>, Failure> {
        let mut items = Vec::new();
        let mut token: Option<String> = None;
        let mut paged = true;
        loop {
            let uri = self.uri(paged, token.as_deref());
            let body = {
                let _permit = self.in_flight.acquire().await;
                discovery::get(&self.client, &uri, &self.headers, self.timeout).await
            };
            let body = match body {
                Err(Failure {
                    code: Some(410), ..
                }) if token.is_some() && paged => {
                    items.clear();
                    token = None;
                    paged = false;
                    continue;
                }
                other => other?,
            };
            let page: ListPage = serde_json::from_slice(&body).map_err(Failure::bad_body)?;
            let mut page_items = page.items.unwrap_or_default();
            for item in &mut page_items {
                fill_type(item, &self.job.api_version, &self.job.kind);
            }
            items.append(&mut page_items);
            match page.metadata.continue_token.filter(|t| !t.is_empty()) {
                Some(next) if paged => token = Some(next),
                _ => return Ok(items),
            }
        }
    }

    fn uri(&self, paged: bool, token: Option<&str>) -> String {
        let mut query = Vec::new();
        if let Some(selector) = &self.job.label_selector {
            query.push(format!("labelSelector={}", encode(selector)));
        }
        if paged {
            query.push(format!("limit={}", self.page_size));
        }
        if let Some(token) = token {
            query.push(format!("continue={}", encode(token)));
        }
        if query.is_empty() {
            self.job.path.clone()
        } else {
            format!("{}?{}", self.job.path, query.join("&"))
        }
    }
}

// ---- pure helpers ----

/// Percent-encodes everything but RFC 3986's unreserved characters: safe in a path segment and
/// in a query value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// List items omit `apiVersion` and `kind` (the list carries them): put them back.
fn fill_type(item: &mut Value, api_version: &str, kind: &str) {
    if let Some(object) = item.as_object_mut() {
        for (field, value) in [("apiVersion", api_version), ("kind", kind)] {
            if !object.get(field).is_some_and(Value::is_string) {
                object.insert(field.into(), Value::String(value.into()));
            }
        }
    }
}

/// The `key=value` terms of a selector made only of equality terms (`=` or `==`), or `None` when
/// it has any other kind of term (`!=`, `in`, `notin`, `exists`, `!key`), which only the
/// apiserver applies. An empty selector is `Some(vec![])`: it selects everything.
fn equality_terms(selector: &str) -> Option<Vec<(String, String)>> {
    let mut terms = Vec::new();
    if selector.trim().is_empty() {
        return Some(terms);
    }
    for term in selector.split(',') {
        let (key, value) = term.split_once("==").or_else(|| term.split_once('='))?;
        let (key, value) = (key.trim(), value.trim());
        let plain = |s: &str| !s.contains(['!', '(', ')', ' ', '=']);
        if key.is_empty() || !plain(key) || !plain(value) {
            return None;
        }
        terms.push((key.to_string(), value.to_string()));
    }
    Some(terms)
}

fn labels_match(terms: &[(String, String)], object: &Value) -> bool {
    let labels = object.pointer("/metadata/labels");
    terms.iter().all(|(key, value)| {
        labels.and_then(|l| l.get(key)).and_then(Value::as_str) == Some(value.as_str())
    })
}

fn uid(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
}

/// The first object of each uid, in order; objects without a uid or whose uid is in `skip` are
/// dropped (the same object can come from two groups, e.g. `extensions` and `networking.k8s.io`
/// Ingresses on older clusters).
fn unique_by_uid(objects: impl IntoIterator<Item = Value>, skip: &HashSet<String>) -> Vec<Value> {
    let mut seen: HashSet<String> = HashSet::new();
    objects
        .into_iter()
        .filter(|object| {
            uid(object).is_some_and(|u| !skip.contains(u) && seen.insert(u.to_string()))
        })
        .collect()
}

fn time_at(object: &Value, pointer: &str) -> Option<DateTime<Utc>> {
    let text = object.pointer(pointer)?.as_str()?;
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn text_at(object: &Value, pointer: &str) -> Option<String> {
    object
        .pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

impl ResourceEvent {
    /// Reads a core/v1 Event (old-style `firstTimestamp`/`lastTimestamp`/`count` or new-style
    /// `eventTime`/`series`); missing fields are empty.
    pub fn from_event(event: &Value) -> Self {
        let first_seen = time_at(event, "/firstTimestamp")
            .or_else(|| time_at(event, "/eventTime"))
            .or_else(|| time_at(event, "/metadata/creationTimestamp"));
        let last_seen = time_at(event, "/series/lastObservedTime")
            .or_else(|| time_at(event, "/lastTimestamp"))
            .or_else(|| time_at(event, "/eventTime"))
            .or(first_seen);
        let count = event
            .get("count")
            .and_then(Value::as_u64)
            .or_else(|| event.pointer("/series/count").and_then(Value::as_u64))
            .unwrap_or(1)
            .clamp(1, u32::MAX as u64) as u32;
        ResourceEvent {
            event_type: text_at(event, "/type").unwrap_or_default(),
            reason: text_at(event, "/reason").unwrap_or_default(),
            message: text_at(event, "/message").unwrap_or_default(),
            count,
            first_seen,
            last_seen,
            source: text_at(event, "/source/component")
                .or_else(|| text_at(event, "/reportingComponent")),
        }
    }
}

/// Events by `involvedObject.uid`, only for uids in `keep`; each object's most recent first (by
/// `last_seen`, undated ones last, then by Event name), at most `per_object`.
fn events_by_object(
    events: Vec<Value>,
    keep: &HashSet<&str>,
    per_object: usize,
) -> HashMap<String, Vec<ResourceEvent>> {
    let mut grouped: HashMap<String, Vec<(ResourceEvent, String)>> = HashMap::new();
    for event in &events {
        let Some(about) = event
            .pointer("/involvedObject/uid")
            .and_then(Value::as_str)
            .filter(|u| keep.contains(u))
        else {
            continue;
        };
        let name = text_at(event, "/metadata/name").unwrap_or_default();
        grouped
            .entry(about.to_string())
            .or_default()
            .push((ResourceEvent::from_event(event), name));
    }
    grouped
        .into_iter()
        .map(|(uid, mut events)| {
            events.sort_by(|(a, a_name), (b, b_name)| {
                b.last_seen
                    .is_some()
                    .cmp(&a.last_seen.is_some())
                    .then(b.last_seen.cmp(&a.last_seen))
                    .then(a_name.cmp(b_name))
            });
            events.truncate(per_object);
            (uid, events.into_iter().map(|(e, _)| e).collect())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kind(group: &str, version: &str, kind: &str, plural: &str) -> ApiKind {
        ApiKind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
        }
    }

    #[test]
    fn equality_selectors_are_applied_locally_others_are_not() {
        let sel = "app.gitlab.com/project_id=42,app.gitlab.com/environment_slug=review-x";
        assert_eq!(
            equality_terms(sel).unwrap(),
            [
                ("app.gitlab.com/project_id".to_string(), "42".to_string()),
                ("app.gitlab.com/environment_slug".into(), "review-x".into())
            ]
        );
        assert_eq!(
            equality_terms("a == b").unwrap(),
            [("a".to_string(), "b".to_string())]
        );
        assert_eq!(equality_terms("").unwrap(), []);
        assert_eq!(
            equality_terms("a="),
            Some(vec![("a".to_string(), String::new())])
        );
        for other in [
            "a!=b",
            "a in (x,y)",
            "a notin (x)",
            "a",
            "!a",
            "=b",
            "a=b=c",
        ] {
            assert_eq!(equality_terms(other), None, "{other}");
        }
    }

    #[test]
    fn labels_match_every_term() {
        let terms = equality_terms("a=1,b=2").unwrap();
        let obj = |labels: Value| json!({"metadata": {"labels": labels}});
        assert!(labels_match(
            &terms,
            &obj(json!({"a": "1", "b": "2", "c": "3"}))
        ));
        assert!(!labels_match(&terms, &obj(json!({"a": "1"}))));
        assert!(!labels_match(&terms, &obj(json!({"a": "1", "b": "3"}))));
        assert!(!labels_match(&terms, &json!({"metadata": {}})));
        assert!(labels_match(&[], &json!({})));
    }

    #[test]
    fn owned_kinds_go_unselected_in_the_same_round() {
        let kinds = [
            kind("", "v1", "Pod", "pods"),
            kind("", "v1", "ConfigMap", "configmaps"),
            kind("apps", "v1", "ReplicaSet", "replicasets"),
            kind("example.com", "v1", "Pod", "pods"),
        ];
        let jobs = plan(&kinds, "my ns", "a=b", true);
        let summary: Vec<_> = jobs
            .iter()
            .map(|j| (j.path.as_str(), j.label_selector.as_deref(), j.purpose))
            .collect();
        assert_eq!(
            summary,
            [
                ("/api/v1/namespaces/my%20ns/pods", None, Purpose::Unselected),
                (
                    "/api/v1/namespaces/my%20ns/configmaps",
                    Some("a=b"),
                    Purpose::Selected
                ),
                (
                    "/apis/apps/v1/namespaces/my%20ns/replicasets",
                    None,
                    Purpose::Unselected
                ),
                // A custom kind named Pod is not the core Pod.
                (
                    "/apis/example.com/v1/namespaces/my%20ns/pods",
                    Some("a=b"),
                    Purpose::Selected
                ),
                ("/api/v1/namespaces/my%20ns/events", None, Purpose::Events),
            ]
        );
        // A selector only the apiserver can apply: owned kinds are listed both ways.
        let jobs = plan(&kinds[..1], "ns", "a in (b)", false);
        let purposes: Vec<_> = jobs.iter().map(|j| j.purpose).collect();
        assert_eq!(
            purposes,
            [Purpose::Unselected, Purpose::Selected, Purpose::Events]
        );
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(
            encode("app.gitlab.com/project_id=42,x in (a b)"),
            "app.gitlab.com%2Fproject_id%3D42%2Cx%20in%20%28a%20b%29"
        );
        assert_eq!(encode("eyJ2Ijoi+/=="), "eyJ2Ijoi%2B%2F%3D%3D");
    }

    #[test]
    fn list_items_get_their_type() {
        let mut item = json!({"metadata": {"name": "x"}});
        fill_type(&mut item, "apps/v1", "Deployment");
        assert_eq!(item["apiVersion"], "apps/v1");
        assert_eq!(item["kind"], "Deployment");
        let mut typed = json!({"apiVersion": "example.com/v2", "kind": "Widget"});
        fill_type(&mut typed, "example.com/v1", "Widget");
        assert_eq!(
            typed["apiVersion"], "example.com/v2",
            "the server's own word stays"
        );
    }

    #[test]
    fn objects_are_unique_by_uid() {
        let o = |uid: &str, name: &str| json!({"metadata": {"uid": uid, "name": name}});
        let skip: HashSet<String> = ["s".to_string()].into();
        let kept = unique_by_uid(
            vec![
                o("a", "1"),
                o("b", "2"),
                o("a", "3"),
                o("s", "4"),
                json!({"metadata": {}}),
            ],
            &skip,
        );
        let names: Vec<_> = kept
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["1", "2"]);
    }

    #[test]
    fn events_are_grouped_most_recent_first_and_capped() {
        let ev = |name: &str, uid: &str, last: Option<&str>| {
            let mut e = json!({
                "metadata": {"name": name, "creationTimestamp": "2024-01-01T00:00:00Z"},
                "involvedObject": {"uid": uid}, "type": "Normal", "reason": name, "message": "m",
            });
            if let Some(last) = last {
                e["lastTimestamp"] = json!(last);
                e["firstTimestamp"] = json!("2024-01-01T00:00:00Z");
                e["count"] = json!(3);
            }
            e
        };
        let events = vec![
            ev("old", "a", Some("2024-01-02T00:00:00Z")),
            ev("undated-ish", "a", None),
            ev("new", "a", Some("2024-01-05T00:00:00Z")),
            ev("mid", "a", Some("2024-01-03T00:00:00Z")),
            ev("other", "b", Some("2024-01-03T00:00:00Z")),
            ev("stranger", "z", Some("2024-01-03T00:00:00Z")),
            json!({"reason": "no object"}),
        ];
        let keep: HashSet<&str> = ["a", "b"].into();
        let grouped = events_by_object(events, &keep, 3);
        let reasons: Vec<_> = grouped["a"].iter().map(|e| e.reason.as_str()).collect();
        // "undated-ish" falls back to its creation time, the oldest.
        assert_eq!(reasons, ["new", "mid", "old"]);
        assert_eq!(grouped["b"].len(), 1);
        assert!(!grouped.contains_key("z"));
        assert_eq!(grouped["a"][0].count, 3);
        assert_eq!(
            grouped["a"][0].last_seen.unwrap().to_rfc3339(),
            "2024-01-05T00:00:00+00:00"
        );
    }

    #[test]
    fn new_style_events_are_read() {
        let event = json!({
            "metadata": {"name": "e", "creationTimestamp": "2024-03-01T00:00:00Z"},
            "eventTime": "2024-03-01T10:00:00.123456Z",
            "series": {"count": 7, "lastObservedTime": "2024-03-01T11:00:00.000000Z"},
            "reportingComponent": "kubelet", "type": "Warning", "reason": "BackOff",
            "message": "Back-off restarting failed container",
        });
        let e = ResourceEvent::from_event(&event);
        assert_eq!(e.count, 7);
        assert_eq!(e.source.as_deref(), Some("kubelet"));
        assert_eq!(e.event_type, "Warning");
        assert_eq!(
            e.first_seen.unwrap().to_rfc3339(),
            "2024-03-01T10:00:00.123456+00:00"
        );
        assert_eq!(
            e.last_seen.unwrap().to_rfc3339(),
            "2024-03-01T11:00:00+00:00"
        );
        let bare = ResourceEvent::from_event(&json!({}));
        assert_eq!((bare.count, bare.first_seen, bare.source), (1, None, None));
    }
}
