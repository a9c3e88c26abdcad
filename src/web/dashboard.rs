//! The dashboard's pages (SPEC 9): each handler reads as the signed-in [`Viewer`] through the
//! GraphQL schema (`data`) and renders with `pages`.

use axum::body::Body;
use axum::extract::{FromRef, FromRequestParts, Query, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use chrono::Utc;
use serde::Deserialize;
use serde_json::json;

use super::data::{self, EnvironmentSummary, FieldError};
use super::pages::groups::{GroupCard, GroupView, HealthCell};
use super::pages::{self, Chrome};
use super::session::Viewer;
use super::{assets, order};
use crate::auth::Session;
use crate::db::pool::Pool;
use crate::error::Error;
use crate::graphql::Engine;
use crate::k8s::grants::AccessType;

/// The dashboard's routes.
pub fn routes<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Engine: FromRef<S>,
    Pool: FromRef<S>,
{
    // Pages and assets gzipped (a thousand resources are some 2 MB of HTML); a followed log
    // is not, as a compressor holds back what it has not yet filled a block with.
    let compressed = Router::new()
        .route("/", get(groups))
        .route("/groups/{*path}", get(group))
        .route("/environments", get(environment))
        .route("/deployments", get(deployment))
        .route("/agents", get(super::agent_page::agent))
        .route("/resources", get(resource))
        .route("/logs", get(logs))
        .route(&format!("{}{{name}}", assets::PREFIX), get(assets::serve))
        .layer(tower_http::compression::CompressionLayer::new());
    Router::new()
        .merge(compressed)
        .route("/logs/stream", get(logs_stream))
        .route(
            pages::flux_actions::ACTION_PATH,
            axum::routing::post(flux_action),
        )
}

/// Who looks: the signed-in viewer, as the GraphQL schema takes a session.
pub struct Reader {
    pub session: Session,
    pub csrf: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for Reader
where
    Pool: FromRef<S>,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let viewer = <Viewer as FromRequestParts<S>>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Reader {
            session: Session {
                user_id: viewer.user_id,
                via: crate::auth::Via::Cookie,
            },
            csrf: Some(viewer.csrf),
        })
    }
}

impl Reader {
    pub(super) fn chrome<'a>(&'a self, title: &'a str, username: Option<&'a str>) -> Chrome<'a> {
        Chrome {
            title,
            username,
            csrf: self.csrf.as_deref(),
            subscription: None,
        }
    }
}

/// The security headers of every page: nothing but envlens itself may be asked for anything.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub(super) fn html(status: StatusCode, markup: maud::Markup) -> Response {
    let mut res = (status, markup.into_string()).into_response();
    let h = res.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    res
}

pub(super) fn error_page(e: &Error, reader: Option<&Reader>) -> Response {
    let status = e.status();
    if status.is_server_error() {
        tracing::warn!(error = %e, "dashboard page failed");
    }
    let message = match e {
        Error::Internal(_) => "envlens could not answer; the error is in its log.".to_owned(),
        other => other.to_string(),
    };
    let chrome = Chrome {
        title: "Error",
        username: None,
        csrf: reader.and_then(|r| r.csrf.as_deref()),
        subscription: None,
    };
    html(status, pages::error(&chrome, status.as_u16(), &message))
}

pub(super) fn not_found(what: &str) -> Error {
    Error::NotFound(format!("{what} does not exist, or you may not see it."))
}

/// A query parameter's value: bounded, no NUL.
fn checked<'a>(name: &str, value: &'a str) -> Result<&'a str, Error> {
    if value.len() > 1024 || value.contains('\0') {
        return Err(Error::BadRequest(format!(
            "{name} must be at most 1024 bytes without NUL"
        )));
    }
    Ok(value)
}

pub(super) fn required<'a>(name: &str, value: &'a Option<String>) -> Result<&'a str, Error> {
    match value.as_deref() {
        Some(v) if !v.is_empty() => checked(name, v),
        _ => Err(Error::BadRequest(format!(
            "the query parameter {name} is required"
        ))),
    }
}

// --- `/`: the groups ----------------------------------------------------------------------

