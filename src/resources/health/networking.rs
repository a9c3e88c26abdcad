//! Service and Ingress (gitops-engine health_service.go, health_ingress.go).
//! Argo gives these no message; ours say what is awaited, or which address was assigned.

use super::fields::*;
use super::Health;
use super::HealthStatus::*;

/// them) and the IPs or hostnames among them, for display. An entry may carry neither, e.g.
/// only `ports` or `ipMode`.
pub(super) fn load_balancer_addresses<'a>(obj: &Obj<'a>) -> (usize, Vec<&'a str>) {
    let entries = list_at(obj, &["status", "loadBalancer", "ingress"]);
    let addresses = entries
        .iter()
        .filter_map(|i| str_at(i, &["ip"]).or_else(|| str_at(i, &["hostname"])))
        .filter(|a| !a.is_empty())
        .collect();
    (entries.len(), addresses)
}

/// Healthy once the load balancer has at least one entry, naming its addresses if it has any.
pub(super) fn assigned(obj: &Obj, waiting: &str, label: &str) -> Health {
    match load_balancer_addresses(obj) {
        (0, _) => Health::new(Progressing, waiting),
        (_, addresses) if addresses.is_empty() => Health::new(Healthy, ""),
        (_, addresses) => Health::new(Healthy, format!("{label}: {}", addresses.join(", "))),
    }
}

pub(super) fn service(obj: &Obj) -> Health {
    if str_at(obj, &["spec", "type"]) != Some("LoadBalancer") {
        return Health::new(Healthy, "");
    }
    assigned(
        obj,
        "Waiting for the load balancer to be assigned an address",
        "Load balancer address",
    )
}

pub(super) fn ingress(obj: &Obj) -> Health {
    assigned(
        obj,
        "Waiting for the ingress controller to assign an address",
        "Ingress address",
    )
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::super::testing::*;

    use super::super::HealthStatus::*;

    // --- Service, Ingress, PVC -------------------------------------------------------------

    #[test]
    fn service_rules() {
        check(
            &obj("v1", "Service", json!({"type": "ClusterIP"}), json!({})),
            Healthy,
            None,
        );
        let pending = obj(
            "v1",
            "Service",
            json!({"type": "LoadBalancer"}),
            json!({"loadBalancer": {}}),
        );
        check(
            &pending,
            Progressing,
            Some("Waiting for the load balancer to be assigned an address"),
        );
        let assigned = obj(
            "v1",
            "Service",
            json!({"type": "LoadBalancer"}),
            json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}, {"hostname": "lb.example.com"}]}}),
        );
        check(
            &assigned,
            Healthy,
            Some("Load balancer address: 203.0.113.7, lb.example.com"),
        );
    }

    #[test]
    fn ingress_rules() {
        for api in ["networking.k8s.io/v1", "extensions/v1beta1"] {
            let pending = obj(api, "Ingress", json!({}), json!({"loadBalancer": {}}));
            check(
                &pending,
                Progressing,
                Some("Waiting for the ingress controller to assign an address"),
            );
            let assigned = obj(
                api,
                "Ingress",
                json!({}),
                json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.5"}]}}),
            );
            check(&assigned, Healthy, Some("Ingress address: 10.0.0.5"));
        }
    }

    /// The rules and edge cases not pinned above.
    pub(in crate::resources::health) fn fixtures() -> Vec<Fixture> {
        vec![
            // Service and Ingress
            (
                "node port service",
                obj("v1", "Service", json!({"type": "NodePort"}), json!({})),
                Healthy,
                None,
            ),
            (
                "service without type",
                obj("v1", "Service", json!({}), json!({})),
                Healthy,
                None,
            ),
            (
                "load balancer with an empty ingress list",
                obj(
                    "v1",
                    "Service",
                    json!({"type": "LoadBalancer"}),
                    json!({"loadBalancer": {"ingress": []}}),
                ),
                Progressing,
                Some("Waiting for the load balancer to be assigned an address"),
            ),
            (
                "load balancer without status",
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"type": "LoadBalancer"}}),
                Progressing,
                Some("Waiting for the load balancer to be assigned an address"),
            ),
            (
                "load balancer entry without ip or hostname is an assignment, with nothing to name",
                obj(
                    "v1",
                    "Service",
                    json!({"type": "LoadBalancer"}),
                    json!({"loadBalancer": {"ingress": [{"ports": [{"port": 80}]}]}}),
                ),
                Healthy,
                None,
            ),
            (
                "ingress without status",
                json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web"}}),
                Progressing,
                Some("Waiting for the ingress controller to assign an address"),
            ),
            (
                "ingress with a hostname",
                obj(
                    "networking.k8s.io/v1",
                    "Ingress",
                    json!({}),
                    json!({"loadBalancer": {"ingress": [{"hostname": "lb.example.com"}, {"ip": ""}]}}),
                ),
                Healthy,
                Some("Ingress address: lb.example.com"),
            ),
        ]
    }

    #[test]
    fn every_remaining_branch() {
        check_fixtures(fixtures());
    }
}
