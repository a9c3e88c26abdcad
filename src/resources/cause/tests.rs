//! A fixture per reason, written as the kubelet, the scheduler and the controllers write their
//! statuses and Events, assembled into a group as a listing is ([`group::assemble`]: the
//! objects parsed to the fields the group keeps), and the cause asserted by its path and its
//! sentence.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::{causes, Cause, Explained, PreviousLog};
use crate::resources::group::{self, ResourceGroup};
use crate::resources::health::Customizations;
use crate::resources::listing::{Listing, ResourceEvent};
use crate::resources::object::Object;

const NS: &str = "shop";

/// The group of `objects` (by uid: their Events, most recent first).
fn group(objects: &[Value], events: &[(&str, Vec<ResourceEvent>)]) -> ResourceGroup {
    let listed = objects
        .iter()
        .map(|o| {
            let text = RawValue::from_string(o.to_string()).unwrap();
            Arc::new(Object::parse(&text, "", "").unwrap())
        })
        .collect();
    group::assemble(
        Listing {
            namespace: NS.into(),
            selected: listed,
            events: events
                .iter()
                .map(|(uid, e)| (uid.to_string(), e.clone()))
                .collect::<HashMap<_, _>>(),
            ..Listing::default()
        },
        &Customizations::default(),
    )
}

/// The only cause of the group, with its path as `Kind/name`.
fn only_cause(group: &ResourceGroup) -> (Cause, Vec<String>) {
    let mut all = causes(group);
    assert_eq!(all.len(), 1, "{all:#?}");
    let cause = all.remove(0);
    let path = cause
        .path
        .iter()
        .map(|&i| format!("{}/{}", group.resources[i].kind, group.resources[i].name))
        .collect();
    (cause, path)
}

fn event(kind: &str, reason: &str, message: &str, source: &str) -> ResourceEvent {
    ResourceEvent {
        event_type: kind.into(),
        reason: reason.into(),
        message: message.into(),
        count: 1,
        first_seen: None,
        last_seen: None,
        source: Some(source.into()),
    }
}

fn meta(name: &str, uid: &str) -> Value {
    json!({"name": name, "namespace": NS, "uid": uid, "generation": 1})
}

fn owned_by(mut object: Value, kind: &str, owner: &Value) -> Value {
    object["metadata"]["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": kind, "controller": true,
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
    }]);
    object
}

/// A Deployment of one replica whose rollout has not finished (or is past its deadline).
fn deployment(name: &str, progressing: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name, &format!("d-{name}")),
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}}},
        "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                   "unavailableReplicas": 1, "conditions": [
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
             "message": "Deployment does not have minimum availability."},
            progressing]},
    })
}

fn rolling_out(name: &str) -> Value {
    deployment(
        name,
        json!({"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
               "message": format!("ReplicaSet \"{name}-7f9c4\" is progressing.")}),
    )
}

fn replica_set(owner: &Value, name: &str, conditions: Value) -> Value {
    let app = owner["metadata"]["name"].as_str().unwrap();
    owned_by(
        json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta(name, &format!("rs-{name}")),
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                     "template": {"metadata": {"labels": {"app": app, "pod-template-hash": "7f9c4"}}}},
            "status": {"observedGeneration": 1, "replicas": 0, "conditions": conditions},
        }),
        "ReplicaSet",
        owner,
    )
}

/// A Pod of `owner` with the given status; `restartPolicy: Always`.
fn pod(owner: &Value, name: &str, status: Value) -> Value {
    let app = owner["spec"]["selector"]["matchLabels"]["app"].clone();
    let kind = owner["kind"].as_str().unwrap().to_owned();
    let mut pod = owned_by(
        json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": meta(name, &format!("p-{name}")),
            "spec": {"restartPolicy": "Always", "containers": [{"name": "web"}]},
            "status": status,
        }),
        &kind,
        owner,
    );
    pod["metadata"]["labels"] = json!({"app": app, "pod-template-hash": "7f9c4"});
    pod
}

