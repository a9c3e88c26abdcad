//! create, update (PUT), patch, delete and deletecollection, plus the `scale` and `status`
//! subresources, with the server-set fields and preconditions clients rely on.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::header;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::discovery::ResourceKind;
use super::handlers::{filter_for, Ctx, Target};
use super::patch;
use super::status::{details, json_response, ApiError};
use super::store::{set_rv, Write};

/// RFC 3339 in whole seconds, as metav1.Time serializes.
pub(crate) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A random version-4 UUID, from std's per-process random hasher keys (no extra dependency).
pub(crate) fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0x0fff,
        (b >> 48) & 0x3fff | 0x8000,
        b & 0xffff_ffff_ffff
    )
}

fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// `generateName` suffix: five characters from the apiserver's alphabet.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut r = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(r % ALPHABET.len() as u64) as usize] as char;
            r /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// Only JSON bodies are understood. Typed client-go clients (`kubectl create namespace|configmap|
/// deployment …`) send protobuf, which would need every type's schema: they get a 415 saying so.
fn check_content_type(ctx: &Ctx) -> Result<(), ApiError> {
    let ct = ctx
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if ct.contains("protobuf") || ct.contains("cbor") {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct:?})"),
        ));
    }
    Ok(())
}

fn parse_object(ctx: &Ctx) -> Result<Value, ApiError> {
    check_content_type(ctx)?;
    let body = &ctx.body;
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json ({e})"
        ))
    })?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(v)
}

/// Fills `apiVersion`/`kind` and rejects a body of another kind.
fn check_type(obj: &mut Value, kind: &ResourceKind) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let api_version = kind.api_version();
    match obj.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v != api_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            )))
        }
        _ => obj["apiVersion"] = json!(api_version),
    }
    match obj.get("kind").and_then(Value::as_str) {
        Some(k) if k != kind.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                kind.kind
            )))
        }
        _ => obj["kind"] = json!(kind.kind),
    }
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    Ok(())
}

/// Puts the URL's namespace into the object, refusing a body that names another one.
fn check_namespace(obj: &mut Value, t: &Target) -> Result<(), ApiError> {
    let meta = &mut obj["metadata"];
    match &t.namespace {
        Some(ns) => {
            match meta.get("namespace").and_then(Value::as_str) {
                Some(n) if !n.is_empty() && n != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ))
                }
                _ => meta["namespace"] = json!(ns),
            }
        }
        None => {
            if let Some(m) = meta.as_object_mut() {
                m.remove("namespace");
            }
        }
    }
    Ok(())
}

fn dry_run(ctx: &Ctx) -> bool {
    ctx.query.get("dryRun").is_some_and(|d| d == "All")
}

/// Server-set fields of a newly created object.
fn fill_new(obj: &mut Value, rv: u64) {
    let meta = &mut obj["metadata"];
    meta["uid"] = json!(new_uid());
    meta["creationTimestamp"] = json!(now());
    meta["resourceVersion"] = json!(rv.to_string());
    if obj.get("spec").is_some() {
        obj["metadata"]["generation"] = json!(1);
    }
    if obj["kind"] == "Namespace" && obj["status"]["phase"].is_null() {
        obj["status"] = json!({"phase": "Active"});
    }
}

/// Keeps what a write cannot change (identity, creation time) and bumps `generation` on spec
/// changes, as the apiserver's strategies do.
fn carry_over(new: &mut Value, old: &Value, rv: u64) {
    for field in ["name", "namespace", "uid", "creationTimestamp"] {
        match old["metadata"].get(field) {
            Some(v) => new["metadata"][field] = v.clone(),
            None => {
                if let Some(m) = new["metadata"].as_object_mut() {
                    m.remove(field);
                }
            }
        }
    }
    // Objects put in with `insert` may lack a generation; they count as generation 1.
    let generation = old["metadata"]["generation"]
        .as_i64()
        .or_else(|| old.get("spec").map(|_| 1));
    match generation {
        Some(g) if new.get("spec") != old.get("spec") => {
            new["metadata"]["generation"] = json!(g + 1)
        }
        Some(g) => new["metadata"]["generation"] = json!(g),
        None if new.get("spec").is_some() => new["metadata"]["generation"] = json!(1),
        None => {}
    }
    set_rv(new, rv);
}

