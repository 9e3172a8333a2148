#!/usr/bin/env bash
# Every test: install what is missing, then
#   1. the normal build with -Werror (CUDA backend included when the toolkit
#      is there; its tests skip with 77 without a GPU) and the whole suite;
#   2. the whole suite under ASan+UBSan;
#   3. every test under TSan (the concurrency stress with fewer iterations);
#   4. the libFuzzer targets, briefly, when clang is available;
#   5. a smoke run of the main job and the bench subcommands;
#   6. the Python package: pip install in a fresh venv, then its pytest suite
#      with torch and the engines (scripts/py-deps.sh, cached) importable, and
#      the binding's tests on the ASan+UBSan library (no leak check: the
#      interpreter does not free everything at exit).
# Steps 1 and 2 include llama.cpp on kvtier (examples/llama_cpp and its
# tests): scripts/llama-deps.sh fetches and builds llama.cpp once per machine
# (cached); when it cannot, those tests skip and say why.
# KVT_CUDA=0 builds without the CUDA backend; KVT_FUZZ_SECONDS (15) bounds
# each fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
bash scripts/deps.sh --test
jobs=$(nproc)
current="install packages"
step() {
  current=$*
  printf '\n==== %s ====\n' "$*"
}
trap 'echo "kvtier: the test command failed in step \"$current\" (its output is above)" >&2' ERR

step "llama.cpp for examples/llama_cpp (scripts/llama-deps.sh, cached)"
if ! llama_dir=$(bash scripts/llama-deps.sh); then
  echo "kvtier: llama.cpp could not be fetched or built (above): the llama.cpp tests will skip"
  llama_dir=""
fi

step "build (-Werror) and test"
# shellcheck disable=SC2046
kvt_step build/ci/configure.log "configure (cmake)" \
  cmake -S . -B build/ci -DKVT_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo $(kvt_cuda_cmake_args) \
  -DKVT_LLAMA_DIR="$llama_dir"
grep "kvtier:" build/ci/configure.log | sed 's/^[- ]*/  /' || true
cmake --build build/ci -j"$jobs"
ctest --test-dir build/ci --output-on-failure -j"$jobs"
kvt_skips build/ci

step "install, then build a consumer with find_package and with pkg-config"
rm -rf build/ci-install build/consumer
kvt_step build/ci-install.log "cmake --install" cmake --install build/ci --prefix "$PWD/build/ci-install"
kvt_step build/consumer.log "configure the find_package consumer" \
  cmake -S tests/consumer -B build/consumer -DCMAKE_PREFIX_PATH="$PWD/build/ci-install"
kvt_step build/consumer.log "build the find_package consumer" cmake --build build/consumer
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
kvt_step build/asan/configure.log "configure (cmake, ASan)" \
  cmake -S . -B build/asan -DKVT_WERROR=ON -DKVT_ASAN=ON -DKVT_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DKVT_LLAMA_DIR="$llama_dir"
cmake --build build/asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure -j"$jobs"
kvt_skips build/asan

step "TSan: every test (stress at a quarter of its iterations)"
kvt_step build/tsan/configure.log "configure (cmake, TSan)" \
  cmake -S . -B build/tsan -DKVT_WERROR=ON -DKVT_TSAN=ON -DKVT_CUDA=OFF -DKVT_BUILD_EXAMPLES=OFF \
  -DKVT_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build/tsan -j"$jobs"
KVT_STRESS_SCALE=0.25 TSAN_OPTIONS=halt_on_error=1 \
  ctest --test-dir build/tsan --output-on-failure -j"$jobs"
kvt_skips build/tsan

if [[ -f fuzz/CMakeLists.txt ]] && command -v clang >/dev/null 2>&1; then
  step "fuzzers (bounded)"
  bash fuzz/run.sh build/fuzz "${KVT_FUZZ_SECONDS:-15}"
fi

step "smoke: main job and bench"
bench=build/ci/bench/kvtier-bench
$bench --help >/dev/null
$bench replay >/dev/null
$bench replay --json --gpus 8 --link-gbs 50 --disk-gbs 13 >/dev/null
$bench replay --trace data/mooncake_synthetic_trace.jsonl --json >/dev/null
$bench sweep --workload multiround --json >/dev/null
$bench cost --model llama3-70b --tokens 10000 --json >/dev/null
$bench micro --help >/dev/null
$bench gpu --help >/dev/null
if $bench micro --seconds 0 >/dev/null 2>&1; then echo "kvtier: micro accepted --seconds 0" >&2; exit 1; fi
build/ci/examples/serving_loop --quiet
build/ci/examples/quickstart build/ci >/dev/null

step "python: pip install in a fresh venv, pytest"
deps_env=$(bash scripts/py-deps.sh --print-env) # the engines' venv, CUDA libraries for torch
engines=$(tail -n 1 <<<"$deps_env")
eval "$(head -n -1 <<<"$deps_env")"
rm -rf build/py
python3 -m venv build/py/venv
py_cmake=()
kvt_cuda_wanted || py_cmake=(-C cmake.define.KVT_CUDA=OFF)
kvt_step build/py/install.log "pip install ./python" build/py/venv/bin/pip install "${py_cmake[@]}" ./python pytest
(cd build/py && venv/bin/python -c "import kvtier; print('kvtier', kvtier.version(), 'from', kvtier.LIBRARY_PATH)")
# torch and the engines come from the cached venv, after the fresh venv's own packages.
py_site=$(build/py/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$engines/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$py_site/kvtier-engines.pth"
KVT_REQUIRE_ENGINES=1 build/py/venv/bin/pytest -q -p no:cacheprovider python/tests
echo "the binding's tests again, on the ASan+UBSan build of the library:"
LD_PRELOAD="$(cc -print-file-name=libasan.so) $(cc -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  KVTIER_LIBRARY="$PWD/build/asan/libkvtier.so.0" \
  build/py/venv/bin/pytest -q -p no:cacheprovider python/tests/test_binding.py python/tests/test_storage.py

echo
echo "kvtier: all tests passed"