/// A Deployment `api`, its ReplicaSet `api-7f9c4` and its Pod `api-7f9c4-x2kq`, whose one
/// container `web` of `registry/api:1.4.2` has `state` and `last` (its `lastState`).
fn api_with_container(state: Value, last: Value, phase: &str, ready: bool) -> Vec<Value> {
    let d = rolling_out("api");
    let rs = replica_set(&d, "api-7f9c4", json!([]));
    let p = pod(
        &rs,
        "api-7f9c4-x2kq",
        json!({
            "phase": phase,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": if ready { "True" } else { "False" },
                 "reason": "ContainersNotReady",
                 "message": "containers with unready status: [web]"},
            ],
            "containerStatuses": [{
                "name": "web", "image": "registry/api:1.4.2", "imageID": "",
                "ready": ready, "restartCount": 5, "started": false,
                "state": state, "lastState": last,
            }],
        }),
    );
    vec![d, rs, p]
}

const POD_UID: &str = "p-api-7f9c4-x2kq";

#[test]
fn image_pull_back_off_names_the_image_and_the_pull_error() {
    let objects = api_with_container(
        json!({"waiting": {"reason": "ImagePullBackOff",
                           "message": "Back-off pulling image \"registry/api:1.4.2\""}}),
        json!({}),
        "Pending",
        false,
    );
    let pulled = "Failed to pull image \"registry/api:1.4.2\": rpc error: code = NotFound desc = \
                  failed to pull and unpack image \"registry/api:1.4.2\": failed to resolve \
                  reference \"registry/api:1.4.2\": registry/api:1.4.2: not found";
    // The kubelet's Events, most recent first.
    let events = vec![
        event("Warning", "Failed", "Error: ImagePullBackOff", "kubelet"),
        event(
            "Normal",
            "BackOff",
            "Back-off pulling image \"registry/api:1.4.2\"",
            "kubelet",
        ),
        event("Warning", "Failed", "Error: ErrImagePull", "kubelet"),
        event("Warning", "Failed", pulled, "kubelet"),
        event(
            "Normal",
            "Pulling",
            "Pulling image \"registry/api:1.4.2\"",
            "kubelet",
        ),
    ];
    let group = group(&objects, &[(POD_UID, events)]);
    let (cause, path) = only_cause(&group);
    assert_eq!(
        path,
        [
            "Deployment/api",
            "ReplicaSet/api-7f9c4",
            "Pod/api-7f9c4-x2kq"
        ]
    );
    assert_eq!(cause.reason, "ImagePullBackOff");
    assert_eq!(cause.message, pulled);
    assert_eq!(
        cause.sentence,
        "Deployment api: container web of Pod api-7f9c4-x2kq cannot pull image \
         registry/api:1.4.2 (ImagePullBackOff)"
    );
    assert_eq!(cause.logs, None);
    assert_eq!(group.resources[cause.root].name, "api");
}

