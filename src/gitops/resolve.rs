//! From a group's sources to its objects (SPEC 15): each source's entries looked up among what
//! has been listed, Flux objects among them expanded in turn (at most [`MAX_DEPTH`] levels, a
//! cycle reported), an `APPLIES` link from each source to what it applied. Pure: what is not
//! listed yet is returned as [`Needs`]; the caller lists it and resolves again.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use super::{argo, helm, inventory, ObjRef, SourceKind};
use crate::resources::object::Object;
use crate::resources::tree::Tree;

/// How deep sources nest: a Kustomization applying a Kustomization applying a HelmRelease…
/// is expanded down to this level (the bound source is level 0).
pub const MAX_DEPTH: usize = 5;

/// `(group, kind, namespace or "", name)`: how objects are looked up, whatever their version
/// (the cluster serves a kind at its preferred version; an entry's `v` says which it applied).
pub type Key = (String, String, String, String);

fn key(r: &ObjRef) -> Key {
    (
        r.group.clone(),
        r.kind.clone(),
        r.namespace.clone().unwrap_or_default(),
        r.name.clone(),
    )
}

/// A [`Key`]'s parts borrowed: how the thousands of an inventory's entries are looked up
/// without copying each (a `Key` borrows as `dyn KeyParts`, hashed and compared alike).
trait KeyParts {
    fn parts(&self) -> (&str, &str, &str, &str);
}

impl KeyParts for Key {
    fn parts(&self) -> (&str, &str, &str, &str) {
        (&self.0, &self.1, &self.2, &self.3)
    }
}

impl KeyParts for (&str, &str, &str, &str) {
    fn parts(&self) -> (&str, &str, &str, &str) {
        *self
    }
}

impl<'a> Borrow<dyn KeyParts + 'a> for Key {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

impl Hash for dyn KeyParts + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the tuple of `String`s hashes: each part as its `str`.
        self.parts().hash(state)
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyParts + '_ {}

/// The key of a listed object, from its own fields.
fn object_key(o: &Object) -> Key {
    let (group, _) = super::split_api_version(super::text(&o.view, &["apiVersion"]));
    (
        group.to_owned(),
        super::text(&o.view, &["kind"]).to_owned(),
        super::text(&o.view, &["metadata", "namespace"]).to_owned(),
        super::text(&o.view, &["metadata", "name"]).to_owned(),
    )
}

/// What has been listed so far.
#[derive(Default)]
pub struct Loaded {
    /// FxHash: the keys are the cluster's names, and a collision costs a comparison.
    by_key: FxHashMap<Key, Arc<Object>>,
    by_namespace: HashMap<String, Vec<Arc<Object>>>,
    cluster_asked: FxHashSet<Key>,
    kinds_asked: HashSet<(String, String)>,
    helm: HashMap<(String, String), Result<Vec<ObjRef>, String>>,
}

impl Loaded {
    /// Every object of `namespace` (as one watch set of the cache holds them).
    pub fn add_namespace(&mut self, namespace: &str, objects: Vec<Arc<Object>>) {
        self.by_key.reserve(objects.len());
        for o in &objects {
            self.by_key.insert(object_key(o), o.clone());
        }
        self.by_namespace.insert(namespace.to_owned(), objects);
    }

    /// The answer for a cluster-scoped object: found, or not there.
    pub fn add_cluster(&mut self, r: &ObjRef, object: Option<Arc<Object>>) {
        let mut k = key(r);
        k.2.clear();
        if let Some(o) = object {
            self.by_key.insert(k.clone(), o);
        }
        self.cluster_asked.insert(k);
    }

    /// The objects of a Helm release's manifest, or why they could not be read.
    pub fn add_helm(
        &mut self,
        storage_namespace: &str,
        release: &str,
        objects: Result<Vec<ObjRef>, String>,
    ) {
        self.helm
            .insert((storage_namespace.to_owned(), release.to_owned()), objects);
    }

    /// A group version whose kinds were asked for (whatever the answer).
    pub fn add_kinds_asked(&mut self, group: &str, version: &str) {
        self.kinds_asked
            .insert((group.to_owned(), version.to_owned()));
    }

    /// Whether `namespace` is listed.
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.by_namespace.contains_key(namespace)
    }

