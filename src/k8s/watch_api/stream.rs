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
use crate::k8s::watch::{Change, KindView};
use crate::resources::object::Object;

/// What every watch of one socket shares.
#[derive(Clone)]
pub struct Watcher {
    pub cluster: Cluster,
    /// The user's impersonation headers (none under `access_as: agent`).
    pub headers: Arc<HeaderMap>,
    pub outbox: mpsc::Sender<String>,
    pub timeout: Duration,
}

impl Watcher {
    async fn send(&self, message: String) -> bool {
        self.outbox.send(message).await.is_ok()
    }

    async fn fail(&self, id: &str, code: Option<u16>, message: &str) {
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
        match params
            .cached(&kinds)
            .filter(|_| self.cluster.watch.enabled())
        {
            Some((kind, selection)) => {
                let kind = kind.clone();
                self.cached(&id, &params.namespace, &kind, &selection).await
            }
            None => self.at_cluster(&id, &params).await,
        }
    }

    async fn cached(&self, id: &str, namespace: &str, kind: &ApiKind, selection: &Selection) {
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
            Err(refused) => return self.fail(id, refused.code, &refused.message).await,
        };
        view.synced(self.timeout).await;
        let mut sent = Sent::default();
        if !self.resync(id, &view, selection, &mut sent).await {
            return;
        }
        loop {
            let events = match changes.recv().await {
                Ok(change) if change.kind != *kind => continue,
                Ok(change) => match change.change {
                    Change::Applied(object) => {
                        let name = name(&object);
                        let picked = selection.picks(&object).then(|| Arc::new(object));
                        sent.apply(&name, picked)
                    }
                    Change::Deleted(object) => sent.apply(&name(&object), None),
                    Change::Reset => {
                        if !self.resync(id, &view, selection, &mut sent).await {
                            return;
                        }
                        continue;
                    }
                },
                Err(RecvError::Lagged(_)) => {
                    if !self.resync(id, &view, selection, &mut sent).await {
                        return;
                    }
                    continue;
                }
                Err(RecvError::Closed) => {
                    return self
                        .fail(id, Some(503), "the watch cache stopped this namespace")
                        .await
                }
            };
            for (event, object) in events {
                if !self.send(protocol::data(id, event, &object, kind)).await {
                    return;
                }
            }
        }
    }

    /// Brings the watcher to the kind's objects now; false when the socket is gone. A kind
    /// whose list fails is an error message (the watch stays, and recovers on the next reset).
    async fn resync(
        &self,
        id: &str,
        view: &KindView,
        selection: &Selection,
        sent: &mut Sent,
    ) -> bool {
        let objects = match view.objects() {
            Ok(objects) => objects,
            Err(failure) => {
                return self
                    .send(protocol::error(Some(id), failure.code, &failure.message))
                    .await
            }
        };
        let picked = objects.into_iter().filter(|o| selection.picks(o)).collect();
        for (event, object) in sent.sync(picked) {
            if !self
                .send(protocol::data(id, event, &object, view.kind()))
                .await
            {
                return false;
            }
        }
        true
    }

    /// A watch of the cluster as the user, resumed from its last version when the server ends
    /// it; a version too old (`410 Gone`) or any refusal is an error message, and the end.
    async fn at_cluster(&self, id: &str, params: &Params) {
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
                let bytes = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let message = discovery::error_message(status, &bytes);
                return self.fail(id, Some(status.as_u16()), &message).await;
            }
            let mut buffer: Vec<u8> = Vec::new();
            loop {
                let data = match body.frame().await {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => data,
                        Err(_) => continue,
                    },
                    // The server ended the watch: resume from the last version.
                    None | Some(Err(_)) => break,
                };
                buffer.extend_from_slice(&data);
                while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=end).collect();
                    match self.forward(id, &line, &mut version).await {
                        Forwarded::Sent => {}
                        Forwarded::Gone => return,
                    }
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

fn name(object: &Object) -> String {
    object
        .view
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(crate::resources::tree::Tree::as_str)
        .unwrap_or("")
        .to_owned()
}
