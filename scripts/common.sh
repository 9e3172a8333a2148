# Shared by scripts/*.sh (sourced, not run).

# KVT_CUDA=0 (or off/no/false) builds without the CUDA backend.
kvt_cuda_wanted() {
  case "${KVT_CUDA:-1}" in
    0 | [Oo][Ff][Ff] | [Nn][Oo] | [Ff][Aa][Ll][Ss][Ee]) return 1 ;;
    *) return 0 ;;
  esac
}

# The nvcc CMake would use: on PATH, else the toolkit's usual place.
kvt_nvcc() {
  if command -v nvcc 2>/dev/null; then return 0; fi
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then echo /usr/local/cuda/bin/nvcc; fi
  return 0
}

# The -D options that follow KVT_CUDA; the toolkit's usual place when nvcc is
# not on PATH (CMake's own search does not look there for nvcc).
kvt_cuda_cmake_args() {
  if ! kvt_cuda_wanted; then
    echo "-DKVT_CUDA=OFF"
    return
  fi
  local nvcc
  nvcc=$(kvt_nvcc)
  if [[ -n "$nvcc" ]]; then
    echo "-DKVT_CUDA=ON -DCMAKE_CUDA_COMPILER=$nvcc"
  else
    echo "-DKVT_CUDA=ON"
  fi
}

# kvt_step LOG WHAT CMD...: runs CMD with its output in LOG; on failure prints
# the output and says which step failed, in kvtier's words.
kvt_step() {
  local log=$1 what=$2
  shift 2
  mkdir -p "$(dirname "$log")"
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo >&2
    echo "kvtier: $what failed (output above, also in $log)." >&2
    if kvt_cuda_wanted && [[ -n "$(kvt_nvcc)" ]]; then
      echo "kvtier: to build without the CUDA backend: KVT_CUDA=0 bash $0" >&2
    fi
    exit 1
  fi
}

# kvt_skips BUILD_DIR: after ctest, the reason each skipped test printed
# (ctest itself only says "Skipped").
kvt_skips() {
  awk '/^[0-9]+\/[0-9]+ Testing: / { name = $3 }
       /^SKIP: / { sub(/^SKIP: /, ""); print "kvtier: skipped " name ": " $0 }
       /^\[  SKIPPED \] [A-Za-z0-9_]+$/ { print "kvtier: subtest skipped in " name ": " $NF }' \
    "$1/Testing/Temporary/LastTest.log" 2>/dev/null || true
}
