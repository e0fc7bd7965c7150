#!/usr/bin/env bash
# RESP ops/s of `infera kvd --resp-listen` against redis-server with the
# same redis-benchmark parameters, in the same run (docs/performance.md).
# Usage: scripts/resp-bench.sh [requests] [clients]   (needs redis-server, redis-tools)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
c=${2:-50}
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
echo "uptime: $(uptime)"
echo "command: redis-benchmark -p PORT -t set,get,mset -d D -n $n -c $c --csv"
printf '%-8s %-16s %12s %12s %7s\n' size test redis_rps kvd_rps ratio
for d in 1024 65536; do
  r=$(redis-benchmark -p "$redis_port" -t set,get,mset -d "$d" -n "$n" -c "$c" --csv | tail -n +2)
  k=$(redis-benchmark -p "$kvd_port" -t set,get,mset -d "$d" -n "$n" -c "$c" --csv | tail -n +2)
  paste -d, <(echo "$r") <(echo "$k") | while IFS=, read -r t1 rr _ _ _ _ _ _ t2 kr _; do
    t1=${t1//\"/}; rr=${rr//\"/}; kr=${kr//\"/}
    printf '%-8s %-16s %12s %12s %7.2f\n' "$d" "$t1" "$rr" "$kr" "$(echo "$kr / $rr" | bc -l)"
  done
done
echo "uptime: $(uptime)"