#[test]
fn err_image_pull_of_a_bare_pod() {
    let message = "rpc error: code = Unknown desc = failed to pull and unpack image \
                   \"registry/api:1.4.2\": 401 Unauthorized";
    let mut objects = api_with_container(
        json!({"waiting": {"reason": "ErrImagePull", "message": message}}),
        json!({}),
        "Pending",
        false,
    );
    let mut bare = objects.remove(2);
    bare["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("ownerReferences");
    let group = group(&[bare], &[]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path, ["Pod/api-7f9c4-x2kq"]);
    assert_eq!(cause.message, message);
    assert_eq!(
        cause.sentence,
        "Pod api-7f9c4-x2kq: container web cannot pull image registry/api:1.4.2 (ErrImagePull)"
    );
}

/// A crash loop whose Pods a Service selects: the cause runs from the Service through its
/// selector edge to the Deployment, then down the owner edges to the Pod.
#[test]
fn crash_loop_behind_a_service_across_selector_and_owner_edges() {
    let mut objects = api_with_container(
        json!({"waiting": {"reason": "CrashLoopBackOff",
                           "message": "back-off 5m0s restarting failed container=web pod=api-7f9c4-x2kq_shop(p-api-7f9c4-x2kq)"}}),
        json!({"terminated": {"exitCode": 1, "reason": "Error",
                              "startedAt": "2026-11-27T10:00:00Z", "finishedAt": "2026-11-27T10:00:02Z"}}),
        "Running",
        false,
    );
    let service = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": meta("api", "s-api"),
        "spec": {"type": "ClusterIP", "selector": {"app": "api"}, "ports": [{"port": 80}]},
    });
    // The EndpointSlice controller lists the crashing Pod, not ready.
    let slice = owned_by(
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "api-5xk2p", "namespace": NS, "uid": "es-api",
                         "labels": {"kubernetes.io/service-name": "api"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": false, "serving": false, "terminating": false},
                           "targetRef": {"kind": "Pod", "name": "api-7f9c4-x2kq"}}],
        }),
        "Service",
        &service,
    );
    objects.extend([service, slice]);
    let events = vec![event(
        "Warning",
        "BackOff",
        "Back-off restarting failed container web in pod api-7f9c4-x2kq_shop(p-api-7f9c4-x2kq)",
        "kubelet",
    )];
    let group = group(&objects, &[(POD_UID, events)]);
    let (cause, path) = only_cause(&group);
    assert_eq!(
        path,
        [
            "Service/api",
            "Deployment/api",
            "ReplicaSet/api-7f9c4",
            "Pod/api-7f9c4-x2kq"
        ]
    );
    assert_eq!(cause.reason, "CrashLoopBackOff");
    assert_eq!(
        cause.sentence,
        "Service api: container web of Pod api-7f9c4-x2kq keeps crashing, last exit code 1 \
         (CrashLoopBackOff)"
    );
    assert!(cause
        .message
        .starts_with("back-off 5m0s restarting failed container=web"));
    let pod = group
        .resources
        .iter()
        .position(|r| r.uid == POD_UID)
        .unwrap();
    assert_eq!(
        cause.logs,
        Some(PreviousLog {
            pod,
            container: "web".into()
        })
    );
    // A resource's own cause starts at it.
    let explained = Explained::new(&group);
    let own = explained.cause_of(pod).unwrap();
    assert_eq!(own.path, [pod]);
    assert_eq!(
        own.sentence,
        "Pod api-7f9c4-x2kq: container web keeps crashing, last exit code 1 (CrashLoopBackOff)"
    );
}

#[test]
fn oom_killed_in_its_last_run() {
    let objects = api_with_container(
        json!({"waiting": {"reason": "CrashLoopBackOff",
                           "message": "back-off 40s restarting failed container=web pod=api-7f9c4-x2kq_shop(p-api-7f9c4-x2kq)"}}),
        json!({"terminated": {"exitCode": 137, "reason": "OOMKilled",
                              "startedAt": "2026-11-27T10:00:00Z", "finishedAt": "2026-11-27T10:00:09Z"}}),
        "Running",
        false,
    );
    let group = group(&objects, &[]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path.len(), 3);
    assert_eq!(cause.reason, "OOMKilled");
    assert_eq!(
        cause.sentence,
        "Deployment api: container web of Pod api-7f9c4-x2kq was killed for going over its \
         memory limit, exit code 137 (OOMKilled)"
    );
    assert!(cause.logs.is_some());
}

#[test]
fn an_unschedulable_pod_in_the_schedulers_words() {
    let said = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are \
                available: 3 No preemption victims found for incoming pod.";
    let d = rolling_out("api");
    let rs = replica_set(&d, "api-7f9c4", json!([]));
    let p = pod(
        &rs,
        "api-7f9c4-x2kq",
        json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": said}]}),
    );
    let events = vec![event(
        "Warning",
        "FailedScheduling",
        said,
        "default-scheduler",
    )];
    let group = group(&[d, rs, p], &[(POD_UID, events)]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path.last().unwrap(), "Pod/api-7f9c4-x2kq");
    assert_eq!(cause.reason, "Unschedulable");
    assert_eq!(cause.message, said);
    assert_eq!(
        cause.sentence,
        "Deployment api: Pod api-7f9c4-x2kq cannot be scheduled: 0/3 nodes are available: 3 \
         Insufficient cpu. preemption: 0/3 nodes are available: 3 No preemption victims found \
         for incoming pod (Unschedulable)"
    );
}

