//! `envlens health`, the real binary: manifests from files and standard input, the table and
//! JSON outputs, errors naming the file and document, and `kubectl get -o yaml` piped in.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::support::kube_api::KubeApi;
use serde_json::json;

/// Runs `envlens health ARGS` with `stdin` as standard input.
fn envlens_health(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_envlens"))
        .arg("health")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start envlens");
    let mut input = child.stdin.take().expect("stdin");
    let stdin = stdin.to_vec();
    // Written from a thread so a large input cannot dead-lock against a full stdout pipe.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let output = child.wait_with_output().expect("envlens ran");
    writer.join().expect("stdin writer");
    output
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const WORKLOADS: &str = "\
# Two documents and a comment.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
  generation: 4
spec:
  replicas: 3
status:
  observedGeneration: 4
  replicas: 3
  updatedReplicas: 3
  availableReplicas: 3
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: worker, namespace: shop, generation: 2}
spec: {replicas: 2}
status:
  observedGeneration: 2
  replicas: 2
  updatedReplicas: 1
  conditions:
  - type: Progressing
    status: \"False\"
    reason: ProgressDeadlineExceeded
";

const CLUSTER: &str = r#"{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}
{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
   "spec": {"type": "LoadBalancer"}, "status": {"loadBalancer": {}}},
  {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "migrate", "namespace": "shop"},
   "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                              "message": "Job has reached the specified backoff limit"}]}}
]}
"#;

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write manifest");
    path.display().to_string()
}

#[test]
fn files_as_a_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workloads = write(dir.path(), "workloads.yaml", WORKLOADS);
    let cluster = write(dir.path(), "cluster.json", CLUSTER);
    let out = envlens_health(&[&workloads, &cluster], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    assert_eq!(
        text(&out.stdout),
        "\
KIND         NAME           HEALTH        MESSAGE
Deployment   shop/web       Healthy
Deployment   shop/worker    Degraded      Deployment \"worker\" exceeded its progress deadline
Namespace    shop           -
Service      shop/web       Progressing   Waiting for the load balancer to be assigned an address
Job          shop/migrate   Degraded      Job has reached the specified backoff limit
"
    );
}

#[test]
fn standard_input_with_and_without_dash() {
    for args in [&[][..], &["-"][..]] {
        let out = envlens_health(args, WORKLOADS.as_bytes());
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        let rows: Vec<Vec<&str>> = stdout
            .lines()
            .map(|l| l.split_whitespace().take(3).collect())
            .collect();
        assert_eq!(
            rows,
            [
                ["KIND", "NAME", "HEALTH"],
                ["Deployment", "shop/web", "Healthy"],
                ["Deployment", "shop/worker", "Degraded"],
            ],
            "{stdout}"
        );
    }
}

#[test]
fn json_output_is_exact() {
    let out = envlens_health(&["-o", "json", "-"], CLUSTER.as_bytes());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        r#"[
  {
    "apiVersion": "v1",
    "kind": "Namespace",
    "namespace": null,
    "name": "shop",
    "health": null
  },
  {
    "apiVersion": "v1",
    "kind": "Service",
    "namespace": "shop",
    "name": "web",
    "health": {
      "status": "Progressing",
      "message": "Waiting for the load balancer to be assigned an address"
    }
  },
  {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "namespace": "shop",
    "name": "migrate",
    "health": {
      "status": "Degraded",
      "message": "Job has reached the specified backoff limit"
    }
  }
]
"#
    );
    // Long form, and nothing in: an empty array.
    let out = envlens_health(&["--output", "json"], b"");
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "[]\n");
}

#[test]
fn a_bad_document_exits_1_naming_file_and_document() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = write(dir.path(), "good.yaml", WORKLOADS);
    let bad = write(
        dir.path(),
        "bad.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: first}\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: [oops\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: third}\n",
    );
    let out = envlens_health(&["-o", "json", &good, &bad], b"");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("error: {bad}: document 2 (line 8, column ")),
        "{stderr}"
    );
    assert!(stderr.contains("could not be read"), "{stderr}");
    assert!(!stderr.contains(&good), "{stderr}");
    // Every document that parsed is still printed.
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let names: Vec<&str> = printed
        .as_array()
        .expect("array")
        .iter()
        .map(|o| o["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["web", "worker", "first", "third"]);

    // Not a Kubernetes object, and a file that is not there.
    let missing = dir.path().join("missing.yaml").display().to_string();
    let out = envlens_health(&[&missing, "-"], b"---\n- just\n- a list\n");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains(&format!("error: {missing}: ")), "{stderr}");
    assert!(
        stderr.contains("error: <stdin>: document 1 (line 2): not a Kubernetes object"),
        "{stderr}"
    );
    assert_eq!(text(&out.stdout), "");
}

fn kubectl_available() -> bool {
    Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_piped_into_health() {
    if !kubectl_available() {
        eprintln!("kubectl not on PATH: skipping kubectl_get_piped_into_health");
        return;
    }
    let api = KubeApi::new();
    api.insert(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "generation": 1},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2},
    }));
    api.insert(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "api", "namespace": "shop", "generation": 3},
        "spec": {"replicas": 2, "paused": true},
        "status": {"observedGeneration": 2},
    }));
    api.insert(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "batch", "namespace": "shop", "generation": 2},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1},
    }));
    let dir = tempfile::tempdir().expect("tempdir");
    let served = api.serve(dir.path()).await;
    let mut kubectl = served.kubectl();
    kubectl.args(["get", "deploy", "-n", "shop", "-o", "yaml"]);
    let listed = tokio::task::spawn_blocking(move || kubectl.output().expect("run kubectl"))
        .await
        .expect("kubectl task");
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    assert!(text(&listed.stdout).contains("kind: List"));

    let out = tokio::task::spawn_blocking(move || envlens_health(&["-"], &listed.stdout))
        .await
        .expect("envlens task");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "\
KIND         NAME         HEALTH        MESSAGE
Deployment   shop/api     Suspended     Deployment is paused
Deployment   shop/batch   Progressing   Waiting for rollout to finish: observed deployment generation less than desired generation
Deployment   shop/web     Healthy
"
    );
    served.shutdown().await;
}
