//! The demo's Kubernetes API server, inside the binary: enough of the API for envlens to show
//! a cluster without one (discovery, lists with label selectors, watches from a
//! `resourceVersion`, objects by name, Pods' logs followed), over objects the demo's script
//! changes (`demo::world`). No controllers, no writes from clients, no authentication: it
//! listens on 127.0.0.1 only, for the envlens process that started it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body::Frame;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

/// A kind the demo cluster serves.
struct Kind {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
}

const KINDS: &[Kind] = &[
    Kind {
        group: "",
        version: "v1",
        kind: "Pod",
        plural: "pods",
    },
    Kind {
        group: "",
        version: "v1",
        kind: "Service",
        plural: "services",
    },
    Kind {
        group: "",
        version: "v1",
        kind: "ConfigMap",
        plural: "configmaps",
    },
    Kind {
        group: "",
        version: "v1",
        kind: "Secret",
        plural: "secrets",
    },
    Kind {
        group: "",
        version: "v1",
        kind: "PersistentVolumeClaim",
        plural: "persistentvolumeclaims",
    },
    Kind {
        group: "",
        version: "v1",
        kind: "Event",
        plural: "events",
    },
    Kind {
        group: "apps",
        version: "v1",
        kind: "Deployment",
        plural: "deployments",
    },
    Kind {
        group: "apps",
        version: "v1",
        kind: "ReplicaSet",
        plural: "replicasets",
    },
    Kind {
        group: "apps",
        version: "v1",
        kind: "StatefulSet",
        plural: "statefulsets",
    },
    Kind {
        group: "batch",
        version: "v1",
        kind: "CronJob",
        plural: "cronjobs",
    },
    Kind {
        group: "batch",
        version: "v1",
        kind: "Job",
        plural: "jobs",
    },
    Kind {
        group: "networking.k8s.io",
        version: "v1",
        kind: "Ingress",
        plural: "ingresses",
    },
    // Flux's, for the GitOps environment (`super::flux`).
    Kind {
        group: "kustomize.toolkit.fluxcd.io",
        version: "v1",
        kind: "Kustomization",
        plural: "kustomizations",
    },
];

fn api_version(k: &Kind) -> String {
    if k.group.is_empty() {
        k.version.to_owned()
    } else {
        format!("{}/{}", k.group, k.version)
    }
}

fn kind_of(object: &Value) -> Option<&'static Kind> {
    let (v, k) = (object["apiVersion"].as_str()?, object["kind"].as_str()?);
    KINDS.iter().find(|x| x.kind == k && api_version(x) == v)
}

/// How many changes a watch may resume from; older versions get 410 Gone, as etcd compacts.
const HISTORY: usize = 20_000;
const LOG_LINES: usize = 2_000;

#[derive(Clone)]
struct Change {
    version: u64,
    plural: &'static str,
    namespace: String,
    event: &'static str,
    object: Value,
}

#[derive(Default)]
struct Store {
    version: u64,
    objects: BTreeMap<(&'static str, String, String), Value>,
    history: VecDeque<Change>,
    logs: HashMap<(String, String, String), VecDeque<String>>,
}

/// The cluster: cheap to clone, every clone the same objects.
#[derive(Clone)]
pub struct DemoCluster {
    store: Arc<Mutex<Store>>,
    changes: broadcast::Sender<Change>,
    logs: broadcast::Sender<((String, String, String), String)>,
}

impl Default for DemoCluster {
    fn default() -> Self {
        DemoCluster {
            store: Arc::default(),
            changes: broadcast::channel(4096).0,
            logs: broadcast::channel(4096).0,
        }
    }
}

impl DemoCluster {
    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates or replaces an object, giving it a uid, a creation time and a new version.
    pub fn put(&self, mut object: Value) {
        let Some(kind) = kind_of(&object) else {
            tracing::warn!("demo cluster: no kind for {object}");
            return;
        };
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let mut store = self.store();
        store.version += 1;
        let version = store.version;
        let key = (kind.plural, ns.clone(), name.clone());
        let previous = store.objects.get(&key);
        let meta = &mut object["metadata"];
        meta["namespace"] = json!(ns);
        meta["resourceVersion"] = json!(version.to_string());
        if meta.get("uid").is_none() {
            meta["uid"] = previous
                .map(|p| p["metadata"]["uid"].clone())
                .unwrap_or_else(|| {
                    json!(format!(
                        "demo-{}-{ns}-{name}",
                        kind.kind.to_ascii_lowercase()
                    ))
                });
        }
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = previous
                .map(|p| p["metadata"]["creationTimestamp"].clone())
                .unwrap_or_else(|| json!(now()));
        }
        let event = if previous.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        store.objects.insert(key, object.clone());
        self.record(
            &mut store,
            Change {
                version,
                plural: kind.plural,
                namespace: ns,
                event,
                object,
            },
        );
    }

