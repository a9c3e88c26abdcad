//! GitLab's own watch clients against envlens (SPEC 8.3): the published npm package
//! `@gitlab/cluster-client`, run under node by `tests/fixtures/cluster_client/watch.mjs`. Its
//! `WebSocketWatchManager` and its `WatchApi` both see the pods of `apps`, then a pod changed
//! at the test server, and the manager reports a resource that does not exist as an error.
//!
//! The package is not in the repository: it is taken from `ENVLENS_CLUSTER_CLIENT` (a directory
//! with `node_modules/@gitlab/cluster-client`), else installed with npm into
//! `target/npm-cluster-client` once. Without node (20.10 or later), npm or the registry, or
//! openssl (for the TLS front the package needs), the test says so and passes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use envlens::auth::mint_session;
use serde_json::{json, Value};

use crate::support::SESSION_KEY;
use crate::watch_api::live;

/// The version the test was written against; `ENVLENS_CLUSTER_CLIENT_VERSION` picks another.
const VERSION: &str = "3.0.0";

fn skip(why: &str) {
    eprintln!("cluster_client: skipped: {why}");
}

/// The node arguments that give it a global `WebSocket`, if this node can have one.
fn node_flags() -> Option<Vec<&'static str>> {
    let has = |flags: &[&str]| {
        Command::new("node")
            .args(flags)
            .args(["-e", "process.exit(typeof WebSocket === 'function' && typeof fetch === 'function' ? 0 : 1)"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    [vec![], vec!["--experimental-websocket"]]
        .into_iter()
        .find(|flags| has(flags))
}

/// The package's entry point, installed if need be.
fn package() -> Result<PathBuf, String> {
    let entry = |dir: &Path| dir.join("node_modules/@gitlab/cluster-client/dist/src/index.js");
    if let Some(dir) = std::env::var_os("ENVLENS_CLUSTER_CLIENT") {
        let path = entry(Path::new(&dir));
        return if path.exists() {
            Ok(path)
        } else {
            Err(format!("{} does not exist", path.display()))
        };
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("npm-cluster-client");
    let version = std::env::var("ENVLENS_CLUSTER_CLIENT_VERSION").unwrap_or(VERSION.into());
    let installed = dir.join("node_modules/@gitlab/cluster-client/package.json");
    let current = std::fs::read_to_string(&installed)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .is_some_and(|p| p["version"] == version.as_str());
    if !current {
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let out = Command::new("npm")
            .args(["install", "--prefix"])
            .arg(&dir)
            .args([
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                "--loglevel=error",
            ])
            .arg(format!("@gitlab/cluster-client@{version}"))
            .output()
            .map_err(|e| format!("npm: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "npm install @gitlab/cluster-client@{version} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    Ok(entry(&dir))
}

/// A self-signed certificate for 127.0.0.1: (cert, key).
fn certificate(dir: &Path) -> Result<(PathBuf, PathBuf), String> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok((cert, key))
}

#[tokio::test]
async fn gitlabs_published_watch_clients_work_against_envlens() {
    let Some(flags) = node_flags() else {
        return skip("no node with WebSocket and fetch (20.10 or later) on this machine");
    };
    let entry = match tokio::task::spawn_blocking(package).await.unwrap() {
        Ok(entry) => entry,
        Err(why) => return skip(&why),
    };
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = match certificate(dir.path()) {
        Ok(pair) => pair,
        Err(why) => return skip(&format!("no certificate for the TLS front: {why}")),
    };

    let live = live().await;
    // pdev through agent 7, which impersonates the user: the cache's access review applies.
    let (session, csrf) = mint_session(SESSION_KEY, 2, "pdev", Duration::from_secs(600)).unwrap();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cluster_client/watch.mjs");
    let node = Command::new("node")
        .args(&flags)
        .arg(&script)
        .env("ENVLENS_ADDR", live.addr.to_string())
        .env("CLUSTER_CLIENT", &entry)
        .env("TLS_CERT", &cert)
        .env("TLS_KEY", &key)
        .env("NODE_EXTRA_CA_CERTS", &cert)
        .env("SESSION", &session)
        .env("CSRF", &csrf)
        .env("AGENT", "7")
        .stdout(Stdio::piped())
        .spawn()
        .expect("node starts");
    let mut node = Killed(node);
    // The script's lines, read on a thread of their own (the test's runtime has one).
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    let stdout = node.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut last = Value::Null;
    let mut until = async |what: &str, done: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done(&last) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, lines.recv()).await {
                Ok(Some(line)) => {
                    last = serde_json::from_str(&line).unwrap_or(json!({ "line": line }))
                }
                Ok(None) => panic!("node ended before {what}; last state {last}"),
                Err(_) => panic!("{what} did not happen within 30 s; last state {last}"),
            }
        }
        last.clone()
    };
    let pods = |phase: Value| json!([{"name": "web-1", "phase": phase, "kind": "Pod"}, {"name": "web-2", "phase": null, "kind": "Pod"}]);
    let first = until("both clients see the pods and the error", &|s: &Value| {
        s["socket"] == pods(Value::Null)
            && s["stream"] == pods(Value::Null)
            && s["errors"].as_array().is_some_and(|e| !e.is_empty())
    })
    .await;
    let error = &first["errors"][0];
    assert_eq!(error["eventType"], "error", "{first}");
    // The cluster's own 404, as a direct watch of that resource would show it.
    assert_eq!(
        error["message"], "the server could not find the requested resource",
        "{first}"
    );

    let mut pod = live.api.get("pods", Some("apps"), "web-1").unwrap();
    pod["status"] = json!({"phase": "Running"});
    live.api.insert(pod);
    until("both clients see the change", &|s: &Value| {
        s["socket"] == pods(json!("Running")) && s["stream"] == pods(json!("Running"))
    })
    .await;
    // The socket's watch came from the cache: the cluster was asked for one list of pods
    // (the cache's); the stream is the cluster's own watch, as the user.
    assert_eq!(live.api.request_count("list", "pods"), 1);
    let _ = node.0.kill();
}

/// Ends the child process with the test, whatever its outcome.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
