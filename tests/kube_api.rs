//! Tests of the fake Kubernetes API server: HTTP-level behaviour through the router, streaming
//! over real TCP, and kubectl against a served instance.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use crate::support::kube_api::{KubeApi, RequestInfo};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

fn pod(ns: &str, name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]},
    })
}

fn deployment(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                 "template": {"spec": {"containers": [{"name": "app", "image": "nginx:1"}, {"name": "side", "image": "busybox"}]}}},
    })
}

struct Resp {
    status: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

async fn send(
    api: &KubeApi,
    method: &str,
    uri: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> Resp {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = match body {
        Some(b) => Body::from(serde_json::to_vec(&b).unwrap()),
        None => Body::empty(),
    };
    let resp = api.router().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Resp {
        status,
        content_type,
        body,
    }
}

async fn get(api: &KubeApi, uri: &str) -> Resp {
    send(api, "GET", uri, None, &[]).await
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn discovery_documents() {
    let api = KubeApi::new();
    let v = get(&api, "/api").await.json();
    assert_eq!(v["kind"], "APIVersions");
    assert_eq!(v["versions"], json!(["v1"]));

    let core = get(&api, "/api/v1").await.json();
    assert_eq!(core["kind"], "APIResourceList");
    assert_eq!(core["groupVersion"], "v1");
    let pods = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pods")
        .unwrap();
    assert_eq!(pods["singularName"], "pod");
    assert_eq!(pods["namespaced"], true);
    assert_eq!(pods["kind"], "Pod");
    assert_eq!(pods["shortNames"], json!(["po"]));
    assert!(pods["verbs"].as_array().unwrap().contains(&json!("watch")));
    let ns = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "namespaces")
        .unwrap();
    assert_eq!(ns["namespaced"], false);
    assert!(core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "pods/log"));

    let groups = get(&api, "/apis").await.json();
    assert_eq!(groups["kind"], "APIGroupList");
    let apps = groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "apps")
        .unwrap();
    assert_eq!(
        apps["preferredVersion"],
        json!({"groupVersion": "apps/v1", "version": "v1"})
    );
    for g in [
        "batch",
        "networking.k8s.io",
        "discovery.k8s.io",
        "autoscaling",
        "apiregistration.k8s.io",
        "rbac.authorization.k8s.io",
    ] {
        assert!(
            groups["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == g),
            "{g} missing"
        );
    }
    let apps_v1 = get(&api, "/apis/apps/v1").await.json();
    let deploy = apps_v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "deployments")
        .unwrap();
    assert_eq!(deploy["shortNames"], json!(["deploy"]));
    assert_eq!(get(&api, "/apis/apps").await.json()["kind"], "APIGroup");
    assert_eq!(get(&api, "/version").await.json()["major"], "1");

    assert_eq!(
        get(&api, "/apis/example.com/v1").await.status,
        StatusCode::NOT_FOUND
    );
    api.add_kind("example.com", "v1", "Widget", "widgets", true);
    let custom = get(&api, "/apis/example.com/v1").await.json();
    assert_eq!(custom["resources"][0]["name"], "widgets");
    assert_eq!(custom["resources"][0]["kind"], "Widget");
    let groups = get(&api, "/apis").await.json();
    assert!(groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["name"] == "example.com"));

    let missing = get(&api, "/api/v1/namespaces/default/gizmos").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json()["reason"], "NotFound");
    assert_eq!(missing.json()["kind"], "Status");
}

#[tokio::test]
async fn crud_and_errors() {
    let api = KubeApi::new();
    let created = send(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods",
        Some(pod("ns", "x", json!({"a": "b"}))),
        &[],
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let created = created.json();
    assert!(created["metadata"]["uid"].as_str().unwrap().len() == 36);
    assert!(created["metadata"]["creationTimestamp"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    let rv1 = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    let dup = send(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods",
        Some(pod("ns", "x", json!({}))),
        &[],
    )
    .await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(
        dup.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "pods \"x\" already exists", "reason": "AlreadyExists",
               "details": {"name": "x", "kind": "pods"}, "code": 409})
    );

    let missing = get(&api, "/api/v1/namespaces/ns/pods/nope").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(
        missing.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "pods \"nope\" not found", "reason": "NotFound",
               "details": {"name": "nope", "kind": "pods"}, "code": 404})
    );
    let missing = get(&api, "/apis/apps/v1/namespaces/ns/deployments/nope")
        .await
        .json();
    assert_eq!(missing["message"], "deployments.apps \"nope\" not found");
    assert_eq!(missing["details"]["group"], "apps");

    let got = get(&api, "/api/v1/namespaces/ns/pods/x").await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.content_type, "application/json");
    assert_eq!(got.json()["metadata"]["labels"]["a"], "b");

    let list = get(&api, "/api/v1/namespaces/ns/pods").await.json();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["apiVersion"], "v1");
    assert!(list["metadata"]["resourceVersion"].is_string());
    assert_eq!(names(&list), ["x"]);

    // update: stale resourceVersion conflicts, current one wins
    let mut changed = got.json();
    changed["spec"]["containers"][0]["image"] = json!("nginx:2");
    let ok = send(
        &api,
        "PUT",
        "/api/v1/namespaces/ns/pods/x",
        Some(changed.clone()),
        &[],
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    let rv2 = ok.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(rv1, rv2);
    let stale = send(
        &api,
        "PUT",
        "/api/v1/namespaces/ns/pods/x",
        Some(changed),
        &[],
    )
    .await;
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert_eq!(stale.json()["reason"], "Conflict");
    let wrong_name = send(
        &api,
        "PUT",
        "/api/v1/namespaces/ns/pods/y",
        Some(pod("ns", "x", json!({}))),
        &[],
    )
    .await;
    assert_eq!(wrong_name.status, StatusCode::BAD_REQUEST);
    let wrong_ns = send(
        &api,
        "POST",
        "/api/v1/namespaces/other/pods",
        Some(pod("ns", "z", json!({}))),
        &[],
    )
    .await;
    assert_eq!(wrong_ns.status, StatusCode::BAD_REQUEST);

    // merge patch (and the strategic flavour used by kubectl label/annotate)
    let merge = [("content-type", "application/merge-patch+json")];
    let patched = send(
        &api,
        "PATCH",
        "/api/v1/namespaces/ns/pods/x",
        Some(json!({"metadata": {"labels": {"a": null, "c": "d"}}})),
        &merge,
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK);
    assert_eq!(patched.json()["metadata"]["labels"], json!({"c": "d"}));
    let smp = [("content-type", "application/strategic-merge-patch+json")];
    let patched = send(
        &api,
        "PATCH",
        "/api/v1/namespaces/ns/pods/x",
        Some(json!({"metadata": {"annotations": {"k": "v"}}})),
        &smp,
    )
    .await
    .json();
    assert_eq!(patched["metadata"]["annotations"]["k"], "v");
    assert_eq!(patched["metadata"]["uid"], created["metadata"]["uid"]);
    let jp = [("content-type", "application/json-patch+json")];
    let patched = send(&api, "PATCH", "/api/v1/namespaces/ns/pods/x",
        Some(json!([{"op": "add", "path": "/metadata/labels/e", "value": "f"}, {"op": "remove", "path": "/metadata/labels/c"}])), &jp).await.json();
    assert_eq!(patched["metadata"]["labels"], json!({"e": "f"}));
    let bad_type = send(
        &api,
        "PATCH",
        "/api/v1/namespaces/ns/pods/x",
        Some(json!({})),
        &[("content-type", "text/plain")],
    )
    .await;
    assert_eq!(bad_type.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let patch_missing = send(
        &api,
        "PATCH",
        "/api/v1/namespaces/ns/pods/nope",
        Some(json!({})),
        &merge,
    )
    .await;
    assert_eq!(patch_missing.status, StatusCode::NOT_FOUND);

    // delete answers a Success Status, then the object is gone
    let deleted = send(&api, "DELETE", "/api/v1/namespaces/ns/pods/x", None, &[]).await;
    assert_eq!(deleted.status, StatusCode::OK);
    assert_eq!(deleted.json()["status"], "Success");
    assert_eq!(deleted.json()["details"]["uid"], created["metadata"]["uid"]);
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/pods/x").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        send(&api, "DELETE", "/api/v1/namespaces/ns/pods/x", None, &[])
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // generateName, cluster-scoped kinds and scope mistakes
    let generated = send(
        &api,
        "POST",
        "/api/v1/namespaces/ns/configmaps",
        Some(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "cfg-"}}),
        ),
        &[],
    )
    .await
    .json();
    assert!(generated["metadata"]["name"]
        .as_str()
        .unwrap()
        .starts_with("cfg-"));
    assert_eq!(generated["metadata"]["name"].as_str().unwrap().len(), 9);
    let nameless = send(
        &api,
        "POST",
        "/api/v1/namespaces/ns/configmaps",
        Some(json!({"metadata": {}})),
        &[],
    )
    .await;
    assert_eq!(nameless.status.as_u16(), 422);
    let ns = send(
        &api,
        "POST",
        "/api/v1/namespaces",
        Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})),
        &[],
    )
    .await;
    assert_eq!(ns.status, StatusCode::CREATED);
    assert!(ns.json()["metadata"].get("namespace").is_none());
    assert_eq!(
        get(&api, "/api/v1/namespaces/team").await.json()["status"]["phase"],
        "Active"
    );
    assert_eq!(
        get(&api, "/api/v1/namespaces/team/nodes").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&api, "/api/v1/pods/x").await.status,
        StatusCode::NOT_FOUND
    );
    let protobuf = send(
        &api,
        "POST",
        "/api/v1/namespaces",
        Some(json!({})),
        &[("content-type", "application/vnd.kubernetes.protobuf")],
    )
    .await;
    assert_eq!(protobuf.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    // deleting a namespace takes its contents with it
    api.insert(pod("team", "p", json!({})));
    send(&api, "DELETE", "/api/v1/namespaces/team", None, &[]).await;
    assert!(api.get("pods", Some("team"), "p").is_none());
}

