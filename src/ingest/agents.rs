//! Agents and their configuration (SPEC 4.2): registration, and each new `config.yaml`
//! with its `ci_access` and `user_access` paths resolved to projects and groups.

use std::collections::HashSet;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json as JsonResponse;
use serde::Deserialize;
use serde_json::{json, Value};

use super::validate;
use crate::agent_config::AgentConfig;
use crate::auth::Internal;
use crate::db::agents::{self as db, Authorization};
use crate::error::{Error, Result};
use crate::extract::{from_value, Json};
use crate::state::AppState;

#[derive(Debug, Deserialize)]
pub struct AgentBody {
    project_id: i64,
    name: String,
}

/// `PUT /api/v4/internal/kubernetes/agents/{id}`: 201 when new, 200 when updated.
pub async fn put_agent(
    _: Internal,
    State(state): State<AppState>,
    Path(id): Path<String>,
    Json(body): Json<AgentBody>,
) -> Result<(StatusCode, JsonResponse<Value>)> {
    let id: i64 = id
        .parse()
        .map_err(|_| Error::invalid("id", format!("`{id}` is not an agent id")))?;
    validate::positive("id", id)?;
    validate::positive("project_id", body.project_id)?;
    validate::dns_label("name", &body.name)?;
    if !db::project_exists(&state.db, body.project_id).await? {
        return Err(Error::NotFound(format!(
            "project {} is not in the identity mirror",
            body.project_id
        )));
    }
    let created = db::upsert(&state.db, id, body.project_id, &body.name).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        JsonResponse(json!({ "id": id, "project_id": body.project_id, "name": body.name })),
    ))
}

#[derive(Debug, Deserialize)]
pub struct ConfigurationBody {
    agent_id: i64,
    agent_config: Value,
}

/// `POST /api/v4/internal/kubernetes/agent_configuration`: replaces the agent's configuration
/// and authorizations. Paths that name nothing inside the top-level group of the agent's
/// project are dropped, as GitLab drops them, and listed in the answer.
pub async fn post_configuration(
    _: Internal,
    State(state): State<AppState>,
    Json(body): Json<ConfigurationBody>,
) -> Result<JsonResponse<Value>> {
    validate::positive("agent_id", body.agent_id)?;
    if !body.agent_config.is_object() {
        return Err(Error::invalid(
            "agent_config",
            "must be an object: the agent's config.yaml as JSON",
        ));
    }
    let config: AgentConfig = from_value(body.agent_config.clone(), "agent_config")?;
    config.validate("agent_config")?;

    let mut tx = state.db.begin().await?;
    let agent = db::find(&mut *tx, body.agent_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("agent {} is not registered", body.agent_id)))?;
    let root = agent
        .project_full_path
        .split('/')
        .next()
        .unwrap_or_default()
        .to_lowercase();
    let mut unresolved = Vec::new();

    let (ci_projects, ci_groups) = config
        .ci_access
        .as_ref()
        .map(|ci| (ci.projects.as_slice(), ci.groups.as_slice()))
        .unwrap_or_default();
    let mut ci_rows = Vec::new();
    for (groups, entries) in [(false, ci_projects), (true, ci_groups)] {
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        let configs = entries
            .iter()
            .map(|e| serde_json::to_value(e).unwrap_or_default());
        resolve_into(
            &mut tx,
            &root,
            groups,
            "ci_access",
            &ids,
            configs,
            &mut ci_rows,
            &mut unresolved,
        )
        .await?;
    }

    let mut user_rows = Vec::new();
    if let Some(user) = &config.user_access {
        // Every user_access entry carries the section's `access_as`, as GitLab stores it.
        let entry_config = json!({ "access_as": user.access_as });
        for (groups, entries) in [(false, &user.projects), (true, &user.groups)] {
            let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
            let configs = std::iter::repeat(entry_config.clone());
            resolve_into(
                &mut tx,
                &root,
                groups,
                "user_access",
                &ids,
                configs,
                &mut user_rows,
                &mut unresolved,
            )
            .await?;
        }
    }

    db::replace_configuration(&mut tx, agent.id, &body.agent_config, &ci_rows, &user_rows).await?;
    tx.commit().await?;
    Ok(JsonResponse(json!({
        "agent_id": agent.id,
        "ci_access": counts(&ci_rows),
        "user_access": counts(&user_rows),
        "unresolved": unresolved,
    })))
}

/// Resolves one list of entries; the first entry for a project or group wins.
#[allow(clippy::too_many_arguments)]
async fn resolve_into(
    conn: &mut sqlx::PgConnection,
    root: &str,
    groups: bool,
    section: &str,
    ids: &[&str],
    configs: impl Iterator<Item = Value>,
    rows: &mut Vec<Authorization>,
    unresolved: &mut Vec<Value>,
) -> Result<()> {
    let paths: Vec<String> = ids.iter().map(|p| p.trim().to_lowercase()).collect();
    let found = db::resolve(conn, groups, root, &paths).await?;
    let mut seen = HashSet::new();
    for ((id, found), config) in ids.iter().zip(found).zip(configs) {
        match found {
            Some(found) if seen.insert(found) => rows.push(Authorization {
                project_id: (!groups).then_some(found),
                group_id: groups.then_some(found),
                config,
            }),
            Some(_) => {}
            None => unresolved.push(json!({
                "section": section,
                "kind": if groups { "group" } else { "project" },
                "id": id,
            })),
        }
    }
    Ok(())
}

fn counts(rows: &[Authorization]) -> Value {
    json!({
        "projects": rows.iter().filter(|r| r.project_id.is_some()).count(),
        "groups": rows.iter().filter(|r| r.group_id.is_some()).count(),
    })
}
