#!/usr/bin/env python3
"""Lints and renders charts/envlens with Helm v4 (PyPI's helm-python-sdk: Helm's Go SDK as a
library, no helm binary), then reads the rendered objects and checks what SPEC 12.5 asks of
the chart.

    python3 charts/envlens/tests/test_chart.py              # every check; exit 1 on a failure
    python3 charts/envlens/tests/test_chart.py --pod [VALUES_JSON]  # then print the pod as JSON
    python3 charts/envlens/tests/test_chart.py --lookup KUBECONFIG NAMESPACE

`--pod` prints, on its last line, what a pod of the default install runs and sees: its
arguments, its plain environment, the files its volumes hold (from the rendered ConfigMap and
Secret), its probes, its scrape path, its ClusterRole's rules and every RBAC object rendered,
of the default install or of VALUES_JSON merged over it. The Rust test `tests/chart.rs` runs envlens exactly
so and asks those paths of it. `--lookup` renders as an upgrade against a cluster (the Rust
test's Kubernetes API server) and prints the generated Secret's data as JSON, to show that an
upgrade keeps the secrets that live there.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

import helm_python as helm

CHART = Path(__file__).resolve().parent.parent
REPO = CHART.parent.parent
RELEASE = "envlens"
NAMESPACE = "gitlab"
# The only value a default install must set (README "Running it in Kubernetes").
BASE = {"database": {"existingSecret": "envlens-database"}}

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}

# What envlens asks of the cluster it runs in (src/k8s): discovery, reads of the core kinds it
# shows (named: never Secrets, never a proxy subresource) and of the other API groups by name,
# pod logs, impersonation for `access_as: {user: {}}` with the four extras of
# src/k8s/grants.rs, SubjectAccessReviews for the watch cache and SelfSubjectRulesReviews for
# its own reads. Nothing else.
CORE_READS = [
    "configmaps", "endpoints", "events", "limitranges", "namespaces", "persistentvolumeclaims", "pods",
    "podtemplates", "replicationcontrollers", "resourcequotas", "serviceaccounts", "services",
]
# The groups of Helm's default capabilities (what an offline render sees; `helm install` sees
# the cluster's own).
DEFAULT_GROUPS = [
    "admissionregistration.k8s.io", "apiextensions.k8s.io", "apps", "authentication.k8s.io",
    "authorization.k8s.io", "autoscaling", "batch", "certificates.k8s.io", "coordination.k8s.io",
    "discovery.k8s.io", "events.k8s.io", "extensions", "flowcontrol.apiserver.k8s.io",
    "internal.apiserver.k8s.io", "networking.k8s.io", "node.k8s.io", "policy",
    "rbac.authorization.k8s.io", "resource.k8s.io", "scheduling.k8s.io", "storage.k8s.io",
    "storagemigration.k8s.io",
]
FLUX_RULES = [
    {"apiGroups": ["kustomize.toolkit.fluxcd.io"], "resources": ["kustomizations"], "verbs": ["patch"]},
    {"apiGroups": ["helm.toolkit.fluxcd.io"], "resources": ["helmreleases"], "verbs": ["patch"]},
]
REVIEW_RULES = [
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectrulesreviews"], "verbs": ["create"]},
]


def expected_rules(groups: list[str], flux: bool = False) -> list[dict]:
    return [
        {"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": CORE_READS, "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        {"apiGroups": sorted(groups), "resources": ["*"], "verbs": ["get", "list", "watch"]},
        *(FLUX_RULES if flux else []),
        {"apiGroups": [""], "resources": ["users", "groups"], "verbs": ["impersonate"]},
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": [
                "userextras/agent.gitlab.com/id",
                "userextras/agent.gitlab.com/username",
                "userextras/agent.gitlab.com/config_project_id",
                "userextras/agent.gitlab.com/access_type",
            ],
            "verbs": ["impersonate"],
        },
        *REVIEW_RULES,
    ]


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def objects(manifests: dict[str, str]) -> list[dict]:
    """The rendered objects, parsed with Helm's own YAML reader."""
    found = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in text.split("\n---"):
            if doc.strip() and any(not line.lstrip().startswith("#") for line in doc.strip().splitlines()):
                parsed = helm.values_from_yaml(doc)
                if parsed:
                    found.append(parsed)
    return found


