//! The internal listener (`--internal-listen`): what other replicas ask this one, signed with
//! the internal secret for replicas only ([`FromReplica`]). Kept off the public listener, so
//! that a NetworkPolicy can admit it from envlens' own pods alone.

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::routing::get;
use axum::{Json, Router};

use super::Ownership;
use crate::auth::{FromReplica, Keys};

#[derive(Clone)]
struct Internal {
    keys: Arc<Keys>,
    ownership: Ownership,
}

impl FromRef<Internal> for Arc<Keys> {
    fn from_ref(state: &Internal) -> Self {
        state.keys.clone()
    }
}

/// The internal listener's routes.
pub fn router(keys: Arc<Keys>, ownership: Ownership) -> Router {
    Router::new()
        .route("/-/replica", get(whoami))
        .with_state(Internal { keys, ownership })
}

/// This replica's id and the connections it holds now: what another replica checks before
/// it sends a view here.
async fn whoami(_: FromReplica, State(state): State<Internal>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "id": state.ownership.id,
        "holds": state.ownership.held(),
    }))
}