#[test]
fn a_failing_readiness_probe_from_its_event() {
    let objects = api_with_container(
        json!({"running": {"startedAt": "2026-11-27T10:00:00Z"}}),
        json!({}),
        "Running",
        false,
    );
    let events = vec![event(
        "Warning",
        "Unhealthy",
        "Readiness probe failed: HTTP probe failed with statuscode: 503",
        "kubelet",
    )];
    let group = group(&objects, &[(POD_UID, events)]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path.last().unwrap(), "Pod/api-7f9c4-x2kq");
    assert_eq!(cause.reason, "Unhealthy");
    assert_eq!(
        cause.sentence,
        "Deployment api: container web of Pod api-7f9c4-x2kq fails its readiness probe: HTTP \
         probe failed with statuscode: 503 (Unhealthy)"
    );
}

#[test]
fn a_pending_claim_below_the_pod_that_waits_for_it() {
    let sts = json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta("db", "ss-db"),
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "db"}},
                 "updateStrategy": {"type": "RollingUpdate"},
                 "template": {"metadata": {"labels": {"app": "db"}}}},
        "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 0, "currentReplicas": 1,
                   "updatedReplicas": 1, "currentRevision": "db-1", "updateRevision": "db-1"},
    });
    let mut p = pod(
        &sts,
        "db-0",
        json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."}]}),
    );
    p["metadata"]["uid"] = json!("p-db-0");
    p["spec"]["volumes"] =
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}}]);
    let claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta("data-db-0", "pvc-db"),
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast-ssd",
                 "resources": {"requests": {"storage": "10Gi"}}},
        "status": {"phase": "Pending"},
    });
    let said = "storageclass.storage.k8s.io \"fast-ssd\" not found";
    let events = vec![event(
        "Warning",
        "ProvisioningFailed",
        said,
        "persistentvolume-controller",
    )];
    let group = group(&[sts, p, claim], &[("pvc-db", events)]);
    let (cause, path) = only_cause(&group);
    assert_eq!(
        path,
        [
            "StatefulSet/db",
            "Pod/db-0",
            "PersistentVolumeClaim/data-db-0"
        ]
    );
    assert_eq!(cause.reason, "ProvisioningFailed");
    assert_eq!(
        cause.sentence,
        "StatefulSet db: PersistentVolumeClaim data-db-0 is pending: storageclass.storage.k8s.io \
         \"fast-ssd\" not found (ProvisioningFailed)"
    );
}

fn failed_job() -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta("migrate", "j-migrate"),
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"job-name": "migrate"}}}},
        "status": {"failed": 1, "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit"},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit"}]},
    })
}

#[test]
fn a_failed_job_by_its_condition() {
    let group = group(&[failed_job()], &[]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path, ["Job/migrate"]);
    assert_eq!(
        cause.sentence,
        "Job migrate failed: Job has reached the specified backoff limit (BackoffLimitExceeded)"
    );
}

#[test]
fn a_failed_job_by_its_pods_exit_code() {
    let job = failed_job();
    let mut p = owned_by(
        json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": meta("migrate-x7k2p", "p-migrate"),
            "spec": {"restartPolicy": "Never"},
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": "migrate", "image": "registry/migrate:3", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}]},
        }),
        "Job",
        &job,
    );
    p["metadata"]["ownerReferences"][0]["apiVersion"] = json!("batch/v1");
    let group = group(&[job, p], &[]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path, ["Job/migrate", "Pod/migrate-x7k2p"]);
    assert_eq!(
        cause.sentence,
        "Job migrate: container migrate of Pod migrate-x7k2p exited with code 2 (Error)"
    );
}

#[test]
fn a_service_without_ready_endpoints_and_nothing_below() {
    let service = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": meta("api", "s-api"),
        "spec": {"type": "ClusterIP", "selector": {"app": "api", "tier": "web"}},
    });
    let slice = owned_by(
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "api-5xk2p", "namespace": NS, "uid": "es-api",
                         "labels": {"kubernetes.io/service-name": "api"}},
            "addressType": "IPv4", "endpoints": null,
        }),
        "Service",
        &service,
    );
    let group = group(&[service, slice], &[]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path, ["Service/api"]);
    assert_eq!(
        cause.sentence,
        "Service api has no ready endpoints (NoReadyEndpoints)"
    );
    assert_eq!(
        cause.message,
        "no endpoints: no Pod matches the selector, or none has an address yet"
    );
}