def render(extra: dict | None = None) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        return objects(chart.render(merge(BASE, extra or {}), name=RELEASE, namespace=NAMESPACE))


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str) -> dict:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(objs: list[dict]) -> dict:
    containers = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, containers
    return containers[0]


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name value` or `--name=value` in a container's arguments."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def pod_files(objs: list[dict]) -> dict[str, str]:
    """What the container sees at each mounted file, from the rendered ConfigMaps and Secrets:
    the kubelet's work, for the volume kinds this chart uses. Files of Secrets the chart does
    not render (existing ones) are left out."""
    spec = one(objs, "Deployment")["spec"]["template"]["spec"]
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in by_kind(objs, "ConfigMap")}
    secrets = {
        o["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in o.get("data", {}).items()}
        for o in by_kind(objs, "Secret")
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    files = {}
    for mount in spec["containers"][0]["volumeMounts"]:
        volume = volumes[mount["name"]]
        sources = []
        if "configMap" in volume:
            sources.append((config_maps[volume["configMap"]["name"]], volume["configMap"].get("items")))
        if "secret" in volume:
            sources.append((secrets.get(volume["secret"]["secretName"]), volume["secret"].get("items")))
        for source in volume.get("projected", {}).get("sources", []):
            for kind, data in (("configMap", config_maps), ("secret", secrets)):
                if kind in source:
                    sources.append((data.get(source[kind]["name"]), source[kind].get("items")))
        for data, items in sources:
            if data is None:
                continue
            for key, path in [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]:
                files[f"{mount['mountPath']}/{path}"] = data[key]
    return files


def pod(objs: list[dict]) -> dict:
    c = container(objs)
    annotations = one(objs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    return {
        "args": c["args"],
        "env": {e["name"]: e["value"] for e in c["env"] if "value" in e},
        "files": pod_files(objs),
        "probes": sorted({c[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}),
        "scrape_path": annotations["prometheus.io/path"],
        "cluster_role_rules": one(objs, "ClusterRole")["rules"],
        "rbac": [o for o in objs if o["apiVersion"] == "rbac.authorization.k8s.io/v1"],
    }


# --- the checks ---------------------------------------------------------------------------


EVERYTHING_ON = {
    "otlpEndpoint": "http://otel-collector:4318/v1/traces",
    "ingress": {"enabled": True, "className": "nginx", "tls": [{"hosts": ["envlens.example.com"], "secretName": "tls"}]},
    "monitoring": {"grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}},
    "secrets": {"session": {"existingSecret": "gitlab-envlens", "key": "session"}},
    "extraArgs": ["--request-timeout", "60s"],
    "extraEnv": [{"name": "ENVLENS_LOG", "value": "debug"}],
}


def test_lint_is_clean():
    for values in (BASE, merge(BASE, EVERYTHING_ON)):
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.30.0")
        assert not report["errors"], report
        worse_than_info = [m for m in report["messages"] if m["severity"] >= 2]
        assert not worse_than_info, worse_than_info


def test_no_database_no_render():
    for values in ({}, {"database": {"existingSecret": ""}}):
        try:
            with helm.Chart.load(CHART) as chart:
                chart.render(values, name=RELEASE, namespace=NAMESPACE)
        except helm.HelmRenderError as e:
            assert "database.existingSecret is required" in str(e), str(e)
            assert "embedded PostgreSQL" in str(e), str(e)
        else:
            raise AssertionError(f"rendered without a database URL: {values}")


def test_default_objects():
    objs = render()
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(
        ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "NetworkPolicy",
         "PodDisruptionBudget", "Secret", "Service", "ServiceAccount"]
    ), kinds
    for o in objs:
        assert o["apiVersion"] != "monitoring.coreos.com/v1"


def test_deployment():
    objs = render()
    deployment = one(objs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    c = container(objs)
    assert c["args"][0] == "serve"
    assert flag(c["args"], "--listen") == "0.0.0.0:8080"
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert port == {"http": 8080, "internal": 8081}
    for probe, path in (("livenessProbe", "/-/liveness"), ("readinessProbe", "/-/readiness")):
        assert c[probe]["httpGet"] == {"path": path, "port": "http"}, c[probe]
    assert c["startupProbe"]["httpGet"]["port"] == "http"
    env = {e["name"]: e for e in c["env"]}
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "envlens-database", "key": "url"}
    assert env["ENVLENS_LOG_FORMAT"]["value"] == "json"
    # The proxy refuses the Secrets of the namespace envlens runs in (SPEC 13).
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"] == {"fieldPath": "metadata.namespace"}
    assert flag(c["args"], "--otlp-endpoint") is None
    resources = c["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"], resources
    assert resources["limits"]["memory"], resources
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(port["http"])
    assert annotations["prometheus.io/path"] == "/metrics"
    # The Service and the PodDisruptionBudget find these pods.
    service = one(objs, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


def test_replicas_reach_each_other_on_the_internal_port_alone():
    """SPEC 16: each pod advertises http://<its IP>:<internal port>, and only envlens' own pods
    may reach that port; the public one is left open."""
    objs = render()
    c = container(objs)
    assert flag(c["args"], "--internal-listen") == "0.0.0.0:8081"
    assert flag(c["args"], "--replica-window") == "10s"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"] == {"fieldPath": "status.podIP"}
    assert "ENVLENS_ADVERTISE_URL" not in env
    labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    policy = one(objs, "NetworkPolicy")
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    internal, public = spec["ingress"]
    assert internal["ports"] == [{"port": "internal", "protocol": "TCP"}]
    (source,) = internal["from"]
    assert set(source) == {"podSelector"}, "no namespaceSelector or ipBlock"
    assert source["podSelector"]["matchLabels"] == spec["podSelector"]["matchLabels"]
    assert public == {"ports": [{"port": "http", "protocol": "TCP"}]}
    # Another port for the internal listener moves all three.
    objs = render({"replicas": {"internalPort": 9443, "networkPolicy": False}})
    c = container(objs)
    assert flag(c["args"], "--internal-listen") == "0.0.0.0:9443"
    assert {p["name"]: p["containerPort"] for p in c["ports"]}["internal"] == 9443
    assert by_kind(objs, "NetworkPolicy") == []


def test_non_root_read_only():
    objs = render()
    pod_spec = one(objs, "Deployment")["spec"]["template"]["spec"]
    c = container(objs)
    pod_sc, sc = pod_spec["securityContext"], c["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and sc["runAsNonRoot"] is True
    assert isinstance(sc["runAsUser"], int) and sc["runAsUser"] > 0
    assert pod_sc["runAsUser"] == sc["runAsUser"]
    # The image's own user (the Dockerfile's USER), so that both agree.
    dockerfile = (REPO / "Dockerfile").read_text()
    users = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] == str(sc["runAsUser"]), users
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # envlens writes nothing once its database and secret files are given (tests/chart.rs runs
    # it so with an unwritable data folder): every volume is a read-only one.
    for mount in c["volumeMounts"]:
        assert mount.get("readOnly") is True, mount


def test_config_and_secret_files_are_wired():
    objs = render({"config": {"cors": {"allowed_origins": ["https://gitlab.example.com"]}}})
    c = container(objs)
    files = pod_files(objs)
    config = helm.values_from_yaml(files[flag(c["args"], "--config")])
    assert config["cors"]["allowed_origins"] == ["https://gitlab.example.com"]
    assert set(config) == {"kubernetes", "cors"}, config
    for name in ("--internal-secret-file", "--session-secret-file"):
        key = base64.b64decode(files[flag(c["args"], name)], validate=True)
        assert len(key) == 32, (name, len(key))
    assert len(files[flag(c["args"], "--webhook-token-file")]) >= 32
    secret = one(objs, "Secret")
    assert secret["metadata"]["name"] == "envlens-secrets"
    assert sorted(secret["data"]) == ["internal-secret", "session-secret", "webhook-token"]
    # Each render of a new install draws new secrets.
    again = one(render(), "Secret")["data"]
    assert again["session-secret"] != secret["data"]["session-secret"]


def test_existing_secrets():
    values = {
        "secrets": {
            "internal": {"existingSecret": "gitlab-envlens", "key": "internal"},
            "session": {"existingSecret": "gitlab-envlens", "key": "session"},
        }
    }
    objs = render(values)
    sources = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    projected = next(v for v in sources if v["name"] == "secrets")["projected"]["sources"]
    wired = sorted((s["secret"]["name"], s["secret"]["items"][0]["key"], s["secret"]["items"][0]["path"]) for s in projected)
    assert wired == [
        ("envlens-secrets", "webhook-token", "webhook-token"),
        ("gitlab-envlens", "internal", "internal-secret"),
        ("gitlab-envlens", "session", "session-secret"),
    ], wired
    assert sorted(one(objs, "Secret")["data"]) == ["webhook-token"]
    values["secrets"]["webhookToken"] = {"existingSecret": "hook", "key": "token"}
    assert by_kind(render(values), "Secret") == []


def test_gitlab_token_is_mounted_and_named_in_the_configuration():
    values = {
        "config": {"gitlab": {"url": "https://gitlab.example.com", "groups": ["acme"]}},
        "gitlabToken": {"existingSecret": "envlens-gitlab-token", "key": "token"},
    }
    objs = render(values)
    c = container(objs)
    config = helm.values_from_yaml(pod_files(objs)[flag(c["args"], "--config")])
    assert config["gitlab"] == {
        "url": "https://gitlab.example.com",
        "groups": ["acme"],
        "token_file": "/etc/envlens/secrets/gitlab-token",
    }, config
    sources = one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    projected = next(v for v in sources if v["name"] == "secrets")["projected"]["sources"]
    assert {"name": "envlens-gitlab-token", "items": [{"key": "token", "path": "gitlab-token"}]} in [
        s["secret"] for s in projected
    ], projected
    # Without GitLab's URL the chart refuses, naming the value.
    try:
        render({"gitlabToken": {"existingSecret": "envlens-gitlab-token"}})
    except Exception as e:  # noqa: BLE001 - Helm's render error
        assert "config.gitlab.url" in str(e), e
    else:
        raise AssertionError("rendered a GitLab token without config.gitlab.url")


def test_cluster_role_is_exactly_what_envlens_asks():
    objs = render()
    role = one(objs, "ClusterRole")
    assert role["rules"] == expected_rules(DEFAULT_GROUPS), json.dumps(role["rules"], indent=1)
    for rule in role["rules"]:
        written = set(rule["verbs"]) & WRITE_VERBS
        if written:
            assert rule in REVIEW_RULES, rule  # only `create` of the access reviews
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}
    account = one(objs, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert one(objs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account


def read_rules(rules: list[dict]) -> list[dict]:
    return [r for r in rules if "resources" in r and set(r["verbs"]) & {"get", "list", "watch", "*"}]


def test_no_secret_no_proxy_no_wildcard_by_default():
    """SPEC 13: the service account reads no Secret anywhere, no proxy subresource, and RBAC
    having no deny, nothing through `*` that would cover them."""
    objs = render({"rbac": {"apiGroups": ["example.com"]}})
    rules = one(objs, "ClusterRole")["rules"]
    for rule in rules:
        groups, resources = rule.get("apiGroups", []), rule.get("resources", [])
        assert "*" not in groups, rule
        assert "*" not in rule["verbs"], rule
        assert "secrets" not in resources and "secrets/*" not in resources, rule
        for resource in resources:
            assert not resource.endswith("/proxy") and resource != "*/*", rule
        if "" in groups:
            assert "*" not in resources, rule
    assert "nodes/proxy" not in json.dumps(rules)
    core = [r for r in read_rules(rules) if "" in r["apiGroups"]]
    assert sorted(sum((r["resources"] for r in core), [])) == sorted(CORE_READS + ["pods/log"]), core
    # The other groups by name: Helm's capabilities and rbac.apiGroups.
    (groups,) = [r["apiGroups"] for r in read_rules(rules) if r["resources"] == ["*"]]
    assert groups == sorted(DEFAULT_GROUPS + ["example.com"]), groups
    # No Role, no RoleBinding: no namespace's Secrets.
    assert by_kind(objs, "Role") == [] and by_kind(objs, "RoleBinding") == []


def test_secrets_only_in_the_namespaces_listed():
    objs = render({"rbac": {"secrets": {"namespaces": ["shop", "shop-staging", "shop"]}}})
    roles = {r["metadata"]["namespace"]: r for r in by_kind(objs, "Role")}
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(objs, "RoleBinding")}
    assert sorted(roles) == sorted(bindings) == ["shop", "shop-staging"], (roles, bindings)
    account = one(objs, "ServiceAccount")["metadata"]["name"]
    for namespace, role in roles.items():
        assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}], role
        binding = bindings[namespace]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert "secrets" not in json.dumps(one(objs, "ClusterRole")["rules"])


def refused(values: dict) -> str:
    """Helm's error for `values`, which must not render."""
    try:
        render(values)
    except helm.HelmRenderError as e:
        return str(e)
    raise AssertionError(f"rendered: {values}")


def test_the_release_namespace_secrets_are_refused():
    message = refused({"rbac": {"secrets": {"namespaces": ["shop", NAMESPACE]}}})
    assert f"must not hold the release's own namespace {NAMESPACE}" in message, message
    for bad in (["*"], ["Shop"], [""], [7], "shop"):
        message = refused({"rbac": {"secrets": {"namespaces": bad}}})
        assert "rbac.secrets.namespaces" in message, (bad, message)
    for bad in ("*", "", "apps/v1"):
        message = refused({"rbac": {"apiGroups": [bad]}})
        assert "rbac.apiGroups" in message, (bad, message)


def test_flux_actions_only_when_set():
    for values, flux in (({}, False), ({"rbac": {"fluxActions": False}}, False), ({"rbac": {"fluxActions": True}}, True)):
        rules = one(render(values), "ClusterRole")["rules"]
        assert rules == expected_rules(DEFAULT_GROUPS, flux=flux), (values, rules)
        patches = [r for r in rules if "patch" in r["verbs"]]
        assert patches == (FLUX_RULES if flux else []), patches


def test_in_cluster_agents_are_entries_of_the_configuration():
    objs = render({
        "inClusterAgents": [7, "acme/agents:prod"],
        "config": {"kubernetes": {"agents": [{"agent": 9, "context": "other"}]}},
    })
    config = helm.values_from_yaml(pod_files(objs)[flag(container(objs)["args"], "--config")])
    assert config["kubernetes"]["agents"] == [
        {"agent": 9, "context": "other"},
        {"agent": 7, "in_cluster": True},
        {"agent": "acme/agents:prod", "in_cluster": True},
    ], config
    # None by default: no agent reaches this cluster unless named.
    default = helm.values_from_yaml(pod_files(render())["/etc/envlens/config/config.yaml"])
    assert default["kubernetes"]["agents"] == [], default
    message = refused({"inClusterAgents": [{"agent": 7}]})
    assert "inClusterAgents" in message, message


def test_optional_parts():
    objs = render({
        "otlpEndpoint": "http://otel-collector:4318/v1/traces",
        "ingress": {"enabled": True, "className": "nginx"},
        "logFormat": "text",
    })
    c = container(objs)
    assert flag(c["args"], "--otlp-endpoint") == "http://otel-collector:4318/v1/traces"
    assert {e["name"]: e.get("value") for e in c["env"]}["ENVLENS_LOG_FORMAT"] == "text"
    ingress = one(objs, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    service = one(objs, "Service")
    assert backend == {"name": service["metadata"]["name"], "port": {"number": service["spec"]["ports"][0]["port"]}}


def test_monitoring_assets():
    for name in ("grafana-dashboard.json", "prometheus-rules.yaml"):
        copy, original = CHART / "files" / name, REPO / "deploy" / "monitoring" / name
        assert copy.read_bytes() == original.read_bytes(), f"{copy} differs from {original}: copy it again"
    objs = render({"monitoring": {"grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}})
    dashboards = [o for o in by_kind(objs, "ConfigMap") if o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dashboards) == 1, dashboards
    (text,) = dashboards[0]["data"].values()
    assert json.loads(text) == json.loads((REPO / "deploy/monitoring/grafana-dashboard.json").read_text())
    rule = one(objs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    rules_file = helm.values_from_yaml((REPO / "deploy/monitoring/prometheus-rules.yaml").read_text())
    assert rule["spec"] == {"groups": rules_file["groups"]}


def readme_sets(command_start: str) -> tuple[str, dict]:
    """A `helm` command of the README (with its continuation lines) and its `--set`s, parsed by Helm."""
    readme = (REPO / "README.md").read_text()
    start = readme.index(command_start)
    lines = [readme[start:].split("\n")[0]]
    for line in readme[start:].split("\n")[1:]:
        if not lines[-1].rstrip().endswith("\\"):
            break
        lines.append(line)
    command = " ".join(line.rstrip(" \\") for line in lines)
    words = command.split()
    values: dict = {}
    for i, word in enumerate(words):
        if word == "--set":
            values = merge(values, helm.parse_set_string(words[i + 1].strip("'")))
    return command, values


def test_readme_gitlab_install_renders():
    """README "Beside a GitLab as shipped": GitLab's URL, groups and token reach the file."""
    command, values = readme_sets("helm upgrade --install envlens charts/envlens")
    with helm.Chart.load(CHART) as chart:
        objs = objects(chart.render(values, name=RELEASE, namespace=NAMESPACE))
    c = container(objs)
    assert flag(c["args"], "--public-url") == "https://envlens.example.com", command
    config = helm.values_from_yaml(pod_files(objs)["/etc/envlens/config/config.yaml"])
    assert config["gitlab"] == {
        "url": "https://gitlab.example.com",
        "groups": ["acme"],
        "token_file": "/etc/envlens/secrets/gitlab-token",
    }, (command, config)


def test_readme_install_command_renders():
    """The `helm install` of README "Running it in Kubernetes", its `--set`s parsed by Helm."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("helm install envlens charts/envlens")
    lines = [readme[start:].split("\n")[0]]
    for line in readme[start:].split("\n")[1:]:
        if not lines[-1].rstrip().endswith("\\"):
            break
        lines.append(line)
    command = " ".join(line.rstrip(" \\") for line in lines)
    words = command.split()
    values: dict = {}
    for i, word in enumerate(words):
        if word == "--set":
            values = merge(values, helm.parse_set_string(words[i + 1].strip("'")))
    assert values["database"]["existingSecret"] == "envlens-database", (command, values)
    with helm.Chart.load(CHART) as chart:
        objs = objects(chart.render(values, name=RELEASE, namespace=NAMESPACE))
    assert container(objs)["image"].startswith(values["image"]["repository"] + ":")
    config = helm.values_from_yaml(pod_files(objs)["/etc/envlens/config/config.yaml"])
    assert config["cors"]["allowed_origins"] == ["https://gitlab.example.com"], config


def lookup(kubeconfig: str, namespace: str) -> dict:
    """The generated Secret's data when the chart is rendered as an upgrade against a cluster."""
    with helm.Config(kubeconfig_path=kubeconfig, namespace=namespace) as config, helm.Chart.load(CHART) as chart:
        manifests = config.render(chart, BASE, name=RELEASE, namespace=namespace, is_upgrade=True)
    return one(objects(manifests), "Secret")["data"]


def main(argv: list[str]) -> int:
    helm.disable_logging()
    if argv[:1] == ["--lookup"]:
        print(json.dumps(lookup(argv[1], argv[2])))
        return 0
    failed = 0
    tests = [(name, f) for name, f in globals().items() if name.startswith("test_") and callable(f)]
    for name, test in tests:
        try:
            test()
            print(f"ok   {name}")
        except Exception as e:  # noqa: BLE001 - report every failing check, then fail
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{len(tests) - failed} passed, {failed} failed (Helm {helm.helm_sdk_version()})")
    if failed:
        return 1
    if argv[:1] == ["--pod"]:
        print(json.dumps(pod(render(json.loads(argv[1]) if argv[1:] else None))))
    return 0


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main(sys.argv[1:]))
