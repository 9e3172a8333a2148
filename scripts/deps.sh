#!/usr/bin/env bash
# Installs the Debian packages kvtier needs when they are missing.
# Usage: scripts/deps.sh [--test]   (--test adds what only the tests need)
# With a CUDA toolkit (nvcc on PATH or in /usr/local/cuda/bin) it adds g++:
# nvcc compiles through the host C++ compiler. KVT_CUDA=0 leaves CUDA out.
set -euo pipefail
source "$(dirname "$0")/common.sh"
pkgs=(liburing-dev libxxhash-dev libcmocka-dev libcjson-dev pkg-config cmake make gcc)
# --test: clang for the fuzzers, python3-venv for the Python package's tests;
# g++ for llama.cpp; python3-dev, libssl-dev and ninja-build for the C++
# extension SGLang builds on first use (its storage key hash).
if [[ "${1:-}" == "--test" ]]; then pkgs+=(clang libclang-rt-14-dev python3 python3-venv g++ python3-dev libssl-dev ninja-build); fi
if kvt_cuda_wanted && [[ -n "$(kvt_nvcc)" ]]; then pkgs+=(g++); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
echo "kvtier: installing missing packages: ${missing[*]}"
if [[ $(id -u) -eq 0 ]]; then
  sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo="sudo"
else
  echo "kvtier: missing packages: ${missing[*]}" >&2
  echo "kvtier: run as root (or with passwordless sudo), or install them yourself:" >&2
  echo "        apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  echo "kvtier: apt-get could not install: ${missing[*]} (its output is above)" >&2
  exit 1
fi
rm -f "$log"