#[test]
fn an_ingress_to_a_missing_service() {
    let ingress = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta("web", "i-web"),
        "spec": {"rules": [{"host": "shop.example.com", "http": {"paths": [
            {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
            {"path": "/api", "pathType": "Prefix", "backend": {"service": {"name": "api", "port": {"number": 80}}}}]}}]},
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}},
    });
    let web = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": meta("web", "s-web"),
        "spec": {"type": "ClusterIP", "selector": {"app": "web"}},
    });
    let group = group(&[ingress, web], &[]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path, ["Ingress/web"]);
    assert_eq!(
        cause.sentence,
        "Ingress web routes to a missing Service api (ServiceNotFound)"
    );
}

#[test]
fn an_autoscaler_that_cannot_scale() {
    let d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("api", "d-api"),
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}}},
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2,
                   "readyReplicas": 2, "availableReplicas": 2},
    });
    let said = "the HPA was unable to compute the replica count: failed to get cpu utilization: \
                unable to get metrics for resource cpu: no metrics returned from resource \
                metrics API";
    let hpa = json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta("api", "h-api"),
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"},
                 "minReplicas": 2, "maxReplicas": 10},
        "status": {"currentReplicas": 2, "desiredReplicas": 2, "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale",
             "message": "the HPA controller was able to get the target's current scale"},
            {"type": "ScalingActive", "status": "False", "reason": "FailedGetResourceMetric",
             "message": said}]},
    });
    let group = group(&[d, hpa], &[]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path, ["HorizontalPodAutoscaler/api"]);
    assert_eq!(cause.reason, "FailedGetResourceMetric");
    assert_eq!(cause.message, said);
    assert!(
        cause
            .sentence
            .starts_with("HorizontalPodAutoscaler api cannot scale: the HPA was unable"),
        "{}",
        cause.sentence
    );
    assert!(cause.sentence.ends_with("… (FailedGetResourceMetric)"));
}

