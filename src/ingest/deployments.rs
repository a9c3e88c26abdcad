//! Deployments: the creation call when GitLab creates a deployment job (SPEC 4.3), which
//! records the agent and namespace it deploys to when `ci_access` allows it, and the
//! deployment hooks that carry its status (SPEC 4.4).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json as JsonResponse;
use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::auth::Internal;
use crate::db::deployments::{
    self as db, AgentDeployment, Authorization, Creation, Environment, NewDeployment,
};
use crate::db::identity;
use crate::error::{Error, Result};
use crate::gitlab::access::{self, CiAuthorizations, Job};
use crate::gitlab::deployment_status::{DeploymentStatus, StatusReport};
use crate::gitlab::hook_scope::Footprint;
use crate::gitlab::validate::{self, DashboardKeys};
use crate::http::extract::Json;
use crate::state::AppState;

/// Kubernetes' namespace when nothing names one.
const DEFAULT_NAMESPACE: &str = "default";

#[derive(Debug, Deserialize)]
pub struct CreationBody {
    deployment: DeploymentIn,
    project: ProjectIn,
    environment: EnvironmentIn,
    job: JobIn,
    #[serde(default)]
    kubernetes: Option<KubernetesIn>,
}

#[derive(Debug, Deserialize)]
struct DeploymentIn {
    id: i64,
    iid: Option<i64>,
    status: String,
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    sha: Option<String>,
    tag: Option<bool>,
    created_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Deserialize)]
struct ProjectIn {
    id: i64,
    full_path: String,
}

#[derive(Debug, Deserialize)]
struct EnvironmentIn {
    id: i64,
    name: String,
    slug: String,
    tier: Option<String>,
}

#[derive(Debug, Deserialize)]
struct JobIn {
    id: i64,
    name: String,
    #[serde(default)]
    protected_ref: bool,
}

/// The job's `environment:kubernetes`, with GitLab 18's keys. Every key GitLab knows is taken;
/// any other is a 422 naming it, never dropped without a word.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesIn {
    agent: String,
    /// Deprecated since GitLab 18.4 for `dashboard.namespace`. Falls back to the authorizing
    /// entry's `default_namespace`, then `default`.
    #[serde(default)]
    namespace: Option<String>,
    /// GitLab 17.7; deprecated since 18.4 for `dashboard.flux_resource_path`.
    #[serde(default)]
    flux_resource_path: Option<String>,
    #[serde(default)]
    dashboard: Option<DashboardIn>,
    /// GitLab 18's resources that GitLab creates for the environment: taken as GitLab's schema
    /// has it, with nothing for envlens to do.
    #[serde(default)]
    #[allow(dead_code)]
    managed_resources: Option<ManagedResourcesIn>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct DashboardIn {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    flux_resource_path: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ManagedResourcesIn {
    #[serde(default)]
    #[allow(dead_code)]
    enabled: Option<bool>,
}

/// What a creation call asks for: the agent and where in its cluster the environment lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Target<'a> {
    /// `<config project full path>:<agent name>`, as requested.
    reference: &'a str,
    agent_project: &'a str,
    agent_name: &'a str,
    /// `None`: the authorizing entry's `default_namespace`, then `default`.
    namespace: Option<&'a str>,
    flux_resource_path: Option<&'a str>,
}

impl KubernetesIn {
    pub(super) fn target(&self) -> Result<Target<'_>> {
        let keys = validate::kubernetes_dashboard(
            DashboardKeys {
                namespace: self.namespace.as_deref(),
                flux_resource_path: self.flux_resource_path.as_deref(),
            },
            self.dashboard.as_ref().map(|d| DashboardKeys {
                namespace: d.namespace.as_deref(),
                flux_resource_path: d.flux_resource_path.as_deref(),
            }),
        )?;
        let (agent_project, agent_name) = parse_agent_reference(&self.agent)?;
        Ok(Target {
            reference: &self.agent,
            agent_project,
            agent_name,
            namespace: keys.namespace,
            flux_resource_path: keys.flux_resource_path,
        })
    }

    /// Whether the job's request is one envlens takes (`POST /api/v4/ci/deployments`), as
    /// checked before anything is written.
    pub fn check(&self) -> Result<()> {
        self.target().map(drop)
    }
}

