#!/usr/bin/env bash
# RESP comparison of `infera kvd --resp-listen` with redis-server, same
# redis-benchmark parameters, same run (docs/performance.md). The judged
# figure is server CPU (time on CPU of all its threads, schedstat) per request
# (medians, and each round's kvd/redis ratio with a bootstrap 95% interval); ops/s comes with
# the ratio kvd/redis of each round and a bootstrap 95% interval of its
# mean over the interleaved rounds (who goes first rotates every round).
#
# Usage: scripts/resp-bench.sh [requests] [clients] [rounds] [pipeline]
#   env SIZES (default "64 1024 4096 65536 1048576"), TESTS ("set get"),
#   RETENTION (short; long sends values down to L3 when --long-path is
#   given in KVD_ARGS), KVD_ARGS (extra kvd flags).
#   -d 65536 runs requests/10, -d 1048576 requests/100.
#   BIN=path uses a prebuilt infera instead of building one; RESULTS=path
#   keeps every run's line (server test size ops/s cpu_us/req round).
#   Needs redis-server and redis-tools; taskset pins the client to CPU 0
#   and the servers to CPU 1 when the machine has two or more.
#
# Servers: redis-server with its defaults except persistence off (--save ""
# --appendonly no); kvd twice, with its default GOMAXPROCS and with
# GOMAXPROCS=1 (one core, as redis-server's one thread), RESP values in the
# shared arena (size classes: every size side by side).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000}
c=${2:-50}
rounds=${3:-50}
pipe=${4:-1}
sizes=${SIZES:-64 1024 4096 65536 1048576}
tests=${TESTS:-set get}
retention=${RETENTION:-short}
work=$(mktemp -d)
base=$((20000 + RANDOM % 10000))
pin_client="" pin_server=""
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
  pin_client="taskset -c 0" pin_server="taskset -c 1"
fi
if [ -n "${BIN:-}" ]; then cp "$BIN" "$work/infera"; else go build -o "$work/infera" .; fi
start_kvd() { # NAME PORT GOMAXPROCS(empty = default)
  env ${3:+GOMAXPROCS=$3} $pin_server "$work/infera" kvd --socket "$work/$1.sock" --admin-listen "" \
    --max-bytes 2GiB --shared-arena-bytes 1GiB --arena-mlock=false --resp-listen "$2" \
    --resp-retention "$retention" --log-level warn ${KVD_ARGS:-} &
}
start_kvd kvd "$base" ""
kvd_pid=$!
start_kvd kvd1 $((base + 1)) 1
kvd1_pid=$!
$pin_server redis-server --port $((base + 2)) --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --loglevel warning &
redis_pid=$!
trap 'kill $kvd_pid $kvd1_pid $redis_pid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for p in "$base" $((base + 1)) $((base + 2)); do
  for _ in $(seq 1 100); do redis-cli -p "$p" PING >/dev/null 2>&1 && break; sleep 0.1; done
