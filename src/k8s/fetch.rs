//! Lists the live resources of an environment from its cluster: every discovered kind with the
//! environment's label selector, the objects those own (through `ownerReferences`, transitively),
//! and the namespace's Events, in one round of concurrent requests.
//!
//! Requests are built by hand and sent with `kube::Client::send`, so that the caller's extra
//! headers (Kubernetes impersonation: `Impersonate-User`, `Impersonate-Group`, …) go on every list.
//! A kind that fails to list is reported and the rest still answers; only a cluster that cannot be
//! discovered, or that answers none of the lists, is an error. Under the connection's own
//! identity (no impersonation), only the kinds it may list in the namespace are listed; the
//! others are named in a warning ([`own_rules`](crate::k8s::own_rules)).
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
//! [`group::label_selector`](crate::resources::group::label_selector) builds it), an owned kind is listed
//! once, unselected, and its selected objects are picked out here by their labels: the same
//! answer as a second, selected list, for one request less per owned kind.
//!
//! # Parsing
//!
//! JSON trees are what a view costs beyond the wire, so only what is read becomes one. Each item
//! becomes an [`Object`]: the fields the graph, health and assembly read, and its text for
//! `manifest`, from one pass over the page ([`page::Item`]): the fields, the text and where its
//! `metadata.managedFields` lie (left out of the text) come from the same scan. Items of the
//! owned kinds, listed unselected, are built the same way before the ownership walk reads them:
//! reading only their heads and parsing the kept ones again scanned each kept object twice,
//! which cost more than building the other environments' trees. Events parse into a typed
//! struct. Pages are parsed in the task that fetched them, on any core, while other requests
//! are still in flight.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::resources::tree::{Map, Tree};
use axum::http::HeaderMap;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::discovery::{self, ApiKind, DiscoveryCache, DiscoveryError, Failure};
use crate::k8s::observe::{self, ForAgent};
use crate::k8s::own_rules::{self, OwnView};
use crate::resources::graph;
use crate::resources::listing::{ListError, Listing, ResourceEvent};
use crate::resources::object::Object;
use crate::resources::page;
use crate::resources::timeline;

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
    /// The agent the lists are made for, as the cluster metrics name it.
    pub agent: Option<i64>,
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
            agent: None,
        }
    }
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
    // Discovery and the own-rules review, when this view starts them, are its own.
    let discovered = observe::caused_by(headers, discovery.kinds()).await?;
    let view = own_view(discovery, headers, namespace, discovered, options);
    let view = observe::caused_by(headers, view).await;
    let mut jobs = plan(
        &view.discovered.kinds,
        namespace,
        label_selector,
        equality_terms(label_selector),
    );
    if !view.events {
        jobs.retain(|job| job.purpose != Purpose::Events);
    }

    let outcomes = run(client, headers, &jobs, options).await;
    let mut listing = into_listing(
        &jobs,
        outcomes,
        &view.discovered,
        discovery,
        namespace,
        label_selector,
        options,
    )
    .await?;
    listing.warnings.extend(view.warning);
    Ok(listing)
}

/// What a view lists of `discovered`: under the connection's own identity, only the kinds it
/// may list in `namespace` ([`OwnView`]); as an impersonated user, everything (the user's own
/// rights decide, and refusals are reported per kind).
pub(crate) async fn own_view(
    discovery: &DiscoveryCache,
    headers: &HeaderMap,
    namespace: &str,
    discovered: discovery::Discovered,
    options: &FetchOptions,
) -> OwnView {
    if !own_rules::is_own_identity(headers) {
        return OwnView::all(discovered);
    }
    let rules = discovery
        .own_rules()
        .get(namespace, options.request_timeout)
        .await;
    OwnView::new(rules.as_deref(), discovered, namespace)
}