#[tokio::test]
async fn bad_requests_get_statuses_not_panics() {
    let api = KubeApi::new();
    api.insert(pod("ns", "x", json!({})));
    let merge = [("content-type", "application/merge-patch+json")];
    let jp = [("content-type", "application/json-patch+json")];
    type Case<'a> = (
        &'a str,
        &'a str,
        Option<Value>,
        &'a [(&'a str, &'a str)],
        u16,
    );
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/api/v1/namespaces/ns/pods",
            Some(json!([1, 2])),
            &[],
            400,
        ),
        (
            "POST",
            "/api/v1/namespaces/ns/pods",
            Some(json!({"kind": "Service", "metadata": {"name": "s"}})),
            &[],
            400,
        ),
        (
            "PUT",
            "/api/v1/namespaces/ns/pods/x",
            Some(json!("str")),
            &[],
            400,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/ns/pods/x",
            Some(json!({"metadata": "oops"})),
            &merge,
            422,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/ns/pods/x",
            Some(json!([{"op": "add", "path": "", "value": 5}])),
            &jp,
            422,
        ),
        (
            "PATCH",
            "/api/v1/namespaces/ns/pods/x",
            Some(json!([{"op": "remove", "path": "/nope/deeper"}])),
            &jp,
            422,
        ),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/ns/deployments/x/scale",
            Some(json!({})),
            &merge,
            404,
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/pods?limit=abc",
            None,
            &[],
            400,
        ),
        (
            "GET",
            "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=abc",
            None,
            &[],
            400,
        ),
        ("GET", "/api/v1/namespaces/ns/pods/x/y/z", None, &[], 404),
        ("GET", "/api/v1/namespaces/ns/pods/x/exec", None, &[], 404),
        ("GET", "/api/v1/namespaces/%ZZ/pods", None, &[], 200),
        ("GET", "/apis/apps/v1/namespaces", None, &[], 404),
        ("GET", "/nonsense", None, &[], 404),
        ("POST", "/api/v1", None, &[], 405),
        ("POST", "/api/v1/namespaces/ns/pods/x", None, &[], 405),
        ("PUT", "/api/v1/namespaces/ns/pods", None, &[], 405),
    ];
    for (method, uri, body, headers, code) in cases {
        let r = send(&api, method, uri, body, headers).await;
        assert_eq!(r.status.as_u16(), code, "{method} {uri}: {}", r.text());
        if code != 200 {
            assert_eq!(r.json()["kind"], "Status", "{method} {uri}");
        }
    }

    // dryRun=All answers as if written but changes nothing
    let dry = send(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods?dryRun=All",
        Some(pod("ns", "y", json!({}))),
        &[],
    )
    .await;
    assert_eq!(dry.status, StatusCode::CREATED);
    assert!(api.get("pods", Some("ns"), "y").is_none());
    let dry = send(
        &api,
        "PATCH",
        "/api/v1/namespaces/ns/pods/x?dryRun=All",
        Some(json!({"metadata": {"labels": {"d": "1"}}})),
        &merge,
    )
    .await;
    assert_eq!(dry.json()["metadata"]["labels"]["d"], "1");
    assert!(
        api.get("pods", Some("ns"), "x").unwrap()["metadata"]["labels"]
            .get("d")
            .is_none()
    );
    assert_eq!(
        send(
            &api,
            "DELETE",
            "/api/v1/namespaces/ns/pods/x?dryRun=All",
            None,
            &[]
        )
        .await
        .status,
        StatusCode::OK
    );
    assert!(api.get("pods", Some("ns"), "x").is_some());
}

