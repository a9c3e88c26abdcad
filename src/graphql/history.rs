//! `Deployment.snapshot` and `Deployment.changes` (SPEC 10): what a deployment left in its
//! cluster, and what it changed there. Read with the same `user_access` check as the live
//! resource group, and showing only the kinds the viewer may list now ([`history_access`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_graphql::{Context, Enum, Json, SimpleObject, ID};
use serde_json::Value;

use super::history_access;
use super::resource_group::{self, HealthStatus, KubernetesResource, ResourceListError};
use super::types::{conn, Deployment, Gql, Result, Time};
use crate::auth::CurrentUser;
use crate::db::history::{self as db, JobState, SnapshotRow};
use crate::db::read::DeploymentRow;
use crate::error::Error;
use crate::gitlab::access::AccessAs;
use crate::history::diff;
use crate::history::snapshot::{parse_health, Entry};
use crate::history::store;
use crate::k8s::grants::Grant;
use crate::resources::listing::ListError;

/// A snapshot's row and job without its resources (a list of deployments' times to healthy).
pub const ROW_COST: usize = 5;

/// A snapshot's resources: its chunks, read in one statement and decoded in memory, as many
/// as the group had when it was taken. One read from the database, not a round of requests
/// to a cluster (`resource_group::COST`): priced as a page of 20 rows, and what each resource
/// asks for once, as any list without a page size.
pub const STORED_COST: usize = 20;

/// Comparing two snapshots reads both one's chunks and the manifests of what changed: three
/// such reads. A page of 20 deployments with their resources and changes stays well within
/// the limit; a page of 100 does not.
pub const COST: usize = 3 * STORED_COST;

#[derive(SimpleObject)]
pub struct ResourceSnapshot {
    /// When the deployment's success was seen and the first snapshot taken.
    taken_at: Time,
    /// When the rollout settled (the group left PROGRESSING, or `history.settle_timeout`
    /// passed); null while it settles.
    settled_at: Option<Time>,
    /// The group's health when settled, else when taken.
    health: HealthStatus,
    health_message: Option<String>,
    /// Seconds from `takenAt` to a HEALTHY group; null when it did not get there (yet).
    time_to_healthy: Option<f64>,
    /// The resources when settled, else when taken, with their health then; no events.
    #[graphql(complexity = "STORED_COST + child_complexity")]
    resources: Vec<KubernetesResource>,
    /// The kinds the snapshot could not read when it was taken (the cluster refused the
    /// agent, 403): their resources are not in it, and a change to them is not seen. Then
    /// the kinds the viewer may not list now (SPEC 13): their resources are not shown, and
    /// `health` is that of the resources shown.
    errors: Vec<ResourceListError>,
}

/// Where the taking of a deployment's snapshot stands.
#[derive(SimpleObject)]
pub struct SnapshotStatus {
    state: SnapshotState,
    /// Failed attempts at reading the cluster so far.
    attempts: i32,
    /// Why the last attempt failed, when it did.
    last_error: Option<String>,
    /// When the job looks at the cluster next; null once it has ended.
    next_attempt_at: Option<Time>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum SnapshotState {
    /// The first snapshot is due.
    Pending,
    /// The cluster could not be read; the first snapshot is tried again at `nextAttemptAt`.
    Retrying,
    /// Taken while the rollout was PROGRESSING: looked at again until it settles.
    Settling,
    /// Taken, and settled.
    Done,
    /// A newer deployment of the environment succeeded before this one's snapshot was taken.
    Superseded,
    /// Given up: the cluster could not be read in time, or the deployment lost its agent.
    Failed,
}

impl SnapshotState {
    /// A job's phase (`db::history`) and failed attempts, as the API names them.
    pub fn of(phase: &str, attempts: i32) -> Option<SnapshotState> {
        Some(match phase {
            "taken" if attempts > 0 => SnapshotState::Retrying,
            "taken" => SnapshotState::Pending,
            "settling" => SnapshotState::Settling,
            "done" => SnapshotState::Done,
            "superseded" => SnapshotState::Superseded,
            "failed" => SnapshotState::Failed,
            _ => return None,
        })
    }

