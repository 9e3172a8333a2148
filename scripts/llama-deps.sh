#!/usr/bin/env bash
# Fetches llama.cpp at a pinned version, builds libllama outside the source
# tree, writes the random-weight models (scripts/llama-model.py), and prints
# the directory holding them last: pass it to CMake as -DKVT_LLAMA_DIR=...
# (install/ has libllama and its headers, models/ the models).
#   scripts/llama-deps.sh
# llama.cpp's source comes from the PyPI source package of llama-cpp-python
# (vendor/llama.cpp), fetched with pip. Everything lives in
# ${KVT_LLAMA_CACHE:-${XDG_CACHE_HOME:-~/.cache}/kvtier/llama}/<hash of the pins>;
# a finished build holds a .complete file and is reused as is. Delete the
# directory to rebuild. The build's time goes to <dir>/build-time.txt. The
# models (random-4x256.gguf for the tests, random-8x512.gguf for the bench)
# are remade when llama-model.py changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

LLAMA_CPP_PYTHON=0.3.36
GGUF=0.19.0
# Release libllama only; tools, examples, server, tests and common off.
CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
-DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
-DGGML_METAL=OFF -DGGML_OPENMP=OFF"

pins="llama-cpp-python=$LLAMA_CPP_PYTHON cmake=$CMAKE_ARGS"
tag=$(printf '%s' "$pins" | sha256sum | cut -c1-12)
root=${KVT_LLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvtier/llama}
dir=$root/$tag

mkdir -p "$root"
exec 9>"$root/.lock" # one build at a time per cache directory
flock 9
if [[ ! -f $dir/.complete ]]; then
  rm -rf "$dir"
  mkdir -p "$dir"
  log=$dir/build.log
  fail() { cat "$log" >&2; echo "kvtier: $1 (output above, also in $log)" >&2; exit 1; }
  start=$(date +%s)
  # pip from a venv of its own: Debian's python3 has no pip module.
  python3 -m venv "$dir/pip-venv" >"$log" 2>&1 ||
    fail "python3 -m venv failed (on Debian: apt-get install python3-venv)"
  "$dir/pip-venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --no-binary llama-cpp-python -d "$dir/dl" "llama-cpp-python==$LLAMA_CPP_PYTHON" >>"$log" 2>&1 ||
    fail "pip could not download llama-cpp-python==$LLAMA_CPP_PYTHON"
  tar -xzf "$dir"/dl/llama_cpp_python-*.tar.gz -C "$dir/dl" || fail "could not unpack the source package"
  src=$(echo "$dir"/dl/llama_cpp_python-*/vendor/llama.cpp)
  # shellcheck disable=SC2086
  cmake -S "$src" -B "$dir/build" $CMAKE_ARGS -DCMAKE_INSTALL_PREFIX="$dir/install" >>"$log" 2>&1 ||
    fail "configuring llama.cpp failed"
  cmake --build "$dir/build" -j"$(nproc)" >>"$log" 2>&1 || fail "building llama.cpp failed"
  cmake --install "$dir/build" >>"$log" 2>&1 || fail "installing llama.cpp failed"
  built=$(date +%s)
  mkdir -p "$dir/vocab"
  cp "$src/models/ggml-vocab-llama-spm.gguf" "$dir/vocab/"
  rm -rf "$dir/build" "$dir/dl" "$dir/pip-venv"
  echo "libllama: $((built - start)) s to fetch and build" >"$dir/build-time.txt"
  touch "$dir/.complete"
fi

# The models: remade when the script that writes them changes.
models=$dir/models-$( (echo "gguf=$GGUF"; cat "$here/llama-model.py") | sha256sum | cut -c1-12)
if [[ ! -f $models/.complete ]]; then
  rm -rf "$models"
  mkdir -p "$models"
  log=$models/make.log
  fail() { cat "$log" >&2; echo "kvtier: $1 (output above, also in $log)" >&2; exit 1; }
  start=$(date +%s)
  python3 -m venv "$models/venv" >>"$log" 2>&1 || fail "python3 -m venv failed (on Debian: apt-get install python3-venv)"
  "$models/venv/bin/python" -m pip install --quiet --disable-pip-version-check "gguf==$GGUF" numpy >>"$log" 2>&1 ||
    fail "pip could not install gguf==$GGUF and numpy"
  vocab=$dir/vocab/ggml-vocab-llama-spm.gguf
  "$models/venv/bin/python" "$here/llama-model.py" --vocab "$vocab" --layers 4 --width 256 \
    --heads 4 --kv-heads 2 --ffn 704 --out "$models/random-4x256.gguf" >>"$log" 2>&1 ||
    fail "writing the test model failed"
  "$models/venv/bin/python" "$here/llama-model.py" --vocab "$vocab" --layers 8 --width 512 \
    --heads 8 --kv-heads 2 --ffn 1408 --out "$models/random-8x512.gguf" >>"$log" 2>&1 ||
    fail "writing the bench model failed"
  rm -rf "$models/venv"
  echo "models: $(($(date +%s) - start)) s" >"$models/make-time.txt"
  touch "$models/.complete"
fi
ln -sfn "$(basename "$models")" "$dir/models"
echo "$dir"
