//! Listing an environment's resource group from the test Kubernetes API server through a real
//! `kube::Client`: selection, ownership, events, failures, discovery refreshes and the bound on
//! requests in flight.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use envlens::k8s::discovery::DiscoveryCache;
use envlens::k8s::fetch::{list_resource_group, FetchError, FetchOptions};
use envlens::resources::graph::EdgeType;
use envlens::resources::group::{self, label_selector, ResourceGroup};
use envlens::resources::health::HealthStatus;
use envlens::resources::listing::ListError;

use crate::support::environment::*;
use crate::support::kube_api::{Fault, KubeApi, RecordedRequest, Served};

fn selector() -> String {
    label_selector(PROJECT, SLUG)
}

async fn client(served: &Served) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&served.kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    // As the service builds it for interactive views: kube's default retry policy would retry a
    // 503 for seconds instead of reporting it.
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// What the Kubernetes proxy would add for a user with `access_as: {user: {}}`.
fn impersonation() -> HeaderMap {
    let mut headers = HeaderMap::new();
    let mut add = |name: &'static str, value: &'static str| {
        headers.append(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    };
    add("impersonate-user", "gitlab:user:alice");
    add("impersonate-group", "gitlab:user");
    add("impersonate-group", "gitlab:project_role:42:developer");
    add("impersonate-extra-agent.gitlab.com%2fid", "7");
    headers
}

fn is_discovery(r: &RecordedRequest) -> bool {
    let segments = r.path.split('/').filter(|s| !s.is_empty()).count();
    r.path.starts_with("/api") && (segments <= 2 || (r.path.starts_with("/apis/") && segments == 3))
}

fn list_requests(api: &KubeApi) -> Vec<RecordedRequest> {
    api.requests()
        .into_iter()
        .filter(|r| !is_discovery(r))
        .collect()
}

struct Cluster {
    api: KubeApi,
    served: Served,
    client: kube::Client,
    discovery: DiscoveryCache,
    _dir: tempfile::TempDir,
}

async fn cluster(api: KubeApi) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let served = api.serve(dir.path()).await;
    let client = client(&served).await;
    let discovery = DiscoveryCache::new(client.clone(), Duration::from_secs(300));
    Cluster {
        api,
        served,
        client,
        discovery,
        _dir: dir,
    }
}

impl Cluster {
    async fn list(&self, options: &FetchOptions) -> Result<ResourceGroup, FetchError> {
        let listing = list_resource_group(
            &self.client,
            &self.discovery,
            &impersonation(),
            NS,
            &selector(),
            options,
        )
        .await?;
        assert_eq!(listing.namespace, NS);
        Ok(group::assemble(listing, &Default::default()))
    }
}

fn names(group: &ResourceGroup) -> Vec<String> {
    group
        .resources
        .iter()
        .map(|r| format!("{} {}", r.kind, r.name))
        .collect()
}

