//! A listed Kubernetes object as the resource group holds it: a compact [`Tree`] of the fields
//! that the dependency graph, the health rules and the assembly read, and the text the cluster
//! sent, for `manifest`.
//!
//! The tree is built in the same parse that skips the rest unbuilt (a container list, an
//! Endpoints' addresses, a ConfigMap's data, `managedFields`), so a group's passes (ownership,
//! edges, health) walk a fraction of each object. The text is kept as it came and parsed again
//! only when a query asks for the `manifest` of a resource.
//!
//! [`KEPT`] names the fields. The health and graph tests run every fixture both whole and
//! through [`parse`], so a rule that reads a field not kept here fails its tests.

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::health::{
    HELM_HOOK_ANNOTATION, HOOK_ANNOTATION, HPA_CONDITIONS_ANNOTATION,
    IGNORE_RESTART_POLICY_ANNOTATION,
};
use super::tree::{Keep, Tree};

/// One listed object.
#[derive(Debug, Clone)]
pub struct Object {
    /// The kept fields; `apiVersion` and `kind` are always there (list items often lack them).
    pub view: Tree,
    /// The object as the cluster sent it: the JSON text of one object.
    pub text: Box<str>,
}

impl std::borrow::Borrow<Tree> for Object {
    fn borrow(&self) -> &Tree {
        &self.view
    }
}

/// Objects are shared between the watch cache, listings and groups: the passes read them
/// through the `Arc` as they read an owned one.
impl std::borrow::Borrow<Tree> for std::sync::Arc<Object> {
    fn borrow(&self) -> &Tree {
        &self.view
    }
}

impl Object {
    /// Parses one list item of the given type.
    pub fn parse(text: &RawValue, api_version: &str, kind: &str) -> serde_json::Result<Object> {
        Object::parse_text(text.get().into(), api_version, kind)
    }

    /// Parses one list item of the given type from its text, which it keeps.
    pub fn parse_text(text: Box<str>, api_version: &str, kind: &str) -> serde_json::Result<Object> {
        Ok(Object {
            view: parse_typed(KEPT, &text, api_version, kind)?,
            text,
        })
    }

    /// An item read with [`Kept`] from a list page, with its text.
    pub fn from_kept(kept: Kept, text: &str, api_version: &str, kind: &str) -> Object {
        Object {
            view: typed(kept.0, api_version, kind),
            text: text.into(),
        }
    }

    /// The whole object as a reader may see it: without `metadata.managedFields` (server-side
    /// apply bookkeeping, often the largest part of an object, that `kubectl get -o yaml` hides
    /// too), and a Secret's values masked ([`super::masking`]). Every answer that shows a
    /// manifest takes it from here.
    pub fn manifest(&self) -> Value {
        let mut manifest: Value = serde_json::from_str(&self.text).unwrap_or(Value::Null);
        if let Value::Object(object) = &mut manifest {
            for field in ["apiVersion", "kind"] {
                if let Some(value) = self.view.get(field) {
                    object.insert(field.into(), value.into());
                }
            }
            if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
                metadata.remove("managedFields");
            }
        }
        super::masking::mask_secret(&mut manifest);
        manifest
    }
}

impl PartialEq for Object {
    fn eq(&self, other: &Self) -> bool {
        self.view == other.view && self.text == other.text
    }
}

use Keep::{All, Fields};

/// Of each owner reference, what the ownership walk and the edges read.
const OWNERS: Keep = Fields(&[("uid", All), ("controller", All)]);

