//! Just enough OpenAPI v3 for `kubectl apply`/`create` with their default `--validate=strict`:
//! kubectl looks for a `fieldValidation` query parameter on each kind's PATCH operation and, when
//! it finds one, leaves validation to the server instead of downloading the (protobuf-only)
//! OpenAPI v2 schema. No schemas are served, so kubectl computes strategic merge patches from its
//! built-in types and uses JSON merge patches for custom kinds, as it does for CRDs without one.

use serde_json::{json, Map, Value};

use super::discovery::Registry;

/// `GET /openapi/v3`: one entry per group-version. The hash changes when kinds are added, so
/// clients that cache by URL fetch the new document.
pub(crate) fn root(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, version) in reg.group_versions() {
        let prefix = gv_path(&group, &version);
        let hash = fnv(reg
            .kinds_in(&group, &version)
            .iter()
            .map(|k| k.plural.as_str()));
        paths.insert(
            prefix.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{prefix}?hash={hash:016X}")}),
        );
    }
    json!({"paths": paths})
}

/// `GET /openapi/v3/api/v1` or `/openapi/v3/apis/<g>/<v>`.
pub(crate) fn group_version(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let kinds = reg.kinds_in(group, version);
    if kinds.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    for k in kinds {
        let base = format!("/{}", gv_path(group, version));
        let item = if k.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", k.plural)
        } else {
            format!("{base}/{}/{{name}}", k.plural)
        };
        paths.insert(
            item,
            json!({
                "patch": {
                    "operationId": format!("patch{}", k.kind),
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": {"group": k.group, "version": k.version, "kind": k.kind},
                    "parameters": [
                        {"name": "dryRun", "in": "query", "schema": {"type": "string"}},
                        {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                        {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                        {"name": "force", "in": "query", "schema": {"type": "boolean"}},
                    ],
                    "responses": {"200": {"description": "OK"}},
                }
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn fnv<'a>(parts: impl Iterator<Item = &'a str>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}
