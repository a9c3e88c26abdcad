//! What changed between two assemblies of one resource group (SPEC 8.2,
//! `resourceGroupUpdated`): the resources added or modified, the uids removed, the edges added
//! and removed, and the group's current health, warnings and errors. Pure, so that "the first
//! message with every later one applied equals a fresh answer" is a property of [`diff`] and
//! [`apply`], tested here without I/O.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Weak};

use super::graph::{Edge, EdgeType};
use super::group::{Resource, ResourceGroup};
use super::health::Health;
use super::listing::ListError;
use super::object::Object;

/// An edge named by the uids of its ends, as the subscription sends it: indices into one
/// assembly mean nothing in the next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UidEdge {
    pub from: String,
    pub to: String,
    pub kind: EdgeType,
}

/// One message of `resourceGroupUpdated`.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupDelta {
    /// The whole group: every resource upserted, every edge added; a reader starts over.
    pub complete: bool,
    /// The group's health now.
    pub health: Health,
    /// Added or changed since the previous message, in the group's order.
    pub upserted: Vec<Resource>,
    /// The uids gone since the previous message.
    pub removed: Vec<String>,
    pub edges_added: Vec<UidEdge>,
    pub edges_removed: Vec<UidEdge>,
    /// The group's warnings and errors now (they are few; sent whole).
    pub warnings: Vec<String>,
    pub errors: Vec<ListError>,
}

impl GroupDelta {
    /// The first message: all of `group`.
    pub fn complete(group: &ResourceGroup) -> Self {
        GroupDelta {
            complete: true,
            health: group.health.clone(),
            upserted: group.resources.clone(),
            removed: Vec::new(),
            edges_added: uid_edges(group),
            edges_removed: Vec::new(),
            warnings: group.warnings.clone(),
            errors: group.errors.clone(),
        }
    }

    /// Nothing a reader would see differently.
    pub fn is_empty(&self) -> bool {
        !self.complete
            && self.upserted.is_empty()
            && self.removed.is_empty()
            && self.edges_added.is_empty()
            && self.edges_removed.is_empty()
    }
}

/// The group's edges by uid, in the group's order.
pub fn uid_edges(group: &ResourceGroup) -> Vec<UidEdge> {
    group
        .edges
        .iter()
        .map(|e| UidEdge {
            from: group.resources[e.from as usize].uid.clone(),
            to: group.resources[e.to as usize].uid.clone(),
            kind: e.kind,
        })
        .collect()
}

/// What turns `before` into `after`. Resources are compared whole (their object text, health
/// and Events), so a Pod whose status changed is upserted and its untouched siblings are not.
/// Whether it is worth a message is [`changed`]'s question: a new rollup, warning or error
/// alone is one.
pub fn diff(before: &ResourceGroup, after: &ResourceGroup) -> GroupDelta {
    Summary::of(before, None).diff(after)
}

/// Whether `delta` (from [`diff`] of `before`) tells a reader anything.
pub fn changed(before: &ResourceGroup, delta: &GroupDelta) -> bool {
    !delta.is_empty()
        || before.health != delta.health
        || before.warnings != delta.warnings
        || before.errors != delta.errors
}

/// What a feed keeps of the group it sent last, to tell what the next assembly changed
/// ([`Summary::diff`]) without keeping the group: each resource's uid and a hash of the rest,
/// the edges by position, the group's health, warnings and errors. About 70 bytes a resource,
/// where the group holds a copy of each one's names and labels (1 to 2 KB): a health keeper
/// follows 10,000 groups at once (SPEC 18).
///
/// A resource is the same as before when its object is (the same one the watch cache holds,
/// else the same text), and its Events, health and names are. The object is held weakly: its
/// allocation cannot be reused while it is, so an equal address is the same object.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The uids one after the other; `ends[i]` is where the `i`-th ends.
    uids: String,
    ends: Vec<u32>,
    resources: Vec<Kept>,
    edges: Vec<Edge>,
    health: Health,
    warnings: Vec<String>,
    errors: Vec<ListError>,
}

