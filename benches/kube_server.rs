//! The test Kubernetes API server (`tests/support/kube_api`) as a process, for benchmarks that
//! load envlens' proxy and the server itself from outside.
//!
//! `cargo bench --bench kube_server -- DIR [PODS] [LATENCY_MS]` serves `PODS` pods (default 20)
//! in namespace `apps`, writes `DIR/kubeconfig`, prints the server's URL, and serves until killed.

#[path = "fixtures/pods.rs"]
mod fixture;
#[path = "../tests/support/kube_api/mod.rs"]
mod kube_api;

use std::time::Duration;

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
        api.insert(fixture::pod("apps", i));
    }
    let served = api.serve(&dir).await;
    println!("{}", served.url());
    std::future::pending::<()>().await;
}
