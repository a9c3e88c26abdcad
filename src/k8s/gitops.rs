//! A resource group whose sources are GitOps objects (SPEC 15): the pure resolution
//! (`crate::gitops::resolve`) asks for namespaces, cluster-scoped objects and Helm releases;
//! this lists them, as the viewer, from the watch cache (a watch set per namespace it needs) or
//! with a request of its own, and resolves again until nothing is missing. Then what the
//! objects own is added and the group assembled as any other, with an `APPLIES` edge from each
//! source to what it applied.
//!
//! Everything but a Helm release Secret (masked in the cache) and the kinds of a group version
//! discovery did not list comes from the watch cache: the namespaces' watch sets, and for
//! cluster-scoped entries a cluster-wide watch of their kind. A group read wholly from the cache
//! is kept ([`Memo`]) with the cache's stamps of what it read; the next view checks the stamps
//! (no request) and answers the same group while nothing it read changed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_graphql::futures_util::future::join_all;
use axum::http::HeaderMap;
use rustc_hash::{FxHashMap, FxHashSet};
use tracing::Instrument;

use super::discovery::{self, ApiKind, DiscoveryCache};
use super::fetch::{self, encode, FetchError, FetchOptions};
use super::observe::ForAgent;
use super::watch::{Held, Stamp, WatchCache};
use crate::gitops::resolve::{self, Loaded, Resolution};
use crate::gitops::sync::{self, FluxSyncStatus};
use crate::gitops::{helm, ObjRef};
use crate::resources::graph::{Edge, EdgeType};
use crate::resources::group::{self, ResourceGroup};
use crate::resources::health::Customizations;
use crate::resources::listing::{ListError, Listing};
use crate::resources::object::Object;

/// A group spans at most this many namespaces: the rest are named in a warning.
pub const MAX_NAMESPACES: usize = 64;

/// Cluster-scoped objects are read by name, one request each: at most this many a view.
pub const MAX_CLUSTER_SCOPED: usize = 500;

/// API groups and versions discovery does not know that a view asks the cluster for, one
/// request each: an inventory may name any number of made-up ones.
pub const MAX_GROUP_VERSIONS_ASKED: usize = 16;

/// Warnings of the sources shown at most (an inventory of objects not yet created names each).
pub const MAX_WARNINGS: usize = 50;

/// Rounds of listing and resolving: each level of nesting may name new namespaces.
const MAX_ROUNDS: usize = resolve::MAX_DEPTH + 3;

/// A source of the group, as `ResourceGroup.sources` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSource {
    pub kind: String,
    pub api_version: String,
    pub namespace: Option<String>,
    pub name: String,
    /// `None` unless a Flux object that was found.
    pub flux_sync_status: Option<FluxSyncStatus>,
}

/// The group of some GitOps sources, with the labels source when the environment has one.
#[derive(Debug, Clone)]
pub struct GitOpsGroup {
    pub group: Arc<ResourceGroup>,
    /// Every namespace the group spans, the first one first (`ResourceGroup.namespace`).
    pub namespaces: Vec<String>,
    /// The namespaces the sources span, as met (the labels' not among them unless a source
    /// names them): what a later first view is given as `spanned_before`.
    pub spanned: Vec<String>,
    pub sources: Vec<GroupSource>,
}

/// The labels source (SPEC 5.2): a selector in the deployment's namespace and in those
/// Maintainers added (SPEC 15).
#[derive(Debug, Clone)]
pub struct LabelsSource {
    pub namespaces: Vec<String>,
    pub selector: String,
}

/// What a round needs to read the cluster.
pub struct Reader<'a> {
    pub watch: &'a WatchCache,
    /// The groups of this cluster connection read lately.
    pub memo: &'a Memo,
    pub client: &'a kube::Client,
    pub discovery: &'a DiscoveryCache,
    pub headers: &'a HeaderMap,
    pub options: &'a FetchOptions,
}

