//! What changed between two snapshots (SPEC 10): resources added, removed and modified, an
//! RFC 6902 patch from before to after for each modified one, and the container images that
//! changed. Pure.
//!
//! The patch is written here rather than with a crate: thirty lines cover what manifests need
//! (`add`, `remove`, `replace`; arrays compared by position, as `kubectl diff` shows them), and
//! its paths are RFC 6901 pointers.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::snapshot::{Entry, Key};

/// How two lists of entries differ, by resource identity.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes<'a> {
    pub added: Vec<&'a Entry>,
    pub removed: Vec<&'a Entry>,
    /// Before and after, with different manifests.
    pub modified: Vec<(&'a Entry, &'a Entry)>,
}

/// Compares two snapshots' entries (each sorted by [`Entry::key`], as stored).
pub fn compare<'a>(before: &'a [Entry], after: &'a [Entry]) -> Changes<'a> {
    let old: BTreeMap<Key<'_>, &Entry> = before.iter().map(|e| (e.key(), e)).collect();
    let new: BTreeMap<Key<'_>, &Entry> = after.iter().map(|e| (e.key(), e)).collect();
    let mut changes = Changes::default();
    for (key, e) in &new {
        match old.get(key) {
            None => changes.added.push(e),
            Some(b) if b.manifest != e.manifest => changes.modified.push((b, e)),
            Some(_) => {}
        }
    }
    changes.removed = old
        .iter()
        .filter(|(key, _)| !new.contains_key(*key))
        .map(|(_, e)| *e)
        .collect();
    changes
}

/// The RFC 6902 patch that turns `before` into `after`.
pub fn patch(before: &Value, after: &Value) -> Vec<Value> {
    let mut ops = Vec::new();
    diff(before, after, &mut String::new(), &mut ops);
    ops
}

fn diff(before: &Value, after: &Value, path: &mut String, ops: &mut Vec<Value>) {
    if before == after {
        return;
    }
    match (before, after) {
        (Value::Object(old), Value::Object(new)) => {
            for (key, value) in old {
                let len = push(path, key);
                match new.get(key) {
                    None => ops.push(json!({"op": "remove", "path": path})),
                    Some(next) => diff(value, next, path, ops),
                }
                path.truncate(len);
            }
            for (key, value) in new {
                if !old.contains_key(key) {
                    let len = push(path, key);
                    ops.push(json!({"op": "add", "path": path, "value": value}));
                    path.truncate(len);
                }
            }
        }
        (Value::Array(old), Value::Array(new)) => {
            let common = old.len().min(new.len());
            for i in 0..common {
                let len = push(path, &i.to_string());
                diff(&old[i], &new[i], path, ops);
                path.truncate(len);
            }
            for (i, value) in new.iter().enumerate().skip(common) {
                let len = push(path, &i.to_string());
                ops.push(json!({"op": "add", "path": path, "value": value}));
                path.truncate(len);
            }
            // From the end, so that each index still names the element meant.
            for i in (common..old.len()).rev() {
                let len = push(path, &i.to_string());
                ops.push(json!({"op": "remove", "path": path}));
                path.truncate(len);
            }
        }
        _ => ops.push(json!({"op": "replace", "path": path, "value": after})),
    }
}

/// Appends `/token` (RFC 6901: `~` as `~0`, `/` as `~1`); returns the length to truncate back to.
fn push(path: &mut String, token: &str) -> usize {
    let len = path.len();
    path.push('/');
    for c in token.chars() {
        match c {
            '~' => path.push_str("~0"),
            '/' => path.push_str("~1"),
            c => path.push(c),
        }
    }
    len
}

/// One container whose image changed (added or removed containers have `None` on one side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageChange {
    pub container: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// The images of a manifest's containers by name: a Pod's, and those of any pod template in
/// its spec (a workload's `spec.template`, a CronJob's `spec.jobTemplate.spec.template`).
/// Init and ephemeral containers count too, named as they are.
pub fn images(manifest: &Value) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    if let Some(spec) = manifest.get("spec") {
        collect_images(spec, &mut found, 0);
    }
    found
}