async fn groups(
    State(engine): State<Engine>,
    State(pool): State<Pool>,
    reader: Reader,
) -> Response {
    match groups_inner(&engine, &pool, &reader).await {
        Ok(r) => r,
        Err(e) => error_page(&e, Some(&reader)),
    }
}

/// The signed-in user, and the reading rules' view of them, for the pages that read the
/// database beside the GraphQL schema.
pub(super) async fn signed_in(
    pool: &Pool,
    reader: &Reader,
) -> Result<(crate::db::identity::User, crate::db::read::Viewer), Error> {
    let mut conn = pool.acquire().await?;
    let user = crate::db::identity::find_user(&mut *conn, reader.session.user_id)
        .await?
        .ok_or_else(|| Error::Unauthorized("unknown user".into()))?;
    let viewer = crate::db::read::Viewer {
        user_id: user.id,
        admin: user.admin,
    };
    Ok((user, viewer))
}

async fn groups_inner(engine: &Engine, pool: &Pool, reader: &Reader) -> Result<Response, Error> {
    let (user, viewer) = signed_in(pool, reader).await?;
    let rows = {
        let mut conn = pool.acquire().await?;
        crate::db::read::visible_groups(&mut *conn, viewer, 200).await?
    };
    let mut cards = Vec::new();
    for row in rows {
        let listed = environments(
            engine,
            reader.session,
            &row.full_path,
            Some("PRODUCTION"),
            None,
            1,
        )
        .await?;
        cards.push((row.full_path, listed.environments, listed.truncated));
    }
    let cards = cards
        .into_iter()
        .map(|(full_path, envs, more)| GroupCard {
            full_path,
            environments: envs
                .into_iter()
                .map(|e| {
                    let h = health_cell(&e);
                    (e, h)
                })
                .collect(),
            more,
        })
        .collect();
    let mut chrome = reader.chrome("Groups", Some(&user.username));
    chrome.subscription = Some((pages::ENVIRONMENTS_UPDATED, json!({})));
    Ok(html(
        StatusCode::OK,
        pages::groups::groups_page(&chrome, cards),
    ))
}

/// A group's environments, worst kept health first, at most `pages` pages of 100.
struct Listed {
    environments: Vec<EnvironmentSummary>,
    /// More matched than were read.
    truncated: bool,
    username: Option<String>,
    /// How many of the tier's environments have each health, among those the viewer sees.
    counts: Vec<data::HealthCount>,
}

async fn environments(
    engine: &Engine,
    session: Session,
    path: &str,
    tier: Option<&str>,
    search: Option<&str>,
    pages: usize,
) -> Result<Listed, Error> {
    let mut listed = Listed {
        environments: Vec::new(),
        truncated: true,
        username: None,
        counts: Vec::new(),
    };
    let mut after: Option<String> = None;
    for _ in 0..pages {
        let (data, _): (data::GroupData, _) = data::run(
            engine,
            session,
            data::GROUP_ENVIRONMENTS,
            json!({"path": path, "tier": tier, "search": search, "after": after,
                   "counts": after.is_none()}),
        )
        .await?;
        let Some(group) = data.group else {
            return Err(not_found(&format!("The group {path}")));
        };
        listed.username = data.current_user.map(|u| u.username);
        if let Some(counts) = group.environment_health_counts {
            listed.counts = counts;
        }
        listed.environments.extend(group.environments.nodes);
        if !group.environments.page_info.has_next_page {
            listed.truncated = false;
            break;
        }
        after = group.environments.page_info.end_cursor;
    }
    Ok(listed)
}

/// An environment's health as kept (SPEC 18): none without an agent; without a kept health
/// the viewer may see, why not.
fn health_cell(env: &EnvironmentSummary) -> HealthCell {
    match (&env.health, &env.cluster_agent) {
        (Some(h), _) => HealthCell::Status {
            status: h.status.clone(),
            message: h.message.clone(),
        },
        (None, None) => HealthCell::NoAgent,
        (None, Some(_)) => HealthCell::Unavailable(
            "No health shown: you may not use its agent, or its group was never read".into(),
        ),
    }
}

// --- `/groups/<path>` ---------------------------------------------------------------------

#[derive(Deserialize)]
struct GroupQuery {
    tier: Option<String>,
    search: Option<String>,
}

