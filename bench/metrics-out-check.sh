#!/bin/sh
# bench/metrics-out-check.sh FILE PATTERN CMD [ARGS...]: runs CMD (which is
# given --metrics-out FILE), passes when it exits 0 and FILE has a line
# matching the grep -E PATTERN.
file=$1 pattern=$2
shift 2
rm -f "$file"
"$@" --metrics-out "$file" >/dev/null || exit 1
if ! grep -Eq -- "$pattern" "$file"; then
  echo "metrics-out-check: $file has no line matching: $pattern" >&2
  exit 1
fi