    /// Removes an object (by kind and name); nothing when it is not there.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let Some(k) = KINDS.iter().find(|k| k.kind == kind) else {
            return;
        };
        let mut store = self.store();
        let Some(mut object) =
            store
                .objects
                .remove(&(k.plural, namespace.to_owned(), name.to_owned()))
        else {
            return;
        };
        store.version += 1;
        let version = store.version;
        object["metadata"]["resourceVersion"] = json!(version.to_string());
        self.record(
            &mut store,
            Change {
                version,
                plural: k.plural,
                namespace: namespace.to_owned(),
                event: "DELETED",
                object,
            },
        );
    }

    fn record(&self, store: &mut Store, change: Change) {
        store.history.push_back(change.clone());
        if store.history.len() > HISTORY {
            store.history.pop_front();
        }
        let _ = self.changes.send(change);
    }

    /// An object, as stored.
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let k = KINDS.iter().find(|k| k.kind == kind)?;
        self.store()
            .objects
            .get(&(k.plural, namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// The names of a kind's objects in a namespace.
    pub fn names(&self, kind: &str, namespace: &str) -> Vec<String> {
        let Some(k) = KINDS.iter().find(|k| k.kind == kind) else {
            return Vec::new();
        };
        self.store()
            .objects
            .keys()
            .filter(|(p, ns, _)| *p == k.plural && ns == namespace)
            .map(|(_, _, n)| n.clone())
            .collect()
    }

    /// Appends a line to a container's log.
    pub fn log(&self, namespace: &str, pod: &str, container: &str, line: String) {
        let key = (namespace.to_owned(), pod.to_owned(), container.to_owned());
        let mut store = self.store();
        let lines = store.logs.entry(key.clone()).or_default();
        lines.push_back(line.clone());
        if lines.len() > LOG_LINES {
            lines.pop_front();
        }
        drop(store);
        let _ = self.logs.send((key, line));
    }

    /// Serves the API on 127.0.0.1 (a free port); the address.
    pub async fn serve(&self) -> std::io::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let router = Router::new().fallback(handle).with_state(self.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "demo cluster stopped");
            }
        });
        Ok(addr)
    }

    /// A kubeconfig that leads to the served API.
    pub fn kubeconfig(addr: SocketAddr) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: demo\n  cluster:\n    server: http://{addr}\n\
             users:\n- name: demo\n  user: {{}}\ncontexts:\n- name: demo\n  context:\n    cluster: demo\n    user: demo\n\
             current-context: demo\n"
        )
    }
}

pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn status(code: u16, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code});
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST),
        axum::Json(body),
    )
        .into_response()
}

fn query(uri: &Uri) -> HashMap<String, String> {
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect()
}

fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                out.push(
                    u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?, 16).ok()?,
                );
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// `a=b,c=d` (and `a==b`): the equality selectors envlens sends.
fn matches(selector: &str, labels: &Value) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .unwrap_or((term, ""));
        labels[k.trim()].as_str() == Some(v.trim())
    })
}

