//! Custom resources: the kstatus conventions (Stalled / Reconciling / Ready, observedGeneration)
//! that Flux, Crossplane, cert-manager and most operators follow, so a CRD needs no rule of its own.

use super::fields::*;
use super::Health;
use super::HealthStatus::*;

pub(super) fn custom_resource(obj: &Obj) -> Option<Health> {
    let ready = condition(obj, "Ready");
    // Conditions older than the spec describe the previous spec, not this one, whatever they
    // say: kstatus checks this before anything else too. Controllers that keep no
    // `status.observedGeneration` (cert-manager) record it on each condition instead.
    let generation = int_at(obj, &["metadata", "generation"]);
    let observed = opt_int_at(obj, &["status", "observedGeneration"])
        .or_else(|| ready.and_then(|c| opt_int_at(c, &["observedGeneration"])));
    if let Some(observed) = observed.filter(|observed| generation > *observed) {
        return Some(Health::new(
            Progressing,
            format!(
                "Waiting for the controller to observe the latest generation (observed {observed}, desired {generation})"
            ),
        ));
    }
    let stalled = condition(obj, "Stalled");
    if cond_status_is(stalled, "True") {
        return Some(Health::new(Degraded, cond_message(stalled)));
    }
    let reconciling = condition(obj, "Reconciling");
    if cond_status_is(reconciling, "True") {
        return Some(Health::new(Progressing, cond_message(reconciling)));
    }
    match ready.and_then(|c| str_at(c, &["status"])) {
        Some("True") => Some(Health::new(Healthy, cond_message(ready))),
        Some("False") => Some(Health::new(Degraded, cond_message(ready))),
        Some(_) => Some(Health::new(Progressing, cond_message(ready))),
        // Neither conditions nor a lagging generation: nothing tells us how it is doing.
        None => None,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::super::testing::health;
    use super::super::testing::*;
    use super::super::HealthStatus::*;

    // --- Custom resources ------------------------------------------------------------------

    #[test]
    fn custom_resource_ready() {
        let o = cr(
            2,
            json!({"observedGeneration": 2, "conditions": [
            {"type": "Ready", "status": "True", "reason": "ReconciliationSucceeded", "message": "Applied revision: main@sha1:abc"}]}),
        );
        check(&o, Healthy, Some("Applied revision: main@sha1:abc"));
    }

    #[test]
    fn custom_resource_stalled_and_not_ready_are_degraded() {
        let stalled = cr(
            1,
            json!({"conditions": [
            {"type": "Ready", "status": "False", "message": "not ready"},
            {"type": "Stalled", "status": "True", "reason": "InvalidPath", "message": "path not found"}]}),
        );
        check(&stalled, Degraded, Some("path not found"));
        let not_ready = cr(
            1,
            json!({"conditions": [
            {"type": "Ready", "status": "False", "reason": "BuildFailed", "message": ""}]}),
        );
        check(&not_ready, Degraded, Some("BuildFailed"));
    }

    #[test]
    fn custom_resource_reconciling_is_progressing() {
        let o = cr(
            1,
            json!({"conditions": [
            {"type": "Ready", "status": "False", "message": "stale failure"},
            {"type": "Reconciling", "status": "True", "message": "Reconciliation in progress"}]}),
        );
        check(&o, Progressing, Some("Reconciliation in progress"));
        let unknown = cr(
            1,
            json!({"conditions": [{"type": "Ready", "status": "Unknown", "message": "checking"}]}),
        );
        check(&unknown, Progressing, Some("checking"));
    }

    #[test]
    fn custom_resource_generation_lag_is_progressing() {
        let o = cr(
            3,
            json!({"observedGeneration": 2, "conditions": [{"type": "Ready", "status": "True"}]}),
        );
        check(
            &o,
            Progressing,
            Some("Waiting for the controller to observe the latest generation (observed 2, desired 3)"),
        );
        let without_conditions = cr(3, json!({"observedGeneration": 1}));
        check(
            &without_conditions,
            Progressing,
            Some("Waiting for the controller to observe the latest generation (observed 1, desired 3)"),
        );
    }

    #[test]
    fn custom_resource_without_signals_has_no_health() {
        assert_eq!(health(&cr(1, json!({}))), None);
        assert_eq!(health(&cr(1, json!({"observedGeneration": 1}))), None);
        let other = cr(
            1,
            json!({"conditions": [{"type": "Synced", "status": "True"}]}),
        );
        assert_eq!(health(&other), None);
    }

    /// The rules and edge cases not pinned above.
    pub(in crate::resources::health) fn fixtures() -> Vec<Fixture> {
        vec![
            // Custom resources
            ("stalled, but about an older generation",
             cr(2, json!({"observedGeneration": 1, "conditions": [{"type": "Stalled", "status": "True", "message": "old failure"}]})),
             Progressing, Some("Waiting for the controller to observe the latest generation (observed 1, desired 2)")),
            ("ready, but recorded for an older generation on the condition (cert-manager)",
             cr(3, json!({"conditions": [{"type": "Ready", "status": "True", "observedGeneration": 2, "message": "Certificate is up to date"}]})),
             Progressing, Some("Waiting for the controller to observe the latest generation (observed 2, desired 3)")),
            ("ready, recorded for this generation on the condition",
             cr(3, json!({"conditions": [{"type": "Ready", "status": "True", "observedGeneration": 3, "message": "Certificate is up to date"}]})),
             Healthy, Some("Certificate is up to date")),
            ("stalled beats reconciling",
             cr(1, json!({"observedGeneration": 1, "conditions": [
                 {"type": "Reconciling", "status": "True", "message": "retrying"},
                 {"type": "Stalled", "status": "True", "message": "gave up"}]})),
             Degraded, Some("gave up")),
            ("reconciling False and ready True",
             cr(1, json!({"observedGeneration": 1, "conditions": [
                 {"type": "Reconciling", "status": "False"}, {"type": "Stalled", "status": "False"},
                 {"type": "Ready", "status": "True", "reason": "Succeeded"}]})),
             Healthy, Some("Succeeded")),
            ("custom resource being deleted",
             cr(1, json!({})).tap_deleted(),
             Progressing, Some("Pending deletion")),
        ]
    }

    #[test]
    fn every_remaining_branch() {
        check_fixtures(fixtures());
    }
}
