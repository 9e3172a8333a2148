#!/bin/sh
# bench/cli-check.sh RC PATTERN CMD [ARGS...]: runs CMD, passes when it exits
# with RC and its output (stdout and stderr) matches the grep -E PATTERN.
# The tests use it to check kvtier-bench's command line.
want=$1 pattern=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$want" ]; then
  echo "cli-check: exit $rc, expected $want" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
  echo "cli-check: output does not match: $pattern" >&2
  exit 1
fi