fn collect_images(spec: &Value, found: &mut BTreeMap<String, String>, depth: usize) {
    let Value::Object(spec) = spec else { return };
    for field in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec
            .get(field)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let (Some(name), Some(image)) = (
                c.get("name").and_then(Value::as_str),
                c.get("image").and_then(Value::as_str),
            ) {
                found.insert(name.to_owned(), image.to_owned());
            }
        }
    }
    // A pod template nests at most `jobTemplate.spec.template.spec`: a bounded walk.
    if depth < 4 {
        for nested in ["template", "jobTemplate"] {
            if let Some(inner) = spec.get(nested).and_then(|t| t.get("spec")) {
                collect_images(inner, found, depth + 1);
            }
        }
    }
}

/// The containers whose image differs between two manifests of one resource, by name.
pub fn image_changes(before: &Value, after: &Value) -> Vec<ImageChange> {
    let old = images(before);
    let new = images(after);
    let mut names: Vec<&String> = old.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|n| old.get(*n) != new.get(*n))
        .map(|n| ImageChange {
            container: n.clone(),
            before: old.get(n).cloned(),
            after: new.get(n).cloned(),
        })
        .collect()
}

/// What a deployment changed, ready to show: each modified resource with its patch, and the
/// image changes of the modified ones.
#[derive(Debug, PartialEq)]
pub struct Report<'a> {
    pub added: Vec<&'a Entry>,
    pub removed: Vec<&'a Entry>,
    /// After, and the patch from before.
    pub modified: Vec<(&'a Entry, Vec<Value>)>,
    /// After, and one changed container.
    pub images: Vec<(&'a Entry, ImageChange)>,
}

/// The report of `before` to `after`, with `manifests` (by hex hash) of the changed resources;
/// a manifest not given counts as empty.
pub fn report<'a>(
    before: &'a [Entry],
    after: &'a [Entry],
    manifests: &BTreeMap<String, Value>,
) -> Report<'a> {
    let changes = compare(before, after);
    let empty = empty();
    let manifest = |e: &Entry| manifests.get(&e.manifest).unwrap_or(&empty).clone();
    let mut images = Vec::new();
    let modified = changes
        .modified
        .iter()
        .map(|(b, a)| {
            let (old, new) = (manifest(b), manifest(a));
            images.extend(image_changes(&old, &new).into_iter().map(|c| (*a, c)));
            (*a, patch(&old, &new))
        })
        .collect();
    Report {
        added: changes.added,
        removed: changes.removed,
        modified,
        images,
    }
}