    fn ended(self) -> bool {
        matches!(
            self,
            SnapshotState::Done | SnapshotState::Superseded | SnapshotState::Failed
        )
    }
}

/// The kinds a stored snapshot could not read (`deployment_snapshots.errors`).
fn stored_errors(errors: Option<&Value>) -> Vec<ResourceListError> {
    let Some(Value::Array(items)) = errors else {
        return Vec::new();
    };
    items
        .iter()
        .map(|e| {
            ResourceListError::from(ListError {
                api_version: e["apiVersion"].as_str().unwrap_or_default().to_owned(),
                kind: e["kind"].as_str().unwrap_or_default().to_owned(),
                code: e["code"].as_u64().and_then(|c| u16::try_from(c).ok()),
                message: e["message"].as_str().unwrap_or_default().to_owned(),
            })
        })
        .collect()
}

#[derive(SimpleObject)]
pub struct ResourceChanges {
    /// The deployment compared with: `since`, or the environment's previous successful
    /// deployment with a snapshot; null when there is none (every resource is then added).
    since: Option<Deployment>,
    added: Vec<KubernetesResource>,
    removed: Vec<KubernetesResource>,
    modified: Vec<ResourceChange>,
    /// Containers whose image changed in the modified resources.
    images: Vec<ImageChange>,
}

#[derive(SimpleObject)]
pub struct ResourceChange {
    /// The resource after the deployment.
    resource: KubernetesResource,
    /// RFC 6902, from before to after.
    patch: Json<Value>,
}

#[derive(SimpleObject)]
pub struct ImageChange {
    /// The resource after the deployment.
    resource: KubernetesResource,
    container: String,
    /// Null when the container was added.
    before: Option<String>,
    /// Null when the container was removed.
    after: Option<String>,
}

/// Who reads a snapshot, and their `user_access` grant on the agent that took it.
type Reader<'a> = (&'a CurrentUser, Arc<Grant>);

/// The deployment's snapshot row, once the user passed `user_access` on its agent; `None`
/// without an agent or a snapshot.
async fn readable<'a>(
    ctx: &Context<'a>,
    deployment: &DeploymentRow,
) -> Result<Option<(Reader<'a>, SnapshotRow)>> {
    let Some((agent, _)) = super::types::deployment_agent(ctx, deployment.id).await? else {
        return Ok(None);
    };
    let reader = resource_group::authorize(ctx, agent.id).await?;
    let row = db::snapshot(&mut **conn(ctx).await?, deployment.id)
        .await
        .gql()?;
    Ok(row.map(|row| (reader, row)))
}

/// The viewer's grant on the agent of deployment `id`, whose snapshot a comparison reads; the
/// FORBIDDEN error of SPEC 5.2 without one, and for a deployment without an agent (nobody's
/// `user_access` covers it).
async fn base_grant(ctx: &Context<'_>, id: i64) -> Result<Arc<Grant>> {
    match super::types::deployment_agent(ctx, id).await? {
        Some((agent, _)) => Ok(resource_group::authorize(ctx, agent.id).await?.1),
        None => Err(Error::Forbidden(resource_group::FORBIDDEN_MESSAGE.to_owned()).to_graphql()),
    }
}

pub async fn snapshot(
    ctx: &Context<'_>,
    deployment: &DeploymentRow,
) -> Result<Option<ResourceSnapshot>> {
    let Some(((viewer, grant), row)) = readable(ctx, deployment).await? else {
        return Ok(None);
    };
    // Resources only when asked for, manifests only when asked for (labels are read from
    // them): a list of deployments asks for their times to healthy alone. A viewer shown only
    // some kinds (SPEC 13) has the health and errors of those: they need the resources too.
    let look = ctx.look_ahead();
    let resources = look.field("resources");
    let wanted = resources.field("manifest").exists() || resources.field("labels").exists();
    let partial = grant.authorization.access_as == AccessAs::User
        && ["health", "healthMessage", "errors"]
            .iter()
            .any(|f| look.field(f).exists());
    let mut c = conn(ctx).await?;
    let entries = match resources.exists() || partial {
        true => store::entries(&mut c, &row).await.gql()?,
        false => Vec::new(),
    };
    drop(c);
    let sight = history_access::sight(ctx, viewer, &grant, &entries).await?;
    let entries = sight.filter(entries);
    let texts = match wanted {
        true => store::manifest_texts(&mut **conn(ctx).await?, row.environment_id, &entries)
            .await
            .gql()?,
        false => BTreeMap::new(),
    };
    let (health, message) = match &row.settled_health {
        Some(h) => (stored_health(h)?, row.settled_message.clone()),
        None => (stored_health(&row.health)?, row.health_message.clone()),
    };
    let (health, message) = match sight.hides_any() {
        true => {
            let shown = history_access::health_of(&entries);
            (shown.status.into(), shown.message)
        }
        false => (health, message),
    };
    let mut errors = stored_errors(row.errors.as_ref());
    errors.extend(sight.errors().cloned().map(ResourceListError::from));
    Ok(Some(ResourceSnapshot {
        taken_at: Time(row.taken_at),
        settled_at: row.settled_at.map(Time),
        health,
        health_message: message,
        time_to_healthy: row.time_to_healthy,
        resources: entries
            .iter()
            .map(|e| {
                KubernetesResource::from_snapshot(e, texts.get(&e.manifest).map(String::as_str))
            })
            .collect(),
        errors,
    }))
}

