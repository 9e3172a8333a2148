#!/usr/bin/env bash
# bench/gpu-check.sh [OUT_DIR] - the GPU check of kvtier's CUDA backend, in one call:
#   1. configure + build with CUDA (Release, its own build dir),
#   2. run the CUDA tests (the backend alone, and the whole cache on the GPU:
#      owner mode and storage mode) and the coalescing tests (a skip counts as a failure here:
#      this script is only meant for a machine with a GPU),
#   3. run `kvtier-bench gpu --out OUT_DIR` (full numbers: gpu.csv, gpu.json),
#   4. print a short table last.
# OUT_DIR defaults to ./gpu-check-out. Exits non-zero on any failure.
# bench/gpu-check.sh --fetch-deps: on a machine with apt access, download the build
# dependencies as .debs into <repo>/.gpu-deps, to copy to a GPU machine without network.
# Environment: KVT_GPU_CHECK_BUILD (build dir; default <repo>/build-gpu-check),
#              KVT_GPU_CHECK_DEBS (carried .debs; default <repo>/.gpu-deps),
#              KVT_GPU_CHECK_QUICK=1 (smaller bench sizes).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ ${1:-} == --fetch-deps ]]; then
  # On a machine with apt access: download the build dependencies as .debs
  # into .gpu-deps/ (ignored by git; copy it along with the checkout).
  # Debian/Ubuntu amd64 packages, ~1 MiB in all.
  d=${KVT_GPU_CHECK_DEBS:-$repo/.gpu-deps}
  mkdir -p "$d"
  (cd "$d" && apt-get download liburing-dev liburing2 libxxhash-dev libxxhash0 libcmocka-dev libcmocka0 \
    libcjson-dev libcjson1 pkgconf pkgconf-bin libpkgconf3) || { echo "apt-get download failed" >&2; exit 1; }
  grep -qx '/.gpu-deps/' "$repo/.git/info/exclude" 2>/dev/null || echo '/.gpu-deps/' >>"$repo/.git/info/exclude"
  ls -l "$d"
  exit 0
fi
out=${1:-./gpu-check-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=${KVT_GPU_CHECK_BUILD:-$repo/build-gpu-check}
debs=${KVT_GPU_CHECK_DEBS:-$repo/.gpu-deps}
jobs=$(nproc 2>/dev/null || echo 4)
t_start=$SECONDS
log() { printf '== %s\n' "$*" >&2; }
fail() { printf 'gpu-check: FAILED: %s\n' "$*" >&2; exit 1; }

# Dependencies. The GPU machine may have no network and none of these
# packages: then they come as .deb files copied in $debs (made with apt access
# by `bench/gpu-check.sh --fetch-deps`), unpacked into the build dir,
# never into /. A system that has them all uses its own.
need_pc=(liburing libxxhash cmocka libcjson)
pc_exe=$(command -v pkg-config || true)
if [[ -n $pc_exe ]] && "$pc_exe" --exists "${need_pc[@]}" 2>/dev/null; then
  log "dependencies: system (pkg-config finds ${need_pc[*]})"
elif compgen -G "$debs/*.deb" >/dev/null; then
  root=$build/deps-root
  rm -rf "$root" && mkdir -p "$root"
  for f in "$debs"/*.deb; do dpkg -x "$f" "$root" || fail "dpkg -x $f"; done
  # The .pc files name /usr: point them at the unpacked tree.
  for f in "$root"/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc "$root"/usr/share/pkgconfig/*.pc; do
    [[ -f $f ]] && sed -i -e "s|=/usr|=$root/usr|g" -e "s|-I/usr|-I$root/usr|g" -e "s|-L/usr|-L$root/usr|g" "$f"
  done
  export PKG_CONFIG_PATH=$root/usr/lib/x86_64-linux-gnu/pkgconfig:$root/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  [[ -n $pc_exe ]] || pc_exe=$root/usr/bin/pkgconf
  "$pc_exe" --exists "${need_pc[@]}" || fail "the carried packages in $debs lack one of ${need_pc[*]}"
  log "dependencies: carried .debs from $debs (pkg-config: $pc_exe)"
elif [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  log "installing the build dependencies with apt-get"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    liburing-dev libxxhash-dev libcmocka-dev libcjson-dev pkgconf \
    || fail "apt-get install (no network? run bench/gpu-check.sh --fetch-deps on a machine with apt access and copy $debs here)"
  pc_exe=$(command -v pkg-config)
else
  fail "missing ${need_pc[*]} and no .debs in $debs (run bench/gpu-check.sh --fetch-deps on a machine with apt access)"
fi
command -v cmake >/dev/null || fail "no cmake"

[[ -d /usr/local/cuda/bin ]] && export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || fail "no nvcc: install the CUDA toolkit"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader >&2 || true
fi

log "configure ($build)"
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVT_CUDA=ON \
  -DKVT_BUILD_EXAMPLES=OFF -DPKG_CONFIG_EXECUTABLE="$pc_exe" >"$out/configure.log" 2>&1 || { cat "$out/configure.log" >&2; fail configure; }
grep -q "kvtier: CUDA backend ON" "$out/configure.log" || fail "CMake did not find the CUDA toolkit"

log "build"
cmake --build "$build" -j"$jobs" --target test_coalesce test_cuda_backend test_cuda_engine kvtier-bench \
  >"$out/build.log" 2>&1 || { tail -50 "$out/build.log" >&2; fail build; }
[[ -f "$build/libkvtier_cuda_kernels.a" ]] || fail "the copy kernels were not built"

log "tests"
set +e
# A hung copy (done() never called) must not eat the GPU session: 120 s a test.
# -V: every subtest's line is kept, so a skipped one (batch or kernel path
# refused by this driver, host pool not pinned) shows in tests.log.
(cd "$build" && ctest -R 'coalesce|cuda' --timeout 120 -V) >"$out/tests.log" 2>&1
trc=$?
set -e
cat "$out/tests.log" >&2
((trc == 0)) || fail "tests"
grep -q "\*\*\*Skipped" "$out/tests.log" && fail "a CUDA test skipped: no usable CUDA device"
sub_skips=$(grep -oE '\[  SKIPPED \] [A-Za-z_][A-Za-z0-9_]*' "$out/tests.log" | sed 's/.*\] //' | sort -u | tr '\n' ' ' || true)

log "bench"
bench_args=(gpu --out "$out")
[[ ${KVT_GPU_CHECK_QUICK:-0} == 1 ]] && bench_args+=(--quick)
timeout 240 "$build/bench/kvtier-bench" "${bench_args[@]}" >"$out/bench.txt" 2>"$out/bench.err" \
  || { cat "$out/bench.err" >&2; fail "kvtier-bench gpu"; }

echo
# CTest says "100% tests passed, 0 tests failed out of 3" or, newer, "100% tests passed out of 3".
n_tests=$(grep -Eo 'tests passed(, 0 tests failed)? out of [0-9]+' "$out/tests.log" | grep -Eo '[0-9]+$' || echo '?')
echo "gpu-check: $((SECONDS - t_start)) s; all $n_tests tests passed; full numbers in $out"
cat "$out/bench.txt"
[[ -n $sub_skips ]] && echo "gpu-check: WARNING: subtests skipped on this GPU (see tests.log): $sub_skips"
exit 0
