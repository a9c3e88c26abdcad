//! One watch of a WebSocket: from the watch cache when it can serve the parameters, else a
//! watch of the cluster as the user (a cluster-scoped kind, all namespaces, a selector only the
//! API server evaluates). Either way the messages go to the socket's outbox.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, Request};
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::protocol::{self, Params, Selection, Sent};
use crate::k8s::clusters::Cluster;
use crate::k8s::discovery::{self, ApiKind};
use crate::k8s::fetch::encode;
use crate::k8s::lines::{Lines, MAX_EVENT};
use crate::k8s::watch::{Change, KindView};
use crate::resources::object::Object;

/// The most of a cluster's refusal read for its message.
const MAX_ERROR_BODY: usize = 64 << 10;

/// What every watch of one socket shares.
#[derive(Clone)]
pub struct Watcher {
    pub cluster: Cluster,
    /// The user's impersonation headers (none under `access_as: agent`).
    pub headers: Arc<HeaderMap>,
    pub outbox: mpsc::Sender<String>,
    pub timeout: Duration,
    /// The way to the owner of the connection (SPEC 16), for a socket on a replica that
    /// shares the clusters; its watches the cache would serve are served by the owner's
    /// cache then ([`super::through_owner`]).
    pub through: Option<super::through_owner::Through>,
    /// Serving another replica's socket: [`super::through_owner::SYNCED`] follows the first
    /// complete sync, so that it knows which objects are gone.
    pub for_replica: bool,
    /// How often a watch served from the cache asks again whether its viewer may list and
    /// watch the kind (`kubernetes.access_cache`, SPEC 8.1): a decision is reused no longer
    /// than that, however long the socket lives.
    pub recheck: Duration,
}

/// How a watch served from the cache ended.
pub(super) enum Ended {
    /// The socket went away.
    SocketGone,
    /// The cache stopped the namespace (idle, bounded, or the connection handed over).
    Closed,
    /// The viewer may no longer watch the kind: said to them, and the watch is over.
    Refused,
}

/// What a resync did.
enum Resynced {
    Done,
    /// The kind's list failed: said to the watcher, who keeps what it had.
    Failed,
    /// This replica no longer holds the connection, and the watch follows it elsewhere.
    NotHeld,
    SocketGone,
}

impl Watcher {
    pub(super) async fn send(&self, message: String) -> bool {
        self.outbox.send(message).await.is_ok()
    }

    /// Whether the watch goes on elsewhere when this replica stops holding the connection:
    /// one served for another replica, or one that can follow the owner.
    fn follows_owner(&self) -> bool {
        self.for_replica || self.through.is_some()
    }

    pub(super) async fn fail(&self, id: &str, code: Option<u16>, message: &str) {
        self.send(protocol::error(Some(id), code, message)).await;
    }

    /// Runs the watch `id` until the socket closes (the task is then aborted) or it fails.
    pub async fn run(self, id: String, params: Params) {
        if let Some(why) = params.invalid() {
            return self.fail(&id, Some(400), &why).await;
        }
        let kinds = match self.cluster.discovery.kinds().await {
            Ok(d) => d.kinds,
            Err(e) => return self.fail(&id, e.code, &e.message).await,
        };
        let Some((kind, selection)) = params.cached(&kinds) else {
            return self.at_cluster(&id, &params).await;
        };
        let kind = kind.clone();
        // Sharing the clusters, the watch follows the connection wherever it is held.
        let follows = self.through.as_ref().is_some_and(|through| {
            through.forward.shares()
                && (self.cluster.watch.enabled() || through.owner(&self.cluster).is_some())
        });
        if follows {
            return self.through_owner(&id, &params, &kind, &selection).await;
        }
        if self.cluster.watch.enabled() {
            let mut sent = Sent::default();
            if let Ended::Closed = self
                .cached(&id, &params.namespace, &kind, &selection, &mut sent)
                .await
            {
                self.fail(&id, Some(503), "the watch cache stopped this namespace")
                    .await
            }
            return;
        }
        self.at_cluster(&id, &params).await
    }

