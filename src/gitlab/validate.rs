//! Field checks shared by every write endpoint; each failure is a 422 naming the field.

use crate::error::{Error, Result};

pub fn positive(field: &str, id: i64) -> Result<()> {
    if id > 0 {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("must be a positive id, got {id}"),
        ))
    }
}

/// GitLab's limit on a name: a username, a path segment, an environment's or a job's name
/// (`validates :name, length: { maximum: 255 }` in its models).
pub const MAX_NAME: usize = 255;
/// The longest full path envlens stores: GitLab nests groups 20 deep, but a path in the unique
/// indexes (`lower(full_path)`) must stay well under PostgreSQL's 2,704 bytes per index row,
/// and no real one comes near.
pub const MAX_FULL_PATH: usize = 1024;

/// A name as GitLab has them (usernames, environment and job names): not blank, and at most
/// [`MAX_NAME`] characters, so that it fits its column and index. (NUL never gets this far:
/// `http::extract` refuses it in any string of a body.)
pub fn non_empty(field: &str, value: &str) -> Result<()> {
    if value.trim().is_empty() {
        Err(Error::invalid(field, "must not be empty"))
    } else if value.chars().count() > MAX_NAME {
        Err(Error::invalid(
            field,
            format!("must be at most {MAX_NAME} characters"),
        ))
    } else {
        Ok(())
    }
}

/// A GitLab full path: `/`-separated segments of letters, digits, `_`, `-` and `.`, none
/// empty, none starting with `-`, none longer than [`MAX_NAME`], [`MAX_FULL_PATH`] in all.
pub fn full_path(field: &str, path: &str) -> Result<()> {
    let valid_segment = |s: &str| {
        !s.is_empty()
            && s.len() <= MAX_NAME
            && !s.starts_with('-')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    if path.len() > MAX_FULL_PATH {
        return Err(Error::invalid(
            field,
            format!("must be at most {MAX_FULL_PATH} characters"),
        ));
    }
    if path.split('/').all(valid_segment) {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("`{path}` is not a GitLab full path like `group/subgroup/project`"),
        ))
    }
}

pub fn visibility(field: &str, value: &str) -> Result<()> {
    match value {
        "private" | "internal" | "public" => Ok(()),
        _ => Err(Error::invalid(
            field,
            format!("`{value}` is not one of private, internal, public"),
        )),
    }
}

/// GitLab's state of a user as the mirror keeps it: the state itself when it is a name GitLab
/// could give (lower-case letters and `_`, at most 64), else `unknown`. Only `active` is let
/// in anywhere, so a state envlens does not recognise refuses the user, as it should.
pub fn user_state(state: &str) -> String {
    let plausible = (1..=64).contains(&state.len())
        && state.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    if plausible { state } else { "unknown" }.to_owned()
}

/// GitLab's access levels; 5 is "Minimal Access".
pub const ACCESS_LEVELS: [(i32, &str); 7] = [
    (5, "Minimal Access"),
    (10, "Guest"),
    (15, "Planner"),
    (20, "Reporter"),
    (30, "Developer"),
    (40, "Maintainer"),
    (50, "Owner"),
];

pub fn access_level(field: &str, level: i32) -> Result<i32> {
    if ACCESS_LEVELS.iter().any(|(n, _)| *n == level) {
        Ok(level)
    } else {
        Err(Error::invalid(
            field,
            format!("{level} is not an access level (10, 15, 20, 30, 40, 50)"),
        ))
    }
}

/// An access level as system hooks name it (`"Developer"`), case-insensitively; `Master` is
/// the name GitLab gave Maintainer before 11.0, and older GitLabs still send it.
pub fn access_level_named(name: &str) -> Option<i32> {
    let name = name.trim();
    if name.eq_ignore_ascii_case("Master") {
        return Some(40);
    }
    ACCESS_LEVELS
        .iter()
        .find(|(_, n)| n.eq_ignore_ascii_case(name))
        .map(|(level, _)| *level)
}

pub fn source_type(field: &str, value: &str) -> Result<()> {
    match value {
        "project" | "group" => Ok(()),
        _ => Err(Error::invalid(
            field,
            format!("`{value}` is not one of project, group"),
        )),
    }
}

