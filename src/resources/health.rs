//! Argo CD-style health of live Kubernetes objects.
//!
//! Pure functions over objects as [`Tree`]s, following the built-in rules of Argo CD's
//! gitops-engine (`pkg/health`) and its `resource_customizations` Lua for CronJob, so that a
//! GitLab user sees the verdict Argo CD would show for the same object. Messages reuse Argo's
//! wording where it has one. Objects come straight from the cluster and may be partial or odd:
//! every field is read through an optional accessor and a missing one takes the Kubernetes zero
//! value, so no input can panic.

use super::tree::Tree;
use HealthStatus::{Degraded, Healthy, Progressing, Suspended, Unknown};

/// How healthy one resource, or a group of them, is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum HealthStatus {
    Healthy,
    Suspended,
    Progressing,
    Missing,
    Degraded,
    Unknown,
}

impl HealthStatus {
    /// Severity order for aggregation: Healthy < Suspended < Progressing < Missing < Degraded < Unknown.
    ///
    /// Argo CD's `healthOrder`: Unknown ranks worst because a health that cannot be read may be
    /// hiding anything.
    pub fn severity(self) -> u8 {
        match self {
            HealthStatus::Healthy => 0,
            HealthStatus::Suspended => 1,
            HealthStatus::Progressing => 2,
            HealthStatus::Missing => 3,
            HealthStatus::Degraded => 4,
            HealthStatus::Unknown => 5,
        }
    }

    /// The status as Argo CD spells it, e.g. "Progressing".
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Healthy => "Healthy",
            HealthStatus::Suspended => "Suspended",
            HealthStatus::Progressing => "Progressing",
            HealthStatus::Missing => "Missing",
            HealthStatus::Degraded => "Degraded",
            HealthStatus::Unknown => "Unknown",
        }
    }
}

/// A status and, when there is something to say, why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Health {
    pub status: HealthStatus,
    pub message: Option<String>,
}

impl Health {
    /// An empty message becomes `None`, as Argo's `omitempty` drops it.
    fn new(status: HealthStatus, message: impl Into<String>) -> Self {
        let message = message.into();
        Health {
            status,
            message: (!message.is_empty()).then_some(message),
        }
    }
}

/// API groups served by Kubernetes itself. A kind in one of these without a rule below has no
/// health (a ConfigMap is neither healthy nor not); any other group is a custom resource and
/// gets the generic condition rules.
const BUILTIN_GROUPS: &[&str] = &[
    "",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "extensions",
    "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io",
    "metrics.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// The health of one object, or None when no rule applies to its kind (None is NOT Unknown).
///
/// Like gitops-engine's `GetResourceHealth`, an object being deleted is "Pending deletion"
/// whatever its kind, since that is what a user most needs to know about it.
pub fn health(value: &Tree) -> Option<Health> {
    let obj = &Obj::new(value);
    if is_being_deleted(obj) {
        return Some(Health::new(Progressing, "Pending deletion"));
    }
    let kind = str_at(obj, &["kind"])?;
    let rule: fn(&Obj) -> Health = match (api_group(obj), kind) {
        ("apps" | "extensions", "Deployment") => deployment,
        ("apps", "StatefulSet") => stateful_set,
        ("apps" | "extensions", "DaemonSet") => daemon_set,
        ("apps" | "extensions", "ReplicaSet") => replica_set,
        ("", "Pod") => pod,
        ("", "Service") => service,
        ("", "PersistentVolumeClaim") => pvc,
        ("batch", "Job") => job,
        ("batch", "CronJob") => cron_job,
        ("networking.k8s.io" | "extensions", "Ingress") => ingress,
        ("autoscaling", "HorizontalPodAutoscaler") => hpa,
        ("apiregistration.k8s.io", "APIService") => api_service,
        (group, _) if BUILTIN_GROUPS.contains(&group) => return None,
        _ => return custom_resource(obj),
    };
    Some(rule(obj))
}

/// The group's health: the worst status by severity, with a message naming up to three causes,
/// e.g. "Caused by Deployment default/web: Deployment \"web\" exceeded its progress deadline; Pod default/web-1: ..."
/// (name the cause as `<Kind> <namespace>/<name>: <message>`; if more than three resources share the worst status, add "and N more").
/// Input: the healths of a list of objects (`None` for those without one). Empty input, or none
/// with a health: Healthy, no message.
///
/// Causes are named in input order, so the caller decides which three a reader sees first.
/// `describe` gives the `(kind, namespace, name)` of the object at an index, and is asked only
/// for the causes named: a group of 100,000 objects is not in cache, and reading every name
/// would cost a pass. A Healthy group has no message: there is nothing to explain.
pub fn aggregate<'a, 'h>(
    healths: impl IntoIterator<Item = Option<&'h Health>>,
    describe: impl Fn(usize) -> (&'a str, Option<&'a str>, &'a str),
) -> Health {
    const SHOWN: usize = 3;
    let mut worst = Healthy;
    let mut causes: Vec<(usize, Option<&str>)> = Vec::with_capacity(SHOWN);
    let mut count = 0usize;
    for (i, item) in healths.into_iter().enumerate() {
        let Some(item) = item else { continue };
        if item.status.severity() > worst.severity() {
            worst = item.status;
            causes.clear();
            count = 0;
        }
        if item.status == worst {
            count += 1;
            if causes.len() < SHOWN {
                causes.push((i, item.message.as_deref()));
            }
        }
    }
    if worst == Healthy {
        return Health::new(Healthy, "");
    }
    let causes: Vec<String> = causes
        .into_iter()
        .map(|(i, message)| {
            let (kind, namespace, name) = describe(i);
            describe_cause(kind, namespace, name, message)
        })
        .collect();
    let mut message = format!("Caused by {}", causes.join("; "));
    if count > SHOWN {
        message.push_str(&format!("; and {} more", count - SHOWN));
    }
    Health::new(worst, message)
}

/// `<Kind> <namespace>/<name>: <message>`, leaving out what a cluster-scoped or silent cause lacks.
fn describe_cause(
    kind: &str,
    namespace: Option<&str>,
    name: &str,
    message: Option<&str>,
) -> String {
    let mut cause = match namespace {
        Some(ns) if !ns.is_empty() => format!("{kind} {ns}/{name}"),
        _ => format!("{kind} {name}"),
    };
    if let Some(message) = message.filter(|m| !m.is_empty()) {
        cause.push_str(": ");
        cause.push_str(message);
    }
    cause
}

// ---------------------------------------------------------------------------------------------
// Field access: every read is optional so partial objects fall back to zero values, never panic.

/// Where fields are read from: a JSON value, or an object whose top level was read once.
trait Fields<'a>: Copy {
    /// The value at `path` (`&["status", "conditions"]`), through objects only.
    fn at(self, path: &[&str]) -> Option<&'a Tree>;
}

impl<'a> Fields<'a> for &'a Tree {
    fn at(self, path: &[&str]) -> Option<&'a Tree> {
        path.iter().try_fold(self, |v, key| v.get(key))
    }
}

