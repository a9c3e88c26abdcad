#!/usr/bin/env bash
# The Kubernetes proxy: a pod list (20 pods in `apps`) through `/k8s-proxy/` of `serve`, against
# the same list sent straight to the test API server (`benches/kube_server.rs`), 32 connections,
# in alternating runs of each, as a developer whose user_access impersonates them.
#
#   benches/proxy.sh [seconds] [rounds] [latency_ms]
#
# latency_ms (default 0) is added by the API server to every request it answers, as a real API
# server takes milliseconds to list pods: with 0, the test server answers from memory and the
# comparison mostly measures how the four processes share the machine's cores.
source "$(dirname "$0")/common.sh"
seconds=${1:-10}
rounds=${2:-3}
latency_ms=${3:-0}
work=$(mktemp -d /tmp/envlens-proxy.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18485
kube_server=$(cargo build --release --bench kube_server --message-format=json 2>/dev/null |
  python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == "kube_server"][-1])')
"$kube_server" "$work/kube" 20 "$latency_ms" >"$work/kube.url" &
kube_pid=$!
until [ -s "$work/kube.url" ]; do sleep 0.05; done
kube_url=$(cat "$work/kube.url")
# envlens has no default connection (SPEC 6): the agent names its context.
printf 'kubernetes:\n  kubeconfig: %s\n  agents:\n  - agent: "1"\n    context: test\n' "$work/kube/kubeconfig" >"$work/envlens.yaml"
start_envlens "$dir" "$port" --config "$work/envlens.yaml"
trap 'stop_envlens; kill $kube_pid 2>/dev/null || true' EXIT

psql "postgresql:///envlens?host=$dir/run&user=envlens" -qtA -v ON_ERROR_STOP=1 <<'SQL'
INSERT INTO namespaces (id, path, full_path, traversal_ids) VALUES (1, 'bench', 'bench', '{1}');
INSERT INTO projects (id, namespace_id, path, full_path) VALUES (999, 1, 'agents', 'bench/agents'), (1000, 1, 'web', 'bench/web');
INSERT INTO users (id, username) VALUES (5, 'dev');
INSERT INTO members (user_id, source_type, source_id, access_level) VALUES (5, 'group', 1, 30);
INSERT INTO cluster_agents (id, project_id, name) VALUES (1, 999, 'prod');
INSERT INTO agent_user_access_authorizations (agent_id, project_id, config) VALUES (1, 1000, '{"access_as": {"user": {}}}');
INSERT INTO agent_user_access_authorizations (agent_id, group_id, config) VALUES (1, 1, '{"access_as": {"user": {}}}');
SQL

path=/api/v1/namespaces/apps/pods
# Both answers must be the same list before anything is timed.
"$load" proxy --url "http://127.0.0.1:$port" --path "/k8s-proxy$path" --connections 1 --seconds 1 \
  --session-secret-file "$dir/session-secret" --user-id 5 --username dev --agent 1 | grep -q '"200"' ||
  { echo "the proxied list does not answer 200"; exit 1; }
echo "latency ${latency_ms} ms, ${seconds} s per run"
for round in $(seq "$rounds"); do
  printf 'round %s load %s\n' "$round" "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf 'round %s direct ' "$round"
  "$load" get --url "$kube_url" --path "$path" --connections 32 --seconds "$seconds"
  printf 'round %s proxy  ' "$round"
  "$load" proxy --url "http://127.0.0.1:$port" --path "/k8s-proxy$path" --connections 32 --seconds "$seconds" \
    --session-secret-file "$dir/session-secret" --user-id 5 --username dev --agent 1
done
