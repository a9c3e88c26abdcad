//! PersistentVolumeClaim (gitops-engine health_pvc.go).

use super::fields::*;
use super::Health;
use super::HealthStatus::*;

pub(super) fn pvc(obj: &Obj) -> Health {
    match str_at(obj, &["status", "phase"]) {
        Some("Bound") => Health::new(Healthy, ""),
        Some("Pending") => {
            Health::new(Progressing, "Waiting for the claim to be bound to a volume")
        }
        Some("Lost") => Health::new(Degraded, "The claim's bound volume no longer exists"),
        Some(phase) => Health::new(Unknown, format!("Unknown claim phase \"{phase}\"")),
        None => Health::new(Unknown, ""),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{json, Value};

    use super::super::testing::*;

    use super::super::HealthStatus::*;

    #[test]
    fn pvc_rules() {
        let claim = |phase: Value| {
            obj(
                "v1",
                "PersistentVolumeClaim",
                json!({}),
                json!({"phase": phase}),
            )
        };
        check(&claim(json!("Bound")), Healthy, None);
        check(
            &claim(json!("Pending")),
            Progressing,
            Some("Waiting for the claim to be bound to a volume"),
        );
        check(
            &claim(json!("Lost")),
            Degraded,
            Some("The claim's bound volume no longer exists"),
        );
        check(
            &claim(json!("Weird")),
            Unknown,
            Some("Unknown claim phase \"Weird\""),
        );
        check(&claim(Value::Null), Unknown, None);
    }
}
