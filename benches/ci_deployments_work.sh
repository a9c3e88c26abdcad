#!/usr/bin/env bash
# Instructions per request of the two deployment creations of benches/ci_deployments.sh,
# counted by callgrind (stable where wall-clock rates on a shared machine are not): the
# internal call of SPEC 4.3 (HS256) and the job's call with its CI/CD ID token (SPEC 12.2,
# RS256 against GitLab's cached key set), served by one envlens under callgrind, instrumentation
# on only while each load runs (the Deployment Hooks that precede the job's calls are not
# counted). envlens' instructions only: PostgreSQL's share of each request is not in them.
#
#   benches/ci_deployments_work.sh [seconds] [count]   (out: /tmp/envlens-ci-work.*/callgrind.*)
# count: the ID tokens seeded, one a request: more than `seconds` sends under callgrind (some
# 150 a second here); by default 300 a second, so that a longer run does not run out of them.
#   ENVLENS_BIN=/tmp/a/envlens LOAD_BIN=/tmp/a/load benches/ci_deployments_work.sh   (a kept build)
source "$(dirname "$0")/common.sh"
seconds=${1:-15}
count=${2:-$((seconds * 300))}
work=$(mktemp -d /tmp/envlens-ci-work.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18391; gitlab_port=18392
url=http://127.0.0.1:$port
gitlab=http://127.0.0.1:$gitlab_port
"$load" gitlab --listen "127.0.0.1:$gitlab_port" --key-der tests/fixtures/keys/gitlab-rsa.der >"$work/gitlab.out" &
gitlab_pid=$!
printf 'gitlab:\n  url: %s\n' "$gitlab" >"$work/envlens.yaml"
# A first start creates the data directory, its secrets and the database; seeded, then stopped.
start_envlens "$dir" "$port" --config "$work/envlens.yaml" --public-url "$url"
trap 'stop_envlens; kill $gitlab_pid 2>/dev/null || true' EXIT
"$load" seed --url "$url" --secret-file "$dir/internal-secret"
stop_envlens

ENVLENS_LOG=warn valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/callgrind" \
  "$envlens_bin" serve --listen "127.0.0.1:$port" --data-dir "$dir" \
  --config "$work/envlens.yaml" --public-url "$url" >"$dir.out" 2>"$dir.err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; kill $gitlab_pid 2>/dev/null || true' EXIT
until curl -sf "$url/-/readiness" >/dev/null; do sleep 0.2; done

sent() { python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["sent"], json.dumps(d["statuses"]))'; }
ci_seed() {  # id-base
  "$load" ci-seed --url "$url" --gitlab "$gitlab" --audience "$url" --webhook-token-file "$dir/webhook-token" \
    --id-base "$1" --count "$count" --tokens "$work/tokens.$1" >/dev/null
}
# Warm-up, not counted: the key set fetched, the pool's connections opened, both statements' plans.
ci_seed 50000000
"$load" ci-run --url "$url" --tokens "$work/tokens.50000000" --id-base 50000000 --connections 4 --seconds 3 >/dev/null
"$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 4 --seconds 3 --id-base 60000000 >/dev/null

ci_seed 150000000
callgrind_control -i on "$pid" >/dev/null
read -r i istatus < <("$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 4 \
  --seconds "$seconds" --id-base 100000000 | sent)
callgrind_control -d internal "$pid" >/dev/null
callgrind_control -z "$pid" >/dev/null
read -r c cstatus < <("$load" ci-run --url "$url" --tokens "$work/tokens.150000000" --id-base 150000000 \
  --connections 4 --seconds "$seconds" | sent)
callgrind_control -d ci "$pid" >/dev/null
callgrind_control -i off "$pid" >/dev/null

ii=$(grep -h '^summary:' "$work/callgrind.1" | awk '{print $2}')
ci=$(grep -h '^summary:' "$work/callgrind.2" | awk '{print $2}')
printf 'internal (HS256)\t%s requests %s\t%d instructions each\n' "$i" "$istatus" $((ii / i))
printf 'ID token (RS256)\t%s requests %s\t%d instructions each\n' "$c" "$cstatus" $((ci / c))
echo "files: $work (callgrind_annotate --inclusive=yes $work/callgrind.2 | head -60)"
