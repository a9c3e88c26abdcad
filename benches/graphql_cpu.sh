#!/usr/bin/env bash
# Where the CPU of a blueprint query goes, against pgbench running the same statements: the CPU
# time (user and system, from /proc) that each process spends per query while the load runs,
# which unlike the throughput hardly depends on what else the machine runs. Seeded as
# benches/graphql_work.sh seeds (100 x 100 environments, 100,000 deployments); alternating
# rounds of envlens (the load tool, 32 connections) and pgbench (benches/graphql.pgbench, 32
# clients, -M prepared), each of `seconds`. Per query: envlens, the load tool, PostgreSQL (every
# backend and the postmaster), and pgbench's own client.
#
#   benches/graphql_cpu.sh [seconds] [rounds]
#
# SERVE_FLAGS, if set, go to `serve` (e.g. SERVE_FLAGS="--database-max-connections 32").
source "$(dirname "$0")/common.sh"
seconds=${1:-10}
rounds=${2:-2}
work=$(mktemp -d /tmp/envlens-graphql-cpu.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18690
url=http://127.0.0.1:$port
# shellcheck disable=SC2086
start_envlens "$dir" "$port" ${SERVE_FLAGS:-}
sed -n "/sql <<'SQL'$/,/^SQL$/p" benches/graphql.sh | sed '1d;$d' >"$work/seed.sql"
psql "postgresql:///envlens?host=$dir/run&user=envlens" -qtA -v ON_ERROR_STOP=1 -f "$work/seed.sql"
sed -n "/^add_deployments() {$/,/^}$/p" benches/graphql.sh | sed -n "/^INSERT/,/^CHECKPOINT;$/p" >"$work/deployments.sql"
psql "postgresql:///envlens?host=$dir/run&user=envlens" -qtA -v ON_ERROR_STOP=1 -v from=0 -v to=100000 -f "$work/deployments.sql"
postmaster=$(head -1 "$dir/postgres/postmaster.pid")
tick=$(getconf CLK_TCK)

# CPU ticks "user system" of a process, its waited-for children included (fields 14-17).
ticks() { awk '{print $14 + $16, $15 + $17}' "/proc/$1/stat" 2>/dev/null || echo "0 0"; }
# PostgreSQL's: the postmaster's (with its exited backends') and every live backend's.
pg_ticks() {
  local u=0 s=0 a b
  for p in "$postmaster" $(pgrep -P "$postmaster"); do read -r a b < <(ticks "$p"); u=$((u + a)); s=$((s + b)); done
  echo "$u $s"
}
per_query() { python3 -c "import sys; t, n, q = map(float, sys.argv[1:]); print(f'{1e6 * t / n / q:.1f}')" "$1" "$tick" "$2"; }

for round in $(seq "$rounds"); do
  read -r eu0 es0 < <(ticks "$envlens_pid"); read -r pu0 ps0 < <(pg_ticks)
  /usr/bin/time -f '%U %S' -o "$work/load.time" "$load" graphql --url "$url" --session-secret-file "$dir/session-secret" \
    --user-id 5 --username dev --variables yes --connections 32 --seconds "$seconds" >"$work/envlens-$round.json"
  read -r eu1 es1 < <(ticks "$envlens_pid"); read -r pu1 ps1 < <(pg_ticks)
  n=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sent"])' "$work/envlens-$round.json")
  read -r lu ls <"$work/load.time"
  printf 'round %s envlens: %s queries; CPU us per query: envlens %s user %s sys; PostgreSQL %s user %s sys; load tool %s\n' \
    "$round" "$n" "$(per_query $((eu1 - eu0)) "$n")" "$(per_query $((es1 - es0)) "$n")" \
    "$(per_query $((pu1 - pu0)) "$n")" "$(per_query $((ps1 - ps0)) "$n")" \
    "$(python3 -c "import sys; print(f'{1e6 * (float(sys.argv[1]) + float(sys.argv[2])) / int(sys.argv[3]):.1f}')" "$lu" "$ls" "$n")"
  read -r pu0 ps0 < <(pg_ticks)
  /usr/bin/time -f '%U %S' -o "$work/pgbench.time" pgbench -h "$dir/run" -U envlens -n -M prepared -c 32 -j 2 \
    -T "$seconds" -f benches/graphql.pgbench envlens >"$work/pgbench-$round.txt" 2>&1
  read -r pu1 ps1 < <(pg_ticks)
  n=$(awk '/^number of transactions actually processed/ {print $NF}' "$work/pgbench-$round.txt")
  read -r bu bs <"$work/pgbench.time"
  printf 'round %s pgbench: %s transactions; CPU us per transaction: PostgreSQL %s user %s sys; pgbench %s user %s sys\n' \
    "$round" "$n" "$(per_query $((pu1 - pu0)) "$n")" "$(per_query $((ps1 - ps0)) "$n")" \
    "$(python3 -c "import sys; print(f'{1e6 * float(sys.argv[1]) / int(sys.argv[2]):.1f}')" "$bu" "$n")" \
    "$(python3 -c "import sys; print(f'{1e6 * float(sys.argv[1]) / int(sys.argv[2]):.1f}')" "$bs" "$n")"
done
echo "(data in $work; remove it when done: rm -rf $work)"