/// POST: names from `generateName`, 409 AlreadyExists, server-set uid/timestamps/generation.
pub(crate) fn create(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    let mut obj = parse_object(ctx)?;
    check_type(&mut obj, &t.kind)?;
    check_namespace(&mut obj, t)?;
    let name = match obj["metadata"]["name"].as_str().filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => match obj["metadata"]["generateName"]
            .as_str()
            .filter(|n| !n.is_empty())
        {
            Some(prefix) => format!("{prefix}{}", random_suffix()),
            None => {
                return Err(ApiError::invalid(
                    &t.kind,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ))
            }
        },
    };
    obj["metadata"]["name"] = json!(name);
    let dry = dry_run(ctx);
    let stored = ctx
        .api
        .inner
        .store
        .write(&t.kind.store_key(), t.ns(), &name, |prev, rv| {
            if prev.is_some() {
                return Err(ApiError::already_exists(&t.kind, &name));
            }
            fill_new(&mut obj, rv);
            Ok(if dry {
                Write::DryRun(obj)
            } else {
                Write::Put(obj)
            })
        })?;
    Ok(json_response(201, &stored))
}

/// The preconditions a write body may carry: a non-empty resourceVersion must be current.
fn check_rv(body: &Value, current: &Value, t: &Target, name: &str) -> Result<(), ApiError> {
    match body["metadata"]["resourceVersion"].as_str() {
        Some(rv)
            if !rv.is_empty() && Some(rv) != current["metadata"]["resourceVersion"].as_str() =>
        {
            Err(ApiError::conflict(&t.kind, name))
        }
        _ => Ok(()),
    }
}

/// PUT. On the object itself the body replaces everything, status included (the apiserver would
/// keep the old status; tests find it handy to set it here); on `/status` only status changes.
pub(crate) fn update(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    let name = t.name.clone().unwrap_or_default();
    let mut body = parse_object(ctx)?;
    if t.subresource.as_deref() == Some("scale") {
        return write_scale(ctx, t, |scale| {
            check_rv(&body, scale, t, &name)?;
            *scale = body;
            Ok(())
        });
    }
    check_type(&mut body, &t.kind)?;
    check_namespace(&mut body, t)?;
    match body["metadata"]["name"].as_str() {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )))
        }
        _ => body["metadata"]["name"] = json!(name),
    }
    let status_only = t.subresource.as_deref() == Some("status");
    let dry = dry_run(ctx);
    let store = &ctx.api.inner.store;
    let stored = store.write(&t.kind.store_key(), t.ns(), &name, |prev, rv| {
        let prev = prev.ok_or_else(|| ApiError::not_found(&t.kind, &name))?;
        check_rv(&body, prev, t, &name)?;
        let mut new = if status_only {
            let mut n = prev.clone();
            n["status"] = body["status"].clone();
            n
        } else {
            body
        };
        carry_over(&mut new, prev, rv);
        Ok(if dry {
            Write::DryRun(new)
        } else {
            Write::Put(new)
        })
    })?;
    Ok(json_response(200, &stored))
}

fn apply_patch(ctx: &Ctx, target: &mut Value, patch_doc: &Value) -> Result<(), ApiError> {
    let content_type = ctx
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim();
    match content_type {
        "application/merge-patch+json" | "application/apply-patch+yaml" => {
            patch::merge(target, patch_doc);
            Ok(())
        }
        "application/strategic-merge-patch+json" => {
            patch::strategic(target, patch_doc);
            Ok(())
        }
        "application/json-patch+json" => {
            patch::json_patch(target, patch_doc).map_err(|e| ApiError::new(422, "Invalid", e))
        }
        other => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"
            ),
        )),
    }
}

fn is_apply(ctx: &Ctx) -> bool {
    ctx.headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/apply-patch+yaml"))
}

/// PATCH in all four content types. Server-side apply is treated as a merge patch that may
/// create the object (no field ownership). On `/status` only status changes.
pub(crate) fn patch_object(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    let name = t.name.clone().unwrap_or_default();
    let patch_doc: Value = serde_json::from_slice(&ctx.body).map_err(|e| {
        ApiError::bad_request(format!(
            "error decoding patch (only JSON is understood here): {e}"
        ))
    })?;
    if t.subresource.as_deref() == Some("scale") {
        return write_scale(ctx, t, |scale| {
            let before = scale.clone();
            apply_patch(ctx, scale, &patch_doc)?;
            check_rv(scale, &before, t, &name)
        });
    }
    let status_only = t.subresource.as_deref() == Some("status");
    let apply = is_apply(ctx);
    let dry = dry_run(ctx);
    let mut created = false;
    let stored = ctx
        .api
        .inner
        .store
        .write(&t.kind.store_key(), t.ns(), &name, |prev, rv| {
            let new = match prev {
                // Server-side apply creates what does not exist yet.
                None if apply && !status_only => {
                    let mut obj = patch_doc.clone();
                    check_type(&mut obj, &t.kind)?;
                    check_namespace(&mut obj, t)?;
                    obj["metadata"]["name"] = json!(name);
                    fill_new(&mut obj, rv);
                    created = true;
                    obj
                }
                None => return Err(ApiError::not_found(&t.kind, &name)),
                Some(prev) => {
                    let mut patched = prev.clone();
                    apply_patch(ctx, &mut patched, &patch_doc)?;
                    if !patched.is_object() || !patched["metadata"].is_object() {
                        return Err(ApiError::invalid(
                            &t.kind,
                            &name,
                            "the patched object must be a JSON object with metadata",
                        ));
                    }
                    check_rv(&patched, prev, t, &name)?;
                    let mut new = if status_only {
                        let mut n = prev.clone();
                        n["status"] = patched["status"].clone();
                        n
                    } else {
                        patched
                    };
                    new["apiVersion"] = prev["apiVersion"].clone();
                    new["kind"] = prev["kind"].clone();
                    carry_over(&mut new, prev, rv);
                    new
                }
            };
            Ok(if dry {
                Write::DryRun(new)
            } else {
                Write::Put(new)
            })
        })?;
    Ok(json_response(if created { 201 } else { 200 }, &stored))
}

