#!/usr/bin/env bash
# Every test: install what is missing, then
#   1. the normal build with -Werror (CUDA backend included when the toolkit
#      is there; its tests skip with 77 without a GPU) and the whole suite;
#   2. the whole suite under ASan+UBSan;
#   3. every test under TSan (the concurrency stress with fewer iterations);
#   4. the libFuzzer targets, briefly, when clang is available;
#   5. a smoke run of the main job and the bench subcommands.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --test
jobs=$(nproc)
step() { printf '\n==== %s ====\n' "$*"; }

step "build (-Werror) and test"
cmake -S . -B build/ci -DKVT_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/ci -j"$jobs"
ctest --test-dir build/ci --output-on-failure -j"$jobs"

step "install, then build a consumer with find_package and with pkg-config"
rm -rf build/ci-install build/consumer
cmake --install build/ci --prefix "$PWD/build/ci-install" >/dev/null
cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$PWD/build/ci-install" >/dev/null
cmake --build build/consumer >/dev/null
LD_LIBRARY_PATH="$PWD/build/ci-install/lib" build/consumer/consumer
pc_dir=$(dirname "$(find build/ci-install -name kvtier.pc | head -1)")
cc tests/consumer/consumer.c -o build/consumer/consumer-pc $(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs kvtier)
LD_LIBRARY_PATH="$PWD/build/ci-install/lib" build/consumer/consumer-pc

step "static consumer: kvtier::kvtier_static and pkg-config --static"
rm -rf build/consumer-static build/ci-install-static
cmake -S tests/consumer -B build/consumer-static -DKVT_CONSUMER_STATIC=ON \
  -DCMAKE_PREFIX_PATH="$PWD/build/ci-install" >/dev/null
cmake --build build/consumer-static >/dev/null
build/consumer-static/consumer
# A prefix holding only the archive, so that -lkvtier cannot pick the .so.
cp -a build/ci-install build/ci-install-static
find build/ci-install-static -name 'libkvtier.so*' -delete
pc_static=$(dirname "$(find build/ci-install-static -name kvtier.pc | head -1)")
cc tests/consumer/consumer.c -o build/consumer-static/consumer-pc \
  $(PKG_CONFIG_PATH="$pc_static" pkg-config --static --cflags --libs kvtier)
build/consumer-static/consumer-pc
if ldd build/consumer-static/consumer-pc | grep -q libkvtier; then
  echo "static consumer links libkvtier.so" >&2
  exit 1
fi

step "ASan+UBSan: every test"
cmake -S . -B build/asan -DKVT_WERROR=ON -DKVT_ASAN=ON -DKVT_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build build/asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure -j"$jobs"

step "TSan: every test (stress at a quarter of its iterations)"
cmake -S . -B build/tsan -DKVT_WERROR=ON -DKVT_TSAN=ON -DKVT_CUDA=OFF -DKVT_BUILD_EXAMPLES=OFF \
  -DKVT_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build/tsan -j"$jobs"
KVT_STRESS_SCALE=0.25 TSAN_OPTIONS=halt_on_error=1 \
  ctest --test-dir build/tsan --output-on-failure -j"$jobs"

if [[ -f fuzz/CMakeLists.txt ]] && command -v clang >/dev/null 2>&1; then
  step "fuzzers (bounded)"
  bash fuzz/run.sh build/fuzz "${KVT_FUZZ_SECONDS:-15}"
fi

step "smoke: main job and bench"
build/ci/bench/kvtier-bench --help >/dev/null 2>&1 && {
  build/ci/bench/kvtier-bench replay --json >/dev/null
  build/ci/bench/kvtier-bench cost --model llama3-70b --tokens 10000 --json >/dev/null
}
build/ci/examples/serving_loop --quiet
echo
echo "kvtier: all tests passed"
