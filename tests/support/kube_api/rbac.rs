//! RBAC as the apiserver's authorizer applies it, over the Role, RoleBinding, ClusterRole and
//! ClusterRoleBinding objects the server stores, and the `SubjectAccessReview` and
//! `SelfSubjectAccessReview` endpoints (authorization.k8s.io/v1), which answer what the server's
//! authorizer decides: the deny rules, then RBAC when [`super::KubeApi::enforce_rbac`] is on;
//! and `SelfSubjectRulesReview`, which lists the rules RBAC grants the caller in a namespace.
//!
//! Followed: user and group subjects (and service accounts as `system:serviceaccount:<ns>:<name>`),
//! `verbs`, `apiGroups`, `resources` (with `resource/subresource`), `resourceNames`, and `*` in
//! each; `system:masters` may do anything. Not followed: aggregated ClusterRoles, non-resource URLs
//! (allowed to every authenticated user, as the default `system:discovery` binding does).

use std::sync::atomic::Ordering;

use axum::response::Response;
use serde_json::{json, Value};

use super::handlers::{Ctx, Target};
use super::status::{json_response, ApiError};
use super::RequestInfo;

/// What the authorizer decides about one resource attribute set.
pub(crate) struct Attributes<'a> {
    pub user: &'a str,
    pub groups: &'a [String],
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

impl<'a> From<&'a RequestInfo> for Attributes<'a> {
    fn from(info: &'a RequestInfo) -> Self {
        Attributes {
            user: &info.user,
            groups: &info.groups,
            verb: &info.verb,
            group: &info.group,
            resource: &info.resource,
            subresource: info.subresource.as_deref(),
            namespace: info.namespace.as_deref(),
            name: info.name.as_deref(),
        }
    }
}

fn strings(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}

fn has(v: &Value, want: &str) -> bool {
    strings(v).any(|s| s == "*" || s == want)
}

