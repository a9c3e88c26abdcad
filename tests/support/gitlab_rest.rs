//! The REST side of the in-process GitLab (`doc/api/*.md`): groups, projects, users, members,
//! cluster agents, repository files, branches, tags and environments, answered in GitLab's shapes
//! with its pagination headers (`X-Page`, `X-Per-Page`, `X-Total`, `X-Total-Pages`,
//! `X-Next-Page`, `X-Prev-Page`, `Link`; keyset `Link` for `/projects?pagination=keyset`), its
//! `RateLimit-*` headers, 401 for a missing or wrong token, 404 as `{"message": "404 ... Not
//! Found"}`. Faults can be queued: a 429 with `Retry-After`, a 500, a slow answer.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// The token the test GitLab accepts for its API (`PRIVATE-TOKEN`): an administrator's
/// ([`API_TOKEN_USER`]), as SPEC 12.1 has it for a whole self-managed instance.
pub const API_TOKEN: &str = "glpat-envlens-sync-0123456789";

/// A `read_api` token of a user who is no administrator (a group access token's bot, say): the
/// REST API answers it as GitLab answers a regular user, `GET /users` without `is_admin`,
/// `external` or e-mail (`doc/api/users.md`, "As a regular user").
pub const REGULAR_API_TOKEN: &str = "glpat-envlens-regular-0123456789";

/// The users of [`API_TOKEN`] and [`REGULAR_API_TOKEN`] (`GET /user`), apart from the test's
/// own users.
pub const API_TOKEN_USER: (i64, &str) = (900_001, "envlens-admin");
pub const REGULAR_API_TOKEN_USER: (i64, &str) = (900_002, "group_100_bot");

/// What `GET /users` and `GET /users/:id` show a user who is no administrator: GitLab's
/// `UserBasic` (id, username, name, state, locked, avatar_url, web_url), whatever the
/// administrator's answer holds.
pub fn as_regular_user_sees(user: &Value) -> Value {
    let mut shown = serde_json::Map::new();
    for key in [
        "id",
        "username",
        "name",
        "state",
        "locked",
        "avatar_url",
        "web_url",
    ] {
        if let Some(v) = user.get(key) {
            shown.insert(key.to_owned(), v.clone());
        }
    }
    Value::Object(shown)
}

/// What the test GitLab holds, in GitLab's answer shapes (our own values).
#[derive(Default)]
pub struct Data {
    pub groups: Vec<Value>,
    pub projects: Vec<Value>,
    pub users: Vec<Value>,
    pub group_members: HashMap<i64, Vec<Value>>,
    pub project_members: HashMap<i64, Vec<Value>>,
    /// Agents by their configuration project.
    pub agents: HashMap<i64, Vec<Value>>,
    /// `(project, file path, ref)` → content.
    pub files: HashMap<(i64, String, String), String>,
    /// Environments by project, as the single-environment answer has them (with
    /// `last_deployment`, `cluster_agent`, `kubernetes_namespace`); lists leave out
    /// `last_deployment`, as GitLab's do.
    pub environments: HashMap<i64, Vec<Value>>,
    /// `(project, branch)` → protected.
    pub branches: HashMap<(i64, String), bool>,
    /// `(project, tag)` → protected, as GitLab computes it from its protected tags (wildcards
    /// included) for `GET /projects/:id/repository/tags/:tag_name`.
    pub tags: HashMap<(i64, String), bool>,
    /// Deployments created through `POST /projects/:id/deployments`, by project, as GitLab
    /// answers them (`doc/api/deployments.md`); ids from 9001.
    pub deployments: HashMap<i64, Vec<Value>>,
    /// Every write (`POST`, `PUT`): method, path and JSON body.
    pub writes: Vec<(String, String, Value)>,
}

/// A fault to answer the next REST call with.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    TooManyRequests {
        retry_after: u64,
    },
    ServerError,
    Slow(Duration),
    /// Answered once [`Rest::held`] is unset: a call as slow as the test wants.
    Held,
}

#[derive(Clone, Default)]
pub struct Rest {
    pub data: Arc<Mutex<Data>>,
    /// Every REST call's path and query, in order.
    pub calls: Arc<Mutex<Vec<String>>>,
    pub faults: Arc<Mutex<VecDeque<Fault>>>,
    /// Every REST call answers 500 while set (GitLab down).
    pub down: Arc<AtomicBool>,
    /// A call given [`Fault::Held`] waits while set.
    pub held: Arc<AtomicBool>,
}

