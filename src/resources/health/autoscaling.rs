//! HorizontalPodAutoscaler (gitops-engine health_hpa.go).

use super::fields::*;
use super::Health;
use super::HealthStatus::*;
use crate::resources::tree::{Items, Tree, TreeBuf};

pub const HPA_CONDITIONS_ANNOTATION: &str = "autoscaling.alpha.kubernetes.io/conditions";

/// (condition type, reason) pairs meaning the autoscaler cannot do its job, as Argo lists them.
/// Any one of them, wherever it is in the list, makes the autoscaler Degraded.
pub(crate) const HPA_DEGRADED: &[(&str, &str)] = &[
    ("AbleToScale", "FailedGetScale"),
    ("AbleToScale", "FailedUpdateScale"),
    ("ScalingActive", "FailedGetResourceMetric"),
    ("ScalingActive", "FailedGetObjectMetric"),
    ("ScalingActive", "FailedGetPodsMetric"),
    ("ScalingActive", "FailedGetExternalMetric"),
    ("ScalingActive", "FailedComputeMetricsReplicas"),
    ("ScalingActive", "InvalidSelector"),
];

/// The version is checked by the caller: `autoscaling/v2` keeps its conditions in `status`,
/// `autoscaling/v1` in a JSON annotation only (what `status.conditions` a v1 object shows is
/// not read, as in Argo).
pub(super) fn hpa(obj: &Obj) -> Health {
    let waiting = || Health::new(Progressing, "Waiting to Autoscale");
    if api_version(obj) != "v1" {
        return judge(list_at(obj, &["status", "conditions"]), field).unwrap_or_else(waiting);
    }
    let annotation = at(obj, &["metadata", "annotations"])
        .and_then(|a| a.get(HPA_CONDITIONS_ANNOTATION))
        .and_then(Tree::as_str);
    let Some(annotation) = annotation else {
        return waiting();
    };
    let parsed = serde_json::from_str::<TreeBuf>(annotation);
    let conditions = match &parsed {
        Ok(tree) if tree.is_array() => tree.as_array().unwrap_or_default(),
        // Go's decoder takes null for an empty list.
        Ok(tree) if tree.is_null() => Items::default(),
        Ok(_) => {
            return Health::new(
                Unknown,
                "failed to convert conditions annotation to typed: not a list of conditions",
            )
        }
        Err(e) => {
            return Health::new(
                Unknown,
                format!("failed to convert conditions annotation to typed: {e}"),
            )
        }
    };
    // Go's decoder matches the annotation's keys to its fields whatever their case.
    judge(conditions, field_any_case).unwrap_or_else(waiting)
}

/// Degraded by the first failing condition, else Healthy by the first able or limited one
/// that is True, else None (waiting).
fn judge(conditions: Items, field: for<'c> fn(&'c Tree, &str) -> &'c str) -> Option<Health> {
    let degraded = conditions.iter().find(|c| {
        let (kind, reason) = (field(c, "type"), field(c, "reason"));
        HPA_DEGRADED.iter().any(|(t, r)| *t == kind && *r == reason)
    });
    if let Some(c) = degraded {
        return Some(Health::new(Degraded, field(c, "message")));
    }
    let healthy = conditions.iter().find(|c| {
        matches!(field(c, "type"), "AbleToScale" | "ScalingLimited") && field(c, "status") == "True"
    });
    healthy.map(|c| Health::new(Healthy, field(c, "message")))
}

fn field<'c>(c: &'c Tree, name: &str) -> &'c str {
    c.get(name).and_then(Tree::as_str).unwrap_or("")
}

