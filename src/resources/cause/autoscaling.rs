//! HorizontalPodAutoscalers that cannot scale: the controller's `AbleToScale` and
//! `ScalingActive` conditions (`FailedGetScale`, `FailedGetResourceMetric`, …), the pairs that
//! make the autoscaler Degraded in [`crate::resources::health`].

use super::{quote, Finding, Look};
use crate::resources::health::fields::{list_at, str_at};
use crate::resources::health::HPA_DEGRADED;

pub(super) fn hpa(look: &Look) -> Option<Finding> {
    if !look.unhealthy() {
        return None;
    }
    let conditions = list_at(&look.resource.object.view, &["status", "conditions"]);
    let failing = conditions.iter().find(|c| {
        let (kind, reason) = (str_at(*c, &["type"]), str_at(*c, &["reason"]));
        HPA_DEGRADED
            .iter()
            .any(|(t, r)| Some(*t) == kind && Some(*r) == reason)
    })?;
    let reason = str_at(failing, &["reason"]).unwrap_or("");
    let message = str_at(failing, &["message"]).unwrap_or("");
    Some(Finding::new(
        reason,
        message,
        format!("cannot scale: {}", quote(message)),
    ))
}
