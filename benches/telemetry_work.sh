#!/usr/bin/env bash
# Instructions per request that spans and JSON logs cost, counted by callgrind (stable where
# wall-clock throughput on a shared machine is not): the blueprint GraphQL query and the
# deployment creation served by envlens under callgrind, with ENVLENS_LOG=off and with
# ENVLENS_LOG=info --log-format json, instrumentation on only while the load runs.
#
#   benches/telemetry_work.sh [seconds]     (out: /tmp/envlens-telemetry-work.*/callgrind.*)
source "$(dirname "$0")/common.sh"
seconds=${1:-20}
work=$(mktemp -d /tmp/envlens-telemetry-work.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18687
url=http://127.0.0.1:$port
start_envlens "$dir" "$port"
"$load" seed --url "$url" --secret-file "$dir/internal-secret"
# The blueprint query's data, as benches/telemetry.sh seeds it.
sed -n "/^psql /,/^SQL$/p" benches/telemetry.sh | sed '1d;$d' >"$work/seed.sql"
psql "postgresql:///envlens?host=$dir/run&user=envlens" -qtA -v ON_ERROR_STOP=1 -f "$work/seed.sql"
stop_envlens

id=700000000
for mode in off on; do
  flags=(); [ "$mode" = on ] && flags=(--log-format json)
  log=$([ "$mode" = on ] && echo info || echo off)
  ENVLENS_LOG=$log valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/callgrind.$mode" \
    target/release/envlens serve --listen "127.0.0.1:$port" --data-dir "$dir" "${flags[@]}" >"$dir.out" 2>"$dir.err" &
  pid=$!
  until curl -sf "$url/-/readiness" >/dev/null; do sleep 0.2; done
  callgrind_control -i on "$pid" >/dev/null
  g=$("$load" graphql --url "$url" --session-secret-file "$dir/session-secret" --user-id 5 --username dev \
      --variables yes --connections 4 --seconds "$seconds" | python3 -c 'import json,sys; print(json.load(sys.stdin)["sent"])')
  callgrind_control -d "graphql" "$pid" >/dev/null
  callgrind_control -z "$pid" >/dev/null
  id=$((id + 10000000))
  d=$("$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 4 --seconds "$seconds" \
      --id-base "$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["sent"])')
  callgrind_control -d "deployments" "$pid" >/dev/null
  kill -TERM "$pid"; wait "$pid" || true
  gi=$(grep -h '^summary:' "$work/callgrind.$mode.1" | awk '{print $2}')
  di=$(grep -h '^summary:' "$work/callgrind.$mode.2" | awk '{print $2}')
  printf '%s\tGraphQL %s requests, %d instructions each\tdeployments %s requests, %d instructions each\n' \
    "$mode" "$g" $((gi / g)) "$d" $((di / d))
done
echo "files: $work"