async fn group(
    State(engine): State<Engine>,
    reader: Reader,
    axum::extract::Path(path): axum::extract::Path<String>,
    query: Result<Query<GroupQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = async {
        let Query(q) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
        let path = checked("the group path", path.trim_matches('/'))?.to_owned();
        let tier = match q.tier.as_deref().filter(|t| !t.is_empty()) {
            None => None,
            Some(t) if order::TIERS.contains(&t) => Some(t.to_owned()),
            Some(t) => {
                return Err(Error::BadRequest(format!(
                    "tier must be one of {}, not {t:?}",
                    order::TIERS.join(", ")
                )))
            }
        };
        let search = checked("search", q.search.as_deref().unwrap_or(""))?
            .trim()
            .to_owned();
        let upper = tier.as_deref().map(str::to_ascii_uppercase);
        let listed = environments(
            &engine,
            reader.session,
            &path,
            upper.as_deref(),
            Some(search.as_str()).filter(|s| !s.is_empty()),
            3,
        )
        .await?;
        let (truncated, username) = (listed.truncated, listed.username);
        let counts = listed
            .counts
            .into_iter()
            .map(|c| (c.status, c.count))
            .collect();
        let rows = listed
            .environments
            .into_iter()
            .map(|e| {
                let h = health_cell(&e);
                (e, h)
            })
            .collect();
        let mut chrome = reader.chrome(&path, username.as_deref());
        chrome.subscription = Some((pages::ENVIRONMENTS_UPDATED, json!({"groupPath": path})));
        let view = GroupView {
            full_path: path.clone(),
            rows,
            counts,
            tier,
            search,
            truncated,
        };
        Ok::<_, Error>(html(
            StatusCode::OK,
            pages::groups::group_page(&chrome, view, Utc::now()),
        ))
    }
    .await;
    result.unwrap_or_else(|e| error_page(&e, Some(&reader)))
}

// --- `/environments?project=&name=` -------------------------------------------------------

#[derive(Deserialize)]
struct EnvironmentQuery {
    project: Option<String>,
    name: Option<String>,
    view: Option<String>,
}

async fn environment(
    State(engine): State<Engine>,
    reader: Reader,
    query: Result<Query<EnvironmentQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = async {
        let Query(q) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
        let project = required("project", &q.project)?;
        let name = required("name", &q.name)?;
        let tab = match q.view.as_deref() {
            None | Some("") | Some("tree") => pages::environment::Tab::Tree,
            Some("graph") => pages::environment::Tab::Graph,
            Some(other) => {
                return Err(Error::BadRequest(format!(
                    "view must be tree or graph, not {other:?}"
                )))
            }
        };
        let (data, errors): (data::EnvironmentData, Vec<FieldError>) = data::run(
            &engine,
            reader.session,
            data::ENVIRONMENT,
            json!({"project": project, "name": name}),
        )
        .await?;
        let username = data.current_user.map(|u| u.username);
        let project_row = data
            .project
            .ok_or_else(|| not_found(&format!("The project {project}")))?;
        let environment = project_row
            .environment
            .ok_or_else(|| not_found(&format!("The environment {name} of {project}")))?;
        let group_error = errors
            .iter()
            .find(|e| e.under("resourceGroup"))
            .map(|e| e.message.clone());
        let snapshots_refused = refused_deployments(&errors);
        let title = format!("{} · {}", environment.name, project_row.full_path);
        let mut chrome = reader.chrome(&title, username.as_deref());
        chrome.subscription = Some((
            pages::RESOURCE_GROUP_UPDATED,
            json!({"environmentId": environment.id}),
        ));
        let view = pages::environment::EnvironmentView {
            project_path: project_row.full_path.clone(),
            environment,
            group_error,
            snapshots_refused,
            tab,
        };
        Ok::<_, Error>(html(
            StatusCode::OK,
            pages::environment::environment_page(&chrome, &view, Utc::now()),
        ))
    }
    .await;
    result.unwrap_or_else(|e| error_page(&e, Some(&reader)))
}

// --- `POST /environments/flux-actions`: a Flux action's button -----------------------------

