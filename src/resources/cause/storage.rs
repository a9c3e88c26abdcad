//! PersistentVolumeClaims left `Pending`: the persistent volume controller's and the
//! provisioner's Events on the claim say why (`ProvisioningFailed`, `FailedBinding`,
//! `ExternalProvisioning`, `WaitForFirstConsumer`).

use super::{quote, Finding, Look};
use crate::resources::health::fields::str_at;

pub(super) fn claim(look: &Look) -> Option<Finding> {
    let object = &look.resource.object.view;
    if str_at(object, &["status", "phase"]) != Some("Pending") {
        return None;
    }
    let said = look
        .event(&["ProvisioningFailed", "FailedBinding"], true)
        .or_else(|| {
            look.event(
                &[
                    "ProvisioningFailed",
                    "FailedBinding",
                    "ExternalProvisioning",
                    "WaitForFirstConsumer",
                    "Provisioning",
                ],
                false,
            )
        });
    let (reason, message) = match said {
        Some(event) => (event.reason.as_str(), event.message.as_str()),
        None => ("Pending", "the claim is not bound to a volume"),
    };
    Some(Finding::new(
        reason,
        message,
        format!("is pending: {}", quote(message)),
    ))
}