#[derive(Debug, Clone)]
struct Kept {
    object: Weak<Object>,
    /// Of the object's text, apiVersion and kind ([`object_hash`]).
    text: u64,
    /// Of the resource's other fields ([`rest_hash`]).
    rest: u64,
}

fn object_hash(object: &Object) -> u64 {
    let mut h = DefaultHasher::new();
    object.text().hash(&mut h);
    let view = &object.view;
    for field in ["apiVersion", "kind"] {
        view.get(field)
            .and_then(super::tree::Tree::as_str)
            .hash(&mut h);
    }
    h.finish()
}

/// The fields a resource has beside its object: they follow from it, but for its Events (the
/// labels are left out: they are the object's).
fn rest_hash(r: &Resource) -> u64 {
    let mut h = DefaultHasher::new();
    (&r.uid, &r.api_version, &r.kind, &r.namespace, &r.name).hash(&mut h);
    r.created_at.hash(&mut h);
    r.health
        .as_ref()
        .map(|health| (health.status, &health.message))
        .hash(&mut h);
    r.events.hash(&mut h);
    h.finish()
}

impl Summary {
    /// The summary of `group`; the object hashes of `previous` (the summary before) are taken
    /// over for the objects that did not change, rather than read again.
    pub fn of(group: &ResourceGroup, previous: Option<&Summary>) -> Summary {
        let known: HashMap<*const Object, u64> = previous
            .map(|p| {
                p.resources
                    .iter()
                    .map(|k| (k.object.as_ptr(), k.text))
                    .collect()
            })
            .unwrap_or_default();
        let mut summary = Summary {
            uids: String::with_capacity(group.resources.iter().map(|r| r.uid.len()).sum()),
            ends: Vec::with_capacity(group.resources.len()),
            resources: Vec::with_capacity(group.resources.len()),
            edges: group.edges.clone(),
            health: group.health.clone(),
            warnings: group.warnings.clone(),
            errors: group.errors.clone(),
        };
        for r in &group.resources {
            summary.uids.push_str(&r.uid);
            summary.ends.push(summary.uids.len() as u32);
            let text = known
                .get(&Arc::as_ptr(&r.object))
                .copied()
                .unwrap_or_else(|| object_hash(&r.object));
            summary.resources.push(Kept {
                object: Arc::downgrade(&r.object),
                text,
                rest: rest_hash(r),
            });
        }
        summary
    }

    fn uid(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.uids[start..self.ends[i] as usize]
    }

    /// Whether `r` is what the `i`-th resource was.
    fn same(&self, i: usize, r: &Resource) -> bool {
        let kept = &self.resources[i];
        kept.rest == rest_hash(r)
            && (std::ptr::eq(kept.object.as_ptr(), Arc::as_ptr(&r.object))
                || kept.text == object_hash(&r.object))
    }

    /// What turns the group summed up into `after` ([`diff`]).
    pub fn diff(&self, after: &ResourceGroup) -> GroupDelta {
        let old: HashMap<&str, usize> = (0..self.ends.len()).map(|i| (self.uid(i), i)).collect();
        let new: HashSet<&str> = after.resources.iter().map(|r| r.uid.as_str()).collect();
        let upserted = after
            .resources
            .iter()
            .filter(|r| !old.get(r.uid.as_str()).is_some_and(|&i| self.same(i, r)))
            .cloned()
            .collect();
        let removed = (0..self.ends.len())
            .map(|i| self.uid(i))
            .filter(|uid| !new.contains(uid))
            .map(str::to_owned)
            .collect();
        let old_edges: Vec<UidEdge> = self
            .edges
            .iter()
            .map(|e| UidEdge {
                from: self.uid(e.from as usize).to_owned(),
                to: self.uid(e.to as usize).to_owned(),
                kind: e.kind,
            })
            .collect();
        let new_edges = uid_edges(after);
        let old_set: HashSet<&UidEdge> = old_edges.iter().collect();
        let new_set: HashSet<&UidEdge> = new_edges.iter().collect();
        let edges_added = new_edges
            .iter()
            .filter(|e| !old_set.contains(e))
            .cloned()
            .collect();
        let edges_removed = old_edges
            .iter()
            .filter(|e| !new_set.contains(e))
            .cloned()
            .collect();
        GroupDelta {
            complete: false,
            health: after.health.clone(),
            upserted,
            removed,
            edges_added,
            edges_removed,
            warnings: after.warnings.clone(),
            errors: after.errors.clone(),
        }
    }

