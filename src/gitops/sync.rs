//! GitLab's sync status of a Flux object (`fluxSyncStatus`, SPEC 15), in GitLab's order: the
//! first rule that holds wins.

use super::at;
use crate::resources::tree::Tree;

/// GitLab's statuses of a Flux object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FluxSyncStatus {
    Suspended,
    Failed,
    Stalled,
    ReconcilingWithBadConfig,
    Reconciling,
    Reconciled,
    Unknown,
}

/// The status of `condition` (`"True"`, `"False"`, `"Unknown"`) and its reason.
fn condition<'a>(object: &'a Tree, kind: &str) -> Option<(&'a str, &'a str)> {
    let conditions = at(object, &["status", "conditions"])?.as_array()?;
    let c = conditions
        .iter()
        .find(|c| c.get("type").and_then(Tree::as_str) == Some(kind))?;
    Some((
        c.get("status").and_then(Tree::as_str).unwrap_or(""),
        c.get("reason").and_then(Tree::as_str).unwrap_or(""),
    ))
}

/// `spec.suspend` → SUSPENDED; `Ready=False` → FAILED; `Stalled=True` → STALLED;
/// `Ready=Unknown` with reason `Progressing` → RECONCILING_WITH_BAD_CONFIG; `Reconciling=True`
/// → RECONCILING; `Ready=True` → RECONCILED; else UNKNOWN.
pub fn status(object: &Tree) -> FluxSyncStatus {
    let ready = condition(object, "Ready");
    let is = |kind: &str, value: &str| condition(object, kind).is_some_and(|(s, _)| s == value);
    if at(object, &["spec", "suspend"]).and_then(Tree::as_bool) == Some(true) {
        FluxSyncStatus::Suspended
    } else if ready.is_some_and(|(s, _)| s == "False") {
        FluxSyncStatus::Failed
    } else if is("Stalled", "True") {
        FluxSyncStatus::Stalled
    } else if ready == Some(("Unknown", "Progressing")) {
        FluxSyncStatus::ReconcilingWithBadConfig
    } else if is("Reconciling", "True") {
        FluxSyncStatus::Reconciling
    } else if ready.is_some_and(|(s, _)| s == "True") {
        FluxSyncStatus::Reconciled
    } else {
        FluxSyncStatus::Unknown
    }
}

/// [`status`] of a Flux object (its group `*.toolkit.fluxcd.io`), `None` for anything else.
pub fn of(object: &Tree) -> Option<FluxSyncStatus> {
    let api_version = object.get("apiVersion").and_then(Tree::as_str)?;
    let (group, _) = super::split_api_version(api_version);
    super::is_flux_group(group).then(|| status(object))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gitops::tree;
    use crate::resources::tree::TreeBuf;
    use serde_json::json;
    use FluxSyncStatus::*;

    fn ks(suspend: Option<bool>, conditions: serde_json::Value) -> TreeBuf {
        let mut spec = json!({});
        if let Some(s) = suspend {
            spec["suspend"] = json!(s);
        }
        tree(json!({
            "apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
            "spec": spec, "status": {"conditions": conditions},
        }))
    }

    fn c(kind: &str, status: &str, reason: &str) -> serde_json::Value {
        json!({"type": kind, "status": status, "reason": reason, "message": ""})
    }

    /// SPEC 15's table, a row each, every row with what would match the rows below it too.
    #[test]
    fn the_first_rule_that_holds_wins() {
        let failing = [
            ("Ready", "False", "BuildFailed"),
            ("Stalled", "True", "InvalidPath"),
            ("Reconciling", "True", "Progressing"),
        ];
        // `spec.suspend`, the conditions (type, status, reason), the status.
        type Row<'a> = (
            Option<bool>,
            &'a [(&'a str, &'a str, &'a str)],
            FluxSyncStatus,
        );
        let rows: &[Row] = &[
            (Some(true), &failing, Suspended),
            (Some(false), &failing, Failed),
            (
                None,
                &[
                    ("Stalled", "True", "X"),
                    ("Ready", "Unknown", "Progressing"),
                ],
                Stalled,
            ),
            (
                None,
                &[
                    ("Ready", "Unknown", "Progressing"),
                    ("Reconciling", "True", "P"),
                ],
                ReconcilingWithBadConfig,
            ),
            (
                None,
                &[("Ready", "Unknown", "Other"), ("Reconciling", "True", "P")],
                Reconciling,
            ),
            (
                None,
                &[
                    ("Ready", "True", "ReconciliationSucceeded"),
                    ("Stalled", "False", ""),
                ],
                Reconciled,
            ),
            (None, &[], Unknown),
            (None, &[("Ready", "Unknown", "Other")], Unknown),
        ];
        for (suspend, conditions, expected) in rows {
            let conditions: Vec<_> = conditions.iter().map(|&(k, s, r)| c(k, s, r)).collect();
            assert_eq!(
                status(&ks(*suspend, json!(conditions))),
                *expected,
                "{suspend:?} {conditions:?}"
            );
        }
        assert_eq!(status(&tree(json!({"kind": "Kustomization"}))), Unknown);
    }

    #[test]
    fn only_flux_objects_have_one() {
        assert_eq!(of(&ks(Some(true), json!([]))), Some(Suspended));
        let hr = tree(json!({"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease"}));
        assert_eq!(of(&hr), Some(Unknown));
        let app = tree(
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "status": {"conditions": [c("Ready", "True", "")]}}),
        );
        assert_eq!(of(&app), None);
        assert_eq!(of(&tree(json!({"apiVersion": "v1", "kind": "Pod"}))), None);
    }
}
