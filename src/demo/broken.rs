//! A rollout of the demo that never finishes: payments' staging API went to an image tag that
//! was never pushed, so the new Pod cannot pull it while the old one keeps serving, and the
//! Deployment is past its progress deadline. What the kubelet and the deployment controller
//! write of it is what a cluster shows: its cause is named on the environment's page (SPEC 17).

use serde_json::json;

use super::cluster::{now, DemoCluster};
use super::world::{deployment, event, hash_of, pod, pod_name, replica_set, App, PodState};

/// (namespace, app) of the apps whose rollout stays broken.
pub(super) const BROKEN: &[(&str, &str)] = &[("payments-staging", "api")];

/// The tag the rollout asked for, and that the registry does not have.
fn missing_image(app: &App) -> String {
    let repository = app
        .image
        .rsplit_once(':')
        .map_or(app.image.as_str(), |(r, _)| r);
    format!("{repository}:3.3.0-rc.3")
}

/// Puts `app` half-way through its rollout to [`missing_image`]: the old ReplicaSet and its
/// Pods serving, the new ReplicaSet's Pod waiting in `ImagePullBackOff`, the kubelet's Events
/// about it, and the Deployment past its progress deadline.
pub(super) fn rollout(cluster: &DemoCluster, app: &App) {
    let image = missing_image(app);
    let new_rs = format!("{}-{}", app.name, hash_of(&image));
    let r = app.replicas;
    let status = json!({"observedGeneration": 2, "replicas": r + 1, "updatedReplicas": 1,
        "readyReplicas": r, "availableReplicas": r, "unavailableReplicas": 1,
        "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
             "message": "Deployment has minimum availability."},
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
             "message": format!("ReplicaSet \"{new_rs}\" has timed out progressing.")}]});
    let rolled = App {
        ns: app.ns,
        project: app.project,
        slug: app.slug,
        name: app.name,
        replicas: r,
        image: image.clone(),
        containers: app.containers,
    };
    cluster.put(deployment(&rolled, 2, status));
    cluster.put(replica_set(app, &image, 1, 0));
    let suffix = super::world::SUFFIXES[0];
    let mut stuck = pod(app, &image, suffix, PodState::Pending, 0);
    stuck["status"]["containerStatuses"][0]["state"] = json!({"waiting": {
        "reason": "ImagePullBackOff",
        "message": format!("Back-off pulling image \"{image}\""),
    }});
    stuck["status"]["conditions"] = json!([
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
         "message": format!("containers with unready status: [{}]", app.containers[0])},
    ]);
    cluster.put(stuck);
    let name = pod_name(app, &image, suffix);
    let uid = format!("demo-pod-{}-{name}", app.ns);
    let about = [app.ns, "Pod", "v1", name.as_str(), uid.as_str()];
    let pulled = format!(
        "Failed to pull image \"{image}\": rpc error: code = NotFound desc = failed to pull and \
         unpack image \"{image}\": failed to resolve reference \"{image}\": {image}: not found"
    );
    // Two `Failed` Events (the pull's error, then the kubelet's summary): named apart.
    for (kind, reason, message, count, tag) in [
        (
            "Normal",
            "Pulling",
            format!("Pulling image \"{image}\""),
            4,
            "pulling",
        ),
        ("Warning", "Failed", pulled, 4, "failed-pull"),
        (
            "Warning",
            "Failed",
            "Error: ErrImagePull".to_owned(),
            4,
            "failed-err",
        ),
        (
            "Normal",
            "BackOff",
            format!("Back-off pulling image \"{image}\""),
            31,
            "backoff",
        ),
        (
            "Warning",
            "Failed",
            "Error: ImagePullBackOff".to_owned(),
            31,
            "failed-backoff",
        ),
    ] {
        let mut e = event(about, kind, reason, &message, count);
        e["metadata"]["name"] = json!(format!("{name}.{tag}"));
        e["lastTimestamp"] = json!(now());
        cluster.put(e);
    }
    cluster.put(event(
        [
            app.ns,
            "Deployment",
            "apps/v1",
            app.name,
            &format!("demo-deployment-{}-{}", app.ns, app.name),
        ],
        "Normal",
        "ScalingReplicaSet",
        &format!("Scaled up replica set {new_rs} to 1"),
        1,
    ));
}