/// A DNS-1123 label, as Kubernetes requires of namespace and agent names.
pub fn dns_label(field: &str, value: &str) -> Result<()> {
    let bytes = value.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-';
    if valid {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("`{value}` must be a DNS-1123 label: at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit"),
        ))
    }
}

/// A DNS-1123 subdomain, as Kubernetes requires of most objects' names: at most 253 lower-case
/// letters, digits, '-' and '.', starting and ending with a letter or digit.
pub fn dns_subdomain(field: &str, value: &str) -> Result<()> {
    let bytes = value.as_bytes();
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let valid = bytes.len() <= 253
        && edge(bytes.first())
        && edge(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'.');
    if valid {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("`{value}` must be a DNS-1123 subdomain: at most 253 lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"),
        ))
    }
}

/// The API groups of Flux's controllers all end so (`kustomize.toolkit.fluxcd.io`,
/// `helm.toolkit.fluxcd.io`, `source.toolkit.fluxcd.io`, ...).
pub const FLUX_GROUP_SUFFIX: &str = ".toolkit.fluxcd.io";

/// A Flux object's `apiVersion` (`<group>.toolkit.fluxcd.io/<version>`) and `kind` (a Kubernetes
/// kind: a letter, then letters and digits, at most 63): the group and version.
pub fn flux_kind<'a>(api_version: &'a str, kind: &str) -> Result<(&'a str, &'a str)> {
    let parsed = api_version.split_once('/').filter(|(group, version)| {
        group.ends_with(FLUX_GROUP_SUFFIX)
            && dns_subdomain("apiVersion", group).is_ok()
            && dns_label("apiVersion", version).is_ok()
    });
    let Some(parsed) = parsed else {
        return Err(Error::invalid(
            "apiVersion",
            format!("`{api_version}` is not a Flux API version (`<group>{FLUX_GROUP_SUFFIX}/<version>`, e.g. `kustomize.toolkit.fluxcd.io/v1`)"),
        ));
    };
    let valid_kind = kind.len() <= 63
        && kind.starts_with(|c: char| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric());
    if !valid_kind {
        return Err(Error::invalid(
            "kind",
            format!("`{kind}` is not a Kubernetes kind (e.g. `Kustomization`)"),
        ));
    }
    Ok(parsed)
}

/// GitLab's bounds for a Flux resource path (its `environment:kubernetes:dashboard` schema: 1 to
/// 255 characters, the length of the environment's column).
pub const FLUX_RESOURCE_PATH_MAX: usize = 255;

/// A Flux resource path, checked as GitLab checks it: a string of 1 to 255 characters (its
/// `dashboard` schema and `Environment` model). The dashboard reads it as
/// `<group>/<version>/namespaces/<namespace>/<plural>/<name>` (GitLab's documented example:
/// `helm.toolkit.fluxcd.io/v2/namespaces/flux-system/helmreleases/helm-release-resource`), but
/// GitLab does not check that shape, and its own examples and specs use others
/// (`path/to/flux/resource`): refusing them would lose a deployment that GitLab ran.
pub fn flux_resource_path(field: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(
            field,
            "must not be empty: a Flux resource path like \
             `helm.toolkit.fluxcd.io/v2/namespaces/flux-system/helmreleases/web`",
        ));
    }
    text(field, value, FLUX_RESOURCE_PATH_MAX)
}

/// The namespace and Flux resource path of a deploy job's `environment:kubernetes`, at one of
/// the two places GitLab takes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DashboardKeys<'a> {
    pub namespace: Option<&'a str>,
    pub flux_resource_path: Option<&'a str>,
}