#[tokio::test]
async fn strategic_merge_patch_merges_containers_by_name() {
    let api = KubeApi::new();
    api.insert(deployment("ns", "web"));
    let smp = [("content-type", "application/strategic-merge-patch+json")];
    let patch = json!({"spec": {"template": {"spec": {
        "$setElementOrder/containers": [{"name": "app"}, {"name": "side"}],
        "containers": [{"name": "app", "image": "nginx:2"}]}}}});
    let out = send(
        &api,
        "PATCH",
        "/apis/apps/v1/namespaces/ns/deployments/web",
        Some(patch),
        &smp,
    )
    .await
    .json();
    assert_eq!(
        out["spec"]["template"]["spec"]["containers"],
        json!([{"name": "app", "image": "nginx:2"}, {"name": "side", "image": "busybox"}])
    );
    assert_eq!(out["metadata"]["generation"], 2);
    let delete_side = json!({"spec": {"template": {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}}});
    let out = send(
        &api,
        "PATCH",
        "/apis/apps/v1/namespaces/ns/deployments/web",
        Some(delete_side),
        &smp,
    )
    .await
    .json();
    assert_eq!(
        out["spec"]["template"]["spec"]["containers"],
        json!([{"name": "app", "image": "nginx:2"}])
    );

    // scale and status subresources
    let scale = get(&api, "/apis/apps/v1/namespaces/ns/deployments/web/scale")
        .await
        .json();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 2);
    assert_eq!(scale["status"]["selector"], "app=web");
    let merge = [("content-type", "application/merge-patch+json")];
    let scaled = send(
        &api,
        "PATCH",
        "/apis/apps/v1/namespaces/ns/deployments/web/scale",
        Some(json!({"spec": {"replicas": 5}})),
        &merge,
    )
    .await;
    assert_eq!(scaled.json()["spec"]["replicas"], 5);
    assert_eq!(
        api.get("deployments", Some("ns"), "web").unwrap()["spec"]["replicas"],
        5
    );
    let status = send(
        &api,
        "PATCH",
        "/apis/apps/v1/namespaces/ns/deployments/web/status",
        Some(json!({"status": {"readyReplicas": 5}, "spec": {"replicas": 1}})),
        &merge,
    )
    .await
    .json();
    assert_eq!(status["status"]["readyReplicas"], 5);
    assert_eq!(
        status["spec"]["replicas"], 5,
        "a status write leaves spec alone"
    );
}

#[tokio::test]
async fn label_and_field_selectors() {
    let api = KubeApi::new();
    api.insert(pod("ns", "a1", json!({"app": "web", "tier": "front"})));
    api.insert(pod("ns", "a2", json!({"app": "web", "tier": "back"})));
    api.insert(pod("ns", "a3", json!({"app": "db"})));
    api.insert(pod("other", "b1", json!({"app": "web"})));
    let q = |sel: &str| {
        format!(
            "/api/v1/namespaces/ns/pods?labelSelector={}",
            sel.replace(' ', "%20").replace('!', "%21")
        )
    };
    let cases: &[(&str, &[&str])] = &[
        ("app=web", &["a1", "a2"]),
        ("app==web", &["a1", "a2"]),
        ("app!=web", &["a3"]),
        ("tier in (front,back)", &["a1", "a2"]),
        ("tier notin (front)", &["a2", "a3"]),
        ("tier", &["a1", "a2"]),
        ("!tier", &["a3"]),
        ("app=web,tier=back", &["a2"]),
        ("app in (web, db),!tier", &["a3"]),
        ("", &["a1", "a2", "a3"]),
    ];
    for (sel, want) in cases {
        let r = get(&api, &q(sel)).await;
        assert_eq!(r.status, StatusCode::OK, "{sel}: {}", r.text());
        assert_eq!(names(&r.json()), *want, "selector {sel:?}");
    }
    // '+' for space, as form encoders send it
    assert_eq!(
        names(
            &get(
                &api,
                "/api/v1/namespaces/ns/pods?labelSelector=tier+in+(back)"
            )
            .await
            .json()
        ),
        ["a2"]
    );

    let all = get(&api, "/api/v1/pods?labelSelector=app%3Dweb")
        .await
        .json();
    assert_eq!(names(&all), ["a1", "a2", "b1"]);
    let f = |s: &str| format!("/api/v1/pods?fieldSelector={s}");
    assert_eq!(
        names(&get(&api, &f("metadata.name=a2")).await.json()),
        ["a2"]
    );
    assert_eq!(
        names(&get(&api, &f("metadata.namespace%3Dother")).await.json()),
        ["b1"]
    );
    assert_eq!(
        names(
            &get(&api, &f("metadata.namespace!=ns,metadata.name!=zz"))
                .await
                .json()
        ),
        ["b1"]
    );
    assert_eq!(
        names(&get(&api, &f("metadata.name==a1")).await.json()),
        ["a1"]
    );

    for bad in ["a%3Db%20c", "a%20in%20()", "%3Db", "a,", "-a", "a%20in%20x"] {
        let r = get(&api, &format!("/api/v1/pods?labelSelector={bad}")).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{bad} should be rejected"
        );
        assert_eq!(r.json()["reason"], "BadRequest");
    }
    assert_eq!(
        get(&api, &f("metadata.name")).await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn list_pagination() {
    let api = KubeApi::new();
    for i in 0..5 {
        api.insert(pod("ns", &format!("p{i}"), json!({})));
    }
    let mut seen = Vec::new();
    let mut uri = "/api/v1/namespaces/ns/pods?limit=2".to_string();
    let mut pages = 0;
    loop {
        let page = get(&api, &uri).await.json();
        pages += 1;
        seen.extend(names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(c) => uri = format!("/api/v1/namespaces/ns/pods?limit=2&continue={c}"),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, ["p0", "p1", "p2", "p3", "p4"]);
    let first = get(&api, "/api/v1/namespaces/ns/pods?limit=2").await.json();
    assert_eq!(first["metadata"]["remainingItemCount"], 3);
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/pods?continue=zz")
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
}

/// Reads newline-delimited JSON events from a streaming body.
struct Lines {
    body: Body,
    buf: Vec<u8>,
}

impl Lines {
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let frame = tokio::time::timeout(Duration::from_secs(5), self.body.frame())
                .await
                .expect("event within 5s")?;
            if let Ok(data) = frame.unwrap().into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }

    async fn event(&mut self) -> (String, String) {
        let e = self.next().await.expect("stream ended");
        (
            e["type"].as_str().unwrap().to_string(),
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
    }
}

async fn open_stream(api: &KubeApi, uri: &str) -> Lines {
    let resp = api
        .router()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    Lines {
        body: resp.into_body(),
        buf: Vec::new(),
    }
}

fn ev(t: &str, n: &str) -> (String, String) {
    (t.to_string(), n.to_string())
}

#[tokio::test]
async fn watch_streams_initial_state_then_changes() {
    let api = KubeApi::new();
    api.insert(pod("ns", "old", json!({"app": "web"})));
    api.insert(pod("ns", "other", json!({"app": "db"})));
    let mut w = open_stream(
        &api,
        "/api/v1/namespaces/ns/pods?watch=true&labelSelector=app%3Dweb",
    )
    .await;
    assert_eq!(w.event().await, ev("ADDED", "old"));
    assert_eq!(api.open_streams(), 1);

    api.insert(pod("ns", "new", json!({"app": "web"})));
    assert_eq!(w.event().await, ev("ADDED", "new"));
    api.insert(pod("elsewhere", "new", json!({"app": "web"})));
    api.insert(pod("ns", "ignored", json!({"app": "db"})));
    let mut changed = api.get("pods", Some("ns"), "new").unwrap();
    changed["metadata"]["annotations"] = json!({"x": "y"});
    api.insert(changed.clone());
    assert_eq!(w.event().await, ev("MODIFIED", "new"));
    // leaving the selector reads as DELETED, entering it as ADDED
    changed["metadata"]["labels"]["app"] = json!("db");
    api.insert(changed);
    assert_eq!(w.event().await, ev("DELETED", "new"));
    let mut other = api.get("pods", Some("ns"), "other").unwrap();
    other["metadata"]["labels"]["app"] = json!("web");
    api.insert(other);
    assert_eq!(w.event().await, ev("ADDED", "other"));
    api.remove("pods", Some("ns"), "old");
    let (kind, name) = w.event().await;
    assert_eq!((kind.as_str(), name.as_str()), ("DELETED", "old"));

    drop(w);
    assert_eq!(api.open_streams(), 0, "dropping the client ends the stream");
}

#[tokio::test]
async fn watch_resumes_from_resource_version_and_times_out() {
    let api = KubeApi::new();
    api.insert(pod("ns", "a", json!({})));
    let list = get(&api, "/api/v1/namespaces/ns/pods").await.json();
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    api.insert(pod("ns", "b", json!({})));
    let mut w = open_stream(
        &api,
        &format!("/api/v1/namespaces/ns/pods?watch=1&resourceVersion={rv}&timeoutSeconds=1"),
    )
    .await;
    assert_eq!(
        w.event().await,
        ev("ADDED", "b"),
        "only what happened after the list"
    );
    let started = Instant::now();
    assert!(w.next().await.is_none(), "timeoutSeconds ends the stream");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(api.open_streams(), 0);

    // watching one object by name, and the streaming-list bookmark
    let mut w = open_stream(&api, "/api/v1/namespaces/ns/pods?watch=true&fieldSelector=metadata.name%3Db&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan").await;
    assert_eq!(w.event().await, ev("ADDED", "b"));
    let bookmark = w.next().await.unwrap();
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert_eq!(
        bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

#[tokio::test]
async fn streams_end_when_tcp_client_disconnects_or_server_stops() {
    let api = KubeApi::new();
    api.insert(pod("ns", "a", json!({})));
    api.set_pod_log("ns", "a", None, "hello\n");
    let dir = tempfile::tempdir().unwrap();
    let served = api.serve(dir.path()).await;

    let addr = served.addr;
    let open = |path: &'static str| tokio::task::spawn_blocking(move || open_raw(addr, path));
    let watch = open("/api/v1/namespaces/ns/pods?watch=true").await.unwrap();
    let follow = open("/api/v1/namespaces/ns/pods/a/log?follow=true")
        .await
        .unwrap();
    wait_until(|| api.open_streams() == 2).await;
    drop(watch);
    drop(follow);
    wait_until(|| api.open_streams() == 0).await;

    let mut watch = open("/api/v1/namespaces/ns/pods?watch=true").await.unwrap();
    wait_until(|| api.open_streams() == 1).await;
    drop(served);
    let closed = tokio::task::spawn_blocking(move || {
        let mut rest = Vec::new();
        watch.read_to_end(&mut rest).is_ok()
    });
    assert!(closed.await.unwrap(), "server shutdown closes open watches");
    wait_until(|| api.open_streams() == 0).await;
}

/// A plain HTTP/1.1 GET over std TCP that returns once the response has started.
fn open_raw(addr: std::net::SocketAddr, path: &str) -> std::net::TcpStream {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    s
}

async fn next_text(body: &mut Body) -> String {
    let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap()
}

async fn wait_until(cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "condition not reached within 5s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn pod_logs() {
    let api = KubeApi::new();
    api.insert(pod("ns", "web", json!({})));
    api.set_pod_log("ns", "web", None, "one\ntwo\nthree\n");
    let r = get(&api, "/api/v1/namespaces/ns/pods/web/log").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.content_type, "text/plain");
    assert_eq!(r.text(), "one\ntwo\nthree\n");
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/pods/web/log?tailLines=2")
            .await
            .text(),
        "two\nthree\n"
    );
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/pods/web/log?container=app")
            .await
            .text(),
        "one\ntwo\nthree\n"
    );
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/pods/web/log?container=nope")
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/pods/ghost/log")
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // several containers: each has its own log, and one must be named
    let mut two = pod("ns", "duo", json!({}));
    two["spec"]["containers"] = json!([{"name": "a"}, {"name": "b"}]);
    api.insert(two);
    api.set_pod_log("ns", "duo", Some("a"), "from a\n");
    api.set_pod_log("ns", "duo", Some("b"), "from b\n");
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/pods/duo/log?container=b")
            .await
            .text(),
        "from b\n"
    );
    let unnamed = get(&api, "/api/v1/namespaces/ns/pods/duo/log").await;
    assert_eq!(unnamed.status, StatusCode::BAD_REQUEST);
    assert!(unnamed.json()["message"]
        .as_str()
        .unwrap()
        .contains("choose one of: [a b]"));

    let resp = api
        .router()
        .oneshot(
            Request::get("/api/v1/namespaces/ns/pods/web/log?follow=true&tailLines=1")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let mut body = resp.into_body();
    assert_eq!(next_text(&mut body).await, "three\n");
    api.append_pod_log("ns", "web", "four\n");
    assert_eq!(next_text(&mut body).await, "four\n");
    api.append_pod_log("ns", "duo", "not for web\n");
    api.append_pod_log("ns", "web", "five\n");
    assert_eq!(next_text(&mut body).await, "five\n");
    drop(body);
    assert_eq!(api.open_streams(), 0);
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/pods/web/log").await.text(),
        "one\ntwo\nthree\nfour\nfive\n"
    );
}

