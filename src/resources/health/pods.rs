//! Pod (gitops-engine health_pod.go).

use super::fields::*;
use super::Health;
use super::HealthStatus::*;
use crate::resources::tree::Tree;

/// Waiting reasons that mean the container cannot start without a change (CrashLoopBackOff,
/// ImagePullBackOff, ErrImagePull, CreateContainerConfigError, ...), not that it is starting.
pub(super) fn is_stuck_waiting_reason(reason: &str) -> bool {
    reason.starts_with("Err") || reason.ends_with("Error") || reason.ends_with("BackOff")
}

/// Argo's wording for why a terminated container failed, or None when it exited cleanly.
pub(super) fn terminated_failure(container: &Tree, terminated: &Tree) -> Option<String> {
    let message = str_at(terminated, &["message"]).unwrap_or("");
    if !message.is_empty() {
        return Some(message.to_string());
    }
    if str_at(terminated, &["reason"]) == Some("OOMKilled") {
        return Some("OOMKilled".to_string());
    }
    let code = int_at(terminated, &["exitCode"]);
    (code != 0).then(|| {
        let name = str_at(container, &["name"]).unwrap_or("");
        format!("container \"{name}\" failed with exit code {code}")
    })
}

pub(super) fn pod(obj: &Obj) -> Health {
    // The API server defaults restartPolicy to Always, so an object without it is read as such.
    let restart_policy = str_at(obj, &["spec", "restartPolicy"]).unwrap_or("Always");
    let init_statuses = list_at(obj, &["status", "initContainerStatuses"]);
    let statuses = list_at(obj, &["status", "containerStatuses"]);
    let all_statuses = || init_statuses.iter().chain(statuses);
    let status_message = str_at(obj, &["status", "message"]).unwrap_or("");

    // Only for long-running pods: a hook pod (OnFailure/Never) stuck pulling its image must not
    // be failed early, as Argo explains; it stays Progressing until its phase says otherwise.
    if restart_policy == "Always" {
        let stuck: Vec<&str> = all_statuses()
            .filter_map(|c| {
                let reason = str_at(c, &["state", "waiting", "reason"])?;
                is_stuck_waiting_reason(reason).then(|| {
                    match str_at(c, &["state", "waiting", "message"]) {
                        Some(m) if !m.is_empty() => m,
                        _ => reason,
                    }
                })
            })
            .collect();
        if !stuck.is_empty() {
            return Health::new(Degraded, stuck.join(", "));
        }
    }

    match str_at(obj, &["status", "phase"]).unwrap_or("") {
        "Pending" => {
            // An unschedulable pod explains itself only in its PodScheduled condition.
            let scheduled = condition(obj, "PodScheduled");
            let message = if status_message.is_empty() && cond_status_is(scheduled, "False") {
                cond_message(scheduled)
            } else {
                status_message
            };
            Health::new(Progressing, message)
        }
        "Succeeded" => Health::new(Healthy, status_message),
        "Failed" => {
            if !status_message.is_empty() {
                return Health::new(Degraded, status_message);
            }
            let failure = all_statuses().find_map(|c| {
                let terminated = at(c, &["state", "terminated"]).filter(|t| t.is_object())?;
                terminated_failure(c, terminated)
            });
            Health::new(Degraded, failure.unwrap_or_default())
        }
        "Running" if restart_policy == "Always" || ignores_restart_policy(obj) => {
            running_pod(obj, statuses, status_message)
        }
        // Finite pods (typically hooks) are not Healthy until they succeed.
        "Running" => Health::new(Progressing, status_message),
        _ => Health::new(Unknown, status_message),
    }
}

/// Argo's opt-out for pods that run with OnFailure or Never yet are long-lived (typically
/// managed by an operator): judged as a long-running pod once running, like Argo does.
pub const IGNORE_RESTART_POLICY_ANNOTATION: &str = "argocd.argoproj.io/ignore-restart-policy";

pub(super) fn ignores_restart_policy(obj: &Obj) -> bool {
    at(obj, &["metadata", "annotations"])
        .and_then(Tree::as_object)
        .is_some_and(|a| a.contains_key(IGNORE_RESTART_POLICY_ANNOTATION))
}

