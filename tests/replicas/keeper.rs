//! The health keeper among replicas that share the clusters (SPEC 16, SPEC 18): a replica
//! keeps the health of the environments whose connection it holds, and no other. The others'
//! owners keep theirs; a replica that keeps an environment it does not hold would list its
//! group from the cluster (its watch cache does not watch without the hold) and write a
//! health beside the owner's.

use std::time::{Duration, Instant};

use envlens::config::file::Settings;
use envlens::config::Limits;
use envlens::k8s::clusters::Clusters;
use envlens::k8s::watch::fence::Fences;
use envlens::state::AppState;

use crate::support::environment::{self, AGENTS_PROJECT};
use crate::support::kube_api::{KubeApi, Served};
use crate::support::reach::{Reach, Reached};
use crate::support::*;

const ROUND: Duration = Duration::from_millis(100);

async fn kept(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM environment_health")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// One replica's state over the test server's environment, its connection fenced (not held
/// until the test grants it), the support's GitLab seeded.
struct Fenced {
    _dir: tempfile::TempDir,
    _served: Served,
    api: KubeApi,
    fences: Fences,
    state: AppState,
    app: TestApp,
}

async fn fenced() -> Fenced {
    let _dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment::environment(&api);
    let _served = api.serve(_dir.path()).await;
    let reached = Reached::new(Reach::Kubeconfig, &_served, &[("7", 7)], AGENTS_PROJECT).await;
    let settings = Settings::parse(&reached.config("", "")).unwrap();
    let fences = Fences::shared();
    let clusters = Clusters::load_fenced(&settings.kubernetes, Default::default(), fences.clone())
        .await
        .unwrap();
    let database = postgres::fresh_database().await;
    let state = AppState::new((*database).clone(), keys(), Limits::default())
        .with_clusters(clusters, settings.cors);
    let app = TestApp::owning(state.clone(), database);
    environment::seed(&app).await;
    Fenced {
        _dir,
        _served,
        api,
        fences,
        state,
        app,
    }
}

/// The health keeper as `serve` starts it, with rounds `round` apart.
fn keeper(state: &AppState, round: Duration) -> envlens::graphql::HealthKeeper {
    envlens::graphql::HealthKeeper::new(
        &state.db,
        state.clusters.clone(),
        state.health.clone(),
        &state.live,
        100_000,
        round,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_keeps_the_health_of_the_connections_it_holds_only() {
    let Fenced {
        _dir,
        _served,
        api,
        fences,
        state,
        app,
    } = fenced().await;
    api.reset_request_counts();
    let keeper = tokio::spawn(keeper(&state, ROUND).run());

    // Not held here: several rounds keep nothing, and ask nothing of the cluster.
    tokio::time::sleep(ROUND * 15).await;
    assert_eq!(kept(&app).await, 0, "a health kept without the hold");
    assert_eq!(
        api.resource_requests(),
        0,
        "the cluster was asked without the hold: {:?}",
        api.request_counts()
    );

    // Held: its environments' healths are kept.
    let cluster = state
        .clusters
        .for_agent(7, "acme/agents", "prod")
        .await
        .unwrap();
    fences
        .fence(&cluster.source)
        .grant(1, tokio::time::Instant::now() + Duration::from_secs(3600));
    let deadline = Instant::now() + Duration::from_secs(60);
    while kept(&app).await == 0 {
        assert!(Instant::now() < deadline, "nothing kept with the hold");
        tokio::time::sleep(ROUND).await;
    }
    keeper.abort();
}

/// The kept groups' watches open at the test server once they stop moving (more than none).
async fn watched(api: &KubeApi, what: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    while api.open_streams() == 0 {
        assert!(Instant::now() < deadline, "{what}: nothing watched");
        tokio::time::sleep(ROUND).await;
    }
    super::ownership::settled(api).await
}

/// Waits until nothing is watched, and the recorder has read its group without the hold
/// (fresh lists, as the cache does not answer then): the requests stop moving for 1.5 s.
async fn unwatched(api: &KubeApi, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while api.open_streams() > 0 {
        assert!(Instant::now() < deadline, "{what}: still watched");
        tokio::time::sleep(ROUND).await;
    }
    let (mut last, mut since) = (api.resource_requests(), Instant::now());
    while since.elapsed() < Duration::from_millis(1500) {
        assert!(
            Instant::now() < deadline,
            "{what}: the requests never settle"
        );
        tokio::time::sleep(ROUND).await;
        let now = api.resource_requests();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    assert_eq!(api.open_streams(), 0, "{what}: watched without the hold");
}

/// A hold lost and regained between two of the keeper's rounds (a lease that ran out while
/// the database was slow and was renewed at the next step; a connection handed away and
/// back): the keeper, which sees it held at both rounds, keeps its recorder running, and that
/// recorder's group is watched again as soon as the hold is back, not when something else
/// reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_lost_and_regained_within_a_keeper_round_is_watched_again() {
    let Fenced {
        _dir,
        _served,
        api,
        fences,
        state,
        app: _app,
    } = fenced().await;
    let cluster = state
        .clusters
        .for_agent(7, "acme/agents", "prod")
        .await
        .unwrap();
    let fence = fences.fence(&cluster.source);
    let held = || tokio::time::Instant::now() + Duration::from_secs(3600);
    fence.grant(1, held());
    // One round, then none within the test: every loss below falls within that round.
    let keeper = tokio::spawn(keeper(&state, Duration::from_secs(3600)).run());
    let open = watched(&api, "held").await;

    // The lease not renewed in time: the hold runs out, the watches stop; renewed at the
    // next step (the same generation, a new term): watched again, all of them.
    fence.grant(1, tokio::time::Instant::now() + Duration::from_millis(200));
    unwatched(&api, "the hold ran out").await;
    fence.grant(1, held());
    assert_eq!(
        watched(&api, "held again after running out").await,
        open,
        "the kept group's kinds are not all watched again"
    );

    // Handed to another replica and back: the same.
    fence.release();
    unwatched(&api, "handed over").await;
    fence.grant(2, held());
    assert_eq!(
        watched(&api, "handed back").await,
        open,
        "the kept group's kinds are not all watched again"
    );
    keeper.abort();
}
