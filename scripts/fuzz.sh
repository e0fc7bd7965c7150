#!/usr/bin/env bash
# Runs every Go fuzz target in the module for the given time each (default 5s).
# `go test -fuzz` takes one target per run, so targets are discovered here.
set -euo pipefail
fuzztime=${1:-5s}
cd "$(dirname "$0")/.."
# Go 1.26's fuzz coordinator can report a bare "context deadline exceeded"
# when -fuzztime ends while a worker is mid-input on a loaded machine
# (golang/go#75804, fixed in Go 1.27): no input failed and none is written.
# Such a run is retried (twice at most); any other failure, and any run that
# wrote a failing input, fails at once.
fuzz_one() {
  local pkg=$1 target=$2 attempt out status
  for attempt in 1 2 3; do
    status=0
    out=$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" 2>&1) || status=$?
    printf '%s\n' "$out"
    [ "$status" -eq 0 ] && return 0
    if ! grep -q 'context deadline exceeded' <<<"$out" ||
      grep -qE 'Failing input written|panic:' <<<"$out" ||
      grep -qE '^\s+[A-Za-z0-9_]+_test\.go:[0-9]+:' <<<"$out"; then
      return "$status"
    fi
    echo "fuzz $pkg $target: coordinator deadline race (golang/go#75804), no failing input; retry $attempt"
  done
  return 1
}

found=0
while IFS= read -r file; do
  pkg=./$(dirname "$file")
  for target in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(f \*testing\.F\)' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+).*/\1/'); do
    found=$((found + 1))
    echo "fuzz $pkg $target ($fuzztime)"
    fuzz_one "$pkg" "$target"
  done
done < <(grep -rlE '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' --include='*_test.go' . | sort)
if [ "$found" -eq 0 ]; then
  echo "no fuzz targets found" >&2
  exit 1
fi
echo "fuzzed $found targets"
