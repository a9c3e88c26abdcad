//! The watch cache (SPEC 8.1) against the test Kubernetes API server: the group it answers
//! equals a fresh list's after creates, updates and deletes, dropped streams and expired
//! versions; a second view asks nothing of the cluster; RBAC decides what a user sees.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use envlens::k8s::clusters::ConnectionKind;
use envlens::k8s::discovery::DiscoveryCache;
use envlens::k8s::fetch::{list_resource_group, FetchOptions};
use envlens::k8s::watch::{WatchCache, WatchSettings};
use envlens::resources::group::{self, label_selector, ResourceGroup};
use envlens::resources::health::Customizations;
use envlens::telemetry::Metrics;
use serde_json::json;

use crate::support::environment::*;
use crate::support::kube_api::{KubeApi, Served};
use crate::support::reach::{both_ways, Reach, Reached};

struct Setup {
    api: KubeApi,
    _served: Served,
    _dir: tempfile::TempDir,
    _reached: Reached,
    client: kube::Client,
    discovery: DiscoveryCache,
    cache: WatchCache,
    metrics: Arc<Metrics>,
    /// The health scripts the shared groups are assembled with (none).
    custom: Arc<Customizations>,
}

/// The cache's settings in these tests: `max_objects`, the rest as `serve` has them (reviews
/// kept 5 s).
fn settings(max_objects: usize) -> WatchSettings {
    WatchSettings {
        idle: Duration::from_secs(600),
        max_objects,
        access_ttl: Duration::from_secs(5),
    }
}

async fn setup(reach: Reach, max_objects: usize) -> Setup {
    setup_with(reach, settings(max_objects)).await
}

/// The environment on the test cluster, and a watch cache over agent 7's clients as envlens
/// builds them for `reach` (its streams on a client of their own, as `serve` does); RBAC, once
/// enforced, judges the viewers, not envlens ([`Reached::admit_own_identity`]).
async fn setup_with(reach: Reach, settings: WatchSettings) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment(&api);
    let served = api.serve(dir.path()).await;
    let reached = Reached::new(reach, &served, &[("7", 7)], AGENTS_PROJECT).await;
    reached.admit_own_identity(&api);
    let config = envlens::config::file::Settings::parse(&reached.config("", "")).unwrap();
    let agent_client = || async {
        let cluster = crate::support::clusters(&config)
            .await
            .for_agent(7, "acme/agents", "prod")
            .await
            .expect("agent 7 is reached");
        let kind = match reach {
            Reach::Kubeconfig => ConnectionKind::Kubeconfig,
            Reach::Kas => ConnectionKind::Kas,
        };
        assert_eq!(cluster.kind, kind);
        cluster.client
    };
    let client = agent_client().await;
    let streams = agent_client().await;
    let metrics = Arc::new(Metrics::default());
    Setup {
        discovery: DiscoveryCache::new(client.clone(), Duration::from_secs(600)),
        cache: WatchCache::new(client.clone(), streams, settings, metrics.clone()),
        client,
        api,
        _served: served,
        _dir: dir,
        _reached: reached,
        metrics,
        custom: Arc::default(),
    }
}

fn options() -> FetchOptions {
    FetchOptions {
        request_timeout: Duration::from_secs(5),
        ..FetchOptions::default()
    }
}

impl Setup {
    async fn fresh(&self, headers: &HeaderMap) -> ResourceGroup {
        let listing = list_resource_group(
            &self.client,
            &self.discovery,
            headers,
            NS,
            &label_selector(PROJECT, SLUG),
            &options(),
        )
        .await
        .unwrap();
        group::assemble(listing, &Default::default())
    }

    /// The cached listing, assembled here.
    async fn cached(&self, headers: &HeaderMap) -> ResourceGroup {
        let listing = self
            .cache
            .list_resource_group(
                &self.discovery,
                headers,
                NS,
                &label_selector(PROJECT, SLUG),
                &options(),
            )
            .await
            .unwrap();
        group::assemble(listing, &Default::default())
    }

    /// The group as views get it: assembled by the cache, shared until the namespace changes.
    async fn shared(&self, headers: &HeaderMap) -> Arc<ResourceGroup> {
        self.cache
            .resource_group(
                &self.discovery,
                headers,
                NS,
                &label_selector(PROJECT, SLUG),
                &options(),
                &self.custom,
            )
            .await
            .unwrap()
    }

