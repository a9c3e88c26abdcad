//! The sync from GitLab's API (SPEC 12.3): `envlens sync`, and `serve` every
//! `gitlab.sync_interval`. One pass reads the groups (under `gitlab.groups`, or all that an
//! administrator's token sees), their projects, users, the direct members of each group and
//! project, each project's cluster agents with their configuration files, and its environments;
//! then writes it all in one transaction: upserts that change only what differs, and the
//! removal of what GitLab no longer has, so that a pass that fails half way writes and removes
//! nothing, and a pass over an unchanged GitLab writes nothing.
//!
//! Bounded: 100 items a page, at most `gitlab.sync_max_projects` projects, `gitlab.sync_timeout`
//! for the whole pass, [`CONCURRENCY`] projects read at a time; GitLab's rate limits are waited
//! out by the client. What it costs GitLab: for each project three lists (members, agents,
//! environments), one page each for most projects, and one file per agent; for each group one
//! list of members; plus the lists of groups, projects and (administrator) users.
//!
//! Users: with an administrator's token, every user of the instance (`GET /users`, with their
//! admin and external flags and their state; a blocked or deactivated one is mirrored and
//! refused), members or not, and those GitLab no longer lists are removed. With any other token
//! only the users seen as members, never removed by a pass: GitLab does not show such a token
//! who is an administrator or external.

pub mod agents;

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::task::JoinSet;

use crate::config::file::GitLabSettings;
use crate::db::identity::{self, Snapshot};
use crate::db::{deployments, pull, sync as db};
use crate::error::Error;
use crate::gitlab::api::{encode, ApiError, GitLab};
use crate::gitlab::rest;
use crate::gitlab::users;
use crate::gitlab::validate;
use crate::telemetry::Metrics;

/// Projects read at the same time.
pub const CONCURRENCY: usize = 4;

/// Why a pass or a follow-up did not complete.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    #[error(transparent)]
    GitLab(#[from] ApiError),
    #[error(transparent)]
    Store(#[from] Error),
    #[error("the pass took longer than gitlab.sync_timeout ({0:?}): nothing was written")]
    Timeout(Duration),
    #[error("{0}")]
    Setup(String),
    #[error("another envlens is running a sync pass on this database: this one is skipped")]
    Busy,
    #[error("another envlens' sync pass on this database still runs after {0:?} (gitlab.sync_timeout): this one is skipped")]
    StillBusy(Duration),
}

/// What to read, and its bounds.
#[derive(Debug, Clone)]
pub struct Scope {
    /// Top-level groups' full paths; empty: every group the token sees.
    pub groups: Vec<String>,
    pub max_projects: usize,
    pub timeout: Duration,
}

impl Scope {
    pub fn of(settings: &GitLabSettings) -> Self {
        Scope {
            groups: settings.groups.clone(),
            max_projects: settings.sync_max_projects,
            timeout: settings.sync_timeout,
        }
    }
}

/// What one pass read and did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Report {
    pub groups: usize,
    pub projects: usize,
    pub users: usize,
    pub members: usize,
    pub agents: usize,
    pub configurations_applied: usize,
    pub configurations_not_applied: usize,
    pub environments: usize,
    /// Rows inserted, updated or deleted by the pass's transaction.
    pub rows_written: i64,
    /// Rows of what GitLab no longer has, removed.
    pub removed: u64,
    /// Calls sent to GitLab (each attempt).
    pub requests: u64,
    pub seconds: f64,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} groups, {} projects, {} users, {} memberships, {} agents ({} configurations \
             applied, {} not), {} environments; {} rows written, {} removed; {} requests to \
             GitLab in {:.1} s",
            self.groups,
            self.projects,
            self.users,
            self.members,
            self.agents,
            self.configurations_applied,
            self.configurations_not_applied,
            self.environments,
            self.rows_written,
            self.removed,
            self.requests,
            self.seconds
        )
    }
}