/// An object with its top-level fields found in one walk of its top-level map: a rule reads
/// `metadata`, `spec` and `status` many times over, and each read walked the map again.
struct Obj<'a> {
    value: &'a Tree,
    kind: Option<&'a Tree>,
    api_version: Option<&'a Tree>,
    metadata: Option<&'a Tree>,
    spec: Option<&'a Tree>,
    status: Option<&'a Tree>,
}

impl<'a> Obj<'a> {
    fn new(value: &'a Tree) -> Self {
        let mut obj = Obj {
            value,
            kind: None,
            api_version: None,
            metadata: None,
            spec: None,
            status: None,
        };
        for (key, field) in value.as_object().into_iter().flatten() {
            let slot = match key {
                "kind" => &mut obj.kind,
                "apiVersion" => &mut obj.api_version,
                "metadata" => &mut obj.metadata,
                "spec" => &mut obj.spec,
                "status" => &mut obj.status,
                _ => continue,
            };
            *slot = Some(field);
        }
        obj
    }
}

impl<'a> Fields<'a> for &Obj<'a> {
    fn at(self, path: &[&str]) -> Option<&'a Tree> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self.value);
        };
        let top = match *first {
            "kind" => self.kind,
            "apiVersion" => self.api_version,
            "metadata" => self.metadata,
            "spec" => self.spec,
            "status" => self.status,
            key => self.value.get(key),
        };
        top?.at(rest)
    }
}

fn at<'a>(v: impl Fields<'a>, path: &[&str]) -> Option<&'a Tree> {
    v.at(path)
}

fn str_at<'a>(v: impl Fields<'a>, path: &[&str]) -> Option<&'a str> {
    at(v, path)?.as_str()
}

/// Integer field, or 0 as Go's typed structs would read a missing one.
fn int_at<'a>(v: impl Fields<'a>, path: &[&str]) -> i64 {
    opt_int_at(v, path).unwrap_or(0)
}

/// Integer field where absence matters (`spec.replicas` unset is not the same as 0 in Argo).
fn opt_int_at<'a>(v: impl Fields<'a>, path: &[&str]) -> Option<i64> {
    at(v, path)?.as_i64()
}

fn bool_at<'a>(v: impl Fields<'a>, path: &[&str]) -> bool {
    at(v, path).and_then(Tree::as_bool).unwrap_or(false)
}

fn list_at<'a>(v: impl Fields<'a>, path: &[&str]) -> &'a [Tree] {
    at(v, path).and_then(Tree::as_array).unwrap_or(&[])
}

/// The first `status.conditions` entry of the given type.
fn condition<'a>(obj: impl Fields<'a>, kind: &str) -> Option<&'a Tree> {
    list_at(obj, &["status", "conditions"])
        .iter()
        .find(|c| str_at(*c, &["type"]) == Some(kind))
}

/// Whether the condition exists and its `status` is exactly `status` ("True", "False", ...).
fn cond_status_is(cond: Option<&Tree>, status: &str) -> bool {
    cond.and_then(|c| str_at(c, &["status"])) == Some(status)
}

fn cond_reason(cond: Option<&Tree>) -> &str {
    cond.and_then(|c| str_at(c, &["reason"])).unwrap_or("")
}

/// The condition's message, or its reason when the controller left the message empty.
fn cond_message(cond: Option<&Tree>) -> &str {
    match cond.and_then(|c| str_at(c, &["message"])) {
        Some(m) if !m.is_empty() => m,
        _ => cond_reason(cond),
    }
}

fn name<'a>(obj: impl Fields<'a>) -> &'a str {
    str_at(obj, &["metadata", "name"]).unwrap_or("")
}

/// "apps/v1" → "apps", "v1" → "" (core). A missing apiVersion is read as core, because list
/// responses often omit it on their items.
fn api_group<'a>(obj: impl Fields<'a>) -> &'a str {
    str_at(obj, &["apiVersion"])
        .and_then(|v| v.split_once('/'))
        .map_or("", |(group, _)| group)
}