#[tokio::test]
async fn deny_rules_answer_forbidden_and_impersonation_is_recorded() {
    let api = KubeApi::new();
    api.insert(pod("default", "x", json!({})));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<RequestInfo>::new()));
    let log = seen.clone();
    api.deny(move |i| {
        log.lock().unwrap().push(i.clone());
        i.user == "x" && i.resource == "pods"
    });
    api.deny(|i| i.resource == "nodes" || (i.resource == "deployments" && i.verb == "watch"));

    let as_x = [
        ("impersonate-user", "x"),
        ("impersonate-group", "devs"),
        ("impersonate-group", "ops"),
        ("impersonate-uid", "u-1"),
        ("impersonate-extra-agent.gitlab.com%2Fproject", "42"),
        ("authorization", "Bearer test-token"),
    ];
    let r = send(&api, "GET", "/api/v1/namespaces/default/pods", None, &as_x).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "pods is forbidden: User \"x\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\"",
               "reason": "Forbidden", "details": {"name": "", "kind": "pods"}, "code": 403})
    );
    let named = send(
        &api,
        "GET",
        "/api/v1/namespaces/default/pods/x/log",
        None,
        &as_x,
    )
    .await
    .json();
    assert_eq!(named["message"], "pods \"x\" is forbidden: User \"x\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"default\"");
    let cluster = get(&api, "/api/v1/nodes").await.json();
    assert_eq!(cluster["message"], "nodes is forbidden: User \"admin\" cannot list resource \"nodes\" in API group \"\" at the cluster scope");
    assert_eq!(
        get(&api, "/api/v1/namespaces/default/pods").await.status,
        StatusCode::OK,
        "admin may list pods"
    );
    assert_eq!(
        get(&api, "/api/v1").await.status,
        StatusCode::OK,
        "discovery is never denied"
    );

    let info = seen.lock().unwrap()[0].clone();
    assert_eq!(info.verb, "list");
    assert_eq!(
        (
            info.group.as_str(),
            info.version.as_str(),
            info.resource.as_str()
        ),
        ("", "v1", "pods")
    );
    assert_eq!(info.namespace.as_deref(), Some("default"));
    assert_eq!(info.user, "x");
    assert_eq!(info.groups, ["devs", "ops", "system:authenticated"]);
    assert_eq!(info.uid.as_deref(), Some("u-1"));
    assert_eq!(info.extra["agent.gitlab.com/project"], ["42"]);
    let watch_info = {
        send(
            &api,
            "GET",
            "/apis/apps/v1/namespaces/ns/deployments?watch=true",
            None,
            &[],
        )
        .await;
        seen.lock().unwrap().last().unwrap().clone()
    };
    assert_eq!(
        (watch_info.verb.as_str(), watch_info.group.as_str()),
        ("watch", "apps")
    );
    assert_eq!(
        watch_info.groups,
        ["system:masters", "system:authenticated"]
    );

    let req = &api.requests()[0];
    assert_eq!(
        (req.method.as_str(), req.path.as_str(), req.query.as_str()),
        ("GET", "/api/v1/namespaces/default/pods", "")
    );
    assert_eq!(req.impersonate_user.as_deref(), Some("x"));
    assert_eq!(req.impersonate_groups, ["devs", "ops"]);
    assert_eq!(req.impersonate_uid.as_deref(), Some("u-1"));
    assert_eq!(req.impersonate_extra["agent.gitlab.com/project"], ["42"]);
    assert_eq!(req.header("Authorization"), Some("Bearer test-token"));

    api.allow_all();
    assert_eq!(get(&api, "/api/v1/nodes").await.status, StatusCode::OK);
    api.clear_requests();
    assert!(api.requests().is_empty());
    api.set_recording(false);
    get(&api, "/api/v1/nodes").await;
    assert!(api.requests().is_empty());
}

