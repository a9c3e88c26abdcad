//! Flux's inventories (a Kustomization's `status.inventory`, a HelmRelease's from
//! helm-controller 1.5): entries `{id, v}` whose `id` is cli-utils' `ObjMetadata` string,
//! `<namespace>_<name>_<group>_<kind>`, and `v` the version the object was applied with.

use super::{at, ObjRef};
use crate::resources::tree::Tree;

/// What cli-utils' `ParseObjMetadata` refuses, in its words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("unable to parse stored object metadata: {0}")]
    Fields(String),
    #[error("too many fields within: {0}")]
    TooMany(String),
}

/// Parses an inventory id as cli-utils does: the namespace up to the first `_` (empty for a
/// cluster-scoped object), the kind after the last, the group after the one before that
/// (empty for the core group), and the rest the name, its `__` read back as `:` (RBAC names);
/// a name still holding a `_` then has too many fields.
pub fn parse_id(id: &str) -> Result<ObjRef, IdError> {
    let fields = || IdError::Fields(id.to_owned());
    let (namespace, rest) = id.split_once('_').ok_or_else(fields)?;
    let (rest, kind) = rest.rsplit_once('_').ok_or_else(fields)?;
    let (name, group) = rest.rsplit_once('_').ok_or_else(fields)?;
    let name = match name.contains("__") {
        true => name.replace("__", ":"),
        false => name.to_owned(),
    };
    if name.contains('_') {
        return Err(IdError::TooMany(rest.to_owned()));
    }
    Ok(ObjRef {
        group: group.to_owned(),
        version: None,
        kind: kind.to_owned(),
        namespace: Some(namespace.to_owned()).filter(|ns| !ns.is_empty()),
        name,
    })
}

/// The entries of `object`'s `status.inventory`, each with its version; `None` when the object
/// has no inventory (an older helm-controller, a Kustomization not yet applied). Ids that do not
/// parse are returned as errors beside the others.
pub fn entries(object: &Tree) -> Option<(Vec<ObjRef>, Vec<IdError>)> {
    let list = at(object, &["status", "inventory"])?;
    let mut refs = Vec::new();
    let mut errors = Vec::new();
    for entry in list
        .get("entries")
        .and_then(Tree::as_array)
        .unwrap_or_default()
    {
        let id = entry.get("id").and_then(Tree::as_str).unwrap_or("");
        match parse_id(id) {
            Ok(mut r) => {
                r.version = entry
                    .get("v")
                    .and_then(Tree::as_str)
                    .filter(|v| super::is_api_version(v))
                    .map(str::to_owned);
                refs.push(r);
            }
            Err(e) => errors.push(e),
        }
    }
    Some((refs, errors))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gitops::tree;
    use serde_json::json;

    fn r(group: &str, kind: &str, ns: Option<&str>, name: &str) -> ObjRef {
        ObjRef {
            group: group.into(),
            version: None,
            kind: kind.into(),
            namespace: ns.map(Into::into),
            name: name.into(),
        }
    }

    #[test]
    fn ids_parse_as_cli_utils_parses_them() {
        assert_eq!(
            parse_id("apps_web_apps_Deployment").unwrap(),
            r("apps", "Deployment", Some("apps"), "web")
        );
        // Core group: empty; cluster-scoped: empty namespace.
        assert_eq!(
            parse_id("apps_web__Service").unwrap(),
            r("", "Service", Some("apps"), "web")
        );
        assert_eq!(
            parse_id("_apps__Namespace").unwrap(),
            r("", "Namespace", None, "apps")
        );
        // `__` in the name is a colon (RBAC).
        assert_eq!(
            parse_id("_system__controller__web_rbac.authorization.k8s.io_ClusterRole").unwrap(),
            r(
                "rbac.authorization.k8s.io",
                "ClusterRole",
                None,
                "system:controller:web"
            )
        );
        // Names with dots and dashes stay whole.
        assert_eq!(
            parse_id("flux-system_podinfo.v2_helm.toolkit.fluxcd.io_HelmRelease").unwrap(),
            r(
                "helm.toolkit.fluxcd.io",
                "HelmRelease",
                Some("flux-system"),
                "podinfo.v2"
            )
        );
    }

    #[test]
    fn ids_cli_utils_refuses_are_refused() {
        for bad in ["", "nounderscore", "ns_kind", "ns_name_Kind"] {
            assert!(matches!(parse_id(bad), Err(IdError::Fields(_))), "{bad:?}");
        }
        // A single `_` left in the name: too many fields.
        assert!(matches!(
            parse_id("ns_a_b_apps_Deployment"),
            Err(IdError::TooMany(_))
        ));
        // Three underscores: one colon and one `_` left over.
        assert!(parse_id("ns_a___b_apps_Deployment").is_err());
    }

    #[test]
    fn entries_carry_their_version_and_keep_the_good_ones() {
        let ks = tree(json!({"status": {"inventory": {"entries": [
            {"id": "apps_web_apps_Deployment", "v": "v1"},
            {"id": "garbage", "v": "v1"},
            {"id": "_apps__Namespace", "v": "v1"},
            {"id": "_x__Namespace", "v": "v1/nodes/n1/proxy/metrics?"},
        ]}}}));
        let (refs, errors) = entries(&ks).unwrap();
        assert_eq!(refs.len(), 3);
        // Whoever may edit the source writes its inventory: a version that is no API version
        // is not taken into a request path (discovery's is used).
        assert_eq!(refs[2].version, None);
        assert_eq!(refs[0].version.as_deref(), Some("v1"));
        assert_eq!(refs[0].api_version().as_deref(), Some("apps/v1"));
        assert_eq!(refs[1].api_version().as_deref(), Some("v1"));
        assert_eq!(errors, vec![IdError::Fields("garbage".into())]);
        assert!(entries(&tree(json!({"status": {}}))).is_none());
        // An inventory with no entries is one, empty.
        assert_eq!(
            entries(&tree(json!({"status": {"inventory": {}}})))
                .unwrap()
                .0,
            vec![]
        );
    }
}
