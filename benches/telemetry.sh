#!/usr/bin/env bash
# What a request's span and its JSON log line cost: the blueprint GraphQL query and the
# deployment creation, each at 32 connections, against the same binary with logs and spans
# off (ENVLENS_LOG=off), in alternating rounds of the same run (the order flips every round).
# "on" is ENVLENS_LOG=info --log-format json, one JSON line per request written to a file.
#
#   benches/telemetry.sh [seconds] [rounds]
source "$(dirname "$0")/common.sh"
seconds=${1:-10}
rounds=${2:-4}
work=$(mktemp -d /tmp/envlens-telemetry.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18686
url=http://127.0.0.1:$port
start_envlens "$dir" "$port"
"$load" seed --url "$url" --secret-file "$dir/internal-secret"
psql "postgresql:///envlens?host=$dir/run&user=envlens" -qtA -v ON_ERROR_STOP=1 <<'SQL'
-- The blueprint query's projects bench/p<k> (beside the seed's), environments env<j>, a
-- successful deployment each; user 5 `dev` is a developer of the group `bench` (id 1).
INSERT INTO projects (id, namespace_id, path, full_path, visibility)
  SELECT 5000 + p, 1, 'p' || p, 'bench/p' || p, 'private' FROM generate_series(0, 99) p;
INSERT INTO users (id, username) VALUES (5, 'dev') ON CONFLICT DO NOTHING;
INSERT INTO members (user_id, source_type, source_id, access_level) VALUES (5, 'group', 1, 30);
INSERT INTO environments (id, project_id, name, slug, tier)
  SELECT 900000 + p * 100 + e + 1, 5000 + p, 'env' || e, 'env' || e, 'production' FROM generate_series(0, 99) p, generate_series(0, 99) e;
INSERT INTO deployments (id, iid, project_id, environment_id, status, ref, sha, tag, job_id, created_at, updated_at, finished_at)
  SELECT 900000000 + g, g, 5000 + (g - 1) / 100, 900000 + g, 'success', 'main', md5(g::text), false, g, now(), now(), now()
  FROM generate_series(1, 10000) g;
INSERT INTO agent_deployments (deployment_id, agent_id, kubernetes_namespace)
  SELECT 900000000 + g, (SELECT min(id) FROM cluster_agents), 'apps' FROM generate_series(1, 10000) g;
VACUUM ANALYZE;
SQL
stop_envlens

serve_as() {  # off | on
  if [ "$1" = on ]; then
    ENVLENS_LOG=info start_envlens "$dir" "$port" --log-format json
  else
    ENVLENS_LOG=off start_envlens "$dir" "$port"
  fi
}
results=$work/results.tsv
id=500000000
for round in $(seq 1 "$rounds"); do
  order="off on"; [ $((round % 2)) = 0 ] && order="on off"
  for mode in $order; do
    serve_as "$mode"
    "$load" graphql --url "$url" --session-secret-file "$dir/session-secret" --user-id 5 --username dev \
      --variables yes --connections 32 --seconds 2 >/dev/null  # warm-up
    g=$("$load" graphql --url "$url" --session-secret-file "$dir/session-secret" --user-id 5 --username dev \
      --variables yes --connections 32 --seconds "$seconds" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests_per_second"])')
    id=$((id + 10000000))
    d=$("$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 32 --seconds "$seconds" \
      --id-base "$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests_per_second"])')
    lines=$(wc -l <"$dir.err")
    stop_envlens
    printf '%s\t%s\t%s\t%s\t%s\n' "$round" "$mode" "$g" "$d" "$lines" | tee -a "$results"
  done
done
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1])]
by = {}
for r, mode, g, d, _ in rows:
    by.setdefault(r, {})[mode] = (float(g), float(d))
gq = [v["on"][0] / v["off"][0] for v in by.values()]
dp = [v["on"][1] / v["off"][1] for v in by.values()]
print("round ratios on/off, GraphQL:", " ".join(f"{x:.3f}" for x in gq))
print("round ratios on/off, deployments:", " ".join(f"{x:.3f}" for x in dp))
print(f"median: GraphQL {statistics.median(gq):.3f}, deployments {statistics.median(dp):.3f} (goal >= 0.97)")
PY