impl Rest {
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    pub fn fault(&self, fault: Fault) {
        self.faults.lock().unwrap().push_back(fault);
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut Data) -> R) -> R {
        f(&mut self.data.lock().unwrap())
    }
}

/// A group as `GET /groups` answers it.
pub fn group(id: i64, full_path: &str) -> Value {
    let path = full_path.rsplit('/').next().unwrap();
    let parent = full_path.rsplit_once('/').map(|_| id - 1);
    json!({"id": id, "web_url": format!("https://gitlab.example.com/groups/{full_path}"), "name": path,
           "path": path, "description": "", "visibility": "private", "full_name": full_path,
           "full_path": full_path, "parent_id": parent, "created_at": "2026-01-01T00:00:00.000Z"})
}

/// A project as `GET /projects` answers it.
pub fn project(id: i64, path_with_namespace: &str, default_branch: Option<&str>) -> Value {
    let path = path_with_namespace.rsplit('/').next().unwrap();
    json!({"id": id, "description": null, "name": path, "path": path,
           "name_with_namespace": path_with_namespace, "path_with_namespace": path_with_namespace,
           "created_at": "2026-01-01T00:00:00.000Z", "default_branch": default_branch,
           "visibility": "private", "archived": false,
           "web_url": format!("https://gitlab.example.com/{path_with_namespace}"),
           "namespace": {"id": 1, "name": "n", "path": "n", "kind": "group", "full_path": "n"}})
}

/// A direct member as the members API answers it.
pub fn member(id: i64, username: &str, access_level: i32) -> Value {
    json!({"id": id, "username": username, "name": username, "state": "active",
           "avatar_url": null, "web_url": format!("https://gitlab.example.com/{username}"),
           "access_level": access_level, "created_at": "2026-01-01T00:00:00.000Z",
           "expires_at": null, "membership_state": "active"})
}

/// A user as `GET /users` answers an administrator.
pub fn user(id: i64, username: &str, admin: bool) -> Value {
    json!({"id": id, "username": username, "name": username, "state": "active", "locked": false,
           "avatar_url": null, "web_url": format!("https://gitlab.example.com/{username}"),
           "created_at": "2026-01-01T00:00:00.000Z", "is_admin": admin, "bot": false,
           "external": false})
}

/// An agent as `GET /projects/:id/cluster_agents` answers it.
pub fn agent(id: i64, name: &str, config_project: (i64, &str)) -> Value {
    json!({"id": id, "name": name,
           "config_project": {"id": config_project.0, "description": null, "name": name,
                              "name_with_namespace": config_project.1, "path": name,
                              "path_with_namespace": config_project.1,
                              "created_at": "2026-01-01T00:00:00.000Z"},
           "created_at": "2026-01-01T00:00:00.000Z", "created_by_user_id": 1})
}

/// An environment as `GET /projects/:id/environments/:environment_id` answers it.
pub fn environment(
    id: i64,
    name: &str,
    last_deployment: Option<i64>,
    agent: Option<Value>,
    namespace: Option<&str>,
) -> Value {
    let slug = name.replace('/', "-");
    let mut env = json!({"id": id, "name": name, "slug": slug, "description": null,
        "external_url": null, "state": "available", "tier": "production",
        "created_at": "2026-01-01T00:00:00.000Z", "updated_at": "2026-01-01T00:00:00.000Z",
        "enable_advanced_logs_querying": false, "logs_api_path": null, "auto_stop_at": null,
        "kubernetes_namespace": namespace, "flux_resource_path": null, "auto_stop_setting": "always"});
    if let Some(d) = last_deployment {
        env["last_deployment"] = json!({"id": d, "iid": d, "ref": "main", "sha": "714a629c0b401fdce83e847fc9589983fc6f46bc",
            "created_at": "2026-01-01T00:00:00.000Z", "status": "success",
            "user": {"id": 2, "name": "dev", "state": "active", "username": "dev"},
            "deployable": {"id": 302, "status": "success", "stage": "deploy", "name": "deploy", "ref": "main", "tag": false}});
    }
    if let Some(agent) = agent {
        env["cluster_agent"] = agent;
    }
    env
}

fn not_found(what: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"message": format!("404 {what} Not Found")})),
    )
        .into_response()
}

fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&segment[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

/// GitLab's offset pagination of `items` at `page`/`per_page`, its headers and `Link`.
fn paginate(uri: &Uri, query: &HashMap<String, String>, items: Vec<Value>) -> Response {
    let per_page: usize = query
        .get("per_page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .clamp(1, 100);
    let page: usize = query
        .get("page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let total = items.len();
    let pages = total.div_ceil(per_page).max(1);
    let slice: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    let mut headers = HeaderMap::new();
    let link = |p: usize| {
        let mut q: Vec<String> = query
            .iter()
            .filter(|(k, _)| k.as_str() != "page")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        q.sort();
        q.push(format!("page={p}"));
        format!("<https://gitlab.example.com{}?{}>", uri.path(), q.join("&"))
    };
    let mut links = Vec::new();
    if page > 1 {
        links.push(format!("{}; rel=\"prev\"", link(page - 1)));
    }
    if page < pages {
        links.push(format!("{}; rel=\"next\"", link(page + 1)));
    }
    links.push(format!("{}; rel=\"first\"", link(1)));
    links.push(format!("{}; rel=\"last\"", link(pages)));
    let set = |h: &mut HeaderMap, k: &'static str, v: String| {
        h.insert(k, HeaderValue::from_str(&v).unwrap());
    };
    set(&mut headers, "link", links.join(", "));
    set(&mut headers, "x-page", page.to_string());
    set(&mut headers, "x-per-page", per_page.to_string());
    set(&mut headers, "x-total", total.to_string());
    set(&mut headers, "x-total-pages", pages.to_string());
    set(
        &mut headers,
        "x-next-page",
        if page < pages {
            (page + 1).to_string()
        } else {
            String::new()
        },
    );
    set(
        &mut headers,
        "x-prev-page",
        if page > 1 {
            (page - 1).to_string()
        } else {
            String::new()
        },
    );
    (headers, axum::Json(Value::Array(slice))).into_response()
}

/// GitLab's keyset pagination (`pagination=keyset&order_by=id&sort=asc`), by `id_after`.
fn keyset(uri: &Uri, query: &HashMap<String, String>, mut items: Vec<Value>) -> Response {
    let per_page: usize = query
        .get("per_page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .clamp(1, 100);
    let after: i64 = query
        .get("id_after")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    items.sort_by_key(|v| v["id"].as_i64().unwrap());
    let rest: Vec<Value> = items
        .into_iter()
        .filter(|v| v["id"].as_i64().unwrap() > after)
        .collect();
    let more = rest.len() > per_page;
    let slice: Vec<Value> = rest.into_iter().take(per_page).collect();
    let mut headers = HeaderMap::new();
    if more {
        let last = slice.last().unwrap()["id"].as_i64().unwrap();
        let link = format!(
            "<https://gitlab.example.com{}?id_after={last}&order_by=id&pagination=keyset&per_page={per_page}&sort=asc>; rel=\"next\"",
            uri.path()
        );
        headers.insert("link", HeaderValue::from_str(&link).unwrap());
    }
    (headers, axum::Json(Value::Array(slice))).into_response()
}

/// Every REST call under `/api/v4` that the router does not route itself.
pub async fn handle(
    State(rest): State<Rest>,
    method: axum::http::Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
    body: axum::body::Bytes,
) -> Response {
    rest.calls.lock().unwrap().push(
        uri.path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
    );
    let fault = rest.faults.lock().unwrap().pop_front();
    match fault {
        Some(Fault::TooManyRequests { retry_after }) => {
            let mut h = HeaderMap::new();
            h.insert(
                "retry-after",
                HeaderValue::from_str(&retry_after.to_string()).unwrap(),
            );
            h.insert("ratelimit-remaining", HeaderValue::from_static("0"));
            return (
                StatusCode::TOO_MANY_REQUESTS,
                h,
                axum::Json(json!({"message": "429 Too Many Requests"})),
            )
                .into_response();
        }
        Some(Fault::ServerError) => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({"message": "500 Internal Server Error"})),
            )
                .into_response();
        }
        Some(Fault::Slow(d)) => tokio::time::sleep(d).await,
        Some(Fault::Held) => {
            while rest.held.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        None => {}
    }
    if rest.down.load(Ordering::SeqCst) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"message": "500 Internal Server Error"})),
        )
            .into_response();
    }
    let admin = match headers.get("private-token").and_then(|v| v.to_str().ok()) {
        Some(API_TOKEN) => true,
        Some(REGULAR_API_TOKEN) => false,
        _ => {
            return (
                StatusCode::UNAUTHORIZED,
                axum::Json(json!({"message": "401 Unauthorized"})),
            )
                .into_response()
        }
    };
    let mut response = if method == axum::http::Method::GET {
        route(&rest, &uri, &query, admin)
    } else {
        write(&rest, &method, &uri, &body)
    };
    let h = response.headers_mut();
    h.insert("ratelimit-limit", HeaderValue::from_static("2000"));
    h.insert("ratelimit-remaining", HeaderValue::from_static("1999"));
    h.insert("ratelimit-reset", HeaderValue::from_static("1893456000"));
    response
}