/// The autoscaling/v1 Scale view of a workload.
pub(crate) fn scale_of(obj: &Value) -> Value {
    let meta = &obj["metadata"];
    let selector = obj["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let mut scale_meta = Map::new();
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta.get(f) {
            scale_meta.insert(f.into(), v.clone());
        }
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": scale_meta,
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1)},
        "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector},
    })
}

/// Applies `change` to the Scale view and writes `spec.replicas` back to the workload.
fn write_scale(
    ctx: &Ctx,
    t: &Target,
    change: impl FnOnce(&mut Value) -> Result<(), ApiError>,
) -> Result<Response, ApiError> {
    let name = t.name.clone().unwrap_or_default();
    let dry = dry_run(ctx);
    let stored = ctx
        .api
        .inner
        .store
        .write(&t.kind.store_key(), t.ns(), &name, |prev, rv| {
            let prev = prev.ok_or_else(|| ApiError::not_found(&t.kind, &name))?;
            let mut scale = scale_of(prev);
            change(&mut scale)?;
            let replicas = scale["spec"]["replicas"].as_i64().ok_or_else(|| {
                ApiError::invalid(&t.kind, &name, "spec.replicas: Required value")
            })?;
            let mut new = prev.clone();
            if !new["spec"].is_object() {
                new["spec"] = json!({});
            }
            new["spec"]["replicas"] = json!(replicas);
            carry_over(&mut new, prev, rv);
            Ok(if dry {
                Write::DryRun(new)
            } else {
                Write::Put(new)
            })
        })?;
    Ok(json_response(200, &scale_of(&stored)))
}

/// Deletes at once (no finalizers, no grace period) and answers a Success Status, as the
/// apiserver does for objects that are gone immediately. A namespace takes its contents along.
pub(crate) fn delete(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    let name = t.name.clone().unwrap_or_default();
    let inner = &ctx.api.inner;
    let gone = if dry_run(ctx) {
        inner
            .store
            .get(&t.kind.store_key(), t.ns(), &name)
            .ok_or_else(|| ApiError::not_found(&t.kind, &name))?
    } else {
        let gone = inner
            .store
            .write(&t.kind.store_key(), t.ns(), &name, |prev, _| {
                prev.map(|_| Write::Delete)
                    .ok_or_else(|| ApiError::not_found(&t.kind, &name))
            })?;
        if t.kind.group.is_empty() && t.kind.plural == "namespaces" {
            // No namespace controller runs, so the contents go right away.
            for (res, obj) in inner.store.keys_in_namespace(&name) {
                let _ = inner
                    .store
                    .write::<()>(&res, &name, &obj, |p, _| p.map(|_| Write::Delete).ok_or(()));
            }
        }
        gone
    };
    let mut d = details(&t.kind, &name);
    d["uid"] = gone["metadata"]["uid"].clone();
    Ok(json_response(
        200,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": d}),
    ))
}

/// Deletes every object matching the selectors and answers the list of deleted objects.
pub(crate) fn delete_collection(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    let filter = filter_for(ctx, t)?;
    let store = &ctx.api.inner.store;
    let (_, items) = store.list(&t.kind.store_key(), t.namespace.as_deref());
    let mut deleted = Vec::new();
    for ((ns, name), obj) in items {
        if !filter.matches(&obj) {
            continue;
        }
        if dry_run(ctx) {
            deleted.push((*obj).clone());
        } else if let Ok(gone) = store.write::<()>(&t.kind.store_key(), &ns, &name, |p, _| {
            p.map(|_| Write::Delete).ok_or(())
        }) {
            deleted.push((*gone).clone());
        }
    }
    Ok(json_response(
        200,
        &json!({
            "kind": format!("{}List", t.kind.kind),
            "apiVersion": t.kind.api_version(),
            "metadata": {"resourceVersion": store.current_rv().to_string()},
            "items": deleted,
        }),
    ))
}
