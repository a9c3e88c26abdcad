//! Workloads: what the Deployment, ReplicaSet, StatefulSet, DaemonSet and Job controllers
//! write when they cannot do their work.
//!
//! The deployment controller sets `Progressing=False` with the reason
//! `ProgressDeadlineExceeded` once a rollout outlasts `spec.progressDeadlineSeconds`; a
//! controller that cannot create a Pod (a quota, an admission webhook, a missing service
//! account) records a `FailedCreate` Event and, for ReplicaSets (and the Deployments above
//! them), the `ReplicaFailure` condition; the Job controller sets `Failed=True` with
//! `BackoffLimitExceeded`, `DeadlineExceeded` or `PodFailurePolicy`.

use super::{quote, Finding, Look};
use crate::resources::health::fields::{cond_message, cond_reason, cond_status_is, condition};

pub(super) fn deployment(look: &Look) -> Option<Finding> {
    if !look.unhealthy() {
        return None;
    }
    let object = &look.resource.object.view;
    let progressing = condition(object, "Progressing");
    if cond_status_is(progressing, "False")
        && cond_reason(progressing) == "ProgressDeadlineExceeded"
    {
        return Some(Finding::new(
            "ProgressDeadlineExceeded",
            cond_message(progressing),
            "did not finish rolling out within its progress deadline".to_owned(),
        ));
    }
    failed_create(look)
}

/// A ReplicaSet, StatefulSet or DaemonSet that cannot create its Pods.
pub(super) fn controller(look: &Look) -> Option<Finding> {
    if !look.unhealthy() {
        return None;
    }
    failed_create(look)
}

pub(super) fn job(look: &Look) -> Option<Finding> {
    if !look.unhealthy() {
        return None;
    }
    let failed = condition(&look.resource.object.view, "Failed");
    if cond_status_is(failed, "True") {
        let message = cond_message(failed);
        return Some(Finding::new(
            cond_reason(failed),
            message,
            format!("failed: {}", quote(message)),
        ));
    }
    failed_create(look)
}

/// The `ReplicaFailure` condition, else the controller's last `FailedCreate` Event: "pods
/// "api-7f9c4-" is forbidden: exceeded quota: compute, requested: limits.cpu=2, …".
fn failed_create(look: &Look) -> Option<Finding> {
    let failure = condition(&look.resource.object.view, "ReplicaFailure");
    let message = if cond_status_is(failure, "True") {
        cond_message(failure)
    } else {
        look.event(&["FailedCreate"], true)?.message.as_str()
    };
    Some(Finding::new(
        "FailedCreate",
        message,
        format!("cannot create Pods: {}", quote(message)),
    ))
}
