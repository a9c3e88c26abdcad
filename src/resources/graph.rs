//! Dependency graph over live Kubernetes objects, Argo CD style.
//!
//! Pure functions over objects as [`Tree`]s: no I/O, no panics on malformed input, output in a deterministic
//! order whatever the input order, and linear work: everything is hash-indexed (by uid, by
//! `(namespace, name)`, by label pair), never a quadratic scan; only the edges' final sort is `n log n`.
//!
//! On 100k objects the cost is cache misses, not arithmetic, so the code is shaped for that. Each object's
//! tree is read once, in order ([`Nodes`]): its maps walked once rather than probed key by key, and what the
//! graph needs (uids, names, owners, references, labels) copied into a few compact vectors, while the next
//! objects' trees are prefetched ([`super::tree::prefetched`]). The passes that index and link work on those
//! copies, which are a tenth of the size of the trees. Hashes are computed by the pass that needs them, and
//! indexes keep them so that strings are only compared on a full-hash hit. Indexes are chains in one `Vec`,
//! not a `Vec` per key. An earlier straightforward version (SipHash maps of `Vec`s, key lookups per field)
//! was ~2.5x slower; one that read each tree in each pass, half as fast at 100k objects.
//!
//! Core kinds (`Service`, `Endpoints`, `Pod`, `PersistentVolumeClaim`) are recognised only with
//! `apiVersion: v1` (or no apiVersion), so that a CRD reusing the kind name (e.g. a Knative `Service`) is not
//! mistaken for one.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

use super::join;
use super::tree::{prefetched, Map, Tree};

/// Why a parent links to a child. The order matters: when several relations link the same pair, only the
/// first in this order is kept (an owner reference says the most).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum EdgeType {
    Owner,
    EndpointSlice,
    Endpoints,
    ServiceSelector,
    IngressBackend,
    VolumeClaim,
    ScaleTarget,
}

/// A directed link from parent to child, as indices into the objects the graph was built from.
///
/// Indices, not uids: a group of 100,000 objects has about as many edges, and copying two uids
/// into new strings for each was a third of the graph's time. Whoever shows an edge has the
/// objects, and with them the uids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Edge {
    pub from: u32,
    pub to: u32,
    pub kind: EdgeType,
}

/// Label the EndpointSlice controller puts on each slice to name its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// End of an index chain / no object. Object indices are `u32` to keep the indexes small.
const NONE: u32 = u32::MAX;

/// `(namespace, name)`; cluster-scoped objects have namespace `""`.
type NsName<'a> = (&'a str, &'a str);

// ---- hashing: computed once per string, while the string is in cache ----

/// FxHash's multiply-rotate step (as in rustc), over 8-byte words: much cheaper than SipHash on short keys.
/// Flooding resistance buys nothing here: keys come from the user's own environment, and a collision costs
/// a string comparison, never a wrong answer.
fn mix(hash: u64, word: u64) -> u64 {
    (hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
}

fn hash_strs(parts: &[&str]) -> u64 {
    let mut hash = 0;
    for part in parts {
        let bytes = part.as_bytes();
        let n = bytes.len();
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        let half = |at: usize| {
            u64::from(u32::from_le_bytes(
                bytes[at..at + 4].try_into().unwrap_or_default(),
            ))
        };
        if n >= 8 {
            for at in (0..n - 7).step_by(8) {
                hash = mix(hash, word(at));
            }
            if n % 8 != 0 {
                // The last 8 bytes, overlapping the previous word: no copy of a short tail.
                hash = mix(hash, word(n - 8));
            }
        } else if n >= 4 {
            hash = mix(hash, half(0) | half(n - 4) << 32);
        } else if n > 0 {
            let byte = |at: usize| u64::from(bytes[at]);
            hash = mix(hash, byte(0) | byte(n / 2) << 8 | byte(n - 1) << 16);
        }
        hash = mix(hash, n as u64);
    }
    // The multiply leaves the low bits weak, and hash tables pick buckets by them.
    hash.rotate_left(26)
}

/// Hasher for keys that already are hashes.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = mix(self.0, u64::from(byte));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

fn id_set<K>(capacity: usize) -> IdSet<K> {
    IdSet::with_capacity_and_hasher(capacity, Default::default())
}

/// A key with its hash: equality checks the hash first and only then the strings.
#[derive(Clone, Copy, Debug)]
struct Hashed<K> {
    hash: u64,
    key: K,
}

impl<K: PartialEq> PartialEq for Hashed<K> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.key == other.key
    }
}

impl<K: PartialEq> Eq for Hashed<K> {}

impl<K> Hash for Hashed<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

fn uid_prefix(uid: &str) -> u64 {
    let mut word = [0u8; 8];
    let len = uid.len().min(8);
    word[..len].copy_from_slice(&uid.as_bytes()[..len]);
    u64::from_be_bytes(word)
}

/// A multimap from hashed keys to object indices, as linked chains in one `Vec`: no allocation per key, and
/// the key strings are compared only for entries whose full hash matches.
struct Chains<K> {
    heads: IdMap<u64, u32>,
    /// `(key, value, next entry)`.
    entries: Vec<(K, u32, u32)>,
}

impl<K: PartialEq + Copy> Chains<K> {
    fn new() -> Self {
        Chains::with_capacity(0)
    }

    fn with_capacity(keys: usize) -> Self {
        Chains {
            heads: IdMap::with_capacity_and_hasher(keys, Default::default()),
            entries: Vec::with_capacity(keys),
        }
    }

    fn insert(&mut self, key: Hashed<K>, value: u32) {
        let next = self
            .heads
            .insert(key.hash, self.entries.len() as u32)
            .unwrap_or(NONE);
        self.entries.push((key.key, value, next));
    }

    fn get(&self, key: Hashed<K>) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.heads.get(&key.hash).copied().unwrap_or(NONE);
        std::iter::from_fn(move || {
            while let Some(&(entry_key, value, next)) = self.entries.get(at as usize) {
                at = next;
                if entry_key == key.key {
                    return Some(value);
                }
            }
            None
        })
    }
}

// ---- small accessors: every one returns None / empty on a wrong shape instead of panicking ----

fn value_at<'a>(v: &'a Tree, path: &[&str]) -> Option<&'a Tree> {
    path.iter().try_fold(v, |v, key| v.get(key))
}

fn str_at<'a>(v: &'a Tree, path: &[&str]) -> Option<&'a str> {
    value_at(v, path)?.as_str()
}

/// The elements of the array at `path`; nothing when it is missing or not an array.
fn array_at<'a>(v: &'a Tree, path: &[&str]) -> impl Iterator<Item = &'a Tree> {
    value_at(v, path)
        .and_then(Tree::as_array)
        .into_iter()
        .flatten()
}

/// A string that identifies something; empty counts as missing, so that two nameless objects never "match".
fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// An owner reference's uid and whether it is the managing (`controller: true`) owner.
fn owner_ref(owner: &Tree) -> Option<(&str, bool)> {
    let mut uid = None;
    let mut controller = false;
    for (key, value) in owner.as_object()?.iter() {
        match key {
            "uid" => uid = non_empty(value.as_str()),
            "controller" => controller = value.as_bool() == Some(true),
            _ => {}
        }
    }
    Some((uid?, controller))
}

/// Service names an Ingress routes to: `networking.k8s.io/v1` (`backend.service.name`, `spec.defaultBackend`)
/// and the older `extensions/v1beta1` / `networking.k8s.io/v1beta1` form (`backend.serviceName`,
/// `spec.backend`).
fn ingress_backends(spec: &Tree) -> impl Iterator<Item = &str> {
    fn backend_service(backend: &Tree) -> Option<&str> {
        str_at(backend, &["service", "name"]).or_else(|| str_at(backend, &["serviceName"]))
    }
    let defaults = ["defaultBackend", "backend"]
        .into_iter()
        .filter_map(|key| spec.get(key));
    let paths = array_at(spec, &["rules"])
        .flat_map(|rule| array_at(rule, &["http", "paths"]))
        .filter_map(|path| path.get("backend"));
    defaults.chain(paths).filter_map(backend_service)
}

// ---- what the graph knows of each object, read from its tree in one visit ----

/// A string copied into [`Nodes::text`]. Offsets are `u32`: the identity strings of a group
/// (uids, names, labels) are a small part of its objects, far below 4 GiB for any cluster.
#[derive(Clone, Copy, Debug)]
struct Str {
    start: u32,
    len: u32,
}

impl Str {
    fn shifted(self, by: u32) -> Str {
        Str {
            start: self.start + by,
            ..self
        }
    }
}

/// What a kind means to the graph. Core kinds (`Service`, `Endpoints`, `Pod`,
/// `PersistentVolumeClaim`) only with `apiVersion: v1` (or none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Service,
    Endpoints,
    EndpointSlice,
    Claim,
    Ingress,
    Autoscaler,
    Pod,
    /// Any other kind: a workload when it has pod template labels.
    Other,
}

