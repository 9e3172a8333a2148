#!/usr/bin/env bash
# Installs the Debian packages kvtier needs when they are missing.
# Usage: scripts/deps.sh [--test]   (--test adds clang for the fuzzers)
set -euo pipefail
pkgs=(liburing-dev libxxhash-dev libcmocka-dev libcjson-dev pkg-config cmake make gcc)
if [[ "${1:-}" == "--test" ]]; then pkgs+=(clang libclang-rt-14-dev); fi
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
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null
