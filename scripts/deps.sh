#!/usr/bin/env bash
# Installs the Debian packages kvtier needs when they are missing.
# Usage: scripts/deps.sh [--test]   (--test adds what only the tests need)
# With a CUDA toolkit (nvcc on PATH or in /usr/local/cuda/bin) it adds g++:
# nvcc compiles through the host C++ compiler. KVT_CUDA=0 leaves CUDA out.
set -euo pipefail
source "$(dirname "$0")/common.sh"
# libhiredis-dev: the remote tier's client library (without it the remote
# tier is compiled out).
pkgs=(liburing-dev libxxhash-dev libcmocka-dev libcjson-dev libhiredis-dev pkg-config cmake make gcc)
# --test: clang for the fuzzers, python3-venv for the Python package's tests;
# g++ for llama.cpp; python3-dev, libssl-dev and ninja-build for the C++
# extension SGLang builds on first use (its storage key hash); redis-server
# and redis-tools (redis-cli) for the remote tier's tests, which start their
# own servers.
if [[ "${1:-}" == "--test" ]]; then
  pkgs+=(clang libclang-rt-14-dev python3 python3-venv g++ python3-dev libssl-dev ninja-build
         redis-server redis-tools)
fi
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
# redis-server's postinst starts the system's service (invoke-rc.d): in a
# chroot or a container without an init that may fail the install, and
# elsewhere it leaves a server on port 6379 that nothing here uses. A
# policy-rc.d answering 101 (action not allowed) makes invoke-rc.d skip the
# start, as Debian's own container images do; ours is removed afterwards, an
# existing one is left as it is.
policy=/usr/sbin/policy-rc.d
own_policy=""
if [[ " ${missing[*]} " == *" redis-server "* && ! -e $policy ]]; then
  printf '#!/bin/sh\n# kvtier deps.sh: no service starts while it installs packages\nexit 101\n' |
    $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  own_policy=$policy
  trap '$sudo rm -f "$own_policy"' EXIT
fi
log=$(mktemp)
if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  echo "kvtier: apt-get could not install: ${missing[*]} (its output is above)" >&2
  exit 1
fi
rm -f "$log"
