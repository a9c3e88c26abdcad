//! What the pages read: GraphQL documents run in process as the viewer
//! ([`crate::graphql::execute_as`]), so that every page applies exactly the API's reading
//! rules and `user_access` checks, and the shapes their answers are read into.

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::auth::Session;
use crate::error::Error;
use crate::graphql::Engine;

/// A page of a group's environments, worst kept health first (SPEC 18), and on the first page
/// the counts by health.
pub const GROUP_ENVIRONMENTS: &str = r#"query($path: ID!, $tier: DeploymentTier, $search: String, $after: String, $counts: Boolean!) {
  currentUser { username }
  group(fullPath: $path) {
    environmentHealthCounts(tier: $tier) @include(if: $counts) { status count }
    environments(tier: $tier, search: $search, sort: HEALTH_DESC, first: 100, after: $after) {
      pageInfo { hasNextPage endCursor }
      nodes { id name tier state project { fullPath } kubernetesNamespace clusterAgent { name project { fullPath } }
        health { status message since }
        deployments(first: 1) { nodes { iid status ref sha createdAt finishedAt } } } } } }"#;

pub const ENVIRONMENT: &str = r#"query($project: ID!, $name: String!) {
  currentUser { username }
  project(fullPath: $project) { fullPath
    environment(name: $name) { id name tier state
      clusterAgent { id name project { fullPath } connection { kind status message checkedAt } }
      deployments(first: 20) { nodes { iid status ref sha createdAt finishedAt agent { name kubernetesNamespace }
        pullBased { source revision gitlabReason }
        snapshot { settledAt health timeToHealthy } snapshotStatus { state } } }
      resourceGroup { namespace namespaces labelSelector health healthMessage warnings
        sources { kind apiVersion namespace name fluxSyncStatus }
        errors { apiVersion kind code message }
        resources { uid apiVersion kind namespace name createdAt health { status message }
          fluxSyncStatus events { type reason message count lastSeen } }
        causes { path message sentence logLines }
        edges { from to type } }
      events(first: 50) { nodes { id type reason message count lastTime resourceUid source } }
      fluxResourcePath addedNamespaces argoApplication
      fluxActions(first: 10) { nodes { kind user { username } createdAt resource answerCode } } } } }"#;

/// A Flux action of the environment page's buttons (SPEC 15), by the field it asks.
macro_rules! flux_action {
    ($field:literal) => {
        concat!(
            "mutation($input: FluxActionInput!) { result: ",
            $field,
            "(input: $input) { errors action { answerCode } } }"
        )
    };
}

/// The buttons' actions (`action` of the form) and their documents.
pub const FLUX_ACTIONS: [(&str, &str); 3] = [
    ("reconcile", flux_action!("fluxReconcile")),
    ("suspend", flux_action!("fluxSuspend")),
    ("resume", flux_action!("fluxResume")),
];

pub const RESOURCE: &str = r#"query($project: ID!, $name: String!) {
  currentUser { username }
  project(fullPath: $project) { fullPath
    environment(name: $name) { id name clusterAgent { id name project { fullPath } }
      resourceGroup { namespace resources { uid apiVersion kind namespace name createdAt
        health { status message } events { type reason message count lastSeen } manifest } } } } }"#;

/// A deployment's page (SPEC 10): its changes against the previous snapshot, its time to
/// healthy, its health when settled and the environment's now.
pub const DEPLOYMENT: &str = r#"query($project: ID!, $iid: ID!) {
  currentUser { username }
  project(fullPath: $project) { fullPath
    deployment(iid: $iid) { iid status ref sha createdAt finishedAt
      agent { name kubernetesNamespace }
      environment { name resourceGroup { health healthMessage causes { path message sentence } }
        lastDeployment(status: SUCCESS) { iid } }
      snapshotStatus { state attempts lastError nextAttemptAt }
      snapshot { takenAt settledAt health healthMessage timeToHealthy
        errors { apiVersion kind code message } }
      changes { since { iid status ref sha createdAt finishedAt }
        added { uid apiVersion kind namespace name health { status message } }
        removed { uid apiVersion kind namespace name health { status message } }
        modified { resource { uid apiVersion kind namespace name health { status message } } patch }
        images { resource { uid apiVersion kind namespace name } container before after } } } } }"#;

