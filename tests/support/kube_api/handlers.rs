//! Request handling: one axum fallback parses Kubernetes paths the way the apiserver's
//! RequestInfoFactory does, records the request, applies latency and deny rules, then answers
//! discovery, CRUD, watch and log requests.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::watch;

use super::discovery::{self, ResourceKind};
use super::openapi;
use super::rbac::{self, review};
use super::selectors::{FieldSelector, Filter, LabelSelector};
use super::status::{bytes_response, details, json_response, ApiError};
use super::streams::{pod_log, watch};
use super::writes::{create, delete, delete_collection, patch_object, scale_of, update};
use super::{lock, read, Fault, KubeApi, RecordedRequest, RequestInfo};

/// Request bodies larger than this are refused (the apiserver's limit is 3 MiB per object).
const MAX_BODY: usize = 32 << 20;

/// Set by `KubeApi::serve`: flips to true when the `Served` handle is dropped, ending streams so
/// graceful shutdown does not wait on them forever.
#[derive(Clone)]
pub(crate) struct Shutdown(pub watch::Receiver<bool>);

/// Who is asking: the impersonated identity if the headers carry one, else the bearer token's
/// user (see [`KubeApi::add_token`]; "admin" for any other token, or none).
pub(crate) struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    uid: Option<String>,
    extra: BTreeMap<String, Vec<String>>,
    /// Who impersonates, when the headers impersonate: the token's user and groups.
    impersonator: Option<(String, Vec<String>)>,
}

fn header_values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect()
}

fn impersonate_extra(headers: &HeaderMap) -> BTreeMap<String, Vec<String>> {
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix("impersonate-extra-") {
            extra
                .entry(percent_decode(&key.to_ascii_lowercase(), false))
                .or_default()
                .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
        }
    }
    extra
}

impl Identity {
    fn from_headers(api: &KubeApi, headers: &HeaderMap) -> Self {
        let extra = impersonate_extra(headers);
        let uid = header_values(headers, "impersonate-uid").into_iter().next();
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let (user, groups) = token
            .and_then(|t| read(&api.inner.tokens).get(t).cloned())
            .unwrap_or_else(|| {
                (
                    "admin".into(),
                    vec!["system:masters".into(), "system:authenticated".into()],
                )
            });
        match header_values(headers, "impersonate-user")
            .into_iter()
            .next()
        {
            Some(impersonated) => {
                let mut impersonated_groups = header_values(headers, "impersonate-group");
                if !impersonated_groups
                    .iter()
                    .any(|g| g == "system:authenticated")
                {
                    impersonated_groups.push("system:authenticated".into());
                }
                Identity {
                    user: impersonated,
                    groups: impersonated_groups,
                    uid,
                    extra,
                    impersonator: Some((user, groups)),
                }
            }
            None => Identity {
                user,
                groups,
                uid,
                extra,
                impersonator: None,
            },
        }
    }

    /// The apiserver's impersonation filter: with RBAC enforced, the token's user must be
    /// allowed to `impersonate` the user, each group, each extra value and the uid named.
    fn may_impersonate(&self, api: &KubeApi) -> Result<(), ApiError> {
        let Some((impersonator, groups)) = &self.impersonator else {
            return Ok(());
        };
        if !api.inner.rbac.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut asked: Vec<(&str, String, Option<&str>, &str)> =
            vec![("", "users".into(), None, self.user.as_str())];
        for group in self.groups.iter().filter(|g| *g != "system:authenticated") {
            asked.push(("", "groups".into(), None, group.as_str()));
        }
        for (key, values) in &self.extra {
            for value in values {
                asked.push((
                    "authentication.k8s.io",
                    "userextras".into(),
                    Some(key.as_str()),
                    value.as_str(),
                ));
            }
        }
        if let Some(uid) = &self.uid {
            asked.push(("authentication.k8s.io", "uids".into(), None, uid.as_str()));
        }
        for (group, resource, subresource, name) in &asked {
            let a = rbac::Attributes {
                user: impersonator,
                groups,
                verb: "impersonate",
                group,
                resource,
                subresource: *subresource,
                namespace: None,
                name: Some(*name),
            };
            if rbac::allows(api, &a).is_none() {
                let resource = match subresource {
                    Some(sub) => format!("{resource}/{sub}"),
                    None => resource.clone(),
                };
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    format!("{resource} \"{name}\" is forbidden: User \"{impersonator}\" cannot impersonate resource \"{resource}\" in API group \"{group}\" at the cluster scope"),
                ));
            }
        }
        Ok(())
    }
}

