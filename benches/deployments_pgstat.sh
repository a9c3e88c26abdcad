#!/usr/bin/env bash
# What PostgreSQL does per deployment creation, envlens against pgbench of the same statements
# (benches/deployments.pgbench), in alternating rounds: pg_stat_statements (each statement's
# calls, buffers hit and WAL records; the embedded server is restarted once with it preloaded),
# pg_stat_database's commits and pg_stat_wal's writes and flushes, and the CPU of every
# PostgreSQL process, per creation. A diagnostic: pg_stat_statements costs both sides alike.
#
#   benches/deployments_pgstat.sh [seconds] [rounds]
#   ENVLENS_BIN=/tmp/a/envlens LOAD_BIN=/tmp/a/load benches/deployments_pgstat.sh 8 2   (a kept build)
#   FULL=1 ...: each statement's line too
source "$(dirname "$0")/common.sh"
seconds=${1:-8}
rounds=${2:-2}
script=${PGBENCH_SCRIPT:-benches/deployments.pgbench}
work=$(mktemp -d /tmp/envlens-pgstat.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18290
url=http://127.0.0.1:$port
start_envlens "$dir" "$port"
"$load" seed --url "$url" --secret-file "$dir/internal-secret"
psql_() { psql -h "$dir/run" -U envlens -X -q envlens "$@"; }
psql_ -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
stop_envlens
start_envlens "$dir" "$port"
psql_ -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
postmaster=$(head -1 "$(find "$dir" -name postmaster.pid | head -1)")
"$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 32 --seconds 3 --id-base 100000000 >/dev/null
pgbench -h "$dir/run" -U envlens -n -M prepared -c 32 -j 2 -T 3 -D n=0 -D agent=bench/agents:prod \
  -f "$script" envlens >/dev/null 2>&1
reset() {
  psql_ -c "SELECT pg_stat_statements_reset()" -c "SELECT pg_stat_reset()" \
    -c "SELECT pg_stat_reset_shared('wal')" >/dev/null
}
report() {  # label creations ticks
  local n=$2
  echo "$1: $n creations, PostgreSQL $(python3 -c "print(round(1e6 * $3 / $(getconf CLK_TCK) / $n))") us of CPU each"
  psql_ -At -F ' ' -c "SELECT round(xact_commit::numeric / $n, 2), round(blks_hit::numeric / $n, 1)
    FROM pg_stat_database WHERE datname = 'envlens'" |
    awk '{print "  commits " $1 ", buffers hit " $2 " a creation"}'
  psql_ -At -F ' ' -c "SELECT round(wal_records::numeric / $n, 1), round(wal_write::numeric / $n, 3),
    round(wal_sync::numeric / $n, 3) FROM pg_stat_wal" |
    awk '{print "  WAL records " $1 ", writes " $2 ", flushes " $3 " a creation"}'
  if [ -n "${FULL:-}" ]; then
    psql_ -c "SELECT calls, round(shared_blks_hit::numeric / calls, 1) AS hit_each,
      round(wal_records::numeric / calls, 1) AS wal_each, plans,
      left(regexp_replace(query, '\s+', ' ', 'g'), 60) AS query
      FROM pg_stat_statements WHERE calls > 0 ORDER BY calls DESC LIMIT 12"
  fi
}
for r in $(seq 1 "$rounds"); do
  reset; c0=$(cpu_postgres)
  out=$("$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 32 \
    --seconds "$seconds" --id-base $((r * 100000000 + 200000000000)))
  report "round $r envlens" "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["sent"])' "$out")" \
    $(($(cpu_postgres) - c0))
  reset; c0=$(cpu_postgres)
  out=$(pgbench -h "$dir/run" -U envlens -n -M prepared -c 32 -j 2 -T "$seconds" -D n=$((r * 100000000)) \
    -D agent=bench/agents:prod -f "$script" envlens 2>&1)
  report "round $r pgbench" "$(awk '/actually processed/ {print $NF}' <<<"$out" | cut -d/ -f1)" \
    $(($(cpu_postgres) - c0))
done
stop_envlens