    /// Whether `delta` (from [`Summary::diff`]) tells a reader anything.
    pub fn changed(&self, delta: &GroupDelta) -> bool {
        !delta.is_empty()
            || self.health != delta.health
            || self.warnings != delta.warnings
            || self.errors != delta.errors
    }
}

/// A reader's view of the group: what a client keeps, built from the messages.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct View {
    pub health: Option<Health>,
    /// By uid.
    pub resources: HashMap<String, Resource>,
    pub edges: HashSet<UidEdge>,
    pub warnings: Vec<String>,
    pub errors: Vec<ListError>,
}

impl View {
    /// The view of a whole group, as a fresh answer gives it.
    pub fn of(group: &ResourceGroup) -> Self {
        let mut view = View::default();
        apply(&mut view, &GroupDelta::complete(group));
        view
    }
}

/// Applies one message to a reader's view, as a client would.
pub fn apply(view: &mut View, delta: &GroupDelta) {
    if delta.complete {
        view.resources.clear();
        view.edges.clear();
    }
    for uid in &delta.removed {
        view.resources.remove(uid);
    }
    for r in &delta.upserted {
        view.resources.insert(r.uid.clone(), r.clone());
    }
    for e in &delta.edges_removed {
        view.edges.remove(e);
    }
    view.edges.extend(delta.edges_added.iter().cloned());
    view.health = Some(delta.health.clone());
    view.warnings = delta.warnings.clone();
    view.errors = delta.errors.clone();
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use serde_json::json;

    use super::*;
    use crate::resources::listing::Listing;
    use crate::resources::object::Object;

    fn object(value: serde_json::Value) -> Object {
        let kind = value["kind"].as_str().unwrap().to_owned();
        let api_version = value["apiVersion"].as_str().unwrap().to_owned();
        Object::parse_text(value.to_string().into(), &api_version, &kind).unwrap()
    }

    fn labels() -> serde_json::Value {
        json!({"app.gitlab.com/project_id": "1", "app.gitlab.com/environment_slug": "prod", "app": "web"})
    }

    fn deployment() -> Object {
        object(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "uid": "dep", "labels": labels()},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"replicas": 1, "updatedReplicas": 1, "availableReplicas": 1, "readyReplicas": 1}}))
    }

    fn pod(name: &str, phase: &str) -> Object {
        object(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "labels": labels(),
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "dep"}]},
            "spec": {"containers": [{"name": "c"}]}, "status": {"phase": phase}}))
    }

    fn service() -> Object {
        object(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "ns", "uid": "svc", "labels": labels()},
            "spec": {"selector": {"app": "web"}}}))
    }

    fn group(objects: Vec<Object>, errors: Vec<ListError>) -> ResourceGroup {
        crate::resources::group::assemble(
            Listing {
                namespace: "ns".into(),
                label_selector: "a=b".into(),
                selected: objects.into_iter().map(std::sync::Arc::new).collect(),
                errors,
                ..Listing::default()
            },
            &Default::default(),
        )
    }

    #[test]
    fn a_changed_pod_is_the_only_resource_sent() {
        let before = group(
            vec![
                deployment(),
                service(),
                pod("a", "Running"),
                pod("b", "Running"),
            ],
            vec![],
        );
        let after = group(
            vec![
                deployment(),
                service(),
                pod("a", "Running"),
                pod("b", "Failed"),
            ],
            vec![],
        );
        let delta = diff(&before, &after);
        let uids: Vec<&str> = delta.upserted.iter().map(|r| r.uid.as_str()).collect();
        assert_eq!(uids, ["uid-b"]);
        assert!(delta.removed.is_empty());
        assert!(delta.edges_added.is_empty() && delta.edges_removed.is_empty());
        assert_eq!(delta.health, after.health);
        assert_ne!(before.health, after.health, "the rollup went degraded");
        assert!(changed(&before, &delta));
    }

    #[test]
    fn a_removed_pod_takes_its_edges_along() {
        let before = group(
            vec![
                deployment(),
                service(),
                pod("a", "Running"),
                pod("b", "Running"),
            ],
            vec![],
        );
        let after = group(vec![deployment(), service(), pod("a", "Running")], vec![]);
        let delta = diff(&before, &after);
        assert_eq!(delta.removed, ["uid-b"]);
        assert!(delta.upserted.is_empty());
        assert!(!delta.edges_removed.is_empty());
        assert!(delta.edges_removed.iter().all(|e| e.to == "uid-b"));
        assert!(delta.edges_added.is_empty());
    }

    #[test]
    fn the_same_group_is_no_message_but_a_new_error_is() {
        let g = group(vec![deployment(), pod("a", "Running")], vec![]);
        let delta = diff(&g, &g.clone());
        assert!(delta.is_empty());
        assert!(!changed(&g, &delta));
        let refused = ListError {
            api_version: "v1".into(),
            kind: "Secret".into(),
            code: Some(403),
            message: "forbidden".into(),
        };
        let after = group(
            vec![deployment(), pod("a", "Running")],
            vec![refused.clone()],
        );
        let delta = diff(&g, &after);
        assert!(delta.is_empty(), "no resource changed");
        assert!(changed(&g, &delta), "but the errors did");
        assert_eq!(delta.errors, [refused]);
    }

    #[test]
    fn the_complete_message_is_the_whole_group() {
        let g = group(vec![deployment(), service(), pod("a", "Running")], vec![]);
        let first = GroupDelta::complete(&g);
        assert!(first.complete && !first.is_empty());
        assert_eq!(first.upserted, g.resources);
        assert_eq!(first.edges_added.len(), g.edges.len());
        // A complete message replaces whatever the reader had.
        let mut view = View::of(&group(vec![pod("z", "Failed")], vec![]));
        apply(&mut view, &first);
        assert_eq!(view, View::of(&g));
    }

    /// The property: from any group to any other, the first message and the diffs applied in
    /// order give the view of the last group.
    #[test]
    fn applying_every_diff_to_the_first_message_gives_the_last_group() {
        for seed in 0..50u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let random_group = |rng: &mut rand::rngs::StdRng| {
                let mut objects = Vec::new();
                if rng.random_bool(0.7) {
                    objects.push(deployment());
                }
                if rng.random_bool(0.5) {
                    objects.push(service());
                }
                for name in ["a", "b", "c", "d"] {
                    if rng.random_bool(0.6) {
                        let phase = ["Running", "Pending", "Failed"][rng.random_range(0..3)];
                        objects.push(pod(name, phase));
                    }
                }
                let errors = if rng.random_bool(0.2) {
                    vec![ListError {
                        api_version: "v1".into(),
                        kind: "Secret".into(),
                        code: Some(403),
                        message: "forbidden".into(),
                    }]
                } else {
                    vec![]
                };
                group(objects, errors)
            };
            let mut previous = random_group(&mut rng);
            let mut view = View::default();
            apply(&mut view, &GroupDelta::complete(&previous));
            for _ in 0..20 {
                let next = random_group(&mut rng);
                let delta = diff(&previous, &next);
                if changed(&previous, &delta) {
                    apply(&mut view, &delta);
                }
                assert_eq!(view, View::of(&next), "seed {seed}");
                previous = next;
            }
        }
    }
}
