//! Argo CD-style health of live Kubernetes objects.
//!
//! Pure functions over objects as [`Tree`]s, following the built-in rules of Argo CD's
//! gitops-engine (`pkg/health`) and its `resource_customizations` Lua for CronJob, so that a
//! GitLab user sees the verdict Argo CD would show for the same object. Messages reuse Argo's
//! wording where it has one. Objects come straight from the cluster and may be partial or odd:
//! every field is read through an optional accessor and a missing one takes the Kubernetes zero
//! value, so no input can panic.

mod api_service;
mod argo_workflows;
mod autoscaling;
mod batch;
mod custom;
pub(crate) mod fields;
mod lua;
mod networking;
mod pods;
mod storage;
#[cfg(test)]
mod testing;
mod workloads;

use super::tree::Tree;
use fields::*;
use HealthStatus::{Healthy, Progressing, Unknown};

pub use lua::Customizations;

pub use autoscaling::HPA_CONDITIONS_ANNOTATION;
pub(crate) use autoscaling::HPA_DEGRADED;
pub(crate) use pods::is_stuck_waiting_reason;
pub use pods::{HELM_HOOK_ANNOTATION, HOOK_ANNOTATION, IGNORE_RESTART_POLICY_ANNOTATION};

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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    builtin(&Obj::new(value))
}

/// The health of one object by the user's script for its kind ([`Customizations`]), or else by
/// the built-in rules ([`health`]). A script reads any field, so `whole` gives the whole object
/// (`value` may hold only some fields); it is asked only when a script applies.
pub fn health_with(
    value: &Tree,
    whole: impl FnOnce() -> Option<serde_json::Value>,
    custom: &Customizations,
) -> Option<Health> {
    let obj = &Obj::new(value);
    if custom.is_empty() {
        return builtin(obj);
    }
    let script = str_at(obj, &["kind"]).and_then(|kind| custom.script_for(api_group(obj), kind));
    match script {
        None => builtin(obj),
        // As in Argo CD, deletion comes before any script.
        Some(_) if is_being_deleted(obj) => Some(Health::new(Progressing, "Pending deletion")),
        Some(script) => match whole() {
            Some(object) => custom.run(script, &object),
            None => Some(Health::new(Unknown, "the object could not be read")),
        },
    }
}

