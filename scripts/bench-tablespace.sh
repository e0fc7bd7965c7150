#!/usr/bin/env bash
# kvd L3 tablespace write/read throughput against dd with the same flags, on
# the same filesystem, 1 MiB blocks (the slot size). Each round runs the
# three dd commands and the three benchmarks, alternating which goes first,
# and the round's ratios are taken within it; the script prints every round
# and the medians over ROUNDS (default 7), with the load average.
#   DIR=/var/lib/infera/kvd COUNT=256 ROUNDS=7 bash scripts/bench-tablespace.sh
# Pairs: Put (O_DIRECT|O_DSYNC slot write + journal fdatasync, one writer)
# vs dd oflag=direct,dsync; PutGroupParallel (4 writers, O_DIRECT, shared
# fdatasyncs) vs dd oflag=direct conv=fsync; Get (one O_DIRECT pread per
# slot into a ReadBuffer, CRC-32C checked) vs dd iflag=direct.
set -euo pipefail
dir=${DIR:-${TMPDIR:-/tmp}}
count=${COUNT:-256}
rounds=${ROUNDS:-7}
cd "$(dirname "$0")/.."
work=$(mktemp -d "$dir/tsbench.XXXXXX")
trap 'rm -rf "$work"' EXIT
go test -c -o "$work/tablespace.test" ./kvd/tablespace/
echo "filesystem: $(df -T "$work" | tail -1 | awk '{print $1, $2}')  cores: $(nproc)  go: $(go env GOVERSION)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# ddrate prints dd's MB/s (bytes / seconds, from its summary line).
ddrate() { "$@" 2>&1 | awk '/copied/ { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^s,?$/) s = $i; printf "%.1f", $1 / s / 1e6 }'; }
dds() {
  w1=$(ddrate dd if=/dev/zero of="$work/dd" bs=1M count="$count" oflag=direct,dsync)
  rm -f "$work/dd"
  w2=$(ddrate dd if=/dev/zero of="$work/dd" bs=1M count="$count" oflag=direct conv=fsync)
  r1=$(ddrate dd if="$work/dd" of=/dev/null bs=1M iflag=direct)
  rm -f "$work/dd"
}
benches() {
  out=$(INFERA_TABLESPACE_BENCH_DIR="$work" "$work/tablespace.test" -test.run '^$' \
    -test.bench '^Benchmark(Put|PutGroupParallel|Get)$' -test.benchtime "${count}x")
  bp=$(echo "$out" | awk '/^BenchmarkPut-/ {print $5}')
  bg=$(echo "$out" | awk '/^BenchmarkPutGroupParallel-/ {print $5}')
  br=$(echo "$out" | awk '/^BenchmarkGet-/ {print $5}')
}
table=""
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then dds; benches; else benches; dds; fi
  line="$r $w1 $bp $w2 $bg $r1 $br"
  table+="$line"$'\n'
  echo "round $r ($(cut -d' ' -f1 /proc/loadavg)): dd dsync $w1 | Put $bp || dd fsync $w2 | PutGroupParallel $bg || dd read $r1 | Get $br  (MB/s)"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%s' "$table" | awk '
function median(a, m,   i, j, t, x) {
	for (i = 1; i <= m; i++) x[i] = a[i]
	for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
	return m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
}
{ m++; for (c = 2; c <= 7; c++) v[c, m] = $c; q1[m] = $3 / $2; q2[m] = $5 / $4; q3[m] = $7 / $6 }
END {
	for (c = 2; c <= 7; c++) { for (i = 1; i <= m; i++) col[i] = v[c, i]; med[c] = median(col, m) }
	printf "medians of %d rounds (MB/s; ratio = median of the per-round ratios)\n", m
	printf "  Put              %7.0f  vs dd oflag=direct,dsync       %7.0f  ratio %.2f\n", med[3], med[2], median(q1, m)
	printf "  PutGroupParallel %7.0f  vs dd oflag=direct conv=fsync  %7.0f  ratio %.2f\n", med[5], med[4], median(q2, m)
	printf "  Get              %7.0f  vs dd iflag=direct             %7.0f  ratio %.2f\n", med[7], med[6], median(q3, m)
}'
