//! Which changed objects can reach a resource group: what a feed of the group
//! (`graphql::subscriptions::feeds`) tests each change of its namespace against before
//! assembling the group again. A namespace of 100 environments changes a hundred times as often
//! as one environment's group; each feed assembling its whole group for every change of the
//! namespace is what made a Pod's change reach the organization page late (BENCHMARKS.md, issue
//! 36).
//!
//! A group ([`super::group::assemble`]) is the objects its label selector selects, the objects
//! of the owned kinds whose ownership chain leads to them (and the Endpoints and
//! EndpointSlices of its Services), each with its Events. An object that changed can change
//! the group only if, before or after the change, it is one of them, its owner is, it is a
//! part of one of its Services, it is an Event about one of them, or the selector selects it.
//! "Before" needs no old copy of the object: an object the selector selected, or that belonged
//! through its owner, is in the group's uids. So a change passes [`Reach::reaches`] when the
//! object now is selected, is among the group's uids, is owned by one of them, names one of
//! its Services, or is about one of them. A change that passes none cannot move the group:
//! its membership only grows from the members' uids and Services and the selector, and the
//! members' content only changes with themselves and their Events.
//!
//! Uids and names are kept as 64-bit hashes, sorted: 8 bytes per resource beside the 10,000
//! groups a health keeper follows; a collision only costs an assembly.

use std::hash::{DefaultHasher, Hash, Hasher};

use super::graph::SERVICE_NAME_LABEL;
use super::group::ResourceGroup;
use super::object::Object;
use super::tree::Tree;

/// What a group's feed tests a change against: the group's uids and Services, its selector.
#[derive(Debug, Clone, Default)]
pub struct Reach {
    /// The selector's `key=value` terms; `None` when it has other terms, and then every change
    /// reaches the group.
    terms: Option<Terms>,
    uids: Box<[u64]>,
    /// The names of the group's core Services (one namespace per group).
    services: Box<[u64]>,
}

/// A selector's `key=value` terms as one text, `key\0value\0` each: one allocation, not two
/// strings a term and their vector (~250 B an environment beside 10,000 of them, SPEC 18).
#[derive(Debug, Clone, Default)]
struct Terms(Box<str>);

impl Terms {
    /// `None` when a term holds a NUL (no label does): such a selector's changes all reach.
    fn new(terms: &[(String, String)]) -> Option<Terms> {
        let mut text = String::new();
        for (key, value) in terms {
            if key.is_empty() || key.contains('\0') || value.contains('\0') {
                return None;
            }
            text.extend([key.as_str(), "\0", value.as_str(), "\0"]);
        }
        Some(Terms(text.into_boxed_str()))
    }

    fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        let mut parts = self.0.split('\0');
        std::iter::from_fn(move || {
            let key = parts.next().filter(|k| !k.is_empty())?;
            Some((key, parts.next()?))
        })
    }

    /// Whether `labels` hold every term.
    fn select(&self, labels: Option<&super::tree::Map>) -> bool {
        self.iter().all(|(key, value)| {
            labels.and_then(|l| l.get(key)).and_then(Tree::as_str) == Some(value)
        })
    }
}

fn hash(s: &str) -> u64 {
    let mut h = DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

fn sorted(mut hashes: Vec<u64>) -> Box<[u64]> {
    hashes.sort_unstable();
    hashes.dedup();
    hashes.into_boxed_slice()
}

fn meta<'a>(object: &'a Tree, name: &str) -> Option<&'a Tree> {
    object.get("metadata")?.get(name)
}

fn core(api_version: &str) -> bool {
    api_version.is_empty() || api_version == "v1"
}

impl Reach {
    /// The reach of `group`, as selected by `terms` (its selector's equality terms, `None` for
    /// another selector).
    pub fn of(group: &ResourceGroup, terms: Option<Vec<(String, String)>>) -> Reach {
        Reach {
            terms: terms.as_deref().and_then(Terms::new),
            uids: sorted(group.resources.iter().map(|r| hash(&r.uid)).collect()),
            services: sorted(
                group
                    .resources
                    .iter()
                    .filter(|r| r.kind == "Service" && core(&r.api_version))
                    .map(|r| hash(&r.name))
                    .collect(),
            ),
        }
    }

    fn member(&self, uid: &str) -> bool {
        self.uids.binary_search(&hash(uid)).is_ok()
    }

    /// Whether `object` (as it is after the change, or as it was last for a deletion) can move
    /// the group.
    pub fn reaches(&self, object: &Object) -> bool {
        let Some(terms) = &self.terms else {
            return true;
        };
        let view = &object.view;
        let kind = view.get("kind").and_then(Tree::as_str).unwrap_or("");
        let api_version = view.get("apiVersion").and_then(Tree::as_str).unwrap_or("");
        if kind == "Event" {
            return match about(object) {
                Some(uid) => self.member(&uid),
                // Not read: assembled again rather than missed.
                None => true,
            };
        }
        let Some(uid) = meta(view, "uid").and_then(Tree::as_str) else {
            return true;
        };
        if self.member(uid) {
            return true;
        }
        let labels = meta(view, "labels").and_then(Tree::as_object);
        if terms.select(labels) {
            return true;
        }
        let owned = meta(view, "ownerReferences")
            .and_then(Tree::as_array)
            .into_iter()
            .flatten()
            .filter_map(|o| o.get("uid").and_then(Tree::as_str))
            .any(|owner| self.member(owner));
        if owned {
            return true;
        }
        let service = match kind {
            "Endpoints" if core(api_version) => meta(view, "name").and_then(Tree::as_str),
            "EndpointSlice" => labels
                .and_then(|l| l.get(SERVICE_NAME_LABEL))
                .and_then(Tree::as_str),
            _ => None,
        };
        service.is_some_and(|name| self.services.binary_search(&hash(name)).is_ok())
    }
}