#[tokio::test]
async fn latency_is_added_to_every_request() {
    let api = KubeApi::new();
    api.set_latency(Duration::from_millis(150));
    let started = Instant::now();
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/pods").await.status,
        StatusCode::OK
    );
    assert!(started.elapsed() >= Duration::from_millis(150));
}

// ---- kubectl ----

fn kubectl_available() -> bool {
    std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs kubectl off the async runtime; returns (success, stdout, stderr).
async fn kubectl(
    served: &crate::support::kube_api::Served,
    args: &[&str],
) -> (bool, String, String) {
    let mut cmd = served.kubectl();
    cmd.args(args);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("run kubectl"))
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A running kubectl whose stdout lines arrive on a channel.
struct Lined {
    child: std::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

fn spawn_lines(cmd: &mut std::process::Command) -> Lined {
    use std::io::BufRead;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn kubectl");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Lined { child, lines }
}

impl Lined {
    async fn line(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(10), self.lines.recv())
            .await
            .expect("kubectl printed a line within 10s")
            .expect("kubectl still running")
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_against_the_fake_server() {
    if !kubectl_available() {
        eprintln!("kubectl not on PATH: skipping kubectl_against_the_fake_server");
        return;
    }
    let api = KubeApi::new();
    api.insert(pod("ns", "web-1", json!({"a": "b"})));
    api.insert(pod("ns", "web-2", json!({"a": "b"})));
    api.insert(pod("ns", "db-1", json!({"a": "c"})));
    api.insert(deployment("ns", "web"));
    api.insert(deployment("default", "api"));
    api.set_pod_log("ns", "web-1", None, "started\nlistening on :8080\n");
    api.add_kind("example.com", "v1", "Widget", "widgets", true);
    api.insert(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "ns"}}));
    let dir = tempfile::tempdir().unwrap();
    let served = api.serve(dir.path()).await;
    let kc = std::fs::read_to_string(&served.kubeconfig).unwrap();
    assert!(kc.contains(&format!("server: http://127.0.0.1:{}", served.addr.port())));

    let (ok, out, err) = kubectl(
        &served,
        &["get", "pods", "-l", "a=b", "-n", "ns", "-o", "name"],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, "pod/web-1\npod/web-2\n");

    let (ok, out, err) = kubectl(&served, &["get", "pods", "-l", "a in (c)", "-n", "ns"]).await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with("NAME") && out.contains("db-1") && !out.contains("web-1"),
        "{out}"
    );

    let (ok, out, err) = kubectl(&served, &["api-resources"]).await;
    assert!(ok, "{err}");
    let line = |name: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
    };
    assert_eq!(line("pods").unwrap(), ["pods", "po", "v1", "true", "Pod"]);
    assert_eq!(
        line("deployments").unwrap(),
        ["deployments", "deploy", "apps/v1", "true", "Deployment"]
    );
    assert_eq!(
        line("namespaces").unwrap(),
        ["namespaces", "ns", "v1", "false", "Namespace"]
    );
    assert_eq!(
        line("widgets").unwrap(),
        ["widgets", "example.com/v1", "true", "Widget"]
    );

    let (ok, out, err) = kubectl(&served, &["get", "deploy", "-A"]).await;
    assert!(ok, "{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().take(2).collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["NAMESPACE", "NAME"],
            vec!["default", "api"],
            vec!["ns", "web"]
        ],
        "{out}"
    );

    let (ok, out, err) = kubectl(&served, &["logs", "web-1", "-n", "ns"]).await;
    assert!(ok, "{err}");
    assert_eq!(out, "started\nlistening on :8080\n");
    let (ok, out, _) = kubectl(&served, &["logs", "web-1", "-n", "ns", "--tail=1"]).await;
    assert!(ok);
    assert_eq!(out, "listening on :8080\n");

    let (ok, out, err) = kubectl(&served, &["get", "widgets", "-n", "ns", "-o", "name"]).await;
    assert!(ok, "{err}");
    assert_eq!(out, "widget.example.com/w\n");

    // apply: create, then change (client-side apply sends a strategic merge patch)
    let manifest = dir.path().join("app.yaml");
    let yaml = |image: &str| {
        format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: applied\n  namespace: ns\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: applied}}\n  template:\n    metadata:\n      labels: {{app: applied}}\n    spec:\n      containers:\n      - name: app\n        image: {image}\n      - name: side\n        image: busybox\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: ns\ndata:\n  level: debug\n"
    )
    };
    std::fs::write(&manifest, yaml("nginx:1")).unwrap();
    let path = manifest.to_str().unwrap();
    let (ok, out, err) = kubectl(&served, &["apply", "-f", path]).await;
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "deployment.apps/applied created\nconfigmap/settings created\n"
    );
    std::fs::write(&manifest, yaml("nginx:2")).unwrap();
    let (ok, out, err) = kubectl(&served, &["apply", "-f", path]).await;
    assert!(ok, "{err}");
    assert_eq!(
        out,
        "deployment.apps/applied configured\nconfigmap/settings unchanged\n"
    );
    let applied = api.get("deployments.apps", Some("ns"), "applied").unwrap();
    let images: Vec<&str> = applied["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["image"].as_str().unwrap())
        .collect();
    assert_eq!(images, ["nginx:2", "busybox"]);

    let (ok, out, err) = kubectl(
        &served,
        &["scale", "deploy", "applied", "-n", "ns", "--replicas=3"],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, "deployment.apps/applied scaled\n");
    assert_eq!(
        api.get("deployments", Some("ns"), "applied").unwrap()["spec"]["replicas"],
        3
    );

    // get -w prints the list, then each change as it happens
    let mut watch = spawn_lines(
        served
            .kubectl()
            .args(["get", "pods", "-n", "ns", "-w", "-o", "name"]),
    );
    for want in ["pod/db-1", "pod/web-1", "pod/web-2"] {
        assert_eq!(watch.line().await, want);
    }
    api.insert(pod("ns", "late", json!({})));
    assert_eq!(watch.line().await, "pod/late");
    watch.stop();

    // logs -f keeps streaming what is appended
    let mut follow = spawn_lines(served.kubectl().args(["logs", "-f", "web-1", "-n", "ns"]));
    assert_eq!(follow.line().await, "started");
    assert_eq!(follow.line().await, "listening on :8080");
    api.append_pod_log("ns", "web-1", "GET /healthz 200\n");
    assert_eq!(follow.line().await, "GET /healthz 200");
    follow.stop();
    wait_until(|| api.open_streams() == 0).await;

    let (ok, out, err) = kubectl(&served, &["delete", "pod", "db-1", "-n", "ns"]).await;
    assert!(ok, "{err}");
    assert_eq!(out, "pod \"db-1\" deleted\n");

    let (ok, _, err) = kubectl(&served, &["get", "pod", "nope", "-n", "ns"]).await;
    assert!(!ok);
    assert!(err.contains("NotFound"), "{err}");

    // RBAC denial through impersonation
    api.deny(|i| i.user == "dev" && i.resource == "pods" && i.verb == "list");
    api.clear_requests();
    let (ok, _, err) = kubectl(
        &served,
        &[
            "get",
            "pods",
            "-n",
            "ns",
            "--as=dev",
            "--as-group=team-a",
            "--as-group=team-b",
        ],
    )
    .await;
    assert!(!ok);
    assert_eq!(
        err.trim(),
        "Error from server (Forbidden): pods is forbidden: User \"dev\" cannot list resource \"pods\" in API group \"\" in the namespace \"ns\""
    );
    let list_req = api
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v1/namespaces/ns/pods")
        .unwrap();
    assert_eq!(list_req.impersonate_user.as_deref(), Some("dev"));
    assert_eq!(list_req.impersonate_groups, ["team-a", "team-b"]);
    // clientcmd only sends credentials over TLS, so the token never reaches an http:// server.
    assert_eq!(list_req.header("authorization"), None);
}

