//! Service -> Endpoints (named as their Service) and Service -> EndpointSlice (label
//! `kubernetes.io/service-name`), same namespace.

use super::hashing::Chains;
use super::{EdgeType, Nodes, NsName, RawEdge};

/// Label the EndpointSlice controller puts on each slice to name its Service.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

impl Nodes {
    /// Service -> Endpoints and Service -> EndpointSlice, from the names the Endpoints and the
    /// slices carry ([`Nodes::push`]) to `services`.
    pub(super) fn service_part_edges(&self, services: &Chains<NsName>, raw: &mut Vec<RawEdge>) {
        for kind in [EdgeType::Endpoints, EdgeType::EndpointSlice] {
            for (part, service) in self.resolve_names(kind, services) {
                self.link(raw, service, part, kind);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::EdgeType;
    use serde_json::json;

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
}
