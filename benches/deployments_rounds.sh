#!/usr/bin/env bash
# Deployment creation (POST /api/v4/internal/deployments, 32 connections) against pgbench
# running the same statements (benches/deployments.pgbench, 32 clients, prepared) on the same
# embedded PostgreSQL, in alternating rounds: the order flips every round, so that the
# machine's drifting load and the tables' growth fall on both sides alike. Prints each round
# with the load average and where the CPU went, per request or transaction: the client (the
# load tool or pgbench), envlens, PostgreSQL (every backend, live or exited); then the median
# of the rounds' ratios envlens / pgbench.
#
#   benches/deployments_rounds.sh [seconds] [rounds]
#   ENVLENS_BIN=/tmp/a/envlens LOAD_BIN=/tmp/a/load PGBENCH_SCRIPT=/tmp/a/deployments.pgbench \
#     benches/deployments_rounds.sh 8 8        (a kept build, with the statements it runs)
source "$(dirname "$0")/common.sh"
seconds=${1:-8}
rounds=${2:-8}
script=${PGBENCH_SCRIPT:-benches/deployments.pgbench}
work=$(mktemp -d /tmp/envlens-bench.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18284
url=http://127.0.0.1:$port
start_envlens "$dir" "$port"
"$load" seed --url "$url" --secret-file "$dir/internal-secret"
postmaster=$(head -1 "$(find "$dir" -name postmaster.pid | head -1)")
tick=$(getconf CLK_TCK)
# CPU ticks (user + system) of envlens; PostgreSQL's: `cpu_postgres` (common.sh).
cpu_envlens() { awk '{print $14 + $15}' "/proc/$envlens_pid/stat"; }
# Warm-up of both sides: the pool's connections opened, the statements prepared.
"$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 32 --seconds 3 --id-base 100000000 >/dev/null
pgbench -h "$dir/run" -U envlens -n -M prepared -c 32 -j 2 -T 3 -D n=0 -D agent=bench/agents:prod \
  -f "$script" envlens >/dev/null 2>&1
# Each round prints: rate, client CPU seconds, envlens ticks, PostgreSQL ticks, statuses.
pg_round() {  # counter base
  local e0 p0 out
  e0=$(cpu_envlens); p0=$(cpu_postgres)
  out=$(/usr/bin/time -f "cpu %U %S" pgbench -h "$dir/run" -U envlens -n -M prepared -c 32 -j 2 -T "$seconds" \
    -D n="$1" -D agent=bench/agents:prod -f "$script" envlens 2>&1)
  echo "$(awk '/^tps/ {print $3}' <<<"$out") $(awk '/^cpu/ {print $2 + $3}' <<<"$out") \
$(($(cpu_envlens) - e0)) $(($(cpu_postgres) - p0)) -"
}
env_round() {  # id base
  local e0 p0 out
  e0=$(cpu_envlens); p0=$(cpu_postgres)
  out=$(/usr/bin/time -f "cpu %U %S" "$load" run --url "$url" --secret-file "$dir/internal-secret" \
    --connections 32 --seconds "$seconds" --id-base "$1" 2>&1)
  echo "$(grep '^{' <<<"$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests_per_second"])') \
$(awk '/^cpu/ {print $2 + $3}' <<<"$out") $(($(cpu_envlens) - e0)) $(($(cpu_postgres) - p0)) \
$(grep '^{' <<<"$out" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["statuses"], separators=(",", ":")))')"
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then
    pg=$(pg_round $((r * 100000000))); env=$(env_round $((r * 100000000 + 200000000000)))
  else
    env=$(env_round $((r * 100000000 + 200000000000))); pg=$(pg_round $((r * 100000000)))
  fi
  echo "$r $((2 - r % 2)) $pg $env $(cut -d' ' -f1 /proc/loadavg)" >>"$work/rounds"
  tail -1 "$work/rounds" | python3 -c '
import sys
r, first, pr, pc, pe, pp, _, er, ec, ee, ep, st, load = sys.stdin.read().split()
tick, secs = '"$tick"', '"$seconds"'
n_pg, n_env = float(pr) * secs, float(er) * secs
us = lambda v, n, t=1: f"{1e6 * float(v) / t / n:5.0f}"
first = "pgbench" if first == "1" else "envlens"
print(f"round {r} ({first} first, load {load}): "
      f"pgbench {float(pr):.0f} tps, envlens {float(er):.0f}/s {st}, ratio {float(er) / float(pr):.3f}; "
      f"CPU us each: pgbench client {us(pc, n_pg)} postgres {us(pp, n_pg, tick)} | "
      f"load client {us(ec, n_env)} envlens {us(ee, n_env, tick)} postgres {us(ep, n_env, tick)}")'
done
python3 - "$work/rounds" "$tick" "$seconds" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
tick, secs = int(sys.argv[2]), float(sys.argv[3])
med = lambda xs: statistics.median(xs)
ratios = [float(r[7]) / float(r[2]) for r in rows]
print("ratios " + " ".join(f"{x:.3f}" for x in ratios))
print(f"envlens / pgbench, median of {len(ratios)} rounds: {med(ratios):.3f} (goal >= 0.85)")
# CPU per request or transaction, medians of the rounds.
pg_pg = med([1e6 * int(r[5]) / tick / float(r[2]) / secs for r in rows])
env_pg = med([1e6 * int(r[10]) / tick / float(r[7]) / secs for r in rows])
env = med([1e6 * int(r[9]) / tick / float(r[7]) / secs for r in rows])
load = med([1e6 * float(r[8]) / float(r[7]) / secs for r in rows])
client = med([1e6 * float(r[3]) / float(r[2]) / secs for r in rows])
print(f"CPU us each, medians: pgbench client {client:.0f}, PostgreSQL {pg_pg:.0f} | "
      f"load client {load:.0f}, envlens {env:.0f}, PostgreSQL {env_pg:.0f}")
PY
stop_envlens