fn subject_matches(subject: &Value, binding_ns: Option<&str>, a: &Attributes) -> bool {
    let name = subject["name"].as_str().unwrap_or("");
    match subject["kind"].as_str() {
        Some("User") => name == a.user,
        Some("Group") => a.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = subject["namespace"].as_str().or(binding_ns).unwrap_or("");
            a.user == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    let resource = match a.subresource {
        Some(sub) => format!("{}/{sub}", a.resource),
        None => a.resource.to_string(),
    };
    // `*/scale` grants a subresource of every resource.
    let any_of_sub = a.subresource.map(|sub| format!("*/{sub}"));
    let resources = &rule["resources"];
    let names = &rule["resourceNames"];
    has(&rule["verbs"], a.verb)
        && has(&rule["apiGroups"], a.group)
        && (has(resources, &resource)
            || any_of_sub.is_some_and(|r| strings(resources).any(|x| x == r)))
        && (strings(names).next().is_none() || a.name.is_some_and(|n| has(names, n)))
}

/// The default `system:basic-user` ClusterRole, bound to every authenticated user: they may
/// review themselves.
fn basic_user_rule() -> Value {
    json!({"apiGroups": ["authorization.k8s.io"],
           "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]})
}

/// Every rule granted to `a`'s user and groups, cluster-wide and in `namespace`, each with the
/// binding that grants it, in the order the apiserver's rule resolver visits them:
/// ClusterRoleBindings, then the namespace's RoleBindings.
fn granted(api: &super::KubeApi, a: &Attributes, namespace: Option<&str>) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if a.groups.iter().any(|g| g == "system:authenticated") {
        out.push((
            "ClusterRoleBinding \"system:basic-user\"".to_string(),
            basic_user_rule(),
        ));
    }
    let store = &api.inner.store;
    let role = |plural: &str, ns: &str, name: &str| {
        store.get(
            &("rbac.authorization.k8s.io".into(), plural.into()),
            ns,
            name,
        )
    };
    let rbac = |plural: &str, ns: Option<&str>| {
        store
            .list(&("rbac.authorization.k8s.io".into(), plural.into()), ns)
            .1
    };
    let mut grant = |binding: &Value, ns: Option<&str>| {
        let subjects = binding["subjects"].as_array().into_iter().flatten();
        if !subjects.into_iter().any(|s| subject_matches(s, ns, a)) {
            return;
        }
        let role_name = binding["roleRef"]["name"].as_str().unwrap_or("");
        let role = match (binding["roleRef"]["kind"].as_str(), ns) {
            (Some("ClusterRole"), _) => role("clusterroles", "", role_name),
            (Some("Role"), Some(ns)) => role("roles", ns, role_name),
            _ => None,
        };
        let name = binding["metadata"]["name"].as_str().unwrap_or("");
        let by = match ns {
            None => format!("ClusterRoleBinding \"{name}\""),
            Some(ns) => format!("RoleBinding \"{name}/{ns}\""),
        };
        for rule in role
            .iter()
            .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
        {
            out.push((by.clone(), rule));
        }
    };
    for (_, binding) in rbac("clusterrolebindings", None) {
        grant(&binding, None);
    }
    if let Some(ns) = namespace {
        for (_, binding) in rbac("rolebindings", Some(ns)) {
            grant(&binding, Some(ns));
        }
    }
    out
}

/// Whether RBAC allows `a`; the reason names the binding, as the apiserver's does.
pub(crate) fn allows(api: &super::KubeApi, a: &Attributes) -> Option<String> {
    if a.groups.iter().any(|g| g == "system:masters") {
        return Some("allowed by the system:masters group".into());
    }
    granted(api, a, a.namespace)
        .into_iter()
        .find(|(_, rule)| rule_allows(rule, a))
        .map(|(by, _)| format!("RBAC: allowed by {by}"))
}

/// `POST …/selfsubjectrulesreviews`: what the caller (impersonated or not) may do in
/// `spec.namespace`, as the apiserver's rule resolver lists it: `resourceRules` (each rule of
/// each bound role, its empty fields left out), `nonResourceRules` (the default discovery
/// roles' to every authenticated user, as this server allows them), `incomplete` when an
/// authorizer without rules decides too (the deny rules). Without RBAC enforced, the server
/// allows everything, and says so as `*`.
pub(crate) fn rules_review(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    let mut review: Value = if is_protobuf(ctx) {
        rules_review_from_protobuf(&ctx.body)
            .ok_or_else(|| ApiError::bad_request("the protobuf body is not a rules review"))?
    } else {
        serde_json::from_slice(&ctx.body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request was in an unknown format: {e}"
            ))
        })?
    };
    let namespace = review["spec"]["namespace"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let everything = || {
        (
            vec![json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})],
            vec![json!({"verbs": ["*"], "nonResourceURLs": ["*"]})],
        )
    };
    let who = &ctx.identity;
    let (resource_rules, non_resource_rules) = if !ctx.api.inner.rbac.load(Ordering::SeqCst)
        || who.groups.iter().any(|g| g == "system:masters")
    {
        everything()
    } else {
        let a = Attributes {
            user: &who.user,
            groups: &who.groups,
            verb: "",
            group: "",
            resource: "",
            subresource: None,
            namespace: None,
            name: None,
        };
        let ns = (!namespace.is_empty()).then_some(namespace.as_str());
        let mut resources = Vec::new();
        let mut non_resources = vec![json!({"verbs": ["get"], "nonResourceURLs": [
            "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
            "/readyz", "/version", "/version/"]})];
        for (_, rule) in granted(&ctx.api, &a, ns) {
            let mut out = serde_json::Map::new();
            out.insert("verbs".into(), rule["verbs"].clone());
            if rule.get("nonResourceURLs").is_some() {
                out.insert("nonResourceURLs".into(), rule["nonResourceURLs"].clone());
                non_resources.push(Value::Object(out));
                continue;
            }
            for key in ["apiGroups", "resources", "resourceNames"] {
                if strings(&rule[key]).next().is_some() {
                    out.insert(key.into(), rule[key].clone());
                }
            }
            resources.push(Value::Object(out));
        }
        (resources, non_resources)
    };
    let incomplete = !super::read(&ctx.api.inner.deny).is_empty();
    if review["metadata"].is_null() {
        review["metadata"] = json!({});
    }
    review["apiVersion"] = json!(t.kind.api_version());
    review["kind"] = json!(t.kind.kind);
    review["metadata"]["creationTimestamp"] = Value::Null;
    review["status"] = json!({"resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules, "incomplete": incomplete});
    Ok(json_response(201, &review))
}

fn is_protobuf(ctx: &Ctx) -> bool {
    ctx.headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("protobuf"))
}

/// The protobuf form of a `SelfSubjectRulesReview` (`kubectl auth can-i --list`): the `k8s\0`
/// envelope, then `spec` (2) → `namespace` (1).
fn rules_review_from_protobuf(body: &[u8]) -> Option<Value> {
    let unknown = body.strip_prefix(b"k8s\0")?;
    let raw = field(unknown, 2)?;
    let namespace = field(raw, 2)
        .and_then(|spec| field(spec, 1))
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .unwrap_or_default();
    Some(json!({"spec": {"namespace": namespace}}))
}

