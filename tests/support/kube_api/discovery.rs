//! Kind registry and the discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`, `/version`)
//! that kubectl and kube-rs read before they touch any resource.

use serde_json::{json, Value};

/// One served resource type, as an `APIResource` entry describes it.
#[derive(Clone, Debug)]
pub(crate) struct ResourceKind {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Subresources answered besides the object itself (`status`, `scale`, `log`).
    pub subresources: Vec<String>,
    /// Only `create` is served (the access reviews), nothing is stored.
    pub create_only: bool,
    /// Whether `watch` is served (most kinds; some aggregated APIs only list).
    pub watchable: bool,
}

impl ResourceKind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `deployments.apps`: the spelling the apiserver uses in error messages.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Objects are stored per group and plural, so every version of a kind shares them.
    pub fn store_key(&self) -> (String, String) {
        (self.group.clone(), self.plural.clone())
    }

    fn api_resources(&self) -> Vec<Value> {
        let mut main = json!({
            "name": self.plural,
            "singularName": self.kind.to_lowercase(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": if self.create_only {
                json!(["create"])
            } else if !self.watchable {
                json!(["create", "delete", "deletecollection", "get", "list", "patch", "update"])
            } else {
                json!(["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"])
            },
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = json!(self.categories);
        }
        let mut out = vec![main];
        for sub in &self.subresources {
            let (kind, group, version, verbs) = match sub.as_str() {
                "log" => (self.kind.as_str(), "", "", json!(["get"])),
                "scale" => (
                    "Scale",
                    "autoscaling",
                    "v1",
                    json!(["get", "patch", "update"]),
                ),
                _ => (
                    self.kind.as_str(),
                    "",
                    "",
                    json!(["get", "patch", "update"]),
                ),
            };
            let mut entry = json!({
                "name": format!("{}/{}", self.plural, sub),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": kind,
                "verbs": verbs,
            });
            if !group.is_empty() {
                entry["group"] = json!(group);
                entry["version"] = json!(version);
            }
            out.push(entry);
        }
        out
    }
}

/// group, version, kind, plural, namespaced, short names, in category "all", subresources.
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    bool,
    &'static [&'static str],
);

/// All kinds the server knows, in registration order (which is also discovery order).
pub(crate) struct Registry {
    kinds: Vec<ResourceKind>,
}

impl Registry {
    /// The built-in kinds the brief lists; short names and the `all` category match a real cluster
    /// so `kubectl get po`, `kubectl get deploy` and `kubectl get all` resolve.
    pub fn builtin() -> Self {
        let mut r = Registry { kinds: Vec::new() };
        #[rustfmt::skip]
        let table: &[Builtin] = &[
            // group, version, kind, plural, namespaced, short names, in "all", subresources
            ("", "v1", "Pod", "pods", true, &["po"], true, &["log", "status"]),
            ("", "v1", "Service", "services", true, &["svc"], true, &["status"]),
            ("", "v1", "Endpoints", "endpoints", true, &["ep"], false, &[]),
            ("", "v1", "ConfigMap", "configmaps", true, &["cm"], false, &[]),
            ("", "v1", "Secret", "secrets", true, &[], false, &[]),
            ("", "v1", "ServiceAccount", "serviceaccounts", true, &["sa"], false, &[]),
            ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", true, &["pvc"], false, &["status"]),
            ("", "v1", "Event", "events", true, &["ev"], false, &[]),
            ("", "v1", "Namespace", "namespaces", false, &["ns"], false, &["status"]),
            ("", "v1", "Node", "nodes", false, &["no"], false, &["status"]),
            ("apps", "v1", "Deployment", "deployments", true, &["deploy"], true, &["scale", "status"]),
            ("apps", "v1", "ReplicaSet", "replicasets", true, &["rs"], true, &["scale", "status"]),
            ("apps", "v1", "StatefulSet", "statefulsets", true, &["sts"], true, &["scale", "status"]),
            ("apps", "v1", "DaemonSet", "daemonsets", true, &["ds"], true, &["status"]),
            ("batch", "v1", "Job", "jobs", true, &[], true, &["status"]),
            ("batch", "v1", "CronJob", "cronjobs", true, &["cj"], true, &["status"]),
            ("networking.k8s.io", "v1", "Ingress", "ingresses", true, &["ing"], false, &["status"]),
            ("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", true, &[], false, &[]),
            ("autoscaling", "v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", true, &["hpa"], true, &["status"]),
            ("apiregistration.k8s.io", "v1", "APIService", "apiservices", false, &[], false, &["status"]),
            ("rbac.authorization.k8s.io", "v1", "Role", "roles", true, &[], false, &[]),
            ("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", true, &[], false, &[]),
            ("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", false, &[], false, &[]),
            ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", false, &[], false, &[]),
            ("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", false, &[], false, &[]),
            ("authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews", false, &[], false, &[]),
            ("authorization.k8s.io", "v1", "SelfSubjectRulesReview", "selfsubjectrulesreviews", false, &[], false, &[]),
        ];
        for &(group, version, kind, plural, namespaced, short, all, subs) in table {
            r.add(ResourceKind {
                group: group.into(),
                version: version.into(),
                kind: kind.into(),
                plural: plural.into(),
                namespaced,
                short_names: short.iter().map(|s| s.to_string()).collect(),
                categories: if all { vec!["all".into()] } else { Vec::new() },
                subresources: subs.iter().map(|s| s.to_string()).collect(),
                create_only: group == "authorization.k8s.io",
                watchable: group != "authorization.k8s.io",
            });
        }
        r
    }

