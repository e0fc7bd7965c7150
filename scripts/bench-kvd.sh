#!/usr/bin/env bash
# kvd shared-arena GET/SET through the Go client against memcpy of the same
# bytes, and the UDS round trip of a small op against a raw UDS ping-pong
# (docs/performance.md, issue 9 acceptance 5). Each round runs, per value
# size, the memcpy baselines and the arena benchmarks back to back (one
# process), then the round-trip benchmarks; ratios are taken within a round
# and the table shows medians over the rounds.
#   ROUNDS=5 BENCHTIME=300ms bash scripts/bench-kvd.sh
set -euo pipefail
rounds=${ROUNDS:-5}
benchtime=${BENCHTIME:-300ms}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go test -c -o "$work/kvd.test" ./kvd/
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
for r in $(seq "$rounds"); do
  for s in 4KiB 64KiB 1MiB 4MiB; do
    "$work/kvd.test" -test.run '^$' -test.benchmem -test.benchtime "$benchtime" \
      -test.bench "^Benchmark(Memcpy|ArenaGet|ArenaSet|MemcpyBatch|ArenaGetBatch|ArenaSetBatch)\$/^$s\$" |
      grep '^Benchmark' | sed "s/^/$r /"
  done
  "$work/kvd.test" -test.run '^$' -test.benchmem -test.benchtime "$benchtime" \
    -test.bench '^Benchmark(UDSPingPong|RoundTrip|RoundTripStats|ArenaGetRef)$' | grep '^Benchmark' | sed "s/^/$r /"
done >"$work/raw"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
cat "$work/raw"
awk '
{
	r = $1; name = $2; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
	ns[name, r] = $4; mbs[name, r] = ($7 == "MB/s") ? $6 : 0; allocs[name] = $(NF - 1)
	if (r > nr) nr = r
}
function med(x, m,   i, j, t) {
	for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
	return m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
}
function mns(name,   x, i) { for (i = 1; i <= nr; i++) x[i] = ns[name, i]; return med(x, nr) }
function mgb(name,   x, i) { for (i = 1; i <= nr; i++) x[i] = mbs[name, i] / 1000; return med(x, nr) }
function ratio(a, b,   x, i) { for (i = 1; i <= nr; i++) x[i] = ns[b, i] / ns[a, i]; return med(x, nr) }
function t(v) { return v >= 1e6 ? sprintf("%.2f ms", v / 1e6) : v >= 1e3 ? sprintf("%.1f µs", v / 1e3) : sprintf("%.0f ns", v) }
function bytesOf(s) { return s ~ /MiB/ ? s * 1048576 : s * 1024 }
END {
	split("4KiB 64KiB 1MiB 4MiB", sz, " ")
	printf "\nSingle ops, per-op latency (one value per call; ratio = memcpy time / op time), medians of %d rounds:\n\n", nr
	print "| size | memcpy | arena GET | GET / memcpy | arena SET | SET / memcpy |"
	print "|---|---:|---:|---:|---:|---:|"
	for (i = 1; i <= 4; i++) {
		s = sz[i]
		printf "| %s | %s (%.1f GB/s) | %s (%.1f GB/s) | %.2f | %s (%.1f GB/s) | %.2f |\n", s,
			t(mns("Memcpy/" s)), mgb("Memcpy/" s), t(mns("ArenaGet/" s)), mgb("ArenaGet/" s), ratio("ArenaGet/" s, "Memcpy/" s),
			t(mns("ArenaSet/" s)), mgb("ArenaSet/" s), ratio("ArenaSet/" s, "Memcpy/" s)
	}
	printf "\nBatched ops, throughput (one batch_get, or pipelined reserve/commit, per batch; memcpy of the same values from/to the same number of distinct buffers):\n\n"
	print "| size | values/batch | memcpy batch | arena GET batch | GET / memcpy | arena SET batch | SET / memcpy |"
	print "|---|---:|---:|---:|---:|---:|---:|"
	for (i = 1; i <= 4; i++) {
		s = sz[i]; n = bytesOf(s); k = int(16 * 1048576 / n); if (k < 4) k = 4; if (k > 1024) k = 1024
		printf "| %s | %d | %.1f GB/s (%s/value) | %.1f GB/s (%s/value) | %.2f | %.1f GB/s (%s/value) | %.2f |\n", s, k,
			mgb("MemcpyBatch/" s), t(mns("MemcpyBatch/" s) / k), mgb("ArenaGetBatch/" s), t(mns("ArenaGetBatch/" s) / k), ratio("ArenaGetBatch/" s, "MemcpyBatch/" s),
			mgb("ArenaSetBatch/" s), t(mns("ArenaSetBatch/" s) / k), ratio("ArenaSetBatch/" s, "MemcpyBatch/" s)
	}
	printf "\nRound trips (a small op through the client and the daemon vs a raw UDS ping-pong of the same size):\n\n"
	print "| op | time | / raw ping-pong | allocs/op |"
	print "|---|---:|---:|---:|"
	printf "| raw UDS ping-pong (44 bytes) | %s | 1.00 | %s |\n", t(mns("UDSPingPong")), allocs["UDSPingPong"]
	printf "| exists (1 key) | %s | %.2f | %s |\n", t(mns("RoundTrip")), ratio("UDSPingPong", "RoundTrip"), allocs["RoundTrip"]
	printf "| stats | %s | %.2f | %s |\n", t(mns("RoundTripStats")), ratio("UDSPingPong", "RoundTripStats"), allocs["RoundTripStats"]
	printf "| get, zero-copy reference only | %s | %.2f | %s |\n", t(mns("ArenaGetRef")), ratio("UDSPingPong", "ArenaGetRef"), allocs["ArenaGetRef"]
}' "$work/raw"
