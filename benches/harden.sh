#!/usr/bin/env bash
# Issue 22's figures (benches/notes/harden-benchmarks.md): resident memory under 200 connections of
# deployment creations against the idle figure of the same run, and /-/liveness latency while
# clients send GraphQL documents at the cost limits.
#
#   benches/harden.sh memory   # RSS idle, peak under load, then 10, 30 and 60 s after
#   benches/harden.sh probes   # liveness p50/p99 alone, then beside 8 costly GraphQL clients
#   benches/harden.sh held     # RSS with 8,000 connections sending half a head (the cap is 4,096)
source "$(dirname "$0")/common.sh"
what=${1:-memory}
dir=$(mktemp -d /tmp/envlens-harden.XXXX)/data
mkdir -p "$dir"
port=$((20000 + RANDOM % 10000))
url="http://127.0.0.1:$port"
start_envlens "$dir" "$port"
rss() { awk '/VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$envlens_pid/status"; }
"$load" seed --url "$url" --secret-file "$dir/internal-secret" >/dev/null
sleep 5
echo "idle RSS MiB: $(rss)"
case $what in
memory)
  peak=0
  ( while sleep 0.5; do r=$(rss); echo "$r"; done ) >"$dir.rss" &
  sampler=$!
  "$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 200 --seconds 30
  kill "$sampler"
  echo "peak RSS MiB under load: $(sort -n "$dir.rss" | tail -1)"
  for after in 10 30 60; do
    sleep $((after - ${last:-0})); last=$after
    echo "RSS MiB ${after}s after: $(rss)"
  done
  ;;
probes)
  "$load" get --url "$url" --path /-/liveness --connections 1 --rate 100 --seconds 20
  curl -sf -H "X-Gitlab-Token: $(cat "$dir/webhook-token")" -H "X-Gitlab-Event: System Hook" \
    -H 'content-type: application/json' -d '{"event_name": "user_create", "user_id": 1, "username": "root"}' \
    "$url/webhooks/gitlab" >/dev/null
  "$load" costly --url "$url" --session-secret-file "$dir/session-secret" --user-id 1 --username root \
    --connections 8 --seconds 25 > "$dir.costly" &
  costly=$!
  sleep 2
  "$load" get --url "$url" --path /-/liveness --connections 1 --rate 100 --seconds 20
  wait "$costly"; cat "$dir.costly"
  ;;
held)
  python3 - "$port" <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
held = []
for _ in range(8000):
    try:
        s = socket.create_connection(("127.0.0.1", port))
        s.send(b"GET /-/liveness HTTP/1.1\r\nHost: x\r\n"); held.append(s)
    except OSError as e:
        print("connect:", e); break
time.sleep(9)
PY
  holder=$!
  sleep 5
  echo "RSS MiB with 8,000 connections offered: $(rss)"
  curl -s -o /dev/null -w "liveness at the cap: %{http_code} in %{time_total}s\n" "$url/-/liveness"
  curl -s "$url/metrics" | grep -E '^envlens_http_connections'
  wait "$holder"
  sleep 15
  echo "RSS MiB 15 s after they went: $(rss)"
  curl -s "$url/metrics" | grep -E '^envlens_http_connections'
  ;;
esac
