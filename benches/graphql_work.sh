#!/usr/bin/env bash
# Instructions per blueprint GraphQL query, counted by callgrind (stable where wall-clock
# throughput on a shared machine is not): `serve` under callgrind, its embedded PostgreSQL
# outside it, seeded as benches/graphql.sh seeds (100 projects x 100 environments, here with
# 100,000 deployments: every statement is an index probe, so envlens' work per query does not
# grow with them), logs as graphql.sh runs them (ENVLENS_LOG=warn); instrumentation on only
# while the load tool sends the query, 8 connections. Prints the requests and the instructions
# per request; `callgrind_annotate --inclusive=yes` of the file says where they go.
#
#   benches/graphql_work.sh [seconds] [connections]     (out: /tmp/envlens-graphql-work.*/callgrind.out)
source "$(dirname "$0")/common.sh"
seconds=${1:-20}
connections=${2:-8}
work=$(mktemp -d /tmp/envlens-graphql-work.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18688
url=http://127.0.0.1:$port
start_envlens "$dir" "$port"
# The schema and the deployments of benches/graphql.sh, its first 100,000.
sed -n "/sql <<'SQL'$/,/^SQL$/p" benches/graphql.sh | sed '1d;$d' >"$work/seed.sql"
psql "postgresql:///envlens?host=$dir/run&user=envlens" -qtA -v ON_ERROR_STOP=1 -f "$work/seed.sql"
sed -n "/^add_deployments() {$/,/^}$/p" benches/graphql.sh | sed -n "/^INSERT/,/^CHECKPOINT;$/p" >"$work/deployments.sql"
psql "postgresql:///envlens?host=$dir/run&user=envlens" -qtA -v ON_ERROR_STOP=1 -v from=0 -v to=100000 -f "$work/deployments.sql"
stop_envlens

ENVLENS_LOG=${ENVLENS_LOG:-warn} valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/callgrind.out" \
  "$envlens_bin" serve --listen "127.0.0.1:$port" --data-dir "$dir" >"$dir.out" 2>"$dir.err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true' EXIT
until curl -sf "$url/-/readiness" >/dev/null; do sleep 0.2; done
# One query first, so that the document's first parse and validation are not counted.
"$load" graphql --url "$url" --session-secret-file "$dir/session-secret" --user-id 5 --username dev \
  --variables yes --connections 1 --seconds 1 >/dev/null
callgrind_control -i on "$pid" >/dev/null
out=$("$load" graphql --url "$url" --session-secret-file "$dir/session-secret" --user-id 5 --username dev \
  --variables yes --connections "$connections" --seconds "$seconds")
callgrind_control -d graphql "$pid" >/dev/null
kill -TERM "$pid"; wait "$pid" || true
callgrind_report GraphQL "$out" "$work"
