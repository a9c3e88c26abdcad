//! The keys of a compact tree's maps ([`super::tree::Map`]), interned.
//!
//! Nearly every key of the fields a cached object keeps is one of a few hundred names that
//! Kubernetes' own types (and the labels its controllers set) use: `metadata`, `name`, `uid`,
//! `status`, `conditions`, `lastTransitionTime`, `pod-template-hash`... A tree writes such a
//! key as its place in [`NAMES`], one byte for the first 128 names (the most used come
//! first), two for the others, and compares it by that place; any other key is written
//! whole. Which keys are in the table changes only the size of a tree, never what it
//! reads.

use std::sync::OnceLock;

/// The place of `name` in [`NAMES`], by an open-addressed table of their hashes built once.
pub(crate) fn lookup(name: &str) -> Option<usize> {
    static INDEX: OnceLock<Box<[u16]>> = OnceLock::new();
    let index = INDEX.get_or_init(|| {
        let mut index = vec![EMPTY; SLOTS].into_boxed_slice();
        for (i, key) in NAMES.iter().enumerate() {
            let mut slot = hash(key) & (SLOTS - 1);
            while index[slot] != EMPTY {
                slot = (slot + 1) & (SLOTS - 1);
            }
            index[slot] = i as u16;
        }
        index
    });
    let mut slot = hash(name) & (SLOTS - 1);
    loop {
        let i = index[slot];
        if i == EMPTY {
            return None;
        }
        if NAMES[i as usize] == name {
            return Some(i as usize);
        }
        slot = (slot + 1) & (SLOTS - 1);
    }
}

const EMPTY: u16 = u16::MAX;
/// A power of two, at least four times the keys: probes stay short.
const SLOTS: usize = 2048;
const _: () = assert!(NAMES.len() * 4 <= SLOTS && SLOTS.is_power_of_two());