    /// Every listed object of the listed namespaces.
    pub fn namespaced_objects(&self) -> impl Iterator<Item = &Arc<Object>> {
        self.by_namespace.values().flatten()
    }
}

/// What must be listed before the resolution can finish.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Needs {
    pub namespaces: BTreeSet<String>,
    /// Cluster-scoped objects, by reference (with the entry's version when it has one).
    pub cluster: Vec<ObjRef>,
    /// `(storage namespace, release name)` of Helm releases to read from their Secret.
    pub helm: BTreeSet<(String, String)>,
    /// `(group, version)` whose kinds discovery did not give (cluster-scoped kinds: discovery
    /// keeps what a namespace lists).
    pub kinds: BTreeSet<(String, String)>,
}

impl Needs {
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.cluster.is_empty()
            && self.helm.is_empty()
            && self.kinds.is_empty()
    }
}

/// A source as the group shows it: what names it, and the object when it was found.
#[derive(Debug, Clone)]
pub struct Source {
    pub reference: ObjRef,
    pub object: Option<Arc<Object>>,
}

/// The outcome of one resolution.
#[derive(Debug, Default)]
pub struct Resolution {
    pub needs: Needs,
    /// The sources and everything they applied, one per uid, in the order met.
    pub objects: Vec<Arc<Object>>,
    /// `(from, to)`, as indexes into `objects`: a source and what it applied (each object
    /// is there once, a source before what it applied).
    pub applies: Vec<(u32, u32)>,
    pub sources: Vec<Source>,
    /// The namespaces the group spans, in the order met.
    pub namespaces: Vec<String>,
    pub warnings: Vec<String>,
}

/// Resolves `sources` over `loaded`. `namespaced` says, from discovery, whether a kind is
/// namespaced (`None`: the cluster does not serve it).
pub fn resolve(
    sources: &[ObjRef],
    loaded: &Loaded,
    namespaced: &dyn Fn(&str, &str) -> Option<bool>,
) -> Resolution {
    let mut walk = Walk {
        loaded,
        namespaced,
        out: Resolution::default(),
        seen_uids: FxHashMap::default(),
        seen_namespaces: FxHashSet::default(),
        expanded: HashSet::new(),
    };
    for source in sources {
        let object = walk.visit(source, None, 0, &mut Vec::new(), None);
        walk.out.sources.push(Source {
            reference: source.clone(),
            object,
        });
    }
    walk.out
}

struct Walk<'a> {
    loaded: &'a Loaded,
    namespaced: &'a dyn Fn(&str, &str) -> Option<bool>,
    out: Resolution,
    /// Each uid met, its object's index in `out.objects`. Borrowed from the listed objects:
    /// no copy of each uid.
    seen_uids: FxHashMap<&'a str, u32>,
    seen_namespaces: FxHashSet<String>,
    /// Sources already expanded (a source reached twice, not in a cycle, is expanded once).
    expanded: HashSet<Key>,
}

fn uid(o: &Object) -> &str {
    super::text(&o.view, &["metadata", "uid"])
}

impl<'a> Walk<'a> {
    fn namespace_seen(&mut self, ns: &str) {
        // Asked before copied: an inventory names its few namespaces thousands of times.
        if !self.seen_namespaces.contains(ns) {
            self.seen_namespaces.insert(ns.to_owned());
            self.out.namespaces.push(ns.to_owned());
        }
    }

