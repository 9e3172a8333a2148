#!/usr/bin/env bash
# bench/gpu-check.sh [OUT_DIR] - the GPU check of kvtier's CUDA backend, in one call:
#   1. configure + build with CUDA (Release, its own build dir),
#   2. run the CUDA tests and the coalescing tests (a skip counts as a failure here:
#      this script is only meant for a machine with a GPU),
#   3. run `kvtier-bench gpu --out OUT_DIR` (full numbers: gpu.csv, gpu.json),
#   4. print a short table last.
# OUT_DIR defaults to ./gpu-check-out. Exits non-zero on any failure.
# Environment: KVT_GPU_CHECK_BUILD (build dir; default <repo>/build-gpu-check),
#              KVT_GPU_CHECK_QUICK=1 (smaller bench sizes).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-./gpu-check-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${KVT_GPU_CHECK_BUILD:-$repo/build-gpu-check}
jobs=$(nproc 2>/dev/null || echo 4)
log() { printf '== %s\n' "$*" >&2; }
fail() { printf 'gpu-check: FAILED: %s\n' "$*" >&2; exit 1; }

# Debian dependencies: install what is missing when we may.
missing=()
for pkg in liburing-dev libxxhash-dev libcmocka-dev libcjson-dev pkg-config cmake; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    log "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
      || fail "apt-get install ${missing[*]}"
  else
    fail "missing packages: ${missing[*]} (run as root or install them)"
  fi
fi

[[ -d /usr/local/cuda/bin ]] && export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || fail "no nvcc: install the CUDA toolkit"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader >&2 || true
fi

log "configure ($build)"
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVT_CUDA=ON \
  -DKVT_BUILD_EXAMPLES=OFF >"$out/configure.log" 2>&1 || { cat "$out/configure.log" >&2; fail configure; }
grep -q "kvtier: CUDA backend ON" "$out/configure.log" || fail "CMake did not find the CUDA toolkit"

log "build"
cmake --build "$build" -j"$jobs" --target test_coalesce test_cuda_backend kvtier-bench \
  >"$out/build.log" 2>&1 || { tail -50 "$out/build.log" >&2; fail build; }
[[ -f "$build/libkvtier_cuda_kernels.a" ]] || fail "the copy kernels were not built"

log "tests"
set +e
(cd "$build" && ctest -R 'coalesce|cuda' --output-on-failure) >"$out/tests.log" 2>&1
trc=$?
set -e
cat "$out/tests.log" >&2
((trc == 0)) || fail "tests"
grep -q "Skipped" "$out/tests.log" && fail "test_cuda_backend skipped: no usable CUDA device"

log "bench"
bench_args=(gpu --out "$out")
[[ ${KVT_GPU_CHECK_QUICK:-0} == 1 ]] && bench_args+=(--quick)
timeout 600 "$build/bench/kvtier-bench" "${bench_args[@]}" >"$out/bench.txt" 2>"$out/bench.err" \
  || { cat "$out/bench.err" >&2; fail "kvtier-bench gpu"; }

echo
echo "gpu-check: tests passed ($(grep -Eo '[0-9]+ tests failed out of [0-9]+' "$out/tests.log" | sed 's/^0 tests failed out of/all/') tests); full numbers in $out"
cat "$out/bench.txt"