impl Role {
    fn of(kind: &str, core: bool) -> Role {
        match kind {
            "Service" if core => Role::Service,
            "Endpoints" if core => Role::Endpoints,
            "EndpointSlice" => Role::EndpointSlice,
            "PersistentVolumeClaim" if core => Role::Claim,
            "Ingress" => Role::Ingress,
            "HorizontalPodAutoscaler" => Role::Autoscaler,
            "Pod" if core => Role::Pod,
            _ => Role::Other,
        }
    }
}

/// One object: who it is. Hashes are computed by the passes that need them, from the copies.
#[derive(Clone, Copy, Debug)]
struct Node {
    kind: Str,
    /// Kinds repeat from one object to the next, and so their hashes.
    kind_hash: u64,
    role: Role,
    uid: Option<Str>,
    /// The uid's first 8 bytes, big-endian: orders uids without reading them in most comparisons.
    prefix: u64,
    name: Option<Str>,
    namespace: Str,
}

/// A reference from an object to something it names, `(namespace of the object, name)`.
#[derive(Clone, Copy, Debug)]
struct NameRef {
    object: u32,
    target: Str,
    kind: EdgeType,
    /// The object is the edge's parent (an Ingress of its Service), rather than its child (an
    /// Endpoints of its Service).
    parent: bool,
}

#[derive(Clone, Copy, Debug)]
struct OwnerRef {
    child: u32,
    uid: Str,
    controller: bool,
}

/// An autoscaler's `spec.scaleTargetRef`.
#[derive(Clone, Copy, Debug)]
struct ScaleTarget {
    autoscaler: u32,
    kind: Str,
    name: Str,
}

/// A Service's selector or a workload's pod labels: a range of [`Nodes::pairs`].
#[derive(Clone, Copy, Debug)]
struct Labels {
    object: u32,
    start: u32,
    end: u32,
}

/// A label or selector pair with a string value.
#[derive(Clone, Copy, Debug)]
struct Pair {
    key: Str,
    value: Str,
}

/// What the dependency graph reads of a list of objects, copied out of their trees in one visit
/// each.
///
/// A group of 100,000 objects does not fit in the caches: each field read of a tree is a miss,
/// and the graph's passes (indexes, lookups, the sort) would each read the trees again in an
/// order of their own. Here each tree is read once, in order, beside its health
/// ([`super::group::edges_and_health`]); the passes then work on a few compact vectors.
#[derive(Debug, Default)]
pub struct Nodes {
    /// Every copied string.
    text: String,
    nodes: Vec<Node>,
    owners: Vec<OwnerRef>,
    names: Vec<NameRef>,
    scale_targets: Vec<ScaleTarget>,
    /// Services with a usable selector.
    selectors: Vec<Labels>,
    /// Pods and objects with pod template labels.
    workloads: Vec<Labels>,
    pairs: Vec<Pair>,
    /// Whether to read what only [`Nodes::edges`] needs (`spec`, pod labels), not just what
    /// [`owned_closure`] needs.
    links: bool,
}

impl Nodes {
    /// Nodes for [`Nodes::edges`] (`links`) or for [`owned_closure`] only, with room for `objects`.
    pub fn new(links: bool, objects: usize) -> Nodes {
        // About: a uid, a name, an owner's uid and a few labels each; kinds and namespaces
        // repeat. Room enough that a read on another thread seldom allocates.
        Nodes {
            text: String::with_capacity(objects * if links { 256 } else { 128 }),
            nodes: Vec::with_capacity(objects),
            owners: Vec::with_capacity(objects),
            names: Vec::with_capacity(objects / 2),
            workloads: Vec::with_capacity(if links { objects } else { 0 }),
            pairs: Vec::with_capacity(if links { objects * 4 } else { 0 }),
            links,
            ..Nodes::default()
        }
    }

    /// The nodes of `objects`, read on two threads when there are many.
    pub fn read<T: Borrow<Tree> + Sync>(objects: &[T], links: bool) -> Nodes {
        Nodes::read_with(objects, links, |_: &T| ()).0
    }

    /// The nodes of `objects` and `also` of each, in the same visit of its tree: a large group is
    /// not in cache, and reading a tree again costs as much as the first time. Many objects are
    /// read on two threads, half each.
    pub fn read_with<T, R>(
        objects: &[T],
        links: bool,
        also: impl Fn(&T) -> R + Sync,
    ) -> (Nodes, Vec<R>)
    where
        T: Borrow<Tree> + Sync,
        R: Send,
    {
        let prefetch = objects.len() >= super::PREFETCH_FROM;
        let (first, second) = objects.split_at(objects.len() / 2);
        // Allocated here: a new thread's allocations come from a heap of its own, whose memory
        // the system must first map and clear, and that cost more than the thread saved.
        let mut halves = [first, second].map(|part| {
            (
                Nodes::new(links, part.len()),
                Vec::with_capacity(part.len()),
            )
        });
        let read = |part: &[T], (nodes, results): &mut (Nodes, Vec<R>)| {
            for (object, tree) in part.iter().zip(prefetched(part, prefetch)) {
                nodes.push(tree);
                results.push(also(object));
            }
        };
        let [a, b] = &mut halves;
        let parallel = objects.len() >= super::PARALLEL_FROM;
        join(parallel, || read(first, a), || read(second, b));
        let [(mut nodes, mut results), (rest, rest_results)] = halves;
        nodes.append(rest);
        results.extend(rest_results);
        (nodes, results)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn str(&self, s: Str) -> &str {
        &self.text[s.start as usize..(s.start + s.len) as usize]
    }

    fn copy(&mut self, s: &str) -> Str {
        let start = self.text.len() as u32;
        self.text.push_str(s);
        Str {
            start,
            len: s.len() as u32,
        }
    }

    /// `s`, copied unless the previous object had the same (kinds and namespaces repeat).
    fn copy_repeated(&mut self, s: &str, previous: Option<Str>) -> Str {
        match previous {
            Some(p) if self.str(p) == s => p,
            _ => self.copy(s),
        }
    }

    /// Adds one object. Each key read is a cache miss on a cold object, so every map is walked
    /// once and only what the graph needs is read.
    pub fn push(&mut self, value: &Tree) {
        let i = self.nodes.len() as u32;
        let (mut kind, mut core, mut meta, mut spec) = ("", true, None, None);
        if let Some(object) = value.as_object() {
            // Fields still to find: kind, apiVersion, metadata, spec (when wanted).
            let mut missing = if self.links { 4 } else { 3 };
            for (key, field) in object.iter() {
                match key {
                    "kind" => kind = field.as_str().unwrap_or(""),
                    "apiVersion" => core = field.as_str().is_none_or(|v| v == "v1"),
                    "metadata" => meta = field.as_object(),
                    k if self.links && k == "spec" => spec = Some(field),
                    _ => continue,
                }
                missing -= 1;
                if missing == 0 {
                    break;
                }
            }
        }
        let role = Role::of(kind, core);
        let (mut uid, mut name, mut namespace, mut labels, mut owners) =
            (None, None, "", None, &[][..]);
        // Only a Pod's and an EndpointSlice's own labels link anything.
        let want_labels = role == Role::EndpointSlice || (self.links && role == Role::Pod);
        for (key, field) in meta.into_iter().flat_map(Map::iter) {
            match key {
                "uid" => uid = non_empty(field.as_str()),
                "name" => name = non_empty(field.as_str()),
                "namespace" => namespace = field.as_str().unwrap_or(""),
                // Checked before the key's text is read: that read is the cost.
                k if want_labels && k == "labels" => labels = field.as_object(),
                "ownerReferences" => owners = field.as_array().unwrap_or(&[]),
                _ => {}
            }
        }

        let previous = self.nodes.last().copied();
        let (kind, kind_hash) = match previous {
            Some(p) if self.str(p.kind) == kind => (p.kind, p.kind_hash),
            _ => (self.copy(kind), hash_strs(&[kind])),
        };
        let node = Node {
            kind,
            kind_hash,
            role,
            uid: uid.map(|u| self.copy(u)),
            prefix: uid.map_or(0, uid_prefix),
            name: name.map(|n| self.copy(n)),
            namespace: self.copy_repeated(namespace, previous.map(|p| p.namespace)),
        };
        self.nodes.push(node);
        for (owner, controller) in owners.iter().filter_map(owner_ref) {
            let uid = self.copy(owner);
            self.owners.push(OwnerRef {
                child: i,
                uid,
                controller,
            });
        }
        let name_ref = |nodes: &mut Nodes, target: &str, kind: EdgeType, parent: bool| {
            let target = nodes.copy(target);
            nodes.names.push(NameRef {
                object: i,
                target,
                kind,
                parent,
            });
        };
        match role {
            Role::Endpoints => {
                if let Some(name) = name {
                    name_ref(self, name, EdgeType::Endpoints, false);
                }
            }
            Role::EndpointSlice => {
                let service = labels.and_then(|l| l.get(SERVICE_NAME_LABEL));
                if let Some(service) = non_empty(service.and_then(Tree::as_str)) {
                    name_ref(self, service, EdgeType::EndpointSlice, false);
                }
            }
            _ if !self.links => {}
            Role::Service => {
                let selector = spec
                    .and_then(|s| s.get("selector"))
                    .and_then(Tree::as_object);
                // A selector-less Service selects nothing; a non-string value cannot match.
                let usable = |s: &&Map| !s.is_empty() && s.iter().all(|(_, v)| v.is_string());
                if let Some(selector) = selector.filter(usable).filter(|_| name.is_some()) {
                    let labels = self.pairs(i, selector);
                    self.selectors.push(labels);
                }
            }
            Role::Ingress => {
                for backend in spec.into_iter().flat_map(ingress_backends) {
                    name_ref(self, backend, EdgeType::IngressBackend, true);
                }
            }
            Role::Autoscaler => {
                let target = |field| spec.and_then(|s| str_at(s, &["scaleTargetRef", field]));
                if let (Some(kind), Some(name)) = (target("kind"), target("name")) {
                    let target = ScaleTarget {
                        autoscaler: i,
                        kind: self.copy(kind),
                        name: self.copy(name),
                    };
                    self.scale_targets.push(target);
                }
            }
            Role::Pod | Role::Other => {
                // Pods, and anything with a pod template, are what Service selectors pick.
                let pod_labels = if role == Role::Pod {
                    labels
                } else {
                    spec.and_then(|s| value_at(s, &["template", "metadata", "labels"]))
                        .and_then(Tree::as_object)
                };
                if let Some(labels) = pod_labels {
                    let labels = self.pairs(i, labels);
                    self.workloads.push(labels);
                }
                if role == Role::Pod {
                    for volume in spec.into_iter().flat_map(|s| array_at(s, &["volumes"])) {
                        let claim = str_at(volume, &["persistentVolumeClaim", "claimName"]);
                        if let Some(claim) = claim {
                            name_ref(self, claim, EdgeType::VolumeClaim, true);
                        }
                    }
                }
            }
            Role::Claim => {}
        }
    }

    /// The string pairs of a label map or selector.
    fn pairs(&mut self, object: u32, labels: &Map) -> Labels {
        let start = self.pairs.len() as u32;
        for (key, value) in labels.iter() {
            let Some(value) = value.as_str() else {
                continue;
            };
            let pair = Pair {
                key: self.copy(key),
                value: self.copy(value),
            };
            self.pairs.push(pair);
        }
        Labels {
            object,
            start,
            end: self.pairs.len() as u32,
        }
    }

    /// Appends the nodes of the objects after these.
    pub fn append(&mut self, other: Nodes) {
        let objects = self.nodes.len() as u32;
        let text = self.text.len() as u32;
        let pairs = self.pairs.len() as u32;
        self.text.push_str(&other.text);
        self.nodes.extend(other.nodes.into_iter().map(|n| Node {
            kind: n.kind.shifted(text),
            uid: n.uid.map(|u| u.shifted(text)),
            name: n.name.map(|s| s.shifted(text)),
            namespace: n.namespace.shifted(text),
            ..n
        }));
        self.owners
            .extend(other.owners.into_iter().map(|o| OwnerRef {
                child: o.child + objects,
                uid: o.uid.shifted(text),
                ..o
            }));
        self.names.extend(other.names.into_iter().map(|r| NameRef {
            object: r.object + objects,
            target: r.target.shifted(text),
            ..r
        }));
        self.scale_targets
            .extend(other.scale_targets.into_iter().map(|t| ScaleTarget {
                autoscaler: t.autoscaler + objects,
                kind: t.kind.shifted(text),
                name: t.name.shifted(text),
            }));
        let labels = |l: Labels| Labels {
            object: l.object + objects,
            start: l.start + pairs,
            end: l.end + pairs,
        };
        self.selectors
            .extend(other.selectors.into_iter().map(labels));
        self.workloads
            .extend(other.workloads.into_iter().map(labels));
        self.pairs.extend(other.pairs.into_iter().map(|p| Pair {
            key: p.key.shifted(text),
            value: p.value.shifted(text),
        }));
    }

    fn hashed(&self, s: Str) -> Hashed<&str> {
        let key = self.str(s);
        Hashed {
            hash: hash_strs(&[key]),
            key,
        }
    }

    fn uid(&self, i: u32) -> Option<Hashed<&str>> {
        self.nodes[i as usize].uid.map(|uid| self.hashed(uid))
    }

    fn uid_str(&self, i: u32) -> &str {
        self.nodes[i as usize].uid.map_or("", |uid| self.str(uid))
    }

    /// Whether objects `a` and `b` have the same uid: most pairs differ in the first bytes.
    fn same_uid(&self, a: u32, b: u32) -> bool {
        a == b
            || (self.nodes[a as usize].prefix == self.nodes[b as usize].prefix
                && self.uid_str(a) == self.uid_str(b))
    }

    fn ns_name(&self, i: u32) -> Option<Hashed<NsName<'_>>> {
        Some(self.target(i, self.nodes[i as usize].name?))
    }