#[test]
fn a_rollout_past_its_progress_deadline_when_nothing_below_says_more() {
    let d = deployment(
        "api",
        json!({"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
               "message": "ReplicaSet \"api-7f9c4\" has timed out progressing."}),
    );
    let rs = replica_set(&d, "api-7f9c4", json!([]));
    // Its Pod starts and is not ready yet, with no Event to say why: a bare health.
    let p = pod(
        &rs,
        "api-7f9c4-x2kq",
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
               "containerStatuses": [{"name": "web", "image": "registry/api:1.4.2", "ready": false,
                   "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
    );
    let group = group(&[d, rs, p], &[]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path, ["Deployment/api"]);
    assert_eq!(
        cause.message,
        "ReplicaSet \"api-7f9c4\" has timed out progressing."
    );
    assert_eq!(
        cause.sentence,
        "Deployment api did not finish rolling out within its progress deadline \
         (ProgressDeadlineExceeded)"
    );
}

#[test]
fn a_quota_refusing_pods_from_the_replica_sets_event() {
    let d = rolling_out("api");
    let rs = replica_set(&d, "api-7f9c4", json!([]));
    let said = "Error creating: pods \"api-7f9c4-zx8wq\" is forbidden: exceeded quota: compute, \
                requested: limits.cpu=2, used: limits.cpu=4, limited: limits.cpu=4";
    let events = vec![event(
        "Warning",
        "FailedCreate",
        said,
        "replicaset-controller",
    )];
    let group = group(&[d, rs], &[("rs-api-7f9c4", events)]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path, ["Deployment/api", "ReplicaSet/api-7f9c4"]);
    assert_eq!(cause.reason, "FailedCreate");
    assert_eq!(cause.message, said);
    assert_eq!(
        cause.sentence,
        "Deployment api: ReplicaSet api-7f9c4 cannot create Pods: Error creating: pods \
         \"api-7f9c4-zx8wq\" is forbidden: exceeded quota: compute, requested: limits.cpu=2, \
         used: limits.cpu=4, limited: limits.cpu=4 (FailedCreate)"
    );
}

#[test]
fn a_quota_refusing_pods_from_the_replica_failure_condition() {
    let d = rolling_out("api");
    let said = "pods \"api-7f9c4-zx8wq\" is forbidden: exceeded quota: compute, requested: \
                pods=1, used: pods=10, limited: pods=10";
    let rs = replica_set(
        &d,
        "api-7f9c4",
        json!([{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": said}]),
    );
    let group = group(&[d, rs], &[]);
    let (cause, _) = only_cause(&group);
    assert_eq!(cause.reason, "FailedCreate");
    assert_eq!(cause.message, said);
}

#[test]
fn a_flux_kustomization_that_fails_to_build() {
    let said = "kustomize build failed: accumulating resources: accumulation err='accumulating \
                resources from './api': missing Resource metadata'";
    let kustomization = json!({
        "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
        "metadata": meta("shop", "k-shop"),
        "status": {"observedGeneration": 1, "conditions": [
            {"type": "Ready", "status": "False", "reason": "BuildFailed", "message": said}]},
    });
    let group = group(&[kustomization], &[]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path, ["Kustomization/shop"]);
    assert_eq!(cause.reason, "BuildFailed");
    assert_eq!(cause.message, said);
    assert!(cause
        .sentence
        .starts_with("Kustomization shop reports Ready=False: kustomize build failed"));
}

#[test]
fn an_argo_application_with_an_error_condition() {
    let said = "Failed to load target state: failed to generate manifest for source 1 of 1: \
                rpc error: code = Unknown desc = Manifest generation error (cached)";
    let app = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": meta("shop", "a-shop"),
        "status": {"sync": {"status": "Unknown"}, "health": {"status": "Healthy"},
                   "conditions": [{"type": "ComparisonError", "message": said,
                                   "lastTransitionTime": "2026-11-27T10:00:00Z"}]},
    });
    let group = group(&[app], &[]);
    let (cause, path) = only_cause(&group);
    assert_eq!(path, ["Application/shop"]);
    assert_eq!(cause.reason, "ComparisonError");
    assert!(cause
        .sentence
        .starts_with("Application shop reports ComparisonError: Failed to load target state"));
}

#[test]
fn a_healthy_group_has_no_causes() {
    let mut objects = api_with_container(
        json!({"running": {"startedAt": "2026-11-27T10:00:00Z"}}),
        json!({}),
        "Running",
        true,
    );
    objects[0] = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("api", "d-api"),
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "api"}},
                 "template": {"metadata": {"labels": {"app": "api"}}}},
        "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                   "readyReplicas": 1, "availableReplicas": 1},
    });
    objects[1]["status"] =
        json!({"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "availableReplicas": 1});
    let service = json!({
        "apiVersion": "v1", "kind": "Service", "metadata": meta("api", "s-api"),
        "spec": {"type": "ClusterIP", "selector": {"app": "api"}},
    });
    let slice = owned_by(
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "api-5xk2p", "namespace": NS, "uid": "es-api",
                         "labels": {"kubernetes.io/service-name": "api"}},
            "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": true}}],
        }),
        "Service",
        &service,
    );
    objects.extend([service, slice]);
    // An old Event of a problem since solved says nothing.
    let events = vec![event(
        "Warning",
        "Unhealthy",
        "Readiness probe failed: connection refused",
        "kubelet",
    )];
    let group = group(&objects, &[(POD_UID, events)]);
    assert_eq!(
        group.health.status,
        crate::resources::health::HealthStatus::Healthy
    );
    assert_eq!(causes(&group), []);
}

#[test]
fn a_cycle_of_owners_ends() {
    let mut a = rolling_out("a");
    let mut b = replica_set(&a, "b", json!([]));
    a = owned_by(a, "ReplicaSet", &b);
    b["status"]["replicas"] = json!(1);
    let group = group(&[a, b], &[]);
    // Neither is a root: no cause, and no endless walk.
    assert_eq!(causes(&group), []);
    let explained = Explained::new(&group);
    assert!(explained.cause_of(0).is_some());
}