fn field_any_case<'c>(c: &'c Tree, name: &str) -> &'c str {
    let exact = c.get(name).and_then(Tree::as_str);
    exact
        .or_else(|| {
            c.as_object()?
                .into_iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .and_then(|(_, v)| v.as_str())
        })
        .unwrap_or("")
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::super::testing::health;
    use super::super::testing::*;
    use super::super::HealthStatus::*;
    use super::super::*;

    // --- HPA -------------------------------------------------------------------------------

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

    #[test]
    fn hpa_reasons_as_argo_lists_them() {
        let failing = |reason: &str| {
            hpa_with(json!([
                {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale", "message": "able"},
                {"type": "ScalingActive", "status": "False", "reason": reason, "message": "cannot"}]))
        };
        for reason in [
            "FailedGetResourceMetric",
            "FailedGetObjectMetric",
            "FailedGetPodsMetric",
            "FailedGetExternalMetric",
            "FailedComputeMetricsReplicas",
            "InvalidSelector",
        ] {
            check(&failing(reason), Degraded, Some("cannot"));
        }
        // Reasons Argo does not list leave the autoscaler to its other conditions.
        for reason in [
            "FailedGetContainerResourceMetric",
            "InvalidMetricSourceType",
            "ScalingDisabled",
        ] {
            check(&failing(reason), Healthy, Some("able"));
        }
        // The degraded condition's own message, never its reason in its place.
        let silent = hpa_with(
            json!([{"type": "AbleToScale", "status": "False", "reason": "FailedUpdateScale"}]),
        );
        check(&silent, Degraded, None);
    }

    #[test]
    fn hpa_conditions_come_from_where_each_version_keeps_them() {
        let failing_annotation = r#"[{"type":"AbleToScale","status":"False","reason":"FailedGetScale","message":"from the annotation"}]"#;
        let healthy_status = json!({"conditions": [{"type": "AbleToScale", "status": "True", "message": "from status"}]});
        // v2 reads status.conditions only.
        let v2 = with_annotation(
            obj(
                "autoscaling/v2",
                "HorizontalPodAutoscaler",
                json!({}),
                healthy_status.clone(),
            ),
            HPA_CONDITIONS_ANNOTATION,
            failing_annotation,
        );
        check(&v2, Healthy, Some("from status"));
        // v1 reads the annotation only.
        let v1 = with_annotation(
            obj(
                "autoscaling/v1",
                "HorizontalPodAutoscaler",
                json!({}),
                healthy_status.clone(),
            ),
            HPA_CONDITIONS_ANNOTATION,
            failing_annotation,
        );
        check(&v1, Degraded, Some("from the annotation"));
        let v1_without = obj(
            "autoscaling/v1",
            "HorizontalPodAutoscaler",
            json!({}),
            healthy_status,
        );
        check(&v1_without, Progressing, Some("Waiting to Autoscale"));
        // Go's decoder matches keys whatever their case.
        let cased = with_annotation(
            obj(
                "autoscaling/v1",
                "HorizontalPodAutoscaler",
                json!({}),
                json!({}),
            ),
            HPA_CONDITIONS_ANNOTATION,
            r#"[{"Type":"ScalingLimited","Status":"True","Message":"at the maximum"}]"#,
        );
        check(&cased, Healthy, Some("at the maximum"));
        // Not a list: the annotation cannot be read.
        let object = with_annotation(
            obj(
                "autoscaling/v1",
                "HorizontalPodAutoscaler",
                json!({}),
                json!({}),
            ),
            HPA_CONDITIONS_ANNOTATION,
            r#"{"type":"AbleToScale"}"#,
        );
        let got = health(&object).expect("rule applies");
        assert_eq!(got.status, Unknown);
        // Other versions are not read.
        for version in ["autoscaling/v2beta1", "autoscaling/v2beta2"] {
            let beta = obj(version, "HorizontalPodAutoscaler", json!({}), json!({}));
            let message = format!("unsupported HPA GVK: {version}, Kind=HorizontalPodAutoscaler");
            check(&beta, Unknown, Some(&message));
        }
    }

    /// The rules and edge cases not pinned above.
    pub(in crate::resources::health) fn fixtures() -> Vec<Fixture> {
        vec![
            // HPA
            (
                "hpa cannot get its target's scale",
                hpa_with(
                    json!([{"type": "AbleToScale", "status": "False", "reason": "FailedGetScale", "message": "deployments/scale.apps \"web\" not found"}]),
                ),
                Degraded,
                Some("deployments/scale.apps \"web\" not found"),
            ),
            (
                "hpa with an invalid selector",
                hpa_with(
                    json!([{"type": "AbleToScale", "status": "True", "message": "ok"},
                             {"type": "ScalingActive", "status": "False", "reason": "InvalidSelector", "message": "bad selector"}]),
                ),
                Degraded,
                Some("bad selector"),
            ),
            (
                "hpa failing on an external metric",
                hpa_with(
                    json!([{"type": "ScalingActive", "status": "False", "reason": "FailedGetExternalMetric", "message": "no metric"}]),
                ),
                Degraded,
                Some("no metric"),
            ),
            (
                "hpa limited by its bounds",
                hpa_with(
                    json!([{"type": "ScalingLimited", "status": "True", "reason": "TooManyReplicas", "message": "the desired replica count is more than the maximum replica count"}]),
                ),
                Healthy,
                Some("the desired replica count is more than the maximum replica count"),
            ),
            (
                "hpa able to scale False (backoff) is waiting",
                hpa_with(
                    json!([{"type": "AbleToScale", "status": "False", "reason": "BackoffBoth"}]),
                ),
                Progressing,
                Some("Waiting to Autoscale"),
            ),
            (
                "a beta version",
                obj(
                    "autoscaling/v2beta2",
                    "HorizontalPodAutoscaler",
                    json!({}),
                    json!({}),
                ),
                Unknown,
                Some("unsupported HPA GVK: autoscaling/v2beta2, Kind=HorizontalPodAutoscaler"),
            ),
            (
                "autoscaling/v1 without the annotation",
                obj(
                    "autoscaling/v1",
                    "HorizontalPodAutoscaler",
                    json!({}),
                    json!({"currentReplicas": 1}),
                ),
                Progressing,
                Some("Waiting to Autoscale"),
            ),
            (
                "autoscaling/v1 with no conditions in the annotation",
                with_annotation(
                    obj(
                        "autoscaling/v1",
                        "HorizontalPodAutoscaler",
                        json!({}),
                        json!({}),
                    ),
                    HPA_CONDITIONS_ANNOTATION,
                    "[]",
                ),
                Progressing,
                Some("Waiting to Autoscale"),
            ),
        ]
    }

    #[test]
    fn every_remaining_branch() {
        check_fixtures(fixtures());
    }
}
