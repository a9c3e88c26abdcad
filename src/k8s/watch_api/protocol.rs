//! The messages of GitLab's watch WebSocket (`gitlab-agent-watch-api`), as the frontend package
//! `@gitlab/cluster-client` (`WebSocketWatchManager`) sends and reads them, and the pure
//! decisions over them: which watches the cache can serve, and which events a watcher is owed.
//!
//! In: `{"type": "watch", "watch_id": ..., "watch_params": {"group", "version", "resource",
//! "namespace", "label_selector", "field_selector"}}` (the package converts its camelCase keys
//! to snake_case, deeply; camelCase is accepted too). Out: `{"watchId", "type": "data",
//! "watchEvent": {"type": "ADDED" | "MODIFIED" | "DELETED", "object"}}`, or `{"watchId",
//! "type": "error", "error": {"message", "object": <Kubernetes Status>}}`. The package keeps
//! each watch's objects by `metadata.uid`: an ADDED appends, a MODIFIED replaces the object of
//! the same uid and a DELETED removes it, so a watcher is sent each object's ADDED first and
//! never a MODIFIED for an object it was not given.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;

use crate::k8s::discovery::ApiKind;
use crate::resources::object::Object;
use crate::resources::tree::Tree;

/// A message from the browser.
#[derive(Debug, Deserialize)]
pub struct Incoming {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(alias = "watchId")]
    pub watch_id: Option<String>,
    #[serde(default, alias = "watchParams")]
    pub watch_params: Params,
}

/// What to watch: a resource of a group version, in a namespace or all of them.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
pub struct Params {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default, alias = "labelSelector")]
    pub label_selector: String,
    #[serde(default, alias = "fieldSelector")]
    pub field_selector: String,
}

/// The longest watch id accepted: GitLab's are like `k8sPods-n-default`.
pub const MAX_WATCH_ID: usize = 256;

impl Params {
    /// Why these parameters name no resource that could be watched, if so. The names end up
    /// in a path, so they must be plain Kubernetes names.
    pub fn invalid(&self) -> Option<String> {
        let name = |s: &str| {
            s.len() <= 253
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        };
        if self.version.is_empty() || self.resource.is_empty() {
            return Some("watch_params must name a version and a resource".into());
        }
        for (field, value) in [
            ("group", &self.group),
            ("version", &self.version),
            ("resource", &self.resource),
            ("namespace", &self.namespace),
        ] {
            if !name(value) || value.starts_with('.') {
                return Some(format!("watch_params.{field} is not a Kubernetes name"));
            }
        }
        None
    }

    /// `/api/v1` or `/apis/<group>/<version>`, then the namespace and resource.
    pub fn path(&self) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        if self.namespace.is_empty() {
            format!("{base}/{}", self.resource)
        } else {
            format!("{base}/namespaces/{}/{}", self.namespace, self.resource)
        }
    }

    /// The kind these parameters name among the cached kinds, when the cache can serve them:
    /// a watchable namespaced kind, in one namespace, with a selector the cache evaluates
    /// (equality terms on labels; `metadata.name` and `metadata.namespace` fields).
    pub fn cached<'a>(&self, kinds: &'a [ApiKind]) -> Option<(&'a ApiKind, Selection)> {
        if self.namespace.is_empty() {
            return None;
        }
        let kind = kinds.iter().find(|k| {
            k.group == self.group
                && k.version == self.version
                && k.plural == self.resource
                && k.namespaced
                && k.watchable
        })?;
        let labels = crate::k8s::fetch::equality_terms(&self.label_selector)?;
        let mut name = None;
        for term in self
            .field_selector
            .split(',')
            .filter(|t| !t.trim().is_empty())
        {
            let (key, value) = term.split_once("==").or_else(|| term.split_once('='))?;
            let (key, value) = (key.trim(), value.trim());
            if key.ends_with('!') {
                return None;
            }
            match key {
                "metadata.name" => name = Some(value.to_owned()),
                "metadata.namespace" if value == self.namespace => {}
                _ => return None,
            }
        }
        Some((kind, Selection { labels, name }))
    }
}

/// Which of a kind's cached objects a watch selects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub labels: Vec<(String, String)>,
    pub name: Option<String>,
}

