//! The internal listener (`--internal-listen`): what other replicas ask this one, signed with
//! the internal secret for replicas only ([`FromReplica`]). Kept off the public listener, so
//! that a NetworkPolicy can admit it from envlens' own pods alone.

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::header::{CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::forward::{
    GroupAsk, CHANGE, CHANGES_PATH, KEEPALIVE, PROXY_PATH, RESOURCE_GROUP_PATH, WATCH_PATH,
};
use super::memo::Encodings;
use super::{wire, Ownership};
use crate::auth::{Credential, FromReplica, Keys};
use crate::db::pool::Pool;
use crate::error::Error;
use crate::gitlab::Instance;
use crate::k8s::clusters::Clusters;
use crate::k8s::fetch::{FetchError, FetchOptions};
use crate::k8s::grants::AccessType;
use crate::resources::group::ResourceGroup;
use crate::resources::health::Customizations;
use crate::resources::namespaces;

/// The most namespaces one forwarded view spans (a deployment's and those Maintainers added).
const MAX_NAMESPACES: usize = 100;

/// What the internal listener reads: this replica's part in the coordination and what a view
/// needs (the viewer's authentication, their `user_access`, the clusters, the health rules).
#[derive(Clone)]
pub struct Internal {
    pub keys: Arc<Keys>,
    pub ownership: Ownership,
    pub db: Pool,
    pub gitlab: Option<Arc<Instance>>,
    pub clusters: Arc<Clusters>,
    pub health: Arc<Customizations>,
    /// The groups last answered, encoded ([`super::memo`]).
    pub encodings: Arc<Encodings>,
}

impl FromRef<Internal> for Arc<Keys> {
    fn from_ref(state: &Internal) -> Self {
        state.keys.clone()
    }
}

/// The internal listener's routes.
pub fn router(internal: Internal) -> Router {
    Router::new()
        .route("/-/replica", get(whoami))
        .route(RESOURCE_GROUP_PATH, post(resource_group))
        .route(CHANGES_PATH, post(changes))
        .route(WATCH_PATH, post(super::watches::watch))
        .route(PROXY_PATH, post(super::watches::proxied))
        .with_state(internal)
}

/// This replica's id and the connections it holds now: what another replica checks before
/// it sends a view here.
async fn whoami(State(state): State<Internal>, _: FromReplica) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "id": state.ownership.id,
        "holds": state.ownership.held(),
    }))
}

/// A view another replica forwards (`super::forward`): the viewer authenticated afresh from
/// the credential it carries, their `user_access` decided here, the group read from this
/// replica's watch cache as them. 401 without a credential this replica accepts, 403 without
/// `user_access`, 502 when the cluster cannot be read; else the group ([`wire`]), or `304`
/// when it is the one the asking replica has (`If-None-Match`, [`super::memo`]).
async fn resource_group(
    State(state): State<Internal>,
    asked: HeaderMap,
    from: FromReplica,
) -> Result<Response, Error> {
    let (ask, viewer) = authorized(&state, from).await?;
    let (session, grant, cluster) = match viewer {
        Viewer::Granted {
            session,
            grant,
            cluster,
        } => (session, grant, cluster),
        Viewer::NoConnection(group) => return group_answer(&group),
    };
    let first = &ask.namespaces[0];
    let headers = grant.impersonation(AccessType::from(session.via));
    let options = FetchOptions {
        request_timeout: state.clusters.response_timeout,
        agent: Some(ask.agent),
        ..FetchOptions::default()
    };
    let groups = ask.namespaces.iter().map(|namespace| {
        cluster.watch.resource_group(
            &cluster.discovery,
            &headers,
            namespace,
            &ask.selector,
            &options,
            &state.health,
        )
    });
    let group = match async_graphql::futures_util::future::try_join_all(groups).await {
        Ok(groups) => namespaces::merge(groups),
        Err(FetchError::Discovery(e)) if e.code == Some(503) => {
            return group_answer(&ResourceGroup::unreadable(
                first,
                &ask.selector,
                503,
                e.message,
            ))
        }
        Err(e) => return Err(Error::BadGateway(e.to_string())),
    };
    if let Some(open) = cluster.condition.circuit().open() {
        return group_answer(&group.while_away(open.since, &open.said()));
    }
    // The watch cache's memo, encoded once while it lasts; not sent to who has it.
    let encoded = state
        .encodings
        .encode(&ask, &group)
        .map_err(|e| Error::Internal(e.into()))?;
    let has = asked.get(IF_NONE_MATCH).and_then(|v| v.to_str().ok());
    if has == Some(encoded.tag.as_str()) {
        return Ok((StatusCode::NOT_MODIFIED, [(ETAG, encoded.tag)]).into_response());
    }
    Ok((
        [
            (CONTENT_TYPE, "application/json".to_owned()),
            (ETAG, encoded.tag),
        ],
        encoded.bytes,
    )
        .into_response())
}