    /// Looks `r` up (its namespace defaulting to `default_ns` for a namespaced kind that names
    /// none), links it from `parent`, and expands it when it is a source.
    fn visit(
        &mut self,
        r: &ObjRef,
        parent: Option<(u32, &str)>,
        depth: usize,
        path: &mut Vec<Key>,
        default_ns: Option<&str>,
    ) -> Option<Arc<Object>> {
        let by = || parent.map_or(String::new(), |(_, name)| format!(" (applied by {name})"));
        // `r` with the namespace it is looked up in: copied only to be told of or expanded.
        let at = |ns: Option<&str>| ObjRef {
            namespace: ns.map(str::to_owned),
            ..r.clone()
        };
        let Some(namespaced) = (self.namespaced)(&r.group, &r.kind) else {
            if let Some(version) = &r.version {
                let gv = (r.group.clone(), version.clone());
                if !self.loaded.kinds_asked.contains(&gv) {
                    self.out.needs.kinds.insert(gv);
                    return None;
                }
            }
            self.out.warnings.push(format!(
                "{}{}: the cluster serves no such kind",
                r.describe(),
                by()
            ));
            return None;
        };
        let loaded: &'a Loaded = self.loaded;
        let (object, ns) = if namespaced {
            let Some(ns) = r.namespace.as_deref().or(default_ns) else {
                self.out
                    .warnings
                    .push(format!("{}{}: no namespace", r.describe(), by()));
                return None;
            };
            self.namespace_seen(ns);
            if !loaded.has_namespace(ns) {
                self.out.needs.namespaces.insert(ns.to_owned());
                return None;
            }
            let k = (r.group.as_str(), r.kind.as_str(), ns, r.name.as_str());
            (loaded.by_key.get(&k as &dyn KeyParts), Some(ns))
        } else {
            let k = (r.group.as_str(), r.kind.as_str(), "", r.name.as_str());
            if !loaded.cluster_asked.contains(&k as &dyn KeyParts) {
                self.out.needs.cluster.push(at(None));
                return None;
            }
            (loaded.by_key.get(&k as &dyn KeyParts), None)
        };
        let Some(object) = object else {
            self.out
                .warnings
                .push(format!("{}{}: not found", at(ns).describe(), by()));
            return None;
        };
        let objects = &mut self.out.objects;
        let index = *self.seen_uids.entry(uid(object)).or_insert_with(|| {
            objects.push(object.clone());
            objects.len() as u32 - 1
        });
        if let Some((from, _)) = parent {
            self.out.applies.push((from, index));
        }
        if let Some(kind) = SourceKind::of(&r.group, &r.kind) {
            self.expand(kind, &at(ns), object, index, depth, path);
        }
        Some(object.clone())
    }

    fn expand(
        &mut self,
        kind: SourceKind,
        r: &ObjRef,
        object: &Arc<Object>,
        index: u32,
        depth: usize,
        path: &mut Vec<Key>,
    ) {
        let k = key(r);
        if path.contains(&k) {
            let cycle: Vec<String> = path
                .iter()
                .skip_while(|p| **p != k)
                .map(|p| format!("{} {}/{}", p.1, p.2, p.3))
                .collect();
            self.out.warnings.push(format!(
                "A cycle of sources: {} applies {} again; it is expanded once",
                cycle.join(" → "),
                r.describe()
            ));
            return;
        }
        if depth >= MAX_DEPTH {
            self.out.warnings.push(format!(
                "{} is nested more than {MAX_DEPTH} levels deep: what it applied is not shown",
                r.describe()
            ));
            return;
        }
        if !self.expanded.insert(k.clone()) {
            return;
        }
        let view = &object.view;
        let (children, default_ns) = match kind {
            SourceKind::Kustomization => match inventory::entries(view) {
                Some((refs, errors)) => {
                    self.id_errors(r, errors);
                    (refs, None)
                }
                None => (Vec::new(), None),
            },
            SourceKind::Application => (argo::resources(view).unwrap_or_default(), None),
            SourceKind::HelmRelease => match self.helm_children(r, view) {
                Some(found) => found,
                None => return,
            },
        };
        let name = r.describe();
        path.push(k);
        for child in &children {
            self.visit(
                child,
                Some((index, &name)),
                depth + 1,
                path,
                default_ns.as_deref(),
            );
        }
        path.pop();
    }

    fn id_errors(&mut self, r: &ObjRef, errors: Vec<inventory::IdError>) {
        for e in errors {
            self.out.warnings.push(format!(
                "{}: an inventory entry was skipped: {e}",
                r.describe()
            ));
        }
    }

