#!/usr/bin/env bash
# Durability: a 60-second load on POST /api/v4/internal/deployments while PostgreSQL is
# stopped (immediate shutdown, as a crash) for 5 seconds and started again. Every request
# answered 2xx must be in the database afterwards; requests during the outage must fail fast
# with 503; envlens must recover without a restart.
#
#   benches/durability.sh [rate]
source "$(dirname "$0")/common.sh"
rate=${1:-300}
work=$(mktemp -d /tmp/envlens-durability.XXXXXX); chmod 755 "$work"
pg=$work/pg; mkdir -p "$pg"; chown postgres "$pg" 2>/dev/null || true
as_pg "$bindir/initdb" -D "$pg/data" -U envlens --auth=trust --no-locale -E UTF8 >/dev/null
pg_start() { as_pg "$bindir/pg_ctl" -D "$pg/data" -o "-k $pg -c listen_addresses=" -w -l "$pg/log" start >/dev/null; }
pg_stop() { as_pg "$bindir/pg_ctl" -D "$pg/data" -m fast -w stop >/dev/null 2>&1 || true; }
pg_start
as_pg "$bindir/createdb" -h "$pg" -U envlens envlens
export DATABASE_URL="postgres:///envlens?host=$pg&user=envlens"

port=18383
url=http://127.0.0.1:$port
start_envlens "$work/data" "$port" --database-acquire-timeout 1s --request-timeout 5s
trap 'stop_envlens; pg_stop' EXIT
"$load" seed --url "$url" --secret-file "$work/data/internal-secret"
"$load" run --url "$url" --secret-file "$work/data/internal-secret" --connections 32 --seconds 60 --rate "$rate" \
  --id-base 400000000 --acked "$work/acked" > "$work/result.json" &
load_pid=$!
sleep 20
echo "stopping PostgreSQL (immediate) at t=20s"
as_pg "$bindir/pg_ctl" -D "$pg/data" -m immediate -w stop >/dev/null
sleep 5
echo "starting PostgreSQL at t=25s"
pg_start
wait "$load_pid"
ready=$(curl -s -o /dev/null -w '%{http_code}' "$url/-/readiness")
found=$(psql "$DATABASE_URL" -qtA -c "CREATE TEMP TABLE acked (id bigint)" -c "\copy acked FROM '$work/acked'" \
  -c "SELECT count(*) FROM acked JOIN deployments d USING (id) JOIN deployment_creations c ON c.deployment_id = d.id")
stop_envlens
pg_stop
python3 - "$work/result.json" "$found" "$ready" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); found = int(sys.argv[2])
print(json.dumps(r))
print(f"sent {r['sent']}, acknowledged {r['acknowledged']}, found {found}, "
      f"503s {r['statuses'].get('503', 0)}, other failures {r['sent'] - r['acknowledged'] - r['statuses'].get('503', 0)}, "
      f"max latency {r['latency_ms']['max']:.0f} ms, readiness after: {sys.argv[3]}")
print("LOST" if found != r["acknowledged"] else "nothing acknowledged was lost")
PY
