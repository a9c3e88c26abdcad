//! GitOps sources of a resource group (SPEC 15), pure: what a Flux Kustomization, a Flux
//! HelmRelease or an Argo CD Application says it applied, read from the objects as the watch
//! cache keeps them, and GitLab's sync status of a Flux object. Nothing here asks a cluster:
//! `k8s::gitops` lists what [`resolve`] says it needs and runs it again.

pub mod argo;
pub mod helm;
pub mod inventory;
pub mod path;
pub mod resolve;
pub mod sync;

use crate::resources::tree::Tree;

/// The API group of Flux's Kustomization.
pub const KUSTOMIZE_GROUP: &str = "kustomize.toolkit.fluxcd.io";
/// The API group of Flux's HelmRelease.
pub const HELM_GROUP: &str = "helm.toolkit.fluxcd.io";
/// The API group of Argo CD's Application.
pub const ARGO_GROUP: &str = "argoproj.io";

/// An object named by a source: group (`""` for core), version when the source gives one,
/// kind, namespace (`None` for a cluster-scoped entry, or a Helm manifest's object that leaves
/// it to the release's namespace) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjRef {
    pub group: String,
    pub version: Option<String>,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjRef {
    /// `apiVersion` as objects spell it, when the version is known.
    pub fn api_version(&self) -> Option<String> {
        let version = self.version.as_deref()?;
        Some(if self.group.is_empty() {
            version.to_owned()
        } else {
            format!("{}/{version}", self.group)
        })
    }

    /// The reference of `object` itself (its `apiVersion`, `kind`, `metadata`).
    pub fn of(object: &Tree) -> ObjRef {
        let api_version = text(object, &["apiVersion"]);
        let (group, version) = split_api_version(api_version);
        ObjRef {
            group: group.to_owned(),
            version: Some(version.to_owned()).filter(|v| !v.is_empty()),
            kind: text(object, &["kind"]).to_owned(),
            namespace: Some(text(object, &["metadata", "namespace"]).to_owned())
                .filter(|ns| !ns.is_empty()),
            name: text(object, &["metadata", "name"]).to_owned(),
        }
    }

    /// `<group>/<kind> <namespace>/<name>` for messages.
    pub fn describe(&self) -> String {
        let kind = if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}/{}", self.group, self.kind)
        };
        match &self.namespace {
            Some(ns) => format!("{kind} {ns}/{}", self.name),
            None => format!("{kind} {}", self.name),
        }
    }
}

/// `(group, version)` of an `apiVersion` (`v1` is the core group's).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

/// The string at `path` in `object`, `""` when absent or not a string.
pub(crate) fn text<'a>(object: &'a Tree, path: &[&str]) -> &'a str {
    at(object, path).and_then(Tree::as_str).unwrap_or("")
}

/// The value at `path` in `object`.
pub(crate) fn at<'a>(object: &'a Tree, path: &[&str]) -> Option<&'a Tree> {
    path.iter().try_fold(object, |value, key| value.get(key))
}

/// Which source `object` is, if any: its group decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Kustomization,
    HelmRelease,
    Application,
}

impl SourceKind {
    pub fn of(group: &str, kind: &str) -> Option<SourceKind> {
        match (group, kind) {
            (KUSTOMIZE_GROUP, "Kustomization") => Some(SourceKind::Kustomization),
            (HELM_GROUP, "HelmRelease") => Some(SourceKind::HelmRelease),
            (ARGO_GROUP, "Application") => Some(SourceKind::Application),
            _ => None,
        }
    }
}

/// Whether `version` can be an API version (`v1`, `v2beta1`): a DNS label, as Kubernetes
/// requires. A source's objects are written by whoever may edit it, and the version goes into
/// a request path: anything else is not taken (discovery's version is used instead).
pub fn is_api_version(version: &str) -> bool {
    let b = version.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Whether `group` is one of Flux's (`*.toolkit.fluxcd.io`): its objects carry a sync status.
pub fn is_flux_group(group: &str) -> bool {
    group.ends_with(".toolkit.fluxcd.io")
}

#[cfg(test)]
pub(crate) fn tree(json: serde_json::Value) -> crate::resources::tree::TreeBuf {
    crate::resources::object::parse(&json.to_string()).expect("a JSON object parses")
}