    /// `(namespace, name)`: `name` in the namespace of object `object`.
    fn target(&self, object: u32, name: Str) -> Hashed<NsName<'_>> {
        let key = (
            self.str(self.nodes[object as usize].namespace),
            self.str(name),
        );
        Hashed {
            hash: hash_strs(&[key.0, key.1]),
            key,
        }
    }

    /// `(namespace, name)` of a core Service.
    fn service_key(&self, i: u32) -> Option<Hashed<NsName<'_>>> {
        (self.nodes[i as usize].role == Role::Service)
            .then(|| self.ns_name(i))
            .flatten()
    }

    fn pairs_of(&self, labels: Labels) -> &[Pair] {
        &self.pairs[labels.start as usize..labels.end as usize]
    }

    /// Whether every pair of `selector` is among `labels`.
    fn selector_matches(&self, selector: &[Pair], labels: &[Pair]) -> bool {
        selector.iter().all(|wanted| {
            labels
                .iter()
                .find(|label| self.str(label.key) == self.str(wanted.key))
                .is_some_and(|label| self.str(label.value) == self.str(wanted.value))
        })
    }
}

/// Which of `candidates` belong to the group rooted at `selected` (the label-selected objects): every
/// candidate whose ownerReferences chain (transitively, through other candidates) leads to a selected object,
/// plus Endpoints named like a selected Service in the same namespace, plus EndpointSlices whose label
/// `kubernetes.io/service-name` names a selected Service in the same namespace. Returns the indices into
/// `candidates` in ascending order. Ownership cycles must not loop forever. Candidates already in `selected`
/// (same uid) are not returned.
///
/// A Service that joins the group through ownership (e.g. created by a selected custom resource) brings its
/// Endpoints and EndpointSlices along too, exactly as a selected one does: they are part of it either way.
///
/// Linear: one pass indexes candidates by owner uid and by Service, then a walk from the selected objects
/// expands each uid and each Service at most once, which is also what stops ownership cycles.
pub fn owned_closure(
    selected: &[impl Borrow<Tree> + Sync],
    candidates: &[impl Borrow<Tree> + Sync],
) -> Vec<usize> {
    let roots = Nodes::read(selected, false);
    let nodes = Nodes::read(candidates, false);
    // What to expand: a uid and a Service's key, of a root or of a reached candidate.
    type Expand<'a> = (Option<Hashed<&'a str>>, Option<Hashed<NsName<'a>>>);
    let mut stack: Vec<Expand> = (0..roots.len() as u32)
        .map(|i| (roots.uid(i), roots.service_key(i)))
        .collect();
    // Tables are sized up front: growing one rehashes it, at random places in memory.
    let mut selected_uids: IdSet<Hashed<&str>> = id_set(stack.len());
    selected_uids.extend(stack.iter().filter_map(|(uid, _)| *uid));
    let mut children: Chains<&str> = Chains::with_capacity(nodes.owners.len());
    for owner in &nodes.owners {
        children.insert(nodes.hashed(owner.uid), owner.child);
    }
    let mut service_parts: Chains<NsName> = Chains::new();
    for r in &nodes.names {
        if matches!(r.kind, EdgeType::Endpoints | EdgeType::EndpointSlice) {
            service_parts.insert(nodes.target(r.object, r.target), r.object);
        }
    }

    // 0 = not reached, 1 = included, 2 = reached but selected itself (same uid), so not returned.
    let mut reached = vec![0u8; nodes.len()];
    let mut expanded_uids: IdSet<Hashed<&str>> = id_set(roots.len() + nodes.len());
    let mut expanded_services: IdSet<Hashed<NsName>> = IdSet::default();
    while let Some((uid, service)) = stack.pop() {
        let owned = uid
            .filter(|u| expanded_uids.insert(*u))
            .into_iter()
            .flat_map(|u| children.get(u));
        let parts = service
            .filter(|key| expanded_services.insert(*key))
            .into_iter()
            .flat_map(|key| service_parts.get(key));
        for i in owned.chain(parts) {
            if reached[i as usize] != 0 {
                continue;
            }
            let uid = nodes.uid(i);
            if uid.is_some_and(|u| selected_uids.contains(&u)) {
                reached[i as usize] = 2;
            } else {
                reached[i as usize] = 1;
                stack.push((uid, nodes.service_key(i)));
            }
        }
    }
    (0..nodes.len()).filter(|&i| reached[i] == 1).collect()
}

