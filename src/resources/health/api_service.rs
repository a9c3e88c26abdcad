//! APIService (gitops-engine health_apiservice.go).

use super::fields::*;
use super::Health;
use super::HealthStatus::*;

/// Argo reports an unavailable APIService as Progressing, not Degraded: the aggregated server
/// behind it is often still starting.
pub(super) fn api_service(obj: &Obj) -> Health {
    let Some(available) = condition(obj, "Available") else {
        return Health::new(Progressing, "Waiting to be processed");
    };
    // Always "reason: message", as Argo writes it, even when either is empty.
    let reason = cond_reason(Some(available));
    let message = str_at(available, &["message"]).unwrap_or("");
    let text = format!("{reason}: {message}");
    let status = if cond_status_is(Some(available), "True") {
        Healthy
    } else {
        Progressing
    };
    Health::new(status, text)
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{json, Value};

    use super::super::testing::*;

    use super::super::HealthStatus::*;

    // --- APIService ------------------------------------------------------------------------

    #[test]
    fn apiservice_rules() {
        let svc = |conditions: Value| {
            obj(
                "apiregistration.k8s.io/v1",
                "APIService",
                json!({}),
                json!({"conditions": conditions}),
            )
        };
        check(
            &svc(
                json!([{"type": "Available", "status": "True", "reason": "Passed", "message": "all checks passed"}]),
            ),
            Healthy,
            Some("Passed: all checks passed"),
        );
        check(
            &svc(
                json!([{"type": "Available", "status": "False", "reason": "FailedDiscoveryCheck",
                         "message": "failing or missing response from https://10.0.0.1:443"}]),
            ),
            Progressing,
            Some("FailedDiscoveryCheck: failing or missing response from https://10.0.0.1:443"),
        );
        check(
            &svc(json!([])),
            Progressing,
            Some("Waiting to be processed"),
        );
    }

    /// The rules and edge cases not pinned above.
    pub(in crate::resources::health) fn fixtures() -> Vec<Fixture> {
        vec![
            // APIService
            (
                "apiservice available without reason or message",
                obj(
                    "apiregistration.k8s.io/v1",
                    "APIService",
                    json!({}),
                    json!({"conditions": [{"type": "Available", "status": "True"}]}),
                ),
                Healthy,
                Some(": "),
            ),
            (
                "apiservice with a message only",
                obj(
                    "apiregistration.k8s.io/v1beta1",
                    "APIService",
                    json!({}),
                    json!({"conditions": [{"type": "Available", "status": "False", "message": "no endpoints"}]}),
                ),
                Progressing,
                Some(": no endpoints"),
            ),
            (
                "apiservice with a reason only",
                obj(
                    "apiregistration.k8s.io/v1",
                    "APIService",
                    json!({}),
                    json!({"conditions": [{"type": "Available", "status": "False", "reason": "MissingEndpoints"}]}),
                ),
                Progressing,
                Some("MissingEndpoints: "),
            ),
            (
                "apiservice of another version",
                obj(
                    "apiregistration.k8s.io/v1beta2",
                    "APIService",
                    json!({}),
                    json!({}),
                ),
                Unknown,
                Some("unsupported APIService GVK: apiregistration.k8s.io/v1beta2, Kind=APIService"),
            ),
        ]
    }

    #[test]
    fn every_remaining_branch() {
        check_fixtures(fixtures());
    }
}
