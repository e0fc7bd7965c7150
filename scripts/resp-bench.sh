#!/usr/bin/env bash
# RESP ops/s of `infera kvd --resp-listen` against redis-server with the
# same redis-benchmark parameters, in the same run (docs/performance.md):
# each test runs on both servers in turn, ROUNDS times (who goes first
# alternates), and the table gives medians — ops/s, the ratio kvd/redis of
# each round, and each server's CPU (user+system, /proc) per request.
#
# Usage: scripts/resp-bench.sh [requests] [clients] [rounds] [pipeline]
#   (needs redis-server and redis-tools). -d 65536 runs requests/10.
#
# Both servers keep values in RAM only: redis-server with its defaults
# except persistence off (--save "" --appendonly no); kvd with its RESP
# values in the shared arena (short retention: nothing goes to L3/L4, and
# there is neither here).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
c=${2:-50}
rounds=${3:-5}
pipe=${4:-1}
work=$(mktemp -d)
kvd_port=$((20000 + RANDOM % 10000))
redis_port=$((kvd_port + 1))
go build -o "$work/infera" .
"$work/infera" kvd --socket "$work/kvd.sock" --admin-listen "" --max-bytes 2GiB --shared-arena-bytes 1GiB \
  --arena-slot-bytes 72KiB --arena-mlock=false --resp-listen "$kvd_port" --log-level warn &
kvd_pid=$!
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --loglevel warning &
redis_pid=$!
trap 'kill $kvd_pid $redis_pid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for p in "$kvd_port" "$redis_port"; do
  for _ in $(seq 1 100); do redis-cli -p "$p" PING >/dev/null 2>&1 && break; sleep 0.1; done
done
tck=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# one SERVER PID PORT TEST D N: appends "server test d rps cpu_us_per_request"
one() {
  local a b rps
  a=$(cpu "$2")
  rps=$(redis-benchmark -p "$3" -t "$4" -d "$5" -n "$6" -c "$c" -P "$pipe" --csv | tail -n 1 | cut -d, -f2 | tr -d '"')
  b=$(cpu "$2")
  echo "$1 $4 $5 $rps $(echo "($b - $a) * 1000000 / $tck / $6" | bc -l)" >>"$work/results"
}
echo "uptime: $(uptime)"
echo "command: redis-benchmark -p PORT -t TEST -d D -n N -c $c -P $pipe --csv  (N = $n; $((n / 10)) for -d 65536), $rounds rounds"
for r in $(seq 1 "$rounds"); do
  for d in 1024 65536; do
    nd=$n
    [ "$d" = 65536 ] && nd=$((n / 10))
    for t in set get mset; do
      if [ $((r % 2)) = 1 ]; then
        one redis "$redis_pid" "$redis_port" "$t" "$d" "$nd"
        one kvd "$kvd_pid" "$kvd_port" "$t" "$d" "$nd"
      else
        one kvd "$kvd_pid" "$kvd_port" "$t" "$d" "$nd"
        one redis "$redis_pid" "$redis_port" "$t" "$d" "$nd"
      fi
    done
  done
done
printf '%-6s %-5s %12s %12s %11s %14s %12s  %s\n' size test redis_rps kvd_rps ratio_med redis_us/req kvd_us/req 'ratios (sorted)'
# Ratios pair each kvd run with the redis run of the same round.
awk '
  function sorted(s, a,   k, i, j, t) {
    k = split(s, a, " ")
    for (i = 2; i <= k; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return k }
  function med(s,   a, k, m) {
    k = sorted(s, a); m = int((k + 1) / 2); return (k % 2) ? a[m] : (a[m] + a[m + 1]) / 2 }
  function list(s,   a, k, i, o) {
    k = sorted(s, a); o = ""; for (i = 1; i <= k; i++) o = o sprintf(" %.2f", a[i]); return o }
  { key = $3 " " toupper($2); seen[key]++; i = int((seen[key] + 1) / 2)
    if ($1 == "redis") { rps_r[key] = rps_r[key] " " $4; cpu_r[key] = cpu_r[key] " " $5; rr[key, i] = $4 }
    else { rps_k[key] = rps_k[key] " " $4; cpu_k[key] = cpu_k[key] " " $5; kr[key, i] = $4 }
    if (!(key in keys)) { keys[key] = ++nk; names[nk] = key } }
  END {
    for (j = 1; j <= nk; j++) {
      key = names[j]; ratios = ""
      for (i = 1; (key, i) in rr; i++) if ((key, i) in kr) ratios = ratios " " kr[key, i] / rr[key, i]
      split(key, kk, " ")
      printf "%-6s %-5s %12.0f %12.0f %11.2f %14.2f %12.2f  %s\n", kk[1], kk[2], med(rps_r[key]), med(rps_k[key]), med(ratios), med(cpu_r[key]), med(cpu_k[key]), list(ratios)
    }
  }' "$work/results"
echo "uptime: $(uptime)"