/// GitOps groups read wholly from the watch cache, per cluster connection, each with the
/// cache's stamps of what it read: a view of the same sources, as the same identity, while
/// every stamp is the same, is answered with the kept group. Cheap to share.
#[derive(Default)]
pub struct Memo {
    kept: Mutex<Vec<Kept>>,
}

/// Groups kept per cluster connection, the oldest dropped first.
const GROUPS_KEPT: usize = 16;

struct Kept {
    key: MemoKey,
    read: Read,
    group: GitOpsGroup,
}

/// What a group is asked with: equal keys and equal [`Read`]s, equal groups.
struct MemoKey {
    sources: Vec<ObjRef>,
    labels: Option<(Vec<String>, String)>,
    /// The impersonation headers (the identity the cluster's access decisions are about).
    identity: Vec<(String, Vec<u8>)>,
    events_per_resource: usize,
    custom: Arc<Customizations>,
}

impl MemoKey {
    fn new(
        sources: &[ObjRef],
        labels: Option<&LabelsSource>,
        reader: &Reader<'_>,
        custom: &Arc<Customizations>,
    ) -> Self {
        let mut identity: Vec<(String, Vec<u8>)> = reader
            .headers
            .iter()
            .filter(|(name, _)| name.as_str().starts_with("impersonate-"))
            .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
            .collect();
        identity.sort();
        MemoKey {
            sources: sources.to_vec(),
            labels: labels.map(|l| (l.namespaces.clone(), l.selector.clone())),
            identity,
            events_per_resource: reader.options.events_per_resource,
            custom: custom.clone(),
        }
    }
}

impl PartialEq for MemoKey {
    fn eq(&self, other: &Self) -> bool {
        self.sources == other.sources
            && self.labels == other.labels
            && self.identity == other.identity
            && self.events_per_resource == other.events_per_resource
            && Arc::ptr_eq(&self.custom, &other.custom)
    }
}

/// What a group was read from: each namespace's stamp, taken before its listing, and the
/// cluster-scoped kinds read from the cache with the cluster scope's generation before them.
#[derive(Default, Clone)]
struct Read {
    namespaces: Vec<(String, Stamp)>,
    cluster_kinds: Vec<ApiKind>,
    cluster_generation: Option<u64>,
    /// Something was read from the cluster itself (or could not be stamped): nothing to keep.
    fresh: bool,
}

impl Memo {
    fn find(&self, key: &MemoKey) -> Option<(Read, GitOpsGroup)> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter()
            .find(|k| k.key == *key)
            .map(|k| (k.read.clone(), k.group.clone()))
    }

    fn keep(&self, key: MemoKey, read: Read, group: GitOpsGroup) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.retain(|k| k.key != key);
        if kept.len() >= GROUPS_KEPT {
            kept.remove(0);
        }
        kept.push(Kept { key, read, group });
    }
}

/// Whether what `read` read is unchanged in the cache (and still shown to this identity):
/// the stamps asked again, no request to the cluster.
async fn unchanged(reader: &Reader<'_>, read: &Read) -> Result<bool, FetchError> {
    for (namespace, stamp) in &read.namespaces {
        let now = reader
            .watch
            .stamp(reader.discovery, reader.headers, namespace, reader.options)
            .await?;
        if now.as_ref() != Some(stamp) {
            return Ok(false);
        }
    }
    for kind in &read.cluster_kinds {
        let viewed = reader
            .watch
            .view_cluster_kind(
                reader.headers,
                kind,
                reader.options.page_size,
                reader.options.request_timeout,
            )
            .await;
        if viewed.is_err() {
            return Ok(false);
        }
    }
    Ok(read.cluster_kinds.is_empty()
        || reader.watch.cluster_generation() == read.cluster_generation)
}

