#!/usr/bin/env bash
# Deployment creation through the job's CI/CD ID token (SPEC 12.2, `POST /api/v4/ci/deployments`,
# RS256 verified against GitLab's cached key set) against the internal path of SPEC 4.3
# (`POST /api/v4/internal/deployments`, HS256), 32 connections each, the same projects, agent and
# ci_access decisions, in alternating rounds of the same run (the order flips every round). Each
# round's jobs have had their Deployment Hook beforehand (GitLab sends `running` before the job's
# script runs), so each call records its agent as the internal call does.
#
#   benches/ci_deployments.sh [seconds] [rounds]
source "$(dirname "$0")/common.sh"
seconds=${1:-8}
rounds=${2:-4}
work=$(mktemp -d /tmp/envlens-ci.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18383; gitlab_port=18384
url=http://127.0.0.1:$port
gitlab=http://127.0.0.1:$gitlab_port
"$load" gitlab --listen "127.0.0.1:$gitlab_port" --key-der tests/fixtures/keys/gitlab-rsa.der >"$work/gitlab.out" &
gitlab_pid=$!
printf 'gitlab:\n  url: %s\n' "$gitlab" >"$work/envlens.yaml"
start_envlens "$dir" "$port" --config "$work/envlens.yaml" --public-url "$url"
trap 'stop_envlens; kill $gitlab_pid 2>/dev/null || true' EXIT
"$load" seed --url "$url" --secret-file "$dir/internal-secret"
count=$((2500 * seconds))
ci_round() {  # id-base
  "$load" ci-seed --url "$url" --gitlab "$gitlab" --audience "$url" --webhook-token-file "$dir/webhook-token" \
    --id-base "$1" --count "$count" --tokens "$work/tokens" >/dev/null
  "$load" ci-run --url "$url" --tokens "$work/tokens" --id-base "$1" --connections 32 --seconds "$seconds"
}
internal_round() {  # id-base
  "$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 32 --seconds "$seconds" --id-base "$1"
}
# Warm-up of both paths (the key set fetched once).
ci_round 50000000 >/dev/null; internal_round 60000000 >/dev/null
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then
    i=$(internal_round $((100000000 * r))); c=$(ci_round $((100000000 * r + 50000000)))
  else
    c=$(ci_round $((100000000 * r + 50000000))); i=$(internal_round $((100000000 * r)))
  fi
  echo "round $r internal $i" | tee -a "$work/rounds"
  echo "round $r ci $c" | tee -a "$work/rounds"
done
python3 - "$work/rounds" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    _, r, kind, doc = line.split(" ", 3)
    rows.setdefault(int(r), {})[kind] = json.loads(doc)
ratios = []
for r, k in sorted(rows.items()):
    i, c = k["internal"], k["ci"]
    ratio = c["requests_per_second"] / i["requests_per_second"]
    ratios.append(ratio)
    print(f"round {r}: internal {i['requests_per_second']:.0f}/s {i['statuses']}, ID token {c['requests_per_second']:.0f}/s {c['statuses']}, ratio {ratio:.3f}")
print(f"median ratio {statistics.median(ratios):.3f} (goal >= 0.90)")
PY
