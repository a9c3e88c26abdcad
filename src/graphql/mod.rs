//! GraphQL at `POST /api/graphql` (SPEC 5.1), and its explorer at `GET /-/graphql-explorer`.

mod agents;
mod away;
mod causes;
mod connection;
mod cost;
mod documents;
mod environment_settings;
mod events;
pub mod explorer;
mod flux_actions;
mod gitops;
mod history;
mod history_access;
mod inputs;
mod limits;
mod loaders;
mod mutations;
mod org;
mod plain;
mod resource_group;
mod splice;
mod subscriptions;
mod through_owner;
mod types;

pub use limits::{Figures, MAX_COMPLEXITY, MAX_DEPTH};
pub use subscriptions::health_keeper::Keeper as HealthKeeper;
pub use subscriptions::{socket::upgrade as subscribe, Live, Origins, SocketLimits};

use std::sync::Arc;

use async_graphql::dataloader::{DataLoader, HashMapCache};
use async_graphql::{Schema, ValidationMode};
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::auth::{authenticate, Keys};
use crate::config::Limits;
use crate::db::lease::Leases;
use crate::error::Error;
use crate::gitlab::tokens::Purpose;
use crate::gitlab::Instance;
use crate::http::extract::read_body;
use crate::k8s::clusters::Clusters;
use crate::resources::health::Customizations;
use loaders::SessionUser;
use mutations::Mutation;
pub use resource_group::FORBIDDEN_MESSAGE;
use subscriptions::Subscription;
use types::Query;

pub type EnvlensSchema = Schema<Query, Mutation, Subscription>;

fn schema(mode: ValidationMode) -> EnvlensSchema {
    limits::limited(Schema::build(Query, Mutation::default(), Subscription))
        .validation_mode(mode)
        .finish()
}

/// The schema with each validation mode: strict for a request not known to pass, fast (the
/// complexity and depth limits only) for one whose document, operation and variables' kinds
/// already passed (see `documents`).
#[derive(Clone)]
pub struct Schemas {
    pub(crate) strict: EnvlensSchema,
    fast: EnvlensSchema,
    /// Measures a request refused at a limit, for GitLab's wording of the refusal.
    measuring: EnvlensSchema,
    /// The JSON of the watch cache's shared groups as `POST /api/graphql` answered them
    /// (`splice`): a warm view writes its answer without building it again.
    rendered: Arc<splice::Rendered<crate::resources::group::ResourceGroup>>,
    /// Crashed containers' previous logs read lately, per viewer (SPEC 17).
    logs: Arc<crate::k8s::previous_log::PreviousLogs>,
    /// Those groups as shown while their agent is away (`away`), one each, so rendered once too.
    away: Arc<away::AwayViews>,
}

impl Schemas {
    pub fn new() -> Self {
        Schemas {
            strict: schema(ValidationMode::Strict),
            fast: schema(ValidationMode::Fast),
            measuring: limits::measuring(),
            rendered: Arc::default(),
            logs: Arc::default(),
            away: Arc::default(),
        }
    }
}

impl Default for Schemas {
    fn default() -> Self {
        Self::new()
    }
}

/// The SDL committed as `schema.graphql`.
pub fn sdl() -> String {
    schema(ValidationMode::Strict).sdl()
}

/// What the query `text` costs with `variables`, as `POST /api/graphql` counts it against
/// [`MAX_COMPLEXITY`] and [`MAX_DEPTH`]; the first error of a text that cannot be measured.
pub async fn figures(text: &str, variables: serde_json::Value) -> Result<Figures, String> {
    let doc = async_graphql::parser::parse_query(text).map_err(|e| e.to_string())?;
    measure_once(doc, variables).await
}

/// What `POST /api/graphql` makes of a query text before anything runs: the bounds on its size
/// and names, the parse, the bounds on its selections and inputs (`documents`), then its
/// figures against [`MAX_COMPLEXITY`] and [`MAX_DEPTH`]. The text of the first refusal, or the
/// figures (which may still be over a limit: [`Figures::refusal`] words that). The document
/// parser is the server's widest face to outside input, so this is also what the fuzz target
/// `graphql` drives.
pub async fn admit(text: &str, variables: serde_json::Value) -> Result<Figures, String> {
    let doc = documents::parse(text).map_err(|e| e.message)?;
    documents::checks(&doc)?;
    measure_once(doc, variables).await
}

/// The figures of a parsed document, measured by one schema kept for the process.
async fn measure_once(
    doc: async_graphql::parser::types::ExecutableDocument,
    variables: serde_json::Value,
) -> Result<Figures, String> {
    static MEASURING: std::sync::OnceLock<EnvlensSchema> = std::sync::OnceLock::new();
    let schema = MEASURING.get_or_init(limits::measuring);
    let variables = async_graphql::Variables::from_json(variables);
    limits::measure(schema, doc, variables, None)
        .await
        .map_err(|errors| {
            errors
                .first()
                .map_or_else(|| "not measured".to_owned(), |e| e.message.clone())
        })
}