async fn handle(State(cluster): State<DemoCluster>, method: Method, uri: Uri) -> Response {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let q = query(&uri);
    if method == Method::POST {
        // The access reviews of `access_as: user`: the demo allows everything.
        if uri.path().ends_with("/subjectaccessreviews") {
            return (
                StatusCode::CREATED,
                axum::Json(json!({"apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview", "status": {"allowed": true}})),
            )
                .into_response();
        }
        return status(
            405,
            "MethodNotAllowed",
            "the demo cluster is read-only".into(),
        );
    }
    if method != Method::GET {
        return status(
            405,
            "MethodNotAllowed",
            "the demo cluster is read-only".into(),
        );
    }
    let (group, version, rest): (&str, &str, &[&str]) = match segments.as_slice() {
        ["version"] => {
            return axum::Json(
                json!({"major": "1", "minor": "31", "gitVersion": "v1.31.0-envlens-demo",
                                     "platform": "linux/amd64"}),
            )
            .into_response()
        }
        ["api"] => {
            return axum::Json(json!({"kind": "APIVersions", "versions": ["v1"]})).into_response()
        }
        ["apis"] => {
            let mut groups: Vec<&str> = KINDS
                .iter()
                .map(|k| k.group)
                .filter(|g| !g.is_empty())
                .collect();
            groups.dedup();
            let groups: Vec<Value> = groups
                .iter()
                .map(|g| {
                    json!({"name": g,
                "versions": [{"groupVersion": format!("{g}/v1"), "version": "v1"}],
                "preferredVersion": {"groupVersion": format!("{g}/v1"), "version": "v1"}})
                })
                .collect();
            return axum::Json(
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            )
            .into_response();
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => {
            return status(
                404,
                "NotFound",
                format!("the server could not find {}", uri.path()),
            )
        }
    };
    let kinds: Vec<&Kind> = KINDS
        .iter()
        .filter(|k| k.group == group && k.version == version)
        .collect();
    if kinds.is_empty() {
        return status(
            404,
            "NotFound",
            format!("no API group version {group}/{version}"),
        );
    }
    match rest {
        [] => {
            let resources: Vec<Value> = kinds.iter().flat_map(|k| {
                let verbs = json!(["get", "list", "watch"]);
                let mut out = vec![json!({"name": k.plural, "singularName": "", "namespaced": true, "kind": k.kind, "verbs": verbs})];
                if k.plural == "pods" {
                    out.push(json!({"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]}));
                }
                out
            }).collect();
            let gv = if group.is_empty() {
                version.to_owned()
            } else {
                format!("{group}/{version}")
            };
            axum::Json(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})).into_response()
        }
        ["namespaces", ns, plural] => {
            let Some(kind) = kinds.iter().find(|k| k.plural == *plural) else {
                return status(
                    404,
                    "NotFound",
                    format!("the server could not find the requested resource ({plural})"),
                );
            };
            if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
                watch(&cluster, kind, ns, &q)
            } else {
                list(&cluster, kind, ns, &q)
            }
        }
        ["namespaces", ns, plural, name] => {
            let Some(kind) = kinds.iter().find(|k| k.plural == *plural) else {
                return status(
                    404,
                    "NotFound",
                    format!("the server could not find the requested resource ({plural})"),
                );
            };
            match cluster.get(kind.kind, ns, name) {
                Some(object) => axum::Json(object).into_response(),
                None => status(404, "NotFound", format!("{plural} \"{name}\" not found")),
            }
        }
        ["namespaces", ns, "pods", name, "log"] => logs(&cluster, ns, name, &q),
        _ => status(
            404,
            "NotFound",
            format!("the server could not find {}", uri.path()),
        ),
    }
}

fn list(cluster: &DemoCluster, kind: &Kind, ns: &str, q: &HashMap<String, String>) -> Response {
    let selector = q.get("labelSelector").map(String::as_str).unwrap_or("");
    let store = cluster.store();
    let items: Vec<Value> = store
        .objects
        .range((kind.plural, ns.to_owned(), String::new())..)
        .take_while(|((p, n, _), _)| *p == kind.plural && n == ns)
        .filter(|(_, o)| matches(selector, &o["metadata"]["labels"]))
        .map(|(_, o)| o.clone())
        .collect();
    let body = json!({"kind": format!("{}List", kind.kind), "apiVersion": api_version(kind),
                      "metadata": {"resourceVersion": store.version.to_string()}, "items": items});
    axum::Json(body).into_response()
}

/// Lines to the client as they come; ends when the client goes.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

fn streaming(content_type: &'static str) -> (mpsc::Sender<Bytes>, Response) {
    let (tx, rx) = mpsc::channel(256);
    let mut res = Response::new(Body::new(ChannelBody(rx)));
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    (tx, res)
}

fn watch(cluster: &DemoCluster, kind: &Kind, ns: &str, q: &HashMap<String, String>) -> Response {
    let selector = q.get("labelSelector").cloned().unwrap_or_default();
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse().ok())
        .unwrap_or(1800u64)
        .min(3600);
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut live = cluster.changes.subscribe();
    let (backlog, current) = {
        let store = cluster.store();
        let oldest = store.history.front().map_or(store.version, |c| c.version);
        if from != 0 && from + 1 < oldest {
            drop(store);
            let (tx, res) = streaming("application/json");
            let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": format!("too old resource version: {from} ({oldest})"), "reason": "Expired", "code": 410}});
            tokio::spawn(async move {
                let _ = tx.send(Bytes::from(format!("{gone}\n"))).await;
            });
            return res;
        }
        let backlog: Vec<Change> = if from == 0 {
            // No version: every object as ADDED, as the API server starts a watch.
            store
                .objects
                .iter()
                .filter(|((p, n, _), _)| *p == kind.plural && n == ns)
                .map(|(_, o)| Change {
                    version: 0,
                    plural: kind.plural,
                    namespace: ns.to_owned(),
                    event: "ADDED",
                    object: o.clone(),
                })
                .collect()
        } else {
            store
                .history
                .iter()
                .filter(|c| c.version > from && c.plural == kind.plural && c.namespace == ns)
                .cloned()
                .collect()
        };
        (backlog, store.version)
    };
    let (tx, res) = streaming("application/json");
    let plural = kind.plural;
    let ns = ns.to_owned();
    tokio::spawn(async move {
        let line = |c: &Change| {
            Bytes::from(format!(
                "{}\n",
                json!({"type": c.event, "object": c.object})
            ))
        };
        for c in &backlog {
            if matches(&selector, &c.object["metadata"]["labels"])
                && tx.send(line(c)).await.is_err()
            {
                return;
            }
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        let mut bookmark = tokio::time::interval(Duration::from_secs(20));
        let mut last = current;
        loop {
            tokio::select! {
                () = &mut deadline => return,
                () = tx.closed() => return,
                _ = bookmark.tick() => {
                    let b = json!({"type": "BOOKMARK", "object": {"kind": "Bookmark", "metadata": {"resourceVersion": last.to_string()}}});
                    if tx.send(Bytes::from(format!("{b}\n"))).await.is_err() { return; }
                }
                change = live.recv() => match change {
                    Ok(c) => {
                        last = last.max(c.version);
                        if c.version > current && c.plural == plural && c.namespace == ns
                            && matches(&selector, &c.object["metadata"]["labels"])
                            && tx.send(line(&c)).await.is_err() {
                            return;
                        }
                    }
                    // Fell behind: the client lists again, as after a compaction.
                    Err(_) => return,
                },
            }
        }
    });
    res
}

fn logs(cluster: &DemoCluster, ns: &str, pod: &str, q: &HashMap<String, String>) -> Response {
    let Some(object) = cluster.get("Pod", ns, pod) else {
        return status(404, "NotFound", format!("pods \"{pod}\" not found"));
    };
    let containers: Vec<String> = object["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect();
    let container = match q.get("container") {
        Some(c) if containers.contains(c) => c.clone(),
        Some(c) => {
            return status(
                400,
                "BadRequest",
                format!("container {c} is not valid for pod {pod}"),
            )
        }
        None if containers.len() == 1 => containers[0].clone(),
        None => {
            return status(
                400,
                "BadRequest",
                format!(
                "a container name must be specified for pod {pod}, choose one of: {containers:?}"
            ),
            )
        }
    };
    let tail: usize = q
        .get("tailLines")
        .and_then(|t| t.parse().ok())
        .unwrap_or(LOG_LINES);
    let key = (ns.to_owned(), pod.to_owned(), container);
    let mut live = cluster.logs.subscribe();
    let backlog: Vec<String> = {
        let store = cluster.store();
        let lines = store.logs.get(&key);
        let skip = lines.map_or(0, |l| l.len().saturating_sub(tail));
        lines.into_iter().flatten().skip(skip).cloned().collect()
    };
    let follow = q.get("follow").is_some_and(|f| f == "true" || f == "1");
    let (tx, res) = streaming("text/plain");
    tokio::spawn(async move {
        for line in backlog {
            if tx.send(Bytes::from(line + "\n")).await.is_err() {
                return;
            }
        }
        if !follow {
            return;
        }
        loop {
            tokio::select! {
                () = tx.closed() => return,
                got = live.recv() => match got {
                    Ok((k, line)) if k == key => {
                        if tx.send(Bytes::from(line + "\n")).await.is_err() { return; }
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return,
                },
            }
        }
    });
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equality_selectors() {
        let labels = json!({"app": "web", "tier": "front"});
        assert!(matches("app=web,tier==front", &labels));
        assert!(!matches("app=api", &labels));
        assert!(matches("", &labels));
        assert_eq!(decode("a%3Db%2Cc").as_deref(), Some("a=b,c"));
    }

    #[test]
    fn objects_get_versions_uids_and_a_history() {
        let c = DemoCluster::default();
        c.put(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}}));
        c.put(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}}}));
        let pod = c.get("Pod", "ns", "p").unwrap();
        assert_eq!(pod["metadata"]["resourceVersion"], "2");
        assert_eq!(pod["metadata"]["uid"], "demo-pod-ns-p");
        c.delete("Pod", "ns", "p");
        let store = c.store();
        let events: Vec<&str> = store.history.iter().map(|h| h.event).collect();
        assert_eq!(events, ["ADDED", "MODIFIED", "DELETED"]);
    }
}
