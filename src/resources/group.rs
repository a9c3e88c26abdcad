//! The resource group of an environment as GraphQL shows it (`Environment.resourceGroup`): pure
//! assembly of what [`fetch`](super::fetch) listed, with health and edges, tested without I/O.

use std::borrow::Borrow;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use rustc_hash::FxHashMap;
use serde_json::{Map, Value};

use super::graph::{Edge, Nodes};
use super::health::{self, Customizations, Health};
use super::listing::{ListError, Listing, ResourceEvent};
use super::object::Object;
use super::tree::Tree;

/// The warning of a group without resources (GitLab's wording).
pub const NO_RESOURCES_WARNING: &str =
    "There are no resources found for the environment. Do resources have GitLab preserved labels?";

/// The label selector of an environment's resources: both labels GitLab preserves.
pub fn label_selector(project_id: i64, environment_slug: &str) -> String {
    format!(
        "app.gitlab.com/project_id={project_id},app.gitlab.com/environment_slug={environment_slug}"
    )
}

/// One resource of the group.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub uid: String,
    pub api_version: String,
    pub kind: String,
    /// `None` for a cluster-scoped object.
    pub namespace: Option<String>,
    pub name: String,
    /// `metadata.labels`, an object (empty when there are none).
    pub labels: Value,
    pub created_at: Option<DateTime<Utc>>,
    /// `None` when no health rule applies to the kind (which is not `Unknown`).
    pub health: Option<Health>,
    /// The object as listed (shared with the watch cache when it comes from there);
    /// [`Object::manifest`] is what a reader sees of it, built only when asked for.
    pub object: Arc<Object>,
    /// Most recent first.
    pub events: Vec<ResourceEvent>,
}

/// An environment's resources, their links and overall health.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceGroup {
    pub namespace: String,
    pub label_selector: String,
    /// The worst health among the resources that have one; Healthy (no message) when none has.
    pub health: Health,
    /// Ordered by apiVersion, kind, namespace, name (then uid).
    pub resources: Vec<Resource>,
    /// Parent to child, as indices into `resources`, in [`Nodes::edges`]' order (by uid).
    pub edges: Vec<Edge>,
    /// [`NO_RESOURCES_WARNING`] when there are no resources; one line per API group version left
    /// out because its discovery failed.
    pub warnings: Vec<String>,
    pub errors: Vec<ListError>,
}

impl ResourceGroup {
    /// The group of an agent that cannot be read at all (no cluster connection, SPEC 6): no
    /// resources, one error with no kind (`code` 503), and a health that cannot be known.
    pub fn unreadable(namespace: &str, label_selector: &str, code: u16, message: String) -> Self {
        ResourceGroup {
            namespace: namespace.to_owned(),
            label_selector: label_selector.to_owned(),
            health: Health {
                status: health::HealthStatus::Unknown,
                message: Some(message.clone()),
            },
            resources: Vec::new(),
            edges: Vec::new(),
            warnings: Vec::new(),
            errors: vec![ListError {
                api_version: String::new(),
                kind: String::new(),
                code: Some(code),
                message,
            }],
        }
    }
}

