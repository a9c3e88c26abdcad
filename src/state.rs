//! What every handler shares: cheap to clone, passed explicitly.

use std::sync::Arc;

use sqlx::PgPool;

use crate::auth::Keys;
use crate::config::file::{CorsSettings, KubernetesSettings};
use crate::config::Limits;
use crate::db::lease::Leases;
use crate::graphql::Schemas;
use crate::k8s::clusters::Clusters;
use crate::resources::health::Customizations;
use crate::telemetry::Metrics;

#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    /// GraphQL's connections (see `db::lease`).
    pub reads: Leases,
    pub keys: Arc<Keys>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub schemas: Schemas,
    pub clusters: Arc<Clusters>,
    pub cors: Arc<CorsSettings>,
    /// The user's health scripts, for the resource group.
    pub health: Arc<Customizations>,
}

impl AppState {
    pub fn new(db: PgPool, keys: Keys, limits: Limits) -> Self {
        AppState {
            reads: Leases::new(&db),
            db,
            keys: Arc::new(keys),
            metrics: Arc::new(Metrics::default()),
            limits,
            schemas: Schemas::new(),
            clusters: Arc::new(Clusters::fallback_only(&KubernetesSettings::default())),
            cors: Arc::default(),
            health: Arc::default(),
        }
    }

    /// With the configuration file's cluster connections and CORS origins.
    pub fn with_clusters(mut self, clusters: Clusters, cors: CorsSettings) -> Self {
        self.clusters = Arc::new(clusters);
        self.cors = Arc::new(cors);
        self
    }

    /// With the user's health scripts.
    pub fn with_health(mut self, health: Customizations) -> Self {
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
    db: PgPool,
    reads: Leases,
    keys: Arc<Keys>,
    metrics: Arc<Metrics>,
    limits: Limits,
    schemas: Schemas,
    clusters: Arc<Clusters>,
    health: Arc<Customizations>,
}