impl CreationBody {
    /// Whether the body is one envlens takes (`POST /api/v4/internal/deployments`), as checked
    /// before anything is written.
    pub fn check(&self) -> Result<()> {
        self.validate().map(drop)
    }
}

const TIERS: [&str; 5] = ["production", "staging", "testing", "development", "other"];

impl CreationBody {
    fn validate(&self) -> Result<(DeploymentStatus, Option<Target<'_>>)> {
        let d = &self.deployment;
        validate::positive("deployment.id", d.id)?;
        if let Some(iid) = d.iid {
            validate::positive("deployment.iid", iid)?;
        }
        let status = DeploymentStatus::parse(&d.status).ok_or_else(|| {
            Error::invalid(
                "deployment.status",
                format!("`{}` is not a deployment status", d.status),
            )
        })?;
        validate::positive("project.id", self.project.id)?;
        validate::full_path("project.full_path", &self.project.full_path)?;
        validate::positive("environment.id", self.environment.id)?;
        validate::non_empty("environment.name", &self.environment.name)?;
        validate::non_empty("environment.slug", &self.environment.slug)?;
        if let Some(tier) = &self.environment.tier {
            if !TIERS.contains(&tier.as_str()) {
                return Err(Error::invalid(
                    "environment.tier",
                    format!("`{tier}` is not one of {}", TIERS.join(", ")),
                ));
            }
        }
        validate::positive("job.id", self.job.id)?;
        validate::non_empty("job.name", &self.job.name)?;
        let target = self
            .kubernetes
            .as_ref()
            .map(KubernetesIn::target)
            .transpose()?;
        Ok((status, target))
    }
}

/// `<config project full path>:<agent name>`.
fn parse_agent_reference(reference: &str) -> Result<(&str, &str)> {
    const FIELD: &str = "kubernetes.agent";
    let (path, name) = reference.rsplit_once(':').ok_or_else(|| {
        Error::invalid(
            FIELD,
            format!("`{reference}` is not an agent reference like `group/project:agent-name`"),
        )
    })?;
    validate::full_path(FIELD, path)?;
    validate::dns_label(FIELD, name)?;
    Ok((path, name))
}

/// `POST /api/v4/internal/deployments`.
///
/// A fresh creation (the project in the mirror as named, the deployment new) takes two round
/// trips: one statement reads what decides it (the agent and its `ci_access` entries), the
/// next writes everything at once ([`db::create_fresh`]). Any other, or a fresh one that
/// something overtook between the two, takes the steps of one transaction
/// ([`create_in_steps`]); both record the same rows and answer the same.
///
/// The two statements run on a lease (`db::lease`), not on a connection of sqlx's pool:
/// the pool checks every connection given back with a round trip of its own (and a task to
/// run it), which made a fresh creation three round trips where `pgbench` of the same
/// statements takes two. Each statement commits on its own, so the lease goes back with no
/// transaction open; the steps' transaction takes a pool connection, whose check on return
/// rolls back what a dropped request left open.
pub async fn create(
    _: Internal,
    State(state): State<AppState>,
    Json(body): Json<CreationBody>,
) -> Result<(StatusCode, JsonResponse<Value>)> {
    let (status, target) = body.validate()?;
    let (project, env, d) = (&body.project, &body.environment, &body.deployment);
    let environment = Environment {
        id: env.id,
        project_id: project.id,
        name: &env.name,
        slug: &env.slug,
        tier: env.tier.as_deref(),
    };
    let new = NewDeployment {
        id: d.id,
        iid: d.iid,
        project_id: project.id,
        environment_id: Some(env.id),
        environment_name: &env.name,
        report: StatusReport {
            status,
            changed_at: None,
        },
        git_ref: d.git_ref.as_deref(),
        sha: d.sha.as_deref(),
        tag: d.tag,
        job_id: Some(body.job.id),
        created_at: d.created_at,
    };
    let job = Job {
        project_path: &project.full_path,
        environment: &env.name,
        git_ref: d.git_ref.as_deref().unwrap_or_default(),
        protected_ref: body.job.protected_ref,
    };
    let fresh = db::FreshCreation {
        project_full_path: &project.full_path,
        environment: &environment,
        deployment: &new,
        agent: target.map(|t| (t.agent_project, t.agent_name)),
    };
    let mut lease = state.writes.acquire().await?;
    match create_if_fresh(&mut lease, &fresh, &job, target.as_ref()).await {
        Ok(Some(answer)) => return Ok(answer),
        Ok(None) => drop(lease),
        Err(e) => {
            // The connection may be broken: closed, not lent again.
            if matches!(e, Error::Unavailable(_)) {
                lease.discard();
            }
            return Err(e);
        }
    }
    let mut tx = state.db.begin().await?;
    let answer = create_in_steps(&mut tx, &body, &environment, &new, &job, target.as_ref()).await?;
    tx.commit().await?;
    Ok(answer)
}

