//! Helpers of the health tests: object builders and checks shared by the families.

use serde_json::{json, Value};

use super::{Health, HealthStatus};
use crate::resources::tree::TreeBuf;

/// (what, object, expected status, expected message).
pub type Fixture = (&'static str, Value, HealthStatus, Option<&'static str>);

/// [`super::aggregate`] over `(kind, namespace, name, health)` items.
pub fn aggregate<'a>(
    items: impl IntoIterator<Item = (&'a str, Option<&'a str>, &'a str, &'a Health)>,
) -> Health {
    let items: Vec<_> = items.into_iter().collect();
    super::aggregate(items.iter().map(|item| Some(item.3)), |i| {
        let (kind, namespace, name, _) = items[i];
        (kind, namespace, name)
    })
}

/// A namespaced object named "web" at generation 1, with the given spec and status.
pub fn obj(api_version: &str, kind: &str, spec: Value, status: Value) -> Value {
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
pub fn health(obj: &Value) -> Option<Health> {
    let whole = super::health(&TreeBuf::from(obj));
    let kept = crate::resources::object::parse(&obj.to_string()).expect("parse");
    assert_eq!(
        super::health(&kept),
        whole,
        "health of the kept fields of {obj}"
    );
    whole
}

pub fn check(obj: &Value, status: HealthStatus, message: Option<&str>) {
    let got = health(obj).expect("a rule should apply");
    assert_eq!(got.status, status, "status of {obj}");
    assert_eq!(got.message.as_deref(), message, "message of {obj}");
}

pub fn deploy(spec: Value, status: Value) -> Value {
    obj("apps/v1", "Deployment", spec, status)
}

pub fn sts(strategy: Value, status: Value) -> Value {
    obj(
        "apps/v1",
        "StatefulSet",
        json!({"replicas": 3, "updateStrategy": strategy}),
        status,
    )
}

pub fn ds(strategy: &str, status: Value) -> Value {
    obj(
        "apps/v1",
        "DaemonSet",
        json!({"updateStrategy": {"type": strategy}}),
        status,
    )
}

pub fn pod_with(restart: &str, status: Value) -> Value {
    obj("v1", "Pod", json!({"restartPolicy": restart}), status)
}

pub fn waiting(reason: &str, message: &str) -> Value {
    json!({"name": "app", "ready": false, "state": {"waiting": {"reason": reason, "message": message}}})
}

pub fn job_with(spec: Value, conditions: Value) -> Value {
    obj("batch/v1", "Job", spec, json!({"conditions": conditions}))
}

pub fn cron(spec: Value, status: Value) -> Value {
    obj("batch/v1", "CronJob", spec, status)
}

pub fn hpa_with(conditions: Value) -> Value {
    obj(
        "autoscaling/v2",
        "HorizontalPodAutoscaler",
        json!({}),
        json!({"conditions": conditions}),
    )
}

pub fn cr(generation: i64, status: Value) -> Value {
    let mut o = obj(
        "kustomize.toolkit.fluxcd.io/v1",
        "Kustomization",
        json!({}),
        status,
    );
    o["metadata"]["generation"] = json!(generation);
    o
}

/// `o` with the single annotation `key: value`.
pub fn with_annotation(mut o: Value, key: &str, value: &str) -> Value {
    o["metadata"]["annotations"] = json!({ key: value });
    o
}

/// Small builders for the fixtures above.
pub trait Tap {
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

/// Checks each fixture: the rule applies and gives that status and message.
pub fn check_fixtures(fixtures: Vec<Fixture>) {
    for (what, o, status, message) in fixtures {
        let got = health(&o).unwrap_or_else(|| panic!("{what}: a rule should apply"));
        assert_eq!(
            (got.status, got.message.as_deref()),
            (status, message),
            "{what}"
        );
    }
}
