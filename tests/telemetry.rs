//! A request followed by one id from envlens' answer and log line to the cluster's audit log;
//! metrics of the calls out; JSON logs and OTLP traces from the binary as operators run it.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, Method, Request};
use serde_json::{json, Value};

use crate::proxy::{bearer, cluster, config, setup, token, PODS};
use crate::support::environment;
use crate::support::kube_api::{KubeApi, RecordedRequest};
use crate::support::{postgres, SESSION_KEY};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test]
async fn a_request_id_is_kept_when_well_formed_and_answered() {
    let app = crate::support::TestApp::new().await;
    let res = app
        .send(
            Request::get("/-/liveness")
                .header("x-request-id", "01JD2Z5Q.gitlab-correlation_1")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(res.headers["x-request-id"], "01JD2Z5Q.gitlab-correlation_1");
    let res = app
        .send(
            Request::get("/-/liveness")
                .header("x-request-id", "no spaces allowed")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    let id = res.headers["x-request-id"].to_str().unwrap();
    assert_eq!(id.len(), 26, "{id}");
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
}

#[tokio::test]
async fn the_proxy_sends_the_request_id_as_audit_id_and_the_trace_context_on() {
    let (api, served, _dir) = cluster().await;
    let app = setup(&config(&served)).await;
    let res = app
        .send(
            bearer(2, 7, Method::GET, PODS)
                .header("x-request-id", "follow-me-1")
                .header("traceparent", TRACEPARENT)
                // A client's own Audit-ID does not reach the cluster.
                .header("audit-id", "forged")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.headers["x-request-id"], "follow-me-1");
    let sent = api.requests();
    let list = sent
        .iter()
        .find(|r| r.path.ends_with("/pods"))
        .expect("the list");
    assert_eq!(list.header("audit-id"), Some("follow-me-1"));
    assert_eq!(list.header("traceparent"), Some(TRACEPARENT));

    // The call is counted by agent, verb, resource and answer.
    let metrics = app
        .send(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .text();
    assert!(
        metrics.contains(
            r#"envlens_cluster_requests_total{agent="7",verb="list",resource="pods",code="200"} 1"#
        ),
        "{metrics}"
    );
    assert!(metrics.contains(
        r#"envlens_cluster_request_duration_seconds_count{agent="7",verb="list",resource="pods"} 1"#
    ));
    assert!(
        metrics.contains(r#"envlens_database_connections{state="idle"}"#),
        "{metrics}"
    );
}

/// A first view's work at the cluster (its access reviews, and the discovery, own-rules
/// review and first list of every kind that the watch cache starts because of it) carries the
/// view's request id as `Audit-ID`; the watches that follow, shared by every later view, and
/// a second view's answer from the cache, carry none of the first's.
#[tokio::test]
async fn every_list_of_a_resource_group_carries_the_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let api = KubeApi::new();
    environment::environment(&api);
    let served = api.serve(dir.path()).await;
    let app = environment::gitlab(&served).await;
    api.clear_requests();
    let view = |id: &'static str| {
        let query = r#"{ project(fullPath: "acme/apps/web") { environment(name: "production") {
            resourceGroup { health resources { kind name } } } } }"#;
        Request::post("/api/graphql")
            .header(header::AUTHORIZATION, format!("Bearer {}", token(2).0))
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-request-id", id)
            .body(Body::from(json!({ "query": query }).to_string()))
            .unwrap()
    };
    let res = app.send(view("group-view-7")).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert!(res.json()["errors"].is_null(), "{}", res.text());
    let requests = api.requests();
    let is_watch =
        |r: &&RecordedRequest| r.query.contains("watch=true") || r.query.contains("watch=1");
    let caused: Vec<_> = requests.iter().filter(|r| !is_watch(r)).collect();
    let of = |part: &str| caused.iter().filter(|r| r.path.contains(part)).count();
    assert!(of("/subjectaccessreviews") > 10, "{caused:?}");
    assert!(of("/selfsubjectrulesreviews") >= 1, "{caused:?}");
    assert!(caused.iter().any(|r| r.path == "/apis"), "{caused:?}");
    assert!(of("/namespaces/") > 15, "the first lists: {caused:?}");
    for r in &caused {
        assert_eq!(
            r.header("audit-id"),
            Some("group-view-7"),
            "{} {}?{}",
            r.method,
            r.path,
            r.query
        );
    }
    for r in requests.iter().filter(is_watch) {
        assert_ne!(
            r.header("audit-id"),
            Some("group-view-7"),
            "{}?{}",
            r.path,
            r.query
        );
    }
    // A second view is answered from the cache: whatever it asks is its own.
    api.clear_requests();
    let res = app.send(view("group-view-8")).await;
    assert!(res.json()["errors"].is_null(), "{}", res.text());
    for r in api.requests().iter().filter(|r| !is_watch(r)) {
        assert_eq!(
            r.header("audit-id"),
            Some("group-view-8"),
            "{} {}",
            r.method,
            r.path
        );
    }
}

