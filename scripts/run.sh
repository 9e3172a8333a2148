#!/usr/bin/env bash
# The main job: install what is missing, build (build/release), and run
# kvtier-bench replay on the built-in multi-round workload (no data needed
# beside the repo). Arguments go to kvtier-bench replay, e.g.
#   bash scripts/run.sh --trace data/mooncake_synthetic_trace.jsonl --gpus 8
# KVT_CUDA=0 builds without the CUDA backend.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
bash scripts/deps.sh
build=build/release
echo "kvtier: configuring and building $build (a minute or two; KVT_CUDA=${KVT_CUDA:-1})"
# shellcheck disable=SC2046
kvt_step $build/configure.log "configure (cmake)" \
  cmake -S . -B $build -DCMAKE_BUILD_TYPE=Release $(kvt_cuda_cmake_args)
grep "kvtier:" $build/configure.log | sed 's/^[- ]*/  /' || true
kvt_step $build/build.log "build" cmake --build $build -j"$(nproc)"
echo
exec $build/bench/kvtier-bench replay "$@"