/// Decodes `%XX` (and `+` as space in query strings); invalid escapes pass through.
fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'%' if i + 2 < b.len() => {
                if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a=b&c=d` → pairs, percent-decoded.
pub(crate) fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }

    pub fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
}

fn record(api: &KubeApi, parts: &axum::http::request::Parts, raw_query: &str, body: &Bytes) {
    let headers = &parts.headers;
    lock(&api.inner.requests).push(RecordedRequest {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: raw_query.to_string(),
        impersonate_user: header_values(headers, "impersonate-user")
            .into_iter()
            .next(),
        impersonate_groups: header_values(headers, "impersonate-group"),
        impersonate_uid: header_values(headers, "impersonate-uid").into_iter().next(),
        impersonate_extra: impersonate_extra(headers),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: body.clone(),
        version: parts.version,
        peer: parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|info| info.0),
    });
}

/// Everything a handler needs about one request.
pub(crate) struct Ctx {
    pub api: KubeApi,
    pub method: Method,
    pub headers: HeaderMap,
    pub query: Params,
    pub body: Bytes,
    pub identity: Identity,
    pub shutdown: Option<watch::Receiver<bool>>,
    /// Set by a [`Fault::Delay`] rule: how long to hold the answer back.
    delay: std::sync::Mutex<std::time::Duration>,
}

/// Counts a request as in flight while it lives, keeping the peak.
struct InFlight(KubeApi);

impl InFlight {
    fn new(api: &KubeApi) -> Self {
        let now = api.inner.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        api.inner.in_flight_peak.fetch_max(now, Ordering::SeqCst);
        InFlight(api.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inner.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The router's only handler: the body is read and the request recorded before latency and
/// deny rules apply, so tests see denied and slow requests too.
pub(crate) async fn handle(State(api): State<KubeApi>, req: Request) -> Response {
    let _in_flight = InFlight::new(&api);
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return ApiError::bad_request(format!("cannot read request body: {e}")).into_response()
        }
    };
    let raw_query = parts.uri.query().unwrap_or("").to_string();
    if api.inner.recording.load(Ordering::Relaxed) {
        record(&api, &parts, &raw_query, &body);
    }
    let latency = *lock(&api.inner.latency);
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let ctx = Ctx {
        identity: Identity::from_headers(&api, &parts.headers),
        shutdown: parts.extensions.get::<Shutdown>().map(|s| s.0.clone()),
        api,
        method: parts.method,
        headers: parts.headers,
        query: Params(parse_query(&raw_query)),
        body,
        delay: Default::default(),
    };
    let segments: Vec<String> = parts
        .uri
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| percent_decode(s, false))
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let response = ctx
        .identity
        .may_impersonate(&ctx.api)
        .and_then(|()| route(&ctx, &segments))
        .unwrap_or_else(IntoResponse::into_response);
    let delay = *lock(&ctx.delay);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    response
}

/// What the apiserver answers for a group version whose aggregated API server is down.
fn unavailable(ctx: &Ctx, group: &str, version: &str) -> Result<(), ApiError> {
    let down = read(&ctx.api.inner.unavailable)
        .iter()
        .any(|(g, v)| g == group && v == version);
    if down {
        return Err(ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ));
    }
    Ok(())
}

fn route(ctx: &Ctx, segs: &[&str]) -> Result<Response, ApiError> {
    let discovery = |doc: Option<Value>| -> Result<Response, ApiError> {
        if ctx.method != Method::GET {
            return Err(ApiError::method_not_allowed());
        }
        doc.map(|d| json_response(200, &d))
            .ok_or_else(ApiError::no_such_path)
    };
    let registry = || read(&ctx.api.inner.registry);
    match segs {
        ["version"] => discovery(Some(discovery::version())),
        ["healthz" | "livez" | "readyz"] => Ok(bytes_response(200, "text/plain", "ok")),
        ["api"] => {
            let host = ctx
                .headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("127.0.0.1");
            discovery(Some(discovery::api_versions(host)))
        }
        ["apis"] => discovery(Some(registry().group_list())),
        ["apis", group] => discovery(registry().group(group)),
        ["api", version] => discovery(registry().resource_list("", version)),
        ["apis", group, version] => {
            unavailable(ctx, group, version)?;
            discovery(registry().resource_list(group, version))
        }
        ["openapi", "v3"] => discovery(Some(openapi::root(&registry()))),
        ["openapi", "v3", "api", version] => {
            discovery(openapi::group_version(&registry(), "", version))
        }
        ["openapi", "v3", "apis", group, version] => {
            discovery(openapi::group_version(&registry(), group, version))
        }
        ["api", version, rest @ ..] => resource_request(ctx, "", version, rest),
        ["apis", group, version, rest @ ..] => {
            unavailable(ctx, group, version)?;
            resource_request(ctx, group, version, rest)
        }
        _ => Err(ApiError::no_such_path()),
    }
}

/// A parsed resource path.
pub(crate) struct Target {
    pub kind: ResourceKind,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl Target {
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }
}

fn resource_request(
    ctx: &Ctx,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Response, ApiError> {
    // As the apiserver does: `namespaces/<ns>/<resource>…` is namespaced unless the third part
    // is a namespace subresource (`namespaces/<name>/status`).
    let (namespace, parts) = match rest {
        ["namespaces", ns, res, more @ ..]
            if !(more.is_empty() && matches!(*res, "status" | "finalize")) =>
        {
            (Some(ns.to_string()), &rest[2..])
        }
        _ => (None, rest),
    };
    let (resource, name, subresource) = match parts {
        [r] => (*r, None, None),
        [r, n] => (*r, Some(n.to_string()), None),
        [r, n, s] => (*r, Some(n.to_string()), Some(s.to_string())),
        _ => return Err(ApiError::no_such_path()),
    };
    let kind = read(&ctx.api.inner.registry)
        .find(group, version, resource)
        .cloned()
        .ok_or_else(ApiError::no_such_path)?;
    let scope_ok = if kind.namespaced {
        namespace.is_some() || name.is_none()
    } else {
        namespace.is_none()
    };
    let sub_ok = subresource
        .as_ref()
        .is_none_or(|s| kind.subresources.contains(s));
    if !scope_ok || !sub_ok {
        return Err(ApiError::no_such_path());
    }
    let t = Target {
        kind,
        namespace,
        name,
        subresource,
    };

    let verb = match (&ctx.method, t.name.is_some()) {
        (&Method::GET, _) if ctx.query.flag("watch") => "watch",
        (&Method::GET, true) => "get",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => return Err(ApiError::method_not_allowed()),
    };
    *lock(&ctx.api.inner.counts)
        .entry((verb.to_string(), t.kind.group_resource()))
        .or_default() += 1;
    if (t.kind.create_only && verb != "create") || (!t.kind.watchable && verb == "watch") {
        return Err(ApiError::method_not_allowed());
    }
    authorize(ctx, &t, verb)?;

    let sub = t.subresource.as_deref();
    match (verb, sub) {
        ("create", None) if t.kind.create_only => review(ctx, &t),
        ("get", Some("log")) => pod_log(ctx, &t),
        (_, Some("log")) => Err(ApiError::method_not_allowed()),
        ("watch", None) => watch(ctx, &t),
        ("list", None) => list(ctx, &t),
        ("get", _) => get(ctx, &t),
        ("create", None) => create(ctx, &t),
        ("update", _) => update(ctx, &t),
        ("patch", _) => patch_object(ctx, &t),
        ("delete", None) => delete(ctx, &t),
        ("deletecollection", None) => delete_collection(ctx, &t),
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// The authorizer chain: a deny rule refuses; then, when RBAC is enforced, the stored bindings
/// decide; otherwise everything is allowed. `Some(reason)` when allowed.
pub(crate) fn authorizer(api: &KubeApi, info: &RequestInfo) -> Option<String> {
    if read(&api.inner.deny).iter().any(|rule| rule(info)) {
        return None;
    }
    if api.inner.rbac.load(Ordering::SeqCst) {
        return rbac::allows(api, &rbac::Attributes::from(info));
    }
    Some(String::new())
}

/// Runs the authorizer, then the fault rules; a denial reads like the apiserver's RBAC Forbidden Status.
fn authorize(ctx: &Ctx, t: &Target, verb: &str) -> Result<(), ApiError> {
    let info = RequestInfo {
        verb: verb.into(),
        group: t.kind.group.clone(),
        version: t.kind.version.clone(),
        resource: t.kind.plural.clone(),
        subresource: t.subresource.clone(),
        namespace: t.namespace.clone(),
        name: t.name.clone(),
        user: ctx.identity.user.clone(),
        groups: ctx.identity.groups.clone(),
        uid: ctx.identity.uid.clone(),
        extra: ctx.identity.extra.clone(),
    };
    let denied = authorizer(&ctx.api, &info).is_none();
    if !denied {
        let fault = read(&ctx.api.inner.faults)
            .iter()
            .find_map(|rule| rule(&info));
        return match fault {
            None => Ok(()),
            Some(Fault::Delay(d)) => {
                *lock(&ctx.delay) = d;
                Ok(())
            }
            Some(Fault::Status(code, message)) => {
                let reason = match code {
                    429 => "TooManyRequests",
                    500 => "InternalError",
                    503 => "ServiceUnavailable",
                    504 => "Timeout",
                    _ => "Unknown",
                };
                Err(ApiError::new(code, reason, message)
                    .with_details(details(&t.kind, t.name.as_deref().unwrap_or(""))))
            }
        };
    }
    let resource = match &t.subresource {
        Some(s) => format!("{}/{s}", t.kind.plural),
        None => t.kind.plural.clone(),
    };
    let scope = match &t.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".into(),
    };
    let reason = format!(
        "User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{}\" {scope}",
        info.user, t.kind.group
    );
    let message = match &t.name {
        Some(n) => format!("{} \"{n}\" is forbidden: {reason}", t.kind.group_resource()),
        None => format!("{} is forbidden: {reason}", t.kind.group_resource()),
    };
    Err(ApiError::new(403, "Forbidden", message)
        .with_details(details(&t.kind, t.name.as_deref().unwrap_or(""))))
}

pub(crate) fn filter_for(ctx: &Ctx, t: &Target) -> Result<Filter, ApiError> {
    let labels = LabelSelector::parse(ctx.query.get("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let mut fields = ctx.query.get("fieldSelector").unwrap_or("").to_string();
    if let Some(name) = &t.name {
        // GET …/pods/x?watch=true watches just that object.
        if !fields.is_empty() {
            fields.push(',');
        }
        fields.push_str(&format!("metadata.name={name}"));
    }
    let fields = FieldSelector::parse(&fields).map_err(ApiError::bad_request)?;
    Ok(Filter {
        namespace: t.namespace.clone(),
        labels,
        fields,
    })
}

fn get(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    let name = t.name.as_deref().unwrap_or("");
    let obj = ctx
        .api
        .inner
        .store
        .get(&t.kind.store_key(), t.ns(), name)
        .ok_or_else(|| ApiError::not_found(&t.kind, name))?;
    match t.subresource.as_deref() {
        Some("scale") => Ok(json_response(200, &scale_of(&obj))),
        _ => Ok(json_response(200, &obj)),
    }
}

/// Continue tokens are the hex of the last returned `namespace\0name`.
fn encode_continue(ns: &str, name: &str) -> String {
    format!("{ns}\0{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Option<(String, String)> {
    let bytes: Option<Vec<u8>> = token
        .as_bytes()
        .chunks(2)
        .map(|pair| match pair {
            [h, l] => {
                Some((char::from(*h).to_digit(16)? * 16 + char::from(*l).to_digit(16)?) as u8)
            }
            _ => None,
        })
        .collect();
    let s = String::from_utf8(bytes?).ok()?;
    let (ns, name) = s.split_once('\0')?;
    Some((ns.to_string(), name.to_string()))
}

fn list(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    let filter = filter_for(ctx, t)?;
    let after = match ctx.query.get("continue").filter(|c| !c.is_empty()) {
        Some(tok) => Some(
            decode_continue(tok)
                .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?,
        ),
        None => None,
    };
    let limit = match ctx.query.get("limit").filter(|l| !l.is_empty()) {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("limit: Invalid value: {l:?}")))?,
        None => 0,
    };
    let (rv, items) = ctx
        .api
        .inner
        .store
        .list(&t.kind.store_key(), t.namespace.as_deref());
    let mut matching = items
        .into_iter()
        .filter(|(key, _)| after.as_ref().is_none_or(|a| key > a))
        .filter(|(_, obj)| filter.matches(obj));
    let page: Vec<_> = if limit > 0 {
        matching.by_ref().take(limit).collect()
    } else {
        matching.by_ref().collect()
    };
    let remaining = matching.count();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if remaining > 0 {
        if let Some(((ns, name), _)) = page.last() {
            meta["continue"] = json!(encode_continue(ns, name));
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    // Written by hand so the stored objects are serialized in place rather than cloned.
    let mut out = serde_json::to_vec(&json!({
        "kind": format!("{}List", t.kind.kind),
        "apiVersion": t.kind.api_version(),
        "metadata": meta,
    }))
    .unwrap_or_default();
    out.pop(); // the closing brace
    out.extend_from_slice(b",\"items\":[");
    for (i, (_, obj)) in page.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, &**obj);
    }
    out.extend_from_slice(b"]}");
    Ok(bytes_response(200, "application/json", out))
}
