//! Agents and their configuration (SPEC 4.2): registration, and each new `config.yaml`
//! with its `ci_access` and `user_access` paths resolved to projects and groups.

use std::collections::HashSet;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json as JsonResponse;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::auth::Internal;
use crate::db::agents::{self as db, Authorization};
use crate::error::{Error, Result};
use crate::gitlab::agent_config::AgentConfig;
use crate::gitlab::validate;
use crate::http::extract::{from_value, Json, JsonList};
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
    let id = agent_id(&id)?;
    validate::positive("project_id", body.project_id)?;
    validate::dns_label("name", &body.name)?;
    let mut conn = state.db.acquire().await?;
    if !db::project_exists(&mut *conn, body.project_id).await? {
        return Err(Error::NotFound(format!(
            "project {} is not in the identity mirror",
            body.project_id
        )));
    }
    let created = db::upsert(&mut *conn, id, body.project_id, &body.name).await?;
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
    let mut tx = state.db.begin().await?;
    let answer = configure(&mut tx, body.agent_id, &body.agent_config).await?;
    tx.commit().await?;
    Ok(JsonResponse(answer))
}

/// Replaces agent `agent_id`'s configuration (its `config.yaml` as JSON) and authorizations,
/// inside the caller's transaction: the internal endpoint and GitLab's API (SPEC 12.3) both
/// come here. 404 for an agent not registered, 422 for a configuration that is not one.
pub(crate) async fn configure(
    conn: &mut sqlx::PgConnection,
    agent_id: i64,
    agent_config: &Value,
) -> Result<Value> {
    let config: AgentConfig = from_value(agent_config.clone(), "agent_config")?;
    config.validate("agent_config")?;
    let agent = db::find(&mut *conn, agent_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("agent {agent_id} is not registered")))?;
    let root = agent
        .project_full_path
        .split('/')
        .next()
        .unwrap_or_default()
        .to_lowercase();
    let mut resolved = Resolution::default();
    if let Some(ci) = &config.ci_access {
        for (groups, entries) in [(false, &ci.projects), (true, &ci.groups)] {
            let entries = entries
                .iter()
                .map(|e| (e.id.as_str(), serde_json::to_value(e).unwrap_or_default()));
            resolved
                .add(conn, &root, Section::CiAccess, groups, entries.collect())
                .await?;
        }
    }
    if let Some(user) = &config.user_access {
        // Every user_access entry carries the section's `access_as`, as GitLab stores it.
        let entry_config = json!({ "access_as": user.access_as });
        for (groups, entries) in [(false, &user.projects), (true, &user.groups)] {
            let entries = entries
                .iter()
                .map(|e| (e.id.as_str(), entry_config.clone()));
            resolved
                .add(conn, &root, Section::UserAccess, groups, entries.collect())
                .await?;
        }
    }

    let Resolution {
        ci_access,
        user_access,
        unresolved,
    } = resolved;
    db::replace_configuration(conn, agent.id, agent_config, &ci_access, &user_access).await?;
    Ok(json!({
        "agent_id": agent.id,
        "ci_access": counts(&ci_access),
        "user_access": counts(&user_access),
        "unresolved": unresolved,
    }))
}

#[derive(Clone, Copy)]
enum Section {
    CiAccess,
    UserAccess,
}

/// The authorizations of a configuration as they resolve, and the paths that did not.
#[derive(Default)]
struct Resolution {
    ci_access: Vec<Authorization>,
    user_access: Vec<Authorization>,
    unresolved: Vec<Value>,
}

impl Resolution {
    /// Resolves one list of `(path, entry config)`; the first entry for a project or group wins.
    async fn add(
        &mut self,
        conn: &mut sqlx::PgConnection,
        root: &str,
        section: Section,
        groups: bool,
        entries: Vec<(&str, Value)>,
    ) -> Result<()> {
        let paths: Vec<String> = entries
            .iter()
            .map(|(p, _)| p.trim().to_lowercase())
            .collect();
        let found = db::resolve(conn, groups, root, &paths).await?;
        let (rows, name) = match section {
            Section::CiAccess => (&mut self.ci_access, "ci_access"),
            Section::UserAccess => (&mut self.user_access, "user_access"),
        };
        let mut seen = HashSet::new();
        for ((id, config), found) in entries.into_iter().zip(found) {
            match found {
                Some(found) if seen.insert(found) => rows.push(Authorization {
                    project_id: (!groups).then_some(found),
                    group_id: groups.then_some(found),
                    config,
                }),
                Some(_) => {}
                None => self.unresolved.push(json!({
                    "section": name,
                    "kind": if groups { "group" } else { "project" },
                    "id": id,
                })),
            }
        }
        Ok(())
    }
}