fn is_being_deleted<'a>(obj: impl Fields<'a>) -> bool {
    match at(obj, &["metadata", "deletionTimestamp"]) {
        None | Some(Tree::Null) => false,
        Some(Tree::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

/// The controller has not yet seen the latest spec, so any status it reports is stale.
fn generation_lags<'a>(obj: impl Fields<'a>) -> bool {
    int_at(obj, &["metadata", "generation"]) > int_at(obj, &["status", "observedGeneration"])
}

// ---------------------------------------------------------------------------------------------
// Workloads (gitops-engine health_deployment.go, health_statefulset.go, health_daemonset.go,
// health_replicaset.go), themselves borrowed from `kubectl rollout status`.

fn deployment(obj: &Obj) -> Health {
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

fn stateful_set(obj: &Obj) -> Health {
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

fn daemon_set(obj: &Obj) -> Health {
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

fn replica_set(obj: &Obj) -> Health {
    if generation_lags(obj) {
        return Health::new(
            Progressing,
            "Waiting for rollout to finish: observed replica set generation less than desired generation",
        );
    }
    let failure = condition(obj, "ReplicaFailure");
    if cond_status_is(failure, "True") {
        return Health::new(Degraded, cond_message(failure));
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

// ---------------------------------------------------------------------------------------------
// Pod (gitops-engine health_pod.go).

/// Waiting reasons that mean the container cannot start without a change (CrashLoopBackOff,
/// ImagePullBackOff, ErrImagePull, CreateContainerConfigError, ...), not that it is starting.
fn is_stuck_waiting_reason(reason: &str) -> bool {
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

fn pod(obj: &Obj) -> Health {
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

fn ignores_restart_policy(obj: &Obj) -> bool {
    at(obj, &["metadata", "annotations"])
        .and_then(Tree::as_object)
        .is_some_and(|a| a.contains_key(IGNORE_RESTART_POLICY_ANNOTATION))
}

/// A running long-lived pod: Healthy when Ready; Degraded when not Ready because a container
/// has already died once (OOMKilled, crashed); otherwise still starting.
fn running_pod(obj: &Obj, statuses: &[Tree], status_message: &str) -> Health {
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

// ---------------------------------------------------------------------------------------------
// Batch (gitops-engine health_job.go; argo-cd resource_customizations/batch/CronJob/health.lua).

fn job(obj: &Obj) -> Health {
    // Kubernetes only ever sets these conditions True; an explicit False is not taken as set.
    let is_set = |c: Option<&Tree>| c.is_some() && !cond_status_is(c, "False");
    let failed = condition(obj, "Failed");
    if is_set(failed) {
        return Health::new(Degraded, cond_message(failed));
    }
    let complete = condition(obj, "Complete");
    if is_set(complete) {
        return Health::new(Healthy, cond_message(complete));
    }
    let suspended = condition(obj, "Suspended");
    if cond_status_is(suspended, "True") || bool_at(obj, &["spec", "suspend"]) {
        let message = match cond_message(suspended) {
            "" => "Job is suspended",
            m => m,
        };
        return Health::new(Suspended, message);
    }
    Health::new(Progressing, "Waiting for Job to complete")
}

fn cron_job(obj: &Obj) -> Health {
    if bool_at(obj, &["spec", "suspend"]) {
        return Health::new(Suspended, "CronJob is Suspended");
    }
    let Some(status) = obj.status.filter(|s| s.is_object()) else {
        return Health::new(Progressing, "Waiting for CronJob");
    };
    // Progressing this often (on every run) bubbles up; Argo accepts that, and so do we.
    let active = list_at(status, &["active"]).len();
    if active > 0 {
        return Health::new(
            Progressing,
            format!("Waiting for {active} Jobs to complete"),
        );
    }
    // No Job running: the last run failed if it never succeeded since it was scheduled.
    // RFC 3339 UTC timestamps compare correctly as text, as Argo's Lua relies on.
    let Some(scheduled) = str_at(status, &["lastScheduleTime"]) else {
        return Health::new(Healthy, "");
    };
    match str_at(status, &["lastSuccessfulTime"]) {
        Some(succeeded) if succeeded >= scheduled => Health::new(
            Healthy,
            "CronJob has completed its last execution successfully",
        ),
        _ => Health::new(
            Degraded,
            "CronJob has not completed its last execution successfully",
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Networking and storage (gitops-engine health_service.go, health_ingress.go, health_pvc.go).
// Argo gives these no message; ours say what is awaited, or which address was assigned.

/// `status.loadBalancer.ingress`: its entry count (an entry is an assignment, as Argo counts
/// them) and the IPs or hostnames among them, for display. An entry may carry neither, e.g.
/// only `ports` or `ipMode`.
fn load_balancer_addresses<'a>(obj: &Obj<'a>) -> (usize, Vec<&'a str>) {
    let entries = list_at(obj, &["status", "loadBalancer", "ingress"]);
    let addresses = entries
        .iter()
        .filter_map(|i| str_at(i, &["ip"]).or_else(|| str_at(i, &["hostname"])))
        .filter(|a| !a.is_empty())
        .collect();
    (entries.len(), addresses)
}

/// Healthy once the load balancer has at least one entry, naming its addresses if it has any.
fn assigned(obj: &Obj, waiting: &str, label: &str) -> Health {
    match load_balancer_addresses(obj) {
        (0, _) => Health::new(Progressing, waiting),
        (_, addresses) if addresses.is_empty() => Health::new(Healthy, ""),
        (_, addresses) => Health::new(Healthy, format!("{label}: {}", addresses.join(", "))),
    }
}

fn service(obj: &Obj) -> Health {
    if str_at(obj, &["spec", "type"]) != Some("LoadBalancer") {
        return Health::new(Healthy, "");
    }
    assigned(
        obj,
        "Waiting for the load balancer to be assigned an address",
        "Load balancer address",
    )
}

fn ingress(obj: &Obj) -> Health {
    assigned(
        obj,
        "Waiting for the ingress controller to assign an address",
        "Ingress address",
    )
}

fn pvc(obj: &Obj) -> Health {
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

// ---------------------------------------------------------------------------------------------
// HorizontalPodAutoscaler (gitops-engine health_hpa.go).

pub const HPA_CONDITIONS_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/conditions";

/// (condition type, reason) pairs meaning the autoscaler cannot do its job. Argo lists
/// FailedGetScale, FailedUpdateScale, FailedGetResourceMetric and InvalidSelector; the other
/// metric sources fail the same way, so they are here too.
const HPA_DEGRADED: &[(&str, &str)] = &[
    ("AbleToScale", "FailedGetScale"),
    ("AbleToScale", "FailedUpdateScale"),
    ("ScalingActive", "FailedGetResourceMetric"),
    ("ScalingActive", "FailedGetContainerResourceMetric"),
    ("ScalingActive", "FailedGetPodsMetric"),
    ("ScalingActive", "FailedGetObjectMetric"),
    ("ScalingActive", "FailedGetExternalMetric"),
    ("ScalingActive", "InvalidSelector"),
    ("ScalingActive", "InvalidMetricSourceType"),
];

fn hpa(obj: &Obj) -> Health {
    let waiting = || Health::new(Progressing, "Waiting to Autoscale");
    // autoscaling/v2 keeps conditions in status; autoscaling/v1 only in a JSON annotation.
    let from_annotation;
    let mut conditions = list_at(obj, &["status", "conditions"]);
    if conditions.is_empty() {
        let annotation = at(obj, &["metadata", "annotations"])
            .and_then(|a| a.get(HPA_CONDITIONS_ANNOTATION))
            .and_then(Tree::as_str);
        let Some(annotation) = annotation else {
            return waiting();
        };
        from_annotation = match serde_json::from_str::<Tree>(annotation) {
            Ok(Tree::Array(list)) => list,
            Ok(_) => Box::default(),
            Err(e) => {
                return Health::new(
                    Unknown,
                    format!("failed to convert conditions annotation to typed: {e}"),
                )
            }
        };
        conditions = &from_annotation;
    }
    fn field<'c>(c: &'c Tree, f: &[&str]) -> &'c str {
        str_at(c, f).unwrap_or("")
    }
    // Unlike Argo, which returns at the first healthy condition, every condition is checked for
    // failure first: AbleToScale=True comes before ScalingActive=False in real objects, and
    // would otherwise hide an autoscaler that cannot read its metrics.
    let degraded = conditions.iter().find(|c| {
        let (kind, reason) = (field(c, &["type"]), field(c, &["reason"]));
        HPA_DEGRADED.iter().any(|(t, r)| *t == kind && *r == reason)
    });
    if let Some(c) = degraded {
        return Health::new(Degraded, cond_message(Some(c)));
    }
    let healthy = conditions.iter().find(|c| {
        matches!(
            str_at(*c, &["type"]),
            Some("AbleToScale" | "ScalingLimited")
        ) && str_at(*c, &["status"]) == Some("True")
    });
    match healthy {
        Some(c) => Health::new(Healthy, field(c, &["message"])),
        None => waiting(),
    }
}

// ---------------------------------------------------------------------------------------------
// APIService (gitops-engine health_apiservice.go).

/// Argo reports an unavailable APIService as Progressing, not Degraded: the aggregated server
/// behind it is often still starting.
fn api_service(obj: &Obj) -> Health {
    let Some(available) = condition(obj, "Available") else {
        return Health::new(Progressing, "Waiting to be processed");
    };
    let reason = cond_reason(Some(available));
    let message = str_at(available, &["message"]).unwrap_or("");
    let text = match (reason.is_empty(), message.is_empty()) {
        (false, false) => format!("{reason}: {message}"),
        (false, true) => reason.to_string(),
        _ => message.to_string(),
    };
    let status = if cond_status_is(Some(available), "True") {
        Healthy
    } else {
        Progressing
    };
    Health::new(status, text)
}

// ---------------------------------------------------------------------------------------------
// Custom resources: the kstatus conventions (Stalled / Reconciling / Ready, observedGeneration)
// that Flux, Crossplane, cert-manager and most operators follow, so a CRD needs no rule of its own.

fn custom_resource(obj: &Obj) -> Option<Health> {
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
mod tests {
    use super::*;

    /// [`super::aggregate`] over `(kind, namespace, name, health)` items.
    fn aggregate<'a>(
        items: impl IntoIterator<Item = (&'a str, Option<&'a str>, &'a str, &'a Health)>,
    ) -> Health {
        let items: Vec<_> = items.into_iter().collect();
        super::aggregate(items.iter().map(|item| Some(item.3)), |i| {
            let (kind, namespace, name, _) = items[i];
            (kind, namespace, name)
        })
    }
    use serde_json::{json, Value};

    /// A namespaced object named "web" at generation 1, with the given spec and status.
    fn obj(api_version: &str, kind: &str, spec: Value, status: Value) -> Value {
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": "web", "namespace": "default", "generation": 1},
            "spec": spec,
            "status": status,
        })
    }

    /// [`super::health`] of the whole object, checked against the same object as the resource
    /// group keeps it ([`crate::resources::object`]): a rule must not read a field left out there.
    fn health(obj: &Value) -> Option<Health> {
        let whole = super::health(&Tree::from(obj));
        let kept = crate::resources::object::parse(&obj.to_string()).expect("parse");
        assert_eq!(
            super::health(&kept),
            whole,
            "health of the kept fields of {obj}"
        );
        whole
    }

    fn check(obj: &Value, status: HealthStatus, message: Option<&str>) {
        let got = health(obj).expect("a rule should apply");
        assert_eq!(got.status, status, "status of {obj}");
        assert_eq!(got.message.as_deref(), message, "message of {obj}");
    }

    // --- dispatch, deletion, no rule -------------------------------------------------------

    #[test]
    fn deletion_in_progress_is_progressing_for_any_kind() {
        for (api, kind) in [
            ("apps/v1", "Deployment"),
            ("v1", "ConfigMap"),
            ("example.com/v1", "Widget"),
        ] {
            let mut o = obj(api, kind, json!({}), json!({}));
            o["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
            check(&o, Progressing, Some("Pending deletion"));
        }
    }

    #[test]
    fn null_deletion_timestamp_is_not_deletion() {
        let mut o = obj(
            "v1",
            "PersistentVolumeClaim",
            json!({}),
            json!({"phase": "Bound"}),
        );
        o["metadata"]["deletionTimestamp"] = Value::Null;
        check(&o, Healthy, None);
    }

    #[test]
    fn builtin_kinds_without_rule_have_no_health() {
        for (api, kind) in [
            ("v1", "ConfigMap"),
            ("v1", "Secret"),
            ("v1", "ServiceAccount"),
            ("v1", "Endpoints"),
            ("discovery.k8s.io/v1", "EndpointSlice"),
            ("rbac.authorization.k8s.io/v1", "Role"),
            ("policy/v1", "PodDisruptionBudget"),
        ] {
            assert_eq!(
                health(&obj(api, kind, json!({}), json!({}))),
                None,
                "{kind}"
            );
        }
    }

    #[test]
    fn kind_in_wrong_group_does_not_take_builtin_rule() {
        // A Knative Service is not a core Service; with no conditions it has no health.
        let o = obj(
            "serving.knative.dev/v1",
            "Service",
            json!({"type": "LoadBalancer"}),
            json!({}),
        );
        assert_eq!(health(&o), None);
    }

    #[test]
    fn status_helpers() {
        let all = [
            Healthy,
            Suspended,
            Progressing,
            HealthStatus::Missing,
            Degraded,
            Unknown,
        ];
        for pair in all.windows(2) {
            assert!(pair[0].severity() < pair[1].severity());
        }
        assert_eq!(Progressing.as_str(), "Progressing");
        assert_eq!(HealthStatus::Missing.as_str(), "Missing");
        assert_eq!(serde_json::to_value(Degraded).ok(), Some(json!("Degraded")));
    }

    // --- Deployment ------------------------------------------------------------------------

    fn deploy(spec: Value, status: Value) -> Value {
        obj("apps/v1", "Deployment", spec, status)
    }

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

    fn sts(strategy: Value, status: Value) -> Value {
        obj(
            "apps/v1",
            "StatefulSet",
            json!({"replicas": 3, "updateStrategy": strategy}),
            status,
        )
    }

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

    fn ds(strategy: &str, status: Value) -> Value {
        obj(
            "apps/v1",
            "DaemonSet",
            json!({"updateStrategy": {"type": strategy}}),
            status,
        )
    }

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

    // --- Pod -------------------------------------------------------------------------------

    fn pod_with(restart: &str, status: Value) -> Value {
        obj("v1", "Pod", json!({"restartPolicy": restart}), status)
    }

    fn waiting(reason: &str, message: &str) -> Value {
        json!({"name": "app", "ready": false, "state": {"waiting": {"reason": reason, "message": message}}})
    }

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

    // --- Job and CronJob -------------------------------------------------------------------

    fn job_with(spec: Value, conditions: Value) -> Value {
        obj("batch/v1", "Job", spec, json!({"conditions": conditions}))
    }

    #[test]
    fn job_complete_is_healthy() {
        let o = job_with(
            json!({}),
            json!([{"type": "Complete", "status": "True", "message": "done"}]),
        );
        check(&o, Healthy, Some("done"));
    }

    #[test]
    fn job_failed_is_degraded() {
        let o = job_with(
            json!({}),
            json!([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit"}]),
        );
        check(
            &o,
            Degraded,
            Some("Job has reached the specified backoff limit"),
        );
    }

    #[test]
    fn job_suspended() {
        let by_condition = job_with(
            json!({"suspend": true}),
            json!([{"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended"}]),
        );
        check(&by_condition, Suspended, Some("Job suspended"));
        let by_spec = job_with(json!({"suspend": true}), json!([]));
        check(&by_spec, Suspended, Some("Job is suspended"));
        // Resumed: the condition stays, False, and the Job is running again.
        let resumed = job_with(
            json!({}),
            json!([{"type": "Suspended", "status": "False", "reason": "JobResumed"}]),
        );
        check(&resumed, Progressing, Some("Waiting for Job to complete"));
    }

    #[test]
    fn job_running_is_progressing() {
        check(
            &job_with(json!({}), Value::Null),
            Progressing,
            Some("Waiting for Job to complete"),
        );
    }

    fn cron(spec: Value, status: Value) -> Value {
        obj("batch/v1", "CronJob", spec, status)
    }

    #[test]
    fn cronjob_suspended() {
        let o = cron(
            json!({"suspend": true}),
            json!({"lastScheduleTime": "2024-01-01T00:00:00Z"}),
        );
        check(&o, Suspended, Some("CronJob is Suspended"));
    }

    #[test]
    fn cronjob_active_is_progressing() {
        let o = cron(
            json!({}),
            json!({"active": [{"name": "web-1"}, {"name": "web-2"}]}),
        );
        check(&o, Progressing, Some("Waiting for 2 Jobs to complete"));
    }

    #[test]
    fn cronjob_last_run_failed_is_degraded() {
        let failed = cron(
            json!({}),
            json!({"lastScheduleTime": "2024-01-02T00:00:00Z", "lastSuccessfulTime": "2024-01-01T00:00:07Z"}),
        );
        check(
            &failed,
            Degraded,
            Some("CronJob has not completed its last execution successfully"),
        );
        let never = cron(
            json!({}),
            json!({"lastScheduleTime": "2024-01-02T00:00:00Z"}),
        );
        check(
            &never,
            Degraded,
            Some("CronJob has not completed its last execution successfully"),
        );
    }

    #[test]
    fn cronjob_healthy() {
        let ok = cron(
            json!({}),
            json!({"lastScheduleTime": "2024-01-02T00:00:00Z", "lastSuccessfulTime": "2024-01-02T00:00:09Z"}),
        );
        check(
            &ok,
            Healthy,
            Some("CronJob has completed its last execution successfully"),
        );
        check(&cron(json!({}), json!({})), Healthy, None);
        let no_status =
            json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "web"}});
        check(&no_status, Progressing, Some("Waiting for CronJob"));
    }

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

    // --- HPA -------------------------------------------------------------------------------

    fn hpa_with(conditions: Value) -> Value {
        obj(
            "autoscaling/v2",
            "HorizontalPodAutoscaler",
            json!({}),
            json!({"conditions": conditions}),
        )
    }

    #[test]
    fn hpa_healthy() {
        let o = hpa_with(json!([
            {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale",
             "message": "recommended size matches current size"},
            {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"},
            {"type": "ScalingLimited", "status": "False", "reason": "DesiredWithinRange"}]));
        check(&o, Healthy, Some("recommended size matches current size"));
    }

    #[test]
    fn hpa_failing_to_get_metrics_is_degraded() {
        let o = hpa_with(json!([
            {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale",
             "message": "the HPA controller was able to get the target's current scale"},
            {"type": "ScalingActive", "status": "False", "reason": "FailedGetResourceMetric",
             "message": "the HPA was unable to compute the replica count: failed to get cpu utilization"}]));
        check(
            &o,
            Degraded,
            Some("the HPA was unable to compute the replica count: failed to get cpu utilization"),
        );
    }

    #[test]
    fn hpa_without_conditions_is_waiting() {
        check(
            &hpa_with(json!([])),
            Progressing,
            Some("Waiting to Autoscale"),
        );
        let inactive = hpa_with(
            json!([{"type": "ScalingActive", "status": "False", "reason": "ScalingDisabled"}]),
        );
        check(&inactive, Progressing, Some("Waiting to Autoscale"));
    }

    #[test]
    fn hpa_v1_conditions_annotation() {
        let annotated = |annotation: &str| {
            let mut o = obj(
                "autoscaling/v1",
                "HorizontalPodAutoscaler",
                json!({}),
                json!({}),
            );
            o["metadata"]["annotations"] = json!({HPA_CONDITIONS_ANNOTATION: annotation});
            o
        };
        let failing = annotated(
            r#"[{"type":"AbleToScale","status":"False","reason":"FailedGetScale","message":"no scale subresource"}]"#,
        );
        check(&failing, Degraded, Some("no scale subresource"));
        let ok = annotated(r#"[{"type":"AbleToScale","status":"True","message":"ready"}]"#);
        check(&ok, Healthy, Some("ready"));
        let broken = health(&annotated("{not json")).expect("rule applies");
        assert_eq!(broken.status, Unknown);
        assert!(broken
            .message
            .unwrap_or_default()
            .starts_with("failed to convert conditions annotation"));
    }

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

    // --- Custom resources ------------------------------------------------------------------

    fn cr(generation: i64, status: Value) -> Value {
        let mut o = obj(
            "kustomize.toolkit.fluxcd.io/v1",
            "Kustomization",
            json!({}),
            status,
        );
        o["metadata"]["generation"] = json!(generation);
        o
    }

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

    // --- odd shapes ------------------------------------------------------------------------

    #[test]
    fn odd_shapes_never_panic() {
        let odd = [
            json!({"apiVersion": "v1", "kind": "Pod", "status": "x"}),
            json!({"apiVersion": "v1", "kind": "Pod", "spec": 7, "status": {"phase": 3,
                   "containerStatuses": "nope", "initContainerStatuses": [1, null, {"state": "x"}]}}),
            json!({"apiVersion": "v1", "kind": "Pod", "status": {"phase": "Running",
                   "containerStatuses": [{"lastState": {"terminated": null}}, {"lastState": {"terminated": {}}}]}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": "m", "spec": {"replicas": "3"}, "status": []}),
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": null}},
                   "status": {"observedGeneration": 1}}),
            json!({"apiVersion": "batch/v1", "kind": "Job", "status": {"conditions": {"type": "Failed"}}}),
            json!({"apiVersion": "batch/v1", "kind": "CronJob", "spec": null, "status": {"active": 1, "lastScheduleTime": 5}}),
            json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
                   "metadata": {"annotations": {HPA_CONDITIONS_ANNOTATION: "{\"type\":1}"}}}),
            json!({"apiVersion": "v1", "kind": "Service", "spec": {"type": "LoadBalancer"},
                   "status": {"loadBalancer": {"ingress": [42]}}}),
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "status": {"conditions": [null, "Ready", {"type": 1}]}}),
            json!({"apiVersion": 1, "kind": "Pod"}),
            json!({"kind": 5}),
            json!("just a string"),
            json!(null),
            json!([]),
        ];
        for o in &odd {
            let _ = health(o);
        }
        check(&odd[0], Unknown, None);
        // A restart with an empty termination record still counts, as in Argo.
        check(
            &odd[2],
            Degraded,
            Some("container \"\" last terminated: exit code 0"),
        );
        // Wrongly typed fields read as zero values: nothing is rolling out.
        check(&odd[3], Healthy, None);
    }

    // --- aggregate -------------------------------------------------------------------------

    #[test]
    fn aggregate_empty_is_healthy() {
        assert_eq!(
            aggregate(std::iter::empty()),
            Health {
                status: Healthy,
                message: None
            }
        );
    }

    #[test]
    fn aggregate_all_healthy_has_no_message() {
        let ok = Health::new(Healthy, "fine");
        let got = aggregate([
            ("Service", Some("default"), "web", &ok),
            ("Pod", Some("default"), "web-1", &ok),
        ]);
        assert_eq!(
            got,
            Health {
                status: Healthy,
                message: None
            }
        );
    }

    #[test]
    fn aggregate_picks_worst_by_severity() {
        let suspended = Health::new(Suspended, "Deployment is paused");
        let progressing = Health::new(Progressing, "Waiting for 1 pods to be ready...");
        let unknown = Health::new(Unknown, "");
        let got = aggregate([
            ("Deployment", Some("default"), "api", &suspended),
            ("StatefulSet", Some("default"), "db", &progressing),
        ]);
        assert_eq!(got.status, Progressing);
        assert_eq!(
            got.message.as_deref(),
            Some("Caused by StatefulSet default/db: Waiting for 1 pods to be ready...")
        );
        let got = aggregate([
            ("Pod", Some("default"), "a", &progressing),
            ("APIService", None, "v1beta1.metrics.k8s.io", &unknown),
            ("Deployment", Some("default"), "api", &suspended),
        ]);
        assert_eq!(got.status, Unknown);
        assert_eq!(
            got.message.as_deref(),
            Some("Caused by APIService v1beta1.metrics.k8s.io")
        );
    }

    #[test]
    fn aggregate_names_three_causes_and_counts_the_rest() {
        let deadline = Health::new(
            Degraded,
            "Deployment \"web\" exceeded its progress deadline",
        );
        let crash = Health::new(Degraded, "back-off 5m0s restarting failed container=app");
        let oom = Health::new(Degraded, "OOMKilled");
        let progressing = Health::new(Progressing, "Waiting to Autoscale");
        let got = aggregate([
            (
                "HorizontalPodAutoscaler",
                Some("default"),
                "web",
                &progressing,
            ),
            ("Deployment", Some("default"), "web", &deadline),
            ("Pod", Some("default"), "web-1", &crash),
            ("Pod", Some("default"), "web-2", &oom),
            ("Pod", Some("default"), "web-3", &crash),
            ("Pod", Some("default"), "web-4", &crash),
        ]);
        assert_eq!(got.status, Degraded);
        assert_eq!(
            got.message.as_deref(),
            Some(
                "Caused by Deployment default/web: Deployment \"web\" exceeded its progress deadline; \
                 Pod default/web-1: back-off 5m0s restarting failed container=app; \
                 Pod default/web-2: OOMKilled; and 2 more"
            )
        );
    }

    #[test]
    fn aggregate_of_real_health_results() {
        let deleting = {
            let mut o = obj("v1", "ConfigMap", json!({}), json!({}));
            o["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
            o
        };
        let lost = obj(
            "v1",
            "PersistentVolumeClaim",
            json!({}),
            json!({"phase": "Lost"}),
        );
        let (a, b) = (
            health(&deleting).expect("deleting"),
            health(&lost).expect("pvc"),
        );
        let got = aggregate([
            ("ConfigMap", Some("default"), "cfg", &a),
            ("PersistentVolumeClaim", Some("default"), "data", &b),
        ]);
        assert_eq!(got.status, Degraded);
        assert_eq!(
            got.message.as_deref(),
            Some("Caused by PersistentVolumeClaim default/data: The claim's bound volume no longer exists")
        );
    }

    // --- coverage: the rules and edge cases not pinned above ---------------------------------

    /// (what, object, expected status, expected message) for every remaining branch.
    fn more_fixtures() -> Vec<(&'static str, Value, HealthStatus, Option<&'static str>)> {
        let complete = json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2});
        let deadline = json!([{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]);
        let with_annotation = |mut o: Value, key: &str, value: &str| {
            o["metadata"]["annotations"] = json!({ key: value });
            o
        };
        vec![
            // Deployment
            ("deployment without spec.replicas", deploy(json!({}), complete.clone()), Healthy, None),
            ("extensions/v1beta1 deployment", obj("extensions/v1beta1", "Deployment", json!({"replicas": 2}), complete.clone()), Healthy, None),
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
            ("extensions/v1beta1 daemonset",
             obj("extensions/v1beta1", "DaemonSet", json!({}), json!({"observedGeneration": 1, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2, "numberAvailable": 2})),
             Healthy, None),
            ("daemonset generation lag beats OnDelete",
             ds("OnDelete", json!({"observedGeneration": 0})),
             Progressing, Some("Waiting for rollout to finish: observed daemon set generation less than desired generation")),
            // ReplicaSet
            ("replica failure False is not a failure",
             obj("apps/v1", "ReplicaSet", json!({"replicas": 1}), json!({"observedGeneration": 1, "availableReplicas": 1,
                 "conditions": [{"type": "ReplicaFailure", "status": "False", "message": "old"}]})),
             Healthy, None),
            ("replica failure without message names its reason",
             obj("extensions/v1beta1", "ReplicaSet", json!({"replicas": 1}), json!({"observedGeneration": 1,
                 "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate"}]})),
             Degraded, Some("FailedCreate")),
            // Pod
            ("crash loop without message names its reason",
             pod_with("Always", json!({"phase": "Running", "containerStatuses": [waiting("CrashLoopBackOff", "")]})),
             Degraded, Some("CrashLoopBackOff")),
            ("config error",
             pod_with("Always", json!({"phase": "Pending", "containerStatuses": [
                 waiting("CreateContainerConfigError", "secret \"db\" not found")]})),
             Degraded, Some("secret \"db\" not found")),
            ("container creating is not stuck",
             pod_with("Always", json!({"phase": "Pending", "containerStatuses": [waiting("ContainerCreating", "")]})),
             Progressing, None),
            ("restartPolicy defaults to Always",
             obj("v1", "Pod", json!({}), json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})),
             Healthy, None),
            ("running, not ready, with a status message",
             pod_with("Always", json!({"phase": "Running", "message": "probing",
                 "conditions": [{"type": "Ready", "status": "False", "message": "containers with unready status: [app]"}]})),
             Progressing, Some("probing")),
            ("restarted, with a status message",
             pod_with("Always", json!({"phase": "Running", "message": "node pressure",
                 "containerStatuses": [{"name": "app", "lastState": {"terminated": {"exitCode": 1}}}]})),
             Degraded, Some("node pressure")),
            ("restarted with an exit code only",
             pod_with("Always", json!({"phase": "Running",
                 "containerStatuses": [{"name": "app", "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "panic: boom"}}}]})),
             Degraded, Some("container \"app\" last terminated: panic: boom")),
            ("failed: terminated message first",
             pod_with("Never", json!({"phase": "Failed", "containerStatuses": [
                 {"name": "app", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "killed"}}}]})),
             Degraded, Some("killed")),
            ("ignore-restart-policy: a running OnFailure pod is judged as long-lived",
             with_annotation(pod_with("OnFailure", json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})),
                 IGNORE_RESTART_POLICY_ANNOTATION, "true"),
             Healthy, None),
            ("ignore-restart-policy: a restarted Never pod is degraded",
             with_annotation(pod_with("Never", json!({"phase": "Running",
                 "containerStatuses": [{"name": "app", "lastState": {"terminated": {"reason": "OOMKilled"}}}]})),
                 IGNORE_RESTART_POLICY_ANNOTATION, ""),
             Degraded, Some("container \"app\" last terminated: OOMKilled")),
            ("pod without phase", pod_with("Always", json!({})), Unknown, None),
            // Job
            ("failed job without message names its reason",
             job_with(json!({}), json!([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}])),
             Degraded, Some("DeadlineExceeded")),
            ("failed beats complete",
             job_with(json!({}), json!([{"type": "Complete", "status": "True"}, {"type": "Failed", "status": "True", "message": "x"}])),
             Degraded, Some("x")),
            ("complete without message", job_with(json!({}), json!([{"type": "Complete", "status": "True"}])), Healthy, None),
            ("a suspended job that already failed stays failed",
             job_with(json!({"suspend": true}), json!([{"type": "Failed", "status": "True", "message": "x"}])),
             Degraded, Some("x")),
            // CronJob
            ("suspended beats active",
             cron(json!({"suspend": true}), json!({"active": [{"name": "a"}]})),
             Suspended, Some("CronJob is Suspended")),
            ("active beats a failed last run",
             cron(json!({}), json!({"active": [{"name": "a"}], "lastScheduleTime": "2024-01-02T00:00:00Z"})),
             Progressing, Some("Waiting for 1 Jobs to complete")),
            // Service and Ingress
            ("node port service", obj("v1", "Service", json!({"type": "NodePort"}), json!({})), Healthy, None),
            ("service without type", obj("v1", "Service", json!({}), json!({})), Healthy, None),
            ("load balancer with an empty ingress list",
             obj("v1", "Service", json!({"type": "LoadBalancer"}), json!({"loadBalancer": {"ingress": []}})),
             Progressing, Some("Waiting for the load balancer to be assigned an address")),
            ("load balancer without status",
             json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {"type": "LoadBalancer"}}),
             Progressing, Some("Waiting for the load balancer to be assigned an address")),
            ("load balancer entry without ip or hostname is an assignment, with nothing to name",
             obj("v1", "Service", json!({"type": "LoadBalancer"}), json!({"loadBalancer": {"ingress": [{"ports": [{"port": 80}]}]}})),
             Healthy, None),
            ("ingress without status",
             json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web"}}),
             Progressing, Some("Waiting for the ingress controller to assign an address")),
            ("ingress with a hostname",
             obj("networking.k8s.io/v1", "Ingress", json!({}), json!({"loadBalancer": {"ingress": [{"hostname": "lb.example.com"}, {"ip": ""}]}})),
             Healthy, Some("Ingress address: lb.example.com")),
            // HPA
            ("hpa cannot get its target's scale",
             hpa_with(json!([{"type": "AbleToScale", "status": "False", "reason": "FailedGetScale", "message": "deployments/scale.apps \"web\" not found"}])),
             Degraded, Some("deployments/scale.apps \"web\" not found")),
            ("hpa with an invalid selector",
             hpa_with(json!([{"type": "AbleToScale", "status": "True", "message": "ok"},
                             {"type": "ScalingActive", "status": "False", "reason": "InvalidSelector", "message": "bad selector"}])),
             Degraded, Some("bad selector")),
            ("hpa failing on an external metric",
             hpa_with(json!([{"type": "ScalingActive", "status": "False", "reason": "FailedGetExternalMetric", "message": "no metric"}])),
             Degraded, Some("no metric")),
            ("hpa limited by its bounds",
             hpa_with(json!([{"type": "ScalingLimited", "status": "True", "reason": "TooManyReplicas", "message": "the desired replica count is more than the maximum replica count"}])),
             Healthy, Some("the desired replica count is more than the maximum replica count")),
            ("hpa able to scale False (backoff) is waiting",
             hpa_with(json!([{"type": "AbleToScale", "status": "False", "reason": "BackoffBoth"}])),
             Progressing, Some("Waiting to Autoscale")),
            ("autoscaling/v1 without the annotation",
             obj("autoscaling/v1", "HorizontalPodAutoscaler", json!({}), json!({"currentReplicas": 1})),
             Progressing, Some("Waiting to Autoscale")),
            ("autoscaling/v1 with no conditions in the annotation",
             with_annotation(obj("autoscaling/v1", "HorizontalPodAutoscaler", json!({}), json!({})), HPA_CONDITIONS_ANNOTATION, "[]"),
             Progressing, Some("Waiting to Autoscale")),
            // APIService
            ("apiservice available without reason or message",
             obj("apiregistration.k8s.io/v1", "APIService", json!({}), json!({"conditions": [{"type": "Available", "status": "True"}]})),
             Healthy, None),
            ("apiservice with a message only",
             obj("apiregistration.k8s.io/v1beta1", "APIService", json!({}), json!({"conditions": [{"type": "Available", "status": "False", "message": "no endpoints"}]})),
             Progressing, Some("no endpoints")),
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

    /// Small builders for the fixtures above.
    trait Tap {
        fn tap_generation(self, generation: i64) -> Self;
        fn tap_deleted(self) -> Self;
    }

    impl Tap for Value {
        fn tap_generation(mut self, generation: i64) -> Self {
            self["metadata"]["generation"] = json!(generation);
            self
        }

        fn tap_deleted(mut self) -> Self {
            self["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
            self
        }
    }

    #[test]
    fn every_remaining_branch() {
        for (what, o, status, message) in more_fixtures() {
            let got = health(&o).unwrap_or_else(|| panic!("{what}: a rule should apply"));
            assert_eq!(
                (got.status, got.message.as_deref()),
                (status, message),
                "{what}"
            );
        }
    }

    #[test]
    fn every_kind_with_a_rule_reaches_every_status_it_can() {
        // Which statuses each built-in rule can give, as the fixtures of this module show; a
        // rule that loses a branch fails here.
        let mut fixtures: Vec<Value> = more_fixtures().into_iter().map(|f| f.1).collect();
        fixtures.extend([
            deploy(json!({"replicas": 1}), json!({"observedGeneration": 0})),
            deploy(json!({"replicas": 3}), json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3})),
            deploy(json!({"replicas": 1}), json!({"observedGeneration": 1, "conditions": [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}]})),
            sts(json!({"type": "RollingUpdate"}), json!({})),
            ds("RollingUpdate", json!({"observedGeneration": 0})),
            obj("apps/v1", "ReplicaSet", json!({"replicas": 2}), json!({})),
            pod_with("Never", json!({"phase": "Failed"})),
            pod_with("Never", json!({"phase": "Succeeded"})),
            job_with(json!({}), Value::Null),
            job_with(json!({"suspend": true}), json!([])),
            cron(json!({}), json!({})),
            cron(json!({}), json!({"lastScheduleTime": "2024-01-02T00:00:00Z"})),
            obj("v1", "PersistentVolumeClaim", json!({}), json!({"phase": "Bound"})),
            obj("v1", "PersistentVolumeClaim", json!({}), json!({"phase": "Pending"})),
            obj("v1", "PersistentVolumeClaim", json!({}), json!({"phase": "Lost"})),
            obj("v1", "PersistentVolumeClaim", json!({}), json!({})),
            obj("autoscaling/v2", "HorizontalPodAutoscaler", json!({}), json!({"conditions": [{"type": "AbleToScale", "status": "True"}]})),
            obj("apiregistration.k8s.io/v1", "APIService", json!({}), json!({})),
            cr(1, json!({"conditions": [{"type": "Ready", "status": "False"}]})),
        ]);
        let mut seen: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
            Default::default();
        for o in &fixtures {
            let tree = Tree::from(o);
            if is_being_deleted(&tree) {
                continue;
            }
            if let (Some(kind), Some(h)) = (o["kind"].as_str(), health(o)) {
                let group = api_group(&tree);
                let kind = if group.contains('.') && !group.ends_with("k8s.io") {
                    "custom resource"
                } else {
                    kind
                };
                seen.entry(kind).or_default().insert(h.status.as_str());
            }
        }
        let expect = |kind: &str, statuses: &[&str]| {
            let got: Vec<&str> = seen.get(kind).into_iter().flatten().copied().collect();
            let mut want = statuses.to_vec();
            want.sort_unstable();
            assert_eq!(got, want, "{kind}");
        };
        expect(
            "Deployment",
            &["Healthy", "Progressing", "Degraded", "Suspended"],
        );
        expect("StatefulSet", &["Healthy", "Progressing"]);
        expect("DaemonSet", &["Healthy", "Progressing"]);
        expect("ReplicaSet", &["Healthy", "Progressing", "Degraded"]);
        expect("Pod", &["Healthy", "Progressing", "Degraded", "Unknown"]);
        expect("Job", &["Healthy", "Progressing", "Degraded", "Suspended"]);
        expect(
            "CronJob",
            &["Healthy", "Progressing", "Degraded", "Suspended"],
        );
        expect(
            "PersistentVolumeClaim",
            &["Healthy", "Progressing", "Degraded", "Unknown"],
        );
        expect("Service", &["Healthy", "Progressing"]);
        expect("Ingress", &["Healthy", "Progressing"]);
        expect(
            "HorizontalPodAutoscaler",
            &["Healthy", "Progressing", "Degraded"],
        );
        expect("APIService", &["Healthy", "Progressing"]);
        expect("custom resource", &["Healthy", "Progressing", "Degraded"]);
    }

    #[test]
    fn more_kinds_without_rule() {
        for (api, kind) in [
            ("v1", "Namespace"),
            ("v1", "Node"),
            ("v1", "PersistentVolume"),
            ("v1", "ResourceQuota"),
            ("storage.k8s.io/v1", "StorageClass"),
            ("networking.k8s.io/v1", "NetworkPolicy"),
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
            (
                "admissionregistration.k8s.io/v1",
                "ValidatingWebhookConfiguration",
            ),
            ("scheduling.k8s.io/v1", "PriorityClass"),
            // A rule's kind in another built-in group is not that kind.
            ("apps/v1", "Pod"),
            ("batch/v1", "Deployment"),
            ("autoscaling/v1", "Ingress"),
        ] {
            // Even with conditions that a custom resource would be judged by.
            let o = obj(
                api,
                kind,
                json!({}),
                json!({"conditions": [{"type": "Ready", "status": "False"}]}),
            );
            assert_eq!(health(&o), None, "{api} {kind}");
        }
        // No kind at all: nothing to judge.
        assert_eq!(
            health(&json!({"apiVersion": "v1", "metadata": {"name": "x"}})),
            None
        );
    }

    #[test]
    fn aggregate_orders_every_pair() {
        let order = [
            Healthy,
            Suspended,
            Progressing,
            HealthStatus::Missing,
            Degraded,
            Unknown,
        ];
        for (i, &better) in order.iter().enumerate() {
            for &worse in &order[i + 1..] {
                let (b, w) = (Health::new(better, "b"), Health::new(worse, "w"));
                for items in [
                    [("Pod", Some("ns"), "b", &b), ("Pod", Some("ns"), "w", &w)],
                    [("Pod", Some("ns"), "w", &w), ("Pod", Some("ns"), "b", &b)],
                ] {
                    let got = aggregate(items);
                    assert_eq!(got.status, worse, "{better:?} vs {worse:?}");
                    assert_eq!(got.message.as_deref(), Some("Caused by Pod ns/w: w"));
                }
            }
        }
    }

    #[test]
    fn aggregate_names_exactly_three_without_a_count_and_describes_bare_causes() {
        let missing = Health::new(HealthStatus::Missing, "");
        let degraded = Health::new(Degraded, "");
        let got = aggregate([
            ("Deployment", Some("ns"), "a", &missing),
            ("APIService", None, "v1.x", &degraded),
            ("PersistentVolumeClaim", Some(""), "data", &degraded),
            ("Pod", Some("ns"), "p", &degraded),
        ]);
        assert_eq!(got.status, Degraded);
        assert_eq!(
            got.message.as_deref(),
            Some("Caused by APIService v1.x; PersistentVolumeClaim data; Pod ns/p")
        );
        let one_more = Health::new(Degraded, "x");
        let got = aggregate([
            ("Pod", Some("ns"), "1", &one_more),
            ("Pod", Some("ns"), "2", &one_more),
            ("Pod", Some("ns"), "3", &one_more),
            ("Pod", Some("ns"), "4", &one_more),
        ]);
        assert_eq!(
            got.message.as_deref(),
            Some("Caused by Pod ns/1: x; Pod ns/2: x; Pod ns/3: x; and 1 more")
        );
    }
}
