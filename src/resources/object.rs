//! A listed Kubernetes object as the resource group holds it: a compact [`Tree`] of the fields
//! that the dependency graph, the health rules and the assembly read, and the text the cluster
//! sent, for `manifest`.
//!
//! The tree is built in the same parse that skips the rest unbuilt (a container list, an
//! Endpoints' addresses, a ConfigMap's data, `managedFields`), so a group's passes (ownership,
//! edges, health) walk a fraction of each object. The text is kept as it came, but for
//! `metadata.managedFields` ([`without_managed_fields`]), and parsed again only when a query asks
//! for the `manifest` of a resource (or GitLab's watch API, the history, the Events read it).
//! The watch cache packs it against another object of its kind once it has answered
//! ([`super::text`]).
//!
//! [`KEPT`] names the fields. The health and graph tests run every fixture both whole and
//! through [`parse`], so a rule that reads a field not kept here fails its tests.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::health::{
    HELM_HOOK_ANNOTATION, HOOK_ANNOTATION, HPA_CONDITIONS_ANNOTATION,
    IGNORE_RESTART_POLICY_ANNOTATION,
};
use super::text::{Dictionary, Text};
use super::tree::{Keep, Tree, TreeBuf};

/// One listed object.
#[derive(Debug, Clone)]
pub struct Object {
    /// The kept fields; `apiVersion` and `kind` are always there (list items often lack them).
    pub view: TreeBuf,
    /// The object as the cluster sent it, without `metadata.managedFields`
    /// ([`without_managed_fields`]); read with [`Self::text`].
    text: Text,
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
        let text = text.get();
        Ok(Object {
            view: parse_typed(KEPT, text, api_version, kind)?,
            text: Text::plain(without_managed_fields(text).into()),
        })
    }

    /// Parses one list item of the given type from its text, which it keeps (but for
    /// `metadata.managedFields`).
    pub fn parse_text(text: Box<str>, api_version: &str, kind: &str) -> serde_json::Result<Object> {
        let view = parse_typed(KEPT, &text, api_version, kind)?;
        let text = match without_managed_fields(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(shorter) => shorter.into(),
        };
        Ok(Object {
            view,
            text: Text::plain(text),
        })
    }

    /// A list item whose kept fields (`view`) and `metadata.managedFields` member (`cut`, the
    /// bytes of `text` to leave out, from [`managed_fields_member`]) were found by the one
    /// parse that read the page ([`super::page::Item`]): its text is not scanned again.
    pub fn from_listed(
        view: TreeBuf,
        text: &str,
        cut: Option<(usize, usize)>,
        api_version: &str,
        kind: &str,
    ) -> Object {
        let text: Box<str> = match cut {
            Some((start, end)) => [&text[..start], &text[end..]].concat().into(),
            None => text.into(),
        };
        Object {
            view: typed(view, api_version, kind),
            text: Text::plain(text),
        }
    }

    /// An item read with [`Kept`] from a list page, with its text.
    pub fn from_kept(kept: Kept, text: &str, api_version: &str, kind: &str) -> Object {
        Object {
            view: typed(kept.0, api_version, kind),
            text: Text::plain(without_managed_fields(text).into()),
        }
    }

    /// The object's JSON text as the cluster sent it, without `metadata.managedFields`.
    pub fn text(&self) -> Cow<'_, str> {
        self.text.get()
    }

    /// Whether the two objects' texts are the same.
    pub fn same_text(&self, other: &Object) -> bool {
        self.text.same(&other.text)
    }

    /// The bytes the text takes as kept, packed or not (a dictionary not counted).
    pub fn kept_text_bytes(&self) -> usize {
        self.text.bytes()
    }

    /// A dictionary that others of this object's kind can be packed against: its text.
    pub fn dictionary(&self) -> Arc<Dictionary> {
        Dictionary::of(&self.text.get())
    }

    /// Packs the text against `dictionary`, in place: every holder of the object gains.
    pub fn pack(&self, dictionary: &Arc<Dictionary>) {
        self.text.pack(dictionary);
    }

    /// The whole object as a reader may see it: without `metadata.managedFields` (server-side
    /// apply bookkeeping, often the largest part of an object, that `kubectl get -o yaml` hides
    /// too), and a Secret's values masked ([`super::masking`]). Every answer that shows a
    /// manifest takes it from here.
    pub fn manifest(&self) -> Value {
        let mut manifest: Value = serde_json::from_str(&self.text()).unwrap_or(Value::Null);
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

/// `text` without its `metadata.managedFields`, every other byte as it was; `text` itself when
/// it has none (or when they cannot be cut out cleanly: a key written with escapes, a key given
/// twice, text that is not a JSON object).
///
/// `managedFields` is server-side apply's bookkeeping of which manager set which field: often
/// the largest part of an object, and read by nothing envlens serves. `manifest` never showed it
/// (`kubectl get -o yaml` hides it too), history strips it, the graph and health rules do not
/// read it. The one reader of the text as sent is GitLab's watch API
/// ([`crate::k8s::watch_api`]), whose objects come from the watch cache: they come without
/// `managedFields`, as a `kubectl get --show-managed-fields=false` would show them. Dropping them
/// is what keeps a cached object within the size of its JSON (BENCHMARKS.md).
pub fn without_managed_fields(text: &str) -> Cow<'_, str> {
    const KEY: &str = "\"managedFields\"";
    if !text.contains(KEY) {
        return Cow::Borrowed(text);
    }
    match managed_fields_span(text) {
        Some((start, end)) => {
            let mut shorter = String::with_capacity(text.len() - (end - start));
            shorter.push_str(&text[..start]);
            shorter.push_str(&text[end..]);
            Cow::Owned(shorter)
        }
        None => Cow::Borrowed(text),
    }
}

