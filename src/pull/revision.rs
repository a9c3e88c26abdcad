//! What a Flux object applied, read from its status as the controllers write it: pure, tested
//! without a cluster.
//!
//! - kustomize-controller (`Kustomization` v1): `status.lastAppliedRevision`, e.g.
//!   `main@sha1:<40 hex>` for a Git branch, `refs/heads/main@sha1:…` or `refs/tags/v1@sha1:…`
//!   with `spec.ref.name`, `sha1:…` for a commit alone, `latest@sha256:<digest>` for an OCI
//!   artifact, `sha256:<digest>` for a Bucket; before Flux 2.0, `main/<40 hex>`.
//! - helm-controller (`HelmRelease` v2): `status.history`, newest first, each a Helm release
//!   (`name`, `namespace`, `version` the release's number, `chartName`, `chartVersion`,
//!   `digest`, `status`): a new newest entry is a new release.

use serde_json::Value;

/// `<group>/<version>/namespaces/<namespace>/<plural>/<name>`, GitLab's Flux resource path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FluxPath {
    pub group: String,
    pub version: String,
    pub namespace: String,
    pub plural: String,
    pub name: String,
}

impl FluxPath {
    pub fn parse(path: &str) -> Option<FluxPath> {
        let parts: Vec<&str> = path.split('/').collect();
        match parts.as_slice() {
            [group, version, "namespaces", namespace, plural, name]
                if parts.iter().all(|p| !p.is_empty()) =>
            {
                Some(FluxPath {
                    group: (*group).to_owned(),
                    version: (*version).to_owned(),
                    namespace: (*namespace).to_owned(),
                    plural: (*plural).to_owned(),
                    name: (*name).to_owned(),
                })
            }
            _ => None,
        }
    }

    pub fn is_kustomization(&self) -> bool {
        self.group == "kustomize.toolkit.fluxcd.io" && self.plural == "kustomizations"
    }

    pub fn is_helm_release(&self) -> bool {
        self.group == "helm.toolkit.fluxcd.io" && self.plural == "helmreleases"
    }
}

/// A revision a Flux object applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// As Flux wrote it (for a HelmRelease: `<release>.v<number>@<digest>`): a change of it is
    /// a deployment.
    pub revision: String,
    /// The Git commit, when the revision names one.
    pub sha: Option<String>,
    /// The ref the revision names before `@` (`main`, `refs/heads/main`, `refs/tags/v1`).
    pub named_ref: Option<String>,
    /// `(kind, namespace, name)` of the Kustomization's source (`spec.sourceRef`).
    pub source: Option<(String, String, String)>,
}

/// What `object` (of the kind `path` names) applied last, if it has applied anything.
pub fn applied(path: &FluxPath, object: &Value) -> Option<Applied> {
    if path.is_kustomization() {
        let revision = object["status"]["lastAppliedRevision"].as_str()?;
        if revision.is_empty() {
            return None;
        }
        let (named_ref, sha) = split_revision(revision);
        let source = &object["spec"]["sourceRef"];
        let source = source["kind"]
            .as_str()
            .zip(source["name"].as_str())
            .map(|(kind, name)| {
                let namespace = source["namespace"].as_str().unwrap_or(&path.namespace);
                (kind.to_owned(), namespace.to_owned(), name.to_owned())
            });
        Some(Applied {
            revision: revision.to_owned(),
            sha,
            named_ref,
            source,
        })
    } else if path.is_helm_release() {
        let newest = object["status"]["history"].as_array()?.first()?;
        let name = newest["name"].as_str()?;
        let version = newest["version"].as_i64()?;
        let digest = newest["digest"].as_str().unwrap_or_default();
        Some(Applied {
            revision: format!("{name}.v{version}@{digest}"),
            sha: None,
            named_ref: None,
            source: None,
        })
    } else {
        None
    }
}

/// `(ref, commit)` of a Kustomization's revision.
fn split_revision(revision: &str) -> (Option<String>, Option<String>) {
    let hex = |s: &str| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let (named, digest) = match revision.rsplit_once('@') {
        Some((named, digest)) => (Some(named), digest),
        None => (None, revision),
    };
    if let Some(sha) = digest.strip_prefix("sha1:").filter(|s| hex(s)) {
        return (named.map(str::to_owned), Some(sha.to_owned()));
    }
    if digest.contains(':') {
        // sha256 and the like: an artifact's digest, no commit.
        return (named.map(str::to_owned), None);
    }
    // Before Flux 2.0: `<branch>/<sha>`.
    match revision.rsplit_once('/') {
        Some((branch, sha)) if hex(sha) && named.is_none() => {
            (Some(branch.to_owned()), Some(sha.to_owned()))
        }
        _ => (named.map(str::to_owned), None),
    }
}

/// The ref GitLab is told, and whether it is a tag: the GitRepository's `spec.ref.branch` (or
/// `tag`), else the revision's `<branch>@sha1:` prefix (`refs/heads/` and `refs/tags/` read).
pub fn git_ref(applied: &Applied, git_repository: Option<&Value>) -> Option<(String, bool)> {
    if let Some(spec_ref) = git_repository.map(|r| &r["spec"]["ref"]) {
        if let Some(branch) = spec_ref["branch"].as_str().filter(|b| !b.is_empty()) {
            return Some((branch.to_owned(), false));
        }
        if let Some(tag) = spec_ref["tag"].as_str().filter(|t| !t.is_empty()) {
            return Some((tag.to_owned(), true));
        }
    }
    let named = applied.named_ref.as_deref()?;
    if let Some(tag) = named.strip_prefix("refs/tags/") {
        return Some((tag.to_owned(), true));
    }
    let branch = named.strip_prefix("refs/heads/").unwrap_or(named);
    (!branch.is_empty() && !branch.starts_with("refs/")).then(|| (branch.to_owned(), false))
}