// ---- what watch caches rely on: versions, history, bookmarks, RBAC reviews, request counts ----

fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn resource_versions_are_one_global_counter_and_watches_replay_after_them() {
    let api = KubeApi::new();
    let a = send(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods",
        Some(pod("ns", "a", json!({"app": "web"}))),
        &[],
    )
    .await
    .json();
    let d = send(
        &api,
        "POST",
        "/apis/apps/v1/namespaces/ns/deployments",
        Some(deployment("ns", "d")),
        &[],
    )
    .await
    .json();
    assert_eq!(
        rv_of(&d),
        rv_of(&a) + 1,
        "one counter across kinds, as etcd's revision"
    );
    let list = get(&api, "/api/v1/namespaces/ns/pods").await.json();
    assert_eq!(
        rv_of(&list),
        rv_of(&d),
        "a list carries the current version"
    );
    assert_eq!(api.resource_version(), rv_of(&d));

    // Every write after the list, replayed to a watch from its version, selector applied.
    let from = rv_of(&list);
    send(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods",
        Some(pod("ns", "b", json!({"app": "web"}))),
        &[],
    )
    .await;
    send(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods",
        Some(pod("ns", "other", json!({"app": "db"}))),
        &[],
    )
    .await;
    let patched = send(
        &api,
        "PATCH",
        "/api/v1/namespaces/ns/pods/a",
        Some(json!({"metadata": {"annotations": {"x": "1"}}})),
        &[("content-type", "application/merge-patch+json")],
    )
    .await;
    assert_eq!(patched.status, StatusCode::OK);
    let mut b = api.get("pods", Some("ns"), "b").unwrap();
    b["metadata"]["labels"]["tier"] = json!("front");
    let updated = send(&api, "PUT", "/api/v1/namespaces/ns/pods/b", Some(b), &[]).await;
    assert_eq!(updated.status, StatusCode::OK);
    assert_eq!(
        send(&api, "DELETE", "/api/v1/namespaces/ns/pods/a", None, &[])
            .await
            .status,
        StatusCode::OK
    );
    let mut w = open_stream(
        &api,
        &format!(
            "/api/v1/namespaces/ns/pods?watch=true&labelSelector=app%3Dweb&resourceVersion={from}"
        ),
    )
    .await;
    let mut seen = Vec::new();
    let mut last = from;
    for _ in 0..4 {
        let e = w.next().await.unwrap();
        let rv = rv_of(&e["object"]);
        assert!(rv > last, "versions grow along the stream");
        last = rv;
        seen.push((
            e["type"].as_str().unwrap().to_string(),
            e["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        ));
    }
    assert_eq!(
        seen,
        [
            ev("ADDED", "b"),
            ev("MODIFIED", "a"),
            ev("MODIFIED", "b"),
            ev("DELETED", "a")
        ]
    );
    assert_eq!(last, api.resource_version());

    // A live watch sees writes through the API as they happen.
    send(
        &api,
        "POST",
        "/api/v1/namespaces/ns/pods",
        Some(pod("ns", "c", json!({"app": "web"}))),
        &[],
    )
    .await;
    assert_eq!(w.event().await, ev("ADDED", "c"));
}

#[tokio::test]
async fn an_expired_version_is_410_gone_on_the_watch_stream() {
    let api = KubeApi::new();
    api.insert(pod("ns", "a", json!({})));
    let old = api.resource_version();
    api.insert(pod("ns", "b", json!({})));
    api.compact();
    let mut w = open_stream(
        &api,
        &format!("/api/v1/namespaces/ns/pods?watch=true&resourceVersion={old}"),
    )
    .await;
    let e = w.next().await.unwrap();
    assert_eq!(e["type"], "ERROR");
    assert_eq!(e["object"]["kind"], "Status");
    assert_eq!(e["object"]["code"], 410);
    assert_eq!(e["object"]["reason"], "Expired");
    assert!(w.next().await.is_none(), "the stream ends after the error");
    // From the current version (a fresh list's), the watch works.
    let now = api.resource_version();
    let mut w = open_stream(
        &api,
        &format!("/api/v1/namespaces/ns/pods?watch=true&resourceVersion={now}"),
    )
    .await;
    api.insert(pod("ns", "c", json!({})));
    assert_eq!(w.event().await, ev("ADDED", "c"));
}

#[tokio::test]
async fn bookmarks_carry_the_version_the_watch_has_passed() {
    let api = KubeApi::new();
    api.set_bookmark_interval(Duration::from_millis(50));
    api.insert(pod("ns", "a", json!({})));
    let from = api.resource_version();
    let mut w = open_stream(
        &api,
        &format!(
            "/api/v1/namespaces/ns/pods?watch=true&allowWatchBookmarks=true&resourceVersion={from}"
        ),
    )
    .await;
    let first = w.next().await.unwrap();
    assert_eq!(first["type"], "BOOKMARK");
    assert_eq!(first["object"]["kind"], "Pod");
    assert_eq!(rv_of(&first["object"]), from);
    // A change to another kind moves the bookmark on without an event of this kind.
    api.insert(deployment("ns", "d"));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let e = w.next().await.unwrap();
        assert_eq!(e["type"], "BOOKMARK");
        if rv_of(&e["object"]) == api.resource_version() {
            break;
        }
        assert!(Instant::now() < deadline, "no bookmark at the new version");
    }
    // Without allowWatchBookmarks there are none.
    let mut quiet = open_stream(
        &api,
        "/api/v1/namespaces/ns/pods?watch=true&resourceVersion=1000000&timeoutSeconds=1",
    )
    .await;
    assert!(quiet.next().await.is_none());
}

fn rbac_objects(api: &KubeApi) {
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "pod-reader", "namespace": "ns"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]}]}));
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "devs-read-pods", "namespace": "ns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
        "subjects": [{"kind": "Group", "name": "devs"}]}),
    );
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "apps-admin"},
        "rules": [{"apiGroups": ["apps"], "resources": ["*"], "verbs": ["*"]}]}),
    );
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "alice-apps", "namespace": "ns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "apps-admin"},
        "subjects": [{"kind": "User", "name": "alice"}]}));
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "named-config"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["settings"]}]}));
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "bob-config"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "named-config"},
        "subjects": [{"kind": "User", "name": "bob"}]}));
}

