//! The long-lived responses: watches (newline-delimited JSON events) and followed pod logs.
//! Each ends when the client disconnects, on `timeoutSeconds`, or when the server stops.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use super::handlers::{filter_for, Ctx, Target};
use super::logs;
use super::selectors::Filter;
use super::status::{bytes_response, ApiError};
use super::store::{Event, EventType};
use super::KubeApi;

/// Counts a stream as open until it is dropped (client gone, timeout or shutdown).
struct StreamGuard(KubeApi);

impl StreamGuard {
    fn new(api: &KubeApi) -> Self {
        api.inner.open_streams.fetch_add(1, Ordering::SeqCst);
        StreamGuard(api.clone())
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.inner.open_streams.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn stopped(rx: &mut Option<watch::Receiver<bool>>) {
    match rx {
        // An error means the server handle is gone: stop too.
        Some(rx) => {
            let _ = rx.wait_for(|s| *s).await;
        }
        None => std::future::pending().await,
    }
}

fn event_line(kind: &str, obj: &Value) -> Bytes {
    let mut out = format!("{{\"type\":\"{kind}\",\"object\":").into_bytes();
    let _ = serde_json::to_writer(&mut out, obj);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// The line a filtered watcher should get for `ev`: objects that start or stop matching the
/// selectors turn into ADDED/DELETED, as the apiserver's watch cache does.
fn render(ev: &Event, filter: &Filter) -> Option<Bytes> {
    let now = filter.matches(&ev.object);
    let before = ev.prev.as_deref().is_some_and(|p| filter.matches(p));
    let kind = match (ev.kind, before, now) {
        (EventType::Added, _, true) => "ADDED",
        (EventType::Modified, true, true) => "MODIFIED",
        (EventType::Modified, false, true) => "ADDED",
        (EventType::Modified, true, false) => "DELETED",
        (EventType::Deleted, _, true) => "DELETED",
        _ => return None,
    };
    Some(event_line(kind, &ev.object))
}

struct WatchState {
    rx: broadcast::Receiver<Arc<Event>>,
    pending: VecDeque<Bytes>,
    filter: Filter,
    res: (String, String),
    deadline: Option<tokio::time::Instant>,
    shutdown: Option<watch::Receiver<bool>>,
    /// `allowWatchBookmarks=true`: the interval, and the type the bookmarks name.
    bookmarks: Option<(tokio::time::Interval, String, String)>,
    /// The version of the last event this watch has passed (sent or filtered out): what a
    /// bookmark may promise, since every earlier change has gone by.
    seen_rv: u64,
    /// Changes when the test drops every watch.
    cut: watch::Receiver<u64>,
    api: super::KubeApi,
    _guard: StreamGuard,
}

fn bookmark(kind: &str, api_version: &str, rv: u64) -> Bytes {
    event_line(
        "BOOKMARK",
        &json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": rv.to_string()}}),
    )
}

async fn tick(bookmarks: &mut Option<(tokio::time::Interval, String, String)>) {
    match bookmarks {
        Some((interval, _, _)) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// `?watch=true`: the current matching objects as ADDED (unless a resourceVersion says where to
/// resume), then live changes; with `allowWatchBookmarks=true`, a BOOKMARK with the current
/// version every [`super::KubeApi::set_bookmark_interval`]. A version older than the kept
/// history answers one ERROR event carrying a 410 `Expired` Status. `sendInitialEvents` ends the initial part with the
/// `k8s.io/initial-events-end` bookmark that streaming-list clients wait for.
pub(crate) fn watch(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    let filter = filter_for(ctx, t)?;
    let send_initial = ctx.query.flag("sendInitialEvents");
    let since = match ctx.query.get("resourceVersion") {
        _ if send_initial => None,
        None | Some("" | "0") => None,
        Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("resourceVersion: Invalid value: {rv:?}"))
        })?),
    };
    // As in the apiserver, 0 or no timeoutSeconds means the server's own (long) limit.
    let deadline = match ctx.query.get("timeoutSeconds").filter(|s| !s.is_empty()) {
        Some(s) => {
            let secs = s.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("timeoutSeconds: Invalid value: {s:?}"))
            })?;
            (secs > 0).then(|| tokio::time::Instant::now() + Duration::from_secs(secs))
        }
        None => None,
    };
    let res = t.kind.store_key();
    let sub = match ctx
        .api
        .inner
        .store
        .subscribe(&res, t.namespace.as_deref(), since)
    {
        Ok(sub) => sub,
        Err(oldest) => {
            // The apiserver answers 200 and sends the 410 as an ERROR event.
            let gone = ApiError::new(
                410,
                "Expired",
                format!(
                    "too old resource version: {} ({oldest})",
                    since.unwrap_or_default()
                ),
            );
            return Ok(bytes_response(
                200,
                "application/json",
                event_line("ERROR", &gone.status()),
            ));
        }
    };
    let mut pending: VecDeque<Bytes> = sub
        .initial
        .iter()
        .filter_map(|ev| render(ev, &filter))
        .collect();
    if send_initial && ctx.query.flag("allowWatchBookmarks") {
        pending.push_back(event_line(
            "BOOKMARK",
            &json!({
                "kind": t.kind.kind,
                "apiVersion": t.kind.api_version(),
                "metadata": {
                    "resourceVersion": sub.rv.to_string(),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            }),
        ));
    }
    let bookmarks = ctx.query.flag("allowWatchBookmarks").then(|| {
        let every = *super::lock(&ctx.api.inner.bookmark_interval);
        let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        (interval, t.kind.kind.clone(), t.kind.api_version())
    });
    let state = WatchState {
        rx: sub.rx,
        pending,
        filter,
        res,
        deadline,
        shutdown: ctx.shutdown.clone(),
        bookmarks,
        seen_rv: sub.rv,
        cut: ctx.api.inner.cut.subscribe(),
        api: ctx.api.clone(),
        _guard: StreamGuard::new(&ctx.api),
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        if let Some(line) = st.pending.pop_front() {
            return Some((Ok::<_, Infallible>(line), st));
        }
        loop {
            let received = tokio::select! {
                _ = sleep_until(st.deadline) => return None,
                _ = stopped(&mut st.shutdown) => return None,
                _ = st.cut.changed() => return None,
                _ = tick(&mut st.bookmarks) => {
                    let line = match &st.bookmarks {
                        Some((_, kind, api_version)) => bookmark(kind, api_version, st.seen_rv),
                        None => continue,
                    };
                    return Some((Ok(line), st));
                }
                r = st.rx.recv() => r,
            };
            if let Ok(ev) = &received {
                st.seen_rv = ev.rv;
            }
            match received {
                Ok(ev) if ev.res == st.res => {
                    if let Some(line) = render(&ev, &st.filter) {
                        let delay = *super::lock(&st.api.inner.watch_delay);
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        return Some((Ok(line), st));
                    }
                }
                Ok(_) => {}
                // A watcher that fell behind is cut off; clients re-list and watch again.
                Err(_) => return None,
            }
        }
    });
    Ok(bytes_response(
        200,
        "application/json",
        Body::from_stream(stream),
    ))
}