#[tokio::test]
async fn lists_the_environment_and_what_it_owns() {
    let api = KubeApi::new();
    environment(&api);
    let c = cluster(api).await;
    widgets(&c.api);
    c.api
        .deny(|i| i.resource == "secrets" && i.user == "gitlab:user:alice");

    let group = c.list(&FetchOptions::default()).await.unwrap();

    assert_eq!(
        names(&group),
        [
            // apps/v1
            "Deployment web",
            "ReplicaSet web-new222",
            "ReplicaSet web-old111",
            // batch/v1
            "CronJob nightly",
            "Job nightly-2871",
            // discovery.k8s.io/v1
            "EndpointSlice web-x7k2p",
            // example.com/v1, added while the server ran
            "Widget banner",
            // v1
            "ConfigMap web-config",
            "Endpoints web",
            "Pod nightly-2871-q9",
            "Pod web-new222-a",
            "Pod web-new222-b",
            "Pod web-old111-a",
            "Service web",
        ]
    );
    assert_eq!(
        group.errors,
        [ListError {
            api_version: "v1".into(),
            kind: "Secret".into(),
            code: Some(403),
            message: "secrets is forbidden: User \"gitlab:user:alice\" cannot list resource \"secrets\" in API group \"\" in the namespace \"shop\"".into(),
        }]
    );
    assert!(group.warnings.is_empty(), "{:?}", group.warnings);
    assert_eq!(group.label_selector, selector());

    let find = |name: &str| {
        group
            .resources
            .iter()
            .find(|r| format!("{} {}", r.kind, r.name) == name)
            .unwrap()
    };
    let web = find("Deployment web");
    assert_eq!(web.uid, "uid-web");
    assert_eq!(web.api_version, "apps/v1");
    assert_eq!(web.namespace.as_deref(), Some(NS));
    assert_eq!(web.labels["app.gitlab.com/environment_slug"], SLUG);
    assert!(web.created_at.is_some());
    assert_eq!(web.object.manifest()["spec"]["replicas"], 2);
    for r in &group.resources {
        let manifest = r.object.manifest();
        assert_eq!(manifest["metadata"]["uid"], r.uid.as_str());
        assert_eq!(manifest["apiVersion"], r.api_version.as_str());
        assert!(
            manifest["metadata"].get("managedFields").is_none(),
            "{}",
            r.name
        );
    }
    let reasons = |name: &str| -> Vec<(String, String)> {
        find(name)
            .events
            .iter()
            .map(|e| (e.reason.clone(), e.last_seen.unwrap().to_rfc3339()))
            .collect()
    };
    assert_eq!(
        reasons("Deployment web"),
        [
            (
                "ScalingReplicaSet".to_string(),
                "2024-06-02T10:00:00+00:00".to_string()
            ),
            (
                "ScalingReplicaSet".to_string(),
                "2024-06-01T10:00:00+00:00".to_string()
            ),
        ]
    );
    assert_eq!(reasons("Pod web-new222-a")[0].0, "BackOff");
    assert_eq!(find("Pod web-new222-a").events[0].event_type, "Warning");
    assert!(find("Pod web-new222-b").events.is_empty());
    assert_eq!(
        find("Widget banner").health.as_ref().unwrap().status,
        HealthStatus::Healthy
    );
    assert_eq!(find("ConfigMap web-config").health, None);

    let edge = |from: &str, to: &str| {
        let uid = |i: u32| &group.resources[i as usize].uid;
        let (from, to) = (&find(from).uid, &find(to).uid);
        group
            .edges
            .iter()
            .find(|e| uid(e.from) == from && uid(e.to) == to)
            .map(|e| e.kind)
    };
    assert_eq!(
        edge("Deployment web", "ReplicaSet web-new222"),
        Some(EdgeType::Owner)
    );
    assert_eq!(
        edge("ReplicaSet web-new222", "Pod web-new222-b"),
        Some(EdgeType::Owner)
    );
    assert_eq!(
        edge("Service web", "EndpointSlice web-x7k2p"),
        Some(EdgeType::Owner)
    );
    assert_eq!(
        edge("Service web", "Endpoints web"),
        Some(EdgeType::Endpoints)
    );
    assert_eq!(
        edge("CronJob nightly", "Job nightly-2871"),
        Some(EdgeType::Owner)
    );
    assert_eq!(
        edge("Job nightly-2871", "Pod nightly-2871-q9"),
        Some(EdgeType::Owner)
    );
    assert_eq!(
        edge("Service web", "Deployment web"),
        Some(EdgeType::ServiceSelector)
    );

    // Every list carried the caller's headers and asked for JSON; discovery, shared by every
    // user of the cluster, went under the connection's own identity.
    let requests = c.api.requests();
    let (discovery, lists): (Vec<_>, Vec<_>) = requests.iter().partition(|r| is_discovery(r));
    assert!(!discovery.is_empty() && !lists.is_empty());
    for r in &lists {
        assert_eq!(
            r.impersonate_user.as_deref(),
            Some("gitlab:user:alice"),
            "{}",
            r.path
        );
        assert_eq!(
            r.impersonate_groups,
            ["gitlab:user", "gitlab:project_role:42:developer"],
            "{}",
            r.path
        );
        assert_eq!(
            r.impersonate_extra["agent.gitlab.com/id"],
            ["7"],
            "{}",
            r.path
        );
        assert_eq!(r.header("accept"), Some("application/json"), "{}", r.path);
        assert_eq!(
            r.header("authorization"),
            Some("Bearer test-token"),
            "{}",
            r.path
        );
    }
    for r in &discovery {
        assert_eq!(r.impersonate_user, None, "{}", r.path);
    }
    // One list per kind and the Events: owned kinds without the selector, the others with it.
    let mut paths = BTreeSet::new();
    for r in &lists {
        assert!(paths.insert(r.path.clone()), "listed twice: {}", r.path);
        let unselected = [
            "/api/v1/namespaces/shop/pods",
            "/api/v1/namespaces/shop/endpoints",
            "/api/v1/namespaces/shop/persistentvolumeclaims",
            "/api/v1/namespaces/shop/events",
            "/apis/apps/v1/namespaces/shop/replicasets",
            "/apis/batch/v1/namespaces/shop/jobs",
            "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices",
        ];
        let expected = (!unselected.contains(&r.path.as_str())).then(selector);
        assert_eq!(r.query_param("labelSelector"), expected, "{}", r.path);
        assert_eq!(r.query_param("limit").as_deref(), Some("500"), "{}", r.path);
    }
    assert!(paths.contains("/apis/example.com/v1/namespaces/shop/widgets"));
    assert!(paths.contains("/apis/rbac.authorization.k8s.io/v1/namespaces/shop/roles"));
    for left_out in [
        "events.k8s.io",
        "/nodes",
        "namespaces/shop/namespaces",
        "apiservices",
    ] {
        assert!(
            !paths.iter().any(|p| p.contains(left_out)),
            "{left_out} listed"
        );
    }
}

