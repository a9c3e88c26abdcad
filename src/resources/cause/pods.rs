//! Pods: what the kubelet and the scheduler write of a Pod that does not run.
//!
//! The kubelet keeps each container's state in `status.containerStatuses` (`state.waiting` with
//! `ImagePullBackOff`, `ErrImagePull`, `CrashLoopBackOff`…; `lastState.terminated` with the exit
//! code and `OOMKilled`) and reports as Events on the Pod (`Failed` with the pull error,
//! `BackOff`, `Unhealthy` with a probe's failure); the scheduler writes the `PodScheduled=False`
//! condition and a `FailedScheduling` Event.

use super::{quote, Finding, Look};
use crate::resources::health::fields::{at, condition, int_at, list_at, str_at};
use crate::resources::health::is_stuck_waiting_reason;
use crate::resources::tree::Tree;

pub(super) fn pod(look: &Look) -> Option<Finding> {
    if !look.unhealthy() {
        return None;
    }
    let object = &look.resource.object.view;
    let statuses: Vec<&Tree> = list_at(object, &["status", "initContainerStatuses"])
        .iter()
        .chain(list_at(object, &["status", "containerStatuses"]))
        .collect();
    statuses
        .iter()
        .find_map(|c| waiting(look, c))
        .or_else(|| statuses.iter().find_map(|c| oom_killed(c)))
        .or_else(|| unschedulable(look, object))
        .or_else(|| failing_probe(look, &statuses))
        .or_else(|| statuses.iter().find_map(|c| failed(c)))
}

fn container_name(status: &Tree) -> String {
    str_at(status, &["name"]).unwrap_or("").to_owned()
}

fn in_container(mut finding: Finding, status: &Tree) -> Finding {
    finding.container = Some(container_name(status));
    finding
}

/// A container that cannot start: its image cannot be pulled, it crashes, or another reason
/// the kubelet gives for not starting it (`CreateContainerConfigError`, `InvalidImageName`…).
fn waiting(look: &Look, status: &Tree) -> Option<Finding> {
    let reason = str_at(status, &["state", "waiting", "reason"])?;
    if !is_stuck_waiting_reason(reason) {
        return None;
    }
    let message = str_at(status, &["state", "waiting", "message"]).unwrap_or("");
    let finding = match reason {
        "ImagePullBackOff" | "ErrImagePull" => {
            let image = str_at(status, &["image"]).unwrap_or("");
            // The back-off says only that it waits; the kubelet's `Failed` Event says why.
            let pulled = format!("\"{image}\"");
            let message = look
                .event_where("Failed", true, |e| e.message.contains(&pulled))
                .map_or(message, |e| e.message.as_str());
            Finding::new(reason, message, format!("cannot pull image {image}"))
        }
        "CrashLoopBackOff" => {
            if let Some(oom) = oom_killed(status) {
                return Some(oom);
            }
            let mut finding = match at(status, &["lastState", "terminated"]) {
                Some(last) => Finding::new(
                    reason,
                    message,
                    format!(
                        "keeps crashing, last exit code {}",
                        int_at(last, &["exitCode"])
                    ),
                ),
                None => Finding::new(reason, message, "keeps crashing".to_owned()),
            };
            finding.logs = true;
            finding
        }
        _ => Finding::new(reason, message, format!("cannot start: {}", quote(message))),
    };
    Some(in_container(finding, status))
}

/// A container the kernel killed for going over its memory limit: now, or in its last run.
fn oom_killed(status: &Tree) -> Option<Finding> {
    let terminated = ["state", "lastState"]
        .into_iter()
        .filter_map(|state| at(status, &[state, "terminated"]))
        .find(|t| str_at(*t, &["reason"]) == Some("OOMKilled"))?;
    let code = int_at(terminated, &["exitCode"]);
    let message = str_at(terminated, &["message"]).unwrap_or("");
    let mut finding = Finding::new(
        "OOMKilled",
        message,
        format!("was killed for going over its memory limit, exit code {code}"),
    );
    finding.logs = true;
    Some(in_container(finding, status))
}

/// A Pod no node takes: the scheduler's condition, else its Event.
fn unschedulable(look: &Look, object: &Tree) -> Option<Finding> {
    let scheduled =
        condition(object, "PodScheduled").filter(|c| str_at(*c, &["status"]) == Some("False"));
    let (reason, message) = match scheduled {
        Some(c) => (
            str_at(c, &["reason"]).unwrap_or("Unschedulable"),
            str_at(c, &["message"]).unwrap_or(""),
        ),
        None => {
            let event = look.event(&["FailedScheduling"], true)?;
            // An old Event of a Pod since scheduled says nothing.
            if str_at(object, &["status", "phase"]) != Some("Pending") {
                return None;
            }
            ("Unschedulable", event.message.as_str())
        }
    };
    Some(Finding::new(
        reason,
        message,
        format!("cannot be scheduled: {}", quote(message)),
    ))
}

/// A running container that is not ready because a probe fails: the kubelet's `Unhealthy`
/// Event ("Readiness probe failed: HTTP probe failed with statuscode: 503").
fn failing_probe(look: &Look, statuses: &[&Tree]) -> Option<Finding> {
    let unready = statuses.iter().find(|c| {
        at(**c, &["state", "running"]).is_some()
            && c.get("ready").and_then(Tree::as_bool) != Some(true)
    })?;
    let event = look.event(&["Unhealthy"], true)?;
    let says = match event.message.split_once(" probe failed:") {
        Some((probe, said)) => format!(
            "fails its {} probe: {}",
            probe.to_lowercase(),
            quote(said.trim())
        ),
        None => format!("fails a probe: {}", quote(&event.message)),
    };
    let finding = Finding::new("Unhealthy", &event.message, says);
    Some(in_container(finding, unready))
}

/// A container that ran to a failure in a Pod that will not restart it (a Job's).
fn failed(status: &Tree) -> Option<Finding> {
    let terminated = at(status, &["state", "terminated"])?;
    let code = int_at(terminated, &["exitCode"]);
    if code == 0 {
        return None;
    }
    let reason = str_at(terminated, &["reason"]).unwrap_or("Error");
    let message = str_at(terminated, &["message"]).unwrap_or("");
    Some(in_container(
        Finding::new(reason, message, format!("exited with code {code}")),
        status,
    ))
}