impl ResourceGroup {
    /// The group as shown while its agent's cluster cannot be reached (SPEC 14: its circuit is
    /// open since `since`, for the reason `said`): the resources as the cache last saw them,
    /// a health that cannot be known, and a warning saying since when the data is old.
    pub fn while_away(&self, since: DateTime<Utc>, said: &str) -> ResourceGroup {
        let mut group = self.clone();
        group.health = Health {
            status: health::HealthStatus::Unknown,
            message: Some(format!("The agent's cluster cannot be reached: {said}")),
        };
        group.warnings.push(format!(
            "The agent's cluster has not been reachable since {}: what is shown is as it was \
             then ({said})",
            since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
        group
    }
}

/// What the assembly shows of an object's own fields, each `""` (or `None`) when absent or not
/// a string (an object, for `labels`): as `get` finds each of them, but found in one walk of
/// the object's entries and one of its `metadata`'s. Each `get` walks its map from the start,
/// and a `metadata` field the object's first: the twelve lookups an object took (seven for
/// its resource, five for its place in the order) and the copies of what they found were
/// most of an assembly's instructions (callgrind, the GitOps bench's 2,001 objects).
#[derive(Clone, Copy, Default)]
struct Own<'a> {
    api_version: &'a str,
    kind: &'a str,
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
    labels: Option<&'a Tree>,
    created: &'a str,
}

impl<'a> Own<'a> {
    fn of(object: &'a Tree) -> Own<'a> {
        let mut own = Own::default();
        let Some(entries) = object.as_object() else {
            return own;
        };
        let text = |value: &'a Tree| value.as_str().unwrap_or("");
        // A tree holds each key once (a key given twice keeps its last value), so the first
        // entry of a name is the one `get` finds.
        let (mut metadata, mut missing) = (None, 3);
        for (key, value) in entries.iter() {
            match key {
                "apiVersion" => own.api_version = text(value),
                "kind" => own.kind = text(value),
                "metadata" => metadata = Some(value),
                _ => continue,
            }
            missing -= 1;
            if missing == 0 {
                break;
            }
        }
        for (key, value) in metadata.and_then(Tree::as_object).into_iter().flatten() {
            match key {
                "namespace" => own.namespace = text(value),
                "name" => own.name = text(value),
                "uid" => own.uid = text(value),
                "labels" => own.labels = Some(value).filter(|l| l.is_object()),
                "creationTimestamp" => own.created = text(value),
                _ => {}
            }
        }
        own
    }

    /// `(apiVersion, kind, namespace, name, uid)`: the order resources are shown in.
    fn order_key(&self) -> [&'a str; 5] {
        [
            self.api_version,
            self.kind,
            self.namespace,
            self.name,
            self.uid,
        ]
    }
}

/// A `creationTimestamp`, as [`DateTime::parse_from_rfc3339`] reads it, in UTC. The API server
/// writes every one as `YYYY-MM-DDTHH:MM:SSZ`: that form is read field by field (a group's
/// thousands of them took a tenth of its assembly through chrono's general parser), any other
/// (an offset, a fraction, a leap second, lower case) by chrono.
fn created_at(text: &str) -> Option<DateTime<Utc>> {
    fn canonical(b: &[u8]) -> Option<DateTime<Utc>> {
        let shape = b.len() == 20
            && b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[13] == b':'
            && b[16] == b':'
            && b[19] == b'Z';
        if !shape {
            return None;
        }
        let number = |from: usize, to: usize| {
            b[from..to].iter().try_fold(0u32, |n, &d| {
                d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0'))
            })
        };
        let date = chrono::NaiveDate::from_ymd_opt(
            i32::try_from(number(0, 4)?).ok()?,
            number(5, 7)?,
            number(8, 10)?,
        )?;
        let time = date.and_hms_opt(number(11, 13)?, number(14, 16)?, number(17, 19)?)?;
        Some(time.and_utc())
    }
    canonical(text.as_bytes()).or_else(|| {
        DateTime::parse_from_rfc3339(text)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    })
}

/// The indexes of objects in the order of their [`Own::order_key`]s (`keys`). A group's
/// objects share a few `(apiVersion, kind, namespace)`: those are ranked once, so that a
/// comparison reads a number and the names, not three equal strings first (2,001 objects of 20
/// such triples: the sort was the most of an assembly's instructions).
fn shown_order(keys: &[[&str; 5]]) -> Vec<usize> {
    let mut triples: Vec<[&str; 3]> = Vec::new();
    let mut rank_of: FxHashMap<[&str; 3], u32> = FxHashMap::default();
    let ranks: Vec<u32> = keys
        .iter()
        .map(|[api_version, kind, namespace, ..]| {
            let triple = [*api_version, *kind, *namespace];
            *rank_of.entry(triple).or_insert_with(|| {
                triples.push(triple);
                triples.len() as u32 - 1
            })
        })
        .collect();
    // First met -> place in the sorted triples.
    let mut sorted: Vec<u32> = (0..triples.len() as u32).collect();
    sorted.sort_unstable_by_key(|&t| triples[t as usize]);
    let mut place = vec![0u32; triples.len()];
    for (at, &t) in sorted.iter().enumerate() {
        place[t as usize] = at as u32;
    }
    let mut keyed: Vec<(u32, &str, &str, usize)> = keys
        .iter()
        .zip(&ranks)
        .enumerate()
        .map(|(i, ([.., name, uid], &rank))| (place[rank as usize], *name, *uid, i))
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(.., i)| i).collect()
}

/// The edges among `objects` ([`Nodes::edges`]) and the health of each, in their order, from one
/// visit of each object's tree ([`Nodes::read_with`]). The user's health scripts (`custom`) read
/// whole objects: `whole` gives one, asked only for an object of a kind that has a script.
pub fn edges_and_health<T: Borrow<Tree> + Sync>(
    objects: &[T],
    custom: &Customizations,
    whole: impl Fn(&T) -> Option<Value> + Sync,
) -> (Vec<Edge>, Vec<Option<Health>>) {
    let (nodes, healths) = Nodes::read_with(objects, true, |object: &T| {
        health::health_with(object.borrow(), || whole(object), custom)
    });
    (nodes.edges(), healths)
}

/// Builds the view: selected and owned objects together, sorted, each with its health and Events;
/// the edges among them; the group's health over the resources that have one, causes named in
/// resource order; warnings; the errors as listed.
pub fn assemble(listing: Listing, custom: &Customizations) -> ResourceGroup {
    assemble_placed(listing, custom).0
}

/// [`assemble`], and where each object of the listing is shown: for the `i`th of its
/// `selected` then `owned`, the index of its resource. What a caller knows of the objects it
/// listed (a GitOps source's `APPLIES` edges, [`crate::k8s::gitops`]) is placed without
/// looking each one up by its uid.
pub fn assemble_placed(listing: Listing, custom: &Customizations) -> (ResourceGroup, Vec<u32>) {
    let Listing {
        namespace,
        label_selector,
        selected,
        owned,
        mut events,
        errors,
        unavailable,
        warnings: said,
    } = listing;

    let objects: Vec<Arc<Object>> = selected.into_iter().chain(owned).collect();
    // Each object's own fields read once, for its place and its resource alike ([`Own`]).
    let owns: Vec<Own> = objects.iter().map(|o| Own::of(&o.view)).collect();
    // Sort keys read once per object: reading them in the comparator cost more than the rest of
    // the assembly. Edges and health do not depend on the order, so they are computed on the
    // objects as listed and permuted with them.
    let keys: Vec<[&str; 5]> = owns.iter().map(Own::order_key).collect();
    let order = shown_order(&keys);
    drop(keys);
    // A script sees the object as `manifest` shows it: the whole object, with its kind.
    let (edges, mut healths) = edges_and_health(&objects, custom, |o| Some(o.manifest()));
    // Edges name objects by their index as listed; the resources are shown in `order`.
    let mut position = vec![0u32; order.len()];
    for (shown, &listed) in order.iter().enumerate() {
        position[listed] = shown as u32;
    }
    let edges = edges
        .into_iter()
        .map(|e| Edge {
            from: position[e.from as usize],
            to: position[e.to as usize],
            kind: e.kind,
        })
        .collect();
    let group_health = health::aggregate(order.iter().map(|&i| healths[i].as_ref()), |shown| {
        let own = &owns[order[shown]];
        let namespace = Some(own.namespace).filter(|ns| !ns.is_empty());
        (own.kind, namespace, own.name)
    });

    let resources: Vec<Resource> = order
        .iter()
        .map(|&i| {
            let own = &owns[i];
            // Most groups have no Events kept for most of their objects.
            let events = match events.is_empty() {
                true => Vec::new(),
                false => events.remove(own.uid).unwrap_or_default(),
            };
            Resource {
                uid: own.uid.to_owned(),
                api_version: own.api_version.to_owned(),
                kind: own.kind.to_owned(),
                namespace: (!own.namespace.is_empty()).then(|| own.namespace.to_owned()),
                name: own.name.to_owned(),
                labels: own
                    .labels
                    .map_or_else(|| Value::Object(Map::new()), Value::from),
                created_at: created_at(own.created),
                health: healths[i].take(),
                object: objects[i].clone(),
                events,
            }
        })
        .collect();
    drop(owns);

    let mut warnings = Vec::new();
    if resources.is_empty() {
        warnings.push(NO_RESOURCES_WARNING.to_string());
    }
    for failure in unavailable.iter() {
        let code = failure.code.map(|c| format!(" ({c})")).unwrap_or_default();
        warnings.push(format!(
            "The API {} is unavailable{code}, so its resources are not shown: {}",
            failure.group_version, failure.message
        ));
    }
    warnings.extend(said);

    let group = ResourceGroup {
        namespace,
        label_selector,
        health: group_health,
        resources,
        edges,
        warnings,
        errors,
    };
    (group, position)
}

#[cfg(test)]
mod away_tests {
    use super::*;