/// Turns each job's outcome (from the cluster's lists or from the watch cache) into the
/// listing: the selected objects, what they own, their Events and the kinds that failed.
pub(crate) async fn into_listing(
    jobs: &[Job],
    outcomes: Vec<Result<Listed, Failure>>,
    discovered: &discovery::Discovered,
    discovery: &DiscoveryCache,
    namespace: &str,
    label_selector: &str,
    options: &FetchOptions,
) -> Result<Listing, FetchError> {
    let mut selected = Vec::new();
    let mut candidates = Vec::new();
    let mut events = Vec::new();
    let mut errors = Vec::new();
    let mut answered = false;
    let mut kind_gone = false;
    for (job, outcome) in jobs.iter().zip(outcomes) {
        match outcome {
            Ok(Listed::Objects(objects)) => selected.extend(objects),
            Ok(Listed::Unselected {
                selected: picked,
                candidates: rest,
            }) => {
                selected.extend(picked);
                candidates.extend(rest);
            }
            Ok(Listed::Events(docs)) => events = docs,
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
        }
        answered = true;
    }
    // No job at all: the identity may list nothing here (the listing's warning says so).
    if !answered && !jobs.is_empty() {
        let message = errors
            .first()
            .map(|e| e.message.clone())
            .unwrap_or_default();
        return Err(FetchError::Unreachable(message));
    }
    if kind_gone {
        discovery.invalidate();
    }

    // CPU work over what may be 100,000 objects: off the async runtime's threads.
    let (selected, owned) = super::off_runtime(move || {
        let selected = unique_by_uid(selected, &HashSet::new());
        let owned = owned_candidates(&selected, candidates);
        // Objects from the watch cache stay shared with it: the listing and the group hold
        // them, nothing copies them.
        (selected, owned)
    })
    .await;
    let in_group: HashSet<&str> = selected
        .iter()
        .chain(&owned)
        .filter_map(|o| uid(&o.view))
        .collect();
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
        warnings: Vec::new(),
    })
}

/// The candidates whose ownership chain leads to `selected`, one per uid and none selected.
pub(crate) fn owned_candidates(
    selected: &[Arc<Object>],
    candidates: Vec<Arc<Object>>,
) -> Vec<Arc<Object>> {
    let mut keep = vec![false; candidates.len()];
    {
        let roots: Vec<&Tree> = selected.iter().map(|o| &*o.view).collect();
        let heads: Vec<&Tree> = candidates.iter().map(|o| &*o.view).collect();
        // `owned_closure` returns no candidate of a selected object's uid: only a uid given
        // twice among the candidates is left to keep once.
        let mut seen: HashSet<&str> = HashSet::new();
        for i in graph::owned_closure(&roots, &heads) {
            keep[i] = uid(heads[i]).is_some_and(|u| seen.insert(u));
        }
    }
    candidates
        .into_iter()
        .zip(keep)
        .filter(|(_, keep)| *keep)
        .map(|(candidate, _)| candidate)
        .collect()
}

// ---- the round of requests ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Listed with the selector: everything it answers is selected.
    Selected,
    /// An owned kind listed without the selector: candidates for the ownership walk, and the
    /// selected objects too when the selector has only equality terms.
    Unselected,
    Events,
}

/// One list, followed through its pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Job {
    pub api_version: String,
    pub kind: String,
    /// `/api/v1/namespaces/ns/pods`
    pub path: String,
    pub label_selector: Option<String>,
    pub purpose: Purpose,
    /// For an unselected list: the selector's terms, when objects can be selected here.
    pub local_terms: Option<Arc<[(String, String)]>>,
}

fn is_owned_kind(kind: &ApiKind) -> bool {
    OWNED_KINDS
        .iter()
        .any(|(group, name)| kind.group == *group && kind.kind == *name)
}

/// The lists to send: every kind with the selector, except owned kinds, which are listed
/// without it (and with it too when `terms` is `None`: the selector cannot be applied here),
/// then the namespace's Events.
pub(crate) fn plan(
    kinds: &[ApiKind],
    namespace: &str,
    label_selector: &str,
    terms: Option<Vec<(String, String)>>,
) -> Vec<Job> {
    let terms: Option<Arc<[(String, String)]>> = terms.map(Into::into);
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
            local_terms: None,
        };
        let owned = is_owned_kind(kind);
        if owned {
            jobs.push(Job {
                local_terms: terms.clone(),
                ..job(None, Purpose::Unselected)
            });
        }
        if !owned || terms.is_none() {
            jobs.push(job(Some(label_selector.to_string()), Purpose::Selected));
        }
    }
    jobs.push(Job {
        api_version: "v1".into(),
        kind: "Event".into(),
        path: format!("/api/v1/namespaces/{namespace}/events"),
        label_selector: None,
        purpose: Purpose::Events,
        local_terms: None,
    });
    jobs
}