/// The fresh creation's two statements: the answer, or `None` when the creation is not
/// fresh or something overtook it between them (nothing written then).
async fn create_if_fresh(
    conn: &mut PgConnection,
    fresh: &db::FreshCreation<'_>,
    job: &Job<'_>,
    target: Option<&Target<'_>>,
) -> Result<Option<Answer>> {
    let Some(found) = db::check_fresh(conn, fresh).await? else {
        return Ok(None);
    };
    let outcome = match target {
        Some(target) => decide(job, fresh.environment.project_id, target, found),
        None => no_kubernetes(),
    };
    let mut creation = Creation::requested(target);
    let row = match &outcome {
        Outcome::Written(row) => Some(row),
        Outcome::Refused(reason) => {
            creation.reason = Some(reason.clone());
            None
        }
    };
    let written = db::create_fresh(conn, fresh, &creation, row).await?;
    Ok(written.then(|| answer(fresh.deployment.id, &outcome)))
}

/// A creation's steps in the caller's transaction: the claim (or the earlier answer), the
/// project (linked to its groups when it is new or moved), the environment, the deployment
/// (completing one a hook created), then the decision and its row or reason.
async fn create_in_steps(
    tx: &mut PgConnection,
    body: &CreationBody,
    environment: &Environment<'_>,
    new: &NewDeployment<'_>,
    job: &Job<'_>,
    target: Option<&Target<'_>>,
) -> Result<Answer> {
    let deployment_id = body.deployment.id;
    if let Some(earlier) = claim(tx, deployment_id, target).await? {
        return Ok(earlier);
    }
    let project = &body.project;
    identity::upsert_project(tx, project.id, &project.full_path, None).await?;
    db::put_environment(tx, environment).await?;
    let mut now = new.report.status;
    if let Some(stored) = db::insert_or_lock(tx, new).await? {
        // A deployment hook came first: complete the deployment, keep its newer status.
        db::complete(tx, new).await?;
        if new.report.supersedes(&stored) {
            db::set_status(tx, deployment_id, &new.report).await?;
        } else {
            now = stored.status;
        }
    }
    let succeeded = now == DeploymentStatus::Success;
    record(tx, deployment_id, job, project.id, target, succeeded).await
}

/// The answer of SPEC 4.3: 201 with the row, or 200 with the reason there is none.
pub(super) type Answer = (StatusCode, JsonResponse<Value>);

/// Claims the creation of `deployment_id` for this request: `Some` with the earlier answer
/// when another request made it first (a 409 when that one asked for something else).
pub(super) async fn claim(
    conn: &mut PgConnection,
    deployment_id: i64,
    target: Option<&Target<'_>>,
) -> Result<Option<Answer>> {
    let requested = Creation::requested(target);
    match db::claim_creation(conn, deployment_id, &requested).await? {
        Some(earlier) => replay(conn, deployment_id, &earlier, &requested)
            .await
            .map(Some),
        None => Ok(None),
    }
}

/// Decides under the agent's `ci_access` whether the job may deploy to `target`, and records
/// the `agent_deployments` row, or the reason there is none, for a claimed deployment.
/// `may_have_succeeded` is false only when the caller knows the deployment's status is not
/// `success` under its lock: then no history snapshot can be due, and none is asked for.
pub(super) async fn record(
    conn: &mut PgConnection,
    deployment_id: i64,
    job: &Job<'_>,
    project_id: i64,
    target: Option<&Target<'_>>,
    may_have_succeeded: bool,
) -> Result<Answer> {
    let outcome = match target {
        Some(target) => authorize(conn, job, project_id, target).await?,
        None => no_kubernetes(),
    };
    match &outcome {
        Outcome::Written(row) => {
            db::insert_agent_deployment(conn, deployment_id, row).await?;
            if may_have_succeeded {
                // A success hook may have come first: its snapshot is due now (SPEC 10).
                crate::db::history::enqueue(conn, deployment_id).await?;
            }
        }
        Outcome::Refused(reason) => {
            db::set_creation_reason(conn, deployment_id, reason).await?;
        }
    }
    Ok(answer(deployment_id, &outcome))
}