#[tokio::test]
async fn requests_stay_within_the_bound_and_go_in_one_round() {
    let api = KubeApi::new();
    environment(&api);
    let c = cluster(api).await;
    c.discovery.kinds().await.unwrap();
    let expected = names(&c.list(&FetchOptions::default()).await.unwrap());
    let round = list_requests(&c.api).len();
    assert!(round > 15, "{round} lists");

    // Bounded: pages of 2 make several requests per kind, never more than 3 at once.
    c.api.set_latency(Duration::from_millis(30));
    c.api.clear_requests();
    c.api.reset_in_flight_peak();
    let bounded = FetchOptions {
        max_in_flight: 3,
        page_size: 2,
        ..FetchOptions::default()
    };
    let group = c.list(&bounded).await.unwrap();
    assert_eq!(names(&group), expected, "paging changes nothing");
    assert_eq!(c.api.in_flight_peak(), 3);
    let lists = list_requests(&c.api);
    let continued: Vec<_> = lists
        .iter()
        .filter(|r| r.query_param("continue").is_some())
        .collect();
    assert!(
        continued.iter().any(|r| r.path.ends_with("/pods")),
        "pods take several pages"
    );
    assert!(lists
        .iter()
        .all(|r| r.query_param("limit").as_deref() == Some("2")));

    // Unbounded enough: every list (selected, unselected owned kinds, Events) in flight at once.
    c.api.set_latency(Duration::from_millis(300));
    c.api.clear_requests();
    c.api.reset_in_flight_peak();
    let group = c.list(&FetchOptions::default()).await.unwrap();
    assert_eq!(names(&group), expected);
    assert_eq!(list_requests(&c.api).len(), round);
    assert_eq!(c.api.in_flight_peak(), round, "one round of requests");
}

#[tokio::test]
async fn failing_kinds_are_reported_and_the_rest_answers() {
    let api = KubeApi::new();
    environment(&api);
    // An aggregated API whose server is down: discovery of its group version answers 503.
    api.add_kind("metrics.example.com", "v1beta1", "Usage", "usages", true);
    api.set_unavailable("metrics.example.com", "v1beta1");
    api.fault(|i| {
        (i.resource == "configmaps" && i.verb == "list")
            .then(|| Fault::Status(500, "etcdserver: request timed out".into()))
    });
    api.fault(|i| (i.resource == "cronjobs").then_some(Fault::Delay(Duration::from_secs(3))));
    let c = cluster(api).await;

    let options = FetchOptions {
        request_timeout: Duration::from_millis(500),
        ..FetchOptions::default()
    };
    let group = c.list(&options).await.unwrap();
    assert_eq!(
        group.errors,
        [
            ListError {
                api_version: "batch/v1".into(),
                kind: "CronJob".into(),
                code: None,
                message: "no answer within 0.5 s".into(),
            },
            ListError {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                code: Some(500),
                message: "etcdserver: request timed out".into(),
            },
        ]
    );
    assert_eq!(
        group.warnings,
        ["The API metrics.example.com/v1beta1 is unavailable (503), so its resources are not shown: the server is currently unable to handle the request"]
    );
    let names = names(&group);
    assert!(names.contains(&"Deployment web".to_string()), "{names:?}");
    assert!(names.contains(&"Pod web-new222-b".to_string()), "{names:?}");
    // The CronJob did not answer, so neither it nor what it owns is in the group.
    assert!(!names.iter().any(|n| n.contains("nightly")), "{names:?}");
    let discovered = c.discovery.cached().unwrap();
    assert!(!discovered
        .kinds
        .iter()
        .any(|k| k.group == "metrics.example.com"));
    assert_eq!(
        discovered.failures[0].group_version,
        "metrics.example.com/v1beta1"
    );
    assert_eq!(discovered.failures[0].code, Some(503));
}

