#!/usr/bin/env bash
# Installs the engines the Python adapters plug into, at pinned versions, into
# a venv cached between runs on one machine, and prints the venv's path last.
#   scripts/py-deps.sh [--print-env]
# The cache lives in ${KVT_PY_CACHE:-~/.cache/kvtier-py}/<hash of the pins>;
# a finished venv holds a .complete file and is reused as is. Delete the
# directory to reinstall. Each step's time goes to <venv>/install-times.txt.
#
# Why not `pip install vllm`: some of vLLM's and SGLang's dependencies are
# downloaded from outside the package registry at build time, so the engines
# are installed with --no-deps, then the few packages the imported modules
# need (with their own dependencies). Those are not pinned: <venv>/freeze.txt
# records what an install got.
set -euo pipefail

TORCH=2.14.0
VLLM=0.34.0
SGLANG=0.5.23
LMCACHE=0.5.6
# Pure-Python dependencies of torch, and the CUDA 13 libraries the toolkit
# does not ship (the rest come from the toolkit's lib64 on LD_LIBRARY_PATH).
TORCH_DEPS="filelock typing-extensions sympy networkx jinja2 fsspec setuptools>=77.0.3 numpy"
TORCH_CUDA_LIBS="nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.4.5 nvidia-cufile"
# Without a CUDA toolkit on this machine, the CUDA libraries torch loads at
# import come from the package registry instead, as torch's own dependencies
# name them (no GPU is needed to import torch; about 3 GB more to download).
TORCH_CUDA_TOOLKIT_LIBS="cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3 nvidia-cudnn-cu13==9.24.0.43"
VLLM_DEPS="packaging msgspec"
# What `import sglang.srt.mem_cache.hicache_storage` needs (found by importing
# it until nothing was missing); torch 2.14.0 wants triton 3.8.
SGLANG_DEPS="orjson psutil pybase64 requests triton~=3.8.0 pillow starlette pydantic pyzmq tqdm ipython aiohttp"
# What `import lmcache.v1.storage_backend.connector.base_connector` needs.
LMCACHE_DEPS="numba pyyaml cachetools sortedcontainers prometheus_client py-cpuinfo aiofile transformers cryptography"
TEST_DEPS="pytest cffi"

cuda_lib=""
for d in "${CUDA_HOME:-}" /usr/local/cuda; do
  if [[ -n "$d" && -d "$d/lib64" ]]; then cuda_lib=$d/lib64; break; fi
done
torch_libs=$TORCH_CUDA_LIBS
[[ -n $cuda_lib ]] || torch_libs="$TORCH_CUDA_LIBS $TORCH_CUDA_TOOLKIT_LIBS"

pins="torch=$TORCH vllm=$VLLM sglang=$SGLANG lmcache=$LMCACHE deps=$TORCH_DEPS|$torch_libs|$VLLM_DEPS|$SGLANG_DEPS|$LMCACHE_DEPS|$TEST_DEPS py=$(python3 -c 'import sys; print(sys.version_info[:2])')"
tag=$(printf '%s' "$pins" | sha256sum | cut -c1-12)
root=${KVT_PY_CACHE:-$HOME/.cache/kvtier-py}
venv=$root/engines-$tag


mkdir -p "$root"
exec 9>"$root/.lock" # one install at a time per cache directory
flock 9
if [[ ! -f $venv/.complete ]]; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2 || {
    echo "kvtier: python3 -m venv failed (on Debian: apt-get install python3-venv)" >&2; exit 1; }
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-warn-conflicts)
  times=$venv/install-times.txt
  : > "$times"
  timed() {
    local name=$1; shift
    local t0; t0=$(date +%s%N)
    "$@"
    local ms=$((($(date +%s%N) - t0) / 1000000))
    printf '%-10s %4d.%01d s\n' "$name" $((ms / 1000)) $((ms % 1000 / 100)) | tee -a "$times" >&2
  }
  timed pip "${pip[@]}" --upgrade pip
  # shellcheck disable=SC2086
  timed torch "${pip[@]}" --no-deps torch==$TORCH
  # shellcheck disable=SC2086
  timed torch-deps "${pip[@]}" $TORCH_DEPS $torch_libs $TEST_DEPS
  # shellcheck disable=SC2086
  timed vllm "${pip[@]}" --no-deps vllm==$VLLM
  # shellcheck disable=SC2086
  timed vllm-deps "${pip[@]}" $VLLM_DEPS
  # shellcheck disable=SC2086
  timed sglang "${pip[@]}" --no-deps sglang==$SGLANG
  # shellcheck disable=SC2086
  timed sglang-deps "${pip[@]}" $SGLANG_DEPS
  # shellcheck disable=SC2086
  timed lmcache "${pip[@]}" --no-deps lmcache==$LMCACHE
  # shellcheck disable=SC2086
  timed lmcache-deps "${pip[@]}" $LMCACHE_DEPS
  # The modules the adapters build on must import.
  LD_LIBRARY_PATH=${cuda_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$venv/bin/python" -c '
import torch, vllm.v1.kv_offload.tiering.base, sglang.srt.mem_cache.hicache_storage
import lmcache.v1.storage_backend.connector.base_connector' >"$venv/import-check.log" 2>&1 || {
    cat "$venv/import-check.log" >&2
    echo "kvtier: the engines installed in $venv do not import" >&2; exit 1; }
  "$venv/bin/python" -m pip freeze >"$venv/freeze.txt"
  touch "$venv/.complete"
fi

if [[ ${1:-} == --print-env ]]; then
  echo "export LD_LIBRARY_PATH=${cuda_lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "$venv"
