#!/usr/bin/env bash
# The work of the resource group pipeline (benches/resources.rs) per object, at 1,000, 10,000 and
# 100,000 objects, counted by cachegrind rather than timed: instructions, and the simulated
# last-level cache misses. For each size, two runs that differ only in the number of pipeline
# runs (1 and 3) are subtracted, so that generating the objects cancels out; the difference is
# two pipelines. cachegrind runs every thread, so the work of both threads is counted. The last
# level simulated is the 32 MB, 16-way L3 that lscpu reports here (cachegrind would otherwise
# take the virtual machine's CPUID, 384 MB); set LL=size,assoc,line to change it.
#
#   benches/resources_work.sh [sizes...]     (about 5 minutes for the three sizes, one core)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)"; exit 1; }
bench=$(cargo bench --bench resources --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == "resources"][-1])')
work=$(mktemp -d /tmp/envlens-work.XXXXXX)
trap 'rm -rf "$work"' EXIT
# cachegrind's totals: instructions (I refs) and last-level misses (LL misses), as numbers.
count() {
  PIPELINE_RUNS="$1,$2" valgrind --tool=cachegrind --cache-sim=yes --LL="${LL:-33554432,16,64}" \
    --cachegrind-out-file=/dev/null \
    "$bench" 2>"$work/$1-$2.txt" >/dev/null
  python3 - "$work/$1-$2.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
def total(label):
    return int(re.search(label + r":\s+([\d,]+)", text).group(1).replace(",", ""))
print(total("I +refs"), total("LL misses"))
PY
}
printf '%8s %14s %14s\n' objects instr/object LL-miss/object
sizes=("$@"); [ ${#sizes[@]} -gt 0 ] || sizes=(1000 10000 100000)
for n in "${sizes[@]}"; do
  read -r i1 m1 < <(count "$n" 1)
  read -r i3 m3 < <(count "$n" 3)
  python3 -c "n=$n; print(f'{n:8d} {($i3-$i1)/2/n:14.0f} {($m3-$m1)/2/n:14.2f}')"
done
