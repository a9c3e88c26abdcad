//! A load generator for `POST /api/v4/internal/deployments` against a running `envlens serve`.
//!
//! `cargo bench --bench load -- seed  --url U --secret-file F`
//! `cargo bench --bench load -- run   --url U --secret-file F --connections 32 --seconds 30 [--rate R] [--acked FILE]`
//!
//! `cargo bench --bench load -- graphql --url U --session-secret-file F --user-id N --username U [--variables yes|no] [--connections 32] [--seconds 30] [--rate R]`
//!
//! `costly` is `graphql` with documents at envlens' cost limits (`graphql::cost`): ~2,500
//! `__typename` aliases each (some 4,990 names, 42 KB), 50 distinct texts too long to be kept,
//! so that each is parsed, validated and answered in full: the CPU-bound client the probes must
//! outlast (`benches/notes/harden-benchmarks.md`).
//!
//! `gitlab --listen ADDR --key-der F` serves what envlens reads of GitLab to verify CI/CD ID
//! tokens: its OpenID discovery document and key set (the RSA key of `F`, DER), until killed.
//! `ci-seed --url U --gitlab G --audience A --key-der F --webhook-token-file W --id-base B
//! --count N --tokens FILE` sends GitLab's Deployment Hook (`running`) for deployments B..B+N
//! of jobs B..B+N, and writes FILE: one RS256 ID token per job, signed beforehand (on every
//! core) so that the run's client does not sign. `ci-run --url U --tokens FILE --id-base B`
//! then sends each job's `POST /api/v4/ci/deployments` once: the ID-token path of SPEC 12.2,
//! the same deployments, projects and agent as `run`'s internal path (`benches/ci_deployments.sh`).
//!
//! `get --url U --path P [--header 'name: value']...` sends the same GET over and over;
//! `proxy` does so as a bearer session (`--session-secret-file`, `--user-id`, `--username`)
//! with `Gitlab-Agent-Id: --agent`, for `benches/proxy.sh`.
//!
//! `graphql` sends the blueprint's query for environment `env<j>` of project `bench/p<k>`,
//! rotating over 100 projects x 100 environments (the scenario `benches/graphql.sh` seeds),
//! as a bearer session of the given user. With `--variables yes` every request sends the same
//! query text with `fullPath` and `name` as variables, the way GitLab's frontend does; by
//! default they are literals in the text (10,000 different texts). Its requests are built
//! once and sent whole over plain keep-alive connections (`RawConn`, as `wrk` sends), so that
//! the client takes as little of the two cores as pgbench's does; a 200 whose body has
//! `"errors"` is counted apart (`"200 with errors"`), not as answered.
//!
//! `seed` creates the scenario: groups `bench` > `bench/team` > `bench/team/apps` and
//! `bench/other`, 100 projects (even ones under `bench/team/apps`, odd ones under
//! `bench/other`), and agent `bench/agents:prod` whose `ci_access` authorizes `bench/team`: half
//! of the deployments are authorized through a group two levels up, half are refused.
//!
//! `run` sends distinct deployments over keep-alive connections, each request written whole
//! (`RawConn`, as for `graphql`; so do `ci-run`'s). With `--rate` it is open
//! loop: each request has a scheduled time, and its latency counts from then, so a stalled
//! server is charged for the requests it delayed. Prints one JSON line of results; with
//! `--acked`, writes the id of every deployment answered 2xx.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::json;
use tokio::net::TcpStream;

const PROJECTS: i64 = 100;

struct Args {
    command: String,
    url: String,
    secret_file: String,
    connections: usize,
    seconds: u64,
    rate: Option<f64>,
    acked: Option<String>,
    id_base: i64,
    session_secret_file: String,
    user_id: i64,
    username: String,
    path: String,
    headers: Vec<(String, String)>,
    agent: i64,
    variables: bool,
    listen: String,
    gitlab: String,
    audience: String,
    key_der: String,
    webhook_token_file: String,
    count: i64,
    tokens: String,
}