/// GitLab's rules for those keys (its `Entry::Kubernetes` and `dashboard` schema): GitLab 18.4
/// moved `namespace` and `flux_resource_path` under `dashboard` and deprecated the old places;
/// a key set in both is refused, `dashboard` needs its `namespace`, and the deprecated
/// `flux_resource_path` needs the deprecated `namespace`. Returns the keys in effect.
pub fn kubernetes_dashboard<'a>(
    deprecated: DashboardKeys<'a>,
    dashboard: Option<DashboardKeys<'a>>,
) -> Result<DashboardKeys<'a>> {
    const SECTION: &str = "kubernetes";
    let moved = dashboard.unwrap_or_default();
    for (key, old, new) in [
        ("namespace", deprecated.namespace, moved.namespace),
        (
            "flux_resource_path",
            deprecated.flux_resource_path,
            moved.flux_resource_path,
        ),
    ] {
        if old.is_some() && new.is_some() {
            return Err(Error::invalid(
                format!("{SECTION}.{key}"),
                format!("cannot be set when {SECTION}.dashboard.{key} is set: GitLab 18.4 moved it there"),
            ));
        }
    }
    if dashboard.is_some() && moved.namespace.is_none() {
        return Err(Error::invalid(
            format!("{SECTION}.dashboard.namespace"),
            "is required when kubernetes.dashboard is set",
        ));
    }
    if deprecated.flux_resource_path.is_some() && deprecated.namespace.is_none() {
        return Err(Error::invalid(
            format!("{SECTION}.namespace"),
            "is required when kubernetes.flux_resource_path is set",
        ));
    }
    // The fields' names written out: formatted, they cost every call three strings.
    for (namespace_field, path_field, keys) in [
        (
            "kubernetes.namespace",
            "kubernetes.flux_resource_path",
            deprecated,
        ),
        (
            "kubernetes.dashboard.namespace",
            "kubernetes.dashboard.flux_resource_path",
            moved,
        ),
    ] {
        if let Some(namespace) = keys.namespace {
            dns_label(namespace_field, namespace)?;
        }
        if let Some(path) = keys.flux_resource_path {
            flux_resource_path(path_field, path)?;
        }
    }
    Ok(DashboardKeys {
        namespace: moved.namespace.or(deprecated.namespace),
        flux_resource_path: moved.flux_resource_path.or(deprecated.flux_resource_path),
    })
}

