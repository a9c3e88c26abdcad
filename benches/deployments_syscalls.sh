#!/usr/bin/env bash
# System calls per deployment creation: envlens under `strace -c -f` while the load tool sends
# fresh creations (4 connections), each counted call divided by the creations answered.
#
#   benches/deployments_syscalls.sh [seconds]
#   ENVLENS_BIN=/tmp/a/envlens LOAD_BIN=/tmp/a/load benches/deployments_syscalls.sh 6   (a kept build)
source "$(dirname "$0")/common.sh"
seconds=${1:-6}
work=$(mktemp -d /tmp/envlens-strace.XXXXXX); chmod 755 "$work"; dir=$work/data
port=18395
url=http://127.0.0.1:$port
start_envlens "$dir" "$port"
"$load" seed --url "$url" --secret-file "$dir/internal-secret" >/dev/null
"$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 4 --seconds 2 --id-base 100000000 >/dev/null
strace -c -f -p "$envlens_pid" -o "$work/strace" &
spid=$!
sleep 1
out=$("$load" run --url "$url" --secret-file "$dir/internal-secret" --connections 4 --seconds "$seconds" --id-base 200000000)
sleep 0.5
kill -INT $spid; wait $spid || true
sent=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["sent"])' "$out")
echo "requests $sent $out"
awk -v n="$sent" '/^ *[0-9]/ && NF>=5 {name=$NF; calls=$4; if ($5 ~ /^[0-9]+$/) errs=$5; else errs=0; printf "%-16s %6.2f calls/req %6.2f errors/req\n", name, calls/n, errs/n}' "$work/strace" | sort -k2 -rn | head -14
