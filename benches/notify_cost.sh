#!/usr/bin/env bash
# What the environment triggers (migrations 0030, 0031: each write queues its environment for
# the relay's NOTIFY) cost a deployment creation: the same binary and database with the
# triggers enabled and disabled, alternating in rounds (the machine's load
# drifts), each round pgbench of benches/deployments.pgbench (the SQL alone) and then envlens'
# POST /api/v4/internal/deployments (32 connections) for the same seconds. Prints each round
# and the medians of the ratios off/on.
#
#   benches/notify_cost.sh [seconds] [rounds]
source "$(dirname "$0")/common.sh"
seconds=${1:-10}
rounds=${2:-4}
work=$(mktemp -d /tmp/envlens-bench.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18283
url=http://127.0.0.1:$port
start_envlens "$dir" "$port"
"$load" seed --url "$url" --secret-file "$dir/internal-secret"
"$load" run --url "$url" --secret-file "$dir/internal-secret" --seconds 5 --id-base 100000000 >/dev/null  # warm-up
psql_() { psql -h "$dir/run" -U envlens -qAt -d envlens "$@"; }
triggers() {
  for t in deployments:deployments_inserted_notify deployments:deployments_updated_notify \
           agent_deployments:agent_deployments_inserted_notify agent_deployments:agent_deployments_updated_notify \
           environments:environments_inserted_notify environments:environments_updated_notify; do
    psql_ -c "ALTER TABLE ${t%%:*} $1 TRIGGER ${t#*:}"
  done
}
base=200000000
n=0
echo "round mode pgbench_tps envlens_rps load"
for r in $(seq 1 "$rounds"); do
  for mode in on off; do
    if [ "$mode" = on ]; then triggers ENABLE; else triggers DISABLE; fi
    n=$((n + 1))
    pg=$(pgbench -h "$dir/run" -U envlens -n -M prepared -c 32 -j 2 -T "$seconds" -D n=$((n * 10000000)) \
      -D agent=bench/agents:prod -f benches/deployments.pgbench envlens 2>/dev/null | awk '/^tps/ {print int($3)}')
    env=$("$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 32 --seconds "$seconds" \
      --id-base $((base + n * 10000000)) | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["requests_per_second"]))')
    echo "$r $mode $pg $env $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$work/rounds"
  done
done
triggers ENABLE
python3 - "$work/rounds" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for r, mode, pg, env, load in rows:
    by.setdefault(r, {})[mode] = (int(pg), int(env))
pg = [v["off"][0] / v["on"][0] for v in by.values()]
env = [v["off"][1] / v["on"][1] for v in by.values()]
print(f"triggers off / on, medians of {len(by)} rounds: pgbench {statistics.median(pg):.3f}, envlens {statistics.median(env):.3f}")
print(f"envlens / pgbench with the triggers on: {statistics.median(v['on'][1] / v['on'][0] for v in by.values()):.3f}")
PY
stop_envlens
