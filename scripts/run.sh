#!/usr/bin/env bash
# The main job: install what is missing, build, and run kvtier-bench replay
# on the built-in multi-round workload (no data needed beside the repo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j"$(nproc)" >/dev/null
if [[ -x build/release/bench/kvtier-bench ]] && build/release/bench/kvtier-bench --help 2>/dev/null | grep -q replay; then
  exec build/release/bench/kvtier-bench replay "$@"
fi
exec build/release/examples/serving_loop "$@"