done
# The pids doing the work (env and taskset exec, so these are the servers).
# CPU time in ns: the sum over the server's threads of the first field of
# /proc/PID/task/TID/schedstat (time on CPU, ns; /proc/PID/stat's utime and
# stime count 10 ms ticks, ~25 ticks for a 64 KiB run: ±4% per tick).
# Servers do not end threads during a run (Go keeps its Ms, redis its bio
# threads), so no thread's time is lost from the sum.
cpu() { cat /proc/"$1"/task/*/schedstat | awk '{ s += $1 } END { printf "%.0f", s }'; }
# one SERVER PID PORT TEST D N ROUND: appends "server test d rps cpu_us_per_request round"
one() {
  local a b rps
  a=$(cpu "$2")
  rps=$($pin_client redis-benchmark -p "$3" -t "$4" -d "$5" -n "$6" -c "$c" -P "$pipe" --csv | tail -n 1 | cut -d, -f2 | tr -d '"')
  b=$(cpu "$2")
  echo "$1 $4 $5 $rps $(awk -v a="$a" -v b="$b" -v n="$6" 'BEGIN { printf "%.4f", (b - a) / 1000 / n }') $7" >>"$work/results"
}
echo "uptime: $(uptime)"
echo "command: ${pin_client:+$pin_client }redis-benchmark -p PORT -t TEST -d D -n N -c $c -P $pipe --csv  (N = $n; /10 at 64 KiB, /100 at 1 MiB), $rounds rounds, servers ${pin_server:-unpinned}, retention $retention"
servers=("redis $redis_pid $((base + 2))" "kvd $kvd_pid $base" "kvd1 $kvd1_pid $((base + 1))")
for r in $(seq 1 "$rounds"); do
  for d in $sizes; do
    nd=$n
    [ "$d" -ge 65536 ] && nd=$((n / 10))
    [ "$d" -ge 1048576 ] && nd=$((n / 100))
    nd=$((nd > 10 ? nd : 10))
    for t in $tests; do
      for k in 0 1 2; do # rotate who goes first
        # shellcheck disable=SC2086
        one ${servers[$(((k + r) % 3))]} "$t" "$d" "$nd" "$r"
      done
    done
  done
done
# awk functions both tables use: sorted (a space-separated list into a,
# ascending), med (its median), ci (bootstrap, 2000 resamples: the 2.5 and
# 97.5 percentiles of the mean).
stats_awk='
  function sorted(s, a,   k, i, j, t) {
    k = split(s, a, " ")
    for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return k }
  function med(s,   a, k, m) {
    k = sorted(s, a); if (k == 0) return 0; m = int((k + 1) / 2); return (k % 2) ? a[m] : (a[m] + a[m + 1]) / 2 }
  function ci(s,   x, k, b, i, sum, means) {
    k = split(s, x, " "); if (k == 0) return "-"
    means = ""
    for (b = 0; b < 2000; b++) { sum = 0; for (i = 0; i < k; i++) sum += x[1 + int(rand() * k)]; means = means " " sum / k }
    k = sorted(means, x); return sprintf("%.2f-%.2f", x[1 + int(0.025 * k)], x[int(0.975 * k)]) }
'
# kvd = default GOMAXPROCS, kvd1 = GOMAXPROCS=1; ratios pair each kvd run
# with the redis run of the same round; ci95 = bootstrap (2000 resamples)
# 2.5 and 97.5 percentiles of the mean ratio.
printf '%-8s %-4s %11s %11s %11s %10s %10s %10s %16s %16s\n' size test redis_rps kvd_rps kvd1_rps redis_us kvd_us kvd1_us 'kvd/redis ci95' 'kvd1/redis ci95'
awk "$stats_awk"'
  BEGIN { srand(31) }
  { key = $3 " " toupper($2); rps[$1, key] = rps[$1, key] " " $4; us[$1, key] = us[$1, key] " " $5; got[$1, key, $6] = $4
    if (!(key in keys)) { keys[key] = ++nk; names[nk] = key }
    if ($6 > nr) nr = $6 }
  END {
    for (j = 1; j <= nk; j++) {
      key = names[j]; rk = ""; r1 = ""
      for (i = 1; i <= nr; i++) if ((("redis", key, i) in got) && got["redis", key, i] > 0) {
        if (("kvd", key, i) in got) rk = rk " " got["kvd", key, i] / got["redis", key, i]
        if (("kvd1", key, i) in got) r1 = r1 " " got["kvd1", key, i] / got["redis", key, i] }
      split(key, kk, " ")
      printf "%-8s %-4s %11.0f %11.0f %11.0f %10.2f %10.2f %10.2f %16s %16s\n", kk[1], kk[2], med(rps["redis", key]), med(rps["kvd", key]), med(rps["kvd1", key]), med(us["redis", key]), med(us["kvd", key]), med(us["kvd1", key]), ci(rk), ci(r1)
    }
  }' "$work/results"
# CPU per request, paired by round: each round's kvd (kvd1) µs/request over
# redis-server's in the same round; median, range and bootstrap 95% interval
# of the mean (the judged figure, less distorted by load than ops/s).
printf '\n%-8s %-4s %6s %22s %22s\n' size test rounds 'kvd/redis cpu med ci95' 'kvd1/redis cpu med ci95'
awk "$stats_awk"'
  BEGIN { srand(31) }
  { key = $3 " " toupper($2); us[$1, key, $6] = $5
    if (!(key in keys)) { keys[key] = ++nk; names[nk] = key }
    if ($6 > nr) nr = $6 }
  END {
    for (j = 1; j <= nk; j++) {
      key = names[j]; rk = ""; r1 = ""; n = 0
      for (i = 1; i <= nr; i++) if ((("redis", key, i) in us) && us["redis", key, i] > 0) {
        n++
        if (("kvd", key, i) in us) rk = rk " " us["kvd", key, i] / us["redis", key, i]
        if (("kvd1", key, i) in us) r1 = r1 " " us["kvd1", key, i] / us["redis", key, i] }
      split(key, kk, " ")
      printf "%-8s %-4s %6d %9.2f %12s %9.2f %12s\n", kk[1], kk[2], n, med(rk), ci(rk), med(r1), ci(r1)
    }
  }' "$work/results"
echo "uptime: $(uptime)"
[ -z "${RESULTS:-}" ] || cp "$work/results" "$RESULTS"
