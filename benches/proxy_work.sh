#!/usr/bin/env bash
# Instructions per proxied pod list, counted by callgrind: `serve` under callgrind with the
# test API server as a process (benches/kube_server.rs, 20 pods in `apps`, answering at once),
# seeded as benches/proxy.sh seeds; instrumentation on only while the load tool lists the pods
# through `/k8s-proxy/` (8 connections). Prints the requests and the instructions per request;
# `callgrind_annotate --inclusive=yes` of the file says where they go.
#
#   benches/proxy_work.sh [seconds] [connections]     (out: /tmp/envlens-proxy-work.*/callgrind.out)
source "$(dirname "$0")/common.sh"
seconds=${1:-20}
connections=${2:-8}
work=$(mktemp -d /tmp/envlens-proxy-work.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18689
url=http://127.0.0.1:$port
# KUBE_SERVER, if set, is run instead of benches/kube_server.rs (same arguments and output).
kube_server=${KUBE_SERVER:-$(cargo build --release --bench kube_server --message-format=json 2>/dev/null |
  python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == "kube_server"][-1])')}
# shellcheck disable=SC2086
$kube_server "$work/kube" 20 0 >"$work/kube.url" &
kube_pid=$!
until [ -s "$work/kube.url" ]; do sleep 0.05; done
# envlens has no default connection (SPEC 6): the agent names its context.
printf 'kubernetes:\n  kubeconfig: %s\n  agents:\n  - agent: "1"\n    context: test\n' "$work/kube/kubeconfig" >"$work/envlens.yaml"
start_envlens "$dir" "$port" --config "$work/envlens.yaml"
# The rows of benches/proxy.sh.
sed -n "/^psql .*<<'SQL'$/,/^SQL$/p" benches/proxy.sh | sed '1d;$d' >"$work/seed.sql"
psql "postgresql:///envlens?host=$dir/run&user=envlens" -qtA -v ON_ERROR_STOP=1 -f "$work/seed.sql"
stop_envlens

ENVLENS_LOG=${ENVLENS_LOG:-warn} valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/callgrind.out" \
  "$envlens_bin" serve --listen "127.0.0.1:$port" --data-dir "$dir" --config "$work/envlens.yaml" >"$dir.out" 2>"$dir.err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; kill $kube_pid 2>/dev/null || true' EXIT
until curl -sf "$url/-/readiness" >/dev/null; do sleep 0.2; done
path=/k8s-proxy/api/v1/namespaces/apps/pods
proxy() {
  "$load" proxy --url "$url" --path "$path" --session-secret-file "$dir/session-secret" --user-id 5 --username dev \
    --agent 1 "$@"
}
# A few lists first: the grant and the cluster's client are made by the first.
proxy --connections 1 --seconds 2 | grep -q '"200"' || { echo "the proxied list does not answer 200"; exit 1; }
callgrind_control -i on "$pid" >/dev/null
out=$(proxy --connections "$connections" --seconds "$seconds")
callgrind_control -d proxy "$pid" >/dev/null
kill -TERM "$pid"; wait "$pid" || true
callgrind_report proxy "$out" "$work"