impl Selection {
    pub fn picks(&self, object: &Object) -> bool {
        let metadata = object.view.get("metadata");
        let name_ok = self.name.as_deref().is_none_or(|want| {
            metadata.and_then(|m| m.get("name")).and_then(Tree::as_str) == Some(want)
        });
        name_ok
            && crate::k8s::fetch::labels_match(
                &self.labels,
                metadata
                    .and_then(|m| m.get("labels"))
                    .and_then(Tree::as_object),
            )
    }
}

/// The type of a watch event, as Kubernetes names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

fn name_of(object: &Object) -> &str {
    object
        .view
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Tree::as_str)
        .unwrap_or("")
}

fn uid_of(object: &Object) -> &str {
    object
        .view
        .get("metadata")
        .and_then(|m| m.get("uid"))
        .and_then(Tree::as_str)
        .unwrap_or("")
}

/// What one watcher has been sent: the objects by name, as sent.
#[derive(Default)]
pub struct Sent {
    objects: BTreeMap<String, Arc<Object>>,
}

impl Sent {
    /// The events that take the watcher from what it was sent to `now` (the kind's selected
    /// objects): DELETED for the gone, ADDED for the new, MODIFIED for the changed. An object
    /// of the same name but another uid was deleted and created again: DELETED, then ADDED.
    pub fn sync(&mut self, now: Vec<Arc<Object>>) -> Vec<(EventType, Arc<Object>)> {
        let mut fresh: BTreeMap<String, Arc<Object>> = now
            .into_iter()
            .map(|o| (name_of(&o).to_owned(), o))
            .collect();
        let mut events = Vec::new();
        let before = std::mem::take(&mut self.objects);
        for (name, old) in before {
            match fresh.remove(&name) {
                None => events.push((EventType::Deleted, old)),
                Some(new) => {
                    events.extend(self.step(&old, new.clone()));
                    self.objects.insert(name, new);
                }
            }
        }
        for (name, new) in fresh {
            events.push((EventType::Added, new.clone()));
            self.objects.insert(name, new);
        }
        events
    }

    /// The events for one object as it is now (`Some`, selected) or gone (`None`).
    pub fn apply(&mut self, name: &str, now: Option<Arc<Object>>) -> Vec<(EventType, Arc<Object>)> {
        match (self.objects.remove(name), now) {
            (None, None) => Vec::new(),
            (Some(old), None) => vec![(EventType::Deleted, old)],
            (None, Some(new)) => {
                self.objects.insert(name.to_owned(), new.clone());
                vec![(EventType::Added, new)]
            }
            (Some(old), Some(new)) => {
                self.objects.insert(name.to_owned(), new.clone());
                self.step(&old, new)
            }
        }
    }

    fn step(&self, old: &Arc<Object>, new: Arc<Object>) -> Vec<(EventType, Arc<Object>)> {
        if Arc::ptr_eq(old, &new) || old.same_text(&new) {
            Vec::new()
        } else if uid_of(old) != uid_of(&new) {
            vec![(EventType::Deleted, old.clone()), (EventType::Added, new)]
        } else {
            vec![(EventType::Modified, new)]
        }
    }
}

/// `{"watchId", "type": "data", "watchEvent": {"type", "object"}}` for a cached object. List
/// items often lack `apiVersion` and `kind`; a watch event's object always has them, so they
/// are added from the kind when missing.
pub fn data(watch_id: &str, event: EventType, object: &Object, kind: &ApiKind) -> String {
    #[derive(Deserialize)]
    struct Head<'a> {
        #[serde(default, rename = "apiVersion", borrow)]
        api_version: Option<&'a serde_json::value::RawValue>,
        #[serde(default, borrow)]
        kind: Option<&'a serde_json::value::RawValue>,
    }
    let text = object.text();
    let text = text.trim_start();
    let typed = serde_json::from_str::<Head>(text)
        .map(|h| h.api_version.is_some() && h.kind.is_some())
        .unwrap_or(true);
    let body = match text.strip_prefix('{') {
        Some(rest) if !typed => {
            let sep = if rest.trim_start().starts_with('}') {
                ""
            } else {
                ","
            };
            format!(
                "{{\"apiVersion\":{},\"kind\":{}{sep}{rest}",
                json!(kind.api_version()),
                json!(kind.kind)
            )
        }
        _ => text.to_owned(),
    };
    data_raw(watch_id, event.as_str(), &body)
}

