//! What a Kubernetes API path asks for, read as the API server reads it (its `RequestInfo`:
//! `k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`), and the paths envlens refuses to
//! forward whatever the cluster's RBAC says (SPEC 13).
//!
//! RBAC has no deny, and an operator may well bind envlens (or an agent) to a broad role. Two
//! kinds of request are refused here all the same, because each lets a viewer out of what
//! GitLab lets them see:
//! - every `proxy` subresource (`pods/proxy`, `services/proxy`, `nodes/proxy`, and the old
//!   `/api/v1/proxy/...` verb): it reaches whatever listens in the cluster, the kubelet's API
//!   included, with envlens' identity;
//! - Secrets in the namespace envlens runs in, and Secrets across all namespaces: envlens' own
//!   secrets (its session key among them) live there, and whoever holds them is anyone.

use std::borrow::Cow;

/// The parts of a resource request that the refusals look at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestInfo {
    /// `""` for the core group.
    pub group: String,
    pub version: String,
    /// `""` for a cluster-wide request (or a cluster-scoped kind).
    pub namespace: String,
    pub resource: String,
    pub name: String,
    pub subresource: String,
    /// The deprecated `/api/v1/proxy/...` and `/api/v1/watch/...` verb prefixes.
    pub verb_prefix: Option<String>,
}

impl RequestInfo {
    /// A resource request's parts; `None` for a non-resource path (`/version`, `/api`,
    /// `/apis/<group>`, `/openapi/v2`, ...). Segments are compared decoded, as the API server's
    /// router sees them (a `%73ecrets` is `secrets` there).
    pub fn parse(path: &str) -> Option<RequestInfo> {
        // Every proxied request is read here: a segment is copied only when it is kept, or
        // when it has an escape or an upper-case letter to undo.
        let segments: Vec<Cow<'_, str>> = path
            .trim_start_matches('/')
            .split('/')
            .map(normalized)
            .collect();
        let mut parts: &[Cow<'_, str>] = &segments;
        let mut info = RequestInfo::default();
        match parts.first().map(|p| &**p) {
            Some("api") if parts.len() >= 2 => {
                info.version = parts[1].to_string();
                parts = &parts[2..];
            }
            Some("apis") if parts.len() >= 3 => {
                info.group = parts[1].to_string();
                info.version = parts[2].to_string();
                parts = &parts[3..];
            }
            _ => return None,
        }
        if let Some(verb @ ("proxy" | "watch")) = parts.first().map(|p| &**p) {
            info.verb_prefix = Some(verb.to_owned());
            parts = &parts[1..];
        }
        if parts.first().is_some_and(|p| p == "namespaces") && parts.len() > 1 {
            info.namespace = parts[1].to_string();
            // `namespaces/<ns>/status` and `/finalize` are the Namespace's own subresources.
            if parts.len() > 2 && !matches!(&*parts[2], "status" | "finalize") {
                parts = &parts[2..];
            }
        }
        let part = |i: usize| parts.get(i).map(|p| p.to_string()).unwrap_or_default();
        info.resource = part(0);
        info.name = part(1);
        info.subresource = part(2);
        // `namespaces/<ns>` keeps `<ns>` as its namespace too, as Kubernetes' does (a RoleBinding
        // may grant the Namespace it lives in).
        (!info.resource.is_empty()).then_some(info)
    }

    /// The verb Kubernetes authorizes a request for, by its method and query (RequestInfo's
    /// rules): `list` or `watch` for a GET without a name (which a `metadata.name` field
    /// selector then gives), `watch` under the old `/watch/` prefix, `deletecollection` for a
    /// DELETE without a name. `None` for a method Kubernetes has no verb for.
    pub fn verb(
        &mut self,
        method: &axum::http::Method,
        query: Option<&str>,
    ) -> Option<&'static str> {
        use axum::http::Method;
        if self.verb_prefix.as_deref() == Some("watch") {
            return Some("watch");
        }
        let param = |key: &str| {
            query
                .unwrap_or("")
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(k, _)| *k == key)
                .map(|(_, v)| decode(v))
        };
        let verb = match *method {
            Method::GET | Method::HEAD if self.name.is_empty() => {
                if let Some(name) = param("fieldSelector").and_then(|s| exact_name(&s)) {
                    self.name = name;
                }
                match param("watch").as_deref() {
                    Some("true" | "1") => "watch",
                    _ => "list",
                }
            }
            Method::GET | Method::HEAD => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if self.name.is_empty() => "deletecollection",
            Method::DELETE => "delete",
            _ => return None,
        };
        Some(verb)
    }

    /// Why envlens refuses this request whatever the RBAC says; `None` when it may be sent.
    /// `own_namespace` is the namespace envlens runs in (`POD_NAMESPACE`), when known.
    pub fn refusal(&self, own_namespace: Option<&str>) -> Option<String> {
        if self.verb_prefix.as_deref() == Some("proxy") || self.subresource == "proxy" {
            return Some(
                "envlens does not forward proxy subresources: they reach what runs inside the \
                 cluster with envlens' identity"
                    .to_owned(),
            );
        }
        if self.group.is_empty() && self.resource == "secrets" {
            if self.namespace.is_empty() {
                return Some(
                    "envlens does not forward requests for the Secrets of all namespaces; ask for \
                     one namespace's"
                        .to_owned(),
                );
            }
            if own_namespace.is_some_and(|own| own.eq_ignore_ascii_case(&self.namespace)) {
                return Some(format!(
                    "envlens does not forward requests for the Secrets of namespace {}, where \
                     it runs",
                    self.namespace
                ));
            }
        }
        None
    }
}