async fn review(api: &KubeApi, user: &str, groups: &[&str], attrs: Value) -> Value {
    let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "resourceAttributes": attrs}});
    let r = send(
        api,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        Some(body),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    r.json()
}

#[tokio::test]
async fn subject_access_reviews_follow_the_stored_rbac_objects() {
    let api = KubeApi::new();
    rbac_objects(&api);
    api.enforce_rbac();
    let allowed = |v: &Value| v["status"]["allowed"].as_bool().unwrap();
    let pods = |verb: &str, ns: &str| json!({"verb": verb, "resource": "pods", "namespace": ns});
    let r = review(&api, "carol", &["devs"], pods("list", "ns")).await;
    assert!(allowed(&r), "{r}");
    assert_eq!(r["kind"], "SubjectAccessReview");
    assert_eq!(
        r["status"]["reason"],
        "RBAC: allowed by RoleBinding \"devs-read-pods/ns\""
    );
    assert!(allowed(
        &review(&api, "carol", &["devs"], pods("watch", "ns")).await
    ));
    assert!(!allowed(
        &review(&api, "carol", &["devs"], pods("delete", "ns")).await
    ));
    assert!(
        !allowed(&review(&api, "carol", &["devs"], pods("list", "other")).await),
        "a Role is one namespace's"
    );
    assert!(!allowed(
        &review(&api, "carol", &["ops"], pods("list", "ns")).await
    ));
    assert!(allowed(&review(&api, "carol", &["devs"], json!({"verb": "get", "resource": "pods", "subresource": "log", "namespace": "ns", "name": "p"})).await));
    // A ClusterRole bound in one namespace, `*` in resources and verbs.
    let deploys = json!({"verb": "deletecollection", "group": "apps", "resource": "deployments", "namespace": "ns"});
    assert!(allowed(&review(&api, "alice", &[], deploys.clone()).await));
    assert!(!allowed(&review(&api, "alice", &[], json!({"verb": "list", "group": "apps", "resource": "deployments", "namespace": "other"})).await));
    assert!(!allowed(
        &review(
            &api,
            "alice",
            &[],
            json!({"verb": "list", "group": "batch", "resource": "jobs", "namespace": "ns"})
        )
        .await
    ));
    // resourceNames: that object only, and never a list.
    let config = |name: Option<&str>| json!({"verb": "get", "resource": "configmaps", "namespace": "any", "name": name});
    assert!(allowed(
        &review(&api, "bob", &[], config(Some("settings"))).await
    ));
    assert!(!allowed(
        &review(&api, "bob", &[], config(Some("secrets"))).await
    ));
    assert!(!allowed(&review(&api, "bob", &[], config(None)).await));
    // system:masters may do anything; removing the binding takes the grant away.
    assert!(allowed(
        &review(&api, "root", &["system:masters"], deploys.clone()).await
    ));
    api.remove(
        "rolebindings.rbac.authorization.k8s.io",
        Some("ns"),
        "alice-apps",
    );
    assert!(!allowed(&review(&api, "alice", &[], deploys).await));

    // The caller's own review, impersonated.
    let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "ns"}}});
    let r = send(
        &api,
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        Some(body.clone()),
        &[("impersonate-user", "dan"), ("impersonate-group", "devs")],
    )
    .await;
    assert!(allowed(&r.json()), "{}", r.text());
    let r = send(
        &api,
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        Some(body),
        &[("impersonate-user", "dan")],
    )
    .await;
    assert!(!allowed(&r.json()));
    // Bad reviews are 4xx.
    let empty = json!({"spec": {"resourceAttributes": {"verb": "list", "resource": "pods"}}});
    assert_eq!(
        send(
            &api,
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            Some(empty),
            &[]
        )
        .await
        .status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        get(&api, "/apis/authorization.k8s.io/v1/subjectaccessreviews")
            .await
            .status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[tokio::test]
async fn enforced_rbac_refuses_what_the_bindings_do_not_grant() {
    let api = KubeApi::new();
    rbac_objects(&api);
    api.insert(pod("ns", "a", json!({})));
    api.enforce_rbac();
    let as_dev = [("impersonate-user", "carol"), ("impersonate-group", "devs")];
    assert_eq!(
        send(&api, "GET", "/api/v1/namespaces/ns/pods", None, &as_dev)
            .await
            .status,
        StatusCode::OK
    );
    let refused = send(&api, "GET", "/api/v1/namespaces/ns/services", None, &as_dev).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(refused.json()["message"], "services is forbidden: User \"carol\" cannot list resource \"services\" in API group \"\" in the namespace \"ns\"");
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/services").await.status,
        StatusCode::OK,
        "the admin is in system:masters"
    );
}