/// Who asks, once authenticated and granted; or the group of an agent without a connection.
enum Viewer {
    Granted {
        session: crate::auth::Session,
        grant: Arc<crate::k8s::grants::Grant>,
        cluster: crate::k8s::clusters::Cluster,
    },
    NoConnection(ResourceGroup),
}

/// The viewer the request carries, authenticated afresh, and their `user_access` to the
/// agent asked, decided here; the ask itself, checked.
async fn authorized(state: &Internal, from: FromReplica) -> Result<(GroupAsk, Viewer), Error> {
    let credential = from
        .credential
        .as_deref()
        .and_then(Credential::decode)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| Error::Unauthorized("the request carries no viewer's credential".into()))?;
    let session = credential
        .authenticate(&state.keys, state.gitlab.as_deref())
        .await?;
    let ask: GroupAsk = serde_json::from_slice(&from.body)
        .map_err(|e| Error::BadRequest(format!("not a forwarded view: {e}")))?;
    if ask.namespaces.is_empty() || ask.namespaces.len() > MAX_NAMESPACES {
        return Err(Error::invalid(
            "namespaces",
            format!("from 1 to {MAX_NAMESPACES} namespaces"),
        ));
    }
    let grant = {
        let mut conn = state.db.acquire().await?;
        state
            .clusters
            .grants
            .authorize(&mut *conn, ask.agent, session.user_id)
            .await?
    };
    // The view's own FORBIDDEN (GitLab's words) is the forwarding replica's to say.
    let grant = grant.ok_or_else(|| {
        Error::Forbidden(format!(
            "the agent's user_access does not allow this viewer (agent {})",
            ask.agent
        ))
    })?;
    crate::telemetry::record_agent(ask.agent, None);
    let connected = state
        .clusters
        .for_agent(
            grant.agent.id,
            &grant.agent.project_full_path,
            &grant.agent.name,
        )
        .await;
    let viewer = match connected {
        Ok(cluster) => Viewer::Granted {
            session,
            grant,
            cluster,
        },
        Err(none) => Viewer::NoConnection(ResourceGroup::unreadable(
            &ask.namespaces[0],
            &ask.selector,
            503,
            none.to_string(),
        )),
    };
    Ok((ask, viewer))
}

/// The changes of the namespaces a forwarded subscription follows (`super::forward`), as
/// they happen here: a [`CHANGE`] line for each, a [`KEEPALIVE`] line every
/// [`KEEPALIVE_EVERY`] so that the other replica notices an owner gone silent. It ends when
/// this replica's watches of a namespace end (handed over, the lease lost, gone idle): the
/// other replica then asks whoever owns the connection by then.
async fn changes(State(state): State<Internal>, from: FromReplica) -> Result<Response, Error> {
    let (ask, viewer) = authorized(&state, from).await?;
    let Viewer::Granted { cluster, .. } = viewer else {
        return Err(Error::NoConnection(format!(
            "No cluster connection is configured for agent {}",
            ask.agent
        )));
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<&'static [u8]>(4);
    for namespace in &ask.namespaces {
        let mut changes = cluster.watch.changes(namespace);
        let tx = tx.clone();
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                let change = tokio::select! {
                    // The other replica went away: the namespace is no longer listened to.
                    _ = tx.closed() => return,
                    change = changes.recv() => change,
                };
                match change {
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        // A full channel already says "changed".
                        if let Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) =
                            tx.try_send(CHANGE)
                        {
                            return;
                        }
                    }
                    Err(RecvError::Closed) => return,
                }
            }
        });
    }
    drop(tx);
    let keepalive = tokio::time::interval_at(
        tokio::time::Instant::now() + super::forward::KEEPALIVE_EVERY,
        super::forward::KEEPALIVE_EVERY,
    );
    let watch = cluster.watch.clone();
    let lines = async_graphql::futures_util::stream::unfold(
        (rx, keepalive),
        move |(mut rx, mut keepalive)| {
            let watch = watch.clone();
            async move {
                let line = tokio::select! {
                    line = rx.recv() => line?,
                    // Handed over, or the lease lost: the other replica asks the new owner.
                    _ = keepalive.tick() => if watch.held() { KEEPALIVE } else { return None },
                };
                Some((
                    Ok::<_, std::convert::Infallible>(axum::body::Bytes::from_static(line)),
                    (rx, keepalive),
                ))
            }
        },
    );
    Ok(axum::body::Body::from_stream(lines).into_response())
}

fn group_answer(group: &ResourceGroup) -> Result<Response, Error> {
    let bytes = wire::encode(group).map_err(|e| Error::Internal(e.into()))?;
    Ok(([(CONTENT_TYPE, "application/json")], bytes).into_response())
}