/// GitLab's 400 for a missing or invalid parameter (`{"error": "<name> is missing"}`).
fn bad_request(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"error": message})),
    )
        .into_response()
}

const DEPLOYMENT_STATUSES: [&str; 4] = ["running", "success", "failed", "canceled"];

/// The writes envlens makes (`doc/api/deployments.md`): `POST /projects/:id/deployments`
/// (`environment`, `sha`, `ref`, `tag`, `status` required; 201 with the deployment, its
/// environment created when GitLab had none of that name) and `PUT
/// /projects/:id/deployments/:deployment_id` (`status` required; 200 with the deployment).
fn write(rest: &Rest, method: &axum::http::Method, uri: &Uri, body: &[u8]) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(body) else {
        return bad_request("the body is not JSON");
    };
    let path = uri.path().to_owned();
    let segments: Vec<String> = path
        .trim_start_matches("/api/v4/")
        .split('/')
        .map(decode)
        .collect();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let mut data = rest.data.lock().unwrap();
    data.writes
        .push((method.to_string(), path.clone(), body.clone()));
    let project = |id: &str| {
        id.parse::<i64>()
            .ok()
            .filter(|id| data.projects.iter().any(|p| p["id"] == *id))
    };
    let status_ok = |v: &Value| v.as_str().is_some_and(|s| DEPLOYMENT_STATUSES.contains(&s));
    match (method.as_str(), s.as_slice()) {
        ("POST", ["projects", id, "deployments"]) => {
            let Some(id) = project(id) else {
                return not_found("Project");
            };
            for field in ["environment", "sha", "ref"] {
                if !body[field].is_string() {
                    return bad_request(&format!("{field} is missing"));
                }
            }
            if !body["tag"].is_boolean() {
                return bad_request("tag is missing");
            }
            if !status_ok(&body["status"]) {
                return bad_request("status does not have a valid value");
            }
            let next = 9001 + data.deployments.values().map(Vec::len).sum::<usize>() as i64;
            let iid = data.deployments.get(&id).map_or(0, Vec::len) as i64 + 1;
            let deployment = json!({"id": next, "iid": iid, "ref": body["ref"], "sha": body["sha"],
                "created_at": "2026-11-27T10:00:00.000Z", "updated_at": "2026-11-27T10:00:00.000Z",
                "status": body["status"], "user": {"id": 1, "name": "envlens", "username": "envlens",
                "state": "active"}, "deployable": null,
                "environment": {"id": 500, "name": body["environment"], "external_url": null}});
            data.deployments
                .entry(id)
                .or_default()
                .push(deployment.clone());
            (StatusCode::CREATED, axum::Json(deployment)).into_response()
        }
        ("PUT", ["projects", id, "deployments", deployment]) => {
            let Some(id) = project(id) else {
                return not_found("Project");
            };
            if !status_ok(&body["status"]) {
                return bad_request("status does not have a valid value");
            }
            let found = data.deployments.get_mut(&id).and_then(|list| {
                list.iter_mut()
                    .find(|d| deployment.parse::<i64>().ok() == d["id"].as_i64())
            });
            match found {
                Some(d) => {
                    d["status"] = body["status"].clone();
                    axum::Json(d.clone()).into_response()
                }
                None => not_found("Deployment"),
            }
        }
        _ => not_found("Path"),
    }
}