/// Free text for a column of `max` characters: no NUL (PostgreSQL cannot store it).
pub fn text(field: &str, value: &str, max: usize) -> Result<()> {
    if value.contains('\0') {
        Err(Error::invalid(field, "must not contain NUL characters"))
    } else if value.chars().count() > max {
        Err(Error::invalid(
            field,
            format!("must be at most {max} characters"),
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert!(full_path("f", "group/sub.group/my_app-1").is_ok());
        for bad in [
            "",
            "/group",
            "group/",
            "group//app",
            "group/-app",
            "group/a b",
            "grüppe",
            &format!("group/{}", "a".repeat(256)),
            &["abc"; 300].join("/"),
        ] {
            assert!(full_path("f", bad).is_err(), "{bad:?} accepted");
        }
        assert!(full_path("f", &["a".repeat(255), "b".repeat(255)].join("/")).is_ok());
    }

    #[test]
    fn names() {
        assert!(non_empty("f", "alice").is_ok());
        assert!(non_empty("f", &"é".repeat(255)).is_ok());
        for bad in ["", "  ", &"a".repeat(256), &"a".repeat(1 << 20)] {
            assert!(non_empty("f", bad).is_err(), "{} accepted", bad.len());
        }
    }

    #[test]
    fn dns_labels() {
        assert!(dns_label("f", "default").is_ok());
        assert!(dns_label("f", &"a".repeat(63)).is_ok());
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(dns_label("f", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn flux_kinds_and_names() {
        assert_eq!(
            flux_kind("kustomize.toolkit.fluxcd.io/v1", "Kustomization").unwrap(),
            ("kustomize.toolkit.fluxcd.io", "v1")
        );
        assert!(flux_kind("apps/v1", "Deployment").is_err());
        assert!(flux_kind("kustomize.toolkit.fluxcd.io", "Kustomization").is_err());
        assert!(flux_kind("kustomize.toolkit.fluxcd.io/v1", "kustomization").is_err());
        assert!(flux_kind("kustomize.toolkit.fluxcd.io/v1/x", "Kustomization").is_err());
        assert!(dns_subdomain("name", "web.prod-1").is_ok());
        for bad in ["", "-web", "web.", "Web", "a/b", &"a".repeat(254)] {
            assert!(dns_subdomain("name", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn access_levels() {
        assert_eq!(access_level_named("developer"), Some(30));
        assert_eq!(access_level_named("Minimal Access"), Some(5));
        assert_eq!(access_level_named("Master"), Some(40));
        assert_eq!(access_level_named("Maintainer"), Some(40));
        assert_eq!(access_level_named("Admin"), None);
        assert!(access_level("f", 25).is_err());
    }

    #[test]
    fn flux_resource_paths() {
        for good in [
            "kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/app",
            // GitLab checks only the length; its own specs and docs use these.
            "path/to/flux/resource",
            "HelmRelease/flux-system",
            &"p".repeat(FLUX_RESOURCE_PATH_MAX),
        ] {
            assert!(flux_resource_path("f", good).is_ok(), "{good:?} refused");
        }
        for bad in ["", &"p".repeat(FLUX_RESOURCE_PATH_MAX + 1), "a\0b"] {
            assert!(flux_resource_path("f", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn texts() {
        assert!(text("f", "héllo", 5).is_ok());
        assert!(text("f", "héllo!", 5).is_err());
        assert!(text("f", "a\0b", 5).is_err());
    }

    fn keys<'a>(namespace: Option<&'a str>, flux: Option<&'a str>) -> DashboardKeys<'a> {
        DashboardKeys {
            namespace,
            flux_resource_path: flux,
        }
    }

    fn refused_field(result: Result<DashboardKeys<'_>>) -> String {
        match result {
            Err(Error::Invalid { field, .. }) => field,
            other => panic!("accepted: {other:?}"),
        }
    }

    #[test]
    fn both_shapes_of_the_kubernetes_section() {
        const FLUX: &str =
            "kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/web";
        let none = DashboardKeys::default();
        // The deprecated keys, the new ones, and nothing at all.
        assert_eq!(
            kubernetes_dashboard(keys(Some("web"), Some(FLUX)), None).unwrap(),
            keys(Some("web"), Some(FLUX))
        );
        assert_eq!(
            kubernetes_dashboard(none, Some(keys(Some("web"), Some(FLUX)))).unwrap(),
            keys(Some("web"), Some(FLUX))
        );
        assert_eq!(kubernetes_dashboard(none, None).unwrap(), none);
        // A key in both places is refused by its old name, whatever the values.
        assert_eq!(
            refused_field(kubernetes_dashboard(
                keys(Some("web"), None),
                Some(keys(Some("web"), None))
            )),
            "kubernetes.namespace"
        );
        assert_eq!(
            refused_field(kubernetes_dashboard(
                keys(None, Some(FLUX)),
                Some(keys(Some("web"), Some(FLUX)))
            )),
            "kubernetes.flux_resource_path"
        );
        // dashboard needs its namespace; the deprecated path needs the deprecated namespace.
        assert_eq!(
            refused_field(kubernetes_dashboard(none, Some(keys(None, Some(FLUX))))),
            "kubernetes.dashboard.namespace"
        );
        assert_eq!(
            refused_field(kubernetes_dashboard(keys(None, Some(FLUX)), None)),
            "kubernetes.namespace"
        );
        assert_eq!(
            refused_field(kubernetes_dashboard(
                keys(None, Some(FLUX)),
                Some(keys(Some("web"), None))
            )),
            "kubernetes.namespace"
        );
        // Values are checked where they stand.
        assert_eq!(
            refused_field(kubernetes_dashboard(none, Some(keys(Some("Web"), None)))),
            "kubernetes.dashboard.namespace"
        );
        assert_eq!(
            refused_field(kubernetes_dashboard(
                none,
                Some(keys(Some("web"), Some("")))
            )),
            "kubernetes.dashboard.flux_resource_path"
        );
        assert_eq!(
            refused_field(kubernetes_dashboard(
                keys(Some("web"), Some(&"x".repeat(256))),
                None
            )),
            "kubernetes.flux_resource_path"
        );
    }
}
