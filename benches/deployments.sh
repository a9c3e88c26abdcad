#!/usr/bin/env bash
# Throughput of POST /api/v4/internal/deployments (32 connections, distinct deployments, half
# authorized through a group two levels up) against `serve` on its embedded PostgreSQL; beside
# it in the same run, pgbench doing the same SQL directly (benches/deployments.pgbench), the
# limit of the machine; then p50/p99 at half of pgbench's rate, open loop.
#
#   benches/deployments.sh [seconds]
source "$(dirname "$0")/common.sh"
seconds=${1:-30}
work=$(mktemp -d /tmp/envlens-bench.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18282
url=http://127.0.0.1:$port
start_envlens "$dir" "$port"
"$load" seed --url "$url" --secret-file "$dir/internal-secret"
"$load" run --url "$url" --secret-file "$dir/internal-secret" --seconds 5 --id-base 100000000 >/dev/null  # warm-up

echo "== pgbench, the same SQL, 32 clients: the limit of the machine"
pgbench -h "$dir/run" -U envlens -n -M prepared -c 32 -j 2 -T "$seconds" -D n=0 -D agent=bench/agents:prod \
  -f benches/deployments.pgbench envlens | tee /tmp/pgbench.txt | grep -E "^(tps|latency)"
tps=$(awk '/^tps/ {print int($3)}' /tmp/pgbench.txt)
half=$((tps / 2))

echo "== envlens, 32 connections, as fast as it answers"
"$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 32 --seconds "$seconds" --id-base 200000000 | tee /tmp/envlens-max.json

echo "== envlens at half of pgbench's rate ($half/s), open loop"
"$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 32 --seconds "$seconds" --rate "$half" --id-base 300000000

echo "== pgbench at the same rate ($half/s), open loop: the floor for latency"
rm -f "$work"/pgb.*
pgbench -h "$dir/run" -U envlens -n -M prepared -c 32 -j 2 -T "$seconds" -R "$half" -l --log-prefix="$work/pgb" \
  -D n=100000 -D agent=bench/agents:prod -f benches/deployments.pgbench envlens | grep -E "^(tps|latency)"

python3 - "$tps" "$work" <<'PY'
import glob, json, sys
tps = float(sys.argv[1]); env = json.load(open("/tmp/envlens-max.json"))
print(f"envlens {env['requests_per_second']:.0f}/s vs pgbench {tps:.0f} tps: {100 * env['requests_per_second'] / tps:.0f}%")
# pgbench -l with -R: client, tx, latency_us, script, epoch, epoch_us, schedule_lag_us
lat = sorted(int(f[2]) + int(f[6]) for path in glob.glob(sys.argv[2] + "/pgb.*") for f in (l.split() for l in open(path)))
pct = lambda p: lat[min(len(lat) - 1, int(len(lat) * p))] / 1000
print(f"pgbench at half rate, from scheduled start: p50 {pct(0.5):.2f} ms, p99 {pct(0.99):.2f} ms, max {lat[-1] / 1000:.0f} ms")
PY
stop_envlens