    /// A HelmRelease's objects: its inventory, else the objects labelled with its name and
    /// namespace (in its target namespace), else its release Secret's manifest. `None` while
    /// something must be listed first.
    fn helm_children(&mut self, r: &ObjRef, view: &Tree) -> Option<(Vec<ObjRef>, Option<String>)> {
        if let Some((refs, errors)) = inventory::entries(view) {
            self.id_errors(r, errors);
            return Some((refs, None));
        }
        let target = helm::target_namespace(view);
        self.namespace_seen(&target);
        if !self.loaded.has_namespace(&target) {
            self.out.needs.namespaces.insert(target);
            return None;
        }
        let hr_namespace = r.namespace.clone().unwrap_or_default();
        let labelled: Vec<ObjRef> = self.loaded.by_namespace[&target]
            .iter()
            .filter(|o| {
                let label = |name: &str| {
                    o.view
                        .get("metadata")
                        .and_then(|m| m.get("labels"))
                        .and_then(|l| l.get(name))
                        .and_then(Tree::as_str)
                };
                label(helm::NAME_LABEL) == Some(r.name.as_str())
                    && label(helm::NAMESPACE_LABEL) == Some(hr_namespace.as_str())
            })
            .map(|o| ObjRef::of(&o.view))
            .collect();
        if !labelled.is_empty() {
            return Some((labelled, None));
        }
        let store = (helm::storage_namespace(view), helm::release_name(view));
        match self.loaded.helm.get(&store) {
            None => {
                self.out.needs.helm.insert(store);
                None
            }
            Some(Ok(refs)) => Some((refs.clone(), Some(target))),
            Some(Err(why)) => {
                self.out.warnings.push(format!(
                    "{}: its Helm release {} could not be read: {why}",
                    r.describe(),
                    store.1
                ));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn object(
        api_version: &str,
        kind: &str,
        ns: Option<&str>,
        name: &str,
        extra: Value,
    ) -> Arc<Object> {
        let mut v = json!({"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "uid": format!("{kind}-{}-{name}", ns.unwrap_or(""))}});
        if let Some(ns) = ns {
            v["metadata"]["namespace"] = json!(ns);
        }
        if let (Value::Object(v), Value::Object(extra)) = (&mut v, extra) {
            for (k, e) in extra {
                if k == "labels" {
                    v.get_mut("metadata").unwrap()["labels"] = e;
                } else {
                    v.insert(k, e);
                }
            }
        }
        Arc::new(Object::parse_text(v.to_string().into(), api_version, kind).unwrap())
    }

    fn ks(ns: &str, name: &str, ids: &[&str]) -> Arc<Object> {
        let entries: Vec<Value> = ids.iter().map(|id| json!({"id": id, "v": "v1"})).collect();
        object(
            "kustomize.toolkit.fluxcd.io/v1",
            "Kustomization",
            Some(ns),
            name,
            json!({"status": {"inventory": {"entries": entries}}}),
        )
    }

    fn kinds(group: &str, kind: &str) -> Option<bool> {
        match (group, kind) {
            ("", "Namespace") | ("rbac.authorization.k8s.io", "ClusterRole") => Some(false),
            ("", _)
            | ("apps", _)
            | ("kustomize.toolkit.fluxcd.io", _)
            | ("helm.toolkit.fluxcd.io", _)
            | ("argoproj.io", _) => Some(true),
            _ => None,
        }
    }

    fn source(group: &str, kind: &str, ns: &str, name: &str) -> ObjRef {
        ObjRef {
            group: group.into(),
            version: None,
            kind: kind.into(),
            namespace: Some(ns.into()),
            name: name.into(),
        }
    }

    /// Resolves, listing what is asked for from `world` until nothing is.
    fn settle(
        sources: &[ObjRef],
        world: &[Arc<Object>],
        helm: &[(&str, &str, Vec<ObjRef>)],
    ) -> (Resolution, usize) {
        let mut loaded = Loaded::default();
        for round in 1..10 {
            let r = resolve(sources, &loaded, &kinds);
            if r.needs.is_empty() {
                return (r, round);
            }
            for ns in &r.needs.namespaces {
                let objects = world
                    .iter()
                    .filter(|o| super::super::text(&o.view, &["metadata", "namespace"]) == ns)
                    .cloned()
                    .collect();
                loaded.add_namespace(ns, objects);
            }
            for c in &r.needs.cluster {
                let found = world
                    .iter()
                    .find(|o| {
                        let of = ObjRef::of(&o.view);
                        of.namespace.is_none() && of.kind == c.kind && of.name == c.name
                    })
                    .cloned();
                loaded.add_cluster(c, found);
            }
            // The tests' kinds are all known up front: a group version asked for serves none.
            for (group, version) in &r.needs.kinds {
                loaded.add_kinds_asked(group, version);
            }
            for (ns, release) in &r.needs.helm {
                let found = helm.iter().find(|(n, r, _)| n == ns && r == release);
                loaded.add_helm(
                    ns,
                    release,
                    found
                        .map(|f| f.2.clone())
                        .ok_or_else(|| "no deployed release".into()),
                );
            }
        }
        panic!("did not settle");
    }

    /// `(from, to)` by uid.
    fn applies(r: &Resolution) -> Vec<(String, String)> {
        let uid = |i: u32| super::uid(&r.objects[i as usize]).to_owned();
        r.applies
            .iter()
            .map(|&(from, to)| (uid(from), uid(to)))
            .collect()
    }

    fn names(r: &Resolution) -> Vec<String> {
        r.objects
            .iter()
            .map(|o| ObjRef::of(&o.view).describe())
            .collect()
    }

    #[test]
    fn a_kustomization_spans_namespaces_and_cluster_scoped_entries() {
        let world = vec![
            ks(
                "flux-system",
                "apps",
                &[
                    "_shop__Namespace",
                    "shop_web_apps_Deployment",
                    "blue_web__Service",
                    "green_web__Service",
                    "_shop__reader_rbac.authorization.k8s.io_ClusterRole",
                ],
            ),
            object("v1", "Namespace", None, "shop", json!({})),
            object("apps/v1", "Deployment", Some("shop"), "web", json!({})),
            object("v1", "Service", Some("blue"), "web", json!({})),
            object("v1", "Service", Some("green"), "web", json!({})),
            object(
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                None,
                "shop:reader",
                json!({}),
            ),
            object("v1", "Service", Some("shop"), "unrelated", json!({})),
        ];
        let (r, _) = settle(
            &[source(
                "kustomize.toolkit.fluxcd.io",
                "Kustomization",
                "flux-system",
                "apps",
            )],
            &world,
            &[],
        );
        assert_eq!(
            names(&r),
            [
                "kustomize.toolkit.fluxcd.io/Kustomization flux-system/apps",
                "Namespace shop",
                "apps/Deployment shop/web",
                "Service blue/web",
                "Service green/web",
                "rbac.authorization.k8s.io/ClusterRole shop:reader",
            ]
        );
        assert_eq!(r.namespaces, ["flux-system", "shop", "blue", "green"]);
        assert_eq!(r.applies.len(), 5);
        assert!(applies(&r)
            .iter()
            .all(|(from, _)| from == "Kustomization-flux-system-apps"));
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        assert!(r.sources[0].object.is_some());
    }

    #[test]
    fn three_levels_nest_and_a_cycle_is_warned_once() {
        let world = vec![
            ks(
                "flux-system",
                "root",
                &["flux-system_infra_kustomize.toolkit.fluxcd.io_Kustomization"],
            ),
            ks(
                "flux-system",
                "infra",
                &[
                    "apps_podinfo_helm.toolkit.fluxcd.io_HelmRelease",
                    "flux-system_root_kustomize.toolkit.fluxcd.io_Kustomization",
                ],
            ),
            object(
                "helm.toolkit.fluxcd.io/v2",
                "HelmRelease",
                Some("apps"),
                "podinfo",
                json!({"status": {"inventory": {"entries": [{"id": "apps_podinfo_apps_Deployment", "v": "v1"}]}}}),
            ),
            object("apps/v1", "Deployment", Some("apps"), "podinfo", json!({})),
        ];
        let (r, _) = settle(
            &[source(
                "kustomize.toolkit.fluxcd.io",
                "Kustomization",
                "flux-system",
                "root",
            )],
            &world,
            &[],
        );
        assert_eq!(r.objects.len(), 4);
        assert!(applies(&r).contains(&(
            "HelmRelease-apps-podinfo".into(),
            "Deployment-apps-podinfo".into()
        )));
        assert!(applies(&r).contains(&(
            "Kustomization-flux-system-infra".into(),
            "Kustomization-flux-system-root".into()
        )));
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert!(
            r.warnings[0].starts_with("A cycle of sources"),
            "{}",
            r.warnings[0]
        );
    }

    #[test]
    fn nesting_stops_after_five_levels() {
        let mut world: Vec<Arc<Object>> = (0..8)
            .map(|i| {
                ks(
                    "f",
                    &format!("k{i}"),
                    &[&format!(
                        "f_k{}_kustomize.toolkit.fluxcd.io_Kustomization",
                        i + 1
                    )],
                )
            })
            .collect();
        world.push(ks("f", "k8", &[]));
        let (r, _) = settle(
            &[source(
                "kustomize.toolkit.fluxcd.io",
                "Kustomization",
                "f",
                "k0",
            )],
            &world,
            &[],
        );
        // k0 (level 0) to k5 (level 5) are shown; k5's own inventory is not expanded.
        assert_eq!(r.objects.len(), 6);
        assert_eq!(r.warnings.len(), 1);
        assert!(
            r.warnings[0].contains("k5 is nested more than 5"),
            "{}",
            r.warnings[0]
        );
    }

    #[test]
    fn helm_releases_fall_back_to_labels_then_to_their_release() {
        let labelled = object(
            "helm.toolkit.fluxcd.io/v2",
            "HelmRelease",
            Some("flux-system"),
            "web",
            json!({"spec": {"targetNamespace": "apps"}}),
        );
        let stored = object(
            "helm.toolkit.fluxcd.io/v2",
            "HelmRelease",
            Some("flux-system"),
            "podinfo",
            json!({"spec": {"targetNamespace": "apps"}}),
        );
        let world = vec![
            labelled,
            stored,
            object(
                "apps/v1",
                "Deployment",
                Some("apps"),
                "web",
                json!({"labels": {
                "helm.toolkit.fluxcd.io/name": "web", "helm.toolkit.fluxcd.io/namespace": "flux-system"}}),
            ),
            object(
                "apps/v1",
                "Deployment",
                Some("apps"),
                "other",
                json!({"labels": {
                "helm.toolkit.fluxcd.io/name": "web", "helm.toolkit.fluxcd.io/namespace": "elsewhere"}}),
            ),
            object("apps/v1", "Deployment", Some("apps"), "podinfo", json!({})),
            object("v1", "Service", Some("apps"), "podinfo", json!({})),
        ];
        let (r, _) = settle(
            &[source(
                "helm.toolkit.fluxcd.io",
                "HelmRelease",
                "flux-system",
                "web",
            )],
            &world,
            &[],
        );
        assert_eq!(names(&r)[1..], ["apps/Deployment apps/web"]);
        let manifest = helm::manifest_objects("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: podinfo\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: podinfo\n");
        let (r, _) = settle(
            &[source(
                "helm.toolkit.fluxcd.io",
                "HelmRelease",
                "flux-system",
                "podinfo",
            )],
            &world,
            &[("flux-system", "apps-podinfo", manifest)],
        );
        // The manifest's objects without a namespace are in the target namespace.
        assert_eq!(
            names(&r)[1..],
            ["apps/Deployment apps/podinfo", "Service apps/podinfo"]
        );
        // No release stored: a warning, the HelmRelease still shown.
        let (r, _) = settle(
            &[source(
                "helm.toolkit.fluxcd.io",
                "HelmRelease",
                "flux-system",
                "podinfo",
            )],
            &world,
            &[],
        );
        assert_eq!(r.objects.len(), 1);
        assert!(
            r.warnings[0].contains("apps-podinfo could not be read"),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn argo_applications_and_missing_or_unknown_entries() {
        let world = vec![
            object(
                "argoproj.io/v1alpha1",
                "Application",
                Some("argocd"),
                "shop",
                json!({"status": {"resources": [
                    {"group": "apps", "version": "v1", "kind": "Deployment", "namespace": "shop", "name": "web"},
                    {"version": "v1", "kind": "Service", "namespace": "shop", "name": "gone"},
                    {"group": "example.com", "version": "v1", "kind": "Widget", "namespace": "shop", "name": "w"},
                ]}}),
            ),
            object("apps/v1", "Deployment", Some("shop"), "web", json!({})),
        ];
        let (r, _) = settle(
            &[source("argoproj.io", "Application", "argocd", "shop")],
            &world,
            &[],
        );
        assert_eq!(
            names(&r),
            [
                "argoproj.io/Application argocd/shop",
                "apps/Deployment shop/web"
            ]
        );
        assert_eq!(r.warnings.len(), 2, "{:?}", r.warnings);
        assert!(r.warnings[0].contains("Service shop/gone"));
        assert!(r.warnings[1].contains("no such kind"));
        // A bound source that is not there is a warning, with no object.
        let (r, _) = settle(
            &[source("argoproj.io", "Application", "argocd", "nope")],
            &world,
            &[],
        );
        assert!(r.sources[0].object.is_none());
        assert_eq!(r.warnings.len(), 1);
    }
}
