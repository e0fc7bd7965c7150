#!/usr/bin/env bash
# kvd L3 tablespace write/read throughput against dd with the same flags on
# the same filesystem, 1 MiB blocks (the slot size): BenchmarkVsDD runs
# ROUNDS rounds (default 21) of three pairs over 32 blocks each, dd and the
# tablespace alternating which goes first, and reports the medians over the
# rounds of each side's MB/s and of the per-round ratio (tablespace/dd):
#   put:   dd oflag=direct,dsync conv=notrunc   vs Put, one writer (O_DIRECT|O_DSYNC slot write + journal fdatasync)
#   group: dd oflag=direct conv=fsync,notrunc   vs Put, 4 writers, GroupCommit (shared fdatasyncs)
#   get:   dd iflag=direct                      vs Get into a ReadBuffer (O_DIRECT pread, CRC-32C checked)
#          dd reads a file holding the same bytes as the slots the gets read;
#          a second baseline, raw, preads those very slots (same offsets,
#          O_DIRECT, unchecked) in the same round; verify = CRC-32C CPU µs/MiB
#   DIR=/var/lib/infera/kvd ROUNDS=21 bash scripts/bench-tablespace.sh
#   (TEST_BIN=path: a prebuilt `go test -c ./kvd/tablespace/` binary)
set -euo pipefail
dir=${DIR:-${TMPDIR:-/tmp}}
rounds=${ROUNDS:-21}
cd "$(dirname "$0")/.."
work=$(mktemp -d "$dir/tsbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ -n "${TEST_BIN:-}" ]; then cp "$TEST_BIN" "$work/tablespace.test"; else go test -c -o "$work/tablespace.test" ./kvd/tablespace/; fi
echo "filesystem: $(df -T "$work" | tail -1 | awk '{print $1, $2}')  cores: $(nproc)  $(go env GOVERSION 2>/dev/null || echo prebuilt)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
out=$(INFERA_TABLESPACE_BENCH_DIR="$work" "$work/tablespace.test" -test.run '^$' -test.bench '^BenchmarkVsDD$' \
  -test.benchtime "${rounds}x")
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$out" | grep '^Benchmark'
echo "$out" | awk -v r="$rounds" '/^BenchmarkVsDD/ {
	for (i = 3; i < NF; i++) m[$(i + 1)] = $i
	printf "medians of %d rounds (MB/s; ratio = median of the per-round tablespace/dd ratios)\n", r
	printf "  put   Put %6.0f  vs dd oflag=direct,dsync      %6.0f  ratio %.2f\n", m["put-ts-MB/s"], m["put-dd-MB/s"], m["put-ratio"]
	printf "  group Put %6.0f  vs dd oflag=direct conv=fsync %6.0f  ratio %.2f\n", m["group-ts-MB/s"], m["group-dd-MB/s"], m["group-ratio"]
	printf "  get   Get %6.0f  vs dd iflag=direct            %6.0f  ratio %.2f\n", m["get-ts-MB/s"], m["get-dd-MB/s"], m["get-ratio"]
	printf "  get   Get %6.0f  vs raw O_DIRECT pread of the slots %6.0f  ratio %.2f\n", m["get-ts-MB/s"], m["get-raw-MB/s"], m["get-raw-ratio"]
	printf "  verification (CRC-32C) %.0f us of CPU per MiB\n", m["verify-us/MiB"]
}'
