//! GraphQL at `POST /api/graphql` (SPEC 5.1), and its explorer at `GET /-/graphql-explorer`.

mod documents;
mod loaders;
mod resource_group;
mod types;

use async_graphql::{EmptyMutation, EmptySubscription, Schema};
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::auth::{verify_session, CurrentUser};
use crate::db::read::Viewer;
use crate::error::Error;
use crate::extract::read_body;
use crate::state::AppState;
use types::Query;

pub type EnvlensSchema = Schema<Query, EmptyMutation, EmptySubscription>;

/// Deep enough for the dashboard queries (project > environments > edges > node >
/// lastDeployment > agent > project > fullPath is 8), shallow enough to stop abuse.
const MAX_DEPTH: usize = 12;
/// Each field costs 1, lists their page size times their children.
const MAX_COMPLEXITY: usize = 5000;

pub fn schema() -> EnvlensSchema {
    Schema::build(Query, EmptyMutation, EmptySubscription)
        .limit_depth(MAX_DEPTH)
        .limit_complexity(MAX_COMPLEXITY)
        .finish()
}

/// The SDL committed as `schema.graphql`.
pub fn sdl() -> String {
    schema().sdl()
}

/// Only POST with a JSON body, after authentication (and, for the session cookie, its CSRF
/// check): a GET or a form post could otherwise be forged by another site.
///
/// The request takes one connection from the pool and runs every statement on it, from the
/// session's user to the last loader (see `loaders::Db`).
pub async fn execute(State(state): State<AppState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let session = match verify_session(&parts, &state.keys) {
        Ok(session) => session,
        Err(e) => return error_response(&e),
    };
    let mut conn = match state.db.acquire().await {
        Ok(conn) => conn,
        Err(e) => return error_response(&e.into()),
    };
    let user = match CurrentUser::find(&mut *conn, session).await {
        Ok(user) => user,
        Err(e) => return error_response(&e),
    };
    let json = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    if !json {
        let body = json!({"errors": [{"message": "send the query as POST with Content-Type: application/json",
                                      "extensions": {"code": "BAD_REQUEST"}}]});
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, Json(body)).into_response();
    }
    let body = match read_body(Request::from_parts(parts, body), &state).await {
        Ok(body) => body,
        Err(e) => return error_response(&e),
    };
    let mut request: async_graphql::Request = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return error_response(&Error::BadRequest(format!("not a GraphQL request: {e}"))),
    };
    documents::prepare(&mut request);
    let viewer = Viewer {
        user_id: user.id,
        admin: user.admin,
    };
    let request = request
        .data(viewer)
        .data(loaders::loader(state.db.clone(), conn, viewer))
        .data(user)
        .data(state.clusters.clone());
    Json(state.schema.execute(request).await).into_response()
}

/// An error before execution, in GraphQL's shape, with the HTTP status of its kind.
fn error_response(e: &Error) -> Response {
    let error = e.to_graphql();
    let body = json!({ "errors": [{ "message": error.message, "extensions": error.extensions }] });
    (e.status(), Json(body)).into_response()
}

/// GraphiQL, with a header editor for `Authorization: Bearer <envlens token --user ...>`.
pub async fn explorer() -> Html<&'static str> {
    Html(include_str!("explorer.html"))
}