    /// The cache follows the cluster through its watches: it equals a fresh list once the
    /// events have arrived (within 5 s; in practice a few milliseconds). Both the shared group
    /// and the listing assembled here must equal it.
    async fn converges(&self, headers: &HeaderMap, what: &str) -> ResourceGroup {
        let fresh = self.fresh(headers).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let shared = self.shared(headers).await;
            let cached = self.cached(headers).await;
            if *shared == fresh && cached == fresh {
                return cached;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the cache never caught up\ncached: {:?}\nfresh: {:?}",
                names(&cached),
                names(&fresh)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Setup {
    /// The resources the cache has listed so far (`pods`, `deployments.apps`): its kinds.
    fn listed(&self) -> Vec<String> {
        self.api
            .request_counts()
            .into_keys()
            .filter(|(verb, _)| verb == "list")
            .map(|(_, resource)| resource)
            .collect()
    }

    /// Waits (up to 15 s, no view meanwhile) until each of `listed` has had its watch sent
    /// and as many watches are open.
    async fn every_kind_watched(&self, listed: &[String], what: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let unwatched: Vec<&String> = listed
                .iter()
                .filter(|r| self.api.request_count("watch", r) == 0)
                .collect();
            if unwatched.is_empty() && self.api.open_streams() >= listed.len() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: never watched: {unwatched:?}, {} open",
                self.api.open_streams()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn names(g: &ResourceGroup) -> Vec<String> {
    g.resources
        .iter()
        .map(|r| format!("{} {}", r.kind, r.name))
        .chain(
            g.errors
                .iter()
                .map(|e| format!("error {} {:?}", e.kind, e.code)),
        )
        .collect()
}

both_ways!(the_cached_group_equals_a_fresh_list_through_changes);
async fn the_cached_group_equals_a_fresh_list_through_changes(reach: Reach) {
    let s = setup(reach, 200_000).await;
    let none = HeaderMap::new();
    let first = s.converges(&none, "first view").await;
    assert!(first.resources.len() > 10, "{:?}", names(&first));
    assert!(s.cache.objects() > 0);

    s.api.insert(labelled_pod("added"));
    let g = s.converges(&none, "after a create").await;
    assert!(g.resources.iter().any(|r| r.name == "added"));

    let mut pod = s.api.get("pods", Some(NS), "added").unwrap();
    pod["status"]["phase"] = json!("Failed");
    s.api.insert(pod);
    s.converges(&none, "after an update").await;

    s.api.remove("pods", Some(NS), "added");
    let g = s.converges(&none, "after a delete").await;
    assert!(!g.resources.iter().any(|r| r.name == "added"));

    // A dropped stream resumes from its version; what changed meanwhile arrives.
    s.api.drop_watches();
    s.api.insert(labelled_pod("after-drop"));
    s.converges(&none, "after dropped streams").await;

    // An expired version (410 Gone) relists.
    let relists = s.metrics.watch_relists.get();
    s.api.drop_watches();
    s.api.insert(labelled_pod("after-compaction"));
    s.api.compact();
    let g = s.converges(&none, "after an expired version").await;
    assert!(g.resources.iter().any(|r| r.name == "after-compaction"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.metrics.watch_relists.get() == relists {
        assert!(Instant::now() < deadline, "no relist after 410");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Once packed (`PACK_AFTER` a list; an event's object at once), the cached objects still
    // equal a fresh list's, their texts included; most of them now take a fraction of it.
    tokio::time::sleep(envlens::k8s::watch::PACK_AFTER + Duration::from_millis(300)).await;
    let packed = s.converges(&none, "packed").await;
    let smaller = packed
        .resources
        .iter()
        .filter(|r| r.object.kept_text_bytes() * 2 < r.object.text().len())
        .count();
    assert!(
        smaller * 2 > packed.resources.len(),
        "{smaller} of {} packed",
        packed.resources.len()
    );
    let rendered = s.metrics.render(None);
    for family in [
        "envlens_watch_cache_objects",
        "envlens_watch_streams",
        "envlens_watch_relists_total",
        "envlens_watch_events_total",
    ] {
        assert!(rendered.contains(family), "{family} missing");
    }
}

/// A first view's lists leave their connections in the client's pool, where the next
/// namespace's first lists find them open (no connection opened for them), and no watch runs on
/// a connection that carried a list (its read buffer grew to the list's body: BENCHMARKS.md).
#[tokio::test]
async fn a_first_views_lists_connections_serve_the_next_lists_and_no_watch() {
    let s = setup(Reach::Kubeconfig, 200_000).await;
    let none = HeaderMap::new();
    // Discovery first, so that each first view below sends its lists (and its rules review)
    // all at once; every one of them held long enough to be in flight beside the others.
    s.discovery.kinds().await.unwrap();
    s.api.set_latency(Duration::from_millis(100));
    let (selector, options) = (label_selector(PROJECT, SLUG), options());
    let view = |namespace: &'static str| {
        s.cache
            .list_resource_group(&s.discovery, &none, namespace, &selector, &options)
    };
    view(NS).await.unwrap();
    let opened = s.api.accepted();
    view("second").await.unwrap();
    let requests = s.api.requests();
    let lists_of = |namespace: &str| -> Vec<std::net::SocketAddr> {
        requests
            .iter()
            .filter(|r| r.path.contains(&format!("/namespaces/{namespace}/")))
            .filter(|r| r.query_param("watch").is_none())
            .map(|r| r.peer.expect("served with its peer"))
            .collect()
    };
    let second = lists_of("second");
    assert!(second.len() > 10, "{} lists", second.len());
    let new: Vec<_> = second.iter().filter(|p| !opened.contains(p)).collect();
    assert!(
        new.is_empty(),
        "{} of the second namespace's {} lists opened a connection of their own",
        new.len(),
        second.len()
    );
    // Both namespaces' watches, once open: each on a connection no list went over.
    s.api.set_latency(Duration::ZERO);
    let listed = s.listed();
    s.every_kind_watched(&listed, "after both views").await;
    let requests = s.api.requests();
    let lists: Vec<_> = requests
        .iter()
        .filter(|r| r.query_param("watch").is_none())
        .map(|r| r.peer)
        .collect();
    let watches: Vec<_> = requests
        .iter()
        .filter(|r| r.query_param("watch").is_some())
        .map(|r| r.peer)
        .collect();
    assert!(watches.len() >= listed.len(), "{} watches", watches.len());
    assert!(
        watches.iter().all(|w| !lists.contains(w)),
        "a watch went over a list's connection"
    );
}

both_ways!(a_view_with_no_change_reuses_the_group_and_a_change_replaces_it);
/// A view with no change since the last one gets the last one's group (the same, not a copy);
/// a change, however small, makes the next view assemble anew.
async fn a_view_with_no_change_reuses_the_group_and_a_change_replaces_it(reach: Reach) {
    let s = setup(reach, 200_000).await;
    let none = HeaderMap::new();
    s.converges(&none, "first view").await;
    let first = s.shared(&none).await;
    let again = s.shared(&none).await;
    assert!(
        Arc::ptr_eq(&first, &again),
        "nothing changed: the same group"
    );

    // An Event about a resource of the group: the group is assembled again, with it.
    let dep = first
        .resources
        .iter()
        .find(|r| r.kind == "Deployment")
        .expect("a Deployment");
    s.api.insert(json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "ev-reuse", "namespace": NS},
        "involvedObject": {"uid": dep.uid},
        "type": "Warning", "reason": "Reused", "message": "m",
        "count": 1, "lastTimestamp": "2026-01-01T00:00:00Z"}));
    let after = s.converges(&none, "after an Event").await;
    let shared = s.shared(&none).await;
    assert!(!Arc::ptr_eq(&first, &shared), "a change replaces the group");
    assert_eq!(*shared, after);
    assert!(shared
        .resources
        .iter()
        .any(|r| r.events.iter().any(|e| e.reason == "Reused")));

    // A change to an object outside the group moves the namespace on too: the next view
    // assembles again, and equals the last.
    let before = s.shared(&none).await;
    let mut other = labelled_pod("elsewhere");
    other["metadata"]["labels"]["app.gitlab.com/environment_slug"] = json!("staging");
    s.api.insert(other);
    let deadline = Instant::now() + Duration::from_secs(5);
    let next = loop {
        let next = s.shared(&none).await;
        if !Arc::ptr_eq(&before, &next) {
            break next;
        }
        assert!(
            Instant::now() < deadline,
            "the change never reached the cache"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(*next, *before);
}

both_ways!(a_second_view_asks_nothing_of_the_cluster);
async fn a_second_view_asks_nothing_of_the_cluster(reach: Reach) {
    let s = setup(reach, 200_000).await;
    let none = HeaderMap::new();
    let first = s.cached(&none).await;
    // The first view's watches start once it is answered: once they are open, nothing but
    // them from here on.
    let listed = s.listed();
    s.every_kind_watched(&listed, "after the first view").await;
    s.api.reset_request_counts();
    let second = s.cached(&none).await;
    assert_eq!(first, second);
    let asked: Vec<_> = s
        .api
        .request_counts()
        .into_iter()
        .filter(|((verb, _), _)| verb != "watch")
        .collect();
    assert_eq!(asked, [], "a second view from the cache");
    // At most each kind's one watch, none for the view.
    let watches: u64 = s
        .api
        .request_counts()
        .into_iter()
        .filter(|((verb, _), _)| verb == "watch")
        .map(|(_, n)| n)
        .sum();
    assert!(
        watches <= listed.len() as u64,
        "no watch was opened again: {watches} for {} kinds",
        listed.len()
    );
}

/// How long the tests below hold a list: far longer than anything else in a view takes.
const HELD: Duration = Duration::from_secs(2);

both_ways!(a_first_views_watches_wait_for_its_end);
/// A first view lists every kind at once, and the watches that follow the lists would compete
/// with the lists still coming: no kind's watch is sent before the view is answered (here not
/// before its slowest list, ConfigMaps held [`HELD`], has come), and then every kind's is.
async fn a_first_views_watches_wait_for_its_end(reach: Reach) {
    let s = setup(reach, 200_000).await;
    let started = Instant::now();
    let arrivals: Arc<std::sync::Mutex<Vec<(String, String, Duration)>>> = Arc::default();
    let seen = arrivals.clone();
    s.api.fault(move |r| {
        let mut seen = seen.lock().unwrap();
        let listed = |v: &str, res: &str| v == "list" && res == "configmaps";
        let first = listed(&r.verb, &r.resource) && !seen.iter().any(|(v, res, _)| listed(v, res));
        seen.push((r.verb.clone(), r.resource.clone(), started.elapsed()));
        first.then_some(crate::support::kube_api::Fault::Delay(HELD))
    });
    let view = s.cached(&HeaderMap::new()).await;
    assert_eq!(view.errors, [], "every kind listed");
    let listed = s.listed();
    s.every_kind_watched(&listed, "after the first view").await;
    let seen = arrivals.lock().unwrap().clone();
    let held_from = seen
        .iter()
        .find(|(v, res, _)| v == "list" && res == "configmaps")
        .map(|(_, _, at)| *at)
        .expect("ConfigMaps listed");
    let early: Vec<&(String, String, Duration)> = seen
        .iter()
        .filter(|(v, _, at)| v == "watch" && *at < held_from + HELD)
        .collect();
    assert_eq!(
        early,
        Vec::<&(String, String, Duration)>::new(),
        "watches sent while the first view waited for ConfigMaps"
    );
}

both_ways!(a_viewers_access_reviews_go_beside_the_first_views_lists);
/// A first view as a user: the user's access reviews are sent while the lists are still
/// coming (here while ConfigMaps are held [`HELD`]), not after the slowest list; and what the
/// user may not list is still refused.
async fn a_viewers_access_reviews_go_beside_the_first_views_lists(reach: Reach) {
    let s = setup(reach, 200_000).await;
    s.api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "workloads", "namespace": NS},
        "rules": [{"apiGroups": ["", "apps"], "resources": ["pods", "deployments", "replicasets", "events"], "verbs": ["list", "watch"]}]}));
    s.api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "devs", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workloads"},
        "subjects": [{"kind": "Group", "name": "devs"}]}),
    );
    s.api.enforce_rbac();
    let started = Instant::now();
    let arrivals: Arc<std::sync::Mutex<Vec<(String, String, Duration)>>> = Arc::default();
    let seen = arrivals.clone();
    s.api.fault(move |r| {
        let mut seen = seen.lock().unwrap();
        let listed = |v: &str, res: &str| v == "list" && res == "configmaps";
        let first = listed(&r.verb, &r.resource) && !seen.iter().any(|(v, res, _)| listed(v, res));
        seen.push((r.verb.clone(), r.resource.clone(), started.elapsed()));
        first.then_some(crate::support::kube_api::Fault::Delay(HELD))
    });
    let dev = user("gitlab:user:dev", "devs");
    let view = s.cached(&dev).await;
    let kinds: std::collections::BTreeSet<&str> =
        view.resources.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["Deployment", "Pod", "ReplicaSet"].into_iter().collect()
    );
    assert!(view
        .errors
        .iter()
        .any(|e| e.kind == "ConfigMap" && e.code == Some(403)));
    let seen = arrivals.lock().unwrap().clone();
    let held_from = seen
        .iter()
        .find(|(v, res, _)| v == "list" && res == "configmaps")
        .map(|(_, _, at)| *at)
        .expect("ConfigMaps listed");
    let reviews: Vec<Duration> = seen
        .iter()
        .filter(|(v, res, _)| v == "create" && res == "subjectaccessreviews")
        .map(|(_, _, at)| *at)
        .collect();
    assert!(!reviews.is_empty(), "the user's access was reviewed");
    assert!(
        reviews.iter().all(|at| *at < held_from + HELD),
        "reviews waited for the lists: ConfigMaps held from {held_from:?}, reviews at {reviews:?}"
    );
}

