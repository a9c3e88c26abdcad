//! Every request to a cluster, counted and timed (`envlens_cluster_requests_total`,
//! `envlens_cluster_request_duration_seconds`): a layer of each agent's `kube::Client`, so the
//! listing, discovery and the proxy are all seen, however they send.
//!
//! Here too: which view caused a request the view did not send itself. The watch cache's
//! first list of a kind and a discovery run in tasks of their own, shared by every view after,
//! and the cluster's own-rules review runs once for many. Each carries, as its `Audit-ID`,
//! the id of the view whose need started it ([`caused_by`], [`name_cause`]), so the API
//! server's audit log ties a first view's hundred-odd requests to that view. What no view
//! caused (a relist after a watch expired) carries none, and the server makes its own. (Named
//! where a request is built, not in this layer: kube's client runs its layers in a task of
//! its own, behind a buffer, where the sender's task-local is out of reach.)

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::http::{HeaderMap, HeaderValue, Method, Request, Response};
use tower::{Layer, Service};

use crate::telemetry::request_id::AUDIT_ID_HEADER;
use crate::telemetry::Metrics;

tokio::task_local! {
    /// The `Audit-ID` of the view on whose behalf the current task asks the cluster.
    static CAUSE: HeaderValue;
}

/// Runs `work` on behalf of the view whose outgoing `headers` are given: its requests that
/// carry no `Audit-ID` of their own get the view's.
pub async fn caused_by<F: Future>(headers: &HeaderMap, work: F) -> F::Output {
    within(headers.get(AUDIT_ID_HEADER).cloned(), work).await
}

/// Runs `work` on behalf of the view `cause` names (none: on nobody's).
pub async fn within<F: Future>(cause: Option<HeaderValue>, work: F) -> F::Output {
    match cause {
        Some(cause) => CAUSE.scope(cause, work).await,
        None => work.await,
    }
}

/// The view the current task works for, to hand on to a task it starts for that view.
pub fn cause() -> Option<HeaderValue> {
    CAUSE.try_with(HeaderValue::clone).ok()
}

/// Gives a request built in the current task the `Audit-ID` of the view it works for, unless
/// it has one.
pub fn name_cause(headers: &mut HeaderMap) {
    if !headers.contains_key(AUDIT_ID_HEADER) {
        if let Some(cause) = cause() {
            headers.insert(AUDIT_ID_HEADER, cause);
        }
    }
}

/// The agent a request is sent for, set as a request extension by whoever sends it; requests
/// shared by every agent of a cluster (discovery) have none and count as agent `-`.
#[derive(Debug, Clone, Copy)]
pub struct ForAgent(pub i64);

#[derive(Clone)]
pub struct ObserveLayer {
    pub metrics: Arc<Metrics>,
    /// The names the `resource` label may take.
    pub known: KnownResources,
}

/// The resource names a cluster's requests are labelled with (SPEC 13): those its discovery
/// knows and Kubernetes' built-in ones, with their well-known subresources. Any other name (a
/// path anyone may send through the proxy) is `other`, so that requests cannot grow the
/// number of series on `/metrics`. Cheap to clone; clones share the names.
#[derive(Clone, Default)]
pub struct KnownResources(Arc<RwLock<Arc<HashSet<String>>>>);

/// The label of a resource no discovery knows.
pub const OTHER: &str = "other";

/// Resources every cluster serves (and envlens asks for itself), known before any discovery.
const BUILT_IN: [&str; 36] = [
    "pods",
    "services",
    "endpoints",
    "configmaps",
    "secrets",
    "events",
    "namespaces",
    "nodes",
    "persistentvolumeclaims",
    "persistentvolumes",
    "serviceaccounts",
    "replicationcontrollers",
    "limitranges",
    "resourcequotas",
    "podtemplates",
    "deployments",
    "replicasets",
    "statefulsets",
    "daemonsets",
    "controllerrevisions",
    "jobs",
    "cronjobs",
    "ingresses",
    "networkpolicies",
    "horizontalpodautoscalers",
    "poddisruptionbudgets",
    "roles",
    "rolebindings",
    "clusterroles",
    "clusterrolebindings",
    "subjectaccessreviews",
    "selfsubjectaccessreviews",
    "selfsubjectrulesreviews",
    "customresourcedefinitions",
    "endpointslices",
    "leases",
];

/// Subresources Kubernetes defines.
const SUBRESOURCES: [&str; 12] = [
    "log",
    "status",
    "scale",
    "exec",
    "attach",
    "portforward",
    "eviction",
    "ephemeralcontainers",
    "binding",
    "proxy",
    "resize",
    "token",
];

