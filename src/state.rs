//! What every handler shares: cheap to clone, passed explicitly.

use std::sync::Arc;

use sqlx::PgPool;

use crate::auth::Keys;
use crate::clusters::Clusters;
use crate::config::Limits;
use crate::db::lease::Leases;
use crate::graphql::Schemas;
use crate::settings::{CorsSettings, KubernetesSettings};
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
        }
    }

    /// With the configuration file's cluster connections and CORS origins.
    pub fn with_clusters(mut self, clusters: Clusters, cors: CorsSettings) -> Self {
        self.clusters = Arc::new(clusters);
        self.cors = Arc::new(cors);
        self
    }
}
