//! What every handler shares: cheap to clone, passed explicitly.

use std::sync::Arc;

use crate::auth::Keys;
use crate::config::file::PerUserLimits;
use crate::config::file::{CorsSettings, KubernetesSettings};
use crate::config::Limits;
use crate::db::lease::Leases;
use crate::db::pool::Pool;
use crate::db::slots::Slots;
use crate::gitlab::Instance;
use crate::graphql::{Live, Origins, Schemas, SocketLimits};
use crate::http::client_address::TrustedProxies;
use crate::k8s::clusters::Clusters;
use crate::replicas::forward::Forward;
use crate::resources::health::Customizations;
use crate::telemetry::Metrics;
use crate::web::Site;

#[derive(Clone)]
pub struct AppState {
    /// Behind the health gate: while the database is known to be down, 503 at once.
    pub db: Pool,
    /// GraphQL's connections (see `db::lease`).
    pub reads: Leases,
    /// Fresh deployment creations' connections (`db::lease::WRITE_CONNECTIONS`).
    pub writes: Leases,
    pub keys: Arc<Keys>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub schemas: Schemas,
    pub clusters: Arc<Clusters>,
    pub cors: Arc<CorsSettings>,
    /// The GitLab instance, when the configuration names one (SPEC 12).
    pub gitlab: Option<Arc<Instance>>,
    /// The user's health scripts, for the resource group.
    pub health: Arc<Customizations>,
    /// The dashboard's address (`--public-url`: the one origin besides the CORS ones that may
    /// open a WebSocket) and session settings.
    pub site: Site,
    /// GraphQL subscriptions: their socket's bounds, the shared feeds, the notifications.
    pub live: Live,
    /// The reverse proxies whose `X-Forwarded-For` names the client (`trusted_proxies`).
    pub trusted_proxies: TrustedProxies,
    /// What each person holds open, counted across replicas (SPEC 13); `live` shares it.
    pub slots: Slots,
    /// Views of connections other replicas own go through them (SPEC 16); none by default.
    pub forward: Forward,
}

impl AppState {
    /// Call it inside the runtime (the pool's probes and the leases' sweep are tasks).
    pub fn new(db: impl Into<Pool>, keys: Keys, limits: Limits) -> Self {
        let db = db.into();
        let keys = keys.with_web_sessions(Pool::clone(&db));
        let metrics = Arc::new(Metrics::default());
        let slots = Slots::new(&db, PerUserLimits::default());
        AppState {
            reads: Leases::new(&db),
            writes: Leases::with_max(&db, crate::db::lease::WRITE_CONNECTIONS),
            live: Live::new(
                &db,
                Origins::default(),
                SocketLimits::default(),
                slots.clone(),
            ),
            slots,
            db,
            keys: Arc::new(keys),
            metrics: metrics.clone(),
            limits,
            schemas: Schemas::new(),
            clusters: Arc::new(Clusters::none(&KubernetesSettings::default(), metrics)),
            cors: Arc::default(),
            gitlab: None,
            health: Arc::default(),
            site: Site::default(),
            trusted_proxies: TrustedProxies::default(),
            forward: Forward::default(),
        }
    }

    /// With at most `max` connections for fresh deployment creations
    /// (`--database-write-connections`).
    pub fn with_write_connections(mut self, max: u32) -> Self {
        self.writes = Leases::with_max(&self.db, max);
        self
    }

    /// With views of connections other replicas own forwarded to them.
    pub fn with_forward(mut self, forward: Forward) -> Self {
        self.forward = forward;
        self
    }

    /// With the reverse proxies whose `X-Forwarded-For` is believed.
    pub fn with_trusted_proxies(mut self, trusted: TrustedProxies) -> Self {
        self.trusted_proxies = trusted;
        self
    }

    /// With the dashboard's public address and session lifetime; the address is also the
    /// origin the subscriptions' WebSockets accept.
    pub fn with_site(mut self, site: Site) -> Self {
        self.site = site;
        let origins = self.origins();
        self.live = self.live.with_origins(origins);
        self
    }

    /// With other bounds of what one person may hold open.
    pub fn with_per_user(mut self, limits: PerUserLimits) -> Self {
        self.slots = Slots::new(&self.db, limits);
        self.live = self.live.with_slots(self.slots.clone());
        self
    }

    /// With other bounds for the subscriptions' WebSockets.
    pub fn with_socket_limits(mut self, limits: SocketLimits) -> Self {
        self.live = self.live.with_limits(limits);
        self
    }

    fn origins(&self) -> Origins {
        Origins::new(Some(self.site.public_url()), &self.cors.allowed_origins)
    }

    /// With the GitLab instance the configuration file names.
    pub fn with_gitlab(mut self, gitlab: Instance) -> Self {
        self.gitlab = Some(Arc::new(gitlab));
        self
    }

    /// With the configuration file's cluster connections and CORS origins. The metrics the
    /// clusters count into become the state's, so that `/metrics` shows them.
    pub fn with_clusters(mut self, clusters: Clusters, cors: CorsSettings) -> Self {
        self.metrics = clusters.metrics.clone();
        self.clusters = Arc::new(clusters);
        self.cors = Arc::new(cors);
        let origins = self.origins();
        self.live = self.live.with_origins(origins);
        self
    }

    /// With the user's health scripts; `envlens_health_scripts_not_compiled` counts those that
    /// do not compile (each logged when loaded), whose kinds are `Unknown`. After
    /// [`AppState::with_clusters`], whose metrics become the state's.
    pub fn with_health(mut self, health: Customizations) -> Self {
        let not_compiled = health.not_compiled().count() as u64;
        self.metrics.register(
            "envlens_health_scripts_not_compiled",
            "Health scripts that do not compile: the resources of their kinds are Unknown",
            crate::telemetry::MetricKind::Gauge,
            move || not_compiled,
        );
        self.health = Arc::new(health);
        self
    }
}

/// What the extractors and handlers below take of the state, so that none of them names
/// [`AppState`] and the modules import only downwards.
macro_rules! sub_states {
    ($($field:ident: $ty:ty),* $(,)?) => {$(
        impl axum::extract::FromRef<AppState> for $ty {
            fn from_ref(state: &AppState) -> Self {
                state.$field.clone()
            }
        }
    )*};
}

sub_states! {
    db: Pool,
    reads: Leases,
    keys: Arc<Keys>,
    metrics: Arc<Metrics>,
    limits: Limits,
    schemas: Schemas,
    clusters: Arc<Clusters>,
    gitlab: Option<Arc<Instance>>,
    health: Arc<Customizations>,
    site: Site,
    live: Live,
    trusted_proxies: TrustedProxies,
    slots: Slots,
    forward: Forward,
}

impl axum::extract::FromRef<AppState> for crate::graphql::Engine {
    fn from_ref(state: &AppState) -> Self {
        crate::graphql::Engine {
            schemas: state.schemas.clone(),
            reads: state.reads.clone(),
            clusters: state.clusters.clone(),
            health: state.health.clone(),
            recorder: state.live.recorder(),
            forward: state.forward.clone(),
        }
    }
}
