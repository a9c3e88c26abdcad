//! What the graph's tests share: objects built as JSON, and the graph's answers by uid.

use serde_json::{json, Value};

use super::endpoints::SERVICE_NAME_LABEL;
use super::{Edge, EdgeType, Nodes};
use crate::resources::tree::TreeBuf;

/// The objects as the resource group keeps them ([`crate::resources::object`]).
pub(super) fn kept(objects: &[Value]) -> Vec<TreeBuf> {
    let parse = |o: &Value| crate::resources::object::parse(&o.to_string()).expect("parse");
    objects.iter().map(parse).collect()
}

pub(super) fn trees(objects: &[Value]) -> Vec<TreeBuf> {
    objects.iter().map(TreeBuf::from).collect()
}

/// An edge with the uids it links, as a reader sees it.
#[derive(Debug, PartialEq)]
pub(super) struct Named {
    pub(super) from: String,
    pub(super) to: String,
    pub(super) kind: EdgeType,
}

pub(super) fn named(objects: &[TreeBuf], edges: &[Edge]) -> Vec<Named> {
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
pub(super) fn edges(objects: &[Value]) -> Vec<Named> {
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
pub(super) fn owned_closure(selected: &[Value], candidates: &[Value]) -> Vec<usize> {
    let whole = super::owned_closure(&trees(selected), &trees(candidates));
    let kept_closure = super::owned_closure(&kept(selected), &kept(candidates));
    assert_eq!(kept_closure, whole, "closure of the kept fields");
    whole
}

pub(super) fn object(api: &str, kind: &str, ns: &str, name: &str, uid: &str) -> Value {
    json!({"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": ns, "uid": uid}})
}

/// Adds a controller owner reference to `owner`.
pub(super) fn owned(mut child: Value, owner: &Value) -> Value {
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

pub(super) fn with_labels(mut obj: Value, labels: Value) -> Value {
    obj["metadata"]["labels"] = labels;
    obj
}

pub(super) fn workload(
    api: &str,
    kind: &str,
    ns: &str,
    name: &str,
    uid: &str,
    labels: Value,
) -> Value {
    let mut obj = object(api, kind, ns, name, uid);
    obj["spec"] =
        json!({"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}}});
    obj
}

pub(super) fn deployment(ns: &str, name: &str, uid: &str, labels: Value) -> Value {
    workload("apps/v1", "Deployment", ns, name, uid, labels)
}

pub(super) fn replicaset(owner: &Value, name: &str, uid: &str, labels: Value) -> Value {
    let ns = owner["metadata"]["namespace"].as_str().unwrap_or("");
    owned(
        workload("apps/v1", "ReplicaSet", ns, name, uid, labels),
        owner,
    )
}

pub(super) fn pod(ns: &str, name: &str, uid: &str, labels: Value) -> Value {
    with_labels(object("v1", "Pod", ns, name, uid), labels)
}

pub(super) fn service(ns: &str, name: &str, uid: &str, selector: Value) -> Value {
    let mut svc = object("v1", "Service", ns, name, uid);
    svc["spec"] = json!({"selector": selector});
    svc
}

pub(super) fn slice(ns: &str, name: &str, uid: &str, service: &str) -> Value {
    with_labels(
        object("discovery.k8s.io/v1", "EndpointSlice", ns, name, uid),
        json!({ SERVICE_NAME_LABEL: service }),
    )
}

pub(super) fn triples(edges: &[Named]) -> Vec<(&str, &str, EdgeType)> {
    edges
        .iter()
        .map(|e| (e.from.as_str(), e.to.as_str(), e.kind))
        .collect()
}

/// Deployment d1 -> ReplicaSet rs1 -> Pods p1, p2 in namespace "web", all labelled app=api.
pub(super) fn api_chain() -> (Value, Value, Value, Value) {
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