fn args() -> Args {
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    let mut a = Args {
        command: it.next().unwrap_or_default(),
        url: "http://127.0.0.1:8080".into(),
        secret_file: ".envlens/internal-secret".into(),
        connections: 32,
        seconds: 30,
        rate: None,
        acked: None,
        id_base: 1_000_000_000,
        session_secret_file: ".envlens/session-secret".into(),
        user_id: 1,
        username: "root".into(),
        path: "/".into(),
        headers: Vec::new(),
        agent: 1,
        variables: false,
        listen: "127.0.0.1:18380".into(),
        gitlab: "http://127.0.0.1:18380".into(),
        audience: "http://127.0.0.1:8080".into(),
        key_der: "tests/fixtures/keys/gitlab-rsa.der".into(),
        webhook_token_file: ".envlens/webhook-token".into(),
        count: 10_000,
        tokens: "/tmp/envlens-ci-tokens".into(),
    };
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => a.url = value,
            "--secret-file" => a.secret_file = value,
            "--connections" => a.connections = value.parse().expect("--connections"),
            "--seconds" => a.seconds = value.parse().expect("--seconds"),
            "--rate" => a.rate = Some(value.parse().expect("--rate")),
            "--acked" => a.acked = Some(value),
            "--id-base" => a.id_base = value.parse().expect("--id-base"),
            "--session-secret-file" => a.session_secret_file = value,
            "--user-id" => a.user_id = value.parse().expect("--user-id"),
            "--username" => a.username = value,
            "--path" => a.path = value,
            "--agent" => a.agent = value.parse().expect("--agent"),
            "--listen" => a.listen = value,
            "--gitlab" => a.gitlab = value,
            "--audience" => a.audience = value,
            "--key-der" => a.key_der = value,
            "--webhook-token-file" => a.webhook_token_file = value,
            "--count" => a.count = value.parse().expect("--count"),
            "--tokens" => a.tokens = value,
            "--variables" => {
                a.variables = match value.as_str() {
                    "yes" => true,
                    "no" => false,
                    _ => panic!("--variables yes|no"),
                }
            }
            "--header" => {
                let (name, value) = value.split_once(':').expect("--header 'name: value'");
                a.headers
                    .push((name.trim().to_owned(), value.trim().to_owned()));
            }
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn token(secret_file: &str) -> String {
    let key = envlens::auth::secrets::read_key(std::path::Path::new(secret_file)).expect("secret");
    let now = chrono::Utc::now().timestamp();
    let claims = json!({"iss": "gitlab", "aud": "envlens", "iat": now, "exp": now + 290});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(key.bytes()),
    )
    .unwrap()
}

/// What a request sends: its method, path, auth header and body, from its sequence number.
#[derive(Clone)]
enum Scenario {
    Deployments {
        token: String,
    },
    /// Every distinct request of the rotation, whole (request line, headers and body), sent
    /// with [`RawConn`].
    Graphql {
        requests: Vec<Vec<u8>>,
    },
    Get {
        path: String,
        headers: Vec<(String, String)>,
    },
    /// Job `id_base + i` sends `tokens[i]`.
    CiDeployments {
        tokens: Vec<String>,
        id_base: i64,
    },
}

type Headers = Vec<(String, String)>;

impl Scenario {
    fn request(&self, n: i64) -> (&'static str, &str, Headers, String) {
        match self {
            Scenario::Deployments { token } => (
                "POST",
                "/api/v4/internal/deployments",
                vec![("gitlab-envlens-api-request".into(), token.clone())],
                deployment(n),
            ),
            Scenario::Get { path, headers } => ("GET", path, headers.clone(), String::new()),
            Scenario::CiDeployments { tokens, id_base } => {
                let token = tokens
                    .get((n - id_base) as usize)
                    .expect("more requests than --count tokens: seed more");
                (
                    "POST",
                    "/api/v4/ci/deployments",
                    vec![("authorization".into(), format!("Bearer {token}"))],
                    json!({"agent": "bench/agents:prod", "namespace": "apps"}).to_string(),
                )
            }
            Scenario::Graphql { .. } => unreachable!("sent whole by RawConn"),
        }
    }