/// A running long-lived pod: Healthy when Ready; Degraded when not Ready because a container
/// has already died once (OOMKilled, crashed); otherwise still starting.
pub(super) fn running_pod(obj: &Obj, statuses: &[Tree], status_message: &str) -> Health {
    let ready = condition(obj, "Ready");
    if cond_status_is(ready, "True") {
        return Health::new(Healthy, status_message);
    }
    let restarted = statuses.iter().find_map(|c| {
        let terminated = at(c, &["lastState", "terminated"]).filter(|t| t.is_object())?;
        Some((c, terminated))
    });
    if let Some((container, terminated)) = restarted {
        if !status_message.is_empty() {
            return Health::new(Degraded, status_message);
        }
        // Argo leaves this message empty; say which container died and how.
        let name = str_at(container, &["name"]).unwrap_or("");
        let how = match (
            str_at(terminated, &["message"]).filter(|m| !m.is_empty()),
            str_at(terminated, &["reason"]).filter(|r| !r.is_empty()),
        ) {
            (Some(message), _) => message.to_string(),
            (None, Some(reason)) => reason.to_string(),
            (None, None) => format!("exit code {}", int_at(terminated, &["exitCode"])),
        };
        return Health::new(
            Degraded,
            format!("container \"{name}\" last terminated: {how}"),
        );
    }
    // kubelet names the unready containers in the Ready condition's message.
    let message = if status_message.is_empty() {
        cond_message(ready)
    } else {
        status_message
    };
    Health::new(Progressing, message)
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::super::testing::*;

    use super::super::HealthStatus::*;
    use super::super::*;

    // --- Pod -------------------------------------------------------------------------------

    #[test]
    fn pod_running_ready_is_healthy() {
        let o = pod_with(
            "Always",
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "app", "ready": true, "state": {"running": {}}}]}),
        );
        check(&o, Healthy, None);
    }

    #[test]
    fn pod_running_not_ready_is_progressing() {
        let o = pod_with(
            "Always",
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False",
                   "reason": "ContainersNotReady", "message": "containers with unready status: [app]"}],
                   "containerStatuses": [{"name": "app", "ready": false, "state": {"running": {}}}]}),
        );
        check(
            &o,
            Progressing,
            Some("containers with unready status: [app]"),
        );
    }

    #[test]
    fn pod_crash_loop_back_off_is_degraded() {
        let o = pod_with(
            "Always",
            json!({"phase": "Running", "containerStatuses": [
                waiting("CrashLoopBackOff", "back-off 5m0s restarting failed container=app pod=web"),
                {"name": "sidecar", "state": {"running": {}}}]}),
        );
        check(
            &o,
            Degraded,
            Some("back-off 5m0s restarting failed container=app pod=web"),
        );
    }

    #[test]
    fn pod_image_pull_errors_are_degraded_and_joined() {
        let o = pod_with(
            "Always",
            json!({"phase": "Pending", "containerStatuses": [
                waiting("ImagePullBackOff", "Back-off pulling image \"nope:1\""),
                waiting("ErrImagePull", ""),
                waiting("ContainerCreating", "")]}),
        );
        check(
            &o,
            Degraded,
            Some("Back-off pulling image \"nope:1\", ErrImagePull"),
        );
    }

    #[test]
    fn pod_init_container_back_off_is_degraded() {
        let o = pod_with(
            "Always",
            json!({"phase": "Pending", "initContainerStatuses": [
                waiting("CrashLoopBackOff", "back-off 10s restarting failed container=migrate")]}),
        );
        check(
            &o,
            Degraded,
            Some("back-off 10s restarting failed container=migrate"),
        );
    }

    #[test]
    fn hook_pod_image_pull_back_off_stays_progressing() {
        let o = pod_with(
            "Never",
            json!({"phase": "Pending", "containerStatuses": [waiting("ImagePullBackOff", "Back-off")]}),
        );
        check(&o, Progressing, None);
    }

    #[test]
    fn pod_oom_killed_last_state_is_degraded() {
        let o = pod_with(
            "Always",
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                   "containerStatuses": [{"name": "app", "ready": false, "restartCount": 3,
                       "state": {"running": {}},
                       "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}),
        );
        check(
            &o,
            Degraded,
            Some("container \"app\" last terminated: OOMKilled"),
        );
    }

    #[test]
    fn pod_failed_oom_killed() {
        let o = pod_with(
            "Never",
            json!({"phase": "Failed", "containerStatuses": [{"name": "app",
                   "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}),
        );
        check(&o, Degraded, Some("OOMKilled"));
    }

    #[test]
    fn pod_failed_messages() {
        let with_message = pod_with(
            "Never",
            json!({"phase": "Failed", "message": "Pod was evicted: node low on memory"}),
        );
        check(
            &with_message,
            Degraded,
            Some("Pod was evicted: node low on memory"),
        );
        let exit_code = pod_with(
            "OnFailure",
            json!({"phase": "Failed",
                   "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
                   "containerStatuses": [{"name": "app", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}]}),
        );
        check(
            &exit_code,
            Degraded,
            Some("container \"app\" failed with exit code 2"),
        );
        let bare = pod_with("Never", json!({"phase": "Failed"}));
        check(&bare, Degraded, None);
    }

    #[test]
    fn pod_succeeded_pending_and_finite_running() {
        check(
            &pod_with("Never", json!({"phase": "Succeeded"})),
            Healthy,
            None,
        );
        let unschedulable = pod_with(
            "Always",
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                   "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu."}]}),
        );
        check(
            &unschedulable,
            Progressing,
            Some("0/3 nodes are available: 3 Insufficient cpu."),
        );
        let hook = pod_with(
            "OnFailure",
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
        );
        check(&hook, Progressing, None);
        check(
            &pod_with(
                "Always",
                json!({"phase": "Unknown", "message": "node lost"}),
            ),
            Unknown,
            Some("node lost"),
        );
    }

    /// The rules and edge cases not pinned above.
    pub(in crate::resources::health) fn fixtures() -> Vec<Fixture> {
        vec![
            // Pod
            (
                "crash loop without message names its reason",
                pod_with(
                    "Always",
                    json!({"phase": "Running", "containerStatuses": [waiting("CrashLoopBackOff", "")]}),
                ),
                Degraded,
                Some("CrashLoopBackOff"),
            ),
            (
                "config error",
                pod_with(
                    "Always",
                    json!({"phase": "Pending", "containerStatuses": [
                 waiting("CreateContainerConfigError", "secret \"db\" not found")]}),
                ),
                Degraded,
                Some("secret \"db\" not found"),
            ),
            (
                "container creating is not stuck",
                pod_with(
                    "Always",
                    json!({"phase": "Pending", "containerStatuses": [waiting("ContainerCreating", "")]}),
                ),
                Progressing,
                None,
            ),
            (
                "restartPolicy defaults to Always",
                obj(
                    "v1",
                    "Pod",
                    json!({}),
                    json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
                ),
                Healthy,
                None,
            ),
            (
                "running, not ready, with a status message",
                pod_with(
                    "Always",
                    json!({"phase": "Running", "message": "probing",
                 "conditions": [{"type": "Ready", "status": "False", "message": "containers with unready status: [app]"}]}),
                ),
                Progressing,
                Some("probing"),
            ),
            (
                "restarted, with a status message",
                pod_with(
                    "Always",
                    json!({"phase": "Running", "message": "node pressure",
                 "containerStatuses": [{"name": "app", "lastState": {"terminated": {"exitCode": 1}}}]}),
                ),
                Degraded,
                Some("node pressure"),
            ),
            (
                "restarted with an exit code only",
                pod_with(
                    "Always",
                    json!({"phase": "Running",
                 "containerStatuses": [{"name": "app", "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "panic: boom"}}}]}),
                ),
                Degraded,
                Some("container \"app\" last terminated: panic: boom"),
            ),
            (
                "failed: terminated message first",
                pod_with(
                    "Never",
                    json!({"phase": "Failed", "containerStatuses": [
                 {"name": "app", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "killed"}}}]}),
                ),
                Degraded,
                Some("killed"),
            ),
            (
                "ignore-restart-policy: a running OnFailure pod is judged as long-lived",
                with_annotation(
                    pod_with(
                        "OnFailure",
                        json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}),
                    ),
                    IGNORE_RESTART_POLICY_ANNOTATION,
                    "true",
                ),
                Healthy,
                None,
            ),
            (
                "ignore-restart-policy: a restarted Never pod is degraded",
                with_annotation(
                    pod_with(
                        "Never",
                        json!({"phase": "Running",
                 "containerStatuses": [{"name": "app", "lastState": {"terminated": {"reason": "OOMKilled"}}}]}),
                    ),
                    IGNORE_RESTART_POLICY_ANNOTATION,
                    "",
                ),
                Degraded,
                Some("container \"app\" last terminated: OOMKilled"),
            ),
            (
                "pod without phase",
                pod_with("Always", json!({})),
                Unknown,
                None,
            ),
        ]
    }

    #[test]
    fn every_remaining_branch() {
        check_fixtures(fixtures());
    }
}