/// The outcome of a call without a `kubernetes` section.
fn no_kubernetes() -> Outcome {
    Outcome::Refused(
        "the job's environment has no kubernetes section (agent and namespace), so no agent is recorded"
            .to_owned(),
    )
}

/// The answer for a recorded outcome.
fn answer(deployment_id: i64, outcome: &Outcome) -> Answer {
    match outcome {
        Outcome::Written(row) => written(deployment_id, row),
        Outcome::Refused(reason) => refused(Some(deployment_id), reason),
    }
}

/// Whether the job may deploy through the agent.
pub(super) enum Outcome {
    /// The `agent_deployments` row to write.
    Written(AgentDeployment),
    /// Why not, in words for the person reading the CI job.
    Refused(String),
}

/// The agent, namespace and Flux resource path the job may deploy to, or why not. Needs no
/// deployment: a job's own call (SPEC 12.2) is answered before GitLab's hook names it.
pub(super) async fn authorize(
    conn: &mut PgConnection,
    job: &Job<'_>,
    project_id: i64,
    target: &Target<'_>,
) -> Result<Outcome> {
    let found =
        db::authorization(conn, target.agent_project, target.agent_name, project_id).await?;
    Ok(decide(job, project_id, target, found))
}

/// The decision of [`authorize`] on the agent's authorization as read (`None`: no such agent).
fn decide(
    job: &Job<'_>,
    project_id: i64,
    target: &Target<'_>,
    found: Option<Authorization>,
) -> Outcome {
    let Target {
        reference,
        agent_project,
        agent_name,
        ..
    } = *target;
    let Some(agent) = found else {
        return Outcome::Refused(format!(
            "agent {reference} does not exist: project {agent_project} has no agent named {agent_name}"
        ));
    };
    let auth = CiAuthorizations {
        is_config_project: agent.config_project_id == project_id,
        project: agent.project,
        groups: agent.groups,
    };
    match access::ci_access(job, &auth) {
        Ok(entry) => {
            let default_namespace = entry.and_then(|e| e.default_namespace.as_deref());
            let namespace = target
                .namespace
                .or(default_namespace)
                .unwrap_or(DEFAULT_NAMESPACE);
            Outcome::Written(AgentDeployment {
                agent_id: agent.agent_id,
                kubernetes_namespace: namespace.to_owned(),
                flux_resource_path: target.flux_resource_path.map(str::to_owned),
            })
        }
        Err(refusal) => Outcome::Refused(refusal.reason(job, reference)),
    }
}

/// A known deployment: the earlier answer when the request names the same agent, namespace
/// and Flux resource path (in either shape of the kubernetes section), 409 otherwise. Nothing
/// is written.
async fn replay(
    conn: &mut PgConnection,
    deployment_id: i64,
    earlier: &Creation,
    requested: &Creation,
) -> Result<(StatusCode, JsonResponse<Value>)> {
    if !earlier.same_request(requested) {
        return Err(Error::Conflict(format!(
            "deployment {deployment_id} was created with {}, not {}",
            earlier.describe(),
            requested.describe(),
        )));
    }
    Ok(match db::agent_deployment(conn, deployment_id).await? {
        Some(row) => written(deployment_id, &row),
        None => refused(
            Some(deployment_id),
            earlier.reason.as_deref().unwrap_or_default(),
        ),
    })
}

impl Creation {
    /// What a request asks for, as its claim records it.
    fn requested(target: Option<&Target<'_>>) -> Self {
        Creation {
            agent: target.map(|t| t.reference.to_owned()),
            namespace: target.and_then(|t| t.namespace.map(str::to_owned)),
            flux_resource_path: target.and_then(|t| t.flux_resource_path.map(str::to_owned)),
            reason: None,
        }
    }