/// Applies an RFC 6902 patch of `add`, `remove` and `replace` operations (what [`patch`]
/// writes); `None` when an operation does not apply. For checking patches, here and in tests.
pub fn apply(document: &Value, ops: &[Value]) -> Option<Value> {
    let mut doc = document.clone();
    for op in ops {
        let path = op.get("path")?.as_str()?;
        let kind = op.get("op")?.as_str()?;
        if path.is_empty() {
            match kind {
                "add" | "replace" => doc = op.get("value")?.clone(),
                _ => return None,
            }
            continue;
        }
        let tokens: Vec<String> = path
            .strip_prefix('/')?
            .split('/')
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect();
        let (last, parents) = tokens.split_last()?;
        let mut target = &mut doc;
        for t in parents {
            target = match target {
                Value::Object(map) => map.get_mut(t)?,
                Value::Array(items) => items.get_mut(t.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        match (kind, target) {
            ("add", Value::Object(map)) => {
                map.insert(last.clone(), op.get("value")?.clone());
            }
            ("replace", Value::Object(map)) => {
                *map.get_mut(last)? = op.get("value")?.clone();
            }
            ("remove", Value::Object(map)) => {
                map.remove(last)?;
            }
            ("add", Value::Array(items)) => {
                let i = if last == "-" {
                    items.len()
                } else {
                    last.parse().ok()?
                };
                if i > items.len() {
                    return None;
                }
                items.insert(i, op.get("value")?.clone());
            }
            ("replace", Value::Array(items)) => {
                *items.get_mut(last.parse::<usize>().ok()?)? = op.get("value")?.clone();
            }
            ("remove", Value::Array(items)) => {
                let i: usize = last.parse().ok()?;
                if i >= items.len() {
                    return None;
                }
                items.remove(i);
            }
            _ => return None,
        }
    }
    Some(doc)
}

/// A summary line per change, for people (`envlens history`).
pub fn describe_patch(ops: &[Value]) -> Vec<String> {
    ops.iter()
        .map(|op| {
            let kind = op.get("op").and_then(Value::as_str).unwrap_or("?");
            let path = op.get("path").and_then(Value::as_str).unwrap_or("");
            match op.get("value") {
                Some(v) if !v.is_object() && !v.is_array() => format!("{kind} {path} = {v}"),
                Some(_) => format!("{kind} {path} = …"),
                None => format!("{kind} {path}"),
            }
        })
        .collect()
}

/// An empty object, for a manifest that cannot be read back.
pub fn empty() -> Value {
    Value::Object(Map::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::snapshot::{hex, sha256};

    fn check(before: Value, after: Value) -> Vec<Value> {
        let ops = patch(&before, &after);
        assert_eq!(
            apply(&before, &ops).as_ref(),
            Some(&after),
            "patch {ops:?} does not turn {before} into {after}"
        );
        ops
    }

    #[test]
    fn equal_documents_have_an_empty_patch() {
        assert!(check(json!({"a": [1, {"b": 2}]}), json!({"a": [1, {"b": 2}]})).is_empty());
    }

    #[test]
    fn an_image_change_is_one_replace() {
        let before = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "web", "image": "web:1"}, {"name": "side", "image": "side:1"}]}}}});
        let mut after = before.clone();
        after["spec"]["template"]["spec"]["containers"][0]["image"] = json!("web:2");
        assert_eq!(
            check(before, after),
            vec![
                json!({"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "web:2"})
            ]
        );
    }

    #[test]
    fn keys_added_and_removed() {
        let ops = check(
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            json!({"metadata": {"labels": {"a": "1", "c": "3"}}, "spec": {}}),
        );
        assert_eq!(
            ops,
            vec![
                json!({"op": "remove", "path": "/metadata/labels/b"}),
                json!({"op": "add", "path": "/metadata/labels/c", "value": "3"}),
                json!({"op": "add", "path": "/spec", "value": {}}),
            ]
        );
    }

    #[test]
    fn arrays_grow_and_shrink_by_position() {
        let ops = check(json!({"a": [1, 2, 3, 4]}), json!({"a": [1, 9]}));
        assert_eq!(
            ops,
            vec![
                json!({"op": "replace", "path": "/a/1", "value": 9}),
                json!({"op": "remove", "path": "/a/3"}),
                json!({"op": "remove", "path": "/a/2"}),
            ]
        );
        let ops = check(json!([1]), json!([1, {"x": 1}, 3]));
        assert_eq!(
            ops,
            vec![
                json!({"op": "add", "path": "/1", "value": {"x": 1}}),
                json!({"op": "add", "path": "/2", "value": 3}),
            ]
        );
    }

    #[test]
    fn pointer_tokens_are_escaped() {
        let ops = check(
            json!({"metadata": {"annotations": {"app.gitlab.com/env": "a", "x~y": 1}}}),
            json!({"metadata": {"annotations": {"app.gitlab.com/env": "b", "x~y": 2}}}),
        );
        let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/metadata/annotations/app.gitlab.com~1env",
                "/metadata/annotations/x~0y"
            ]
        );
    }

    #[test]
    fn a_type_change_and_the_root_are_replaced() {
        assert_eq!(
            check(json!({"a": {"b": 1}}), json!({"a": [1]})),
            vec![json!({"op": "replace", "path": "/a", "value": [1]})]
        );
        assert_eq!(
            check(json!(1), json!("x")),
            vec![json!({"op": "replace", "path": "", "value": "x"})]
        );
    }

    #[test]
    fn apply_refuses_what_does_not_apply() {
        assert_eq!(
            apply(&json!({}), &[json!({"op": "remove", "path": "/a"})]),
            None
        );
        assert_eq!(
            apply(
                &json!([]),
                &[json!({"op": "add", "path": "/3", "value": 1})]
            ),
            None
        );
        assert_eq!(
            apply(&json!({}), &[json!({"op": "move", "path": "/a"})]),
            None
        );
    }

    #[test]
    fn images_of_pods_workloads_and_cron_jobs() {
        let pod = json!({"spec": {"initContainers": [{"name": "init", "image": "busybox"}],
                                  "containers": [{"name": "app", "image": "app:1"}, {"name": "noimage"}]}});
        assert_eq!(
            images(&pod).into_iter().collect::<Vec<_>>(),
            [
                ("app".into(), "app:1".into()),
                ("init".into(), "busybox".into())
            ]
        );
        let cron = json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {
            "containers": [{"name": "job", "image": "job:7"}]}}}}}});
        assert_eq!(images(&cron)["job"], "job:7");
        assert!(images(&json!({"data": {"image": "x"}})).is_empty());
    }

    #[test]
    fn image_changes_name_each_container() {
        let before = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "web", "image": "web:1"}, {"name": "old", "image": "old:1"}, {"name": "same", "image": "s:1"}]}}}});
        let after = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "web", "image": "web:2"}, {"name": "same", "image": "s:1"}, {"name": "new", "image": "new:1"}]}}}});
        assert_eq!(
            image_changes(&before, &after),
            vec![
                ImageChange {
                    container: "new".into(),
                    before: None,
                    after: Some("new:1".into())
                },
                ImageChange {
                    container: "old".into(),
                    before: Some("old:1".into()),
                    after: None
                },
                ImageChange {
                    container: "web".into(),
                    before: Some("web:1".into()),
                    after: Some("web:2".into())
                },
            ]
        );
    }

    fn entry(kind: &str, name: &str, manifest: &str) -> Entry {
        Entry {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: Some("shop".into()),
            name: name.into(),
            uid: format!("uid-{name}-{manifest}"),
            created_at: None,
            health: None,
            health_message: None,
            manifest: hex(&sha256(manifest.as_bytes())),
        }
    }

    #[test]
    fn compare_finds_added_removed_and_modified_by_identity() {
        let before = vec![
            entry("ConfigMap", "a", "1"),
            entry("ConfigMap", "b", "1"),
            entry("Pod", "old", "1"),
        ];
        let after = vec![
            entry("ConfigMap", "a", "1"),
            entry("ConfigMap", "b", "2"),
            entry("Pod", "new", "1"),
        ];
        let changes = compare(&before, &after);
        assert_eq!(changes.added, vec![&after[2]]);
        assert_eq!(changes.removed, vec![&before[2]]);
        assert_eq!(changes.modified, vec![(&before[1], &after[1])]);
        // A resource created again (new uid), same manifest: unchanged.
        let mut again = before.clone();
        again[0].uid = "other".into();
        assert_eq!(compare(&before, &again), Changes::default());
    }

    #[test]
    fn report_patches_modified_resources_and_names_their_images() {
        let old_web = json!({"kind": "Deployment", "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "app:1"}]}}}});
        let new_web = json!({"kind": "Deployment", "spec": {"template": {"spec": {"containers": [{"name": "app", "image": "app:2"}]}}}});
        let pod =
            json!({"kind": "Pod", "spec": {"containers": [{"name": "app", "image": "app:2"}]}});
        let mut manifests = BTreeMap::new();
        let mut e = |kind: &str, name: &str, manifest: &Value| {
            let hash = hex(&sha256(manifest.to_string().as_bytes()));
            manifests.insert(hash.clone(), manifest.clone());
            Entry {
                manifest: hash,
                ..entry(kind, name, "")
            }
        };
        let before = vec![e("Deployment", "web", &old_web), e("Pod", "web-1", &pod)];
        let after = vec![e("Deployment", "web", &new_web), e("Pod", "web-2", &pod)];
        let report = report(&before, &after, &manifests);
        assert_eq!(report.added, vec![&after[1]]);
        assert_eq!(report.removed, vec![&before[1]]);
        assert_eq!(
            report.modified,
            vec![(
                &after[0],
                vec![
                    json!({"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "app:2"})
                ]
            )]
        );
        // Replaced Pods are added and removed, not image changes: the Deployment names it.
        assert_eq!(
            report.images,
            vec![(
                &after[0],
                ImageChange {
                    container: "app".into(),
                    before: Some("app:1".into()),
                    after: Some("app:2".into())
                }
            )]
        );
    }

    #[test]
    fn describe_patch_reads_as_lines() {
        let ops = vec![
            json!({"op": "replace", "path": "/spec/replicas", "value": 3}),
            json!({"op": "add", "path": "/spec/x", "value": {"a": 1}}),
            json!({"op": "remove", "path": "/spec/y"}),
        ];
        assert_eq!(
            describe_patch(&ops),
            [
                "replace /spec/replicas = 3",
                "add /spec/x = …",
                "remove /spec/y"
            ]
        );
    }
}