fn builtin(obj: &Obj) -> Option<Health> {
    if is_being_deleted(obj) {
        return Some(Health::new(Progressing, "Pending deletion"));
    }
    let kind = str_at(obj, &["kind"])?;
    // (rule, the versions Argo's typed rule reads, the kind as its error names it); `None`:
    // any version (Argo reads those objects untyped, or by a script).
    type Rule = fn(&Obj) -> Health;
    let (rule, versions, word): (Rule, Option<&[&str]>, &str) = match (api_group(obj), kind) {
        ("apps", "Deployment") => (workloads::deployment, Some(&["v1"]), kind),
        ("apps", "StatefulSet") => (workloads::stateful_set, Some(&["v1"]), kind),
        ("apps", "DaemonSet") => (workloads::daemon_set, Some(&["v1"]), kind),
        ("apps", "ReplicaSet") => (workloads::replica_set, Some(&["v1"]), kind),
        ("", "Pod") => (pods::pod, Some(&["v1"]), kind),
        ("", "Service") => (networking::service, Some(&["v1"]), kind),
        ("", "PersistentVolumeClaim") => (storage::pvc, Some(&["v1"]), kind),
        ("batch", "Job") => (batch::job, Some(&["v1"]), kind),
        ("batch", "CronJob") => (batch::cron_job, None, kind),
        ("networking.k8s.io" | "extensions", "Ingress") => (networking::ingress, None, kind),
        ("autoscaling", "HorizontalPodAutoscaler") => {
            (autoscaling::hpa, Some(&["v1", "v2"]), "HPA")
        }
        ("apiregistration.k8s.io", "APIService") => {
            (api_service::api_service, Some(&["v1", "v1beta1"]), kind)
        }
        ("argoproj.io", "Workflow") => (argo_workflows::workflow, None, kind),
        // `extensions` Deployments, DaemonSets and ReplicaSets included: Argo gives them none.
        (group, _) if BUILTIN_GROUPS.contains(&group) => return None,
        _ => return custom::custom_resource(obj),
    };
    if let Some(versions) = versions {
        let version = api_version(obj);
        if !versions.contains(&version) {
            // gitops-engine's error for a version its typed structs do not read, with the
            // group/version/kind as Go's `schema.GroupVersionKind` prints it.
            let group = api_group(obj);
            return Some(Health::new(
                Unknown,
                format!("unsupported {word} GVK: {group}/{version}, Kind={kind}"),
            ));
        }
    }
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

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::testing::*;
    use super::testing::{aggregate, health};
    use super::*;
    use crate::resources::tree::TreeBuf;
    use HealthStatus::*;

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
    fn extensions_workloads_have_no_health_but_its_ingress_has() {
        for kind in ["Deployment", "DaemonSet", "ReplicaSet"] {
            let o = obj(
                "extensions/v1beta1",
                kind,
                json!({"replicas": 1}),
                json!({}),
            );
            assert_eq!(health(&o), None, "{kind}");
        }
        let ingress = obj("extensions/v1beta1", "Ingress", json!({}), json!({}));
        assert_eq!(health(&ingress).map(|h| h.status), Some(Progressing));
    }

    #[test]
    fn versions_the_typed_rules_do_not_read_are_unknown() {
        for (api, kind, word) in [
            ("apps/v1beta1", "Deployment", "Deployment"),
            ("apps/v1beta2", "StatefulSet", "StatefulSet"),
            ("apps/v1beta2", "DaemonSet", "DaemonSet"),
            ("apps/v1beta2", "ReplicaSet", "ReplicaSet"),
            ("v2", "Pod", "Pod"),
            ("v1beta1", "Service", "Service"),
            ("v2", "PersistentVolumeClaim", "PersistentVolumeClaim"),
            ("batch/v1beta1", "Job", "Job"),
            ("autoscaling/v2beta2", "HorizontalPodAutoscaler", "HPA"),
            ("apiregistration.k8s.io/v2", "APIService", "APIService"),
        ] {
            let (group, version) = api.rsplit_once('/').unwrap_or(("", api));
            let message = format!("unsupported {word} GVK: {group}/{version}, Kind={kind}");
            check(
                &obj(api, kind, json!({}), json!({})),
                Unknown,
                Some(&message),
            );
        }
        // Read untyped (or by a script), any version.
        for (api, kind) in [
            ("networking.k8s.io/v1beta1", "Ingress"),
            ("argoproj.io/v1beta1", "Workflow"),
            ("batch/v1beta1", "CronJob"),
        ] {
            let h = health(&obj(api, kind, json!({}), json!({}))).expect("a rule applies");
            assert_ne!(h.status, Unknown, "{kind}");
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
    // --- odd shapes ------------------------------------------------------------------------

    #[test]
    fn odd_shapes_never_panic() {
        let odd = [
            json!({"apiVersion": "v1", "kind": "Pod", "status": "x"}),
            json!({"apiVersion": "v1", "kind": "Pod", "spec": 7, "status": {"phase": 3,
                   "containerStatuses": "nope", "initContainerStatuses": [1, null, {"state": "x"}]}}),
            json!({"apiVersion": "v1", "kind": "Pod", "spec": {"restartPolicy": "Always"}, "status": {"phase": "Running",
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
        check(&odd[2], Degraded, None);
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

    #[test]
    fn every_kind_with_a_rule_reaches_every_status_it_can() {
        // Which statuses each built-in rule can give, as the fixtures of this module show; a
        // rule that loses a branch fails here.
        let families = [
            workloads::tests::fixtures(),
            pods::tests::fixtures(),
            batch::tests::fixtures(),
            networking::tests::fixtures(),
            autoscaling::tests::fixtures(),
            api_service::tests::fixtures(),
            custom::tests::fixtures(),
            argo_workflows::tests::fixtures(),
        ];
        let mut fixtures: Vec<Value> = families.into_iter().flatten().map(|f| f.1).collect();
        fixtures.extend([
            deploy(json!({"replicas": 1}), json!({"observedGeneration": 0})),
            deploy(json!({"replicas": 3}), json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3})),
            deploy(json!({"replicas": 1}), json!({"observedGeneration": 1, "conditions": [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}]})),
            sts(json!({"type": "RollingUpdate"}), json!({})),
            ds("RollingUpdate", json!({"observedGeneration": 0})),
            ds("RollingUpdate", json!({"observedGeneration": 1, "desiredNumberScheduled": 1, "updatedNumberScheduled": 1, "numberAvailable": 1})),
            obj("apps/v1", "ReplicaSet", json!({"replicas": 2}), json!({})),
            pod_with("Never", json!({"phase": "Failed"})),
            pod_with("Never", json!({"phase": "Succeeded"})),
            job_with(json!({}), Value::Null),
            job_with(json!({"suspend": true}), json!([])),
            job_with(json!({"suspend": true}), json!([{"type": "Suspended", "status": "True"}])),
            cron(json!({}), json!({})),
            cron(json!({}), json!({"lastScheduleTime": "2024-01-02T00:00:00Z"})),
            cron(json!({}), serde_json::Value::Null),
            cron(json!({}), json!({"lastScheduleTime": "2024-01-02T00:00:00Z", "lastSuccessfulTime": "2024-01-01T00:00:00Z"})),
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
            let tree = TreeBuf::from(o);
            if is_being_deleted(&tree) {
                continue;
            }
            if let (Some(kind), Some(h)) = (o["kind"].as_str(), health(o)) {
                let group = api_group(&tree);
                let kind =
                    if group.contains('.') && !group.ends_with("k8s.io") && kind != "Workflow" {
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
            &["Healthy", "Progressing", "Degraded", "Suspended", "Unknown"],
        );
        expect("StatefulSet", &["Healthy", "Progressing"]);
        expect("DaemonSet", &["Healthy", "Progressing", "Unknown"]);
        expect("ReplicaSet", &["Healthy", "Progressing", "Degraded"]);
        expect("Pod", &["Healthy", "Progressing", "Degraded", "Unknown"]);
        expect(
            "Job",
            &["Healthy", "Progressing", "Degraded", "Suspended", "Unknown"],
        );
        expect(
            "CronJob",
            &["Healthy", "Progressing", "Degraded", "Unknown"],
        );
        expect(
            "PersistentVolumeClaim",
            &["Healthy", "Progressing", "Degraded", "Unknown"],
        );
        expect("Service", &["Healthy", "Progressing"]);
        expect("Ingress", &["Healthy", "Progressing"]);
        expect(
            "HorizontalPodAutoscaler",
            &["Healthy", "Progressing", "Degraded", "Unknown"],
        );
        expect("APIService", &["Healthy", "Progressing", "Unknown"]);
        expect("custom resource", &["Healthy", "Progressing", "Degraded"]);
        expect(
            "Workflow",
            &["Healthy", "Progressing", "Degraded", "Unknown"],
        );
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