fn counts(rows: &[Authorization]) -> Value {
    json!({
        "projects": rows.iter().filter(|r| r.project_id.is_some()).count(),
        "groups": rows.iter().filter(|r| r.group_id.is_some()).count(),
    })
}

/// One of the agent's tokens as GitLab's REST API answers it (`GET
/// /projects/:id/cluster_agents/:agent_id/tokens`, and `.../tokens/:token_id` with
/// `last_used_at`). Other keys are ignored; the secret `token` of a creation answer is never
/// read.
#[derive(Debug, Deserialize)]
pub struct TokenIn {
    id: i64,
    name: String,
    #[serde(default)]
    description: Option<String>,
    /// When present, the agent of the path.
    #[serde(default)]
    agent_id: Option<i64>,
    status: String,
    created_at: DateTime<Utc>,
    /// An integer in GitLab's examples, a string in its table: either is taken.
    #[serde(default)]
    created_by_user_id: Option<UserId>,
    #[serde(default)]
    last_used_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum UserId {
    Number(i64),
    Text(String),
}

/// GitLab's limits of a token's name and description.
const TOKEN_NAME_MAX: usize = 255;
const TOKEN_DESCRIPTION_MAX: usize = 1024;

impl TokenIn {
    fn validate(self, i: usize, agent_id: i64, seen: &mut HashSet<i64>) -> Result<db::Token> {
        let field = |name: &str| format!("[{i}].{name}");
        validate::positive(&field("id"), self.id)?;
        if !seen.insert(self.id) {
            return Err(Error::invalid(
                field("id"),
                format!("token {} is listed twice", self.id),
            ));
        }
        validate::non_empty(&field("name"), &self.name)?;
        validate::text(&field("name"), &self.name, TOKEN_NAME_MAX)?;
        if let Some(description) = &self.description {
            validate::text(&field("description"), description, TOKEN_DESCRIPTION_MAX)?;
        }
        if let Some(other) = self.agent_id.filter(|a| *a != agent_id) {
            return Err(Error::invalid(
                field("agent_id"),
                format!(
                    "token {} is agent {other}'s, not agent {agent_id}'s",
                    self.id
                ),
            ));
        }
        if !matches!(self.status.as_str(), "active" | "revoked") {
            return Err(Error::invalid(
                field("status"),
                format!("`{}` is not one of active, revoked", self.status),
            ));
        }
        let created_by_user_id = match self.created_by_user_id {
            None => None,
            Some(UserId::Number(id)) => Some(id),
            Some(UserId::Text(text)) => Some(text.parse().map_err(|_| {
                Error::invalid(
                    field("created_by_user_id"),
                    format!("`{text}` is not a user id"),
                )
            })?),
        };
        if let Some(user) = created_by_user_id {
            validate::positive(&field("created_by_user_id"), user)?;
        }
        Ok(db::Token {
            id: self.id,
            name: self.name,
            description: self.description,
            status: self.status,
            created_at: self.created_at,
            created_by_user_id,
            last_used_at: self.last_used_at,
        })
    }
}

/// `PUT /api/v4/internal/kubernetes/agents/{id}/tokens`: the agent's tokens as GitLab lists
/// them, replacing those it had, in one transaction.
pub async fn put_tokens(
    _: Internal,
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonList(body): JsonList<TokenIn>,
) -> Result<JsonResponse<Value>> {
    let agent_id = agent_id(&id)?;
    let mut seen = HashSet::new();
    let tokens = body
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.validate(i, agent_id, &mut seen))
        .collect::<Result<Vec<_>>>()?;
    let mut tx = state.db.begin().await?;
    if db::find(&mut *tx, agent_id).await?.is_none() {
        return Err(Error::NotFound(format!(
            "agent {agent_id} is not registered"
        )));
    }
    db::replace_tokens(&mut tx, agent_id, &tokens).await?;
    tx.commit().await?;
    Ok(JsonResponse(json!({
        "agent_id": agent_id,
        "tokens": tokens.len(),
        "active": tokens.iter().filter(|t| t.status == "active").count(),
    })))
}

/// The `{id}` of an agent's path.
fn agent_id(id: &str) -> Result<i64> {
    let parsed: i64 = id
        .parse()
        .map_err(|_| Error::invalid("id", format!("`{id}` is not an agent id")))?;
    validate::positive("id", parsed)?;
    Ok(parsed)
}