/// A URL of a fresh test database, for a process of its own; the database lives as long as
/// the returned guard.
pub async fn database_url() -> (String, postgres::TestDatabase) {
    let pool = postgres::fresh_database().await;
    let options = pool.connect_options();
    let database = options.get_database().expect("a database name").to_owned();
    if let Ok(url) = std::env::var("DATABASE_URL") {
        // postgres://user:password@host:port/name?options: the same with this database.
        let (base, query) = url.split_once('?').unwrap_or((&url, ""));
        let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
        return (format!("{server}/{database}?{query}"), pool);
    }
    let socket = options
        .get_socket()
        .expect("the private server's socket folder");
    let url = format!(
        "postgresql://{}@localhost:{}/{database}?host={}",
        options.get_username(),
        options.get_port(),
        socket.display()
    );
    (url, pool)
}

/// `envlens serve` as a process: its address, and its stderr lines as they come.
struct Served {
    child: std::process::Child,
    _database: postgres::TestDatabase,
    addr: String,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Served {
    async fn start(args: &[&str], dir: &std::path::Path) -> Served {
        let secret = dir.join("session-secret");
        std::fs::write(&secret, base64_of(SESSION_KEY)).unwrap();
        let (url, database) = database_url().await;
        let mut child = Command::new(env!("CARGO_BIN_EXE_envlens"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--database-url", &url])
            .arg("--data-dir")
            .arg(dir)
            .arg("--session-secret-file")
            .arg(&secret)
            .args(args)
            .env("ENVLENS_LOG", "trace")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("envlens serve");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let seen = stderr.clone();
        let addr = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            loop {
                line.clear();
                if stdout.read_line(&mut line).unwrap() == 0 {
                    std::thread::sleep(Duration::from_millis(200));
                    panic!("serve exited before listening: {:#?}", seen.lock().unwrap());
                }
                // What it says on stdout is among its lines too.
                seen.lock().unwrap().push(line.trim_end().to_owned());
                if let Some(at) = line.find("http://") {
                    let url = line[at + 7..].trim();
                    let host = url.split(['/', ';']).next().unwrap().to_owned();
                    // Keep reading stdout so that the process never blocks on it.
                    std::thread::spawn(move || {
                        for line in stdout.lines().map_while(Result::ok) {
                            seen.lock().unwrap().push(line);
                        }
                    });
                    return host;
                }
            }
        })
        .await
        .unwrap();
        Served {
            child,
            _database: database,
            addr,
            stderr,
        }
    }

    fn lines(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// One HTTP/1.1 request over a fresh connection; the answer's head and body as text.
fn http(addr: &str, request: &str) -> String {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// With JSON logs, the line that says why a command failed is JSON too.
#[test]
fn with_json_logs_a_failure_is_a_json_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_envlens"))
        .args(["--log-format", "json", "serve", "--listen", "127.0.0.1:0"])
        .args(["--session-secret-file", "/nonexistent/envlens/secret"])
        .args(["--database-url", "postgres://127.0.0.1:1/none"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert!(!lines.is_empty());
    for line in &lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v.is_object(), "{line}");
    }
    let last: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(last["level"], "ERROR", "{last}");
    assert!(
        last["fields"]["message"]
            .as_str()
            .unwrap()
            .starts_with("error: "),
        "{last}"
    );
}

#[tokio::test]
async fn json_logs_carry_the_request_and_never_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(&["--log-format", "json"], dir.path()).await;
    let (session, csrf) = token(1);
    let answer = http(
        &served.addr,
        &format!(
            "GET /api/user HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Request-Id: json-log-1\r\n\
             Cookie: _gitlab_kas={session}\r\nX-Csrf-Token: {csrf}\r\ntraceparent: {TRACEPARENT}\r\n\r\n"
        ),
    );
    // User 1 is not in the mirror: refused, and logged with the id.
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("x-request-id: json-log-1"),
        "{answer}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let found = served.lines().into_iter().find_map(|line| {
            let v: Value = serde_json::from_str(&line).ok()?;
            (v["fields"]["message"] == "request" && v["span"]["request_id"] == "json-log-1")
                .then_some(v)
        });
        match found {
            Some(v) => break v,
            None if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            None => panic!("no request line: {:#?}", served.lines()),
        }
    };
    assert_eq!(line["level"], "INFO");
    assert!(line["timestamp"].is_string());
    assert_eq!(line["fields"]["status"], 401);
    assert!(line["fields"]["duration_ms"].is_number());
    assert_eq!(line["span"]["route"], "/api/user");
    assert_eq!(line["span"]["method"], "GET");
    assert_eq!(line["span"]["user_id"], 1, "{line}");
    // Joined to the caller's trace: its trace id and span id (no exporter runs).
    assert_eq!(line["span"]["trace_id"], &TRACEPARENT[3..35], "{line}");
    assert_eq!(line["span"]["span_id"], &TRACEPARENT[36..52], "{line}");
    // Every line is JSON, the address it listens on included, and none names the session,
    // its CSRF token or the secret, at trace.
    let all = served.lines();
    assert!(all.len() > 1);
    let listening = all
        .iter()
        .find_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            v["fields"]["message"]
                .as_str()?
                .starts_with("envlens listening on http://")
                .then_some(v)
        })
        .unwrap_or_else(|| panic!("no listening line: {all:#?}"));
    assert_eq!(listening["fields"]["address"], served.addr.as_str());
    for l in &all {
        assert!(serde_json::from_str::<Value>(l).is_ok(), "not JSON: {l}");
        for secret in [session.as_str(), csrf.as_str(), &base64_of(SESSION_KEY)] {
            assert!(!l.contains(secret), "a secret in a log line: {l}");
        }
    }
}

