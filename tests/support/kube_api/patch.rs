//! The three PATCH formats: JSON merge patch (RFC 7386), a strategic merge patch that covers what
//! `kubectl apply`/`edit`/`label` send (lists of objects merged by `name`-like keys, `$patch`,
//! `$setElementOrder`, `$retainKeys`, `$deleteFromPrimitiveList`), and JSON patch (RFC 6902).

use serde_json::{Map, Value};

/// RFC 7386: objects merge recursively, `null` deletes, everything else replaces.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Keys that identify list elements in strategic merge patches of built-in types, by the field
/// they usually occur in (containers/env/volumes by `name`, ports by number, mounts by path).
const MERGE_KEYS: &[&str] = &[
    "name",
    "containerPort",
    "port",
    "mountPath",
    "devicePath",
    "type",
    "ip",
    "topologyKey",
];

/// A strategic merge patch, without per-field schema: lists of objects merge when every patch
/// element carries the same key from [`MERGE_KEYS`], other lists replace.
pub(crate) fn strategic(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip_directives(patch);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() || v.get("$patch").and_then(Value::as_str) == Some("delete") {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), v) {
            (Some(Value::Array(tl)), Value::Array(pl)) => merge_list(tl, pl),
            (Some(tv), Value::Object(_)) => strategic(tv, v),
            _ => {
                t.insert(k.clone(), strip_directives(v));
            }
        }
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(tl)), Value::Array(gone)) = (t.get_mut(field), v) {
                tl.retain(|x| !gone.contains(x));
            }
        } else if let Some(field) = k.strip_prefix("$setElementOrder/") {
            if let (Some(Value::Array(tl)), Value::Array(order)) = (t.get_mut(field), v) {
                reorder(tl, order);
            }
        } else if k == "$retainKeys" {
            if let Value::Array(keep) = v {
                t.retain(|key, _| keep.iter().any(|x| x.as_str() == Some(key.as_str())));
            }
        }
    }
}

fn merge_key(items: &[Value]) -> Option<&'static str> {
    if items.is_empty() || !items.iter().all(Value::is_object) {
        return None;
    }
    MERGE_KEYS
        .iter()
        .copied()
        .find(|k| items.iter().all(|i| i.get(*k).is_some()))
}

fn merge_list(target: &mut Vec<Value>, patch: &[Value]) {
    let Some(key) = merge_key(patch) else {
        *target = patch.iter().map(strip_directives).collect();
        return;
    };
    if !target.iter().all(Value::is_object) {
        *target = patch.iter().map(strip_directives).collect();
        return;
    }
    for item in patch {
        let id = &item[key];
        let pos = target.iter().position(|t| &t[key] == id);
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                target.remove(i);
            }
            (Some(i), false) => strategic(&mut target[i], item),
            (None, true) => {}
            (None, false) => target.push(strip_directives(item)),
        }
    }
}

/// Orders `list` like `order` (elements named there first, in that order; the rest after).
fn reorder(list: &mut [Value], order: &[Value]) {
    let key = merge_key(order);
    let id = |v: &Value| -> Value {
        match key {
            Some(k) => v[k].clone(),
            None => v.clone(),
        }
    };
    let rank = |v: &Value| {
        let v = id(v);
        order.iter().position(|o| id(o) == v).unwrap_or(usize::MAX)
    };
    list.sort_by_key(rank);
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// RFC 6902. Errors carry a message for a 422/400 Status.
pub(crate) fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let ops = ops
        .as_array()
        .ok_or("json patch must be an array of operations")?;
    for op in ops {
        let name = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or("operation has no \"op\"")?;
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or("operation has no \"path\"")?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or(format!("{name} operation has no \"value\""))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or(format!("{name} operation has no \"from\""))
        };
        match name {
            "add" => add(target, path, value()?)?,
            "remove" => {
                remove(target, path)?;
            }
            "replace" => replace(target, path, value()?)?,
            "move" => {
                let v = remove(target, from()?)?;
                add(target, path, v)?;
            }
            "copy" => {
                let v = target
                    .pointer(from()?)
                    .cloned()
                    .ok_or(format!("path {} not found", from()?))?;
                add(target, path, v)?;
            }
            "test" => {
                if target.pointer(path) != Some(&value()?) {
                    return Err(format!("test failed at {path}"));
                }
            }
            other => return Err(format!("unknown json patch operation {other:?}")),
        }
    }
    Ok(())
}

fn split_pointer(path: &str) -> Result<(&str, String), String> {
    let (parent, last) = path
        .rsplit_once('/')
        .ok_or(format!("invalid json pointer {path:?}"))?;
    Ok((parent, last.replace("~1", "/").replace("~0", "~")))
}

fn add(target: &mut Value, path: &str, v: Value) -> Result<(), String> {
    if path.is_empty() {
        *target = v;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    match target.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.insert(last, v);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>()
                    .map_err(|_| format!("invalid array index {last:?}"))?
            };
            if i > a.len() {
                return Err(format!("array index {i} out of bounds at {path}"));
            }
            a.insert(i, v);
            Ok(())
        }
        _ => Err(format!("doc is missing path: {path:?}")),
    }
}

/// As the apiserver's evanphx/json-patch v4 replaces: the parent must exist, an array's element
/// too, but a member an object lacks is set (v4 looks a member up without checking it is there).
fn replace(target: &mut Value, path: &str, v: Value) -> Result<(), String> {
    if path.is_empty() {
        *target = v;
        return Ok(());
    }
    let (parent, last) = split_pointer(path)?;
    match target.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.insert(last, v);
            Ok(())
        }
        Some(Value::Array(_)) => {
            remove(target, path)?;
            add(target, path, v)
        }
        _ => Err(format!(
            "replace operation does not apply: doc is missing path: {path}"
        )),
    }
}

fn remove(target: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_pointer(path)?;
    let missing = || format!("doc is missing path: {path:?}");
    match target.pointer_mut(parent) {
        Some(Value::Object(m)) => m.remove(&last).ok_or_else(missing),
        Some(Value::Array(a)) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}
