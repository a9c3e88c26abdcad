//! HorizontalPodAutoscaler (gitops-engine health_hpa.go).

use super::fields::*;
use super::Health;
use super::HealthStatus::*;
use crate::resources::tree::Tree;

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

pub(super) fn hpa(obj: &Obj) -> Health {
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