#[tokio::test]
async fn traces_go_to_the_otlp_endpoint_continuing_the_callers_trace() {
    // A collector that keeps every export's body.
    let bodies: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let kept = bodies.clone();
    let collector = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let kept = kept.clone();
            async move {
                kept.lock().unwrap().push(body);
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, collector).await });

    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://{collector_addr}/v1/traces");
    let served = Served::start(&["--otlp-endpoint", &endpoint], dir.path()).await;
    let answer = http(
        &served.addr,
        &format!(
            "GET /-/liveness HTTP/1.1\r\nHost: x\r\nConnection: close\r\ntraceparent: {TRACEPARENT}\r\n\r\n"
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let trace_id: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&TRACEPARENT[3 + 2 * i..5 + 2 * i], 16).unwrap())
        .collect();
    // The batch processor exports within seconds (5 s by default).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let exported = bodies.lock().unwrap().iter().any(|body| {
            body.windows(trace_id.len())
                .any(|w| w == trace_id.as_slice())
                && body.windows(7).any(|w| w == b"request")
        });
        if exported {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no span of trace {TRACEPARENT} exported; stderr: {:#?}",
            served.lines()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The request's line names the trace, and its own exported span, not the caller's.
    let lines = served.lines();
    let line = lines
        .iter()
        .find(|l| l.contains("/-/liveness") && l.contains("request"))
        .unwrap_or_else(|| panic!("no request line: {lines:#?}"));
    assert!(line.contains(&TRACEPARENT[3..35]), "{line}");
    assert!(line.contains("span_id"), "{line}");
    assert!(!line.contains(&TRACEPARENT[36..52]), "{line}");
}

/// Every metric the shipped Grafana dashboard and alert rules name is one `/metrics` exposes.
#[tokio::test]
async fn the_shipped_dashboard_and_alerts_name_only_exposed_metrics() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dashboard =
        std::fs::read_to_string(format!("{root}/deploy/monitoring/grafana-dashboard.json"))
            .unwrap();
    let rules =
        std::fs::read_to_string(format!("{root}/deploy/monitoring/prometheus-rules.yaml")).unwrap();
    let dashboard: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let rules: Value = serde_saphyr::from_str(&rules).expect("the rules are YAML");
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    let alerts = rules["groups"][0]["rules"].as_array().unwrap();
    assert!(alerts.len() >= 5);
    exprs.extend(
        alerts
            .iter()
            .map(|r| r["expr"].as_str().unwrap().to_owned()),
    );

    // A family shows in /metrics once it has a series: one of each, through the code's own API.
    let metrics = envlens::telemetry::Metrics::default();
    let second = Duration::from_secs(1);
    metrics.record(&axum::http::Method::GET, "/-/readiness".into(), 200, second);
    metrics.cluster_request("7", "list", "pods", Some(200), second);
    metrics.database_acquired(second, false);
    metrics.webhook_event("System Hook/user_create", "applied");
    metrics.mirror_applied();
    // What the database registers (the embedded server's restarts only with an embedded one:
    // named here as db::Database registers it then).
    let (url, _guard) = database_url().await;
    let dir = tempfile::tempdir().unwrap();
    let database = envlens::db::Database::open(&envlens::config::DatabaseArgs {
        data_dir: dir.path().to_owned(),
        database_url: Some(url),
        postgres_bin_dir: None,
        database_max_connections: 2,
        database_acquire_timeout: second,
    })
    .await
    .unwrap();
    database.register_metrics(&metrics);
    metrics.register(
        "envlens_postgres_restarts_total",
        "Restarts",
        envlens::telemetry::MetricKind::Counter,
        || 0,
    );
    let db = postgres::fresh_database().await;
    let exposed = metrics.render(Some(&db));
    let mut named = 0;
    for expr in &exprs {
        for (at, _) in expr.match_indices("envlens_") {
            let name: String = expr[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            let base = ["_total", "_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            assert!(
                exposed.contains(&format!("# TYPE {base} ")),
                "{name} (in `{expr}`) is not exposed:\n{exposed}"
            );
            named += 1;
        }
    }
    assert!(named >= 15, "{named}");
}
