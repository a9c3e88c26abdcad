//! A group across namespaces (SPEC 15): an environment whose Maintainers added namespaces to it
//! (blue/green in two namespaces) has the labels source applied in each, and one group of them
//! all. Each namespace's group comes assembled from the watch cache (edges never cross a
//! namespace: owners, selectors and references are namespaced); this merges them, pure.

use std::sync::Arc;

use super::graph::Edge;
use super::group::{ResourceGroup, NO_RESOURCES_WARNING};
use super::health;

/// The namespaces an environment's labels source spans: its deployment's first, then those
/// added to it, each once.
pub fn spanned(first: &str, added: &[String]) -> Vec<String> {
    let mut namespaces = vec![first.to_owned()];
    for namespace in added {
        if !namespaces.contains(namespace) {
            namespaces.push(namespace.clone());
        }
    }
    namespaces
}

/// The groups of several namespaces as one: the first's namespace and selector, resources in
/// the group's order (apiVersion, kind, namespace, name, uid) with their edges, the worst
/// health over them all, each warning and error once. One group is given back as it is.
pub fn merge(mut groups: Vec<Arc<ResourceGroup>>) -> Arc<ResourceGroup> {
    if groups.len() == 1 {
        return groups.remove(0);
    }
    let Some(first) = groups.first() else {
        return Arc::new(ResourceGroup::unreadable(
            "",
            "",
            500,
            "no namespace".into(),
        ));
    };
    let (namespace, label_selector) = (first.namespace.clone(), first.label_selector.clone());
    // (group, index in it), in the order shown.
    let mut order: Vec<(usize, usize)> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, group)| (0..group.resources.len()).map(move |i| (g, i)))
        .collect();
    let key = |&(g, i): &(usize, usize)| {
        let r = &groups[g].resources[i];
        (
            r.api_version.as_str(),
            r.kind.as_str(),
            r.namespace.as_deref().unwrap_or(""),
            r.name.as_str(),
            r.uid.as_str(),
        )
    };
    order.sort_by(|a, b| key(a).cmp(&key(b)));
    let mut position: Vec<Vec<u32>> = groups.iter().map(|g| vec![0; g.resources.len()]).collect();
    for (shown, &(g, i)) in order.iter().enumerate() {
        position[g][i] = shown as u32;
    }
    let resources: Vec<_> = order
        .iter()
        .map(|&(g, i)| groups[g].resources[i].clone())
        .collect();
    let mut edges: Vec<Edge> = groups
        .iter()
        .enumerate()
        .flat_map(|(g, group)| {
            let position = &position[g];
            group.edges.iter().map(move |e| Edge {
                from: position[e.from as usize],
                to: position[e.to as usize],
                kind: e.kind,
            })
        })
        .collect();
    edges.sort_by_key(|e| (e.from, e.to));
    let health = health::aggregate(resources.iter().map(|r| r.health.as_ref()), |i| {
        let r = &resources[i];
        (r.kind.as_str(), r.namespace.as_deref(), r.name.as_str())
    });
    let mut warnings: Vec<String> = Vec::new();
    let mut errors = Vec::new();
    for group in &groups {
        for warning in &group.warnings {
            if warning != NO_RESOURCES_WARNING && !warnings.contains(warning) {
                warnings.push(warning.clone());
            }
        }
        for error in &group.errors {
            if !errors.contains(error) {
                errors.push(error.clone());
            }
        }
    }
    if resources.is_empty() {
        warnings.insert(0, NO_RESOURCES_WARNING.to_owned());
    }
    Arc::new(ResourceGroup {
        namespace,
        label_selector,
        health,
        resources,
        edges,
        warnings,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::graph::EdgeType;
    use crate::resources::health::{Health, HealthStatus};
    use crate::resources::object::Object;
    use serde_json::{json, Value};

    fn resource(
        kind: &str,
        namespace: &str,
        name: &str,
        status: HealthStatus,
    ) -> super::super::group::Resource {
        let object = json!({"apiVersion": "v1", "kind": kind,
            "metadata": {"namespace": namespace, "name": name, "uid": format!("{namespace}-{name}")}});
        super::super::group::Resource {
            uid: format!("{namespace}-{name}"),
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: Some(namespace.into()),
            name: name.into(),
            labels: Value::Object(Default::default()),
            created_at: None,
            health: Some(Health {
                status,
                message: None,
            }),
            object: Arc::new(Object::parse_text(object.to_string().into(), "v1", kind).unwrap()),
            events: Vec::new(),
        }
    }

    fn group(
        namespace: &str,
        resources: Vec<super::super::group::Resource>,
        edges: Vec<Edge>,
    ) -> Arc<ResourceGroup> {
        let mut group = ResourceGroup::unreadable(namespace, "app=web", 0, String::new());
        group.errors.clear();
        group.health = Health {
            status: HealthStatus::Healthy,
            message: None,
        };
        if resources.is_empty() {
            group.warnings.push(NO_RESOURCES_WARNING.into());
        }
        group.resources = resources;
        group.edges = edges;
        Arc::new(group)
    }

    #[test]
    fn namespaces_spanned_once_the_deployments_first() {
        let added = ["green".to_owned(), "blue".to_owned(), "green".to_owned()];
        assert_eq!(spanned("blue", &added), ["blue", "green"]);
        assert_eq!(spanned("blue", &[]), ["blue"]);
    }

    #[test]
    fn groups_of_two_namespaces_merge_in_order_with_their_edges() {
        let blue = group(
            "blue",
            vec![
                resource("Pod", "blue", "web-a", HealthStatus::Healthy),
                resource("Service", "blue", "web", HealthStatus::Healthy),
            ],
            vec![Edge {
                from: 1,
                to: 0,
                kind: EdgeType::ServiceSelector,
            }],
        );
        let green = group(
            "green",
            vec![
                resource("Pod", "green", "web-b", HealthStatus::Degraded),
                resource("Service", "green", "web", HealthStatus::Healthy),
            ],
            vec![Edge {
                from: 1,
                to: 0,
                kind: EdgeType::ServiceSelector,
            }],
        );
        let merged = merge(vec![blue, green]);
        let shown: Vec<String> = merged
            .resources
            .iter()
            .map(|r| format!("{} {}/{}", r.kind, r.namespace.as_deref().unwrap(), r.name))
            .collect();
        assert_eq!(
            shown,
            [
                "Pod blue/web-a",
                "Pod green/web-b",
                "Service blue/web",
                "Service green/web"
            ]
        );
        assert_eq!(
            merged
                .edges
                .iter()
                .map(|e| (e.from, e.to))
                .collect::<Vec<_>>(),
            [(2, 0), (3, 1)]
        );
        assert_eq!(merged.health.status, HealthStatus::Degraded);
        assert!(
            merged.health.message.as_deref().unwrap().contains("web-b"),
            "{:?}",
            merged.health
        );
        assert_eq!(merged.namespace, "blue");
        assert!(merged.warnings.is_empty());
    }

    #[test]
    fn an_empty_namespace_beside_a_full_one_is_no_empty_group() {
        let blue = group(
            "blue",
            vec![resource("Pod", "blue", "web-a", HealthStatus::Healthy)],
            vec![],
        );
        let green = group("green", vec![], vec![]);
        assert!(merge(vec![blue, green.clone()]).warnings.is_empty());
        let empty = merge(vec![green.clone(), green]);
        assert_eq!(empty.warnings, [NO_RESOURCES_WARNING]);
    }
}