/// A button of the environment page (`pages::flux_actions`): the action asked through the
/// same mutation as the API, as the viewer, then back to the page, whose audit shows how it
/// went. Only refusals without an audit row (bad input) answer a page of their own.
async fn flux_action(
    State(engine): State<Engine>,
    viewer: Viewer,
    body: axum::body::Bytes,
) -> Response {
    let reader = Reader {
        session: Session {
            user_id: viewer.user_id,
            via: crate::auth::Via::Cookie,
        },
        csrf: Some(viewer.csrf.clone()),
    };
    let result = async {
        let field = |name: &str| {
            url::form_urlencoded::parse(&body)
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.into_owned())
        };
        viewer.check_csrf(field(super::session::CSRF_FIELD).as_deref())?;
        let (project, environment) = (field("project"), field("environment"));
        let project = required("project", &project)?;
        let environment = required("environment", &environment)?;
        let action = field("action");
        let document = data::FLUX_ACTIONS
            .iter()
            .find(|(name, _)| Some(*name) == action.as_deref())
            .map(|(_, document)| *document)
            .ok_or_else(|| {
                Error::BadRequest("action must be reconcile, suspend or resume".into())
            })?;
        let mut input = serde_json::Map::new();
        for (key, name) in [
            ("environmentId", "environment_id"),
            ("apiVersion", "api_version"),
            ("kind", "kind"),
            ("namespace", "namespace"),
            ("name", "name"),
        ] {
            let value = field(name);
            input.insert(key.into(), json!(required(name, &value)?));
        }
        let (answer, _): (serde_json::Value, Vec<FieldError>) =
            data::run(&engine, reader.session, document, json!({"input": input})).await?;
        let result = &answer["result"];
        if result["action"].is_null() {
            let words = result["errors"][0]
                .as_str()
                .unwrap_or("The action was refused.");
            return Err(Error::BadRequest(words.to_owned()));
        }
        Ok(super::session::see_other(
            &pages::environment_href(project, environment),
            None,
        ))
    }
    .await;
    result.unwrap_or_else(|e| error_page(&e, Some(&reader)))
}

/// The indices of the deployments whose snapshot fields the API refused (`deployments.nodes.<i>
/// .snapshot…`).
fn refused_deployments(errors: &[FieldError]) -> std::collections::HashSet<usize> {
    errors
        .iter()
        .filter(|e| e.under("snapshot") || e.under("snapshotStatus"))
        .filter_map(|e| {
            let at = e.path.iter().position(|p| p == "nodes")?;
            e.path.get(at + 1)?.parse().ok()
        })
        .collect()
}

// --- `/deployments?project=&iid=` ---------------------------------------------------------

#[derive(Deserialize)]
struct DeploymentQuery {
    project: Option<String>,
    iid: Option<String>,
}

async fn deployment(
    State(engine): State<Engine>,
    reader: Reader,
    query: Result<Query<DeploymentQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = async {
        let Query(q) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
        let project = required("project", &q.project)?;
        let iid = required("iid", &q.iid)?;
        if !iid.bytes().all(|b| b.is_ascii_digit()) || iid.len() > 18 {
            return Err(Error::BadRequest(format!(
                "iid must be a deployment's number, not {iid:?}"
            )));
        }
        let (data, errors): (data::DeploymentData, Vec<FieldError>) = data::run(
            &engine,
            reader.session,
            data::DEPLOYMENT,
            json!({"project": project, "iid": iid}),
        )
        .await?;
        let username = data.current_user.map(|u| u.username);
        let project_row = data
            .project
            .ok_or_else(|| not_found(&format!("The project {project}")))?;
        let deployment = project_row
            .deployment
            .ok_or_else(|| not_found(&format!("Deployment #{iid} of {project}")))?;
        // A refusal (no user_access) or a failure to read the history is said on the page;
        // the deployment itself stays readable.
        let history_error = errors
            .iter()
            .find(|e| e.under("snapshot") || e.under("changes") || e.under("snapshotStatus"))
            .map(|e| match e.code.as_str() {
                "FORBIDDEN" => format!("What this deployment changed is not shown: {}", e.message),
                _ => format!("What this deployment changed cannot be read: {}", e.message),
            });
        let health_error = errors
            .iter()
            .find(|e| e.under("resourceGroup"))
            .map(|e| e.message.clone());
        let title = format!("Deployment #{iid} · {}", project_row.full_path);
        let chrome = reader.chrome(&title, username.as_deref());
        let view = pages::deployment::DeploymentView {
            project_path: project_row.full_path.clone(),
            deployment,
            history_error,
            health_error,
        };
        Ok::<_, Error>(html(
            StatusCode::OK,
            pages::deployment::deployment_page(&chrome, &view, Utc::now()),
        ))
    }
    .await;
    result.unwrap_or_else(|e| error_page(&e, Some(&reader)))
}