/// Lists and assembles the group of `sources` (and `labels`): the group kept when nothing it
/// was read from changed ([`Memo`]).
///
/// `spanned_before` is a hint: the namespaces the same sources spanned when last read
/// ([`GitOpsGroup::spanned`], which GraphQL's view keeps in PostgreSQL beside the
/// environment, so that a restart keeps it too). A first view lists them at once beside the
/// labels' and the sources' own namespaces, and then does not read its sources alone first to
/// learn where their inventories point ([`first_listings`]). Nothing shown comes from it: the
/// group is resolved from the inventories as read, a namespace no longer named is listed for
/// nothing, and one newly named is listed in a round after. Empty: no hint.
pub async fn resource_group(
    reader: &Reader<'_>,
    sources: &[ObjRef],
    labels: Option<&LabelsSource>,
    spanned_before: &[String],
    custom: &Arc<Customizations>,
) -> Result<GitOpsGroup, FetchError> {
    let key = MemoKey::new(sources, labels, reader, custom);
    if let Some((read, group)) = reader.memo.find(&key) {
        if unchanged(reader, &read).await? {
            return Ok(group);
        }
    }
    let (group, read) = read_group(reader, sources, labels, spanned_before, custom).await?;
    if !read.fresh {
        reader.memo.keep(key, read, group.clone());
    }
    Ok(group)
}