/// `POST …/subjectaccessreviews` (the spec names the subject) and `…/selfsubjectaccessreviews`
/// (the caller, impersonated or not, is the subject): the review comes back with its `status`.
pub(crate) fn review(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    if t.kind.plural == "selfsubjectrulesreviews" {
        return rules_review(ctx, t);
    }
    let mut review: Value = if is_protobuf(ctx) {
        review_from_protobuf(&ctx.body)
            .ok_or_else(|| ApiError::bad_request("the protobuf body is not an access review"))?
    } else {
        serde_json::from_slice(&ctx.body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request was in an unknown format: {e}"
            ))
        })?
    };
    let spec = review["spec"].clone();
    let (user, groups) = if t.kind.plural == "selfsubjectaccessreviews" {
        (ctx.identity.user.clone(), ctx.identity.groups.clone())
    } else {
        let user = spec["user"].as_str().unwrap_or("").to_string();
        let groups: Vec<String> = strings(&spec["groups"]).map(str::to_string).collect();
        if user.is_empty() && groups.is_empty() {
            return Err(ApiError::new(
                422,
                "Invalid",
                "SubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified",
            ));
        }
        (user, groups)
    };
    let attrs = &spec["resourceAttributes"];
    let field = |k: &str| attrs[k].as_str().filter(|s| !s.is_empty());
    let status = if attrs.is_object() {
        let a = Attributes {
            user: &user,
            groups: &groups,
            verb: field("verb").unwrap_or(""),
            group: field("group").unwrap_or(""),
            resource: field("resource").unwrap_or(""),
            subresource: field("subresource"),
            namespace: field("namespace"),
            name: field("name"),
        };
        let info = RequestInfo {
            verb: a.verb.into(),
            group: a.group.into(),
            resource: a.resource.into(),
            subresource: a.subresource.map(Into::into),
            namespace: a.namespace.map(Into::into),
            name: a.name.map(Into::into),
            user: user.clone(),
            groups: groups.clone(),
            ..RequestInfo::default()
        };
        let resource = match a.group {
            "" => a.resource.to_string(),
            group => format!("{}.{group}", a.resource),
        };
        let asked = super::ReviewAsked {
            user: user.clone(),
            namespace: a.namespace.unwrap_or("").into(),
            verb: a.verb.into(),
            resource,
        };
        *super::lock(&ctx.api.inner.reviews)
            .entry(asked)
            .or_insert(0) += 1;
        match super::handlers::authorizer(&ctx.api, &info) {
            Some(reason) => json!({"allowed": true, "reason": reason}),
            None => json!({"allowed": false}),
        }
    } else {
        // Non-resource URLs: the default discovery roles let every authenticated user read them.
        json!({"allowed": true, "reason": "RBAC: allowed by ClusterRoleBinding \"system:discovery\""})
    };
    if review["metadata"].is_null() {
        review["metadata"] = json!({});
    }
    review["apiVersion"] = json!(t.kind.api_version());
    review["kind"] = json!(t.kind.kind);
    review["metadata"]["creationTimestamp"] = Value::Null;
    review["status"] = status;
    Ok(json_response(201, &review))
}

/// Reads the protobuf form of an access review that typed client-go clients send (`kubectl auth
/// can-i`): the `k8s\0` envelope (`runtime.Unknown`, field 2 the raw object), then
/// `spec` (2) → `resourceAttributes` (1) → namespace 1, verb 2, group 3, version 4, resource 5,
/// subresource 6, name 7; `nonResourceAttributes` (2) → path 1, verb 2. Enough of protobuf's wire
/// format for these messages of strings; anything else is `None`.
pub(crate) fn review_from_protobuf(body: &[u8]) -> Option<Value> {
    let unknown = body.strip_prefix(b"k8s\0")?;
    let raw = field(unknown, 2)?;
    let spec = field(raw, 2)?;
    let text = |m: &[u8], n: u64| field(m, n).map(|b| String::from_utf8_lossy(b).into_owned());
    let mut out = json!({"spec": {}});
    if let Some(attrs) = field(spec, 1) {
        let mut a = serde_json::Map::new();
        for (n, key) in [
            (1, "namespace"),
            (2, "verb"),
            (3, "group"),
            (4, "version"),
            (5, "resource"),
            (6, "subresource"),
            (7, "name"),
        ] {
            if let Some(v) = text(attrs, n) {
                a.insert(key.into(), json!(v));
            }
        }
        out["spec"]["resourceAttributes"] = Value::Object(a);
    } else if let Some(attrs) = field(spec, 2) {
        out["spec"]["nonResourceAttributes"] =
            json!({"path": text(attrs, 1), "verb": text(attrs, 2)});
    }
    Some(out)
}

/// The first length-delimited field `number` of a message; other wire types are skipped.
fn field(mut msg: &[u8], number: u64) -> Option<&[u8]> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    while !msg.is_empty() {
        let key = varint(&mut msg)?;
        match key & 7 {
            0 => {
                varint(&mut msg)?;
            }
            1 => msg = msg.get(8..)?,
            5 => msg = msg.get(4..)?,
            2 => {
                let len = usize::try_from(varint(&mut msg)?).ok()?;
                let value = msg.get(..len)?;
                msg = &msg[len..];
                if key >> 3 == number {
                    return Some(value);
                }
            }
            _ => return None,
        }
    }
    None
}
