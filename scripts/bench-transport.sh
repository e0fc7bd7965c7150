#!/usr/bin/env bash
# TCP transport vs a raw TCP copy on loopback (docs/performance.md): runs
# BenchmarkLoopback (raw and transport alternate for 5 rounds per region
# size) and prints, per size, the median MB/s of each and their ratio.
# Usage: scripts/bench-transport.sh [benchtime]   (default 500ms)
set -euo pipefail
cd "$(dirname "$0")/.."
benchtime=${1:-500ms}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
out=$(go test -run '^$' -bench Loopback -benchmem -benchtime "$benchtime" -count 1 ./transport/)
echo "$out" | grep -E '^Benchmark'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$out" | awk '
/^BenchmarkLoopback\// {
	split($1, a, "/"); k = a[3]; sub(/(#[0-9]+)?-[0-9]+$/, "", k)
	n[a[2] " " k]++; v[a[2] " " k, n[a[2] " " k]] = $5
	if (!(a[2] in seen)) { seen[a[2]] = 1; order[++ns] = a[2] }
}
function median(key,   m, i, j, t, x) {
	m = n[key]; for (i = 1; i <= m; i++) x[i] = v[key, i]
	for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
	return m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
}
END {
	for (i = 1; i <= ns; i++) {
		s = order[i]; r = median(s " raw"); t = median(s " transport")
		printf "%-9s raw %6.0f MB/s  transport %6.0f MB/s  ratio %.2f  (median of %d rounds)\n", s, r, t, t / r, n[s " raw"]
	}
}'
