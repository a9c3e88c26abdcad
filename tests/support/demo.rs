//! envlens over the demo's sample GitLab and cluster (`envlens::demo`), served on a socket:
//! the browser tests' and the dashboard benchmark's fixture.

use std::time::Duration;

use envlens::config::Limits;
use envlens::demo::cluster::DemoCluster;
use envlens::demo::world::{self, World};
use envlens::state::AppState;

use super::*;

/// envlens over the demo's sample, served on a socket.
pub struct Demo {
    pub url: String,
    pub cluster: DemoCluster,
    pub state: AppState,
    pub app: TestApp,
    _dir: tempfile::TempDir,
}

impl Demo {
    pub async fn start() -> Demo {
        let cluster = DemoCluster::default();
        let mut world = World::new(cluster.clone());
        let addr = cluster.serve().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, DemoCluster::kubeconfig(addr)).unwrap();
        let settings = envlens::config::file::Settings::parse(&format!(
            "kubernetes:\n  kubeconfig: {}\n",
            kubeconfig.display()
        ))
        .unwrap();
        let clusters =
            envlens::k8s::clusters::Clusters::load(&settings.kubernetes, Default::default())
                .await
                .unwrap();
        let database = postgres::fresh_database().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let site = envlens::web::Site::new(&url, envlens::web::DEFAULT_SESSION_LIFETIME).unwrap();
        let state = AppState::new((*database).clone(), keys(), Limits::default())
            .with_clusters(clusters, Default::default())
            .with_site(site);
        let app = TestApp::owning(state.clone(), database);
        // The sample's deployments with their snapshots (SPEC 10), as `envlens demo` seeds them.
        let history = envlens::history::worker::Worker::new(
            state.db.pg().clone(),
            state.clusters.clone(),
            state.health.clone(),
            Default::default(),
        );
        world::seed(
            &app.router,
            internal_token,
            WEBHOOK_TOKEN,
            Some(world::History {
                world: &world,
                worker: &history,
            }),
        )
        .await
        .unwrap();
        world.start();
        let served = state.clone();
        tokio::spawn(async move {
            envlens::run(
                served,
                listener,
                std::future::pending(),
                Duration::from_secs(1),
            )
            .await
        });
        Demo {
            url,
            cluster,
            state,
            app,
            _dir: dir,
        }
    }

    /// A one-time sign-in link for alice (maintainer of `acme`).
    pub async fn sign_in_link(&self) -> String {
        envlens::web::sign_in::create_link(&self.state.db, &self.url, 2)
            .await
            .unwrap()
    }
}
