//! Pod (gitops-engine health_pod.go), as Argo CD's current sources have it: messages come from
//! the pod's own `status.message` and container states, nothing is added.

use super::fields::*;
use super::Health;
use super::HealthStatus::*;
use crate::resources::tree::Tree;

/// Argo's opt-out for pods that run with OnFailure or Never yet are long-lived (typically
/// managed by an operator): judged as a long-running pod, unless it is a hook, whose completion
/// Argo reads from its health. The value must be exactly `"true"`.
pub const IGNORE_RESTART_POLICY_ANNOTATION: &str = "argocd.argoproj.io/ignore-restart-policy";
/// Argo CD's hook annotation: comma-separated hook types.
pub const HOOK_ANNOTATION: &str = "argocd.argoproj.io/hook";
/// Helm's hook annotation, which Argo CD honours when its own is absent.
pub const HELM_HOOK_ANNOTATION: &str = "helm.sh/hook";

/// Waiting reasons that mean the container cannot start without a change (CrashLoopBackOff,
/// ImagePullBackOff, ErrImagePull, CreateContainerConfigError, ...), not that it is starting.
pub(crate) fn is_stuck_waiting_reason(reason: &str) -> bool {
    reason.starts_with("Err") || reason.ends_with("Error") || reason.ends_with("BackOff")
}

/// Argo's wording for why a terminated container failed, or None when it exited cleanly.
fn terminated_failure(container: &Tree, terminated: &Tree) -> Option<String> {
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

fn annotation<'a>(obj: &Obj<'a>, key: &str) -> Option<&'a str> {
    at(obj, &["metadata", "annotations"])?.get(key)?.as_str()
}

/// The distinct, non-empty, trimmed comma-separated values of an annotation.
fn csv(value: &str) -> Vec<&str> {
    let mut values: Vec<&str> = Vec::new();
    for v in value.split(',').map(str::trim) {
        if !v.is_empty() && !values.contains(&v) {
            values.push(v);
        }
    }
    values
}

/// gitops-engine's `hook.IsHook`: Argo CD's hook annotation makes a hook unless its only valid
/// type is `Skip`; without it, Helm's does, unless it is `crd-install`.
pub(super) fn is_hook(obj: &Obj) -> bool {
    if let Some(value) = annotation(obj, HOOK_ANNOTATION) {
        const TYPES: [&str; 5] = ["PreSync", "Sync", "PostSync", "SyncFail", "Skip"];
        let types: Vec<&str> = csv(value)
            .into_iter()
            .filter(|t| TYPES.contains(t))
            .collect();
        // Helm's types stand in when Argo's are all invalid, and none of them is Skip.
        return types != ["Skip"];
    }
    annotation(obj, HELM_HOOK_ANNOTATION).is_some_and(|v| v != "crd-install")
}