/// Why a revision is not sent to GitLab, when it cannot be: GitLab's deployment needs a
/// commit and a ref.
pub fn not_for_gitlab(applied: &Applied, git_ref: Option<&(String, bool)>) -> Option<String> {
    match (&applied.sha, git_ref, &applied.source) {
        (None, _, Some((kind, ..))) if kind != "GitRepository" => Some(format!(
            "revision {} comes from a {kind} (not a Git repository): it names no commit and no \
             branch, so no deployment was created in GitLab",
            applied.revision
        )),
        (None, _, _) => Some(format!(
            "revision {} names no Git commit (an OCI artifact or a Helm release), so no \
             deployment was created in GitLab",
            applied.revision
        )),
        (Some(_), None, _) => Some(format!(
            "revision {} names no branch (the source follows a commit or a semver range), so no \
             deployment was created in GitLab",
            applied.revision
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SHA: &str = "6f4c1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b";

    fn kustomization() -> FluxPath {
        FluxPath::parse("kustomize.toolkit.fluxcd.io/v1/namespaces/flux-system/kustomizations/app")
            .unwrap()
    }

    #[test]
    fn paths() {
        let path = kustomization();
        assert_eq!(
            (path.namespace.as_str(), path.name.as_str()),
            ("flux-system", "app")
        );
        assert!(path.is_kustomization() && !path.is_helm_release());
        assert!(
            FluxPath::parse("helm.toolkit.fluxcd.io/v2/namespaces/a/helmreleases/b")
                .unwrap()
                .is_helm_release()
        );
        for bad in ["", "a/b/c", "g/v/ns/a/plural/name", "g/v/namespaces//p/n"] {
            assert_eq!(FluxPath::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn kustomization_revisions() {
        let path = kustomization();
        let with = |revision: &str| {
            applied(
                &path,
                &json!({"spec": {"sourceRef": {"kind": "GitRepository", "name": "app"}},
                                   "status": {"lastAppliedRevision": revision}}),
            )
            .unwrap()
        };
        let a = with(&format!("main@sha1:{SHA}"));
        assert_eq!(a.sha.as_deref(), Some(SHA));
        assert_eq!(git_ref(&a, None), Some(("main".into(), false)));
        assert_eq!(
            a.source,
            Some(("GitRepository".into(), "flux-system".into(), "app".into()))
        );
        assert_eq!(not_for_gitlab(&a, git_ref(&a, None).as_ref()), None);

        let tag = with(&format!("refs/tags/v1.2@sha1:{SHA}"));
        assert_eq!(git_ref(&tag, None), Some(("v1.2".into(), true)));
        let heads = with(&format!("refs/heads/release@sha1:{SHA}"));
        assert_eq!(git_ref(&heads, None), Some(("release".into(), false)));
        let legacy = with(&format!("main/{SHA}"));
        assert_eq!(
            (legacy.sha.as_deref(), git_ref(&legacy, None)),
            (Some(SHA), Some(("main".into(), false)))
        );

        let commit = with(&format!("sha1:{SHA}"));
        assert_eq!(git_ref(&commit, None), None);
        assert!(not_for_gitlab(&commit, None)
            .unwrap()
            .contains("names no branch"));
        // The GitRepository's branch wins over the revision's prefix.
        let repo = json!({"spec": {"ref": {"branch": "production"}}});
        assert_eq!(
            git_ref(&commit, Some(&repo)),
            Some(("production".into(), false))
        );

        let oci = applied(
            &path,
            &json!({"spec": {"sourceRef": {"kind": "OCIRepository", "name": "app"}},
            "status": {"lastAppliedRevision": "latest@sha256:0123abcd"}}),
        )
        .unwrap();
        assert_eq!(oci.sha, None);
        assert!(not_for_gitlab(&oci, git_ref(&oci, None).as_ref())
            .unwrap()
            .contains("OCIRepository"));

        assert_eq!(applied(&path, &json!({"status": {}})), None);
        assert_eq!(
            applied(&path, &json!({"status": {"lastAppliedRevision": ""}})),
            None
        );
    }

    #[test]
    fn helm_release_history() {
        let path =
            FluxPath::parse("helm.toolkit.fluxcd.io/v2/namespaces/apps/helmreleases/web").unwrap();
        let release = |version: i64| {
            json!({"status": {"history": [
            {"name": "web", "namespace": "apps", "version": version, "status": "deployed",
             "chartName": "web", "chartVersion": "1.0.0", "digest": format!("sha256:{version:064}")},
            {"name": "web", "namespace": "apps", "version": version - 1, "status": "superseded",
             "chartName": "web", "chartVersion": "0.9.0", "digest": "sha256:00"}]}})
        };
        let two = applied(&path, &release(2)).unwrap();
        assert!(two.revision.starts_with("web.v2@sha256:"));
        assert_ne!(two.revision, applied(&path, &release(3)).unwrap().revision);
        assert_eq!(two.sha, None);
        assert!(not_for_gitlab(&two, None)
            .unwrap()
            .contains("no Git commit"));
        assert_eq!(applied(&path, &json!({"status": {"history": []}})), None);
    }
}