both_ways!(a_first_view_given_up_or_failing_still_lets_every_kind_be_watched);
/// The viewer gives up while ConfigMaps are held, and Pods' first list fails: with no view
/// since, every kind is still listed and watched, Pods once its list is retried.
async fn a_first_view_given_up_or_failing_still_lets_every_kind_be_watched(reach: Reach) {
    use crate::support::kube_api::Fault;
    let s = setup(reach, 200_000).await;
    let firsts: Arc<std::sync::Mutex<std::collections::HashSet<String>>> = Arc::default();
    s.api.fault(move |r| {
        if r.verb != "list" || !firsts.lock().unwrap().insert(r.resource.clone()) {
            return None;
        }
        match r.resource.as_str() {
            "configmaps" => Some(Fault::Delay(HELD)),
            "pods" => Some(Fault::Status(500, "etcd is unhappy".into())),
            _ => None,
        }
    });
    let none = HeaderMap::new();
    // Boxed, so that dropping it drops the view midway.
    let mut view = Box::pin(s.cached(&none));
    let held = async {
        while s.api.request_count("list", "configmaps") == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        _ = &mut view => panic!("answered while ConfigMaps were held"),
        () = held => {}
    }
    drop(view);
    let deadline = Instant::now() + Duration::from_secs(15);
    while s.api.request_count("watch", "configmaps") == 0
        || s.api.request_count("watch", "pods") == 0
    {
        assert!(
            Instant::now() < deadline,
            "ConfigMaps or Pods never watched: {:?}",
            s.api.request_counts()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        s.api.request_count("list", "pods") >= 2,
        "Pods listed again"
    );
    let listed = s.listed();
    s.every_kind_watched(&listed, "after the view given up")
        .await;
    s.converges(&none, "a view after").await;
}

both_ways!(a_consistent_first_view_catches_up_through_its_watches);
/// A consistent read that is a namespace's first view finds the cache behind (a Deployment
/// written while the cache's own list was on its way back): its watches start while it waits,
/// and bring the Deployment, rather than a fresh list after the whole wait.
async fn a_consistent_first_view_catches_up_through_its_watches(reach: Reach) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = setup(reach, 200_000).await;
    let first = Arc::new(AtomicBool::new(true));
    let (asked, mut cache_list) = tokio::sync::watch::channel(false);
    s.api.fault(move |r| {
        // The cache's list of Deployments, answered as it comes and held back a second.
        (r.verb == "list" && r.resource == "deployments" && first.swap(false, Ordering::SeqCst))
            .then(|| {
                asked.send_replace(true);
                crate::support::kube_api::Fault::Delay(Duration::from_secs(1))
            })
    });
    let api = s.api.clone();
    let writer = tokio::spawn(async move {
        let _ = cache_list.wait_for(|a| *a).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        api.insert(deployment(NS, "late", "uid-late", SLUG));
    });
    let within = Duration::from_secs(10);
    let started = Instant::now();
    let group = s
        .cache
        .resource_group_consistent(
            &s.discovery,
            &HeaderMap::new(),
            NS,
            &label_selector(PROJECT, SLUG),
            &options(),
            &s.custom,
            within,
        )
        .await
        .unwrap();
    writer.await.unwrap();
    assert!(
        group.resources.iter().any(|r| r.name == "late"),
        "the late Deployment is in the read: {:?} {:?}",
        names(&group),
        s.api.request_counts()
    );
    assert_eq!(
        s.api.request_count("list", "deployments.apps"),
        2,
        "the cache's list and the read's metadata list, no fresh one"
    );
    assert!(started.elapsed() < within, "not the whole wait");
}

