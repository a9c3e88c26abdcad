#!/usr/bin/env bash
# Restart: a 60-second load on POST /api/v4/internal/deployments against `serve` on its embedded
# PostgreSQL, whose postmaster is killed (kill -9) at t = 20 s. envlens must start it again by
# itself; every request answered 2xx must be in the database afterwards; requests during the
# outage must fail fast (503).
#
#   benches/restart.sh [rate] [folder for the data]
source "$(dirname "$0")/common.sh"
rate=${1:-300}
work=$(mktemp -d "${2:-/tmp}/envlens-restart.XXXXXX"); chmod 755 "$work"
port=18384
url=http://127.0.0.1:$port
start_envlens "$work/data" "$port" --request-timeout 5s
"$load" seed --url "$url" --secret-file "$work/data/internal-secret"
"$load" run --url "$url" --secret-file "$work/data/internal-secret" --connections 32 --seconds 60 --rate "$rate" \
  --id-base 500000000 --acked "$work/acked" > "$work/result.json" &
load_pid=$!
sleep 20
postmaster=$(head -1 "$work/data/postgres/postmaster.pid")
echo "kill -9 of the postmaster ($postmaster) at t=20s"
killed=$(date +%s.%N)
kill -9 "$postmaster"
sleep 0.05
for _ in $(seq 1 600); do
  curl -sf "$url/-/readiness" >/dev/null && break
  sleep 0.05
done
ready=$(python3 -c "import time; print(f'{time.time() - $killed:.2f} s')")
wait "$load_pid"
restarts=$(curl -s "$url/metrics" | sed -n 's/^envlens_postgres_restarts_total //p')
db="postgresql://envlens@/envlens?host=$work/data/run"
found=$(psql "$db" -qtA -c "CREATE TEMP TABLE acked (id bigint)" -c "\copy acked FROM '$work/acked'" \
  -c "SELECT count(*) FROM acked JOIN deployments d USING (id) JOIN deployment_creations c ON c.deployment_id = d.id")
stop_envlens
python3 - "$work/result.json" "$found" "$ready" "$restarts" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); found = int(sys.argv[2])
print(json.dumps(r))
print(f"sent {r['sent']}, acknowledged {r['acknowledged']}, found {found}, "
      f"503s {r['statuses'].get('503', 0)}, other failures {r['sent'] - r['acknowledged'] - r['statuses'].get('503', 0)}, "
      f"max latency {r['latency_ms']['max']:.0f} ms, readiness back after {sys.argv[3]}, restarts {sys.argv[4]}")
print("LOST" if found != r["acknowledged"] else "nothing acknowledged was lost")
PY
rm -rf "$work"