/// A data message around an event's object text, as the cluster sent it.
pub fn data_raw(watch_id: &str, event: &str, object: &str) -> String {
    format!(
        "{{\"watchId\":{},\"type\":\"data\",\"watchEvent\":{{\"type\":{},\"object\":{object}}}}}",
        json!(watch_id),
        json!(event)
    )
}

/// `{"watchId", "type": "error", "error": {"message", "object": Status}}`: the package shows
/// `error.object.message`, else `error.message`.
pub fn error(watch_id: Option<&str>, code: Option<u16>, message: &str) -> String {
    let code = code.unwrap_or(500);
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        410 => "Expired",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        _ => "InternalError",
    };
    json!({
        "watchId": watch_id,
        "type": "error",
        "error": {
            "message": message,
            "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code},
        },
    })
    .to_string()
}

/// An error message around a Status the cluster sent (a watch's `ERROR` event).
pub fn error_status(watch_id: &str, status: &str) -> String {
    #[derive(Deserialize, Default)]
    struct S {
        #[serde(default)]
        message: String,
    }
    let message = serde_json::from_str::<S>(status)
        .unwrap_or_default()
        .message;
    format!(
        "{{\"watchId\":{},\"type\":\"error\",\"error\":{{\"message\":{},\"object\":{status}}}}}",
        json!(watch_id),
        json!(message)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn object(name: &str, uid: &str, phase: &str, labels: Value) -> Arc<Object> {
        let text = json!({"metadata": {"name": name, "uid": uid, "labels": labels},
            "status": {"phase": phase}})
        .to_string();
        Arc::new(Object::parse_text(text.into(), "v1", "Pod").unwrap())
    }

    fn pods() -> ApiKind {
        ApiKind {
            group: String::new(),
            version: "v1".into(),
            kind: "Pod".into(),
            plural: "pods".into(),
            namespaced: true,
            watchable: true,
        }
    }

    fn kinds(events: &[(EventType, Arc<Object>)]) -> Vec<(&'static str, String)> {
        events
            .iter()
            .map(|(t, o)| (t.as_str(), name_of(o).to_owned()))
            .collect()
    }

    #[test]
    fn the_packages_message_reads_in_snake_or_camel_case() {
        let snake: Incoming = serde_json::from_str(r#"{"type":"watch","watch_id":"k8sPods-n-default","watch_params":{"version":"v1","resource":"pods","namespace":"default","label_selector":"app=web","field_selector":"metadata.name=a"}}"#).unwrap();
        let camel: Incoming = serde_json::from_str(r#"{"type":"watch","watchId":"k8sPods-n-default","watchParams":{"version":"v1","resource":"pods","namespace":"default","labelSelector":"app=web","fieldSelector":"metadata.name=a"}}"#).unwrap();
        assert_eq!(snake.watch_id.as_deref(), Some("k8sPods-n-default"));
        assert_eq!(snake.watch_params, camel.watch_params);
        assert_eq!(snake.watch_params.label_selector, "app=web");
        assert_eq!(snake.watch_params.path(), "/api/v1/namespaces/default/pods");
        let apps = Params {
            group: "apps".into(),
            version: "v1".into(),
            resource: "deployments".into(),
            ..Params::default()
        };
        assert_eq!(apps.path(), "/apis/apps/v1/deployments");
    }

    #[test]
    fn names_that_would_change_the_path_are_refused() {
        let ok = Params {
            version: "v1".into(),
            resource: "pods".into(),
            namespace: "a-b.c".into(),
            ..Params::default()
        };
        assert_eq!(ok.invalid(), None);
        for bad in ["../x", "a/b", "a?watch=false", "..", "a%2f", " "] {
            let p = Params {
                namespace: bad.into(),
                ..ok.clone()
            };
            assert!(p.invalid().is_some(), "{bad}");
            let p = Params {
                resource: bad.into(),
                ..ok.clone()
            };
            assert!(p.invalid().is_some(), "{bad}");
        }
        assert!(Params::default().invalid().is_some());
    }

    #[test]
    fn the_cache_serves_one_namespace_with_selectors_it_can_evaluate() {
        let kinds = [pods()];
        let p = Params {
            version: "v1".into(),
            resource: "pods".into(),
            namespace: "apps".into(),
            label_selector: "app=web".into(),
            field_selector: "metadata.name=web-1".into(),
            ..Params::default()
        };
        let (kind, selection) = p.cached(&kinds).unwrap();
        assert_eq!(kind.kind, "Pod");
        assert_eq!(
            selection,
            Selection {
                labels: vec![("app".into(), "web".into())],
                name: Some("web-1".into())
            }
        );
        let not = |f: fn(&mut Params)| {
            let mut q = p.clone();
            f(&mut q);
            assert!(q.cached(&kinds).is_none(), "{q:?}");
        };
        not(|q| q.namespace.clear());
        not(|q| q.resource = "services".into());
        not(|q| q.label_selector = "app in (web)".into());
        not(|q| q.label_selector = "app!=web".into());
        not(|q| q.field_selector = "status.phase=Running".into());
        not(|q| q.field_selector = "metadata.name!=x".into());
    }

    #[test]
    fn selection_by_labels_and_name() {
        let s = Selection {
            labels: vec![("app".into(), "web".into())],
            name: None,
        };
        assert!(s.picks(&object("a", "1", "Running", json!({"app": "web"}))));
        assert!(!s.picks(&object("a", "1", "Running", json!({"app": "db"}))));
        let s = Selection {
            labels: vec![],
            name: Some("b".into()),
        };
        assert!(!s.picks(&object("a", "1", "Running", json!({}))));
        assert!(s.picks(&object("b", "1", "Running", json!({}))));
    }

    #[test]
    fn a_watcher_is_owed_added_before_modified_and_deleted_for_what_it_had() {
        let mut sent = Sent::default();
        let a1 = object("a", "ua", "Pending", json!({}));
        let b1 = object("b", "ub", "Pending", json!({}));
        assert_eq!(
            kinds(&sent.sync(vec![a1.clone(), b1.clone()])),
            [("ADDED", "a".into()), ("ADDED", "b".into())]
        );
        assert!(sent.sync(vec![a1.clone(), b1.clone()]).is_empty());
        let a2 = object("a", "ua", "Running", json!({}));
        assert_eq!(
            kinds(&sent.apply("a", Some(a2.clone()))),
            [("MODIFIED", "a".into())]
        );
        assert_eq!(kinds(&sent.apply("a", Some(a2.clone()))), []);
        // Recreated under the same name: the package keys by uid.
        let b2 = object("b", "ub2", "Pending", json!({}));
        let c = object("c", "uc", "Pending", json!({}));
        assert_eq!(
            kinds(&sent.sync(vec![b2.clone(), c.clone()])),
            [
                ("DELETED", "a".into()),
                ("DELETED", "b".into()),
                ("ADDED", "b".into()),
                ("ADDED", "c".into())
            ]
        );
        assert_eq!(kinds(&sent.apply("c", None)), [("DELETED", "c".into())]);
        assert_eq!(kinds(&sent.apply("zz", None)), []);
    }

    #[test]
    fn events_carry_the_object_typed_and_whole() {
        let o = object("a", "ua", "Running", json!({"app": "web"}));
        let msg: Value = serde_json::from_str(&data("w1", EventType::Added, &o, &pods())).unwrap();
        assert_eq!(msg["watchId"], "w1");
        assert_eq!(msg["type"], "data");
        assert_eq!(msg["watchEvent"]["type"], "ADDED");
        let obj = &msg["watchEvent"]["object"];
        assert_eq!(obj["apiVersion"], "v1");
        assert_eq!(obj["kind"], "Pod");
        assert_eq!(obj["metadata"]["uid"], "ua");
        assert_eq!(obj["status"]["phase"], "Running");

        let typed = Object::parse_text(
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}}"#.into(),
            "v1",
            "Pod",
        )
        .unwrap();
        let msg: Value =
            serde_json::from_str(&data("w", EventType::Deleted, &typed, &pods())).unwrap();
        assert_eq!(
            msg["watchEvent"]["object"],
            json!({"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}})
        );

        let err: Value = serde_json::from_str(&error(Some("w"), Some(403), "no")).unwrap();
        assert_eq!(err["type"], "error");
        assert_eq!(err["error"]["object"]["message"], "no");
        assert_eq!(err["error"]["object"]["code"], 403);
        let err: Value = serde_json::from_str(&error_status(
            "w",
            r#"{"kind":"Status","code":410,"message":"too old"}"#,
        ))
        .unwrap();
        assert_eq!(err["error"]["message"], "too old");
        assert_eq!(err["error"]["object"]["code"], 410);
    }
}
