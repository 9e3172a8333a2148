#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for a bounded time
# on a copy of its seed corpus (fuzz/corpus/<target>, never modified).
#   usage: bash fuzz/run.sh BUILD_DIR SECONDS_PER_TARGET
# Exits non-zero if a target crashes (the reproducer is left in BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/fuzz}
secs=${2:-15}
if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz: clang not found; skipped"
  exit 0
fi
cmake -S . -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVT_FUZZ=ON -DKVT_CUDA=OFF \
  -DKVT_BUILD_TESTS=OFF -DKVT_BUILD_BENCH=OFF -DKVT_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target fuzz_all
status=0
for t in record disk trace; do
  exe="$build/fuzz/fuzz_$t"
  if [[ ! -x "$exe" ]]; then
    echo "fuzz_$t: not built; skipped"
    continue
  fi
  work="$build/corpus/$t"
  mkdir -p "$work" "$build/artifacts"
  log="$build/fuzz_$t.log"
  set +e
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    "$exe" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/fuzz_$t-" "$work" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if [[ $rc -ne 0 ]]; then
    echo "fuzz_$t: FAILED (exit $rc) after ${execs:-?} runs; see $log"
    grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -5 || true
    status=1
  else
    echo "fuzz_$t: ok, ${execs:-?} runs in ${secs}s, ${cov:-cov ?}, corpus $(ls "$work" | wc -l) files"
  fi
done
exit $status