/// The bytes of `text` to cut to remove the member `"managedFields": …` of its `metadata`,
/// with one comma beside it.
fn managed_fields_span(text: &str) -> Option<(usize, usize)> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        metadata: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Metadata<'a> {
        #[serde(borrow, rename = "managedFields")]
        managed_fields: Option<&'a RawValue>,
    }
    // A struct reads from an array too: only an object's members are looked at.
    text.trim_start().starts_with('{').then_some(())?;
    let top: Top = serde_json::from_str(text).ok()?;
    let metadata = top.metadata?.get();
    metadata.starts_with('{').then_some(())?;
    let metadata: Metadata = serde_json::from_str(metadata).ok()?;
    managed_fields_member(text, metadata.managed_fields?.get())
}

/// The bytes of `text` to cut to remove the member whose value is `value` (a slice of `text`,
/// the value of `metadata.managedFields`), with one comma beside it; `None` when the key before
/// it is not written `"managedFields"` as is (escaped), or `value` is not in `text`.
pub fn managed_fields_member(text: &str, value: &str) -> Option<(usize, usize)> {
    // The raw values borrow `text`: their place in it is their distance from its start.
    let value_start = (value.as_ptr() as usize).checked_sub(text.as_ptr() as usize)?;
    let value_end = value_start + value.len();
    (value_end <= text.len()).then_some(())?;
    let bytes = text.as_bytes();
    let skip_back = |mut i: usize| {
        while i > 0 && bytes[i - 1].is_ascii_whitespace() {
            i -= 1;
        }
        i
    };
    let skip_on = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    // Back over `"managedFields" :` to the key's opening quote; an escaped key does not match.
    let colon = skip_back(value_start).checked_sub(1)?;
    (bytes[colon] == b':').then_some(())?;
    let key_end = skip_back(colon);
    let key_start = key_end.checked_sub("\"managedFields\"".len())?;
    (&text[key_start..key_end] == "\"managedFields\"").then_some(())?;
    let before = skip_back(key_start).checked_sub(1)?;
    match bytes[before] {
        // Not the first member: the comma before it goes with it.
        b',' => Some((before, value_end)),
        // The first member: the comma after it, if another member follows.
        b'{' => {
            let after = skip_on(value_end);
            match bytes.get(after) {
                Some(b',') => Some((key_start, skip_on(after + 1))),
                Some(b'}') => Some((key_start, value_end)),
                _ => None,
            }
        }
        _ => None,
    }
}

impl PartialEq for Object {
    fn eq(&self, other: &Self) -> bool {
        self.view == other.view && self.text.same(&other.text)
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
            // GitOps sources (crate::gitops): where a HelmRelease's release is and goes.
            ("releaseName", All),
            ("storageNamespace", All),
            ("targetNamespace", All),
        ]),
    ),
    ("status", All),
    // Causes (`super::cause`): whether a Service has a ready endpoint.
    (
        "endpoints",
        Fields(&[("conditions", Fields(&[("ready", All)]))]),
    ),
    ("subsets", Fields(&[("addresses", Fields(&[("ip", All)]))])),
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
pub fn parse(text: &str) -> serde_json::Result<TreeBuf> {
    KEPT.parse(text)
}

