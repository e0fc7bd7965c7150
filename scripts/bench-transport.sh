#!/usr/bin/env bash
# TCP transport vs a raw TCP copy on loopback (docs/performance.md). Runs
# BenchmarkLoopback COUNT times (default 7); each run alternates one raw and
# one transport read per iteration, so load drift hits both alike, and
# reports raw-MB/s, transport-MB/s and ratio (the median over iterations of
# raw time / transport time); BenchmarkLoopbackFramed does the same against
# a raw copy framed as the engine frames it (writev of a 24-byte header and
# the region, readv back); BenchmarkLoopbackControl measures two raw
# connections the same way (the harness's own bias: ~1.00). Prints, per
# region size, the median of each over the runs, and the load before and after.
# Usage: scripts/bench-transport.sh [benchtime]   (default 1s; COUNT=7)
set -euo pipefail
cd "$(dirname "$0")/.."
benchtime=${1:-1s}
count=${COUNT:-7}
go test -c -o /tmp/transport-bench.$$.test ./transport/
trap 'rm -f /tmp/transport-bench.$$.test' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
out=$(/tmp/transport-bench.$$.test -test.run '^$' -test.bench Loopback -test.benchmem -test.benchtime "$benchtime" -test.count "$count")
echo "$out" | grep -E '^Benchmark'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$out" | awk '
/^BenchmarkLoopbackControl\// {
	split($1, a, "/"); s = a[2]; sub(/-[0-9]+$/, "", s)
	for (i = 3; i < NF; i++) if ($(i + 1) == "ratio") ctl[s, ++nc[s]] = $i
}
/^BenchmarkLoopbackFramed\// {
	split($1, a, "/"); s = a[2]; sub(/-[0-9]+$/, "", s)
	k = ++nf[s]
	for (i = 3; i < NF; i++) {
		if ($(i + 1) == "raw-MB/s") fraw[s, k] = $i
		if ($(i + 1) == "ratio") fra[s, k] = $i
		if ($(i + 1) == "allocs/op" && $i > maxa[s]) maxa[s] = $i
	}
}
/^BenchmarkLoopback\// {
	split($1, a, "/"); s = a[2]; sub(/-[0-9]+$/, "", s)
	if (!(s in n)) order[++ns] = s
	k = ++n[s]
	for (i = 3; i < NF; i++) {
		if ($(i + 1) == "raw-MB/s") raw[s, k] = $i
		if ($(i + 1) == "transport-MB/s") tr[s, k] = $i
		if ($(i + 1) == "ratio") ra[s, k] = $i
		if ($(i + 1) == "allocs/op" && $i > maxa[s]) maxa[s] = $i
	}
}
function median(arr, s, m,   i, j, t, x) {
	for (i = 1; i <= m; i++) x[i] = arr[s, i]
	for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
	return m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
}
END {
	for (i = 1; i <= ns; i++) {
		s = order[i]; m = n[s]
		printf "%-9s raw %5.0f MB/s  transport %5.0f MB/s  ratio %.2f (min %.2f) | framed raw %5.0f MB/s  ratio %.2f (min %.2f) | control %.2f | max allocs/op %d  (medians of %d runs)\n",
			s, median(raw, s, m), median(tr, s, m), median(ra, s, m), minr(ra, s, m), median(fraw, s, nf[s]), median(fra, s, nf[s]), minr(fra, s, nf[s]), median(ctl, s, nc[s]), maxa[s] + 0, m
	}
}
function minr(arr, s, m,   i, r) { r = arr[s, 1]; for (i = 2; i <= m; i++) if (arr[s, i] < r) r = arr[s, i]; return r }'
