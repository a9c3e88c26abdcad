//! A resource group between replicas (SPEC 16): what the owner of a connection answers another
//! replica, and that replica reads back into the very group the owner assembled, so that both
//! render the same bytes. Each object travels as the text the cluster sent (without
//! `managedFields`, as kept), and is parsed again on arrival as a list item is.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::resources::graph::{Edge, EdgeType};
use crate::resources::group::{Resource, ResourceGroup};
use crate::resources::health::Health;
use crate::resources::listing::{ListError, ResourceEvent};
use crate::resources::object::Object;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Group<R> {
    namespace: String,
    label_selector: String,
    health: Health,
    resources: Vec<R>,
    /// `[from, to, kind]` each.
    edges: Vec<(u32, u32, EdgeType)>,
    warnings: Vec<String>,
    errors: Vec<ListError>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireResource {
    uid: String,
    api_version: String,
    kind: String,
    namespace: Option<String>,
    name: String,
    labels: Value,
    created_at: Option<DateTime<Utc>>,
    health: Option<Health>,
    events: Vec<ResourceEvent>,
    /// The object as kept.
    object: Box<RawValue>,
}

/// The group as sent.
pub fn encode(group: &ResourceGroup) -> serde_json::Result<Vec<u8>> {
    let resources = group
        .resources
        .iter()
        .map(|r| {
            Ok(WireResource {
                uid: r.uid.clone(),
                api_version: r.api_version.clone(),
                kind: r.kind.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                labels: r.labels.clone(),
                created_at: r.created_at,
                health: r.health.clone(),
                events: r.events.clone(),
                object: RawValue::from_string(r.object.text().into_owned())?,
            })
        })
        .collect::<serde_json::Result<Vec<_>>>()?;
    serde_json::to_vec(&Group {
        namespace: group.namespace.clone(),
        label_selector: group.label_selector.clone(),
        health: group.health.clone(),
        resources,
        edges: group.edges.iter().map(|e| (e.from, e.to, e.kind)).collect(),
        warnings: group.warnings.clone(),
        errors: group.errors.clone(),
    })
}

/// The group as received; an error for anything that is not one (an edge that points past
/// the resources included).
pub fn decode(bytes: &[u8]) -> Result<ResourceGroup, String> {
    let group: Group<WireResource> = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let count = group.resources.len();
    let resources = group
        .resources
        .into_iter()
        .map(|r| {
            let object = Object::parse(&r.object, &r.api_version, &r.kind)
                .map_err(|e| format!("{} {}: {e}", r.kind, r.name))?;
            Ok(Resource {
                uid: r.uid,
                api_version: r.api_version,
                kind: r.kind,
                namespace: r.namespace,
                name: r.name,
                labels: r.labels,
                created_at: r.created_at,
                health: r.health,
                object: Arc::new(object),
                events: r.events,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let edges = group
        .edges
        .into_iter()
        .map(|(from, to, kind)| {
            let inside = |i: u32| (i as usize) < count;
            (inside(from) && inside(to))
                .then_some(Edge { from, to, kind })
                .ok_or_else(|| format!("an edge from {from} to {to} of {count} resources"))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(ResourceGroup {
        namespace: group.namespace,
        label_selector: group.label_selector,
        health: group.health,
        resources,
        edges,
        warnings: group.warnings,
        errors: group.errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::group::assemble;
    use crate::resources::listing::Listing;

    fn object(value: serde_json::Value) -> Arc<Object> {
        let text = value.to_string();
        let api_version = value["apiVersion"].as_str().unwrap().to_owned();
        let kind = value["kind"].as_str().unwrap().to_owned();
        Arc::new(Object::parse_text(text.into(), &api_version, &kind).unwrap())
    }

    #[test]
    fn a_group_reads_back_as_the_owner_assembled_it() {
        let deployment = serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "prod", "uid": "d1",
                         "creationTimestamp": "2026-11-20T10:00:00Z",
                         "labels": {"app": "web"},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"replicas": 1},
            "status": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1,
                       "observedGeneration": 1, "conditions": []}
        });
        let replica_set = serde_json::json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-1", "namespace": "prod", "uid": "r1",
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                              "name": "web", "uid": "d1", "controller": true}]},
            "spec": {"replicas": 1}, "status": {"replicas": 1, "readyReplicas": 1}
        });
        let group = assemble(
            Listing {
                namespace: "prod".into(),
                label_selector: "app=web".into(),
                selected: vec![object(deployment)],
                owned: vec![object(replica_set)],
                ..Listing::default()
            },
            &Default::default(),
        );
        assert!(!group.edges.is_empty(), "{group:?}");
        let bytes = encode(&group).unwrap();
        let back = decode(&bytes).unwrap();
        assert_eq!(back.resources.len(), group.resources.len());
        for (a, b) in back.resources.iter().zip(&group.resources) {
            assert_eq!(a.object.text(), b.object.text());
            assert_eq!(a.object.view, b.object.view);
        }
        assert_eq!(encode(&back).unwrap(), bytes);
        assert_eq!(back.edges, group.edges);
        assert_eq!(back.health, group.health);
    }

    #[test]
    fn what_is_not_a_group_is_refused() {
        assert!(decode(b"{}").is_err());
        assert!(decode(b"not json").is_err());
        let bad_edge =
            br#"{"namespace":"a","labelSelector":"","health":{"status":"Healthy","message":null},
            "resources":[],"edges":[[0,1,"Owner"]],"warnings":[],"errors":[]}"#;
        assert!(decode(bad_edge).unwrap_err().contains("edge"));
    }
}