fn user(name: &'static str, group: &'static str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.append(
        HeaderName::from_static("impersonate-user"),
        HeaderValue::from_static(name),
    );
    headers.append(
        HeaderName::from_static("impersonate-group"),
        HeaderValue::from_static(group),
    );
    headers.append(
        HeaderName::from_static("impersonate-extra-agent.gitlab.com%2fid"),
        HeaderValue::from_static("7"),
    );
    headers
}

both_ways!(rbac_decides_which_kinds_a_user_sees);
async fn rbac_decides_which_kinds_a_user_sees(reach: Reach) {
    let s = setup(reach, 200_000).await;
    s.api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "workloads", "namespace": NS},
        "rules": [{"apiGroups": ["", "apps"], "resources": ["pods", "deployments", "replicasets", "events"], "verbs": ["list", "watch"]}]}));
    s.api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "devs", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workloads"},
        "subjects": [{"kind": "Group", "name": "devs"}]}),
    );
    s.api.enforce_rbac();
    let dev = user("gitlab:user:dev", "devs");
    let g = s.converges(&dev, "as a developer").await;
    let kinds: std::collections::BTreeSet<&str> =
        g.resources.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["Deployment", "Pod", "ReplicaSet"].into_iter().collect()
    );
    let refused = g
        .errors
        .iter()
        .find(|e| e.kind == "Service")
        .expect("Service refused");
    assert_eq!(refused.code, Some(403));
    assert_eq!(refused.message, format!("services is forbidden: User \"gitlab:user:dev\" cannot list resource \"services\" in API group \"\" in the namespace \"{NS}\""));

    // Someone with no binding sees nothing, each kind refused, though the developer's group
    // was assembled a moment ago from the same cached objects.
    let stranger = user("gitlab:user:eve", "others");
    let g = s.converges(&stranger, "as a stranger").await;
    assert!(g.resources.is_empty());
    assert!(g.errors.iter().all(|e| e.code == Some(403)));
    let (dev_group, eve_group) = (s.shared(&dev).await, s.shared(&stranger).await);
    assert!(!Arc::ptr_eq(&dev_group, &eve_group));
    assert!(eve_group.resources.is_empty());
    assert!(!dev_group.resources.is_empty());

    // The same rights, another name: a refusal names the user, so each has a group of their
    // own, and each is what a fresh list as them answers.
    let other_dev = user("gitlab:user:ann", "devs");
    let ann = s.converges(&other_dev, "as another developer").await;
    let ann_group = s.shared(&other_dev).await;
    assert_eq!(*ann_group, ann);
    assert!(!Arc::ptr_eq(&ann_group, &dev_group));
    assert!(ann
        .errors
        .iter()
        .all(|e| e.message.is_empty() || !e.message.contains("gitlab:user:dev\"")));
}

