//! A project's cluster agents and their configuration files, read from GitLab's API
//! (`GET /projects/:id/cluster_agents`, then `.gitlab/agents/<name>/config.yaml` at the default
//! branch through the repository files API) and applied as SPEC 4.2 applies a configuration.
//! The sync pass reads every project's; a push touching `.gitlab/agents/` reads one project's.

use serde_json::{json, Value};
use sqlx::{PgConnection, PgPool};

use super::Failed;
use crate::db::{agents as db, identity};
use crate::gitlab::api::{encode, ApiError, GitLab};
use crate::gitlab::rest;

/// One agent as GitLab lists it, with what its configuration file holds.
#[derive(Debug)]
pub struct ListedAgent {
    pub agent: rest::ClusterAgent,
    pub config: Config,
}

#[derive(Debug)]
pub enum Config {
    /// The file as JSON; `{}` when there is no file (GitLab's agent then has no access).
    Read(Value),
    /// A file that is not a YAML mapping: the agent keeps what it had.
    Unreadable(String),
}

/// Reads project `project`'s agents and their configuration files.
pub async fn fetch(api: &GitLab, project: &rest::Project) -> Result<Vec<ListedAgent>, ApiError> {
    let agents: Vec<rest::ClusterAgent> = api
        .get_all(
            "/projects/:id/cluster_agents",
            &format!("/api/v4/projects/{}/cluster_agents", project.id),
            None,
        )
        .await?;
    let mut listed = Vec::with_capacity(agents.len());
    for agent in agents {
        let config = match &project.default_branch {
            None => Config::Read(json!({})),
            Some(branch) => read_config(api, project.id, &agent.name, branch).await?,
        };
        listed.push(ListedAgent { agent, config });
    }
    Ok(listed)
}

async fn read_config(
    api: &GitLab,
    project_id: i64,
    name: &str,
    branch: &str,
) -> Result<Config, ApiError> {
    let file = format!(".gitlab/agents/{name}/config.yaml");
    let raw = api
        .get_raw(
            "/projects/:id/repository/files/:file_path/raw",
            &format!(
                "/api/v4/projects/{project_id}/repository/files/{}/raw?ref={}",
                encode(&file),
                encode(branch)
            ),
            None,
        )
        .await?;
    let Some(raw) = raw else {
        return Ok(Config::Read(json!({})));
    };
    let text = String::from_utf8_lossy(&raw);
    Ok(match serde_saphyr::from_str::<Value>(&text) {
        Ok(Value::Null) => Config::Read(json!({})),
        Ok(value @ Value::Object(_)) => Config::Read(value),
        Ok(_) => Config::Unreadable(format!("{file} is not a YAML mapping")),
        Err(e) => Config::Unreadable(format!("{file} is not YAML: {e}")),
    })
}

/// What applying a project's agents did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub agents: usize,
    /// Configurations applied (unchanged ones are skipped unless the identity changed).
    pub configured: usize,
    /// Agents whose file could not be read or applied (logged with the reason).
    pub unreadable: usize,
}

/// Registers the agents and applies their configurations, inside the caller's transaction.
/// `resolve_again`: apply a configuration even when it is the one applied last (new groups or
/// projects may resolve paths that did not resolve before).
pub async fn apply(
    conn: &mut PgConnection,
    project_id: i64,
    listed: &[ListedAgent],
    resolve_again: bool,
) -> Result<Applied, Failed> {
    let mut applied = Applied::default();
    for ListedAgent { agent, config } in listed {
        applied.agents += 1;
        let changed = db::put_listed(conn, agent.id, project_id, &agent.name).await?;
        let config = match config {
            Config::Read(config) => config,
            Config::Unreadable(reason) => {
                tracing::warn!(agent = agent.id, %reason, "agent configuration not applied");
                applied.unreadable += 1;
                continue;
            }
        };
        if !changed
            && !resolve_again
            && db::config_of(&mut *conn, agent.id).await?.as_ref() == Some(config)
        {
            continue;
        }
        // A configuration envlens refuses (SPEC 4.2's bounds) is refused before anything is
        // written: the agent keeps what it had.
        match super::super::agents::configure(conn, agent.id, config).await {
            Ok(_) => applied.configured += 1,
            Err(e @ crate::error::Error::Invalid { .. }) => {
                tracing::warn!(agent = agent.id, error = %e, "agent configuration refused");
                applied.unreadable += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(applied)
}

/// Reads and applies one project's agents now (a push touched `.gitlab/agents/`, or a
/// deployment names an agent the mirror does not have). What it did, in words.
pub async fn refresh_project(db: &PgPool, api: &GitLab, project_id: i64) -> Result<String, Failed> {
    let project: Option<rest::Project> = api
        .get_optional(
            "/projects/:id",
            &format!("/api/v4/projects/{project_id}"),
            None,
        )
        .await?;
    let Some(project) = project else {
        return Ok(format!(
            "GitLab has no project {project_id} (or the token cannot read it)"
        ));
    };
    let listed = fetch(api, &project).await?;
    let mut tx = db.begin().await.map_err(crate::error::Error::from)?;
    identity::upsert_project(
        &mut tx,
        project.id,
        &project.path_with_namespace,
        project.visibility.as_deref(),
    )
    .await?;
    let applied = apply(&mut tx, project.id, &listed, true).await?;
    tx.commit().await.map_err(crate::error::Error::from)?;
    Ok(format!(
        "{} agents of {} read, {} configurations applied, {} not applied",
        applied.agents, project.path_with_namespace, applied.configured, applied.unreadable
    ))
}