/// One project as read.
struct ProjectRead {
    project: rest::Project,
    members: Vec<rest::Member>,
    agents: Vec<agents::ListedAgent>,
    environments: Vec<rest::Environment>,
}

/// One pass, or [`Failed::Busy`] when another envlens runs one on the same database: `serve`'s
/// passes, which come again. `progress` hears of each step (for `envlens sync`'s display).
pub async fn pass(
    db: &PgPool,
    api: &GitLab,
    scope: &Scope,
    metrics: &Metrics,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<Report, Failed> {
    // One pass at a time across the replicas of a database: the others skip theirs.
    let mut lock = db.acquire().await.map_err(Error::from)?;
    if !db::try_lock_pass(&mut lock).await? {
        return Err(Failed::Busy);
    }
    locked(lock, db, api, scope, metrics, progress).await
}

/// How often a waiting pass looks at the running one.
const WAIT_POLL: Duration = Duration::from_millis(500);

/// One pass after the one another envlens is running, if any (`envlens sync` beside `serve`:
/// whoever runs it wants the mirror as GitLab is now). While it waits, `progress` hears so,
/// then each step of the running pass; it waits at most `scope.timeout`, the bound of a pass.
pub async fn pass_after_running(
    db: &PgPool,
    api: &GitLab,
    scope: &Scope,
    metrics: &Metrics,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<Report, Failed> {
    let mut lock = db.acquire().await.map_err(Error::from)?;
    let until = Instant::now() + scope.timeout;
    let mut heard: Option<Option<String>> = None;
    while !db::try_lock_pass(&mut lock).await? {
        let step = db::running_step(&mut lock).await?;
        if heard.as_ref() != Some(&step) {
            let doing = step.as_deref().map_or(String::new(), |s| format!(" ({s})"));
            progress(&match heard {
                None => format!(
                    "another envlens is running a sync pass on this database{doing}: waiting for it"
                ),
                Some(_) => format!("the other pass{doing}"),
            });
            heard = Some(step);
        }
        if Instant::now() >= until {
            return Err(Failed::StillBusy(scope.timeout));
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
    if heard.is_some() {
        progress("the other pass ended: this one starts");
    }
    locked(lock, db, api, scope, metrics, progress).await
}

/// A pass under the lock held on `lock`'s session, which shows the pass' steps to envlenses
/// waiting for it ([`db::show_step`]), and is released at the end.
async fn locked(
    mut lock: sqlx::pool::PoolConnection<sqlx::Postgres>,
    db: &PgPool,
    api: &GitLab,
    scope: &Scope,
    metrics: &Metrics,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<Report, Failed> {
    let started = Instant::now();
    let requests_before = api.requests_sent();
    let (step, mut steps) = tokio::sync::watch::channel(String::from("starting"));
    let mut relay = |s: &str| {
        progress(s);
        step.send_replace(s.to_owned());
    };
    let work = tokio::time::timeout(scope.timeout, run(db, api, scope, &mut relay));
    // The latest step, shown while the pass runs; a step missed in between is no loss.
    let show = async {
        loop {
            let now = steps.borrow_and_update().clone();
            if let Err(e) = db::show_step(&mut lock, &now).await {
                tracing::debug!(error = %e, "cannot show the sync pass' step");
            }
            tokio::time::sleep(WAIT_POLL / 2).await;
            if steps.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    let outcome = tokio::select! {
        outcome = work => outcome,
        _ = show => unreachable!("the steps are shown until the pass ends"),
    };
    if let Err(e) = db::unlock_pass(&mut lock).await {
        // The lock goes with the session: close it rather than return it to the pool.
        tracing::warn!(error = %e, "cannot release the sync lock; closing its connection");
        lock.detach();
    }
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(_) => Err(Failed::Timeout(scope.timeout)),
    };
    metrics.sync_pass(outcome.is_ok(), started.elapsed());
    let mut report = outcome?;
    report.requests = api.requests_sent() - requests_before;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

async fn run(
    db: &PgPool,
    api: &GitLab,
    scope: &Scope,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<Report, Failed> {
    if !api.has_token() {
        return Err(Failed::Setup(
            "the sync needs gitlab.token_file: a token with read_api".into(),
        ));
    }
    // Groups and projects.
    let mut groups: Vec<rest::Group> = Vec::new();
    let mut projects: Vec<rest::Project> = Vec::new();
    let limit = scope.max_projects;
    if scope.groups.is_empty() {
        groups = api
            .get_all(
                "/groups",
                "/api/v4/groups?all_available=true&order_by=id&sort=asc",
                None,
            )
            .await?;
        progress(&format!("groups: {}", groups.len()));
        projects = api
            .get_all_limited(
                "/projects",
                "/api/v4/projects?pagination=keyset&order_by=id&sort=asc",
                None,
                limit,
            )
            .await?;
    } else {
        for root in &scope.groups {
            let group: rest::Group = api
                .get_optional(
                    "/groups/:id",
                    &format!("/api/v4/groups/{}", encode(root)),
                    None,
                )
                .await?
                .ok_or_else(|| {
                    Failed::Setup(format!(
                        "GitLab has no group {root} (or the token cannot read it)"
                    ))
                })?;
            let below: Vec<rest::Group> = api
                .get_all(
                    "/groups/:id/descendant_groups",
                    &format!(
                        "/api/v4/groups/{}/descendant_groups?all_available=true",
                        group.id
                    ),
                    None,
                )
                .await?;
            let listed: Vec<rest::Project> = api
                .get_all_limited(
                    "/groups/:id/projects",
                    &format!(
                        "/api/v4/groups/{}/projects?include_subgroups=true&with_shared=false&order_by=id&sort=asc",
                        group.id
                    ),
                    None,
                    limit.saturating_sub(projects.len()),
                )
                .await?;
            groups.push(group);
            groups.extend(below);
            projects.extend(listed);
        }
        progress(&format!("groups: {}", groups.len()));
    }
    progress(&format!("projects: {}", projects.len()));

    // Users: every one, with an administrator's token only. GitLab shows others `is_admin`
    // and `external` only then: a regular user's `GET /users` would make every admin a
    // non-admin and every external user one who reads internal projects (SPEC 13). Otherwise
    // the users are those seen as members, and no user is removed.
    let users: Option<Vec<rest::User>> = if users::own_token_is_admin(api, None).await? {
        let all: Vec<rest::User> = api
            .get_all("/users", "/api/v4/users?order_by=id&sort=asc", None)
            .await?;
        progress(&format!("users: {}", all.len()));
        Some(all)
    } else {
        progress(
            "users: members only (the token is no administrator's: GitLab shows it no user's \
             admin or external flag)",
        );
        None
    };

    // Each group's direct members.
    let mut group_members: Vec<(i64, Vec<rest::Member>)> = Vec::with_capacity(groups.len());
    for group in &groups {
        let members = api
            .get_all(
                "/groups/:id/members",
                &format!("/api/v4/groups/{}/members", group.id),
                None,
            )
            .await?;
        group_members.push((group.id, members));
    }
    progress("group members read");

    // Each project's members, agents (with their files) and environments, a few at a time.
    let total = projects.len();
    let mut read: Vec<ProjectRead> = Vec::with_capacity(total);
    let mut pending = projects.into_iter();
    let mut running = JoinSet::new();
    loop {
        while running.len() < CONCURRENCY {
            let Some(project) = pending.next() else { break };
            let api = api.clone();
            running.spawn(async move { read_project(&api, project).await });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let done = done.map_err(|e| Failed::Setup(format!("a project's read stopped: {e}")))??;
        read.push(done);
        if read.len().is_multiple_of(100) || read.len() == total {
            progress(&format!("projects read: {}/{total}", read.len()));
        }
    }
    read.sort_by_key(|p| p.project.id);

    let mut tx = db.begin().await.map_err(Error::from)?;
    let written_before = db::rows_written(&mut tx).await?;
    let report = write(
        &mut tx,
        scope,
        &groups,
        users.as_deref(),
        &group_members,
        &read,
    )
    .await?;
    let rows_written = db::rows_written(&mut tx).await? - written_before;
    tx.commit().await.map_err(Error::from)?;
    progress("written");
    Ok(Report {
        rows_written,
        ..report
    })
}

async fn read_project(api: &GitLab, project: rest::Project) -> Result<ProjectRead, Failed> {
    let id = project.id;
    let members = api
        .get_all(
            "/projects/:id/members",
            &format!("/api/v4/projects/{id}/members"),
            None,
        )
        .await?;
    let agents = agents::fetch(api, &project).await?;
    let environments = api
        .get_all(
            "/projects/:id/environments",
            &format!("/api/v4/projects/{id}/environments"),
            None,
        )
        .await?;
    Ok(ProjectRead {
        project,
        members,
        agents,
        environments,
    })
}

/// Writes a pass. `users` is every user of the instance (an administrator's token), or `None`:
/// then only users seen as members are written, and none removed.
async fn write(
    conn: &mut sqlx::PgConnection,
    scope: &Scope,
    groups: &[rest::Group],
    users: Option<&[rest::User]>,
    group_members: &[(i64, Vec<rest::Member>)],
    read: &[ProjectRead],
) -> Result<Report, Failed> {
    // Every membership, and the users seen only as members.
    let mut member_users: BTreeMap<i64, (String, Option<String>)> = BTreeMap::new();
    let mut s = Snapshot::default();
    let mut add_member = |s: &mut Snapshot, kind: &str, source: i64, m: &rest::Member| {
        // A level envlens does not know (no access, 0) grants nothing.
        if validate::access_level("access_level", m.access_level).is_ok() {
            let state = m.state.as_deref().map(validate::user_state);
            member_users.insert(m.id, (m.username.clone(), state));
            s.member_user_ids.push(m.id);
            s.member_source_types.push(kind.to_owned());
            s.member_source_ids.push(source);
            s.member_access_levels.push(m.access_level);
        }
    };
    for (group, members) in group_members {
        for m in members {
            add_member(&mut s, "group", *group, m);
        }
    }
    for p in read {
        for m in &p.members {
            add_member(&mut s, "project", p.project.id, m);
        }
    }
    let mut seen_groups = HashSet::new();
    for g in groups {
        if seen_groups.insert(g.id) {
            s.group_ids.push(g.id);
            s.group_paths.push(g.full_path.clone());
        }
    }
    for p in read {
        let visibility = p
            .project
            .visibility
            .clone()
            .filter(|v| validate::visibility("visibility", v).is_ok())
            .unwrap_or_else(|| "private".to_owned());
        s.project_ids.push(p.project.id);
        s.project_paths.push(p.project.path_with_namespace.clone());
        s.project_visibilities.push(visibility);
    }
    for u in users.unwrap_or_default() {
        s.user_ids.push(u.id);
        s.usernames.push(u.username.clone());
        s.user_admins.push(u.is_admin.unwrap_or(false));
        s.user_states
            .push(u.state.as_deref().map(validate::user_state));
        s.user_externals.push(u.external);
    }
    let listed: HashSet<i64> = s.user_ids.iter().copied().collect();
    let mut ids = Vec::new();
    let mut names = Vec::new();
    let mut states = Vec::new();
    for (id, (name, state)) in member_users.iter().filter(|(id, _)| !listed.contains(id)) {
        ids.push(*id);
        names.push(name.clone());
        states.push(state.clone());
    }
    let before_identity = db::rows_written(conn).await?;
    db::put_member_users(conn, &ids, &names, &states).await?;
    if let Some(i) = identity::apply_snapshot(conn, &s).await? {
        return Err(Failed::Setup(format!(
            "member {} is no user GitLab listed",
            s.member_user_ids[i]
        )));
    }
    let identity_changed = db::rows_written(conn).await? > before_identity;

    // Agents and their configurations, then environments.
    let mut report = Report {
        groups: s.group_ids.len(),
        projects: read.len(),
        users: s.user_ids.len() + ids.len(),
        members: s.member_user_ids.len(),
        ..Report::default()
    };
    let mut agent_ids = Vec::new();
    let mut environment_ids = Vec::new();
    for p in read {
        let applied = agents::apply(conn, p.project.id, &p.agents, identity_changed).await?;
        report.agents += applied.agents;
        report.configurations_applied += applied.configured;
        report.configurations_not_applied += applied.unreadable;
        agent_ids.extend(p.agents.iter().map(|a| a.agent.id));
        for e in &p.environments {
            deployments::put_environment(
                conn,
                &deployments::Environment {
                    id: e.id,
                    project_id: p.project.id,
                    name: &e.name,
                    slug: &e.slug,
                    tier: e.tier.as_deref().filter(|t| TIERS.contains(t)),
                },
            )
            .await?;
            bind_agent(conn, &p.project, e).await?;
            environment_ids.push(e.id);
        }
    }
    report.environments = environment_ids.len();

    // What GitLab no longer has: the pass is complete.
    let roots: Vec<String> = scope.groups.iter().map(|g| g.to_lowercase()).collect();
    let all_users: Vec<i64> = s.user_ids.iter().chain(&ids).copied().collect();
    report.removed = db::remove_unseen(
        conn,
        &db::Seen {
            roots: (!roots.is_empty()).then_some(&roots[..]),
            all_users: users.is_some(),
            group_ids: &s.group_ids,
            project_ids: &s.project_ids,
            user_ids: &all_users,
            member_users: &s.member_user_ids,
            member_types: &s.member_source_types,
            member_sources: &s.member_source_ids,
            agent_ids: &agent_ids,
            environment_ids: &environment_ids,
        },
    )
    .await?;
    Ok(report)
}

/// SPEC 15: the agent GitLab names for the environment (`cluster_agent`, 17.5+) is its agent
/// when no successful deployment names one, if `ci_access` lets the environment's project use
/// it, as for a deployment (decided by the same code; without a deployment there is no ref, so
/// an entry with `protected_branches_only` refuses).
async fn bind_agent(
    conn: &mut sqlx::PgConnection,
    project: &rest::Project,
    e: &rest::Environment,
) -> Result<(), Failed> {
    use super::deployments::{authorize, KubernetesIn, Outcome};
    let Some(named) = rest::named_agent(e) else {
        pull::remove_environment_agent(conn, e.id).await?;
        return Ok(());
    };
    let mut kubernetes = serde_json::json!({"agent": named.reference});
    if let Some(namespace) = &named.namespace {
        kubernetes["namespace"] = serde_json::json!(namespace);
    }
    let kubernetes: Option<KubernetesIn> = serde_json::from_value(kubernetes).ok();
    let target = kubernetes.as_ref().map(|k| k.target());
    let job = crate::gitlab::access::Job {
        project_path: &project.path_with_namespace,
        environment: &e.name,
        git_ref: "(no deployment job)",
        protected_ref: false,
    };
    let outcome = match target {
        Some(Ok(target)) => authorize(conn, &job, project.id, &target).await?,
        Some(Err(err)) => Outcome::Refused(format!("GitLab names {}: {err}", named.reference)),
        None => Outcome::Refused(format!(
            "GitLab names {}, no agent reference",
            named.reference
        )),
    };
    let flux = named
        .flux_resource_path
        .as_deref()
        .filter(|path| validate::flux_resource_path("flux_resource_path", path).is_ok());
    let decision = match &outcome {
        Outcome::Written(row) => Ok((row.agent_id, row.kubernetes_namespace.as_str())),
        Outcome::Refused(reason) => Err(reason.as_str()),
    };
    pull::put_environment_agent(
        conn,
        &pull::EnvironmentAgent {
            environment_id: e.id,
            reference: &named.reference,
            decision,
            flux_resource_path: flux,
        },
    )
    .await?;
    Ok(())
}

const TIERS: [&str; 5] = ["production", "staging", "testing", "development", "other"];
