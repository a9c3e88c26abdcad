//! `/agents?project=&name=`: an agent's page (SPEC 14's `ClusterAgent.connection` on the
//! dashboard): how envlens reaches its cluster and what each status means, its `access_as`,
//! whom its `user_access` and `ci_access` name, and the environments it serves.
//!
//! Only a viewer who may read the agent (GitLab's `read_cluster_agent`, SPEC 13) sees it; to
//! anyone else it answers the very 404 of an agent that does not exist. The page reads the
//! database (GraphQL has no field for an agent's sections, nor for a viewer who reads the
//! agent through `ci_access` but not its project) and the connection from memory: it asks no
//! cluster, so that its regions can be re-rendered every few seconds (`data-refresh-every`),
//! which is how a change of the connection shows without a reload.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde::Deserialize;

use super::dashboard::{error_page, html, required, signed_in, Reader};
use super::data::AgentConnection;
use super::pages;
use crate::db::pool::Pool;
use crate::db::read_agents;
use crate::error::Error;
use crate::gitlab::access::read_cluster_agent;
use crate::graphql::Engine;
use crate::k8s::clusters::Connection;

/// The environments one page lists at most.
const ENVIRONMENTS_SHOWN: i64 = 200;

#[derive(Deserialize)]
pub(super) struct AgentQuery {
    project: Option<String>,
    name: Option<String>,
}

/// What an unreadable agent and a missing one both answer.
fn missing() -> Error {
    Error::NotFound("The agent does not exist, or you may not see it.".into())
}

/// `ClusterAgent.connection`'s words (SPEC 14) of a connection, as the pages render them.
fn connection_of(c: Connection) -> AgentConnection {
    AgentConnection {
        kind: c.kind.map_or("none", |k| k.label()).to_ascii_uppercase(),
        status: c.status.label().to_ascii_uppercase(),
        message: c.message,
        checked_at: c
            .checked_at
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
    }
}

pub(super) async fn agent(
    State(engine): State<Engine>,
    State(pool): State<Pool>,
    reader: Reader,
    query: Result<Query<AgentQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = async {
        let Query(q) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
        let project = required("project", &q.project)?;
        let name = required("name", &q.name)?;
        let (user, viewer) = signed_in(&pool, &reader).await?;
        let mut conn = pool.acquire().await?;
        let agent = read_agents::agent_by_path(&mut *conn, project, name)
            .await?
            .ok_or_else(missing)?;
        let readers = read_agents::agent_readers(&mut *conn, viewer, &[agent.id])
            .await?
            .into_iter()
            .next()
            .map(|row| row.readers())
            .filter(|readers| read_cluster_agent(viewer.admin, readers))
            .ok_or_else(missing)?;
        let grants = read_agents::agent_grants(&mut *conn, viewer, agent.id).await?;
        let mut environments =
            read_agents::agent_environments(&mut *conn, viewer, agent.id, ENVIRONMENTS_SHOWN + 1)
                .await?;
        drop(conn);
        let truncated = environments.len() > ENVIRONMENTS_SHOWN as usize;
        environments.truncate(ENVIRONMENTS_SHOWN as usize);
        let connection =
            engine
                .clusters
                .connection(agent.id, &agent.project_full_path, &agent.name);
        let title = format!("Agent {} · {}", agent.name, agent.project_full_path);
        let chrome = reader.chrome(&title, Some(&user.username));
        let view = pages::agent::AgentView {
            project_path: &agent.project_full_path,
            name: &agent.name,
            connection: connection_of(connection),
            access_as: readers.access_as,
            grants: &grants,
            environments: &environments,
            truncated,
        };
        Ok::<_, Error>(html(
            StatusCode::OK,
            pages::agent::agent_page(&chrome, &view, Utc::now()),
        ))
    }
    .await;
    result.unwrap_or_else(|e| error_page(&e, Some(&reader)))
}