    /// Adds a kind, replacing one with the same group, version and plural.
    pub fn add(&mut self, kind: ResourceKind) {
        match self
            .kinds
            .iter_mut()
            .find(|k| k.group == kind.group && k.version == kind.version && k.plural == kind.plural)
        {
            Some(existing) => *existing = kind,
            None => self.kinds.push(kind),
        }
    }

    pub fn remove(&mut self, group: &str, version: &str, plural: &str) {
        self.kinds
            .retain(|k| !(k.group == group && k.version == version && k.plural == plural));
    }

    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceKind> {
        self.kinds
            .iter()
            .find(|k| k.group == group && k.version == version && k.plural == plural)
    }

    pub fn find_by_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceKind> {
        self.kinds
            .iter()
            .find(|k| k.api_version() == api_version && k.kind == kind)
    }

    /// Looks a kind up by `plural` or `plural.group`, for the test-side helpers.
    pub fn find_by_resource(&self, resource: &str) -> Option<&ResourceKind> {
        self.kinds
            .iter()
            .find(|k| k.plural == resource || k.group_resource() == resource)
    }

    /// Every served group-version, core first, in registration order.
    pub fn group_versions(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for k in &self.kinds {
            let gv = (k.group.clone(), k.version.clone());
            if !out.contains(&gv) {
                out.push(gv);
            }
        }
        out
    }

    pub fn kinds_in(&self, group: &str, version: &str) -> Vec<&ResourceKind> {
        self.kinds
            .iter()
            .filter(|k| k.group == group && k.version == version)
            .collect()
    }

    fn groups(&self) -> Vec<(&str, Vec<&str>)> {
        let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
        for k in self.kinds.iter().filter(|k| !k.group.is_empty()) {
            match out.iter_mut().find(|(g, _)| *g == k.group) {
                Some((_, versions)) => {
                    if !versions.contains(&k.version.as_str()) {
                        versions.push(&k.version);
                    }
                }
                None => out.push((&k.group, vec![&k.version])),
            }
        }
        out
    }

    /// `GET /apis` (APIGroupList). The first registered version of a group is its preferred one.
    pub fn group_list(&self) -> Value {
        let groups: Vec<Value> = self
            .groups()
            .into_iter()
            .map(|(g, versions)| group_doc(g, &versions))
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `GET /apis/<group>` (APIGroup).
    pub fn group(&self, group: &str) -> Option<Value> {
        self.groups()
            .into_iter()
            .find(|(g, _)| *g == group)
            .map(|(g, versions)| {
                let mut doc = group_doc(g, &versions);
                doc["kind"] = json!("APIGroup");
                doc["apiVersion"] = json!("v1");
                doc
            })
    }

    /// `GET /api/v1` or `/apis/<group>/<version>` (APIResourceList).
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let kinds = self.kinds_in(group, version);
        if kinds.is_empty() && !(group.is_empty() && version == "v1") {
            return None;
        }
        let resources: Vec<Value> = kinds.iter().flat_map(|k| k.api_resources()).collect();
        let group_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }))
    }
}

fn group_doc(group: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "preferredVersion": versions[0].clone(), "versions": versions})
}

/// `GET /api` (APIVersions). `host` is echoed back the way the apiserver reports its own address.
pub(crate) fn api_versions(host: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
    })
}

/// `GET /version`: kubectl prints it and checks the server's minor version for skew warnings.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0",
        "gitCommit": "70d3cc986aa8221cd1dfb1121852688902d3bf53",
        "gitTreeState": "clean",
        "buildDate": "2024-12-11T17:59:15Z",
        "goVersion": "go1.23.3",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}