    fn same_request(&self, other: &Creation) -> bool {
        (&self.agent, &self.namespace, &self.flux_resource_path)
            == (&other.agent, &other.namespace, &other.flux_resource_path)
    }

    fn describe(&self) -> String {
        let Some(agent) = &self.agent else {
            return "no kubernetes section".to_owned();
        };
        let namespace = self.namespace.as_deref().unwrap_or("(default)");
        match &self.flux_resource_path {
            Some(path) => {
                format!("agent {agent}, namespace {namespace} and Flux resource path {path}")
            }
            None => format!("agent {agent} and namespace {namespace}"),
        }
    }
}

fn written(deployment_id: i64, row: &AgentDeployment) -> (StatusCode, JsonResponse<Value>) {
    (
        StatusCode::CREATED,
        JsonResponse(json!({
            "deployment_id": deployment_id,
            "agent_deployment": agent_deployment(row),
        })),
    )
}

/// The `agent_deployment` of an answer.
pub(super) fn agent_deployment(row: &AgentDeployment) -> Value {
    json!({
        "agent_id": row.agent_id,
        "kubernetes_namespace": row.kubernetes_namespace,
        "flux_resource_path": row.flux_resource_path,
    })
}

/// The answer without a row: `deployment_id` is null for a job's call that came before
/// GitLab's hook (SPEC 12.2).
pub(super) fn refused(
    deployment_id: Option<i64>,
    reason: &str,
) -> (StatusCode, JsonResponse<Value>) {
    (
        StatusCode::OK,
        JsonResponse(
            json!({ "deployment_id": deployment_id, "agent_deployment": null, "reason": reason }),
        ),
    )
}

/// GitLab's deployment event (`X-Gitlab-Event: Deployment Hook`).
#[derive(Debug, Deserialize)]
pub struct DeploymentHook {
    object_kind: String,
    deployment_id: i64,
    status: String,
    status_changed_at: String,
    environment: String,
    project: HookProject,
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    short_sha: Option<String>,
    /// The deploy job (GitLab's `deployable_id`): joins a job's own call (SPEC 12.2).
    #[serde(default)]
    deployable_id: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct HookProject {
    id: i64,
    path_with_namespace: String,
    /// 0 private, 10 internal, 20 public.
    visibility_level: Option<i64>,
}

/// A validated deployment hook.
pub struct StatusEvent {
    hook: DeploymentHook,
    report: StatusReport,
    visibility: Option<&'static str>,
}

impl DeploymentHook {
    pub fn validate(self) -> Result<StatusEvent> {
        if self.object_kind != "deployment" {
            return Err(Error::invalid(
                "object_kind",
                format!("`{}` is not a deployment event", self.object_kind),
            ));
        }
        validate::positive("deployment_id", self.deployment_id)?;
        let status = DeploymentStatus::parse(&self.status).ok_or_else(|| {
            Error::invalid(
                "status",
                format!("`{}` is not a deployment status", self.status),
            )
        })?;
        let changed_at = parse_gitlab_time(&self.status_changed_at).ok_or_else(|| {
            Error::invalid(
                "status_changed_at",
                format!("`{}` is not a time", self.status_changed_at),
            )
        })?;
        validate::non_empty("environment", &self.environment)?;
        validate::positive("project.id", self.project.id)?;
        validate::full_path(
            "project.path_with_namespace",
            &self.project.path_with_namespace,
        )?;
        let visibility = match self.project.visibility_level {
            None => None,
            Some(0) => Some("private"),
            Some(10) => Some("internal"),
            Some(20) => Some("public"),
            Some(other) => {
                return Err(Error::invalid(
                    "project.visibility_level",
                    format!("{other} is not 0, 10 or 20"),
                ));
            }
        };
        Ok(StatusEvent {
            hook: self,
            report: StatusReport {
                status,
                changed_at: Some(changed_at),
            },
            visibility,
        })
    }
}

/// A success hook's deployment, to look its agent up in GitLab (SPEC 12.2).
pub struct Succeeded<'a> {
    pub project_id: i64,
    pub deployment_id: i64,
    pub environment: &'a str,
    pub git_ref: Option<&'a str>,
}

