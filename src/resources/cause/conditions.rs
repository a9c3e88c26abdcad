//! Flux's and Argo CD's objects, and any custom resource that follows the same conventions:
//! `Stalled=True` or `Ready=False` with the controller's reason (Flux: `BuildFailed`,
//! `HealthCheckFailed`, `ArtifactFailed`…), and Argo CD's error conditions on an Application
//! (`ComparisonError`, `SyncError`, `InvalidSpecError`…), which say what its health does not.

use super::{quote, Finding, Look};
use crate::resources::health::fields::{
    cond_message, cond_reason, cond_status_is, condition, list_at, str_at,
};

pub(super) fn failing(look: &Look) -> Option<Finding> {
    let object = &look.resource.object.view;
    let argo_error = || {
        list_at(object, &["status", "conditions"])
            .iter()
            .find(|c| str_at(*c, &["type"]).is_some_and(|t| t.ends_with("Error")))
    };
    if let Some(error) = argo_error() {
        let kind = str_at(error, &["type"]).unwrap_or("");
        let message = str_at(error, &["message"]).unwrap_or("");
        return Some(Finding::new(
            kind,
            message,
            format!("reports {kind}: {}", quote(message)),
        ));
    }
    if !look.unhealthy() {
        return None;
    }
    for (kind, status) in [("Stalled", "True"), ("Ready", "False")] {
        let c = condition(object, kind);
        if cond_status_is(c, status) {
            let reason = match cond_reason(c) {
                "" => kind,
                reason => reason,
            };
            let message = cond_message(c);
            return Some(Finding::new(
                reason,
                message,
                format!("reports {kind}={status}: {}", quote(message)),
            ));
        }
    }
    None
}
