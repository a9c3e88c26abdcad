# Shared by the benchmark scripts: build, find the load tool, start and stop envlens.
# envlens and the load tool are built in one invocation, so that the library is compiled once:
# built apart, the library of a bench target (whose dev-dependencies turn on more features of
# shared crates) and that of the binary differ, and each change cost two builds of it.
set -euo pipefail
cd "$(dirname "$0")/.."
# ENVLENS_BIN and LOAD_BIN, both set, run binaries built before (another commit's, kept aside)
# instead of building.
if [ -n "${ENVLENS_BIN:-}" ] && [ -n "${LOAD_BIN:-}" ]; then
  envlens_bin=$ENVLENS_BIN load=$LOAD_BIN
else
  envlens_bin=target/release/envlens
  load=$(cargo build --release --bin envlens --bench load --message-format=json 2>/dev/null |
    python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == "load"][-1])')
fi
bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# start_envlens DIR PORT [serve flags...]: serves in the background, waits for readiness.
start_envlens() {
  local dir=$1 port=$2; shift 2
  ENVLENS_LOG=${ENVLENS_LOG:-warn} "$envlens_bin" serve --listen "127.0.0.1:$port" --data-dir "$dir" "$@" >"$dir.out" 2>"$dir.err" &
  envlens_pid=$!
  trap stop_envlens EXIT
  until curl -sf "http://127.0.0.1:$port/-/readiness" >/dev/null; do
    kill -0 "$envlens_pid" 2>/dev/null || { echo "envlens exited:"; tail -5 "$dir.err"; exit 1; }
    sleep 0.05
  done
}

stop_envlens() {
  [ -n "${envlens_pid:-}" ] || return 0
  kill -TERM "$envlens_pid" 2>/dev/null || true
  wait "$envlens_pid" 2>/dev/null || true
  envlens_pid=
}

# CPU ticks (user + system) of PostgreSQL whose postmaster's pid is $postmaster: the
# postmaster, its exited children (reaped into its own counters) and the live ones.
cpu_postgres() {
  local total
  total=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$postmaster/stat")
  for child in $(pgrep -P "$postmaster"); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$child/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}

# callgrind_report LABEL OUT DIR: instructions per request of a callgrind run of `serve` whose
# dumps are in DIR, OUT the load tool's JSON (its `sent` and `statuses`): the whole process,
# then the connections' own tasks (hyper, the router, the middleware, the handler), apart from
# what runs beside the load in the same process (the health keeper's rounds, the sweeps), which
# callgrind's slowed requests make look larger than it is.
callgrind_report() {
  local label=$1 out=$2 dir=$3 sent statuses total own
  sent=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["sent"])' "$out")
  statuses=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["statuses"])' "$out")
  total=$(grep -h '^summary:' "$dir"/callgrind.out.* | awk '{s += $2} END {print s}')
  printf '%s %s requests (%s), %d instructions each\n' "$label" "$sent" "$statuses" $((total / sent))
  own=$(callgrind_annotate --inclusive=yes "$dir"/callgrind.out.* 2>/dev/null |
    awk '/envlens::http::server::Connection::run::\{\{closure\}\} \[/ && !n++ {gsub(",", "", $1); print $1}')
  printf '  of which the connections'"'"' own tasks: %d instructions each\n' $((own / sent))
  echo "files: $dir"
}
