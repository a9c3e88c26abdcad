//! Replicas (SPEC 8.2): two `envlens serve` processes, the built binary, on one database. A
//! deployment recorded through either reaches the `environmentsUpdated` subscribers of the
//! other, over a real WebSocket (graphql-transport-ws), through PostgreSQL `LISTEN`/`NOTIFY`
//! and nothing else.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envlens::config::Limits;
use envlens::state::AppState;
use serde_json::{json, Value};

mod fenced_cache;
mod leases;
mod ownership;
mod routing;

use crate::subscriptions::{Client, Received};
use crate::support::environment::{self, NS};
use crate::support::*;

const DEV: (i64, &str) = (2, "dev");
const PRODUCTION: &str = "gid://gitlab/Environment/100";
const ENVIRONMENTS: &str = "subscription($project: ID) {
    environmentsUpdated(projectPath: $project) { id name lastDeployment(status: CREATED) { id status } } }";

/// One `envlens serve` process; stopped with SIGTERM when dropped.
struct Replica {
    child: Child,
    addr: SocketAddr,
    /// Its id in the coordination (SPEC 16) and the address it advertises.
    id: String,
    advertise_url: String,
    stderr: Arc<Mutex<Vec<String>>>,
    _data: tempfile::TempDir,
}

impl Replica {
    async fn start(database_url: &str, secrets: &std::path::Path) -> Replica {
        Replica::start_with(database_url, secrets, &[]).await
    }

    /// [`Replica::start`] with more arguments.
    async fn start_with(database_url: &str, secrets: &std::path::Path, extra: &[&str]) -> Replica {
        let data = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_envlens"))
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--database-url", database_url])
            .arg("--data-dir")
            .arg(data.path())
            .arg("--session-secret-file")
            .arg(secrets.join("session"))
            .arg("--internal-secret-file")
            .arg(secrets.join("internal"))
            .arg("--webhook-token-file")
            .arg(secrets.join("webhook"))
            .args(extra)
            .env("ENVLENS_LOG", "info")
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
        let (addr, id, advertise_url) = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            let mut addr = None;
            loop {
                line.clear();
                if stdout.read_line(&mut line).unwrap() == 0 {
                    std::thread::sleep(Duration::from_millis(200));
                    panic!("serve exited before listening: {:#?}", seen.lock().unwrap());
                }
                if let Some(at) = line.find("listening on http://") {
                    let host = line[at + 20..].split(['/', ';']).next().unwrap().trim();
                    addr = Some(host.parse::<SocketAddr>().unwrap());
                }
                // The replica's line follows the listening one.
                if let Some(rest) = line.trim().strip_prefix("replica ") {
                    let (id, rest) = rest.split_once(" advertised at ").unwrap();
                    let url = rest.split(';').next().unwrap();
                    let addr = addr.expect("the listening line first");
                    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
                    return (addr, id.to_owned(), url.to_owned());
                }
            }
        })
        .await
        .unwrap();
        Replica {
            child,
            addr,
            id,
            advertise_url,
            stderr,
            _data: data,
        }
    }

    /// A POST with a JSON body over a fresh connection: the status and the body.
    fn post(&self, path: &str, headers: &[(&str, &str)], body: &Value) -> (u16, String) {
        let body = body.to_string();
        let mut stream = std::net::TcpStream::connect(self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: envlens\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(&body);
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, body.to_owned())
    }

    fn logs(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The next `environmentsUpdated` of subscription `id`, past earlier messages about the same
/// write (a status hook sends the environment again): the last within a short quiet spell.
async fn latest(client: &mut Client, id: &str) -> Value {
    let first = client.next_payload(id).await;
    assert!(first.get("errors").is_none(), "{first}");
    let mut latest = first["data"]["environmentsUpdated"].clone();
    while let Some(Received::Message(m)) = client.receive_within(Duration::from_millis(300)).await {
        assert_eq!(m["id"], id, "{m}");
        latest = m["payload"]["data"]["environmentsUpdated"].clone();
    }
    latest
}

#[tokio::test]
async fn a_deployment_recorded_by_one_replica_reaches_subscribers_of_the_other() {
    let (url, database) = crate::telemetry::database_url().await;
    let app = TestApp::owning(
        AppState::new((*database).clone(), keys(), Limits::default()),
        database,
    );
    environment::seed(&app).await;
    let secrets = tempfile::tempdir().unwrap();
    std::fs::write(secrets.path().join("session"), base64_of(SESSION_KEY)).unwrap();
    std::fs::write(secrets.path().join("internal"), base64_of(INTERNAL_KEY)).unwrap();
    std::fs::write(secrets.path().join("webhook"), WEBHOOK_TOKEN).unwrap();
    let one = Replica::start(&url, secrets.path()).await;
    let two = Replica::start(&url, secrets.path()).await;

    let mut on_two = Client::connect(two.addr, "graphql-transport-ws", DEV).await;
    on_two
        .subscribe("2", ENVIRONMENTS, json!({"project": "acme/apps/web"}))
        .await;
    let mut on_one = Client::connect(one.addr, "graphql-transport-ws", DEV).await;
    on_one
        .subscribe("1", ENVIRONMENTS, json!({"project": "acme/apps/web"}))
        .await;
    // Subscriptions are set up asynchronously: wait until each listens.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Created through the first process: the second one's subscriber has it.
    let token = internal_token();
    let (status, body) = one.post("/api/v4/internal/deployments", &[(envlens::auth::INTERNAL_HEADER, &token)], &json!({
        "deployment": {"id": 4, "iid": 4, "status": "created", "ref": "main", "sha": "abc", "tag": false,
                       "created_at": "2026-11-21T10:00:00Z"},
        "project": {"id": 42, "full_path": "acme/apps/web"},
        "environment": {"id": 100, "name": "production", "slug": "production", "tier": "production"},
        "job": {"id": 4, "name": "deploy", "protected_ref": true},
        "kubernetes": {"agent": "acme/agents:prod", "namespace": NS}
    }));
    assert_eq!(status, 201, "{body}\n{}", one.logs());
    for (client, id) in [(&mut on_two, "2"), (&mut on_one, "1")] {
        let env = latest(client, id).await;
        assert_eq!(env["id"], PRODUCTION, "{env}");
        assert_eq!(
            env["lastDeployment"],
            json!({"id": "gid://gitlab/Deployment/4", "status": "CREATED"}),
            "subscriber on replica {id}"
        );
    }

    // Its status, from GitLab's hook to the second process: the first one's subscriber has it.
    let hook = json!({"object_kind": "deployment", "deployment_id": 4, "status": "running",
        "status_changed_at": "2026-11-21 10:05:00 UTC", "environment": "production",
        "project": {"id": 42, "path_with_namespace": "acme/apps/web"}});
    let (status, body) = two.post(
        "/webhooks/gitlab",
        &[
            ("X-Gitlab-Token", WEBHOOK_TOKEN),
            ("X-Gitlab-Event", "Deployment Hook"),
        ],
        &hook,
    );
    assert_eq!(status, 200, "{body}\n{}", two.logs());
    for (client, id) in [(&mut on_one, "1"), (&mut on_two, "2")] {
        let env = latest(client, id).await;
        assert_eq!(env["id"], PRODUCTION, "{env}");
        assert_eq!(
            env["lastDeployment"],
            Value::Null,
            "subscriber on replica {id}: no deployment is still CREATED"
        );
    }
}