/// What is read of an object: by the graph (identity, owners, and the fields that link
/// objects), by the health rules (the few spec fields they consult, and all of `status`, whose
/// shape each kind and custom resource decides), and by the assembly (labels, creation time).
pub const KEPT: Keep = Fields(&[
    ("apiVersion", All),
    ("kind", All),
    (
        "metadata",
        Fields(&[
            ("name", All),
            ("namespace", All),
            ("uid", All),
            ("generation", All),
            ("creationTimestamp", All),
            ("deletionTimestamp", All),
            ("finalizers", All),
            ("labels", All),
            (
                "annotations",
                Fields(&[
                    (IGNORE_RESTART_POLICY_ANNOTATION, All),
                    (HOOK_ANNOTATION, All),
                    (HELM_HOOK_ANNOTATION, All),
                    (HPA_CONDITIONS_ANNOTATION, All),
                ]),
            ),
            ("ownerReferences", OWNERS),
        ]),
    ),
    (
        "spec",
        Fields(&[
            // Health rules.
            ("paused", All),
            ("replicas", All),
            ("updateStrategy", All),
            ("restartPolicy", All),
            ("suspend", All),
            ("type", All),
            // Links: Service selectors and the pod template labels they match, Ingress
            // backends, autoscaler targets, a Pod's claims.
            ("selector", All),
            (
                "template",
                Fields(&[("metadata", Fields(&[("labels", All)]))]),
            ),
            ("rules", All),
            ("defaultBackend", All),
            ("backend", All),
            ("scaleTargetRef", All),
            ("volumes", Fields(&[("persistentVolumeClaim", All)])),
        ]),
    ),
    ("status", All),
]);

/// What the ownership walk reads of an object that no selector picked: who it is and who owns
/// it. Only the objects the walk keeps are parsed again with [`KEPT`].
pub const HEAD: Keep = Fields(&[
    ("apiVersion", All),
    ("kind", All),
    (
        "metadata",
        Fields(&[
            ("name", All),
            ("namespace", All),
            ("uid", All),
            ("labels", All),
            ("ownerReferences", OWNERS),
        ]),
    ),
]);

/// The [`KEPT`] fields of the JSON text of one object, in one pass that builds nothing else.
pub fn parse(text: &str) -> serde_json::Result<Tree> {
    KEPT.parse(text)
}

/// The `keep` fields of a list item: list items omit `apiVersion` and `kind` (the list carries
/// them), so they are put back.
pub fn parse_typed(
    keep: Keep,
    text: &str,
    api_version: &str,
    kind: &str,
) -> serde_json::Result<Tree> {
    Ok(typed(keep.parse(text)?, api_version, kind))
}

/// `view` with `apiVersion` and `kind` put back where a list item lacks them.
pub fn typed(mut view: Tree, api_version: &str, kind: &str) -> Tree {
    if let Tree::Object(map) = &mut view {
        for (field, value) in [("apiVersion", api_version), ("kind", kind)] {
            if !map.get(field).is_some_and(Tree::is_string) {
                map.set(field, Tree::String(value.into()));
            }
        }
    }
    view
}

/// A list item's [`KEPT`] fields, read as the list page is ([`super::page`]).
#[derive(Debug)]
pub struct Kept(pub Tree);

impl<'de> Deserialize<'de> for Kept {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Kept, D::Error> {
        serde::de::DeserializeSeed::deserialize(KEPT, deserializer).map(Kept)
    }
}

/// A list item's [`HEAD`], read as the list page is ([`super::page`]).
#[derive(Debug)]
pub struct Head(pub Tree);