impl StatusEvent {
    /// What the hook touches, for the rule of a group's webhook token: its project, the
    /// deployment (which may be another project's), and the deploy job it names (whose kept
    /// request may be another project's).
    pub fn footprint(&self) -> Footprint {
        let h = &self.hook;
        Footprint {
            paths: vec![(
                "project.path_with_namespace",
                h.project.path_with_namespace.clone(),
            )],
            projects: vec![(h.project.id, false)],
            deployments: vec![h.deployment_id],
            jobs: h.deployable_id.into_iter().collect(),
            ..Footprint::default()
        }
    }

    /// The deployment, when the hook says it succeeded.
    pub fn succeeded(&self) -> Option<Succeeded<'_>> {
        let h = &self.hook;
        (self.report.status == DeploymentStatus::Success).then_some(Succeeded {
            project_id: h.project.id,
            deployment_id: h.deployment_id,
            environment: &h.environment,
            git_ref: h.git_ref.as_deref(),
        })
    }

    /// Applies the status unless the deployment already has a newer one; creates a deployment
    /// that is not known yet, for the creation call to complete. True when something changed.
    pub async fn apply(&self, conn: &mut PgConnection) -> Result<bool> {
        let h = &self.hook;
        identity::upsert_project(
            conn,
            h.project.id,
            &h.project.path_with_namespace,
            self.visibility,
        )
        .await?;
        let environment_id = db::environment_id(conn, h.project.id, &h.environment).await?;
        let new = NewDeployment {
            id: h.deployment_id,
            iid: None,
            project_id: h.project.id,
            environment_id,
            environment_name: &h.environment,
            report: self.report,
            git_ref: h.git_ref.as_deref(),
            sha: h.short_sha.as_deref(),
            tag: None,
            job_id: h.deployable_id,
            created_at: None,
        };
        if let Some(job_id) = h.deployable_id.filter(|id| *id > 0) {
            // The job's own call may be waiting for this hook, or come after it.
            db::lock_job(conn, job_id).await?;
        }
        let stored = db::insert_or_lock(conn, &new).await?;
        if let Some(job_id) = h.deployable_id.filter(|id| *id > 0) {
            super::ci_deployments::join_hook(
                conn,
                h.deployment_id,
                job_id,
                &h.project.path_with_namespace,
            )
            .await?;
        }
        let Some(stored) = stored else {
            return Ok(true);
        };
        if let Some(environment_id) = environment_id {
            db::link_environment(conn, h.deployment_id, environment_id).await?;
        }
        if !self.report.supersedes(&stored) {
            return Ok(false);
        }
        db::set_status(conn, h.deployment_id, &self.report).await?;
        if self.report.status == DeploymentStatus::Success {
            // The deployment history's snapshot (SPEC 10), queued in the same transaction.
            crate::db::history::enqueue(conn, h.deployment_id).await?;
        }
        Ok(true)
    }
}

/// GitLab writes hook times as `2021-04-28 21:50:00 +0200` (and `... UTC`); RFC 3339 too.
fn parse_gitlab_time(s: &str) -> Option<DateTime<Utc>> {
    let s = s.trim();
    DateTime::parse_from_rfc3339(s)
        .or_else(|_| DateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S %z"))
        .map(|t| t.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            let naive = s.strip_suffix(" UTC")?;
            NaiveDateTime::parse_from_str(naive, "%Y-%m-%d %H:%M:%S")
                .ok()
                .map(|t| t.and_utc())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitlab_time_formats() {
        let expected = DateTime::parse_from_rfc3339("2021-04-28T19:50:00Z").unwrap();
        for s in [
            "2021-04-28 21:50:00 +0200",
            "2021-04-28 19:50:00 UTC",
            "2021-04-28T19:50:00Z",
            "2021-04-28T21:50:00+02:00",
        ] {
            assert_eq!(
                parse_gitlab_time(s),
                Some(expected.with_timezone(&Utc)),
                "{s}"
            );
        }
        assert_eq!(parse_gitlab_time("yesterday"), None);
    }

    #[test]
    fn agent_references() {
        assert_eq!(
            parse_agent_reference("group/agents:prod").unwrap(),
            ("group/agents", "prod")
        );
        for bad in [
            "group/agents",
            "group/agents:",
            ":prod",
            "group//x:prod",
            "group/agents:Prod",
        ] {
            match parse_agent_reference(bad) {
                Err(Error::Invalid { field, .. }) => assert_eq!(field, "kubernetes.agent"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}
