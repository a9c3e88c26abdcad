#!/usr/bin/env bash
# Coverage-guided fuzzing of envlens' parsers of outside input (docs/fuzzing.md).
#
#   fuzz/run.sh [MINUTES] [TARGET...]
#
# Runs each target (all of them by default) for MINUTES minutes (default 3), one after the
# other, starting from the checked-in seeds (fuzz/corpus/<target>/) and what earlier runs on
# this machine found (fuzz/runs/<target>/, not checked in). Prints, per target, libFuzzer's
# final figures (runs, coverage, features, corpus) and every input that crashed, panicked,
# timed out or ran out of memory (fuzz/artifacts/<target>/). Exits 1 when anything was found.
#
# cargo-fuzz (libFuzzer) on the stable toolchain: RUSTC_BOOTSTRAP=1 lets stable rustc take the
# one `-Z` flag cargo-fuzz passes, and `--sanitizer none` keeps AddressSanitizer (which needs
# nightly's std) out; safe Rust needs no ASan to find panics, hangs and unbounded memory.
# cargo-fuzz is installed with cargo when missing (into cargo's bin, so the next run reuses it).
set -euo pipefail

minutes="${1:-3}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz $CARGO_FUZZ_VERSION" >&2
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

export RUSTC_BOOTSTRAP=1
# -s none: no sanitizer (see above); -a: debug assertions and overflow checks on.
flags=(--sanitizer none --debug-assertions)

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo fuzz list)
fi

# Every target at once: they share the build of envlens and its dependencies.
cargo fuzz build "${flags[@]}"

seconds=$((minutes * 60))
found=0
summary=()
for target in "${targets[@]}"; do
    mkdir -p "runs/$target" "artifacts/$target"
    log="runs/$target.log"
    before=$(find "artifacts/$target" -type f | wc -l)
    echo "== $target: ${minutes} min" >&2
    # New inputs go to runs/<target>/ (the first folder); the seeds are read, never changed.
    # -timeout: one input over 10 s is a hang; -rss_limit_mb: over 2 GiB is unbounded memory.
    set +e
    cargo fuzz run "${flags[@]}" "$target" "runs/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
        -print_final_stats=1 -close_fd_mask=3 >"$log" 2>&1
    status=$?
    set -e
    after=$(find "artifacts/$target" -type f | wc -l)
    stats=$(grep -E '^#[0-9]+' "$log" | tail -n 1 || true)
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' || true)
    summary+=("$target: exit $status, ${runs:-?} runs; last: ${stats:-none}")
    if [ "$status" -ne 0 ] || [ "$after" -gt "$before" ]; then
        found=1
        grep -E 'panicked at|ERROR: libFuzzer|SUMMARY|Test unit written' "$log" | head -n 10 | sed "s/^/  $target: /"
    fi
done

echo
echo "== summary (${minutes} min a target)"
printf '%s\n' "${summary[@]}"
if [ "$found" -ne 0 ]; then
    echo "== found: see fuzz/artifacts/ and fuzz/runs/<target>.log;" \
        "reproduce with: RUSTC_BOOTSTRAP=1 cargo fuzz run -s none -a <target> <artifact>"
    exit 1
fi
echo "== nothing found"