/// `SelfSubjectRulesReview` answers, in Kubernetes' shape, the rules RBAC grants the caller in
/// `spec.namespace`: each bound role's rules (cluster-wide and the namespace's own), the
/// default `system:basic-user` and discovery rules, `incomplete` when a deny rule (an
/// authorizer without rules) decides too; everything for `system:masters`.
#[tokio::test]
async fn self_subject_rules_reviews_list_what_rbac_grants() {
    let api = KubeApi::new();
    rbac_objects(&api);
    api.enforce_rbac();
    let rules = |ns: &'static str, headers: &'static [(&'static str, &'static str)]| {
        let api = api.clone();
        async move {
            let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                "spec": {"namespace": ns}});
            let r = send(
                &api,
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                Some(body),
                headers,
            )
            .await;
            assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
            let review = r.json();
            assert_eq!(review["kind"], "SelfSubjectRulesReview");
            assert_eq!(review["spec"]["namespace"], ns);
            review["status"].clone()
        }
    };
    let basic = json!({"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
        "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]});
    let carol: &[(&str, &str)] = &[("impersonate-user", "carol"), ("impersonate-group", "devs")];
    let status = rules("ns", carol).await;
    assert_eq!(
        status["resourceRules"],
        json!([basic, {"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["pods", "pods/log"]}])
    );
    assert_eq!(status["incomplete"], false);
    assert!(status["nonResourceRules"][0]["nonResourceURLs"]
        .as_array()
        .unwrap()
        .contains(&json!("/apis/*")));
    // A Role is one namespace's; a ClusterRole bound cluster-wide is every namespace's, its
    // resourceNames kept.
    assert_eq!(rules("other", carol).await["resourceRules"], json!([basic]));
    let bob = rules("any", &[("impersonate-user", "bob")]).await;
    assert_eq!(
        bob["resourceRules"][1],
        json!({"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"]})
    );
    let alice = rules("ns", &[("impersonate-user", "alice")]).await;
    assert_eq!(
        alice["resourceRules"][1],
        json!({"verbs": ["*"], "apiGroups": ["apps"], "resources": ["*"]})
    );
    // The admin may do anything.
    let admin = rules("ns", &[]).await;
    assert_eq!(
        admin["resourceRules"],
        json!([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}])
    );
    // A deny rule decides beyond the rules listed.
    api.deny(|i| i.resource == "services");
    assert_eq!(rules("ns", carol).await["incomplete"], true);
}

/// A token added to the server authenticates its user, who gets what RBAC grants: its own
/// requests, and impersonation only of the users, groups and extras it may impersonate.
#[tokio::test]
async fn a_tokens_user_gets_what_its_bindings_grant_impersonation_included() {
    let api = KubeApi::new();
    rbac_objects(&api);
    api.insert(pod("ns", "a", json!({})));
    api.add_token(
        "sa-token",
        "system:serviceaccount:gitlab:envlens",
        &["system:serviceaccounts"],
    );
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "impersonator"},
        "rules": [{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": ["carol"]},
                  {"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"]},
                  {"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/agent.gitlab.com/id"], "verbs": ["impersonate"]}]}));
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "envlens-impersonates"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "impersonator"},
        "subjects": [{"kind": "ServiceAccount", "name": "envlens", "namespace": "gitlab"}]}));
    api.enforce_rbac();
    let token = ("authorization", "Bearer sa-token");
    let own = send(&api, "GET", "/api/v1/namespaces/ns/pods", None, &[token]).await;
    assert_eq!(own.status, StatusCode::FORBIDDEN);
    assert_eq!(own.json()["message"], "pods is forbidden: User \"system:serviceaccount:gitlab:envlens\" cannot list resource \"pods\" in API group \"\" in the namespace \"ns\"");
    let as_carol = [
        token,
        ("impersonate-user", "carol"),
        ("impersonate-group", "devs"),
        ("impersonate-extra-agent.gitlab.com%2fid", "7"),
    ];
    let r = send(&api, "GET", "/api/v1/namespaces/ns/pods", None, &as_carol).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    for (refused, message) in [
        (("impersonate-user", "alice"), "users \"alice\" is forbidden: User \"system:serviceaccount:gitlab:envlens\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"),
        (("impersonate-extra-scopes", "all"), "userextras/scopes \"all\" is forbidden: User \"system:serviceaccount:gitlab:envlens\" cannot impersonate resource \"userextras/scopes\" in API group \"authentication.k8s.io\" at the cluster scope"),
    ] {
        let mut headers = as_carol.to_vec();
        if refused.0 == "impersonate-user" {
            headers[1] = refused;
        } else {
            headers.push(refused);
        }
        let r = send(&api, "GET", "/api", None, &headers).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
        assert_eq!(r.json()["message"], message);
    }
    // Without a token (kubectl over http) the caller is still the admin.
    assert_eq!(
        get(&api, "/api/v1/namespaces/ns/pods").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn requests_are_counted_per_verb_and_resource() {
    let api = KubeApi::new();
    api.set_recording(false);
    api.insert(pod("ns", "a", json!({})));
    get(&api, "/api/v1/namespaces/ns/pods").await;
    get(&api, "/api/v1/namespaces/ns/pods").await;
    get(&api, "/api/v1/namespaces/ns/pods/a").await;
    get(
        &api,
        "/apis/apps/v1/namespaces/ns/deployments?watch=true&timeoutSeconds=1",
    )
    .await;
    get(&api, "/apis/apps/v1").await;
    api.deny(|i| i.resource == "services");
    get(&api, "/api/v1/namespaces/ns/services").await;
    assert_eq!(api.request_count("list", "pods"), 2);
    assert_eq!(api.request_count("get", "pods"), 1);
    assert_eq!(api.request_count("watch", "deployments.apps"), 1);
    assert_eq!(
        api.request_count("list", "services"),
        1,
        "denied requests count too"
    );
    assert_eq!(api.resource_requests(), 5, "discovery is not counted");
    api.reset_request_counts();
    assert!(api.request_counts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_watches_and_asks_can_i() {
    if !kubectl_available() {
        eprintln!("kubectl not on PATH: skipping kubectl_watches_and_asks_can_i");
        return;
    }
    let api = KubeApi::new();
    api.set_bookmark_interval(Duration::from_millis(100));
    rbac_objects(&api);
    api.enforce_rbac();
    api.insert(pod("ns", "a", json!({})));
    let dir = tempfile::tempdir().unwrap();
    let served = api.serve(dir.path()).await;
    // --watch-only with a timeout: bookmarks in between are not printed, changes are.
    let mut watch = spawn_lines(served.kubectl().args([
        "get",
        "pods",
        "-n",
        "ns",
        "--watch-only",
        "-o",
        "name",
        "--request-timeout=20s",
    ]));
    wait_until(|| api.open_streams() == 1).await;
    api.insert(pod("ns", "b", json!({})));
    assert_eq!(watch.line().await, "pod/b");
    watch.stop();

    let (ok, out, err) = kubectl(
        &served,
        &[
            "auth",
            "can-i",
            "list",
            "pods",
            "-n",
            "ns",
            "--as=carol",
            "--as-group=devs",
        ],
    )
    .await;
    assert!(ok, "{out}{err}");
    assert_eq!(out.trim(), "yes");
    let (ok, out, _) = kubectl(
        &served,
        &[
            "auth",
            "can-i",
            "delete",
            "pods",
            "-n",
            "ns",
            "--as=carol",
            "--as-group=devs",
        ],
    )
    .await;
    assert!(!ok);
    assert_eq!(out.trim(), "no");
    assert!(api.request_count("create", "selfsubjectaccessreviews.authorization.k8s.io") >= 2);
    // `--list` sends a SelfSubjectRulesReview (protobuf) and prints its rules.
    let (ok, out, err) = kubectl(
        &served,
        &[
            "auth",
            "can-i",
            "--list",
            "-n",
            "ns",
            "--as=carol",
            "--as-group=devs",
        ],
    )
    .await;
    assert!(ok, "{out}{err}");
    let pods = out
        .lines()
        .find(|l| l.starts_with("pods "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(pods.contains("[get list watch]"), "{out}");
    assert!(!out.contains("services"), "{out}");
    assert_eq!(
        api.request_count("create", "selfsubjectrulesreviews.authorization.k8s.io"),
        1
    );
}