/// A Role that lets the group `devs` list and watch a few kinds, and only list Services.
fn grant_devs(api: &KubeApi) {
    api.insert(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "workloads", "namespace": NS},
        "rules": [{"apiGroups": ["", "apps"], "resources": ["pods", "deployments", "replicasets", "events"], "verbs": ["list", "watch"]},
                  {"apiGroups": [""], "resources": ["services"], "verbs": ["list"]}]}));
    api.insert(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "devs", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workloads"},
        "subjects": [{"kind": "Group", "name": "devs"}]}),
    );
    api.enforce_rbac();
}

/// `plural` or `plural.group` of every kind the cache watches (the discovered watchable kinds
/// and Events).
fn watched_resources(discovery: &DiscoveryCache) -> Vec<String> {
    let mut resources: Vec<String> = discovery
        .cached()
        .unwrap()
        .kinds
        .iter()
        .filter(|k| k.watchable)
        .map(|k| match k.group.as_str() {
            "" => k.plural.clone(),
            g => format!("{}.{g}", k.plural),
        })
        .collect();
    resources.push("events".into());
    resources.sort();
    resources.dedup();
    resources
}

/// The access reviews asked, as `(resource, verb) -> times`, all of `user` in the namespace.
fn reviews_of(api: &KubeApi, user: &str) -> std::collections::BTreeMap<(String, String), u64> {
    api.review_counts()
        .into_iter()
        .map(|(asked, n)| {
            assert_eq!((asked.user.as_str(), asked.namespace.as_str()), (user, NS));
            ((asked.resource, asked.verb), n)
        })
        .collect()
}