/// What the pages of one job yield.
pub(crate) enum Listed {
    /// A selected list's objects (shared with the watch cache when they come from it).
    Objects(Vec<Arc<Object>>),
    /// An owned kind listed without the selector: the objects the selector's terms pick here,
    /// and the others as candidates for the ownership walk.
    Unselected {
        selected: Vec<Arc<Object>>,
        /// What the selector did not pick, for the ownership walk.
        candidates: Vec<Arc<Object>>,
    },
    Events(Vec<EventDoc>),
}

/// Runs every job concurrently (each one a task, so that pages are parsed on every core),
/// with at most `max_in_flight` requests in flight; outcomes in job order.
pub(crate) async fn run(
    client: &kube::Client,
    headers: &HeaderMap,
    jobs: &[Job],
    options: &FetchOptions,
) -> Vec<Result<Listed, Failure>> {
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
            agent: options.agent.map(ForAgent),
        };
        tasks.spawn(async move { (i, pages.list().await) });
    }
    let mut outcomes: Vec<Option<Result<Listed, Failure>>> =
        (0..jobs.len()).map(|_| None).collect();
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
    agent: Option<ForAgent>,
}

impl Pages {
    /// Every item of the list, following `continue`. An expired token (410) restarts the list
    /// once without `limit`, as client-go's pager does.
    async fn list(&self) -> Result<Listed, Failure> {
        let mut listed = self.empty();
        let mut token: Option<String> = None;
        let mut paged = true;
        loop {
            let uri = self.uri(paged, token.as_deref());
            let body = {
                let _permit = self.in_flight.acquire().await;
                discovery::get(&self.client, &uri, &self.headers, self.agent, self.timeout).await
            };
            let body = match body {
                Err(Failure {
                    code: Some(410), ..
                }) if token.is_some() && paged => {
                    listed = self.empty();
                    token = None;
                    paged = false;
                    continue;
                }
                other => other?,
            };
            let next = self.take(&body, &mut listed).map_err(Failure::bad_body)?;
            match next.filter(|t| !t.is_empty()) {
                Some(next) if paged => token = Some(next),
                _ => return Ok(listed),
            }
        }
    }

    fn empty(&self) -> Listed {
        match self.job.purpose {
            Purpose::Selected => Listed::Objects(Vec::new()),
            Purpose::Unselected => Listed::Unselected {
                selected: Vec::new(),
                candidates: Vec::new(),
            },
            Purpose::Events => Listed::Events(Vec::new()),
        }
    }

