//! The watch cache under a fence (SPEC 16, `k8s::watch::fence`), against the test Kubernetes
//! API server: a connection this replica does not hold is never watched (its views are listed
//! fresh and answer alike); one it holds is; a hold that runs out stops the watches by itself,
//! and a later hold starts them over.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use envlens::k8s::circuit::Circuit;
use envlens::k8s::discovery::DiscoveryCache;
use envlens::k8s::fetch::FetchOptions;
use envlens::k8s::watch::fence::Fence;
use envlens::k8s::watch::{WatchCache, WatchSettings};
use envlens::resources::group::label_selector;
use envlens::telemetry::Metrics;

use crate::support::environment::*;
use crate::support::kube_api::KubeApi;
use crate::support::reach::{Reach, Reached};

fn watches(api: &KubeApi) -> u64 {
    api.request_counts()
        .iter()
        .filter(|((verb, _), _)| verb == "watch")
        .map(|(_, n)| n)
        .sum()
}

async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_connection_is_watched_only_while_its_fence_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment(&api);
    api.set_bookmark_interval(Duration::from_millis(100));
    let served = api.serve(dir.path()).await;
    let reached = Reached::new(Reach::Kubeconfig, &served, &[("7", 7)], AGENTS_PROJECT).await;
    let config = envlens::config::file::Settings::parse(&reached.config("", "")).unwrap();
    let client = || async {
        crate::support::clusters(&config)
            .await
            .for_agent(7, "acme/agents", "prod")
            .await
            .unwrap()
            .client
    };
    let (client, streams) = (client().await, client().await);
    let fence = Fence::released();
    let settings = WatchSettings {
        idle: Duration::from_secs(600),
        max_objects: 100_000,
        access_ttl: Duration::from_secs(5),
    };
    let cache = WatchCache::held_by(
        client.clone(),
        streams,
        Circuit::default(),
        fence.clone(),
        settings,
        Arc::new(Metrics::default()),
    );
    let discovery = DiscoveryCache::new(client, Duration::from_secs(600));
    let options = FetchOptions {
        request_timeout: Duration::from_secs(5),
        ..FetchOptions::default()
    };
    let view = || async {
        cache
            .resource_group(
                &discovery,
                &HeaderMap::new(),
                NS,
                &label_selector(PROJECT, SLUG),
                &options,
                &Arc::default(),
            )
            .await
            .unwrap()
    };

    // Not held: answered, by fresh lists, and nothing watched.
    let unheld = view().await;
    assert!(!unheld.resources.is_empty());
    assert!(!cache.enabled());
    assert_eq!(watches(&api), 0);
    assert_eq!(api.open_streams(), 0);

    // Held: watched, and the same answer.
    fence.grant(1, tokio::time::Instant::now() + Duration::from_secs(3600));
    assert_eq!(*view().await, *unheld);
    eventually("its kinds are watched", || watches(&api) > 0).await;
    eventually("the held connection's watches run", || {
        api.open_streams() > 0
    })
    .await;

    // A hold that is not renewed runs out by itself: every watch stops.
    fence.grant(1, tokio::time::Instant::now() + Duration::from_millis(300));
    eventually("the watches stop when the hold runs out", || {
        api.open_streams() == 0
    })
    .await;
    assert!(!cache.enabled());
    api.reset_request_counts();
    assert_eq!(*view().await, *unheld);
    assert_eq!(watches(&api), 0, "nothing watched once the hold ran out");

    // Held again (a new term): the namespace starts over, watched and current.
    fence.grant(2, tokio::time::Instant::now() + Duration::from_secs(3600));
    assert_eq!(*view().await, *unheld);
    eventually("its kinds are watched", || watches(&api) > 0).await;
    eventually("watched again", || api.open_streams() > 0).await;
    fence.release();
    eventually("released: the watches stop", || api.open_streams() == 0).await;
}