/// An edge under construction: node indices plus the uid prefixes that order most pairs without reading the
/// uid strings.
struct RawEdge {
    from_prefix: u64,
    to_prefix: u64,
    from: u32,
    to: u32,
    kind: EdgeType,
}

impl Nodes {
    /// The dependency graph among the objects, parent to child: owner references first (owner -> owned, only
    /// when both are present), then: Service -> EndpointSlice (label `kubernetes.io/service-name`, same
    /// namespace), Service -> Endpoints (same name and namespace), Service -> workload (Deployment,
    /// StatefulSet, DaemonSet, ReplicaSet, Pod, Job, and any object with `spec.template.metadata.labels`)
    /// when the Service's non-empty `spec.selector` matches the workload's pod template labels (for a Pod: its
    /// own labels), same namespace; Ingress -> Service for every backend service name (v1 and the old
    /// `serviceName` form); Pod -> PersistentVolumeClaim for `spec.volumes[].persistentVolumeClaim.claimName`
    /// (same namespace; only Pods, not StatefulSet claim templates); HorizontalPodAutoscaler -> its
    /// `spec.scaleTargetRef` (kind + name, same namespace).
    ///
    /// Service selectors link only the top-most matching workload of each ownership chain: a matching object
    /// is skipped when its controller owner matches the same Service too. A Deployment, its ReplicaSets and
    /// their Pods usually all match, and Argo CD likewise draws one Service -> Deployment edge rather than a
    /// fan-out to every Pod; the Pods stay reachable through the owner edges. A bare Pod, or a Pod whose owner
    /// is absent or does not match, is still linked directly.
    ///
    /// Edges are sorted (by the uids of from and to, then kind) and at most one edge links a pair: when
    /// several relations hold, the first in [`EdgeType`] order wins, so an EndpointSlice owned by its Service
    /// gets one `Owner` edge. An edge never points from an object to itself. Objects without a uid are not
    /// nodes. Nodes read without `links` give the ownership and Endpoints edges only.
    pub fn edges(&self) -> Vec<Edge> {
        // The selector matches are found beside the references; only picking the top-most
        // needs both. What the other thread fills is allocated here, as in `read_with`.
        let mut matches = Vec::with_capacity(self.workloads.len());
        let mut raw =
            Vec::with_capacity(self.owners.len() + self.names.len() + self.selectors.len());
        let mut controller = vec![NONE; self.nodes.len()];
        join(
            self.nodes.len() >= super::PARALLEL_FROM,
            || self.service_matches(&mut matches),
            || self.references(&mut raw, &mut controller),
        );
        for (service, workload) in topmost(&matches, &controller) {
            self.link(&mut raw, service, workload, EdgeType::ServiceSelector);
        }

        let cmp_uid = |a: u32, a_prefix: u64, b: u32, b_prefix: u64| {
            if a == b {
                Ordering::Equal
            } else {
                a_prefix
                    .cmp(&b_prefix)
                    .then_with(|| self.uid_str(a).cmp(self.uid_str(b)))
            }
        };
        raw.sort_unstable_by(|a, b| {
            cmp_uid(a.from, a.from_prefix, b.from, b.from_prefix)
                .then_with(|| cmp_uid(a.to, a.to_prefix, b.to, b.to_prefix))
                .then(a.kind.cmp(&b.kind))
        });
        raw.dedup_by(|later, first| {
            cmp_uid(later.from, later.from_prefix, first.from, first.from_prefix).is_eq()
                && cmp_uid(later.to, later.to_prefix, first.to, first.to_prefix).is_eq()
        });
        raw.into_iter()
            .map(|e| Edge {
                from: e.from,
                to: e.to,
                kind: e.kind,
            })
            .collect()
    }

    /// Adds the edge `from` -> `to` unless both are the same object.
    fn link(&self, raw: &mut Vec<RawEdge>, from: u32, to: u32, kind: EdgeType) {
        if !self.same_uid(from, to) {
            raw.push(RawEdge {
                from_prefix: self.nodes[from as usize].prefix,
                to_prefix: self.nodes[to as usize].prefix,
                from,
                to,
                kind,
            });
        }
    }

    /// The edges of owner references, of names (Endpoints, EndpointSlices, Ingress backends,
    /// claims) and of scale targets; each object's controller owner, for [`topmost`].
    fn references(&self, raw: &mut Vec<RawEdge>, controller: &mut [u32]) {
        let nodes = &self.nodes;
        let has_uid = |i: u32| nodes[i as usize].uid.is_some();
        let mut present: IdMap<Hashed<&str>, u32> = IdMap::default();
        present.reserve(nodes.len());
        let mut services: Chains<NsName> = Chains::new();
        let mut claims: Chains<NsName> = Chains::new();
        for i in 0..nodes.len() as u32 {
            let Some(uid) = self.uid(i) else { continue };
            present.entry(uid).or_insert(i);
            match nodes[i as usize].role {
                Role::Service => services.insert_some(self.ns_name(i), i),
                Role::Claim => claims.insert_some(self.ns_name(i), i),
                _ => {}
            }
        }
        for owner_ref in self.owners.iter().filter(|o| has_uid(o.child)) {
            let child = owner_ref.child;
            if let Some(&owner) = present.get(&self.hashed(owner_ref.uid)) {
                self.link(raw, owner, child, EdgeType::Owner);
                let self_owned = self.same_uid(owner, child);
                if owner_ref.controller && controller[child as usize] == NONE && !self_owned {
                    controller[child as usize] = owner;
                }
            }
        }
        for r in self.names.iter().filter(|r| has_uid(r.object)) {
            let targets = if r.kind == EdgeType::VolumeClaim {
                &claims
            } else {
                &services
            };
            for target in targets.get(self.target(r.object, r.target)) {
                if r.parent {
                    self.link(raw, r.object, target, r.kind);
                } else {
                    self.link(raw, target, r.object, r.kind);
                }
            }
        }
        self.scale_target_edges(|hpa, target| self.link(raw, hpa, target, EdgeType::ScaleTarget));
    }

    /// `(autoscaler, target)` for every object with a uid that an autoscaler's `scaleTargetRef`
    /// names (kind and name, same namespace).
    fn scale_target_edges(&self, mut link: impl FnMut(u32, u32)) {
        if self.scale_targets.is_empty() {
            return;
        }
        let mut targets: Chains<(&str, &str, &str)> = Chains::new();
        // Kinds that some autoscaler targets, so that other kinds are skipped by their hash.
        let mut kinds: IdSet<u64> = IdSet::default();
        for t in self.scale_targets.iter() {
            if self.nodes[t.autoscaler as usize].uid.is_none() {
                continue;
            }
            let target = self.target(t.autoscaler, t.name);
            let (kind, (ns, name)) = (self.str(t.kind), target.key);
            kinds.insert(hash_strs(&[kind]));
            // Hashed by (namespace, name) like the targets, compared with the kind too.
            let key = (kind, ns, name);
            targets.insert(
                Hashed {
                    hash: target.hash,
                    key,
                },
                t.autoscaler,
            );
        }
        for (i, node) in self.nodes.iter().enumerate() {
            if node.uid.is_none() || !kinds.contains(&node.kind_hash) {
                continue;
            }
            let Some(target) = self.ns_name(i as u32) else {
                continue;
            };
            let (ns, name) = target.key;
            let key = (self.str(node.kind), ns, name);
            for hpa in targets.get(Hashed {
                hash: target.hash,
                key,
            }) {
                link(hpa, i as u32);
            }
        }
    }

    /// `(service, workload)` for every Service whose selector matches a workload's labels, in
    /// `matches`, sorted.
    ///
    /// Each Service is indexed under one pair of its selector, the one fewest selectors share (a per-app label
    /// rather than `tier: web`); each workload then looks up its own labels in that small index and fully
    /// checks only the Services found. Cost: one pass over workload labels plus the checks, instead of
    /// services x workloads.
    fn service_matches(&self, matches: &mut Vec<(u32, u32)>) {
        let has_uid = |l: &&Labels| self.nodes[l.object as usize].uid.is_some();
        let selectors: Vec<Labels> = self.selectors.iter().filter(has_uid).copied().collect();
        if selectors.is_empty() {
            return;
        }
        let namespace = |i: u32| self.str(self.nodes[i as usize].namespace);
        let pair_hash = |object: u32, pair: &Pair| {
            hash_strs(&[namespace(object), self.str(pair.key), self.str(pair.value)])
        };
        // Collisions only blur this heuristic, so counting by hash alone is fine.
        let mut pair_use: IdMap<u64, u32> = IdMap::default();
        for &s in &selectors {
            for pair in self.pairs_of(s) {
                *pair_use.entry(pair_hash(s.object, pair)).or_default() += 1;
            }
        }
        let mut index: IdMap<u64, Vec<u32>> = IdMap::default();
        let mut keys: IdSet<Hashed<&str>> = IdSet::default();
        for (s, &service) in selectors.iter().enumerate() {
            let rarest = self
                .pairs_of(service)
                .iter()
                .map(|pair| (pair, pair_hash(service.object, pair)))
                .min_by_key(|(_, hash)| pair_use.get(hash).copied().unwrap_or(0));
            if let Some((pair, hash)) = rarest {
                index.entry(hash).or_default().push(s as u32);
                keys.insert(self.hashed(pair.key));
            }
        }

        for &workload in self.workloads.iter().filter(has_uid) {
            let (w, labels) = (workload.object, self.pairs_of(workload));
            for label in labels {
                if !keys.contains(&self.hashed(label.key)) {
                    continue;
                }
                for &s in index.get(&pair_hash(w, label)).into_iter().flatten() {
                    let service = selectors[s as usize];
                    if namespace(service.object) == namespace(w)
                        && self.selector_matches(self.pairs_of(service), labels)
                    {
                        matches.push((service.object, w));
                    }
                }
            }
        }
        matches.sort_unstable();
        matches.dedup();
    }
}

