//! Argo Workflows' `Workflow` (`argoproj.io`, any version), whose health Argo CD builds in
//! (gitops-engine health_argo.go): its phase, and its own message.

use super::fields::*;
use super::Health;
use super::HealthStatus::*;

pub(super) fn workflow(obj: &Obj) -> Health {
    let message = str_at(obj, &["status", "message"]).unwrap_or("");
    let status = match str_at(obj, &["status", "phase"]).unwrap_or("") {
        "" | "Pending" | "Running" => Progressing,
        "Succeeded" => Healthy,
        "Failed" | "Error" => Degraded,
        _ => Unknown,
    };
    Health::new(status, message)
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::super::testing::*;
    use super::super::HealthStatus::*;

    fn workflow(status: serde_json::Value) -> serde_json::Value {
        obj(
            "argoproj.io/v1alpha1",
            "Workflow",
            json!({"entrypoint": "main"}),
            status,
        )
    }

    /// The rules and edge cases not pinned elsewhere (TestGetArgoWorkflowHealth's three cases
    /// run in tests/health_conformance.rs).
    pub(in crate::resources::health) fn fixtures() -> Vec<Fixture> {
        vec![
            ("no status", workflow(json!(null)), Progressing, None),
            (
                "pending",
                workflow(json!({"phase": "Pending"})),
                Progressing,
                None,
            ),
            (
                "failed",
                workflow(json!({"phase": "Failed", "message": "child failed"})),
                Degraded,
                Some("child failed"),
            ),
            (
                "error",
                workflow(json!({"phase": "Error", "message": "boom"})),
                Degraded,
                Some("boom"),
            ),
            (
                "succeeded",
                workflow(json!({"phase": "Succeeded"})),
                Healthy,
                None,
            ),
            (
                "an unknown phase",
                workflow(json!({"phase": "Skipped", "message": "?"})),
                Unknown,
                Some("?"),
            ),
        ]
    }

    #[test]
    fn every_phase() {
        check_fixtures(fixtures());
    }
}