#[tokio::test]
async fn a_custom_resource_moved_to_another_version_is_found_after_a_404() {
    let api = KubeApi::new();
    environment(&api);
    widgets(&api);
    let c = cluster(api).await;
    let before = c.list(&FetchOptions::default()).await.unwrap();
    assert!(names(&before).contains(&"Widget banner".to_string()));
    let first = c.discovery.cached().unwrap().generation;

    // The CRD now serves v2 only (stored objects are shared by every version of the kind).
    c.api.remove_kind("example.com", "v1", "widgets");
    c.api
        .add_kind("example.com", "v2", "Widget", "widgets", true);
    let during = c.list(&FetchOptions::default()).await.unwrap();
    assert_eq!(
        during.errors,
        [ListError {
            api_version: "example.com/v1".into(),
            kind: "Widget".into(),
            code: Some(404),
            message: "the server could not find the requested resource".into(),
        }]
    );
    assert!(!names(&during).contains(&"Widget banner".to_string()));

    // The 404 dropped the cached discovery long before its TTL: the next view waits for the new one.
    c.api.clear_requests();
    let after = c.list(&FetchOptions::default()).await.unwrap();
    assert!(after.errors.is_empty(), "{:?}", after.errors);
    assert!(names(&after).contains(&"Widget banner".to_string()));
    assert!(c.discovery.cached().unwrap().generation > first);
    assert!(c
        .api
        .requests()
        .iter()
        .any(|r| r.path == "/apis/example.com/v2/namespaces/shop/widgets"));
}

#[tokio::test]
async fn stale_discovery_is_served_while_it_refreshes() {
    let api = KubeApi::new();
    environment(&api);
    let dir = tempfile::tempdir().unwrap();
    let served = api.serve(dir.path()).await;
    let client = client(&served).await;
    // A TTL of zero: every read finds the snapshot stale.
    let discovery = DiscoveryCache::new(client, Duration::ZERO);
    let first = discovery.kinds().await.unwrap();
    assert!(first.kinds.iter().any(|k| k.kind == "Deployment"));
    assert!(!first.kinds.iter().any(|k| k.kind == "Widget"));

    api.add_kind("example.com", "v1", "Widget", "widgets", true);
    api.set_latency(Duration::from_secs(1));
    let started = Instant::now();
    let stale = discovery.kinds().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "answered from the cache"
    );
    assert_eq!(stale.generation, first.generation);
    assert!(!stale.kinds.iter().any(|k| k.kind == "Widget"));

    let fresh = tokio::time::timeout(
        Duration::from_secs(30),
        discovery.updated_since(first.generation),
    )
    .await
    .expect("a background refresh");
    let widget = fresh.kinds.iter().find(|k| k.kind == "Widget").unwrap();
    assert_eq!(widget.api_version(), "example.com/v1");
    assert_eq!(widget.plural, "widgets");
}

#[tokio::test]
async fn an_unreachable_cluster_is_an_error_and_an_empty_environment_a_warning() {
    let api = KubeApi::new();
    environment(&api);
    let c = cluster(api).await;

    let empty = list_resource_group(
        &c.client,
        &c.discovery,
        &HeaderMap::new(),
        NS,
        &label_selector(PROJECT, "review-nothing"),
        &FetchOptions::default(),
    )
    .await
    .unwrap();
    let empty = group::assemble(empty, &Default::default());
    assert!(empty.resources.is_empty());
    assert_eq!(empty.warnings, [group::NO_RESOURCES_WARNING]);
    assert_eq!(empty.health.status, HealthStatus::Healthy);
    assert!(empty.errors.is_empty());

    let Cluster {
        served,
        client,
        discovery,
        ..
    } = c;
    served.shutdown().await;
    // Discovery is cached: the lists themselves find nobody.
    let options = FetchOptions {
        request_timeout: Duration::from_secs(5),
        ..FetchOptions::default()
    };
    let err = list_resource_group(
        &client,
        &discovery,
        &HeaderMap::new(),
        NS,
        &selector(),
        &options,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, FetchError::Unreachable(_)), "{err:?}");
    // Nothing cached: discovery fails.
    let cold = DiscoveryCache::new(client.clone(), Duration::from_secs(300));
    let err = list_resource_group(&client, &cold, &HeaderMap::new(), NS, &selector(), &options)
        .await
        .unwrap_err();
    match err {
        FetchError::Discovery(e) => assert_eq!(e.code, None, "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        list_resource_group(&client, &cold, &HeaderMap::new(), "", &selector(), &options).await,
        Err(FetchError::NoNamespace)
    ));
}
