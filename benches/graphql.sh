#!/usr/bin/env bash
# The blueprint's GraphQL query against `serve` on its embedded PostgreSQL, over 10,000
# environments (100 projects x 100) with 10 thousand, 1 million, then 10 million deployments
# (70% successful, with their agent_deployments row). At each size: p50 of the query (32
# connections, 15 s) and the EXPLAIN of the last-deployment lookup. At 10 million, rounds (2 by default)
# of pgbench running the same statements (benches/graphql.pgbench, 32 clients) then envlens
# (32 connections), and the ratio of each round. The query goes as GitLab's frontend sends its
# queries: one text, with the project and environment as variables.
#
#   benches/graphql.sh [seconds] [rounds]
#
# GRAPHQL_DATA=<the folder a run printed at its end> runs only the rounds, on the 10 million
# deployments that run generated (about 10 minutes to generate again).
source "$(dirname "$0")/common.sh"
seconds=${1:-15}
rounds=${2:-2}
reuse=${GRAPHQL_DATA:-}
work=${reuse:-$(mktemp -d /tmp/envlens-graphql.XXXXXX)}; chmod 755 "$work"; dir=$work/data
port=18484
url=http://127.0.0.1:$port
start_envlens "$dir" "$port"
sql() { psql "postgresql:///envlens?host=$dir/run&user=envlens" -qtA -v ON_ERROR_STOP=1 "$@"; }

[ -n "$reuse" ] || sql <<'SQL'
INSERT INTO namespaces (id, path, full_path, traversal_ids) VALUES (1, 'bench', 'bench', '{1}');
INSERT INTO projects (id, namespace_id, path, full_path, visibility)
  SELECT 1000 + p, 1, 'p' || p, 'bench/p' || p, 'private' FROM generate_series(0, 99) p;
INSERT INTO projects (id, namespace_id, path, full_path, visibility) VALUES (999, 1, 'agents', 'bench/agents', 'private');
INSERT INTO users (id, username) VALUES (5, 'dev');
INSERT INTO members (user_id, source_type, source_id, access_level) VALUES (5, 'group', 1, 30);
INSERT INTO cluster_agents (id, project_id, name) VALUES (1, 999, 'prod');
INSERT INTO environments (id, project_id, name, slug, tier)
  SELECT p * 100 + e + 1, 1000 + p, 'env' || e, 'env' || e, 'production' FROM generate_series(0, 99) p, generate_series(0, 99) e;
SQL

# Deployments from+1..to: deployment g goes to environment ((g-1) % 10000) + 1, in round
# (g-1) / 10000; rounds 0-6 of every ten succeed, so every environment has a mix.
add_deployments() {
  sql -v from="$1" -v to="$2" <<'SQL'
INSERT INTO deployments (id, iid, project_id, environment_id, status, ref, sha, tag, job_id, created_at, updated_at, finished_at)
  SELECT g, g, 1000 + ((g - 1) % 10000) / 100, ((g - 1) % 10000) + 1,
         CASE WHEN (g - 1) / 10000 % 10 < 7 THEN 'success' WHEN (g - 1) / 10000 % 10 < 9 THEN 'failed' ELSE 'running' END,
         'main', md5(g::text), false, g, now(), now(), CASE WHEN (g - 1) / 10000 % 10 < 9 THEN now() END
  FROM generate_series(:from + 1, :to) g;
INSERT INTO agent_deployments (deployment_id, agent_id, kubernetes_namespace)
  SELECT g, 1, 'ns' || (g % 100) FROM generate_series(:from + 1, :to) g WHERE (g - 1) / 10000 % 10 < 7;
VACUUM ANALYZE deployments;
VACUUM ANALYZE agent_deployments;
CHECKPOINT;
SQL
}

measure() {
  echo "== $1 deployments: the blueprint query, one connection, ${seconds}s (latency)"
  "$load" graphql --url "$url" --session-secret-file "$dir/session-secret" --user-id 5 --username dev --variables yes \
    --connections 1 --seconds "$seconds" | tee "$work/graphql-1-$1.json"
  echo "== $1 deployments: the blueprint query, 32 connections, ${seconds}s (throughput)"
  "$load" graphql --url "$url" --session-secret-file "$dir/session-secret" --user-id 5 --username dev --variables yes \
    --connections 32 --seconds "$seconds" | tee "$work/graphql-$1.json"
  echo "-- EXPLAIN of the last successful deployment of one environment, with its agent"
  sql -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT d.id, ad.agent_id, a.name, p.full_path
    FROM (SELECT * FROM deployments x WHERE x.environment_id = 4242 AND x.status = 'success' ORDER BY x.id DESC LIMIT 1) d
    LEFT JOIN agent_deployments ad ON ad.deployment_id = d.id LEFT JOIN cluster_agents a ON a.id = ad.agent_id
    LEFT JOIN projects p ON p.id = a.project_id LEFT JOIN namespaces n ON n.id = p.namespace_id"
}

from=0
sizes="10000 1000000 10000000"
[ -z "$reuse" ] || sizes=""
for total in $sizes; do
  t0=$(date +%s)
  add_deployments "$from" "$total"
  echo "(generated $((total - from)) deployments in $(( $(date +%s) - t0 ))s)"
  from=$total
  measure "$total"
done

# At 10 million, pgbench and envlens take turns, twice, so that neither has the quieter moment.
for round in $(seq "$rounds"); do
  echo "== round $round at 10000000 deployments: pgbench, the same statements, 32 clients, ${seconds}s"
  pgbench -h "$dir/run" -U envlens -n -M prepared -c 32 -j 2 -T "$seconds" -f benches/graphql.pgbench envlens \
    | tee "$work/pgbench-$round.txt" | grep -E "^(tps|latency|number of failed)"
  echo "== round $round at 10000000 deployments: envlens, 32 connections, ${seconds}s"
  "$load" graphql --url "$url" --session-secret-file "$dir/session-secret" --user-id 5 --username dev --variables yes \
    --connections 32 --seconds "$seconds" | tee "$work/graphql-round-$round.json"
done
python3 - "$work" "$rounds" <<'PY'
import json, os, statistics, sys
w, rounds = sys.argv[1], int(sys.argv[2])
for n in ("10000", "1000000", "10000000"):
    if os.environ.get("GRAPHQL_DATA"):  # the rounds only
        break
    one = json.load(open(f"{w}/graphql-1-{n}.json"))
    r = json.load(open(f"{w}/graphql-{n}.json"))
    print(f"{int(n):>10,} deployments: one connection p50 {one['latency_ms']['p50']:.2f} ms p99 {one['latency_ms']['p99']:.2f} ms; "
          f"32 connections {r['requests_per_second']:.0f} queries/s p50 {r['latency_ms']['p50']:.2f} ms; statuses {r['statuses']}")
ratios = []
for i in range(1, rounds + 1):
    tps = float([l.split()[2] for l in open(f"{w}/pgbench-{i}.txt") if l.startswith("tps")][0])
    r = json.load(open(f"{w}/graphql-round-{i}.json"))
    ratios.append(r['requests_per_second'] / tps)
    print(f"round {i}: envlens {r['requests_per_second']:.0f} queries/s (p50 {r['latency_ms']['p50']:.2f} ms, statuses {r['statuses']}) "
          f"vs pgbench {tps:.0f} tps (same statements): {100 * ratios[-1]:.0f}%")
print(f"median ratio {100 * statistics.median(ratios):.0f}%")
PY
echo "(data in $work; remove it when done: rm -rf $work)"
