//! A Secret's values never leave envlens (SPEC 5.2): what a reader is shown of an object goes
//! through [`mask_secret`] first.
//!
//! Argo CD's rule, followed here: `HideSecretData` (argo-cd `util/diff`, formerly gitops-engine
//! `pkg/diff`) masks a Secret (kind `Secret` of the core group, i.e. `apiVersion: v1`) by
//! replacing each value of `data` with `++++++++`, the keys kept. It compares up to three
//! manifests of one Secret (the desired one, the live one, and the live one's last-applied
//! configuration) and gives a key's second distinct value `++++++++++++`, its third 16 `+`, so
//! that a diff still shows which keys changed. envlens shows one manifest, the live one, whose
//! values it never compares: one value per key, hence always the first mask, `++++++++`. The
//! lengths reveal nothing, not even which keys hold equal values.
//!
//! Where this differs from Argo CD, on purpose:
//! - `stringData` is masked in place, keys kept, where Argo CD first folds it into `data` (its
//!   diff needs one field). A manifest is shown as the cluster holds it; a live Secret has no
//!   `stringData` anyway (the API server folds it into `data`), so only a malformed or a
//!   non-live manifest (the deployment history's) can carry one.
//! - The `kubectl.kubernetes.io/last-applied-configuration` annotation is masked whole, as
//!   Argo CD does for an annotation named in its `resource.sensitive.mask.annotations` setting:
//!   the annotation is a second copy of the Secret, `stringData` included, and a whole mask
//!   also covers one that does not parse (Argo CD's re-serialized copy leaves such an
//!   annotation as it is).
//! - A `data` or `stringData` that is not a map (no API server sends one) is masked whole;
//!   `null` stays `null`, as Argo CD skips a null `data`. A value of any type is masked, `null`
//!   included (Argo CD's normalisation turns a null value into `""`, then masks it).
//!
//! A custom resource named `Secret` in another group is not a Kubernetes Secret and is not
//! masked, as in Argo CD. A manifest without `apiVersion` counts as core, as elsewhere in
//! [`super::graph`]: when in doubt, mask.

use serde_json::Value;

/// Argo CD's mask of a secret value.
pub const MASK: &str = "++++++++";

/// The annotation `kubectl apply` writes: the applied manifest, Secret values included.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Whether `manifest` is a Kubernetes Secret: kind `Secret` with `apiVersion: v1` (or none).
pub fn is_secret(manifest: &Value) -> bool {
    manifest.get("kind").and_then(Value::as_str) == Some("Secret")
        && manifest
            .get("apiVersion")
            .is_none_or(|v| v.as_str() == Some("v1"))
}

/// Masks a Secret's values in `manifest`, in place; any other object is left as it is.
pub fn mask_secret(manifest: &mut Value) {
    if !is_secret(manifest) {
        return;
    }
    let Value::Object(object) = manifest else {
        return;
    };
    for field in ["data", "stringData"] {
        match object.get_mut(field) {
            None | Some(Value::Null) => {}
            Some(Value::Object(values)) => {
                for value in values.values_mut() {
                    *value = MASK.into();
                }
            }
            Some(other) => *other = MASK.into(),
        }
    }
    let annotations = object
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
        .and_then(Value::as_object_mut);
    if let Some(last_applied) = annotations.and_then(|a| a.get_mut(LAST_APPLIED)) {
        *last_applied = MASK.into();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn masked(mut manifest: Value) -> Value {
        mask_secret(&mut manifest);
        manifest
    }

    #[test]
    fn every_value_is_masked_and_every_key_kept() {
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "db", "namespace": "shop", "labels": {"app": "db"},
                         "annotations": {"team": "payments"}},
            "data": {"password": "aHVudGVyMg==", "user": "YWRtaW4=", "same": "aHVudGVyMg==",
                     "empty": "", "null": null},
        });
        assert_eq!(
            masked(secret.clone()),
            json!({
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "db", "namespace": "shop", "labels": {"app": "db"},
                             "annotations": {"team": "payments"}},
                "data": {"password": MASK, "user": MASK, "same": MASK, "empty": MASK, "null": MASK},
            })
        );
    }

    #[test]
    fn string_data_and_the_last_applied_configuration_are_masked() {
        let applied = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "api"},
                             "stringData": {"token": "s3cr3t"}});
        let secret = json!({
            "kind": "Secret",
            "metadata": {"name": "api", "annotations": {LAST_APPLIED: applied.to_string(), "note": "kept"}},
            "stringData": {"token": "s3cr3t", "url": "https://user:pw@db"},
            "data": {"token": "czNjcjN0"},
        });
        let out = masked(secret);
        assert_eq!(out["stringData"], json!({"token": MASK, "url": MASK}));
        assert_eq!(out["data"], json!({"token": MASK}));
        assert_eq!(
            out["metadata"]["annotations"],
            json!({LAST_APPLIED: MASK, "note": "kept"})
        );
        assert!(!out.to_string().contains("s3cr3t"), "{out}");
    }

    #[test]
    fn malformed_secrets_are_masked_whole_and_do_not_panic() {
        let odd = json!({"apiVersion": "v1", "kind": "Secret", "data": "c2VjcmV0", "stringData": ["secret"],
                         "metadata": {"annotations": {LAST_APPLIED: {"not": "a string"}}}});
        let out = masked(odd);
        assert_eq!(out["data"], MASK);
        assert_eq!(out["stringData"], MASK);
        assert_eq!(out["metadata"]["annotations"][LAST_APPLIED], MASK);
        let null = json!({"apiVersion": "v1", "kind": "Secret", "data": null});
        assert_eq!(masked(null.clone()), null);
        for shape in [
            json!(null),
            json!("Secret"),
            json!({"kind": "Secret"}),
            json!({"kind": "Secret", "metadata": 3}),
            json!({"kind": "Secret", "metadata": {"annotations": []}}),
        ] {
            assert_eq!(masked(shape.clone()), shape);
        }
    }

    #[test]
    fn only_core_secrets_are_secrets() {
        let data = json!({"password": "aHVudGVyMg=="});
        for (api_version, kind) in [
            (json!("v1"), "ConfigMap"),
            (json!("example.com/v1"), "Secret"),
            (json!("bitnami.com/v1alpha1"), "SealedSecret"),
            (json!(1), "Secret"),
        ] {
            let object = json!({"apiVersion": api_version, "kind": kind, "data": data});
            assert!(!is_secret(&object), "{object}");
            assert_eq!(masked(object.clone()), object);
        }
        assert!(is_secret(
            &json!({"apiVersion": "v1", "kind": "Secret", "data": data})
        ));
        assert!(is_secret(&json!({"kind": "Secret"})));
    }
}
