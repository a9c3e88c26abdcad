//! Field access: every read is optional so partial objects fall back to zero values, never panic.

use crate::resources::tree::{Items, Tree, TreeBuf};

pub(crate) trait Fields<'a>: Copy {
    /// The value at `path` (`&["status", "conditions"]`), through objects only.
    fn at(self, path: &[&str]) -> Option<&'a Tree>;
}

impl<'a> Fields<'a> for &'a Tree {
    fn at(self, path: &[&str]) -> Option<&'a Tree> {
        path.iter().try_fold(self, |v, key| v.get(key))
    }
}

impl<'a> Fields<'a> for &'a TreeBuf {
    fn at(self, path: &[&str]) -> Option<&'a Tree> {
        (**self).at(path)
    }
}

/// An object with its top-level fields found in one walk of its top-level map: a rule reads
/// `metadata`, `spec` and `status` many times over, and each read walked the map again.
pub(super) struct Obj<'a> {
    pub(super) value: &'a Tree,
    pub(super) kind: Option<&'a Tree>,
    pub(super) api_version: Option<&'a Tree>,
    pub(super) metadata: Option<&'a Tree>,
    pub(super) spec: Option<&'a Tree>,
    pub(super) status: Option<&'a Tree>,
}

impl<'a> Obj<'a> {
    pub(super) fn new(value: &'a Tree) -> Self {
        let mut obj = Obj {
            value,
            kind: None,
            api_version: None,
            metadata: None,
            spec: None,
            status: None,
        };
        for (key, field) in value.as_object().into_iter().flatten() {
            let slot = match key {
                "kind" => &mut obj.kind,
                "apiVersion" => &mut obj.api_version,
                "metadata" => &mut obj.metadata,
                "spec" => &mut obj.spec,
                "status" => &mut obj.status,
                _ => continue,
            };
            *slot = Some(field);
        }
        obj
    }
}

impl<'a> Fields<'a> for &Obj<'a> {
    fn at(self, path: &[&str]) -> Option<&'a Tree> {
        let Some((first, rest)) = path.split_first() else {
            return Some(self.value);
        };
        let top = match *first {
            "kind" => self.kind,
            "apiVersion" => self.api_version,
            "metadata" => self.metadata,
            "spec" => self.spec,
            "status" => self.status,
            key => self.value.get(key),
        };
        top?.at(rest)
    }
}

pub(crate) fn at<'a>(v: impl Fields<'a>, path: &[&str]) -> Option<&'a Tree> {
    v.at(path)
}

pub(crate) fn str_at<'a>(v: impl Fields<'a>, path: &[&str]) -> Option<&'a str> {
    at(v, path)?.as_str()
}

/// Integer field, or 0 as Go's typed structs would read a missing one.
pub(crate) fn int_at<'a>(v: impl Fields<'a>, path: &[&str]) -> i64 {
    opt_int_at(v, path).unwrap_or(0)
}

/// Integer field where absence matters (`spec.replicas` unset is not the same as 0 in Argo).
pub(crate) fn opt_int_at<'a>(v: impl Fields<'a>, path: &[&str]) -> Option<i64> {
    at(v, path)?.as_i64()
}

pub(crate) fn bool_at<'a>(v: impl Fields<'a>, path: &[&str]) -> bool {
    at(v, path).and_then(Tree::as_bool).unwrap_or(false)
}

pub(crate) fn list_at<'a>(v: impl Fields<'a>, path: &[&str]) -> Items<'a> {
    at(v, path).and_then(Tree::as_array).unwrap_or_default()
}

/// The first `status.conditions` entry of the given type.
pub(crate) fn condition<'a>(obj: impl Fields<'a>, kind: &str) -> Option<&'a Tree> {
    list_at(obj, &["status", "conditions"]).find(|c| str_at(*c, &["type"]) == Some(kind))
}

/// Whether the condition exists and its `status` is exactly `status` ("True", "False", ...).
pub(crate) fn cond_status_is(cond: Option<&Tree>, status: &str) -> bool {
    cond.and_then(|c| str_at(c, &["status"])) == Some(status)
}

pub(crate) fn cond_reason(cond: Option<&Tree>) -> &str {
    cond.and_then(|c| str_at(c, &["reason"])).unwrap_or("")
}

/// The condition's message, or its reason when the controller left the message empty.
pub(crate) fn cond_message(cond: Option<&Tree>) -> &str {
    match cond.and_then(|c| str_at(c, &["message"])) {
        Some(m) if !m.is_empty() => m,
        _ => cond_reason(cond),
    }
}

pub(crate) fn name<'a>(obj: impl Fields<'a>) -> &'a str {
    str_at(obj, &["metadata", "name"]).unwrap_or("")
}

/// "apps/v1" → "apps", "v1" → "" (core). A missing apiVersion is read as core, because list
/// responses often omit it on their items.
pub(crate) fn api_group<'a>(obj: impl Fields<'a>) -> &'a str {
    str_at(obj, &["apiVersion"])
        .and_then(|v| v.split_once('/'))
        .map_or("", |(group, _)| group)
}

/// "apps/v1" → "v1", "v1" → "v1"; "" when there is none.
pub(crate) fn api_version<'a>(obj: impl Fields<'a>) -> &'a str {
    str_at(obj, &["apiVersion"]).map_or("", |v| v.rsplit_once('/').map_or(v, |(_, v)| v))
}

/// Argo CD's finalizer on hooks, which keeps them judged by their rule while they are deleted.
pub(crate) const HOOK_FINALIZER: &str = "argocd.argoproj.io/hook-finalizer";

/// Whether the object is "Pending deletion" as gitops-engine says: a `deletionTimestamp` that
/// reads as a time (Argo ignores one that does not), and no hook finalizer.
pub(crate) fn is_being_deleted<'a>(obj: impl Fields<'a>) -> bool {
    let deleted = str_at(obj, &["metadata", "deletionTimestamp"])
        .is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok());
    deleted
        && !list_at(obj, &["metadata", "finalizers"])
            .iter()
            .any(|f| f.as_str() == Some(HOOK_FINALIZER))
}

/// The controller has not yet seen the latest spec, so any status it reports is stale.
pub(crate) fn generation_lags<'a>(obj: impl Fields<'a>) -> bool {
    int_at(obj, &["metadata", "generation"]) > int_at(obj, &["status", "observedGeneration"])
}
