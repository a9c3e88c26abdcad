//! GitLab's Flux resource path (`kubernetes:dashboard:flux_resource_path`), e.g.
//! `kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/app`: the object's
//! API path without `/apis/`, which binds an environment to its Flux object.

/// A parsed path: the kind is named by its plural, as in a path; discovery names the kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluxPath {
    pub group: String,
    pub version: String,
    pub namespace: String,
    pub plural: String,
    pub name: String,
}

/// The five parts of `path`, `None` for anything else.
pub fn parse(path: &str) -> Option<FluxPath> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let [group, version, "namespaces", namespace, plural, name] = parts[..] else {
        return None;
    };
    if [group, version, namespace, plural, name]
        .iter()
        .any(|p| p.is_empty())
    {
        return None;
    }
    Some(FluxPath {
        group: group.to_owned(),
        version: version.to_owned(),
        namespace: namespace.to_owned(),
        plural: plural.to_owned(),
        name: name.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitlab_paths_parse() {
        let p = parse("kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/app")
            .unwrap();
        assert_eq!(p.group, "kustomize.toolkit.fluxcd.io");
        assert_eq!(p.version, "v1");
        assert_eq!(p.namespace, "flux-system");
        assert_eq!(p.plural, "kustomizations");
        assert_eq!(p.name, "app");
        assert!(parse("helm.toolkit.fluxcd.io/v2/namespaces/apps/helmreleases/podinfo").is_some());
        for bad in [
            "",
            "a/b",
            "g/v/ns/x/plural/name",
            "g/v/namespaces//plural/name",
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }
}