pub(super) fn pod(obj: &Obj) -> Health {
    // As Argo reads it: a missing restartPolicy is "", not the API server's default Always.
    let restart_policy = str_at(obj, &["spec", "restartPolicy"]).unwrap_or("");
    let statuses = list_at(obj, &["status", "containerStatuses"]);
    let status_message = str_at(obj, &["status", "message"]).unwrap_or("");
    let ignores_policy = annotation(obj, IGNORE_RESTART_POLICY_ANNOTATION) == Some("true");
    let long_running = restart_policy == "Always" || (ignores_policy && !is_hook(obj));

    // Only for long-running pods: a hook pod (OnFailure/Never) stuck pulling its image must not
    // be failed early, as Argo explains; it stays Progressing until its phase says otherwise.
    if long_running {
        let stuck: Vec<&str> = statuses
            .iter()
            .filter(|c| {
                str_at(*c, &["state", "waiting", "reason"]).is_some_and(is_stuck_waiting_reason)
            })
            .map(|c| str_at(c, &["state", "waiting", "message"]).unwrap_or(""))
            .collect();
        if !stuck.is_empty() {
            return Health::new(Degraded, stuck.join(", "));
        }
    }

    match str_at(obj, &["status", "phase"]).unwrap_or("") {
        "Pending" => Health::new(Progressing, status_message),
        "Succeeded" => Health::new(Healthy, status_message),
        "Failed" => {
            if !status_message.is_empty() {
                return Health::new(Degraded, status_message);
            }
            let init = list_at(obj, &["status", "initContainerStatuses"]);
            let failure = init.iter().chain(statuses).find_map(|c| {
                let terminated = at(c, &["state", "terminated"]).filter(|t| t.is_object())?;
                terminated_failure(c, terminated)
            });
            Health::new(Degraded, failure.unwrap_or_default())
        }
        "Running" if long_running => {
            if cond_status_is(condition(obj, "Ready"), "True") {
                return Health::new(Healthy, status_message);
            }
            // Not ready because a container has already died once (OOMKilled, crashed).
            let restarted = statuses
                .iter()
                .any(|c| at(c, &["lastState", "terminated"]).is_some_and(|t| t.is_object()));
            Health::new(
                if restarted { Degraded } else { Progressing },
                status_message,
            )
        }
        // Finite pods (typically hooks) are not Healthy until they succeed.
        "Running" if matches!(restart_policy, "OnFailure" | "Never") => {
            Health::new(Progressing, status_message)
        }
        _ => Health::new(Unknown, status_message),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{json, Value};

    use super::super::testing::health;
    use super::super::testing::*;
    use super::super::HealthStatus::*;
    use super::super::*;
    use super::{HELM_HOOK_ANNOTATION, HOOK_ANNOTATION};

    const READY: &str = r#"[{"type": "Ready", "status": "True"}]"#;

    fn ready() -> Value {
        serde_json::from_str(READY).unwrap()
    }

    #[test]
    fn running_long_lived_pods() {
        let o = pod_with("Always", json!({"phase": "Running", "conditions": ready()}));
        check(&o, Healthy, None);
        // Not ready: Argo says only what the pod's own status message says.
        let o = pod_with(
            "Always",
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False",
                   "message": "containers with unready status: [app]"}]}),
        );
        check(&o, Progressing, None);
        let o = pod_with(
            "Always",
            json!({"phase": "Running", "message": "node pressure", "containerStatuses": [
                {"name": "app", "lastState": {"terminated": {"reason": "OOMKilled"}}}]}),
        );
        check(&o, Degraded, Some("node pressure"));
    }

    #[test]
    fn stuck_containers_are_degraded_and_joined() {
        let o = pod_with(
            "Always",
            json!({"phase": "Pending", "containerStatuses": [
                waiting("ImagePullBackOff", "Back-off pulling image \"nope:1\""),
                waiting("CreateContainerConfigError", "secret \"db\" not found"),
                waiting("ContainerCreating", "")]}),
        );
        check(
            &o,
            Degraded,
            Some("Back-off pulling image \"nope:1\", secret \"db\" not found"),
        );
        // Init containers are not read: the pod stays Pending.
        let o = pod_with(
            "Always",
            json!({"phase": "Pending", "initContainerStatuses": [waiting("CrashLoopBackOff", "x")]}),
        );
        check(&o, Progressing, None);
        // A finite pod stuck pulling its image is not failed early.
        let o = pod_with(
            "Never",
            json!({"phase": "Pending", "containerStatuses": [waiting("ImagePullBackOff", "x")]}),
        );
        check(&o, Progressing, None);
    }

    #[test]
    fn phases() {
        check(
            &pod_with("Never", json!({"phase": "Succeeded"})),
            Healthy,
            None,
        );
        check(
            &pod_with("Always", json!({"phase": "Pending", "message": "waiting"})),
            Progressing,
            Some("waiting"),
        );
        let running = json!({"phase": "Running", "conditions": ready()});
        check(&pod_with("OnFailure", running.clone()), Progressing, None);
        // Without a restart policy (the API server always sets one), Argo knows nothing.
        let bare = obj("v1", "Pod", json!({}), running);
        check(&bare, Unknown, None);
        check(
            &pod_with(
                "Always",
                json!({"phase": "Unknown", "message": "node lost"}),
            ),
            Unknown,
            Some("node lost"),
        );
    }

    #[test]
    fn failed_pods() {
        let evicted = pod_with(
            "Never",
            json!({"phase": "Failed", "message": "Pod was evicted"}),
        );
        check(&evicted, Degraded, Some("Pod was evicted"));
        let exit_code = pod_with(
            "OnFailure",
            json!({"phase": "Failed",
                   "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}],
                   "containerStatuses": [{"name": "app", "state": {"terminated": {"exitCode": 2}}}]}),
        );
        check(
            &exit_code,
            Degraded,
            Some("container \"app\" failed with exit code 2"),
        );
        let oom = pod_with(
            "Never",
            json!({"phase": "Failed", "containerStatuses": [{"name": "app",
                   "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}),
        );
        check(&oom, Degraded, Some("OOMKilled"));
        check(
            &pod_with("Never", json!({"phase": "Failed"})),
            Degraded,
            None,
        );
    }

    /// A Running, Ready pod with restartPolicy Never and these annotations.
    fn annotated(annotations: Value) -> Value {
        let mut o = pod_with("Never", json!({"phase": "Running", "conditions": ready()}));
        o["metadata"]["annotations"] = annotations;
        o
    }

    #[test]
    fn ignore_restart_policy_unless_a_hook() {
        let ignore = IGNORE_RESTART_POLICY_ANNOTATION;
        for (annotations, status) in [
            (json!({ignore: "true"}), Healthy),
            // The value must be exactly "true".
            (json!({ignore: "yes"}), Progressing),
            (
                json!({ignore: "true", HOOK_ANNOTATION: "PostSync"}),
                Progressing,
            ),
            (
                json!({ignore: "true", HOOK_ANNOTATION: "Sync, Skip"}),
                Progressing,
            ),
            // Only Skip, or no valid type but Skip: not a hook.
            (
                json!({ignore: "true", HOOK_ANNOTATION: " Skip,Skip"}),
                Healthy,
            ),
            (
                json!({ignore: "true", HOOK_ANNOTATION: "Skip,Bogus"}),
                Healthy,
            ),
            (
                json!({ignore: "true", HOOK_ANNOTATION: "Bogus"}),
                Progressing,
            ),
            (
                json!({ignore: "true", HELM_HOOK_ANNOTATION: "pre-install"}),
                Progressing,
            ),
            (
                json!({ignore: "true", HELM_HOOK_ANNOTATION: "crd-install"}),
                Healthy,
            ),
        ] {
            let got = health(&annotated(annotations.clone())).map(|h| h.status);
            assert_eq!(got, Some(status), "{annotations}");
        }
        // Judged as long-lived: a stuck container makes it Degraded.
        let mut o = pod_with(
            "Never",
            json!({"phase": "Running", "containerStatuses": [waiting("ImagePullBackOff", "Back-off")]}),
        );
        o["metadata"]["annotations"] = json!({ignore: "true"});
        check(&o, Degraded, Some("Back-off"));
    }

    /// The rules and edge cases not pinned above.
    pub(in crate::resources::health) fn fixtures() -> Vec<Fixture> {
        vec![
            (
                "crash loop without message",
                pod_with(
                    "Always",
                    json!({"phase": "Running", "containerStatuses": [waiting("CrashLoopBackOff", "")]}),
                ),
                Degraded,
                None,
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
                "a hook being deleted that holds the hook finalizer is judged by its rule",
                {
                    let mut o = pod_with("Never", json!({"phase": "Succeeded"})).tap_deleted();
                    o["metadata"]["finalizers"] = json!(["argocd.argoproj.io/hook-finalizer"]);
                    o
                },
                Healthy,
                None,
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