/// The first and last eight bytes and the length, mixed: two loads and two multiplications
/// whatever the length (a byte-at-a-time hash cost more than the rest of packing a text).
fn hash(name: &str) -> usize {
    let b = name.as_bytes();
    let word = |part: &[u8]| {
        let mut w = [0u8; 8];
        w[..part.len()].copy_from_slice(part);
        u64::from_le_bytes(w)
    };
    let (head, tail) = if b.len() >= 8 {
        (word(&b[..8]), word(&b[b.len() - 8..]))
    } else {
        (word(b), 0)
    };
    let h = (head ^ (b.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_mul(0xff51_afd7_ed55_8ccd)
        ^ tail.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    (h ^ (h >> 32)) as usize
}

macro_rules! keys {
    ($($name:literal),* $(,)?) => {
        /// The names Kubernetes objects' kept fields are made of: the fields of `metadata`,
        /// the `spec` fields the rules read, the `status` of the built-in kinds and of common
        /// custom resources, and the labels Kubernetes' controllers and Helm set.
        pub static NAMES: [&str; [$($name),*].len()] = [$($name),*];
    };
}

keys![
    // Objects and metadata.
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "status",
    "name",
    "namespace",
    "uid",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "finalizers",
    "labels",
    "annotations",
    "ownerReferences",
    "controller",
    "blockOwnerDeletion",
    "resourceVersion",
    "generateName",
    // Labels Kubernetes' controllers, Helm and common charts set.
    "app",
    "component",
    "tier",
    "release",
    "chart",
    "heritage",
    "environment",
    "pod-template-hash",
    "controller-revision-hash",
    "pod-template-generation",
    "controller-uid",
    "job-name",
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
    "endpointslice.kubernetes.io/managed-by",
    "kubernetes.io/service-name",
    "service.kubernetes.io/headless",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
    "app.gitlab.com/app",
    "app.gitlab.com/env",
    "app.gitlab.com/env.name",
    // The labels of envlens' default selector (SPEC 5.2).
    "app.gitlab.com/project_id",
    "app.gitlab.com/environment_slug",
    // Spec fields the rules read, and what they hold.
    "paused",
    "replicas",
    "updateStrategy",
    "rollingUpdate",
    "maxSurge",
    "maxUnavailable",
    "restartPolicy",
    "suspend",
    "type",
    "selector",
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
    "template",
    "port",
    "volumes",
    // Status: conditions.
    "conditions",
    "lastTransitionTime",
    "lastUpdateTime",
    "reason",
    "message",
    "observedGeneration",
    // Workloads.
    "availableReplicas",
    "readyReplicas",
    "updatedReplicas",
    "currentReplicas",
    "unavailableReplicas",
    "fullyLabeledReplicas",
    "terminatingReplicas",
    "currentRevision",
    "updateRevision",
    "ready",
    "startTime",
    // Pods.
    "phase",
    "hostIP",
    "hostIPs",
    "podIP",
    "podIPs",
    "ip",
    "qosClass",
    "nominatedNodeName",
    "containerStatuses",
    "initContainerStatuses",
    "ephemeralContainerStatuses",
    "image",
    "imageID",
    "containerID",
    "restartCount",
    "started",
    "state",
    "lastState",
    "running",
    "waiting",
    "terminated",
    "startedAt",
    "finishedAt",
    "exitCode",
    "signal",
    "allocatedResources",
    "resources",
    "limits",
    "requests",
    "cpu",
    "memory",
    "volumeMounts",
    "mountPath",
    "recursiveReadOnly",
    "user",
    "linux",
    "gid",
    "supplementalGroups",
    "resize",
    "resourceClaimStatuses",
    "stop",
    "stopSignal",
    // Services, endpoints, ingresses.
    "loadBalancer",
    "ingress",
    "ipMode",
    "hostname",
    "ports",
    "protocol",
    "error",
    // Volumes and claims.
    "accessModes",
    "capacity",
    "storage",
    "allocatedResourceStatuses",
    "currentVolumeAttributesClassName",
    "modifyVolumeStatus",
    // Autoscalers.
    "currentMetrics",
    "desiredReplicas",
    "lastScaleTime",
    "currentCPUUtilizationPercentage",
    "current",
    "averageUtilization",
    "averageValue",
    "value",
    "target",
    "metric",
    "pods",
    "object",
    "external",
    "containerResource",
    "container",
    // cert-manager, Flux, Argo and other common custom resources.
    "notAfter",
    "notBefore",
    "renewalTime",
    "revision",
    "nextPrivateKeySecretName",
    "lastAttemptedRevision",
    "lastAppliedRevision",
    "lastHandledReconcileAt",
    "history",
    "inventory",
    "entries",
    "artifact",
    "digest",
    "url",
    "size",
    "health",
    "sync",
    "operationState",
    "summary",
    "version",
    "id",
    "v",
    // Rarer fields of the spec and status sections above (the first 128 names take a byte
    // in a tree, the others two: the labels above are on nearly every object).
    "rules",
    "host",
    "http",
    "paths",
    "path",
    "pathType",
    "backend",
    "service",
    "number",
    "resource",
    "defaultBackend",
    "serviceName",
    "servicePort",
    "scaleTargetRef",
    "persistentVolumeClaim",
    "claimName",
    "readOnly",
    "currentNumberScheduled",
    "desiredNumberScheduled",
    "numberAvailable",
    "numberMisscheduled",
    "numberReady",
    "numberUnavailable",
    "updatedNumberScheduled",
    "completionTime",
    "completedIndexes",
    "failedIndexes",
    "uncountedTerminatedPods",
    "lastScheduleTime",
    "lastSuccessfulTime",
    "active",
    "succeeded",
    "failed",
    "terminating",
    "lastProbeTime",
    "lastHeartbeatTime",
    "partition",
    "collisionCount",
    // Common annotations.
    "kubectl.kubernetes.io/last-applied-configuration",
    "kubectl.kubernetes.io/restartedAt",
    "deployment.kubernetes.io/revision",
    "deployment.kubernetes.io/desired-replicas",
    "deployment.kubernetes.io/max-replicas",
    "meta.helm.sh/release-name",
    "meta.helm.sh/release-namespace",
    "endpoints.kubernetes.io/last-change-trigger-time",
    // Keys of whole objects (kept whole under some fields, or read by GitLab's watch API): pod
    // specs and templates.
    "containers",
    "initContainers",
    "args",
    "command",
    "env",
    "envFrom",
    "valueFrom",
    "secretKeyRef",
    "configMapKeyRef",
    "fieldRef",
    "fieldPath",
    "imagePullPolicy",
    "imagePullSecrets",
    "terminationMessagePath",
    "terminationMessagePolicy",
    "readinessProbe",
    "livenessProbe",
    "startupProbe",
    "httpGet",
    "tcpSocket",
    "exec",
    "scheme",
    "periodSeconds",
    "timeoutSeconds",
    "successThreshold",
    "failureThreshold",
    "initialDelaySeconds",
    "containerPort",
    "targetPort",
    "nodePort",
    "securityContext",
    "runAsUser",
    "runAsNonRoot",
    "fsGroup",
    "dnsPolicy",
    "schedulerName",
    "serviceAccount",
    "serviceAccountName",
    "nodeName",
    "nodeSelector",
    "affinity",
    "tolerations",
    "effect",
    "tolerationSeconds",
    "terminationGracePeriodSeconds",
    "enableServiceLinks",
    "preemptionPolicy",
    "priority",
    "configMap",
    "secret",
    "secretName",
    "items",
    "defaultMode",
    "emptyDir",
    "projected",
    "sources",
    "serviceAccountToken",
    "expirationSeconds",
    "downwardAPI",
    "optional",
    // Workload, service and other specs.
    "strategy",
    "progressDeadlineSeconds",
    "revisionHistoryLimit",
    "minReadySeconds",
    "podManagementPolicy",
    "volumeClaimTemplates",
    "persistentVolumeClaimRetentionPolicy",
    "whenDeleted",
    "whenScaled",
    "schedule",
    "jobTemplate",
    "concurrencyPolicy",
    "successfulJobsHistoryLimit",
    "failedJobsHistoryLimit",
    "backoffLimit",
    "completions",
    "parallelism",
    "completionMode",
    "podReplacementPolicy",
    "manualSelector",
    "ttlSecondsAfterFinished",
    "clusterIP",
    "clusterIPs",
    "ipFamilies",
    "ipFamilyPolicy",
    "internalTrafficPolicy",
    "sessionAffinity",
    "storageClassName",
    "volumeMode",
    "volumeName",
    "minReplicas",
    "maxReplicas",
    "metrics",
    "behavior",
    "ingressClassName",
    "tls",
    "hosts",
    "data",
    "binaryData",
    "stringData",
    "immutable",
    // Endpoints, EndpointSlices and Events.
    "subsets",
    "addresses",
    "notReadyAddresses",
    "addressType",
    "endpoints",
    "serving",
    "targetRef",
    "involvedObject",
    "firstTimestamp",
    "lastTimestamp",
    "eventTime",
    "count",
    "source",
    "reportingComponent",
    "reportingInstance",
    "action",
    "related",
    "series",
    "fieldsType",
    "fieldsV1",
    "manager",
    "operation",
    "time",
    "subresource",
    "managedFields",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_of_the_table_is_found_and_found_once() {
        for (i, key) in NAMES.iter().enumerate() {
            assert_eq!(lookup(key), Some(i), "{key}");
        }
        let mut names: Vec<&str> = NAMES.to_vec();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "no name twice");
        assert_eq!(lookup("Metadata"), None);
        assert_eq!(lookup("metadat"), None);
    }
}