/// What queries run with, taken from the state as one part: the schemas, the connections a
/// request borrows, and the clusters and health scripts the resource group reads.
#[derive(Clone)]
pub struct Engine {
    pub schemas: Schemas,
    pub reads: Leases,
    pub clusters: Arc<Clusters>,
    pub health: Arc<Customizations>,
    /// Writes the health changes of the groups that queries read (SPEC 17).
    pub recorder: subscriptions::health_record::Recorder,
    /// Views of connections other replicas own go through them (SPEC 16).
    pub forward: crate::replicas::forward::Forward,
}

/// Only POST with a JSON body, after authentication (and, for the session cookie, its CSRF
/// check): a GET or a form post could otherwise be forged by another site.
///
/// The request borrows one connection (`db::lease`) and runs every statement on it (see
/// `loaders::Db`). The session's user is read by the first statement that needs them, for
/// the blueprint query together with its project (one round trip fewer); whatever the query
/// reads, the answer is a 401 without data when the mirror does not know the user, as it was
/// when the user was read first.
pub async fn execute(
    State(engine): State<Engine>,
    State(keys): State<Arc<Keys>>,
    State(limits): State<Limits>,
    State(gitlab): State<Option<Arc<Instance>>>,
    req: Request,
) -> Response {
    let Engine {
        schemas,
        reads,
        clusters,
        health,
        recorder,
        forward,
    } = engine;
    let (parts, body) = req.into_parts();
    let request_id = parts
        .extensions
        .get::<crate::telemetry::RequestId>()
        .cloned();
    let session = match authenticate(&parts, &keys, gitlab.as_deref(), Purpose::Api).await {
        Ok(session) => session,
        Err(e) => return error_response(&e),
    };
    // What another replica authenticates the viewer with, should a view go through it.
    let credential = crate::auth::Credential::of(&parts);
    // The connection is borrowed once the body is in: a slow upload must not hold one.
    let db = Arc::new(loaders::loader(reads, SessionUser::new(session)));
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
        return unless_unknown(
            &db,
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, Json(body)).into_response(),
        )
        .await;
    }
    let body = match read_body(Request::from_parts(parts, body), limits.body_limit).await {
        Ok(body) => body,
        Err(e) => return unless_unknown(&db, error_response(&e)).await,
    };
    // One JSON object, nothing after it (`from_slice` refuses trailing bytes); strings are
    // judged by `inputs`, as GraphQL input, below.
    let object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let parsed = serde_json::from_slice::<RequestBody>(&body)
        .map_err(|e| e.to_string())
        .and_then(|b| {
            object
                .then_some(b)
                .ok_or("the body must be a JSON object".into())
        });
    let mut request = match parsed {
        Ok(body) => body.into_request(),
        Err(e) => {
            let e = Error::BadRequest(format!("not a GraphQL request: {e}"));
            return unless_unknown(&db, error_response(&e)).await;
        }
    };
    let prepared = if documents::is_kept(&request.query) {
        documents::prepare(&mut request)
    } else {
        // Parsing a new text can take milliseconds: off the runtime's threads, a few at a time.
        let _slot = cost::parse_slot().await;
        let parsed = tokio::task::spawn_blocking(move || {
            let prepared = documents::prepare(&mut request);
            (request, prepared)
        })
        .await;
        match parsed {
            Ok((parsed, prepared)) => {
                request = parsed;
                prepared
            }
            Err(e) => return error_response(&Error::Internal(e.into())),
        }
    };
    let prepared = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            let response = async_graphql::Response::from_errors(vec![error]);
            return unless_unknown(&db, Json(response).into_response()).await;
        }
    };
    // Borrowed now, so that a database away is one 503 rather than an error per field.
    if let Err(e) = db.loader().conn().await {
        return error_response(&e);
    }
    // Resource groups answer pre-rendered text through `splices` (see `splice`), spliced
    // into the serialized answer below.
    let splices = Arc::new(splice::Splices::new());
    let mut request = request
        .data(db.clone())
        .data(clusters)
        .data(health)
        .data(recorder)
        .data(forward)
        .data(credential)
        .data(splices.clone())
        .data(schemas.rendered.clone())
        .data(schemas.logs.clone())
        .data(schemas.away.clone());
    if let Some(id) = request_id {
        request = request.data(id);
    }
    let schema = if prepared.validated() {
        &schemas.fast
    } else {
        &schemas.strict
    };
    let retained = limits::Retained::of(&request);
    let mut response = schema.execute(request).await;
    if let Some(doc) = prepared.document() {
        retained
            .explain(&schemas.measuring, doc, &mut response)
            .await;
    }
    for error in &mut response.errors {
        with_code(error);
    }
    if response.errors.is_empty() {
        prepared.passed();
    }
    if response.errors.iter().any(unavailable) {
        db.loader().discard().await;
    }
    // A query that read nothing (`{ __typename }`, or one refused by validation) has not
    // read the user yet.
    unless_unknown(&db, spliced(&response, &splices)).await
}

