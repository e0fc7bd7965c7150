#!/usr/bin/env bash
# kvd L3 tablespace write/read throughput against dd with the same flags, on
# the same filesystem, rounds interleaved. 1 MiB blocks (the slot size).
#   DIR=/var/lib/infera/kvd COUNT=256 ROUNDS=3 bash scripts/bench-tablespace.sh
set -euo pipefail
dir=${DIR:-${TMPDIR:-/tmp}}
count=${COUNT:-256}
rounds=${ROUNDS:-3}
cd "$(dirname "$0")/.."
work=$(mktemp -d "$dir/tsbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
go test -c -o "$work/tablespace.test" ./kvd/tablespace/
df -T "$work" | tail -1
nproc
for r in $(seq "$rounds"); do
  echo "== round $r: $(uptime)"
  echo "dd write oflag=direct,dsync: $(dd if=/dev/zero of="$work/dd" bs=1M count="$count" oflag=direct,dsync 2>&1 | tail -1)"
  rm -f "$work/dd"
  echo "dd write oflag=direct conv=fsync: $(dd if=/dev/zero of="$work/dd" bs=1M count="$count" oflag=direct conv=fsync 2>&1 | tail -1)"
  echo "dd read iflag=direct: $(dd if="$work/dd" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1)"
  rm -f "$work/dd"
  INFERA_TABLESPACE_BENCH_DIR="$work" "$work/tablespace.test" -test.run '^$' -test.bench 'Put|Get' \
    -test.benchtime "${count}x" | grep '^Benchmark'
done