both_ways!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    concurrent_views_of_one_identity_share_their_access_reviews
);
/// Many views of one identity that miss the access cache together send one review per kind
/// and verb, `watch` only where `list` was allowed; once the period is over, the next views
/// ask again, once.
async fn concurrent_views_of_one_identity_share_their_access_reviews(reach: Reach) {
    const VIEWS: usize = 40;
    let ttl = Duration::from_secs(3);
    let s = setup_with(
        reach,
        WatchSettings {
            access_ttl: ttl,
            ..settings(200_000)
        },
    )
    .await;
    grant_devs(&s.api);
    // The watches list first (as the agent), so that the views below meet at the reviews.
    s.cached(&HeaderMap::new()).await;
    let dev = user("gitlab:user:dev", "devs");
    let may_watch = [
        "deployments.apps",
        "events",
        "pods",
        "replicasets.apps",
        "services",
    ];
    let expected = |times: u64| {
        watched_resources(&s.discovery)
            .into_iter()
            .flat_map(|resource| {
                let watch = may_watch.contains(&resource.as_str());
                [(resource.clone(), "list"), (resource, "watch")]
                    .into_iter()
                    .filter(move |(_, verb)| *verb == "list" || watch)
            })
            .map(|(resource, verb)| ((resource, verb.to_string()), times))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    s.api.reset_request_counts();
    for period in 1..=2 {
        let views = futures_util::future::join_all((0..VIEWS).map(|_| s.cached(&dev))).await;
        for g in &views {
            assert_eq!(g, &views[0], "every view sees the same");
        }
        let kinds: std::collections::BTreeSet<&str> =
            views[0].resources.iter().map(|r| r.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["Deployment", "Pod", "ReplicaSet"].into_iter().collect()
        );
        let services = views[0]
            .errors
            .iter()
            .find(|e| e.kind == "Service")
            .unwrap();
        assert_eq!(services.message, format!("services is forbidden: User \"gitlab:user:dev\" cannot watch resource \"services\" in API group \"\" in the namespace \"{NS}\""));
        let asked = reviews_of(&s.api, "gitlab:user:dev");
        assert_eq!(asked, expected(period), "period {period}: {VIEWS} views");
        let sent: u64 = asked.values().sum();
        assert_eq!(
            s.api
                .request_count("create", "subjectaccessreviews.authorization.k8s.io"),
            sent
        );
        // Within the period, nothing is asked again.
        s.cached(&dev).await;
        assert_eq!(reviews_of(&s.api, "gitlab:user:dev"), expected(period));
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    }
}

both_ways!(a_failed_access_review_is_not_reused);
/// A review that gets no decision (the API server fails) is that view's error, and the next
/// view asks again instead of reusing it.
async fn a_failed_access_review_is_not_reused(reach: Reach) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = setup(reach, 200_000).await;
    grant_devs(&s.api);
    s.cached(&HeaderMap::new()).await;
    let failing = Arc::new(AtomicBool::new(true));
    let on = failing.clone();
    s.api.fault(move |r| {
        (on.load(Ordering::SeqCst) && r.resource == "subjectaccessreviews")
            .then(|| crate::support::kube_api::Fault::Status(500, "the authorizer is down".into()))
    });
    let dev = user("gitlab:user:dev", "devs");
    let g = s.cached(&dev).await;
    assert!(g.resources.is_empty(), "{:?}", names(&g));
    let pods = g.errors.iter().find(|e| e.kind == "Pod").unwrap();
    assert_eq!(
        (pods.code, pods.message.as_str()),
        (Some(500), "the authorizer is down")
    );
    let failed = s
        .api
        .request_count("create", "subjectaccessreviews.authorization.k8s.io");
    assert_eq!(
        failed,
        watched_resources(&s.discovery).len() as u64,
        "one list review per kind"
    );

    failing.store(false, Ordering::SeqCst);
    let g = s.cached(&dev).await;
    assert!(
        g.resources.iter().any(|r| r.kind == "Pod"),
        "{:?}",
        names(&g)
    );
    assert!(
        s.api
            .request_count("create", "subjectaccessreviews.authorization.k8s.io")
            > failed,
        "asked again"
    );
}

both_ways!(past_the_bound_the_namespace_read_least_recently_goes);
async fn past_the_bound_the_namespace_read_least_recently_goes(reach: Reach) {
    let s = setup(reach, 1).await;
    let none = HeaderMap::new();
    s.cached(&none).await;
    assert_eq!(s.cache.namespaces(), [NS]);
    let other = s
        .cache
        .list_resource_group(&s.discovery, &none, "other", "a=b", &options())
        .await
        .unwrap();
    assert!(other.selected.is_empty());
    assert_eq!(
        s.cache.namespaces(),
        ["other"],
        "the namespace read before is dropped"
    );
}

/// One random change to the cluster, or to the cache's connection to it.
fn random_step(s: &Setup, rng: &mut rand::rngs::StdRng, step: usize) -> String {
    use rand::Rng;
    let apps = ["a", "b", "c"];
    let app = apps[rng.random_range(0..apps.len())];
    let hash = ["h1", "h2"][rng.random_range(0..2)];
    let pod = ["p1", "p2", "p3"][rng.random_range(0..3)];
    let slug = if rng.random_bool(0.8) {
        SLUG
    } else {
        "staging"
    };
    match rng.random_range(0..10) {
        0 => {
            s.api
                .insert(deployment(NS, app, &format!("uid-dep-{app}"), slug));
            format!("deployment {app} ({slug})")
        }
        1 => {
            replica_set(&s.api, NS, (app, &format!("uid-dep-{app}")), hash, &[pod]);
            format!("replica set {app}-{hash} with pod {pod}")
        }
        2 => {
            let gone = s.api.remove("deployments.apps", Some(NS), app).is_some();
            format!("delete deployment {app} ({gone})")
        }
        3 => {
            let name = format!("{app}-{hash}");
            let gone = s.api.remove("replicasets.apps", Some(NS), &name).is_some();
            format!("delete replica set {name} ({gone})")
        }
        4 => {
            let name = format!("{app}-{hash}-{pod}");
            let gone = s.api.remove("pods", Some(NS), &name).is_some();
            format!("delete pod {name} ({gone})")
        }
        5 => {
            let name = format!("{app}-{hash}-{pod}");
            match s.api.get("pods", Some(NS), &name) {
                Some(mut p) => {
                    let phase =
                        ["Running", "Pending", "Failed", "Succeeded"][rng.random_range(0..4)];
                    p["status"] = json!({"phase": phase});
                    s.api.insert(p);
                    format!("pod {name} {phase}")
                }
                None => format!("no pod {name} to update"),
            }
        }
        6 => {
            // A labelled object that enters or leaves the selection.
            let name = format!("loose-{pod}");
            let mut p = labelled_pod(&name);
            if rng.random_bool(0.5) {
                p["metadata"]["labels"]["app.gitlab.com/environment_slug"] = json!("staging");
            }
            s.api.insert(p);
            format!("labelled pod {name}")
        }
        7 => {
            s.api.insert(json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": format!("ev-{step}"), "namespace": NS},
                "involvedObject": {"uid": format!("uid-dep-{app}")},
                "type": "Normal", "reason": "Scaled", "message": format!("step {step}"),
                "count": 1, "lastTimestamp": format!("2026-01-01T00:{:02}:00Z", step % 60)}));
            format!("event about {app}")
        }
        8 => {
            s.api.drop_watches();
            "dropped watches".into()
        }
        _ => {
            s.api.compact();
            "compacted (expired versions)".into()
        }
    }
}