struct LogState {
    rx: broadcast::Receiver<Arc<logs::Chunk>>,
    first: Option<Bytes>,
    namespace: String,
    pod: String,
    container: String,
    shutdown: Option<watch::Receiver<bool>>,
    _guard: StreamGuard,
}

/// `GET …/pods/<name>/log`: container selection and errors as the apiserver words them,
/// `tailLines`, and `follow=true` streaming appended text until the client leaves.
pub(crate) fn pod_log(ctx: &Ctx, t: &Target) -> Result<Response, ApiError> {
    let name = t.name.as_deref().unwrap_or("");
    let inner = &ctx.api.inner;
    let pod = inner.store.get(&t.kind.store_key(), t.ns(), name);
    if pod.is_none() && !inner.logs.has_any(t.ns(), name) {
        return Err(ApiError::not_found(&t.kind, name));
    }
    let containers: Vec<String> = pod
        .as_deref()
        .map(|p| {
            ["containers", "initContainers", "ephemeralContainers"]
                .iter()
                .filter_map(|f| p["spec"][f].as_array())
                .flatten()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut container = ctx
        .query
        .get("container")
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    if container.is_none() {
        let main: Vec<&String> = pod.as_deref().map_or(Vec::new(), |p| {
            p["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["name"].as_str())
                .filter_map(|n| containers.iter().find(|c| *c == n))
                .collect()
        });
        match main.as_slice() {
            [] => {}
            [only] => container = Some(only.to_string()),
            many => {
                let names: Vec<&str> = many.iter().map(|s| s.as_str()).collect();
                return Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    names.join(" ")
                )));
            }
        }
    }
    if let Some(c) = &container {
        if !containers.is_empty() && !containers.contains(c) {
            return Err(ApiError::bad_request(format!(
                "container {c} is not valid for pod {name}"
            )));
        }
    }
    let (key, text, rx) = inner.logs.read(t.ns(), name, container.as_deref());
    // `previous=true`: the last terminated run, as the kubelet words its absence.
    let text = if ctx.query.flag("previous") {
        match inner.logs.previous(t.ns(), name, &key) {
            Some(text) => text,
            None => {
                return Err(ApiError::bad_request(format!(
                    "previous terminated container \"{key}\" in pod \"{name}\" not found"
                )))
            }
        }
    } else {
        text
    };
    let text = match ctx
        .query
        .get("tailLines")
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(n) => logs::tail(&text, n).to_string(),
        None => text,
    };
    if !ctx.query.flag("follow") {
        return Ok(bytes_response(200, "text/plain", text));
    }
    let state = LogState {
        rx,
        first: Some(Bytes::from(text)).filter(|b| !b.is_empty()),
        namespace: t.ns().to_string(),
        pod: name.to_string(),
        container: key,
        shutdown: ctx.shutdown.clone(),
        _guard: StreamGuard::new(&ctx.api),
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        if let Some(first) = st.first.take() {
            return Some((Ok::<_, Infallible>(first), st));
        }
        loop {
            let received = tokio::select! {
                _ = stopped(&mut st.shutdown) => return None,
                r = st.rx.recv() => r,
            };
            match received {
                Ok(c)
                    if c.namespace == st.namespace
                        && c.pod == st.pod
                        && c.container == st.container =>
                {
                    return Some((Ok(Bytes::from(c.text.clone())), st));
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Ok(bytes_response(200, "text/plain", Body::from_stream(stream)))
}
