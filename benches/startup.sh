#!/usr/bin/env bash
# Time from process start to a 200 on /-/readiness for `envlens serve` on its embedded
# PostgreSQL, first start (initdb included) and restart, and envlens' resident memory when
# idle. Baseline in the same run: the same PostgreSQL started alone with `pg_ctl -w`
# (after the same initdb), which is the floor for envlens' start-up.
#
#   cargo build --release && benches/startup.sh [runs]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release/envlens
runs=${1:-5}
port=18181
bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
now_ms() { date +%s%3N; }

wait_ready() {
  while ! curl -sf "http://127.0.0.1:$port/-/readiness" >/dev/null 2>&1; do sleep 0.005; done
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

first=() restart=() rss=() pg_first=() pg_restart=()
for _ in $(seq "$runs"); do
  dir=$(mktemp -d /tmp/envlens-startup.XXXXXX)
  chmod 755 "$dir"
  for phase in first restart; do
    t0=$(now_ms)
    ENVLENS_LOG=warn "$bin" serve --listen "127.0.0.1:$port" --data-dir "$dir/data" >/dev/null 2>&1 &
    pid=$!
    wait_ready
    t1=$(now_ms)
    if [ "$phase" = first ]; then first+=($((t1 - t0))); else
      restart+=($((t1 - t0)))
      sleep 5  # idle
      rss+=($(awk '/VmRSS/ {print $2}' "/proc/$pid/status"))
    fi
    kill -TERM "$pid"; wait "$pid"
  done

  # Baseline: PostgreSQL alone, initdb + start, then a restart.
  pgdir=$dir/pg; mkdir -p "$pgdir"; chown postgres "$pgdir" 2>/dev/null || true
  t0=$(now_ms)
  as_pg "$bindir/initdb" -D "$pgdir/data" -U envlens --auth=trust --no-locale -E UTF8 >/dev/null
  as_pg "$bindir/pg_ctl" -D "$pgdir/data" -o "-k $pgdir -c listen_addresses=" -w -l "$pgdir/log" start >/dev/null
  t1=$(now_ms); pg_first+=($((t1 - t0)))
  as_pg "$bindir/pg_ctl" -D "$pgdir/data" -m fast -w stop >/dev/null
  t0=$(now_ms)
  as_pg "$bindir/pg_ctl" -D "$pgdir/data" -o "-k $pgdir -c listen_addresses=" -w -l "$pgdir/log" start >/dev/null
  t1=$(now_ms); pg_restart+=($((t1 - t0)))
  as_pg "$bindir/pg_ctl" -D "$pgdir/data" -m fast -w stop >/dev/null
  rm -rf "$dir"
done

m() { printf '%s\n' "$@" | median; }
echo "runs: $runs"
echo "first start to readiness:   envlens $(m "${first[@]}") ms   postgres alone (initdb + pg_ctl -w) $(m "${pg_first[@]}") ms"
echo "restart to readiness:       envlens $(m "${restart[@]}") ms   postgres alone (pg_ctl -w) $(m "${pg_restart[@]}") ms"
echo "envlens resident memory idle: $(m "${rss[@]}") KiB (median), all: ${rss[*]}"