both_ways!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    any_sequence_of_changes_leaves_the_cache_equal_to_a_fresh_list
);
/// After any sequence of creates, updates, deletes, dropped streams and expired versions, the
/// cached group equals a fresh list. Seeds are fixed so a failure can be replayed;
/// `WATCH_CACHE_SEED` runs one more.
async fn any_sequence_of_changes_leaves_the_cache_equal_to_a_fresh_list(reach: Reach) {
    use rand::SeedableRng;
    let mut seeds = vec![1u64, 2, 3];
    if let Some(seed) = std::env::var("WATCH_CACHE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        seeds.push(seed);
    }
    for seed in seeds {
        let s = setup(reach, 200_000).await;
        let none = HeaderMap::new();
        s.converges(&none, &format!("seed {seed}: first view"))
            .await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut done = Vec::new();
        for step in 0..40 {
            done.push(random_step(&s, &mut rng, step));
            // Several changes may pile up between two views.
            if rand::Rng::random_bool(&mut rng, 0.5) {
                s.converges(&none, &format!("seed {seed} after {done:?}"))
                    .await;
            }
        }
        s.converges(&none, &format!("seed {seed} after {done:?}"))
            .await;
    }
}

both_ways!(a_kind_installed_later_is_watched_and_idle_namespaces_stop);
async fn a_kind_installed_later_is_watched_and_idle_namespaces_stop(reach: Reach) {
    let s = setup_with(
        reach,
        WatchSettings {
            idle: Duration::from_millis(300),
            ..settings(200_000)
        },
    )
    .await;
    let (api, cache, discovery) = (&s.api, &s.cache, &s.discovery);
    let (none, selector, opts) = (HeaderMap::new(), label_selector(PROJECT, SLUG), options());
    let read = || cache.list_resource_group(discovery, &none, NS, &selector, &opts);
    let before = read().await.unwrap();
    assert!(!before
        .selected
        .iter()
        .any(|o| o.view.get("kind").and_then(|k| k.as_str()) == Some("Widget")));

    api.add_kind("example.com", "v1", "Widget", "widgets", true);
    api.insert(json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "namespace": NS, "labels": {"app.gitlab.com/project_id": PROJECT.to_string(), "app.gitlab.com/environment_slug": SLUG}}}));
    discovery.refresh().await.unwrap();
    let after = read().await.unwrap();
    assert!(
        after
            .selected
            .iter()
            .any(|o| o.view.get("kind").and_then(|k| k.as_str()) == Some("Widget")),
        "the new kind is watched"
    );

    // The watches start once a view is answered: read until they are open (each read keeps
    // the namespace from being idle).
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.open_streams() == 0 {
        assert!(Instant::now() < deadline, "no watch opened");
        read().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // No reader for longer than `idle`: the namespace's watches stop.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cache.namespaces().is_empty() || api.open_streams() > 0 {
        assert!(
            Instant::now() < deadline,
            "idle watches still open: {}",
            api.open_streams()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cache.objects(), 0);
}