/// The `(service, workload)` matches to link: the top-most per ownership chain, a workload
/// being left out when its controller matches the same Service.
fn topmost(matches: &[(u32, u32)], controller: &[u32]) -> Vec<(u32, u32)> {
    // matched_by[w] == s marks workload w as matched by Service s: O(1) "does my controller match too".
    let mut matched_by = vec![NONE; controller.len()];
    let mut topmost = Vec::with_capacity(matches.len());
    for group in matches.chunk_by(|a, b| a.0 == b.0) {
        for &(s, w) in group {
            matched_by[w as usize] = s;
        }
        for &(s, w) in group {
            let owner = controller[w as usize];
            if owner == NONE || matched_by[owner as usize] != s {
                topmost.push((s, w));
            }
        }
    }
    topmost
}

impl<K: PartialEq + Copy> Chains<K> {
    fn insert_some(&mut self, key: Option<Hashed<K>>, value: u32) {
        if let Some(key) = key {
            self.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::time::{Duration, Instant};

    /// The objects as the resource group keeps them ([`crate::resources::object`]).
    fn kept(objects: &[Value]) -> Vec<Tree> {
        let parse = |o: &Value| crate::resources::object::parse(&o.to_string()).expect("parse");
        objects.iter().map(parse).collect()
    }

    fn trees(objects: &[Value]) -> Vec<Tree> {
        objects.iter().map(Tree::from).collect()
    }

    /// An edge with the uids it links, as a reader sees it.
    #[derive(Debug, PartialEq)]
    struct Named {
        from: String,
        to: String,
        kind: EdgeType,
    }

    fn named(objects: &[Tree], edges: &[Edge]) -> Vec<Named> {
        let nodes = Nodes::read(objects, true);
        let uid = |i: u32| nodes.uid_str(i).to_owned();
        edges
            .iter()
            .map(|e| Named {
                from: uid(e.from),
                to: uid(e.to),
                kind: e.kind,
            })
            .collect()
    }

    /// [`Nodes::edges`] of the whole objects, by uid, checked against the kept fields: the graph
    /// must not read a field left out there.
    fn edges(objects: &[Value]) -> Vec<Named> {
        let (whole, kept) = (trees(objects), kept(objects));
        let named_whole = named(&whole, &Nodes::read(&whole, true).edges());
        assert_eq!(
            named(&kept, &Nodes::read(&kept, true).edges()),
            named_whole,
            "edges of the kept fields"
        );
        named_whole
    }

    /// [`super::owned_closure`], checked the same way.
    fn owned_closure(selected: &[Value], candidates: &[Value]) -> Vec<usize> {
        let whole = super::owned_closure(&trees(selected), &trees(candidates));
        let kept_closure = super::owned_closure(&kept(selected), &kept(candidates));
        assert_eq!(kept_closure, whole, "closure of the kept fields");
        whole
    }

    fn object(api: &str, kind: &str, ns: &str, name: &str, uid: &str) -> Value {
        json!({"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": ns, "uid": uid}})
    }

    /// Adds a controller owner reference to `owner`.
    fn owned(mut child: Value, owner: &Value) -> Value {
        let reference = json!({
            "apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": true,
        });
        let mut refs = child["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        refs.push(reference);
        child["metadata"]["ownerReferences"] = Value::Array(refs);
        child
    }

    fn with_labels(mut obj: Value, labels: Value) -> Value {
        obj["metadata"]["labels"] = labels;
        obj
    }

    fn workload(api: &str, kind: &str, ns: &str, name: &str, uid: &str, labels: Value) -> Value {
        let mut obj = object(api, kind, ns, name, uid);
        obj["spec"] = json!({"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}}});
        obj
    }

    fn deployment(ns: &str, name: &str, uid: &str, labels: Value) -> Value {
        workload("apps/v1", "Deployment", ns, name, uid, labels)
    }

    fn replicaset(owner: &Value, name: &str, uid: &str, labels: Value) -> Value {
        let ns = owner["metadata"]["namespace"].as_str().unwrap_or("");
        owned(
            workload("apps/v1", "ReplicaSet", ns, name, uid, labels),
            owner,
        )
    }

    fn pod(ns: &str, name: &str, uid: &str, labels: Value) -> Value {
        with_labels(object("v1", "Pod", ns, name, uid), labels)
    }

    fn service(ns: &str, name: &str, uid: &str, selector: Value) -> Value {
        let mut svc = object("v1", "Service", ns, name, uid);
        svc["spec"] = json!({"selector": selector});
        svc
    }

    fn slice(ns: &str, name: &str, uid: &str, service: &str) -> Value {
        with_labels(
            object("discovery.k8s.io/v1", "EndpointSlice", ns, name, uid),
            json!({ SERVICE_NAME_LABEL: service }),
        )
    }

    fn triples(edges: &[Named]) -> Vec<(&str, &str, EdgeType)> {
        edges
            .iter()
            .map(|e| (e.from.as_str(), e.to.as_str(), e.kind))
            .collect()
    }

    /// Deployment d1 -> ReplicaSet rs1 -> Pods p1, p2 in namespace "web", all labelled app=api.
    fn api_chain() -> (Value, Value, Value, Value) {
        let d = deployment("web", "api", "d1", json!({"app": "api"}));
        let rs = replicaset(
            &d,
            "api-7f",
            "rs1",
            json!({"app": "api", "pod-template-hash": "7f"}),
        );
        let p1 = owned(
            pod(
                "web",
                "api-7f-a",
                "p1",
                json!({"app": "api", "pod-template-hash": "7f"}),
            ),
            &rs,
        );
        let p2 = owned(
            pod(
                "web",
                "api-7f-b",
                "p2",
                json!({"app": "api", "pod-template-hash": "7f"}),
            ),
            &rs,
        );
        (d, rs, p1, p2)
    }

    #[test]
    fn deployment_replicaset_pod_chain() {
        let (d, rs, p1, p2) = api_chain();
        let unrelated = pod("web", "other", "p9", json!({"app": "other"}));
        let objects = [
            p2.clone(),
            rs.clone(),
            d.clone(),
            p1.clone(),
            unrelated.clone(),
        ];
        use EdgeType::Owner;
        assert_eq!(
            triples(&edges(&objects)),
            [
                ("d1", "rs1", Owner),
                ("rs1", "p1", Owner),
                ("rs1", "p2", Owner)
            ]
        );
        assert_eq!(owned_closure(&[d], &[p2, rs, unrelated, p1]), [0, 1, 3]);
    }

    #[test]
    fn owner_outside_the_group() {
        let (d, rs, p1, _) = api_chain();
        let gone = deployment("web", "gone", "d-gone", json!({}));
        let orphan_rs = replicaset(&gone, "gone-1", "rs-gone", json!({}));
        let orphan_pod = owned(pod("web", "gone-1-a", "p-gone", json!({})), &orphan_rs);
        // The missing owner gets no edge; the present pair still does.
        assert_eq!(
            triples(&edges(&[orphan_rs.clone(), orphan_pod.clone()])),
            [("rs-gone", "p-gone", EdgeType::Owner)]
        );

        let other = deployment("web", "other", "d2", json!({}));
        let foreign_rs = replicaset(&other, "other-1", "rs2", json!({}));
        let foreign_pod = owned(pod("web", "other-1-a", "p2x", json!({})), &foreign_rs);
        let candidates = [orphan_pod, rs, p1, foreign_rs, foreign_pod];
        // Only what chains (through candidates) to the selected Deployment.
        assert_eq!(owned_closure(&[d], &candidates), [1, 2]);
        assert!(owned_closure(&[], &candidates).is_empty());
    }

    #[test]
    fn cronjob_job_pod_transitive() {
        let cron = object("batch/v1", "CronJob", "ops", "backup", "cj1");
        let job = owned(
            object("batch/v1", "Job", "ops", "backup-123", "job1"),
            &cron,
        );
        let run = owned(pod("ops", "backup-123-x", "pod1", json!({})), &job);
        let stranger = object("batch/v1", "Job", "ops", "manual", "job2");
        // Pod listed before its Job: order of candidates must not matter.
        assert_eq!(
            owned_closure(
                std::slice::from_ref(&cron),
                &[run.clone(), stranger.clone(), job.clone()]
            ),
            [0, 2]
        );
        assert_eq!(
            triples(&edges(&[run, job, cron, stranger])),
            [
                ("cj1", "job1", EdgeType::Owner),
                ("job1", "pod1", EdgeType::Owner)
            ]
        );
    }

    #[test]
    fn endpoints_and_slices_of_selected_service() {
        let svc = service("web", "api", "s1", json!({"app": "api"}));
        let candidates = [
            object("v1", "Endpoints", "web", "api", "e1"),
            object("v1", "Endpoints", "prod", "api", "e2"),
            object("v1", "Endpoints", "web", "db", "e3"),
            slice("web", "api-abc", "es1", "api"),
            slice("prod", "api-abc", "es2", "api"),
            object(
                "discovery.k8s.io/v1",
                "EndpointSlice",
                "web",
                "api-x",
                "es3",
            ),
            svc.clone(),
        ];
        assert_eq!(
            owned_closure(std::slice::from_ref(&svc), &candidates),
            [0, 3]
        );

        // A CRD named "Service" (Knative) does not claim the core Endpoints.
        let knative = object("serving.knative.dev/v1", "Service", "web", "api", "k1");
        assert!(owned_closure(&[knative], &candidates).is_empty());

        // A Service that joins through ownership brings its Endpoints along.
        let app = object("example.com/v1", "App", "web", "shop", "cr1");
        let owned_svc = owned(service("web", "shop", "s2", json!({"app": "shop"})), &app);
        let shop_eps = object("v1", "Endpoints", "web", "shop", "e4");
        let shop_slice = owned(slice("web", "shop-1", "es4", "shop"), &owned_svc);
        assert_eq!(
            owned_closure(&[app], &[shop_eps, shop_slice, owned_svc]),
            [0, 1, 2]
        );
    }

    #[test]
    fn service_endpoints_edges() {
        let svc = service("web", "api", "s1", json!({}));
        let owned_slice = owned(slice("web", "api-1", "es1", "api"), &svc);
        let objects = [
            object("v1", "Endpoints", "web", "api", "e1"),
            object("v1", "Endpoints", "prod", "api", "e2"),
            slice("web", "api-2", "es2", "api"),
            slice("prod", "api-3", "es3", "api"),
            owned_slice,
            svc,
        ];
        assert_eq!(
            triples(&edges(&objects)),
            [
                ("s1", "e1", EdgeType::Endpoints),
                // Both an owner reference and the label: one edge, the owner one.
                ("s1", "es1", EdgeType::Owner),
                ("s1", "es2", EdgeType::EndpointSlice),
            ]
        );
    }

    #[test]
    fn service_selectors() {
        let (d, rs, p1, p2) = api_chain();
        let bare = pod("web", "debug", "bare", json!({"app": "api"}));
        let db = workload(
            "apps/v1",
            "StatefulSet",
            "web",
            "db",
            "sts1",
            json!({"app": "db"}),
        );
        let db_pod = owned(
            pod(
                "web",
                "db-0",
                "db0",
                json!({"app": "db", "statefulset.kubernetes.io/pod-name": "db-0"}),
            ),
            &db,
        );
        let rollout = workload(
            "argoproj.io/v1alpha1",
            "Rollout",
            "web",
            "canary",
            "ro1",
            json!({"app": "canary"}),
        );
        let cron = object("batch/v1", "CronJob", "web", "api-cron", "cj1");
        let mut prod = deployment("prod", "api", "d-prod", json!({"app": "api"}));
        prod["metadata"]["labels"] = json!({"app": "api"});
        let services = [
            service("web", "api", "s-api", json!({"app": "api"})),
            service("web", "none", "s-none", json!({"app": "nothing"})),
            service("web", "empty", "s-empty", json!({})),
            object("v1", "Service", "web", "headless", "s-nospec"),
            service("other", "api", "s-other", json!({"app": "api"})),
            service(
                "web",
                "hash",
                "s-hash",
                json!({"app": "api", "pod-template-hash": "7f"}),
            ),
            service(
                "web",
                "db-0",
                "s-db0",
                json!({"statefulset.kubernetes.io/pod-name": "db-0"}),
            ),
            service("web", "db", "s-db", json!({"app": "db"})),
            service("web", "canary", "s-canary", json!({"app": "canary"})),
        ];
        let mut objects = vec![d, rs, p1, p2, bare, db, db_pod, rollout, cron, prod];
        objects.extend(services);
        let graph = edges(&objects);
        let selector_edges: Vec<_> = triples(&graph)
            .into_iter()
            .filter(|e| e.2 == EdgeType::ServiceSelector)
            .map(|(from, to, _)| (from, to))
            .collect();
        assert_eq!(
            selector_edges,
            [
                // Top-most only: not rs1, p1, p2 (their controllers match too), but the bare Pod.
                ("s-api", "bare"),
                ("s-api", "d1"),
                ("s-canary", "ro1"),
                ("s-db", "sts1"),
                // The StatefulSet template lacks the per-pod label: the Pod itself is the top-most match.
                ("s-db0", "db0"),
                // The Deployment template lacks the hash: the ReplicaSet is top-most.
                ("s-hash", "rs1"),
            ]
        );
    }

    #[test]
    fn ingress_backends_both_forms() {
        let v1 = json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "site", "namespace": "web", "uid": "i1"},
            "spec": {
                "defaultBackend": {"service": {"name": "fallback", "port": {"number": 80}}},
                "rules": [{"host": "a.example", "http": {"paths": [
                    {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "api", "port": {"number": 80}}}},
                    {"path": "/x", "pathType": "Prefix", "backend": {"service": {"name": "missing"}}},
                    {"path": "/r", "pathType": "Prefix", "backend": {"resource": {"kind": "Bucket", "name": "b"}}},
                ]}}],
            },
        });
        let legacy = json!({
            "apiVersion": "extensions/v1beta1", "kind": "Ingress",
            "metadata": {"name": "old", "namespace": "web", "uid": "i2"},
            "spec": {
                "backend": {"serviceName": "fallback", "servicePort": 80},
                "rules": [{"http": {"paths": [{"path": "/", "backend": {"serviceName": "api", "servicePort": 80}}]}}],
            },
        });
        let objects = [
            v1,
            legacy,
            service("web", "api", "s-api", json!({})),
            service("web", "fallback", "s-fb", json!({})),
            service("prod", "api", "s-prod", json!({})),
        ];
        use EdgeType::IngressBackend as I;
        assert_eq!(
            triples(&edges(&objects)),
            [
                ("i1", "s-api", I),
                ("i1", "s-fb", I),
                ("i2", "s-api", I),
                ("i2", "s-fb", I)
            ]
        );
    }

    #[test]
    fn pvc_claims() {
        let mut p = pod("web", "db-0", "p1", json!({}));
        p["spec"] = json!({"volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "cfg", "configMap": {"name": "cfg"}},
            {"name": "gone", "persistentVolumeClaim": {"claimName": "missing"}},
        ]});
        let mut sts = workload("apps/v1", "StatefulSet", "web", "db", "sts1", json!({}));
        sts["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "data"}}]);
        sts["spec"]["template"]["spec"] =
            json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]});
        let objects = [
            p,
            sts,
            object("v1", "PersistentVolumeClaim", "web", "data", "pvc1"),
            object("v1", "PersistentVolumeClaim", "prod", "data", "pvc2"),
        ];
        assert_eq!(
            triples(&edges(&objects)),
            [("p1", "pvc1", EdgeType::VolumeClaim)]
        );
    }

    #[test]
    fn hpa_scale_targets() {
        let mut hpa = object(
            "autoscaling/v2",
            "HorizontalPodAutoscaler",
            "web",
            "api",
            "h1",
        );
        hpa["spec"] = json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"}, "maxReplicas": 5});
        let objects = [
            hpa,
            deployment("web", "api", "d1", json!({})),
            workload("apps/v1", "StatefulSet", "web", "api", "sts1", json!({})),
            deployment("prod", "api", "d2", json!({})),
        ];
        assert_eq!(
            triples(&edges(&objects)),
            [("h1", "d1", EdgeType::ScaleTarget)]
        );
    }

    #[test]
    fn ownership_cycles() {
        let a = object("example.com/v1", "Thing", "ns", "a", "a");
        let b = object("example.com/v1", "Thing", "ns", "b", "b");
        let c = object("example.com/v1", "Thing", "ns", "c", "c");
        let a = owned(a, &b);
        let b = owned(b, &a);
        let c = owned(owned(c.clone(), &c), &a);
        use EdgeType::Owner;
        assert_eq!(
            triples(&edges(&[a.clone(), b.clone(), c.clone()])),
            [("a", "b", Owner), ("a", "c", Owner), ("b", "a", Owner)]
        );
        assert_eq!(
            owned_closure(std::slice::from_ref(&a), &[b.clone(), c.clone(), a.clone()]),
            [0, 1]
        );
        // A cycle not reachable from the selection stays out.
        let x = object("v1", "ConfigMap", "ns", "x", "x");
        assert!(owned_closure(&[x], &[a.clone(), b.clone()]).is_empty());
        // Entering the cycle from one member reaches the rest, then stops.
        assert_eq!(owned_closure(&[b], &[a, c]), [0, 1]);
    }

    #[test]
    fn a_missing_link_breaks_the_ownership_chain() {
        // The ReplicaSet is gone (not listed): its Pods no longer chain to the Deployment.
        let (d, _rs, p1, p2) = api_chain();
        assert!(owned_closure(std::slice::from_ref(&d), &[p1.clone(), p2.clone()]).is_empty());
        assert!(triples(&edges(&[d, p1, p2])).is_empty());
    }

    #[test]
    fn several_owners() {
        // A non-controller owner reference is an ownership link too: either owner brings it in.
        let app = object("example.com/v1", "App", "web", "shop", "app1");
        let team = object("example.com/v1", "Team", "web", "payments", "team1");
        let mut cfg = owned(object("v1", "ConfigMap", "web", "shop-cfg", "cm1"), &app);
        let mut refs = cfg["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        refs.push(json!({"apiVersion": "example.com/v1", "kind": "Team", "name": "payments", "uid": "team1"}));
        cfg["metadata"]["ownerReferences"] = Value::Array(refs);
        use EdgeType::Owner;
        assert_eq!(
            triples(&edges(&[cfg.clone(), app.clone(), team.clone()])),
            [("app1", "cm1", Owner), ("team1", "cm1", Owner)]
        );
        assert_eq!(
            owned_closure(std::slice::from_ref(&team), std::slice::from_ref(&cfg)),
            [0]
        );
        assert_eq!(owned_closure(&[app, team], &[cfg]), [0]);
    }

    #[test]
    fn selector_links_the_topmost_present_workload() {
        // Without its Deployment in the group, the ReplicaSet is the top-most match; its Pods
        // stay under it.
        let (_d, rs, p1, p2) = api_chain();
        let svc = service("web", "api", "s1", json!({"app": "api"}));
        use EdgeType::{Owner, ServiceSelector};
        assert_eq!(
            triples(&edges(&[p1, p2, rs, svc])),
            [
                ("rs1", "p1", Owner),
                ("rs1", "p2", Owner),
                ("s1", "rs1", ServiceSelector)
            ]
        );
    }

    #[test]
    fn selector_skips_only_pods_whose_controller_matches() {
        // A Job (controller: a CronJob, which has no pod template of its own) is top-most; a
        // Pod whose controller's template does not match is linked directly.
        let cron = object("batch/v1", "CronJob", "ops", "report", "cj1");
        let job = owned(
            workload(
                "batch/v1",
                "Job",
                "ops",
                "report-1",
                "job1",
                json!({"app": "report"}),
            ),
            &cron,
        );
        let run = owned(
            pod("ops", "report-1-x", "pod1", json!({"app": "report"})),
            &job,
        );
        let other = workload(
            "apps/v1",
            "ReplicaSet",
            "ops",
            "other",
            "rs9",
            json!({"app": "other"}),
        );
        let adopted = owned(
            pod("ops", "adopted", "pod2", json!({"app": "report"})),
            &other,
        );
        let svc = service("ops", "report", "s1", json!({"app": "report"}));
        let graph = edges(&[cron, job, run, other, adopted, svc]);
        let selector_edges: Vec<_> = triples(&graph)
            .into_iter()
            .filter(|e| e.2 == EdgeType::ServiceSelector)
            .collect();
        assert_eq!(
            selector_edges,
            [
                ("s1", "job1", EdgeType::ServiceSelector),
                ("s1", "pod2", EdgeType::ServiceSelector)
            ]
        );
    }

    #[test]
    fn closure_of_a_realistic_environment() {
        // Labelled: Deployment, Service, StatefulSet, CronJob; everything else joins by owner
        // references or by Service name. Objects of another environment stay out.
        let (d, rs, p1, p2) = api_chain();
        let svc = service("web", "api", "s1", json!({"app": "api"}));
        let eps = object("v1", "Endpoints", "web", "api", "e1");
        let es = owned(slice("web", "api-x", "es1", "api"), &svc);
        let db = workload(
            "apps/v1",
            "StatefulSet",
            "web",
            "db",
            "sts1",
            json!({"app": "db"}),
        );
        let db0 = owned(pod("web", "db-0", "db0", json!({"app": "db"})), &db);
        let pvc = object("v1", "PersistentVolumeClaim", "web", "data-db-0", "pvc1");
        let cron = object("batch/v1", "CronJob", "web", "backup", "cj1");
        let job = owned(object("batch/v1", "Job", "web", "backup-1", "job1"), &cron);
        let run = owned(pod("web", "backup-1-x", "jp1", json!({})), &job);
        let (other_d, other_rs, other_p, _) = {
            let d = deployment("web", "other", "d9", json!({"app": "other"}));
            let rs = replicaset(&d, "other-1", "rs9", json!({"app": "other"}));
            let p = owned(pod("web", "other-1-a", "p9", json!({"app": "other"})), &rs);
            (d, rs, p, ())
        };
        let selected = [d, svc, db, cron];
        let candidates = [
            p1, rs, p2, eps, es, db0, pvc, job, run, other_d, other_rs, other_p,
        ];
        // The claim of a StatefulSet has no owner reference (unless its retention policy
        // adds one): it joins the group only if labelled.
        assert_eq!(
            owned_closure(&selected, &candidates),
            [0, 1, 2, 3, 4, 5, 7, 8]
        );
    }

    #[test]
    fn indexes_compare_keys_not_just_hashes() {
        let mut chains: Chains<&str> = Chains::new();
        chains.insert(Hashed { hash: 7, key: "a" }, 1);
        chains.insert(Hashed { hash: 7, key: "b" }, 2);
        chains.insert(Hashed { hash: 7, key: "a" }, 3);
        let mut found: Vec<u32> = chains.get(Hashed { hash: 7, key: "a" }).collect();
        found.sort_unstable();
        assert_eq!(found, [1, 3]);
        assert_eq!(chains.get(Hashed { hash: 8, key: "a" }).count(), 0);
        let set: IdSet<Hashed<&str>> = [Hashed { hash: 1, key: "x" }, Hashed { hash: 1, key: "y" }]
            .into_iter()
            .collect();
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn self_controlled_and_duplicated_objects() {
        // A workload naming itself as controller is still linked by its Service, and gets no self edge.
        let d = deployment("web", "api", "d1", json!({"app": "api"}));
        let d = owned(d.clone(), &d);
        let svc = service("web", "api", "s1", json!({"app": "api"}));
        // The same objects twice (e.g. listed by two watches) still give each edge once.
        let objects = [d.clone(), svc.clone(), d, svc];
        assert_eq!(
            triples(&edges(&objects)),
            [("s1", "d1", EdgeType::ServiceSelector)]
        );
    }

    #[test]
    fn crds_named_like_core_kinds_are_not_core() {
        let knative = object("serving.knative.dev/v1", "Service", "web", "api", "k1");
        let objects = [
            knative,
            object("v1", "Endpoints", "web", "api", "e1"),
            object(
                "example.com/v1",
                "PersistentVolumeClaim",
                "web",
                "data",
                "c1",
            ),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "web", "uid": "p1"},
                   "spec": {"volumes": [{"persistentVolumeClaim": {"claimName": "data"}}]}}),
        ];
        assert!(edges(&objects).is_empty());
        let core = service("web", "api", "s1", json!({}));
        let mut with_core = objects.to_vec();
        with_core.push(core);
        assert_eq!(
            triples(&edges(&with_core)),
            [("s1", "e1", EdgeType::Endpoints)]
        );
    }

    /// Deterministic shuffle (xorshift + Fisher-Yates), so the test needs no rand crate.
    fn shuffle<T>(items: &mut [T], mut seed: u64) {
        for i in (1..items.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            items.swap(i, (seed % (i as u64 + 1)) as usize);
        }
    }

    #[test]
    fn deterministic_order() {
        let (d, rs, p1, p2) = api_chain();
        let mut hpa = object(
            "autoscaling/v2",
            "HorizontalPodAutoscaler",
            "web",
            "api",
            "h1",
        );
        hpa["spec"] = json!({"scaleTargetRef": {"kind": "Deployment", "name": "api"}});
        let svc = service("web", "api", "s1", json!({"app": "api"}));
        let objects = vec![
            d.clone(),
            rs,
            p1,
            p2,
            hpa,
            svc.clone(),
            owned(slice("web", "api-1", "es1", "api"), &svc),
            object("v1", "Endpoints", "web", "api", "e1"),
            pod("web", "bare", "bare", json!({"app": "api"})),
            json!({"kind": "Ingress", "metadata": {"namespace": "web", "uid": "i1"},
                   "spec": {"defaultBackend": {"service": {"name": "api"}}}}),
        ];
        let expected = edges(&objects);
        assert_eq!(expected.len(), 9);
        let selected = [d, svc];
        let closure_uids = |objs: &[Value]| {
            let idx = owned_closure(&selected, objs);
            assert!(idx.windows(2).all(|w| w[0] < w[1]));
            let mut uids: Vec<String> = idx
                .iter()
                .map(|&i| objs[i]["metadata"]["uid"].as_str().unwrap().to_owned())
                .collect();
            uids.sort();
            uids
        };
        let expected_closure = closure_uids(&objects);
        assert_eq!(expected_closure, ["e1", "es1", "p1", "p2", "rs1"]);
        for seed in 1..=8u64 {
            let mut shuffled = objects.clone();
            shuffle(&mut shuffled, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            assert_eq!(edges(&shuffled), expected, "seed {seed}");
            assert_eq!(closure_uids(&shuffled), expected_closure, "seed {seed}");
        }
    }

    #[test]
    fn malformed_objects_do_not_panic() {
        let objects = vec![
            Value::Null,
            json!(42),
            json!("pod"),
            json!([]),
            json!({}),
            json!({"metadata": 5}),
            json!({"kind": 7, "metadata": {"uid": 5, "name": ["x"], "namespace": {}}}),
            json!({"kind": "Pod", "metadata": {"uid": "m1", "ownerReferences": "nope", "labels": "x"},
                   "spec": {"volumes": "x"}}),
            json!({"kind": "Pod", "metadata": {"uid": "m2", "name": "m2",
                   "ownerReferences": [null, 3, {"uid": 7}, {"name": "x"}, {"uid": ""}, {"uid": "m1", "controller": "yes"}]},
                   "spec": {"volumes": [null, {"persistentVolumeClaim": 3}, {"persistentVolumeClaim": {"claimName": 4}}]}}),
            json!({"kind": "Pod", "metadata": {"uid": "m2b", "ownerReferences": {"uid": "m1"}}}),
            json!({"kind": "Service", "metadata": {"uid": "m3", "name": "s"}, "spec": {"selector": "app=x"}}),
            json!({"kind": "Service", "metadata": {"uid": "m4", "name": "s"}, "spec": {"selector": {"app": 1}}}),
            json!({"kind": "Service", "metadata": {"uid": "m5"}, "spec": {"selector": {"app": "x"}}}),
            json!({"kind": "Deployment", "metadata": {"uid": "m6"}, "spec": {"template": "x"}}),
            json!({"kind": "Deployment", "metadata": {"uid": "m7"}, "spec": {"template": {"metadata": {"labels": {"app": ["x"]}}}}}),
            json!({"kind": "Ingress", "metadata": {"uid": "m8"}, "spec": {"rules": "x", "defaultBackend": 3}}),
            json!({"kind": "Ingress", "metadata": {"uid": "m9"},
                   "spec": {"backend": {"service": 1}, "rules": [null, {"http": 3}, {"http": {"paths": [null, {"backend": 5}]}}]}}),
            json!({"kind": "HorizontalPodAutoscaler", "metadata": {"uid": "m10"}, "spec": {"scaleTargetRef": "x"}}),
            json!({"kind": "HorizontalPodAutoscaler", "metadata": {"uid": "m11"}}),
            json!({"kind": "EndpointSlice", "metadata": {"uid": "m12", "labels": {SERVICE_NAME_LABEL: 5}}}),
            json!({"kind": "Endpoints", "metadata": {"uid": "m13"}}),
            json!({"kind": "Endpoints", "metadata": {"uid": "m14", "name": "s"}}),
        ];
        // m14 is named like Service m3/m4 (same namespace ""), the only other valid link is m1 -> m2.
        assert_eq!(
            triples(&edges(&objects)),
            [
                ("m1", "m2", EdgeType::Owner),
                ("m3", "m14", EdgeType::Endpoints),
                ("m4", "m14", EdgeType::Endpoints),
            ]
        );
        assert!(owned_closure(&objects, &objects).is_empty());
        assert_eq!(owned_closure(&objects[7..8], &objects), [8]);
        assert_eq!(owned_closure(&objects[10..11], &objects), [21]);
        assert!(owned_closure(&objects[..7], &objects).is_empty());
        assert!(edges(&[]).is_empty());
        assert!(owned_closure(&[], &[]).is_empty());
    }

    /// A UUID-shaped uid like the API server's (random v4), derived from `n` so runs are repeatable.
    fn uuid(n: u64) -> String {
        let mut x = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut next = || {
            x ^= x >> 30;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 27;
            x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        let (a, b) = (next(), next());
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            b >> 52,
            b & 0xffff_ffff_ffff
        )
    }

    /// 10,000 apps x 10 objects = 100,000 objects spread over 100 namespaces: Deployment, ReplicaSet,
    /// 3 Pods, Service (selector on a per-app and a shared label), EndpointSlice owned by the Service,
    /// Endpoints, HPA and Ingress.
    fn large_cluster() -> Vec<Value> {
        let mut objects = Vec::with_capacity(100_000);
        let mut ids = (0..).map(uuid);
        let mut uid = move || ids.next().unwrap_or_default();
        for a in 0..10_000 {
            let ns = format!("ns-{}", a % 100);
            let app = format!("app-{a}");
            let labels = json!({"app": app, "tier": "web"});
            let pod_labels = json!({"app": app, "tier": "web", "pod-template-hash": "abc"});
            let d = deployment(&ns, &app, &uid(), labels.clone());
            let rs = replicaset(&d, &format!("{app}-abc"), &uid(), pod_labels.clone());
            for p in 0..3 {
                let name = format!("{app}-abc-{p}");
                objects.push(owned(pod(&ns, &name, &uid(), pod_labels.clone()), &rs));
            }
            let svc = service(&ns, &app, &uid(), labels);
            objects.push(owned(slice(&ns, &format!("{app}-x"), &uid(), &app), &svc));
            objects.push(object("v1", "Endpoints", &ns, &app, &uid()));
            let mut hpa = object(
                "autoscaling/v2",
                "HorizontalPodAutoscaler",
                &ns,
                &app,
                &uid(),
            );
            hpa["spec"] = json!({"scaleTargetRef": {"kind": "Deployment", "name": app}});
            objects.push(hpa);
            let mut ingress = object("networking.k8s.io/v1", "Ingress", &ns, &app, &uid());
            ingress["spec"] =
                json!({"rules": [{"http": {"paths": [{"backend": {"service": {"name": app}}}]}}]});
            objects.push(ingress);
            objects.extend([d, rs, svc]);
        }
        objects
    }

    /// Prints timings with `--nocapture` (meaningful in release); `GRAPH_BENCH_RUNS=N` adds the best of N runs.
    #[test]
    fn hundred_thousand_objects() {
        let objects = trees(&large_cluster());
        assert_eq!(objects.len(), 100_000);
        let selected: Vec<Tree> = objects
            .iter()
            .filter(|o| {
                matches!(
                    o.get("kind").and_then(Tree::as_str),
                    Some("Deployment" | "Service")
                )
            })
            .cloned()
            .collect();

        let runs: usize = std::env::var("GRAPH_BENCH_RUNS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let (mut best_closure, mut best_edges) = (Duration::MAX, Duration::MAX);
        for _ in 0..runs {
            let start = Instant::now();
            let closure = std::hint::black_box(super::owned_closure(&selected, &objects));
            best_closure = best_closure.min(start.elapsed());
            let start = Instant::now();
            let graph = std::hint::black_box(Nodes::read(&objects, true).edges());
            best_edges = best_edges.min(start.elapsed());
            drop((closure, graph));
        }
        if runs > 0 {
            println!("best of {runs}: owned_closure {best_closure:?}, edges {best_edges:?}");
        }
        let start = Instant::now();
        let closure = super::owned_closure(&selected, &objects);
        let closure_time = start.elapsed();
        let start = Instant::now();
        let graph = Nodes::read(&objects, true).edges();
        let edges_time = start.elapsed();
        println!(
            "100k objects: owned_closure {closure_time:?}, edges {edges_time:?}, total {:?}",
            closure_time + edges_time
        );

        // ReplicaSet, 3 Pods, EndpointSlice, Endpoints per app; selected objects are not returned.
        assert_eq!(closure.len(), 60_000);
        let count = |kind: EdgeType| graph.iter().filter(|e| e.kind == kind).count();
        // D->RS, RS->3 Pods, Service->EndpointSlice (owner wins over the label).
        assert_eq!(count(EdgeType::Owner), 50_000);
        assert_eq!(count(EdgeType::EndpointSlice), 0);
        assert_eq!(count(EdgeType::Endpoints), 10_000);
        // Only Service -> Deployment: ReplicaSets and Pods sit under a matching controller.
        assert_eq!(count(EdgeType::ServiceSelector), 10_000);
        assert_eq!(count(EdgeType::IngressBackend), 10_000);
        assert_eq!(count(EdgeType::ScaleTarget), 10_000);
        assert_eq!(graph.len(), 90_000);
    }
}