impl KnownResources {
    /// The resources (plural names) a discovery found, in place of the last one's.
    pub fn discovered<'a>(&self, plurals: impl IntoIterator<Item = &'a str>) {
        let names = plurals.into_iter().map(str::to_owned).collect();
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(names);
    }

    /// `resource` (`pods`, `pods/log`, or empty for the API's own documents) when known,
    /// else [`OTHER`].
    pub fn label(&self, resource: String) -> String {
        if resource.is_empty() {
            return resource;
        }
        let (base, sub) = match resource.split_once('/') {
            Some((base, sub)) => (base, Some(sub)),
            None => (resource.as_str(), None),
        };
        let known = BUILT_IN.contains(&base) || {
            let names = self.0.read().unwrap_or_else(|e| e.into_inner()).clone();
            names.contains(base)
        };
        match known && sub.is_none_or(|sub| SUBRESOURCES.contains(&sub)) {
            true => resource,
            false => OTHER.to_owned(),
        }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe {
            inner,
            metrics: self.metrics.clone(),
            known: self.known.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Observe<S> {
    inner: S,
    metrics: Arc<Metrics>,
    known: KnownResources,
}

impl<S, B, R> Service<Request<B>> for Observe<S>
where
    S: Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (verb, resource) = classify(request.method(), request.uri());
        let resource = self.known.label(resource);
        let agent = request
            .extensions()
            .get::<ForAgent>()
            .map_or_else(|| "-".to_owned(), |a| a.0.to_string());
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            let code = answer.as_ref().ok().map(|r| r.status().as_u16());
            metrics.cluster_request(&agent, verb, &resource, code, started.elapsed());
            answer
        })
    }
}

/// The Kubernetes verb and resource of a request, as the API server's audit log names them
/// (`list pods`, `get pods/log`, `watch deployments`); `discovery` for the API's own
/// documents. A path prefix before `/api` or `/apis` (a cluster behind Rancher) is skipped.
pub fn classify(method: &Method, uri: &axum::http::Uri) -> (&'static str, String) {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let start = segments.iter().position(|s| *s == "api" || *s == "apis");
    let rest = match start {
        Some(i) if segments[i] == "api" => segments.get(i + 2..),
        Some(i) => segments.get(i + 3..),
        None => None,
    };
    let rest = match rest {
        Some(rest) if !rest.is_empty() => rest,
        _ => return ("discovery", String::new()),
    };
    let rest = match rest {
        ["namespaces", _, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let resource = match rest {
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
        [resource, ..] => (*resource).to_owned(),
        [] => String::new(),
    };
    let named = rest.len() >= 2;
    let watching = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = match *method {
        Method::GET if watching => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_the_known_resources_and_other() {
        let known = KnownResources::default();
        let label = |r: &str| known.label(r.to_owned());
        assert_eq!(label("pods"), "pods");
        assert_eq!(label("pods/log"), "pods/log");
        assert_eq!(label(""), "");
        assert_eq!(label("widgets"), OTHER);
        assert_eq!(label("pods/a1b2c3"), OTHER);
        known.discovered(["widgets"]);
        assert_eq!(label("widgets"), "widgets");
        assert_eq!(label("widgets/status"), "widgets/status");
        known.discovered(["gadgets"]);
        assert_eq!(label("widgets"), OTHER, "the last discovery's names only");
    }

    fn of(method: Method, uri: &str) -> (&'static str, String) {
        classify(&method, &uri.parse().unwrap())
    }

    #[test]
    fn verbs_and_resources_as_the_audit_log_names_them() {
        let cases = [
            (Method::GET, "/api", "discovery", ""),
            (Method::GET, "/apis/apps/v1", "discovery", ""),
            (
                Method::GET,
                "/api/v1/namespaces/shop/pods?labelSelector=a%3Db",
                "list",
                "pods",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/shop/pods?watch=true",
                "watch",
                "pods",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/shop/pods/web-1/log?follow=true",
                "get",
                "pods/log",
            ),
            (
                Method::GET,
                "/apis/apps/v1/namespaces/shop/deployments/web",
                "get",
                "deployments",
            ),
            (Method::GET, "/api/v1/namespaces", "list", "namespaces"),
            (Method::GET, "/api/v1/namespaces/shop", "get", "namespaces"),
            (Method::GET, "/api/v1/nodes", "list", "nodes"),
            (
                Method::POST,
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                "create",
                "subjectaccessreviews",
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/shop/pods",
                "deletecollection",
                "pods",
            ),
            (
                Method::GET,
                "/k8s/clusters/c-1/api/v1/namespaces/x/services",
                "list",
                "services",
            ),
        ];
        for (method, uri, verb, resource) in cases {
            assert_eq!(of(method, uri), (verb, resource.to_owned()), "{uri}");
        }
    }
}