both_ways!(a_failing_watch_is_an_error_and_an_out_of_date_warning_until_it_recovers);
async fn a_failing_watch_is_an_error_and_an_out_of_date_warning_until_it_recovers(reach: Reach) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let s = setup(reach, 200_000).await;
    let none = HeaderMap::new();
    s.converges(&none, "first view").await;
    let failing = Arc::new(AtomicBool::new(true));
    let on = failing.clone();
    s.api.fault(move |r| {
        (on.load(Ordering::SeqCst) && r.verb == "watch" && r.resource == "pods")
            .then(|| crate::support::kube_api::Fault::Status(500, "etcd is unhappy".into()))
    });
    s.api.drop_watches();
    let deadline = Instant::now() + Duration::from_secs(5);
    let group = loop {
        let g = s.cached(&none).await;
        if !g.errors.is_empty() {
            break g;
        }
        assert!(
            Instant::now() < deadline,
            "the failing watch is never reported"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(group.errors.len(), 1, "{:?}", group.errors);
    assert_eq!(
        (group.errors[0].kind.as_str(), group.errors[0].code),
        ("Pod", Some(500))
    );
    assert_eq!(group.errors[0].message, "etcd is unhappy");
    assert!(
        group.warnings.iter().any(
            |w| w.starts_with("v1 Pod may be out of date: its watch has been failing since 20")
        ),
        "{:?}",
        group.warnings
    );
    assert!(
        group.resources.iter().any(|r| r.kind == "Pod"),
        "the last known Pods are still shown"
    );

    // Once the watch works again, the group is whole and current.
    failing.store(false, Ordering::SeqCst);
    s.api.insert(labelled_pod("after-recovery"));
    let g = s.converges(&none, "after recovery").await;
    assert!(
        g.errors.is_empty() && g.warnings.is_empty(),
        "{:?} {:?}",
        g.errors,
        g.warnings
    );
}

both_ways!(a_relist_the_cluster_cannot_answer_keeps_the_kind_and_a_refused_one_hides_it);
/// Pods' watch is refused (500), so the cache lists them again, and that list finds the cluster
/// unavailable (503, as an agent gone from GitLab's agent server): the Pods listed before are
/// still shown, out of date, with the 503 (they were emptied from every view). A relist that is
/// refused (403) hides them: the identity may no longer list them.
async fn a_relist_the_cluster_cannot_answer_keeps_the_kind_and_a_refused_one_hides_it(
    reach: Reach,
) {
    use crate::support::kube_api::Fault;
    use std::sync::atomic::{AtomicU16, Ordering};
    let s = setup(reach, 200_000).await;
    let none = HeaderMap::new();
    let before = s.converges(&none, "first view").await;
    let pods = |g: &ResourceGroup| g.resources.iter().filter(|r| r.kind == "Pod").count();
    assert!(pods(&before) > 0);
    let lists = s.api.request_count("list", "pods");
    let relist = Arc::new(AtomicU16::new(503));
    let code = relist.clone();
    s.api
        .fault(move |r| match (r.verb.as_str(), r.resource.as_str()) {
            ("watch", "pods") => Some(Fault::Status(500, "etcd is unhappy".into())),
            ("list", "pods") => Some(Fault::Status(
                code.load(Ordering::SeqCst),
                "the cluster cannot be reached".into(),
            )),
            _ => None,
        });
    s.api.drop_watches();
    /// The view once Pods' relist has failed with `code` (after `lists` lists of Pods).
    async fn failing(s: &Setup, lists: u64, code: u16) -> ResourceGroup {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let g = s.cached(&HeaderMap::new()).await;
            if s.api.request_count("list", "pods") > lists
                && g.errors
                    .iter()
                    .any(|e| e.kind == "Pod" && e.code == Some(code))
            {
                return g;
            }
            assert!(Instant::now() < deadline, "never failing: {:?}", g.errors);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let away = failing(&s, lists, 503).await;
    assert_eq!(
        pods(&away),
        pods(&before),
        "the Pods listed before are kept"
    );
    assert!(
        away.warnings
            .iter()
            .any(|w| w.starts_with("v1 Pod may be out of date")),
        "{:?}",
        away.warnings
    );

    relist.store(403, Ordering::SeqCst);
    let refused = failing(&s, lists, 403).await;
    assert_eq!(
        pods(&refused),
        0,
        "a refused relist shows nothing of the kind"
    );
}

both_ways!(a_refused_watch_then_an_unanswered_relist_shows_nothing_of_the_kind);
/// Access fails closed: when the cluster refuses a kind's watch (its RoleBinding removed, say)
/// and the relist then cannot be answered (the agent gone), the objects listed before are no
/// longer shown: the cluster's last word was a refusal.
async fn a_refused_watch_then_an_unanswered_relist_shows_nothing_of_the_kind(reach: Reach) {
    use crate::support::kube_api::Fault;
    let s = setup(reach, 200_000).await;
    let none = HeaderMap::new();
    let before = s.converges(&none, "first view").await;
    let pods = |g: &ResourceGroup| g.resources.iter().filter(|r| r.kind == "Pod").count();
    assert!(pods(&before) > 0);
    let lists = s.api.request_count("list", "pods");
    s.api
        .fault(move |r| match (r.verb.as_str(), r.resource.as_str()) {
            ("watch", "pods") => Some(Fault::Status(403, "pods is forbidden".into())),
            ("list", "pods") => Some(Fault::Status(503, "the cluster cannot be reached".into())),
            _ => None,
        });
    s.api.drop_watches();
    let deadline = Instant::now() + Duration::from_secs(15);
    let g = loop {
        let g = s.cached(&none).await;
        if s.api.request_count("list", "pods") > lists
            && g.errors
                .iter()
                .any(|e| e.kind == "Pod" && e.code == Some(503))
        {
            break g;
        }
        assert!(Instant::now() < deadline, "never failing: {:?}", g.errors);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(pods(&g), 0, "the Pods of a refused watch are kept");
}

both_ways!(a_kind_that_cannot_be_watched_is_listed_fresh_for_every_view);
async fn a_kind_that_cannot_be_watched_is_listed_fresh_for_every_view(reach: Reach) {
    let s = setup(reach, 200_000).await;
    s.api.add_kind_watchable(
        "metrics.example.com",
        "v1",
        "Sample",
        "samples",
        true,
        false,
    );
    let labels = json!({"app.gitlab.com/project_id": PROJECT.to_string(), "app.gitlab.com/environment_slug": SLUG});
    s.api.insert(
        json!({"apiVersion": "metrics.example.com/v1", "kind": "Sample",
        "metadata": {"name": "s1", "namespace": NS, "labels": labels}}),
    );
    let none = HeaderMap::new();
    let g = s.converges(&none, "first view").await;
    assert!(g.resources.iter().any(|r| r.kind == "Sample"));
    assert_eq!(
        s.api.request_count("watch", "samples.metrics.example.com"),
        0
    );
    s.api.reset_request_counts();
    s.api.insert(
        json!({"apiVersion": "metrics.example.com/v1", "kind": "Sample",
        "metadata": {"name": "s2", "namespace": NS, "labels": labels}}),
    );
    let g = s.cached(&none).await;
    assert_eq!(
        g.resources.iter().filter(|r| r.kind == "Sample").count(),
        2,
        "listed now, not from a cache"
    );
    let lists: Vec<_> = s
        .api
        .request_counts()
        .into_iter()
        .filter(|((verb, _), _)| verb == "list")
        .collect();
    assert_eq!(
        lists,
        [(
            (
                "list".to_string(),
                "samples.metrics.example.com".to_string()
            ),
            1
        )]
    );
}

both_ways!(with_no_room_for_objects_the_cache_is_off_and_every_view_lists);
async fn with_no_room_for_objects_the_cache_is_off_and_every_view_lists(reach: Reach) {
    let s = setup(reach, 0).await;
    let none = HeaderMap::new();
    assert!(!s.cache.enabled());
    let first = s.cached(&none).await;
    assert_eq!(first, s.fresh(&none).await);
    s.api.reset_request_counts();
    s.cached(&none).await;
    let counts = s.api.request_counts();
    assert_eq!(
        counts.get(&("watch".to_string(), "pods".to_string())),
        None,
        "{counts:?}"
    );
    assert_eq!(counts[&("list".to_string(), "pods".to_string())], 1);
    assert!(s.cache.namespaces().is_empty());
}