// --- `/resources?project=&environment=&uid=` and a Pod's logs ------------------------------

#[derive(Deserialize)]
struct ResourceQuery {
    project: Option<String>,
    environment: Option<String>,
    uid: Option<String>,
    container: Option<String>,
}

/// A resource of an environment's group as the viewer sees it, with the agent that reaches it.
struct Found {
    project: String,
    environment: String,
    username: Option<String>,
    agent: Option<data::AgentRef>,
    resource: data::Resource,
}

async fn find_resource(
    engine: &Engine,
    session: Session,
    q: &ResourceQuery,
) -> Result<Found, Error> {
    let project = required("project", &q.project)?;
    let name = required("environment", &q.environment)?;
    let uid = required("uid", &q.uid)?;
    let (data, errors): (data::EnvironmentData, _) = data::run(
        engine,
        session,
        data::RESOURCE,
        json!({"project": project, "name": name}),
    )
    .await?;
    let project_row = data
        .project
        .ok_or_else(|| not_found(&format!("The project {project}")))?;
    let environment = project_row
        .environment
        .ok_or_else(|| not_found(&format!("The environment {name} of {project}")))?;
    if let Some(e) = errors.iter().find(|e| e.under("resourceGroup")) {
        return Err(match e.code.as_str() {
            "FORBIDDEN" => Error::Forbidden(e.message.clone()),
            _ => Error::BadGateway(e.message.clone()),
        });
    }
    let resource = environment
        .resource_group
        .and_then(|g| g.resources.into_iter().find(|r| r.uid == uid))
        .ok_or_else(|| not_found("The resource"))?;
    Ok(Found {
        project: project_row.full_path,
        environment: environment.name,
        username: data.current_user.map(|u| u.username),
        agent: environment.cluster_agent,
        resource,
    })
}

async fn resource(
    State(engine): State<Engine>,
    reader: Reader,
    query: Result<Query<ResourceQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = async {
        let Query(q) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
        let found = find_resource(&engine, reader.session, &q).await?;
        let title = format!("{} {}", found.resource.kind, found.resource.name);
        let chrome = reader.chrome(&title, found.username.as_deref());
        let view = pages::resource::ResourceView {
            project_path: &found.project,
            environment: &found.environment,
            resource: &found.resource,
        };
        Ok::<_, Error>(html(
            StatusCode::OK,
            pages::resource::resource_page(&chrome, &view, Utc::now()),
        ))
    }
    .await;
    result.unwrap_or_else(|e| error_page(&e, Some(&reader)))
}

/// The Pod and container a logs request names, checked against the group.
async fn pod_and_container(
    engine: &Engine,
    session: Session,
    q: &ResourceQuery,
) -> Result<(Found, String, Vec<String>), Error> {
    let found = find_resource(engine, session, q).await?;
    if found.resource.kind != "Pod" {
        return Err(Error::BadRequest("only a Pod has logs".into()));
    }
    let containers =
        pages::resource::containers(found.resource.manifest.as_ref().unwrap_or(&json!({})));
    let container = match q.container.as_deref().filter(|c| !c.is_empty()) {
        Some(c) if containers.iter().any(|x| x == c) => c.to_owned(),
        Some(c) => return Err(Error::NotFound(format!("the Pod has no container {c:?}"))),
        None => containers
            .first()
            .cloned()
            .ok_or_else(|| Error::NotFound("the Pod has no containers".into()))?,
    };
    Ok((found, container, containers))
}