/// The group read afresh, from the cache where it answers, and what it was read from.
async fn read_group(
    reader: &Reader<'_>,
    sources: &[ObjRef],
    labels: Option<&LabelsSource>,
    spanned_before: &[String],
    custom: &Arc<Customizations>,
) -> Result<(GitOpsGroup, Read), FetchError> {
    let mut read = Read::default();
    let discovered = reader.discovery.kinds().await?;
    // Discovery's kinds, then those of the group versions the sources name beyond them.
    let mut kinds: Vec<ApiKind> = discovered.kinds.to_vec();
    let mut loaded = Loaded::default();
    let mut listings: Vec<Listing> = Vec::new();
    let mut errors: Vec<ListError> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    // The watches the listings start are held back until the group is answered.
    let mut held: Vec<Held> = Vec::new();
    let mut early = first_listings(reader, &kinds, sources, labels, spanned_before)
        .instrument(tracing::debug_span!("gitops.first_listings"))
        .await;
    for namespace in labels.iter().flat_map(|l| &l.namespaces) {
        let (listed, of_ns, hold) = match early.remove(namespace) {
            Some(listed) => listed,
            None => listed(reader, namespace).await,
        };
        held.extend(hold);
        read.absorb(of_ns);
        let listing = listed?;
        loaded.add_namespace(namespace, listing.selected.clone());
        listings.push(listing);
    }
    // The other namespaces listed early (the sources' own, their inventories') are resolved
    // over at once, rather than each round of nesting resolving every inventory entry again to
    // learn it needs the next: those the group spans are taken into it below, the others
    // dropped. More namespaces listed changes no lookup: an entry finds its own namespace's.
    let mut preloaded = 0;
    for (namespace, (listed, _, _)) in &early {
        if let Ok(listing) = listed {
            loaded.add_namespace(namespace, listing.selected.clone());
            preloaded += 1;
        }
    }
    let mut resolution = Resolution::default();
    let mut cluster_read = 0;
    let mut group_versions_asked = 0;
    for _ in 0..MAX_ROUNDS {
        resolution = {
            let scopes = Scopes::of(&kinds);
            tracing::debug_span!("gitops.resolve")
                .in_scope(|| resolve::resolve(sources, &loaded, &|g, k| scopes.namespaced(g, k)))
        };
        let needs = &resolution.needs;
        if needs.is_empty() {
            break;
        }
        let room = MAX_NAMESPACES.saturating_sub(listings.len() + preloaded);
        let (wanted, dropped): (Vec<&String>, Vec<&String>) = {
            let all: Vec<&String> = needs.namespaces.iter().collect();
            let cut = all.len().min(room);
            (all[..cut].to_vec(), all[cut..].to_vec())
        };
        if !dropped.is_empty() {
            warnings.push(format!(
                "The group spans more than {MAX_NAMESPACES} namespaces; left out: {}",
                dropped
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let mut lists = Vec::with_capacity(wanted.len());
        let taken: Vec<_> = wanted.iter().map(|ns| early.remove(*ns)).collect();
        let mut asked = join_all(
            wanted
                .iter()
                .zip(&taken)
                .filter(|(_, early)| early.is_none())
                .map(|(ns, _)| listed(reader, ns)),
        )
        .await
        .into_iter();
        for early in taken {
            lists.extend(early.or_else(|| asked.next()));
        }
        for (ns, (listed, of_ns, hold)) in wanted.iter().zip(lists) {
            held.extend(hold);
            read.absorb(of_ns);
            match listed {
                Ok(listing) => {
                    loaded.add_namespace(ns, listing.selected.clone());
                    listings.push(listing);
                }
                Err(e) => {
                    read.fresh = true;
                    warnings.push(format!("The namespace {ns} could not be listed: {e}"));
                    loaded.add_namespace(ns, Vec::new());
                }
            }
        }
        for ns in dropped {
            loaded.add_namespace(ns, Vec::new());
        }
        // Read one by one, at most `max_in_flight` at once and [`MAX_CLUSTER_SCOPED`] a view.
        let room = MAX_CLUSTER_SCOPED.saturating_sub(cluster_read);
        let (reading, skipped) = needs.cluster.split_at(needs.cluster.len().min(room));
        if !reading.is_empty() && read.cluster_generation.is_none() {
            // Before any of them is read; a scope not yet watched starts at 0.
            read.cluster_generation = Some(reader.watch.cluster_generation().unwrap_or(0));
        }
        for chunk in reading.chunks(reader.options.max_in_flight.max(1)) {
            let got = join_all(chunk.iter().map(|r| cluster_object(reader, &kinds, r))).await;
            for (r, (got, cached)) in chunk.iter().zip(got) {
                match cached {
                    Some(kind) if !read.cluster_kinds.contains(&kind) => {
                        read.cluster_kinds.push(kind)
                    }
                    Some(_) => {}
                    None => read.fresh = true,
                }
                match got {
                    Ok(object) => loaded.add_cluster(r, object),
                    Err(e) => {
                        errors.push(e);
                        loaded.add_cluster(r, None);
                    }
                }
            }
        }
        cluster_read += reading.len();
        if !skipped.is_empty() {
            warnings.push(format!(
                "More than {MAX_CLUSTER_SCOPED} cluster-scoped objects: {} are not shown",
                skipped.len()
            ));
        }
        for r in skipped {
            loaded.add_cluster(r, None);
        }
        // Neither is in the cache: a view that needs them is read afresh each time.
        read.fresh |= !needs.kinds.is_empty() || !needs.helm.is_empty();
        for (group, version) in &needs.kinds {
            if group_versions_asked < MAX_GROUP_VERSIONS_ASKED {
                group_versions_asked += 1;
                match group_version_kinds(reader, group, version).await {
                    Ok(found) => kinds.extend(found),
                    Err(e) => warnings.push(format!("The kinds of {group}/{version}: {e}")),
                }
            }
            // Past the bound: not asked, and its objects warned of as kinds the cluster
            // does not serve.
            loaded.add_kinds_asked(group, version);
        }
        for (ns, release) in &needs.helm {
            let objects = helm_release_objects(reader, ns, release).await;
            loaded.add_helm(ns, release, objects);
        }
    }
    if !resolution.needs.is_empty() {
        warnings.push("Sources nest deeper than could be listed; some are not shown".into());
    }
    for namespace in &resolution.namespaces {
        // Only listings that answered were resolved over; any other needed was taken above.
        if let Some((Ok(listing), of_ns, hold)) = early.remove(namespace) {
            held.extend(hold);
            read.absorb(of_ns);
            listings.push(listing);
        }
    }
    let Resolution {
        objects: applied,
        applies,
        sources: found,
        namespaces: spanned,
        warnings: said,
        ..
    } = resolution;
    warnings.extend(said);
    if warnings.len() > MAX_WARNINGS {
        let more = warnings.len() - MAX_WARNINGS;
        warnings.truncate(MAX_WARNINGS);
        warnings.push(format!("… and {more} more warnings"));
    }

    // The namespaces: the labels source's first, then as the sources met them.
    let mut namespaces: Vec<String> = Vec::new();
    for ns in labels.iter().flat_map(|l| &l.namespaces).chain(&spanned) {
        if !namespaces.contains(ns) {
            namespaces.push(ns.clone());
        }
    }
    let group_sources = found
        .iter()
        .map(|s| GroupSource {
            kind: s.reference.kind.clone(),
            api_version: s
                .object
                .as_ref()
                .map(|o| crate::gitops::text(&o.view, &["apiVersion"]).to_owned())
                .or_else(|| s.reference.api_version())
                .unwrap_or_else(|| s.reference.group.clone()),
            namespace: s.reference.namespace.clone(),
            name: s.reference.name.clone(),
            flux_sync_status: s.object.as_ref().and_then(|o| sync::of(&o.view)),
        })
        .collect();

    let listing = tracing::debug_span!("gitops.combine")
        .in_scope(|| combine(listings, applied, labels, errors, warnings, &discovered));
    let custom = custom.clone();
    let assembling = tracing::debug_span!("gitops.assemble");
    let (mut group, placed) = tokio::task::spawn_blocking(move || {
        assembling.in_scope(|| group::assemble_placed(listing, &custom))
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    tracing::debug_span!("gitops.applies").in_scope(|| add_applies(&mut group, &applies, &placed));
    group.namespace = namespaces.first().cloned().unwrap_or_default();
    group.label_selector = labels.map(|l| l.selector.clone()).unwrap_or_default();
    if !group.resources.is_empty() {
        group.warnings.retain(|w| w != group::NO_RESOURCES_WARNING);
    }
    // A kind that answered 404 made discovery start over: the next view is read anew.
    read.fresh |= group.errors.iter().any(|e| e.code == Some(404));
    let grouped = GitOpsGroup {
        group: Arc::new(group),
        namespaces,
        spanned,
        sources: group_sources,
    };
    // Answered: the namespaces' watches go on.
    drop(held);
    Ok((grouped, read))
}

/// A namespace's listing ([`list_namespace`]), what it was read from, and the hold on the
/// first watches it started.
type Listed = (Result<Listing, FetchError>, Read, Option<Held>);

impl Read {
    /// What a namespace's own listing was read from, added.
    fn absorb(&mut self, of_namespace: Read) {
        self.namespaces.extend(of_namespace.namespaces);
        self.fresh |= of_namespace.fresh;
    }
}

async fn listed(reader: &Reader<'_>, namespace: &str) -> Listed {
    let mut read = Read::default();
    match list_namespace(reader, namespace, &mut read).await {
        Ok((listing, held)) => (Ok(listing), read, Some(held)),
        Err(e) => (Err(e), read, None),
    }
}

/// The first view's listings, all started at once rather than round after round: the labels'
/// namespaces, the sources' own, and those the sources' inventories name: the namespaces the
/// sources spanned when last read (`spanned_before`) when there are any, else learnt from one
/// GET of each source as the viewer ([`hinted_namespaces`]), whose lists then start when it
/// answers. Without either a group read from a cold cache waits for the sources' namespace
/// (its access review, then every kind) before it learns the inventory's namespaces and
/// starts theirs. What the resolution turns out not to need is dropped; what it needs beyond
/// (an inventory that changed, nested sources elsewhere) is listed in its rounds.
async fn first_listings(
    reader: &Reader<'_>,
    kinds: &[ApiKind],
    sources: &[ObjRef],
    labels: Option<&LabelsSource>,
    spanned_before: &[String],
) -> HashMap<String, Listed> {
    let mut known: Vec<String> = Vec::new();
    let own = sources.iter().filter_map(|s| s.namespace.as_ref());
    let labels_namespaces = labels.iter().flat_map(|l| &l.namespaces);
    for ns in labels_namespaces.chain(own).chain(spanned_before) {
        if !known.contains(ns) && known.len() < MAX_NAMESPACES {
            known.push(ns.clone());
        }
    }
    // Which namespaces are watched is asked before any listing starts watching its own.
    let watched = reader.watch.namespaces();
    let first = join_all(known.iter().map(|ns| listed(reader, ns)))
        .instrument(tracing::debug_span!("gitops.known_lists"));
    let hinted = async {
        if !spanned_before.is_empty() {
            return Vec::new();
        }
        let room = MAX_NAMESPACES.saturating_sub(known.len());
        let hinted: Vec<String> = hinted_namespaces(reader, kinds, sources, &watched)
            .await
            .into_iter()
            .filter(|ns| !known.contains(ns))
            .take(room)
            .collect();
        let lists = join_all(hinted.iter().map(|ns| listed(reader, ns)))
            .instrument(tracing::debug_span!("gitops.hinted_lists"))
            .await;
        hinted.into_iter().zip(lists).collect::<Vec<_>>()
    };
    let (first, hinted) = async_graphql::futures_util::future::join(first, hinted).await;
    known.into_iter().zip(first).chain(hinted).collect()
}

/// The namespaces the sources' inventories name (resolved as the group is, over the sources
/// alone), each source read with one GET as the viewer: a hint, nothing shown comes from it.
/// Only for sources whose namespace the cache does not watch yet: a watched one is listed
/// from memory at once, and a warm view sends nothing. None for a source that cannot be read
/// or whose kind discovery does not know.
async fn hinted_namespaces(
    reader: &Reader<'_>,
    kinds: &[ApiKind],
    sources: &[ObjRef],
    watched: &[String],
) -> Vec<String> {
    let cold: Vec<&ObjRef> = sources
        .iter()
        .filter(|s| s.namespace.as_ref().is_some_and(|ns| !watched.contains(ns)))
        .collect();
    if cold.is_empty() {
        return Vec::new();
    }
    let got = join_all(cold.iter().map(|s| get_object(reader, kinds, s)))
        .instrument(tracing::debug_span!("gitops.source_get"))
        .await;
    let mut by_namespace: HashMap<&str, Vec<Arc<Object>>> = HashMap::new();
    for (s, got) in cold.iter().zip(got) {
        if let (Some(ns), Ok(Some(object))) = (s.namespace.as_deref(), got) {
            by_namespace.entry(ns).or_default().push(object);
        }
    }
    let mut loaded = Loaded::default();
    for (ns, objects) in by_namespace {
        loaded.add_namespace(ns, objects);
    }
    let scopes = Scopes::of(kinds);
    let needs = tracing::debug_span!("gitops.hint_resolve")
        .in_scope(|| resolve::resolve(sources, &loaded, &|g, k| scopes.namespaced(g, k)).needs);
    needs.namespaces.into_iter().collect()
}

/// Every object of `namespace`, from the watch cache (an empty selector selects them all),
/// its stamp taken first into `read`; with the hold on the first watches it started.
async fn list_namespace(
    reader: &Reader<'_>,
    namespace: &str,
    read: &mut Read,
) -> Result<(Listing, Held), FetchError> {
    let (stamp, listing, held) = reader
        .watch
        .stamped_listing(reader.discovery, reader.headers, namespace, reader.options)
        .await?;
    match stamp {
        Some(stamp) => read.namespaces.push((namespace.to_owned(), stamp)),
        None => read.fresh = true,
    }
    Ok((listing, held))
}

/// The listing to assemble: what the sources applied and what the labels select, then what
/// those own among everything listed; the Events of what is in the group. Uids are compared as
/// the objects hold them (no copy of each; FxHash: they are the cluster's, and a collision
/// costs a comparison, never a wrong answer).
fn combine(
    listings: Vec<Listing>,
    applied: Vec<Arc<Object>>,
    labels: Option<&LabelsSource>,
    mut errors: Vec<ListError>,
    warnings: Vec<String>,
    discovered: &discovery::Discovered,
) -> Listing {
    fn uid(o: &Object) -> &str {
        crate::gitops::text(&o.view, &["metadata", "uid"])
    }
    let mut selected = applied;
    let mut candidates = Vec::new();
    let labelled = {
        let mut chosen: FxHashSet<&str> = selected.iter().map(|o| uid(o)).collect();
        let mut labelled = Vec::new();
        // The labels' listings come first, one per namespace.
        if let Some(labels) = labels {
            let terms = fetch::equality_terms(&labels.selector).unwrap_or_default();
            let listed = listings.iter().take(labels.namespaces.len());
            for o in listed.flat_map(|l| &l.selected) {
                let labels = o
                    .view
                    .get("metadata")
                    .and_then(|m| m.get("labels"))
                    .and_then(|l| l.as_object());
                if fetch::labels_match(&terms, labels) && chosen.insert(uid(o)) {
                    labelled.push(o.clone());
                }
            }
        }
        let listed = listings.iter().flat_map(|l| &l.selected);
        candidates.extend(listed.filter(|o| !chosen.contains(uid(o))).cloned());
        labelled
    };
    selected.extend(labelled);
    let mut events = HashMap::new();
    let mut warnings = warnings;
    for listing in listings {
        errors.extend(listing.errors);
        warnings.extend(listing.warnings);
        events.extend(listing.events);
    }
    let owned = fetch::owned_candidates(&selected, candidates);
    {
        let in_group: FxHashSet<&str> = selected.iter().chain(&owned).map(|o| uid(o)).collect();
        events.retain(|uid, _| in_group.contains(uid.as_str()));
    }
    errors.sort();
    errors.dedup_by(|a, b| a.api_version == b.api_version && a.kind == b.kind);
    Listing {
        namespace: String::new(),
        label_selector: String::new(),
        selected,
        owned,
        events,
        errors,
        unavailable: discovered.failures.clone(),
        warnings,
    }
}

/// The `APPLIES` edges among the assembled resources: after the others, each once, in the
/// order the sources met what they applied. `applies` names the resolution's objects by their
/// index, and those are the first of the listing assembled ([`combine`]), whose resources
/// `placed` gives ([`group::assemble_placed`]): no uid is looked up.
fn add_applies(group: &mut ResourceGroup, applies: &[(u32, u32)], placed: &[u32]) {
    let mut seen = FxHashSet::default();
    let edges: Vec<Edge> = applies
        .iter()
        .filter_map(|&(from, to)| {
            Some(Edge {
                from: *placed.get(from as usize)?,
                to: *placed.get(to as usize)?,
                kind: EdgeType::Applies,
            })
        })
        .filter(|e| seen.insert(*e))
        .collect();
    group.edges.extend(edges);
}

/// Whether each kind discovery (and the group versions asked beyond it) found is namespaced,
/// by `(group, kind)`: the first found of each, as a search of the kinds in their order finds
/// it. Asked once per inventory entry: a search of some fifty kinds each time was a tenth of
/// a resolution.
struct Scopes<'a>(FxHashMap<(&'a str, &'a str), bool>);

impl<'a> Scopes<'a> {
    fn of(kinds: &'a [ApiKind]) -> Scopes<'a> {
        let mut scopes = FxHashMap::default();
        for k in kinds {
            scopes
                .entry((k.group.as_str(), k.kind.as_str()))
                .or_insert(k.namespaced);
        }
        Scopes(scopes)
    }

    fn namespaced(&self, group: &str, kind: &str) -> Option<bool> {
        self.0.get(&(group, kind)).copied()
    }
}

/// A cluster-scoped object from the cache's cluster-wide watch of its kind, with that kind;
/// else (the kind not kept, refused to the viewer, not listed yet) asked of the cluster as
/// [`get_object`] asks (a cluster-scoped reference names no namespace), without a kind.
async fn cluster_object(
    reader: &Reader<'_>,
    kinds: &[ApiKind],
    r: &ObjRef,
) -> (Result<Option<Arc<Object>>, ListError>, Option<ApiKind>) {
    let kind = kinds
        .iter()
        .find(|k| k.group == r.group && k.kind == r.kind && !k.namespaced);
    if let Some(kind) = kind {
        let timeout = reader.options.request_timeout;
        let viewed = reader
            .watch
            .view_cluster_kind(reader.headers, kind, reader.options.page_size, timeout)
            .await;
        if let Ok(view) = viewed {
            view.synced(timeout).await;
            if let Ok(found) = view.object(&r.name) {
                return (Ok(found), Some(kind.clone()));
            }
        }
    }
    (get_object(reader, kinds, r).await, None)
}

/// An object, read as the viewer with one GET at the reference's version when it names one
/// (else at the one discovery found); `None` when it is not there or discovery does not know
/// its kind.
async fn get_object(
    reader: &Reader<'_>,
    kinds: &[ApiKind],
    r: &ObjRef,
) -> Result<Option<Arc<Object>>, ListError> {
    let Some(kind) = kinds
        .iter()
        .find(|k| k.group == r.group && k.kind == r.kind)
    else {
        return Ok(None);
    };
    let version = r.version.clone().unwrap_or_else(|| kind.version.clone());
    let base = if r.group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{}/{version}", r.group)
    };
    let scope = match &r.namespace {
        Some(ns) => format!("/namespaces/{}", encode(ns)),
        None => String::new(),
    };
    let path = format!("{base}{scope}/{}/{}", encode(&kind.plural), encode(&r.name));
    let api_version = if r.group.is_empty() {
        version.clone()
    } else {
        format!("{}/{version}", r.group)
    };
    let answer = discovery::get(
        reader.client,
        &path,
        reader.headers,
        reader.options.agent.map(ForAgent),
        reader.options.request_timeout,
    )
    .await;
    match answer {
        Ok(body) => {
            let text = String::from_utf8_lossy(&body).into_owned().into_boxed_str();
            tracing::debug_span!("gitops.source_parse")
                .in_scope(|| Object::parse_text(text, &api_version, &r.kind))
                .map(|o| Some(Arc::new(o)))
                .map_err(|e| ListError {
                    api_version,
                    kind: r.kind.clone(),
                    code: None,
                    message: e.to_string(),
                })
        }
        Err(failure) if failure.code == Some(404) => Ok(None),
        Err(failure) => Err(ListError {
            api_version,
            kind: r.kind.clone(),
            code: failure.code,
            message: failure.message,
        }),
    }
}

/// The kinds a group version serves, from its `APIResourceList`; none when it is not served.
async fn group_version_kinds(
    reader: &Reader<'_>,
    group: &str,
    version: &str,
) -> Result<Vec<ApiKind>, String> {
    let path = if group.is_empty() {
        format!("/api/{}", encode(version))
    } else {
        format!("/apis/{}/{}", encode(group), encode(version))
    };
    match discovery::get(
        reader.client,
        &path,
        &HeaderMap::new(),
        reader.options.agent.map(ForAgent),
        reader.options.request_timeout,
    )
    .await
    {
        Ok(body) => discovery::readable_kinds(group, version, &body).map_err(|e| e.to_string()),
        Err(failure) if failure.code == Some(404) => Ok(Vec::new()),
        Err(failure) => Err(failure.message),
    }
}

/// The objects of the newest deployed Helm release `release` stored in `namespace`: its
/// Secrets listed as the viewer (Helm's own labels select them), the newest decoded.
async fn helm_release_objects(
    reader: &Reader<'_>,
    namespace: &str,
    release: &str,
) -> Result<Vec<ObjRef>, String> {
    let selector = format!("owner=helm,name={release},status=deployed");
    let path = format!(
        "/api/v1/namespaces/{}/secrets?labelSelector={}",
        encode(namespace),
        encode(&selector)
    );
    let body = discovery::get(
        reader.client,
        &path,
        reader.headers,
        reader.options.agent.map(ForAgent),
        reader.options.request_timeout,
    )
    .await
    .map_err(|f| f.message)?;
    #[derive(serde::Deserialize)]
    struct List {
        #[serde(default)]
        items: Vec<serde_json::Value>,
    }
    let list: List = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
    let data = helm::newest_deployed(&list.items, release)
        .ok_or_else(|| format!("no deployed release Secret in {namespace}"))?;
    let decoded = helm::decode_release(data).map_err(|e| e.to_string())?;
    Ok(helm::manifest_objects(&decoded.manifest))
}