/// Runs `document` as the session's user and reads its data into `T`. An error at a field is
/// returned beside the data (a resource group the user may not see leaves the rest of the
/// page); `Err` when there is no data at all.
pub async fn run<T: DeserializeOwned>(
    engine: &Engine,
    session: Session,
    document: &str,
    variables: serde_json::Value,
) -> Result<(T, Vec<FieldError>), Error> {
    let request = async_graphql::Request::new(document)
        .variables(async_graphql::Variables::from_json(variables));
    let response = crate::graphql::execute_as(engine, session, request).await?;
    let errors: Vec<FieldError> = response
        .errors
        .iter()
        .map(|e| FieldError {
            path: e
                .path
                .iter()
                .map(|s| match s {
                    async_graphql::PathSegment::Field(f) => f.clone(),
                    async_graphql::PathSegment::Index(i) => i.to_string(),
                })
                .collect(),
            code: e
                .extensions
                .as_ref()
                .and_then(|x| x.get("code"))
                .and_then(|c| match c {
                    async_graphql::Value::String(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default(),
            message: e.message.clone(),
        })
        .collect();
    if let Some(e) = errors.iter().find(|e| e.path.is_empty()) {
        return Err(match e.code.as_str() {
            "SERVICE_UNAVAILABLE" => Error::Unavailable(sqlx::Error::PoolTimedOut),
            _ => Error::BadRequest(e.message.clone()),
        });
    }
    let data = response
        .data
        .into_json()
        .map_err(|e| Error::Internal(e.into()))?;
    let data = serde_json::from_value(data).map_err(|e| Error::Internal(e.into()))?;
    Ok((data, errors))
}

/// A GraphQL error at a field.
#[derive(Debug, Clone)]
pub struct FieldError {
    pub path: Vec<String>,
    pub code: String,
    pub message: String,
}

impl FieldError {
    pub fn under(&self, field: &str) -> bool {
        self.path.iter().any(|p| p == field)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CurrentUser {
    pub username: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Nodes<T> {
    pub nodes: Vec<T>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupData {
    pub current_user: Option<CurrentUser>,
    pub group: Option<Group>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    pub environments: EnvironmentPage,
    /// Asked on the first page only.
    #[serde(default)]
    pub environment_health_counts: Option<Vec<HealthCount>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct HealthCount {
    pub status: String,
    pub count: i64,
}

/// An environment's kept health (SPEC 18).
#[derive(Debug, Clone, Deserialize)]
pub struct KeptHealth {
    pub status: String,
    pub message: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentPage {
    pub page_info: PageInfo,
    pub nodes: Vec<EnvironmentSummary>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PageInfo {
    pub has_next_page: bool,
    pub end_cursor: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentSummary {
    pub name: String,
    pub tier: Option<String>,
    pub state: String,
    pub project: ProjectRef,
    pub kubernetes_namespace: Option<String>,
    pub cluster_agent: Option<AgentRef>,
    /// `null` where the viewer may not see it, or it was never read.
    #[serde(default)]
    pub health: Option<KeptHealth>,
    pub deployments: Nodes<Deployment>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectRef {
    pub full_path: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRef {
    #[serde(default)]
    pub id: Option<String>,
    pub name: String,
    #[serde(default)]
    pub project: Option<ProjectRef>,
    /// How envlens reaches the agent's cluster (the environment page asks for it).
    #[serde(default)]
    pub connection: Option<AgentConnection>,
}

/// `ClusterAgent.connection` (SPEC 14).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentConnection {
    pub kind: String,
    pub status: String,
    pub message: Option<String>,
    pub checked_at: Option<String>,
}

impl AgentRef {
    /// The number in the agent's global id.
    pub fn number(&self) -> Option<i64> {
        self.id.as_deref()?.rsplit('/').next()?.parse().ok()
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Deployment {
    pub iid: Option<String>,
    pub status: Option<String>,
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    pub sha: Option<String>,
    pub created_at: Option<String>,
    pub finished_at: Option<String>,
    #[serde(default)]
    pub agent: Option<DeploymentAgent>,
    #[serde(default)]
    pub snapshot: Option<SnapshotSummary>,
    #[serde(default)]
    pub snapshot_status: Option<SnapshotStatus>,
    /// Set when Flux made it (SPEC 15).
    #[serde(default)]
    pub pull_based: Option<PullBased>,
}

/// A deployment Flux made: the object that applied it, the revision, and why GitLab was not
/// told, if it was not.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullBased {
    pub source: String,
    pub revision: String,
    pub gitlab_reason: Option<String>,
}

/// What a list of deployments shows of a snapshot: its time to healthy.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSummary {
    pub settled_at: Option<String>,
    pub health: String,
    pub time_to_healthy: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    pub state: String,
    #[serde(default)]
    pub attempts: i32,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub next_attempt_at: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentData {
    pub current_user: Option<CurrentUser>,
    pub project: Option<DeploymentProject>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentProject {
    pub full_path: String,
    pub deployment: Option<DeploymentDetail>,
}

/// A deployment with its snapshot and changes, as the deployment page reads it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentDetail {
    pub iid: Option<String>,
    pub status: Option<String>,
    #[serde(rename = "ref")]
    pub git_ref: Option<String>,
    pub sha: Option<String>,
    pub created_at: Option<String>,
    pub finished_at: Option<String>,
    pub agent: Option<DeploymentAgent>,
    pub environment: Option<DeploymentEnvironment>,
    pub snapshot_status: Option<SnapshotStatus>,
    pub snapshot: Option<Snapshot>,
    pub changes: Option<Changes>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentEnvironment {
    pub name: String,
    pub resource_group: Option<GroupHealth>,
    /// The deployment the live resources are of.
    #[serde(default)]
    pub last_deployment: Option<DeploymentIid>,
}

#[derive(Debug, Deserialize)]
pub struct DeploymentIid {
    pub iid: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub taken_at: String,
    pub settled_at: Option<String>,
    pub health: String,
    pub health_message: Option<String>,
    pub time_to_healthy: Option<f64>,
    #[serde(default)]
    pub errors: Vec<ListError>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Changes {
    pub since: Option<Deployment>,
    pub added: Vec<Resource>,
    pub removed: Vec<Resource>,
    pub modified: Vec<Modified>,
    pub images: Vec<ImageChange>,
}

#[derive(Debug, Deserialize)]
pub struct Modified {
    pub resource: Resource,
    /// RFC 6902 operations.
    pub patch: Vec<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct ImageChange {
    pub resource: Resource,
    pub container: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentAgent {
    pub name: String,
    pub kubernetes_namespace: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupHealth {
    pub health: String,
    pub health_message: Option<String>,
    #[serde(default)]
    pub causes: Vec<Cause>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentData {
    pub current_user: Option<CurrentUser>,
    pub project: Option<Project>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Project {
    pub full_path: String,
    pub environment: Option<Environment>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Environment {
    pub id: String,
    pub name: String,
    #[serde(default)]
    pub tier: Option<String>,
    #[serde(default)]
    pub state: String,
    pub cluster_agent: Option<AgentRef>,
    #[serde(default)]
    pub deployments: Option<Nodes<Deployment>>,
    pub resource_group: Option<ResourceGroup>,
    /// The timeline (SPEC 17), newest first.
    #[serde(default)]
    pub events: Option<Nodes<TimelineEvent>>,
    #[serde(default)]
    pub flux_resource_path: Option<String>,
    /// Namespaces Maintainers added (SPEC 15).
    #[serde(default)]
    pub added_namespaces: Vec<String>,
    #[serde(default)]
    pub argo_application: Option<String>,
    /// The Flux actions' audit, newest first; `None` when the viewer may not read it.
    #[serde(default)]
    pub flux_actions: Option<Nodes<FluxActionRecord>>,
}

/// One audited Flux action (SPEC 15).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FluxActionRecord {
    pub kind: String,
    pub user: CurrentUser,
    pub created_at: String,
    pub resource: String,
    pub answer_code: i32,
}

/// One entry of an environment's timeline.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEvent {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub reason: String,
    pub message: String,
    pub count: i64,
    pub last_time: String,
    pub resource_uid: Option<String>,
    /// `KUBERNETES` or `ENVLENS`.
    pub source: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceGroup {
    pub namespace: String,
    /// Every namespace the group spans (SPEC 15).
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Its GitOps sources, with their sync status.
    #[serde(default)]
    pub sources: Vec<GroupSource>,
    #[serde(default)]
    pub label_selector: String,
    #[serde(default)]
    pub health: Option<String>,
    #[serde(default)]
    pub health_message: Option<String>,
    #[serde(default)]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub errors: Vec<ListError>,
    pub resources: Vec<Resource>,
    #[serde(default)]
    pub edges: Vec<Edge>,
    #[serde(default)]
    pub causes: Vec<Cause>,
}

/// A GitOps source of a group (SPEC 15).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupSource {
    pub kind: String,
    pub api_version: String,
    pub namespace: Option<String>,
    pub name: String,
    pub flux_sync_status: Option<String>,
}

/// Why the group is not healthy, from one root (SPEC 17).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cause {
    /// Uids, from the root to the resource that explains it.
    pub path: Vec<String>,
    pub message: String,
    pub sentence: String,
    #[serde(default)]
    pub log_lines: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListError {
    pub api_version: String,
    pub kind: String,
    pub code: Option<i32>,
    pub message: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resource {
    pub uid: String,
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub created_at: Option<String>,
    pub health: Option<Health>,
    /// GitLab's sync status of a Flux object.
    #[serde(default)]
    pub flux_sync_status: Option<String>,
    #[serde(default)]
    pub events: Vec<Event>,
    #[serde(default)]
    pub manifest: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Health {
    pub status: String,
    pub message: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    #[serde(rename = "type")]
    pub event_type: String,
    pub reason: String,
    pub message: String,
    pub count: i64,
    pub last_seen: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Edge {
    pub from: String,
    pub to: String,
    #[serde(rename = "type")]
    pub kind: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::web::pages::{ENVIRONMENTS_UPDATED, RESOURCE_GROUP_UPDATED};

    /// Every document the pages send, subscriptions included, is within the depth and
    /// complexity limits of `POST /api/graphql`; the figures print with `--nocapture`.
    #[tokio::test]
    async fn the_pages_queries_are_within_the_limits() {
        let mut largest = (0, "");
        for (name, text) in [
            ("GROUP_ENVIRONMENTS", GROUP_ENVIRONMENTS),
            ("ENVIRONMENT", ENVIRONMENT),
            ("FLUX_RECONCILE", FLUX_ACTIONS[0].1),
            ("FLUX_SUSPEND", FLUX_ACTIONS[1].1),
            ("FLUX_RESUME", FLUX_ACTIONS[2].1),
            ("RESOURCE", RESOURCE),
            ("DEPLOYMENT", DEPLOYMENT),
            ("ENVIRONMENTS_UPDATED", ENVIRONMENTS_UPDATED),
            ("RESOURCE_GROUP_UPDATED", RESOURCE_GROUP_UPDATED),
        ] {
            let figures = crate::graphql::figures(text, serde_json::json!({}))
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            eprintln!(
                "{name}: complexity {} of {}, depth {} of {}",
                figures.complexity,
                crate::graphql::MAX_COMPLEXITY,
                figures.depth,
                crate::graphql::MAX_DEPTH
            );
            assert_eq!(figures.refusal(), None, "{name}: {figures:?}");
            largest = largest.max((figures.complexity, name));
        }
        eprintln!("largest: {} at {}", largest.1, largest.0);
    }
}