    #[test]
    fn away_the_health_is_unknown_and_the_data_dated() {
        let mut group = ResourceGroup::unreadable("shop", "app=web", 503, "gone".into());
        group.errors.clear();
        group.health = Health {
            status: health::HealthStatus::Healthy,
            message: None,
        };
        let since = DateTime::parse_from_rfc3339("2026-11-27T14:03:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let away = group.while_away(since, "agent 7 is not connected");
        assert_eq!(away.health.status, health::HealthStatus::Unknown);
        assert!(away.health.message.unwrap().contains("not connected"));
        assert_eq!(
            away.warnings,
            [
                "The agent's cluster has not been reachable since 2026-11-27T14:03:00Z: what is \
              shown is as it was then (agent 7 is not connected)"
            ]
        );
        assert_eq!(group.warnings, Vec::<String>::new());
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::resources::graph::EdgeType;
    use crate::resources::health::HealthStatus;
    use crate::resources::listing::DiscoveryFailure;

    /// A top-level string field, `""` when absent.
    fn field<'a>(object: &'a Tree, name: &str) -> &'a str {
        object.get(name).and_then(Tree::as_str).unwrap_or("")
    }

    /// A `metadata` string field, `""` when absent.
    fn meta<'a>(object: &'a Tree, name: &str) -> &'a str {
        object
            .get("metadata")
            .and_then(|m| m.get(name))
            .and_then(Tree::as_str)
            .unwrap_or("")
    }

    /// [`super::assemble`] by the built-in health rules only.
    fn assemble(listing: Listing) -> ResourceGroup {
        super::assemble(listing, &Customizations::default())
    }
    use crate::resources::tree::TreeBuf;
    use serde_json::json;
    use serde_json::value::RawValue;

    /// A listed object, as the cluster's answer becomes one.
    fn listed(value: Value) -> Arc<Object> {
        let text = RawValue::from_string(value.to_string()).unwrap();
        Arc::new(Object::parse(&text, "", "").unwrap())
    }

    #[test]
    fn the_shown_order_is_that_of_the_whole_keys() {
        // Triples met in no order, names and uids that tie across them, and whole duplicates.
        let mut objects = Vec::new();
        for (i, (api_version, kind, ns)) in [
            ("v1", "Service", "b"),
            ("apps/v1", "Deployment", "b"),
            ("v1", "Service", "a"),
            ("v1", "ConfigMap", ""),
            ("apps/v1", "Deployment", "a"),
            ("v1", "Service", "b"),
        ]
        .iter()
        .cycle()
        .take(60)
        .enumerate()
        {
            let mut metadata =
                json!({"name": format!("web-{}", i % 7), "uid": format!("u{}", i % 4)});
            if !ns.is_empty() {
                metadata["namespace"] = json!(ns);
            }
            objects.push(listed(
                json!({"apiVersion": api_version, "kind": kind, "metadata": metadata}),
            ));
        }
        // The keys read field by field, each lookup from the object's start.
        fn order_key(o: &Tree) -> [&str; 5] {
            [
                field(o, "apiVersion"),
                field(o, "kind"),
                meta(o, "namespace"),
                meta(o, "name"),
                meta(o, "uid"),
            ]
        }
        let mut whole: Vec<([&str; 5], usize)> = objects
            .iter()
            .enumerate()
            .map(|(i, o)| (order_key(&o.view), i))
            .collect();
        let keys: Vec<[&str; 5]> = objects
            .iter()
            .map(|o| Own::of(&o.view).order_key())
            .collect();
        assert_eq!(keys, whole.iter().map(|(k, _)| *k).collect::<Vec<_>>());
        whole.sort_unstable();
        let want: Vec<usize> = whole.into_iter().map(|(_, i)| i).collect();
        assert_eq!(shown_order(&keys), want);
    }

    #[test]
    fn own_fields_are_read_as_field_by_field() {
        // Fields in any order, missing, or of another type; keys beside them.
        for value in [
            json!({"metadata": {"labels": {"a": "b"}, "uid": "u", "name": "n",
                                "namespace": "ns", "creationTimestamp": "2024-05-01T12:00:00Z"},
                   "spec": {}, "apiVersion": "v1", "kind": "ConfigMap"}),
            json!({"kind": 3, "apiVersion": "apps/v1", "metadata": {"name": ["x"], "labels": "l"}}),
            json!({"kind": "Namespace", "metadata": {"name": "apps"}}),
            json!({"apiVersion": "v1", "kind": "Pod"}),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": "none"}),
        ] {
            let object = listed(value.clone());
            let view = &object.view;
            let own = Own::of(view);
            assert_eq!(own.api_version, field(view, "apiVersion"), "{value}");
            assert_eq!(own.kind, field(view, "kind"), "{value}");
            assert_eq!(own.namespace, meta(view, "namespace"), "{value}");
            assert_eq!(own.name, meta(view, "name"), "{value}");
            assert_eq!(own.uid, meta(view, "uid"), "{value}");
            assert_eq!(own.created, meta(view, "creationTimestamp"), "{value}");
            let labels = view
                .get("metadata")
                .and_then(|m| m.get("labels"))
                .filter(|l| l.is_object());
            assert_eq!(own.labels.map(Value::from), labels.map(Value::from));
        }
    }

    #[test]
    fn creation_times_are_read_as_chrono_reads_them() {
        for text in [
            "2024-05-01T12:00:00Z",
            "1970-01-01T00:00:00Z",
            "2024-02-29T23:59:59Z",
            "2023-02-29T12:00:00Z",
            "2024-13-01T12:00:00Z",
            "2024-05-01T24:00:00Z",
            "2016-12-31T23:59:60Z",
            "2024-05-01T12:00:00.123Z",
            "2024-05-01T14:00:00+02:00",
            "2024-05-01t12:00:00z",
            "2024-05-01 12:00:00Z",
            "2024-05-01T12:00:0xZ",
            "+024-05-01T12:00:00Z",
            "",
            "yesterday",
        ] {
            let chrono = DateTime::parse_from_rfc3339(text)
                .ok()
                .map(|t| t.with_timezone(&Utc));
            assert_eq!(created_at(text), chrono, "{text}");
        }
    }

    fn deployment(name: &str, uid: &str, ready: bool) -> Arc<Object> {
        let available = if ready { 1 } else { 0 };
        listed(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "prod", "uid": uid, "generation": 1,
                         "creationTimestamp": "2024-05-01T12:00:00Z",
                         "labels": {"app.gitlab.com/project_id": "42", "app.gitlab.com/environment_slug": "production"},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}}},
            "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                       "availableReplicas": available, "readyReplicas": available,
                       "conditions": if ready { json!([]) } else { json!([{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "too slow"}]) }},
        }))
    }

    fn owned(api_version: &str, kind: &str, name: &str, uid: &str, owner: &str) -> Arc<Object> {
        listed(json!({
            "apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": "prod", "uid": uid,
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "x", "uid": owner, "controller": true}]},
        }))
    }

    fn config_map(name: &str, uid: &str) -> Arc<Object> {
        listed(json!({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": name, "namespace": "prod", "uid": uid}}))
    }

    fn event(reason: &str) -> ResourceEvent {
        ResourceEvent {
            event_type: "Normal".into(),
            reason: reason.into(),
            message: String::new(),
            count: 1,
            first_seen: None,
            last_seen: None,
            source: None,
        }
    }

    #[test]
    fn the_label_selector_names_project_and_environment() {
        assert_eq!(
            label_selector(42, "review-feature-x1a2b3"),
            "app.gitlab.com/project_id=42,app.gitlab.com/environment_slug=review-feature-x1a2b3"
        );
    }

    #[test]
    fn resources_are_sorted_with_health_events_and_edges() {
        let listing = Listing {
            namespace: "prod".into(),
            label_selector: label_selector(42, "production"),
            selected: vec![
                config_map("settings", "cm-1"),
                deployment("web", "d-1", true),
            ],
            owned: vec![owned("apps/v1", "ReplicaSet", "web-abc", "rs-1", "d-1")],
            events: HashMap::from([
                ("d-1".to_string(), vec![event("ScalingReplicaSet")]),
                ("gone".to_string(), vec![event("Orphan")]),
            ]),
            errors: vec![ListError {
                api_version: "v1".into(),
                kind: "Secret".into(),
                code: Some(403),
                message: "secrets is forbidden".into(),
            }],
            unavailable: Default::default(),
            warnings: Vec::new(),
        };
        let group = assemble(listing);
        let order: Vec<_> = group
            .resources
            .iter()
            .map(|r| (r.api_version.as_str(), r.kind.as_str(), r.name.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                ("apps/v1", "Deployment", "web"),
                ("apps/v1", "ReplicaSet", "web-abc"),
                ("v1", "ConfigMap", "settings"),
            ]
        );
        let web = &group.resources[0];
        assert_eq!(web.uid, "d-1");
        assert_eq!(web.namespace.as_deref(), Some("prod"));
        assert_eq!(web.labels["app.gitlab.com/environment_slug"], "production");
        assert_eq!(
            web.created_at.unwrap().to_rfc3339(),
            "2024-05-01T12:00:00+00:00"
        );
        assert_eq!(web.health.as_ref().unwrap().status, HealthStatus::Healthy);
        assert_eq!(web.events, [event("ScalingReplicaSet")]);
        let manifest = web.object.manifest();
        assert!(manifest["metadata"].get("managedFields").is_none());
        assert_eq!(
            manifest["spec"]["template"]["spec"],
            json!({"containers": []})
        );
        let settings = &group.resources[2];
        assert_eq!(settings.health, None, "a ConfigMap has no health rule");
        assert_eq!(settings.labels, json!({}));
        assert_eq!(settings.created_at, None);
        assert_eq!(
            group.edges,
            [Edge {
                from: 0,
                to: 1,
                kind: EdgeType::Owner
            }]
        );
        assert_eq!(group.health.status, HealthStatus::Healthy);
        assert!(group.warnings.is_empty());
        assert_eq!(group.errors.len(), 1);
        assert_eq!(group.errors[0].code, Some(403));
        assert_eq!(
            group.label_selector,
            "app.gitlab.com/project_id=42,app.gitlab.com/environment_slug=production"
        );
    }

    #[test]
    fn group_health_is_the_worst_with_its_causes() {
        let listing = Listing {
            selected: vec![
                deployment("b-ok", "d-2", true),
                deployment("a-stuck", "d-1", false),
                config_map("c", "cm"),
            ],
            ..Listing::default()
        };
        let group = assemble(listing);
        assert_eq!(group.health.status, HealthStatus::Degraded);
        let message = group.health.message.unwrap();
        assert!(
            message.starts_with("Caused by Deployment prod/a-stuck: "),
            "{message}"
        );
        assert!(!message.contains("b-ok"), "{message}");
    }

    #[test]
    fn order_does_not_depend_on_input_order() {
        let objects = vec![
            config_map("b", "u2"),
            config_map("a", "u3"),
            deployment("z", "u1", true),
            config_map("a", "u0"),
        ];
        let forward = assemble(Listing {
            selected: objects.clone(),
            ..Listing::default()
        });
        let backward = assemble(Listing {
            selected: objects.into_iter().rev().collect(),
            ..Listing::default()
        });
        assert_eq!(forward, backward);
        let uids: Vec<_> = forward.resources.iter().map(|r| r.uid.as_str()).collect();
        assert_eq!(uids, ["u1", "u0", "u3", "u2"]);
    }

    #[test]
    fn big_groups_come_out_as_small_ones_do() {
        let mut objects = Vec::new();
        for i in 0..2_000 {
            objects.push(deployment(
                &format!("web-{i:04}"),
                &format!("d-{i:04}"),
                i % 7 != 0,
            ));
            objects.push(owned(
                "apps/v1",
                "ReplicaSet",
                &format!("web-{i:04}-rs"),
                &format!("rs-{i:04}"),
                &format!("d-{i:04}"),
            ));
        }
        // Large enough for two threads (`super::join`) and for prefetching.
        assert!(objects.len() >= super::super::PARALLEL_FROM.max(super::super::PREFETCH_FROM));
        let group = assemble(Listing {
            selected: objects.clone(),
            ..Listing::default()
        });
        let reversed = assemble(Listing {
            selected: objects.iter().rev().cloned().collect(),
            ..Listing::default()
        });
        assert_eq!(group, reversed);
        // The same as computing everything on the sorted objects, one thread.
        let sorted: Vec<TreeBuf> = group
            .resources
            .iter()
            .map(|r| TreeBuf::from(&r.object.manifest()))
            .collect();
        let mut nodes = Nodes::new(true, sorted.len());
        sorted.iter().for_each(|object| nodes.push(object));
        assert_eq!(group.edges, nodes.edges());
        let healths: Vec<_> = sorted.iter().map(|o| health::health(o)).collect();
        let shown: Vec<_> = group.resources.iter().map(|r| r.health.clone()).collect();
        assert_eq!(shown, healths);
        assert_eq!(group.edges.len(), 2_000);
        assert_eq!(group.health.status, HealthStatus::Degraded);
        // 286 of the 2,000 Deployments are not ready: three named, the rest counted.
        assert!(group.health.message.unwrap().ends_with("; and 283 more"));
    }

    #[test]
    fn no_resources_warns_and_is_healthy() {
        let group = assemble(Listing::default());
        assert!(group.resources.is_empty());
        assert!(group.edges.is_empty());
        assert_eq!(group.warnings, [NO_RESOURCES_WARNING]);
        assert_eq!(
            group.health,
            Health {
                status: HealthStatus::Healthy,
                message: None
            }
        );
    }

    #[test]
    fn unavailable_apis_are_warned_about() {
        let group = assemble(Listing {
            selected: vec![config_map("c", "cm")],
            unavailable: vec![DiscoveryFailure {
                group_version: "metrics.example.com/v1".into(),
                code: Some(503),
                message: "the server is currently unable to handle the request".into(),
            }]
            .into(),
            ..Listing::default()
        });
        assert_eq!(
            group.warnings,
            ["The API metrics.example.com/v1 is unavailable (503), so its resources are not shown: the server is currently unable to handle the request"]
        );
    }
}