    /// The `n`th request whole, for the scenarios sent with [`RawConn`]: the GraphQL
    /// rotation's, and the deployment creations' (whose JSON answers always carry their
    /// length). `None` for `Get`, whose proxied answers may come chunked.
    fn whole(&self, authority: &str, n: i64) -> Option<std::borrow::Cow<'_, [u8]>> {
        use std::fmt::Write;
        match self {
            Scenario::Graphql { requests } => Some(std::borrow::Cow::Borrowed(
                &requests[n.rem_euclid(requests.len() as i64) as usize],
            )),
            Scenario::Deployments { .. } | Scenario::CiDeployments { .. } => {
                let (method, path, headers, body) = self.request(n);
                let mut whole = format!(
                    "{method} {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\n"
                );
                for (name, value) in headers {
                    let _ = write!(whole, "{name}: {value}\r\n");
                }
                let _ = write!(whole, "content-length: {}\r\n\r\n{body}", body.len());
                Some(std::borrow::Cow::Owned(whole.into_bytes()))
            }
            Scenario::Get { .. } => None,
        }
    }
}

/// The body of the blueprint query for environment `env<j>` of project `bench/p<k>`, the
/// `n`th of the rotation.
fn graphql_body(n: i64, variables: bool) -> String {
    let (project, environment) = (
        format!("bench/p{}", n % 100),
        format!("env{}", (n / 100) % 100),
    );
    if variables {
        json!({ "query": BLUEPRINT_QUERY, "variables": { "fullPath": project, "name": environment } })
    } else {
        let query = format!(
            r#"{{ project(fullPath: "{project}") {{ environment(name: "{environment}") {{ slug lastDeployment(status: SUCCESS) {{ agent {{ id name project {{ fullPath }} kubernetesNamespace }} }} }} }} }}"#
        );
        json!({ "query": query })
    }
    .to_string()
}