    /// Parses one page into `listed`, each item in one pass ([`page::read`]); returns its
    /// continue token.
    fn take(&self, body: &[u8], listed: &mut Listed) -> Result<Option<String>, serde_json::Error> {
        let (api_version, kind) = (self.job.api_version.as_str(), self.job.kind.as_str());
        match listed {
            Listed::Objects(objects) => {
                let page = page::read::<page::Item>(body)?;
                for (item, text) in page.items {
                    objects.push(Arc::new(item.into_object(text, api_version, kind)));
                }
                Ok(page.continue_token)
            }
            Listed::Unselected {
                selected,
                candidates,
            } => {
                let page = page::read::<page::Item>(body)?;
                for (item, text) in page.items {
                    let object = Arc::new(item.into_object(text, api_version, kind));
                    let labels = object
                        .view
                        .get("metadata")
                        .and_then(|m| m.get("labels"))
                        .and_then(Tree::as_object);
                    let picked = self
                        .job
                        .local_terms
                        .as_ref()
                        .is_some_and(|terms| labels_match(terms, labels));
                    if picked {
                        selected.push(object);
                    } else {
                        candidates.push(object);
                    }
                }
                Ok(page.continue_token)
            }
            Listed::Events(events) => {
                let page = page::read::<EventDoc>(body)?;
                events.extend(page.items.into_iter().map(|(event, _)| event));
                Ok(page.continue_token)
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
pub(crate) fn encode(s: &str) -> String {
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

/// The `key=value` terms of a selector made only of equality terms (`=` or `==`), or `None` when
/// it has any other kind of term (`!=`, `in`, `notin`, `exists`, `!key`), which only the
/// apiserver applies. An empty selector is `Some(vec![])`: it selects everything.
pub(crate) fn equality_terms(selector: &str) -> Option<Vec<(String, String)>> {
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

/// Whether `labels` (an object's `metadata.labels`) hold every `key=value` term.
pub(crate) fn labels_match(terms: &[(String, String)], labels: Option<&Map>) -> bool {
    terms.iter().all(|(key, value)| {
        labels.and_then(|l| l.get(key)).and_then(Tree::as_str) == Some(value.as_str())
    })
}

fn uid(object: &Tree) -> Option<&str> {
    object
        .get("metadata")
        .and_then(|m| m.get("uid"))
        .and_then(Tree::as_str)
        .filter(|u| !u.is_empty())
}

/// The first object of each uid, in order; objects without a uid or whose uid is in `skip` are
/// dropped (the same object can come from two groups, e.g. `extensions` and `networking.k8s.io`
/// Ingresses on older clusters).
fn unique_by_uid(
    objects: impl IntoIterator<Item = Arc<Object>>,
    skip: &HashSet<String>,
) -> Vec<Arc<Object>> {
    let mut seen: HashSet<String> = HashSet::new();
    objects
        .into_iter()
        .filter(|object| {
            uid(&object.view).is_some_and(|u| !skip.contains(u) && seen.insert(u.to_string()))
        })
        .collect()
}

/// What is read of a core/v1 Event: old style (`firstTimestamp`, `lastTimestamp`, `count`) or
/// new style (`eventTime`, `series`). Parsed straight into this, not into a JSON tree. The
/// same object read through `events.k8s.io/v1` names some fields differently (`regarding`,
/// `note`, `deprecated…`): those names are read too.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct EventDoc {
    metadata: Option<EventMetadata>,
    #[serde(alias = "regarding")]
    involved_object: Option<InvolvedObject>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    reason: Option<String>,
    #[serde(alias = "note")]
    message: Option<String>,
    #[serde(alias = "deprecatedCount")]
    count: Option<u64>,
    #[serde(alias = "deprecatedFirstTimestamp")]
    first_timestamp: Option<String>,
    #[serde(alias = "deprecatedLastTimestamp")]
    last_timestamp: Option<String>,
    event_time: Option<String>,
    series: Option<EventSeries>,
    #[serde(alias = "deprecatedSource")]
    source: Option<EventSource>,
    #[serde(alias = "reportingController")]
    reporting_component: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct EventMetadata {
    name: Option<String>,
    uid: Option<String>,
    creation_timestamp: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
struct InvolvedObject {
    uid: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct EventSeries {
    count: Option<u64>,
    last_observed_time: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
struct EventSource {
    component: Option<String>,
}

fn time(text: &Option<String>) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text.as_deref()?)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn non_empty(text: Option<String>) -> Option<String> {
    text.filter(|t| !t.is_empty())
}

impl From<EventDoc> for ResourceEvent {
    fn from(event: EventDoc) -> Self {
        let created = event
            .metadata
            .as_ref()
            .and_then(|m| time(&m.creation_timestamp));
        let first_seen = time(&event.first_timestamp)
            .or_else(|| time(&event.event_time))
            .or(created);
        let last_seen = event
            .series
            .as_ref()
            .and_then(|s| time(&s.last_observed_time))
            .or_else(|| time(&event.last_timestamp))
            .or_else(|| time(&event.event_time))
            .or(first_seen);
        let count = event
            .count
            .or_else(|| event.series.as_ref().and_then(|s| s.count))
            .unwrap_or(1)
            .clamp(1, u32::MAX as u64) as u32;
        ResourceEvent {
            event_type: event.event_type.unwrap_or_default(),
            reason: event.reason.unwrap_or_default(),
            message: event.message.unwrap_or_default(),
            count,
            first_seen,
            last_seen,
            source: non_empty(event.source.and_then(|s| s.component))
                .or_else(|| non_empty(event.reporting_component)),
        }
    }
}

/// An Event's text as an entry of the environment's timeline (SPEC 17), identified by the
/// Event's uid, linked to its object by uid; `None` for text that is not a dated Event with a
/// uid.
pub(crate) fn timeline_entry(text: &str) -> Option<timeline::Entry> {
    let mut doc: EventDoc = serde_json::from_str(text).ok()?;
    let id = doc.metadata.as_mut().and_then(|m| m.uid.take())?;
    let about = doc.involved_object.as_mut().and_then(|o| o.uid.take());
    let event = ResourceEvent::from(doc);
    Some(timeline::Entry {
        id,
        event_type: event.event_type,
        reason: event.reason,
        message: event.message,
        count: event.count,
        first_time: event.first_seen?,
        last_time: event.last_seen?,
        resource_uid: about.filter(|u| !u.is_empty()),
        source: timeline::Source::Kubernetes,
    })
}

/// Events by `involvedObject.uid`, only for uids in `keep`; each object's most recent first (by
/// `last_seen`, undated ones last, then by Event name), at most `per_object`.
fn events_by_object(
    events: Vec<EventDoc>,
    keep: &HashSet<&str>,
    per_object: usize,
) -> HashMap<String, Vec<ResourceEvent>> {
    let mut grouped: HashMap<String, Vec<(ResourceEvent, String)>> = HashMap::new();
    for mut event in events {
        let Some(about) = event
            .involved_object
            .take()
            .and_then(|o| o.uid)
            .filter(|u| keep.contains(u.as_str()))
        else {
            continue;
        };
        let name = event
            .metadata
            .as_mut()
            .and_then(|m| m.name.take())
            .unwrap_or_default();
        grouped
            .entry(about)
            .or_default()
            .push((ResourceEvent::from(event), name));
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
    use crate::resources::tree::TreeBuf;
    use serde_json::{json, Value};

    fn kind(group: &str, version: &str, kind: &str, plural: &str) -> ApiKind {
        ApiKind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
            watchable: true,
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
        let labels = |labels: Value| TreeBuf::from(&labels);
        assert!(labels_match(
            &terms,
            labels(json!({"a": "1", "b": "2", "c": "3"})).as_object()
        ));
        assert!(!labels_match(&terms, labels(json!({"a": "1"})).as_object()));
        assert!(!labels_match(
            &terms,
            labels(json!({"a": "1", "b": "3"})).as_object()
        ));
        assert!(!labels_match(
            &terms,
            labels(json!({"a": 1, "b": "2"})).as_object()
        ));
        assert!(!labels_match(&terms, None));
        assert!(labels_match(&[], None));
    }

    /// A list item of the given type, as a page yields it.
    fn listed(value: Value, api_version: &str, kind: &str) -> Object {
        Object::parse_text(value.to_string().into(), api_version, kind).unwrap()
    }

    fn candidate(text: &str) -> Arc<Object> {
        Arc::new(Object::parse_text(text.into(), "apps/v1", "ReplicaSet").unwrap())
    }

    #[test]
    fn only_owned_candidates_are_kept_once() {
        let selected = vec![Arc::new(listed(
            json!({"metadata": {"name": "web", "namespace": "ns", "uid": "d1"}}),
            "apps/v1",
            "Deployment",
        ))];
        let first = candidate(
            r#"{"metadata": {"name": "web-1", "namespace": "ns", "uid": "r1", "ownerReferences": [{"uid": "d1"}], "managedFields": []}, "spec": {"replicas": 2}}"#,
        );
        let owned = owned_candidates(
            &selected,
            vec![
                first.clone(),
                candidate(
                    r#"{"metadata": {"name": "other", "namespace": "ns", "uid": "r2", "ownerReferences": [{"uid": "d9"}]}}"#,
                ),
                candidate(
                    r#"{"metadata": {"name": "web-1", "namespace": "ns", "uid": "r1", "ownerReferences": [{"uid": "d1"}]}}"#,
                ),
                // A selected object is not owned besides.
                selected[0].clone(),
            ],
        );
        let views: Vec<Value> = owned.iter().map(|o| Value::from(&o.view)).collect();
        assert_eq!(
            views,
            [json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                     "metadata": {"name": "web-1", "namespace": "ns", "uid": "r1", "ownerReferences": [{"uid": "d1"}]},
                     "spec": {"replicas": 2}})]
        );
        // The first of the two objects of r1, shared, not copied.
        assert!(Arc::ptr_eq(&owned[0], &first));
    }

    #[test]
    fn owned_kinds_go_unselected_in_the_same_round() {
        let kinds = [
            kind("", "v1", "Pod", "pods"),
            kind("", "v1", "ConfigMap", "configmaps"),
            kind("apps", "v1", "ReplicaSet", "replicasets"),
            kind("example.com", "v1", "Pod", "pods"),
        ];
        let jobs = plan(&kinds, "my ns", "a=b", equality_terms("a=b"));
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
        let jobs = plan(&kinds[..1], "ns", "a in (b)", None);
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
    fn objects_are_unique_by_uid() {
        let o = |uid: &str, name: &str| {
            Arc::new(listed(
                json!({"metadata": {"uid": uid, "name": name}}),
                "v1",
                "Pod",
            ))
        };
        let skip: HashSet<String> = ["s".to_string()].into();
        let kept = unique_by_uid(
            vec![
                o("a", "1"),
                o("b", "2"),
                o("a", "3"),
                o("s", "4"),
                Arc::new(listed(json!({"metadata": {}}), "v1", "Pod")),
            ],
            &skip,
        );
        let names: Vec<_> = kept
            .iter()
            .map(|o| {
                o.view
                    .get("metadata")
                    .and_then(|m| m.get("name"))
                    .and_then(Tree::as_str)
                    .unwrap()
            })
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
        let events: Vec<EventDoc> = [
            ev("old", "a", Some("2024-01-02T00:00:00Z")),
            ev("undated-ish", "a", None),
            ev("new", "a", Some("2024-01-05T00:00:00Z")),
            ev("mid", "a", Some("2024-01-03T00:00:00Z")),
            ev("other", "b", Some("2024-01-03T00:00:00Z")),
            ev("stranger", "z", Some("2024-01-03T00:00:00Z")),
            json!({"reason": "no object"}),
        ]
        .into_iter()
        .map(|e| serde_json::from_value(e).unwrap())
        .collect();
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
        let e = ResourceEvent::from(serde_json::from_value::<EventDoc>(event).unwrap());
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
        let bare = ResourceEvent::from(
            serde_json::from_value::<EventDoc>(json!({"eventTime": null, "series": null})).unwrap(),
        );
        assert_eq!((bare.count, bare.first_seen, bare.source), (1, None, None));
    }

    #[test]
    fn an_event_reads_the_same_through_either_api() {
        // One object as `/api/v1` and as `/apis/events.k8s.io/v1` serve it (the apiserver's
        // conversion: involvedObject/regarding, message/note, count/deprecatedCount, …).
        let core = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "web.1", "uid": "ev-1", "creationTimestamp": "2024-03-01T09:00:00Z"},
            "involvedObject": {"kind": "Pod", "name": "web", "uid": "pod-1"},
            "type": "Warning", "reason": "BackOff", "message": "Back-off restarting failed container",
            "count": 4, "firstTimestamp": "2024-03-01T09:00:00Z", "lastTimestamp": "2024-03-01T09:05:00Z",
            "source": {"component": "kubelet"},
        });
        let events_api = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "web.1", "uid": "ev-1", "creationTimestamp": "2024-03-01T09:00:00Z"},
            "regarding": {"kind": "Pod", "name": "web", "uid": "pod-1"},
            "type": "Warning", "reason": "BackOff", "note": "Back-off restarting failed container",
            "deprecatedCount": 4, "deprecatedFirstTimestamp": "2024-03-01T09:00:00Z",
            "deprecatedLastTimestamp": "2024-03-01T09:05:00Z",
            "deprecatedSource": {"component": "kubelet"},
        });
        let a = timeline_entry(&core.to_string()).unwrap();
        let b = timeline_entry(&events_api.to_string()).unwrap();
        assert_eq!(a, b);
        assert_eq!(
            (a.id.as_str(), a.resource_uid.as_deref(), a.count),
            ("ev-1", Some("pod-1"), 4)
        );
        assert_eq!(a.last_time.to_rfc3339(), "2024-03-01T09:05:00+00:00");
        assert_eq!(timeline_entry(r#"{"metadata": {"name": "no-uid"}}"#), None);
    }
}
