//! What every handler shares: cheap to clone, passed explicitly.

use std::sync::Arc;

use sqlx::PgPool;

use crate::auth::Keys;
use crate::config::Limits;
use crate::graphql::EnvlensSchema;
use crate::telemetry::Metrics;

#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub keys: Arc<Keys>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    pub schema: EnvlensSchema,
}

impl AppState {
    pub fn new(db: PgPool, keys: Keys, limits: Limits) -> Self {
        AppState {
            db,
            keys: Arc::new(keys),
            metrics: Arc::new(Metrics::default()),
            limits,
            schema: crate::graphql::schema(),
        }
    }
}
