//! `envlens demo`: the dashboard over a sample GitLab and a sample cluster that changes, with
//! nothing but the binary and PostgreSQL's binaries. Its data folder is its own
//! (`.envlens-demo`), so a real installation's database never sees the sample.

mod broken;
pub mod cluster;
mod flux;
pub mod world;

use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::auth::secrets::Secrets;
use crate::auth::{mint_internal, Keys};
use crate::config::file::{AgentCluster, AgentRef, KubernetesSettings};
use crate::config::{DatabaseArgs, DemoArgs, SecretArgs};
use crate::db::Database;
use crate::k8s::clusters::Clusters;
use crate::state::AppState;

pub async fn run(
    args: DemoArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create {}", args.data_dir.display()))?;
    let database_args = DatabaseArgs {
        data_dir: args.data_dir.clone(),
        database_url: args.database_url.clone(),
        postgres_bin_dir: args.postgres_bin_dir.clone(),
        database_max_connections: 8,
        database_acquire_timeout: Duration::from_secs(3),
    };
    let no_files = SecretArgs {
        internal_secret_file: None,
        session_secret_file: None,
        webhook_token_file: None,
    };
    let secrets = Secrets::load(&no_files, &args.data_dir)?;
    let internal_key = secrets.internal.bytes().to_vec();
    let webhook_token = String::from_utf8_lossy(secrets.webhook_token.bytes())
        .trim()
        .to_owned();

    // The sample cluster, and a kubeconfig that leads the demo's agent to it.
    let demo_cluster = cluster::DemoCluster::default();
    let mut world = world::World::new(demo_cluster.clone());
    let cluster_addr = demo_cluster
        .serve()
        .await
        .context("cannot start the demo cluster")?;
    let kubeconfig = args.data_dir.join("demo-kubeconfig.yaml");
    std::fs::write(&kubeconfig, cluster::DemoCluster::kubeconfig(cluster_addr))?;
    let settings = KubernetesSettings {
        agents: vec![AgentCluster {
            agent: AgentRef::Path(world::AGENT.to_owned()),
            context: Some("demo".to_owned()),
            kubeconfig: Some(kubeconfig),
            in_cluster: false,
        }],
        ..KubernetesSettings::default()
    };
    let metrics = std::sync::Arc::new(crate::telemetry::Metrics::default());
    let clusters = Clusters::load(&settings, metrics).await?;

    let database = Database::open(&database_args).await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let public_url = format!("http://{addr}");
    let site = crate::web::Site::new(&public_url, crate::web::DEFAULT_SESSION_LIFETIME)?;
    let state = AppState::new(database.pool.clone(), Keys::new(secrets), args.limits)
        .with_clusters(clusters, Default::default())
        .with_site(site);
    let app = crate::app(state.clone());
    // The deployment history, as `serve` takes it: the sample's deployments are snapshotted as
    // they are sent, the live story's rollouts as they go.
    let history = crate::history::worker::Worker::new(
        state.db.pg().clone(),
        state.clusters.clone(),
        state.health.clone(),
        Default::default(),
    );
    let token = move || mint_internal(&internal_key, Duration::from_secs(60)).unwrap_or_default();
    world::seed(
        &app,
        &token,
        &webhook_token,
        Some(world::History {
            world: &world,
            worker: &history,
        }),
    )
    .await
    .context("cannot seed the sample GitLab")?;
    world.start();
    let snapshots = tokio::spawn(history.run());
    // Every environment's health kept current, as `serve` keeps it (SPEC 18).
    let keeper = tokio::spawn(
        crate::graphql::HealthKeeper::new(
            &state.db,
            state.clusters.clone(),
            state.health.clone(),
            &state.live,
            KubernetesSettings::default().health_budget_objects,
            Duration::from_secs(2),
        )
        .run(),
    );

    let story_app = app.clone();
    let story = tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(2));
        // The shop's production web app rolls every few minutes: GitLab's deployment of it
        // follows, its snapshot settles when the rollout ends.
        let production = &world::ENVIRONMENTS[0];
        let mut next = 0;
        loop {
            every.tick().await;
            world.step();
            if world.take_release() {
                let k = world::DEPLOYMENTS + next;
                // Ids past the sample's (`env.id * 100 + k`).
                let (id, iid) = (9_000_000 + next, world::iid(production, k));
                next += 1;
                let sent = world::deploy(
                    &story_app,
                    token(),
                    &webhook_token,
                    production,
                    (id, iid),
                    // Created when the job started; its success (4 minutes later, as the
                    // sample's) is now.
                    chrono::Utc::now() - chrono::Duration::minutes(4),
                    "success",
                )
                .await;
                if let Err(e) = sent {
                    tracing::warn!(error = %e, "demo: the rollout's deployment was not recorded");
                }
            }
        }
    });
    let say = |message: &str| crate::telemetry::announce(tracing::Level::INFO, message, &[]);
    say("envlens demo: a sample GitLab (groups acme, acme/platform, acme/web; users root, alice, bob, carol) and a sample cluster that changes by itself");
    let link = crate::web::sign_in::create_link(&state.db, &public_url, ALICE).await?;
    say(&format!("sign in as alice (maintainer of acme): open this within 5 minutes and press \"Continue as alice\": {link}"));
    say(&format!(
        "another link later: envlens token --data-dir {} --user alice --sign-in",
        args.data_dir.display()
    ));
    crate::telemetry::announce(
        tracing::Level::INFO,
        &format!("envlens listening on http://{addr}"),
        &[("address", &addr.to_string())],
    );
    crate::run(state, listener, shutdown, Duration::from_secs(5)).await?;
    story.abort();
    snapshots.abort();
    keeper.abort();
    database.close().await;
    Ok(())
}

/// alice, who maintains the group `acme` (`world::identity`).
const ALICE: i64 = 2;
