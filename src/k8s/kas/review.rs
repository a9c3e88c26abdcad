//! `access_as: {user: {}}` through GitLab's agent server (SPEC 14). envlens cannot impersonate a
//! viewer through KAS (agentk refuses nested impersonation), so a request that would
//! impersonate is first put to the cluster as a `SubjectAccessReview` for the viewer's GitLab
//! identity, read from the request by Kubernetes' own request-info rules, and sent as envlens
//! only when the review allows it. Anything that cannot be decided is refused: fail closed.

use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};

use crate::k8s::request_info::RequestInfo;
use crate::k8s::watch::access::Identity;

/// The question for one request, and what to answer when the cluster says no.
pub(super) struct Review {
    pub body: Vec<u8>,
    /// The API server's own words for the refusal.
    pub refusal: String,
}

/// The review a request needs, its `Impersonate-*` headers taken off; `None` when it
/// impersonates no one (the agent's own identity). `Err` when no review can express it.
pub(super) fn take(parts: &mut Parts) -> Option<Result<Review, String>> {
    let who = Identity::from_headers(&parts.headers);
    strip(&mut parts.headers);
    let who = who?;
    let path = parts.uri.path();
    let attributes = match RequestInfo::parse(path) {
        Some(mut info) => {
            let Some(verb) = info.verb(&parts.method, parts.uri.query()) else {
                return Some(Err(format!(
                    "{} requests cannot be authorized",
                    parts.method
                )));
            };
            let refusal = refusal(&who.user, verb, &info);
            let attributes = json!({"resourceAttributes": {
                "namespace": info.namespace, "verb": verb, "group": info.group,
                "version": info.version, "resource": info.resource,
                "subresource": info.subresource, "name": info.name}});
            (attributes, refusal)
        }
        None => {
            let verb = parts.method.as_str().to_ascii_lowercase();
            let refusal = format!(
                "forbidden: User \"{}\" cannot {verb} path \"{path}\"",
                who.user
            );
            (
                json!({"nonResourceAttributes": {"path": path, "verb": verb}}),
                refusal,
            )
        }
    };
    let (attributes, refusal) = attributes;
    let mut spec = json!({"user": who.user, "groups": who.groups, "extra": who.extra});
    if let (Some(spec), Value::Object(attributes)) = (spec.as_object_mut(), attributes) {
        spec.extend(attributes);
    }
    let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": spec});
    Some(Ok(Review {
        body: body.to_string().into_bytes(),
        refusal,
    }))
}

/// Whether the cluster's answer to a review allows the request; `Err` with why it decides
/// nothing (a review envlens may not create, a cluster that serves none, a body it cannot read).
pub(super) fn allowed(status: StatusCode, body: &[u8]) -> Result<bool, String> {
    if !status.is_success() {
        return Err(format!(
            "the cluster answered {status} to envlens' SubjectAccessReview (envlens' token's user \
             needs `create` of subjectaccessreviews)"
        ));
    }
    let answer: Value = serde_json::from_slice(body)
        .map_err(|e| format!("the cluster's SubjectAccessReview is not JSON: {e}"))?;
    Ok(answer["status"]["allowed"] == json!(true) && answer["status"]["denied"] != json!(true))
}

fn strip(headers: &mut HeaderMap) {
    let names: Vec<_> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("impersonate-"))
        .cloned()
        .collect();
    for name in names {
        headers.remove(&name);
    }
}

/// The API server's message for a refused resource request.
fn refusal(user: &str, verb: &str, info: &RequestInfo) -> String {
    let mut resource = info.resource.clone();
    if !info.group.is_empty() {
        resource = format!("{resource}.{}", info.group);
    }
    let name = if info.name.is_empty() {
        String::new()
    } else {
        format!(" \"{}\"", info.name)
    };
    let what = if info.subresource.is_empty() {
        info.resource.clone()
    } else {
        format!("{}/{}", info.resource, info.subresource)
    };
    let scope = if info.namespace.is_empty() {
        " at the cluster scope".to_owned()
    } else {
        format!(" in the namespace \"{}\"", info.namespace)
    };
    format!(
        "{resource}{name} is forbidden: User \"{user}\" cannot {verb} resource \"{what}\" in API \
         group \"{}\"{scope}",
        info.group
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request;

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    const DEV: [(&str, &str); 4] = [
        ("impersonate-user", "gitlab:user:dev"),
        ("impersonate-group", "gitlab:user"),
        ("impersonate-group", "gitlab:project_role:42:developer"),
        ("impersonate-extra-agent.gitlab.com%2fid", "7"),
    ];

    #[test]
    fn a_request_becomes_the_viewers_review_and_loses_its_impersonation() {
        let mut p = parts("GET", "/api/v1/namespaces/shop/pods?watch=true", &DEV);
        let review = take(&mut p).unwrap().unwrap();
        assert!(!p
            .headers
            .keys()
            .any(|k| k.as_str().starts_with("impersonate-")));
        let body: Value = serde_json::from_slice(&review.body).unwrap();
        assert_eq!(
            body["spec"],
            json!({"user": "gitlab:user:dev",
                "groups": ["gitlab:user", "gitlab:project_role:42:developer"],
                "extra": {"agent.gitlab.com/id": ["7"]},
                "resourceAttributes": {"namespace": "shop", "verb": "watch", "group": "",
                    "version": "v1", "resource": "pods", "subresource": "", "name": ""}})
        );
        assert_eq!(
            review.refusal,
            "pods is forbidden: User \"gitlab:user:dev\" cannot watch resource \"pods\" in API \
             group \"\" in the namespace \"shop\""
        );
        let mut p = parts(
            "GET",
            "/apis/apps/v1/namespaces/shop/deployments/web/scale",
            &DEV,
        );
        let body: Value = serde_json::from_slice(&take(&mut p).unwrap().unwrap().body).unwrap();
        assert_eq!(body["spec"]["resourceAttributes"]["subresource"], "scale");
        assert_eq!(body["spec"]["resourceAttributes"]["name"], "web");
        let mut p = parts("GET", "/version", &DEV);
        let body: Value = serde_json::from_slice(&take(&mut p).unwrap().unwrap().body).unwrap();
        assert_eq!(
            body["spec"]["nonResourceAttributes"],
            json!({"path": "/version", "verb": "get"})
        );
    }

    #[test]
    fn without_impersonation_there_is_nothing_to_ask() {
        let mut p = parts("GET", "/api/v1/namespaces/shop/pods", &[]);
        assert!(take(&mut p).is_none());
        let mut p = parts("OPTIONS", "/api/v1/namespaces/shop/pods", &DEV);
        assert!(take(&mut p).unwrap().is_err());
    }

    #[test]
    fn only_an_explicit_allow_allows() {
        let ok = StatusCode::CREATED;
        assert_eq!(allowed(ok, br#"{"status": {"allowed": true}}"#), Ok(true));
        assert_eq!(allowed(ok, br#"{"status": {"allowed": false}}"#), Ok(false));
        assert_eq!(allowed(ok, br#"{"status": {}}"#), Ok(false));
        assert_eq!(
            allowed(ok, br#"{"status": {"allowed": true, "denied": true}}"#),
            Ok(false)
        );
        assert!(allowed(StatusCode::FORBIDDEN, b"{}").is_err());
        assert!(allowed(ok, b"not json").is_err());
    }
}