/// Where the snapshot job of `deployment` stands; `None` when there is none (no agent, or not
/// successful). Needs `user_access` like the snapshot: the last error names the cluster.
pub async fn status(
    ctx: &Context<'_>,
    deployment: &DeploymentRow,
) -> Result<Option<SnapshotStatus>> {
    let Some((agent, _)) = super::types::deployment_agent(ctx, deployment.id).await? else {
        return Ok(None);
    };
    resource_group::authorize(ctx, agent.id).await?;
    let job = db::job(&mut **conn(ctx).await?, deployment.id)
        .await
        .gql()?;
    Ok(job.and_then(
        |JobState {
             phase,
             attempts,
             last_error,
             due_at,
         }| {
            let state = SnapshotState::of(&phase, attempts)?;
            Some(SnapshotStatus {
                state,
                attempts,
                last_error,
                next_attempt_at: (!state.ended()).then_some(Time(due_at)),
            })
        },
    ))
}

fn stored_health(s: &str) -> Result<HealthStatus> {
    parse_health(s)
        .map(Into::into)
        .ok_or_else(|| Error::Internal(anyhow::anyhow!("stored health `{s}`")).to_graphql())
}

fn resource(entry: &Entry, manifests: &BTreeMap<String, Value>) -> KubernetesResource {
    let text = manifests.get(&entry.manifest).map(Value::to_string);
    KubernetesResource::from_snapshot(entry, text.as_deref())
}

/// `gid://gitlab/Deployment/<id>` (or the bare id) to the id.
fn deployment_id(id: &ID) -> Result<i64> {
    id.trim_start_matches("gid://gitlab/Deployment/")
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0)
        .ok_or_else(|| {
            Error::invalid("since", format!("`{}` is not a deployment id", id.as_str()))
                .to_graphql()
        })
}

/// What changed from the base's snapshot to the deployment's, of the kinds the viewer may see
/// in each (SPEC 13): the base's agent needs the viewer's `user_access` too, checked before
/// anything about `since` is answered.
pub async fn changes(
    ctx: &Context<'_>,
    deployment: &DeploymentRow,
    since: Option<ID>,
) -> Result<Option<ResourceChanges>> {
    let since = since.as_ref().map(deployment_id).transpose()?;
    let Some(((viewer, grant), _)) = readable(ctx, deployment).await? else {
        return Ok(None);
    };
    let named = match since {
        Some(id) if id != deployment.id => Some((id, base_grant(ctx, id).await?)),
        _ => None,
    };
    let mut c = conn(ctx).await?;
    let Some(pair) = store::pair(&mut c, deployment.id, since).await.gql()? else {
        return Ok(None);
    };
    drop(c);
    let base = pair.before.as_ref().map(|b| b.deployment_id);
    let base_grant = match (base, named) {
        (Some(id), _) if id == deployment.id => Some(grant.clone()),
        (Some(id), Some((named, grant))) if id == named => Some(grant),
        (Some(id), _) => Some(base_grant(ctx, id).await?),
        (None, _) => None,
    };
    let new = history_access::sight(ctx, viewer, &grant, &pair.new)
        .await?
        .filter(pair.new);
    let old = match &base_grant {
        Some(base_grant) => history_access::sight(ctx, viewer, base_grant, &pair.old)
            .await?
            .filter(pair.old),
        None => pair.old,
    };
    let mut c = conn(ctx).await?;
    let manifests = &store::changed_manifests(&mut c, pair.after.environment_id, &old, &new)
        .await
        .gql()?;
    let base = match base {
        Some(id) => db::deployment(&mut c, id).await.gql()?,
        None => None,
    };
    drop(c);
    let report = diff::report(&old, &new, manifests);
    Ok(Some(ResourceChanges {
        since: base.map(Deployment),
        added: report
            .added
            .iter()
            .map(|e| resource(e, manifests))
            .collect(),
        removed: report
            .removed
            .iter()
            .map(|e| resource(e, manifests))
            .collect(),
        modified: report
            .modified
            .into_iter()
            .map(|(e, patch)| ResourceChange {
                resource: resource(e, manifests),
                patch: Json(Value::Array(patch)),
            })
            .collect(),
        images: report
            .images
            .into_iter()
            .map(|(e, change)| ImageChange {
                resource: resource(e, manifests),
                container: change.container,
                before: change.before,
                after: change.after,
            })
            .collect(),
    }))
}
