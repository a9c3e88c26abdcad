//! Workloads (gitops-engine health_deployment.go, health_statefulset.go, health_daemonset.go,
//! health_replicaset.go), themselves borrowed from `kubectl rollout status`.

use super::fields::*;
use super::Health;
use super::HealthStatus::*;

pub(super) fn deployment(obj: &Obj) -> Health {
    if bool_at(obj, &["spec", "paused"]) {
        return Health::new(Suspended, "Deployment is paused");
    }
    if generation_lags(obj) {
        return Health::new(
            Progressing,
            "Waiting for rollout to finish: observed deployment generation less than desired generation",
        );
    }
    if cond_reason(condition(obj, "Progressing")) == "ProgressDeadlineExceeded" {
        return Health::new(
            Degraded,
            format!(
                "Deployment \"{}\" exceeded its progress deadline",
                name(obj)
            ),
        );
    }
    let updated = int_at(obj, &["status", "updatedReplicas"]);
    let replicas = int_at(obj, &["status", "replicas"]);
    let available = int_at(obj, &["status", "availableReplicas"]);
    match opt_int_at(obj, &["spec", "replicas"]) {
        Some(desired) if updated < desired => Health::new(
            Progressing,
            format!("Waiting for rollout to finish: {updated} out of {desired} new replicas have been updated..."),
        ),
        _ if replicas > updated => Health::new(
            Progressing,
            format!(
                "Waiting for rollout to finish: {} old replicas are pending termination...",
                replicas - updated
            ),
        ),
        _ if available < updated => Health::new(
            Progressing,
            format!("Waiting for rollout to finish: {available} of {updated} updated replicas are available..."),
        ),
        _ => Health::new(Healthy, ""),
    }
}

pub(super) fn stateful_set(obj: &Obj) -> Health {
    let observed = int_at(obj, &["status", "observedGeneration"]);
    if observed == 0 || generation_lags(obj) {
        return Health::new(
            Progressing,
            "Waiting for statefulset spec update to be observed...",
        );
    }
    let desired = opt_int_at(obj, &["spec", "replicas"]);
    let ready = int_at(obj, &["status", "readyReplicas"]);
    let updated = int_at(obj, &["status", "updatedReplicas"]);
    if let Some(desired) = desired.filter(|d| ready < *d) {
        return Health::new(
            Progressing,
            format!("Waiting for {} pods to be ready...", desired - ready),
        );
    }
    let strategy = str_at(obj, &["spec", "updateStrategy", "type"]).unwrap_or("");
    let rolling = at(obj, &["spec", "updateStrategy", "rollingUpdate"]);
    if strategy == "RollingUpdate" && rolling.is_some_and(|r| !r.is_null()) {
        let partition = opt_int_at(
            obj,
            &["spec", "updateStrategy", "rollingUpdate", "partition"],
        );
        if let (Some(desired), Some(partition)) = (desired, partition) {
            let target = desired - partition;
            if updated < target {
                return Health::new(
                    Progressing,
                    format!("Waiting for partitioned roll out to finish: {updated} out of {target} new pods have been updated..."),
                );
            }
        }
        return Health::new(
            Healthy,
            format!("partitioned roll out complete: {updated} new pods have been updated..."),
        );
    }
    if strategy == "OnDelete" {
        return Health::new(Healthy, format!("statefulset has {ready} ready pods"));
    }
    let update_rev = str_at(obj, &["status", "updateRevision"]).unwrap_or("");
    let current_rev = str_at(obj, &["status", "currentRevision"]).unwrap_or("");
    if update_rev != current_rev {
        return Health::new(
            Progressing,
            format!("waiting for statefulset rolling update to complete {updated} pods at revision {update_rev}..."),
        );
    }
    Health::new(
        Healthy,
        format!(
            "statefulset rolling update complete {} pods at revision {current_rev}...",
            int_at(obj, &["status", "currentReplicas"])
        ),
    )
}