/// The name a field selector requires exactly (`metadata.name=web` or `==`), alone or among
/// other terms.
fn exact_name(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let value = term
            .strip_prefix("metadata.name==")
            .or_else(|| term.strip_prefix("metadata.name="))?;
        (!value.is_empty()).then(|| value.to_owned())
    })
}

/// A path segment as the API server's router compares it: decoded, in lower case; borrowed
/// when that changes nothing.
fn normalized(segment: &str) -> Cow<'_, str> {
    if segment.bytes().any(|b| b == b'%' || b.is_ascii_uppercase()) {
        Cow::Owned(decode(segment).to_ascii_lowercase())
    } else {
        Cow::Borrowed(segment)
    }
}

/// `%XX` escapes undone (invalid ones kept as they are: the proxy refuses those paths before).
fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(path: &str) -> bool {
        RequestInfo::parse(path)
            .and_then(|info| info.refusal(Some("envlens")))
            .is_some()
    }

    #[test]
    fn reads_paths_as_the_api_server_does() {
        let info =
            RequestInfo::parse("/apis/apps/v1/namespaces/shop/deployments/web/scale").unwrap();
        assert_eq!(
            (
                info.group.as_str(),
                info.version.as_str(),
                info.namespace.as_str()
            ),
            ("apps", "v1", "shop")
        );
        assert_eq!(
            (
                info.resource.as_str(),
                info.name.as_str(),
                info.subresource.as_str()
            ),
            ("deployments", "web", "scale")
        );
        let info = RequestInfo::parse("/api/v1/namespaces/shop").unwrap();
        assert_eq!(
            (info.resource.as_str(), info.name.as_str()),
            ("namespaces", "shop")
        );
        assert_eq!(info.namespace, "shop");
        let info = RequestInfo::parse("/api/v1/namespaces/shop/status").unwrap();
        assert_eq!(
            (
                info.resource.as_str(),
                info.name.as_str(),
                info.subresource.as_str()
            ),
            ("namespaces", "shop", "status")
        );
        let info = RequestInfo::parse("/api/v1/watch/namespaces/shop/pods").unwrap();
        assert_eq!(
            (info.namespace.as_str(), info.resource.as_str()),
            ("shop", "pods")
        );
        assert_eq!(info.verb_prefix.as_deref(), Some("watch"));
        for other in [
            "/version",
            "/api",
            "/api/v1",
            "/apis/apps/v1",
            "/openapi/v2",
            "/",
        ] {
            assert_eq!(RequestInfo::parse(other), None, "{other}");
        }
    }

    #[test]
    fn verbs_are_kubernetes_own() {
        use axum::http::Method;
        let verb = |method: Method, path: &str, query: Option<&str>| {
            let mut info = RequestInfo::parse(path).unwrap();
            (info.verb(&method, query), info.name)
        };
        let pods = "/api/v1/namespaces/shop/pods";
        let web = "/api/v1/namespaces/shop/pods/web";
        assert_eq!(verb(Method::GET, pods, None), (Some("list"), "".into()));
        assert_eq!(
            verb(Method::GET, pods, Some("watch=true")),
            (Some("watch"), "".into())
        );
        assert_eq!(
            verb(Method::GET, pods, Some("watch=1&limit=5")),
            (Some("watch"), "".into())
        );
        assert_eq!(
            verb(
                Method::GET,
                pods,
                Some("fieldSelector=metadata.name%3Dweb&watch=true")
            ),
            (Some("watch"), "web".into())
        );
        assert_eq!(
            verb(Method::GET, web, Some("watch=true")),
            (Some("get"), "web".into())
        );
        assert_eq!(
            verb(Method::GET, "/api/v1/watch/namespaces/shop/pods", None).0,
            Some("watch")
        );
        assert_eq!(verb(Method::POST, pods, None).0, Some("create"));
        assert_eq!(verb(Method::PUT, web, None).0, Some("update"));
        assert_eq!(verb(Method::PATCH, web, None).0, Some("patch"));
        assert_eq!(verb(Method::DELETE, web, None).0, Some("delete"));
        assert_eq!(verb(Method::DELETE, pods, None).0, Some("deletecollection"));
        assert_eq!(verb(Method::OPTIONS, pods, None).0, None);
    }

    #[test]
    fn proxy_subresources_are_refused_everywhere() {
        for path in [
            "/api/v1/nodes/node-1/proxy",
            "/api/v1/nodes/node-1/proxy/configz",
            "/api/v1/namespaces/shop/pods/web-1/proxy/metrics",
            "/api/v1/namespaces/shop/services/web:80/proxy/",
            "/api/v1/namespaces/shop/services/https:web:443/proxy",
            "/api/v1/proxy/namespaces/shop/pods/web-1",
            "/api/v1/proxy/nodes/node-1/stats",
            "/api/v1/namespaces/shop/pods/web-1/%70roxy",
            "/api/v1/namespaces/shop/pods/web-1/PROXY",
        ] {
            assert!(refused(path), "{path}");
        }
    }

    #[test]
    fn secrets_of_its_own_namespace_and_of_all_are_refused() {
        for path in [
            "/api/v1/namespaces/envlens/secrets",
            "/api/v1/namespaces/envlens/secrets/envlens-secrets",
            "/api/v1/namespaces/ENVLENS/secrets/envlens-secrets",
            "/api/v1/namespaces/envlens/%73ecrets/envlens-secrets",
            "/api/v1/watch/namespaces/envlens/secrets",
            "/api/v1/secrets",
            "/api/v1/watch/secrets",
        ] {
            assert!(refused(path), "{path}");
        }
        for path in [
            "/api/v1/namespaces/shop/secrets/db",
            "/api/v1/namespaces/shop/pods",
            "/api/v1/namespaces/envlens/pods",
            "/api/v1/namespaces/envlens/configmaps",
            "/apis/apps/v1/namespaces/envlens/deployments",
            // A custom kind named secrets in another group is not the core Secret.
            "/apis/example.com/v1/namespaces/envlens/secrets",
            "/api/v1/namespaces/shop/pods/web-1/log",
            "/version",
        ] {
            assert!(!refused(path), "{path}");
        }
        // Where envlens' namespace is not known, only all namespaces' Secrets are refused.
        let info = RequestInfo::parse("/api/v1/namespaces/envlens/secrets").unwrap();
        assert_eq!(info.refusal(None), None);
    }
}