/// `response` serialized as `Json` would, each placeholder of `splices` replaced by its text.
fn spliced(response: &async_graphql::Response, splices: &splice::Splices) -> Response {
    if splices.is_empty() {
        return Json(response).into_response();
    }
    match serde_json::to_vec(response) {
        Ok(text) => {
            let body = splice::Body::new(splices.splice(bytes::Bytes::from(text)));
            let body = axum::body::Body::new(body);
            ([(CONTENT_TYPE, "application/json")], body).into_response()
        }
        Err(e) => error_response(&Error::Internal(e.into())),
    }
}

/// A GraphQL request as POSTed: `query` is required (a body without it is 400, not an empty
/// query), `operationName` and `variables` optional, anything else ignored.
#[derive(serde::Deserialize)]
struct RequestBody {
    query: String,
    #[serde(rename = "operationName", default)]
    operation_name: Option<String>,
    #[serde(default)]
    variables: Option<async_graphql::Variables>,
}

impl RequestBody {
    fn into_request(self) -> async_graphql::Request {
        let mut request = async_graphql::Request::new(self.query);
        request.operation_name = self.operation_name;
        if let Some(variables) = self.variables {
            request = request.variables(variables);
        }
        request
    }
}

/// Gives every error `extensions.code` (SPEC 3): async-graphql's own errors have none. Ours
/// carry theirs (`Error::to_graphql`, and `documents::prepare` for syntax, cost and inputs); of
/// the others, an operation name the document lacks is `OPERATION_RESOLUTION_FAILURE`,
/// anything refused before execution (validation, the depth and complexity limits)
/// `GRAPHQL_VALIDATION_FAILED`, and an error at a field (an argument's value that does not fit
/// its type) `BAD_USER_INPUT`.
pub(crate) fn with_code(error: &mut async_graphql::ServerError) {
    let extensions = error.extensions.get_or_insert_with(Default::default);
    if extensions.get("code").is_some() {
        return;
    }
    let code = if error.message.starts_with("Unknown operation named")
        || error.message == "Operation name required in request."
    {
        "OPERATION_RESOLUTION_FAILURE"
    } else if error.path.is_empty() {
        "GRAPHQL_VALIDATION_FAILED"
    } else {
        "BAD_USER_INPUT"
    };
    extensions.set("code", code);
}

/// An error of the database being away (or of a connection to it broken).
fn unavailable(e: &async_graphql::ServerError) -> bool {
    let code = e.extensions.as_ref().and_then(|x| x.get("code"));
    matches!(code, Some(async_graphql::Value::String(code)) if code == "SERVICE_UNAVAILABLE")
}

/// `response`, unless the mirror does not know the session's user (401), read now if no
/// statement has read them yet.
async fn unless_unknown(
    db: &DataLoader<loaders::Db, HashMapCache>,
    response: Response,
) -> Response {
    match db.loader().user().await {
        Ok(_) => response,
        Err(e) => {
            if matches!(e, Error::Unavailable(_)) {
                db.loader().discard().await;
            }
            error_response(&e)
        }
    }
}

/// An error before execution, in GraphQL's shape, with the HTTP status of its kind.
fn error_response(e: &Error) -> Response {
    let error = e.to_graphql();
    let body = json!({ "errors": [{ "message": error.message, "extensions": error.extensions }] });
    let mut response = (e.status(), Json(body)).into_response();
    e.retry_after(&mut response);
    response
}

/// Runs `request` for the user of `session`, in process: the dashboard's pages (`web`) read
/// through the same schema, resolvers, loaders and access checks as `POST /api/graphql`, so a
/// page never shows what the API would refuse. An unknown user is the same 401.
pub async fn execute_as(
    engine: &Engine,
    session: crate::auth::Session,
    request: async_graphql::Request,
) -> Result<async_graphql::Response, Error> {
    let db = Arc::new(loaders::loader(
        engine.reads.clone(),
        SessionUser::new(session),
    ));
    drop(db.loader().conn().await?);
    let request = request
        .data(db.clone())
        .data(engine.clusters.clone())
        .data(engine.health.clone())
        .data(engine.schemas.logs.clone())
        .data(engine.schemas.away.clone())
        .data(engine.recorder.clone())
        .data(engine.forward.clone());
    let mut response = engine.schemas.strict.execute(request).await;
    for error in &mut response.errors {
        with_code(error);
    }
    if response.errors.iter().any(unavailable) {
        db.loader().discard().await;
    }
    db.loader().user().await?;
    Ok(response)
}