pub(super) fn daemon_set(obj: &Obj) -> Health {
    if generation_lags(obj) {
        return Health::new(
            Progressing,
            "Waiting for rollout to finish: observed daemon set generation less than desired generation",
        );
    }
    let updated = int_at(obj, &["status", "updatedNumberScheduled"]);
    let desired = int_at(obj, &["status", "desiredNumberScheduled"]);
    let available = int_at(obj, &["status", "numberAvailable"]);
    // OnDelete never replaces pods by itself, so old pods are the expected steady state.
    if str_at(obj, &["spec", "updateStrategy", "type"]) == Some("OnDelete") {
        return Health::new(
            Healthy,
            format!("daemon set {updated} out of {desired} new pods have been updated"),
        );
    }
    let name = name(obj);
    if updated < desired {
        return Health::new(
            Progressing,
            format!("Waiting for daemon set \"{name}\" rollout to finish: {updated} out of {desired} new pods have been updated..."),
        );
    }
    if available < desired {
        return Health::new(
            Progressing,
            format!("Waiting for daemon set \"{name}\" rollout to finish: {available} of {desired} updated pods are available..."),
        );
    }
    Health::new(Healthy, "")
}

pub(super) fn replica_set(obj: &Obj) -> Health {
    if generation_lags(obj) {
        return Health::new(
            Progressing,
            "Waiting for rollout to finish: observed replica set generation less than desired generation",
        );
    }
    let failure = condition(obj, "ReplicaFailure");
    if cond_status_is(failure, "True") {
        // The condition's message only, as Argo shows it.
        return Health::new(
            Degraded,
            failure.and_then(|c| str_at(c, &["message"])).unwrap_or(""),
        );
    }
    let available = int_at(obj, &["status", "availableReplicas"]);
    match opt_int_at(obj, &["spec", "replicas"]) {
        Some(desired) if available < desired => Health::new(
            Progressing,
            format!("Waiting for rollout to finish: {available} out of {desired} new replicas are available..."),
        ),
        _ => Health::new(Healthy, ""),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::super::testing::*;

    use super::super::HealthStatus::*;

    // --- Deployment ------------------------------------------------------------------------

    #[test]
    fn deployment_healthy() {
        let o = deploy(
            json!({"replicas": 3}),
            json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3}),
        );
        check(&o, Healthy, None);
    }

    #[test]
    fn deployment_paused_is_suspended() {
        let o = deploy(
            json!({"replicas": 3, "paused": true}),
            json!({"observedGeneration": 0}),
        );
        check(&o, Suspended, Some("Deployment is paused"));
    }

    #[test]
    fn deployment_generation_lag() {
        let o = deploy(json!({"replicas": 1}), json!({"observedGeneration": 0}));
        check(
            &o,
            Progressing,
            Some("Waiting for rollout to finish: observed deployment generation less than desired generation"),
        );
    }

    #[test]
    fn deployment_progress_deadline_exceeded_is_degraded() {
        let o = deploy(
            json!({"replicas": 3}),
            json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 1,
                   "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}),
        );
        check(
            &o,
            Degraded,
            Some("Deployment \"web\" exceeded its progress deadline"),
        );
    }

    #[test]
    fn deployment_rollout_messages() {
        let updating = deploy(
            json!({"replicas": 3}),
            json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 3}),
        );
        check(
            &updating,
            Progressing,
            Some("Waiting for rollout to finish: 1 out of 3 new replicas have been updated..."),
        );
        let terminating = deploy(
            json!({"replicas": 3}),
            json!({"observedGeneration": 1, "replicas": 5, "updatedReplicas": 3, "availableReplicas": 3}),
        );
        check(
            &terminating,
            Progressing,
            Some("Waiting for rollout to finish: 2 old replicas are pending termination..."),
        );
        let unavailable = deploy(
            json!({"replicas": 3}),
            json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 2}),
        );
        check(
            &unavailable,
            Progressing,
            Some("Waiting for rollout to finish: 2 of 3 updated replicas are available..."),
        );
    }

    // --- StatefulSet -----------------------------------------------------------------------

    #[test]
    fn statefulset_not_observed() {
        let o = sts(json!({"type": "RollingUpdate"}), json!({}));
        check(
            &o,
            Progressing,
            Some("Waiting for statefulset spec update to be observed..."),
        );
    }

    #[test]
    fn statefulset_waiting_for_ready_pods() {
        let o = sts(
            json!({"type": "RollingUpdate"}),
            json!({"observedGeneration": 1, "readyReplicas": 1}),
        );
        check(&o, Progressing, Some("Waiting for 2 pods to be ready..."));
    }

    #[test]
    fn statefulset_partitioned_rollout() {
        let strategy = json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 1}});
        let rolling = sts(
            strategy.clone(),
            json!({"observedGeneration": 1, "readyReplicas": 3, "updatedReplicas": 1}),
        );
        check(
            &rolling,
            Progressing,
            Some("Waiting for partitioned roll out to finish: 1 out of 2 new pods have been updated..."),
        );
        let done = sts(
            strategy,
            json!({"observedGeneration": 1, "readyReplicas": 3, "updatedReplicas": 2}),
        );
        check(
            &done,
            Healthy,
            Some("partitioned roll out complete: 2 new pods have been updated..."),
        );
    }

    #[test]
    fn statefulset_on_delete_is_healthy_with_old_pods() {
        let o = sts(
            json!({"type": "OnDelete"}),
            json!({"observedGeneration": 1, "readyReplicas": 3, "updatedReplicas": 0,
                   "currentRevision": "web-1", "updateRevision": "web-2"}),
        );
        check(&o, Healthy, Some("statefulset has 3 ready pods"));
    }

    #[test]
    fn statefulset_rolling_update_by_revision() {
        let rolling = sts(
            json!({"type": "RollingUpdate"}),
            json!({"observedGeneration": 1, "readyReplicas": 3, "updatedReplicas": 1,
                   "currentRevision": "web-1", "updateRevision": "web-2"}),
        );
        check(
            &rolling,
            Progressing,
            Some("waiting for statefulset rolling update to complete 1 pods at revision web-2..."),
        );
        let done = sts(
            json!({"type": "RollingUpdate"}),
            json!({"observedGeneration": 1, "readyReplicas": 3, "currentReplicas": 3,
                   "currentRevision": "web-2", "updateRevision": "web-2"}),
        );
        check(
            &done,
            Healthy,
            Some("statefulset rolling update complete 3 pods at revision web-2..."),
        );
    }

    // --- DaemonSet -------------------------------------------------------------------------

    #[test]
    fn daemonset_healthy() {
        let o = ds(
            "RollingUpdate",
            json!({"observedGeneration": 1, "desiredNumberScheduled": 3, "updatedNumberScheduled": 3, "numberAvailable": 3}),
        );
        check(&o, Healthy, None);
    }

    #[test]
    fn daemonset_progressing() {
        let lag = ds("RollingUpdate", json!({"observedGeneration": 0}));
        check(
            &lag,
            Progressing,
            Some("Waiting for rollout to finish: observed daemon set generation less than desired generation"),
        );
        let updating = ds(
            "RollingUpdate",
            json!({"observedGeneration": 1, "desiredNumberScheduled": 3, "updatedNumberScheduled": 1, "numberAvailable": 3}),
        );
        check(
            &updating,
            Progressing,
            Some("Waiting for daemon set \"web\" rollout to finish: 1 out of 3 new pods have been updated..."),
        );
        let unavailable = ds(
            "RollingUpdate",
            json!({"observedGeneration": 1, "desiredNumberScheduled": 3, "updatedNumberScheduled": 3,
                   "numberAvailable": 2, "numberUnavailable": 1}),
        );
        check(
            &unavailable,
            Progressing,
            Some("Waiting for daemon set \"web\" rollout to finish: 2 of 3 updated pods are available..."),
        );
    }

    #[test]
    fn daemonset_on_delete() {
        let o = ds(
            "OnDelete",
            json!({"observedGeneration": 1, "desiredNumberScheduled": 3, "updatedNumberScheduled": 1, "numberAvailable": 3}),
        );
        check(
            &o,
            Healthy,
            Some("daemon set 1 out of 3 new pods have been updated"),
        );
    }

    // --- ReplicaSet ------------------------------------------------------------------------

    #[test]
    fn replicaset_rules() {
        let healthy = obj(
            "apps/v1",
            "ReplicaSet",
            json!({"replicas": 2}),
            json!({"observedGeneration": 1, "availableReplicas": 2}),
        );
        check(&healthy, Healthy, None);
        let waiting = obj(
            "apps/v1",
            "ReplicaSet",
            json!({"replicas": 2}),
            json!({"observedGeneration": 1, "availableReplicas": 1}),
        );
        check(
            &waiting,
            Progressing,
            Some("Waiting for rollout to finish: 1 out of 2 new replicas are available..."),
        );
        let lag = obj("apps/v1", "ReplicaSet", json!({"replicas": 2}), json!({}));
        check(
            &lag,
            Progressing,
            Some("Waiting for rollout to finish: observed replica set generation less than desired generation"),
        );
    }

    #[test]
    fn replicaset_replica_failure_is_degraded() {
        let o = obj(
            "apps/v1",
            "ReplicaSet",
            json!({"replicas": 2}),
            json!({"observedGeneration": 1, "availableReplicas": 0, "conditions": [{
                "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                "message": "pods \"web-x\" is forbidden: exceeded quota"}]}),
        );
        check(
            &o,
            Degraded,
            Some("pods \"web-x\" is forbidden: exceeded quota"),
        );
    }

    /// The rules and edge cases not pinned above.
    pub(in crate::resources::health) fn fixtures() -> Vec<Fixture> {
        let complete = json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        let deadline = json!([{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]);
        vec![
            // Deployment
            ("deployment without spec.replicas", deploy(json!({}), complete.clone()), Healthy, None),
            ("apps/v1beta2 deployment", obj("apps/v1beta2", "Deployment", json!({"replicas": 2}), complete.clone()),
             Unknown, Some("unsupported Deployment GVK: apps/v1beta2, Kind=Deployment")),
            ("paused beats the deadline",
             deploy(json!({"replicas": 2, "paused": true}), json!({"observedGeneration": 1, "conditions": deadline})),
             Suspended, Some("Deployment is paused")),
            ("a deadline of an older generation is not read",
             deploy(json!({"replicas": 2}), json!({"observedGeneration": 0, "conditions": deadline})),
             Progressing, Some("Waiting for rollout to finish: observed deployment generation less than desired generation")),
            ("scaled to zero", deploy(json!({"replicas": 0}), json!({"observedGeneration": 1})), Healthy, None),
            // StatefulSet
            ("statefulset generation lag",
             obj("apps/v1", "StatefulSet", json!({"replicas": 1}), json!({"observedGeneration": 1, "readyReplicas": 1})).tap_generation(2),
             Progressing, Some("Waiting for statefulset spec update to be observed...")),
            ("statefulset without spec.replicas",
             obj("apps/v1", "StatefulSet", json!({}), json!({"observedGeneration": 1, "currentReplicas": 1, "currentRevision": "r1", "updateRevision": "r1"})),
             Healthy, Some("statefulset rolling update complete 1 pods at revision r1...")),
            // DaemonSet
            ("apps/v1beta2 daemonset",
             obj("apps/v1beta2", "DaemonSet", json!({}), json!({"observedGeneration": 1, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberAvailable": 2})),
             Unknown, Some("unsupported DaemonSet GVK: apps/v1beta2, Kind=DaemonSet")),
            ("daemonset generation lag beats OnDelete",
             ds("OnDelete", json!({"observedGeneration": 0})),
             Progressing, Some("Waiting for rollout to finish: observed daemon set generation less than desired generation")),
            // ReplicaSet
            ("replica failure False is not a failure",
             obj("apps/v1", "ReplicaSet", json!({"replicas": 1}), json!({"observedGeneration": 1, "availableReplicas": 1,
                 "conditions": [{"type": "ReplicaFailure", "status": "False", "message": "old"}]})),
             Healthy, None),
            ("replica failure without message: the reason is not put in its place",
             obj("apps/v1", "ReplicaSet", json!({"replicas": 1}), json!({"observedGeneration": 1,
                 "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate"}]})),
             Degraded, None),
        ]
    }

    #[test]
    fn every_remaining_branch() {
        check_fixtures(fixtures());
    }
}