/// The uid of what an Event is about (`involvedObject`, or `regarding` as `events.k8s.io`
/// names it), read from its text: the kept fields of an Event do not hold it.
fn about(event: &Object) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Event {
        #[serde(alias = "regarding", rename = "involvedObject")]
        involved_object: Option<Involved>,
    }
    #[derive(serde::Deserialize)]
    struct Involved {
        uid: Option<String>,
    }
    let event: Event = serde_json::from_str(&event.text()).ok()?;
    event.involved_object?.uid
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{json, Value};

    use super::*;
    use crate::resources::listing::Listing;

    const SELECTOR: &str = "app.gitlab.com/env=prod";

    fn object(value: Value) -> Object {
        let kind = value["kind"].as_str().unwrap().to_owned();
        let api_version = value["apiVersion"].as_str().unwrap().to_owned();
        Object::parse_text(value.to_string().into(), &api_version, &kind).unwrap()
    }

    fn labelled(env: &str) -> Value {
        json!({"app.gitlab.com/env": env, "app": "web"})
    }

    fn deployment(uid: &str, env: &str) -> Object {
        object(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": uid, "namespace": "ns", "uid": uid, "labels": labelled(env)}}))
    }

    fn pod(uid: &str, owner: Option<&str>) -> Object {
        let mut metadata =
            json!({"name": uid, "namespace": "ns", "uid": uid, "labels": {"app": "web"}});
        if let Some(owner) = owner {
            metadata["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": owner}]);
        }
        object(json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata}))
    }

    fn reach() -> Reach {
        let service = object(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "ns", "uid": "svc", "labels": labelled("prod")}}));
        let group = crate::resources::group::assemble(
            Listing {
                namespace: "ns".into(),
                label_selector: SELECTOR.into(),
                selected: vec![Arc::new(deployment("dep", "prod")), Arc::new(service)],
                owned: vec![Arc::new(pod("pod-1", Some("dep")))],
                ..Listing::default()
            },
            &Default::default(),
        );
        Reach::of(&group, crate::k8s::fetch::equality_terms(SELECTOR))
    }

    #[test]
    fn the_terms_select_labels_holding_each_of_them() {
        let terms = Terms::new(&crate::k8s::fetch::equality_terms("a=1,b=").unwrap()).unwrap();
        assert_eq!(terms.iter().collect::<Vec<_>>(), [("a", "1"), ("b", "")]);
        let labels = |labels: Value| crate::resources::tree::TreeBuf::from(&labels);
        assert!(terms.select(labels(json!({"a": "1", "b": "", "c": "3"})).as_object()));
        assert!(!terms.select(labels(json!({"a": "1"})).as_object()));
        assert!(!terms.select(labels(json!({"a": "2", "b": ""})).as_object()));
        assert!(!terms.select(None));
        let none = Terms::new(&[]).unwrap();
        assert!(none.select(None));
        assert!(Terms::new(&[("a".into(), "x\0y".into())]).is_none());
    }

    #[test]
    fn a_change_elsewhere_in_the_namespace_does_not_reach_the_group() {
        let reach = reach();
        assert!(!reach.reaches(&deployment("other", "staging")));
        assert!(!reach.reaches(&pod("pod-9", Some("other-rs"))));
        assert!(!reach.reaches(&pod("pod-8", None)));
        let endpoints = object(json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "db", "namespace": "ns", "uid": "ep-db"}}));
        assert!(!reach.reaches(&endpoints));
        let event = object(json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "ns", "uid": "ev"},
            "involvedObject": {"uid": "pod-9"}}));
        assert!(!reach.reaches(&event));
    }

    #[test]
    fn what_moves_into_out_of_or_within_the_group_reaches_it() {
        let reach = reach();
        // Labelled into the group, and out of it (a member's uid).
        assert!(reach.reaches(&deployment("new", "prod")));
        assert!(reach.reaches(&deployment("dep", "staging")));
        // A member changed or deleted.
        assert!(reach.reaches(&pod("pod-1", Some("dep"))));
        // Given an owner in the group.
        assert!(reach.reaches(&pod("pod-2", Some("dep"))));
        // A part of its Service.
        let endpoints = object(json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "web", "namespace": "ns", "uid": "ep-web"}}));
        assert!(reach.reaches(&endpoints));
        let slice = object(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-x", "namespace": "ns", "uid": "es",
                         "labels": {"kubernetes.io/service-name": "web"}}}),
        );
        assert!(reach.reaches(&slice));
        // An Event about a member, either API's way.
        for field in ["involvedObject", "regarding"] {
            let event = object(json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "e", "namespace": "ns", "uid": "ev"},
                field: {"uid": "pod-1"}}));
            assert!(reach.reaches(&event), "{field}");
        }
    }

    #[test]
    fn a_selector_it_cannot_test_reaches_every_change() {
        let mut reach = reach();
        reach.terms = None;
        assert!(reach.reaches(&deployment("other", "staging")));
    }
}
