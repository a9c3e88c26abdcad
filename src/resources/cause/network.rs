//! Services and Ingresses, whose health (an address assigned) says nothing of whether traffic
//! reaches anything: a Service none of whose endpoints is ready, as the EndpointSlice controller
//! lists them, and an Ingress whose backend names a Service that is not there.

use super::{Finding, Look};
use crate::resources::graph::EdgeType;
use crate::resources::health::fields::{list_at, str_at};
use crate::resources::tree::Tree;

/// A Service with a selector whose EndpointSlices (or Endpoints) list no ready endpoint. A
/// Service whose slices are not in the group at all is not judged: that is not knowing, not
/// knowing there are none.
pub(super) fn service(look: &Look) -> Option<Finding> {
    let object = &look.resource.object.view;
    let selects = object
        .get("spec")
        .and_then(|s| s.get("selector"))
        .and_then(Tree::as_object)
        .is_some_and(|s| !s.is_empty());
    if !selects || str_at(object, &["spec", "type"]) == Some("ExternalName") {
        return None;
    }
    let mut lists = None;
    for (child, _) in look.children() {
        let view = &child.object.view;
        let (listed, ready) = match child.kind.as_str() {
            "EndpointSlice" => {
                let endpoints = list_at(view, &["endpoints"]);
                // A nil `ready` reads as true (discovery.k8s.io/v1 EndpointConditions).
                let ready = endpoints
                    .iter()
                    .filter(|e| {
                        e.get("conditions")
                            .and_then(|c| c.get("ready"))
                            .and_then(Tree::as_bool)
                            != Some(false)
                    })
                    .count();
                (endpoints.len(), ready)
            }
            "Endpoints" => {
                let ready: usize = list_at(view, &["subsets"])
                    .iter()
                    .map(|s| list_at(s, &["addresses"]).len())
                    .sum();
                (ready, ready)
            }
            _ => continue,
        };
        if ready > 0 {
            return None;
        }
        let (slices, endpoints) = lists.unwrap_or((0, 0));
        lists = Some((slices + 1, endpoints + listed));
    }
    let (_, endpoints) = lists?;
    let message = if endpoints == 0 {
        "no endpoints: no Pod matches the selector, or none has an address yet".to_owned()
    } else {
        format!("0 of {endpoints} endpoints ready")
    };
    Some(Finding::new(
        "NoReadyEndpoints",
        &message,
        "has no ready endpoints".to_owned(),
    ))
}

/// An Ingress whose backend names a Service that is not among the resources (the group holds
/// what the environment deployed: a Service it routes to and did not deploy is missing from it).
pub(super) fn ingress(look: &Look) -> Option<Finding> {
    let spec: &Tree = look.resource.object.view.get("spec")?;
    let paths = list_at(spec, &["rules"])
        .iter()
        .flat_map(|rule| list_at(rule, &["http", "paths"]))
        .filter_map(|path| path.get("backend"));
    let named = [spec.get("defaultBackend"), spec.get("backend")]
        .into_iter()
        .flatten()
        .chain(paths)
        .filter_map(backend_service);
    let present = |name: &str| {
        look.children()
            .any(|(child, kind)| kind == EdgeType::IngressBackend && child.name == name)
    };
    let missing = named.into_iter().find(|name| !present(name))?;
    Some(Finding::new(
        "ServiceNotFound",
        &format!("Service \"{missing}\" is not among the environment's resources"),
        format!("routes to a missing Service {missing}"),
    ))
}

/// The Service a backend names: `service.name` (v1), or `serviceName` (the old v1beta1 form).
fn backend_service(backend: &Tree) -> Option<&str> {
    str_at(backend, &["service", "name"])
        .or_else(|| str_at(backend, &["serviceName"]))
        .filter(|name| !name.is_empty())
}