/// The `keep` fields of a list item: list items omit `apiVersion` and `kind` (the list carries
/// them), so they are put back.
pub fn parse_typed(
    keep: Keep,
    text: &str,
    api_version: &str,
    kind: &str,
) -> serde_json::Result<TreeBuf> {
    Ok(typed(keep.parse(text)?, api_version, kind))
}

/// `view` with `apiVersion` and `kind` put back where a list item lacks them.
pub fn typed(mut view: TreeBuf, api_version: &str, kind: &str) -> TreeBuf {
    let Some(map) = view.as_object() else {
        return view;
    };
    let there = |field: &str| map.get(field).is_some_and(Tree::is_string);
    match (there("apiVersion"), there("kind")) {
        (true, true) => {}
        (false, false) => view.set_strings(&[("apiVersion", api_version), ("kind", kind)]),
        (false, true) => view.set_strings(&[("apiVersion", api_version)]),
        (true, false) => view.set_strings(&[("kind", kind)]),
    }
    view
}

/// A list item's [`KEPT`] fields, read as the list page is ([`super::page`]).
#[derive(Debug)]
pub struct Kept(pub TreeBuf);

impl<'de> Deserialize<'de> for Kept {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Kept, D::Error> {
        serde::de::DeserializeSeed::deserialize(KEPT, deserializer).map(Kept)
    }
}

/// A list item's [`HEAD`], read as the list page is ([`super::page`]).
#[derive(Debug)]
pub struct Head(pub TreeBuf);

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
    fn managed_fields_are_cut_out_and_every_other_byte_stays() {
        let cut = |text: &str| without_managed_fields(text).into_owned();
        let managed = r#"[{"manager":"kubectl","fieldsV1":{"f:metadata":{"f:labels":{".":{}}}}}]"#;
        for (text, expected) in [
            // Last, middle, first, only member; compact and spaced out.
            (
                format!(r#"{{"metadata":{{"name":"a","managedFields":{managed}}},"spec":{{}}}}"#),
                r#"{"metadata":{"name":"a"},"spec":{}}"#.to_string(),
            ),
            (
                format!(r#"{{"metadata":{{"name":"a","managedFields":{managed},"uid":"u"}}}}"#),
                r#"{"metadata":{"name":"a","uid":"u"}}"#.into(),
            ),
            (
                format!(r#"{{"metadata":{{"managedFields":{managed},"name":"a"}}}}"#),
                r#"{"metadata":{"name":"a"}}"#.into(),
            ),
            (
                format!(r#"{{"metadata":{{"managedFields":{managed}}},"kind":"Pod"}}"#),
                r#"{"metadata":{},"kind":"Pod"}"#.into(),
            ),
            (
                format!("{{ \"metadata\" : {{ \"name\" : \"a\" ,\n  \"managedFields\" : {managed} \n}} }}"),
                "{ \"metadata\" : { \"name\" : \"a\"  \n} }".into(),
            ),
            (
                format!("{{\"metadata\": {{\"managedFields\" : {managed} ,\n \"name\": \"a\"}}}}"),
                "{\"metadata\": {\"name\": \"a\"}}".into(),
            ),
        ] {
            assert_eq!(cut(&text), expected, "{text}");
            let mut value: Value = serde_json::from_str(&text).unwrap();
            value["metadata"].as_object_mut().unwrap().remove("managedFields");
            assert_eq!(serde_json::from_str::<Value>(&cut(&text)).unwrap(), value);
        }
        // Left as they are: none, one elsewhere than in `metadata`, an escaped key, a key given
        // twice, text that is no object.
        for text in [
            r#"{"metadata":{"name":"a"}}"#.to_string(),
            format!(r#"{{"metadata":{{"name":"a"}},"spec":{{"managedFields":{managed}}}}}"#),
            format!(r#"{{"metadata":{{"managed\u0046ields":{managed}}}}}"#),
            format!(r#"{{"metadata":{{"managedFields":{managed}}},"metadata":{{}}}}"#),
            format!(r#"[{{"metadata":{{"managedFields":{managed}}}}}]"#),
            r#"{"metadata":{"managedFields":"#.to_string(),
        ] {
            assert!(
                matches!(without_managed_fields(&text), Cow::Borrowed(t) if t == text),
                "{text}"
            );
        }
        // Objects keep their text without them; the tree never had them.
        let object = Object::parse_text(
            format!(r#"{{"metadata":{{"name":"a","managedFields":{managed}}}}}"#).into(),
            "v1",
            "Pod",
        )
        .unwrap();
        assert_eq!(object.text(), r#"{"metadata":{"name":"a"}}"#);
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