/// One REST call, answered as GitLab answers an administrator (`admin`) or a regular user.
fn route(rest: &Rest, uri: &Uri, query: &HashMap<String, String>, admin: bool) -> Response {
    let Some(path) = uri.path().strip_prefix("/api/v4/") else {
        return not_found("Path");
    };
    let segments: Vec<String> = path.split('/').map(decode).collect();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let data = rest.data.lock().unwrap();
    let find_group = |id: &str| {
        data.groups
            .iter()
            .find(|g| {
                id.parse::<i64>().ok() == g["id"].as_i64() || g["full_path"].as_str() == Some(id)
            })
            .cloned()
    };
    let under = |full_path: &str, path: &str| path.starts_with(&format!("{full_path}/"));
    let project_id = |id: &str| {
        id.parse::<i64>()
            .ok()
            .filter(|id| data.projects.iter().any(|p| p["id"] == *id))
    };
    match s.as_slice() {
        ["groups"] => paginate(uri, query, data.groups.clone()),
        ["groups", id] => {
            find_group(id).map_or_else(|| not_found("Group"), |g| axum::Json(g).into_response())
        }
        ["groups", id, "descendant_groups"] => match find_group(id) {
            Some(g) => {
                let fp = g["full_path"].as_str().unwrap();
                let below = data
                    .groups
                    .iter()
                    .filter(|x| under(fp, x["full_path"].as_str().unwrap()))
                    .cloned()
                    .collect();
                paginate(uri, query, below)
            }
            None => not_found("Group"),
        },
        ["groups", id, "projects"] => match find_group(id) {
            Some(g) => {
                let fp = g["full_path"].as_str().unwrap();
                let below = data
                    .projects
                    .iter()
                    .filter(|p| under(fp, p["path_with_namespace"].as_str().unwrap()))
                    .cloned()
                    .collect();
                paginate(uri, query, below)
            }
            None => not_found("Group"),
        },
        ["groups", id, "members"] => match find_group(id) {
            Some(g) => paginate(
                uri,
                query,
                data.group_members
                    .get(&g["id"].as_i64().unwrap())
                    .cloned()
                    .unwrap_or_default(),
            ),
            None => not_found("Group"),
        },
        ["users"] if admin => paginate(uri, query, data.users.clone()),
        ["users"] => paginate(
            uri,
            query,
            data.users.iter().map(as_regular_user_sees).collect(),
        ),
        ["users", id] => data
            .users
            .iter()
            .find(|u| id.parse::<i64>().ok() == u["id"].as_i64())
            .map_or_else(
                || not_found("User"),
                |u| match admin {
                    true => axum::Json(u.clone()).into_response(),
                    false => axum::Json(as_regular_user_sees(u)).into_response(),
                },
            ),
        ["projects"] if query.get("pagination").map(String::as_str) == Some("keyset") => {
            keyset(uri, query, data.projects.clone())
        }
        ["projects"] => paginate(uri, query, data.projects.clone()),
        ["projects", id, rest @ ..] => {
            let Some(id) = project_id(id) else {
                return not_found("Project");
            };
            match rest {
                [] => axum::Json(data.projects.iter().find(|p| p["id"] == id).cloned().unwrap()).into_response(),
                ["members"] => paginate(uri, query, data.project_members.get(&id).cloned().unwrap_or_default()),
                ["cluster_agents"] => paginate(uri, query, data.agents.get(&id).cloned().unwrap_or_default()),
                ["environments"] => {
                    let mut envs = data.environments.get(&id).cloned().unwrap_or_default();
                    if let Some(name) = query.get("name") {
                        envs.retain(|e| e["name"].as_str() == Some(name));
                    }
                    for e in &mut envs {
                        e.as_object_mut().unwrap().remove("last_deployment");
                    }
                    paginate(uri, query, envs)
                }
                ["environments", env] => data
                    .environments
                    .get(&id)
                    .and_then(|envs| envs.iter().find(|e| env.parse::<i64>().ok() == e["id"].as_i64()))
                    .map_or_else(|| not_found("Environment"), |e| axum::Json(e.clone()).into_response()),
                ["repository", "files", file, "raw"] => {
                    let git_ref = query.get("ref").cloned().unwrap_or_default();
                    match data.files.get(&(id, file.to_string(), git_ref)) {
                        Some(content) => content.clone().into_response(),
                        None => not_found("File"),
                    }
                }
                ["repository", "branches", branch] => match data.branches.get(&(id, branch.to_string())) {
                    Some(protected) => axum::Json(json!({"name": branch, "merged": false, "protected": protected,
                        "default": false, "developers_can_push": false, "developers_can_merge": false,
                        "can_push": true, "web_url": "https://gitlab.example.com",
                        "commit": {"id": "714a629c0b401fdce83e847fc9589983fc6f46bc"}})).into_response(),
                    None => not_found("Branch"),
                },
                ["repository", "tags", tag] => match data.tags.get(&(id, tag.to_string())) {
                    Some(protected) => axum::Json(json!({"name": tag, "message": null,
                        "target": "714a629c0b401fdce83e847fc9589983fc6f46bc",
                        "commit": {"id": "714a629c0b401fdce83e847fc9589983fc6f46bc", "short_id": "714a629c",
                                   "title": "Release", "created_at": "2026-01-01T00:00:00.000+00:00",
                                   "parent_ids": [], "message": "Release\n"},
                        "release": null, "protected": protected, "created_at": null})).into_response(),
                    None => not_found("Tag"),
                },
                _ => not_found("Path"),
            }
        }
        _ => not_found("Path"),
    }
}