/// The rotation's requests, whole, each the way hyper's client sent them.
fn graphql_requests(authority: &str, bearer: &str, variables: bool) -> Vec<Vec<u8>> {
    (0..ROTATION)
        .map(|n| {
            let body = graphql_body(n, variables);
            format!(
                "POST /api/graphql HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\n\
                 authorization: {bearer}\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        })
        .collect()
}

/// Requests at the cost limits, distinct texts, whole (see the module's doc).
fn costly_requests(authority: &str, bearer: &str) -> Vec<Vec<u8>> {
    (0..50)
        .map(|n| {
            let aliases: String = (0..2_490).map(|i| format!("q{n}_{i}: __typename ")).collect();
            let body = json!({ "query": format!("{{ {aliases} }}") }).to_string();
            format!(
                "POST /api/graphql HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\n\
                 authorization: {bearer}\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        })
        .collect()
}

/// 100 projects x 100 environments.
const ROTATION: i64 = 10_000;

/// The blueprint's query with its arguments as variables, one text for every request.
const BLUEPRINT_QUERY: &str = "query Blueprint($fullPath: ID!, $name: String!) { project(fullPath: $fullPath) { environment(name: $name) { slug lastDeployment(status: SUCCESS) { agent { id name project { fullPath } kubernetesNamespace } } } } }";

fn project(i: i64) -> (i64, String) {
    let group = if i % 2 == 0 {
        "bench/team/apps"
    } else {
        "bench/other"
    };
    (1000 + i, format!("{group}/p{i}"))
}

/// The body of a creation call for deployment `id`: written by `format!`, a fraction of what
/// building it as a `serde_json::Value` cost the client.
fn deployment(id: i64) -> String {
    let (project_id, path) = project(id % PROJECTS);
    let (iid, environment_id) = (id % 100_000 + 1, 1_000_000 + project_id);
    format!(
        r#"{{"deployment":{{"id":{id},"iid":{iid},"status":"created","ref":"main","sha":"0a1b2c3d4e5f6a7b","tag":false,"created_at":"2026-11-21T10:00:00Z"}},"project":{{"id":{project_id},"full_path":"{path}"}},"environment":{{"id":{environment_id},"name":"production","slug":"production","tier":"production"}},"job":{{"id":{id},"name":"deploy","protected_ref":true,"user_id":1}},"kubernetes":{{"agent":"bench/agents:prod","namespace":"apps"}}}}"#
    )
}

struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Conn {
    async fn open(authority: &str) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(authority).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        Ok(Conn { sender })
    }

    async fn send(
        &mut self,
        method: &str,
        authority: &str,
        path: &str,
        headers: &[(String, String)],
        body: String,
    ) -> Result<(u16, Bytes), hyper::Error> {
        self.sender.ready().await?;
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", authority);
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        for (name, value) in headers {
            req = req.header(name, value);
        }
        let req = req.body(Full::new(Bytes::from(body))).unwrap();
        let res = self.sender.send_request(req).await?;
        let status = res.status().as_u16();
        let body = res.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// A keep-alive HTTP/1.1 connection that writes a request given whole and reads the answer by
/// its `content-length`: what `wrk` does, so that the client's own work per request (a fifth of
/// envlens' with hyper's client, on the same two cores) weighs on the server's rate as little
/// as pgbench's client weighs on PostgreSQL's. It answers the status and whether a 200's body
/// carries GraphQL errors; a response without `content-length` (chunked) is an error here.
struct RawConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RawConn {
    async fn open(authority: &str) -> std::io::Result<RawConn> {
        let stream = TcpStream::connect(authority).await?;
        stream.set_nodelay(true)?;
        Ok(RawConn {
            stream,
            buf: Vec::with_capacity(4096),
        })
    }

    /// The status, and for a 200 whether the body names `"errors"`.
    async fn exchange(&mut self, request: &[u8]) -> std::io::Result<(u16, bool)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let invalid =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
        self.stream.write_all(request).await?;
        self.buf.clear();
        let (head, length) = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end]).map_err(|_| invalid("head"))?;
                let length = head
                    .split("\r\n")
                    .skip(1)
                    .filter_map(|line| line.split_once(':'))
                    .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
                    .and_then(|(_, value)| value.trim().parse::<usize>().ok())
                    .ok_or_else(|| invalid("no content-length"))?;
                break (end + 4, length);
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(invalid("closed"));
            }
        };
        while self.buf.len() < head + length {
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Err(invalid("closed"));
            }
        }
        if self.buf.len() > head + length {
            return Err(invalid("more than one response"));
        }
        let status = std::str::from_utf8(&self.buf[..head])
            .ok()
            .and_then(|h| h.split(' ').nth(1))
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or_else(|| invalid("status line"))?;
        let body = &self.buf[head..];
        let errors = status == 200 && body.windows(8).any(|w| w == b"\"errors\"");
        Ok((status, errors))
    }
}

async fn seed(a: &Args, authority: &str) {
    let token = token(&a.secret_file);
    let mut conn = Conn::open(authority).await.expect("connect");
    let projects: Vec<_> = (0..PROJECTS)
        .map(|i| {
            let (id, path) = project(i);
            json!({"id": id, "full_path": path, "visibility": "private"})
        })
        .chain([json!({"id": 999, "full_path": "bench/agents", "visibility": "private"})])
        .collect();
    let calls = [
        (
            "PUT",
            "/api/v4/internal/identity".to_owned(),
            json!({
                "groups": [{"id": 1, "full_path": "bench"}, {"id": 2, "full_path": "bench/team"},
                           {"id": 3, "full_path": "bench/team/apps"}, {"id": 4, "full_path": "bench/other"}],
                "projects": projects
            }),
        ),
        (
            "PUT",
            "/api/v4/internal/kubernetes/agents/1".to_owned(),
            json!({"project_id": 999, "name": "prod"}),
        ),
        (
            "POST",
            "/api/v4/internal/kubernetes/agent_configuration".to_owned(),
            json!({"agent_id": 1, "agent_config": {"ci_access": {"groups": [{"id": "bench/team"}]}}}),
        ),
    ];
    for (method, path, body) in calls {
        let (status, body) = conn
            .send(
                method,
                authority,
                &path,
                &[("gitlab-envlens-api-request".to_owned(), token.clone())],
                body.to_string(),
            )
            .await
            .expect("seed request");
        assert!(
            status < 300,
            "{path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
    println!("seeded {PROJECTS} projects and agent bench/agents:prod");
}

const KID: &str = "bench-rsa";

/// The key set and discovery document of a GitLab at `--listen`, for envlens' `gitlab.url`.
async fn serve_gitlab(a: &Args) {
    use jsonwebtoken::jwk::{Jwk, JwkSet};
    let key =
        jsonwebtoken::EncodingKey::from_rsa_der(&std::fs::read(&a.key_der).expect("--key-der"));
    let mut jwk = Jwk::from_encoding_key(&key, jsonwebtoken::Algorithm::RS256).unwrap();
    jwk.common.key_id = Some(KID.into());
    let keys = serde_json::to_value(JwkSet { keys: vec![jwk] }).unwrap();
    let issuer = format!("http://{}", a.listen);
    let discovery = json!({"issuer": issuer, "jwks_uri": format!("{issuer}/oauth/discovery/keys"),
        "id_token_signing_alg_values_supported": ["RS256"]});
    let router = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            axum::routing::get(move || async move { axum::Json(discovery) }),
        )
        .route(
            "/oauth/discovery/keys",
            axum::routing::get(move || async move { axum::Json(keys) }),
        );
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .expect("--listen");
    println!("GitLab's key set at {issuer}/oauth/discovery/keys");
    axum::serve(listener, router).await.unwrap();
}

/// The ID token GitLab would give job `job` (GitLab's claims, SPEC 12.2).
fn id_token_claims(a: &Args, job: i64) -> serde_json::Value {
    let (project_id, path) = project(job % PROJECTS);
    let now = chrono::Utc::now().timestamp();
    json!({"namespace_id": "1", "namespace_path": path.rsplit_once('/').unwrap().0,
        "project_id": project_id.to_string(), "project_path": path, "user_id": "1", "user_login": "root",
        "pipeline_id": job.to_string(), "pipeline_source": "push", "job_id": job.to_string(),
        "ref": "main", "ref_type": "branch", "ref_path": "refs/heads/main", "ref_protected": "true",
        "environment": "production", "environment_protected": "true", "deployment_tier": "production",
        "environment_action": "start", "iss": a.gitlab, "aud": a.audience,
        "iat": now, "nbf": now - 5, "exp": now + 3600,
        "sub": format!("project_path:{path}:ref_type:branch:ref:main")})
}

/// GitLab's hooks for the jobs' deployments, and their ID tokens, signed beforehand.
async fn ci_seed(a: &Args, authority: &str) {
    let webhook_token =
        std::fs::read_to_string(&a.webhook_token_file).expect("--webhook-token-file");
    let webhook_token = webhook_token.trim().to_owned();
    let (base, count) = (a.id_base, a.count);
    // Signing: every core, apart from the hooks.
    let key = Arc::new(jsonwebtoken::EncodingKey::from_rsa_der(
        &std::fs::read(&a.key_der).expect("--key-der"),
    ));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as i64;
    let claims: Arc<Vec<serde_json::Value>> = Arc::new(
        (base..base + count)
            .map(|job| id_token_claims(a, job))
            .collect(),
    );
    let signers: Vec<_> = (0..threads)
        .map(|t| {
            let (key, claims) = (key.clone(), claims.clone());
            std::thread::spawn(move || {
                let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
                header.kid = Some(KID.into());
                (t as usize..claims.len())
                    .step_by(threads as usize)
                    .map(|i| (i, jsonwebtoken::encode(&header, &claims[i], &key).unwrap()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut hooks = Vec::new();
    for c in 0..8 {
        let authority = authority.to_owned();
        let webhook_token = webhook_token.clone();
        hooks.push(tokio::spawn(async move {
            let mut conn = Conn::open(&authority).await.expect("connect");
            let headers = [
                ("x-gitlab-token".to_owned(), webhook_token),
                ("x-gitlab-event".to_owned(), "Deployment Hook".to_owned()),
            ];
            for id in (base + c..base + count).step_by(8) {
                let (project_id, path) = project(id % PROJECTS);
                let body = json!({"object_kind": "deployment", "status": "running",
                    "status_changed_at": "2026-11-24 10:00:00 +0100", "deployment_id": id, "deployable_id": id,
                    "environment": "production", "environment_tier": "production", "environment_slug": "production",
                    "project": {"id": project_id, "path_with_namespace": path, "visibility_level": 0},
                    "short_sha": "0a1b2c3d", "ref": "main"});
                let (status, text) = conn.send("POST", &authority, "/webhooks/gitlab", &headers, body.to_string()).await.expect("hook");
                assert!(status < 300, "hook {id}: {status} {}", String::from_utf8_lossy(&text));
            }
        }));
    }
    for h in hooks {
        h.await.unwrap();
    }
    let mut tokens = vec![String::new(); count as usize];
    for s in signers {
        for (i, token) in s.join().unwrap() {
            tokens[i] = token;
        }
    }
    std::fs::write(&a.tokens, tokens.join("\n")).expect("--tokens");
    println!(
        "{count} deployment hooks sent, {count} ID tokens in {}",
        a.tokens
    );
}

#[derive(Default)]
struct Tally {
    latencies_us: Vec<u64>,
    statuses: BTreeMap<String, u64>,
    acked: Vec<i64>,
}

async fn run(a: &Args, authority: &str, scenario: Scenario) {
    let scenario = Arc::new(scenario);
    let next_id = Arc::new(AtomicI64::new(a.id_base));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(a.seconds);
    // With a rate, each connection sends on its own schedule: rate / connections per second.
    let period = a
        .rate
        .map(|r| Duration::from_secs_f64(a.connections as f64 / r));
    let mut workers = Vec::new();
    let connections = a.connections;
    for w in 0..connections {
        let (scenario, next_id, authority) =
            (scenario.clone(), next_id.clone(), authority.to_owned());
        workers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut conn: Option<Conn> = None;
            let mut raw: Option<RawConn> = None;
            // Connections start spread evenly over one period.
            let mut next_due = started
                + period
                    .map(|p| p.mul_f64(w as f64 / connections as f64))
                    .unwrap_or_default();
            loop {
                let due = match period {
                    Some(p) => {
                        let due = next_due;
                        if due >= deadline {
                            break;
                        }
                        tokio::time::sleep_until(due.into()).await;
                        next_due += p;
                        due
                    }
                    None => {
                        let now = Instant::now();
                        if now >= deadline {
                            break;
                        }
                        now
                    }
                };
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                let outcome = if let Some(request) = scenario.whole(&authority, id) {
                    if raw.is_none() {
                        raw = RawConn::open(&authority).await.ok();
                    }
                    match raw.as_mut() {
                        Some(c) => c.exchange(&request).await.ok().map(|(status, errors)| {
                            (status, if errors { " with errors" } else { "" })
                        }),
                        None => None,
                    }
                } else {
                    if conn.is_none() {
                        conn = Conn::open(&authority).await.ok();
                    }
                    let (method, path, headers, body) = scenario.request(id);
                    match conn.as_mut() {
                        Some(c) => c.send(method, &authority, path, &headers, body).await.ok(),
                        None => None,
                    }
                    .map(|(status, _)| (status, ""))
                };
                let key = match outcome {
                    Some((status, note)) => {
                        if (200..300).contains(&status) && note.is_empty() {
                            tally.acked.push(id);
                        }
                        format!("{status}{note}")
                    }
                    None => {
                        (conn, raw) = (None, None);
                        "connection error".to_owned()
                    }
                };
                *tally.statuses.entry(key).or_default() += 1;
                tally.latencies_us.push(due.elapsed().as_micros() as u64);
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for w in workers {
        let t = w.await.unwrap();
        total.latencies_us.extend(t.latencies_us);
        total.acked.extend(t.acked);
        for (k, v) in t.statuses {
            *total.statuses.entry(k).or_default() += v;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    total.latencies_us.sort_unstable();
    let pct = |p: f64| {
        let l = &total.latencies_us;
        if l.is_empty() {
            return 0.0;
        }
        l[((l.len() as f64 * p).ceil() as usize).clamp(1, l.len()) - 1] as f64 / 1000.0
    };
    if let Some(path) = &a.acked {
        let text: String = total.acked.iter().map(|id| format!("{id}\n")).collect();
        std::fs::write(path, text).expect("write acked ids");
    }
    println!(
        "{}",
        json!({
            "sent": total.latencies_us.len(),
            "acknowledged": total.acked.len(),
            "statuses": total.statuses,
            "seconds": elapsed,
            "requests_per_second": total.latencies_us.len() as f64 / elapsed,
            "latency_ms": {"p50": pct(0.50), "p90": pct(0.90), "p99": pct(0.99), "max": pct(1.0)},
        })
    );
}

/// `Bearer <session token>` of `--user-id`, signed with `--session-secret-file`.
fn session(a: &Args) -> String {
    let key = envlens::auth::secrets::read_key(std::path::Path::new(&a.session_secret_file))
        .expect("session secret");
    let ttl = Duration::from_secs(3600);
    let (token, _) =
        envlens::auth::mint_session(key.bytes(), a.user_id, &a.username, ttl).expect("token");
    format!("Bearer {token}")
}

#[tokio::main]
async fn main() {
    let a = args();
    let authority = a
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    match a.command.as_str() {
        "seed" => seed(&a, &authority).await,
        "run" => {
            let token = token(&a.secret_file);
            run(&a, &authority, Scenario::Deployments { token }).await
        }
        "gitlab" => serve_gitlab(&a).await,
        "ci-seed" => ci_seed(&a, &authority).await,
        "ci-run" => {
            let tokens = std::fs::read_to_string(&a.tokens)
                .expect("--tokens")
                .lines()
                .map(str::to_owned)
                .collect();
            let id_base = a.id_base;
            run(&a, &authority, Scenario::CiDeployments { tokens, id_base }).await
        }
        "graphql" => {
            let requests = graphql_requests(&authority, &session(&a), a.variables);
            run(&a, &authority, Scenario::Graphql { requests }).await
        }
        "costly" => {
            let requests = costly_requests(&authority, &session(&a));
            run(&a, &authority, Scenario::Graphql { requests }).await
        }
        "get" => {
            let scenario = Scenario::Get { path: a.path.clone(), headers: a.headers.clone() };
            run(&a, &authority, scenario).await
        }
        "proxy" => {
            let mut headers = a.headers.clone();
            headers.push(("authorization".into(), session(&a)));
            headers.push(("gitlab-agent-id".into(), a.agent.to_string()));
            run(&a, &authority, Scenario::Get { path: a.path.clone(), headers }).await
        }
        _ => eprintln!("usage: load seed|run|graphql|costly|get|proxy --url URL [--secret-file F | --session-secret-file F --user-id N --username U] [--connections N] [--seconds S] [--rate R] [--acked FILE]"),
    }
}
