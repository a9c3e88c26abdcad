//! envlens over the demo's sample GitLab and cluster (`envlens::demo`), served on a socket:
//! the browser tests' and the dashboard benchmark's fixture.

use std::sync::Arc;
use std::time::Duration;

use envlens::config::Limits;
use envlens::demo::cluster::DemoCluster;
use envlens::demo::world::{self, World};
use envlens::state::AppState;

use super::browser::Page;
use super::*;

/// A TCP relay to `target` whose connections can all be cut at once, or refused.
pub struct Relay {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    addr: std::net::SocketAddr,
    cut: tokio::sync::watch::Sender<u64>,
    refusing: Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    async fn start(target: std::net::SocketAddr) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let url = format!("http://{addr}");
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let cuts = cut.clone();
        let refusing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refuses = refusing.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if refuses.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let mut cut = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Relay {
            url,
            addr,
            cut,
            refusing,
        }
    }

    /// Drops every connection open now (both ends); later ones go through.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }

    /// Cuts every connection and closes each new one at once (`true`), as a cluster gone
    /// away does; or lets them through again (`false`).
    pub fn refuse(&self, refusing: bool) {
        self.refusing
            .store(refusing, std::sync::atomic::Ordering::SeqCst);
        if refusing {
            self.cut();
        }
    }
}

/// envlens over the demo's sample, served on a socket.
pub struct Demo {
    pub url: String,
    pub cluster: DemoCluster,
    /// Between envlens and the demo cluster: the cluster's kubeconfig leads here.
    pub cluster_relay: Relay,
    pub state: AppState,
    pub app: TestApp,
    /// In front of envlens, when started [`Demo::behind_relay`].
    pub relay: Option<Relay>,
    _dir: tempfile::TempDir,
}

impl Demo {
    pub async fn start() -> Demo {
        Demo::serve(false).await
    }

    /// With a [`Relay`] in front: the browser reaches envlens (its public URL) through it, and
    /// the test can cut every connection, as a network that drops them does.
    pub async fn behind_relay() -> Demo {
        Demo::serve(true).await
    }

    async fn serve(relayed: bool) -> Demo {
        let cluster = DemoCluster::default();
        let mut world = World::new(cluster.clone());
        let cluster_relay = Relay::start(cluster.serve().await.unwrap()).await;
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, DemoCluster::kubeconfig(cluster_relay.addr)).unwrap();
        let settings = envlens::config::file::Settings::parse(&format!(
            "kubernetes:\n  kubeconfig: {}\n  agents:\n  - agent: \"{}\"\n    context: demo\n",
            kubeconfig.display(),
            envlens::demo::world::AGENT,
        ))
        .unwrap();
        let clusters =
            envlens::k8s::clusters::Clusters::load(&settings.kubernetes, Default::default())
                .await
                .unwrap();
        let database = postgres::fresh_database().await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = match relayed {
            true => Some(Relay::start(listener.local_addr().unwrap()).await),
            false => None,
        };
        let url = match &relay {
            Some(relay) => relay.url.clone(),
            None => format!("http://{}", listener.local_addr().unwrap()),
        };
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
            cluster_relay,
            state,
            app,
            relay,
            _dir: dir,
        }
    }

    /// Signs the browser's `page` in as alice with a one-time link, as a person does: the
    /// link's page, then its "Continue as alice" button. Ends on the groups.
    pub async fn sign_in(&self, page: &Page<'_>) {
        page.goto(&self.sign_in_link().await).await;
        page.wait_for(
            "[...document.querySelectorAll('form button')].some(b => b.innerText === 'Continue as alice')",
            Duration::from_secs(20),
        )
        .await
        .unwrap_or_else(|e| panic!("the link's page: {e}"));
        page.eval("document.querySelector('form button').click()")
            .await;
        page.wait_for(
            "location.pathname === '/' && document.readyState === 'complete' && !!document.querySelector('h1')",
            Duration::from_secs(20),
        )
        .await
        .unwrap_or_else(|e| panic!("signing in: {e}"));
    }

    /// A one-time sign-in link for alice (maintainer of `acme`).
    pub async fn sign_in_link(&self) -> String {
        envlens::web::sign_in::create_link(&self.state.db, &self.url, 2)
            .await
            .unwrap()
    }
}
