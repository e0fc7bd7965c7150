#!/usr/bin/env bash
# Runs every Go fuzz target in the module for the given time each (default 5s).
# `go test -fuzz` takes one target per run, so targets are discovered here.
set -euo pipefail
fuzztime=${1:-5s}
cd "$(dirname "$0")/.."
found=0
while IFS= read -r file; do
  pkg=./$(dirname "$file")
  for target in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(f \*testing\.F\)' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+).*/\1/'); do
    found=$((found + 1))
    echo "fuzz $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg"
  done
done < <(grep -rlE '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)' --include='*_test.go' . | sort)
if [ "$found" -eq 0 ]; then
  echo "no fuzz targets found" >&2
  exit 1
fi
echo "fuzzed $found targets"
