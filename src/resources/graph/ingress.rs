//! Ingress -> Service, for every backend the Ingress routes to (same namespace).

use super::hashing::Chains;
use super::nodes::{array_at, str_at};
use super::{EdgeType, Nodes, NsName, RawEdge};
use crate::resources::tree::Tree;

/// Service names an Ingress routes to: `networking.k8s.io/v1` (`backend.service.name`, `spec.defaultBackend`)
/// and the older `extensions/v1beta1` / `networking.k8s.io/v1beta1` form (`backend.serviceName`,
/// `spec.backend`).
pub(super) fn ingress_backends(spec: &Tree) -> impl Iterator<Item = &str> {
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

impl Nodes {
    /// Ingress -> Service, from the backends [`ingress_backends`] found, to `services`.
    pub(super) fn backend_edges(&self, services: &Chains<NsName>, raw: &mut Vec<RawEdge>) {
        let kind = EdgeType::IngressBackend;
        for (ingress, service) in self.resolve_names(kind, services) {
            self.link(raw, ingress, service, kind);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::EdgeType;
    use serde_json::json;

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
}
