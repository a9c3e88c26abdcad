//! What the graph reads of each object, copied out of its tree in one visit: [`Nodes`].

use std::borrow::Borrow;

use super::claims::claim_names;
use super::endpoints::SERVICE_NAME_LABEL;
use super::hashing::{hash_strs, uid_prefix, Hashed};
use super::ingress::ingress_backends;
use super::{join, EdgeType, NsName};
use crate::resources::tree::{prefetched, Items, Map, Tree};

// ---- small accessors: every one returns None / empty on a wrong shape instead of panicking ----

pub(super) fn value_at<'a>(v: &'a Tree, path: &[&str]) -> Option<&'a Tree> {
    path.iter().try_fold(v, |v, key| v.get(key))
}

pub(super) fn str_at<'a>(v: &'a Tree, path: &[&str]) -> Option<&'a str> {
    value_at(v, path)?.as_str()
}

/// The elements of the array at `path`; nothing when it is missing or not an array.
pub(super) fn array_at<'a>(v: &'a Tree, path: &[&str]) -> impl Iterator<Item = &'a Tree> {
    value_at(v, path)
        .and_then(Tree::as_array)
        .into_iter()
        .flatten()
}

/// A string that identifies something; empty counts as missing, so that two nameless objects never "match".
pub(super) fn non_empty(s: Option<&str>) -> Option<&str> {
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

// ---- what the graph knows of each object, read from its tree in one visit ----

/// A string copied into [`Nodes::text`]. Offsets are `u32`: the identity strings of a group
/// (uids, names, labels) are a small part of its objects, far below 4 GiB for any cluster.
#[derive(Clone, Copy, Debug)]
pub(super) struct Str {
    pub(super) start: u32,
    pub(super) len: u32,
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
pub(super) enum Role {
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
pub(super) struct Node {
    pub(super) kind: Str,
    /// Kinds repeat from one object to the next, and so their hashes.
    pub(super) kind_hash: u64,
    pub(super) role: Role,
    pub(super) uid: Option<Str>,
    /// The uid's first 8 bytes, big-endian: orders uids without reading them in most comparisons.
    pub(super) prefix: u64,
    pub(super) name: Option<Str>,
    pub(super) namespace: Str,
}

/// A reference from an object to something it names, `(namespace of the object, name)`.
#[derive(Clone, Copy, Debug)]
pub(super) struct NameRef {
    pub(super) object: u32,
    pub(super) target: Str,
    /// Which link: whether the object is the edge's parent (an Ingress of its Service) or its
    /// child (an Endpoints of its Service) is the kind's to say.
    pub(super) kind: EdgeType,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct OwnerRef {
    pub(super) child: u32,
    pub(super) uid: Str,
    pub(super) controller: bool,
}

/// An autoscaler's `spec.scaleTargetRef`.
#[derive(Clone, Copy, Debug)]
pub(super) struct ScaleTarget {
    pub(super) autoscaler: u32,
    pub(super) kind: Str,
    pub(super) name: Str,
}

/// A Service's selector or a workload's pod labels: a range of [`Nodes::pairs`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Labels {
    pub(super) object: u32,
    pub(super) start: u32,
    pub(super) end: u32,
}

/// A label or selector pair with a string value.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pair {
    pub(super) key: Str,
    pub(super) value: Str,
}

/// What the dependency graph reads of a list of objects, copied out of their trees in one visit
/// each.
///
/// A group of 100,000 objects does not fit in the caches: each field read of a tree is a miss,
/// and the graph's passes (indexes, lookups, the sort) would each read the trees again in an
/// order of their own. Here each tree is read once, in order, beside its health
/// ([`crate::resources::group::edges_and_health`]); the passes then work on a few compact vectors.
#[derive(Debug, Default)]
pub struct Nodes {
    /// Every copied string.
    text: String,
    pub(super) nodes: Vec<Node>,
    pub(super) owners: Vec<OwnerRef>,
    pub(super) names: Vec<NameRef>,
    pub(super) scale_targets: Vec<ScaleTarget>,
    /// Services with a usable selector.
    pub(super) selectors: Vec<Labels>,
    /// Pods and objects with pod template labels.
    pub(super) workloads: Vec<Labels>,
    pub(super) pairs: Vec<Pair>,
    /// Whether to read what only [`Nodes::edges`] needs (`spec`, pod labels), not just what
    /// [`super::owned_closure`] needs.
    links: bool,
}

impl Nodes {
    /// Nodes for [`Nodes::edges`] (`links`) or for [`super::owned_closure`] only, with room for `objects`.
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
        let prefetch = objects.len() >= crate::resources::PREFETCH_FROM;
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
        let parallel = objects.len() >= crate::resources::PARALLEL_FROM;
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

    pub(super) fn str(&self, s: Str) -> &str {
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
            (None, None, "", None, Items::default());
        // Only a Pod's and an EndpointSlice's own labels link anything.
        let want_labels = role == Role::EndpointSlice || (self.links && role == Role::Pod);
        for (key, field) in meta.into_iter().flat_map(Map::iter) {
            match key {
                "uid" => uid = non_empty(field.as_str()),
                "name" => name = non_empty(field.as_str()),
                "namespace" => namespace = field.as_str().unwrap_or(""),
                // Checked before the key's text is read: that read is the cost.
                k if want_labels && k == "labels" => labels = field.as_object(),
                "ownerReferences" => owners = field.as_array().unwrap_or_default(),
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
        let name_ref = |nodes: &mut Nodes, target: &str, kind: EdgeType| {
            let target = nodes.copy(target);
            nodes.names.push(NameRef {
                object: i,
                target,
                kind,
            });
        };
        match role {
            Role::Endpoints => {
                if let Some(name) = name {
                    name_ref(self, name, EdgeType::Endpoints);
                }
            }
            Role::EndpointSlice => {
                let service = labels.and_then(|l| l.get(SERVICE_NAME_LABEL));
                if let Some(service) = non_empty(service.and_then(Tree::as_str)) {
                    name_ref(self, service, EdgeType::EndpointSlice);
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
                    name_ref(self, backend, EdgeType::IngressBackend);
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
                    for claim in spec.into_iter().flat_map(claim_names) {
                        name_ref(self, claim, EdgeType::VolumeClaim);
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

    pub(super) fn hashed(&self, s: Str) -> Hashed<&str> {
        let key = self.str(s);
        Hashed {
            hash: hash_strs(&[key]),
            key,
        }
    }

    pub(super) fn uid(&self, i: u32) -> Option<Hashed<&str>> {
        self.nodes[i as usize].uid.map(|uid| self.hashed(uid))
    }

    pub(super) fn uid_str(&self, i: u32) -> &str {
        self.nodes[i as usize].uid.map_or("", |uid| self.str(uid))
    }

    /// Whether objects `a` and `b` have the same uid: most pairs differ in the first bytes.
    pub(super) fn same_uid(&self, a: u32, b: u32) -> bool {
        a == b
            || (self.nodes[a as usize].prefix == self.nodes[b as usize].prefix
                && self.uid_str(a) == self.uid_str(b))
    }

    pub(super) fn ns_name(&self, i: u32) -> Option<Hashed<NsName<'_>>> {
        Some(self.target(i, self.nodes[i as usize].name?))
    }

    /// `(namespace, name)`: `name` in the namespace of object `object`.
    pub(super) fn target(&self, object: u32, name: Str) -> Hashed<NsName<'_>> {
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
    pub(super) fn service_key(&self, i: u32) -> Option<Hashed<NsName<'_>>> {
        (self.nodes[i as usize].role == Role::Service)
            .then(|| self.ns_name(i))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::EdgeType;
    use serde_json::json;

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
}
