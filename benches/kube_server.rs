//! The test Kubernetes API server (`tests/support/kube_api`) as a process, for benchmarks that
//! load envlens' proxy and the server itself from outside.
//!
//! `cargo bench --bench kube_server -- DIR [PODS] [LATENCY_MS]` serves `PODS` pods (default 20)
//! in namespace `apps`, writes `DIR/kubeconfig`, prints the server's URL, and serves until killed.

#[path = "../tests/support/kube_api/mod.rs"]
mod kube_api;

use std::time::Duration;

use serde_json::json;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let dir = std::path::PathBuf::from(
        args.next()
            .expect("usage: kube_server DIR [PODS] [LATENCY_MS]"),
    );
    let pods: usize = args.next().map_or(20, |n| n.parse().expect("PODS"));
    let latency: u64 = args.next().map_or(0, |n| n.parse().expect("LATENCY_MS"));
    let api = kube_api::KubeApi::new();
    api.set_recording(false);
    api.set_latency(Duration::from_millis(latency));
    for i in 0..pods {
        api.insert(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("web-{i}"), "namespace": "apps",
                         "labels": {"app": "web", "pod-template-hash": "5d8f7c9b4"}},
            "spec": {"containers": [{"name": "app", "image": "registry.example.com/web:1.4.2",
                                     "ports": [{"containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": format!("10.0.0.{}", i % 250),
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0,
                                              "state": {"running": {"startedAt": "2026-11-21T10:00:00Z"}}}]}
        }));
    }
    let served = api.serve(&dir).await;
    println!("{}", served.url());
    std::future::pending::<()>().await;
}