impl<'de> Deserialize<'de> for Head {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Head, D::Error> {
        serde::de::DeserializeSeed::deserialize(HEAD, deserializer).map(Head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(value: &Value) -> Box<RawValue> {
        RawValue::from_string(value.to_string()).unwrap()
    }

    #[test]
    fn keeps_what_is_read_and_drops_the_rest() {
        let pod = json!({
            "metadata": {
                "name": "web-1", "namespace": "apps", "uid": "u1", "resourceVersion": "7",
                "labels": {"app": "web"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}",
                                IGNORE_RESTART_POLICY_ANNOTATION: "true"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs", "controller": true}],
                "managedFields": [{"manager": "kubectl"}],
            },
            "spec": {"containers": [{"name": "web", "image": "web:1"}], "restartPolicy": "Always",
                     "volumes": [{"name": "config", "configMap": {"name": "c"}},
                                 {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
            "status": {"phase": "Running", "anything": [1, {"a": null}]},
        });
        let object = Object::parse(&raw(&pod), "v1", "Pod").unwrap();
        assert_eq!(
            Value::from(&object.view),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": "web-1", "namespace": "apps", "uid": "u1", "labels": {"app": "web"},
                    "annotations": {IGNORE_RESTART_POLICY_ANNOTATION: "true"},
                    "ownerReferences": [{"uid": "rs", "controller": true}],
                },
                "spec": {"restartPolicy": "Always",
                         "volumes": [{}, {"persistentVolumeClaim": {"claimName": "data"}}]},
                "status": {"phase": "Running", "anything": [1, {"a": null}]},
            })
        );
        // The manifest is the whole object but its managed fields, typed as it was listed.
        let mut expected = pod.clone();
        expected["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        expected["apiVersion"] = json!("v1");
        expected["kind"] = json!("Pod");
        assert_eq!(object.manifest(), expected);
    }

    #[test]
    fn a_secret_listed_without_its_kind_is_masked_by_the_kind_of_its_list() {
        // List items often lack `kind`: the Secret is known by its list, and masked all the same.
        let item = json!({"metadata": {"name": "db", "uid": "s1",
                                       "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"stringData\":{\"pw\":\"hunter2\"}}"}},
                          "type": "Opaque", "data": {"pw": "aHVudGVyMg=="}});
        let text = RawValue::from_string(item.to_string()).unwrap();
        let manifest = Object::parse(&text, "v1", "Secret").unwrap().manifest();
        assert_eq!(manifest["data"], json!({"pw": "++++++++"}));
        assert_eq!(
            manifest["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"],
            "++++++++"
        );
        assert_eq!(manifest["type"], "Opaque");
        // The same item listed as another kind is not a Secret.
        let other = Object::parse(&text, "example.com/v1", "Secret").unwrap();
        assert_eq!(other.manifest()["data"], json!({"pw": "aHVudGVyMg=="}));
    }

    #[test]
    fn a_head_is_who_the_object_is_and_who_owns_it() {
        let pod = json!({"metadata": {"name": "p", "uid": "u", "labels": {"a": "b"}, "generation": 2,
                                      "ownerReferences": [{"uid": "o", "controller": false, "name": "x"}]},
                         "status": {"phase": "Running"}});
        assert_eq!(
            Value::from(&parse_typed(HEAD, &pod.to_string(), "v1", "Pod").unwrap()),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "uid": "u", "labels": {"a": "b"},
                                "ownerReferences": [{"uid": "o", "controller": false}]}})
        );
    }

    #[test]
    fn list_items_get_their_type() {
        let item = parse_typed(
            KEPT,
            r#"{"metadata": {"name": "x"}}"#,
            "apps/v1",
            "Deployment",
        );
        let item = Value::from(&item.unwrap());
        assert_eq!(
            (&item["apiVersion"], &item["kind"]),
            (&json!("apps/v1"), &json!("Deployment"))
        );
        let text = r#"{"apiVersion": "example.com/v2", "kind": "Widget"}"#;
        let typed = Value::from(&parse_typed(KEPT, text, "example.com/v1", "Widget").unwrap());
        assert_eq!(
            typed["apiVersion"], "example.com/v2",
            "the server's own word stays"
        );
    }

    #[test]
    fn odd_shapes_are_kept_as_they_are_and_never_fail() {
        // A field named like a kept map but of another type, nulls, numbers of every kind.
        let odd = json!({"apiVersion": "example.com/v1", "kind": "Widget",
                         "metadata": null, "spec": "text", "status": [1, -2, 3.5, true, null]});
        let object = Object::parse(&raw(&odd), "ignored/v1", "Ignored").unwrap();
        assert_eq!(Value::from(&object.view), odd);
        let nested =
            json!({"spec": {"template": [{"metadata": {"labels": {"a": "b"}, "x": 1}}, 2]}});
        assert_eq!(
            Value::from(&parse(&nested.to_string()).unwrap()),
            json!({"spec": {"template": [{"metadata": {"labels": {"a": "b"}}}, 2]}})
        );
        assert!(parse("{\"spec\": {").is_err());
        assert!(parse("{} {}").is_err());
    }
}