    /// The watch from this replica's cache, from what the watcher was `sent` before.
    pub(super) async fn cached(
        &self,
        id: &str,
        namespace: &str,
        kind: &ApiKind,
        selection: &Selection,
        sent: &mut Sent,
    ) -> Ended {
        let cache = &self.cluster.watch;
        // Listen first, then read: no change falls between the two.
        let mut changes = cache.changes(namespace);
        let view = match cache
            .view_kind(
                &self.cluster.discovery,
                &self.headers,
                namespace,
                kind,
                500,
                self.timeout,
            )
            .await
        {
            Ok(view) => view,
            Err(_) if self.follows_owner() && !self.cluster.watch.held() => return Ended::Closed,
            Err(refused) => {
                self.fail(id, refused.code, &refused.message).await;
                return Ended::SocketGone;
            }
        };
        view.synced(self.timeout).await;
        // Another replica's socket learns when the first complete sync is over.
        let mut unmarked = self.for_replica;
        macro_rules! resync {
            () => {
                match self.resync(id, &view, selection, sent).await {
                    Resynced::SocketGone => return Ended::SocketGone,
                    Resynced::NotHeld => return Ended::Closed,
                    Resynced::Failed => {}
                    Resynced::Done if unmarked => {
                        if !self.send(super::through_owner::SYNCED.to_owned()).await {
                            return Ended::SocketGone;
                        }
                        unmarked = false;
                    }
                    Resynced::Done => {}
                }
            };
        }
        resync!();
        let mut recheck =
            tokio::time::interval_at(tokio::time::Instant::now() + self.recheck, self.recheck);
        let mut undecided = crate::auth::recheck::Undecided::default();
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                _ = recheck.tick() => {
                    match self.refusal(namespace, kind).await {
                        None => undecided.decided(),
                        // Refused, or undecidable too long: fail closed.
                        Some(refused) if refused.answered || undecided.failed() => {
                            self.fail(id, refused.code, &refused.message).await;
                            return Ended::Refused;
                        }
                        Some(_) => {}
                    }
                    continue;
                }
            };
            let events = match change {
                Ok(change) if change.kind != *kind => continue,
                Ok(change) => match &change.change {
                    Change::Applied(object) => {
                        let name = name(object);
                        let picked = selection.picks(object).then(|| Arc::new(object.clone()));
                        sent.apply(&name, picked)
                    }
                    Change::Deleted(object) => sent.apply(&name(object), None),
                    Change::Reset => {
                        resync!();
                        continue;
                    }
                },
                Err(RecvError::Lagged(_)) => {
                    resync!();
                    continue;
                }
                Err(RecvError::Closed) => return Ended::Closed,
            };
            for (event, object) in events {
                if !self.send(protocol::data(id, event, &object, kind)).await {
                    return Ended::SocketGone;
                }
            }
        }
    }

    /// Why the watcher may no longer list and watch `kind` in `namespace`, if they may not:
    /// asked as the first view of the watch was (a decision older than `access_cache` is
    /// asked of the cluster again).
    async fn refusal(
        &self,
        namespace: &str,
        kind: &ApiKind,
    ) -> Option<crate::k8s::discovery::Failure> {
        let decided = self
            .cluster
            .watch
            .access(
                &self.headers,
                namespace,
                std::slice::from_ref(kind),
                self.timeout,
            )
            .await;
        decided.into_iter().next().flatten()
    }

    /// Brings the watcher to the kind's objects now. A kind whose list fails is an error
    /// message (the watch stays, and recovers on the next reset).
    async fn resync(
        &self,
        id: &str,
        view: &KindView,
        selection: &Selection,
        sent: &mut Sent,
    ) -> Resynced {
        let objects = match view.objects() {
            Ok(objects) => objects,
            // The connection handed over: a watch that can follow it to the new owner
            // says nothing, and follows it.
            Err(_) if self.follows_owner() && !self.cluster.watch.held() => {
                return Resynced::NotHeld
            }
            Err(failure) => {
                let said = protocol::error(Some(id), failure.code, &failure.message);
                return match self.send(said).await {
                    true => Resynced::Failed,
                    false => Resynced::SocketGone,
                };
            }
        };
        let picked = objects.into_iter().filter(|o| selection.picks(o)).collect();
        for (event, object) in sent.sync(picked) {
            if !self
                .send(protocol::data(id, event, &object, view.kind()))
                .await
            {
                return Resynced::SocketGone;
            }
        }
        Resynced::Done
    }

    /// A watch of the cluster as the user, resumed from its last version when the server ends
    /// it; a version too old (`410 Gone`) or any refusal is an error message, and the end.
    pub(super) async fn at_cluster(&self, id: &str, params: &Params) {
        let mut version: Option<String> = None;
        loop {
            let mut uri = format!("{}?watch=true", params.path());
            for (key, value) in [
                ("labelSelector", &params.label_selector),
                ("fieldSelector", &params.field_selector),
            ] {
                if !value.is_empty() {
                    uri.push_str(&format!("&{key}={}", encode(value)));
                }
            }
            if let Some(v) = &version {
                uri.push_str(&format!("&resourceVersion={}", encode(v)));
            }
            let mut request = match Request::get(&uri).body(kube::client::Body::empty()) {
                Ok(r) => r,
                Err(e) => return self.fail(id, Some(400), &e.to_string()).await,
            };
            let headers = request.headers_mut();
            headers.extend(self.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
            headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
            let response =
                match tokio::time::timeout(self.timeout, self.cluster.client.send(request)).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => {
                        return self
                            .fail(
                                id,
                                Some(503),
                                &format!("the cluster cannot be reached: {e}"),
                            )
                            .await
                    }
                    Err(_) => {
                        return self
                            .fail(id, Some(504), "the cluster did not answer in time")
                            .await
                    }
                };
            let status = response.status();
            let mut body = response.into_body();
            if !status.is_success() {
                let bytes = http_body_util::Limited::new(body, MAX_ERROR_BODY)
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let message = discovery::error_message(status, &bytes);
                return self.fail(id, Some(status.as_u16()), &message).await;
            }
            let mut lines = Lines::default();
            loop {
                let data = match body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => data,
                        Err(_) => continue,
                    },
                    // The server ended the watch: resume from the last version.
                    None | Some(Err(_)) => break,
                };
                lines.push(&data);
                while let Some(line) = lines.next_line() {
                    match self.forward(id, line, &mut version).await {
                        Forwarded::Sent => {}
                        Forwarded::Gone => return,
                    }
                }
                if lines.rest() > MAX_EVENT {
                    let said = format!("the cluster sent an event over {} MiB", MAX_EVENT >> 20);
                    return self.fail(id, Some(502), &said).await;
                }
            }
            if version.is_none() {
                return self
                    .fail(
                        id,
                        Some(500),
                        "the cluster ended the watch before any event",
                    )
                    .await;
            }
        }
    }

    async fn forward(&self, id: &str, line: &[u8], version: &mut Option<String>) -> Forwarded {
        #[derive(Deserialize)]
        struct Line<'a> {
            #[serde(rename = "type")]
            kind: &'a str,
            #[serde(borrow)]
            object: &'a RawValue,
        }
        #[derive(Deserialize, Default)]
        struct Head {
            #[serde(default)]
            metadata: Meta,
        }
        #[derive(Deserialize, Default)]
        struct Meta {
            #[serde(default, rename = "resourceVersion")]
            resource_version: String,
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return Forwarded::Sent;
        }
        let Ok(event) = serde_json::from_slice::<Line>(line) else {
            self.fail(
                id,
                Some(500),
                "the cluster sent a watch event that is not JSON",
            )
            .await;
            return Forwarded::Gone;
        };
        if event.kind == "ERROR" {
            self.send(protocol::error_status(id, event.object.get()))
                .await;
            return Forwarded::Gone;
        }
        let head: Head = serde_json::from_str(event.object.get()).unwrap_or_default();
        if !head.metadata.resource_version.is_empty() {
            *version = Some(head.metadata.resource_version);
        }
        if event.kind == "BOOKMARK" {
            return Forwarded::Sent;
        }
        if self
            .send(protocol::data_raw(id, event.kind, event.object.get()))
            .await
        {
            Forwarded::Sent
        } else {
            Forwarded::Gone
        }
    }
}

enum Forwarded {
    Sent,
    Gone,
}

pub(super) fn name(object: &Object) -> String {
    object
        .view
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(crate::resources::tree::Tree::as_str)
        .unwrap_or("")
        .to_owned()
}
