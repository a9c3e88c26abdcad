//! What envlens asks of clusters: a client per agent, discovery of their kinds (and which of them
//! the connection's own identity may list: `own_rules`), the listing of
//! an environment's resources, the `user_access` grants and impersonation under which it asks,
//! the proxy for the browser, and GitLab's watch API over the watch cache. The decisions over what comes back live in `resources`.

pub mod circuit;
pub mod clusters;
pub mod connection;
pub mod discovery;
pub mod fetch;
pub mod flux_actions;
pub mod gitops;
pub mod grants;
pub mod kas;
pub mod lines;
pub mod observe;
pub mod own_rules;
pub mod previous_log;
pub mod proxied_watch;
pub mod proxy;
pub mod request_info;
pub mod watch;
pub mod watch_api;

/// Runs CPU work over many objects on the blocking pool, off the async runtime's threads. A
/// panic in `work` goes on in the caller; a cancellation (only while the runtime shuts down,
/// when the caller is dropped too) never resolves rather than panicking at exit.
pub(crate) async fn off_runtime<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => std::future::pending().await,
    }
}

/// Sends `request` and reads its whole answer: the status and the body's bytes (the reviews
/// envlens creates, `own_rules` and the watch cache's `access`).
pub(crate) async fn exchange(
    client: &kube::Client,
    mut request: axum::http::Request<kube::client::Body>,
) -> Result<(axum::http::StatusCode, bytes::Bytes), kube::Error> {
    observe::name_cause(request.headers_mut());
    let response = client.send(request).await?;
    let status = response.status();
    let bytes = response.into_body().collect_bytes().await?;
    Ok((status, bytes))
}