/// The container's log from the cluster, as the viewer (impersonated when the agent says so),
/// after the same `user_access` check as the resource group.
async fn pod_log(
    engine: &Engine,
    pool: &Pool,
    session: Session,
    found: &Found,
    container: &str,
    follow: bool,
) -> Result<axum::http::Response<kube::client::Body>, Error> {
    let agent = found
        .agent
        .as_ref()
        .ok_or_else(|| not_found("The environment's agent"))?;
    let agent_id = agent
        .number()
        .ok_or_else(|| not_found("The environment's agent"))?;
    let agent_project = agent
        .project
        .as_ref()
        .map(|p| p.full_path.clone())
        .unwrap_or_default();
    let grant = {
        let mut conn = pool.acquire().await?;
        engine
            .clusters
            .grants
            .authorize(&mut *conn, agent_id, session.user_id)
            .await?
    };
    let grant =
        grant.ok_or_else(|| Error::Forbidden(crate::graphql::FORBIDDEN_MESSAGE.to_owned()))?;
    let cluster = engine
        .clusters
        .for_agent(agent_id, &agent_project, &agent.name)
        .await?;
    let namespace = found.resource.namespace.as_deref().unwrap_or("default");
    let uri = format!(
        "/api/v1/namespaces/{}/pods/{}/log{}",
        pages::encode(namespace),
        pages::encode(&found.resource.name),
        pages::query(&[
            ("container", container),
            ("tailLines", "500"),
            ("limitBytes", "1048576"),
            ("follow", if follow { "true" } else { "false" }),
        ])
    );
    let mut request = axum::http::Request::new(kube::client::Body::from(Vec::new()));
    *request.uri_mut() = uri
        .parse()
        .map_err(|_| Error::BadRequest("the Pod's name cannot be part of a path".into()))?;
    let headers = request.headers_mut();
    for (name, value) in grant.impersonation_headers(AccessType::from(session.via)) {
        headers.append(name, value.clone());
    }
    let response = tokio::time::timeout(
        engine.clusters.response_timeout,
        cluster.client.send(request),
    )
    .await
    .map_err(|_| Error::BadGateway("the cluster did not answer in time".into()))?
    .map_err(|e| Error::BadGateway(format!("the cluster cannot be reached: {e}")))?;
    if !response.status().is_success() {
        let status = response.status();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("the cluster answered {status}"));
        return Err(Error::BadGateway(message));
    }
    Ok(response)
}

async fn logs(
    State(engine): State<Engine>,
    State(pool): State<Pool>,
    reader: Reader,
    query: Result<Query<ResourceQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = async {
        let Query(q) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
        let (found, container, containers) = pod_and_container(&engine, reader.session, &q).await?;
        let tail = match pod_log(&engine, &pool, reader.session, &found, &container, false).await {
            Ok(response) => {
                let body = http_body_util::BodyExt::collect(response.into_body())
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                Ok(String::from_utf8_lossy(&body).into_owned())
            }
            Err(e) => Err(e.to_string()),
        };
        let follow = format!(
            "/logs/stream{}",
            pages::query(&[
                ("project", &found.project),
                ("environment", &found.environment),
                ("uid", &found.resource.uid),
                ("container", &container),
            ])
        );
        let title = format!("Logs of {}", found.resource.name);
        let chrome = reader.chrome(&title, found.username.as_deref());
        let view = pages::resource::LogsView {
            project_path: &found.project,
            environment: &found.environment,
            pod: &found.resource,
            container: &container,
            containers,
            tail,
            follow,
        };
        Ok::<_, Error>(html(
            StatusCode::OK,
            pages::resource::logs_page(&chrome, &view),
        ))
    }
    .await;
    result.unwrap_or_else(|e| error_page(&e, Some(&reader)))
}

/// The container's log, followed: the cluster's stream passed through as it comes.
async fn logs_stream(
    State(engine): State<Engine>,
    State(pool): State<Pool>,
    reader: Reader,
    query: Result<Query<ResourceQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let result = async {
        let Query(q) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
        let (found, container, _) = pod_and_container(&engine, reader.session, &q).await?;
        let response = pod_log(&engine, &pool, reader.session, &found, &container, true).await?;
        let mut res = Response::new(Body::new(response.into_body()));
        let h = res.headers_mut();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        h.insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
        Ok::<_, Error>(res)
    }
    .await;
    result.unwrap_or_else(|e| e.into_response())
}
